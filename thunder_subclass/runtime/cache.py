"""Stage 2 (per call), the cache policy of a ``thunder_subclass.jit`` function: a bound on its cache entries, why calls
missed, and what a call past the bound does.

In: the cache misses of one compiled function (from the per-call path, ``thunder_subclass.runtime.cache_policy``: a call
that no cache entry's prologue accepts), each with the reason every entry gave. What happens: each miss's reasons are
kept (the last :data:`KEPT_MISSES`) for :func:`explain_recompiles`; while the function has fewer than
``cache_size_limit`` entries a miss traces a new one, as before; past the bound it is not traced: a one-time
:class:`~thunder_subclass.errors.CacheLimitWarning` names the check that failed, and the call runs the original
function eagerly, as ``torch.compile`` does at its ``recompile_limit`` (values, types and gradients are eager's;
calls that an entry accepts keep running compiled). Out: the result of the call.

The messages of failed checks are built at misses only (a miss traces, which costs far more), never on a cache hit:
a prologue check that fails raises an exception whose message is made when read
(:class:`~thunder_subclass.guards.SubclassGuardFailure`).

Example::

    >>> import torch, thunder_subclass
    >>> jf = thunder_subclass.jit(lambda t: t * 2, cache_size_limit=2, dynamic=False)
    >>> _ = jf(torch.ones(1)), jf(torch.ones(2))
    >>> [r.splitlines()[0] for r in thunder_subclass.explain_recompiles(jf)]
    ['call 2 (a cache miss; 1 entry checked):']
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Callable

from thunder_subclass._thunder_internals import record_of
from thunder_subclass.errors import CacheLimitWarning

__all__ = ["CachePolicy", "DEFAULT_CACHE_SIZE_LIMIT", "explain_recompiles", "last_miss_reasons", "config"]

DEFAULT_CACHE_SIZE_LIMIT = 8  # torch.compile's default recompile_limit
KEPT_MISSES = 32
DEFAULT_SPECULATION_LIMIT = 4


class _Config:
    """Settings read by ``thunder_subclass.jit`` when it compiles a function (later changes affect later jits).

    * ``cache_size_limit`` (default :data:`DEFAULT_CACHE_SIZE_LIMIT`, 8 like ``torch.compile``'s
      ``recompile_limit``): the most cache entries (traces) one compiled function keeps; a call that none of them
      accepts then runs eagerly (see :mod:`thunder_subclass.runtime.cache`). ``None``: no bound.
    * ``disk_cache`` (default True, as torch.compile's caches are; False when the environment variable
      ``THUNDER_SUBCLASS_DISK_CACHE`` is ``0`` (or ``false``, ``off``, ``no``) when ``thunder_subclass`` is imported): whether compiled functions keep
      their cache entries on disk too, so that another process compiling the same code loads them instead of tracing
      (see :mod:`thunder_subclass.runtime.disk_cache`). ``thunder_subclass.jit(fn, disk_cache=False)`` turns it off for
      one function.
    * ``disk_cache_dir`` (default None: ``$THUNDER_SUBCLASS_CACHE_DIR``, else ``~/.cache/thunder_subclass``): where.
    * ``disk_cache_size_limit`` (default 256 MiB): the most bytes the disk cache keeps; past it the least recently
      used entries are removed. ``None``: no bound.
    * ``speculation_limit`` (default :data:`DEFAULT_SPECULATION_LIMIT`, 4): how many different values one source line
      may speculate for one compiled function (a branch on tensor data traced as one program per value, see
      :mod:`thunder_subclass.runtime.speculation`) before the code around it runs eagerly instead (a graph break). Read
      when a value is speculated. ``None``: no bound (each new value is a new trace, up to ``cache_size_limit``).
    """

    __slots__ = ("cache_size_limit", "disk_cache", "disk_cache_dir", "disk_cache_size_limit", "speculation_limit")

    def __init__(self):
        import os

        self.cache_size_limit: int | None = DEFAULT_CACHE_SIZE_LIMIT
        self.disk_cache: bool = (os.environ.get("THUNDER_SUBCLASS_DISK_CACHE", "1").strip().lower()
                                 not in ("0", "false", "off", "no"))
        self.disk_cache_dir: str | None = None
        self.disk_cache_size_limit: int | None = 256 * 2**20
        self.speculation_limit: int | None = DEFAULT_SPECULATION_LIMIT

    def __repr__(self) -> str:
        return (f"thunder_subclass.config(cache_size_limit={self.cache_size_limit}, disk_cache={self.disk_cache}, "
                f"disk_cache_dir={self.disk_cache_dir!r}, disk_cache_size_limit={self.disk_cache_size_limit}, "
                f"speculation_limit={self.speculation_limit})")


config = _Config()


class CachePolicy:
    """The cache bound and miss record of one compiled function (owned by its per-call wrapper; freed with it).

    ``limit``: the most entries, or None. ``eager``: the function to run past the bound (the user's function or
    module). ``name``: how warnings name the function."""

    __slots__ = ("limit", "eager", "name", "misses", "calls_seen", "warned", "__weakref__")

    def __init__(self, limit: int | None, eager: Callable, name: str):
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise ValueError(f"cache_size_limit must be a positive int or None, got {limit!r}")
        self.limit, self.eager, self.name = limit, eager, name
        self.misses: collections.deque = collections.deque(maxlen=KEPT_MISSES)
        self.calls_seen = 0
        self.warned = False

    def on_miss(self, call: int, n_entries: int, reasons: list[str]) -> bool:
        """Record a miss of call number ``call`` with ``n_entries`` entries, each rejecting it for ``reasons[i]``
        (newest first). Returns whether a new entry may be traced (False: the bound is reached; warns once)."""
        if n_entries:  # a recompile (the first trace is no miss to explain)
            self.misses.append((call, n_entries, tuple(reasons)))
        if self.limit is None or n_entries < self.limit:
            return True
        if not self.warned:
            self.warned = True
            warnings.warn(CacheLimitWarning(
                f"thunder_subclass: {self.name} reached its cache size limit ({self.limit} entries, "
                f"cache_size_limit={self.limit}); calls that no entry accepts now run eagerly (not compiled). "
                f"The check that failed for the newest entry: {_first_line(reasons[0]) if reasons else 'unknown'}. "
                "Call it with inputs of fewer kinds (shapes, types, values the trace depends on), or raise the "
                "bound: thunder_subclass.jit(fn, cache_size_limit=N) or thunder_subclass.config.cache_size_limit. "
                "thunder_subclass.explain_recompiles(compiled) lists every miss."
            ), stacklevel=_user_stacklevel())
        return False

    def explain(self) -> list[str]:
        out = []
        for call, n, reasons in self.misses:
            lines = [f"call {call} (a cache miss; {n} {'entry' if n == 1 else 'entries'} checked):"]
            lines += [f"  entry {n - i} (of {n}): {r}" for i, r in enumerate(reasons)]
            out.append("\n".join(lines))
        return out


def _user_stacklevel() -> int:
    """The ``stacklevel`` of ``warnings.warn`` called from here that names the first frame outside thunder,
    thunder_subclass and ``torch.nn.modules`` (the user's call of the compiled function or module)."""
    import os
    import sys

    import thunder
    import torch.nn.modules.module as module

    package = os.path.dirname(os.path.dirname(__file__))  # thunder_subclass/ (this module is in runtime/)
    own = (package + os.sep, *(os.path.dirname(f) + os.sep for f in (thunder.__file__, module.__file__)))
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(own):
        frame, level = frame.f_back, level + 1
    return level  # stacklevel 1 is on_miss, the frame _getframe(1) starts from


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else text


def _policy(jfn) -> CachePolicy:
    record = record_of(jfn)  # (its policy set by thunder_subclass.runtime.cache_policy.compiled_call)
    policy = None if record is None else record.policy
    if policy is None:
        raise TypeError(f"{jfn!r} is not a function or module compiled by thunder_subclass.jit")
    return policy


def explain_recompiles(jfn) -> list[str]:
    """Why calls of ``jfn`` (a ``thunder_subclass.jit`` result) missed the cache: one text per miss (the last 32),
    naming the call and, for each cache entry it had then (newest first), the first prologue check that failed.

    Example: see the module docstring."""
    return _policy(jfn).explain()


def last_miss_reasons(jfn) -> tuple[str, ...]:
    """The reasons of ``jfn``'s last cache miss, one per entry then (newest first); ``()`` before any miss."""
    misses = _policy(jfn).misses
    return misses[-1][2] if misses else ()

