"""Executor grad rules and implementations for (subclass type, op) pairs (issue 4)."""

import pytest
import thunder
import thunder.torch as ltorch
import torch
import torch.nn.functional as F
from thunder.core.proxies import TensorProxy
from thunder.core.transforms import get_grad, put_grad
from thunder.extend import OperatorExecutor

import thunder_subclass
from thunder_subclass import SubclassGradRuleError, make_subclass, register_grad_rule, register_implementation
from subclasses import QuantizedWeight, TwoTensor, quantize
from helpers import two

# an executor of the tests' own, with one symbol the rules call
rules_ex = OperatorExecutor("test_rules_ex")
triple = rules_ex.register_operator("triple", meta=lambda x: TensorProxy(like=x), fn=lambda x: x * 3)


def int8_linear_impl(x, data, scale):
    return x @ (data.to(torch.float32) * scale[:, None]).t()


int8_linear = rules_ex.register_operator(
    "int8_linear",
    meta=lambda x, data, scale: TensorProxy(like=x, shape=(*x.shape[:-1], data.shape[0])),
    fn=int8_linear_impl,
)


def mul_rule(a, b):
    """d(a*b)/da scaled by 3 on both components, computed with the executor's own symbol."""
    out = ltorch.mul(a, b)
    g = get_grad(out)
    ga = g * b
    put_grad(a, make_subclass(TwoTensor, triple(ga.a), triple(ga.b)))
    put_grad(b, g * a)
    return out


def _grads(jf, x, w):
    x, w = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    jf(x, w).sum().backward()
    return x.grad, w.grad


def _f(x, w):
    return x * w


def test_rule_is_used_and_remove_restores_default():
    x, w = two(4, requires_grad=True), two(4, requires_grad=True)
    handle = register_grad_rule(TwoTensor, torch.mul, mul_rule)
    try:
        jf = thunder_subclass.jit(_f)
        gx, gw = _grads(jf, x, w)
        assert type(gx) is TwoTensor
        torch.testing.assert_close(gx.a, 3 * w.a.detach())  # the rule's math, not the derivative of mul
        torch.testing.assert_close(gx.b, 3 * w.b.detach())
        torch.testing.assert_close(gw.a, x.a.detach())
        bw = thunder.last_backward_traces(jf)[-1]
        assert [b.sym.name for b in bw.bound_symbols].count("triple") == 2  # the rule's symbol, on inner tensors
    finally:
        handle.remove()
    assert not handle.active
    jf = thunder_subclass.jit(_f)
    gx, _ = _grads(jf, x, w)
    torch.testing.assert_close(gx.a, w.a.detach())  # the default again
    assert "triple" not in str(thunder.last_backward_traces(jf)[-1])


def test_one_rule_covers_function_method_and_operator():
    x, w = two(4, requires_grad=True), two(4, requires_grad=True)
    with register_grad_rule(TwoTensor, torch.Tensor.mul, mul_rule):  # registered through the method
        for f in (lambda a, b: torch.mul(a, b), lambda a, b: a.mul(b), lambda a, b: a * b):
            gx, _ = _grads(thunder_subclass.jit(f), x, w)
            torch.testing.assert_close(gx.a, 3 * w.a.detach())


def test_decorator_and_scoped_forms_leave_no_rule_behind():
    x, w = two(4, requires_grad=True), two(4, requires_grad=True)

    @register_grad_rule(TwoTensor, ltorch.mul)  # the thunder symbol works too
    def rule(a, b):
        return mul_rule(a, b)

    with rule:
        gx, _ = _grads(thunder_subclass.jit(_f), x, w)
        torch.testing.assert_close(gx.a, 3 * w.a.detach())
    assert not rule.active
    gx, _ = _grads(thunder_subclass.jit(_f), x, w)
    torch.testing.assert_close(gx.a, w.a.detach())


def test_rule_for_base_class_applies_to_subclasses():
    class MyTwo(TwoTensor):
        @staticmethod
        def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
            return MyTwo(inner["a"], inner["b"], outer_size, outer_stride)

    x = MyTwo(torch.randn(4), torch.randn(4)).requires_grad_()
    w = MyTwo(torch.randn(4), torch.randn(4)).requires_grad_()
    with register_grad_rule(TwoTensor, torch.mul, mul_rule):
        gx, _ = _grads(thunder_subclass.jit(_f), x, w)
    torch.testing.assert_close(gx.a, 3 * w.a.detach())


def test_executor_scoped_rule_is_inactive_without_its_executor():
    x, w = two(4, requires_grad=True), two(4, requires_grad=True)
    with register_grad_rule(TwoTensor, torch.mul, mul_rule, executor=rules_ex):
        gx, _ = _grads(thunder_subclass.jit(_f), x, w)  # rules_ex not among the executors
        torch.testing.assert_close(gx.a, w.a.detach())
        from thunder.executors.torchex import ex as torchex

        gx, _ = _grads(thunder_subclass.jit(_f, executors=[rules_ex, torchex]), x, w)
        torch.testing.assert_close(gx.a, 3 * w.a.detach())


def test_duplicate_registration_raises_and_override_replaces():
    def other(a, b):
        out = ltorch.mul(a, b)
        g = get_grad(out)
        put_grad(a, g * 0)
        put_grad(b, g * a)
        return out

    with register_grad_rule(TwoTensor, torch.mul, mul_rule):
        with pytest.raises(ValueError, match=r"grad rule for \(TwoTensor, mul\) is already registered \(mul_rule\)"):
            register_grad_rule(TwoTensor, torch.mul, other)
        with register_grad_rule(TwoTensor, torch.mul, other, allow_override=True):
            x, w = two(4, requires_grad=True), two(4, requires_grad=True)
            gx, _ = _grads(thunder_subclass.jit(_f), x, w)
            torch.testing.assert_close(gx.a, torch.zeros(4))


def test_rule_that_raises_gives_typed_error():
    def broken(a, b):
        raise KeyError("oops")

    with register_grad_rule(TwoTensor, torch.mul, broken):
        with pytest.raises(SubclassGradRuleError, match=r"grad rule .*broken for \(TwoTensor, mul\) raised KeyError"):
            thunder_subclass.jit(_f)(two(4, requires_grad=True), two(4, requires_grad=True))


def test_unknown_op_is_refused():
    from thunder_subclass import SubclassRegistrationError, TensorSubclassError

    for op in (print, 3):
        with pytest.raises(SubclassRegistrationError, match="not a torch operation thunder traces as a symbol") as info:
            register_grad_rule(TwoTensor, op, mul_rule)
        assert isinstance(info.value, TypeError) and isinstance(info.value, TensorSubclassError)
    with pytest.raises(SubclassRegistrationError, match="subclass_type must be a torch.Tensor subclass"):
        register_grad_rule(int, torch.mul, mul_rule)


def test_executor_claims_subclass_op():
    w = quantize(torch.randn(6, 5))
    x = torch.randn(3, 5)

    def claim(x, w, bias=None):
        return int8_linear(x, w.data_int8, w.scale)

    def f(x, w):
        return F.linear(x, w).relu()

    expected = f(x, w)
    with register_implementation(QuantizedWeight, F.linear, claim, executor=rules_ex,
                                 checker=lambda x, w, bias=None: bias is None):
        from thunder.executors.torchex import ex as torchex

        jf = thunder_subclass.jit(f, executors=[rules_ex, torchex])
        torch.testing.assert_close(jf(x, w), expected)
        names = [b.sym.name for b in thunder.last_traces(jf)[-1].bound_symbols]
        assert "int8_linear" in names and "to" not in names  # the executor's kernel, no dequantize
        # without the executor, the unrolled dispatch runs
        jf2 = thunder_subclass.jit(f)
        torch.testing.assert_close(jf2(x, w), expected)
        assert "int8_linear" not in str(thunder.last_traces(jf2)[-1])


def test_claimed_forward_keeps_default_backward():
    from thunder.executors.torchex import ex as torchex

    w = quantize(torch.randn(6, 5))
    x = torch.randn(3, 5, requires_grad=True)
    ex = x.detach().clone().requires_grad_()

    def f(x, w):
        return F.linear(x, w).relu().sum()

    claim = lambda x, w, bias=None: int8_linear(x, w.data_int8, w.scale)  # noqa: E731
    with register_implementation(QuantizedWeight, F.linear, claim, executor=rules_ex):
        jf = thunder_subclass.jit(f, executors=[rules_ex, torchex])
        jf(x, w).backward()
        f(ex, w).backward()
    torch.testing.assert_close(x.grad, ex.grad)
    assert "int8_linear" in [b.sym.name for b in thunder.last_traces(jf)[-1].bound_symbols]
    # the backward is PyTorch's derivative of linear through QuantizedWeight's dispatch (dequantize, matmul)
    bw_names = [b.sym.name for b in thunder.last_backward_traces(jf)[-1].bound_symbols]
    assert "matmul" in bw_names and "to" in bw_names
