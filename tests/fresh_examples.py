"""First-call examples, each run in a fresh process by tests/test_fresh_process.py (thunder imported, nothing jitted
yet): a feature that works only after another jit registered something is a bug users meet on their first call.

Each example compares with eager and raises on a difference."""

import copy

import torch
import torch.nn.functional as F
from torch.testing._internal.two_tensor import TwoTensor

import thunder_subclass
from helpers import assert_same, two


def read_inner_tensor():
    x = two(3)
    assert_same(thunder_subclass.jit(lambda t: t.a * 2)(x), x.a * 2)


def construct_and_read_inner():
    a, b = torch.randn(3), torch.randn(3)
    assert_same(thunder_subclass.jit(lambda a, b: TwoTensor(a, b).a * 2)(a, b), a * 2)


def construct_and_return():
    a, b = torch.randn(3), torch.randn(3)
    assert_same(thunder_subclass.jit(lambda a, b: TwoTensor(a, b) * 2)(a, b), TwoTensor(a, b) * 2)


def pointwise_on_subclass():
    x = two(3, 4)
    f = lambda t: (t * 2 + 1).sin()  # noqa: E731
    assert_same(thunder_subclass.jit(f)(x), f(x))


def isinstance_parameter():
    p = torch.nn.Parameter(two(3))
    f = lambda w: w + 1 if isinstance(w, torch.nn.Parameter) else w + 2  # noqa: E731
    assert_same(thunder_subclass.jit(f)(p).detach(), f(p).detach())


def training_step_with_subclass_parameter():
    layer = torch.nn.Linear(4, 3)
    layer.weight = torch.nn.Parameter(two(3, 4))
    eager = copy.deepcopy(layer)
    x = torch.randn(2, 4)
    thunder_subclass.jit(layer)(x).sum().backward()
    eager(x).sum().backward()
    assert_same(layer.weight.grad, eager.weight.grad)


def backward_with_plain_gradient():
    x = two(3, requires_grad=True)
    ex = TwoTensor(x.a.clone(), x.b.clone()).requires_grad_()
    g = torch.ones(3)
    thunder_subclass.jit(lambda t: t * 2)(x).backward(g)
    (ex * 2).backward(g)
    assert_same(x.grad, ex.grad)


def in_place_on_input():
    x, ex = two(3), None
    ex = TwoTensor(x.a.clone(), x.b.clone())
    thunder_subclass.jit(lambda t: t.add_(1))(x)
    ex.add_(1)
    assert_same(x, ex)


def nested_subclass():
    x = TwoTensor(two(3), two(3))
    f = lambda t: t * 3  # noqa: E731
    out, expected = thunder_subclass.jit(f)(x), f(x)
    assert_same(out.a, expected.a)
    assert_same(out.b, expected.b)


def autograd_function_with_subclass():
    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    x = two(3, requires_grad=True)
    ex = TwoTensor(x.a.clone(), x.b.clone()).requires_grad_()
    thunder_subclass.jit(lambda t: Double.apply(t).sum())(x).backward()
    Double.apply(ex).sum().backward()
    assert_same(x.grad, ex.grad)


def grad_rule_registered_before_first_jit():
    import thunder.torch as ltorch
    from thunder.core.transforms import get_grad, put_grad

    def rule(a, b):
        out = ltorch.mul(a, b)
        put_grad(a, get_grad(out) * b * 3)
        put_grad(b, get_grad(out) * a)
        return out

    x, w = two(3, requires_grad=True), two(3)
    with thunder_subclass.register_grad_rule(TwoTensor, torch.mul, rule):
        thunder_subclass.jit(lambda x, w: (x * w).sum())(x, w).backward()
    assert_same(x.grad, TwoTensor(w.a * 3, w.b * 3))


def quantized_linear_weight():
    from thunder_subclass.demo import Int8Weight

    layer = torch.nn.Linear(8, 4).requires_grad_(False)
    layer.weight = torch.nn.Parameter(Int8Weight.from_float(layer.weight.detach()), requires_grad=False)
    x = torch.randn(3, 8)
    with torch.no_grad():
        assert_same(thunder_subclass.jit(layer)(x), layer(x))


def torch_compile_executor():
    from thunder.executors.torch_compile import torch_compile_ex

    x = two(3, 4)
    f = lambda t: (t * 2).relu() + 1  # noqa: E731
    assert_same(thunder_subclass.jit(f, executors=[torch_compile_ex])(x), f(x))


def plugin_entry_point():
    import thunder
    from thunder.recipes import BaseRecipe

    layer = torch.nn.Linear(4, 3)
    layer.weight = torch.nn.Parameter(two(3, 4), requires_grad=False)
    x = torch.randn(2, 4)
    cmodel = thunder.compile(layer, recipe=BaseRecipe(fuser="torch.compile"), plugins="tensor-subclass")
    with torch.no_grad():
        assert_same(cmodel(x), layer(x))


EXAMPLES = [name for name, v in list(globals().items()) if callable(v) and not name.startswith("_")
            and getattr(v, "__module__", None) == __name__]
