"""Graph breaks (issue 26): programs thunder cannot trace as one graph run as compiled regions with the untraceable
code eager, equal to eager (values, types, gradients); the warning, ``graph_breaks`` / ``explain``, the cached
decision, ``fullgraph=True``; tiny Hugging Face models (dynamic RoPE Llama, Mixtral) against eager."""

import re
import traceback
import warnings

import pytest
import torch

import thunder
import thunder_subclass
from thunder_subclass import GraphBreakWarning, SubclassDispatchError, UnsupportedSubclassOperationError
from subclasses import TwoTensor
from helpers import tiny_causal_lm


def _item_branch(x, w):
    y = x * w
    if y.sum().item() > 0:  # speculated: traced once per branch, the value checked by the prologue
        return y * 2
    return y - 1


def _mask_rows(x, w):
    y = x * w
    return y[y > 0] * 2  # the break: a shape that depends on data


_MASK_LINE = _mask_rows.__code__.co_firstlineno + 2


def _two_tensor(sign):
    a = (sign * torch.rand(4, 3) + 0.1 * sign).requires_grad_()
    return TwoTensor(a, a.detach().clone().requires_grad_())


def _assert_same_training(jf, f, sign):
    x, w = _two_tensor(sign), torch.rand(3, requires_grad=True)
    ex, ew = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    out = jf(x, w)
    expected = f(ex, ew)
    assert type(out) is TwoTensor
    torch.testing.assert_close(out.a, expected.a)
    torch.testing.assert_close(out.b, expected.b)
    out.sum().backward()
    expected.sum().backward()
    assert type(x.grad) is TwoTensor
    torch.testing.assert_close(x.grad.a, ex.grad.a)
    torch.testing.assert_close(w.grad, ew.grad)


def test_item_branch_on_twotensor_is_one_program_per_branch():
    jf = thunder_subclass.jit(_item_branch)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GraphBreakWarning)
        for sign in (1.0, 1.0, -1.0, -1.0, 1.0):
            _assert_same_training(jf, _item_branch, sign)
    assert jf.graph_breaks.breaks == [] and list(jf.graph_breaks.regions) == [""]
    assert thunder.cache_misses(jf) == 2 and thunder.cache_hits(jf) == 3  # one trace per branch
    assert "check_speculation" in str(thunder.last_prologue_traces(jf)[-1])
    assert "ltorch.mul(y, 2)" in str(thunder.last_traces(jf)[0])  # the branch taken for a positive sum


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_data_dependent_shape_on_twotensor_runs_eagerly_equal_to_eager(sign):
    jf = thunder_subclass.jit(_mask_rows)
    with pytest.warns(GraphBreakWarning, match=rf"ran as 0 compiled region.*\n.*test_graph_breaks\.py:{_MASK_LINE}: "
                                               r"UnsupportedSubclassOperationError: torch\.Tensor\.__getitem__ on TwoTensor"):
        _assert_same_training(jf, _mask_rows, sign)
    report = jf.graph_breaks
    assert [(b.name, b.location) for b in report.breaks] == [("", f"{__file__}:{_MASK_LINE}")]
    assert report.regions == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", GraphBreakWarning)  # once per break location
        _assert_same_training(jf, _mask_rows, sign)
    assert thunder.cache_misses(jf) == 1  # the decision is cached: the same signature is not traced again


def test_fullgraph_keeps_the_typed_error():
    x, w = _two_tensor(1.0), torch.rand(3)
    with pytest.raises(UnsupportedSubclassOperationError,
                       match=rf"torch\.Tensor\.__getitem__ on TwoTensor at .*test_graph_breaks\.py:{_MASK_LINE} "
                             r"makes a data-dependent computation"):
        thunder_subclass.jit(_mask_rows, fullgraph=True)(x, w)
    assert not hasattr(thunder_subclass.jit(_mask_rows, fullgraph=True), "graph_breaks")


def test_another_signature_is_traced_again():
    def f(x, check: bool):
        if check:  # data-dependent only when check is True
            return x[x > 0] * 2
        return x + 1

    jf = thunder_subclass.jit(f)
    x = torch.randn(5)
    with pytest.warns(GraphBreakWarning, match=r"boolean advanced indexing"):
        torch.testing.assert_close(jf(x, True), f(x, True))
    assert len(jf.graph_breaks.breaks) == 1
    torch.testing.assert_close(jf(x, False), f(x, False))
    assert jf.graph_breaks.breaks == [] and list(jf.graph_breaks.regions) == [""]  # traced whole
    assert thunder.cache_misses(jf) == 2 == thunder.cache_misses(jf.graph_breaks.regions[""])
    assert "ltorch.add" in str(thunder.last_traces(jf)[-1])


class _Router(torch.nn.Module):
    """Data-dependent: keeps the rows whose first feature is positive (boolean masking), scaled."""

    def forward(self, h):
        keep = h[:, 0] > 0
        out = torch.zeros_like(h)
        out[keep] = h[keep] * 2
        return out


class _Block(torch.nn.Module):
    def __init__(self, weight):
        super().__init__()
        self.weight = torch.nn.Parameter(weight)

    def forward(self, h):
        return torch.nn.functional.linear(h, self.weight).relu()


class _Model(torch.nn.Module):
    def __init__(self, make):
        super().__init__()
        self.blocks = torch.nn.ModuleList([_Block(make()), _Block(make())])
        self.router = _Router()
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        h = self.blocks[0](x)
        h = self.router(h)
        h = self.blocks[1](h)
        return self.head(h)


def _models():
    torch.manual_seed(0)
    weights = [torch.randn(4, 4) for _ in range(2)]
    def make():  # equal halves (one routing for both), separate storages
        w = weights.pop(0)
        return TwoTensor(w, w.clone())

    model = _Model(make)
    eager = _Model(lambda: TwoTensor(torch.zeros(4, 4), torch.zeros(4, 4)))
    eager.load_state_dict(model.state_dict())
    return eager, model


def test_module_runs_as_regions_around_the_data_dependent_child_with_training_equal_to_eager():
    eager, model = _models()
    jmodel = thunder_subclass.jit(model)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, model)]
    x = torch.randn(6, 4)
    # the first call runs the model's code eagerly, observing the router (whose own code holds the break); its
    # argument is a TwoTensor, so it cannot be an eager call: from the second call the model's children are regions
    with pytest.warns(GraphBreakWarning, match=r"ran as 0 compiled region\(s\) with the code at 1 graph break\(s\) "
                                               r"run eagerly:\n.*test_graph_breaks\.py:\d+: UnsupportedSubclass"
                                               r"OperationError: torch\.Tensor\.__getitem__ on TwoTensor .*"
                                               r"\(ran eagerly: <top>\)\nThis call ran the code around the break\(s\) "
                                               r"eagerly and observed the calls of _Router"):
        jmodel(x)
    for _ in range(2):
        for opt in optimizers:
            opt.zero_grad()
        expected, out = eager(x), jmodel(x)
        torch.testing.assert_close(out, expected)
        out.sum().backward()
        expected.sum().backward()
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            assert type(p.grad) is type(q.grad), name
            torch.testing.assert_close(p.grad, q.grad, msg=name)
        for opt in optimizers:
            opt.step()
    report = jmodel.graph_breaks
    assert [b.name for b in report.breaks] == ["", "router"]
    assert list(report.regions) == ["blocks.0", "blocks.1", "head"]
    # blocks of one class share one jitted function: a trace per input kind (blocks.0 gets a plain tensor, blocks.1
    # the router's TwoTensor), reused in the later steps
    blocks = report.regions["blocks.0"]
    assert report.regions["blocks.1"] is blocks
    assert thunder.cache_misses(blocks) == 2
    assert "TwoTensor[" in str(thunder.last_traces(blocks)[0])  # the subclass weight crossed as a subclass
    assert thunder.cache_misses(jmodel) == 1  # the whole model was tried once
    assert "eager" not in model.blocks[0].__dict__ and "forward" not in model.blocks[0].__dict__  # restored


def test_a_subclass_output_crosses_the_break_as_a_subclass():
    class Scale(torch.nn.Module):
        def forward(self, t):
            return t * 3

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = Scale()

        def forward(self, t):
            u = self.scale(t)
            return self.scale(u[u > 0])  # the break, on the region's TwoTensor output

    x = TwoTensor(torch.rand(3), torch.rand(3))
    m = M()
    jm = thunder_subclass.jit(m)
    with pytest.warns(GraphBreakWarning, match=r"torch\.Tensor\.__getitem__ on TwoTensor"):
        out = jm(x)
    expected = m(x)
    assert type(out) is TwoTensor
    torch.testing.assert_close(out.a, expected.a)
    torch.testing.assert_close(out.b, expected.b)
    assert list(jm.graph_breaks.regions) == ["scale"]


class _FailingMatmulTensor(TwoTensor):
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.mm.default:
            raise ValueError("_FailingMatmulTensor does not support mm")
        return super().__torch_dispatch__(func, types, args, kwargs)

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return _FailingMatmulTensor(inner["a"], inner["b"], outer_size, outer_stride)


def test_errors_of_other_kinds_are_raised_not_run_eagerly():
    x = _FailingMatmulTensor(torch.randn(2, 2), torch.randn(2, 2))
    jf = thunder_subclass.jit(lambda t: t @ t)
    with pytest.raises(SubclassDispatchError, match=r"torch\.Tensor\.matmul on _FailingMatmulTensor failed while "
                                                     r"tracing .*ValueError: _FailingMatmulTensor does not support mm"):
        jf(x)
    assert thunder_subclass.runtime.graph_breaks.graph_break_reason(ValueError("x")) is None


def test_explain_lists_breaks_and_regions_without_warning():
    eager, model = _models()
    with warnings.catch_warnings():
        warnings.simplefilter("error", GraphBreakWarning)
        report = thunder_subclass.explain(model, torch.randn(6, 4))
    assert [b.name for b in report.breaks] == ["", "router"]
    assert list(report.regions) == ["blocks.0", "blocks.1", "head"]
    assert report.region_calls == 3 and report.compiled_functions == [report.regions["blocks.0"],
                                                                       report.regions["head"]]
    assert re.match(r"1 graph break\(s\), 3 compiled region\(s\) \(2 compiled function\(s\), 3 region call\(s\)\)\n"
                    r"  break at .*test_graph_breaks\.py:\d+: UnsupportedSubclassOperationError: torch\.Tensor\."
                    r"__getitem__ on TwoTensor", str(report))


# The break's location is the line that raised, whatever ran between it and the function's frame: a `with` block's
# __exit__ (torch.no_grad(), as in transformers' MoE experts), a `finally`, a context manager or an `except` block that
# raise another error because of the break (thunder 0.2.6 reported the `with` / `finally` line or the `def` line, or
# lost the break's error to the second one)

class _FailsOnError:
    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is not None:
            raise RuntimeError("cleanup failed")


def _rows_in_no_grad(x):
    y = x * 2
    with torch.no_grad():
        idx = (y > 0).nonzero()  # break
    return y[idx[:, 0]]


def _rows_in_finally(x):
    y = x * 2
    try:
        idx = (y > 0).nonzero()  # break
    finally:
        y = y + 1
    return y[idx[:, 0]]


def _rows_in_failing_exit(x):
    y = x * 2
    with _FailsOnError():
        idx = (y > 0).nonzero()  # break
    return y[idx[:, 0]]


def _rows_in_failing_except(x):
    y = x * 2
    try:
        idx = (y > 0).nonzero()  # break
    except NotImplementedError:
        raise ValueError("not on this input")
    return y[idx[:, 0]]


def _positive_rows(y):
    return (y > 0).nonzero()  # break


def _rows_in_callee_under_with(x):
    y = x * 2
    with torch.no_grad(), _FailsOnError():
        idx = _positive_rows(y)
    return y[idx[:, 0]]


def _break_line(fn) -> str:
    import inspect

    lines, first = inspect.getsourcelines(fn)
    (offset,) = [i for i, line in enumerate(lines) if line.rstrip().endswith("# break")]
    return f"{inspect.getsourcefile(fn)}:{first + offset}"


@pytest.mark.parametrize("fn, breaking", [
    (_rows_in_no_grad, _rows_in_no_grad), (_rows_in_finally, _rows_in_finally),
    (_rows_in_failing_exit, _rows_in_failing_exit), (_rows_in_failing_except, _rows_in_failing_except),
    (_rows_in_callee_under_with, _positive_rows),
], ids=lambda v: v.__name__)
def test_break_location_is_the_line_that_raised_through_with_and_finally(fn, breaking):
    line = _break_line(breaking)
    x = torch.randn(8)
    jf = thunder_subclass.jit(fn)
    with pytest.warns(GraphBreakWarning, match=rf"{re.escape(line)}: NotImplementedError: .*nonzero.*"
                                               rf"DynamicOutputShapeException"):
        out = jf(x)
    torch.testing.assert_close(out, fn(x))
    assert [(b.name, b.location) for b in jf.graph_breaks.breaks] == [("", line)]
    assert [(b.name, b.location) for b in thunder_subclass.explain(fn, x).breaks] == [("", line)]
    # fullgraph=True raises what CPython would: the break's error with a traceback that names its line, or the error
    # that its handling raised, with the break's error as __context__
    with pytest.raises(Exception) as info:
        thunder_subclass.jit(fn, fullgraph=True)(x)
    err = info.value
    if type(err) in (RuntimeError, ValueError):
        assert str(err) in ("cleanup failed", "not on this input")
        err = err.__context__
    assert type(err) is NotImplementedError and "nonzero" in str(err)
    if fn is not _rows_in_failing_exit and fn is not _rows_in_failing_except:
        user_frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == __file__]
        assert f"{user_frames[-1].filename}:{user_frames[-1].lineno}" == line


# Hugging Face models: tiny random configs, no download

def _llama_dynamic_rope():
    pytest.importorskip("transformers")
    tq = pytest.importorskip("torchao.quantization")
    model = tiny_causal_lm("llama", rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    tq.quantize_(model, tq.Int8WeightOnlyConfig())
    return model


def _input_ids(batch=2, seq=8):
    return torch.randint(0, 256, (batch, seq), generator=torch.Generator().manual_seed(1))


@pytest.mark.slow
def test_llama_with_dynamic_rope_forward_and_generate_is_one_program():
    # `if torch.max(position_ids) + 1 > self.max_seq_len_cached:` (transformers' dynamic RoPE update) is speculated:
    # the whole forward is one trace whose prologue checks the comparison (torch.compile: 6 graphs, 6 breaks)
    model = _llama_dynamic_rope()
    ids = _input_ids()
    with torch.no_grad():
        expected_logits = model(ids).logits
        expected_tokens = model.generate(ids, do_sample=False, pad_token_id=0, max_new_tokens=2)
    with torch.no_grad():
        torch.testing.assert_close(thunder_subclass.jit(model.forward, fullgraph=True)(ids).logits,
                                   expected_logits)
    # the compiled forward plugged into generate, as users of generate do
    model.forward = jforward = thunder_subclass.jit(model.forward)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", GraphBreakWarning)
        torch.testing.assert_close(jforward(ids).logits, expected_logits)
        tokens = model.generate(ids, do_sample=False, pad_token_id=0, max_new_tokens=2)
    assert torch.equal(tokens, expected_tokens)
    assert list(jforward.graph_breaks.regions) == [""] and jforward.graph_breaks.breaks == []
    reasons = thunder_subclass.explain_recompiles(jforward)
    assert thunder.cache_misses(jforward) <= 3, reasons  # forward; generate's prefill; its decode steps (symbolic)
    prologue = str(thunder.last_prologue_traces(jforward)[0])
    assert "check_speculation(" in prologue  # max_seq_len_cached and position_ids: the inputs the branch reads
    # (torchao 0.18's weight type; 0.16, the torch 2.10 stack's, makes AffineQuantizedTensor)
    assert any(f"{t}[" in str(thunder.last_traces(jforward)[0]) for t in ("Int8Tensor", "AffineQuantizedTensor"))


def _eager_experts(config_name, model_name, **sizes):
    transformers = pytest.importorskip("transformers")
    config = getattr(transformers, config_name)(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                                num_key_value_heads=2, vocab_size=256, num_experts_per_tok=2, **sizes)
    if not hasattr(config, "_experts_implementation"):
        pytest.skip(f"transformers {transformers.__version__} has no experts implementations")
    config._experts_implementation = "eager"  # the per-expert loop: nonzero / torch.where routing
    torch.manual_seed(0)
    return getattr(transformers, model_name)(config).eval()


def _mixtral_eager_experts():
    return _eager_experts("MixtralConfig", "MixtralForCausalLM", intermediate_size=64, num_local_experts=4)


def _qwen2_moe_eager_experts():
    return _eager_experts("Qwen2MoeConfig", "Qwen2MoeForCausalLM", intermediate_size=64, moe_intermediate_size=32,
                          shared_expert_intermediate_size=64, num_experts=4)


def _routing_line(experts_class) -> str:
    """file:line of the experts' `nonzero` (the data-dependent routing, inside `with torch.no_grad():`), from the
    installed transformers' source."""
    import inspect

    lines, first = inspect.getsourcelines(experts_class.forward)
    (offset,) = [i for i, line in enumerate(lines) if ".nonzero()" in line]
    return f"{inspect.getsourcefile(experts_class)}:{first + offset}"


@pytest.mark.slow
def test_mixtral_with_data_dependent_routing_forward_and_generate():
    model = _mixtral_eager_experts()
    ids = _input_ids()
    with torch.no_grad():
        expected_logits = model(ids).logits
        expected_tokens = model.generate(ids, do_sample=False, pad_token_id=0, max_new_tokens=2)
    model.forward = jforward = thunder_subclass.jit(model.forward)
    # the break is the line that raised (nonzero, under `with torch.no_grad():`), not the experts' `def forward`
    line = _routing_line(type(model.model.layers[0].mlp.experts))
    with torch.no_grad(), pytest.warns(GraphBreakWarning, match=rf"{re.escape(line)}: NotImplementedError: .*nonzero"
                                                               rf".*DynamicOutputShapeException"):
        torch.testing.assert_close(jforward(ids).logits, expected_logits)
    report = jforward.graph_breaks
    # the first call ran the model's code eagerly, observing the experts (whose own code holds the break)
    assert [b.name for b in report.breaks] == [""] and report.regions == {}
    assert {b.location for b in report.breaks} == {line}
    assert all("DynamicOutputShapeException" in b.reason for b in report.breaks)
    _assert_one_region_around_the_eager_experts(jforward, ids, expected_logits)
    with torch.no_grad():
        tokens = model.generate(ids, do_sample=False, pad_token_id=0, max_new_tokens=2)
    assert torch.equal(tokens, expected_tokens)
    assert [b.name for b in report.breaks] == ["model.layers.0.mlp.experts"] and "" in report.regions  # generate


def _assert_one_region_around_the_eager_experts(jforward, ids, expected_logits):
    """From the second call on, the model is one compiled region and the experts (whose own code holds the break)
    one eager call in its trace (eager_calls.py); torch.compile has 10-11 graphs on these one-layer models."""
    with torch.no_grad():
        torch.testing.assert_close(jforward(ids).logits, expected_logits)
    report = jforward.graph_breaks
    assert [b.name for b in report.breaks] == ["model.layers.0.mlp.experts"]
    assert list(report.regions) == [""] and report.region_calls == 1  # (the experts' activation runs as it is)
    assert "eager_module_call(" in str(thunder.last_traces(report.regions[""])[-1])


def test_router_normalisation_gradient_equal_to_eager():
    # thunder 0.2.6 saved `values` for the division's derivative and then overwrote it in place: a wrong gradient
    # (plain thunder.jit too); the forward now saves a clone taken before the in-place update
    def route(w, h):
        values, _ = torch.topk(torch.softmax(h @ w.t(), -1), 2, dim=-1)
        values /= values.sum(dim=-1, keepdim=True)
        return values

    torch.manual_seed(0)
    w, h, grad = torch.randn(4, 8), torch.randn(5, 8), torch.randn(5, 2)
    ew, jw = w.clone().requires_grad_(), w.clone().requires_grad_()
    route(ew, h).backward(grad)
    thunder_subclass.jit(route)(jw, h).backward(grad)
    torch.testing.assert_close(jw.grad, ew.grad)


def test_a_branch_on_item_of_a_plain_tensor_is_guarded_not_baked():
    # thunder 0.2.6 gives x.sum().item() no value while tracing, and `n > 0` a made-up one (False): the trace took
    # the else branch for every input, silently (plain thunder.jit too). Here the value is computed while tracing
    # and checked by the prologue: the other branch is a cache miss and a trace of its own
    def f(x):
        n = x.sum().item()
        if n * 2 > 1:
            return x * 2
        return x - 1

    jf = thunder_subclass.jit(f, fullgraph=True)
    for x in (torch.ones(3), -torch.ones(3), 2 * torch.ones(3), -2 * torch.ones(3)):
        torch.testing.assert_close(jf(x), f(x))
    assert thunder.cache_misses(jf) == 2 and thunder.cache_hits(jf) == 2
    (reason,) = thunder_subclass.explain_recompiles(jf)[-1:]  # the miss of -1s: the entry made for 1s said why
    assert re.search(r"test_graph_breaks\.py:\d+ \(number of data\) was True when traced and is False now", reason)


def test_a_value_that_changes_every_call_stops_being_speculated_and_breaks():
    def f(x):
        n = int(x.sum())  # a new value on every call
        return x * n

    jf = thunder_subclass.jit(f)
    calls = thunder_subclass.runtime.speculation.SPECULATION_LIMIT + 2
    with pytest.warns(GraphBreakWarning, match=r"the value at .*test_graph_breaks\.py:\d+ \(int of a value computed "
                                               r"from tensor data\) took 4 different values"):
        for i in range(calls):
            x = torch.full((3,), float(i))
            torch.testing.assert_close(jf(x), f(x))
    assert thunder.cache_misses(jf) == thunder_subclass.runtime.speculation.SPECULATION_LIMIT + 1  # 4 traces, 1 failed
    assert len(jf.graph_breaks.breaks) == 1


@pytest.mark.parametrize("limit", [2, None])
def test_the_speculation_limit_is_a_setting(monkeypatch, limit):
    def f(x):
        n = int(x.sum())  # a new value on every call
        return x * n

    monkeypatch.setattr(thunder_subclass.config, "speculation_limit", limit)
    jf = thunder_subclass.jit(f, cache_size_limit=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(6):
            x = torch.full((3,), float(i))
            torch.testing.assert_close(jf(x), f(x))
    breaks = [w for w in caught if issubclass(w.category, GraphBreakWarning)]
    if limit is None:  # every value speculated: one trace each, no break
        assert thunder.cache_misses(jf) == 6 and not breaks and not jf.graph_breaks.breaks
    else:
        assert thunder.cache_misses(jf) == limit + 1 and len(jf.graph_breaks.breaks) == 1
        assert "took 2 different values" in str(breaks[0].message)


def test_an_item_used_as_a_number_in_tensor_code_still_compiles():
    def f(x):
        return x * x.max().item()

    jf = thunder_subclass.jit(f, fullgraph=True)
    for x in (torch.arange(3.0), -torch.arange(3.0)):
        torch.testing.assert_close(jf(x), f(x))


@pytest.mark.slow
def test_qwen2_moe_with_data_dependent_routing_forward_and_generate():
    model = _qwen2_moe_eager_experts()
    ids = _input_ids()
    routed = []  # the experts the router picks: each runs the experts' activation (a region) once
    hook = model.model.layers[0].mlp.gate.register_forward_hook(lambda m, a, out: routed.append(out[2].unique()))
    with torch.no_grad():
        expected_logits = model(ids).logits
    hook.remove()
    with torch.no_grad():
        expected_tokens = model.generate(ids, do_sample=False, pad_token_id=0, max_new_tokens=2)
    model.forward = jforward = thunder_subclass.jit(model.forward)
    line = _routing_line(type(model.model.layers[0].mlp.experts))
    # the first call as explain() makes it: each module above the experts runs its own code eagerly, its children
    # compiled as regions (a plain call first runs the code eagerly: test_mixtral_...)
    with torch.no_grad(), thunder_subclass.explaining(jforward):
        torch.testing.assert_close(jforward(ids).logits, expected_logits)
    report = jforward.graph_breaks
    assert [b.name for b in report.breaks] == ["", "model", "model.layers.0", "model.layers.0.mlp",
                                               "model.layers.0.mlp.experts"]
    assert {b.location for b in report.breaks} == {line}
    assert {"model.layers.0.self_attn", "model.layers.0.mlp.gate", "model.layers.0.mlp.shared_expert",
            "model.layers.0.mlp.shared_expert_gate", "model.layers.0.mlp.experts.act_fn",
            "lm_head"} <= set(report.regions)
    assert report.region_calls == len(report.regions) - 1 + routed[0].numel()
    # one compiled function per class: the three RMS norms share one, shared_expert_gate and lm_head (nn.Linear) one
    assert len(report.compiled_functions) == len(report.regions) - 3
    _assert_one_region_around_the_eager_experts(jforward, ids, expected_logits)
    with torch.no_grad():
        tokens = model.generate(ids, do_sample=False, pad_token_id=0, max_new_tokens=2)
    assert torch.equal(tokens, expected_tokens)


# MoE training: in transformers 5.x the routed experts are fused 3-D parameters (`gate_up_proj`, `down_proj` of
# `MixtralExperts` / `Qwen2MoeExperts`, one slice per expert) and the router a bare weight, not nn.Linear modules, so
# torchao's float8 training (which swaps nn.Linear for Float8Linear) can reach only the nn.Linear modules that exist:
# Qwen2-MoE's shared expert and the attention projections.

def _float8_on_linears(model, names):
    from torchao.float8 import convert_to_float8_training

    convert_to_float8_training(model, module_filter_fn=lambda m, fqn: fqn.rsplit(".", 1)[-1] in names)
    return model


_MOE_TRAINING = {
    "mixtral": (_mixtral_eager_experts, None),
    "qwen2_moe": (_qwen2_moe_eager_experts, None),
    "mixtral-float8-attention": (_mixtral_eager_experts, ("q_proj", "k_proj", "v_proj", "o_proj")),
    "qwen2_moe-float8-shared-expert": (_qwen2_moe_eager_experts, ("gate_proj", "up_proj", "down_proj")),
}


@pytest.mark.parametrize("case", list(_MOE_TRAINING))
def test_moe_training_two_steps_with_graph_breaks(case):
    build, float8 = _MOE_TRAINING[case]

    def make():
        model = build().train()
        return model if float8 is None else _float8_on_linears(model, float8)

    eager, model = make(), make()
    model.load_state_dict(eager.state_dict())
    if float8 is not None:
        converted = [n for n, m in model.named_modules() if type(m).__name__ == "Float8Linear"]
        assert converted and all(n.rsplit(".", 1)[-1] in float8 for n in converted)
    experts = model.model.layers[0].mlp.experts
    assert [type(p).__name__ for p in experts.parameters()] == ["Parameter", "Parameter"]  # fused, not nn.Linear
    jmodel = thunder_subclass.jit(model)
    ids = _input_ids()
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, model)]
    for step in range(2):
        for opt in optimizers:
            opt.zero_grad()
        expected = eager(ids, labels=ids).loss
        expected.backward()
        if step == 0:
            line = _routing_line(type(experts))
            with pytest.warns(GraphBreakWarning, match=rf"{re.escape(line)}: NotImplementedError: .*nonzero"):
                loss = jmodel(ids, labels=ids).loss
        else:
            loss = jmodel(ids, labels=ids).loss
        loss.backward()
        torch.testing.assert_close(loss, expected)
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            assert (p.grad is None) == (q.grad is None), name
            if q.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, msg=name)
        for opt in optimizers:
            opt.step()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, msg=name)
    # the second step: the whole model is one compiled region, the experts (which hold the break) one eager call in
    # it, differentiated through their own autograd graph
    report = jmodel.graph_breaks
    assert [b.name for b in report.breaks] == ["model.layers.0.mlp.experts"]
    assert "" in report.regions and "model.layers.0.self_attn" not in report.regions
    forward, backward = (str(t[-1]) for t in (thunder.last_traces(report.regions[""]),
                                              thunder.last_backward_traces(report.regions[""])))
    assert "eager_module_call_forward" in forward and "eager_module_call_backward" in backward
    # the router (a top-k with an in-place renormalisation) trained in the compiled region: its weight's gradient is
    # among those compared above
    assert model.model.layers[0].mlp.gate.weight.grad is not None
    if float8 is not None:
        assert "float8" in forward


def _hooked_double(x):
    y = x * 2
    y.register_hook(lambda g: g * 10)  # thunder's proxies have no register_hook
    return y.sum()


def test_a_tensor_method_thunder_lacks_runs_eagerly_with_its_effect():
    x, ex = torch.randn(3, requires_grad=True), None
    _hooked_double(x).backward()
    ex, x.grad = x.grad.clone(), None
    jf = thunder_subclass.jit(_hooked_double)
    with pytest.warns(GraphBreakWarning, match=r"test_graph_breaks.py:\d+: AttributeError: Unknown attribute "
                                               r"register_hook"):
        out = jf(x)
    out.backward()
    torch.testing.assert_close(x.grad, ex)  # the hook ran: gradients times 10
    with pytest.raises(AttributeError, match="Unknown attribute register_hook"):
        thunder_subclass.jit(_hooked_double, fullgraph=True)(x)


def _where_indices(x):
    rows, cols = torch.where(x > 0)  # single-argument where: nonzero(as_tuple=True), a data-dependent count
    return x[rows, cols] * 2, rows, cols


def test_single_argument_where_is_a_graph_break_with_eagers_values():
    jf = thunder_subclass.jit(_where_indices)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GraphBreakWarning)
        for n in (4, 4, 5):
            x = torch.randn(n, 3)
            for out, expected in zip(jf(x), _where_indices(x)):
                torch.testing.assert_close(out, expected)
    assert [b.reason for b in jf.graph_breaks.breaks] == [
        "NotImplementedError: torch.where() does not support only specifying a condition"]
    with pytest.raises(NotImplementedError, match=r"torch.where\(\) does not support only specifying a condition"):
        thunder_subclass.jit(_where_indices, fullgraph=True)(torch.randn(4, 3))


class _WhereExperts(torch.nn.Module):
    """Mixture-of-experts routing with torch.where(mask): the tokens each expert gets depend on the data."""

    def __init__(self):
        super().__init__()
        self.experts = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(4)])

    def forward(self, x, weights, chosen):
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == e)
            out.index_add_(0, token, expert(x[token]) * weights[token, slot, None])
        return out


class _WhereMoE(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.router = torch.nn.Linear(8, 4)
        self.experts = _WhereExperts()
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x):
        weights, chosen = self.router(x).softmax(-1).topk(2, dim=-1)
        return self.head(x + self.experts(x, weights, chosen))


def test_moe_routing_with_single_argument_where_trains_equal_to_eager():
    torch.manual_seed(0)
    eager, model = _WhereMoE(), _WhereMoE()
    model.load_state_dict(eager.state_dict())
    jm = thunder_subclass.jit(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GraphBreakWarning)
        for _ in range(3):
            x = torch.randn(6, 8)
            for m in (eager, model):
                m.zero_grad(set_to_none=True)
            out, expected = jm(x), eager(x)
            torch.testing.assert_close(out, expected)
            out.square().sum().backward()
            expected.square().sum().backward()
            for (name, p), q in zip(model.named_parameters(), eager.parameters()):
                if q.grad is None:
                    assert p.grad is None or not p.grad.any(), name
                else:
                    torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=name)
    # the experts hold the break: from the second call on, one eager call in the whole model's trace (each expert, a
    # plain nn.Linear, runs as it is inside it: graph_breaks._is_stateless_leaf)
    report = jm.graph_breaks
    assert [b.name for b in report.breaks] == ["experts"]
    assert sorted(report.regions) == [""]
