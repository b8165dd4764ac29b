"""In-place writes that overwrite a tensor which requires grad (``h.copy_(y)``, ``h.zero_()``): eager sends the
overwritten value's history a gradient of zeros (``CopyBackwards``), so what ``h`` was computed from gets ``.grad``
zeros, not None. thunder 0.2.6 gave None (an optimizer then skips the parameter: no weight decay, no momentum step).
Also ``h.copy_(y)`` with a ``y`` that broadcasts, which thunder's ``copy_`` refused."""

import pytest
import torch
import thunder

import thunder_subclass


def copy_over(x, y):
    h = x * 2
    h.copy_(y)
    return h * 3


def zero_then_add(x, y):
    h = x.sin()
    h.zero_()
    h.add_(y)
    return h * x


def copy_twice(x, y):
    h = x * 2
    h.copy_(y)
    h.copy_(y * 2)
    return h.sin()


def copy_into_untracked(x, y):
    h = torch.zeros(3)
    h.copy_(y)
    return h * x


def _leaves(*shapes_and_dtypes):
    torch.manual_seed(0)
    return [torch.randn(*shape, dtype=dtype, requires_grad=True) for shape, dtype in shapes_and_dtypes]


def _compare(fn, leaves, **jit_options):
    twins = [t.detach().clone().requires_grad_(t.requires_grad) for t in leaves]
    expected = fn(*leaves)
    expected.sum().backward()
    got = thunder_subclass.jit(fn, **jit_options)(*twins)
    got.sum().backward()
    torch.testing.assert_close(got, expected)
    for mine, theirs in zip(twins, leaves):
        assert (mine.grad is None) == (theirs.grad is None), (mine.grad, theirs.grad)
        if theirs.grad is not None:
            torch.testing.assert_close(mine.grad, theirs.grad)
    return twins


@pytest.mark.parametrize("fn", [copy_over, zero_then_add, copy_twice, copy_into_untracked])
def test_an_overwritten_value_gets_eager_zero_gradient(fn):
    x, y = _compare(fn, _leaves(((3,), torch.float32), ((3,), torch.float32)))
    if fn in (copy_over, copy_twice):
        torch.testing.assert_close(x.grad, torch.zeros(3))  # eager's zeros, not None


def test_copy_from_another_dtype_and_a_broadcast_source():
    _compare(copy_over, _leaves(((3,), torch.float32), ((3,), torch.float64)))
    x, y = _compare(copy_over, _leaves(((2, 3), torch.float32), ((1, 3), torch.float32)))
    torch.testing.assert_close(y.grad, torch.full((1, 3), 6.0))  # summed over the broadcast rows


def test_a_broadcast_copy_without_gradients_runs():
    h = torch.zeros(2, 3)
    y = torch.arange(3.0)

    def fill(h, y):
        h = h * 1
        h.copy_(y)
        return h + 1

    torch.testing.assert_close(thunder_subclass.jit(fill)(h, y), fill(h, y))


def test_a_weight_decay_step_moves_the_parameter_as_in_eager():
    # the user-visible price of None: SGD with weight decay skips a parameter whose .grad is None
    def step(compiled: bool):
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(4))
        y = torch.randn(4)
        fn = thunder_subclass.jit(copy_over) if compiled else copy_over
        opt = torch.optim.SGD([w], lr=0.5, weight_decay=0.1)
        fn(w, y).sum().backward()
        before = w.detach().clone()
        opt.step()
        return before, w.detach()

    before, eager = step(False)
    _, compiled = step(True)
    torch.testing.assert_close(compiled, eager)
    torch.testing.assert_close(eager, before * (1 - 0.5 * 0.1))  # the decay step, taken on a zero gradient


def test_under_dynamic_shapes_one_entry_serves_every_size():
    jf = thunder_subclass.jit(copy_over, dynamic=True)
    for n in (3, 5, 7):
        x = torch.randn(n, requires_grad=True)
        y = torch.randn(n, requires_grad=True)
        jf(x, y).sum().backward()
        torch.testing.assert_close(x.grad, torch.zeros(n))
        torch.testing.assert_close(y.grad, torch.full((n,), 3.0))
    assert thunder.cache_misses(jf) == 1


def test_the_backward_keeps_no_tensor_for_the_zeros():
    x, y = _leaves(((3,), torch.float32), ((3,), torch.float32))
    jf = thunder_subclass.jit(copy_over)
    jf(x, y).sum().backward()
    forward = str(thunder.last_traces(jf)[-1])
    backward = str(thunder.last_backward_traces(jf)[-1])
    assert "zeros_like" in backward
    assert "((), ())" in forward  # nothing saved for the backward: the zeros are made from the incoming gradient


def test_without_gradients_the_write_is_thunder_s_own():
    x, y = _leaves(((3,), torch.float32), ((3,), torch.float32))
    jf = thunder_subclass.jit(copy_over)
    with torch.no_grad():
        torch.testing.assert_close(jf(x, y), copy_over(x, y))
    assert "copy_" in str(thunder.last_traces(jf)[-1])
