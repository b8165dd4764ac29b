"""Stage 4 (interpretation), subclasses that override only ``__torch_function__``: ``torch.Tensor`` subclasses that are
not wrapper subclasses (``t.as_subclass(C)``, ``C(t)``, ``torch.Tensor._make_subclass(C, t)``, a ``__new__`` calling
``super().__new__(cls, data)``). Such a value *is* a tensor with its own storage; only its Python type, its instance
attributes and its class's ``__torch_function__`` differ from a plain tensor.

In: such a value as an input, as the argument of a torch operation, made or read in traced code, or returned. What
happens: each case below. Out: plain symbols on a typed ``TensorProxy`` in the trace; instances of the class again
in the caller's hands.

In traces such a value is a plain ``TensorProxy`` *typed* with its class (:class:`TensorType`, kept on the proxy):
* an input is guarded on its exact type (``guards.check_tensor_type``) and, at run time, taken to a plain tensor at the
  top of the program (``untyped``), so that no ``__torch_function__`` runs inside the compiled program;
* a torch operation with a typed argument runs the class's ``__torch_function__`` as eager does, traced by thunder's
  interpreter (:func:`dispatch`): PyTorch's default implementation calls the operation with subclass handling
  disabled, which thunder records as plain symbols, then ``as_subclass`` types the results;
* ``as_subclass`` / ``_make_subclass`` / ``C(t)`` in traced code record ``typed`` (a plain alias of its argument
  at run time, identity for autodiff), reads of the class's methods, properties and instance attributes resolve as
  eager resolves them, and instance attributes set in traced code (in ``__init__``) are kept on the type;
* typed values that leave the compiled function become instances of their class again (``retyped``: ``as_subclass``
  plus the instance attributes) in thunder's epilogue, after the outputs are connected to autograd
  (:class:`TypedTensorEdges`, a thunder transform ``thunder_subclass.jit`` and the plugin add).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

import thunder.core.prims as prims
from thunder.core.interpreter import interpreter_needs_wrap, unwrap
from thunder.core.proxies import Proxy, TensorProxy, variableify
from thunder.core.pytree import tree_flatten, tree_map
from thunder.core.trace import TraceProvenance, from_trace
from thunder.core.transform_common import Transform

from thunder_subclass import _thunder_internals
from thunder_subclass.errors import UnsupportedSubclassOperationError, format_location
from thunder_subclass.executor import register_symbol
from thunder_subclass.guards import MISSING, add_tensor_type_guard, guard_tensor_type_attribute
from thunder_subclass.frontend.interpretation import INPLACE_VIEW_OPS, inplace_view_call, subclass_class_attribute
from thunder_subclass.frontend.proxy import PLAIN_TENSOR_TYPES, mark_leaf

__all__ = [
    "TensorType", "tensor_type", "is_torch_function_subclass", "is_torch_function_subclass_value", "has_typed_proxy",
    "has_typed_leaf",
    "proxify_typed_input", "dispatch", "lookaside", "TypedTensorEdges",
]

_TAG = "_thunder_subclass_tensor_type"
_INPUT_MARK = "_thunder_subclass_input"  # on the proxy of a typed input


class TensorType:
    """The Python type of a typed plain proxy: the class and the instance attributes (``vars(x)``) it has."""

    __slots__ = ("cls", "python_attrs", "written")

    def __init__(self, cls: type, python_attrs: dict | None = None):
        self.cls = cls
        self.python_attrs = dict(python_attrs or {})
        self.written: set[str] = set()  # attributes set by the traced code

    def __repr__(self) -> str:
        attrs = "" if not self.python_attrs else f", {self.python_attrs!r}"
        return f"TensorType({self.cls.__qualname__}{attrs})"


def is_torch_function_subclass(cls: type) -> bool:
    """A ``torch.Tensor`` subclass that is not a wrapper subclass, does not override ``__torch_dispatch__``, and is not
    ``nn.Parameter`` (which thunder treats as a plain tensor)."""
    if not (isinstance(cls, type) and issubclass(cls, torch.Tensor)) or cls in PLAIN_TENSOR_TYPES:
        return False
    from torch._subclasses.fake_tensor import FakeTensor

    if issubclass(cls, FakeTensor):
        return False
    return getattr(cls, "__torch_dispatch__", None) is getattr(torch.Tensor, "__torch_dispatch__", None)


def is_torch_function_subclass_value(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and is_torch_function_subclass(type(t)) and not is_traceable_wrapper_subclass(t)


def tensor_type(p: Any) -> TensorType | None:
    """The type recorded for proxy ``p`` (None: a plain tensor)."""
    return p.__dict__.get(_TAG) if isinstance(p, TensorProxy) else None


def _set_type(p: TensorProxy, typ: TensorType) -> TensorProxy:
    p.__dict__[_TAG] = typ
    return p


def has_typed_proxy(args, kwargs) -> bool:
    return has_typed_leaf(tree_flatten((args, kwargs))[0])


def has_typed_leaf(leaves) -> bool:
    """:func:`has_typed_proxy` of arguments already flattened to ``leaves``."""
    return any(tensor_type(a) is not None for a in leaves)


# ---------------------------------------------------------------------------------------------------------------
# Symbols
# ---------------------------------------------------------------------------------------------------------------


def _typed_meta(t, typ):
    return TensorProxy(like=t)


def _typed_impl(t, typ):
    return t.view_as(t)  # a plain alias: inside the compiled program values are plain tensors


def _identity_grad(sym):
    def grad(t, *args):
        from thunder.core.transforms import get_grad, put_grad

        out = sym(t, *args)
        put_grad(t, get_grad(out))  # as_subclass is an alias for autograd (AliasBackward)
        return out

    return grad


def _untyped_impl(t):
    return t.as_subclass(torch.Tensor)


def _retyped_impl(t, typ):
    with torch.enable_grad():  # thunder's epilogue runs under no_grad; as_subclass is a differentiable alias
        out = t.as_subclass(typ.cls)
    if typ.python_attrs:
        out.__dict__.update(typ.python_attrs)
    return out


typed = register_symbol("typed", meta=_typed_meta, fn=_typed_impl)


def _set_input_attribute_impl(x, name, value):
    setattr(x, name, value)


# DONT_DCE: no output; kept on the caller's object (not swapped for the plain alias by TypedTensorEdges)
set_input_attribute = register_symbol(
    "set_input_attribute", meta=lambda x, name, value: None, fn=_set_input_attribute_impl,
    tags=[prims.OpTags.DONT_DCE],
)
untyped = register_symbol("untyped", meta=lambda t: TensorProxy(like=t), fn=_untyped_impl)
retyped = register_symbol("retyped", meta=lambda t, typ: TensorProxy(like=t), fn=_retyped_impl)


def _register_identity_grads() -> None:
    from thunder.core.transforms import register_grad

    for sym in (typed, untyped):
        register_grad(sym, _identity_grad(sym))


_register_identity_grads()


def record_typed(t: TensorProxy, cls: type, python_attrs: dict | None = None, requires_grad: bool | None = None):
    """``t`` as an instance of ``cls`` in traced code: a new proxy (a plain alias at run time) typed ``cls``."""
    typ = TensorType(cls, python_attrs)
    out = typed(t, typ)
    if requires_grad is not None:
        out._requires_grad = requires_grad
    return _set_type(out, typ)


# ---------------------------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------------------------


def proxify_typed_input(jit_ctx, value, original):
    """The proxy of an input whose class only overrides ``__torch_function__``: thunder's plain proxy, typed, with a
    prologue check of the exact type (its instance attributes are checked when traced code reads them)."""
    t = value.value
    attrs = dict(getattr(t, "__dict__", {}))
    p = original(jit_ctx, value)
    if isinstance(p, TensorProxy):
        mark_leaf(p, t)
        _set_type(p, TensorType(type(t), attrs))
        p.__dict__[_INPUT_MARK] = True
        add_tensor_type_guard(jit_ctx, p, type(t))
    return p


# ---------------------------------------------------------------------------------------------------------------
# __torch_function__
# ---------------------------------------------------------------------------------------------------------------


def _overloaded_args(args, kwargs) -> list[TensorProxy]:
    """The arguments whose class's ``__torch_function__`` PyTorch would try, in its order: one per class,
    subclasses before their bases, otherwise left to right."""
    found: list[TensorProxy] = []
    for a in tree_flatten((args, kwargs))[0]:
        typ = tensor_type(a)
        if typ is None or _is_disabled(typ.cls) or any(tensor_type(f).cls is typ.cls for f in found):
            continue
        for i, other in enumerate(found):
            if issubclass(typ.cls, tensor_type(other).cls):
                found.insert(i, a)
                break
        else:
            found.append(a)
    return found


def _torch_function_of(arg: TensorProxy) -> Callable:
    """``arg.__torch_function__`` as PyTorch takes it: bound to the class for a classmethod, to the value for an
    instance method."""
    cls = tensor_type(arg).cls
    for c in cls.__mro__:
        raw = vars(c).get("__torch_function__")
        if raw is not None:
            break
    if isinstance(raw, (classmethod, staticmethod)) or not isinstance(raw, types.FunctionType):
        return cls.__torch_function__
    return types.MethodType(raw, arg)


def _is_disabled(cls: type) -> bool:
    return getattr(cls.__torch_function__, "__func__", cls.__torch_function__) is torch._C._disabled_torch_function_impl


_DEFAULT_TORCH_FUNCTION = torch.Tensor.__torch_function__.__func__


def dispatch(sym, args: tuple, kwargs: dict, torch_callable_for: Callable, denormalize: Callable):
    """``sym(*args, **kwargs)`` with typed arguments, reached without passing the torch API lookasides above (which
    know the callable the user called): as eager runs the operation, each overloaded class's
    ``__torch_function__`` (traced by thunder's interpreter; PyTorch's default one run by :func:`default_torch_function`)
    until one does not return ``NotImplemented``. Returns ``NOT_HANDLED`` when subclass handling is disabled (inside
    ``__torch_function__``) or every class has it disabled (``nn.Parameter``'s way), and outside thunder's
    interpretation of user code (later passes re-run symbols on the same proxies): the operation is then traced on
    the plain tensors."""
    if not torch._C._is_torch_function_enabled() or not _thunder_internals.is_interpreting():
        return _thunder_internals.NOT_HANDLED
    overloaded = _overloaded_args(args, kwargs)
    if not overloaded:
        return _thunder_internals.NOT_HANDLED
    targs, tkwargs = denormalize(sym, args, kwargs)
    return call_torch_function(torch_callable_for(sym, targs, tkwargs), overloaded, targs, tkwargs)


def call_torch_function(fn: Callable, overloaded: list[TensorProxy], args: tuple, kwargs: dict):
    """What ``torch.overrides.handle_torch_function`` does, for typed proxies (``overloaded``: the arguments whose
    classes' ``__torch_function__`` to try, from :func:`_overloaded_args`)."""
    types_ = tuple(tensor_type(a).cls for a in overloaded)
    for arg in overloaded:
        cls = tensor_type(arg).cls
        tf = _torch_function_of(arg)
        if getattr(tf, "__func__", None) is _DEFAULT_TORCH_FUNCTION:
            result = default_torch_function(cls, fn, types_, args, kwargs)
        else:
            result = _thunder_internals.interpret_native_call(tf, fn, types_, args, kwargs)
        if result is not NotImplemented:
            return result
    raise TypeError(
        f"no implementation found for {getattr(fn, '__qualname__', fn)} on types that implement __torch_function__: "
        f"{[c.__qualname__ for c in overloaded]}"
    )


def default_torch_function(cls, func, types_, args=(), kwargs=None):
    """``torch.Tensor.__torch_function__`` on proxies: the operation with subclass handling disabled, then tensor
    results typed ``cls`` (``as_subclass``) unless ``func`` is one of PyTorch's "no wrap" functions."""
    from torch.overrides import get_default_nowrap_functions

    kwargs = kwargs or {}
    if not all(issubclass(cls, t) for t in types_):
        return NotImplemented
    with torch._C.DisableTorchFunctionSubclass():
        ret = _call(func, args, kwargs)
    if func in get_default_nowrap_functions():
        return ret
    return tree_map(lambda r: _as_subclass(r, cls) if isinstance(r, TensorProxy) and tensor_type(r) is None else r, ret)


def _call(func, args: tuple, kwargs: dict):
    """``func(*args, **kwargs)`` on proxies: a tensor property read, a torch operation thunder traces as a symbol, or
    any other callable traced by thunder's interpreter."""
    prop = _is_tensor_property_getter(func)
    if prop is not None:
        if prop == "data":  # thunder's proxies have no .data: the same values, outside autograd
            return args[0].detach()
        return getattr(args[0], prop)
    name = getattr(func, "__name__", None)
    if name in INPLACE_VIEW_OPS and getattr(torch.Tensor, name, None) is func:
        return inplace_view_call(*args, **kwargs)
    operator_method = _tensor_operators_on_proxies().get(func) if _is_hashable(func) else None
    if operator_method is not None:
        return operator_method(*args, **kwargs)
    sym = _thunder_internals.torch_to_thunder_symbols().get(func) if _is_hashable(func) else None
    if sym is not None:
        return sym(*args, **kwargs)
    method = _tensor_base_method_name(func)
    if method is not None and args and isinstance(args[0], TensorProxy):  # Tensor.size(x), TensorBase.__mul__(x, y)
        return getattr(args[0], method)(*args[1:], **kwargs)
    return _thunder_internals.interpret_native_call(func, *args, **kwargs)


@functools.cache
def _torch_overrides_lookasides() -> dict:
    """torch's ``__torch_function__`` protocol functions (``torch.overrides``, ``torch._C``) for typed proxies."""
    import torch.overrides as overrides

    def has_torch_function(*args, **kwargs):
        return bool(_overloaded_args(args, kwargs)) and torch._C._is_torch_function_enabled()

    def handle_torch_function(public_api, relevant_args, *args, **kwargs):
        return call_torch_function(public_api, _overloaded_args(relevant_args, {}), args, kwargs)

    def skip_one_hop(func, types_, args, kwargs=None):  # torch.overrides.redispatch_function
        with torch._C.DisableTorchFunctionSubclass():
            return _call(func, tuple(args), kwargs or {})

    def disabled_torch_function(func, types_, args=(), kwargs=None):  # nn.Parameter's, or super() of a subclass of it
        with torch._C.DisableTorchFunction():
            return _call(func, tuple(args), kwargs or {})

    table = {
        overrides.has_torch_function: has_torch_function,
        overrides.has_torch_function_unary: has_torch_function,
        overrides.has_torch_function_variadic: has_torch_function,
        overrides.handle_torch_function: handle_torch_function,
        torch._C._disabled_torch_function_impl: disabled_torch_function,
    }
    # torch.overrides.redispatch_function's C helper exists from torch 2.12 on
    if hasattr(torch._C, "_skip_one_hop_torch_function"):
        table[torch._C._skip_one_hop_torch_function] = skip_one_hop
    return table


def _tensor_base_method_name(func) -> str | None:
    """The name of a method of ``torch._C.TensorBase`` (a C method or slot of the tensor type), else None."""
    if isinstance(func, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        if getattr(func, "__objclass__", None) is torch._C.TensorBase:
            return func.__name__
    return None


def _is_hashable(x) -> bool:
    try:
        hash(x)
        return True
    except TypeError:
        return False


# ---------------------------------------------------------------------------------------------------------------
# Interpreter lookasides: construction, as_subclass, attributes
# ---------------------------------------------------------------------------------------------------------------


@_thunder_internals.runs_natively
def _as_subclass(t, cls):
    if cls is torch.Tensor or cls in PLAIN_TENSOR_TYPES:
        return record_typed(t, torch.Tensor) if tensor_type(t) is None else _plain_alias(t)
    if not is_torch_function_subclass(cls):
        raise TypeError(f"as_subclass: {cls!r} is not a torch.Tensor subclass thunder_subclass can trace")
    return record_typed(t, cls)


def _plain_alias(t):
    out = typed(t, TensorType(torch.Tensor))
    return out


def _make_subclass(cls, data, require_grad=False, *args, **kwargs):
    return record_typed(data, cls, requires_grad=bool(require_grad))


def _construct(cls: type, *args, **kwargs):
    """``cls(*args, **kwargs)``: ``cls.__new__`` (PyTorch's: an alias of the tensor argument; or the class's own,
    traced) then ``cls.__init__`` (traced), as Python does."""
    new = cls.__new__
    if getattr(new, "__self__", None) is torch._C.TensorBase or new is torch._C.TensorBase.__new__:
        data = args[0] if args else kwargs.get("data")
        if not isinstance(data, TensorProxy):
            raise TypeError(f"{cls.__qualname__}(...) in compiled code needs a tensor as its first argument")
        obj = record_typed(data, cls)
    else:
        obj = _thunder_internals.interpret_native_call(new, cls, *args, **kwargs)
    if tensor_type(obj) is not None and isinstance(obj, TensorProxy):
        init = cls.__init__
        if isinstance(init, types.FunctionType):
            _thunder_internals.interpret_native_call(init, obj, *args, **kwargs)
    return obj


def _tensor_base_new(cls, *args, **kwargs):
    # torch.Tensor.__new__(cls, data) reached from a class's own __new__ (super().__new__(cls, data))
    data = args[0] if args else kwargs.get("data")
    if not isinstance(data, TensorProxy):
        raise TypeError(f"torch.Tensor.__new__({cls.__qualname__}, ...) in compiled code needs a tensor argument")
    return record_typed(data, cls)


def _attribute_lookaside(p: TensorProxy, typ: TensorType, name: str):
    if name == "__class__":
        return interpreter_needs_wrap(lambda obj, name, *default: typ.cls)
    if name == "as_subclass":
        return interpreter_needs_wrap(lambda obj, name, *default: functools.partial(_as_subclass, p))
    attr, found = subclass_class_attribute(typ.cls, name)
    if found and hasattr(type(attr), "__get__") and (hasattr(type(attr), "__set__") or hasattr(type(attr), "__delete__")):
        fget = getattr(attr, "fget", None)
        if fget is not None:
            return lambda obj, name, *default: _thunder_internals.interpret_call(fget, obj)
        return interpreter_needs_wrap(lambda obj, name, *default: attr.__get__(p, typ.cls))
    if name in typ.python_attrs:
        def read(obj, name, *default):
            if name not in typ.written:
                guard_tensor_type_attribute(p, name, typ.python_attrs[name])
            return typ.python_attrs[name]

        return interpreter_needs_wrap(read)
    if found and not name.startswith("__"):
        if isinstance(attr, types.FunctionType):
            return interpreter_needs_wrap(lambda obj, name, *default: types.MethodType(attr, p))
        if hasattr(type(attr), "__get__"):
            return interpreter_needs_wrap(lambda obj, name, *default: attr.__get__(p, typ.cls))
        return interpreter_needs_wrap(lambda obj, name, *default: attr)
    if not _thunder_internals.is_called_from_user_code():
        return None  # thunder's own interpreted helpers read tensor attributes of the plain proxy
    method = _tensor_method(name)
    if method is not None:
        return interpreter_needs_wrap(lambda obj, name, *default: functools.partial(torch_api_call, method, p))
    getter = _tensor_property_getter(name)
    if getter is not None and not _is_disabled(typ.cls):
        # eager passes tensor property reads (x.ndim, x.T) through __torch_function__ too
        def read_property(obj, name, *default):
            return call_torch_function(getter, [p], (p,), {})

        return interpreter_needs_wrap(read_property)
    if not name.startswith("__") and not hasattr(torch.Tensor, name):
        # an attribute the value does not have (hasattr(x, "cache") in user code): its absence is guarded
        def missing(obj, name, *default):
            if name not in typ.written:
                guard_tensor_type_attribute(p, name, MISSING)
            if default:
                return default[0]
            return _thunder_internals.raise_in_interpreter(
                AttributeError(f"'{typ.cls.__name__}' object has no attribute '{name}'"))

        return interpreter_needs_wrap(missing)
    return None


@functools.cache
def _tensor_method(name: str) -> Callable | None:
    """``torch.Tensor.<name>`` when it is a method (eager passes it to ``__torch_function__``), else None."""
    attr = getattr(torch.Tensor, name, None)
    if attr is None or isinstance(attr, (property, types.GetSetDescriptorType, types.MemberDescriptorType)):
        return None
    return attr if callable(attr) and not isinstance(attr, type) else None


@functools.cache
def _proxy_operators() -> dict:
    """``TensorProxy.__mul__`` -> ``torch.Tensor.__mul__``, ...: thunder's interpreter runs ``x * y`` as the proxy's
    operator method; eager passes the tensor's to ``__torch_function__``."""
    table = {}
    for name, fn in vars(TensorProxy).items():
        if name.startswith("__") and name.endswith("__") and callable(fn) and hasattr(torch.Tensor, name):
            if name in ("__init__", "__new__", "__getattr__", "__setattr__", "__repr__", "__hash__", "__eq__",
                        "__class__", "__init_subclass__", "__getattribute__", "__dir__", "__reduce_ex__", "__format__"):
                continue
            table[fn] = getattr(torch.Tensor, name)
    return table


@functools.cache
def _tensor_operators_on_proxies() -> dict:
    return {tensor_op: proxy_op for proxy_op, tensor_op in _proxy_operators().items()}


@_thunder_internals.runs_natively
def torch_api_call(func: Callable, *args, **kwargs):
    """A torch API call (a function, a tensor method or operator) with typed arguments, as eager makes it: through
    the classes' ``__torch_function__`` when subclass handling is enabled, else on the plain tensors."""
    overloaded = _overloaded_args(args, kwargs)
    if overloaded and torch._C._is_torch_function_enabled():
        return call_torch_function(func, overloaded, args, kwargs)
    return _call(func, args, kwargs)


@functools.cache
def _tensor_property_getter(name: str) -> Callable | None:
    """``torch.Tensor.<name>.__get__`` for a C-level tensor property (``ndim``, ``shape``, ``T``, ...), else None."""
    descriptor = vars(torch._C.TensorBase).get(name)
    if isinstance(descriptor, (types.GetSetDescriptorType, types.MemberDescriptorType)):
        return descriptor.__get__
    return None


def _is_tensor_property_getter(fn: Any) -> str | None:
    self = getattr(fn, "__self__", None)
    if isinstance(self, (types.GetSetDescriptorType, types.MemberDescriptorType)) and self.__objclass__ is torch._C.TensorBase:
        if getattr(fn, "__name__", None) == "__get__":
            return self.__name__
    return None


class ProxySuper:
    """``super()`` inside a method of a subclass, where ``self`` is a proxy: attributes resolve along the class's MRO
    after ``cls`` as Python's ``super`` does; ``torch.Tensor``'s methods run as a torch API call on the proxy."""

    def __init__(self, cls: type, p: TensorProxy):
        self.cls, self.p = cls, p

    def __getattr__(self, name: str):
        mro = self.cls.__mro__
        owner_type = tensor_type(self.p).cls if tensor_type(self.p) is not None else getattr(self.p, "subclass_type", None)
        mro = owner_type.__mro__ if owner_type is not None else mro
        start = mro.index(self.cls) + 1 if self.cls in mro else 0
        for c in mro[start:]:
            if c is torch.Tensor or c is torch._C.TensorBase or c is object:
                break
            if name in vars(c):
                attr = vars(c)[name]
                if isinstance(attr, types.FunctionType):
                    return types.MethodType(attr, self.p)
                if isinstance(attr, property) and attr.fget is not None:
                    return attr.fget(self.p)
                return attr.__get__(self.p, owner_type) if hasattr(type(attr), "__get__") else attr
        method = _tensor_method(name)
        if method is not None and tensor_type(self.p) is not None:
            return functools.partial(torch_api_call, method, self.p)
        return getattr(self.p, name)


def _setattr(p: TensorProxy, name: str, value: Any):
    typ = tensor_type(p)
    if isinstance(value, TensorProxy) or isinstance(value, torch.Tensor):
        raise UnsupportedSubclassOperationError(
            f"setting the tensor attribute {name!r} on a {typ.cls.__qualname__} at {format_location(*_thunder_internals.source_location())} "
            "is not supported inside compiled code: thunder_subclass keeps only non-tensor attributes with a value's "
            "type. Keep the tensor in a variable, or set the attribute outside the compiled function."
        )
    if p.__dict__.get(_INPUT_MARK):
        # eager sets it on the caller's object: so does the compiled program, at the end of every call
        set_input_attribute(p, name, value)
    typ.python_attrs[name] = value
    typ.written.add(name)
    return None


def lookaside(fn: Any, wrapped_args: tuple) -> Callable | None:
    """A lookaside for ``fn`` involving typed values or non-wrapper subclass classes, else None."""
    if fn is getattr and len(wrapped_args) in (2, 3):
        obj, name = unwrap(wrapped_args[0]), unwrap(wrapped_args[1])
        if isinstance(obj, ProxySuper):
            return interpreter_needs_wrap(lambda o, n, *d: getattr(o, n))
        if isinstance(obj, TensorProxy) and isinstance(name, str):
            typ = tensor_type(obj)
            if typ is not None:
                return _attribute_lookaside(obj, typ, name)
            if name == "as_subclass":
                return interpreter_needs_wrap(lambda o, n, *d: functools.partial(_as_subclass, obj))
        return None
    if fn is iter and len(wrapped_args) == 1:
        obj = unwrap(wrapped_args[0])
        typ = tensor_type(obj) if isinstance(obj, TensorProxy) else None
        if typ is not None and typ.cls is not torch.Tensor:
            # eager's Tensor.__iter__ is iter(self.unbind(0)) through __torch_function__: the elements keep the type
            return interpreter_needs_wrap(lambda o: iter(torch_api_call(torch.Tensor.unbind, o, 0)))
        return None
    if fn is super:
        cls, obj = _thunder_internals.super_arguments(wrapped_args)
        if isinstance(obj, TensorProxy) and isinstance(cls, type) and issubclass(cls, torch.Tensor):
            return interpreter_needs_wrap(lambda *a: ProxySuper(cls, obj))
        return None
    if fn is setattr and len(wrapped_args) == 3:
        obj = unwrap(wrapped_args[0])
        if isinstance(obj, TensorProxy) and tensor_type(obj) is not None:
            return interpreter_needs_wrap(_setattr)
        return None
    if fn is isinstance and len(wrapped_args) == 2:
        obj = unwrap(wrapped_args[0])
        typ = tensor_type(obj)
        # user code only: thunder's own interpreted helpers (binary operators) call type() on proxies
        if typ is not None and typ.cls is not torch.Tensor and _thunder_internals.is_called_from_user_code():
            return interpreter_needs_wrap(lambda o, c: isinstance(_stand_in(typ), c))
        return None
    if fn is type and len(wrapped_args) == 1:
        typ = tensor_type(unwrap(wrapped_args[0]))
        if typ is not None and typ.cls is not torch.Tensor and _thunder_internals.is_called_from_user_code():
            return interpreter_needs_wrap(lambda o: typ.cls)
        return None
    if fn is _DEFAULT_TORCH_FUNCTION:  # super().__torch_function__(...) in a class's own __torch_function__
        return interpreter_needs_wrap(default_torch_function)
    hashable = _is_hashable(fn)
    override = _torch_overrides_lookasides().get(fn) if hashable else None
    if override is not None:
        uargs = [unwrap(a) for a in wrapped_args]
        if has_typed_proxy(uargs, {}):
            return interpreter_needs_wrap(override)
    if _tensor_base_method_name(fn) is not None and wrapped_args and isinstance(unwrap(wrapped_args[0]), TensorProxy):
        # torch.Tensor.size(x) or TensorBase.__mul__(x, y) called as functions (redispatching __torch_function__s)
        return interpreter_needs_wrap(functools.partial(torch_api_call, fn))
    if hashable and (fn in _proxy_operators() or fn in _thunder_internals.torch_to_thunder_symbols()):
        uargs = [unwrap(a) for a in wrapped_args]
        if any(_is_non_tensor_overload(a) for a in tree_flatten(uargs)[0]):
            return interpreter_needs_wrap(functools.partial(_call_non_tensor_torch_function, fn))
        if has_typed_proxy(uargs, {}):
            func = _proxy_operators().get(fn, fn)
            return interpreter_needs_wrap(functools.partial(torch_api_call, func))
    if fn is torch.Tensor._make_subclass:
        return interpreter_needs_wrap(_make_subclass)
    if fn is torch._C.TensorBase.__new__ and wrapped_args and is_torch_function_subclass(unwrap(wrapped_args[0])):
        return interpreter_needs_wrap(_tensor_base_new)
    if isinstance(fn, type) and is_torch_function_subclass(fn):
        if any(isinstance(a, TensorProxy) for a in tree_flatten([unwrap(a) for a in wrapped_args])[0]):
            return interpreter_needs_wrap(functools.partial(_construct, fn))
    return None


def _is_non_tensor_overload(x: Any) -> bool:
    """An object that is not a tensor but whose class defines ``__torch_function__`` (a wrapper class: torch's
    functions call its ``__torch_function__`` instead of running)."""
    return (not isinstance(x, (torch.Tensor, Proxy)) and not isinstance(x, type)
            and getattr(type(x), "__torch_function__", None) is not None)


def _call_non_tensor_torch_function(func: Callable, *args, **kwargs):
    """``func(*args, **kwargs)`` where arguments are non-tensor objects with ``__torch_function__``: as
    ``torch.overrides.handle_torch_function`` does, each such class's ``__torch_function__`` (traced) in argument
    order, one per class, until one does not return ``NotImplemented``."""
    overloaded: list = []
    for a in tree_flatten((args, kwargs))[0]:
        if _is_non_tensor_overload(a) and all(type(o) is not type(a) for o in overloaded):
            overloaded.append(a)
    types_ = tuple(type(o) for o in overloaded)
    for o in overloaded:
        result = _thunder_internals.interpret_native_call(o.__torch_function__, func, types_, args, kwargs)
        if result is not NotImplemented:
            return result
    raise TypeError(
        f"no implementation found for {getattr(func, '__qualname__', func)} on types that implement "
        f"__torch_function__: {[c.__qualname__ for c in types_]}"
    )


def _stand_in(typ: TensorType) -> torch.Tensor:
    """An empty instance of the class with the instance attributes, for ``isinstance`` as eager answers it (metaclass
    checks included: ``nn.Parameter``'s looks at ``_is_param``)."""
    t = torch.empty(0).as_subclass(typ.cls)
    t.__dict__.update(typ.python_attrs)
    return t


# ---------------------------------------------------------------------------------------------------------------
# The edges of the compiled program
# ---------------------------------------------------------------------------------------------------------------


class TypedTensorEdges(Transform):
    """Typed inputs become plain tensors at the top of the computation (``untyped``); typed values the function
    returns become instances of their class again in the epilogue (``retyped``), which thunder runs after connecting
    the outputs to autograd, so the retyped alias is differentiable as ``as_subclass`` is in eager. Inside, every value
    is a plain tensor. Traces without typed values are returned unchanged."""

    def transform_traces_pre_prologue(self, prologue_trace, computation_trace, epilogue_trace, **kwargs):
        from thunder_subclass.guards import check_tensor_type

        # typed inputs: those the prologue checks the type of (the computation's arguments of the same names)
        checked = {b.args[0].name: b.args[1].cls for b in prologue_trace.bound_symbols if b.sym.id == check_tensor_type.id}
        inputs = [a for a in tree_flatten((computation_trace.args, computation_trace.kwargs))[0]
                  if isinstance(a, TensorProxy) and a.name in checked]
        returned: dict[str, TensorType] = {}
        for b in computation_trace.bound_symbols:
            if b.sym.id == typed.id and b.args[1].cls is not torch.Tensor:
                returned[b.output.name] = b.args[1]
        if not inputs and not returned:
            return prologue_trace, computation_trace, epilogue_trace
        return prologue_trace, _untype_inputs(computation_trace, inputs), _retype_outputs(epilogue_trace, returned)


def _untype_inputs(trace, inputs: list):
    if not inputs:
        return trace
    from thunder.core.trace import tracectx

    new = from_trace(trace)
    pending = {a.name: a for a in inputs}
    swap: dict = {}
    bsyms: list = []
    ret = trace.bound_symbols[-1]
    with tracectx(new):
        for b in trace.bound_symbols[:-1]:
            keep = not swap or b.sym.id == set_input_attribute.id  # sets the attribute on the caller's object
            bsyms.append(b if keep else b.from_bsym_swap_proxies(swap))
            for o in b.flat_proxy_outs:  # right after the symbol that unpacks the input
                a = pending.pop(o.name, None)
                if a is not None:
                    new.bound_symbols = []
                    plain = untyped(a)
                    bsyms.extend(new.bound_symbols)
                    swap[variableify(a)] = plain
    # an input returned as it is stays the caller's object
    new.bound_symbols = [*bsyms, ret]
    new.set_provenance(TraceProvenance("Typed inputs as plain tensors (thunder_subclass)"))
    return new


def _retype_outputs(epilogue, returned: dict):
    if epilogue is None or not returned:
        return epilogue
    from thunder.core.trace import tracectx

    args = {a.name: a for a in tree_flatten((epilogue.args, epilogue.kwargs))[0] if isinstance(a, TensorProxy)}
    targets = {name: typ for name, typ in returned.items() if name in args}
    if not targets:
        return epilogue
    new = from_trace(epilogue)
    swap: dict = {}
    with tracectx(new):
        for name, typ in targets.items():
            swap[variableify(args[name])] = retyped(args[name], typ)
    new.bound_symbols = [*new.bound_symbols, *(b.from_bsym_swap_proxies(swap) for b in epilogue.bound_symbols)]
    new.set_provenance(TraceProvenance("Typed outputs rebuilt (thunder_subclass)"))
    return new
