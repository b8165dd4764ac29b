"""Executor helpers: thunder's torch_compile executor and the plugin's inductor regions.

* ``executors/torch_compile.py`` ``torch_compile_ex`` (registration, not a hook) — the plugin's generic aten-level
  symbols are declared supported by thunder's torch_compile executor while the hooks are installed
  (:func:`allow_torch_compile_fusion`), so its fusion regions are not cut at ops without a thunder equivalent.
* inductor without dynamo (``thunder_subclass.inductor_executor``): a fusion region's bound symbols as a Python
  function run by thunder's torch executor (:func:`region_callable`, as thunder's ``make_compiled`` builds it) and
  compiled by ``make_fx`` + ``torch._inductor.compile_fx.compile_fx_inner`` (:func:`compile_with_inductor`).
* ``torch._weight_int8pack_mm`` (a private aten op, the CPU kernel inductor's weight-only int8 pattern lowers to):
  :func:`int8_weight_only_mm` for ``thunder_subclass.transforms.int8_linear``, :func:`has_int8_weight_only_mm`
  whether this torch has it (every supported torch does; if one did not, nothing is claimed for it).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from thunder_subclass._thunder_internals import plugin_state

# symbol id -> (symbol, execution transform or None): may be put in torch_compile fusion regions
_torch_compile_fusible: dict[Any, tuple[Any, Any]] = {}


def allow_torch_compile_fusion(sym, execution_transform=None) -> None:
    """Let thunder's torch_compile executor put ``sym`` in its fusion regions. For the plugin's generic aten-level
    symbols (``aten__scaled_mm_default``: run by their ``OpOverload``, which ``torch.compile`` traces), so that an op
    without a thunder equivalent does not cut a region in two. It changes a shared thunder object (the
    ``torch_compile_ex`` executor, through its public ``FusionExecutor.register_supported``): done only while the
    hooks are installed, and undone by :func:`uninstall`. Other jits are unaffected: the symbols occur only in
    traces made by the plugin. With ``execution_transform``, the executor records that instead of ``sym`` (e.g.
    a call of an opaque custom-op wrapper, for ops whose inductor lowering would not keep their input layouts)."""
    _torch_compile_fusible[sym.id] = (sym, execution_transform)
    if plugin_state.hooks_installed:
        register_torch_compile_fusible({sym.id: (sym, execution_transform)})


def _torch_compile_executor():
    try:
        from thunder.executors.torch_compile import torch_compile_ex
    except Exception:  # torch_compile executor unavailable: nothing to register
        return None
    return torch_compile_ex


def register_torch_compile_fusible(entries: dict | None = None) -> None:
    """Register ``entries`` (default: every symbol allowed so far, as :func:`install` does)."""
    ex = _torch_compile_executor()
    if ex is None:
        return
    for sym_id, (sym, execution_transform) in (_torch_compile_fusible if entries is None else entries).items():
        if sym_id not in ex.implmap:
            ex.register_supported(sym, execution_transform=execution_transform)


def unregister_torch_compile_fusible() -> None:
    ex = _torch_compile_executor()
    if ex is None:
        return
    for sym_id in _torch_compile_fusible:
        ex.implmap.pop(sym_id, None)


def torch_compile_fusible_symbols() -> dict[Any, tuple[Any, Any]]:
    """Every symbol allowed in torch_compile regions so far (:func:`allow_torch_compile_fusion`): symbol id ->
    (symbol, execution transform or None), read-only. The plugin's own inductor executor claims the same ones."""
    return types.MappingProxyType(_torch_compile_fusible)


def region_callable(bsyms, inputs, outputs, name: str, *, transform: Callable | None = None,
                    executors: tuple = ()) -> Callable:
    """A Python function ``name(*inputs) -> list(outputs)`` running a fusion region's bound symbols with thunder's
    torch executor. thunder 0.2.6 has no public API for this: its torch_compile executor builds the same kind of
    function in ``executors/torch_compile.py`` ``make_compiled`` (a ``TraceCtx`` whose arguments are unpacked
    trivially, the region's symbols, a return; lowered by ``transform_for_execution`` with the torch executor) and
    hands it to ``torch.compile``; here it is made for inductor alone (``compile_with_inductor``). ``transform``
    (a function of the trace) runs before lowering, and ``executors`` are tried before thunder's torch executor and
    its Python executor (for operations on Python numbers): how :mod:`thunder_subclass.runtime.speculation` compiles the
    operations a speculated value depends on (the flatten pass, then the plugin's executor)."""
    from thunder.core import prims
    from thunder.core.codeutils import SigInfo
    from thunder.core.trace import TraceCtx, tracectx
    from thunder.executors.passes import transform_for_execution
    from thunder.executors.torchex import ex as torch_ex

    trace = TraceCtx(None)
    trace.args, trace.kwargs = list(inputs), {}
    for p in inputs:
        trace.add_name(p.name)
    with tracectx(trace):
        for p in inputs:
            prims.unpack_trivial(p, name=p.name)
    trace.bound_symbols.extend(bsyms)
    trace.bound_symbols.append(prims.python_return.bind(list(outputs), output=None))
    for bsym in bsyms:  # names made inside the region are taken, so that lowering makes no clashing proxy
        for b in (bsym, *bsym.subsymbols):
            for o in b.flat_outs:
                if o is not None and hasattr(o, "name") and o.name not in trace.names:
                    trace.add_name(o.name)
    trace._siginfo = SigInfo(name)
    trace._siginfo.args = [(p.name, None) for p in inputs]
    if transform is not None:
        trace = transform(trace)
    if executors:
        from thunder.executors.pythonex import ex as python_ex

        lowered = transform_for_execution(trace, executors_list=(*executors, torch_ex, python_ex))
    else:
        lowered = transform_for_execution(trace, executors_list=(torch_ex,))
    return lowered.python_callable(include_decorators=False)


def compile_with_inductor(fn: Callable, example_inputs: list) -> Callable:
    """``fn`` (tensors in, a list of tensors out; functional) compiled by inductor without dynamo: traced to an aten
    fx graph by ``make_fx`` (fake tensors with the example inputs' metadata, inductor's decompositions) and compiled
    by ``torch._inductor.compile_fx.compile_fx_inner`` (torch internal, torch 2.13). The result takes one list of
    inputs (inductor's boxed convention: the list is emptied) and returns a tuple. The compiled code checks that
    each input's sizes and strides are the example's (``assert_size_stride``, AssertionError otherwise)."""
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    with torch.no_grad():
        graph = make_fx(fn, decomposition_table=select_decomp_table(), tracing_mode="fake")(*example_inputs)
        return compile_fx_inner(graph, list(example_inputs))


def has_int8_weight_only_mm() -> bool:
    """Whether this torch has ``torch._weight_int8pack_mm``."""
    return callable(getattr(torch, "_weight_int8pack_mm", None))


def int8_weight_only_mm(x, qdata, scales):
    """``x @ (qdata * scales[:, None]).T`` for a 2-D ``x``, int8 ``qdata`` ``(N, K)`` and 1-D ``scales`` ``(N,)`` of
    ``x``'s dtype, by ``torch._weight_int8pack_mm`` (private aten op; the caller checks its preconditions: ``x``
    contiguous in its last dimension, ``qdata`` and ``scales`` contiguous)."""
    return torch._weight_int8pack_mm(x, qdata, scales)
