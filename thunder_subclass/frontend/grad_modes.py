"""Stage 4 (interpretation), grad modes the traced code changes: what eager records for autograd inside
``torch.inference_mode()`` and ``torch.enable_grad()`` blocks of the compiled function.

In: a grad-mode change in traced code (``torch.inference_mode()`` entered, ``torch.enable_grad()``,
``torch.set_grad_enabled``), and the grad mode when the compiled function returns. What happens: each case below.
Out: a trace that turns grad mode off and on as eager does, or a graph-break error where it cannot.

* ``torch.inference_mode()`` entered in traced code: its ``torch._C._InferenceMode`` is a C object whose ``__enter__``
  thunder 0.2.6's interpreter ran natively, unseen: the trace recorded the block's operations as differentiable and
  their results required grad where eager's do not (plain ``thunder.jit`` too). Here the object is a stand-in whose
  ``__enter__`` / ``__exit__`` turn grad mode off and back in the trace (``torch.set_grad_enabled``, thunder's
  symbol), as ``torch.no_grad()`` does: results do not require grad and no gradient flows through them. (Eager's are
  inference tensors as well, which autograd later refuses; the compiled program's are plain tensors.)
* Grad mode left changed when the compiled function returns (``torch.set_grad_enabled(False)`` not undone): eager
  leaves the caller in that mode after every call, thunder 0.2.6 only after the call that traced
  (:func:`check_grad_mode_restored`, the same error and graph break).
* Grad mode turned on inside the compiled function while it is called with grad mode off: thunder 0.2.6 runs the
  compiled program under the caller's grad mode (its forward is decorated ``torch.no_grad()``), so the results of an
  ``enable_grad`` block neither required grad nor connected to autograd, and plain tensors failed in thunder's epilogue
  (``TypeError: epilogue() takes 1 positional argument but 2 were given``). This raises
  :class:`~thunder_subclass.errors.UnsupportedGlobalStateError`, a graph-break kind
  (``thunder_subclass.runtime.graph_breaks``): by default the function runs eagerly, with ``fullgraph=True`` the error
  reaches the user.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from thunder_subclass._thunder_internals import inference_mode_class, source_location
from thunder_subclass.errors import UnsupportedGlobalStateError, format_location

__all__ = ["inference_mode_lookaside", "check_grad_mode_change", "check_grad_mode_restored"]


class _TracedInferenceMode:
    """``torch._C._InferenceMode(mode)`` in traced code (interpreted: its calls are thunder's grad-mode symbols)."""

    def __init__(self, mode: bool):
        self.mode = mode
        self.previous = None

    def __enter__(self):
        self.previous = torch.is_grad_enabled()
        if self.mode:
            torch.set_grad_enabled(False)

    def __exit__(self, *exc):
        if self.mode:
            torch.set_grad_enabled(self.previous)


def inference_mode_lookaside(fn, wrapped_args: tuple) -> Callable | None:
    """The lookaside for ``torch._C._InferenceMode(mode)`` (what ``torch.inference_mode().__enter__`` makes)."""
    if fn is not inference_mode_class():
        return None
    from thunder.core.interpreter import interpreter_needs_wrap

    return interpreter_needs_wrap(lambda mode=True: _TracedInferenceMode(bool(mode)))


def check_grad_mode_change(enabled) -> None:
    """Called for thunder's ``set_grad_enabled`` symbol (``torch._C._set_grad_enabled(enabled)``) in traced code: grad mode turned on while the compiled
    function is called with it off is an :class:`UnsupportedGlobalStateError` (see the module docstring)."""
    if enabled is True and not torch.is_grad_enabled():
        where = format_location(*source_location(skip_files=(torch.autograd.grad_mode.__file__,)))
        raise UnsupportedGlobalStateError(
            f"grad mode turned on (torch.enable_grad() or torch.set_grad_enabled(True)) at {where}, in a function "
            f"called with grad mode off (under torch.no_grad() or torch.inference_mode()): thunder 0.2.6 runs the "
            f"compiled program under the caller's grad mode, so the operations eager differentiates there would not "
            f"be. Call the compiled function with grad mode on, or move the torch.no_grad() inside it (around what "
            f"needs no gradient)."
        )


def check_grad_mode_restored() -> None:
    """Called when the traced code has run: grad mode left other than the caller's is an
    :class:`UnsupportedGlobalStateError` (see the module docstring)."""
    from thunder_subclass._thunder_internals import current_compile_data

    cd = current_compile_data()[0]
    if cd is not None and cd.is_grad_enabled != torch.is_grad_enabled():
        state = "on" if cd.is_grad_enabled else "off"
        raise UnsupportedGlobalStateError(
            f"the compiled function leaves grad mode turned {state} when it returns (torch.set_grad_enabled(...) not "
            f"undone): eager leaves the caller in that mode after every call, thunder_subclass would only after the "
            f"call that traced. Restore grad mode before returning (a `with torch.no_grad():` or "
            f"`with torch.set_grad_enabled(...):` block), or change it outside the compiled function."
        )
