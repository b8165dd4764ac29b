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

Also, for plugin jits, ``core/trace.py`` ``TraceCtx.python_callable`` keeps on the trace the source and context it
printed (``TraceCtx.python`` / ``python_ctx`` called inside it), with the bound symbols they were printed from:
the on-disk cache stores the final traces' source and context right after the callables are built, and printed them
again (~0.2 s per Llama decoder layer, most of a store). :func:`printed_trace` returns them while the trace still
holds the same bound symbols, else None (the caller prints again).

Two more, measured later (~0.12 s per layer together), also give thunder's results for any jit:

* ``core/pytree.py`` ``tree_flatten`` builds a set literal of ~30 types on every call to test its argument's type
  (~13,500 calls per layer): its code is swapped in place (see the comment above :func:`_fast_tree_flatten_code`);
* ``core/symbol.py`` ``Symbol.normalize`` calls ``inspect.signature(meta)`` on every bind (~1,000 per layer): one
  signature per meta function (:func:`meta_signature`).

One more acts in the executors' pass: a bound symbol that an operator executor runs as itself (or as a symbol
registered ``like=`` it) is kept with its output and subsymbols instead of being traced again from its meta
(:func:`reuse_claimed_bsym`, see the comment above it); for plugin jits only, since the names differ from thunder's.

The first two give thunder's results for any jit. The third changes nothing in what a trace computes, only which
proxy names later traces get (the discarded pass no longer takes names), so it acts for plugin jits only: a plain
``thunder.jit``'s traces stay exactly thunder's.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

from thunder_subclass._thunder_internals.plugin_state import is_plugin_active

__all__ = [
    "fast_tree_flatten_with_dataclass", "plain_flatten_types", "unhook_tree_flatten", "meta_signature",
    "may_hold_waits", "is_sort_waits_probe", "printed_trace", "reuse_claimed_bsym", "hook_targets",
]


def fast_tree_flatten_with_dataclass(tree, original: Callable):
    """thunder's ``tree_flatten_with_dataclass(tree)`` (``original``) in one pass when that gives the same result:
    no leaf is an unregistered dataclass instance and no node is one of thunder's registered types (``torch.Size``
    rebuilt as a tuple, a dataclass rebuilt as a new instance by thunder's first pass: its spec differs)."""
    pytree = sys.modules["thunder.core.pytree"]  # no import statement: ~7,500 calls per layer
    leaves, spec = pytree.tree_flatten(tree)
    if spec.namespace:
        return original(tree)
    for leaf in leaves:
        cls = type(leaf)
        if cls in _NOT_DATACLASSES:
            continue
        if not hasattr(cls, "__dataclass_fields__"):  # dataclasses.is_dataclass of an instance (or a class: never one)
            _NOT_DATACLASSES.add(cls)
            continue
        if pytree._maybe_register_dataclass(leaf):
            return original(tree)
    return leaves, spec


# types of leaves that are not dataclass instances (proxies, numbers, dtypes, ...): thunder's per-leaf test, once per type
_NOT_DATACLASSES: set[type] = set()


def _hook_tree_flatten_with_dataclass(original):
    @functools.wraps(original)
    def tree_flatten_with_dataclass(tree):
        return fast_tree_flatten_with_dataclass(tree, original)

    return tree_flatten_with_dataclass


# --- thunder.core.pytree.tree_flatten ---------------------------------------------------------------------------
# thunder's tree_flatten tests the argument's type against a set literal of ~30 types that it builds on every call
# (it holds starred expressions, so Python cannot make it a constant): ~2.8 us of a ~5.5 us call, ~13,500 calls per
# Llama decoder layer. 30 modules bound the function by name (``from thunder.core.pytree import tree_flatten``), so
# the hook swaps the function's code, not a module attribute: every holder gets the new code at once. The new code
# answers the types thunder's set accepts from a set built once (:func:`plain_flatten_types`, found by calling
# thunder's own function, so it is never larger than thunder's) and hands every other argument to thunder's code.


def _fast_tree_flatten_code(args, namespace="thunder"):  # pragma: no cover - only its __code__ is used
    # runs as thunder.core.pytree.tree_flatten, with that module's globals (tree_flatten, optree) and thunder's
    # default for ``namespace``
    if type(args) in tree_flatten._thunder_subclass_plain_types:  # noqa: F821
        return optree.tree_flatten(args, none_is_leaf=True, namespace=namespace)  # noqa: F821
    return tree_flatten._thunder_subclass_checked(args, namespace)  # noqa: F821


def plain_flatten_types(checked: Callable) -> frozenset:
    """The types of common values that thunder's ``tree_flatten`` (``checked``: a function with its original code)
    accepts by its type test alone: each candidate is kept only when ``checked`` flattens an instance of it."""
    import torch
    import thunder.core.devices as devices
    import thunder.core.dtypes as dtypes

    samples = [
        (), [], {}, "", 0, 1.5, True, None, 1j, slice(1), ..., int, torch.float32, torch.device("cpu"),
        torch.Size([1]), torch.contiguous_format, dtypes.float32, dtypes.int64, dtypes.bool8, devices.cpu,
    ]
    found = set()
    for x in samples:
        try:
            checked(x)
        except TypeError:
            continue
        found.add(type(x))
    return frozenset(found)


def _hook_tree_flatten_code(original_code):
    """The code that ``thunder.core.pytree.tree_flatten`` runs while hooked (see the comment above). Keeps, on the
    function, thunder's code as a function of its own and the set of plain types; :func:`unhook_tree_flatten` (called
    by ``uninstall``) removes them."""
    from thunder.core import pytree

    fn = pytree.tree_flatten
    checked = types.FunctionType(original_code, fn.__globals__, fn.__name__, fn.__defaults__)
    fn._thunder_subclass_checked = checked
    fn._thunder_subclass_plain_types = plain_flatten_types(checked)
    names = {"co_name": original_code.co_name}
    if hasattr(original_code, "co_qualname"):  # Python >= 3.11
        names["co_qualname"] = original_code.co_qualname
    return _fast_tree_flatten_code.__code__.replace(**names)


def unhook_tree_flatten() -> None:
    from thunder.core import pytree

    for name in ("_thunder_subclass_checked", "_thunder_subclass_plain_types"):
        pytree.tree_flatten.__dict__.pop(name, None)


# --- Symbol.normalize -------------------------------------------------------------------------------------------
# thunder's Symbol.bind normalizes a call's arguments with inspect.signature(self.meta) on every bound symbol it makes
# (~1,000 per Llama decoder layer, ~23 us each). A signature depends only on the function, so it is made once per
# meta function; the binding itself is thunder's (Signature.bind + apply_defaults).

_SIGNATURES: dict[int, tuple[Callable, inspect.Signature]] = {}  # id(meta) -> (meta, its signature); meta kept alive
_SIGNATURES_LIMIT = 8192  # symbols made per trace (fusions) would otherwise grow it without end


def meta_signature(meta: Callable) -> inspect.Signature:
    """``inspect.signature(meta)``, made once per function."""
    entry = _SIGNATURES.get(id(meta))
    if entry is None or entry[0] is not meta:
        if len(_SIGNATURES) >= _SIGNATURES_LIMIT:
            _SIGNATURES.clear()
        entry = _SIGNATURES[id(meta)] = (meta, inspect.signature(meta))
    return entry[1]


def _hook_normalize(original):
    @functools.wraps(original)
    def normalize(self, *args, **kwargs):
        meta = self.meta
        if meta is None:  # thunder's assertion
            return original(self, *args, **kwargs)
        bound = meta_signature(meta).bind(*args, **kwargs)
        bound.apply_defaults()
        return bound.args, bound.kwargs

    return normalize


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


_printing = threading.local()  # (trace, record) while TraceCtx.python_callable runs for a plugin jit
_PRINTED = "_thunder_subclass_printed"


def _hook_python_callable(original):
    @functools.wraps(original)
    def python_callable(self, *args, **kwargs):
        if not is_plugin_active():
            return original(self, *args, **kwargs)
        record: dict = {}
        outer = getattr(_printing, "current", None)
        _printing.current = (self, record)
        try:
            fn = original(self, *args, **kwargs)
        finally:
            _printing.current = outer
        self.__dict__[_PRINTED] = (tuple(self.bound_symbols), record)
        if type(fn) is types.FunctionType:
            fn.__dict__[_PRINTED] = (None, record)  # what the function runs, whatever becomes of the trace
        return fn

    return python_callable


def _recording(trace) -> dict | None:
    current = getattr(_printing, "current", None)
    return current[1] if current is not None and current[0] is trace else None


def _hook_python(original):
    @functools.wraps(original)
    def python(self, **kwargs):
        source = original(self, **kwargs)
        record = _recording(self)
        if record is not None:
            record[("python", tuple(sorted(kwargs.items())))] = source
        return source

    return python


def _hook_python_ctx(original):
    @functools.wraps(original)
    def python_ctx(self):
        ctx = original(self)
        record = _recording(self)
        if record is not None:
            record["python_ctx"] = dict(ctx)  # python_callable adds its own names to the dict it gets
        return ctx

    return python_ctx


def printed_trace(trace, fn=None, **kwargs) -> tuple[str, dict] | None:
    """``(trace.python(**kwargs), trace.python_ctx())`` as printed when the trace's callable was built, when the trace
    still holds the same bound symbols; or, given ``fn`` (a function ``python_callable`` returned), the source and
    context ``fn`` was built from (thunder builds the computation and epilogue from a last trace it does not keep,
    ``transform_to_torch_types``); else None."""
    for holder, bsyms_now in ((trace, trace.bound_symbols), (fn, None)):
        printed = getattr(holder, "__dict__", {}).get(_PRINTED)
        if printed is None:
            continue
        bsyms, record = printed
        source = record.get(("python", tuple(sorted(kwargs.items()))))
        ctx = record.get("python_ctx")
        if source is None or ctx is None:
            continue
        if bsyms is not None and (len(bsyms_now) != len(bsyms) or any(a is not b for a, b in zip(bsyms_now, bsyms))):
            continue
        return source, dict(ctx)
    return None


# --- the executors' pass: a symbol an operator executor runs as itself --------------------------------------------
# thunder's executors' pass (``executors/passes.py``, ``OpExProcessor.process_bsym``) gives each bound symbol that an
# operator executor claims without an execution transform to ``add_bsyms_from_function(op, *bsym.args,
# **bsym.kwargs)``, where ``op`` is the executor's symbol for it: ``op`` is the symbol itself (the plugin's aten
# symbols) or a symbol registered ``like=`` it (the torch executor's ``mul``, whose meta *is* ``ltorch.mul``). Calling
# ``op`` runs the symbol's meta again on the same arguments: the whole decomposition into prims for thunder's torch
# symbols, a run on fakes for the plugin's aten symbols (~0.1 s of CPU per Llama decoder layer, ~150 symbols). The
# result is a bound symbol of ``op`` whose output and subsymbols equal the original's but for fresh proxy names, which
# the pass then swaps in for the old ones everywhere. For plugin jits, such a call makes that bound symbol from the
# original's output and subsymbols instead (:func:`reuse_claimed_bsym`): the same program with the old names.
# ``process_bsym`` of each processor class says which bound symbol is being processed (``__init_subclass__`` hook);
# anything else (an execution transform, other arguments, autocast, an output that is an argument) runs thunder's way.

_CURRENT_BSYM = "_thunder_subclass_current_bsym"


def _hook_processor_init_subclass(original):
    # TraceSubstitutionProcessor.__init_subclass__ (inherited from object): each subclass's process_bsym records the
    # bound symbol it processes on the processor (OpExProcessor is a class made anew on every executors' pass)
    from thunder.core.trace_interpreter import TraceSubstitutionProcessor

    def __init_subclass__(cls, **kwargs):
        super(TraceSubstitutionProcessor, cls).__init_subclass__(**kwargs)
        process = cls.__dict__.get("process_bsym")
        if process is not None and not getattr(process, "_thunder_subclass_tracks", False):
            cls.process_bsym = _tracking(process)

    return classmethod(__init_subclass__)


def _tracking(process: Callable) -> Callable:
    @functools.wraps(process)
    def process_bsym(self, bsym):
        self.__dict__[_CURRENT_BSYM] = bsym
        try:
            return process(self, bsym)
        finally:
            self.__dict__[_CURRENT_BSYM] = None

    process_bsym._thunder_subclass_tracks = True
    return process_bsym


def reuse_claimed_bsym(processor, fn, args: tuple, kwargs: dict, tags):
    """The result of ``processor.add_bsyms_from_function(fn, *args, **kwargs, tags=tags)`` made without calling
    ``fn``, or None (thunder's way): when ``fn`` is an operator executor's symbol for the bound symbol being processed
    (itself, or a symbol whose meta is it), called with that bound symbol's own arguments (see the comment above)."""
    from thunder.core.proxies import ProxyTag, TensorProxy
    from thunder.core.symbol import Symbol
    from thunder.core.compile_data import get_compile_data
    from thunder.extend import OperatorExecutor
    from thunder.transforms.autocast import maybe_apply_autocast

    bsym = processor.__dict__.get(_CURRENT_BSYM)
    if bsym is None or not isinstance(fn, Symbol) or not isinstance(fn.executor, OperatorExecutor):
        return None
    nested = fn is not bsym.sym
    if nested and (fn.meta is not bsym.sym or fn.is_prim):
        return None
    if len(args) != len(bsym.args) or any(a is not b for a, b in zip(args, bsym.args)):
        return None
    if kwargs.keys() != bsym.kwargs.keys() or any(v is not bsym.kwargs[k] for k, v in kwargs.items()):
        return None
    if maybe_apply_autocast(fn) is not None or (nested and maybe_apply_autocast(bsym.sym) is not None):
        return None
    flat_args = bsym.flat_args
    outputs = bsym.flat_proxy_outs
    if any(o is a for o in outputs for a in flat_args):  # Symbol.__call__ would add a shallow_copy
        return None
    cd = get_compile_data()
    if cd is not None and not cd.is_grad_enabled:  # as Symbol.__call__ tags results made with grad disabled
        names = {a.name for a in flat_args if isinstance(a, TensorProxy)}
        for o in outputs:
            if isinstance(o, TensorProxy) and o.name not in names:
                o.tags.add(ProxyTag.DETACHED_AUTOGRAD_GRAPH)
    subsymbols = [bsym] if nested else ([] if fn.is_prim else list(bsym.subsymbols))
    new = fn.bind(*args, **kwargs, output=bsym.output, subsymbols=subsymbols)
    if tags is not None:
        new.tags.update(tags)
    processor.new_bsyms += [new]
    processor.set_result(bsym.output)
    return (bsym.output,)


def _hook_add_bsyms_from_function(original):
    @functools.wraps(original)
    def add_bsyms_from_function(self, fn, /, *args, tags=None, **kwargs):
        if is_plugin_active():
            reused = reuse_claimed_bsym(self, fn, args, kwargs, tags)
            if reused is not None:
                return reused[0]
        return original(self, fn, *args, tags=tags, **kwargs)

    return add_bsyms_from_function


def hook_targets() -> list[tuple[Any, str, Callable]]:
    import thunder.core.jit_ext as jit_ext
    import thunder.core.pytree as pytree
    import thunder.core.symbol as symbol
    from thunder.core.trace import TraceCtx
    from thunder.core.trace_interpreter import TraceSubstitutionProcessor

    return [
        (pytree.tree_flatten, "__code__", _hook_tree_flatten_code),
        (symbol, "tree_flatten_with_dataclass", _hook_tree_flatten_with_dataclass),
        (symbol.Symbol, "normalize", _hook_normalize),
        (jit_ext.JitCtx, "add_constraint", _hook_add_constraint),
        (TraceCtx, "python_callable", _hook_python_callable),
        (TraceCtx, "python", _hook_python),
        (TraceCtx, "python_ctx", _hook_python_ctx),
        (TraceSubstitutionProcessor, "__init_subclass__", _hook_processor_init_subclass),
        (TraceSubstitutionProcessor, "add_bsyms_from_function", _hook_add_bsyms_from_function),
    ]
