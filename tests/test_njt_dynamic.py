"""Jagged NestedTensors under dynamic shapes: another batch of lengths of the same structure (ragged dim, dense sizes,
dtype, device, holes or not) reuses the trace under ``dynamic=True`` and automatic dynamic shapes, as torch.compile
reuses one graph; what a trace relied on (a branch on a length, the batch size read as a number) is guarded or read
again, never a stale result. Values, types, gradients against eager; misses and hits counted."""

import pytest
import torch
import torch.nn.functional as F

import thunder
import thunder_subclass
from helpers import cache_counts, same_nested_int
from thunder_subclass.errors import SubclassDispatchError

from test_njt import assert_njt_equal, copy_njt

# batches of the same structure: other lengths, other total lengths, other batch sizes (every length >= 2: the
# ShapeEnv specialises sizes 0 and 1, as torch.compile does, so a cached min length of 1 is a new trace)
BATCHES = ((2, 3, 4), (3, 2, 5), (2, 2, 2, 6), (4, 4), (5, 2, 3))


def njt(lengths, d=5, requires_grad=False, cached_lengths=True):
    """A jagged NestedTensor; ``cached_lengths=False``: built from values and offsets, with no cached min / max length
    (nothing marked dynamic: automatic dynamic shapes starts static)."""
    ts = [torch.randn(n, d, dtype=torch.float64) for n in lengths]
    if cached_lengths:
        return torch.nested.nested_tensor(ts, layout=torch.jagged, requires_grad=requires_grad)
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    values = torch.cat(ts).requires_grad_(requires_grad)
    return torch.nested.nested_tensor_from_jagged(values, offsets)


def _run(f, make, dynamic=True, batches=BATCHES):
    jf = thunder_subclass.jit(f, dynamic=dynamic)
    for lengths in batches:
        args = make(lengths)
        y, expected = jf(*args), f(*args)
        if isinstance(expected, torch.Tensor) and expected.is_nested:
            assert_njt_equal(y, expected)
        else:
            torch.testing.assert_close(y, expected)
    return jf


def test_unary_ops_reuse_the_trace_for_new_lengths_and_batch_sizes():
    jf = _run(lambda t: (t * 2 + 1).sin(), lambda L: (njt(L),))
    assert cache_counts(jf) == (1, len(BATCHES) - 1)
    # the sizes are symbolic: the batch size is a number proxy read from the input, the ragged size the input's
    assert "i0" in str(thunder.last_traces(jf)[0])


def test_binary_op_on_shared_offsets_reuses_the_trace():
    def make(lengths):
        a = njt(lengths)
        return a, torch.nested.nested_tensor_from_jagged(torch.randn_like(a.values()), a.offsets())

    f = lambda a, b: a * b + a  # noqa: E731
    jf = _run(f, make)
    assert cache_counts(jf) == (1, len(BATCHES) - 1)
    # NestedTensors with offsets of their own (equal lengths, other nested ints) raise as in eager: a RuntimeError
    a, b = njt((2, 3, 4)), njt((2, 3, 4))
    with pytest.raises(RuntimeError, match="cannot call binary pointwise function mul.Tensor with inputs of shapes"):
        f(a, b)
    with pytest.raises(SubclassDispatchError, match="cannot call binary pointwise function mul.Tensor"):
        jf(a, b)


def test_njt_and_a_dense_tensor_broadcast_reuse_the_trace():
    jf = _run(lambda a, d: a * d + d, lambda L: (njt(L), torch.randn(5, dtype=torch.float64)))
    assert cache_counts(jf) == (1, len(BATCHES) - 1)


def test_reduction_over_the_dense_dim_reuses_the_trace():
    jf = _run(lambda t: t.sum(-1, keepdim=True) * t.softmax(-1), lambda L: (njt(L),))
    assert cache_counts(jf) == (1, len(BATCHES) - 1)


@pytest.mark.parametrize("linear", [False, True], ids=["pointwise", "linear"])
def test_backward_reuses_the_trace_with_eagers_gradients(linear):
    w = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)

    def f(t):
        return F.linear(t, w).relu() if linear else (t * 2).sin()

    jf = thunder_subclass.jit(f, dynamic=True)
    for lengths in BATCHES:
        x = njt(lengths, requires_grad=True)
        xe = copy_njt(x)
        y, expected = jf(x), f(xe)
        assert_njt_equal(y, expected)
        wrt = (x, w) if linear else (x,)
        grads = torch.autograd.grad(y.values().pow(2).sum(), wrt)
        expected_grads = torch.autograd.grad(expected.values().pow(2).sum(), (xe, *wrt[1:]))
        torch.testing.assert_close(grads[0].values(), expected_grads[0].values())
        torch.testing.assert_close(grads[1:], expected_grads[1:])
    assert cache_counts(jf) == (1, len(BATCHES) - 1)


def test_the_batch_size_read_by_the_program_is_the_calls():
    # x.size(0) / x.shape[0] / x.size()[0] are the number proxy the prologue reads from each call's input (x.size(0)
    # was a constant of the first trace: a wrong result for another batch size)
    for f in (lambda t: t.cos() * t.size(0), lambda t: t.cos() * t.shape[0], lambda t: t.cos() * t.size()[0]):
        jf = _run(f, lambda L: (njt(L),))
        assert cache_counts(jf) == (1, len(BATCHES) - 1)


def test_returned_sizes_are_torch_sizes_with_the_calls_nested_int():
    jf = thunder_subclass.jit(lambda t: (t.sin(), t.shape, t.size(), t.shape[1:]), dynamic=True)
    for lengths in BATCHES[:3]:
        x = njt(lengths)
        y, shape, size, tail = jf(x)
        assert_njt_equal(y, x.sin())
        for got, want in ((shape, x.shape), (size, x.size()), (tail, x.shape[1:])):
            assert type(got) is torch.Size and got == want
        assert same_nested_int(shape[1], x.size(1))
    assert cache_counts(jf) == (1, 2)


def test_non_contiguous_nested_tensor_with_holes_reuses_the_trace():
    def make(lengths):
        v = torch.randn(len(lengths), 8, 5, dtype=torch.float64)
        starts = torch.tensor([1] * len(lengths))
        return (torch.nested.narrow(v, 1, starts, torch.tensor(lengths), layout=torch.jagged),)

    f = lambda t: t.sin() * 2 + 1  # noqa: E731
    jf = thunder_subclass.jit(f, dynamic=True)
    for lengths in BATCHES:
        (x,) = make(lengths)
        assert not x.is_contiguous()
        y, expected = jf(x), f(x)
        assert type(y) is type(expected) and not y.is_contiguous()
        torch.testing.assert_close(y.lengths(), expected.lengths())
        for a, b in zip(y.unbind(), expected.unbind()):
            torch.testing.assert_close(a, b)
    assert cache_counts(jf) == (1, len(BATCHES) - 1)


def test_automatic_dynamic_shapes_make_a_symbolic_entry_at_the_second_size():
    # an NJT with no cached lengths has nothing marked dynamic: the first trace is for its sizes, the second
    # distinct size makes a symbolic entry that every later batch reuses
    jf = _run(lambda t: (t * 2).cos(), lambda L: (njt(L, cached_lengths=False),), dynamic=None)
    assert cache_counts(jf) == (2, len(BATCHES) - 2)


def test_a_branch_on_a_length_retraces_never_a_stale_branch():
    f = lambda t: t.sin() if t.values().shape[0] > 10 else t.cos()  # noqa: E731
    batches = ((2, 3, 4), (3, 2, 5), (4, 4, 4), (2, 2, 2), (5, 5, 5), (2, 3, 4))
    jf = _run(f, lambda L: (njt(L),), batches=batches)
    # totals 9, 10, 12, 6, 15, 9: one trace per side of the branch (the prologue checks the side taken)
    assert cache_counts(jf) == (2, 4)


def test_a_branch_on_the_batch_size_is_guarded():
    f = lambda t: t * 2 if t.size(0) == 3 else t - 1  # noqa: E731
    jf = _run(f, lambda L: (njt(L),), batches=((2, 3, 4), (3, 2, 5), (4, 4), (2, 2, 2, 6), (3, 3, 3)))
    assert cache_counts(jf) == (2, 3)


def test_a_layout_change_or_a_branch_on_the_max_length_traces_again():
    def holes(lengths):
        v = torch.randn(len(lengths), 8, 5, dtype=torch.float64)
        return torch.nested.narrow(v, 1, torch.tensor([1] * len(lengths)), torch.tensor(lengths), layout=torch.jagged)

    f = lambda t: t.sin() * 2 if t._get_max_seqlen() > 4 else t.cos()  # noqa: E731
    jf = thunder_subclass.jit(f, dynamic=True)
    # contiguous (max 4, 5, 3), then with holes (an inner tensor more: another structure), contiguous again (max 6)
    for x in (njt((2, 3, 4)), njt((3, 5, 2)), njt((3, 3, 2, 2)), holes((2, 3, 4)), holes((5, 2, 3)), njt((6, 2))):
        y, expected = jf(x), f(x)
        for a, b in zip(y.unbind(), expected.unbind()):
            torch.testing.assert_close(a, b)
        assert y.is_contiguous() == expected.is_contiguous()
    # contiguous inputs: one trace per side of the branch (the max length is a symbolic size, the branch guarded);
    # inputs with holes: another structure (a lengths tensor), with no cached max length (computed from the lengths'
    # values: each set of lengths is a new trace)
    assert cache_counts(jf) == (4, 2)
