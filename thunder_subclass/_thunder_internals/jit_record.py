"""The plugin's per-jit state: one typed record on the compile data of a jit, reached through :func:`jit_record`
(the trace being interpreted has its own dict, ``thunder_state.jit_state``).

In: thunder 0.2.6's ``CompileData`` of one jit (``thunder/common.py``: ``jfn._lc_cd``, or the one being traced,
``thunder.core.compile_data.get_compile_data()``). What happens: the record is made the first time it is asked for
and kept in the compile data's ``__dict__`` under one private key (thunder has no place for a plugin's per-jit
state), so it lives and dies with the jit. Out: its :class:`JitRecord`.

Owner of state: the jit (its compile data); a field's owner is named with it.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

__all__ = ["JitRecord", "jit_record"]

_KEY = "_thunder_subclass_jit_record"


@dataclasses.dataclass(eq=False)
class JitRecord:
    """What the plugin keeps per jit.

    * ``call_port``: the jit's :class:`~thunder_subclass._thunder_internals.runtime.CallPort` (set by
      ``runtime.fast_call_path``; None for ``thunder.compile(..., plugins=...)``), which the per-call path asks;
    * ``grad_mode``: the per-thread grad mode that the jit's compile-data class reads as ``is_grad_enabled`` (a
      ``threading.local`` whose ``value`` each thread sets; ``runtime._per_thread_grad_mode``), or None;
    * ``speculations``: how many values were speculated per source line for the jit
      (``thunder_subclass.runtime.speculation``).
    """

    call_port: Any = None
    grad_mode: threading.local | None = None
    speculations: dict = dataclasses.field(default_factory=dict)


def jit_record(cd) -> JitRecord:
    """The :class:`JitRecord` of compile data ``cd`` (made on first use)."""
    state = cd.__dict__.get(_KEY)
    if state is None:
        state = cd.__dict__.setdefault(_KEY, JitRecord())
    return state
