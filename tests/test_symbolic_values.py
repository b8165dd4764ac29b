"""thunder's cache="symbolic values" with thunder_subclass: sizes that reach a subclass operation stay symbolic where
its fake run (with a ShapeEnv) needs no fixed value (tests/test_symbolic_subclass_sizes.py has more); the rest stays
symbolic; thunder 0.2.6's own stale traces and failures under
symbolic values (a number used only in a branch, a list indexed by a number input) are fixed for plugin jits."""

import torch
from torch.testing._internal.two_tensor import TwoTensor

import thunder
import thunder_subclass


def test_a_plain_size_that_reaches_a_subclass_op_stays_symbolic():
    w = TwoTensor(torch.randn(4, 4), torch.randn(4, 4))
    # x's batch size enters the fake run of the TwoTensor matmul as a ShapeEnv symbol: no new trace per size
    f = lambda x, w: (x @ w).sum(0)  # noqa: E731
    jf = thunder_subclass.jit(f, cache="symbolic values")
    for n in (3, 5, 3):
        x = torch.randn(n, 4)
        out, expected = jf(x, w), f(x, w)
        torch.testing.assert_close(out.a, expected.a)
        torch.testing.assert_close(out.b, expected.b)
    assert thunder.cache_misses(jf) == 1 and thunder.cache_hits(jf) == 2


def test_a_plain_size_that_meets_only_plain_ops_stays_symbolic():
    w = TwoTensor(torch.randn(4), torch.randn(4))

    def f(x, y, w):
        return (w * 2).sum() + torch.cat([x, y]).sum()  # the sizes of x and y never meet w

    jf = thunder_subclass.jit(f, cache="symbolic values")
    for n in (3, 5, 7):
        x, y = torch.randn(n), torch.randn(2)
        torch.testing.assert_close(jf(x, y, w).a, f(x, y, w).a)
    assert thunder.cache_misses(jf) == 1


def test_a_number_input_used_only_in_a_branch_is_guarded():
    # thunder 0.2.6 alone reuses the trace of the first branch for the second (x + 1 for flag=True)
    f = lambda x, flag: x - 1 if flag else x + 1  # noqa: E731
    jf = thunder_subclass.jit(f, cache="symbolic values")
    x = torch.randn(3)
    for flag in (False, True, False):
        torch.testing.assert_close(jf(x, flag), f(x, flag))
    assert thunder.cache_misses(jf) == 2


def test_a_list_indexed_by_a_number_input():
    f = lambda xs, i: xs[i] * 2  # noqa: E731
    jf = thunder_subclass.jit(f, cache="symbolic values")
    xs = [torch.randn(3), torch.randn(3)]
    for i in (0, 1, 0):
        torch.testing.assert_close(jf(xs, i), f(xs, i))


def test_a_branch_on_arithmetic_of_number_inputs_is_guarded_as_its_condition():
    f = lambda x, n: x + 1 if n + 2 > 4 else x - 1  # noqa: E731
    jf = thunder_subclass.jit(f, cache="symbolic values")
    x = torch.randn(3)
    for n in (1, 5, 6, 0):
        torch.testing.assert_close(jf(x, n), f(x, n))
    # one trace per outcome of the condition, not per value of n
    assert thunder.cache_misses(jf) == 2
