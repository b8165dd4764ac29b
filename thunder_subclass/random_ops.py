"""Random operations that draw from torch's generator as eager does, so that a seeded compiled run equals eager's
bitwise (stage: autograd / executors, for plain tensors).

In: a call of ``torch.nn.functional.dropout`` (thunder's ``ltorch.dropout``; ``nn.Dropout`` calls it) on a plain
tensor in training, with a Python-number ``p`` strictly between 0 and 1, in a trace of ``thunder_subclass.jit``.
Out: the plugin's executor claims it (:func:`ensure_dropout_rule`, registered the first time a trace meets one):
forward ``eager_dropout(a, p)`` and, with gradients, backward ``eager_dropout_backward(grad, saved, p)``.

Why: thunder differentiates dropout through its decomposition, ``uniform`` then ``lt`` then ``mul`` by ``1/(1-p)``,
which draws other random numbers than eager and rounds otherwise (without gradients thunder's torch executor calls
eager's dropout itself). ``eager_dropout`` runs what eager's ``at::dropout`` runs for the tensor's device (facts from
``aten/src/ATen/native/Dropout.cpp``): on the CPU (and devices without a fused kernel) ``noise =
empty_like(a).bernoulli_(1 - p)``, ``noise.div_(1 - p)``, ``a * noise`` — its backward ``grad * noise``, as eager's
``MulBackward``; on CUDA, XPU, lazy and privateuse1 devices ``native_dropout(a, p, True)`` — its backward
``native_dropout_backward(grad, mask, 1 / (1 - p))``. Same generator, same draws, same arithmetic: equal bits, and
the generator's state after the call equal to eager's. The operation is opaque to fusion (it runs as one call where
the trace has it: draws happen in trace order).

Not covered (thunder's own decomposition, as before): ``p`` a symbolic number, ``p`` 0 or 1 (no draws), in-place
dropout, subclass tensors (their ``__torch_dispatch__`` path), ``alpha_dropout`` / ``feature_alpha_dropout`` /
``dropout1d-3d``, and other random operations (``torch.rand``, ``randn``, ``bernoulli``: thunder's ``uniform``-based
symbols draw differently from eager; see docs/limits.md).

Owner of state: the two symbols and the registration are process-wide, made once.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["ensure_dropout_rule", "is_dropout"]

_FUSED_DEVICE_TYPES = frozenset({"cuda", "xpu", "lazy", "privateuseone"})  # at::dropout's is_fused_kernel_acceptable
_symbols: dict[str, Any] = {}


def is_dropout(sym) -> bool:
    return sym.id == "torch.nn.functional.dropout"


def _fused(device_type: str) -> bool:
    return device_type in _FUSED_DEVICE_TYPES


def _dropout(a: torch.Tensor, p: float):
    if _fused(a.device.type) and a.numel() > 0:
        return torch.native_dropout(a, p, True)
    noise = torch.empty_like(a).bernoulli_(1 - p)
    noise.div_(1 - p)
    return a * noise, noise


def _dropout_backward(grad: torch.Tensor, saved: torch.Tensor, p: float):
    if saved.dtype == torch.bool:
        return torch.native_dropout_backward(grad, saved, 1.0 / (1.0 - p))
    return grad * saved


def _dropout_meta(a, p):
    from thunder.core import devices, dtypes
    from thunder.core.proxies import TensorProxy

    fused = _fused(devices.to_torch_device(a.device).type)
    saved = TensorProxy(like=a, dtype=dtypes.bool8 if fused else a.dtype, requires_grad=False)
    return TensorProxy(like=a), saved


def _dropout_backward_meta(grad, saved, p):
    from thunder.core.proxies import TensorProxy

    return TensorProxy(like=grad)


def _symbols_made() -> tuple:
    if not _symbols:
        from thunder_subclass.executor import subclass_executor, unique_operator_name

        from thunder.core.prims import OpTags

        # RANDOM_OP: it draws from torch's generator (never recomputed, never speculated, refused by create_graph)
        _symbols["forward"] = subclass_executor.register_operator(
            unique_operator_name("eager_dropout"), meta=_dropout_meta, fn=_dropout, tags=[OpTags.RANDOM_OP])
        _symbols["backward"] = subclass_executor.register_operator(
            unique_operator_name("eager_dropout_backward"), meta=_dropout_backward_meta, fn=_dropout_backward)
    return _symbols["forward"], _symbols["backward"]


def _arguments(a, p=0.5, training=True, inplace=False):
    return a, p, training, inplace


def _claims(*args, **kwargs) -> bool:
    from thunder.core.proxies import TensorProxy

    a, p, training, inplace = _arguments(*args, **kwargs)
    return (isinstance(a, TensorProxy) and training is True and inplace is False and type(p) in (int, float)
            and 0 < p < 1)


def _execution_transform(*args, **kwargs):
    a, p, _, _ = _arguments(*args, **kwargs)
    forward, _ = _symbols_made()
    out, _ = forward(a, float(p))
    return out


def _grad_transform(*args, **kwargs):
    from thunder.core import prims

    a, p, _, _ = _arguments(*args, **kwargs)
    forward, backward = _symbols_made()
    out, saved = forward(a, float(p))
    grad = prims.get_grad(out)
    prims.put_grad(a, backward(grad, saved, float(p)))
    return out


def ensure_dropout_rule(sym) -> None:
    """Claim ``ltorch.dropout`` (``sym``) for plain tensors by the plugin's executor (once per process)."""
    from thunder_subclass.autograd import ensure_plain_rule

    _symbols_made()
    ensure_plain_rule(sym, _claims, _execution_transform, _grad_transform)
