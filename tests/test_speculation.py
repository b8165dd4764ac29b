"""Branches on tensor values traced as one program (``thunder_subclass.runtime.speculation``): the value is computed
while tracing, the branch it picks is traced, and the prologue checks the value on every call; what is not speculated
breaks the graph as before."""

import warnings

import pytest
import thunder
import torch

import thunder_subclass
from thunder_subclass import GraphBreakWarning
from thunder_subclass.runtime import disk_cache
from subclasses import TwoTensor
from helpers import cache_counts


def _no_breaks():
    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.simplefilter("error", GraphBreakWarning)
    return ctx


def test_bool_int_float_index_of_tensors_are_guarded_per_value():
    def f(x, y):
        n = int(y.sum())  # an integer tensor's value
        if float(x.max()) > 0.5 and int(x.argmax()) == 1:
            return x * n
        return x - n

    jf = thunder_subclass.jit(f, fullgraph=True)
    calls = [(torch.tensor([0.0, 0.9, 0.1]), torch.tensor([1, 1])), (torch.tensor([0.0, 0.9, 0.1]), torch.tensor([1, 1])),
             (torch.tensor([0.9, 0.0, 0.1]), torch.tensor([1, 1])), (torch.tensor([0.0, 0.9, 0.1]), torch.tensor([0, 1]))]
    for x, y in calls:
        torch.testing.assert_close(jf(x, y), f(x, y))
    assert thunder.cache_misses(jf) == 3 and thunder.cache_hits(jf) == 1
    prologue = thunder.last_prologue_traces(jf)[-1]
    names = [b.sym.name for b in prologue.bound_symbols]
    assert names.count("check_speculation") == 3  # int, float, int: each its own check
    # after the other checks: an input of another type or shape is rejected before the values are computed
    assert names.index("check_speculation") > max(i for i, n in enumerate(names) if n.startswith("check_")
                                                    and n != "check_speculation")


def test_tolist_of_a_computed_tensor_is_guarded_per_list():
    def f(x):
        counts = (x > 0).sum(0).tolist()  # routing-style counts read as Python numbers
        out = x
        for i, c in enumerate(counts):
            if c > 1:
                out = out + i
        return out * counts[0]

    jf = thunder_subclass.jit(f, fullgraph=True)
    a = torch.tensor([[1.0, -1.0], [1.0, 1.0], [1.0, -1.0]])  # counts [3, 1]
    b = torch.tensor([[1.0, 1.0], [1.0, 1.0], [-1.0, 1.0]])  # counts [2, 3]
    for x in (a, a * 2, b, a):
        torch.testing.assert_close(jf(x), f(x))
    assert cache_counts(jf) == (2, 2)
    checks = [b.args[0] for b in thunder.last_prologue_traces(jf)[-1].bound_symbols
              if b.sym.name == "check_speculation"]
    assert [(c.conversion, c.expected) for c in checks] == [("tolist", [3, 1])]  # the last call's entry
    assert any("tolist of data) was [3, 1] when traced and is [2, 3] now" in r
               for r in thunder_subclass.last_miss_reasons(jf))


def test_a_long_tolist_is_not_speculated():
    def f(x):
        return x * len([v for v in (x > 0).tolist() if v])

    x = torch.randn(thunder_subclass.runtime.speculation.TOLIST_LIMIT + 1)
    with pytest.raises(NotImplementedError, match="tolist"):
        thunder_subclass.jit(f, fullgraph=True)(x)
    jf = thunder_subclass.jit(f)
    with pytest.warns(GraphBreakWarning):
        torch.testing.assert_close(jf(x), f(x))


def test_speculated_values_of_a_subclass_trace_with_grads_equal_to_eager():
    def f(x, w):
        y = x * w
        if y.sum() > 0:  # bool of a TwoTensor
            return (y * 2).sum()
        return (y - 1).sum()

    jf = thunder_subclass.jit(f, fullgraph=True)
    for sign in (1.0, -1.0, 1.0):
        a = sign * torch.rand(3, 2) + 0.1 * sign
        x, w = TwoTensor(a, a.clone()), torch.rand(2, requires_grad=True)
        ew = w.detach().clone().requires_grad_()
        jf(x, w).backward()
        f(x, ew).backward()
        torch.testing.assert_close(w.grad, ew.grad)
    assert thunder.cache_misses(jf) == 2


def test_in_place_or_random_operations_before_the_value_are_not_speculated():
    def in_place(x):
        y = x.clone()
        y.add_(1)  # would change a value in the prologue's computation: not speculated
        if y.sum() > 0:
            return y * 2
        return y

    def random(x):
        if (x + torch.rand(())).sum() > 0:  # running it in the prologue would draw numbers: not speculated
            return x * 2
        return x

    for f in (in_place, random):
        with pytest.raises(NotImplementedError, match=r"casting a TensorProxy to a Python boolean is not supported "
                                                      r"\(data dependency\)"):
            thunder_subclass.jit(f, fullgraph=True)(torch.ones(3))
    jf = thunder_subclass.jit(in_place)
    with pytest.warns(GraphBreakWarning, match=r"data dependency"):
        torch.testing.assert_close(jf(torch.ones(3)), in_place(torch.ones(3)))
    assert jf.graph_breaks.regions == {}


def test_a_value_after_an_in_place_change_of_a_fresh_tensor_it_does_not_read_is_speculated():
    # transformers 4.57's mask: `kv_arange = torch.arange(n); kv_arange += offset`, then dynamic RoPE's branch on
    # `position_ids`: the in-place change is to a tensor made from no tensor, which the value does not read
    def f(x, offset: int):
        kv = torch.arange(x.shape[0])
        kv += offset
        if x.max() + 1 > 2:
            return x * 2 + kv
        return x + kv

    jf = thunder_subclass.jit(f, fullgraph=True)
    for x in (torch.ones(3), torch.full((3,), 5.0), torch.ones(3)):
        torch.testing.assert_close(jf(x, 1), f(x, 1))
    assert cache_counts(jf) == (2, 1)
    assert "check_speculation(" in str(thunder.last_prologue_traces(jf)[0])


def test_a_value_reading_a_view_of_a_fresh_tensor_changed_in_place_is_not_speculated():
    # the view was made before the change: the prologue would compute it from the unchanged tensor
    def f(x):
        kv = torch.zeros(4)
        head = kv[:2]
        kv += 3
        if head.sum() > 1:  # eager: 6 > 1
            return x * 2
        return x

    with pytest.raises(NotImplementedError, match=r"casting a TensorProxy to a Python boolean is not supported"):
        thunder_subclass.jit(f, fullgraph=True)(torch.ones(3))
    jf = thunder_subclass.jit(f)
    with pytest.warns(GraphBreakWarning, match=r"data dependency"):
        torch.testing.assert_close(jf(torch.ones(3)), f(torch.ones(3)))


def test_a_number_from_a_subclass_item_used_by_a_subclass_operation_is_a_break():
    def f(x):
        s = x.sum().item()
        return x * s  # TwoTensor's dispatch runs on fakes: it needs the number

    x = TwoTensor(torch.rand(3), torch.rand(3))
    with pytest.raises(NotImplementedError, match=r"mul on TwoTensor at .*test_speculation\.py:\d+ takes f\d+, a number "
                                                  r"computed from tensor data"):
        thunder_subclass.jit(f, fullgraph=True)(x)
    jf = thunder_subclass.jit(f)
    with pytest.warns(GraphBreakWarning):
        out = jf(x)
    assert type(out) is TwoTensor
    torch.testing.assert_close(out.a, f(x).a)


def test_symbolic_values_read_numbers_from_the_inputs():
    def f(x, limit: int):
        if x.sum() > limit:  # an int input (a number proxy under symbolic values) and tensor data
            return x * 2
        return x - 1

    jf = thunder_subclass.jit(f, cache="symbolic values", fullgraph=True)
    for n, limit in ((3, 2), (5, 2), (4, 100), (6, 100), (2, 1)):
        x = torch.ones(n)
        torch.testing.assert_close(jf(x, limit), f(x, limit))
    assert thunder.cache_misses(jf) == 2  # one trace per branch, for every size and limit


@pytest.fixture
def disk(tmp_path):
    config = thunder_subclass.config
    saved = (config.disk_cache, config.disk_cache_dir)
    config.disk_cache, config.disk_cache_dir = True, str(tmp_path / "cache")
    disk_cache.reset_disk_cache_stats()
    try:
        yield tmp_path / "cache"
    finally:
        config.disk_cache, config.disk_cache_dir = saved
        disk_cache.reset_disk_cache_stats()


def _branchy(x, w):
    y = x * w
    if y.sum().item() > 0:
        return y * 2
    return y - 1


def test_a_speculated_entry_loaded_from_disk_keeps_its_check(disk):
    w = torch.rand(3)
    pos, neg = TwoTensor(torch.rand(2, 3), torch.rand(2, 3)), TwoTensor(-torch.rand(2, 3), -torch.rand(2, 3))
    with torch.no_grad():
        thunder_subclass.jit(_branchy)(pos, w)
        assert disk_cache.disk_cache_stats()["stores"] == 1
        jf = thunder_subclass.jit(_branchy)  # a new in-memory cache: its first call reads the disk
        for x in (pos, neg):  # the loaded entry's check rejects the other branch: a new trace, not a wrong answer
            out = jf(x, w)
            assert type(out) is TwoTensor
            torch.testing.assert_close(out.a, _branchy(x, w).a)
            torch.testing.assert_close(out.b, _branchy(x, w).b)
    stats = disk_cache.disk_cache_stats()
    assert stats["hits"] == 1 and stats["rejected"] == 1 and stats["stores"] == 2
    assert thunder.cache_misses(jf) == 2


def test_tracing_keeps_no_reference_to_the_arguments():
    import gc
    import weakref

    def f(x):
        if x.sum() > 0:  # the slice starts from the call's real arguments while tracing
            return x * 2
        return x - 1

    jf = thunder_subclass.jit(f)
    x = torch.rand(1000)
    ref = weakref.ref(x)
    torch.testing.assert_close(jf(x), f(x))
    del x
    gc.collect()
    assert ref() is None
    torch.testing.assert_close(jf(-torch.ones(3)), f(-torch.ones(3)))  # the speculation itself still works
    assert thunder.cache_misses(jf) == 2


def test_a_branch_under_autocast_takes_eagers_side_when_the_low_precision_sum_flips_sign():
    # the value a branch reads is computed as eager computes it under autocast (here bfloat16 makes the sum negative,
    # float32 positive): the compiled function takes eager's branch, by a speculated value or at a graph break
    def f(x, w):
        y = x @ w
        return (y * 2) if y.sum() > 0 else (y * -1)

    g = torch.Generator().manual_seed(280)
    x, w = torch.randn(4, 64, generator=g), torch.randn(64, 4, generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = (x @ w).sum().item()
    assert low < 0 < (x @ w).sum().item()  # the inputs flip the branch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GraphBreakWarning)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            expected, out = f(x, w), thunder_subclass.jit(f)(x, w)
        plain = thunder_subclass.jit(f)(x, w)  # and without autocast, the float32 branch
    assert out.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(plain, f(x, w))
    assert torch.all(plain * out.float() <= 0)  # the two took opposite branches
