"""Stage 3 (inputs and guards), writes into the caller's containers: a list, dict, set or object ``__dict__`` given
the contents it should hold, changing only what differs.

In: a container and the contents it should hold (``list(d.items())`` for a dict, items for a list or set).
What happens: nothing when it already holds them (compared by identity); otherwise the fewest writes that get there:
added keys deleted, changed values assigned, in place. Out: the container holding those contents.

Why not ``d.clear(); d.update(items)``: the containers put back here are often shared with other threads (the globals a
trace read, ``builtins.__dict__`` reached through them, a module's ``_modules``); a clear leaves them empty for a moment,
and another thread that looks a name up then gets ``NameError: name 'dict' is not defined``, or walks a module with no
children. Writing only what differs leaves every key that did not change in place throughout, as eager's own writes do.
"""

from __future__ import annotations

from typing import Any

__all__ = ["set_contents", "same_items"]


def same_items(now: list, items: list, is_dict: bool) -> bool:
    """Whether ``now`` and ``items`` hold the same objects in the same order (dict: (key, value) pairs)."""
    if len(now) != len(items):
        return False
    if is_dict:
        return all(a[0] is b[0] and a[1] is b[1] for a, b in zip(now, items))
    return all(a is b for a, b in zip(now, items))


def set_contents(obj: Any, items: list) -> None:
    """``obj`` (a dict, list or set) holds ``items`` afterwards, written as described in the module docstring."""
    if isinstance(obj, set):
        wanted = set(items)
        for x in [x for x in obj if x not in wanted]:
            obj.discard(x)
        obj.update(wanted)
        return
    if isinstance(obj, dict):
        _set_dict(obj, items)
        return
    if same_items(list(obj), items, False):
        return
    obj[:] = items  # one slice assignment: other threads see the old list or the new one


def _set_dict(d: dict, items: list) -> None:
    if same_items(list(d.items()), items, True):
        return
    wanted = dict(items)
    for k in [k for k in d if k not in wanted]:
        del d[k]
    for k, v in items:
        if k not in d or d[k] is not v:
            d[k] = v
    if list(d) != [k for k, _ in items]:
        # (keys deleted and added back by the code: a dict's order can only be rebuilt by taking keys out; each is
        # out for one write, never the whole dict at once)
        for k, v in items:
            del d[k]
            d[k] = v
