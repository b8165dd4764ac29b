"""Accessors for thunder 0.2.6's private state, for the stages above (no hook is installed here).

* compile data: the jit being compiled (``thunder.core.compile_data._compile_data``: :func:`current_compile_data`,
  :func:`compile_data_context`), and the autocast state of the traced code at the point being traced
  (``CompileData.autocast_stack`` with ``thunder.transforms.autocast.is_autocast_enabled``:
  :func:`traced_autocast_states`, replayed by the fake runs of subclass operations);
* thunder's torch-callable -> symbol table (``thunder.torch._torch_to_thunder_function_map``:
  :func:`torch_to_thunder_symbols`) and whether thunder resolves a tensor method (``core/langctxs.py``);
* traces: an empty trace with a signature (``TraceCtx._siginfo``: :func:`new_trace`); a dict the plugin keeps on the
  trace being built, for when no jit interprets (:func:`trace_state`: autodiff recording again); the table of proxy
  producers of
  the computation trace being built (:func:`tensor_producer`, kept on the trace, indexed as it grows; used by the
  stride inference of fakes and by the symbolic-values number pins);
* the interpreter: the user's source line (:func:`source_location`), whether a call comes from user code, calling a
  function under the interpreter from a lookaside (``_interpret_call``: :func:`interpret_call`,
  :func:`interpret_native_call`), raising in the traced program (``do_raise``), rebinding a wrapped value, the
  arguments of ``super()``, whether the interpreter is running;
* whether the trace being interpreted changed an integer tensor in place so far (thunder's
  ``update_aliases._is_inplace_op``: :func:`trace_wrote_integer_tensors`; known input values are then stale);
* the jit context (``jit_ext.get_jit_ctx``): a per-trace dict for the plugin (:func:`jit_state`), calls appended to
  the epilogue (:func:`call_in_epilogue`, run by :mod:`.fixes`' ``process_recorded_modifications``
  hook), names and registration of input proxies, provenance records the prologue can unpack (the jitted module
  itself through thunder's ``ThunderModule``: :func:`hooked_module_provenance`; a module's parameter, buffer or
  submodule slot read by ``nn.Module.__getattr__``: :func:`module_slot_of`; the user's module behind the
  ``ThunderModule`` the prologue unpacks: :func:`user_module`); calls that undo what a trace that
  fails did to the caller's objects (:func:`undo_if_trace_fails`, run by :mod:`.runtime`'s ``acquire_initial_trace``
  through :func:`undoing_on_trace_failure`; owned by that call, per thread);
* executors' operators: the implementation an operator registered with ``fn=`` runs (``extend/__init__.py``
  ``OperatorExecutor.register_operator`` keeps it only in the closure of the symbol's ``_bind_postprocess``, as
  ``call_ctx``): :func:`operator_implementation`.

Owner of state: what is kept lives on thunder's own objects (the jit context, the trace being built) and is freed with
them.
"""

from __future__ import annotations

import contextlib
import dis
import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any


STATE_KEY = "_thunder_subclass_state"  # the plugin's dict on a jit context or a trace (jit_state, trace_state)


def current_compile_data() -> tuple[Any, Any]:
    """thunder's compile data and compile stats of the jit being compiled (``thunder.core.compile_data``)."""
    from thunder.core.compile_data import _compile_data

    return _compile_data.get()


def traced_autocast_states() -> tuple[tuple[str, Any, bool], ...]:
    """``(device type, torch dtype, enabled)`` for each ``torch.autocast`` active at this point of the traced code,
    outermost first: thunder's jit pushes the autocast active around the call and its ``torch.autocast.__enter__`` /
    ``__exit__`` lookasides push and pop the ones the traced code enters (``CompileData.autocast_stack``;
    ``thunder/torch/__init__.py`` ``autocast_enter`` / ``autocast_exit``). Empty outside a jit, and while thunder
    applies an autocast rule itself (``thunder.transforms.autocast.disable_autocast``: its inputs are cast already)."""
    from thunder.core.compile_data import get_compile_data
    import thunder.core.dtypes as dtypes
    from thunder.transforms.autocast import is_autocast_enabled

    stack = getattr(getattr(get_compile_data(), "autocast_stack", None), "stack", None)
    if not stack or not is_autocast_enabled():
        return ()
    return tuple((device, dtypes.to_torch_dtype(dtype) if isinstance(dtype, dtypes.dtype) else dtype, bool(enabled))
                 for device, dtype, enabled in stack)


def compile_data_context(cd, cs):
    """Make ``cd``/``cs`` current again (``thunder.core.compile_data.compile_data_and_stats``), e.g. to trace a
    backward variant at run time with the plugin's hooks active."""
    from thunder.core.compile_data import compile_data_and_stats

    return compile_data_and_stats(cd, cs)


@functools.cache
def torch_to_thunder_symbols() -> dict:
    """thunder's table from torch callables to the thunder torch symbols they are traced as
    (``thunder.torch._torch_to_thunder_function_map``), with the plain symbol in place of thunder 0.2.6's DTensor
    dispatch closures (taken from their ``single_device_symbol`` nonlocal). Entries without a symbol are left out."""
    import inspect

    import thunder.torch as ltorch
    from thunder.core.symbol import Symbol

    table = {}
    for torch_fn, sym in ltorch._torch_to_thunder_function_map.items():
        if not isinstance(sym, Symbol):
            sym = inspect.getclosurevars(sym).nonlocals.get("single_device_symbol") if callable(sym) else None
        if isinstance(sym, Symbol):
            table[torch_fn] = sym
    return table


def thunder_resolves_method(name: str) -> bool:
    """Whether thunder's torch language context has a tensor method ``name`` (what ``TensorProxy.__getattr__``
    looks up: ``core/langctxs.py`` ``resolve_method``)."""
    from thunder.core.langctxs import resolve_method

    return resolve_method(name) is not None


def new_trace(name: str, args: list, *, names) -> Any:
    """An empty thunder trace whose signature is ``name(*args)`` (proxies), reserving ``names``. thunder 0.2.6 has
    no public constructor for a trace without a Python function, so the signature is set directly
    (``TraceCtx._siginfo``, as thunder's own jit_ext does)."""
    from thunder.core.codeutils import SigInfo
    from thunder.core.trace import TraceCtx

    trace = TraceCtx()
    trace.names = set(names)
    trace.args = args
    trace._siginfo = SigInfo.from_name_and_args(name, args)
    return trace


def source_location(skip_files: tuple[str, ...] = ()) -> tuple[str | None, int | None]:
    """The user's source file and line of the call being traced (thunder records it on the trace while it records
    symbols; otherwise, or when ``skip_files`` are given, the line the interpreter is at in the innermost frame of
    user code whose file is not one of ``skip_files``; an entry ending in ``os.sep`` skips a directory)."""
    from thunder.core.trace import get_tracectx

    import os

    import thunder

    thunder_dir = os.path.dirname(thunder.__file__)
    trace = get_tracectx()
    # (a position inside thunder's own files: a thunder lookaside being traced, e.g. its DTensor-aware
    # scaled_dot_product_attention wrapper; the user's line is the innermost frame outside thunder)
    if trace is not None and trace._current_source_filename is not None and not skip_files \
            and not trace._current_source_filename.startswith(thunder_dir):
        positions = trace._current_source_positions
        return trace._current_source_filename, getattr(positions, "lineno", None)
    if not is_interpreting():
        return None, None
    from thunder.core.interpreter import get_interpreterruntimectx

    dirs = tuple(s for s in skip_files if s.endswith(os.sep))
    for frame in reversed(get_interpreterruntimectx().frame_stack):
        name = frame.code.co_filename
        if not name.startswith(thunder_dir) and name not in skip_files and not (dirs and name.startswith(dirs)):
            return name, getattr(frame.positions, "lineno", None)
    return None, None


def is_called_from_user_code() -> bool:
    """False when the call being interpreted comes from thunder's own interpreted helpers (for example the
    interpreter's binary-operator implementation calls ``type(a)``), True for the user's code."""
    import os

    import thunder
    from thunder.core.interpreter import get_interpreterruntimectx

    frame = get_interpreterruntimectx().peek_frame_stack()
    if frame is None:
        return True
    return not frame.code.co_filename.startswith(os.path.dirname(thunder.__file__))


def jit_state() -> dict | None:
    """A dict the plugin keeps on thunder's jit context of the trace being interpreted (``jit_ext.get_jit_ctx``), or
    None when no jit is interpreting (e.g. while autodiff runs a grad rule)."""
    from thunder.core.jit_ext import get_jit_ctx

    try:
        ctx = get_jit_ctx()
    except LookupError:
        return None
    return ctx.__dict__.setdefault(STATE_KEY, {})


@contextlib.contextmanager
def checkpoint_scope():
    """While thunder's ``torch.utils.checkpoint.checkpoint`` lookaside runs: one more open scope of the computation
    trace belongs to user code, not to a symbol (:func:`checkpoint_scopes`)."""
    state = jit_state()
    if state is None:
        yield
        return
    state["checkpoint_scopes"] = state.get("checkpoint_scopes", 0) + 1
    try:
        yield
    finally:
        state["checkpoint_scopes"] -= 1


def checkpoint_scopes() -> int:
    """How many of the computation trace's open scopes are checkpointed regions of user code."""
    state = jit_state()
    return 0 if state is None else state.get("checkpoint_scopes", 0)


def trace_wrote_integer_tensors() -> bool:
    """Whether the trace being interpreted has recorded, so far, an operation that changes an integer tensor in place
    (thunder's ``_is_inplace_op``, in every open scope and their subsymbols): after ``o[1] = 4`` on an offsets input
    the proxy ``o`` still stands for the input (thunder renames later uses only after tracing), so its values as
    passed are no longer what later operations read. True when no trace is being interpreted (nothing is known
    then)."""
    from thunder.core.proxies import TensorProxy
    from thunder.core.update_aliases import _is_inplace_op

    import thunder.core.dtypes as dtypes

    def writes_integer(bsym) -> bool:
        if _is_inplace_op(bsym):
            args = [a for a in bsym.flat_proxy_args if isinstance(a, TensorProxy)]
            if args and (dtypes.is_integer_dtype(args[0].dtype) or dtypes.is_boolean_dtype(args[0].dtype)):
                return True
        return any(writes_integer(sub) for sub in bsym.subsymbols)

    return trace_recorded(writes_integer, "inplace_integer_scan")


def trace_recorded(predicate, key: str) -> bool:
    """Whether the trace being interpreted has recorded, so far, a bound symbol for which ``predicate`` holds, in
    every open scope (``predicate`` looks into subsymbols itself). True when no trace is being interpreted. The
    top-level list grows as it is interpreted: it is scanned once per symbol, the scan state kept under ``key`` in
    :func:`jit_state` (one key per predicate); the open inner scopes (an operation being recorded) are short and
    scanned whole."""
    from thunder.core.trace import get_tracectx

    trace, state = get_tracectx(), jit_state()
    if trace is None or state is None:
        return True
    top = trace.scopes[0]
    scanned_list, done, found = state.get(key, (None, 0, False))
    if scanned_list is not top:
        done, found = 0, False
    found = found or any(predicate(b) for b in top[done:])
    state[key] = (top, len(top), found)
    return found or any(predicate(b) for scope in trace.scopes[1:] for b in scope)


def trace_state(trace=None) -> dict | None:
    """A dict the plugin keeps on ``trace`` (default: the trace being built, ``thunder.core.trace.get_tracectx()``),
    or None outside one: for what must outlive one operation (values recorded in the trace that later recordings
    read). Freed with the trace."""
    from thunder.core.trace import get_tracectx

    trace = trace if trace is not None else get_tracectx()
    return None if trace is None else trace.__dict__.setdefault(STATE_KEY, {})


class _TraceUndo(threading.local):
    """Per thread: for each trace being made (innermost last), the calls that undo what tracing did to the caller's
    objects, run if the trace fails (:func:`undo_if_trace_fails`); owned by :func:`undoing_on_trace_failure`."""

    def __init__(self):
        self.stack: list[list[Callable]] = []


_trace_undo = _TraceUndo()


def undo_if_trace_fails(undo: Callable) -> None:
    """Call ``undo()`` if the trace being made raises (an untraceable line, a graph break): the caller's objects the
    traced code changed get their contents back before the call runs again, eagerly or in regions."""
    if _trace_undo.stack:
        _trace_undo.stack[-1].append(undo)


@contextlib.contextmanager
def undoing_on_trace_failure():
    """Around the making of one trace (``acquire_initial_trace``): runs the undo calls registered meanwhile if it
    raises, drops them when it returns."""
    _trace_undo.stack.append([])
    try:
        yield
    except BaseException:
        for undo in reversed(_trace_undo.stack[-1]):
            undo()
        raise
    finally:
        _trace_undo.stack.pop()


def call_in_epilogue(sym, history, *args) -> None:
    """Append ``sym(obj, *args)`` to the epilogue of the trace being interpreted, where ``obj`` is the caller's object
    with provenance ``history`` (an input). The epilogue runs after the computation (and after thunder's autograd
    Function, which would hand the computation's outputs to it as new tensors: views of an input it returns), so
    ``obj`` comes from the prologue directly (``jit_ext.process_recorded_modifications`` does the same for a module
    whose buffers the traced code assigns). Calls run in the order they were added."""
    jit_state().setdefault("epilogue_calls", []).append((sym, history, args))


def interpret_call(fn, *wrapped_args, **wrapped_kwargs):
    """Call ``fn`` under thunder's interpreter from inside a lookaside (``interpreter._interpret_call``): its body is
    traced like user code. Arguments and result are the interpreter's wrapped values."""
    from thunder.core.interpreter import _interpret_call

    return _interpret_call(fn, *wrapped_args, **wrapped_kwargs)


def thunder_lookaside(fn) -> Callable | None:
    """thunder's own interpreter lookaside for ``fn`` (``jit_ext._general_jit_lookaside_map``), or None: a plugin
    lookaside that takes only some calls of ``fn`` hands the others to it."""
    from thunder.core.jit_ext import _general_jit_lookaside_map

    try:
        return _general_jit_lookaside_map.get(fn)
    except TypeError:  # an unhashable callable
        return None


def raise_in_interpreter(e: BaseException):
    """Raise ``e`` in the traced program from inside a lookaside (``interpreter.do_raise``): it reaches the user as
    itself, not wrapped in an ``InterpreterError``."""
    from thunder.core.interpreter import do_raise

    return do_raise(e)


def rebind_wrapped_value(wrapped, value) -> None:
    """Make the interpreter's wrapped value ``wrapped`` hold ``value`` from now on: every Python reference to it in the
    traced code (a local variable, a list item) then denotes ``value``, as after an in-place op on an object in eager.
    Its cached attribute reads are dropped (``WrappedValue.attribute_wrappers``)."""
    wrapped.value = value
    wrapped.attribute_wrappers.clear()


def super_arguments(wrapped_args: tuple) -> tuple[Any, Any]:
    """The (class, object) of a ``super(...)`` call being interpreted, unwrapped; for the zero-argument form, read
    from the calling frame's ``__class__`` cell and first argument as thunder's own ``_super_lookaside`` does
    (``core/interpreter.py``). (None, None) when they cannot be found."""
    from thunder.core.interpreter import get_interpreterruntimectx, unwrap

    if len(wrapped_args) == 2:
        return unwrap(wrapped_args[0]), unwrap(wrapped_args[1])
    if wrapped_args:
        return None, None
    frame = get_interpreterruntimectx().frame_stack[-1]
    if not frame.code.co_varnames:
        return None, None
    self_name, cls, obj = frame.code.co_varnames[0], None, None
    for i in range(len(frame.localsplus)):
        name, value = frame.get_localsplus_name(i), unwrap(frame.localsplus[i])
        if name == "__class__" and hasattr(value, "cell_contents"):
            cls = value.cell_contents
        elif name == self_name:
            obj = value.cell_contents if hasattr(value, "cell_contents") else value
    return cls, obj


def is_interpreting() -> bool:
    """Whether thunder's interpreter is tracing user code now (not a later pass re-running symbols)."""
    from thunder.core.interpreter import _interpretercompilectx

    try:
        _interpretercompilectx.get()
    except LookupError:
        return False
    return True


def interpret_native_call(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` traced by thunder's interpreter (its body like user code), called from plain Python
    that thunder's interpreter is running opaquely (a symbol call, a lookaside's body): arguments are wrapped as
    constants, the result unwrapped, an exception raised inside is raised here."""
    from thunder.core.interpreter import (
        INTERPRETER_SIGNALS,
        _interpret_call,
        get_interpreterruntimectx,
        unwrap,
        wrap_const,
    )

    result = _interpret_call(wrap_const(fn), *(wrap_const(a) for a in args),
                             **{k: wrap_const(v) for k, v in kwargs.items()})
    if result is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
        runtime = get_interpreterruntimectx()
        exc, runtime.curexc = runtime.curexc, None
        raise exc
    return unwrap(result)


def is_torch_level_symbol(sym) -> bool:
    """A thunder torch-language symbol: a composite (``ltorch.mul``) or one of thunder's auto-registered torch
    fallbacks (prims tagged AUTO_REGISTERED, run eagerly by torch; in thunder 0.2.6 under torch 2.13 even
    ``torch.mm`` is one). Not prims, and not executor symbols (including thunder_subclass's own)."""
    if sym.executor is not None:
        return False
    if not sym.is_prim:
        return True
    from thunder.core.prims import OpTags

    return bool(sym.tags) and OpTags.AUTO_REGISTERED in sym.tags


def input_proxy_name(jit_ctx, value) -> str | None:
    """The name thunder gives the proxy of an input (``t_x``, ``t_fc_weight``: from the value's provenance,
    ``jit_ext._infer_name_postfix_from_provenance``), released in the trace so the proxy can take it; None when
    thunder would pick a fresh name."""
    from thunder.core.jit_ext import _infer_name_postfix_from_provenance

    postfix = _infer_name_postfix_from_provenance(value.provenance)
    if not postfix:
        return None
    name = f"t{postfix}"
    jit_ctx.computation_trace.names.discard(name)
    return name


def register_input_proxy(value, p) -> None:
    """Make ``p`` the proxy of the input wrapped ``value``, flagged as a tensor proxy in its provenance (what
    ``JitCtx.proxify`` does for tensors: ``EXT_FLAG_IS_TENSOR_PROXY``), so the prologue unpacks it."""
    from thunder.core.jit_ext import EXT_FLAG_IS_TENSOR_PROXY

    value.provenance.ext_flag |= EXT_FLAG_IS_TENSOR_PROXY
    value.register_proxy(p)


def input_attribute(wrapped_obj, name: str):
    """The attribute ``name`` of the caller's object behind ``wrapped_obj`` (an input of the trace being interpreted,
    which thunder has replaced by its proxy), wrapped with the provenance ``getattr(<input>, name)``: a tensor becomes
    an input of its own (thunder's wrap callback proxifies it, ``JitCtx.proxify``), which the prologue unpacks from
    the input and hands to the computation, and so to thunder's autograd Function. None when ``wrapped_obj`` holds
    no caller's object or the prologue cannot reach it."""
    from thunder.core.interpreter import wrap

    real = getattr(wrapped_obj, "original_value", None)
    if real is None or real is getattr(wrapped_obj, "nothing", None):
        return None
    if not is_unpackable_provenance(wrapped_obj.provenance):
        return None
    return wrap(getattr(real, name), provenance=attribute_provenance(wrapped_obj.provenance)(name))


def pending_python_writes() -> list:
    """The objects the trace being interpreted has written to so far (attributes, items), which thunder applies in
    the epilogue after the computation (``jit_ext``'s ``_additional_outputs``, unwrapped); empty outside a jit."""
    from thunder.core.interpreter import unwrap

    ctx = jit_context()
    pending = getattr(ctx, "_additional_outputs", None) if ctx is not None else None
    return [unwrap(w) for w in pending] if pending else []


def view_symbols() -> frozenset:
    """thunder's torch-level symbols whose output is (or may be) a view of an input (``thunder.torch``'s
    ``_syms_returning_views`` and ``_syms_that_may_return_views``)."""
    import thunder.torch as ltorch

    return frozenset(ltorch._syms_returning_views | ltorch._syms_that_may_return_views)


def jit_context():
    """thunder's jit context of the trace being interpreted (``jit_ext.get_jit_ctx``), or None."""
    from thunder.core.jit_ext import get_jit_ctx

    try:
        return get_jit_ctx()
    except LookupError:
        return None


# what thunder's prologue can unpack (core/jit_ext.py unpack_inputs, from_provenance), for values reached from inputs
_UNPACKABLE_PROVENANCE = {"INPUT_ARGS", "INPUT_KWARGS", "INPUT_FN", "LOAD_ATTR", "BINARY_SUBSCR"}


def is_unpackable_provenance(record) -> bool:
    """Whether thunder's prologue can fetch the value with provenance ``record`` from the inputs (attribute reads and
    subscripts of arguments or of the jitted callable), so that a prologue check can take it as an argument."""
    # asked for every value the interpreter wraps (the plugin's wrap hooks): the answer is kept on the record (its
    # instruction and inputs do not change once made); a constant's is not (the interpreter sets its value on wrapping)
    try:
        return record.__dict__[_UNPACKABLE_KEY]
    except (KeyError, AttributeError):
        pass
    from thunder.core.interpreter import ProvenanceRecord

    if not isinstance(record, ProvenanceRecord):
        return False
    inst = record.inst.opname if isinstance(record.inst, dis.Instruction) else getattr(record.inst, "name", None)
    if inst == "CONSTANT":
        return isinstance(record.value, (int, str))
    if inst not in _UNPACKABLE_PROVENANCE:
        known = False
    else:
        known = all(is_unpackable_provenance(i) for i in record.inputs)
    record.__dict__[_UNPACKABLE_KEY] = known
    return known


_UNPACKABLE_KEY = "_thunder_subclass_unpackable"


# marks the provenance record of a key of a dict read from the inputs (thunder wraps such keys as constants): values
# read from the key object are guarded through it (constant_rooted_path)
DICT_KEY_MARK = "_thunder_subclass_dict_key"


class SetItems:
    """The items of a set or frozenset that traced code iterated, in the order it iterated them (the set's guard
    checks that order): values read from an item are guarded through it, as from a dict key object."""

    __slots__ = ("items",)

    def __init__(self, items: tuple):
        self.items = items

    def __getitem__(self, i: int):
        return self.items[i]


def mark_dict_key(record, reached: tuple | None = None) -> None:
    """Mark ``record`` (a constant's) as a dict key object, or as an object ``reached`` ``(key, path)`` from one
    (an item of a tuple key: thunder wraps the items of a constant as constants, without a path)."""
    record.__dict__[DICT_KEY_MARK] = True if reached is None else reached


def constant_rooted_path(record, *, allow_empty: bool = False) -> tuple[Any, tuple] | None:
    """``(key object, path)`` when ``record`` reads a value from a dict key object (:func:`mark_dict_key`) by
    attribute reads and int/str subscripts: ``path`` holds ``(".", name)`` / ``("[]", index)`` steps from the key
    outwards. thunder wraps dict keys as constants, so such values (``for k in d: x + k.n``) were inlined unchecked.
    None for any other record, and for a path through a dunder attribute other than ``__self__`` (the interpreter's
    own reads on its way)."""
    from thunder.core.interpreter import ProvenanceRecord, PseudoInst

    start, steps = record, []
    if getattr(record, "__dict__", {}).get(_NOT_KEY_ROOTED):
        return None  # a path of other reads (asked for every value the interpreter wraps)
    while isinstance(record, ProvenanceRecord) and len(record.inputs) == 2:
        inst = record.inst.opname if isinstance(record.inst, dis.Instruction) else getattr(record.inst, "name", None)
        key = record.inputs[1]
        if getattr(key, "inst", None) is not PseudoInst.CONSTANT:
            return _not_key_rooted(start)
        if inst == "LOAD_ATTR" and isinstance(key.value, str):
            if key.value.startswith("__") and key.value.endswith("__") and key.value != "__self__":
                return _not_key_rooted(start)
            steps.append((".", key.value))
        elif inst == "BINARY_SUBSCR" and type(key.value) in (int, str):
            steps.append(("[]", key.value))
        else:
            return _not_key_rooted(start)
        record = record.inputs[0]
    mark = record.__dict__.get(DICT_KEY_MARK) if isinstance(record, ProvenanceRecord) else None
    if mark is None or not (steps or allow_empty):
        return None
    root, prefix = (record.value, ()) if mark is True else mark
    return root, (*prefix, *reversed(steps))


# set on a provenance record whose reads are not attribute reads and subscripts all the way to their root: that does
# not change (a record's instruction and inputs are fixed once made); whether the root is a dict key may, and is not
# kept
_NOT_KEY_ROOTED = "_thunder_subclass_not_key_rooted"


def _not_key_rooted(record) -> None:
    record.__dict__[_NOT_KEY_ROOTED] = True
    return None


def hooked_module_provenance(module, provenance):
    """The provenance under which the prologue reaches ``module`` itself, for checks of its hooks. thunder's prologue
    unpacks the jitted module (``INPUT_FN``) as its ``ThunderModule`` (``core/module.py`` ``get_thunder_module``),
    an ``nn.Module`` with hook dictionaries of its own (empty: the user's hooks are on the module it wraps); the
    user's module is that wrapper's ``_model``. Other provenances are returned unchanged."""
    import torch
    from thunder.core.interpreter import ProvenanceRecord, PseudoInst
    from thunder.core.module import ThunderModule, get_thunder_module

    if getattr(provenance, "inst", None) is not PseudoInst.INPUT_FN or not isinstance(module, torch.nn.Module):
        return provenance
    wrapper = get_thunder_module(module)
    if not isinstance(wrapper, ThunderModule) or wrapper._model is not module:
        return provenance
    # (the constant's record as wrap_const makes it, also outside the interpreter: the epilogue's writes)
    name = ProvenanceRecord(PseudoInst.CONSTANT, inputs=[], value="_model")
    return ProvenanceRecord(PseudoInst.LOAD_ATTR, inputs=[provenance, name])


def module_slot_of(record) -> tuple[Any, str, str] | None:
    """``(module record, table, name)`` when ``record`` reads a module's parameter, buffer or submodule slot
    (``<module>._parameters[name]``, ``._buffers[name]``, ``._modules[name]``: how ``nn.Module.__getattr__`` finds
    ``self.bias``), else None. thunder unpacks a tensor or module found there itself (``core/jit_ext.py``
    ``unpack_parameter_or_buffer_or_submodule``) but records nothing for an empty slot (``bias=None``)."""
    from thunder.core.interpreter import PseudoInst
    from thunder.core.jit_ext import EXT_FLAG_IS_MODULE

    inst = record.inst.opname if isinstance(record.inst, dis.Instruction) else getattr(record.inst, "name", None)
    if inst != "BINARY_SUBSCR" or len(record.inputs) != 2:
        return None
    table_read, key = record.inputs
    if getattr(key, "inst", None) is not PseudoInst.CONSTANT or type(key.value) is not str:
        return None
    t_inst = table_read.inst.opname if isinstance(table_read.inst, dis.Instruction) else \
        getattr(table_read.inst, "name", None)
    if t_inst != "LOAD_ATTR" or len(table_read.inputs) != 2:
        return None
    module_record, table = table_read.inputs
    if getattr(table, "value", None) not in ("_parameters", "_buffers", "_modules"):
        return None
    if not (getattr(module_record, "ext_flag", 0) & EXT_FLAG_IS_MODULE):
        return None
    return module_record, table.value, key.value


def thunder_module_lookup() -> tuple[Callable[[Any], Any], type, dict | None]:
    """``(get_thunder_module, ThunderModule, map)``: the function a prologue unpacks the jitted module with
    (``core/module.py``: the module's ``ThunderModule`` from the compile data's ``_thunder_module_map``, a dict by
    ``id``, or the module itself), the wrapper's class, and that map of the compile data current now (None outside a
    call; the map is a ``WeakValueDictionary``: its ``data`` dict). ``guards.unpack_cache`` runs the first and watches
    the map."""
    import weakref

    from thunder.core.compile_data import get_compile_data
    from thunder.core.module import ThunderModule, get_thunder_module

    found = getattr(get_compile_data(), "_thunder_module_map", None)
    if type(found) is weakref.WeakValueDictionary:
        found = found.data
    return get_thunder_module, ThunderModule, found if type(found) is dict else None


def user_module(module):
    """The user's module behind what the prologue unpacks for it: the jitted module is unpacked as thunder's
    ``ThunderModule`` wrapper (``core/module.py`` ``get_thunder_module``), whose own tables are not the user's."""
    from thunder.core.module import ThunderModule

    return module._model if isinstance(module, ThunderModule) else module


def attribute_provenance(history) -> Callable[[str], Any]:
    """``attr -> provenance of getattr(<value with provenance history>, attr)``, for inner tensors of an input
    (the prologue unpacks them as attributes of the input)."""
    from thunder.core.interpreter import ProvenanceRecord, PseudoInst, wrap_const

    def inner_history(attr: str):
        return ProvenanceRecord(PseudoInst.LOAD_ATTR, inputs=[history, wrap_const(attr).provenance])

    return inner_history


def _unflagged_copy(record):
    """A copy of provenance ``record`` and the records it comes from without thunder's tensor-proxy flag: thunder's
    ``should_register_for_prologue`` refuses any chain through a record flagged ``EXT_FLAG_IS_TENSOR_PROXY`` (set on
    an input tensor's record once it is proxied), so sizes read from it would not be unpackable (thunder's own
    ``tensorproxy`` copies the record before it is flagged)."""
    import copy

    from thunder.core.jit_ext import EXT_FLAG_IS_TENSOR_PROXY

    new = copy.copy(record)
    new.ext_flag = record.ext_flag & ~EXT_FLAG_IS_TENSOR_PROXY
    new.inputs = [_unflagged_copy(i) for i in record.inputs]
    return new


def size_provenance(tensor_history, dim: int):
    """The provenance of ``<tensor>.shape[dim]`` for a tensor input of provenance ``tensor_history`` (as thunder's
    ``tensorproxy`` gives its size numbers under ``cache="symbolic values"``): the prologue can unpack it."""
    from thunder.core.interpreter import ProvenanceRecord, PseudoInst, wrap_const

    shape = ProvenanceRecord(PseudoInst.LOAD_ATTR, inputs=[_unflagged_copy(tensor_history), wrap_const("shape").provenance])
    return ProvenanceRecord(PseudoInst.BINARY_SUBSCR, inputs=[shape, wrap_const(dim).provenance])


def is_argument_provenance(history) -> bool:
    """Whether a value of provenance ``history`` is read from the arguments of the traced call (``args[0].w``), as
    opposed to globals or a module's attributes, from which thunder's prologue cannot unpack size numbers."""
    from thunder.core.interpreter import PseudoInst

    record = history
    while record is not None and record.inputs:
        record = record.inputs[0]
    return record is not None and record.inst in (PseudoInst.INPUT_ARGS, PseudoInst.INPUT_KWARGS)


def input_size_numbers(sizes, tensor_history) -> tuple:
    """Number proxies for the sizes of a tensor input (``<tensor>.shape[i]``), unchecked by the prologue unless
    pinned, as thunder makes them for plain tensors under ``cache="symbolic values"``."""
    from thunder.core.proxies import CONSTRAINT, IntegerProxy

    return tuple(
        IntegerProxy(None, int(s), history=size_provenance(tensor_history, i), constraint=CONSTRAINT.CONSTRAINABLE)
        for i, s in enumerate(sizes)
    )


class _Producers:
    """name of each proxy -> the first bound symbol producing it (an outer symbol before its subsymbols), over the
    computation trace being built: its top level is indexed as it grows (again from the start if it shrank: a
    recording that was undone), the few open nested scopes are searched on each lookup."""

    def __init__(self, trace):
        self.trace, self.table, self.seen = weakref.proxy(trace), {}, 0

    def _index(self, bsyms, table) -> None:
        for b in bsyms:
            for o in b.flat_proxy_outs:
                table.setdefault(o.name, b)
            self._index(b.subsymbols, table)

    def get(self, name: str):
        top = self.trace.bound_symbols
        if len(top) < self.seen:
            self.table, self.seen = {}, 0
        self._index(top[self.seen:], self.table)
        self.seen = len(top)
        b = self.table.get(name)
        if b is None:
            open_scopes: dict = {}
            for scope in self.trace.scopes[1:]:
                self._index(scope, open_scopes)
            b = open_scopes.get(name)
        return b


_differentiated = threading.local()  # .traces: the computation traces autodiff is differentiating now (a stack)


@contextlib.contextmanager
def differentiating(trace):
    """While thunder's autodiff builds the joint trace from ``trace``: :func:`number_producer` also finds the bound
    symbols of ``trace`` (the number operations of the forward, e.g. the size ``i0 * i1`` a ``view(-1)`` gave, are
    not in the trace being built when a grad rule records an operation on fakes)."""
    stack = _differentiated.__dict__.setdefault("traces", [])
    stack.append(_Producers(trace))
    try:
        yield
    finally:
        stack.pop()


_entries = threading.local()  # .stack: per cache entry being built (innermost last), the traces autodiff differentiated


@contextlib.contextmanager
def building_entry():
    """While thunder builds one cache entry (``apply_transforms_and_build_cache_entry``): the computation traces its
    autodiff differentiated are kept (:func:`remember_differentiated`) for the passes after it."""
    stack = _entries.__dict__.setdefault("stack", [])
    stack.append([])
    try:
        yield
    finally:
        stack.pop()


def remember_differentiated(trace) -> None:
    stack = getattr(_entries, "stack", None)
    if stack:
        stack[-1].append(trace)


def differentiated_in_entry() -> tuple:
    """The computation traces autodiff differentiated for the cache entry being built (none outside one)."""
    stack = getattr(_entries, "stack", None)
    return tuple(stack[-1]) if stack else ()


def number_producer(name: str, accept: Callable = lambda b: True):
    """The bound symbol producing the proxy ``name`` that ``accept`` accepts: in the computation trace being built,
    else in the traces being differentiated (:func:`differentiating`; the trace being built may hold only a ``shape``
    query that unpacks the number again); None if none."""
    from thunder.core.trace import get_tracectx

    building = (trace_producers(),) if get_tracectx() is not None else ()
    for producers in (*building, *reversed(getattr(_differentiated, "traces", ()))):
        b = producers.get(name)
        if b is not None and accept(b):
            return b
    return None


def trace_producers() -> _Producers:
    """The :class:`_Producers` of the computation trace being built (kept on the trace)."""
    from thunder.core.trace import get_tracectx

    trace = get_tracectx()
    producers = trace.__dict__.get("_thunder_subclass_producers")
    if producers is None:
        producers = trace.__dict__["_thunder_subclass_producers"] = _Producers(trace)
    return producers


@functools.cache
def _torch_callables_by_symbol_id() -> dict:
    table = {}
    for torch_fn, sym in torch_to_thunder_symbols().items():
        table.setdefault(sym.id, []).append(torch_fn)
    return {k: tuple(v) for k, v in table.items()}


def torch_callables_of_symbol(sym) -> tuple[Callable, ...]:
    """The torch callables thunder traces as symbol ``sym`` (``torch.nn.functional.linear`` for ``ltorch.linear``;
    ``torch.mul``, ``Tensor.mul``, ... for ``ltorch.mul``), from thunder's torch -> symbol table."""
    return _torch_callables_by_symbol_id().get(sym.id, ())


def tensor_producer(p) -> tuple[tuple[Callable, ...], Any] | None:
    """``(torch_fns, bsym)``: the torch callables that thunder traces as the torch-level symbol which produced
    tensor proxy ``p`` in the computation trace being interpreted (``torch.relu``, ``Tensor.relu``, ``F.relu``: the
    symbol's arguments fit one of them), and that bound symbol; None for inputs of the trace, outside
    interpretation, and for symbols with no torch callable. (thunder's proxies carry no strides: running the torch
    callable on fakes gives eager's.)"""
    from thunder.core.trace import get_tracectx

    if get_tracectx() is None or not is_interpreting():
        return None
    b = trace_producers().get(p.name)
    if b is None:
        return None
    fns = _torch_callables_by_symbol_id().get(b.sym.id)
    return None if fns is None else (fns, b)


def operator_implementation(executor_name: str, op_name: str) -> Callable | None:
    """The function that operator ``op_name`` of the registered executor ``executor_name`` runs (what a trace's
    Python context binds to its name), or None when there is no such operator or it was not registered with ``fn=``.
    thunder 0.2.6 keeps it as the ``call_ctx`` dict in the closure of the symbol's ``_bind_postprocess``."""
    from thunder.extend import get_executor

    ex = get_executor(executor_name)
    sym = getattr(ex, "opmap", {}).get(op_name) if ex is not None else None
    post = getattr(sym, "_bind_postprocess", None)
    code = getattr(post, "__code__", None)
    if code is None or "call_ctx" not in code.co_freevars or post.__closure__ is None:
        return None
    call_ctx = post.__closure__[code.co_freevars.index("call_ctx")].cell_contents
    return call_ctx.get(op_name) if isinstance(call_ctx, dict) else None
