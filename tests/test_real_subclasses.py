"""Real subclasses, unmodified: torchao (float8 training, quantize_ configs, NF4 + LoRA) and DTensor (issue 6)."""

import copy

import pytest
import thunder
import torch
import torch.nn.functional as F

import thunder_subclass

torchao = pytest.importorskip("torchao", reason="torchao is not installed (the `test` extra installs it)")


def _mlp(d_in=32, d_hidden=64, d_out=16):
    return torch.nn.Sequential(torch.nn.Linear(d_in, d_hidden), torch.nn.ReLU(), torch.nn.Linear(d_hidden, d_out))


def float8_sgd_steps_match_eager(model, x, target, executors=None, steps=3):
    """Convert ``model`` to torchao float8 training, then take ``steps`` SGD steps with it compiled and with an eager
    copy: losses, gradients and the updated parameters equal eager's. Returns the compiled model."""
    from torchao.float8 import convert_to_float8_training

    convert_to_float8_training(model)
    eager = copy.deepcopy(model)
    jmodel = thunder_subclass.jit(model, executors=executors)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    eopt = torch.optim.SGD(eager.parameters(), lr=0.05)
    for _ in range(steps):
        loss, eloss = F.mse_loss(jmodel(x), target), F.mse_loss(eager(x), target)
        torch.testing.assert_close(loss, eloss)
        opt.zero_grad()
        eopt.zero_grad()
        loss.backward()
        eloss.backward()
        for p, ep in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, ep.grad)
        opt.step()
        eopt.step()
    for p, ep in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p, ep)
    return jmodel


@pytest.mark.parametrize("executor", ["default", "torch_compile"])
def test_torchao_float8_training_three_steps(executor):
    from thunder.executors.torch_compile import torch_compile_ex

    x, target = torch.randn(16, 32), torch.randn(16, 16)
    jmodel = float8_sgd_steps_match_eager(_mlp(), x, target,
                                          executors=[torch_compile_ex] if executor == "torch_compile" else None)
    fw = thunder.last_traces(jmodel)[-1]
    bw = thunder.last_backward_traces(jmodel)[-1]
    fw_names, bw_names = ([b.sym.name for b in t.bound_symbols] for t in (fw, bw))
    assert "matmul_with_hp_or_float8_args_apply" in str(thunder.last_traces(jmodel)[0])
    if executor == "default":
        # the float8 GEMMs, flattened: Float8TrainingTensor exists only inside the traced autograd.Function
        assert fw_names.count("aten__scaled_mm_default") == 2
        # (the backward's GEMMs get the gradient contiguous where the recorded fake was: test_backward_layouts.py)
        assert any(n.startswith("aten__scaled_mm_default") for n in bw_names)
    else:
        # issue 7: one torch_compile region per direction, the GEMMs inside it as opaque custom-op calls
        for names, trace in ((fw_names, fw), (bw_names, bw)):
            assert sum(n.startswith("TorchCompile") for n in names) == 1, names
            assert not any(n.startswith("aten__scaled_mm_default") for n in names)
            assert "_opaque" in str(trace) and "aten__scaled_mm_default" in str(trace)


# the weight's type per config: torchao >= 0.17 first; torchao 0.16 (the release for torch 2.10) gives the int8
# configs' older tensors, AffineQuantizedTensor and LinearActivationQuantizedTensor (wrapping an AffineQuantizedTensor)
@pytest.mark.parametrize(
    "config_name, tensor_types",
    [
        ("Int8WeightOnlyConfig", ("Int8Tensor", "AffineQuantizedTensor")),
        ("Int8DynamicActivationInt8WeightConfig", ("Int8Tensor", "LinearActivationQuantizedTensor")),
        ("IntxWeightOnlyConfig", ("IntxUnpackedToInt8Tensor",)),
        ("Float8WeightOnlyConfig", ("Float8Tensor",)),
    ],
)
def test_torchao_quantize_inference(config_name, tensor_types):
    import torchao.quantization as tq

    model = _mlp(64, 32, 16).eval()
    tq.quantize_(model, getattr(tq, config_name)())
    tensor_type = type(model[0].weight).__name__
    assert tensor_type in tensor_types
    x = torch.randn(8, 64)
    with torch.no_grad():
        expected = model(x)
        jmodel = thunder_subclass.jit(model)
        torch.testing.assert_close(jmodel(x), expected)
    assert f"{tensor_type}[" in str(thunder.last_traces(jmodel)[0])  # the weight is a subclass proxy


class _TwoBiasedLinears(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 32)
        self.b = torch.nn.Linear(64, 32)

    def forward(self, x):
        return self.a(x) * self.b(x)


@pytest.mark.parametrize("config_name", ["Int8WeightOnlyConfig", "Int8DynamicActivationInt8WeightConfig"])
def test_torchao_linear_with_bias_leaves_its_input_unchanged(config_name):
    # torchao's int8 linear ends with `y += bias` on a value it made: the op is not in place on its input, so the
    # second linear reads x (it read the first linear's output: a shape error)
    import torchao.quantization as tq

    torch.manual_seed(0)
    model = _TwoBiasedLinears()
    tq.quantize_(model, getattr(tq, config_name)())
    x = torch.randn(2, 3, 64)
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(thunder_subclass.jit(model)(x), expected)


def _nf4():
    """torchao's NF4 module: ``quantize_.workflows.nf4.nf4_tensor`` (torchao 0.18), ``dtypes.nf4tensor`` (0.16)."""
    try:
        from torchao.quantization.quantize_.workflows.nf4 import nf4_tensor
    except ImportError:
        from torchao.dtypes import nf4tensor as nf4_tensor
    return nf4_tensor


class LoRALinear(torch.nn.Module):
    def __init__(self, weight, rank=4):
        super().__init__()
        self.weight = torch.nn.Parameter(_nf4().to_nf4(weight), requires_grad=False)
        self.lora_a = torch.nn.Parameter(torch.randn(rank, weight.shape[1], dtype=weight.dtype) * 0.1)
        self.lora_b = torch.nn.Parameter(torch.randn(weight.shape[0], rank, dtype=weight.dtype) * 0.1)

    def forward(self, x):
        return _nf4().linear_nf4(x, self.weight) + (x @ self.lora_a.t()) @ self.lora_b.t()


def test_torchao_nf4_base_weight_with_lora_adapters():
    weight = torch.randn(256, 128, dtype=torch.bfloat16)
    model, eager = LoRALinear(weight), LoRALinear(weight)  # NF4Tensor does not support deepcopy
    eager.load_state_dict({"lora_a": model.lora_a.detach(), "lora_b": model.lora_b.detach()}, strict=False)
    x = torch.randn(4, 128, dtype=torch.bfloat16)
    out, expected = thunder_subclass.jit(model)(x), eager(x)
    torch.testing.assert_close(out, expected)
    out.float().pow(2).sum().backward()
    expected.float().pow(2).sum().backward()
    torch.testing.assert_close(model.lora_a.grad, eager.lora_a.grad)
    torch.testing.assert_close(model.lora_b.grad, eager.lora_b.grad)
    assert model.weight.grad is None


def test_dtensor_parameters_forward_and_backward(mesh):
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    w1, w2, x = torch.randn(16, 8), torch.randn(4, 16), torch.randn(3, 8)

    def params():
        return (
            torch.nn.Parameter(distribute_tensor(w1.clone(), mesh, [Replicate()])),
            torch.nn.Parameter(distribute_tensor(w2.clone(), mesh, [Shard(0)])),
        )

    def f(x, a, b):
        return F.linear(torch.relu(F.linear(x, a)), b).sum()

    dx = distribute_tensor(x, mesh, [Replicate()])
    (a, b), (ea, eb) = params(), params()
    jf = thunder_subclass.jit(f)
    out, expected = jf(dx, a, b), f(dx, ea, eb)
    assert type(out) is DTensor and out.placements == expected.placements
    torch.testing.assert_close(out.to_local(), expected.to_local())
    out.backward()
    expected.backward()
    for p, ep in ((a, ea), (b, eb)):
        assert type(p.grad) is DTensor and p.grad.placements == ep.grad.placements
        assert p.grad.device_mesh is mesh  # the mesh is passed through, not copied or baked
        torch.testing.assert_close(p.grad.to_local(), ep.grad.to_local())
    if "device_mesh" in dx.__tensor_flatten__()[0]:  # torch >= 2.12: the mesh is an opaque attribute
        assert "device_mesh: opaque DeviceMesh" in str(thunder.last_traces(jf)[0])
    else:  # torch 2.10, 2.11: the mesh is in DTensor's flatten context (its DTensorSpec)
        assert "device_mesh: opaque DeviceMesh" not in str(thunder.last_traces(jf)[0])


def test_dtensor_forward_traced_again_after_autograd_keeps_its_backward(mesh, monkeypatch):
    # issue 17: DTensor's flatten context holds requires_grad, which differs between interpretation (a relu output
    # does not require grad there) and autodiff; the flatten pass then records the linear again for its current
    # arguments. Its grad_linear must be recorded again from the new forward (it referred to the old forward's
    # intermediates, undefined in the backward: UnboundLocalError).
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    from thunder_subclass.transforms import flatten

    retraced = []
    original = flatten.Flattener._retrace

    def counting(self, bsym, nb):
        retraced.append((bsym.sym.name, flatten.grad_recipe_of(bsym) is not None))
        return original(self, bsym, nb)

    monkeypatch.setattr(flatten.Flattener, "_retrace", counting)

    def f(x, w):
        d = DTensor.from_local(torch.relu(x), mesh, [Replicate()])
        return F.layer_norm(F.linear(d, w), (4,)).to_local().sum()

    w0 = torch.randn(4, 8)
    x = torch.randn(3, 8, requires_grad=True)
    ex = x.detach().clone().requires_grad_()
    w, ew = (torch.nn.Parameter(distribute_tensor(w0.clone(), mesh, [Replicate()])) for _ in range(2))
    out, expected = thunder_subclass.jit(f)(x, w), f(ex, ew)
    out.backward()
    expected.backward()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x.grad, ex.grad)
    torch.testing.assert_close(w.grad.to_local(), ew.grad.to_local())
    # since intermediates get eager's requires_grad while tracing, the linear is usually recorded right the first
    # time; when it is recorded again, it is with its recipe
    assert all(has_recipe for name, has_recipe in retraced if name == "linear")


def test_dtensor_api_in_user_code_single_process(mesh):
    # issue 17 (the 2-process versions are in test_distributed.py): DTensor.from_local / redistribute / to_local
    # are container symbols, a placement read in user code (DTensor._spec, a __slots__ attribute) and a pybind11
    # placement class constructed in traced code behave as in eager
    from torch.distributed.tensor import DTensor, Replicate, Shard

    def f(x):
        d = DTensor.from_local(x, mesh, [Shard(0)])
        if d.placements[0].is_shard():
            d = d.redistribute(mesh, [Replicate()])
        return d.to_local() * d.device_mesh.size() + 1

    x = torch.randn(4, 3, requires_grad=True)
    ex = x.detach().clone().requires_grad_()
    jf = thunder_subclass.jit(f)
    out, expected = jf(x), f(ex)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(x.grad, ex.grad)
    names = {b.sym.name for b in thunder.last_traces(jf)[0].bound_symbols}
    assert {"DTensor_from_local", "DTensor_redistribute", "DTensor_to_local"} <= names, names
