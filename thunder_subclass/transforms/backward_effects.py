"""Stage 5 (autograd), a check: Python-level side effects in a custom ``torch.autograd.Function.backward``.

In: a ``MyFunction.apply(*args)`` met while tracing (``autograd.function_apply_lookaside``), with gradients flowing.
What happens: the Function's forward and then its backward run once on fakes, watched for what the compiled program
would not reproduce. The compiled backward (thunder's own for a Function of plain tensors, the plugin's ``grad_<op>``
otherwise) runs only the tensor operations recorded while tracing: Python state the backward changes would change
once, at trace time, and never when gradients are computed; an input it changes in place would keep its old value.
Watched during the backward run (the forward's effects are not this module's concern):

* **in-place changes of tensors the backward did not make**: an input kept on ``ctx`` (``ctx.t = t``) or saved for
  backward, a tensor held in a global, a closure or a module. A dispatch mode follows every aten call: a tensor is
  *made* by the backward when an operation returned it (a view inherits its base's status through the schema's alias
  annotations); the incoming gradients count as made; an operation whose schema writes an argument that is not made
  is an effect;
* **writes to Python state**: the attributes of ``ctx``; the globals of the backward's module and of every user
  function it calls (taken when first called); the cells of the backward's closure; and, one level down, the lists,
  dicts, sets and object attributes (a module's included) held in those. A shallow snapshot is compared after the run
  and put back, so the trace-time run leaves them as they were;
* **output**: what the backward writes to ``sys.stdout`` / ``sys.stderr`` (``print``) is captured and dropped.

Out: None, or :class:`~thunder_subclass.errors.UnsupportedBackwardEffectError` naming the Function, the effect (the
aten op for an in-place change), the user's source line and what to do. It is a graph-break kind: without
``fullgraph=True`` the compiled function runs eagerly, which is eager's behaviour exactly (nothing of the user's ran
for real: the fake runs' Python writes were put back and their output dropped); with ``fullgraph=True`` it is raised.

Not watched (documented in docs/limits.md): effects through C code other than tensor operations and ``print`` to
the standard streams (a logging handler's stream, a file), nonlocal rebinding in the closure of a helper the backward
calls, and state more than one container or object away from a global, a closure cell or ``ctx``.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import types
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from thunder.core.interpreter import unwrap
from thunder.core.proxies import TensorProxy
from thunder.core.pytree import tree_map

from thunder_subclass.guards.container_writes import set_contents
from thunder_subclass.errors import UnsupportedBackwardEffectError, format_location
from thunder_subclass.frontend.fake import FakeEnv, fake_execution
from thunder_subclass.frontend.recording import is_traced_grad_enabled
from thunder_subclass._thunder_internals import source_location

__all__ = ["Snapshot", "backward_effect_error"]

_OWN_DIRS = tuple(
    os.path.dirname(m.__file__) + os.sep
    for m in (__import__("thunder"), torch, __import__("thunder_subclass"), contextlib, os)
)


def _is_user_file(filename: str) -> bool:
    return not filename.startswith(_OWN_DIRS) and not filename.startswith("<")


def _user_line(frame) -> tuple[str | None, int | None]:
    while frame is not None and not _is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    return (frame.f_code.co_filename, frame.f_lineno) if frame is not None else (None, None)


# ---------------------------------------------------------------------------------------------------------------
# In-place changes of tensors the backward did not make
# ---------------------------------------------------------------------------------------------------------------

class _InplaceWatch(TorchDispatchMode):
    """Records the first aten call that writes a tensor the backward did not make: (op, file, line)."""

    def __init__(self, made: list):
        super().__init__()
        self.made = {id(t): t for t in made}  # (strong references: fakes of one trace-time run)
        self.effect: tuple | None = None

    def _is_made(self, t) -> bool:
        return id(t) in self.made

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema = func._schema
        given = {}
        for i, a in enumerate(schema.arguments):
            given[a.name] = args[i] if i < len(args) else kwargs.get(a.name)
            if self.effect is None and a.alias_info is not None and a.alias_info.is_write:
                written = [t for t in tree_leaves(given[a.name]) if isinstance(t, torch.Tensor)]
                if any(not self._is_made(t) for t in written):
                    self.effect = (str(func.overloadpacket), *_user_line(sys._getframe(1)))
        out = func(*args, **kwargs)
        results = out if isinstance(out, (tuple, list)) else (out,)
        for r, value in zip(schema.returns, results):
            tensors = [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]
            made = True
            if r.alias_info is not None:  # a view or the written argument: made iff what it aliases was made
                for a in schema.arguments:
                    if a.alias_info is not None and set(a.alias_info.before_set) & set(r.alias_info.before_set):
                        made = all(self._is_made(t) for t in tree_leaves(given[a.name]) if isinstance(t, torch.Tensor))
            if made:
                self.made.update((id(t), t) for t in tensors)
        return out


# ---------------------------------------------------------------------------------------------------------------
# Writes to Python state
# ---------------------------------------------------------------------------------------------------------------

_MISSING = object()
_SKIPPED = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, torch.Tensor,
            str, bytes, int, float, complex, bool, type(None), tuple, frozenset)


class Snapshot:
    """Shallow copies of namespaces, cells, containers and object attributes, each with a description for errors;
    :meth:`changed` names the first that differs, :meth:`restore` puts every one back."""

    def __init__(self):
        self.entries: dict[int, tuple] = {}  # id -> (object, kind, copy, description)

    def watch(self, obj: Any, what: str, depth: int = 1) -> None:
        if id(obj) in self.entries or isinstance(obj, _SKIPPED) or isinstance(obj, torch.nn.Parameter):
            return
        if isinstance(obj, types.CellType):
            try:
                copy = obj.cell_contents
            except ValueError:
                copy = _MISSING
            self.entries[id(obj)] = (obj, "cell", copy, what)
            if copy is not _MISSING and depth > 0:
                self.watch(copy, f"{what}'s value", depth - 1)
            return
        if isinstance(obj, list):
            self.entries[id(obj)] = (obj, "list", list(obj), what)
            return
        if isinstance(obj, (set, dict)):
            if len(obj) > 100_000:
                return
            kind = "set" if isinstance(obj, set) else "dict"
            self.entries[id(obj)] = (obj, kind, set(obj) if kind == "set" else dict(obj), what)
            if kind == "dict" and depth > 0:
                for k, v in list(obj.items()):
                    if isinstance(k, str):
                        self.watch(v, f"{what}[{k!r}]", depth - 1)
            return
        d = getattr(obj, "__dict__", None)
        if isinstance(d, dict):
            self.entries[id(obj)] = (obj, "attrs", dict(d), what)
            if depth > 0:
                for k, v in list(d.items()):
                    if isinstance(v, (list, dict, set)):  # a module's _parameters / _buffers / _modules included
                        self.watch(v, f"{what}.{k}", depth - 1)

    @staticmethod
    def _differs(obj, kind, copy) -> bool:
        if kind == "cell":
            try:
                now = obj.cell_contents
            except ValueError:
                now = _MISSING
            return now is not copy
        if kind == "list":
            return len(obj) != len(copy) or any(a is not b for a, b in zip(obj, copy))
        if kind == "set":
            return obj != copy
        current = obj if kind == "dict" else getattr(obj, "__dict__", {})
        return current.keys() != copy.keys() or any(current[k] is not v for k, v in copy.items())

    def changed(self) -> str | None:
        for obj, kind, copy, what in list(self.entries.values()):
            if self._differs(obj, kind, copy):
                return what
        return None

    def restore(self) -> None:
        for obj, kind, copy, _ in self.entries.values():
            if not self._differs(obj, kind, copy):
                continue
            if kind == "cell":
                if copy is _MISSING:
                    del obj.cell_contents
                else:
                    obj.cell_contents = copy
            elif kind == "list" or kind == "set":
                set_contents(obj, list(copy))
            else:  # (only what differs: a globals dict is shared with every other thread)
                set_contents(obj if kind == "dict" else obj.__dict__, list(copy.items()))


@contextlib.contextmanager
def _watching_user_globals(snapshot: Snapshot):
    """Adds the globals of every user function called in the block to ``snapshot`` (when first called)."""
    previous = sys.getprofile()

    def profile(frame, event, arg):
        if event == "call" and _is_user_file(frame.f_code.co_filename):
            g = frame.f_globals
            if id(g) not in snapshot.entries:
                snapshot.watch(g, f"the globals of {g.get('__name__', '?')}")

    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(previous)


# ---------------------------------------------------------------------------------------------------------------
# The check
# ---------------------------------------------------------------------------------------------------------------

def backward_effect_error(cls: type, args: tuple, kwargs: dict) -> UnsupportedBackwardEffectError | None:
    """The :class:`UnsupportedBackwardEffectError` to raise (in the traced program) when ``cls.backward`` has a Python-level side effect that the
    compiled backward would drop (see the module docstring); ``args`` / ``kwargs`` are the traced call's (proxies).
    Nothing is checked when no gradient would flow (grad mode off in the traced code, no tensor argument requiring
    grad) or when the fake run fails (the recording that follows reports errors)."""
    flat = [unwrap(a) for a in tree_leaves((args, kwargs))]
    if not is_traced_grad_enabled() or not any(isinstance(p, TensorProxy) and p.requires_grad for p in flat):
        return None
    backward = getattr(cls, "backward", None)
    code = getattr(backward, "__code__", None)
    if code is None:
        return None
    env = FakeEnv(pin=False)
    try:
        fargs, fkwargs = tree_map(env.to_fake, (args, kwargs))
        with fake_execution(), torch.enable_grad():
            out = cls.apply(*fargs, **fkwargs)
            inputs = [a for a in tree_leaves((fargs, fkwargs)) if isinstance(a, torch.Tensor) and a.requires_grad]
            outs = [o for o in tree_leaves(out) if isinstance(o, torch.Tensor) and o.grad_fn is not None]
            if not inputs or not outs:
                return None
            grads = [torch.ones_like(o) for o in outs]
    except Exception:
        return None
    ctx = outs[0].grad_fn
    snapshot = Snapshot()
    snapshot.watch(backward.__globals__, f"the globals of {backward.__globals__.get('__name__', '?')}")
    for name, cell in zip(code.co_freevars, backward.__closure__ or ()):
        snapshot.watch(cell, f"the closure variable {name!r}")
    snapshot.watch(ctx, "ctx")
    watch = _InplaceWatch(grads)
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured), \
                _watching_user_globals(snapshot), fake_execution(), torch.enable_grad(), watch:
            torch.autograd.grad(outs, inputs, grads, allow_unused=True)
    except Exception:
        pass  # the recording of the backward reports its errors
    changed = snapshot.changed()
    snapshot.restore()
    where = format_location(code.co_filename, code.co_firstlineno)
    if watch.effect is not None:
        op, filename, line = watch.effect
        effect = (f"changes a tensor it did not make in place ({op} at {format_location(filename, line)}: an input "
                  "kept on ctx or saved for backward, or a tensor held outside the Function)")
    elif changed is not None:
        effect = f"changes Python state: {changed} (backward defined at {where})"
    elif captured.getvalue():
        effect = f"writes to sys.stdout or sys.stderr (print; backward defined at {where})"
    else:
        return None
    call = format_location(*source_location())
    return UnsupportedBackwardEffectError(
        f"{cls.__qualname__}.backward {effect}, for the call {cls.__qualname__}.apply at {call}. The compiled "
        "backward runs only the tensor operations recorded while tracing, so this effect would happen once while "
        "tracing and never when gradients are computed. Return what the backward computes instead of changing state "
        "(or change it after .backward()), or call this Function outside the compiled function. Without "
        "fullgraph=True the compiled function runs eagerly (a graph break)."
    )
