"""Stage 2 (per call, the backward), parameters an eager call inside a compiled region did not reach keep ``.grad``
None.

In: the backward of an eager module call (``eager_calls``) found that the child's autograd graph of this call does
not reach some of its trainable parameters (an expert no token was routed to). thunder's compiled backward returns a
gradient for every input that requires grad, so those parameters would get a zero gradient accumulated, where eager
leaves ``.grad`` at None (and an optimizer then skips them: no weight decay, no momentum step).
What happens: each such parameter gets a hook for this backward only.
Out: for each such parameter whose ``.grad`` is None when the backward reaches the call, a post-accumulate-grad hook
(``Tensor.register_post_accumulate_grad_hook``) that sets ``.grad`` back to None when what this backward accumulated
is all zeros; the hooks are removed when this backward ends (``_thunder_internals.at_end_of_backward``), whether or
not they ran (``torch.autograd.grad`` accumulates nothing).

Assumption: a parameter that was None before this backward and holds only zeros after it got nothing but the eager
call's zeros. It fails only where the parameter is also used elsewhere in the compiled program and that use's
gradient is exactly zero in every element: eager then gives zeros, this gives None (docs/limits.md). A parameter
whose ``.grad`` was not None keeps what it had plus zeros, as eager keeps it.

Owner of state: the hooks of the backward running now, by parameter (one per parameter per backward), removed at its
end.
"""

from __future__ import annotations

import threading

import torch

from thunder_subclass import _thunder_internals

__all__ = ["keep_unreached_grads_none"]

_lock = threading.Lock()
_watched: dict[int, object] = {}  # id of a parameter -> its hook's handle, for the backward running now


def _reset_if_only_zeros(param: torch.Tensor) -> None:
    grad = param.grad
    try:
        only_zeros = grad is not None and not bool(grad.any())
    except Exception:  # noqa: BLE001 - a gradient that cannot say (a subclass without any): left as accumulated
        return
    if only_zeros:
        param.grad = None


def _unwatch(key: int) -> None:
    with _lock:
        handle = _watched.pop(key, None)
    if handle is not None:
        handle.remove()


def keep_unreached_grads_none(params) -> None:
    """Called from the backward of an eager call with the parameters its graph did not reach (module docstring)."""
    for p in params:
        if p.grad is not None or not p.requires_grad or not p.is_leaf:
            continue
        key = id(p)
        with _lock:
            if key in _watched:
                continue
            _watched[key] = None
        try:
            _thunder_internals.at_end_of_backward(lambda key=key: _unwatch(key))
        except RuntimeError:  # not inside the autograd engine's backward: nothing will be accumulated
            with _lock:
                _watched.pop(key, None)
            continue

        def hook(param, key=key):
            _unwatch(key)
            _reset_if_only_zeros(param)

        handle = p.register_post_accumulate_grad_hook(hook)
        with _lock:
            if key in _watched:
                _watched[key] = handle
            else:  # (the backward ended meanwhile)
                handle.remove()
