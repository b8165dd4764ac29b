"""CUDA: subclass programs on a GPU with thunder's GPU executors (nvFuser, torch_compile, CUDA graphs).

Every test is marked ``cuda`` and skipped without a CUDA device (CI has none); they run on a GPU machine with
``python -m pytest -q -m cuda``. Each compares values, gradients and types with eager PyTorch on the same GPU.
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

import thunder_subclass
from helpers import two
import thunder
from torch.testing._internal.two_tensor import TwoTensor

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _nvfuser_available() -> bool:
    if not any(importlib.util.find_spec(m) for m in ("nvfuser_direct", "nvfuser")):
        return False
    from thunder.executors.nvfuserex import nvfuserex

    return nvfuserex is not None


def _two(*shape, requires_grad=True):
    return two(*shape, requires_grad=requires_grad, device="cuda")


class _TwoTensorMLP(torch.nn.Module):
    def __init__(self, width=32, layers=3):
        super().__init__()
        self.ws = torch.nn.ParameterList(
            [torch.nn.Parameter(TwoTensor(torch.randn(width, width) / width, torch.randn(width, width) / width))
             for _ in range(layers)]
        )

    def forward(self, x):
        for w in self.ws:
            x = torch.relu(x @ w).sin()
        return x.sum()


def _executors(name):
    if name == "default":
        return None
    if name == "nvfuser":
        if not _nvfuser_available():
            pytest.skip("nvFuser is not installed for this torch (nvfuser_direct / nvfuser)")
        from thunder.executors.nvfuserex import nvfuserex

        return [nvfuserex]
    from thunder.executors.torch_compile import torch_compile_ex

    return [torch_compile_ex]


@pytest.mark.parametrize("executor", ["default", "nvfuser", "torch_compile"])
def test_twotensor_mlp_training_on_cuda(executor):
    with torch.device("cuda"):
        model = _TwoTensorMLP()
    eager = copy.deepcopy(model)
    jmodel = thunder_subclass.jit(model, executors=_executors(executor))
    x = _two(8, 32, requires_grad=False)
    for _ in range(2):
        out, eout = jmodel(x), eager(x)
        torch.testing.assert_close(out.a, eout.a)
        torch.testing.assert_close(out.b, eout.b)
        assert type(out) is TwoTensor
        out.backward()
        eout.backward()
    for p, ep in zip(model.parameters(), eager.parameters()):
        assert type(p.grad) is TwoTensor and p.grad.device.type == "cuda"
        torch.testing.assert_close(p.grad.a, ep.grad.a)
        torch.testing.assert_close(p.grad.b, ep.grad.b)
    assert thunder.cache_misses(jmodel) == 1
    fw, bw = thunder.last_traces(jmodel)[-1], thunder.last_backward_traces(jmodel)[-1]
    names = [b.sym.name for t in (fw, bw) for b in t.bound_symbols]
    if executor == "nvfuser":
        assert any(n.startswith("nvFusion") for n in names), names
    if executor == "torch_compile":
        assert any(n.startswith("TorchCompile") for n in names), names


@pytest.mark.parametrize("executor", ["default", "torch_compile"])
def test_torchao_float8_training_on_cuda(executor):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 matmuls need compute capability 8.9 or newer")
    from test_real_subclasses import float8_sgd_steps_match_eager

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    x, target = torch.randn(32, 64, device="cuda"), torch.randn(32, 32, device="cuda")
    jmodel = float8_sgd_steps_match_eager(model, x, target, executors=_executors(executor))
    fw = thunder.last_traces(jmodel)[-1]
    assert "_scaled_mm" in str(fw)  # the float8 GEMM runs as float8 on the GPU, inside the flattened program


def test_torchao_int8_weight_only_on_cuda():
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64)).eval()
    quantize_(model, Int8WeightOnlyConfig())
    weight_type = type(model[0].weight)
    jmodel = thunder_subclass.jit(model)
    x = torch.randn(4, 64, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(jmodel(x), model(x))
        torch.testing.assert_close(jmodel(x + 1), model(x + 1))
    assert thunder.cache_misses(jmodel) == 1 and thunder.cache_hits(jmodel) == 1
    assert type(model[0].weight) is weight_type  # the model's subclass weights are untouched


def test_cuda_graphs_transform_with_subclass_inputs():
    from thunder.transforms.cudagraph import CUDAGraphTransform

    def f(x, w):
        return torch.relu(x @ w) * 2

    x, w = _two(8, 16, requires_grad=False), _two(16, 16, requires_grad=False)
    jf = thunder_subclass.jit(f, transforms=[CUDAGraphTransform()])
    with torch.no_grad():
        for _ in range(3):  # replays of the captured graph must see the new input values
            x.a.normal_()
            x.b.normal_()
            out, expected = jf(x, w), f(x, w)
            assert type(out) is TwoTensor
            torch.testing.assert_close(out.a, expected.a)
            torch.testing.assert_close(out.b, expected.b)
    assert thunder.cache_misses(jf) == 1
    assert "CUDAGraph" in str(thunder.last_traces(jf)[-1])


def test_device_change_recompiles():
    def f(x):
        return (x * 2).cos()

    jf = thunder_subclass.jit(f)
    cpu = TwoTensor(torch.randn(4), torch.randn(4))
    gpu = TwoTensor(cpu.a.cuda(), cpu.b.cuda())
    out_cpu, out_gpu = jf(cpu), jf(gpu)
    assert out_cpu.device.type == "cpu" and out_gpu.device.type == "cuda"
    assert out_gpu.a.device.type == "cuda" and out_gpu.b.device.type == "cuda"
    torch.testing.assert_close(out_gpu.a.cpu(), out_cpu.a)
    torch.testing.assert_close(out_gpu.b.cpu(), out_cpu.b)
    assert thunder.cache_misses(jf) == 2
