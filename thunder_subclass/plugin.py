"""Stage 1, entry points: ``thunder_subclass.jit`` and the ``"tensor-subclass"`` thunder plugin.

Both put the plugin's executor first in the jit's executor list and install the hooks (``thunder_subclass.hooks``,
idempotently). The executor's presence is what makes the hooks act for that jit and for no other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from thunder.core.recipe import Plugin, PluginPolicy

from thunder_subclass import cache, fsdp, hooks
from thunder_subclass.executor import subclass_executor
from thunder_subclass.prologue import FusedPrologueChecks
from thunder_subclass.tangents import SavedTensorNames
from thunder_subclass.torch_function import TypedTensorEdges

__all__ = ["jit", "TensorSubclassPlugin", "PLUGIN_NAME"]

PLUGIN_NAME = "tensor-subclass"

_DEFAULT = object()  # cache_size_limit not given: thunder_subclass.config.cache_size_limit


class TensorSubclassPlugin(Plugin):
    """thunder plugin that compiles models holding tensor wrapper subclasses.

    Example (CPU; thunder 0.2.6's default recipe needs nvFuser, so name a CPU fuser)::

        import thunder_subclass  # registers the plugin name
        import thunder
        from thunder.recipes import BaseRecipe
        cmodel = thunder.compile(model, recipe=BaseRecipe(fuser="torch.compile"), plugins="tensor-subclass")
    """

    policy = PluginPolicy.PRE

    def setup_executors(self):
        hooks.install()
        return [subclass_executor]

    def setup_transforms(self):
        return [TypedTensorEdges(), SavedTensorNames()]


def jit(fn: Callable, /, *, cache_size_limit: int | None | object = _DEFAULT, **kwargs) -> Callable:
    """``thunder.jit(fn, **kwargs)`` that can compile functions and modules holding tensor wrapper subclasses.

    A module holding FSDP2 units (``fully_shard``) is compiled between FSDP2's hooks: the result is a
    :class:`thunder_subclass.fsdp.FSDPCompiledModule` (see ``thunder_subclass.fsdp``); tensor-parallel modules and
    DTensor code are traced through like any other subclass code.

    Takes the same keyword arguments as ``thunder.jit``; ``executors`` (default: thunder's default executors) gets
    the plugin's executor put first, and ``transforms`` gets :class:`thunder_subclass.tangents.SavedTensorNames`
    appended (it lets ``.backward(grad)`` accept gradients of other kinds than the outputs', as eager does), and
    thunder's compile option ``thunderfx_disable_split_autograd`` defaults to True (faster per call; see the code).
    Per call it is thunder's jit with less overhead: the prologue's checks run as one generated function
    (``thunder_subclass.prologue``; tensor metadata through torch's C++ tensor guard), and cache hits take a shorter
    path (``_thunder_internals.with_fast_cache_hits``); the guards are the same.

    Sizes (``dynamic``, as ``torch.compile``'s): by default (``dynamic=None`` and no ``cache`` option) a call traces
    with the sizes it sees as constants, and after a cache miss caused only by new tensor sizes (or int values) the
    next trace makes them symbolic (thunder's ``cache="symbolic values"``; sizes that reach a subclass operation stay
    guarded), so new sizes stop retracing: ``_thunder_internals.AutomaticDynamicShapes``. ``dynamic=False`` traces once
    per size (``cache="constant values"``), ``dynamic=True`` makes sizes symbolic from the first trace. An explicit
    ``cache`` option is used as given.

    ``cache_size_limit`` (default ``thunder_subclass.config.cache_size_limit``, 8 like ``torch.compile``'s
    ``recompile_limit``; ``None``: unbounded) bounds the number of traces kept: once reached, a call that no trace
    accepts runs ``fn`` eagerly, after a one-time :class:`~thunder_subclass.errors.CacheLimitWarning` naming the check
    that failed; ``thunder_subclass.explain_recompiles(compiled)`` says why each miss missed (see
    ``thunder_subclass.cache``).

    Example::

        >>> import torch, thunder, thunder_subclass
        >>> from torch.testing._internal.two_tensor import TwoTensor
        >>> x = TwoTensor(torch.ones(2, 2), torch.zeros(2, 2))
        >>> y = thunder_subclass.jit(lambda t: t * 2 + 1)(x)
        >>> type(y).__name__, y.a.tolist(), y.b.tolist()
        ('TwoTensor', [[3.0, 3.0], [3.0, 3.0]], [[1.0, 1.0], [1.0, 1.0]])
    """
    import thunder
    from thunder.extend import resolve_executors

    dynamic = kwargs.pop("dynamic", None)
    if dynamic not in (None, True, False):
        raise TypeError(f"thunder_subclass.jit: dynamic must be None, True or False, got {dynamic!r}")
    if dynamic is not None and "cache" in kwargs:
        raise TypeError("thunder_subclass.jit: pass either dynamic or cache, not both (dynamic=True is "
                        "cache='symbolic values', dynamic=False is cache='constant values')")
    if dynamic is not None:
        kwargs["cache"] = "symbolic values" if dynamic else "constant values"
    automatic_dynamic = dynamic is None and "cache" not in kwargs
    if fsdp.holds_fsdp_units(fn):
        return fsdp.compile_between_fsdp_hooks(
            fn, lambda region_fn: jit(region_fn, cache_size_limit=cache_size_limit, **kwargs))
    limit = cache.config.cache_size_limit if cache_size_limit is _DEFAULT else cache_size_limit
    policy = cache.CachePolicy(limit, fn, getattr(fn, "__qualname__", None) or type(fn).__qualname__)
    hooks.install()
    executors: Sequence = resolve_executors(kwargs.pop("executors", None))
    executors = [subclass_executor, *(ex for ex in executors if ex is not subclass_executor)]
    # FusedPrologueChecks last: it fuses the checks the transforms before it leave (thunder_subclass.prologue)
    transforms = [*(kwargs.pop("transforms", None) or ()), TypedTensorEdges(), SavedTensorNames(), FusedPrologueChecks()]
    # thunder 0.2.6's "split autograd" side channel makes two meta-device torch.randn per call (about 0.17 ms on a
    # 2-core CPU, a fifth of a small model's training step); without it thunder connects its autograd.Function the
    # classic way. Pass thunderfx_disable_split_autograd=False to get thunder's default back.
    kwargs.setdefault("thunderfx_disable_split_autograd", True)
    return hooks.with_fast_cache_hits(thunder.jit(fn, executors=executors, transforms=transforms, **kwargs), policy,
                                      automatic_dynamic=automatic_dynamic)
