"""Reads of Python state that thunder 0.2.6's prologue cannot unpack, recognised from their provenance records.

thunder's interpreter gives every value it wraps a provenance record (``core/interpreter.py`` ``ProvenanceRecord``).
Values read from the inputs (arguments, the jitted callable and its globals) have records the prologue can unpack and
check (``thunder_state.is_unpackable_provenance``). Two other ways traced code reaches lasting Python state end in
records it cannot unpack, so thunder baked what was read into the trace as a constant, unchecked:

* ``type(obj).name`` for an input ``obj`` (the result of thunder's ``_type_lookaside``: an ``OPAQUE`` record),
  e.g. a class attribute read as ``type(self).scale``;
* ``import mod`` / ``from mod import name`` inside the traced function (an ``IMPORT_NAME`` / ``IMPORT_FROM``
  instruction record), then ``mod.name``.

:func:`state_path_of` names such a read as ``(anchor, steps)``: the anchor is ``("type", record)`` (the type of the
input with unpackable ``record``) or ``("import", module name)`` (``sys.modules[name]``), and ``steps`` the
attribute reads and constant subscripts from it, outermost last. Dunder attributes are the interpreter's own way to
methods and dicts, not reads of the program: a path through one is not named. Nothing is installed here; the
callbacks of :mod:`.tracing` ask this module.
"""

from __future__ import annotations

import dis
from typing import Any

_KEY = "_thunder_subclass_state_path"
_NONE = ()  # cached "no path" (a record's instruction and inputs never change once made)


def state_path_of(record) -> tuple[tuple, tuple] | None:
    """``(anchor, steps)`` for a value read by ``record`` from lasting Python state out of the prologue's reach (see
    the module docstring), else None. Steps are ``(".", name)`` and ``("[]", key)``."""
    d = getattr(record, "__dict__", None)
    if d is None:
        return None
    found = d.get(_KEY)
    if found is None:
        found = _walk(record) or _NONE
        d[_KEY] = found
    return found or None


def _opname(record) -> str | None:
    inst = record.inst
    return inst.opname if isinstance(inst, dis.Instruction) else getattr(inst, "name", None)


def _walk(record):
    from thunder.core.interpreter import PseudoInst

    from thunder_subclass._thunder_internals.thunder_state import is_unpackable_provenance

    steps: list[tuple[str, Any]] = []
    while True:
        op = _opname(record)
        if op in ("LOAD_ATTR", "BINARY_SUBSCR") and len(record.inputs) == 2:
            key = record.inputs[1]
            if getattr(key, "inst", None) is not PseudoInst.CONSTANT:
                return None
            if op == "LOAD_ATTR":
                if not isinstance(key.value, str) or (key.value.startswith("__") and key.value.endswith("__")):
                    return None
                steps.append((".", key.value))
            else:
                if type(key.value) not in (int, str):
                    return None
                steps.append(("[]", key.value))
            record = record.inputs[0]
        elif op == "IMPORT_FROM" and len(record.inputs) == 1:
            steps.append((".", record.inst.argval))
            record = record.inputs[0]
        elif op == "IMPORT_NAME":
            if not steps:
                return None  # the module itself: what is read from it is named by the reads
            level = getattr(record.inputs[1], "value", None) if len(record.inputs) == 2 else None
            fromlist = getattr(record.inputs[0], "value", None) if len(record.inputs) == 2 else None
            name = record.inst.argval
            if level != 0 or not isinstance(name, str):
                return None  # a relative import: resolved against the importing package (not named here)
            if not fromlist:
                name = name.partition(".")[0]  # `import a.b` binds the top package `a`
            return ("import", name), tuple(reversed(steps))
        elif op == "OPAQUE" and len(record.inputs) == 3:
            fn, args = record.inputs[0], record.inputs[1]
            if not steps or not _is_type_lookaside(getattr(fn, "value", None)) or _opname(args) != "BUILD_TUPLE" \
                    or len(args.inputs) != 1 or not is_unpackable_provenance(args.inputs[0]):
                return None
            return ("type", args.inputs[0]), tuple(reversed(steps))
        else:
            return None


def _is_type_lookaside(fn) -> bool:
    # thunder's lookaside for type() (core/interpreter.py _type_lookaside): the module attribute is its
    # interpreter_needs_wrap wrapper, the record holds the function itself
    return getattr(fn, "__name__", None) == "_type_lookaside" and \
        getattr(fn, "__module__", None) == "thunder.core.interpreter"


def caller_module_name() -> str | None:
    """The ``__name__`` of the module whose interpreted code makes the call being looked aside (None when unknown)."""
    from thunder.core.interpreter import get_interpreterruntimectx

    try:
        frame = get_interpreterruntimectx().peek_frame_stack()
    except Exception:  # noqa: BLE001 - no interpreter running
        return None
    return None if frame is None else getattr(frame, "module", None)
