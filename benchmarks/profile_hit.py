"""Where the time of a cache hit goes: the small programs of ``bench_subclasses.py`` and a tiny Hugging Face Llama
decode-size forward (torchao int8 weight-only, 1 x 8 tokens, ``no_grad``).

    python benchmarks/profile_hit.py [--cases twotensor_linear,int8_linear_stack,hf] [--repeats 7] [--iters 200]
                                     [--configs ts,ts+inductor,inductor] [--profile] [--watch-ab] [--reads-ab]
                                     [--threads 1]

Per case and configuration: the first call's time (trace and compile, in this process: inductor's caches may be
warm from an earlier case), and the median (over ``--repeats`` rounds, every configuration timed in turn in each round,
so that a shared machine's noise hits them alike) of the mean time per call of a loop of ``--iters`` calls, and its
ratio to inductor's. For the plugin's configurations it then splits a hit into its parts, timed where they run (a
loop of ``--iters`` calls in which the entry's prologue, computation and epilogue add up their own time): the entry's
prologue (its guards: tensor metadata, object reads, module and torch state), the computation and the epilogue; the
per-call cache info (``populate_cache_info``) is timed alone on the same arguments; "wrappers" is the rest of that
loop's time per call (the plugin's and thunder's per-call path: the module's ``__call__``, the fast path, the entry
index, statistics; the recording adds ~1 us). Parts timed alone in loops of their own, as before, read faster than in
a call (their data stays in cache) and left that difference in "wrappers". Timings run with ``--threads`` intra-op
threads (default 1: importing ``bench_subclasses`` sets one per core, which on a shared 2-core machine made each
kernel wait for a second thread).
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
    """Splits a jit's hit into its parts, timed where they run: the entry the last hit ran is replaced (in a new list
    of entries, so that the jit forgets its entry order) by a copy whose prologue, computation and epilogue add their
    time to counters, for a loop of calls; the cache info is timed alone on the same arguments."""

    def __init__(self, jfn):
        import thunder

        self.cs = thunder.compile_stats(jfn)
        self.cd = thunder.compile_data(jfn)

    def parts(self, step, iters):
        """(total, parts) in us per call: the in-situ loop's time per call, and its cache info (timed alone),
        prologue, computation and epilogue (timed in the loop)."""
        from thunder_subclass._thunder_internals.runtime import _PLAIN_FNS_ATTR, _undecorated

        entry = next(e for e in self.cs.interpreter_cache if e.prologue_fn is self.cs.last_prologue)
        clock = time.perf_counter_ns
        acc = {"prologue": 0, "computation": 0, "epilogue": 0}
        seen = {}

        def spy(name, f):
            def g(*a, **k):
                seen.setdefault(name, (a, k))
                seen.setdefault("grad", torch.is_grad_enabled())
                start = clock()
                try:
                    return f(*a, **k)
                finally:
                    acc[name] += clock() - start
            return g

        comp = spy("computation", entry.computation_fn)
        # the fast path runs an entry without a backward undecorated (runtime.fast_call_path)
        plain = (_undecorated(entry.computation_fn), _undecorated(entry.epilogue_fn))
        setattr(comp, _PLAIN_FNS_ATTR, (spy("computation", plain[0]), spy("epilogue", plain[1]),
                                        plain[0] is not entry.computation_fn and plain[1] is not entry.epilogue_fn))
        spied = entry._replace(prologue_fn=spy("prologue", entry.prologue_fn), computation_fn=comp,
                               epilogue_fn=spy("epilogue", entry.epilogue_fn))
        entries = self.cs.interpreter_cache
        self.cs.interpreter_cache = [spied if e is entry else e for e in entries]
        try:
            for _ in range(4):
                step()
            for name in acc:
                acc[name] = 0
            total = per_call(step, iters)
        finally:
            self.cs.interpreter_cache = list(entries)
        out = {"cache info": self._cache_info(seen, iters)}
        out.update({name: ns / iters / 1e3 for name, ns in acc.items()})
        return total, out

    def _cache_info(self, seen, iters):
        import thunder

        from thunder_subclass._thunder_internals.runtime import _ViewAwareCacheInfo

        pa, pk = seen["prologue"]  # the call's arguments
        populate = self.cd.populate_cache_info

        def run_populate():
            token = thunder._cache_info_ctx.set(_ViewAwareCacheInfo(pa, pk))
            try:
                populate(thunder._cache_info_ctx.get(), *pa, **pk)
            finally:
                thunder._cache_info_ctx.reset(token)

        with torch.set_grad_enabled(seen["grad"]):  # the grad mode the call ran in (the cache info reads it)
            return per_call(run_populate, iters)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="twotensor_linear,int8_linear_stack,hf")
    parser.add_argument("--configs", default="ts,ts+inductor,inductor")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--watch-ab", action="store_true")
    parser.add_argument("--reads-ab", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads (default 1)")
    args = parser.parse_args(argv)
    if args.watch_ab:
        return watch_ab(args)
    if args.reads_ab:
        return reads_ab(args)
    configs = args.configs.split(",")
    all_cases = cases(args.cases.split(","))
    torch.set_num_threads(args.threads)  # after the cases: importing bench_subclasses sets one thread per core
    for case_name, case in all_cases.items():
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
            total, parts = _Recorder(jfns[name]).parts(steps[name], args.iters)
            rest = total - sum(parts.values())
            line = ", ".join(f"{k} {v:.1f}" for k, v in parts.items())
            print(f"  {name:<12} parts of {total:.1f}: {line}, wrappers {rest:.1f}  "
                  f"(prologue {parts['prologue'] / total:.0%})")
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

    all_cases = cases(args.cases.split(","))
    torch.set_num_threads(args.threads)
    for case_name, case in all_cases.items():
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
