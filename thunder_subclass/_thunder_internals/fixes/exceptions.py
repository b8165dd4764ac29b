"""Interpreter fixes, exception lines: the line an exception was raised at, as CPython keeps it.

Part of the interpreter fixes (:mod:`~thunder_subclass._thunder_internals.fixes` dispatches to each part's
``lookasides()`` table and installs its ``hook_targets()``); each acts only while a plugin jit traces
(:func:`~.plugin_state.is_plugin_active`) and names what it works around:

* ``core/interpreter.py`` ``InterpreterCompileCtx.interpret`` — thunder adds an interpreted frame to an exception's
  traceback at the line the frame is at when the exception leaves it: after a ``with`` block's ``__exit__`` or a
  ``finally`` re-raised it, not the line that raised (CPython's). The line where an exception entered each frame is
  recorded (:func:`exception_source_lines`) and restored at ``RERAISE``; an exception raised while another is
  handled gets that one as ``__context__`` (thunder lost it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


from thunder_subclass._thunder_internals.plugin_state import is_plugin_active


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


def hook_targets() -> list[tuple[Any, str, Callable]]:
    import thunder.core.interpreter as interpreter

    return [(interpreter.InterpreterCompileCtx, "interpret", _hook_compilectx_interpret)]


def lookasides() -> dict:
    return {}
