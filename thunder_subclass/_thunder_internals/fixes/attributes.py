"""Interpreter fixes, attributes: object creation, attribute reads and writes, ``isinstance``, as CPython runs them.

Part of the interpreter fixes (:mod:`~thunder_subclass._thunder_internals.fixes` dispatches to each part's
``lookasides()`` table and installs its ``hook_targets()``); each acts only while a plugin jit traces
(:func:`~.plugin_state.is_plugin_active`) and names what it works around:

* ``core/interpreter.py`` ``_type_call_lookaside`` (through the ``general_jit_lookaside`` hook of :mod:`.tracing`) —
  ``type.__call__`` as CPython runs it, ``__init__`` looked up on the type (thunder's reads it from the instance:
  "'wrapper_descriptor' object has no attribute '__self__'" for ``typing.Callable[...]``, made on every
  ``torch.vmap`` call by torch's ``_pytree``).
* ``core/jit_ext.py`` ``_general_jit_object_setattr_lookaside`` (through the ``general_jit_lookaside`` hook) — every
  attribute write on an input object reaches the epilogue, not only the first.
* ``core/interpreter.py`` ``_getattr_lookaside`` (``getattr`` and ``object.__getattribute__``, through the
  ``general_jit_lookaside`` hook) — an object whose class defines ``__getattribute__`` is read through it, then
  ``__getattr__``, as CPython does (thunder emulates ``object.__getattribute__`` whatever the class defines:
  transformers' ``PretrainedConfig.attribute_map`` was ignored, "AttributeError: num_hidden_layers" for GPT-2, GPT-J,
  Bloom); ``object.__getattribute__`` called from there reads as thunder reads attributes, traceable to the inputs.
* a C ``__setattr__`` slot other than ``object``'s (``types.SimpleNamespace``; a lookaside) — thunder took it for an
  opaque function ("'wrapper_descriptor' object has no attribute '__module__'").
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from typing import Any


from thunder_subclass._thunder_internals.thunder_state import (
    source_location,
)


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


def _getattr_with_constant_name(obj, name, *default):
    from thunder.core.interpreter import _interpret_call

    return _interpret_call(getattr, obj, _constant_attribute_name(name), *default)


def _hasattr_call(fn, wrapped_args: tuple, wrapped_kwargs: dict):
    return _hasattr if len(wrapped_args) == 2 and not wrapped_kwargs else None


def _vars_call(fn, wrapped_args: tuple, wrapped_kwargs: dict):
    if len(wrapped_args) == 1 and not wrapped_kwargs and hasattr(getattr(wrapped_args[0], "value", None), "__dict__"):
        # thunder calls vars() natively: the dict came back without provenance, what was read from it unchecked
        return _vars
    return None


def _getattr_call(fn, wrapped_args: tuple, wrapped_kwargs: dict):
    if len(wrapped_args) not in (2, 3):
        return None
    from thunder.core.interpreter import PseudoInst, unwrap

    name = unwrap(wrapped_args[1])
    if type(name) is str and getattr(getattr(wrapped_args[1], "provenance", None), "inst", None) is not \
            PseudoInst.CONSTANT:
        # a name computed in traced code (``getattr(cfg, f"w{i}")``): thunder records the read with the name's own
        # provenance, which its prologue cannot unpack, and inlined the value unchecked. Read with the name as a
        # constant (its value is the traced code's, itself checked or constant), the value is guarded
        return _getattr_with_constant_name
    if not isinstance(name, str) or (name.startswith("__") and name.endswith("__")):
        # dunders: thunder reads them with the real getattr (which calls the class's __getattribute__); its own
        # emulation of object.__getattribute__ reads obj.__dict__ that way too
        return None
    getattribute = _class_getattribute(unwrap(wrapped_args[0]))
    return _getattr_through_getattribute(getattribute) if getattribute is not None else None


def _isinstance_call(fn, wrapped_args: tuple, wrapped_kwargs: dict):
    if len(wrapped_args) != 2 or wrapped_kwargs:
        return None
    from thunder.core.interpreter import unwrap
    from thunder.core.proxies import NumberProxy

    # (a number proxy's isinstance is symbolic_values's; a plain class's type.__instancecheck__ raises nothing)
    if not isinstance(unwrap(wrapped_args[0]), NumberProxy) and _has_own_instancecheck(unwrap(wrapped_args[1])):
        return _isinstance_raising_as_python
    return None


def _object_setattr_call(fn, wrapped_args: tuple, wrapped_kwargs: dict):
    from thunder.core.jit_ext import _general_jit_lookaside_map

    return _object_setattr_lookaside(_general_jit_lookaside_map[object.__setattr__])


def _c_setattr_call(fn, wrapped_args: tuple, wrapped_kwargs: dict):
    if fn.__name__ == "__setattr__" and len(wrapped_args) == 3 and fn.__objclass__.__module__ != "builtins":
        # (builtins' own: object's has its lookaside; type's, module's stay with thunder)
        return _c_setattr_lookaside(fn)
    return None


def hook_targets() -> list[tuple[Any, str, Callable]]:
    return []


def lookasides() -> dict:
    """function -> ``choose(fn, wrapped_args, wrapped_kwargs)``: its lookaside for this call, or None."""
    return {hasattr: _hasattr_call, vars: _vars_call, getattr: _getattr_call,
            object.__getattribute__: lambda fn, args, kwargs: _object_getattribute_lookaside,
            isinstance: _isinstance_call, type.__call__: lambda fn, args, kwargs: _type_call_lookaside,
            object.__setattr__: _object_setattr_call}


def type_lookasides() -> dict:
    """type of a callable -> ``choose(fn, wrapped_args, wrapped_kwargs)``: a C ``__setattr__`` slot."""
    return {types.WrapperDescriptorType: _c_setattr_call}
