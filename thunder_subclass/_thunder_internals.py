"""The one module that reaches into thunder and torch internals: the bottom layer, importing no stage of the plugin.

Everything thunder_subclass needs from thunder 0.2.6 that has no public extension point is here, each hook naming
the thunder function it wraps. Hooks are installed idempotently by :func:`install` (called through
``thunder_subclass.hooks`` by ``thunder_subclass.jit`` and by the plugin when a model is compiled, never at import
time), are removed by :func:`uninstall`, and act only while a jit that uses the plugin is tracing or transforming
(its executor list holds ``thunder_subclass``'s executor); every other ``thunder.jit`` in the process behaves as if
they were absent. What a hook does for the plugin is a :class:`Handlers` callback that ``thunder_subclass.hooks``
(the layer above the stages) passes to :func:`install`; this module only knows thunder's side of each hook.

Hooks (thunder 0.2.6 paths, relative to the installed ``thunder/``):

* ``core/jit_ext.py`` ``JitCtx.proxify`` — a wrapper-subclass value becomes a ``SubclassTensorProxy`` with inner
  proxies and prologue guards, instead of a plain ``TensorProxy`` (there is no public proxify extension point;
  ``register_general_jit_callback`` refuses existing keys).
* ``core/symbol.py`` ``Symbol.__call__`` — the common end of ``torch.mul(x)``, ``x.mul()`` and ``x * y`` during
  interpretation: a torch-level symbol called with a subclass proxy is unrolled through ``__torch_dispatch__``
  (``Handlers.symbol_call``: ``thunder_subclass.interpretation``). Also where every grad rule puts a gradient
  (``prims.put_grad``): a gradient put for a 0-dim tensor with more dimensions than it is summed to its shape
  (:func:`sum_to_scalar_grad`; a thunder 0.2.6 bug, see there).
* ``core/jit_ext.py`` ``general_jit_lookaside`` — calls of a wrapper-subclass class (construction in traced code),
  ``isinstance`` and ``type`` on subclass proxies behave as in eager (``Handlers.lookaside``). Two interpreter bugs
  of thunder 0.2.6 are worked around there for plugin jits: classes with a pybind11 base (DTensor placements under
  torch 2.13) are called as Python, not interpreted (:func:`is_pybind11_class`: interpreting their ``__init__``
  aborts the process), and a keyword argument named ``fn`` no longer collides with the lookaside's own parameter.
* ``core/update_aliases.py`` ``_get_new_alias`` and ``prims.update_aliases`` (through the ``Symbol.__call__`` hook) —
  thunder's bookkeeping for in-place ops makes plain ``TensorProxy(like=x)`` versions of mutated values; a subclass
  value's new version stays a subclass proxy (``Handlers.new_alias``).
* ``core/interpreter.py`` ``wrap_args_from_list`` — ``f(*args)`` with an iterable that is not a list or tuple (a
  generator: ``torch.nn.utils.parametrize``'s ``ParametrizationList.forward``) fails in thunder's interpreter
  (``len()`` of a generator); it is made a tuple first, as CPython does.
* ``core/interpreter.py`` ``InterpreterFrame.get_or_make_python_frame`` — the made-up CPython frame (user's file,
  line, function) that the interpreter puts into the traceback of every exception leaving an interpreted function is
  made as thunder makes it, in a new thread, but waited for on a lock instead of thunder's busy loop, which holds the
  GIL until the 5 ms switch interval (5 ms per exception; every interpreted ``for`` loop and ``next()`` ends in one).
* ``core/interpreter.py`` module global ``dis`` — the interpreter decodes the bytecode of every frame it runs
  (``_run_frame``); ``dis.get_instructions(code)`` is answered from a cache per code object
  (:class:`_CachedInstructionsDis`), the rest of ``dis`` is the module itself.
* ``thunder/__init__.py`` ``_with_cache_info_ctx`` — for a plugin jit, the per-call cache info groups tensor
  arguments as aliases only when they are the same view (thunder groups any that share a storage and replaces one by
  a reshape of the other: a wrong value for ``f(x[:, :2], x[:, 2:])`` with an in-place op). In the same hook, the
  jit's ``populate_cache_info`` (the closure cell of that name in the ``get_computation_and_inputs`` it decorates) is
  replaced by one that fills the same entries with less work when no autocast, DDP/FSDP or possible alias is involved
  (:func:`_use_fast_populate_cache_info`), and calls thunder's otherwise.
* ``thunder/__init__.py`` ``fn_`` (not a hook: :func:`with_fast_cache_hits`, applied by ``thunder_subclass.jit`` to
  what ``thunder.jit`` returns) — calls reach a cache hit through the same steps as thunder's ``fn_`` (cache info,
  prologues under the compile data, computation, connection to autograd, epilogue, grad mode, statistics) without
  its wrapper layers; everything else (autocast, tracing, misses) calls thunder's ``fn_``.
* ``executors/passes.py`` ``_transform_for_operator_executor_execution`` — the point after autograd and before
  executors claim operations (looked up at call time by ``thunder/__init__.py`` and by ``transform_for_execution``):
  subclass-level bound symbols are replaced by their flat subsymbols (``Handlers.before_executors``:
  ``thunder_subclass.flatten``). In thunder 0.2.6
  ``grad_transform_on_trace`` builds one joint forward+backward trace before this point, so the pass sees (and
  flattens) forward and backward together, before ``split_into_forward_and_backward``.
* ``executors/torch_compile.py`` ``torch_compile_ex`` (registration, not a hook) — the plugin's generic aten-level
  symbols are declared supported by thunder's torch_compile executor while the hooks are installed
  (:func:`allow_torch_compile_fusion`), so its fusion regions are not cut at ops without a thunder equivalent.
* ``executors/torch_autograd.py`` ``ThunderFunction.forward`` — outputs eager would not give ``requires_grad``
  (inner tensors of a computed subclass, detached values) are marked non-differentiable, per trace
  (``Handlers.differentiable_outputs``), through thunder's own ``is_differentiable_outputs`` argument; non-leaf
  inputs changed in place are returned in place of their new values and marked dirty (``Handlers.mutated_inputs``),
  so that their autograd history becomes the compiled function's, as eager's becomes the in-place ops'.
* ``transforms/autodiff.py`` ``grad_transform_on_trace`` — gradients reach inputs changed in place, whose new
  values become forward outputs (:func:`grads_for_mutated_inputs`); ``split_into_forward_and_backward`` — the
  forward gives the epilogue the user's outputs only (the added new values stay in ``flat_output``).
* ``core/jit_ext.py`` ``process_recorded_modifications`` — also appends the plugin's epilogue calls
  (:func:`call_in_epilogue`: in-place view ops replayed on the caller's object).
* ``executors/torch_autograd.py`` ``ThunderFunction.backward`` — when ``.backward(grad)`` passes gradients of another
  kind than the compiled backward expects (a plain tensor for a ``TwoTensor`` output), a backward made for those
  gradients runs instead (``Handlers.replace_grads`` / ``run_backward``: ``thunder_subclass.tangents``); otherwise thunder's own backward runs unchanged. The gradient of a changed input whose new value nothing used stays
  undefined, as in eager (``Handlers.gradless_inputs``).

Interpreter fixes (thunder 0.2.6; each acts only for a plugin jit, found with Hugging Face transformers 4.55-5.x
models at their default call arguments, none specific to them; the hook's comment names what it works around):

* ``core/interpreter.py`` ``_type_call_lookaside`` (through the ``general_jit_lookaside`` hook) — ``type.__call__``
  as CPython runs it, ``__init__`` looked up on the type (thunder's reads it from the instance:
  "'wrapper_descriptor' object has no attribute '__self__'" for ``typing.Callable[...]``, made on every
  ``torch.vmap`` call by torch's ``_pytree``).
* ``core/jit_ext.py`` module global ``Sequence`` (used by ``general_jit_lookaside``, ``proxify``,
  ``recursively_proxy``) — only builtin sequences are iterated, not a user's ``collections.abc.Sequence``
  (transformers 5.x ``_PerLayerConfigView``: "object has no attribute '_config'").
* ``torch.cat`` / ``F.scaled_dot_product_attention`` (lookasides) — ATen's rule skipping 1-D empty tensors in
  ``cat`` (thunder's ``prims.cat_meta``: IndexError on DynamicCache's ``torch.tensor([])``); ``enable_gqa``, which
  thunder's ``ltorch.scaled_dot_product_attention`` lacks.
* ``core/jit_ext.py`` ``_general_jit_object_setattr_lookaside`` (through the ``general_jit_lookaside`` hook) — every
  attribute write on an input object reaches the epilogue, not only the first.
* ``core/jit_ext.py`` ``process_recorded_modifications`` — attribute writes of dtypes, devices and strings on input
  objects (its assertion admits Proxy, int, float, tuple, None, Device).
* ``core/jit_ext.py`` ``build_value_from_wrapped`` — a Python object made in the traced code and returned
  (``DynamicCache``) is rebuilt by the epilogue from its class and ``__dict__`` ("unhandled value of type").
* ``clang/__init__.py`` ``_basic_indexing`` — slice bounds below ``-length`` are clamped as in Python / torch.

``cache="symbolic values"`` (thunder 0.2.6; only for a plugin jit with that option): :func:`pin_numbers` (called by
``thunder_subclass.fake`` where a proxy becomes a fake) adds prologue checks for the input numbers a fake run
depends on; ``jit_ext.unpack_inputs`` (parameters tagged ``STATIC_MEMORY_LOCATION``), ``StringProxy``'s comparison
methods (inherited from ``Proxy``, which raises), and, through the ``general_jit_lookaside`` hook, thunder's bool
lookaside (a number input used only in a branch is guarded; thunder reuses a stale trace), list/tuple
``__getitem__`` with a number index, ``isinstance`` of a number proxy.

Accessors for private state (also only here): thunder's torch-callable -> symbol table
(``thunder.torch._torch_to_thunder_function_map``, :func:`torch_to_thunder_symbols`), the current compile data
(``thunder.core.compile_data._compile_data``), a trace's signature (``TraceCtx._siginfo``, :func:`new_trace`),
``ctx.maybe_clear_saved_tensors`` in the backward hook, and torch's opaque-object registry
(``torch._library.opaque_object``: :func:`is_opaque_reference_object`, :func:`opaque_guard_fn`; torch >= 2.11) and
its fake script objects (:func:`real_script_object`); torch's nested ints of jagged NestedTensors
(``torch.nested._internal``: the offsets -> nested int registry and ``FakeTensor.nested_int_memo``,
:func:`registered_nested_int`, :func:`set_fake_nested_int`, :func:`new_nested_int`) and a ``FakeTensorMode`` whose
``create_symbolic_nested_int`` makes plain nested ints instead of ``ShapeEnv`` symbols (:func:`fake_tensor_mode_class`);
torch's C++ tensor guard ``torch._C._dynamo.guards.TensorGuards`` (:func:`tensor_metadata_guard`: the fused
prologue's fast check of tensor metadata, with the Python checks behind it) and ``nn.Module``'s hook dictionaries
(:func:`module_forward_hooks`, :func:`has_no_global_module_hooks`, :func:`module_has_no_own_hooks_expression`).

Supported stack: torch >= 2.10, < 2.16 (:data:`TORCH_SUPPORTED`) with lightning-thunder 0.2.6. Compatibility shims
(:data:`SHIMS`), run by :func:`ensure_thunder_importable` before ``import thunder``, each naming the torch versions it
serves and why; each is idempotent and acts only where what it stands in for is missing:

* torch 2.13-2.15: thunder 0.2.6's ``thunder/torch/default_torch_ops.py`` lists named-tensor methods that torch 2.13
  removed (``torch.Tensor.align_as``, ``align_to``, ``has_names``, ``refine_names``, ``rename``), so ``import thunder``
  fails. Inert placeholders for exactly those names, which raise if called, are defined on ``torch.Tensor``. They
  stay (thunder's tables refer to them).
* torch 2.14-2.15: ``torch.autograd.Function.apply`` is the C classmethod of ``torch._C._FunctionBase`` (no
  ``__func__``), and thunder 0.2.6's ``core/jit_ext.py`` registers its autograd.Function lookaside under
  ``Function.apply.__func__`` at import. ``apply`` is rebound as a Python classmethod that calls that same C method,
  so eager behaviour (setup_context, functorch transforms, torch.compile) is unchanged.
* torch 2.10 with nvFuser (``nvfuser-cu128-torch210``, the only nvFuser build for a supported torch): the wheel ships
  the module ``nvfuser_direct`` and no ``nvfuser``. thunder 0.2.6 uses ``nvfuser_direct`` for nvFuser >= 0.2.34
  (``executors/nvfuserex_impl.py``) except in ``compute_contiguity``, run on every call of an nvFuser region, which
  does ``from nvfuser import compute_tensor_descriptor``. Where CUDA is available and only ``nvfuser_direct`` is
  installed, a module ``nvfuser`` holding just that function (``nvfuser_direct``'s) is registered.

Features that need a newer torch raise :class:`~thunder_subclass.errors.TorchFeatureUnavailableError` naming it:
opaque reference attributes in ``__tensor_flatten__`` need torch >= 2.11 (:data:`OPAQUE_ATTRIBUTES_TORCH`).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import weakref
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

import torch

from thunder_subclass.errors import ThunderVersionError

TORCH_SUPPORTED = ((2, 10), (2, 16))  # torch >= 2.10, < 2.16, as (major, minor)
SUPPORTED_THUNDER = ("0.2.6",)
OPAQUE_ATTRIBUTES_TORCH = (2, 11)  # the first torch with opaque reference attributes in __tensor_flatten__


def torch_version() -> tuple[int, int]:
    """(major, minor) of the installed torch (``2.10.0+cu128`` -> ``(2, 10)``)."""
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


def _fmt(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


_REMOVED_NAMED_TENSOR_METHODS = ("align_as", "align_to", "has_names", "refine_names", "rename")


def _removed_named_tensor_method(name: str) -> Callable:
    def placeholder(self, *args, **kwargs):
        raise RuntimeError(
            f"torch.Tensor.{name} was removed in torch 2.13 (named tensors); thunder_subclass defines this "
            "placeholder only so that lightning-thunder 0.2.6 can be imported."
        )

    placeholder.__name__ = name
    placeholder.__qualname__ = f"Tensor.{name}"
    placeholder._thunder_subclass_placeholder = True
    return placeholder


def _define_removed_named_tensor_methods() -> None:
    for name in _REMOVED_NAMED_TENSOR_METHODS:
        if not hasattr(torch.Tensor, name):
            setattr(torch.Tensor, name, _removed_named_tensor_method(name))


def _function_apply_as_classmethod() -> None:
    function = torch.autograd.Function
    c_apply = function.__dict__.get("apply")
    if c_apply is None or isinstance(c_apply, classmethod):
        return

    def apply(cls, *args, **kwargs):
        return c_apply(cls, *args, **kwargs)

    apply.__name__ = "apply"
    apply.__qualname__ = "Function.apply"
    apply.__doc__ = c_apply.__doc__
    apply._thunder_subclass_shim = True
    function.apply = classmethod(apply)


def _nvfuser_module_for_direct_bindings() -> None:
    import importlib.util
    import sys
    import types

    if "nvfuser" in sys.modules or importlib.util.find_spec("nvfuser") is not None:
        return
    if importlib.util.find_spec("nvfuser_direct") is None or not torch.cuda.is_available():
        return  # thunder 0.2.6 looks for nvFuser only where CUDA is available
    import nvfuser_direct

    module = types.ModuleType(
        "nvfuser",
        "thunder_subclass's stand-in holding nvfuser_direct's compute_tensor_descriptor, which thunder 0.2.6 "
        "imports from `nvfuser` (executors/nvfuserex_impl.py, compute_contiguity).",
    )
    module.compute_tensor_descriptor = nvfuser_direct.compute_tensor_descriptor
    module._thunder_subclass_shim = True
    sys.modules["nvfuser"] = module


@dataclasses.dataclass(frozen=True)
class Shim:
    """A compatibility shim run before ``import thunder`` under torch ``first`` to ``last`` (inclusive)."""

    first: tuple[int, int]
    last: tuple[int, int]
    apply: Callable[[], None]
    why: str

    def serves(self, version: tuple[int, int]) -> bool:
        return self.first <= version <= self.last


SHIMS = (
    Shim((2, 13), (2, 15), _define_removed_named_tensor_methods,
         "torch 2.13 removed named-tensor methods that thunder 0.2.6's thunder/torch/default_torch_ops.py lists"),
    Shim((2, 14), (2, 15), _function_apply_as_classmethod,
         "torch 2.14 made torch.autograd.Function.apply a C classmethod without __func__, which thunder 0.2.6's "
         "core/jit_ext.py reads at import (Function.apply.__func__)"),
    Shim((2, 10), (2, 10), _nvfuser_module_for_direct_bindings,
         "nvfuser-cu128-torch210 ships only nvfuser_direct; thunder 0.2.6's nvFuser executor imports "
         "compute_tensor_descriptor from nvfuser on every region call"),
)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def check_versions() -> None:
    """Raise :class:`ThunderVersionError` unless torch is in :data:`TORCH_SUPPORTED` and thunder is 0.2.6."""
    first, below = TORCH_SUPPORTED
    if not first <= torch_version() < below:
        raise ThunderVersionError(
            f"thunder_subclass supports torch >= {_fmt(first)}, < {_fmt(below)}, found {torch.__version__}. "
            "Install a supported torch, e.g. pip install torch==2.13.0"
        )
    thunder_version = _version("lightning-thunder")
    if thunder_version not in SUPPORTED_THUNDER:
        raise ThunderVersionError(
            f"thunder_subclass supports lightning-thunder {', '.join(SUPPORTED_THUNDER)}, found {thunder_version}. "
            "Install the pinned version: pip install lightning-thunder==0.2.6"
        )


def ensure_thunder_importable() -> None:
    """Check the torch / thunder versions, run the :data:`SHIMS` that serve this torch, and import thunder.
    Idempotent."""
    check_versions()
    version = torch_version()
    for shim in SHIMS:
        if shim.serves(version):
            shim.apply()
    import thunder  # noqa: F401  (the import is the point)


# ---------------------------------------------------------------------------------------------------------------
# Accessors for private thunder state
# ---------------------------------------------------------------------------------------------------------------


def current_compile_data() -> tuple[Any, Any]:
    """thunder's compile data and compile stats of the jit being compiled (``thunder.core.compile_data``)."""
    from thunder.core.compile_data import _compile_data

    return _compile_data.get()


def compile_data_context(cd, cs):
    """Make ``cd``/``cs`` current again (``thunder.core.compile_data.compile_data_and_stats``), e.g. to trace a
    backward variant at run time with the plugin's hooks active."""
    from thunder.core.compile_data import compile_data_and_stats

    return compile_data_and_stats(cd, cs)


def traced_autocast_states() -> tuple[tuple[str, torch.dtype, bool], ...]:
    """``(device type, dtype, enabled)`` for each ``torch.autocast`` active at this point of the traced code,
    outermost first: thunder's jit pushes the autocast active around the call and its ``torch.autocast.__enter__``
    / ``__exit__`` lookasides push and pop the ones the traced code enters (``CompileData.autocast_stack``,
    ``thunder/torch/__init__.py`` ``autocast_enter``). Empty outside a jit, and while thunder applies an autocast rule
    (``thunder.transforms.autocast.disable_autocast``: the rule's inputs are cast already)."""
    from thunder.core.compile_data import get_compile_data
    from thunder.transforms.autocast import is_autocast_enabled

    cd = get_compile_data()
    stack = getattr(getattr(cd, "autocast_stack", None), "stack", None)
    if not stack or not is_autocast_enabled():
        return ()
    import thunder.core.dtypes as dtypes

    return tuple((device, dtypes.to_torch_dtype(dtype) if isinstance(dtype, dtypes.dtype) else dtype, bool(enabled))
                 for device, dtype, enabled in stack)


@functools.cache
def torch_to_thunder_symbols() -> dict:
    """thunder's table from torch callables to the thunder torch symbols they are traced as
    (``thunder.torch._torch_to_thunder_function_map``), with the plain symbol in place of thunder 0.2.6's DTensor
    dispatch closures (taken from their ``single_device_symbol`` nonlocal). Entries without a symbol are left out."""
    import inspect

    import thunder.torch as ltorch
    from thunder.core.symbol import Symbol

    table = {}
    for torch_fn, sym in ltorch._torch_to_thunder_function_map.items():
        if not isinstance(sym, Symbol):
            sym = inspect.getclosurevars(sym).nonlocals.get("single_device_symbol") if callable(sym) else None
        if isinstance(sym, Symbol):
            table[torch_fn] = sym
    return table


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

    needs = _fmt(OPAQUE_ATTRIBUTES_TORCH)
    return TorchFeatureUnavailableError(
        f"{what}: opaque reference attributes in __tensor_flatten__ need torch >= {needs} (torch._opaque_base, "
        f"torch._library.opaque_object.get_opaque_obj_info); found torch {torch.__version__}.",
        feature="opaque reference attributes",
        needs_torch=needs,
    )


def thunder_resolves_method(name: str) -> bool:
    """Whether thunder's torch language context has a tensor method ``name`` (what ``TensorProxy.__getattr__``
    looks up: ``core/langctxs.py`` ``resolve_method``)."""
    from thunder.core.langctxs import resolve_method

    return resolve_method(name) is not None


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


def new_trace(name: str, args: list, *, names) -> Any:
    """An empty thunder trace whose signature is ``name(*args)`` (proxies), reserving ``names``. thunder 0.2.6 has
    no public constructor for a trace without a Python function, so the signature is set directly
    (``TraceCtx._siginfo``, as thunder's own jit_ext does)."""
    from thunder.core.codeutils import SigInfo
    from thunder.core.trace import TraceCtx

    trace = TraceCtx()
    trace.names = set(names)
    trace.args = args
    trace._siginfo = SigInfo.from_name_and_args(name, args)
    return trace


def source_location() -> tuple[str | None, int | None]:
    """The user's source file and line of the call being traced (thunder records it on the trace while it records
    symbols; otherwise the line the interpreter is at in the innermost frame of user code)."""
    from thunder.core.trace import get_tracectx

    trace = get_tracectx()
    if trace is not None and trace._current_source_filename is not None:
        positions = trace._current_source_positions
        return trace._current_source_filename, getattr(positions, "lineno", None)
    if not is_interpreting():
        return None, None
    import os

    import thunder
    from thunder.core.interpreter import get_interpreterruntimectx

    thunder_dir = os.path.dirname(thunder.__file__)
    for frame in reversed(get_interpreterruntimectx().frame_stack):
        if not frame.code.co_filename.startswith(thunder_dir):
            return frame.code.co_filename, getattr(frame.positions, "lineno", None)
    return None, None


def is_called_from_user_code() -> bool:
    """False when the call being interpreted comes from thunder's own interpreted helpers (for example the
    interpreter's binary-operator implementation calls ``type(a)``), True for the user's code."""
    import os

    import thunder
    from thunder.core.interpreter import get_interpreterruntimectx

    frame = get_interpreterruntimectx().peek_frame_stack()
    if frame is None:
        return True
    return not frame.code.co_filename.startswith(os.path.dirname(thunder.__file__))


def active_dispatch_modes() -> list:
    """The user's ``TorchDispatchMode`` s active now, innermost last (``torch.utils._python_dispatch``'s stack)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return list(_get_current_dispatch_mode_stack())


def jit_state() -> dict | None:
    """A dict the plugin keeps on thunder's jit context of the trace being interpreted (``jit_ext.get_jit_ctx``), or
    None when no jit is interpreting (e.g. while autodiff runs a grad rule)."""
    from thunder.core.jit_ext import get_jit_ctx

    try:
        ctx = get_jit_ctx()
    except LookupError:
        return None
    return ctx.__dict__.setdefault("_thunder_subclass_state", {})


def call_in_epilogue(sym, history, *args) -> None:
    """Append ``sym(obj, *args)`` to the epilogue of the trace being interpreted, where ``obj`` is the caller's object
    with provenance ``history`` (an input). The epilogue runs after the computation (and after thunder's autograd
    Function, which would hand the computation's outputs to it as new tensors: views of an input it returns), so
    ``obj`` comes from the prologue directly (``jit_ext.process_recorded_modifications`` does the same for a module
    whose buffers the traced code assigns). Calls run in the order they were added."""
    jit_state().setdefault("epilogue_calls", []).append((sym, history, args))


def interpret_call(fn, *wrapped_args, **wrapped_kwargs):
    """Call ``fn`` under thunder's interpreter from inside a lookaside (``interpreter._interpret_call``): its body is
    traced like user code. Arguments and result are the interpreter's wrapped values."""
    from thunder.core.interpreter import _interpret_call

    return _interpret_call(fn, *wrapped_args, **wrapped_kwargs)


def raise_in_interpreter(e: BaseException):
    """Raise ``e`` in the traced program from inside a lookaside (``interpreter.do_raise``): it reaches the user as
    itself, not wrapped in an ``InterpreterError``."""
    from thunder.core.interpreter import do_raise

    return do_raise(e)


def rebind_wrapped_value(wrapped, value) -> None:
    """Make the interpreter's wrapped value ``wrapped`` hold ``value`` from now on: every Python reference to it in the
    traced code (a local variable, a list item) then denotes ``value``, as after an in-place op on an object in eager.
    Its cached attribute reads are dropped (``WrappedValue.attribute_wrappers``)."""
    wrapped.value = value
    wrapped.attribute_wrappers.clear()


def super_arguments(wrapped_args: tuple) -> tuple[Any, Any]:
    """The (class, object) of a ``super(...)`` call being interpreted, unwrapped; for the zero-argument form, read
    from the calling frame's ``__class__`` cell and first argument as thunder's own ``_super_lookaside`` does
    (``core/interpreter.py``). (None, None) when they cannot be found."""
    from thunder.core.interpreter import get_interpreterruntimectx, unwrap

    if len(wrapped_args) == 2:
        return unwrap(wrapped_args[0]), unwrap(wrapped_args[1])
    if wrapped_args:
        return None, None
    frame = get_interpreterruntimectx().frame_stack[-1]
    if not frame.code.co_varnames:
        return None, None
    self_name, cls, obj = frame.code.co_varnames[0], None, None
    for i in range(len(frame.localsplus)):
        name, value = frame.get_localsplus_name(i), unwrap(frame.localsplus[i])
        if name == "__class__" and hasattr(value, "cell_contents"):
            cls = value.cell_contents
        elif name == self_name:
            obj = value.cell_contents if hasattr(value, "cell_contents") else value
    return cls, obj


def is_interpreting() -> bool:
    """Whether thunder's interpreter is tracing user code now (not a later pass re-running symbols)."""
    from thunder.core.interpreter import _interpretercompilectx

    try:
        _interpretercompilectx.get()
    except LookupError:
        return False
    return True


def interpret_native_call(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` traced by thunder's interpreter (its body like user code), called from plain Python
    that thunder's interpreter is running opaquely (a symbol call, a lookaside's body): arguments are wrapped as
    constants, the result unwrapped, an exception raised inside is raised here."""
    from thunder.core.interpreter import INTERPRETER_SIGNALS, _interpret_call, get_interpreterruntimectx, unwrap, wrap_const

    result = _interpret_call(wrap_const(fn), *(wrap_const(a) for a in args),
                             **{k: wrap_const(v) for k, v in kwargs.items()})
    if result is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
        runtime = get_interpreterruntimectx()
        exc, runtime.curexc = runtime.curexc, None
        raise exc
    return unwrap(result)


def is_torch_level_symbol(sym) -> bool:
    """A thunder torch-language symbol: a composite (``ltorch.mul``) or one of thunder's auto-registered torch
    fallbacks (prims tagged AUTO_REGISTERED, run eagerly by torch; in thunder 0.2.6 under torch 2.13 even
    ``torch.mm`` is one). Not prims, and not executor symbols (including thunder_subclass's own)."""
    if sym.executor is not None:
        return False
    if not sym.is_prim:
        return True
    from thunder.core.prims import OpTags

    return bool(sym.tags) and OpTags.AUTO_REGISTERED in sym.tags


def input_proxy_name(jit_ctx, value) -> str | None:
    """The name thunder gives the proxy of an input (``t_x``, ``t_fc_weight``: from the value's provenance,
    ``jit_ext._infer_name_postfix_from_provenance``), released in the trace so the proxy can take it; None when
    thunder would pick a fresh name."""
    from thunder.core.jit_ext import _infer_name_postfix_from_provenance

    postfix = _infer_name_postfix_from_provenance(value.provenance)
    if not postfix:
        return None
    name = f"t{postfix}"
    jit_ctx.computation_trace.names.discard(name)
    return name


def register_input_proxy(value, p) -> None:
    """Make ``p`` the proxy of the input wrapped ``value``, flagged as a tensor proxy in its provenance (what
    ``JitCtx.proxify`` does for tensors: ``EXT_FLAG_IS_TENSOR_PROXY``), so the prologue unpacks it."""
    from thunder.core.jit_ext import EXT_FLAG_IS_TENSOR_PROXY

    value.provenance.ext_flag |= EXT_FLAG_IS_TENSOR_PROXY
    value.register_proxy(p)


def jit_context():
    """thunder's jit context of the trace being interpreted (``jit_ext.get_jit_ctx``), or None."""
    from thunder.core.jit_ext import get_jit_ctx

    try:
        return get_jit_ctx()
    except LookupError:
        return None


# what thunder's prologue can unpack (core/jit_ext.py unpack_inputs, from_provenance), for values reached from inputs
_UNPACKABLE_PROVENANCE = {"INPUT_ARGS", "INPUT_KWARGS", "INPUT_FN", "LOAD_ATTR", "BINARY_SUBSCR"}


def is_unpackable_provenance(record) -> bool:
    """Whether thunder's prologue can fetch the value with provenance ``record`` from the inputs (attribute reads and
    subscripts of arguments or of the jitted callable), so that a prologue check can take it as an argument."""
    import dis

    from thunder.core.interpreter import ProvenanceRecord

    if not isinstance(record, ProvenanceRecord):
        return False
    inst = record.inst.opname if isinstance(record.inst, dis.Instruction) else getattr(record.inst, "name", None)
    if inst == "CONSTANT":
        return isinstance(record.value, (int, str))
    if inst not in _UNPACKABLE_PROVENANCE:
        return False
    return all(is_unpackable_provenance(i) for i in record.inputs)


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


def tensor_metadata_guard(tensors: Sequence, strides: Sequence) -> Callable | None:
    """``check(*tensors) -> bool``: torch's C++ tensor guard (``torch._C._dynamo.guards.TensorGuards``, what dynamo's
    ``TENSOR_MATCH`` guards run), made from ``tensors`` as examples, that is True for tensors of the same Python types,
    dispatch keys, dtypes, devices, ``requires_grad``, sizes and, where ``strides[i]`` is not None, strides (None for
    a non-tensor argument). That is stricter than thunder's metadata checks (dispatch keys) and much cheaper than
    them in Python: a caller checks in Python when it is False. None when this torch has no such guard or it does not
    accept ``tensors`` (it is checked on them once)."""
    guards = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
    make = getattr(guards, "TensorGuards", None)
    if make is None or not tensors:
        return None
    try:
        with torch._C.DisableTorchFunctionSubclass():  # no __torch_function__ of the user's runs for these reads
            sizes = [list(t.shape) for t in tensors]
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
    """``(pre, post)``: the forward pre-hooks and forward hooks of ``module`` as ``(hook, takes_kwargs)`` pairs, in
    the order ``Module._call_impl`` calls them (``torch/nn/modules/module.py``); None when its call involves more than
    those (backward hooks, global module hooks, ``torch.jit`` tracing)."""
    if module._backward_hooks or module._backward_pre_hooks or not has_no_global_module_hooks():
        return None
    pre, post = module._forward_pre_hooks, module._forward_hooks
    return (
        tuple((h, k in module._forward_pre_hooks_with_kwargs) for k, h in pre.items()) if pre else (),
        tuple((h, k in module._forward_hooks_with_kwargs) for k, h in post.items()) if post else (),
    )


def module_call_impl() -> Callable:
    """``torch.nn.Module._call_impl``: what thunder's interpreter meets for every module call."""
    return torch.nn.Module._call_impl


def attribute_provenance(history) -> Callable[[str], Any]:
    """``attr -> provenance of getattr(<value with provenance history>, attr)``, for inner tensors of an input
    (the prologue unpacks them as attributes of the input)."""
    from thunder.core.interpreter import ProvenanceRecord, PseudoInst, wrap_const

    def inner_history(attr: str):
        return ProvenanceRecord(PseudoInst.LOAD_ATTR, inputs=[history, wrap_const(attr).provenance])

    return inner_history


# ---------------------------------------------------------------------------------------------------------------
# Hooks. Each wraps one thunder function; what it does for the plugin comes from the Handlers given to install()
# (thunder_subclass.hooks wires the pipeline's stages in), so this module depends on no stage.
# ---------------------------------------------------------------------------------------------------------------

NOT_HANDLED = object()  # a handler's answer meaning "thunder's own behaviour applies"


@dataclasses.dataclass(frozen=True)
class Handlers:
    """What the hooks call while a plugin jit traces or transforms (see the module docstring for each hook).

    * ``executor``: the plugin's executor; its presence in a jit's executor list switches the hooks on.
    * ``proxify(jit_ctx, value, original)``: a proxy for the tensor ``value`` (a wrapped value) of a plugin jit.
    * ``symbol_call(sym, args, kwargs)``: the result of a torch-level symbol call, or ``NOT_HANDLED``; also called
      for the prims listed in ``prim_ids`` (thunder's alias bookkeeping for in-place ops: ``prims.update_aliases``).
    * ``plain_symbol_result(sym, args, kwargs, result)``: called after thunder recorded a torch-level symbol the
      plugin did not handle (e.g. to set its outputs' ``requires_grad`` as eager would).
    * ``new_alias(proxy)``: the proxy thunder's in-place alias pass makes for a new version of ``proxy``
      (``core/update_aliases.py`` ``_get_new_alias``), or ``NOT_HANDLED``.
    * ``lookaside(fn, wrapped_args)``: a lookaside for ``fn`` (as thunder's ``general_jit_lookaside`` returns),
      or None.
    * ``before_executors(trace)``: the trace executors will claim.
    * ``differentiable_outputs(compiled_backward)``: which outputs of a thunder forward call are differentiable
      (a tuple of bools), or None for thunder's default (all).
    * ``replace_grads(compiled_backward, grads)``: the incoming gradients of a thunder backward call, changed,
      or None to keep them.
    * ``run_backward(compiled_backward, grads, take_saved_tensors)``: the input gradients of a backward the plugin
      runs instead of thunder's compiled one, or ``NOT_HANDLED``; ``take_saved_tensors()`` releases the saved
      tensors to it.
    * ``mutated_inputs(compiled_backward)``: pairs (position in a thunder forward call's ``flat_args``, position in
      its ``flat_output``) of the inputs changed in place and their new values (``grads_for_mutated_inputs``), or
      ``()``.
    * ``gradless_inputs(compiled_backward, grads)``: of those, the ones whose gradient is undefined for these
      incoming gradients (``None`` where nothing used a new value), or ``()``.
    """

    executor: Any
    proxify: Callable
    symbol_call: Callable
    plain_symbol_result: Callable
    prim_ids: frozenset
    new_alias: Callable
    lookaside: Callable
    before_executors: Callable
    differentiable_outputs: Callable
    replace_grads: Callable
    run_backward: Callable
    mutated_inputs: Callable
    gradless_inputs: Callable


_handlers: Handlers | None = None


class _PluginActivity:
    """Whether the plugin's executor is in a compile data's executor list, remembered for the compile data last asked
    about (weakly: a jit's compile data holds the user's model). The hooks ask on every interpreted call; the answer
    changes only with the compile data (``CompileData.executors_list`` is a tuple set once, ``thunder/common.py``)."""

    def __init__(self):
        from thunder.core.compile_data import _compile_data

        self.compile_data_var = _compile_data
        # (weak reference to the compile data last asked about, the handlers installed then, the answer), replaced as
        # one tuple so that a thread never reads one jit's answer with another's compile data
        self.last = (lambda: None, None, False)

    def __call__(self) -> bool:
        cd = self.compile_data_var.get()[0]
        if cd is None:
            return False
        ref, handlers, active = self.last
        if ref() is cd and handlers is _handlers:
            return active
        active = _handlers is not None and _handlers.executor in cd.executors_list
        self.last = (weakref.ref(cd), _handlers, active)
        return active


@functools.cache
def _plugin_activity() -> _PluginActivity:
    return _PluginActivity()


def is_plugin_active() -> bool:
    """True while a jit that uses thunder_subclass traces or transforms (reads thunder's current compile data)."""
    return _handlers is not None and _plugin_activity()()


def _hook_proxify(original):
    # wraps thunder.core.jit_ext.JitCtx.proxify
    @functools.wraps(original)
    def proxify(self, value):
        if not isinstance(value.value, torch.Tensor) or value.original_value is not value.nothing or not is_plugin_active():
            return original(self, value)
        return _handlers.proxify(self, value, original)

    return proxify


def sum_to_scalar_grad(target, grad):
    """The gradient to put for ``target``: ``grad`` summed to shape ``()`` when ``target`` is a 0-dim tensor and
    ``grad`` is not. thunder 0.2.6 does not broadcast CPU scalar tensors in elementwise operations
    (``clang/utils.py`` ``maybe_broadcast_impl``: they are treated as numbers), so a primitive sees ``a: f32[6]``
    next to ``b: f32[]``, and its grad rule (``core/transforms.py``: ``_add_prim_grad`` puts ``b_grad = g``; likewise
    sub, mul, div, pow, maximum, where, ...) puts a ``f32[6]`` gradient for ``b``, which autodiff accumulates as it is:
    ``x * 2 + y.sum()`` gave ``y.grad`` 1 instead of 6, with plain ``thunder.jit`` too. A gradient of the right shape
    is returned unchanged."""
    from thunder.core.proxies import TensorProxy

    if isinstance(target, TensorProxy) and isinstance(grad, TensorProxy) and target.ndim == 0 < grad.ndim:
        import thunder.core.prims as prims

        return prims.sum(grad, tuple(range(grad.ndim)))
    return grad


def _hook_symbol_call(original):
    # wraps thunder.core.symbol.Symbol.__call__
    from thunder.core.prims import PrimIDs

    put_grad_id = PrimIDs.PUT_GRAD

    @functools.wraps(original)
    def __call__(self, *args, **kwargs):
        torch_level = is_torch_level_symbol(self)
        if self.id is put_grad_id and len(args) == 2 and is_plugin_active():
            args = (args[0], sum_to_scalar_grad(*args))
        elif (torch_level or (_handlers is not None and self.id in _handlers.prim_ids)) and is_plugin_active():
            result = _handlers.symbol_call(self, args, kwargs)
            if result is not NOT_HANDLED:
                return result
            result = original(self, *args, **kwargs)
            if torch_level:
                _handlers.plain_symbol_result(self, args, kwargs, result)
            return result
        return original(self, *args, **kwargs)

    return __call__


_native_functions: set = set()


def _is_hashable(x) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


def runs_natively(fn: Callable) -> Callable:
    """Decorator: ``fn`` is a plugin function handed to user code as a value (the bound method behind
    ``x.transpose_``, ``x.as_subclass``): when user code calls it, thunder's interpreter calls it as Python, instead
    of tracing its body like user code (where ``isinstance`` and attribute reads answer as for the user)."""
    _native_functions.add(fn)
    return fn


def is_pybind11_class(fn: Any) -> bool:
    """A Python class with a pybind11 base (torch 2.13's DTensor placements ``Shard``, ``Replicate``, ``Partial``
    derive from ``torch._C._distributed.*``). thunder 0.2.6's interpreter cannot call one: its type-call lookaside
    (``core/interpreter.py`` ``_type_call_lookaside``) interprets ``obj.__init__``, whose method unwrapping
    (``_call_dispatch``) resolves pybind11's ``function_record`` ``__init__`` slot and calls it, and the process
    aborts in C++ ("UNEXPECTED CALL OF function_record_PyTypeObject_methods::tp_init_impl")."""
    if not isinstance(fn, type) or issubclass(fn, torch.Tensor):
        return False
    return any(t.__module__ == "pybind11_builtins" for t in fn.__mro__)


def _is_native_function(fn) -> bool:
    try:
        return fn in _native_functions
    except TypeError:  # unhashable callables (pybind11's instancemethod)
        return False


# a keyword argument named like the lookaside's own first parameter, renamed so that thunder's
# general_jit_lookaside(fn, *args, **kwargs) does not get it twice (it only proxies the keyword arguments' values)
_FN_KEYWORD = "fn (keyword)"


def _hook_general_jit_lookaside(original):
    # wraps thunder.core.jit_ext.general_jit_lookaside
    @functools.wraps(original)
    def general_jit_lookaside(fn, /, *args, **kwargs):
        if is_plugin_active():
            if _is_native_function(fn) or is_pybind11_class(fn):
                from thunder.core.interpreter import interpreter_needs_wrap

                return interpreter_needs_wrap(fn)
            lookaside = (
                _handlers.lookaside(fn, args) or _interpreter_fix_lookaside(fn) or _symbolic_values_lookaside(fn, args)
            )
            if lookaside is not None:
                return lookaside
            if "fn" in kwargs:
                # thunder 0.2.6 takes `fn` by name too: f(x, fn=g) in traced code raised "got multiple values for
                # argument 'fn'" (plain thunder.jit as well)
                kwargs[_FN_KEYWORD] = kwargs.pop("fn")
        return original(fn, *args, **kwargs)

    return general_jit_lookaside


def _hook_get_new_alias(original):
    # wraps thunder.core.update_aliases._get_new_alias (it makes TensorProxy(like=alias.proxy), a plain proxy)
    @functools.wraps(original)
    def _get_new_alias(alias, trace):
        if is_plugin_active():
            from thunder.core.trace import tracectx

            with tracectx(trace):
                new = _handlers.new_alias(alias.proxy)
            if new is not NOT_HANDLED:
                return new
        return original(alias, trace)

    return _get_new_alias


def _hook_wrap_args_from_list(original):
    # wraps thunder.core.interpreter.wrap_args_from_list, which CALL_FUNCTION_EX (f(*args)) uses and which takes len()
    # of the arguments: CPython makes a tuple of any iterable there (f(*generator), as torch's parametrizations do)
    @functools.wraps(original)
    def wrap_args_from_list(lst):
        from thunder.core.interpreter import INTERPRETER_SIGNALS, _interpret_call, get_interpreterruntimectx, unwrap

        if not isinstance(unwrap(lst), (list, tuple)) and is_plugin_active():
            lst = _interpret_call(tuple, lst)
            if lst is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
                raise get_interpreterruntimectx().curexc
        return original(lst)

    return wrap_args_from_list


def _python_frame_in_new_thread(filename, firstlineno, rel_lineno, name, qualname, globals_, out, done) -> None:
    # a function whose body raises at line `rel_lineno` of its code (counted from 1), renamed and moved to the user's
    # function: its frame, taken from the traceback, says what a CPython frame of that function at that line would
    try:
        code = compile("\n" * (rel_lineno - 1) + "raise ValueError()", filename, "exec")
        code = code.replace(co_filename=filename, co_firstlineno=firstlineno, co_name=name, co_qualname=qualname)
        try:
            types.FunctionType(code, globals_)()
        except ValueError as e:
            tb = e.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        out.append(tb.tb_frame)
    finally:
        done.release()


def _hook_python_frame(original):
    # wraps thunder.core.interpreter.InterpreterFrame.get_or_make_python_frame, which puts a made-up CPython frame
    # (the user's file, line and function name) in the traceback of every exception leaving an interpreted function
    # (user code's error messages and tracebacks show the user's lines through it). thunder makes the frame in a new
    # thread (so that its f_back chain ends there) and waits for it in a busy loop holding the GIL: the thread runs
    # only when the interpreter's switch interval (5 ms) takes the GIL away, 5 ms per exception. The interpreter raises
    # one at the end of every interpreted for loop and next() (StopIteration): ~320 in a 2-layer Llama's first call.
    # The same frame, made the same way (same code object fields and globals), waiting on a lock instead.
    import _thread
    import sys

    @functools.wraps(original)
    def get_or_make_python_frame(self):
        if self.positions is None or sys.version_info < (3, 11) or not is_plugin_active():
            return original(self)
        lineno = self.positions.lineno if self.positions.lineno is not None else self.code.co_firstlineno
        code = self.code
        out, done = [], _thread.allocate_lock()
        done.acquire()
        _thread.start_new_thread(_python_frame_in_new_thread, (
            code.co_filename, code.co_firstlineno, lineno - code.co_firstlineno + 1, code.co_name, self.qualname,
            original.__globals__, out, done,
        ))
        done.acquire()
        return out[0] if out else original(self)

    return get_or_make_python_frame


class _CachedInstructionsDis(types.ModuleType):
    """What ``thunder.core.interpreter`` sees as its module global ``dis``: the ``dis`` module, except that
    ``get_instructions(code)`` is read from a cache per code object while a plugin jit traces. The interpreter
    decodes the bytecode of every frame it runs (``_run_frame``: ``tuple(dis.get_instructions(frame.code))``), the
    same functions over and over (~26,000 frames, ~270,000 instructions in a 2-layer Llama's first call). Code objects
    equal by value have equal instructions (``dis.Instruction`` holds no file name)."""

    def __init__(self, dis_module):
        super().__init__(dis_module.__name__, dis_module.__doc__)
        self.__dict__.update(vars(dis_module))  # read as often as a module's attributes (dis.Instruction)
        self._dis = dis_module
        self._instructions = weakref.WeakKeyDictionary()
        self.get_instructions = self._cached_instructions

    def _cached_instructions(self, x, *args, **kwargs):
        if args or kwargs or not isinstance(x, types.CodeType) or not is_plugin_active():
            return self._dis.get_instructions(x, *args, **kwargs)
        instructions = self._instructions.get(x)
        if instructions is None:
            instructions = self._instructions[x] = tuple(self._dis.get_instructions(x))
        return iter(instructions)


def _hook_interpreter_dis(original):
    # replaces the module global `dis` of thunder.core.interpreter (used by _run_frame and the opcode handlers)
    return _CachedInstructionsDis(original)


class _ViewAwareCacheInfo(dict):
    """thunder's per-call cache info (``thunder._cache_info_ctx``) for a plugin jit: thunder groups tensor arguments
    that share a storage as aliases of one another and then replaces all but the first by a reshape of it
    (``core/update_aliases.py`` ``replace_args_with_alias_map``), which is wrong for distinct views of one storage
    (``x[:, :2]`` and ``x[:, 2:]``: the second would read the first's values). Here only arguments that are the same
    view (same storage, offset, and shape and strides, or both contiguous of the same size) are grouped."""

    def __init__(self, args, kwargs):
        super().__init__()
        self._args = (args, kwargs)

    def __setitem__(self, key, value):
        if key == "alias_tensor_indices" and value:
            value = _same_view_groups(*self._args)
        super().__setitem__(key, value)


def _same_view_groups(args, kwargs) -> str:
    from torch.utils._pytree import tree_leaves

    groups: dict = {}
    for i, t in enumerate(tree_leaves((args, kwargs))):
        if type(t) is torch.Tensor and t.layout is torch.strided:
            contiguous = t.is_contiguous()
            view = (t.numel(),) if contiguous else (tuple(t.shape), tuple(t.stride()))
            groups.setdefault((t.untyped_storage().data_ptr(), t.storage_offset(), contiguous, view), []).append(i)
    return "-".join(",".join(map(str, g)) for g in groups.values() if len(g) > 1)


def _hook_with_cache_info_ctx(original):
    # wraps thunder._with_cache_info_ctx, the decorator thunder.jit puts on its per-call function; called inside
    # thunder.jit (its local `cd`, the jit's compile data, tells whether the jit uses the plugin)
    @functools.wraps(original)
    def _with_cache_info_ctx(fn):
        import sys

        import thunder

        jit_locals = sys._getframe(1).f_locals
        cd = jit_locals.get("cd")
        if _handlers is None or cd is None or _handlers.executor not in getattr(cd, "executors_list", ()):
            return original(fn)
        _use_fast_populate_cache_info(fn, jit_locals)

        def cache_info_wrapper(*args, **kwargs):
            token = thunder._cache_info_ctx.set(_ViewAwareCacheInfo(args, kwargs))
            try:
                return fn(*args, **kwargs)
            finally:
                thunder._cache_info_ctx.reset(token)

        return cache_info_wrapper

    return _with_cache_info_ctx


_SCALAR_TYPES = frozenset({int, float, bool, complex, str, type(None)})


def _plain_strided_tensors(args: tuple, kwargs: dict) -> int:
    """How many plain strided tensors thunder's alias grouping would see among the call's arguments (thunder's
    ``tree_flatten`` of ``(args, kwargs)``; taken directly when every argument is a tensor or a scalar)."""
    n = 0
    for t in (*args, *kwargs.values()) if kwargs else args:
        if type(t) is torch.Tensor:
            if t.layout is torch.strided:
                n += 1
        elif type(t) not in _SCALAR_TYPES and not isinstance(t, torch.Tensor):
            from thunder.core.pytree import tree_flatten

            flat, _ = tree_flatten((args, kwargs))
            return sum(1 for x in flat if type(x) is torch.Tensor and x.layout is torch.strided)
    return n


def _default_device_function() -> Callable[[], torch.device]:
    """``torch.get_default_device`` with a shorter common case: with no torch function mode active and no global
    default device set (``torch._GLOBAL_DEVICE_CONTEXT``, which ``torch.set_default_device`` fills), it returns
    ``torch.device("cpu")``, as torch's function does then (``torch/__init__.py``, torch 2.10-2.15); otherwise it is
    torch's function."""
    context = getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None)
    modes = getattr(torch._C, "_len_torch_function_stack", None)
    get_default_device = torch.get_default_device
    if context is None or modes is None:
        return get_default_device
    cpu = torch.device("cpu")

    def default_device() -> torch.device:
        if modes() or getattr(context, "device_context", None) is not None:
            return get_default_device()
        return cpu

    return default_device


def _use_fast_populate_cache_info(get_computation_and_inputs, jit_locals: dict) -> None:
    """For a plugin jit, thunder's ``populate_cache_info`` (a local function of ``thunder.jit`` that
    ``get_computation_and_inputs`` calls through its closure cell of that name, every call) is replaced by one that
    fills the same cache info with less work in the common case: no autocast, no DDP/FSDP, in-place alias updates on.
    There it skips thunder's alias grouping (a pytree flatten and one ``untyped_storage()`` per tensor, whose
    non-empty result :class:`_ViewAwareCacheInfo` recomputes anyway) when fewer than two plain tensors are passed,
    which cannot alias. Every other case calls thunder's function. Left as is when the closure is not as expected."""
    import weakref

    code = get_computation_and_inputs.__code__
    if "populate_cache_info" not in code.co_freevars or get_computation_and_inputs.__closure__ is None:
        return
    cell = get_computation_and_inputs.__closure__[code.co_freevars.index("populate_cache_info")]
    original = cell.cell_contents
    options = jit_locals.get("compile_options") or {}
    user_fn = jit_locals.get("fn")
    weak_cd = weakref.ref(jit_locals["cd"])
    if options.get("skip_inplace_alias_updates", False) or not callable(original):
        return
    get_default_dtype, get_default_device, is_grad_enabled = (
        torch.get_default_dtype, _default_device_function(), torch.is_grad_enabled
    )
    autocast = torch.is_autocast_enabled  # ("cpu") is torch.is_autocast_cpu_enabled() without its deprecation path
    dict_update = dict.update

    def populate_cache_info(cache_info, *args, **kwargs):
        if autocast() or autocast("cpu") or getattr(user_fn, "use_ddp", False) or getattr(user_fn, "use_fsdp", False):
            return original(cache_info, *args, **kwargs)
        if _plain_strided_tensors(args, kwargs) > 1:  # may alias: thunder's grouping, then _ViewAwareCacheInfo's
            return original(cache_info, *args, **kwargs)
        grad = is_grad_enabled()
        # the entries thunder's function sets, in its order ("" for alias_tensor_indices: no two tensors to alias)
        dict_update(cache_info, default_dtype=get_default_dtype(), default_device=get_default_device(),
                    is_autocast_enabled=False, alias_tensor_indices="", is_grad_enabled=grad, no_grad_sync=False)
        weak_cd().is_grad_enabled = grad

    populate_cache_info.__wrapped__ = original
    cell.cell_contents = populate_cache_info


@functools.cache
def _trace_decorator_codes() -> tuple:
    """The code objects of the two decorators thunder puts on generated computation and epilogue functions
    (``core/trace.py`` ``python_callable``: ``@torch.no_grad()`` then ``@no_autocast``)."""
    from thunder.executors.torchex import no_autocast

    sample = torch.no_grad()(no_autocast(lambda: None))
    return sample.__code__, sample.__wrapped__.__code__


def _undecorated(fn):
    """``fn`` without thunder's ``@torch.no_grad() @no_autocast`` when it has exactly those: in the fast path grad mode
    and autocast (CPU and CUDA) are already off, so they do nothing but cost two wrapper calls; else ``fn``."""
    no_grad_code, no_autocast_code = _trace_decorator_codes()
    inner = getattr(fn, "__wrapped__", None)
    if getattr(fn, "__code__", None) is not no_grad_code or getattr(inner, "__code__", None) is not no_autocast_code:
        return fn
    return getattr(inner, "__wrapped__", fn)


def with_fast_cache_hits(jfn):
    """A ``thunder.jit`` result (function or ``ThunderModule``) of a plugin jit whose calls take a shorter path to a
    cache hit than thunder 0.2.6's ``fn_`` (``thunder/__init__.py``): the same steps for the same result — the per-call
    cache info (this jit's ``populate_cache_info``, in thunder's cache-info context), the cache entries' prologues
    newest first under the jit's compile data, the hit's computation, its connection to autograd when the entry has a
    backward (thunder's ``connect_to_autograd`` with the arguments thunder's ``maybe_connect_to_autograd`` passes),
    the epilogue, the grad mode restored, and thunder's statistics (calls, cache hits, last traces) — without thunder's
    layers of wrappers around them (call statistics, language context, cache-info context, the timers and the
    per-call copy of the cache entry of ``decorate_computation_function``). Without grad mode the computation and
    epilogue run without their ``no_grad``/``no_autocast`` decorators, no-ops then (:func:`_undecorated`). Calls
    while tracing, under autocast, with a cache option other than constant values, and any call no entry's prologue
    accepts (a cache miss) go to thunder's own ``fn_``, which checks the entries again and traces. Returns the object
    to hand to the user: the same ``ThunderModule`` with its ``_forward_fn`` wrapped, or, for a function, a wrapper
    carrying thunder's ``_lc_*``
    attributes (``thunder.compile_stats`` and friends read them)."""
    import thunder
    from thunder.core.compile_data import reset_compile_data_and_stats, set_compile_data_and_stats
    from thunder.core.module import ThunderModule
    from thunder.core.options import CACHE_OPTIONS
    from thunder.core.trace import is_tracing

    cd, cs = getattr(jfn, "_lc_cd", None), getattr(jfn, "_lc_cs", None)
    module = isinstance(jfn, ThunderModule)
    original = jfn._forward_fn if module else jfn
    if cd is None or cs is None or cd.cache_option is not CACHE_OPTIONS.CONSTANT_VALUES:
        return jfn
    populate = getattr(cd, "populate_cache_info", None)
    if populate is None:
        return jfn
    import weakref

    from thunder.executors.torch_autograd import connect_to_autograd

    # what thunder.jit reads from its compile options once, for its maybe_connect_to_autograd
    disable_split_autograd = bool(cd.compile_options.get("thunderfx_disable_split_autograd", False))
    is_differentiable_outputs = cd.compile_options.get("is_differentiable_outputs", None)
    weak_cd, weak_cs = weakref.ref(cd), weakref.ref(cs)  # no reference cycle through the compiled function
    set_grad_enabled = torch.set_grad_enabled
    autocast = torch.is_autocast_enabled
    cache_info_ctx = thunder._cache_info_ctx

    @functools.wraps(original)
    def fast_call(*args, **kwargs):
        cs = weak_cs()
        if autocast("cpu") or autocast() or cs is None or not cs.interpreter_cache or is_tracing():
            return original(*args, **kwargs)
        cd = weak_cd()
        token = cache_info_ctx.set(_ViewAwareCacheInfo(args, kwargs))
        try:
            populate(cache_info_ctx.get(), *args, **kwargs)
            hit = None
            data_token = set_compile_data_and_stats(cd, cs)  # thunder's compile_data_and_stats, without a generator
            try:
                for entry in reversed(cs.interpreter_cache):
                    try:
                        inps, pro_to_epi = entry.prologue_fn(*args, **kwargs)
                    except Exception:
                        continue
                    hit = entry
                    break
            finally:
                reset_compile_data_and_stats(data_token)
        finally:
            cache_info_ctx.reset(token)
        if hit is None:
            return original(*args, **kwargs)
        cs.calls += 1
        cs.cache_hits += 1
        cs.last_traces = hit.computation_traces
        cs.last_interpreted_instructions = None
        cs.last_interpreter_log = None
        cs.last_prologue_traces = hit.prologue_traces
        cs.last_prologue = hit.prologue_fn
        if cd.is_grad_enabled:  # thunder's fn_: the computation (under its no_grad), connected to autograd, epilogue
            result = hit.computation_fn(*inps)
            if hit.backward_fn is not None:  # thunder's maybe_connect_to_autograd
                data_for_autograd, (saved_tensors, saved_other) = result
                connect_to_autograd(
                    backward_fn=hit.backward_fn, flat_args=data_for_autograd["flat_args"],
                    flat_output=data_for_autograd["flat_output"], saved_tensors=saved_tensors,
                    saved_other=saved_other, return_none_instead_of_grads=hit.return_none_instead_of_grads,
                    disable_split_autograd=disable_split_autograd, is_differentiable_outputs=is_differentiable_outputs,
                )
                result = data_for_autograd["output"]
            result = hit.epilogue_fn(*pro_to_epi, *result)
        else:
            fns = plain_fns.get(id(hit))
            if fns is None or fns[0] is not hit:
                fns = plain_fns[id(hit)] = (hit, _undecorated(hit.computation_fn), _undecorated(hit.epilogue_fn))
            result = fns[2](*pro_to_epi, *fns[1](*inps))
        set_grad_enabled(cd.is_grad_enabled)
        cs.last_computation = hit.computation_fn
        return result

    fast_call._thunder_subclass_fast_call = True
    plain_fns: dict = {}  # id(entry) -> (entry, computation, epilogue) without their no-grad/no-autocast decorators
    if module:
        jfn._forward_fn = fast_call
        return jfn
    for name in ("_lc_cd", "_lc_cs", "_lc_transforms"):
        if hasattr(jfn, name):
            setattr(fast_call, name, getattr(jfn, name))
    return fast_call


def _hook_operator_executor_execution(original):
    # wraps thunder.executors.passes._transform_for_operator_executor_execution
    @functools.wraps(original)
    def _transform_for_operator_executor_execution(trace, executors_list):
        if _handlers is not None and _handlers.executor in executors_list:
            trace = _handlers.before_executors(trace)
        return original(trace, executors_list)

    return _transform_for_operator_executor_execution


def _hook_grad_transform_on_trace(original):
    # wraps thunder.transforms.autodiff.grad_transform_on_trace
    @functools.wraps(original)
    def grad_transform_on_trace(trace, /, *args, **kwargs):
        if not is_plugin_active():
            return original(trace, *args, **kwargs)
        return grads_for_mutated_inputs(trace, lambda t: original(t, *args, **kwargs))

    return grad_transform_on_trace


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


def _hook_split_into_forward_and_backward(original):
    # wraps thunder.transforms.autodiff.split_into_forward_and_backward (imported by name when thunder compiles a
    # program that needs a backward): the forward returns, as "output" (what the epilogue gets), the user's outputs
    # only; the new values of inputs changed in place (grads_for_mutated_inputs) stay in "flat_output" (what autograd
    # connects), at its end
    from thunder.core.proxies import TensorProxy

    @functools.wraps(original)
    def split_into_forward_and_backward(joint_trace):
        forward, backward = original(joint_trace)
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
        if _handlers is not None and side_channel is None and is_differentiable_outputs is None:
            is_differentiable_outputs = _handlers.differentiable_outputs(compiled_backward)
        mutated = _handlers.mutated_inputs(compiled_backward) if _handlers is not None and side_channel is None else ()
        # torch refuses a Function that changes an input that is a view of another tensor and has more than one
        # output: such an input keeps its history from before the call (README "Limits")
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
        return original(ctx, return_none_instead_of_grads, compiled_backward, side_channel, saved_tensors,
                        saved_other, is_differentiable_outputs, flat_output, *flat_args)

    return staticmethod(forward)


def _hook_thunder_function_backward(original):
    # wraps thunder.executors.torch_autograd.ThunderFunction.backward (a staticmethod)
    original = original.__func__ if isinstance(original, staticmethod) else original

    @functools.wraps(original)
    def backward(ctx, *raw_args):
        if _handlers is None:
            return original(ctx, *raw_args)
        grads = ctx.side_channel["bw"] if ctx.side_channel is not None else raw_args
        gradless = _handlers.gradless_inputs(ctx.compiled_backward, grads)
        result = _backward(ctx, raw_args)
        # ThunderFunction.forward takes 7 non-tensor arguments before the flat tensors
        return tuple(None if k - 7 in gradless else r for k, r in enumerate(result)) if gradless else result

    def _backward(ctx, raw_args):
        if _handlers is not None:
            side_channel = ctx.side_channel
            grads = side_channel["bw"] if side_channel is not None else raw_args
            replaced = _handlers.replace_grads(ctx.compiled_backward, grads)
            if replaced is not None:
                grads = replaced
                if side_channel is not None:
                    side_channel["bw"] = replaced
                else:
                    raw_args = tuple(replaced)
            result = _handlers.run_backward(ctx.compiled_backward, grads, functools.partial(_take_saved_tensors, ctx))
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


# ---------------------------------------------------------------------------------------------------------------
# Interpreter fixes: thunder 0.2.6 interprets some ordinary Python unlike CPython (or torch). Each acts only while a
# plugin jit traces (:func:`is_plugin_active`); found with Hugging Face transformers models (4.55-5.x) called at their
# default arguments, none is specific to them.
# ---------------------------------------------------------------------------------------------------------------


def _type_call_lookaside(wrapped_typ, *args, **kwargs):
    """``type.__call__`` as CPython runs it (replaces ``core/interpreter.py`` ``_type_call_lookaside``, which reads
    ``__init__`` from the new *instance* and asserts it is bound): ``obj = typ.__new__(typ, ...)``; if ``obj`` is an
    instance of ``typ``, ``type(obj).__init__(obj, ...)``, looked up on the type. thunder's fails for classes whose
    instances forward attribute reads (a ``types.GenericAlias`` subclass such as ``typing.Callable[[PyTree], bool]``,
    built by torch's ``_pytree._broadcast_to_and_flatten`` on every ``torch.vmap`` call): "'wrapper_descriptor'
    object has no attribute '__self__'"."""
    from thunder.core.interpreter import INTERPRETER_SIGNALS, _interpret_call, unwrap, wrap_const

    typ = unwrap(wrapped_typ)
    if typ is type and len(args) == 1 and not kwargs:
        return wrap_const(type(unwrap(args[0])))
    obj = _interpret_call(typ.__new__, wrapped_typ, *args, **kwargs)
    if obj is INTERPRETER_SIGNALS.EXCEPTION_RAISED or not isinstance(unwrap(obj), typ):
        return obj
    init = _interpret_call(getattr, wrap_const(type(unwrap(obj))), wrap_const("__init__"))
    if init is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
        return init
    res = _interpret_call(init, obj, *args, **kwargs)
    return res if res is INTERPRETER_SIGNALS.EXCEPTION_RAISED else obj


class _BuiltinSequenceMeta(type):
    def __instancecheck__(cls, obj):
        if is_plugin_active():
            return isinstance(obj, cls.builtin)
        return isinstance(obj, cls.abc_sequence)

    def __subclasscheck__(cls, sub):
        if is_plugin_active():
            return isinstance(sub, type) and issubclass(sub, cls.builtin)
        return issubclass(sub, cls.abc_sequence)


def _hook_jit_ext_sequence(original):
    # replaces the module global `Sequence` of thunder.core.jit_ext (collections.abc.Sequence), which
    # general_jit_lookaside (every call without a lookaside: `any(isinstance(i, TensorProxy) for i in a.value)`),
    # proxify and recursively_proxy use to decide what to iterate and rebuild. Iterating a user's Sequence runs its
    # __getitem__ / __len__ outside the interpreter, even on `self` before __init__ ran (transformers 5.x
    # _PerLayerConfigView: "object has no attribute '_config'"), and hangs on one whose __getitem__ never raises
    # IndexError. For a plugin jit only the builtin sequences (list, tuple and their subclasses such as torch.Size
    # and namedtuples, range, deque) count; otherwise collections.abc.Sequence as before.
    import collections

    return _BuiltinSequenceMeta(
        "BuiltinSequence", (), {"builtin": (list, tuple, range, collections.deque), "abc_sequence": original}
    )


def _is_legacy_empty(t) -> bool:
    from thunder.core.proxies import TensorProxy

    return isinstance(t, (TensorProxy, torch.Tensor)) and len(t.shape) == 1 and t.shape[0] == 0


def _cat(tensors, dim=0, *, out=None):
    """``torch.cat`` with ATen's legacy rule (``aten/src/ATen/native/TensorShape.cpp``): 1-D tensors of size 0 are
    skipped, so ``cat([torch.tensor([]), x], dim=-2)`` is ``x`` (transformers' DynamicCache starts from
    ``torch.tensor([])``). thunder's ``ltorch.cat`` canonicalizes ``dim`` against the first tensor
    (``prims.cat_meta``): IndexError."""
    import thunder.torch as ltorch

    if out is not None:
        raise NotImplementedError("torch.cat(..., out=) is not supported by thunder")
    tensors = list(tensors)
    kept = [t for t in tensors if not _is_legacy_empty(t)]
    if kept and len(kept) != len(tensors) and all(t.dtype == kept[0].dtype for t in tensors):
        tensors = kept
    return ltorch.cat(tensors, dim)


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """``F.scaled_dot_product_attention`` with torch >= 2.5's ``enable_gqa`` (key/value heads repeated to the query's
    head count), which thunder 0.2.6's ``ltorch.scaled_dot_product_attention`` lacks: "unexpected keyword argument
    'enable_gqa'" (transformers 5.x passes it whenever the mask is None)."""
    import thunder.torch as ltorch

    if enable_gqa and key.shape[-3] != query.shape[-3]:
        repeats = query.shape[-3] // key.shape[-3]
        key = ltorch.repeat_interleave(key, repeats, dim=-3)
        value = ltorch.repeat_interleave(value, repeats, dim=-3)
    return ltorch.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale=scale)


def _traced_symbol_lookaside(fn):
    from thunder.core.interpreter import interpreter_needs_wrap
    from thunder.core.jit_ext import recursively_proxy

    def lookaside(*args, **kwargs):
        recursively_proxy(*args, **kwargs)
        return interpreter_needs_wrap(fn)(*args, **kwargs)

    return lookaside


@functools.cache
def _fixed_torch_functions() -> dict:
    cat = _traced_symbol_lookaside(_cat)
    return {
        torch.cat: cat,
        torch.concat: cat,
        torch.concatenate: cat,
        torch.nn.functional.scaled_dot_product_attention: _traced_symbol_lookaside(_sdpa),
    }


def _object_setattr_lookaside(original):
    """thunder's lookaside for ``object.__setattr__`` on an input object (``core/jit_ext.py``
    ``_general_jit_object_setattr_lookaside``) records the write for the epilogue through the dict ``__setitem__``
    lookaside on the object's wrapped ``__dict__``; from the second write on, the interpreter reaches that dict
    through a new wrapper without thunder's member-dict flag, and the write is not recorded: the caller's object
    keeps its old value (transformers' ``DynamicLayer.lazy_initialization`` sets four attributes, one reached the
    caller). Every write is recorded on the flagged wrapper (the epilogue keeps the last per attribute)."""
    from thunder.core.interpreter import INTERPRETER_SIGNALS, PseudoInst, WrappedValue, unwrap, wrap_const
    from thunder.core.jit_ext import (
        _TORCH_DYNAMIC_TYPES,
        EXT_FLAG_IS_MODULE_MEMBER_DICT,
        get_jit_ctx,
        is_created_during_tracing,
    )

    def lookaside(obj, name, value):
        res = original(obj, name, value)
        if res is INTERPRETER_SIGNALS.EXCEPTION_RAISED:
            return res
        uobj = unwrap(obj)
        if is_created_during_tracing(obj.provenance) or type(uobj) in _TORCH_DYNAMIC_TYPES or not hasattr(uobj, "__dict__"):
            return res
        d = obj.attribute_wrappers.get("__dict__")
        if d is not None and d.provenance.ext_flag & EXT_FLAG_IS_MODULE_MEMBER_DICT:
            name = name if isinstance(name, WrappedValue) else wrap_const(name)
            get_jit_ctx()._additional_outputs[d].append((PseudoInst.STORE_SUBSCR, d, name, value))
        return res

    return lookaside


def _interpreter_fix_lookaside(fn):
    """The lookaside of an interpreter fix for ``fn``, or None."""
    if fn is type.__call__:
        return _type_call_lookaside
    if fn is object.__setattr__:
        from thunder.core.jit_ext import _general_jit_lookaside_map

        return _object_setattr_lookaside(_general_jit_lookaside_map[object.__setattr__])
    if _is_hashable(fn):
        return _fixed_torch_functions().get(fn)
    return None


def _clamp_bound(b, length):
    from thunder.core.proxies import NumberProxy

    value = b.value if isinstance(b, NumberProxy) else b
    length_value = length.value if isinstance(length, NumberProxy) else length
    if not isinstance(value, int) or isinstance(value, bool) or not isinstance(length_value, int):
        return b
    if value >= -length_value:
        return b
    for p in (b, length):  # under symbolic values the clamping holds for these numbers only
        if isinstance(p, NumberProxy) and is_interpreting():
            _pin_input_numbers(p)
    return -length_value


def _hook_basic_indexing(original):
    # wraps thunder.clang._basic_indexing, which rejects slice bounds below -length ("start=-4095 is not a valid
    # index for length 16") where Python and torch clamp them (x[-4095:] of a length-16 dim is all of it;
    # transformers' sliding-window cache layers slice `[:, :, -self.sliding_window + 1:, :]`)
    @functools.wraps(original)
    def _basic_indexing(a, /, key):
        if not is_plugin_active():
            return original(a, key)
        new_key, dim = [], 0
        for x in key:  # a list, ellipses resolved; None entries add a dimension and index none of a's
            if isinstance(x, slice) and dim < len(a.shape):
                x = slice(_clamp_bound(x.start, a.shape[dim]), _clamp_bound(x.stop, a.shape[dim]), x.step)
            new_key.append(x)
            dim += x is not None
        return original(a, new_key)

    return _basic_indexing


class _ConstantAttributeValueMeta(type):
    def __instancecheck__(cls, obj):
        import thunder

        return obj is None or isinstance(
            obj, (thunder.dtypes.dtype, thunder.devices.Device, torch.dtype, torch.device, str)
        )


class _ConstantAttributeValue(metaclass=_ConstantAttributeValueMeta):
    """What ``isinstance(v, NoneType)`` admits inside ``process_recorded_modifications`` for a plugin jit."""


def _hook_process_recorded_modifications(original):
    # wraps thunder.core.jit_ext.process_recorded_modifications, which asserts that a value the traced code writes to
    # an attribute of an input object (the epilogue's pack_attr) is a Proxy, int, float, tuple, None or thunder Device
    # (the tuple is built from jit_ext's module globals when it runs). transformers' DynamicLayer writes
    # `self.dtype = key_states.dtype` on a cache layer generate() passes in: "trying to set .dtype ... to object of
    # type dtype". For a plugin jit, jit_ext.NoneType admits dtypes, devices and strings (printable constants) while
    # it runs.
    @functools.wraps(original)
    def process_recorded_modifications(ctx, epilogue_trace):
        import thunder.core.jit_ext as jit_ext

        if not is_plugin_active():
            return original(ctx, epilogue_trace)
        saved = jit_ext.NoneType
        jit_ext.NoneType = _ConstantAttributeValue
        try:
            original(ctx, epilogue_trace)
        finally:
            jit_ext.NoneType = saved
        _add_epilogue_calls(ctx, epilogue_trace)

    return process_recorded_modifications


def _add_epilogue_calls(ctx, epilogue_trace) -> None:
    # the calls call_in_epilogue collected, each on a proxy of the caller's object made from its provenance (one per
    # object): not a computation input, so thunder passes it from the prologue to the epilogue
    from thunder.core.proxies import Proxy
    from thunder.core.trace import tracectx

    objects: dict[int, Any] = {}
    for sym, history, args in ctx.__dict__.get("_thunder_subclass_state", {}).get("epilogue_calls", ()):
        obj = objects.get(id(history))
        if obj is None:
            obj = objects[id(history)] = Proxy(history=history)
            epilogue_trace.add_name(obj.name)
        with tracectx(epilogue_trace):
            epilogue_trace.bound_symbols.append(sym.bind(obj, *args, output=None))


@functools.cache
def _object_rebuild_symbol():
    from thunder.core.proxies import AnyProxy

    def meta(typ, state):
        return AnyProxy(None)

    def impl(typ, state):
        obj = typ.__new__(typ)
        obj.__dict__.update(state)
        return obj

    return _handlers.executor.register_operator("python_object_rebuild", meta=meta, fn=impl)


def _is_plain_object(v) -> bool:
    """An object that ``build_value_from_wrapped`` has no rule for: not a constant, collection, dataclass, tensor,
    module, type or callable; a Python object with a ``__dict__``."""
    import dataclasses
    import enum
    import types

    import thunder
    import thunder.core.baseutils as baseutils
    import thunder.core.codeutils as codeutils
    from thunder.core.proxies import ProxyInterface

    if isinstance(v, (thunder.dtypes.dtype, thunder.devices.Device, ProxyInterface, codeutils.ContextObject,
                      torch.finfo, enum.Enum, type, torch.Tensor, torch.nn.Module, types.ModuleType)):
        return False
    if type(v) in (str, object) or baseutils.is_base_printable(v) or baseutils.is_collection(v) or callable(v):
        return False
    return type(v).__module__ != "builtins" and hasattr(v, "__dict__") and not dataclasses.is_dataclass(v)


def _hook_build_value_from_wrapped(original):
    # wraps thunder.core.jit_ext.build_value_from_wrapped (the epilogue's return value; recursive through the module
    # global), which knows inputs, constants, dataclasses, tuples, lists and dicts: any other object made in the
    # traced code and returned raises "unhandled value of type <class '...DynamicCache'>". Such an object is rebuilt
    # by the epilogue from its class and its __dict__, with the attributes the traced code set taken as their values
    # in the trace (proxies become the computed tensors).
    @functools.wraps(original)
    def build_value_from_wrapped(wrapped_v):
        import thunder.core.jit_ext as jit_ext
        from thunder.core.interpreter import unwrap

        v = unwrap(wrapped_v)
        if is_plugin_active() and is_nested_int(v):
            from thunder_subclass.errors import UnsupportedSubclassOperationError

            raise UnsupportedSubclassOperationError(
                f"the compiled function returns {v}, the ragged size of a jagged NestedTensor (a nested int): the "
                f"compiled program would return the one seen when it was traced, also for a NestedTensor with other "
                f"offsets on a cache hit. Return the NestedTensor and read its .shape outside the compiled function."
            )
        if (
            is_plugin_active()
            and not hasattr(wrapped_v, "anyproxy")
            and not jit_ext.should_register_for_prologue(wrapped_v.provenance)
            and _is_plain_object(v)
        ):
            state = {}
            for k, value in vars(v).items():
                w = wrapped_v.attribute_wrappers.get(k)
                state[k] = jit_ext.build_value_from_wrapped(w) if w is not None else value
            return _object_rebuild_symbol()(type(v), state)
        return original(wrapped_v)

    return build_value_from_wrapped


# ---------------------------------------------------------------------------------------------------------------
# thunder's cache="symbolic values" for plugin jits. Plain inputs' sizes and number inputs become NumberProxies whose
# values the prologue does not check. thunder_subclass runs subclass operations on fakes of the current sizes (no
# ShapeEnv), so every number that reaches a fake run is pinned (:func:`pin_numbers`: the input numbers it is computed
# from get a value check in the prologue); sizes that only meet plain operations stay symbolic (transformers'
# DynamicCache length in decoding: one trace for every decode step). The hooks below fix what thunder 0.2.6 itself
# gets wrong under symbolic values; each acts only for a plugin jit with that cache option.
# ---------------------------------------------------------------------------------------------------------------


def _symbolic_values_active() -> bool:
    if not is_plugin_active():
        return False
    from thunder.core.compile_data import get_compile_data
    from thunder.core.options import CACHE_OPTIONS

    return get_compile_data().cache_option is CACHE_OPTIONS.SYMBOLIC_VALUES


def _is_input_number(v) -> bool:
    from thunder.core.jit_ext import should_register_for_prologue

    return v.history is not None and should_register_for_prologue(v.history)


class _Producers:
    """name of each proxy -> the first bound symbol producing it (an outer symbol before its subsymbols), over the
    computation trace being built: its top level is indexed as it grows (again from the start if it shrank: a
    recording that was undone), the few open nested scopes are searched on each lookup."""

    def __init__(self, trace):
        self.trace, self.table, self.seen = weakref.proxy(trace), {}, 0

    def _index(self, bsyms, table) -> None:
        for b in bsyms:
            for o in b.flat_proxy_outs:
                table.setdefault(o.name, b)
            self._index(b.subsymbols, table)

    def get(self, name: str):
        top = self.trace.bound_symbols
        if len(top) < self.seen:
            self.table, self.seen = {}, 0
        self._index(top[self.seen:], self.table)
        self.seen = len(top)
        b = self.table.get(name)
        if b is None:
            open_scopes: dict = {}
            for scope in self.trace.scopes[1:]:
                self._index(scope, open_scopes)
            b = open_scopes.get(name)
        return b


def _trace_producers() -> _Producers:
    """The :class:`_Producers` of the computation trace being built (kept on the trace)."""
    from thunder.core.trace import get_tracectx

    trace = get_tracectx()
    producers = trace.__dict__.get("_thunder_subclass_producers")
    if producers is None:
        producers = trace.__dict__["_thunder_subclass_producers"] = _Producers(trace)
    return producers


@functools.cache
def _torch_callables_by_symbol_id() -> dict:
    table = {}
    for torch_fn, sym in torch_to_thunder_symbols().items():
        table.setdefault(sym.id, []).append(torch_fn)
    return {k: tuple(v) for k, v in table.items()}


def tensor_producer(p) -> tuple[tuple[Callable, ...], Any] | None:
    """``(torch_fns, bsym)``: the torch callables that thunder traces as the torch-level symbol which produced
    tensor proxy ``p`` in the computation trace being interpreted (``torch.relu``, ``Tensor.relu``, ``F.relu``: the
    symbol's arguments fit one of them), and that bound symbol; None for inputs of the trace, outside
    interpretation, and for symbols with no torch callable. (thunder's proxies carry no strides: running the torch
    callable on fakes gives eager's.)"""
    from thunder.core.trace import get_tracectx

    if get_tracectx() is None or not is_interpreting():
        return None
    b = _trace_producers().get(p.name)
    if b is None:
        return None
    fns = _torch_callables_by_symbol_id().get(b.sym.id)
    return None if fns is None else (fns, b)


def _pin_input_numbers(v) -> None:
    """A prologue value check on every input number ``v`` is computed from (``v`` itself if it is one)."""
    import thunder.clang as clang
    from thunder.core.jit_ext import get_jit_ctx
    from thunder.core.proxies import NumberProxy

    ctx, producers, seen, stack = get_jit_ctx(), None, set(), [v]
    while stack:
        p = stack.pop()
        if p.name in seen:
            continue
        seen.add(p.name)
        if _is_input_number(p):
            if not p.is_dynamic():
                p.make_static_constrained()
            ctx.add_constraint((clang.check_number_type_and_value, p, p.value))
            continue
        producers = producers if producers is not None else _trace_producers()
        b = producers.get(p.name)
        if b is not None:
            stack.extend(a for a in b.flat_proxy_args if isinstance(a, NumberProxy))


def pin_numbers(x) -> None:
    """Pin ``x`` (a number proxy, or a tensor proxy's sizes) before it becomes part of a fake run, where a plugin jit
    traces with ``cache="symbolic values"``: the traced program is valid only for these values."""
    from thunder.core.proxies import NumberProxy, TensorProxy

    if not is_interpreting() or not _symbolic_values_active():
        return
    if isinstance(x, NumberProxy) and x.value is not None:
        _pin_input_numbers(x)
    elif isinstance(x, TensorProxy):
        for s in x._shape:
            if isinstance(s, NumberProxy) and s.value is not None:
                _pin_input_numbers(s)


_STRING_PROXY_METHODS = ("__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__add__", "__mul__", "__rmul__",
                         "__mod__", "__rmod__")


def _string_proxy_method(name: str, original):
    # StringProxy (thunder/core/proxies.py, `class StringProxy(Proxy, str)`) defines __eq__, but Proxy's
    # NotImplementedError-raising __ne__, __lt__, ... come first in its MRO: under symbolic values a string attribute
    # reached from an input (config._attn_implementation) fails `!= "eager"` (transformers' attention). For a plugin
    # jit, str's behaviour on its value (no guard recorded, as for thunder's own __eq__).
    str_method = getattr(str, name)

    def method(self, *args):
        if not is_plugin_active():
            return original(self, *args)
        from thunder.core.proxies import StringProxy

        return str_method(self.value, *(a.value if isinstance(a, StringProxy) else a for a in args))

    method.__name__ = name
    return method


def _hook_string_proxy_method(name: str):
    return lambda original: _string_proxy_method(name, original)


class _TaggingUnpackParameter:
    """``prims.unpack_parameter`` whose bound outputs carry ``STATIC_MEMORY_LOCATION``."""

    def __init__(self, sym):
        self._sym = sym

    def bind(self, *args, output=None, **kwargs):
        from thunder.core.proxies import ProxyTag

        if output is not None and hasattr(output, "tags"):
            output.tags.add(ProxyTag.STATIC_MEMORY_LOCATION)
        return self._sym.bind(*args, output=output, **kwargs)

    def __getattr__(self, name):
        return getattr(self._sym, name)


def _hook_unpack_inputs(original):
    # wraps thunder.core.jit_ext.unpack_inputs. Under symbolic values a parameter's sizes have provenance
    # `<param>.shape[i]`, so unpack_inputs unpacks the parameter as an intermediate (a fresh proxy) and then asserts
    # it carries STATIC_MEMORY_LOCATION, which only the parameter's own proxy has: "Parameter was not tagged with
    # STATIC_MEMORY_LOCATION" (thunder.jit(nn.Linear(4, 4), cache="symbolic values") fails in 0.2.6). While it runs
    # for a plugin jit, prims.unpack_parameter tags its outputs.
    @functools.wraps(original)
    def unpack_inputs(*args, **kwargs):
        import thunder.core.prims as prims

        if not _symbolic_values_active():
            return original(*args, **kwargs)
        saved = prims.unpack_parameter
        prims.unpack_parameter = _TaggingUnpackParameter(saved)
        try:
            return original(*args, **kwargs)
        finally:
            prims.unpack_parameter = saved

    return unpack_inputs


def _sequence_getitem_lookaside(original):
    """thunder's list/tuple ``__getitem__`` (``core/interpreter.py`` ``SequenceWrapperMethods.__getitem__``) accepts
    only ``int`` indices; under symbolic values an int attribute (``LlamaAttention.layer_idx``) is an IntegerProxy:
    "list indices must be integers or slices, not IntegerProxy" (transformers' ``self.layers[layer_idx]``). The index
    is pinned (a prologue check) and its value used."""
    from thunder.core.interpreter import WrappedValue, wrap_const
    from thunder.core.proxies import IntegerProxy

    def lookaside(self, idx, /):
        value = idx.value if isinstance(idx, WrappedValue) else idx
        if isinstance(value, IntegerProxy) and value.python_type is int:
            _pin_input_numbers(value)
            idx = wrap_const(int(value.value))
        return original(self, idx)

    return lookaside


def _number_isinstance(obj, cls):
    # isinstance on a NumberProxy tests its Python value (its type is part of the number's identity in thunder's
    # caching); thunder answers False for isinstance(<IntegerProxy>, int), so transformers'
    # `slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep` indexes with a number
    return isinstance(obj.value, cls)


class _Name(str):
    """A proxy's name in a :class:`_Condition` step (as opposed to a constant string)."""


class _Condition:
    """A branch condition as a straight-line program over input numbers, re-evaluated by a prologue check on the
    call's numbers: steps ``(out, fn, args)`` whose args are input / earlier names or constants."""

    def __init__(self, inputs, steps, out, expected):
        self.inputs, self.steps, self.out, self.expected = inputs, steps, out, expected

    def __call__(self, *values) -> bool:
        env = dict(zip(self.inputs, values))
        for out, fn, args in self.steps:
            env[out] = fn(*(env[a] if isinstance(a, _Name) else a for a in args))
        return bool(env[self.out]) == self.expected

    def __repr__(self):
        return f"<condition {self.out} == {self.expected} over {self.inputs}>"


@functools.cache
def _number_ops() -> dict:
    import operator

    return {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "eq": operator.eq, "ne": operator.ne,
            "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
            "floor_divide": operator.floordiv, "neg": operator.neg, "bitwise_and": operator.and_,
            "bitwise_or": operator.or_, "py_and": lambda a, b: a and b}


@functools.cache
def _condition_check_symbol():
    from thunder.core.prims import OpTags

    def check_condition(condition, *values):
        if not condition(*values):
            raise RuntimeError(f"{condition} does not hold")

    return _handlers.executor.register_operator(
        "check_number_condition", meta=lambda condition, *values: None, fn=check_condition, tags=[OpTags.DONT_DCE]
    )


def _condition_program(v):
    """``(input proxies, _Condition)`` for ``v`` computed from input numbers by number prims only; None otherwise."""
    from thunder.core.proxies import NumberProxy, Proxy

    producers, ops = _trace_producers(), _number_ops()
    inputs, steps, seen = {}, [], set()

    def visit(p) -> bool:
        if p.name in seen:
            return True
        seen.add(p.name)
        if _is_input_number(p):
            inputs[p.name] = p
            return True
        b = producers.get(p.name)
        if b is None or not b.sym.is_prim or b.sym.name not in ops or b.kwargs:
            return False
        args = []
        for a in b.args:
            if isinstance(a, NumberProxy):
                if not visit(a):
                    return False
                args.append(_Name(a.name))
            elif isinstance(a, Proxy):
                return False
            else:
                args.append(a)
        steps.append((p.name, ops[b.sym.name], tuple(args)))
        return True

    if not visit(v):
        return None
    names = list(inputs)
    return [inputs[n] for n in names], _Condition(names, steps, v.name, bool(v.value))


def _bool_lookaside(original):
    """thunder's bool lookaside (``core/jit_ext.py`` ``_general_jit_bool_lookaside``) makes a NumberProxy that
    control flow branches on static-constrained, but the prologue checks only numbers passed on to the computation
    or epilogue (``unpack_inputs``): an input number used only in a branch is not checked, and a trace made for one
    branch serves the other (transformers' ``DynamicLayer.update`` ``if not self.is_initialized``: prefill and decode
    would share a trace). The branch is guarded: an input number by its value; a number computed from input numbers
    by number prims as that condition, re-evaluated on the call's numbers (so ``kv_len + offset > 0`` does not pin
    each size); anything else pins the input numbers it depends on."""
    from thunder.core.proxies import NumberProxy

    def lookaside(wrapped_x):
        res = original(wrapped_x)
        v = wrapped_x.value
        if isinstance(v, NumberProxy) and v.is_static_constrained():
            import thunder.clang as clang
            from thunder.core.jit_ext import get_jit_ctx

            if _is_input_number(v):
                get_jit_ctx().add_constraint((clang.check_number_type_and_value, v, v.value))
                return res
            program = _condition_program(v)
            if program is None:
                _pin_input_numbers(v)
                return res
            inputs, condition = program
            get_jit_ctx().add_constraint((_condition_check_symbol(), condition, *inputs))
            v.make_constrainable()  # the condition guard replaces thunder's pinning of every input it reads
        return res

    return lookaside


def _symbolic_values_lookaside(fn, wrapped_args):
    """The lookaside of a symbolic-values fix for ``fn``, or None."""
    if not (fn is bool or fn is list.__getitem__ or fn is tuple.__getitem__ or fn is isinstance):
        return None
    if not _symbolic_values_active():
        return None
    import thunder.core.interpreter as interpreter
    import thunder.core.jit_ext as jit_ext
    from thunder.core.proxies import NumberProxy

    if fn is bool:
        return _bool_lookaside(jit_ext._general_jit_lookaside_map[bool])
    if fn is list.__getitem__ or fn is tuple.__getitem__:
        return _sequence_getitem_lookaside(interpreter._default_provenance_tracking_lookaside_map[fn])
    if fn is isinstance and len(wrapped_args) == 2 and isinstance(interpreter.unwrap(wrapped_args[0]), NumberProxy):
        return interpreter.interpreter_needs_wrap(_number_isinstance)
    return None


def _targets() -> list[tuple[Any, str, Callable]]:
    import thunder
    import thunder.clang as clang
    import thunder.core.interpreter as interpreter
    import thunder.core.jit_ext as jit_ext
    import thunder.core.proxies as proxies
    import thunder.core.symbol as symbol
    import thunder.core.update_aliases as update_aliases
    import thunder.executors.passes as passes
    import thunder.executors.torch_autograd as torch_autograd
    import thunder.transforms.autodiff as autodiff

    return [
        (jit_ext.JitCtx, "proxify", _hook_proxify),
        (symbol.Symbol, "__call__", _hook_symbol_call),
        (jit_ext, "general_jit_lookaside", _hook_general_jit_lookaside),
        (update_aliases, "_get_new_alias", _hook_get_new_alias),
        (interpreter, "wrap_args_from_list", _hook_wrap_args_from_list),
        (interpreter.InterpreterFrame, "get_or_make_python_frame", _hook_python_frame),
        (interpreter, "dis", _hook_interpreter_dis),
        (thunder, "_with_cache_info_ctx", _hook_with_cache_info_ctx),
        (passes, "_transform_for_operator_executor_execution", _hook_operator_executor_execution),
        (autodiff, "grad_transform_on_trace", _hook_grad_transform_on_trace),
        (autodiff, "split_into_forward_and_backward", _hook_split_into_forward_and_backward),
        (torch_autograd.ThunderFunction, "forward", _hook_thunder_function_forward),
        (torch_autograd.ThunderFunction, "backward", _hook_thunder_function_backward),
        (jit_ext, "Sequence", _hook_jit_ext_sequence),
        (clang, "_basic_indexing", _hook_basic_indexing),
        (jit_ext, "process_recorded_modifications", _hook_process_recorded_modifications),
        (jit_ext, "build_value_from_wrapped", _hook_build_value_from_wrapped),
        (jit_ext, "unpack_inputs", _hook_unpack_inputs),
        *((proxies.StringProxy, name, _hook_string_proxy_method(name)) for name in _STRING_PROXY_METHODS),
    ]


_originals: dict[tuple[int, str], tuple[Any, str, Any]] = {}
_INHERITED = object()  # the hooked attribute was inherited, not in the owner's __dict__


def is_installed() -> bool:
    return bool(_originals)


def install(handlers: Handlers) -> None:
    """Install every hook (idempotent), acting through ``handlers``. Called through ``thunder_subclass.hooks``
    (by ``thunder_subclass.jit`` and the plugin), never at import."""
    global _handlers
    ensure_thunder_importable()
    _handlers = handlers
    if _originals:
        return
    for owner, name, make_hook in _targets():
        # an inherited attribute (StringProxy's comparisons come from Proxy) is shadowed, and deleted by uninstall
        original = owner.__dict__.get(name, _INHERITED)
        _originals[(id(owner), name)] = (owner, name, original)
        hook = make_hook(getattr(owner, name) if original is _INHERITED else original)
        hook._thunder_subclass_hook = True
        setattr(owner, name, hook)
    _register_torch_compile_fusible()


def uninstall() -> None:
    """Remove every hook, restoring thunder's own functions. Compiled functions keep working; new
    subclass compilations need :func:`install` again (``thunder_subclass.jit`` does it)."""
    for owner, name, original in _originals.values():
        if original is _INHERITED:
            delattr(owner, name)
        else:
            setattr(owner, name, original)
    _originals.clear()
    _unregister_torch_compile_fusible()


# ---------------------------------------------------------------------------------------------------------------
# thunder's torch_compile executor and the plugin's aten-level symbols
# ---------------------------------------------------------------------------------------------------------------

# symbol id -> (symbol, execution transform or None): may be put in torch_compile fusion regions
_torch_compile_fusible: dict[Any, tuple[Any, Any]] = {}


def allow_torch_compile_fusion(sym, execution_transform=None) -> None:
    """Let thunder's torch_compile executor put ``sym`` in its fusion regions. For the plugin's generic aten-level
    symbols (``aten__scaled_mm_default``: run by their ``OpOverload``, which ``torch.compile`` traces), so that an op
    without a thunder equivalent does not cut a region in two. It changes a shared thunder object (the
    ``torch_compile_ex`` executor, through its public ``FusionExecutor.register_supported``): done only while the
    hooks are installed, and undone by :func:`uninstall`. Other jits are unaffected: the symbols occur only in
    traces made by the plugin. With ``execution_transform``, the executor records that instead of ``sym`` (e.g.
    a call of an opaque custom-op wrapper, for ops whose inductor lowering would not keep their input layouts)."""
    _torch_compile_fusible[sym.id] = (sym, execution_transform)
    if _originals:
        _register_torch_compile_fusible({sym.id: (sym, execution_transform)})


def _torch_compile_executor():
    try:
        from thunder.executors.torch_compile import torch_compile_ex
    except Exception:  # torch_compile executor unavailable: nothing to register
        return None
    return torch_compile_ex


def _register_torch_compile_fusible(entries: dict | None = None) -> None:
    """Register ``entries`` (default: every symbol allowed so far, as :func:`install` does)."""
    ex = _torch_compile_executor()
    if ex is None:
        return
    for sym_id, (sym, execution_transform) in (_torch_compile_fusible if entries is None else entries).items():
        if sym_id not in ex.implmap:
            ex.register_supported(sym, execution_transform=execution_transform)


def _unregister_torch_compile_fusible() -> None:
    ex = _torch_compile_executor()
    if ex is None:
        return
    for sym_id in _torch_compile_fusible:
        ex.implmap.pop(sym_id, None)


def torch_compile_fusible_symbols() -> dict[Any, tuple[Any, Any]]:
    """Every symbol allowed in torch_compile regions so far (:func:`allow_torch_compile_fusion`): symbol id ->
    (symbol, execution transform or None), read-only. The plugin's own inductor executor claims the same ones."""
    return types.MappingProxyType(_torch_compile_fusible)


# ---------------------------------------------------------------------------------------------------------------
# Inductor regions without dynamo (thunder_subclass.inductor_executor)
# ---------------------------------------------------------------------------------------------------------------


def region_callable(bsyms, inputs, outputs, name: str) -> Callable:
    """A Python function ``name(*inputs) -> list(outputs)`` running a fusion region's bound symbols with thunder's
    torch executor. thunder 0.2.6 has no public API for this: its torch_compile executor builds the same kind of
    function in ``executors/torch_compile.py`` ``make_compiled`` (a ``TraceCtx`` whose arguments are unpacked
    trivially, the region's symbols, a return; lowered by ``transform_for_execution`` with the torch executor) and
    hands it to ``torch.compile``; here it is made for inductor alone (``compile_with_inductor``)."""
    from thunder.core import prims
    from thunder.core.codeutils import SigInfo
    from thunder.core.trace import TraceCtx, tracectx
    from thunder.executors.passes import transform_for_execution
    from thunder.executors.torchex import ex as torch_ex

    trace = TraceCtx(None)
    trace.args, trace.kwargs = list(inputs), {}
    for p in inputs:
        trace.add_name(p.name)
    with tracectx(trace):
        for p in inputs:
            prims.unpack_trivial(p, name=p.name)
    trace.bound_symbols.extend(bsyms)
    trace.bound_symbols.append(prims.python_return.bind(list(outputs), output=None))
    for bsym in bsyms:  # names made inside the region are taken, so that lowering makes no clashing proxy
        for b in (bsym, *bsym.subsymbols):
            for o in b.flat_outs:
                if o is not None and hasattr(o, "name") and o.name not in trace.names:
                    trace.add_name(o.name)
    trace._siginfo = SigInfo(name)
    trace._siginfo.args = [(p.name, None) for p in inputs]
    lowered = transform_for_execution(trace, executors_list=(torch_ex,))
    return lowered.python_callable(include_decorators=False)


def compile_with_inductor(fn: Callable, example_inputs: list) -> Callable:
    """``fn`` (tensors in, a list of tensors out; functional) compiled by inductor without dynamo: traced to an aten
    fx graph by ``make_fx`` (fake tensors with the example inputs' metadata, inductor's decompositions) and compiled
    by ``torch._inductor.compile_fx.compile_fx_inner`` (torch internal, torch 2.13). The result takes one list of
    inputs (inductor's boxed convention: the list is emptied) and returns a tuple. The compiled code checks that
    each input's sizes and strides are the example's (``assert_size_stride``, AssertionError otherwise)."""
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    with torch.no_grad():
        graph = make_fx(fn, decomposition_table=select_decomp_table(), tracing_mode="fake")(*example_inputs)
        return compile_fx_inner(graph, list(example_inputs))
