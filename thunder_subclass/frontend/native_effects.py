"""Stage 4 (interpretation), native calls that change Python objects the trace did not make: graph breaks.

In: a call that thunder's interpreter would run natively (a C function, method or slot: it cannot look inside)
whose argument is an object read from outside the traced code (an argument, a global, an attribute of the module,
a class attribute, a module imported in the body) and that the call would change. What happens: the call is
recognised (below) before it runs. Out: an
:class:`~thunder_subclass.errors.UnsupportedGlobalStateError` raised in the traced program before the call runs: a
graph break (the code around it runs eagerly, with eager's values on every call), raised with ``fullgraph=True``.

Why: the native call runs once, while tracing; the compiled program holds its result as a constant and never runs it
again. Eager changes the object on every call: ``next(self._counter)`` on an ``itertools.count()`` (a property that
numbers the calls) gave the first call's number forever, or, read through a property the prologue unpacks again, a
``TraceSelfCheckError`` on the first call; ``next`` on a global iterator or generator, ``deque.popleft()``,
``set.add`` on a set held outside gave the first call's answer on every call and changed the object only once.

Which native calls change an object (each decided before the call, from the callable and its arguments):

* advancing an iterator: an object whose type has ``__next__`` (iterators, generators, ``itertools`` objects, files)
  given to a native function, or as the receiver of a method, other than those that only look at it (``iter``,
  ``isinstance``, ``type``, ``id``, ``getattr``/``hasattr``, ``repr``, ``hash``, and its own ``__iter__``,
  ``__length_hint__``, ``__reduce__``...): ``next(it)``, ``it.__next__()``, ``gen.send(v)``, and natives that consume
  it (``sum(it)``, ``list(it)``, ``tuple(it)``); given to another object's method, only those that iterate it
  (``lst.extend(it)``, ``s.update(it)``; ``lst.append(it)`` stores it);
* a method that changes its receiver (``add``, ``discard``, ``pop``, ``popleft``, ``append``, ``extend``,
  ``update``, ``setdefault``, ``clear``, ``rotate``, ``sort``, ``__setitem__``, ``__ior__``, ``write``, ``seek``...,
  :data:`CHANGING_METHODS`) called natively on an object of another type than ``list`` and ``dict`` (``set``,
  ``deque``, ``bytearray``, ``array``, ``OrderedDict``, a C extension's object). thunder's interpreter runs the
  methods of plain lists and dicts as Python of its own (``MutSequenceWrapperMethods``): their changes are in the
  trace, and the plugin writes them back (``guards.write_back_input_containers``);
* the standard library's functions that change the list they are given first (``heapq.heappush`` / ``heappop`` /
  ``heapify`` / ``heapreplace`` / ``heappushpop``, ``bisect.insort``), on any list: thunder runs them natively;
* ``d[key]`` of a missing key on a mapping whose type has ``__missing__`` (``collections.defaultdict`` inserts it).

Assumptions: an object the trace made itself (its provenance record does not reach the inputs) may be changed
freely: it is made anew by every run of the compiled program. The check reads the provenance records thunder's
interpreter keeps (``_thunder_internals.is_unpackable_provenance``, ``constant_rooted_path``, ``state_path_of``).
Not covered: a native function that changes an object it is given without being one of these (a C extension's
``mylib.bump(obj)``): it cannot be known from outside the C code. A log record a handler writes to its stream
(``logging``) is a break too: it is written on every call, as in eager (it failed with an ``UnsupportedTracingError``
about ``sys.modules`` before).

Owner of state: none.
"""

from __future__ import annotations

import bisect
import heapq
import os
import types
from collections.abc import Callable
from typing import Any

import torch

from thunder_subclass import _thunder_internals
from thunder_subclass.errors import UnsupportedGlobalStateError, format_location

__all__ = ["CHANGING_METHODS", "lookaside"]

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep

_NATIVE = (types.BuiltinFunctionType, types.BuiltinMethodType, types.MethodDescriptorType, types.MethodWrapperType,
           types.WrapperDescriptorType, types.ClassMethodDescriptorType)

# names of the methods that change their receiver, on Python's and the standard library's C types (set, frozenset's
# in-place operators, collections.deque, bytearray, array.array, OrderedDict, io objects, hashlib objects)
CHANGING_METHODS = frozenset({
    "add", "discard", "remove", "pop", "popitem", "popleft", "clear", "update", "intersection_update",
    "difference_update", "symmetric_difference_update", "append", "appendleft", "extend", "extendleft", "insert",
    "rotate", "reverse", "sort", "setdefault", "move_to_end", "byteswap", "frombytes", "fromlist", "fromunicode",
    "fromfile", "__setitem__", "__delitem__", "__iadd__", "__isub__", "__imul__", "__ior__", "__iand__", "__ixor__",
    "__setstate__", "__next__", "send", "throw", "close",
    "write", "writelines", "read", "readline", "readlines", "read1", "readinto", "seek", "truncate",
})

# functions of the standard library that change the list they are given first (plain lists included: thunder runs
# them natively, so the change is not in the trace)
_CHANGES_FIRST_ARGUMENT = frozenset({heapq.heappush, heapq.heappop, heapq.heapify, heapq.heapreplace,
                                     heapq.heappushpop, bisect.insort_left, bisect.insort_right})

# natives that only look at an iterator given to them: its type, identity, attributes, its own iterator (itself)
_LOOKING_AT = frozenset({
    "iter", "isinstance", "issubclass", "type", "id", "getattr", "hasattr", "callable", "repr", "hash", "__get__",
    "__iter__", "__length_hint__", "__reduce__", "__reduce_ex__", "__sizeof__", "__repr__", "__hash__", "__eq__",
    "__ne__", "__getattribute__", "__format__", "__dir__", "__init_subclass__", "__subclasshook__",
})


# methods that iterate an argument other than their receiver (``lst.extend(it)``); other methods given an iterator
# store or compare it (``lst.append(it)``, ``it in lst``)
_ITERATING = frozenset({
    "extend", "extendleft", "update", "__init__", "__new__", "join", "fromkeys", "writelines", "__iadd__", "__ior__",
    "__iand__", "__isub__", "__ixor__", "union", "intersection", "difference", "symmetric_difference", "issubset",
    "issuperset", "isdisjoint", "intersection_update", "difference_update", "symmetric_difference_update",
})


def _is_method(fn) -> bool:
    return isinstance(fn, (types.MethodDescriptorType, types.WrapperDescriptorType))


def _is_outside(wrapped) -> bool:
    """Whether traced code reached the object ``wrapped`` holds from outside the traced code (see the module
    docstring), by its provenance record."""
    record = getattr(wrapped, "provenance", None)
    if record is None:
        return False
    return (_thunder_internals.is_unpackable_provenance(record)
            or _thunder_internals.constant_rooted_path(record) is not None
            or _thunder_internals.state_path_of(record) is not None)


def _is_iterator(value: Any) -> bool:
    return hasattr(type(value), "__next__") and not isinstance(value, (torch.Tensor, type))


def _change(fn, wrapped_args: tuple) -> tuple[str, Any] | None:
    """``(what the call does, the object it changes)`` for a native call of ``fn`` that changes an object from
    outside the trace, else None."""
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str):
        return None
    for i, wrapped in enumerate(wrapped_args):
        value = getattr(wrapped, "value", None)
        if value is None or isinstance(value, (torch.Tensor, types.ModuleType, type)) or not _is_outside(wrapped):
            continue
        if _is_iterator(value) and name not in _LOOKING_AT and (i == 0 or not _is_method(fn) or name in _ITERATING):
            if name in ("next", "__next__"):
                return "next()", value
            if isinstance(fn, (types.MethodDescriptorType, types.WrapperDescriptorType)):
                return f"{type(value).__name__}.{name}()", value
            return f"{name}() of an iterator", value
        if i == 0 and fn in _CHANGES_FIRST_ARGUMENT:
            return f"{fn.__module__}.{name}()", value
        if i == 0 and name == "__getitem__" and hasattr(type(value), "__missing__") and len(wrapped_args) == 2 \
                and _thunder_internals.is_hashable(key := getattr(wrapped_args[1], "value", None)) and key not in value:
            return f"{type(value).__name__}[{key!r}] (a missing key: __missing__ may insert it)", value
        if i == 0 and name in CHANGING_METHODS and type(value) not in (list, dict) \
                and isinstance(fn, (types.MethodDescriptorType, types.WrapperDescriptorType)) \
                and isinstance(value, fn.__objclass__):
            return f"{type(value).__name__}.{name}()", value
    return None


def lookaside(fn, wrapped_args: tuple) -> Callable | None:
    """A lookaside that raises :class:`UnsupportedGlobalStateError` for a native call that changes an object from
    outside the trace (see the module docstring), else None."""
    if not isinstance(fn, _NATIVE):
        return None
    try:
        found = _change(fn, wrapped_args)
    except Exception:  # noqa: BLE001 - an object whose type or attributes cannot be asked: not one of these
        return None
    if found is None:
        return None
    what, value = found

    def refuse(*args, **kwargs):
        # (the interpreter's frame, not the trace's last recorded line: that may be a torch module's code run before)
        where = format_location(*_thunder_internals.source_location(skip_files=(_TORCH_DIR,)))
        return _thunder_internals.raise_in_interpreter(UnsupportedGlobalStateError(
            f"{what} at {where} changes a {type(value).__name__} object that the compiled function reads from outside "
            f"(an argument, a global, an attribute): a compiled program would run it once, while tracing, and give "
            f"that call's answer every time. Make the object inside the compiled function, or do this outside it and "
            f"pass the result in."
        ))

    return refuse
