"""The relations between input sizes that a trace relies on under ``cache="symbolic values"``, as prologue checks
(``check_number_condition``): :class:`SizeCondition` for the guards and symbol ranges of a trace's fake runs
(``symbolic_values.add_size_guards``), :class:`AssumedSizes` for those its backward finds after the prologue is made.
The conditions are sympy expressions over the names of input size numbers, printed by torch's ``PythonPrinter``;
:func:`condition_check_symbol` is the prologue symbol that evaluates them (an operator of the plugin's executor).
"""

from __future__ import annotations

import functools
import math
from typing import Any

from thunder_subclass._thunder_internals import plugin_state


@functools.cache
def condition_check_symbol():
    from thunder.core.prims import OpTags

    def check_condition(condition, *values):
        if not condition(*values):
            raise RuntimeError(f"{condition} does not hold")

    sym = plugin_state.handlers.executor.register_operator(
        "check_number_condition", meta=lambda condition, *values: None, fn=check_condition, tags=[OpTags.DONT_DCE]
    )
    plugin_state.remember_symbol_origin(sym, check_condition, condition_check_symbol)
    return sym


class SizeCondition:
    """Relations between input sizes that a trace relies on (the guards and symbol ranges of its fake runs' ShapeEnv),
    re-evaluated by a prologue check (``check_number_condition``) on each call's numbers: ``self(*values)`` is True
    when they hold."""

    def __init__(self, symbols: list, exprs: list):
        self.exprs = list(exprs)
        self._symbols = symbols
        self._compile()

    def _compile(self) -> None:
        import sympy

        symbols, exprs = self._symbols, self.exprs
        names = [f"_v{i}" for i in range(len(symbols))]
        renamed = [e.xreplace({s: sympy.Symbol(n, integer=True) for s, n in zip(symbols, names)}) for e in exprs]
        self._fn = None
        try:
            from torch.utils._sympy.printers import PythonPrinter

            printer = PythonPrinter()
            body = " and ".join(f"({printer.doprint(e)})" for e in renamed) or "True"
            self._fn = eval(f"lambda {', '.join(names)}: bool({body})", {"math": math})  # noqa: S307
        except Exception:  # noqa: BLE001 - an expression Python cannot print: evaluated with sympy
            self._fn = None

    def __call__(self, *values) -> bool:
        if self._fn is not None:
            try:
                return self._fn(*values)
            except Exception:  # noqa: BLE001 - printed code Python cannot run: evaluated with sympy from now on
                self._fn = None
        import sympy

        subs = {s: sympy.Integer(v) for s, v in zip(self._symbols, values)}
        return all(bool(e.xreplace(subs)) for e in self.exprs)

    def __repr__(self):
        return f"<sizes {' and '.join(str(e) for e in self.exprs)}>"


class AssumedSizes(SizeCondition):
    """The relations between input sizes that a trace's backward relies on, found after the prologue is made
    (autodiff's fake runs of a ``view`` backward rely on ``(i0*i1)//2 * 2 == i0*i1``, which no forward run asked
    about). One per trace, in its prologue from the start (``check_number_condition`` over every input size number
    the forward's symbolic fake runs used, holding nothing yet); a backward's relation that holds for the traced sizes
    is added to it (:meth:`assume`), and later calls of the trace check it with the others: a call for which it
    does not hold is a cache miss and a new trace, as for the forward's guards."""

    def __init__(self):
        super().__init__([], [])
        self.proxies: dict[str, Any] = {}  # input number name -> proxy, in the order of the check's arguments

    def cover(self, proxies) -> tuple | None:
        """Take input numbers ``proxies`` as arguments too; the new constraint tuple when the set grew."""
        import sympy

        grew = False
        for p in proxies:
            if p.name not in self.proxies:
                self.proxies[p.name] = p
                grew = True
        if not grew:
            return None
        self._symbols = [sympy.Symbol(n, integer=True) for n in self.proxies]
        self._compile()
        return (condition_check_symbol(), self, *self.proxies.values())

    def assume(self, exprs: list) -> bool:
        """Add ``exprs`` (over the argument names) when they name only arguments and hold for their traced values."""
        import sympy

        names = {s.name for e in exprs for s in e.free_symbols}
        if not names <= set(self.proxies):
            return False
        values = {sympy.Symbol(n, integer=True): sympy.Integer(int(self.proxies[n].value)) for n in names}
        if not all(e.xreplace(values) is sympy.true for e in exprs):
            return False
        self.exprs.extend(exprs)
        self._compile()
        return True
