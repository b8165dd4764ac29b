"""Stage 4 (interpretation), module calls in traced code: ``nn.Module.__call__`` with its forward hooks, read once and
guarded.

In: a call ``module(*args, **kwargs)`` that thunder's interpreter meets while a plugin jit traces (it reaches the
lookaside as ``Module._call_impl(module, *args, **kwargs)``).

What happens: the module's forward pre-hooks and forward hooks are read at trace time and the interpreter runs them and
``module.forward`` as ``Module._call_impl`` would (the hooks' results replace arguments and result the same way), but
without interpreting ``_call_impl`` itself. thunder 0.2.6 interprets its hook path step by step (the ``inner()``
closure, loops over hook dicts chained with the global ones, ``try``/``except``) on every module call; tensor
parallelism puts hooks on every parallelized module, and a small transformer block's first call took three times as
long. The hooks read become part of what the trace depends on: a prologue check per module (``guards.check_module_hooks``)
makes a call after hooks were added or removed a cache miss, and a new trace runs them (thunder 0.2.6 itself never
notices such changes: a hook registered after the first call was silently not run).

Out: the call's result, traced as ``_call_impl`` would give it, and one ``check_module_hooks`` prologue check per
module called.

Global forward hooks (``register_module_forward_hook`` / ``register_module_forward_pre_hook``) run first, as in
``_call_impl``, and are part of what each module's check compares. A module with backward hooks (its own or global
ones) is a typed error (:class:`~thunder_subclass.errors.UnsupportedModuleHookError`): thunder 0.2.6 cannot trace the
autograd Function torch wraps such a module's inputs and outputs in ("'...' object has no attribute
'mark_non_differentiable'", plain thunder too). Modules that the prologue cannot reach from the inputs (a module held
only by a closure or a global) and calls under ``torch.jit`` tracing are left to thunder's own handling.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from thunder_subclass._thunder_internals import (
    hooked_module_provenance,
    interpret_call,
    is_unpackable_provenance,
    jit_context,
    module_call_impl,
    module_forward_hooks,
    module_has_backward_hooks,
    raise_in_interpreter,
    source_location,
)
from thunder_subclass.errors import UnsupportedModuleHookError, format_location
from thunder_subclass.guards import add_module_hooks_guard
from thunder_subclass.guards.state import guard_module_forward

__all__ = ["call_impl_lookaside"]


def call_impl_lookaside(fn, wrapped_args: tuple) -> Callable | None:
    """The interpreter lookaside for ``Module._call_impl(module, ...)``, or None (thunder's own handling)."""
    if fn is not module_call_impl() or not wrapped_args:
        return None
    from thunder.core.interpreter import unwrap

    wrapped_module = wrapped_args[0]
    module = unwrap(wrapped_module)
    hooks = module_forward_hooks(module)
    if hooks is None and module_has_backward_hooks(module):
        is_root = hooked_module_provenance(module, wrapped_module.provenance) is not wrapped_module.provenance
        error = _backward_hooks_error(module, is_root)
        return lambda *wargs, **wkwargs: raise_in_interpreter(error)
    jit_ctx = jit_context()
    if hooks is None or jit_ctx is None or not is_unpackable_provenance(wrapped_module.provenance):
        return None
    # the jitted module itself (the root) is reached in the prologue through thunder's ThunderModule wrapper
    holder = hooked_module_provenance(module, wrapped_module.provenance)
    add_module_hooks_guard(jit_ctx, module, holder, hooks)
    guard_module_forward(jit_ctx, module, holder)  # (a forward set on the instance, or replaced on the class)
    pre, post = hooks
    return lambda wmodule, *wargs, **wkwargs: _call_module(pre, post, wmodule, wargs, wkwargs)


def _backward_hooks_error(module, is_root: bool) -> UnsupportedModuleHookError:
    name = type(module).__qualname__
    # the caller's line, not torch's Module._wrapped_call_impl
    where = "(the compiled module itself)" if is_root else \
        f"called at {format_location(*source_location(skip_files=(torch.nn.modules.module.__file__,)))}"
    return UnsupportedModuleHookError(
        f"{name} {where} has backward hooks (register_full_backward_hook, "
        f"register_full_backward_pre_hook, register_backward_hook or a global module backward hook): thunder 0.2.6 "
        f"cannot trace the autograd Function that nn.Module wraps its inputs and outputs in for them. Remove them "
        f"from the modules the compiled function calls and register them on the object thunder_subclass.jit "
        f"returned (its hooks run eagerly around the compiled call), or use torch.Tensor.register_hook on tensors, "
        f"or call this module outside the compiled function."
    )


def _make_tuple(*items):
    return items


def _make_dict(**items):
    return items


def _one_tuple(x):
    return (x,)


def _first(pair):
    return pair[0]


def _second(pair):
    return pair[1]


def _call(f, args, kwargs):
    return f(*args, **kwargs)


def _call_module(pre: tuple, post: tuple, wmodule, wargs: tuple, wkwargs: dict):
    """``Module._call_impl`` for forward hooks ``pre`` / ``post`` (see the module docstring), on the interpreter's
    wrapped values; the loops over hooks run here, each hook and the forward are interpreted."""
    from thunder.core.interpreter import INTERPRETER_SIGNALS, unwrap, wrap_const

    raised = INTERPRETER_SIGNALS.EXCEPTION_RAISED
    args = interpret_call(_make_tuple, *wargs)
    kwargs = interpret_call(_make_dict, **wkwargs)
    for hook, with_kwargs in pre:
        if with_kwargs:
            r = interpret_call(wrap_const(hook), wmodule, args, kwargs)
            if r is raised:
                return r
            value = unwrap(r)
            if value is not None:
                if not (isinstance(value, tuple) and len(value) == 2):
                    r = interpret_call(_bad_pre_hook_result, r)
                    return r
                args, kwargs = interpret_call(_first, r), interpret_call(_second, r)
        else:
            r = interpret_call(wrap_const(hook), wmodule, args)
            if r is raised:
                return r
            value = unwrap(r)
            if value is not None:
                args = r if isinstance(value, tuple) else interpret_call(_one_tuple, r)
    forward = interpret_call(getattr, wmodule, wrap_const("forward"))
    if forward is raised:
        return forward
    result = interpret_call(_call, forward, args, kwargs)
    if result is raised:
        return result
    for hook, with_kwargs in post:
        if with_kwargs:
            r = interpret_call(wrap_const(hook), wmodule, args, kwargs, result)
        else:
            r = interpret_call(wrap_const(hook), wmodule, args, result)
        if r is raised:
            return r
        if unwrap(r) is not None:
            result = r
    return result


def _bad_pre_hook_result(value):
    raise RuntimeError(f"forward pre-hook must return None or a tuple of (new_args, new_kwargs), but got {value}.")
