"""int8 weight-only linears claimed for ``torch._weight_int8pack_mm`` (issue 44, ``transforms/int8_linear.py``): where
the kernel's preconditions hold the trace runs one ``int8_weight_only_linear`` per linear, with results within
bfloat16 rounding of eager's; where they do not (float32, a per-input-channel scale, an intermediate used twice)
the chain stays as recorded; at run time, rows above ``MAX_ROWS`` and a strided scale run the recorded chain
(results identical to eager's)."""

import pytest
import thunder
import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_map

import thunder_subclass
from thunder_subclass.transforms import int8_linear

aten = torch.ops.aten


class WeightOnlyInt8(torch.Tensor):
    """int8 data ``(N, K)`` and a scale (``(N,)`` per output channel, or ``(K,)`` per input channel with
    ``per_input=True``), presented with the scale's dtype; every op dequantizes (``data.to(dtype) * scale``)."""

    @staticmethod
    def __new__(cls, data, scale, per_input=False):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=scale.dtype, device=data.device)

    def __init__(self, data, scale, per_input=False):
        self.data_int8, self.scale, self.per_input = data, scale, per_input

    def __tensor_flatten__(self):
        return ["data_int8", "scale"], self.per_input

    @staticmethod
    def __tensor_unflatten__(inner, per_input, outer_size, outer_stride):
        return WeightOnlyInt8(inner["data_int8"], inner["scale"], per_input)

    def dequantize(self):
        scale = self.scale[None, :] if self.per_input else self.scale[:, None]
        return self.data_int8.to(self.scale.dtype) * scale

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is aten.detach.default:
            return WeightOnlyInt8(args[0].data_int8, args[0].scale, args[0].per_input)
        args, kwargs = tree_map(lambda a: a.dequantize() if isinstance(a, WeightOnlyInt8) else a, (args, kwargs or {}))
        return func(*args, **kwargs)


def quantized(out_features, in_features, dtype=torch.bfloat16, per_input=False, seed=0):
    w = torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(seed))
    scale = w.abs().amax(dim=0 if per_input else 1) / 127.0
    data = torch.round(w / (scale[None, :] if per_input else scale[:, None])).to(torch.int8)
    return WeightOnlyInt8(data, scale.to(dtype), per_input)


def rows(m, k, dtype=torch.bfloat16, seed=1):
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(dtype)


def claimed(jf) -> int:
    """How many ``int8_weight_only_linear`` the last execution trace runs."""
    return sum(b.sym.name.startswith("int8_weight_only_linear") for b in thunder.last_traces(jf)[-1].bound_symbols)


def assert_bf16_close(actual, expected, reference):
    """bfloat16 results of the kernel against eager's: equal within bfloat16 rounding, and no further from the
    float64 ``reference`` than eager's."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, atol=2e-2, rtol=1.6e-2)
    err = (actual.double() - reference).norm() / reference.norm()
    eager_err = (expected.double() - reference).norm() / reference.norm()
    assert err <= 1.5 * eager_err + 1e-6, (err, eager_err)


def reference(x, w):
    return x.double() @ (w.data_int8.double() * w.scale.double()[:, None]).T


def linear(x, w):
    return F.linear(x, w)


def test_dequantize_then_matmul_is_one_kernel_call():
    w, x = quantized(64, 32), rows(4, 32)
    jf = thunder_subclass.jit(linear)
    with torch.no_grad():
        out, expected = jf(x, w), linear(x, w)
    assert claimed(jf) == 1
    names = {b.sym.name for b in thunder.last_traces(jf)[-1].bound_symbols}
    assert not names & {"matmul", "to", "mul", "permute", "unsqueeze"}, names
    assert_bf16_close(out, expected, reference(x, w))


def test_torchao_int8_weight_only_scales_the_output_in_one_kernel_call():
    pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128, bias=False), torch.nn.ReLU(),
                                torch.nn.Linear(128, 64, bias=False)).to(torch.bfloat16).eval()
    quantize_(model, Int8WeightOnlyConfig())
    x = rows(6, 64).reshape(2, 3, 64)
    jf = thunder_subclass.jit(model)
    with torch.no_grad():
        out, expected = jf(x), model(x)
    assert claimed(jf) == 2
    with torch.no_grad():
        h = x.double()
        for layer in model:
            h = h @ layer.weight.dequantize().double().T if isinstance(layer, torch.nn.Linear) else h.relu()
    assert_bf16_close(out, expected, h)


def run_claimed_and_not(f, claimed_args, other_args):
    """``f`` compiled and run on ``claimed_args`` (the kernel's preconditions hold: claimed once) and, in a new jit,
    on ``other_args`` (they do not): the second's results and trace, compared with eager's exactly."""
    jf = thunder_subclass.jit(f)
    with torch.no_grad():
        jf(*claimed_args)
    assert claimed(jf) == 1
    jf = thunder_subclass.jit(f)
    with torch.no_grad():
        out, expected = jf(*other_args), f(*other_args)
    assert claimed(jf) == 0
    for a, e in zip(tree_flatten_tensors(out), tree_flatten_tensors(expected)):
        torch.testing.assert_close(a, e, atol=0, rtol=0)  # the chain as recorded: eager's operations


def tree_flatten_tensors(x):
    return list(x) if isinstance(x, tuple) else [x]


def test_float32_activations_keep_the_chain():
    # the kernel's float32 path is a scalar loop, slower than the chain
    run_claimed_and_not(linear, (rows(4, 32), quantized(64, 32)),
                        (rows(4, 32, torch.float32), quantized(64, 32, torch.float32)))


def test_float16_activations_keep_the_chain():
    run_claimed_and_not(linear, (rows(4, 32), quantized(64, 32)),
                        (rows(4, 32, torch.float16), quantized(64, 32, torch.float16)))


def test_per_input_channel_scale_keeps_the_chain():
    run_claimed_and_not(linear, (rows(4, 32), quantized(64, 32)), (rows(4, 32), quantized(64, 32, per_input=True)))


def test_dequantized_weight_used_twice_keeps_the_chain():
    def f(x, w, also_return_weight):
        wd = w.data_int8.to(torch.bfloat16) * w.scale[:, None]  # the same chain written on the inner tensors
        return (x @ wd.T, wd) if also_return_weight else x @ wd.T

    w, x = quantized(64, 32), rows(4, 32)
    run_claimed_and_not(f, (x, w, False), (x, w, True))


def test_activation_gradients_keep_the_chain():
    # training through a frozen int8 weight: the dequantized weight is saved for the activation's gradient
    w = quantized(64, 32)
    jf = thunder_subclass.jit(linear)
    with torch.no_grad():
        jf(rows(4, 32), w)
    assert claimed(jf) == 1
    x = rows(4, 32).requires_grad_()
    x_eager = x.detach().clone().requires_grad_()
    jf = thunder_subclass.jit(linear)
    out, expected = jf(x, w), linear(x_eager, w)
    out.sum().backward()
    expected.sum().backward()
    assert claimed(jf) == 0
    torch.testing.assert_close(out, expected, atol=0, rtol=0)
    torch.testing.assert_close(x.grad, x_eager.grad, atol=0, rtol=0)


@pytest.mark.parametrize("m", [int8_linear.MAX_ROWS + 1, 32])
def test_more_rows_than_the_kernel_wins_at_run_the_recorded_chain(m):
    w, x = quantized(64, 32), rows(m, 32)
    jf = thunder_subclass.jit(linear)
    with torch.no_grad():
        out, expected = jf(x, w), linear(x, w)
    assert claimed(jf) == 1
    torch.testing.assert_close(out, expected, atol=0, rtol=0)  # the same operations as eager's


def test_strided_scale_runs_the_recorded_chain():
    # the kernel reads a strided scale as if it were contiguous (wrong values, no error): the chain runs instead
    w = quantized(64, 32)
    strided = torch.stack([w.scale, w.scale], dim=1)[:, 0]
    assert not strided.is_contiguous()
    w = WeightOnlyInt8(w.data_int8, strided)
    x = rows(4, 32)
    jf = thunder_subclass.jit(linear)
    with torch.no_grad():
        out, expected = jf(x, w), linear(x, w)
        assert claimed(jf) == 1
        torch.testing.assert_close(out, expected, atol=0, rtol=0)
        wrong = torch._weight_int8pack_mm(x, w.data_int8, strided)
    assert not torch.allclose(wrong, expected, atol=2e-2, rtol=1.6e-2)


def test_symbolic_sizes_keep_the_chain():
    # a symbolic entry's sizes are not known when traced (the kernel's shape preconditions cannot be checked then)
    w = quantized(64, 32)
    jf = thunder_subclass.jit(linear, cache="symbolic values")
    with torch.no_grad():
        for m in (3, 24):
            x = rows(m, 32, seed=m)
            out, expected = jf(x, w), linear(x, w)
            assert claimed(jf) == 0
            torch.testing.assert_close(out, expected, atol=0, rtol=0)
    assert thunder.cache_misses(jf) == 1


@pytest.mark.slow
def test_a_claimed_entry_is_loaded_by_a_second_process(tmp_path):
    pytest.importorskip("torchao")
    from test_disk_cache import _run

    first = _run(tmp_path, "int8_bf16_decode")["results"]["int8_bf16_decode"]["loaded"]
    second = _run(tmp_path, "int8_bf16_decode")["results"]["int8_bf16_decode"]["loaded"]
    assert first == {"loaded": False, "claimed": True}
    assert second == {"loaded": True, "claimed": True}  # values checked against eager in the runner
