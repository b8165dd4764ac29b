"""The interpreter's fast paths (``_thunder_internals.interpreter_speed``) give what thunder's interpreted helpers
give: Python programs that exercise each path (globals, subscripts, loops, ``in``, attribute and item stores, dict
merges, list extends, closures, ``iter``/``next``) return eager's values, read and change their Python inputs as
eager does, and are guarded as before (a changed Python input is a cache miss)."""

from __future__ import annotations

import enum

import thunder
import torch
from torch.testing import assert_close
from torch.testing._internal.two_tensor import TwoTensor

import thunder_subclass
from thunder_subclass import _thunder_internals

SCALE = 3.0
len = len  # a module global shadowing a builtin: read from the globals dict, not __builtins__  # noqa: PLW0127


def _tt(*shape):
    a = torch.randn(*shape)
    return TwoTensor(a, a * 2)


def _check(fn, *args, **kwargs):
    expected = fn(*args, **kwargs)
    jfn = thunder_subclass.jit(fn)
    actual = jfn(*args, **kwargs)
    assert_close(actual, expected)
    assert type(actual) is type(expected)
    return jfn


def test_every_helper_of_thunder_0_2_6_is_recognised():
    thunder_subclass.jit(lambda x: x)  # installs the hooks
    import thunder.core.interpreter as interpreter

    assert interpreter._interpret_call.fast_helpers == 16
    assert interpreter.globals_lookup.__wrapped__ is not None


def test_loops_over_lists_tuples_dicts_and_reversed_sequences():
    def f(x, weights: list, table: dict):
        out = x
        for w in weights:
            out = out * w
        for w in reversed(tuple(weights)):
            out = out + w
        for k in table:
            out = out + table[k]
        for k, v in table.items():
            out = out - v * len(k)
        for i, w in enumerate(weights):
            out = out + i * w
        return out * SCALE

    _check(f, _tt(3), [1.0, 2.0, 3.0], {"a": 1.0, "bb": 2.0})


def test_a_list_that_grows_while_iterated_is_iterated_as_python_does():
    def f(x):
        items = [1, 2]
        seen = []
        for v in items:
            seen.append(v)
            if v < 4:
                items.append(v + 2)
        return x * sum(seen), seen

    expected = f(torch.ones(2))
    out, seen = thunder_subclass.jit(f)(torch.ones(2))
    assert seen == expected[1] == [1, 2, 3, 4, 5]
    assert_close(out, expected[0])


def test_in_and_not_in_on_each_kind_of_container():
    names = ("q", "k")

    def f(x, d: dict, tensors: list):
        out = x
        if "a" in d:
            out = out + 1
        if "z" not in d:
            out = out + 2
        if "k" in names:
            out = out + 3
        if 3 in {1, 2, 3}:
            out = out + 4
        if "ell" in "hello":
            out = out + 5
        if 2.0 not in [1, None, "x"]:
            out = out + 6
        return out

    x = _tt(2)
    _check(f, x, {"a": 1}, [x])
    _check(f, x, {"b": 1}, [])


def test_attribute_and_item_stores_reach_the_callers_objects():
    class Box:
        pass

    def f(x, box, d: dict, lst: list):
        box.scale = 2.0
        d["y"] = box.scale * 3
        local = [0, 1]
        local[0] = 5
        merged = {**d, "z": 1}
        ext = [*lst, *local, *[7, 8]]
        return x * merged["y"] + len(ext) + ext[2]

    x = _tt(3)
    box, d, lst = Box(), {"w": 1}, [0, 1]
    expected = f(x, Box(), {"w": 1}, [0, 1])
    out = thunder_subclass.jit(f)(x, box, d, lst)
    assert_close(out, expected)
    assert box.scale == 2.0
    assert d == {"w": 1, "y": 6.0} and lst == [0, 1]


def test_closures_keywords_and_star_arguments():
    def outer(scale):
        def inner(x, *rest, bias=0.0, **extra):
            return x * scale + bias + sum(rest) + sum(extra.values())
        return inner

    g = outer(4.0)

    def f(x, args: tuple, kwargs: dict):
        return g(x, *args, **kwargs)

    _check(f, _tt(2), (1.0, 2.0), {"bias": 0.5, "c": 3.0})


def test_a_longer_list_or_a_dict_with_other_keys_is_a_cache_miss_not_the_shorter_trace():
    # before: the trace of a 1-item list ran for a 2-item list (thunder checks the items read, not the length)
    def f(x, table: dict, weights: list):
        out = x
        for w in weights:
            out = out * w
        for k in table:
            out = out + table[k]
        return out

    jfn = thunder_subclass.jit(f)
    x = _tt(2)
    expected_reason = {2: "len(", 3: "== ('a',)"}
    for i, (table, weights) in enumerate([({"a": 1.0}, [2.0]), ({"a": 5.0}, [2.0]), ({"a": 5.0}, [2.0, 3.0]),
                                          ({"a": 5.0, "b": 1.0}, [2.0, 3.0]), ({"b": 1.0, "a": 5.0}, (2.0, 3.0))]):
        assert_close(jfn(x, table, weights), f(x, table, weights))
        if i in expected_reason:
            reasons = thunder_subclass.last_miss_reasons(jfn)
            assert any(expected_reason[i] in r for r in reasons), reasons


class _Vec:
    """A Python number-like: __add__ gives NotImplemented for other types, __radd__ answers them."""

    def __init__(self, v):
        self.v = v

    def __add__(self, other):
        return _Vec(self.v + other.v) if isinstance(other, _Vec) else NotImplemented

    def __radd__(self, other):
        return _Vec(self.v + other)


class _Countdown:
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return self

    def __next__(self):
        if self.n == 0:
            raise StopIteration
        self.n -= 1
        return self.n


class _Table:
    def __init__(self, d):
        self.d = d

    def __getitem__(self, key):
        return self.d[key] * 10


def test_operators_partials_methods_len_and_protocols_of_python_classes():
    import functools

    def scaled(x, a, *, b=1.0, c=0.0):
        return x * a + b + c

    class Holder:
        def __init__(self):
            self.k = 2.0

        def method(self, x, *, m=1.0):
            return x * self.k * m

    def f(x, lst: list, tup: tuple, d: dict, holder):
        p = functools.partial(scaled, a=2.0, b=0.5)
        out = p(x, c=1.0) + holder.method(x, m=3.0)
        merged = d | {"extra": 4.0}
        v = 3 + _Vec(2)  # int.__add__ gives NotImplemented: _Vec.__radd__
        w = _Vec(1) + _Vec(v.v)
        steps = [i for i in _Countdown(3)] + [next(iter(_Countdown(2)))]
        try:
            _ = _Vec(1) + "s"
            caught = 0.0
        except TypeError as e:
            caught = 1.0 if "unsupported operand" in str(e) else -1.0
        return (out * (len(lst) + len(tup) + len(merged)) + w.v + sum(steps) + _Table({"a": 1.5})["a"]
                + caught + merged["extra"])

    _check(f, _tt(3), [1, 2], (3,), {"a": 1.0}, Holder())


def test_binary_operators_on_subclass_values_keep_torch_function():
    seen = []

    class Logged(TwoTensor):
        @staticmethod
        def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
            return Logged(inner["a"], inner["b"])

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", str(func)))
            return super().__torch_function__(func, types, args, kwargs or {})

    def f(x, y):
        return x + y * 2 - 1

    a = torch.randn(3)
    x, y = Logged(a, a + 1), Logged(a * 2, a * 3)
    expected = f(x, y)
    eager_seen, seen[:] = list(seen), []
    out = thunder_subclass.jit(f)(x, y)
    assert_close(out, expected)
    # each operator reached Logged.__torch_function__ as in eager (tracing also shows it attribute reads: limits.md)
    assert type(out) is type(expected)
    # each operator reached Logged.__torch_function__ as in eager (tracing also shows it attribute reads: limits.md)
    assert [name for name in seen if name in ("mul", "add", "sub")] == eager_seen == ["mul", "add", "sub"]


class _InterpretedFrames:
    """Counts the Python functions thunder's interpreter runs frame by frame, by name, while in the block."""

    def __enter__(self):
        import collections

        import thunder.core.interpreter as interpreter

        thunder_subclass.jit(lambda x: x)  # the plugin's hooks first (they look into thunder's own functions)
        self.counts = collections.Counter()
        self._interpreter = interpreter
        self._original = original = interpreter._setup_frame_and_run_python_function

        def counting(compilectx, runtimectx, wrapped_fn, /, *args, **kwargs):
            fn = interpreter.unwrap(wrapped_fn)
            self.counts[getattr(fn, "__qualname__", None)] += 1
            return original(compilectx, runtimectx, wrapped_fn, *args, **kwargs)

        interpreter._setup_frame_and_run_python_function = counting
        return self

    def __exit__(self, *exc):
        self._interpreter._setup_frame_and_run_python_function = self._original


def test_module_attributes_are_read_as_module_getattr_reads_them_and_stay_guarded():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)
            self.register_buffer("shift", torch.ones(3))
            self.scale = torch.nn.Parameter(_tt(3))

        def forward(self, x):
            extra = getattr(self, "missing", None)
            has = hasattr(self, "also_missing")
            return self.lin(x) * self.scale + self.shift + (0.0 if extra is None or has else 1.0)

    m = Block()
    x = _tt(2, 3)
    jm = thunder_subclass.jit(m)
    with _InterpretedFrames() as frames:
        assert_close(jm(x), m(x))
    # lin, scale, shift, lin.weight, lin.bias are read without interpreting Module.__getattr__; names no dict holds
    # (the AttributeError path: "missing", "also_missing") are interpreted
    assert 1 <= frames.counts["Module.__getattr__"] <= 2
    with torch.no_grad():
        m.lin.weight.mul_(2.0)
    assert_close(jm(x), m(x))  # the same parameter object changed in place: the same trace, the new values
    assert thunder.cache_misses(jm) == 1
    m.scale = torch.nn.Parameter(_tt(3) + 5)  # a new parameter object, as eager reads it
    m.lin.bias = torch.nn.Parameter(torch.zeros(3))
    assert_close(jm(x), m(x))
    m.register_buffer("shift", torch.full((4,), 2.0)[:3])
    assert_close(jm(x), m(x))

    class Overridden(Block):
        def __getattr__(self, name):  # a module's own __getattr__ is interpreted: its reads are its own
            return super().__getattr__(name) if name != "scale" else 2.0 * super().__getattr__(name)

    o = Overridden()
    assert_close(thunder_subclass.jit(o)(x), o(x))


def test_transformers_config_reads_are_native_and_guarded_by_value():
    transformers = __import__("pytest").importorskip("transformers")

    config = transformers.GPT2Config(n_layer=2, n_embd=8, n_head=2)  # num_hidden_layers is n_layer (attribute_map)

    def f(x, cfg):
        layers = cfg.num_hidden_layers
        window = getattr(cfg, "sliding_window_that_gpt2_lacks", 3)
        return x * layers + window + cfg.n_embd + (1.0 if cfg.use_cache else 0.0)

    jfn = thunder_subclass.jit(f)
    x = _tt(2)
    with _InterpretedFrames() as frames:
        assert_close(jfn(x, config), f(x, config))
    assert frames.counts["PreTrainedConfig.__getattribute__"] == 0
    config.num_hidden_layers = 5  # writes n_layer through attribute_map: the prologue's read sees it
    assert_close(jfn(x, config), f(x, config))
    assert thunder.cache_misses(jfn) == 2
    assert any("== 2)" in r for r in thunder_subclass.last_miss_reasons(jfn))  # the layer count read before


def test_uninstall_restores_thunders_handlers_and_plain_thunder_runs_loops():
    thunder_subclass.jit(lambda x: x)
    import thunder.core.interpreter as interpreter

    hooked = ("BINARY_SUBSCR", "FOR_ITER", "CONTAINS_OP", "STORE_ATTR", "STORE_SUBSCR")
    assert all(getattr(interpreter._default_opcode_handler_map[op], "_thunder_subclass_hook", False) for op in hooked)
    _thunder_internals.uninstall()
    try:
        assert not any(getattr(interpreter._default_opcode_handler_map[op], "_thunder_subclass_hook", False)
                       for op in hooked)
        assert not getattr(interpreter._interpret_call, "_thunder_subclass_hook", False)
        assert not getattr(interpreter._default_lookaside_map[next], "_thunder_subclass_hook", False)

        def f(x, ws):
            for w in ws:
                x = x * w
            return x if "a" in {"a": 1} else -x

        assert_close(thunder.jit(f)(torch.ones(2), [2.0, 3.0]), torch.full((2,), 6.0))
    finally:
        thunder_subclass.jit(lambda x: x)  # installs again
    assert getattr(interpreter._default_opcode_handler_map["FOR_ITER"], "_thunder_subclass_hook", False)


def _scaled_views(x, y):
    z = x + y
    z = z * 2
    z = z.reshape(-1, 2)
    z = z.transpose(dim0=0, dim1=1)
    z = z.add(y.reshape(3, -1).transpose(0, 1), alpha=0.5)
    return torch.exp(-z)


def _symbols(trace) -> list[str]:
    return [f"{bsym.sym.name}{tuple(str(a) for a in bsym.flat_args)}{sorted(bsym.kwargs)}"
            for bsym in trace.bound_symbols]


def test_thunders_dtensor_dispatch_wrapper_is_called_through_not_interpreted():
    # thunder 0.2.6 registers `dispatch_to_impl.<locals>.wrapper` for add, mul, reshape, transpose, exp, neg, ...;
    # tensor methods reach it as interpreted Python (plain thunder.jit runs it frame by frame below)
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    plain = thunder.jit(_scaled_views)
    with _InterpretedFrames() as frames:
        assert_close(plain(x, y), _scaled_views(x, y))
    assert frames.counts["dispatch_to_impl.<locals>.wrapper"] >= 4

    jfn = thunder_subclass.jit(_scaled_views)
    with _InterpretedFrames() as frames:
        assert_close(jfn(x, y), _scaled_views(x, y))
    assert frames.counts["dispatch_to_impl.<locals>.wrapper"] == 0
    assert frames.counts["tree_flatten"] == 0
    # the symbols (with their keywords) the interpreted wrapper called, on the same arguments
    assert _symbols(thunder.last_traces(jfn)[0]) == _symbols(thunder.last_traces(plain)[0])
    # the trace names the user's line where the interpreted wrapper's own line was recorded
    source = str(thunder.last_traces(jfn)[0])
    assert "z = z.transpose(dim0=0, dim1=1)" in source and "dtensor_torch_and_prims" not in source
    assert "dtensor_torch_and_prims" in str(thunder.last_traces(plain)[0])

    tx, ty = _tt(2, 3), _tt(2, 3)
    jsub = thunder_subclass.jit(_scaled_views)
    with _InterpretedFrames() as frames:
        out = jsub(tx, ty)
    expected = _scaled_views(tx, ty)
    assert type(out) is type(expected) is TwoTensor
    assert_close(out.a, expected.a)
    assert_close(out.b, expected.b)
    assert frames.counts["dispatch_to_impl.<locals>.wrapper"] == 0
    names = [bsym.sym.name for bsym in thunder.last_traces(jsub)[0].bound_symbols]
    assert [n for n in names if n in ("add", "mul", "reshape", "transpose", "neg", "exp")] == \
        ["add", "mul", "reshape", "transpose", "reshape", "transpose", "add", "neg", "exp"]


class _Mode(enum.Enum):
    A = 1
    B = 2
    C = 3


class _StrMode(str, enum.Enum):  # str's __eq__ and __hash__ (transformers' ExplicitEnum)
    X = "x"
    Y = "y"


class _LooseMode(enum.Enum):  # a Python __eq__: thunder's interpreted path decides
    P = 1
    Q = 2

    def __eq__(self, other):
        return self is other or other == self.value

    __hash__ = enum.Enum.__hash__


def _memberships(x, mode, kind, loose):
    found = [
        type(x) in {TwoTensor, int},
        type(x) in {float, int},
        type(x) not in {float, list},
        type(kind) in {float, str},
        kind in (str, int),
        int in (str, kind, None),
        mode in (_Mode.A, _Mode.B),
        mode not in [_Mode.B, _Mode.C],
        mode in {_Mode.C},
        _StrMode.X in (_StrMode.Y, "x"),
        _StrMode.Y in (1, None, _Mode.A),
    ]
    looses = [loose in (_LooseMode.Q, 1), loose not in (2,)]
    return x * sum(2 ** i for i, f in enumerate(found) if f), found, looses


def test_classes_and_enum_members_are_found_natively_with_pythons_answer():
    jfn = thunder_subclass.jit(_memberships)
    x = _tt(2)
    for mode, kind, loose in [(_Mode.A, int, _LooseMode.P), (_Mode.C, float, _LooseMode.Q),
                              (_Mode.B, str, _LooseMode.P)]:
        expected = _memberships(x, mode, kind, loose)
        with _InterpretedFrames() as frames:
            out, found, looses = jfn(x, mode, kind, loose)
        assert (found, looses) == (expected[1], expected[2])
        assert_close(out, expected[0])
        # only the two `in`s on the enum with a Python __eq__ interpret thunder's `impl`
        assert frames.counts["_contains_op_handler.<locals>.impl"] == 2
    assert thunder.cache_misses(jfn) == 3  # each mode/kind is guarded: a new one is a new trace
