"""Accessors for torch's private state, for the stages above (no hook is installed here).

* the opaque-object registry (``torch._library.opaque_object``, torch >= 2.11: :func:`is_opaque_reference_object`,
  :func:`opaque_guard_fn`, :func:`opaque_attributes_supported`) and torch's fake script objects
  (:func:`real_script_object`);
* nested ints of jagged NestedTensors (``torch.nested._internal``: the offsets -> nested int registry and
  ``FakeTensor.nested_int_memo``: :func:`registered_nested_int`, :func:`set_fake_nested_int`,
  :func:`new_nested_int`) and a ``FakeTensorMode`` whose ``create_symbolic_nested_int`` makes plain nested ints
  instead of ``ShapeEnv`` symbols (:func:`fake_tensor_mode_class`);
* the user's ``TorchDispatchMode`` stack (:func:`active_dispatch_modes`, :func:`is_user_dispatch_mode_active`);
* torch's C++ tensor guard ``torch._C._dynamo.guards.TensorGuards`` (:func:`tensor_metadata_guard`: the fused
  prologue's fast check of tensor metadata, with the Python checks behind it);
* ``nn.Module``'s hook dictionaries, the global ones included (:func:`module_forward_hooks`,
  :func:`module_has_backward_hooks`, :func:`has_no_global_module_hooks`, :func:`module_has_no_own_hooks_expression`)
  and ``Module._call_impl``;
* fake-tensor execution's data-dependence exceptions (``torch._subclasses.fake_tensor``:
  :func:`data_dependent_exception_types`), which ``graph_breaks`` reads as graph breaks;
* fakes on which values read as Python numbers are symbols (a ``ShapeEnv``: :func:`value_symbol_fake_mode`,
  :func:`has_value_symbols`) and :func:`is_fake_tensor`, for the subclass checker (``check``);
* jagged NestedTensor attention for fake runs (``torch.nested._internal.sdpa``'s checks and backend choice:
  :func:`fake_run_replacement`): where eager takes its math backend (on CPU), which runs on strided nested tensors
  that fake tensors cannot make, a custom operator computing the same per component (registered on first use or by
  :func:`register_plugin_operators`); the element count of a
  NestedTensor with holes from known lengths (:func:`holes_lengths`, :func:`jagged_numel`; torch's own raises for
  fake lengths);
* the autograd engine's end-of-backward callbacks (``Variable._execution_engine.queue_callback``:
  :func:`at_end_of_backward`, for ``unreached_grads``).
"""

from __future__ import annotations

import functools
import math
import re
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch

from thunder_subclass._thunder_internals.versions import (
    OPAQUE_ATTRIBUTES_TORCH,
    format_version,
)


@functools.cache
def _opaque_registry() -> tuple[Callable, Callable] | None:
    """``(is_reference_type, get_info)`` from ``torch._library.opaque_object``, or None where torch has no opaque
    reference attributes (torch 2.10: no ``get_opaque_obj_info``, no ``guard_fn``). torch 2.15 calls reference types
    "symbolic" (``is_opaque_symbolic_type``; the old name still works there but logs a deprecation on each call)."""
    try:
        from torch._library import opaque_object
    except ImportError:
        return None
    get_info = getattr(opaque_object, "get_opaque_obj_info", None)
    is_reference = getattr(opaque_object, "is_opaque_symbolic_type", None) or getattr(
        opaque_object, "is_opaque_reference_type", None
    )
    if get_info is None or is_reference is None:
        return None
    return is_reference, get_info


def opaque_attributes_supported() -> bool:
    """Whether this torch lets ``__tensor_flatten__`` list opaque reference objects (torch >= 2.11)."""
    return _opaque_registry() is not None


def opaque_attributes_unavailable(what: str) -> Exception:
    """The :class:`TorchFeatureUnavailableError` for ``what`` (an opaque attribute) where torch lacks them."""
    from thunder_subclass.errors import TorchFeatureUnavailableError

    needs = format_version(OPAQUE_ATTRIBUTES_TORCH)
    return TorchFeatureUnavailableError(
        f"{what}: opaque reference attributes in __tensor_flatten__ need torch >= {needs} (torch._opaque_base, "
        f"torch._library.opaque_object.get_opaque_obj_info); found torch {torch.__version__}.",
        feature="opaque reference attributes",
        needs_torch=needs,
    )


def is_opaque_reference_object(v: Any) -> bool:
    """An object of a type registered with ``torch._library.opaque_object.register_opaque_type(...,
    typ="reference")`` (torch 2.15: ``register_custom_class(..., typ="symbolic")``; DeviceMesh is one). Always False
    where torch has no opaque reference attributes."""
    registry = _opaque_registry()
    if registry is None:
        return False
    try:
        return bool(registry[0](type(v)))
    except Exception:
        return False


def real_script_object(v: Any) -> Any:
    """The real object a ``FakeScriptObject`` stands for (``torch._library.fake_class_registry``), else ``v``. After
    torch.compile has run on DTensors in the same process, fake DTensors made by a fake run can hold their mesh as
    one; what the trace records is the mesh itself."""
    from torch._library.fake_class_registry import FakeScriptObject

    return v.real_obj if isinstance(v, FakeScriptObject) else v


class RaggedSymbolicSize(tuple):
    """The outer size of a jagged NestedTensor with symbolic sizes as traced code gets it (``x.shape``, ``x.size()``):
    a tuple of number proxies and nested ints (a ``torch.Size`` takes no proxy); returned by the compiled function,
    it becomes the ``torch.Size`` eager returns (``fixes.epilogue``)."""

    __slots__ = ()

    def __getitem__(self, key):  # a slice of a torch.Size is one
        item = tuple.__getitem__(self, key)
        return type(self)(item) if isinstance(key, slice) else item


def is_nested_int(v: Any) -> bool:
    """A nested int (``torch.nested._internal.nested_int.NestedIntNode`` in a ``torch.SymInt``): the ragged size of a
    jagged NestedTensor (``j1`` in ``torch.Size([3, j1, 5])``), or a multiple of one (its strides: ``5*j1``)."""
    if not isinstance(v, torch.SymInt):
        return False
    try:
        return bool(v.node.is_nested_int())
    except Exception:
        return False


def registered_nested_int(t: Any) -> torch.SymInt | None:
    """The nested int torch associates with tensor ``t`` (the offsets or lengths of jagged NestedTensors): for a real
    tensor, the entry of ``torch.nested._internal.nested_tensor._tensor_symint_registry``; for a fake one, its
    ``nested_int_memo``. None when it has none (then the next NestedTensor built on it makes a new one)."""
    from torch._subclasses.fake_tensor import FakeTensor

    if not isinstance(t, torch.Tensor):
        return None
    if isinstance(t, FakeTensor):
        return t.nested_int_memo
    from torch.nested._internal.nested_tensor import _tensor_symint_registry

    return _tensor_symint_registry.get(t)


def set_fake_nested_int(fake: Any, value: torch.SymInt) -> None:
    """Associate nested int ``value`` with fake tensor ``fake`` (``FakeTensor.nested_int_memo``), as torch's
    ``NestedTensor.__tensor_unflatten__`` does for fakes: NestedTensors built on it in a fake run get that ragged size."""
    fake.nested_int_memo = value


def new_nested_int() -> torch.SymInt:
    """A nested int no tensor has yet, numbered by torch's own counter (``get_tensor_symint`` of a fresh tensor, made
    outside any fake mode), so that it never equals a nested int of a real tensor."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.nested._internal.nested_tensor import get_tensor_symint

    with unset_fake_temporarily():
        return get_tensor_symint(torch.empty(0))


@functools.cache
def fake_tensor_mode_class() -> type:
    """``FakeTensorMode`` whose nested ints for offsets made inside a fake run (``nested_tensor_from_jagged`` on
    computed offsets) are plain nested ints, as in eager (:func:`new_nested_int`), instead of symbols of a
    ``ShapeEnv`` (torch's ``FakeTensorMode.create_symbolic_nested_int`` requires one; without it, building such a
    NestedTensor on fakes fails)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    class NestedIntFakeTensorMode(FakeTensorMode):
        def create_symbolic_nested_int(self, *, nt_tensor_id=None):
            return new_nested_int()

    return NestedIntFakeTensorMode


def opaque_guard_fn(typ: type):
    """The ``guard_fn`` registered for opaque type ``typ`` (``torch._library.opaque_object``), or None."""
    registry = _opaque_registry()
    if registry is None:
        return None
    return getattr(registry[1](typ), "guard_fn", None)


def active_dispatch_modes() -> list:
    """The user's ``TorchDispatchMode`` s active now, innermost last (``torch.utils._python_dispatch``'s stack)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return list(_get_current_dispatch_mode_stack())


def is_user_dispatch_mode_active() -> bool:
    """A ``TorchDispatchMode`` is active that torch.compile runs the call eagerly for (Dynamo skips the frame,
    ``torch/_dynamo/convert_frame.py``): one that is not an infra mode (``FakeTensorMode``, proxy modes) and does not
    set ``ignore_compile_internals()``. One C call when no mode is active (the per-call path)."""
    n = torch._C._len_torch_dispatch_stack()
    if not n:
        return False
    from torch.utils._python_dispatch import _get_dispatch_stack_at

    for i in range(n):
        mode = _get_dispatch_stack_at(i)
        if not mode.is_infra_mode() and not mode.ignore_compile_internals():
            return True
    return False


def has_no_global_module_hooks() -> bool:
    """No global module hooks and no ``torch.jit`` tracing: what every module call depends on besides the module's own
    hooks (:func:`module_forward_hooks`; the fused prologue checks it once per call)."""
    from torch.nn.modules import module as m

    return not (m._global_backward_pre_hooks or m._global_backward_hooks or m._global_forward_hooks
                or m._global_forward_pre_hooks or torch._C._get_tracing_state())


def module_has_no_own_hooks_expression(v: str) -> str:
    """A Python expression, for generated code, true when the module named ``v`` has no hooks of its own (with
    :func:`has_no_global_module_hooks`: ``module_forward_hooks(module) == ((), ())``, without a call per module)."""
    return f"not ({v}._forward_pre_hooks or {v}._forward_hooks or {v}._backward_hooks or {v}._backward_pre_hooks)"


def tensor_metadata_guard(tensors: Sequence, strides: Sequence, dims: Sequence | None = None) -> Callable | None:
    """``check(*tensors) -> bool``: torch's C++ tensor guard (``torch._C._dynamo.guards.TensorGuards``, what dynamo's
    ``TENSOR_MATCH`` guards run), made from ``tensors`` as examples, that is True for tensors of the same Python types,
    dispatch keys, dtypes, devices, ``requires_grad``, sizes and, where ``strides[i]`` is not None, strides (None for
    a non-tensor argument). That is stricter than thunder's metadata checks (dispatch keys) and much cheaper than
    them in Python: a caller checks in Python when it is False. None when this torch has no such guard or it does not
    accept ``tensors`` (it is checked on them once). ``dims[i]``, when given and not None, is tensor ``i``'s sizes with
    None for a dynamic dim (a symbolic size: torch's guard then checks only the number of dims there; 2.10 to 2.15
    take None so), else its sizes are its example's."""
    guards = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
    make = getattr(guards, "TensorGuards", None)
    if make is None or not tensors:
        return None
    try:
        with torch._C.DisableTorchFunctionSubclass():  # no __torch_function__ of the user's runs for these reads
            sizes = [list(t.shape) if dims is None or dims[i] is None else list(dims[i])
                     for i, t in enumerate(tensors)]
        guard = make(*tensors, dynamic_dims_sizes=sizes,
                     dynamic_dims_strides=[list(st) if st is not None else [None] * len(size)
                                           for size, st in zip(sizes, strides)])
        check = guard.check
        if check(*tensors) is not True:
            return None
    except Exception:  # noqa: BLE001 - no C++ guard: the Python checks stay
        return None
    return check


def module_forward_hooks(module) -> tuple | None:
    """``(pre, post)``: the forward pre-hooks and forward hooks that calling ``module`` runs, as ``(hook, takes_kwargs)``
    pairs in the order ``Module._call_impl`` calls them (``torch/nn/modules/module.py``: the global ones registered
    with ``register_module_forward_pre_hook`` / ``register_module_forward_hook`` first, then the module's own); None
    when its call involves more than those (backward hooks of the module or global ones, ``torch.jit`` tracing)."""
    from torch.nn.modules import module as m

    if module_has_backward_hooks(module) or torch._C._get_tracing_state():
        return None
    pre, post = module._forward_pre_hooks, module._forward_hooks
    global_pre, global_post = m._global_forward_pre_hooks, m._global_forward_hooks
    if global_pre:
        pre = {**global_pre, **pre} if pre else global_pre
    if global_post:
        post = {**global_post, **post} if post else global_post
    pre_kwargs = module._forward_pre_hooks_with_kwargs
    post_kwargs = module._forward_hooks_with_kwargs
    global_post_kwargs = getattr(m, "_global_forward_hooks_with_kwargs", {})
    return (
        tuple((h, k in pre_kwargs) for k, h in pre.items()) if pre else (),
        tuple((h, k in post_kwargs or k in global_post_kwargs) for k, h in post.items()) if post else (),
    )


def module_has_backward_hooks(module) -> bool:
    """Whether calling ``module`` sets up backward hooks: its own (``register_full_backward_hook``,
    ``register_full_backward_pre_hook``, ``register_backward_hook``) or global ones."""
    from torch.nn.modules import module as m

    return bool(module._backward_hooks or module._backward_pre_hooks or m._global_backward_hooks
                or m._global_backward_pre_hooks)


_STATE_GETTER = re.compile(r"_?(get|is|are|has)_")
_PLAIN = (type(None), bool, int, float, str, torch.dtype, torch.device)


def _is_torch_builtin_named(fn: Any, pattern: re.Pattern) -> bool:
    return (type(fn) is types.BuiltinFunctionType and getattr(fn, "__module__", None) in ("torch._C", "torch")
            and bool(pattern.match(getattr(fn, "__name__", ""))))


def is_torch_state_query(fn: Any, args: tuple) -> bool:
    """Whether calling ``fn(*args)`` natively reads a piece of torch's global state: a built-in function of
    ``torch._C`` (also as ``torch.<name>``) named like a getter (``_get_*``, ``is_*``, ``are_*``, ``has_*``, with or
    without the underscore: ``_get_deterministic_algorithms``, ``_is_tracing``, ``get_num_threads``), with plain
    arguments only (no tensors: ``torch.is_floating_point(x)`` reads its argument). ``args`` may be the
    interpreter's wrapped values (their ``value`` is looked at)."""
    return _is_torch_builtin_named(fn, _STATE_GETTER) and all(type(getattr(a, "value", a)) in _PLAIN for a in args)


_STATE_SETTER = re.compile(r"_?set_")


def is_torch_state_setter(fn: Any) -> bool:
    """Whether ``fn`` is a built-in function of ``torch._C`` (also as ``torch.<name>``) named like a setter of torch's
    global state (``_set_default_dtype``, ``_set_deterministic_algorithms``, ``set_num_threads``): run natively while
    tracing, its effect would not be part of the compiled program."""
    return _is_torch_builtin_named(fn, _STATE_SETTER)


def is_plain_state_value(value: Any) -> bool:
    """Whether a state query's answer can be compared again by value (see :func:`is_torch_state_query`)."""
    return type(value) in _PLAIN


def inference_mode_class() -> type:
    """``torch._C._InferenceMode``: the C context manager ``torch.inference_mode().__enter__`` makes and enters
    (``torch/autograd/grad_mode.py``); thunder's interpreter cannot see into it."""
    return torch._C._InferenceMode


def module_call_impl() -> Callable:
    """``torch.nn.Module._call_impl`` as torch defines it: what thunder's interpreter meets for every module call
    (a call of the plugin's dispatch hook in its place is sent to it, see :mod:`.module_dispatch`)."""
    from thunder_subclass._thunder_internals.module_dispatch import original_call_impl

    return original_call_impl()


def data_dependent_exception_types() -> tuple[type, ...]:
    """The exceptions fake-tensor execution raises where an operation's output depends on tensor values
    (``DynamicOutputShapeException``: ``nonzero``, boolean masks, ``unique``; ``DataDependentOutputException``:
    ``.item()``, ``_local_scalar_dense``), from ``torch._subclasses.fake_tensor``."""
    from torch._subclasses import fake_tensor

    return tuple(
        t for t in (getattr(fake_tensor, "DynamicOutputShapeException", None),
                    getattr(fake_tensor, "DataDependentOutputException", None))
        if isinstance(t, type)
    )


def value_symbol_fake_mode() -> Any:
    """A ``FakeTensorMode`` with its own ``ShapeEnv`` (``torch.fx.experimental.symbolic_shapes``): a tensor value read
    as a Python number on its fakes (``.item()``, ``.tolist()``) is an unbacked symbol instead of an error. The
    subclass checker uses it to tell an operation whose result size depends on values from a dispatch that reads
    values it does not need."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    return FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())


def has_value_symbols(sizes: Sequence) -> bool:
    """Whether ``sizes`` (of a result on :func:`value_symbol_fake_mode`'s fakes) hold a symbol made from a tensor
    value (an unbacked symbol)."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    return bool(free_unbacked_symbols(tuple(sizes)))


def is_fake_tensor(t: Any) -> bool:
    """A ``torch._subclasses.fake_tensor.FakeTensor``."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def fake_run_replacement(fn: Callable, args: tuple, kwargs: dict) -> Callable | None:
    """A function that computes what ``fn(*args, **kwargs)`` computes in eager, for running it on fakes where
    ``fn``'s own implementation cannot run there; None: run ``fn`` itself.

    ``F.scaled_dot_product_attention`` on jagged NestedTensors of shape ``(B, H, j, D)`` (ragged dim 2) with no mask,
    no dropout, not causal and no holes, when eager chooses the math backend (CPU): eager splits each of query, key
    and value into a strided nested tensor by its offsets (``.tolist()``), runs
    ``torch._scaled_dot_product_attention_math`` on those, and views the result as a NestedTensor of the query's
    offsets and cached lengths. Fake tensors cannot make strided nested tensors; the replacement calls
    ``thunder_subclass::njt_attention`` on the values and offsets, which runs the math backend's operations on each
    component's ``(H, len_i, D)`` slice when it runs (its backward operator: their derivative written out), and views
    the result as eager does: the same values, eager's result metadata, and a trace that holds for any lengths."""
    if fn is not torch._C._nn.scaled_dot_product_attention:
        return None
    from torch.nested._internal.nested_tensor import NestedTensor

    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    bound = dict(zip(names, args))
    if set(kwargs) - set(names) or set(kwargs) & set(bound):
        return None
    bound.update(kwargs)
    q, k, v = bound.get("query"), bound.get("key"), bound.get("value")
    if not all(type(t) is NestedTensor and t.dim() == 4 and t._ragged_idx == 2 and t._lengths is None
               and t.device.type == "cpu" for t in (q, k, v)):
        return None
    if bound.get("attn_mask") is not None or bound.get("dropout_p", 0.0) != 0.0 or bound.get("is_causal", False) \
            or bound.get("enable_gqa", False):
        return None
    return _njt_sdpa_math


def _njt_sdpa_math(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    from torch.nested._internal import sdpa
    from torch.nested._internal.nested_tensor import nested_view_from_values_offsets_lengths
    from torch.nn.attention import SDPBackend

    query, key, value, attn_mask = sdpa._autocast(query, key, value, attn_mask)
    sdpa._validate_sdpa_input(query, key, value, attn_mask, dropout_p, is_causal, scale)
    if sdpa._select_sdp_backend(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa) != SDPBackend.MATH:
        return torch._C._nn.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                                        scale=scale, enable_gqa=enable_gqa)
    # ragged dim 2: the values are (H, total length, D); the offsets stay tensors (read when the op runs): one trace
    # for any lengths
    values = _njt_attention_ops()[0](query.values(), query.offsets(), key.values(), key.offsets(), value.values(),
                                     value.offsets(), scale)
    return nested_view_from_values_offsets_lengths(
        values, query.offsets(), lengths=None, min_seqlen=query._maybe_min_seqlen,
        max_seqlen=query._maybe_max_seqlen,
    ).transpose(1, 2)


def _components(offsets: torch.Tensor, total: int, what: str) -> list[tuple[int, int]]:
    bounds = offsets.tolist()
    if not bounds or bounds[0] != 0 or bounds[-1] != total:  # eager splits the values by the lengths: the same error
        raise RuntimeError(f"split_with_sizes expects the lengths of the {what} to sum exactly to {total}")
    return list(zip(bounds[:-1], bounds[1:]))


def _scale_factor(q: torch.Tensor, scale: float | None) -> float:
    # the math backend scales query and key by the square root of the scale each
    return math.sqrt(scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))


def _njt_attention_forward(q, q_offsets, k, k_offsets, v, v_offsets, scale):
    """Eager's math-backend attention of one jagged batch: ``q`` / ``k`` / ``v`` are the ``(H, total length, D)``
    values, each component attends within its own ``offsets`` range; returns the ``(total, H, Dv)`` values. The same
    operations as ``torch._scaled_dot_product_attention_math`` on the nested components (which, unlike its dense
    form on CPU, computes half-precision inputs in their own dtype): eager's values exactly."""
    sf = _scale_factor(q, scale)
    parts = []
    for (a, b), (c, d), (e, f) in zip(_components(q_offsets, q.shape[1], "query"),
                                      _components(k_offsets, k.shape[1], "key"),
                                      _components(v_offsets, v.shape[1], "value"), strict=True):
        attn = torch._safe_softmax((q[:, a:b] * sf) @ (k[:, c:d].transpose(-2, -1) * sf), -1)
        parts.append((attn @ v[:, e:f]).transpose(0, 1))
    return torch.cat(parts, 0) if parts else q.new_empty(0, q.shape[0], v.shape[2])


def _njt_attention_backward(grad, q, q_offsets, k, k_offsets, v, v_offsets, scale):
    # (autograd does not run inside an operator's kernel: the derivative of the forward's operations, written out)
    sf = _scale_factor(q, scale)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for (a, b), (c, d), (e, f) in zip(_components(q_offsets, q.shape[1], "query"),
                                      _components(k_offsets, k.shape[1], "key"),
                                      _components(v_offsets, v.shape[1], "value"), strict=True):
        qs, ks, vi, go = q[:, a:b] * sf, k[:, c:d] * sf, v[:, e:f], grad[a:b].transpose(0, 1)
        attn = torch._safe_softmax(qs @ ks.transpose(-2, -1), -1)
        dv[:, e:f] += attn.transpose(-2, -1) @ go
        ds = torch._softmax_backward_data(go @ vi.transpose(-2, -1), attn, -1, attn.dtype)
        dq[:, a:b] += (ds @ ks) * sf
        dk[:, c:d] += (ds.transpose(-2, -1) @ qs) * sf
    return dq, dk, dv


@functools.cache
def _njt_attention_ops() -> tuple:
    """``thunder_subclass::njt_attention`` and its backward, custom operators (registered on first use) that take the
    offsets as tensors: a trace holds them as one call each, valid for any lengths."""
    from torch.library import custom_op

    @custom_op("thunder_subclass::njt_attention", mutates_args=())
    def forward(q: torch.Tensor, q_offsets: torch.Tensor, k: torch.Tensor, k_offsets: torch.Tensor,
                v: torch.Tensor, v_offsets: torch.Tensor, scale: float | None) -> torch.Tensor:
        return _njt_attention_forward(q, q_offsets, k, k_offsets, v, v_offsets, scale)

    @forward.register_fake
    def _(q, q_offsets, k, k_offsets, v, v_offsets, scale):
        return q.new_empty(q.shape[1], q.shape[0], v.shape[2])

    @custom_op("thunder_subclass::njt_attention_backward", mutates_args=())
    def backward(grad: torch.Tensor, q: torch.Tensor, q_offsets: torch.Tensor, k: torch.Tensor,
                 k_offsets: torch.Tensor, v: torch.Tensor, v_offsets: torch.Tensor,
                 scale: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return _njt_attention_backward(grad, q, q_offsets, k, k_offsets, v, v_offsets, scale)

    @backward.register_fake
    def _(grad, q, q_offsets, k, k_offsets, v, v_offsets, scale):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:6])
        ctx.scale = inputs[6]

    def grad_rule(ctx, grad):
        q, qo, k, ko, v, vo = ctx.saved_tensors
        dq, dk, dv = backward(grad.contiguous(), q, qo, k, ko, v, vo, ctx.scale)
        return dq, None, dk, None, dv, None, None

    forward.register_autograd(grad_rule, setup_context=setup_context)
    return forward, backward


def register_plugin_operators() -> None:
    """Register the plugin's custom operators (``thunder_subclass::njt_attention`` and its backward) now, as their
    first use does: a trace loaded from disk names them."""
    _njt_attention_ops()


def holes_lengths(t: Any) -> torch.Tensor | None:
    """The lengths of jagged NestedTensor ``t`` when it has holes (``nested_tensor_from_jagged(..., lengths=)``), whose
    element count torch computes from their values (``lengths.sum().item()``, refused for fake lengths); else None."""
    from torch.nested._internal.nested_tensor import NestedTensor

    return t._lengths if type(t) is NestedTensor else None


def jagged_numel(t: Any, total_length: int) -> int:
    """``t.numel()`` of jagged NestedTensor ``t`` with holes whose lengths sum to ``total_length``, as torch counts it
    (the total length times the sizes of the other non-batch dims)."""
    import math

    size, ragged = t._size, t._ragged_idx
    return total_length * math.prod((*size[1:ragged], *size[ragged + 1:]))


def at_end_of_backward(fn: Callable[[], None]) -> None:
    """Call ``fn`` when the backward pass running now ends (``Variable._execution_engine.queue_callback``: called
    from inside a node's backward, it runs once that graph task finishes, after every gradient was accumulated)."""
    torch.autograd.Variable._execution_engine.queue_callback(fn)
