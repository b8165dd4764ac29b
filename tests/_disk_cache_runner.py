"""One process of the on-disk cache tests (``tests/test_disk_cache.py``): ``python _disk_cache_runner.py case...``
compiles each named model with ``thunder_subclass.jit`` (the disk cache on through ``THUNDER_SUBCLASS_DISK_CACHE=1``
and ``THUNDER_SUBCLASS_CACHE_DIR``, set by the test), calls it once under ``torch.no_grad()`` and compares with eager.
Prints one JSON line: per case ``{"error": traceback or null, "loaded": whether the entry came from disk}`` and the
process's ``disk_cache_stats()``."""

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


def _flat(out):
    from torch.utils._pytree import tree_leaves

    leaves = []
    for t in tree_leaves(out):
        leaves.append(t)
        if hasattr(t, "__tensor_flatten__") and type(t) is not torch.Tensor:
            leaves += [getattr(t, a) for a in t.__tensor_flatten__()[0]]
    return leaves


def run(name: str) -> dict:
    try:
        fn, args = globals()[name]()
        jfn = thunder_subclass.jit(fn)
        with torch.no_grad():
            out, expected = jfn(*args), fn(*args)
        got, want = _flat(out), _flat(expected)
        assert [type(t) for t in got] == [type(t) for t in want]
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
        loaded = type(thunder.last_traces(jfn)[-1]).__name__ == "LoadedTrace"
        return {"error": None, "loaded": loaded}
    except BaseException:
        return {"error": traceback.format_exc(), "loaded": None}


if __name__ == "__main__":
    results = {name: run(name) for name in sys.argv[1:]}
    stats = thunder_subclass.disk_cache_stats()
    print(json.dumps({"results": results, "stats": stats}))
