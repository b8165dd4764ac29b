"""Stage 6 (flatten and executors), the plugin's inductor executor: thunder fusion regions compiled by inductor
directly, without dynamo.

In: a flattened execution trace (plain aten-level symbols and prims, as the
torch_compile executor sees it). What happens: regions are formed exactly as thunder's torch_compile executor forms
them (its ``fusion_pass``: every torch-executable symbol, and the plugin's aten-level symbols that
``_thunder_internals.allow_torch_compile_fusion`` admits, float8 ``_scaled_mm`` as its opaque custom-op wrapper);
each region becomes one callable that, at its first call, is traced to an aten fx graph and compiled by inductor
(``_thunder_internals.compile_with_inductor``). Out: the trace with one ``InductorN`` fusion symbol per region.

Why: thunder's torch_compile executor hands each region to ``torch.compile``, so every call of a region pays
dynamo's frame evaluation and guards, AOTAutograd's runtime wrappers and its own ``no_grad``/``no_autocast``
wrappers. thunder's prologue has already checked every input of the computation, so here a call of a region is
inductor's generated ``call`` and little else. What dynamo's guards would add is kept: inputs whose layouts
(strides) differ from the compiled ones fail inductor's own size/stride assertions before any result is returned,
and a variant is compiled for the new layouts. A region with a non-tensor input or output (a number computed at run
time) is left to ``torch.compile`` (thunder's torch_compile region), whose guards cover values.

Use it like any thunder executor::

    >>> import torch, thunder_subclass
    >>> from torch.testing._internal.two_tensor import TwoTensor
    >>> f = thunder_subclass.jit(lambda t: (t * 2).relu().sum(), executors=[thunder_subclass.inductor_ex])
    >>> y = f(TwoTensor(torch.ones(3), -torch.ones(3)))
    >>> type(y).__name__, y.a.item(), y.b.item()
    ('TwoTensor', 6.0, 0.0)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from thunder.core.proxies import TensorProxy, unvariableify
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.executors.torch_compile import TorchCompileExecutor
from thunder.executors.torchex import ex as torch_ex
from thunder.extend import ImplInfo

from thunder_subclass._thunder_internals import compile_with_inductor, region_callable, torch_compile_fusible_symbols

__all__ = ["InductorExecutor", "InductorRegion", "inductor_ex"]


def _is_in_place(sym_id: Any) -> bool:
    # prims that write to an input or an alias (thunder's functionalized traces keep these): they stay with the torch
    # executor, so that a region is a pure function of its inputs (re-running it after a layout check is harmless)
    return getattr(sym_id, "name", None) in ("COPY_", "COPY_WITH_SETITEM", "UPDATE_ALIASES", "INDEX_COPY")


class InductorRegion:
    """One fusion region's callable: ``region(*tensors) -> tuple of tensors``.

    ``fn`` is the region as a Python function of the torch executor. Compiled at the first call for that call's
    input layouts; a later call whose inputs have other strides fails inductor's ``assert_size_stride`` check
    (raised before the region returns), and runs a variant compiled for its layouts (one per distinct layout)."""

    __slots__ = ("name", "fn", "compiled", "variants")

    def __init__(self, name: str, fn: Callable):
        self.name, self.fn = name, fn
        self.compiled: Callable | None = None  # the generated code of the variant called last
        self.variants: dict[tuple, Callable] = {}  # input layouts -> that variant's generated code

    def __call__(self, *args):
        compiled = self.compiled
        if compiled is not None:
            try:
                return compiled(list(args))
            except AssertionError:
                layouts = self.layouts(args)
                if self.variants.get(layouts) is compiled:  # not a layout mismatch: the region's own error
                    raise
        else:
            layouts = self.layouts(args)
        compiled = self.variants.get(layouts)
        if compiled is not None:
            self.compiled = compiled
            return compiled(list(args))
        graph = compile_with_inductor(self.fn, list(args))
        result = graph(list(args))  # the first call through inductor's wrapper (it ends compile-time bookkeeping)
        # later calls go to the generated code itself: CompiledFxGraph.__call__ adds only debug recording,
        # autotune-cache bundling (GPU, first call) and runtime metrics around it
        self.compiled = self.variants[layouts] = graph.current_callable
        return result

    @staticmethod
    def layouts(args) -> tuple:
        return tuple((tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else type(a)
                     for a in args)

    def __repr__(self) -> str:
        return f"InductorRegion({self.name}, {len(self.variants)} compiled layout(s))"


class InductorExecutor(TorchCompileExecutor):
    """Fusion executor: thunder's torch_compile regions, each compiled by inductor without dynamo
    (see the module docstring). Claims what thunder's ``torch_compile_ex`` claims (every operation of the torch
    executor but in-place prims) and the plugin's aten-level symbols allowed in torch_compile regions."""

    def __init__(self, name: str = "thunder_subclass_inductor"):
        super().__init__(name)
        self._implmap = {op: ImplInfo() for op in torch_ex.implmap if not _is_in_place(op)}
        self._plugin_symbols_seen = 0

    @property
    def implmap(self) -> dict:
        fusible = torch_compile_fusible_symbols()
        if len(fusible) != self._plugin_symbols_seen:  # symbols are registered lazily, as traces need them
            for sym_id, (_, execution_transform) in fusible.items():
                self._implmap.setdefault(sym_id, ImplInfo(execution_transform=execution_transform))
            self._plugin_symbols_seen = len(fusible)
        return self._implmap

    def fuse(self, region, fusion_counter: int) -> BoundSymbol:
        inputs = [unvariableify(x) for x in region.inputs]
        outputs = [unvariableify(x) for x in region.outputs]
        if not all(isinstance(p, TensorProxy) for p in (*inputs, *outputs)):
            return super().fuse(region, fusion_counter)
        name = f"Inductor{fusion_counter}"
        compiled = InductorRegion(name, region_callable(region.bound_symbols, inputs, outputs, name))
        fusion_sym = Symbol(name, meta=None, is_fusion=True, executor=self)
        return BoundSymbol(fusion_sym, inputs, {}, outputs, region.bound_symbols, _call_ctx={name: compiled})


inductor_ex = InductorExecutor()
