"""``dict(iterable)`` in traced code raises what iterating the argument raises (thunder 0.2.6 lost it).

thunder's interpreter runs ``dict(...)`` / ``OrderedDict(...)`` through its own Python wrapper
(``core/interpreter.py`` ``MutMappingWrapperMethods.__init__``, the provenance-tracking lookaside of
``dict.__init__``), which calls its ``update`` and drops what that returns: an exception raised while iterating the
argument (``dict(zip(a, b, strict=True))`` of unequal lengths, a ``next()`` the plugin refuses on an iterator from
outside the trace, ``thunder_subclass.frontend.native_effects``) was lost, and the dict came out empty or partial,
silently. The hook returns the interpreter's exception signal when ``update`` gives it, else what thunder's wrapper
returns (``None``). Hooks acting only while a jit that uses the plugin traces; removable with the others.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable
from typing import Any

from thunder_subclass._thunder_internals.plugin_state import is_plugin_active


def _hook_dict_init(original):
    # replaces thunder's dict.__init__ lookaside (MutMappingWrapperMethods.__init__), which ignored update's signal
    @functools.wraps(original)
    def dict_init(self, *other, **kwds):
        if not is_plugin_active():
            return original(self, *other, **kwds)
        from thunder.core.interpreter import INTERPRETER_SIGNALS, MutMappingWrapperMethods, wrap_const

        res = MutMappingWrapperMethods.update(self, *other, **kwds)
        if res is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
            return res
        return wrap_const(None)

    return dict_init


def hook_targets() -> list[tuple[Any, str, Callable]]:
    import thunder.core.interpreter as interpreter

    tracking = interpreter._default_provenance_tracking_lookaside_map
    return [(tracking, m, _hook_dict_init) for m in (dict.__init__, collections.OrderedDict.__init__) if m in tracking]
