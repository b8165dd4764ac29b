"""``x.stride()`` read in traced code under symbolic sizes (``dynamic=True``, automatic dynamic shapes): numbers of
the sizes, equal to eager's strides for every call the trace serves; the input's layout (contiguous, transposed,
permuted) is checked by the prologue; what cannot be computed from sizes is a typed error.

Every test compares values (and gradients) with eager and counts traces exactly."""

import pytest
import torch

import thunder_subclass
from helpers import cache_counts
from subclasses import TwoTensor
from thunder_subclass.errors import UnsupportedTracingError

CASES = {  # name -> (f, make(n): the input of size n)
    "x.stride()[0] of a contiguous input": (lambda x: x.sin() * x.stride()[0], lambda n: torch.randn(n, 6)),
    "x.t().stride(1)": (lambda x: x.t().stride(1) + x.sum(), lambda n: torch.randn(n, 6)),
    "a transposed input": (lambda x: x * x.stride(0) + x.stride(1), lambda n: torch.randn(6, n).t()),
    "x.permute(2, 0, 1).stride()": (lambda x: x.permute(2, 0, 1).stride()[2] * x + x.permute(2, 0, 1).stride(0),
                                    lambda n: torch.randn(n, 3, n + 1)),
    "x.reshape(-1, 2).stride(0)": (lambda x: x.reshape(-1, 2).stride(0) * x, lambda n: torch.randn(n, 4)),
    "x.unsqueeze(1).expand(...).stride()": (lambda x: x * sum(x.unsqueeze(1).expand(-1, 3, -1).stride()),
                                            lambda n: torch.randn(n, n + 2)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_strides_with_symbolic_sizes_are_eagers_for_every_size(case):
    f, make = CASES[case]
    jf = thunder_subclass.jit(f, dynamic=True)
    for n in (3, 4, 5, 7):
        x = make(n)
        torch.testing.assert_close(jf(x), f(x))
    assert cache_counts(jf) == (1, 3)


def test_the_layout_of_an_input_whose_strides_were_read_is_checked():
    f = lambda x: x * x.stride(0) + x.stride(1)  # noqa: E731
    jf = thunder_subclass.jit(f, dynamic=True)
    for x in (torch.randn(6, 3).t(), torch.randn(4, 5), torch.randn(7, 2).t(), torch.randn(5, 6)):
        torch.testing.assert_close(jf(x), f(x))
    assert cache_counts(jf) == (2, 2)  # transposed, then contiguous: a trace each


def test_sizes_0_and_1_get_their_own_traces():
    f = lambda x: x * x.stride(0) + x.stride(1)  # noqa: E731
    jf = thunder_subclass.jit(f, dynamic=True)
    for shape in ((3, 4), (1, 4), (0, 4), (3, 1), (5, 5), (6, 2)):
        x = torch.randn(*shape)
        torch.testing.assert_close(jf(x), f(x))
    assert cache_counts(jf) == (4, 2)  # as torch.compile, sizes 0 and 1 are not symbolic


def test_automatic_dynamic_shapes_read_strides_symbolically():
    f = lambda x: x * x.t().stride(0)  # noqa: E731
    jf = thunder_subclass.jit(f)
    for n in (3, 4, 5, 6):
        x = torch.randn(n, n + 1)
        torch.testing.assert_close(jf(x), f(x))
    assert cache_counts(jf) == (2, 2)  # the second size makes the symbolic trace, which serves the rest


def test_gradients_through_a_function_that_reads_strides():
    f = lambda x: (x.sin() * x.stride(0)).sum()  # noqa: E731
    jf = thunder_subclass.jit(f, dynamic=True)
    for n in (3, 4, 5):
        x = torch.randn(n, 5, requires_grad=True)
        xe = x.detach().clone().requires_grad_()
        y, ye = jf(x), f(xe)
        y.backward()
        ye.backward()
        torch.testing.assert_close(y, ye)
        torch.testing.assert_close(x.grad, xe.grad)
    assert cache_counts(jf) == (1, 2)


def test_strides_of_the_inner_tensors_of_a_subclass_input():
    f = lambda x: x.a * x.a.stride(0) + x.b.t().stride(0)  # noqa: E731
    jf = thunder_subclass.jit(f, dynamic=True)
    for n in (3, 4, 5):
        x = TwoTensor(torch.randn(n, 6), torch.randn(n, 6))
        torch.testing.assert_close(jf(x), f(x))
    assert cache_counts(jf) == (1, 2)


def test_strides_of_a_sliced_input_with_symbolic_sizes_are_a_typed_error():
    def f(x):
        return x * x.stride(0)

    with pytest.raises(UnsupportedTracingError, match=r"x.stride\(\) at .*test_symbolic_strides.py:\d+ of a tensor "
                                                      r"with symbolic sizes .*not a dense tensor .*dynamic=False"):
        thunder_subclass.jit(f, dynamic=True)(torch.randn(4, 8)[:, :6])
