"""Stage 4 (interpretation), the recording machinery shared by unrolling (``thunder_subclass.frontend.interpretation``)
and differentiation (``thunder_subclass.transforms.autograd``): run a torch operation on fake subclass instances, record
the aten calls their ``__torch_dispatch__`` makes, and bind the result as one bound symbol with those calls as
subsymbols.

In: a torch callable and proxy arguments (or a thunder torch symbol: :func:`torch_callable_for` and
:func:`denormalize` give the torch callable and arguments it stands for). What happens: the arguments become fakes
(``thunder_subclass.frontend.fake``), the callable runs under :class:`RecordingMode`, which steps aside for wrapper
subclasses (so their ``__torch_dispatch__`` runs) and records the aten calls they make on plain inner tensors. Out
(:func:`emit_calls`): ``flatten_<Cls>`` of the subclass inputs -> aten-level symbols
(``thunder_subclass.frontend.aten_symbols``) -> ``unflatten_<Cls>`` of subclass results, appended to a scope, and the
results as proxies with the true metadata. Errors raised while running on fakes become typed errors naming the subclass,
the op and the user's source line (:func:`dispatch_error`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._ops import OpOverload
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._python_dispatch import is_traceable_wrapper_subclass_type

import thunder.core.devices as devices
import thunder.core.dtypes as dtypes
import thunder.core.prims as prims
from thunder.core.proxies import NumberProxy, Proxy, TensorProxy
from thunder.core.pytree import tree_flatten, tree_map, tree_unflatten
from thunder.core.symbol import Symbol
from thunder.core.trace import get_tracectx

from thunder_subclass._thunder_internals import (
    pin_numbers,
    ShapeSymbols,
    SymbolicSizeError,
    add_size_guards,
    fake_run_replacement,
    holds_mask,
    holes_lengths,
    is_interpreting,
    jagged_numel,
    jit_state,
    meta_signature,
    real_script_object,
    source_location,
    symbolic_values_active,
    torch_to_thunder_symbols,
    trace_state,
)
from thunder_subclass.frontend.aten_symbols import contiguous_arguments, record_aten_call
from thunder_subclass.errors import (
    SubclassDispatchError,
    SubclassProtocolError,
    TensorSubclassError,
    UnsupportedSubclassOperationError,
    UnsupportedTracingError,
    format_location,
)
from thunder_subclass.frontend.fake import (
    FakeEnv, SizedContext, context_template, fake_execution, has_symints, real_execution,
)
from thunder_subclass.frontend.jagged import is_jagged, result_strides as jagged_result_strides
from thunder_subclass.frontend.proxy import (
    SubclassTensorProxy,
    flatten_tensor,
    has_symbolic_sizes,
    is_opaque_object,
    proxy_kind,
    inner_references,
    python_attributes,
    record_flatten,
    record_opaque_constant,
)
from thunder_subclass.frontend.subclass_symbols import record_unflatten

__all__ = [
    "RecordingMode", "torch_callable_for", "denormalize", "op_name", "subclass_names", "run_on_fakes", "record_call",
    "emit_calls", "bind_unrolled", "dispatch_error", "traced_grad_mode", "is_traced_grad_enabled",
    "recorded_argument_kinds", "call_location", "memo_key", "record_call_shared",
]


class RecordingMode(TorchDispatchMode):
    """Records aten calls on plain (fake) tensors; steps aside (``NotImplemented``) when a wrapper subclass is an
    argument, so that the subclass's ``__torch_dispatch__`` runs and its inner calls come back here."""

    def __init__(self, env: FakeEnv | None = None):
        super().__init__()
        self.calls: list[tuple[OpOverload, tuple, dict, Any]] = []
        self.saw_subclass = False  # some op ran a wrapper subclass's __torch_dispatch__
        self.env = env  # its known values answer .item() (see _read_value)

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _NUMEL and self.env is not None and len(args) == 1 and holes_lengths(args[0]) is not None:
            known = self.env.known_value(holes_lengths(args[0]))
            if known is not None and all(source.guard() for source in known[1]):  # the lengths' values, guarded
                with real_execution():
                    return jagged_numel(args[0], int(known[0].sum()))
        if any(is_traceable_wrapper_subclass_type(t) for t in types_):
            self.saw_subclass = True
            return NotImplemented
        if func in _READS_VALUE and self.env is not None:
            value = _read_value(self.env, args[0])
            if value is not None:
                return value
        try:
            out = func(*args, **kwargs)
        except Exception as e:
            if not hasattr(e, "_thunder_subclass_op"):
                e._thunder_subclass_op = func  # the aten / custom op that failed on fakes, for the error message
            raise
        if isinstance(func, OpOverload) and any(isinstance(o, torch.Tensor) for o in pytree.tree_leaves(out)):
            self.calls.append((func, args, kwargs, out))
            if self.env is not None and self.env.known_values:
                self.env.propagate_values(func, args, kwargs, out)
        return out


_READS_VALUE = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)
_NUMEL = (torch.ops.aten.sym_numel.default, torch.ops.aten.numel.default)


def _read_value(env: FakeEnv, fake: Any) -> Any:
    """The Python number ``.item()`` of ``fake`` gives, when its value is known (computed from integer inputs of the
    trace only: a jagged NestedTensor's offsets or lengths, which its dispatch reads with ``.tolist()`` for
    ``unbind``, indexing, ``clone`` of one with holes): the trace then holds for these input values only, and each
    input it is computed from gets a prologue check of its values (a call with other values is a new trace). None
    when unknown, or when the check can no longer be added (a backward recorded after the prologue was made, reading
    values the forward did not): the fake run raises its data-dependent error."""
    known = env.known_value(fake)
    if known is None:
        return None
    real, sources = known
    if not all(source.guard() for source in sources):
        return None
    with real_execution():
        return real.item()


# ---------------------------------------------------------------------------------------------------------------
# torch callable for a thunder symbol
# ---------------------------------------------------------------------------------------------------------------


@functools.cache
def _torch_callables_by_symbol_id() -> dict[Any, list[Callable]]:
    table = defaultdict(list)
    for torch_fn, sym in torch_to_thunder_symbols().items():
        table[sym.id].append(torch_fn)
    return table


def _is_tensor_method(fn: Callable) -> bool:
    owner = getattr(fn, "__objclass__", None)
    if owner is not None:
        return issubclass(owner, torch._C.TensorBase)
    return getattr(fn, "__qualname__", "").split(".")[0] in ("Tensor", "TensorBase")


@functools.cache
def _first_parameter(sym: Symbol) -> str | None:
    # thunder's method-style symbols take the tensor first as ``a`` (``reshape(a, *shape)``); others follow the
    # function (``where(pred, a, b)``, whose Tensor method would put ``a`` first)
    try:
        return next(iter(inspect.signature(sym.meta).parameters), None)
    except (TypeError, ValueError):
        return None


def torch_callable_for(sym: Symbol, args: tuple, kwargs: dict | None = None) -> Callable:
    """The torch callable that thunder symbol ``sym`` stands for (resolved from the symbol id), for the arguments
    ``args`` / ``kwargs`` as :func:`denormalize` gives them."""
    candidates = _torch_callables_by_symbol_id().get(sym.id, [])
    if not candidates:
        raise UnsupportedSubclassOperationError(
            f"thunder symbol {sym.name} (id {sym.id!r}) has no torch operation that thunder_subclass can run on "
            "tensor subclasses. Please report it."
        )
    methods = [f for f in candidates if _is_tensor_method(f) and not f.__name__.startswith("__")]
    functions = [f for f in candidates if not _is_tensor_method(f)]

    def preference(f):  # same name as the symbol first (torch.mm, not torch.spmm, for ltorch.mm), then torch.*
        return (f.__name__ != sym.name, not (getattr(f, "__module__", "") or "").startswith("torch"))

    # an `inplace=True` argument (F.relu(x, inplace=True), nn.ReLU(inplace=True)) only torch.nn.functional takes
    if _binds_inplace(sym, args, kwargs or {}):
        functional = [f for f in functions if getattr(f, "__module__", None) == "torch.nn.functional"]
        if functional:
            return min(functional, key=preference)
    # the Tensor method when the first argument is a tensor (thunder symbols take method-style arguments:
    # x.reshape(3, 8) calls ltorch.reshape(x, 3, 8)); else a function (2 * x calls torch.mul(2, x))
    if args and isinstance(args[0], TensorProxy) and methods and _first_parameter(sym) in ("a", "self", "input"):
        return min(methods, key=preference)
    if functions:
        return min(functions, key=preference)
    return candidates[0]


def _binds_inplace(sym: Symbol, args: tuple, kwargs: dict) -> bool:
    try:
        bound = meta_signature(sym.meta).bind_partial(*args, **kwargs).arguments  # (made once per function)
    except (TypeError, ValueError):
        return False
    value = bound.get("inplace", False)
    return value is not False and getattr(value, "value", value) is not False


def _is_default(value: Any, default: Any) -> bool:
    if value is default:
        return True
    if isinstance(value, NumberProxy) and type(value.value) is type(default) and type(default) in (bool, int, float):
        # a number the trace holds as a proxy under cache="symbolic values" (nn.ReLU's self.inplace): dropped as
        # the default it equals, which the prologue then checks (pinned)
        if value.value != default:
            return False
        pin_numbers(value)
        return True
    if isinstance(value, Proxy) or type(value) is not type(default):
        return False
    try:
        return bool(value == default)
    except Exception:
        return False


def denormalize(sym: Symbol, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Arguments as a torch callable takes them. Thunder binds a symbol's arguments to its meta's signature with
    defaults filled in (``ltorch.relu(x, False)``), which ``Tensor.relu`` does not accept: drop arguments equal to
    their defaults, and pass the ones after a dropped or missing one by keyword (``F.conv1d(x, w, groups=2)`` went to
    torch as ``conv1d(x, w, 2)``, 2 taken for the bias)."""
    try:
        sig = meta_signature(sym.meta)
        bound = sig.bind(*args, **kwargs)
    except (TypeError, ValueError):
        return args, kwargs
    new_args: list = []
    new_kwargs: dict = {}
    positional = True
    for name, param in sig.parameters.items():
        if name not in bound.arguments:  # not passed (its default): the ones after it go by keyword
            positional = positional and param.kind is inspect.Parameter.POSITIONAL_ONLY
            continue
        value = bound.arguments[name]
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            new_args.extend(value)
            continue
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            new_kwargs.update(value)
            continue
        if param.default is not inspect.Parameter.empty and _is_default(value, param.default):
            positional = positional and param.kind is inspect.Parameter.POSITIONAL_ONLY
            continue
        if positional and param.kind is not inspect.Parameter.KEYWORD_ONLY:
            new_args.append(value)
        else:
            positional = False
            new_kwargs[name] = value
    return tuple(new_args), new_kwargs


def op_name(fn: Callable) -> str:
    if isinstance(fn, type):
        return f"{fn.__qualname__}(...)"
    qual = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn))
    module = getattr(fn, "__module__", None)
    if _is_tensor_method(fn):
        return f"torch.Tensor.{fn.__name__}"
    if module in ("torch", None) or qual.startswith("_VariableFunctions"):
        return f"torch.{fn.__name__}"
    if module and module.startswith("torch"):
        module = "torch.nn.functional" if module.startswith("torch.nn.functional") else module
        module = "torch" if module.startswith("torch._C") else module
        return f"{module}.{qual}"
    return qual


def subclass_names(args, kwargs) -> str:
    names = []
    for a in tree_flatten((args, kwargs))[0]:
        if isinstance(a, SubclassTensorProxy) and a.subclass_type.__name__ not in names:
            names.append(a.subclass_type.__name__)
    return ", ".join(names) or "tensor subclass"


# ---------------------------------------------------------------------------------------------------------------
# The unrolling
# ---------------------------------------------------------------------------------------------------------------


def run_on_fakes(fn: Callable, args, kwargs, what: str, subclasses: str, *, env: FakeEnv | None = None,
                  wants_grad: Callable[[TensorProxy], bool] | None = None, location: tuple | None = None):
    """Run ``fn`` on fakes of ``args``/``kwargs`` under the recorder. With ``wants_grad``, the top-level tensor
    arguments it selects require grad and ``fn`` runs with grad enabled (for differentiating it afterwards)."""
    env = env if env is not None else FakeEnv()
    try:
        if wants_grad is not None:
            for a in tree_flatten((args, kwargs))[0]:
                if isinstance(a, TensorProxy):
                    env.to_fake(a, requires_grad=bool(wants_grad(a)))
        fargs, fkwargs = tree_map(env.to_fake, (args, kwargs))
    except SubclassProtocolError as e:  # e.g. __tensor_unflatten__ rebuilding the wrong thing
        filename, lineno = source_location()
        raise SubclassProtocolError(f"{e} (while tracing {what} at {format_location(filename, lineno)})") from e
    fn = fake_run_replacement(fn, fargs, fkwargs) or fn  # eager's computation where its own code cannot run on fakes
    recorder = RecordingMode(env)
    grad_mode = torch.enable_grad() if wants_grad is not None else torch.set_grad_enabled(is_traced_grad_enabled())
    try:
        with fake_execution(autocast=True, env=env), grad_mode, recorder:
            out = fn(*fargs, **fkwargs)
    except TensorSubclassError:
        raise
    except Exception as e:
        raise dispatch_error(what, subclasses, e, location) from e
    env.remember_nested_ints()
    return env, recorder.calls, out


# per thread (a trace runs in one thread): a stack of grad modes that fake runs use instead of the traced code's
_grad_mode_override = threading.local()


def _overrides() -> list[bool]:
    stack = getattr(_grad_mode_override, "stack", None)
    if stack is None:
        stack = _grad_mode_override.stack = []
    return stack


@contextlib.contextmanager
def traced_grad_mode(enabled: bool):
    """Run fakes with this grad mode (used when re-tracing a symbol recorded under ``torch.no_grad``)."""
    stack = _overrides()
    stack.append(enabled)
    try:
        yield
    finally:
        stack.pop()


def is_traced_grad_enabled() -> bool:
    # whether the traced code runs with grad enabled (thunder follows torch.no_grad() in user code)
    from thunder.core.compile_data import get_compile_data

    stack = _overrides()
    if stack:
        return stack[-1]
    cd = get_compile_data()
    return torch.is_grad_enabled() if cd is None else bool(cd.is_grad_enabled)


def _missing_fake_impl(e: Exception) -> str | None:
    """The name of the custom operator whose missing fake implementation made ``e``, else None."""
    op = getattr(e, "_thunder_subclass_op", None)
    if op is None or not isinstance(op, OpOverload) or op.namespace in ("aten", "prim", "prims"):
        return None
    message = str(e)
    if "fake impl" in message or "Meta" in message or "meta" in message:
        return op._schema.name
    return None


def dispatch_error(what: str, subclasses: str, e: Exception, location: tuple | None = None) -> TensorSubclassError:
    """The typed error for exception ``e`` raised while running ``what`` on fakes, at ``location`` (file, line) or,
    by default, the source line being traced."""
    filename, lineno = location if location is not None else source_location()
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    if isinstance(e, (DataDependentOutputException, DynamicOutputShapeException)):
        return UnsupportedSubclassOperationError(
            f"{what} on {subclasses} at {format_location(filename, lineno)} makes a data-dependent computation "
            f"inside dispatch ({e}: a Python number from .item(), or a shape from nonzero / boolean masking): "
            "its result depends on tensor values, which thunder_subclass does not know while tracing. Compute it "
            "outside the compiled function, or keep it on tensors (torch.where instead of masking)."
        )
    custom_op = _missing_fake_impl(e)
    if custom_op is not None:
        return UnsupportedSubclassOperationError(
            f"custom operator {custom_op}, called by {subclasses} for {what} at "
            f"{format_location(filename, lineno)}, has no fake implementation; thunder_subclass runs dispatch on "
            "fake tensors while tracing and needs one to know the result's metadata. Register it with "
            f"@torch.library.register_fake(\"{custom_op}\") (or <op>.register_fake for torch.library.custom_op)."
        )
    return SubclassDispatchError(
        f"{what} on {subclasses} failed while tracing at {format_location(filename, lineno)}: "
        f"{type(e).__name__}: {e}\nThe operation ran on fake {subclasses} instances "
        "(its __torch_dispatch__ / __torch_function__ and fake-tensor execution); fix the subclass's "
        "implementation of this operation or avoid calling it in compiled code."
    )


def _proxy_for_result(x: Any, env: FakeEnv, scope: list, what: str) -> Any:
    x = real_script_object(x)
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise UnsupportedSubclassOperationError(f"{what} returned a data-dependent value {x!r}; not supported.")
    if is_opaque_object(x):
        p = env.proxy_of(x)
        if p is None:  # not from an input: an object the traced code holds (a TP hook's DeviceMesh), a constant
            p = record_opaque_constant(x, scope)
            env.to_fake(p)
        return p
    if not isinstance(x, torch.Tensor):
        return x
    p = env.proxy_of(x)
    if p is not None and not (isinstance(p, SubclassTensorProxy) and _inner_mutated(x, env)):
        if x.requires_grad and not p.requires_grad and x.grad_fn is not None:
            # a plain tensor that dispatch returned (recorded below autograd, not requiring grad then), which
            # autograd made the result of the differentiable torch-level op: it requires grad, as in eager
            p._requires_grad = True
        return p
    if is_traceable_wrapper_subclass(x):
        attrs, ctx = flatten_tensor(x)
        ctx = env.own_context(ctx)
        if env.symbols is not None and has_symints(ctx):  # its outer size in its context (DTensor's TensorMeta)
            template, _ = context_template(ctx, x.shape, x.stride())
            if has_symints(template) or holds_mask(ctx, unreduced=False):
                raise SymbolicSizeError(f"the flatten context of a {type(x).__qualname__} result holds sizes")
            ctx = SizedContext(template)
        inner = {a: _proxy_for_result(getattr(x, a), env, scope, what) for a in attrs}
        out = SubclassTensorProxy(
            None,
            subclass_type=type(x),
            inner=inner,
            flatten_ctx=ctx,
            outer_stride=jagged_result_strides(env, x) if is_jagged(x) else env.numbers(x.stride()),
            python_attrs=python_attributes(x, attrs),
            inner_refs=inner_references(x, attrs),
            shape=env.numbers(x.shape),
            device=devices.to_device(x.device),
            dtype=dtypes.to_dtype(x.dtype),
            requires_grad=x.requires_grad,
        )
        record_unflatten(out, scope)
        env.bind(out, x)
        return out
    kind = "a fake tensor" if isinstance(x, FakeTensor) else "a real (non-fake) tensor"
    raise UnsupportedSubclassOperationError(
        f"{what} returned {kind} that no recorded aten operation produced; thunder_subclass cannot place it "
        "in the trace."
    )


def _inner_mutated(x: torch.Tensor, env: FakeEnv) -> bool:
    """Whether an in-place op wrote to an inner tensor of subclass fake ``x`` (then ``x`` is returned as a new
    version: a new proxy over the new inner versions)."""
    attrs, _ = flatten_tensor(x)
    for a in attrs:
        inner = getattr(x, a)
        if id(inner) in env.mutated or (is_traceable_wrapper_subclass(inner) and _inner_mutated(inner, env)):
            return True
    return False


def record_call(fn: Callable, args: tuple, kwargs: dict, scope: list, what: str, subclasses: str, **run_kwargs):
    """Run ``fn`` on fakes and record flatten -> aten calls -> unflatten into ``scope``; return proxy results.

    Under ``cache="symbolic values"``, arguments with symbolic sizes first run on fakes with symbolic sizes
    (:func:`_record_symbolic`); where that cannot be done soundly, on fakes of the current sizes, which are pinned."""
    found = _record_symbolic(fn, args, kwargs, scope, what, subclasses, run_kwargs)
    if found is not None:
        return found
    env, calls, out = run_on_fakes(fn, args, kwargs, what, subclasses, **run_kwargs)
    result = emit_calls(env, calls, out, scope, what, subclasses)
    return env, out, result


def _record_symbolic(fn: Callable, args: tuple, kwargs: dict, scope: list, what: str, subclasses: str,
                     run_kwargs: dict):
    """``(env, fake results, proxy results)`` of ``fn`` run on fakes whose sizes are the symbols of a ShapeEnv
    (``_thunder_internals.ShapeSymbols``), with prologue checks for what the run relied on
    (``add_size_guards``); None when no argument has symbolic sizes or the run cannot keep them symbolic (then
    nothing was recorded: the caller runs it on fakes of the current sizes, pinned). After the prologue is made
    (recording again for autodiff) a failure is raised instead: sizes can no longer be pinned."""
    if "env" in run_kwargs or not symbolic_values_active():
        return None
    if not any(has_symbolic_sizes(a) for a in tree_flatten((args, kwargs))[0]):
        return None
    mark = len(scope)
    env = FakeEnv(ShapeSymbols())
    try:
        env, calls, out = run_on_fakes(fn, args, kwargs, what, subclasses, env=env, **run_kwargs)
        result = emit_calls(env, calls, out, scope, what, subclasses)
        add_size_guards(env.symbols)
    except Exception as e:
        del scope[mark:]
        if is_interpreting():
            return None
        if isinstance(e, TensorSubclassError):
            raise
        raise UnsupportedTracingError(
            f"{what} on {subclasses} cannot be traced with symbolic sizes here ({type(e).__name__}: {e}); "
            "thunder_subclass keeps one trace per size for it (dynamic=False), or pass cache=\"constant values\"."
        ) from e
    return env, out, result


def emit_calls(env: FakeEnv, calls: list, out: Any, scope: list, what: str, subclasses: str,
               flatten_from: int = 0) -> Any:
    """Append to ``scope``: flattens of the subclass inputs ``env`` made fakes for (from index ``flatten_from``),
    the recorded aten ``calls``, and unflattens building subclass results; return ``out`` as proxies."""

    def to_proxy(x):
        if isinstance(x, torch.SymInt) and env.symbols is not None:
            return env.symbols.number(x, compute=True)
        if is_opaque_object(x):
            return env.proxy_of(x) or x
        if isinstance(x, torch.Tensor):
            p = env.proxy_of(x)
            if p is None:
                p = _produced_earlier(x)
            if p is not None:
                return p
            if isinstance(x, FakeTensor):
                raise UnsupportedSubclassOperationError(
                    f"{what} on {subclasses} used a tensor created outside any recorded aten operation."
                )
        return x

    trace = get_tracectx()
    mark = len(scope)
    trace.push_scope(scope)
    try:
        inputs = env.subclass_inputs[flatten_from:]
        for p in inputs:
            if not any(p is q for sub in inputs for q in sub.inner.values()):
                record_flatten(p, scope)
        for op, a, k, fake_out in calls:
            pa, pk = pytree.tree_map(to_proxy, (a, k))
            record_aten_call(op, pa, pk, fake_out, env, contiguous=contiguous_arguments(op, a, env))
        flat, spec = pytree.tree_flatten(out)
        result = pytree.tree_unflatten([_proxy_for_result(x, env, scope, what) for x in flat], spec)
    finally:
        trace.pop_scope()
    _mark_detached_if_grad_disabled(scope[mark:])
    _remember_produced(env)
    return result


# ---------------------------------------------------------------------------------------------------------------
# Fake runs shared by identical operations of one trace (repeated blocks: the same int8 linear in every layer)
# ---------------------------------------------------------------------------------------------------------------

_MEMO = "unroll_memo"
_MEMO_LIMIT = 512  # entries per trace


class _NotShared(Exception):
    """The operation's fake run cannot be shared (see :func:`memo_key`)."""


_FROZEN_SCALARS = (int, float, bool, str, bytes, complex, type(None), torch.dtype, torch.device, torch.layout,
                   torch.memory_format, dtypes.dtype, devices.Device)


def _freeze(v: Any) -> Any:
    """A hashable stand-in for a flatten context or Python attribute value, equal exactly when the values are equal
    (containers item by item); raises :class:`_NotShared` for a tensor or an unhashable object."""
    t = type(v)
    if t in _FROZEN_SCALARS or isinstance(v, (dtypes.dtype, devices.Device)):
        return (t, v)
    if t in (list, tuple):
        return (t, tuple(_freeze(i) for i in v))
    if t is dict:
        return (t, tuple((_freeze(k), _freeze(i)) for k, i in v.items()))
    if isinstance(v, (torch.Tensor, Proxy)):
        raise _NotShared
    try:
        hash(v)
    except TypeError:
        raise _NotShared from None
    return (t, v)


def _proxy_signature(p: TensorProxy, ids: dict) -> tuple:
    from torch.nested._internal.nested_tensor import NestedTensor

    from thunder_subclass.frontend.fake import stride_of, value_source
    from thunder_subclass.frontend.proxy import is_marked_leaf, nested_int_of

    if id(p) in ids:  # the same value again (x * x): the fake run sees one fake, not two
        return ("same", ids[id(p)])
    ids[id(p)] = len(ids)
    if value_source(p) is not None or nested_int_of(p) is not None:
        raise _NotShared  # fake runs that read values or ragged sizes
    if not all(type(n) is int for n in p._shape):
        raise _NotShared  # symbolic sizes (cache="symbolic values"): a number proxy compared in a key is a guard
    common = (tuple(p._shape), p.dtype, p.device, bool(p.requires_grad), is_marked_leaf(p))
    if isinstance(p, SubclassTensorProxy):
        if p.inner_refs or issubclass(p.subclass_type, NestedTensor):
            raise _NotShared
        inner = []
        for name, q in p.inner.items():
            if not isinstance(q, TensorProxy):
                raise _NotShared
            inner.append((name, _proxy_signature(q, ids)))
        return ("subclass", p.subclass_type, _freeze(p.flatten_ctx), _freeze(p.python_attrs), p.outer_stride, common,
                tuple(inner))
    if type(p) is not TensorProxy:
        raise _NotShared
    return ("tensor", stride_of(p), common)


def memo_key(fn: Callable, args: tuple, kwargs: dict) -> tuple | None:
    """What an operation's fake run depends on, as a hashable key, or None when the run cannot be shared.

    The run of ``fn`` on fakes of ``args`` / ``kwargs`` is a function of: ``fn``; the arguments' structure and
    constants; for each tensor its metadata (shape, strides, dtype, device, ``requires_grad``, leaf-ness), for a
    subclass value also its type, flatten context, Python attributes, outer strides and inner tensors; which
    arguments are the same value; the grad mode and default dtype. Not shared: runs that read tensor values, ragged
    sizes, number proxies or symbolic sizes (pinned by guards), opaque objects or tensors held in contexts; see
    :func:`_shareable`."""
    from thunder_subclass._thunder_internals import jit_state

    if jit_state() is None:
        return None
    flat, spec = tree_flatten((args, kwargs))
    ids: dict = {}
    key = [fn, spec, is_traced_grad_enabled(), torch.get_default_dtype()]
    try:
        for x in flat:
            key.append(_proxy_signature(x, ids) if isinstance(x, TensorProxy) else _freeze(x))
        key = tuple(key)
        hash(key)
    except (_NotShared, TypeError):
        return None
    return key


def _shareable(env: FakeEnv, calls: list, out: Any) -> bool:
    """Whether a finished fake run depends on nothing but its inputs' fakes: it wrote to no input, read no value,
    left no state outside tensors (DTensor's mask) or opaque object, made no ragged size, and every tensor its
    recorded calls read and it returned is an input's fake or an earlier call's result (not one kept from an earlier
    operation in a flatten context)."""
    from thunder_subclass._thunder_internals import registered_nested_int
    from thunder_subclass.frontend.proxy import OpaqueObjectProxy

    if env.mutated or env.known_values or env.context_states:
        return False
    known = set()
    for p, fake in env.bindings():
        if isinstance(p, OpaqueObjectProxy) or registered_nested_int(fake) is not None:
            return False
        known.add(id(fake))
    for _, a, k, fake_out in calls:
        for x in pytree.tree_leaves((a, k)):
            if isinstance(x, torch.Tensor) and id(x) not in known:
                return False
        known.update(id(x) for x in pytree.tree_leaves(fake_out) if isinstance(x, torch.Tensor))
    for x in pytree.tree_leaves(out):
        if isinstance(x, torch.Tensor):
            if is_traceable_wrapper_subclass(x):
                attrs, ctx = flatten_tensor(x)
                try:
                    _freeze(ctx)
                except _NotShared:
                    return False
                if any(id(getattr(x, a)) not in known for a in attrs):
                    return False
            elif id(x) not in known:
                return False
        elif not isinstance(x, _FROZEN_SCALARS):
            return False
    return True


def record_call_shared(fn: Callable, args: tuple, kwargs: dict, scope: list, what: str, subclasses: str) -> Any:
    """:func:`record_call` for an operation of the trace being interpreted, with its fake run shared by later
    operations of the same trace that have the same :func:`memo_key`: those record the same aten calls on their own
    proxies without running ``__torch_dispatch__`` again (a decoder layer's int8 linears in every further layer).
    Returns the proxy results."""
    from thunder_subclass._thunder_internals import jit_state

    found = _record_symbolic(fn, args, kwargs, scope, what, subclasses, {})
    if found is not None:
        return found[2]
    key = memo_key(fn, args, kwargs)
    memo = jit_state().setdefault(_MEMO, {}) if key is not None else None
    entry = memo.get(key) if memo is not None else None
    if entry is not None:
        return _replay(entry, args, kwargs, scope, what, subclasses)
    env, calls, out = run_on_fakes(fn, args, kwargs, what, subclasses)
    keep = memo is not None and len(memo) < _MEMO_LIMIT
    if keep:  # the input bindings as the run made them, before the calls are emitted
        inputs = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, TensorProxy)]
        bindings = _input_bindings(env, inputs)
    result = emit_calls(env, calls, out, scope, what, subclasses)
    if keep and _shareable(env, calls, out):
        memo[key] = (calls, out, inputs, bindings, list(env.subclass_inputs))
    return result


def _input_bindings(env: FakeEnv, inputs: list) -> list:
    """The (proxy, fake) bindings ``env`` made for ``inputs`` and their inner tensors, in the order it made them."""
    ids = set()

    def walk(p):
        if id(p) not in ids:
            ids.add(id(p))
            if isinstance(p, SubclassTensorProxy):
                for q in p.inner.values():
                    walk(q)

    for p in inputs:
        walk(p)
    return [(p, fake) for p, fake in env.bindings() if id(p) in ids]


def _replay(entry: tuple, args: tuple, kwargs: dict, scope: list, what: str, subclasses: str) -> Any:
    calls, out, old_inputs, bindings, old_subclass_inputs = entry
    new_inputs = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, TensorProxy)]
    mapping: dict = {}

    def correspond(old, new):
        mapping[id(old)] = new
        if isinstance(old, SubclassTensorProxy):
            for name, q in old.inner.items():
                correspond(q, new.inner[name])

    for old, new in zip(old_inputs, new_inputs):
        correspond(old, new)
    env = FakeEnv()
    for p, fake in bindings:  # the new proxies stand for the fakes the shared run made for the old ones
        env.bind(mapping[id(p)], fake)
    env.subclass_inputs = [mapping[id(p)] for p in old_subclass_inputs]
    return emit_calls(env, calls, out, scope, what, subclasses)


_PRODUCED = "produced_fakes"


def _remember_produced(env: FakeEnv) -> None:
    """Keep, for the trace being built, the fakes ``env`` bound to proxies (the results of the aten calls just
    recorded), so that a later operation's fake run that reads one of them finds its proxy (:func:`_produced_earlier`):
    a tensor a subclass keeps in its flatten context and uses in a later operation (DTensor's ``_MaskPartial`` keeps
    the mask that ``embedding`` made, and ``redistribute`` applies it). Owned by the trace's jit state while a jit
    interprets (freed with it), else by the trace being built (``trace_state``: autodiff's joint trace recording again,
    whose grad recipes keep these fakes alive anyway)."""
    state = _produced_store()
    if state is None:
        return
    produced = state.setdefault(_PRODUCED, {})
    for fake, p in env.bound_fakes():
        produced[id(fake)] = (fake, p)  # the fake is kept alive with its entry: its id is not reused


def _produced_store() -> dict | None:
    state = jit_state()
    return state if state is not None else trace_state()


def _produced_earlier(x: torch.Tensor):
    state = _produced_store()
    found = state.get(_PRODUCED, {}).get(id(x)) if state is not None else None
    return found[1] if found is not None and found[0] is x else None


def _mark_detached_if_grad_disabled(bsyms) -> None:
    # What Symbol.__call__ does for the symbols it records: outputs made under torch.no_grad are constants for
    # thunder's autodiff (ProxyTag.DETACHED_AUTOGRAD_GRAPH).
    from thunder.core.proxies import ProxyTag

    if is_traced_grad_enabled():
        return
    for bsym in bsyms:
        for o in bsym.flat_proxy_outs:
            if isinstance(o, TensorProxy):
                o.tags.add(ProxyTag.DETACHED_AUTOGRAD_GRAPH)


def bind_unrolled(sym: Symbol, args: tuple, kwargs: dict, result: Any, subsymbols: list) -> Any:
    """Append ``sym(*args, **kwargs) -> result`` with ``subsymbols`` to the current scope; return the outputs."""
    # An operation that returns one of its subclass inputs unchanged (x.contiguous(), x.to(x.dtype)) returns
    # the same object in eager mode: no new value, no bound symbol.
    if isinstance(result, TensorProxy) and any(result is a for a in tree_flatten((args, kwargs))[0]):
        return result

    # torch.return_types structseqs (torch.max(t, dim=1)): thunder 0.2.6 writes them into generated code as
    # namedtuple constructors (``torch.return_types.max(a, b)``), which fails; a tuple, as thunder's own symbols give
    if type(result).__module__ == "torch.return_types":
        result = tuple(result)

    # thunder never lets a bound symbol output one of its inputs; copy plain outputs that are inputs.
    inputs = {id(a) for a in tree_flatten((args, kwargs))[0] if isinstance(a, TensorProxy)}
    flat, spec = tree_flatten(result)
    if any(id(p) in inputs for p in flat):
        trace = get_tracectx()
        trace.push_scope(subsymbols)
        try:
            flat = [prims.shallow_copy(p) if id(p) in inputs else p for p in flat]
        finally:
            trace.pop_scope()
        result = tree_unflatten(flat, spec)

    subsymbols = _without_trailing_copy(sym, subsymbols)
    bsym = sym.bind(*args, **kwargs, output=result, subsymbols=subsymbols)
    get_tracectx().peek_scope().append(bsym)
    remember_argument_kinds(bsym)
    remember_call_location(sym, args, kwargs)
    return result


_LOCATIONS = "_thunder_subclass_call_locations"


def remember_call_location(sym: Symbol, args: tuple, kwargs: dict) -> None:
    """Remember the user's source line of the call ``sym(*args, **kwargs)`` recorded while interpreting user code: the
    grad transform records its backward later, when thunder knows no source line, and an error there names this one
    (:func:`call_location`). Kept on each tensor argument, by symbol and argument position (thunder renames the
    trace's inputs before differentiating, so names do not identify the call)."""
    filename, lineno = source_location()
    if filename is None:
        return
    flat = tree_flatten((args, kwargs))[0]
    for i, p in enumerate(flat):
        if isinstance(p, TensorProxy):
            p.__dict__.setdefault(_LOCATIONS, {})[(sym.id, i, len(flat))] = (filename, lineno)


def call_location(sym: Symbol, args: tuple, kwargs: dict) -> tuple | None:
    """The source line :func:`remember_call_location` remembered for this call (the one most of its tensor arguments
    remember for this symbol and position), or None."""
    flat = tree_flatten((args, kwargs))[0]
    found = [p.__dict__.get(_LOCATIONS, {}).get((sym.id, i, len(flat))) for i, p in enumerate(flat)
             if isinstance(p, TensorProxy)]
    found = [f for f in found if f is not None]
    return max(set(found), key=found.count) if found else None


def _without_trailing_copy(sym: Symbol, subsymbols: list) -> list:
    """``subsymbols`` of an out-of-place ``sym`` whose last one is thunder's ``copy_``: that ``copy_`` marks an
    in-place aten op on a value the implementation made itself (torchao's linear ends with ``y += bias; return y``),
    and is replaced by a ``shallow_copy`` of the written value (the same output proxy). thunder reads a bound symbol
    whose last subsymbol is ``copy_`` as an in-place op on its first argument (``core/update_aliases.py``
    ``_is_inplace_op``) and would then let later code read the op's output in place of that argument (the input of
    ``F.linear``)."""
    if not subsymbols or subsymbols[-1].sym.id != prims.PrimIDs.COPY_:
        return subsymbols
    if (sym.tags and prims.OpTags.IN_PLACE in sym.tags) or sym.name.endswith("_"):
        return subsymbols  # an in-place torch op (add_, copy_, setitem_: thunder tags not all of them IN_PLACE)
    last = subsymbols[-1]
    return [*subsymbols[:-1], prims.shallow_copy.bind(last.args[0], output=last.output)]


ARG_KINDS = "_thunder_subclass_arg_kinds"


def remember_argument_kinds(bsym) -> None:
    """Record, on the bound symbol's first output proxy, the kinds of the arguments its subsymbols were recorded for.
    thunder's autodiff later substitutes gradients into arguments (a guessed gradient by the actual one); the
    flatten pass compares and traces the symbol again when the kinds differ. Keyed by the symbol: a container's
    output can be the output of its last subsymbol too."""
    outs = bsym.flat_proxy_outs
    if outs:
        outs[0].__dict__.setdefault(ARG_KINDS, {})[bsym.sym.id] = tuple(proxy_kind(p) for p in bsym.flat_proxy_args)


def recorded_argument_kinds(bsym) -> tuple | None:
    """The argument kinds :func:`remember_argument_kinds` recorded for ``bsym``, or None."""
    outs = bsym.flat_proxy_outs
    return outs[0].__dict__.get(ARG_KINDS, {}).get(bsym.sym.id) if outs else None


