"""Tensor inputs: how an input tensor of a plugin jit becomes a proxy with its prologue guards.

In: a tensor the interpreter meets as an input of a plugin jit (argument, parameter, buffer): a wrapper subclass
becomes a ``SubclassTensorProxy`` (:func:`proxify_input`), a plain tensor thunder's ``TensorProxy``, a typed tensor
(``thunder_subclass.frontend.torch_function``) a proxy of its type. What happens: each gets the guards of
``guards.tensors`` (its type, metadata, strides, shared ragged sizes; the values dispatch reads, when it reads them),
and the trace's flags (:class:`~thunder_subclass.guards.tensors.TraceFlags`) a dispatch-mode check on its first tensor
input. Out: jit constraints that ``unpack_inputs`` turns into prologue checks. A failing check makes the prologue raise,
which thunder treats as a cache miss: a new trace, never a stale one.
"""

from __future__ import annotations

from typing import Any

import torch
from thunder.core.proxies import NumberProxy, TensorProxy

from thunder_subclass import _thunder_internals
from thunder_subclass.errors import SubclassProtocolError, UnsupportedSubclassOperationError, format_location
from thunder_subclass.frontend.fake import (
    ValueSource,
    real_execution,
    remember_input_stride,
    remember_stride,
    remember_value_source,
)
from thunder_subclass.guards.layouts import check_tensor_layout
from thunder_subclass.guards.protocol import MISSING
from thunder_subclass.guards.tensors import (
    SPEC_ATTR,
    InputValuesSpec,
    NestedSizesSpec,
    SubclassSpec,
    TensorTypeSpec,
    TraceFlags,
    check_buffer_flag,
    check_input_values,
    check_nested_sizes,
    check_no_dispatch_mode,
    check_plain_tensor,
    check_subclass,
    check_tensor_strides,
    check_tensor_type,
    is_contiguous_layout,
    is_ragged_source_candidate,
    ragged_sizes_equal,
)
from thunder_subclass.frontend.proxy import (
    SubclassTensorProxy,
    is_subclass_value,
    mark_leaf,
    mark_protocol_error,
    nested_int_of,
    remember_nested_int,
    subclass_proxy_from_tensor,
)
from thunder_subclass.frontend.jagged import (
    has_symbolic_jagged_layout,
    is_jagged,
    is_jagged_proxy,
    outer_size_numbers,
    relate_inner_sizes,
)
from thunder_subclass.frontend.symbolic_strides import remember_contiguous_inner, remember_input_layout

__all__ = ["nested_int_source", "proxify_input", "add_subclass_guards", "add_plain_tensor_guard", "add_tensor_type_guard",
           "add_nested_sizes_guard", "guard_buffer_flag", "guard_python_attribute", "guard_tensor_type_attribute",
           "mark_involves_subclasses", "require_no_dispatch_mode", "trace_flags"]


def guard_python_attribute(p: SubclassTensorProxy, name: str) -> None:
    """Traced code read instance attribute ``name`` of ``p``: if ``p`` is an input (or inside one), a call whose input
    has another value there is a cache miss."""
    spec = p.__dict__.get(SPEC_ATTR)
    if spec is not None and name in p.python_attrs:
        spec.python_attrs[name] = p.python_attrs[name]


def trace_flags(jit_ctx=None, first_input=None) -> TraceFlags | None:
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
    flags = trace_flags()
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



_TYPE_SPEC = "_thunder_subclass_type_spec"  # on a typed input proxy: its TensorTypeSpec


def add_tensor_type_guard(jit_ctx, p, cls: type) -> None:
    """Input ``p`` is typed (``thunder_subclass.frontend.torch_function``) with class ``cls``: its exact class is
    checked every call."""
    spec = p.__dict__[_TYPE_SPEC] = TensorTypeSpec(cls)
    jit_ctx.add_constraint((check_tensor_type, p, spec))
    trace_flags(jit_ctx, first_input=p)


def guard_tensor_type_attribute(p, name: str, value: Any) -> None:
    """Traced code read instance attribute ``name`` of typed value ``p`` and found ``value`` (``MISSING``: absent)
    before setting it: for an input, another value (or presence) is a cache miss."""
    spec = p.__dict__.get(_TYPE_SPEC)
    if spec is not None and name not in spec.python_attrs:
        spec.python_attrs[name] = value




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
        elif strides is not None:  # symbolic sizes: x.stride() gives numbers of them, checking the dims' order
            remember_input_layout(p, t, lambda order: jit_ctx.add_constraint((check_tensor_layout, p, order)))
        trace_flags(jit_ctx, first_input=p)
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
    outer_shape = None
    if symbolic:
        outer_shape = outer_size_numbers(t, value.provenance) if is_jagged(t) else \
            _thunder_internals.input_size_numbers(t.shape, value.provenance)
    p = subclass_proxy_from_tensor(
        t, name=name, history=value.provenance,
        inner_history=_thunder_internals.attribute_provenance(value.provenance), outer_shape=outer_shape,
    )
    if _thunder_internals.symbolic_values_active():
        _prepare_inner_sizes(p, symbolic)
    _thunder_internals.register_input_proxy(value, p)
    mark_leaf(p, t)
    _remember_inner_strides(p, t)
    _remember_inner_values(jit_ctx, p, t, p, ())
    trace_flags(jit_ctx, first_input=p).involves_subclasses = True  # its first operation raises under a mode
    add_subclass_guards(jit_ctx, p)
    if p.nested_sizes:
        add_nested_sizes_guard(jit_ctx, p, t)
    return p


def _has_symbolic_layout(t: torch.Tensor) -> bool:
    """Whether subclass input ``t`` keeps symbolic sizes under ``cache="symbolic values"``: its outer tensor and
    every plain inner tensor are contiguous (fakes with symbolic sizes are made contiguous in the symbols; the
    prologue checks it), and no size is ragged; a jagged NestedTensor whose inner tensors are contiguous."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if is_jagged(t):  # its ragged size stays its nested int, the others are symbolic (frontend.jagged)
        return has_symbolic_jagged_layout(t)
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
    if symbolic and p.nested_sizes and is_jagged_proxy(p):  # batch and dense sizes: from the inner tensors' sizes
        same += relate_inner_sizes(p)
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
        elif isinstance(q, TensorProxy) and any(isinstance(d, NumberProxy) and not d.is_static_constrained()
                                                for d in q._shape):
            remember_contiguous_inner(q, x)  # symbolic sizes, checked contiguous: for x.stride() of it


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


def nested_int_source(v) -> tuple | None:
    """Nested int ``v``, returned by the compiled function, as read from an input at run time: ``(provenance, dim,
    factor)`` with ``v`` the ragged size ``dim`` of a jagged NestedTensor input times ``factor`` (``x.shape[1]``: 1;
    a stride ``5*j1``: 5), or with ``dim`` None the nested int of a plain offsets-like input (a NestedTensor built on
    it in traced code); None when no input has its ragged size (a NestedTensor whose offsets the trace computed).
    """
    state = _thunder_internals.jit_state()
    key, coeff = v.node.nested_int(), v.node.nested_int_coeff()
    for q, _, dims in (state or {}).get("ragged_inputs", ()):
        sizes = [(d, q.outer_size[d]) for d in dims] if isinstance(q, SubclassTensorProxy) else [(None, nested_int_of(q))]
        for d, n in sizes:
            if not _thunder_internals.is_nested_int(n) or n.node.nested_int() != key or q.history is None:
                continue
            if coeff % n.node.nested_int_coeff() == 0:
                return q.history, d, coeff // n.node.nested_int_coeff()
    return None



def guard_buffer_flag(p: TensorProxy, flag: bool) -> None:
    """Traced code asked ``isinstance(p, torch.nn.Buffer)`` of input ``p`` (torch answers from the tensor's
    ``_is_buffer`` flag) and got ``flag``: another answer for a later argument is a cache miss."""
    jit_ctx = _thunder_internals.jit_context()
    if jit_ctx is not None and not p.__dict__.get("_thunder_subclass_buffer_guarded"):
        p.__dict__["_thunder_subclass_buffer_guarded"] = True
        jit_ctx.add_constraint((check_buffer_flag, p, flag))
