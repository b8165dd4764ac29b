"""A recorded backward gets gradients of layouts its fakes did not have: the fake of an incoming gradient is
contiguous, the real one is often an expanded view (``out.sum().backward()`` gives strides 0). PyTorch's derivative
formulas make the gradient contiguous before kernels that need it (``native_group_norm_backward(grad.contiguous(),
...)``), which on the fakes recorded nothing: ``GroupNorm`` with ``TwoTensor`` parameters gave weight and bias
gradients of uninitialised memory. Such kernels now get their arguments contiguous, as the formula did."""

import copy

import pytest
import thunder
import torch
from torch import nn

import thunder_subclass
from subclasses import TwoTensor


def _two_tensor_parameters(module: nn.Module) -> nn.Module:
    for m in module.modules():
        for name, p in list(m._parameters.items()):
            if p is not None:
                m._parameters[name] = nn.Parameter(TwoTensor(p.detach().clone(), p.detach().clone() * 0.5))
    return module


@pytest.mark.parametrize("reduce", ["sum", "mean", "weighted"])
def test_group_norm_with_subclass_parameters_trains_as_in_eager(reduce):
    torch.manual_seed(0)
    model = _two_tensor_parameters(nn.Sequential(nn.Conv1d(4, 4, 1), nn.GroupNorm(2, 4)))
    twin = copy.deepcopy(model)
    x = torch.randn(2, 4, 3)

    def loss(out):
        if reduce == "sum":
            return out.sum()  # its gradient is an expanded view (strides 0)
        if reduce == "mean":
            return out.mean()
        return (out * torch.arange(24.0).view(2, 4, 3)).sum()

    loss(model(x)).backward()
    jm = thunder_subclass.jit(twin)
    loss(jm(x)).backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        assert type(q.grad) is type(p.grad), name
        torch.testing.assert_close(q.grad, p.grad, msg=name)
    assert "native_group_norm_backward_default_on_contiguous" in str(thunder.last_backward_traces(jm)[-1])


def test_pointwise_backward_operations_are_left_as_recorded():
    x = TwoTensor(torch.randn(3, 4), torch.randn(3, 4)).requires_grad_()
    jf = thunder_subclass.jit(lambda x: (x.sin() * x).sum())
    jf(x).backward()
    assert "on_contiguous" not in str(thunder.last_backward_traces(jf)[-1])
