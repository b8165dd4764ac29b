"""Stage 6 (flatten and executors), redundant operations: detaches that change nothing, conversions to the dtype a
tensor has, and pure operations computed twice in the backward, removed from a flattened trace.

In: a flattened trace (the flatten pass has just run; after autograd, the joint forward+backward trace). Subclass
derivatives run through ``__torch_dispatch__`` record what eager's autograd formulas do, which at small sizes costs
as much as the arithmetic: a ReLU's derivative detaches its saved result twice (16 ``detach`` calls of 78 in the
backward of a 4-layer ``TwoTensor`` MLP), and torchao's float8 backward casts the incoming gradient to float8 twice,
once for each of its two matmuls (11 operations of 106: ``abs``, ``amax``, the scale, the cast).

What happens:

* ``y = detach(x)`` is dropped and ``x`` used instead where every user of ``y`` is an operation in :data:`PURE`
  (which makes a new tensor from its inputs' values: elementwise arithmetic, comparisons, ``where``, ``matmul``,
  reductions) or another such ``detach`` (an ``unflatten_<Cls>`` whose result nothing uses does not count: dead-code
  elimination removes it next). The compiled forward and backward run under ``torch.no_grad()``, where a
  detach changes nothing that such an operation reads; a ``y`` that is returned, saved, written in place or given to
  anything else keeps its ``detach``.
* ``y = x.to(dtype)`` where ``x`` already has that dtype and device (no ``copy=True``, no memory format), which
  returns ``x`` itself at run time, is dropped and ``x`` used instead where every user of ``y`` is in :data:`PURE`
  or :data:`PURE_VIEWS` (a Hugging Face Llama's RMSNorm and rotary embedding convert float32 tensors to float32);
* in the backward part (after the first ``get_grad``), an operation in :data:`PURE` (plus the views and conversions
  in :data:`PURE_VIEWS`) with the same symbol and the same arguments as an earlier one there is dropped and the
  earlier result used: what thunder's own ``cse`` does, on a list of deterministic symbols (the plugin's aten-level
  symbols, random ones among them, and anything with an effect are never merged). Not done in a trace that writes
  in place (a merged view could then see another's write).

Out: the trace without them (the same values: each removed result is the value of what replaces it).
"""

from __future__ import annotations

import thunder.core.prims as prims
import thunder.torch as ltorch
import torch
from thunder.core.proxies import Proxy, TensorProxy, variableify

from thunder_subclass.frontend.subclass_symbols import is_unflatten_bsym

__all__ = ["remove_redundant", "PURE", "PURE_VIEWS"]


def _ids(*names) -> frozenset:
    return frozenset(getattr(ltorch, n).id for n in names if hasattr(ltorch, n))


PURE = _ids("le", "lt", "gt", "ge", "eq", "ne", "where", "mul", "add", "sub", "true_divide", "div", "neg", "matmul",
            "sum", "abs", "amax", "amin", "mean", "relu", "exp", "log", "sigmoid", "tanh", "clamp", "reciprocal", "pow",
            "sqrt", "rsqrt")
"""Symbols whose result is a new tensor computed from their inputs' values alone."""

PURE_VIEWS = _ids("to", "reshape", "permute", "contiguous", "t", "transpose", "expand", "unsqueeze")
"""Deterministic symbols whose result may be a view of (or be) their input: merged only in the backward part, and
only in a trace without in-place writes."""

_DETACH = ltorch.detach.id
_TO = ltorch.to.id
_IN_PLACE = frozenset(getattr(prims.PrimIDs, n) for n in ("COPY_", "COPY_WITH_SETITEM", "UPDATE_ALIASES",
                                                          "INDEX_COPY") if hasattr(prims.PrimIDs, n))


def _writes_in_place(bsyms) -> bool:
    """Whether a symbol of ``bsyms`` writes into a tensor: thunder's copy prims, a symbol tagged ``IN_PLACE`` (thunder's
    in-place torch symbols, the plugin's aten symbols of mutable ops), a name in thunder's in-place style."""
    return any(b.sym.id in _IN_PLACE or prims.OpTags.IN_PLACE in (b.sym.tags or ())
               or b.sym.name.endswith("_") and not b.sym.name.startswith("_") for b in bsyms)


def _removable_detaches(bsyms: list) -> set[int]:
    """Indices of ``detach`` symbols whose results only :data:`PURE` symbols (or such detaches) use, and of
    conversions that return their input whose results only those and :data:`PURE_VIEWS` use."""
    users: dict[str, list[int]] = {}
    used: set[str] = set()
    for i in range(len(bsyms) - 1, -1, -1):
        b = bsyms[i]
        # an unflatten whose result nothing uses builds an object dead-code elimination removes next: not a user
        if is_unflatten_bsym(b) and not any(o.name in used for o in b.flat_proxy_outs):
            continue
        for p in b.flat_proxy_args:
            users.setdefault(p.name, []).append(i)
            used.add(p.name)
    removable: set[int] = set()
    for i in range(len(bsyms) - 1, -1, -1):  # from the end: a detach used by a removable detach qualifies too
        b = bsyms[i]
        if b.sym.id == _DETACH:
            if len(b.flat_proxy_outs) != 1 or not b.args or not isinstance(b.args[0], Proxy):
                continue
            readers = PURE
        elif _returns_its_input(b):
            readers = PURE | PURE_VIEWS  # the same object at run time: its views are the input's
        else:
            continue
        uses = users.get(b.flat_proxy_outs[0].name, [])
        if uses and all(bsyms[j].sym.id in readers or j in removable for j in uses):
            removable.add(i)
    return removable


def _returns_its_input(b) -> bool:
    """``b`` is ``Tensor.to`` to the dtype and device its input already has, without ``copy=True`` or a memory
    format: PyTorch returns the input itself."""
    if b.sym.id != _TO or len(b.flat_proxy_outs) != 1 or not b.args or not isinstance(b.args[0], TensorProxy):
        return False
    a, out = b.args[0], b.flat_proxy_outs[0]
    if b.kwargs.get("copy", False) or b.kwargs.get("memory_format") not in (None, torch.preserve_format):
        return False
    if any(isinstance(v, TensorProxy) for v in (*b.args[1:], *b.kwargs.values())):  # to(other): by its metadata
        return False
    return (isinstance(out, TensorProxy) and out.dtype == a.dtype and out.device == a.device
            and tuple(out.shape) == tuple(a.shape))


def remove_redundant(bsyms: list) -> list:
    """``bsyms`` (a flattened trace's top level) without the redundant operations of the module docstring;
    ``bsyms`` itself when there are none."""
    detaches = _removable_detaches(bsyms) if any(b.sym.id in (_DETACH, _TO) for b in bsyms) else set()
    backward_from = next((i for i, b in enumerate(bsyms) if b.sym.id == prims.PrimIDs.GET_GRAD), None)
    in_place = backward_from is not None and _writes_in_place(bsyms)
    if not detaches and (backward_from is None or in_place):
        return bsyms
    swap: dict = {}
    seen: dict = {}
    out: list = []
    changed = False
    for i, b in enumerate(bsyms):
        if i in detaches:
            src = b.args[0]
            swap[variableify(b.flat_proxy_outs[0])] = swap.get(variableify(src), src)
            changed = True
            continue
        if swap:
            b = b.from_bsym_swap_proxies(swap, skip_output=True)
        if (backward_from is not None and i > backward_from and not in_place
                and (b.sym.id in PURE or b.sym.id in PURE_VIEWS) and len(b.flat_proxy_outs) == 1):
            try:
                key = b.rhs
                prior = seen.get(key)
            except TypeError:  # an unhashable argument: not merged
                key, prior = None, None
            if prior is not None:
                swap[variableify(b.flat_proxy_outs[0])] = prior
                changed = True
                continue
            if key is not None:
                seen[key] = b.flat_proxy_outs[0]
        out.append(b)
    return out if changed else bsyms
