"""Strides on fakes are eager's: subclass dispatch that decides by layout decides as in eager.

thunder's proxies carry no strides. A subclass's ``__torch_dispatch__`` runs on fakes while tracing, and some look at
strides (torchao's float8 GEMMs make their second operand column-major when it is not; ``torch._scaled_mm`` on CUDA
refuses a row-major one). Fakes of values made by thunder's own operations (``w.t()``) get the strides eager's op
would give, and plain tensor inputs whose strides a fake run used are guarded: another layout compiles again.
"""

import pytest
import torch

import thunder_subclass
import thunder


class LayoutTagged(torch.Tensor):
    """A wrapper whose ``mm`` result depends on the layout of the other operand (x1 column-major, else x2)."""

    @staticmethod
    def __new__(cls, t):
        return torch.Tensor._make_wrapper_subclass(cls, t.shape, dtype=t.dtype, device=t.device, strides=t.stride())

    def __init__(self, t):
        self.t = t

    def __tensor_flatten__(self):
        return ["t"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, size, stride):
        return LayoutTagged(inner["t"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda x: x.t if isinstance(x, LayoutTagged) else x  # noqa: E731
        args = [unwrap(a) for a in args]
        if func is torch.ops.aten.mm.default:
            a, b = args
            return func(a, b) * (1.0 if b.stride(0) == 1 else 2.0)
        return func(*args, **(kwargs or {}))


def _x():
    return LayoutTagged(torch.randn(3, 4))


@pytest.mark.parametrize("make_operand", [lambda w: w.t() * 3, lambda w: w.t().relu().mul(2), lambda w: w.t().contiguous()],
                         ids=["transpose-then-mul", "chain", "contiguous"])
def test_layout_of_plain_intermediates_is_eagers(make_operand):
    def f(x, w):
        return x @ make_operand(w)  # thunder's own ops make the operand the subclass's mm looks at

    x, w = _x(), torch.randn(5, 4)
    torch.testing.assert_close(thunder_subclass.jit(f)(x, w), f(x, w))


def test_input_layout_is_guarded():
    def f(x, w):
        return x @ w

    jf = thunder_subclass.jit(f)
    x = _x()
    row_major, col_major = torch.randn(4, 5), torch.randn(5, 4).t()
    for w in (row_major, col_major, row_major, col_major):
        torch.testing.assert_close(jf(x, w), f(x, w))
    assert thunder.cache_misses(jf) == 2 and thunder.cache_hits(jf) == 2
    # the layout check is one condition of the fused prologue
    from thunder_subclass.guards.prologue import check_prologue

    (fused,) = [b for b in thunder.last_prologue_traces(jf)[-1].bound_symbols if b.sym.id == check_prologue.id]
    assert [c for c in fused.args[1].conditions if ".stride() ==" in c]


def test_inputs_that_meet_no_subclass_have_no_layout_guard():
    def f(x, w, b):
        return (x @ w) + (b * 2).sum()  # b only meets plain operations

    jf = thunder_subclass.jit(f)
    x, w = _x(), torch.randn(4, 5)
    for b in (torch.randn(4, 6), torch.randn(6, 4).t()):
        torch.testing.assert_close(jf(x, w, b), f(x, w, b))
    assert thunder.cache_misses(jf) == 1


# --- inner tensors of subclass inputs keep eager's strides (issue 24) ---

from torch.testing._internal.two_tensor import TwoTensor  # noqa: E402

from subclasses import nested_two_tensor  # noqa: E402


def _transposed_two_tensor():
    return TwoTensor(torch.randn(3, 4).t(), torch.randn(3, 4).t())


def test_view_that_eager_refuses_on_transposed_inner_tensors_is_refused():
    f = lambda t: t.view(-1) * 2  # noqa: E731
    t = _transposed_two_tensor()
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        f(t)
    with pytest.raises(thunder_subclass.errors.SubclassDispatchError,
                       match=r"torch.Tensor.view on TwoTensor failed while tracing at .*test_strides.py:\d+.*Cannot view"):
        thunder_subclass.jit(f)(t)


@pytest.mark.parametrize("make", [
    _transposed_two_tensor,
    lambda: TwoTensor(*(torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last) for _ in range(2))),
    lambda: nested_two_tensor(*(torch.randn(3, 4).t() for _ in range(4))),
], ids=["transposed", "channels_last", "nested"])
def test_outputs_keep_eagers_layout(make):
    def f(t):
        return (t * 2).relu() + 1

    t = make()
    expected, out = f(t), thunder_subclass.jit(f)(t)
    torch.testing.assert_close(out, expected)
    assert type(out) is type(expected) and out.stride() == expected.stride()
    for attr in ("a", "b"):
        o, e = getattr(out, attr), getattr(expected, attr)
        assert o.stride() == e.stride()
        if isinstance(e, TwoTensor):
            assert o.a.stride() == e.a.stride() and o.b.stride() == e.b.stride()


def test_new_inner_layout_is_a_cache_miss():
    def f(t):
        return (t * 2).t()

    jf = thunder_subclass.jit(f)
    contiguous = TwoTensor(torch.randn(4, 3), torch.randn(4, 3))
    transposed = _transposed_two_tensor()
    for t in (contiguous, transposed, contiguous, transposed):
        out, expected = jf(t), f(t)
        torch.testing.assert_close(out, expected)
        assert out.stride() == expected.stride() and out.a.stride() == expected.a.stride()
    assert thunder.cache_misses(jf) == 2 and thunder.cache_hits(jf) == 2
    # a third layout (every other column): another trace
    strided = TwoTensor(torch.randn(4, 6)[:, ::2], torch.randn(4, 6)[:, ::2])
    out, expected = jf(strided), f(strided)
    torch.testing.assert_close(out, expected)
    assert (out.stride(), out.a.stride(), out.b.stride()) == (expected.stride(), expected.a.stride(), expected.b.stride())
    assert thunder.cache_misses(jf) == 3


def test_trace_for_contiguous_inner_tensors_is_not_reused_where_eager_raises():
    f = lambda t: t.view(-1) * 2  # noqa: E731
    jf = thunder_subclass.jit(f)
    contiguous = TwoTensor(torch.randn(4, 3), torch.randn(4, 3))
    torch.testing.assert_close(jf(contiguous), f(contiguous))
    with pytest.raises(thunder_subclass.errors.SubclassDispatchError, match="Cannot view"):
        jf(_transposed_two_tensor())
    assert thunder.cache_hits(jf) == 0
