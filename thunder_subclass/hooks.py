"""Wiring: which stage of the pipeline each hook into thunder calls.

``_thunder_internals`` (the bottom layer) knows thunder's side of every hook and nothing of the stages; this module,
above the stages, hands it one :class:`~thunder_subclass._thunder_internals.Handlers` naming the stage functions:

* an input tensor being proxified -> ``guards.proxify_input`` (subclass proxies with prologue guards), or
  ``torch_function.proxify_typed_input`` for a subclass that overrides only ``__torch_function__``;
* a torch-level symbol called with such a typed value -> ``torch_function.dispatch`` (its ``__torch_function__``);
* thunder's in-place alias bookkeeping (``prims.update_aliases``, new alias proxies) on a subclass value -> a
  subclass proxy for its new version (here);
* a torch-level in-place symbol on plain tensors -> ``aliased_writes.check_aliased_write`` (a write into a view with
  gradients: a graph break);
* a torch-level symbol called with a subclass proxy -> ``autograd.ensure_grad_rule`` (so autodiff differentiates
  it as PyTorch would) then ``interpretation.unroll_symbol_call`` (``__torch_dispatch__`` unrolled on fakes);
* interpreter lookasides -> ``module_calls.call_impl_lookaside`` (module calls: forward hooks read at trace time,
  guarded), ``autograd.function_apply_lookaside`` (``torch.autograd.Function`` over subclasses),
  ``distributed.lookaside`` (DTensor's ``from_local`` / ``to_local`` / ``redistribute`` / ``full_tensor`` /
  ``distribute_tensor`` and tensor-parallel hook functions, each one container symbol),
  ``torch_function.lookaside`` (typed values, ``as_subclass``, construction of such subclasses), else
  ``interpretation.subclass_lookaside`` (construction, ``isinstance``, ``type``, attributes), else ``hf.lookaside``
  (transformers functions thunder cannot trace, once transformers is imported), ``state_guards.lookaside`` (Python
  state read or changed: environment, random, clock), ``checkpoints.lookaside`` (a reentrant
  ``torch.utils.checkpoint``: a graph break), ``native_effects.lookaside`` (a native call that changes an
  object from outside the trace: ``next`` on an outside iterator, ``set.add``: a graph break);
* before executors claim operations -> ``tangents.flatten_for_executors`` (the flatten pass);
* a thunder forward call connected to autograd -> ``tangents.differentiable_outputs`` (``requires_grad`` of the
  outputs as in eager) and ``tangents.mutated_inputs`` (inputs changed in place, marked dirty);
* a thunder backward call -> ``tangents.replace_grads`` / ``tangents.run_backward`` (``.backward(grad)`` with
  gradients of another kind);
* a Python object read from the inputs while tracing -> ``guards.guard_input_object`` (its type, identity or value
  checked by the prologue; an empty parameter, buffer or submodule slot: ``state_guards.guard_module_slot``), and the arguments of a function the interpreter runs natively ->
  ``guards.guard_native_call_arguments`` (such objects then guarded by value; by identity for ``id``), and the
  operands of ``is``, ``==`` (and the other comparisons) and ``in`` -> ``guards.guard_compared_objects``;
* the end of a trace -> ``guards.write_back_input_containers`` (input lists and dicts the traced code changed get
  their new contents from the epilogue).
"""

from __future__ import annotations

import thunder.core.prims as prims
from thunder.core.pytree import tree_flatten
from thunder.core.trace import get_tracectx

from thunder_subclass import _thunder_internals, distributed, guards, hf
from thunder_subclass.transforms import (
    autograd,
    fallback_grads,
    higher_order,
    nll_loss,
    overwrites,
    random_ops,
    tangents,
)
from thunder_subclass.frontend import (
    aliased_writes,
    checkpoints,
    grad_modes,
    interpretation,
    module_calls,
    native_effects,
    torch_function,
)
from thunder_subclass.runtime import eager_calls, speculation
from thunder_subclass.guards import state as state_guards
from thunder_subclass.errors import SubclassProtocolError, format_location
from thunder_subclass.executor import subclass_executor
from thunder_subclass.frontend.fake import autocast_in_effect
from thunder_subclass.frontend.proxy import SubclassTensorProxy, has_subclass_leaf
from thunder_subclass.frontend.recording import denormalize, subclass_names, torch_callable_for

__all__ = ["install", "uninstall", "is_installed"]


def _proxify(jit_ctx, value, original):
    real = value.value
    if torch_function.is_torch_function_subclass_value(real):
        return torch_function.proxify_typed_input(jit_ctx, value, original)
    p = guards.proxify_input(jit_ctx, value, original)
    speculation.record_input(p, real)
    return p


def _symbol_call(sym, args: tuple, kwargs: dict):
    if sym.id == prims.PrimIDs.UPDATE_ALIASES:
        return _update_aliases(args, kwargs)
    if sym.id == "set_grad_enabled":
        grad_modes.check_grad_mode_change(args[0] if args else kwargs.get("enabled"))
        return _thunder_internals.NOT_HANDLED
    if sym.id == "torch.nn.functional.nll_loss":  # its backward as eager computes it (plain tensors)
        nll_loss.ensure_nll_loss_backward_rule()
    if random_ops.is_dropout(sym):  # dropout draws as eager does (plain tensors; the executor's checker decides)
        random_ops.ensure_dropout_rule(sym)
    leaves = tree_flatten((args, kwargs))[0]  # once for the three questions below (asked for every torch symbol)
    if torch_function.has_typed_leaf(leaves):
        result = torch_function.dispatch(sym, args, kwargs, torch_callable_for, denormalize)
        if result is not _thunder_internals.NOT_HANDLED:
            return result
    interpretation.check_no_nested_int(sym, leaves)
    try:
        if not has_subclass_leaf(leaves):
            aliased_writes.check_aliased_write(sym, leaves)
            if sym.name in overwrites.OVERWRITES:  # the overwritten value's zero gradient (the checker decides)
                overwrites.ensure_overwrite_rule(sym)
                return overwrites.broadcast_copy_source(sym, args, kwargs)
            return _thunder_internals.NOT_HANDLED
    except SubclassProtocolError as e:  # an input whose subclass cannot be compiled, first used here
        location = format_location(*_thunder_internals.source_location())
        # the same error type and attributes (e.g. TorchFeatureUnavailableError.needs_torch), with the location
        located = type(e).__new__(type(e), f"{e} (the tensor is an argument of {sym.name} at {location})")
        located.__dict__.update(e.__dict__)
        raise located from e
    value = speculation.item_of_subclass(sym, args, kwargs)
    if value is not speculation.NOT_SPECULATED:
        return value
    speculation.refuse_unknown_numbers(sym, args, kwargs)
    guards.require_no_dispatch_mode(f"{sym.name} on {subclass_names(args, kwargs)}")
    if autocast_in_effect():  # what autocast casts is recorded with the call, also for its backward
        return autograd.record_symbol_call_under_autocast(sym, args, kwargs)
    autograd.refuse_indexed_write_with_grad(sym, args, kwargs)
    autograd.refuse_write_through_view_with_grad(sym, args, kwargs)
    autograd.ensure_grad_rule(sym)
    return interpretation.unroll_symbol_call(sym, args, kwargs)


def _plain_symbol_result(sym, args: tuple, kwargs: dict, result) -> None:
    interpretation.set_requires_grad_as_eager(sym, args, kwargs, result)
    if _thunder_internals.is_interpreting() and len(get_tracectx().scopes) == 1:  # the user's own calls
        fallback_grads.ensure_fallback_grad(sym, args, kwargs, result)


def _new_alias(p):
    # a new version of a subclass value (after an in-place op) is a subclass proxy of the same kind
    return SubclassTensorProxy(like=p) if isinstance(p, SubclassTensorProxy) else _thunder_internals.NOT_HANDLED


def _update_aliases(args: tuple, kwargs: dict):
    (aliases,) = args
    outputs = tuple(_new_alias(a) if isinstance(a, SubclassTensorProxy) else None for a in aliases)
    if all(o is None for o in outputs):
        return _thunder_internals.NOT_HANDLED
    plain = prims.update_aliases.meta(aliases)
    outputs = tuple(o if o is not None else q for o, q in zip(outputs, plain))
    get_tracectx().peek_scope().append(prims.update_aliases.bind(aliases, output=outputs))
    return outputs


def _lookaside(fn, wrapped_args: tuple):
    return (
        speculation.lookaside(fn, wrapped_args)
        or eager_calls.lookaside(fn, wrapped_args)
        or module_calls.call_impl_lookaside(fn, wrapped_args)
        or autograd.function_apply_lookaside(fn, wrapped_args)
        or distributed.lookaside(fn, wrapped_args)
        or autograd.torch_api_lookaside(fn, wrapped_args)
        or torch_function.lookaside(fn, wrapped_args)
        or interpretation.subclass_lookaside(fn, wrapped_args)
        or hf.lookaside(fn, wrapped_args)
        or grad_modes.inference_mode_lookaside(fn, wrapped_args)
        or state_guards.lookaside(fn, wrapped_args)
        or checkpoints.lookaside(fn, wrapped_args)
        or random_ops.dropout_lookaside(fn, wrapped_args)
        or native_effects.lookaside(fn, wrapped_args)
    )


def _input_object(obj, provenance) -> None:
    if state_guards.guard_state_read(obj, provenance):  # (a read the prologue cannot unpack: none of the others)
        return
    state_guards.guard_module_slot(obj, provenance)
    guards.guard_input_object(obj, provenance)


def _attribute_absent(obj, provenance, name) -> None:
    if not state_guards.guard_tensor_attribute_absent(obj, provenance, name):
        guards.guard_attribute_absent(obj, provenance, name)


def _end_of_trace() -> None:
    grad_modes.check_grad_mode_restored()  # (first: a graph break then runs the function eagerly, nothing written)
    guards.write_back_input_containers()


HANDLERS = _thunder_internals.Handlers(
    executor=subclass_executor,
    proxify=_proxify,
    symbol_call=_symbol_call,
    plain_symbol_result=_plain_symbol_result,
    prim_ids=frozenset({prims.PrimIDs.UPDATE_ALIASES}),
    new_alias=_new_alias,
    lookaside=_lookaside,
    before_executors=tangents.flatten_for_executors,
    differentiable_outputs=tangents.differentiable_outputs,
    replace_grads=tangents.replace_grads,
    run_backward=tangents.run_backward,
    mutated_inputs=tangents.mutated_inputs,
    gradless_inputs=tangents.gradless_inputs,
    create_graph_backward=higher_order.create_graph_backward,
    input_object=_input_object,
    native_call=guards.guard_native_call_arguments,
    compared=guards.guard_compared_objects,
    end_of_trace=_end_of_trace,
    attribute_absent=_attribute_absent,
    state_query=guards.guard_torch_state_query,
    nested_int_source=guards.nested_int_source,
)


def install() -> None:
    """Install the hooks into thunder (idempotent); ``thunder_subclass.jit`` and the plugin call it."""
    _thunder_internals.install(HANDLERS)


def uninstall() -> None:
    """Remove the hooks, restoring thunder's own functions (see ``_thunder_internals.uninstall``)."""
    _thunder_internals.uninstall()


def is_installed() -> bool:
    return _thunder_internals.is_installed()
