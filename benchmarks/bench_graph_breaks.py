"""Programs that break the graph: thunder_subclass.jit's regions against torch.compile(backend="aot_eager")'s graphs.

For each model (tiny random-weight Hugging Face models built from configs, no download; torchao int8 weight-only
weights) it reports the compiled regions and graph breaks of ``thunder_subclass.jit`` (``compiled.graph_breaks``),
the graphs and breaks of ``torch.compile(backend="aot_eager")`` (``torch._dynamo.utils.counters``), the first-call
time and the steady-state time per call (median of ``--rounds`` rounds of ``--iters`` calls) of eager, both
compilers. Checks each against eager first.

    python benchmarks/bench_graph_breaks.py            # a few minutes on 2 CPU cores
    python benchmarks/bench_graph_breaks.py --models llama_dynamic_rope --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import thunder_subclass  # noqa: F401  (before thunder)
import torch
import transformers
import torchao.quantization as tq
from torch.testing._internal.two_tensor import TwoTensor


def llama_dynamic_rope():
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                      rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    tq.quantize_(model, tq.Int8WeightOnlyConfig())
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1))
    return model, (ids,), lambda out: out.logits


def _mixtral(experts_implementation):
    config = transformers.MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                        num_local_experts=4, num_experts_per_tok=2)
    if experts_implementation is not None:
        config._experts_implementation = experts_implementation
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config).eval()
    tq.quantize_(model, tq.Int8WeightOnlyConfig())
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1))
    return model, (ids,), lambda out: out.logits


def mixtral():  # transformers' default experts implementation (grouped_mm in 5.x)
    return _mixtral(None)


def mixtral_eager_experts():  # the per-expert loop (nonzero / torch.where routing)
    return _mixtral("eager")


def twotensor_item_branch():
    def f(x, w):
        y = x * w
        if y.sum().item() > 0:
            return y * 2
        return y - 1

    x = TwoTensor(torch.randn(64, 64), torch.randn(64, 64))
    return f, (x, torch.randn(64)), lambda out: torch.stack([out.a, out.b])


MODELS = {f.__name__: f for f in (llama_dynamic_rope, mixtral, mixtral_eager_experts, twotensor_item_branch)}


def _steady(fn, args, rounds, iters):
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(iters):
            fn(*args)
        times.append((time.perf_counter() - start) / iters)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=10)
    a = parser.parse_args()
    rows = []
    for name in a.models:
        model, args, value = MODELS[name]()
        with torch.no_grad():
            expected = value(model(*args))
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", thunder_subclass.GraphBreakWarning)
                ts = thunder_subclass.jit(model)
                torch.testing.assert_close(value(ts(*args)), expected)
            ts_first = time.perf_counter() - start
            report = ts.graph_breaks
            torch._dynamo.reset()
            torch._dynamo.utils.counters.clear()
            start = time.perf_counter()
            tc = torch.compile(model, backend="aot_eager")
            torch.testing.assert_close(value(tc(*args)), expected)
            tc_first = time.perf_counter() - start
            graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
            tc_breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
            row = dict(model=name, ts_regions=len(report.regions), ts_breaks=len(report.locations),
                       ts_eager_callables=len(report.breaks), aot_eager_graphs=graphs, aot_eager_breaks=tc_breaks,
                       ts_first_s=ts_first, aot_eager_first_s=tc_first,
                       eager_ms=1e3 * _steady(model, args, a.rounds, a.iters),
                       ts_ms=1e3 * _steady(ts, args, a.rounds, a.iters),
                       aot_eager_ms=1e3 * _steady(tc, args, a.rounds, a.iters))
        rows.append(row)
        print(row, flush=True)
        print(report, flush=True)
    print()
    print(f"{'model':24} {'ts regions':>10} {'ts breaks':>9} {'aot graphs':>10} {'aot breaks':>10} "
          f"{'eager ms':>9} {'ts ms':>8} {'aot ms':>8} {'ts 1st s':>8} {'aot 1st s':>9}")
    for r in rows:
        print(f"{r['model']:24} {r['ts_regions']:>10} {r['ts_breaks']:>9} {r['aot_eager_graphs']:>10} "
              f"{r['aot_eager_breaks']:>10} {r['eager_ms']:>9.2f} {r['ts_ms']:>8.2f} {r['aot_eager_ms']:>8.2f} "
              f"{r['ts_first_s']:>8.1f} {r['aot_eager_first_s']:>9.1f}")


if __name__ == "__main__":
    main()
