"""Typed errors raised by thunder_subclass.

Every error names the tensor subclass, the operation and, when it happened while tracing user code, the user's
source file and line, and says what to do. They share one base class so callers can catch them together.
"""

from __future__ import annotations

__all__ = [
    "TensorSubclassError",
    "SubclassProtocolError",
    "SubclassDispatchError",
    "UnsupportedSubclassOperationError",
    "HigherOrderGradientError",
    "UnsupportedBackwardEffectError",
    "SubclassGradientError",
    "SubclassGradRuleError",
    "SubclassRegistrationError",
    "ThunderVersionError",
    "TorchFeatureUnavailableError",
    "SubclassContractError",
    "UnsupportedTracingError",
    "UnsupportedModuleHookError",
    "UnsupportedGlobalStateError",
    "UnsupportedAliasedWriteError",
    "UnsupportedCheckpointError",
    "TraceSelfCheckError",
    "CacheLimitWarning",
]


class TensorSubclassError(Exception):
    """Base class of every error raised by thunder_subclass."""


class SubclassProtocolError(TensorSubclassError, TypeError):
    """A tensor subclass does not implement the wrapper-subclass protocol that compilation needs
    (``__tensor_flatten__`` / ``__tensor_unflatten__``), or implements it inconsistently."""


class SubclassDispatchError(TensorSubclassError, RuntimeError):
    """An exception was raised while running a torch operation on (fake) subclass instances during tracing:
    inside the subclass's ``__torch_dispatch__`` / ``__torch_function__`` or by fake-tensor execution.
    The original exception is chained as ``__cause__``."""


class UnsupportedSubclassOperationError(TensorSubclassError, NotImplementedError):
    """The operation on a subclass cannot be compiled (for example, a data-dependent op inside dispatch)."""


class HigherOrderGradientError(UnsupportedSubclassOperationError):
    """A compiled backward was run with ``create_graph=True`` (``torch.autograd.grad(..., create_graph=True)``,
    ``.backward(create_graph=True)``) where the eager recomputation that serves such a backward could differ from the
    forward that ran (an argument freed or changed in place since, a forward that writes a tensor that outlives it or
    draws random numbers, an unknown call): thunder's compiled backward is differentiable once only, and a gradient
    without history would make a loss computed from it miss its second-order terms."""


class SubclassGradientError(TensorSubclassError, TypeError):
    """The gradient given to ``.backward()`` for a subclass output of a compiled function is not of the kind the
    backward was compiled for (another type, or other flatten metadata that the subclass cannot coerce with
    ``__coerce_same_metadata_as_tangent__``)."""


class SubclassGradRuleError(TensorSubclassError, RuntimeError):
    """A grad rule or executor implementation registered for a (subclass, op) pair raised while tracing; the message
    names the rule, the subclass and the op, and the original exception is chained as ``__cause__``."""


class SubclassRegistrationError(TensorSubclassError, TypeError):
    """A registration (``register_grad_rule``, ``register_implementation``, ``register_aten_symbol``) got something
    that is not what it registers for: not a torch operation, not a tensor subclass, no executor."""


class ThunderVersionError(TensorSubclassError, ImportError):
    """The installed thunder or torch version is not one whose internals thunder_subclass knows."""


class TorchFeatureUnavailableError(SubclassProtocolError, NotImplementedError):
    """A subclass uses a part of the protocol that the installed (supported) torch lacks; ``needs_torch`` names the
    first torch version that has it (opaque reference attributes in ``__tensor_flatten__``: torch 2.11). Raised where
    a :class:`SubclassProtocolError` would be."""

    def __init__(self, message: str, *, feature: str, needs_torch: str):
        super().__init__(message)
        self.feature = feature
        self.needs_torch = needs_torch


class SubclassContractError(SubclassProtocolError):
    """``thunder_subclass.check_subclass(..., raise_on_failure=True)`` found broken rules of the subclass contract;
    ``report`` is the :class:`~thunder_subclass.check.SubclassReport` (its ``findings`` say what to fix)."""

    def __init__(self, message: str, *, report):
        super().__init__(message)
        self.report = report


class UnsupportedTracingError(TensorSubclassError, NotImplementedError):
    """Code in the compiled function that thunder_subclass cannot trace faithfully (no subclass need be involved);
    the message names the operation, the user's source line and what to do instead."""


class UnsupportedModuleHookError(UnsupportedTracingError):
    """A module called in compiled code has hooks that cannot be compiled (backward hooks: thunder 0.2.6 cannot trace
    the ``torch.autograd.Function`` that ``nn.Module`` wraps inputs and outputs in for them)."""


class UnsupportedGlobalStateError(UnsupportedTracingError):
    """The compiled function changes torch's global state in a way the compiled program cannot reproduce: it turns
    grad mode on (``torch.enable_grad()``, ``torch.set_grad_enabled(True)``) while it is called with grad mode off
    (thunder 0.2.6 runs the compiled program under the caller's grad mode, so what eager differentiates there would not
    be), or it calls a setter of torch's global state (``torch.set_default_dtype``,
    ``torch.use_deterministic_algorithms``: run once while tracing, never by the compiled program). A graph break by
    default (the function runs eagerly); raised with ``fullgraph=True``."""


class UnsupportedCheckpointError(UnsupportedTracingError):
    """``torch.utils.checkpoint.checkpoint`` with ``use_reentrant=True`` (or without ``use_reentrant``: torch 2.13 then
    runs the reentrant variant) in compiled code: it runs the function without autograd and again in its own
    backward, which the compiled program cannot reproduce. A graph break by default (the code around it runs
    eagerly, equal to eager); raised with ``fullgraph=True``. ``use_reentrant=False`` is compiled."""


class UnsupportedAliasedWriteError(UnsupportedTracingError):
    """An in-place write (``copy_``, ``add_``, ``zero_``...) into a tensor that shares memory with another one of the
    compiled code (a view, or a tensor a view was taken of) while gradients are computed: thunder 0.2.6's autodiff
    does not connect the write to the other tensor (values and gradients would be wrong). A graph break by default
    (the code runs eagerly, equal to eager); raised with ``fullgraph=True``."""


class TraceSelfCheckError(TensorSubclassError, RuntimeError):
    """A bug in thunder_subclass, caught before it could give a wrong answer: a trace was just made from a call, and its
    own prologue (the checks that decide whether a cached trace may run a call) rejects that very call. The message
    names the failing check; the rejected entry is dropped. Please report it with the message and a small program
    that reproduces it; meanwhile, call that function (or the module holding the code the check names) uncompiled."""


class UnsupportedBackwardEffectError(UnsupportedTracingError):
    """A custom ``torch.autograd.Function``'s ``backward`` has a Python-level side effect that the compiled backward
    would drop (it runs only the tensor operations recorded while tracing): it changes in place a tensor it did not
    make (an input kept on ``ctx`` or saved for backward), writes Python state (``ctx`` attributes, globals, closure
    variables, a container or module held there) or prints. A graph break by default (the function runs eagerly);
    raised with ``fullgraph=True``."""


def format_location(filename: str | None, lineno: int | None) -> str:
    if filename is None:
        return "an unknown source line"
    return f"{filename}:{lineno}" if lineno is not None else filename


class CacheLimitWarning(UserWarning):
    """A function compiled by ``thunder_subclass.jit`` reached its cache size limit (``cache_size_limit``): calls
    that none of its cache entries accepts run eagerly from then on. Warned once per compiled function; the message
    names the check that failed."""


class DiskCacheWarning(UserWarning):
    """An entry of the on-disk cache (``thunder_subclass.config.disk_cache``) could not be read (a corrupted or
    truncated file: it was removed), or was not read because another user could have written it (owned by another
    user, or under a directory others can write: ``thunder_subclass.runtime.disk_trust``); the function compiled anew."""
