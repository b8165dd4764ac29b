"""Interpreter speed: shorter paths through thunder's emulation of Python for the first call of a plugin jit.

thunder 0.2.6's interpreter emulates much of Python by *interpreting* small helper functions of its own: a global
read interprets ``lambda d, k: d[k]`` (twice for a builtin: once for ``__builtins__``), a subscript interprets
``getitem_impl`` which reads ``obj.__getitem__`` and calls it, a ``for`` loop step interprets ``_next_impl`` which
calls ``next``, whose lookaside interprets ``impl`` which calls ``iterator.__next__``, which for a list or tuple is
``SequenceIter.__next__``, itself interpreted (``len``, a compare, a subscript, an in-place add, an attribute store,
each its own helper frame). Each interpreted frame and each call through the lookaside chain costs tens of
microseconds; on a tiny Llama's first call 95% of the interpreted frames were these helpers, not the model's code.

Each hook here makes, for the commonest exact builtin types, the call the interpreted helper ends in (thunder's
provenance-tracking ``dict`` / ``list`` / ``tuple`` methods, which wrap each item with its provenance), so the
values, their wrappers and their provenance are the ones the interpreted path gives; anything else (a subclass of
``dict``/``list``/``tuple``, a missing key or an index out of range, a wrapper that is not the one the interpreter
would find for the object, no provenance tracking, no plugin jit tracing) goes to thunder's own handler. Hooks
(thunder 0.2.6 paths, relative to the installed ``thunder/``):

* ``core/interpreter.py`` ``globals_lookup`` — a name in the frame's globals dict, or in a ``__builtins__`` dict,
  is read with ``MutMappingWrapperMethods.__getitem__`` (what ``d[k]`` on a wrapped dict ends in).
* ``core/interpreter.py`` ``_default_opcode_handler_map["BINARY_SUBSCR"]`` — ``seq[i]`` for an exact ``list`` or
  ``tuple`` and an ``int`` index in range, ``d[k]`` for an exact ``dict`` holding ``k``: the sequence or mapping
  wrapper method, without ``getitem_impl``.
* ``core/interpreter.py`` ``_default_provenance_tracking_lookaside_map[list.__iter__ / tuple.__iter__]`` —
  ``iter()`` of an exact ``list``/``tuple`` makes thunder's ``SequenceIter`` directly (its attributes as its
  interpreted ``__init__`` sets them, the sequence's wrapper recorded as the attribute's wrapper).
* ``dataclasses.fields`` and ``dataclasses.is_dataclass`` (through the ``general_jit_lookaside`` hook of
  :mod:`.tracing`) run as Python: their results depend on the argument's class only, and they call no user code.
* ``core/interpreter.py`` ``_default_opcode_handler_map["CONTAINS_OP"]`` — the item and the container go to
  ``Handlers.compared`` first (membership is decided natively: the plugin guards input objects among them); ``x in d``
  for an exact dict through its tracking ``__contains__``; natively, for an item whose ``==`` and ``hash`` run no
  Python code (a str/number/None; a class whose metaclass keeps C ``__eq__``/``__hash__``: ``type(x) in {...}``;
  an enum member whose class keeps a C ``__eq__`` and a C or ``enum.Enum``'s ``__hash__``: transformers'
  ``deprecate_kwarg`` wrapper tests ``Action`` members on every call), a set or frozenset, a list/tuple all of whose
  elements are such values too, or a str for a str item. Tensors, proxies and other objects: thunder's handler.
* ``core/interpreter.py`` ``_default_opcode_handler_map["FOR_ITER"]`` and ``_default_lookaside_map[next]`` — a step
  of a ``SequenceIter`` over an exact ``list``/``tuple`` that is not past its end reads the item through the
  sequence wrapper and advances the position natively; a step of a ``MappingKeysIterator`` calls its own lookaside
  ``__next__``. The last step (``StopIteration``) goes to thunder's handler.

* ``core/interpreter.py`` ``_interpret_call`` — thunder's own helper functions, recognised by their code objects
  (``_helper_table``: subscripts, dict merges/updates/``|``, list extends, ``iter``/``next``, ``len``, bound method
  calls, ``functools.partial`` calls, the binary operators' ``outofplace_impl``), are replaced by the calls each
  makes, for the types listed at each (``docs/internals.md`` lists them); other arguments run the helper. Among them
  ``torch/experimental/dtensor_torch_and_prims.py`` ``dispatch_to_impl.<locals>.wrapper``, thunder's DTensor-aware
  function for ``add``, ``mul``, ``reshape``, ``transpose``, ``linear``, ``exp``, ``neg``, ``reciprocal``, ``silu``
  (tensor methods reach it as interpreted Python): which of its two closure symbols its body would call is decided
  natively (thunder's ``tree_flatten`` of the unwrapped arguments, the same ``TensorProxy``/``DTensorProxy`` tests:
  in the interpreted body too these run natively, inside optree and ``filter``/``map``), and that symbol is called
  through the interpreter with the same wrapped arguments; symbols it records name the user's source line (the
  interpreted wrapper's own line was recorded before). A flatten that raises runs the wrapper.

Attribute reads that thunder runs as interpreted Python calls (through the ``general_jit_lookaside`` hook of
:mod:`.tracing`, :func:`speed_lookaside`):

* ``torch.nn.Module.__getattr__`` (not overridden) for a name held in the module's ``_parameters``, ``_buffers`` or
  ``_modules`` dict: the operations of its body (``self.__dict__``, ``"_parameters" in ...``, ``... [name]``) are made
  here through the same interpreter calls its bytecode would make (``getattr`` through the lookasides, the dict
  wrapper's ``__contains__`` / ``__getitem__``), so the value and its provenance are the interpreted body's. Any other
  name (the ``AttributeError`` path) is interpreted.
* ``getattr(obj, name[, default])`` where every Python ``__getattribute__`` in ``type(obj).__mro__`` is one known to only read
  (``_READ_ONLY_GETATTRIBUTE``: transformers' configuration classes, whose ``__getattribute__`` maps aliases through
  ``attribute_map`` and checks per-layer attributes; interpreted, each config read cost ~20 ms, ~30 reads per Llama
  forward): read natively and, when the value is a ``None``/``bool``/``int``/``float``/``str``/``torch.dtype``,
  wrapped as the attribute ``obj.name`` (the prologue reads it back with ``getattr`` and checks it, as it checks any
  value read from the inputs); a missing attribute gives the default as thunder's ``getattr`` does (neither path
  guards an attribute's absence). Other values (objects a property makes, methods, tensors) and any other exception:
  interpreted.

Measured on a tiny int8 Llama (1 decoder layer, first call): interpreted frames 35,338 before these paths, 590 with
them (198 per further layer; 685 and 272 before the DTensor dispatch wrapper and the class/enum ``in`` paths); see
``benchmarks/bench_cold_start.py`` for times.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import sys
import types
from collections.abc import Callable
from typing import Any

from thunder_subclass._thunder_internals import plugin_state
from thunder_subclass._thunder_internals.plugin_state import is_plugin_active

_NOT_HANDLED = object()

# Standard-library functions whose result depends only on the classes of their arguments and that call no user
# code: run as Python instead of interpreted (``dataclasses.fields`` builds its tuple from a generator, which the
# interpreter steps through frame by frame: 16 ms per call, ~100 calls per Hugging Face forward for its ModelOutputs)
PURE_NATIVE_FUNCTIONS = frozenset({dataclasses.fields, dataclasses.is_dataclass})


# Python ``__getattribute__`` methods (module, qualified name) known to only read the object: transformers'
# configurations (``attribute_map`` aliases; per-layer attribute checks that raise or warn once)
_READ_ONLY_GETATTRIBUTE = frozenset({
    ("transformers.configuration_utils", "PreTrainedConfig.__getattribute__"),
    ("transformers.configuration_utils", "PretrainedConfig.__getattribute__"),
    ("transformers.integrations.heterogeneity.configuration_utils", "HeterogeneousConfigMixin.__getattribute__"),
})


def _interp():
    import thunder.core.interpreter as interpreter

    return interpreter


def _is_known_wrapper(w) -> bool:
    """``w`` is the wrapper the interpreter finds for its value (``wrap`` returns the live cached wrapper of an
    object, so an interpreted call on the object's methods would see ``w`` itself)."""
    interpreter = _interp()
    cached = interpreter.get_interpreterruntimectx()._known_wrappers.get(id(w.value))
    return cached is not None and cached[0]() is w


def _exact(w, *types_) -> bool:
    """``w`` is a wrapper of a value of exactly one of ``types_`` and the one the interpreter finds for it."""
    return type(w) is _interp().WrappedValue and type(w.value) in types_ and _is_known_wrapper(w)


def _tracking() -> bool:
    return is_plugin_active() and _interp().get_interpretercompilectx()._with_provenance_tracking


def _hook_globals_lookup(original):
    interpreter = _interp()
    WrappedValue = interpreter.WrappedValue
    getitem = interpreter.MutMappingWrapperMethods.__getitem__
    wrap_const = interpreter.wrap_const

    @functools.wraps(original)
    def globals_lookup(globals_dict, name):
        if (
            type(globals_dict) is WrappedValue
            and type(name) is WrappedValue
            and type(globals_dict.value) is dict
            and _tracking()
            and _is_known_wrapper(globals_dict)
        ):
            d = globals_dict.value
            key = name.value
            if key in d:
                return getitem(globals_dict, name)
            builtins_dict = d.get("__builtins__")
            if type(builtins_dict) is dict and key in builtins_dict:
                wrapped_builtins = getitem(globals_dict, wrap_const("__builtins__"))
                if _is_known_wrapper(wrapped_builtins):
                    return getitem(wrapped_builtins, name)
        return original(globals_dict, name)

    return globals_lookup


def _fast_getitem(container, index):
    """``container[index]`` as thunder's wrapper methods give it, or ``_NOT_HANDLED``."""
    interpreter = _interp()
    WrappedValue = interpreter.WrappedValue
    if type(container) is not WrappedValue or type(index) is not WrappedValue:
        return _NOT_HANDLED
    value, key = container.value, index.value
    typ = type(value)
    if typ is list or typ is tuple:
        found = type(key) is int and -len(value) <= key < len(value)
        getitem = interpreter.SequenceWrapperMethods.__getitem__
    elif typ is dict:
        found = type(key) in (str, int) and key in value
        getitem = interpreter.MutMappingWrapperMethods.__getitem__
    else:
        return _NOT_HANDLED
    if not found or not _tracking() or not _is_known_wrapper(container):
        return _NOT_HANDLED
    return getitem(container, index)


def fast_getitem(container, index):
    """``container[index]`` for an exact list/tuple/dict as thunder's provenance-tracking wrapper methods give it
    (what the interpreted subscript ends in), or None where thunder's interpreted path must run."""
    res = _fast_getitem(container, index)
    return None if res is _NOT_HANDLED else res


_SIMPLE = (str, int, bool, float, type(None))

# the C implementations a class can inherit for ``__eq__`` / ``__hash__`` (slot wrappers of builtin types, builtin
# methods): calling them runs no Python code
_NATIVE_METHOD_TYPES = (types.WrapperDescriptorType, types.MethodDescriptorType, types.BuiltinFunctionType)


def _is_native_method(method, *pure) -> bool:
    return type(method) in _NATIVE_METHOD_TYPES or any(method is p for p in pure)


def _compares_natively(v) -> bool:
    """``v == other`` and ``hash(v)`` run no Python code (other than ``enum.Enum.__hash__``, which hashes the
    member's name): a str/number/None; a class whose metaclass keeps C ``__eq__``/``__hash__``; an enum member
    whose class keeps a C ``__eq__`` and a C or ``Enum``'s ``__hash__``. Only ``type(v)`` is looked at (no
    ``isinstance``: it may read ``v.__class__`` through a Python ``__getattribute__``)."""
    typ = type(v)
    if typ in _SIMPLE:
        return True
    if issubclass(typ, type):  # a class: compared and hashed by its metaclass
        return _is_native_method(typ.__eq__) and _is_native_method(typ.__hash__)
    if issubclass(typ, enum.Enum):
        return _is_native_method(typ.__eq__) and _is_native_method(typ.__hash__, enum.Enum.__hash__)
    return False


def _hook_contains_op(original):
    interpreter = _interp()

    @functools.wraps(original)
    def contains_op_handler(inst, /, stack, **kwargs):
        container, item = stack.getitem_wrapped(-1), stack.getitem_wrapped(-2)
        if is_plugin_active():
            # membership is decided natively by the item's hash and ==, and the container's items (see
            # plugin_state.Handlers.compared)
            plugin_state.handlers.compared("in", getattr(item, "value", item), getattr(container, "value", container))
        res = _NOT_HANDLED
        if type(container) is interpreter.WrappedValue and type(item) is interpreter.WrappedValue \
                and _compares_natively(item.value) and _tracking():
            value, typ = container.value, type(container.value)
            if typ is dict and _is_known_wrapper(container):
                # the provenance-tracking dict.__contains__ the interpreted ``impl`` ends in
                res = interpreter.MutMappingWrapperMethods.__contains__(container, item)
            elif (typ is set or typ is frozenset) or (
                (typ is tuple or typ is list) and all(_compares_natively(v) for v in value)
            ):
                # no element can run Python code when compared with such an item (thunder's path calls a set's
                # C ``__contains__`` opaquely, so its elements are compared natively there too): Python's answer
                res = interpreter.wrap_const(item.value in value)
            elif typ is str and type(item.value) is str:
                res = interpreter.wrap_const(item.value in value)
        if res is _NOT_HANDLED:
            return original(inst, stack=stack, **kwargs)
        stack.pop_wrapped()
        stack.pop_wrapped()
        if inst.arg == 1:
            res = interpreter.wrap_const(not res.value)
        stack.append(res)
        return None

    return contains_op_handler


def _hook_store_attr(original):
    interpreter = _interp()

    @functools.wraps(original)
    def store_attr_handler(inst, /, stack, co, **kwargs):
        # thunder's handler interprets ``impl(tos, name, tos1): setattr(tos, name, tos1)``; the builtin ``setattr`` of
        # that frame is called here directly (its lookaside, as the interpreted call would reach it)
        if not is_plugin_active():
            return original(inst, stack=stack, co=co, **kwargs)
        name = interpreter.wrap_const(co.co_names[inst.arg])
        tos = stack.pop_wrapped()
        tos1 = stack.pop_wrapped()
        res = interpreter._interpret_call(setattr, tos, name, tos1)
        if res is interpreter.INTERPRETER_SIGNALS.EXCEPTION_RAISED:
            return res
        return None

    return store_attr_handler


def _hook_store_subscr(original):
    interpreter = _interp()

    @functools.wraps(original)
    def store_subscr_handler(inst, /, stack, **kwargs):
        # ``tos1[tos] = tos2``: thunder interprets ``impl`` calling the bound ``tos1.__setitem__``, which the
        # interpreter turns into the unbound method of the exact type; that call is made here for exact dicts/lists
        container = stack.getitem_wrapped(-2)
        if _exact(container, dict, list) and _tracking():
            typ = type(container.value)
            tos = stack.pop_wrapped()
            tos1 = stack.pop_wrapped()
            tos2 = stack.pop_wrapped()
            res = interpreter._interpret_call(typ.__setitem__, tos1, tos, tos2)
            if res is interpreter.INTERPRETER_SIGNALS.EXCEPTION_RAISED:
                return res
            return None
        return original(inst, stack=stack, **kwargs)

    return store_subscr_handler


def _hook_binary_subscr(original):
    @functools.wraps(original)
    def binary_subscr_handler(inst, /, stack, **kwargs):
        res = _fast_getitem(stack.getitem_wrapped(-2), stack.getitem_wrapped(-1))
        if res is _NOT_HANDLED:
            return original(inst, stack=stack, **kwargs)
        stack.pop_wrapped()
        stack.pop_wrapped()
        stack.append(res)
        return None

    return binary_subscr_handler


def _hook_sequence_iter(original):
    interpreter = _interp()

    @functools.wraps(original)
    def sequence_iter(self):
        if _exact(self, list, tuple) and _tracking():
            self.track_items()
            it = object.__new__(interpreter.SequenceIter)
            it.s = self.value
            it.next_pos = 0
            it.is_reversed = False
            provenance = interpreter.ProvenanceRecord(
                inst=interpreter.PseudoInst.OPAQUE,
                inputs=[interpreter.wrap_const(interpreter.SequenceIter).provenance, self.provenance],
            )
            wrapped = interpreter.wrap(it, provenance=provenance)
            wrapped.attribute_wrappers["s"] = self
            wrapped.attribute_wrappers["next_pos"] = interpreter.wrap_const(0)
            wrapped.attribute_wrappers["is_reversed"] = interpreter.wrap_const(False)
            return wrapped
        return original(self)

    return sequence_iter


def _fast_next(wrapped_iterator):
    """One step of thunder's ``SequenceIter`` over an exact list/tuple (not past its end) or of a
    ``MappingKeysIterator``, or ``_NOT_HANDLED``."""
    interpreter = _interp()
    if type(wrapped_iterator) is not interpreter.WrappedValue:
        return _NOT_HANDLED
    it = wrapped_iterator.value
    typ = type(it)
    if typ is interpreter.SequenceIter:
        seq_wrapper = wrapped_iterator.attribute_wrappers.get("s")
        if seq_wrapper is None or seq_wrapper.value is not it.s or type(it.s) not in (list, tuple):
            return _NOT_HANDLED
        pos = it.next_pos
        if type(pos) is not int or not 0 <= pos < len(it.s) or not _tracking() or not _is_known_wrapper(seq_wrapper):
            return _NOT_HANDLED
        item = interpreter.SequenceWrapperMethods.__getitem__(seq_wrapper, interpreter.wrap_const(pos))
        it.next_pos = pos - 1 if it.is_reversed else pos + 1
        wrapped_iterator.attribute_wrappers["next_pos"] = interpreter.wrap_const(it.next_pos)
        return item
    if typ is interpreter.MappingKeysIterator:
        if "_mapping" not in wrapped_iterator.attribute_wrappers or not _tracking():
            return _NOT_HANDLED
        # the lookaside the interpreted ``iterator.__next__()`` ends in (StopIteration through ``do_raise``)
        return interpreter.MappingKeysIterator.__next__(wrapped_iterator)
    return _NOT_HANDLED


def _hook_for_iter(original):
    interpreter = _interp()
    new_jumps = sys.version_info >= (3, 12)

    @functools.wraps(original)
    def for_iter_handler(inst, /, stack, inst_ptr, **kwargs):
        res = _fast_next(stack.getitem_wrapped(-1))
        if res is _NOT_HANDLED:
            return original(inst, stack=stack, inst_ptr=inst_ptr, **kwargs)
        if res is interpreter.INTERPRETER_SIGNALS.EXCEPTION_RAISED:
            # a MappingKeysIterator past its end: the loop ends as in thunder's handler
            runtimectx = interpreter.get_interpreterruntimectx()
            if not isinstance(runtimectx.curexc, StopIteration):
                return res
            runtimectx.curexc = None
            if new_jumps:
                stack.append(interpreter.Py_NULL())
                return inst.arg
            stack.pop_wrapped()
            return inst_ptr + inst.arg + 1
        stack.append(res)
        return None

    return for_iter_handler


def _hook_next_lookaside(original):
    interpreter = _interp()

    @functools.wraps(original)
    def next_lookaside(iterator, *default):
        if not default and type(interpreter.unwrap(iterator)) is interpreter.SequenceIter:
            res = _fast_next(iterator)
            if res is not _NOT_HANDLED:
                return res
        return original(iterator, *default)

    return next_lookaside


def _read_only_getattribute(typ: type) -> bool:
    """Every Python ``__getattribute__`` along ``typ``'s MRO is in ``_READ_ONLY_GETATTRIBUTE`` (and there is one)."""
    if type(typ.__getattribute__) is not types.FunctionType:  # object's or a C type's: most classes
        return False
    found = False
    for klass in typ.__mro__:
        method = klass.__dict__.get("__getattribute__")
        if type(method) is types.FunctionType:
            if (method.__module__, method.__qualname__) not in _READ_ONLY_GETATTRIBUTE:
                return False
            found = True
    return found


def _plain_value(value) -> bool:
    import torch

    return value is None or type(value) in (bool, int, float, str) or isinstance(value, torch.dtype)


def _native_read_lookaside(value):
    def lookaside(wobj, wname, *default):
        return _interp().wrap_attribute(value, wobj, wname)

    return lookaside


def _module_getattr_lookaside(wself, wname):
    """``Module.__getattr__(self, name)`` for a name :func:`speed_lookaside` found in one of the three dicts: its
    body's steps, each through the interpreter call its bytecode makes."""
    interpreter = _interp()
    raised = interpreter.INTERPRETER_SIGNALS.EXCEPTION_RAISED
    name = wname.value
    wdict = interpreter._interpret_call(getattr, wself, interpreter.wrap_const("__dict__"))
    if wdict is raised:
        return wdict
    for member in ("_parameters", "_buffers", "_modules"):
        wmember = interpreter.wrap_const(member)
        plugin_state.handlers.compared("in", member, wdict.value)
        if not interpreter.MutMappingWrapperMethods.__contains__(wdict, wmember).value:
            continue
        wsub = _fast_getitem(wdict, wmember)
        if wsub is _NOT_HANDLED:
            wsub = interpreter._interpret_call(lambda d, k: d[k], wdict, wmember)
            if wsub is raised:
                return wsub
        plugin_state.handlers.compared("in", name, wsub.value)
        if type(wsub.value) is dict and name in wsub.value:
            res = _fast_getitem(wsub, wname)
            if res is _NOT_HANDLED:
                res = interpreter._interpret_call(lambda d, k: d[k], wsub, wname)
            return res
    raise AssertionError(f"{name!r} was in {type(wself.value).__name__}'s parameters, buffers or modules")


def speed_lookaside(fn, wrapped_args: tuple) -> Callable | None:
    """A shorter path for an attribute read the interpreter would run as interpreted Python (see the module
    docstring), or None."""
    import torch

    if fn is torch.nn.Module.__getattr__ and len(wrapped_args) == 2:
        module, name = (getattr(a, "value", a) for a in wrapped_args)
        if type(name) is not str or type(module).__getattr__ is not torch.nn.Module.__getattr__ or not _tracking():
            return None
        if type(wrapped_args[0]) is not _interp().WrappedValue or not _is_known_wrapper(wrapped_args[0]):
            return None
        d = getattr(module, "__dict__", None)
        if type(d) is not dict:
            return None
        for member in ("_parameters", "_buffers", "_modules"):
            sub = d.get(member)
            if sub is not None and type(sub) is not dict:
                return None
            if sub is not None and name in sub:
                return _module_getattr_lookaside
        return None
    if fn is getattr and len(wrapped_args) in (2, 3):
        interpreter = _interp()
        wobj, wname = wrapped_args[:2]
        if type(wobj) is not interpreter.WrappedValue or type(wname) is not interpreter.WrappedValue:
            return None
        obj, name = wobj.value, wname.value
        if type(name) is not str or isinstance(obj, type) or not _read_only_getattribute(type(obj)):
            return None
        if not _tracking() or not _is_known_wrapper(wobj):
            return None
        try:
            value = getattr(obj, name)
        except AttributeError:
            # getattr(obj, name, default): the default, as thunder's getattr gives it; without one, interpreted (the
            # program sees the interpreted read raise)
            return (lambda wobj, wname, wdefault: wdefault) if len(wrapped_args) == 3 else None
        except Exception:  # noqa: BLE001 - the interpreted read raises it where the program would
            return None
        return _native_read_lookaside(value) if _plain_value(value) else None
    return None


def _nested_code(fn, pred) -> Any:
    """The code object nested (at any depth) in ``fn``'s code for which ``pred`` holds, or None."""
    todo = [fn.__code__]
    while todo:
        code = todo.pop()
        for const in code.co_consts:
            if isinstance(const, type(fn.__code__)):
                if pred(const):
                    return const
                todo.append(const)
    return None


def _dtensor_dispatch_helper() -> tuple[Any, Callable] | None:
    """The code object of thunder's DTensor-aware dispatch ``wrapper`` and its fast call, or None where this thunder
    has no such wrapper (or one whose closure or globals are not the ones read here)."""
    try:
        import thunder.torch.experimental.dtensor_torch_and_prims as dtensor_ops
        from thunder.core import pytree
        from thunder.core.proxies import TensorProxy
        from thunder.torch.experimental.dtensor_proxy import DTensorProxy
    except ImportError:
        return None
    dispatch_to_impl = getattr(dtensor_ops, "dispatch_to_impl", None)
    if type(dispatch_to_impl) is not types.FunctionType:
        return None
    code = _nested_code(dispatch_to_impl, lambda c: c.co_name == "wrapper")
    if code is None or set(code.co_freevars) != {"single_device_symbol", "dtensor_symbol"}:
        return None
    # the names the wrapper's body reads from its module (builtins it calls must not be shadowed there)
    expected_globals = {"tree_flatten": pytree.tree_flatten, "TensorProxy": TensorProxy, "DTensorProxy": DTensorProxy}
    builtin_names = ("list", "filter", "map", "all", "isinstance")
    interpreter = _interp()

    def dispatch(fn, *args, **kwargs):
        # the wrapper's body: ``single_device_symbol(*args, **kwargs)`` unless the flattened arguments hold tensor
        # proxies that are all DTensorProxies; thunder's interpreted ``tree_flatten`` ends in optree's C flatten of
        # the unwrapped values, and ``filter``/``map`` run its isinstance lambdas natively (opaque builtins), so the
        # choice is made here the same way, and the symbol is called with the same wrapped arguments
        if fn.__code__ is not code or fn.__closure__ is None:
            return _NOT_HANDLED
        g = fn.__globals__
        if any(g.get(k) is not v for k, v in expected_globals.items()) or any(n in g for n in builtin_names):
            return _NOT_HANDLED
        try:
            leaves = pytree.tree_flatten((tuple(a.value for a in args), {k: v.value for k, v in kwargs.items()}))[0]
            tensors = [t for t in leaves if isinstance(t, TensorProxy)]
            on_dtensors = bool(tensors) and all(isinstance(t, DTensorProxy) for t in tensors)
        except Exception:  # noqa: BLE001 - the interpreted body raises it where the program would
            return _NOT_HANDLED
        cells = dict(zip(fn.__code__.co_freevars, fn.__closure__))
        try:
            symbol = cells["dtensor_symbol" if on_dtensors else "single_device_symbol"].cell_contents
        except ValueError:  # an empty cell
            return _NOT_HANDLED
        return interpreter._interpret_call(symbol, *args, **kwargs)

    return code, dispatch


def _helper_table() -> tuple[dict, set, set]:
    """thunder's interpreted helper functions whose calls are made here directly: code object -> fast call (which
    returns ``_NOT_HANDLED`` where thunder's interpreted helper must run), the fast calls that take keywords, and
    those that take the called function first (to read its closure)."""
    import torch
    from thunder.core.proxies import Proxy

    interpreter = _interp()
    handlers = interpreter._default_opcode_handler_map

    W = interpreter.WrappedValue
    raised = interpreter.INTERPRETER_SIGNALS.EXCEPTION_RAISED
    wrap_const = interpreter.wrap_const

    def plain_type(cls) -> bool:  # a class whose attribute reads are type's own (no metaclass __getattr__ etc.)
        return type(cls) is type or type(cls) is torch._C._TensorMeta

    def plain_object(v) -> bool:  # not a proxy (whose type() and methods thunder and the plugin answer) of such a class
        return not isinstance(v, Proxy) and plain_type(type(v)) and not isinstance(v, torch.Tensor)

    def type_method(obj, name):  # ``obj.<name>`` as its class defines it, or None (none, or the instance shadows it)
        if type(obj) is not W or not plain_object(obj.value) or name in getattr(obj.value, "__dict__", ()):
            return None
        return getattr(type(obj.value), name, None)

    def subscript(container, index):
        return _fast_getitem(container, index)

    def dict_update(a, b):  # ``lambda a, b: b.update(a)`` of DICT_MERGE
        return interpreter._interpret_call(dict.update, b, a) if _exact(b, dict) else _NOT_HANDLED

    def update_from_keys(self, other):  # dict.update's ``impl_other_keys``: ``for k in other.keys(): self[k] = other[k]``
        if not (_exact(self, dict) and _exact(other, dict)):
            return _NOT_HANDLED
        other.track_items()
        for key in list(other.value):
            wkey = other.key_wrappers[key]  # the key wrapper thunder's MappingKeysIterator gives
            item = interpreter.MutMappingWrapperMethods.__getitem__(other, wkey)
            if item is raised:
                return item
            res = interpreter._interpret_call(dict.__setitem__, self, wkey, item)
            if res is raised:
                return res
        return wrap_const(None)

    def set_item(self, k, v):  # ``setitem`` of dict.update's keyword arguments: ``self[k] = v``
        return interpreter._interpret_call(dict.__setitem__, self, k, v) if _exact(self, dict) else _NOT_HANDLED

    def bound_method(fn, *args, **kwargs):  # ``_impl`` of a bound method call: ``fn.__func__(fn.__self__, ...)``
        if type(fn) is not W or not isinstance(fn.value, types.MethodType):
            return _NOT_HANDLED
        func = interpreter._interpret_call(getattr, fn, wrap_const("__func__"))
        if func is raised:
            return func
        self_ = interpreter._interpret_call(getattr, fn, wrap_const("__self__"))
        if self_ is raised:
            return self_
        return interpreter._interpret_call(func, self_, *args, **kwargs)

    def binary_op(a, b, left_method, right_method, binop_name):  # ``outofplace_impl`` of the binary operators
        # ``type(a).<left>(a, b)``, then ``type(b).<right>(b, a)`` when that is NotImplemented, then TypeError; the
        # types as the interpreted ``type()`` gives them (a subclass proxy's is its subclass: its __torch_function__)
        if type(a) is not W or type(b) is not W:
            return _NOT_HANDLED
        types_ = [interpreter._interpret_call(type, x) for x in (a, b)]
        if any(t is raised or not plain_type(t.value) for t in types_):
            return _NOT_HANDLED
        for x, y, cls, name in ((a, b, types_[0].value, left_method.value), (b, a, types_[1].value, right_method.value)):
            method = getattr(cls, name, None)
            if method is None:
                continue
            res = interpreter._interpret_call(wrap_const(method), x, y)
            if res is raised or res.value is not NotImplemented:
                return res
        return interpreter.do_raise(TypeError(
            f"unsupported operand type(s) for {binop_name.value}: '{types_[0].value}' and '{types_[1].value}'"))

    def partial_call(partial_function, *args, **kwargs):  # ``partial_call_impl``
        # ``partial_function.func(*partial_function.args, *args, **(partial_function.keywords | kwargs))``
        if type(partial_function) is not W or type(partial_function.value) is not functools.partial:
            return _NOT_HANDLED
        parts = []
        for name in ("func", "args", "keywords"):
            part = interpreter._interpret_call(getattr, partial_function, wrap_const(name))
            if part is raised:
                return part
            parts.append(part)
        func, pargs, keywords = parts
        if type(pargs.value) is not tuple or not _exact(keywords, dict):
            return _NOT_HANDLED
        pargs.track_items()
        keywords.track_items()
        items = [interpreter.SequenceWrapperMethods.__getitem__(pargs, wrap_const(i)) for i in range(len(pargs.value))]
        merged = {k: interpreter.MutMappingWrapperMethods.__getitem__(keywords, keywords.key_wrappers[k])
                  for k in keywords.value}
        merged.update(kwargs)
        return interpreter._interpret_call(func, *items, *args, **merged)

    def length(obj):  # ``impl`` of ``len()``: ``obj.__len__()`` checked
        if _exact(obj, list, tuple, dict):
            return interpreter._interpret_call(type(obj.value).__len__, obj)  # thunder's tracking __len__
        return _NOT_HANDLED

    def dict_or(self, other):  # ``impl`` of ``dict | other``: a copy updated with ``other``
        if not (_exact(self, dict) and _exact(other, dict)):
            return _NOT_HANDLED
        new = interpreter._interpret_call(dict.copy, self)
        if new is raised:
            return new
        res = interpreter._interpret_call(dict.update, new, other)
        return res if res is raised else new

    def next_step(iterator):  # ``impl`` of ``next()``: ``iterator.__next__()``
        method = type_method(iterator, "__next__")
        return _NOT_HANDLED if method is None else interpreter._interpret_call(wrap_const(method), iterator)

    def getitem(obj, index):  # ``getitem_impl`` of BINARY_SUBSCR: ``obj.__getitem__(index)``
        res = _fast_getitem(obj, index)
        if res is not _NOT_HANDLED:
            return res
        method = type_method(obj, "__getitem__")
        return _NOT_HANDLED if method is None else interpreter._interpret_call(wrap_const(method), obj, index)

    def list_extend(l1, l2):  # ``lambda l1, l2: l1.extend(l2)`` of LIST_EXTEND
        return interpreter._interpret_call(list.extend, l1, l2) if _exact(l1, list) else _NOT_HANDLED

    def iter_of(obj):  # ``nosentinel_impl`` of ``iter()``: ``obj.__iter__()``
        if _exact(obj, list, tuple, dict):
            return interpreter._interpret_call(type(obj.value).__iter__, obj)
        return _NOT_HANDLED

    def next_of(it):  # ``_next_impl`` of FOR_ITER: ``next(tos)``
        return interpreter._interpret_call(next, it)

    found = {
        _nested_code(interpreter._setup_frame_and_run_python_function,
                     lambda c: c.co_varnames == ("x", "i") and c.co_names == ("__getitem__",)): subscript,
        _nested_code(interpreter.wrap_kwargs_from_dict,
                     lambda c: c.co_varnames == ("d", "k") and c.co_name == "<lambda>"): subscript,
        _nested_code(handlers["DICT_MERGE"], lambda c: c.co_names == ("update",)): dict_update,
        _nested_code(handlers["LIST_EXTEND"], lambda c: c.co_names == ("extend",)): list_extend,
        _nested_code(interpreter.MutMappingWrapperMethods.update, lambda c: c.co_name == "impl_other_keys"):
            update_from_keys,
        _nested_code(interpreter.MutMappingWrapperMethods.update, lambda c: c.co_name == "setitem"): set_item,
        _nested_code(interpreter._iter_lookaside, lambda c: c.co_name == "nosentinel_impl"): iter_of,
        _nested_code(_unhooked(handlers["FOR_ITER"]), lambda c: c.co_name == "_next_impl"): next_of,
        _nested_code(interpreter._call_dispatch, lambda c: c.co_name == "_impl"): bound_method,
        _nested_code(interpreter._binary_op, lambda c: c.co_name == "outofplace_impl"): binary_op,
        _nested_code(interpreter.partial_call_lookaside, lambda c: c.co_name == "partial_call_impl"): partial_call,
        _nested_code(interpreter._len_lookaside, lambda c: c.co_name == "impl"): length,
        _nested_code(interpreter.MutMappingWrapperMethods.__or__, lambda c: c.co_name == "impl"): dict_or,
        _nested_code(interpreter._next_lookaside, lambda c: c.co_name == "impl"): next_step,
        _nested_code(_unhooked(handlers["BINARY_SUBSCR"]), lambda c: c.co_name == "getitem_impl"): getitem,
    }
    takes_function = set()
    dtensor_dispatch = _dtensor_dispatch_helper()
    if dtensor_dispatch is not None:
        code, dispatch = dtensor_dispatch
        found[code] = dispatch
        takes_function.add(dispatch)
    found.pop(None, None)
    return found, {bound_method, partial_call, *takes_function}, takes_function


def _unhooked(fn):
    return getattr(fn, "__wrapped__", fn) if getattr(fn, plugin_state.HOOK_MARK, False) else fn


def _own_method_descriptor(method) -> Any:
    """The method descriptor that the class of a builtin bound method's ``__self__`` defines itself, when binding it
    gives ``method`` (``io.StringIO.write`` for ``buf.write``); else None.

    thunder's ``_call_dispatch`` looks for a builtin method's unbound function from the *base* classes of its
    ``__self__``'s type first (for ``super()`` calls) and takes one whose binding compares equal. Under Python 3.12
    ``_io._TextIOBase.write.__get__(buf) == buf.write`` holds, and calling the base class's descriptor on a
    ``StringIO`` crashes the process (a segmentation fault: ``buf.write("x")``, ``logging`` to a ``StringIO`` or file
    handler, inside compiled code; plain ``thunder.jit`` too, which this leaves as it is). The class's own descriptor is
    what CPython calls."""
    slf = getattr(method, "__self__", None)
    if slf is None or isinstance(slf, (type, types.ModuleType)):
        return None
    own = type(slf).__dict__.get(method.__name__)
    if type(own) is not types.MethodDescriptorType:
        return None
    try:
        return own if own.__get__(slf) == method else None
    except Exception:
        return None


def _hook_interpret_call(original):
    table, takes_keywords, takes_function = _helper_table()
    WrappedValue = _interp().WrappedValue
    FunctionType = types.FunctionType

    BuiltinMethodType = types.BuiltinMethodType
    own_method_first = sys.version_info >= (3, 12)

    @functools.wraps(original)
    def _interpret_call(fn, /, *args, **kwargs):
        func = fn.value if type(fn) is WrappedValue else fn  # a function read in traced code comes wrapped
        if own_method_first and type(func) is BuiltinMethodType and is_plugin_active():
            own = _own_method_descriptor(func)
            if own is not None:
                wrapped = fn if type(fn) is WrappedValue else _interp().wrap_const(fn)
                slf = original(getattr, wrapped, _interp().wrap_const("__self__"))
                return original(_interp().wrap_const(own), slf, *args, **kwargs)
        fast = table.get(func.__code__) if type(func) is FunctionType else None
        if fast is not None and (not kwargs or fast in takes_keywords) and _tracking():
            res = fast(func, *args, **kwargs) if fast in takes_function else fast(*args, **kwargs)
            if res is not _NOT_HANDLED:
                return res
        return original(fn, *args, **kwargs)

    _interpret_call.fast_helpers = len(table)
    return _interpret_call


def hook_targets() -> list[tuple[Any, str, Callable]]:
    interpreter = _interp()
    handlers = interpreter._default_opcode_handler_map
    tracking = interpreter._default_provenance_tracking_lookaside_map
    return [
        (interpreter, "_interpret_call", _hook_interpret_call),
        (interpreter, "globals_lookup", _hook_globals_lookup),
        (handlers, "BINARY_SUBSCR", _hook_binary_subscr),
        (handlers, "FOR_ITER", _hook_for_iter),
        (handlers, "CONTAINS_OP", _hook_contains_op),
        (handlers, "STORE_ATTR", _hook_store_attr),
        (handlers, "STORE_SUBSCR", _hook_store_subscr),
        (tracking, list.__iter__, _hook_sequence_iter),
        (tracking, tuple.__iter__, _hook_sequence_iter),
        (interpreter._default_lookaside_map, next, _hook_next_lookaside),
    ]
