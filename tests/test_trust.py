"""Trust under real use (issue 24): programs that gave silent wrong results or crashed give eager's results.

* autocast entered inside the compiled function (or around the call) reaches subclass operations: their fake runs
  cast as eager's dispatcher does, and the casts are recorded with the call, forward and backward;
* a ``torch.autograd.Function`` that changes an input through a tensor kept on ``ctx`` leaves the caller's tensor as
  eager does;
* training bugs found by torchao's tests: a parameter subclass that stays a subclass only for ``t``/``detach``, and
  ``requires_grad`` of results computed on inner tensors only;
* a tensor stored into a list or dict the compiled function was passed is the computed tensor in the caller's
  container after every call (it was a thunder proxy), and a trace that fails leaves the container as it was.
"""

import pytest
import thunder
import torch
import torch.nn.functional as F

import thunder_subclass
from subclasses import TwoTensor
from helpers import cache_counts


def _leaf(x):
    return x.detach().clone().requires_grad_() if isinstance(x, torch.Tensor) else x


def _run_both(f, args, *, around_autocast=False):
    """(outputs, input gradients) of eager ``f`` and of the compiled ``f``, each on fresh leaves of ``args``."""
    results = []
    for fn in (f, thunder_subclass.jit(f)):
        inputs = [_leaf(a) for a in args]
        if around_autocast:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = fn(*inputs)
        else:
            out = fn(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        sum(o.float().sum() for o in outs).backward()
        results.append((outs, [i.grad for i in inputs if isinstance(i, torch.Tensor)]))
    return results


def _assert_same(actual, expected):
    for a, e in zip(actual, expected, strict=True):
        assert type(a) is type(e) and a.dtype == e.dtype, (type(a), a.dtype, type(e), e.dtype)
        torch.testing.assert_close(a, e)
        if isinstance(e, TwoTensor):
            assert (a.a.dtype, a.b.dtype) == (e.a.dtype, e.b.dtype)


# --- autocast -------------------------------------------------------------------------------------------------


def _autocast_inside(t, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = t @ w
    return y, y * 2


def _autocast_exited(t, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = t @ w
    return y.float() @ w  # after the block: float32 again


def _autocast_nested_disabled(t, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = t @ w
        with torch.autocast("cpu", enabled=False):
            z = t @ w
        u = t @ w
    return y, z, u


def _autocast_linear(t, w, b):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return F.linear(t, w, b).relu()


def _two(*shape):
    return TwoTensor(torch.randn(*shape), torch.randn(*shape))


@pytest.mark.parametrize("f, make_args", [
    (_autocast_inside, lambda: (_two(3, 4), torch.randn(4, 5))),
    (_autocast_inside, lambda: (_two(3, 4), _two(4, 5))),
    (_autocast_exited, lambda: (_two(3, 4), torch.randn(4, 4))),
    (_autocast_nested_disabled, lambda: (_two(3, 4), torch.randn(4, 5))),
    (_autocast_linear, lambda: (_two(3, 4), torch.randn(5, 4), torch.randn(5))),
], ids=["enter", "both-subclass", "exit", "nested-enabled-false", "linear-bias"])
def test_autocast_inside_the_compiled_function_reaches_subclass_ops(f, make_args):
    (eager_out, eager_grads), (out, grads) = _run_both(f, make_args())
    _assert_same(out, eager_out)
    _assert_same(grads, eager_grads)


def test_autocast_around_the_call_reaches_subclass_ops():
    def f(t, w):
        return (t @ w).relu()

    (eager_out, eager_grads), (out, grads) = _run_both(f, (_two(3, 4), torch.randn(4, 5)), around_autocast=True)
    assert eager_out[0].dtype == torch.bfloat16
    _assert_same(out, eager_out)
    _assert_same(grads, eager_grads)


def test_autocast_state_is_part_of_the_cache_key_and_recorded_in_the_trace():
    def f(t, w):
        return t @ w

    jf = thunder_subclass.jit(f)
    t, w = _two(3, 4), torch.randn(4, 5)
    for around in (False, True, False, True):
        if around:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out, expected = jf(t, w), f(t, w)
        else:
            out, expected = jf(t, w), f(t, w)
        _assert_same((out,), (expected,))
    assert thunder.cache_misses(jf) == 2 and thunder.cache_hits(jf) == 2
    # the call under autocast is one symbol whose subsymbols hold the casts
    (bsym,) = [b for b in thunder.last_traces(jf)[0].bound_symbols if "matmul" in b.sym.name]
    assert bsym.sym.name == "matmul_autocast_cpu_bfloat16"
    assert any(s.sym.name == "to" for s in bsym.subsymbols)


# --- a torch.autograd.Function that changes an input through a tensor kept on ctx ------------------------------


class _ChangesKeptInput(torch.autograd.Function):
    """Adds 1 to ``t`` in ``forward`` and again in ``backward``, through the tensor kept on ``ctx``."""

    @staticmethod
    def forward(ctx, x, t):
        ctx.t = t
        t.add_(1)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        ctx.t.add_(1)
        return grad * 2, None


class _ReadsKeptInput(torch.autograd.Function):
    """Keeps ``t`` on ``ctx`` (not through ``save_for_backward``) and reads it in ``backward``."""

    @staticmethod
    def forward(ctx, x, t):
        ctx.t = t
        return x * t

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.t, None


def _make_plain():
    return torch.zeros(3)


def _make_two():
    return TwoTensor(torch.zeros(3), torch.zeros(3))


@pytest.mark.parametrize("make_t", [_make_plain, _make_two], ids=["plain", "TwoTensor"])
@pytest.mark.parametrize("x_requires_grad", [True, False], ids=["train", "no-grad-input"])
def test_function_changing_an_input_through_ctx_leaves_eagers_values(make_t, x_requires_grad):
    def f(x, t):
        return _ChangesKeptInput.apply(x, t)

    x0 = torch.randn(3)
    states = []
    for fn in (f, thunder_subclass.jit(f)):
        x, t = x0.clone().requires_grad_(x_requires_grad), make_t()
        out = fn(x, t)
        after_forward = t.clone()
        if x_requires_grad:
            out.sum().backward()
        states.append((out.detach(), after_forward, t.clone(), x.grad))
    (eager_out, eager_fwd, eager_bwd, eager_grad), (out, fwd, bwd, grad) = states
    torch.testing.assert_close(out, eager_out)
    for actual, expected in ((fwd, eager_fwd), (bwd, eager_bwd)):
        assert type(actual) is type(expected)
        torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(grad, eager_grad)
    assert float(eager_bwd.sum()) == (6.0 if x_requires_grad else 3.0)  # the test sees both changes


@pytest.mark.parametrize("make_t", [lambda: torch.randn(3), lambda: TwoTensor(torch.randn(3), torch.randn(3))],
                         ids=["plain", "TwoTensor"])
def test_function_reading_a_tensor_kept_on_ctx_in_backward(make_t):
    def f(x, t):
        return _ReadsKeptInput.apply(x, t)

    t = make_t()
    (eager_out, eager_grads), (out, grads) = _run_both(f, (torch.randn(3), t))
    _assert_same(out, eager_out)
    torch.testing.assert_close(grads[0], eager_grads[0])


# --- training bugs found by torchao's tests ----------------------------------------------------------------------


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("x_requires_grad", [True, False], ids=["x-grad", "x-no-grad"])
def test_linear_with_a_parameter_that_stays_a_subclass_only_for_t_and_detach(bias, x_requires_grad):
    from subclasses import ViewKeepingWeight

    w0, b0, x0 = torch.randn(3, 4), torch.randn(3), torch.randn(2, 4)
    results = []
    for compiled in (False, True):
        w = torch.nn.Parameter(ViewKeepingWeight(w0.clone()))
        b = torch.nn.Parameter(b0.clone()) if bias else None
        x = x0.clone().requires_grad_(x_requires_grad)
        fn = thunder_subclass.jit(F.linear) if compiled else F.linear
        out = fn(x, w, b)
        out.sum().backward()
        results.append((out.detach(), w.grad, x.grad, b.grad if bias else None))
    for actual, expected in zip(*results):
        assert type(actual) is type(expected)
        if expected is not None:
            torch.testing.assert_close(actual, expected)


def test_torchao_int8_mixed_precision_training_parameters():
    pytest.importorskip("torchao")
    import copy

    from torchao.prototype.quantized_training import Int8MixedPrecisionTrainingConfig
    from torchao.quantization import quantize_

    model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    quantize_(model, Int8MixedPrecisionTrainingConfig(module_swap=False))
    assert type(model[0].weight).__name__ == "Int8MixedPrecisionTrainingLinearWeight"
    compiled_model = copy.deepcopy(model)
    x = torch.randn(4, 32, requires_grad=True)
    cx = x.detach().clone().requires_grad_()
    expected, out = model(x), thunder_subclass.jit(compiled_model)(cx)
    expected.sum().backward()
    out.sum().backward()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(cx.grad, x.grad)
    for (name, p), (_, q) in zip(model.named_parameters(), compiled_model.named_parameters()):
        assert type(q.grad) is type(p.grad), name
        torch.testing.assert_close(q.grad, p.grad)


def _inner_only_weight(requires_grad=True):
    from subclasses import InnerOnlyLinearWeight

    return InnerOnlyLinearWeight(torch.randint(-127, 127, (4, 4), dtype=torch.int8), torch.rand(4),
                                 requires_grad=requires_grad)


@pytest.mark.parametrize("x_requires_grad", [False, True], ids=["x-no-grad", "x-grad"])
def test_results_computed_on_inner_tensors_only_require_grad_as_in_eager(x_requires_grad):
    # the weights require grad (as load_state_dict(..., assign=True) leaves them), but F.linear computes on their inner
    # tensors: the results require grad only through x
    w1, w2 = _inner_only_weight(), _inner_only_weight()

    def f(x, w1, w2):
        return F.linear(F.linear(x, w1).relu(), w2)

    x0 = torch.randn(2, 4)
    x, cx = x0.clone().requires_grad_(x_requires_grad), x0.clone().requires_grad_(x_requires_grad)
    expected, out = f(x, w1, w2), thunder_subclass.jit(f)(cx, w1, w2)
    torch.testing.assert_close(out, expected)
    assert out.requires_grad == expected.requires_grad == x_requires_grad
    if x_requires_grad:
        expected.sum().backward()
        out.sum().backward()
        torch.testing.assert_close(cx.grad, x.grad)
        assert w1.grad is None and w2.grad is None


def _int4_model_as_loaded(bias: bool):
    pytest.importorskip("torchao.prototype.quantization.int4")  # (torchao >= 0.17; the torch 2.10 stack has 0.16)
    from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig
    from torchao.quantization import quantize_

    def make():
        return torch.nn.Sequential(torch.nn.Linear(64, 32, bias=bias), torch.nn.ReLU(),
                                   torch.nn.Linear(32, 32, bias=bias)).to(torch.bfloat16)

    quantized = make()
    quantize_(quantized, PrototypeInt4WeightOnlyConfig(group_size=32))
    model = make()
    model.load_state_dict(quantized.state_dict(), assign=True)  # the int4 weights now require grad
    assert type(model[0].weight).__name__ == "Int4OpaqueTensor" and model[0].weight.requires_grad
    return model


def test_int4_weights_that_require_grad_give_results_that_do_not():
    # torchao's Int4OpaqueTensor computes F.linear on its inner tensors: eager's result does not require grad, and
    # nothing is differentiated (the second layer's input does not require grad either)
    model = _int4_model_as_loaded(bias=False)
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    expected, out = model(x), thunder_subclass.jit(model)(x)
    torch.testing.assert_close(out, expected)
    assert not expected.requires_grad and not out.requires_grad


def test_backward_without_a_derivative_raises_at_backward_naming_the_line():
    # torchao's Int4OpaqueTensor: F.linear calls aten._weight_int4pack_mm_for_cpu, which has no derivative. Eager runs
    # the forward (the result requires grad through the bias) and .backward() raises; so does the compiled function
    model = _int4_model_as_loaded(bias=True)

    def f(x):
        return model(x) * 2

    x = torch.randn(2, 64, dtype=torch.bfloat16)
    expected, out = f(x), thunder_subclass.jit(f)(x)
    torch.testing.assert_close(out, expected)
    assert out.requires_grad == expected.requires_grad
    with pytest.raises(RuntimeError, match="derivative for aten::_weight_int4pack_mm_for_cpu is not implemented"):
        expected.sum().backward()
    with pytest.raises(thunder_subclass.errors.SubclassDispatchError,
                       match=r"backward of torch.linear on Int4OpaqueTensor .* at .*linear.py:\d+: RuntimeError: "
                             r"derivative for aten::_weight_int4pack_mm_for_cpu is not implemented"):
        out.sum().backward()


class _Holder:
    def __init__(self):
        self.items, self.cache = [], {}


def _assert_same_contents(a, b):
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b)
        assert type(a) is type(b) and a.requires_grad == b.requires_grad and (a.grad_fn is None) == (b.grad_fn is None)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            _assert_same_contents(u, v)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _assert_same_contents(a[k], b[k])
    elif isinstance(a, _Holder):
        _assert_same_contents(vars(a), vars(b))
    else:
        assert a is b or a == b


_MARK = object()


def _setitem(x, d):
    d["y"] = x * 2
    return x + 1


def _append(x, lst):
    lst.append(x * 2)
    return x + 1


def _list_setitem(x, lst):
    lst[0] = x * 2
    return x + 1


def _update_del_pop(x, d):
    d.update(y=x * 2, n=5)
    del d["a"]
    d.pop("m")
    return x + d["t"]


def _read_back(x, d):
    d["y"] = x.sin()
    return d["y"] * 2


def _nested(x, d):
    d.setdefault("acc", []).append(x * 2)
    d["pair"] = (x, x.cos())
    return x + 1


def _through_attributes(x, h):
    h.items.append(x.sin())
    h.cache["c"] = x.cos()
    return x + 1


@pytest.mark.parametrize("f, make", [
    (_setitem, dict),
    (_append, list),
    (_list_setitem, lambda: [0, _MARK]),
    (_update_del_pop, lambda: {"a": 1, "k": _MARK, "m": 2, "t": torch.ones(3)}),
    (_read_back, dict),
    (_nested, dict),
    (_through_attributes, _Holder),
], ids=["setitem", "append", "list setitem", "update del pop", "read back", "nested", "attributes"])
@pytest.mark.parametrize("make_x", [lambda: torch.randn(3, requires_grad=True),
                                    lambda: TwoTensor(torch.randn(3), torch.randn(3))], ids=["plain", "TwoTensor"])
def test_tensor_stored_into_an_input_container_is_eagers_tensor_every_call(f, make, make_x, ):
    jf = thunder_subclass.jit(f)
    for _ in range(3):  # first call, then cache hits
        x = make_x()
        got, expected = make(), make()
        _assert_same_contents(jf(x, got), f(x, expected))
        _assert_same_contents(got, expected)
    assert cache_counts(jf) == (1, 2)


def test_gradient_flows_through_a_tensor_stored_into_an_input_list():
    x, ex = torch.randn(3, requires_grad=True), None
    ex = x.detach().clone().requires_grad_()
    got, expected = [], []
    thunder_subclass.jit(_append)(x, got)
    _append(ex, expected)
    got[0].sum().backward()
    expected[0].sum().backward()
    torch.testing.assert_close(x.grad, ex.grad)


def test_failed_trace_leaves_an_input_list_as_it_was_before_running_eagerly():
    def f(x, lst):
        lst.append(x * 2)
        return x[x > 0] + 1  # a shape that depends on data: a graph break, the function runs eagerly

    x, got, expected = torch.ones(3), [], []
    with pytest.warns(UserWarning):
        _assert_same_contents(thunder_subclass.jit(f)(x, got), f(x, expected))
    _assert_same_contents(got, expected)  # one real tensor: not a proxy left by the trace, then eager's


def test_object_made_in_compiled_code_stored_into_an_input_dict_is_a_typed_error():
    from thunder_subclass.errors import UnsupportedTracingError

    def f(x, d):
        d["o"] = _Holder()
        return x + 1

    d = {}
    with pytest.raises(UnsupportedTracingError, match=r"stores a _Holder made in the compiled code into args\[1\], a dict "
                                                      r"it was passed \(an argument of f at .*test_trust.py:\d+\).*"
                                                      r"Return the object instead"):
        thunder_subclass.jit(f)(torch.randn(3), d)
    assert d == {}


def _inference_block(x, w):
    with torch.inference_mode():
        y = x * w
    return y + w, y


@torch.inference_mode()
def _decorated(x, w):
    return x * w


def _inference_decorated(x, w):
    y = _decorated(x, w)
    return y + w, y


@pytest.mark.parametrize("f", [_inference_block, _inference_decorated], ids=["block", "decorator"])
@pytest.mark.parametrize("subclass", [False, True])
def test_inference_mode_inside_the_compiled_function_records_no_gradient(f, subclass):
    # thunder 0.2.6 ran torch._C._InferenceMode natively, unseen: y required grad and carried w's gradient (eager:
    # an inference tensor, no gradient)
    def make():
        w = TwoTensor(torch.randn(4), torch.randn(4)) if subclass else torch.randn(4)
        return torch.randn(4), w.requires_grad_()

    torch.manual_seed(0)
    x, w = make()
    torch.manual_seed(0)
    ex, ew = make()
    out, y = thunder_subclass.jit(f)(x, w)
    eout, ey = f(ex, ew)
    assert not y.requires_grad and not ey.requires_grad and out.requires_grad
    assert type(y) is type(ey) and type(out) is type(eout)
    for a, b in ((out, eout), (y, ey)):
        for p, q in ((a.a, b.a), (a.b, b.b)) if subclass else ((a, b),):
            torch.testing.assert_close(p, q)
    out.sum().backward()
    eout.sum().backward()
    assert type(w.grad) is type(ew.grad)
    for p, q in ((w.grad.a, ew.grad.a), (w.grad.b, ew.grad.b)) if subclass else ((w.grad, ew.grad),):
        torch.testing.assert_close(p, q)  # only through `+ w`: ones


def _enable_grad_inside(x, w):
    y = x * 2
    with torch.enable_grad():
        z = (y * w).sin()
    return z, y


_ENABLE_LINE = _enable_grad_inside.__code__.co_firstlineno + 2


@pytest.mark.parametrize("subclass", [False, True])
def test_grad_enabled_inside_a_call_under_no_grad_runs_as_eager(subclass):
    # thunder 0.2.6 ran the compiled program under the caller's no_grad: z did not require grad (TwoTensor) or
    # thunder's epilogue failed (plain: "epilogue() takes 1 positional argument but 2 were given"); now a graph break
    from thunder_subclass import GraphBreakWarning

    w = (TwoTensor(torch.randn(4), torch.randn(4)) if subclass else torch.randn(4)).requires_grad_()
    ew = w.detach().clone().requires_grad_()
    x = torch.randn(4)
    jf = thunder_subclass.jit(_enable_grad_inside)
    with torch.no_grad():
        with pytest.warns(GraphBreakWarning, match=rf"test_trust\.py:{_ENABLE_LINE}: UnsupportedGlobalStateError: grad "
                                                   r"mode turned on"):
            z, y = jf(x, w)
        ez, ey = _enable_grad_inside(x, ew)
    assert z.requires_grad and ez.requires_grad and not y.requires_grad and type(z) is type(ez)
    z.sum().backward()
    ez.sum().backward()
    for p, q in ((w.grad.a, ew.grad.a), (w.grad.b, ew.grad.b)) if subclass else ((w.grad, ew.grad),):
        torch.testing.assert_close(p, q)
    # called with grad mode on, the same function compiles whole (a second trace: the first attempt broke)
    z2, _ = jf(x, w)
    assert z2.requires_grad and thunder.cache_misses(jf) == 2
    assert jf(x, w)[0].requires_grad and thunder.cache_hits(jf) == 1


def test_grad_enabled_inside_a_call_under_no_grad_is_a_typed_error_with_fullgraph():
    from thunder_subclass.errors import UnsupportedGlobalStateError

    jf = thunder_subclass.jit(_enable_grad_inside, fullgraph=True)
    with torch.no_grad(), pytest.raises(UnsupportedGlobalStateError,
                                        match=rf"torch\.enable_grad\(\) or torch\.set_grad_enabled\(True\)\) at "
                                              rf".*test_trust\.py:{_ENABLE_LINE}, in a function called with grad "
                                              r"mode off .* Call the compiled function with grad mode on"):
        jf(torch.randn(4), torch.randn(4, requires_grad=True))


def _float64_ones(x):
    torch.set_default_dtype(torch.float64)
    try:
        y = torch.ones(3)
    finally:
        torch.set_default_dtype(torch.float32)
    return y + x


def _deterministic_on(x):
    torch.use_deterministic_algorithms(True)
    return x * 2


_SETTER_LINE = _deterministic_on.__code__.co_firstlineno + 1


def test_a_setter_of_torch_global_state_inside_the_compiled_function_runs_as_eager():
    # thunder 0.2.6 ran torch._C setters natively while tracing, never in the compiled program: thunder raised for a
    # factory after set_default_dtype ("Default dtype is changed during the execution of jitted function"), and
    # use_deterministic_algorithms(True) took effect on the first call only; now a graph break (eager every call)
    from thunder_subclass import GraphBreakWarning

    x = TwoTensor(torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64))
    with pytest.warns(GraphBreakWarning, match=r"UnsupportedGlobalStateError: torch\._C\._set_default_dtype"):
        out = thunder_subclass.jit(_float64_ones)(x)
    expected = _float64_ones(x)
    assert type(out) is TwoTensor and out.a.dtype == torch.float64 and torch.get_default_dtype() == torch.float32
    torch.testing.assert_close(out.a, expected.a) and torch.testing.assert_close(out.b, expected.b)
    jf = thunder_subclass.jit(_deterministic_on)
    try:
        with pytest.warns(GraphBreakWarning):
            jf(torch.randn(3))
        for _ in range(2):
            torch.use_deterministic_algorithms(False)
            torch.testing.assert_close(jf(x).a, x.a * 2)
            assert torch.are_deterministic_algorithms_enabled()  # as after eager's call, every time
    finally:
        torch.use_deterministic_algorithms(False)


def test_a_setter_of_torch_global_state_is_a_typed_error_with_fullgraph():
    from thunder_subclass.errors import UnsupportedGlobalStateError

    try:
        with pytest.raises(UnsupportedGlobalStateError,
                           match=rf"torch\._C\._set_deterministic_algorithms\(\.\.\.\) at .*test_trust\.py:"
                                 rf"{_SETTER_LINE} changes torch's global state inside the compiled function"):
            thunder_subclass.jit(_deterministic_on, fullgraph=True)(torch.randn(3))
    finally:
        torch.use_deterministic_algorithms(False)


def _grad_off_for_good(x, w):
    torch.set_grad_enabled(False)
    return x * w


def test_grad_mode_left_changed_by_the_compiled_function_is_left_changed_on_every_call():
    # thunder 0.2.6 turned grad mode off after the call that traced only (cache hits left it on, unlike eager)
    from thunder_subclass import GraphBreakWarning

    w = TwoTensor(torch.randn(3), torch.randn(3)).requires_grad_()
    jf = thunder_subclass.jit(_grad_off_for_good)
    try:
        with pytest.warns(GraphBreakWarning, match=r"UnsupportedGlobalStateError: the compiled function leaves grad "
                                                   r"mode turned off when it returns"):
            for _ in range(3):
                torch.set_grad_enabled(True)
                out = jf(torch.ones(3), w)
                assert not torch.is_grad_enabled() and not out.requires_grad and type(out) is TwoTensor
                torch.testing.assert_close(out.a, w.a.detach()) and torch.testing.assert_close(out.b, w.b.detach())
    finally:
        torch.set_grad_enabled(True)


class _CountsThenBreaks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stats = {"calls": 0}
        self.seen = []

    def forward(self, x):
        self.stats["calls"] += 1  # changed by the trace that then fails at the next line
        self.seen.append(len(self.seen))
        return x[x > 0]


class _HoldsCounter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _CountsThenBreaks()

    def forward(self, x):
        return self.inner(x) * 2


def test_a_failed_trace_leaves_the_containers_a_submodule_holds_as_they_were():
    """A trace that changes a dict and a list held by a submodule (reached through nn.Module's ``_modules``) and then
    breaks leaves them as they were: the eager run after it changes them once, as eager (twice before)."""
    import warnings

    model = _HoldsCounter()
    jm = thunder_subclass.jit(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", thunder_subclass.GraphBreakWarning)
        for n in (1, 2, 3):
            x = torch.randn(6)
            torch.testing.assert_close(jm(x), x[x > 0] * 2)
            assert model.inner.stats == {"calls": n} and model.inner.seen == list(range(n))
