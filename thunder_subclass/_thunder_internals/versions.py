"""The supported stack and the compatibility shims that make thunder 0.2.6 importable under it.

Supported: torch >= 2.10, < 2.16 (:data:`TORCH_SUPPORTED`) with lightning-thunder 0.2.6. :func:`ensure_thunder_importable`
checks the versions (:class:`~thunder_subclass.errors.ThunderVersionError` otherwise), runs the :data:`SHIMS` that
serve this torch, then imports thunder. Each shim names the torch versions it serves and why; each is idempotent and
acts only where what it stands in for is missing:

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
opaque reference attributes in ``__tensor_flatten__`` need torch >= 2.11 (:data:`OPAQUE_ATTRIBUTES_TORCH`, checked in
:mod:`.torch_state`).
"""

from __future__ import annotations

import dataclasses
import re
import sys
import warnings
from collections.abc import Callable
from importlib import metadata

import torch

from thunder_subclass.errors import ThunderVersionError

TORCH_SUPPORTED = ((2, 10), (2, 16))  # torch >= 2.10, < 2.16, as (major, minor)


SUPPORTED_THUNDER = ("0.2.6",)


OPAQUE_ATTRIBUTES_TORCH = (2, 11)  # the first torch with opaque reference attributes in __tensor_flatten__


def torch_version() -> tuple[int, int]:
    """(major, minor) of the installed torch (``2.10.0+cu128`` -> ``(2, 10)``)."""
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


def format_version(version: tuple[int, int]) -> str:
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
            f"thunder_subclass supports torch >= {format_version(first)}, < {format_version(below)}, found {torch.__version__}. "
            "Install a supported torch, e.g. pip install torch==2.13.0"
        )
    thunder_version = _version("lightning-thunder")
    if thunder_version not in SUPPORTED_THUNDER:
        raise ThunderVersionError(
            f"thunder_subclass supports lightning-thunder {', '.join(SUPPORTED_THUNDER)}, found {thunder_version}. "
            "Install the pinned version: pip install lightning-thunder==0.2.6"
        )


# what thunder 0.2.6 warns at import when its optional Transformer Engine executor is not installed
# (executors/transformer_engineex.py): not something a thunder_subclass user can act on
TRANSFORMER_ENGINE_WARNING = "transformer_engine module not found!"


def ensure_thunder_importable() -> None:
    """Check the torch / thunder versions, run the :data:`SHIMS` that serve this torch, and import thunder, without
    thunder's :data:`TRANSFORMER_ENGINE_WARNING` (exactly that warning; any other is shown). Idempotent."""
    check_versions()
    version = torch_version()
    for shim in SHIMS:
        if shim.serves(version):
            shim.apply()
    if "thunder" in sys.modules:
        return
    # one filter, added for the import and removed after it (warnings.catch_warnings would also undo the filters that
    # thunder's own import adds)
    warnings.filterwarnings("ignore", message=re.escape(TRANSFORMER_ENGINE_WARNING) + "$", category=UserWarning)
    entry = warnings.filters[0]
    try:
        import thunder  # noqa: F401  (the import is the point)
    finally:
        if entry in warnings.filters:
            warnings.filters.remove(entry)
            mutated = getattr(warnings, "_filters_mutated", None)  # CPython's cache invalidation for warn()
            if mutated is not None:
                mutated()
