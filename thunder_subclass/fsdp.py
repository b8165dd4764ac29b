"""Stage 1 (entry) for FSDP2 models: ``thunder_subclass.jit(model)`` compiles the code between FSDP2's hooks.

In: a ``torch.nn.Module`` holding FSDP2 units (``torch.distributed.fsdp.fully_shard``: instances of ``FSDPModule``).
What happens: each FSDP2 unit's own code is compiled as a region between its hooks (below).
Out: an :class:`FSDPCompiledModule` that runs the model with FSDP2's hooks eager and the modules between them compiled.

Why at module boundaries: FSDP2's forward pre-hook all-gathers each unit's sharded DTensor parameters into unsharded
plain tensors and swaps them into the module (``FSDPParam.to_unsharded``); its post-forward hook reshards (frees the
unsharded storage with ``resize_(0)``); its backward hooks re-gather, register post-backward reduce-scatters and
queue autograd callbacks, on asynchronous ``Work`` objects and CUDA streams. None of that is a function of tensors that
a trace can hold, and the parameter swap happens after a trace's prologue would have read the parameters.
torch.compile does not trace it either: FSDP2's hooks are ``torch._dynamo.disable``'d, Dynamo breaks the graph around
them and compiles the code between them. thunder has no graph breaks, so the boundaries are modules:

* every *region* is compiled with ``thunder_subclass.jit``: a maximal submodule that has a ``forward`` of its own and
  no FSDP unit strictly inside it (a leaf FSDP unit, e.g. one transformer block, or a module of a non-leaf unit
  such as the root's embedding or output projection); ``Module.__call__`` and with it FSDP2's hooks stay eager
  around the region's compiled ``forward``;
* the compiled function reads the parameters through the module at each call (the prologue), so it sees what FSDP2
  put there: unsharded plain tensors, or with torchao's ``enable_fsdp_float8_all_gather=True`` the
  ``Float8TrainingTensor`` made by ``fsdp_post_all_gather``. (Not a ``ThunderModule``: its parameter overrides are a
  snapshot taken at jit time and would pin the sharded parameters.)
* gradients of the unsharded parameters leave thunder's autograd function and are accumulated by autograd into
  ``unsharded_param.grad``, where FSDP2's post-backward reduce-scatters them, as in eager;
* regions of the same class share one jitted function (the module is its first argument): N identical blocks are
  traced once (``share=False`` compiles each region separately);
* the code of non-region modules (the root's own ``forward`` body between unit calls) runs eagerly.

So the execution traces (``thunder.last_traces(compiled.compiled_modules["layers.0"])``) hold one region's forward and
backward on the unsharded parameters (plain aten/prims operations, or float8 casts and ``_scaled_mm`` for torchao
float8), and no collectives: FSDP2's all-gathers and reduce-scatters run in its hooks, outside the traces.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch

__all__ = ["FSDPCompiledModule", "holds_fsdp_units", "compiled_regions", "compile_between_fsdp_hooks"]


def _fsdp_module_type() -> type | None:
    if not torch.distributed.is_available():
        return None
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return None
    return FSDPModule


def holds_fsdp_units(model) -> bool:
    """Whether ``model`` is a module with an FSDP2 unit (``fully_shard``) in it or is one."""
    fsdp_module = _fsdp_module_type()
    return (
        fsdp_module is not None
        and isinstance(model, torch.nn.Module)
        and any(isinstance(m, fsdp_module) for m in model.modules())
    )


def _defines_forward(m: torch.nn.Module) -> bool:
    return type(m).forward is not torch.nn.Module.forward  # ModuleList / ModuleDict have none


def compiled_regions(model: torch.nn.Module, prefix: str = "") -> Iterator[tuple[str, torch.nn.Module]]:
    """(qualified name, module) of each region of ``model``: maximal submodules with a ``forward`` of their own and no
    FSDP unit strictly inside them."""
    fsdp_module = _fsdp_module_type()
    inner_unit = any(isinstance(m, fsdp_module) for m in model.modules() if m is not model)
    if not inner_unit and _defines_forward(model):
        yield prefix, model
        return
    for name, child in model.named_children():
        yield from compiled_regions(child, f"{prefix}.{name}" if prefix else name)


class FSDPCompiledModule(torch.nn.Module):
    """What ``thunder_subclass.jit`` returns for a model holding FSDP2 units: calling it calls the model with each
    region's ``forward`` replaced by its compiled function (for the duration of the call; the model itself is left as
    it was, and calling it directly runs it eagerly). Parameters, buffers and the state dict are the model's, under
    the same names. ``compiled_modules`` maps each region's qualified name to its jitted function, for
    ``thunder.last_traces``, ``thunder.cache_misses`` and the like.

    Example (2 processes, see ``examples/distributed_train.py``)::

        fully_shard(model.layers[0]); fully_shard(model.layers[1]); fully_shard(model)
        compiled = thunder_subclass.jit(model)
        loss = compiled(x).sum(); loss.backward()
        print(thunder.last_traces(compiled.compiled_modules["layers.0"])[-1])
    """

    def __init__(self, model: torch.nn.Module, forwards: dict[str, tuple[torch.nn.Module, Callable]],
                 compiled_modules: dict[str, Callable]):
        super().__init__()
        self._model = model
        self._forwards = forwards  # name -> (region, compiled forward taking the region's forward arguments)
        self.compiled_modules = compiled_modules

    @contextlib.contextmanager
    def _compiled_forwards(self):
        installed = []
        try:
            for module, forward in self._forwards.values():
                previous = module.__dict__.get("forward")
                module.__dict__["forward"] = forward  # Module._call_impl calls self.forward between the hooks
                installed.append((module, previous))
            yield
        finally:
            for module, previous in installed:
                if previous is None:
                    module.__dict__.pop("forward", None)
                else:
                    module.__dict__["forward"] = previous

    def forward(self, *args, **kwargs):
        with self._compiled_forwards():
            return self._model(*args, **kwargs)

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return self._model.named_parameters(prefix, recurse, remove_duplicate)

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return self._model.named_buffers(prefix, recurse, remove_duplicate)

    def state_dict(self, *args, **kwargs):
        return self._model.state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        return self._model.load_state_dict(*args, **kwargs)

    def __getattr__(self, name: str):
        if name in ("_model", "_forwards", "compiled_modules"):
            return super().__getattr__(name)
        return getattr(self._model, name)


def compile_between_fsdp_hooks(model: torch.nn.Module, jit: Callable[[Callable], Callable], *,
                               share: bool = True) -> FSDPCompiledModule:
    """``model`` with each region (see :func:`compiled_regions`) compiled by ``jit`` (``thunder_subclass.jit`` with
    the user's options), FSDP2's hooks eager; regions of one class share a jitted function unless ``share`` is
    False."""
    forwards: dict[str, tuple[torch.nn.Module, Callable]] = {}
    compiled: dict[str, Callable] = {}
    shared: dict[tuple[type, Callable], Callable] = {}
    for name, region in compiled_regions(model):
        forward = type(region).forward  # fully_shard's class FSDP<Cls> keeps <Cls>.forward
        if share:
            key = (type(region), forward)
            jfn = shared.get(key)
            if jfn is None:
                jfn = shared[key] = jit(forward)
            call = functools.partial(jfn, region)
        else:
            jfn = call = jit(functools.partial(forward, region))
        forwards[name] = (region, call)
        compiled[name] = jfn
    return FSDPCompiledModule(model, forwards, compiled)
