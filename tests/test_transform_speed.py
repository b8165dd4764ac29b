"""Trace-building fast paths (``_thunder_internals.transform_speed``) give thunder's results: the one-pass
``tree_flatten_with_dataclass`` gives thunder's leaves, spec, registrations and errors; the indexed
``add_constraint`` keeps exactly the constraints thunder's duplicate scan keeps; the executors' pass made only for
``maybe_sort_waits`` is skipped when nothing could become a distributed ``wait``."""

from __future__ import annotations

import collections
import dataclasses
import re
import sys
import types

import pytest
import thunder
import torch
from torch.testing import assert_close
from torch.testing._internal.two_tensor import TwoTensor

import thunder_subclass
from thunder_subclass._thunder_internals import transform_speed


def _original(owner, name):
    thunder_subclass.install_hooks()
    return sys.modules["thunder_subclass._thunder_internals.install"]._originals[(id(owner), name)][2]


@dataclasses.dataclass
class _Inner:
    a: object
    b: object


@dataclasses.dataclass
class _Outer:
    inner: object
    c: object


_Pair = collections.namedtuple("_Pair", ["x", "y"])


def _plain_trees():
    t = torch.ones(2)
    return [(1, [2.0, None], {"k": t, "j": (t, 3)}), _Pair(t, ["s", (t,)]), ()]


def _trees_thunder_rebuilds():  # thunder's first pass changes these (new dataclass instances, Size -> tuple)
    t = torch.ones(2)
    return [[_Outer(_Inner(t, 1), {"z": t})], _Inner(_Outer(t, 2), t), _Pair(t, [torch.Size([2, 3])]),
            (slice(1, 2),)]


def _spy(monkeypatch, owner, name: str, what=lambda first, *rest: first) -> list:
    """A list that records ``what(*args)`` of every call of ``owner.name`` from now on (the call itself still runs)."""
    calls = []
    original = getattr(owner, name)

    def recording(*args, **kwargs):
        calls.append(what(*args))
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, recording)
    return calls



@pytest.fixture(autouse=True)
def _every_jit_traces():
    """These tests count what tracing does: a second jit of the same code must trace, not load from the disk cache
    (on by default; conftest restores the setting)."""
    thunder_subclass.config.disk_cache = False

def test_one_pass_flatten_gives_thunders_leaves_specs_and_registrations():
    import thunder.core.symbol as symbol

    original = _original(symbol, "tree_flatten_with_dataclass")
    assert symbol.tree_flatten_with_dataclass is not original
    delegated = []

    def spy(tree):
        delegated.append(tree)
        return original(tree)

    for tree in _plain_trees():
        fast_leaves, fast_spec = transform_speed.fast_tree_flatten_with_dataclass(tree, spy)
        leaves, spec = original(tree)
        assert len(fast_leaves) == len(leaves) and all(a is b for a, b in zip(fast_leaves, leaves))
        assert fast_spec == spec
    assert delegated == []
    for tree in _trees_thunder_rebuilds():  # thunder's own function: the same registrations, leaves and specs
        transform_speed.fast_tree_flatten_with_dataclass(tree, spy)
        assert delegated[-1] is tree

    with pytest.raises(TypeError, match="tree_flatten of type <class 'object'> is not supported"):
        transform_speed.fast_tree_flatten_with_dataclass(object(), spy)
    with pytest.raises(TypeError, match="tree_flatten of type <class 'object'> is not supported"):
        original(object())


def test_tree_flatten_with_its_code_swapped_gives_thunders_results_and_is_restored():
    import thunder.core.pytree as pytree
    from thunder.core.proxies import TensorProxy
    from thunder.core.trace import TraceCtx, tracectx

    thunder_subclass.install_hooks()
    fn = pytree.tree_flatten
    original_code = _original(fn, "__code__")
    assert fn.__code__ is not original_code
    thunder_code = types.FunctionType(original_code, fn.__globals__, "tree_flatten", fn.__defaults__)
    # the plain types are found by calling thunder's code: each is in thunder's set, and the usual ones are there
    plain = transform_speed.plain_flatten_types(thunder_code)
    assert {tuple, list, dict, int, float, bool, str, type(None), torch.dtype, torch.device, torch.Size} <= plain
    assert object not in plain and _Pair not in plain
    with tracectx(TraceCtx()):
        proxy = TensorProxy(shape=(2,), device=thunder.devices.cpu, dtype=thunder.dtypes.float32)
    trees = [*_plain_trees(), *_trees_thunder_rebuilds(), proxy, (proxy, [proxy, 1]), _Pair(proxy, 2), None, 3,
             torch.float32, {"a": torch.Size([1, 2])}]
    for tree in trees:  # the same leaves and specs as thunder's code, through every module that bound the function
        for namespace in ("thunder", ""):
            leaves, spec = fn(tree, namespace)
            expected_leaves, expected_spec = thunder_code(tree, namespace)
            assert len(leaves) == len(expected_leaves) and all(a is b for a, b in zip(leaves, expected_leaves))
            assert spec == expected_spec
        assert thunder.core.symbol.tree_flatten(tree)[1] == thunder_code(tree)[1]
    for bad in (object(), torch.nn.Linear(1, 1)):  # thunder's error, from thunder's code
        with pytest.raises(TypeError, match=f"tree_flatten of type {type(bad)!r} is not supported"):
            fn(bad)
    thunder_subclass.uninstall_hooks()
    try:
        assert fn.__code__ is original_code
        assert "_thunder_subclass_checked" not in fn.__dict__ and "_thunder_subclass_plain_types" not in fn.__dict__
        assert fn((1, 2))[0] == [1, 2]
    finally:
        thunder_subclass.install_hooks()
    assert fn.__code__ is not original_code and fn((1, [2]))[0] == [1, 2]


def test_symbol_normalize_binds_as_thunder_with_one_signature_per_meta():
    import inspect

    import thunder.core.prims as prims
    import thunder.core.symbol as symbol
    import thunder.torch as ltorch

    original = _original(symbol.Symbol, "normalize")
    assert symbol.Symbol.normalize is not original
    calls = [(ltorch.linear, (1, 2), {}), (ltorch.linear, (1, 2), {"bias": 3}),
             (ltorch.sum, (1,), {"dim": 0, "keepdim": True}), (ltorch.sum, (1, 0, True), {"dtype": 4}),
             (prims.broadcast_in_dim, (1, (2, 3), (1,)), {}), (prims.broadcast_in_dim, (1,), {"shape": (2,),
                                                                                            "broadcast_dimensions": ()})]
    for sym, args, kwargs in calls:
        assert sym.normalize(*args, **kwargs) == original(sym, *args, **kwargs)
        assert transform_speed.meta_signature(sym.meta) is transform_speed.meta_signature(sym.meta)
        assert transform_speed.meta_signature(sym.meta) == inspect.signature(sym.meta)
    for bad_args, bad_kwargs, message in (((1,), {}, "missing a required argument: 'w'"),
                                          ((1,), {"w": 2}, "'w' parameter is positional only")):
        with pytest.raises(TypeError, match=message):
            ltorch.linear.normalize(*bad_args, **bad_kwargs)
        with pytest.raises(TypeError, match=message):
            original(ltorch.linear, *bad_args, **bad_kwargs)


def test_indexed_add_constraint_keeps_what_thunders_scan_keeps():
    import thunder.core.jit_ext as jit_ext
    from thunder.core.proxies import IntegerProxy

    original = _original(jit_ext.JitCtx, "add_constraint")
    hooked = jit_ext.JitCtx.add_constraint
    assert hooked is not original
    from thunder.core.trace import TraceCtx, tracectx

    with tracectx(TraceCtx()):
        p, q = IntegerProxy(name="n0", value=3), IntegerProxy(name="n1", value=3)
    with tracectx(TraceCtx()):
        same_name = IntegerProxy(name="n0", value=3)  # another object of the same name: the same variable
    check = object()
    constraints = [
        (check, p, 3), (check, same_name, 3), (check, q, 3), (check, p, 4), (check, p, 3.0),
        (check, [1, 2], p), (check, [1, 2], p),  # unhashable: thunder's scan
        (check, p), (len, p, 3), (check, p, 3),
    ]
    ours, theirs = types.SimpleNamespace(_constraints=[]), types.SimpleNamespace(_constraints=[])
    for c in constraints:
        hooked(ours, c)
        original(theirs, c)
    assert ours._constraints == theirs._constraints
    assert len(ours._constraints) == 6

    # a list thunder replaced, or items appended to it directly, are indexed again
    ours._constraints = [(check, q, 3)]
    hooked(ours, (check, q, 3))
    ours._constraints.append((check, p, 5))
    hooked(ours, (check, p, 5))
    hooked(ours, (check, p, 6))
    assert ours._constraints == [(check, q, 3), (check, p, 5), (check, p, 6)]


def test_the_executors_pass_made_only_to_look_for_waits_is_skipped(monkeypatch):
    from thunder_subclass.transforms import tangents

    def f(x, w):
        return torch.nn.functional.linear(x, w).relu() * 2

    x = torch.randn(3, 4)
    w = TwoTensor(torch.randn(5, 4), torch.randn(5, 4))
    calls = _spy(monkeypatch, tangents, "flatten_subclasses")
    jf = thunder_subclass.jit(f)
    out = jf(x, w)
    assert_close(out, f(x, w))
    assert type(out) is TwoTensor
    assert len(calls) == 1  # transform_for_execution's pass; not thunder's earlier pass for maybe_sort_waits
    trace = str(thunder.last_traces(jf)[-1])  # flattened before executors as before: aten ops on the inner tensors
    assert trace.count("torch.nn.functional.relu(") == 2 and "unflatten_TwoTensor((" in trace


def test_a_trace_with_a_distributed_wait_is_still_probed():
    def bsym(name, subsymbols=()):
        return types.SimpleNamespace(sym=types.SimpleNamespace(id=name, name=name), subsymbols=list(subsymbols))

    plain = types.SimpleNamespace(bound_symbols=[bsym("add", [bsym("mul")]), bsym("return")])
    nested = types.SimpleNamespace(bound_symbols=[bsym("all_reduce_and_wait", [bsym("all_reduce"), bsym("wait")])])
    assert not transform_speed.may_hold_waits(plain)
    assert transform_speed.may_hold_waits(nested)
    assert not transform_speed.is_sort_waits_probe(depth=1)  # called from a test, not from thunder


def test_plain_thunder_jit_still_runs_thunders_probe():
    thunder_subclass.install_hooks()
    import thunder.executors.passes as passes

    seen = []
    hooked = passes._transform_for_operator_executor_execution

    def spy(trace, executors_list):
        seen.append(len(trace.bound_symbols))
        return hooked(trace, executors_list)

    passes._transform_for_operator_executor_execution = spy
    try:
        jf = thunder.jit(lambda x: (x * 2).sin())
        x = torch.randn(3)
        assert_close(jf(x), (x * 2).sin())
    finally:
        passes._transform_for_operator_executor_execution = hooked
    assert len(seen) == 5  # prologue's two, the probe, the computation's two: a plain jit is thunder's


def test_the_source_a_callable_was_built_from_is_kept_for_the_disk_cache():
    from thunder.common import transform_to_torch_types

    def f(x, w):
        return torch.nn.functional.linear(x, w).relu() * 2

    x = torch.randn(3, 4)
    w = TwoTensor(torch.randn(5, 4), torch.randn(5, 4))
    jf = thunder_subclass.jit(f)
    jf(x, w)
    entry = thunder.compile_stats(jf).interpreter_cache[-1]
    prologue = entry.prologue_traces[-1]
    source, ctx = transform_speed.printed_trace(prologue, include_decorators=False)
    assert source == prologue.python(include_decorators=False) and ctx.keys() == prologue.python_ctx().keys()
    # the computation's callable is built from a last trace thunder does not keep: found through the function
    computation = transform_to_torch_types(entry.computation_traces[-1])
    source, ctx = transform_speed.printed_trace(entry.computation_traces[-1], entry.computation_fn)
    assert source == computation.python() and ctx.keys() == computation.python_ctx().keys()
    assert transform_speed.printed_trace(entry.computation_traces[-1]) is None
    # a trace changed after its callable was built is printed again
    prologue.bound_symbols = prologue.bound_symbols[:-1]
    assert transform_speed.printed_trace(prologue, include_decorators=False) is None
    # another printing option was not recorded
    assert transform_speed.printed_trace(entry.computation_traces[-1], entry.computation_fn, print_depth=2) is None


def test_tracing_collects_garbage_less_often_and_restores_the_thresholds():
    import gc

    from thunder_subclass._thunder_internals import runtime

    # the threshold gc.get_threshold() answers while the call traces is baked into the trace as a constant (an
    # unguarded native read): the compiled program returns x * that number on every call
    def f(x):
        return x * gc.get_threshold()[0]

    def g(x):
        raise ValueError("the program's own error")

    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        jf = thunder_subclass.jit(f)
        traced = runtime.TRACING_GC_THRESHOLD
        torch.testing.assert_close(jf(torch.ones(2)), torch.full((2,), float(traced)))
        assert gc.get_threshold() == (700, 10, 10)
        torch.testing.assert_close(jf(torch.ones(2)), torch.full((2,), float(traced)))  # a cache hit: untouched
        assert thunder.cache_hits(jf) == 1 and gc.get_threshold() == (700, 10, 10)
        with pytest.raises(ValueError, match="the program's own error"):
            thunder_subclass.jit(g)(torch.ones(2))
        assert gc.get_threshold() == (700, 10, 10)
        gc.disable()  # a collector the user turned off stays off, thresholds as they were
        torch.testing.assert_close(thunder_subclass.jit(f)(torch.ones(3)), torch.full((3,), 700.0))
        assert not gc.isenabled()
    finally:
        gc.enable()
        gc.set_threshold(*before)


def _twotensor_mlp(depth: int, requires_grad: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        lin = torch.nn.Linear(8, 8, bias=False)
        w = lin.weight.detach()
        lin.weight = torch.nn.Parameter(TwoTensor(w.clone(), w * 2), requires_grad=requires_grad)
        layers += [lin, torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def test_identical_subclass_operations_share_one_fake_run(monkeypatch):
    # every layer's linear on a TwoTensor weight of the same metadata: __torch_dispatch__ runs on fakes once per
    # distinct operation, and the trace (names included) and results are those of one fake run per operation
    from thunder_subclass.frontend import recording

    runs = _spy(monkeypatch, recording, "run_on_fakes")
    model, x = _twotensor_mlp(4), torch.randn(3, 8)
    shared = thunder_subclass.jit(model)
    out = shared(x)
    shared_runs = len(runs)
    monkeypatch.setattr(recording, "memo_key", lambda *a: None)  # every operation runs on fakes
    runs.clear()
    alone = thunder_subclass.jit(model)
    expected = alone(x)
    assert shared_runs < len(runs) and runs.count(torch.nn.functional.linear) == 4
    assert type(out) is type(expected) is TwoTensor
    assert_close(out.a, expected.a) and assert_close(out.b, expected.b)
    assert_close(out.a, model(x).a) and assert_close(out.b, model(x).b)
    for traces_a, traces_b in ((thunder.last_traces(shared), thunder.last_traces(alone)),
                               (thunder.last_backward_traces(shared), thunder.last_backward_traces(alone))):
        def text(t):  # without the pass timings
            return re.sub(r" \(took \d+ milliseconds\)", "", str(t))

        assert [text(t) for t in traces_a] == [text(t) for t in traces_b]


def test_a_shared_fake_run_trains_as_eager():
    model = _twotensor_mlp(3, requires_grad=True)
    reference = _twotensor_mlp(3, requires_grad=True)
    x = torch.randn(3, 8)
    jm = thunder_subclass.jit(model)
    out, expected = jm(x), reference(x)
    out.sum().backward()
    expected.sum().backward()
    assert_close(out.a, expected.a) and assert_close(out.b, expected.b)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert type(p.grad) is type(q.grad)
        assert_close(p.grad.a, q.grad.a) and assert_close(p.grad.b, q.grad.b)


def test_fake_runs_are_shared_only_between_operations_with_the_same_key(monkeypatch):
    from thunder_subclass.frontend import recording

    runs = _spy(monkeypatch, recording, "run_on_fakes")

    def f(a, b, c):
        return a * a + a * b + a * c + (b * c).sum()

    a, b = TwoTensor(torch.randn(4), torch.randn(4)), TwoTensor(torch.randn(4), torch.randn(4))
    c = TwoTensor(torch.randn(4, 1), torch.randn(4, 1))
    out, expected = thunder_subclass.jit(f)(a, b, c), f(a, b, c)
    assert_close(out.a, expected.a) and assert_close(out.b, expected.b)
    # a * a (one value twice: one fake), a * b (two values), a * c (another shape) each ran on fakes; b * c has a * c's
    # key and shared its run
    muls = [fn for fn in runs if getattr(fn, "__name__", "") == "mul"]
    assert len(muls) == 3, runs
    assert recording.memo_key(torch.mul, (1, 2), {}) is None  # outside a jit's tracing: nothing to share with


def test_result_layouts_of_plain_operations_are_computed_once_per_layout(monkeypatch):
    # the strides of plain intermediate values (which subclass dispatch may look at) come from running their
    # producing operations on fakes; the same operation on the same layouts is run once
    from thunder_subclass.frontend import fake

    calls = _spy(monkeypatch, fake, "_run_on_fakes", lambda fns, bsym: bsym.sym.name)
    monkeypatch.setattr(fake, "_LAYOUTS", {})

    def f(x, w1, w2):
        h = (x.t() * 2).t()  # a transposed intermediate: its strides are not contiguous
        return torch.nn.functional.linear(h, w1) + torch.nn.functional.linear((x.t() * 2).t(), w2)

    x = torch.randn(4, 3).t().contiguous().t()
    w1 = TwoTensor(torch.randn(5, 3), torch.randn(5, 3))
    w2 = TwoTensor(torch.randn(5, 3), torch.randn(5, 3))
    expected = f(x, w1, w2)
    out = thunder_subclass.jit(f)(x, w1, w2)
    assert calls == ["t", "mul", "t"]  # (x.t() * 2).t() the second time: the same operations on the same layouts
    monkeypatch.setattr(fake, "_layouts_key", lambda bsym: None)  # nothing shared
    calls.clear()
    alone = thunder_subclass.jit(f)(x, w1, w2)
    assert calls == ["t", "mul", "t"] * 2
    for o in (out, alone):
        assert_close(o.a, expected.a) and assert_close(o.b, expected.b)


def _all_bsyms(bsyms):
    for b in bsyms:
        yield b
        yield from _all_bsyms(b.subsymbols)


def _up_to_names(trace) -> str:
    """The trace's text with each proxy name replaced by its order of first appearance (and no pass timings)."""
    names = {p.name for b in _all_bsyms(trace.bound_symbols) for p in (*b.flat_proxy_args, *b.flat_proxy_outs)}
    text = re.sub(r" \(took \d+ milliseconds\)", "", str(trace))
    order: dict[str, str] = {}
    return re.sub(r"\b\w+\b", lambda m: order.setdefault(m[0], f"v{len(order)}") if m[0] in names else m[0], text)


def _mixed_model(requires_grad: bool) -> torch.nn.Module:
    class Block(torch.nn.Module):  # thunder's torch symbols (the torch executor's like= operators) and subclass ops
        def __init__(self):
            super().__init__()
            w = torch.randn(8, 8)
            self.w = torch.nn.Parameter(TwoTensor(w, w * 2), requires_grad=requires_grad)
            self.norm = torch.nn.LayerNorm(8)

        def forward(self, xs):
            x, h = xs
            h = torch.nn.functional.silu(torch.nn.functional.linear(h, self.w) * 0.5)
            return self.norm(torch.nn.functional.silu(x * 0.5).reshape(-1, 8) / 2 + x), h

    torch.manual_seed(0)
    return torch.nn.Sequential(Block(), Block())


def _backward(outputs):
    torch.autograd.backward([outputs[0].sum(), outputs[1].sum()])  # each output's gradient of its own kind


@pytest.mark.parametrize("requires_grad", [False, True])
def test_the_executors_pass_keeps_claimed_symbols_instead_of_running_their_metas_again(monkeypatch, requires_grad):
    # an operator executor's symbol for a bound symbol (itself, or registered like= it) called with the bound symbol's
    # own arguments: made from the bound symbol's output and subsymbols; the traces are thunder's but for proxy names
    kept = []
    reuse = transform_speed.reuse_claimed_bsym

    def recording(processor, fn, *rest):
        result = reuse(processor, fn, *rest)
        if result is not None:
            kept.append(fn.name)
        return result

    monkeypatch.setattr(transform_speed, "reuse_claimed_bsym", recording)
    x = torch.randn(3, 8, requires_grad=requires_grad)
    xs = (x, x.detach() * 3)
    model, reference = _mixed_model(requires_grad), _mixed_model(requires_grad)
    jm = thunder_subclass.jit(model)
    out = jm(xs)
    # thunder's torch symbols, the torch executor's like= operators (matmul: TwoTensor's aten.mm, recorded as
    # thunder's symbol)
    assert {"silu", "matmul", "true_divide", "mul"} <= set(kept), kept
    monkeypatch.setattr(transform_speed, "reuse_claimed_bsym", lambda *args: None)  # thunder's way: metas run again
    alone = thunder_subclass.jit(model)
    expected, eager = alone(xs), reference(xs)
    for o in (out, expected):
        assert type(o[1]) is TwoTensor
        assert_close(o[0], eager[0]) and assert_close(o[1].a, eager[1].a) and assert_close(o[1].b, eager[1].b)
    traces = [(thunder.last_traces(jm), thunder.last_traces(alone))]
    if requires_grad:
        _backward(out)
        _backward(eager)
        for p, q in zip(model.parameters(), reference.parameters()):
            assert type(p.grad) is type(q.grad) and q.grad is not None
            for g, e in ((p.grad.a, q.grad.a), (p.grad.b, q.grad.b)) if type(q.grad) is TwoTensor else ((p.grad, q.grad),):
                assert_close(g, e)
        traces.append((thunder.last_backward_traces(jm), thunder.last_backward_traces(alone)))
    for fast, slow in traces:
        assert len(fast) == len(slow)
        assert [_up_to_names(t) for t in fast] == [_up_to_names(t) for t in slow]
        # the pass kept the old names: the execution trace's proxies are those of the trace before the pass
        assert str(fast[-1]) != str(slow[-1])


def test_the_kept_symbols_are_only_those_of_plugin_jits(monkeypatch):
    calls = _spy(monkeypatch, transform_speed, "reuse_claimed_bsym")
    thunder_subclass.install_hooks()

    def f(x):
        return torch.nn.functional.silu(x * 2).sum(0)

    x = torch.randn(4, 4)
    assert_close(thunder.jit(f)(x), f(x))
    assert calls == []
    assert_close(thunder_subclass.jit(f)(x), f(x))
    assert calls


def test_under_no_grad_thunders_grad_transform_and_split_are_skipped(monkeypatch):
    # parameters that require grad, called under torch.no_grad(): thunder 0.2.6 ran its grad transform and the split
    # (a copy of the trace computing no gradient, then no backward); the plugin skips both, and the traces are those
    # thunder makes with them, but for proxy names
    from thunder.transforms import autodiff

    from thunder_subclass._thunder_internals import autograd_hooks

    thunder_subclass.install_hooks()
    transforms = _spy(monkeypatch, autodiff, "dce")  # thunder's grad transform calls it on the joint trace
    model, reference = _mixed_model(True), _mixed_model(True)
    x = torch.randn(3, 8)
    xs = (x, x * 3)
    with torch.no_grad():
        jm = thunder_subclass.jit(model)
        out, eager = jm(xs), reference(xs)
    assert transforms == [] and thunder.last_backward_traces(jm) == []
    assert not out[0].requires_grad and type(out[1]) is TwoTensor
    assert_close(out[0], eager[0]) and assert_close(out[1].a, eager[1].a) and assert_close(out[1].b, eager[1].b)
    monkeypatch.setattr(autograd_hooks, "_needs_no_gradient", lambda trace: False)  # thunder's way
    with torch.no_grad():
        alone = thunder_subclass.jit(model)
        alone(xs)
    assert len(transforms) >= 1 and thunder.last_backward_traces(alone) == []
    assert _up_to_names(thunder.last_traces(jm)[-1]) == _up_to_names(thunder.last_traces(alone)[-1])


def test_a_trace_with_differentiable_operations_keeps_thunders_grad_transform(monkeypatch):
    # a no_grad block next to operations that need a gradient: not every operation is constant, thunder's transform
    # runs and the gradients are eager's
    from thunder.transforms import autodiff

    thunder_subclass.install_hooks()
    transforms = _spy(monkeypatch, autodiff, "dce")  # thunder's grad transform calls it on the joint trace

    def f(x, w):
        with torch.no_grad():
            y = x * 2
        return (y * w).sin(), y

    w = TwoTensor(torch.randn(4), torch.randn(4)).requires_grad_()
    ew = TwoTensor(w.a.detach().clone(), w.b.detach().clone()).requires_grad_()
    x = torch.randn(4)
    jf = thunder_subclass.jit(f)
    (z, y), (ez, ey) = jf(x, w), f(x, ew)
    assert len(transforms) >= 1 and len(thunder.last_backward_traces(jf)) > 0
    assert type(z) is TwoTensor and z.requires_grad and not y.requires_grad
    z.sum().backward()
    ez.sum().backward()
    for got, want in ((z.a, ez.a), (z.b, ez.b), (y, ey), (w.grad.a, ew.grad.a), (w.grad.b, ew.grad.b)):
        assert_close(got, want)
