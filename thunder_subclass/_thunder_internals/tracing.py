"""Tracing hooks: how subclass values become proxies and how torch operations on them reach the plugin.

Hooks (thunder 0.2.6 paths, relative to the installed ``thunder/``):

* ``core/jit_ext.py`` ``JitCtx.proxify`` — a wrapper-subclass value becomes a ``SubclassTensorProxy`` with inner
  proxies and prologue guards, instead of a plain ``TensorProxy`` (``Handlers.proxify``; there is no public proxify
  extension point: ``register_general_jit_callback`` refuses existing keys).
* ``core/symbol.py`` ``Symbol.__call__`` — the common end of ``torch.mul(x)``, ``x.mul()`` and ``x * y`` during
  interpretation: a torch-level symbol called with a subclass proxy is unrolled through ``__torch_dispatch__``
  (``Handlers.symbol_call``: ``thunder_subclass.frontend.interpretation``). Also where every grad rule puts a gradient
  (``prims.put_grad``): a gradient put for a 0-dim tensor with more dimensions than it is summed to its shape
  (:func:`sum_to_scalar_grad`; a thunder 0.2.6 bug, see there). A symbol whose meta raises leaves no symbol scope
  open (thunder pushes one before the meta and pops it after, without ``finally``; the next symbol then failed with
  "A symbol ... was called while processing a primitive", replacing the original error).
* ``core/jit_ext.py`` ``general_jit_lookaside`` — calls of a wrapper-subclass class (construction in traced code),
  ``isinstance`` and ``type`` on subclass proxies behave as in eager (``Handlers.lookaside``); then the lookasides of
  :mod:`.fixes` and :mod:`.symbolic_values`. Two interpreter bugs of thunder 0.2.6 are worked around here
  for plugin jits: classes with a pybind11 base (DTensor placements under torch 2.13) are called as Python, not
  interpreted (:func:`is_pybind11_class`: interpreting their ``__init__`` aborts the process), and a keyword argument
  named ``fn`` no longer collides with the lookaside's own parameter. Plugin functions handed to user code as values
  run as Python (:func:`runs_natively`). A call that no lookaside takes and that the interpreter runs natively (a C
  function or method) hands its arguments to ``Handlers.native_call``: what it reads of them is invisible to the trace.
* ``core/jit_ext.py`` ``general_jit_callbacks`` (the interpreter callbacks of ``thunder_general_jit``, replaced by a
  copy) — its ``WRAP_CALLBACK`` sees every value the interpreter wraps; a value read from the inputs (arguments,
  attributes and items of them, attributes of the compiled module: a provenance the prologue can unpack) goes to
  ``Handlers.input_object`` too, which guards the Python objects thunder leaves unchecked (their type, identity or
  value: ``thunder_subclass.guards.guard_input_object``), and so does a value read from lasting Python state the
  prologue cannot unpack (``type(obj).name``, a module imported inside the traced code: :mod:`.state_reads`).
* ``core/interpreter.py`` ``wrap`` — with provenance tracking thunder hands out the wrapper it made first for an
  object, whatever path reads it again (``f(x, (o, o))``: ``t[1]`` gets ``t[0]``'s wrapper and provenance), so the
  wrap callback sees one path per object; a read of an input object by another path goes to
  ``Handlers.input_object`` too (the object at that path is guarded as well).
* ``core/update_aliases.py`` ``_get_new_alias`` and ``prims.update_aliases`` (through the ``Symbol.__call__`` hook) —
  thunder's bookkeeping for in-place ops makes plain ``TensorProxy(like=x)`` versions of mutated values; a subclass
  value's new version stays a subclass proxy (``Handlers.new_alias``).
* ``core/update_aliases.py`` ``_is_inplace_op`` — a subclass-level bound symbol that writes an inner tensor of its
  first argument (``h.copy_(y)``: torch's ``copy_`` has no IN_PLACE tag) is an in-place op, so later reads of ``h``
  read the new version (:func:`writes_first_subclass_argument`); ``_get_update_bsym`` — a subclass's new version
  requires grad when the value the in-place op made does.
* ``core/interpreter.py`` ``wrap_args_from_list`` — ``f(*args)`` with an iterable that is not a list or tuple (a
  generator: ``torch.nn.utils.parametrize``'s ``ParametrizationList.forward``) fails in thunder's interpreter
  (``len()`` of a generator); it is made a tuple first, as CPython does.
* ``core/interpreter.py`` ``InterpreterFrame.get_or_make_python_frame`` — the made-up CPython frame (user's file,
  line, function) that the interpreter puts into the traceback of every exception leaving an interpreted function is
  made as thunder makes it, in a new thread, but waited for on a lock instead of thunder's busy loop, which holds the
  GIL until the 5 ms switch interval (5 ms per exception; every interpreted ``for`` loop and ``next()`` ends in one).
* ``core/interpreter.py`` module global ``dis`` — the interpreter decodes the bytecode of every frame it runs
  (``_run_frame``); ``dis.get_instructions(code)`` is answered from a cache per code object
  (:class:`_CachedInstructionsDis`), the rest of ``dis`` is the module itself. The same call records the code
  objects run within :func:`recording_interpreted_code` (for the on-disk cache), and the code of the Python functions
  that a natively run callable wraps (``functools.lru_cache``, ``functools.wraps`` decorators, ``partial``).
* ``transforms/prune_prologue_checks.py`` ``PrunePrologueChecks.transform_traces_pre_prologue`` (in
  ``thunder.compile``'s ``BaseRecipe`` and thunder's ``HFTransformers`` recipe) — it asserts ("unexpected symbol
  check_torch_state without inputs") on a prologue symbol with no proxy input; the plugin's checks of global state
  (torch settings, constant paths) have none. They read no module member, so thunder's transform would keep them:
  they are set aside while it runs and put back before the prologue's return.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch

from thunder_subclass._thunder_internals import plugin_state
from thunder_subclass._thunder_internals.state_reads import state_path_of
from thunder_subclass._thunder_internals.interpreter_speed import PURE_NATIVE_FUNCTIONS, fast_getitem, speed_lookaside
from thunder_subclass._thunder_internals.module_dispatch import is_dispatch_hook, original_call_impl
from thunder_subclass._thunder_internals.fixes import (
    interpreter_fix_lookaside,
    torch_arguments,
)
from thunder_subclass._thunder_internals.plugin_state import (
    NOT_HANDLED,
    is_plugin_active,
)
from thunder_subclass._thunder_internals.symbolic_values import (
    symbolic_values_lookaside,
)
from thunder_subclass._thunder_internals.torch_state import (
    is_plain_state_value,
    is_torch_state_query,
    is_torch_state_setter,
)
from thunder_subclass._thunder_internals.thunder_state import (
    checkpoint_scope,
    constant_rooted_path,
    interpret_call,
    is_torch_level_symbol,
    is_unpackable_provenance,
    raise_in_interpreter,
    source_location,
)


def _hook_proxify(original):
    # wraps thunder.core.jit_ext.JitCtx.proxify
    @functools.wraps(original)
    def proxify(self, value):
        if not isinstance(value.value, torch.Tensor) or value.original_value is not value.nothing or not is_plugin_active():
            return original(self, value)
        return plugin_state.handlers.proxify(self, value, original)

    return proxify


def sum_to_scalar_grad(target, grad):
    """The gradient to put for ``target``: ``grad`` summed to shape ``()`` when ``target`` is a 0-dim tensor and
    ``grad`` is not. thunder 0.2.6 does not broadcast CPU scalar tensors in elementwise operations
    (``clang/utils.py`` ``maybe_broadcast_impl``: they are treated as numbers), so a primitive sees ``a: f32[6]``
    next to ``b: f32[]``, and its grad rule (``core/transforms.py``: ``_add_prim_grad`` puts ``b_grad = g``; likewise
    sub, mul, div, pow, maximum, where, ...) puts a ``f32[6]`` gradient for ``b``, which autodiff accumulates as it is:
    ``x * 2 + y.sum()`` gave ``y.grad`` 1 instead of 6, with plain ``thunder.jit`` too. A gradient of the right shape
    is returned unchanged."""
    from thunder.core.proxies import TensorProxy

    if isinstance(target, TensorProxy) and isinstance(grad, TensorProxy) and target.ndim == 0 < grad.ndim:
        import thunder.core.prims as prims

        return prims.sum(grad, tuple(range(grad.ndim)))
    return grad


_RETURN_TYPES: dict | None = None


def _return_types() -> dict:
    """thunder symbol id -> the ``torch.return_types`` structseq its torch function returns (``topk``, ``sort``,
    ``max``/``min`` with a dim, ``median``, ``mode``, ``kthvalue``, ``aminmax``, ``cummax``, ``linalg.qr``...), made
    from thunder's torch-to-symbol map; a symbol two torch functions with different return types share is left out."""
    global _RETURN_TYPES
    if _RETURN_TYPES is None:
        import torch
        from thunder.torch import _torch_to_thunder_function_map

        table: dict = {}
        for fn, sym in _torch_to_thunder_function_map.items():
            kind = getattr(torch.return_types, getattr(fn, "__name__", ""), None)
            if isinstance(kind, type) and hasattr(kind, "n_sequence_fields"):
                table.setdefault(sym.id, set()).add(kind)
        _RETURN_TYPES = {sid: next(iter(kinds)) for sid, kinds in table.items() if len(kinds) == 1}
    return _RETURN_TYPES


def as_torch_return_type(sym, result: tuple):
    """``result`` (a tuple thunder's symbol returned to interpreted code) as the named tuple eager returns
    (``x.max(1).values``, ``torch.topk(x, 2).indices``); unchanged where eager returns no named tuple (``x.max()`` is
    one tensor), and for calls that are not the user's: inside another symbol, or made by a transform (thunder binds
    those calls' outputs from what they return, and its code generation takes tuples only)."""
    kind = _return_types().get(sym.id)
    if kind is None or len(result) != kind.n_sequence_fields:
        return result
    from thunder.core.interpreter import get_interpretercompilectx_if_available
    from thunder.core.trace import get_tracectx

    trace = get_tracectx()
    if trace is None or len(trace.scopes) != 1 or get_interpretercompilectx_if_available() is None:
        return result
    return kind(result)


def _hook_symbol_call(original):
    # wraps thunder.core.symbol.Symbol.__call__
    from thunder.core.prims import PrimIDs
    from thunder.core.proxies import ComplexProxy, FloatProxy, IntegerProxy
    from thunder.core.trace import get_tracectx

    put_grad_id = PrimIDs.PUT_GRAD
    number_proxy_types = (IntegerProxy, FloatProxy, ComplexProxy)

    def call(self, args, kwargs):
        torch_level = is_torch_level_symbol(self)
        if self.id is put_grad_id and len(args) == 2 and is_plugin_active():
            args = (args[0], sum_to_scalar_grad(*args))
        elif (torch_level or (plugin_state.handlers is not None and self.id in plugin_state.handlers.prim_ids)) and is_plugin_active():
            if torch_level:
                args, kwargs = torch_arguments(self, args, kwargs)
            result = plugin_state.handlers.symbol_call(self, args, kwargs)
            if result is NOT_HANDLED:
                result = original(self, *args, **kwargs)
                if torch_level:
                    plugin_state.handlers.plain_symbol_result(self, args, kwargs, result)
            if torch_level and type(result) is tuple:
                result = as_torch_return_type(self, result)
            return result
        result = original(self, *args, **kwargs)
        if type(result) in number_proxy_types and result.value is not None and is_plugin_active():
            unknown_stays_unknown(args, kwargs, result)
        return result

    @functools.wraps(original)
    def __call__(self, *args, **kwargs):
        trace = get_tracectx()
        depth = len(trace.scopes) if trace is not None else 0
        try:
            return call(self, args, kwargs)
        except BaseException:
            # thunder's Symbol.__call__ pushes a symbol scope before running the meta and pops it after, without a
            # `finally`: a meta that raises (nonzero's DynamicOutputShapeException) leaves the scope open, and the
            # next symbol (torch.no_grad()'s __exit__ while the error propagates) fails on "A symbol ... was called
            # while processing a primitive", which replaced the original error (plain thunder.jit too)
            if trace is not None and len(trace.scopes) > depth and is_plugin_active():
                del trace.scopes[depth:]
            raise

    return __call__


def unknown_stays_unknown(args: tuple, kwargs: dict, result) -> None:
    """A number computed by a torch-level operation from a number thunder does not know while tracing (``n > 0`` with
    ``n = x.sum().item()``: thunder 0.2.6's ``prims.item`` gives a number proxy without value) has no value either.
    thunder's number operations give it one computed as if the unknown were a placeholder (``n > 0`` had the value
    False), which a branch then read: the trace silently took that branch for every input (plain ``thunder.jit``
    too). Without a value, a branch on it is a data-dependence error (``interpreter_fixes``): a graph break."""
    from thunder.core.proxies import NumberProxy

    if not isinstance(result, NumberProxy) or result.value is None:
        return
    if any(isinstance(a, NumberProxy) and a.value is None for a in (*args, *kwargs.values())):
        result.value = None


_native_functions: set = set()




def runs_natively(fn: Callable) -> Callable:
    """Decorator: ``fn`` is a plugin function handed to user code as a value (the bound method behind
    ``x.transpose_``, ``x.as_subclass``): when user code calls it, thunder's interpreter calls it as Python, instead
    of tracing its body like user code (where ``isinstance`` and attribute reads answer as for the user)."""
    _native_functions.add(fn)
    return fn


def is_pybind11_class(fn: Any) -> bool:
    """A Python class with a pybind11 base (torch 2.13's DTensor placements ``Shard``, ``Replicate``, ``Partial``
    derive from ``torch._C._distributed.*``). thunder 0.2.6's interpreter cannot call one: its type-call lookaside
    (``core/interpreter.py`` ``_type_call_lookaside``) interprets ``obj.__init__``, whose method unwrapping
    (``_call_dispatch``) resolves pybind11's ``function_record`` ``__init__`` slot and calls it, and the process
    aborts in C++ ("UNEXPECTED CALL OF function_record_PyTypeObject_methods::tp_init_impl")."""
    if not isinstance(fn, type) or issubclass(fn, torch.Tensor):
        return False
    return any(t.__module__ == "pybind11_builtins" for t in fn.__mro__)


def _is_native_function(fn) -> bool:
    try:
        return fn in _native_functions or fn in PURE_NATIVE_FUNCTIONS
    except TypeError:  # unhashable callables (pybind11's instancemethod)
        return False


# a keyword argument named like the lookaside's own first parameter, renamed so that thunder's
# general_jit_lookaside(fn, *args, **kwargs) does not get it twice (it only proxies the keyword arguments' values)
_FN_KEYWORD = "fn (keyword)"


def _is_checkpoint(fn) -> bool:
    import torch.utils.checkpoint

    return fn is torch.utils.checkpoint.checkpoint


def _in_checkpoint_scope(lookaside):
    """thunder's lookaside of ``torch.utils.checkpoint.checkpoint``
    (``jit_ext._general_jit_torch_checkpoint_lookaside``) interprets the checkpointed function inside a scope it pushes on the computation trace; the plugin tells user
    code's own symbol calls from those inside a symbol by the number of open scopes, so that scope is counted
    (``thunder_state.checkpoint_scopes``) while it is open."""

    @functools.wraps(lookaside)
    def in_checkpoint_scope(*args, **kwargs):
        with checkpoint_scope():
            return lookaside(*args, **kwargs)

    return in_checkpoint_scope


def _hook_general_jit_lookaside(original):
    # wraps thunder.core.jit_ext.general_jit_lookaside
    @functools.wraps(original)
    def general_jit_lookaside(fn, /, *args, **kwargs):
        if is_dispatch_hook(fn):  # Module._call_impl as the plugin hooks it: interpret torch's own (module_dispatch)
            from thunder.core.interpreter import wrap_const

            return lambda *wargs, **wkwargs: interpret_call(wrap_const(original_call_impl()), *wargs, **wkwargs)
        if is_plugin_active():
            if _is_native_function(fn) or is_pybind11_class(fn):
                from thunder.core.interpreter import interpreter_needs_wrap

                # (a plugin lookaside may still take a pybind11 class: torch._C._InferenceMode)
                lookaside = plugin_state.handlers.lookaside(fn, args) if not _is_native_function(fn) else None
                return lookaside if lookaside is not None else interpreter_needs_wrap(fn)
            lookaside = (
                plugin_state.handlers.lookaside(fn, args) or speed_lookaside(fn, args)
                or interpreter_fix_lookaside(fn, args, kwargs) or symbolic_values_lookaside(fn, args)
            )
            if fn is getattr and len(args) in (2, 3) and is_unpackable_provenance(getattr(args[0], "provenance", None)):
                return _absence_guarded(lookaside or original(fn, *args, **kwargs))
            if lookaside is not None:
                # the plugin's checkpoint lookaside hands use_reentrant=False to thunder's, which opens a scope
                return _in_checkpoint_scope(lookaside) if _is_checkpoint(fn) else lookaside
            if "fn" in kwargs:
                # thunder 0.2.6 takes `fn` by name too: f(x, fn=g) in traced code raised "got multiple values for
                # argument 'fn'" (plain thunder.jit as well)
                kwargs[_FN_KEYWORD] = kwargs.pop("fn")
            lookaside = original(fn, *args, **kwargs)
            if lookaside is not None and _is_checkpoint(fn):
                lookaside = _in_checkpoint_scope(lookaside)
            if lookaside is None and not kwargs and is_torch_state_query(fn, args):
                return _state_query(fn)
            if lookaside is None and is_torch_state_setter(fn):
                return _state_setter(fn)
            if lookaside is None and _is_opaque(fn):
                # the interpreter will run fn natively: what it reads of its arguments is unknown to the trace, and
                # the Python code it wraps is not interpreted (recorded for the on-disk cache all the same)
                if _code_recorder.codes is not None:
                    _record_wrapped_code(fn, args, _code_recorder.codes)
                plugin_state.handlers.native_call(fn, (*args, *kwargs.values()))
                lists = [a for a in (*args, *kwargs.values()) if type(getattr(a, "value", None)) is list
                         and getattr(a, "item_wrappers", None) is not None]
                if lists:
                    return _native_call_keeping_item_wrappers(fn, lists)
            return lookaside
        return original(fn, *args, **kwargs)

    return general_jit_lookaside


def _state_query(fn):
    """The native call of ``fn``, a getter of torch's global state (``is_torch_state_query``), whose plain answer is
    handed to ``Handlers.state_query``: the trace holds the answer as a constant (thunder 0.2.6 recorded nothing, and
    ``if torch.are_deterministic_algorithms_enabled():`` kept its first branch after the setting changed)."""
    from thunder.core.interpreter import interpreter_needs_wrap

    def query(*args):
        result = fn(*args)
        if is_plain_state_value(result):
            plugin_state.handlers.state_query(fn, args, result)
        return result

    return interpreter_needs_wrap(query)


def _state_setter(fn):
    """A lookaside for ``fn``, a setter of torch's global state (``is_torch_state_setter``), that raises
    ``UnsupportedGlobalStateError`` (a graph-break kind): thunder 0.2.6 ran it natively while tracing (the setting
    changed once, during the first call) and the compiled program never did; eager changes it on every call."""
    import os

    from thunder_subclass.errors import UnsupportedGlobalStateError, format_location

    def setter(*wrapped_args, **wrapped_kwargs):
        where = format_location(*source_location(skip_files=(os.path.dirname(torch.__file__) + os.sep,)))
        public = "torch" if fn.__module__ == "torch" else "torch._C"
        return raise_in_interpreter(UnsupportedGlobalStateError(
            f"{public}.{fn.__name__}(...) at {where} changes torch's global state inside the compiled function: "
            f"thunder_subclass would run it once while tracing, never in the compiled program. Change the setting "
            f"outside the compiled function (before calling it)."
        ))

    return setter


_NOT_FOUND = object()  # the default _absence_guarded reads with: nothing traced code can hold


def _absence_guarded(lookaside):
    """``lookaside`` (of ``getattr(obj, name[, default])`` on an object read from the inputs) that reports an attribute
    it did not find (``Handlers.attribute_absent``): with a default, the read is made with a default of its own that no
    traced value can be, and the caller's default is returned only when that one came back; without one, the read
    raised ``AttributeError`` (which traced code may catch, as ``hasattr`` does). thunder 0.2.6 recorded nothing for a
    missing attribute: after ``obj.name`` was set, calls reused the trace made without it. (Telling a missing attribute
    by the caller's default coming back is wrong where the default is the attribute's own value:
    ``getattr(config, "output_attentions", getattr(config, "output_attentions", False))``, as transformers 4.x's
    ``check_model_inputs`` reads a property, recorded the attribute as missing and the prologue rejected the call it
    was traced from.)"""
    from thunder.core.interpreter import INTERPRETER_SIGNALS, get_interpreterruntimectx, wrap_const

    raised = INTERPRETER_SIGNALS.EXCEPTION_RAISED

    def lookaside_with_absence(wobj, wname, *default):
        if not default:
            result = lookaside(wobj, wname)
            if result is raised and isinstance(get_interpreterruntimectx().curexc, AttributeError):
                plugin_state.handlers.attribute_absent(wobj.value, wobj.provenance, getattr(wname, "value", wname))
            return result
        result = lookaside(wobj, wname, wrap_const(_NOT_FOUND))
        if result is not raised and getattr(result, "value", result) is _NOT_FOUND:
            plugin_state.handlers.attribute_absent(wobj.value, wobj.provenance, getattr(wname, "value", wname))
            return default[0]
        return result

    return lookaside_with_absence


def _native_call_keeping_item_wrappers(fn, lists: list):
    """The interpreter's native call of ``fn`` (as thunder makes it), after which the wrappers the interpreter keeps
    for the items of the lists among its arguments follow what ``fn`` did to them in place: thunder's wrapper of a
    list made in traced code kept its old items' wrappers after ``heapq.heapify(lst)`` reordered it, and the next
    ``lst[0]`` failed thunder's assertion that they match. An item keeps the wrapper (and the path to the inputs) it
    had; an item ``fn`` put there from elsewhere gets a wrapper as an item of the list when read."""
    from thunder.core.interpreter import interpreter_needs_wrap

    call = interpreter_needs_wrap(fn)

    def lookaside(*args, **kwargs):
        result = call(*args, **kwargs)
        for wrapped in lists:
            _resync_item_wrappers(wrapped)
        return result

    return lookaside


def _resync_item_wrappers(wrapped) -> None:
    def holds(w, v):
        return w is None or w.value is v or w.original_value is v

    items, wrappers = wrapped.value, wrapped.item_wrappers
    if len(items) == len(wrappers) and all(holds(w, v) for w, v in zip(wrappers, items)):
        return
    by_identity = {}
    for w in wrappers:
        if w is not None:
            by_identity[id(w.value)] = w
            if w.original_value is not w.nothing:  # a proxied value: the object it stands for
                by_identity[id(w.original_value)] = w
    # an item without a wrapper gets one when it is read (thunder's lazy item wrappers: an item of this list)
    wrapped.item_wrappers = [by_identity.get(id(v)) for v in items]


def _is_opaque(fn) -> bool:
    from thunder.core.interpreter import is_opaque

    try:
        return is_opaque(fn)
    except Exception:  # noqa: BLE001 - not a function the interpreter would call natively
        return False


def _hook_general_jit_callbacks(original: dict) -> dict:
    # replaces thunder.core.jit_ext.general_jit_callbacks (the interpreter callbacks thunder_general_jit passes, looked
    # up at each jit): its WRAP_CALLBACK, which sees every value when the interpreter first wraps it, also hands a
    # value read from the inputs (its provenance one the prologue can unpack) to Handlers.input_object
    from thunder.core.interpreter import INTERPRETER_CALLBACKS, PseudoInst

    key = INTERPRETER_CALLBACKS.WRAP_CALLBACK
    wrap_callback = original[key]
    input_fn = PseudoInst.INPUT_FN

    def wrap_callback_with_object_guards(value):
        result = wrap_callback(value)
        provenance = value.provenance
        if provenance.inputs:
            if is_plugin_active() and (
                    is_unpackable_provenance(provenance) or constant_rooted_path(provenance) is not None
                    or state_path_of(provenance) is not None):
                plugin_state.handlers.input_object(value.value, provenance)
        elif provenance.inst is input_fn and type(value.value) is types.FunctionType and is_plugin_active():
            # the compiled function itself: its code, defaults and closure values were inlined
            plugin_state.handlers.input_object(value.value, provenance)
        return result

    hooked = _HookedCallbacks(original)
    hooked[key] = wrap_callback_with_object_guards
    return hooked


def _hook_wrap(original):
    # wraps thunder.core.interpreter.wrap (a module global its readers of items and attributes call): with provenance
    # tracking it returns the wrapper it made first for the same object, with the first read's provenance, so the
    # wrap callback never sees another path to it (f(x, (o, o)): t[1] is t[0]'s wrapper). A value read from the
    # inputs by another path goes to Handlers.input_object with that path too.
    @functools.wraps(original)
    def wrap(value, /, *, provenance):
        res = original(value, provenance=provenance)
        if (
            res is not value
            and res.provenance is not provenance
            and provenance.inputs
            and is_plugin_active()
            and is_unpackable_provenance(provenance)
        ):
            plugin_state.handlers.input_object(value, provenance)
        return res

    return wrap


class _HookedCallbacks(dict):
    """thunder's interpreter callbacks with the plugin's wrap callback (a dict that can carry the hook marker)."""


def _hook_get_new_alias(original):
    # wraps thunder.core.update_aliases._get_new_alias (it makes TensorProxy(like=alias.proxy), a plain proxy)
    @functools.wraps(original)
    def _get_new_alias(alias, trace):
        if is_plugin_active():
            from thunder.core.trace import tracectx

            with tracectx(trace):
                new = plugin_state.handlers.new_alias(alias.proxy)
            if new is not NOT_HANDLED:
                return new
        return original(alias, trace)

    return _get_new_alias


def _hook_is_inplace_op(original):
    # wraps thunder.core.update_aliases._is_inplace_op, which knows an in-place op by its symbol's IN_PLACE tag or a
    # last subsymbol ``prims.copy_``; a subclass-level bound symbol ends with ``unflatten_<Cls>``, so ``h.copy_(y)``
    # on a subclass (torch's ``copy_`` has no IN_PLACE tag) was not one: later reads of ``h`` kept the old version
    # and its gradient never reached ``y``
    @functools.wraps(original)
    def _is_inplace_op(bsym):
        return original(bsym) or (is_plugin_active() and writes_first_subclass_argument(bsym))

    return _is_inplace_op


def _hook_get_update_bsym(original):
    # wraps thunder.core.update_aliases._get_update_bsym: the new versions ``_get_new_alias`` made are like the
    # *first* version of each alias (``h = zeros_like(x)``: no grad), not like the value the in-place op made
    # (``h.copy_(y)`` with ``y`` requiring grad); a subclass proxy's ``requires_grad`` decides which gradients its
    # grad rules give, so the new version takes the current version's (thunder's plain proxies are left as they are)
    @functools.wraps(original)
    def _get_update_bsym(group, swap_map, new_aliases):
        if is_plugin_active():
            from thunder.core.proxies import TensorProxy, variableify

            for alias, new in zip(group, new_aliases):
                current, seen = alias, set()
                while current in swap_map and current not in seen:
                    seen.add(current)
                    current = variableify(swap_map[current])
                if current.proxy.requires_grad and not new.requires_grad and type(new) is not TensorProxy:
                    # the proxy was made just now for this update (no trace context is open here to make another)
                    new._requires_grad = True
        return original(group, swap_map, new_aliases)

    return _get_update_bsym


def writes_first_subclass_argument(bsym) -> bool:
    """Whether ``bsym`` is a subclass-level in-place bound symbol (a name ending in ``_``; subsymbols between ``flatten_<Cls>`` and
    ``unflatten_<Cls>``) whose subsymbols ``prims.copy_`` into an inner tensor of its first tensor argument, and whose
    one tensor output is that argument's new version."""
    from thunder.core import prims
    from thunder.core.proxies import TensorProxy

    subs = bsym.subsymbols
    # torch names its in-place operations with a trailing underscore: an out-of-place op whose dispatch copies into
    # its input's inner tensors (DTensor's embedding over a _MaskPartial fills the mask buffer) is not a write of it
    if not bsym.sym.name.endswith("_") or bsym.sym.name.endswith("__"):
        return False
    if not subs or not subs[-1].sym.name.startswith("unflatten_") or len(bsym.flat_proxy_outs) != 1:
        return False
    args = [p for p in bsym.flat_proxy_args if isinstance(p, TensorProxy)]
    if not args:
        return False
    inner = {o.name for s in subs if s.sym.name.startswith("flatten_") and s.flat_proxy_args
             and s.flat_proxy_args[0].name == args[0].name for o in s.flat_proxy_outs}
    return any(s.sym.id == prims.PrimIDs.COPY_ and len(s.args) >= 2 and getattr(s.args[1], "name", None) in inner
               for s in subs)


def _hook_wrap_args_from_list(original):
    # wraps thunder.core.interpreter.wrap_args_from_list, which CALL_FUNCTION_EX (f(*args)) uses and which takes len()
    # of the arguments: CPython makes a tuple of any iterable there (f(*generator), as torch's parametrizations do)
    @functools.wraps(original)
    def wrap_args_from_list(lst):
        from thunder.core.interpreter import (
            INTERPRETER_SIGNALS,
            _interpret_call,
            get_interpreterruntimectx,
            unwrap,
            wrap_const,
        )

        if not is_plugin_active():
            return original(lst)
        if not isinstance(unwrap(lst), (list, tuple)):
            lst = _interpret_call(tuple, lst)
            if lst is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
                raise get_interpreterruntimectx().curexc
        # each item as thunder's interpreted ``lambda seq, i: seq[i]`` gives it (see interpreter_speed)
        items = [fast_getitem(lst, wrap_const(i)) for i in range(len(unwrap(lst)))]
        if all(item is not None for item in items):
            return items
        return original(lst)

    return wrap_args_from_list


def _python_frame_in_new_thread(filename, firstlineno, rel_lineno, name, qualname, globals_, out, done) -> None:
    # a function whose body raises at line `rel_lineno` of its code (counted from 1), renamed and moved to the user's
    # function: its frame, taken from the traceback, says what a CPython frame of that function at that line would
    try:
        code = compile("\n" * (rel_lineno - 1) + "raise ValueError()", filename, "exec")
        code = code.replace(co_filename=filename, co_firstlineno=firstlineno, co_name=name, co_qualname=qualname)
        try:
            types.FunctionType(code, globals_)()
        except ValueError as e:
            tb = e.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        out.append(tb.tb_frame)
    finally:
        done.release()


def _hook_python_frame(original):
    # wraps thunder.core.interpreter.InterpreterFrame.get_or_make_python_frame, which puts a made-up CPython frame
    # (the user's file, line and function name) in the traceback of every exception leaving an interpreted function
    # (user code's error messages and tracebacks show the user's lines through it). thunder makes the frame in a new
    # thread (so that its f_back chain ends there) and waits for it in a busy loop holding the GIL: the thread runs
    # only when the interpreter's switch interval (5 ms) takes the GIL away, 5 ms per exception. The interpreter raises
    # one at the end of every interpreted for loop and next() (StopIteration): ~320 in a 2-layer Llama's first call.
    # The same frame, made the same way (same code object fields and globals), waiting on a lock instead.
    import _thread
    import sys

    # one made-up frame per function and line, reused by every traceback through it (a frame of a finished call is
    # never run again; the interpreter's loops raise StopIteration at the same few lines hundreds of times)
    frames: dict = {}

    @functools.wraps(original)
    def get_or_make_python_frame(self):
        if self.positions is None or sys.version_info < (3, 11) or not is_plugin_active():
            return original(self)
        lineno = self.positions.lineno if self.positions.lineno is not None else self.code.co_firstlineno
        code = self.code
        key = (code, lineno, self.qualname)
        frame = frames.get(key)
        if frame is not None:
            return frame
        if len(frames) > 4096:
            frames.clear()
        frame = _made_up_frame(original, code, lineno, self.qualname)
        if frame is None:
            return original(self)
        frames[key] = frame
        return frame

    def _made_up_frame(original, code, lineno, qualname):
        out, done = [], _thread.allocate_lock()
        done.acquire()
        _thread.start_new_thread(_python_frame_in_new_thread, (
            code.co_filename, code.co_firstlineno, lineno - code.co_firstlineno + 1, code.co_name, qualname,
            original.__globals__, out, done,
        ))
        done.acquire()
        return out[0] if out else None

    return get_or_make_python_frame


class _CachedInstructionsDis(types.ModuleType):
    """What ``thunder.core.interpreter`` sees as its module global ``dis``: the ``dis`` module, except that
    ``get_instructions(code)`` is read from a cache per code object while a plugin jit traces. The interpreter
    decodes the bytecode of every frame it runs (``_run_frame``: ``tuple(dis.get_instructions(frame.code))``), the
    same functions over and over (~26,000 frames, ~270,000 instructions in a 2-layer Llama's first call). Code objects
    equal by value have equal instructions (``dis.Instruction`` holds no file name)."""

    def __init__(self, dis_module):
        super().__init__(dis_module.__name__, dis_module.__doc__)
        self.__dict__.update(vars(dis_module))  # read as often as a module's attributes (dis.Instruction)
        self._dis = dis_module
        self._instructions = weakref.WeakKeyDictionary()
        self.get_instructions = self._cached_instructions

    def _cached_instructions(self, x, *args, **kwargs):
        if args or kwargs or not isinstance(x, types.CodeType) or not is_plugin_active():
            return self._dis.get_instructions(x, *args, **kwargs)
        recorder = _code_recorder.codes
        if recorder is not None:
            recorder.add(x)
        instructions = self._instructions.get(x)
        if instructions is None:
            instructions = self._instructions[x] = tuple(self._dis.get_instructions(x))
        return iter(instructions)


class _CodeRecorder(threading.local):
    codes: set | None = None


_code_recorder = _CodeRecorder()


def _record_wrapped_code(fn, wrapped_args: tuple, codes: set) -> None:
    """Add to ``codes`` the code of the Python functions that ``fn``, a callable the interpreter runs natively, wraps:
    through ``__wrapped__`` (``functools.wraps``, ``functools.lru_cache`` / ``cache``), ``functools.partial``'s
    ``func`` and a bound method's ``__func__``, to a small depth. Such a function runs (or ran, for a cache hit) out of
    the interpreter's sight, but its file shapes what the trace holds as much as an interpreted one's. A call of a C
    callable object reaches here as its type's ``__call__`` slot with the object first (``_lru_cache_wrapper``)."""
    seen = 0
    todo = [fn]
    if getattr(fn, "__name__", None) == "__call__" and wrapped_args:
        todo.append(getattr(wrapped_args[0], "value", None))
    while todo and seen < 16:
        f = todo.pop()
        seen += 1
        code = getattr(f, "__code__", None)
        if isinstance(code, types.CodeType):
            codes.add(code)
        for attr in ("__wrapped__", "func", "__func__"):
            try:
                inner = _inspect_attr(f, attr)
            except Exception:  # noqa: BLE001 - an object whose attribute lookup fails: nothing wrapped
                inner = None
            if inner is not None and callable(inner):
                todo.append(inner)


def _inspect_attr(obj, name: str):
    """``obj.name`` read without running Python code of ``obj``'s class (a descriptor or ``__getattr__``): from its
    instance dict or, for C callables, their attribute slots."""
    d = getattr(type(obj), "__dict__", {})
    if "__getattr__" in d or "__getattribute__" in d:
        return None
    return getattr(obj, name, None)


@contextlib.contextmanager
def recording_interpreted_code():
    """Within this block (in this thread), every code object thunder's interpreter runs for a plugin jit is added to
    the set it yields (the interpreter decodes each frame's bytecode through :class:`_CachedInstructionsDis`). The
    on-disk cache (``thunder_subclass.runtime.disk_cache``) records the source files of what a trace interpreted so that
    a later process can tell whether that code changed. Nested blocks each see their own set."""
    saved, codes = _code_recorder.codes, set()
    _code_recorder.codes = codes
    try:
        yield codes
    finally:
        _code_recorder.codes = saved
        if saved is not None:
            saved.update(codes)


def _hook_interpreter_dis(original):
    # replaces the module global `dis` of thunder.core.interpreter (used by _run_frame and the opcode handlers)
    return _CachedInstructionsDis(original)


def _hook_prune_prologue_checks(original):
    # wraps thunder.transforms.prune_prologue_checks.PrunePrologueChecks.transform_traces_pre_prologue (in
    # thunder.compile's BaseRecipe): it classifies every prologue symbol by whether its inputs are all module members,
    # and asserts ("unexpected symbol ... without inputs") on a symbol with no proxy input other than thunder's own
    # unpacking roots. The plugin's checks of global state (torch settings, constant paths, speculated slices without
    # inputs) have none; they read no module member, so they are never pruned: they are set aside while thunder's
    # transform runs and put back before the prologue's return.
    from thunder.core import prims

    roots = {prims.unpack_trivial, prims.unpack_cache_info, prims.python_return, prims.unpack_function_obj}

    @functools.wraps(original)
    def transform_traces_pre_prologue(self, prologue_trace, computation_trace, epilogue_trace, **kwargs):
        from thunder.core.trace import from_trace

        aside = [b for b in prologue_trace.bound_symbols if not b.flat_proxy_args and b.sym not in roots]
        if not aside:
            return original(self, prologue_trace, computation_trace, epilogue_trace, **kwargs)
        kept = from_trace(prologue_trace)
        ids = {id(b) for b in aside}
        kept.bound_symbols = [b for b in prologue_trace.bound_symbols if id(b) not in ids]
        prologue_trace, computation_trace, epilogue_trace = original(self, kept, computation_trace, epilogue_trace,
                                                                     **kwargs)
        bsyms = list(prologue_trace.bound_symbols)
        at = next((i for i in range(len(bsyms) - 1, -1, -1) if bsyms[i].sym is prims.python_return), len(bsyms))
        prologue_trace.bound_symbols = bsyms[:at] + [b.from_bsym() for b in aside] + bsyms[at:]
        return prologue_trace, computation_trace, epilogue_trace

    return transform_traces_pre_prologue


def hook_targets() -> list[tuple[Any, str, Callable]]:
    import thunder.core.interpreter as interpreter
    from thunder.transforms.prune_prologue_checks import PrunePrologueChecks
    import thunder.core.jit_ext as jit_ext
    import thunder.core.symbol as symbol
    import thunder.core.update_aliases as update_aliases

    return [
        (jit_ext.JitCtx, "proxify", _hook_proxify),
        (symbol.Symbol, "__call__", _hook_symbol_call),
        (jit_ext, "general_jit_lookaside", _hook_general_jit_lookaside),
        (jit_ext, "general_jit_callbacks", _hook_general_jit_callbacks),
        (update_aliases, "_get_new_alias", _hook_get_new_alias),
        (update_aliases, "_is_inplace_op", _hook_is_inplace_op),
        (update_aliases, "_get_update_bsym", _hook_get_update_bsym),
        (interpreter, "wrap_args_from_list", _hook_wrap_args_from_list),
        (interpreter, "wrap", _hook_wrap),
        (interpreter.InterpreterFrame, "get_or_make_python_frame", _hook_python_frame),
        (interpreter, "dis", _hook_interpreter_dis),
        (PrunePrologueChecks, "transform_traces_pre_prologue", _hook_prune_prologue_checks),
    ]
