"""Tensor checks: the guard kinds of input tensors (each a :class:`~thunder_subclass.guards.protocol.Guard`, each
with its check symbol).

In: what a tensor input of a plugin jit looked like when traced (its proxy, made by ``guards.inputs``). Out: the
guards and their checks, in the order ``guards.inputs`` adds them:

``check_subclass(x, spec)`` (:class:`SubclassSpec`), one call per subclass input: the exact type, the attribute names
of ``__tensor_flatten__`` and the flatten context are as when traced (the context is compared with the class's
``__metadata_guard__(old, new)`` when it defines one, else with ``==``); each opaque attribute has the same type and
the same values of its type's registered ``guard_fn``; the instance attributes the trace depends on (those
``__tensor_unflatten__`` does not restore, and those traced code read) are equal; and the outer tensor and every
inner tensor have the shape, dtype, device and requires_grad they had (thunder's usual tensor check, done here in the
same call), recursively for nested subclasses; inner tensors must be plain tensors.

``check_plain_tensor(x)`` (:class:`PlainTensor`), ``check_tensor_strides(x, strides)`` (:class:`TensorStrides`),
``check_tensor_type(x, spec)`` (:class:`TensorTypeSpec`: a typed input, ``thunder_subclass.frontend.torch_function``),
``check_no_dispatch_mode(x, flags)`` (:class:`TraceFlags`), ``check_buffer_flag(x, flag)`` (:class:`BufferFlag`).

``check_nested_sizes(x, earlier, spec)`` (:class:`NestedSizesSpec`), for a subclass input with ragged sizes (nested
ints: a jagged NestedTensor) or a plain offsets-like input (1-D integer) after the first such input: which of its
ragged sizes equal which of the earlier inputs' (NestedTensors sharing offsets; an offsets tensor passed twice, or
next to a NestedTensor built on it), as when traced. A ragged dim itself is not part of ``check_subclass``'s
outer-shape check.

``check_input_values(x, spec)`` (:class:`InputValuesSpec`), for an integer input (or integer inner tensor of a
subclass input: NJT offsets and lengths) whose values dispatch read while tracing
(``thunder_subclass.frontend.fake.ValueSource``): the same values.
"""

from __future__ import annotations

import itertools

from typing import Any

import torch

from thunder_subclass import _thunder_internals
from thunder_subclass.frontend.fake import (
    FakeEnv,
    context_template,
    context_with_sizes,
    recorded_stride,
    torch_device,
    torch_dtype,
    unflatten_fake,
)
from thunder_subclass.guards.protocol import MISSING, Guard, is_same_value, register_check
from thunder_subclass.frontend.proxy import (
    PLAIN_TENSOR_TYPES,
    OpaqueObjectProxy,
    SubclassTensorProxy,
    is_symbolic_size,
    opaque_guard_values,
    size_values,
)

__all__ = ["SubclassSpec", "PlainTensor", "TensorStrides", "TraceFlags", "TensorTypeSpec", "InputValuesSpec",
           "NestedSizesSpec", "SharedRaggedSizes", "BufferFlag", "SPEC_ATTR", "check_subclass", "check_plain_tensor",
           "check_tensor_strides", "check_no_dispatch_mode", "check_tensor_type", "check_input_values",
           "check_nested_sizes", "check_buffer_flag", "inline_tensor_check", "is_contiguous_layout",
           "is_ragged_source_candidate", "ragged_sizes_equal"]


def _tensor_meta(p) -> tuple:
    if isinstance(p, SubclassTensorProxy) and p.nested_sizes:
        # a ragged dim is not checked: its nested int is another one for every NestedTensor with new offsets, and
        # the trace does not depend on it (inner shapes are checked; sharing between inputs: check_nested_sizes)
        # (its other sizes may be symbolic: frontend.jagged)
        shape = tuple(None if i in p.nested_sizes or is_symbolic_size(d) else int(d) for i, d in enumerate(p._shape))
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


class SubclassSpec(Guard):
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
        elif any(is_symbolic_size(d) for d in p._shape) and not p.nested_sizes:
            contiguous.add(None)  # (a jagged NestedTensor's layout is its values': checked as an inner tensor)
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
        p.__dict__[SPEC_ATTR] = spec
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
                if not is_same_value(getattr(t, name, MISSING), value):  # __dict__ or __slots__
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

    def explain(self, t) -> str:
        return f"{type(t).__name__} input does not match {self}"

    def expression(self, v: str, const) -> str:
        """A Python expression true exactly when :meth:`matches` of the value named ``v`` is (the same checks in the
        same order, inline: ``thunder_subclass.guards.prologue`` puts it in a generated function). ``const(obj)`` names
        a constant, ``const.fresh()`` a new local name. Uses ``_plain``, ``_same`` (:func:`is_same_value`) and
        ``_MISSING``.

        ``const.tensor(x, shape, dtype, device, requires_grad, plain, strides)``, when given, stands for each check of a
        tensor's metadata (the outer tensor's, and each plain inner tensor's with ``plain=True``: its type is then one
        of ``_plain``; ``strides``: None or the strides it must have): it returns the expression to put in its place, or ``""`` when the caller checks that tensor
        itself after this expression (the prologue's C++ tensor checks)."""
        tensor = getattr(const, "tensor", None) or inline_tensor_check(const)
        fresh = getattr(const, "fresh", None) or _local_names()
        return self._expression(v, const, fresh, tensor)

    def _expression(self, v: str, const, fresh, tensor) -> str:
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
                parts.append(f"{bind} and {expected._expression(x, const, fresh, tensor)}")
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
        if any(s is None for s in shape):  # a dynamic dim (None): only the number of dims and the other sizes
            sizes = " and ".join([f"len({x}.shape) == {len(shape)}"]
                                 + [f"{x}.shape[{k}] == {s}" for k, s in enumerate(shape) if s is not None])
        else:
            sizes = f"{x}.shape == {const(shape)}"
        return (f"{'type(' + x + ') in _plain and ' if plain else ''}{sizes} and "
                f"{x}.dtype is {const(dtype)} and {x}.device == {const(device)} and "
                f"{x}.requires_grad is {const(requires_grad)}"
                + (f" and {x}.stride() == {const(tuple(strides))}" if strides is not None else ""))

    return tensor



SPEC_ATTR = "_thunder_subclass_spec"


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
    return {k: v for k, v in p.python_attrs.items() if not is_same_value(getattr(rebuilt, k, MISSING), v)}


def _local_names():
    count = itertools.count(1)
    return lambda: f"_w{next(count)}"


check_subclass = register_check("check_subclass", ("t", "spec"))


class PlainTensor(Guard):
    """A plain tensor input of a plugin jit stays a plain tensor (``check_plain_tensor(t)``: no argument)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "PlainTensor()"

    def matches(self, t) -> bool:
        return type(t) in PLAIN_TENSOR_TYPES

    def expression(self, v: str, const) -> str:
        return f"type({v}) in _plain"

    def explain(self, t) -> str:
        return f"expected a plain tensor, got {type(t).__name__}"


_PLAIN_TENSOR = PlainTensor()
check_plain_tensor = register_check("check_plain_tensor", ("t",), lambda: _PLAIN_TENSOR)


class TensorStrides(Guard):
    """The strides a fake run used of a plain tensor input (subclass dispatch may decide by them, as eager does)."""

    __slots__ = ("strides",)

    def __init__(self, strides: tuple):
        self.strides = strides

    def matches(self, t) -> bool:
        return t.stride() == self.strides

    def expression(self, v: str, const) -> str:
        merge = getattr(const, "strides", None)  # the builder checks them with the tensor's other metadata
        if merge is not None and merge(v, tuple(self.strides)):
            return ""
        return f"({v}.stride() == {const(tuple(self.strides))})"

    def explain(self, t) -> str:
        return f"expected strides {self.strides}, got {t.stride()}"


check_tensor_strides = register_check("check_tensor_strides", ("t", "strides"), TensorStrides)


class TraceFlags(Guard):
    """What the trace of one jit call turned out to involve, filled while tracing, read by its prologue checks."""

    __slots__ = ("involves_subclasses",)

    def __init__(self):
        self.involves_subclasses = False

    def __repr__(self) -> str:
        return f"TraceFlags(involves_subclasses={self.involves_subclasses})"

    def matches(self, t) -> bool:  # no TorchDispatchMode under a trace that involves subclasses
        return not (self.involves_subclasses and torch._C._len_torch_dispatch_stack())

    def expression(self, v: str, const) -> str:
        return f"not ({const(self)}.involves_subclasses and _dispatch_depth())"

    def explain(self, t) -> str:
        return "a TorchDispatchMode is active"  # traced again: the trace-time check raises

    def disk_state(self) -> bool:  # thunder_subclass.runtime.disk_cache: how a stored prologue holds it
        return self.involves_subclasses

    @classmethod
    def from_disk_state(cls, state: bool) -> "TraceFlags":
        flags = cls()
        flags.involves_subclasses = bool(state)
        return flags


# on the first tensor input of each trace (a check needs an input: thunder's PrunePrologueChecks requires one)
check_no_dispatch_mode = register_check("check_no_dispatch_mode", ("t", "flags"))


class TensorTypeSpec(Guard):
    """What a typed input (a subclass overriding only ``__torch_function__``) looked like when traced: its exact class
    and the instance attributes traced code read (added while tracing)."""

    __slots__ = ("cls", "python_attrs")

    def __init__(self, cls: type):
        self.cls = cls
        self.python_attrs: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"TensorTypeSpec({self.cls.__qualname__})"

    def matches(self, t) -> bool:
        return type(t) is self.cls and all(is_same_value(getattr(t, name, MISSING), value)
                                           for name, value in self.python_attrs.items())

    def explain(self, t) -> str:
        if type(t) is not self.cls:
            return f"expected a {self.cls.__qualname__}, got {type(t).__name__}"
        changed = next(n for n, v in self.python_attrs.items() if not is_same_value(getattr(t, n, MISSING), v))
        return f"{self.cls.__qualname__}.{changed} changed"


check_tensor_type = register_check("check_tensor_type", ("t", "spec"))


class InputValuesSpec(Guard):
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

    def explain(self, t) -> str:
        return f"the values of an integer input that dispatch read while tracing changed ({self!r})"


check_input_values = register_check("check_input_values", ("t", "spec"))


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


class SharedRaggedSizes(Guard):
    """A :class:`NestedSizesSpec` with the earlier inputs of the call (``check_nested_sizes(t, others, spec)``)."""

    __slots__ = ("spec", "others")

    def __init__(self, others: tuple, spec: NestedSizesSpec):
        self.spec, self.others = spec, others

    def matches(self, t) -> bool:
        return self.spec.matches(t, self.others)

    def explain(self, t) -> str:
        return (f"the ragged sizes of a {type(t).__name__} input are shared with other inputs differently than when "
                "traced")


def ragged_sizes_equal(x, d: int | None, y, e: int | None) -> bool:
    """Whether ragged size ``d`` of ``x`` equals ragged size ``e`` of ``y`` (a None dim: the nested int torch
    associates with plain tensor ``x`` itself, the offsets or lengths of NestedTensors; an identical tensor object
    counts as equal even when it has none yet)."""
    if d is None and e is None and x is y:
        return True
    a = x.shape[d] if d is not None else _thunder_internals.registered_nested_int(x)
    b = y.shape[e] if e is not None else _thunder_internals.registered_nested_int(y)
    return a is not None and b is not None and bool(a == b)


check_nested_sizes = register_check("check_nested_sizes", ("t", "others", "spec"), SharedRaggedSizes)


def is_ragged_source_candidate(t: torch.Tensor) -> bool:
    """A plain tensor that could be the offsets or lengths of a jagged NestedTensor: 1-D, of an integer dtype."""
    return t.dim() == 1 and t.layout is torch.strided and not t.dtype.is_floating_point and not t.dtype.is_complex \
        and t.dtype is not torch.bool



class BufferFlag(Guard):
    """What ``isinstance(t, torch.nn.Buffer)`` answered for an input (torch answers from its ``_is_buffer`` flag)."""

    __slots__ = ("flag",)

    def __init__(self, flag: bool):
        self.flag = flag

    def matches(self, t) -> bool:
        return bool(getattr(t, "_is_buffer", False)) is self.flag

    def explain(self, t) -> str:
        return f"the argument is {'no longer ' if self.flag else ''}a torch.nn.Buffer"


check_buffer_flag = register_check("check_buffer_flag", ("t", "flag"), BufferFlag)
