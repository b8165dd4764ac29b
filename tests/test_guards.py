"""Prologue guards: cache hits for identical inputs, misses (with correct results) for any change (issue 2)."""

import thunder
import torch

import thunder_subclass
from subclasses import ScaledTensor, TwoTensor, quantize


def _f(t):
    return t * 2 + 1


def _two(a=None, b=None, dtype=torch.float32):
    return TwoTensor(torch.randn(3, 3, dtype=dtype) if a is None else a, torch.randn(3, 3, dtype=dtype) if b is None else b)


def test_identical_call_is_a_cache_hit():
    jf = thunder_subclass.jit(_f)
    x = _two()
    jf(x)
    out = jf(_two())
    assert (thunder.cache_misses(jf), thunder.cache_hits(jf)) == (1, 1)
    assert type(out) is TwoTensor


def test_prologue_checks_type_context_and_inner_tensors():
    jf = thunder_subclass.jit(_f)
    jf(_two())
    prologue = str(thunder.last_prologue_traces(jf)[0])  # before thunder_subclass.prologue fuses the checks
    # one check per subclass input covers type, context and the metadata of outer and inner tensors
    assert prologue.count("check_subclass(t, ") == 1
    assert "check_tensor_metadata(t," not in prologue and " = t.a" not in prologue
    spec = [b for b in thunder.last_prologue_traces(jf)[0].bound_symbols if b.sym.name == "check_subclass"][0].args[1]
    assert spec.meta == (torch.Size([3, 3]), torch.float32, torch.device("cpu"), False)
    assert spec.inner == {"a": spec.meta, "b": spec.meta}


def test_changed_inner_dtype_is_a_miss():
    jf = thunder_subclass.jit(_f)
    jf(_two())
    x64 = _two(dtype=torch.float64)
    out = jf(x64)
    assert thunder.cache_misses(jf) == 2
    assert out.a.dtype == torch.float64
    torch.testing.assert_close(out.a, x64.a * 2 + 1)


def test_changed_subclass_type_is_a_miss():
    jf = thunder_subclass.jit(_f)
    data = torch.randn(3, 3)
    jf(_two())
    out = jf(ScaledTensor(data, 0.5))
    assert thunder.cache_misses(jf) == 2
    assert type(out) is torch.Tensor  # ScaledTensor's add returns plain; mul folded into the factor
    torch.testing.assert_close(out, data * 1.0 + 1)
    plain = torch.randn(3, 3)
    out = jf(plain)
    assert thunder.cache_misses(jf) == 3 and type(out) is torch.Tensor
    torch.testing.assert_close(out, plain * 2 + 1)
    out = jf(_two())  # back to the first: a hit on the first entry
    assert thunder.cache_misses(jf) == 3 and type(out) is TwoTensor


def test_plain_tensor_first_then_subclass_is_a_miss():
    jf = thunder_subclass.jit(_f)
    jf(torch.randn(3, 3))
    x = _two()
    out = jf(x)
    assert thunder.cache_misses(jf) == 2 and type(out) is TwoTensor
    torch.testing.assert_close(out.b, x.b * 2 + 1)


def test_changed_context_value_is_a_miss_with_correct_result():
    jf = thunder_subclass.jit(lambda t: t + 1)
    data = torch.randn(4)
    torch.testing.assert_close(jf(ScaledTensor(data, 2.0)), data * 2.0 + 1)
    out = jf(ScaledTensor(data, 5.0))
    assert thunder.cache_misses(jf) == 2
    torch.testing.assert_close(out, data * 5.0 + 1)


def test_metadata_guard_ignores_what_the_class_says_does_not_matter():
    jf = thunder_subclass.jit(lambda t: t + 1)
    data = torch.randn(4)
    jf(ScaledTensor(data, 2.0, tag="a"))
    out = jf(ScaledTensor(data, 2.0, tag="b"))  # __metadata_guard__ compares the factor only
    assert (thunder.cache_misses(jf), thunder.cache_hits(jf)) == (1, 1)
    torch.testing.assert_close(out, data * 2.0 + 1)


def test_changed_context_flag_of_quantized_weight_is_a_miss():
    w = quantize(torch.randn(4, 4))
    x = torch.randn(2, 4)
    jf = thunder_subclass.jit(lambda x, w: x @ w)
    torch.testing.assert_close(jf(x, w), x @ w.dequantize())
    wt = w.t()  # same shapes (4x4), transposed flag in the context
    out = jf(x, wt)
    assert thunder.cache_misses(jf) == 2
    torch.testing.assert_close(out, x @ wt.dequantize())
