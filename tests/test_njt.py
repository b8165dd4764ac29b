"""Jagged nested tensors (``torch.nested`` with ``layout=torch.jagged``), PyTorch's own wrapper subclass, compiled by
thunder_subclass.jit and compared with eager: values, output types, ragged sizes, gradients, requires_grad, input
mutations, the cache, and the typed errors for what is not supported."""

import pytest
import torch
import torch.nn.functional as F

import thunder_subclass
import thunder
from thunder_subclass.errors import UnsupportedSubclassOperationError
from torch.nested._internal.nested_tensor import NestedTensor


def njt(lengths=(2, 3, 4), d=5, requires_grad=False):
    return torch.nested.nested_tensor(
        [torch.randn(n, d, dtype=torch.float64) for n in lengths], layout=torch.jagged, requires_grad=requires_grad
    )


def copy_njt(x):
    """An independent copy of leaf NJT ``x`` (same values and lengths, its own offsets and nested int)."""
    return torch.nested.nested_tensor(list(x.detach().unbind()), layout=torch.jagged, requires_grad=x.requires_grad)


def assert_njt_equal(actual, expected):
    assert type(actual) is type(expected) is NestedTensor
    assert actual.requires_grad == expected.requires_grad
    assert actual.dim() == expected.dim() and actual.shape[0] == expected.shape[0]
    assert actual.shape[2:] == expected.shape[2:]
    torch.testing.assert_close(actual.offsets(), expected.offsets())
    torch.testing.assert_close(actual.values(), expected.values())


def test_pointwise_keeps_ragged_structure():
    x = njt()
    f = lambda t: (t * 2 + 1).sin()
    jf = thunder_subclass.jit(f)
    y = jf(x)
    assert_njt_equal(y, f(x))
    # as in eager: the result is ragged like x (same nested int, the same offsets object)
    assert y.shape[1] == x.shape[1] and y.offsets() is x.offsets()
    # (the batch size is a number proxy: nested_tensor() marks the cached lengths dynamic, so the trace is symbolic)
    assert f", {x.shape[1]}, 5]]" in str(thunder.last_traces(jf)[0])
    assert "torch.sin(" in str(thunder.last_traces(jf)[-1])  # on the values, flattened


def test_binary_op_on_shared_offsets_and_shape_branch():
    def f(a, b):
        return a + b if a.shape == b.shape else a.sin()

    a = njt()
    b = torch.nested.nested_tensor_from_jagged(torch.randn_like(a.values()), a.offsets())
    jf = thunder_subclass.jit(f)
    assert_njt_equal(jf(a, b), f(a, b))
    assert "add" in str(thunder.last_traces(jf)[-1])
    # equal lengths but offsets of their own: other nested ints, eager takes the other branch; a cache miss
    c = copy_njt(b)
    assert not (a.shape == c.shape)
    assert_njt_equal(jf(a, c), f(a, c))
    assert thunder.cache_misses(jf) == 2
    assert "sin" in str(thunder.last_traces(jf)[-1])
    # a new pair sharing offsets: the first trace again
    a2 = copy_njt(a)
    b2 = torch.nested.nested_tensor_from_jagged(torch.randn_like(a2.values()), a2.offsets())
    assert_njt_equal(jf(a2, b2), f(a2, b2))
    assert (thunder.cache_hits(jf), thunder.cache_misses(jf)) == (1, 2)


def test_linear_forward_and_backward():
    x = njt(requires_grad=True)
    w = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True)
    ex, ew, eb = (t.detach().clone().requires_grad_() for t in (x, w, b))
    y = thunder_subclass.jit(F.linear)(x, w, b)
    expected = F.linear(ex, ew, eb)
    assert_njt_equal(y, expected)
    y.values().sum().backward()
    expected.values().sum().backward()
    assert type(x.grad) is NestedTensor and x.grad.shape[1] == x.shape[1]
    torch.testing.assert_close(x.grad.values(), ex.grad.values())
    torch.testing.assert_close(w.grad, ew.grad)
    torch.testing.assert_close(b.grad, eb.grad)


def test_softmax_and_sum_over_the_last_dim_with_backward():
    f = lambda t: (t.softmax(-1) * 3).sin()
    x = njt(requires_grad=True)
    ex = x.detach().clone().requires_grad_()
    y, expected = thunder_subclass.jit(f)(x), f(ex)
    assert_njt_equal(y, expected)
    (gx,) = torch.autograd.grad(y.values().sum(), x)
    (egx,) = torch.autograd.grad(expected.values().sum(), ex)
    assert type(gx) is NestedTensor
    torch.testing.assert_close(gx.values(), egx.values())

    s = lambda t: t.sum(-1)
    x = njt()
    out, expected = thunder_subclass.jit(s)(x), s(x)
    assert_njt_equal(out, expected)
    assert out.dim() == 2 and not out.requires_grad


def test_same_lengths_hit_the_cache_other_lengths_recompile():
    jf = thunder_subclass.jit(lambda t: t.cos() * t.size(0))
    for lengths in ((2, 3, 4), (2, 3, 4), (1, 3, 5), (1, 1, 1, 6)):
        x = njt(lengths)
        assert_njt_equal(jf(x), x.cos() * x.size(0))
    # nested_tensor() caches the min / max length as inner tensors of shape (length, 0), marked dynamic: the first
    # trace has symbolic sizes, for lengths of at least 2 (the ShapeEnv's range); (1, 3, 5) is traced again with the
    # min length pinned to 1, which (1, 1, 1, 6), another batch size and total length, reuses
    assert (thunder.cache_hits(jf), thunder.cache_misses(jf)) == (2, 2)
    # nothing in a trace depends on the lengths themselves (fake runs know no tensor values): NJTs whose inner tensors
    # have the same shapes share a trace, with eager's result
    x = torch.nested.nested_tensor_from_jagged(torch.randn(9, 5, dtype=torch.float64), torch.tensor([0, 4, 6, 9]))
    y = torch.nested.nested_tensor_from_jagged(torch.randn(9, 5, dtype=torch.float64), torch.tensor([0, 1, 5, 9]))
    jg = thunder_subclass.jit(lambda t: t.cos() * t.size(0))
    for t in (x, y):
        assert_njt_equal(jg(t), t.cos() * t.size(0))
    assert (thunder.cache_hits(jg), thunder.cache_misses(jg)) == (1, 1)


def test_construction_from_values_and_offsets_with_backward_to_values():
    f = lambda v, o: torch.nested.nested_tensor_from_jagged(v * 2, o) * 2
    v, o = torch.randn(10, 5, requires_grad=True), torch.tensor([0, 2, 6, 10])
    ev = v.detach().clone().requires_grad_()
    y, expected = thunder_subclass.jit(f)(v, o), f(ev, o)
    assert_njt_equal(y, expected)
    y.backward(torch.ones_like(y))
    expected.backward(torch.ones_like(expected))
    torch.testing.assert_close(v.grad, ev.grad)


def test_metadata_reads_as_eager():
    def f(x):
        assert x.is_nested and x.dim() == 3 and len(x.size()) == 3
        assert x.size(1) == x.shape[1]  # the same nested int
        return x * (x.size(0) + x.shape[-1] + x.size(-1))

    x = njt()
    assert_njt_equal(thunder_subclass.jit(f)(x), f(x))


def test_mutated_plain_input_next_to_njt():
    def f(x, y):
        z = x.sin()
        y.sin_()
        return z.cos(), y.cos()

    x, y = njt((1, 2, 3, 4), 8, requires_grad=True), torch.rand(4, 8, dtype=torch.float64)
    ex, ey = x.detach().clone().requires_grad_(), y.clone()
    (z, w), (ez, ew) = thunder_subclass.jit(f)(x, y), f(ex, ey)
    assert_njt_equal(z, ez)
    torch.testing.assert_close(w, ew)
    torch.testing.assert_close(y, ey)  # the input was written as in eager
    z.values().sum().backward()
    ez.values().sum().backward()
    torch.testing.assert_close(x.grad.values(), ex.grad.values())


def test_ragged_size_used_as_a_number_is_a_typed_error():
    x = njt()
    with pytest.raises(RuntimeError):  # eager fails too
        torch.zeros(x.shape[1])
    with pytest.raises(UnsupportedSubclassOperationError, match=r"zeros at .*test_njt.py:\d+ received j\d+, the ragged "
                                                                r"size of a jagged NestedTensor"):
        thunder_subclass.jit(lambda t: torch.zeros(t.shape[1]))(x)


def test_unbind_reads_the_offsets_guarded_forward_and_backward():
    # NJT's unbind splits its values by offsets.diff().tolist(): the offsets of an input are known while tracing, so
    # the trace is made for their values, which the prologue checks (other lengths: a new trace, never a stale one)
    f = lambda t: [u.sum(0) * (i + 1) for i, u in enumerate((t * 2).unbind())]
    jf = thunder_subclass.jit(f, fullgraph=True)
    for lengths in ((2, 3, 4), (2, 3, 4), (4, 3, 2), (2, 3, 4)):
        x = njt(lengths, requires_grad=True)
        ex = x.detach().clone().requires_grad_()
        parts, expected = jf(x), f(ex)
        assert len(parts) == len(expected) == 3
        for got, want in zip(parts, expected):
            assert type(got) is torch.Tensor
            torch.testing.assert_close(got, want)
        sum(p.sum() for p in parts).backward()
        sum(p.sum() for p in expected).backward()
        assert type(x.grad) is NestedTensor
        torch.testing.assert_close(x.grad.values(), ex.grad.values())
    assert (thunder.cache_hits(jf), thunder.cache_misses(jf)) == (2, 2)
    assert "check_input_values(t" in str(thunder.last_prologue_traces(jf)[-1])
    # a plain offsets input, an NJT built on it inside: the same
    g = lambda v, o: [u.cos() for u in torch.nested.nested_tensor_from_jagged(v, o).unbind()]
    jg = thunder_subclass.jit(g, fullgraph=True)
    v = torch.randn(9, 5, dtype=torch.float64)
    for o in ([0, 2, 5, 9], [0, 2, 5, 9], [0, 1, 2, 9]):
        o = torch.tensor(o)
        for got, want in zip(jg(v, o), g(v, o), strict=True):
            torch.testing.assert_close(got, want)
    assert (thunder.cache_hits(jg), thunder.cache_misses(jg)) == (1, 2)


def test_data_dependent_dispatch_on_values_not_known_while_tracing_is_a_typed_error():
    # offsets computed in the trace (here by thunder's own ops on a plain tensor) have no known values: unbind of an
    # NJT built on them stays the typed error; by default a graph break that runs eagerly
    f = lambda v, lengths: torch.nested.nested_tensor_from_jagged(
        v, torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])).unbind()
    v, lengths = torch.randn(9, 5, dtype=torch.float64), torch.tensor([2, 3, 4])
    with pytest.raises(UnsupportedSubclassOperationError,
                       match=r"torch.Tensor.unbind on NestedTensor at .*test_njt.py:\d+ makes a data-dependent"):
        thunder_subclass.jit(f, fullgraph=True)(v, lengths)
    with pytest.warns(thunder_subclass.GraphBreakWarning, match=r"torch\.Tensor\.unbind on NestedTensor"):
        parts = thunder_subclass.jit(f)(v, lengths)
    for got, expected in zip(parts, f(v, lengths), strict=True):
        torch.testing.assert_close(got, expected)


def test_setitem_on_an_element_as_eager():
    # x[1, 0, 0] = 2 selects component 1 by its offsets (read while tracing, guarded)
    def f(x):
        y = x.clone()
        y[1, 0, 0] = 2
        y[2, 1, 3] = -1
        return y * 3

    jf = thunder_subclass.jit(f, fullgraph=True)
    for lengths in ((2, 3, 4), (2, 3, 4), (1, 6, 2)):
        x = njt(lengths)
        assert_njt_equal(jf(x), f(x))
    assert (thunder.cache_hits(jf), thunder.cache_misses(jf)) == (1, 2)

    def g(x):  # on the input itself: the caller's NestedTensor changes as in eager
        x[0, 1, 2] = 7.0
        return x.sin()

    x = njt()
    ex = x.clone()
    assert_njt_equal(thunder_subclass.jit(g, fullgraph=True)(x), g(ex))
    torch.testing.assert_close(x.values(), ex.values())


def test_contiguous_clone_of_a_nested_tensor_with_holes():
    # an NJT with lengths (holes between components): clone(memory_format=contiguous_format) packs the components
    # by lengths.tolist() / offsets.tolist(); the result has new offsets and no lengths, as in eager
    def holes(offsets, lengths):
        return torch.nested.nested_tensor_from_jagged(
            torch.randn(10, 5, dtype=torch.float64), torch.tensor(offsets), lengths=torch.tensor(lengths))

    f = lambda t: t.clone(memory_format=torch.contiguous_format) * 2
    jf = thunder_subclass.jit(f, fullgraph=True)
    for offsets, lengths in (([0, 3, 6, 10], [2, 3, 1]), ([0, 3, 6, 10], [2, 3, 1]), ([0, 3, 6, 10], [3, 3, 4])):
        x = holes(offsets, lengths)
        y, expected = jf(x), f(x)
        assert_njt_equal(y, expected)
        assert y.lengths() is None and expected.lengths() is None
    assert (thunder.cache_hits(jf), thunder.cache_misses(jf)) == (1, 2)


def test_cached_sequence_lengths_read_in_traced_code_as_eager():
    # _get_max_seqlen() / _max_seqlen read NestedTensor._metadata_cache, a dict of the _min/_max_seqlen_tensor inner
    # tensors (the lengths are stored in their shapes); before: "Unknown attribute _metadata_cache"
    def f(t):
        return t * 2, t._get_max_seqlen(), t._get_min_seqlen(), t._max_seqlen, t._min_seqlen

    jf = thunder_subclass.jit(f)
    for lengths in ((2, 3, 4), (2, 3, 4), (1, 6)):
        x = njt(lengths)
        out, *seqlens = jf(x)
        expected, *expected_seqlens = f(x)
        assert seqlens == expected_seqlens == [max(lengths), min(lengths)] * 2
        assert_njt_equal(out, expected)
    assert thunder.cache_misses(jf) == 2 and thunder.cache_hits(jf) == 1


@pytest.mark.filterwarnings("ignore:The 'symbolic values' cache option")
def test_input_requiring_grad_under_symbolic_values():
    # the gradient kind the backward expects is the output's without requires_grad (in NestedTensor's flatten
    # context): its proxy is made after interpretation, where thunder's symbolic-size proxies raised
    # "LookupError: <ContextVar name='interpretercompilectx'>"
    w = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    f = lambda t, w: F.linear(t, w).softmax(-1) * t.size(0)
    jf = thunder_subclass.jit(f, cache="symbolic values")
    for lengths in ((2, 3, 4), (2, 3, 4), (3, 3, 3, 3)):
        x = njt(lengths, requires_grad=True)
        ex, ew = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        w.grad = None
        y, expected = jf(x, w), f(ex, ew)
        assert_njt_equal(y, expected)
        y.values().pow(2).sum().backward()
        expected.values().pow(2).sum().backward()
        assert type(x.grad) is NestedTensor and x.grad.shape[1] == x.shape[1]
        torch.testing.assert_close(x.grad.values(), ex.grad.values())
        torch.testing.assert_close(w.grad, ew.grad)
    # another batch size and total length reuse the trace (symbolic sizes: tests/test_njt_dynamic.py)
    assert (thunder.cache_hits(jf), thunder.cache_misses(jf)) == (2, 1)


def _build_two(v1, o1, v2, o2):
    a = torch.nested.nested_tensor_from_jagged(v1, o1)
    b = torch.nested.nested_tensor_from_jagged(v2, o2)
    return (a + b, True) if a.shape == b.shape else (a.sin(), False)


def test_one_offsets_tensor_passed_as_two_arguments_shares_the_ragged_size():
    # eager: NestedTensors built on the same offsets object have one ragged size (torch's nested int of the tensor)
    v1, v2 = torch.randn(9, 5, dtype=torch.float64), torch.randn(9, 5, dtype=torch.float64)
    jf = thunder_subclass.jit(_build_two)
    o = torch.tensor([0, 2, 5, 9])
    (y, shared), (expected, eshared) = jf(v1, o, v2, o), _build_two(v1, o, v2, o)
    assert shared is eshared is True
    assert_njt_equal(y, expected)
    assert "add" in str(thunder.last_traces(jf)[-1])
    o2 = torch.tensor([0, 1, 5, 9])  # a new offsets object, unknown to torch: the same trace
    (y, shared) = jf(v1, o2, v2, o2)
    assert shared and (thunder.cache_hits(jf), thunder.cache_misses(jf)) == (1, 1)
    assert_njt_equal(y, _build_two(v1, o2, v2, o2)[0])
    # two offsets objects (equal values): two ragged sizes in eager, the other branch; never the first trace
    o3, o4 = torch.tensor([0, 2, 5, 9]), torch.tensor([0, 2, 5, 9])
    (y, shared), (expected, eshared) = jf(v1, o3, v2, o4), _build_two(v1, o3, v2, o4)
    assert shared is eshared is False
    assert_njt_equal(y, expected)
    assert (thunder.cache_hits(jf), thunder.cache_misses(jf)) == (1, 2)
    # and the trace made for distinct offsets is not reused for one object passed twice
    o5 = torch.tensor([0, 3, 4, 9])
    assert jf(v1, o5, v2, o5)[1] is True
    assert (thunder.cache_hits(jf), thunder.cache_misses(jf)) == (2, 2)


def test_offsets_tensor_passed_next_to_a_nested_tensor_built_on_it():
    def f(nt, offsets, v):
        b = torch.nested.nested_tensor_from_jagged(v, offsets)
        return (nt + b, True) if nt.shape == b.shape else (nt.cos(), False)

    def case(lengths):
        nt = njt(lengths)
        return nt, nt.offsets(), torch.randn_like(nt.values())

    jf = thunder_subclass.jit(f)
    nt, o, v = case((2, 3, 4))
    (y, shared), (expected, eshared) = jf(nt, o, v), f(nt, o, v)
    assert shared is eshared is True
    assert_njt_equal(y, expected)
    assert y.shape[1] == nt.shape[1]  # eager's ragged size: nt's
    nt2, o2, v2 = case((4, 3, 2))
    assert jf(nt2, o2, v2)[1] is True and (thunder.cache_hits(jf), thunder.cache_misses(jf)) == (1, 1)
    # offsets of another NestedTensor (or a copy of nt's): the sizes differ in eager; a cache miss, eager's branch
    for other in (nt2.offsets(), o.clone()):
        (y, shared), (expected, eshared) = jf(nt, other, v), f(nt, other, v)
        assert shared is eshared is False
        assert_njt_equal(y, expected)
    assert (thunder.cache_hits(jf), thunder.cache_misses(jf)) == (2, 2)


def _sdpa(q, k, v, **kwargs):
    # as PyTorch's NJT tests call it: (B, j, H, D) inputs, attention over the ragged dim
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **kwargs)
    return out.transpose(1, 2)


def _heads(lengths, requires_grad=False, h=2, d=4):
    return torch.nested.nested_tensor([torch.randn(n, h, d, dtype=torch.float64) for n in lengths], layout=torch.jagged,
                                      requires_grad=requires_grad)


def test_scaled_dot_product_attention_forward_backward_and_cache():
    # on CPU eager takes the math backend, per component; the trace holds one thunder_subclass::njt_attention call that
    # runs the same math kernel per component, reading the offsets when it runs: eager's values exactly, its
    # gradients, and one trace for any lengths of the same inner shapes
    jf = thunder_subclass.jit(_sdpa, fullgraph=True)
    for lengths in ((2, 3, 4), (4, 3, 2), (3, 2, 4), (5, 1, 3)):
        q, k, v = (_heads(lengths, requires_grad=True) for _ in range(3))
        eq, ek, ev = (t.detach().clone().requires_grad_() for t in (q, k, v))
        y, expected = jf(q, k, v), _sdpa(eq, ek, ev)
        assert_njt_equal(y, expected)
        assert y._ragged_idx == expected._ragged_idx == 1 and y.offsets() is q.offsets()  # the query's ragged size
        torch.testing.assert_close(y.values(), expected.values(), rtol=0, atol=0)
        grad = torch.randn_like(expected.values())
        y.values().backward(grad)
        expected.values().backward(grad)
        for got, want in ((q, eq), (k, ek), (v, ev)):
            assert type(got.grad) is NestedTensor
            torch.testing.assert_close(got.grad.values(), want.grad.values())
    # (5, 1, 3): other cached min / max lengths (inner tensor shapes), a new trace; the others share one
    assert (thunder.cache_hits(jf), thunder.cache_misses(jf)) == (2, 2)
    assert "thunder_subclass_njt_attention_default(" in str(thunder.last_traces(jf)[-1])
    assert "check_input_values" not in str(thunder.last_prologue_traces(jf)[-1])


def test_scaled_dot_product_attention_in_a_module_and_cross_attention():
    class Attention(torch.nn.Module):
        def __init__(self, e=8, heads=2):
            super().__init__()
            self.heads = heads
            self.qkv = torch.nn.Linear(e, 3 * e, dtype=torch.float64)
            self.out = torch.nn.Linear(e, e, dtype=torch.float64)

        def forward(self, x):
            q, k, v = (t.contiguous().unflatten(-1, (self.heads, -1)).transpose(1, 2)
                       for t in self.qkv(x).chunk(3, dim=-1))
            y = F.scaled_dot_product_attention(q, k, v, scale=0.3)
            return self.out(y.transpose(1, 2).flatten(-2))

    m = Attention()
    x = njt((2, 3, 4), 8, requires_grad=True)
    ex = x.detach().clone().requires_grad_()
    y = thunder_subclass.jit(m, fullgraph=True)(x)
    assert_njt_equal(y, m(ex))
    y.values().sum().backward()
    grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    m(ex).values().sum().backward()
    for got, p in zip(grads, m.parameters()):
        torch.testing.assert_close(got, p.grad)
    torch.testing.assert_close(x.grad.values(), ex.grad.values())
    # keys and values of other lengths than the queries
    q, kv = _heads((2, 3)), _heads((5, 1))
    y, expected = thunder_subclass.jit(_sdpa, fullgraph=True)(q, kv, kv), _sdpa(q, kv, kv)
    assert_njt_equal(y, expected)
    assert y.shape[1] == q.shape[1]


def test_scaled_dot_product_attention_that_eager_refuses_is_a_typed_error_at_the_users_line():
    import re

    q = _heads((2, 3))
    # eager: no causal attention on NJTs ("No viable backend"; a CUDA build without a driver fails earlier, on CUDA)
    with pytest.raises(RuntimeError) as eager:
        _sdpa(q, q, q, is_causal=True)
    first = str(eager.value).splitlines()[0]
    with pytest.raises(thunder_subclass.errors.SubclassDispatchError,
                       match=r"scaled_dot_product_attention on NestedTensor failed while tracing at .*test_njt.py:\d+: "
                             + type(eager.value).__name__ + ": " + re.escape(first[:60])):
        thunder_subclass.jit(lambda t: _sdpa(t, t, t, is_causal=True), fullgraph=True)(q)


def test_rms_norm_forward_and_backward_also_with_holes():
    # an NJT with holes: torch counts its elements from lengths.sum().item() (its own code refuses fake lengths);
    # the lengths of an input are known while tracing, guarded
    f = lambda t: F.rms_norm(t, (5,)) * 3
    jf = thunder_subclass.jit(f, fullgraph=True)
    for lengths in ([2, 3, 1], [2, 3, 1], [3, 1, 4]):
        v = torch.randn(10, 5, dtype=torch.float64, requires_grad=True)
        ev = v.detach().clone().requires_grad_()
        offsets = torch.tensor([0, 3, 6, 10])
        x = torch.nested.nested_tensor_from_jagged(v, offsets, lengths=torch.tensor(lengths))
        ex = torch.nested.nested_tensor_from_jagged(ev, offsets, lengths=torch.tensor(lengths))
        y, expected = jf(x), f(ex)
        torch.testing.assert_close(y.values(), expected.values())
        torch.testing.assert_close(y.lengths(), expected.lengths())
        (g,) = torch.autograd.grad(y.values().pow(2).sum(), v)
        (eg,) = torch.autograd.grad(expected.values().pow(2).sum(), ev)
        torch.testing.assert_close(g, eg)
    assert (thunder.cache_hits(jf), thunder.cache_misses(jf)) == (1, 2)
    # nn.RMSNorm over the last two dims of a (B, j, H, D) NJT, with its weight
    m = torch.nn.RMSNorm((3, 4), dtype=torch.float64)
    x = torch.nested.nested_tensor([torch.randn(n, 3, 4, dtype=torch.float64) for n in (2, 3, 4)],
                                   layout=torch.jagged, requires_grad=True)
    ex = x.detach().clone().requires_grad_()
    y = thunder_subclass.jit(m, fullgraph=True)(x)
    assert_njt_equal(y, m(ex))
    (gx, gw), (egx, egw) = (torch.autograd.grad(out.values().pow(2).sum(), (inp, m.weight))
                            for out, inp in ((y, x), (m(ex), ex)))
    torch.testing.assert_close(gx.values(), egx.values())
    torch.testing.assert_close(gw, egw)


def test_offsets_changed_in_place_in_the_trace_are_not_read_as_passed():
    # the proxy of an input changed in place still stands for the input while tracing: its values as passed are not
    # what later code reads, so dispatch reading them is the typed error (a trace for the old lengths would be wrong)
    def f(v, o):
        o[1] = 4
        return torch.nested.nested_tensor_from_jagged(v, o).unbind()

    v = torch.randn(9, 2)
    with pytest.raises(UnsupportedSubclassOperationError, match=r"unbind on NestedTensor .* data-dependent"):
        thunder_subclass.jit(f, fullgraph=True)(v, torch.tensor([0, 2, 5, 9]))
    o, eo = torch.tensor([0, 2, 5, 9]), torch.tensor([0, 2, 5, 9])
    with pytest.warns(thunder_subclass.GraphBreakWarning):
        parts = thunder_subclass.jit(f)(v, o)
    for got, expected in zip(parts, f(v, eo), strict=True):
        torch.testing.assert_close(got, expected)
    torch.testing.assert_close(o, eo)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_scaled_dot_product_attention_in_half_precision_as_eager(dtype):
    # eager's math backend computes nested half-precision inputs in their own dtype: so do we, bit for bit
    q, k, v = (torch.nested.nested_tensor([torch.randn(n, 2, 8) for n in (3, 5)], layout=torch.jagged, dtype=dtype,
                                          requires_grad=True) for _ in range(3))
    eq, ek, ev = (t.detach().clone().requires_grad_() for t in (q, k, v))
    y, expected = thunder_subclass.jit(_sdpa, fullgraph=True)(q, k, v, scale=0.5), _sdpa(eq, ek, ev, scale=0.5)
    assert y.dtype == expected.dtype == dtype
    assert torch.equal(y.values(), expected.values())
    grad = torch.randn_like(expected.values())
    y.values().backward(grad)
    expected.values().backward(grad)
    for got, want in ((q, eq), (k, ek), (v, ev)):
        assert torch.equal(got.grad.values(), want.grad.values())


def _padded_round_trip(x):
    # PyTorch's padded/dense conversion test: to a padded dense tensor, compute, back to jagged with the input's offsets
    # and cached lengths
    from torch.nested._internal.nested_tensor import nested_from_padded

    padded = x.to_padded_tensor(0.3)
    return nested_from_padded(padded.sin() + 1, x._offsets, min_seqlen=x._maybe_min_seqlen,
                              max_seqlen=x._maybe_max_seqlen, sum_S=x._values.shape[0])


@pytest.mark.parametrize("checkpointed", [False, True], ids=["direct", "checkpoint"])
def test_padded_dense_round_trip_keeps_cached_lengths_and_gradients(checkpointed):
    # nested_from_padded reached torch's module-level dummy NestedTensor (an input thunder could not unpack); inside
    # a non-reentrant checkpoint its result did not require grad ("element 0 of tensors does not require grad")
    from torch.utils.checkpoint import checkpoint

    def f(x):
        return checkpoint(_padded_round_trip, x, use_reentrant=False) if checkpointed else _padded_round_trip(x)

    x = njt((2, 3, 4), requires_grad=True)
    x_ref = copy_njt(x)
    out, expected = thunder_subclass.jit(f)(x), f(x_ref)
    assert_njt_equal(out, expected)
    assert out._maybe_max_seqlen == expected._maybe_max_seqlen == 4
    assert out._maybe_min_seqlen == expected._maybe_min_seqlen == 2
    out.backward(torch.ones_like(out))
    expected.backward(torch.ones_like(expected))
    torch.testing.assert_close(x.grad.values(), x_ref.grad.values())


@pytest.mark.parametrize("dynamic, misses", [(None, 1), (True, 1), (False, 3)])
def test_seqlens_marked_dynamic_are_symbolic(dynamic, misses):
    # torch._dynamo.mark_dynamic on the cached min / max lengths (as PyTorch's compile tests do; nested_tensor()
    # marks them itself) makes them symbolic from the first trace, also at the default (automatic dynamic shapes):
    # other lengths reuse it, with eager's values and cached lengths on the output (never the traced ones);
    # dynamic=False keeps one trace per size
    def make(lengths):
        x = njt(lengths)
        x._get_max_seqlen(), x._get_min_seqlen()
        torch._dynamo.mark_dynamic(x._metadata_cache["max_seqlen"], 0)
        torch._dynamo.mark_dynamic(x._metadata_cache["min_seqlen"], 0)
        return x

    f = lambda t: t.sin() * t._get_max_seqlen()  # noqa: E731
    jf = thunder_subclass.jit(f, dynamic=dynamic)
    for lengths in ((2, 3, 4), (3, 3, 5), (3, 3, 3), (2, 3, 4)):  # the same total length and batch size
        x = make(lengths)
        y, expected = jf(x), f(x)
        assert_njt_equal(y, expected)
        assert (y._maybe_max_seqlen, y._maybe_min_seqlen) == (expected._maybe_max_seqlen, expected._maybe_min_seqlen)
    assert (thunder.cache_misses(jf), thunder.cache_hits(jf)) == (misses, 4 - misses)
