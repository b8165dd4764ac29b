"""Cost of a cache hit against the number of cache entries of one ``thunder_subclass.jit`` function.

One function is called with N input shapes (N cache entries, the cache bound raised to N), then the hit on the newest
entry and the hit on the oldest are timed (median of ``--repeat`` rounds of ``--calls`` calls each). Before the
lazily built failure messages and the entry index, a hit on the oldest of 100 entries cost about 30 ms against 0.04 ms
for the newest: every entry that rejected the call built its error message. After: messages are built at misses only,
and the entries are searched by the kind of call they accepted first (0.04-0.06 ms for both, N = 1, 10, 100).

    python benchmarks/bench_cache.py                 # N = 1, 10, 100
    python benchmarks/bench_cache.py --entries 8 200 --subclass
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time

import torch

import thunder_subclass
from torch.testing._internal.two_tensor import TwoTensor
thunder_subclass.config.disk_cache = False  # first calls here trace (restarts: bench_cold_start.py)


def _jit(fn, limit: int):
    if "cache_size_limit" in inspect.signature(thunder_subclass.jit).parameters:
        return thunder_subclass.jit(fn, cache_size_limit=limit, dynamic=False)  # a trace per size
    return thunder_subclass.jit(fn)  # a version without a cache bound (for the "before" numbers)


def _time_hit(jf, x, calls: int, repeat: int) -> float:
    rounds = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            jf(x)
        rounds.append((time.perf_counter() - start) / calls)
    return statistics.median(rounds)


def measure(entries: int, subclass: bool, calls: int, repeat: int) -> tuple[float, float, int]:
    import thunder

    jf = _jit(lambda t: t * 2 + 1, entries)
    inputs = []
    for n in range(1, entries + 1):
        a = torch.randn(n, 4)
        inputs.append(TwoTensor(a, a.clone()) if subclass else a)
        jf(inputs[-1])
    n_entries = len(thunder.compile_stats(jf).interpreter_cache)
    newest = _time_hit(jf, inputs[-1], calls, repeat)
    oldest = _time_hit(jf, inputs[0], calls, repeat)
    return newest, oldest, n_entries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--subclass", action="store_true", help="TwoTensor inputs instead of plain tensors")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    kind = "TwoTensor" if args.subclass else "plain tensor"
    print(f"hit cost of `t * 2 + 1` ({kind} input) against the number of cache entries (median of {args.repeat} "
          f"rounds of {args.calls} calls)")
    print(f"{'entries':>8} {'cached':>7} {'newest ms':>10} {'oldest ms':>10}")
    for n in args.entries:
        newest, oldest, cached = measure(n, args.subclass, args.calls, args.repeat)
        print(f"{n:>8} {cached:>7} {newest * 1e3:>10.3f} {oldest * 1e3:>10.3f}")


if __name__ == "__main__":
    main()
