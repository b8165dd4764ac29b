"""Trace-building speed: thunder's per-bound-symbol bookkeeping without its repeated work.

Three costs of thunder 0.2.6 that grow with the size of a trace (measured on a tiny int8 Llama's first call, per
decoder layer, under cProfile: ~2.5 s in all, of which these ~0.9 s), each replaced by a path that gives the same
result:

* ``core/symbol.py`` ``tree_flatten_with_dataclass`` (the module global that ``BoundSymbol.flat_args_and_spec``,
  ``flat_outs_and_spec`` and ``from_bsym_swap_proxies`` call, ~7,500 times per layer) first maps the whole tree
  with ``optree.tree_map`` only to register the classes of dataclass leaves it has not seen, then flattens it.
  :func:`fast_tree_flatten_with_dataclass` flattens once (thunder's ``tree_flatten``, the same type check) and
  returns that when the first pass would have changed nothing: no leaf is an unregistered dataclass and no node is
  a type registered in thunder's pytree namespace (the spec has no namespace; the map rebuilds ``torch.Size`` as a
  tuple and registered dataclasses as new instances, so their specs differ). Otherwise thunder's function runs.
* ``core/jit_ext.py`` ``JitCtx.add_constraint`` looks for a duplicate by comparing the new constraint with every
  constraint recorded so far: quadratic in the number of guards (88 per Llama layer; ~1 ms a call at 6 layers). The
  hook keeps an index of the recorded constraints by a key that compares as thunder's loop does (a proxy by its
  name, ``variableify``; any other element by ``==``), built from ``ctx._constraints`` itself (rebuilt when thunder
  replaces the list, extended when something appended to it directly). A constraint with an unhashable element goes
  to thunder's loop.
* ``thunder/__init__.py`` ``apply_transforms_and_build_cache_entry`` runs the executors' pass
  (``_transform_for_operator_executor_execution``) once only to ask ``maybe_sort_waits`` whether the result holds
  a distributed ``wait``, and throws the result away when it does not; the same pass then runs again inside
  ``transform_for_execution``. The plugin's hook of that pass (:mod:`.autograd_hooks`) returns the trace unchanged
  at that call site when no bound symbol, at any depth, is a distributed ``wait`` (:func:`may_hold_waits`): the pass
  can only make a ``wait`` from one, so ``maybe_sort_waits`` would have discarded the result.

The first two give thunder's results for any jit. The third changes nothing in what a trace computes, only which
proxy names later traces get (the discarded pass no longer takes names), so it acts for plugin jits only: a plain
``thunder.jit``'s traces stay exactly thunder's.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["fast_tree_flatten_with_dataclass", "may_hold_waits", "is_sort_waits_probe", "hook_targets"]


def fast_tree_flatten_with_dataclass(tree, original: Callable):
    """thunder's ``tree_flatten_with_dataclass(tree)`` (``original``) in one pass when that gives the same result:
    no leaf is an unregistered dataclass instance and no node is one of thunder's registered types (``torch.Size``
    rebuilt as a tuple, a dataclass rebuilt as a new instance by thunder's first pass: its spec differs)."""
    from thunder.core import pytree

    leaves, spec = pytree.tree_flatten(tree)
    if spec.namespace or any(pytree._maybe_register_dataclass(leaf) for leaf in leaves):
        return original(tree)
    return leaves, spec


def _hook_tree_flatten_with_dataclass(original):
    @functools.wraps(original)
    def tree_flatten_with_dataclass(tree):
        return fast_tree_flatten_with_dataclass(tree, original)

    return tree_flatten_with_dataclass


_UNHASHABLE = object()


def _constraint_key(constraint: tuple):
    """A hashable key equal for two constraints exactly when thunder's duplicate test calls them equal (proxies by
    name, other elements by ``==``), or ``_UNHASHABLE``."""
    from thunder.core.baseutils import ProxyInterface
    from thunder.core.proxies import variableify

    key = [len(constraint)]
    for i, c in enumerate(constraint):
        if i and isinstance(c, ProxyInterface):
            key.append((_PROXY, variableify(c)))
        else:
            key.append(c)
    key = tuple(key)
    try:
        hash(key)
    except TypeError:
        return _UNHASHABLE
    return key


_PROXY = object()  # marks a proxy's name in a key (a proxy equals only a proxy of the same name)


class _ConstraintIndex:
    __slots__ = ("constraints", "count", "keys")

    def __init__(self, constraints: list):
        self.constraints = constraints
        self.count = 0
        self.keys: set = set()

    def sync(self) -> None:
        for c in self.constraints[self.count:]:
            key = _constraint_key(c)
            if key is not _UNHASHABLE:
                self.keys.add(key)
        self.count = len(self.constraints)


_INDEX_ATTR = "_thunder_subclass_constraint_index"


def _hook_add_constraint(original):
    @functools.wraps(original)
    def add_constraint(self, constraint):
        key = _constraint_key(constraint) if isinstance(constraint, tuple) else _UNHASHABLE
        if key is _UNHASHABLE:
            return original(self, constraint)
        index = self.__dict__.get(_INDEX_ATTR)
        if index is None or index.constraints is not self._constraints or index.count > len(self._constraints):
            index = _ConstraintIndex(self._constraints)
            setattr(self, _INDEX_ATTR, index)
        index.sync()
        if key in index.keys:
            return None
        self._constraints.append(constraint)
        index.keys.add(key)
        index.count = len(self._constraints)
        return None

    return add_constraint


def may_hold_waits(trace) -> bool:
    """Whether a bound symbol of ``trace``, at any depth, is a distributed ``wait`` (or torch's implementation of
    it): the only bound symbols from which the executors' pass makes the ``wait`` that ``maybe_sort_waits`` sorts."""
    from thunder.distributed import prims as dist_prims

    ids = {dist_prims.PrimIDs.WAIT, "torch_wait_prim_impl"}
    stack = list(trace.bound_symbols)
    while stack:
        bsym = stack.pop()
        if bsym.sym.id in ids or bsym.sym.name in ("wait", "torch_wait_prim_impl"):
            return True
        stack.extend(bsym.subsymbols)
    return False


@functools.cache
def _sort_waits_probe_code():
    import inspect

    import thunder

    stack = [inspect.unwrap(thunder.jit).__code__]
    while stack:
        code = stack.pop()
        if code.co_name == "apply_transforms_and_build_cache_entry":
            return code
        stack.extend(c for c in code.co_consts if hasattr(c, "co_consts"))
    return None


def is_sort_waits_probe(depth: int = 2) -> bool:
    """Whether the caller ``depth`` frames up is thunder's ``apply_transforms_and_build_cache_entry``, whose only
    direct call of the executors' pass is the one made for ``maybe_sort_waits``."""
    code = _sort_waits_probe_code()
    return code is not None and sys._getframe(depth).f_code is code


def hook_targets() -> list[tuple[Any, str, Callable]]:
    import thunder.core.jit_ext as jit_ext
    import thunder.core.symbol as symbol

    return [
        (symbol, "tree_flatten_with_dataclass", _hook_tree_flatten_with_dataclass),
        (jit_ext.JitCtx, "add_constraint", _hook_add_constraint),
    ]
