"""Stage 6 (flatten and executors), int8 weight-only linears: the dequantize-and-multiply chain of an int8 weight with
per-output-channel scales claimed for one aten kernel, ``torch._weight_int8pack_mm``.

In: a flattened trace (:func:`thunder_subclass.transforms.flatten.flatten_subclasses` has just run), where an int8
weight-only linear is a chain of torch symbols on the weight's inner tensors, in one of two forms:

* scale the weight (a subclass that dequantizes in ``__torch_dispatch__``, as ``Int8Weight`` in the demo)::

      w = qdata.to(D); w = w * scale[:, None]; y = x @ w.T          # scale: (N,) unsqueezed, or (N, 1)

* scale the output (torchao's ``Int8Tensor`` weight-only linear)::

      y = x @ qdata.T.to(D); y = y * scale.reshape(N)              # scale: (N,) or (N, 1)

What happens: each chain whose static preconditions hold is replaced by one ``int8_weight_only_linear(x, qdata,
scale, scale_on)`` of the plugin's executor, its subsymbols the chain; the others are left alone. The static
preconditions (what ``_weight_int8pack_mm`` needs and where it is faster than the chain, measured on CPU):
``x`` 2-D ``(M, K)`` bfloat16 on the CPU, ``qdata`` int8 ``(N, K)``, the scale ``(N,)`` or ``(N, 1)`` bfloat16 (one
per output channel), and every intermediate of the chain used by nothing else (not saved for backward, not
returned). float16 and float32 activations are not claimed: the kernel's CPU paths for them are scalar loops,
slower than the chain beyond toy sizes (float32, 8 x 64 x 128: 116 us against 12 us). At run time the implementation
calls the kernel only when ``1 <= M <= MAX_ROWS`` (decode-sized: the kernel's time grows with M, the chain's mostly
with the weight's size; on this machine the kernel wins up to M = 8 and loses from M = 16 at 1024 x 1024) and
the layouts are the kernel's (``qdata`` and the scale contiguous: with a strided scale the kernel returns wrong values
without an error; ``x`` contiguous in its last dimension); otherwise it runs the chain as recorded, the same torch
operations in the same order (results identical to the unclaimed trace).

Numerics: the kernel accumulates in float32 and scales the result, where the chain rounds the dequantized weight
(weight form) or the product (output form) to bfloat16 first: the results differ by bfloat16 rounding (relative
error about 3e-3 against a float64 reference for both), the tolerance torchao's own int8 weight-only tests allow.

Out: the trace with the claimed chains replaced. Setting :data:`MAX_ROWS` to 0 makes every claimed linear run its
chain (read at run time, so that entries loaded from the disk cache follow it too): how the benchmarks compare the
two in one process.
"""

from __future__ import annotations

import thunder.core.prims as prims
import thunder.torch as ltorch
import torch
from thunder.core import dtypes
from thunder.core.proxies import TensorProxy

from thunder_subclass._thunder_internals import has_int8_weight_only_mm, int8_weight_only_mm
from thunder_subclass.executor import register_symbol

__all__ = ["claim_int8_weight_linears", "int8_weight_only_linear", "MAX_ROWS"]

MAX_ROWS = 8
"""Rows of ``x`` (``M``) up to which the kernel runs; above, the chain. Read at run time (0: always the chain)."""


def int8_weight_only_linear_impl(x, qdata, scale, scale_on: str):
    """``x @ dequantize(qdata, scale).T``: ``torch._weight_int8pack_mm`` where its run-time preconditions hold,
    else the recorded chain (``scale_on`` says which of the two forms)."""
    m = x.shape[0]
    if 0 < m <= MAX_ROWS and x.stride(1) == 1 and qdata.is_contiguous() and scale.is_contiguous():
        return int8_weight_only_mm(x, qdata, scale.reshape(-1))
    n = qdata.shape[0]
    if scale_on == "weight":
        return torch.matmul(x, torch.permute(torch.mul(qdata.to(dtype=x.dtype), scale.reshape(n, 1)), (1, 0)))
    return torch.mul(torch.matmul(x, torch.permute(qdata, (1, 0)).to(dtype=x.dtype)), scale.reshape(n))


def _meta(x, qdata, scale, scale_on: str):
    return TensorProxy(like=x, shape=(x.shape[0], qdata.shape[0]))


int8_weight_only_linear = register_symbol("int8_weight_only_linear", meta=_meta, fn=int8_weight_only_linear_impl)

_TRANSPOSES = (ltorch.permute.id, ltorch.transpose.id, ltorch.t.id, prims.transpose.id)
_CONVERTS = (ltorch.to.id, prims.convert_element_type.id)
_SCALE_VIEWS = (ltorch.unsqueeze.id, ltorch.reshape.id, ltorch.view.id)


def _is_tensor(p) -> bool:
    return isinstance(p, TensorProxy) and p.device.type == "cpu"


def _torch_dtype(p):
    return dtypes.to_torch_dtype(p.dtype)


def _static_shape(p) -> tuple | None:
    """``p``'s shape if every size is a number known now (not a symbolic size)."""
    shape = tuple(p.shape)
    return shape if all(type(d) is int for d in shape) else None


class _Chains:
    """The trace's producers and use counts, and the matching of the two forms."""

    def __init__(self, bsyms: list):
        self.producer: dict[str, int] = {}
        self.uses: dict[str, int] = {}
        for i, b in enumerate(bsyms):
            for p in b.flat_proxy_args:
                self.uses[p.name] = self.uses.get(p.name, 0) + 1
            for o in b.flat_proxy_outs:
                self.producer.setdefault(o.name, i)
        self.bsyms = bsyms

    def single_use_producer(self, p, ids: tuple):
        """The index of the symbol (one of ``ids``) that made ``p``, if ``p`` is a tensor used only once."""
        if not _is_tensor(p) or self.uses.get(p.name) != 1:
            return None
        i = self.producer.get(p.name)
        if i is None or self.bsyms[i].sym.id not in ids or len(self.bsyms[i].flat_proxy_outs) != 1:
            return None
        return i

    def swaps_2d(self, i: int):
        """The input of a 2-D transpose at ``i`` (``permute(a, (1, 0))``, ``transpose(a, 0, 1)``, ``t(a)``,
        ``prims.transpose(a, (1, 0))`` as ``a.T`` records it)."""
        b = self.bsyms[i]
        a = b.args[0] if b.args else None
        if not _is_tensor(a) or a.ndim != 2 or b.kwargs:
            return None
        rest = tuple(tuple(r) if isinstance(r, list) else r for r in b.args[1:])
        if b.sym.id == ltorch.transpose.id:
            return a if rest in ((0, 1), (1, 0), (-1, -2), (-2, -1), (0, -1), (-1, 0)) else None
        if b.sym.id == ltorch.t.id:
            return a if rest == () else None
        return a if rest in (((1, 0),), (1, 0)) else None  # permute, prims.transpose

    def int8_convert(self, p, dtype):
        """``(index, qdata)`` if ``p`` (used once) is ``qdata`` (int8, on the CPU) converted to ``dtype``."""
        i = self.single_use_producer(p, _CONVERTS)
        if i is None:
            return None
        q = self.bsyms[i].args[0]
        if not _is_tensor(q) or _torch_dtype(q) is not torch.int8 or q.ndim != 2 or _static_shape(q) is None:
            return None
        if _torch_dtype(p) is not dtype or p.device != q.device or tuple(p.shape) != tuple(q.shape):
            return None
        return i, q

    def scale_of(self, p, n: int, shape: tuple):
        """``(indices to remove, scale)`` for a per-output-channel scale operand ``p`` of shape ``shape``: ``p``
        itself, or the ``(N,)``/``(N, 1)`` tensor it is a single-use view of."""
        if not _is_tensor(p) or _static_shape(p) != shape:
            return None
        i = self.single_use_producer(p, _SCALE_VIEWS)
        if i is not None:
            src = self.bsyms[i].args[0]
            if _is_tensor(src) and _static_shape(src) in ((n,), (n, 1)) and src.dtype == p.dtype:
                return [i], src
        return [], p


def _activations_ok(x, k: int, *others) -> bool:
    """``x`` a 2-D ``(M, K)`` bfloat16 CPU tensor (M may be symbolic), ``others`` all of its dtype."""
    return (_is_tensor(x) and x.ndim == 2 and type(x.shape[1]) is int and x.shape[1] == k
            and _torch_dtype(x) is torch.bfloat16 and all(_torch_dtype(o) is torch.bfloat16 for o in others))


def _weight_form(c: _Chains, i: int):
    """``y = matmul(x, transpose(mul(convert(q), scale_col)))`` at ``i``: (removed indices, x, q, scale)."""
    b = c.bsyms[i]
    if len(b.args) != 2 or b.kwargs:
        return None
    x, wt = b.args
    ti = c.single_use_producer(wt, _TRANSPOSES)
    if ti is None or (wd := c.swaps_2d(ti)) is None:
        return None
    mi = c.single_use_producer(wd, (ltorch.mul.id,))
    if mi is None or len(c.bsyms[mi].args) != 2 or c.bsyms[mi].kwargs:
        return None
    if _static_shape(wd) is None:
        return None
    n, k = wd.shape
    y = b.flat_proxy_outs[0]
    for conv, col in (c.bsyms[mi].args, reversed(c.bsyms[mi].args)):
        found = c.int8_convert(conv, _torch_dtype(wd))
        scale = c.scale_of(col, n, (n, 1))
        if found is None or scale is None:
            continue
        ci, q = found
        if not _activations_ok(x, k, wd, scale[1], y):
            return None
        return [ci, *scale[0], mi, ti], x, q, scale[1]
    return None


def _output_form(c: _Chains, i: int):
    """``y = mul(matmul(x, convert(transpose(q))), scale_row)`` at ``i``: (removed indices, x, q, scale)."""
    b = c.bsyms[i]
    if len(b.args) != 2 or b.kwargs:
        return None
    y = b.flat_proxy_outs[0]
    for prod, row in (b.args, tuple(reversed(b.args))):
        mm = c.single_use_producer(prod, (ltorch.matmul.id,))
        if mm is None or len(c.bsyms[mm].args) != 2 or c.bsyms[mm].kwargs:
            continue
        x, qf = c.bsyms[mm].args
        if not _is_tensor(qf) or qf.ndim != 2:
            continue
        found = c.int8_convert(qf, _torch_dtype(qf))
        if found is None:
            continue
        ci, qt = found
        ti = c.single_use_producer(qt, _TRANSPOSES)
        if ti is None or (q := c.swaps_2d(ti)) is None or _static_shape(q) is None:
            continue
        n, k = q.shape
        scale = c.scale_of(row, n, (n,))
        if scale is None or not _activations_ok(x, k, qf, prod, scale[1], y):
            continue
        return [ti, ci, mm, *scale[0]], x, q, scale[1]
    return None


def claim_int8_weight_linears(bsyms: list) -> list:
    """``bsyms`` (a flattened trace's top level) with each int8 weight-only linear chain whose static
    preconditions hold replaced by one ``int8_weight_only_linear`` (see the module docstring); ``bsyms`` itself
    when there is none."""
    if not any(b.sym.id == ltorch.matmul.id for b in bsyms) or not has_int8_weight_only_mm():
        return bsyms
    c = _Chains(bsyms)
    removed: set[int] = set()
    replaced: dict[int, object] = {}
    for i, b in enumerate(bsyms):
        if b.sym.id == ltorch.matmul.id:
            found, scale_on = _weight_form(c, i), "weight"
        elif b.sym.id == ltorch.mul.id:
            found, scale_on = _output_form(c, i), "output"
        else:
            continue
        if found is None or i in removed or removed.intersection(found[0]) or replaced.keys() & set(found[0]):
            continue
        drop, x, q, scale = found
        removed.update(drop)
        chain = [bsyms[j] for j in sorted(drop)] + [b]
        replaced[i] = int8_weight_only_linear.bind(x, q, scale, scale_on, output=b.flat_proxy_outs[0],
                                                   subsymbols=chain)
    if not replaced:
        return bsyms
    return [replaced.get(i, b) for i, b in enumerate(bsyms) if i not in removed]
