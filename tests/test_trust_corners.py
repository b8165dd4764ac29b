"""Trust, issue 40's open corners: programs that raised or gave silent wrong results give eager's results.

* a reentrant ``torch.utils.checkpoint`` (``use_reentrant=True``, or left out) is a graph break, equal to eager;
  with ``fullgraph=True`` an ``UnsupportedCheckpointError``; the non-reentrant one is still traced;
* a native call that changes a Python object the trace did not make (``next`` on an iterator or generator from
  outside, a method that changes a ``set`` or ``deque`` held outside) is a graph break, equal to eager on every
  call; with ``fullgraph=True`` an ``UnsupportedGlobalStateError``;
* a parameter an eager call inside a compiled region does not reach keeps ``.grad`` None, as in eager.
"""

import itertools
import re
import warnings

import pytest
import thunder
import torch
import torch.utils.checkpoint as checkpoint

import thunder_subclass
from subclasses import TwoTensor
from thunder_subclass import GraphBreakWarning, UnsupportedCheckpointError
from thunder_subclass.errors import UnsupportedGlobalStateError

pytestmark = pytest.mark.filterwarnings("ignore::thunder_subclass.GraphBreakWarning")


# ---------------------------------------------------------------------------------------------------------------
# torch.utils.checkpoint with use_reentrant=True
# ---------------------------------------------------------------------------------------------------------------


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.tanh(self.lin(x))


class _Checkpointed(torch.nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block() for _ in range(2))
        self.head = torch.nn.Linear(4, 2)
        self.reentrant = reentrant

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint.checkpoint(block, x, use_reentrant=self.reentrant)
        return self.head(x)


def _twin(model):
    import copy

    return copy.deepcopy(model)


@pytest.mark.parametrize("reentrant", [True, False])
@pytest.mark.parametrize("kind", ["plain", "TwoTensor"])
def test_a_checkpointed_model_trains_as_eager(reentrant, kind):
    # issue 40: use_reentrant=True raised "TypeError: exceptions must derive from BaseException"
    torch.manual_seed(0)
    model = _Checkpointed(reentrant)
    eager = _twin(model)
    compiled = thunder_subclass.jit(model)
    for step in range(2):
        x = torch.randn(3, 4, requires_grad=True)
        if kind == "TwoTensor":
            x = TwoTensor(torch.randn(3, 4), torch.randn(3, 4)).requires_grad_()
        ex = x.detach().clone().requires_grad_()
        out, expected = compiled(x), eager(ex)
        torch.testing.assert_close(out, expected)
        assert type(out) is type(expected)
        out.sum().backward()
        expected.sum().backward()
        torch.testing.assert_close(x.grad, ex.grad)
        for p, p_ref in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, p_ref.grad)
    breaks = compiled.graph_breaks.breaks
    if reentrant:
        assert [b.name for b in breaks] == [""] and "UnsupportedCheckpointError" in breaks[0].reason
    else:
        assert breaks == []


def _checkpoint_in_function(x, w):
    return checkpoint.checkpoint(lambda a: (a @ w).sin(), x, use_reentrant=True).sum() * 2


def _checkpoint_without_flag(x, w):
    return checkpoint.checkpoint(lambda a: (a @ w).sin(), x).sum() * 2


@pytest.mark.parametrize("fn", [_checkpoint_in_function, _checkpoint_without_flag])
def test_a_reentrant_checkpoint_in_a_function_is_a_graph_break_equal_to_eager(fn):
    w = torch.randn(3, 3, requires_grad=True)
    jf = thunder_subclass.jit(fn)
    results = []
    for f in (fn, jf):
        x = torch.ones(3, 3, requires_grad=True)
        w.grad = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch's "use_reentrant should be passed explicitly"
            out = f(x, w)
        out.backward()
        results.append((out, x.grad, w.grad))
    torch.testing.assert_close(results[1], results[0])
    assert len(jf.graph_breaks.breaks) == 1


def test_a_reentrant_checkpoint_with_fullgraph_raises_a_typed_error():
    jf = thunder_subclass.jit(_checkpoint_in_function, fullgraph=True)
    line = _checkpoint_in_function.__code__.co_firstlineno + 1
    with pytest.raises(UnsupportedCheckpointError, match=rf"use_reentrant=True at .*test_trust_corners\.py:{line}: "
                       r".*Pass use_reentrant=False"):
        jf(torch.ones(3, 3), torch.ones(3, 3))
