"""Stage 2 (per call), graph breaks inside a compiled region: a submodule whose own code breaks runs as ONE eager
operation of its parent's trace.

In: a module call ``child(*args)`` that thunder's interpreter meets while tracing a region of a graph-break program
(``graph_breaks._Program``), where ``child`` broke before with arguments of this kind and its eager run was observed.
What happens: the call is recorded as one symbol instead of being traced (when all the conditions below hold).
Out: one bound symbol, ``eager_module_call(spec, *tensors)`` (``eager_module_call_with_grad``, differentiated as
``eager_module_call_forward`` / ``eager_module_call_backward``, when gradients flow), whose outputs are proxies with
the metadata the observed run gave; at run time the symbol calls ``child`` eagerly (``Module.__call__``, its hooks,
its own Python, its children compiled as regions but for stateless leaves) and checks that what it returned matches
what the trace assumed.

Why: without this, a break anywhere in a block (the per-expert loop of a mixture-of-experts layer) makes every module
above it run its Python eagerly, each of their children a separate region. With it, the block's parent (up to the
whole model) traces as one program around the eager call, as torch.compile's graphs surround the code it breaks on.

When a call is recorded so (all must hold, else the call traces as before, i.e. the parent breaks too):

* the child broke before (its own code holds the break) and one eager run of it, with arguments of the same kind
  (tensor types, ranks, dtypes, devices; Python values; the grad mode), was observed to be *pure*: no tensor it could
  reach (its parameters, buffers, tensor arguments) changed version, no attribute of it or its submodules changed,
  no container or plain object their attributes reach (a ``stats`` dict, a config) changed its contents, and it
  returned plain tensors (or None / Python scalars) in a tuple, list or alone, none an argument; state it holds that
  cannot be read this way (an object with ``__slots__``, a C object, more than ``_STATE_LIMIT`` containers) is not
  proven pure;
* its arguments are plain tensors and Python constants (no subclass tensor, no symbolic number);
* the trace so far changed in place no tensor it did not make itself (a non-view result of a torch-level symbol), and
  holds no pending write to the child, its submodules or an object they hold (thunder applies Python side effects
  after the computation; the eager call must see the state eager would); the child has no ``forward`` set on the
  instance;
* no autocast is in effect at the call.

What the trace assumes, and how each assumption is checked on every call (at run time, right after the child ran):

* *the child is pure* (the observed run was): the same snapshot as the observation's is taken before each call and
  compared after it (tensor versions, attributes, contents of held containers and objects);
* *its outputs are what the trace holds*: types, shapes, dtypes, devices, layout (contiguity), constant outputs by
  value, no output an argument; the child is still at its path and of its class; on the gradients path its
  trainable parameters are the ones traced;
* *output sizes*: an output whose observed shape equalled a tensor argument's is "that argument's shape" for any
  sizes (checked as above); other shapes are taken as observed and need the arguments' observed shapes (recorded
  only then);
* *which outputs require grad* is not assumed: recorded with gradients, every floating output gets a gradient in the
  trace, and the backward differentiates through the outputs that required grad in that call's own autograd graph
  (an expert no token was routed to in the observed run gets its gradients on the calls that route to it).

A failed check raises :class:`EagerCallMismatch` before anything after the call runs, carrying the child's result
(``eager_call_state.Replay``); the graph-break program catches it, restores the random-number state and the Python
state the child saw, and runs the parent eagerly, where the call of the child (the whole call, hooks included: a
per-thread dispatch entry of ``_thunder_internals.module_dispatch``; or the eager-call symbol of a region inside)
returns that result (with the state and random numbers as the child left them, and on the gradients path joined to
the parent's graph by ``eager_call_state._Reattach``) instead of running the child again: its side effects happen
once, as in eager. The observation is dropped (the child is not
recorded again for that kind of call). The computation before the call is free of in-place operations and the
epilogue's Python writes have not happened, so running the parent's code before the call again is what eager does.
Not undone for that: a tensor the child changed in place on a call whose observation showed none (the parent's code
before the call, run again, would read the new value; eager reads the old one).

Gradients: with grad enabled at the call and a tensor argument or a trainable parameter of the child requiring grad,
the forward runs the child under ``torch.enable_grad`` on detached arguments and keeps its autograd graph behind an
integer handle tensor; the backward symbol calls ``torch.autograd.grad`` through that graph for the arguments and the
child's trainable parameters (which are inputs of the symbol, so thunder accumulates their gradients as any other; a
parameter the call's graph does not reach gets zeros from the symbol, and ``unreached_grads`` puts its ``.grad`` back
to None after accumulation where that left only zeros in a gradient that was None, as eager leaves it).

Owner of state: the specs are process-wide (one per recorded call, appended, small); the autograd graphs of the
forwards with gradients (``_graphs``) live until their handle tensor is freed (with the forward's saved tensors); the
observations, the decisions and the roots belong to the graph-break program (``graph_breaks._Program``). Traces
holding these symbols are not stored by the disk cache (the spec is a process-local number).
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from thunder_subclass.runtime import unreached_grads
from thunder_subclass.runtime.eager_call_state import (
    Replay,
    Snapshot,
    held_now,
    replaying,
    rng_state,
    snapshot,
    take_replay,
    unchanged,
)

__all__ = [
    "EagerCallMismatch",
    "active_root",
    "holds_eager_call",
    "lookaside",
    "observe_key",
    "record_observation",
    "replaying",
    "root_scope",
    "snapshot",
    "take_replay",
]


class EagerCallMismatch(Exception):
    """An eager submodule call inside a compiled region returned something the trace did not assume (internal: the
    graph-break program catches it and runs the region's module eagerly)."""

    def __init__(self, spec_id: int, detail: str):
        super().__init__(detail)
        self.spec_id = spec_id
        self.replay: Replay | None = None  # set when the child ran: its result, for the parent's eager run


# ---------------------------------------------------------------------------------------------------------------
# The root of the region being traced or run (a stack per thread)
# ---------------------------------------------------------------------------------------------------------------

_local = threading.local()


@dataclasses.dataclass
class Root:
    program: Any  # graph_breaks._Program
    module: torch.nn.Module
    name: str
    region: Any  # the jitted function the region runs (its traces may hold eager calls)


def _roots() -> list:
    roots = getattr(_local, "roots", None)
    if roots is None:
        roots = _local.roots = []
    return roots


class root_scope:
    """``with root_scope(root):`` a region of ``root.module`` is traced or run."""

    __slots__ = ("root",)

    def __init__(self, root: Root):
        self.root = root

    def __enter__(self):
        _roots().append(self.root)

    def __exit__(self, *exc):
        _roots().pop()


def active_root() -> Root | None:
    roots = _roots()
    return roots[-1] if roots else None


# ---------------------------------------------------------------------------------------------------------------
# Observing an eager run
# ---------------------------------------------------------------------------------------------------------------

_CONSTANTS = (type(None), bool, int, float, str, torch.dtype, torch.device)


def _leaf_kind(x: Any, *, proxy: bool) -> Any:
    """The kind of one argument leaf, the same for a real tensor and for its proxy (no sizes), or None when the leaf
    rules the call out."""
    if proxy:
        from thunder.core.proxies import NumberProxy, TensorProxy

        from thunder_subclass.frontend.proxy import SubclassTensorProxy

        if isinstance(x, SubclassTensorProxy):
            return None
        if isinstance(x, TensorProxy):
            from thunder.core import devices, dtypes

            return ("tensor", x.ndim, dtypes.to_torch_dtype(x.dtype), devices.to_torch_device(x.device))
        if isinstance(x, NumberProxy):
            return None
    elif isinstance(x, torch.Tensor):
        if type(x) is not torch.Tensor and type(x) is not torch.nn.Parameter:
            return None
        return ("tensor", x.dim(), x.dtype, x.device)
    if isinstance(x, _CONSTANTS) and (not isinstance(x, float) or x == x):
        return ("const", type(x), x)
    return None


def _described_call(module: torch.nn.Module, args: tuple, kwargs: dict, grad_enabled: bool, *, proxy: bool):
    """(observation key, argument leaves, their pytree spec, their kinds) of ``module(*args, **kwargs)``, or None when
    such a call cannot be an eager call in a trace."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    kinds = tuple(_leaf_kind(x, proxy=proxy) for x in leaves)
    if any(k is None for k in kinds):
        return None
    return (type(module), type(module).forward, grad_enabled, str(spec), kinds), leaves, spec, kinds


def observe_key(module: torch.nn.Module, args: tuple, kwargs: dict, grad_enabled: bool, *, proxy: bool) -> Any:
    """The key an observation of ``module(*args, **kwargs)`` is stored under, or None when such a call cannot be an
    eager call in a trace."""
    described = _described_call(module, args, kwargs, grad_enabled, proxy=proxy)
    return None if described is None else described[0]


@dataclasses.dataclass(frozen=True)
class Observation:
    """An eager run's result, described for a trace: per output leaf ``("tensor", shape, dtype, device,
    contiguous)`` where shape is ``("like", i)`` (the i-th tensor argument's) or ``("fixed", sizes)``, or
    ``("const", value)``; and the argument shapes it needs (None when every output is "like")."""

    out_spec: Any
    out_leaves: tuple
    arg_shapes: tuple | None


def record_observation(before: Snapshot, args: tuple, kwargs: dict, result: Any) -> Observation | None:
    """The :class:`Observation` of an eager run that returned ``result``, or None when it cannot be an eager call in
    a trace (it changed state, or returned something else than plain tensors and constants)."""
    if not unchanged(before):
        return None
    arg_tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    leaves, out_spec = pytree.tree_flatten(result)
    if not isinstance(result, (torch.Tensor, tuple, list)) or type(result) not in (torch.Tensor, tuple, list):
        return None
    described, fixed = [], False
    for o in leaves:
        if isinstance(o, torch.Tensor):
            if type(o) is not torch.Tensor or any(o is t for t in arg_tensors):
                return None
            like = next((i for i, t in enumerate(arg_tensors) if t.shape == o.shape), None)
            shape = ("like", like) if like is not None else ("fixed", tuple(o.shape))
            fixed = fixed or like is None
            # (not whether it required grad: that depends on the data, e.g. which experts a call routed tokens to)
            described.append(("tensor", shape, o.dtype, o.device, o.is_contiguous()))
        elif isinstance(o, (type(None), bool, int, float)):
            described.append(("const", o))
        else:
            return None
    arg_shapes = tuple(tuple(t.shape) for t in arg_tensors) if fixed else None
    return Observation(out_spec, tuple(described), arg_shapes)


# ---------------------------------------------------------------------------------------------------------------
# The call in a trace
# ---------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Spec:
    key: Any  # the observation's key (dropped on a mismatch)
    path: str  # the child's path from the region's module
    module_type: type
    arg_spec: Any  # pytree spec of (args, kwargs)
    arg_leaves: tuple  # per leaf: ("tensor", i) or ("const", value)
    observation: Observation
    grad: bool  # recorded with gradients
    grad_inputs: tuple  # indices of the symbol's tensor inputs that require grad (grad path)
    n_params: int  # trainable parameters appended to the symbol's inputs (grad path)


_specs: list[_Spec] = []
_specs_lock = threading.Lock()


def _new_spec(spec: _Spec) -> int:
    with _specs_lock:
        _specs.append(spec)
        return len(_specs) - 1


def _relative_path(root: torch.nn.Module, module: torch.nn.Module) -> str | None:
    for name, m in root.named_modules(remove_duplicate=False):
        if m is module:
            return name
    return None


def _no_unsafe_operations_so_far() -> bool:
    """No operation recorded so far changed a tensor that existed before the trace's computation began: only tensors
    the trace made itself with a torch-level symbol that is not a view may have changed in place (``weights /=
    weights.sum()``: running the parent again makes them again)."""
    from thunder.core import prims
    from thunder.core.proxies import TensorProxy
    from thunder.core.pytree import tree_flatten
    from thunder.core.trace import get_tracectx

    from thunder_subclass._thunder_internals import view_symbols
    from thunder_subclass.runtime.speculation import is_unsafe

    trace = get_tracectx()
    if trace is None or len(trace.scopes) > 1:
        return False
    views = view_symbols()
    fresh: set[str] = set()
    for bsym in trace.bound_symbols:
        if is_unsafe(bsym, random=False):
            targets = tree_flatten((bsym.args, bsym.kwargs))[0] if bsym.sym.id == prims.PrimIDs.UPDATE_ALIASES \
                else [next((a for a in tree_flatten(bsym.args)[0] if isinstance(a, TensorProxy)), None)]
            if any(not isinstance(t, TensorProxy) or t.name not in fresh for t in targets):
                return False
        if bsym.sym in views or bsym.sym.executor is not None:  # a view, or an executor's operator (the plugin's
            continue                                               # aten-level symbols: some are views)
        fresh.update(o.name for o in tree_flatten(bsym.output)[0] if isinstance(o, TensorProxy))
    return True


_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes)


def _same_dict(written: Any, d: dict) -> bool:
    """Whether ``written`` (an object the trace wrote to) is the attribute dict ``d``: itself, or the interpreter's
    shadow copy of it, which holds the same objects (a module's ``_parameters`` dict, ...)."""
    if written is d:
        return True
    if type(written) is not dict:
        return False
    return any(not isinstance(v, _IMMUTABLE) and written.get(k) is v for k, v in d.items())


def _untouched_by_pending_writes(module: torch.nn.Module) -> bool:
    """No Python write recorded so far in the trace (applied by the epilogue after the computation) is to ``module``,
    its submodules or an object they hold directly."""
    from thunder_subclass._thunder_internals import pending_python_writes

    written = pending_python_writes()
    if not written:
        return True
    held = []
    for m in module.modules():
        held.append(m)
        held.extend(v for v in m.__dict__.values() if not isinstance(v, _IMMUTABLE))
    for w in written:
        for obj in held:
            if w is obj or _same_dict(w, getattr(obj, "__dict__", None) or {}):
                return False
    return True


def lookaside(fn, wrapped_args: tuple) -> Callable | None:
    """The interpreter lookaside for ``Module._call_impl(child, ...)`` of a child that may be recorded as one eager
    call (module docstring), else None. Whether it is recorded is decided with the call's keyword arguments, in the
    callable returned; a call that is not is interpreted as before."""
    from thunder_subclass._thunder_internals import module_call_impl

    if fn is not module_call_impl() or not wrapped_args:
        return None
    root = active_root()
    if root is None or not root.program.observed:
        return None
    from thunder.core.interpreter import interpreter_needs_wrap, unwrap, wrap_const

    from thunder_subclass._thunder_internals import interpret_call

    module = unwrap(wrapped_args[0])
    if not isinstance(module, torch.nn.Module) or type(module) not in root.program.observed_types:
        return None
    if getattr(_local, "skip", None) is module:  # interpreted as before (below)
        _local.skip = None
        return None

    def call(wmodule, *wargs, **wkwargs):
        args = tuple(unwrap(a) for a in wargs)
        kwargs = {k: unwrap(v) for k, v in wkwargs.items()}
        result = _record(root, module, wmodule, args, kwargs)
        if result is _NOT_RECORDED:
            _local.skip = module
            return interpret_call(wrap_const(fn), wmodule, *wargs, **wkwargs)
        return interpreter_needs_wrap(lambda *a, **k: result)(wmodule, *wargs, **wkwargs)

    return call


_NOT_RECORDED = object()


def _record(root: Root, module: torch.nn.Module, wmodule, args: tuple, kwargs: dict) -> Any:
    from thunder_subclass.frontend.fake import autocast_in_effect
    from thunder_subclass.frontend.recording import is_traced_grad_enabled

    grad = is_traced_grad_enabled()
    described = _described_call(module, args, kwargs, grad, proxy=True)
    if described is None:
        return _NOT_RECORDED
    key, leaves, arg_spec, kinds = described
    observation = root.program.observed.get(key)
    # (a forward set on the instance is not the class's whose run was observed)
    if observation is None or autocast_in_effect() or "forward" in module.__dict__:
        return _NOT_RECORDED
    tensors = [x for x, k in zip(leaves, kinds) if k[0] == "tensor"]
    if observation.arg_shapes is not None and tuple(tuple(t.shape) for t in tensors) != observation.arg_shapes:
        return _NOT_RECORDED
    path = _relative_path(root.module, module)
    if path is None or not _no_unsafe_operations_so_far() or not _untouched_by_pending_writes(module):
        return _NOT_RECORDED
    arg_leaves, i = [], 0
    for x, k in zip(leaves, kinds):
        if k[0] == "tensor":
            arg_leaves.append(("tensor", i))
            i += 1
        else:
            arg_leaves.append(("const", x))
    params: list = []
    differentiable = grad and (any(t.requires_grad for t in tensors)
                               or any(p.requires_grad for p in module.parameters()))
    if differentiable:
        params = _parameter_proxies(wmodule)
        if params is None:
            return _NOT_RECORDED
    spec = _Spec(key, path, type(module), arg_spec, tuple(arg_leaves), observation, differentiable,
                 tuple(j for j, t in enumerate(tensors) if t.requires_grad), len(params))
    spec_id = _new_spec(spec)
    root.program.regions_with_eager_calls.add(id(root.region))
    if differentiable:
        outputs = _grad_symbol()(spec_id, *tensors, *params)
    else:
        outputs = _symbol()(spec_id, *tensors)
    return _rebuild(observation, iter(outputs))


def _parameter_proxies(wmodule) -> list | None:
    """The proxies of the trainable parameters of the module ``wmodule`` (the interpreter's wrapped value) in the trace
    being built (read through the interpreter, so the prologue unpacks them), or None when one is not a plain
    tensor."""
    from thunder.core.interpreter import unwrap, wrap_const
    from thunder.core.proxies import TensorProxy

    from thunder_subclass._thunder_internals import interpret_call
    from thunder_subclass.frontend.proxy import SubclassTensorProxy

    wrapped = interpret_call(wrap_const(_trainable_parameters), wmodule)
    values = unwrap(wrapped)
    if not isinstance(values, tuple):
        return None
    if any(not isinstance(p, TensorProxy) or isinstance(p, SubclassTensorProxy) for p in values):
        return None
    return list(values)


def _trainable_parameters(module):
    return tuple(p for p in module.parameters() if p.requires_grad)


def _rebuild(observation: Observation, outputs) -> Any:
    leaves = [next(outputs) if d[0] == "tensor" else d[1] for d in observation.out_leaves]
    return pytree.tree_unflatten(leaves, observation.out_spec)


# ---------------------------------------------------------------------------------------------------------------
# Symbols
# ---------------------------------------------------------------------------------------------------------------

_symbols: dict[str, Any] = {}


def _output_proxies(spec_id: int, tensors: tuple) -> tuple:
    from thunder.core import devices, dtypes
    from thunder.core.proxies import TensorProxy

    spec = _specs[spec_id]
    out = []
    for d in spec.observation.out_leaves:
        if d[0] != "tensor":
            continue
        _, (rule, value), dtype, device, _ = d
        shape = tuple(tensors[value].shape) if rule == "like" else value
        out.append(TensorProxy(shape=shape, dtype=dtypes.to_dtype(dtype), device=devices.to_device(device),
                               requires_grad=_may_require_grad(spec, d)))
    return tuple(out)


def _meta(spec_id, *tensors):
    return _output_proxies(spec_id, tensors)


def _grad_forward_meta(spec_id, *tensors):
    from thunder.core import devices, dtypes
    from thunder.core.proxies import TensorProxy

    spec = _specs[spec_id]
    outs = _output_proxies(spec_id, tensors[: len(tensors) - spec.n_params])
    handle = TensorProxy(shape=(), dtype=dtypes.int64, device=devices.cpu, requires_grad=False)
    return (*outs, handle)


def _backward_meta(spec_id, handle, n_grads, *grads_and_targets):
    from thunder.core.proxies import TensorProxy

    return tuple(TensorProxy(like=t, requires_grad=False) for t in grads_and_targets[n_grads:])


def holds_eager_call(trace) -> bool:
    """Whether ``trace`` (a computation or backward trace) calls a submodule eagerly, or runs the backward of such a
    call (its spec lives in this process only)."""
    ids = {sym.id for sym in _symbols.values()}
    return bool(ids) and any(b.sym.id in ids for b in trace.bound_symbols)


def _symbol():
    sym = _symbols.get("call")
    if sym is None:
        from thunder_subclass.executor import register_symbol

        sym = _symbols["call"] = register_symbol("eager_module_call", meta=_meta, fn=_run)
    return sym


def _grad_symbol():
    sym = _symbols.get("grad_call")
    if sym is None:
        from thunder.core.transforms import register_grad

        from thunder_subclass.executor import subclass_executor, unique_operator_name

        sym = subclass_executor.register_operator(unique_operator_name("eager_module_call_with_grad"),
                                                  meta=_meta, fn=_run)
        forward = subclass_executor.register_operator(unique_operator_name("eager_module_call_forward"),
                                                      meta=_grad_forward_meta, fn=_run_with_graph)
        backward = subclass_executor.register_operator(unique_operator_name("eager_module_call_backward"),
                                                       meta=_backward_meta, fn=_run_backward)

        def grad_transform(spec_id, *inputs):
            from thunder.core import prims

            spec = _specs[spec_id]
            *outs, handle = forward(spec_id, *inputs)
            wanted = [o for o, d in zip(outs, _tensor_leaves(spec)) if _may_require_grad(spec, d)]
            grads = [prims.get_grad(o) for o in wanted]
            targets = _grad_targets(spec, inputs)
            input_grads = backward(spec_id, handle, len(grads), *grads, *targets) if targets else ()
            for x, g in zip(targets, input_grads):
                prims.put_grad(x, g)
            return tuple(outs)

        register_grad(sym, grad_transform)
        _symbols["forward"], _symbols["backward"] = forward, backward  # (holds_eager_call looks for these too)
        _symbols["grad_call"] = sym
    return sym


def _tensor_leaves(spec: _Spec) -> list:
    return [d for d in spec.observation.out_leaves if d[0] == "tensor"]


def _may_require_grad(spec: _Spec, leaf: tuple) -> bool:
    """Whether the output described by ``leaf`` gets a gradient in the trace: every floating output of a call recorded
    with gradients, whatever the observed run showed (an output requires grad or not depending on the data: an expert
    no token was routed to returns zeros); the backward asks at run time which outputs the graph reaches."""
    return spec.grad and (leaf[2].is_floating_point or leaf[2].is_complex)


def _grad_targets(spec: _Spec, inputs: tuple) -> list:
    n_tensors = len(inputs) - spec.n_params
    return [inputs[i] for i in spec.grad_inputs] + list(inputs[n_tensors:])


# ---------------------------------------------------------------------------------------------------------------
# Run time
# ---------------------------------------------------------------------------------------------------------------


def _resolve(spec_id: int) -> tuple[Root, torch.nn.Module]:
    spec = _specs[spec_id]
    root = active_root()
    if root is None:
        raise EagerCallMismatch(spec_id, "the region ran outside its graph-break program")
    module = root.module.get_submodule(spec.path) if spec.path else root.module
    if type(module) is not spec.module_type:
        raise EagerCallMismatch(spec_id, f"{spec.path!r} is now a {type(module).__name__}, "
                                         f"not a {spec.module_type.__name__}")
    return root, module


def _call_arguments(spec: _Spec, tensors) -> tuple[tuple, dict]:
    leaves = [tensors[d[1]] if d[0] == "tensor" else d[1] for d in spec.arg_leaves]
    return pytree.tree_unflatten(leaves, spec.arg_spec)


def _check(spec_id: int, result: Any, tensors) -> list:
    """The tensors of ``result`` when it matches the trace's assumptions, else :class:`EagerCallMismatch`."""
    spec = _specs[spec_id]
    obs = spec.observation
    leaves, out_spec = pytree.tree_flatten(result)
    if out_spec != obs.out_spec:
        raise EagerCallMismatch(spec_id, f"returned {out_spec}, traced with {obs.out_spec}")
    out = []
    for o, d in zip(leaves, obs.out_leaves):
        if d[0] == "const":
            if type(o) is not type(d[1]) or o != d[1]:
                raise EagerCallMismatch(spec_id, f"returned {o!r} where the trace has {d[1]!r}")
            continue
        _, (rule, value), dtype, device, contiguous = d
        shape = tuple(tensors[value].shape) if rule == "like" else value
        if type(o) is not torch.Tensor or tuple(o.shape) != shape or o.dtype != dtype or o.device != device:
            raise EagerCallMismatch(
                spec_id, f"returned a {type(o).__name__} of shape {tuple(getattr(o, 'shape', ()))} "
                         f"({getattr(o, 'dtype', None)}) where the trace has {shape} ({dtype})")
        if o.is_contiguous() != contiguous:  # (the traced code after the call may depend on the layout: a view)
            raise EagerCallMismatch(spec_id, f"returned a {'' if o.is_contiguous() else 'non-'}contiguous tensor "
                                             f"where the traced run returned a {'' if contiguous else 'non-'}"
                                             f"contiguous one")
        if any(o is t for t in tensors):
            raise EagerCallMismatch(spec_id, "returned one of its arguments")
        out.append(o)
    return out


def _run(spec_id: int, *tensors):
    spec = _specs[spec_id]
    root, module = _resolve(spec_id)
    tensors = tensors[: len(tensors) - spec.n_params]
    args, kwargs = _call_arguments(spec, tensors)
    replay = take_replay(module)
    if replay is not None:  # the parent runs eagerly after a mismatch of this call: the child ran already
        return tuple(_check(spec_id, replay.result_for(args, kwargs), tensors))
    before = snapshot(module, args, kwargs)
    with torch.set_grad_enabled(spec.grad):  # as traced: off under the parent's no_grad, or nothing needs gradients
        result = root.program.call_eagerly(module, _qualified(root, spec.path), args, kwargs)
    return tuple(_checked(spec_id, module, before, result, tensors, None))


def _checked(spec_id: int, module: torch.nn.Module, before: Snapshot, result: Any, tensors, detached) -> list:
    """:func:`_check` of ``result``, after checking that the call changed nothing :func:`snapshot` recorded in
    ``before`` (its observation showed a pure run; this call must be one too, or the traced code after it read state
    from before it). A mismatch carries a :class:`Replay`: the parent then runs eagerly with this result, without
    running the child again."""
    try:
        if not unchanged(before):
            raise EagerCallMismatch(spec_id, "changed its state (a tensor in place, an attribute, or a container or "
                                             "object it holds), unlike its observed run")
        return _check(spec_id, result, tensors)
    except EagerCallMismatch as e:
        e.replay = Replay(module, result, detached, before.held, held_now(before.held), rng_state())
        raise


def spec_key(spec_id: int) -> Any:
    """The observation key of eager call ``spec_id`` (to drop it after a mismatch)."""
    return _specs[spec_id].key


def spec_location(spec_id: int) -> str:
    spec = _specs[spec_id]
    return f"the eager call of {spec.path or 'the region itself'} ({spec.module_type.__qualname__})"


def _qualified(root: Root, path: str) -> str:
    return f"{root.name}.{path}" if root.name and path else (path or root.name)


_graphs: dict[int, tuple] = {}
_graph_counter = iter(range(1, 1 << 62))
_graph_lock = threading.Lock()


def _run_with_graph(spec_id: int, *inputs):
    spec = _specs[spec_id]
    root, module = _resolve(spec_id)
    n_tensors = len(inputs) - spec.n_params
    tensors, passed_params = inputs[:n_tensors], inputs[n_tensors:]
    params = _matching_parameters(module, passed_params)
    if params is None:
        raise EagerCallMismatch(spec_id, "its trainable parameters are not those traced")
    replay = take_replay(module)
    if replay is not None and replay.detached is not None:  # the parent runs eagerly after a mismatch of this call
        detached = replay.detached
        replay.restore_after()
        outs = _check(spec_id, replay.result, detached)
    else:
        detached = tuple(t.detach().requires_grad_(i in spec.grad_inputs and (t.is_floating_point()
                                                                               or t.is_complex()))
                         for i, t in enumerate(tensors))
        args, kwargs = _call_arguments(spec, detached)
        before = snapshot(module, args, kwargs)
        with torch.enable_grad():
            result = root.program.call_eagerly(module, _qualified(root, spec.path), args, kwargs)
        outs = _checked(spec_id, module, before, result, detached, detached)
    targets = [detached[i] for i in spec.grad_inputs] + params
    with _graph_lock:
        key = next(_graph_counter)
        _graphs[key] = (outs, targets)
    handle = torch.tensor(key, dtype=torch.int64)  # on the CPU: read back in the backward without a device sync
    weakref.finalize(handle, _graphs.pop, key, None)
    return (*(o.detach() for o in outs), handle)


def _matching_parameters(module: torch.nn.Module, passed: tuple) -> list | None:
    """``module``'s trainable parameters in the order of ``passed`` (the symbol's parameter inputs: thunder may pass a
    parameter as another tensor object over the same memory, and in another order), or None when they differ."""
    params = [p for p in module.parameters() if p.requires_grad]
    if len(params) != len(passed):
        return None
    by_memory = {(p.data_ptr(), tuple(p.shape), p.dtype): p for p in params}
    found = [by_memory.get((q.data_ptr(), tuple(q.shape), q.dtype)) for q in passed]
    return None if any(p is None for p in found) or len({id(p) for p in found}) != len(found) else found


def _run_backward(spec_id: int, handle: torch.Tensor, n_grads: int, *grads_and_targets):
    grads = grads_and_targets[:n_grads]
    entry = _graphs.get(int(handle))
    if entry is None:
        raise RuntimeError("thunder_subclass: the autograd graph of an eager module call inside a compiled region "
                           "was freed before its backward ran")
    outs, targets = entry
    spec = _specs[spec_id]
    wanted = [o for o, d in zip(outs, _tensor_leaves(spec)) if _may_require_grad(spec, d)]
    pairs = [(o, g) for o, g in zip(wanted, grads) if o.requires_grad]
    live = [t for t in targets if t.requires_grad]  # (an output of the child that needs no gradient reaches none)
    found = {}
    if pairs and live:
        # retain_graph: a backward run again (retain_graph=True outside) differentiates the same graph; it is freed
        # with the handle, when the forward's saved tensors are
        grads_found = torch.autograd.grad([o for o, _ in pairs], live, [g for _, g in pairs], allow_unused=True,
                                          retain_graph=True)
        found = {id(t): g for t, g in zip(live, grads_found)}
    unreached = [t for t in targets[len(spec.grad_inputs):] if found.get(id(t)) is None]
    if unreached:  # zeros for thunder's backward, which returns a gradient per input; .grad stays None as in eager
        unreached_grads.keep_unreached_grads_none(unreached)
    return tuple(torch.zeros_like(t) if found.get(id(t)) is None else found[id(t)] for t in targets)
