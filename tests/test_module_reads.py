"""The module half of a prologue read once per write (``thunder_subclass.guards.unpack_cache``): a call without a
write reuses the values read from the module, and every kind of write after a cached call is seen (the reads and
their checks run again, or the call misses) with the eager result; tensors' metadata is checked every call."""

import copy

import pytest
import thunder
import torch
from torch.testing._internal.two_tensor import TwoTensor

import thunder_subclass
from helpers import cache_counts, tiny_causal_lm
from thunder_subclass._thunder_internals import dict_version_reader

try:  # (the write tests also run on the code before guards.unpack_cache, where every read runs every call)
    from thunder_subclass.guards import unpack_cache
except ImportError:
    unpack_cache = None

pytestmark = pytest.mark.skipif(dict_version_reader() is None, reason="dict version tags: CPython 3.11 only")


class _Net(torch.nn.Module):
    offset = 0.5  # a class attribute the forward reads

    def __init__(self, subclass: bool = False):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        if subclass:
            w = self.lin.weight.detach()
            self.lin.weight = torch.nn.Parameter(TwoTensor(w.clone(), w.clone()), requires_grad=False)
        self.scale = 2.0
        self.register_buffer("shift", torch.ones(4))

    def forward(self, x):
        y = self.lin(x) * self.scale + self.shift + self.offset
        return y if self.training else y * 3


class _SubNet(_Net):
    def forward(self, x):
        return super().forward(x) - 1


def _new_weight(m):
    w = torch.randn(4, 4)
    return TwoTensor(w, w.clone()) if isinstance(m.lin.weight, TwoTensor) else w


# a write to the module, its submodules, tables or classes (no tensor changed in place): the reads run again
DICT_WRITES = {
    "setattr": lambda m: setattr(m, "scale", 3.0),
    "object.__setattr__": lambda m: object.__setattr__(m, "scale", 4.0),
    "vars item": lambda m: vars(m).__setitem__("scale", 5.0),
    "__dict__.update": lambda m: m.__dict__.update(scale=6.0),
    "del and set": lambda m: (delattr(m, "scale"), setattr(m, "scale", 7.0)),
    "class attribute": lambda m: setattr(type(m), "offset", 1.5),
    "__class__": lambda m: setattr(m, "__class__", _SubNet),
    "eval": lambda m: m.eval(),
    "submodule replaced": lambda m: setattr(m, "lin", torch.nn.Linear(4, 4)),
    "submodule attribute": lambda m: setattr(m.lin, "bias", torch.nn.Parameter(torch.randn(4))),
    "register_parameter": lambda m: m.lin.register_parameter(
        "weight", torch.nn.Parameter(_new_weight(m), requires_grad=m.lin.weight.requires_grad)),
    "register_buffer": lambda m: m.register_buffer("shift", torch.full((4,), 2.0)),
    "parameters table": lambda m: m.lin._parameters.__setitem__("bias", torch.nn.Parameter(torch.zeros(4))),
    "load_state_dict assign": lambda m: m.load_state_dict(
        {k: (v.clone() + 1 if not isinstance(v, TwoTensor) else TwoTensor(v.a + 1, v.b + 1))
         for k, v in m.state_dict().items()}, assign=True),
    "forward patched": lambda m: setattr(m.lin, "forward", lambda x: torch.zeros(x.shape[0], 4)),
}

# a tensor changed without a write to any dict: checked every call
TENSOR_WRITES = {
    "p.data": lambda m: setattr(m.lin.bias, "data", torch.randn(4)),
    "in place": lambda m: m.shift.add_(1.0),
    "requires_grad_": lambda m: m.lin.bias.requires_grad_(not m.lin.bias.requires_grad),
    "resize_": lambda m: m.shift.resize_(1),
}


@pytest.fixture(autouse=True)
def _restore_class_attribute():
    yield
    _Net.offset = 0.5


@pytest.fixture
def refreshes(monkeypatch):
    """The modules whose reads ran in full (None where every read runs every call)."""
    if unpack_cache is None:
        return None
    calls = []
    refresh = unpack_cache.UnpackCache.refresh
    monkeypatch.setattr(unpack_cache.UnpackCache, "refresh", lambda self, m: calls.append(m) or refresh(self, m))
    return calls


def _cached(subclass):
    model = _Net(subclass)
    jm = thunder_subclass.jit(model)
    x = torch.randn(2, 4)
    for _ in range(3):
        torch.testing.assert_close(jm(x), model(x))
    return model, jm, x


def test_a_call_without_a_write_reuses_the_module_reads(refreshes):
    model, jm, x = _cached(False)
    trace = thunder.last_prologue_traces(jm)[-1]
    (read,) = [b for b in trace.bound_symbols if b.sym.name == "read_module"]
    assert not [b for b in trace.bound_symbols if b.sym.name in ("unpack_attr", "unpack_parameter", "unpack_submodule")]
    before = len(refreshes)
    for _ in range(5):
        torch.testing.assert_close(jm(x), model(x))
    assert len(refreshes) == before and cache_counts(jm) == (1, 7)
    cache = read.args[1]
    assert cache.current is not None and cache.current[2].same()
    # every read of this module is watched, and every check of what it read but the module hooks (global, own)
    ((rerun_steps, rerun_checks),) = cache.hits
    assert rerun_steps == frozenset()
    rerun = [cache.checks.conditions[k] for k in rerun_checks]
    assert rerun[0] == "_no_global_hooks()" and len(rerun) == 3  # the model and its Linear
    assert all(c.startswith("not (v") and "._forward_pre_hooks" in c for c in rerun[1:])


@pytest.mark.parametrize("subclass", [False, True], ids=["plain", "TwoTensor"])
@pytest.mark.parametrize("write", list(DICT_WRITES), ids=str)
def test_every_write_after_a_cached_call_is_seen(write, subclass, refreshes):
    model, jm, x = _cached(subclass)
    misses, before = cache_counts(jm)[0], len(refreshes or ())
    DICT_WRITES[write](model)
    expected = model(x)
    torch.testing.assert_close(jm(x), expected)
    assert refreshes is None or len(refreshes) > before or cache_counts(jm)[0] > misses  # read again, or a miss
    torch.testing.assert_close(jm(x), expected)
    torch.testing.assert_close(jm(x), model(x))


@pytest.mark.parametrize("subclass", [False, True], ids=["plain", "TwoTensor"])
@pytest.mark.parametrize("write", list(TENSOR_WRITES), ids=str)
def test_tensor_changes_are_checked_every_call(write, subclass):
    model, jm, x = _cached(subclass)
    TENSOR_WRITES[write](model)
    if write == "resize_":  # another shape: eager broadcasting of the (1,) buffer
        torch.testing.assert_close(jm(x), model(x))
        assert cache_counts(jm)[0] == 2
        return
    torch.testing.assert_close(jm(x), model(x))
    if write == "requires_grad_":
        assert cache_counts(jm)[0] == 2


def test_inner_tensor_of_a_subclass_parameter_replaced_is_checked_every_call():
    model, jm, x = _cached(True)
    model.lin.weight.a = torch.randn(4, 4)  # the TwoTensor's own attribute: no module dict written
    torch.testing.assert_close(jm(x), model(x))
    assert cache_counts(jm)[0] == 1


def test_a_property_is_read_every_call(refreshes):
    class WithProperty(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.k = 2.0

        @property
        def factor(self):
            return self.k * self.__class__.base

        base = 1.0

        def forward(self, x):
            return x * self.factor

    model = WithProperty()
    jm = thunder_subclass.jit(model)
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(jm(x), model(x))
    WithProperty.base = 4.0  # the property reads the class: a class dict write
    torch.testing.assert_close(jm(x), model(x))


def test_an_attribute_checked_absent_and_then_set_is_seen(refreshes):
    class Optional(torch.nn.Module):
        def forward(self, x):
            return x * self.extra if hasattr(self, "extra") else x + 1

    model = Optional()
    jm = thunder_subclass.jit(model)
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(jm(x), model(x))
    model.extra = 3.0  # setattr: the module's __dict__
    torch.testing.assert_close(jm(x), model(x))
    del model.extra
    torch.testing.assert_close(jm(x), model(x))
    model.register_buffer("extra", torch.full((3,), 2.0))  # the buffers table
    torch.testing.assert_close(jm(x), model(x))
    del model.extra
    Optional.extra = 5.0  # the class
    torch.testing.assert_close(jm(x), model(x))
    del Optional.extra
    torch.testing.assert_close(jm(x), model(x))


def test_hf_config_and_submodule_writes_are_seen(refreshes):
    pytest.importorskip("transformers")
    model = tiny_causal_lm("llama", hidden_size=32, intermediate_size=64, num_attention_heads=2,
                           num_key_value_heads=1, vocab_size=64)
    jm = thunder_subclass.jit(model)
    ids = torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(jm(ids).logits, model(ids).logits)
        before = len(refreshes or ())
        jm(ids)
        assert refreshes is None or len(refreshes) == before  # no write: not read again
        attn = model.model.layers[0].self_attn
        for write in (lambda: setattr(attn, "scaling", 0.5),
                      lambda: vars(attn).__setitem__("scaling", 0.25),
                      lambda: object.__setattr__(model.config, "rms_norm_eps", 0.1),
                      lambda: setattr(model.model.norm, "variance_epsilon", 0.2),
                      lambda: model.model.layers[0].mlp.down_proj.register_parameter(
                          "weight", torch.nn.Parameter(torch.randn(32, 64))),
                      lambda: setattr(model.config, "output_hidden_states", True)):  # (a graph break: a miss)
            before, misses = len(refreshes or ()), thunder.cache_misses(jm)
            write()
            torch.testing.assert_close(jm(ids).logits, model(ids).logits)
            assert refreshes is None or len(refreshes) > before or thunder.cache_misses(jm) > misses
