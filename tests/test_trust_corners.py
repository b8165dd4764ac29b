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


# ---------------------------------------------------------------------------------------------------------------
# Native calls that change an object from outside the trace
# ---------------------------------------------------------------------------------------------------------------


class _NumberedCalls(torch.nn.Module):
    """Numbers its calls with a property over ``itertools.count()``."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self._counter = itertools.count()

    @property
    def step(self):
        return next(self._counter)

    def forward(self, x):
        return self.lin(x) * (self.step + 1)


def test_a_property_over_itertools_count_numbers_the_calls_as_eager():
    # issue 40: TraceSelfCheckError on the first call (the prologue ran the property again)
    torch.manual_seed(0)
    model = _NumberedCalls()
    eager = _twin(model)
    compiled = thunder_subclass.jit(model)
    x = torch.randn(2, 4)
    for _ in range(3):
        torch.testing.assert_close(compiled(x), eager(x))
    assert next(model._counter) == next(eager._counter) == 3  # advanced once per call, as in eager
    assert "UnsupportedGlobalStateError: next() at" in compiled.graph_breaks.breaks[0].reason


def _gen():
    i = 0
    while True:
        yield float(i)
        i += 1


def _programs():
    """(name, make the outside state, the function of (x, state)): each changes an object it did not make."""
    import bisect
    import collections
    import heapq

    return [
        ("next on an iterator", lambda: iter(range(10)), lambda x, s: x * next(s)),
        ("next on itertools.count", itertools.count, lambda x, s: x * next(s)),
        ("next on a generator", _gen, lambda x, s: x * next(s)),
        ("sum consumes an iterator", lambda: iter(range(10)), lambda x, s: x * sum(itertools.islice(s, 2))),
        ("tuple consumes an iterator", lambda: iter(range(10)), lambda x, s: x * len(tuple(s))),
        ("dict of zip of an iterator", lambda: iter(range(10)), lambda x, s: x * len(dict(zip(s, s)))),
        ("set.add", set, lambda x, s: (s.add(len(s)), x * len(s))[1]),
        ("deque.popleft", lambda: collections.deque([1.0, 2.0, 3.0, 4.0]), lambda x, s: x * s.popleft()),
        ("OrderedDict.move_to_end", lambda: collections.OrderedDict(a=1.0, b=2.0),
         lambda x, s: (s.move_to_end(next(iter(s))), x * list(s.values())[0])[1]),
        ("defaultdict's missing key", lambda: collections.defaultdict(int), lambda x, s: x * len(s) + s[len(s)]),
        ("heapq.heappush on a list", lambda: [3.0, 4.0], lambda x, s: (heapq.heappush(s, 1.0), x * len(s))[1]),
        ("bisect.insort on a list", lambda: [3.0, 4.0], lambda x, s: (bisect.insort(s, 3.5), x * len(s))[1]),
        ("bytearray.append", bytearray, lambda x, s: (s.append(1), x * len(s))[1]),
    ]


@pytest.mark.parametrize("name, make, fn", _programs(), ids=[p[0] for p in _programs()])
@pytest.mark.parametrize("how", ["global", "argument"])
def test_a_native_call_that_changes_an_outside_object_gives_eagers_values_on_every_call(name, make, fn, how):
    # issue 40: each gave the first call's answer on every call (or TraceSelfCheckError) and changed the object once
    results, states = [], []
    for compile_it in (False, True):
        state = make()
        if how == "global":
            g = {"state": state, "fn": fn}
            exec("def f(x):\n    return fn(x, state)\n", g)
            f = g["f"]
        else:
            def f(x, s=None, _fn=fn):
                return _fn(x, s)
        call = thunder_subclass.jit(f) if compile_it else f
        args = () if how == "global" else (state,)
        results.append([call(torch.ones(2), *args) for _ in range(3)])
        states.append(state)
    torch.testing.assert_close(results[1], results[0])
    eager_state, compiled_state = states
    if hasattr(eager_state, "__next__"):  # an iterator: at the same place
        assert next(compiled_state, None) == next(eager_state, None)
    else:
        assert compiled_state == eager_state


def test_a_native_call_that_changes_an_outside_object_with_fullgraph_raises():
    import collections

    queue = collections.deque([1.0, 2.0])

    def f(x):
        return x * queue.popleft()

    line = f.__code__.co_firstlineno + 1
    with pytest.raises(UnsupportedGlobalStateError, match=rf"deque\.popleft\(\) at .*test_trust_corners\.py:{line} "
                       r"changes a deque object that the compiled function reads from outside .*Make the object "
                       r"inside the compiled function"):
        thunder_subclass.jit(f, fullgraph=True)(torch.ones(2))
    assert list(queue) == [1.0, 2.0]  # refused before it ran


def test_iterators_and_containers_the_trace_makes_or_only_reads_are_no_break():
    table, pairs = {"a": 1.0, "b": 2.0}, [1.0, 2.0, 3.0]
    chosen = {1, 2}

    def f(x):
        y = sum(x * v for v in pairs) + sum(x * i * v for i, (v, w) in enumerate(zip(pairs, (1.0, 2.0))))
        y = y + x * max(table.values()) * sorted(chosen)[0] + x * next(iter(pairs)) + x * next(itertools.count(2))
        made = {3}
        made.add(4)
        return y * len(made)

    jf = thunder_subclass.jit(f, fullgraph=True)
    for _ in range(2):
        torch.testing.assert_close(jf(torch.ones(2)), f(torch.ones(2)))
    assert thunder.cache_misses(jf) == 1 and thunder.cache_hits(jf) == 1


# ---------------------------------------------------------------------------------------------------------------
# Parameters an eager call inside a compiled region does not reach
# ---------------------------------------------------------------------------------------------------------------


class _Experts(torch.nn.Module):
    """Routes each row to one of two experts by the sign of its first feature (``torch.where(mask)``: a graph break,
    so this module becomes an eager call inside its parent's trace)."""

    def __init__(self):
        super().__init__()
        self.experts = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2))

    def forward(self, x):
        out = torch.zeros_like(x)
        route = x[:, 0] > 0
        for i, expert in enumerate(self.experts):
            rows = torch.where(route if i == 0 else ~route)[0]
            if rows.numel():
                out = out.index_add(0, rows, expert(x[rows]))
        return out


class _Routed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj, self.moe, self.head = torch.nn.Linear(4, 4), _Experts(), torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.moe(x) + self.proj(x))


def _batch(step):
    x = torch.randn(6, 4)
    if step >= 2:  # every row to expert 0: expert 1 gets no gradient
        x[:, 0] = x[:, 0].abs()
    return x


def test_a_parameter_an_eager_call_does_not_reach_keeps_grad_none_as_in_eager():
    # issue 40: expert 1's parameters got zero gradients, and weight decay / momentum then moved them
    torch.manual_seed(0)
    model = _Routed()
    eager = _twin(model)
    compiled = thunder_subclass.jit(model)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1) for m in (model, eager)]
    for step in range(5):
        x = _batch(step)
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        compiled(x).sum().backward()
        eager(x).sum().backward()
        for (name, p), p_ref in zip(model.named_parameters(), eager.parameters()):
            assert (p.grad is None) == (p_ref.grad is None), (step, name)
            if p.grad is not None:
                torch.testing.assert_close(p.grad, p_ref.grad)
        if step >= 2:
            assert all(p.grad is None for p in model.moe.experts[1].parameters())
        for opt in opts:
            opt.step()
        for p, p_ref in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p, p_ref)
    assert [b.name for b in compiled.graph_breaks.breaks] == ["moe"]
    assert "moe" not in compiled.graph_breaks.regions  # an eager call inside the compiled parent


def test_an_unreached_parameter_keeps_its_old_gradient_and_autograd_grad_leaves_no_hook():
    torch.manual_seed(0)
    model = _Routed()
    eager = _twin(model)
    compiled = thunder_subclass.jit(model)
    for step in range(2):  # both experts reached: every parameter has a gradient
        x = _batch(step)
        compiled(x).sum().backward()
        eager(x).sum().backward()
    x = _batch(2)
    compiled(x).sum().backward()  # expert 1 not reached, no zero_grad: its gradient stays what it was, as in eager
    eager(x).sum().backward()
    for p, p_ref in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad)
    model.zero_grad(set_to_none=True)
    eager.zero_grad(set_to_none=True)
    inp = _batch(2).requires_grad_()
    (g,) = torch.autograd.grad(compiled(inp).sum(), inp)  # accumulates into no parameter
    (g_ref,) = torch.autograd.grad(eager(inp).sum(), inp)
    torch.testing.assert_close(g, g_ref)
    assert all(p.grad is None for p in model.parameters())
    x = torch.zeros(6, 4)  # every row to expert 1, which is reached with a weight gradient of exact zeros
    compiled(x).sum().backward()
    eager(x).sum().backward()
    expert = model.moe.experts[1]
    assert expert.weight.grad is not None and not expert.weight.grad.any()  # zeros, as eager's
    assert all(p.grad is None for p in model.moe.experts[0].parameters())
    for p, p_ref in zip(model.parameters(), eager.parameters()):
        assert (p.grad is None) == (p_ref.grad is None)
        if p.grad is not None:
            torch.testing.assert_close(p.grad, p_ref.grad)


def test_a_log_record_written_inside_the_compiled_function_is_written_on_every_call():
    # the handler's stream.write changes the stream: a graph break (it raised UnsupportedTracingError before)
    import io
    import logging

    stream = io.StringIO()
    logger = logging.getLogger("thunder_subclass.tests.trust_corners")
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False

    def f(x):
        logger.info("step")
        return x * 2

    try:
        jf = thunder_subclass.jit(f)
        for _ in range(3):
            torch.testing.assert_close(jf(torch.ones(2)), torch.full((2,), 2.0))
    finally:
        logger.removeHandler(handler)
    assert stream.getvalue() == "step\n" * 3


def _pairs_of(x, a, b):
    return x * len(dict(zip(a, b, strict=True)))


@pytest.mark.parametrize("fullgraph", [True, False])
def test_dict_of_an_iterable_that_raises_raises_as_eager(fullgraph):
    # thunder's dict(...) wrapper dropped the exception: an empty dict, x * 0
    with pytest.raises(ValueError, match=r"zip\(\) argument 2 is shorter than argument 1"):
        _pairs_of(torch.ones(1), [1, 2, 3], [4, 5])
    with pytest.raises(ValueError, match=r"zip\(\) argument 2 is shorter than argument 1"):
        thunder_subclass.jit(_pairs_of, fullgraph=fullgraph)(torch.ones(1), [1, 2, 3], [4, 5])
