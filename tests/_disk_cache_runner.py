"""One process of the on-disk cache tests (``tests/test_disk_cache.py``): ``python _disk_cache_runner.py case...``
compiles each named model with ``thunder_subclass.jit`` (the disk cache in ``THUNDER_SUBCLASS_CACHE_DIR``, set by the
test), calls it once under ``torch.no_grad()`` (``train_*`` cases: with gradients, and a backward) and compares values,
types and gradients with eager.
Prints one JSON line: per case ``{"error": traceback or null, "loaded": whether the entry came from disk, "traced":
how many times the jit traced (misses not served from disk)}`` and the process's ``disk_cache_stats()``."""

import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import thunder_subclass  # noqa: E402  (before thunder)
import thunder  # noqa: E402
import torch  # noqa: E402


def twotensor_mlp():
    from torch.testing._internal.two_tensor import TwoTensor

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    for i in (0, 2):
        w = model[i].weight.detach()
        model[i].weight = torch.nn.Parameter(TwoTensor(w.clone(), w * 2))
    return model, (torch.randn(3, 8),)


def plain_function():
    torch.manual_seed(0)
    w = torch.randn(4, 4)

    def f(x, y):
        return torch.tanh(x @ w) + y.sin() * 2

    return f, (torch.randn(2, 4), torch.randn(2, 4))


def int8_mlp():
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.Linear(32, 16)).eval()
    quantize_(model, Int8WeightOnlyConfig())
    return model, (torch.randn(2, 32),)


class _Scaler(torch.nn.Module):
    def scale(self, x):
        return x * (2 if torch.jit.is_tracing() else 3)  # a torch state query (torch._C._is_tracing)

    def forward(self, x):
        return self.scale(x).sin()  # a method guard


def guarded_module():
    return _Scaler(), (torch.randn(3),)


class _EnvironScaled(torch.nn.Module):
    def forward(self, x):
        return x * float(os.environ.get("THUNDER_SUBCLASS_TEST_FACTOR", "1"))  # read inside forward


def environ_module():
    return _EnvironScaled(), (torch.randn(3),)


class _LruScaled(torch.nn.Module):
    def forward(self, x):
        return x * disk_cache_lru_helper.factor()  # noqa: F821 - a global set by lru_helper_module


def lru_helper_module():
    """A module whose forward calls a helper behind ``functools.lru_cache``, in a file of the directory
    ``$THUNDER_SUBCLASS_TEST_HELPER_DIR`` (the test rewrites it between processes)."""
    import importlib

    sys.path.insert(0, os.environ["THUNDER_SUBCLASS_TEST_HELPER_DIR"])
    globals()["disk_cache_lru_helper"] = importlib.import_module("disk_cache_lru_helper")
    return _LruScaled(), (torch.randn(3),)


def _from_dir(variable: str, module: str):
    """Module ``module`` from the directory ``$variable`` (the test writes, and rewrites, its file)."""
    import importlib

    sys.path.insert(0, os.environ[variable])
    return importlib.import_module(module)


class _Helped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return disk_cache_helper.scale(self.lin(x)).relu()  # noqa: F821 - a global set by helper_module


def helper_module():
    """A model whose forward calls ``scale`` of ``disk_cache_helper`` in ``$THUNDER_SUBCLASS_TEST_HELPER_DIR``."""
    globals()["disk_cache_helper"] = _from_dir("THUNDER_SUBCLASS_TEST_HELPER_DIR", "disk_cache_helper")
    torch.manual_seed(0)
    return _Helped(), (torch.randn(3, 4),)


def same_name_model():
    """``Model`` of module ``disk_cache_same_name``, from whichever directory ``$THUNDER_SUBCLASS_TEST_MODEL_DIR``
    names (two directories hold two different classes of one module and class name)."""
    torch.manual_seed(0)
    return _from_dir("THUNDER_SUBCLASS_TEST_MODEL_DIR", "disk_cache_same_name").Model(), (torch.randn(3, 4),)


_SHIFT = float(os.environ.get("THUNDER_SUBCLASS_TEST_SHIFT", "0"))  # a global the forward reads


class _Attributed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.factor = float(os.environ.get("THUNDER_SUBCLASS_TEST_FACTOR", "1"))  # set outside forward

    def forward(self, x):
        return x * self.factor + _SHIFT


def attribute_module():
    return _Attributed(), (torch.randn(3),)


def default_dtype_function():
    """A function making a tensor of the default dtype and device (``$THUNDER_SUBCLASS_TEST_DEFAULT_DTYPE``)."""
    dtype = os.environ.get("THUNDER_SUBCLASS_TEST_DEFAULT_DTYPE")
    if dtype:
        torch.set_default_dtype(getattr(torch, dtype))

    def make_ones(x):
        return x + torch.ones(3)

    return make_ones, (torch.randn(3, dtype=torch.float32),)


def train_mlp():
    """A training step (run with gradients, see ``run``): TwoTensor-free, plain outputs."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    return model, (torch.randn(5, 8),)


def train_int8_weight():
    """A training step through a subclass weight (the demo's Int8Weight, frozen) into a plain output: the gradient of
    the input and of the bias."""
    from thunder_subclass.demo import Int8Weight

    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 4)
    layer.weight = torch.nn.Parameter(Int8Weight.from_float(layer.weight.detach()), requires_grad=False)
    return layer, (torch.randn(3, 8, requires_grad=True),)


def train_twotensor_mlp():
    """A training step whose output is a subclass (TwoTensor weights: the output, its gradient and the weights'
    gradients are TwoTensors); ``.backward()`` of the sum: a gradient of the output's kind."""
    return twotensor_mlp()


def train_twotensor_mlp_plain_grad():
    """As ``train_twotensor_mlp``, the backward given a plain-tensor gradient for the TwoTensor output (another kind
    than the output's: a backward variant, built from the joint trace)."""
    return twotensor_mlp()


def train_scaled_twotensor_grad():
    """A function of one input that requires grad, with a plain output, its backward given a TwoTensor gradient
    (eager's input gradient is then a TwoTensor)."""

    def scaled(x):
        return x * 3 + 1

    torch.manual_seed(0)
    return scaled, (torch.randn(2, 4, requires_grad=True),)


def _twotensor_grad(out):
    from torch.testing._internal.two_tensor import TwoTensor

    return TwoTensor(torch.full(out.shape, 0.5), torch.full(out.shape, 2.0))


# the gradient each train_* case's backward is given (default: .sum().backward(), the output's own kind)
_GRADS = {
    "train_twotensor_mlp_plain_grad": lambda out: torch.full(out.shape, 0.5),
    "train_scaled_twotensor_grad": _twotensor_grad,
}


def default_device_function():
    """A function making a tensor of the default device (``$THUNDER_SUBCLASS_TEST_DEFAULT_DEVICE``, set after its
    CPU input is made): ``meta`` on a CPU-only machine changes what ``torch.ones(3)`` makes, and the output's
    device."""
    x = torch.randn(3)
    device = os.environ.get("THUNDER_SUBCLASS_TEST_DEFAULT_DEVICE")
    if device:
        torch.set_default_device(device)

    def make_ones_on_default_device(x):
        return x.sum() + torch.ones(3)

    return make_ones_on_default_device, (x,)


_FAKED = ("torch", "thunder", "transformers", "torchao")


def version_sweep():
    """The plain function compiled once per library whose version is faked (one at a time, as
    the real one with the local part ``$THUNDER_SUBCLASS_TEST_FAKE_VERSION``), then with the real versions: which of these calls loaded an
    entry."""
    import importlib

    fn, args = plain_function()
    loaded = {}
    for name in (*_FAKED, None):
        mod = importlib.import_module(name) if name else None
        real = getattr(mod, "__version__", None)
        if mod is not None:
            tag = os.environ.get("THUNDER_SUBCLASS_TEST_FAKE_VERSION", "another")  # a local version: still supported
            mod.__version__ = f"{real}{'.' if '+' in str(real) else '+'}{tag}"
        try:
            jfn = thunder_subclass.jit(fn)
            with torch.no_grad():
                torch.testing.assert_close(jfn(*args), fn(*args))
            loaded[name or "real"] = type(thunder.last_traces(jfn)[-1]).__name__ == "LoadedTrace"
        finally:
            if mod is not None:
                mod.__version__ = real
    return loaded


def eager_call_training():
    """The routed mixture of experts of ``test_eager_calls`` (its experts break: later calls run them as eager calls,
    whose description lives in this process), three training steps compared with eager: which calls loaded an entry."""
    import warnings

    from test_eager_calls import _pair, _RoutedMoE

    eager, model = _pair(_RoutedMoE)
    jm = thunder_subclass.jit(model)
    torch.manual_seed(3)
    loaded = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", thunder_subclass.GraphBreakWarning)
        for _ in range(3):
            x = torch.randn(6, 8) * 3
            out, expected = jm(x), eager(x)
            torch.testing.assert_close(out, expected)
            got, want = _grads(model, (), out), _grads(eager, (), expected)
            for a, b in zip(got, want):
                assert (a is None) == (b is None) or not (a if a is not None else b).any()
                if a is not None and b is not None:
                    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
            loaded.append(thunder_subclass.disk_cache_stats()["hits"] > 0)
    return loaded


def int8_bf16_decode():
    """A bfloat16 torchao int8 weight-only MLP on 4 rows (its linears claimed for ``_weight_int8pack_mm``, see
    ``test_int8_linear``): whether the entry was loaded, and whether the trace run calls the kernel's symbol."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64, bias=False), torch.nn.GELU(),
                                torch.nn.Linear(64, 16, bias=False)).to(torch.bfloat16).eval()
    quantize_(model, Int8WeightOnlyConfig())
    x = torch.randn(1, 4, 32, dtype=torch.bfloat16)
    jfn = thunder_subclass.jit(model)
    with torch.no_grad():
        out, expected = jfn(x), model(x)
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=1.6e-2)  # bfloat16 rounding (test_int8_linear)
    trace = thunder.last_traces(jfn)[-1]
    return {"loaded": type(trace).__name__ == "LoadedTrace", "claimed": "int8_weight_only_linear" in str(trace)}


def _flat(out):
    from torch.utils._pytree import tree_leaves

    leaves = []
    for t in tree_leaves(out):
        leaves.append(t)
        if hasattr(t, "__tensor_flatten__") and type(t) is not torch.Tensor:
            leaves += [getattr(t, a) for a in t.__tensor_flatten__()[0]]
    return leaves


def _grads(module_or_fn, args, out, grad=None) -> list:
    params = list(module_or_fn.parameters()) if isinstance(module_or_fn, torch.nn.Module) else []
    leaves = [*params, *(a for a in args if isinstance(a, torch.Tensor) and a.requires_grad)]
    if grad is None:
        out.sum().backward()
    else:
        out.backward(grad(out))
    grads = [p.grad for p in leaves]
    for p in leaves:
        p.grad = None
    return grads


def run(name: str) -> dict:
    try:
        if name in ("version_sweep", "eager_call_training", "int8_bf16_decode"):
            return {"error": None, "loaded": globals()[name]()}
        fn, args = globals()[name]()
        jfn = thunder_subclass.jit(fn)
        training = name.startswith("train_")
        if training:  # forward and backward, gradients compared with eager's
            out = jfn(*args)
            got_grads = _grads(fn, args, out, _GRADS.get(name))
            expected = fn(*args)
            want_grads = _grads(fn, args, expected, _GRADS.get(name))
            assert len(_flat(got_grads)) == len(_flat(want_grads))
            for a, b in zip(_flat(got_grads), _flat(want_grads)):
                assert type(a) is type(b)
                torch.testing.assert_close(a, b)
        else:
            with torch.no_grad():
                out, expected = jfn(*args), fn(*args)
        got, want = _flat(out), _flat(expected)
        assert [type(t) for t in got] == [type(t) for t in want]
        assert [getattr(t, "device", None) for t in got] == [getattr(t, "device", None) for t in want]
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
        loaded = type(thunder.last_traces(jfn)[-1]).__name__ == "LoadedTrace"
        if training:
            assert loaded == (type(thunder.last_backward_traces(jfn)[-1]).__name__ == "LoadedTrace")
        return {"error": None, "loaded": loaded, "traced": thunder.cache_misses(jfn) - loaded}
    except BaseException:
        return {"error": traceback.format_exc(), "loaded": None}


if __name__ == "__main__":
    results = {name: run(name) for name in sys.argv[1:]}
    stats = thunder_subclass.disk_cache_stats()
    print(json.dumps({"results": results, "stats": stats, "disk_cache": thunder_subclass.config.disk_cache}))
