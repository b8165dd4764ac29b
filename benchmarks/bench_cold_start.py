"""Cold start: the first call of a compiled tiny Hugging Face Llama in a fresh process, against its depth.

    python benchmarks/bench_cold_start.py [--case int8-inference|float8-train|twotensor-train] [--layers 1 2 4 8]
                                          [--repeats 1] [--configs ts aot_eager ...]

The model: a random-weight ``LlamaForCausalLM`` (hidden 64, 4 heads, 2 key/value heads, vocabulary 256), one
intra-op thread, input (2, 16). ``int8-inference``: torchao ``Int8WeightOnlyConfig`` weights, called as users call it
(``model(input_ids)``, ``torch.no_grad()``). ``float8-train``: torchao's ``convert_to_float8_training`` linears, a
training step (``model(input_ids, labels=input_ids).loss.backward()``; loss and gradients compared with eager).
``twotensor-train``: not the Llama but a stack of ``layers`` x (``Linear(64, 64)`` with a ``TwoTensor`` weight,
GELU), input (16, 64): a training step whose compiled function returns a subclass (``out.sum().backward()``; the
output, its type and the gradients' types and values compared with eager). Every figure is the wall time of the first
call (trace + compile + run) in a new Python
process, after imports and model construction (with ``--repeats N``, the median of N rounds); two processes run one
after the other per configuration:

* ``ts``            ``thunder_subclass.jit(model)``, default settings (the on-disk cache on) and an empty cache
                    directory: trace, transforms and storing the entry;
* ``ts 2nd``        the same in a second process, which loads the entry the first stored (what a restarted job pays);
* ``aot_eager``     ``torch.compile(model, backend="aot_eager")``;
* ``inductor``      ``torch.compile(model, backend="inductor")`` with an empty inductor/FX-graph disk cache;
* ``inductor 2nd``  the same in a second process, the disk cache filled by the first.

Each process gets its own empty temporary directory as ``TORCHINDUCTOR_CACHE_DIR`` (the second inductor process
shares the first one's) and as ``THUNDER_SUBCLASS_CACHE_DIR``. The last column is each configuration's cost per
added decoder layer (least-squares slope over the layer counts); ``2nd/aot_eager`` is the restart's ratio (goal: at
most 0.25). Wall clock on a shared machine: compare the ratios
of one run, not absolute numbers across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), os.pardir))

_CHILD = r"""
import json, sys, time
layers, config, here, case = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
sys.path.insert(0, here)
from profile_first_call import build_llama  # the same tiny int8 Llama and input
import thunder_subclass, torch
torch.set_num_threads(1)
if case == "int8-inference":
    model, (ids,), logits = build_llama(layers)
    with torch.no_grad():
        expected = logits(model(ids))
        fn = thunder_subclass.jit(model) if config == "ts" else torch.compile(model, backend=config)
        start = time.perf_counter()
        out = fn(ids)
        first = time.perf_counter() - start
        torch.testing.assert_close(logits(out), expected)
elif case == "twotensor-train":  # a training step whose compiled function returns a subclass (TwoTensor)
    import copy
    from torch.testing._internal.two_tensor import TwoTensor
    torch.manual_seed(0)
    blocks = []
    for _ in range(layers):
        lin = torch.nn.Linear(64, 64)
        w = lin.weight.detach()
        lin.weight = torch.nn.Parameter(TwoTensor(w.clone(), w * 2))
        blocks += [lin, torch.nn.GELU()]
    model = torch.nn.Sequential(*blocks)
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(1))
    eager = copy.deepcopy(model)
    expected = eager(x)
    expected.sum().backward()
    fn = thunder_subclass.jit(model) if config == "ts" else torch.compile(model, backend=config)
    start = time.perf_counter()
    out = fn(x)
    out.sum().backward()
    first = time.perf_counter() - start
    assert type(out) is TwoTensor
    torch.testing.assert_close(out, expected)
    for p, q in zip(model.parameters(), eager.parameters()):
        assert type(p.grad) is type(q.grad)
        torch.testing.assert_close(p.grad, q.grad)
else:  # float8-train: a training step (forward with the loss, backward) of a tiny Llama with float8 linears
    import copy
    from torchao.float8 import convert_to_float8_training
    model, (ids,), _ = build_llama(layers, quantize=False)
    model.train()
    convert_to_float8_training(model)
    eager = copy.deepcopy(model)
    expected = eager(ids, labels=ids).loss
    expected.backward()
    fn = thunder_subclass.jit(model) if config == "ts" else torch.compile(model, backend=config)
    start = time.perf_counter()
    loss = fn(ids, labels=ids).loss
    loss.backward()
    first = time.perf_counter() - start
    torch.testing.assert_close(loss, expected)
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
stats = thunder_subclass.disk_cache_stats()
print("RESULT " + json.dumps({"first": first, "hits": stats["hits"], "stores": stats["stores"],
                             "why_not_storable": stats["why_not_storable"]}))
"""

CONFIGS = ("ts", "ts 2nd", "aot_eager", "inductor", "inductor 2nd")
CASES = ("int8-inference", "float8-train", "twotensor-train")


def _run(layers: int, backend: str, env: dict, case: str) -> float | str:
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(layers), backend, here, case], env=env,
                          capture_output=True, text=True, timeout=1800, cwd=ROOT)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
            if backend == "ts" and result["hits"] + result["stores"] != 1:  # neither loaded nor stored: say so
                sys.stderr.write(f"{backend} {case} {layers}: neither stored nor loaded: {result}\n")
                return "error: not stored"
            return result["first"]
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return f"error: {tail[:60]}"


def measure(layers: int, configs: tuple[str, ...], case: str) -> dict[str, float | str]:
    out = {}
    base = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    base.pop("THUNDER_SUBCLASS_DISK_CACHE", None)  # default settings: the disk cache is on
    with tempfile.TemporaryDirectory() as ts_dir, tempfile.TemporaryDirectory() as ind_dir, \
            tempfile.TemporaryDirectory() as other_dir:
        for config in configs:
            backend = config.split()[0]
            cache = ind_dir if backend == "inductor" else other_dir
            env = dict(base, TORCHINDUCTOR_CACHE_DIR=cache, THUNDER_SUBCLASS_CACHE_DIR=ts_dir)
            out[config] = _run(layers, backend, env, case)
    return out


def _median(values: list) -> float | str:
    times = sorted(v for v in values if isinstance(v, float))
    if not times:
        return values[0]
    mid = len(times) // 2
    return times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2


def _slope(xs, ys) -> float:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--case", choices=CASES, default=CASES[0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--repeats", type=int, default=1,
                        help="rounds over all layer counts and configurations; each cell is the median")
    args = parser.parse_args()
    configs = tuple(c for c in CONFIGS if c in args.configs)
    rounds = [{layers: measure(layers, configs, args.case) for layers in args.layers}
              for _ in range(max(1, args.repeats))]
    rows = {layers: {c: _median([r[layers][c] for r in rounds]) for c in configs} for layers in args.layers}
    if args.repeats > 1:
        print(f"median of {args.repeats} rounds (layer counts and configurations interleaved in each round)")
    width = 14
    what = {"int8-inference": "tiny int8 Llama, no grad",
            "float8-train": "tiny Llama, float8 training step: forward with loss, backward",
            "twotensor-train": "TwoTensor MLP (layers x Linear(64, 64) + GELU), training step returning a TwoTensor: "
                               "forward, .sum().backward()"}[args.case]
    shape = "(16, 64)" if args.case == "twotensor-train" else "(2, 16)"
    print(f"first call in a fresh process, seconds ({what}, input {shape}, 1 thread, default settings)")
    print("layers".ljust(8) + "".join(c.rjust(width) for c in configs) + "ts/aot_eager".rjust(width)
          + "2nd/aot_eager".rjust(width))
    for layers, row in rows.items():
        cells = [f"{row[c]:.2f}" if isinstance(row[c], float) else row[c][:width - 1] for c in configs]
        ratio = (f"{row['ts'] / row['aot_eager']:.2f}" if isinstance(row.get("ts"), float)
                 and isinstance(row.get("aot_eager"), float) else "-")
        restart = (f"{row['ts 2nd'] / row['aot_eager']:.3f}" if isinstance(row.get("ts 2nd"), float)
                   and isinstance(row.get("aot_eager"), float) else "-")
        print(str(layers).ljust(8) + "".join(c.rjust(width) for c in cells) + ratio.rjust(width)
              + restart.rjust(width))
    if len(rows) > 1:
        slopes = []
        for c in configs:
            pts = [(n, row[c]) for n, row in rows.items() if isinstance(row[c], float)]
            slopes.append(f"{_slope(*zip(*pts)):.2f}" if len(pts) > 1 else "-")
        print("per layer".ljust(8) + "".join(s.rjust(width) for s in slopes))


if __name__ == "__main__":
    main()
