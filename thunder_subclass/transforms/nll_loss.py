"""Stage 5 (autograd), the backward of ``F.nll_loss`` / ``F.cross_entropy`` as eager computes it (plain tensors; the
executor claims it).

In: thunder's ``nll_loss_backward`` symbol in a backward trace (the gradient of ``F.nll_loss``, which
``F.cross_entropy`` calls), on plain tensors.
What happens: the plugin's executor claims it (:func:`ensure_nll_loss_backward_rule`, registered the first time a
trace meets ``nll_loss``) and runs aten's ``nll_loss_backward`` / ``nll_loss2d_backward`` as eager's autograd does:
``total_weight`` in the input's dtype, inputs of 3 or more than 4 dimensions (and their gradient with
``reduction="none"``) on ``(N, C, 1, rest)`` views, the gradient in the input's shape.
Out: the same backward trace, one operation ``eager_nll_loss_backward`` where thunder's torch executor had its own.

Why: thunder 0.2.6's torch executor passes ``aten.nll_loss_backward`` a float64 ``total_weight`` when the forward gave
none (``reduction="sum"`` and ``"none"``), which aten refuses for float32 inputs: "RuntimeError: expected scalar type
Float but found Double" in ``loss.backward()`` of every ``F.cross_entropy(..., reduction="sum")``. aten reads
``total_weight`` only for ``"mean"``; its dtype must be the input's. And for an input of 3 or more than 4 dimensions
(a sequence model's ``(batch, classes, length)`` logits) it returned the gradient in the shape of the 4-d view it
computed on: "returned an invalid gradient at index 0 - got [2, 3, 1, 4] but expected shape compatible with
[2, 3, 4]"; with ``reduction="none"`` it compared the reduction's number with the string "none" and passed the
gradient unreshaped: "grad_output must have same dimension as target (3)".
"""

from __future__ import annotations

from typing import Any

__all__ = ["ensure_nll_loss_backward_rule"]

_symbols: dict[str, Any] = {}


_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def _backward(g, a, target, weight, reduction, ignore_index, total_weight):
    import math

    import torch

    aten = torch.ops.aten
    reduction = _REDUCTIONS[reduction]
    if total_weight is None:
        total_weight = torch.zeros((), dtype=a.dtype, device=a.device)
    else:
        total_weight = total_weight.to(a.dtype)
    if a.ndim <= 2:
        return aten.nll_loss_backward(g, a, target, weight, reduction, ignore_index, total_weight)
    if a.ndim == 4:
        return aten.nll_loss2d_backward(g, a, target, weight, reduction, ignore_index, total_weight)
    # 3 or more than 4 dimensions: aten's 2-d kernel on (N, C, 1, rest) views, as eager's nll_loss_nd does
    n, c, rest = a.shape[0], a.shape[1], math.prod(a.shape[2:])
    g = g.reshape(n, 1, rest) if reduction == 0 else g
    grad = aten.nll_loss2d_backward(g, a.reshape(n, c, 1, rest), target.reshape(n, 1, rest), weight, reduction,
                                    ignore_index, total_weight)
    return grad.reshape(a.shape)


def _operator():
    if "backward" not in _symbols:
        import thunder.torch as ltorch

        from thunder_subclass.executor import subclass_executor, unique_operator_name

        _symbols["backward"] = subclass_executor.register_operator(
            unique_operator_name("eager_nll_loss_backward"), meta=ltorch.nll_loss_backward.meta, fn=_backward)
    return _symbols["backward"]


def _claims(*args, **kwargs) -> bool:
    return True


def _execution_transform(*args, **kwargs):
    return _operator()(*args, **kwargs)


def _grad_transform(*args, **kwargs):
    # thunder differentiates no backward of nll_loss (create_graph=True recomputes eagerly: transforms.higher_order)
    raise NotImplementedError("thunder_subclass: the gradient of nll_loss's backward is not traced")


def ensure_nll_loss_backward_rule() -> None:
    """Register (once) the claim described in the module docstring."""
    if "registered" in _symbols:
        return
    import thunder.torch as ltorch

    from thunder_subclass.transforms.autograd import ensure_plain_rule

    ensure_plain_rule(ltorch.nll_loss_backward, _claims, _execution_transform, _grad_transform)
    _symbols["registered"] = True
