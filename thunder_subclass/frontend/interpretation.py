"""Stage 4 (interpretation), interpretation-time unrolling of ``__torch_dispatch__``.

In: a torch-level thunder symbol (``ltorch.mul``, ``ltorch.linear``, ...) called during ``thunder.jit``'s
interpretation with at least one ``SubclassTensorProxy`` argument (from ``torch.mul(x)``, ``x.mul()`` or
``x * y`` alike); or a call of a wrapper-subclass class (construction inside traced code); or ``isinstance``,
``type`` and attribute reads on subclass proxies in user code.

What happens: the torch operation runs once on *fake* subclass instances under the recorder of
``thunder_subclass.frontend.recording`` (inner fakes made from the inner proxies' metadata, rebuilt with
``__tensor_unflatten__``; the aten calls the subclass's dispatch makes on plain inner tensors are recorded).

Out: ONE bound symbol for the torch-level operation whose outputs carry the true result metadata (subclass or plain,
type, dtype, shape: user code that branches on them behaves as eager) and whose subsymbols are
``flatten_<Cls>`` of the subclass inputs -> aten-level symbols -> ``unflatten_<Cls>`` of subclass outputs.
Errors raised inside dispatch surface here as :class:`SubclassDispatchError` naming the subclass, the op and the
user's source line.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass_type

import thunder.core.dtypes as dtypes
import thunder.core.prims as prims
from thunder.core.interpreter import interpreter_needs_wrap, unwrap
from thunder.core.proxies import NumberProxy, TensorProxy
from thunder.core.pytree import tree_flatten
from thunder.core.symbol import Symbol
from thunder.core.trace import get_tracectx

from thunder_subclass._thunder_internals import (
    RaggedSymbolicSize,
    call_in_epilogue,
    checkpoint_scopes,
    input_attribute,
    interpret_call,
    jit_state,
    is_called_from_user_code,
    is_nested_int,
    raise_in_interpreter,
    is_interpreting,
    rebind_wrapped_value,
    runs_natively,
    source_location,
    SymbolicSizeError,
)
from thunder_subclass.errors import UnsupportedSubclassOperationError, UnsupportedTracingError, format_location
from thunder_subclass.executor import register_symbol
from thunder_subclass.frontend.fake import FakeEnv, stride_of
from thunder_subclass.guards import guard_buffer_flag, guard_python_attribute
from thunder_subclass.frontend.proxy import SubclassTensorProxy, is_marked_leaf, rebuild_inner_refs
from thunder_subclass.frontend.symbolic_strides import StrideUnknown, symbolic_strides
from thunder_subclass.frontend.recording import (
    bind_unrolled,
    denormalize,
    is_traced_grad_enabled,
    op_name,
    record_call,
    record_call_shared,
    subclass_names,
    torch_callable_for,
)

__all__ = ["unroll_symbol_call", "construct_subclass", "subclass_lookaside", "inplace_view_call"]


def unroll_symbol_call(sym: Symbol, args: tuple, kwargs: dict):
    """Record ``sym(*args, **kwargs)`` (some args are subclass proxies) as one bound symbol with unrolled
    subsymbols, and return its outputs (called from the ``Symbol.__call__`` hook)."""
    targs, tkwargs = denormalize(sym, args, kwargs)
    fn = torch_callable_for(sym, targs, tkwargs)
    subsymbols: list = []
    result = record_call_shared(fn, targs, tkwargs, subsymbols, op_name(fn), subclass_names(args, kwargs))
    return bind_unrolled(sym, args, kwargs, result, subsymbols)


def set_requires_grad_as_eager(sym: Symbol, args: tuple, kwargs: dict, result: Any) -> None:
    """thunder's proxies of intermediate values do not say whether eager's tensor would require grad (``(w * 2)``
    reads ``requires_grad=False`` in traced code; fakes made from it would too, so a subclass built from it would not
    match eager's). While interpreting user code, a torch-level symbol's tensor results require grad as autograd
    decides: grad mode on, a tensor argument that requires grad, a floating-point result, not ``detach``."""
    # user code's own calls (also inside a checkpointed region, whose scope thunder opens), not those inside a symbol
    if not is_interpreting() or len(get_tracectx().scopes) - checkpoint_scopes() > 1:
        return  # (in particular not the aten calls recorded below a subclass's dispatch: inner tensors don't require grad)
    if sym.name == "detach" or not is_traced_grad_enabled():
        return
    if not any(isinstance(a, TensorProxy) and a.requires_grad for a in tree_flatten((args, kwargs))[0]):
        return
    for out in tree_flatten(result)[0]:
        if isinstance(out, TensorProxy) and not out.requires_grad and dtypes.is_inexact_dtype(out.dtype):
            out._requires_grad = True


def construct_subclass(cls: type, *args, **kwargs):
    """``cls(*args, **kwargs)`` in traced code: record the aten calls the constructor makes and the unflatten
    that builds the subclass proxy, directly in the current scope."""
    scope = get_tracectx().peek_scope()
    _, _, result = record_call(cls, args, kwargs, scope, f"{cls.__qualname__}(...)", cls.__qualname__)
    return result


# ---------------------------------------------------------------------------------------------------------------
# Interpreter lookasides (called from the general_jit_lookaside hook)
# ---------------------------------------------------------------------------------------------------------------


def _stand_in(p: SubclassTensorProxy) -> torch.Tensor:
    """A fake instance of ``p``'s subclass with its instance attributes, for questions eager asks of the object
    itself (``isinstance`` through metaclass checks: ``nn.Parameter``'s looks at ``_is_param``)."""
    fake = p.__dict__.get("_thunder_subclass_stand_in")
    if fake is None:
        fake = p.__dict__["_thunder_subclass_stand_in"] = FakeEnv(pin=False).to_fake(p)  # (types, attributes)
    return fake


def _isinstance(obj, cls):
    if isinstance(obj, SubclassTensorProxy):
        if "_is_param" in obj.python_attrs:
            guard_python_attribute(obj, "_is_param")
        return isinstance(_stand_in(obj), cls)
    return isinstance(obj, cls)


def _torch_dtype_attr(obj, name, *default):
    return dtypes.to_torch_dtype(obj.dtype)


def _torch_shape_attr(obj, name, *default):
    # a subclass's ragged dims as it reports them: nested ints (torch.Size([3, j1, 5]) of a jagged NestedTensor)
    shape = obj.outer_size if isinstance(obj, SubclassTensorProxy) else obj.shape
    if all(type(s) is int or is_nested_int(s) for s in shape):
        return torch.Size(shape)
    # symbolic sizes stay thunder's; a jagged NestedTensor's, returned, become the torch.Size eager returns
    return RaggedSymbolicSize(shape) if isinstance(obj, SubclassTensorProxy) and obj.nested_sizes else shape


def _torch_device_attr(obj, name, *default):
    import thunder.core.devices as devices

    return devices.to_torch_device(obj.device)


@runs_natively
def _plain_stride(p: TensorProxy, dim: int | None = None):
    """``x.stride()`` / ``x.stride(dim)`` of a plain tensor proxy (thunder 0.2.6's proxies have no ``stride``:
    "Unknown attribute stride"): eager's strides as the plugin knows them for fakes (``fake.stride_of``: an input's
    own, checked by the prologue once read; a computed value's from its producing operations run on fakes)."""
    if not all(type(s) is int for s in p._shape):  # symbolic sizes: numbers computed from them
        try:
            stride = symbolic_strides(p)
        except (StrideUnknown, SymbolicSizeError) as e:
            raise UnsupportedTracingError(
                f"x.stride() at {format_location(*source_location())} of a tensor with symbolic sizes "
                f"(cache=\"symbolic values\") whose strides cannot be computed from its sizes: {e}. Use "
                f"dynamic=False (cache=\"constant values\") for code that reads these strides, or compute what you "
                f"need from x.shape."
            ) from e
    else:
        stride = stride_of(p)
    if dim is None:
        return stride
    n = max(len(stride), 1)  # as torch: a 0-dim tensor takes dim 0 and -1
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return stride[dim] if stride else 1


def _plain_stride_attr(obj, name, *default):
    return functools.partial(_plain_stride, obj)


_TORCH_TYPED_ATTRIBUTES = {"dtype": _torch_dtype_attr, "shape": _torch_shape_attr, "device": _torch_device_attr}
# attributes thunder's plain tensor proxies lack, answered for plain proxies only (subclass proxies run the method on
# fakes of the subclass)
_PLAIN_TENSOR_ATTRIBUTES = {"stride": _plain_stride_attr}

# tensor properties thunder 0.2.6's proxies do not answer (it resolves ``is_nested`` as a method: "'getset_descriptor'
# object is not callable"): for a subclass proxy, the answer of a fake instance of it, as eager's object gives
STAND_IN_PROPERTIES = ("is_nested", "layout", "is_sparse", "is_quantized", "is_mkldnn")


def _type(obj):
    return obj.subclass_type if isinstance(obj, SubclassTensorProxy) else type(obj)


def subclass_class_attribute(cls: type, name: str) -> tuple[Any, bool]:
    """``name`` as defined by the subclass's own Python classes (those before ``torch.Tensor`` in its MRO)."""
    for c in cls.__mro__:
        if c is torch.Tensor or c is torch._C.TensorBase or c is object:
            break
        if name in vars(c):
            return vars(c)[name], True
    return None, False


def _is_data_descriptor(v: Any) -> bool:
    t = type(v)
    return hasattr(t, "__get__") and (hasattr(t, "__set__") or hasattr(t, "__delete__"))


def attribute_lookaside(p: SubclassTensorProxy, name: str) -> Callable | None:
    """``p.<name>`` resolved as eager resolves it on the subclass instance, when the subclass (not ``torch.Tensor``)
    defines it: data descriptors of the subclass's classes (properties, interpreted with the proxy as ``self``), then
    the instance's attributes (inner tensors: their proxies; other instance attributes: their values, guarded),
    then the subclass's methods and other class attributes. None for ``torch.Tensor``'s own attributes, which
    thunder's tensor proxies implement."""
    if name == "__class__":
        return interpreter_needs_wrap(lambda obj, name, *default: p.subclass_type)
    if name in STAND_IN_PROPERTIES:
        return interpreter_needs_wrap(lambda obj, name, *default: getattr(_stand_in(p), name))
    if name == "size" and p.nested_sizes:  # the sizes as the subclass reports them, nested ints at ragged dims
        return interpreter_needs_wrap(lambda obj, name, *default: functools.partial(_outer_size, p))
    class_attr, found = subclass_class_attribute(p.subclass_type, name)
    if found and isinstance(class_attr, types.MemberDescriptorType):  # a __slots__ attribute: the instance's value
        if name in p.inner:
            return _inner_lookaside
        if name not in p.python_attrs:  # not captured from the value (DTensor's _spec): from __tensor_unflatten__
            return interpreter_needs_wrap(lambda obj, name, *default: _read_slot(p, class_attr))
        found = False
    if found and _is_data_descriptor(class_attr):
        fget = getattr(class_attr, "fget", None)
        if fget is None:
            return interpreter_needs_wrap(lambda obj, name, *default: class_attr.__get__(p, p.subclass_type))
        return lambda obj, name, *default: interpret_call(fget, obj)
    if name in p.inner:
        return _inner_lookaside
    if name in p.python_attrs:
        return interpreter_needs_wrap(_read_python_attribute)
    if name in p.inner_refs:  # a container of inner tensors (NestedTensor's _metadata_cache)
        return interpreter_needs_wrap(lambda obj, name, *default: rebuild_inner_refs(p, p.inner_refs[name]))
    if found and not name.startswith("__"):
        if isinstance(class_attr, types.FunctionType):
            return interpreter_needs_wrap(lambda obj, name, *default: types.MethodType(class_attr, p))
        if hasattr(type(class_attr), "__get__"):  # classmethod, staticmethod, other non-data descriptors
            return interpreter_needs_wrap(lambda obj, name, *default: class_attr.__get__(p, p.subclass_type))
        return interpreter_needs_wrap(lambda obj, name, *default: class_attr)
    return None


def is_answered_from_metadata(p: SubclassTensorProxy, name: str) -> bool:
    """Whether :func:`attribute_lookaside` answers ``p.<name>`` from the proxy's metadata (not by running the torch
    method on fakes): tensor properties thunder's proxies lack, and ``size`` of a subclass with ragged sizes."""
    return name in STAND_IN_PROPERTIES or (name == "size" and bool(p.nested_sizes))


@runs_natively  # (the interpreter answers isinstance(<symbolic int>, NumberProxy) as eager would: False)
def _outer_size(p: SubclassTensorProxy, dim: int | None = None):
    if any(isinstance(d, NumberProxy) for d in p.outer_size):  # symbolic sizes (frontend.jagged): as thunder's size()
        import thunder.core.prims as prims

        shape = prims.shape(p)  # the trace reads the number proxies (recorded, as thunder's own size() does)
        size = RaggedSymbolicSize(p.nested_sizes.get(i, s) for i, s in enumerate(shape))
        return size if dim is None else size[dim]
    size = torch.Size(p.outer_size)
    return size if dim is None else size[dim]


def check_no_nested_int(sym: Symbol, leaves: list) -> None:
    """A nested int (the ragged size of a jagged NestedTensor, ``x.shape[1]``) passed to a torch operation as a
    number (one of ``leaves``, the operation's flattened arguments): thunder's traces cannot hold one. Raises
    :class:`UnsupportedSubclassOperationError` naming it."""
    for a in leaves:
        if is_nested_int(a):
            raise UnsupportedSubclassOperationError(
                f"{sym.name} at {format_location(*source_location())} received {a}, the ragged size of a jagged "
                f"NestedTensor (a nested int, not a number), as an argument. thunder_subclass cannot put a ragged "
                f"size in a trace (eager torch rejects it too where a concrete size is needed). Use sizes of the "
                f"NestedTensor's values() or its offsets() instead, or keep this computation outside the compiled "
                f"function."
            )


# storage facts a fake run cannot know (a fake's storage offset is 0 and its data pointer is not the tensor's): run on
# fakes, the stand-in's answer would be put in the trace as a constant
STORAGE_QUERIES = frozenset({"storage_offset", "data_ptr", "untyped_storage", "storage"})


def storage_query_error(name: str) -> UnsupportedTracingError:
    """The typed error for ``x.<name>()`` (one of :data:`STORAGE_QUERIES`) of a tensor in traced code, naming the
    line."""
    return UnsupportedTracingError(
        f"x.{name}() at {format_location(*source_location())}: thunder_subclass does not track tensor storages while "
        f"tracing (the answer would be that of a stand-in tensor, not of your tensor). Read it outside the compiled "
        f"function, or compute what you need from x.shape and x.stride()."
    )


def _read_slot(p: SubclassTensorProxy, slot: types.MemberDescriptorType) -> Any:
    """A ``__slots__`` attribute that is not an inner tensor, read from a stand-in rebuilt by ``__tensor_unflatten__``
    (DTensor's ``_spec``: placements and tensor metadata from the flatten context, which the prologue guards, and the
    mesh). As torch.compile sees it: what ``__tensor_unflatten__`` does not restore is not part of the subclass."""
    value = slot.__get__(_stand_in(p), p.subclass_type)
    if any(isinstance(v, torch.Tensor) for v in tree_flatten(value)[0]):
        raise UnsupportedSubclassOperationError(
            f"{p.subclass_type.__qualname__}.{slot.__name__} read at {format_location(*source_location())} holds "
            f"tensors but is not listed by __tensor_flatten__; thunder_subclass cannot trace it."
        )
    return value


def _inner_lookaside(wrapped_p, wrapped_name, *default):
    """``x.<inner>`` in traced code. Where ``x`` is an input and that inner tensor requires grad, eager code using
    ``x.a`` differentiates to the caller's ``a`` itself (``a.grad``, or through ``a``'s own history), apart from
    what reaches ``x``: the read is then an input of its own (the prologue unpacks ``x.a`` and passes it to the
    compiled function, so thunder's autograd Function returns its gradient), as torch.compile makes it a graph input.
    Otherwise the inner proxy (flattened from ``x``)."""
    p, name = unwrap(wrapped_p), unwrap(wrapped_name)
    inner = p.inner.get(name)
    if isinstance(inner, TensorProxy) and inner.requires_grad and is_traced_grad_enabled():
        wrapped = input_attribute(wrapped_p, name)
        if wrapped is not None:
            return wrapped
    return interpreter_needs_wrap(_read_inner)(wrapped_p, wrapped_name, *default)


def _read_inner(p: SubclassTensorProxy, name: str, *default):
    # the inner proxies are defined in the trace where user code reads them (p._define_inner_in_trace)
    inner = p.inner.get(name)
    if isinstance(inner, TensorProxy) and inner.requires_grad and is_marked_leaf(p) and is_traced_grad_enabled():
        # eager: x.a IS the caller's autograd leaf, so code using it differentiates to it (a.grad); an input the
        # prologue cannot reach (_inner_lookaside) has no way to hand its gradient back
        raise UnsupportedSubclassOperationError(
            f"{p.subclass_type.__qualname__} input: reading its inner tensor .{name} at "
            f"{format_location(*source_location())}, an autograd leaf that requires grad. Eager would differentiate "
            f"with respect to that inner tensor itself; thunder_subclass differentiates with respect to the "
            f"{p.subclass_type.__qualname__} argument only, so the gradient for .{name} would be lost. Build the "
            f"subclass from tensors that do not require grad and call .requires_grad_() on it, read .{name} outside "
            f"the compiled function (pass it as an argument), or run under torch.no_grad()."
        )
    return getattr(p, name)


def _read_python_attribute(p: SubclassTensorProxy, name: str, *default):
    guard_python_attribute(p, name)
    return p.python_attrs[name]


def subclass_lookaside(fn: Any, wrapped_args: tuple) -> Callable | None:
    """A lookaside for ``fn`` when it involves subclasses, else ``None`` (thunder's own lookaside applies)."""
    if isinstance(fn, InplaceViewMethod):
        return fn.call
    if fn is isinstance and len(wrapped_args) == 2 and unwrap(wrapped_args[1]) is torch.nn.Buffer:
        p = unwrap(wrapped_args[0])
        if type(p) is TensorProxy:
            # torch.nn.Buffer's metaclass answers from the tensor's _is_buffer flag, which proxies do not carry
            # (plain thunder takes the wrong branch): the input's flag, guarded; computed tensors have none
            real = getattr(wrapped_args[0], "original_value", None)
            flag = bool(getattr(real, "_is_buffer", False)) if isinstance(real, torch.Tensor) else False
            if isinstance(real, torch.Tensor):
                guard_buffer_flag(p, flag)
            return interpreter_needs_wrap(lambda obj, cls: flag)
        return None
    if fn is isinstance or fn is type:
        if (
            len(wrapped_args) >= 1
            and isinstance(unwrap(wrapped_args[0]), SubclassTensorProxy)
            and is_called_from_user_code()
        ):
            return interpreter_needs_wrap(_isinstance if fn is isinstance else _type)
        return None
    if fn is getattr and len(wrapped_args) in (2, 3):
        obj, name = unwrap(wrapped_args[0]), unwrap(wrapped_args[1])
        if not isinstance(obj, TensorProxy) or not isinstance(name, str):
            return None
        if name in INPLACE_VIEW_OPS:
            wrapped_obj = wrapped_args[0]
            return interpreter_needs_wrap(lambda o, n, *d: InplaceViewMethod(wrapped_obj, name))
        if isinstance(obj, SubclassTensorProxy):
            lookaside = attribute_lookaside(obj, name)
            if lookaside is not None:
                return lookaside
        # thunder 0.2.6 gives user code thunder dtypes, which compare unequal to torch dtypes
        # (`y.dtype == torch.float32` is False even in plain thunder), a tuple for .shape and thunder devices; eager
        # code gets torch's types (a torch.Size it may return or put in a flatten context, a torch.device)
        if name in _TORCH_TYPED_ATTRIBUTES and is_called_from_user_code():
            return interpreter_needs_wrap(_TORCH_TYPED_ATTRIBUTES[name])
        if name in _PLAIN_TENSOR_ATTRIBUTES:
            return interpreter_needs_wrap(_PLAIN_TENSOR_ATTRIBUTES[name])
        return None
    if isinstance(fn, type) and is_traceable_wrapper_subclass_type(fn):
        if any(isinstance(a, TensorProxy) for a in tree_flatten([unwrap(a) for a in wrapped_args])[0]):
            return interpreter_needs_wrap(functools.partial(construct_subclass, fn))
    return None


# ---------------------------------------------------------------------------------------------------------------
# In-place view ops (x.transpose_(0, 1)): thunder 0.2.6 has no symbols for them
# ---------------------------------------------------------------------------------------------------------------

INPLACE_VIEW_OPS = {
    "transpose_": "transpose", "t_": "t", "unsqueeze_": "unsqueeze", "squeeze_": "squeeze", "swapdims_": "swapdims",
    "swapaxes_": "swapaxes", "as_strided_": "as_strided",
}


def _leaf_error(cls_name: str, name: str, where: str) -> UnsupportedSubclassOperationError:
    return UnsupportedSubclassOperationError(
        f"torch.Tensor.{name} on the {cls_name} input at {where}: the input is a leaf that requires grad, which "
        "PyTorch does not change in place (eager raises \"a leaf Variable that requires grad is being used in an "
        f"in-place operation\"). Use the out-of-place {INPLACE_VIEW_OPS[name]}, or call under torch.no_grad()."
    )


def _write_back_meta(x, name, args, kwargs, grad_enabled, where):
    return None


def _write_back_impl(x, name, args, kwargs, grad_enabled, where):
    # eager's in-place op on the caller's object, under the call's grad mode (a non-leaf's autograd history records
    # the view, as in eager); its dispatch changes a subclass's inner tensors' metadata and its own
    if grad_enabled and x.requires_grad and x.is_leaf:  # a trace made for a non-leaf serves a leaf: before changing it
        raise _leaf_error(type(x).__qualname__, name, where)
    with torch.set_grad_enabled(grad_enabled):
        getattr(x, name)(*args, **kwargs)


# in the epilogue (no output: DONT_DCE)
inplace_view_write_back = register_symbol(
    "inplace_view_write_back", meta=_write_back_meta, fn=_write_back_impl, tags=[prims.OpTags.DONT_DCE],
)


class InplaceViewMethod:
    """``x.transpose_`` (and the other in-place view ops) read in traced code: calling it makes the Python object ``x``
    denote the new view from then on, as in eager, by rebinding the interpreter's wrapped value of ``x``."""

    def __init__(self, wrapped_x, name: str):
        self.wrapped_x, self.name = wrapped_x, name

    def __call__(self, *args, **kwargs):  # callable for the interpreter's checks; calls go through call()
        raise RuntimeError(f"{self.name} of a traced tensor called outside thunder's interpreter")

    def call(self, *wrapped_args, **wrapped_kwargs):
        x = unwrap(self.wrapped_x)
        try:
            y = inplace_view_call(x, self.name, *(unwrap(a) for a in wrapped_args),
                                  **{k: unwrap(v) for k, v in wrapped_kwargs.items()})
        except Exception as e:
            return raise_in_interpreter(e)
        rebind_wrapped_value(self.wrapped_x, y)
        return self.wrapped_x  # eager returns x itself


def inplace_view_call(x: TensorProxy, name: str, *args, **kwargs):
    """``x.<name>(*args, **kwargs)`` for an in-place view op: the out-of-place view (``x.transpose(0, 1)``, through
    ``__torch_dispatch__`` for subclasses), which the caller makes ``x`` denote from then on. When ``x`` is an input
    (or what earlier in-place view ops made of one), the caller's object gets the same in-place op at run time, in the
    epilogue (after the computation, in order, under the call's grad mode): a subclass's dispatch then changes its
    inner tensors' metadata and its outer size and stride, as in eager, and a non-leaf's autograd history records
    the view."""
    state = jit_state()
    roots = state.setdefault("inplace_view_roots", {}) if state is not None else {}
    root = roots.get(x.name, x if x.history is not None else None)
    where = format_location(*source_location())
    if root is not None and root.requires_grad and is_marked_leaf(root) and is_traced_grad_enabled():
        typ = root.subclass_type if isinstance(root, SubclassTensorProxy) else torch.Tensor
        raise _leaf_error(typ.__qualname__, name, where)
    y = getattr(x, INPLACE_VIEW_OPS[name])(*args, **kwargs)
    if root is not None and state is not None:
        call_in_epilogue(inplace_view_write_back, root.history, name, tuple(args), dict(kwargs),
                         is_traced_grad_enabled(), where)
        roots[y.name] = root
    return y
