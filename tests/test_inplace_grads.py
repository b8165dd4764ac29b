"""In-place writes of one tensor's values into another inside a compiled function (``copy_``, ``mul_``, ``add_``,
``masked_scatter_``) on subclass and plain destinations: the values, the destination and the gradient of every
input are eager's."""

import pytest
import torch

import thunder_subclass
from thunder_subclass import UnsupportedSubclassOperationError
from helpers import assert_same, two


def _fresh(x, y):
    h = torch.zeros_like(x)  # a destination that does not require grad
    h.copy_(y)
    return h * x


def _fresh_add(x, y):
    h = torch.zeros_like(x)
    h.add_(y)
    return h * x


def _overwrite(x, y):
    h = x * 2  # a destination that requires grad, overwritten: x's gradient is zero
    h.copy_(y)
    return h


def _mul_then_return(x, y):
    h = x * 2
    h.mul_(y)  # the backward needs h's value before the write
    return h


def _masked_scatter(x, y):
    h = x * 2
    h.masked_scatter_(torch.tensor([[True], [False], [True], [False]]).expand(4, 3), y)
    return h


CASES = {"copy_-fresh": _fresh, "add_-fresh": _fresh_add, "copy_-overwrite": _overwrite,
         "mul_-saved": _mul_then_return, "masked_scatter_": _masked_scatter}
KINDS = {
    "two-two": lambda: (two(4, 3, requires_grad=True), two(4, 3, requires_grad=True)),
    "two-plain": lambda: (two(4, 3, requires_grad=True), torch.randn(4, 3, requires_grad=True)),
    "plain-two": lambda: (torch.randn(4, 3, requires_grad=True), two(4, 3, requires_grad=True)),
}


def _leaf_copy(t):
    return t.detach().clone().requires_grad_(t.requires_grad)


# a plain destination written from a subclass worked before except where the backward needs the overwritten value
PAIRS = [(c, k) for c in CASES for k in KINDS if k != "plain-two" or c == "mul_-saved"]


@pytest.mark.parametrize(("case", "kind"), PAIRS, ids=[f"{c}-{k}" for c, k in PAIRS])
def test_in_place_write_gives_eager_values_and_gradients(case, kind):
    fn = CASES[case]
    torch.manual_seed(0)
    args = KINDS[kind]()
    eager_args = [_leaf_copy(a) for a in args]
    expected = fn(*eager_args)
    actual = thunder_subclass.jit(fn)(*args)
    assert_same(actual.detach(), expected.detach())
    grad = two(*expected.shape) if type(expected) is not torch.Tensor else torch.randn(expected.shape)
    expected.backward(grad)
    actual.backward(grad)
    for a, e in zip(args, eager_args):
        assert (a.grad is None) == (e.grad is None), case
        if e.grad is not None:
            assert_same(a.grad, e.grad)


def test_copy_into_a_subclass_input_then_reading_it_differentiates_the_source():
    def fn(x, y, w):
        x.copy_(y)  # x: an input that does not require grad
        return x * w

    x, y, w = two(4), two(4, requires_grad=True), two(4, requires_grad=True)
    ex, ey, ew = _leaf_copy(x), _leaf_copy(y), _leaf_copy(w)
    out = thunder_subclass.jit(fn)(x, y, w)
    expected = fn(ex, ey, ew)
    assert_same(out.detach(), expected.detach())
    assert_same(x, ex)  # the caller's destination changed as in eager
    out.sum().backward()
    expected.sum().backward()
    assert_same(y.grad, ey.grad)
    assert_same(w.grad, ew.grad)


def _slice_assign(x, y):
    h = x * 2
    h[1:] = y[1:]  # the source line the error names
    return h


def _slice_scatter(x, y):  # what the error suggests instead
    h = x * 2
    return torch.slice_scatter(h, y[1:], 0, 1)


@pytest.mark.parametrize("kind", list(KINDS))
def test_indexed_assignment_with_a_subclass_and_grad_raises_a_typed_error(kind):
    x, y = KINDS[kind]()
    with pytest.raises(UnsupportedSubclassOperationError,
                       match=r"indexed assignment \(tensor\[key\] = value, torch's setitem_\) on TwoTensor at "
                             r".*test_inplace_grads\.py:\d+ with a tensor that requires grad .*slice_scatter"):
        thunder_subclass.jit(_slice_assign, fullgraph=True)(x, y)
    with torch.no_grad(), pytest.raises(UnsupportedSubclassOperationError, match="indexed assignment"):  # dropped
        thunder_subclass.jit(_slice_assign, fullgraph=True)(x, y)
    # without tensors that require grad it runs as written; the suggested rewrite gives eager's gradients
    dx, dy = x.detach(), y.detach()
    assert_same(thunder_subclass.jit(_slice_assign, fullgraph=True)(dx, dy), _slice_assign(dx, dy))
    ex, ey = _leaf_copy(x), _leaf_copy(y)
    out, expected = thunder_subclass.jit(_slice_scatter)(x, y), _slice_scatter(ex, ey)
    assert_same(out.detach(), expected.detach())
    grad = two(4, 3) if type(expected) is not torch.Tensor else torch.randn(4, 3)
    out.backward(grad)
    expected.backward(grad)
    assert_same(x.grad, ex.grad)
    assert_same(y.grad, ey.grad)


def test_indexed_assignment_in_a_module_with_grad_parameters_under_no_grad_raises():
    class Fill(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(two(4, 3))

        def forward(self, y):
            h = self.w * 2
            h[1:] = y[1:]
            return h

    with torch.no_grad(), pytest.raises(UnsupportedSubclassOperationError, match="indexed assignment .* TwoTensor"):
        thunder_subclass.jit(Fill(), fullgraph=True)(torch.randn(4, 3))


def _through_slice(x, y):
    h = x * 2
    h[1:].copy_(y[1:])
    return h * x


def _through_view(x, y):
    h = x * 2
    h.view(12).add_(y.view(12))
    return h * x


def _through_t(x, y):
    h = x * 2
    h.t().mul_(y.t())
    return h * x


@pytest.mark.parametrize("kind", ["two-two", "two-plain"])
@pytest.mark.parametrize(("fn", "op", "view"), [(_through_slice, "copy_", "getitem"), (_through_view, "add_", "view"),
                                                (_through_t, "mul_", "t")], ids=["slice", "view", "t"])
def test_write_through_a_view_of_a_subclass_with_grad_raises_a_typed_error(fn, op, view, kind):
    x, y = KINDS[kind]()
    with pytest.raises(UnsupportedSubclassOperationError,
                       match=rf"{op} into a view \({view}\) with TwoTensor at .*test_inplace_grads\.py:\d+ with a "
                             r"tensor that requires grad .*whole tensor"):
        thunder_subclass.jit(fn, fullgraph=True)(x, y)
    dx, dy = x.detach(), y.detach()  # without gradients it runs as written
    assert_same(thunder_subclass.jit(fn, fullgraph=True)(dx, dy), fn(dx, dy))
