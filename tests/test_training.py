"""Training: subclass ops differentiate above __torch_dispatch__; the flatten pass runs after autograd (issue 3)."""

import copy
import warnings

import pytest
import thunder
import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_flatten, tree_map

import thunder_subclass
from thunder_subclass import SubclassTensorProxy
from subclasses import TwoTensor, nested_two_tensor, quantize


def _two(*shape, requires_grad=True):
    return TwoTensor(torch.randn(*shape), torch.randn(*shape)).requires_grad_(requires_grad)


def _clone_leaf(t):
    if not isinstance(t, torch.Tensor):
        return t
    return t.detach().clone().requires_grad_(t.requires_grad)


def assert_same(actual, expected):
    """Values and types equal, recursively through subclasses (a TwoTensor's a and b compared separately)."""
    assert type(actual) is type(expected), f"{type(actual).__name__} != {type(expected).__name__}"
    if actual is None:
        return
    if not isinstance(expected, torch.Tensor):  # an opaque attribute (a mesh): the same object
        assert actual is expected
        return
    if hasattr(type(expected), "__tensor_flatten__") and type(expected) is not torch.Tensor:
        attrs, ctx = expected.__tensor_flatten__()
        assert actual.__tensor_flatten__() == (attrs, ctx)
        for a in attrs:
            assert_same(getattr(actual, a), getattr(expected, a))
        return
    torch.testing.assert_close(actual, expected)


def _subclass_level_bsyms(trace):
    """Bound symbols of the trace (top level) that take or return a subclass proxy, other than the edges."""
    edges = ("unpack_trivial", "python_return", "python_del", "get_grad", "clear_mutable_collection", "unpack_sequence")
    out = []
    for bsym in trace.bound_symbols:
        name = bsym.sym.name
        if name.startswith(("flatten_", "unflatten_")) or name in edges:
            continue
        if any(isinstance(p, SubclassTensorProxy) for p in (*bsym.flat_proxy_args, *bsym.flat_proxy_outs)):
            out.append(bsym)
    return out


def check_training(fn, *args, grad_out=None, **jit_kwargs):
    """Run ``fn`` eagerly and compiled on copies of ``args``; compare outputs, and gradients of every input that
    requires grad (values and types). Returns the jitted function."""
    eager_args = tree_map(_clone_leaf, args)
    jit_args = tree_map(_clone_leaf, args)
    jfn = thunder_subclass.jit(fn, **jit_kwargs)
    expected = fn(*eager_args)
    actual = jfn(*jit_args)
    assert_same(actual.detach(), expected.detach())
    g = grad_out if grad_out is not None else None
    expected.backward(g)
    actual.backward(None if g is None else _clone_leaf(g))
    for e, a in zip(tree_flatten(eager_args)[0], tree_flatten(jit_args)[0]):
        if isinstance(e, torch.Tensor) and e.requires_grad:
            assert_same(a.grad, e.grad)
    assert not _subclass_level_bsyms(thunder.last_traces(jfn)[-1])
    assert not _subclass_level_bsyms(thunder.last_backward_traces(jfn)[-1])
    return jfn


def test_two_tensor_input_and_parameter():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(_two(4, 4))

        def forward(self, x):
            return (x * self.w).sin().sum()

    m = M()
    em = copy.deepcopy(m)
    x = _two(4, 4)
    ex = _clone_leaf(x)
    jm = thunder_subclass.jit(m)
    out, eout = jm(x), em(ex)
    assert_same(out.detach(), eout.detach())
    out.backward()
    eout.backward()
    assert type(m.w.grad) is TwoTensor  # as in eager
    assert_same(m.w.grad, em.w.grad)
    assert_same(x.grad, ex.grad)
    fw, bw = thunder.last_traces(jm)[-1], thunder.last_backward_traces(jm)[-1]
    assert not _subclass_level_bsyms(fw) and not _subclass_level_bsyms(bw)
    # inner tensors, not subclass objects, are saved for backward
    saved = fw.bound_symbols[-1].args[1][0]
    assert saved and all(not isinstance(p, SubclassTensorProxy) for p in saved)
    # the default executors: the torch executor claims the flattened operations thunder knows; aten ops without a
    # thunder equivalent run as the plugin's aten_* symbols (executed by torch), next to its flatten_*/unflatten_*
    for trace in (fw, bw):
        claimed = {b.sym.executor.name for b in trace.bound_symbols if b.sym.executor is not None}
        assert claimed <= {"torch", "thunder_subclass", "python"} and "torch" in claimed, claimed
        ours = {b.sym.name for b in trace.bound_symbols if getattr(b.sym.executor, "name", None) == "thunder_subclass"}
        # backward_info: a no-op carrying the plugin's per-trace backward data (thunder_subclass.transforms.tangents)
        assert all(n.startswith(("flatten_", "unflatten_", "aten_")) or n == "backward_info" for n in ours), ours
    # subclass objects are built only for values leaving the compiled function
    assert [b.sym.name for b in fw.bound_symbols].count("unflatten_TwoTensor") == 1  # the output
    assert [b.sym.name for b in bw.bound_symbols].count("unflatten_TwoTensor") == 2  # the two gradients


def test_joint_trace_holds_subclass_symbols_with_unrolled_backward():
    jf = check_training(lambda x, w: (x * w).sum(), _two(3, 3), _two(3, 3))
    joint = [t for t in thunder.last_traces(jf) if "Grad transform" in str(t.get_provenance())][0]
    names = [b.sym.name for b in joint.bound_symbols]
    assert "mul" in names and "grad_mul" in names and "grad_sum" in names
    grad_mul = [b for b in joint.bound_symbols if b.sym.name == "grad_mul"][0]
    subs = [s.sym.name for s in grad_mul.subsymbols]
    assert subs[0] == "flatten_TwoTensor" and subs[-1] == "unflatten_TwoTensor" and "mul" in subs


def test_plain_parameter_meeting_two_tensor_gets_two_tensor_grad():
    # eager: the gradient of a plain tensor multiplied by a TwoTensor is a TwoTensor
    w = torch.randn(4, requires_grad=True)
    check_training(lambda x, w: (x * (w * 2)).sum(), _two(4, requires_grad=False), w)


@pytest.mark.parametrize(
    "fn, w_shape",
    [
        (lambda x, w: (x * w.sin()).sum(), (4, 4)),  # thunder's derivative of sin: prims.cos * (TwoTensor grad)
        (lambda x, w: (x * F.relu(w)).sum(), (4, 4)),  # ltorch.where(mask, grad, 0)
        (lambda x, w: (x @ w.t()).sum(), (4, 4)),  # prims.transpose of a TwoTensor gradient
        (lambda x, w: (x * w.reshape(4, 4)).sum(), (16,)),  # prims.reshape
        (lambda x, w: (x * w.sum(0, keepdim=True)).sum(), (4, 4)),  # broadcast + dtype conversion
    ],
    ids=["sin", "relu", "t-matmul", "reshape", "sum-keepdim"],
)
def test_plain_operation_whose_gradient_is_a_subclass(fn, w_shape):
    # thunder differentiates the plain operation on w; its gradient is a TwoTensor (as in eager), so the plain
    # derivative is traced again through TwoTensor's dispatch by the flatten pass
    check_training(fn, _two(4, 4, requires_grad=False), torch.randn(*w_shape, requires_grad=True))


def test_quantized_weight_dtype_changing_matmul():
    w = quantize(torch.randn(6, 5))
    x = torch.randn(3, 5, requires_grad=True)

    def f(x, w):
        y = x @ w.t()  # bf16-presenting weight, float32 result
        assert y.dtype == torch.float32
        return (y.relu() * 3).sum()

    jf = check_training(f, x, w)
    fw, bw = thunder.last_traces(jf)[-1], thunder.last_backward_traces(jf)[-1]
    fw_names = [b.sym.name for b in fw.bound_symbols]
    # the int8 data is dequantized (QuantizedWeight's dispatch) and multiplied in float32, in the flat program
    assert fw_names.count("flatten_QuantizedWeight") == 1 and "to" in fw_names and "matmul" in fw_names
    assert "matmul" in [b.sym.name for b in bw.bound_symbols]  # grad_x = grad @ dequantized weight


def test_nested_two_tensor():
    x = nested_two_tensor(*(torch.randn(3, 4) for _ in range(4))).requires_grad_()
    y = nested_two_tensor(*(torch.randn(3, 4) for _ in range(4))).requires_grad_()
    check_training(lambda x, y: (x * y + x.exp()).sum(), x, y)


@pytest.mark.parametrize(
    "op",
    [
        lambda x: sum(p.sin().sum() for p in x.split(2)),
        lambda x: x.chunk(3)[0].sum() * 2 + x.chunk(3)[2].cos().sum(),  # an unused chunk gets a zero gradient
        lambda x: sum((i + 1) * p.sum() for i, p in enumerate(x.unbind(0))),
    ],
    ids=["split", "chunk", "unbind"],
)
def test_multi_output_ops(op):
    check_training(op, _two(6, 4))


@pytest.mark.parametrize(
    "op",
    [
        lambda x: (x.t() * torch.arange(6.0)).sum(),
        lambda x: x.view(3, 8).sin().sum(),
        lambda x: x.reshape(8, 3).cos().sum(),
        lambda x: (x.transpose(0, 1) @ x).sum(),
        lambda x: (x[1:, ::2] * 3).sum(),
    ],
    ids=["t", "view", "reshape", "transpose", "slicing"],
)
def test_view_ops(op):
    check_training(op, _two(6, 4))


def test_linear_with_subclass_weight():
    x = torch.randn(5, 4, requires_grad=True)
    check_training(lambda x, w, b: F.linear(x, w, b).sum(), x, _two(3, 4), torch.randn(3, requires_grad=True))


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)
        for lin in (self.fc1, self.fc2):
            lin.weight = torch.nn.Parameter(TwoTensor(lin.weight.detach().clone(), lin.weight.detach() * 0.5))

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test_mlp_with_subclass_weights_three_sgd_steps():
    model = MLP()
    eager = copy.deepcopy(model)
    jmodel = thunder_subclass.jit(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    eopt = torch.optim.SGD(eager.parameters(), lr=0.1)
    x, target = torch.randn(10, 8), torch.randn(10, 4)
    for _ in range(3):
        loss = F.mse_loss(jmodel(x), target)
        eloss = F.mse_loss(eager(x), target)
        assert_same(loss.detach(), eloss.detach())
        opt.zero_grad()
        eopt.zero_grad()
        loss.backward()
        eloss.backward()
        for p, ep in zip(model.parameters(), eager.parameters()):
            assert_same(p.grad, ep.grad)
        opt.step()
        eopt.step()
        for p, ep in zip(model.parameters(), eager.parameters()):
            assert_same(p.detach(), ep.detach())
    assert type(model.fc1.weight.grad) is TwoTensor
    # one compilation served the three steps (the updated weights have the same metadata)
    assert thunder.cache_misses(jmodel) == 1 and thunder.cache_hits(jmodel) == 2


class ScaleGrad(torch.autograd.Function):
    """Forward: x * w (subclasses in, subclass out). Backward: scaled by 3, unlike the derivative of mul."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w * 3, g * x


def test_autograd_function_over_subclasses():
    jf = check_training(lambda x, w: ScaleGrad.apply(x, w).sum(), _two(4), _two(4))
    first = str(thunder.last_traces(jf)[0])
    assert "ScaleGrad_apply" in first


class ToTwoTensor(torch.autograd.Function):
    """Plain tensor in, subclass out (the pattern of torchao's float8 casts); plain gradient back."""

    @staticmethod
    def forward(ctx, x):
        return TwoTensor(x * 1.0, x * 2.0)

    @staticmethod
    def backward(ctx, g):
        return g.a + g.b * 2 if isinstance(g, TwoTensor) else g


def test_autograd_function_returning_a_subclass():
    x = torch.randn(4, requires_grad=True)
    check_training(lambda x: (ToTwoTensor.apply(x) * x).sum(), x)


def test_backward_with_subclass_grad():
    g = TwoTensor(torch.randn(4), torch.randn(4))
    check_training(lambda x: (x * x).sin(), _two(4), grad_out=g)


def test_torch_compile_executor_claims_flattened_region():
    from thunder.executors.torch_compile import torch_compile_ex

    jf = check_training(lambda x, w: ((x * w).sin() + 1).sum(), _two(4, 4), _two(4, 4),
                        executors=[torch_compile_ex])
    fw, bw = thunder.last_traces(jf)[-1], thunder.last_backward_traces(jf)[-1]
    fw_names = [b.sym.name for b in fw.bound_symbols]
    assert any(n.startswith("TorchCompile") for n in fw_names), fw_names
    assert any(b.sym.name.startswith("TorchCompile") for b in bw.bound_symbols)
    # the fused region is plain: subclass objects only at the edges
    fused = [b for b in fw.bound_symbols if b.sym.name.startswith("TorchCompile")]
    for b in fused:
        assert not any(isinstance(p, SubclassTensorProxy) for p in (*b.flat_proxy_args, *b.flat_proxy_outs))


def test_torch_compile_executor_fuses_a_subclass_mlp_into_one_region_per_direction():
    # issue 7: parameters are flattened at the top, gradients unflattened at the return, and the aten ops of the
    # dispatch (relu's detach and threshold_backward included) are thunder symbols: nothing cuts the region
    from thunder.executors.torch_compile import torch_compile_ex

    def mlp(x, w1, w2):
        return torch.relu(torch.relu(x @ w1) @ w2).sum()

    jf = check_training(mlp, _two(3, 4), _two(4, 4), _two(4, 4), executors=[torch_compile_ex])
    fw, bw = thunder.last_traces(jf)[-1], thunder.last_backward_traces(jf)[-1]
    for trace in (fw, bw):
        names = [b.sym.name for b in trace.bound_symbols]
        assert sum(n.startswith("TorchCompile") for n in names) == 1, names
        assert not [n for n in names if n.startswith("aten_")], names


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_nvfuser_claims_flattened_region_on_cuda():
    import importlib.util

    # nvFuser's wheels for torch 2.10 (nvfuser-cu128-torch210, the `cuda` extra) ship the module nvfuser_direct;
    # older ones ship nvfuser
    if not any(importlib.util.find_spec(m) for m in ("nvfuser_direct", "nvfuser")):
        pytest.skip("nvFuser is not installed (nvfuser_direct / nvfuser)")
    from thunder.executors.nvfuserex import nvfuserex

    assert nvfuserex is not None, "nvFuser is installed and CUDA is available, but thunder registered no nvFuser executor"

    x = TwoTensor(torch.randn(8, 8, device="cuda"), torch.randn(8, 8, device="cuda")).requires_grad_()
    w = TwoTensor(torch.randn(8, 8, device="cuda"), torch.randn(8, 8, device="cuda")).requires_grad_()
    jf = check_training(lambda x, w: ((x * w).sin() + 1).sum(), x, w, executors=[nvfuserex])
    assert any(b.sym.name.startswith("nvFusion") for b in thunder.last_traces(jf)[-1].bound_symbols)


@pytest.mark.parametrize(
    "fn, grad_type",
    [(lambda x: x * 2, torch.Tensor), (lambda x: (x * x).sin(), TwoTensor)],
    ids=["linear-chain", "through-saved-subclass"],
)
def test_backward_with_plain_grad_for_subclass_output(fn, grad_type):
    # eager accepts a plain gradient for a TwoTensor output and runs the derivative with it: the input's gradient
    # is plain when the chain never meets a saved TwoTensor, a TwoTensor otherwise (torch.compile fails here,
    # pytorch issue 172556)
    jf = check_training(fn, _two(4), grad_out=torch.randn(4))
    from thunder_subclass.transforms.tangents import variants_in

    variants = [v for v in (variants_in(f) for f in _compiled_backwards(jf)) if v is not None]
    assert variants and len(variants[0]._compiled) == 1  # one backward variant, for plain gradients
    # the same call again reuses it; a TwoTensor gradient uses the compiled backward
    x = _two(4)
    jf(x).backward(torch.ones(4))
    assert type(x.grad) is grad_type
    assert len(variants[0]._compiled) == 1
    x2 = _two(4)
    ex2 = _clone_leaf(x2)
    g = TwoTensor(torch.randn(4), torch.randn(4))
    jf(x2).backward(g)
    fn(ex2).backward(g)
    assert_same(x2.grad, ex2.grad)


def _compiled_backwards(jf):
    cs = thunder.compile_stats(jf)
    return [entry.backward_fn for entry in cs.interpreter_cache if getattr(entry, "backward_fn", None)]


def test_regression_gradient_substituted_by_autodiff_is_rerecorded():
    # found by tests/test_fuzz.py: the gradient of `v.sum() * 0.1` is the (nested) gradient of the loss, which
    # thunder's autodiff substitutes into grad_mul's arguments after grad_mul was recorded for a guessed (simple)
    # TwoTensor gradient; the stale recording made a 3-level gradient where eager has 2 levels
    def f(x, n):
        return ((n + x) * (n + x)).sum() + x.sin().sum() * 0.1

    n = nested_two_tensor(*(torch.randn(4) for _ in range(4))).requires_grad_()
    check_training(f, _two(4), n)


def test_regression_unused_subclass_output_gets_materialized_zero_gradient():
    # found by tests/test_fuzz.py: autograd fills the gradient of an unused TwoTensor output with a plain zero
    # tensor; it must not select a backward for plain gradients (which needed tensors the forward did not save)
    x = _two(4)
    ex = _clone_leaf(x)

    def f(x):
        y = torch.tanh(x)
        return y, (y * y).sum()

    _, loss = thunder_subclass.jit(f)(x)
    _, eloss = f(ex)
    loss.backward()
    eloss.backward()
    assert_same(x.grad, ex.grad)


def test_regression_rerecorded_backward_uses_names_autodiff_gave():
    # found by tests/test_fuzz.py: re-recording `x / (1 + p * p)`'s backward for a nested gradient used the name
    # the divisor had before thunder's autodiff renamed it (an unbound variable in the backward trace)
    def f(x, n, p):
        return (n * n).sum() + (x / (1 + p * p)).sum() * 0.1

    n = nested_two_tensor(*(torch.randn(4) for _ in range(4))).requires_grad_()
    check_training(f, _two(4), n, torch.randn(4, requires_grad=True))


@pytest.mark.parametrize("update", ["div_", "mul_", "add_", "sub_"])
def test_a_tensor_saved_for_backward_and_then_changed_in_place_gives_eagers_gradient(update):
    # the backward of `v / v.sum()` reads v; `v /= v.sum()` overwrote it in the forward before the backward ran
    def f(w, h):
        values, _ = torch.topk(torch.softmax(h @ w.t(), -1), 2, dim=-1)
        scale = values.sum(dim=-1, keepdim=True) + 0.5
        getattr(values, update)(scale)
        return values * values

    torch.manual_seed(0)
    w, h, grad = torch.randn(4, 8), torch.randn(5, 8), torch.randn(5, 2)
    ew, jw = w.clone().requires_grad_(), w.clone().requires_grad_()
    f(ew, h).backward(grad)
    jf = thunder_subclass.jit(f)
    out = jf(jw, h)
    out.backward(grad)
    torch.testing.assert_close(out, f(w, h))
    torch.testing.assert_close(jw.grad, ew.grad)


def test_regression_sum_of_a_zero_dim_subclass_differentiates():
    # the backward of sum() on a 0-d TwoTensor expands a 0-d gradient to size (): recorded as thunder's expand it
    # printed as Tensor.expand(t) (no size), which torch rejects (found by check_subclass's grads check)
    x = TwoTensor(torch.randn(4, 3), torch.randn(4, 3)).requires_grad_()
    ex = TwoTensor(x.a.clone(), x.b.clone()).requires_grad_()
    f = lambda t: t.sum().sum()
    (g,) = torch.autograd.grad(thunder_subclass.jit(f)(x), x)
    (eg,) = torch.autograd.grad(f(ex), ex)
    assert type(g) is TwoTensor
    torch.testing.assert_close(g.a, eg.a)
    torch.testing.assert_close(g.b, eg.b)


# ---------------------------------------------------------------------------------------------------------------
# Python-level side effects in a custom backward: eager's behaviour (a graph break) or, with fullgraph=True, a typed
# error; never dropped (the compiled backward would run only the tensor operations recorded while tracing)
# ---------------------------------------------------------------------------------------------------------------

class KeepOnCtx(torch.autograd.Function):
    @staticmethod
    def forward(ctx, d, t):
        t.add_(1)
        ctx.t = t
        return d.clone()

    @staticmethod
    def backward(ctx, g):
        ctx.t.add_(1)
        return g, None


class ChangeSaved(torch.autograd.Function):
    @staticmethod
    def forward(ctx, d, t):
        ctx.save_for_backward(t)
        return d * t

    @staticmethod
    def backward(ctx, g):
        t, = ctx.saved_tensors
        t.mul_(2)
        return g * t, None


_BACKWARD_CALLS = []
_BACKWARD_COUNT = 0


class CountInGlobals(torch.autograd.Function):
    @staticmethod
    def forward(ctx, d):
        return d * 2

    @staticmethod
    def backward(ctx, g):
        global _BACKWARD_COUNT
        _BACKWARD_COUNT += 1
        return g * 2


class AppendToGlobalList(torch.autograd.Function):
    @staticmethod
    def forward(ctx, d):
        return d * 2

    @staticmethod
    def backward(ctx, g):
        _BACKWARD_CALLS.append(1)
        return g * 2


class PrintInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, d):
        return d * 2

    @staticmethod
    def backward(ctx, g):
        print("backward ran")
        return g * 2


def _closure_functions():
    calls, module = [], torch.nn.Module()
    module.backward_calls = 0
    count = 0

    class AppendToClosure(torch.autograd.Function):
        @staticmethod
        def forward(ctx, d):
            return d * 2

        @staticmethod
        def backward(ctx, g):
            calls.append(1)
            return g * 2

    class CountOnModule(torch.autograd.Function):
        @staticmethod
        def forward(ctx, d):
            return d * 2

        @staticmethod
        def backward(ctx, g):
            module.backward_calls += 1
            return g * 2

    class Nonlocal(torch.autograd.Function):
        @staticmethod
        def forward(ctx, d):
            return d * 2

        @staticmethod
        def backward(ctx, g):
            nonlocal count
            count += 1
            return g * 2

    def state():
        return len(calls), module.backward_calls, count

    return (AppendToClosure, CountOnModule, Nonlocal), state


def _plain_or_two(kind, *shape, requires_grad=False):
    if kind == "plain":
        return torch.randn(*shape, requires_grad=requires_grad)
    return TwoTensor(torch.randn(*shape), torch.randn(*shape)).requires_grad_(requires_grad)


@pytest.mark.parametrize("kind", ["plain", "TwoTensor"])
@pytest.mark.parametrize("fn_class", [KeepOnCtx, ChangeSaved])
def test_backward_changing_a_tensor_it_did_not_make_follows_eager(kind, fn_class):
    d = _plain_or_two(kind, 3, requires_grad=True)
    t = torch.zeros(3) if kind == "plain" else TwoTensor(torch.zeros(3), torch.ones(3))
    ed, et = d.detach().clone().requires_grad_(), t.clone()
    fn_class.apply(ed, et).sum().backward()
    jf = thunder_subclass.jit(lambda d, t: fn_class.apply(d, t))
    with pytest.warns(thunder_subclass.GraphBreakWarning, match="UnsupportedBackwardEffectError"):
        out = jf(d, t)
    out.sum().backward()
    assert type(t) is type(et)
    torch.testing.assert_close(t, et)          # the backward's in-place change reached the caller's tensor
    torch.testing.assert_close(d.grad, ed.grad)


@pytest.mark.parametrize("kind", ["plain", "TwoTensor"])
def test_backward_changing_a_tensor_it_did_not_make_raises_with_fullgraph(kind):
    d = _plain_or_two(kind, 3, requires_grad=True)
    t = torch.zeros(3) if kind == "plain" else TwoTensor(torch.zeros(3), torch.ones(3))
    jf = thunder_subclass.jit(lambda d, t: KeepOnCtx.apply(d, t), fullgraph=True)
    with pytest.raises(thunder_subclass.UnsupportedBackwardEffectError,
                       match=r"KeepOnCtx.backward changes a tensor it did not make in place \(aten.add_ at "
                             r".*test_training.py:\d+.*Function outside the compiled function"):
        jf(d, t)
    torch.testing.assert_close(t, torch.zeros(3) if kind == "plain" else TwoTensor(torch.zeros(3), torch.ones(3)))


@pytest.mark.parametrize("kind", ["plain", "TwoTensor"])
def test_backward_writing_python_state_follows_eager(kind, capsys):
    global _BACKWARD_COUNT
    closure_classes, state = _closure_functions()
    for fn_class in (CountInGlobals, AppendToGlobalList, PrintInBackward, *closure_classes):
        before = (_BACKWARD_COUNT, len(_BACKWARD_CALLS), state())
        d = _plain_or_two(kind, 3, requires_grad=True)
        jf = thunder_subclass.jit(lambda d: fn_class.apply(d))
        with pytest.warns(thunder_subclass.GraphBreakWarning, match=f"{fn_class.__name__}.backward"):
            out = jf(d)
        # nothing ran for real at trace time: the fake run's writes were put back, its output dropped
        assert (_BACKWARD_COUNT, len(_BACKWARD_CALLS), state()) == before
        capsys.readouterr()
        for _ in range(2):
            jf(d).sum().backward()
        out.sum().backward()
        after = (_BACKWARD_COUNT, len(_BACKWARD_CALLS), state())
        expected = {CountInGlobals: (before[0] + 3, before[1], before[2]),
                    AppendToGlobalList: (before[0], before[1] + 3, before[2])}
        if fn_class in expected:
            assert after == expected[fn_class]
        elif fn_class is PrintInBackward:
            assert capsys.readouterr().out == "backward ran\n" * 3
        else:
            assert sum(after[2]) == sum(before[2]) + 3, (fn_class, before, after)
        torch.testing.assert_close(d.grad, torch.full_like(d, 6.0))


@pytest.mark.parametrize("fn_class", [CountInGlobals, PrintInBackward])
def test_backward_writing_python_state_raises_with_fullgraph(fn_class):
    jf = thunder_subclass.jit(lambda d: fn_class.apply(d), fullgraph=True)
    what = "the globals of test_training" if fn_class is CountInGlobals else "print"
    with pytest.raises(thunder_subclass.UnsupportedBackwardEffectError,
                       match=rf"{fn_class.__name__}.backward .*{what}.*backward defined at .*test_training.py:\d+.*"
                             r"for the call .*apply at .*test_training.py:\d+"):
        jf(torch.randn(3, requires_grad=True))


@pytest.mark.parametrize("kind", ["plain", "TwoTensor"])
def test_backward_without_side_effects_stays_compiled(kind):
    class Pure(torch.autograd.Function):
        @staticmethod
        def forward(ctx, d, w):
            ctx.save_for_backward(d, w)
            ctx.scale = 3.0
            return d * w

        @staticmethod
        def backward(ctx, g):
            d, w = ctx.saved_tensors
            grads = []
            grads.append(g * w * ctx.scale)
            return grads[0], (g * d).view(-1).view(d.shape)

    d, w = _plain_or_two(kind, 3, requires_grad=True), _plain_or_two(kind, 3, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", thunder_subclass.GraphBreakWarning)  # compiled as one trace, no break
        check_training(lambda d, w: Pure.apply(d, w).sum(), d, w)


# ---------------------------------------------------------------------------------------------------------------
# create_graph=True: gradients with history, second derivatives equal to eager (thunder_subclass.transforms.higher_order)
# ---------------------------------------------------------------------------------------------------------------

class _Critic(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)
        self.calls = 0
        if kind == "TwoTensor":
            w = self.fc1.weight.detach()
            self.fc1.weight = torch.nn.Parameter(TwoTensor(w.clone(), w * 0.5))

    def forward(self, x):
        self.calls += 1
        return self.fc2(torch.tanh(self.fc1(x)))


@pytest.mark.parametrize("kind", ["plain", "TwoTensor"])
def test_gradient_penalty_equals_eager(kind):
    torch.manual_seed(0)
    critic = _Critic(kind)
    eager = copy.deepcopy(critic)
    jcritic = thunder_subclass.jit(critic)
    real, fake = torch.randn(5, 4), torch.randn(5, 4)
    alpha = torch.rand(5, 1)
    losses = []
    for m in (eager, jcritic):
        x_hat = (alpha * real + (1 - alpha) * fake).requires_grad_()
        out = m(x_hat)
        (g,) = torch.autograd.grad(out.sum(), x_hat, create_graph=True)
        penalty = ((g.norm(2, dim=1) - 1) ** 2).mean()
        loss = m(fake).mean() - out.mean() + 10 * penalty
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1], losses[0])
    for p, ep in zip(critic.parameters(), eager.parameters()):
        assert type(p.grad) is type(ep.grad)
        torch.testing.assert_close(p.grad, ep.grad)
    assert critic.calls == eager.calls == 2  # the eager recomputation's attribute write was put back


@pytest.mark.parametrize("kind", ["plain", "TwoTensor"])
def test_hessian_vector_product_equals_eager(kind):
    def f(x, w):
        return ((x * w).sin() * x).sum()

    x, w, v = (_plain_or_two(kind, 4) for _ in range(3))
    x.requires_grad_()
    w.requires_grad_()
    jf = thunder_subclass.jit(f)
    results = []
    for fn in (f, jf):
        (g,) = torch.autograd.grad(fn(x, w), x, create_graph=True)
        hvp_x, hvp_w = torch.autograd.grad((g * v).sum(), (x, w))
        results.append((g.detach(), hvp_x, hvp_w))
    for actual, expected in zip(results[1], results[0]):
        assert type(actual) is type(expected)
        torch.testing.assert_close(actual, expected)


def test_third_derivative_and_several_outputs_equal_eager():
    def f(x):
        y = x.sin() * x
        return {"b": y.sum(), "a": (y * 2).exp().sum()}  # dict order differs from thunder's flat outputs' (sorted)

    x = torch.randn(3, requires_grad=True)
    jf = thunder_subclass.jit(f)
    results = []
    for fn in (f, jf):
        out = fn(x)
        (g1,) = torch.autograd.grad(out["b"] + 0.5 * out["a"], x, create_graph=True)
        (g2,) = torch.autograd.grad(g1.sum(), x, create_graph=True)
        (g3,) = torch.autograd.grad(g2.sum(), x)
        results.append((g1.detach(), g2.detach(), g3))
    for actual, expected in zip(results[1], results[0]):
        torch.testing.assert_close(actual, expected)


def test_create_graph_refused_where_recomputing_could_differ():
    x = torch.randn(3, requires_grad=True)
    jf = thunder_subclass.jit(lambda x: (x.sin() * x).sum())
    out = jf(x)
    with torch.no_grad():
        x.add_(1)  # changed after the forward: recomputing would differentiate another function value
    with pytest.raises(thunder_subclass.HigherOrderGradientError,
                       match=r"compiled function .*<lambda> was .* an argument was freed or changed in place since the forward"):
        torch.autograd.grad(out, x, create_graph=True)
    bn = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    running = bn[1].running_mean.clone()
    jbn = thunder_subclass.jit(bn)
    out = jbn(torch.randn(4, 3, requires_grad=True)).sum()
    after_forward = bn[1].running_mean.clone()
    assert not torch.equal(after_forward, running)
    with pytest.raises(thunder_subclass.HigherOrderGradientError,
                       match=r"compiled module Sequential .* its forward changes a tensor in place that outlives"):
        torch.autograd.grad(out, list(bn.parameters()), create_graph=True)
    torch.testing.assert_close(bn[1].running_mean, after_forward)  # not updated twice
