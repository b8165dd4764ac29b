"""Stage 4 (interpretation), the symbols at the boundary between a subclass object and its inner tensors.

In: a subclass type the trace meets (an input, an operation's subclass argument or result, a gradient).
What happens: its pair of symbols is made, once per type, in the plugin's executor. Out: these symbols:

* ``flatten_<Cls>(x, attrs)`` -> the inner tensors of ``x`` named by ``attrs`` (``getattr`` at run time; defined
  with the proxy, ``thunder_subclass.frontend.proxy.flatten_symbol``, since reading ``x.a`` records it);
* ``flatten_cotangent_<Cls>(g, attrs, ctx)`` -> the inner tensors of a gradient passed to ``.backward()``, checked;
* ``unflatten_<Cls>(inner..., attrs, ctx, outer_size, outer_stride)`` -> ``Cls.__tensor_unflatten__(...)``.

One pair per subclass type, made on first use in the plugin's executor, so traces read ``flatten_TwoTensor``.
After the flatten pass, ``flatten_*`` remains only for subclass inputs of the trace and ``unflatten_*`` only where
a subclass leaves the compiled function.
"""

from __future__ import annotations

from typing import Any

from thunder.core.proxies import NumberProxy
from thunder.core.symbol import Symbol

from thunder_subclass._thunder_internals import remember_symbol_origin
from thunder_subclass.errors import SubclassGradientError
from thunder_subclass.executor import register_symbol
from thunder_subclass.frontend.fake import FakeEnv, resolve_context
from thunder_subclass.frontend.proxy import SubclassTensorProxy, flatten_ids, size_values, subclass_proxy_from_tensor

__all__ = [
    "unflatten_symbol", "cotangent_flatten_symbol", "is_flatten_bsym", "is_unflatten_bsym", "record_unflatten",
    "ctx_arg", "ctx_value", "FlattenContext",
]

class FlattenContext:
    """A flatten context that is not a plain literal (DTensor's holds placements and a ``TensorMeta`` named tuple), or
    an outer size or stride holding nested ints (a jagged NestedTensor's ``(3, j1, 5)``), passed to the boundary
    symbols as an object: thunder prints literal arguments as source code, which would name classes (or nested ints)
    the execution trace does not define."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return f"FlattenContext({self.value!r})"


def _is_literal(x: Any) -> bool:
    if x is None or type(x) in (bool, int, float, str):
        return True
    if type(x) in (tuple, list):
        return all(_is_literal(v) for v in x)
    if type(x) is dict:
        return all(type(k) is str and _is_literal(v) for k, v in x.items())
    return False


def ctx_arg(ctx: Any) -> Any:
    """``ctx`` as a bound-symbol argument: itself when a plain literal or a size holding number proxies (symbolic
    sizes: the trace passes their values at run time), else wrapped in :class:`FlattenContext`."""
    if _is_literal(ctx) or _is_size_of_numbers(ctx):
        return ctx
    return FlattenContext(ctx)


def _is_size_of_numbers(x: Any) -> bool:
    return type(x) is tuple and any(isinstance(v, NumberProxy) for v in x) \
        and all(type(v) is int or isinstance(v, NumberProxy) for v in x)


def ctx_value(arg: Any) -> Any:
    return arg.value if isinstance(arg, FlattenContext) else arg


_unflatten: dict[type, Symbol] = {}
_unflatten_ids: set[str] = set()


def unflatten_symbol(cls: type) -> Symbol:
    sym = _unflatten.get(cls)
    if sym is None:

        def meta(inner: tuple, attrs: tuple[str, ...], ctx: Any, outer_size: tuple, outer_stride: tuple):
            env = FakeEnv()
            size, stride = size_values(ctx_value(outer_size)), size_values(ctx_value(outer_stride))
            fake = cls.__tensor_unflatten__(
                {a: env.to_fake(p) for a, p in zip(attrs, inner)}, resolve_context(ctx_value(ctx), size, stride),
                size, stride,
            )
            out = subclass_proxy_from_tensor(fake, name=None, history=None)
            out.inner = dict(zip(attrs, inner))
            return out

        def impl(inner, attrs, ctx, outer_size, outer_stride):
            size, stride = ctx_value(outer_size), ctx_value(outer_stride)
            return cls.__tensor_unflatten__(
                dict(zip(attrs, inner)), resolve_context(ctx_value(ctx), size, stride), size, stride
            )

        sym = register_symbol(f"unflatten_{cls.__name__}", meta=meta, fn=impl)
        _unflatten[cls] = sym
        remember_symbol_origin(sym, impl, unflatten_symbol, (cls,))
        _unflatten_ids.add(sym.id)
    return sym


_cotangent_flatten: dict[type, Symbol] = {}


def _coerce_cotangent(cls: type, g: Any, expected_ctx: Any):
    """The incoming gradient ``g`` as the ``cls`` with flatten context ``expected_ctx`` the backward was compiled
    for, using the subclass's ``__coerce_same_metadata_as_tangent__`` where needed (as torch.compile does)."""
    if type(g) is cls and g.__tensor_flatten__()[1] == expected_ctx:
        return g
    coerce = getattr(g, "__coerce_same_metadata_as_tangent__", None)
    if coerce is not None:
        coerced = coerce(expected_ctx) if type(g) is cls else coerce(expected_ctx, cls)
        if coerced is not None and type(coerced) is cls:  # trusted, as torch.compile trusts it
            return coerced
    got = type(g).__qualname__
    if type(g) is cls:
        got += f" with flatten context {g.__tensor_flatten__()[1]!r}"
    raise SubclassGradientError(
        f"the gradient passed to .backward() for a {cls.__qualname__} output of a thunder_subclass-compiled "
        f"function is a {got}; the compiled backward expects a {cls.__qualname__} with flatten context "
        f"{expected_ctx!r} (the kind of the output, which is also what .backward() without arguments passes). "
        f"Pass a {cls.__qualname__} gradient, or define {cls.__qualname__}.__coerce_same_metadata_as_tangent__ "
        "to convert other gradients."
    )


def cotangent_flatten_symbol(cls: type) -> Symbol:
    """``flatten_cotangent_<Cls>(g, attrs, ctx)``: the flatten of a gradient arriving from outside (the argument
    of ``.backward()``), checked against the kind the backward was compiled for."""
    sym = _cotangent_flatten.get(cls)
    if sym is None:

        def meta(g: SubclassTensorProxy, attrs: tuple[str, ...], ctx: Any):
            return tuple(g.inner[a] for a in attrs)

        def impl(g, attrs, ctx):
            g = _coerce_cotangent(cls, g, resolve_context(ctx_value(ctx), g.shape, g.stride()))
            return tuple(getattr(g, a) for a in attrs)

        sym = register_symbol(f"flatten_cotangent_{cls.__name__}", meta=meta, fn=impl)
        _cotangent_flatten[cls] = sym
        remember_symbol_origin(sym, impl, cotangent_flatten_symbol, (cls,))
        flatten_ids.add(sym.id)
    return sym


def is_flatten_bsym(bsym) -> bool:
    """``flatten_<Cls>`` or ``flatten_cotangent_<Cls>``."""
    return bsym.sym.id in flatten_ids


def is_unflatten_bsym(bsym) -> bool:
    return bsym.sym.id in _unflatten_ids


def record_unflatten(out: SubclassTensorProxy, scope: list) -> None:
    """Append ``out = unflatten_<Cls>(inner...)`` to ``scope`` (inner subclasses must already be defined)."""
    sym = unflatten_symbol(out.subclass_type)
    args = (tuple(out.inner.values()), out.attr_names, ctx_arg(out.flatten_ctx), ctx_arg(out.outer_size),
            ctx_arg(out.outer_stride))
    scope.append(sym.bind(*args, output=out))
