"""Reliability (issue 9): every guard scenario recompiles with correct results; bad input gives typed errors that
name the subclass, the op and the user's line; the plugin leaves thunder as it was."""

import re

import pytest
import thunder
import torch
from torch.utils._pytree import tree_map

import thunder_subclass
from thunder_subclass._thunder_internals import record_of
from thunder_subclass import (
    SubclassDispatchError,
    SubclassProtocolError,
    TensorSubclassError,
    UnsupportedSubclassOperationError,
)
from subclasses import NoFlattenTensor, ScaledTensor, TwoTensor, nested_two_tensor
from helpers import two
from test_protocol import Mesh, MeshTensor, needs_opaque_attributes
from test_training import assert_same

aten = torch.ops.aten


def _f(t):
    return (t * 2 + 1).sin()


class MaybeScaled(torch.Tensor):
    """Flattens to ["data_"] or, with a scale, ["data_", "scale"]: the attribute names depend on the instance."""

    @staticmethod
    def __new__(cls, data, scale=None):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype, device=data.device)

    def __init__(self, data, scale=None):
        self.data_, self.scale = data, scale

    def __tensor_flatten__(self):
        return (["data_", "scale"] if self.scale is not None else ["data_"]), None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return MaybeScaled(inner["data_"], inner.get("scale"))

    def value(self):
        return self.data_ * self.scale if self.scale is not None else self.data_

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        args, kwargs = tree_map(lambda a: a.value() if isinstance(a, MaybeScaled) else a, (args, kwargs or {}))
        return func(*args, **kwargs)


def _detach_all(t):
    """Detached, inner tensors too (an inner tensor that requires grad makes inner results require grad)."""
    if type(t) is torch.Tensor:
        return t.detach()
    attrs, ctx = t.__tensor_flatten__()
    inner = {a: _detach_all(getattr(t, a)) if isinstance(getattr(t, a), torch.Tensor) else getattr(t, a) for a in attrs}
    return type(t).__tensor_unflatten__(inner, ctx, t.shape, t.stride())


# each scenario: (first input, second input that must not reuse the first trace)
SCENARIOS = {
    "subclass type": lambda: (two(3, 3), ScaledTensor(torch.randn(3, 3), 0.5)),
    "flatten context": lambda: (ScaledTensor(torch.randn(3, 3), 0.5), ScaledTensor(torch.randn(3, 3), 2.0)),
    "attribute names": lambda: (MaybeScaled(torch.randn(3, 3)), MaybeScaled(torch.randn(3, 3), torch.randn(3, 3))),
    "inner dtype": lambda: (two(3, 3), two(3, 3, dtype=torch.float64)),
    "shape": lambda: (two(3, 3), two(2, 3)),
    "device": lambda: (two(3, 3), two(3, 3, device="meta")),
    "requires_grad": lambda: (two(3, 3), two(3, 3).requires_grad_()),
    "inner requires_grad": lambda: (
        MaybeScaled(torch.randn(3, 3), torch.randn(3, 3)),
        MaybeScaled(torch.randn(3, 3), torch.randn(3, 3).requires_grad_()),
    ),
    "opaque guard_fn value": lambda: (MeshTensor(torch.randn(3, 3), Mesh(2)), MeshTensor(torch.randn(3, 3), Mesh(3))),
    "nesting structure": lambda: (two(3, 3), nested_two_tensor(*(torch.randn(3, 3) for _ in range(4)))),
}


@pytest.mark.parametrize(
    "scenario",
    [pytest.param(s, marks=needs_opaque_attributes) if s.startswith("opaque") else s for s in SCENARIOS],
)
def test_guard_scenario_recompiles_with_correct_result(scenario):
    first, second = SCENARIOS[scenario]()
    f = (lambda t: t * 2) if scenario in ("attribute names", "inner requires_grad", "opaque guard_fn value") else _f
    jf = thunder_subclass.jit(f)
    assert_same(jf(first).detach(), f(first).detach())
    out = jf(second)
    assert thunder.cache_misses(jf) == 2, f"{scenario}: the first trace was reused"
    expected = f(second)
    if scenario == "device":  # meta tensors have no values: compare type and metadata
        assert type(out) is type(expected) and out.device == expected.device and out.shape == expected.shape
    else:
        assert_same(_detach_all(out), _detach_all(expected))
    jf(first)  # and the first input still hits its own trace
    assert thunder.cache_hits(jf) == 1


# ---------------------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------------------


class Wrap(torch.Tensor):
    """A one-tensor wrapper; ``mode`` selects a bug: wrong unflatten shape/type, raising dispatch, wrong number
    of dispatch outputs, data-dependent ops inside dispatch."""

    @staticmethod
    def __new__(cls, elem, mode="ok"):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype, device=elem.device)

    def __init__(self, elem, mode="ok"):
        self.elem, self.mode = elem, mode

    def __repr__(self):
        return f"Wrap({self.mode})"

    def __tensor_flatten__(self):
        return ["elem"], self.mode

    @staticmethod
    def __tensor_unflatten__(inner, mode, outer_size, outer_stride):
        if mode == "unflatten-shape":
            return Wrap(inner["elem"].reshape(-1), mode)
        if mode == "unflatten-type":
            return inner["elem"]
        return Wrap(inner["elem"], mode)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        mode = next(a.mode for a in args if isinstance(a, Wrap))
        uargs, ukwargs = tree_map(lambda a: a.elem if isinstance(a, Wrap) else a, (args, kwargs or {}))
        if mode == "raise" and func is aten.mul.Tensor:
            raise ValueError("Wrap cannot multiply")
        if mode == "outputs" and func is aten.mul.Tensor:
            return Wrap(func(*uargs, **ukwargs), mode), Wrap(func(*uargs, **ukwargs), mode)
        if mode == "item" and func is aten.mul.Tensor:
            scale = uargs[0].abs().max().item()  # data-dependent
            return Wrap(uargs[0] * scale, mode)
        if mode == "nonzero" and func is aten.mul.Tensor:
            idx = uargs[0].nonzero()
            return Wrap(uargs[0] * idx.shape[0], mode)
        out = func(*uargs, **ukwargs)
        return tree_map(lambda o: Wrap(o, mode) if isinstance(o, torch.Tensor) else o, out)


def _line_of(fragment):
    src = open(__file__).read().splitlines()
    return next(i + 1 for i, line in enumerate(src) if fragment in line)


def test_class_without_tensor_flatten():
    with pytest.raises(SubclassProtocolError, match=r"NoFlattenTensor overrides __torch_dispatch__ but does not "
                       r"define __tensor_flatten__ and __tensor_unflatten__"):
        thunder_subclass.jit(lambda t: t * 2)(NoFlattenTensor(torch.randn(3)))


def test_unflatten_returning_wrong_shape():
    x = Wrap(torch.randn(2, 3), "unflatten-shape")
    line = _line_of("# JIT-" + "LINE-SHAPE")
    with pytest.raises(SubclassProtocolError, match=r"Wrap.__tensor_unflatten__ returned .*shape \(6,\).* expected "
                       rf"\(2, 3\).*while tracing torch.Tensor.mul at .*test_reliability.py:{line}"):
        thunder_subclass.jit(lambda t: t * 2)(x)  # JIT-LINE-SHAPE


def test_unflatten_returning_wrong_type():
    x = Wrap(torch.randn(2, 3), "unflatten-type")
    line = _line_of("# JIT-" + "LINE-TYPE")
    with pytest.raises(SubclassProtocolError, match=r"Wrap.__tensor_unflatten__ returned a Tensor, not a Wrap.*"
                       rf"while tracing torch.Tensor.mul at .*test_reliability.py:{line}"):
        thunder_subclass.jit(lambda t: t * 2)(x)  # JIT-LINE-TYPE


def test_dispatch_raising_names_subclass_op_and_line():
    x = Wrap(torch.randn(3), "raise")
    line = _line_of("# JIT-" + "LINE-RAISE")
    with pytest.raises(SubclassDispatchError, match=rf"torch.Tensor.mul on Wrap failed while tracing at "
                       rf".*test_reliability.py:{line}: ValueError: Wrap cannot multiply"):
        thunder_subclass.jit(lambda t: t * 2)(x)  # JIT-LINE-RAISE


def test_dispatch_returning_wrong_number_of_outputs():
    x = Wrap(torch.randn(3), "outputs")  # returns two tensors for mul (eager: a TypeError from the operator)
    line = _line_of("# JIT-" + "LINE-OUTPUTS")
    with pytest.raises(TensorSubclassError, match=rf"torch.Tensor.mul on Wrap .*test_reliability.py:{line}"):
        thunder_subclass.jit(lambda t: t * 2)(x)  # JIT-LINE-OUTPUTS


@pytest.mark.parametrize("mode", ["item", "nonzero"])
def test_data_dependent_op_inside_dispatch(mode):
    x = Wrap(torch.randn(3), mode)
    line = _line_of("# JIT-" + "LINE-DATA")
    # fullgraph=True: the typed error, naming the op, the subclass and the line
    with pytest.raises(UnsupportedSubclassOperationError, match=rf"torch.Tensor.mul on Wrap at "
                       rf".*test_reliability.py:{line} makes a data-dependent computation inside dispatch"):
        thunder_subclass.jit(lambda t: t * 2, fullgraph=True)(x)  # JIT-LINE-DATA
    # by default a graph break: the call runs eagerly, with eager's result, and the warning names the same error
    jf = thunder_subclass.jit(lambda t: t * 2)
    with pytest.warns(thunder_subclass.GraphBreakWarning, match="makes a data-dependent computation inside dispatch"):
        out = jf(x)
    expected = x * 2
    assert type(out) is type(expected)
    torch.testing.assert_close(out.elem, expected.elem)
    assert len(jf.graph_breaks.breaks) == 1


def test_aten_op_without_thunder_mapping_runs_through_fallback():
    x = two(3, 4)
    f = lambda t: torch.special.erfcx(t.abs())  # noqa: E731
    jf = thunder_subclass.jit(f)
    assert_same(jf(x), f(x))
    assert "aten_special_erfcx_default" in [b.sym.name for b in thunder.last_traces(jf)[-1].bound_symbols]


# ---------------------------------------------------------------------------------------------------------------
# The plugin leaves thunder as it was
# ---------------------------------------------------------------------------------------------------------------


def _plain_trace_text():
    jf = thunder.jit(lambda a, b: (a * b).sin().sum(0))
    jf(torch.randn(3, 3), torch.randn(3, 3))
    text = "\n".join(str(t) for t in thunder.last_traces(jf)) + str(thunder.last_prologue_traces(jf)[-1])
    return re.sub(r"took \d+ milliseconds", "", text)


@pytest.mark.slow
def test_plain_thunder_is_unchanged_after_using_and_removing_the_plugin():
    import subprocess
    import sys

    # never enabled: a fresh interpreter that imports thunder_subclass (for the torch shims) but never jits
    code = (
        "import sys; sys.path.insert(0, %r); import thunder_subclass; import test_reliability as t; "
        "print(t._plain_trace_text())" % __file__.rsplit("/", 1)[0]
    )
    never = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    thunder_subclass.jit(_f)(two(3, 3))  # used in this process
    assert _plain_trace_text() == never  # hooks installed but inactive for plain jits
    thunder_subclass.uninstall_hooks()
    try:
        assert _plain_trace_text() == never
    finally:
        thunder_subclass.install_hooks()


# ---------------------------------------------------------------------------------------------------------------
# Interrupts and exits (issue 24): KeyboardInterrupt, SystemExit, GeneratorExit raised while tracing reach the caller
# as themselves (not a RuntimeError that `except Exception` swallows), and the next call works
# ---------------------------------------------------------------------------------------------------------------


class Interrupting(torch.Tensor):
    """A one-tensor wrapper whose ``__torch_dispatch__`` raises ``Interrupting.raise_on[op]`` (an exception class)
    for the aten ops listed there, and whose ``__tensor_unflatten__`` raises ``raise_on["unflatten"]``."""

    raise_on: dict = {}

    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype, device=elem.device,
                                                   requires_grad=elem.requires_grad)

    def __init__(self, elem):
        self.elem = elem

    def __repr__(self):
        return "Interrupting()"

    def __tensor_flatten__(self):
        return ["elem"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        if "unflatten" in Interrupting.raise_on:
            raise Interrupting.raise_on["unflatten"]()
        return Interrupting(inner["elem"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func in Interrupting.raise_on:
            raise Interrupting.raise_on[func]()
        uargs, ukwargs = tree_map(lambda a: a.elem if isinstance(a, Interrupting) else a, (args, kwargs or {}))
        out = func(*uargs, **ukwargs)
        return tree_map(lambda o: Interrupting(o) if isinstance(o, torch.Tensor) else o, out)


_interrupt_in_user_code: list = []


def _interrupted(t):
    if _interrupt_in_user_code:
        raise _interrupt_in_user_code[0]()
    return (t * 2).sin()


INTERRUPT_PLACES = {
    "user code": lambda exc: _interrupt_in_user_code.append(exc),
    "__torch_dispatch__ (forward)": lambda exc: Interrupting.raise_on.__setitem__(aten.mul.Tensor, exc),
    "__torch_dispatch__ (recording the backward)": lambda exc: Interrupting.raise_on.__setitem__(aten.cos.default, exc),
    "__tensor_unflatten__": lambda exc: Interrupting.raise_on.__setitem__("unflatten", exc),
}


@pytest.mark.parametrize("place", INTERRUPT_PLACES)
@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_interrupt_while_tracing_reaches_the_caller_and_next_call_works(place, exc):
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    jf = thunder_subclass.jit(_interrupted)
    x = Interrupting(torch.randn(3, requires_grad=True))
    INTERRUPT_PLACES[place](exc)
    try:
        with pytest.raises(exc) as info:  # the interrupt itself, not an InterpreterError (a RuntimeError)
            jf(x)
        assert type(info.value) is exc
    finally:
        Interrupting.raise_on.clear()
        _interrupt_in_user_code.clear()
    assert _get_current_dispatch_mode_stack() == []  # no fake or recording mode left entered
    assert torch.is_grad_enabled()
    assert thunder.cache_misses(jf) == 1 and thunder.cache_hits(jf) == 0  # nothing was cached
    out = jf(x)
    expected = _interrupted(x)
    assert_same(_detach_all(out), _detach_all(expected))
    out.sum().backward()
    expected_grad = torch.autograd.grad(_interrupted(x).sum(), x)[0]
    assert_same(x.grad, expected_grad)
    assert thunder.cache_misses(jf) == 2


# ---------------------------------------------------------------------------------------------------------------
# Module lifecycle (issue 24): copy.deepcopy of a compiled module
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("weight", ["plain", "TwoTensor"])
def test_deepcopy_of_compiled_module_compiles_and_trains_on_its_own(weight):
    import copy

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    if weight == "TwoTensor":
        model[0].weight = torch.nn.Parameter(TwoTensor(torch.randn(4, 4), torch.randn(4, 4)))
    reference = copy.deepcopy(model)
    jm = thunder_subclass.jit(model)
    x = torch.randn(3, 4)
    jm(x).sum().backward()  # the original has run (and has a cache entry, gradients)
    reference(x).sum().backward()

    jm2 = copy.deepcopy(jm)
    reference2 = copy.deepcopy(reference)
    assert isinstance(jm2, thunder.core.module.ThunderModule)
    assert thunder.cache_misses(jm2) == 0  # compiled anew
    for p, p2, p_ref2 in zip(jm.parameters(), jm2.parameters(), reference2.parameters()):
        assert p2 is not p
        assert_same(p2.detach(), p_ref2.detach())
        assert_same(p2.grad, p_ref2.grad)  # as eager's deepcopy leaves them

    opt, opt_ref = torch.optim.SGD(jm2.parameters(), lr=0.1), torch.optim.SGD(reference2.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad(), opt_ref.zero_grad()
        jm2(x).sum().backward()
        reference2(x).sum().backward()
        opt.step(), opt_ref.step()
    assert thunder.cache_misses(jm2) == 1 and thunder.cache_hits(jm2) == 1
    for p, p_ref in zip(jm2.parameters(), reference2.parameters()):
        assert_same(p.detach(), p_ref.detach())
        assert_same(p.grad, p_ref.grad)
    # the original: its parameters and gradients as before the copy trained
    for p, p_ref in zip(jm.parameters(), reference.parameters()):
        assert_same(p.detach(), p_ref.detach())
        assert_same(p.grad, p_ref.grad)
    assert thunder.cache_misses(jm) == 1 and thunder.cache_hits(jm) == 0
    assert_same(jm(x).detach(), reference(x).detach())


def test_deepcopy_of_module_compiled_with_the_plugin():
    import copy

    from thunder.recipes import BaseRecipe

    model = torch.nn.Linear(4, 2)
    cm = thunder.compile(model, recipe=BaseRecipe(fuser="torch.compile"), plugins="tensor-subclass")
    cm2 = copy.deepcopy(cm)
    x = TwoTensor(torch.randn(3, 4), torch.randn(3, 4))
    assert cm2.weight is not cm.weight
    assert_same(cm2(x), model(x))
    assert thunder.cache_misses(cm2) == 1 and thunder.cache_misses(cm) == 0


class _MaskedChild(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        return y * y[y > 0].sum()  # a shape that depends on the data: a graph break


class _BreakingParent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.child, self.out = _MaskedChild(), torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.out(self.child(x)).tanh()


@pytest.mark.filterwarnings("ignore:The 'symbolic values' cache option is highly experimental")
def test_deepcopy_of_a_module_compiled_with_symbolic_sizes_keeps_its_cache_bound():
    # issue 42: a copy of a dynamic=True module (no fast path) was compiled without the original's cache policy:
    # no bound, and explain_recompiles refused it
    import copy

    from thunder_subclass.errors import CacheLimitWarning

    model = torch.nn.Linear(4, 2)
    jm2 = copy.deepcopy(thunder_subclass.jit(model, dynamic=True, cache_size_limit=1))
    reference = copy.deepcopy(model)
    x = torch.randn(3, 4)
    assert_same(jm2(x), reference(x))
    two = TwoTensor(torch.randn(3, 4), torch.randn(3, 4))
    with pytest.warns(CacheLimitWarning, match=r"reached its cache size limit \(1 entries"):
        out = jm2(two)  # no entry accepts it, and the bound is reached: eager
    assert_same(out, reference(two))
    assert len(thunder.compile_stats(jm2).interpreter_cache) == 1
    assert len(thunder_subclass.explain_recompiles(jm2)) == 1


@pytest.mark.filterwarnings("ignore::thunder_subclass.GraphBreakWarning")
def test_deepcopy_of_a_module_compiled_with_graph_breaks_keeps_them():
    # issue 40: the copy was compiled without graph breaks, and its first call raised thunder's NotImplementedError
    import copy

    torch.manual_seed(0)
    model = _BreakingParent()
    jm = thunder_subclass.jit(model)
    x = torch.randn(3, 4)
    for _ in range(2):
        assert_same(jm(x), model(x))
    jm2 = copy.deepcopy(jm)
    reference = copy.deepcopy(model)
    for _ in range(2):  # the first call observes the break, the second runs the child eagerly inside a trace
        out, expected = jm2(x), reference(x)
        assert_same(out, expected)
        out.sum().backward()
        expected.sum().backward()
    # the same break, and the same compiled regions as the original's second call
    assert [(b.name, b.location) for b in jm2.graph_breaks.breaks] == \
           [(b.name, b.location) for b in jm.graph_breaks.breaks] == [("child", jm.graph_breaks.breaks[0].location)]
    assert "boolean advanced indexing" in jm2.graph_breaks.breaks[0].reason
    assert sorted(jm2.graph_breaks.regions) == sorted(jm.graph_breaks.regions)
    for p, p_ref, p_orig in zip(jm2.parameters(), reference.parameters(), jm.parameters()):
        assert p is not p_orig
        assert_same(p.grad, p_ref.grad)
        assert p_orig.grad is None  # the original is untouched by the copy's training
    assert record_of(jm2).graph_break_program() is not record_of(jm).graph_break_program() is not None


# Double backward (issue 24, then 41): never a gradient without its second-order term; with create_graph=True the
# call is recomputed eagerly for the backward (thunder_subclass.transforms.higher_order), so it equals eager's
# ---------------------------------------------------------------------------------------------------------------


def _second_order(t):
    return (t.sin() * t).sum()


@pytest.mark.parametrize("kind", ["plain", "TwoTensor"])
@pytest.mark.parametrize("how", ["autograd.grad", "backward"])
@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
def test_create_graph_through_compiled_backward_equals_eager(kind, how):
    x = (torch.randn(4) if kind == "plain" else two(4)).requires_grad_()
    ex = x.detach().clone().requires_grad_()
    jf = thunder_subclass.jit(_second_order)
    grads = []
    for fn, t in ((_second_order, ex), (jf, x)):
        out = fn(t)
        if how == "autograd.grad":
            (g,) = torch.autograd.grad(out, t, create_graph=True)
        else:
            out.backward(create_graph=True)
            g = t.grad
        assert g.requires_grad  # it carries history
        (gg,) = torch.autograd.grad(g.sum(), t)
        grads.append((g.detach(), gg))
    assert_same(grads[1][0], grads[0][0])
    assert_same(grads[1][1], grads[0][1])
    # first-order gradients still come from the compiled backward, and equal eager's
    out = jf(x)
    (g,) = torch.autograd.grad(out, x)
    assert_same(g, torch.autograd.grad(_second_order(x), x)[0])


def test_create_graph_refused_names_the_module():
    jm = thunder_subclass.jit(torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout(0.5)))
    x = torch.randn(2, 3, requires_grad=True)
    with pytest.raises(thunder_subclass.HigherOrderGradientError,
                       match=r"the compiled module Sequential .* its forward draws random numbers"):
        torch.autograd.grad(jm(x).sum(), x, create_graph=True)
