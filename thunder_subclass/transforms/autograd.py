"""Stage 5 (autograd), subclass operations differentiate above ``__torch_dispatch__``, as in PyTorch.

PyTorch runs autograd above the Python dispatch key: a torch op on a subclass is differentiated with the op's own
derivative formula, and the backward's torch ops go through the subclass's ``__torch_dispatch__`` again. Here the
same happens at trace time, on fake subclass instances.

In: a torch-level symbol unrolled on subclass proxies, a ``torch.autograd.Function`` call, or a container call.
What happens: a grad rule is registered for it (below). Out: the rule, which thunder's autodiff calls, and the
``grad_<op>`` bound symbols it records:

* Every torch-level symbol that was unrolled on subclass proxies gets a grad rule in the plugin's executor
  (``OperatorExecutor.register_implementation(sym, checker=..., grad_transform=...)``, the public route thunder's
  autodiff consults first). The rule runs the torch operation on fakes that require grad, records the forward as
  the usual subclass-level bound symbol, then runs ``torch.autograd.grad`` on the fakes: PyTorch's derivative
  formula executes through the subclass's dispatch, and the aten calls it makes on inner tensors are recorded as
  the subsymbols of one ``grad_<op>`` bound symbol (metadata of every gradient known at trace time).
* Gradient *types* follow eager: the gradient of a ``TwoTensor`` parameter is a ``TwoTensor``; a plain parameter
  that meets a ``TwoTensor`` gets a ``TwoTensor`` gradient, as in eager. Because a gradient's type is only known once
  the operations after it have been differentiated, ``grad_<op>`` is first recorded for the gradient types PyTorch
  would guess (those of the outputs) and is re-recorded by the flatten pass (``thunder_subclass.transforms.flatten``) if
  the gradients that actually reach it have other types; it keeps a :class:`GradRecipe` (the fake autograd graph) for
  that.
* ``torch.autograd.Function`` calls that involve subclasses are one ``<Function>_apply`` symbol, differentiated with
  the Function's own ``backward`` (run by PyTorch's autograd on fakes).
* The plugin's own boundary symbols (``flatten_*``, ``unflatten_*``, ``aten_*``) are constants for autodiff
  (``thunder_subclass.executor.register_constant_symbol``).

The forward of a rule is recorded with the same machinery as unrolling (``thunder_subclass.frontend.recording``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch._ops import OpOverload, OpOverloadPacket
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

import thunder.core.dtypes as dtypes
import thunder.core.prims as prims
from thunder.core.interpreter import interpreter_needs_wrap, unwrap
from thunder.core.proxies import Proxy, TensorProxy
from thunder.core.pytree import tree_flatten, tree_map
from thunder.core.symbol import Symbol
from thunder.core.trace import get_tracectx

from thunder_subclass.frontend.aliased_writes import NOT_VALUE_WRITES
from thunder_subclass.frontend.aten_symbols import recording_backward
from thunder_subclass.transforms.backward_effects import backward_effect_error
from thunder_subclass.executor import register_symbol, subclass_executor, unique_operator_name
from thunder_subclass.frontend.fake import FakeEnv, autocast_context, autocast_in_effect, fake_execution
from thunder_subclass.frontend.proxy import SubclassTensorProxy, has_subclass_proxy, proxy_kind
from thunder_subclass.frontend.recording import (
    RecordingMode,
    bind_unrolled,
    call_location,
    denormalize,
    dispatch_error,
    emit_calls,
    is_traced_grad_enabled,
    op_name,
    record_call,
    subclass_names,
    torch_callable_for,
)
from thunder_subclass.frontend.interpretation import (
    INPLACE_VIEW_OPS, STORAGE_QUERIES, is_answered_from_metadata, storage_query_error, subclass_class_attribute,
)
from thunder_subclass.rules import call_rule, find_grad_rule
from thunder_subclass._thunder_internals import (
    SymbolicSizeError, add_size_guards, current_call_has_grad_inputs, holds_mask, newest_version, raise_in_interpreter,
    runs_natively, source_location, thunder_resolves_method, torch_to_thunder_symbols,
)
from thunder_subclass.errors import (
    SubclassDispatchError, UnsupportedSubclassOperationError, UnsupportedTracingError, format_location,
)

__all__ = [
    "GradRecipe", "ensure_grad_rule", "ensure_plain_rule", "is_grad_bsym", "is_container_bsym", "record_backward",
    "differentiate_call",
    "record_forward", "record_gradient", "grad_recipe_of", "record_container_again",
    "function_apply_lookaside", "container_symbol", "record_function_call", "torch_api_lookaside",
    "apply_torch_callable",
]


class GradRecipe:
    """What ``grad_<op>`` needs to (re-)record its backward: the fake autograd graph of the forward.

    Attributes: ``env`` (proxies <-> fakes of the forward), ``fake_inputs`` / ``fake_outputs`` (the fakes that
    require grad / carry gradients), ``input_proxies`` / ``outputs`` (the proxies the gradients are for / of),
    ``forward_again`` (records the forward again for new arguments, with a new recipe), ``what`` /
    ``subclasses`` (for error messages), ``positions`` (for each output of ``grad_<op>``, the input whose
    gradient it is) and ``grad_kinds`` (the gradient kinds its subsymbols were first recorded for; thunder's autodiff
    substitutes the actual gradients into the bound symbol's arguments later).
    """

    def __init__(self, env, fake_inputs, fake_outputs, input_proxies, what, subclasses):
        self.env = env
        self.fake_inputs = fake_inputs
        self.fake_outputs = fake_outputs
        self.input_proxies = input_proxies
        self.what = what
        self.subclasses = subclasses
        self.positions: tuple[int, ...] = ()
        self.grad_kinds: tuple = ()
        self.saved: tuple = ()
        self.outputs: tuple = ()
        self.location: tuple | None = None  # the user's source line of the call (file, line)
        # (args, kwargs) -> (outputs, GradRecipe): the forward recorded again (with grad) for other arguments, in the
        # current scope; the flatten pass uses it where the arguments' kinds changed after recording
        self.forward_again: Callable | None = None

    def __repr__(self) -> str:
        return f"GradRecipe({self.what})"


# ---------------------------------------------------------------------------------------------------------------
# Symbols
# ---------------------------------------------------------------------------------------------------------------

_grad_symbols: dict[str, Symbol] = {}
_grad_ids: set[str] = set()
_rules: set[Any] = set()


def _not_called_directly(*args, **kwargs):
    raise RuntimeError("thunder_subclass's grad symbols are bound by its grad rules only")


def grad_symbol(op_name: str) -> Symbol:
    """``grad_<op>``: the backward of one subclass-level operation (subsymbols: the unrolled backward)."""
    sym = _grad_symbols.get(op_name)
    if sym is None:
        sym = register_symbol(f"grad_{op_name}", meta=_not_called_directly, fn=_not_called_directly)
        _grad_symbols[op_name] = sym
        _grad_ids.add(sym.id)
    return sym


def is_grad_bsym(bsym) -> bool:
    return bsym.sym.id in _grad_ids


def ensure_grad_rule(sym: Symbol) -> None:
    """Register (once) the grad rule of torch-level symbol ``sym`` for calls with subclass arguments."""
    if sym.id in _rules:
        return
    _rules.add(sym.id)

    def grad_transform(*args, **kwargs):
        rule = find_grad_rule(sym.id, args, kwargs)
        if rule is not None:  # registered with thunder_subclass.register_grad_rule
            return call_rule(rule, args, kwargs)
        targs, tkwargs = denormalize(sym, args, kwargs)
        fn = torch_callable_for(sym, targs, tkwargs)
        return differentiate_call(sym, fn, args, kwargs, op_name(fn), subclass_names(args, kwargs),
                                  call_args=(targs, tkwargs))

    _subclass_rules[sym.id] = grad_transform
    _register(sym)


def _gradients_involved(args: tuple, kwargs: dict) -> bool:
    """A tensor argument requires grad, or an input of the compiled call does (thunder then differentiates the trace,
    under ``no_grad`` too)."""
    return any(isinstance(p, TensorProxy) and p.requires_grad for p in tree_flatten((args, kwargs))[0]) \
        or current_call_has_grad_inputs()


def refuse_indexed_write_with_grad(sym: Symbol, args: tuple, kwargs: dict) -> None:
    """``h[key] = v`` with a subclass on either side and a tensor that requires grad raises a typed error: torch's
    ``setitem_`` gives no value, so the recorded write has no output to differentiate and is dropped (eager's value
    and gradients lost silently; under ``no_grad`` too, when an input of the compiled call requires grad: thunder
    differentiates the trace then). Without such tensors the write runs as recorded."""
    if sym.name != "setitem_":
        return
    if not _gradients_involved(args, kwargs):
        return
    location = format_location(*source_location())
    raise UnsupportedSubclassOperationError(
        f"indexed assignment (tensor[key] = value, torch's setitem_) on {subclass_names(args, kwargs)} at "
        f"{location} with a tensor that requires grad is not supported by thunder_subclass: the write would be "
        "lost. Write it out of place (h = torch.slice_scatter(h, v, dim, start, end), h = h.index_put((idx,), v), "
        "torch.where(mask, v, h)), or assign into tensors that do not require grad (.detach()).")


def refuse_write_through_view_with_grad(sym: Symbol, args: tuple, kwargs: dict) -> None:
    """An in-place write (``copy_``, ``add_``...) into a view (``h[1:]``, ``h.view(-1)``, ``h.t()``) with a subclass
    among the arguments raises a typed error when gradients are involved: thunder's alias updates give the view's
    base a new version that autodiff does not connect to the write, so later reads of the base had wrong values and
    gradients."""
    if not sym.name.endswith("_") or sym.name in NOT_VALUE_WRITES:
        return
    dest = next((p for p in tree_flatten((args, kwargs))[0] if isinstance(p, TensorProxy)), None)
    if dest is None:
        return
    import thunder.torch as ltorch

    trace = get_tracectx()
    views = (*ltorch._syms_returning_views, *ltorch._syms_that_may_return_views)
    producer = next((b for scope in getattr(trace, "scopes", [trace.bound_symbols]) for b in scope
                     if any(o is dest for o in b.flat_proxy_outs)), None)
    if producer is None or producer.sym not in views:
        return
    if not _gradients_involved(args, kwargs):
        return
    location = format_location(*source_location())
    raise UnsupportedSubclassOperationError(
        f"{sym.name} into a view ({producer.sym.name}) with {subclass_names(args, kwargs)} at {location} with a "
        "tensor that requires grad is not supported by thunder_subclass: the view's base would not see the write in "
        "its gradient. Write the base out of place (h = torch.slice_scatter(h, v, dim, start), torch.where), or "
        "apply the operation to the whole tensor.")


_subclass_rules: dict[Any, Callable] = {}  # sym.id -> grad transform for calls with subclass arguments
_plain_rules: dict[Any, tuple] = {}  # sym.id -> (checker, execution_transform, grad_transform) for plain calls


def ensure_plain_rule(sym: Symbol, checker: Callable, execution_transform: Callable, grad_transform: Callable) -> None:
    """Register (once) an implementation and grad rule of torch-level symbol ``sym`` for calls without subclass
    arguments that ``checker`` accepts (``random_ops``: dropout as eager draws it). One executor holds one
    implementation per symbol: this one and the subclass rule of :func:`ensure_grad_rule` share it."""
    if sym.id in _plain_rules:
        return
    _plain_rules[sym.id] = (checker, execution_transform, grad_transform)
    _register(sym)


def _register(sym: Symbol) -> None:
    subclass_rule, plain = _subclass_rules.get(sym.id), _plain_rules.get(sym.id)

    def checker(*args, **kwargs):
        if has_subclass_proxy(args, kwargs):
            return subclass_rule is not None
        return plain is not None and plain[0](*args, **kwargs)

    def execution_transform(*args, **kwargs):
        if plain is None or has_subclass_proxy(args, kwargs):
            # the flatten pass removes subclass-level symbols before executors claim
            raise RuntimeError(f"thunder_subclass: subclass-level {sym.name} reached an executor")
        return plain[1](*args, **kwargs)

    def grad_transform(*args, **kwargs):
        if has_subclass_proxy(args, kwargs):
            return subclass_rule(*args, **kwargs)
        return plain[2](*args, **kwargs)

    subclass_executor.register_implementation(
        sym, checker=checker, execution_transform=execution_transform, grad_transform=grad_transform
    )


# ---------------------------------------------------------------------------------------------------------------
# The grad rule
# ---------------------------------------------------------------------------------------------------------------


def _wants_grad(trace) -> Callable[[TensorProxy], bool]:
    # differentiable: inexact dtype (thunder's own criterion), except inputs of the trace that do not require grad and
    # intermediate values that do not require grad in eager (interpretation records it on their proxies: a result
    # computed by a subclass's __torch_function__ on inner tensors only, then anything computed from it alone)
    inputs = {p.name: p for p in tree_flatten((trace.args, trace.kwargs))[0] if isinstance(p, TensorProxy)}

    def wants_grad(p: TensorProxy) -> bool:
        if not dtypes.is_inexact_dtype(p.dtype):
            return False
        q = inputs.get(p.name)
        return bool(q.requires_grad) if q is not None else bool(p.requires_grad)

    return wants_grad


def differentiate_call(sym: Symbol, fn: Callable, args: tuple, kwargs: dict, what: str, subclasses: str,
                       call_args: tuple | None = None):
    """The grad transform: forward (one subclass-level bound symbol), then ``get_grad`` of the outputs,
    ``grad_<op>`` (the unrolled PyTorch derivative) and ``put_grad`` of the inputs. ``fn`` is called with
    ``call_args`` (positional, keyword) when given, else with ``args``/``kwargs`` (those of the bound symbol)."""
    newest = _newest_versions(tree_flatten((args, kwargs))[0])
    if newest:  # values a grad rule before this one recorded again (autodiff's joint trace): the new proxies
        args, kwargs, call_args = tree_map(lambda x: newest.get(id(x), x), (args, kwargs, call_args))
    if call_args is None:
        def call_for(a, k):
            return fn, a, k
    else:
        def call_for(a, k):
            if a is args and k is kwargs:
                return (fn, *call_args)
            targs, tkwargs = denormalize(sym, a, k)
            return torch_callable_for(sym, targs, tkwargs), targs, tkwargs

    result, recipe = record_forward(sym, call_for, args, kwargs, what, subclasses)
    if recipe is None:
        return result
    return record_gradient(recipe, result, sym.name)


def _newest_versions(flat: list) -> dict:
    """id -> newest proxy for the subclass arguments that autodiff has recorded again under a new proxy and whose
    flatten context holds state outside tensors that the new recording made anew (DTensor's ``_MaskPartial`` mask:
    the new mask is computed in the joint trace, the old one is not)."""
    found = {}
    for p in flat:
        if isinstance(p, SubclassTensorProxy) and holds_mask(p.flatten_ctx, unreduced=False):
            q = newest_version(p)
            if q is not p and isinstance(q, SubclassTensorProxy) and q.subclass_type is p.subclass_type:
                found[id(p)] = q
    return found


def record_forward(sym: Symbol, call_for: Callable, args: tuple, kwargs: dict, what: str, subclasses: str):
    """The forward of a grad rule: ``sym(*args, **kwargs)`` recorded as one subclass-level bound symbol in the current
    scope, its torch callable (``call_for(args, kwargs) -> (fn, call args, call kwargs)``) run on fakes that require
    grad. Returns the outputs and the :class:`GradRecipe` for its backward (None when nothing is differentiable).
    The recipe can record the forward again for other arguments (:meth:`GradRecipe.record_forward_again`)."""
    trace = get_tracectx()
    forward: list = []
    fn, cargs, ckwargs = call_for(args, kwargs)
    location = call_location(sym, args, kwargs)  # the user's line (thunder knows none while differentiating)
    env, fake_out, result = record_call(fn, cargs, ckwargs, forward, what, subclasses, wants_grad=_wants_grad(trace),
                                        location=location)
    # a call of a Python callable (a Function's apply) that changed arguments in place: what its backward reads of them
    # is the argument (see below), whose changes the forward must keep
    in_place_call = bool(env.mutated) and sym.id in _container_ids
    if in_place_call:
        _keep_inner_updates_in_forward(env, tree_flatten((args, kwargs))[0], forward)
    result = bind_unrolled(sym, args, kwargs, result, forward)
    if isinstance(result, TensorProxy) and any(result is a for a in tree_flatten((args, kwargs))[0]):
        return result, None  # the op returned its input: the gradient passes through unchanged
    if in_place_call:
        env.read_inputs_in_place(tree_flatten((args, kwargs))[0])
    recipe = _grad_recipe(env, args, kwargs, fake_out, result, what, subclasses)
    if recipe is not None:
        recipe.location = location
        recipe.forward_again = lambda a, k: record_forward(sym, call_for, a, k, what, subclasses)
        # on the output, keyed by the symbol (an output may also be one of a subsymbol's, see grad_recipe_of)
        recipe.outputs[0].__dict__.setdefault(_RECIPE, {})[sym.id] = recipe
    return result, recipe


_RECIPE = "_thunder_subclass_grad_recipes"


def _inner_updates_meta(versions: tuple, x, **kwargs) -> None:
    return None


def _inner_updates_impl(versions: tuple, x, **kwargs) -> None:
    return None


# thunder's forward/backward split (``transforms/autodiff.py`` ``split_into_forward_and_backward``) keeps in the forward
# what the forward's outputs and arguments need, and a symbol named ``copy_`` whose destination is one of those; the
# copies a recorded call makes into the inner tensors of a subclass argument write to values the split does not know
# as the argument's. This no-op (named ``copy_``, destination: the argument, sources: the new inner versions) ties
# them to it, so they run with the forward, as in eager, not with the backward.
_inner_updates = subclass_executor.register_operator(
    "copy_" if "copy_" not in subclass_executor.opmap else unique_operator_name("copy_"),
    meta=_inner_updates_meta, fn=_inner_updates_impl, tags=[prims.OpTags.DONT_DCE],
)


def _keep_inner_updates_in_forward(env: FakeEnv, inputs: list, scope: list) -> None:
    for p in inputs:
        versions = env.new_inner_versions([p]) if isinstance(p, SubclassTensorProxy) else ()
        if versions:
            scope.append(_inner_updates.bind(tuple(versions), p, output=None))


def grad_recipe_of(bsym) -> GradRecipe | None:
    """The recipe of the backward that a grad rule recorded with the forward bound symbol ``bsym`` (None for a
    symbol recorded without one)."""
    for o in bsym.flat_proxy_outs:
        recipe = o.__dict__.get(_RECIPE, {}).get(bsym.sym.id)
        if recipe is not None:
            return recipe
    return None


def _grad_recipe(env: FakeEnv, args, kwargs, fake_out, result, what: str, subclasses: str) -> GradRecipe | None:
    input_proxies, fake_inputs = [], []
    for a in tree_flatten((args, kwargs))[0]:
        if isinstance(a, TensorProxy):
            fake = env.to_fake(a)
            if fake.requires_grad and not any(a is q for q in input_proxies):
                input_proxies.append(a)
                fake_inputs.append(env.grad_input(fake))
    outs, fakes = [], []
    for p, f in zip(torch.utils._pytree.tree_leaves(result), torch.utils._pytree.tree_leaves(fake_out)):
        if isinstance(f, torch.Tensor) and f.requires_grad and isinstance(p, TensorProxy):
            outs.append(p)
            fakes.append(f)
    if not input_proxies or not outs:
        return None
    recipe = GradRecipe(env, fake_inputs, fakes, input_proxies, what, subclasses)
    recipe.outputs = tuple(outs)
    recipe.saved = (*input_proxies, *outs)  # as recorded; thunder's autodiff may rename them in the bound symbol
    return recipe


def record_gradient(recipe: GradRecipe, result, op_name: str):
    """Record get_grad of the outputs / ``grad_<op_name>`` / put_grad of the inputs for a forward recorded on fakes
    (``recipe``); returns ``result``."""
    grads = [prims.get_grad(p) for p in recipe.outputs]
    try:
        input_grads, subsymbols = record_backward(recipe, grads)
    except SubclassDispatchError as e:
        # PyTorch's backward of this call fails (an inner op without a derivative: torchao's int4 matmul): in eager
        # the forward runs and its result requires grad, and .backward() raises. So here: the forward compiles and
        # the backward raises this error (naming the user's line) when it runs
        return _raise_in_backward(recipe, grads, e, result)
    # values the backward reads besides the gradients and the recorded inputs/outputs (a Function's backward changing
    # a tensor it kept on ctx reads the version its forward left): saved for backward too
    recipe.saved = (*recipe.saved, *_read_but_not_given(subsymbols, (*grads, *recipe.saved)))
    recipe.grad_kinds = tuple(proxy_kind(g) for g in grads)  # what the subsymbols below are recorded for
    recipe.positions = tuple(
        i for i, g in enumerate(input_grads) if g is not None and not any(g is x for x in grads)
    )
    produced = tuple(input_grads[i] for i in recipe.positions)
    bsym = grad_symbol(op_name).bind(tuple(grads), recipe.saved, recipe, output=produced, subsymbols=subsymbols)
    get_tracectx().peek_scope().append(bsym)
    for p, g in zip(recipe.input_proxies, input_grads):
        if g is not None:
            prims.put_grad(p, g)
    return result


def _read_but_not_given(bsyms: list, given: tuple) -> list:
    known = {p.name for p in given if isinstance(p, Proxy)}
    read: list = []
    for b in bsyms:
        for p in b.flat_proxy_args:
            if p.name not in known:
                known.add(p.name)
                read.append(p)
        known.update(p.name for p in b.flat_proxy_outs)
    return [p for p in read if isinstance(p, TensorProxy)]


def _backward_error_meta(grads: tuple, message: str, like: tuple) -> tuple:
    return tuple(TensorProxy(like=p, requires_grad=False) for p in like)


def _backward_error_impl(grads: tuple, message: str, like: tuple) -> tuple:
    raise SubclassDispatchError(message)


# in the backward (it reads the incoming gradients); never dead code: it stands for a failing backward
_backward_error = subclass_executor.register_operator(
    unique_operator_name("backward_error"), meta=_backward_error_meta, fn=_backward_error_impl,
    tags=[prims.OpTags.DONT_DCE],
)


def _raise_in_backward(recipe: GradRecipe, grads: list, error: Exception, result):
    like = tuple(p for p in recipe.input_proxies if not isinstance(p, SubclassTensorProxy))
    outs = _backward_error_meta(tuple(grads), str(error), like)
    get_tracectx().peek_scope().append(_backward_error.bind(tuple(grads), str(error), like, output=outs))
    for p, g in zip(like, outs):
        prims.put_grad(p, g)
    return result


def record_backward(recipe: GradRecipe, grads, saved=None) -> tuple[list, list]:
    """Run PyTorch's backward of the recorded forward on fakes, for gradients ``grads`` (proxies of any kind);
    return the input gradients (proxies or None) and the recorded bound symbols. ``saved``: the current proxies of
    the values the recipe recorded as ``recipe.saved`` (thunder's autodiff renames them after recording)."""
    env = recipe.env.copy()
    for old, new in zip(recipe.saved, saved or ()):
        env.rename(old, new)
    mark = len(env.subclass_inputs)
    fake_grads = [env.to_fake(g, outer_size=_ragged_size_of(g, out)) for g, out in zip(grads, recipe.fake_outputs)]
    recorder = RecordingMode(env)
    try:
        with fake_execution(env=env), torch.enable_grad(), recorder:
            fake_input_grads = torch.autograd.grad(
                recipe.fake_outputs, recipe.fake_inputs, fake_grads, retain_graph=True, allow_unused=True
            )
    except Exception as e:
        raise dispatch_error(f"the backward of {recipe.what}", recipe.subclasses, e, recipe.location) from e
    scope: list = []
    with recording_backward():
        input_grads = emit_calls(env, recorder.calls, list(fake_input_grads), scope,
                                 f"the backward of {recipe.what}", recipe.subclasses, flatten_from=mark)
    if env.symbols is not None:  # symbolic sizes: the backward may rely only on what the prologue checks
        try:
            add_size_guards(env.symbols)
        except SymbolicSizeError as e:
            raise UnsupportedTracingError(
                f"the backward of {recipe.what} on {recipe.subclasses} cannot be traced with symbolic sizes ({e}); "
                "pass dynamic=False to thunder_subclass.jit (or cache=\"constant values\") for one trace per size."
            ) from e
    return input_grads, scope


def _ragged_size_of(grad, fake_output) -> tuple | None:
    """The size for the fake of gradient ``grad`` when it has ragged sizes: its output's (a NestedTensor output traced
    again has a new nested int; its gradient is of the same ragged structure), else None (the gradient's own)."""
    if isinstance(grad, SubclassTensorProxy) and grad.nested_sizes and isinstance(fake_output, torch.Tensor) \
            and len(fake_output.shape) == len(grad.outer_size):
        return tuple(fake_output.shape)
    return None


# ---------------------------------------------------------------------------------------------------------------
# torch.autograd.Function over subclasses
# ---------------------------------------------------------------------------------------------------------------

_container_ids: set[str] = set()
_function_symbols: dict[Callable, Symbol] = {}


def is_container_bsym(bsym) -> bool:
    """A call of a user ``torch.autograd.Function`` recorded by thunder_subclass (inlined by the flatten pass)."""
    return bsym.sym.id in _container_ids


def container_symbol(fn: Callable, name: str, what: str) -> Symbol:
    """A container symbol for the Python callable ``fn`` (one per callable) whose calls thunder_subclass records
    itself (a ``torch.autograd.Function``'s ``apply``, DTensor's ``from_local`` / ``redistribute``, a torch operation
    thunder has no symbol for, a custom op called from user code): a call of it in traced code is recorded as ONE bound
    symbol whose subsymbols are the aten calls ``fn`` makes on fakes (the flatten pass inlines them), and it is
    differentiated by PyTorch's autograd on fakes (``torch.autograd.grad`` through whatever ``fn`` did: a Function's
    own ``backward``, DTensor's backward collectives). ``name`` names the symbol in traces, ``what`` the callable in
    error messages."""
    sym = _function_symbols.get(fn)
    if sym is None:
        sym = subclass_executor.register_operator(
            unique_operator_name(name), meta=_not_called_directly, fn=_not_called_directly
        )  # not constant for autodiff: differentiated through fn on fakes (below)
        _function_symbols[fn] = sym
        _container_ids.add(sym.id)
        _container_calls[sym.id] = (fn, name, what)

        def grad_transform(*args, **kwargs):
            return differentiate_call(sym, fn, args, kwargs, what, subclass_names(args, kwargs))

        from thunder.core.transforms import register_grad

        register_grad(sym, grad_transform)
    return sym


_container_calls: dict[str, tuple[Callable, str, str]] = {}  # symbol id -> (fn, name, what) of container_symbol


def record_container_again(bsym):
    """Record the container call ``bsym`` (of a :func:`container_symbol`) again in the current scope, for its current
    arguments; returns its outputs."""
    fn, name, what = _container_calls[bsym.sym.id]
    return record_function_call(fn, name, what, *bsym.args, **bsym.kwargs)


def record_function_call(fn: Callable, name: str, what: str, /, *args, **kwargs):
    """``fn(*args, **kwargs)`` in traced code, recorded as one bound symbol of :func:`container_symbol` (``fn``, ``name``)
    with the aten calls ``fn`` made on fakes as subsymbols; returns its outputs as proxies. Under autocast (entered
    around the call or in the traced code), the symbol is that of ``fn`` under this autocast state
    (:func:`under_autocast`)."""
    states = autocast_in_effect()
    if states:
        fn, name = under_autocast(fn, states), f"{name}_{_autocast_suffix(states)}"
    sym = container_symbol(fn, name, what)
    scope: list = []
    _, _, result = record_call(fn, args, kwargs, scope, what, subclass_names(args, kwargs))
    return bind_unrolled(sym, args, kwargs, result, scope)


_autocast_callables: dict = {}  # (callable, autocast states) -> the callable run under them


def under_autocast(fn: Callable, states: tuple) -> Callable:
    """``fn`` run under exactly the autocast state ``states`` (one callable per pair, so one container symbol). A
    call made under autocast is recorded as a call of this: what autocast casts is then part of the call wherever it
    is recorded again (its backward, recorded by the grad transform after tracing, when thunder's autocast stack is
    empty; eager's backward does not run under the forward's autocast, and neither does this one's)."""
    key = (fn, states)
    wrapped = _autocast_callables.get(key)
    if wrapped is None:
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with autocast_context(states):
                return fn(*args, **kwargs)

        _autocast_callables[key] = wrapped
    return wrapped


def _autocast_suffix(states: tuple) -> str:
    return "autocast_" + "_".join(f"{d}_{str(t).removeprefix('torch.')}" if on else f"{d}_off" for d, t, on in states)


def record_symbol_call_under_autocast(sym: Symbol, args: tuple, kwargs: dict):
    """``sym(*args, **kwargs)`` (some args are subclass proxies) at a point of the traced code where autocast is on:
    recorded as the call of its torch callable under this autocast state (:func:`record_function_call`)."""
    targs, tkwargs = denormalize(sym, args, kwargs)
    fn = torch_callable_for(sym, targs, tkwargs)
    return record_function_call(fn, sym.name, op_name(fn), *targs, **tkwargs)


def autograd_function_symbol(cls: type) -> Symbol:
    """``<Function>_apply``: one symbol per ``torch.autograd.Function`` class, differentiated with the class's
    own ``backward`` (run by PyTorch's autograd on fakes, as in eager)."""
    return container_symbol(cls.apply, f"{cls.__name__}_apply", f"{cls.__qualname__}.apply")


@runs_natively
def apply_torch_callable(fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` in traced code, recorded by thunder_subclass (:func:`container_symbol`) because thunder
    has no symbol for it: a torch operation on subclass values (``x.fill_(1.0)``), a custom op (``torch.ops.ns.op``)."""
    what = op_name(fn)
    return record_function_call(fn, "torch_" + "".join(c if c.isalnum() else "_" for c in what.split(".")[-1]), what,
                                *args, **kwargs)


def _autograd_inside_compiled_code(fn, *args, **kwargs):
    raise UnsupportedSubclassOperationError(
        f"torch.autograd.{fn.__name__} called inside a thunder_subclass-compiled function at "
        f"{format_location(*source_location())}: thunder 0.2.6 cannot trace a backward pass inside the program it "
        f"compiles. Compile the forward only and call .backward() / torch.autograd.grad on its output outside the "
        f"compiled function (its backward is compiled too)."
    )


def _requires_grad_inside_compiled_code(obj, *args, **kwargs):
    if isinstance(obj, SubclassTensorProxy):
        what = f"a {obj.subclass_type.__name__}"
    elif isinstance(obj, torch.Tensor) and hasattr(type(obj), "__tensor_flatten__"):  # a subclass value
        what = f"a {type(obj).__name__}"
    else:
        what = "a tensor"
    raise UnsupportedSubclassOperationError(
        f"Tensor.requires_grad_() on {what} at {format_location(*source_location())}: it makes a new autograd leaf "
        f"inside the compiled function, which thunder 0.2.6's autograd cannot return as a leaf (the outputs are "
        f"results of one autograd function). Call requires_grad_() outside the compiled function and pass the "
        f"tensor in."
    )


def _storage_query_inside_compiled_code(obj, name, *default):
    raise storage_query_error(name)  # at the attribute read: thunder's interpreter fails on a bound method of an input


def _thunder_has(fn: Callable) -> bool:
    try:
        return fn in torch_to_thunder_symbols()
    except TypeError:
        return False


def _op_namespace(op) -> str:
    return op._schema.name.split("::")[0] if hasattr(op, "_schema") else op._qualified_op_name.split("::")[0]


def torch_api_lookaside(fn, wrapped_args: tuple) -> Callable | None:
    """Lookasides for torch APIs thunder 0.2.6 has no symbol for, recorded by :func:`apply_torch_callable`:
    custom ops (``torch.ops.<ns>.<op>``, e.g. torchao's ``dequantize_affine`` that a subclass method calls) with
    tensor arguments, and torch functions / tensor methods (``x.fill_``) with subclass arguments."""
    if fn is torch.autograd.grad or fn is torch.autograd.backward:
        if any(isinstance(unwrap(a), TensorProxy) for a in tree_flatten(list(wrapped_args))[0]):
            return interpreter_needs_wrap(functools.partial(_autograd_inside_compiled_code, fn))
        return None
    if fn is getattr and len(wrapped_args) in (2, 3):
        obj, name = unwrap(wrapped_args[0]), unwrap(wrapped_args[1])
        if isinstance(obj, TensorProxy) and name == "requires_grad_":
            return interpreter_needs_wrap(lambda o, n, *d: functools.partial(_requires_grad_inside_compiled_code, o))
        if isinstance(obj, TensorProxy) and name in STORAGE_QUERIES:
            return interpreter_needs_wrap(_storage_query_inside_compiled_code)
        if isinstance(obj, SubclassTensorProxy) and isinstance(name, str) and not name.startswith("__") \
                and name not in INPLACE_VIEW_OPS:  # those rebind the caller's variable (interpretation)
            method = getattr(torch.Tensor, name, None)
            if callable(method) and not _thunder_has(method) and not thunder_resolves_method(name) \
                    and not subclass_class_attribute(obj.subclass_type, name)[1] and name not in obj.inner \
                    and not is_answered_from_metadata(obj, name):
                return interpreter_needs_wrap(lambda o, n, *d: functools.partial(apply_torch_callable, method, obj))
        return None
    if isinstance(fn, (OpOverload, OpOverloadPacket)) and (_op_namespace(fn) not in ("aten", "prim", "prims")
                                                          or _op_namespace(fn) == "aten" and not _thunder_has(fn)):
        # a custom op, or an aten op called in user code (torch.ops.aten.sin(x)), which thunder refused ("aten.sin is
        # not registered"): run on fakes and recorded, with PyTorch's autograd for its gradient
        if any(isinstance(unwrap(a), TensorProxy) for a in tree_flatten(list(wrapped_args))[0]):
            return interpreter_needs_wrap(functools.partial(apply_torch_callable, fn))
        return None
    if getattr(fn, "__module__", None) in ("torch", "torch._C._VariableFunctions", "torch.nn.functional") \
            and callable(fn) and not isinstance(fn, type) and not _thunder_has(fn):
        if has_subclass_proxy([unwrap(a) for a in wrapped_args], {}):
            return interpreter_needs_wrap(functools.partial(apply_torch_callable, fn))
    if _is_nested_api(fn):
        # torch.nested's functions (nested_tensor_from_jagged, as_nested_tensor, to_padded_tensor, ...) build or take
        # jagged NestedTensors; interpreted, they reach torch's module-level dummy NestedTensor (an input thunder
        # cannot unpack): run on fakes as one call, with plain tensor arguments too
        if any(isinstance(unwrap(a), TensorProxy) for a in tree_flatten(list(wrapped_args))[0]):
            return interpreter_needs_wrap(functools.partial(apply_torch_callable, fn))
    return None


def _is_nested_api(fn: Any) -> bool:
    return _nested_api().get(id(fn)) is fn


@functools.cache
def _nested_api() -> dict:
    """``id(f) -> f`` for torch.nested's functions (by identity: some callables are unhashable)."""
    import torch.nested
    import torch.nested._internal.nested_tensor as njt

    fns = [getattr(torch.nested, name) for name in torch.nested.__all__]
    # the module's own constructors that torch's jagged ops and PyTorch's tests call (nested_from_padded: the dense ->
    # jagged conversion), which reach the same dummy through _nt_view_dummy
    fns += [getattr(njt, name) for name in ("nested_from_padded", "nested_view_from_values_offsets",
                                            "nested_view_from_values_offsets_lengths") if hasattr(njt, name)]
    return {id(f): f for f in fns}


def involves_subclass(cls: type, args: tuple, kwargs: dict) -> bool:
    """Whether ``cls.apply`` must be recorded by thunder_subclass for arguments like these (tried on fakes): it returns
    a tensor subclass, or runs a subclass's ``__torch_dispatch__`` inside (torchao's float8 matmul casts its plain
    inputs to Float8TrainingTensor inside the Function), or it changes an input in place or keeps an input on ``ctx``
    (``ctx.t = t``), which its ``backward`` may change: thunder 0.2.6's own handling of Functions traces ``forward``
    into a trace of its own whose in-place updates of inputs never reach the caller, and its backward cannot read a
    tensor kept on ``ctx`` (``UnboundLocalError`` in the generated backward)."""
    env = FakeEnv(pin=False)  # (a probe: the recording that follows pins or keeps the sizes symbolic)
    recorder = RecordingMode()
    try:
        fargs, fkwargs = tree_map(env.to_fake, (args, kwargs))
        inputs = [a for a in tree_flatten((fargs, fkwargs))[0] if isinstance(a, torch.Tensor)]
        versions = [a._version for a in inputs]
        with fake_execution(autocast=True), torch.set_grad_enabled(is_traced_grad_enabled()), recorder:
            out = cls.apply(*fargs, **fkwargs)
    except Exception:
        return False  # thunder's own handling of autograd.Function applies (and reports errors)
    outs = torch.utils._pytree.tree_leaves(out)
    if recorder.saw_subclass or any(is_traceable_wrapper_subclass(o) for o in outs):
        return True
    if any(a._version != v for a, v in zip(inputs, versions)):
        return True
    ctx = next((o.grad_fn for o in outs if isinstance(o, torch.Tensor) and o.grad_fn is not None), None)
    kept = getattr(ctx, "__dict__", {}).values()
    return any(isinstance(v, torch.Tensor) and any(v is a for a in inputs) for v in kept)


def apply_autograd_function(cls: type, *args, **kwargs):
    """``cls.apply(*args, **kwargs)`` in traced code with subclass inputs or outputs: one bound symbol whose
    subsymbols are the forward's aten calls; its gradient comes from ``cls.backward`` (see autograd_function_symbol)."""
    return record_function_call(cls.apply, f"{cls.__name__}_apply", f"{cls.__qualname__}.apply", *args, **kwargs)


def function_apply_lookaside(fn, wrapped_args: tuple) -> Callable | None:
    """The interpreter lookaside for ``MyFunction.apply(*args)`` (it reaches the interpreter as
    ``Function.apply.__func__(MyFunction, *args)``) when subclasses are involved, else None."""
    if fn is not torch.autograd.function.Function.apply.__func__ or not wrapped_args:
        return None
    cls, *uargs = (unwrap(a) for a in wrapped_args)
    if any(isinstance(a, TensorProxy) for a in tree_flatten(uargs)[0]):
        # Python side effects in backward: a graph break (eager), or the typed error with fullgraph=True
        error = backward_effect_error(cls, tuple(uargs), {})
        if error is not None:
            return lambda *wargs, **wkwargs: raise_in_interpreter(error)
    if has_subclass_proxy(uargs, {}) or involves_subclass(cls, tuple(uargs), {}):
        return interpreter_needs_wrap(apply_autograd_function)
    return None
