"""Stage 2 (per call), the per-call policy of a ``thunder_subclass.jit`` function: the per-call
wrappers composed in the order a call runs through them (:func:`compiled_call`), automatic dynamic shapes
(:class:`AutomaticDynamicShapes`), the cache bound (:func:`bounded`, with
:class:`thunder_subclass.runtime.cache.CachePolicy`) and the order entries are tried in (:class:`EntryIndex`).

In: what ``thunder.jit`` returned for the user's function or module, with the jit's cache policy and options. What
happens: the decisions are made here and handed to the per-call path of the bottom layer
(``_thunder_internals/runtime.py``, which knows only thunder's side: how to read and run thunder's cache entries,
where its hooks sit) as one :class:`~thunder_subclass._thunder_internals.CallPort`: whether a miss may trace (the
bound), how a miss traces (constant sizes, or symbolic ones after a size-driven miss), which entries a call tries
first. Out: the object handed to the user (the compiled function, or the same ``ThunderModule``).

Owner of state: one :class:`AutomaticDynamicShapes` and one :class:`EntryIndex` per compiled function, held by its
``CallPort`` on the jit's compile data (neither holds the compile data, nor thunder's per-call function, which does);
the policy in the jit's record (``_thunder_internals.jit_record``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from thunder_subclass.runtime import cache, graph_breaks
from thunder_subclass._thunder_internals import (
    CacheLimitReached,
    CallPort,
    ModuleBindings,
    fast_call_path,
    is_user_dispatch_mode_active,
    jit_record,
    remembering_calls,
    with_call,
)

__all__ = ["AutomaticDynamicShapes", "EntryIndex", "bounded", "compiled_call"]


def _input_signature(args: tuple, kwargs: dict) -> tuple[Any, tuple, tuple]:
    """``(structure, what must match, sizes)`` of a call's arguments: the pytree structure, per leaf its type and (for
    tensors) dtype, device, layout, number of dimensions and ``requires_grad``, or (for other leaves) the leaf itself
    where it is hashable and not an int; and the tensors' sizes and the ints, which symbolic values can vary."""
    from torch.utils._pytree import tree_flatten

    leaves, spec = tree_flatten((args, kwargs))
    fixed, sizes = [], []
    for x in leaves:
        if isinstance(x, torch.Tensor):
            with torch._C.DisableTorchFunctionSubclass():  # no user __torch_function__ for these reads
                fixed.append((type(x), x.dtype, x.device, x.layout, x.dim(), x.requires_grad))
                sizes.append(tuple(x.shape))
        elif type(x) is int:
            fixed.append(int)
            sizes.append(x)
        else:
            try:
                hash(x)
                fixed.append((type(x), x))
            except TypeError:
                fixed.append((type(x), id(x)))
    return spec, tuple(fixed), tuple(sizes)


def _describe_callable(fn) -> str:
    """``f (file.py:12)`` for a function, ``Linear (module)`` for a module: what a warning names."""
    if isinstance(fn, torch.nn.Module):
        return f"{type(fn).__qualname__} (module)"
    code = getattr(fn, "__code__", None)
    where = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
    return f"{getattr(fn, '__qualname__', type(fn).__qualname__)}{where}"


def _marked_dynamic(args: tuple, kwargs: dict) -> bool:
    """Whether a tensor among the arguments, or an inner tensor of a wrapper subclass among them (a jagged
    NestedTensor's cached ``max_seqlen`` / ``min_seqlen``, as PyTorch's compile tests mark them), has dims marked
    with ``torch._dynamo.mark_dynamic``: automatic dynamic shapes then traces with symbolic sizes from the first call,
    as torch.compile makes marked dims dynamic from its first compile."""
    from torch.utils._pytree import tree_leaves
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    stack = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
    while stack:
        x = stack.pop()
        if getattr(x, "_dynamo_dynamic_indices", None):
            return True
        if is_traceable_wrapper_subclass(x):
            with torch._C.DisableTorchFunctionSubclass():
                attrs, _ = x.__tensor_flatten__()
            stack.extend(t for t in (getattr(x, a) for a in attrs) if isinstance(t, torch.Tensor))
    return False


def _is_int_value_change(rejection: BaseException | None) -> bool:
    """Whether the newest cache entry rejected a call (``rejection``, what its prologue raised) because an int it read
    while tracing from inside the arguments changed (a static cache layer's ``cumulative_length``, a step counter):
    automatic dynamic shapes treats that as a size change (the next trace reads such ints as symbols)."""
    is_int = getattr(rejection, "is_int_value_change", None)
    return callable(is_int) and is_int()


class AutomaticDynamicShapes:
    """torch.compile's automatic dynamic shapes for a plugin jit under thunder's default cache ("constant values"),
    which traces once per input size: after a cache miss whose arguments differ from the previous miss's only in
    tensor sizes or int values (or look the same, and the newest entry rejected the call on an int it read from inside
    them: a cache layer's token count), or at the first miss when an argument has dims marked with
    ``torch._dynamo.mark_dynamic`` (:func:`_marked_dynamic`), the jit's cache option (``CompileData.cache_option``, which thunder's interpreter
    reads while it traces: ``core/compile_data.py`` ``get_cache_option``) becomes "symbolic values", so that the trace
    made for that call, and kept in the same cache, takes any sizes where nothing needs them fixed (the plugin still
    guards the sizes that reach a subclass operation). Entries traced before keep their exact checks. If tracing
    with symbolic values fails, the jit goes back to "constant values" for good, with a one-time warning, and the call
    traces as before: a trace per size, never an error that constant values would not give.

    Owner: one per compiled function (its :class:`~thunder_subclass._thunder_internals.CallPort` holds it); it holds
    the jit's compile data and stats weakly and is handed the call to trace with, so it keeps nothing alive.
    :attr:`state` is ``"static"``, ``"symbolic"`` or ``"static for good"``."""

    def __init__(self, cd, cs):
        import weakref

        self._cd, self._cs = weakref.ref(cd), weakref.ref(cs)
        self._previous = None  # the signature of the arguments of the last call that traced
        self.state = "static"

    def trace(self, call: Callable, args: tuple, kwargs: dict, rejection: BaseException | None = None):
        """Make and run a new trace for this call (a cache miss) by ``call`` (thunder's per-call function, which traces
        at a miss), with symbolic sizes when the miss is size-driven:
        the arguments differ from the previous miss's in sizes or ints only, or they look the same and the newest
        entry rejected the call (``rejection``) on an int it read from inside them."""
        from thunder.core.options import CACHE_OPTIONS

        if self.state == "symbolic":
            return self._first_among_entries(call, args, kwargs)
        if self.state != "static":
            return call(*args, **kwargs)
        signature = _input_signature(args, kwargs)
        previous, self._previous = self._previous, signature
        cd, cs = self._cd(), self._cs()
        # torch._dynamo.mark_dynamic on an argument: symbolic sizes from the first trace
        marked = previous is None and _marked_dynamic(args, kwargs)
        if cd is None or cs is None or not marked and (previous is None or previous[:2] != signature[:2] or (
                previous == signature and not _is_int_value_change(rejection))):
            return call(*args, **kwargs)
        cd.cache_option = CACHE_OPTIONS.SYMBOLIC_VALUES
        self.state = "symbolic"
        entries = len(cs.interpreter_cache)
        try:
            return self._first_among_entries(call, args, kwargs)
        except Exception as e:
            if len(cs.interpreter_cache) != entries:  # it traced and failed when it ran: the user's error
                raise
            cd.cache_option = CACHE_OPTIONS.CONSTANT_VALUES
            if marked:  # the first trace, tried symbolic for the marks: it traces static (an error of the program is
                self.state = "static"  # raised by it), and a later size-driven miss tries symbolic sizes again
                return call(*args, **kwargs)
            import warnings

            self.state = "static for good"
            self._previous = None
            warnings.warn(
                f"thunder_subclass: tracing {_describe_callable(cd.fn)} with symbolic sizes "
                f"after its inputs changed size failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                "it keeps one trace per input size. Pass dynamic=False to thunder_subclass.jit to choose that from "
                "the start.",
                stacklevel=3,
            )
            return call(*args, **kwargs)

    def _first_among_entries(self, call: Callable, args: tuple, kwargs: dict):
        """Trace with symbolic sizes, and put the new cache entry first in thunder's list of entries, which lookups
        read newest first: the exact entries traced before keep answering the sizes they were made for (their checks
        and computations are cheaper than the symbolic entry's), the symbolic one answers the others."""
        cs = self._cs()
        entries = len(cs.interpreter_cache) if cs is not None else None
        result = call(*args, **kwargs)
        if cs is not None and len(cs.interpreter_cache) == entries + 1:
            cs.interpreter_cache.insert(0, cs.interpreter_cache.pop())
        return result


class EntryIndex:
    """The cache entries of one compiled function by the :meth:`key` of the calls they accepted, so that a call
    tries first the entries that accepted calls like it, the one that accepted the last such call first (a repeated
    call costs one prologue with 1 or 100 entries; subclass arguments are keyed by type only, as reading their shape
    may run Python, so calls alternating between k shapes cost at most k), then, if none accepts, every other entry
    newest first as thunder does (an entry found so is added to the key's list). The keys only order the search:
    every hit is still an entry whose prologue accepted the call. Owned by the fast call; forgotten when thunder's
    entry list shrinks or is replaced, and when it holds more than ``MAX_KEYS`` keys."""

    __slots__ = ("buckets", "entries", "n")

    MAX_KEYS = 1024

    def __init__(self):
        self.buckets: dict = {}
        self.entries = None
        self.n = 0

    @staticmethod
    def key(args: tuple, kwargs: dict, grad: bool) -> tuple:
        """A key of a call that the prologues of the constant-values cache check exactly: grad mode, and per argument
        its type, with shape and dtype for a plain tensor (reading them from a subclass may run Python)."""
        key = [grad]
        for a in args:
            key.append((a.shape, a.dtype) if type(a) is torch.Tensor else type(a))
        if kwargs:
            for k, a in kwargs.items():
                key.append(k)
                key.append((a.shape, a.dtype) if type(a) is torch.Tensor else type(a))
        return tuple(key)

    def bucket(self, cache: list, key) -> list:
        if cache is not self.entries or len(cache) < self.n or len(self.buckets) > self.MAX_KEYS:
            self.buckets.clear()
            self.entries = cache
        self.n = len(cache)
        return self.buckets.get(key, ())

    def add(self, key, entry) -> None:
        self.buckets.setdefault(key, []).append(entry)


def bounded(original: Callable, policy: cache.CachePolicy, bindings: ModuleBindings | None) -> Callable:
    """``original`` (thunder's per-call function) where a miss past the cache bound (``CacheLimitReached``, raised
    by the per-call path when ``policy.on_miss`` refuses a new entry) runs ``policy.eager`` instead; a module's tables
    refreshed first (``ModuleBindings``). A call made while a user's ``TorchDispatchMode`` is active also runs
    ``policy.eager``, as torch.compile runs such a call: the mode sees exactly the operations eager shows it (the
    compiled program would show it others: for a subclass, the flattened operations on its inner tensors), and
    nothing is traced or cached."""
    from thunder.core.trace import is_tracing

    @functools.wraps(original)
    def bounded_call(*args, **kwargs):
        if is_user_dispatch_mode_active() and not is_tracing():
            return policy.eager(*args, **kwargs)
        if bindings is not None:
            bindings.refresh()
        try:
            return original(*args, **kwargs)
        except CacheLimitReached:
            return policy.eager(*args, **kwargs)

    return bounded_call


def _trace(call: Callable, args: tuple, kwargs: dict, rejection: BaseException | None):
    """A miss traces as thunder traces it (no automatic dynamic shapes)."""
    return call(*args, **kwargs)


def compiled_call(jfn, fn: Callable, policy: cache.CachePolicy, *, automatic_dynamic: bool,
                  graph_break_jit: Callable | None = None, disk_cache=None):
    """What ``thunder_subclass.jit`` hands the user for ``jfn`` (``thunder.jit``'s result for ``fn``): the one place
    the per-call wrappers are composed. A call runs through them in this order:

    1. graph breaks (``graph_breaks.with_graph_breaks``, when ``graph_break_jit`` is given: ``fullgraph=False``): a
       call thunder cannot trace whole runs the user's code eagerly with compiled regions;
    2. the remembered call (``_thunder_internals.remembering_calls``): while it runs, this thread's current compiled
       call, for a ``create_graph=True`` backward (``thunder_subclass.transforms.higher_order``); folded into the
       fast hit's function where there is one;
    3. the fast hit (``_thunder_internals.fast_call_path``): the entries' prologues tried in :class:`EntryIndex`
       order, a hit's computation run without thunder's wrapper layers (only under the constant-values cache);
    4. at a miss of the fast path, under the tracing lock: :class:`AutomaticDynamicShapes` (``automatic_dynamic``)
       chooses constant or symbolic sizes for the new trace;
    5. the bound (:func:`bounded`): a call under a user's dispatch mode, or a miss ``policy`` refuses (asked by the
       per-call path inside thunder's cache lookup, ``CallPort.on_miss``), runs ``policy.eager``;
    6. thunder's own ``fn_`` (its cache lookup, and tracing at a miss).

    ``disk_cache`` (a ``thunder_subclass.runtime.disk_cache.DiskCache``, or None) is asked at a miss inside thunder's
    cache lookup, before tracing (``CallPort.disk_cache``). The policy (``explain_recompiles`` reads it) and the
    automatic dynamic shapes are kept in the jit's record (``_thunder_internals.jit_record``)."""
    from thunder.core.module import ThunderModule

    cd, cs = getattr(jfn, "_lc_cd", None), getattr(jfn, "_lc_cs", None)
    target = jfn
    if cd is not None and cs is not None:  # (else not a thunder.jit result: handed out as it is)
        module = isinstance(jfn, ThunderModule)
        bindings = ModuleBindings(jfn) if module else None
        call = thunder_call = bounded(jfn._forward_fn if module else jfn, policy, bindings)
        dynamic = AutomaticDynamicShapes(cd, cs) if automatic_dynamic else None
        port = CallPort(  # (held by the compile data: nothing in it holds thunder_call, which holds the compile data)
            on_miss=policy.on_miss,
            trace_miss=dynamic.trace if dynamic is not None else _trace,
            entry_index=EntryIndex(),
            disk_cache=disk_cache,
        )
        fast = fast_call_path(jfn, thunder_call, port, bindings, policy.eager)  # (remembers its calls itself)
        record = jit_record(cd)
        if fast is not None:
            record.dynamic_shapes = dynamic
        target = with_call(jfn, fast if fast is not None else remembering_calls(call, cd, policy.eager))
        record.policy = policy
    if graph_break_jit is not None:
        target = graph_breaks.with_graph_breaks(target, fn, graph_break_jit)
    return target
