"""First-call and steady-state time of a Hugging Face Llama with torchao int8 weight-only weights, forward only.

    python benchmarks/bench_hf.py [--layers 2] [--hidden 64] [--seq 16] [--rounds 5]

Configurations, each called as users call the model (``model(input_ids)`` at default arguments, no grad):

* ``eager``      the quantized model in eager PyTorch (torchao's ``__torch_function__`` / ``__torch_dispatch__`` in
                 Python on every linear);
* ``ts``         ``thunder_subclass.jit(model)`` with thunder's default executors;
* ``ts+inductor`` ``thunder_subclass.jit(model, executors=[thunder_subclass.inductor_ex])`` (fusion regions compiled
                 by inductor without dynamo);
* ``aot_eager``  ``torch.compile(model, backend="aot_eager")``;
* ``inductor``   ``torch.compile(model, backend="inductor")``.

First call: the first call of a fresh compile (trace + transforms + first run; once per configuration). Steady
state: the median over ``--rounds`` rounds, in which every configuration is timed in turn, of the mean time of a
loop of calls. Prints a table with the ratio of each time to ``ts``'s. Wall clock on a shared machine: compare the
ratios of one run, not absolute numbers across runs. A configuration that fails prints its error in the table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.normpath(os.path.join(os.path.dirname(__file__), os.pardir)))

import thunder_subclass  # noqa: E402  (before thunder)
import torch  # noqa: E402
import transformers  # noqa: E402
from torchao.quantization import Int8WeightOnlyConfig, quantize_  # noqa: E402
thunder_subclass.config.disk_cache = False  # first calls here trace (restarts: bench_cold_start.py)


def build(args):
    config = transformers.LlamaConfig(hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                                      num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                                      vocab_size=256)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    quantize_(model, Int8WeightOnlyConfig())
    return model


def compilers():
    return {
        "eager": lambda m: m,
        "ts": thunder_subclass.jit,
        "ts+inductor": lambda m: thunder_subclass.jit(m, executors=[thunder_subclass.inductor_ex]),
        "aot_eager": lambda m: torch.compile(m, backend="aot_eager"),
        "inductor": lambda m: torch.compile(m, backend="inductor"),
    }


def loop_time(fn, ids, iters: int) -> float:
    start = time.perf_counter()
    for _ in range(iters):
        fn(ids)
    return (time.perf_counter() - start) / iters


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()

    model = build(args)
    ids = torch.randint(0, 256, (2, args.seq), generator=torch.Generator().manual_seed(1))
    first, steady, errors, compiled = {}, {}, {}, {}
    with torch.no_grad():
        expected = model(ids).logits
        for name, compile_fn in compilers().items():
            try:
                fn = compile_fn(model)
                start = time.perf_counter()
                logits = fn(ids).logits
                first[name] = time.perf_counter() - start
                torch.testing.assert_close(logits, expected)
                compiled[name] = lambda x, fn=fn: fn(x).logits
            except Exception as e:  # reported in the table
                errors[name] = f"{type(e).__name__}: {e}".splitlines()[0][:100]
        for fn in compiled.values():  # warm-up
            loop_time(fn, ids, 2)
        rounds = {name: [] for name in compiled}
        for _ in range(args.rounds):
            for name, fn in compiled.items():
                rounds[name].append(loop_time(fn, ids, args.iters))
        steady = {name: statistics.median(times) for name, times in rounds.items()}

    print(f"int8 weight-only Llama ({args.layers} layers, hidden {args.hidden}, input 2x{args.seq}), "
          f"torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"{'config':<11} {'first call (s)':>15} {'/ ts':>7} {'steady (ms)':>12} {'/ ts':>7}")
    for name in compilers():
        if name in errors:
            print(f"{name:<11} FAILED {errors[name]}")
            continue
        f_ratio = first[name] / first["ts"] if "ts" in first else float("nan")
        s_ratio = steady[name] / steady["ts"] if "ts" in steady else float("nan")
        print(f"{name:<11} {first[name]:>15.2f} {f_ratio:>7.2f} {steady[name] * 1e3:>12.2f} {s_ratio:>7.2f}")


if __name__ == "__main__":
    main()
