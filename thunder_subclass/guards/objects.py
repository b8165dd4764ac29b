"""Object checks: the guard kinds of Python objects the traced code read (each a
:class:`~thunder_subclass.guards.protocol.Guard`, each with its check symbol).

In: an object traced code reached from the inputs (``guards.object_reads`` decides which guard it gets), a module
whose forward hooks a call ran, an attribute found missing, a getter of torch's state, a value read from a dict key
object. Out: the guards, and their checks ``check_object(obj, spec)`` (one :class:`ObjectSpec` kind per way an object
is compared: identity, function, method, equal, state, same, type, length, keys), ``check_module_hooks(module,
spec)``, ``check_attribute_absent(obj, name)``, ``check_torch_state(query, expected)`` and
``check_constant_path(where, spec)``.
"""

from __future__ import annotations

import itertools
import types

from typing import Any

from thunder_subclass import _thunder_internals
from thunder_subclass.guards.protocol import Guard, is_same_value, register_check
from thunder_subclass.guards.watched import StateCheck, watched
from thunder_subclass.guards.values import (
    equal_to_snapshot,
    function_snapshot,
    same_function,
    same_state,
    state_difference,
)

__all__ = ["ModuleHooksSpec", "ObjectSpec", "Pending", "StateCheck", "FunctionCheck", "AttributeAbsent",
           "TorchStateQuery", "TorchStateAnswer", "ConstantPath", "ObjectAtPath", "INPUT_FN_WHERE",
           "check_module_hooks", "check_object", "check_attribute_absent", "check_torch_state", "check_constant_path",
           "describe_provenance", "guarded_object_names"]


class ModuleHooksSpec(Guard):
    """The forward hooks of a module called in traced code, as the trace ran them (``(pre, post)`` of
    ``_thunder_internals.module_forward_hooks``), and the module's class (``module_type``; None for the compiled
    module itself, which the prologue reaches as its ``ThunderModule``): the prologue checks each call that they are
    still those (a submodule replaced by one of another class, ``m.act = nn.GELU()``, is a cache miss; one of the same
    class is checked by the checks of what the trace read from it)."""

    __slots__ = ("hooks", "module_type")

    def __init__(self, hooks: tuple, module_type: type | None = None):
        self.hooks, self.module_type = hooks, module_type

    def __repr__(self) -> str:
        pre, post = self.hooks
        return f"ModuleHooksSpec({len(pre)} forward pre-hooks, {len(post)} forward hooks)"

    def matches(self, module) -> bool:
        return (self.module_type is None or type(module) is self.module_type) and \
            _thunder_internals.module_forward_hooks(module) == self.hooks

    def expression(self, v: str, const) -> tuple:
        conditions = []
        if self.module_type is not None:
            conditions.append(f"(type({v}) is {const(self.module_type)})")
        if self.hooks == ((), ()):
            if const.once("global module hooks"):
                conditions.append("_no_global_hooks()")
            conditions.append(_thunder_internals.module_has_no_own_hooks_expression(v))
        else:
            conditions.append(f"(_hooks({v}) == {const(self.hooks)})")
        return tuple(conditions)

    def explain(self, module) -> str:
        if self.module_type is not None and type(module) is not self.module_type:
            return (f"the submodule is a {type(module).__qualname__}, the trace was made for a "
                    f"{self.module_type.__qualname__}")
        return f"the hooks of {type(module).__name__} changed"


check_module_hooks = register_check("check_module_hooks", ("module", "spec"))


class Pending:
    """The container whose length or keys an ``ObjectSpec`` records once the prologue is made."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj


_KINDS: dict[str, type] = {}  # kind -> its ObjectSpec class


class ObjectSpec(Guard):
    """What a Python object that traced code read from the inputs (an argument, or an attribute or item reached from
    the arguments or the compiled module) was when traced, as far as the trace may depend on it; the prologue checks
    it every call (``check_object``), as dynamo guards the objects it reads. ``ObjectSpec(kind, typ, value, where)``
    makes the spec of one kind, a class of its own (below); a guard made stricter while tracing (an object then passed
    to a native call) becomes another kind (:meth:`become`). ``where`` names the object in messages."""

    __slots__ = ("typ", "value", "where")
    kind = ""

    def __new__(cls, kind: str = "", typ: type = object, value: Any = None, where: str = ""):
        return object.__new__(_KINDS[kind] if cls is ObjectSpec else cls)

    def __init__(self, kind: str, typ: type, value: Any = None, where: str = ""):
        self.typ, self.value, self.where = typ, value, where

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.kind:
            _KINDS[cls.kind] = cls

    def __repr__(self) -> str:
        return f"ObjectSpec({self.kind}, {self.typ.__qualname__})"

    def become(self, kind: str, value: Any) -> None:
        """This guard, made stricter while tracing: of ``kind`` now, comparing with ``value``."""
        self.__class__, self.value = _KINDS[kind], value

    def _what(self) -> str:
        return f"the {self.where}" if self.where else "an object"

    def _typed(self, v: str, const, condition: str) -> str:
        return f"(type({v}) is {const(self.typ)} and {condition})"

    def _wrong_type(self, obj) -> str | None:
        if type(obj) is self.typ:
            return None
        return f"{self._what()} is a {type(obj).__qualname__}, the trace was made for a {self.typ.__qualname__}"


class _Identity(ObjectSpec):
    """The same object (a builtin function, a class, an enum member, ``None``, a dtype; an object passed to a native
    call that has no value equality): the trace may have inlined what it does or is."""

    __slots__ = ()
    kind = "identity"

    def matches(self, obj) -> bool:
        return obj is self.value

    def expression(self, v: str, const) -> str:
        return f"({v} is {const(self.value)})"

    def explain(self, obj) -> str:
        return f"{self._what()} is {obj!r}, not {self.value!r} (the object the trace was made for)"


class _Function(ObjectSpec):
    """A Python function: the same one, or one with the same code, defaults and closure values (the interpreter
    inlined its body); ``value``: its :func:`function_snapshot`."""

    __slots__ = ()
    kind = "function"

    def matches(self, obj) -> bool:
        return same_function(obj, self.value)

    def expression(self, v: str, const) -> str:
        return f"{const(FunctionCheck(self))}({v})"

    def explain(self, obj) -> str:
        return (f"{self._what()} is {obj!r}, not {self.value[0]!r} or a function with its code, defaults and closure "
                "values (the function the trace was made for)")


class _Method(_Function):
    """A method of a Python function bound to the object it was read from (``self.act``): a bound method again, of
    such a function (a method replaced on the class, or shadowed by a function set on the instance, is a miss)."""

    __slots__ = ()
    kind = "method"

    def matches(self, obj) -> bool:
        return type(obj) is types.MethodType and same_function(obj.__func__, self.value)

    def explain(self, obj) -> str:
        return (f"{self._what()} is {obj!r}, not a method of {self.value[0]!r} or of a function with its code, "
                "defaults and closure values (the method the trace was made for)")


class _Type(ObjectSpec):
    """An object of the same exact type (any other object): methods and class attributes come from the type, and
    every attribute or item the trace read from it has its own check (numbers, strings, tensors) or guard."""

    __slots__ = ()
    kind = "type"

    def matches(self, obj) -> bool:
        return type(obj) is self.typ

    def expression(self, v: str, const) -> str:
        return f"(type({v}) is {const(self.typ)})"

    def explain(self, obj) -> str:
        return self._wrong_type(obj) or f"{self._what()} is {obj!r}"


class _Compared(ObjectSpec):
    """An object of the same type that ``compare(obj, value)`` finds the same as ``value``."""

    __slots__ = ()
    compare = staticmethod(is_same_value)

    def matches(self, obj) -> bool:
        return type(obj) is self.typ and self.compare(obj, self.value)

    def expression(self, v: str, const) -> str:
        return self._typed(v, const, f"{const(self.compare)}({v}, {const(self.value)})")


class _Equal(_Compared):
    """An object of the same type equal (``==``) to a copy taken when traced (an object passed to a native call,
    which may read any of its state, when its type defines value equality)."""

    __slots__ = ()
    kind = "equal"
    compare = staticmethod(equal_to_snapshot)

    def expression(self, v: str, const) -> str:
        # `obj == snapshot` once per write to what it reads (guards.watched), not once per call
        return self._typed(v, const, f"{const(watched(StateCheck(self)))}({v})")

    def explain(self, obj) -> str:
        return self._wrong_type(obj) or f"{self._what()} is {obj!r}, not equal to {self.value!r} as when traced"


class _Same(_Compared):
    """A scalar (number, string, slice, device) read from a dict key object: the same value (:func:`is_same_value`)."""

    __slots__ = ()
    kind = "same"

    def explain(self, obj) -> str:
        return self._wrong_type(obj) or f"{self._what()} is {obj!r}, the trace was made for {self.value!r}"


class _State(ObjectSpec):
    """An object passed to a native call whose type has no value equality, or a list or tuple of such objects: the
    same object (when it is stored where it is read) whose instance state, read recursively through its attributes,
    slots and items (numbers and strings by value; tensors by type; modules, functions and classes by identity; other
    Python objects by their state), is what it was when traced (``value``: its ``state_snapshot``): C code can call
    the object's Python methods (``sum(objs, start)``, ``heapq``, ``range(obj)``) or read its ``__dict__``
    (``copy.copy``) natively, out of the trace's sight."""

    __slots__ = ()
    kind = "state"

    def matches(self, obj) -> bool:
        return type(obj) is self.typ and same_state(obj, self.value)

    def expression(self, v: str, const) -> str:
        return self._typed(v, const, f"{const(watched(StateCheck(self)))}({v})")  # once per write (guards.watched)

    def explain(self, obj) -> str:
        return self._wrong_type(obj) or (f"{self._what()} changed since the trace was made: "
                                         f"{state_difference(obj, self.value, self.where or 'it')}")


class _Length(ObjectSpec):
    """A list or tuple of the same exact type and length: each item the trace read has its own check, but a loop over
    the container ran as many times as it had items (without this a longer list ran the shorter list's trace: a
    silently wrong result). ``value``: the length, or the container (:class:`Pending`) until the prologue is made
    (after tracing: traced code may have changed it, ``lst.append(...)``)."""

    __slots__ = ()
    kind = "length"

    def _expected(self):
        if type(self.value) is Pending:
            self.value = self._of(self.value.obj)
        return self.value

    @staticmethod
    def _of(obj):
        return len(obj)

    def matches(self, obj) -> bool:
        expected = self._expected()
        return type(obj) is self.typ and self._of(obj) == expected

    def expression(self, v: str, const) -> str:
        return self._typed(v, const, f"len({v}) == {self._expected()!r}")

    def explain(self, obj) -> str:
        return self._wrong_type(obj) or f"{self._what()} has {len(obj)} items, the trace was made for {self._expected()}"


class _Keys(_Length):
    """A dict of the same exact type with the same keys in the same order (a set: the same items in iteration order,
    which a loop over it follows)."""

    __slots__ = ()
    kind = "keys"

    @staticmethod
    def _of(obj):
        return tuple(obj)

    def expression(self, v: str, const) -> str:
        return self._typed(v, const, f"tuple({v}) == {const(self._expected())}")

    def explain(self, obj) -> str:
        items = "items in the order" if self.typ in (set, frozenset) else "keys"
        return self._wrong_type(obj) or \
            f"{self._what()} has the {items} {tuple(obj)!r}, the trace was made for {self._expected()!r}"


check_object = register_check("check_object", ("obj", "spec"))


class FunctionCheck(StateCheck):
    """A ``"function"`` or ``"method"`` spec's check in the fused prologue. Stored on disk (``disk_state``): the
    compiled function itself as such (the entry's key holds its code and closure values; loaded, the check is made
    from the function being compiled then), another function by its importable name (the code compared is that
    function's code when the entry is loaded: the key holds the hash of its module's file; defaults and closure values
    are the traced ones)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<{self.spec.kind} check of the {self.spec.where or 'object'}>"

    def disk_state(self) -> tuple:
        fn, _code, defaults, kwdefaults, cells = self.spec.value
        if self.spec.kind == "function" and self.spec.where == INPUT_FN_WHERE:
            return self.spec.kind, self.spec.where, _COMPILED_FUNCTION
        return self.spec.kind, self.spec.where, fn, defaults, kwdefaults, cells

    @classmethod
    def from_disk_state(cls, state: tuple) -> "FunctionCheck":
        if state[2] == _COMPILED_FUNCTION:
            kind, where, _ = state
            fn = _thunder_internals.current_compile_data()[0].fn
            return cls(ObjectSpec(kind, types.FunctionType, function_snapshot(fn), where))
        kind, where, fn, defaults, kwdefaults, cells = state
        typ = types.MethodType if kind == "method" else types.FunctionType
        return cls(ObjectSpec(kind, typ, (fn, fn.__code__, defaults, kwdefaults, cells), where))


_COMPILED_FUNCTION = "the compiled function"  # (a stored FunctionCheck of it)

INPUT_FN_WHERE = "the compiled callable"  # what describe_provenance says of thunder's INPUT_FN


def describe_provenance(record) -> str:
    """``args[1].cfg``-like text for a provenance record (for guard failure messages)."""
    import dis

    inst = record.inst.opname if isinstance(record.inst, dis.Instruction) else getattr(record.inst, "name", "")
    if inst == "INPUT_ARGS":
        return "args"
    if inst == "INPUT_KWARGS":
        return "kwargs"
    if inst == "INPUT_FN":
        return INPUT_FN_WHERE
    if inst in ("LOAD_ATTR", "BINARY_SUBSCR") and len(record.inputs) == 2:
        base, key = record.inputs
        k = getattr(key, "value", "?")
        base_text = describe_provenance(base)
        if inst == "LOAD_ATTR":
            return f"{base_text}.{k}" if base_text != INPUT_FN_WHERE else f"module attribute {k}"
        return f"{base_text}[{k!r}]"
    return "input"


guarded_object_names = itertools.count()


class AttributeAbsent(Guard):
    """An attribute traced code looked for and did not find (``check_attribute_absent(obj, name)``)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def matches(self, obj) -> bool:
        return not hasattr(obj, self.name)

    def expression(self, v: str, const) -> str:
        return f"(not hasattr({v}, {const(self.name)}))"

    def explain(self, obj) -> str:
        return f"the attribute {self.name!r} that the trace found missing on a {type(obj).__name__} is there now"


check_attribute_absent = register_check("check_attribute_absent", ("obj", "name"), AttributeAbsent)


class TorchStateQuery:
    """A getter of torch's global state that traced code called, with its plain arguments (see
    ``guards.object_reads.guard_torch_state_query``); the value ``check_torch_state`` checks."""

    __slots__ = ("fn", "args")

    def __init__(self, fn, args: tuple):
        self.fn, self.args = fn, args

    def __repr__(self) -> str:
        module = "torch" if self.fn.__module__ == "torch" else "torch._C"
        return f"{module}.{self.fn.__name__}({', '.join(map(repr, self.args))})"

    def disk_state(self) -> tuple:  # thunder_subclass.runtime.disk_cache: the getter by its module and name
        return self.fn.__module__, self.fn.__name__, self.args

    @classmethod
    def from_disk_state(cls, state: tuple) -> "TorchStateQuery":
        import importlib

        module, name, args = state
        fn = getattr(importlib.import_module(module), name)
        if not _thunder_internals.is_torch_state_query(fn, args):
            raise LookupError(f"{module}.{name} is not a getter of torch's state here")
        return cls(fn, args)


class TorchStateAnswer(Guard):
    """What a :class:`TorchStateQuery` answered when traced (``check_torch_state(query, expected)``)."""

    __slots__ = ("expected",)

    def __init__(self, expected):
        self.expected = expected

    def matches(self, query: TorchStateQuery) -> bool:
        return is_same_value(query.fn(*query.args), self.expected)

    def explain(self, query: TorchStateQuery) -> str:
        return f"{query!r} is {query.fn(*query.args)!r}, the trace was made for {self.expected!r}"


check_torch_state = register_check("check_torch_state", ("query", "expected"), TorchStateAnswer)


class ConstantPath:
    """Where a value traced code read from a dict key object sits: the key object (which the prologue holds, as thunder
    wraps dict keys as constants) and the attribute reads and subscripts from it (``(".", name)`` / ``("[]", index)``
    steps, see :func:`thunder_subclass._thunder_internals.constant_rooted_path`)."""

    __slots__ = ("root", "path")

    def __init__(self, root, path: tuple):
        self.root, self.path = root, path

    def follow(self):
        obj = self.root
        for kind, name in self.path:
            obj = getattr(obj, name) if kind == "." else obj[name]
        return obj

    def __repr__(self) -> str:
        root = f"<dict key {type(self.root).__qualname__}>"
        path = self.path
        if isinstance(self.root, _thunder_internals.SetItems) and path and path[0][0] == "[]":
            root, path = f"<item {path[0][1]} of a set>", path[1:]
        return root + "".join(f".{name}" if kind == "." else f"[{name!r}]" for kind, name in path)


class ObjectAtPath(Guard):
    """An :class:`ObjectSpec` of the object at a :class:`ConstantPath` (``check_constant_path(where, spec)``)."""

    __slots__ = ("spec",)

    def __init__(self, spec: ObjectSpec):
        self.spec = spec

    def matches(self, where: ConstantPath) -> bool:
        try:
            obj = where.follow()
        except Exception:  # noqa: BLE001 - the attribute or item is gone: not the object the trace was made for
            return False
        return self.spec.matches(obj)

    def explain(self, where: ConstantPath) -> str:
        try:
            obj = where.follow()
        except Exception as error:  # noqa: BLE001 - see matches
            return f"{self.spec.where} could not be read ({type(error).__name__}: {error})"
        return self.spec.explain(obj)


check_constant_path = register_check("check_constant_path", ("where", "spec"), ObjectAtPath)
