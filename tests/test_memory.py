"""Memory (issue 24): a compiled function or module, and its parameters, are freed once the user drops them, whatever
ran (forward only, forward and backward, a backward for gradients of another kind, subclass parameters, torchao
int8 weights, optimizer steps). Measured with weak references after ``del`` and ``gc.collect()``: module-level
caches of the plugin (backward variants, guards, prologues, fake runs) must not keep them alive."""

import copy
import gc
import weakref

import pytest
import torch

import thunder_subclass
from subclasses import TwoTensor

N_MODELS = 2


def _model(kind: str) -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU())
    if kind == "subclass parameters":
        model[0].weight = torch.nn.Parameter(TwoTensor(torch.randn(8, 16), torch.randn(8, 16)))
    if kind == "torchao int8":
        tq = pytest.importorskip("torchao.quantization")
        tq.quantize_(model, tq.Int8WeightOnlyConfig())
    return model


def _use(kind: str, jm, model) -> None:
    x = torch.randn(4, 16)
    if kind in ("forward only", "torchao int8"):
        with torch.no_grad():
            jm(x)
        jm(x)  # grad mode on, nothing requires grad
    elif kind == "optimizer steps":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(2):
            opt.zero_grad()
            jm(x).sum().backward()
            opt.step()
    else:
        jm(x).sum().backward()
        jm(x).sum().backward()  # and a cache hit


KINDS = ["forward only", "forward and backward", "subclass parameters", "torchao int8", "optimizer steps",
         "deep copy"]


def _hits() -> int:
    from thunder_subclass.runtime import disk_cache

    return disk_cache.disk_cache_stats()["hits"]


@pytest.mark.parametrize("kind", KINDS)
def test_compiled_modules_and_parameters_are_freed(kind):
    # the first model's calls trace, the second's load the entries they stored from disk: both kinds are freed
    refs, hits = [], _hits()
    for _ in range(N_MODELS):
        model = _model(kind)
        jm = thunder_subclass.jit(model)
        if kind == "deep copy":
            _use(kind, jm, model)
            jm = copy.deepcopy(jm)
            model = jm._model
        _use(kind, jm, model)
        refs += [weakref.ref(jm), weakref.ref(model), *(weakref.ref(p) for p in model.parameters())]
        del model, jm
    gc.collect()
    alive = [r() for r in refs if r() is not None]
    assert alive == [], f"{len(alive)} of {len(refs)} objects alive: {[type(a).__name__ for a in alive]}"
    assert _hits() > hits


@pytest.mark.parametrize("gradient", ["of the output's kind", "of another kind"])
def test_compiled_function_with_backward_is_freed(gradient):
    """A function closing over a parameter; its backward run with a TwoTensor gradient (the compiled backward) or a
    plain one (a backward variant is built for it and kept with the compiled backward). The first function traces,
    the second loads its entry from disk (for a plain gradient it then traces the call again for the variant)."""
    refs, hits = [], _hits()
    for _ in range(N_MODELS):
        w = torch.nn.Parameter(torch.randn(3, 3))
        jf = thunder_subclass.jit(lambda t: (t @ w).sin())
        x = TwoTensor(torch.randn(3, 3), torch.randn(3, 3)).requires_grad_()
        out = jf(x)
        out.backward(torch.ones_like(out) if gradient == "of the output's kind" else torch.ones(out.shape))
        assert w.grad is not None
        refs += [weakref.ref(jf), weakref.ref(w)]
        del jf, w, x, out
    gc.collect()
    assert [r() for r in refs if r() is not None] == []
    assert _hits() == hits + N_MODELS - 1


def test_the_call_port_adds_no_reference_cycle():
    """Issue 42: the per-call policy handed to thunder's compile data (``_thunder_internals.CallPort``) holds nothing
    that holds the compile data, so a ``dynamic=True`` function (no reference cycle of thunder's own) is freed by
    reference counting alone, without the cycle collector."""
    import thunder

    gc.collect()
    gc.disable()
    try:
        jf = thunder_subclass.jit(lambda t: t * 2, dynamic=True, disk_cache=False)
        for n in (2, 3):
            torch.testing.assert_close(jf(torch.ones(n)), torch.full((n,), 2.0))
        cd = weakref.ref(thunder.compile_data(jf))
        del jf
        assert cd() is None
    finally:
        gc.enable()
