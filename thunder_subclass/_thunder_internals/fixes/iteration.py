"""Interpreter fixes, iteration: Python stand-ins for ``itertools`` / ``functools.cmp_to_key`` / ``operator``
getters, ``sorted``/``min``/``max``/``map``/``filter`` run as Python, and which objects count as sequences.

Part of the interpreter fixes (:mod:`~thunder_subclass._thunder_internals.fixes` dispatches to each part's
``lookasides()`` table and installs its ``hook_targets()``); each acts only while a plugin jit traces
(:func:`~.plugin_state.is_plugin_active`) and names what it works around:

* ``core/jit_ext.py`` module global ``Sequence`` (used by ``general_jit_lookaside``, ``proxify``,
  ``recursively_proxy``) — only builtin sequences are iterated, not a user's ``collections.abc.Sequence``
  (transformers 5.x ``_PerLayerConfigView``: "object has no attribute '_config'").
* ``sorted`` / ``min`` / ``max`` (lookasides, with a ``key=`` or items other than plain numbers and strings), ``map`` /
  ``filter`` (with a Python function) — run as Python through the interpreter, not natively: what the functions read
  is traced and guarded. ``COMPARE_OP`` ``<``/``<=``/``>``/``>=`` on objects whose comparison methods are Python runs
  CPython's rich-comparison order through the interpreter (thunder compares natively).
"""

from __future__ import annotations

import functools
import operator
import types
from collections.abc import Callable
from typing import Any

import torch

from thunder_subclass._thunder_internals.plugin_state import is_hashable, is_plugin_active
from thunder_subclass._thunder_internals.thunder_state import (
    interpret_call,
)


class _BuiltinSequenceMeta(type):
    def __instancecheck__(cls, obj):
        if is_plugin_active():
            return isinstance(obj, cls.builtin)
        return isinstance(obj, cls.abc_sequence)

    def __subclasscheck__(cls, sub):
        if is_plugin_active():
            return isinstance(sub, type) and issubclass(sub, cls.builtin)
        return issubclass(sub, cls.abc_sequence)


def _hook_jit_ext_sequence(original):
    # replaces the module global `Sequence` of thunder.core.jit_ext (collections.abc.Sequence), which
    # general_jit_lookaside (every call without a lookaside: `any(isinstance(i, TensorProxy) for i in a.value)`),
    # proxify and recursively_proxy use to decide what to iterate and rebuild. Iterating a user's Sequence runs its
    # __getitem__ / __len__ outside the interpreter, even on `self` before __init__ ran (transformers 5.x
    # _PerLayerConfigView: "object has no attribute '_config'"), and hangs on one whose __getitem__ never raises
    # IndexError. For a plugin jit only the builtin sequences (list, tuple and their subclasses such as torch.Size
    # and namedtuples, range, deque) count; otherwise collections.abc.Sequence as before.
    import collections

    return _BuiltinSequenceMeta(
        "BuiltinSequence", (), {"builtin": (list, tuple, range, collections.deque), "abc_sequence": original}
    )


def _sorted(iterable, /, *, key=None, reverse=False):
    result = list(iterable)
    result.sort(key=key, reverse=reverse)
    return result


_NO_DEFAULT = object()


def _min_or_max(builtin, greater: bool, *args, key=None, default=_NO_DEFAULT):
    if not args:
        raise TypeError(f"{builtin.__name__} expected at least 1 argument, got 0")
    if len(args) > 1 and default is not _NO_DEFAULT:
        raise TypeError(f"Cannot specify a default for {builtin.__name__}() with multiple positional arguments")
    items = list(args[0]) if len(args) == 1 else list(args)
    if not items:
        return builtin([]) if default is _NO_DEFAULT else default  # CPython's error (no items), or the default
    best = items[0]
    best_key = best if key is None else key(best)
    for item in items[1:]:
        k = item if key is None else key(item)
        if (k > best_key) if greater else (k < best_key):  # CPython keeps the first of equal items
            best, best_key = item, k
    return best


_PLAIN_ITEMS = (int, float, bool, str, bytes, type(None))


def _compares_python_objects(args: tuple, kwargs: dict) -> bool:
    """Whether ``sorted``/``min``/``max`` called with these (unwrapped) arguments would run Python code natively:
    a ``key`` function, or items other than plain numbers and strings (their ``__lt__``), or an iterable whose items
    cannot be seen without consuming it."""
    from thunder.core.proxies import Proxy

    if kwargs.get("key") is not None:
        return True
    items = args
    if len(args) == 1:
        if not isinstance(args[0], (list, tuple, dict, set, frozenset)):  # (torch.Size is a tuple)
            return True
        items = args[0]
    return not all(type(i) in _PLAIN_ITEMS or isinstance(i, (Proxy, torch.Tensor)) for i in items)


def _interpreted_builtin(fn):
    """``sorted``/``min``/``max`` as Python, interpreted: the key function and the items' comparisons run traced
    (what they read is guarded like the rest of the traced code) instead of natively, where thunder's native call
    left them unseen: ``max(TABLE, key=lambda k: k.n)`` reused the trace after ``k.n`` changed."""
    return _interpreted(_sorted if fn is sorted else functools.partial(_min_or_max, fn, fn is max))


def _map(fn, *iterables):
    for args in zip(*iterables):
        yield fn(*args)


def _filter(fn, iterable):
    for item in iterable:
        if (item if fn is None else fn(item)):
            yield item


def _runs_python(fn) -> bool:
    """Whether calling ``fn`` may run Python code (anything but a builtin function or a builtin type)."""
    return not (isinstance(fn, (types.BuiltinFunctionType, types.BuiltinMethodType))
                or (isinstance(fn, type) and fn.__module__ == "builtins") or fn is None)


def _interpreted(impl):
    def lookaside(*args, **kwargs):
        return interpret_call(impl, *args, **kwargs)

    return lookaside


# Python versions of itertools functions and of calls of operator.attrgetter / itemgetter, run through the
# interpreter: thunder runs the C versions natively, so the objects they hand back (or give their callbacks) had no
# path to the inputs, and what traced code read from them was inlined unchecked (``for k in chain(objs): x + k.n``).
# Each keeps CPython's order of iteration, of calls and of what it consumes.

def _chain(*iterables):
    for iterable in iterables:
        yield from iterable


def _chain_from_iterable(iterables):
    for iterable in iterables:
        yield from iterable


def _islice(iterable, *args):
    bounds = slice(*args)
    start = 0 if bounds.start is None else bounds.start
    step = 1 if bounds.step is None else bounds.step
    counter = range(bounds.stop) if bounds.stop is not None else _count()
    wanted = start
    for i, item in zip(counter, iterable):  # zip asks the counter first: nothing past stop is consumed
        if i == wanted:
            yield item
            wanted += step


def _count():
    i = 0
    while True:
        yield i
        i += 1


def _starmap(function, iterable):
    for args in iterable:
        yield function(*args)


def _accumulate(iterable, func=None, *, initial=None):
    it = iter(iterable)
    total = initial
    if initial is None:
        for total in it:
            break
        else:
            return
    yield total
    for item in it:
        total = total + item if func is None else func(total, item)
        yield total


def _takewhile(predicate, iterable):
    for item in iterable:
        if not predicate(item):
            return
        yield item


def _dropwhile(predicate, iterable):
    it = iter(iterable)
    for item in it:
        if not predicate(item):
            yield item
            break
    yield from it


def _filterfalse(predicate, iterable):
    for item in iterable:
        if not (item if predicate is None else predicate(item)):
            yield item


def _compress(data, selectors):
    for item, selected in zip(data, selectors):
        if selected:
            yield item


def _zip_longest(*iterables, fillvalue=None):
    iterators = [iter(i) for i in iterables]
    active = len(iterators)
    if not active:
        return
    while True:
        values = []
        for i in range(len(iterators)):
            try:
                value = next(iterators[i])
            except StopIteration:
                active -= 1
                if not active:
                    return
                iterators[i] = _repeat(fillvalue)
                value = fillvalue
            values.append(value)
        yield tuple(values)


def _repeat(value):
    while True:
        yield value


def _pairwise(iterable):
    it = iter(iterable)
    for first in it:
        break
    else:
        return
    for second in it:
        yield first, second
        first = second


def _advance(indices: list, limits: list) -> bool:
    # odometer step over indices[i] < limits[i], rightmost first; False when it wraps around
    for i in reversed(range(len(indices))):
        indices[i] += 1
        if indices[i] < limits[i]:
            return True
        indices[i] = 0
    return False


def _product(*iterables, repeat=1):
    if repeat < 0:
        raise ValueError("repeat argument cannot be negative")
    pools = [tuple(pool) for pool in iterables] * repeat  # CPython reads every input first
    if any(len(pool) == 0 for pool in pools):
        return
    indices = [0] * len(pools)
    limits = [len(pool) for pool in pools]
    while True:
        yield tuple(pools[i][indices[i]] for i in range(len(pools)))
        if not _advance(indices, limits):
            return


def _combinations_indices(n: int, r: int, replacement: bool):
    # index tuples in CPython's (lexicographic) order
    if r < 0:
        raise ValueError("r must be non-negative")
    if (n == 0 and r > 0) or (not replacement and r > n):
        return
    indices = [0] * r if replacement else list(range(r))
    while True:
        yield tuple(indices)
        i = r - 1
        while i >= 0 and indices[i] == (n - 1 if replacement else i + n - r):
            i -= 1
        if i < 0:
            return
        indices[i] += 1
        for j in range(i + 1, r):
            indices[j] = indices[i] if replacement else indices[j - 1] + 1


def _combinations(iterable, r):
    pool = tuple(iterable)
    for indices in _combinations_indices(len(pool), r, False):
        yield tuple(pool[i] for i in indices)


def _combinations_with_replacement(iterable, r):
    pool = tuple(iterable)
    for indices in _combinations_indices(len(pool), r, True):
        yield tuple(pool[i] for i in indices)


def _permutations(iterable, r=None):
    pool = tuple(iterable)
    r = len(pool) if r is None else r
    if r < 0:
        raise ValueError("r must be non-negative")
    if r <= len(pool):
        yield from _distinct_positions(pool, r, [], [False] * len(pool))


def _distinct_positions(pool: tuple, r: int, chosen: list, used: list):
    # r-tuples of distinct positions in lexicographic order (CPython's order of permutations)
    if len(chosen) == r:
        yield tuple(pool[i] for i in chosen)
        return
    for i in range(len(pool)):
        if not used[i]:
            used[i] = True
            chosen.append(i)
            yield from _distinct_positions(pool, r, chosen, used)
            chosen.pop()
            used[i] = False


def _methodcaller_call(spec: tuple, obj):
    name, args, kwargs = spec
    return getattr(obj, name)(*args, **kwargs)


class _GroupBy:
    """``itertools.groupby`` as Python: each group shares the underlying iterator, and advancing to the next key
    leaves the previous group empty, as CPython's does."""

    _UNSET = object()

    def __init__(self, iterable, key=None):
        self.keyfunc = key
        self.it = iter(iterable)
        self.tgtkey = self.currkey = self.currvalue = _GroupBy._UNSET
        self.marker = object()

    def __iter__(self):
        return self

    def _key(self, value):
        return value if self.keyfunc is None else self.keyfunc(value)

    def __next__(self):
        self.marker = object()
        while self.currkey is _GroupBy._UNSET or (self.tgtkey is not _GroupBy._UNSET and self.currkey == self.tgtkey):
            self.currvalue = next(self.it)
            self.currkey = self._key(self.currvalue)
        self.tgtkey = self.currkey
        return self.currkey, self._group(self.tgtkey, self.marker)

    def _group(self, tgtkey, marker):
        while self.marker is marker and self.currkey == tgtkey:
            yield self.currvalue
            try:
                self.currvalue = next(self.it)
            except StopIteration:
                return
            self.currkey = self._key(self.currvalue)


def _attrgetter_call(paths: tuple, obj):
    values = []
    for path in paths:  # each dotted name, split natively beforehand
        value = obj
        for part in path:
            value = getattr(value, part)
        values.append(value)
    return values[0] if len(paths) == 1 else tuple(values)


def _itemgetter_call(items: tuple, obj):
    return obj[items[0]] if len(items) == 1 else tuple(obj[i] for i in items)


class _TeeIterator:
    """One of ``itertools.tee``'s iterators as Python: all of one call's iterators share the source iterator and a
    linked buffer of the items some iterator has taken from it and others have not yet (cells ``[item, next]``,
    ``next`` None until fetched)."""

    def __init__(self, source, cell):
        self._source = source
        self._cell = cell

    def __iter__(self):
        return self

    def __next__(self):
        cell = self._cell
        if cell[1] is None:
            cell[0] = next(self._source)
            cell[1] = [None, None]
        self._cell = cell[1]
        return cell[0]

    def __copy__(self):
        return _TeeIterator(self._source, self._cell)


def _tee(iterable, n=2):
    if not isinstance(n, int):
        raise TypeError(f"'{type(n).__name__}' object cannot be interpreted as an integer")
    if n < 0:
        raise ValueError("n must be >= 0")
    source, cell = iter(iterable), [None, None]
    return tuple(_TeeIterator(source, cell) for _ in range(n))


class _CmpKey:
    """An item of ``functools.cmp_to_key(cmp)`` as Python: its comparisons call ``cmp`` through the interpreter."""

    __slots__ = ("obj", "cmp")
    __hash__ = None

    def __init__(self, obj, cmp):
        self.obj = obj
        self.cmp = cmp

    def __lt__(self, other):
        return self.cmp(self.obj, other.obj) < 0

    def __gt__(self, other):
        return self.cmp(self.obj, other.obj) > 0

    def __eq__(self, other):
        return self.cmp(self.obj, other.obj) == 0

    def __le__(self, other):
        return self.cmp(self.obj, other.obj) <= 0

    def __ge__(self, other):
        return self.cmp(self.obj, other.obj) >= 0


def _cmp_to_key(mycmp):
    def key(obj):
        return _CmpKey(obj, mycmp)

    return key


@functools.cache
def _python_stand_ins() -> dict:
    """The C callable -> its Python version run through the interpreter (itertools, ``functools.cmp_to_key``)."""
    import itertools

    return {
        itertools.chain: _chain, itertools.chain.from_iterable: _chain_from_iterable, itertools.islice: _islice,
        itertools.starmap: _starmap, itertools.accumulate: _accumulate, itertools.takewhile: _takewhile,
        itertools.dropwhile: _dropwhile, itertools.filterfalse: _filterfalse, itertools.compress: _compress,
        itertools.zip_longest: _zip_longest, itertools.pairwise: _pairwise, itertools.groupby: _GroupBy,
        itertools.product: _product, itertools.combinations: _combinations,
        itertools.combinations_with_replacement: _combinations_with_replacement, itertools.permutations: _permutations,
        itertools.tee: _tee, functools.cmp_to_key: _cmp_to_key,
    }


def _getter_call(impl, parts: tuple):
    from thunder.core.interpreter import wrap_const

    def lookaside(*args, **kwargs):
        return interpret_call(impl, wrap_const(parts), *args, **kwargs)

    return lookaside


def _python_iteration_lookaside(fn, wrapped_args: tuple, wrapped_kwargs: dict):
    """The interpreted Python version of an ``itertools`` function, ``functools.cmp_to_key``, or an
    attrgetter/itemgetter/methodcaller call, or None."""
    if type(fn) is operator.methodcaller and len(wrapped_args) == 1 and not wrapped_kwargs:
        name = fn.__reduce__()  # (methodcaller, (name, *args)) or (partial(methodcaller, name, **kwargs), args)
        if name[0] is operator.methodcaller:
            spec = (name[1][0], tuple(name[1][1:]), {})
        else:
            spec = (name[0].args[1], tuple(name[1]), dict(name[0].keywords))
        return _getter_call(_methodcaller_call, spec)
    if type(fn) in (operator.attrgetter, operator.itemgetter) and len(wrapped_args) == 1 and not wrapped_kwargs:
        parts = fn.__reduce__()[1]
        if type(fn) is operator.attrgetter:
            return _getter_call(_attrgetter_call, tuple(tuple(name.split(".")) for name in parts))
        return _getter_call(_itemgetter_call, parts)
    if not is_hashable(fn):
        return None
    impl = _python_stand_ins().get(fn)
    if impl is None:
        return None
    if impl is _islice:
        import itertools

        from thunder.core.interpreter import unwrap

        bounds = [unwrap(a) for a in wrapped_args[1:]]
        if wrapped_kwargs or not all(b is None or type(b) is int for b in bounds):
            return None  # thunder's own call (keywords, number proxies)
        itertools.islice((), *bounds)  # CPython's errors for bad bounds, before anything is consumed
    return _interpreted(impl)


def _stand_in(fn, wrapped_args: tuple, wrapped_kwargs: dict):
    return _python_iteration_lookaside(fn, wrapped_args, wrapped_kwargs)


def _map_or_filter(fn, wrapped_args: tuple, wrapped_kwargs: dict):
    if not wrapped_args or wrapped_kwargs:
        return None
    from thunder.core.interpreter import unwrap

    # thunder calls map/filter natively: a Python function they call ran outside the trace (its reads unguarded)
    if _runs_python(unwrap(wrapped_args[0])) and (fn is map or len(wrapped_args) == 2):
        return _interpreted(_map if fn is map else _filter)
    return None


def _ordering(fn, wrapped_args: tuple, wrapped_kwargs: dict):
    from thunder.core.interpreter import unwrap

    kwargs = {k: unwrap(v) for k, v in wrapped_kwargs.items()}
    if _compares_python_objects(tuple(unwrap(a) for a in wrapped_args), kwargs):
        return _interpreted_builtin(fn)
    return None  # plain numbers and strings: thunder's own call


def hook_targets() -> list[tuple[Any, str, Callable]]:
    import thunder.core.jit_ext as jit_ext

    return [(jit_ext, "Sequence", _hook_jit_ext_sequence)]


def lookasides() -> dict:
    """function -> ``choose(fn, wrapped_args, wrapped_kwargs)``: its lookaside for this call, or None."""
    return {**{fn: _stand_in for fn in _python_stand_ins()}, map: _map_or_filter, filter: _map_or_filter,
            sorted: _ordering, min: _ordering, max: _ordering}


def type_lookasides() -> dict:
    """type of a callable -> ``choose(fn, wrapped_args, wrapped_kwargs)`` (calls of attrgetter, itemgetter and
    methodcaller objects)."""
    return {operator.methodcaller: _stand_in, operator.attrgetter: _stand_in, operator.itemgetter: _stand_in}
