"""First-call time of a fresh process with an empty disk cache against a second process that loads from it.

    python benchmarks/bench_cold_start_disk.py [--layers 1 2 4 8] [--model llama|twotensor] [--no-aot-eager]

Each cell is one fresh Python process that builds the model, compiles it and times its first call (no grad; the
import of torch / thunder_subclass and the model's construction are not counted, and are printed apart):

* ``ts cold``     ``thunder_subclass.jit`` with the disk cache on and an empty cache directory (trace, transforms,
                  store);
* ``ts disk``     the same again in a new process: the entry is loaded from the directory the first process filled;
* ``ts off``      the disk cache off (what a restart costs without it);
* ``aot_eager``   ``torch.compile(backend="aot_eager")``, the reference the issue names.

Model: a tiny Hugging Face Llama (hidden 64, 4 heads, 2 KV heads, vocab 256) with torchao int8 weight-only weights,
input (2, 16), as ``bench_hf.py``; or (``--model twotensor``) an MLP of ``nn.Linear(64, 64)`` with ``TwoTensor``
weights, one per "layer". One intra-op thread. Wall clock on a shared machine: compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.normpath(os.path.join(_HERE, os.pardir))

_CHILD = r'''
import json, os, sys, time
t0 = time.perf_counter()
sys.path.insert(0, {root!r})
import thunder_subclass, thunder, torch
torch.set_num_threads(1)
import_s = time.perf_counter() - t0
t0 = time.perf_counter()
model, ids = None, None
if {model!r} == "llama":
    import transformers
    from torchao.quantization import Int8WeightOnlyConfig, quantize_
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers={layers},
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    quantize_(model, Int8WeightOnlyConfig())
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    out_of = lambda out: out.logits
else:
    from torch.testing._internal.two_tensor import TwoTensor
    torch.manual_seed(0)
    mods = []
    for _ in range({layers}):
        lin = torch.nn.Linear(64, 64)
        lin.weight = torch.nn.Parameter(TwoTensor(lin.weight.detach().clone(), lin.weight.detach() * 2))
        mods += [lin, torch.nn.ReLU()]
    model = torch.nn.Sequential(*mods)
    ids = torch.randn(2, 64)
    out_of = lambda out: out.a
build_s = time.perf_counter() - t0
if {config!r} == "aot_eager":
    compiled = torch.compile(model, backend="aot_eager")
else:
    thunder_subclass.config.disk_cache = {config!r} != "off"
    compiled = thunder_subclass.jit(model)
with torch.no_grad():
    t0 = time.perf_counter()
    out = out_of(compiled(ids))
    first = time.perf_counter() - t0
    torch.testing.assert_close(out, out_of(model(ids)))
print(json.dumps({{"first": first, "import": import_s, "build": build_s,
                   "stats": thunder_subclass.disk_cache_stats()}}))
'''


def run(model: str, layers: int, config: str, cache_dir: str) -> dict:
    env = {**os.environ, "THUNDER_SUBCLASS_CACHE_DIR": cache_dir, "CUDA_VISIBLE_DEVICES": "",
           "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    code = _CHILD.format(root=_ROOT, model=model, layers=layers, config=config)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1200)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1][:100] if out.stderr.strip() else f"rc {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--model", choices=("llama", "twotensor"), default="llama")
    parser.add_argument("--no-aot-eager", action="store_true")
    parser.add_argument("--no-off", action="store_true", help="skip the disk-cache-off process")
    args = parser.parse_args()

    configs = ["cold", "disk"] + ([] if args.no_off else ["off"]) + ([] if args.no_aot_eager else ["aot_eager"])
    rows = []
    for layers in args.layers:
        with tempfile.TemporaryDirectory() as cache_dir:
            row = {c: run(args.model, layers, c, cache_dir) for c in configs}
        rows.append((layers, row))
        _print(args.model, [(layers, row)], configs, header=len(rows) == 1)
    print()
    print("import + model construction, not counted above (s):",
          ", ".join(f"{layers} layers: {row['disk'].get('import', float('nan')):.1f} + "
                    f"{row['disk'].get('build', float('nan')):.1f}" for layers, row in rows))
    for layers, row in rows:
        stats = row["disk"].get("stats")
        if stats is not None and stats.get("hits") != 1:
            print(f"WARNING: {layers} layers: the second process did not load from disk: {stats}")


def _print(model, rows, configs, header):
    names = {"cold": "ts cold", "disk": "ts disk", "off": "ts off", "aot_eager": "aot_eager"}
    if header:
        print(f"first call (s) in a fresh process, {model}, no grad; ratio to aot_eager in brackets")
        print(f"{'layers':>6} " + " ".join(f"{names[c]:>16}" for c in configs))
    for layers, row in rows:
        ref = row.get("aot_eager", {}).get("first")
        cells = []
        for c in configs:
            r = row[c]
            if "error" in r:
                cells.append(f"{'FAILED':>16}")
                continue
            ratio = f" ({r['first'] / ref:.2f})" if ref else ""
            cells.append(f"{r['first']:>9.2f}{ratio:>7}")
        print(f"{layers:>6} " + " ".join(cells), flush=True)
        for c in configs:
            if "error" in row[c]:
                print(f"       {names[c]}: {row[c]['error']}")


if __name__ == "__main__":
    main()
