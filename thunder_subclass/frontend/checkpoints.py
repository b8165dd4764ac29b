"""Stage 4 (interpretation), ``torch.utils.checkpoint.checkpoint`` in traced code: the reentrant variant is a graph
break.

In: a call of ``torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=..., ...)`` in code that
``thunder_subclass.jit`` traces. What happens: a lookaside reads ``use_reentrant`` before thunder sees the call.
Out: with ``use_reentrant=False`` thunder's own lookaside (it traces ``function``
into thunder's ``checkpoint`` symbol, recomputed in the backward); with ``use_reentrant=True``, or the argument left
out (eager then warns and runs the reentrant variant, torch 2.13), an
:class:`~thunder_subclass.errors.UnsupportedCheckpointError`: a graph break (the code around it runs eagerly, so the
checkpoint runs as eager runs it: forward without grad, the call run again by its backward), raised with
``fullgraph=True``.

Why: thunder 0.2.6 refuses the reentrant variant by raising a string (``do_raise("torch.checkpoint: ...")``), which
reached the user as ``TypeError: exceptions must derive from BaseException``. It cannot be traced as the non-reentrant
one without changing what eager does: a reentrant checkpoint whose arguments need no gradient gives none to the
parameters ``function`` uses, and ``torch.autograd.grad`` through it raises. Assumption: none beyond the argument's
value, read on each trace (a graph break runs eagerly on every call).

Owner of state: none.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.utils.checkpoint

from thunder_subclass import _thunder_internals
from thunder_subclass.errors import UnsupportedCheckpointError, format_location

__all__ = ["lookaside"]


def lookaside(fn, wrapped_args: tuple) -> Callable | None:
    """The lookaside of ``torch.utils.checkpoint.checkpoint`` (see the module docstring), else None."""
    if fn is not torch.utils.checkpoint.checkpoint:
        return None
    thunder_own = _thunder_internals.thunder_lookaside(fn)

    def checkpoint(*args, **kwargs):
        reentrant = kwargs.get("use_reentrant")
        reentrant = getattr(reentrant, "value", reentrant)
        if reentrant is None or reentrant:
            where = format_location(*_thunder_internals.source_location())
            how = "use_reentrant=True" if reentrant else "no use_reentrant (torch then runs use_reentrant=True)"
            return _thunder_internals.raise_in_interpreter(UnsupportedCheckpointError(
                f"torch.utils.checkpoint.checkpoint with {how} at {where}: the reentrant checkpoint cannot be "
                f"compiled (it runs the function without autograd and again in its own backward). Pass "
                f"use_reentrant=False to have it compiled, or leave fullgraph off: the code around it then runs "
                f"eagerly (a graph break)."
            ))
        return thunder_own(*args, **kwargs)

    return checkpoint
