"""DTensor's ``_MaskPartial`` mask buffers: fake runs leave them as they found them; a traced value keeps its own.

``embedding`` on a row-sharded (``Shard(0)``) weight gives a DTensor whose placement is a ``_MaskPartial``: the
placement holds a ``MaskBuffer`` (``torch/distributed/tensor/_ops/_mask_buffer.py``), reference-counted state that the
embedding fills with the mask of the indices outside the local shard (``materialize_mask``) and that the
``redistribute`` reducing the value reads and releases (``release_mask``). DTensor's sharding propagation caches the
placement object per operation schema, so eager calls of the same shapes share one buffer. thunder_subclass runs an
operation on fakes more than once (while tracing; again when differentiating, when recording a backward, when coercing
a gradient): with the shared buffer, the first fake ``redistribute`` released the mask the later runs need
(``AssertionError`` in ``_MaskPartial._reduce_value``), and a fake run left a fake mask in the placement eager calls
use afterwards. Two rules make every fake run see the state eager would see at that point of the program:

* **a fake run leaves every mask buffer as it found it** (:func:`isolated_mask_buffers`, entered by each fake run of
  the plugin): the hook on ``MaskBuffer.materialize_mask`` / ``release_mask`` journals a buffer's ``(data, refcount)``
  before a fake run first changes it, and the run's end puts it back, handing the states it ended with to the caller.
  One exception: an operation of the traced program itself (run while thunder's interpreter traces user code) that
  reduced a traced value's mask leaves it used, as eager does, so a second reduction of the same value fails as in
  eager (``AssertionError`` from ``_MaskPartial._reduce_value``, as a ``SubclassDispatchError``);
* **a traced value owns its mask** (:func:`own_mask_buffers`): the flatten context of a DTensor result of a fake run
  gets, for each ``_MaskPartial`` it holds that is not already a traced value's, a copy with a buffer of its own in
  the state the run left it (one copy per placement per run, so values that eager shares a placement share it); fakes
  rebuilt from that context for later runs start from that state. (While autodiff records the forward again, grad
  rules get the newest version of such a value, whose mask the joint trace computes: ``autograd_hooks.newest_version``.)

What the compiled code does at run time does not read these buffers: the mask is computed and applied by the recorded
aten operations (the fake mask is found through the trace's fake -> proxy map). The hook acts only while a plugin
fake run journals on the calling thread (a thread-local journal): other threads' and eager DTensor code are untouched.
Version check: where ``_MaskPartial`` or its ``MaskBuffer`` (``data``, ``refcount``, ``materialize_mask``,
``release_mask``) is missing or shaped otherwise (torch.distributed unavailable, a torch that renamed them), no hook
is installed and contexts are left as they are (:func:`mask_buffer_class` is None). Removable with the other hooks.

Owner of state: the journal is per thread and lives for one fake run (the outermost, where runs nest); the copies are
owned by the flatten contexts of the proxies that hold them (freed with the trace).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch

from thunder_subclass._thunder_internals.thunder_state import is_interpreting

_OWNED = "_thunder_subclass_traced_value"  # marks a buffer made by own_mask_buffers (an attribute of our own copy)

_local = threading.local()


@functools.cache
def _mask_partial_classes() -> tuple[type, type] | None:
    """``(_MaskPartial, MaskBuffer)`` of this torch, or None where either is missing or not as expected."""
    try:
        import torch.distributed as dist

        if not dist.is_available():
            return None
        from torch.distributed.tensor import placement_types
    except ImportError:
        return None
    # (torch 2.13-2.15: _MaskPartial; torch 2.10: the same class, public as MaskPartial)
    _MaskPartial = getattr(placement_types, "_MaskPartial", None) or getattr(placement_types, "MaskPartial", None)
    if _MaskPartial is None:
        return None
    try:  # the constructor own_mask_buffers calls
        buffer_class = type(_MaskPartial(offset_shape=None, offset_dim=0).mask_buffer)
        _MaskPartial(reduce_op="sum", mask_buffer=buffer_class(), offset_shape=None, offset_dim=0)
    except (TypeError, AttributeError):
        return None
    if not all(callable(getattr(buffer_class, m, None)) for m in ("materialize_mask", "release_mask")):
        return None
    probe = buffer_class()
    if not (hasattr(probe, "data") and hasattr(probe, "refcount")):
        return None
    return _MaskPartial, buffer_class


def mask_buffer_class() -> type | None:
    """torch's ``MaskBuffer`` class, or None where this torch has none the hooks understand."""
    found = _mask_partial_classes()
    return found[1] if found is not None else None


class _Journal:
    def __init__(self):
        self.before: dict[int, tuple[Any, Any, int]] = {}  # id(buffer) -> (buffer, data, refcount) before the run
        self.after: dict[int, tuple[Any, int]] = {}  # id(buffer) -> (data, refcount) the run left, filled at its end


@contextlib.contextmanager
def isolated_mask_buffers():
    """Run a fake run in this context: every mask buffer it changes is put back as it was at the end. Yields a dict
    ``id(buffer) -> (data, refcount)``, filled at the end with the states the run left (for
    :func:`own_mask_buffers`). Nested runs share the outermost run's journal."""
    journal = getattr(_local, "journal", None)
    if journal is not None or mask_buffer_class() is None:
        yield journal.after if journal is not None else {}
        return
    journal = _local.journal = _Journal()
    try:
        yield journal.after
    finally:
        _local.journal = None
        in_program = is_interpreting()
        for buffer, data, refcount in journal.before.values():
            journal.after[id(buffer)] = (buffer.data, buffer.refcount)
            if in_program and getattr(buffer, _OWNED, False):
                continue  # the traced program used a value's mask (reduced it): later operations see it used
            buffer.data, buffer.refcount = data, refcount


def _journaled(original: Callable) -> Callable:
    """``MaskBuffer.materialize_mask`` / ``release_mask``: journal the buffer's state before a plugin fake run first
    changes it (see :func:`isolated_mask_buffers`); outside such a run, torch's own method only."""

    @functools.wraps(original)
    def hook(self, *args, **kwargs):
        journal = getattr(_local, "journal", None)
        if journal is not None and id(self) not in journal.before:
            journal.before[id(self)] = (self, self.data, self.refcount)
        return original(self, *args, **kwargs)

    return hook


def _map_mask_partials(ctx: Any, fn) -> Any:
    """``ctx`` (a flatten context) with ``fn(p)`` in place of each ``_MaskPartial`` ``p`` in it (in tuples, lists and a
    ``DTensorSpec``'s placements, rebuilt where something changed). Unchanged objects are returned as they are."""
    classes = _mask_partial_classes()
    if classes is None:
        return ctx
    mask_partial, _ = classes

    def visit(x):
        if isinstance(x, mask_partial):
            return fn(x)
        if type(x) in (tuple, list):
            new = [visit(v) for v in x]
            return x if all(a is b for a, b in zip(new, x)) else type(x)(new)
        if type(x).__name__ == "DTensorSpec" and not isinstance(x, type):  # older torch: the spec is in the context
            old = getattr(x, "placements", ())
            placements = visit(old)
            if placements is old or not dataclasses.is_dataclass(x):
                return x
            return dataclasses.replace(x, placements=placements)
        return x

    return visit(ctx)


def own_mask_buffers(ctx: Any, after: dict, memo: dict) -> Any:
    """``ctx`` (a flatten context a fake run's result gave) with each ``_MaskPartial`` that is not already a traced
    value's replaced by a copy whose buffer is its own, in the state ``after`` says the run left it (else its current
    state). ``memo`` (``id(placement) -> copy``, one per run) makes the results of one run share a copy where they
    share a placement. Unchanged objects are returned as they are."""

    def own(x):
        buffer = x.mask_buffer
        if getattr(buffer, _OWNED, False):
            return x
        owned = memo.get(id(x))
        if owned is None:
            own_buffer = type(buffer)()
            own_buffer.data, own_buffer.refcount = after.get(id(buffer), (buffer.data, buffer.refcount))
            setattr(own_buffer, _OWNED, True)
            # (copy.copy keeps only reduce_op: torch 2.13's placements are pybind11 objects)
            owned = type(x)(reduce_op=x.reduce_op, mask_buffer=own_buffer, offset_shape=x.offset_shape,
                            offset_dim=x.offset_dim)
            memo[id(x)] = owned
            memo.setdefault("_keep", []).append(x)  # ids stay unique while the memo lives
        return owned

    return _map_mask_partials(ctx, own)


def holds_mask(ctx: Any, *, unreduced: bool = True) -> bool:
    """Whether ``ctx`` holds a ``_MaskPartial`` whose buffer holds a mask (a value of ``embedding`` on a row-sharded
    weight not reduced yet); with ``unreduced=False``, any ``_MaskPartial``."""
    found = []
    _map_mask_partials(ctx, lambda p: found.append(p) or p)
    return any(p.mask_buffer.data is not None or not unreduced for p in found)


def hook_targets() -> list[tuple[Any, str, Callable]]:
    buffer_class = mask_buffer_class()
    if buffer_class is None:
        return []
    return [(buffer_class, name, _journaled) for name in ("materialize_mask", "release_mask")]


def detach_dtensor(x) -> Any:
    """``x.detach()`` for a DTensor ``x``, rebuilt from its detached local tensor instead of through DTensor's dispatch
    (from torch 2.14 on, ``detach`` of a DTensor with a ``_MaskPartial`` placement redistributes it, which reduces the
    mask buffer the real run needs later: AssertionError in ``_reduce_value``); None for any other value."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    if dtensor is None or not isinstance(x, getattr(dtensor, "DTensor", ())):
        return None
    names, spec = x.__tensor_flatten__()
    inner = {n: getattr(x, n) for n in names}  # (from torch 2.14 the device mesh is one of them, not a tensor)
    inner = {n: v.detach() if isinstance(v, torch.Tensor) else v for n, v in inner.items()}
    return type(x).__tensor_unflatten__(inner, spec, x.size(), x.stride())
