"""Stage 5 (autograd), random operations that draw from torch's generator as eager does, so that a seeded compiled run
equals eager's bitwise (plain tensors; the executor claims them).

In: a call of ``torch.nn.functional.dropout`` (thunder's ``ltorch.dropout``; ``nn.Dropout`` calls it) on a plain
tensor in training, with a Python-number ``p`` strictly between 0 and 1 or a symbolic one (``dynamic=True``, or the
trace automatic dynamic shapes make after a miss: its value reaches ``eager_dropout`` when it runs, 0 and 1 drawing
nothing, as in eager), in a trace of ``thunder_subclass.jit``; and ``inplace=True`` on any tensor
(:func:`dropout_lookaside`, below).
What happens: the call is recorded as the plugin's dropout instead of thunder's decomposition.
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

Subclass tensors need nothing here: their ``__torch_dispatch__`` path runs eager's own decomposition of dropout
(``empty_like``, ``bernoulli_``, ``div_``, ``mul`` on the subclass), each aten operation as eager runs it, so they
draw as eager does. In-place dropout (:func:`dropout_lookaside`) is traced as ``a.mul_(F.dropout(ones_like(a), p))``:
eager's in-place dropout on the CPU draws ``empty_like(a).bernoulli_(1 - p)``, divides it and multiplies ``a`` in
place, and ``1 * noise`` is ``noise`` bit for bit; on a device with a fused kernel it is an
``UnsupportedTracingError`` (eager's in-place and out-of-place dropout draw differently there).

Not covered (thunder's own decomposition, as before): ``p`` a Python 0 or 1 (no draws), ``alpha_dropout`` /
``feature_alpha_dropout`` / ``dropout1d-3d``, and other random operations (``torch.rand``, ``randn``, ``bernoulli``:
thunder's ``uniform``-based symbols draw differently from eager; see docs/limits.md).

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
    fused = _fused(a.device.type)
    if p == 0 or a.numel() == 0:  # (a symbolic p: its value is known only now) eager returns the input, no draws
        return a.clone(), torch.ones_like(a, dtype=torch.bool if fused else a.dtype)
    if p == 1:  # eager: input * zeros, no draws
        zeros = torch.zeros_like(a)
        return a * zeros, zeros.bool() if fused else zeros
    if fused:
        return torch.native_dropout(a, p, True)
    noise = torch.empty_like(a).bernoulli_(1 - p)
    noise.div_(1 - p)
    return a * noise, noise


def _dropout_backward(grad: torch.Tensor, saved: torch.Tensor, p: float):
    if saved.dtype == torch.bool and 0 < p < 1:  # the fused kernel's mask
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
    from thunder.core.proxies import NumberProxy, TensorProxy

    a, p, training, inplace = _arguments(*args, **kwargs)
    # p a symbolic number (dynamic shapes, automatic dynamic): its value reaches eager_dropout at run time
    return (isinstance(a, TensorProxy) and training is True and inplace is False
            and ((type(p) in (int, float) and 0 < p < 1) or (isinstance(p, NumberProxy) and p.python_type in
                                                              (int, float))))


def _number(p):
    return float(p) if type(p) in (int, float) else p


def _execution_transform(*args, **kwargs):
    a, p, _, _ = _arguments(*args, **kwargs)
    forward, _ = _symbols_made()
    out, _ = forward(a, _number(p))
    return out


def _grad_transform(*args, **kwargs):
    from thunder.core import prims

    a, p, _, _ = _arguments(*args, **kwargs)
    forward, backward = _symbols_made()
    out, saved = forward(a, _number(p))
    grad = prims.get_grad(out)
    prims.put_grad(a, backward(grad, saved, _number(p)))
    return out


def ensure_dropout_rule(sym) -> None:
    """Claim ``ltorch.dropout`` (``sym``) for plain tensors by the plugin's executor (once per process)."""
    from thunder_subclass.transforms.autograd import ensure_plain_rule

    _symbols_made()
    ensure_plain_rule(sym, _claims, _execution_transform, _grad_transform)


def _is_proxy(value) -> bool:
    from thunder.core.proxies import TensorProxy

    return isinstance(value, TensorProxy)


def dropout_lookaside(fn, wrapped_args: tuple):
    """``F.dropout(a, p, training, inplace=True)`` (``nn.Dropout(inplace=True)``), plain or subclass tensor: traced as
    eager's in-place dropout runs on the CPU, ``a.mul_(noise)`` with ``noise = F.dropout(ones_like(a), p, training,
    False)`` (the same ``bernoulli_`` on a new tensor of ``a``'s kind and ``div_``, times one: the bits of eager's noise,
    so equal outputs, gradients and generator state; thunder's own symbol refuses ``inplace=True``, and a subclass's
    fake run changed ``a`` without its gradient). On a device with a fused dropout kernel (CUDA), where eager's
    in-place and out-of-place dropout draw differently, an ``UnsupportedTracingError``. A call with ``inplace`` passed
    as ``False`` in place goes to thunder's symbol (None here)."""
    import torch.nn.functional as F

    if fn is not F.dropout or not wrapped_args or not _is_proxy(getattr(wrapped_args[0], "value", None)):
        return None
    if len(wrapped_args) >= 4 and getattr(wrapped_args[3], "value", None) is False:
        return None

    def dropout(a, p=None, training=None, inplace=None, **kwargs):
        from thunder.core import devices
        from thunder.core.interpreter import INTERPRETER_SIGNALS, wrap_const

        from thunder_subclass import _thunder_internals
        from thunder_subclass.errors import UnsupportedTracingError, format_location

        p = kwargs.pop("p", p) if p is None else p
        training = kwargs.pop("training", training) if training is None else training
        inplace = kwargs.pop("inplace", inplace) if inplace is None else inplace
        if kwargs:  # an unknown keyword: F.dropout's own error
            return _thunder_internals.interpret_call(wrap_const(F.dropout), a, **kwargs)
        p = wrap_const(0.5) if p is None else p
        training = wrap_const(True) if training is None else training
        if not getattr(inplace, "value", False):
            return _thunder_internals.interpret_call(wrap_const(F.dropout), a, p, training, wrap_const(False))
        if _fused(devices.to_torch_device(a.value.device).type):
            where = format_location(*_thunder_internals.source_location())
            return _thunder_internals.raise_in_interpreter(UnsupportedTracingError(
                f"F.dropout(..., inplace=True) on a {a.value.device} tensor at {where}: eager's in-place dropout "
                f"draws its mask otherwise than its out-of-place one there, which the compiled program uses. Use "
                f"inplace=False (nn.Dropout(inplace=False))."))
        ones = _thunder_internals.interpret_call(wrap_const(torch.ones_like), a)
        if ones is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
            return ones
        noise = _thunder_internals.interpret_call(wrap_const(F.dropout), ones, p, training, wrap_const(False))
        if noise is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
            return noise
        return _thunder_internals.interpret_call(wrap_const(torch.Tensor.mul_), a, noise)

    return dropout
