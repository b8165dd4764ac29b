"""In-place writes into tensors that share memory (a view, or a tensor a view was taken of) with gradients: thunder
0.2.6's autodiff does not connect them, and gave wrong gradients (and for ``diagonal().zero_()`` a wrong value)
silently. They are a graph break now (equal to eager), ``UnsupportedAliasedWriteError`` with ``fullgraph=True``; the
same writes without gradients, and in-place writes into tensors nothing else aliases, are still compiled."""

import pytest
import torch
import thunder

import thunder_subclass
from thunder_subclass import UnsupportedAliasedWriteError

pytestmark = pytest.mark.filterwarnings("ignore::thunder_subclass.GraphBreakWarning")


def copy_into_slice(x, y):
    h = x * 2
    h[1:].copy_(y[1:])
    return h.sin().sum()


def add_into_flat_view(x, y):
    h = x * 2
    h.view(-1).add_(y.view(-1).sum())
    return (h * h).sum()


def mul_into_slice_then_read_both(x, y):
    h = x * 2
    v = h[1:]
    v.mul_(y[1:])
    return h.sum() + v.sum()


def write_base_then_read_view(x, y):
    h = x * 2
    v = h[1:]
    h.mul_(y)
    return (v * v).sum()


def scale_a_slice(x, y):
    h = x * 2
    h[1:].mul_(2)
    return (h * y).sum()


def copy_into_a_slice_of_zeros(x, y):
    h = torch.zeros(3, 3)
    h[1:].copy_(y[1:])
    return (h * x).sum()


def zero_the_diagonal(x, y):
    h = x.clone()
    h.diagonal().zero_()
    return (h * y).sum()


def add_into_a_view_of_a_reshape(x, y):
    h = (x * 2).view(9)
    h.view(3, 3)[0].add_(y[0])
    return (h ** 2).sum()


ALIASED = [copy_into_slice, add_into_flat_view, mul_into_slice_then_read_both, write_base_then_read_view,
           scale_a_slice, copy_into_a_slice_of_zeros, zero_the_diagonal, add_into_a_view_of_a_reshape]


def _inputs(grad: bool):
    torch.manual_seed(0)
    x, y = torch.randn(3, 3), torch.randn(3, 3)
    return x.requires_grad_(grad), y.requires_grad_(grad)


def _same_grads(got, want):
    for a, b in zip(got, want):
        if b is None or a is None:  # (an input eager reaches with a zero gradient may get None: unreached_grads.py)
            assert (a if a is not None else b) is None or not (a if a is not None else b).any()
        else:
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("fn", ALIASED, ids=lambda f: f.__name__)
def test_aliased_write_with_gradients_equals_eager(fn):
    x, y = _inputs(True)
    ex, ey = (t.detach().clone().requires_grad_() for t in (x, y))
    jf = thunder_subclass.jit(fn)
    out, expected = jf(x, y), fn(ex, ey)
    torch.testing.assert_close(out, expected)
    _same_grads(torch.autograd.grad(out, (x, y), allow_unused=True),
                torch.autograd.grad(expected, (ex, ey), allow_unused=True))
    (brk,) = jf.graph_breaks.breaks
    assert brk.reason.startswith("UnsupportedAliasedWriteError: ")


@pytest.mark.parametrize("fn", ALIASED[:3], ids=lambda f: f.__name__)
def test_aliased_write_with_gradients_raises_with_fullgraph(fn):
    x, y = _inputs(True)
    name = {"copy_into_slice": "copy_", "add_into_flat_view": "add_", "mul_into_slice_then_read_both": "mul_"}
    with pytest.raises(UnsupportedAliasedWriteError,
                       match=rf"{name[fn.__name__]} at .*test_aliased_writes.py:\d+ writes into a tensor that shares "
                             r"memory .* gradients are computed.*slice_scatter"):
        thunder_subclass.jit(fn, fullgraph=True)(x, y)


@pytest.mark.parametrize("fn", ALIASED, ids=lambda f: f.__name__)
def test_aliased_write_without_gradients_is_compiled(fn):
    x, y = _inputs(False)
    jf = thunder_subclass.jit(fn, fullgraph=True)
    torch.testing.assert_close(jf(x, y), fn(x, y))
    assert any(b.sym.name.endswith("_") for b in thunder.last_traces(jf)[0].bound_symbols)


def test_in_place_writes_into_unaliased_tensors_with_gradients_are_compiled():
    def fn(x, y):
        h = x * 2
        h.add_(y)
        h.mul_(3)
        h += 1
        return (h * x).sum()

    x, y = _inputs(True)
    ex, ey = (t.detach().clone().requires_grad_() for t in (x, y))
    out = thunder_subclass.jit(fn, fullgraph=True)(x, y)
    expected = fn(ex, ey)
    torch.testing.assert_close(out, expected)
    _same_grads(torch.autograd.grad(out, (x, y)), torch.autograd.grad(expected, (ex, ey)))
