"""Speed of subclass-holding models: eager vs thunder_subclass vs torch.compile vs the hand-flattened limit.

    python benchmarks/bench_subclasses.py [--quick] [--out benchmarks/results]

For each model and size, in one run: the steady-state time per call (median of repeated timed loops) and the
first-call time (trace + transforms + first run; a fresh compile each time, median of a few) of

* ``eager``            the model with its subclass, in eager PyTorch (every op pays Python ``__torch_dispatch__``);
* ``ts``               ``thunder_subclass.jit`` with thunder's default executors;
* ``ts+torch_compile`` ``thunder_subclass.jit`` with thunder's torch_compile executor first;
* ``ts+inductor``      ``thunder_subclass.jit`` with the plugin's ``inductor_ex`` (the same fusion regions, each
                       compiled by inductor without dynamo);
* ``aot_eager``        ``torch.compile(backend="aot_eager")``;
* ``inductor``         ``torch.compile(backend="inductor")``;
* ``flat-thunder``     the same model hand-flattened (each subclass parameter replaced by its inner tensors as
                       plain parameters, the same modules and computation) under plain ``thunder.jit``: subclasses
                       cost nothing at run time. Not available for torchao float8;
* ``flat-thunder+tc``  the same with thunder's torch_compile executor (what ``ts+torch_compile`` compares with);
* ``limit``            ``flat-thunder`` plus the Python work PyTorch's autograd engine does with subclass gradients
                       (``ones_like`` of a subclass loss, ``.grad += grad`` through ``__torch_dispatch__`` per
                       parameter), measured on its own in the same rounds: no compiler can remove that while the
                       gradients are subclass objects (as eager's are). Equal to ``flat-thunder`` for inference.

Then, per-call time against the number of subclass parameters: n ``TwoTensor`` parameters under ``ts`` against
the hand-flattened module with the 2n inner tensors as plain parameters.

Models (two sizes: ``small`` is overhead-bound, ``large`` compute-bound): 4 x ``nn.Linear`` with ``TwoTensor`` weights
(inference under ``no_grad``, ``TwoTensor`` output; small: batch 2, width 16), a 4-layer ``TwoTensor`` MLP (forward +
backward), an int8 weight-only linear stack (inference), a torchao float8-training MLP (forward + backward).

Prints a table of ratios (time / ts), writes ``results.csv``, ``results.png`` and ``table.txt`` under ``--out``.
Steady-state times are medians over rounds in which every configuration is timed in turn (machine noise hits all
alike); timings are wall clock on a shared machine: compare ratios from one run, not absolute numbers across runs.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import io
import os
import statistics
import sys
import time
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402

import thunder_subclass  # noqa: E402  (before thunder)
import thunder  # noqa: E402
from torch.testing._internal.two_tensor import TwoTensor  # noqa: E402
thunder_subclass.config.disk_cache = False  # first calls here trace (restarts: bench_cold_start.py)

torch.set_num_threads(max(1, os.cpu_count() or 1))
try:  # honest first-call times for inductor: no on-disk compile caches
    import torch._inductor.config as inductor_config

    inductor_config.force_disable_caches = True
except Exception:
    pass

SIZES = {"small": dict(batch=8, width=32), "large": dict(batch=256, width=1024)}


# ---------------------------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------------------------


class TwoTensorMLP(torch.nn.Module):
    def __init__(self, width, layers=4):
        super().__init__()
        self.weights = torch.nn.ParameterList(
            [torch.nn.Parameter(TwoTensor(torch.randn(width, width) / width**0.5, torch.randn(width, width) / width**0.5))
             for _ in range(layers)]
        )

    def forward(self, x):
        for w in self.weights:
            x = torch.relu(x @ w)
        return x.sum()


class FlatTwoTensorMLP(torch.nn.Module):
    """TwoTensorMLP hand-flattened: the inner tensors of each TwoTensor parameter as plain parameters."""

    def __init__(self, model):
        super().__init__()
        self.a = torch.nn.ParameterList([torch.nn.Parameter(w.a.detach().clone()) for w in model.weights])
        self.b = torch.nn.ParameterList([torch.nn.Parameter(w.b.detach().clone()) for w in model.weights])

    def forward(self, xa, xb):
        for wa, wb in zip(self.a, self.b):
            xa, xb = torch.relu(xa @ wa), torch.relu(xb @ wb)
        return xa.sum(), xb.sum()


def two_tensor_case(size):
    width, batch = SIZES[size]["width"], SIZES[size]["batch"]
    model = TwoTensorMLP(width)
    x = TwoTensor(torch.randn(batch, width), torch.randn(batch, width))
    flat = FlatTwoTensorMLP(model)  # the same model with each TwoTensor parameter as two plain parameters

    def run_subclass(fn):
        def step():
            out = fn(x)
            out.backward()
            return out
        return step

    def run_flat(fn):
        def step():
            a, b = fn(x.a, x.b)
            (a + b).backward()
            return a
        return step

    def grad_dispatch():
        # what PyTorch's autograd engine does in Python for a model whose gradients are TwoTensors, whichever
        # compiler produced them: ones_like(loss) for .backward(), and .grad += grad (TwoTensor.add_) per parameter
        torch.ones_like(loss)
        for acc, g in zip(accumulated, grads):
            acc.add_(g)

    loss = TwoTensor(torch.randn(()), torch.randn(()))
    grads = [TwoTensor(torch.randn(width, width), torch.randn(width, width)) for _ in model.weights]
    accumulated = [g.clone() for g in grads]
    return dict(model=model, run=run_subclass, flat=flat, run_flat=run_flat, train=True, grad_dispatch=grad_dispatch)


LINEAR_SIZES = {"small": dict(batch=2, width=16), "large": dict(batch=256, width=1024)}


class FlatTwoTensorLinear(torch.nn.Module):
    """The TwoTensor-weight linear stack hand-flattened: each weight's inner tensors as plain parameters."""

    def __init__(self, model):
        super().__init__()
        self.a = torch.nn.ParameterList([torch.nn.Parameter(lin.weight.a.clone(), requires_grad=False) for lin in model])
        self.b = torch.nn.ParameterList([torch.nn.Parameter(lin.weight.b.clone(), requires_grad=False) for lin in model])
        self.bias = torch.nn.ParameterList([torch.nn.Parameter(lin.bias.clone(), requires_grad=False) for lin in model])

    def forward(self, x):
        xa = xb = x
        for wa, wb, bias in zip(self.a, self.b, self.bias):
            xa, xb = torch.nn.functional.linear(xa, wa, bias), torch.nn.functional.linear(xb, wb, bias)
        return xa, xb


def two_tensor_linear_case(size):
    """4 x nn.Linear with TwoTensor weights (bias plain), inference under no_grad, TwoTensor output."""
    width, batch = LINEAR_SIZES[size]["width"], LINEAR_SIZES[size]["batch"]
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)])
    for lin in model:
        w = lin.weight.detach()
        lin.weight = torch.nn.Parameter(TwoTensor(w, w.clone()), requires_grad=False)
        lin.bias.requires_grad_(False)
    x = torch.randn(batch, width)
    flat = FlatTwoTensorLinear(model)

    def run(fn):
        def step():
            with torch.no_grad():
                return fn(x)
        return step

    return dict(model=model, run=run, flat=flat, run_flat=run, train=False)


class Int8Weight(torch.Tensor):
    """Weight-only int8: int8 data + per-row scale, presented as float32; dequantizes in dispatch."""

    @staticmethod
    def __new__(cls, data, scale):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=torch.float32, device=data.device)

    def __init__(self, data, scale):
        self.data_int8, self.scale = data, scale

    def __tensor_flatten__(self):
        return ["data_int8", "scale"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return Int8Weight(inner["data_int8"], inner["scale"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_map

        def deq(a):
            return a.data_int8.to(torch.float32) * a.scale[:, None] if isinstance(a, Int8Weight) else a

        if func in (torch.ops.aten.detach.default, torch.ops.aten.clone.default):
            return Int8Weight(func(args[0].data_int8), func(args[0].scale))
        args, kwargs = tree_map(deq, (args, kwargs or {}))
        return func(*args, **kwargs)


class FlatInt8Linear(torch.nn.Linear):
    """An int8 weight-only Linear hand-flattened: int8 data and scale as plain buffers, dequantized in forward
    (a Linear, so that thunder guards the same module attributes as for the model with Int8Weight weights)."""

    def __init__(self, lin, data, scale):
        super().__init__(lin.in_features, lin.out_features, bias=False)
        del self.weight
        self.register_buffer("data_int8", data)
        self.register_buffer("scale", scale)

    def forward(self, x):
        return torch.nn.functional.linear(x, self.data_int8.to(torch.float32) * self.scale[:, None])


def int8_case(size):
    width, batch = SIZES[size]["width"], SIZES[size]["batch"]
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(4)]).requires_grad_(False)
    raw = []
    for lin in model:
        w = lin.weight.detach()
        scale = w.abs().amax(dim=1) / 127.0
        data = torch.round(w / scale[:, None]).to(torch.int8)
        lin.weight = torch.nn.Parameter(Int8Weight(data, scale), requires_grad=False)
        raw.append((data, scale))
    x = torch.randn(batch, width)

    flat = torch.nn.Sequential(*[FlatInt8Linear(lin, data, scale) for lin, (data, scale) in zip(model, raw)])

    def run_subclass(fn):
        def step():
            with torch.no_grad():
                return fn(x)
        return step

    def run_flat(fn):
        def step():
            with torch.no_grad():
                return fn(x)
        return step

    return dict(model=model, run=run_subclass, flat=flat, run_flat=run_flat, train=False)


def float8_case(size):
    from torchao.float8 import convert_to_float8_training

    width, batch = SIZES[size]["width"], SIZES[size]["batch"]
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width))
    convert_to_float8_training(model)
    x = torch.randn(batch, width)

    def run_subclass(fn):
        def step():
            out = fn(x).sum()
            out.backward()
            return out
        return step

    return dict(model=model, run=run_subclass, flat=None, run_flat=None, train=True)


CASES = {"twotensor_linear": two_tensor_linear_case, "twotensor_mlp": two_tensor_case, "int8_linear_stack": int8_case, "float8_training_mlp": float8_case}

# ---------------------------------------------------------------------------------------------------------------
# Compilers
# ---------------------------------------------------------------------------------------------------------------


def compilers():
    from thunder.executors.torch_compile import torch_compile_ex

    return {
        "eager": lambda m: m,
        "ts": lambda m: thunder_subclass.jit(m),
        "ts+torch_compile": lambda m: thunder_subclass.jit(m, executors=[torch_compile_ex]),
        "ts+inductor": lambda m: thunder_subclass.jit(m, executors=[thunder_subclass.inductor_ex]),
        "aot_eager": lambda m: torch.compile(m, backend="aot_eager"),
        "inductor": lambda m: torch.compile(m, backend="inductor"),
    }


def first_call(make_step, repeats):
    samples = []
    for _ in range(repeats):
        torch._dynamo.reset()
        t0 = time.perf_counter()
        make_step()()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def measure(case_name, size, quick):
    case = CASES[case_name](size)
    repeats, inner = (5, 5) if quick else ((15, 30) if size == "small" else (7, 2))
    first_repeats = 1 if quick else 3
    makers = {
        name: (lambda compile_fn=compile_fn: case["run"](compile_fn(copy.deepcopy(case["model"]))))
        for name, compile_fn in compilers().items()
    }
    if case["flat"] is not None:
        from thunder.executors.torch_compile import torch_compile_ex

        makers["flat-thunder"] = lambda: case["run_flat"](thunder.jit(copy.deepcopy(case["flat"])))
        makers["flat-thunder+tc"] = lambda: case["run_flat"](
            thunder.jit(copy.deepcopy(case["flat"]), executors=[torch_compile_ex])
        )
    if case.get("grad_dispatch") is not None:
        makers["grad-dispatch"] = lambda: case["grad_dispatch"]
    firsts, steps = {}, {}
    for name, make_step in makers.items():
        try:
            firsts[name] = first_call(make_step, first_repeats) if name not in ("eager", "grad-dispatch") else float("nan")
            steps[name] = make_step()
            for _ in range(3):
                steps[name]()  # warm-up
        except Exception as e:  # a compiler that cannot handle the model is reported, not fatal
            print(f"  {case_name}/{size}/{name}: failed: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)
    # round robin: every configuration is timed in every round, so machine noise hits them alike
    samples = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                step()
            samples[name].append((time.perf_counter() - t0) / inner)
    return [
        dict(model=case_name, size=size, compiler=name,
             steady_s=statistics.median(samples[name]) if name in samples else float("nan"),
             first_call_s=firsts.get(name, float("nan")))
        for name in makers
    ]


STEADY = ["eager", "ts", "ts+torch_compile", "ts+inductor", "aot_eager", "inductor", "flat-thunder", "flat-thunder+tc", "limit"]
FIRST = ["ts", "ts+torch_compile", "ts+inductor", "aot_eager", "inductor", "flat-thunder", "flat-thunder+tc"]


class AddParams(torch.nn.Module):
    """x + p for each parameter p: almost no compute, so the per-call cost of the parameters shows."""

    def __init__(self, params):
        super().__init__()
        self.ps = torch.nn.ParameterList([torch.nn.Parameter(p, requires_grad=False) for p in params])

    def forward(self, x):
        for p in self.ps:
            x = x + p
        return x


def measure_scaling(quick, counts=(1, 8, 32, 128)):
    """Per-call time of n TwoTensor parameters under ts vs their 2n inner tensors as plain parameters under plain
    thunder.jit: does a subclass parameter cost more per call than the tensors it holds?"""
    rows = []
    repeats, inner = (5, 20) if quick else (15, 50)
    for n in counts:
        inner_tensors = [torch.randn(4) for _ in range(2 * n)]
        sub = AddParams([TwoTensor(a, b) for a, b in zip(inner_tensors[0::2], inner_tensors[1::2])])
        x, xs = torch.randn(4), TwoTensor(torch.randn(4), torch.randn(4))
        fns = {"ts": (thunder_subclass.jit(sub), xs), "flat-thunder": (thunder.jit(AddParams(inner_tensors)), x)}
        for fn, arg in fns.values():
            for _ in range(10):
                fn(arg)
        samples = {k: [] for k in fns}
        for _ in range(repeats):
            for k, (fn, arg) in fns.items():
                t0 = time.perf_counter()
                for _ in range(inner):
                    fn(arg)
                samples[k].append((time.perf_counter() - t0) / inner)
        rows += [dict(model="param_scaling", size=str(n), compiler=k, steady_s=statistics.median(v),
                      first_call_s=float("nan")) for k, v in samples.items()]
    return rows


def _steady(g, name):
    if name == "limit":  # the hand-flattened program + what eager autograd must do in Python with subclass grads
        if "flat-thunder" not in g:
            return float("nan")
        extra = g["grad-dispatch"]["steady_s"] if "grad-dispatch" in g else 0.0
        return g["flat-thunder"]["steady_s"] + extra
    return g[name]["steady_s"] if name in g else float("nan")


def report(rows, out_dir, scaling=()):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(list(rows) + list(scaling))
    names = STEADY
    print("\nsteady state: time per call / thunder_subclass (ts) time per call; lower is faster than ts")
    print(f"{'model':20} {'size':6} {'ts ms':>8} " + " ".join(f"{n:>15}" for n in names))
    groups = {}
    for r in rows:
        groups.setdefault((r["model"], r["size"]), {})[r["compiler"]] = r
    for (model, size), g in groups.items():
        ts = g["ts"]["steady_s"]
        cells = [f"{_steady(g, n) / ts:15.2f}" for n in names]
        print(f"{model:20} {size:6} {ts * 1e3:8.3f} " + " ".join(cells))
    print("\nthunder_subclass against its reference points: ts/limit (1: at the hand-flattened limit), ts/aot_eager "
          "and first call ts/flat-thunder (below 1: ts faster), eager/ts (above 1: ts faster)")
    print("  best ts / inductor: the fastest of ts, ts+torch_compile and ts+inductor (named in 'best') against "
          "torch.compile's inductor")
    print(f"{'model':20} {'size':6} {'ts/limit':>10} {'ts/aot_eager':>13} {'best ts/inductor':>17} {'best':>16} "
          f"{'eager/ts':>9} {'first ts/flat':>14}")
    for (model, size), g in groups.items():
        ts = g["ts"]["steady_s"]
        first_flat = g["flat-thunder"]["first_call_s"] if "flat-thunder" in g else float("nan")
        best = min((n for n in ("ts", "ts+torch_compile", "ts+inductor") if n in g), key=lambda n: g[n]["steady_s"])
        print(f"{model:20} {size:6} {ts / _steady(g, 'limit'):10.2f} {ts / _steady(g, 'aot_eager'):13.2f} "
              f"{_steady(g, best) / _steady(g, 'inductor'):17.2f} {best:>16} "
              f"{_steady(g, 'eager') / ts:9.2f} {g['ts']['first_call_s'] / first_flat:14.2f}")
    print("\nfirst call (trace + compile + run), seconds")
    print(f"{'model':20} {'size':6} " + " ".join(f"{n:>15}" for n in FIRST))
    for (model, size), g in groups.items():
        cells = [f"{g[n]['first_call_s']:15.2f}" if n in g else f"{'-':>15}" for n in FIRST]
        print(f"{model:20} {size:6} " + " ".join(cells))
    if scaling:
        print("\nper-call cost vs number of subclass parameters (inference, x + p for each parameter p): n TwoTensor "
              "parameters under ts vs the hand-flattened module (2n plain parameters) under plain thunder.jit")
        print(f"{'n':>5} {'ts us':>9} {'flat us':>9} {'ts/flat':>8}")
        by_n = {}
        for r in scaling:
            by_n.setdefault(r["size"], {})[r["compiler"]] = r["steady_s"]
        for n, g in by_n.items():
            print(f"{n:>5} {g['ts'] * 1e6:9.1f} {g['flat-thunder'] * 1e6:9.1f} {g['ts'] / g['flat-thunder']:8.2f}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(11, 4.5))
    labels = [f"{m}\n{s}" for (m, s) in groups]
    names = [n for n in names if n != "flat-thunder+tc"]
    width = 0.8 / len(names)
    for i, n in enumerate(names):
        vals = [_steady(g, n) / g["ts"]["steady_s"] if n in g or n == "limit" else 0 for g in groups.values()]
        vals = [0 if v != v else v for v in vals]
        ax.bar([j + i * width for j in range(len(groups))], vals, width, label=n)
    ax.axhline(1.0, color="k", linewidth=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))], labels, fontsize=8)
    ax.set_ylabel("time per call / thunder_subclass")
    ax.set_yscale("log")
    ax.legend(fontsize=8, ncol=3)
    ax.set_title("Steady-state time relative to thunder_subclass (CPU, lower is faster)")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "results.png"), dpi=110)
    print(f"\nwrote {os.path.join(out_dir, 'results.csv')} and results.png")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    parser.add_argument("--models", default=",".join(CASES), help="comma-separated subset of " + ", ".join(CASES))
    parser.add_argument("--sizes", default="small,large")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch intra-op threads (default: all cores); 1 avoids stalls on a shared machine")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = []
    for model in args.models.split(","):
        for size in args.sizes.split(","):
            print(f"measuring {model} / {size} ...", file=sys.stderr)
            rows.extend(measure(model, size, args.quick))
    print("measuring parameter scaling ...", file=sys.stderr)
    scaling = measure_scaling(args.quick)
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        report(rows, args.out, scaling)
    print(text.getvalue(), end="")
    with open(os.path.join(args.out, "table.txt"), "w") as f:  # the tables as printed, for README
        f.write(text.getvalue().split("\nwrote ")[0].lstrip("\n") + "\n")


if __name__ == "__main__":
    main()
