"""Tensor metadata checks of a symbolic entry (sizes held by number proxies) run by torch's C++ tensor guard with the
symbolic dims dynamic (``None``), and the sizes tied to their numbers in Python (``guards.prologue``)."""

import pytest
import thunder
import torch

import thunder_subclass
from helpers import cache_counts
from thunder_subclass.guards import prologue

pytestmark = pytest.mark.filterwarnings("ignore:The 'symbolic values' cache option")


def _fused(jm):
    trace = thunder.last_prologue_traces(jm)[-1]
    (check,) = [b for b in trace.bound_symbols if b.sym.name == "check_prologue"]
    return trace, check.args[1]


def test_symbolic_sizes_are_checked_by_the_cpp_guard():
    model = torch.nn.Linear(4, 3)
    jm = thunder_subclass.jit(model, cache="symbolic values")
    for n in (2, 3, 5):
        x = torch.randn(n, 4)
        torch.testing.assert_close(jm(x), model(x))
    trace, checks = _fused(jm)
    assert not [b for b in trace.bound_symbols if b.sym.name == "check_tensor_metadata"]
    namespace = checks.fn.__globals__
    assert namespace["_tensor_guard"] is not prologue._no_guard  # made at the first call the checks accepted
    assert any(".shape[0] == v" in c for c in checks.conditions)
    misses = cache_counts(jm)[0]
    x = torch.randn(7, 4)
    torch.testing.assert_close(jm(x), model(x))  # another batch size: the same entry
    assert cache_counts(jm)[0] == misses
    x64 = torch.randn(7, 4, dtype=torch.float64)
    with pytest.raises(RuntimeError):
        model(x64)  # eager refuses a float64 input for a float32 weight...
    with pytest.raises(RuntimeError):
        jm(x64)  # ...and so does the new trace the miss makes
    assert cache_counts(jm)[0] == misses + 1


def test_a_size_tied_to_a_module_number_is_still_checked():
    model = torch.nn.Linear(4, 3)
    jm = thunder_subclass.jit(model, cache="symbolic values")
    for n in (2, 3):
        torch.testing.assert_close(jm(torch.ones(n, 4)), model(torch.ones(n, 4)))
    model.weight = torch.nn.Parameter(torch.randn(5, 4))  # another out_features than the module's number (3)
    model.bias = torch.nn.Parameter(torch.randn(5))
    torch.testing.assert_close(jm(torch.ones(2, 4)), model(torch.ones(2, 4)))
