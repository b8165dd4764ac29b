"""Object guards checked once per write (``thunder_subclass.guards.watched``): every kind of write to a guarded object
after a cached call is seen (a miss or a full check, with the eager result), and calls without writes skip the full
comparison."""

import dataclasses

import pytest
import thunder
import torch

import thunder_subclass
from helpers import cache_counts, tiny_causal_lm
from thunder_subclass._thunder_internals import dict_version_reader
from thunder_subclass.guards import objects, watched

pytestmark = pytest.mark.skipif(dict_version_reader() is None, reason="dict version tags: CPython 3.11 only")


@dataclasses.dataclass
class _Cfg:
    scale: float
    opts: dict
    bias = 1.0  # a class attribute


@dataclasses.dataclass
class _OtherCfg(_Cfg):
    pass


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cfg = _Cfg(2.0, {"k": 1.0})

    def forward(self, x):
        c = self.cfg
        if c == c:  # a native comparison: the config is guarded by value ("equal")
            return x * c.scale + c.opts["k"] + c.bias
        return x


def _set(cfg):
    cfg.scale = 3.0


def _object_setattr(cfg):
    object.__setattr__(cfg, "scale", 4.0)


def _vars_item(cfg):
    vars(cfg)["scale"] = 5.0


def _dict_update(cfg):
    cfg.__dict__.update(scale=6.0)


def _nested_dict(cfg):
    cfg.opts["k"] = 7.0


def _replace_dict(cfg):
    cfg.__dict__ = {"scale": 8.0, "opts": {"k": 1.0}}


def _class_attribute(cfg):
    _Cfg.bias = 9.0


def _new_class(cfg):
    cfg.__class__ = _OtherCfg


def _delete_and_set(cfg):
    del cfg.scale
    cfg.scale = 10.0


WRITES = [_set, _object_setattr, _vars_item, _dict_update, _nested_dict, _replace_dict, _class_attribute, _new_class,
          _delete_and_set]


@pytest.fixture(autouse=True)
def _restore_class_attribute():
    yield
    _Cfg.bias = 1.0


def _fused_constants(jm):
    """The constants of the prologue's fused checks: the per-call ones and those of the module reads (run once per
    write, ``guards.unpack_cache``)."""
    trace = thunder.last_prologue_traces(jm)[-1]
    (check,) = [b for b in trace.bound_symbols if b.sym.name == "check_prologue"]
    constants = dict(check.args[1].fn.__globals__)
    for b in trace.bound_symbols:
        if b.sym.name == "read_module" and b.args[1].checks is not None:
            constants.update({f"module_{k}": v for k, v in b.args[1].checks.fn.__globals__.items()})
    return constants


@pytest.mark.parametrize("write", WRITES, ids=lambda w: w.__name__.strip("_"))
def test_every_write_after_a_cached_call_is_seen(write):
    model = _Model()
    jm = thunder_subclass.jit(model)
    x = torch.randn(4)
    for _ in range(3):  # traced, then hits (the watch is recorded at the first hit)
        torch.testing.assert_close(jm(x), model(x))
    misses, hits = cache_counts(jm)
    assert (misses, hits) == (1, 2)
    write(model.cfg)
    expected = model(x)
    torch.testing.assert_close(jm(x), expected)
    torch.testing.assert_close(jm(x), expected)
    assert cache_counts(jm)[0] == 2  # the write is a miss: a new trace for the new value
    assert type(jm(x)) is torch.Tensor


def test_a_write_that_keeps_the_value_is_a_hit_after_a_full_check(monkeypatch):
    calls = []
    compare = objects._Equal.compare

    def counted(obj, snapshot):
        calls.append(obj)
        return compare(obj, snapshot)

    monkeypatch.setattr(objects._Equal, "compare", staticmethod(counted))
    model = _Model()
    jm = thunder_subclass.jit(model)
    x = torch.randn(4)
    jm(x)
    jm(x)  # the first hit compares in full and records the watch
    before = len(calls)
    for _ in range(5):
        torch.testing.assert_close(jm(x), model(x))
    assert len(calls) == before  # no write: the comparison is not run again
    model.cfg.scale = 2.5
    model.cfg.scale = 2.0  # another float object equal to the traced one: a write, then the same value
    torch.testing.assert_close(jm(x), model(x))
    assert len(calls) == before + 1  # the full comparison ran once, and accepted
    assert cache_counts(jm) == (1, 7)


def test_the_config_check_is_watched():
    model = _Model()
    jm = thunder_subclass.jit(model)
    jm(torch.randn(4))
    checks = [v for v in _fused_constants(jm).values() if isinstance(v, watched.WatchedCheck)]
    assert len(checks) == 1 and checks[0].check.spec.kind == "equal"


def test_unwatchable_state_is_checked_every_call(monkeypatch):
    """A list has no version tag: the object holding one is compared in full on every call."""
    calls = []
    compare = objects._Equal.compare
    monkeypatch.setattr(objects._Equal, "compare", staticmethod(lambda o, s: calls.append(o) or compare(o, s)))
    model = _Model()
    model.cfg.opts = {"k": [1.0]}
    model.forward = lambda x: x * model.cfg.scale if model.cfg == model.cfg else x
    jm = thunder_subclass.jit(model)
    x = torch.randn(4)
    for _ in range(4):
        jm(x)
    assert len(calls) == 4  # every call (the first: the new entry's own check)
    model.cfg.opts["k"].append(2.0)  # a write no tag shows: the full comparison sees it (a miss)
    jm(x)
    assert len(calls) > 4 and cache_counts(jm) == (2, 3)


def test_watch_rules():
    version = dict_version_reader()
    cfg = _Cfg(1.0, {"k": (1, "a", None)})
    assert watched._watch(cfg, version) is not None
    assert watched._watch(_Cfg(1.0, {"k": [1]}), version) is None  # a list
    assert watched._watch(_Cfg(1.0, {"k": torch.zeros(1)}), version) is None  # a tensor (mutable in place)

    class Custom:
        def __eq__(self, other):
            return True

    class Slotted:
        __slots__ = ("a",)

    assert watched._watch(Custom(), version) is None  # its __eq__ may read anything
    assert watched._watch(Slotted(), version) is None  # slots have no version tag
    assert watched._watch(3, version) is None  # nothing to watch


def test_hf_config_is_watched_and_a_config_write_is_seen():
    pytest.importorskip("transformers")
    model = tiny_causal_lm("llama", hidden_size=32, intermediate_size=64, num_attention_heads=2,
                           num_key_value_heads=1, vocab_size=64)
    jm = thunder_subclass.jit(model)
    ids = torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(jm(ids).logits, model(ids).logits)
        checks = [v for v in _fused_constants(jm).values() if isinstance(v, watched.WatchedCheck)]
        assert checks and all(c.last is not None for c in checks)  # the config compared once, then watched
        misses = thunder.cache_misses(jm)
        model.config.output_hidden_states = True  # a write through transformers' __setattr__
        out, expected = jm(ids), model(ids)
        assert thunder.cache_misses(jm) == misses + 1
        assert len(out.hidden_states) == len(expected.hidden_states) == 2
        for a, b in zip(out.hidden_states, expected.hidden_states):
            torch.testing.assert_close(a, b)
        torch.testing.assert_close(out.logits, expected.logits)
