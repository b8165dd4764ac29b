"""Stage 5 (autograd), in-place writes that overwrite a tensor which requires grad give its earlier value a zero
gradient, as eager does (plain tensors; the executor claims them).

In: a call of ``Tensor.copy_``, ``Tensor.zero_`` or ``Tensor.exponential_`` (thunder's ``ltorch`` symbols) on a plain
tensor that requires grad (an intermediate: eager refuses the write into a leaf), in a trace of
``thunder_subclass.jit`` that thunder differentiates.
What happens: the plugin's executor claims the call for autodiff (:func:`ensure_overwrite_rule`, registered the first
time a trace meets one): the forward is thunder's own (``_copy_`` of the new value), the backward gives the new value
its gradient and the overwritten tensor a gradient of zeros.
Out: the same forward trace; in the backward, ``zeros_like`` of the destination flows to what it was computed from.

Why: eager's ``CopyBackwards`` (and the backward of every in-place overwrite) keeps an edge to the destination's
earlier history and sends it zeros, so ``h = x * 2; h.copy_(y)`` leaves ``x.grad`` a tensor of zeros. thunder 0.2.6's
rule for ``copy_`` gives the destination no gradient (``None``), so ``x.grad`` stayed ``None``: an optimizer then skips
``x`` (no weight decay, no momentum step) where eager's takes a step. Writes that read the destination (``add_``,
``mul_``, ``relu_``) need nothing: their new value carries the gradient to it. ``fill_`` and the other random fills
are not traced by thunder (they run eagerly, a graph break, equal to eager).

Also here (:func:`broadcast_copy_source`): ``h.copy_(y)`` with a ``y`` that broadcasts to ``h``'s shape (eager accepts
it) failed in thunder 0.2.6 with "Shapes were expected to be the same" (its ``prims.copy_`` takes equal shapes only);
the source is expanded to the destination's shape first, which is what eager's copy does.
"""

from __future__ import annotations

from thunder_subclass.frontend.proxy import has_subclass_proxy

__all__ = ["OVERWRITES", "broadcast_copy_source", "ensure_overwrite_rule"]

# in-place torch methods whose new value does not read the destination (thunder's ltorch names)
OVERWRITES = frozenset({"copy_", "zero_", "exponential_"})


def _claims(a, *args, **kwargs) -> bool:
    from thunder.core import dtypes
    from thunder.core.proxies import TensorProxy

    return (isinstance(a, TensorProxy) and bool(a.requires_grad) and dtypes.is_inexact_dtype(a.dtype)
            and not has_subclass_proxy(args, kwargs))


def _source_grad(grad, source):
    """The new value's gradient as ``copy_``'s backward gives it: summed over broadcast dimensions, in its dtype."""
    import thunder.torch as ltorch
    from thunder.core import dtypes
    from thunder.core.proxies import TensorProxy

    if not isinstance(source, TensorProxy) or not dtypes.is_inexact_dtype(source.dtype):
        return None
    if tuple(source.shape) != tuple(grad.shape):
        grad = ltorch.sum_to(grad, source.shape)
    if source.dtype != grad.dtype:
        grad = ltorch.to(grad, source.dtype)
    return grad


def _transforms(sym):
    def execution_transform(*args, **kwargs):
        return _forward(sym, args, kwargs)

    def grad_transform(*args, **kwargs):
        import thunder.torch as ltorch
        from thunder.core import prims

        out = _forward(sym, args, kwargs)
        grad = prims.get_grad(out)
        # zeros of the destination's shape, dtype and device made from the gradient (the destination itself is not
        # kept for the backward; and a backward that does not read the incoming gradient trips thunder's
        # ThunderFunction, which expects every cotangent consumed)
        prims.put_grad(args[0], ltorch.zeros_like(grad))
        if sym.name == "copy_":
            source = args[1] if len(args) > 1 else kwargs.get("src")
            if getattr(source, "requires_grad", False):
                source_grad = _source_grad(grad, source)
                if source_grad is not None:
                    prims.put_grad(source, source_grad)
        return out

    return execution_transform, grad_transform


def _forward(sym, args: tuple, kwargs: dict):
    # thunder's own decomposition of the symbol (``_copy_`` of the new value into the destination), recorded in place
    return sym.meta(*args, **kwargs)


def broadcast_copy_source(sym, args: tuple, kwargs: dict):
    """``copy_(dest, src)`` of a plain ``src`` of another shape, recorded as ``copy_(dest, src.expand(dest.shape))``;
    ``NOT_HANDLED`` for anything else (thunder records it as it is)."""
    from thunder.core.proxies import TensorProxy

    from thunder_subclass import _thunder_internals

    if sym.name != "copy_" or len(args) != 2 or kwargs:
        return _thunder_internals.NOT_HANDLED
    dest, source = args
    if not (isinstance(dest, TensorProxy) and isinstance(source, TensorProxy)) \
            or tuple(dest.shape) == tuple(source.shape):
        return _thunder_internals.NOT_HANDLED
    import thunder.torch as ltorch

    return sym(dest, ltorch.expand(source, tuple(dest.shape)))


def ensure_overwrite_rule(sym) -> None:
    """Register (once per symbol) the claim described in the module docstring."""
    from thunder_subclass.transforms.autograd import ensure_plain_rule

    execution_transform, grad_transform = _transforms(sym)
    ensure_plain_rule(sym, _claims, execution_transform, grad_transform)
