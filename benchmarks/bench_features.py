"""What the plugin's newer features cost per call, each against the same program without the feature.

    python benchmarks/bench_features.py [--quick]

Steady state (cache hits), one intra-op thread, median over rounds in which every configuration of a row is timed in
turn; prints one table of ratios (time / the row's baseline). Rows:

* ``speculation``: ``y = x * 2 if x.sum() > 0 else x - 1`` on a large tensor (2**22 floats). ``ts`` traces the branch
  it took and re-runs the speculated slice (``x.sum() > 0``) in the prologue on every call (``thunder_subclass.
  speculation``); baseline: the same program without the branch (``x * 2``) under ``ts``; also shown: speculation off
  (``config.speculation_limit = 0``: the branch is a graph break) and eager.
* ``eager call``: a mixture-of-experts layer whose expert loop skips the experts no token was routed to (a
  data-dependent ``nonzero``): under ``ts`` the model traces as one program around one eager call of the MoE block
  (``thunder_subclass.runtime.eager_calls``); baseline: eager PyTorch; also shown: eager calls off (the lookaside
  disabled for the benchmark: the parent breaks too, each child a region).
* ``automatic dynamic``: a small MLP called with a batch size it has not seen: after one size change the default
  (``dynamic=None``) traces with symbolic sizes (``thunder_subclass.runtime.cache_policy.AutomaticDynamicShapes``);
  baseline: ``dynamic=False``, a constant-size trace of the same program for that size.

Wall clock on a shared machine: compare the ratios of one run. The disk cache is off here (first calls trace).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
import warnings

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.normpath(os.path.join(os.path.dirname(__file__), os.pardir)))

import torch  # noqa: E402

import thunder_subclass  # noqa: E402  (before thunder)
import thunder  # noqa: E402
from thunder_subclass.runtime import eager_calls  # noqa: E402

torch.set_num_threads(1)
thunder_subclass.config.disk_cache = False


def _time(fn, iters: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def _rounds(configs: dict, iters: int, rounds: int) -> dict:
    times = {name: [] for name in configs}
    for _ in range(rounds):
        for name, fn in configs.items():
            times[name].append(_time(fn, iters))
    return {name: statistics.median(ts) for name, ts in times.items()}


@contextlib.contextmanager
def _speculation_limit(n):
    saved = thunder_subclass.config.speculation_limit
    thunder_subclass.config.speculation_limit = n
    try:
        yield
    finally:
        thunder_subclass.config.speculation_limit = saved


def speculation_row(quick: bool) -> tuple[str, str, dict]:
    x = torch.randn(2**20 if quick else 2**22)

    def branchy(t):
        return t * 2 if t.sum() > 0 else t - 1

    def straight(t):
        return t * 2

    x = x.abs()  # the branch taken: t * 2
    ts, base = thunder_subclass.jit(branchy), thunder_subclass.jit(straight)
    with _speculation_limit(0):
        off = thunder_subclass.jit(branchy)
        off(x)  # the value is not speculated (the limit is read when a value would be)
    for f in (ts, base, off):
        torch.testing.assert_close(f(x), x * 2)
    assert not ts.graph_breaks.breaks and off.graph_breaks.breaks  # speculated / broken, as the row says
    configs = {"ts (speculated)": lambda: ts(x), "ts, no branch": lambda: base(x),
               "speculation off": lambda: off(x), "eager": lambda: branchy(x)}
    return "speculation", "ts, no branch", _rounds(configs, 20 if quick else 50, 5 if quick else 9)


class _Experts(torch.nn.Module):
    def __init__(self, width: int, n: int):
        super().__init__()
        self.experts = torch.nn.ModuleList([torch.nn.Linear(width, width) for _ in range(n)])

    def forward(self, x, probs):
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            idx = (probs[:, e] > 0.3).nonzero().squeeze(-1)
            if idx.numel() == 0:
                continue
            out[idx] = out[idx] + expert(x[idx]) * probs[idx, e, None]
        return out


class _MoEBlock(torch.nn.Module):
    def __init__(self, width: int = 32, n: int = 4):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.router = torch.nn.Linear(width, n)
        self.moe = _Experts(width, n)
        self.out = torch.nn.Linear(width, width)

    def forward(self, x):
        h = self.norm(x)
        probs = self.router(h).softmax(-1)
        return self.out(x + self.moe(h, probs)).relu()


def eager_call_row(quick: bool) -> tuple[str, str, dict]:
    torch.manual_seed(0)
    model = _MoEBlock().eval()
    x = torch.randn(16, 32)
    with torch.no_grad():
        expected = model(x)
        ts = thunder_subclass.jit(model)
        for _ in range(3):  # the break, then the eager call recorded
            ts(x)
        original = eager_calls.lookaside
        eager_calls.lookaside = lambda fn, wrapped_args: None
        try:
            off = thunder_subclass.jit(model)
            for _ in range(3):
                off(x)
        finally:
            eager_calls.lookaside = original
        for f in (ts, off):
            torch.testing.assert_close(f(x), expected)
        # one region around the eager call (the whole model, path ""), or, with eager calls off, regions below it
        assert "" in ts.graph_breaks.regions and "" not in off.graph_breaks.regions
        configs = {"ts (eager call)": lambda: ts(x), "eager calls off": lambda: off(x), "eager": lambda: model(x)}
        return "eager call (MoE)", "eager", _rounds(configs, 50 if quick else 200, 5 if quick else 9)


def automatic_dynamic_row(quick: bool) -> tuple[str, str, dict]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16)).eval()
    x = torch.randn(5, 16)
    with torch.no_grad():
        auto = thunder_subclass.jit(model)
        for n in (3, 4):  # a size change: the next trace has symbolic sizes
            auto(torch.randn(n, 16))
        const = thunder_subclass.jit(model, dynamic=False)
        for f in (auto, const):
            torch.testing.assert_close(f(x), model(x))
        assert thunder.cache_misses(auto) == 2  # batch 5: the symbolic entry traced at batch 4, no new trace
        configs = {"ts (symbolic entry)": lambda: auto(x), "dynamic=False": lambda: const(x),
                   "eager": lambda: model(x)}
        return "automatic dynamic", "dynamic=False", _rounds(configs, 200 if quick else 1000, 5 if quick else 9)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller tensors and fewer iterations")
    args = parser.parse_args(argv)
    print("feature cost per call (steady state, 1 thread): time in us, and time / the row's baseline")
    for row in (speculation_row, eager_call_row, automatic_dynamic_row):
        name, baseline, times = row(args.quick)
        cells = "  ".join(f"{k} {v * 1e6:,.0f} us ({v / times[baseline]:.2f}x)" for k, v in times.items())
        print(f"{name:<20} baseline {baseline!r}: {cells}")


if __name__ == "__main__":
    main()
