"""Random operations draw from torch's generator as eager does (thunder_subclass/random_ops.py): a seeded compiled
run equals eager's bitwise, with the generator left in eager's state (torch.compile does the same on CPU)."""

import pytest
import thunder
import torch
import torch.nn.functional as F

import thunder_subclass


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
