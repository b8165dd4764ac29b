"""Where the time of a cache hit goes: the small programs of ``bench_subclasses.py`` and a tiny Hugging Face Llama
decode-size forward (torchao int8 weight-only, 1 x 8 tokens, ``no_grad``).

    python benchmarks/profile_hit.py [--cases twotensor_linear,int8_linear_stack,hf] [--repeats 7] [--iters 200]
                                     [--configs ts,ts+inductor,inductor] [--profile] [--watch-ab] [--reads-ab]

Per case and configuration: the first call's time (trace and compile, in this process: inductor's caches may be
warm from an earlier case), and the median (over ``--repeats`` rounds, every configuration timed in turn in each round,
so that a shared machine's noise hits them alike) of the mean time per call of a loop of ``--iters`` calls, and its
ratio to inductor's. For the plugin's configurations it then splits one hit into its parts, each timed alone in a
loop on the same arguments: the per-call cache info (``populate_cache_info``), the entry's prologue (its guards:
tensor metadata, object reads, module and torch state), the computation and the epilogue; "wrappers" is the rest
(the plugin's and thunder's per-call path: the module's ``__call__``, the fast path, the entry index, statistics).
``--profile`` adds cProfile's top functions of the ``ts`` hit (by internal time). ``--watch-ab`` times instead, in
one process and in alternation, ``ts`` as it is against ``ts`` whose object guards compare in full on every call (the
checks before ``guards/watched.py``): the price of those comparisons on a hit. ``--reads-ab`` likewise times ``ts``
against ``ts`` whose prologue reads the module and checks what it read on every call (before
``guards/unpack_cache.py``), whole calls and the prologue alone.

Wall clock on a shared machine: compare the ratios of one run, not absolute numbers across runs.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.normpath(os.path.join(os.path.dirname(__file__), os.pardir)))
sys.path.insert(0, os.path.dirname(__file__))

import thunder_subclass  # noqa: E402  (before thunder)
import torch  # noqa: E402

thunder_subclass.config.disk_cache = False


def hf_case():
    import transformers
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    quantize_(model, Int8WeightOnlyConfig())
    ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(1))

    def run(fn):
        def step():
            with torch.no_grad():
                return fn(ids).logits
        return step

    return dict(model=model, run=run)


def cases(names):
    import bench_subclasses

    out = {}
    for name in names:
        out[name] = hf_case() if name == "hf" else bench_subclasses.CASES[name]("small")
    return out


CONFIGS = {
    "ts": lambda m: thunder_subclass.jit(m),
    "ts+inductor": lambda m: thunder_subclass.jit(m, executors=[thunder_subclass.inductor_ex]),
    "inductor": lambda m: torch.compile(m, backend="inductor"),
}


def per_call(fn, iters: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(iters):
        fn()
    return (time.perf_counter_ns() - start) / iters / 1e3  # us


class _Recorder:
    """Records the arguments a jit's last hit ran its entry with (wrapping the entry's functions once)."""

    def __init__(self, jfn):
        import thunder

        self.cs = thunder.compile_stats(jfn)
        self.cd = thunder.compile_data(jfn)

    def parts(self, step, iters):
        """Time the parts of a hit (us): cache info, prologue, computation, epilogue, each alone."""
        import thunder
        from thunder.core.compile_data import reset_compile_data_and_stats, set_compile_data_and_stats

        seen = {}
        entry = next(e for e in self.cs.interpreter_cache if e.prologue_fn is self.cs.last_prologue)
        pro, comp, epi = entry.prologue_fn, entry.computation_fn, entry.epilogue_fn

        def spy(name, f):
            def g(*a, **k):
                seen[name] = (a, k)
                seen["grad"] = torch.is_grad_enabled()
                return f(*a, **k)
            return g

        # (entries are named tuples: a copy with recording functions stands in for the entry during one call, in a
        # new list, which also makes the jit forget its entry order)
        spied = entry._replace(prologue_fn=spy("pro", pro), computation_fn=spy("comp", comp),
                               epilogue_fn=spy("epi", epi))
        entries = self.cs.interpreter_cache
        self.cs.interpreter_cache = [spied if e is entry else e for e in entries]
        try:
            step()
        finally:
            self.cs.interpreter_cache = list(entries)
        out = {}
        with torch.set_grad_enabled(seen["grad"]):  # the grad mode the call ran in (the cache info reads it)
            return self._time_parts(seen, pro, comp, epi, iters)

    def _time_parts(self, seen, pro, comp, epi, iters):
        import thunder
        from thunder.core.compile_data import reset_compile_data_and_stats, set_compile_data_and_stats
        from thunder_subclass._thunder_internals.runtime import _ViewAwareCacheInfo

        out = {}

        pa, pk = seen["pro"]  # the call's arguments
        populate = self.cd.populate_cache_info
        info = _ViewAwareCacheInfo(pa, pk)

        def run_populate():
            token = thunder._cache_info_ctx.set(_ViewAwareCacheInfo(pa, pk))
            try:
                populate(thunder._cache_info_ctx.get(), *pa, **pk)
            finally:
                thunder._cache_info_ctx.reset(token)

        out["cache info"] = per_call(run_populate, iters)
        populate(info, *pa, **pk)

        def run_prologue():
            token = thunder._cache_info_ctx.set(info)
            dtoken = set_compile_data_and_stats(self.cd, self.cs)
            try:
                pro(*pa, **pk)
            finally:
                reset_compile_data_and_stats(dtoken)
                thunder._cache_info_ctx.reset(token)

        out["prologue"] = per_call(run_prologue, iters)
        ca, _ = seen["comp"]
        if True:
            out["computation"] = per_call(lambda: comp(*ca), iters)
        ea, _ = seen["epi"]
        out["epilogue"] = per_call(lambda: epi(*ea), iters)
        return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="twotensor_linear,int8_linear_stack,hf")
    parser.add_argument("--configs", default="ts,ts+inductor,inductor")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--watch-ab", action="store_true")
    parser.add_argument("--reads-ab", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.watch_ab:
        return watch_ab(args)
    if args.reads_ab:
        return reads_ab(args)
    configs = args.configs.split(",")
    for case_name, case in cases(args.cases.split(",")).items():
        steps, jfns, firsts = {}, {}, {}
        for name in configs:
            torch._dynamo.reset()
            fn = CONFIGS[name](copy.deepcopy(case["model"]))
            steps[name] = case["run"](fn)
            jfns[name] = fn
            start = time.perf_counter()
            steps[name]()
            firsts[name] = time.perf_counter() - start
            for _ in range(4):
                steps[name]()
        samples = {name: [] for name in steps}
        for _ in range(args.repeats):
            for name, step in steps.items():
                samples[name].append(per_call(step, args.iters))
        med = {name: statistics.median(s) for name, s in samples.items()}
        print(f"\n== {case_name} (us per call, median of {args.repeats} x {args.iters}) ==")
        for name in configs:
            ratio = med[name] / med["inductor"] if "inductor" in med else float("nan")
            print(f"  {name:<12} {med[name]:9.1f}  / inductor {ratio:5.2f}   first call {firsts[name]:6.2f} s")
        for name in configs:
            if not name.startswith("ts"):
                continue
            parts = _Recorder(jfns[name]).parts(steps[name], args.iters)
            rest = med[name] - sum(parts.values())
            line = ", ".join(f"{k} {v:.1f}" for k, v in parts.items())
            print(f"  {name:<12} parts: {line}, wrappers {rest:.1f}  (prologue {parts['prologue'] / med[name]:.0%})")
        if args.profile and "ts" in steps:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.iters):
                steps["ts"]()
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
            print(buf.getvalue())


def watch_ab(args):
    """``ts`` with watched object guards against ``ts`` with every comparison run per call, side by side."""
    from thunder_subclass.guards import objects

    for case_name, case in cases(args.cases.split(",")).items():
        steps = {}
        for name in ("watched", "per call"):
            fn = thunder_subclass.jit(copy.deepcopy(case["model"]))
            step = case["run"](fn)
            watched = objects.watched
            if name == "per call":
                objects.watched = lambda check: check  # the prologue is built at the first call
            try:
                step()
            finally:
                objects.watched = watched
            for _ in range(4):
                step()
            steps[name] = step
        samples = {name: [] for name in steps}
        for _ in range(args.repeats):
            for name, step in steps.items():
                samples[name].append(per_call(step, args.iters))
        med = {name: statistics.median(s) for name, s in samples.items()}
        ratios = [a / b for a, b in zip(samples["watched"], samples["per call"])]
        print(f"{case_name}: watched {med['watched']:.1f} us, per call {med['per call']:.1f} us, "
              f"ratio {statistics.median(ratios):.3f} (median of {args.repeats} paired rounds)")


def reads_ab(args):
    """``ts`` with the module reads once per write (``guards/unpack_cache.py``) against ``ts`` whose prologue reads
    the module and checks what it read on every call (as before), side by side: whole calls and the prologue alone."""
    from thunder_subclass.guards import prologue

    for case_name, case in cases(args.cases.split(",")).items():
        steps, jfns = {}, {}
        for name in ("per write", "per call"):
            fn = thunder_subclass.jit(copy.deepcopy(case["model"]))
            step = case["run"](fn)
            reads = prologue._module_reads
            if name == "per call":
                prologue._module_reads = lambda trace: ([], {})  # the prologue is built at the first call
            try:
                step()
            finally:
                prologue._module_reads = reads
            for _ in range(4):
                step()
            steps[name], jfns[name] = step, fn
        samples = {name: [] for name in steps}
        pro = {name: [] for name in steps}
        for _ in range(args.repeats):
            for name, step in steps.items():
                samples[name].append(per_call(step, args.iters))
                pro[name].append(_Recorder(jfns[name]).parts(step, args.iters)["prologue"])
        med = {name: statistics.median(s) for name, s in samples.items()}
        pmed = {name: statistics.median(s) for name, s in pro.items()}
        ratios = [a / b for a, b in zip(samples["per write"], samples["per call"])]
        pratios = [a / b for a, b in zip(pro["per write"], pro["per call"])]
        print(f"{case_name}: call per write {med['per write']:.1f} us, per call {med['per call']:.1f} us, ratio "
              f"{statistics.median(ratios):.3f}; prologue per write {pmed['per write']:.1f} us, per call "
              f"{pmed['per call']:.1f} us, ratio {statistics.median(pratios):.3f} (median of {args.repeats} rounds)")


if __name__ == "__main__":
    main()
