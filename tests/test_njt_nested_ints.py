"""A nested int (the ragged size of a jagged NestedTensor, ``nt.size(1)``) returned by a compiled function is eager's:
the one of the call's input, read again at run time (also on a cache hit with other offsets), the same object eager
returns; one whose offsets the compiled code computed is a typed error."""

import pytest
import torch

import thunder_subclass
from helpers import cache_counts, same_nested_int
from thunder_subclass.errors import UnsupportedSubclassOperationError


def njt(lengths=(2, 3, 4), d=5, requires_grad=False):
    return torch.nested.nested_tensor(
        [torch.randn(n, d, dtype=torch.float64) for n in lengths], layout=torch.jagged, requires_grad=requires_grad
    )


def _ragged(v):
    """The nested ints of ``v``'s leaves (a SymInt, a torch.Size, a tuple of those and tensors)."""
    if isinstance(v, torch.SymInt):
        return [v]
    if isinstance(v, (tuple, list)):
        return [n for e in v for n in _ragged(e)]
    return []


CASES = {
    "nt.shape[1]": lambda nt: nt.shape[1],
    "(nt.sin(), nt.size(1))": lambda nt: (nt.sin(), nt.size(1)),
    "nt.shape": lambda nt: nt.shape,
    "nt.size(1) * 2": lambda nt: nt.size(1) * 2,
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_returned_ragged_size_is_the_inputs_on_every_call(case):
    f = CASES[case]
    jf = thunder_subclass.jit(f)
    for lengths in ((2, 3, 4), (1, 5, 2), (2, 3, 4)):  # the third: a cache hit with other offsets and nested int
        x = njt(lengths)
        y, expected = jf(x), f(x)
        assert type(y) is type(expected)
        got, want = _ragged(y), _ragged(expected)
        assert len(got) == len(want) >= 1
        for a, b in zip(got, want):
            assert type(a) is torch.SymInt and a == b
        if isinstance(expected, tuple) and isinstance(expected[0], torch.Tensor):
            torch.testing.assert_close(y[0], expected[0])
            assert same_nested_int(y[0].size(1), y[1])  # ragged like the input, as in eager
        if case == "nt.shape[1]":
            assert same_nested_int(y, x.size(1))  # the input's own nested int object
    # the NestedTensor's sizes are symbolic from the first call (nested_tensor() marks its cached lengths dynamic);
    # a fake run of sin relies on each length being at least 2 (the ShapeEnv's range): (1, 5, 2) is traced again
    assert cache_counts(jf) == ((2, 1) if "sin" in case else (1, 2))


def test_the_ragged_size_of_a_nested_tensor_built_on_an_offsets_input():
    def f(values, offsets):
        nt = torch.nested.nested_tensor_from_jagged(values, offsets)
        return nt.sin(), nt.size(1)

    jf = thunder_subclass.jit(f)
    for offsets in ([0, 2, 5, 9], [0, 1, 5, 9], [0, 2, 5, 9]):
        v, o = torch.randn(9, 3), torch.tensor(offsets)
        (y, n), (ye, ne) = jf(v, o), f(v, o)
        torch.testing.assert_close(y, ye)
        assert same_nested_int(n, ne) and same_nested_int(y.size(1), n)  # eager's nested int of these offsets
    assert cache_counts(jf) == (1, 2)


def test_a_returned_ragged_size_with_gradients():
    f = lambda nt: ((nt * 2).sin(), nt.shape[1])  # noqa: E731
    x = njt(requires_grad=True)
    xe = torch.nested.nested_tensor(list(x.detach().unbind()), layout=torch.jagged, requires_grad=True)
    (y, n), (ye, ne) = thunder_subclass.jit(f)(x), f(xe)
    assert same_nested_int(n, x.size(1)) and same_nested_int(ne, xe.size(1))
    y.values().sum().backward()
    ye.values().sum().backward()
    torch.testing.assert_close(x.grad.values(), xe.grad.values())


def test_the_ragged_size_of_offsets_computed_in_the_compiled_code_is_a_typed_error():
    def f(values, offsets):
        return torch.nested.nested_tensor_from_jagged(values, offsets + 0).shape[1]

    with pytest.raises(UnsupportedSubclassOperationError,
                       match=r"returns j\d+, the ragged size of a jagged NestedTensor \(a nested int\) whose offsets "
                             r"the compiled code computed.*Return the NestedTensor"):
        thunder_subclass.jit(f)(torch.randn(9, 3), torch.tensor([0, 2, 5, 9]))
