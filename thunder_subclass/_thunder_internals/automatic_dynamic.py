"""Automatic dynamic shapes for a plugin jit (``thunder_subclass.jit``'s default): the decision, at a cache miss,
to trace with symbolic values, made by :class:`AutomaticDynamicShapes` (held by the per-call path of :mod:`.runtime`).

In: a call that missed every cache entry, with what the newest entry's prologue raised. What happens: its arguments'
signature (pytree structure; per tensor its type, dtype, device, layout, rank and ``requires_grad``; other leaves by
value or identity) is compared with the previous miss's; a miss that differs only in tensor sizes or ints, or that
looks the same while the newest entry rejected it on an int read from inside the arguments, switches the jit's cache
option to thunder's "symbolic values" for that trace and the ones after. Out: the call's result, from the new trace.

Reaches into thunder's compile data (``cache_option``) and stats (``interpreter_cache``) of one jit, held weakly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["AutomaticDynamicShapes"]


def _input_signature(args: tuple, kwargs: dict) -> tuple[Any, tuple, tuple]:
    """``(structure, what must match, sizes)`` of a call's arguments: the pytree structure, per leaf its type and (for
    tensors) dtype, device, layout, number of dimensions and ``requires_grad``, or (for other leaves) the leaf itself
    where it is hashable and not an int; and the tensors' sizes and the ints, which symbolic values can vary."""
    from torch.utils._pytree import tree_flatten

    leaves, spec = tree_flatten((args, kwargs))
    fixed, sizes = [], []
    for x in leaves:
        if isinstance(x, torch.Tensor):
            with torch._C.DisableTorchFunctionSubclass():  # no user __torch_function__ for these reads
                fixed.append((type(x), x.dtype, x.device, x.layout, x.dim(), x.requires_grad))
                sizes.append(tuple(x.shape))
        elif type(x) is int:
            fixed.append(int)
            sizes.append(x)
        else:
            try:
                hash(x)
                fixed.append((type(x), x))
            except TypeError:
                fixed.append((type(x), id(x)))
    return spec, tuple(fixed), tuple(sizes)


def _describe_callable(fn) -> str:
    """``f (file.py:12)`` for a function, ``Linear (module)`` for a module: what a warning names."""
    if isinstance(fn, torch.nn.Module):
        return f"{type(fn).__qualname__} (module)"
    code = getattr(fn, "__code__", None)
    where = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
    return f"{getattr(fn, '__qualname__', type(fn).__qualname__)}{where}"


def _is_int_value_change(rejection: BaseException | None) -> bool:
    """Whether the newest cache entry rejected a call (``rejection``, what its prologue raised) because an int it read
    while tracing from inside the arguments changed (a static cache layer's ``cumulative_length``, a step counter):
    automatic dynamic shapes treats that as a size change (the next trace reads such ints as symbols)."""
    is_int = getattr(rejection, "is_int_value_change", None)
    return callable(is_int) and is_int()


class AutomaticDynamicShapes:
    """torch.compile's automatic dynamic shapes for a plugin jit under thunder's default cache ("constant values"),
    which traces once per input size: after a cache miss whose arguments differ from the previous miss's only in
    tensor sizes or int values (or look the same, and the newest entry rejected the call on an int it read from inside
    them: a cache layer's token count), the jit's cache option (``CompileData.cache_option``, which thunder's interpreter
    reads while it traces: ``core/compile_data.py`` ``get_cache_option``) becomes "symbolic values", so that the trace
    made for that call, and kept in the same cache, takes any sizes where nothing needs them fixed (the plugin still
    guards the sizes that reach a subclass operation). Entries traced before keep their exact checks. If tracing
    with symbolic values fails, the jit goes back to "constant values" for good, with a one-time warning, and the call
    traces as before: a trace per size, never an error that constant values would not give.

    Owner: one per compiled function (its fast path holds it); it holds the jit's compile data and stats weakly, so it
    keeps nothing alive. :attr:`state` is ``"static"``, ``"symbolic"`` or ``"static for good"``."""

    def __init__(self, cd, cs, trace_call: Callable):
        import weakref

        self._cd, self._cs = weakref.ref(cd), weakref.ref(cs)
        self._trace_call = trace_call
        self._previous = None  # the signature of the arguments of the last call that traced
        self.state = "static"

    def trace(self, args: tuple, kwargs: dict, rejection: BaseException | None = None):
        """Make and run a new trace for this call (a cache miss), with symbolic sizes when the miss is size-driven:
        the arguments differ from the previous miss's in sizes or ints only, or they look the same and the newest
        entry rejected the call (``rejection``) on an int it read from inside them."""
        from thunder.core.options import CACHE_OPTIONS

        if self.state == "symbolic":
            return self._first_among_entries(args, kwargs)
        if self.state != "static":
            return self._trace_call(*args, **kwargs)
        signature = _input_signature(args, kwargs)
        previous, self._previous = self._previous, signature
        cd, cs = self._cd(), self._cs()
        if previous is None or cd is None or cs is None or previous[:2] != signature[:2] or (
                previous == signature and not _is_int_value_change(rejection)):
            return self._trace_call(*args, **kwargs)
        cd.cache_option = CACHE_OPTIONS.SYMBOLIC_VALUES
        self.state = "symbolic"
        entries = len(cs.interpreter_cache)
        try:
            return self._first_among_entries(args, kwargs)
        except Exception as e:
            if len(cs.interpreter_cache) != entries:  # it traced and failed when it ran: the user's error
                raise
            import warnings

            cd.cache_option = CACHE_OPTIONS.CONSTANT_VALUES
            self.state = "static for good"
            self._previous = None
            warnings.warn(
                f"thunder_subclass: tracing {_describe_callable(cd.fn)} with symbolic sizes "
                f"after its inputs changed size failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                "it keeps one trace per input size. Pass dynamic=False to thunder_subclass.jit to choose that from "
                "the start.",
                stacklevel=3,
            )
            return self._trace_call(*args, **kwargs)

    def _first_among_entries(self, args: tuple, kwargs: dict):
        """Trace with symbolic sizes, and put the new cache entry first in thunder's list of entries, which lookups
        read newest first: the exact entries traced before keep answering the sizes they were made for (their checks
        and computations are cheaper than the symbolic entry's), the symbolic one answers the others."""
        cs = self._cs()
        entries = len(cs.interpreter_cache) if cs is not None else None
        result = self._trace_call(*args, **kwargs)
        if cs is not None and len(cs.interpreter_cache) == entries + 1:
            cs.interpreter_cache.insert(0, cs.interpreter_cache.pop())
        return result
