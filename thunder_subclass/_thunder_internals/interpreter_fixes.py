"""Interpreter fixes: thunder 0.2.6 interprets some ordinary Python unlike CPython (or torch).

Each acts only while a plugin jit traces (:func:`~.plugin_state.is_plugin_active`); found with Hugging Face
transformers 4.55-5.x models at their default call arguments, none is specific to them; each names what it works
around:

* ``core/interpreter.py`` ``_type_call_lookaside`` (through the ``general_jit_lookaside`` hook of :mod:`.tracing`) —
  ``type.__call__`` as CPython runs it, ``__init__`` looked up on the type (thunder's reads it from the instance:
  "'wrapper_descriptor' object has no attribute '__self__'" for ``typing.Callable[...]``, made on every
  ``torch.vmap`` call by torch's ``_pytree``).
* ``core/jit_ext.py`` module global ``Sequence`` (used by ``general_jit_lookaside``, ``proxify``,
  ``recursively_proxy``) — only builtin sequences are iterated, not a user's ``collections.abc.Sequence``
  (transformers 5.x ``_PerLayerConfigView``: "object has no attribute '_config'").
* ``torch.cat`` / ``F.scaled_dot_product_attention`` / ``torch.tensor`` (lookasides) — ATen's rule skipping 1-D
  empty tensors in ``cat`` (thunder's ``prims.cat_meta``: IndexError on DynamicCache's ``torch.tensor([])``);
  ``enable_gqa``, which thunder's ``ltorch.scaled_dot_product_attention`` lacks; ``torch.tensor`` of a number proxy
  under ``cache="symbolic values"`` (thunder: "NameError: name 'n' is not defined"; Gemma's embedding scale).
* ``core/symbol.py`` ``Symbol.__call__`` (through the hook of :mod:`.tracing`) — a torch-level symbol's arguments as
  torch takes them (:func:`torch_arguments`): Python types as dtypes (``torch.tensor([-1], dtype=int)``,
  ``x.to(float)``), and torch's keyword names (``F.linear(input=x, weight=w)``).
* ``core/jit_ext.py`` ``_general_jit_object_setattr_lookaside`` (through the ``general_jit_lookaside`` hook) — every
  attribute write on an input object reaches the epilogue, not only the first.
* ``core/jit_ext.py`` ``process_recorded_modifications`` — attribute writes of dtypes, devices and strings on input
  objects (its assertion admits Proxy, int, float, tuple, None, Device); attribute writes on an object the prologue
  has no proxy for, above all the compiled module itself (``self.hidden = h.detach()``, ``self.steps += 1``: thunder
  skipped them without a word), become epilogue writes on the object fetched by its provenance (a jitted module's
  ``ThunderModule._model``); also calls ``Handlers.end_of_trace``
  (thunder records item writes only for modules' member dicts: the plugin writes back the input lists and dicts
  the traced code changed) and appends the plugin's epilogue calls (``thunder_state.call_in_epilogue``: in-place
  view ops replayed on the caller's object, input containers' new contents).
* ``core/jit_ext.py`` ``build_value_from_wrapped`` — a Python object made in the traced code and returned
  (``DynamicCache``) is rebuilt by the epilogue from its class and ``__dict__`` ("unhandled value of type").
* ``clang/__init__.py`` ``_basic_indexing`` — slice bounds below ``-length`` are clamped as in Python / torch.
* ``core/interpreter.py`` ``_getattr_lookaside`` (``getattr`` and ``object.__getattribute__``, through the
  ``general_jit_lookaside`` hook) — an object whose class defines ``__getattribute__`` is read through it, then
  ``__getattr__``, as CPython does (thunder emulates ``object.__getattribute__`` whatever the class defines:
  transformers' ``PretrainedConfig.attribute_map`` was ignored, "AttributeError: num_hidden_layers" for GPT-2, GPT-J,
  Bloom); ``object.__getattribute__`` called from there reads as thunder reads attributes, traceable to the inputs.
* ``core/interpreter.py`` ``_default_opcode_handler_map["IS_OP"]`` / ``["COMPARE_OP"]`` — thunder compares the
  operands natively (``a is b``, ``a == b``), so nothing tells the trace that its branch depends on their identity or
  value: the operands go to ``Handlers.compared`` first (the plugin guards input objects among them; ``in`` is
  reported by :mod:`.interpreter_speed`'s ``CONTAINS_OP`` hook). Likewise the key of a dict lookup
  (``_default_provenance_tracking_lookaside_map[dict.__getitem__ / __contains__ / pop / __delitem__]``, thunder's
  ``MutMappingWrapperMethods``, which look it up natively), unless a str or int: ``TABLE.get(token, 3)`` reused the
  trace made for a missing key when the key was there.
* ``core/interpreter.py`` ``InterpreterCompileCtx.interpret`` — thunder adds an interpreted frame to an exception's
  traceback at the line the frame is at when the exception leaves it: after a ``with`` block's ``__exit__`` or a
  ``finally`` re-raised it, not the line that raised (CPython's). The line where an exception entered each frame is
  recorded (:func:`exception_source_lines`) and restored at ``RERAISE``; an exception raised while another is
  handled gets that one as ``__context__`` (thunder lost it).
* ``core/interpreter.py`` ``_default_provenance_tracking_lookaside_map[list.insert / clear / remove / sort / count,
  tuple.count]`` — list methods thunder lacks ("Sequence.insert, please file an issue"); comparisons interpreted.
* a C ``__setattr__`` slot other than ``object``'s (``types.SimpleNamespace``; a lookaside) — thunder took it for an
  opaque function ("'wrapper_descriptor' object has no attribute '__module__'").
* ``core/interpreter.py`` ``populate_item_wrappers`` — thunder wraps a dict's keys as constants, so what traced code
  read from a key object (``for k in TABLE: x + k.n``) was inlined unchecked. The keys of a dict read from the inputs
  (and the items of a tuple key) are marked; values read from them are guarded through the key object
  (``thunder_state.constant_rooted_path``, ``Handlers.input_object``). ``iter()`` of an input set or frozenset
  (lookaside) iterates a constant tuple of its items, marked the same way (thunder iterated it natively);
  ``vars(obj)`` (lookaside) reads ``obj.__dict__`` through the interpreter (thunder called it natively);
  ``itertools`` functions that hand objects back or to a callback (``tee`` included), ``functools.cmp_to_key``
  and ``operator.attrgetter`` / ``itemgetter`` / ``methodcaller`` calls
  (lookasides) run Python versions through the interpreter; ``getattr`` with a computed name reads it as a constant.
* ``sorted`` / ``min`` / ``max`` (lookasides, with a ``key=`` or items other than plain numbers and strings), ``map`` /
  ``filter`` (with a Python function) — run as Python through the interpreter, not natively: what the functions read
  is traced and guarded. ``COMPARE_OP`` ``<``/``<=``/``>``/``>=`` on objects whose comparison methods are Python runs
  CPython's rich-comparison order through the interpreter (thunder compares natively).
* ``core/jit_ext.py`` ``unpack_inputs`` and ``_infer_name_postfix_from_provenance`` — values under object dict keys
  (a global dict keyed by objects, iterated) unpacked by the prologue, with valid names.
"""

from __future__ import annotations

import functools
import operator
import sys
import inspect
import types
from collections.abc import Callable
from typing import Any

import torch

from thunder_subclass._thunder_internals import plugin_state
from thunder_subclass._thunder_internals.plugin_state import is_plugin_active
from thunder_subclass._thunder_internals.symbolic_values import pin_input_numbers, unpacked_parameters_tagged
from thunder_subclass._thunder_internals.thunder_state import (
    SetItems,
    call_in_epilogue,
    constant_rooted_path,
    interpret_call,
    is_interpreting,
    is_unpackable_provenance,
    mark_dict_key,
    source_location,
    torch_callables_of_symbol,
)
from thunder_subclass._thunder_internals.torch_state import is_nested_int


def is_hashable(x) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


def _type_call_lookaside(wrapped_typ, *args, **kwargs):
    """``type.__call__`` as CPython runs it (replaces ``core/interpreter.py`` ``_type_call_lookaside``, which reads
    ``__init__`` from the new *instance* and asserts it is bound): ``obj = typ.__new__(typ, ...)``; if ``obj`` is an
    instance of ``typ``, ``type(obj).__init__(obj, ...)``, looked up on the type. thunder's fails for classes whose
    instances forward attribute reads (a ``types.GenericAlias`` subclass such as ``typing.Callable[[PyTree], bool]``,
    built by torch's ``_pytree._broadcast_to_and_flatten`` on every ``torch.vmap`` call): "'wrapper_descriptor'
    object has no attribute '__self__'"."""
    from thunder.core.interpreter import (
        INTERPRETER_SIGNALS,
        _interpret_call,
        unwrap,
        wrap_const,
    )

    typ = unwrap(wrapped_typ)
    if typ is type and len(args) == 1 and not kwargs:
        return wrap_const(type(unwrap(args[0])))
    obj = _interpret_call(typ.__new__, wrapped_typ, *args, **kwargs)
    if obj is INTERPRETER_SIGNALS.EXCEPTION_RAISED or not isinstance(unwrap(obj), typ):
        return obj
    init = _interpret_call(getattr, wrap_const(type(unwrap(obj))), wrap_const("__init__"))
    if init is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
        return init
    res = _interpret_call(init, obj, *args, **kwargs)
    return res if res is INTERPRETER_SIGNALS.EXCEPTION_RAISED else obj


class _BuiltinSequenceMeta(type):
    def __instancecheck__(cls, obj):
        if is_plugin_active():
            return isinstance(obj, cls.builtin)
        return isinstance(obj, cls.abc_sequence)

    def __subclasscheck__(cls, sub):
        if is_plugin_active():
            return isinstance(sub, type) and issubclass(sub, cls.builtin)
        return issubclass(sub, cls.abc_sequence)


def _hook_jit_ext_sequence(original):
    # replaces the module global `Sequence` of thunder.core.jit_ext (collections.abc.Sequence), which
    # general_jit_lookaside (every call without a lookaside: `any(isinstance(i, TensorProxy) for i in a.value)`),
    # proxify and recursively_proxy use to decide what to iterate and rebuild. Iterating a user's Sequence runs its
    # __getitem__ / __len__ outside the interpreter, even on `self` before __init__ ran (transformers 5.x
    # _PerLayerConfigView: "object has no attribute '_config'"), and hangs on one whose __getitem__ never raises
    # IndexError. For a plugin jit only the builtin sequences (list, tuple and their subclasses such as torch.Size
    # and namedtuples, range, deque) count; otherwise collections.abc.Sequence as before.
    import collections

    return _BuiltinSequenceMeta(
        "BuiltinSequence", (), {"builtin": (list, tuple, range, collections.deque), "abc_sequence": original}
    )


def _is_legacy_empty(t) -> bool:
    from thunder.core.proxies import TensorProxy

    return isinstance(t, (TensorProxy, torch.Tensor)) and len(t.shape) == 1 and t.shape[0] == 0


def _cat(tensors, dim=0, *, out=None):
    """``torch.cat`` with ATen's legacy rule (``aten/src/ATen/native/TensorShape.cpp``): 1-D tensors of size 0 are
    skipped, so ``cat([torch.tensor([]), x], dim=-2)`` is ``x`` (transformers' DynamicCache starts from
    ``torch.tensor([])``). thunder's ``ltorch.cat`` canonicalizes ``dim`` against the first tensor
    (``prims.cat_meta``): IndexError."""
    import thunder.torch as ltorch

    if out is not None:
        raise NotImplementedError("torch.cat(..., out=) is not supported by thunder")
    tensors = list(tensors)
    kept = [t for t in tensors if not _is_legacy_empty(t)]
    if kept and len(kept) != len(tensors) and all(t.dtype == kept[0].dtype for t in tensors):
        tensors = kept
    return ltorch.cat(tensors, dim)


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """``F.scaled_dot_product_attention`` with torch >= 2.5's ``enable_gqa`` (key/value heads repeated to the query's
    head count), which thunder 0.2.6's ``ltorch.scaled_dot_product_attention`` lacks: "unexpected keyword argument
    'enable_gqa'" (transformers 5.x passes it whenever the mask is None)."""
    import thunder.torch as ltorch

    if enable_gqa and key.shape[-3] != query.shape[-3]:
        repeats = query.shape[-3] // key.shape[-3]
        key = ltorch.repeat_interleave(key, repeats, dim=-3)
        value = ltorch.repeat_interleave(value, repeats, dim=-3)
    return ltorch.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale=scale)


def _tensor(data, *, dtype=None, device=None, requires_grad=False, pin_memory=False):
    """``torch.tensor`` of a number proxy (``cache="symbolic values"``: ``torch.tensor(config.hidden_size ** 0.5)``,
    Gemma's embedding scale) as a 0-dim ``full`` of the dtype torch infers from the Python type (bool, int64, the
    default float dtype, its complex counterpart). thunder's ``ltorch.tensor`` accepts only numbers and sequences
    (``isinstance(x, (Number, Sequence))``) and its error message names an undefined variable: "NameError: name 'n'
    is not defined". Everything else goes to thunder's ``ltorch.tensor``."""
    import thunder.torch as ltorch
    from thunder.core.proxies import NumberProxy

    if isinstance(data, NumberProxy) and not requires_grad and not pin_memory:
        if dtype is None:
            python_type = data.python_type
            default = torch.get_default_dtype()
            dtype = {bool: torch.bool, int: torch.int64, float: default}.get(python_type)
            if dtype is None:  # complex
                dtype = {torch.float64: torch.complex128, torch.float16: torch.complex32}.get(default, torch.complex64)
        return ltorch.full((), data, device=device, dtype=dtype)
    return ltorch.tensor(data, dtype=dtype, device=device, requires_grad=requires_grad, pin_memory=pin_memory)


def _traced_symbol_lookaside(fn):
    from thunder.core.interpreter import interpreter_needs_wrap
    from thunder.core.jit_ext import recursively_proxy

    def lookaside(*args, **kwargs):
        recursively_proxy(*args, **kwargs)
        return interpreter_needs_wrap(fn)(*args, **kwargs)

    return lookaside


@functools.cache
def _fixed_torch_functions() -> dict:
    cat = _traced_symbol_lookaside(_cat)
    return {
        torch.cat: cat,
        torch.concat: cat,
        torch.concatenate: cat,
        torch.nn.functional.scaled_dot_product_attention: _traced_symbol_lookaside(_sdpa),
        torch.tensor: _traced_symbol_lookaside(_tensor),
    }


def _object_setattr_lookaside(original):
    """thunder's lookaside for ``object.__setattr__`` on an input object (``core/jit_ext.py``
    ``_general_jit_object_setattr_lookaside``) records the write for the epilogue through the dict ``__setitem__``
    lookaside on the object's wrapped ``__dict__``; from the second write on, the interpreter reaches that dict
    through a new wrapper without thunder's member-dict flag, and the write is not recorded: the caller's object
    keeps its old value (transformers' ``DynamicLayer.lazy_initialization`` sets four attributes, one reached the
    caller). Every write is recorded on the flagged wrapper (the epilogue keeps the last per attribute)."""
    from thunder.core.interpreter import (
        INTERPRETER_SIGNALS,
        PseudoInst,
        WrappedValue,
        unwrap,
        wrap_const,
    )
    from thunder.core.jit_ext import (
        _TORCH_DYNAMIC_TYPES,
        EXT_FLAG_IS_MODULE_MEMBER_DICT,
        get_jit_ctx,
        is_created_during_tracing,
    )

    def lookaside(obj, name, value):
        res = original(obj, name, value)
        if res is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
            return res
        uobj = unwrap(obj)
        if is_created_during_tracing(obj.provenance) or type(uobj) in _TORCH_DYNAMIC_TYPES or not hasattr(uobj, "__dict__"):
            return res
        d = obj.attribute_wrappers.get("__dict__")
        if d is not None and d.provenance.ext_flag & EXT_FLAG_IS_MODULE_MEMBER_DICT:
            name = name if isinstance(name, WrappedValue) else wrap_const(name)
            get_jit_ctx()._additional_outputs[d].append((PseudoInst.STORE_SUBSCR, d, name, value))
        return res

    return lookaside


def _is_data_descriptor(cls: type, name: str) -> bool:
    attr = inspect.getattr_static(cls, name, None)
    return attr is not None and (hasattr(type(attr), "__set__") or hasattr(type(attr), "__delete__"))


def _stores_into_instance_dict(setattr_slot, obj, name) -> bool:
    """Whether the C ``__setattr__`` slot of ``obj``'s class stores ``obj.<name> = v`` as ``object.__setattr__``
    does, into ``obj.__dict__``: tried with a marker object on ``obj`` itself, then undone."""
    d = getattr(obj, "__dict__", None)
    if type(d) is not dict or type(name) is not str or _is_data_descriptor(type(obj), name):
        return False
    had, old, marker = name in d, d.get(name), object()
    try:
        setattr_slot(obj, name, marker)
        return getattr(obj, "__dict__", None) is d and d.get(name) is marker
    except Exception:  # noqa: BLE001 - the slot refuses the write: not a plain store
        return False
    finally:
        if had:
            d[name] = old
        else:
            d.pop(name, None)


def _is_made_by_c_new(provenance) -> bool:
    """An object the traced code made by calling a class whose ``__new__`` is a C function (``types.SimpleNamespace()``):
    thunder records it as an opaque call of that ``__new__``."""
    from thunder.core.interpreter import PseudoInst

    if provenance.inst is not PseudoInst.OPAQUE or not provenance.inputs:
        return False
    fn = provenance.inputs[0]
    return fn.inst is PseudoInst.CONSTANT and getattr(fn.value, "__name__", None) == "__new__"


def _c_setattr_lookaside(setattr_slot):
    """``obj.name = value`` where ``type(obj).__setattr__`` is a C slot other than ``object``'s (``types.
    SimpleNamespace``, and classes deriving from such a type): thunder 0.2.6 takes the slot for an opaque torch-like
    function and fails registering it ("'wrapper_descriptor' object has no attribute '__module__'", plain thunder
    too). A slot that stores into the instance ``__dict__`` as ``object.__setattr__`` does (tried on the object) is
    traced as ``object.__setattr__``: the write reaches the caller's object through the epilogue, as for any Python
    object. Any other raises ``UnsupportedTracingError`` naming the line."""

    def lookaside(obj, name, value):
        from thunder.core.interpreter import unwrap
        from thunder.core.jit_ext import _general_jit_lookaside_map

        uobj, uname = unwrap(obj), unwrap(name)
        owner = setattr_slot.__objclass__
        if isinstance(uobj, owner) and _stores_into_instance_dict(setattr_slot, uobj, uname):
            if _is_made_by_c_new(obj.provenance):
                # made in the traced code (thunder's is_created_during_tracing knows object.__new__ only): stored as
                # object.__setattr__ stores into such an object; the caller (thunder's setattr lookaside) records the
                # attribute's wrapper, from which a returned object is rebuilt
                from thunder.core.interpreter import wrap_const

                uobj.__dict__[uname] = unwrap(value)
                return wrap_const(None)
            return _object_setattr_lookaside(_general_jit_lookaside_map[object.__setattr__])(obj, name, value)
        from thunder.core.interpreter import do_raise

        from thunder_subclass.errors import UnsupportedTracingError, format_location

        return do_raise(UnsupportedTracingError(
            f"setting attribute {uname!r} of a {type(uobj).__qualname__} at {format_location(*source_location())}: "
            f"its class's __setattr__ is {owner.__qualname__}'s, written in C, and does not store the value in the "
            "object's __dict__ as object.__setattr__ does, so thunder_subclass cannot trace what it does. Set the "
            "attribute outside the compiled function (return the value), or use an object of a Python class."
        ))

    return lookaside


def _class_getattribute(obj) -> Callable | None:
    """The Python ``__getattribute__`` that ``obj``'s class defines (or inherits from a Python class), or None when it
    is ``object``'s or a C type's (classes themselves are left to thunder)."""
    if isinstance(obj, type):
        return None
    getattribute = type(obj).__getattribute__
    return getattribute if type(getattribute) is types.FunctionType else None


def _getattr_through_getattribute(getattribute: Callable) -> Callable:
    """``getattr(obj, name[, default])`` as CPython's ``slot_tp_getattr_hook`` runs it for a class that defines
    ``__getattribute__``: that method (interpreted), then ``__getattr__`` when it raises AttributeError, then the
    default. thunder 0.2.6's ``_getattr_lookaside`` (``core/interpreter.py``) emulates ``object.__getattribute__``
    whatever the class defines: transformers' ``PretrainedConfig.__getattribute__`` (its ``attribute_map``:
    ``config.num_hidden_layers`` is ``config.n_layer`` for GPT-2) was never called ("AttributeError:
    num_hidden_layers" from ``DynamicCache(config=...)``, plain thunder too)."""
    from thunder.core.interpreter import (
        INTERPRETER_SIGNALS,
        _interpret_call,
        get_interpreterruntimectx,
        unwrap,
        wrap_const,
    )

    def lookaside(obj, name, *default):
        ctx = get_interpreterruntimectx()
        result = _interpret_call(wrap_const(getattribute), obj, name)
        if result is INTERPRETER_SIGNALS.EXCEPTION_RAISED and isinstance(ctx.curexc, AttributeError):
            fallback = getattr(type(unwrap(obj)), "__getattr__", None)
            if fallback is not None:
                ctx.curexc = None
                result = _interpret_call(wrap_const(fallback), obj, name)
            if result is INTERPRETER_SIGNALS.EXCEPTION_RAISED and isinstance(ctx.curexc, AttributeError) and default:
                ctx.curexc = None
                return default[0]
        return result

    return lookaside


def _object_getattribute_lookaside(obj, name):
    """``object.__getattribute__(obj, name)`` (what ``super().__getattribute__(name)`` in a class's own
    ``__getattribute__`` reaches) as thunder reads attributes: its emulation of ``object.__getattribute__``
    (``core/interpreter.py`` ``_object_getattribute_lookaside``), the value wrapped as an attribute of ``obj`` (so the
    prologue can fetch and check values read from inputs). thunder calls the C slot opaquely, and its result could not
    be traced back to the inputs."""
    from thunder.core.interpreter import (
        INTERPRETER_SIGNALS,
        WrappedValue,
        _object_getattribute_lookaside as thunder_object_getattribute,
        get_interpretercompilectx,
        wrap_attribute,
        wrap_const,
    )

    name = _constant_attribute_name(name if isinstance(name, WrappedValue) else wrap_const(name))
    if not isinstance(obj, WrappedValue):
        obj = wrap_const(obj)
    known = obj.attribute_wrappers.get(name.value) if get_interpretercompilectx()._with_provenance_tracking else None
    if known is not None:
        return known
    result = thunder_object_getattribute(obj, name)
    if result is INTERPRETER_SIGNALS.EXCEPTION_RAISED or not get_interpretercompilectx()._with_provenance_tracking:
        return result
    return wrap_attribute(result, obj, name)


def _constant_attribute_name(wrapped):
    """An attribute name computed by traced code (``super().__getattribute__(self.attribute_map[key])`` in
    transformers' ``PretrainedConfig``) as a constant, so that the value read is unpacked by the prologue as
    ``obj.<name>``: under symbolic values the name was a string proxy, and the prologue printed
    ``obj.<Proxy(name="subscr2")>`` (a SyntaxError). A string proxy is pinned to its value (a prologue check); a plain
    string read from the inputs is guarded by value where it was read (``guards.guard_input_object``)."""
    from thunder.core.interpreter import PseudoInst, wrap_const
    from thunder.core.proxies import StringProxy

    v = wrapped.value
    if isinstance(v, StringProxy) and v.value is not None:
        import thunder.clang as clang
        from thunder.core.jit_ext import get_jit_ctx

        get_jit_ctx().add_constraint((clang.check_string_value, v, v.value))
        return wrap_const(v.value)
    if type(v) is str and getattr(wrapped.provenance, "inst", None) is not PseudoInst.CONSTANT:
        return wrap_const(v)
    return wrapped


def _has_own_instancecheck(cls) -> bool:
    if type(cls) is tuple:
        return any(_has_own_instancecheck(c) for c in cls)
    return isinstance(cls, type) and type(cls).__instancecheck__ is not type.__instancecheck__


def _isinstance_raising_as_python(obj, cls):
    """thunder's ``isinstance`` lookaside (``core/jit_ext.py`` ``_general_jit_isinstance_lookaside``), with what the
    class's ``__instancecheck__`` raises raised in the traced program, where its ``except`` can catch it as in
    CPython: a ``TypedDict`` raises ``TypeError`` (huggingface_hub's strict dataclass validators catch it to try the
    next type of a union: transformers 5.x's ``config.rope_parameters = ...`` in dynamic RoPE), which left thunder's
    lookaside as an ``InterpreterError``."""
    from thunder.core.interpreter import do_raise
    from thunder.core.jit_ext import _general_jit_lookaside_map

    try:
        return _general_jit_lookaside_map[isinstance](obj, cls)
    except Exception as e:  # noqa: BLE001 - whatever __instancecheck__ raised, raised where CPython raises it
        return do_raise(e)


def _sorted(iterable, /, *, key=None, reverse=False):
    result = list(iterable)
    result.sort(key=key, reverse=reverse)
    return result


_NO_DEFAULT = object()


def _min_or_max(builtin, greater: bool, *args, key=None, default=_NO_DEFAULT):
    if not args:
        raise TypeError(f"{builtin.__name__} expected at least 1 argument, got 0")
    if len(args) > 1 and default is not _NO_DEFAULT:
        raise TypeError(f"Cannot specify a default for {builtin.__name__}() with multiple positional arguments")
    items = list(args[0]) if len(args) == 1 else list(args)
    if not items:
        return builtin([]) if default is _NO_DEFAULT else default  # CPython's error (no items), or the default
    best = items[0]
    best_key = best if key is None else key(best)
    for item in items[1:]:
        k = item if key is None else key(item)
        if (k > best_key) if greater else (k < best_key):  # CPython keeps the first of equal items
            best, best_key = item, k
    return best


_PLAIN_ITEMS = (int, float, bool, str, bytes, type(None))


def _compares_python_objects(args: tuple, kwargs: dict) -> bool:
    """Whether ``sorted``/``min``/``max`` called with these (unwrapped) arguments would run Python code natively:
    a ``key`` function, or items other than plain numbers and strings (their ``__lt__``), or an iterable whose items
    cannot be seen without consuming it."""
    from thunder.core.proxies import Proxy

    if kwargs.get("key") is not None:
        return True
    items = args
    if len(args) == 1:
        if not isinstance(args[0], (list, tuple, dict, set, frozenset)):  # (torch.Size is a tuple)
            return True
        items = args[0]
    return not all(type(i) in _PLAIN_ITEMS or isinstance(i, (Proxy, torch.Tensor)) for i in items)


def _interpreted_builtin(fn):
    """``sorted``/``min``/``max`` as Python, interpreted: the key function and the items' comparisons run traced
    (what they read is guarded like the rest of the traced code) instead of natively, where thunder's native call
    left them unseen: ``max(TABLE, key=lambda k: k.n)`` reused the trace after ``k.n`` changed."""
    return _interpreted(_sorted if fn is sorted else functools.partial(_min_or_max, fn, fn is max))


def _map(fn, *iterables):
    for args in zip(*iterables):
        yield fn(*args)


def _filter(fn, iterable):
    for item in iterable:
        if (item if fn is None else fn(item)):
            yield item


def _runs_python(fn) -> bool:
    """Whether calling ``fn`` may run Python code (anything but a builtin function or a builtin type)."""
    return not (isinstance(fn, (types.BuiltinFunctionType, types.BuiltinMethodType))
                or (isinstance(fn, type) and fn.__module__ == "builtins") or fn is None)


def _interpreted(impl):
    def lookaside(*args, **kwargs):
        return interpret_call(impl, *args, **kwargs)

    return lookaside


# Python versions of itertools functions and of calls of operator.attrgetter / itemgetter, run through the
# interpreter: thunder runs the C versions natively, so the objects they hand back (or give their callbacks) had no
# path to the inputs, and what traced code read from them was inlined unchecked (``for k in chain(objs): x + k.n``).
# Each keeps CPython's order of iteration, of calls and of what it consumes.

def _chain(*iterables):
    for iterable in iterables:
        yield from iterable


def _chain_from_iterable(iterables):
    for iterable in iterables:
        yield from iterable


def _islice(iterable, *args):
    bounds = slice(*args)
    start = 0 if bounds.start is None else bounds.start
    step = 1 if bounds.step is None else bounds.step
    counter = range(bounds.stop) if bounds.stop is not None else _count()
    wanted = start
    for i, item in zip(counter, iterable):  # zip asks the counter first: nothing past stop is consumed
        if i == wanted:
            yield item
            wanted += step


def _count():
    i = 0
    while True:
        yield i
        i += 1


def _starmap(function, iterable):
    for args in iterable:
        yield function(*args)


def _accumulate(iterable, func=None, *, initial=None):
    it = iter(iterable)
    total = initial
    if initial is None:
        for total in it:
            break
        else:
            return
    yield total
    for item in it:
        total = total + item if func is None else func(total, item)
        yield total


def _takewhile(predicate, iterable):
    for item in iterable:
        if not predicate(item):
            return
        yield item


def _dropwhile(predicate, iterable):
    it = iter(iterable)
    for item in it:
        if not predicate(item):
            yield item
            break
    yield from it


def _filterfalse(predicate, iterable):
    for item in iterable:
        if not (item if predicate is None else predicate(item)):
            yield item


def _compress(data, selectors):
    for item, selected in zip(data, selectors):
        if selected:
            yield item


def _zip_longest(*iterables, fillvalue=None):
    iterators = [iter(i) for i in iterables]
    active = len(iterators)
    if not active:
        return
    while True:
        values = []
        for i in range(len(iterators)):
            try:
                value = next(iterators[i])
            except StopIteration:
                active -= 1
                if not active:
                    return
                iterators[i] = _repeat(fillvalue)
                value = fillvalue
            values.append(value)
        yield tuple(values)


def _repeat(value):
    while True:
        yield value


def _pairwise(iterable):
    it = iter(iterable)
    for first in it:
        break
    else:
        return
    for second in it:
        yield first, second
        first = second


def _advance(indices: list, limits: list) -> bool:
    # odometer step over indices[i] < limits[i], rightmost first; False when it wraps around
    for i in reversed(range(len(indices))):
        indices[i] += 1
        if indices[i] < limits[i]:
            return True
        indices[i] = 0
    return False


def _product(*iterables, repeat=1):
    if repeat < 0:
        raise ValueError("repeat argument cannot be negative")
    pools = [tuple(pool) for pool in iterables] * repeat  # CPython reads every input first
    if any(len(pool) == 0 for pool in pools):
        return
    indices = [0] * len(pools)
    limits = [len(pool) for pool in pools]
    while True:
        yield tuple(pools[i][indices[i]] for i in range(len(pools)))
        if not _advance(indices, limits):
            return


def _combinations_indices(n: int, r: int, replacement: bool):
    # index tuples in CPython's (lexicographic) order
    if r < 0:
        raise ValueError("r must be non-negative")
    if (n == 0 and r > 0) or (not replacement and r > n):
        return
    indices = [0] * r if replacement else list(range(r))
    while True:
        yield tuple(indices)
        i = r - 1
        while i >= 0 and indices[i] == (n - 1 if replacement else i + n - r):
            i -= 1
        if i < 0:
            return
        indices[i] += 1
        for j in range(i + 1, r):
            indices[j] = indices[i] if replacement else indices[j - 1] + 1


def _combinations(iterable, r):
    pool = tuple(iterable)
    for indices in _combinations_indices(len(pool), r, False):
        yield tuple(pool[i] for i in indices)


def _combinations_with_replacement(iterable, r):
    pool = tuple(iterable)
    for indices in _combinations_indices(len(pool), r, True):
        yield tuple(pool[i] for i in indices)


def _permutations(iterable, r=None):
    pool = tuple(iterable)
    r = len(pool) if r is None else r
    if r < 0:
        raise ValueError("r must be non-negative")
    if r <= len(pool):
        yield from _distinct_positions(pool, r, [], [False] * len(pool))


def _distinct_positions(pool: tuple, r: int, chosen: list, used: list):
    # r-tuples of distinct positions in lexicographic order (CPython's order of permutations)
    if len(chosen) == r:
        yield tuple(pool[i] for i in chosen)
        return
    for i in range(len(pool)):
        if not used[i]:
            used[i] = True
            chosen.append(i)
            yield from _distinct_positions(pool, r, chosen, used)
            chosen.pop()
            used[i] = False


def _methodcaller_call(spec: tuple, obj):
    name, args, kwargs = spec
    return getattr(obj, name)(*args, **kwargs)


class _GroupBy:
    """``itertools.groupby`` as Python: each group shares the underlying iterator, and advancing to the next key
    leaves the previous group empty, as CPython's does."""

    _UNSET = object()

    def __init__(self, iterable, key=None):
        self.keyfunc = key
        self.it = iter(iterable)
        self.tgtkey = self.currkey = self.currvalue = _GroupBy._UNSET
        self.marker = object()

    def __iter__(self):
        return self

    def _key(self, value):
        return value if self.keyfunc is None else self.keyfunc(value)

    def __next__(self):
        self.marker = object()
        while self.currkey is _GroupBy._UNSET or (self.tgtkey is not _GroupBy._UNSET and self.currkey == self.tgtkey):
            self.currvalue = next(self.it)
            self.currkey = self._key(self.currvalue)
        self.tgtkey = self.currkey
        return self.currkey, self._group(self.tgtkey, self.marker)

    def _group(self, tgtkey, marker):
        while self.marker is marker and self.currkey == tgtkey:
            yield self.currvalue
            try:
                self.currvalue = next(self.it)
            except StopIteration:
                return
            self.currkey = self._key(self.currvalue)


def _attrgetter_call(paths: tuple, obj):
    values = []
    for path in paths:  # each dotted name, split natively beforehand
        value = obj
        for part in path:
            value = getattr(value, part)
        values.append(value)
    return values[0] if len(paths) == 1 else tuple(values)


def _itemgetter_call(items: tuple, obj):
    return obj[items[0]] if len(items) == 1 else tuple(obj[i] for i in items)


class _TeeIterator:
    """One of ``itertools.tee``'s iterators as Python: all of one call's iterators share the source iterator and a
    linked buffer of the items some iterator has taken from it and others have not yet (cells ``[item, next]``,
    ``next`` None until fetched)."""

    def __init__(self, source, cell):
        self._source = source
        self._cell = cell

    def __iter__(self):
        return self

    def __next__(self):
        cell = self._cell
        if cell[1] is None:
            cell[0] = next(self._source)
            cell[1] = [None, None]
        self._cell = cell[1]
        return cell[0]

    def __copy__(self):
        return _TeeIterator(self._source, self._cell)


def _tee(iterable, n=2):
    if not isinstance(n, int):
        raise TypeError(f"'{type(n).__name__}' object cannot be interpreted as an integer")
    if n < 0:
        raise ValueError("n must be >= 0")
    source, cell = iter(iterable), [None, None]
    return tuple(_TeeIterator(source, cell) for _ in range(n))


class _CmpKey:
    """An item of ``functools.cmp_to_key(cmp)`` as Python: its comparisons call ``cmp`` through the interpreter."""

    __slots__ = ("obj", "cmp")
    __hash__ = None

    def __init__(self, obj, cmp):
        self.obj = obj
        self.cmp = cmp

    def __lt__(self, other):
        return self.cmp(self.obj, other.obj) < 0

    def __gt__(self, other):
        return self.cmp(self.obj, other.obj) > 0

    def __eq__(self, other):
        return self.cmp(self.obj, other.obj) == 0

    def __le__(self, other):
        return self.cmp(self.obj, other.obj) <= 0

    def __ge__(self, other):
        return self.cmp(self.obj, other.obj) >= 0


def _cmp_to_key(mycmp):
    def key(obj):
        return _CmpKey(obj, mycmp)

    return key


@functools.cache
def _python_stand_ins() -> dict:
    """The C callable -> its Python version run through the interpreter (itertools, ``functools.cmp_to_key``)."""
    import itertools

    return {
        itertools.chain: _chain, itertools.chain.from_iterable: _chain_from_iterable, itertools.islice: _islice,
        itertools.starmap: _starmap, itertools.accumulate: _accumulate, itertools.takewhile: _takewhile,
        itertools.dropwhile: _dropwhile, itertools.filterfalse: _filterfalse, itertools.compress: _compress,
        itertools.zip_longest: _zip_longest, itertools.pairwise: _pairwise, itertools.groupby: _GroupBy,
        itertools.product: _product, itertools.combinations: _combinations,
        itertools.combinations_with_replacement: _combinations_with_replacement, itertools.permutations: _permutations,
        itertools.tee: _tee, functools.cmp_to_key: _cmp_to_key,
    }


def _getter_call(impl, parts: tuple):
    from thunder.core.interpreter import wrap_const

    def lookaside(*args, **kwargs):
        return interpret_call(impl, wrap_const(parts), *args, **kwargs)

    return lookaside


def _python_iteration_lookaside(fn, wrapped_args: tuple, wrapped_kwargs: dict):
    """The interpreted Python version of an ``itertools`` function, ``functools.cmp_to_key``, or an
    attrgetter/itemgetter/methodcaller call, or None."""
    if type(fn) is operator.methodcaller and len(wrapped_args) == 1 and not wrapped_kwargs:
        name = fn.__reduce__()  # (methodcaller, (name, *args)) or (partial(methodcaller, name, **kwargs), args)
        if name[0] is operator.methodcaller:
            spec = (name[1][0], tuple(name[1][1:]), {})
        else:
            spec = (name[0].args[1], tuple(name[1]), dict(name[0].keywords))
        return _getter_call(_methodcaller_call, spec)
    if type(fn) in (operator.attrgetter, operator.itemgetter) and len(wrapped_args) == 1 and not wrapped_kwargs:
        parts = fn.__reduce__()[1]
        if type(fn) is operator.attrgetter:
            return _getter_call(_attrgetter_call, tuple(tuple(name.split(".")) for name in parts))
        return _getter_call(_itemgetter_call, parts)
    if not is_hashable(fn):
        return None
    impl = _python_stand_ins().get(fn)
    if impl is None:
        return None
    if impl is _islice:
        import itertools

        from thunder.core.interpreter import unwrap

        bounds = [unwrap(a) for a in wrapped_args[1:]]
        if wrapped_kwargs or not all(b is None or type(b) is int for b in bounds):
            return None  # thunder's own call (keywords, number proxies)
        itertools.islice((), *bounds)  # CPython's errors for bad bounds, before anything is consumed
    return _interpreted(impl)


_ABSENT = object()


def _hasattr(wrapped_obj, wrapped_name):
    """``hasattr(obj, name)``: ``getattr(obj, name, <absent>)`` through the interpreter, so that the attribute read
    (or its absence: ``Handlers.attribute_absent``) is guarded. thunder calls ``hasattr`` natively: the trace took its
    answer unchecked, and setting the attribute later reused a trace made without it."""
    from thunder.core.interpreter import INTERPRETER_SIGNALS, _interpret_call, wrap_const

    found = _interpret_call(getattr, wrapped_obj, wrapped_name, wrap_const(_ABSENT))
    if found is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
        return found
    return wrap_const(found.value is not _ABSENT)


def _vars(wrapped_obj):
    """``vars(obj)``: ``obj.__dict__`` read as traced code reads an attribute (its items keep a path to ``obj``)."""
    from thunder.core.interpreter import _interpret_call, wrap_const

    return _interpret_call(getattr, wrapped_obj, wrap_const("__dict__"))


def _set_iter(wrapped_set):
    """``iter(s)`` of a set or frozenset read from the inputs: an iterator over a constant tuple of its items in
    CPython's order, marked so that what traced code reads from an item is guarded through it (thunder iterates a set
    natively: its items came back without provenance, and ``k.n`` of an item was inlined unchecked). The set's own
    guard checks its items and their order (``guards._guard_container_size``)."""
    from thunder.core.interpreter import _interpret_call, wrap_const

    items = wrap_const(tuple(wrapped_set.value))
    mark_dict_key(items.provenance, (SetItems(items.value), ()))
    return _interpret_call(tuple.__iter__, items)


def _getattr_with_constant_name(obj, name, *default):
    from thunder.core.interpreter import _interpret_call

    return _interpret_call(getattr, obj, _constant_attribute_name(name), *default)


def interpreter_fix_lookaside(fn, wrapped_args: tuple = (), wrapped_kwargs: dict | None = None):
    """The lookaside of an interpreter fix for ``fn`` called with ``wrapped_args`` / ``wrapped_kwargs``, or None."""
    lookaside = _python_iteration_lookaside(fn, wrapped_args, wrapped_kwargs or {})
    if lookaside is not None:
        return lookaside
    if fn is hasattr and len(wrapped_args) == 2 and not wrapped_kwargs:
        return _hasattr
    if fn is vars and len(wrapped_args) == 1 and not wrapped_kwargs \
            and hasattr(getattr(wrapped_args[0], "value", None), "__dict__"):
        # thunder calls vars() natively: the dict came back without provenance, what was read from it unchecked
        return _vars
    if fn is iter and len(wrapped_args) == 1 and not wrapped_kwargs:
        s = wrapped_args[0]
        if type(getattr(s, "value", None)) in (set, frozenset) and is_unpackable_provenance(s.provenance):
            return _set_iter
        return None
    if (fn is map or fn is filter) and wrapped_args and not wrapped_kwargs:
        from thunder.core.interpreter import unwrap

        # thunder calls map/filter natively: a Python function they call ran outside the trace (its reads unguarded)
        if _runs_python(unwrap(wrapped_args[0])) and (fn is map or len(wrapped_args) == 2):
            return _interpreted(_map if fn is map else _filter)
        return None
    if fn is sorted or fn is min or fn is max:
        from thunder.core.interpreter import unwrap

        kwargs = {k: unwrap(v) for k, v in (wrapped_kwargs or {}).items()}
        if _compares_python_objects(tuple(unwrap(a) for a in wrapped_args), kwargs):
            return _interpreted_builtin(fn)
        return None  # plain numbers and strings: thunder's own call
    if fn is getattr and len(wrapped_args) in (2, 3):
        from thunder.core.interpreter import PseudoInst, unwrap

        name = unwrap(wrapped_args[1])
        if type(name) is str and getattr(getattr(wrapped_args[1], "provenance", None), "inst", None) is not \
                PseudoInst.CONSTANT:
            # a name computed in traced code (``getattr(cfg, f"w{i}")``): thunder records the read with the name's
            # own provenance, which its prologue cannot unpack, and inlined the value unchecked. Read with the name
            # as a constant (its value is the traced code's, itself checked or constant), the value is guarded
            return _getattr_with_constant_name
        if not isinstance(name, str) or (name.startswith("__") and name.endswith("__")):
            # dunders: thunder reads them with the real getattr (which calls the class's __getattribute__); its own
            # emulation of object.__getattribute__ reads obj.__dict__ that way too
            return None
        getattribute = _class_getattribute(unwrap(wrapped_args[0]))
        if getattribute is not None:
            return _getattr_through_getattribute(getattribute)
        return None
    if fn is object.__getattribute__:
        return _object_getattribute_lookaside
    if fn is isinstance and len(wrapped_args) == 2 and not wrapped_kwargs:
        from thunder.core.interpreter import unwrap
        from thunder.core.proxies import NumberProxy

        # (a number proxy's isinstance is symbolic_values's; a plain class's type.__instancecheck__ raises nothing)
        if not isinstance(unwrap(wrapped_args[0]), NumberProxy) and _has_own_instancecheck(unwrap(wrapped_args[1])):
            return _isinstance_raising_as_python
        return None
    if (fn is bool or fn is int or fn is float or fn is operator.index) and len(wrapped_args) == 1:
        from thunder.core.interpreter import interpreter_needs_wrap, unwrap
        from thunder.core.proxies import NumberProxy

        v = unwrap(wrapped_args[0])
        if isinstance(v, NumberProxy) and v.value is None:
            return interpreter_needs_wrap(functools.partial(_data_dependent_number, fn))
        return None
    if fn is type.__call__:
        return _type_call_lookaside
    if fn is object.__setattr__:
        from thunder.core.jit_ext import _general_jit_lookaside_map

        return _object_setattr_lookaside(_general_jit_lookaside_map[object.__setattr__])
    if (type(fn) is types.WrapperDescriptorType and fn.__name__ == "__setattr__" and len(wrapped_args) == 3
            and fn.__objclass__.__module__ != "builtins"):
        # (builtins' own: object's has its lookaside; type's, module's stay with thunder)
        return _c_setattr_lookaside(fn)
    if is_hashable(fn):
        return _fixed_torch_functions().get(fn)
    return None


def _data_dependent_number(fn, v):
    """``bool(n)`` (an ``if`` on it), ``int(n)``, ``float(n)`` of a number thunder does not know while tracing: one
    computed from tensor data (``x.sum().item() > 0``; thunder 0.2.6's ``prims.item`` gives a number proxy without
    value). thunder's bool lookaside took such a number as false and baked that branch into the trace: a silently
    wrong result for inputs that take the other branch (plain ``thunder.jit`` too). Raised as thunder's own error for a
    tensor in a branch, so that ``thunder_subclass.jit`` runs the code eagerly (a graph break) and
    ``fullgraph=True`` reports it."""
    raise NotImplementedError(
        f"converting {v.name}, a number computed from tensor data (e.g. by .item()), to a Python "
        f"{fn.__name__} is not supported (data dependency)"
    )


# torch's Python argument parser takes Python types where it takes a dtype (torch/csrc/utils/python_arg_parser.cpp)
_PYTHON_TYPE_DTYPES = {int: torch.int64, float: torch.float64, bool: torch.bool, complex: torch.complex128}
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _as_dtype(v):
    return _PYTHON_TYPE_DTYPES.get(v, v) if type(v) is type else v


_meta_parameters: dict = {}  # a symbol's meta -> (its keyword names, whether it takes **kwargs, its signature)


def _meta_keywords(sym) -> tuple[frozenset, bool, Any]:
    meta = sym.meta
    found = _meta_parameters.get(meta)
    if found is None:
        try:
            sig = inspect.signature(meta)
        except (TypeError, ValueError):
            found = (frozenset(), True, None)
        else:
            params = sig.parameters.values()
            found = (frozenset(p.name for p in params if p.kind is not inspect.Parameter.POSITIONAL_ONLY),
                     any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params), sig)
        _meta_parameters[meta] = found
    return found


@functools.cache
def _torch_signatures() -> dict:
    # torch's own parameter names of every overridable torch function (its C functions have no inspectable
    # signature): the test lambdas of torch.overrides, e.g. F.linear -> lambda input, weight, bias=None: -1
    return torch.overrides.get_testing_overrides()


def _torch_keywords_as_positions(sym, args: tuple, kwargs: dict, meta_sig) -> tuple[tuple, dict]:
    for fn in torch_callables_of_symbol(sym):
        signature_of = _torch_signatures().get(fn)
        if signature_of is None:
            continue
        try:
            tsig = inspect.signature(signature_of)
            # (the lambdas leave some keyword-only parameters out, torch.add's alpha: those stay keywords)
            bound = tsig.bind(*args, **{k: v for k, v in kwargs.items() if k in tsig.parameters})
        except (TypeError, ValueError):
            continue
        rest = {k: v for k, v in kwargs.items() if k not in tsig.parameters}
        params = list(tsig.parameters.values())
        positional = [p for p in params if p.kind in _POSITIONAL]
        given = [i for i, p in enumerate(positional) if p.name in bound.arguments]
        new_args = [bound.arguments.get(p.name, p.default) for p in positional[: given[-1] + 1]] if given else []
        new_kwargs = dict(rest)
        for p in params:
            if p.name not in bound.arguments:
                continue
            if p.kind is inspect.Parameter.VAR_POSITIONAL:
                new_args.extend(bound.arguments[p.name])
            elif p.kind is inspect.Parameter.KEYWORD_ONLY:
                new_kwargs[p.name] = bound.arguments[p.name]
            elif p.kind is inspect.Parameter.VAR_KEYWORD:
                new_kwargs.update(bound.arguments[p.name])
        try:
            meta_sig.bind(*new_args, **new_kwargs)
        except TypeError:
            continue
        return tuple(new_args), new_kwargs
    return args, kwargs


def torch_arguments(sym, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The arguments of a call of torch-level symbol ``sym`` (from a torch function, method or operator in traced
    code) as thunder's symbol takes them, where torch takes more than thunder 0.2.6 does:

    * a Python type where a dtype goes (``torch.tensor([-1], dtype=int)``, ``x.to(float)``, ``torch.zeros(n,
      dtype=bool)``: int64, float64, bool, complex128 as torch's argument parser maps them; thunder: "ValueError:
      <class 'int'> had an unexpected type <class 'type'>"; transformers' ``StaticSlidingWindowLayer.update``);
    * torch's keyword names for arguments thunder names otherwise (``F.linear(input=x, weight=w, bias=b)``: thunder's
      ``ltorch.linear(a, w, bias)`` raised "unexpected keyword argument 'weight'"): bound to torch's signature (the
      ``torch.overrides`` test lambdas name every overridable function's parameters) and passed by position.

    * torch's factory keywords at the values that change nothing (``torch.ones(2, requires_grad=False)``,
      ``pin_memory=False``, ``layout=torch.strided``), which some of thunder's factories lack ("ones() got an
      unexpected keyword argument 'requires_grad'"): left out. ``requires_grad=True`` on a factory makes a new leaf
      that collects a gradient, which a trace cannot: ``UnsupportedTracingError`` naming the line (thunder 0.2.6
      raised a TypeError or a bare NotImplementedError).

    Anything else is returned unchanged."""
    if kwargs:
        names, var_keyword, meta_sig = _meta_keywords(sym)
        if "requires_grad" in kwargs or "pin_memory" in kwargs or "layout" in kwargs:
            kwargs = _factory_keywords(sym, kwargs, names, var_keyword)
        if not var_keyword and not names.issuperset(kwargs):
            args, kwargs = _torch_keywords_as_positions(sym, args, kwargs, meta_sig)
        for v in kwargs.values():
            if type(v) is type:
                kwargs = {k: _as_dtype(v) for k, v in kwargs.items()}
                break
    for a in args:
        if type(a) is type:
            return tuple(_as_dtype(a) for a in args), kwargs
    return args, kwargs


# torch's tensor-factory keywords and the value at which each changes nothing about the tensor made
_INERT_FACTORY_KEYWORDS = (("requires_grad", False), ("pin_memory", False), ("layout", torch.strided))


def _factory_keywords(sym, kwargs: dict, names: frozenset, var_keyword: bool) -> dict:
    requires_grad = kwargs.get("requires_grad", False)
    if type(requires_grad) is bool and requires_grad and sym.name != "requires_grad_":
        from thunder_subclass.errors import UnsupportedTracingError, format_location

        raise UnsupportedTracingError(
            f"{sym.name}(..., requires_grad=True) at {format_location(*source_location())} makes a new leaf "
            "tensor that collects a gradient inside the compiled function, which a thunder trace cannot hold (its "
            "gradient would be lost). Make the tensor outside the compiled function (an argument, or an nn.Parameter "
            "of the module) and pass it in; inside, requires_grad=False (the default) works as in eager."
        )
    dropped = {k for k, inert in _INERT_FACTORY_KEYWORDS
               if k in kwargs and (var_keyword or k not in names) and _is_inert(kwargs[k], inert)}
    return {k: v for k, v in kwargs.items() if k not in dropped} if dropped else kwargs


def _is_inert(value, inert) -> bool:
    if type(inert) is bool:
        return type(value) is bool and value is inert
    return value is inert


def _clamp_bound(b, length):
    from thunder.core.proxies import NumberProxy

    value = b.value if isinstance(b, NumberProxy) else b
    length_value = length.value if isinstance(length, NumberProxy) else length
    if not isinstance(value, int) or isinstance(value, bool) or not isinstance(length_value, int):
        return b
    if value >= -length_value:
        return b
    for p in (b, length):  # under symbolic values the clamping holds for these numbers only
        if isinstance(p, NumberProxy) and is_interpreting():
            pin_input_numbers(p)
    return -length_value


def _hook_basic_indexing(original):
    # wraps thunder.clang._basic_indexing, which rejects slice bounds below -length ("start=-4095 is not a valid
    # index for length 16") where Python and torch clamp them (x[-4095:] of a length-16 dim is all of it;
    # transformers' sliding-window cache layers slice `[:, :, -self.sliding_window + 1:, :]`)
    @functools.wraps(original)
    def _basic_indexing(a, /, key):
        if not is_plugin_active():
            return original(a, key)
        new_key, dim = [], 0
        for x in key:  # a list, ellipses resolved; None entries add a dimension and index none of a's
            if isinstance(x, slice) and dim < len(a.shape):
                x = slice(_clamp_bound(x.start, a.shape[dim]), _clamp_bound(x.stop, a.shape[dim]), x.step)
            new_key.append(x)
            dim += x is not None
        return original(a, new_key)

    return _basic_indexing


class _ConstantAttributeValueMeta(type):
    def __instancecheck__(cls, obj):
        return _epilogue_attribute_value(obj)


class _ConstantAttributeValue(metaclass=_ConstantAttributeValueMeta):
    """What ``isinstance(v, NoneType)`` admits inside ``process_recorded_modifications`` for a plugin jit."""


def _hook_process_recorded_modifications(original):
    # wraps thunder.core.jit_ext.process_recorded_modifications, which asserts that a value the traced code writes to
    # an attribute of an input object (the epilogue's pack_attr) is a Proxy, int, float, tuple, None or thunder Device
    # (the tuple is built from jit_ext's module globals when it runs). transformers' DynamicLayer writes
    # `self.dtype = key_states.dtype` on a cache layer generate() passes in: "trying to set .dtype ... to object of
    # type dtype"; transformers 5.x's dynamic RoPE sets `config.rope_parameters = {...}`. For a plugin jit,
    # jit_ext.NoneType admits what the epilogue can hold (_epilogue_attribute_value: printable constants, and tuples,
    # lists and dicts of them and of proxies) while it runs.
    @functools.wraps(original)
    def process_recorded_modifications(ctx, epilogue_trace):
        import thunder.core.jit_ext as jit_ext

        if not is_plugin_active():
            return original(ctx, epilogue_trace)
        unwritten = _attribute_writes_thunder_drops(ctx)
        buffers = _take_buffer_writes(ctx)
        saved = jit_ext.NoneType
        jit_ext.NoneType = _ConstantAttributeValue
        try:
            original(ctx, epilogue_trace)
        finally:
            jit_ext.NoneType = saved
        plugin_state.handlers.end_of_trace()
        _write_attributes_in_epilogue(unwritten)
        _write_buffers_in_epilogue(buffers)
        _add_epilogue_calls(ctx, epilogue_trace)

    return process_recorded_modifications


def _take_buffer_writes(ctx) -> list[tuple[Any, dict[str, Any]]]:
    """The buffer writes of the traced code (``self.register_buffer(name, t)``, ``self._buffers[name] = t``:
    transformers' dynamic RoPE in ``generate``), taken out of thunder's recorded modifications, each as (provenance of
    the module, {name: last value written, wrapped}); written back by :func:`_write_buffers_in_epilogue`. thunder
    writes them with ``prims.pack_buffer`` on the module path from the root, printed as ``root.set_buffer(name, t)``,
    a method of ``ThunderModule`` only: with a jitted bound method (``model.forward = jit(model.forward)``) it failed,
    either finding no module path from the root ("assert provenance.inputs[0].inst is PseudoInst.LOAD_ATTR") or in
    the epilogue ("'LlamaForCausalLM' object has no attribute 'set_buffer'"); with a jitted module the buffer went
    to thunder's override table only, and the user's module kept the old buffer, which eager replaces."""
    from thunder.core.compile_data import get_compile_data
    from thunder.core.interpreter import PseudoInst

    from thunder_subclass._thunder_internals.thunder_state import hooked_module_provenance

    taken = []
    for modified in list(ctx._additional_outputs):
        provenance = modified.provenance
        if provenance.inst is not PseudoInst.LOAD_ATTR or provenance.inputs[1].inst is not PseudoInst.CONSTANT \
                or provenance.inputs[1].value != "_buffers" or not isinstance(modified.value, dict):
            continue
        owner = provenance.inputs[0]
        if owner.inst is PseudoInst.INPUT_FN:
            fn = getattr(get_compile_data(), "fn", None)
            if fn is not None:
                owner = hooked_module_provenance(fn, owner)
        if not is_unpackable_provenance(owner):
            continue  # (thunder's own path)
        last: dict[str, Any] = {}
        for inst, *args in ctx._additional_outputs[modified]:
            if inst != PseudoInst.STORE_SUBSCR:
                break
            _, key, value = args
            last[key.value] = value
        else:
            del ctx._additional_outputs[modified]
            taken.append((owner, last))
    return taken


def _write_buffers_in_epilogue(writes: list) -> None:
    from thunder.core.interpreter import unwrap

    for owner, last in writes:
        for name, wrapped in last.items():
            call_in_epilogue(_set_module_buffer_symbol(), owner, name, unwrap(wrapped))


def _set_module_buffer(module, name: str, value) -> None:
    """``module._buffers[name] = value``, as the traced code did (on the user's module under a ``ThunderModule``)."""
    from thunder.core.module import ThunderModule

    if isinstance(module, ThunderModule):
        module._overrides_buffers[name] = value  # what thunder's get_buffer reads
        module = module._model
    module._buffers[name] = value


@functools.cache
def _set_module_buffer_symbol():
    import thunder.core.prims as prims

    sym = plugin_state.handlers.executor.register_operator(
        "set_module_buffer", meta=lambda module, name, value: None, fn=_set_module_buffer,
        tags=[prims.OpTags.DONT_DCE])
    plugin_state.remember_symbol_origin(sym, _set_module_buffer, _set_module_buffer_symbol)
    return sym


def _attribute_writes_thunder_drops(ctx) -> list[tuple[Any, str, dict[str, Any]]]:
    """The attribute writes (``obj.name = value`` in traced code) that ``process_recorded_modifications`` skips without
    a word: on an object whose provenance carries no prologue proxy, above all the compiled module itself (provenance
    ``INPUT_FN``: ``self.hidden = h.detach()``, ``self.steps += 1`` in the root's ``forward`` were silently not done,
    plain ``thunder.jit`` too). Each as (provenance to write through, the object's class name for errors, {name: last
    value written, wrapped})."""
    from thunder.core.compile_data import get_compile_data
    from thunder.core.interpreter import PseudoInst

    from thunder_subclass._thunder_internals.thunder_state import hooked_module_provenance

    dropped = []
    for modified, modifications in ctx._additional_outputs.items():
        provenance = modified.provenance
        if not isinstance(modified.value, dict) or provenance.inst is not PseudoInst.LOAD_ATTR \
                or provenance.inputs[1].inst is not PseudoInst.CONSTANT or provenance.inputs[1].value != "__dict__":
            continue
        owner = provenance.inputs[0]
        if hasattr(owner, "proxy") or not is_unpackable_provenance(owner):
            # thunder's pack_attr writes it; or an object made while tracing (thunder's own SequenceIter, its
            # next_pos), which no call after this one sees
            continue
        name = "object"
        if owner.inst is PseudoInst.INPUT_FN:
            fn = getattr(get_compile_data(), "fn", None)  # the jitted callable (INPUT_FN while interpreting)
            if fn is not None:
                name = type(fn).__name__
                # the prologue fetches a jitted module as its ThunderModule: the write goes to the user's module
                owner = hooked_module_provenance(fn, owner)
        last: dict[str, Any] = {}
        for inst, *args in modifications:
            if inst == PseudoInst.STORE_SUBSCR:
                _, key, value = args
                last[key.value] = value
        if last:
            dropped.append((owner, name, last))
    return dropped


def _epilogue_attribute_value(v) -> bool:
    """Whether the epilogue can hold ``v`` (a value written to an attribute): proxies, constants and tuples, lists and
    dicts of them."""
    import thunder
    from thunder.core.proxies import Proxy

    if v is None or isinstance(v, (Proxy, bool, int, float, complex, str, torch.dtype, torch.device,
                                   thunder.dtypes.dtype, thunder.devices.Device)):
        return True
    if type(v) in (tuple, list):
        return all(_epilogue_attribute_value(x) for x in v)
    if type(v) is dict:
        return all(type(k) in (str, int) and _epilogue_attribute_value(x) for k, x in v.items())
    return False


def _write_attributes_in_epilogue(writes: list) -> None:
    """Epilogue calls (``prims.pack_attr``, thunder's own write) for the writes :func:`_attribute_writes_thunder_drops`
    found, on the object fetched from the inputs by its provenance; a value the epilogue cannot hold is a typed
    error (it was dropped)."""
    import thunder.core.prims as prims
    from thunder.core.interpreter import unwrap

    from thunder_subclass.errors import UnsupportedTracingError

    for owner, owner_name, last in writes:
        for name, wrapped in last.items():
            value = unwrap(wrapped)
            if not _epilogue_attribute_value(value):
                raise UnsupportedTracingError(
                    f"the compiled code sets {owner_name}.{name} (an attribute of the compiled module or of an object "
                    f"reached from it) to an object of type {type(value).__name__}, which the compiled function "
                    f"cannot write back after each call: assign tensors, numbers, strings, dtypes, devices or "
                    f"tuples, lists and dicts of them, or return the object and assign it outside the compiled call"
                )
            call_in_epilogue(prims.pack_attr, owner, name, value)


def _add_epilogue_calls(ctx, epilogue_trace) -> None:
    # the calls call_in_epilogue collected, each on a proxy of the caller's object made from its provenance (one per
    # object): not a computation input, so thunder passes it from the prologue to the epilogue
    from thunder.core.proxies import Proxy
    from thunder.core.trace import tracectx

    objects: dict[int, Any] = {}
    for sym, history, args in ctx.__dict__.get("_thunder_subclass_state", {}).get("epilogue_calls", ()):
        obj = objects.get(id(history))
        if obj is None:
            obj = objects[id(history)] = Proxy(history=history)
            epilogue_trace.add_name(obj.name)
        with tracectx(epilogue_trace):
            epilogue_trace.bound_symbols.append(sym.bind(obj, *args, output=None))


@functools.cache
def _object_rebuild_symbol():
    from thunder.core.proxies import AnyProxy

    def meta(typ, state):
        return AnyProxy(None)

    def impl(typ, state):
        obj = typ.__new__(typ)
        obj.__dict__.update(state)
        return obj

    sym = plugin_state.handlers.executor.register_operator("python_object_rebuild", meta=meta, fn=impl)
    plugin_state.remember_symbol_origin(sym, impl, _object_rebuild_symbol)
    return sym


def _is_plain_object(v) -> bool:
    """An object that ``build_value_from_wrapped`` has no rule for: not a constant, collection, dataclass, tensor,
    module, type or callable; a Python object with a ``__dict__``."""
    import dataclasses
    import enum
    import types

    import thunder
    import thunder.core.baseutils as baseutils
    import thunder.core.codeutils as codeutils
    from thunder.core.proxies import ProxyInterface

    if isinstance(v, (thunder.dtypes.dtype, thunder.devices.Device, ProxyInterface, codeutils.ContextObject,
                      torch.finfo, enum.Enum, type, torch.Tensor, torch.nn.Module, types.ModuleType)):
        return False
    if type(v) in (str, object) or baseutils.is_base_printable(v) or baseutils.is_collection(v) or callable(v):
        return False
    return type(v).__module__ != "builtins" and hasattr(v, "__dict__") and not dataclasses.is_dataclass(v)


def _hook_build_value_from_wrapped(original):
    # wraps thunder.core.jit_ext.build_value_from_wrapped (the epilogue's return value; recursive through the module
    # global), which knows inputs, constants, dataclasses, tuples, lists and dicts: any other object made in the
    # traced code and returned raises "unhandled value of type <class '...DynamicCache'>". Such an object is rebuilt
    # by the epilogue from its class and its __dict__, with the attributes the traced code set taken as their values
    # in the trace (proxies become the computed tensors).
    @functools.wraps(original)
    def build_value_from_wrapped(wrapped_v):
        import thunder.core.jit_ext as jit_ext
        from thunder.core.interpreter import unwrap

        v = unwrap(wrapped_v)
        if is_plugin_active() and is_nested_int(v):
            from thunder_subclass.errors import UnsupportedSubclassOperationError

            raise UnsupportedSubclassOperationError(
                f"the compiled function returns {v}, the ragged size of a jagged NestedTensor (a nested int): the "
                f"compiled program would return the one seen when it was traced, also for a NestedTensor with other "
                f"offsets on a cache hit. Return the NestedTensor and read its .shape outside the compiled function."
            )
        if (
            is_plugin_active()
            and not hasattr(wrapped_v, "anyproxy")
            and not jit_ext.should_register_for_prologue(wrapped_v.provenance)
            and _is_plain_object(v)
        ):
            state = {}
            for k, value in vars(v).items():
                w = wrapped_v.attribute_wrappers.get(k)
                state[k] = jit_ext.build_value_from_wrapped(w) if w is not None else value
            return _object_rebuild_symbol()(type(v), state)
        return original(wrapped_v)

    return build_value_from_wrapped


def report_comparison(op: str, a, b) -> None:
    """The interpreter is about to compare wrapped values ``a`` and ``b`` natively (``op``: ``"is"``, ``"=="``,
    ``"in"``): their values go to ``Handlers.compared``."""
    if is_plugin_active():
        plugin_state.handlers.compared(op, getattr(a, "value", a), getattr(b, "value", b))


_ORDERING = {"<": ("__lt__", "__gt__"), "<=": ("__le__", "__ge__"), ">": ("__gt__", "__lt__"),
             ">=": ("__ge__", "__le__")}


def _rich_compare(a, b, name, reflected, symbol):
    # CPython's do_richcompare, interpreted: the reflected method of a strict subclass of a's type first, then a's,
    # then b's reflected one
    ta, tb = type(a), type(b)
    checked_reverse = False
    if ta is not tb and issubclass(tb, ta):
        checked_reverse = True
        res = getattr(tb, reflected)(b, a)
        if res is not NotImplemented:
            return res
    res = getattr(ta, name)(a, b)
    if res is not NotImplemented:
        return res
    if not checked_reverse:
        res = getattr(tb, reflected)(b, a)
        if res is not NotImplemented:
            return res
    raise TypeError(f"'{symbol}' not supported between instances of '{ta.__name__}' and '{tb.__name__}'")


def _python_ordering(a, b, names: tuple) -> bool:
    """Whether ``a < b`` (and the like) would run Python code: a comparison method written in Python on either
    operand's type (``functools.total_ordering``, a dataclass with ``order=True``, a class's own ``__lt__``).
    Proxies and tensors keep thunder's path (their comparisons are traced operations)."""
    from thunder.core.proxies import Proxy

    if isinstance(a, (Proxy, torch.Tensor)) or isinstance(b, (Proxy, torch.Tensor)):
        return False
    return any(type(getattr(t, n, None)) is types.FunctionType for t in (type(a), type(b)) for n in names)


def _compare_op_index(inst) -> int:
    if sys.version_info >= (3, 13):
        return inst.arg >> 5
    if sys.version_info >= (3, 12):
        return inst.arg >> 4
    return inst.arg


def _hook_comparison(op: str):
    def make(original):
        # wraps thunder.core.interpreter's IS_OP / COMPARE_OP handler, which compares the unwrapped operands natively
        @functools.wraps(original)
        def comparison_handler(inst, /, stack, **kwargs):
            if len(stack) >= 2:
                a, b = stack.getitem_wrapped(-2), stack.getitem_wrapped(-1)
                report_comparison(op, a, b)
                if op == "==" and is_plugin_active():
                    import dis

                    symbol = dis.cmp_op[_compare_op_index(inst)]
                    names = _ORDERING.get(symbol)
                    if names is not None and _python_ordering(getattr(a, "value", a), getattr(b, "value", b), names):
                        return _interpreted_ordering(inst, stack, symbol, names)
            return original(inst, stack=stack, **kwargs)

        return comparison_handler

    return make


def _interpreted_ordering(inst, stack, symbol: str, names: tuple):
    """``a < b`` (``<=``, ``>``, ``>=``) on objects whose comparison methods are Python, interpreted: thunder runs
    every comparison natively, so what ``__lt__`` read (``self.n < other.n``) was unseen by the trace, and a changed
    value reused it (``max(objs)``, ``if a < b:``)."""
    from thunder.core.interpreter import INTERPRETER_SIGNALS, _interpret_call, wrap_const

    b = stack.pop_wrapped()
    a = stack.pop_wrapped()
    res = _interpret_call(_rich_compare, a, b, wrap_const(names[0]), wrap_const(names[1]), wrap_const(symbol))
    if res is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
        return res
    if sys.version_info >= (3, 13) and (inst.arg & 0x10):
        res = _interpret_call(bool, res)
        if res is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
            return res
    stack.append(res)
    return None


def _hook_keyed_lookup(original):
    # wraps the provenance-tracking dict method thunder's interpreter runs for d[k] / k in d / d.pop(k) / del d[k]
    # (interpreter.MutMappingWrapperMethods), which looks the key up natively: the key's hash and == decide, reported
    # as a comparison (str and int keys are checked by value by thunder itself)
    @functools.wraps(original)
    def keyed_lookup(self, key, *rest, **kwargs):
        k = getattr(key, "value", key)
        if type(k) is not str and type(k) is not int:
            report_comparison("in", key, self)
        return original(self, key, *rest, **kwargs)

    return keyed_lookup


def _list_index(i):
    """``i`` (wrapped) as the int a list method takes (``operator.index``); a number proxy (symbolic values) is pinned:
    which item moves depends on its value."""
    from thunder.core.proxies import NumberProxy

    value = getattr(i, "value", i)
    if isinstance(value, NumberProxy):
        pin_input_numbers(value)
        value = value.value
    return operator.index(value)


def _hook_list_insert(original):
    # replaces thunder's list.insert lookaside (core/interpreter.py MutSequenceWrapperMethods.insert: "NotImplementedError:
    # Sequence.insert, please file an issue"): the list and its item wrappers get the item at the same position
    def insert(self, i, x, /):
        if not is_plugin_active():
            return original(self, i, x)
        from thunder.core.interpreter import do_raise, wrap_const

        self.track_items()
        try:
            index = _list_index(i)
        except TypeError as e:
            return do_raise(e)
        self.value.insert(index, x.value)
        self.item_wrappers.insert(index, x)
        return wrap_const(None)

    return insert


def _hook_list_clear(original):
    # replaces thunder's list.clear lookaside (MutSequenceWrapperMethods.clear: "Sequence.clear, please file an issue")
    def clear(self, /):
        if not is_plugin_active():
            return original(self)
        from thunder.core.interpreter import wrap_const

        self.track_items()
        self.value.clear()
        self.item_wrappers.clear()
        return wrap_const(None)

    return clear


def _remove_impl(seq, value):
    # list.remove as CPython runs it (PyObject_RichCompareBool: identity, then ==), interpreted: each comparison is one
    # the trace depends on (reported and guarded like the user's own)
    for i in range(len(seq)):
        item = seq[i]
        if item is value or item == value:
            del seq[i]
            return None
    raise ValueError("list.remove(x): x not in list")


def _count_impl(seq, value):
    n = 0
    for item in seq:
        if item is value or item == value:
            n += 1
    return n


def _interpreted_method(impl):
    """A hook replacing one of thunder's sequence method lookasides (one that raises "please file an issue") by
    ``impl`` interpreted on the sequence's wrapper, for plugin jits."""
    def hook(original):
        def method(self, x, /):
            if not is_plugin_active():
                return original(self, x)
            from thunder.core.interpreter import _interpret_call, wrap_const

            self.track_items()
            return _interpret_call(wrap_const(impl), self, x)

        return method

    return hook


# list.remove (MutSequenceWrapperMethods.remove) and list.count / tuple.count (SequenceWrapperMethods.count)
_hook_list_remove = _interpreted_method(_remove_impl)
_hook_sequence_count = _interpreted_method(_count_impl)


def _is_less(a, b):
    # one comparison of list.sort, interpreted (a branch of the trace on its answer: guarded like the user's own)
    return bool(a < b)


class _ComparisonRaised(Exception):
    pass


def _hook_list_sort(original):
    # replaces thunder's list.sort lookaside ("<class 'list'>.sort is not yet supported, please file an issue"). The
    # permutation is the one CPython's sort gives (sorted() of the positions, whose `<` is the interpreted comparison
    # of the items or keys: the same comparisons, in the same order, NaNs included); key is called once per item, in
    # order, interpreted. The list and its item wrappers are permuted alike.
    def sort(self, /, *args, key=None, reverse=False):
        if not is_plugin_active():
            return original(self, *args, key=key, reverse=reverse)
        from thunder.core.interpreter import (
            INTERPRETER_SIGNALS,
            _interpret_call,
            do_raise,
            unwrap,
            wrap_const,
        )

        if args:
            return do_raise(TypeError("sort() takes no positional arguments"))
        self.track_items()
        items = list(self.item_wrappers)
        keys = items
        if key is not None and unwrap(key) is not None:
            keys = []
            for w in items:
                k = _interpret_call(key, w)
                if k is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
                    return k
                keys.append(k)
        try:
            descending = bool(operator.index(unwrap(reverse)))
        except TypeError as e:
            return do_raise(e)
        less = wrap_const(_is_less)

        class Position:
            __slots__ = ("i",)

            def __init__(self, i):
                self.i = i

            def __lt__(self, other):
                answer = _interpret_call(less, keys[self.i], keys[other.i])
                if answer is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
                    raise _ComparisonRaised
                return unwrap(answer)

        try:
            order = sorted(range(len(items)), key=Position, reverse=descending)
        except _ComparisonRaised:
            return INTERPRETER_SIGNALS.EXCEPTION_RAISED
        values = list(self.value)
        self.value[:] = [values[i] for i in order]
        self.item_wrappers[:] = [items[i] for i in order]
        return wrap_const(None)

    return sort


@functools.cache
def _constant_key_proxy_class():
    from thunder.core.proxies import AnyProxy

    class ConstantKeyProxy(AnyProxy):
        """The prologue's name for an object used as a dict key (``TABLE[K1]``). thunder orders the prologue's
        unpacked values by their paths, the keys of subscripts included, and proxies refuse comparisons: these
        compare by creation order among themselves and after any other key."""

        _DEFAULT_PREFIX = "key"
        _made = 0

        def __init__(self, o, /, **kwargs):
            super().__init__(o, **kwargs)
            ConstantKeyProxy._made += 1
            self._order = ConstantKeyProxy._made

        def __eq__(self, other):
            return self is other

        __hash__ = AnyProxy.__hash__

        def __lt__(self, other):
            return isinstance(other, ConstantKeyProxy) and self._order < other._order

        def __gt__(self, other):
            return not isinstance(other, ConstantKeyProxy) or self._order > other._order

        def __le__(self, other):
            return self is other or self < other

        def __ge__(self, other):
            return self is other or self > other

        def replace(self, **changes):
            kwargs = dict(name=self.name, history=self.history, tags=self.tags)
            kwargs.update(changes)
            return ConstantKeyProxy(self._o, **kwargs)

    return ConstantKeyProxy


@functools.cache
def _constant_object_symbol():
    def meta(obj):
        return _constant_key_proxy_class()(obj)

    def impl(obj):
        return obj

    sym = plugin_state.handlers.executor.register_operator("python_constant_object", meta=meta, fn=impl)
    plugin_state.remember_symbol_origin(sym, impl, _constant_object_symbol)
    return sym


def _name_constant_keys(ctx, prologue_trace, inputs) -> None:
    """Each object other than an int or str used as a dict key on the path of a value the prologue unpacks
    (``TABLE[K1]``, K1 a module-level object: iterating ``TABLE`` reads its items that way) gets a proxy made from it
    at the top of the prologue (``python_constant_object``), set as the key's provenance record's proxy. thunder's
    ``unpack_inputs`` (``from_binary_subscr``) unpacks only int, str and proxy keys: "Exception occured unpacking
    object from ProvenanceRecord(...)" (plain thunder too)."""
    from thunder.core.interpreter import ProvenanceRecord, PseudoInst
    from thunder.core.proxies import Proxy
    from thunder.core.trace import tracectx

    seen: set[int] = set()
    made: dict[int, Any] = {}

    def visit(record):
        if not isinstance(record, ProvenanceRecord) or id(record) in seen:
            return
        seen.add(id(record))
        if record.inst is PseudoInst.BINARY_SUBSCR and len(record.inputs) == 2:
            key = record.inputs[1]
            if (isinstance(key, ProvenanceRecord) and key.inst is PseudoInst.CONSTANT
                    and not isinstance(key.value, (int, str, Proxy)) and getattr(key, "proxy", None) is None):
                proxy = made.get(id(key.value))
                if proxy is None:
                    with tracectx(prologue_trace):
                        proxy = made[id(key.value)] = _constant_key_proxy_class()(key.value)
                        prologue_trace.bound_symbols.append(_constant_object_symbol().bind(key.value, output=proxy))
                key.proxy = proxy
        for i in record.inputs:
            visit(i)

    for v in inputs:
        p = v if isinstance(v, Proxy) else getattr(v, "proxy", None)
        visit(getattr(p, "history", None))
    for _, *args in ctx._constraints:
        for a in args:
            if isinstance(a, Proxy):
                visit(a.history)


def _hook_name_postfix(original):
    # wraps thunder.core.jit_ext._infer_name_postfix_from_provenance, which names a tensor read from the inputs after
    # its path, with str() of each key: TABLE[K1] gave "t___globals___TABLE_<__main__.Key object at 0x...>", which
    # the prologue's Python cannot hold ("SyntaxError: invalid syntax"). For a plugin jit such a name is not used (the
    # tensor gets thunder's default name)
    @functools.wraps(original)
    def _infer_name_postfix_from_provenance(pr):
        postfix = original(pr)
        if postfix and is_plugin_active() and not f"t{postfix}".isidentifier():
            return ""
        return postfix

    return _infer_name_postfix_from_provenance


def _hook_unpack_inputs(original):
    # wraps thunder.core.jit_ext.unpack_inputs (the prologue's unpacking of every value read from the inputs): for a
    # plugin jit, object dict keys are named first (_name_constant_keys), and under symbolic values parameters are
    # tagged meanwhile (symbolic_values.unpacked_parameters_tagged)
    @functools.wraps(original)
    def unpack_inputs(ctx, prologue_trace, pro_to_comp_inps, pro_to_epi_inps, *args, **kwargs):
        if not is_plugin_active():
            return original(ctx, prologue_trace, pro_to_comp_inps, pro_to_epi_inps, *args, **kwargs)
        _name_constant_keys(ctx, prologue_trace, [*pro_to_comp_inps, *pro_to_epi_inps])
        pro_to_comp_inps, pro_to_epi_inps = _parents_first(pro_to_comp_inps), _parents_first(pro_to_epi_inps)
        with unpacked_parameters_tagged():
            return original(ctx, prologue_trace, pro_to_comp_inps, pro_to_epi_inps, *args, **kwargs)

    return unpack_inputs


def _parents_first(proxies) -> list:
    """``proxies`` (values the prologue unpacks) ordered by the depth of their provenance, shallowest first (stable).
    thunder's ``object.__setattr__`` lookaside sets the provenance's ``proxy`` of each object the traced code writes
    an attribute of; unpacking a written object below another written one (``self.config.rope_parameters = ...``
    after ``self.max_seq_len_cached = ...``: transformers' dynamic RoPE) then found the parent's proxy not unpacked
    yet ("KeyError" in ``from_load_attr``), when the child came first in thunder's order."""
    def depth(v) -> int:
        history = getattr(getattr(v, "proxy", v), "history", None)  # (thunder passes Variables of proxies)
        n, todo, seen = 0, [history], set()
        while todo:
            h = todo.pop()
            if h is None or id(h) in seen:
                continue
            seen.add(id(h))
            n += 1
            todo.extend(getattr(h, "inputs", ()))
        return n

    return sorted(proxies, key=depth)


_RAISED_AT = "_thunder_subclass_raised_at"  # exception attribute: {id(interpreted frame): (file, line)}, innermost first


def _set_implicit_context(e: BaseException, handled: BaseException) -> None:
    # CPython's _PyErr_SetObject: the exception being handled becomes the new one's __context__, cutting a cycle
    o = handled
    while o is not None:
        if o.__context__ is e:
            o.__context__ = None
            break
        o = o.__context__
    e.__context__ = handled


def _note_raised(inst, frame, runtimectx) -> None:
    e = runtimectx.curexc
    if not isinstance(e, BaseException) or frame is None:
        return
    raised_at = e.__dict__.get(_RAISED_AT)
    if raised_at is None:
        handled = runtimectx.exception_stack[-1] if runtimectx.exception_stack else None
        if isinstance(handled, BaseException) and handled is not e and e.__context__ is None:
            _set_implicit_context(e, handled)
        raised_at = e.__dict__[_RAISED_AT] = {}
    key = id(frame)
    if key not in raised_at:
        positions = frame.positions
        lineno = getattr(positions, "lineno", None) or frame.code.co_firstlineno
        raised_at[key] = (frame.code.co_filename, lineno, positions)
    elif inst.opname == "RERAISE":
        frame.positions = raised_at[key][2]


def _hook_compilectx_interpret(original):
    # replaces thunder.core.interpreter.InterpreterCompileCtx.interpret (`return self._opcode_interpreter(inst,
    # **state)`, called by _run_frame for every instruction). thunder adds an interpreted frame to an exception's
    # traceback when the exception leaves the frame, at the line the frame is at then: after a `with` block's
    # __exit__ or a `finally` block ran and re-raised (RERAISE), that is the `with` / `finally` line, not the line
    # that raised (CPython records the line where the exception entered the frame). And an exception raised while
    # another is handled (in __exit__, a `finally` or an `except` block) gets no __context__, so the first one was
    # lost. For a plugin jit, the line where each exception first entered each frame is recorded (exception_source_
    # lines), a RERAISE restores it as the frame's position, and the handled exception becomes __context__.
    from thunder.core.interpreter import INTERPRETER_SIGNALS, get_interpreterruntimectx

    exception_raised = INTERPRETER_SIGNALS.EXCEPTION_RAISED

    def interpret(self, inst, /, **state):
        result = self._opcode_interpreter(inst, **state)
        if result is exception_raised and is_plugin_active():
            _note_raised(inst, state.get("frame"), get_interpreterruntimectx())
        return result

    return interpret


def exception_source_lines(e: BaseException) -> list[tuple[str, int]]:
    """(file, line) where exception ``e`` entered each interpreted frame it passed through while a plugin jit traced,
    innermost first (the line that raised, also when a ``with`` block or ``finally`` re-raised it later); empty when
    it passed through none."""
    return [(f, line) for f, line, _ in e.__dict__.get(_RAISED_AT, {}).values()]


def _hook_populate_item_wrappers(original):
    # wraps thunder.core.interpreter.populate_item_wrappers (a module global its containers' track_items calls): the
    # keys of a dict read from the inputs are wrapped as constants, so values traced code read from a key object
    # (``for k in TABLE: x + k.n``) were inlined unchecked: changing ``k.n`` reused the trace. For a plugin jit,
    # the record of each key that is not an int or str is marked; values read from it through attributes and items
    # are guarded through the key object (Handlers.input_object, thunder_state.constant_rooted_path)
    @functools.wraps(original)
    def populate_item_wrappers(obj):
        original(obj)
        if not is_plugin_active():
            return
        from thunder.core.interpreter import PseudoInst

        def constant_of(w, value) -> bool:
            return getattr(w.provenance, "inst", None) is PseudoInst.CONSTANT and w.provenance.value is value

        if type(obj.value) is dict and getattr(obj, "key_wrappers", None) and is_unpackable_provenance(obj.provenance):
            for k, wk in obj.key_wrappers.items():
                if type(k) not in (int, str) and constant_of(wk, k):
                    mark_dict_key(wk.provenance)
        elif type(obj.value) in (tuple, list) and obj.item_wrappers and constant_of(obj, obj.value):
            # the items of a tuple key (``for a, b in TABLE``): thunder wraps items of a constant as constants
            rooted = constant_rooted_path(obj.provenance, allow_empty=True)
            if rooted is not None:
                root, path = rooted
                for i, (v, wv) in enumerate(zip(obj.value, obj.item_wrappers)):
                    if wv is not None and type(v) not in (int, str) and constant_of(wv, v):
                        mark_dict_key(wv.provenance, (root, (*path, ("[]", i))))

    return populate_item_wrappers


def hook_targets() -> list[tuple[Any, str, Callable]]:
    import thunder.clang as clang
    import thunder.core.interpreter as interpreter
    import thunder.core.jit_ext as jit_ext

    handlers = interpreter._default_opcode_handler_map
    tracking = interpreter._default_provenance_tracking_lookaside_map
    return [
        (interpreter.InterpreterCompileCtx, "interpret", _hook_compilectx_interpret),
        (handlers, "IS_OP", _hook_comparison("is")),
        (handlers, "COMPARE_OP", _hook_comparison("==")),
        *((tracking, m, _hook_keyed_lookup) for m in (dict.__getitem__, dict.__contains__, dict.pop, dict.__delitem__)
          if m in tracking),
        (tracking, list.insert, _hook_list_insert),
        (tracking, list.clear, _hook_list_clear),
        (tracking, list.remove, _hook_list_remove),
        (tracking, list.sort, _hook_list_sort),
        (tracking, list.count, _hook_sequence_count),
        (tracking, tuple.count, _hook_sequence_count),
        (jit_ext, "Sequence", _hook_jit_ext_sequence),
        (clang, "_basic_indexing", _hook_basic_indexing),
        (jit_ext, "process_recorded_modifications", _hook_process_recorded_modifications),
        (jit_ext, "unpack_inputs", _hook_unpack_inputs),
        (jit_ext, "_infer_name_postfix_from_provenance", _hook_name_postfix),
        (jit_ext, "build_value_from_wrapped", _hook_build_value_from_wrapped),
        (interpreter, "populate_item_wrappers", _hook_populate_item_wrappers),
    ]
