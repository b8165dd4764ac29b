"""Stage 5 (autograd), plain operations thunder cannot differentiate get eager's gradient from PyTorch's autograd.

In: a torch-level call on plain tensors just recorded while interpreting user code, with a tensor argument that
requires grad (or an input of the compiled call that does), whose decomposition reaches a primitive thunder 0.2.6 has
no gradient for (``torch.flip``, ``torch.lerp``, ``torch.remainder``, ``torch.trunc``, ``Tensor.index_add``,
``torch.nextafter``: ``_thunder_internals.lacks_gradient``).
What happens: the symbol gets the grad rule subclass operations have (:func:`ensure_fallback_grad`): the torch
function run on fakes under PyTorch's autograd, its forward and backward recorded as aten-level symbols
(``transforms.autograd.differentiate_call``), registered once per symbol through thunder's own table of grad
transforms (``_thunder_internals.register_grad_fallback``; only plugin jits use it).
Out: the call differentiates as eager does, where thunder raised "Failed to find a gradient transform for bound
symbol" at the first call; without gradients thunder's own implementation runs, as before.
"""

from __future__ import annotations

from typing import Any

from thunder.core.proxies import TensorProxy
from thunder.core.pytree import tree_flatten
from thunder.core.trace import get_tracectx

from thunder_subclass import _thunder_internals
from thunder_subclass.frontend.recording import denormalize, torch_callable_for

__all__ = ["ensure_fallback_grad"]


def _grad_transform_for(sym):
    def grad_transform(*args, **kwargs):
        from thunder_subclass.transforms.autograd import differentiate_call

        targs, tkwargs = denormalize(sym, args, kwargs)
        fn = torch_callable_for(sym, targs, tkwargs)
        return differentiate_call(sym, fn, args, kwargs, getattr(fn, "__name__", sym.name), "plain tensors",
                                  call_args=(targs, tkwargs))

    return grad_transform


def _recorded(result: Any):
    scope = get_tracectx().peek_scope()
    outs = {id(o) for o in tree_flatten(result)[0] if isinstance(o, TensorProxy)}
    for bsym in reversed(scope[-4:]):
        if any(id(o) in outs for o in bsym.flat_proxy_outs):
            return bsym
    return None


def ensure_fallback_grad(sym, args: tuple, kwargs: dict, result: Any) -> None:
    """Called after thunder recorded torch-level symbol ``sym`` on plain tensors (see the module docstring)."""
    if not any(isinstance(o, TensorProxy) for o in tree_flatten(result)[0]):
        return
    if not (any(isinstance(a, TensorProxy) and a.requires_grad for a in tree_flatten((args, kwargs))[0])
            or _thunder_internals.current_call_has_grad_inputs()):
        return
    bsym = _recorded(result)
    if bsym is None or bsym.sym is not sym or not _thunder_internals.lacks_gradient(bsym):
        return
    _thunder_internals.register_grad_fallback(sym, _grad_transform_for(sym))
