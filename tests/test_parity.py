"""Parity with eager on the subclass protocol: programs written elsewhere (PyTorch's and thunder's subclass tests)
behave as eager under thunder_subclass.jit: values, output types, gradients, input mutations, requires_grad."""

import pytest
import thunder
import torch
from torch import nn
import torch.nn.functional as F
from torch.testing._internal.custom_tensor import ConstantExtraMetadataTensor
from torch.utils._python_dispatch import TorchDispatchMode

import thunder_subclass
from thunder_subclass import SubclassGradRuleError, SubclassProtocolError, TensorSubclassError
from subclasses import TwoTensor
from helpers import cache_counts, two
from test_training import _clone_leaf, assert_same


# -- isinstance / type / attributes ----------------------------------------------------------------------------


def test_isinstance_parameter_of_a_subclass_takes_eagers_branch():
    def f(w):
        return w + 1 if isinstance(w, nn.Parameter) else w + 2

    p, t = nn.Parameter(two(3)), two(3)
    jf = thunder_subclass.jit(f)
    for x in (p, t):
        assert_same(jf(x).detach(), f(x).detach())
    assert thunder.cache_misses(jf) == 2  # a Parameter and a plain TwoTensor are different programs


def test_type_issubclass_and_class_attribute_as_eager():
    def f(x):
        checks = (type(x) is TwoTensor, issubclass(type(x), torch.Tensor), x.__class__ is TwoTensor,
                  isinstance(x, torch.Tensor), isinstance(x, TwoTensor), isinstance(x, nn.Parameter))
        return x * sum(2 ** i for i, c in enumerate(checks) if c)

    x = two(3)
    assert_same(thunder_subclass.jit(f)(x), f(x))


def test_non_tensor_attribute_in_flatten_context_reads_eagers_value_and_is_guarded():
    def f(x):
        return x * x.constant_attribute

    jf = thunder_subclass.jit(f)
    c = ConstantExtraMetadataTensor(torch.randn(3))
    assert_same(jf(c), f(c))
    c2 = ConstantExtraMetadataTensor(torch.randn(3))
    c2.constant_attribute = 5  # also changes the flatten context
    assert_same(jf(c2), f(c2))
    assert thunder.cache_misses(jf) == 2
    assert_same(jf(c), f(c))
    assert thunder.cache_misses(jf) == 2


def test_attribute_set_on_a_parameter_subclass_is_read_and_guarded():
    p = nn.Parameter(two(3))
    p.quant_type = "int8"

    def f(w):
        return w * 2 if w.quant_type == "int8" else w * 3

    jf = thunder_subclass.jit(f)
    assert_same(jf(p).detach(), f(p).detach())
    p.quant_type = "int4"
    assert_same(jf(p).detach(), f(p).detach())  # a change recompiles
    assert thunder.cache_misses(jf) == 2
    del p.quant_type
    with pytest.raises(AttributeError, match="quant_type"):
        f(p)
    with pytest.raises(Exception, match="quant_type"):
        jf(p)


def test_method_and_property_the_subclass_defines_run_on_the_proxy():
    class WithHelpers(TwoTensor):
        @property
        def total(self):
            return self.a + self.b

        def halves(self):
            return self.a / 2, self.b / 2

        @staticmethod
        def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
            return WithHelpers(inner["a"], inner["b"], outer_size, outer_stride)

    def f(x):
        h = x.halves()
        return x.total * h[0] + h[1]

    x = WithHelpers(torch.randn(3), torch.randn(3))
    jf = thunder_subclass.jit(f)
    torch.testing.assert_close(jf(x), f(x))
    # the inner tensors are read where the user's code reads them
    assert "flatten_WithHelpers" in [b.sym.name for b in thunder.last_traces(jf)[0].bound_symbols]


# -- autograd: in-place on non-leaves, requires_grad of outputs ---------------------------------------------


def test_in_place_on_a_non_leaf_subclass_that_requires_grad():
    def f(base):
        b = base + 1
        b.mul_(3)
        return b + 1

    x = two(3, requires_grad=True)
    ex = _clone_leaf(x)
    out, eout = thunder_subclass.jit(f)(x), f(ex)
    assert_same(out.detach(), eout.detach())
    out.sum().backward()
    eout.sum().backward()
    assert_same(x.grad, ex.grad)  # 3, through the in-place mul_


@pytest.mark.parametrize("kind", ["plain", "subclass"])
def test_in_place_on_a_non_leaf_input_that_requires_grad(kind):
    # PyTorch's test_aotdispatch input-mutation tests with make_inputs_subclasses: the argument is base.add(1);
    # thunder 0.2.6 differentiated with respect to the input's last alias, so the outputs did not require grad
    # ("element 0 of tensors does not require grad"), with plain thunder.jit too
    def f(a, b):
        a.mul_(2)
        b.add_(a)
        return a * 3 + b

    def leaves():
        torch.manual_seed(0)
        make = (lambda: torch.randn(3, 3)) if kind == "plain" else (lambda: two(3, 3))
        return [make().requires_grad_() for _ in range(2)]

    bases, ebases = leaves(), leaves()
    args, eargs = [t.add(1) for t in bases], [t.add(1) for t in ebases]
    out, expected = thunder_subclass.jit(f)(*args), f(*eargs)
    assert_same(out.detach(), expected.detach())
    for got, want in zip(args, eargs):  # the callers' tensors changed as in eager
        assert_same(got.detach(), want.detach())
    assert out.requires_grad
    out.sum().backward()
    expected.sum().backward()
    for got, want in zip(bases, ebases):
        assert_same(got.grad, want.grad)

    def g(a, b):  # the changed input is not used afterwards: the change still reaches the caller
        a.mul_(2)
        return b * 2

    bases, ebases = leaves(), leaves()
    args, eargs = [t.add(1) for t in bases], [t.add(1) for t in ebases]
    out, expected = thunder_subclass.jit(g)(*args), g(*eargs)
    assert_same(out.detach(), expected.detach())
    assert_same(args[0].detach(), eargs[0].detach())
    out.sum().backward()
    expected.sum().backward()
    assert bases[0].grad is None and ebases[0].grad is None  # nothing used a's new value: undefined, as eager
    assert_same(bases[1].grad, ebases[1].grad)

    # the changed inputs' autograd history is the compiled function's, as eager's is the in-place ops': later uses
    # differentiate through the change (disk_cache=False: a trace, as the first jit of f; a new jit would load f's
    # entry from disk)
    bases, ebases = leaves(), leaves()
    args, eargs = [t.add(1) for t in bases], [t.add(1) for t in ebases]
    out, expected = thunder_subclass.jit(f, disk_cache=False)(*args), f(*eargs)
    w = torch.arange(9.0).reshape(3, 3)
    ((out * w).sum() + (args[0] * w * w).sum() + (args[1] * 5).sum()).backward()
    ((expected * w).sum() + (eargs[0] * w * w).sum() + (eargs[1] * 5).sum()).backward()
    for got, want in zip(bases, ebases):
        assert_same(got.grad, want.grad)

    def h(a):  # the changed input returned: the caller's object itself, as in eager
        a.mul_(2)
        return a

    bases, ebases = leaves(), leaves()
    x, ex = bases[0].add(1), ebases[0].add(1)
    out, expected = thunder_subclass.jit(h)(x), h(ex)
    assert out is x and expected is ex and out.requires_grad
    (out * w).sum().backward()
    (expected * w).sum().backward()
    assert_same(bases[0].grad, ebases[0].grad)


def test_in_place_on_a_leaf_that_requires_grad_fails_as_in_eager():
    x = two(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        x.clone().detach().requires_grad_().mul_(2)  # eager
    with pytest.raises(TensorSubclassError, match="leaf Variable that requires grad"):
        thunder_subclass.jit(lambda t: t.mul_(2))(x)


def test_requires_grad_of_each_output_is_eagers():
    def f(x, w):
        y = x * 2
        return y, y.a, (w > 0), w.detach() * 3, w.sum(), x.a + 1, torch.ones(2)

    x = two(3, requires_grad=True)  # the TwoTensor is the leaf; its inner tensors do not require grad
    w = torch.randn(3, requires_grad=True)
    outs, expected = thunder_subclass.jit(f)(x, w), f(x, w)
    assert [o.requires_grad for o in outs] == [e.requires_grad for e in expected] == [
        True, False, False, False, True, False, False]
    for o, e in zip(outs, expected):
        assert_same(o.detach(), e.detach())


def test_inner_tensors_that_are_autograd_leaves_get_their_gradients():
    # TwoTensor(a, b) with a, b requiring grad: eager's x.a is the caller's leaf a, so x.a * 3 puts a gradient on
    # a.grad, and x.sin() one on x.grad; compiled, x.a is an input of its own (more: tests/test_protocol.py)
    def f(x):
        return x.a * 3 + x.sin()

    def make():
        torch.manual_seed(0)
        a, b = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
        return TwoTensor(a, b), a

    (x, a), (ex, ea) = make(), make()
    out, expected = thunder_subclass.jit(f)(x), f(ex)
    assert_same(out.detach(), expected.detach())
    out.sum().backward()
    expected.sum().backward()
    assert_same(x.grad, ex.grad)
    assert_same(a.grad, ea.grad)
    with torch.no_grad():  # nothing to differentiate: as eager
        assert_same(thunder_subclass.jit(f)(x), f(x))


# -- typed errors ----------------------------------------------------------------------------------------------


class NoCos(TwoTensor):
    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        if func is torch.ops.aten.cos.default:
            raise ValueError("NoCos has no cos")
        return super().__torch_dispatch__(func, types, args, kwargs)

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return NoCos(inner["a"], inner["b"], outer_size, outer_stride)


def test_grad_rule_failing_inside_a_subclass_op_names_the_rule_and_its_line():
    import thunder.torch as ltorch
    from thunder.core.transforms import get_grad, put_grad

    def sin_rule(a):
        out = ltorch.sin(a)
        put_grad(a, get_grad(out) * a.cos())  # NoCos raises here
        return out

    line = sin_rule.__code__.co_firstlineno + 2
    x = NoCos(torch.randn(3), torch.randn(3)).requires_grad_()
    with thunder_subclass.register_grad_rule(TwoTensor, torch.sin, sin_rule):
        with pytest.raises(SubclassGradRuleError,
                           match=rf"grad rule .*sin_rule for \(TwoTensor, sin\) raised SubclassDispatchError at "
                                 rf".*test_parity\.py:{line}: torch\.Tensor\.cos on NoCos") as info:
            thunder_subclass.jit(lambda t: t.sin())(x)
    assert isinstance(info.value.__cause__.__cause__, ValueError)


def test_malformed_tensor_flatten_is_a_protocol_error():
    class NamesOnly(TwoTensor):
        def __tensor_flatten__(self):
            return ["a", "b"]

    def f(t):
        return t.sin()

    line = f.__code__.co_firstlineno + 1
    with pytest.raises(SubclassProtocolError,
                       match=rf"NamesOnly.__tensor_flatten__ returned \['a', 'b'\]; it must return a pair .* "
                             rf"argument of sin at .*test_parity\.py:{line}"):
        thunder_subclass.jit(f)(NamesOnly(torch.randn(3), torch.randn(3)))


# -- dispatch modes ---------------------------------------------------------------------------------------------


class _LogMode(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append((func, tuple(t.__name__ for t in types)))
        return func(*args, **(kwargs or {}))


class _CompileInternalsMode(_LogMode):
    """Asks torch.compile to compile under it (and to run the compiled program under it)."""

    @classmethod
    def ignore_compile_internals(cls):
        return True


@pytest.mark.parametrize("fullgraph", [False, True])
def test_torch_dispatch_mode_around_the_call_sees_eagers_operations(fullgraph):
    # as torch.compile: a call under a user's TorchDispatchMode runs the function eagerly, so the mode sees the
    # aten operations on the subclasses that eager shows it (forward and backward), and nothing is traced
    def f(t, w):
        return ((t * w).sin() + 1).sum()

    x, w = two(3).requires_grad_(), two(3)
    ex = _clone_leaf(x)
    jf = thunder_subclass.jit(f, fullgraph=fullgraph)
    with _LogMode() as expected_ops:
        expected = f(ex, w)
        expected.backward()
    for _ in range(2):
        x.grad = None
        with _LogMode() as seen:
            out = jf(x, w)
            out.backward()
        assert seen.ops == expected_ops.ops
        assert ("TwoTensor",) in [types for _, types in seen.ops]  # the mode saw the subclass operations
        assert_same(out.detach(), expected.detach())
        assert_same(x.grad, ex.grad)
    assert thunder.cache_misses(jf) == 0
    x.grad = None
    assert_same(jf(x, w).detach(), expected.detach())  # outside the mode: compiled
    assert thunder.cache_misses(jf) == 1


def test_torch_dispatch_mode_around_a_compiled_module():
    model = torch.nn.Linear(3, 2)
    model.weight = torch.nn.Parameter(two(2, 3))
    jm = thunder_subclass.jit(model)
    x = torch.randn(4, 3)
    with _LogMode() as expected_ops:
        expected = model(x)
    with _LogMode() as seen:
        out = jm(x)
    assert seen.ops == expected_ops.ops
    assert_same(out.detach(), expected.detach())


def test_dispatch_mode_that_asks_to_be_compiled_under_is_a_typed_error():
    # a mode with ignore_compile_internals() wants the compiled program run under it: that program shows it the
    # flattened operations on inner tensors, not eager's operations on the subclass, so thunder_subclass refuses
    from thunder_subclass import UnsupportedSubclassOperationError

    def f(t):
        return (t * 2).sin()

    x = two(3)
    jf = thunder_subclass.jit(f)
    assert_same(jf(x), f(x))  # compiled outside the mode
    line = f.__code__.co_firstlineno + 1
    for _ in range(2):  # the cached trace is not reused under the mode; tracing under it raises
        with _CompileInternalsMode() as mode:
            with pytest.raises(UnsupportedSubclassOperationError,
                               match=rf"mul on TwoTensor at .*test_parity\.py:{line} runs under the TorchDispatchMode "
                                     r"_CompileInternalsMode.*Call the compiled function outside the mode"):
                jf(x)
        assert mode.ops == []  # nothing ran under the mode
    assert_same(jf(x), f(x))  # and outside it the first trace serves again
    assert thunder.cache_hits(jf) >= 1


# -- subclasses that override only __torch_function__ (non-wrapper) ---------------------------------------------


class Plain(torch.Tensor):
    """No overrides: PyTorch's default __torch_function__ keeps results Plain."""


class ExpForSigmoid(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.sigmoid:
            func = torch.Tensor.exp
        return super().__torch_function__(func, types, args, kwargs)


class TenDims(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func == torch.Tensor.ndim.__get__:
            return 10
        return super().__torch_function__(func, types, args, kwargs)


class Scaled(torch.Tensor):
    def __new__(cls, data, scale=2.0):
        return super().__new__(cls, data)

    def __init__(self, data, scale=2.0):
        self.scale = scale

    def scaled(self):
        return self * self.scale


def _same_typed(actual, expected):
    assert type(actual) is type(expected), (type(actual), type(expected))
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual.as_subclass(torch.Tensor), expected.as_subclass(torch.Tensor))
        assert actual.requires_grad == expected.requires_grad
    else:
        assert actual == expected


@pytest.mark.parametrize(
    "fn, make",
    [
        (lambda x: x * 2 + 1, lambda t: t.as_subclass(Plain)),
        (lambda x: (x.sigmoid(), torch.sigmoid(x)), lambda t: t.as_subclass(ExpForSigmoid)),
        (lambda x: x * x.ndim, lambda t: t.as_subclass(TenDims)),
        (lambda x: (x.T + 1, x.sum(), x.shape[0] * x), lambda t: t.reshape(2, 3).as_subclass(Plain)),
        (lambda x: x * 2 if isinstance(x, Plain) and type(x) is Plain else x * 3, lambda t: t.as_subclass(Plain)),
        (lambda x: x * x.scale, lambda t: Scaled(t, 4.0)),
        (lambda t: t.as_subclass(Plain) * 2, lambda t: t),
        (lambda t: Plain(t) * 2, lambda t: t),
        (lambda t: torch.Tensor._make_subclass(Plain, t) + 1, lambda t: t),
        (lambda t: Scaled(t, 3.0).scaled(), lambda t: t),
        (lambda t: (t.as_subclass(Plain).as_subclass(torch.Tensor) * 2), lambda t: t),
    ],
    ids=["default", "custom-func", "property", "views-reductions", "isinstance-type", "input-attribute",
         "as_subclass-inside", "constructor-inside", "make_subclass-inside", "new-init-method-inside", "back-to-plain"],
)
def test_torch_function_subclass_as_eager(fn, make):
    x = make(torch.randn(6))
    jf = thunder_subclass.jit(fn)
    out, expected = jf(x), fn(x)
    for o, e in zip(*((out, expected) if isinstance(out, tuple) else ((out,), (expected,)))):
        _same_typed(o, e)
    jf(make(torch.randn(6)))
    assert thunder.cache_hits(jf) == 1  # same type: the trace is reused


def test_torch_function_subclass_type_and_attributes_are_guarded():
    def f(x):
        return x * x.scale

    jf = thunder_subclass.jit(f)
    t = torch.randn(3)
    for x in (Scaled(t, 2.0), Scaled(t, 2.0), Scaled(t, 5.0), t.as_subclass(Plain)):
        if isinstance(x, Scaled):
            _same_typed(jf(x), f(x))
    assert thunder.cache_misses(jf) == 2 and thunder.cache_hits(jf) == 1
    with pytest.raises(Exception, match="scale"):  # a Plain has no .scale: a new trace, which fails as eager does
        jf(t.as_subclass(Plain))


def test_torch_function_subclass_runs_no_torch_function_at_run_time():
    calls = []

    class Counting(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if not isinstance(getattr(func, "__self__", None), type(torch.Tensor.shape)):  # property reads aside
                calls.append(func)
            return super().__torch_function__(func, types, args, kwargs)

    def f(x):
        return (x * 2).sin()

    x = torch.randn(3).as_subclass(Counting)
    expected = f(x)
    eager_calls = len(calls)  # __mul__, sin
    jf = thunder_subclass.jit(f)
    calls.clear()
    out = jf(x)
    assert len(calls) == eager_calls  # traced: __torch_function__ ran once per operation, as in eager
    calls.clear()
    out = jf(x)
    assert calls == []  # the compiled program runs none: its values are plain tensors inside (thunder's prologue
    # reads the input's shape/dtype/device, which eager passes through __torch_function__ as property reads)
    _same_typed(out, expected)
    assert "untyped" in [b.sym.name for b in thunder.last_traces(jf)[-1].bound_symbols]


def test_torch_function_subclass_training_as_eager():
    w = torch.randn(3, requires_grad=True)
    ew = w.detach().clone().requires_grad_()

    def f(x):
        return (x * x).sum(), x * 3

    (loss, y), (eloss, ey) = thunder_subclass.jit(f)(w.as_subclass(Plain)), f(ew.as_subclass(Plain))
    _same_typed(loss, eloss)
    _same_typed(y, ey)
    (loss + y.sum()).backward()
    (eloss + ey.sum()).backward()
    torch.testing.assert_close(w.grad, ew.grad)
    # a typed leaf that requires grad: its gradient is plain, as in eager
    x = torch.randn(3).as_subclass(Plain).requires_grad_()
    ex = x.detach().clone().as_subclass(Plain).requires_grad_()
    thunder_subclass.jit(lambda x: (x * 3).sum())(x).backward()
    (ex * 3).sum().backward()
    _same_typed(x.grad, ex.grad)


# -- parametrizations, in-place view ops, aliasing ----------------------------------------------------------------


def test_module_prepared_with_unwrap_tensor_subclass_parameters():
    import copy

    from torch._functorch._aot_autograd.subclass_parametrization import unwrap_tensor_subclass_parameters

    m = nn.Linear(4, 3)
    m.weight = nn.Parameter(two(3, 4))
    unwrap_tensor_subclass_parameters(m)  # parametrizations rebuild the TwoTensor from plain parameters
    em = copy.deepcopy(m)
    x = torch.randn(2, 4)
    out, expected = thunder_subclass.jit(m)(x), em(x)
    assert_same(out.detach(), expected.detach())
    out.sum().backward()
    expected.sum().backward()
    for (name, p), (_, ep) in zip(m.named_parameters(), em.named_parameters()):
        assert (p.grad is None) == (ep.grad is None), name
        if ep.grad is not None:
            assert_same(p.grad, ep.grad)


@pytest.mark.parametrize("op", ["transpose_", "t_", "unsqueeze_", "swapdims_"])
def test_in_place_view_ops(op):
    args = {"transpose_": (0, 1), "t_": (), "unsqueeze_": (0,), "swapdims_": (0, 1)}[op]

    def on_intermediate(x, y):
        z = x * 2
        getattr(z, op)(*args)
        return z + 1, z.shape

    def on_plain_input(p, y):
        getattr(p, op)(*args)
        return p * 2 + getattr(y, op.rstrip("_"))(*args).a

    x, y = two(3, 4), two(3, 4)
    out, expected = thunder_subclass.jit(on_intermediate)(x, y), on_intermediate(x, y)
    assert_same(out[0], expected[0])
    p, ep = torch.randn(3, 4), None
    ep = p.clone()
    out, expected = thunder_subclass.jit(on_plain_input)(p, y), on_plain_input(ep, y)
    assert_same(out, expected)
    assert p.shape == ep.shape and p.stride() == ep.stride()  # the caller's tensor changed as in eager
    torch.testing.assert_close(p, ep)


def _assert_same_metadata(actual, expected):
    """Outer size and stride equal, and those of the inner tensors (a subclass's in-place view op changes both)."""
    assert (actual.shape, actual.stride()) == (expected.shape, expected.stride())
    if type(expected) is not torch.Tensor:
        for a in expected.__tensor_flatten__()[0]:
            _assert_same_metadata(getattr(actual, a), getattr(expected, a))


@pytest.mark.parametrize("kind", ["subclass", "plain"])
def test_in_place_view_ops_on_an_input_change_the_callers_object(kind):
    # PyTorch's test_subclass_metadata_mutation / test_input_data_and_metadata_mutation: the caller's object gets
    # eager's new outer size and stride and its inner tensors theirs, after chains of in-place view ops and with data
    # changed through the new view; later uses see the new view
    def chain(a):
        a.transpose_(1, 0)
        tmp = a.mul(2)
        a.unsqueeze_(0)
        a.squeeze_(0)
        a.swapdims_(0, 2)
        return tmp.transpose(1, 0), a.unsqueeze(0)

    def data_and_metadata(a):
        a.t_()
        a[0].mul_(2)
        return a.view(a.shape)

    make = (lambda *s: two(*s)) if kind == "subclass" else (lambda *s: torch.randn(*s))
    for f, shape in ((chain, (1, 2, 4)), (data_and_metadata, (3, 3))):
        jf = thunder_subclass.jit(f)
        for _ in range(2):  # the second call is a cache hit that changes the caller's object too
            x = make(*shape)
            ex = _clone_leaf(x)
            out, expected = jf(x), f(ex)
            for o, e in zip(out if isinstance(out, tuple) else (out,), expected if isinstance(out, tuple) else (expected,)):
                assert_same(o, e)
            assert_same(x, ex)
            _assert_same_metadata(x, ex)
            assert_same(x * 1, ex * 1)  # later eager uses read the new view
        assert cache_counts(jf) == (1, 1)


def test_in_place_view_op_on_a_non_leaf_subclass_input_that_requires_grad():
    # the caller's non-leaf gets eager's autograd history (TBackward): gradients through the outputs and through
    # later uses of the changed input equal eager's
    def f(a):
        a.t_()
        return a * 3

    base = two(2, 3, requires_grad=True)
    ebase = _clone_leaf(base)
    x, ex = base * 2, ebase * 2
    out, expected = thunder_subclass.jit(f)(x), f(ex)
    assert_same(out.detach(), expected.detach())
    _assert_same_metadata(x, ex)
    assert type(x.grad_fn) is type(ex.grad_fn) and out.requires_grad
    w = torch.arange(6.0).reshape(3, 2)
    ((out * w).sum() + (x * w).sum()).backward()
    ((expected * w).sum() + (ex * w).sum()).backward()
    assert_same(base.grad, ebase.grad)


def test_in_place_view_op_on_a_leaf_that_requires_grad_fails_as_in_eager():
    from thunder_subclass import UnsupportedSubclassOperationError

    def f(x):
        x.transpose_(0, 1)
        return x * 2

    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        f(two(3, 4, requires_grad=True))  # eager
    line = f.__code__.co_firstlineno + 1
    with pytest.raises(UnsupportedSubclassOperationError,
                       match=rf"torch\.Tensor\.transpose_ on the TwoTensor input at .*test_parity\.py:{line}: the "
                             r"input is a leaf that requires grad.*out-of-place transpose"):
        thunder_subclass.jit(f)(two(3, 4, requires_grad=True))
    # a trace made for a non-leaf, reused for a leaf: the same error, before the caller's object changes
    jf = thunder_subclass.jit(f)
    jf(two(3, 4, requires_grad=True) * 1)
    leaf = two(3, 4, requires_grad=True)
    with pytest.raises(UnsupportedSubclassOperationError, match=rf"test_parity\.py:{line}: the input is a leaf"):
        jf(leaf)
    assert leaf.shape == (3, 4)
    with torch.no_grad():  # eager allows it under no_grad
        x = two(3, 4, requires_grad=True)
        ex = _clone_leaf(x)
        assert_same(thunder_subclass.jit(f)(x), f(ex))
        _assert_same_metadata(x, ex)


def test_distinct_views_of_one_storage_are_not_merged():
    def f(p, q, y):
        p.add_(1)
        return q * 2 + y.a, p

    x, ex = torch.randn(3, 4), None
    ex = x.clone()
    y = two(3, 2)
    out, expected = thunder_subclass.jit(f)(x[:, :2], x[:, 2:], y), f(ex[:, :2], ex[:, 2:], y)
    for o, e in zip(out, expected):
        assert_same(o, e)
    torch.testing.assert_close(x, ex)
    # the same tensor passed twice is still one value: the in-place update is seen through both
    z, ez = torch.randn(3, 2), None
    ez = z.clone()
    out, expected = thunder_subclass.jit(f)(z, z, y), f(ez, ez, y)
    for o, e in zip(out, expected):
        assert_same(o, e)


def test_input_mutated_inside_autograd_function_forward_is_visible():
    class CountingDouble(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, counter):
            counter.add_(1)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2, None

    x = two(3, requires_grad=True)
    ex = _clone_leaf(x)
    counter, ecounter = torch.zeros(1), torch.zeros(1)
    out = thunder_subclass.jit(lambda x, c: CountingDouble.apply(x, c))(x, counter)
    expected = CountingDouble.apply(ex, ecounter)
    assert_same(out.detach(), expected.detach())
    torch.testing.assert_close(counter, ecounter)
    out.sum().backward()
    expected.sum().backward()
    assert_same(x.grad, ex.grad)


def test_autograd_inside_compiled_code_is_a_typed_error():
    from thunder_subclass import UnsupportedSubclassOperationError

    def step(w, x):
        loss = (x * w).sum()
        (g,) = torch.autograd.grad(loss, [w])
        return g

    w = two(3, requires_grad=True)
    with pytest.raises(UnsupportedSubclassOperationError,
                       match=r"torch.autograd.grad called inside a thunder_subclass-compiled function at "
                             r".*test_parity.py:\d+.*call .backward\(\) / torch.autograd.grad on its output outside"):
        thunder_subclass.jit(step)(w, two(3))


def test_multi_output_torch_function_returning_a_structseq():
    # torch.max(t, dim=1) on a TwoTensor: thunder 0.2.6's generated epilogue could not rebuild torch.return_types.max
    t = two(3, 4)
    values, indices = thunder_subclass.jit(lambda t: torch.max(t, dim=1))(t)
    expected = torch.max(t, dim=1)
    assert_same(values, expected.values)
    assert_same(indices, expected.indices)


def test_isinstance_of_a_buffer_argument_as_eager_and_guarded():
    # PyTorch's TestNestedTensor.test_buffer_subclass_isinstance_input: nn.Buffer's metaclass answers from the
    # tensor's _is_buffer flag; plain thunder 0.2.6 takes the else branch
    def f(b):
        if isinstance(b, torch.nn.Buffer):
            return b + 1
        return b + 2

    jf = thunder_subclass.jit(f)
    assert_same(jf(torch.nn.Buffer(torch.ones(3))), f(torch.nn.Buffer(torch.ones(3))))
    assert_same(jf(torch.ones(3)), torch.full((3,), 3.0))  # not a Buffer: a cache miss, the other branch
    assert thunder.cache_misses(jf) == 2
    assert_same(jf(torch.nn.Buffer(torch.zeros(3))), torch.ones(3))
    assert thunder.cache_misses(jf) == 2


class _NotATensor:
    """Not a tensor, but torch's functions call its ``__torch_function__`` (a wrapper class)."""

    def __init__(self, t):
        self.tensor = t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        args = tuple(a.tensor if isinstance(a, _NotATensor) else a for a in args)
        return func(*args, **(kwargs or {}))


def test_non_tensor_class_with_torch_function():
    def f(w, x):
        return torch.add(w, 1.0, alpha=2.0) + torch.mul(x, w)

    jf = thunder_subclass.jit(f)
    x = torch.randn(2, 2)
    for value in (torch.ones(2, 2), torch.randn(2, 2)):
        w = _NotATensor(value)
        out = jf(w, x)
        assert type(out) is torch.Tensor
        torch.testing.assert_close(out, f(w, x))
    assert thunder.cache_misses(jf) == 1 and thunder.cache_hits(jf) == 1


@pytest.mark.parametrize("make", [lambda: torch.randn(3), lambda: TwoTensor(torch.randn(3), torch.randn(3))],
                         ids=["plain", "TwoTensor"])
def test_requires_grad_inside_compiled_code_is_a_typed_error(make):
    def f(x):
        y = x.detach().requires_grad_()
        return y * 2

    from thunder_subclass import UnsupportedSubclassOperationError

    kind = "a TwoTensor" if isinstance(make(), TwoTensor) else "a tensor"
    with pytest.raises(UnsupportedSubclassOperationError,
                       match=rf"requires_grad_\(\) on {kind} at .*test_parity.py:\d+: it makes a new autograd leaf"):
        thunder_subclass.jit(f)(make())


class _Tagged(torch.Tensor):
    """A ``__torch_function__``-only subclass (no dispatch): results of torch functions on it keep the type."""


@pytest.mark.parametrize("fn", [lambda x: list(x), lambda x: [r * 2 for r in x], lambda x: (lambda a, b, c: (a + b, c))(*x)],
                         ids=["list", "comprehension", "unpack"])
def test_iterating_a_torch_function_subclass_keeps_the_type(fn):
    base = torch.randn(3, 2, requires_grad=True)
    ebase = base.detach().clone().requires_grad_()
    out, expected = thunder_subclass.jit(fn)(base.as_subclass(_Tagged)), fn(ebase.as_subclass(_Tagged))
    assert [type(o) for o in out] == [type(e) for e in expected] == [_Tagged] * len(expected)
    for o, e in zip(out, expected):
        torch.testing.assert_close(o.as_subclass(torch.Tensor), e.as_subclass(torch.Tensor))
    sum(o.sum() for o in out).backward()
    sum(e.sum() for e in expected).backward()
    torch.testing.assert_close(base.grad, ebase.grad)


_FACTORIES = {
    "ones": lambda x: x + torch.ones(3, requires_grad=False),
    "zeros": lambda x: x + torch.zeros(3, dtype=torch.float32, requires_grad=False, pin_memory=False,
                                       layout=torch.strided),
    "full": lambda x: x + torch.full((3,), 3.0, requires_grad=False),
    "arange": lambda x: x + torch.arange(3, dtype=torch.float32, requires_grad=False),
    "zeros_like": lambda x: x + torch.zeros_like(x, requires_grad=False),
    "ones_like": lambda x: x + torch.ones_like(x, requires_grad=False),
    "full_like": lambda x: x + torch.full_like(x, 2.0, requires_grad=False),
    "tensor": lambda x: x + torch.tensor([1.0, 2.0, 3.0], requires_grad=False),
    "new_ones": lambda x: x + x.new_ones(3, requires_grad=False),
    "new_full": lambda x: x + x.new_full((3,), 2.0, requires_grad=False),
}


@pytest.mark.parametrize("name", list(_FACTORIES))
@pytest.mark.parametrize("make", [lambda: torch.randn(3), lambda: TwoTensor(torch.randn(3), torch.randn(3))],
                         ids=["plain", "TwoTensor"])
def test_factories_take_torchs_keywords_at_their_defaults(name, make):
    # thunder 0.2.6's ones/zeros/full/arange/*_like lack requires_grad, pin_memory, layout: a TypeError before
    f, x = _FACTORIES[name], make()
    out, expected = thunder_subclass.jit(f)(x), f(x)
    assert type(out) is type(expected)
    assert_same(out, expected)


@pytest.mark.parametrize("f", [lambda x: x * torch.ones(3, requires_grad=True),
                               lambda x: x * torch.tensor([1.0, 2.0, 3.0], requires_grad=True),
                               lambda x: x * torch.zeros_like(x, requires_grad=True)],
                         ids=["ones", "tensor", "zeros_like"])
def test_factory_with_requires_grad_true_is_a_typed_error(f):
    # eager makes a new leaf collecting a gradient, which the compiled function cannot return to anyone
    from thunder_subclass.errors import UnsupportedTracingError

    with pytest.raises(UnsupportedTracingError, match=r"\(\.\.\., requires_grad=True\) at .*test_parity.py:\d+ makes a "
                                                      r"new leaf tensor .* pass it in"):
        thunder_subclass.jit(f)(torch.randn(3))


@pytest.mark.parametrize("make", [lambda: torch.nn.ReLU(inplace=True), lambda: (lambda x: F.relu(x, inplace=True))],
                         ids=["module", "functional"])
def test_inplace_true_of_a_functional_op_on_a_subclass_changes_the_input_as_eager(make):
    # thunder's relu symbol binds inplace=True; it was passed to Tensor.relu ("takes no arguments (1 given)"): the
    # torch callable is torch.nn.functional's, which takes it
    f = make()
    x = TwoTensor(torch.randn(3, 4), torch.randn(3, 4))
    ex = TwoTensor(x.a.clone(), x.b.clone())
    out, expected = thunder_subclass.jit(f)(x), f(ex)
    assert type(out) is TwoTensor
    for got, want in ((out.a, expected.a), (out.b, expected.b), (x.a, ex.a), (x.b, ex.b)):
        torch.testing.assert_close(got, want)
