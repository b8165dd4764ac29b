"""Stage 4 (interpretation), in-place writes into tensors that share memory, with gradients: a graph break (plain
tensors).

In: a torch-level in-place symbol about to be recorded (``copy_``, ``add_``, ``zero_``, ``relu_``..., a name ending in
``_`` that writes values) on plain tensor proxies. What happens: when its destination shares memory with another
tensor of the trace (it is a view: ``h[1:]``, ``h.view(-1)``, ``h.diagonal()``, or a view was taken of it) and a
tensor involved requires grad, :class:`~thunder_subclass.errors.UnsupportedAliasedWriteError` is raised. Out: a graph
break (the code runs eagerly, equal to eager), or that error with ``fullgraph=True``.

Why: thunder 0.2.6 records the write and gives every alias a new version (``prims.update_aliases``), but its autodiff
treats the new versions as unrelated to the write: measured on the landed main, ``h = x * 2; h[1:].copy_(y);
h.sin().sum()`` gave ``x`` the gradient of every row and ``y`` half of its own; ``h.diagonal().zero_()`` even changed the
forward value (1.85 where eager gives 2.07). Without gradients the writes are right and are compiled. Writes with a
subclass among the arguments are refused by ``autograd.refuse_write_through_view_with_grad`` instead (an error).
"""

from __future__ import annotations

from thunder.core.proxies import TensorProxy
from thunder.core.trace import get_tracectx

from thunder_subclass import _thunder_internals
from thunder_subclass.errors import UnsupportedAliasedWriteError, format_location

__all__ = ["NOT_VALUE_WRITES", "check_aliased_write"]

# in-place torch methods that change metadata only, or that thunder records as an out-of-place update of the base
# (``setitem_``: ``h[k] = v`` is traced as a functional index update, measured right)
NOT_VALUE_WRITES = frozenset({"transpose_", "t_", "unsqueeze_", "squeeze_", "swapdims_", "swapaxes_", "as_strided_",
                               "requires_grad_", "resize_", "detach_", "set_", "setitem_"})


def check_aliased_write(sym, leaves: list) -> None:
    """Raise :class:`UnsupportedAliasedWriteError` for the write described in the module docstring; ``leaves`` are the
    call's flattened arguments (plain tensors only: the caller checked there is no subclass)."""
    name = sym.name
    if not name.endswith("_") or name.startswith("_") or name in NOT_VALUE_WRITES:
        return
    tensors = [p for p in leaves if isinstance(p, TensorProxy)]
    if not tensors:
        return
    if not any(p.requires_grad for p in tensors) and not _thunder_internals.current_call_has_grad_inputs():
        return  # (nothing will be differentiated: inference code's in-place writes skip the walk over the trace)
    dest = tensors[0]
    trace = get_tracectx()
    if trace is None:
        return
    aliased, group = _aliases_of(trace, dest)
    if not aliased:
        return
    if not (any(p.requires_grad for p in tensors) or any(p.requires_grad for p in group)):
        return
    location = format_location(*_thunder_internals.source_location())
    raise UnsupportedAliasedWriteError(
        f"{name} at {location} writes into a tensor that shares memory with another one of the compiled code (a view "
        "such as h[1:], h.view(-1) or h.diagonal(), or a tensor a view was taken of) while gradients are computed: "
        "thunder 0.2.6's autodiff does not connect such a write to the other tensor, so values and gradients would be "
        "wrong. This code runs eagerly instead (a graph break; with fullgraph=True this error). To compile it, write "
        "out of place (h = torch.slice_scatter(h, v, dim, start), h = torch.where(mask, v, h), "
        "h = h.diagonal_scatter(...)) or take the view after the write.")


def _aliases_of(trace, dest: TensorProxy) -> tuple[bool, list]:
    """(whether ``dest`` shares memory with a tensor made or viewed by a view operation of ``trace``, the proxies it
    shares memory with). Memory is shared along view operations (input and output), ``prims.update_aliases`` (the
    versions of one tensor) and in-place operations (their destination and result)."""
    import thunder.core.prims as prims
    import thunder.torch as ltorch

    views = (*ltorch._syms_returning_views, *ltorch._syms_that_may_return_views)
    parent: dict[str, str] = {}
    proxies: dict[str, TensorProxy] = {}

    def find(n: str) -> str:
        while parent.get(n, n) != n:
            parent[n] = parent.get(parent[n], parent[n])
            n = parent[n]
        return n

    def union(a: TensorProxy, b: TensorProxy) -> None:
        proxies[a.name], proxies[b.name] = a, b
        ra, rb = find(a.name), find(b.name)
        if ra != rb:
            parent[ra] = rb

    viewed: set[str] = set()
    for scope in getattr(trace, "scopes", None) or [trace.bound_symbols]:
        for b in scope:
            if b.sym.id == prims.PrimIDs.UPDATE_ALIASES:
                (ins,) = b.args
                for i, o in zip(ins, b.flat_proxy_outs):
                    if isinstance(i, TensorProxy) and isinstance(o, TensorProxy):
                        union(i, o)
                continue
            is_view = b.sym in views
            is_write = b.sym.name.endswith("_") and b.sym.name not in NOT_VALUE_WRITES
            if not (is_view or is_write):
                continue
            src = next((a for a in b.flat_proxy_args if isinstance(a, TensorProxy)), None)
            if src is None:
                continue
            for o in b.flat_proxy_outs:
                if isinstance(o, TensorProxy):
                    union(src, o)
                    if is_view:
                        viewed.update((src.name, o.name))
    root = find(dest.name)
    group = [p for n, p in proxies.items() if find(n) == root]
    return any(p.name in viewed for p in group), group
