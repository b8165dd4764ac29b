"""Per-thread module dispatch: while a graph-break program runs a module's code eagerly, calls of chosen submodules
in THIS thread run a compiled ``forward`` instead of their own, without changing the user's objects.

Hooked torch path: ``torch.nn.Module._call_impl`` (``torch/nn/modules/module.py``), what ``Module.__call__``
(``_wrapped_call_impl``) calls for every module. The hook looks the module up in this thread's dispatch table
(:func:`dispatching`); a module found there whose call would run no hook (no forward / backward hooks of its own,
no global module hooks, no TorchScript tracing) gets the table's ``forward``, exactly as ``_call_impl``'s own fast
path calls ``self.forward``; any other call is ``_call_impl`` itself (a module with hooks runs its own ``forward``
eagerly, hooks around it, as in eager). An entry may also stand for the whole call, hooks included (an eager call's
result given again after a failed check: nothing of the call may run twice). Another thread, and any code outside the block, sees nothing: no instance
attribute is set (before, the plugin set ``forward`` on the instance, which other threads saw).

thunder's interpreter never runs the hook's body: :func:`is_dispatch_hook` lets ``tracing``'s lookaside send a call of
the hook to ``_call_impl`` itself (:func:`original_call_impl`), whose lookasides are keyed on it.

Owner of state: the table is per thread, its entries live for the ``with dispatching(...)`` block that set them.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["PASS", "dispatching", "hook_targets", "is_dispatch_hook", "original_call_impl"]

_local = threading.local()
_original: list[Callable] = []  # the original _call_impl while the hook is installed


def _has_hooks(module: torch.nn.Module) -> bool:
    from torch.nn.modules import module as module_py

    return bool(module._backward_hooks or module._backward_pre_hooks or module._forward_hooks
                or module._forward_pre_hooks or module_py._global_backward_pre_hooks
                or module_py._global_backward_hooks or module_py._global_forward_hooks
                or module_py._global_forward_pre_hooks or torch._C._get_tracing_state())


def _hook_call_impl(original: Callable) -> Callable:
    # wraps torch.nn.Module._call_impl
    _original[:] = [original]

    def _call_impl(self, *args, **kwargs):
        table = getattr(_local, "table", None)
        entry = table.get(id(self)) if table else None
        while entry is not None and entry[0] is self:
            _, fn, whole_call, previous = entry
            if not whole_call:
                if not _has_hooks(self):
                    return fn(*args, **kwargs)
                break
            result = fn(*args, **kwargs)  # (the whole call, hooks included)
            if result is not PASS:
                return result
            entry = previous
        return original(self, *args, **kwargs)

    _call_impl._thunder_subclass_dispatch_hook = True
    return _call_impl


def hook_targets() -> list[tuple[Any, str, Callable]]:
    return [(torch.nn.Module, "_call_impl", _hook_call_impl)]


def original_call_impl() -> Callable:
    """``torch.nn.Module._call_impl`` as torch defines it (not the hook)."""
    current = torch.nn.Module._call_impl
    if getattr(current, "_thunder_subclass_dispatch_hook", False) and _original:
        return _original[0]
    return current


def is_dispatch_hook(fn: Any) -> bool:
    return getattr(fn, "_thunder_subclass_dispatch_hook", False) is True


PASS = object()  # returned by a whole-call function: this call is not its to answer (the entry below it is asked)


@contextlib.contextmanager
def dispatching(module: torch.nn.Module, forward: Callable, *, whole_call: bool = False):
    """While the block runs, calls of ``module`` in this thread run ``forward(*args, **kwargs)`` in place of its own
    ``forward`` (:mod:`module docstring <.module_dispatch>`); what the table held for it before comes back after.
    ``whole_call``: in place of the whole call, hooks included, whether the module has hooks or not; ``forward`` may
    return :data:`PASS` to hand the call on (to what the table held before, else to torch)."""
    table = getattr(_local, "table", None)
    if table is None:
        table = _local.table = {}
    key = id(module)
    previous = table.get(key)
    table[key] = (module, forward, whole_call, previous)
    try:
        yield
    finally:
        if previous is None:
            table.pop(key, None)
        else:
            table[key] = previous
