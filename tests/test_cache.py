"""The cache of a compiled function (issue 24): bounded, hits that cost the same with many entries, misses explained,
eager runs past the bound, and parameters / buffers / submodules replaced after compiling. Calls vary input sizes
to make cache entries, so those jits trace once per size (``dynamic=False``)."""

import warnings

import pytest
import thunder
import torch
from torch import nn

import thunder_subclass
from subclasses import TwoTensor
from helpers import two
from thunder_subclass.errors import CacheLimitWarning


def _f(t):
    return (t * 2 + 1).sin()


def _entries(jf) -> int:
    return len(thunder.compile_stats(jf).interpreter_cache)


def test_default_bound_is_torch_compile_s():
    assert thunder_subclass.config.cache_size_limit == 8
    jf = thunder_subclass.jit(_f, dynamic=False)
    with pytest.warns(CacheLimitWarning):
        for n in range(1, 12):
            x = torch.randn(n)
            torch.testing.assert_close(jf(x), _f(x))
    assert _entries(jf) == 8


def test_entries_never_exceed_the_bound_and_values_stay_eager():
    jf = thunder_subclass.jit(_f, cache_size_limit=3, dynamic=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheLimitWarning)
        for n in range(1, 10):
            x = two(n, 2)
            out = jf(x)
            assert _entries(jf) == min(n, 3)
            assert type(out) is TwoTensor
            torch.testing.assert_close(out.a, _f(x).a)
            torch.testing.assert_close(out.b, _f(x).b)
    # calls that an entry accepts still run compiled
    hits = thunder.cache_hits(jf)
    jf(two(2, 2))
    assert thunder.cache_hits(jf) == hits + 1


def test_limit_warning_is_given_once_and_names_the_failing_check():
    jf = thunder_subclass.jit(_f, cache_size_limit=2, dynamic=False)
    jf(torch.randn(1))
    jf(torch.randn(2))
    with pytest.warns(CacheLimitWarning, match=r"reached its cache size limit \(2 entries, cache_size_limit=2\)") as rec:
        jf(torch.randn(3))
    message = str(rec[0].message)
    assert "run eagerly" in message
    # the newest entry's failing check, with the argument's name and the traced shape
    assert "t.shape == torch.Size([2])" in message
    assert rec[0].filename == __file__  # points at the user's call
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheLimitWarning)
        torch.testing.assert_close(jf(torch.ones(4)), _f(torch.ones(4)))  # no second warning


def test_eager_fallback_equals_eager_with_gradients():
    w = nn.Parameter(TwoTensor(torch.randn(3, 3), torch.randn(3, 3)))

    def g(x):
        return (x @ w).relu().sum(dim=0)

    jf = thunder_subclass.jit(g, cache_size_limit=1, dynamic=False)
    jf(torch.randn(2, 3, requires_grad=True)).sum().backward()
    w.grad = None
    x = torch.randn(5, 3, requires_grad=True)
    with pytest.warns(CacheLimitWarning):
        out = jf(x)
    assert _entries(jf) == 1
    assert type(out) is TwoTensor
    out.sum().backward()
    grad_x, grad_w = x.grad, w.grad
    x.grad, w.grad = None, None
    expected = g(x)
    expected.sum().backward()
    torch.testing.assert_close(out.a, expected.a)
    torch.testing.assert_close(out.b, expected.b)
    assert type(grad_w) is TwoTensor
    torch.testing.assert_close(grad_x, x.grad)
    torch.testing.assert_close(grad_w.a, w.grad.a)
    torch.testing.assert_close(grad_w.b, w.grad.b)


def test_eager_fallback_of_a_module_runs_the_module():
    m = nn.Linear(3, 2)
    jm = thunder_subclass.jit(m, cache_size_limit=1, dynamic=False)
    jm(torch.randn(1, 3))
    x = torch.randn(4, 3)
    with pytest.warns(CacheLimitWarning, match="Linear reached its cache size limit"):
        torch.testing.assert_close(jm(x), m(x))
    assert _entries(jm) == 1


def test_explain_recompiles_lists_the_failing_guard():
    jf = thunder_subclass.jit(_f, dynamic=False)
    assert thunder_subclass.explain_recompiles(jf) == [] and thunder_subclass.last_miss_reasons(jf) == ()
    jf(two(2, 2))
    jf(two(2, 2))
    assert thunder_subclass.explain_recompiles(jf) == []  # a hit
    jf(two(3, 2))
    (text,) = thunder_subclass.explain_recompiles(jf)
    assert text.startswith("call 3 (a cache miss; 1 entry checked):")
    (reason,) = thunder_subclass.last_miss_reasons(jf)
    assert "t.shape == torch.Size([2, 2])" in reason and reason in text
    jf(torch.randn(2, 2))  # a plain tensor where the traces took a TwoTensor
    reasons = thunder_subclass.last_miss_reasons(jf)
    assert len(reasons) == 2 and all("TwoTensor" in r for r in reasons)
    with pytest.raises(TypeError, match="not a function or module compiled by thunder_subclass.jit"):
        thunder_subclass.explain_recompiles(_f)


def test_bad_limit_is_rejected():
    with pytest.raises(ValueError, match="cache_size_limit must be a positive int or None"):
        thunder_subclass.jit(_f, cache_size_limit=0, dynamic=False)


def test_unbounded_cache_when_asked():
    jf = thunder_subclass.jit(_f, cache_size_limit=None, dynamic=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheLimitWarning)
        for n in range(1, 11):
            jf(torch.randn(n))
    assert _entries(jf) == 10


def _count_prologue_calls(jf) -> list:
    """Wrap each cache entry's prologue to count its calls; returns the counters (oldest entry first)."""
    cs = thunder.compile_stats(jf)
    counts = []
    for i, entry in enumerate(cs.interpreter_cache):
        counter = [0]

        def prologue(*args, _pro=entry.prologue_fn, _c=counter, **kwargs):
            _c[0] += 1
            return _pro(*args, **kwargs)

        cs.interpreter_cache[i] = entry._replace(prologue_fn=prologue)
        counts.append(counter)
    return counts


def test_a_hit_on_the_oldest_entry_runs_one_prologue():
    jf = thunder_subclass.jit(_f, cache_size_limit=None, dynamic=False)
    xs = [torch.randn(n) for n in range(1, 21)]
    for x in xs:
        jf(x)
    counts = _count_prologue_calls(jf)
    jf(xs[0])  # first time: the entries newest first until the oldest accepts
    assert [c[0] for c in counts] == [1] * 20
    for c in counts:
        c[0] = 0
    for _ in range(3):
        torch.testing.assert_close(jf(xs[0]), _f(xs[0]))
    assert [c[0] for c in counts] == [3] + [0] * 19  # then only the entry that accepted such calls
    assert thunder.cache_hits(jf) == 4


def test_hit_failure_messages_are_not_built():
    from thunder_subclass.guards import prologue

    built = []
    original = prologue.FusedChecks.failure

    def failure(self, values):
        built.append(1)
        return original(self, values)

    jf = thunder_subclass.jit(_f, dynamic=False)
    for n in (1, 2, 3):
        jf(torch.randn(n))
    prologue.FusedChecks.failure = failure
    try:
        for n in (1, 2, 3, 1):
            jf(torch.randn(n))
    finally:
        prologue.FusedChecks.failure = original
    assert built == [] and thunder.cache_hits(jf) == 4


# --- parameters, buffers and submodules replaced after compiling (issue 24) ---


def test_replaced_bias_is_used():
    m = nn.Linear(3, 3)
    jm = thunder_subclass.jit(m)
    x = torch.randn(2, 3)
    torch.testing.assert_close(jm(x), m(x))
    m.bias = nn.Parameter(torch.full((3,), 100.0))
    out = jm(x)
    torch.testing.assert_close(out, m(x))
    assert thunder.cache_misses(jm) == 1  # the same kind of tensor: the same trace, the new values
    out.sum().backward()
    torch.testing.assert_close(m.bias.grad, torch.full((3,), 2.0))


def test_weight_replaced_by_a_subclass_parameter_is_a_miss():
    m = nn.Linear(3, 3)
    jm = thunder_subclass.jit(m)
    x = torch.randn(2, 3)
    jm(x)
    w = m.weight.detach()
    m.weight = nn.Parameter(TwoTensor(w * 2, w * 3))
    out = jm(x)
    assert thunder.cache_misses(jm) == 2
    expected = m(x)
    assert type(out) is TwoTensor
    torch.testing.assert_close(out.a, expected.a)
    torch.testing.assert_close(out.b, expected.b)
    out.sum().backward()
    assert type(m.weight.grad) is TwoTensor
    # and back to a plain parameter
    m.weight = nn.Parameter(w.clone())
    torch.testing.assert_close(jm(x), m(x))


def test_replaced_subclass_parameter_of_another_subclass_type():
    from subclasses import ScaledTensor

    m = nn.Linear(3, 3, bias=False)
    w = m.weight.detach()
    m.weight = nn.Parameter(TwoTensor(w.clone(), w.clone()), requires_grad=False)
    jm = thunder_subclass.jit(m)
    x = torch.randn(2, 3)
    jm(x)
    m.weight = nn.Parameter(ScaledTensor(w.clone(), 0.5), requires_grad=False)
    out, expected = jm(x), m(x)
    assert type(out) is type(expected)
    torch.testing.assert_close(out, expected)


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.register_buffer("shift", torch.zeros(4))

    def forward(self, x):
        return self.act(self.lin(x)) + self.shift


def test_replaced_buffer_and_submodules_are_used():
    m = nn.Sequential(_Block(), nn.Linear(4, 2))
    jm = thunder_subclass.jit(m)
    x = torch.randn(3, 4)
    torch.testing.assert_close(jm(x), m(x))
    m[0].shift = torch.full((4,), 5.0)  # a buffer replaced
    torch.testing.assert_close(jm(x), m(x))
    m[0].act = nn.Sigmoid()  # a submodule of another class
    torch.testing.assert_close(jm(x), m(x))
    m[0].lin = nn.Linear(4, 4)  # a submodule of the same class, new parameters
    torch.testing.assert_close(jm(x), m(x))
    m[0] = _Block()  # a whole block
    torch.testing.assert_close(jm(x), m(x))
    m[0].act = nn.LeakyReLU(0.3)
    torch.testing.assert_close(jm(-x.abs()), m(-x.abs()))
    m[0].act = nn.LeakyReLU(0.1)  # same class, another attribute value the trace read
    torch.testing.assert_close(jm(-x.abs()), m(-x.abs()))
