"""What every hook shares: the :class:`Handlers` the plugin installed and whether a plugin jit is active.

The hooks (:mod:`.tracing`, :mod:`.runtime`, :mod:`.autograd_hooks`, :mod:`.fixes`,
:mod:`.symbolic_values`) know thunder's side of each hook only; what a hook does for the plugin is a :class:`Handlers`
callback that ``thunder_subclass.hooks`` (the layer above the stages) passes to :func:`.install.install`, kept here as
:data:`handlers`. A hook acts only while a jit that uses the plugin is tracing or transforming
(:func:`is_plugin_active`: its executor list holds ``thunder_subclass``'s executor); every other ``thunder.jit`` in
the process behaves as if the hooks were absent.

Owner of state: :data:`handlers` and :data:`hooks_installed` are set by :func:`.install.install` /
:func:`.install.uninstall` (process-wide, one plugin); the activity answer is remembered for one compile data, weakly.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import Any

NOT_HANDLED = object()  # a handler's answer meaning "thunder's own behaviour applies"


@dataclasses.dataclass(frozen=True)
class Handlers:
    """What the hooks call while a plugin jit traces or transforms (see the module docstring for each hook).

    * ``executor``: the plugin's executor; its presence in a jit's executor list switches the hooks on.
    * ``proxify(jit_ctx, value, original)``: a proxy for the tensor ``value`` (a wrapped value) of a plugin jit.
    * ``symbol_call(sym, args, kwargs)``: the result of a torch-level symbol call, or ``NOT_HANDLED``; also called
      for the prims listed in ``prim_ids`` (thunder's alias bookkeeping for in-place ops: ``prims.update_aliases``).
    * ``plain_symbol_result(sym, args, kwargs, result)``: called after thunder recorded a torch-level symbol the
      plugin did not handle (e.g. to set its outputs' ``requires_grad`` as eager would).
    * ``new_alias(proxy)``: the proxy thunder's in-place alias pass makes for a new version of ``proxy``
      (``core/update_aliases.py`` ``_get_new_alias``), or ``NOT_HANDLED``.
    * ``lookaside(fn, wrapped_args)``: a lookaside for ``fn`` (as thunder's ``general_jit_lookaside`` returns),
      or None.
    * ``before_executors(trace)``: the trace executors will claim.
    * ``differentiable_outputs(compiled_backward)``: which outputs of a thunder forward call are differentiable
      (a tuple of bools), or None for thunder's default (all).
    * ``replace_grads(compiled_backward, grads)``: the incoming gradients of a thunder backward call, changed,
      or None to keep them.
    * ``run_backward(compiled_backward, grads, take_saved_tensors, call)``: the input gradients of a backward the
      plugin runs instead of thunder's compiled one, or ``NOT_HANDLED``; ``take_saved_tensors()`` releases the saved
      tensors to it; ``call`` is the :class:`RememberedCall` its forward ran for (or None).
    * ``mutated_inputs(compiled_backward)``: pairs (position in a thunder forward call's ``flat_args``, position in
      its ``flat_output``) of the inputs changed in place and their new values (``grads_for_mutated_inputs``), or
      ``()``.
    * ``gradless_inputs(compiled_backward, grads)``: of those, the ones whose gradient is undefined for these
      incoming gradients (``None`` where nothing used a new value), or ``()``.
    * ``create_graph_backward(compiled_backward, call, grads)``: called instead of a thunder backward call that runs
      with grad mode on (``torch.autograd.grad(..., create_graph=True)``, ``.backward(create_graph=True)``): thunder's
      backward is once-differentiable, its gradients carry no autograd history, so a loss on them would silently lose
      its second-order term. ``call`` is the :class:`RememberedCall` its forward ran for (or None); the handler
      returns the gradient of each flat argument (with history), ``NOT_HANDLED`` (thunder's backward runs), or raises
      a typed error.
    * ``input_object(value, provenance)``: the interpreter met ``value``, read from the inputs by ``provenance`` (one
      the prologue can unpack), while a plugin jit traces (to guard Python objects thunder does not check).
    * ``native_call(fn, wrapped_args)``: the interpreter is about to run ``fn`` natively (not interpreted) with these
      wrapped arguments.
    * ``compared(op, a, b)``: the interpreter is about to compare the values ``a`` and ``b`` natively (``op``:
      ``"is"`` for ``is`` / ``is not``, ``"=="`` for the rich comparisons, ``"in"`` for ``a in b``): the trace
      depends on their identity or value.
    * ``attribute_absent(value, provenance, name)``: traced code looked for attribute ``name`` of ``value`` (read
      from the inputs by ``provenance``) and did not find it (``getattr`` with a default, ``hasattr``, a caught
      ``AttributeError``).
    * ``state_query(fn, args, result)``: traced code asked torch for a piece of its global state (a getter of
      ``torch._C``, e.g. ``torch.are_deterministic_algorithms_enabled()``'s ``_get_deterministic_algorithms``) with
      plain arguments and got the plain value ``result``, which the trace now holds as a constant.
    * ``end_of_trace()``: the traced code has run (the computation trace is complete), the epilogue is being made:
      the plugin's last calls for the epilogue (``thunder_state.call_in_epilogue``).
    * ``nested_int_source(v)``: the compiled function returns nested int ``v`` (a jagged NestedTensor's ragged size):
      ``(provenance, dim, factor)`` of the input it is read from at run time (``size(dim) * factor`` of that input,
      or with ``dim`` None its registered nested int: a plain offsets input), or None.
    """

    executor: Any
    proxify: Callable
    symbol_call: Callable
    plain_symbol_result: Callable
    prim_ids: frozenset
    new_alias: Callable
    lookaside: Callable
    before_executors: Callable
    differentiable_outputs: Callable
    replace_grads: Callable
    run_backward: Callable
    mutated_inputs: Callable
    gradless_inputs: Callable
    create_graph_backward: Callable
    input_object: Callable
    native_call: Callable
    compared: Callable
    end_of_trace: Callable
    attribute_absent: Callable
    state_query: Callable
    nested_int_source: Callable


# the Handlers given to the last install(); read by every hook (as plugin_state.handlers)
handlers: Handlers | None = None
# whether the hooks are in place now (install() sets it, uninstall() clears it)
hooks_installed = False
# the attribute (True) marking a function install() put in thunder's place (interpreter_speed reads it)
HOOK_MARK = "_thunder_subclass_hook"


class _PluginActivity:
    """Whether the plugin's executor is in a compile data's executor list, remembered for the compile data last asked
    about (weakly: a jit's compile data holds the user's model). The hooks ask on every interpreted call; the answer
    changes only with the compile data (``CompileData.executors_list`` is a tuple set once, ``thunder/common.py``)."""

    def __init__(self):
        from thunder.core.compile_data import _compile_data

        self.compile_data_var = _compile_data
        # (weak reference to the compile data last asked about, the handlers installed then, the answer), replaced as
        # one tuple so that a thread never reads one jit's answer with another's compile data
        self.last = (lambda: None, None, False)

    def __call__(self) -> bool:
        cd = self.compile_data_var.get()[0]
        if cd is None:
            return False
        ref, seen, active = self.last
        if ref() is cd and seen is handlers:
            return active
        active = handlers is not None and handlers.executor in cd.executors_list
        self.last = (weakref.ref(cd), handlers, active)
        return active


_activity: _PluginActivity | None = None  # made on the first question (it imports thunder)


def is_plugin_active() -> bool:
    """True while a jit that uses thunder_subclass traces or transforms (reads thunder's current compile data)."""
    global _activity
    if handlers is None:
        return False
    if _activity is None:
        _activity = _PluginActivity()
    return _activity()


# How each lazily made symbol of the plugin's executor can be made again in another process: the implementation
# function a trace's Python context holds -> (the factory, its arguments), and each such symbol's implementation by
# symbol id. Filled by the factories (``flatten_<Cls>``, ``unflatten_<Cls>``, aten-level symbols, ...) when they make
# a symbol; read by the on-disk cache (``thunder_subclass.runtime.disk_cache``), which names such a function by its factory and
# arguments. Process-wide, as the executor's symbol table it mirrors (symbols are never unregistered).
_symbol_origins: dict[Any, tuple[Callable, tuple]] = {}
_implementations: dict[str, Callable] = {}


def remember_symbol_origin(sym: Any, fn: Callable, factory: Callable, args: tuple = ()) -> None:
    """Record that ``factory(*args)`` returns ``sym``, a symbol run by ``fn`` (see :func:`symbol_origin`)."""
    _symbol_origins[fn] = (factory, args)
    _implementations[sym.id] = fn


def is_hashable(x) -> bool:
    """Whether ``x`` can be a dict key (a lookaside table's)."""
    try:
        hash(x)
    except TypeError:
        return False
    return True


def symbol_origin(fn: Any) -> tuple[Callable, tuple] | None:
    """``(factory, args)`` recorded for the symbol implementation ``fn``, else None."""
    try:
        return _symbol_origins.get(fn)
    except TypeError:  # unhashable
        return None


def symbol_implementation(sym: Any) -> Callable | None:
    """The implementation recorded for ``sym`` by :func:`remember_symbol_origin`, else None."""
    return _implementations.get(sym.id)


# ---------------------------------------------------------------------------------------------------------------
# The user-level call a compiled forward runs for (for create_graph=True backwards, thunder_subclass.transforms.higher_order)
# ---------------------------------------------------------------------------------------------------------------

class RememberedCall:
    """One call of a compiled function, as its thunder forward saw it: the jit's compile data (``cd``), the function
    or module eager would run (``eager``), the call's arguments with every tensor held weakly (``args``,
    ``kwargs``: ``weakref.ref`` in place of each tensor), the forward's flat tensor arguments, weakly
    (``flat_args``: the inputs the backward returns gradients for), and the version counters of all of them after the
    forward (``versions``). Owner: the autograd graph node of that forward (``ctx``), freed with it; it keeps no
    tensor alive."""

    __slots__ = ("cd", "eager", "args", "kwargs", "flat_args", "versions")

    def __init__(self, cd, eager, args: tuple, kwargs: dict, flat_args: tuple):
        from torch.utils._pytree import tree_flatten, tree_unflatten

        import torch

        def weak(x):
            return weakref.ref(x) if isinstance(x, torch.Tensor) else x

        leaves, spec = tree_flatten((args, kwargs))
        self.args, self.kwargs = tree_unflatten([weak(x) for x in leaves], spec)
        self.cd, self.eager = cd, eager
        self.flat_args = tuple(weak(x) for x in flat_args)
        self.versions = tuple((weakref.ref(x), x._version) for x in (*leaves, *flat_args) if isinstance(x, torch.Tensor))

    def live(self, check_versions: bool = True) -> tuple | None:
        """``(args, kwargs, flat_args)`` with the live tensors, or None if one was freed (or, with ``check_versions``,
        changed in place since the forward)."""
        from torch.utils._pytree import tree_flatten, tree_unflatten

        for ref, version in self.versions:
            t = ref()
            if t is None or (check_versions and t._version != version):
                return None

        def live(x):
            return x() if isinstance(x, weakref.ref) else x

        leaves, spec = tree_flatten((self.args, self.kwargs))
        args, kwargs = tree_unflatten([live(x) for x in leaves], spec)
        return args, kwargs, [live(a) for a in self.flat_args]


_calls = __import__("threading").local()  # .stack: (cd, eager, args, kwargs) of the compiled calls running now
this_thread_calls = _calls  # (runtime.fast_call_path pushes and pops its calls on .stack itself: one frame less)


def push_call(cd, eager, args: tuple, kwargs: dict) -> None:
    """A compiled function's call begins (its per-call wrapper, ``runtime.remembering_calls``)."""
    stack = _calls.__dict__.setdefault("stack", [])
    stack.append((cd, eager, args, kwargs))


def pop_call() -> None:
    _calls.stack.pop()


def current_call_has_grad_inputs() -> bool:
    """Whether a tensor among the arguments (and, for a module, parameters) of the innermost compiled call running in
    this thread (the call being traced) requires grad: thunder then differentiates the trace, also when the traced
    code runs under ``no_grad``."""
    from torch.utils._pytree import tree_flatten

    import torch

    stack = getattr(_calls, "stack", None)
    if not stack:
        return False
    cd, _, args, kwargs = stack[-1]
    module = getattr(cd, "fn", None)  # a compiled module: its parameters are inputs of the trace too
    tensors = [*tree_flatten((args, kwargs))[0],
               *(module.parameters() if isinstance(module, torch.nn.Module) else ())]
    return any(isinstance(x, torch.Tensor) and x.requires_grad for x in tensors)


def current_call(flat_args: tuple) -> RememberedCall | None:
    """The innermost compiled call running in this thread, remembered for a forward with these flat arguments."""
    stack = getattr(_calls, "stack", None)
    if not stack or stack[-1][1] is None:
        return None
    cd, eager, args, kwargs = stack[-1]
    return RememberedCall(cd, eager, args, kwargs, flat_args)
