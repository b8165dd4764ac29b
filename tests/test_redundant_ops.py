"""Redundant operations removed from flattened traces (issue 44, ``transforms/redundant.py``): detaches whose results
only pure operations read, and pure operations the backward computes twice; gradients equal to eager's."""

import collections
import copy

import pytest
import thunder
import torch
import torch.nn.functional as F

import thunder_subclass
from subclasses import TwoTensor


def names(trace) -> list[str]:
    return [b.sym.name for b in trace.bound_symbols]


def duplicates(trace) -> list[str]:
    """Top-level operations with the same symbol and arguments as an earlier one (``clear_mutable_collection`` and
    other bookkeeping aside)."""
    seen, dup = set(), []
    for b in trace.bound_symbols:
        if not b.flat_proxy_outs or b.sym.name in ("unpack_sequence", "unpack_trivial"):
            continue
        try:
            key = b.rhs
            hash(key)
        except TypeError:
            continue
        if key in seen:
            dup.append(b.sym.name)
        seen.add(key)
    return dup


class TwoTensorMLP(torch.nn.Module):
    def __init__(self, width=8, layers=3):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.weights = torch.nn.ParameterList(
            [torch.nn.Parameter(TwoTensor(torch.randn(width, width, generator=g), torch.randn(width, width, generator=g)))
             for _ in range(layers)])

    def forward(self, x):
        for w in self.weights:
            x = torch.relu(x @ w)
        return x.sum()


def test_relu_derivatives_detach_nothing_in_the_backward():
    model = TwoTensorMLP()
    eager = copy.deepcopy(model)
    x = TwoTensor(torch.randn(4, 8), torch.randn(4, 8))
    jm = thunder_subclass.jit(model)
    out, expected = jm(x), eager(x)
    out.backward()
    expected.backward()
    torch.testing.assert_close(out.a, expected.a)
    torch.testing.assert_close(out.b, expected.b)
    for p, ep in zip(model.parameters(), eager.parameters()):
        assert type(p.grad) is type(ep.grad) is TwoTensor
        torch.testing.assert_close(p.grad.a, ep.grad.a)
        torch.testing.assert_close(p.grad.b, ep.grad.b)
    backward = names(thunder.last_backward_traces(jm)[-1])
    assert "detach" not in backward  # ReLU's derivative detached its saved result twice per inner tensor
    assert backward.count("where") == 6  # the derivative itself is still there


def test_a_detach_whose_result_is_returned_stays():
    def only_read(x):
        return x.detach() * 2

    def returned(x):
        y = x.detach()
        return y, y * 2

    x = TwoTensor(torch.randn(3), torch.randn(3), ).requires_grad_()
    jf = thunder_subclass.jit(only_read)
    out, expected = jf(x), only_read(x)
    torch.testing.assert_close(out.a, expected.a)
    assert not out.requires_grad and not expected.requires_grad  # still cut from x's gradient
    assert "detach" not in names(thunder.last_traces(jf)[-1])
    jf = thunder_subclass.jit(returned)
    (y, y2), (ey, ey2) = jf(x), returned(x)
    assert "detach" in names(thunder.last_traces(jf)[-1])
    assert type(y) is type(ey) is TwoTensor and not y.requires_grad and not y.a.requires_grad
    torch.testing.assert_close(y.a, ey.a)
    torch.testing.assert_close(y2.b, ey2.b)


def test_float8_backward_casts_the_incoming_gradient_once():
    pytest.importorskip("torchao")
    from torchao.float8 import convert_to_float8_training

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32))
    convert_to_float8_training(model)
    eager = copy.deepcopy(model)
    x, target = torch.randn(8, 32), torch.randn(8, 32)
    jm = thunder_subclass.jit(model)
    for _ in range(2):
        loss, eloss = F.mse_loss(jm(x), target), F.mse_loss(eager(x), target)
        loss.backward()
        eloss.backward()
        torch.testing.assert_close(loss, eloss)
        for p, ep in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, ep.grad)
    backward = thunder.last_backward_traces(jm)[-1]
    assert duplicates(backward) == []
    counts = collections.Counter(names(backward))
    # three float8 GEMMs in the backward (the first layer's input needs no gradient); each operand's cast once:
    # the gradient of the second layer's output feeds two of them
    assert sum(n for name, n in counts.items() if name.startswith("aten__scaled_mm_default")) == 3
    assert counts["amax"] == 5


def test_conversions_to_the_dtype_a_tensor_has_are_not_run():
    def f(x, y):
        return x * y.to(torch.float32) + y.to(torch.float32).sum()

    def kept(x, y):  # a copy, a returned conversion (eager returns y itself): as eager
        return x * 2, y.to(torch.float32, copy=True), y.to(torch.float32)

    x, y = TwoTensor(torch.randn(3), torch.randn(3)), torch.randn(3)
    jf = thunder_subclass.jit(f)
    out, expected = jf(x, y), f(x, y)
    assert "to" not in names(thunder.last_traces(jf)[-1])
    torch.testing.assert_close(out.a, expected.a, atol=0, rtol=0)
    torch.testing.assert_close(out.b, expected.b, atol=0, rtol=0)
    jf = thunder_subclass.jit(kept)
    (_, copied, same), (_, ecopied, esame) = jf(x, y), kept(x, y)
    assert names(thunder.last_traces(jf)[-1]).count("to") == 2  # a result's conversion is left alone
    assert copied is not y and same is y and esame is y
    torch.testing.assert_close(copied, ecopied, atol=0, rtol=0)
    torch.testing.assert_close(same, y, atol=0, rtol=0)
