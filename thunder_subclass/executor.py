"""The plugin's operator executor: the home of every symbol thunder_subclass puts in traces.

Stage: used by all stages. Holds (a) the aten-level symbols made from ``torch._ops.OpOverload`` (run by the op itself,
i.e. eagerly by torch), (b) the per-subclass ``flatten_<Cls>`` / ``unflatten_<Cls>`` symbols that cross between a
subclass object and its inner tensors, (c) the prologue guard ``check_subclass``. Symbols are registered lazily, the
first time a trace needs them, into this executor. One exception, made while the hooks are installed and undone by
``uninstall``: generic aten-level symbols are also declared fusible to thunder's torch_compile executor
(``_thunder_internals.allow_torch_compile_fusion``).

Its presence in a jit's executor list is also what switches thunder_subclass's hooks on for that jit.
"""

from __future__ import annotations

from collections.abc import Callable

from thunder.core.symbol import Symbol
from thunder.extend import OperatorExecutor

__all__ = ["subclass_executor", "unique_operator_name", "register_constant_symbol"]

subclass_executor = OperatorExecutor("thunder_subclass")


def unique_operator_name(base: str) -> str:
    """``base`` made a valid identifier, not yet used by this executor."""
    name = "".join(c if c.isalnum() else "_" for c in base)
    candidate, i = name, 1
    while candidate in subclass_executor.opmap:
        i += 1
        candidate = f"{name}_{i}"
    return candidate


def register_constant_symbol(sym: Symbol) -> Symbol:
    """Make one of the plugin's boundary symbols (``flatten_*``, ``unflatten_*``, ``aten_*``) a constant for
    thunder's autodiff where it appears outside a subclass-level symbol, as in eager: reading ``x.a`` or building
    ``TwoTensor(a, b)`` does not connect inner tensors and outer tensor in the autograd graph. The rule goes in
    thunder's grad-rule table for the symbol's id (``thunder.core.transforms.register_grad``)."""
    from thunder.core.transforms import register_grad

    def forward_only(*args, **kwargs):
        return sym(*args, **kwargs)

    register_grad(sym, forward_only)
    return sym


def register_symbol(name: str, meta: Callable, fn: Callable, *, tags=None) -> Symbol:
    """A new operator of the plugin's executor under a unique name derived from ``name``, constant for autodiff."""
    sym = subclass_executor.register_operator(unique_operator_name(name), meta=meta, fn=fn, tags=tags)
    return register_constant_symbol(sym)
