"""Object reads: which guard an object that traced code read gets, and when a guard gets stricter.

In: the interpreter's reports while tracing (``thunder_subclass.hooks``): an object read from the inputs with its
provenance (:func:`guard_input_object`), an attribute found missing (:func:`guard_attribute_absent`), a native call's
arguments (:func:`guard_native_call_arguments`), compared operands (:func:`guard_compared_objects`), a getter of
torch's state (:func:`guard_torch_state_query`), a module call's forward hooks (:func:`add_module_hooks_guard`).
What happens: each object gets one guard per trace (``guards.objects``: by identity, function, type, length, keys),
made stricter when the trace comes to depend on more of it (by value, state or identity). Out: jit constraints, the
prologue's checks.
"""

from __future__ import annotations

import enum
import functools
import itertools
import types

from typing import Any

import torch

from thunder_subclass import _thunder_internals
from thunder_subclass.errors import UnsupportedTracingError, format_location
from thunder_subclass.guards.objects import (
    ConstantPath,
    ModuleHooksSpec,
    ObjectSpec,
    Pending,
    TorchStateQuery,
    check_attribute_absent,
    check_constant_path,
    check_module_hooks,
    check_object,
    check_torch_state,
    describe_provenance,
    guarded_object_names,
)
from thunder_subclass.guards.protocol import MISSING
from thunder_subclass.guards.values import (
    HEAPTYPE,
    SCALARS,
    STATE_LIMIT,
    function_snapshot,
    is_plain_instance,
    state_snapshot,
    value_snapshot,
)
from thunder_subclass.guards.write_backs import is_held_container, restore_container
from thunder_subclass.frontend.proxy import mark_protocol_error


def add_module_hooks_guard(jit_ctx, module, provenance, hooks: tuple) -> None:
    """A module called in traced code (reached from the inputs by ``provenance``) ran with the forward hooks
    ``hooks``: a call where it has other hooks (added or removed since, or backward or global hooks) is a cache miss.
    One check per module and trace."""
    from thunder.core.proxies import AnyProxy

    state = _thunder_internals.jit_state()
    guarded = state.setdefault("hooks_guarded", set()) if state is not None else set()
    if id(module) in guarded:
        return
    guarded.add(id(module))
    # a name of its own: the prologue unpacks constraint arguments by name, and an "anyN" made while interpreting can
    # equal the name of another value's proxy there (Mistral's sliding_window: the check got an int)
    name = f"hooked_module{next(_hooked_module_names)}"
    module_type = None if _is_input_fn(provenance) else type(module)
    jit_ctx.add_constraint((check_module_hooks, AnyProxy(module, name=name, history=provenance),
                            ModuleHooksSpec(hooks, module_type)))


def _is_input_fn(record) -> bool:
    return getattr(record.inst, "name", None) == "INPUT_FN"


_hooked_module_names = itertools.count()



_IDENTITY_TYPES = (
    type, types.FunctionType, types.BuiltinFunctionType, functools.partial, enum.Enum, torch.dtype, torch.layout,
    torch.memory_format, torch._ops.OpOverload, torch._ops.OpOverloadPacket, type(None),
)
# reached from the inputs and checked by thunder itself (numbers, strings, slices, devices: by value; tensors), or
# containers whose items are read (and checked) one by one, or handled by their own guards (modules, proxies)
_CHECKED_ELSEWHERE = (torch.Tensor, int, float, complex, str, slice, torch.device, tuple, list, dict,
                      types.ModuleType, types.CellType, torch.nn.Module)


def _is_bound_method(obj) -> bool:
    # made anew by each attribute read; what it runs is the type's (guarded through its __self__ object)
    if isinstance(obj, (types.MethodType, types.MethodWrapperType)):
        return True
    if isinstance(obj, types.BuiltinMethodType):
        owner = obj.__self__
        return owner is not None and not isinstance(owner, (type, types.ModuleType))
    return False


def object_guard_kind(obj) -> str | None:
    """The kind of :class:`ObjectSpec` an object read from the inputs gets when traced code reaches it, or None when
    something else checks it (see ``_CHECKED_ELSEWHERE``) or it needs no check of its own (a bound method)."""
    from thunder.core.proxies import Proxy

    if isinstance(obj, (_CHECKED_ELSEWHERE, Proxy)):
        return None
    if type(obj) is types.MethodType and type(obj.__func__) is types.FunctionType:
        return "method"  # its function, read from the class (or the instance), was inlined
    if _is_bound_method(obj):
        return None
    if isinstance(obj, _IDENTITY_TYPES):
        return "identity"
    return "type"


@functools.cache
def _module_machinery_names() -> frozenset:
    """The attributes ``nn.Module`` itself has (class and instance: ``_parameters``, ``_compiled_call_impl``,
    ``training``, ...): read by torch's module machinery on every module call, not by the model's code."""
    return frozenset(dir(torch.nn.Module)) | frozenset(vars(torch.nn.Module()))


def is_guardable_provenance(record, *, globals_too: bool = False) -> bool:
    """Whether an object with provenance ``record`` (one the prologue can unpack) is one traced code read from the
    arguments or the compiled module's attributes, as opposed to what the interpreter read on its way: dunder
    attributes (``__func__``, ``__dict__``, ``__globals__``: how methods, globals and closures are resolved; the
    object they come from is guarded, or they are not inputs) and ``nn.Module``'s own machinery attributes. An
    object reached as a bound method's ``__self__`` is guarded (a method passed as an argument). ``globals_too``: a
    function's ``__globals__`` counts as an input (for lists, tuples and dicts read from module globals: their sizes
    and keys are guarded, and changes the traced code makes to them reach the caller's object)."""
    import dis

    for inp in record.inputs:
        if not is_guardable_provenance(inp, globals_too=globals_too):
            return False
    inst = record.inst.opname if isinstance(record.inst, dis.Instruction) else getattr(record.inst, "name", None)
    if inst == "LOAD_ATTR" and len(record.inputs) == 2:
        name = getattr(record.inputs[1], "value", None)
        if not isinstance(name, str) or name in _module_machinery_names():
            return False
        if name.startswith("__") and name.endswith("__") and name != "__self__":
            return globals_too and name == "__globals__"
    return True



def guard_input_object(obj, provenance) -> None:
    """Traced code reached ``obj`` from the inputs (its ``provenance`` is one the prologue can unpack): a call where it
    is another object, one of another type, or (after :func:`guard_object_by_value`) another value is a cache miss.
    One guard per object and trace; objects reached only on the interpreter's way (see
    :func:`is_guardable_provenance`) and values thunder checks itself get none."""
    from thunder.core.proxies import AnyProxy

    state = _thunder_internals.jit_state()
    jit_ctx = _thunder_internals.jit_context()
    if state is None or jit_ctx is None:
        return
    # (a path the prologue unpacks never ends at a marked key, which is neither an int nor a str: no walk for those)
    rooted = None if _thunder_internals.is_unpackable_provenance(provenance) else \
        _thunder_internals.constant_rooted_path(provenance)
    if rooted is not None:
        _guard_constant_path(obj, *rooted, state, jit_ctx)
        return
    # every value read from the inputs, by its provenance record: the holders of later attribute reads
    seen = state.setdefault("input_values", {})
    seen[id(provenance)] = (provenance, obj)
    if type(obj) in (list, tuple, dict, set, frozenset):
        _guard_container_size(obj, provenance, state, jit_ctx)
        return
    kind = object_guard_kind(obj)
    if kind is None or not is_guardable_provenance(provenance):
        return
    guarded = state.setdefault("object_guards", {})
    if id(obj) in guarded:
        _guard_another_path(obj, provenance, guarded[id(obj)][1], state, jit_ctx)
        return
    stable = _is_stored(obj, provenance, seen)
    if kind == "identity" and not stable and not isinstance(obj, _SINGLETON_TYPES):
        kind = "type"  # made anew by each read (a property): the same object will not come again
    spec = object_spec(obj, kind, describe_provenance(provenance))
    guarded[id(obj)] = (obj, spec, stable)  # the object is kept for the trace's lifetime, so its id stays its own
    state.setdefault("object_guard_paths", {})[id(obj)] = {provenance}
    name = f"guarded_object{next(guarded_object_names)}"
    jit_ctx.add_constraint((check_object, AnyProxy(obj, name=name, history=provenance), spec))


def object_spec(obj, kind: str, where: str) -> ObjectSpec:
    """The spec of an object guarded by ``kind`` (``"identity"`` or ``"type"``): a Python function by identity becomes
    a ``"function"`` spec (the same code, defaults and closure values)."""
    value = obj if kind == "identity" else None
    if kind == "method":
        try:
            return ObjectSpec(kind, types.MethodType, function_snapshot(obj.__func__), where)
        except ValueError:  # an empty closure cell: by type only (as before this kind)
            return ObjectSpec("type", type(obj), None, where)
    if kind == "identity" and type(obj) is types.FunctionType:
        try:
            kind, value = "function", function_snapshot(obj)
        except ValueError:  # an empty closure cell: the object itself
            pass
    return ObjectSpec(kind, type(obj), value, where)


def guard_attribute_absent(obj, provenance, name: str) -> None:
    """Traced code looked for attribute ``name`` of ``obj`` (read from the inputs by ``provenance``) and did not find it
    (``getattr(obj, name, default)``, ``hasattr``, an ``AttributeError`` it caught): the trace took the default's
    path, so a call where ``obj`` has the attribute is a cache miss (it reused the stale trace: a silently wrong
    result). One check per object path and name; a jitted module is checked on itself, not its ``ThunderModule``."""
    from thunder.core.proxies import AnyProxy

    state = _thunder_internals.jit_state()
    jit_ctx = _thunder_internals.jit_context()
    if state is None or jit_ctx is None or type(name) is not str or (name.startswith("__") and name.endswith("__")):
        return  # (dunders come from the type, which other checks guard)
    if isinstance(obj, torch.Tensor) or not hasattr(obj, "__dict__"):
        # an object without an instance dict gains no attribute (its type, guarded elsewhere, decides); tensors have
        # their own proxies in the prologue (an attribute set on an input tensor later: see docs/limits.md)
        return
    if not _thunder_internals.is_unpackable_provenance(provenance) or not is_guardable_provenance(provenance):
        return
    provenance = _thunder_internals.hooked_module_provenance(obj, provenance)
    seen = state.setdefault("absent_attributes", set())
    if (provenance, name) in seen:
        return
    seen.add((provenance, name))
    holder = AnyProxy(obj, name=f"attribute_holder{next(guarded_object_names)}", history=provenance)  # (any name)
    jit_ctx.add_constraint((check_attribute_absent, holder, name))



def guard_torch_state_query(fn, args: tuple, result) -> None:
    """Traced code read ``result`` from torch's global state (``fn(*args)``, a ``torch._C`` getter such as the one
    behind ``torch.are_deterministic_algorithms_enabled()``): the trace holds it as a constant, so the prologue
    checks it again on every call (a changed setting is a cache miss and a new trace, as torch.compile's global-state
    guard). Once per query and trace."""
    jit_ctx = _thunder_internals.jit_context()
    state = _thunder_internals.jit_state()
    if jit_ctx is None or state is None:
        return
    done = state.setdefault("torch_state_guards", set())
    key = (fn, args)
    if key in done:
        return
    done.add(key)
    jit_ctx.add_constraint((check_torch_state, TorchStateQuery(fn, args), result))


def _guard_constant_path(obj, root, path: tuple, state, jit_ctx) -> None:
    """Guard ``obj``, read by traced code from the dict key object ``root`` along ``path``: thunder inlines such values
    as constants (it wraps dict keys as constants), so without this a changed ``k.n`` reused the trace made with the
    old value. Numbers, strings and other scalars are checked by value (:func:`is_same_value`), lists/tuples by
    length and dicts by keys (each item read has its own guard), other objects as :func:`guard_input_object` guards
    them (identity or type); a tensor cannot be checked this way (a typed error)."""
    from thunder.core.proxies import Proxy, TensorProxy

    where = ConstantPath(root, path)
    if isinstance(obj, (torch.Tensor, TensorProxy)):
        # raised here, thunder would wrap it in an InterpreterError: the first operation on the value raises it
        error = UnsupportedTracingError(
            f"traced code read the tensor {where!r} from an object used as a dict key (at "
            f"{format_location(*_thunder_internals.source_location())}); thunder_subclass cannot pass such a tensor to "
            "the compiled program. Store the tensor as a value of the dict, or pass it as an argument."
        )
        if isinstance(obj, TensorProxy):
            mark_protocol_error(obj, error)
        return
    if isinstance(obj, Proxy):
        return
    done = state.setdefault("constant_path_guards", set())
    key = (id(root), path)
    if key in done:
        return
    if type(obj) in SCALARS or isinstance(obj, (slice, torch.device)):
        spec = ObjectSpec("same", type(obj), obj, repr(where))
    elif type(obj) in (list, tuple, dict):
        spec = ObjectSpec("keys" if type(obj) is dict else "length", type(obj), Pending(obj), repr(where))
    else:
        kind = object_guard_kind(obj)
        if kind is None:
            return
        spec = object_spec(obj, kind, repr(where))
    done.add(key)
    # (the constraint holds the root for the trace's lifetime, so the id in ``done`` stays the root's own)
    jit_ctx.add_constraint((check_constant_path, where, spec))


def _guard_another_path(obj, provenance, spec: ObjectSpec, state, jit_ctx) -> None:
    """``obj``, guarded, is read again by another path (``f(x, (o, o))``: ``t[0]`` and ``t[1]``): the object at that
    path is checked too, against the same spec (its later upgrades to value or identity included); without this a
    call with another object there reused the trace (``t[0] is t[1]`` answered as traced)."""
    from thunder.core.proxies import AnyProxy

    if not is_guardable_provenance(provenance):
        return
    paths = state.setdefault("object_guard_paths", {}).setdefault(id(obj), set())
    try:
        if provenance in paths:
            return
        paths.add(provenance)
    except Exception:  # noqa: BLE001 - a record holding a value that cannot be hashed or compared: guard it anyway
        pass
    name = f"guarded_object{next(guarded_object_names)}"
    jit_ctx.add_constraint((check_object, AnyProxy(obj, name=name, history=provenance), spec))



def _guard_container_size(obj, provenance, state, jit_ctx) -> None:
    """A list, tuple, dict, set or frozenset read from the inputs: its length (dict: keys in order; set: items in
    iteration order, which a loop over it follows) is guarded, once per object and trace (see :class:`ObjectSpec`
    ``"length"``/``"keys"``). The call's own ``args``/``kwargs`` are bound by thunder."""
    import dis

    from thunder.core.proxies import AnyProxy

    inst = provenance.inst.opname if isinstance(provenance.inst, dis.Instruction) else \
        getattr(provenance.inst, "name", None)
    # (module globals too: a trace that iterated or changed a global list or dict depends on its size and keys; not a
    # module's globals dict itself, which the interpreter reads to look up every global name)
    if inst in ("INPUT_ARGS", "INPUT_KWARGS"):
        return
    if not is_guardable_provenance(provenance, globals_too=True):
        # (a container reached through nn.Module's machinery, ``self._modules['c'].stats``: not guarded here, but
        # what a trace that fails changed in it is undone, or the eager run after the failure changes it again; and
        # what a trace changed in it is put back and written by the epilogue, as for input containers: left changed,
        # the trace's own prologue read the changed value and rejected the call it was made from)
        if type(obj) in (list, dict) and is_held_container(provenance):
            before = list(obj.items()) if type(obj) is dict else list(obj)
            _thunder_internals.undo_if_trace_fails(functools.partial(restore_container, obj, before))
            if _thunder_internals.is_unpackable_provenance(provenance) and id(obj) not in state.setdefault(
                    "held_containers", set()):
                state["held_containers"].add(id(obj))
                state.setdefault("input_containers", []).append(
                    (obj, provenance, before, _thunder_internals.source_location()))
        return
    if inst == "LOAD_ATTR" and getattr(provenance.inputs[1], "value", None) == "__globals__":
        return
    guarded = state.setdefault("object_guards", {})
    if id(obj) in guarded:
        return
    if type(obj) in (list, dict):
        # as it is now, for write_back_input_containers at the end of the trace, and to restore if the trace fails
        before = list(obj.items()) if type(obj) is dict else list(obj)
        state.setdefault("input_containers", []).append((obj, provenance, before, _thunder_internals.source_location()))
        _thunder_internals.undo_if_trace_fails(functools.partial(restore_container, obj, before))
    spec = ObjectSpec("length" if type(obj) in (list, tuple) else "keys", type(obj), Pending(obj),
                      describe_provenance(provenance))
    guarded[id(obj)] = (obj, spec, True)
    name = f"guarded_object{next(guarded_object_names)}"
    jit_ctx.add_constraint((check_object, AnyProxy(obj, name=name, history=provenance), spec))




_BINDING_GETS = frozenset({
    types.FunctionType.__get__, types.MethodDescriptorType.__get__, types.WrapperDescriptorType.__get__,
    types.ClassMethodDescriptorType.__get__, staticmethod.__get__, classmethod.__get__,
})


def guard_native_call_arguments(fn, wrapped_args: tuple) -> None:
    """The interpreter runs ``fn`` natively with ``wrapped_args``: each guarded input object among them is guarded
    by value from now on (:func:`guard_object_by_value`), except for the descriptors that bind methods."""
    try:
        if fn in _BINDING_GETS:
            return
    except TypeError:  # unhashable callable
        pass
    state = _thunder_internals.jit_state()
    guarded = state.get("object_guards") if state is not None else None
    if not guarded:
        return
    by_identity = fn is id
    try:
        reads_state = fn not in _TYPE_ONLY_NATIVES
        reads_dict = fn in _DICT_READERS
    except TypeError:  # unhashable callable
        reads_state, reads_dict = True, False
    values = [getattr(a, "value", a) for a in wrapped_args]
    # a Python function among the arguments (a key=, a callback) may be called with any of the others natively
    callback = reads_state and any(isinstance(v, _PYTHON_CALLABLES) for v in values)
    for value in values:
        if id(value) in guarded:
            if by_identity:  # id(obj) is the object's identity, whatever its value equality
                guard_object_by_identity(value)
            else:
                guard_object_by_value(value, reads_state and (reads_dict or callback or _may_call_back(value)))
        if reads_state and type(value) in (list, tuple, dict) and len(value) <= STATE_LIMIT:
            # a container made in the traced code (list(objs), [a, b]) holding objects read from the inputs
            for item in (value.values() if type(value) is dict else value):
                if id(item) in guarded:
                    guard_object_by_value(item, callback or _may_call_back(item))


# natives whose answer depends only on the type or identity of their arguments: no state of theirs is read
_TYPE_ONLY_NATIVES = frozenset({isinstance, issubclass, type, callable, object.__init__, object.__new__,
                                object.__init_subclass__, object.__eq__, object.__ne__, object.__hash__})
# natives that read an object's __dict__ without calling its methods (copy.copy, copy.deepcopy, pickle's reduce)
_DICT_READERS = frozenset({object.__reduce_ex__, object.__reduce__, object.__getstate__})
_PYTHON_CALLABLES = (types.FunctionType, types.MethodType, functools.partial)
# the methods of the protocols C code calls (comparisons, arithmetic, hashing, iteration, conversion, formatting,
# copying): an object whose class defines one in Python may run Python code inside a native call
_PROTOCOL_METHODS = frozenset(
    f"__{name}__" for name in (
        "lt le gt ge eq ne hash bool len iter next getitem contains index int float complex call format str repr "
        "reduce reduce_ex getstate copy deepcopy getattr getattribute neg pos abs invert round trunc floor ceil "
        "add sub mul matmul truediv floordiv mod divmod pow lshift rshift and or xor "
        "radd rsub rmul rmatmul rtruediv rfloordiv rmod rdivmod rpow rlshift rrshift rand ror rxor").split()
)

__all__ = ["add_module_hooks_guard", "guard_attribute_absent", "guard_compared_objects", "guard_input_object",
           "guard_native_call_arguments", "guard_lookaside_arguments", "guard_object_by_identity", "guard_object_by_value",
           "guard_torch_state_query", "is_guardable_provenance", "object_guard_kind", "object_spec"]


def _may_call_back(obj) -> bool:
    """Whether C code given ``obj`` may run Python code of it: a class of its type (a Python class) defines a protocol
    method, or it is a list, tuple or dict holding such an object."""
    if type(obj) in (list, tuple, dict):
        items = obj.values() if type(obj) is dict else obj
        return len(obj) <= STATE_LIMIT and any(_may_call_back(i) for i in items)
    return _type_may_call_back(type(obj))


@functools.lru_cache(maxsize=1024)
def _type_may_call_back(cls: type) -> bool:
    return any(c.__flags__ & HEAPTYPE and not _PROTOCOL_METHODS.isdisjoint(vars(c)) for c in cls.__mro__)


def guard_lookaside_arguments(wrapped_args: tuple) -> None:
    """A lookaside runs a function natively with ``wrapped_args`` (DTensor's ``from_local`` / ``redistribute``: the
    device mesh and placements): each argument that is not a tensor, read from the inputs or globals (a provenance
    the prologue can unpack), and each such item of a list or tuple the traced code built, is checked by equality with
    a copy taken now (by identity without value equality). Globals are not guarded inputs otherwise, so a new
    placement bound to the same global reused the trace made for the old one."""
    from thunder.core.interpreter import WrappedValue
    from thunder.core.proxies import AnyProxy, Proxy

    state = _thunder_internals.jit_state()
    jit_ctx = _thunder_internals.jit_context()
    if state is None or jit_ctx is None:
        return
    done = state.setdefault("lookaside_argument_guards", set())

    def visit(w, depth: int) -> None:
        if not isinstance(w, WrappedValue) or depth > 2:
            return
        value, provenance = w.value, w.provenance
        if isinstance(value, (torch.Tensor, Proxy)) or type(value) in SCALARS:
            return
        if not _thunder_internals.is_unpackable_provenance(provenance):
            if type(value) in (list, tuple):  # built in the traced code: its items
                for item in getattr(w, "item_wrappers", None) or ():
                    visit(item, depth + 1)
            return
        if id(value) in done:
            return
        snapshot = value_snapshot(value)
        spec = ObjectSpec("equal", type(value), snapshot, describe_provenance(provenance)) if snapshot is not None \
            else ObjectSpec("identity", type(value), value, describe_provenance(provenance))
        done.add(id(value))
        name = f"guarded_object{next(guarded_object_names)}"
        jit_ctx.add_constraint((check_object, AnyProxy(value, name=name, history=provenance), spec))

    for w in wrapped_args:
        visit(w, 0)


def guard_compared_objects(op: str, a: Any, b: Any) -> None:
    """Traced code compares ``a`` and ``b`` (``op``: ``"is"``, ``"=="`` for any rich comparison, ``"in"`` for
    ``a in b``), which the interpreter does natively: the trace's branch depends on the answer, so each guarded input
    object among them is guarded by what the answer depends on. ``is`` depends on identity: where both operands have
    the same type (else the type guards decide it), each is guarded by identity. ``==`` (an object without ``__eq__``
    compares by identity) and ``in`` (hash and ``==`` of the item; the container's items when it is an input): by
    value, else identity (:func:`guard_object_by_value`). Without these, ``f(x, marker)`` then ``f(x, object())``
    reused the first trace of ``x * 2 if token is marker else x``."""
    state = _thunder_internals.jit_state()
    guarded = state.get("object_guards") if state is not None else None
    if not guarded:
        return
    if op == "is":
        if type(a) is not type(b):
            return
        for v in (a, b):
            if id(v) in guarded:
                guard_object_by_identity(v)
        return
    for v in (a, b):
        if id(v) in guarded:
            guard_object_by_value(v)


def guard_object_by_identity(obj) -> None:
    """``obj``, guarded by :func:`guard_input_object`, is one whose identity the trace depends on (``is``, ``id``):
    from now on it must be the same object (kept alive by the guard, so its id stays its own)."""
    state = _thunder_internals.jit_state()
    entry = state.get("object_guards", {}).get(id(obj)) if state is not None else None
    if entry is None or entry[1].kind == "identity":
        return
    spec = entry[1]
    spec.become("identity", obj)


def guard_object_by_value(obj, by_state: bool = False) -> None:
    """``obj``, guarded by :func:`guard_input_object`, was passed to a native function (one thunder runs, not
    interprets), whose result may depend on any of its state: from now on it must equal a copy taken now (when its
    type has value equality), else be the same object. With ``by_state`` (a native function that may call the object's
    Python methods or read its ``__dict__``): else be the same object with the same instance state
    (:func:`state_snapshot`), or, for a list or tuple, hold items with the same state."""
    state = _thunder_internals.jit_state()
    entry = state.get("object_guards", {}).get(id(obj)) if state is not None else None
    if entry is not None and entry[1].kind == "length":
        # a list or tuple a native function reads whole: its items, not just its length (by value, else by the
        # state of each item)
        snapshot = value_snapshot(obj)
        if snapshot is not None:
            entry[1].become("equal", snapshot)
        elif by_state:
            snapshot = state_snapshot(obj, identity=False)
            if snapshot is not None:
                entry[1].become("state", snapshot)
        return
    if entry is None or entry[1].kind not in ("type", "identity"):
        return
    _, spec, stable = entry
    if spec.kind == "identity":
        # the trace depends on which object it is (``is``, or no value equality): the same object, now also with the
        # same state; never an equal copy instead
        if by_state and type(obj) is spec.typ and is_plain_instance(obj):
            snapshot = state_snapshot(obj, identity=True)
            if snapshot is not None:
                spec.become("state", snapshot)
        return
    snapshot = value_snapshot(obj)
    if snapshot is not None:
        spec.become("equal", snapshot)
        return
    snapshot = state_snapshot(obj, identity=stable) if by_state else None
    if snapshot is not None:
        spec.become("state", snapshot)
    elif stable:
        spec.become("identity", obj)
    # else: made anew by each read and without value equality: its type stays what is guarded


# members of these types are the same object whenever they are equal (None, enum members, dtypes, ...)
_SINGLETON_TYPES = (type(None), enum.Enum, torch.dtype, torch.layout, torch.memory_format)


def _is_stored(obj, provenance, seen: dict) -> bool:
    """Whether ``obj`` is stored where ``provenance`` reads it (an argument, an item, an instance attribute or slot,
    a bound method's ``__self__``), so that the same object is read again next call if nothing replaced it; False for
    a value a property or ``__getattr__`` makes at each read."""
    import inspect

    name = getattr(provenance.inst, "name", None)
    if name in ("INPUT_ARGS", "INPUT_KWARGS", "BINARY_SUBSCR", "INPUT_FN"):  # (INPUT_FN: the compiled function)
        return True
    if name != "LOAD_ATTR" or len(provenance.inputs) != 2:
        return False
    base, attr = provenance.inputs[0], getattr(provenance.inputs[1], "value", None)
    if attr == "__self__":
        return True
    if getattr(base.inst, "name", None) == "INPUT_FN":
        holder = getattr(_thunder_internals.current_compile_data()[0], "fn", None)
    else:
        holder = seen.get(id(base), (None, None))[1]
    if holder is None or not isinstance(attr, str):
        return False
    if getattr(holder, "__dict__", {}).get(attr, MISSING) is obj:
        return True
    return isinstance(inspect.getattr_static(type(holder), attr, None), types.MemberDescriptorType) and \
        getattr(holder, attr, MISSING) is obj

