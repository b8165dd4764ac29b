"""Arguments thunder 0.2.6's operators refuse where eager accepts them (``generator=``, ``out=``,
``return_indices=True``, ``ceil_mode=True``, ``scatter_(reduce=...)``, ``memory_format=``) raised thunder's own
error at the first call; torch.compile runs such programs. They are a graph break now: the code runs eagerly, equal to
eager, and the rest of a model stays compiled."""

import pytest
import torch
import torch.nn.functional as F

import thunder_subclass

pytestmark = pytest.mark.filterwarnings("ignore::thunder_subclass.GraphBreakWarning")

REFUSED = {
    "exponential_ generator": lambda x: x.clone().exponential_(generator=torch.Generator().manual_seed(0)) * x,
    "bernoulli generator": lambda x: torch.bernoulli(x.sigmoid(), generator=torch.Generator().manual_seed(0)) + x,
    "max_pool2d return_indices": lambda x: F.max_pool2d(x.view(1, 1, 3, 3), 2, return_indices=True)[1].sum() + x,
    "avg_pool2d ceil_mode": lambda x: F.avg_pool2d(x.view(1, 1, 3, 3), 2, ceil_mode=True).sum() + x,
    "add out=": lambda x: torch.add(x, x, out=torch.empty(9)) * 2,
    "scatter_ reduce": lambda x: torch.zeros(9).scatter_(0, torch.arange(9), x, reduce="add"),
    "clone channels_last": lambda x: x.view(1, 1, 3, 3).clone(memory_format=torch.channels_last).sum() + x,
    "interpolate integer scale": lambda x: F.interpolate(x.view(1, 1, 3, 3), scale_factor=2, mode="bilinear").sum() + x,
    "Tensor.unfold": lambda x: x.unfold(0, 2, 1).sum() + x,
    "embedding max_norm": lambda x: F.embedding(torch.tensor([0, 1]), x.view(3, 3).clone(), max_norm=1.0).sum() + x,
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_refused_argument_runs_eagerly_equal_to_eager(name):
    fn = REFUSED[name]
    x = torch.rand(9)
    jf = thunder_subclass.jit(fn)
    torch.testing.assert_close(jf(x), fn(x))
    breaks = jf.graph_breaks.breaks
    assert len(breaks) == 1
    assert breaks[0].reason.split(":")[0] in ("RuntimeError", "NotImplementedError", "TypeError", "ValueError")


class _Pool(torch.nn.Module):
    def forward(self, x):
        return F.avg_pool2d(x, 2, ceil_mode=True)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 2, 3, padding=1)
        self.pool = _Pool()
        self.lin = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.lin(self.pool(self.conv(x)).flatten(1))


def test_only_the_submodule_with_the_refused_argument_runs_eagerly():
    model = _Net().eval()
    x = torch.randn(2, 1, 3, 3)
    jm = thunder_subclass.jit(model)
    with torch.no_grad():
        for _ in range(3):  # the first call runs eagerly and finds the break; later calls run the regions
            torch.testing.assert_close(jm(x), model(x))
    program = jm.graph_breaks
    assert [b.name for b in program.breaks] == ["pool"]
    assert "ceil_mode" in program.breaks[0].reason
    assert list(program.regions) == [""]  # the model around it is one compiled region


def test_fullgraph_raises_thunder_s_error():
    with pytest.raises(NotImplementedError, match="ceil_mode"):
        thunder_subclass.jit(REFUSED["avg_pool2d ceil_mode"], fullgraph=True)(torch.rand(9))


def test_the_user_s_own_not_supported_error_is_not_a_break():
    def fn(x):
        if x.shape[0] == 9:
            raise NotImplementedError("this size is not supported")
        return x

    with pytest.raises(NotImplementedError, match="this size is not supported"):
        thunder_subclass.jit(fn)(torch.rand(9))


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN])
def test_recurrent_modules_run_eagerly_and_train_as_in_eager(cls):
    # thunder registers torch._VF.lstm / gru / rnn_tanh as opaque operators and fails naming them (KeyError: None)
    class Tagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = cls(4, 5, batch_first=True)
            self.head = torch.nn.Linear(5, 2)

        def forward(self, x):
            return self.head(self.rnn(x)[0]).sum()

    torch.manual_seed(0)
    model, twin = Tagger(), Tagger()
    twin.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 4)
    jm = thunder_subclass.jit(twin)
    for _ in range(2):
        model.zero_grad()
        twin.zero_grad()
        model(x).backward()
        out = jm(x)
        out.backward()
        torch.testing.assert_close(out, model(x))
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(q.grad, p.grad)
    program = jm.graph_breaks
    assert "rnn" in [b.name for b in program.breaks]  # (the first call ran the whole model eagerly, finding it)
    assert "head" in program.regions  # what is around the recurrent module is still compiled
