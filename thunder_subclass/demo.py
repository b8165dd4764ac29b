"""``python -m thunder_subclass.demo [--traces]``: compile a small model holding tensor subclasses, compare with eager.

Inference: a model with a ``TwoTensor`` input and an int8 weight-only quantized linear layer whose weight is a
wrapper subclass (int8 data + per-row scale, presented as bfloat16), called twice (the second call reuses the trace).
Training: one SGD step of a linear layer whose weight is a ``TwoTensor`` parameter (forward and backward compiled, the
update in eager under ``no_grad``).

Prints a short verdict: for each result, whether it equals eager's (type and values) with the largest absolute
difference, the number of cache misses and traces, and how to see the traces. ``--traces`` also prints the first
and final traces. Exits non-zero if any compiled result differs from eager's.
"""

from __future__ import annotations

import argparse
import copy
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
    """Inference: ``(x * 2 + 1).sin()`` on a ``TwoTensor`` input, then a linear layer with an :class:`Int8Weight`."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 4).requires_grad_(False)
        self.proj.weight = torch.nn.Parameter(Int8Weight.from_float(self.proj.weight.detach()), requires_grad=False)

    def forward(self, x: TwoTensor):
        h = (x * 2 + 1).sin()  # stays a TwoTensor
        return self.proj(h.a + h.b)  # plain float32 result of a bfloat16-looking quantized weight


def _max_abs_diff(actual, expected) -> float:
    """Largest absolute difference between two results, over the inner tensors of ``TwoTensor`` values."""
    if isinstance(expected, TwoTensor):
        return max(_max_abs_diff(actual.a, expected.a), _max_abs_diff(actual.b, expected.b))
    try:
        return (actual.detach().double() - expected.detach().double()).abs().max().item()
    except RuntimeError:  # shapes that do not broadcast
        return float("nan")


def _close(actual, expected) -> bool:
    """``torch.testing.assert_close`` per inner tensor (on a ``TwoTensor`` it would compare only ``.a``)."""
    if isinstance(expected, TwoTensor):
        return type(actual) is TwoTensor and _close(actual.a, expected.a) and _close(actual.b, expected.b)
    try:
        torch.testing.assert_close(actual, expected)
    except AssertionError:
        return False
    return True


def _compare(name: str, actual, expected) -> bool:
    """Print one line: ``name`` equals eager's (type and values) or not, with the largest absolute difference."""
    same_type = type(actual) is type(expected)
    close = same_type and _close(actual, expected)
    diff = _max_abs_diff(actual, expected) if same_type else float("nan")
    verdict = "equal to eager" if same_type and close else "DIFFERS from eager"
    kind = type(actual).__name__ if same_type else f"{type(actual).__name__} (eager: {type(expected).__name__})"
    print(f"  {name + ':':<24} {kind:<10} {verdict} (max abs difference {diff:.3g})")
    return same_type and close


def _trace_counts(cfn, backward: bool = False) -> str:
    import thunder

    def n(count: int, what: str) -> str:
        return f"{count} {what}" + ("" if count == 1 else "es" if what.endswith("s") else "s")

    counts = f"{n(thunder.cache_misses(cfn), 'cache miss')}, {n(thunder.cache_hits(cfn), 'cache hit')}; "
    counts += n(len(thunder.last_traces(cfn)), "forward trace")
    if backward:
        counts += ", " + n(len(thunder.last_backward_traces(cfn)), "backward trace")
    return counts + " (first to final)"


def inference(show_traces: bool) -> bool:
    import thunder

    print("inference: (x * 2 + 1).sin() on a TwoTensor input x, then Linear(8, 4) whose weight is an int8 subclass")
    model = Model().eval()
    cmodel = thunder_subclass.jit(model)
    ok = True
    with torch.no_grad():
        for call in (1, 2):  # the second call, with a new input of the same kind, reuses the first call's trace
            x = TwoTensor(torch.randn(3, 8), torch.randn(3, 8))
            ok &= _compare(f"output (call {call})", cmodel(x), model(x))
    print(f"  {_trace_counts(cmodel)}")
    if show_traces:
        _print_trace("inference: first trace (subclass proxies; __torch_dispatch__ unrolled into subsymbols)",
                     thunder.last_traces(cmodel)[0])
        _print_trace("inference: final execution trace (plain operations only)", thunder.last_traces(cmodel)[-1])
    return ok


def training_step(show_traces: bool) -> bool:
    import thunder

    print("training: one SGD step of Linear(8, 4) whose weight is a TwoTensor parameter "
          "(forward and backward compiled, the update in eager)")
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
        with torch.no_grad():
            for p in m.parameters():
                p -= 0.1 * p.grad
        losses.append(loss.detach())
    ok = _compare("loss", *losses)
    ok &= _compare("weight gradient", layer.weight.grad, eager.weight.grad)
    ok &= _compare("bias gradient", layer.bias.grad, eager.bias.grad)
    ok &= _compare("weight after the step", layer.weight.detach(), eager.weight.detach())
    print(f"  {_trace_counts(clayer, backward=True)}")
    if show_traces:
        _print_trace("training: first trace", thunder.last_traces(clayer)[0])
        _print_trace("training: final forward execution trace", thunder.last_traces(clayer)[-1])
        _print_trace("training: final backward execution trace (the TwoTensor gradient rebuilt at the end)",
                     thunder.last_backward_traces(clayer)[-1])
    return ok


def _print_trace(title: str, trace) -> None:
    print(f"\n=== {title} ===\n{trace}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m thunder_subclass.demo",
        description="Compile a small model holding tensor subclasses with thunder_subclass and compare it with eager.",
    )
    parser.add_argument("--traces", action="store_true", help="also print the first and final traces")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    print(f"thunder_subclass demo (torch {torch.__version__}, lightning-thunder {_thunder_version()})")
    ok = inference(args.traces)
    ok &= training_step(args.traces)
    print("OK: every compiled result equals eager's" if ok else "FAIL: a compiled result differs from eager's")
    if not args.traces:
        print("To see the traces: python -m thunder_subclass.demo --traces; in your code, thunder.last_traces(cfn)[0]\n"
              "(first), thunder.last_traces(cfn)[-1] (final) and thunder.last_backward_traces(cfn)[-1] (backward).")
    return 0 if ok else 1


def _thunder_version() -> str:
    from importlib.metadata import version

    return version("lightning-thunder")


if __name__ == "__main__":
    sys.exit(main())
