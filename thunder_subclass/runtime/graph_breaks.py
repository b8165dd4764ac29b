"""Stage 2 (per call) for programs thunder cannot trace whole: graph breaks at module boundaries, and eager calls inside
regions.

In: a function or module given to ``thunder_subclass.jit`` (without ``fullgraph=True``) and the arguments of a call.
What happens: the call is traced whole; where tracing fails with a graph-break kind, the program runs as regions
(below).
Out: the call's result, equal to eager: from the whole program compiled as one trace when it traces, else from the
program's own Python run eagerly with each submodule compiled as a *region*, recursively.

thunder's interpreter traces a whole function or none of it. When tracing a call fails with an error of a
*graph-break kind* (:func:`graph_break_reason`: a value that depends on tensor data decides Python control flow or an
output's shape — ``if tensor:``, ``.item()`` / ``.tolist()`` feeding a branch, ``nonzero``, single-argument
``torch.where(mask)``, boolean masks, ``unique`` — or an operation thunder has no symbol for), the callable's own code
runs eagerly instead:

* a module (or a module's bound method, as in ``model.forward = thunder_subclass.jit(model.forward)``) runs its own
  ``forward`` eagerly, and each call of a child in that thread, for the duration of the call, runs a compiled
  function in place of its ``forward`` (the child itself when it defines ``forward``, else — ``ModuleList``,
  ``ModuleDict`` — its children): a per-thread dispatch read by the plugin's hook of ``Module._call_impl``
  (``_thunder_internals.module_dispatch``), so nothing is set on the user's modules and other threads see nothing; a
  child with forward or backward hooks runs as it is (its own code eagerly, hooks around it). A child that fails in
  turn runs its own code eagerly the same way, so every submodule that traces is one compiled region;
* a plain function runs eagerly: one break, no region.

A module whose *own* code holds the break and whose eager run was observed pure becomes an *eager call* from then on
(``eager_calls.py``): one operation of its parent's trace, which runs it eagerly and checks what it returned. The
first eager run of a module that broke is *plain* when the break was raised in the ``forward`` of a submodule class
not observed yet (``_holder_class``, from the interpreted frames): its code runs as in eager, nothing compiled, and
that class's calls are observed (forward hooks, removed after). Otherwise (and in :func:`explaining`, and when a
module's own code holds the break) its children are compiled as above, and a module none of whose children broke at
its break's location is observed. The callables that broke before an observation are traced once more on their next
call (``_Taken.generation``), so a parent that broke only because of the child compiles around it; a mismatch at run
time (:class:`~thunder_subclass.runtime.eager_calls.EagerCallMismatch`) runs the parent eagerly instead, with the result
the child already gave (it does not run again), and drops the
observation.

Children of one class share one jitted function (the module is its first argument), so N identical blocks trace
once; ``thunder.last_traces(report.regions["model.layers.0"])`` shows a region's traces. Everything crossing a break
is a real value: subclass outputs of a region are subclass tensors in the eager code and are flattened again by the
next region's prologue; gradients flow through each region's autograd function and the eager code between them.

The decision is made once per callable (a module instance, or the function) and input signature (tensor types,
ranks, dtypes, devices, ``requires_grad``; Python scalars by value; the grad mode) and cached: a later call with the
same signature runs the eager path without tracing again (sizes are left out: a generate loop's growing cache would
otherwise retry the whole model every step), a call with another signature tries a whole trace again. Running the
eager path is never wrong (it is the program itself), so the cache needs no finer guard.

Only the known graph-break kinds fall back; any other error (a subclass's dispatch error, a missing grad rule) is
raised as before. ``fullgraph=True`` turns the fallback off: the first break raises its error, as today.

A warning (:class:`GraphBreakWarning`, once per break location and compiled object) names each break: the user's
file:line where tracing stopped, the reason, the callables that ran eagerly, and the number of compiled regions.
``compiled.graph_breaks`` (a :class:`GraphBreakReport` of the latest call) and ``thunder_subclass.explain`` list them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import sys
import threading
import traceback
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch

from thunder_subclass.runtime import eager_calls
from thunder_subclass.runtime.eager_call_state import rng_state, set_rng_state
from thunder_subclass._thunder_internals import (
    current_trace_reader,
    data_dependent_exception_types,
    dispatching,
    exception_source_lines,
    jit_record,
    record_of,
    refused_by_thunder_operator,
    with_call,
)
from thunder_subclass.errors import (
    UnsupportedBackwardEffectError,
    UnsupportedAliasedWriteError,
    UnsupportedCheckpointError,
    UnsupportedGlobalStateError,
)

__all__ = [
    "GraphBreak",
    "GraphBreakReport",
    "GraphBreakWarning",
    "graph_break_reason",
    "with_graph_breaks",
    "explaining",
    "suppressed_warnings",
]


class GraphBreakWarning(UserWarning):
    """A compiled program ran as several compiled regions with eager code between them (see ``graph_breaks``)."""


@dataclasses.dataclass(frozen=True)
class GraphBreak:
    """One callable that ran its own code eagerly: ``name`` (``""`` for the compiled object itself, else the
    submodule's qualified name), ``location`` (the user's file:line where tracing stopped) and ``reason``."""

    name: str
    location: str
    reason: str


@dataclasses.dataclass
class GraphBreakReport:
    """Breaks and regions of the latest call of a compiled object (``compiled.graph_breaks``).

    ``breaks``: the callables that ran eagerly, outermost first. ``regions``: qualified name -> jitted function of
    each submodule that ran compiled (regions of one class share one function; ``thunder.last_traces`` of it
    gives its traces). When the program traced whole, ``breaks`` is empty and ``regions`` is ``{"": compiled}``.
    ``region_calls``: how many times a compiled region ran in the call (a region called in an eager loop counts
    once per iteration; torch.compile's counterpart is how many of its graphs one call runs).
    """

    breaks: list[GraphBreak] = dataclasses.field(default_factory=list)
    regions: dict[str, Callable] = dataclasses.field(default_factory=dict)
    region_calls: int = 0

    @property
    def compiled_functions(self) -> list[Callable]:
        """The distinct jitted functions behind ``regions`` (regions of one class share one); the sum of their
        ``thunder.cache_misses`` is the number of traces, torch.compile's counterpart being its graph count."""
        return list({id(f): f for f in self.regions.values()}.values())

    @property
    def locations(self) -> dict[str, list[GraphBreak]]:
        """The breaks grouped by where tracing stopped (one entry per break in the program's source)."""
        grouped: dict[str, list[GraphBreak]] = {}
        for b in self.breaks:
            grouped.setdefault(b.location, []).append(b)
        return grouped

    def __str__(self) -> str:
        lines = [f"{len(self.locations)} graph break(s), {len(self.regions)} compiled region(s) "
                 f"({len(self.compiled_functions)} compiled function(s), {self.region_calls} region call(s))"]
        for location, breaks in self.locations.items():
            names = ", ".join(repr(b.name) if b.name else "<top>" for b in breaks)
            lines.append(f"  break at {location}: {breaks[0].reason} (ran eagerly: {names})")
        for name in self.regions:
            lines.append(f"  region {name or '<top>'}")
        return "\n".join(lines)


_MESSAGE_KINDS = (
    # thunder's proxies in a Python branch: TensorProxy.__bool__ and friends ("... (data dependency)")
    (NotImplementedError, "data dependency"),
    # thunder's boolean-mask indexing ("... (the result would be of unknown shape)")
    (NotImplementedError, "unknown shape"),
    # thunder has no symbol for the torch function (code it cannot run; Dynamo would run it in its graph or break)
    (NotImplementedError, "but it is not yet supported"),
    # single-argument torch.where(condition) (nonzero(condition, as_tuple=True): indices whose count depends on data)
    (NotImplementedError, "does not support only specifying a condition"),
    # .tolist() on a fake tensor: the Python list depends on tensor data
    (RuntimeError, ".tolist() is not supported"),
    # a tensor method or attribute thunder's proxies lack (x.register_hook(...), x.untyped_storage()): code it cannot
    # run (eager runs it; on a real tensor that lacks it, eager raises the same AttributeError itself)
    (AttributeError, "Unknown attribute "),
)
# and an argument one of thunder's operators refuses where eager accepts it (``generator=``, ``out=``,
# ``ceil_mode=True``...): ``_thunder_internals.refused_by_thunder_operator``


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _break_exception(exc: BaseException) -> BaseException | None:
    """The exception that reports the break ``exc`` carries, or None when ``exc`` is not of a graph-break kind.

    The first exception of the chain (``exc``, then what it was raised from or while handling) that is of a
    graph-break kind, taken with the exceptions that wrap it explicitly (``raise ... from``: the plugin's typed error
    around fake execution's exception). An exception that merely arose while it propagated (a ``with`` block's
    ``__exit__`` or a ``finally`` block that failed because of it; it is ``__context__`` only) is not the break:
    eager runs that code again, so a genuine error there still reaches the user."""
    dependent = (*data_dependent_exception_types(), UnsupportedGlobalStateError, UnsupportedBackwardEffectError,
                 UnsupportedCheckpointError, UnsupportedAliasedWriteError)
    chain = list(_chain(exc))
    for i, e in enumerate(chain):
        message = str(e)
        if isinstance(e, dependent) or any(isinstance(e, t) and s in message for t, s in _MESSAGE_KINDS) \
                or refused_by_thunder_operator(e):
            while i > 0 and chain[i - 1].__cause__ is chain[i]:
                i -= 1
            return chain[i]
    return None


def graph_break_reason(exc: BaseException) -> str | None:
    """``"<type>: <message>"`` when ``exc`` (or an exception it was raised from or while handling) is of a
    graph-break kind — fake execution's data-dependence exceptions, thunder's data-dependence errors, an operation
    thunder cannot trace — else None (the error is the user's or the plugin's and is raised). The message is the one
    of the exception that reports the break (:func:`_break_exception`)."""
    e = _break_exception(exc)
    if e is None:
        return None
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return f"{type(e).__name__}: {first if len(first) <= 200 else first[:200] + '...'}"


_OWN_DIRS = tuple(
    os.path.dirname(m.__file__) + os.sep
    for m in (__import__("thunder"), torch, __import__("thunder_subclass"))
)


def _is_user_file(filename: str) -> bool:
    return not filename.startswith(_OWN_DIRS) and not filename.startswith("<")


def _user_location(exc: BaseException) -> str:
    """file:line of the innermost user frame (outside thunder, torch and thunder_subclass) where the break's exception
    was raised: the line where it entered each interpreted frame, recorded while tracing (also when a ``with`` block
    or ``finally`` re-raised it later, or another exception replaced it there), else the innermost such traceback
    frame (thunder's interpreter puts the interpreted user frames into the traceback), else "an unknown source line"."""
    exc = _break_exception(exc) or exc
    for filename, lineno in exception_source_lines(exc):
        if _is_user_file(filename):
            return f"{filename}:{lineno}"
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if _is_user_file(frame.filename):
            return f"{frame.filename}:{frame.lineno}"
    return "an unknown source line"


def _caller_stacklevel() -> int:
    """``warnings.warn``'s stacklevel of the first frame outside thunder, torch, thunder_subclass and contextlib: the
    user's call."""
    frame, level = sys._getframe(1), 1
    while frame is not None and (frame.f_code.co_filename.startswith(_OWN_DIRS)
                                 or frame.f_code.co_filename == contextlib.__file__):
        frame, level = frame.f_back, level + 1
    return level


def _signature(v: Any) -> Any:
    if isinstance(v, torch.Tensor):  # no sizes: whether code is data-dependent does not depend on them
        return (type(v), v.dim(), v.dtype, v.device, v.requires_grad)
    if isinstance(v, torch.nn.Module):
        return ("module", id(v))
    if isinstance(v, (tuple, list)):
        return (type(v), tuple(_signature(x) for x in v))
    if isinstance(v, dict):
        return (type(v), tuple((k, _signature(x)) for k, x in v.items()))
    if v is None or isinstance(v, (bool, int, float, str)):
        return (type(v), v)
    return type(v)


def _call_signature(args: tuple, kwargs: dict) -> Any:
    return (torch.is_grad_enabled(), _signature(args), _signature(kwargs))


def _defines_forward(m: torch.nn.Module) -> bool:
    return type(m).forward is not torch.nn.Module.forward  # ModuleList / ModuleDict have none


def _is_stateless_leaf(m: torch.nn.Module) -> bool:
    """Inside an eager call it runs as it is, where a compiled region of it would cost more per call than its own run
    and fuse nothing: no parameters, buffers or children (an activation, a dropout: about 50-170 us against 5-15 us on
    CPU, once per routed expert), or one of torch.nn's own leaf modules over plain tensors (``nn.Linear``,
    ``nn.LayerNorm``, ``nn.Embedding``: one torch call each; an expert's ``Linear`` cost 4.6x eager as a region in
    benchmarks/bench_features.py). A leaf holding subclass tensors is still compiled (eager dispatch of a subclass
    is the slower path)."""
    if m._modules:
        return False
    if not (m._parameters or m._buffers):
        return True
    return type(m).__module__.startswith("torch.nn.modules.") and all(
        t is None or type(t) in (torch.Tensor, torch.nn.Parameter) for t in (*m._parameters.values(), *m._buffers.values()))


def _child_regions(module: torch.nn.Module, prefix: str, skip_stateless: bool = False):
    """(qualified name, submodule) of the children whose ``forward`` is replaced while ``module`` runs eagerly; with
    ``skip_stateless`` (an eager call's module), not those that are stateless leaves."""
    for name, child in module.named_children():
        qualified = f"{prefix}.{name}" if prefix else name
        if _defines_forward(child):
            if not (skip_stateless and _is_stateless_leaf(child)):
                yield qualified, child
        else:
            yield from _child_regions(child, qualified, skip_stateless)


@dataclasses.dataclass
class _Taken:
    """A cached fallback decision: the break, the program's observation count when it was taken, whether it was
    traced again since, and whether its next eager run may still be observed."""

    graph_break: GraphBreak
    generation: int
    retried: bool = False
    observable: bool = True
    holder: type | None = None  # the submodule class whose own code raised the break, to observe in a plain run


def _root_module(owner: Any) -> torch.nn.Module | None:
    if isinstance(owner, torch.nn.Module):
        return owner
    module = getattr(owner, "__self__", None)
    return module if isinstance(module, torch.nn.Module) else None


def _forward_codes(cls: type) -> list:
    """The code objects of ``cls.forward`` and of the functions it wraps (``functools.wraps`` decorators)."""
    codes, fn, seen = [], getattr(cls, "forward", None), set()
    while fn is not None and id(fn) not in seen:
        seen.add(id(fn))
        code = getattr(fn, "__code__", None)
        if code is not None:
            codes.append(code)
        fn = getattr(fn, "__wrapped__", None)
    return codes


def _holder_class(module: torch.nn.Module, exc: BaseException) -> type | None:
    """The class among ``module``'s submodules (itself included) whose own ``forward`` the break ``exc`` was raised in:
    the innermost interpreted frame that is in such a forward's lines, or None."""
    lines = exception_source_lines(_break_exception(exc) or exc)
    if not lines:
        return None
    spans = []
    for cls in {type(m) for m in module.modules()}:
        for code in _forward_codes(cls):
            numbers = [n for _, _, n in code.co_lines() if n is not None]
            if numbers:
                spans.append((cls, code.co_filename, min(numbers), max(numbers)))
    for filename, lineno in lines:
        for cls, file, first, last in spans:
            if filename == file and first <= lineno <= last:
                return cls
    return None


class _Program:
    """The graph-break state of one compiled object: the jitted functions of its submodules' classes (created on the
    first break that needs them), the cached fallback decisions, the report of the latest call and the break
    locations already warned about. Owned by the compiled object (freed with it)."""

    def __init__(self, jit: Callable[[Callable], Callable], label: str):
        self.jit = jit  # thunder_subclass.jit with the user's options and fullgraph=True
        self.label = label
        self.shared: dict[Any, Callable] = {}  # (class, forward) -> jitted forward (module as first argument)
        self.broken: dict[Any, _Taken] = {}  # (id of the callable, signature) -> the break it took
        self.broken_owners: set[int] = set()  # ids of the callables with an entry in ``broken``
        self.report = GraphBreakReport()
        self.warned: set[str] = set()
        self.depth = 0
        self.quiet = False
        self.plain_first_runs = True  # off for explain(): its one call compiles the children as regions
        self.observing: list[type] = []  # holder classes observed in plain runs during the current call
        # eager calls inside compiled regions (eager_calls.py): observed pure eager runs of modules that broke, by
        # call kind; the module classes among them; a count bumped at each new observation (a callable that broke
        # before it is traced again once, now that a child can be an eager call); observation keys that mismatched
        self.observed: dict[Any, eager_calls.Observation] = {}
        self.observed_types: set[type] = set()
        self.generation = 0
        self.dropped: set[Any] = set()
        self.regions_with_eager_calls: set[int] = set()  # ids of jitted functions whose traces hold eager calls
        self._this_thread = threading.local()  # .eager_called: ids of the modules an eager call of this thread is
        #                                        running (their stateless leaves run as they are)

    @property
    def eager_called(self) -> set[int]:
        called = getattr(self._this_thread, "eager_called", None)
        if called is None:
            called = self._this_thread.eager_called = set()
        return called

    def run(self, key_owner: Any, name: str, compiled: Callable, eager: Callable, args: tuple, kwargs: dict,
            region: Callable | None = None):
        """``compiled(*args, **kwargs)`` unless this callable and signature broke before or breaks now; then
        ``eager(*args, **kwargs)`` (the callable's own code with its children compiled). ``region``: the jitted
        function to list in the report (default ``compiled``). The signature is computed only for callables that
        broke before or break now (nothing added to a call of a program that traces whole)."""
        taken = None
        replay = None  # an eager call's result whose check failed: the eager run below uses it
        region = compiled if region is None else region
        broken_key = None  # (id of the callable, signature), computed once where needed
        if id(key_owner) in self.broken_owners:
            broken_key = (id(key_owner), _call_signature(args, kwargs))
            taken = self.broken.get(broken_key)
            if taken is not None and taken.generation < self.generation and not taken.retried \
                    and type(key_owner) not in self.observed_types:
                taken.retried = True  # a child can now be an eager call in its trace: trace it once more
                taken = None
        if taken is None:
            with_calls = id(region) in self.regions_with_eager_calls
            rng = rng_state() if with_calls else None
            # the region's module, for eager calls its trace may record (once a run was observed) or holds
            module = _root_module(key_owner) if with_calls or self.observed else None
            try:
                if module is None:
                    result = compiled(*args, **kwargs)
                else:
                    with eager_calls.root_scope(eager_calls.Root(self, module, name, region)):
                        result = compiled(*args, **kwargs)
            except eager_calls.EagerCallMismatch as e:
                # an eager call returned what the trace did not assume: nothing after it ran, nothing was written
                # back; run this callable eagerly, and no longer record that kind of call as one operation
                if rng is not None:
                    set_rng_state(rng)
                replay = e.replay
                self.dropped.add(eager_calls.spec_key(e.spec_id))
                self.observed.pop(eager_calls.spec_key(e.spec_id), None)
                taken = _Taken(GraphBreak(name, eager_calls.spec_location(e.spec_id),
                                          f"EagerCallMismatch: {e}"), self.generation)
                self.broken[broken_key or (id(key_owner), _call_signature(args, kwargs))] = taken
                self.broken_owners.add(id(key_owner))
            except Exception as e:
                reason = graph_break_reason(e)
                if reason is None:
                    raise
                taken = _Taken(GraphBreak(name, _user_location(e), reason), self.generation)
                if isinstance(eager, _ModuleCode) and self.plain_first_runs:
                    taken.holder = self._unobserved_holder(eager.module, e)
                self.broken[broken_key or (id(key_owner), _call_signature(args, kwargs))] = taken
                self.broken_owners.add(id(key_owner))
            else:
                if broken_key is not None:  # it traced again (a child is an eager call now)
                    self.broken.pop(broken_key, None)
                self.report.regions[name] = region
                self.report.region_calls += 1
                return result
        self.report.breaks.append(taken.graph_break)
        code = eager if isinstance(eager, _ModuleCode) else None
        if code is not None and taken.holder is not None:
            # the first eager run of a module whose break a submodule class holds: its code runs as in eager, the
            # holder's calls observed (eager calls from the next call on: this module traces again then, around
            # them); should that not work out, later eager runs compile its children as regions
            holder, taken.holder = taken.holder, None
            self.observing.append(holder)
            with self._observing(code.module, holder):
                return eager(*args, **kwargs)
        observe = code is not None and taken.observable
        before = eager_calls.snapshot(code.module, args, kwargs) if observe else None
        first = len(self.report.breaks)
        with self._children_compiled(code, name), eager_calls.replaying(replay):
            result = eager(*args, **kwargs)
        if observe:
            taken.observable = False
            # only a module whose own code holds the break (no child broke at its location) can be an eager call
            if not any(b.location == taken.graph_break.location for b in self.report.breaks[first:]):
                self._observe(code.module, before, args, kwargs, result)
        return result

    def _unobserved_holder(self, module: torch.nn.Module, exc: BaseException) -> type | None:
        """The class of ``module``'s strict submodules whose own ``forward`` the break ``exc`` was raised in (the
        innermost such frame), when no call of that class was observed yet, else None."""
        holder = _holder_class(module, exc)
        return None if holder is None or holder in self.observed_types or holder is type(module) else holder

    @contextlib.contextmanager
    def _observing(self, module: torch.nn.Module, holder: type):
        """Observe (``_observe``) each call of a submodule of class ``holder`` of ``module`` while the block runs."""
        pending: dict[int, list] = {}  # per thread (another thread may run the module meanwhile)

        def before(m, args, kwargs):
            pending.setdefault(threading.get_ident(), []).append(eager_calls.snapshot(m, args, kwargs))

        def after(m, args, kwargs, result):
            self._observe(m, pending[threading.get_ident()].pop(), args, kwargs, result)

        handles = []
        try:
            for m in module.modules():
                if type(m) is holder:
                    handles.append(m.register_forward_pre_hook(before, with_kwargs=True))
                    handles.append(m.register_forward_hook(after, with_kwargs=True))
            yield
        finally:
            for h in handles:
                h.remove()

    def _observe(self, module: torch.nn.Module, before, args: tuple, kwargs: dict, result) -> None:
        """Record the eager run of ``module`` (it broke) for eager calls in its parents' traces (once per kind)."""
        key = eager_calls.observe_key(module, args, kwargs, torch.is_grad_enabled(), proxy=False)
        if key is None or key in self.observed or key in self.dropped:
            return
        observation = eager_calls.record_observation(before, args, kwargs, result)
        if observation is not None:
            self.observed[key] = observation
            self.observed_types.add(type(module))
            self.generation += 1

    def call_eagerly(self, module: torch.nn.Module, qualified: str, args: tuple, kwargs: dict):
        """``module(*args, **kwargs)`` from an eager call inside a compiled region: ``Module.__call__`` and its hooks,
        its own code eagerly (it broke), its children compiled but for stateless leaves (``_is_stateless_leaf``)."""
        with dispatching(module, self._compiled_child(module, qualified)):
            self.eager_called.add(id(module))
            try:
                return module(*args, **kwargs)
            finally:
                self.eager_called.discard(id(module))

    @contextlib.contextmanager
    def _children_compiled(self, code: _ModuleCode | None, name: str):
        with contextlib.ExitStack() as installed:
            skip = code is not None and id(code.module) in self.eager_called
            for qualified, child in _child_regions(code.module, name, skip) if code is not None else ():
                installed.enter_context(dispatching(child, self._compiled_child(child, qualified)))
            yield

    def _compiled_child(self, child: torch.nn.Module, qualified: str) -> Callable:
        own = child.__dict__.get("forward")  # a forward set on the instance (another wrapper): compiled alone
        if own is not None:
            key, forward, bound = ("instance", id(child)), own, True
        else:
            forward = type(child).forward
            key, bound = (type(child), forward), False
        jfn = self.shared.get(key)
        if jfn is None:
            jfn = self.shared[key] = self.jit(forward)
        code = _ModuleCode(child, forward, bound)

        def forward_with_breaks(*args, **kwargs):
            if bound:
                return self.run(child, qualified, jfn, code, args, kwargs)
            return self.run(child, qualified, functools.partial(jfn, child), code, args, kwargs, jfn)

        return forward_with_breaks

    @contextlib.contextmanager
    def quiet_calls(self):
        quiet, self.quiet = self.quiet, True
        try:
            yield
        finally:
            self.quiet = quiet

    def call(self, owner: Any, compiled: Callable, code: Callable, args: tuple, kwargs: dict,
             region: Callable | None = None):
        """A call of the compiled object: a fresh report (the same object, ``compiled.graph_breaks``), the program
        run, and the warning for new break locations."""
        outer = self.depth == 0
        if outer:
            self.report.breaks.clear()
            self.report.regions.clear()
            self.report.region_calls = 0
            self.observing = []
        self.depth += 1
        try:
            return self.run(owner, "", compiled, code, args, kwargs, region)
        finally:
            self.depth -= 1
            if outer and self.report.breaks and not self.quiet:
                self._warn_new_breaks()

    def _warn_new_breaks(self) -> None:
        new = {loc: bs for loc, bs in self.report.locations.items() if loc not in self.warned}
        if not new:
            return
        self.warned.update(new)
        lines = [
            f"thunder_subclass.jit({self.label}) could not trace the program as one graph; it ran as "
            f"{len(self.report.regions)} compiled region(s) with the code at {len(self.report.locations)} graph "
            f"break(s) run eagerly:"
        ]
        for location, breaks in new.items():
            names = ", ".join(repr(b.name) if b.name else "<top>" for b in breaks)
            lines.append(f"  {location}: {breaks[0].reason} (ran eagerly: {names})")
        if self.observing:
            held = ", ".join(sorted({cls.__qualname__ for cls in self.observing}))
            lines.append(f"This call ran the code around the break(s) eagerly and observed the calls of {held}, "
                         f"which hold them; the next call traces the program again with those calls run eagerly "
                         f"inside it.")
        lines.append("`compiled.graph_breaks` or thunder_subclass.explain(fn, *args) lists breaks and regions; "
                     "pass fullgraph=True to raise at the first break instead.")
        warnings.warn("\n".join(lines), GraphBreakWarning, stacklevel=_caller_stacklevel())


class _ModuleCode:
    """A module's own code, called eagerly: ``forward`` (bound, or unbound with the module first)."""

    def __init__(self, module: torch.nn.Module, forward: Callable, bound: bool):
        self.module, self.forward, self.bound = module, forward, bound

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs) if self.bound else self.forward(self.module, *args, **kwargs)


class _FunctionCode:
    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def _label(fn: Any) -> str:
    if isinstance(fn, torch.nn.Module):
        return type(fn).__name__
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def with_graph_breaks(jfn: Callable, fn: Callable, jit: Callable[[Callable], Callable]) -> Callable:
    """``jfn`` (``thunder_subclass.jit(fn, fullgraph=True)``'s result: a function or a ``ThunderModule``) whose calls
    fall back to graph breaks (module docstring). ``jit`` compiles a submodule's forward with the same options and
    ``fullgraph=True``. Returns the object to hand to the user, carrying ``graph_breaks``."""
    from thunder.core.module import ThunderModule

    current_trace = current_trace_reader()  # (thunder's is_tracing() is current_trace(None) is not None)
    program = _Program(jit, _label(fn))
    if isinstance(jfn, ThunderModule):
        model = jfn._model
        code: Callable = _ModuleCode(model, model.__call__, True)  # the root's hooks run eagerly with it
        compiled_call, owner = jfn._forward_fn, model
    else:
        module = getattr(fn, "__self__", None)
        if isinstance(module, torch.nn.Module):  # model.forward: its children can be regions
            code = _ModuleCode(module, fn, True)
        else:
            code = _FunctionCode(fn)
        compiled_call, owner = jfn, fn

    @functools.wraps(compiled_call)
    def call_with_breaks(*args, **kwargs):
        if current_trace(None) is not None:  # called from inside another trace: no fallback there
            return compiled_call(*args, **kwargs)
        return program.call(owner, compiled_call, code, args, kwargs, jfn)  # thunder.cache_misses(jfn) works

    call_with_breaks.__wrapped__ = getattr(compiled_call, "__wrapped__", compiled_call)  # thunder's own fn_

    target = with_call(jfn, call_with_breaks)
    object.__setattr__(target, "graph_breaks", program.report)  # a plain attribute, also on nn.Module
    # (thunder's compile data, shared by every wrapper of the jit; weak: see JitRecord.graph_breaks)
    jit_record(target._lc_cd).graph_breaks = weakref.ref(program)
    return target


@contextlib.contextmanager
def explaining(compiled: Any):
    """A context in which calls of ``compiled`` warn about no break and a new break compiles the children of the
    module that took it as regions at once (the report then lists them), instead of first running that module's
    code plainly while observing the submodule that holds the break."""
    program = _program_of(compiled)
    plain, program.plain_first_runs = program.plain_first_runs, False
    try:
        with program.quiet_calls():
            yield
    finally:
        program.plain_first_runs = plain


def _program_of(compiled: Any) -> _Program:
    record = record_of(compiled)
    program = None if record is None else record.graph_break_program()
    if program is None:
        raise TypeError(f"{compiled!r} is not a thunder_subclass.jit result with graph breaks enabled (it was "
                        f"compiled with fullgraph=True, or not by thunder_subclass.jit)")
    return program


def suppressed_warnings(compiled: Any):
    """A context in which calls of ``compiled`` (a :func:`with_graph_breaks` result) warn about no break."""
    return _program_of(compiled).quiet_calls()
