"""Interpreter fixes: thunder 0.2.6 interprets some ordinary Python unlike CPython (or torch).

Each fix acts only while a plugin jit traces (:func:`~.plugin_state.is_plugin_active`); found with Hugging Face
transformers 4.55-5.x models at their default call arguments, none is specific to them. They live in one module per
concern, each with its ``hook_targets()`` (owner, attribute, hook maker) and its ``lookasides()`` table (a dict keyed
by function, as thunder's lookaside map: function -> ``choose(fn, wrapped_args, wrapped_kwargs)``, which gives the
lookaside for that call or None), and where a callable is known by its type, ``type_lookasides()``:

* :mod:`.attributes`: ``type.__call__``, ``getattr`` / ``object.__getattribute__`` through a class's
  ``__getattribute__``, ``hasattr`` / ``vars`` / ``getattr`` with a computed name read through the interpreter,
  ``object.__setattr__`` and C ``__setattr__`` slots, ``isinstance`` with a Python ``__instancecheck__``;
* :mod:`.iteration`: Python stand-ins for ``itertools`` / ``functools.cmp_to_key`` / ``operator`` getters,
  ``sorted`` / ``min`` / ``max`` / ``map`` / ``filter`` as Python, only builtin sequences iterated by thunder;
* :mod:`.torch_calls`: ``torch.cat`` / ``F.scaled_dot_product_attention`` / ``torch.tensor``, a torch-level
  symbol's arguments as torch takes them (:func:`torch_arguments`), numbers computed from tensor data in branches,
  slice bounds in indexing;
* :mod:`.epilogue`: attribute writes and buffer writes, and Python objects returned, reach the caller;
* :mod:`.comparisons`: ``is`` / ``==`` / ordering / dict-key lookups reported, list methods thunder lacks;
* :mod:`.exceptions`: the line an exception was raised at, as CPython keeps it
  (:func:`exception_source_lines`);
* :mod:`.constant_keys`: dict key objects and set items read from the inputs, guarded and unpacked.

This module puts the parts together: :func:`interpreter_fix_lookaside` (the lookaside of the ``general_jit_lookaside``
hook of :mod:`.tracing` asks it first) and :func:`hook_targets` (the parts' targets, for :mod:`.install`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from thunder_subclass._thunder_internals.fixes import (
    attributes as fixes_attributes,
    comparisons as fixes_comparisons,
    constant_keys as fixes_constant_keys,
    epilogue as fixes_epilogue,
    exceptions as fixes_exceptions,
    iteration as fixes_iteration,
    torch_calls as fixes_torch_calls,
)
from thunder_subclass._thunder_internals.fixes.exceptions import exception_source_lines
from thunder_subclass._thunder_internals.fixes.torch_calls import torch_arguments
from thunder_subclass._thunder_internals.plugin_state import is_hashable

__all__ = ["PARTS", "exception_source_lines", "hook_targets", "interpreter_fix_lookaside", "is_hashable",
           "torch_arguments"]

# in the order their hooks are installed
PARTS = (fixes_exceptions, fixes_comparisons, fixes_iteration, fixes_torch_calls, fixes_epilogue, fixes_constant_keys,
         fixes_attributes)


@functools.cache
def _tables() -> tuple[dict, dict]:
    """(function -> choose, type -> choose) of every part (made at the first call: some keys are thunder's)."""
    by_function, by_type = {}, {}
    for part in PARTS:
        for table, own in ((by_function, part.lookasides()), (by_type, getattr(part, "type_lookasides", dict)())):
            clash = table.keys() & own.keys()
            assert not clash, f"{part.__name__} fixes {clash} again"
            table.update(own)
    return by_function, by_type


def interpreter_fix_lookaside(fn, wrapped_args: tuple = (), wrapped_kwargs: dict | None = None):
    """The lookaside of an interpreter fix for ``fn`` called with ``wrapped_args`` / ``wrapped_kwargs``, or None."""
    by_function, by_type = _tables()
    try:
        choose = by_function.get(fn)
    except TypeError:  # an unhashable callable
        choose = None
    if choose is None:
        choose = by_type.get(type(fn))
        if choose is None:
            return None
    return choose(fn, wrapped_args, wrapped_kwargs or {})


def hook_targets() -> list[tuple[Any, str, Callable]]:
    return [target for part in PARTS for target in part.hook_targets()]
