"""The per-call path of a compiled function, thunder's side: thunder's cache info and a shorter way to a cache hit.

Every decision on this path (may a miss trace, past the cache bound; does a miss trace with symbolic sizes; which
entries a call tries first) is made above this layer, by ``thunder_subclass.runtime.cache_policy``, and reaches this
module as one :class:`CallPort` per compiled function (as the hooks' :class:`~.plugin_state.Handlers`); this module
knows how to read and run thunder's cache and where the hooks sit.

* ``thunder/__init__.py`` ``_with_cache_info_ctx`` (hook) — for a plugin jit, the per-call cache info groups tensor
  arguments as aliases only when they are the same view (thunder groups any that share a storage and replaces one by
  a reshape of the other: a wrong value for ``f(x[:, :2], x[:, 2:])`` with an in-place op). In the same hook, the
  jit's ``populate_cache_info`` (the closure cell of that name in the ``get_computation_and_inputs`` it decorates) is
  replaced by one that fills the same entries with less work when no autocast, DDP/FSDP or possible alias is involved
  (:func:`_use_fast_populate_cache_info`), and calls thunder's otherwise.
* ``thunder/__init__.py`` ``fn_`` (not a hook: :func:`fast_call_path`, applied by
``thunder_subclass.runtime.cache_policy``
  to what ``thunder.jit`` returns) — calls reach a cache hit through the same steps as thunder's ``fn_`` (cache info,
  prologues under the compile data, computation, connection to autograd, epilogue, grad mode, statistics) without
  its wrapper layers, in one flat function (the remembered call folded in; thunder's trace context read as its
  context variable, :func:`current_trace_reader`; grad mode restored by torch's C setter); everything else
  (autocast, tracing, misses) calls thunder's ``fn_``.

* ``thunder/__init__.py`` ``acquire_initial_trace`` (the closure cell of that name in ``get_computation_and_inputs``,
  replaced in the same hook: :func:`_use_bounded_tracing`) — at a cache miss of a ``thunder_subclass.jit`` function,
  the reasons the entries rejected the call go to its :class:`CallPort`'s ``on_miss``, and past the policy's bound
  the call is not traced (:class:`CacheLimitReached`, caught by the stage's per-call wrapper, which runs it eagerly).
* ``thunder/__init__.py`` ``acquire_initial_trace`` and ``apply_transforms_and_build_cache_entry`` (the closure
  cells of those names, replaced in the same hook: :func:`_use_disk_cache`) — a miss of a jit with an on-disk cache
  (the ``disk_cache`` of its :class:`CallPort`, ``thunder_subclass.runtime.disk_cache``) loads a stored entry instead of
  tracing when one accepts the call, and otherwise hands the entry built from the new trace to the cache to store.
  :func:`trace_anew` runs that miss path on purpose, the jit's cache set aside, for a loaded training entry whose
  backward needs the joint trace (``transforms.tangents.StoredBackwardVariants``).
* ``core/module.py`` ``ThunderModule`` tables of parameters, buffers and submodules (private state, filled once by
  thunder) — kept bound to the module as it is now (``module_bindings.ModuleBindings``, checked first by every call
  here): a parameter or submodule replaced after compiling is what the next call reads.

* tracing (a miss of the fast path) runs with a higher threshold for CPython's youngest garbage-collector generation
  (:func:`fewer_gc_collections`, restored afterwards): fewer collections walking the process's heap during a first
  call.

Owner of state: the fast path keeps the jit's compile data and stats weakly (no cycle through the compiled function)
and the port's index of the cache entries, freed with the compiled function; the :class:`CallPort` lives in the compile
data's one record of plugin state (``jit_record(cd).call_port``, :mod:`.jit_record`).

Threads. Owner of each piece of shared state, and who frees it:

* thunder's cache lookup and tracing (``get_computation_and_inputs``, which appends to the jit's cache and runs the
  interpreter, the plugin's fake runs and the transforms) run under :data:`TRACING_LOCK`, one re-entrant lock for
  the process (thunder's compile data, its autocast stack, the plugin's lazily filled symbol tables are shared by
  every trace): tracing is serialized, cache hits through :func:`fast_call_path` take no lock. A call that
  waited for the lock looks the cache up again, so four threads making the same first call trace once. A miss of
  the fast path takes the lock before the port's ``trace_miss`` runs (automatic dynamic shapes switches the jit's
  cache option there, which a trace reads).
* the compile data's ``is_grad_enabled`` (written by every call's cache info and by traced ``torch.no_grad()``,
  read by thunder's tracing and by thunder's ``fn_`` to restore grad mode after the call) is kept per thread
  (:func:`_per_thread_grad_mode`): a call never sets another thread's grad mode, nor traces with it. The fast path
  restores grad mode from its own call's value.
* thunder's statistics (``thunder.cache_hits``, ``thunder.cache_misses``, ``last_traces``): misses are counted under
  the lock, exactly; a hit's counts are incremented without a lock, so calls racing on one jit can lose an increment,
  and ``last_*`` is the last call of any thread.
* the fast path keeps the jit's compile data and stats weakly (no cycle through the compiled function); the
  undecorated computation/epilogue of a cache entry is kept on the entry's computation function (an attribute),
  freed with the entry.
* an interrupt (``KeyboardInterrupt``, ``SystemExit``, ``GeneratorExit``) raised while tracing reaches the caller as
  itself: thunder's interpreter wraps a ``BaseException`` that escapes an opaque call (a subclass's
  ``__torch_dispatch__``, a lookaside) in ``InterpreterError``, a ``RuntimeError``; the cause is re-raised
  (:func:`_unwrapped_interrupt`). Nothing is half-installed: thunder appends a cache entry only after tracing ends.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from thunder_subclass._thunder_internals import plugin_state
from thunder_subclass._thunder_internals.jit_record import jit_record
from thunder_subclass._thunder_internals.module_bindings import ModuleBindings
from thunder_subclass._thunder_internals.thunder_state import building_entry, undoing_on_trace_failure
from thunder_subclass._thunder_internals.torch_state import is_user_dispatch_mode_active


class _ViewAwareCacheInfo(dict):
    """thunder's per-call cache info (``thunder._cache_info_ctx``) for a plugin jit: thunder groups tensor arguments
    that share a storage as aliases of one another and then replaces all but the first by a reshape of it
    (``core/update_aliases.py`` ``replace_args_with_alias_map``), which is wrong for distinct views of one storage
    (``x[:, :2]`` and ``x[:, 2:]``: the second would read the first's values). Here only arguments that are the same
    view (same storage, offset, and shape and strides, or both contiguous of the same size) are grouped."""

    def __init__(self, args, kwargs):
        super().__init__()
        self._args = (args, kwargs)

    def __setitem__(self, key, value):
        if key == "alias_tensor_indices" and value:
            value = _same_view_groups(*self._args)
        super().__setitem__(key, value)


def _same_view_groups(args, kwargs) -> str:
    from torch.utils._pytree import tree_leaves

    groups: dict = {}
    for i, t in enumerate(tree_leaves((args, kwargs))):
        if type(t) is torch.Tensor and t.layout is torch.strided:
            contiguous = t.is_contiguous()
            view = (t.numel(),) if contiguous else (tuple(t.shape), tuple(t.stride()))
            groups.setdefault((t.untyped_storage().data_ptr(), t.storage_offset(), contiguous, view), []).append(i)
    return "-".join(",".join(map(str, g)) for g in groups.values() if len(g) > 1)


def _hook_with_cache_info_ctx(original):
    # wraps thunder._with_cache_info_ctx, the decorator thunder.jit puts on its per-call function; called inside
    # thunder.jit (its local `cd`, the jit's compile data, tells whether the jit uses the plugin)
    @functools.wraps(original)
    def _with_cache_info_ctx(fn):
        import sys

        import thunder

        jit_locals = sys._getframe(1).f_locals
        cd = jit_locals.get("cd")
        if plugin_state.handlers is None or cd is None or plugin_state.handlers.executor not in getattr(cd, "executors_list", ()):
            return original(fn)
        _per_thread_grad_mode(cd)
        _use_fast_populate_cache_info(fn, jit_locals)
        _use_disk_cache(fn)  # before the bound: a miss past the bound neither loads nor traces
        _use_bounded_tracing(fn)
        _use_entry_self_check(fn)
        cs = jit_locals.get("cs")
        weak_cs = weakref.ref(cs) if cs is not None else (lambda: None)  # (no cycle through the compiled function)

        def cache_info_wrapper(*args, **kwargs):
            # thunder's cache lookup and, on a miss, tracing: one thread at a time (module docstring, "Threads")
            with TRACING_LOCK:
                token = thunder._cache_info_ctx.set(_ViewAwareCacheInfo(args, kwargs))
                _just_built.entry = None
                try:
                    return fn(*args, **kwargs)
                except _interpreter_error() as e:
                    interrupt = _unwrapped_interrupt(e)
                    if interrupt is None:
                        raise
                    raise interrupt.with_traceback(interrupt.__traceback__) from None
                except Exception as e:
                    entry, _just_built.entry = _just_built.entry, None
                    if entry is None or _is_plugin_error(e):
                        raise
                    _drop_entry(weak_cs(), entry)
                    raise _self_check_error(e) from e
                finally:
                    _just_built.entry = None
                    thunder._cache_info_ctx.reset(token)

        return cache_info_wrapper

    return _with_cache_info_ctx


TRACING_LOCK = threading.RLock()
"""Held while a plugin jit looks its cache up through thunder's ``get_computation_and_inputs`` and, on a miss,
traces (and while a backward variant is built, ``thunder_subclass.transforms.tangents``). Process-wide and re-entrant: a
trace that builds another (a nested jit, a backward variant) in the same thread goes on. Never held by a cache hit of
the fast path."""


@functools.cache
def _interpreter_error() -> type:
    from thunder.core.interpreter import InterpreterError

    return InterpreterError


_INTERRUPTS = (KeyboardInterrupt, SystemExit, GeneratorExit)


def _unwrapped_interrupt(e: BaseException) -> BaseException | None:
    """The interrupt (``KeyboardInterrupt``, ``SystemExit``, ``GeneratorExit``) thunder's interpreter wrapped in
    ``e`` (``core/interpreter.py`` ``interpret``: ``raise InterpreterError(msg) from e`` for any ``BaseException``
    that leaves the interpreted call), else None."""
    cause = e.__cause__
    while cause is not None:
        if isinstance(cause, _INTERRUPTS):
            return cause
        if not isinstance(cause, _interpreter_error()):
            return None
        cause = cause.__cause__
    return None


@functools.cache
def _with_per_thread_grad_mode(cls: type) -> type:
    """A subclass of compile-data class ``cls`` whose ``is_grad_enabled`` is a per-thread value (thunder 0.2.6 keeps
    one per jit, ``thunder/common.py`` ``CompileData``; every call writes it, ``thunder/__init__.py``
    ``populate_cache_info``, and ``fn_`` restores grad mode from it after the call)."""

    class PerThreadGradModeCompileData(cls):
        @property
        def is_grad_enabled(self) -> bool:
            return getattr(jit_record(self).grad_mode, "value", True)  # thunder's initial value

        @is_grad_enabled.setter
        def is_grad_enabled(self, value: bool) -> None:
            jit_record(self).grad_mode.value = value

    PerThreadGradModeCompileData.__name__ = PerThreadGradModeCompileData.__qualname__ = cls.__name__
    return PerThreadGradModeCompileData


def _per_thread_grad_mode(cd) -> None:
    """Make compile data ``cd``'s ``is_grad_enabled`` per thread (owned by the thread: a ``threading.local`` on
    ``cd``, each thread's value freed with the thread or with ``cd``)."""
    state = jit_record(cd)
    if state.grad_mode is not None:
        return
    local = threading.local()
    local.value = cd.__dict__.get("is_grad_enabled", True)
    state.grad_mode = local
    cd.__class__ = _with_per_thread_grad_mode(type(cd))
    cd.__dict__.pop("is_grad_enabled", None)


_SCALAR_TYPES = frozenset({int, float, bool, complex, str, type(None)})


def _plain_strided_tensors(args: tuple, kwargs: dict) -> int:
    """How many plain strided tensors thunder's alias grouping would see among the call's arguments (thunder's
    ``tree_flatten`` of ``(args, kwargs)``; taken directly when every argument is a tensor or a scalar)."""
    n = 0
    for t in (*args, *kwargs.values()) if kwargs else args:
        if type(t) is torch.Tensor:
            if t.layout is torch.strided:
                n += 1
        elif type(t) not in _SCALAR_TYPES and not isinstance(t, torch.Tensor):
            from thunder.core.pytree import tree_flatten

            flat, _ = tree_flatten((args, kwargs))
            return sum(1 for x in flat if type(x) is torch.Tensor and x.layout is torch.strided)
    return n


def _default_device_function() -> Callable[[], torch.device]:
    """``torch.get_default_device`` with a shorter common case: with no torch function mode active and no global
    default device set (``torch._GLOBAL_DEVICE_CONTEXT``, which ``torch.set_default_device`` fills), it returns
    ``torch.device("cpu")``, as torch's function does then (``torch/__init__.py``, torch 2.10-2.15); otherwise it is
    torch's function."""
    context = getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None)
    modes = getattr(torch._C, "_len_torch_function_stack", None)
    get_default_device = torch.get_default_device
    if context is None or modes is None:
        return get_default_device
    cpu = torch.device("cpu")

    def default_device() -> torch.device:
        if modes() or getattr(context, "device_context", None) is not None:
            return get_default_device()
        return cpu

    return default_device


def _use_fast_populate_cache_info(get_computation_and_inputs, jit_locals: dict) -> None:
    """For a plugin jit, thunder's ``populate_cache_info`` (a local function of ``thunder.jit`` that
    ``get_computation_and_inputs`` calls through its closure cell of that name, every call) is replaced by one that
    fills the same cache info with less work in the common case: no autocast, no DDP/FSDP, in-place alias updates on.
    There it skips thunder's alias grouping (a pytree flatten and one ``untyped_storage()`` per tensor, whose
    non-empty result :class:`_ViewAwareCacheInfo` recomputes anyway) when fewer than two plain tensors are passed,
    which cannot alias, and reads thunder's DDP/FSDP flags (``use_ddp``/``use_fsdp``, which thunder's transforms set
    on the instance) from the instance's dict where the class defines neither. Every other case calls thunder's
    function. The common case is also the replacement's attribute ``common_cache_info(args, kwargs, grad)`` (the
    entries as a new dict, or None where thunder's function is needed), which :func:`fast_call_path` calls directly.
    Left as is when the closure is not as expected."""
    code = get_computation_and_inputs.__code__
    if "populate_cache_info" not in code.co_freevars or get_computation_and_inputs.__closure__ is None:
        return
    cell = get_computation_and_inputs.__closure__[code.co_freevars.index("populate_cache_info")]
    original = cell.cell_contents
    options = jit_locals.get("compile_options") or {}
    user_fn = jit_locals.get("fn")
    grad_mode = jit_record(jit_locals["cd"]).grad_mode  # the compile data's per-thread is_grad_enabled
    if options.get("skip_inplace_alias_updates", False) or not callable(original) or grad_mode is None:
        return
    get_default_dtype, get_default_device, is_grad_enabled = (
        torch.get_default_dtype, _default_device_function(), torch.is_grad_enabled
    )
    autocast = torch.is_autocast_enabled  # ("cpu") is torch.is_autocast_cpu_enabled() without its deprecation path

    is_module = isinstance(user_fn, torch.nn.Module)
    flags_on_instance = type(getattr(user_fn, "__dict__", None)) is dict and not any(
        hasattr(type(user_fn), n) for n in ("use_ddp", "use_fsdp"))
    if flags_on_instance and (not is_module or type(user_fn).__getattr__ is torch.nn.Module.__getattr__):
        def data_parallel() -> bool:
            # thunder's getattr(fn, "use_ddp"/"use_fsdp", False): its DDP/FSDP transforms set them on the instance (a
            # module's getattr of a missing name raises and formats an AttributeError, ~1 us each)
            get = user_fn.__dict__.get
            if get("use_ddp") or get("use_fsdp"):
                return True
            if is_module:  # what nn.Module.__getattr__ would find under those names: thunder's function decides
                for table in (user_fn._parameters, user_fn._buffers, user_fn._modules):
                    if table and ("use_ddp" in table or "use_fsdp" in table):
                        return True
            return False
    else:
        def data_parallel() -> bool:
            return bool(getattr(user_fn, "use_ddp", False) or getattr(user_fn, "use_fsdp", False))

    def common_cache_info(args: tuple, kwargs: dict, grad: bool) -> dict | None:
        # the cache info thunder's function makes when autocast is off (the caller checked), without DDP/FSDP and
        # with fewer than two plain tensors (nothing to alias); None otherwise
        if _plain_strided_tensors(args, kwargs) > 1 or data_parallel():
            return None
        grad_mode.value = grad  # (thunder's cd.is_grad_enabled = ..., per thread: _per_thread_grad_mode)
        # the entries thunder's function sets, in its order ("" for alias_tensor_indices: no two tensors to alias)
        return {"default_dtype": get_default_dtype(), "default_device": get_default_device(),
                "is_autocast_enabled": False, "alias_tensor_indices": "", "is_grad_enabled": grad,
                "no_grad_sync": False}

    def populate_cache_info(cache_info, *args, **kwargs):
        if autocast() or autocast("cpu"):
            return original(cache_info, *args, **kwargs)
        info = common_cache_info(args, kwargs, is_grad_enabled())
        if info is None:  # may alias (thunder's grouping, then _ViewAwareCacheInfo's), or DDP/FSDP
            return original(cache_info, *args, **kwargs)
        dict.update(cache_info, info)

    populate_cache_info.common_cache_info = common_cache_info  # (fast_call_path's shorter way, same entries)
    populate_cache_info.__wrapped__ = original
    cell.cell_contents = populate_cache_info


class CacheLimitReached(Exception):
    """Raised inside thunder's ``get_computation_and_inputs`` at a cache miss of a ``thunder_subclass.jit`` function
    whose :class:`CallPort` forbids a new entry; the per-call wrapper of the stage above catches it
    (``thunder_subclass.runtime.cache_policy.bounded``)."""


@dataclasses.dataclass(frozen=True)
class CallPort:
    """What the per-call path of one compiled function asks the stage above it
    (``thunder_subclass.runtime.cache_policy``, which makes every decision; this module knows only thunder's side), kept
    in the jit's compile data (``call_port`` of its :class:`~thunder_subclass._thunder_internals.jit_record.JitRecord`):

    * ``on_miss(call, n_entries, reasons)``: at a miss inside thunder's cache lookup (call number ``call``,
      ``n_entries`` entries, ``reasons[i]`` why each rejected the call, newest first), whether a new entry may be
      traced; False: :class:`CacheLimitReached` is raised instead of tracing (the cache bound).
    * ``trace_miss(call, args, kwargs, rejection)``: a miss of the fast path (``rejection``: what the newest entry's
      prologue raised, or None): trace by ``call`` (the per-call function the fast path falls back to), run under
      :data:`TRACING_LOCK` with :func:`fewer_gc_collections` (the automatic-dynamic-shapes decision is made inside).
    * ``entry_index``: the order the fast path tries entries in: ``key(args, kwargs, grad)`` of a call,
      ``bucket(cache, key)`` (the entries to try first, last hit last), ``add(key, entry)`` (an entry found outside
      the bucket accepted a call of that key).
    * ``disk_cache``: the jit's on-disk cache (``thunder_subclass.runtime.disk_cache``), or None:
    :func:`_use_disk_cache`.

    Kept in the jit's one record of plugin state (:func:`~thunder_subclass._thunder_internals.jit_record.jit_record`),
    beside the per-thread grad mode its compile-data class reads (:func:`_per_thread_grad_mode`).
    """

    on_miss: Callable[[int, int, list], bool]
    trace_miss: Callable[[Callable, tuple, dict, Any], Any]
    entry_index: Any
    disk_cache: Any = None


def _use_bounded_tracing(get_computation_and_inputs) -> None:
    """For a plugin jit, thunder's ``acquire_initial_trace`` (a local function of ``thunder.jit`` that
    ``get_computation_and_inputs`` calls through its closure cell of that name at each cache miss, after every entry's
    prologue rejected the call) is replaced by one that first asks the jit's :class:`CallPort` (``call_port`` of its
    compile data's ``jit_record``, set by :func:`fast_call_path`; none for ``thunder.compile(..., plugins=...)``): it
    hands the port's ``on_miss`` the reason each entry rejected the call (the prologues run again, their messages
    built now: a miss traces, which costs far more), and raises :class:`CacheLimitReached` instead of tracing when the
    port says the cache is full. The trace is made under ``thunder_state.undoing_on_trace_failure``: if it raises,
    what it did to the caller's objects is undone (input lists and dicts the traced code changed). Left as is when the
    closure is not as expected."""
    code = get_computation_and_inputs.__code__
    if "acquire_initial_trace" not in code.co_freevars or get_computation_and_inputs.__closure__ is None:
        return
    cell = get_computation_and_inputs.__closure__[code.co_freevars.index("acquire_initial_trace")]
    original = cell.cell_contents
    if not callable(original):
        return

    def acquire_initial_trace(fn, args, kwargs, cd, cs, *rest, **kwrest):
        port = jit_record(cd).call_port
        if port is not None and not port.on_miss(cs.calls, len(cs.interpreter_cache),
                                                 _rejections(cd, cs, args, kwargs)):
            raise CacheLimitReached()
        with undoing_on_trace_failure():
            return original(fn, args, kwargs, cd, cs, *rest, **kwrest)

    acquire_initial_trace.__wrapped__ = original
    cell.cell_contents = acquire_initial_trace


class _LoadedEntry:
    """What :func:`_use_disk_cache`'s ``acquire_initial_trace`` returns in place of the prologue trace when the
    on-disk cache gave a cache entry: its ``apply_transforms_and_build_cache_entry`` hands the entry on as built."""

    __slots__ = ("entry",)

    def __init__(self, entry):
        self.entry = entry


def _use_disk_cache(get_computation_and_inputs) -> None:
    """For a plugin jit with an on-disk cache (``disk_cache`` of its :class:`CallPort`: an object with ``load(cd, cs,
    args, kwargs)`` -> a thunder ``CacheEntry`` whose prologue accepts the call, or None, and ``store(cd, cs, args,
    kwargs, entry, codes)``; ``thunder_subclass.runtime.disk_cache``), thunder's ``acquire_initial_trace`` and
    ``apply_transforms_and_build_cache_entry`` (local functions of ``thunder.jit`` that ``get_computation_and_inputs``
    calls through closure cells of those names at each cache miss, one after the other) are replaced: at a miss under
    the constant-values cache, an entry loaded from disk is used as if just built (thunder then appends it to the
    jit's cache and runs its prologue, as for a new trace); otherwise the call traces as before, with the code objects
    the interpreter ran recorded (:func:`.tracing.recording_interpreted_code`), and the entry built from the traces is
    handed to ``store``. Left as is when the closure is not as expected."""
    from thunder.core.options import CACHE_OPTIONS

    from thunder_subclass._thunder_internals.tracing import recording_interpreted_code

    code = get_computation_and_inputs.__code__
    names = ("acquire_initial_trace", "apply_transforms_and_build_cache_entry")
    if get_computation_and_inputs.__closure__ is None or not all(n in code.co_freevars for n in names):
        return
    acquire_cell, build_cell = (get_computation_and_inputs.__closure__[code.co_freevars.index(n)] for n in names)
    acquire, build = acquire_cell.cell_contents, build_cell.cell_contents
    if not callable(acquire) or not callable(build):
        return
    pending = threading.local()  # this thread's traced call, from acquire_initial_trace to the entry built

    def acquire_initial_trace(fn, args, kwargs, cd, cs, *rest, **kwrest):
        port = jit_record(cd).call_port
        disk = None if port is None else port.disk_cache
        if disk is None or cd.cache_option is not CACHE_OPTIONS.CONSTANT_VALUES or getattr(_anew, "on", False):
            pending.call = None
            return acquire(fn, args, kwargs, cd, cs, *rest, **kwrest)
        entry = disk.load(cd, cs, args, kwargs)
        if entry is not None:
            pending.call = None
            return _LoadedEntry(entry), None, None
        with recording_interpreted_code() as codes:
            traces = acquire(fn, args, kwargs, cd, cs, *rest, **kwrest)
        pending.call = (disk, args, kwargs, codes)
        return traces

    def apply_transforms_and_build_cache_entry(cd, cs, cache_info, prologue_trc, *rest, **kwrest):
        if type(prologue_trc) is _LoadedEntry:
            entry = prologue_trc.entry
            cs.last_prologue_traces, cs.last_traces = entry.prologue_traces, entry.computation_traces
            cs.last_epilogue_traces, cs.last_backward_traces = entry.epilogue_traces, entry.backward_traces
            return entry
        call, pending.call = getattr(pending, "call", None), None
        with building_entry():
            entry = build(cd, cs, cache_info, prologue_trc, *rest, **kwrest)
        if call is not None:
            disk, args, kwargs, codes = call
            disk.store(cd, cs, args, kwargs, entry, codes)
        return entry

    acquire_initial_trace.__wrapped__ = acquire
    apply_transforms_and_build_cache_entry.__wrapped__ = build
    acquire_cell.cell_contents = acquire_initial_trace
    build_cell.cell_contents = apply_transforms_and_build_cache_entry


_anew = threading.local()  # .on: this thread traces a call again (trace_anew): the disk cache is not asked


def trace_anew(cd, cs, eager: Callable | None, args: tuple, kwargs: dict, *, grad: bool):
    """A new cache entry of the plugin jit with compile data ``cd`` (statistics ``cs``) for a call with ``args`` /
    ``kwargs``, traced now as at a cache miss (thunder's ``get_computation_and_inputs`` with the plugin's hooks,
    under grad mode ``grad``, the call being this thread's current compiled call as in :func:`remembering_calls`),
    though an entry of the jit may accept the call. Meanwhile the jit's cache is set aside (restored afterwards, with
    the statistics' last traces; the miss is counted) and its on-disk cache neither loads nor stores. For a loaded
    entry whose backward needs the joint trace (``tangents.StoredBackwardVariants``)."""
    last = ("last_traces", "last_prologue_traces", "last_epilogue_traces", "last_backward_traces", "last_prologue")
    with TRACING_LOCK:
        cache, saved = cs.interpreter_cache, {n: getattr(cs, n, None) for n in last}
        grad_before = cd.is_grad_enabled
        cs.interpreter_cache = []
        _anew.on = True
        plugin_state.push_call(cd, eager, args, kwargs)
        try:
            with torch.set_grad_enabled(grad):
                entry, _, _ = cd.get_computation_and_inputs(*args, **kwargs)
        finally:
            plugin_state.pop_call()
            _anew.on = False
            cs.interpreter_cache = cache
            cd.is_grad_enabled = grad_before
            for n, v in saved.items():
                setattr(cs, n, v)
    return entry


_just_built = threading.local()  # .entry: the cache entry this thread's call just built, until its first prologue ran


def _use_entry_self_check(get_computation_and_inputs) -> None:
    """thunder's ``apply_transforms_and_build_cache_entry`` (the closure cell of that name, called at a miss right
    before ``get_computation_and_inputs`` runs the new entry's prologue on the call it was traced from) is replaced
    by one that remembers the entry for this thread: an exception that then leaves ``get_computation_and_inputs``
    came from that first prologue run, a trace that rejects its own inputs (a plugin bug that would otherwise reach the
    user as a guard failure, e.g. an attribute recorded as missing that eager found). The per-call wrapper raises
    ``TraceSelfCheckError`` for it, naming the failing check. Left as is when the closure is not as expected."""
    code = get_computation_and_inputs.__code__
    name = "apply_transforms_and_build_cache_entry"
    if get_computation_and_inputs.__closure__ is None or name not in code.co_freevars:
        return
    cell = get_computation_and_inputs.__closure__[code.co_freevars.index(name)]
    build = cell.cell_contents
    if not callable(build):
        return

    def apply_transforms_and_build_cache_entry(*args, **kwargs):
        entry = build(*args, **kwargs)
        _just_built.entry = entry
        return entry

    apply_transforms_and_build_cache_entry.__wrapped__ = build
    cell.cell_contents = apply_transforms_and_build_cache_entry


def _is_plugin_error(e: BaseException) -> bool:
    from thunder_subclass.errors import TensorSubclassError

    return isinstance(e, TensorSubclassError)  # a typed error a check raises on purpose (not a rejection)


def _drop_entry(cs, entry) -> None:
    cache = getattr(cs, "interpreter_cache", None) or []
    for i in range(len(cache) - 1, -1, -1):
        if cache[i] is entry:
            del cache[i]
            return


def _self_check_error(e: BaseException):
    from thunder_subclass.errors import TraceSelfCheckError

    return TraceSelfCheckError(
        f"thunder_subclass made a trace from this call whose own prologue rejects the call: {type(e).__name__}: {e}. "
        "This is a bug in thunder_subclass (the trace recorded something about the inputs that does not hold for "
        "them); the entry was dropped. Please report it with this message and a small program that reproduces it. "
        "Meanwhile, call this function, or the module holding the code the check names, without compiling it."
    )


def _rejections(cd, cs, args, kwargs) -> list[str]:
    """Why each cache entry (newest first) rejects the call: the first message of its prologue's exception."""
    from thunder.core.compile_data import compile_data_and_stats

    reasons = []
    with compile_data_and_stats(cd, cs):
        for entry in reversed(cs.interpreter_cache):
            try:
                entry.prologue_fn(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - the reason, whatever the prologue raised
                reasons.append(str(e) or type(e).__name__)
            else:
                reasons.append("accepted (the state it checks changed since)")
    return reasons


@functools.cache
def _trace_decorator_codes() -> tuple:
    """The code objects of the two decorators thunder puts on generated computation and epilogue functions
    (``core/trace.py`` ``python_callable``: ``@torch.no_grad()`` then ``@no_autocast``)."""
    from thunder.executors.torchex import no_autocast

    sample = torch.no_grad()(no_autocast(lambda: None))
    return sample.__code__, sample.__wrapped__.__code__


def _undecorated(fn):
    """``fn`` without thunder's ``@torch.no_grad() @no_autocast`` when it has exactly those: in the fast path grad mode
    and autocast (CPU and CUDA) are already off, so they do nothing but cost two wrapper calls; else ``fn``."""
    no_grad_code, no_autocast_code = _trace_decorator_codes()
    inner = getattr(fn, "__wrapped__", None)
    if not _same_code(getattr(fn, "__code__", None), no_grad_code) \
            or not _same_code(getattr(inner, "__code__", None), no_autocast_code):
        return fn
    return getattr(inner, "__wrapped__", fn)


def _same_code(code, sample) -> bool:
    """``code`` is the decorator's code ``sample`` is: the same object, or (torch 2.15 gives each function its
    ``no_grad`` wrapper a code object of its own, renamed) the same place and bytecode."""
    return code is sample or (code is not None and code.co_filename == sample.co_filename
                              and code.co_firstlineno == sample.co_firstlineno and code.co_code == sample.co_code)


# attribute of a cache entry's computation function: (computation, epilogue) without their no-grad/no-autocast
# decorators, and whether both had them (owned by the entry: freed with it)
_PLAIN_FNS_ATTR = "_thunder_subclass_undecorated"


# the youngest generation's collection threshold while a plugin jit traces (CPython's default: 700)
TRACING_GC_THRESHOLD = 20_000


@contextlib.contextmanager
def fewer_gc_collections():
    """While a call traces: CPython's cyclic garbage collector collects its youngest generation every
    :data:`TRACING_GC_THRESHOLD` allocations instead of every 700 (and the older generations as rarely in proportion).
    Tracing allocates millions of short-lived objects while the process holds a large heap (torch, the model), and each
    older-generation collection walks it: measured on a tiny int8 Llama's first call, ~0.13 s of collections per
    decoder layer (550 collections at 6 layers), ~0.04 s with this. The thresholds in force are restored afterwards,
    also when tracing raises; a collector the user disabled (or set to 0) is left alone. Process-wide, as CPython's
    thresholds are: another thread allocating meanwhile collects less often too, for the trace's duration."""
    import gc

    old = gc.get_threshold()
    if not gc.isenabled() or old[0] == 0 or old[0] >= TRACING_GC_THRESHOLD:
        yield
        return
    gc.set_threshold(TRACING_GC_THRESHOLD, *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def current_trace_reader() -> Callable[[Any], Any]:
    """thunder's current trace as one C call: ``reader(None)`` is ``thunder.core.trace.get_tracectx()`` (the trace
    being built, or None), the ``get`` of its context variable ``_tracectx``; thunder's function where that variable
    is not found. ``reader(None) is not None`` is thunder's ``is_tracing()`` without its two Python frames."""
    from thunder.core import trace as thunder_trace

    tracectx = getattr(thunder_trace, "_tracectx", None)
    if isinstance(tracectx, contextvars.ContextVar):
        return tracectx.get
    return lambda default: thunder_trace.get_tracectx()


def fast_call_path(jfn, thunder_call: Callable, port: CallPort, bindings: ModuleBindings | None,
                   eager: Callable | None = None) -> Callable | None:
    """The calls of ``jfn`` (a plugin jit's ``thunder.jit`` result, function or ``ThunderModule``) by a shorter path
    to a cache hit than thunder 0.2.6's ``fn_`` (``thunder/__init__.py``), or None where it does not apply (a cache
    option other than constant values). The same steps for the same result — the per-call cache info (this jit's
    ``populate_cache_info``, in thunder's cache-info context), the cache entries' prologues under the jit's compile
    data, the hit's computation, its connection to autograd when the entry has a backward (thunder's
    ``connect_to_autograd`` with the arguments thunder's ``maybe_connect_to_autograd`` passes), the epilogue, the grad
    mode restored, and thunder's statistics (calls, cache hits, last traces) — without thunder's layers of wrappers
    around them (call statistics, language context, cache-info context, the timers and the per-call copy of the cache
    entry of ``decorate_computation_function``). An entry without a backward runs its computation and epilogue without
    their ``no_grad``/``no_autocast`` decorators (:func:`_undecorated`: autocast is off on this path), with grad mode
    turned off around both when the call has it on. Calls while tracing, under autocast or
    a user's dispatch mode go to ``thunder_call`` (thunder's ``fn_`` under the stage's bound); a call no entry's
    prologue accepts (a cache miss) goes to ``port.trace_miss``, under :data:`TRACING_LOCK`. Every call, whichever
    way it goes, is this thread's current compiled call while it runs (as :func:`remembering_calls` makes it, with
    ``eager``; folded in here: one function per call, not two).

    One flat function per call: what can be read once is read when the path is built (thunder's and torch's
    functions, the compile options, the entry index, the per-thread grad mode's storage); the cache info of the
    common case comes from the plugin's ``populate_cache_info``'s ``common_cache_info`` as a new dict
    (:func:`_use_fast_populate_cache_info`), other calls fill a :class:`_ViewAwareCacheInfo` through the jit's function.

    The decisions are the stage's, through ``port`` (:class:`CallPort`, kept in the compile data's ``jit_record``
    also where this path does not apply, for :func:`_use_bounded_tracing`): the order entries are tried in
    (``port.entry_index``, so that a hit's cost does not grow with the number of entries), how a miss traces. A
    module's parameter, buffer and submodule tables follow the module (``bindings``: :class:`ModuleBindings`)."""
    import thunder
    from thunder.core.compile_data import (
        reset_compile_data_and_stats,
        set_compile_data_and_stats,
    )
    from thunder.core.options import CACHE_OPTIONS

    cd, cs = jfn._lc_cd, jfn._lc_cs
    jit_record(cd).call_port = port
    original = thunder_call
    populate = getattr(cd, "populate_cache_info", None)
    if cd.cache_option is not CACHE_OPTIONS.CONSTANT_VALUES or populate is None:
        return None
    import weakref

    from thunder.executors.torch_autograd import connect_to_autograd

    # what thunder.jit reads from its compile options once, for its maybe_connect_to_autograd
    disable_split_autograd = bool(cd.compile_options.get("thunderfx_disable_split_autograd", False))
    is_differentiable_outputs = cd.compile_options.get("is_differentiable_outputs", None)
    weak_cd, weak_cs = weakref.ref(cd), weakref.ref(cs)  # no reference cycle through the compiled function
    # grad mode restored after a call: torch.set_grad_enabled's own C setter (torch.set_grad_enabled is a class whose
    # construction sets it, through two Python frames)
    set_grad_enabled = getattr(torch._C, "_set_grad_enabled", torch.set_grad_enabled)
    is_grad_enabled = torch.is_grad_enabled
    autocast = torch.is_autocast_enabled
    dispatch_modes = torch._C._len_torch_dispatch_stack
    cache_info_ctx = thunder._cache_info_ctx
    common_cache_info = getattr(populate, "common_cache_info", None)
    # where the common case does not apply (possible aliases, DDP/FSDP), the plugin's populate_cache_info calls
    # thunder's: called directly here (autocast is off on this path)
    other_cache_info = populate if common_cache_info is None else getattr(populate, "__wrapped__", populate)
    current_trace = current_trace_reader()
    calls = plugin_state.this_thread_calls  # (a threading.local: .stack, the compiled calls running in this thread)

    index = port.entry_index
    call_key = index.key
    trace_call = port.trace_miss

    def trace(args, kwargs, rejection=None):
        # a miss: under the tracing lock, also the automatic-dynamic decision (it switches the jit's shared cache
        # option, which a trace in another thread reads); `rejection`: what the newest entry's prologue raised
        with TRACING_LOCK, fewer_gc_collections():
            return trace_call(original, args, kwargs, rejection)

    @functools.wraps(original)
    def fast_call(*args, **kwargs):
        try:
            stack = calls.stack
        except AttributeError:
            stack = calls.stack = []
        cd = weak_cd()
        stack.append((cd, eager, args, kwargs))  # this thread's current compiled call (as remembering_calls)
        try:
            cs = weak_cs()
            if autocast("cpu") or autocast() or cs is None or current_trace(None) is not None or (
                    dispatch_modes() and is_user_dispatch_mode_active()):
                return original(*args, **kwargs)
            if bindings is not None:
                bindings.refresh()
            cache = cs.interpreter_cache
            if not cache:
                return trace(args, kwargs)
            grad = is_grad_enabled()  # this call's grad mode, restored after it (never the compile data's)
            info = None if common_cache_info is None else common_cache_info(args, kwargs, grad)
            if info is None:
                info = _ViewAwareCacheInfo(args, kwargs)
                token = cache_info_ctx.set(info)
                try:
                    other_cache_info(info, *args, **kwargs)
                except BaseException:
                    cache_info_ctx.reset(token)
                    raise
            else:
                token = cache_info_ctx.set(info)
            try:
                hit = rejection = None
                newest = cache[-1]
                key = call_key(args, kwargs, grad)
                bucket = index.bucket(cache, key)
                data_token = set_compile_data_and_stats(cd, cs)  # thunder's compile_data_and_stats
                try:
                    # the entries that accepted calls like this one, last hit first
                    for i in range(len(bucket) - 1, -1, -1):
                        entry = bucket[i]
                        try:
                            inps, pro_to_epi = entry.prologue_fn(*args, **kwargs)
                        except Exception as e:
                            if entry is newest:
                                rejection = e
                            continue
                        hit = entry
                        if i != len(bucket) - 1:
                            try:  # another thread may have moved entries since: any permutation is a valid order
                                bucket.append(bucket.pop(i))
                            except IndexError:
                                pass
                        break
                    else:  # then the others, newest first (as thunder's get_computation_and_inputs)
                        for entry in reversed(cache):
                            if any(entry is e for e in bucket):
                                continue
                            try:
                                inps, pro_to_epi = entry.prologue_fn(*args, **kwargs)
                            except Exception as e:
                                if entry is newest:
                                    rejection = e
                                continue
                            hit = entry
                            index.add(key, entry)
                            break
                finally:
                    reset_compile_data_and_stats(data_token)
            finally:
                cache_info_ctx.reset(token)
            if hit is None:
                return trace(args, kwargs, rejection)
            cs.calls += 1
            cs.cache_hits += 1
            cs.last_traces = hit.computation_traces
            cs.last_interpreted_instructions = None
            cs.last_interpreter_log = None
            cs.last_prologue_traces = hit.prologue_traces
            cs.last_prologue = hit.prologue_fn
            if hit.backward_fn is not None:
                # thunder's fn_: the computation (under its no_grad), connected to autograd, epilogue. (An entry with
                # a backward can accept a call under no_grad: its computation returns what autograd is connected
                # with.)
                data_for_autograd, (saved_tensors, saved_other) = hit.computation_fn(*inps)
                connect_to_autograd(  # thunder's maybe_connect_to_autograd
                    backward_fn=hit.backward_fn, flat_args=data_for_autograd["flat_args"],
                    flat_output=data_for_autograd["flat_output"], saved_tensors=saved_tensors,
                    saved_other=saved_other, return_none_instead_of_grads=hit.return_none_instead_of_grads,
                    disable_split_autograd=disable_split_autograd,
                    is_differentiable_outputs=is_differentiable_outputs,
                )
                result = hit.epilogue_fn(*pro_to_epi, *data_for_autograd["output"])
            else:
                # the computation and epilogue without their @torch.no_grad() @no_autocast (autocast is off here):
                # grad mode turned off around both instead, when it is on (what each decorator does in turn)
                comp = hit.computation_fn
                fns = getattr(comp, _PLAIN_FNS_ATTR, None)
                if fns is None:  # set once per entry (racing threads set equal values)
                    plain_comp, plain_epi = _undecorated(comp), _undecorated(hit.epilogue_fn)
                    fns = (plain_comp, plain_epi, plain_comp is not comp and plain_epi is not hit.epilogue_fn)
                    setattr(comp, _PLAIN_FNS_ATTR, fns)
                if not grad:
                    result = fns[1](*pro_to_epi, *fns[0](*inps))
                elif fns[2]:  # both had the decorators
                    set_grad_enabled(False)
                    try:
                        result = fns[1](*pro_to_epi, *fns[0](*inps))
                    finally:
                        set_grad_enabled(True)
                else:
                    result = hit.epilogue_fn(*pro_to_epi, *comp(*inps))
            set_grad_enabled(grad)
            cs.last_computation = hit.computation_fn
            return result
        finally:
            stack.pop()

    jit_record(cd).fast_call = True
    return fast_call


def with_call(jfn, call: Callable):
    """``jfn`` (a ``thunder.jit`` result) calling ``call`` instead: the ``ThunderModule`` with ``call`` as its
    ``_forward_fn``, or ``call`` carrying thunder's ``_lc_*`` attributes (``thunder.compile_stats`` and friends read
    them)."""
    from thunder.core.module import ThunderModule

    if isinstance(jfn, ThunderModule):
        jfn._forward_fn = call
        return jfn
    for name in ("_lc_cd", "_lc_cs", "_lc_transforms"):
        if hasattr(jfn, name):
            setattr(call, name, getattr(jfn, name))
    return call


def remembering_calls(call: Callable, cd, eager: Callable | None) -> Callable:
    """``call`` that, while it runs, is this thread's current compiled call (``plugin_state.push_call``): the thunder
    forward it runs remembers the user-level call on its autograd node, for a ``create_graph=True`` backward that
    recomputes it eagerly (``thunder_subclass.transforms.higher_order``)."""
    push, pop = plugin_state.push_call, plugin_state.pop_call

    @functools.wraps(call)
    def remembered_call(*args, **kwargs):
        push(cd, eager, args, kwargs)
        try:
            return call(*args, **kwargs)
        finally:
            pop()

    return remembered_call


def hook_targets() -> list[tuple[Any, str, Callable]]:
    import thunder

    return [(thunder, "_with_cache_info_ctx", _hook_with_cache_info_ctx)]
