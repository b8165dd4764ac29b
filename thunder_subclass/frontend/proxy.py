"""Stage 3 (inputs and guards), proxies: how a tensor wrapper subclass is represented in thunder traces (inputs, and the
results of the operations stage 4 interprets).

In: a real subclass value reaching the interpreter (an argument, a parameter, a buffer), or the result metadata of an
operation that returns a subclass. What happens: the value's ``__tensor_flatten__`` names its inner tensors, each of
which becomes a proxy in turn. Out: a :class:`SubclassTensorProxy`, a ``TensorProxy`` for the *outer* tensor
(shape, dtype, device, requires_grad as the subclass reports them, never taken from an inner tensor) that also carries
the subclass type, its inner tensor proxies by attribute name (recursively for nested subclasses), the flatten context
(``__tensor_flatten__()[1]``) and the outer strides (``__tensor_unflatten__`` needs them).

In a trace it prints as ``TwoTensor[cpu f32[4, 4]] (a: cpu f32[4, 4], b: cpu f32[4, 4])``.

Ragged sizes: a jagged ``NestedTensor``'s outer size holds a nested int (``torch.Size([3, j1, 5])``, a
``torch.SymInt``), which thunder's tensor proxies cannot hold. The proxy keeps it on the side
(``SubclassTensorProxy.nested_sizes``, dim -> nested int; :attr:`SubclassTensorProxy.outer_size` is the true size
with it) and has :data:`RAGGED_PLACEHOLDER` at that dim of its thunder shape; it prints as
``NestedTensor[cpu f64[3, j1, 5]]``. Plain tensors torch associates a nested int with (the offsets) carry it too
(:func:`nested_int_of`), so fakes made from them in later fake runs build NestedTensors of the same ragged size, as
eager does for NestedTensors sharing offsets.
"""

from __future__ import annotations

import functools
import operator
import types
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

import thunder.core.devices as devices
import thunder.core.dtypes as dtypes
from thunder.core.proxies import AnyProxy, NumberProxy, ProxyTag, TensorProxy, tensorproxy
from thunder.core.pytree import tree_iter
from thunder.core.symbol import Symbol
from thunder.core.trace import get_tracectx

from thunder_subclass._thunder_internals import (
    attribute_provenance,
    input_size_numbers,
    is_nested_int,
    is_opaque_reference_object,
    registered_nested_int,
    remember_symbol_origin,
    opaque_attributes_supported,
    opaque_attributes_unavailable,
    opaque_guard_fn,
    real_script_object,
)
from thunder_subclass.errors import SubclassProtocolError
from thunder_subclass.executor import register_symbol

__all__ = [
    "SubclassTensorProxy", "OpaqueObjectProxy", "is_subclass_value", "has_subclass_proxy", "has_subclass_leaf",
    "subclass_proxy_from_tensor",
    "proxy_kind", "runtime_kind", "ctx_key", "flatten_symbol", "record_flatten", "record_opaque_constant",
    "RAGGED_PLACEHOLDER",
    "nested_int_of", "remember_nested_int", "is_symbolic_size", "has_symbolic_sizes", "size_values",
]

# the size a ragged (nested-int) dim has in a subclass proxy's thunder shape: a valid length that no code reads as the
# ragged size (user code gets the nested int, fakes are made from SubclassTensorProxy.outer_size)
RAGGED_PLACEHOLDER = 1

_NESTED_INT_ATTR = "_thunder_subclass_nested_int"


def nested_int_of(p: Any) -> torch.SymInt | None:
    """The nested int associated with plain tensor proxy ``p`` (it is the offsets or lengths of a NestedTensor)."""
    return p.__dict__.get(_NESTED_INT_ATTR) if isinstance(p, TensorProxy) else None


def remember_nested_int(p: TensorProxy, value: torch.SymInt | None) -> None:
    # (a plain nested int only: a symbolic one of a fake run, ShapeSymbols.nested_int, stands for one in that run)
    if value is not None and is_nested_int(value) and not isinstance(p, SubclassTensorProxy) \
            and _NESTED_INT_ATTR not in p.__dict__:
        p.__dict__[_NESTED_INT_ATTR] = value


class SubclassTensorProxy(TensorProxy):
    """A proxy for a tensor wrapper subclass.

    Attributes:
        subclass_type: the exact Python type of the subclass (``TwoTensor``, ``Float8TrainingTensor``, ...).
        inner: the inner tensors by attribute name, in ``__tensor_flatten__`` order: ``TensorProxy`` or, for a
            nested subclass, ``SubclassTensorProxy``.
        flatten_ctx: the non-tensor metadata returned by ``__tensor_flatten__`` (passed back to
            ``__tensor_unflatten__``).
        outer_stride: strides of the outer tensor.
        python_attrs: the other, non-tensor attributes of the instance (``vars(x)`` less the inner tensors), as
            eager code reads them (``x.quant_type``, ``nn.Parameter``'s ``_is_param``); set on the fakes made for it.
        inner_refs: instance attributes that are containers holding only inner tensors (by identity), as
            ``{name: structure}`` with :class:`InnerRef` leaves (NestedTensor's ``_metadata_cache``: its cached
            sequence lengths are the ``_min_seqlen_tensor`` / ``_max_seqlen_tensor`` inner tensors); read in traced
            code, the structure is rebuilt from the inner proxies.

    Attribute access for an inner tensor name (``x.a``) gives that inner proxy, as ``x.a`` gives the inner tensor
    in eager mode.
    """

    _DEFAULT_PREFIX = "s"

    def __init__(
        self,
        name: str | None = None,
        *,
        like: SubclassTensorProxy | None = None,
        subclass_type: type | None = None,
        inner: Mapping[str, TensorProxy] | None = None,
        flatten_ctx: Any = None,
        outer_stride: tuple[int, ...] | None = None,
        python_attrs: Mapping[str, Any] | None = None,
        inner_refs: Mapping[str, Any] | None = None,
        shape=None,
        device=None,
        dtype=None,
        requires_grad: bool = False,
        history=None,
        tags=None,
    ):
        if like is not None:
            # ``type(p)(like=p)`` (thunder's get_grad, shallow_copy): the same subclass and metadata, with new
            # inner proxies of the same kinds (a gradient has its own inner tensors).
            subclass_type = like.subclass_type
            flatten_ctx = like.flatten_ctx
            outer_stride = like.outer_stride
            python_attrs = like.python_attrs
            inner_refs = like.inner_refs
            inner = {
                a: OpaqueObjectProxy(p.value) if isinstance(p, OpaqueObjectProxy) else _inner_like(p)
                for a, p in like.inner.items()
            }
            shape, device, dtype = like.outer_size, like._device, like._dtype
            requires_grad = like.requires_grad
        # nested ints (ragged sizes) are kept aside; thunder's shape has a placeholder there
        self.nested_sizes = {i: s for i, s in enumerate(shape or ()) if is_nested_int(s)}
        if self.nested_sizes:
            shape = tuple(RAGGED_PLACEHOLDER if i in self.nested_sizes else s for i, s in enumerate(shape))
        super().__init__(
            name, shape=shape, device=device, dtype=dtype, requires_grad=requires_grad, history=history, tags=tags
        )
        self.subclass_type = subclass_type
        self.inner = dict(inner)
        self.flatten_ctx = flatten_ctx
        self.outer_stride = tuple(outer_stride)
        self.python_attrs = dict(python_attrs or {})
        self.inner_refs = dict(inner_refs or {})

    def __getattr__(self, attr: str, /):
        inner = self.__dict__.get("inner")
        if inner is not None and attr in inner:
            self._define_inner_in_trace()
            return inner[attr]
        if inner is not None:
            method = subclass_method(self, attr)
            if method is not None:
                return method
        return super().__getattr__(attr)

    def _define_inner_in_trace(self) -> None:
        # User code reads an inner tensor (``x.a``): the inner proxies must be defined in the trace at this point,
        # not only inside the subsymbols of the operation that made ``x``. Recorded once per trace.
        trace = get_tracectx()
        if trace is None or self.__dict__.get("_flattened_in") is trace:
            return
        record_flatten(self, trace.peek_scope())
        self.__dict__["_flattened_in"] = trace

    @property
    def outer_size(self) -> tuple:
        """The outer size as the subclass reports it: thunder's shape with the nested ints at ragged dims."""
        if not self.nested_sizes:
            return tuple(self._shape)
        return tuple(self.nested_sizes.get(i, s) for i, s in enumerate(self._shape))

    @property
    def attr_names(self) -> tuple[str, ...]:
        return tuple(self.inner)

    def leaves(self) -> list[TensorProxy]:
        """Plain inner proxies, depth first (the tensors the flattened program works on)."""
        out = []
        for p in self.inner.values():
            if isinstance(p, TensorProxy):
                out.extend(p.leaves() if isinstance(p, SubclassTensorProxy) else [p])
        return out

    def replace(self, **changes):
        kwargs = dict(
            name=self.name,
            subclass_type=self.subclass_type,
            inner=self.inner,
            flatten_ctx=self.flatten_ctx,
            outer_stride=self.outer_stride,
            python_attrs=self.python_attrs,
            inner_refs=self.inner_refs,
            shape=self.outer_size,
            device=self._device,
            dtype=self._dtype,
            requires_grad=self._requires_grad,
            history=self.history,
            tags=self.tags,
        )
        like = changes.pop("like", None)
        if like is not None:
            kwargs.update(shape=like.outer_size if isinstance(like, SubclassTensorProxy) else like.shape, device=like.device, dtype=like.dtype, requires_grad=like.requires_grad)
        changes.pop("grad", None)
        kwargs.update(changes)
        return SubclassTensorProxy(**kwargs)

    def type_string(self) -> str:
        inner = ", ".join(f"{a}: {p.type_string()}" for a, p in self.inner.items())
        ctx = "" if self.flatten_ctx is None else f", ctx={self.flatten_ctx!r}"
        outer = super().type_string()
        if self.nested_sizes:  # "cpu f64[3, 1, 5]" -> "cpu f64[3, j1, 5]"
            prefix = outer[: outer.index("[")]
            outer = f"{prefix}[{', '.join(str(s) for s in self.outer_size)}]"
        return f"{self.subclass_type.__name__}[{outer}] ({inner}{ctx})"

    def __repr__(self) -> str:
        return f'<SubclassTensorProxy(name="{self.name}", {self.type_string()})>'


# on a plain proxy: the strides of its value, as eager has them (thunder's proxies carry none; ``fake.stride_of``)
STRIDE_ATTR = "_thunder_subclass_stride"
# on a plain inner proxy made like another one (a gradient's, by ``SubclassTensorProxy(like=...)``): the proxy whose
# strides it has (``fake.stride_of``), so that the outer strides, copied, and the inner ones describe one layout
STRIDES_LIKE_ATTR = "_thunder_subclass_strides_like"


def _inner_like(p: TensorProxy) -> TensorProxy:
    q = type(p)(like=p)
    if not isinstance(q, SubclassTensorProxy):
        q.__dict__[STRIDES_LIKE_ATTR] = p
    return q


PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


def is_subclass_value(t: Any) -> bool:
    """True for a tensor whose class is a wrapper subclass the compiler must see (it defines ``__torch_dispatch__``).

    Raises :class:`SubclassProtocolError` for a ``__torch_dispatch__`` subclass without
    ``__tensor_flatten__`` / ``__tensor_unflatten__`` (it cannot be taken apart, so it cannot be compiled).
    """
    if not isinstance(t, torch.Tensor) or isinstance(t, TensorProxy):
        return False
    cls = type(t)
    if cls in PLAIN_TENSOR_TYPES or isinstance(t, FakeTensor):
        return False
    if is_traceable_wrapper_subclass(t):
        return True
    if getattr(cls, "__torch_dispatch__", None) is not getattr(torch.Tensor, "__torch_dispatch__", None):
        missing = [m for m in ("__tensor_flatten__", "__tensor_unflatten__") if not hasattr(cls, m)]
        raise SubclassProtocolError(
            f"{cls.__qualname__} overrides __torch_dispatch__ but does not define {' and '.join(missing)}; "
            f"thunder_subclass needs both to take a {cls.__qualname__} apart into inner tensors and rebuild it. "
            "Define them as in torch.testing._internal.two_tensor.TwoTensor."
        )
    return False


_PROTOCOL_ERROR = "_thunder_subclass_protocol_error"


def mark_protocol_error(p: TensorProxy, error: Exception) -> TensorProxy:
    """Remember on ``p`` that its value is a subclass that cannot be compiled (see :func:`has_subclass_proxy`)."""
    p.__dict__[_PROTOCOL_ERROR] = error
    return p


def is_symbolic_size(d: Any) -> bool:
    """A size that is a number proxy the prologue does not pin (``cache="symbolic values"``)."""
    return isinstance(d, NumberProxy) and not d.is_static_constrained()


def has_symbolic_sizes(p: Any) -> bool:
    """Whether tensor proxy ``p`` (or, for a subclass proxy, one of its inner proxies) has a symbolic size."""
    if not isinstance(p, TensorProxy):
        return False
    return any(is_symbolic_size(d) for d in p._shape) or (
        isinstance(p, SubclassTensorProxy) and any(has_symbolic_sizes(q) for q in p.inner.values()))


def size_values(sizes) -> tuple:
    """``sizes`` with each number proxy replaced by its value (as traced)."""
    return tuple(int(d.value) if isinstance(d, NumberProxy) else d for d in sizes)


def has_subclass_proxy(args, kwargs) -> bool:
    """True when a ``SubclassTensorProxy`` is among the arguments. Raises the protocol error recorded by
    :func:`mark_protocol_error` for an argument made from a subclass that cannot be compiled."""
    return has_subclass_leaf(tree_iter((args, kwargs)))


def has_subclass_leaf(leaves) -> bool:
    """:func:`has_subclass_proxy` of arguments already flattened to ``leaves``."""
    found = False
    for a in leaves:
        if isinstance(a, SubclassTensorProxy):
            found = True
        elif isinstance(a, TensorProxy) and _PROTOCOL_ERROR in a.__dict__:
            raise a.__dict__[_PROTOCOL_ERROR]
    return found


def fresh_name(base: str) -> str:
    trace = get_tracectx()
    name, i = base, 0
    while trace.has_name(name):
        name = f"{base}_{i}"
        i += 1
    return name


def flatten_tensor(t: torch.Tensor) -> tuple[list[str], Any]:
    """``__tensor_flatten__`` of ``t``, checked: names of tensor attributes, and the context."""
    cls = type(t)
    try:
        result = t.__tensor_flatten__()
    except Exception as e:
        raise SubclassProtocolError(f"{cls.__qualname__}.__tensor_flatten__ raised {type(e).__name__}: {e}") from e
    if not (
        isinstance(result, (tuple, list))
        and len(result) == 2
        and isinstance(result[0], (tuple, list))
        and all(isinstance(a, str) for a in result[0])
    ):
        raise SubclassProtocolError(
            f"{cls.__qualname__}.__tensor_flatten__ returned {result!r}; it must return a pair (names of the inner "
            "tensor attributes, context), e.g. (['a', 'b'], None) as torch.testing._internal.two_tensor.TwoTensor does."
        )
    attrs, ctx = result
    for a in attrs:
        v = real_script_object(getattr(t, a, None))
        if not isinstance(v, torch.Tensor) and not is_opaque_object(v):
            _check_opaque_attributes_supported(cls, a, v)
            raise SubclassProtocolError(
                f"{cls.__qualname__}.__tensor_flatten__ names attribute {a!r}, which is not a tensor "
                f"(got {type(v).__name__}); only tensor attributes, and objects of opaque reference types "
                "(torch._opaque_base.OpaqueBase registered with register_opaque_type(..., typ='reference')), may "
                "be listed."
            )
    return list(attrs), ctx


def _check_opaque_attributes_supported(cls: type, attr: str, v: Any) -> None:
    """Where torch has no opaque reference attributes (torch 2.10), a non-tensor attribute of a class that could be
    registered as one (not a builtin type) raises the typed error naming the torch version that has them."""
    if type(v).__module__ != "builtins" and not opaque_attributes_supported():
        raise opaque_attributes_unavailable(
            f"{cls.__qualname__}.__tensor_flatten__ names attribute {attr!r} ({type(v).__qualname__}), not a tensor"
        )


def is_opaque_object(v: Any) -> bool:
    """An object of an opaque *reference* type (torch >= 2.11: ``torch._library.opaque_object``), which
    ``__tensor_flatten__`` may list next to tensors (DeviceMesh works this way)."""
    if v is None or isinstance(v, (torch.Tensor, int, float, bool, str)):
        return False
    return is_opaque_reference_object(v)


def opaque_guard_values(v: Any) -> Any:
    """What the cache guards on for opaque object ``v``: its type's registered ``guard_fn(v)`` (None without one)."""
    guard_fn = opaque_guard_fn(type(v))
    return None if guard_fn is None else guard_fn(v)


class OpaqueObjectProxy(AnyProxy):
    """An opaque object held by a subclass (``__tensor_flatten__`` lists it): an input of the trace, flowing through
    ``flatten_*`` / ``unflatten_*`` at run time, never a baked constant. ``value`` is the object seen while tracing
    (used for fake runs); guards compare its type's ``guard_fn``."""

    _DEFAULT_PREFIX = "opaque"

    @property
    def value(self) -> Any:
        return self._o

    def type_string(self) -> str:
        return f"opaque {type(self._o).__qualname__}"

    def replace(self, **changes):
        kwargs = dict(name=self.name, history=self.history, tags=self.tags)
        kwargs.update(changes)
        return OpaqueObjectProxy(self._o, **kwargs)


def _opaque_constant_meta(obj: Any) -> OpaqueObjectProxy:
    return OpaqueObjectProxy(obj)


def _opaque_constant_impl(obj: Any) -> Any:
    return obj


_opaque_constant: list[Symbol] = []


def record_opaque_constant(obj: Any, scope: list) -> OpaqueObjectProxy:
    """Append ``p = opaque_constant(obj)`` to ``scope`` and return ``p``: an opaque object that is no input of the
    trace but a constant of the traced code (the ``DeviceMesh`` a tensor-parallel hook holds in a
    ``functools.partial``, like a module's forward method), for the ``unflatten_<Cls>`` symbols that take it."""
    if not _opaque_constant:
        _opaque_constant.append(register_symbol("opaque_constant", meta=_opaque_constant_meta, fn=_opaque_constant_impl))
    p = OpaqueObjectProxy(obj)
    scope.append(_opaque_constant[0].bind(obj, output=p))
    return p


def _inner_tensor_proxy(t: torch.Tensor, name: str, history) -> TensorProxy:
    """The proxy of inner tensor ``t``. An inner tensor of no input (``history`` None: a result's, a gradient's made
    after interpretation) has static sizes: thunder's ``tensorproxy`` makes input-size proxies under
    ``cache="symbolic values"``, which need the interpreter's context (``LookupError: interpretercompilectx`` when a
    gradient kind is made after interpretation) and would name no input."""
    if history is None and all(type(s) is int for s in t.shape):
        return TensorProxy(
            name, shape=tuple(t.shape), device=devices.to_device(t.device), dtype=dtypes.to_dtype(t.dtype),
            requires_grad=t.requires_grad,
        )
    return tensorproxy(t, name=name, history=history)


def subclass_proxy_from_tensor(t: torch.Tensor, *, name: str | None, history, inner_history=None,
                               outer_shape: tuple | None = None) -> SubclassTensorProxy:
    """A proxy for the real (or fake) subclass ``t``. ``inner_history(attr)`` gives provenance for inner proxies;
    ``outer_shape``, when given, is the proxy's shape (an input's size numbers under ``cache="symbolic values"``;
    a subclass nested inside gets its own, read from its provenance)."""
    attrs, fctx = flatten_tensor(t)
    name = name if name is not None else get_tracectx().make_name(prefix=SubclassTensorProxy._DEFAULT_PREFIX)
    inner = {}
    for a in attrs:
        it = getattr(t, a)
        h = inner_history(a) if inner_history is not None else None
        iname = fresh_name(f"{name}_{a}")
        if is_opaque_object(it):
            inner[a] = OpaqueObjectProxy(it, name=iname, history=h)
        elif is_subclass_value(it):
            inner[a] = subclass_proxy_from_tensor(
                it, name=iname, history=h, inner_history=None if h is None else attribute_provenance(h),
                outer_shape=input_size_numbers(it.shape, h) if outer_shape is not None and h is not None else None,
            )
        else:
            inner[a] = _inner_tensor_proxy(it, iname, h)
            remember_nested_int(inner[a], registered_nested_int(it))
            if it.layout is torch.strided and all(type(s) is int for s in (*it.shape, *it.stride())):
                # the inner layout of this value, with the outer strides below: one layout (a DTensor's outer and
                # local strides agree; views its dispatch makes depend on both)
                inner[a].__dict__[STRIDE_ATTR] = tuple(it.stride())
    # the outer name was reserved above; Proxy.__init__ records it again, so release it first
    get_tracectx().names.discard(name)
    p = SubclassTensorProxy(
        name,
        subclass_type=type(t),
        inner=inner,
        flatten_ctx=fctx,
        outer_stride=tuple(t.stride()),
        python_attrs=python_attributes(t, attrs),
        inner_refs=inner_references(t, attrs),
        shape=tuple(outer_shape) if outer_shape is not None else tuple(t.shape),
        device=devices.to_device(t.device),
        dtype=dtypes.to_dtype(t.dtype),
        requires_grad=t.requires_grad,
        history=history,
    )
    if isinstance(t, torch.nn.Parameter):
        p.tags.add(ProxyTag.STATIC_MEMORY_LOCATION)
    return p


_LEAF_ATTR = "_thunder_subclass_leaf"


def mark_leaf(p: TensorProxy, t: torch.Tensor) -> None:
    """Remember that input proxy ``p`` stands for ``t``, a leaf of autograd (its fakes are leaves too), and so on for
    the inner tensors of a subclass."""
    if t.is_leaf:
        p.__dict__[_LEAF_ATTR] = True
    if isinstance(p, SubclassTensorProxy):
        for a, q in p.inner.items():
            if isinstance(q, TensorProxy):
                mark_leaf(q, getattr(t, a))


def is_marked_leaf(p: TensorProxy) -> bool:
    return p.__dict__.get(_LEAF_ATTR, False)


def python_attributes(t: torch.Tensor, attrs) -> dict[str, Any]:
    """The non-tensor instance attributes of subclass value ``t`` other than those ``__tensor_flatten__`` lists
    (``attrs``): what eager code may read besides inner tensors (tensors among them cannot be traced, so they are left
    out; reading one raises)."""
    skip = set(attrs)
    found = {}
    for name in _slot_names(type(t)):  # __slots__ of the subclass's own classes
        if name not in skip and hasattr(t, name):
            found[name] = getattr(t, name)
    found.update(getattr(t, "__dict__", None) or {})
    return {k: v for k, v in found.items()
            if k not in skip and not _holds_tensors_or_sizes(v) and not _is_torch_bookkeeping(k)}


class InnerRef:
    """A leaf of :attr:`SubclassTensorProxy.inner_refs`: the inner tensor named ``attr``."""

    __slots__ = ("attr",)

    def __init__(self, attr: str):
        self.attr = attr

    def __repr__(self) -> str:
        return f"InnerRef({self.attr!r})"


def inner_references(t: torch.Tensor, attrs) -> dict[str, Any]:
    """The instance attributes of subclass value ``t`` that are dicts, lists or tuples holding only inner tensors
    listed by ``__tensor_flatten__`` (``attrs``), the same objects: ``{name: structure with InnerRef leaves}``."""
    by_id = {}
    for a in attrs:
        v = getattr(t, a, None)
        if isinstance(v, torch.Tensor):
            by_id[id(v)] = a
    found = {}
    for k, v in (getattr(t, "__dict__", None) or {}).items():
        if k in attrs or type(v) not in (dict, list, tuple) or not _holds_tensors_or_sizes(v):
            continue
        ref = _as_inner_refs(v, by_id)
        if ref is not None:
            found[k] = ref
    return found


def _as_inner_refs(v: Any, by_id: dict):
    if isinstance(v, torch.Tensor):
        return InnerRef(by_id[id(v)]) if id(v) in by_id else None
    if type(v) is dict:
        items = {k: _as_inner_refs(x, by_id) for k, x in v.items()}
        return None if any(x is None for x in items.values()) else items
    if type(v) in (list, tuple):
        items = [_as_inner_refs(x, by_id) for x in v]
        return None if any(x is None for x in items) else type(v)(items)
    return None


def rebuild_inner_refs(p: "SubclassTensorProxy", structure: Any) -> Any:
    """:attr:`SubclassTensorProxy.inner_refs` ``structure`` with each :class:`InnerRef` replaced by ``p``'s inner
    proxy (defined in the trace where the code reads it)."""
    if isinstance(structure, InnerRef):
        p._define_inner_in_trace()
        return p.inner[structure.attr]
    if type(structure) is dict:
        return {k: rebuild_inner_refs(p, x) for k, x in structure.items()}
    return type(structure)(rebuild_inner_refs(p, x) for x in structure)


def _holds_tensors_or_sizes(v: Any) -> bool:
    # tensors, also inside containers (NestedTensor's _metadata_cache), and symbolic sizes (its _size and _strides
    # hold nested ints): state of the value that __tensor_unflatten__ rebuilds from the inner tensors, not attributes
    # to guard by value
    if isinstance(v, (torch.Tensor, torch.SymInt)):
        return True
    if isinstance(v, (tuple, list)):
        return any(_holds_tensors_or_sizes(x) for x in v)
    if isinstance(v, dict):
        return any(_holds_tensors_or_sizes(x) for x in v.values())
    return False


def _is_torch_bookkeeping(name: str) -> bool:
    # torch caches sizes/strides of "sizes"-policy subclasses in the instance __dict__ (_sym_sizes_capsule,
    # _sym_sizes_capsule_len, _sym_strides_capsule, ...): not attributes of the value
    return name.startswith(("_sym_sizes_capsule", "_sym_strides_capsule"))


@functools.cache
def _slot_names(cls: type) -> tuple[str, ...]:
    names = []
    for c in cls.__mro__:
        if c is torch.Tensor or c is torch._C.TensorBase or c is object:
            break
        slots = vars(c).get("__slots__", ())
        names.extend([slots] if isinstance(slots, str) else slots)
    return tuple(n for n in names if n not in ("__dict__", "__weakref__"))


def subclass_method(p: SubclassTensorProxy, attr: str) -> Callable | None:
    """A Python method the subclass defines itself (not a torch.Tensor method), bound to the proxy, so that the
    interpreter traces its body (``self.a`` there gives the inner proxy)."""
    if hasattr(torch.Tensor, attr):
        return None
    fn = getattr(p.subclass_type, attr, None)
    if isinstance(fn, types.FunctionType):
        return types.MethodType(fn, p)
    return None


# ---------------------------------------------------------------------------------------------------------------
# Kinds: what a recorded program depends on about a value (compile-time proxies and run-time tensors, side by side)
# ---------------------------------------------------------------------------------------------------------------


def ctx_key(ctx: Any) -> Any:
    """A flatten context as part of a hashable kind: itself when hashable (so equal contexts match even when their
    reprs differ, e.g. ``torch.Size([])`` and ``()``), else its repr."""
    try:
        hash(ctx)
        return ctx
    except TypeError:
        return repr(ctx)


def proxy_kind(p: Any) -> Any:
    """What a gradient's recorded backward depends on: plain tensor, or subclass type + context + inner kinds."""
    if isinstance(p, SubclassTensorProxy):
        return (p.subclass_type, ctx_key(p.flatten_ctx), tuple(proxy_kind(i) for i in p.inner.values()))
    if isinstance(p, TensorProxy):
        return torch.Tensor
    if isinstance(p, OpaqueObjectProxy):
        return type(p.value)
    return type(p)


def runtime_kind(t: Any) -> Any:
    """:func:`proxy_kind` of a real tensor."""
    if isinstance(t, torch.Tensor) and is_traceable_wrapper_subclass(t):
        attrs, ctx = t.__tensor_flatten__()
        return (type(t), ctx_key(ctx), tuple(runtime_kind(getattr(t, a)) for a in attrs))
    if isinstance(t, torch.Tensor):
        return torch.Tensor
    return type(t)


# ---------------------------------------------------------------------------------------------------------------
# flatten_<Cls>: the symbol that exposes a subclass proxy's inner tensors in a trace (unflatten_<Cls>, which builds
# one, is in thunder_subclass.frontend.subclass_symbols)
# ---------------------------------------------------------------------------------------------------------------

_flatten: dict[type, Symbol] = {}
flatten_ids: set[str] = set()  # ids of the flatten symbols (thunder_subclass.frontend.subclass_symbols adds its own)


def flatten_symbol(cls: type) -> Symbol:
    """``flatten_<Cls>(x, attrs)`` -> the inner tensors of ``x`` named by ``attrs`` (``getattr`` at run time)."""
    sym = _flatten.get(cls)
    if sym is None:

        def meta(x: SubclassTensorProxy, attrs: tuple[str, ...]):
            return tuple(x.inner[a] for a in attrs)

        getters: dict = {}

        def impl(x, attrs):  # runs every call: one attrgetter per attribute tuple
            getter = getters.get(attrs)
            if getter is None:
                getter = getters[attrs] = operator.attrgetter(*attrs) if len(attrs) > 1 else (
                    lambda t, a=attrs[0]: (getattr(t, a),)
                )
            return getter(x)

        sym = register_symbol(f"flatten_{cls.__name__}", meta=meta, fn=impl)
        _flatten[cls] = sym
        remember_symbol_origin(sym, impl, flatten_symbol, (cls,))
        flatten_ids.add(sym.id)
    return sym


def record_flatten(p: SubclassTensorProxy, scope: list) -> None:
    """Append ``flatten_<Cls>(p)`` to ``scope``, then the flattens of nested subclass inner tensors."""
    sym = flatten_symbol(p.subclass_type)
    scope.append(sym.bind(p, p.attr_names, output=tuple(p.inner.values())))
    for inner in p.inner.values():
        if isinstance(inner, SubclassTensorProxy):
            record_flatten(inner, scope)
