"""Graph breaks inside a compiled region (thunder_subclass/runtime/eager_calls.py): a submodule whose own code breaks
runs as one eager operation of its parent's trace, so the parents that broke only because of it compile (issue 26)."""

import warnings

import pytest
import thunder
import torch

import thunder_subclass
from thunder_subclass import GraphBreakWarning


class _Router(torch.nn.Module):
    """A data-dependent child (nonzero): its own code holds the break."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8))
        self.act = torch.nn.SiLU()

    def forward(self, x, *, scale=1.0):
        out = torch.zeros_like(x)
        idx = (x[:, 0] > 0).nonzero().squeeze(-1)
        out[idx] = self.act(x[idx] @ self.w) * scale
        return out


class _Block(torch.nn.Module):
    def __init__(self, call_with_keyword=False):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.router = _Router()
        self.norm = torch.nn.LayerNorm(8)
        self.call_with_keyword = call_with_keyword

    def forward(self, x):
        h = self.norm(self.lin(x))
        h = h / h.abs().amax()  # an in-place-free prefix of the call
        routed = self.router(h, scale=2.0) if self.call_with_keyword else self.router(h)
        return x + routed


class _Model(torch.nn.Module):
    def __init__(self, call_with_keyword=False):
        super().__init__()
        self.blocks = torch.nn.ModuleList([_Block(call_with_keyword), _Block(call_with_keyword)])
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _pair(cls=_Model, **kwargs):
    torch.manual_seed(0)
    eager = cls(**kwargs)
    model = cls(**kwargs)
    model.load_state_dict(eager.state_dict())
    return eager, model


def _quiet(jm):
    return thunder_subclass.runtime.graph_breaks.suppressed_warnings(jm)


@pytest.mark.parametrize("call_with_keyword", [False, True])
def test_the_breaking_child_is_one_eager_call_in_the_whole_models_trace(call_with_keyword):
    eager, model = _pair(call_with_keyword=call_with_keyword)
    jm = thunder_subclass.jit(model)
    with torch.no_grad(), _quiet(jm):
        for i in range(3):
            x = torch.randn(6 + i, 8)  # another size each call: the output is "like" its argument
            torch.testing.assert_close(jm(x), eager(x))
            report = jm.graph_breaks
            if i == 0:  # the first call runs the model's code eagerly, observing the router
                assert [b.name for b in report.breaks] == [""] and report.regions == {}
            else:
                assert [b.name for b in report.breaks] == ["blocks.0.router", "blocks.1.router"]
                assert list(report.regions) == [""]  # the router's activation runs as it is inside its eager call
    trace = str(thunder.last_traces(jm.graph_breaks.regions[""])[-1])
    assert trace.count("eager_module_call(") == 2
    assert "nonzero" not in trace


def test_training_through_the_eager_call_equals_eager():
    eager, model = _pair()
    jm = thunder_subclass.jit(model)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, model)]
    with _quiet(jm):
        for _ in range(3):
            x = torch.randn(6, 8, requires_grad=True)
            ex = x.detach().clone().requires_grad_()
            for opt in optimizers:
                opt.zero_grad()
            out, expected = jm(x), eager(ex)
            torch.testing.assert_close(out, expected)
            out.square().sum().backward()
            expected.square().sum().backward()
            # (compiled and eager sum in another order; the square and the steps grow the difference)
            torch.testing.assert_close(x.grad, ex.grad, rtol=1e-4, atol=1e-4)
            for (name, p), q in zip(model.named_parameters(), eager.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=name)
            for opt in optimizers:
                opt.step()
    region = jm.graph_breaks.regions[""]
    assert "eager_module_call_forward(" in str(thunder.last_traces(region)[-1])
    assert "eager_module_call_backward(" in str(thunder.last_backward_traces(region)[-1])
    # the router's own parameter got its gradient through the eager call's autograd graph (compared above)
    assert model.blocks[0].router.w.grad is not None


class _Positive(torch.nn.Module):
    def forward(self, x):
        return x[x > 0]  # an output whose shape depends on the data, not on the argument's shape


class _UsesPositive(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.pick = _Positive()

    def forward(self, x):
        y = self.lin(x)
        return self.pick(y).sum() * y


def test_an_output_that_differs_from_the_assumed_one_runs_the_parent_eagerly():
    eager, model = _pair(_UsesPositive)
    jm = thunder_subclass.jit(model)
    torch.manual_seed(1)
    inputs = [torch.randn(5, 4) for _ in range(4)]
    counts = [int((eager.lin(x) > 0).sum()) for x in inputs]
    assert len(set(counts[:2])) == 2  # the second call's output has another size than the observed one
    with torch.no_grad(), _quiet(jm):
        for i, x in enumerate(inputs):
            torch.testing.assert_close(jm(x), eager(x))
            if i == 1:  # traced with the first call's output size: the check caught it, the parent ran eagerly
                reasons = [b.reason for b in jm.graph_breaks.breaks]
                assert any(r.startswith("EagerCallMismatch: returned a Tensor of shape") for r in reasons)
    assert [b.name for b in jm.graph_breaks.breaks] == ["", "pick"]  # no longer recorded as one call


class _Counting(torch.nn.Module):
    """A breaking child with a side effect: it must run exactly once per call, so it is never an eager call."""

    def __init__(self, in_place):
        super().__init__()
        self.in_place = in_place
        self.register_buffer("seen", torch.zeros(()))
        self.calls = 0

    def forward(self, x):
        if self.in_place:
            self.seen.add_(1)
        else:
            self.calls += 1
        return torch.zeros_like(x).index_fill_(0, (x[:, 0] > 0).nonzero().squeeze(-1), 1.0)


class _UsesCounting(torch.nn.Module):
    def __init__(self, in_place):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.count = _Counting(in_place)

    def forward(self, x):
        return self.count(self.lin(x)) + 1


@pytest.mark.parametrize("in_place", [False, True], ids=["attribute", "buffer"])
def test_a_child_with_side_effects_is_not_an_eager_call(in_place):
    eager, model = _pair(_UsesCounting, in_place=in_place)
    jm = thunder_subclass.jit(model)
    with torch.no_grad(), _quiet(jm):
        for _ in range(3):
            x = torch.randn(5, 4)
            torch.testing.assert_close(jm(x), eager(x))
    assert model.count.calls == eager.count.calls and torch.equal(model.count.seen, eager.count.seen)
    assert [b.name for b in jm.graph_breaks.breaks] == ["", "count"]
    assert list(jm.graph_breaks.regions) == ["lin"]


class _ChangesItsInput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pick = _Positive()

    def forward(self, x):
        x.mul_(2)  # in place on an input before the call: running the parent again would double it
        return self.pick(x).sum() + x


def test_an_in_place_change_of_an_input_before_the_call_keeps_the_parent_eager():
    eager, model = _pair(_ChangesItsInput)
    jm = thunder_subclass.jit(model)
    with torch.no_grad(), _quiet(jm):
        for _ in range(3):
            x = torch.randn(5)
            ex = x.clone()
            torch.testing.assert_close(jm(x), eager(ex))
            torch.testing.assert_close(x, ex)  # changed once, as eager
    assert [b.name for b in jm.graph_breaks.breaks] == ["", "pick"]


def test_a_compiled_region_with_an_eager_call_warns_about_the_break_once():
    eager, model = _pair()
    jm = thunder_subclass.jit(model)
    x = torch.randn(6, 8)
    with torch.no_grad():
        with pytest.warns(GraphBreakWarning, match=r"nonzero"):
            jm(x)
        with warnings.catch_warnings():
            warnings.simplefilter("error", GraphBreakWarning)
            torch.testing.assert_close(jm(x), eager(x))  # now one region and eager calls: no new break location
    assert "" in jm.graph_breaks.regions


def test_a_trace_with_an_eager_call_is_not_stored_on_disk(tmp_path):
    from thunder_subclass.runtime import disk_cache

    config = thunder_subclass.config
    saved = (config.disk_cache, config.disk_cache_dir)
    config.disk_cache, config.disk_cache_dir = True, str(tmp_path)
    disk_cache.reset_disk_cache_stats()
    try:
        eager, model = _pair()
        for _ in range(2):  # a second jit would load what the first stored, as a restarted process would
            jm = thunder_subclass.jit(model)
            with torch.no_grad(), _quiet(jm):
                for _ in range(2):
                    x = torch.randn(6, 8)
                    torch.testing.assert_close(jm(x), eager(x))
            assert "" in jm.graph_breaks.regions
        stats = disk_cache.disk_cache_stats()
        assert stats["not_storable"] == 2 and stats["stores"] == stats["hits"] == 0  # (one whole-model trace per jit)
        assert "the computation calls a submodule eagerly" in stats["why_not_storable"][-1]
    finally:
        config.disk_cache, config.disk_cache_dir = saved
        disk_cache.reset_disk_cache_stats()


class _Thresholded(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.threshold = 0.0

    def forward(self, x):
        out = torch.zeros_like(x)
        idx = (x[:, 0] > self.threshold).nonzero().squeeze(-1)
        out[idx] = 1.0
        return out


class _SetsThreshold(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.gate = _Thresholded()

    def forward(self, x, threshold):
        self.gate.threshold = threshold  # written by the trace's epilogue, after its computation
        return self.gate(self.lin(x)) * x


def test_a_child_the_traced_code_wrote_to_before_the_call_is_not_an_eager_call():
    eager, model = _pair(_SetsThreshold)
    jm = thunder_subclass.jit(model)
    x = torch.randn(64, 4)
    with torch.no_grad(), _quiet(jm):
        for threshold in (0.0, 0.5, -0.5, 0.25):  # an eager call would see the previous call's threshold
            torch.testing.assert_close(jm(x, threshold), eager(x, threshold))
            assert model.gate.threshold == threshold
    assert [b.name for b in jm.graph_breaks.breaks] == ["", "gate"]


def test_after_a_first_call_in_regions_the_parents_are_traced_again_around_the_eager_call():
    eager, model = _pair()
    jm = thunder_subclass.jit(model)
    x = torch.randn(6, 8)
    with torch.no_grad():
        with thunder_subclass.explaining(jm):  # the first call compiles the children as regions
            torch.testing.assert_close(jm(x), eager(x))
        report = jm.graph_breaks
        # blocks.0 and its router broke; the router's eager run was observed, so blocks.1 (same class as blocks.0)
        # traced in the same call, with its router as an eager call
        assert [b.name for b in report.breaks] == ["", "blocks.0", "blocks.0.router", "blocks.1.router"]
        assert list(report.regions) == ["blocks.0.lin", "blocks.0.norm", "blocks.0.router.act", "blocks.1", "head"]
        with _quiet(jm):
            torch.testing.assert_close(jm(x), eager(x))
    assert list(jm.graph_breaks.regions) == [""]


class _MaybeTransposed(torch.nn.Module):
    def forward(self, x):
        n = int((x > 0).sum())  # a break (the value picks the layout: not speculated, it changes every call)
        return x.t().contiguous().t() if n % 2 else x * 1.0


class _ViewsTheOutput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.layout = _MaybeTransposed()

    def forward(self, x):
        return self.layout(self.lin(x)).view(-1) * 2


def test_an_output_of_another_layout_than_traced_runs_the_parent_eagerly():
    eager, model = _pair(_ViewsTheOutput)
    jm = thunder_subclass.jit(model)
    torch.manual_seed(3)
    inputs = [torch.randn(4, 4) for _ in range(8)]
    odd = [int((eager.lin(x) > 0).sum()) % 2 for x in inputs]
    assert 0 in odd[1:] and 1 in odd[1:]
    reasons = set()
    with torch.no_grad(), _quiet(jm):
        for x, o in zip(inputs, odd):
            if o:  # eager's view of the non-contiguous output raises; so does the program, run eagerly
                with pytest.raises(RuntimeError, match="view size is not compatible"):
                    eager(x)
                with pytest.raises(RuntimeError, match="view size is not compatible"):
                    jm(x)
            else:
                torch.testing.assert_close(jm(x), eager(x))
            reasons.update(b.reason for b in jm.graph_breaks.breaks)
    # the first odd call after the trace around the eager call (made for a contiguous output) fell back
    assert any("contiguous tensor where the traced run returned a contiguous one" in r for r in reasons)


def test_under_autocast_the_child_is_not_an_eager_call_and_the_program_equals_eager():
    eager, model = _pair()
    jm = thunder_subclass.jit(model)
    with torch.no_grad(), _quiet(jm), torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(3):
            x = torch.randn(6, 8)
            out, expected = jm(x), eager(x)
            assert out.dtype == expected.dtype == torch.bfloat16
            torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)
    report = jm.graph_breaks
    assert "" not in report.regions and "blocks.1" not in report.regions  # (the casts are not the eager call's)
    assert [b.name for b in report.breaks][:2] == ["", "blocks.0"]


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_a_compiled_model_with_eager_calls_is_freed(grad):
    import gc
    import weakref

    from thunder_subclass.runtime import eager_calls

    def run():
        eager, model = _pair()
        jm = thunder_subclass.jit(model)
        with torch.set_grad_enabled(grad), _quiet(jm):
            for _ in range(3):
                x = torch.randn(6, 8, requires_grad=grad)
                out = jm(x)
                if grad:
                    out.sum().backward()
        assert "" in jm.graph_breaks.regions
        return weakref.ref(model), weakref.ref(jm)

    model, jm = run()
    gc.collect()
    assert model() is None and jm() is None
    assert not eager_calls._graphs  # the autograd graphs of the eager calls went with their backward


class _SkippingExperts(torch.nn.Module):
    """A mixture-of-experts loop that skips the experts no token was routed to (as transformers' does): whether its
    output requires grad, and which experts get gradients, depends on the routing."""

    def __init__(self):
        super().__init__()
        self.experts = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(3)])

    def forward(self, x, probs):
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            idx = (probs[:, e] > 0.5).nonzero().squeeze(-1)
            if idx.numel() == 0:
                continue
            out[idx] = out[idx] + expert(x[idx]) * probs[idx, e, None]
        return out


class _RoutedMoE(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.router = torch.nn.Linear(8, 3)
        self.moe = _SkippingExperts()

    def forward(self, x):
        probs = self.router(x).softmax(-1)
        return x + self.moe(x, probs)


def test_gradients_flow_through_an_eager_call_whose_observed_run_routed_no_token():
    """The observed run routed no token to any expert (its output required no grad); later calls route tokens:
    the router's and the experts' gradients equal eager's (they came back None before)."""
    eager, model = _pair(_RoutedMoE)
    jm = thunder_subclass.jit(model)
    torch.manual_seed(2)
    inputs = [torch.zeros(4, 8)] + [torch.randn(6, 8) * 3 for _ in range(3)]
    with _quiet(jm):
        for i, x in enumerate(inputs):
            for m in (eager, model):
                m.zero_grad(set_to_none=True)
            out, expected = jm(x), eager(x)
            torch.testing.assert_close(out, expected)
            if i == 0:
                assert not expected.requires_grad  # nothing routed: no parameter reaches the output
                continue
            out.square().sum().backward()
            expected.square().sum().backward()
            for (name, p), q in zip(model.named_parameters(), eager.parameters()):
                if q.grad is None:  # an expert no token was routed to in this call: no gradient (or zeros)
                    assert p.grad is None or not p.grad.any(), name
                else:
                    torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=name)
            assert model.router.weight.grad is not None
    assert [b.name for b in jm.graph_breaks.breaks] == ["moe"] and "" in jm.graph_breaks.regions


class _Tallies(torch.nn.Module):
    """A breaking child whose Python state changes: a count in a dict it holds (every call), or a float it rebinds on
    the calls with a large input (not on the first, observed one)."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.stats = {"n": 0}
        self.scale = 1.0

    def forward(self, x):
        if self.kind == "dict":
            self.stats["n"] += 1
        elif float(x.abs().amax()) > 10:
            self.scale = self.scale + 1.0
        out = torch.zeros_like(x)
        idx = (x > 0).nonzero().squeeze(-1)
        out[idx] = x[idx]
        return out


class _ReadsTallies(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.tally = _Tallies(kind)

    def forward(self, x):
        y = self.tally(self.lin(x))
        return y * self.tally.scale + self.tally.stats["n"]  # read after the call: eager reads the new values


@pytest.mark.parametrize("kind", ["dict", "float"])
def test_a_child_that_changes_its_python_state_gives_eagers_values(kind):
    """A child that changes a dict it holds in place, or rebinds a float on a later call than the observed one: the
    parent reads the values the call left, as eager (the trace read them from before the call, off on every call)."""
    eager, model = _pair(_ReadsTallies, kind=kind)
    jm = thunder_subclass.jit(model)
    torch.manual_seed(4)
    inputs = [torch.zeros(4), torch.randn(4)] + [torch.randn(4) * 100 for _ in range(3)]  # the first two rebind nothing
    with torch.no_grad(), _quiet(jm):
        for x in inputs:
            torch.testing.assert_close(jm(x), eager(x))
            assert model.tally.stats == eager.tally.stats and model.tally.scale == eager.tally.scale


_calls_seen = []


class _CountsAndVaries(torch.nn.Module):
    """A breaking child whose output size depends on the data, that records each call outside itself (a module
    global) and updates a buffer on the calls with more than 4 positive inputs."""

    def __init__(self):
        super().__init__()
        self.register_buffer("updates", torch.zeros(()))

    def forward(self, x):
        _calls_seen.append(1)
        positive = x[x > 0]
        if positive.numel() > 4:
            self.updates.add_(1)
        return positive


class _UsesCountsAndVaries(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.pick = _CountsAndVaries()

    def forward(self, x):
        y = self.lin(x)
        return self.pick(y).sum() * y + self.pick.updates


@pytest.mark.parametrize("hooked", [False, True], ids=["plain", "hooked"])
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_a_mismatched_eager_call_does_not_run_the_child_again(grad, hooked):
    """The check after an eager call fails (another output size, a buffer changed): the parent runs eagerly with the
    result the child already gave, so the child (and its forward hook) runs once per call as in eager (it ran twice
    before), with eager's values and gradients."""
    eager, model = _pair(_UsesCountsAndVaries)
    hook_calls = []
    if hooked:
        model.pick.register_forward_hook(lambda m, a, out: hook_calls.append(1))
    jm = thunder_subclass.jit(model)
    torch.manual_seed(5)
    inputs = [torch.randn(8) for _ in range(6)]
    with torch.set_grad_enabled(grad), _quiet(jm):
        for x in inputs:
            for m in (eager, model):
                m.zero_grad(set_to_none=True)
            _calls_seen.clear()
            hook_calls.clear()
            out = jm(x)
            assert len(_calls_seen) == 1 and len(hook_calls) == int(hooked)
            expected = eager(x)
            torch.testing.assert_close(out, expected)
            assert torch.equal(model.pick.updates, eager.pick.updates)
            if grad:
                out.sum().backward()
                expected.sum().backward()
                for (name, p), q in zip(model.named_parameters(), eager.parameters()):
                    torch.testing.assert_close(p.grad, q.grad, msg=name)
    assert any(b.reason.startswith("EagerCallMismatch") for b in jm.graph_breaks.breaks) or \
        [b.name for b in jm.graph_breaks.breaks] == ["", "pick"]


class _ScaledLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x).tanh() * 2


class _MixedExperts(_SkippingExperts):
    """Experts of three kinds: torch.nn.Linear over plain tensors, a module of the user's, nn.Linear with a subclass
    weight."""

    def __init__(self):
        super().__init__()
        from torch.testing._internal.two_tensor import TwoTensor

        self.experts[1] = _ScaledLinear()
        w = self.experts[2].weight.detach()
        self.experts[2].weight = torch.nn.Parameter(TwoTensor(w.clone(), w.clone()), requires_grad=False)

    def forward(self, x, probs):  # every expert gets the tokens with a positive weight (all): each one runs
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            idx = (probs[:, e] > 0).nonzero().squeeze(-1)
            out[idx] = out[idx] + expert(x[idx]) * probs[idx, e, None]
        return out


class _MixedMoE(_RoutedMoE):
    def __init__(self):
        super().__init__()
        self.moe = _MixedExperts()


def test_inside_an_eager_call_torch_nn_leaves_over_plain_tensors_run_as_they_are():
    """A compiled region costs more per call than a single torch call (an expert's nn.Linear made the eager-call
    benchmark 4.6x eager): torch.nn's own leaf modules over plain tensors run as they are inside an eager call; a
    module of the user's, and a leaf holding a subclass tensor, are still compiled regions. Values equal eager."""
    eager, model = _pair(_MixedMoE)
    jm = thunder_subclass.jit(model)
    torch.manual_seed(4)
    with torch.no_grad(), _quiet(jm):
        for _ in range(3):
            x = torch.randn(6, 8) * 3
            torch.testing.assert_close(jm(x), eager(x))
    assert [b.name for b in jm.graph_breaks.breaks] == ["moe"]
    assert sorted(jm.graph_breaks.regions) == ["", "moe.experts.1", "moe.experts.2"]
