"""Autograd hooks: where subclasses are flattened, and how compiled forward/backward meet PyTorch's autograd.

Hooks (thunder 0.2.6 paths, relative to the installed ``thunder/``):

* ``executors/passes.py`` ``_transform_for_operator_executor_execution`` — the point after autograd and before
  executors claim operations (looked up at call time by ``thunder/__init__.py`` and by ``transform_for_execution``):
  subclass-level bound symbols are replaced by their flat subsymbols (``Handlers.before_executors``:
  ``thunder_subclass.transforms.flatten``). Its call from ``apply_transforms_and_build_cache_entry`` made only for
  ``maybe_sort_waits`` returns the trace unchanged when it holds no distributed ``wait`` (:mod:`.transform_speed`).
  In thunder 0.2.6 ``grad_transform_on_trace`` builds one joint forward+backward trace
  before this point, so the pass sees (and flattens) forward and backward together, before
  ``split_into_forward_and_backward``.
* ``transforms/autodiff.py`` ``grad_transform_on_trace`` — gradients reach inputs changed in place, whose new
  values become forward outputs (:func:`grads_for_mutated_inputs`); ``split_into_forward_and_backward`` — the
  forward gives the epilogue the user's outputs only (the added new values stay in ``flat_output``); a tensor saved
  for the backward that the forward then overwrites in place (``copy_`` of an in-place op) is cloned just before it
  is overwritten and the clone is saved (:func:`protect_overwritten_values`): thunder 0.2.6 saved the tensor itself,
  and the backward read the new value
  (``v, i = topk(p, k); v /= v.sum(-1, keepdim=True)``, Mixtral's and every top-k router's normalisation: a
  silently wrong gradient, plain thunder.jit too).
* ``core/trace_interpreter.py`` ``TraceSubstitutionProcessor.add_to_swap_map`` — while autodiff builds the joint
  trace, each value a grad rule recorded again stands for the original value under a new proxy; the hook remembers,
  on the trace being built, the newest proxy of each original (:func:`newest_version`): a later grad rule handed the
  original finds state kept in the flatten context of the new one (DTensor's ``_MaskPartial`` mask, which the
  recording again computed under a new name: ``_thunder_internals.dtensor_masks``).
* ``executors/torch_autograd.py`` ``ThunderFunction.forward`` — outputs eager would not give ``requires_grad``
  (inner tensors of a computed subclass, detached values) are marked non-differentiable, per trace
  (``Handlers.differentiable_outputs``), through thunder's own ``is_differentiable_outputs`` argument; non-leaf
  inputs changed in place are returned in place of their new values and marked dirty (``Handlers.mutated_inputs``),
  so that their autograd history becomes the compiled function's, as eager's becomes the in-place ops'.
* ``executors/torch_autograd.py`` ``ThunderFunction.backward`` — when ``.backward(grad)`` passes gradients of another
  kind than the compiled backward expects (a plain tensor for a ``TwoTensor`` output), a backward made for those
  gradients runs instead (``Handlers.replace_grads`` / ``run_backward``: ``thunder_subclass.transforms.tangents``);
  otherwise thunder's own backward runs unchanged (saved tensors released as thunder does:
  ``ctx.maybe_clear_saved_tensors``). The gradient of a changed input whose new value nothing used stays undefined, as
  in eager (``Handlers.gradless_inputs``). A backward run with grad mode on (``create_graph=True``: autograd enables
  grad mode in a backward only then) goes to ``Handlers.create_graph_backward`` instead: thunder's backward is
  ``once_differentiable`` and its gradients have no history (torch's check looks at the incoming gradients only, so
  a loss on the gradient silently lost its second-order term). For it, the forward hook keeps on ``ctx`` the
  user-level call the forward ran for (``plugin_state.current_call``, tensors held weakly; the per-call wrapper of
  ``runtime`` makes each compiled call current while it runs).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch

from thunder_subclass._thunder_internals import plugin_state, transform_speed
from thunder_subclass._thunder_internals.plugin_state import (
    NOT_HANDLED,
    is_plugin_active,
)
from thunder_subclass._thunder_internals.thunder_state import (
    differentiated_in_entry,
    differentiating,
    remember_differentiated,
    trace_state,
)


def _hook_operator_executor_execution(original):
    # wraps thunder.executors.passes._transform_for_operator_executor_execution
    @functools.wraps(original)
    def _transform_for_operator_executor_execution(trace, executors_list):
        if is_plugin_active() and transform_speed.is_sort_waits_probe() and not transform_speed.may_hold_waits(trace):
            return trace  # a result maybe_sort_waits would discard (see transform_speed)
        if plugin_state.handlers is not None and plugin_state.handlers.executor in executors_list:
            # flattening records subclass operations again: sizes computed in the trace autodiff differentiated (the
            # joint trace may hold only shape queries of them) stay computed
            with contextlib.ExitStack() as stack:
                for t in (trace, *differentiated_in_entry()):
                    stack.enter_context(differentiating(t))
                trace = plugin_state.handlers.before_executors(trace)
        return original(trace, executors_list)

    return _transform_for_operator_executor_execution


def _hook_grad_transform_on_trace(original):
    # wraps thunder.transforms.autodiff.grad_transform_on_trace
    @functools.wraps(original)
    def grad_transform_on_trace(trace, /, *args, **kwargs):
        if not is_plugin_active():
            return original(trace, *args, **kwargs)
        if not args and not kwargs and _needs_no_gradient(trace):
            return trace  # split_into_forward_and_backward below then makes no backward
        # (the forward's number operations stay findable: grad rules' fake runs keep computed sizes symbolic)
        with differentiating(trace):
            result = grads_for_mutated_inputs(trace, lambda t: original(t, *args, **kwargs))
        remember_differentiated(trace)
        return result

    return grad_transform_on_trace


def _needs_no_gradient(trace) -> bool:
    """Whether thunder's grad transform would treat every operation of ``trace`` as constant (its
    ``is_constant_for_vjp``: a program traced under ``torch.no_grad()``, whose outputs thunder tags
    ``DETACHED_AUTOGRAD_GRAPH``, or whose arguments need no gradient). thunder 0.2.6 runs the transform (and the
    split into forward and backward) whenever an argument has ``requires_grad`` (any model's parameters, also under
    ``no_grad``): a copy of the trace that computes no gradient, then a split that finds no backward. The plugin
    skips both; the forward thunder then compiles is the one it compiles for a program without gradients."""
    from thunder.core.prims import PrimIDs
    from thunder.core.transforms import is_constant_for_vjp

    bsyms = trace.bound_symbols
    if not bsyms or bsyms[-1].sym.id is not PrimIDs.RETURN:
        return False
    return all((is_constant_for_vjp(b) or _computes_numbers_only(b)) and b.sym.name != "synchronize"
               for b in bsyms[:-1])


def _computes_numbers_only(bsym) -> bool:
    """Whether ``bsym`` has outputs and all are numbers (``prims.shape`` of a tensor, arithmetic on sizes under
    symbolic values): no gradient flows through a Python number. thunder's ``is_constant_for_vjp`` does not count
    them as constant (their outputs carry no detached tag), so a no_grad trace with symbolic sizes got a joint
    forward+backward trace and a backward (transformers' Gemma2 and Gemma3 under automatic dynamic shapes)."""
    from thunder.core.proxies import NumberProxy

    outs = bsym.flat_proxy_outs
    return bool(outs) and all(isinstance(o, NumberProxy) for o in outs)


# key of a joint trace's return dict: (how many outputs were added after the user's, ((position in flat_args of an
# input changed in place, position of its new value among the outputs), ...))
MUTATED_INPUTS_KEY = "thunder_subclass_mutated_inputs"


def grads_for_mutated_inputs(trace, transform: Callable):
    """``transform(trace)`` (thunder's grad transform) with gradients for inputs that the program mutates in place.

    thunder 0.2.6 (``transforms/autodiff.py``, ``grad_transform_on_trace``) returns the gradients of the return's
    ``flat_args``; for an input that an in-place op changed, ``flat_args`` holds the input's last alias (the output
    of the last ``update_aliases``), an intermediate, not the input: no gradient reached the input, and a non-leaf
    input requiring grad (``x = base + 1; f(x)`` with ``x.mul_(2)`` inside) gave outputs that do not require grad
    (plain thunder.jit too: "element 0 of tensors does not require grad"). Eager differentiates through the mutation
    to the input's history. Here the transform sees the inputs themselves in ``flat_args`` (the chain through
    ``update_aliases`` and ``copy_`` has thunder's own grad rules); afterwards ``flat_args`` names the last aliases
    again, found in the new trace as the same output of the same (k-th) forward ``update_aliases``: they keep the
    in-place updates alive through dead-code elimination, and at run time they are the caller's tensors."""
    from thunder.core.prims import PrimIDs
    from thunder.core.proxies import TensorProxy
    from thunder.core.symbol import BoundSymbolTag

    ret = trace.bound_symbols[-1] if trace.bound_symbols else None
    if ret is None or not isinstance(ret.args, tuple) or not ret.args or not isinstance(ret.args[0], dict) \
            or "flat_args" not in ret.args[0] or len(ret.args[0]["flat_args"]) != len(trace.args):
        return transform(trace)
    flat_args = list(ret.args[0]["flat_args"])

    def forward_aliases(t) -> list[tuple]:  # the outputs of each forward update_aliases, in trace order
        return [b.output for b in t.bound_symbols
                if b.sym.id == PrimIDs.UPDATE_ALIASES and BoundSymbolTag.BACKWARD not in b.tags]

    old_positions = {o.name: (k, j) for k, outs in enumerate(forward_aliases(trace)) for j, o in enumerate(outs)
                     if isinstance(o, TensorProxy)}
    extra_outputs = isinstance(ret.args[0].get("output"), tuple)
    substituted = {i for i, (a, f) in enumerate(zip(trace.args, flat_args))
                   if isinstance(a, TensorProxy) and isinstance(f, TensorProxy) and a is not f and a.requires_grad
                   and (extra_outputs or f.name in old_positions)}
    if not substituted:
        return transform(trace)
    inputs = [trace.args[i] if i in substituted else f for i, f in enumerate(flat_args)]
    changed = {**ret.args[0], "flat_args": inputs}
    order = tuple(sorted(substituted))
    positions: list[int] = []
    if extra_outputs:
        # each changed input's new value is a forward output (a user's output, or one added after them): thunder's
        # backward then takes its gradient, and at run time the ThunderFunction.forward hook returns the caller's
        # object in its place, marked dirty, so that its autograd history becomes the compiled function's, as in eager
        outputs = list(changed["output"])
        n_user = len(outputs)
        for i in order:
            names = [getattr(o, "name", None) for o in outputs]
            if flat_args[i].name in names:
                positions.append(names.index(flat_args[i].name))
            else:
                positions.append(len(outputs))
                outputs.append(flat_args[i])
        changed["output"] = tuple(outputs)
        changed[MUTATED_INPUTS_KEY] = (len(outputs) - n_user, tuple(zip(order, positions)))
    trace.bound_symbols[-1] = ret.from_bsym(args=(changed, *ret.args[1:]))
    try:
        new_trace = transform(trace)
    finally:
        trace.bound_symbols[-1] = ret
    new_aliases = forward_aliases(new_trace)
    new_ret = new_trace.bound_symbols[-1]
    restored = list(new_ret.args[0]["flat_args"])
    fw_out = new_ret.args[0].get("fw_flat_out", ())
    for m, i in enumerate(order):
        if extra_outputs:  # the new value, which the forward also returns
            last = fw_out[positions[m]] if positions[m] < len(fw_out) else None
        else:  # the same output of the same (k-th) forward update_aliases
            k, j = old_positions[flat_args[i].name]
            last = new_aliases[k][j] if k < len(new_aliases) and j < len(new_aliases[k]) else None
        if not isinstance(last, TensorProxy):
            # thunder changed the structure: thunder's own result (outputs without gradient), transformed again
            return transform(trace)
        # a plain input's last alias is, at run time, the caller's tensor; a subclass input's is an object rebuilt
        # from the changed inner tensors, without the caller's autograd history: the input itself is passed to
        # autograd (the changed inner tensors stay alive: in-place ops are never removed)
        restored[i] = last if type(new_trace.args[i]) is TensorProxy else new_trace.args[i]
    new_trace.bound_symbols[-1] = new_ret.from_bsym(args=({**new_ret.args[0], "flat_args": restored},
                                                          *new_ret.args[1:]))
    return new_trace


def protect_overwritten_values(forward_trace, backward_trace):
    """``forward_trace`` (an augmented forward: its return gives the outputs and the tensors saved for backward) with
    each saved tensor that a later ``copy_`` or in-place aten op overwrites cloned just before the first such write, the
    clone saved in its place: the value the derivative formulas were written for. Left as they are: tensors of the caller (the forward's inputs
    and their aliases: a change made through them is the caller's) and tensors the backward itself changes in place
    (an ``autograd.Function`` changing what it kept on ``ctx``). Unchanged when there is no such tensor."""
    from thunder.core import prims
    from thunder.core.proxies import TensorProxy
    from thunder.core.trace import from_trace, tracectx
    from thunder.core.update_aliases import _is_inplace_op
    from thunder.executors import torchex

    ret = forward_trace.bound_symbols[-1]
    if ret.sym.id != prims.PrimIDs.RETURN or len(ret.args) < 2 or not isinstance(ret.args[1], tuple) \
            or len(ret.args[1]) != 2:
        return forward_trace
    saved_tensors, saved_other = ret.args[1]
    saved_names = {p.name for p in saved_tensors if isinstance(p, TensorProxy)}
    # only tensors this forward computed (followed back through thunder's alias bookkeeping and views): an input, an
    # inner tensor of an input subclass or a view of one is the caller's, whose change the caller must see
    producer = {o.name: bsym for bsym in forward_trace.bound_symbols for o in bsym.flat_proxy_outs}
    saved_names = {n for n in saved_names if _computed_here(n, producer)}
    # a tensor the backward changes in place is the forward's object itself (unpacked from the saved tuple by position)
    if backward_trace is not None and saved_names:
        unpacked = _saved_tensor_names_in_backward(backward_trace, len(saved_tensors))
        written = set()
        for bsym in backward_trace.bound_symbols:
            if bsym.sym.name == "copy_" and len(bsym.args) >= 2 and isinstance(bsym.args[1], TensorProxy):
                written.add(bsym.args[1].name)
            elif _is_inplace_op(bsym):  # add_, the plugin's aten_add__Tensor: changes its first argument
                args = [p for p in bsym.flat_proxy_args if isinstance(p, TensorProxy)]
                if args:
                    written.add(args[0].name)
        saved_names -= {saved_tensors[i].name for i, n in enumerate(unpacked) if n in written}
    clones: dict = {}
    bsyms = []
    for b in forward_trace.bound_symbols[:-1]:
        dst = _overwritten(b)
        if dst is not None and dst.name in saved_names and dst.name not in clones:
            with tracectx(forward_trace):
                clones[dst.name] = TensorProxy(like=dst)
            bsyms.append(torchex.clone.bind(dst, output=clones[dst.name]))
        bsyms.append(b)
    if not clones:
        return forward_trace
    saved = tuple(clones.get(getattr(p, "name", None), p) for p in saved_tensors)
    new = from_trace(forward_trace)
    new.bound_symbols = [*bsyms, ret.from_bsym(args=(ret.args[0], (saved, saved_other), *ret.args[2:]))]
    return new


def _overwritten(bsym):
    """The tensor ``bsym`` (of a flattened forward trace) writes in place, or None: the destination of thunder's
    ``copy_``, or the first argument of an in-place aten op (``aten_mul__Tensor``: in a subclass's flattened
    operation the aten op itself writes, and the ``copy_`` after it only marks the write)."""
    from thunder.core.proxies import TensorProxy
    from thunder.core.update_aliases import _is_inplace_op

    if bsym.sym.name == "copy_" and len(bsym.args) >= 2 and isinstance(bsym.args[1], TensorProxy):
        return bsym.args[1]
    if bsym.sym.name.startswith("aten_") and _is_inplace_op(bsym):
        args = [p for p in bsym.flat_proxy_args if isinstance(p, TensorProxy)]
        return args[0] if args else None
    return None


def _computed_here(name: str, producer: dict) -> bool:
    """Whether the tensor ``name`` of a forward trace (``producer``: output name -> bound symbol) is, through thunder's
    alias updates and view operations, a tensor a computation of this trace made (not an input, not a subclass
    input's inner tensor)."""
    from thunder.core import prims
    from thunder.core.update_aliases import _is_view_creation_op

    for _ in range(1000):
        bsym = producer.get(name)
        if bsym is None or bsym.sym.name.startswith("flatten_") or bsym.sym.id == prims.PrimIDs.UNPACK_TRIVIAL:
            return False
        if bsym.sym.id == prims.PrimIDs.UPDATE_ALIASES:
            outs = [o.name for o in bsym.flat_proxy_outs]
            ins = list(bsym.flat_proxy_args)
            if name not in outs or len(ins) != len(outs):
                return False
            name = ins[outs.index(name)].name
        elif _is_view_creation_op(bsym):
            ins = list(bsym.flat_proxy_args)
            if not ins:
                return False
            name = ins[0].name
        else:
            return True
    return False


def _saved_tensor_names_in_backward(backward_trace, n: int) -> list:
    """The names the backward gives the saved tensors (it unpacks them by position), or [] when not found."""
    from thunder.core import prims

    for b in backward_trace.bound_symbols:
        if b.sym.id == prims.PrimIDs.UNPACK_SEQUENCE and len(b.output) == n:
            names = [getattr(o, "name", None) for o in b.output]
            if all(names):
                return names
    return []


def _hook_split_into_forward_and_backward(original):
    # wraps thunder.transforms.autodiff.split_into_forward_and_backward (imported by name when thunder compiles a
    # program that needs a backward): the forward returns, as "output" (what the epilogue gets), the user's outputs
    # only; the new values of inputs changed in place (grads_for_mutated_inputs) stay in "flat_output" (what autograd
    # connects), at its end

    @functools.wraps(original)
    def split_into_forward_and_backward(joint_trace):
        ret = joint_trace.bound_symbols[-1] if joint_trace.bound_symbols else None
        if is_plugin_active() and ret is not None and ret.args and isinstance(ret.args[0], dict) \
                and "fw_flat_out" not in ret.args[0]:
            return joint_trace, None  # the grad transform was skipped (_needs_no_gradient): no backward
        forward, backward = original(joint_trace)
        if is_plugin_active() and backward is not None:
            forward = protect_overwritten_values(forward, backward)
        ret = forward.bound_symbols[-1]
        if not ret.args or not isinstance(ret.args[0], dict) or MUTATED_INPUTS_KEY not in ret.args[0]:
            return forward, backward
        out = dict(ret.args[0])
        n_added, pairs = out.pop(MUTATED_INPUTS_KEY)
        # a user output that is a changed input's new value (`a.mul_(2); return a`) is the caller's object itself, as
        # in eager (for a subclass input, the new value is an object rebuilt from the changed inner tensors)
        outputs = list(out["output"][: len(out["output"]) - n_added])
        for i, pos in pairs:
            if pos < len(outputs):
                outputs[pos] = out["flat_args"][i]
        out["output"] = tuple(outputs)
        forward.bound_symbols[-1] = ret.from_bsym(args=(out, *ret.args[1:]))
        return forward, backward

    return split_into_forward_and_backward


def _hook_thunder_function_forward(original):
    # wraps thunder.executors.torch_autograd.ThunderFunction.forward (a staticmethod)
    original = original.__func__ if isinstance(original, staticmethod) else original

    @functools.wraps(original)
    def forward(ctx, return_none_instead_of_grads, compiled_backward, side_channel, saved_tensors, saved_other,
                is_differentiable_outputs, flat_output, *flat_args):
        # thunder marks outputs non-differentiable from its per-jit option is_differentiable_outputs, only without
        # the split-autograd side channel (thunder_subclass.jit's default); the plugin knows it per trace
        if plugin_state.handlers is not None and side_channel is None and is_differentiable_outputs is None:
            is_differentiable_outputs = plugin_state.handlers.differentiable_outputs(compiled_backward)
        mutated = plugin_state.handlers.mutated_inputs(compiled_backward) if plugin_state.handlers is not None and side_channel is None else ()
        # torch refuses a Function that changes an input that is a view of another tensor and has more than one
        # output: such an input keeps its history from before the call (docs/limits.md)
        if mutated and not any(flat_args[i]._base is not None for i, _ in mutated):
            # the outputs that are new values of inputs changed in place (grads_for_mutated_inputs): the caller's
            # objects themselves, marked dirty (autograd gives them this function's history)
            flat_output = list(flat_output)
            for i, pos in mutated:
                flat_output[pos] = flat_args[i]
            flat_output = tuple(flat_output)
            if is_differentiable_outputs is not None:  # the new value of an input that requires grad does too
                positions = {pos for _, pos in mutated}
                is_differentiable_outputs = tuple(d or k in positions for k, d in enumerate(is_differentiable_outputs))
            ctx.mark_dirty(*(flat_args[i] for i, _ in mutated))
            # undefined gradients reach the backward hook as None (an input's gradient stays undefined, as in eager,
            # when nothing used its new value); BackwardVariants.canonical fills in zeros for the compiled backward
            ctx.set_materialize_grads(False)
        if is_differentiable_outputs is not None:
            # only tensors can be marked non-differentiable ("mark_non_differentiable only accepts variable
            # arguments"): a number the computation hands to the epilogue (an int written back into a container a
            # submodule holds, `self.stats["n"] += 1`) is left out of the marking; autograd ignores it anyway
            is_differentiable_outputs = tuple(d or not isinstance(o, torch.Tensor)
                                              for o, d in zip(flat_output, is_differentiable_outputs))
        result = original(ctx, return_none_instead_of_grads, compiled_backward, side_channel, saved_tensors,
                          saved_other, is_differentiable_outputs, flat_output, *flat_args)
        if plugin_state.handlers is not None and side_channel is None:
            # for a later create_graph=True backward (Handlers.create_graph_backward); tensors held weakly
            ctx.thunder_subclass_call = plugin_state.current_call(flat_args)
        return result

    return staticmethod(forward)


def _hook_thunder_function_backward(original):
    # wraps thunder.executors.torch_autograd.ThunderFunction.backward (a staticmethod)
    original = original.__func__ if isinstance(original, staticmethod) else original

    @functools.wraps(original)
    def backward(ctx, *raw_args):
        if plugin_state.handlers is None:
            return original(ctx, *raw_args)
        if torch.is_grad_enabled():  # autograd runs a backward with grad mode on only for create_graph=True
            grads = ctx.side_channel["bw"] if ctx.side_channel is not None else raw_args
            result = plugin_state.handlers.create_graph_backward(
                ctx.compiled_backward, getattr(ctx, "thunder_subclass_call", None), grads)
            if result is not NOT_HANDLED:
                ctx.maybe_clear_saved_tensors()  # (thunder's backward would have released them)
                result = [None] * len(result) if ctx.return_none_instead_of_grads else result
                # ThunderFunction.forward takes 7 non-tensor arguments before the flat tensors
                return (None, None, None, None, None, None, None, *result)
        grads = ctx.side_channel["bw"] if ctx.side_channel is not None else raw_args
        gradless = plugin_state.handlers.gradless_inputs(ctx.compiled_backward, grads)
        result = _backward(ctx, raw_args)
        # ThunderFunction.forward takes 7 non-tensor arguments before the flat tensors
        return tuple(None if k - 7 in gradless else r for k, r in enumerate(result)) if gradless else result

    def _backward(ctx, raw_args):
        if plugin_state.handlers is not None:
            side_channel = ctx.side_channel
            grads = side_channel["bw"] if side_channel is not None else raw_args
            replaced = plugin_state.handlers.replace_grads(ctx.compiled_backward, grads)
            if replaced is not None:
                grads = replaced
                if side_channel is not None:
                    side_channel["bw"] = replaced
                else:
                    raw_args = tuple(replaced)
            result = plugin_state.handlers.run_backward(ctx.compiled_backward, grads,
                                                        functools.partial(_take_saved_tensors, ctx),
                                                        getattr(ctx, "thunder_subclass_call", None))
            if result is not NOT_HANDLED:
                if ctx.return_none_instead_of_grads:
                    result = [None] * len(result)
                # ThunderFunction.forward takes 7 non-tensor arguments before the flat tensors
                return (None, None, None, None, None, None, None, *result)
        return original(ctx, *raw_args)

    return staticmethod(backward)


def _take_saved_tensors(ctx) -> list:
    """The tensors a ``ThunderFunction`` forward saved, released from its context as thunder's backward does
    (from the split-autograd side channel, else ``ctx.saved_tensors`` + ``ctx.maybe_clear_saved_tensors``)."""
    side_channel = ctx.side_channel
    if side_channel is not None:
        saved = side_channel.pop("saved_tensors")
        side_channel.pop("bw")
        return saved
    saved = list(ctx.saved_tensors)
    ctx.maybe_clear_saved_tensors()
    return saved


_SUCCESSORS = "successors"


def _hook_add_to_swap_map(original):
    # wraps thunder.core.trace_interpreter.TraceSubstitutionProcessor.add_to_swap_map
    @functools.wraps(original)
    def add_to_swap_map(self, old, new):
        if is_plugin_active():
            from thunder.core.proxies import TensorProxy, variableify

            if (isinstance(old, TensorProxy) and isinstance(new, TensorProxy) and old.name != new.name
                    and variableify(new) not in self.env):
                trace_state(self.new_trace).setdefault(_SUCCESSORS, {})[old.name] = new
        return original(self, old, new)

    return add_to_swap_map


def newest_version(p):
    """The proxy that stands for ``p`` in the trace being built (autodiff's joint trace), where a grad rule recorded
    ``p``'s value again under a new proxy; else ``p``."""
    successors = (trace_state() or {}).get(_SUCCESSORS, {})
    seen = set()
    while p.name in successors and p.name not in seen:
        seen.add(p.name)
        p = successors[p.name]
    return p


def hook_targets() -> list[tuple[Any, str, Callable]]:
    import thunder.core.trace_interpreter as trace_interpreter
    import thunder.executors.passes as passes
    import thunder.executors.torch_autograd as torch_autograd
    import thunder.transforms.autodiff as autodiff

    return [
        (passes, "_transform_for_operator_executor_execution", _hook_operator_executor_execution),
        (autodiff, "grad_transform_on_trace", _hook_grad_transform_on_trace),
        (autodiff, "split_into_forward_and_backward", _hook_split_into_forward_and_backward),
        (trace_interpreter.TraceSubstitutionProcessor, "add_to_swap_map", _hook_add_to_swap_map),
        (torch_autograd.ThunderFunction, "forward", _hook_thunder_function_forward),
        (torch_autograd.ThunderFunction, "backward", _hook_thunder_function_backward),
    ]
