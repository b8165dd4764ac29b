"""thunder_subclass.inductor_ex: fusion regions compiled by inductor without dynamo, compared with eager."""

import copy

import pytest
import torch
import thunder
from torch.testing._internal.two_tensor import TwoTensor

import thunder_subclass
from thunder_subclass.inductor_executor import InductorRegion


def _fusions(trace):
    return [b for b in trace.bound_symbols if b.sym.is_fusion]


def _regions(trace) -> list[InductorRegion]:
    return [v for b in _fusions(trace) for v in (b._call_ctx or {}).values() if isinstance(v, InductorRegion)]


class TwoTensorMLP(torch.nn.Module):
    def __init__(self, width=8, layers=3):
        super().__init__()
        self.weights = torch.nn.ParameterList(
            [torch.nn.Parameter(TwoTensor(torch.randn(width, width), torch.randn(width, width))) for _ in range(layers)]
        )

    def forward(self, x):
        for w in self.weights:
            x = torch.relu(x @ w)
        return x.sum()


def test_twotensor_mlp_training_one_inductor_region_per_direction():
    torch.manual_seed(0)
    model = TwoTensorMLP()
    jm = thunder_subclass.jit(copy.deepcopy(model), executors=[thunder_subclass.inductor_ex])
    x = TwoTensor(torch.randn(4, 8), torch.randn(4, 8))
    for step in range(2):
        out, expected = jm(x), model(x)
        assert type(out) is TwoTensor and out.requires_grad
        torch.testing.assert_close(out, expected)
        out.backward()
        expected.backward()
        for p, q in zip(jm.parameters(), model.parameters()):
            assert type(p.grad) is TwoTensor
            torch.testing.assert_close(p.grad, q.grad)
    assert thunder.cache_misses(jm) == 1 and thunder.cache_hits(jm) == 1
    fwd, bwd = thunder.last_traces(jm)[-1], thunder.last_backward_traces(jm)[-1]
    for trace in (fwd, bwd):
        (fusion,) = _fusions(trace)
        assert fusion.sym.name.startswith("Inductor")
        (region,) = _regions(trace)
        assert len(region.variants) == 1
    # the flattened matmuls and relus are inside the regions, not run by the torch executor
    for trace in (fwd, bwd):
        assert not [b for b in trace.bound_symbols if "matmul" in b.sym.name or "relu" in b.sym.name]


def test_inference_cache_hits_and_subclass_output():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    for lin in model:
        w = lin.weight.detach()
        lin.weight = torch.nn.Parameter(TwoTensor(w, 2 * w), requires_grad=False)
    model.requires_grad_(False)
    jm = thunder_subclass.jit(copy.deepcopy(model), executors=[thunder_subclass.inductor_ex])
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(3, 8)
            out, expected = jm(x), model(x)
            assert type(out) is TwoTensor
            torch.testing.assert_close(out.a, expected.a)
            torch.testing.assert_close(out.b, expected.b)
    assert thunder.cache_misses(jm) == 1 and thunder.cache_hits(jm) == 2
    assert [b.sym.name for b in _fusions(thunder.last_traces(jm)[-1])] == ["Inductor0"]
    assert len(_regions(thunder.last_traces(jm)[-1])) == 1


def test_inputs_with_other_strides_get_their_own_compiled_variant():
    # thunder's prologue checks the strides only of inputs a subclass's dispatch saw (tests/test_strides.py); b meets
    # plain operations only, and inductor's generated code checks its strides: a variant is made for them
    def f(x, w, b):
        return torch.relu(x @ w) * 2, b.relu() * 3

    jf = thunder_subclass.jit(f, executors=[thunder_subclass.inductor_ex])
    x = TwoTensor(torch.randn(4, 6), torch.randn(4, 6))
    w = torch.randn(6, 5)
    b, bt = torch.randn(6, 5), torch.randn(5, 6).t()  # same shape, transposed strides
    for plain in (b, bt, b, bt):
        torch.testing.assert_close(jf(x, w, plain), f(x, w, plain))
    assert thunder.cache_misses(jf) == 1
    (region,) = _regions(thunder.last_traces(jf)[-1])
    assert len(region.variants) == 2


def test_region_with_a_number_input_is_left_to_torch_compile():
    # symbolic values: n meets only a plain tensor, so it reaches the region as a number given per call; inductor
    # would bake it in as a constant, so that region goes to thunder's torch_compile executor (dynamo guards it)
    def f(x, y, n):
        return (x * 2).relu(), (y * n).relu()

    jf = thunder_subclass.jit(f, executors=[thunder_subclass.inductor_ex], cache="symbolic values")
    x, y = TwoTensor(torch.randn(4), torch.randn(4)), torch.randn(4)
    for n in (2, 3, -1):
        out, expected = jf(x, y, n), f(x, y, n)
        assert type(out[0]) is TwoTensor
        torch.testing.assert_close(out, expected)
    assert thunder.cache_misses(jf) == 1
    assert [b.sym.name for b in _fusions(thunder.last_traces(jf)[-1])] == ["TorchCompile0"]


def test_torchao_float8_training_scaled_mm_in_the_region():
    pytest.importorskip("torchao")
    from torchao.float8 import convert_to_float8_training

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32))
    convert_to_float8_training(model)
    jm = thunder_subclass.jit(copy.deepcopy(model), executors=[thunder_subclass.inductor_ex])
    x = torch.randn(16, 32)
    out, expected = jm(x).sum(), model(x).sum()
    torch.testing.assert_close(out, expected)
    out.backward()
    expected.backward()
    for p, q in zip(jm.parameters(), model.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    fwd = thunder.last_traces(jm)[-1]
    assert [b.sym.name for b in _fusions(fwd)] == ["Inductor0"] and len(_regions(fwd)) == 1
    # _scaled_mm runs inside the region as the opaque custom op that keeps its input layouts (pytorch#191138)
    region_ops = {s.sym.name for b in _fusions(fwd) for s in b.subsymbols}
    assert any(name.startswith("aten__scaled_mm") and name.endswith("_opaque") for name in region_ops), region_ops
