"""Stage 3, inputs and prologue guards: how an input tensor becomes a proxy, and when a cached trace may be reused.

In: a tensor the interpreter meets as an input of a plugin jit (argument, parameter, buffer): a wrapper subclass
becomes a ``SubclassTensorProxy`` (:func:`proxify_input`). Out: constraints on thunder's jit
context that ``unpack_inputs`` turns into prologue checks, in this order:

``check_subclass(x, spec)``, one call per subclass input: the exact type, the attribute names of
``__tensor_flatten__`` and the flatten context are as when traced (the context is compared with the class's
``__metadata_guard__(old, new)`` when it defines one, else with ``==``); each opaque attribute has the same type and
the same values of its type's registered ``guard_fn``; the instance attributes the trace depends on (those
``__tensor_unflatten__`` does not restore, and those traced code read) are equal; and the outer tensor and every inner tensor have the shape,
dtype, device and requires_grad they had (thunder's usual tensor check, done here in the same call), recursively
for nested subclasses; inner tensors must be plain tensors.

``check_nested_sizes(x, earlier, spec)``, for a subclass input with ragged sizes (nested ints: a jagged NestedTensor)
after the first such input: which of its ragged sizes equal which of the earlier inputs' (NestedTensors sharing
offsets), as when traced. A ragged dim itself is not part of ``check_subclass``'s outer-shape check.

A failing check makes the prologue raise, which thunder treats as a cache miss: a new trace, never a stale one.
"""

from __future__ import annotations

import itertools

from typing import Any

import torch
import thunder.core.prims as prims
from thunder.core.proxies import TensorProxy

from thunder_subclass import _thunder_internals
from thunder_subclass.errors import SubclassProtocolError, UnsupportedSubclassOperationError, format_location
from thunder_subclass.executor import subclass_executor
from thunder_subclass.fake import (
    FakeEnv,
    recorded_stride,
    remember_input_stride,
    remember_stride,
    torch_device,
    torch_dtype,
    unflatten_fake,
)
from thunder_subclass.proxy import (
    PLAIN_TENSOR_TYPES,
    OpaqueObjectProxy,
    SubclassTensorProxy,
    is_subclass_value,
    mark_leaf,
    mark_protocol_error,
    opaque_guard_values,
    subclass_proxy_from_tensor,
)

__all__ = ["SubclassSpec", "add_subclass_guards", "check_subclass", "proxify_input", "add_module_hooks_guard"]


def _tensor_meta(p) -> tuple:
    if isinstance(p, SubclassTensorProxy) and p.nested_sizes:
        # a ragged dim is not checked: its nested int is another one for every NestedTensor with new offsets, and
        # the trace does not depend on it (inner shapes are checked; sharing between inputs: check_nested_sizes)
        shape = tuple(None if i in p.nested_sizes else int(d) for i, d in enumerate(p._shape))
    else:
        shape = torch.Size([int(d) for d in p._shape])
    return (shape, torch_dtype(p), torch_device(p), bool(p.requires_grad))


def _is_int_strides(strides) -> bool:
    return strides is not None and all(type(s) is int for s in strides)


def _same_sizes(size, expected: tuple) -> bool:
    """``size`` equals ``expected`` at every dim but the ragged ones (None in ``expected``)."""
    return len(size) == len(expected) and all(e is None or s == e for s, e in zip(size, expected))


class SubclassSpec:
    """What a subclass input looked like when it was traced: everything the cached trace depends on, checked in one
    call per input. (Not a dataclass: thunder prints dataclass arguments field by field, and a type or an arbitrary
    context object cannot be printed.)"""

    __slots__ = ("subclass_type", "attr_names", "flatten_ctx", "opaque", "meta", "inner", "python_attrs",
                 "strides", "_inner_items", "_metadata_guard")

    def __init__(self, subclass_type: type, attr_names: tuple[str, ...], flatten_ctx: Any, opaque=None,
                 meta: tuple | None = None, inner: dict | None = None, python_attrs: dict | None = None,
                 strides: dict | None = None):
        self.subclass_type = subclass_type
        self.attr_names = tuple(attr_names)
        self.flatten_ctx = flatten_ctx
        # opaque attributes: name -> (type, its guard_fn's values when traced)
        self.opaque: dict[str, tuple[type, Any]] = dict(opaque or {})
        # (shape, dtype, device, requires_grad) of the outer tensor, and per tensor attribute: such a tuple or, for a
        # nested subclass, its SubclassSpec
        self.meta = meta
        self.inner: dict[str, Any] = dict(inner or {})
        # instance attributes the trace depends on (name -> value): those __tensor_unflatten__ does not restore
        # from the flatten context (set on the fakes), and those the traced code read (added while tracing)
        self.python_attrs: dict[str, Any] = dict(python_attrs or {})
        # strides of the outer tensor (key None) and of each plain inner tensor, as traced: fakes had them, so the
        # trace's views, errors and output layouts depend on them (absent where sizes are ragged or symbolic)
        self.strides: dict[str | None, tuple] = dict(strides or {})
        # checked every call: precomputed
        self._inner_items = tuple((a, e, isinstance(e, SubclassSpec), self.strides.get(a))
                                  for a, e in self.inner.items())
        self._metadata_guard = getattr(subclass_type, "__metadata_guard__", None)

    @classmethod
    def of(cls, p: SubclassTensorProxy) -> SubclassSpec:
        """The spec of input proxy ``p`` (linked to it, and its nested subclass proxies to their specs, so reads of
        instance attributes while tracing add guards: :func:`guard_python_attribute`)."""
        inner, opaque, strides = {}, {}, {}
        if _is_int_strides(p.outer_stride) and all(type(d) is int for d in p._shape):
            strides[None] = tuple(p.outer_stride)
        for a, q in p.inner.items():
            if isinstance(q, OpaqueObjectProxy):
                opaque[a] = (type(q.value), opaque_guard_values(q.value))
            elif isinstance(q, SubclassTensorProxy):
                inner[a] = SubclassSpec.of(q)
            else:
                inner[a] = _tensor_meta(q)
                stride = recorded_stride(q)
                if stride is not None:
                    strides[a] = stride
        spec = cls(p.subclass_type, p.attr_names, p.flatten_ctx, opaque, _tensor_meta(p), inner,
                   _not_restored_by_unflatten(p), strides)
        p.__dict__[_SPEC_ATTR] = spec
        return spec

    def __repr__(self) -> str:
        return f"SubclassSpec({self.subclass_type.__name__}, attrs={self.attr_names}, ctx={self.flatten_ctx!r})"

    def matches(self, t) -> bool:
        if type(t) is not self.subclass_type:
            return False
        if self.meta is not None:
            shape, *rest = self.meta
            if type(shape) is tuple:  # ragged dims
                if not _same_sizes(t.shape, shape) or [t.dtype, t.device, t.requires_grad] != rest:
                    return False
            elif (t.shape, t.dtype, t.device, t.requires_grad) != self.meta:
                return False
            outer_stride = self.strides.get(None)
            if outer_stride is not None and t.stride() != outer_stride:
                return False
        attrs, ctx = t.__tensor_flatten__()
        if tuple(attrs) != self.attr_names:
            return False
        for attr, expected, nested, stride in self._inner_items:
            x = getattr(t, attr)
            if nested:
                if not expected.matches(x):
                    return False
            elif type(x) not in PLAIN_TENSOR_TYPES or (x.shape, x.dtype, x.device, x.requires_grad) != expected:
                return False
            elif stride is not None and x.stride() != stride:
                return False
        if self.opaque and not self._opaque_match(t):
            return False
        if self.python_attrs:
            for name, value in self.python_attrs.items():
                if not is_same_value(getattr(t, name, _MISSING), value):  # __dict__ or __slots__
                    return False
        if self._metadata_guard is not None:
            return bool(self._metadata_guard(self.flatten_ctx, ctx))
        return bool(ctx == self.flatten_ctx)

    def _opaque_match(self, t) -> bool:
        for attr, (typ, values) in self.opaque.items():
            obj = getattr(t, attr)
            if type(obj) is not typ or opaque_guard_values(obj) != values:
                return False
        return True

    def expression(self, v: str, const, fresh, tensor=None) -> str:
        """A Python expression true exactly when :meth:`matches` of the value named ``v`` is (the same checks in the
        same order, inline: ``thunder_subclass.prologue`` puts it in a generated function). ``const(obj)`` names a
        constant, ``fresh()`` a new local name. Uses ``_plain``, ``_same`` (:func:`is_same_value`) and ``_MISSING``.

        ``tensor(x, shape, dtype, device, requires_grad, plain, strides)``, when given, stands for each check of a
        tensor's metadata (the outer tensor's, and each plain inner tensor's with ``plain=True``: its type is then one
        of ``_plain``; ``strides``: None or the strides it must have): it returns the expression to put in its place, or ``""`` when the caller checks that tensor
        itself after this expression (the prologue's C++ tensor checks)."""
        if tensor is None:
            tensor = inline_tensor_check(const)
        flat = fresh()
        parts = [f"type({v}) is {const(self.subclass_type)}"]
        if self.meta is not None:
            shape, dtype, device, requires_grad = self.meta
            if type(shape) is tuple:  # ragged dims (None) are not checked
                size = fresh()
                shape_check = " and ".join(
                    [f"len({size} := {v}.shape) == {len(shape)}"]
                    + [f"{size}[{i}] == {const(e)}" for i, e in enumerate(shape) if e is not None]
                )
                parts.append(f"{shape_check} and {v}.dtype is {const(dtype)} and "
                             f"{v}.device == {const(device)} and {v}.requires_grad is {const(requires_grad)}")
            else:
                parts.append(tensor(v, shape, dtype, device, requires_grad, False, self.strides.get(None)))
        parts.append(f"len({flat} := {v}.__tensor_flatten__()) == 2 and tuple({flat}[0]) == {const(self.attr_names)}")
        for attr, expected, nested, stride in self._inner_items:
            x = fresh()
            bind = f"({x} := getattr({v}, {const(attr)})) is {x}"
            if nested:
                parts.append(f"{bind} and {expected.expression(x, const, fresh, tensor)}")
            else:
                parts.append(bind)
                parts.append(tensor(x, *expected, True, stride))
        if self.opaque:
            parts.append(f"{const(self)}._opaque_match({v})")
        for name, value in self.python_attrs.items():
            x, c = fresh(), const(value)
            parts.append(f"(({x} := getattr({v}, {const(name)}, _MISSING)) is {c} or _same({x}, {c}))")
        if self._metadata_guard is not None:
            parts.append(f"bool({const(self._metadata_guard)}({const(self.flatten_ctx)}, {flat}[1]))")
        else:
            parts.append(f"bool({flat}[1] == {const(self.flatten_ctx)})")
        return "(" + " and ".join(p for p in parts if p) + ")"


def inline_tensor_check(const):
    """The ``tensor`` argument of :meth:`SubclassSpec.expression` that checks a tensor's metadata inline, in Python."""

    def tensor(x: str, shape, dtype, device, requires_grad, plain: bool, strides=None) -> str:
        return (f"{'type(' + x + ') in _plain and ' if plain else ''}{x}.shape == {const(shape)} and "
                f"{x}.dtype is {const(dtype)} and {x}.device == {const(device)} and "
                f"{x}.requires_grad is {const(requires_grad)}"
                + (f" and {x}.stride() == {const(tuple(strides))}" if strides is not None else ""))

    return tensor


_SPEC_ATTR = "_thunder_subclass_spec"
_MISSING = object()


def is_same_value(a: Any, b: Any) -> bool:
    """Whether instance attribute values ``a`` and ``b`` are interchangeable for a trace: the same object, or equal
    values of the same type (objects that cannot be compared are the same only when identical)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except Exception:
        return False


def _not_restored_by_unflatten(p: SubclassTensorProxy) -> dict[str, Any]:
    """The instance attributes of input ``p`` that ``__tensor_unflatten__`` does not rebuild equal from the flatten
    context (``nn.Parameter``'s ``_is_param``, a ``quant_type`` the user set): the fakes carry them, so the trace
    may depend on them."""
    if not p.python_attrs:
        return {}
    env = FakeEnv()
    rebuilt = unflatten_fake(
        p.subclass_type, {a: env.to_fake(q) for a, q in p.inner.items()}, p.flatten_ctx, p.outer_size, p.outer_stride
    )
    return {k: v for k, v in p.python_attrs.items() if not is_same_value(getattr(rebuilt, k, _MISSING), v)}


def guard_python_attribute(p: SubclassTensorProxy, name: str) -> None:
    """Traced code read instance attribute ``name`` of ``p``: if ``p`` is an input (or inside one), a call whose input
    has another value there is a cache miss."""
    spec = p.__dict__.get(_SPEC_ATTR)
    if spec is not None and name in p.python_attrs:
        spec.python_attrs[name] = p.python_attrs[name]


class SubclassGuardFailure(Exception):
    """Raised by a prologue guard: thunder catches it and treats the call as a cache miss."""


def _check_subclass_impl(t, spec: SubclassSpec) -> None:
    if not spec.matches(t):
        raise SubclassGuardFailure(f"{type(t).__name__} input does not match {spec}")


def _check_subclass_meta(t, spec) -> None:
    return None


# DONT_DCE: a check has no output, and dead-code elimination must keep it in the prologue.
check_subclass = subclass_executor.register_operator(
    "check_subclass", meta=_check_subclass_meta, fn=_check_subclass_impl, tags=[prims.OpTags.DONT_DCE]
)


def _check_plain_tensor_impl(t) -> None:
    if type(t) not in PLAIN_TENSOR_TYPES:
        raise SubclassGuardFailure(f"expected a plain tensor, got {type(t).__name__}")


check_plain_tensor = subclass_executor.register_operator(
    "check_plain_tensor", meta=lambda t: None, fn=_check_plain_tensor_impl, tags=[prims.OpTags.DONT_DCE]
)


def _check_tensor_strides_impl(t, strides: tuple) -> None:
    if t.stride() != strides:
        raise SubclassGuardFailure(f"expected strides {strides}, got {t.stride()}")


# on a plain tensor input whose strides a fake run used (subclass dispatch may decide by them, as eager does)
check_tensor_strides = subclass_executor.register_operator(
    "check_tensor_strides", meta=lambda t, strides: None, fn=_check_tensor_strides_impl, tags=[prims.OpTags.DONT_DCE]
)


class ModuleHooksSpec:
    """The forward hooks of a module called in traced code, as the trace ran them (``(pre, post)`` of
    ``_thunder_internals.module_forward_hooks``); the prologue checks each call that they are still those."""

    __slots__ = ("hooks",)

    def __init__(self, hooks: tuple):
        self.hooks = hooks

    def __repr__(self) -> str:
        pre, post = self.hooks
        return f"ModuleHooksSpec({len(pre)} forward pre-hooks, {len(post)} forward hooks)"


def _check_module_hooks_impl(module, spec: ModuleHooksSpec) -> None:
    if _thunder_internals.module_forward_hooks(module) != spec.hooks:
        raise SubclassGuardFailure(f"the hooks of {type(module).__name__} changed")


check_module_hooks = subclass_executor.register_operator(
    "check_module_hooks", meta=lambda module, spec: None, fn=_check_module_hooks_impl, tags=[prims.OpTags.DONT_DCE]
)


def add_module_hooks_guard(jit_ctx, module, provenance, hooks: tuple) -> None:
    """A module called in traced code (reached from the inputs by ``provenance``) ran with the forward hooks
    ``hooks``: a call where it has other hooks (added or removed since, or backward or global hooks) is a cache miss.
    One check per module and trace."""
    from thunder.core.proxies import AnyProxy

    state = _thunder_internals.jit_state()
    guarded = state.setdefault("hooks_guarded", set()) if state is not None else set()
    if id(module) in guarded:
        return
    guarded.add(id(module))
    # a name of its own: the prologue unpacks constraint arguments by name, and an "anyN" made while interpreting can
    # equal the name of another value's proxy there (Mistral's sliding_window: the check got an int)
    name = f"hooked_module{next(_hooked_module_names)}"
    jit_ctx.add_constraint((check_module_hooks, AnyProxy(module, name=name, history=provenance), ModuleHooksSpec(hooks)))


_hooked_module_names = itertools.count()


class TraceFlags:
    """What the trace of one jit call turned out to involve, filled while tracing, read by its prologue checks."""

    __slots__ = ("involves_subclasses",)

    def __init__(self):
        self.involves_subclasses = False

    def __repr__(self) -> str:
        return f"TraceFlags(involves_subclasses={self.involves_subclasses})"


def _check_no_dispatch_mode_impl(t, flags: TraceFlags) -> None:
    if flags.involves_subclasses and torch._C._len_torch_dispatch_stack():
        raise SubclassGuardFailure("a TorchDispatchMode is active")  # traced again: the trace-time check raises


# on the first tensor input of each trace (a check needs an input: thunder's PrunePrologueChecks requires one)
check_no_dispatch_mode = subclass_executor.register_operator(
    "check_no_dispatch_mode", meta=lambda t, flags: None, fn=_check_no_dispatch_mode_impl, tags=[prims.OpTags.DONT_DCE]
)


def _trace_flags(jit_ctx=None, first_input=None) -> TraceFlags | None:
    """The current trace's flags; made, with their prologue check on ``first_input``, by the first input."""
    state = _thunder_internals.jit_state()
    if state is None:
        return None
    flags = state.get("flags")
    if flags is None and first_input is not None:
        flags = state["flags"] = TraceFlags()
        jit_ctx.add_constraint((check_no_dispatch_mode, first_input, flags))
    return flags


def mark_involves_subclasses() -> None:
    flags = _trace_flags()
    if flags is not None:
        flags.involves_subclasses = True


def require_no_dispatch_mode(what: str) -> None:
    """A trace that involves subclasses may not be made, nor reused, while a ``TorchDispatchMode`` is active: eager
    shows the mode the aten calls on the subclasses, the compiled program would show it the flattened calls on inner
    tensors. Raises :class:`UnsupportedSubclassOperationError` naming the modes; the trace's prologue check (on its
    first tensor input) makes a cached trace a miss under a mode, so that this raises again."""
    modes = _thunder_internals.active_dispatch_modes()
    if modes:
        names = ", ".join(type(m).__name__ for m in modes)
        filename, lineno = _thunder_internals.source_location()
        raise UnsupportedSubclassOperationError(
            f"{what} at {format_location(filename, lineno)} runs under the TorchDispatchMode {names}, active around "
            "the call of a thunder_subclass-compiled function. Eager shows such a mode the aten operations on tensor "
            "subclasses; the compiled program runs the flattened operations on their inner tensors, which the mode "
            "would see instead, so thunder_subclass does not run it. Call the compiled function outside the mode, or "
            "the original function inside it."
        )
    mark_involves_subclasses()


class TensorTypeSpec:
    """What a typed input (a subclass overriding only ``__torch_function__``) looked like when traced: its exact class
    and the instance attributes traced code read (added while tracing)."""

    __slots__ = ("cls", "python_attrs")

    def __init__(self, cls: type):
        self.cls = cls
        self.python_attrs: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"TensorTypeSpec({self.cls.__qualname__})"


def _check_tensor_type_impl(t, spec: TensorTypeSpec) -> None:
    if type(t) is not spec.cls:
        raise SubclassGuardFailure(f"expected a {spec.cls.__qualname__}, got {type(t).__name__}")
    if spec.python_attrs:
        for name, value in spec.python_attrs.items():
            if not is_same_value(getattr(t, name, _MISSING), value):
                raise SubclassGuardFailure(f"{spec.cls.__qualname__}.{name} changed")


check_tensor_type = subclass_executor.register_operator(
    "check_tensor_type", meta=lambda t, spec: None, fn=_check_tensor_type_impl, tags=[prims.OpTags.DONT_DCE]
)


def add_tensor_type_guard(jit_ctx, p) -> None:
    """Input ``p`` is typed (``thunder_subclass.torch_function``): its exact class is checked every call."""
    spec = p.__dict__["_thunder_subclass_type_spec"] = TensorTypeSpec(p.__dict__["_thunder_subclass_tensor_type"].cls)
    jit_ctx.add_constraint((check_tensor_type, p, spec))
    _trace_flags(jit_ctx, first_input=p)


def guard_tensor_type_attribute(p, name: str, value: Any) -> None:
    """Traced code read instance attribute ``name`` of typed value ``p`` and found ``value`` (``MISSING``: absent)
    before setting it: for an input, another value (or presence) is a cache miss."""
    spec = p.__dict__.get("_thunder_subclass_type_spec")
    if spec is not None and name not in spec.python_attrs:
        spec.python_attrs[name] = value


MISSING = _MISSING


def add_plain_tensor_guard(jit_ctx, p) -> None:
    """A plain tensor input of a plugin jit must stay a plain tensor for the trace to be reused."""
    if isinstance(p, TensorProxy) and not isinstance(p, SubclassTensorProxy):
        jit_ctx.add_constraint((check_plain_tensor, p))


def add_subclass_guards(jit_ctx, p: SubclassTensorProxy) -> None:
    """Add the prologue constraint for input ``p``: one ``check_subclass`` that checks the type, attribute names,
    flatten context, opaque attributes, and the metadata of the outer tensor and of every inner tensor, recursively
    (one Python call per subclass input instead of one thunder check per tensor)."""
    jit_ctx.add_constraint((check_subclass, p, SubclassSpec.of(p)))


def proxify_input(jit_ctx, value, original):
    """The proxy of input tensor ``value`` (a wrapped value) of a plugin jit, with its prologue guards (the
    ``JitCtx.proxify`` hook's handler; ``original`` is thunder's proxify)."""
    t = value.value
    if type(t) is not torch.Tensor:
        try:
            if is_subclass_value(t):
                return _proxify_subclass(jit_ctx, value)
        except SubclassProtocolError as e:
            # raised here, thunder would wrap it in an InterpreterError; the first operation on the value
            # raises it as itself (see proxy.has_subclass_proxy)
            return mark_protocol_error(original(jit_ctx, value), e)
    # thunder's tensor check accepts any Tensor subclass: without this a trace made for a plain tensor
    # would serve a subclass input (run eagerly through __torch_dispatch__), never a cache miss.
    p = original(jit_ctx, value)
    if isinstance(p, TensorProxy):
        mark_leaf(p, t)
        strides = tuple(t.stride()) if t.layout is torch.strided else None
        # (not for symbolic sizes, cache="symbolic values": a stride check would pin them)
        if strides is not None and all(type(s) is int for s in p._shape):
            # fakes of this input get its strides; the first fake made while tracing adds the prologue check
            remember_input_stride(p, strides, lambda: jit_ctx.add_constraint((check_tensor_strides, p, strides)))
        _trace_flags(jit_ctx, first_input=p)
    add_plain_tensor_guard(jit_ctx, p)
    return p


def _proxify_subclass(jit_ctx, value) -> SubclassTensorProxy:
    t = value.value
    name = _thunder_internals.input_proxy_name(jit_ctx, value)
    p = subclass_proxy_from_tensor(
        t, name=name, history=value.provenance,
        inner_history=_thunder_internals.attribute_provenance(value.provenance),
    )
    _thunder_internals.register_input_proxy(value, p)
    mark_leaf(p, t)
    _remember_inner_strides(p, t)
    _trace_flags(jit_ctx, first_input=p).involves_subclasses = True  # its first operation raises under a mode
    add_subclass_guards(jit_ctx, p)
    if p.nested_sizes:
        add_nested_sizes_guard(jit_ctx, p)
    return p


def _remember_inner_strides(p: SubclassTensorProxy, t: torch.Tensor) -> None:
    """Fakes of the inner tensors of input ``t`` get their strides, as eager has them (a view that eager refuses is
    refused while tracing, outputs keep eager's layouts); ``check_subclass`` checks them (``SubclassSpec.strides``)."""
    for a, q in p.inner.items():
        x = getattr(t, a)
        if isinstance(q, SubclassTensorProxy):
            _remember_inner_strides(q, x)
        elif isinstance(q, TensorProxy) and x.layout is torch.strided and all(type(d) is int for d in q._shape):
            remember_stride(q, x)


class NestedSizesSpec:
    """Which ragged sizes of a subclass input equal which of the inputs before it, as when traced: for each pair
    (own dim, index of an earlier input, its dim), whether the nested ints were equal (NestedTensors sharing offsets
    have equal ragged sizes; ``a.shape == b.shape`` and ``a + b`` depend on it)."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: tuple):
        self.pairs = pairs

    def __repr__(self) -> str:
        return f"NestedSizesSpec({len(self.pairs)} pairs)"

    def matches(self, t, others) -> bool:
        return all(bool(t.shape[d] == others[j].shape[e]) is equal for d, j, e, equal in self.pairs)


def _check_nested_sizes_impl(t, others, spec: NestedSizesSpec) -> None:
    if not spec.matches(t, others):
        raise SubclassGuardFailure(f"the ragged sizes of a {type(t).__name__} input are shared with other inputs "
                                   "differently than when traced")


check_nested_sizes = subclass_executor.register_operator(
    "check_nested_sizes", meta=lambda t, others, spec: None, fn=_check_nested_sizes_impl,
    tags=[prims.OpTags.DONT_DCE],
)


def add_nested_sizes_guard(jit_ctx, p: SubclassTensorProxy) -> None:
    """Input ``p`` has ragged sizes (nested ints): a call whose inputs share ragged sizes differently (NestedTensors
    with the same offsets, or not) is a cache miss. Its lengths themselves are not guarded: fake runs know no
    tensor values, so the trace holds for any offsets of the same shape (the inner tensors' shapes are checked)."""
    state = _thunder_internals.jit_state()
    earlier = state.setdefault("ragged_inputs", []) if state is not None else []
    pairs = tuple(
        (d, j, e, bool(s == s2))
        for d, s in p.nested_sizes.items()
        for j, q in enumerate(earlier)
        for e, s2 in q.nested_sizes.items()
    )
    if pairs:
        jit_ctx.add_constraint((check_nested_sizes, p, tuple(earlier), NestedSizesSpec(pairs)))
    earlier.append(p)


def _check_buffer_flag_impl(t, flag: bool) -> None:
    if bool(getattr(t, "_is_buffer", False)) is not flag:
        raise SubclassGuardFailure(f"the argument is {'no longer ' if flag else ''}a torch.nn.Buffer")


check_buffer_flag = subclass_executor.register_operator(
    "check_buffer_flag", meta=lambda t, flag: None, fn=_check_buffer_flag_impl, tags=[prims.OpTags.DONT_DCE]
)


def guard_buffer_flag(p: TensorProxy, flag: bool) -> None:
    """Traced code asked ``isinstance(p, torch.nn.Buffer)`` of input ``p`` (torch answers from the tensor's
    ``_is_buffer`` flag) and got ``flag``: another answer for a later argument is a cache miss."""
    jit_ctx = _thunder_internals.jit_context()
    if jit_ctx is not None and not p.__dict__.get("_thunder_subclass_buffer_guarded"):
        p.__dict__["_thunder_subclass_buffer_guarded"] = True
        jit_ctx.add_constraint((check_buffer_flag, p, flag))
