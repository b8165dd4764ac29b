"""The guard protocol: what every prologue check of the plugin is, and the one way a check symbol is registered.

In: a guard kind, one small class that follows :class:`Guard` (``matches``, ``expression``, ``explain``,
``disk_state``). What happens: :func:`register_check` registers the prologue symbol that runs it
(``check_<kind>(value, *arguments)``, kept by dead-code elimination) and records how the symbol's arguments make the
guard (:func:`guard_of`). Out: the symbol, which the stages add as jit constraints; ``thunder_subclass.guards.prologue``
asks each bound check for its guard and the guard for its inline expression, the disk cache asks a guard for its
state, and a failing check raises :class:`SubclassGuardFailure` (a cache miss) whose message is the guard's
``explain``, built only when read.
"""

from __future__ import annotations

import inspect

from typing import Any, Callable

import thunder.core.prims as prims

from thunder_subclass.executor import subclass_executor

__all__ = ["Guard", "SubclassGuardFailure", "MISSING", "is_same_value", "register_check", "register_epilogue_op",
           "guard_of", "check_function"]


class SubclassGuardFailure(Exception):
    """Raised by a prologue guard: thunder catches it and treats the call as a cache miss.

    The message may be given as a function (``explain``), called the first time the message is read: a call that
    misses every cache entry but one (or all) raises one of these per rejecting entry, and nothing reads them unless
    the user asks why it missed (``thunder_subclass.explain_recompiles``), so a hit costs no message building."""

    def __init__(self, message: str | None = None, *, explain=None, int_changed=None):
        super().__init__(message)
        self._explain = explain
        self._int_changed = int_changed

    def is_int_value_change(self) -> bool:
        """Whether the failing check compares an int read while tracing with the value it had then (automatic dynamic
        shapes treats such a miss as it treats a change of sizes)."""
        return self._int_changed is not None and bool(self._int_changed())

    def __str__(self) -> str:
        if self._explain is not None:
            explain, self._explain = self._explain, None
            self.args = (explain(),)
        return super().__str__()


class Guard:
    """What one prologue check holds about a value, as the trace depends on it. A guard kind subclasses this (or
    follows it) and defines:

    * ``matches(value)``: whether the call's ``value`` is one the trace holds for (run on every call of an unfused
      prologue: no message is built);
    * ``expression(value_name, const)``: the same test as an inline Python expression over the value named
      ``value_name``, for the fused prologue checks (``thunder_subclass.guards.prologue``); ``const(obj)`` names a
      constant. The builder's ``const`` also offers ``const.fresh()`` (a new local name), ``const.tensor(...)`` (a
      tensor metadata check the builder runs after the others, see :meth:`SubclassSpec.expression`), ``const.strides(x,
      strides)`` and ``const.once(key)`` (True the first time a key is asked in one prologue). A tuple of expressions
      stands for separate conditions; None: not fusible (the check stays a call of its own);
    * ``explain(value)``: why ``value`` fails it, in words (only when a miss is explained);
    * ``disk_state()``: how the on-disk cache stores it (a value of plain types, rebuilt by the class's
      ``from_disk_state``), or ``NotImplemented``: stored as any other value (a pickled copy where the type has value
      equality, else not stored).
    """

    __slots__ = ()

    def matches(self, value) -> bool:
        raise NotImplementedError

    def expression(self, value_name: str, const) -> str | tuple | None:
        return None

    def explain(self, value) -> str:
        return f"{value!r} does not match {self!r}"

    def disk_state(self) -> Any:
        return NotImplemented


def is_same_value(a: Any, b: Any) -> bool:
    """Whether instance attribute values ``a`` and ``b`` are interchangeable for a trace: the same object, or equal
    values of the same type (objects that cannot be compared are the same only when identical)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except Exception:
        return False


MISSING = object()  # an attribute that is not there (``getattr(x, name, MISSING)``)

_GUARD_OF: dict[int, Callable[..., Guard]] = {}  # check symbol id -> how its arguments after the value make its guard
_CHECK_FN: dict[int, Callable] = {}  # check symbol id -> the function it runs


def _meta_with(params: tuple[str, ...]):
    """A meta function (no output) with the parameters ``params`` (thunder binds a symbol's arguments by its meta's
    signature; a name starting with ``*`` is a var-positional one)."""

    def meta(*args, **kwargs):
        return None

    meta.__signature__ = inspect.Signature([
        inspect.Parameter(p.lstrip("*"), inspect.Parameter.VAR_POSITIONAL if p.startswith("*")
                          else inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params])
    return meta


def register_epilogue_op(name: str, params: tuple[str, ...], fn: Callable):
    """A plugin operator with no output that dead-code elimination keeps (a prologue check, an epilogue write-back):
    ``fn(*args)`` runs it."""
    return subclass_executor.register_operator(name, meta=_meta_with(params), fn=fn, tags=[prims.OpTags.DONT_DCE])


def _the_guard(guard: Guard) -> Guard:
    return guard


class CheckFunctions:
    """What each check symbol of :func:`register_check` runs, by the symbol's name."""


def register_check(name: str, params: tuple[str, ...] = ("value", "guard"), guard: Callable[..., Guard] = _the_guard):
    """The prologue check symbol ``name(value, *arguments)`` (parameter names ``params``): ``guard(*arguments)`` is
    its :class:`Guard` (by default the one argument after the value is the guard itself); the check raises
    :class:`SubclassGuardFailure` with the guard's explanation when ``guard.matches(value)`` is False."""

    def check(value, *args) -> None:
        g = guard(*args)
        if not g.matches(value):
            raise SubclassGuardFailure(explain=lambda: g.explain(value))

    # named where the disk cache can find it again: CheckFunctions.<name> of this module
    check.__name__, check.__qualname__, check.__module__ = name, f"CheckFunctions.{name}", __name__
    setattr(CheckFunctions, name, check)
    sym = register_epilogue_op(name, params, check)
    _GUARD_OF[sym.id] = guard
    _CHECK_FN[sym.id] = check
    return sym


def check_function(sym) -> Callable:
    """What check symbol ``sym`` runs: ``fn(value, *arguments)``, raising :class:`SubclassGuardFailure`."""
    return _CHECK_FN[sym.id]


def guard_of(bsym) -> Guard | None:
    """The guard a bound check symbol runs (None for a symbol not registered by :func:`register_check`)."""
    make = _GUARD_OF.get(bsym.sym.id)
    return None if make is None else make(*bsym.args[1:])
