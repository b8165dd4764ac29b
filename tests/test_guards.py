"""Prologue guards: cache hits for identical inputs, misses (with correct results) for any change (issue 2)."""

import copy
import dataclasses
import functools
import heapq
import itertools
import operator
from types import SimpleNamespace

import pytest
import thunder
import torch

import thunder_subclass
from subclasses import ScaledTensor, TwoTensor, quantize
from helpers import cache_counts
from thunder_subclass.errors import UnsupportedGlobalStateError


def _f(t):
    return t * 2 + 1


def _two(a=None, b=None, dtype=torch.float32):
    return TwoTensor(torch.randn(3, 3, dtype=dtype) if a is None else a, torch.randn(3, 3, dtype=dtype) if b is None else b)


def test_identical_call_is_a_cache_hit():
    jf = thunder_subclass.jit(_f)
    x = _two()
    jf(x)
    out = jf(_two())
    assert cache_counts(jf) == (1, 1)
    assert type(out) is TwoTensor


def test_prologue_checks_type_context_and_inner_tensors():
    jf = thunder_subclass.jit(_f)
    jf(_two())
    prologue = str(thunder.last_prologue_traces(jf)[0])  # before thunder_subclass.guards.prologue fuses the checks
    # one check per subclass input covers type, context and the metadata of outer and inner tensors
    assert prologue.count("check_subclass(t, ") == 1
    assert "check_tensor_metadata(t," not in prologue and " = t.a" not in prologue
    spec = [b for b in thunder.last_prologue_traces(jf)[0].bound_symbols if b.sym.name == "check_subclass"][0].args[1]
    assert spec.meta == (torch.Size([3, 3]), torch.float32, torch.device("cpu"), False)
    assert spec.inner == {"a": spec.meta, "b": spec.meta}


def test_changed_inner_dtype_is_a_miss():
    jf = thunder_subclass.jit(_f)
    jf(_two())
    x64 = _two(dtype=torch.float64)
    out = jf(x64)
    assert thunder.cache_misses(jf) == 2
    assert out.a.dtype == torch.float64
    torch.testing.assert_close(out.a, x64.a * 2 + 1)


def test_changed_subclass_type_is_a_miss():
    jf = thunder_subclass.jit(_f)
    data = torch.randn(3, 3)
    jf(_two())
    out = jf(ScaledTensor(data, 0.5))
    assert thunder.cache_misses(jf) == 2
    assert type(out) is torch.Tensor  # ScaledTensor's add returns plain; mul folded into the factor
    torch.testing.assert_close(out, data * 1.0 + 1)
    plain = torch.randn(3, 3)
    out = jf(plain)
    assert thunder.cache_misses(jf) == 3 and type(out) is torch.Tensor
    torch.testing.assert_close(out, plain * 2 + 1)
    out = jf(_two())  # back to the first: a hit on the first entry
    assert thunder.cache_misses(jf) == 3 and type(out) is TwoTensor


def test_plain_tensor_first_then_subclass_is_a_miss():
    jf = thunder_subclass.jit(_f)
    jf(torch.randn(3, 3))
    x = _two()
    out = jf(x)
    assert thunder.cache_misses(jf) == 2 and type(out) is TwoTensor
    torch.testing.assert_close(out.b, x.b * 2 + 1)


def test_changed_context_value_is_a_miss_with_correct_result():
    jf = thunder_subclass.jit(lambda t: t + 1)
    data = torch.randn(4)
    torch.testing.assert_close(jf(ScaledTensor(data, 2.0)), data * 2.0 + 1)
    out = jf(ScaledTensor(data, 5.0))
    assert thunder.cache_misses(jf) == 2
    torch.testing.assert_close(out, data * 5.0 + 1)


def test_metadata_guard_ignores_what_the_class_says_does_not_matter():
    jf = thunder_subclass.jit(lambda t: t + 1)
    data = torch.randn(4)
    jf(ScaledTensor(data, 2.0, tag="a"))
    out = jf(ScaledTensor(data, 2.0, tag="b"))  # __metadata_guard__ compares the factor only
    assert cache_counts(jf) == (1, 1)
    torch.testing.assert_close(out, data * 2.0 + 1)


def test_changed_context_flag_of_quantized_weight_is_a_miss():
    w = quantize(torch.randn(4, 4))
    x = torch.randn(2, 4)
    jf = thunder_subclass.jit(lambda x, w: x @ w)
    torch.testing.assert_close(jf(x, w), x @ w.dequantize())
    wt = w.t()  # same shapes (4x4), transposed flag in the context
    out = jf(x, wt)
    assert thunder.cache_misses(jf) == 2
    torch.testing.assert_close(out, x @ wt.dequantize())


# --- Python objects the trace reads (issue 24): their type, identity or value is guarded as torch.compile does ---

import dataclasses  # noqa: E402
import enum  # noqa: E402

import pytest  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.tensor.placement_types import Replicate, Shard  # noqa: E402


class _Mode(enum.Enum):
    DOUBLE = 1
    KEEP = 2


@dataclasses.dataclass
class _Cfg:
    scale: float
    mode: _Mode


class _Plus:
    def apply(self, t):
        return t + 1


class _Times:
    def apply(self, t):
        return t * 3


def _placement_branch(p):
    return 1 if p.is_replicate() else 2


def test_placement_type_is_guarded():
    jf = thunder_subclass.jit(_placement_branch)
    placements = (Shard(0), Replicate(), Shard(1), Replicate(), Shard(0))
    assert [jf(p) for p in placements] == [_placement_branch(p) for p in placements] == [2, 1, 2, 1, 2]
    # is_replicate is a pybind11 method (native: it may read anything of the placement), so the placement is guarded
    # by value: Shard(1) is a miss, an equal Replicate() or Shard(0) a hit
    assert cache_counts(jf) == (3, 2)
    specs = [b.args[1] for b in thunder.last_prologue_traces(jf)[0].bound_symbols if b.sym.name == "check_object"]
    assert sorted((spec.kind, spec.where) for spec in specs) == [("equal", "args[0]"),
                                                                 ("function", "the compiled callable")]


def test_placement_attribute_read_is_guarded():
    def f(t, p):
        return t * (p.dim + 2) if isinstance(p, Shard) else t

    jf = thunder_subclass.jit(f)
    x = _two()
    for p in (Shard(0), Shard(1), Replicate(), Shard(0)):
        out = jf(x, p)
        assert type(out) is TwoTensor
        torch.testing.assert_close(out.a, f(x, p).a)
    assert thunder.cache_misses(jf) == 3


def test_user_class_method_is_guarded_by_type():
    jf = thunder_subclass.jit(lambda t, op: op.apply(t))
    x = _two()
    for op in (_Plus(), _Times(), _Plus()):
        out = jf(x, op)
        torch.testing.assert_close(out.a, op.apply(x.a))
        assert type(out) is TwoTensor
    assert cache_counts(jf) == (2, 1)


def test_enum_member_is_guarded_by_identity():
    def f(t, mode):
        return t * 2 if mode == _Mode.DOUBLE else t

    jf = thunder_subclass.jit(f)
    x = torch.randn(3)
    for mode in (_Mode.DOUBLE, _Mode.KEEP, _Mode.DOUBLE):
        torch.testing.assert_close(jf(x, mode), f(x, mode))
    assert cache_counts(jf) == (2, 1)


def test_dataclass_fields_and_type_are_guarded():
    def f(t, cfg):
        return t * cfg.scale if cfg.mode is _Mode.DOUBLE else t

    jf = thunder_subclass.jit(f)
    x = _two()
    for cfg in (_Cfg(2.0, _Mode.DOUBLE), _Cfg(3.0, _Mode.DOUBLE), _Cfg(3.0, _Mode.KEEP), _Cfg(2.0, _Mode.DOUBLE)):
        torch.testing.assert_close(jf(x, cfg).a, f(x, cfg).a)
    assert cache_counts(jf) == (3, 1)


def test_function_argument_is_guarded_by_identity():
    jf = thunder_subclass.jit(lambda t, act: act(t))
    x = torch.randn(4)
    for act in (torch.relu, torch.sigmoid, torch.relu, torch.tanh):
        torch.testing.assert_close(jf(x, act), act(x))
    assert cache_counts(jf) == (3, 1)


def test_none_or_tensor_keyword_is_guarded():
    jf = thunder_subclass.jit(lambda t, m=None: t if m is None else t + m)
    x = torch.randn(3)
    torch.testing.assert_close(jf(x), x)
    torch.testing.assert_close(jf(x, m=x), x + x)
    torch.testing.assert_close(jf(x, m=None), x)


class _ActNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.act = torch.relu
        self.mode = _Mode.DOUBLE

    def forward(self, x):
        y = self.act(self.lin(x))
        return y * 2 if self.mode is _Mode.DOUBLE else y


def test_objects_reached_through_module_attributes_are_guarded():
    m = _ActNet()
    jm = thunder_subclass.jit(m)
    x = torch.randn(2, 3)
    torch.testing.assert_close(jm(x), m(x))
    m.act = torch.sigmoid
    torch.testing.assert_close(jm(x), m(x))
    m.mode = _Mode.KEEP
    torch.testing.assert_close(jm(x), m(x))
    assert thunder.cache_misses(jm) == 3
    prologue = str(thunder.last_prologue_traces(jm)[0])
    assert "check_object" in prologue


def test_object_guard_failure_names_the_object():
    from thunder_subclass.guards import ObjectSpec

    spec = ObjectSpec("type", Shard, where="args[0]")
    assert spec.matches(Shard(3)) and not spec.matches(Replicate())
    assert spec.explain(Replicate()) == "the args[0] is a Replicate, the trace was made for a Shard"


def test_each_object_guard_kind_is_a_guard_whose_expression_matches_as_it_does():
    # one class per kind (ObjectSpec(kind, ...) makes it); a guard made stricter while tracing becomes another kind;
    # the inline expression the fused prologue runs answers as matches does, for every kind
    import types

    from thunder_subclass.guards import Guard, ObjectSpec
    from thunder_subclass.guards.values import function_snapshot, state_snapshot, value_snapshot

    def fn(x):
        return x

    obj = Shard(3)
    specs = [ObjectSpec("identity", Shard, obj), ObjectSpec("type", Shard), ObjectSpec("same", int, 3),
             ObjectSpec("equal", Shard, value_snapshot(obj)), ObjectSpec("state", Shard, state_snapshot(obj)),
             ObjectSpec("length", list, 2), ObjectSpec("keys", dict, ("a",)),
             ObjectSpec("function", types.FunctionType, function_snapshot(fn))]
    assert len({type(s) for s in specs}) == len(specs) and all(isinstance(s, (ObjectSpec, Guard)) for s in specs)
    assert [s.kind for s in specs] == ["identity", "type", "same", "equal", "state", "length", "keys", "function"]
    for spec in specs:
        constants = {}

        def const(c):
            constants[f"c{len(constants)}"] = c
            return f"c{len(constants) - 1}"

        code = spec.expression("v", const)
        for value in (obj, Shard(3), Shard(4), Replicate(), 3, 4, [1, 2], [1], {"a": 1}, {"b": 1}, fn, lambda x: x):
            assert bool(eval(code, dict(constants), {"v": value})) == spec.matches(value), (spec, value)
            if not spec.matches(value):
                assert spec.explain(value)
    spec = ObjectSpec("type", Shard, where="args[0]")
    spec.become("identity", obj)
    assert type(spec) is type(specs[0]) and spec.matches(obj) and not spec.matches(Shard(3))
    assert spec.explain(Shard(3)).startswith("the args[0] is ")


def test_object_read_by_a_native_call_is_guarded_by_value():
    import datetime

    def f(t, delay):
        return t * delay.total_seconds()  # timedelta.total_seconds is C: its result is a constant in the trace

    jf = thunder_subclass.jit(f)
    x = torch.randn(3)
    for seconds in (2, 3, 2):
        d = datetime.timedelta(seconds=seconds)
        torch.testing.assert_close(jf(x, d), f(x, d))
    assert cache_counts(jf) == (2, 1)
    torch.testing.assert_close(jf(x, datetime.timedelta(seconds=3)), x * 3.0)  # an equal copy: a hit
    assert thunder.cache_hits(jf) == 2


def test_python_function_argument_is_guarded_by_code_and_closure():
    jf = thunder_subclass.jit(lambda t, f: f(t))
    x = torch.randn(3)
    for scale in (2.0, 2.0, 3.0, 2.0):
        f = lambda t, s=scale: t * s  # noqa: E731 - a new function object per call, as in a loop
        torch.testing.assert_close(jf(x, f), x * scale)
    assert cache_counts(jf) == (2, 2)

    def make(k):
        return lambda t: t + k

    jg = thunder_subclass.jit(lambda t, f: f(t))
    for k in (1.0, 1.0, 5.0):
        torch.testing.assert_close(jg(x, make(k)), x + k)
    assert thunder.cache_misses(jg) == 2


_MARKER = object()


@dataclasses.dataclass
class _Token:
    v: int = 1


_TOKEN = _Token()
_TABLE = {_MARKER: 1.0}


@pytest.mark.parametrize(
    "name, f, first, other",
    [
        ("is", lambda x, t: x * 2 if t is _MARKER else x, _MARKER, object()),
        ("is not", lambda x, t: x if t is not _MARKER else x * 2, _MARKER, object()),
        # == and != on objects without __eq__ compare identity
        ("==", lambda x, t: x * 2 if t == _MARKER else x, _MARKER, object()),
        ("!=", lambda x, t: x if t != _MARKER else x * 2, _MARKER, object()),
        ("in list", lambda x, t: x * 2 if t in [_MARKER] else x, _MARKER, object()),
        ("in set", lambda x, t: x * 2 if t in {_MARKER} else x, _MARKER, object()),
        # a dict lookup compares the key natively (hash, then == or identity)
        ("dict get", lambda x, t: x * _TABLE.get(t, 3.0), object(), _MARKER),
        ("dict pop", lambda x, t: x * {_MARKER: 1.0}.pop(t, 3.0), object(), _MARKER),
        ("id", lambda x, t: x * 2 if id(t) == id(_MARKER) else x, _MARKER, object()),
        # a type with value equality: `is` and id() still compare identity, == compares the value
        ("is, equal value", lambda x, t: x * 2 if t is _TOKEN else x, _TOKEN, _Token()),
        ("id, equal value", lambda x, t: x * 2 if id(t) == id(_TOKEN) else x, _TOKEN, _Token()),
        ("==, other value", lambda x, t: x * 2 if t == _TOKEN else x, _TOKEN, _Token(2)),
        ("attribute is", lambda x, t: x * 2 if t.o is _MARKER else x, SimpleNamespace(o=_MARKER),
         SimpleNamespace(o=object())),
    ],
)
def test_object_identity_or_value_the_trace_compared_is_guarded(name, f, first, other):
    # the interpreter compares the operands natively: the branch taken depends on which object came, not its type
    jf = thunder_subclass.jit(f)
    x = torch.randn(3)
    torch.testing.assert_close(jf(x, first), f(x, first))
    torch.testing.assert_close(jf(x, other), f(x, other))
    assert thunder.cache_misses(jf) == 2
    torch.testing.assert_close(jf(x, first), f(x, first))  # the first object still hits its own trace
    assert thunder.cache_hits(jf) == 1


def test_one_object_reached_by_two_paths_is_guarded_at_both():
    # thunder's interpreter hands out the first path's wrapper for the second read of the same object
    def f(x, t):
        return x * 2 if t[0] is t[1] else x

    jf = thunder_subclass.jit(f)
    x = torch.randn(3)
    for pair in ((_MARKER, _MARKER), (_MARKER, object()), (object(), _MARKER), (_MARKER, _MARKER)):
        torch.testing.assert_close(jf(x, pair), f(x, pair))
    assert cache_counts(jf) == (3, 1)

    def g(x, t):
        return t[1].scale(x)  # the method comes from the second path's type

    class A:
        def scale(self, y):
            return y * 2

    class B:
        def scale(self, y):
            return y * 3

    a = A()
    jg = thunder_subclass.jit(g)
    torch.testing.assert_close(jg(x, (a, a)), g(x, (a, a)))
    torch.testing.assert_close(jg(x, (a, B())), g(x, (a, B())))
    assert thunder.cache_misses(jg) == 2


def test_compared_object_with_value_equality_hits_for_an_equal_copy():
    jf = thunder_subclass.jit(lambda x, t: x * 2 if t == _TOKEN else x)
    x = torch.randn(3)
    jf(x, _Token())
    torch.testing.assert_close(jf(x, _Token()), x * 2)  # another object, equal: the same trace
    assert cache_counts(jf) == (1, 1)


class _Key:
    """An object used as a dict key, with state traced code reads (attributes, a list, a method, a nested object)."""

    def __init__(self, n, scale=1.0):
        self.n = n
        self.cfg = SimpleNamespace(scale=scale)
        self.steps = [1, 2]

    def times(self, x):
        return x * self.n


_K1, _K2 = _Key(2), _Key(3)
_KEYED = {_K1: 1.0, _K2: 2.0}  # a module-level table keyed by objects


def _loop_global(x):
    for k in _KEYED:
        x = x * k.n + _KEYED[k]
    return x


def _loop_items(x, d):
    for k, v in d.items():
        x = k.times(x) * k.cfg.scale + v
    return x


def _loop_steps(x, d):
    for k in d.keys():
        for s in k.steps:
            x = x + s
    return x


def _tuple_keys(x, d):
    for (k, j) in d:
        x = x * k.n + j
    return x


def _sorted_keys(x, d):
    for k in sorted(d, key=lambda k: k.n):
        x = x * 2 + k.n
    return x


def _max_key(x, d):
    return x + max(d, key=lambda k: k.n).n + min(d, key=lambda k: k.n).n


def _set_n(k, n):
    k.n = n


@pytest.mark.parametrize("fn, table, change", [
    ("global", None, lambda d: _set_n(_K1, 5)),
    ("items", {_Key(2, 0.5): 1.0, _Key(3): 2.0}, lambda d: _set_n(next(iter(d)), 5)),
    ("items", {_Key(2, 0.5): 1.0}, lambda d: setattr(next(iter(d)).cfg, "scale", 4.0)),
    ("items", {_Key(2, 0.5): 1.0}, lambda d: setattr(next(iter(d)), "cfg", SimpleNamespace(scale=7.0))),
    ("steps", {_Key(2): 0}, lambda d: next(iter(d)).steps.append(10)),
    ("tuple", {(_Key(2), 1): 0}, lambda d: _set_n(next(iter(d))[0], 5)),
    ("sorted", {_Key(2): 0, _Key(3): 1}, lambda d: _set_n(next(iter(d)), 5)),
    ("max", {_Key(2): 0, _Key(3): 1}, lambda d: _set_n(next(iter(d)), 5)),
])
def test_state_read_from_dict_key_objects_is_guarded(fn, table, change):
    # thunder wraps dict keys as constants: what traced code read from a key object (its attributes, their items, what
    # a method or a sort key read) was inlined unchecked, and a changed value silently reused the old trace
    f = {"global": lambda x, d: _loop_global(x), "items": _loop_items, "steps": _loop_steps, "tuple": _tuple_keys,
         "sorted": _sorted_keys, "max": _max_key}[fn]
    x = torch.randn(3)
    jf = thunder_subclass.jit(f)
    try:
        torch.testing.assert_close(jf(x, table), f(x, table))
        torch.testing.assert_close(jf(x, table), f(x, table))
        assert cache_counts(jf) == (1, 1)
        change(table)
        torch.testing.assert_close(jf(x, table), f(x, table))
        assert thunder.cache_misses(jf) == 2
    finally:
        _K1.n = 2


def _sum_set(x, s):
    for k in s:
        x = x * 2 + k.n
    return x


@pytest.mark.parametrize("kind", [set, frozenset])
def test_state_read_from_the_items_of_a_set_is_guarded(kind):
    # thunder iterates a set natively: its items had no provenance and `k.n` was inlined unchecked
    a, b = _Key(2), _Key(3)
    s = kind([a, b])
    x = torch.randn(3)
    jf = thunder_subclass.jit(_sum_set)
    torch.testing.assert_close(jf(x, s), _sum_set(x, s))
    torch.testing.assert_close(jf(x, s), _sum_set(x, s))
    assert cache_counts(jf) == (1, 1)
    next(iter(s)).n = 7
    torch.testing.assert_close(jf(x, s), _sum_set(x, s))
    assert thunder.cache_misses(jf) == 2
    assert any("<item 0 of a set>.n is 7, the trace was made for" in r for r in thunder_subclass.last_miss_reasons(jf))
    other = kind([_Key(7), _Key(3)])  # other objects: the set's own guard (its items in iteration order)
    torch.testing.assert_close(jf(x, other), _sum_set(x, other))
    assert thunder.cache_misses(jf) == 3


def test_the_guard_of_a_dict_key_object_says_what_changed():
    d = {_Key(2): 1.0}
    jf = thunder_subclass.jit(_loop_items)
    x = torch.randn(3)
    jf(x, d)
    prologue = str(thunder.last_prologue_traces(jf)[-1])
    assert prologue.count("check_constant_path(") == 4  # k.n (read in k.times), k.cfg, k.cfg.scale, k.times
    checks = [b.args for b in thunder.last_prologue_traces(jf)[-1].bound_symbols if b.sym.name == "check_constant_path"]
    assert sorted(repr(where) for where, _ in checks) == [
        "<dict key _Key>.cfg", "<dict key _Key>.cfg.scale", "<dict key _Key>.n", "<dict key _Key>.times"]
    assert {spec.kind for where, spec in checks if repr(where).endswith(".times")} == {"method"}
    next(iter(d)).n = 7
    jf(x, d)
    assert any("<dict key _Key>.n is 7, the trace was made for 2" in r for r in thunder_subclass.last_miss_reasons(jf))


def test_an_attribute_gone_from_a_dict_key_object_is_a_miss_that_says_so():
    # the check's explanation read the exception variable after its except clause had unbound it: NameError
    d = {_Key(2): 1.0}
    jf = thunder_subclass.jit(_loop_items)
    x = torch.randn(3)
    jf(x, d)
    del next(iter(d)).cfg
    with pytest.raises(AttributeError, match="cfg"):  # as eager, which reads k.cfg
        jf(x, d)
    assert thunder_subclass.last_miss_reasons(jf) == (
        "<dict key _Key>.cfg could not be read (AttributeError: '_Key' object has no attribute 'cfg')",)


def test_a_tensor_read_from_a_dict_key_object_is_a_typed_error():
    k = _Key(1)
    k.t = torch.ones(3)

    def f(x, d):
        for key in d:
            x = x + key.t
        return x

    with pytest.raises(thunder_subclass.errors.UnsupportedTracingError,
                       match=r"read the tensor <dict key _Key>\.t from an object used as a dict key "
                             r"\(at .*test_guards"):
        thunder_subclass.jit(f)(torch.ones(3), {k: 0})


def test_sorted_min_max_of_plain_numbers_stay_thunders_calls():
    def f(x, a, b):
        return x * max(a, b) + min([a, b, 3]) + sorted((b, a))[0]

    jf = thunder_subclass.jit(f)
    x = torch.randn(2)
    torch.testing.assert_close(jf(x, 2, 5), f(x, 2, 5))
    torch.testing.assert_close(jf(x, 4, 1), f(x, 4, 1))
    assert thunder.cache_misses(jf) == 2

    def g(x, objs):
        return x + max(objs, key=lambda o: o.n).n + len(sorted(objs, key=lambda o: -o.n, reverse=True))

    objs = [_Key(1), _Key(4)]
    jg = thunder_subclass.jit(g)
    torch.testing.assert_close(jg(x, objs), g(x, objs))
    objs[0].n = 9
    torch.testing.assert_close(jg(x, objs), g(x, objs))
    with pytest.raises(ValueError, match="empty"):
        jg(x, [])


@functools.total_ordering
class _Ranked:
    def __init__(self, n):
        self.n = n

    def __eq__(self, other):
        return self.n == other.n

    def __lt__(self, other):
        return self.n < other.n

    __hash__ = object.__hash__


class _Ordered:  # only __lt__: `a > b` is b.__lt__(a), reflected
    def __init__(self, n):
        self.n = n

    def __lt__(self, other):
        return self.n < other.n if isinstance(other, _Ordered) else NotImplemented


@dataclasses.dataclass(order=True)
class _Row:
    n: int


def _bump(objs):
    objs[0].n = 10


@pytest.mark.parametrize("name, f", [
    ("max", lambda x, o: x * max(o).n),
    ("max of two", lambda x, o: x * max(o[0], o[1]).n),
    ("branch on <", lambda x, o: x + 1 if o[1] > o[0] else x - 1),
    ("sorted", lambda x, o: x * sorted(o)[-1].n),
    ("map", lambda x, o: x + sum(map(lambda k: k.n, o))),
    ("filter", lambda x, o: x + len(list(filter(lambda k: k.n > 1, o)))),
    ("vars", lambda x, o: x + vars(o[0])["n"]),
])
@pytest.mark.parametrize("cls", [_Ranked, _Ordered, _Row])
def test_what_python_comparisons_map_filter_and_vars_read_is_guarded(name, f, cls):
    # thunder runs comparisons and map/filter natively: what a Python __lt__ or a mapped function read was unseen by
    # the trace, and after a change the trace made for the old values ran (max(o) gave the old maximum's value)
    objs = [cls(1), cls(2)]
    x = torch.randn(3)
    jf = thunder_subclass.jit(f)
    torch.testing.assert_close(jf(x, objs), f(x, objs))
    _bump(objs)
    torch.testing.assert_close(jf(x, objs), f(x, objs))
    assert thunder.cache_misses(jf) == 2
    assert jf(x, objs) is not None and thunder.cache_misses(jf) == 2  # unchanged: a hit


def test_an_unsupported_python_comparison_raises_as_in_eager():
    def f(x, a, b):
        return x + (1 if a < b else 0)

    with pytest.raises(TypeError, match="'<' not supported between instances of '_Ordered' and 'int'"):
        f(torch.ones(2), _Ordered(1), 3)
    with pytest.raises(TypeError, match="'<' not supported between instances of '_Ordered' and 'int'"):
        thunder_subclass.jit(f)(torch.ones(2), _Ordered(1), 3)
    with pytest.raises(TypeError, match="'>' not supported between instances of 'int' and '_Ordered'"):
        thunder_subclass.jit(lambda x, a, b: x + (1 if b > a else 0))(torch.ones(2), _Ordered(1), 3)


def _group_sizes(x, o):
    groups = [(key, list(g)) for key, g in itertools.groupby(o, key=lambda k: k.n > 1)]
    return x + sum(len(g) * 10 + key for key, g in groups)


def _consumed_groups(x, o):
    groups = list(itertools.groupby(o, key=lambda k: k.n))  # advancing leaves earlier groups empty, as in CPython
    return x + sum(len(list(g)) for _, g in groups) + len(groups)


@pytest.mark.parametrize("name, f", [
    ("chain", lambda x, o: x + sum(k.n for k in itertools.chain(o, o[:1]))),
    ("chain.from_iterable", lambda x, o: x + sum(k.n for k in itertools.chain.from_iterable([o, o]))),
    ("islice", lambda x, o: x + sum(k.n for k in itertools.islice(o, 1, None, 2)) + len(list(itertools.islice(o, 2)))),
    ("starmap", lambda x, o: x + sum(itertools.starmap(lambda a, b: a.n * b, zip(o, [1, 2, 3])))),
    ("accumulate", lambda x, o: x + list(itertools.accumulate([k.n for k in o], initial=1))[-1]
     + list(itertools.accumulate(o, lambda t, k: t + k.n, initial=0))[-1]),
    ("takewhile/dropwhile", lambda x, o: x + len(list(itertools.takewhile(lambda k: k.n < 3, o)))
     + sum(k.n for k in itertools.dropwhile(lambda k: k.n < 2, o))),
    ("filterfalse/compress", lambda x, o: x + sum(k.n for k in itertools.filterfalse(lambda k: k.n > 2, o))
     + sum(k.n for k in itertools.compress(o, [1, 0, 1]))),
    ("zip_longest/pairwise", lambda x, o: x + sum(a.n * (b.n if b else 5) for a, b in itertools.zip_longest(o, o[:1]))
     + sum(a.n - b.n for a, b in itertools.pairwise(o))),
    ("groupby", _group_sizes),
    ("groupby, consumed", _consumed_groups),
    ("attrgetter", lambda x, o: x + sum(map(operator.attrgetter("n"), o))
     + operator.attrgetter("cfg.scale", "n")(o[0])[1]),
    ("itemgetter", lambda x, o: x + operator.itemgetter(0)(o).n + sum(k.n for k in operator.itemgetter(1, 2)(o))),
    ("computed getattr name", lambda x, o: x + sum(getattr(k, "".join(["n"])) for k in o)),
    ("product", lambda x, o: x + sum(a.n * b for a, b in itertools.product(o, [1, 2]))),
    ("combinations", lambda x, o: x + sum(a.n - b.n for a, b in itertools.combinations(o, 2))
     + len(list(itertools.combinations_with_replacement(o, 2))) * o[0].n),
    ("permutations", lambda x, o: x + sum(a.n * 2 - b.n for a, b in itertools.permutations(o, 2))),
    ("methodcaller", lambda x, o: x + sum(map(operator.methodcaller("times", 1.0), o))),
    ("tee", lambda x, o: x + sum(a.n * 2 - b.n for a, b in zip(*itertools.tee(o)))),
    ("tee, one iterator", lambda x, o: x + sum(k.n for k in itertools.tee(o, 3)[2])),
    ("cmp_to_key", lambda x, o: x * o.index(sorted(o, key=functools.cmp_to_key(lambda a, b: b.n - a.n))[0])),
    ("cmp_to_key, max", lambda x, o: x * o.index(max(o, key=functools.cmp_to_key(lambda a, b: a.n % 3 - b.n % 3)))),
])
def test_what_itertools_and_getters_read_is_guarded(name, f):
    # thunder runs itertools functions and attrgetter/itemgetter natively, and records a getattr with a computed name
    # with a path its prologue cannot read: the objects they handed back had no path to the inputs, and `k.n` was
    # inlined unchecked (a stale trace after a change)
    objs = [_Key(1, 0.5), _Key(2), _Key(3)]
    x = torch.randn(3)
    jf = thunder_subclass.jit(f)
    torch.testing.assert_close(jf(x, objs), f(x, objs))
    for k in objs:  # every value any of these programs reads changes
        k.n += 10
        k.cfg.scale += 1.0
    torch.testing.assert_close(jf(x, objs), f(x, objs))
    assert thunder.cache_misses(jf) == 2


class _Num:
    """An object whose Python methods C code calls natively (sum, operator, range, heapq, set, len) and whose
    ``__dict__`` copy.copy reads natively; no value equality (compared by identity)."""

    def __init__(self, n):
        self.n = n
        self.cfg = SimpleNamespace(scale=1)

    def __add__(self, other):
        return _Num(self.n * self.cfg.scale + (other.n if isinstance(other, _Num) else other))

    __radd__ = __add__

    def __lt__(self, other):
        return self.n < other.n

    def __index__(self):
        return self.n

    def __len__(self):
        return self.n

    def __hash__(self):
        return 7


def _heap_first(x, o):
    heap = list(o)
    heapq.heapify(heap)  # reorders the traced code's own list in place, natively
    return x * o.index(heap[0]) + heap[0].n


@pytest.mark.parametrize("name, f", [
    ("sum with a start object", lambda x, o: x * sum(o, _Num(0)).n),
    ("operator.add", lambda x, o: x + operator.add(o[0], o[1]).n),
    ("range of an __index__ object", lambda x, o: x + sum(range(o[2]))),
    ("map with a builtin", lambda x, o: x + sum(map(len, o))),
    ("set of objects, sorted", lambda x, o: x + sum(k.n for k in sorted(set(o)))),
    ("copy.copy", lambda x, o: x + copy.copy(o[0]).n),
    ("heapq.heapify", _heap_first),
])
def test_what_c_code_reads_through_python_methods_is_guarded(name, f):
    # C code that calls an input object's Python methods (or reads its __dict__) does so out of the interpreter's
    # sight: an object without value equality was guarded by identity only, and after `k.n` changed in place the
    # trace made for the old values ran. Such objects are now guarded by their state when passed to native code.
    objs = [_Num(1), _Num(2), _Num(3)]
    x = torch.randn(3)
    jf = thunder_subclass.jit(f)
    torch.testing.assert_close(jf(x, objs), f(x, objs))
    for k, n in zip(objs, (4, 4, 2)):
        k.n = n
    torch.testing.assert_close(jf(x, objs), f(x, objs))
    assert thunder.cache_misses(jf) == 2
    objs[0].cfg.scale = 2  # nested state (a SimpleNamespace): operator.add reads it through __add__
    torch.testing.assert_close(jf(x, objs), f(x, objs))
    if name == "operator.add":
        assert thunder.cache_misses(jf) == 3


class _EqualIndex:
    """Value equality and a Python ``__index__`` (C code calls it: ``range(obj)``)."""

    def __init__(self, n):
        self.n = n

    def __eq__(self, other):
        return isinstance(other, _EqualIndex) and self.n == other.n

    __hash__ = object.__hash__

    def __index__(self):
        return self.n


def test_an_identity_guard_stays_one_when_the_object_is_also_passed_to_c_code():
    # `m is o` makes the trace depend on which object m is; range(m) then asks for m's state too: an equal copy of m
    # must still be a cache miss (it was accepted by equality, and the trace's `is` answer was wrong)
    def f(x, m, o):
        return x + (1 if m is o else 0) + sum(range(m))

    m, x = _EqualIndex(2), torch.zeros(2)
    jf = thunder_subclass.jit(f)
    torch.testing.assert_close(jf(x, m, m), f(x, m, m))
    copy_of_m = _EqualIndex(2)
    torch.testing.assert_close(jf(x, copy_of_m, m), f(x, copy_of_m, m))
    assert thunder.cache_misses(jf) == 2
    m.n = 3  # same object, new state: a miss too
    torch.testing.assert_close(jf(x, m, m), f(x, m, m))
    assert thunder.cache_misses(jf) == 3


def test_a_state_guard_says_what_changed_and_type_only_natives_add_none():
    def f(x, o):
        return x * sum(o, _Num(0)).n

    objs = [_Num(1), _Num(2)]
    jf = thunder_subclass.jit(f)
    jf(torch.ones(2), objs)
    objs[1].cfg.scale = 5
    torch.testing.assert_close(jf(torch.ones(2), objs), f(torch.ones(2), objs))
    assert thunder.cache_misses(jf) == 2
    assert "args[1] changed since the trace was made: args[1][1].cfg.scale is 5, the trace was made for 1" in \
        thunder_subclass.explain_recompiles(jf)[-1]

    def g(x, o):  # isinstance depends on types only: a changed attribute is no cache miss
        return x + (1 if isinstance(o[0], _Num) else 0)

    jg = thunder_subclass.jit(g)
    jg(torch.ones(2), objs)
    objs[0].n = 100
    torch.testing.assert_close(jg(torch.ones(2), objs), g(torch.ones(2), objs))
    assert thunder.cache_misses(jg) == 1


def test_state_snapshots_record_state_and_fall_back_for_big_objects():
    from thunder_subclass import guards

    k = _Num(3)
    k.items = [1, "a", (None, 2.5)]
    k.self_ref = k
    snap = guards.state_snapshot(k)
    assert guards.same_state(k, snap)
    k.items[2] = (None, 3.5)
    assert guards.state_difference(k, snap, "k") == "k.items[2][1] is 3.5, the trace was made for 2.5"
    k.items[2] = (None, 2.5)
    assert guards.same_state(k, snap) and not guards.same_state(_Num(3), snap)  # another object
    assert guards.same_state(_Num(3), guards.state_snapshot(_Num(3), identity=False))
    k.t = torch.ones(2)
    k.f = print
    snap = guards.state_snapshot(k)
    k.t = torch.zeros(3)  # tensors by type (those the trace reads are guarded on their own)
    assert guards.same_state(k, snap)
    k.f = len  # other objects by identity
    assert guards.state_difference(k, snap, "k") == "k.f is another object"
    big = _Num(1)
    big.values = list(range(guards._STATE_LIMIT + 1))
    assert guards.state_snapshot(big) is None


def test_the_python_versions_of_itertools_give_cpythons_results():
    # the interpreted stand-ins (_thunder_internals.interpreter_fixes) on plain data, run directly, against itertools
    from thunder_subclass._thunder_internals.fixes import iteration as fx

    for data in ([], [3], [1, 2, 3], "abcd"):
        assert list(fx._chain(data, data[:1])) == list(itertools.chain(data, data[:1]))
        assert list(fx._chain_from_iterable([data, data])) == list(itertools.chain.from_iterable([data, data]))
        for bounds in ((2,), (1, None), (0, 3, 2), (1, None, 2), (5,)):
            assert list(fx._islice(data, *bounds)) == list(itertools.islice(data, *bounds)), bounds
        assert list(fx._accumulate(data[:3] if data != "abcd" else [1, 2])) == \
            list(itertools.accumulate(data[:3] if data != "abcd" else [1, 2]))
        assert list(fx._pairwise(data)) == list(itertools.pairwise(data))
        assert list(fx._zip_longest(data, [9], fillvalue=0)) == list(itertools.zip_longest(data, [9], fillvalue=0))
        assert [(k, list(g)) for k, g in fx._GroupBy(data, key=lambda v: v in (1, "a"))] == \
            [(k, list(g)) for k, g in itertools.groupby(data, key=lambda v: v in (1, "a"))]
        assert [len(list(g)) for _, g in list(fx._GroupBy(data))] == \
            [len(list(g)) for _, g in list(itertools.groupby(data))]
        for r in range(5):
            assert list(fx._combinations(data, r)) == list(itertools.combinations(data, r))
            assert list(fx._combinations_with_replacement(data, r)) == \
                list(itertools.combinations_with_replacement(data, r))
            assert list(fx._permutations(data, r)) == list(itertools.permutations(data, r))
        assert list(fx._permutations(data)) == list(itertools.permutations(data))
        for repeat in (0, 1, 2):
            assert list(fx._product(data, [7, 8], repeat=repeat)) == \
                list(itertools.product(data, [7, 8], repeat=repeat))
    assert list(fx._product()) == list(itertools.product())
    it = iter([1, 2, 3, 4])  # consumption: what islice leaves in its iterator
    assert list(fx._islice(it, 2)) == [1, 2] and next(it) == 3
    for n in (0, 1, 3):  # tee: independent iterators over one source, each consuming it only as far as it is ahead
        source = iter([1, 2, 3])
        tees = fx._tee(source, n)
        assert len(tees) == n and all(list(t) == [1, 2, 3] for t in tees)
    for tee in (fx._tee, itertools.tee):  # what each iterator sees after the source was advanced elsewhere
        source = iter([1, 2, 3, 4, 5])
        a, b = tee(source)
        assert [next(a), next(a), next(b), next(source)] == [1, 2, 1, 3]
        assert list(b) == [2, 4, 5] and list(a) == [4, 5]
    with pytest.raises(ValueError, match="n must be >= 0"):
        fx._tee([], -1)
    data = [3, 1, 2, 1]
    cmp = lambda a, b: (a > b) - (a < b)  # noqa: E731
    assert sorted(data, key=fx._cmp_to_key(cmp)) == sorted(data, key=functools.cmp_to_key(cmp))
    assert max(data, key=fx._cmp_to_key(cmp)) == max(data, key=functools.cmp_to_key(cmp))


# an attribute the traced code looked for and did not find: thunder 0.2.6 recorded nothing, so after the attribute was
# set the trace made without it ran (a silently wrong result)

class _Bonus(torch.nn.Module):
    def forward(self, x):
        return x + getattr(self, "bonus", 0)


class _Plain:
    pass


def _caught(o, x):
    try:
        return x + o.bonus
    except AttributeError:
        return x


def _fn_attribute(x):
    return x + getattr(_fn_attribute, "bonus", 0)


@pytest.mark.parametrize("case", ["module getattr default", "object getattr default", "hasattr", "caught AttributeError",
                                  "function attribute"])
def test_an_attribute_found_missing_is_guarded_as_missing(case):
    x = torch.zeros(2)
    if case == "module getattr default":
        owner = _Bonus()
        f, args = owner, (x,)
    elif case == "function attribute":
        owner = _fn_attribute
        f, args = _fn_attribute, (x,)
    else:
        owner = _Plain()
        f = {"object getattr default": lambda o, x: x + getattr(o, "bonus", 0),
             "hasattr": lambda o, x: x + (1 if hasattr(o, "bonus") else 0),
             "caught AttributeError": _caught}[case]
        args = (owner, x)
    jf = thunder_subclass.jit(f)
    try:
        torch.testing.assert_close(jf(*args), f(*args))
        owner.bonus = 5
        torch.testing.assert_close(jf(*args), f(*args))
        assert thunder.cache_misses(jf) == 2
        torch.testing.assert_close(jf(*args), f(*args))
        assert thunder.cache_misses(jf) == 2  # present now, and still: a hit
    finally:
        if case == "function attribute":
            del _fn_attribute.bonus


# attribute reads as transformers 4.x's PretrainedConfig makes them: a class-level __getattribute__ (its attribute_map),
# properties, descriptors and a __getattr__ fallback, read by plain access, getattr with and without a default (also a
# default that is the attribute's own value: getattr(cfg, "output_attentions", getattr(cfg, "output_attentions", d))),
# computed names and hasattr. Each is recorded as eager sees it (present with its value, or missing) and guarded so.

class _Doubled:
    """A data descriptor: ``obj.doubled`` is ``obj._d * 2``."""

    def __get__(self, obj, owner=None):
        return self if obj is None else obj._d * 2

    def __set__(self, obj, value):
        obj._d = value / 2


class _Halved:
    """A non-data descriptor (no ``__set__``): ``obj.halved`` is ``obj._d / 2``."""

    def __get__(self, obj, owner=None):
        return self if obj is None else obj._d / 2


class _ConfigWithGetattribute:
    attribute_map = {"n_layer": "num_hidden_layers"}
    doubled, halved = _Doubled(), _Halved()

    def __init__(self):
        self._output_attentions, self.num_hidden_layers, self._d = 3.0, 2, 4.0

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)

    def __getattr__(self, key):
        if key == "fallback":
            return self._d + 1
        raise AttributeError(key)

    @property
    def output_attentions(self):
        return self._output_attentions

    @property
    def unset(self):  # a property that raises AttributeError: missing, as for hasattr
        if self._d > 10:
            return self._d
        raise AttributeError("unset")


class _PlainConfig:
    doubled, halved = _Doubled(), _Halved()

    def __init__(self):
        self._output_attentions, self.num_hidden_layers, self._d = 3.0, 2, 4.0

    @property
    def output_attentions(self):
        return self._output_attentions

    @property
    def unset(self):
        if self._d > 10:
            return self._d
        raise AttributeError("unset")


_READS = {
    "plain": lambda c, n: getattr(c, n),
    "default": lambda c, n: getattr(c, n, -1.0),
    "own value as default": lambda c, n: getattr(c, n, getattr(c, n, -1.0)),
    "computed name": lambda c, n: getattr(c, "".join(n), -1.0),
    "hasattr": lambda c, n: 7.0 if hasattr(c, n) else -7.0,
}
# (attribute, how the test changes what eager reads: a function of the config)
_ATTRIBUTES = {
    "output_attentions": lambda c: setattr(c, "_output_attentions", 5.0),  # a property
    "n_layer": lambda c: setattr(c, "num_hidden_layers", 6),  # an attribute_map alias (class with __getattribute__)
    "doubled": lambda c: setattr(c, "_d", 1.0),  # a data descriptor
    "halved": lambda c: setattr(c, "_d", 1.0),  # a non-data descriptor
    "fallback": lambda c: setattr(c, "_d", 1.0),  # __getattr__ (class with __getattribute__)
    "unset": lambda c: setattr(c, "_d", 12.0),  # a property raising AttributeError, then returning
    "later": lambda c: setattr(c, "later", 9.0),  # missing, then an instance attribute
}


@pytest.mark.parametrize("read", list(_READS))
@pytest.mark.parametrize("attribute", list(_ATTRIBUTES))
@pytest.mark.parametrize("config_cls", [_ConfigWithGetattribute, _PlainConfig])
def test_attribute_reads_are_recorded_and_guarded_as_eager_sees_them(config_cls, attribute, read):
    config = config_cls()
    if attribute in ("n_layer", "fallback") and config_cls is _PlainConfig:
        pytest.skip("attribute_map and __getattr__ belong to the class with __getattribute__")
    if read == "plain" and not hasattr(config, attribute):
        pytest.skip("a plain read of a missing attribute raises (eager and compiled alike)")
    name = tuple(attribute) if read == "computed name" else attribute

    def f(x, c):
        return x * _READS[read](c, name)

    x = torch.ones(2)
    jf = thunder_subclass.jit(f)
    torch.testing.assert_close(jf(x, config), f(x, config))  # the call a trace was made from runs
    torch.testing.assert_close(jf(x, config), f(x, config))
    assert cache_counts(jf) == (1, 1)
    before = f(x, config)
    _ATTRIBUTES[attribute](config)
    expected = f(x, config)
    torch.testing.assert_close(jf(x, config), expected)
    if not torch.equal(expected, before):
        assert thunder.cache_misses(jf) == 2  # what eager reads changed: a new trace, never the stale one


def test_a_trace_that_rejects_the_call_it_was_made_from_raises_a_typed_internal_error(monkeypatch):
    # a plugin bug of this class (the trace records an attribute as missing that eager found) is simulated by making
    # the plugin record the attribute it looked for as missing under another name, one that the object does have
    import dataclasses

    from thunder_subclass import hooks
    from thunder_subclass._thunder_internals import plugin_state
    from thunder_subclass.errors import TraceSelfCheckError

    recorded = hooks.HANDLERS.attribute_absent
    broken = dataclasses.replace(hooks.HANDLERS,
                                 attribute_absent=lambda obj, provenance, name: recorded(obj, provenance, "present"))
    hooks.install()
    monkeypatch.setattr(plugin_state, "handlers", broken)
    monkeypatch.setattr(hooks, "HANDLERS", broken)

    class Holder:
        present = None

        def __init__(self):
            self.present = 1.0

    f = lambda x, o: x + getattr(o, "missing", 2.0)  # noqa: E731
    jf = thunder_subclass.jit(f)
    with pytest.raises(TraceSelfCheckError, match=r"(?s)own prologue rejects the call: .*'present'.*a bug in "
                                                  r"thunder_subclass.*report it"):
        jf(torch.zeros(2), Holder())
    assert thunder.cache_misses(jf) == 1
    assert len(thunder.compile_stats(jf).interpreter_cache) == 0  # the rejecting entry was dropped
    monkeypatch.undo()
    torch.testing.assert_close(jf(torch.zeros(2), Holder()), f(torch.zeros(2), Holder()))


def test_a_missing_attribute_check_names_the_attribute_when_it_fails():
    from thunder_subclass.guards import SubclassGuardFailure, _check_attribute_absent_impl

    o = _Plain()
    _check_attribute_absent_impl(o, "bonus")
    o.bonus = 1
    with pytest.raises(SubclassGuardFailure, match=r"the attribute 'bonus' that the trace found missing on a _Plain"):
        _check_attribute_absent_impl(o, "bonus")


def _deterministic_scale(x):
    return x * (2 if torch.are_deterministic_algorithms_enabled() else 3)


def test_torch_global_state_read_in_traced_code_is_guarded():
    # torch.are_deterministic_algorithms_enabled() (torch._C._get_deterministic_algorithms, run natively) was held as
    # a constant: after torch.use_deterministic_algorithms(True) the trace made with False gave 3x where eager gives 2x
    jf = thunder_subclass.jit(_deterministic_scale)
    x = TwoTensor(torch.randn(3), torch.randn(3))
    before = torch.are_deterministic_algorithms_enabled()
    reasons = []
    try:
        for flag in (False, True, True, False):
            torch.use_deterministic_algorithms(flag)
            out, expected = jf(x), _deterministic_scale(x)
            assert type(out) is TwoTensor
            torch.testing.assert_close(out.a, expected.a) and torch.testing.assert_close(out.b, expected.b)
            reasons.append(thunder_subclass.last_miss_reasons(jf))
    finally:
        torch.use_deterministic_algorithms(before)
    assert reasons[1] == ("torch._C._get_deterministic_algorithms() is True, the trace was made for False",)
    assert thunder.cache_misses(jf) == 2 and thunder.cache_hits(jf) == 2
    assert "check_torch_state" in str(thunder.last_prologue_traces(jf)[-1])


def test_torch_functions_that_read_their_tensor_arguments_are_not_state_queries():
    from thunder_subclass._thunder_internals import is_torch_state_query

    assert is_torch_state_query(torch._C._get_deterministic_algorithms, ())
    assert is_torch_state_query(torch.get_num_threads, ())
    assert not is_torch_state_query(torch.is_floating_point, (torch.ones(1),))
    assert not is_torch_state_query(torch._C._set_deterministic_algorithms, (True,))  # a setter: never re-run
    assert not is_torch_state_query(len, ())


class _Patched(torch.nn.Module):
    def act(self, x):
        return x * 2

    def forward(self, x):
        return self.act(x)


def test_a_method_the_trace_inlined_is_guarded_by_its_function():
    # self.act (a bound method: only its object's type was checked) inlined _Patched.act: a function set on the
    # instance, or another one on the class, reused the trace made with the old one
    m = _Patched()
    jm = thunder_subclass.jit(m)
    x = TwoTensor(torch.randn(3), torch.randn(3))
    steps = [None, lambda: setattr(m, "act", lambda x: x * 3), lambda: delattr(m, "act"),
             lambda: setattr(_Patched, "act", lambda self, x: x * 4)]
    original = _Patched.act
    try:
        for step in steps:
            if step is not None:
                step()
            out, expected = jm(x), m(x)
            torch.testing.assert_close(out.a, expected.a) and torch.testing.assert_close(out.b, expected.b)
    finally:
        _Patched.act = original
    assert thunder.cache_misses(jm) == 3 and thunder.cache_hits(jm) == 1  # the third step is the first trace again
    assert ", not a method of <function _Patched.act" in "".join(thunder_subclass.last_miss_reasons(jm))


def _scaled(x, k=2.0):
    return x * k


def test_the_compiled_function_is_guarded_by_its_code_and_defaults():
    # the compiled function itself (thunder's INPUT_FN) was not checked: a new __code__ or __defaults__ reused the trace
    jf = thunder_subclass.jit(_scaled)
    x = torch.randn(3)
    code, defaults = _scaled.__code__, _scaled.__defaults__
    try:
        torch.testing.assert_close(jf(x), x * 2)
        _scaled.__defaults__ = (5.0,)
        torch.testing.assert_close(jf(x), x * 5)
        _scaled.__code__ = (lambda x, k=2.0: x - k).__code__
        torch.testing.assert_close(jf(x), x - 5)
    finally:
        _scaled.__code__, _scaled.__defaults__ = code, defaults
    torch.testing.assert_close(jf(x), x * 2)
    assert thunder.cache_misses(jf) == 3 and thunder.cache_hits(jf) == 1


class _CountingChild(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stats, self.history = {"n": 0}, []
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        self.stats["n"] += 1
        self.history.append(self.stats["n"])
        return self.lin(x) * self.stats["n"]


class _CountingParent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c = _CountingChild()

    def forward(self, x):
        return self.c(x) + 1


@pytest.mark.parametrize("grad", [False, True])
def test_a_container_a_submodule_holds_changed_by_the_trace_is_written_back_as_in_eager(grad):
    # a dict and a list held by a submodule (reached through nn.Module's _modules) changed by the traced code stayed
    # changed after tracing, and the trace's own prologue, which reads `stats["n"]`, rejected the call it was made
    # from; with gradients, the int handed to the epilogue was marked non-differentiable ("mark_non_differentiable only
    # accepts variable arguments")
    model, eager = _CountingParent(), _CountingParent()
    eager.load_state_dict(model.state_dict())
    jmodel = thunder_subclass.jit(model)
    x = torch.randn(2, 3)
    with torch.set_grad_enabled(grad):
        for _ in range(4):
            torch.testing.assert_close(jmodel(x), eager(x))
            assert model.c.stats == eager.c.stats
            assert model.c.history == eager.c.history
    # each call appends to the list, whose length the written-back trace rests on: a new trace per call (as
    # torch.compile, which guards a list's length), never a stale write-back
    assert thunder.cache_misses(jmodel) == 4


# Issue 40 item 1: a trace made for one module is not reused for another whose parameters differ in kind. An empty
# slot (bias=None, a buffer or submodule registered as None) was not guarded, under any cache option; flags and
# sizes the trace read are guarded under symbolic values too.

_DYNAMIC = [pytest.param(None, id="automatic"), pytest.param(True, id="dynamic"), pytest.param(False, id="static")]


def _call_module(mod, x):
    return mod(x)


def _module_jit(dynamic, first, rows=(6, 7)):
    """A jit of ``_call_module`` that has traced ``first`` (for ``dynamic=None``: at two sizes, so that its newest
    trace has symbolic sizes, as after automatic dynamic shapes)."""
    import warnings

    jf = thunder_subclass.jit(_call_module, dynamic=dynamic)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # thunder: "symbolic values" is experimental
        for n in rows if dynamic is None else rows[-1:]:
            jf(first, torch.randn(n, 8))
    return jf


@pytest.mark.parametrize("dynamic", _DYNAMIC)
@pytest.mark.parametrize("bias_first", [False, True])
def test_a_trace_for_a_linear_without_bias_is_not_reused_for_one_with_bias(dynamic, bias_first):
    plain, biased = torch.nn.Linear(8, 8, bias=False), torch.nn.Linear(8, 8)
    first, second = (biased, plain) if bias_first else (plain, biased)
    jf = _module_jit(dynamic, first)
    misses = thunder.cache_misses(jf)
    x = torch.randn(7, 8)
    torch.testing.assert_close(jf(second, x), second(x))
    assert thunder.cache_misses(jf) == misses + 1
    torch.testing.assert_close(jf(first, x), first(x))  # each hits its own trace
    torch.testing.assert_close(jf(second, x), second(x))
    assert thunder.cache_misses(jf) == misses + 1
    if not bias_first:
        assert "the parameter 'bias' of a Linear is a Parameter; the trace was made for None" in \
            "".join(thunder_subclass.last_miss_reasons(jf))


def test_the_compiled_module_given_a_bias_after_compiling_uses_it():
    m = torch.nn.Linear(8, 4, bias=False)
    jm = thunder_subclass.jit(m)
    x = torch.randn(6, 8)
    torch.testing.assert_close(jm(x), m(x))
    m.bias = torch.nn.Parameter(torch.randn(4))
    torch.testing.assert_close(jm(x), m(x))
    m.bias = None
    torch.testing.assert_close(jm(x), m(x))
    assert thunder.cache_misses(jm) == 2


class _DenseMoE(torch.nn.Module):
    """A bias-free router and biased experts of the same sizes, in a forward that breaks the graph: its children run
    as regions, and regions of one module class share one compiled function."""

    def __init__(self):
        super().__init__()
        self.router = torch.nn.Linear(8, 8, bias=False)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))

    def forward(self, x):
        logits = self.router(x)
        out = torch.zeros_like(x)
        for e in range(3):
            if logits[:, e].sum().item() > -1e9:
                out = out + self.experts[e](x)
        return out[x.sum(1) > -1e9]  # a shape that depends on data: a graph break


def test_graph_break_regions_of_one_class_do_not_share_a_trace_across_bias():
    import warnings

    m = _DenseMoE()
    jm = thunder_subclass.jit(m)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the graph break's warning
        for _ in range(3):
            x = torch.randn(6, 8)
            torch.testing.assert_close(jm(x), m(x))


class _Gated(torch.nn.Module):
    """A flag, a size, an optional buffer and an optional submodule, all read in ``forward``."""

    def __init__(self, scale_on: bool, k: int, shift: bool = False, post: bool = False):
        super().__init__()
        self.scale_on, self.k = scale_on, k
        self.w = torch.nn.Parameter(torch.randn(8, 8))
        self.register_buffer("shift", torch.randn(8) if shift else None)
        self.post = torch.nn.Tanh() if post else None

    def forward(self, x):
        y = x @ self.w
        if self.scale_on:
            y = y * 3
        if self.shift is not None:
            y = y + self.shift
        if self.post is not None:
            y = self.post(y)
        return y[:, : self.k]


@pytest.mark.parametrize("dynamic", _DYNAMIC)
def test_flags_sizes_and_empty_slots_of_a_module_argument_are_guarded(dynamic):
    first = _Gated(True, 4)
    jf = _module_jit(dynamic, first)
    others = [_Gated(False, 4), _Gated(True, 5), _Gated(True, 4, shift=True), _Gated(True, 4, post=True),
              _Gated(False, 3, shift=True, post=True), first]
    for m in others:
        x = torch.randn(7, 8)
        torch.testing.assert_close(jf(m, x), m(x))


# Issue 40 item 3: Python state the trace reads is guarded (a new trace when it changes) or makes the read a graph
# break; each compared with eager across calls where the state changes.

def _same_as_eager_across(jf, f, steps, x=None):
    x = torch.ones(3) if x is None else x
    for step in steps:
        step()
        torch.testing.assert_close(jf(x), f(x))


class _ClassScaled(torch.nn.Module):
    scale = 2.0

    def forward(self, x):
        return x * type(self).scale


def test_a_class_attribute_read_through_type_is_guarded():
    m = _ClassScaled()
    jm = thunder_subclass.jit(m)
    try:
        _same_as_eager_across(jm, m, [lambda: None, lambda: setattr(_ClassScaled, "scale", 3.0),
                                      lambda: setattr(_ClassScaled, "scale", 2.0)])
    finally:
        _ClassScaled.scale = 2.0
    assert thunder.cache_misses(jm) == 2 and thunder.cache_hits(jm) == 1
    assert "type(obj).scale is 3.0, the trace was made for 2.0" in "".join(thunder_subclass.last_miss_reasons(jm))


def _env_scaled(x):
    import os

    return x * float(os.environ.get("THUNDER_SUBCLASS_TEST_SCALE", "1"))


def test_an_environment_variable_read_inside_is_guarded(monkeypatch):
    jf = thunder_subclass.jit(_env_scaled)
    _same_as_eager_across(jf, _env_scaled, [
        lambda: monkeypatch.delenv("THUNDER_SUBCLASS_TEST_SCALE", raising=False),
        lambda: monkeypatch.setenv("THUNDER_SUBCLASS_TEST_SCALE", "2"),
        lambda: monkeypatch.setenv("THUNDER_SUBCLASS_TEST_SCALE", "5"),
        lambda: monkeypatch.delenv("THUNDER_SUBCLASS_TEST_SCALE"),
    ])
    assert thunder.cache_misses(jf) == 3 and thunder.cache_hits(jf) == 1
    assert "os.environ['THUNDER_SUBCLASS_TEST_SCALE'] is '5', the trace was made for '2'" in \
        "".join(thunder_subclass.last_miss_reasons(jf))


def _random_scaled(x):
    import random

    return x * random.random()


def test_random_random_is_drawn_on_every_call_as_in_eager():
    import random

    jf = thunder_subclass.jit(_random_scaled)
    x = torch.ones(3)
    random.seed(0)
    with pytest.warns(thunder_subclass.GraphBreakWarning, match=r"random\.random\(\) at .* returns another value"):
        got = [jf(x) for _ in range(3)]
    random.seed(0)
    expected = [_random_scaled(x) for _ in range(3)]
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    assert not torch.equal(got[0], got[1])
    with pytest.raises(UnsupportedGlobalStateError, match=r"random\.random\(\) at"):
        thunder_subclass.jit(_random_scaled, fullgraph=True)(x)


def _with_options(x, opts={}):  # noqa: B006 - the mutable default is the point
    return x * opts.get("k", 1.0)


def test_a_mutable_default_changed_in_place_is_guarded():
    jf = thunder_subclass.jit(_with_options)
    opts = _with_options.__defaults__[0]
    try:
        _same_as_eager_across(jf, _with_options, [lambda: None, lambda: opts.__setitem__("k", 4.0),
                                                  lambda: opts.__setitem__("k", 5.0)])
    finally:
        opts.clear()
    assert thunder.cache_misses(jf) == 3


def _imported_inside(x):
    import _guarded_settings

    return x * _guarded_settings.factor


def _imported_from_inside(x):
    from _guarded_settings import factor

    return x * factor


@pytest.mark.parametrize("fn", [_imported_inside, _imported_from_inside])
def test_a_module_imported_inside_the_function_is_guarded(fn):
    import _guarded_settings

    jf = thunder_subclass.jit(fn)
    try:
        _same_as_eager_across(jf, fn, [lambda: None, lambda: setattr(_guarded_settings, "factor", 7.0)])
    finally:
        _guarded_settings.factor = 2.0
    assert thunder.cache_misses(jf) == 2
    assert "_guarded_settings.factor is 7.0, the trace was made for 2.0" in \
        "".join(thunder_subclass.last_miss_reasons(jf))


class _Doubling(torch.nn.Module):
    def forward(self, x):
        return x * 2


@pytest.mark.parametrize("where", ["compiled", "argument", "submodule"])
def test_forward_replaced_on_the_instance_is_guarded(where):
    m = _Doubling()
    if where == "compiled":
        jf, f = thunder_subclass.jit(m), m
    elif where == "argument":
        jf, f = functools.partial(thunder_subclass.jit(_call_module), m), functools.partial(_call_module, m)
    else:
        outer = torch.nn.Sequential(m)
        jf, f = thunder_subclass.jit(outer), outer
    _same_as_eager_across(jf, f, [lambda: None, lambda: setattr(m, "forward", lambda x: x * 9),
                                  lambda: delattr(m, "forward")])
    compiled = jf.func if where == "argument" else jf
    assert thunder.cache_misses(compiled) == 2 and thunder.cache_hits(compiled) == 1
    assert "the forward set on the _Doubling instance is <function" in \
        "".join(thunder_subclass.last_miss_reasons(compiled))


class _ShardAware(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3))

    def forward(self, x):
        if getattr(self.w, "_is_sharded", False):
            return x * self.w * 10
        return x * self.w


def test_a_flag_set_on_a_parameter_is_guarded():
    m = _ShardAware()
    jm = thunder_subclass.jit(m)
    _same_as_eager_across(jm, m, [lambda: None, lambda: setattr(m.w, "_is_sharded", True),
                                  lambda: setattr(m.w, "_is_sharded", False), lambda: delattr(m.w, "_is_sharded")])
    assert thunder.cache_misses(jm) == 3 and thunder.cache_hits(jm) == 1


@pytest.mark.parametrize("dynamic", [None, True])
def test_an_aliased_attribute_follows_a_changed_alias_table(dynamic):
    # the attribute name read from attribute_map is a constant of the trace (under symbolic values it was a string
    # proxy, printed into the prologue as `obj.<Proxy ...>`: a SyntaxError); the table entry it came from is checked
    config = _ConfigWithGetattribute()
    config.attribute_map = {"n_layer": "num_hidden_layers"}  # the instance's own table, changed below
    f = lambda x, c: x * c.n_layer  # noqa: E731
    jf = thunder_subclass.jit(f, dynamic=dynamic)
    x = torch.ones(2)
    torch.testing.assert_close(jf(x, config), f(x, config))
    config.num_hidden_layers = 5
    torch.testing.assert_close(jf(x, config), f(x, config))
    config.attribute_map = {"n_layer": "_d"}
    torch.testing.assert_close(jf(x, config), f(x, config))
