"""Stage 4 (interpretation), jagged NestedTensors with symbolic sizes: one trace for every batch of lengths of the
same structure under ``cache="symbolic values"`` (``dynamic=True``, automatic dynamic shapes).

In: a jagged ``NestedTensor`` argument of a plugin jit (``torch.nested`` with ``layout=torch.jagged``) whose inner
tensors are contiguous. What happens: its outer sizes other than the ragged one become input size numbers
(:func:`outer_size_numbers`; the ragged size stays the input's nested int, as without symbolic sizes), related to its
inner tensors' sizes (:func:`relate_inner_sizes`): a dense outer size is the values' size at that dim (guarded equal,
one symbol), the batch size is the offsets' length less one (by construction: the same symbol less one, no guard),
the lengths' length (a NestedTensor with holes) is the batch size (guarded). Fakes of the NestedTensor are rebuilt by
its own ``__tensor_unflatten__`` from fakes of the inner tensors with symbolic sizes and the nested int of the traced
input (:func:`fake_outer`). Out: a subclass proxy whose sizes stay symbolic; the trace depends on the structure (the
ragged dim, the dense sizes where a fake run relied on them, dtype, device, which inner tensors there are), not on the
lengths. Fakes of the offsets / lengths know no values: dispatch that reads them fails in the symbolic run, and the
operation runs again on fakes of the traced sizes, guarded by value (``guards.inputs``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from thunder.core.proxies import NumberProxy

from thunder_subclass._thunder_internals import input_size_numbers, is_nested_int, relate_size_by_offset

__all__ = ["is_jagged", "is_jagged_proxy", "is_jagged_inner", "has_symbolic_jagged_layout", "outer_size_numbers",
           "relate_inner_sizes", "fake_outer", "result_strides"]


def is_jagged(t: Any) -> bool:
    """Whether ``t`` is a jagged ``NestedTensor`` (``torch.nested`` with ``layout=torch.jagged``)."""
    from torch.nested._internal.nested_tensor import NestedTensor

    return type(t) is NestedTensor


def is_jagged_proxy(p: Any) -> bool:
    """Whether subclass proxy ``p`` stands for a jagged ``NestedTensor``."""
    from torch.nested._internal.nested_tensor import NestedTensor

    return getattr(p, "subclass_type", None) is NestedTensor


def _is_contiguous(x: torch.Tensor) -> bool:
    acc = 1
    for size, stride in zip(reversed(x.shape), reversed(x.stride())):
        if size != 1 and stride != acc:
            return False
        acc *= max(size, 1)
    return True


def has_symbolic_jagged_layout(t: torch.Tensor) -> bool:
    """Whether jagged NestedTensor input ``t`` keeps symbolic sizes: each inner tensor is a contiguous strided plain
    tensor (fakes with symbolic sizes are made contiguous in the symbols; ``check_subclass`` checks it). A
    NestedTensor with holes (``lengths``, ``torch.nested.narrow``) qualifies: its inner tensors are contiguous."""
    attrs, _ = t.__tensor_flatten__()
    for a in attrs:
        x = getattr(t, a)
        if type(x) is not torch.Tensor or x.layout is not torch.strided or not _is_contiguous(x):
            return False
    return True


def outer_size_numbers(t: torch.Tensor, history) -> tuple:
    """The outer size of jagged NestedTensor input ``t`` as the proxy holds it under symbolic sizes: the batch size a
    number proxy read from the input (``<t>.shape[0]``), the ragged size ``t``'s nested int, the dense sizes ints
    (checked: see :func:`relate_inner_sizes`)."""
    shape = tuple(t.shape)
    batch = input_size_numbers(shape[:1], history)
    return (*batch, *shape[1:])


_JAGGED_INNER = "_thunder_subclass_jagged_inner"


def is_jagged_inner(q: Any) -> bool:
    """Whether ``q`` is the proxy of an inner tensor of a jagged NestedTensor input with symbolic sizes: fakes of its
    offsets / lengths get symbolic sizes and know no values (other integer inputs with known values keep fixed
    sizes: a fake run that reads them relies on their values, guarded)."""
    return q.__dict__.get(_JAGGED_INNER, False)


def relate_inner_sizes(p) -> list:
    """Relate the size numbers of jagged NestedTensor input proxy ``p`` (a ``SubclassTensorProxy``) to those of its
    inner proxies: the batch size is the offsets' length less one (``relate_size_by_offset``); the values' dims other
    than the ragged one (the dense sizes) are pinned (a NestedTensor's strides are its nested int times them, which
    stay those of the plain nested int only for fixed dense sizes); returns the pairs ``(inner number, outer number)``
    to guard equal (``guard_equal_sizes``): the lengths' length (a NestedTensor with holes) and the batch size."""
    pairs = []
    for q in p.inner.values():  # fakes with symbolic sizes, knowing no values (:func:`is_jagged_inner`)
        q.__dict__[_JAGGED_INNER] = True
    batch = p._shape[0]
    offsets, lengths, values = p.inner.get("_offsets"), p.inner.get("_lengths"), p.inner.get("_values")
    if isinstance(batch, NumberProxy) and offsets is not None and isinstance(offsets._shape[0], NumberProxy):
        relate_size_by_offset(batch, offsets._shape[0], -1)
    if isinstance(batch, NumberProxy) and lengths is not None and isinstance(lengths._shape[0], NumberProxy):
        pairs.append((lengths._shape[0], batch))
    ragged = min(p.nested_sizes) - 1  # the values' dim that holds the ragged one
    for k, d in enumerate(values._shape if values is not None else ()):
        if k != ragged and isinstance(d, NumberProxy):
            d.make_static_constrained()
    return pairs


def fake_outer(x, size: tuple, size_of: Callable[[Any], Any], symbols) -> tuple[tuple, tuple]:
    """The outer size and strides to rebuild a fake of jagged NestedTensor proxy ``x`` with symbolic sizes:
    ``size_of(d)`` (the environment's symbol) at each dim, at the ragged one the symbolic nested int standing for the
    proxy's (``ShapeSymbols.nested_int``); a size that is a SymInt already (``size`` given by the caller: a gradient's
    fake has its output fake's sizes) as it is. ``NestedTensor``'s ``__tensor_unflatten__`` computes its size and
    strides from the inner fakes and takes only the nested int from these (the strides given are the traced ones)."""

    def one(d):
        if is_nested_int(d):
            return symbols.nested_int(d)
        return d if isinstance(d, torch.SymInt) else size_of(d)

    return tuple(one(d) for d in size), tuple(x.outer_stride)


def result_strides(env, x: torch.Tensor) -> tuple:
    """The outer strides of jagged NestedTensor ``x``, a result of a fake run of ``env`` (a ``FakeEnv``), as its
    proxy holds them: in a symbolic environment, the strides' values for the traced sizes where they multiply the
    ragged size by symbolic sizes (``ShapeSymbols.number``'s ``ragged_stride``; nothing reads them as numbers)."""
    if env.symbols is None:
        return env.numbers(x.stride())
    return tuple(env.symbols.number(s, compute=True, ragged_stride=True) for s in x.stride())
