"""Where a first call's time goes: interpretation, transforms, callable generation, first run.

    python benchmarks/profile_first_call.py [--model llama|twotensor] [--layers 2] [--grad] [--cprofile N]

Compiles a fresh model with ``thunder_subclass.jit`` and times, within its first call, thunder's interpreter
(``thunder_general_jit``: Python interpreted, subclass ops unrolled on fakes), the generation of Python callables from
the final traces (``TraceCtx.python_callable``: source printed, ``exec``-ed), and the rest of the trace-building
(thunder's and the plugin's transforms: autograd, flatten, executors, the fused prologue). The first run of the built
callables is estimated by the second call. ``--cprofile N`` also prints the N functions with the most cumulative time.
Models: a tiny Hugging Face Llama with torchao int8 weight-only weights (no grad, as ``bench_hf.py``), or a two-layer MLP
with ``TwoTensor`` weights (``--grad``: a training step, forward and backward).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

_t0 = time.perf_counter()
sys.path.insert(0, os.path.normpath(os.path.join(os.path.dirname(__file__), os.pardir)))

import thunder_subclass  # noqa: E402  (before thunder)
import thunder  # noqa: E402
import torch  # noqa: E402

IMPORT_S = time.perf_counter() - _t0


def build_llama(layers: int, quantize: bool = True):
    """The tiny Llama (with torchao int8 weight-only weights unless ``quantize=False``), its input, and what to compare
    of its output."""
    import transformers
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    if quantize:
        quantize_(model, Int8WeightOnlyConfig())
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    return model, (ids,), lambda out: out.logits


def build_twotensor(layers: int):
    from torch.testing._internal.two_tensor import TwoTensor

    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        lin = torch.nn.Linear(8, 8)
        lin.weight = torch.nn.Parameter(TwoTensor(lin.weight.detach().clone(), lin.weight.detach().clone()))
        mods += [lin, torch.nn.ReLU()]
    return torch.nn.Sequential(*mods), (torch.randn(4, 8),), lambda out: out


class _Timer:
    def __init__(self):
        self.total = 0.0
        self.depth = 0

    def wrap(self, fn):
        def timed(*args, **kwargs):
            self.depth += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth -= 1
                if self.depth == 0:
                    self.total += time.perf_counter() - start
        return timed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    thunder_subclass.config.disk_cache = False  # the first call traces (a restart's load: bench_cold_start.py)
    parser.add_argument("--model", choices=("llama", "twotensor"), default="llama")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--grad", action="store_true")
    parser.add_argument("--cprofile", type=int, default=0)
    args = parser.parse_args()

    t = time.perf_counter()
    model, inputs, out_of = (build_llama if args.model == "llama" else build_twotensor)(args.layers)
    build_s = time.perf_counter() - t

    from thunder.core.trace import TraceCtx

    interp, codegen = _Timer(), _Timer()
    thunder.thunder_general_jit = interp.wrap(thunder.thunder_general_jit)
    TraceCtx.python_callable = codegen.wrap(TraceCtx.python_callable)

    jm = thunder_subclass.jit(model)
    ctx = torch.enable_grad() if args.grad else torch.no_grad()
    profiler = None
    if args.cprofile:
        import cProfile

        profiler = cProfile.Profile()
    with ctx:
        t = time.perf_counter()
        if profiler:
            profiler.enable()
        out = out_of(jm(*inputs))
        if args.grad:
            out.sum().backward()
        if profiler:
            profiler.disable()
        first = time.perf_counter() - t
        t = time.perf_counter()
        out2 = out_of(jm(*inputs))
        if args.grad:
            out2.sum().backward()
        second = time.perf_counter() - t
    rest = first - interp.total - codegen.total - second
    print(f"{args.model} ({args.layers} layers, {'training step' if args.grad else 'no_grad'}), "
          f"torch {torch.__version__}")
    print(f"import thunder_subclass: {IMPORT_S:.2f} s, build model: {build_s:.2f} s")
    print(f"{'first call':<44} {first:8.3f} s  100%")
    for name, v in [("interpretation (thunder_general_jit)", interp.total),
                    ("transforms (autograd, flatten, executors, ...)", rest),
                    ("callable generation (python_callable)", codegen.total),
                    ("run (estimated: the second call)", second)]:
        print(f"  {name:<42} {v:8.3f} s  {100 * v / first:4.0f}%")
    if profiler:
        import pstats

        pstats.Stats(profiler).sort_stats("cumulative").print_stats(args.cprofile)


if __name__ == "__main__":
    main()
