"""Stage 2 (per call), what an eager call inside a compiled region could change, checked on every call, and the replay
of a call whose check failed (for ``eager_calls.py``; its docstring says what the trace assumes).

In: a module about to run as an eager call (:func:`snapshot` before it), and after it (:func:`unchanged`).
What happens: what it could change is recorded before and compared after.
Out: whether the run was pure; on a failed check, a :class:`Replay` of the call's result that the parent's eager run
uses instead of calling the child again (:func:`replaying`, :func:`take_replay`).

Owner of state: a snapshot belongs to one call; a replay to the thread whose call failed, for the parent's eager run
(dropped when it ends).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import threading
import types
from typing import Any

import torch
from torch.utils import _pytree as pytree

from thunder_subclass.guards.container_writes import set_contents

__all__ = ["Replay", "Snapshot", "held_now", "replaying", "restore_held", "rng_state", "set_rng_state", "snapshot", "take_replay",
           "unchanged"]

_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes)
_local = threading.local()

# nn.Module's own bookkeeping attributes (hooks, parameter / buffer / child dicts): compared by identity, not walked
_MODULE_BOOKKEEPING = frozenset(torch.nn.Module().__dict__) | {"forward"}
# objects a child's Python state may hold that it cannot change in place (walked no further)
_OPAQUE_SAFE = (type(None), bool, int, float, complex, str, bytes, torch.Tensor, torch.nn.Module, torch.dtype,
                torch.device, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                types.ModuleType, enum.Enum, range, slice)
_STATE_LIMIT = 4096  # containers and objects walked per snapshot: past it the state is not proven unchanged


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """What an eager run of a module could change: tensor versions, the attributes of the module and its submodules
    (by identity), and the contents of every container and plain object their attributes reach (``held``: (object,
    its contents then), compared by identity, immutable values by value); ``held`` is None when that state is too
    large or holds an object whose contents cannot be read (then the run is not proven pure)."""

    versions: tuple
    dicts: tuple
    held: tuple | None


class _ModuleAttributes:
    """A module's own attributes (its ``__dict__`` but nn.Module's bookkeeping), as a record of :func:`_held_state`."""

    __slots__ = ("module",)

    def __init__(self, module: torch.nn.Module):
        self.module = module


def _contents(obj: Any) -> Any:
    if isinstance(obj, _ModuleAttributes):
        return [(k, v) for k, v in obj.module.__dict__.items() if k not in _MODULE_BOOKKEEPING]
    if isinstance(obj, dict):
        return list(obj.items())
    if isinstance(obj, set):
        return set(obj)
    return list(obj)  # a list


def _held_state(modules: list) -> tuple | None:
    """(object, contents) of each dict, list, set and plain object's ``__dict__`` reachable from the attributes of
    ``modules`` (a module and its submodules; not through tensors or submodules, walked on their own), or None (see
    :class:`Snapshot`)."""
    held: list = [(_ModuleAttributes(m), _contents(_ModuleAttributes(m))) for m in modules]
    seen: set[int] = set()
    stack = [v for m in modules for k, v in m.__dict__.items() if k not in _MODULE_BOOKKEEPING]
    while stack:
        obj = stack.pop()
        if isinstance(obj, _OPAQUE_SAFE) or id(obj) in seen:
            continue
        seen.add(id(obj))
        if len(held) >= _STATE_LIMIT:
            return None
        if type(obj) in (tuple, frozenset) or isinstance(obj, (tuple, frozenset)):
            stack.extend(obj)
        elif isinstance(obj, (dict, list, set)):
            contents = _contents(obj)
            held.append((obj, contents))
            stack.extend(x for item in contents for x in (item if isinstance(obj, dict) else (item,)))
        elif isinstance(getattr(obj, "__dict__", None), dict) and not hasattr(type(obj), "__slots__"):
            d = obj.__dict__
            held.append((d, _contents(d)))
            stack.extend(d.values())
        else:  # (slots, C objects: contents that cannot be read here)
            return None
    return tuple(held)


def _same_value(a: Any, b: Any) -> bool:
    return a is b or (type(a) is type(b) and isinstance(a, _IMMUTABLE) and a == b)


def _held_unchanged(held: tuple) -> bool:
    for obj, contents in held:
        now = _contents(obj)
        if isinstance(obj, set):
            if now != contents:
                return False
        elif len(now) != len(contents) or not all(
                _same_value(a[0], b[0]) and _same_value(a[1], b[1]) if isinstance(obj, (dict, _ModuleAttributes)) else _same_value(a, b)
                for a, b in zip(now, contents)):
            return False
    return True


def restore_held(held: tuple | None) -> None:
    """Put the contents recorded in ``held`` back into their containers and objects."""
    for obj, contents in held or ():  # (only what differs: other threads may be running the same modules)
        if isinstance(obj, _ModuleAttributes):
            d = obj.module.__dict__
            wanted = dict(contents)
            for k in [k for k in d if k not in _MODULE_BOOKKEEPING and k not in wanted]:
                del d[k]
            for k, v in contents:
                if k not in d or d[k] is not v:
                    d[k] = v
        else:
            set_contents(obj, list(contents))


def held_now(held: tuple | None) -> tuple | None:
    """The same containers and objects as ``held``, with their contents now."""
    return None if held is None else tuple((obj, _contents(obj)) for obj, _ in held)


def snapshot(module: torch.nn.Module, args: tuple, kwargs: dict) -> Snapshot:
    """What an eager run of ``module`` could change that a trace around it would not see (:class:`Snapshot`)."""
    modules = list(module.modules())  # (walked once: the snapshot is taken on every call of an eager call)
    tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    dicts = []
    for m in modules:
        d = {k: v for k, v in m.__dict__.items() if k != "forward"}
        params, buffers = dict(m._parameters), dict(m._buffers)
        tensors += [t for t in params.values() if t is not None]
        tensors += [t for t in buffers.values() if t is not None]
        dicts.append((m, d, params, buffers, dict(m._modules)))
    return Snapshot(tuple((t, t._version) for t in tensors), tuple(dicts), _held_state(modules))


def unchanged(before: Snapshot) -> bool:
    """Whether nothing :func:`snapshot` recorded in ``before`` changed since (a state too large or unreadable to
    record is taken as changed)."""
    if before.held is None or any(t._version != v for t, v in before.versions):
        return False
    for m, d, params, buffers, modules in before.dicts:
        now = {k: v for k, v in m.__dict__.items() if k != "forward"}
        for old, new in ((d, now), (params, m._parameters), (buffers, m._buffers), (modules, m._modules)):
            if old.keys() != new.keys() or any(old[k] is not new[k] for k in old):
                return False
    return _held_unchanged(before.held)



@dataclasses.dataclass
class Replay:
    """The result of an eager call whose check failed, for the parent's eager run to use instead of calling the child
    again (its side effects happened once): the Python state the child saw and left (``held_before`` /
    ``held_after``, see :func:`_held_state`) and the random-number state after it."""

    module: torch.nn.Module
    result: Any
    detached: tuple | None  # the arguments the child ran on, cut from the parent's graph (gradients path), or None
    held_before: tuple | None
    held_after: tuple | None
    rng_after: tuple

    def restore_after(self) -> None:
        """The Python state and random numbers as the child left them."""
        restore_held(self.held_after)
        set_rng_state(self.rng_after)

    def result_for(self, args: tuple, kwargs: dict) -> Any:
        """The child's result, given to the parent's eager run that now calls it with ``args`` / ``kwargs``: the
        state and random numbers as the child left them; on the gradients path, outputs whose backward reaches the
        child's parameters and, through ``args``, the parent's graph."""
        self.restore_after()
        if self.detached is None:
            return self.result
        leaves, spec = pytree.tree_flatten(self.result)
        inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        positions = [i for i, o in enumerate(leaves) if isinstance(o, torch.Tensor) and o.requires_grad]
        if positions and torch.is_grad_enabled():
            joined = _Reattach.apply(self, [leaves[i] for i in positions], *inputs)
            for i, o in zip(positions, joined):
                leaves[i] = o
        return pytree.tree_unflatten(leaves, spec)


class _Reattach(torch.autograd.Function):
    """Outputs of an eager call's own autograd graph (made on detached arguments) joined to the graph of the
    arguments the parent's eager run passes: the backward runs the call's graph (accumulating its parameters'
    gradients, as eager) and hands the arguments' gradients on."""

    @staticmethod
    def forward(ctx, replay, outs, *inputs):
        ctx.replay, ctx.outs = replay, outs
        return tuple(o.detach() for o in outs)

    @staticmethod
    def backward(ctx, *grads):
        outs = [o for o, g in zip(ctx.outs, grads) if g is not None]
        leaves = [t for t in ctx.replay.detached if t.requires_grad]
        for t in leaves:
            t.grad = None
        if outs:
            torch.autograd.backward(outs, [g for g in grads if g is not None])
        found = [t.grad if t.requires_grad else None for t in ctx.replay.detached]
        return (None, None, *found)


def rng_state() -> tuple:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def set_rng_state(state: tuple) -> None:
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


def _replays() -> dict:
    replays = getattr(_local, "replays", None)
    if replays is None:
        replays = _local.replays = {}
    return replays


@contextlib.contextmanager
def replaying(replay: Replay | None):
    """While the block runs (the parent's eager run after a mismatch, in this thread), the next call of the replay's
    module returns its result instead of running (:func:`take_replay`). The Python state the child changed is put
    back as it was before the call first (the parent's code before the call reads what eager reads)."""
    if replay is None:
        yield
        return
    from thunder_subclass._thunder_internals import DISPATCH_PASS, dispatching

    def call_of_module(*args, **kwargs):  # a Python call of the child (hooks included): its result, once
        taken = take_replay(replay.module)
        return DISPATCH_PASS if taken is None else taken.result_for(args, kwargs)

    restore_held(replay.held_before)
    replays = _replays()
    replays[id(replay.module)] = replay
    try:
        with dispatching(replay.module, call_of_module, whole_call=True):
            yield
    finally:
        if replays.pop(id(replay.module), None) is not None:  # (not called again: leave what the child left)
            restore_held(replay.held_after)


def take_replay(module: torch.nn.Module) -> Replay | None:
    """The pending :class:`Replay` of ``module`` in this thread (taken: it serves one call), or None."""
    replays = getattr(_local, "replays", None)
    if not replays:
        return None
    replay = replays.get(id(module))
    if replay is None or replay.module is not module:
        return None
    del replays[id(module)]
    return replay
