"""Stage 4 (interpretation) for torch.distributed: DTensor's entry and exit points and tensor parallelism's module
hooks.

In: calls the interpreter meets while a plugin jit traces: ``DTensor.from_local``, ``DTensor.to_local``,
``DTensor.redistribute``, ``DTensor.full_tensor``, ``distribute_tensor`` (in user code, and in the input/output hooks
that ``parallelize_module`` puts on modules), and the hook functions of tensor-parallel styles
(``ColwiseParallel._prepare_input_fn``, ``SequenceParallel._prepare_output_fn``, ...).

What happens: each such call is recorded as ONE container bound symbol
(``thunder_subclass.transforms.autograd.container_symbol``): the function runs once on fakes under the recorder, so its
subsymbols are what DTensor does below it — the ``flatten_DTensor`` / ``unflatten_DTensor`` of its local tensors and the
functional collectives its redistribution issues (``_c10d_functional.all_reduce`` / ``all_gather_into_tensor`` /
``reduce_scatter_tensor`` and ``wait_tensor``, which have fake kernels and become aten-level symbols that run the real
collectives at call time; the process group is a string argument). Its gradient is PyTorch's, run on fakes
(``from_local``'s backward, ``redistribute``'s reverse collectives), as for ``torch.autograd.Function`` calls. The
flatten pass inlines it like any container.

Why not thunder's own: thunder 0.2.6 registers these functions as its experimental ``dtensor.torch.*`` symbols
(``torch/experimental/dtensor_torch_and_prims.py``), which return its own ``DTensorProxy``, not a subclass proxy: the
next operation saw a plain tensor next to a DTensor ("aten.addmm.default got mixed torch.Tensor and DTensor"). The
TP style hooks are recorded whole because thunder's interpreter spends most of a TP model's first call stepping
through their Python (placement checks, redistribution planning).

Out: one container bound symbol per call, whose result proxies are DTensor subclass proxies.

Under ``FakeTensorMode`` ``funcol._are_we_tracing()`` is true, so DTensor waits on each collective at once and no
``AsyncCollectiveTensor`` is made while tracing; at run time the functional collective returns a plain tensor that the
recorded ``wait_tensor`` waits on. ``AsyncCollectiveTensor`` inputs of a compiled function are wrapper subclasses like
any other (their ``__torch_dispatch__`` waits).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable

import torch

from thunder.core.proxies import TensorProxy

from thunder_subclass._thunder_internals import source_location, torch_version
from thunder_subclass.transforms.autograd import record_function_call
from thunder_subclass.errors import TorchFeatureUnavailableError, format_location
from thunder_subclass.frontend.proxy import is_marked_leaf

__all__ = ["lookaside", "is_tensor_parallel_hook", "dtensor_entry_points"]


@functools.cache
def dtensor_entry_points() -> dict[Callable, tuple[str, str]]:
    """DTensor's functions that cross between local tensors and DTensors or change placements: function -> (symbol
    name, name in error messages). Empty where torch.distributed is unavailable."""
    if not torch.distributed.is_available():
        return {}
    from torch.distributed.tensor import DTensor, distribute_tensor

    return {
        DTensor.from_local: ("DTensor_from_local", "DTensor.from_local"),
        DTensor.to_local: ("DTensor_to_local", "DTensor.to_local"),
        DTensor.redistribute: ("DTensor_redistribute", "DTensor.redistribute"),
        DTensor.full_tensor: ("DTensor_full_tensor", "DTensor.full_tensor"),
        distribute_tensor: ("distribute_tensor", "torch.distributed.tensor.distribute_tensor"),
    }


def _distribute_leaf(tensor, *args, **kwargs):
    """``distribute_tensor`` of the leaf tensor that ``tensor`` stands for. Eager accepts leaf tensors only (and its
    result is a new leaf: no gradient reaches ``tensor``); thunder's autodiff hands grad rules a copy of each input
    (the edge of its graph), which is no leaf. Whether the user's tensor is a leaf is checked while interpreting."""
    from torch.distributed.tensor import distribute_tensor

    if not tensor.is_leaf:
        tensor = tensor.detach().requires_grad_(tensor.requires_grad)
    return distribute_tensor(tensor, *args, **kwargs)


def _record_distribute_tensor(tensor, *args, **kwargs):
    if torch_version() < (2, 11):
        raise TorchFeatureUnavailableError(
            f"torch.distributed.tensor.distribute_tensor inside a thunder_subclass-compiled function at "
            f"{format_location(*source_location())} needs torch >= 2.11: the collectives it issues (c10d::scatter_, "
            f"c10d::broadcast_) have no fake implementation in torch {torch.__version__}, so it cannot be traced. "
            f"Call distribute_tensor outside the compiled function and pass the DTensor in.",
            feature="distribute_tensor in compiled code", needs_torch="2.11",
        )
    if isinstance(tensor, TensorProxy) and tensor.requires_grad and not is_marked_leaf(tensor):
        raise RuntimeError("`distribute_tensor` should be used to distribute leaf tensors! but found non-leaf tensor!")
    return record_function_call(_distribute_leaf, "distribute_tensor", "torch.distributed.tensor.distribute_tensor",
                                tensor, *args, **kwargs)


def is_tensor_parallel_hook(fn) -> bool:
    """The input/output functions of ``torch.distributed.tensor.parallel`` styles (``ColwiseParallel._prepare_input_fn``,
    ``PrepareModuleInput._prepare_input_fn``, ``SequenceParallel._prepare_output_fn``, ...): functions of (inputs, mesh)
    that make, redistribute or unwrap DTensors, which ``parallelize_module`` installs as forward (pre-)hooks."""
    return (
        isinstance(fn, types.FunctionType)
        and fn.__module__ == "torch.distributed.tensor.parallel.style"
        and fn.__name__.startswith("_prepare_")
    )


def lookaside(fn, wrapped_args: tuple) -> Callable | None:
    """The interpreter lookaside recording ``fn`` as one container symbol when it is a DTensor entry point or a
    tensor-parallel hook function, else None."""
    try:
        entry = dtensor_entry_points().get(fn)
    except TypeError:  # unhashable callable
        return None
    if entry is not None:
        name, what = entry
    elif is_tensor_parallel_hook(fn):
        name, what = fn.__qualname__.replace(".", "_"), f"torch.distributed.tensor.parallel {fn.__qualname__}"
    else:
        return None
    from thunder.core.interpreter import interpreter_needs_wrap

    from thunder_subclass.guards import guard_lookaside_arguments, guard_native_call_arguments

    # the call runs natively on fakes: the device mesh and placements it is given (read from arguments, globals,
    # closures, attributes) are guarded by value, as for any native call (an equal mesh or placement reuses the
    # trace; another placement is a new trace, not the old one's result)
    guard_native_call_arguments(fn, wrapped_args)
    guard_lookaside_arguments(wrapped_args)
    if name == "distribute_tensor":
        return interpreter_needs_wrap(_record_distribute_tensor)
    return interpreter_needs_wrap(functools.partial(record_function_call, fn, name, what))
