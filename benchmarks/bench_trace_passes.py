"""What the flatten pass's cleanups buy on a cache hit: each program compiled twice in one process, with
``transforms/redundant.py`` and ``transforms/int8_linear.py`` and without them (the passes replaced by the identity
before that jit traces), timed in alternation.

    python benchmarks/bench_trace_passes.py [--cases twotensor_mlp,float8_training_mlp,llama_bf16_int8]
                                            [--repeats 9] [--iters 50] [--kernel]

Cases: the small rows of ``bench_subclasses.py`` and ``llama_bf16_int8``, a tiny Hugging Face Llama (2 layers,
``--hidden``, default 256) in bfloat16 with torchao int8 weight-only weights, forward of 1 x 8 tokens under
``no_grad`` (the int8 claim's case: decode-sized bfloat16); ``llama_f32_int8`` the same in float32. Per case: the top-level operations of the last forward
(and backward) trace with and without, and the median time per call over ``--repeats`` rounds of ``--iters`` calls
each, both timed in every round. Wall clock on a shared machine: compare the ratio of one run.

``--kernel`` times instead, eagerly, the int8 weight-only linear as the chain eager runs it (dequantize, scale,
transpose, matmul) against ``torch._weight_int8pack_mm``, per activation dtype and size (best of five loops, us):
where the kernel is faster, which is what ``transforms/int8_linear.py``'s preconditions follow.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.normpath(os.path.join(os.path.dirname(__file__), os.pardir)))
sys.path.insert(0, os.path.dirname(__file__))

import thunder_subclass  # noqa: E402  (before thunder)
import thunder  # noqa: E402
import torch  # noqa: E402

thunder_subclass.config.disk_cache = False  # both variants trace here


def llama_case(hidden, dtype=torch.bfloat16):
    import transformers
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    config = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(dtype).eval()
    quantize_(model, Int8WeightOnlyConfig())
    ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(1))

    def run(fn):
        def step():
            with torch.no_grad():
                return fn(ids).logits
        return step

    return dict(model=model, run=run)


def compiled(case, passes: bool):
    from thunder_subclass.transforms import flatten

    saved = flatten.remove_redundant, flatten.claim_int8_weight_linears
    if not passes:
        flatten.remove_redundant = flatten.claim_int8_weight_linears = lambda bsyms: bsyms
    try:
        jf = thunder_subclass.jit(copy.deepcopy(case["model"]))
        step = case["run"](jf)
        step()  # traces now, with the passes as set
    finally:
        flatten.remove_redundant, flatten.claim_int8_weight_linears = saved
    return jf, step


def op_counts(jf) -> str:
    def count(traces):
        return sum(b.sym.name != "python_del" for b in traces[-1].bound_symbols) if traces else 0

    fw, bw = count(thunder.last_traces(jf)), count(thunder.last_backward_traces(jf))
    return f"{fw}" + (f" + {bw} backward" if bw else "")


def per_call(step, iters) -> float:
    start = time.perf_counter_ns()
    for _ in range(iters):
        step()
    return (time.perf_counter_ns() - start) / iters / 1e3


def kernel_table():
    def best(f, n):
        f()
        times = []
        for _ in range(5):
            start = time.perf_counter_ns()
            for _ in range(n):
                f()
            times.append((time.perf_counter_ns() - start) / n / 1e3)
        return min(times)

    print(f"{'dtype':>9} {'K x N':>11} " + " ".join(f"{'M=' + str(m):>15}" for m in (1, 8, 16, 64)) + "   (chain / kernel, us)")
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for k, n in ((64, 128), (1024, 1024)):
            cells = []
            for m in (1, 8, 16, 64):
                x = torch.randn(m, k).to(dtype)
                q = torch.randint(-127, 128, (n, k), dtype=torch.int8)
                scale = (torch.rand(n) / 127).to(dtype)
                iters = max(2, int(2e6 / (k * n)))
                chain = best(lambda: torch.matmul(x, torch.permute(q.to(dtype) * scale.unsqueeze(1), (1, 0))), iters)
                kernel = best(lambda: torch._weight_int8pack_mm(x, q, scale), iters)
                cells.append(f"{chain:7.0f}/{kernel:<7.0f}")
            print(f"{str(dtype).split('.')[-1]:>9} {f'{k}x{n}':>11} " + " ".join(cells))


def main(argv=None):
    import bench_subclasses

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="twotensor_mlp,float8_training_mlp,int8_linear_stack,llama_bf16_int8")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--kernel", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.kernel:
        return kernel_table()
    for name in args.cases.split(","):
        if name.startswith("llama_"):
            case = llama_case(args.hidden, torch.bfloat16 if name == "llama_bf16_int8" else torch.float32)
        else:
            case = bench_subclasses.CASES[name]("small")
        variants = {"with": compiled(case, True), "without": compiled(case, False)}
        steps = {k: v[1] for k, v in variants.items()}
        for step in steps.values():
            for _ in range(3):
                step()
        samples = {k: [] for k in steps}
        for _ in range(args.repeats):
            for k, step in steps.items():
                samples[k].append(per_call(step, args.iters))
        med = {k: statistics.median(v) for k, v in samples.items()}
        print(f"{name:22s} ops with {op_counts(variants['with'][0]):>18s}, without {op_counts(variants['without'][0]):>18s}"
              f" | us per call with {med['with']:8.1f}, without {med['without']:8.1f}, ratio {med['with'] / med['without']:.2f}")


if __name__ == "__main__":
    main()
