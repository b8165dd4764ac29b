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
or a plain offsets-like input (1-D integer) after the first such input: which of its ragged sizes equal which of the
earlier inputs' (NestedTensors sharing offsets; an offsets tensor passed twice, or next to a NestedTensor built on it),
as when traced. A ragged dim itself is not part of ``check_subclass``'s outer-shape check.

``check_input_values(x, spec)``, for an integer input (or integer inner tensor of a subclass input: NJT offsets and
lengths) whose values dispatch read while tracing (``thunder_subclass.fake.ValueSource``): the same values.

A failing check makes the prologue raise, which thunder treats as a cache miss: a new trace, never a stale one.
"""

from __future__ import annotations

import enum
import functools
import itertools
import types

from typing import Any

import torch
import thunder.core.prims as prims
from thunder.core.proxies import NumberProxy, TensorProxy

from thunder_subclass import _thunder_internals
from thunder_subclass.errors import (
    SubclassProtocolError,
    UnsupportedSubclassOperationError,
    UnsupportedTracingError,
    format_location,
)
from thunder_subclass.executor import subclass_executor
from thunder_subclass.fake import (
    FakeEnv,
    context_template,
    context_with_sizes,
    ValueSource,
    real_execution,
    remember_value_source,
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
    is_symbolic_size,
    mark_leaf,
    mark_protocol_error,
    nested_int_of,
    remember_nested_int,
    opaque_guard_values,
    size_values,
    subclass_proxy_from_tensor,
)

__all__ = ["SubclassSpec", "add_subclass_guards", "check_subclass", "proxify_input", "add_module_hooks_guard",
           "ObjectSpec", "check_object", "guard_input_object", "guard_object_by_value", "guard_object_by_identity",
           "guard_native_call_arguments", "guard_lookaside_arguments", "guard_compared_objects",
           "is_guardable_provenance",
           "write_back_input_containers", "write_back_container", "check_attribute_absent", "guard_attribute_absent"]


def _tensor_meta(p) -> tuple:
    if isinstance(p, SubclassTensorProxy) and p.nested_sizes:
        # a ragged dim is not checked: its nested int is another one for every NestedTensor with new offsets, and
        # the trace does not depend on it (inner shapes are checked; sharing between inputs: check_nested_sizes)
        shape = tuple(None if i in p.nested_sizes else int(d) for i, d in enumerate(p._shape))
    elif any(is_symbolic_size(d) for d in p._shape):
        # a symbolic size (cache="symbolic values") is not checked here: what the trace relied on about it is
        # checked by the size guards of its fake runs, and its value where it was pinned
        shape = tuple(None if is_symbolic_size(d) else int(d) for d in p._shape)
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
                 "strides", "contiguous", "ctx_template", "_inner_items", "_metadata_guard")

    def __init__(self, subclass_type: type, attr_names: tuple[str, ...], flatten_ctx: Any, opaque=None,
                 meta: tuple | None = None, inner: dict | None = None, python_attrs: dict | None = None,
                 strides: dict | None = None, contiguous: frozenset = frozenset()):
        self.subclass_type = subclass_type
        # the outer tensor (None) and the plain inner tensors (by name) with symbolic sizes: their fakes were
        # contiguous in the symbols, so they must be contiguous (strides of their own sizes)
        self.contiguous = frozenset(contiguous)
        # with symbolic outer sizes: the flatten context with the outer size and strides it holds as markers
        # (fake.context_template); the call's context must be it with the call's outer size and strides
        self.ctx_template = None
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
        self._inner_items = tuple((a, e, isinstance(e, SubclassSpec),
                                   "contiguous" if a in self.contiguous else self.strides.get(a))
                                  for a, e in self.inner.items())
        self._metadata_guard = getattr(subclass_type, "__metadata_guard__", None)

    @classmethod
    def of(cls, p: SubclassTensorProxy) -> SubclassSpec:
        """The spec of input proxy ``p`` (linked to it, and its nested subclass proxies to their specs, so reads of
        instance attributes while tracing add guards: :func:`guard_python_attribute`)."""
        inner, opaque, strides, contiguous = {}, {}, {}, set()
        if _is_int_strides(p.outer_stride) and all(type(d) is int for d in p._shape):
            strides[None] = tuple(p.outer_stride)
        elif any(is_symbolic_size(d) for d in p._shape):
            contiguous.add(None)
        for a, q in p.inner.items():
            if isinstance(q, OpaqueObjectProxy):
                opaque[a] = (type(q.value), opaque_guard_values(q.value))
            elif isinstance(q, SubclassTensorProxy):
                inner[a] = SubclassSpec.of(q)
            else:
                inner[a] = _tensor_meta(q)
                stride = recorded_stride(q)
                if any(is_symbolic_size(d) for d in q._shape):
                    contiguous.add(a)
                elif stride is not None:
                    strides[a] = stride
        spec = cls(p.subclass_type, p.attr_names, p.flatten_ctx, opaque, _tensor_meta(p), inner,
                   _not_restored_by_unflatten(p), strides, frozenset(contiguous))
        if None in contiguous:
            template, found = context_template(p.flatten_ctx, size_values(p._shape), p.outer_stride)
            spec.ctx_template = template if found else None
        p.__dict__[_SPEC_ATTR] = spec
        return spec

    def __repr__(self) -> str:
        return f"SubclassSpec({self.subclass_type.__name__}, attrs={self.attr_names}, ctx={self.flatten_ctx!r})"

    def matches(self, t) -> bool:
        if type(t) is not self.subclass_type:
            return False
        if self.meta is not None:
            shape, *rest = self.meta
            if type(shape) is tuple:  # ragged or symbolic dims
                if not _same_sizes(t.shape, shape) or [t.dtype, t.device, t.requires_grad] != rest:
                    return False
            elif (t.shape, t.dtype, t.device, t.requires_grad) != self.meta:
                return False
            outer_stride = self.strides.get(None)
            if outer_stride is not None and t.stride() != outer_stride:
                return False
            if None in self.contiguous and not is_contiguous_layout(t):
                return False
        attrs, ctx = t.__tensor_flatten__()
        if tuple(attrs) != self.attr_names:
            return False
        for attr, expected, nested, stride in self._inner_items:
            x = getattr(t, attr)
            if nested:
                if not expected.matches(x):
                    return False
            elif type(x) not in PLAIN_TENSOR_TYPES:
                return False
            elif type(expected[0]) is tuple:  # symbolic dims
                if not _same_sizes(x.shape, expected[0]) or [x.dtype, x.device, x.requires_grad] != list(expected[1:]):
                    return False
                if stride == "contiguous" and not is_contiguous_layout(x):
                    return False
            elif (x.shape, x.dtype, x.device, x.requires_grad) != expected:
                return False
            elif stride is not None and x.stride() != stride:
                return False
        if self.opaque and not self._opaque_match(t):
            return False
        if self.python_attrs:
            for name, value in self.python_attrs.items():
                if not is_same_value(getattr(t, name, _MISSING), value):  # __dict__ or __slots__
                    return False
        expected = self.flatten_ctx if self.ctx_template is None else self._expected_ctx(t)
        if self._metadata_guard is not None:
            return bool(self._metadata_guard(expected, ctx))
        return bool(ctx == expected)

    def _expected_ctx(self, t) -> Any:
        """The flatten context this trace holds for ``t``: the traced one with ``t``'s outer size and strides."""
        return context_with_sizes(self.ctx_template, tuple(t.shape), tuple(t.stride()))

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
                if None in self.contiguous:
                    parts.append(f"{const(is_contiguous_layout)}({v})")
            else:
                parts.append(tensor(v, shape, dtype, device, requires_grad, False, self.strides.get(None)))
        parts.append(f"len({flat} := {v}.__tensor_flatten__()) == 2 and tuple({flat}[0]) == {const(self.attr_names)}")
        for attr, expected, nested, stride in self._inner_items:
            x = fresh()
            bind = f"({x} := getattr({v}, {const(attr)})) is {x}"
            if nested:
                parts.append(f"{bind} and {expected.expression(x, const, fresh, tensor)}")
            elif type(expected[0]) is tuple:  # symbolic dims: checked inline, in Python
                shape, dtype, device, requires_grad = expected
                size = fresh()
                parts.append(bind)
                parts.append(" and ".join(
                    [f"type({x}) in _plain", f"len({size} := {x}.shape) == {len(shape)}"]
                    + [f"{size}[{i}] == {const(e)}" for i, e in enumerate(shape) if e is not None]
                    + [f"{x}.dtype is {const(dtype)}", f"{x}.device == {const(device)}",
                       f"{x}.requires_grad is {const(requires_grad)}"]
                    + ([f"{const(is_contiguous_layout)}({x})"] if stride == "contiguous" else [])
                ))
            else:
                parts.append(bind)
                parts.append(tensor(x, *expected, True, stride))
        if self.opaque:
            parts.append(f"{const(self)}._opaque_match({v})")
        for name, value in self.python_attrs.items():
            x, c = fresh(), const(value)
            parts.append(f"(({x} := getattr({v}, {const(name)}, _MISSING)) is {c} or _same({x}, {c}))")
        expected = const(self.flatten_ctx) if self.ctx_template is None else f"{const(self)}._expected_ctx({v})"
        if self._metadata_guard is not None:
            parts.append(f"bool({const(self._metadata_guard)}({expected}, {flat}[1]))")
        else:
            parts.append(f"bool({flat}[1] == {expected})")
        return "(" + " and ".join(p for p in parts if p) + ")"


def is_contiguous_layout(t) -> bool:
    """``t``'s strides are the contiguous strides of its sizes (read from ``t.shape`` / ``t.stride()``, which a
    wrapper subclass reports without dispatch)."""
    acc = 1
    for size, stride in zip(reversed(t.shape), reversed(t.stride())):
        if size != 1 and stride != acc:
            return False
        acc *= max(size, 1)
    return True


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
    env = FakeEnv(pin=False)  # (the sizes do not matter: nothing of this run enters the trace)
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
    """Raised by a prologue guard: thunder catches it and treats the call as a cache miss.

    The message may be given as a function (``explain``), called the first time the message is read: a call that
    misses every cache entry but one (or all) raises one of these per rejecting entry, and nothing reads them unless
    the user asks why it missed (``thunder_subclass.explain_recompiles``), so a hit costs no message building."""

    def __init__(self, message: str | None = None, *, explain=None, int_changed=None):
        super().__init__(message)
        self._explain = explain
        self._int_changed = int_changed

    def is_int_value_change(self) -> bool:
        """Whether the failing check compares an int read while tracing with the value it had then (automatic dynamic
        shapes treats such a miss as it treats a change of sizes)."""
        return self._int_changed is not None and bool(self._int_changed())

    def __str__(self) -> str:
        if self._explain is not None:
            explain, self._explain = self._explain, None
            self.args = (explain(),)
        return super().__str__()


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
    ``_thunder_internals.module_forward_hooks``), and the module's class (``module_type``; None for the compiled
    module itself, which the prologue reaches as its ``ThunderModule``): the prologue checks each call that they are
    still those (a submodule replaced by one of another class, ``m.act = nn.GELU()``, is a cache miss; one of the same
    class is checked by the checks of what the trace read from it)."""

    __slots__ = ("hooks", "module_type")

    def __init__(self, hooks: tuple, module_type: type | None = None):
        self.hooks, self.module_type = hooks, module_type

    def __repr__(self) -> str:
        pre, post = self.hooks
        return f"ModuleHooksSpec({len(pre)} forward pre-hooks, {len(post)} forward hooks)"


def _check_module_hooks_impl(module, spec: ModuleHooksSpec) -> None:
    if spec.module_type is not None and type(module) is not spec.module_type:
        raise SubclassGuardFailure(f"the submodule is a {type(module).__qualname__}, the trace was made for a "
                                   f"{spec.module_type.__qualname__}")
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
    module_type = None if _is_input_fn(provenance) else type(module)
    jit_ctx.add_constraint((check_module_hooks, AnyProxy(module, name=name, history=provenance),
                            ModuleHooksSpec(hooks, module_type)))


def _is_input_fn(record) -> bool:
    return getattr(record.inst, "name", None) == "INPUT_FN"


_hooked_module_names = itertools.count()


class TraceFlags:
    """What the trace of one jit call turned out to involve, filled while tracing, read by its prologue checks."""

    __slots__ = ("involves_subclasses",)

    def __init__(self):
        self.involves_subclasses = False

    def __repr__(self) -> str:
        return f"TraceFlags(involves_subclasses={self.involves_subclasses})"

    def disk_state(self) -> bool:  # thunder_subclass.disk_cache: how a stored prologue holds it
        return self.involves_subclasses

    @classmethod
    def from_disk_state(cls, state: bool) -> "TraceFlags":
        flags = cls()
        flags.involves_subclasses = bool(state)
        return flags


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
        if type(t) is torch.Tensor and is_ragged_source_candidate(t):
            add_nested_sizes_guard(jit_ctx, p, t)
            _remember_values(jit_ctx, p, t, p, ())
    add_plain_tensor_guard(jit_ctx, p)
    return p


def _proxify_subclass(jit_ctx, value) -> SubclassTensorProxy:
    t = value.value
    name = _thunder_internals.input_proxy_name(jit_ctx, value)
    # sizes stay symbolic for an argument (not a global or a module's attribute: thunder's prologue unpacks no
    # number from those) whose layout the fakes can have
    symbolic = _thunder_internals.symbolic_values_active() and _has_symbolic_layout(t) \
        and _thunder_internals.is_argument_provenance(value.provenance)
    p = subclass_proxy_from_tensor(
        t, name=name, history=value.provenance,
        inner_history=_thunder_internals.attribute_provenance(value.provenance),
        outer_shape=_thunder_internals.input_size_numbers(t.shape, value.provenance) if symbolic else None,
    )
    if _thunder_internals.symbolic_values_active():
        _prepare_inner_sizes(p, symbolic)
    _thunder_internals.register_input_proxy(value, p)
    mark_leaf(p, t)
    _remember_inner_strides(p, t)
    _remember_inner_values(jit_ctx, p, t, p, ())
    _trace_flags(jit_ctx, first_input=p).involves_subclasses = True  # its first operation raises under a mode
    add_subclass_guards(jit_ctx, p)
    if p.nested_sizes:
        add_nested_sizes_guard(jit_ctx, p, t)
    return p


def _has_symbolic_layout(t: torch.Tensor) -> bool:
    """Whether subclass input ``t`` keeps symbolic sizes under ``cache="symbolic values"``: its outer tensor and
    every plain inner tensor are contiguous (fakes with symbolic sizes are made contiguous in the symbols; the
    prologue checks it), and no size is ragged."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if t.layout is not torch.strided or not is_contiguous_layout(t) or not all(type(d) is int for d in t.shape):
        return False
    attrs, _ = t.__tensor_flatten__()
    for a in attrs:
        x = getattr(t, a)
        if not isinstance(x, torch.Tensor):
            continue
        if is_traceable_wrapper_subclass(x):
            if not _has_symbolic_layout(x):
                return False
        elif x.layout is not torch.strided or not is_contiguous_layout(x) or not all(type(d) is int for d in x.shape):
            return False
    return True


def _prepare_inner_sizes(p: SubclassTensorProxy, symbolic: bool) -> None:
    """The size numbers of the inner tensors of input ``p`` (thunder made them under ``cache="symbolic values"``):
    with a provenance the prologue can unpack (``<input>.<attr>.shape[i]``), or, where ``p`` keeps static sizes
    (``symbolic`` False: a non-contiguous layout), static (``check_subclass`` checks their values)."""
    same = []
    for q in p.inner.values():
        if isinstance(q, SubclassTensorProxy):
            _prepare_inner_sizes(q, symbolic)
        if not isinstance(q, TensorProxy) or q.history is None:
            continue
        for i, d in enumerate(q._shape):
            if isinstance(d, NumberProxy):
                if symbolic:
                    d.history = _thunder_internals.size_provenance(q.history, i)
                    if len(q._shape) == len(p._shape) and isinstance(p._shape[i], NumberProxy) \
                            and p._shape[i].value == d.value:
                        same.append((d, p._shape[i]))
                else:
                    d.make_static_constrained()
    # an inner size equal to the outer size at the same dim (a TwoTensor's, a DTensor's local tensor at one rank)
    # stays equal to it: checked, and one symbol for both in fake runs
    _thunder_internals.guard_equal_sizes(same)


def _remember_inner_strides(p: SubclassTensorProxy, t: torch.Tensor) -> None:
    """Fakes of the inner tensors of input ``t`` get their strides, as eager has them (a view that eager refuses is
    refused while tracing, outputs keep eager's layouts); ``check_subclass`` checks them (``SubclassSpec.strides``)."""
    for a, q in p.inner.items():
        x = getattr(t, a)
        if isinstance(q, SubclassTensorProxy):
            _remember_inner_strides(q, x)
        elif isinstance(q, TensorProxy) and x.layout is torch.strided and all(type(d) is int for d in q._shape):
            remember_stride(q, x)


def _remember_inner_values(jit_ctx, p: SubclassTensorProxy, t: torch.Tensor, root, path: tuple) -> None:
    """The integer inner tensors of subclass input ``t`` (a jagged NestedTensor's offsets and lengths) get a
    :class:`ValueSource`: dispatch that reads their values while tracing gets them, guarded."""
    for a, q in p.inner.items():
        x = getattr(t, a)
        if isinstance(q, SubclassTensorProxy):
            _remember_inner_values(jit_ctx, q, x, root, (*path, a))
        elif isinstance(q, TensorProxy) and type(x) is torch.Tensor and is_ragged_source_candidate(x):
            _remember_values(jit_ctx, q, x, root, (*path, a))


def _remember_values(jit_ctx, p: TensorProxy, t: torch.Tensor, root, path: tuple) -> None:
    def add_guard(value: torch.Tensor):
        with real_execution():  # called in a fake run
            expected = value.detach().clone()
        jit_ctx.add_constraint((check_input_values, root, InputValuesSpec(path, expected)))

    remember_value_source(p, ValueSource(t, add_guard, p.name))


class InputValuesSpec:
    """The values an integer input tensor had when traced (``path``: the attribute names from the input to it, for
    an inner tensor of a subclass input), which dispatch read while tracing: another value is a cache miss."""

    __slots__ = ("path", "expected")

    def __init__(self, path: tuple, expected: torch.Tensor):
        self.path, self.expected = path, expected

    def __repr__(self) -> str:
        where = "".join(f".{a}" for a in self.path)
        return f"InputValuesSpec({where or 'the input'} == {self.expected.tolist()})"

    def __eq__(self, other) -> bool:  # value equality: an on-disk cache entry stores a pickled copy
        return type(other) is InputValuesSpec and other.path == self.path and other.expected.dtype == \
            self.expected.dtype and bool(torch.equal(other.expected.cpu(), self.expected.cpu()))

    __hash__ = None

    def matches(self, t) -> bool:
        for a in self.path:
            t = getattr(t, a, None)
        return isinstance(t, torch.Tensor) and t.shape == self.expected.shape and t.dtype == self.expected.dtype \
            and bool(torch.equal(t.to(self.expected.device), self.expected))


def _check_input_values_impl(t, spec: InputValuesSpec) -> None:
    if not spec.matches(t):
        raise SubclassGuardFailure(
            explain=lambda: f"the values of an integer input that dispatch read while tracing changed ({spec!r})"
        )


check_input_values = subclass_executor.register_operator(
    "check_input_values", meta=lambda t, spec: None, fn=_check_input_values_impl, tags=[prims.OpTags.DONT_DCE],
)


class NestedSizesSpec:
    """Which ragged sizes of an input equal which of the inputs' before it, as when traced: for each pair (own dim,
    index of an earlier input, its dim), whether the nested ints were equal. A dim is None for a plain offsets-like
    input (a 1-D integer tensor, :func:`is_ragged_source_candidate`), whose nested int is the one torch associates
    with the tensor object (none: a NestedTensor built on it makes a new one; the same object passed twice shares
    it). NestedTensors sharing offsets, or built inside on an offsets tensor that is also an input, have equal ragged
    sizes: ``a.shape == b.shape`` and ``a + b`` depend on it."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: tuple):
        self.pairs = pairs

    def __repr__(self) -> str:
        return f"NestedSizesSpec({len(self.pairs)} pairs)"

    def __eq__(self, other) -> bool:  # value equality: an on-disk cache entry stores a pickled copy
        return type(other) is NestedSizesSpec and other.pairs == self.pairs

    __hash__ = None

    def matches(self, t, others) -> bool:
        return all(ragged_sizes_equal(t, d, others[j], e) is equal for d, j, e, equal in self.pairs)


def ragged_sizes_equal(x, d: int | None, y, e: int | None) -> bool:
    """Whether ragged size ``d`` of ``x`` equals ragged size ``e`` of ``y`` (a None dim: the nested int torch
    associates with plain tensor ``x`` itself, the offsets or lengths of NestedTensors; an identical tensor object
    counts as equal even when it has none yet)."""
    if d is None and e is None and x is y:
        return True
    a = x.shape[d] if d is not None else _thunder_internals.registered_nested_int(x)
    b = y.shape[e] if e is not None else _thunder_internals.registered_nested_int(y)
    return a is not None and b is not None and bool(a == b)


def _check_nested_sizes_impl(t, others, spec: NestedSizesSpec) -> None:
    if not spec.matches(t, others):
        raise SubclassGuardFailure(f"the ragged sizes of a {type(t).__name__} input are shared with other inputs "
                                   "differently than when traced")


check_nested_sizes = subclass_executor.register_operator(
    "check_nested_sizes", meta=lambda t, others, spec: None, fn=_check_nested_sizes_impl,
    tags=[prims.OpTags.DONT_DCE],
)


def is_ragged_source_candidate(t: torch.Tensor) -> bool:
    """A plain tensor that could be the offsets or lengths of a jagged NestedTensor: 1-D, of an integer dtype."""
    return t.dim() == 1 and t.layout is torch.strided and not t.dtype.is_floating_point and not t.dtype.is_complex \
        and t.dtype is not torch.bool


def add_nested_sizes_guard(jit_ctx, p: TensorProxy, t: torch.Tensor) -> None:
    """Input ``p`` (value ``t``) has ragged sizes (a jagged NestedTensor), or is a plain offsets-like tensor
    (:func:`is_ragged_source_candidate`): a call whose inputs share ragged sizes differently (NestedTensors with the
    same offsets, or not; an offsets tensor passed next to a NestedTensor built on it, or twice) is a cache miss.

    A plain one gets the nested int eager would give NestedTensors built on it: torch's for the tensor object, or
    the one of an earlier input that is the same object (a new nested int for both), so fake runs share the ragged
    size as eager does. Lengths themselves are not guarded: fake runs know no tensor values, so the trace holds for
    any offsets of the same shape (the inner tensors' shapes are checked)."""
    import weakref

    state = _thunder_internals.jit_state()
    earlier = state.setdefault("ragged_inputs", []) if state is not None else []
    dims = (None,) if not isinstance(p, SubclassTensorProxy) else tuple(p.nested_sizes)
    pairs = []
    for j, (q, ref, q_dims) in enumerate(earlier):
        other = ref()
        for d in dims:
            for e in q_dims:
                equal = other is not None and ragged_sizes_equal(t, d, other, e)
                pairs.append((d, j, e, equal))
                if equal and d is None and e is None and nested_int_of(p) is None:
                    # the same offsets object, unknown to torch yet: one new nested int for both
                    shared = nested_int_of(q)
                    if shared is None:
                        shared = _thunder_internals.new_nested_int()
                        remember_nested_int(q, shared)
                    remember_nested_int(p, shared)
    if not isinstance(p, SubclassTensorProxy):
        remember_nested_int(p, _thunder_internals.registered_nested_int(t))
    if pairs:
        jit_ctx.add_constraint((check_nested_sizes, p, tuple(q for q, _, _ in earlier), NestedSizesSpec(tuple(pairs))))
    earlier.append((p, weakref.ref(t), dims))


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


class ObjectSpec:
    """What a Python object that traced code read from the inputs (an argument, or an attribute or item reached from
    the arguments or the compiled module) was when traced, as far as the trace may depend on it; the prologue checks
    it every call (``check_object``), as dynamo guards the objects it reads:

    * ``"identity"``: the same object (a builtin function, a class, an enum member, ``None``, a dtype; an object passed
      to a native call that has no value equality): the trace may have inlined what it does or is;
    * ``"function"``: a Python function: the same one, or one with the same code, defaults and closure values (the
      interpreter inlined its body);
    * ``"method"``: a method of a Python function bound to the object it was read from (``self.act``): a bound
      method again, of such a function (a method replaced on the class, or shadowed by a function set on the
      instance, is a miss);
    * ``"equal"``: an object of the same type equal (``==``) to a copy taken when traced (an object passed to a native
      call, which may read any of its state, when its type defines value equality);
    * ``"state"``: an object passed to a native call whose type has no value equality, or a list or tuple of such
      objects: the same object (when it is stored where it is read) whose instance state, read recursively through
      its attributes, slots and items (numbers and strings by value; tensors by type; modules, functions and classes
      by identity; other Python objects by their state), is what it was when traced (:func:`state_snapshot`): C code
      can call the object's Python methods (``sum(objs, start)``, ``heapq``, ``range(obj)``) or read its
      ``__dict__`` (``copy.copy``) natively, out of the trace's sight;
    * ``"type"``: an object of the same exact type (any other object): methods and class attributes come from the type,
      and every attribute or item the trace read from it has its own check (numbers, strings, tensors) or guard;
    * ``"length"``: a list or tuple of the same exact type and length, ``"keys"``: a dict of the same exact type with
      the same keys in the same order: each item the trace read has its own check, but a loop over the container
      ran as many times as it had items (without these a longer list ran the shorter list's trace: a silently
      wrong result).
    """

    __slots__ = ("kind", "typ", "value", "where")

    def __init__(self, kind: str, typ: type, value: Any = None, where: str = ""):
        self.kind, self.typ, self.value, self.where = kind, typ, value, where

    def __repr__(self) -> str:
        return f"ObjectSpec({self.kind}, {self.typ.__qualname__})"

    def _resolve(self) -> None:
        # a length/keys guard records the container as it is when the prologue is made (after tracing), which is how
        # the first call's prologue finds it: traced code may have changed it (d["y"] = ..., lst.append(...))
        if type(self.value) is _Pending:
            obj = self.value.obj
            self.value = len(obj) if self.kind == "length" else tuple(obj)

    def matches(self, obj) -> bool:
        self._resolve()
        if self.kind == "identity":
            return obj is self.value
        if self.kind == "function":
            return _same_function(obj, self.value)
        if self.kind == "method":
            return type(obj) is types.MethodType and _same_function(obj.__func__, self.value)
        if type(obj) is not self.typ:
            return False
        if self.kind == "length":
            return len(obj) == self.value
        if self.kind == "keys":
            return tuple(obj) == self.value
        if self.kind == "same":
            return is_same_value(obj, self.value)
        if self.kind == "state":
            return same_state(obj, self.value)
        return self.kind == "type" or _equal_to_snapshot(obj, self.value)

    def expression(self, v: str, const) -> str:
        """An inline Python expression true exactly when :meth:`matches` is (for the fused prologue checks)."""
        self._resolve()
        if self.kind == "identity":
            return f"({v} is {const(self.value)})"
        if self.kind in ("function", "method"):
            return f"{const(_FunctionCheck(self))}({v})"
        if self.kind == "type":
            return f"(type({v}) is {const(self.typ)})"
        if self.kind == "length":
            return f"(type({v}) is {const(self.typ)} and len({v}) == {self.value!r})"
        if self.kind == "keys":
            return f"(type({v}) is {const(self.typ)} and tuple({v}) == {const(self.value)})"
        if self.kind == "same":
            return f"(type({v}) is {const(self.typ)} and {const(is_same_value)}({v}, {const(self.value)}))"
        if self.kind == "state":
            return f"(type({v}) is {const(self.typ)} and {const(_StateCheck(self))}({v}))"
        return f"(type({v}) is {const(self.typ)} and {const(_equal_to_snapshot)}({v}, {const(self.value)}))"

    def explain(self, obj) -> str:
        self._resolve()
        what = f"the {self.where}" if self.where else "an object"
        if self.kind == "identity":
            return f"{what} is {obj!r}, not {self.value!r} (the object the trace was made for)"
        if self.kind == "function":
            return (f"{what} is {obj!r}, not {self.value[0]!r} or a function with its code, defaults and closure "
                    "values (the function the trace was made for)")
        if self.kind == "method":
            return (f"{what} is {obj!r}, not a method of {self.value[0]!r} or of a function with its code, defaults "
                    "and closure values (the method the trace was made for)")
        if type(obj) is not self.typ:
            return f"{what} is a {type(obj).__qualname__}, the trace was made for a {self.typ.__qualname__}"
        if self.kind == "length":
            return f"{what} has {len(obj)} items, the trace was made for {self.value}"
        if self.kind == "keys":
            items = "items in the order" if self.typ in (set, frozenset) else "keys"
            return f"{what} has the {items} {tuple(obj)!r}, the trace was made for {self.value!r}"
        if self.kind == "same":
            return f"{what} is {obj!r}, the trace was made for {self.value!r}"
        if self.kind == "state":
            return f"{what} changed since the trace was made: {state_difference(obj, self.value, self.where or 'it')}"
        return f"{what} is {obj!r}, not equal to {self.value!r} as when traced"


class _StateCheck:
    """A ``"state"`` spec's check in the fused prologue, which also says what changed when a miss is explained
    (``FusedChecks.failure`` calls ``explain``)."""

    __slots__ = ("spec",)

    def __init__(self, spec: ObjectSpec):
        self.spec = spec

    def __call__(self, obj) -> bool:
        return self.spec.matches(obj)

    def explain(self, obj) -> str:
        return self.spec.explain(obj)

    def __repr__(self) -> str:
        return f"<state check of the {self.spec.where or 'object'}>"


class _FunctionCheck(_StateCheck):
    """A ``"function"`` or ``"method"`` spec's check in the fused prologue. Stored on disk (``disk_state``): the
    compiled function itself as such (the entry's key holds its code and closure values; loaded, the check is made
    from the function being compiled then), another function by its importable name (the code compared is that
    function's code when the entry is loaded: the key holds the hash of its module's file; defaults and closure values
    are the traced ones)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<{self.spec.kind} check of the {self.spec.where or 'object'}>"

    def disk_state(self) -> tuple:
        fn, _code, defaults, kwdefaults, cells = self.spec.value
        if self.spec.kind == "function" and self.spec.where == _INPUT_FN_WHERE:
            return self.spec.kind, self.spec.where, _COMPILED_FUNCTION
        return self.spec.kind, self.spec.where, fn, defaults, kwdefaults, cells

    @classmethod
    def from_disk_state(cls, state: tuple) -> "_FunctionCheck":
        if state[2] == _COMPILED_FUNCTION:
            kind, where, _ = state
            fn = _thunder_internals.current_compile_data()[0].fn
            return cls(ObjectSpec(kind, types.FunctionType, _function_snapshot(fn), where))
        kind, where, fn, defaults, kwdefaults, cells = state
        typ = types.MethodType if kind == "method" else types.FunctionType
        return cls(ObjectSpec(kind, typ, (fn, fn.__code__, defaults, kwdefaults, cells), where))


_COMPILED_FUNCTION = "the compiled function"  # (a stored _FunctionCheck of it)


_INPUT_FN_WHERE = "the compiled callable"  # what _describe_provenance says of thunder's INPUT_FN


class _Pending:
    """The container whose length or keys an ``ObjectSpec`` records once the prologue is made."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj


def _function_snapshot(fn: types.FunctionType) -> tuple:
    """``(fn, code, defaults, keyword defaults, closure values)``: what a Python function passed to traced code is, for
    the trace (the interpreter inlines its body): another function object with all of these the same behaves alike
    (a lambda made anew for each call)."""
    cells = tuple(c.cell_contents for c in fn.__closure__ or ())
    defaults = fn.__defaults__
    if defaults and any(_is_mutable_default(d) for d in defaults):
        defaults = tuple(_MutableDefault.of(d) if _is_mutable_default(d) else d for d in defaults)
    return fn, fn.__code__, defaults, fn.__kwdefaults__, cells


def _is_mutable_default(v) -> bool:
    return type(v) in (list, dict, set) or _is_plain_instance(v)


class _MutableDefault:
    """A default value that can change in place (``def f(x, opts={})``, changed between calls): the same object, with
    the state it had when traced (:func:`state_snapshot`; by identity alone past its size limit)."""

    __slots__ = ("obj", "state")

    def __init__(self, obj, state):
        self.obj, self.state = obj, state

    @classmethod
    def of(cls, obj) -> "_MutableDefault":
        return cls(obj, state_snapshot(obj))

    def holds(self, v) -> bool:
        return v is self.obj and (self.state is None or same_state(v, self.state))


def _same_function(obj, snapshot: tuple) -> bool:
    # (the function itself too: its __code__, __defaults__ or closure cells may have been replaced since)
    fn, code, defaults, kwdefaults, cells = snapshot
    if type(obj) is not types.FunctionType or obj.__code__ is not code:
        return False
    if not _same_values(obj.__defaults__ or (), defaults or ()) or obj.__kwdefaults__ != kwdefaults:
        return False
    closure = obj.__closure__ or ()
    try:
        return len(closure) == len(cells) and _same_values(tuple(c.cell_contents for c in closure), cells)
    except ValueError:  # an empty cell
        return False


def _same_values(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(
        y.holds(x) if type(y) is _MutableDefault else x is y or (type(x) in _SCALARS and is_same_value(x, y))
        for x, y in zip(a, b))


_SCALARS = frozenset({int, float, bool, complex, str, bytes, type(None)})


def _equal_to_snapshot(obj, snapshot) -> bool:
    try:
        return bool(obj == snapshot)
    except Exception:  # noqa: BLE001 - a value that cannot be compared is not the one traced
        return False


def _check_object_impl(obj, spec: ObjectSpec) -> None:
    if not spec.matches(obj):
        raise SubclassGuardFailure(explain=lambda: spec.explain(obj))


check_object = subclass_executor.register_operator(
    "check_object", meta=lambda obj, spec: None, fn=_check_object_impl, tags=[prims.OpTags.DONT_DCE]
)

_IDENTITY_TYPES = (
    type, types.FunctionType, types.BuiltinFunctionType, functools.partial, enum.Enum, torch.dtype, torch.layout,
    torch.memory_format, torch._ops.OpOverload, torch._ops.OpOverloadPacket, type(None),
)
# reached from the inputs and checked by thunder itself (numbers, strings, slices, devices: by value; tensors), or
# containers whose items are read (and checked) one by one, or handled by their own guards (modules, proxies)
_CHECKED_ELSEWHERE = (torch.Tensor, int, float, complex, str, slice, torch.device, tuple, list, dict,
                      types.ModuleType, types.CellType, torch.nn.Module)


def _is_bound_method(obj) -> bool:
    # made anew by each attribute read; what it runs is the type's (guarded through its __self__ object)
    if isinstance(obj, (types.MethodType, types.MethodWrapperType)):
        return True
    if isinstance(obj, types.BuiltinMethodType):
        owner = obj.__self__
        return owner is not None and not isinstance(owner, (type, types.ModuleType))
    return False


def object_guard_kind(obj) -> str | None:
    """The kind of :class:`ObjectSpec` an object read from the inputs gets when traced code reaches it, or None when
    something else checks it (see ``_CHECKED_ELSEWHERE``) or it needs no check of its own (a bound method)."""
    from thunder.core.proxies import Proxy

    if isinstance(obj, (_CHECKED_ELSEWHERE, Proxy)):
        return None
    if type(obj) is types.MethodType and type(obj.__func__) is types.FunctionType:
        return "method"  # its function, read from the class (or the instance), was inlined
    if _is_bound_method(obj):
        return None
    if isinstance(obj, _IDENTITY_TYPES):
        return "identity"
    return "type"


@functools.cache
def _module_machinery_names() -> frozenset:
    """The attributes ``nn.Module`` itself has (class and instance: ``_parameters``, ``_compiled_call_impl``,
    ``training``, ...): read by torch's module machinery on every module call, not by the model's code."""
    return frozenset(dir(torch.nn.Module)) | frozenset(vars(torch.nn.Module()))


def is_guardable_provenance(record, *, globals_too: bool = False) -> bool:
    """Whether an object with provenance ``record`` (one the prologue can unpack) is one traced code read from the
    arguments or the compiled module's attributes, as opposed to what the interpreter read on its way: dunder
    attributes (``__func__``, ``__dict__``, ``__globals__``: how methods, globals and closures are resolved; the
    object they come from is guarded, or they are not inputs) and ``nn.Module``'s own machinery attributes. An
    object reached as a bound method's ``__self__`` is guarded (a method passed as an argument). ``globals_too``: a
    function's ``__globals__`` counts as an input (for lists, tuples and dicts read from module globals: their sizes
    and keys are guarded, and changes the traced code makes to them reach the caller's object)."""
    import dis

    for inp in record.inputs:
        if not is_guardable_provenance(inp, globals_too=globals_too):
            return False
    inst = record.inst.opname if isinstance(record.inst, dis.Instruction) else getattr(record.inst, "name", None)
    if inst == "LOAD_ATTR" and len(record.inputs) == 2:
        name = getattr(record.inputs[1], "value", None)
        if not isinstance(name, str) or name in _module_machinery_names():
            return False
        if name.startswith("__") and name.endswith("__") and name != "__self__":
            return globals_too and name == "__globals__"
    return True


def _describe_provenance(record) -> str:
    """``args[1].cfg``-like text for a provenance record (for guard failure messages)."""
    import dis

    inst = record.inst.opname if isinstance(record.inst, dis.Instruction) else getattr(record.inst, "name", "")
    if inst == "INPUT_ARGS":
        return "args"
    if inst == "INPUT_KWARGS":
        return "kwargs"
    if inst == "INPUT_FN":
        return _INPUT_FN_WHERE
    if inst in ("LOAD_ATTR", "BINARY_SUBSCR") and len(record.inputs) == 2:
        base, key = record.inputs
        k = getattr(key, "value", "?")
        base_text = _describe_provenance(base)
        if inst == "LOAD_ATTR":
            return f"{base_text}.{k}" if base_text != _INPUT_FN_WHERE else f"module attribute {k}"
        return f"{base_text}[{k!r}]"
    return "input"


_guarded_object_names = itertools.count()


def guard_input_object(obj, provenance) -> None:
    """Traced code reached ``obj`` from the inputs (its ``provenance`` is one the prologue can unpack): a call where it
    is another object, one of another type, or (after :func:`guard_object_by_value`) another value is a cache miss.
    One guard per object and trace; objects reached only on the interpreter's way (see
    :func:`is_guardable_provenance`) and values thunder checks itself get none."""
    from thunder.core.proxies import AnyProxy

    state = _thunder_internals.jit_state()
    jit_ctx = _thunder_internals.jit_context()
    if state is None or jit_ctx is None:
        return
    # (a path the prologue unpacks never ends at a marked key, which is neither an int nor a str: no walk for those)
    rooted = None if _thunder_internals.is_unpackable_provenance(provenance) else \
        _thunder_internals.constant_rooted_path(provenance)
    if rooted is not None:
        _guard_constant_path(obj, *rooted, state, jit_ctx)
        return
    # every value read from the inputs, by its provenance record: the holders of later attribute reads
    seen = state.setdefault("input_values", {})
    seen[id(provenance)] = (provenance, obj)
    if type(obj) in (list, tuple, dict, set, frozenset):
        _guard_container_size(obj, provenance, state, jit_ctx)
        return
    kind = object_guard_kind(obj)
    if kind is None or not is_guardable_provenance(provenance):
        return
    guarded = state.setdefault("object_guards", {})
    if id(obj) in guarded:
        _guard_another_path(obj, provenance, guarded[id(obj)][1], state, jit_ctx)
        return
    stable = _is_stored(obj, provenance, seen)
    if kind == "identity" and not stable and not isinstance(obj, _SINGLETON_TYPES):
        kind = "type"  # made anew by each read (a property): the same object will not come again
    spec = _object_spec(obj, kind, _describe_provenance(provenance))
    guarded[id(obj)] = (obj, spec, stable)  # the object is kept for the trace's lifetime, so its id stays its own
    state.setdefault("object_guard_paths", {})[id(obj)] = {provenance}
    name = f"guarded_object{next(_guarded_object_names)}"
    jit_ctx.add_constraint((check_object, AnyProxy(obj, name=name, history=provenance), spec))


def _object_spec(obj, kind: str, where: str) -> ObjectSpec:
    """The spec of an object guarded by ``kind`` (``"identity"`` or ``"type"``): a Python function by identity becomes
    a ``"function"`` spec (the same code, defaults and closure values)."""
    value = obj if kind == "identity" else None
    if kind == "method":
        try:
            return ObjectSpec(kind, types.MethodType, _function_snapshot(obj.__func__), where)
        except ValueError:  # an empty closure cell: by type only (as before this kind)
            return ObjectSpec("type", type(obj), None, where)
    if kind == "identity" and type(obj) is types.FunctionType:
        try:
            kind, value = "function", _function_snapshot(obj)
        except ValueError:  # an empty closure cell: the object itself
            pass
    return ObjectSpec(kind, type(obj), value, where)


def _check_attribute_absent_impl(obj, name: str) -> None:
    if hasattr(obj, name):
        raise SubclassGuardFailure(f"the attribute {name!r} that the trace found missing on a {type(obj).__name__} is "
                                   f"there now")


check_attribute_absent = subclass_executor.register_operator(
    "check_attribute_absent", meta=lambda obj, name: None, fn=_check_attribute_absent_impl,
    tags=[prims.OpTags.DONT_DCE],
)


def guard_attribute_absent(obj, provenance, name: str) -> None:
    """Traced code looked for attribute ``name`` of ``obj`` (read from the inputs by ``provenance``) and did not find it
    (``getattr(obj, name, default)``, ``hasattr``, an ``AttributeError`` it caught): the trace took the default's
    path, so a call where ``obj`` has the attribute is a cache miss (it reused the stale trace: a silently wrong
    result). One check per object path and name; a jitted module is checked on itself, not its ``ThunderModule``."""
    from thunder.core.proxies import AnyProxy

    state = _thunder_internals.jit_state()
    jit_ctx = _thunder_internals.jit_context()
    if state is None or jit_ctx is None or type(name) is not str or (name.startswith("__") and name.endswith("__")):
        return  # (dunders come from the type, which other checks guard)
    if isinstance(obj, torch.Tensor) or not hasattr(obj, "__dict__"):
        # an object without an instance dict gains no attribute (its type, guarded elsewhere, decides); tensors have
        # their own proxies in the prologue (an attribute set on an input tensor later: see docs/limits.md)
        return
    if not _thunder_internals.is_unpackable_provenance(provenance) or not is_guardable_provenance(provenance):
        return
    provenance = _thunder_internals.hooked_module_provenance(obj, provenance)
    seen = state.setdefault("absent_attributes", set())
    if (provenance, name) in seen:
        return
    seen.add((provenance, name))
    holder = AnyProxy(obj, name=f"attribute_holder{next(_guarded_object_names)}", history=provenance)  # (any name)
    jit_ctx.add_constraint((check_attribute_absent, holder, name))


class TorchStateQuery:
    """A getter of torch's global state that traced code called, with its plain arguments (see
    :func:`guard_torch_state_query`)."""

    __slots__ = ("fn", "args")

    def __init__(self, fn, args: tuple):
        self.fn, self.args = fn, args

    def __repr__(self) -> str:
        module = "torch" if self.fn.__module__ == "torch" else "torch._C"
        return f"{module}.{self.fn.__name__}({', '.join(map(repr, self.args))})"

    def disk_state(self) -> tuple:  # thunder_subclass.disk_cache: the getter by its module and name
        return self.fn.__module__, self.fn.__name__, self.args

    @classmethod
    def from_disk_state(cls, state: tuple) -> "TorchStateQuery":
        import importlib

        module, name, args = state
        fn = getattr(importlib.import_module(module), name)
        if not _thunder_internals.is_torch_state_query(fn, args):
            raise LookupError(f"{module}.{name} is not a getter of torch's state here")
        return cls(fn, args)


def _check_torch_state_impl(query: TorchStateQuery, expected) -> None:
    value = query.fn(*query.args)
    if not is_same_value(value, expected):
        raise SubclassGuardFailure(explain=lambda: f"{query!r} is {value!r}, the trace was made for {expected!r}")


check_torch_state = subclass_executor.register_operator(
    "check_torch_state", meta=lambda query, expected: None, fn=_check_torch_state_impl, tags=[prims.OpTags.DONT_DCE]
)


def guard_torch_state_query(fn, args: tuple, result) -> None:
    """Traced code read ``result`` from torch's global state (``fn(*args)``, a ``torch._C`` getter such as the one
    behind ``torch.are_deterministic_algorithms_enabled()``): the trace holds it as a constant, so the prologue
    checks it again on every call (a changed setting is a cache miss and a new trace, as torch.compile's global-state
    guard). Once per query and trace."""
    jit_ctx = _thunder_internals.jit_context()
    state = _thunder_internals.jit_state()
    if jit_ctx is None or state is None:
        return
    done = state.setdefault("torch_state_guards", set())
    key = (fn, args)
    if key in done:
        return
    done.add(key)
    jit_ctx.add_constraint((check_torch_state, TorchStateQuery(fn, args), result))


class ConstantPath:
    """Where a value traced code read from a dict key object sits: the key object (which the prologue holds, as thunder
    wraps dict keys as constants) and the attribute reads and subscripts from it (``(".", name)`` / ``("[]", index)``
    steps, see :func:`thunder_subclass._thunder_internals.constant_rooted_path`)."""

    __slots__ = ("root", "path")

    def __init__(self, root, path: tuple):
        self.root, self.path = root, path

    def follow(self):
        obj = self.root
        for kind, name in self.path:
            obj = getattr(obj, name) if kind == "." else obj[name]
        return obj

    def __repr__(self) -> str:
        root = f"<dict key {type(self.root).__qualname__}>"
        path = self.path
        if isinstance(self.root, _thunder_internals.SetItems) and path and path[0][0] == "[]":
            root, path = f"<item {path[0][1]} of a set>", path[1:]
        return root + "".join(f".{name}" if kind == "." else f"[{name!r}]" for kind, name in path)


def _check_constant_path_impl(where: ConstantPath, spec: ObjectSpec) -> None:
    try:
        obj = where.follow()
    except Exception as e:  # noqa: BLE001 - the attribute or item is gone: not the object the trace was made for
        error = e  # (`e` itself is unbound when the except clause ends, before explain runs)
        raise SubclassGuardFailure(
            explain=lambda: f"{spec.where} could not be read ({type(error).__name__}: {error})") from e
    if not spec.matches(obj):
        raise SubclassGuardFailure(explain=lambda: spec.explain(obj))


check_constant_path = subclass_executor.register_operator(
    "check_constant_path", meta=lambda where, spec: None, fn=_check_constant_path_impl, tags=[prims.OpTags.DONT_DCE]
)


def _guard_constant_path(obj, root, path: tuple, state, jit_ctx) -> None:
    """Guard ``obj``, read by traced code from the dict key object ``root`` along ``path``: thunder inlines such values
    as constants (it wraps dict keys as constants), so without this a changed ``k.n`` reused the trace made with the
    old value. Numbers, strings and other scalars are checked by value (:func:`is_same_value`), lists/tuples by
    length and dicts by keys (each item read has its own guard), other objects as :func:`guard_input_object` guards
    them (identity or type); a tensor cannot be checked this way (a typed error)."""
    from thunder.core.proxies import Proxy, TensorProxy

    where = ConstantPath(root, path)
    if isinstance(obj, (torch.Tensor, TensorProxy)):
        # raised here, thunder would wrap it in an InterpreterError: the first operation on the value raises it
        error = UnsupportedTracingError(
            f"traced code read the tensor {where!r} from an object used as a dict key (at "
            f"{format_location(*_thunder_internals.source_location())}); thunder_subclass cannot pass such a tensor to "
            "the compiled program. Store the tensor as a value of the dict, or pass it as an argument."
        )
        if isinstance(obj, TensorProxy):
            mark_protocol_error(obj, error)
        return
    if isinstance(obj, Proxy):
        return
    done = state.setdefault("constant_path_guards", set())
    key = (id(root), path)
    if key in done:
        return
    if type(obj) in _SCALARS or isinstance(obj, (slice, torch.device)):
        spec = ObjectSpec("same", type(obj), obj, repr(where))
    elif type(obj) in (list, tuple, dict):
        spec = ObjectSpec("keys" if type(obj) is dict else "length", type(obj), _Pending(obj), repr(where))
    else:
        kind = object_guard_kind(obj)
        if kind is None:
            return
        spec = _object_spec(obj, kind, repr(where))
    done.add(key)
    # (the constraint holds the root for the trace's lifetime, so the id in ``done`` stays the root's own)
    jit_ctx.add_constraint((check_constant_path, where, spec))


def _guard_another_path(obj, provenance, spec: ObjectSpec, state, jit_ctx) -> None:
    """``obj``, guarded, is read again by another path (``f(x, (o, o))``: ``t[0]`` and ``t[1]``): the object at that
    path is checked too, against the same spec (its later upgrades to value or identity included); without this a
    call with another object there reused the trace (``t[0] is t[1]`` answered as traced)."""
    from thunder.core.proxies import AnyProxy

    if not is_guardable_provenance(provenance):
        return
    paths = state.setdefault("object_guard_paths", {}).setdefault(id(obj), set())
    try:
        if provenance in paths:
            return
        paths.add(provenance)
    except Exception:  # noqa: BLE001 - a record holding a value that cannot be hashed or compared: guard it anyway
        pass
    name = f"guarded_object{next(_guarded_object_names)}"
    jit_ctx.add_constraint((check_object, AnyProxy(obj, name=name, history=provenance), spec))



def _guard_container_size(obj, provenance, state, jit_ctx) -> None:
    """A list, tuple, dict, set or frozenset read from the inputs: its length (dict: keys in order; set: items in
    iteration order, which a loop over it follows) is guarded, once per object and trace (see :class:`ObjectSpec`
    ``"length"``/``"keys"``). The call's own ``args``/``kwargs`` are bound by thunder."""
    import dis

    from thunder.core.proxies import AnyProxy

    inst = provenance.inst.opname if isinstance(provenance.inst, dis.Instruction) else \
        getattr(provenance.inst, "name", None)
    # (module globals too: a trace that iterated or changed a global list or dict depends on its size and keys; not a
    # module's globals dict itself, which the interpreter reads to look up every global name)
    if inst in ("INPUT_ARGS", "INPUT_KWARGS"):
        return
    if not is_guardable_provenance(provenance, globals_too=True):
        # (a container reached through nn.Module's machinery, ``self._modules['c'].stats``: not guarded here, but
        # what a trace that fails changed in it is undone, or the eager run after the failure changes it again; and
        # what a trace changed in it is put back and written by the epilogue, as for input containers: left changed,
        # the trace's own prologue read the changed value and rejected the call it was made from)
        if type(obj) in (list, dict) and _is_held_container(provenance):
            before = list(obj.items()) if type(obj) is dict else list(obj)
            _thunder_internals.undo_if_trace_fails(functools.partial(_restore_container, obj, before))
            if _thunder_internals.is_unpackable_provenance(provenance) and id(obj) not in state.setdefault(
                    "held_containers", set()):
                state["held_containers"].add(id(obj))
                state.setdefault("input_containers", []).append(
                    (obj, provenance, before, _thunder_internals.source_location()))
        return
    if inst == "LOAD_ATTR" and getattr(provenance.inputs[1], "value", None) == "__globals__":
        return
    guarded = state.setdefault("object_guards", {})
    if id(obj) in guarded:
        return
    if type(obj) in (list, dict):
        # as it is now, for write_back_input_containers at the end of the trace, and to restore if the trace fails
        before = list(obj.items()) if type(obj) is dict else list(obj)
        state.setdefault("input_containers", []).append((obj, provenance, before, _thunder_internals.source_location()))
        _thunder_internals.undo_if_trace_fails(functools.partial(_restore_container, obj, before))
    spec = ObjectSpec("length" if type(obj) in (list, tuple) else "keys", type(obj), _Pending(obj),
                      _describe_provenance(provenance))
    guarded[id(obj)] = (obj, spec, True)
    name = f"guarded_object{next(_guarded_object_names)}"
    jit_ctx.add_constraint((check_object, AnyProxy(obj, name=name, history=provenance), spec))


# constants an epilogue can hold as literals in a container's new contents
_LITERAL_TYPES = (int, float, bool, str, type(None))


def write_back_input_containers() -> None:
    """At the end of a trace: an input list or dict (an argument, or one reached from the arguments or the module, read
    by traced code) that the traced code changed (``d["y"] = x * 2``, ``lst.append(t)``, ``lst[0] = t``, ``d.update``,
    ``del``, ``pop``, ...) holds the trace's proxies now. It is put back as it was (the prologue of the first call sees
    the caller's object as passed), and the epilogue gives the caller's object its new contents every call, with the
    computed tensors (``write_back_container``), as eager leaves them. A new item that is neither a tensor, a number
    proxy, a plain constant nor an item the container had raises ``UnsupportedTracingError``."""
    from thunder.core.proxies import Proxy

    state = _thunder_internals.jit_state()
    if state is None:
        return
    for obj, provenance, before, location in state.get("input_containers", ()):
        is_dict = type(obj) is dict
        after = list(obj.items()) if is_dict else list(obj)
        if len(after) == len(before) and all(
            (a[0] is b[0] and a[1] is b[1]) if is_dict else a is b for a, b in zip(after, before)
        ):
            continue
        positions = {}  # id of an item (dict: key or value) the container had -> its position then
        for i, item in enumerate(before):
            for part, v in ((0, item[0]), (1, item[1])) if is_dict else ((1, item),):
                positions.setdefault((part, id(v)), i)
        values: list = []

        def source(v, part):
            i = positions.get((part, id(v))) if part is not None else None
            if i is not None:
                return ("o", i)
            if isinstance(v, Proxy):
                values.append(v)
                return ("v", len(values) - 1)
            if type(v) in _LITERAL_TYPES:
                return ("c", v)
            if type(v) in (list, tuple):  # made in the traced code: made anew each call
                return ("list" if type(v) is list else "tuple", tuple(source(i, None) for i in v))
            if type(v) is dict:
                return ("dict", tuple((source(k, None), source(i, None)) for k, i in v.items()))
            from thunder_subclass.errors import UnsupportedTracingError

            raise UnsupportedTracingError(
                f"the compiled function stores a {type(v).__qualname__} made in the compiled code into "
                f"{_describe_provenance(provenance)}, a {type(obj).__name__} it was passed ("
                f"{_where_read(location)}): thunder_subclass gives the caller's containers the tensors, numbers, "
                "strings and lists, tuples and dicts of them stored into them, as eager does, but not other objects "
                "made in the compiled code. Return the object instead and store it outside the compiled function."
            )

        plan = tuple((source(k, 0), source(v, 1)) for k, v in after) if is_dict else tuple(source(v, 1) for v in after)
        _restore_container(obj, before)
        _thunder_internals.call_in_epilogue(write_back_container, provenance, plan, *values)
        if id(obj) in state.get("held_containers", ()):
            # (a container a submodule holds is not guarded by its length or keys on reading; the plan rests on them)
            from thunder.core.proxies import AnyProxy

            spec = ObjectSpec("keys" if is_dict else "length", type(obj), _Pending(obj), _describe_provenance(provenance))
            name = f"guarded_object{next(_guarded_object_names)}"
            _thunder_internals.jit_context().add_constraint(
                (check_object, AnyProxy(obj, name=name, history=provenance), spec))


def _is_held_container(provenance) -> bool:
    """Whether ``provenance`` ends in an item or a non-dunder attribute (a container an object holds, not a
    ``__dict__`` or ``__globals__`` the interpreter reads on its way)."""
    import dis

    inst = provenance.inst.opname if isinstance(provenance.inst, dis.Instruction) else \
        getattr(provenance.inst, "name", None)
    if inst == "BINARY_SUBSCR":
        return True
    name = getattr(provenance.inputs[1], "value", None) if inst == "LOAD_ATTR" and len(provenance.inputs) == 2 else None
    return isinstance(name, str) and not (name.startswith("__") and name.endswith("__"))


def _restore_container(obj, before: list) -> None:
    if type(obj) is dict:
        obj.clear()
        obj.update(before)
    else:
        obj[:] = before


def _where_read(location: tuple) -> str:
    """``read at file:line``, or for an argument (read as the frame starts: no line) the compiled function's own
    ``def`` line."""
    if location[0] is not None:
        return f"read at {format_location(*location)}"
    import inspect

    fn = getattr(_thunder_internals.current_compile_data()[0], "fn", None)
    fn = getattr(fn, "forward", fn) if isinstance(fn, torch.nn.Module) else fn
    code = getattr(inspect.unwrap(fn), "__code__", None) if fn is not None else None
    if code is None:
        return "an argument"
    return f"an argument of {code.co_name} at {format_location(code.co_filename, code.co_firstlineno)}"


def _write_back_container_impl(obj, plan: tuple, *values) -> None:
    def value(src, old, part):
        kind, x = src
        if kind == "o":
            return old[x][part] if part is not None else old[x]
        if kind == "v":
            return values[x]
        if kind == "list" or kind == "tuple":
            items = [value(i, old, part) for i in x]
            return items if kind == "list" else tuple(items)
        if kind == "dict":
            return {value(k, old, part): value(i, old, part) for k, i in x}
        return x

    if type(obj) is dict:
        old = list(obj.items())
        new = [(value(k, old, 0), value(v, old, 1)) for k, v in plan]
        obj.clear()
        obj.update(new)
    else:
        old = list(obj)
        obj[:] = [value(v, old, None) for v in plan]


# in the epilogue: the caller's input list/dict gets the contents the traced code left in it, each item taken from its
# old contents ("o", position), the computation's results ("v", index into values) or a literal ("c", value)
write_back_container = subclass_executor.register_operator(
    "write_back_container", meta=lambda obj, plan, *values: None, fn=_write_back_container_impl,
    tags=[prims.OpTags.DONT_DCE]
)


# descriptors' __get__ that only bind a function to the object (the interpreter's method lookup runs them natively)
_BINDING_GETS = frozenset({
    types.FunctionType.__get__, types.MethodDescriptorType.__get__, types.WrapperDescriptorType.__get__,
    types.ClassMethodDescriptorType.__get__, staticmethod.__get__, classmethod.__get__,
})


def guard_native_call_arguments(fn, wrapped_args: tuple) -> None:
    """The interpreter runs ``fn`` natively with ``wrapped_args``: each guarded input object among them is guarded
    by value from now on (:func:`guard_object_by_value`), except for the descriptors that bind methods."""
    try:
        if fn in _BINDING_GETS:
            return
    except TypeError:  # unhashable callable
        pass
    state = _thunder_internals.jit_state()
    guarded = state.get("object_guards") if state is not None else None
    if not guarded:
        return
    by_identity = fn is id
    try:
        reads_state = fn not in _TYPE_ONLY_NATIVES
        reads_dict = fn in _DICT_READERS
    except TypeError:  # unhashable callable
        reads_state, reads_dict = True, False
    values = [getattr(a, "value", a) for a in wrapped_args]
    # a Python function among the arguments (a key=, a callback) may be called with any of the others natively
    callback = reads_state and any(isinstance(v, _PYTHON_CALLABLES) for v in values)
    for value in values:
        if id(value) in guarded:
            if by_identity:  # id(obj) is the object's identity, whatever its value equality
                guard_object_by_identity(value)
            else:
                guard_object_by_value(value, reads_state and (reads_dict or callback or _may_call_back(value)))
        if reads_state and type(value) in (list, tuple, dict) and len(value) <= _STATE_LIMIT:
            # a container made in the traced code (list(objs), [a, b]) holding objects read from the inputs
            for item in (value.values() if type(value) is dict else value):
                if id(item) in guarded:
                    guard_object_by_value(item, callback or _may_call_back(item))


# natives whose answer depends only on the type or identity of their arguments: no state of theirs is read
_TYPE_ONLY_NATIVES = frozenset({isinstance, issubclass, type, callable, object.__init__, object.__new__,
                                object.__init_subclass__, object.__eq__, object.__ne__, object.__hash__})
# natives that read an object's __dict__ without calling its methods (copy.copy, copy.deepcopy, pickle's reduce)
_DICT_READERS = frozenset({object.__reduce_ex__, object.__reduce__, object.__getstate__})
_PYTHON_CALLABLES = (types.FunctionType, types.MethodType, functools.partial)
# the methods of the protocols C code calls (comparisons, arithmetic, hashing, iteration, conversion, formatting,
# copying): an object whose class defines one in Python may run Python code inside a native call
_PROTOCOL_METHODS = frozenset(
    f"__{name}__" for name in (
        "lt le gt ge eq ne hash bool len iter next getitem contains index int float complex call format str repr "
        "reduce reduce_ex getstate copy deepcopy getattr getattribute neg pos abs invert round trunc floor ceil "
        "add sub mul matmul truediv floordiv mod divmod pow lshift rshift and or xor "
        "radd rsub rmul rmatmul rtruediv rfloordiv rmod rdivmod rpow rlshift rrshift rand ror rxor").split()
)


def _may_call_back(obj) -> bool:
    """Whether C code given ``obj`` may run Python code of it: a class of its type (a Python class) defines a protocol
    method, or it is a list, tuple or dict holding such an object."""
    if type(obj) in (list, tuple, dict):
        items = obj.values() if type(obj) is dict else obj
        return len(obj) <= _STATE_LIMIT and any(_may_call_back(i) for i in items)
    return _type_may_call_back(type(obj))


@functools.lru_cache(maxsize=1024)
def _type_may_call_back(cls: type) -> bool:
    return any(c.__flags__ & _HEAPTYPE and not _PROTOCOL_METHODS.isdisjoint(vars(c)) for c in cls.__mro__)


def guard_lookaside_arguments(wrapped_args: tuple) -> None:
    """A lookaside runs a function natively with ``wrapped_args`` (DTensor's ``from_local`` / ``redistribute``: the
    device mesh and placements): each argument that is not a tensor, read from the inputs or globals (a provenance
    the prologue can unpack), and each such item of a list or tuple the traced code built, is checked by equality with
    a copy taken now (by identity without value equality). Globals are not guarded inputs otherwise, so a new
    placement bound to the same global reused the trace made for the old one."""
    from thunder.core.interpreter import WrappedValue
    from thunder.core.proxies import AnyProxy, Proxy

    state = _thunder_internals.jit_state()
    jit_ctx = _thunder_internals.jit_context()
    if state is None or jit_ctx is None:
        return
    done = state.setdefault("lookaside_argument_guards", set())

    def visit(w, depth: int) -> None:
        if not isinstance(w, WrappedValue) or depth > 2:
            return
        value, provenance = w.value, w.provenance
        if isinstance(value, (torch.Tensor, Proxy)) or type(value) in _SCALARS:
            return
        if not _thunder_internals.is_unpackable_provenance(provenance):
            if type(value) in (list, tuple):  # built in the traced code: its items
                for item in getattr(w, "item_wrappers", None) or ():
                    visit(item, depth + 1)
            return
        if id(value) in done:
            return
        snapshot = _value_snapshot(value)
        spec = ObjectSpec("equal", type(value), snapshot, _describe_provenance(provenance)) if snapshot is not None \
            else ObjectSpec("identity", type(value), value, _describe_provenance(provenance))
        done.add(id(value))
        name = f"guarded_object{next(_guarded_object_names)}"
        jit_ctx.add_constraint((check_object, AnyProxy(value, name=name, history=provenance), spec))

    for w in wrapped_args:
        visit(w, 0)


def guard_compared_objects(op: str, a: Any, b: Any) -> None:
    """Traced code compares ``a`` and ``b`` (``op``: ``"is"``, ``"=="`` for any rich comparison, ``"in"`` for
    ``a in b``), which the interpreter does natively: the trace's branch depends on the answer, so each guarded input
    object among them is guarded by what the answer depends on. ``is`` depends on identity: where both operands have
    the same type (else the type guards decide it), each is guarded by identity. ``==`` (an object without ``__eq__``
    compares by identity) and ``in`` (hash and ``==`` of the item; the container's items when it is an input): by
    value, else identity (:func:`guard_object_by_value`). Without these, ``f(x, marker)`` then ``f(x, object())``
    reused the first trace of ``x * 2 if token is marker else x``."""
    state = _thunder_internals.jit_state()
    guarded = state.get("object_guards") if state is not None else None
    if not guarded:
        return
    if op == "is":
        if type(a) is not type(b):
            return
        for v in (a, b):
            if id(v) in guarded:
                guard_object_by_identity(v)
        return
    for v in (a, b):
        if id(v) in guarded:
            guard_object_by_value(v)


def guard_object_by_identity(obj) -> None:
    """``obj``, guarded by :func:`guard_input_object`, is one whose identity the trace depends on (``is``, ``id``):
    from now on it must be the same object (kept alive by the guard, so its id stays its own)."""
    state = _thunder_internals.jit_state()
    entry = state.get("object_guards", {}).get(id(obj)) if state is not None else None
    if entry is None or entry[1].kind == "identity":
        return
    spec = entry[1]
    spec.kind, spec.value = "identity", obj


def guard_object_by_value(obj, by_state: bool = False) -> None:
    """``obj``, guarded by :func:`guard_input_object`, was passed to a native function (one thunder runs, not
    interprets), whose result may depend on any of its state: from now on it must equal a copy taken now (when its
    type has value equality), else be the same object. With ``by_state`` (a native function that may call the object's
    Python methods or read its ``__dict__``): else be the same object with the same instance state
    (:func:`state_snapshot`), or, for a list or tuple, hold items with the same state."""
    state = _thunder_internals.jit_state()
    entry = state.get("object_guards", {}).get(id(obj)) if state is not None else None
    if entry is not None and entry[1].kind == "length":
        # a list or tuple a native function reads whole: its items, not just its length (by value, else by the
        # state of each item)
        snapshot = _value_snapshot(obj)
        if snapshot is not None:
            entry[1].kind, entry[1].value = "equal", snapshot
        elif by_state:
            snapshot = state_snapshot(obj, identity=False)
            if snapshot is not None:
                entry[1].kind, entry[1].value = "state", snapshot
        return
    if entry is None or entry[1].kind not in ("type", "identity"):
        return
    _, spec, stable = entry
    if spec.kind == "identity":
        # the trace depends on which object it is (``is``, or no value equality): the same object, now also with the
        # same state; never an equal copy instead
        if by_state and type(obj) is spec.typ and _is_plain_instance(obj):
            snapshot = state_snapshot(obj, identity=True)
            if snapshot is not None:
                spec.kind, spec.value = "state", snapshot
        return
    snapshot = _value_snapshot(obj)
    if snapshot is not None:
        spec.kind, spec.value = "equal", snapshot
        return
    snapshot = state_snapshot(obj, identity=stable) if by_state else None
    if snapshot is not None:
        spec.kind, spec.value = "state", snapshot
    elif stable:
        spec.kind, spec.value = "identity", obj
    # else: made anew by each read and without value equality: its type stays what is guarded


# members of these types are the same object whenever they are equal (None, enum members, dtypes, ...)
_SINGLETON_TYPES = (type(None), enum.Enum, torch.dtype, torch.layout, torch.memory_format)


def _is_stored(obj, provenance, seen: dict) -> bool:
    """Whether ``obj`` is stored where ``provenance`` reads it (an argument, an item, an instance attribute or slot,
    a bound method's ``__self__``), so that the same object is read again next call if nothing replaced it; False for
    a value a property or ``__getattr__`` makes at each read."""
    import inspect

    name = getattr(provenance.inst, "name", None)
    if name in ("INPUT_ARGS", "INPUT_KWARGS", "BINARY_SUBSCR", "INPUT_FN"):  # (INPUT_FN: the compiled function)
        return True
    if name != "LOAD_ATTR" or len(provenance.inputs) != 2:
        return False
    base, attr = provenance.inputs[0], getattr(provenance.inputs[1], "value", None)
    if attr == "__self__":
        return True
    if getattr(base.inst, "name", None) == "INPUT_FN":
        holder = getattr(_thunder_internals.current_compile_data()[0], "fn", None)
    else:
        holder = seen.get(id(base), (None, None))[1]
    if holder is None or not isinstance(attr, str):
        return False
    if getattr(holder, "__dict__", {}).get(attr, _MISSING) is obj:
        return True
    return isinstance(inspect.getattr_static(type(holder), attr, None), types.MemberDescriptorType) and \
        getattr(holder, attr, _MISSING) is obj


_STATE_LIMIT = 256  # the most values a state snapshot holds; a bigger object keeps the identity guard
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement


def _is_plain_instance(obj) -> bool:
    """Whether ``obj``'s state is all in its ``__dict__`` and slots: every class of its type is a Python class (or
    ``object``, or ``types.SimpleNamespace``), and it is none of the objects compared by identity (tensors, modules,
    functions, classes)."""
    if isinstance(obj, (torch.Tensor, torch.nn.Module, type, types.FunctionType, types.ModuleType, enum.Enum)):
        return False
    return all(c is object or c is types.SimpleNamespace or c.__flags__ & _HEAPTYPE for c in type(obj).__mro__)


def _slot_names(cls: type) -> tuple:
    names = []
    for c in cls.__mro__:
        slots = c.__dict__.get("__slots__", ())
        names += [slots] if isinstance(slots, str) else [n for n in slots if n not in ("__dict__", "__weakref__")]
    return tuple(names)


class _TooBig(Exception):
    pass


_NO_SLOT = object()


def state_snapshot(obj, identity: bool = True):
    """A record of ``obj``'s state for :func:`same_state`, or None when it holds more than ``_STATE_LIMIT`` values:
    numbers, strings and ``None`` by value; lists, tuples, dicts, sets by their items (in order); instances of Python
    classes (:func:`_is_plain_instance`) by their attributes and slots, and ``obj`` itself also by identity with
    ``identity``; tensors by type only (those the trace reads have guards of their own; a cache's tensors are new
    every call); anything else (modules, functions, classes, C objects) by identity."""
    count = [0]
    active: set = set()

    def snap(v, top=False):
        count[0] += 1
        if count[0] > _STATE_LIMIT:
            raise _TooBig
        t = type(v)
        if t in _SCALARS:
            return ("v", t, v)
        if isinstance(v, torch.Tensor):  # the tensors the trace reads have their own guards; values change per call
            return ("t", t)
        if id(v) in active:  # a cycle: the object itself
            return ("i", v)
        if t in (list, tuple, set, frozenset, dict) or _is_plain_instance(v):
            active.add(id(v))
            try:
                if t is dict:
                    return ("d", t, tuple((snap(k), snap(i)) for k, i in v.items()))
                if t in (list, tuple, set, frozenset):
                    return ("c", t, tuple(snap(i) for i in v))
                fields = tuple((name, snap(val)) for name, val in getattr(v, "__dict__", {}).items())
                slots = tuple((name, snap(getattr(v, name, _NO_SLOT))) for name in _slot_names(t))
                return ("o", t, v if identity and top else None, fields, slots)
            finally:
                active.discard(id(v))
        return ("i", v)

    try:
        return snap(obj, top=True)
    except _TooBig:
        return None


def same_state(v, s) -> bool:
    """Whether ``v`` has the state recorded by :func:`state_snapshot` (see there). Run by the prologue on every call:
    no message, nor the paths of the values it compares, is built."""
    return state_difference(v, s, None) is None


def state_difference(v, s, path: str | None) -> str | None:
    """None when ``v`` has the state recorded in ``s``, else what differs first (``it.cfg.n is 3, the trace was made
    for 2``), ``path`` naming ``v`` (None: the paths of nested values are not built, for :func:`same_state`)."""
    kind, t = s[0], s[1]
    if kind == "i":
        return None if v is t else f"{path} is another object"
    if kind == "t":
        if type(v) is t:
            return None
        return f"{path} is a {type(v).__qualname__}, the trace was made for a {t.__qualname__}"
    if type(v) is not t:
        return f"{path} is a {type(v).__qualname__}, the trace was made for a {t.__qualname__}"
    if kind == "v":
        return None if is_same_value(v, s[2]) else f"{path} is {v!r}, the trace was made for {s[2]!r}"
    if kind == "c":
        items = tuple(v)
        if len(items) != len(s[2]):
            return f"{path} has {len(items)} items, the trace was made for {len(s[2])}"
        for i, (item, snap) in enumerate(zip(items, s[2])):
            why = state_difference(item, snap, None if path is None else f"{path}[{i}]")
            if why is not None:
                return why
        return None
    if kind == "d":
        if len(v) != len(s[2]):
            return f"{path} has {len(v)} items, the trace was made for {len(s[2])}"
        for (key, value), (key_snap, value_snap) in zip(v.items(), s[2]):
            why = state_difference(key, key_snap, None if path is None else f"{path} key") or state_difference(
                value, value_snap, None if path is None else f"{path}[{key!r}]")
            if why is not None:
                return why
        return None
    if s[2] is not None and v is not s[2]:
        return f"{path} is another object"
    fields = getattr(v, "__dict__", {})
    if len(fields) != len(s[3]):
        return f"{path} has the attributes {tuple(fields)}, the trace was made for {tuple(n for n, _ in s[3])}"
    for name, snap in s[3]:
        if name not in fields:
            return f"{path} has no attribute {name}"
        why = state_difference(fields[name], snap, None if path is None else f"{path}.{name}")
        if why is not None:
            return why
    for name, snap in s[4]:
        why = state_difference(getattr(v, name, _NO_SLOT), snap, None if path is None else f"{path}.{name}")
        if why is not None:
            return why
    return None


def _value_snapshot(obj):
    """A copy of ``obj`` equal to it, or None when its type has no value equality (``object.__eq__``) or no such copy
    can be made."""
    import copy

    if type(obj).__eq__ is object.__eq__:
        return None
    try:
        snapshot = copy.deepcopy(obj)
        return snapshot if snapshot is not obj and _equal_to_snapshot(obj, snapshot) else None
    except Exception:  # noqa: BLE001 - not copyable: guarded by identity instead
        return None
