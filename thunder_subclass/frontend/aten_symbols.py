"""Stage 4 (interpretation), aten-level symbols: one generic, table-driven path from a ``torch._ops.OpOverload`` to a
thunder symbol.

In: an aten call recorded below a subclass's ``__torch_dispatch__`` (op, proxy arguments, fake results).
What happens: the op is mapped to thunder's equivalent torch-level symbol where one computes the same thing, else to a
generic symbol made for the op (below), bound to the call's proxies.
Out: bound symbols in the current trace scope.

* Where thunder has a torch-level symbol that computes exactly the same thing, :data:`THUNDER_EQUIVALENTS` maps the
  op to it, so that fusion executors (torch_compile on CPU, nvFuser on GPU) can claim the flattened program. The
  equivalent is used only when its result metadata equals the recorded one.
  The table covers what common subclasses' dispatch does (pointwise math, comparisons, reductions, dtype
  conversions, views, relu's ``threshold_backward``, ``detach``); copies stay generic (see the table's comment).
* Every other op becomes a symbol of the plugin's executor named after it (``aten_special_erfcx_default``), whose
  meta runs the op on fake tensors and whose implementation is the op itself (run by torch). No op is refused.
  They are also declared fusible to thunder's torch_compile executor, so they do not cut its regions: pointwise ops
  as themselves, other single-result non-view ops through an opaque custom-op wrapper that inductor calls with
  eager input layouts (``torch.ops.thunder_subclass_opaque.<name>``, defined on first use).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._ops import OpOverload

import thunder.core.prims as prims
import thunder.torch as ltorch
import thunder.core.devices as devices
import thunder.core.dtypes as dtypes
from thunder.core.proxies import NumberProxy, TensorProxy
from thunder.core.pytree import tree_flatten, tree_map
from thunder.core.symbol import Symbol

from thunder_subclass._thunder_internals import allow_torch_compile_fusion, remember_symbol_origin
from thunder_subclass.errors import SubclassRegistrationError
from thunder_subclass.executor import register_constant_symbol, subclass_executor, unique_operator_name
from thunder_subclass.frontend.fake import FakeEnv, fake_execution, remember_stride, torch_device, torch_dtype

__all__ = ["aten_symbol", "contiguous_arguments", "record_aten_call", "recording_backward", "register_aten_symbol",
           "THUNDER_EQUIVALENTS"]

aten = torch.ops.aten

# op -> function of the op's (args, kwargs) calling thunder torch symbols. Exact equivalents only: same values, and
# the same aliasing (a view for a view, a new tensor for an op that makes one); a function may return None to keep
# the generic symbol for arguments where it is not exact. Copies (clone, _to_copy to the same dtype) stay generic:
# thunder's clone/to may be elided or alias, and an in-place op on the copy must not reach the original.
THUNDER_EQUIVALENTS: dict[OpOverload, Callable[..., Any]] = {
    aten.add.Tensor: lambda a, b, alpha=1: ltorch.add(a, b, alpha=alpha),
    aten.sub.Tensor: lambda a, b, alpha=1: ltorch.sub(a, b, alpha=alpha),
    aten.mul.Tensor: lambda a, b: ltorch.mul(a, b),
    aten.div.Tensor: lambda a, b: ltorch.true_divide(a, b),
    aten.neg.default: lambda a: ltorch.neg(a),
    aten.exp.default: lambda a: ltorch.exp(a),
    aten.sin.default: lambda a: ltorch.sin(a),
    aten.cos.default: lambda a: ltorch.cos(a),
    aten.tanh.default: lambda a: ltorch.tanh(a),
    aten.relu.default: lambda a: ltorch.relu(a),
    aten.mm.default: lambda a, b: ltorch.matmul(a, b),
    aten.bmm.default: lambda a, b: ltorch.matmul(a, b) if a.ndim == 3 and b.ndim == 3 else None,
    aten.addmm.default: lambda bias, a, b, beta=1, alpha=1: _addmm(bias, a, b, beta, alpha),
    aten.abs.default: lambda a: ltorch.abs(a),
    aten.reciprocal.default: lambda a: ltorch.reciprocal(a),
    aten.round.default: lambda a: ltorch.round(a),
    aten.sigmoid.default: lambda a: ltorch.sigmoid(a),
    aten.sqrt.default: lambda a: ltorch.sqrt(a),
    aten.rsqrt.default: lambda a: ltorch.rsqrt(a),
    aten.log.default: lambda a: ltorch.log(a),
    aten.clamp.default: lambda a, min=None, max=None: ltorch.clamp(a, min, max),
    aten.maximum.default: lambda a, b: ltorch.maximum(a, b),
    aten.minimum.default: lambda a, b: ltorch.minimum(a, b),
    aten.where.self: lambda c, a, b: ltorch.where(c, a, b),
    # relu's derivative (ATen: self <= threshold ? 0 : grad)
    aten.threshold_backward.default: lambda g, a, threshold: ltorch.where(ltorch.le(a, threshold), 0, g),
    **{getattr(aten, name).Scalar: getattr(ltorch, name) for name in ("eq", "ne", "lt", "le", "gt", "ge")},
    **{getattr(aten, name).Tensor: getattr(ltorch, name) for name in ("eq", "ne", "lt", "le", "gt", "ge")},
    aten.sum.default: lambda a, dtype=None: ltorch.sum(a, dtype=dtype),
    aten.sum.dim_IntList: lambda a, dim, keepdim=False, dtype=None: ltorch.sum(a, dim if dim else None, keepdim, dtype=dtype),
    aten.amax.default: lambda a, dim=(), keepdim=False: ltorch.amax(a, dim if dim else None, keepdim),
    aten.amin.default: lambda a, dim=(), keepdim=False: ltorch.amin(a, dim if dim else None, keepdim),
    aten.max.default: lambda a: ltorch.amax(a, None),
    aten.min.default: lambda a: ltorch.amin(a, None),
    aten.cat.default: lambda tensors, dim=0: ltorch.cat(list(tensors), dim),
    aten._to_copy.default: lambda a, **kw: _to_copy(a, **kw),
    aten.to.dtype: lambda a, dtype, non_blocking=False, copy=False, memory_format=None: _to_dtype(
        a, dtype, non_blocking, copy, memory_format
    ),
    # views: thunder's own view symbols, which the torch executor runs as the same torch views
    aten.detach.default: lambda a: ltorch.detach(a),
    aten.t.default: lambda a: ltorch.t(a),
    aten.transpose.int: lambda a, d0, d1: ltorch.transpose(a, d0, d1),
    aten.permute.default: lambda a, dims: ltorch.permute(a, *dims),
    aten.unsqueeze.default: lambda a, dim: ltorch.unsqueeze(a, dim),
    # an empty size (a 0-d tensor expanded to itself, the backward of sum() of a 0-d subclass) stays the generic aten
    # call: thunder's expand prints as Tensor.expand(t), which torch rejects (no size)
    aten.expand.default: lambda a, size, implicit=False: ltorch.expand(a, *size) if size and not implicit else None,
    # view runs as reshape (the same view wherever view succeeds; thunder's alias analysis treats reshape as maybe a
    # view). Fakes of plain proxies are contiguous (thunder tracks no strides), so a view recorded on a fake (DTensor's
    # F.linear on a 3-D input records view(-1, k)) can meet a non-contiguous tensor at run time (after thunder's own
    # permutes, e.g. its SDPA backward), where Tensor.view raises and eager, seeing the real layout, had copied.
    aten.view.default: lambda a, size: ltorch.reshape(a, *size),
    # the input itself when already contiguous, else a contiguous copy: the same in thunder
    aten.contiguous.default: lambda a, memory_format=torch.contiguous_format: (
        ltorch.contiguous(a) if memory_format == torch.contiguous_format else None
    ),
    aten._unsafe_view.default: lambda a, size: ltorch.reshape(a, *size),
}


def _transposed_from(p) -> Any:
    """The 2-D tensor whose transpose ``p`` is, when ``p`` was made in the current scope by ``t``, ``permute(1, 0)``
    or ``transpose(0, 1)`` of it; else None."""
    from thunder.core.trace import get_tracectx

    for b in reversed(get_tracectx().peek_scope()):
        if b.output is not p:
            continue
        src = b.args[0] if b.args else None
        if not isinstance(src, TensorProxy) or src.ndim != 2:
            return None
        rest = tuple(b.args[1:])
        if b.sym.id == "torch.t" and not rest:
            return src
        if b.sym.id == "torch.permute" and rest in (((1, 0),), (1, 0)):
            return src
        if b.sym.id == "torch.transpose" and len(rest) == 2 and {d % 2 for d in rest} == {0, 1}:
            return src
        return None
    return None


def _addmm(bias, a, b, beta, alpha):
    # F.linear(x, w, bias) of a 2-D x runs aten.addmm(bias, x, w.t()) (ATen's linear): the same kernel on the same
    # operands, so the same values. Used when mat2 is a transpose made in this scope (TwoTensor's dispatch of a
    # linear records t + addmm per inner tensor): one torch call instead of a view and an OpOverload call.
    if beta != 1 or alpha != 1 or a.ndim != 2 or b.ndim != 2 or not isinstance(bias, TensorProxy) or bias.ndim != 1:
        return None
    w = _transposed_from(b)
    if w is None:
        return None
    return ltorch.linear(a, w, bias)


def _to_dtype(a, dtype, non_blocking, copy, memory_format):
    # aten.to.dtype returns its input when the dtype is unchanged and no copy is asked for (as thunder's `to`);
    # otherwise it makes what aten._to_copy makes
    if memory_format is not None:
        return None
    if not copy and not non_blocking and dtype == torch_dtype(a):
        return ltorch.to(a, dtype=dtype)
    return _to_copy(a, dtype=dtype, non_blocking=non_blocking)


def _to_copy(a, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    # aten._to_copy always copies; thunder's ``to`` copies only when the dtype changes: equivalent just then
    # (returning None keeps the generic symbol)
    if dtype is None or dtype == torch_dtype(a) or layout not in (None, torch.strided) or pin_memory:
        return None
    if non_blocking or memory_format not in (None, torch.preserve_format):
        return None
    if device is not None and torch.device(device) != torch_device(a):
        return None
    return ltorch.to(a, dtype=dtype)

_symbols: dict[OpOverload, Symbol] = {}
_registered: dict[OpOverload, Symbol] = {}


def has_registered_aten_symbols() -> bool:
    """Whether any :func:`register_aten_symbol` registration is in place (see ``thunder_subclass.runtime.disk_cache``)."""
    return bool(_registered)


def register_aten_symbol(op: OpOverload, symbol: Symbol) -> Callable[[], None]:
    """Record calls of ``op`` made inside ``__torch_dispatch__`` as ``symbol`` (an operator of your executor, taking
    the op's arguments) instead of the generic ``<ns>_<op>_<overload>`` symbol, so the execution trace shows your
    executor's symbol and your executor runs it (e.g. a backend's kernels, see
    ``thunder_subclass.examples.python_device``). Returns a function that removes the registration."""
    if not isinstance(op, OpOverload):
        raise SubclassRegistrationError(f"register_aten_symbol needs an OpOverload such as torch.ops.aten.mm.default, got {op!r}")
    if op in _registered and _registered[op] is not symbol:
        raise ValueError(f"{op} is already recorded as {_registered[op].name}; remove that registration first")
    _registered[op] = symbol

    def remove() -> None:
        if _registered.get(op) is symbol:
            del _registered[op]

    return remove


def _fake_meta(op: OpOverload) -> Callable:
    def meta(*args, **kwargs):
        env = FakeEnv()
        fargs, fkwargs = tree_map(env.to_fake, (args, kwargs))
        with fake_execution():
            out = op(*fargs, **fkwargs)
        return pytree.tree_map(proxy_from_fake, out)

    return meta


def proxy_from_fake(x: Any, env: FakeEnv | None = None) -> Any:
    """A plain ``TensorProxy`` with the metadata of fake tensor ``x`` (non-tensors are returned unchanged). Its sizes
    are ints, or, for a fake of a symbolic environment ``env``, the number proxies its symbols stand for."""
    if not isinstance(x, torch.Tensor):
        return x
    p = TensorProxy(
        shape=_sizes_of(x, env),
        device=devices.to_device(x.device),
        dtype=dtypes.to_dtype(x.dtype),
        requires_grad=x.requires_grad,
    )
    return remember_stride(p, x, env)


def aten_symbol(op: OpOverload) -> Symbol:
    """The thunder symbol for ``op`` (made once, memoised): meta by fake execution, executed by the op itself."""
    sym = _symbols.get(op)
    if sym is None:
        namespace, _, opname = op._schema.name.partition("::")
        name = unique_operator_name(f"{namespace}_{opname}_{op._overloadname}")  # aten_mul_Tensor, mylib_foo_default
        # an op that writes to its arguments (add_, copy_, out=) must run even if its result is unused
        tags = [prims.OpTags.DONT_DCE, prims.OpTags.IN_PLACE] if op._schema.is_mutable else None
        fn = _run_and_wait(op) if _returns_work(op) else op
        sym = subclass_executor.register_operator(name, meta=_fake_meta(op), fn=fn, tags=tags)
        register_constant_symbol(sym)
        if namespace == "aten" and not op._schema.is_mutable:
            _allow_in_torch_compile_regions(op, sym, name)
        _symbols[op] = sym
    return sym


def _returns_work(op: OpOverload) -> bool:
    """A non-functional c10d collective (``c10d::scatter_``, ``c10d::broadcast_``): it writes into its tensor
    arguments and returns a ``Work`` to wait on."""
    return op.namespace == "c10d" and any("Work" in str(r.type) for r in op._schema.returns)


def _run_and_wait(op: OpOverload) -> Callable:
    # eager waits on the Work in Python (dist.scatter(async_op=False) calls work.wait()), which no recorded op shows:
    # DTensor's distribute_tensor issues these through mesh_scatter / mesh_broadcast
    def run_and_wait(*args, **kwargs):
        out = op(*args, **kwargs)
        out[-1].wait()
        return out

    run_and_wait.__name__ = f"{op._schema.name.partition('::')[2]}_and_wait"
    return run_and_wait


def _allow_in_torch_compile_regions(op: OpOverload, sym: Symbol, name: str, contiguous: tuple[int, ...] = ()) -> None:
    """Let thunder's torch_compile executor put ``sym`` in its fusion regions, so that an aten op without a thunder
    equivalent does not cut a region in two. Pointwise ops go in as themselves (inductor fuses them). Other ops that
    return one new tensor go in as an opaque custom-op wrapper (``torch.ops.thunder_subclass_opaque.<name>``):
    inductor calls it as an extern kernel with its inputs in their eager layouts, which its own lowerings do not
    guarantee (its CPU ``_scaled_mm`` lowering rejects the row-major ``mat_b`` a fused fp8 cast produces,
    pytorch#191138). In-place ops, views, multi-output ops and custom ops (side effects) stay outside regions."""
    if torch.Tag.pointwise in op.tags and not contiguous:
        allow_torch_compile_fusion(sym)
        return
    schema = op._schema
    if [str(r.type) for r in schema.returns] != ["Tensor"]:
        return
    if any(a.alias_info is not None for a in (*schema.arguments, *schema.returns)):
        return
    opaque = _opaque_wrapper(op, name, contiguous)
    fused = subclass_executor.register_operator(f"{name}_opaque", meta=_fake_meta(op), fn=opaque)
    register_constant_symbol(fused)
    allow_torch_compile_fusion(fused)
    allow_torch_compile_fusion(sym, execution_transform=lambda *args, **kwargs: fused(*args, **kwargs))


_opaque_library: Any = None


def _opaque_wrapper(op: OpOverload, name: str, contiguous: tuple[int, ...] = ()) -> OpOverload:
    """``torch.ops.thunder_subclass_opaque.<name>.default``: the same schema, calls ``op`` (with the arguments at
    positions ``contiguous`` made contiguous first); tagged ``needs_fixed_stride_order`` so inductor passes its
    inputs with the strides they have in eager."""
    global _opaque_library
    if _opaque_library is None:
        _opaque_library = torch.library.Library("thunder_subclass_opaque", "FRAGMENT")
    qualname = f"thunder_subclass_opaque::{name}"
    if not hasattr(torch.ops.thunder_subclass_opaque, name):
        text = str(op._schema)
        _opaque_library.define(name + text[text.index("("):], tags=(torch.Tag.needs_fixed_stride_order,))

        def call_op(*args, **kwargs):  # the real kernel and the fake one: the op on whatever tensors it gets
            if contiguous:
                args = tuple(a.contiguous() if i in contiguous and isinstance(a, torch.Tensor) else a
                             for i, a in enumerate(args))
            return op(*args, **kwargs)

        _opaque_library.impl(name, call_op, "CompositeExplicitAutograd")
        torch.library.register_fake(qualname, call_op, lib=_opaque_library)
    return getattr(torch.ops.thunder_subclass_opaque, name).default


def _writes_and_returns_first_argument(op: OpOverload) -> bool:
    """``add_``-like: the op writes to its first argument and returns it."""
    schema = op._schema
    if not schema.arguments or len(schema.returns) != 1:
        return False
    first, ret = schema.arguments[0].alias_info, schema.returns[0].alias_info
    return first is not None and first.is_write and ret is not None and ret.is_write


def _sizes_of(x: torch.Tensor, env: FakeEnv | None) -> tuple:
    if env is not None and env.symbols is not None:
        return env.numbers(x.shape)
    return tuple(int(s) for s in x.shape)


def _same_size(a: Any, b: Any) -> bool:
    # a size of a thunder proxy and of a fake's (as the proxy's): the same number proxy, or equal ints
    if isinstance(a, NumberProxy) or isinstance(b, NumberProxy):
        return isinstance(a, NumberProxy) and isinstance(b, NumberProxy) and a.name == b.name
    return a == b


def _same_metadata(p: Any, fake: Any, env: FakeEnv | None = None) -> bool:
    if isinstance(fake, torch.Tensor):
        if not isinstance(p, TensorProxy) or torch_dtype(p) != fake.dtype:
            return False
        if env is not None and env.symbols is not None:
            sizes = _sizes_of(fake, env)
            return len(sizes) == len(p._shape) and all(map(_same_size, p._shape, sizes))
        return tuple(p._shape) == tuple(fake.shape)
    return not isinstance(p, TensorProxy)


_recording_backward: contextvars.ContextVar[bool] = contextvars.ContextVar("recording_backward", default=False)


@contextlib.contextmanager
def recording_backward():
    """Aten calls recorded in this context belong to a backward: an in-place call gets no ``copy_`` marker (thunder's
    forward/backward split moves a ``copy_`` into a forward value to the forward, and a Function's ``backward`` that
    changes a tensor it kept on ``ctx`` must change it when the backward runs; the op itself is never dead code)."""
    token = _recording_backward.set(True)
    try:
        yield
    finally:
        _recording_backward.reset(token)


def contiguous_arguments(op: OpOverload, fake_args: tuple, env: FakeEnv) -> tuple[int, ...]:
    """In a backward being recorded: the positions of ``op``'s tensor arguments whose fakes were contiguous, for an
    op that is not pointwise, a view or in place (empty otherwise).

    A recorded backward runs on the gradients the backward gets at run time, whose layout its fakes did not have:
    the fakes of incoming gradients are contiguous, a real one is often an expanded view (``sum``'s gradient,
    strides 0). PyTorch's derivative formulas make such gradients contiguous before kernels that need it
    (``native_group_norm_backward(grad.contiguous(), ...)``), a no-op on the fakes, so not recorded: the kernel then
    read the expanded gradient as if contiguous (measured: ``GroupNorm`` with ``TwoTensor`` parameters gave weight
    and bias gradients of uninitialised memory). Such an op runs through :func:`_contiguous_variant`."""
    if not _recording_backward.get() or env.symbols is not None or op._schema.is_mutable \
            or torch.Tag.pointwise in op.tags or any(r.alias_info is not None for r in op._schema.returns):
        return ()
    return tuple(i for i, a in enumerate(fake_args) if isinstance(a, torch.Tensor) and a.layout == torch.strided
                 and a.is_contiguous())


_contiguous_variants: dict = {}


def _contiguous_variant(op: OpOverload, positions: tuple[int, ...]) -> Symbol:
    """``op`` whose arguments at ``positions`` are made contiguous first (``Tensor.contiguous``: the tensor itself
    when it already is), as the derivative formula that was recorded did (:func:`contiguous_arguments`)."""
    key = (op, positions)
    sym = _contiguous_variants.get(key)
    if sym is None:
        def run(*args, **kwargs):
            args = tuple(a.contiguous() if i in positions and isinstance(a, torch.Tensor) else a
                         for i, a in enumerate(args))
            return op(*args, **kwargs)

        namespace, _, opname = op._schema.name.partition("::")
        name = unique_operator_name(f"{namespace}_{opname}_{op._overloadname}_on_contiguous")
        sym = subclass_executor.register_operator(name, meta=_fake_meta(op), fn=run)
        register_constant_symbol(sym)
        remember_symbol_origin(sym, run, _contiguous_variant, key)  # (the disk cache makes it again from these)
        if namespace == "aten":  # in thunder's torch_compile regions as the op itself is (an opaque call)
            _allow_in_torch_compile_regions(op, sym, name, positions)
        _contiguous_variants[key] = sym
    return sym


def record_aten_call(op: OpOverload, args: tuple, kwargs: dict, fake_out: Any, env: FakeEnv,
                     contiguous: tuple[int, ...] = ()) -> None:
    """Record ``op(*args, **kwargs)`` (proxies in, fake results known) in the current scope; bind results in env.
    ``contiguous``: positions of arguments to make contiguous at run time (:func:`contiguous_arguments`)."""
    from thunder.core.trace import get_tracectx

    equivalent = THUNDER_EQUIVALENTS.get(op)
    if equivalent is not None and not (op._schema.is_mutable and _recording_backward.get()):
        scope = get_tracectx().peek_scope()
        mark = len(scope)
        try:
            out = equivalent(*args, **kwargs)
        except Exception:
            out = None
        flat_out, _ = tree_flatten(out)
        flat_fake = pytree.tree_leaves(fake_out)
        if out is not None and len(flat_out) == len(flat_fake) \
                and all(_same_metadata(p, f, env) for p, f in zip(flat_out, flat_fake)):
            for p, f in zip(flat_out, flat_fake):
                if isinstance(f, torch.Tensor):
                    env.bind(remember_stride(p, f, env), f)
            return
        del scope[mark:]

    flat_fake, spec = pytree.tree_flatten(fake_out)
    flat_out = [proxy_from_fake(f, env) for f in flat_fake]
    out = pytree.tree_unflatten(flat_out, spec)
    bsym = _registered.get(op, None) or (_contiguous_variant(op, contiguous) if contiguous else aten_symbol(op))
    bsym = bsym.bind(*args, **kwargs, output=out)
    get_tracectx().peek_scope().append(bsym)
    if _writes_and_returns_first_argument(op) and isinstance(args[0], TensorProxy) and isinstance(out, TensorProxy) \
            and not _recording_backward.get():
        # the new version of the argument: thunder's copy_ into it, a no-op at run time (copy_ of a tensor into itself
        # returns at once) that tells thunder the op writes to args[0], so its forward/backward split keeps the op in
        # the forward (an op whose result the forward does not use would otherwise run with the backward)
        flat_out = [prims.copy_(out, args[0], grad_enabled=torch.is_grad_enabled())]
    for p, f in zip(flat_out, flat_fake):
        if isinstance(f, torch.Tensor):
            env.bind(p, f)
