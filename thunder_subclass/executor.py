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

from thunder.extend import OperatorExecutor

subclass_executor = OperatorExecutor("thunder_subclass")


def unique_operator_name(base: str) -> str:
    """``base`` made a valid identifier, not yet used by this executor."""
    name = "".join(c if c.isalnum() else "_" for c in base)
    candidate, i = name, 1
    while candidate in subclass_executor.opmap:
        i += 1
        candidate = f"{name}_{i}"
    return candidate
