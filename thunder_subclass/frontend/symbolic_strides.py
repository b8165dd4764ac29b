"""Stage 4 (interpretation), ``x.stride()`` of a plain tensor with symbolic sizes (``dynamic=True``, automatic dynamic shapes): strides as
number proxies computed from the size numbers, equal to eager's for every call the trace serves.

In: a plain tensor proxy with symbolic sizes whose strides traced code reads (``interpretation``). What happens: the
value is made again as a fake under a fresh ``_thunder_internals.ShapeSymbols`` environment: an input of the trace
as a dense tensor with its dims in the order its strides had (:func:`remember_input_layout`; the prologue then checks
that order, ``guards.layouts.TensorLayout``), or an inner tensor of a subclass input as a contiguous one
(``check_subclass`` checks that), and a computed value by running the torch operations that produced it on those
fakes, inputs first. Out: the fake's symbolic strides mapped to number proxies (products of sizes, computed in the
trace by thunder's number prims), with prologue checks for what the runs relied on (``add_size_guards``: sizes 0
and 1 are pinned, as torch.compile specialises them). Where this cannot be done (an input that is not dense: a
slice, an expanded tensor; a value made by an operation fakes cannot run) :class:`StrideUnknown` says why.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

from thunder.core.proxies import NumberProxy, TensorProxy

from thunder_subclass._thunder_internals import ShapeSymbols, add_size_guards, tensor_producer
from thunder_subclass.frontend.fake import FakeEnv, stride_of, torch_argument, torch_device, torch_dtype
from thunder_subclass.frontend.proxy import SubclassTensorProxy

__all__ = ["StrideUnknown", "remember_input_layout", "remember_contiguous_inner", "symbolic_strides", "dense_order"]

_LAYOUT_ATTR = "_thunder_subclass_input_layout"  # (order innermost first, add_guard or None) of an input proxy
_DEPTH = 256  # producing operations followed back from the value


class StrideUnknown(Exception):
    """The strides of this value cannot be given as numbers of its symbolic sizes; the message says why."""


def dense_order(shape, stride) -> tuple[int, ...] | None:
    """The dims of a dense tensor of sizes ``shape`` and strides ``stride``, innermost first (ties: the later dim
    inside), or None when the tensor is not dense in any order (a slice, an expanded or overlapping tensor)."""
    order = tuple(sorted(range(len(shape)), key=lambda d: (stride[d], -d)))
    acc = 1
    for d in order:
        if stride[d] != acc:
            return None
        acc *= max(int(shape[d]), 1)
    return order


def remember_input_layout(p: TensorProxy, t: torch.Tensor, add_guard) -> None:
    """Plain tensor input ``p`` with symbolic sizes was ``t``: a later ``x.stride()`` of it (or of a value computed
    from it) builds its strides from the dims' order; ``add_guard(order)`` adds the prologue check of that order,
    called the first time (most inputs never get one)."""
    if t.layout is torch.strided:
        p.__dict__[_LAYOUT_ATTR] = (dense_order(tuple(t.shape), tuple(t.stride())), add_guard)


def remember_contiguous_inner(q: TensorProxy, t: torch.Tensor) -> None:
    """Inner tensor ``q`` of a subclass input with symbolic sizes, checked contiguous by ``check_subclass`` (which
    accepts any stride at a dim of size 1: such a tensor gets no symbolic strides)."""
    contiguous = t.layout is torch.strided and 1 not in tuple(t.shape) and \
        dense_order(tuple(t.shape), tuple(t.stride())) == tuple(reversed(range(t.dim())))
    q.__dict__[_LAYOUT_ATTR] = (tuple(reversed(range(t.dim()))) if contiguous else None, None)


def symbolic_strides(p: TensorProxy) -> tuple:
    """The strides of plain tensor proxy ``p`` (symbolic sizes) as ints and number proxies of the current trace."""
    env = FakeEnv(ShapeSymbols())
    fake = _layout_fake(p, env, {}, [_DEPTH])
    try:
        strides = tuple(env.symbols.number(s, compute=True) for s in fake.stride())
    except Exception as e:  # noqa: BLE001 - an expression thunder's number prims do not compute
        raise StrideUnknown(f"its strides are {tuple(fake.stride())}, not products of its sizes ({e})") from e
    add_size_guards(env.symbols)
    return strides


def _layout_fake(q: TensorProxy, env: FakeEnv, memo: dict, budget: list) -> torch.Tensor:
    found = memo.get(id(q))
    if found is not None:
        return found
    if isinstance(q, SubclassTensorProxy):
        raise StrideUnknown(f"it is computed from {q.subclass_type.__name__} {q.name} by a plain operation")
    if all(type(d) is int for d in q._shape):  # static sizes: the strides the plugin knows (an input's are checked)
        with env.symbols.mode:
            fake = torch.empty_strided(tuple(q._shape), stride_of(q), dtype=torch_dtype(q), device=torch_device(q))
        return memo.setdefault(id(q), fake)
    layout = q.__dict__.get(_LAYOUT_ATTR)
    if layout is not None:
        order, add_guard = layout
        if order is None:
            raise StrideUnknown(f"input {q.name} is not a dense tensor (a slice or an expanded tensor), or is an inner "
                                f"tensor with a dim of size 1")
        if add_guard is not None:
            add_guard(order)
            q.__dict__[_LAYOUT_ATTR] = (order, None)
        shape = [_size(env, d) for d in q._shape]
        strides, acc = [0] * len(shape), 1
        for d in order:
            strides[d] = acc
            acc = acc * (shape[d] if not isinstance(shape[d], int) else max(shape[d], 1))
        with env.symbols.mode:
            fake = torch.empty_strided(shape, strides, dtype=torch_dtype(q), device=torch_device(q))
        return memo.setdefault(id(q), fake)
    found = tensor_producer(q)
    if found is None:
        raise StrideUnknown(f"{q.name} is made by an operation whose strides are not known")
    budget[0] -= 1
    if budget[0] < 0:
        raise StrideUnknown(f"{q.name} is computed by more than {_DEPTH} operations")
    fns, bsym = found

    def arg(x: Any) -> Any:
        if isinstance(x, TensorProxy):
            return _layout_fake(x, env, memo, budget)
        if isinstance(x, NumberProxy):
            return env.to_fake(x)
        return torch_argument(x)

    args, kwargs = pytree.tree_map(arg, (bsym.args, bsym.kwargs),
                                   is_leaf=lambda x: isinstance(x, (TensorProxy, NumberProxy)))
    outs = [o for o in bsym.flat_proxy_outs if isinstance(o, TensorProxy)]
    for fn in fns:
        try:
            with env.symbols.mode:
                out = fn(*args, **kwargs)
        except Exception:  # noqa: BLE001 - another torch callable of the symbol may fit its arguments
            continue
        flat = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
        if len(flat) == len(outs) and all(_same_sizes(f, o) for f, o in zip(flat, outs)):
            for f, o in zip(flat, outs):
                memo.setdefault(id(o), f)
            return memo[id(q)]
    raise StrideUnknown(f"{bsym.sym.name}, which made {q.name}, cannot run on fakes with symbolic sizes")


def _size(env: FakeEnv, d: Any) -> Any:
    """Size ``d`` of an input as its fake has it: the symbol of a size number (an int where pinned)."""
    if isinstance(d, NumberProxy):
        return int(d.value) if d.is_static_constrained() else env.symbols.symint(d)
    return int(d)


def _same_sizes(fake: torch.Tensor, p: TensorProxy) -> bool:
    """Whether ``fake`` has the sizes of ``p`` for the traced values (its symbols' hints)."""
    if fake.dim() != len(p._shape):
        return False
    for s, d in zip(fake.shape, p._shape):
        v = s.node.hint if isinstance(s, torch.SymInt) else s
        if v is None or int(v) != int(d.value if isinstance(d, NumberProxy) else d):
            return False
    return True
