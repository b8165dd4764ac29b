"""Dict version tags: how the prologue sees, without reading an object's attributes, that nothing wrote them.

CPython 3.11 keeps in every dict a version tag (``ma_version_tag``, PEP 509) taken from one process-wide counter
when the dict is made and at every change of it: setting a key to another object, deleting one, ``clear``,
``update``, ``pop``... (setting a key to the object it already holds changes nothing and keeps the tag). Two reads
of the same tag therefore mean the same dict, unchanged in between; a new dict never has an old dict's tag. torch
reads it for dynamo's guards (``torch._C._dynamo.guards.dict_version``); this module hands that reader out only on
CPython 3.11, where the rule above is what the interpreter does (3.12 deprecates the tag and later versions drop it;
there :func:`dict_version_reader` is None and every check runs in full, as before).

An instance's attributes live in its ``__dict__`` (a write through ``setattr``, ``object.__setattr__``,
``vars(obj)[k] = v`` or ``obj.__dict__.update`` changes that dict), a class's in the dict behind its
``mappingproxy`` (:func:`class_dict`; ``cls.attr = v`` and ``del cls.attr`` go through ``type.__setattr__``, which
changes it). What the tags do not show (a ``__dict__`` or ``__class__`` replaced, a class's bases reassigned) the
user of this module checks by identity (``thunder_subclass.guards.watched``).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable

__all__ = ["class_dict", "dict_version_reader"]


def dict_version_reader() -> Callable[[dict], int] | None:
    """torch's reader of a dict's version tag, on CPython 3.11 (see the module's text), else None."""
    if sys.implementation.name != "cpython" or sys.version_info[:2] != (3, 11):
        return None
    try:
        from torch._C._dynamo.guards import dict_version
    except ImportError:
        return None
    return dict_version


def class_dict(cls: type) -> dict | None:
    """The dict that holds ``cls``'s attributes (``cls.__dict__`` is a read-only view of it), or None when it cannot
    be found: the one dict the view refers to, with the view's keys."""
    view = cls.__dict__
    found = [d for d in gc.get_referents(view) if type(d) is dict]
    if len(found) != 1 or found[0].keys() != view.keys():
        return None
    return found[0]
