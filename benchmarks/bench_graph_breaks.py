"""Programs that break the graph: thunder_subclass.jit's regions against torch.compile(backend="aot_eager")'s graphs.

For each model (tiny random-weight Hugging Face models built from configs, no download; torchao int8 weight-only
weights for inference, torchao float8 training on the model's nn.Linear modules for the ``_train`` rows, whose call
is a forward with ``labels=`` and ``loss.backward()``) it reports the compiled regions and graph breaks of
``thunder_subclass.jit`` (``compiled.graph_breaks``: region names, distinct compiled functions and their traces,
region calls per call, all after the second call: from then on a submodule whose own code breaks is one eager call
in its parent's compiled trace), the graphs and breaks of ``torch.compile(backend="aot_eager")``
(``torch._dynamo.utils.counters``; graph calls per call counted by a backend wrapping aot_eager), the first-call
time (and the second call's for thunder_subclass, which traces the parents of the eager calls) and the steady-state
time per call (median of ``--rounds`` rounds of ``--iters`` calls) of eager, both
compilers. Checks each against eager first (values; loss and gradients for the ``_train`` rows).

    python benchmarks/bench_graph_breaks.py            # a few minutes on 2 CPU cores
    python benchmarks/bench_graph_breaks.py --models llama_dynamic_rope --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import thunder_subclass  # noqa: F401  (before thunder)
import thunder
import torch
import transformers
import torchao.quantization as tq
from torchao.float8 import convert_to_float8_training
from torch.testing._internal.two_tensor import TwoTensor
thunder_subclass.config.disk_cache = False  # first calls here trace (restarts: bench_cold_start.py)


def llama_dynamic_rope():
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                      rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    tq.quantize_(model, tq.Int8WeightOnlyConfig())
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1))
    return model, (ids,), lambda out: out.logits


def _mixtral(experts_implementation, train=False):
    config = transformers.MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                        num_local_experts=4, num_experts_per_tok=2)
    if experts_implementation is not None:
        config._experts_implementation = experts_implementation
    torch.manual_seed(0)
    return _prepared(transformers.MixtralForCausalLM(config), train)


def _prepared(model, train):
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1))
    if train:  # the routed experts are fused 3-D parameters in transformers 5.x: float8 reaches the nn.Linear modules
        convert_to_float8_training(model.train(), module_filter_fn=lambda m, fqn: min(m.weight.shape) % 16 == 0)
        return model, (ids,), "train"
    tq.quantize_(model.eval(), tq.Int8WeightOnlyConfig())
    return model, (ids,), lambda out: out.logits


def mixtral():  # transformers' default experts implementation (grouped_mm in 5.x)
    return _mixtral(None)


def mixtral_eager_experts():  # the per-expert loop (nonzero / torch.where routing)
    return _mixtral("eager")


def mixtral_eager_experts_train():
    return _mixtral("eager", train=True)


def _qwen2_moe(train=False):
    config = transformers.Qwen2MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=64,
                                         shared_expert_intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=256, num_experts=4,
                                         num_experts_per_tok=2)
    config._experts_implementation = "eager"
    torch.manual_seed(0)
    return _prepared(transformers.Qwen2MoeForCausalLM(config), train)


def qwen2_moe_eager_experts():
    return _qwen2_moe()


def qwen2_moe_eager_experts_train():
    return _qwen2_moe(train=True)


def twotensor_item_branch():
    def f(x, w):
        y = x * w
        if y.sum().item() > 0:
            return y * 2
        return y - 1

    x = TwoTensor(torch.randn(64, 64), torch.randn(64, 64))
    return f, (x, torch.randn(64)), lambda out: torch.stack([out.a, out.b])


MODELS = {f.__name__: f for f in (llama_dynamic_rope, mixtral, mixtral_eager_experts, qwen2_moe_eager_experts,
                                   mixtral_eager_experts_train, qwen2_moe_eager_experts_train, twotensor_item_branch)}


def _training_step(model, fn):
    """A call of a ``_train`` row: forward with labels, backward; returns the loss and the gradients."""
    def step(ids):
        model.zero_grad()
        loss = fn(ids, labels=ids).loss
        loss.backward()
        return [loss] + [p.grad for p in model.parameters() if p.grad is not None]
    return step


def _counting_aot_eager(calls):
    aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def backend(gm, example_inputs):
        compiled = aot_eager(gm, example_inputs)

        def run(*args):
            calls[0] += 1
            return compiled(*args)
        return run
    return backend


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
    parser.add_argument("--threads", type=int, default=1)
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    rows = []
    for name in a.models:
        model, args, value = MODELS[name]()
        train = value == "train"
        if train:
            value = lambda out: out  # noqa: E731  (the step returns the loss and the gradients)
        wrap = (lambda fn: _training_step(model, fn)) if train else (lambda fn: fn)
        with torch.set_grad_enabled(train):
            eager = wrap(model)
            expected = value(eager(*args))
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", thunder_subclass.GraphBreakWarning)
                ts_model = thunder_subclass.jit(model)
                ts = wrap(ts_model)
                torch.testing.assert_close(value(ts(*args)), expected)
            ts_first = time.perf_counter() - start
            start = time.perf_counter()  # the second call traces the parents of an eager call again (eager_calls.py)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", thunder_subclass.GraphBreakWarning)
                torch.testing.assert_close(value(ts(*args)), expected)
            ts_second = time.perf_counter() - start
            report = ts_model.graph_breaks  # of the second call: what every later call runs
            functions = report.compiled_functions
            ts_traces = sum(thunder.cache_misses(f) for f in functions)
            torch._dynamo.reset()
            torch._dynamo.utils.counters.clear()
            calls = [0]
            start = time.perf_counter()
            tc = wrap(torch.compile(model, backend=_counting_aot_eager(calls)))
            torch.testing.assert_close(value(tc(*args)), expected)
            tc_first = time.perf_counter() - start
            calls[0] = 0
            tc(*args)
            graph_calls = calls[0]
            graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
            tc_breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
            row = dict(model=name, ts_regions=len(report.regions), ts_functions=len(functions), ts_traces=ts_traces,
                       ts_region_calls=report.region_calls, ts_breaks=len(report.locations),
                       ts_eager_callables=len(report.breaks), aot_eager_graphs=graphs, aot_eager_breaks=tc_breaks,
                       aot_eager_graph_calls=graph_calls, ts_first_s=ts_first, ts_second_s=ts_second,
                       aot_eager_first_s=tc_first,
                       eager_ms=1e3 * _steady(eager, args, a.rounds, a.iters),
                       ts_ms=1e3 * _steady(ts, args, a.rounds, a.iters),
                       aot_eager_ms=1e3 * _steady(tc, args, a.rounds, a.iters))
        rows.append(row)
        print(row, flush=True)
        print(report, flush=True)
    print()
    print(f"{'model':30} {'ts regions':>10} {'ts fns/traces':>13} {'ts calls':>8} {'ts breaks':>9} "
          f"{'aot graphs':>10} {'aot calls':>9} {'aot breaks':>10} {'eager ms':>9} {'ts ms':>8} {'aot ms':>8} "
          f"{'ts/aot':>6} {'ts 1st s':>8} {'ts 2nd s':>8} {'aot 1st s':>9}")
    for r in rows:
        print(f"{r['model']:30} {r['ts_regions']:>10} {str(r['ts_functions']) + '/' + str(r['ts_traces']):>13} "
              f"{r['ts_region_calls']:>8} {r['ts_breaks']:>9} {r['aot_eager_graphs']:>10} "
              f"{r['aot_eager_graph_calls']:>9} {r['aot_eager_breaks']:>10} {r['eager_ms']:>9.2f} {r['ts_ms']:>8.2f} "
              f"{r['aot_eager_ms']:>8.2f} {r['ts_ms'] / r['aot_eager_ms']:>6.2f} {r['ts_first_s']:>8.1f} "
              f"{r['ts_second_s']:>8.1f} "
              f"{r['aot_eager_first_s']:>9.1f}")

if __name__ == "__main__":
    main()
