"""``python -m thunder_subclass.demo``: compile a small model holding tensor subclasses and check it against eager.

Inference: a model with a ``TwoTensor`` input and an int8 weight-only quantized linear layer whose weight is a
wrapper subclass (int8 data + per-row scale, presented as bfloat16). It prints the first trace (subclass proxies,
dispatch unrolled into subsymbols) and the final execution trace (plain operations only).

Training: one SGD step of a linear layer whose weight is a ``TwoTensor`` parameter; prints the backward trace.

Exits non-zero if a compiled result or gradient differs from eager's.
"""

from __future__ import annotations

import sys

import torch
from torch.testing._internal.two_tensor import TwoTensor
from torch.utils._pytree import tree_map

import thunder_subclass

aten = torch.ops.aten


class Int8Weight(torch.Tensor):
    """A minimal weight-only int8 subclass: ``t`` stays quantized, every other op dequantizes to float32."""

    @staticmethod
    def __new__(cls, data, scale, transposed=False):
        shape = data.shape[::-1] if transposed else data.shape
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=torch.bfloat16, device=data.device)

    def __init__(self, data, scale, transposed=False):
        self.data_int8, self.scale, self.transposed = data, scale, transposed

    def __tensor_flatten__(self):
        return ["data_int8", "scale"], self.transposed

    @staticmethod
    def __tensor_unflatten__(inner, transposed, outer_size, outer_stride):
        return Int8Weight(inner["data_int8"], inner["scale"], transposed)

    @classmethod
    def from_float(cls, w):
        scale = w.abs().amax(dim=1) / 127.0
        return cls(torch.round(w / scale[:, None]).to(torch.int8), scale)

    def dequantize(self):
        w = self.data_int8.to(torch.float32) * self.scale[:, None]
        return w.t() if self.transposed else w

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is aten.t.default:
            return Int8Weight(args[0].data_int8, args[0].scale, not args[0].transposed)
        if func is aten.detach.default:
            return Int8Weight(args[0].data_int8, args[0].scale, args[0].transposed)
        args, kwargs = tree_map(lambda a: a.dequantize() if isinstance(a, Int8Weight) else a, (args, kwargs or {}))
        return func(*args, **kwargs)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 4).requires_grad_(False)  # inference
        self.proj.weight = torch.nn.Parameter(Int8Weight.from_float(self.proj.weight.detach()), requires_grad=False)

    def forward(self, x: TwoTensor):
        h = (x * 2 + 1).sin()  # stays a TwoTensor
        return self.proj(h.a + h.b)  # plain float32 result of a bfloat16-looking quantized weight


def main() -> int:
    import thunder

    torch.manual_seed(0)
    model = Model().eval()
    x = TwoTensor(torch.randn(3, 8), torch.randn(3, 8))
    cmodel = thunder_subclass.jit(model)
    with torch.no_grad():
        expected = model(x)
        actual = cmodel(x)
    print("=== first trace (subclass proxies; __torch_dispatch__ unrolled into subsymbols) ===")
    print(thunder.last_traces(cmodel)[0])
    print("=== final execution trace (plain operations only) ===")
    print(thunder.last_traces(cmodel)[-1])
    try:
        torch.testing.assert_close(actual, expected)
    except AssertionError as e:
        print(f"FAIL: compiled result differs from eager:\n{e}")
        return 1
    print(f"OK: compiled output {type(actual).__name__} {actual.dtype} {tuple(actual.shape)} equals eager's")
    return train_step()


def train_step() -> int:
    import copy

    import thunder

    layer = torch.nn.Linear(8, 4)
    w = layer.weight.detach()
    layer.weight = torch.nn.Parameter(TwoTensor(w.clone(), w * 0.5))
    eager = copy.deepcopy(layer)
    clayer = thunder_subclass.jit(layer)
    x, target = torch.randn(3, 8), torch.randn(3, 4)
    losses = []
    for m in (clayer, eager):
        loss = torch.nn.functional.mse_loss(m(x), target)
        loss.backward()
        losses.append(loss)
    print("=== training: backward execution trace (plain operations; the TwoTensor gradient rebuilt at the end) ===")
    print(thunder.last_backward_traces(clayer)[-1])
    grad, expected = layer.weight.grad, eager.weight.grad
    try:
        assert type(grad) is type(expected) is TwoTensor, (type(grad), type(expected))
        torch.testing.assert_close(losses[0].a, losses[1].a)
        torch.testing.assert_close(grad.a, expected.a)
        torch.testing.assert_close(grad.b, expected.b)
    except AssertionError as e:
        print(f"FAIL: compiled training step differs from eager:\n{e}")
        return 1
    print("OK: loss and the TwoTensor weight gradient equal eager's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
