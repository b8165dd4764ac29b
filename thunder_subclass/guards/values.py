"""Values: how a guard records what an object was when traced, and compares the object of a later call with it.

In: an object the trace depends on (a Python function passed to traced code, an object passed to a native call).
What happens: a snapshot of it is taken (:func:`function_snapshot`: code, defaults and closure values;
:func:`state_snapshot`: its instance state, recursively; :func:`value_snapshot`: an equal copy). Out: the snapshots
the object guards (``guards.objects``) hold, and the comparisons they run every call (:func:`same_function`,
:func:`same_state`, :func:`equal_to_snapshot`) or when a miss is explained (:func:`state_difference`).
"""

from __future__ import annotations

import enum
import types

import torch

from thunder_subclass.guards.protocol import is_same_value

__all__ = ["STATE_LIMIT", "SCALARS", "HEAPTYPE", "function_snapshot", "same_function", "equal_to_snapshot",
           "is_plain_instance", "state_snapshot", "same_state", "state_difference", "value_snapshot"]


def function_snapshot(fn: types.FunctionType) -> tuple:
    """``(fn, code, defaults, keyword defaults, closure values)``: what a Python function passed to traced code is, for
    the trace (the interpreter inlines its body): another function object with all of these the same behaves alike
    (a lambda made anew for each call)."""
    cells = tuple(c.cell_contents for c in fn.__closure__ or ())
    defaults = fn.__defaults__
    if defaults and any(_is_mutable_default(d) for d in defaults):
        defaults = tuple(_MutableDefault.of(d) if _is_mutable_default(d) else d for d in defaults)
    return fn, fn.__code__, defaults, fn.__kwdefaults__, cells


def _is_mutable_default(v) -> bool:
    return type(v) in (list, dict, set) or is_plain_instance(v)


class _MutableDefault:
    """A default value that can change in place (``def f(x, opts={})``, changed between calls): the same object, with
    the state it had when traced (:func:`state_snapshot`; by identity alone past its size limit)."""

    __slots__ = ("obj", "state")

    def __init__(self, obj, state):
        self.obj, self.state = obj, state

    @classmethod
    def of(cls, obj) -> "_MutableDefault":
        return cls(obj, state_snapshot(obj))

    def holds(self, v) -> bool:
        return v is self.obj and (self.state is None or same_state(v, self.state))


def same_function(obj, snapshot: tuple) -> bool:
    # (the function itself too: its __code__, __defaults__ or closure cells may have been replaced since)
    fn, code, defaults, kwdefaults, cells = snapshot
    if type(obj) is not types.FunctionType or obj.__code__ is not code:
        return False
    if not _same_values(obj.__defaults__ or (), defaults or ()) or obj.__kwdefaults__ != kwdefaults:
        return False
    closure = obj.__closure__ or ()
    try:
        return len(closure) == len(cells) and _same_values(tuple(c.cell_contents for c in closure), cells)
    except ValueError:  # an empty cell
        return False


def _same_values(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(
        y.holds(x) if type(y) is _MutableDefault else x is y or (type(x) in SCALARS and is_same_value(x, y))
        for x, y in zip(a, b))


SCALARS = frozenset({int, float, bool, complex, str, bytes, type(None)})


def equal_to_snapshot(obj, snapshot) -> bool:
    try:
        return bool(obj == snapshot)
    except Exception:  # noqa: BLE001 - a value that cannot be compared is not the one traced
        return False




STATE_LIMIT = 256  # the most values a state snapshot holds; a bigger object keeps the identity guard
HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement


def is_plain_instance(obj) -> bool:
    """Whether ``obj``'s state is all in its ``__dict__`` and slots: every class of its type is a Python class (or
    ``object``, or ``types.SimpleNamespace``), and it is none of the objects compared by identity (tensors, modules,
    functions, classes)."""
    if isinstance(obj, (torch.Tensor, torch.nn.Module, type, types.FunctionType, types.ModuleType, enum.Enum)):
        return False
    return all(c is object or c is types.SimpleNamespace or c.__flags__ & HEAPTYPE for c in type(obj).__mro__)


def _slot_names(cls: type) -> tuple:
    names = []
    for c in cls.__mro__:
        slots = c.__dict__.get("__slots__", ())
        names += [slots] if isinstance(slots, str) else [n for n in slots if n not in ("__dict__", "__weakref__")]
    return tuple(names)


class _TooBig(Exception):
    pass


_NO_SLOT = object()


def state_snapshot(obj, identity: bool = True):
    """A record of ``obj``'s state for :func:`same_state`, or None when it holds more than ``STATE_LIMIT`` values:
    numbers, strings and ``None`` by value; lists, tuples, dicts, sets by their items (in order); instances of Python
    classes (:func:`is_plain_instance`) by their attributes and slots, and ``obj`` itself also by identity with
    ``identity``; tensors by type only (those the trace reads have guards of their own; a cache's tensors are new
    every call); anything else (modules, functions, classes, C objects) by identity."""
    count = [0]
    active: set = set()

    def snap(v, top=False):
        count[0] += 1
        if count[0] > STATE_LIMIT:
            raise _TooBig
        t = type(v)
        if t in SCALARS:
            return ("v", t, v)
        if isinstance(v, torch.Tensor):  # the tensors the trace reads have their own guards; values change per call
            return ("t", t)
        if id(v) in active:  # a cycle: the object itself
            return ("i", v)
        if t in (list, tuple, set, frozenset, dict) or is_plain_instance(v):
            active.add(id(v))
            try:
                if t is dict:
                    return ("d", t, tuple((snap(k), snap(i)) for k, i in v.items()))
                if t in (list, tuple, set, frozenset):
                    return ("c", t, tuple(snap(i) for i in v))
                fields = tuple((name, snap(val)) for name, val in getattr(v, "__dict__", {}).items())
                slots = tuple((name, snap(getattr(v, name, _NO_SLOT))) for name in _slot_names(t))
                return ("o", t, v if identity and top else None, fields, slots)
            finally:
                active.discard(id(v))
        return ("i", v)

    try:
        return snap(obj, top=True)
    except _TooBig:
        return None


def same_state(v, s) -> bool:
    """Whether ``v`` has the state recorded by :func:`state_snapshot` (see there). Run by the prologue on every call:
    no message, nor the paths of the values it compares, is built."""
    return state_difference(v, s, None) is None


def state_difference(v, s, path: str | None) -> str | None:
    """None when ``v`` has the state recorded in ``s``, else what differs first (``it.cfg.n is 3, the trace was made
    for 2``), ``path`` naming ``v`` (None: the paths of nested values are not built, for :func:`same_state`)."""
    kind, t = s[0], s[1]
    if kind == "i":
        return None if v is t else f"{path} is another object"
    if kind == "t":
        if type(v) is t:
            return None
        return f"{path} is a {type(v).__qualname__}, the trace was made for a {t.__qualname__}"
    if type(v) is not t:
        return f"{path} is a {type(v).__qualname__}, the trace was made for a {t.__qualname__}"
    if kind == "v":
        return None if is_same_value(v, s[2]) else f"{path} is {v!r}, the trace was made for {s[2]!r}"
    if kind == "c":
        items = tuple(v)
        if len(items) != len(s[2]):
            return f"{path} has {len(items)} items, the trace was made for {len(s[2])}"
        for i, (item, snap) in enumerate(zip(items, s[2])):
            why = state_difference(item, snap, None if path is None else f"{path}[{i}]")
            if why is not None:
                return why
        return None
    if kind == "d":
        if len(v) != len(s[2]):
            return f"{path} has {len(v)} items, the trace was made for {len(s[2])}"
        for (key, value), (key_snap, value_snap) in zip(v.items(), s[2]):
            why = state_difference(key, key_snap, None if path is None else f"{path} key") or state_difference(
                value, value_snap, None if path is None else f"{path}[{key!r}]")
            if why is not None:
                return why
        return None
    if s[2] is not None and v is not s[2]:
        return f"{path} is another object"
    fields = getattr(v, "__dict__", {})
    if len(fields) != len(s[3]):
        return f"{path} has the attributes {tuple(fields)}, the trace was made for {tuple(n for n, _ in s[3])}"
    for name, snap in s[3]:
        if name not in fields:
            return f"{path} has no attribute {name}"
        why = state_difference(fields[name], snap, None if path is None else f"{path}.{name}")
        if why is not None:
            return why
    for name, snap in s[4]:
        why = state_difference(getattr(v, name, _NO_SLOT), snap, None if path is None else f"{path}.{name}")
        if why is not None:
            return why
    return None


def value_snapshot(obj):
    """A copy of ``obj`` equal to it, or None when its type has no value equality (``object.__eq__``) or no such copy
    can be made."""
    import copy

    if type(obj).__eq__ is object.__eq__:
        return None
    try:
        snapshot = copy.deepcopy(obj)
        return snapshot if snapshot is not obj and equal_to_snapshot(obj, snapshot) else None
    except Exception:  # noqa: BLE001 - not copyable: guarded by identity instead
        return None
