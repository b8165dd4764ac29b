"""Stage 6 (flatten and executors), the flatten transform: subclasses leave the program before executors claim
operations.

In: a computation trace — after autograd, the joint forward+backward trace — holding subclass-level bound symbols
recorded by interpretation and by the grad rules (``thunder_subclass.transforms.autograd``). Out: a trace in which each
of them is replaced by its subsymbols, so inner tensors flow as plain tensors through aten-level / thunder torch symbols
that the torch, torch_compile and nvFuser executors can claim. What happens: one forward sweep with a substitution map:

* subclass-level symbols (torch-level symbols unrolled on subclass proxies, ``grad_<op>``, autograd.Function
  calls) are inlined, recursively;
* ``flatten_<Cls>(x)`` of a value built earlier by ``unflatten_<Cls>``, or flattened before, is dropped and its
  outputs replaced by the inner tensors already at hand: only trace inputs (and incoming gradients) are flattened,
  once; what is saved for backward is then inner tensors;
* gradients whose type differs from the one guessed when the backward was recorded (a plain parameter meeting a
  ``TwoTensor`` gets a ``TwoTensor`` gradient) are propagated: ``grad_<op>`` is re-recorded for the actual gradient
  types, and torch-level symbols whose argument kinds changed are traced again (through ``__torch_dispatch__`` when
  they now see a subclass);
* ``unflatten_<Cls>`` whose result nothing uses any more is removed by thunder's dead-code elimination, which runs
  right after this pass: subclass objects are built only where they leave the compiled function;
* under symbolic sizes, a size number that an inlined symbol names and nothing defines at the top level (it was
  defined inside a torch symbol's decomposition) gets a ``tensor_sizes`` of a tensor that has it, before its use;
* detaches that change nothing and pure operations the backward computes twice are removed
  (``thunder_subclass.transforms.redundant``); int8 weight-only linears (an int8 weight dequantized with per-channel
  scales, then a matmul) are claimed for one aten kernel where its preconditions hold
  (``thunder_subclass.transforms.int8_linear``).

Called from the ``_transform_for_operator_executor_execution`` hook in ``_thunder_internals``, i.e. after
``grad_transform_on_trace`` and before executors claim operations, for the forward and backward alike (they are one
joint trace at that point in thunder 0.2.6).
"""

from __future__ import annotations

from typing import Any

import thunder.core.prims as prims
from thunder.core.proxies import NumberProxy, Proxy, TensorProxy, variableify
from thunder.core.pytree import tree_flatten
from thunder.core.trace import TraceProvenance, from_trace, tracectx

from thunder_subclass._thunder_internals import is_torch_level_symbol, new_trace, size_computation
from thunder_subclass.transforms.int8_linear import claim_int8_weight_linears
from thunder_subclass.transforms.redundant import remove_redundant
from thunder_subclass.transforms.autograd import (
    grad_recipe_of,
    is_container_bsym,
    is_grad_bsym,
    record_backward,
    record_container_again,
)
from thunder_subclass.errors import UnsupportedSubclassOperationError
from thunder_subclass.executor import subclass_executor
from thunder_subclass.frontend.proxy import OpaqueObjectProxy, SubclassTensorProxy, proxy_kind
from thunder_subclass.frontend.recording import record_call, recorded_argument_kinds, subclass_names, traced_grad_mode
from thunder_subclass.rules import call_rule, find_implementation
from thunder_subclass.frontend.subclass_symbols import cotangent_flatten_symbol, ctx_arg, is_flatten_bsym, is_unflatten_bsym

__all__ = ["Flattener", "flatten_subclasses", "is_subclass_level", "needs_flattening"]


def _has_subclass(bsym) -> bool:
    return any(isinstance(p, SubclassTensorProxy) for p in (*bsym.flat_proxy_args, *bsym.flat_proxy_outs))


def is_subclass_level(bsym) -> bool:
    """A bound symbol to be replaced by its subsymbols: a torch-level symbol on subclass proxies, a ``grad_<op>``
    or an autograd.Function call recorded by thunder_subclass."""
    if is_grad_bsym(bsym) or is_container_bsym(bsym):
        return True
    return is_torch_level_symbol(bsym.sym) and _has_subclass(bsym)


def _is_unrolled(bsym) -> bool:
    # recorded by interpretation: its first-level subsymbols cross between subclasses and inner tensors
    return any(is_flatten_bsym(s) or is_unflatten_bsym(s) for s in bsym.subsymbols)


def _kinds(proxies) -> tuple:
    return tuple(proxy_kind(p) for p in proxies)


class Flattener:
    """One forward sweep over a trace's bound symbols (:meth:`visit`), collecting the flat program in ``bsyms``;
    ``swap`` maps replaced proxies to their replacements (:meth:`alias`)."""

    def __init__(self, trace):
        self.trace = from_trace(trace)
        self.bsyms: list = []
        self.swap: dict = {}
        self.inner_of: dict = {}  # variable of a subclass proxy -> its inner proxies (from unflatten / flatten)
        self.cotangents: set = set()  # variables of gradients arriving from outside (get_grad of an output)
        self.recipes: dict = {}  # id(GradRecipe) -> the recipe of its forward recorded again (_retrace)

    def alias(self, old, new) -> None:
        # opaque inner objects too: a dropped re-flatten's device_mesh output becomes the mesh already at hand
        if isinstance(old, (TensorProxy, OpaqueObjectProxy)) and old is not new:
            self.swap[variableify(old)] = new

    def swapped(self, bsym):
        return bsym.from_bsym_swap_proxies(self.swap) if self.swap else bsym

    def visit(self, bsym, parent=None) -> None:
        nb = self.swapped(bsym)
        # what was recorded for a symbol is kept on its output, by symbol: a subsymbol that is the same symbol with the
        # same output as its parent (the thunder equivalent of the parent's last aten call: F.linear on a subclass
        # weight that dispatch unwraps ends in ltorch.linear on the inner tensor) has its parent's record, not its own
        outs, parent_outs = bsym.flat_proxy_outs, parent.flat_proxy_outs if parent is not None else ()
        inherits = bool(outs) and bool(parent_outs) and bsym.sym.id == parent.sym.id and outs[0] is parent_outs[0]
        recorded = None if inherits else recorded_argument_kinds(bsym)
        changed = (recorded if recorded is not None else _kinds(bsym.flat_proxy_args)) != _kinds(nb.flat_proxy_args)

        if is_grad_bsym(bsym):
            return self._visit_grad(bsym, nb)
        if is_container_bsym(bsym) or (is_torch_level_symbol(bsym.sym) and _has_subclass(bsym)):
            if not changed and (is_container_bsym(bsym) or _is_unrolled(bsym)):
                if self._claimed(nb):
                    return
                for sub in bsym.subsymbols:
                    self.visit(sub, parent=bsym)
                return
            return self._retrace(bsym, nb)
        if is_torch_level_symbol(bsym.sym) and changed:
            return self._retrace(bsym, nb)
        if is_flatten_bsym(nb):
            v = variableify(nb.args[0])
            known = self.inner_of.get(v)
            if known is not None:
                for old, new in zip(nb.output, known):
                    self.alias(old, new)
                return
            self.inner_of[v] = tuple(nb.output)
            if v in self.cotangents:  # a gradient from .backward(): checked (and coerced) at run time
                p = nb.args[0]
                nb = cotangent_flatten_symbol(p.subclass_type).bind(
                    p, nb.args[1], ctx_arg(p.flatten_ctx), output=nb.output
                )
        elif nb.sym is prims.get_grad:
            self.cotangents.add(variableify(nb.output))
        elif is_unflatten_bsym(nb):
            self.inner_of[variableify(nb.output)] = tuple(nb.args[0])
        elif nb.sym.id == prims.PrimIDs.UPDATE_ALIASES and any(
            isinstance(p, SubclassTensorProxy) for p in nb.flat_proxy_args
        ):
            # thunder's alias bookkeeping for in-place ops (an identity at run time) made plain proxies for
            # subclass values: keep the subclass values (the in-place aten symbols are never reordered or removed)
            for old, new in zip(nb.output, nb.args[0]):
                self.alias(old, new)
            return
        elif (
            nb.sym.executor is None
            and nb.sym not in (prims.python_return, prims.python_del)
            and any(isinstance(p, SubclassTensorProxy) for p in nb.flat_proxy_args)
        ):
            return self._through_dispatch(nb)
        self.bsyms.append(nb)

    def _through_dispatch(self, nb) -> None:
        # A thunder primitive that now receives a subclass (thunder's derivative of a plain operation got a
        # subclass gradient, as a plain parameter multiplied by a TwoTensor does): run the primitive's torch
        # implementation (thunder's torch executor) on fake subclass instances, through __torch_dispatch__.
        from thunder.executors.torchex import ex as torchex

        inputs = list(nb.flat_proxy_args)
        single = new_trace(f"torch_{nb.sym.name}", inputs, names=self.trace.names)
        with tracectx(single):
            single.bound_symbols = [nb, prims.python_return.bind(nb.output, output=None)]
        try:
            from thunder.executors.passes import transform_for_execution

            fn = transform_for_execution(single, executors_list=[torchex]).python_callable()
        except Exception as e:
            raise UnsupportedSubclassOperationError(
                f"thunder primitive {nb.sym.name} received a tensor subclass "
                f"({subclass_names(inputs, {})}) through a gradient, and thunder's torch executor cannot run it "
                f"({type(e).__name__}: {e}). Please report it with the model that triggers it."
            ) from e
        self.trace.push_scope([])
        with tracectx(self.trace):
            _, _, result = record_call(fn, tuple(inputs), {}, self.trace.peek_scope(),
                                   f"thunder primitive {nb.sym.name}", subclass_names(inputs, {}))
        produced = self.trace.pop_scope()
        for old, new in zip(tree_flatten(nb.output)[0], tree_flatten(result)[0]):
            self.alias(old, new)
        for b in produced:
            self.visit(b)

    def _claimed(self, nb) -> bool:
        # an executor registered an implementation for this (subclass, op) (thunder_subclass.register_implementation)
        impl = find_implementation(nb.sym.id, nb.args, nb.kwargs)
        if impl is None:
            return False
        self.trace.push_scope([])
        with tracectx(self.trace):
            result = call_rule(impl, nb.args, nb.kwargs)
        produced = self.trace.pop_scope()
        for old, new in zip(tree_flatten(nb.output)[0], tree_flatten(result)[0]):
            self.alias(old, new)
        for b in produced:
            self.visit(b)
        return True

    def _retrace(self, bsym, nb) -> None:
        # trace the symbol again with the current arguments (through __torch_dispatch__ when one of them is now a
        # subclass), and substitute its outputs. One recorded by a grad rule is recorded again with its gradient
        # recipe: its grad_<op>, later in the trace, refers to the forward's intermediates (a transposed weight,
        # a norm's mean and rstd), which the new recording renames; that grad_<op> is recorded again from the new
        # recipe (_visit_grad).
        from thunder.core.proxies import ProxyTag

        # recorded under torch.no_grad() (its outputs are detached): trace it again the same way
        detached = any(ProxyTag.DETACHED_AUTOGRAD_GRAPH in o.tags for o in nb.flat_proxy_outs)
        recipe = grad_recipe_of(bsym)
        self.trace.push_scope([])
        with tracectx(self.trace), traced_grad_mode(not detached):
            if recipe is not None:
                result, self.recipes[id(recipe)] = recipe.forward_again(nb.args, nb.kwargs)
            elif is_container_bsym(bsym):
                result = record_container_again(nb)
            else:
                result = nb.sym(*nb.args, **nb.kwargs)
        produced = self.trace.pop_scope()
        for old, new in zip(tree_flatten(nb.output)[0], tree_flatten(result)[0]):
            self.alias(old, new)
        for b in produced:
            self.visit(b)

    def _visit_grad(self, bsym, nb) -> None:
        grads, recipe = nb.args[0], nb.args[2]
        again = self.recipes.get(id(recipe), recipe)  # the recipe of the forward recorded again, if it was
        if again is recipe and recipe.grad_kinds == _kinds(grads):
            for sub in bsym.subsymbols:
                self.visit(sub)
            return
        if again is not None and len(again.input_proxies) != len(recipe.input_proxies):
            raise UnsupportedSubclassOperationError(
                f"the backward of {recipe.what} on {recipe.subclasses}: the forward, traced again for the arguments "
                "it gets after autograd, differentiates other inputs than when first traced. Please report it."
            )
        with tracectx(self.trace):
            if again is None:  # the forward, recorded again, has nothing to differentiate: zero gradients
                input_grads, scope = [None] * len(recipe.input_proxies), []
            else:
                input_grads, scope = record_backward(again, grads, saved=nb.args[1] if again is recipe else None)
            for old, i in zip(nb.output, recipe.positions):
                new = input_grads[i]
                if new is None:  # no gradient for this input with these gradient types: zeros, as autograd
                    import thunder.torch as ltorch

                    self.trace.push_scope(scope)
                    new = ltorch.zeros(*old.shape, device=old.device, dtype=old.dtype)
                    self.trace.pop_scope()
                self.alias(old, new)
        for b in scope:
            self.visit(b)


def needs_flattening(trace) -> bool:
    return any(is_subclass_level(b) for b in trace.bound_symbols)


def flatten_subclasses(trace, *, cotangent_aliases=()):
    """Replace subclass-level bound symbols by their subsymbols (see the module docstring). For a joint
    forward+backward trace, ``cotangent_aliases`` (pairs old, new) replace incoming gradients by the kind the
    backward is compiled for."""
    if not needs_flattening(trace):
        claimed = claim_int8_weight_linears(trace.bound_symbols)  # int8 code written on inner tensors, say
        if claimed is trace.bound_symbols:
            return trace
        out = from_trace(trace)
        out.bound_symbols = claimed
        out.set_provenance(TraceProvenance("Claim int8 weight-only linears (thunder_subclass)"))
        return out
    f = Flattener(trace)
    for old, new in cotangent_aliases:
        f.alias(old, new)
    for bsym in trace.bound_symbols:
        f.visit(bsym)
    f.trace.bound_symbols = claim_int8_weight_linears(remove_redundant(
        _define_size_numbers(trace, _sink_unflattens(_hoist_flattens(f.bsyms)))))
    f.trace.set_provenance(TraceProvenance("Flatten tensor subclasses (thunder_subclass)"))
    return f.trace


def _tensor_sizes_meta(t, dims: tuple) -> tuple:
    return tuple(t._shape[d] for d in dims)


def _tensor_sizes_impl(t, dims: tuple) -> tuple:
    return tuple(t.shape[d] for d in dims)


# ``tensor_sizes(t, dims)``: sizes of ``t`` as numbers of the trace (see _define_size_numbers)
tensor_sizes = subclass_executor.register_operator(
    "tensor_sizes", meta=_tensor_sizes_meta, fn=_tensor_sizes_impl
)


def _define_size_numbers(trace, bsyms: list) -> list:
    """Under symbolic sizes (``cache="symbolic values"``), flattened symbols name size numbers (an aten ``expand``
    to an input's size, the outer size of an ``unflatten_<Cls>``) that were defined only inside the subsymbols they
    came from (thunder's ``prims.shape`` in a torch symbol's decomposition, which does not run): each such number
    gets a ``tensor_sizes`` of a tensor that has it as a size, just before its first use; one no tensor had yet but
    the forward computed from defined numbers (``prims.add`` of two sizes for a ``cat``) gets that computation."""
    defined: set[str] = set()
    holder: dict[str, tuple] = {}  # number name -> (tensor proxy, dim)

    def provide(p) -> None:
        defined.add(p.name)
        if isinstance(p, TensorProxy):
            shape = p.outer_size if isinstance(p, SubclassTensorProxy) else p._shape
            for d, n in enumerate(shape):
                if isinstance(n, NumberProxy) and n.name not in holder:
                    holder[n.name] = (p, d)

    for p in tree_flatten((trace.args, trace.kwargs))[0]:
        if isinstance(p, Proxy):
            provide(p)
    out: list = []
    changed = False
    for b in bsyms:
        for a in b.flat_proxy_args:  # a size the forward computed from defined numbers (a cat's i0 + i8): again
            if isinstance(a, NumberProxy) and a.name not in defined and a.name not in holder:
                computation = size_computation(a.name, defined)
                for c in computation or ():
                    out.append(c)
                    defined.update(o.name for o in c.flat_proxy_outs)
                    changed = True
        missing = [a for a in b.flat_proxy_args if isinstance(a, NumberProxy) and a.name not in defined
                   and a.name in holder]
        by_tensor: dict[str, tuple] = {}
        for a in missing:
            t, d = holder[a.name]
            by_tensor.setdefault(t.name, (t, []))[1].append(d)
        for t, dims in by_tensor.values():
            dims = tuple(sorted(set(dims)))
            out.append(tensor_sizes.bind(t, dims, output=_tensor_sizes_meta(t, dims)))
            for d in dims:
                defined.add(t._shape[d].name)
            changed = True
        out.append(b)
        for o in b.flat_proxy_outs:
            provide(o)
    return out if changed else bsyms


def _hoist_flattens(bsyms: list) -> list:
    """Move every ``flatten_<Cls>`` (attribute reads, no side effects) to just after the symbol that produces its
    argument, e.g. parameters' flattens to the top. Otherwise each one sits where its subclass was first used and
    cuts the fusion regions of torch_compile / nvFuser in pieces (one region per layer instead of one)."""
    out: list = []
    produced_at: dict[str, int] = {}  # proxy name -> index in `out` of the symbol after which it exists
    inserts: dict[int, list] = {}
    for b in bsyms:
        if is_flatten_bsym(b):
            names = [p.name for p in b.flat_proxy_args]
            at = max((produced_at.get(n, -1) for n in names), default=-1)
            inserts.setdefault(at, []).append(b)
            for o in b.flat_proxy_outs:
                produced_at[o.name] = at
            continue
        out.append(b)
        for o in b.flat_proxy_outs:
            produced_at[o.name] = len(out) - 1
    if not inserts:
        return bsyms
    result = list(inserts.get(-1, ()))
    for i, b in enumerate(out):
        result.append(b)
        result.extend(inserts.get(i, ()))
    return result


def _sink_unflattens(bsyms: list) -> list:
    """Move every ``unflatten_<Cls>`` (builds an object, no side effects) to just before the first symbol that uses
    its result, e.g. gradients' unflattens to the return: the counterpart of :func:`_hoist_flattens`."""
    pending: dict[str, Any] = {}  # output name -> its unflatten (a bound symbol), not placed yet
    out: list = []

    def place_for(b) -> None:
        for p in b.flat_proxy_args:
            u = pending.pop(p.name, None)
            if u is not None:
                for o in u.flat_proxy_outs:
                    pending.pop(o.name, None)
                place_for(u)  # its own arguments may be pending unflattens (nested subclasses)
                out.append(u)

    for b in bsyms:
        if is_unflatten_bsym(b) and b.flat_proxy_outs:
            for o in b.flat_proxy_outs:
                pending[o.name] = b
            continue
        place_for(b)
        out.append(b)
    tail = [out.pop()] if out and out[-1].sym.id == prims.PrimIDs.RETURN else []
    for u in list(pending.values()):  # unused results: kept (in their original order) before the return, for DCE
        if any(pending.get(o.name) is u for o in u.flat_proxy_outs):
            for o in u.flat_proxy_outs:
                pending.pop(o.name, None)
            place_for(u)
            out.append(u)
    return out + tail
