"""Parity with eager on the subclass protocol: programs written elsewhere (PyTorch's and thunder's subclass tests)
behave as eager under thunder_subclass.jit: values, output types, gradients, input mutations, requires_grad."""

import pytest
import thunder
import torch
from torch import nn
from torch.testing._internal.custom_tensor import ConstantExtraMetadataTensor

import thunder_subclass
from thunder_subclass import SubclassGradRuleError, SubclassProtocolError, TensorSubclassError
from subclasses import TwoTensor
from test_training import _clone_leaf, assert_same


def _two(*shape, requires_grad=False):
    return TwoTensor(torch.randn(*shape), torch.randn(*shape)).requires_grad_(requires_grad)


# -- isinstance / type / attributes ----------------------------------------------------------------------------


def test_isinstance_parameter_of_a_subclass_takes_eagers_branch():
    def f(w):
        return w + 1 if isinstance(w, nn.Parameter) else w + 2

    p, t = nn.Parameter(_two(3)), _two(3)
    jf = thunder_subclass.jit(f)
    for x in (p, t):
        assert_same(jf(x).detach(), f(x).detach())
    assert thunder.cache_misses(jf) == 2  # a Parameter and a plain TwoTensor are different programs


def test_type_issubclass_and_class_attribute_as_eager():
    def f(x):
        checks = (type(x) is TwoTensor, issubclass(type(x), torch.Tensor), x.__class__ is TwoTensor,
                  isinstance(x, torch.Tensor), isinstance(x, TwoTensor), isinstance(x, nn.Parameter))
        return x * sum(2 ** i for i, c in enumerate(checks) if c)

    x = _two(3)
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
    p = nn.Parameter(_two(3))
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

    x = _two(3, requires_grad=True)
    ex = _clone_leaf(x)
    out, eout = thunder_subclass.jit(f)(x), f(ex)
    assert_same(out.detach(), eout.detach())
    out.sum().backward()
    eout.sum().backward()
    assert_same(x.grad, ex.grad)  # 3, through the in-place mul_


def test_in_place_on_a_leaf_that_requires_grad_fails_as_in_eager():
    x = _two(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        x.clone().detach().requires_grad_().mul_(2)  # eager
    with pytest.raises(TensorSubclassError, match="leaf Variable that requires grad"):
        thunder_subclass.jit(lambda t: t.mul_(2))(x)


def test_requires_grad_of_each_output_is_eagers():
    def f(x, w):
        y = x * 2
        return y, y.a, (w > 0), w.detach() * 3, w.sum(), x.a + 1, torch.ones(2)

    x = TwoTensor(torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True))
    w = torch.randn(3, requires_grad=True)
    outs, expected = thunder_subclass.jit(f)(x, w), f(x, w)
    assert [o.requires_grad for o in outs] == [e.requires_grad for e in expected] == [
        True, False, False, False, True, True, False]
    for o, e in zip(outs, expected):
        assert_same(o.detach(), e.detach())


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


def test_torch_dispatch_mode_around_the_call_is_a_typed_error_never_ignored():
    from torch.utils._python_dispatch import TorchDispatchMode

    from thunder_subclass import UnsupportedSubclassOperationError

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func)
            return func(*args, **(kwargs or {}))

    def f(t):
        return (t * 2).sin()

    x = _two(3)
    jf = thunder_subclass.jit(f)
    assert_same(jf(x), f(x))  # compiled outside the mode
    line = f.__code__.co_firstlineno + 1
    for _ in range(2):  # the cached trace is not reused under the mode; tracing under it raises
        with Log() as mode:
            with pytest.raises(UnsupportedSubclassOperationError,
                               match=rf"mul on TwoTensor at .*test_parity\.py:{line} runs under the TorchDispatchMode "
                                     r"Log.*Call the compiled function outside the mode"):
                jf(x)
        assert mode.ops == []  # nothing ran under the mode
    assert_same(jf(x), f(x))  # and outside it the first trace serves again
    assert thunder.cache_hits(jf) >= 1
