"""Automatic dynamic shapes (``thunder_subclass.jit``'s default, ``dynamic=None``): a cache miss caused only by new
sizes makes the next trace's sizes symbolic, so new sizes stop retracing; ``dynamic=False`` / ``True`` choose."""

import warnings

import pytest
import thunder
import torch

import thunder_subclass
from thunder_subclass._thunder_internals import record_of
from subclasses import TwoTensor
from helpers import cache_counts

SIZES = (2, 3, 4, 5, 6)


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def _state(jfn):
    return record_of(jfn).dynamic_shapes.state


def test_new_batch_sizes_trace_twice_then_hit():
    def f(x, y):
        return (x * 2 + 1).sum(0) + y

    jf = thunder_subclass.jit(f)
    for n in SIZES:
        x, y = torch.randn(n, 4), torch.randn(4)
        torch.testing.assert_close(jf(x, y), f(x, y))
    assert cache_counts(jf) == (2, 3)
    assert _state(jf) == "symbolic"
    # the symbolic trace's shapes hold number proxies, the first (exact) trace's do not
    assert "IntegerProxy" in str(thunder.last_traces(jf)[0])


def test_training_loop_over_five_batch_sizes_traces_twice():
    model = _mlp()
    reference = _mlp()
    reference.load_state_dict(model.state_dict())
    jmodel = thunder_subclass.jit(model)
    for n in SIZES:
        x = torch.randn(n, 4)
        out, expected = jmodel(x), reference(x)
        torch.testing.assert_close(out, expected)
        out.square().sum().backward()
        expected.square().sum().backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert thunder.cache_misses(jmodel) == 2


def test_exact_entries_keep_answering_their_sizes():
    jf = thunder_subclass.jit(lambda x: x.cos() + 1)
    first = torch.randn(2, 3)
    jf(first)
    jf(torch.randn(5, 3))  # size-driven miss: the symbolic trace
    torch.testing.assert_close(jf(first), first.cos() + 1)
    # the exact trace made for the first size answered it, not the symbolic one
    assert "IntegerProxy" not in str(thunder.last_traces(jf)[0])
    jf(torch.randn(7, 3))
    assert "IntegerProxy" in str(thunder.last_traces(jf)[0])
    assert thunder.cache_misses(jf) == 2


def test_a_miss_for_another_reason_keeps_sizes_static():
    jf = thunder_subclass.jit(lambda x: x * 2)
    jf(torch.ones(3))
    jf(torch.ones(3, dtype=torch.float64))  # dtype, not size
    assert _state(jf) == "static"
    assert "IntegerProxy" not in str(thunder.last_traces(jf)[0])


@pytest.mark.parametrize("dynamic, misses", [(False, len(SIZES)), (True, 1)])
def test_dynamic_false_and_true(dynamic, misses):
    jf = thunder_subclass.jit(lambda x: x.sin() * 3, dynamic=dynamic)
    for n in SIZES:
        x = torch.randn(n)
        torch.testing.assert_close(jf(x), x.sin() * 3)
    assert thunder.cache_misses(jf) == misses
    assert thunder.cache_option(jf).name == ("SYMBOLIC_VALUES" if dynamic else "CONSTANT_VALUES")


def test_dynamic_with_cache_is_a_type_error():
    with pytest.raises(TypeError, match="pass either dynamic or cache, not both"):
        thunder_subclass.jit(lambda x: x, dynamic=True, cache="symbolic values")
    with pytest.raises(TypeError, match="dynamic must be None, True or False, got 'yes'"):
        thunder_subclass.jit(lambda x: x, dynamic="yes")


def test_an_explicit_cache_option_is_used_as_given():
    jf = thunder_subclass.jit(lambda x: x + 1, cache="constant values")
    for n in SIZES[:3]:
        jf(torch.ones(n))
    assert thunder.cache_misses(jf) == 3


def test_a_function_that_cannot_trace_with_symbolic_sizes_keeps_static_traces():
    def f(x):
        if type(x.shape[0]) is not int:  # true only while tracing with symbolic sizes
            raise TypeError("needs an int size")
        return x * 2

    jf = thunder_subclass.jit(f)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (2, 3, 4, 5):
            torch.testing.assert_close(jf(torch.ones(n)), torch.ones(n) * 2)
    messages = [str(w.message) for w in caught if "symbolic sizes" in str(w.message)]
    where = f"{f.__qualname__} ({__file__}:{f.__code__.co_firstlineno})"
    assert messages == [
        f"thunder_subclass: tracing {where} with symbolic sizes after its inputs changed size failed (TypeError: "
        "needs an int size); it keeps one trace per input size. Pass dynamic=False to thunder_subclass.jit to choose "
        "that from the start."
    ]
    assert _state(jf) == "static for good"
    assert len(thunder.compile_stats(jf).interpreter_cache) == 4  # one exact trace per size


def test_an_error_of_the_program_itself_is_raised_not_retried():
    calls = []

    def f(x):
        calls.append(1)
        return x.view(-1, 3)  # sizes 2 and 4 are not multiples of 3: eager raises too

    jf = thunder_subclass.jit(f)
    jf(torch.ones(6))
    with pytest.raises(RuntimeError, match="shape"):
        jf(torch.ones(4))
    with pytest.raises(RuntimeError, match="shape"):
        f(torch.ones(4))


def test_subclass_sizes_become_symbolic_after_a_size_driven_miss():
    # TwoTensor's dispatch runs on fakes with symbolic sizes (a ShapeEnv) in the second trace: the third size hits
    jf = thunder_subclass.jit(lambda t: t * 2)
    for n in (2, 3, 4):
        t = TwoTensor(torch.randn(n), torch.randn(n))
        out = jf(t)
        assert type(out) is TwoTensor
        torch.testing.assert_close(out.a, t.a * 2)
        torch.testing.assert_close(out.b, t.b * 2)
    assert cache_counts(jf) == (2, 1)
    assert _state(jf) == "symbolic"


# an int read from inside the arguments that changes on every call (a static cache layer's cumulative_length, a step
# counter): the arguments look the same, the newest entry rejects the call on that int; automatic dynamic shapes takes
# it as a size change, as torch.compile's does for ints


class _Window:
    def __init__(self):
        self.position, self.buffer = 0, torch.zeros(8)


def _write_at(x, window):
    out = window.buffer.clone()
    out[window.position:window.position + 1] = x  # sliced by the int, as a cache layer writes its next slot
    return out * 2


@pytest.mark.parametrize("dynamic, misses", [(None, 2), (False, 6)])
def test_an_int_attribute_that_changes_every_call_stops_retracing(dynamic, misses):
    window = _Window()
    jf = thunder_subclass.jit(_write_at, dynamic=dynamic)
    for step in range(6):
        x = torch.full((1,), float(step + 1))
        window.position = step
        torch.testing.assert_close(jf(x, window), _write_at(x, window))
    assert thunder.cache_misses(jf) == misses
    if dynamic is None:
        assert _state(jf) == "symbolic"


def test_isinstance_of_a_symbolic_int_is_eagers():
    # transformers' slice_logits_to_keep: `if isinstance(n, int): n = slice(-n, None)`; thunder 0.2.6's isinstance of a
    # number proxy is False, and the int then indexed a dimension ("Dimension out of range"). (The isinstance fix for
    # classes with their own __instancecheck__ must leave number proxies to the symbolic-values one.)
    def keep_last(h, n):
        if isinstance(n, int):
            n = slice(-n, None)
        return h[:, n, :]

    jf = thunder_subclass.jit(keep_last, dynamic=True)
    h = torch.randn(2, 5, 3)
    for n in (1, 2, 3):
        torch.testing.assert_close(jf(h, n), keep_last(h, n))
    assert thunder.cache_misses(jf) == 1


@pytest.mark.parametrize("convert", [float, lambda n: int(n / 2), lambda n: int(n)])
def test_a_size_converted_to_a_python_number_is_never_a_stale_constant(convert):
    # thunder's NumberProxy.__float__ / __int__ return the traced value unchecked: under automatic dynamic shapes the
    # symbolic trace kept the size of the call it was made for, and later sizes got that number silently
    def f(x):
        return x * convert(x.shape[0]) + torch.arange(float(x.shape[0]))

    jf = thunder_subclass.jit(f)
    for n in SIZES:
        x = torch.ones(n)
        torch.testing.assert_close(jf(x), f(x))


def test_dynamic_true_does_not_warn_that_symbolic_values_are_experimental():
    # thunder warns "The 'symbolic values' cache option is highly experimental and for development only" for its own
    # option; dynamic=True is thunder_subclass's supported one
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jf = thunder_subclass.jit(lambda x: x.sin() * 3, dynamic=True)
        for n in (2, 3):
            torch.testing.assert_close(jf(torch.ones(n)), torch.ones(n).sin() * 3)
    assert not [w for w in caught if "highly experimental" in str(w.message)]
