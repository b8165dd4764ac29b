"""Stage 7 (incoming gradients), ``.backward(grad)`` on a subclass output behaves as in eager.

In: the gradients ``.backward(grad)`` passes for the outputs of a compiled function. What happens: a gradient of
another kind than the compiled backward expects selects a backward made for it (below). Out: the input gradients,
as eager gives them.

The compiled backward is made for gradients of the kind of each output (a ``TwoTensor`` output gets a ``TwoTensor``
gradient), which is what ``.backward()`` without arguments passes and what torch.compile assumes. Eager PyTorch also
accepts other gradients, for instance a plain tensor for a ``TwoTensor`` output, and then runs the derivative
formulas with that plain tensor, which can change the type of the resulting gradients. torch.compile fails there
(pytorch issue 172556); thunder_subclass runs a backward made for the gradients actually given:

* a gradient of the expected kind, or one that the subclass coerces with ``__coerce_same_metadata_as_tangent__``,
  runs the compiled backward (``flatten_cotangent_<Cls>`` coerces it and checks it at run time);
* any other gradient selects a *backward variant*: the joint forward+backward trace is flattened again with the
  gradient's actual kind (``thunder_subclass.transforms.flatten`` re-records every derivative whose gradient types
  change), the backward part is cut out, fed with the tensors the compiled forward saved, compiled with the torch
  executor, memoised per gradient kind, and run.

:class:`BackwardVariants` is created by the flatten pass for each joint trace, travels into the backward trace as an
argument of ``flatten_cotangent_<Cls>``, learns the names of the saved tensors from :class:`SavedTensorNames` (a
thunder ``Transform`` that reads the final backward trace), and is found again at run time by the
``ThunderFunction.backward`` hook in ``_thunder_internals``. An entry loaded from the on-disk cache has a
:class:`StoredBackwardVariants` instead (the expected gradients as :class:`StoredGradient` descriptions, no joint
trace): a gradient of another kind makes it trace the call again in-process (``_thunder_internals.trace_anew``) for
the joint trace, whose variants then serve it.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

import thunder.core.dtypes as dtypes
import thunder.core.prims as prims
from thunder.core.proxies import TensorProxy
from thunder.core.pytree import tree_flatten
from thunder.core.trace import from_trace
from thunder.core.transform_common import Transform

from thunder_subclass import _thunder_internals
from thunder_subclass.errors import (
    SubclassGradientError,
    UnsupportedSubclassOperationError,
    UnsupportedTracingError,
    format_location,
)
from thunder_subclass.executor import register_symbol, subclass_executor
from thunder_subclass.frontend.fake import (
    FakeEnv, SizedContext, fake_execution, resolve_context, torch_device, torch_dtype,
)
from thunder_subclass.transforms.flatten import Flattener, flatten_subclasses, is_subclass_level
from thunder_subclass.frontend.subclass_symbols import is_flatten_bsym, is_unflatten_bsym
from thunder_subclass.frontend.proxy import (
    OpaqueObjectProxy, SubclassTensorProxy, ctx_key, has_symbolic_sizes, proxy_kind, runtime_kind,
    subclass_proxy_from_tensor,
)

__all__ = [
    "BackwardVariants", "StoredBackwardVariants", "SavedTensorNames", "forward_effects", "flatten_for_executors",
    "replace_grads", "run_backward",
    "differentiable_outputs", "mutated_inputs", "gradless_inputs",
]


def flatten_for_executors(trace):
    """The flatten pass as the plugin runs it before executors claim operations. A joint forward+backward trace
    (it holds ``get_grad``) also gets its :class:`BackwardVariants`, which the incoming gradients' kinds are coerced
    for, and which travels into the backward trace as the argument of ``backward_info`` (a no-op there: it makes the
    object a global of the compiled backward, where the ``ThunderFunction`` hooks find it)."""
    _refuse_unreduced_mask_outputs(trace)
    if not any(b.sym is prims.get_grad for b in trace.bound_symbols):
        return flatten_subclasses(trace)
    variants = BackwardVariants(trace, *_thunder_internals.current_compile_data())
    trace = flatten_subclasses(trace, cotangent_aliases=coerce_tangents(trace, variants))
    if trace is variants.joint:
        trace = from_trace(trace)
        trace.bound_symbols = list(variants.joint.bound_symbols)
    trace.bound_symbols.insert(len(trace.bound_symbols) - 1, backward_info.bind(variants, output=None))
    return trace


def _no_op(info) -> None:
    return None


# DONT_DCE: it has no output; thunder's forward/backward split puts it in the backward (it feeds no forward value)
backward_info = register_symbol("backward_info", meta=_no_op, fn=_no_op, tags=[prims.OpTags.DONT_DCE])


class BackwardVariants:
    """Backward programs of one compiled function for gradients of kinds other than the outputs' own."""

    def __init__(self, joint, compile_data, compile_stats):
        self.joint = joint
        self.compile_data = compile_data
        self.compile_stats = compile_stats
        ret = joint.bound_symbols[-1]
        self.outputs = tree_flatten(ret.args[0]["fw_flat_out"])[0]
        self.expected = tuple(proxy_kind(o) if isinstance(o, TensorProxy) else None for o in self.outputs)
        self.grad_of = {}  # output name -> its get_grad proxy in the joint trace
        for bsym in joint.bound_symbols:
            if bsym.sym.name == "get_grad" and isinstance(bsym.args[0], TensorProxy):
                self.grad_of[bsym.args[0].name] = bsym.output
        # the proxy of the gradient each output's compiled backward expects (for zeros of that kind)
        self.expected_proxy = [self.grad_of.get(getattr(o, "name", None), o) for o in self.outputs]
        self.saved_names: list[str] | None = None
        self._compiled: dict[tuple, Any] = {}
        # ids of the incoming gradients whose __coerce_same_metadata_as_tangent__ refused, per thread (canonical()
        # fills it for one backward call, accepts() reads it right after, in the same ThunderFunction.backward)
        self._refused = threading.local()
        # which forward outputs eager would give requires_grad (the others are marked non-differentiable)
        self.differentiable = _differentiable_outputs(joint)
        # (flat_args position, output position) of each input changed in place and its new value
        self.mutated_inputs = tuple(ret.args[0].get(_thunder_internals.MUTATED_INPUTS_KEY, (0, ()))[1])
        self._from_outputs = _grads_from_user_outputs(joint, self) if self.mutated_inputs else ()

    def canonical(self, grads) -> list | None:
        """``grads`` with a zero gradient of the expected kind where autograd materialized a plain zero tensor for
        a subclass output that nothing used (autograd.Function fills undefined gradients with plain zeros); None
        when nothing changes. A zero gradient contributes nothing, whatever its type."""
        changed = None
        refused = self._refused.ids = set()  # this thread's backward call: read by accepts() right after
        for i, (g, p) in enumerate(zip(grads, self.expected_proxy)):
            if g is None and _expects_tensor(p):  # not materialized (a function changing inputs in place)
                changed = list(grads) if changed is None else changed
                changed[i] = _zeros_for(p)
            elif _expects_subclass(p) and type(g) is torch.Tensor and not g.any():
                changed = list(grads) if changed is None else changed
                changed[i] = _zeros_for(p)
            elif (_expects_subclass(p) and is_traceable_wrapper_subclass(g)
                    and hasattr(g, "__coerce_same_metadata_as_tangent__") and runtime_kind(g) != _kind_of(p)):
                coerced = _coerced(g, p)
                if coerced is None:  # refused: eager never asks, and accepts it (accepts() sends it to a variant)
                    refused.add(id(g))
                else:
                    changed = list(grads) if changed is None else changed
                    changed[i] = coerced
        return changed

    def gradless_inputs(self, grads) -> tuple[int, ...]:
        """flat_args positions of inputs changed in place whose gradient eager leaves undefined for these incoming
        gradients: the new value's gradient is undefined (nothing used it after the call) and the input's gradient
        does not depend on another output's."""
        return tuple(i for (i, pos), from_others in zip(self.mutated_inputs, self._from_outputs)
                     if grads[pos] is None and not from_others)

    def __repr__(self) -> str:
        return f"BackwardVariants({len(self._compiled)} compiled)"

    def disk_state(self) -> tuple:
        """How an entry stored on disk (``thunder_subclass.runtime.disk_cache``) holds this object: what the run-time hooks
        read, without the joint trace (proxies, not storable): for each output the gradient its compiled backward
        expects (:class:`StoredGradient`: kind, sizes, flatten context), the names of the saved tensors and the grad
        mode of the call (to trace it again for a gradient of another kind: :meth:`StoredBackwardVariants.run`).
        Raises ValueError where that cannot be described (symbolic sizes; the entry is not stored)."""
        if self.saved_names is None:
            raise ValueError("the saved tensors of the backward are not known")
        expected = tuple(StoredGradient.state_of(p) for p in self.expected_proxy)
        return (expected, self.differentiable, self.mutated_inputs, tuple(self._from_outputs),
                forward_effects(self.joint), tuple(self.saved_names), torch.is_grad_enabled())

    @classmethod
    def from_disk_state(cls, state) -> StoredBackwardVariants:
        return StoredBackwardVariants(state, *_thunder_internals.current_compile_data())

    def accepts(self, grads) -> bool:
        """Whether the compiled backward serves these incoming gradients (checked at every backward call, after
        :meth:`canonical` coerced, once, those of another kind that the subclass can coerce): each is of the expected
        kind, or a subclass gradient that ``flatten_cotangent_<Cls>`` coerces. One that
        ``__coerce_same_metadata_as_tangent__`` refused (eager never asks it, and accepts the gradient) is served by a
        backward made for its kind, as a gradient of another class is."""
        refused = getattr(self._refused, "ids", ())
        for g, out, kind, p in zip(grads, self.outputs, self.expected, self.expected_proxy):
            if kind is None or g is None or runtime_kind(g) == kind:
                continue
            if (_expects_subclass(out) and _expects_subclass(p)
                    and hasattr(g, "__coerce_same_metadata_as_tangent__") and id(g) not in refused):
                continue  # flatten_cotangent_<Cls> coerces it (not where a plain gradient is expected: none there)
            return False
        return True

    def run(self, saved: list, grads, call=None) -> tuple:
        """The input gradients for ``grads`` (of other kinds than :meth:`accepts` takes) from a backward made for
        them, fed with the tensors the compiled forward ``saved``. (``call``: the forward's
        ``plugin_state.RememberedCall``, for :class:`StoredBackwardVariants`.)"""
        key = tuple(runtime_kind(g) for g in grads)
        compiled = self._compiled.get(key)
        if compiled is None:  # built under the tracing lock; a thread racing the first build builds an equal one
            compiled = self._compiled.setdefault(key, self._build(grads))
        fn, saved_positions, grad_positions = compiled
        return fn(*[saved[i] for i in saved_positions], *[grads[i] for i in grad_positions])

    def _build(self, grads):
        from thunder.core.trace import tracectx
        from thunder.core.transforms import dce
        from thunder.executors.passes import transform_for_execution
        from thunder.executors.torchex import ex as torchex

        if self.saved_names is None:
            raise SubclassGradientError(
                "thunder_subclass could not find the saved tensors of this compiled function's backward, so it "
                "cannot run a backward for gradients of another kind than its outputs. Pass gradients of the "
                "outputs' kinds to .backward()."
            )
        with _thunder_internals.TRACING_LOCK, \
                _thunder_internals.compile_data_context(self.compile_data, self.compile_stats):
            flattener = Flattener(self.joint)
            cotangents, grad_positions = [], []
            with tracectx(flattener.trace):
                for i, (g, out) in enumerate(zip(grads, self.outputs)):
                    gp = self.grad_of.get(getattr(out, "name", None))
                    if gp is None or not isinstance(g, torch.Tensor):
                        continue
                    if runtime_kind(g) == proxy_kind(gp):
                        new = gp
                    elif is_traceable_wrapper_subclass(g):
                        new = subclass_proxy_from_tensor(g, name=None, history=None)
                    else:
                        new = TensorProxy(like=gp)
                    flattener.alias(gp, new)
                    cotangents.append(new)
                    grad_positions.append(i)
            for bsym in self.joint.bound_symbols:
                flattener.visit(bsym)
            flat = flattener.trace
            flat.bound_symbols = flattener.bsyms
            flat = dce(flat)

            # the backward part: what the gradients need, starting from the saved tensors and the cotangents
            ret = flat.bound_symbols[-1]
            outputs = ret.args[0]["output"]
            available = {n: i for i, n in enumerate(self.saved_names)}
            cot_names = {p.name for p in cotangents}
            producers = {}
            for bsym in flat.bound_symbols:
                for o in bsym.flat_proxy_outs:
                    producers.setdefault(o.name, bsym)
            needed, used_saved, stack = set(), {}, [p for p in tree_flatten(outputs)[0] if isinstance(p, TensorProxy)]
            seen = set()
            while stack:
                p = stack.pop()
                if p.name in seen:
                    continue
                seen.add(p.name)
                if p.name in cot_names:
                    continue
                if p.name in available:
                    used_saved[p.name] = p
                    continue
                bsym = producers.get(p.name)
                if bsym is None or bsym.sym.name == "unpack_trivial":
                    raise SubclassGradientError(
                        f"the backward for gradients of kinds {[getattr(k, '__name__', k) for k in map(runtime_kind, grads)]} "
                        f"needs {p.name}, which the compiled forward did not save; pass gradients of the outputs' "
                        "kinds to .backward()."
                    )
                if id(bsym) not in needed:
                    needed.add(id(bsym))
                    stack.extend(bsym.flat_proxy_args)
            body = [b for b in flat.bound_symbols if id(b) in needed]

            saved_args = sorted(used_saved.values(), key=lambda p: available[p.name])
            args = [*saved_args, *cotangents]
            trace = _thunder_internals.new_trace("subclass_backward_variant", args, names=flat.names)
            with tracectx(trace):
                for p in args:  # the arguments are defined in the trace (an argument returned as is: a gradient
                    prims.unpack_trivial(p, name=p.name)  # that passes through, as that of x + 1)
                trace.bound_symbols = [*trace.bound_symbols, *body,
                                       prims.python_return.bind(tuple(outputs), output=None)]
            extrace = transform_for_execution(trace, executors_list=[subclass_executor, torchex])
            fn = extrace.python_callable()
        return fn, [available[p.name] for p in saved_args], grad_positions


class StoredGradient:
    """The gradient a loaded entry's compiled backward expects for one output (what :class:`BackwardVariants` reads
    from the gradient proxy ``expected_proxy[i]`` in memory): a plain tensor of a shape, dtype and device, or a
    subclass (``subclass_type``, ``flatten_ctx``, outer size and strides) of such inner tensors, or of opaque inner
    values. Its ``kind`` is :func:`proxy_kind` of the proxy it stands for; :meth:`zeros` makes a zero gradient of it;
    ``subclass_type`` / ``flatten_ctx`` are what ``_coerced`` reads."""

    __slots__ = ("subclass_type", "flatten_ctx", "size", "stride", "dtype", "device", "inner", "kind")

    def __init__(self, state):
        tag, *rest = state
        self.subclass_type = self.flatten_ctx = self.dtype = self.device = self.inner = None
        if tag == "tensor":
            size, dtype, device = rest
            self.size, self.stride = tuple(size), None
            self.dtype, self.device = getattr(torch, dtype.removeprefix("torch.")), torch.device(device)
            self.kind = torch.Tensor
        elif tag == "subclass":
            self.subclass_type, self.flatten_ctx, size, stride, inner = rest
            self.size, self.stride = tuple(size), tuple(stride)
            self.inner = {a: StoredGradient(q) if q[0] != "opaque" else _Opaque(q[1]) for a, q in inner}
            self.kind = (self.subclass_type, ctx_key(self.flatten_ctx),
                         tuple(q.kind for q in self.inner.values()))
        else:
            raise ValueError(f"unknown stored gradient {tag!r}")

    @staticmethod
    def state_of(p) -> tuple | None:
        """The description of gradient proxy ``p`` that :class:`StoredGradient` is built from (None: no tensor);
        ValueError where it has symbolic sizes (the entry is not stored)."""
        if not isinstance(p, TensorProxy):
            return None
        if has_symbolic_sizes(p) or isinstance(getattr(p, "flatten_ctx", None), SizedContext):
            raise ValueError("a backward whose gradients have symbolic sizes")
        if isinstance(p, SubclassTensorProxy):
            inner = tuple((a, ("opaque", q.value) if isinstance(q, OpaqueObjectProxy) else StoredGradient.state_of(q))
                          for a, q in p.inner.items())
            return ("subclass", p.subclass_type, p.flatten_ctx, tuple(int(d) for d in p.outer_size),
                    tuple(int(d) for d in p.outer_stride), inner)
        return ("tensor", tuple(int(d) for d in p._shape), str(torch_dtype(p)), str(torch_device(p)))

    def zeros(self) -> torch.Tensor:
        if self.subclass_type is None:
            return torch.zeros(self.size, dtype=self.dtype, device=self.device)
        inner = {a: q.value if isinstance(q, _Opaque) else q.zeros() for a, q in self.inner.items()}
        ctx = resolve_context(self.flatten_ctx, self.size, self.stride)
        return self.subclass_type.__tensor_unflatten__(inner, ctx, self.size, self.stride)


class _Opaque:
    """An opaque inner value of a :class:`StoredGradient` (a DTensor's device mesh)."""

    __slots__ = ("value", "kind")

    def __init__(self, value):
        self.value, self.kind = value, type(value)


def _expects_tensor(p) -> bool:
    return isinstance(p, (TensorProxy, StoredGradient))


def _expects_subclass(p) -> bool:
    return isinstance(p, SubclassTensorProxy) or (isinstance(p, StoredGradient) and p.subclass_type is not None)


def _kind_of(p):
    return p.kind if isinstance(p, StoredGradient) else proxy_kind(p)


def _zeros_for(p) -> torch.Tensor:
    return p.zeros() if isinstance(p, StoredGradient) else _zeros_of(p)


class StoredBackwardVariants(BackwardVariants):
    """The :class:`BackwardVariants` of an entry loaded from disk: it serves the compiled backward as the original
    does (the gradient kinds it expects, zero gradients for outputs nothing used, coercion of subclass gradients, the
    outputs' differentiability, inputs changed in place), from :class:`StoredGradient` descriptions in place of the
    joint trace's proxies. A backward for gradients of another kind is built from the joint trace, which a loaded
    entry does not have: :meth:`run` traces the call again in this process (as the first process did, the entry's
    forward then recompiled: a miss) and, where that trace saved the same tensors as the loaded forward, runs the
    backward variant the new trace's :class:`BackwardVariants` builds on the loaded forward's saved tensors."""

    def __init__(self, state, compile_data, compile_stats):
        expected, differentiable, mutated, from_outputs, effects, saved_names, grad = state
        self.joint = None
        self.compile_data, self.compile_stats = compile_data, compile_stats
        self.outputs = self.expected_proxy = [None if e is None else StoredGradient(e) for e in expected]
        self.expected = tuple(None if p is None else p.kind for p in self.expected_proxy)
        self.grad_of = {}
        self.saved_names = list(saved_names)
        self._compiled = {}
        self._refused = threading.local()
        self.differentiable = None if differentiable is None else tuple(differentiable)
        self.mutated_inputs = tuple(tuple(m) for m in mutated)
        self._from_outputs = tuple(from_outputs)
        self.effects = effects
        self.grad_enabled = grad
        self._live: BackwardVariants | None = None  # the variants of the call traced again (run)

    def run(self, saved: list, grads, call=None) -> tuple:
        if self._live is None:
            self._live = self._trace_again(grads, call)
        return self._live.run(saved, grads)

    def _trace_again(self, grads, call) -> BackwardVariants:
        kinds = [getattr(k, "__name__", k) for k in map(runtime_kind, grads)]
        why = None
        if call is None or call.cd is not self.compile_data:
            why = "the call it came from is not known (a function compiled by thunder.compile's plugin entry)"
        else:
            resolved = call.live(check_versions=False)
            if resolved is None:
                why = "an argument of the call was freed since the forward"
        if why is None:
            args, kwargs, _ = resolved
            entry = _thunder_internals.trace_anew(self.compile_data, self.compile_stats, call.eager, args, kwargs,
                                                  grad=self.grad_enabled)
            live = variants_in(entry.backward_fn) if entry.backward_fn is not None else None
            if live is None or live.saved_names != self.saved_names:
                why = "the call traced again in this process saves other tensors than the loaded forward"
            else:
                return live
        raise SubclassGradientError(
            f"this compiled function's backward was loaded from the thunder_subclass disk cache and received "
            f"gradients of kinds {kinds}, other than its outputs'; a backward for them is built from the forward's "
            f"trace, which thunder_subclass traces again for a loaded entry, but could not here: {why}. Pass "
            "gradients of the outputs' kinds to .backward(), or compile without the disk cache "
            "(thunder_subclass.jit(..., disk_cache=False) or THUNDER_SUBCLASS_DISK_CACHE=0)."
        )

    def __repr__(self) -> str:
        return "StoredBackwardVariants()"


def forward_effects(joint) -> str | None:
    """What a forward trace writes in place that outlives the call, or draws at random (a ``create_graph=True``
    backward recomputes the forward eagerly only where it does neither: ``thunder_subclass.transforms.higher_order``);
    None if nothing. Kept with an entry stored on disk (:class:`StoredBackwardVariants` has no joint trace)."""

    def walk(bsyms):
        for b in bsyms:
            tags = getattr(b.sym, "tags", None) or ()
            if any(getattr(t, "name", "") == "RANDOM_OP" for t in tags):
                return f"draws random numbers ({b.sym.name})"
            found = walk(b.subsymbols)
            if found:
                return found
        return None

    for b in joint.bound_symbols:
        if b.sym.name == "copy_" or b.sym.name.startswith("copy_"):
            return "changes a tensor in place that outlives the call (an input, a parameter or a buffer)"
    return walk(joint.bound_symbols)


def _grads_from_user_outputs(joint, variants) -> tuple[bool, ...]:
    """For each input changed in place (``variants.mutated_inputs``), whether its gradient in ``joint`` depends on the
    gradient of an output other than its new value."""
    grads = joint.bound_symbols[-1].args[0]["output"]
    found = []
    for i, pos in variants.mutated_inputs:
        others = {variants.grad_of[o.name].name for k, o in enumerate(variants.outputs)
                  if k != pos and isinstance(o, TensorProxy) and o.name in variants.grad_of}
        for bsym in joint.bound_symbols:
            if any(a.name in others for a in bsym.flat_proxy_args):
                others.update(o.name for o in bsym.flat_proxy_outs)
        found.append(isinstance(grads[i], TensorProxy) and grads[i].name in others)
    return tuple(found)


def gradless_inputs(compiled_backward, grads) -> tuple[int, ...]:
    """The ``ThunderFunction.backward`` hook's handler: inputs whose gradient is undefined, as in eager."""
    variants = _variants_of(compiled_backward)
    return () if variants is None else variants.gradless_inputs(grads)


def _differentiable_outputs(joint) -> tuple[bool, ...] | None:
    """For each forward output of ``joint``, whether eager would return it requiring grad, propagated through the
    forward as autograd does: from the inputs' ``requires_grad``, through every differentiable op to floating-point
    results; not through ``detach`` or code under ``torch.no_grad``; and, for thunder_subclass's own symbols (unrolled
    subclass operations, inner tensors read with ``x.a``, subclasses built in traced code), as the fake run said
    (the inner tensors of a computed subclass do not require grad). None when every output is differentiable (thunder's
    default)."""
    from thunder.core.proxies import ProxyTag

    ret = joint.bound_symbols[-1].args[0]
    requires = {p.name: p.requires_grad for p in tree_flatten(ret["flat_args"])[0] if isinstance(p, TensorProxy)}
    for bsym in joint.bound_symbols:
        if bsym.sym in (prims.get_grad, prims.put_grad, prims.python_return):
            continue
        outs = [o for o in bsym.flat_proxy_outs if isinstance(o, TensorProxy)]
        if not outs:
            continue
        flows = bsym.sym.name != "detach" and any(
            requires.get(a.name, False) for a in bsym.flat_proxy_args if isinstance(a, TensorProxy)
        )
        if is_flatten_bsym(bsym) or is_unflatten_bsym(bsym):
            for o in outs:
                requires.setdefault(o.name, bool(o.requires_grad))
            continue
        if is_subclass_level(bsym):  # the fake run knows which results are differentiable; the arguments, whether any
            for o in outs:  # of them requires grad here (a grad rule's fake run treats every float input as if)
                requires.setdefault(o.name, flows and bool(o.requires_grad))
            continue
        for o in outs:
            requires.setdefault(
                o.name,
                flows and dtypes.is_inexact_dtype(o.dtype) and ProxyTag.DETACHED_AUTOGRAD_GRAPH not in o.tags,
            )
    outputs = tree_flatten(ret["fw_flat_out"])[0]
    mask = tuple(requires.get(o.name, True) if isinstance(o, TensorProxy) else False for o in outputs)
    return None if all(mask) else mask


def differentiable_outputs(compiled_backward) -> tuple[bool, ...] | None:
    """The ``ThunderFunction.forward`` hook's handler: which outputs are differentiable (None: all)."""
    variants = _variants_of(compiled_backward)
    return None if variants is None else variants.differentiable


def mutated_inputs(compiled_backward) -> tuple[int, ...]:
    """The ``ThunderFunction.forward`` hook's handler: which inputs' new values end the outputs (to mark dirty)."""
    variants = _variants_of(compiled_backward)
    return () if variants is None else variants.mutated_inputs


def _coerced(g, p):
    """The incoming gradient ``g`` converted by its ``__coerce_same_metadata_as_tangent__`` to the kind of ``p`` (the
    gradient proxy the compiled backward expects), as torch.compile converts it, or None when the subclass refuses
    (returns None or another type)."""
    cls = type(g)
    expected_cls = getattr(p, "subclass_type", None) or type(g)
    expected_ctx = resolve_context(p.flatten_ctx, g.shape, g.stride())
    coerce = g.__coerce_same_metadata_as_tangent__
    coerced = coerce(expected_ctx) if cls is expected_cls else coerce(expected_ctx, expected_cls)
    # trusted when of the expected class, as torch.compile trusts it (flatten_cotangent_<Cls> takes it from there)
    return coerced if coerced is not None and type(coerced) is expected_cls else None


def _zeros_of(p):
    """A real zero tensor of the kind of proxy ``p`` (a subclass rebuilt from zero inner tensors)."""
    if has_symbolic_sizes(p):  # the sizes of this call are not known here
        raise UnsupportedTracingError(
            f"a zero gradient for a {proxy_kind(p)} output with symbolic sizes (cache=\"symbolic values\") cannot "
            "be made; pass dynamic=False to thunder_subclass.jit for one trace per size."
        )
    if isinstance(p, SubclassTensorProxy):
        inner = {a: q.value if isinstance(q, OpaqueObjectProxy) else _zeros_of(q) for a, q in p.inner.items()}
        ctx = resolve_context(p.flatten_ctx, p.outer_size, p.outer_stride)
        return p.subclass_type.__tensor_unflatten__(inner, ctx, p.outer_size, p.outer_stride)
    return torch.zeros(tuple(p._shape), dtype=torch_dtype(p), device=torch_device(p))


def coerced_tangent(gp: SubclassTensorProxy):
    """The gradient kind the backward is compiled for, for an output of kind ``gp``: the output's own, detached
    (a gradient does not require grad), then what the subclass's ``__coerce_tangent_metadata__`` turns it into (as
    torch.compile does: a DTensor with a Partial placement expects a Replicate gradient). Returns a new proxy, or
    None when unchanged."""
    fake = FakeEnv(pin=False).to_fake(gp)
    with fake_execution(), torch.no_grad():
        # a gradient does not require grad (DTensor's flatten context records requires_grad)
        tangent = fake.detach() if fake.requires_grad else fake
        if hasattr(type(tangent), "__coerce_tangent_metadata__"):
            tangent = tangent.__coerce_tangent_metadata__()
    if runtime_kind(tangent) == proxy_kind(gp):
        return None
    if has_symbolic_sizes(gp):  # the gradient kind would have this trace's sizes, unless only metadata changed
        same = _symbolic_tangent(gp, fake, tangent)
        if same is not None:
            return same
        raise UnsupportedTracingError(
            f"the gradient of a {proxy_kind(gp)} output is coerced to another kind, which thunder_subclass does not "
            "do with symbolic sizes (cache=\"symbolic values\"); pass dynamic=False to thunder_subclass.jit for "
            "one trace per size."
        )
    if not is_traceable_wrapper_subclass(tangent):  # a plain gradient expected for this subclass output
        from thunder.core.proxies import tensorproxy

        return tensorproxy(tangent, name=None, history=None)
    return subclass_proxy_from_tensor(tangent, name=None, history=None)


def _symbolic_tangent(gp, fake, tangent):
    """The gradient proxy for output ``gp`` with symbolic sizes when the coerced ``tangent`` differs from the output's
    fake only in flatten metadata that holds no sizes beyond the outer size and strides (a DTensor's gradient: its
    context records ``requires_grad``): the output's sizes (number proxies), the tangent's metadata; None otherwise."""
    from thunder_subclass.frontend.fake import SizedContext, context_template

    if type(tangent) is not type(fake) or not isinstance(gp, SubclassTensorProxy):
        return None
    attrs, ctx = tangent.__tensor_flatten__()
    fake_attrs, _ = fake.__tensor_flatten__()
    if list(attrs) != list(fake_attrs) or tangent.shape != fake.shape or tangent.stride() != fake.stride():
        return None
    for a in attrs:
        t, f = getattr(tangent, a), getattr(fake, a)
        if not isinstance(t, torch.Tensor):  # an opaque attribute (a DTensor's device mesh): the same object
            if t is not f:
                return None
            continue
        if (is_traceable_wrapper_subclass(t) or t.shape != f.shape
                or t.stride() != f.stride() or t.dtype != f.dtype):
            return None
    if isinstance(gp.flatten_ctx, SizedContext):
        template, found = context_template(ctx, tuple(tangent.shape), tuple(tangent.stride()))
        ctx = SizedContext(template) if found else ctx
    elif gp.flatten_ctx == ctx:
        return None
    if not _sizes_free(ctx):
        return None
    p = SubclassTensorProxy(like=gp)  # new inner proxies of the output's sizes
    p.flatten_ctx, p._requires_grad = ctx, False
    return p


def _sizes_free(ctx) -> bool:
    """Whether a flatten context holds no size tuple other than the outer size / strides markers."""
    from thunder_subclass.frontend.fake import SizedContext

    leaves = tree_flatten(ctx.template if isinstance(ctx, SizedContext) else ctx)[0]
    return not any(isinstance(v, torch.Size) for v in leaves)


def _refuse_unreduced_mask_outputs(trace) -> None:
    """A DTensor that leaves the compiled function with a ``_MaskPartial`` placement still holding its mask (the result
    of ``embedding`` on a row-sharded weight, not reduced inside): the mask is computed by the trace's operations, and
    the object returned would carry the fake mask of tracing in its placement, so a ``redistribute`` / ``full_tensor``
    of it after the call would reduce with the wrong mask. Refused with the line that made it."""
    ret = trace.bound_symbols[-1] if trace.bound_symbols else None
    if ret is None or ret.sym.id != prims.PrimIDs.RETURN:
        return
    inputs = {p.name for p in tree_flatten((trace.args, trace.kwargs))[0] if isinstance(p, TensorProxy)}
    for p in ret.flat_proxy_args:
        if isinstance(p, SubclassTensorProxy) and p.name not in inputs and _thunder_internals.holds_mask(p.flatten_ctx):
            producer = next((b for b in trace.bound_symbols if any(o.name == p.name for o in b.flat_proxy_outs)), None)
            line = getattr(getattr(producer, "source_positions", None), "lineno", None)
            where = format_location(getattr(producer, "source_filename", None), line)
            raise UnsupportedSubclassOperationError(
                f"a {p.subclass_type.__qualname__} with a _MaskPartial placement that holds its mask (the result of "
                f"embedding on a row-sharded weight, made at {where}) is returned by the compiled function: "
                "thunder_subclass computes the mask inside the compiled code, and the returned placement cannot hold "
                "it. Return the reduced value instead (.redistribute(...) / .full_tensor() inside), or call the "
                "embedding outside the compiled function."
            )


def coerce_tangents(trace, variants: BackwardVariants) -> list[tuple]:
    """Apply :func:`coerced_tangent` to the incoming gradients of joint ``trace``: the (old, new) proxy pairs the
    flatten pass substitutes, with ``variants`` updated to expect the new kinds."""
    from thunder.core.trace import tracectx

    aliases = []
    with tracectx(trace):
        for i, out in enumerate(variants.outputs):
            gp = variants.grad_of.get(getattr(out, "name", None))
            if not isinstance(gp, SubclassTensorProxy):
                continue
            coerced = coerced_tangent(gp)
            if coerced is not None:
                aliases.append((gp, coerced))
                variants.expected_proxy[i] = coerced
                variants.expected = (*variants.expected[:i], proxy_kind(coerced), *variants.expected[i + 1:])
    return aliases


def variants_in(fn) -> BackwardVariants | None:
    """The :class:`BackwardVariants` a compiled backward function refers to (its trace's objects are globals)."""
    import inspect

    try:
        fn = inspect.unwrap(fn)  # thunder decorates it (torch.no_grad, no_autocast)
    except ValueError:
        return None
    for v in getattr(fn, "__globals__", {}).values():
        if isinstance(v, BackwardVariants):
            return v
    return None


# run time: the ThunderFunction.backward hook's handlers

_VARIANTS_ATTR = "_thunder_subclass_backward_variants"
_UNSET = object()


def _variants_of(compiled_backward) -> BackwardVariants | None:
    """The :class:`BackwardVariants` of a compiled backward, found once and kept on the function object itself (the
    function already holds it among its globals). Owned by the compiled backward: freed with it, and with it the
    compile data the variants hold (no module-level table keyed by the function whose value keeps the function's
    jit alive). Found again, identically, by a thread that races the first lookup."""
    found = getattr(compiled_backward, _VARIANTS_ATTR, _UNSET)
    if found is _UNSET:
        found = variants_in(compiled_backward)
        try:
            setattr(compiled_backward, _VARIANTS_ATTR, found)
        except (AttributeError, TypeError):  # no instance dictionary (a builtin): looked up at each call
            pass
    return found


def replace_grads(compiled_backward, grads) -> list | None:
    """Incoming gradients made canonical for the backward (:meth:`BackwardVariants.canonical`), or None."""
    variants = _variants_of(compiled_backward)
    return None if variants is None else variants.canonical(grads)


def run_backward(compiled_backward, grads, take_saved_tensors, call=None):
    """Run a backward variant when the compiled backward does not accept these gradients, else ``NOT_HANDLED``
    (``call``: the forward's ``plugin_state.RememberedCall``, or None)."""
    variants = _variants_of(compiled_backward)
    if variants is None or variants.accepts(grads):
        return _thunder_internals.NOT_HANDLED
    return variants.run(take_saved_tensors(), list(grads), call)


class SavedTensorNames(Transform):
    """Reads, from the final backward trace, the names of the tensors the forward saves (in order), for the
    backward variants that trace refers to."""

    def transform_trace_post_optimization(self, computation_trace, **kwargs):
        variants = [
            a
            for bsym in computation_trace.bound_symbols
            for a in bsym.args
            if isinstance(a, BackwardVariants)
        ]
        if not variants or not computation_trace.args:
            return computation_trace
        # the backward trace's first argument is (saved tensors, saved non-tensors), in ctx.saved_tensors order
        saved_for_backward = computation_trace.args[0]
        tensors = saved_for_backward[0] if isinstance(saved_for_backward, (list, tuple)) and saved_for_backward else []
        names = [p.name for p in tensors if isinstance(p, TensorProxy)]
        for v in variants:
            v.saved_names = names
        return computation_trace
