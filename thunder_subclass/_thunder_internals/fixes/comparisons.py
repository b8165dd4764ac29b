"""Interpreter fixes, comparisons: identity and value comparisons reported (the trace depends on them), list
methods thunder lacks, CPython's rich-comparison order.

Part of the interpreter fixes (:mod:`~thunder_subclass._thunder_internals.fixes` dispatches to each part's
``lookasides()`` table and installs its ``hook_targets()``); each acts only while a plugin jit traces
(:func:`~.plugin_state.is_plugin_active`) and names what it works around:

* ``core/interpreter.py`` ``_default_opcode_handler_map["IS_OP"]`` / ``["COMPARE_OP"]`` — thunder compares the
  operands natively (``a is b``, ``a == b``), so nothing tells the trace that its branch depends on their identity or
  value: the operands go to ``Handlers.compared`` first (the plugin guards input objects among them; ``in`` is
  reported by :mod:`.interpreter_speed`'s ``CONTAINS_OP`` hook). Likewise the key of a dict lookup
  (``_default_provenance_tracking_lookaside_map[dict.__getitem__ / __contains__ / pop / __delitem__]``, thunder's
  ``MutMappingWrapperMethods``, which look it up natively), unless a str or int: ``TABLE.get(token, 3)`` reused the
  trace made for a missing key when the key was there.
* ``core/interpreter.py`` ``_default_provenance_tracking_lookaside_map[list.insert / clear / remove / sort / count,
  tuple.count]`` — list methods thunder lacks ("Sequence.insert, please file an issue"); comparisons interpreted.
"""

from __future__ import annotations

import functools
import operator
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

from thunder_subclass._thunder_internals import plugin_state
from thunder_subclass._thunder_internals.plugin_state import is_plugin_active
from thunder_subclass._thunder_internals.symbolic_values import pin_input_numbers


def report_comparison(op: str, a, b) -> None:
    """The interpreter is about to compare wrapped values ``a`` and ``b`` natively (``op``: ``"is"``, ``"=="``,
    ``"in"``): their values go to ``Handlers.compared``."""
    if is_plugin_active():
        plugin_state.handlers.compared(op, getattr(a, "value", a), getattr(b, "value", b))


_ORDERING = {"<": ("__lt__", "__gt__"), "<=": ("__le__", "__ge__"), ">": ("__gt__", "__lt__"),
             ">=": ("__ge__", "__le__")}


def _rich_compare(a, b, name, reflected, symbol):
    # CPython's do_richcompare, interpreted: the reflected method of a strict subclass of a's type first, then a's,
    # then b's reflected one
    ta, tb = type(a), type(b)
    checked_reverse = False
    if ta is not tb and issubclass(tb, ta):
        checked_reverse = True
        res = getattr(tb, reflected)(b, a)
        if res is not NotImplemented:
            return res
    res = getattr(ta, name)(a, b)
    if res is not NotImplemented:
        return res
    if not checked_reverse:
        res = getattr(tb, reflected)(b, a)
        if res is not NotImplemented:
            return res
    raise TypeError(f"'{symbol}' not supported between instances of '{ta.__name__}' and '{tb.__name__}'")


def _python_ordering(a, b, names: tuple) -> bool:
    """Whether ``a < b`` (and the like) would run Python code: a comparison method written in Python on either
    operand's type (``functools.total_ordering``, a dataclass with ``order=True``, a class's own ``__lt__``).
    Proxies and tensors keep thunder's path (their comparisons are traced operations)."""
    from thunder.core.proxies import Proxy

    if isinstance(a, (Proxy, torch.Tensor)) or isinstance(b, (Proxy, torch.Tensor)):
        return False
    return any(type(getattr(t, n, None)) is types.FunctionType for t in (type(a), type(b)) for n in names)


def _compare_op_index(inst) -> int:
    if sys.version_info >= (3, 13):
        return inst.arg >> 5
    if sys.version_info >= (3, 12):
        return inst.arg >> 4
    return inst.arg


def _hook_comparison(op: str):
    def make(original):
        # wraps thunder.core.interpreter's IS_OP / COMPARE_OP handler, which compares the unwrapped operands natively
        @functools.wraps(original)
        def comparison_handler(inst, /, stack, **kwargs):
            if len(stack) >= 2:
                a, b = stack.getitem_wrapped(-2), stack.getitem_wrapped(-1)
                report_comparison(op, a, b)
                if op == "==" and is_plugin_active():
                    import dis

                    symbol = dis.cmp_op[_compare_op_index(inst)]
                    names = _ORDERING.get(symbol)
                    if names is not None and _python_ordering(getattr(a, "value", a), getattr(b, "value", b), names):
                        return _interpreted_ordering(inst, stack, symbol, names)
            return original(inst, stack=stack, **kwargs)

        return comparison_handler

    return make


def _interpreted_ordering(inst, stack, symbol: str, names: tuple):
    """``a < b`` (``<=``, ``>``, ``>=``) on objects whose comparison methods are Python, interpreted: thunder runs
    every comparison natively, so what ``__lt__`` read (``self.n < other.n``) was unseen by the trace, and a changed
    value reused it (``max(objs)``, ``if a < b:``)."""
    from thunder.core.interpreter import INTERPRETER_SIGNALS, _interpret_call, wrap_const

    b = stack.pop_wrapped()
    a = stack.pop_wrapped()
    res = _interpret_call(_rich_compare, a, b, wrap_const(names[0]), wrap_const(names[1]), wrap_const(symbol))
    if res is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
        return res
    if sys.version_info >= (3, 13) and (inst.arg & 0x10):
        res = _interpret_call(bool, res)
        if res is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
            return res
    stack.append(res)
    return None


def _hook_keyed_lookup(original):
    # wraps the provenance-tracking dict method thunder's interpreter runs for d[k] / k in d / d.pop(k) / del d[k]
    # (interpreter.MutMappingWrapperMethods), which looks the key up natively: the key's hash and == decide, reported
    # as a comparison (str and int keys are checked by value by thunder itself)
    @functools.wraps(original)
    def keyed_lookup(self, key, *rest, **kwargs):
        k = getattr(key, "value", key)
        if type(k) is not str and type(k) is not int:
            report_comparison("in", key, self)
        return original(self, key, *rest, **kwargs)

    return keyed_lookup


def _list_index(i):
    """``i`` (wrapped) as the int a list method takes (``operator.index``); a number proxy (symbolic values) is pinned:
    which item moves depends on its value."""
    from thunder.core.proxies import NumberProxy

    value = getattr(i, "value", i)
    if isinstance(value, NumberProxy):
        pin_input_numbers(value)
        value = value.value
    return operator.index(value)


def _hook_list_insert(original):
    # replaces thunder's list.insert lookaside (core/interpreter.py MutSequenceWrapperMethods.insert: "NotImplementedError:
    # Sequence.insert, please file an issue"): the list and its item wrappers get the item at the same position
    def insert(self, i, x, /):
        if not is_plugin_active():
            return original(self, i, x)
        from thunder.core.interpreter import do_raise, wrap_const

        self.track_items()
        try:
            index = _list_index(i)
        except TypeError as e:
            return do_raise(e)
        self.value.insert(index, x.value)
        self.item_wrappers.insert(index, x)
        return wrap_const(None)

    return insert


def _hook_list_clear(original):
    # replaces thunder's list.clear lookaside (MutSequenceWrapperMethods.clear: "Sequence.clear, please file an issue")
    def clear(self, /):
        if not is_plugin_active():
            return original(self)
        from thunder.core.interpreter import wrap_const

        self.track_items()
        self.value.clear()
        self.item_wrappers.clear()
        return wrap_const(None)

    return clear


def _remove_impl(seq, value):
    # list.remove as CPython runs it (PyObject_RichCompareBool: identity, then ==), interpreted: each comparison is one
    # the trace depends on (reported and guarded like the user's own)
    for i in range(len(seq)):
        item = seq[i]
        if item is value or item == value:
            del seq[i]
            return None
    raise ValueError("list.remove(x): x not in list")


def _count_impl(seq, value):
    n = 0
    for item in seq:
        if item is value or item == value:
            n += 1
    return n


def _interpreted_method(impl):
    """A hook replacing one of thunder's sequence method lookasides (one that raises "please file an issue") by
    ``impl`` interpreted on the sequence's wrapper, for plugin jits."""
    def hook(original):
        def method(self, x, /):
            if not is_plugin_active():
                return original(self, x)
            from thunder.core.interpreter import _interpret_call, wrap_const

            self.track_items()
            return _interpret_call(wrap_const(impl), self, x)

        return method

    return hook


# list.remove (MutSequenceWrapperMethods.remove) and list.count / tuple.count (SequenceWrapperMethods.count)
_hook_list_remove = _interpreted_method(_remove_impl)
_hook_sequence_count = _interpreted_method(_count_impl)


def _is_less(a, b):
    # one comparison of list.sort, interpreted (a branch of the trace on its answer: guarded like the user's own)
    return bool(a < b)


class _ComparisonRaised(Exception):
    pass


def _hook_list_sort(original):
    # replaces thunder's list.sort lookaside ("<class 'list'>.sort is not yet supported, please file an issue"). The
    # permutation is the one CPython's sort gives (sorted() of the positions, whose `<` is the interpreted comparison
    # of the items or keys: the same comparisons, in the same order, NaNs included); key is called once per item, in
    # order, interpreted. The list and its item wrappers are permuted alike.
    def sort(self, /, *args, key=None, reverse=False):
        if not is_plugin_active():
            return original(self, *args, key=key, reverse=reverse)
        from thunder.core.interpreter import (
            INTERPRETER_SIGNALS,
            _interpret_call,
            do_raise,
            unwrap,
            wrap_const,
        )

        if args:
            return do_raise(TypeError("sort() takes no positional arguments"))
        self.track_items()
        items = list(self.item_wrappers)
        keys = items
        if key is not None and unwrap(key) is not None:
            keys = []
            for w in items:
                k = _interpret_call(key, w)
                if k is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
                    return k
                keys.append(k)
        try:
            descending = bool(operator.index(unwrap(reverse)))
        except TypeError as e:
            return do_raise(e)
        less = wrap_const(_is_less)

        class Position:
            __slots__ = ("i",)

            def __init__(self, i):
                self.i = i

            def __lt__(self, other):
                answer = _interpret_call(less, keys[self.i], keys[other.i])
                if answer is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
                    raise _ComparisonRaised
                return unwrap(answer)

        try:
            order = sorted(range(len(items)), key=Position, reverse=descending)
        except _ComparisonRaised:
            return INTERPRETER_SIGNALS.EXCEPTION_RAISED
        values = list(self.value)
        self.value[:] = [values[i] for i in order]
        self.item_wrappers[:] = [items[i] for i in order]
        return wrap_const(None)

    return sort


def hook_targets() -> list[tuple[Any, str, Callable]]:
    import thunder.core.interpreter as interpreter

    handlers = interpreter._default_opcode_handler_map
    tracking = interpreter._default_provenance_tracking_lookaside_map
    return [
        (handlers, "IS_OP", _hook_comparison("is")),
        (handlers, "COMPARE_OP", _hook_comparison("==")),
        *((tracking, m, _hook_keyed_lookup) for m in (dict.__getitem__, dict.__contains__, dict.pop, dict.__delitem__)
          if m in tracking),
        (tracking, list.insert, _hook_list_insert),
        (tracking, list.clear, _hook_list_clear),
        (tracking, list.remove, _hook_list_remove),
        (tracking, list.sort, _hook_list_sort),
        (tracking, list.count, _hook_sequence_count),
        (tracking, tuple.count, _hook_sequence_count),
    ]


def lookasides() -> dict:
    return {}
