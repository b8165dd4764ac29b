"""Random operations draw from torch's generator as eager does (thunder_subclass/transforms/random_ops.py): a seeded
compiled run equals eager's bitwise, with the generator left in eager's state (torch.compile does the same on CPU)."""

import pytest
import thunder
import torch
import torch.nn.functional as F

import thunder_subclass
from subclasses import TwoTensor


def _dropout_twice(x, w):
    h = F.dropout(x @ w, 0.3, training=True)
    return F.dropout(h.tanh(), 0.5, training=True) * 2 + torch.rand(h.shape)  # a draw after them


def _seeded(fn, *args):
    torch.manual_seed(1234)
    out = fn(*args)
    return out, torch.get_rng_state()


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_seeded_dropout_equals_eager_bitwise(grad):
    jf = thunder_subclass.jit(_dropout_twice)
    x = torch.randn(16, 8)
    w = torch.randn(8, 8, requires_grad=grad)
    ew = w.detach().clone().requires_grad_(grad)
    for _ in range(2):  # the first call traces, the second is a cache hit
        out, state = _seeded(jf, x, w)
        expected, expected_state = _seeded(_dropout_twice, x, ew)
        assert torch.equal(out, expected)
        assert torch.equal(state, expected_state)
        if grad:
            (g,) = torch.autograd.grad(out.square().sum(), w)
            (eg,) = torch.autograd.grad(expected.square().sum(), ew)
            # (the same masks: thunder's backward of tanh and the matmul round otherwise than eager's kernels)
            torch.testing.assert_close(g, eg)
    if grad:
        assert "eager_dropout(" in str(thunder.last_traces(jf)[-1])
        assert "eager_dropout_backward(" in str(thunder.last_backward_traces(jf)[-1])


def test_seeded_training_of_a_module_with_dropout_equals_eager_bitwise():
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.25), torch.nn.Linear(16, 4),
                                torch.nn.Dropout(0.1))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.25),
                                torch.nn.Linear(16, 4), torch.nn.Dropout(0.1))
    model.load_state_dict(eager.state_dict())
    jm = thunder_subclass.jit(model)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, model)]
    for step in range(3):
        x = torch.randn(5, 8)
        for m, opt in zip((model, eager), optimizers):
            torch.manual_seed(100 + step)
            opt.zero_grad()
            loss = (jm if m is model else eager)(x).square().mean()
            loss.backward()
            opt.step()
            if m is model:
                compiled_loss, compiled_state = loss.detach(), torch.get_rng_state()
        assert torch.equal(compiled_loss, loss.detach())
        assert torch.equal(compiled_state, torch.get_rng_state())
        for p, q in zip(model.parameters(), eager.parameters()):
            assert torch.equal(p, q)


# issue 40: dropout in place, with a symbolic p, on subclasses


def _equal(a, b) -> bool:
    if isinstance(a, TwoTensor) or isinstance(b, TwoTensor):
        return type(a) is type(b) and torch.equal(a.a, b.a) and torch.equal(a.b, b.b)
    return torch.equal(a, b)


def _dropout_with_p(x, p):
    return F.dropout(x * 1.5, p, training=True).tanh() * 2


@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic", "automatic"])
def test_seeded_dropout_with_a_symbolic_p_equals_eager_bitwise_with_gradients(dynamic):
    # thunder differentiated a symbolic p's dropout through its own uniform draws: other masks than eager's
    jf = thunder_subclass.jit(_dropout_with_p, dynamic=dynamic)
    for i, p in enumerate([0.3, 0.3, 0.4, 0.5, 0.0, 1.0]):  # automatic dynamic: p is symbolic after the first miss
        base = torch.randn(4, 6 + i)
        x, ex = base.clone().requires_grad_(), base.clone().requires_grad_()
        out, state = _seeded(jf, x, p)
        expected, expected_state = _seeded(_dropout_with_p, ex, p)
        assert _equal(out, expected) and torch.equal(state, expected_state), p
        out.square().sum().backward()
        expected.square().sum().backward()
        torch.testing.assert_close(x.grad, ex.grad)  # (the same masks; thunder's tanh backward rounds otherwise)
    assert thunder.cache_misses(jf) == (1 if dynamic else 2)
    assert "eager_dropout(x" in str(thunder.last_traces(jf)[-1]).replace("eager_dropout(t", "eager_dropout(x")


def _inplace_dropout(x):
    h = x * 2
    F.dropout(h, 0.3, training=True, inplace=True)  # h changed in place, the result dropped
    return h + F.dropout(h, p=0.2, inplace=True)


def test_seeded_inplace_dropout_equals_eager_bitwise():
    # thunder raised NotImplementedError("Only inplace=False is currently supported in dropout")
    jf = thunder_subclass.jit(_inplace_dropout)
    for _ in range(2):
        base = torch.randn(5, 7)
        x, ex = base.clone().requires_grad_(), base.clone().requires_grad_()
        out, state = _seeded(jf, x)
        expected, expected_state = _seeded(_inplace_dropout, ex)
        assert torch.equal(out, expected) and torch.equal(state, expected_state)
        out.square().sum().backward()
        expected.square().sum().backward()
        torch.testing.assert_close(x.grad, ex.grad, rtol=0, atol=0)
    # on an input: the caller's tensor is changed as eager changes it
    x, ex = torch.randn(3, 4), None
    ex = x.clone()
    out, state = _seeded(thunder_subclass.jit(lambda t: F.dropout(t, 0.5, True, True)), x)
    expected, expected_state = _seeded(lambda t: F.dropout(t, 0.5, True, True), ex)
    assert torch.equal(x, ex) and torch.equal(out, expected) and torch.equal(state, expected_state)


def test_seeded_training_of_a_module_with_inplace_dropout_equals_eager_bitwise():
    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.25, inplace=True), torch.nn.Tanh(),
                                   torch.nn.Linear(16, 4), torch.nn.Dropout(0.1, inplace=True))

    eager, model = make(), make()
    jm = thunder_subclass.jit(model)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (eager, model)]
    for step in range(3):
        x = torch.randn(5, 8)
        losses = []
        for m, opt in zip((jm, eager), optimizers):
            torch.manual_seed(100 + step)
            opt.zero_grad()
            loss = m(x).square().mean()
            loss.backward()
            opt.step()
            losses.append((loss.detach(), torch.get_rng_state()))
        assert torch.equal(losses[0][0], losses[1][0]) and torch.equal(losses[0][1], losses[1][1])
        for p, q in zip(model.parameters(), eager.parameters()):
            assert torch.equal(p, q)


@pytest.mark.parametrize("case", ["dropout", "inplace", "symbolic p"])
def test_seeded_dropout_on_a_subclass_equals_eager_bitwise(case):
    # (already eager's stream before issue 40's round: the subclass's __torch_dispatch__ runs eager's bernoulli_)
    def f(x, p):
        h = x * 1.5
        if case == "inplace":
            F.dropout(h, p, True, True)
            return h.tanh()
        return F.dropout(h, p, training=True).tanh()

    jf = thunder_subclass.jit(f, dynamic=True if case == "symbolic p" else None)
    for i, p in enumerate([0.3, 0.4, 0.5]):
        base = TwoTensor(torch.randn(4, 5 + i), torch.randn(4, 5 + i))
        x, ex = base.detach().clone().requires_grad_(), base.detach().clone().requires_grad_()
        out, state = _seeded(jf, x, p)
        expected, expected_state = _seeded(f, ex, p)
        assert _equal(out, expected) and torch.equal(state, expected_state)
        out.sum().backward()
        expected.sum().backward()
        assert _equal(x.grad, ex.grad)
