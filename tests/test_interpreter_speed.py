"""The interpreter's fast paths (``_thunder_internals.interpreter_speed``) give what thunder's interpreted helpers
give: Python programs that exercise each path (globals, subscripts, loops, ``in``, attribute and item stores, dict
merges, list extends, closures, ``iter``/``next``) return eager's values, read and change their Python inputs as
eager does, and are guarded as before (a changed Python input is a cache miss)."""

from __future__ import annotations

import torch
from torch.testing import assert_close
from torch.testing._internal.two_tensor import TwoTensor

import thunder_subclass
from thunder_subclass import _thunder_internals

SCALE = 3.0
len = len  # a module global shadowing a builtin: read from the globals dict, not __builtins__  # noqa: PLW0127


def _tt(*shape):
    a = torch.randn(*shape)
    return TwoTensor(a, a * 2)


def _check(fn, *args, **kwargs):
    expected = fn(*args, **kwargs)
    jfn = thunder_subclass.jit(fn)
    actual = jfn(*args, **kwargs)
    assert_close(actual, expected)
    assert type(actual) is type(expected)
    return jfn


def test_every_helper_of_thunder_0_2_6_is_recognised():
    thunder_subclass.jit(lambda x: x)  # installs the hooks
    import thunder.core.interpreter as interpreter

    assert interpreter._interpret_call.fast_helpers == 6
    assert interpreter.globals_lookup.__wrapped__ is not None


def test_loops_over_lists_tuples_dicts_and_reversed_sequences():
    def f(x, weights: list, table: dict):
        out = x
        for w in weights:
            out = out * w
        for w in reversed(tuple(weights)):
            out = out + w
        for k in table:
            out = out + table[k]
        for k, v in table.items():
            out = out - v * len(k)
        for i, w in enumerate(weights):
            out = out + i * w
        return out * SCALE

    _check(f, _tt(3), [1.0, 2.0, 3.0], {"a": 1.0, "bb": 2.0})


def test_a_list_that_grows_while_iterated_is_iterated_as_python_does():
    def f(x):
        items = [1, 2]
        seen = []
        for v in items:
            seen.append(v)
            if v < 4:
                items.append(v + 2)
        return x * sum(seen), seen

    expected = f(torch.ones(2))
    out, seen = thunder_subclass.jit(f)(torch.ones(2))
    assert seen == expected[1] == [1, 2, 3, 4, 5]
    assert_close(out, expected[0])


def test_in_and_not_in_on_each_kind_of_container():
    names = ("q", "k")

    def f(x, d: dict, tensors: list):
        out = x
        if "a" in d:
            out = out + 1
        if "z" not in d:
            out = out + 2
        if "k" in names:
            out = out + 3
        if 3 in {1, 2, 3}:
            out = out + 4
        if "ell" in "hello":
            out = out + 5
        if 2.0 not in [1, None, "x"]:
            out = out + 6
        return out

    x = _tt(2)
    _check(f, x, {"a": 1}, [x])
    _check(f, x, {"b": 1}, [])


def test_attribute_and_item_stores_reach_the_callers_objects():
    class Box:
        pass

    def f(x, box, d: dict, lst: list):
        box.scale = 2.0
        d["y"] = box.scale * 3
        local = [0, 1]
        local[0] = 5
        merged = {**d, "z": 1}
        ext = [*lst, *local, *[7, 8]]
        return x * merged["y"] + len(ext) + ext[2]

    x = _tt(3)
    box, d, lst = Box(), {"w": 1}, [0, 1]
    expected = f(x, Box(), {"w": 1}, [0, 1])
    out = thunder_subclass.jit(f)(x, box, d, lst)
    assert_close(out, expected)
    assert box.scale == 2.0
    assert d == {"w": 1, "y": 6.0} and lst == [0, 1]


def test_closures_keywords_and_star_arguments():
    def outer(scale):
        def inner(x, *rest, bias=0.0, **extra):
            return x * scale + bias + sum(rest) + sum(extra.values())
        return inner

    g = outer(4.0)

    def f(x, args: tuple, kwargs: dict):
        return g(x, *args, **kwargs)

    _check(f, _tt(2), (1.0, 2.0), {"bias": 0.5, "c": 3.0})


def test_a_longer_list_or_a_dict_with_other_keys_is_a_cache_miss_not_the_shorter_trace():
    # before: the trace of a 1-item list ran for a 2-item list (thunder checks the items read, not the length)
    def f(x, table: dict, weights: list):
        out = x
        for w in weights:
            out = out * w
        for k in table:
            out = out + table[k]
        return out

    jfn = thunder_subclass.jit(f)
    x = _tt(2)
    expected_reason = {2: "len(", 3: "== ('a',)"}
    for i, (table, weights) in enumerate([({"a": 1.0}, [2.0]), ({"a": 5.0}, [2.0]), ({"a": 5.0}, [2.0, 3.0]),
                                          ({"a": 5.0, "b": 1.0}, [2.0, 3.0]), ({"b": 1.0, "a": 5.0}, (2.0, 3.0))]):
        assert_close(jfn(x, table, weights), f(x, table, weights))
        if i in expected_reason:
            reasons = thunder_subclass.last_miss_reasons(jfn)
            assert any(expected_reason[i] in r for r in reasons), reasons


def test_uninstall_restores_thunders_handlers_and_plain_thunder_runs_loops():
    thunder_subclass.jit(lambda x: x)
    import thunder
    import thunder.core.interpreter as interpreter

    hooked = ("BINARY_SUBSCR", "FOR_ITER", "CONTAINS_OP", "STORE_ATTR", "STORE_SUBSCR")
    assert all(getattr(interpreter._default_opcode_handler_map[op], "_thunder_subclass_hook", False) for op in hooked)
    _thunder_internals.uninstall()
    try:
        assert not any(getattr(interpreter._default_opcode_handler_map[op], "_thunder_subclass_hook", False)
                       for op in hooked)
        assert not getattr(interpreter._interpret_call, "_thunder_subclass_hook", False)
        assert not getattr(interpreter._default_lookaside_map[next], "_thunder_subclass_hook", False)

        def f(x, ws):
            for w in ws:
                x = x * w
            return x if "a" in {"a": 1} else -x

        assert_close(thunder.jit(f)(torch.ones(2), [2.0, 3.0]), torch.full((2,), 6.0))
    finally:
        thunder_subclass.jit(lambda x: x)  # installs again
    assert getattr(interpreter._default_opcode_handler_map["FOR_ITER"], "_thunder_subclass_hook", False)
