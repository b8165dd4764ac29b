"""The plugin's per-jit state: one typed record on the compile data of a jit, reached through :func:`jit_record`
(the trace being interpreted has its own dict, ``thunder_state.jit_state``).

In: thunder 0.2.6's ``CompileData`` of one jit (``thunder/common.py``: ``jfn._lc_cd``, or the one being traced,
``thunder.core.compile_data.get_compile_data()``). What happens: the record is made the first time it is asked for
and kept in the compile data's ``__dict__`` under one private key (thunder has no place for a plugin's per-jit
state), so it lives and dies with the jit. Out: its :class:`JitRecord`; :func:`record_of` finds it from a compiled
function or ``ThunderModule`` (which carry the compile data as ``_lc_cd``), so every wrapper of one jit reaches the
same state.

Owner of state: the jit (its compile data); a field's owner is named with it.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Any

__all__ = ["JitRecord", "jit_record", "record_of"]

_KEY = "_thunder_subclass_jit_record"


@dataclasses.dataclass(eq=False)
class JitRecord:
    """What the plugin keeps per jit.

    * ``call_port``: the jit's :class:`~thunder_subclass._thunder_internals.runtime.CallPort` (set by
      ``runtime.fast_call_path``; None for ``thunder.compile(..., plugins=...)``), which the per-call path asks;
    * ``grad_mode``: the per-thread grad mode that the jit's compile-data class reads as ``is_grad_enabled`` (a
      ``threading.local`` whose ``value`` each thread sets; ``runtime._per_thread_grad_mode``), or None;
    * ``speculations``: how many values were speculated per source line for the jit
      (``thunder_subclass.runtime.speculation``);
    * ``fast_call``: whether the jit's calls go through the shorter path to a cache hit (set by
      ``runtime.fast_call_path`` when it builds one);
    * ``policy``: the jit's ``thunder_subclass.runtime.cache.CachePolicy`` (the cache bound; set by
      ``thunder_subclass.runtime.cache_policy.compiled_call``, read by ``explain_recompiles`` and by a copy of a
      compiled module), or None for a jit not made by ``thunder_subclass.jit``;
    * ``dynamic_shapes``: the jit's ``thunder_subclass.runtime.cache_policy.AutomaticDynamicShapes`` (set by
      ``compiled_call`` with the fast path, when ``thunder_subclass.jit`` chose automatic dynamic shapes), or None;
    * ``graph_breaks``: a weak reference to the jit's graph-break program
      (``thunder_subclass.runtime.graph_breaks._Program``, set by ``with_graph_breaks`` for ``fullgraph=False``;
      read with :meth:`graph_break_program`), or None. Weak because the program's report holds the compiled function,
      which holds the compile data: a strong one would be a reference cycle (``tests/test_memory.py``). The compiled
      object's call holds the program, so it lives as long as the compiled object.

    (Fields typed ``Any`` hold objects of the layers above, which this module does not import.)
    """

    call_port: Any = None
    grad_mode: threading.local | None = None
    speculations: dict = dataclasses.field(default_factory=dict)
    fast_call: bool = False
    policy: Any = None
    dynamic_shapes: Any = None
    graph_breaks: weakref.ReferenceType | None = None

    def graph_break_program(self) -> Any:
        """The jit's graph-break program, or None (compiled with ``fullgraph=True``, or not made by
        ``thunder_subclass.jit``)."""
        return None if self.graph_breaks is None else self.graph_breaks()


def jit_record(cd) -> JitRecord:
    """The :class:`JitRecord` of compile data ``cd`` (made on first use)."""
    state = cd.__dict__.get(_KEY)
    if state is None:
        state = cd.__dict__.setdefault(_KEY, JitRecord())
    return state


def record_of(compiled) -> JitRecord | None:
    """The :class:`JitRecord` of ``compiled`` (a ``thunder.jit`` result, or an object carrying its compile data as
    ``_lc_cd``: a function or a ``ThunderModule``), or None when it has none (it is not compiled, or no state was
    kept for it). Makes no record."""
    cd = getattr(compiled, "_lc_cd", None)  # (thunder.compile_data's own lookup)
    return None if cd is None else cd.__dict__.get(_KEY)
