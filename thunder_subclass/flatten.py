"""Stage 7, the flatten transform: subclasses leave the program before executors claim operations.

In: a computation trace (after autograd, when there is one) holding subclass-level bound symbols recorded by
interpretation. Out: a trace in which each of them is replaced by its subsymbols, so inner tensors flow as plain
tensors through aten-level / thunder torch symbols that the torch, torch_compile and nvFuser executors can claim.

* ``flatten_<Cls>`` of a value whose inner tensors are already defined (an intermediate subclass built by an
  ``unflatten_<Cls>`` earlier, or a repeated flatten of an input) is dropped: only trace inputs are flattened, once.
* ``unflatten_<Cls>`` whose result nothing uses any more is removed by thunder's dead-code elimination, which runs
  right after this pass; what remains builds subclass objects only where they leave the compiled function.

Called from the ``_transform_for_operator_executor_execution`` hook in ``_thunder_internals``.
"""

from __future__ import annotations

from thunder.core.proxies import variableify
from thunder.core.pytree import tree_flatten
from thunder.core.trace import TraceProvenance, from_trace

from thunder_subclass._thunder_internals import is_torch_level_symbol
from thunder_subclass.proxy import SubclassTensorProxy
from thunder_subclass.subclass_symbols import is_flatten_bsym

__all__ = ["flatten_subclasses", "is_subclass_level"]


def is_subclass_level(bsym) -> bool:
    """A torch-level bound symbol recorded on subclass proxies (to be replaced by its subsymbols)."""
    if not is_torch_level_symbol(bsym.sym):
        return False
    return any(isinstance(p, SubclassTensorProxy) for p in (*bsym.flat_proxy_args, *bsym.flat_proxy_outs))


def flatten_subclasses(trace):
    """Replace subclass-level bound symbols by their subsymbols (see the module docstring)."""
    if not any(is_subclass_level(b) for b in trace.bound_symbols):
        return trace

    defined = {variableify(p) for p in tree_flatten((trace.args, trace.kwargs))[0] if hasattr(p, "name")}
    bsyms = []

    def visit(bsym):
        if is_subclass_level(bsym):
            for sub in bsym.subsymbols:
                visit(sub)
            return
        outs = [variableify(p) for p in bsym.flat_proxy_outs]
        if is_flatten_bsym(bsym) and outs and all(o in defined for o in outs):
            return
        bsyms.append(bsym)
        defined.update(outs)

    for bsym in trace.bound_symbols:
        visit(bsym)

    new_trace = from_trace(trace)
    new_trace.bound_symbols = bsyms
    new_trace.set_provenance(TraceProvenance("Flatten tensor subclasses (thunder_subclass)"))
    return new_trace
