"""Speed of subclass-holding models on a CUDA GPU: thunder_subclass with thunder's GPU executors vs torch.compile.

    python benchmarks/bench_gpu.py [--models ...] [--sizes small,large] [--quick] [--out benchmarks/results_gpu]

The models of ``bench_subclasses.py`` (built on the GPU: ``TwoTensor`` linear inference, ``TwoTensor`` MLP training,
int8 weight-only stack, torchao float8 training) and the tiny Hugging Face Llama with torchao int8 weight-only
weights of ``bench_hf.py`` (forward, no grad), each under

* ``eager``             the model with its subclass in eager PyTorch;
* ``ts``                ``thunder_subclass.jit`` with thunder's default executors (nvFuser first where it is installed);
* ``ts+torch_compile``  ``thunder_subclass.jit`` with thunder's torch_compile executor;
* ``ts+cudagraphs``     ``thunder_subclass.jit`` with thunder's ``CUDAGraphTransform`` (default executors);
* ``aot_eager``, ``inductor``, ``inductor-ro``  ``torch.compile`` with those backends (``-ro``:
  ``mode="reduce-overhead"``, inductor with CUDA graphs).

Steady state: the median over rounds (every configuration timed in turn in each round) of the mean time of a loop of
calls, between ``torch.cuda.synchronize()`` calls. First call: trace + compile + first run of a fresh compile, once.
A configuration that fails or differs from eager is reported in the table, not fatal. Prints the tables and writes
``table.txt`` and ``results.csv`` under ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import csv
import os
import statistics
import sys
import time
import types
import warnings

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)))

import torch  # noqa: E402

import thunder_subclass  # noqa: E402  (before thunder)
import thunder  # noqa: E402
import bench_subclasses  # noqa: E402
thunder_subclass.config.disk_cache = False  # first calls here trace (restarts: bench_cold_start.py)

# float8 GEMMs (torch._scaled_mm) need every dimension a multiple of 16: the small batch is 16 on the GPU (8 on CPU)
bench_subclasses.SIZES["small"] = dict(batch=16, width=32)

CONFIGS = ["eager", "ts", "ts+torch_compile", "ts+cudagraphs", "aot_eager", "inductor", "inductor-ro"]


def compilers():
    from thunder.executors.torch_compile import torch_compile_ex
    from thunder.transforms.cudagraph import CUDAGraphTransform

    return {
        "eager": lambda m: m,
        "ts": lambda m: thunder_subclass.jit(m),
        "ts+torch_compile": lambda m: thunder_subclass.jit(m, executors=[torch_compile_ex]),
        "ts+cudagraphs": lambda m: thunder_subclass.jit(m, transforms=[CUDAGraphTransform()]),
        "aot_eager": lambda m: torch.compile(m, backend="aot_eager"),
        "inductor": lambda m: torch.compile(m, backend="inductor"),
        "inductor-ro": lambda m: torch.compile(m, backend="inductor", mode="reduce-overhead"),
    }


def llama_case(size):
    import bench_hf

    layers, hidden = (2, 64) if size == "small" else (4, 1024)
    with torch.device("cuda"):
        model = bench_hf.build(types.SimpleNamespace(layers=layers, hidden=hidden))
    ids = torch.randint(0, 256, (2, 16), device="cuda", generator=torch.Generator("cuda").manual_seed(1))

    def run(fn):
        def step():
            with torch.no_grad():
                return fn(ids).logits
        return step

    return dict(model=model, run=run, train=False)


def build_case(name, size):
    if name == "llama_int8":
        return llama_case(size)
    with torch.device("cuda"):  # every tensor the case makes (parameters, inputs) is made on the GPU
        return bench_subclasses.CASES[name](size)


def _leaves(out):
    if isinstance(out, torch.Tensor) and type(out) is not torch.Tensor and hasattr(out, "__tensor_flatten__"):
        names, _ = out.__tensor_flatten__()
        return [t for n in names for t in _leaves(getattr(out, n))]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _leaves(o)]
    return [out.detach()]


def loop_time(step, iters):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def measure(case_name, size, quick, skip=()):
    case = build_case(case_name, size)
    rounds, iters = (3, 10) if quick else (7, 30 if size == "small" else 10)
    torch.manual_seed(0)
    expected = _leaves(case["run"](copy.deepcopy(case["model"]))())
    steps, first, errors = {}, {}, {}
    for name, compile_fn in compilers().items():
        if f"{case_name}/{name}" in skip:
            errors[name] = "skipped (--skip)"
            continue
        try:
            torch._dynamo.reset()
            model = copy.deepcopy(case["model"])
            step = case["run"](compile_fn(model))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = step()
            torch.cuda.synchronize()
            first[name] = time.perf_counter() - t0
            if not case["train"]:  # training steps change nothing between calls, but the loss is compared once only
                for a, e in zip(_leaves(out), expected):
                    torch.testing.assert_close(a.float(), e.float(), atol=1e-2, rtol=1e-2)
            for _ in range(3):
                step()
            steps[name] = step
        except Exception as e:  # reported in the table
            errors[name] = f"{type(e).__name__}: {e}".splitlines()[0][:110]
    samples = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            samples[name].append(loop_time(step, iters))
    return [
        dict(model=case_name, size=size, compiler=name,
             steady_s=statistics.median(samples[name]) if name in samples else float("nan"),
             first_call_s=first.get(name, float("nan")), error=errors.get(name, ""))
        for name in compilers()
    ]


def report(rows, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, thunder {thunder.__version__}, "
             f"nvFuser {'yes' if _nvfuser() else 'no'}",
             "steady state: time per call / ts time per call (lower is faster than ts)"]
    groups = {}
    for r in rows:
        groups.setdefault((r["model"], r["size"]), {})[r["compiler"]] = r
    lines.append(f"{'model':20} {'size':6} {'ts ms':>8} " + " ".join(f"{n:>16}" for n in CONFIGS)
                 + f" {'best ts/ind':>12} {'best ts/ind-ro':>15}")
    for (model, size), g in groups.items():
        ts = g["ts"]["steady_s"]
        cells = [f"{g[n]['steady_s'] / ts:16.2f}" for n in CONFIGS]
        best = min(g[n]["steady_s"] for n in ("ts", "ts+torch_compile", "ts+cudagraphs") if g[n]["steady_s"] == g[n]["steady_s"])
        lines.append(f"{model:20} {size:6} {ts * 1e3:8.3f} " + " ".join(cells)
                     + f" {best / g['inductor']['steady_s']:12.2f} {best / g['inductor-ro']['steady_s']:15.2f}")
    lines.append("\nfirst call (trace + compile + run), seconds")
    lines.append(f"{'model':20} {'size':6} " + " ".join(f"{n:>16}" for n in CONFIGS[1:]))
    for (model, size), g in groups.items():
        lines.append(f"{model:20} {size:6} " + " ".join(f"{g[n]['first_call_s']:16.2f}" for n in CONFIGS[1:]))
    failures = [(k, n, g[n]["error"]) for k, g in groups.items() for n in CONFIGS if g[n]["error"]]
    if failures:
        lines.append("\nfailed configurations")
        lines += [f"  {m}/{s}/{n}: {err}" for (m, s), n, err in failures]
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(out_dir, "table.txt"), "w") as f:
        f.write(text + "\n")


def _nvfuser():
    try:
        from thunder.executors.nvfuserex import nvfuserex

        return nvfuserex is not None
    except Exception:
        return False


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results_gpu"))
    parser.add_argument("--models", default=",".join([*bench_subclasses.CASES, "llama_int8"]))
    parser.add_argument("--sizes", default="small,large")
    parser.add_argument("--skip", default="", help="comma-separated MODEL/CONFIG pairs not to run "
                        "(a configuration that corrupts the CUDA context ends the whole run)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_gpu.py needs a CUDA GPU")
    rows = []
    for size in args.sizes.split(","):
        for model in args.models.split(","):
            print(f"measuring {model}/{size} ...", file=sys.stderr, flush=True)
            rows += measure(model, size, args.quick, skip=set(filter(None, args.skip.split(","))))
    report(rows, args.out)


if __name__ == "__main__":
    main()
