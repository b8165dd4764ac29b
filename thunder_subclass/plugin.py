"""Stage 1 (entry), entry points: ``thunder_subclass.jit`` and the ``"tensor-subclass"`` thunder plugin.

In: the user's function or module and the jit's options. What happens: the options are checked and turned into
thunder's (executors, transforms, the cache option), and the per-call path is composed (stage 2,
``thunder_subclass.runtime.cache_policy``). Out: the compiled function or module.

Both put the plugin's executor first in the jit's executor list and install the hooks (``thunder_subclass.hooks``,
idempotently). The executor's presence is what makes the hooks act for that jit and for no other.
"""

from __future__ import annotations

import copy
import functools
import warnings
from collections.abc import Callable, Sequence

from thunder.core.recipe import Plugin, PluginPolicy
from thunder.core.transform_common import Transform

from thunder_subclass import _thunder_internals, fsdp, hooks
from thunder_subclass.runtime import cache, cache_policy, graph_breaks
from thunder_subclass.executor import subclass_executor
from thunder_subclass.guards.prologue import FusedPrologueChecks
from thunder_subclass.transforms.tangents import SavedTensorNames
from thunder_subclass.frontend.torch_function import TypedTensorEdges

__all__ = ["jit", "explain", "TensorSubclassPlugin", "PLUGIN_NAME"]

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
        return [TypedTensorEdges(), SavedTensorNames(), RecompilingCopies()]


def jit(fn: Callable, /, *, fullgraph: bool = False, cache_size_limit: int | None | object = _DEFAULT,
        **kwargs) -> Callable:
    """``thunder.jit(fn, **kwargs)`` that can compile functions and modules holding tensor wrapper subclasses.

    A module holding FSDP2 units (``fully_shard``) is compiled between FSDP2's hooks: the result is a
    :class:`thunder_subclass.fsdp.FSDPCompiledModule` (see ``thunder_subclass.fsdp``); tensor-parallel modules and
    DTensor code are traced through like any other subclass code.

    A program thunder cannot trace as one graph (data-dependent control flow or shapes: ``if tensor:``, ``.item()``
    branching, ``nonzero``, boolean masks; operations thunder has no symbol for) runs anyway, equal to eager: its
    own code eagerly, each submodule that traces compiled as a region (graph breaks, see
    ``thunder_subclass.runtime.graph_breaks``), with a one-time
    :class:`~thunder_subclass.runtime.graph_breaks.GraphBreakWarning` naming each break; ``compiled.graph_breaks`` and
    :func:`explain` list breaks and regions. ``fullgraph=True`` raises the first break's error instead.

    Takes the same keyword arguments as ``thunder.jit``; ``executors`` (default: thunder's default executors) gets
    the plugin's executor put first, and ``transforms`` gets
    :class:`thunder_subclass.transforms.tangents.SavedTensorNames` appended (it lets ``.backward(grad)`` accept
    gradients of other kinds than the outputs', as eager does), and thunder's compile option
    ``thunderfx_disable_split_autograd`` defaults to True (faster per call; see the code). Per call it is thunder's jit
    with less overhead: the prologue's checks run as one generated function (``thunder_subclass.guards.prologue``;
    tensor metadata through torch's C++ tensor guard), and cache hits take a shorter path
    (``thunder_subclass.runtime.cache_policy.compiled_call``); the guards are the same.

    Sizes (``dynamic``, as ``torch.compile``'s): by default (``dynamic=None`` and no ``cache`` option) a call traces
    with the sizes it sees as constants, and after a cache miss caused only by new tensor sizes (or int values) the
    next trace makes them symbolic (thunder's ``cache="symbolic values"``; sizes that reach a subclass operation stay
    guarded), so new sizes stop retracing: ``thunder_subclass.runtime.cache_policy.AutomaticDynamicShapes``.
    ``dynamic=False`` traces once per size (``cache="constant values"``), ``dynamic=True`` makes sizes symbolic from
    the first trace. An explicit ``cache`` option is used as given.

    ``disk_cache`` (default None: ``thunder_subclass.config.disk_cache``, on unless ``THUNDER_SUBCLASS_DISK_CACHE=0``)
    keeps the traces on disk too, so that a restarted process loads them instead of tracing
    (``thunder_subclass.runtime.disk_cache``); ``disk_cache=False`` turns that off for this function.

    ``cache_size_limit`` (default ``thunder_subclass.config.cache_size_limit``, 8 like ``torch.compile``'s
    ``recompile_limit``; ``None``: unbounded) bounds the number of traces kept: once reached, a call that no trace
    accepts runs ``fn`` eagerly, after a one-time :class:`~thunder_subclass.errors.CacheLimitWarning` naming the check
    that failed; ``thunder_subclass.explain_recompiles(compiled)`` says why each miss missed (see
    ``thunder_subclass.runtime.cache``).

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

    region_jit = None  # with graph breaks: how a region is compiled (the same options, dynamic included)
    if not fullgraph and not fsdp.holds_fsdp_units(fn):
        options = dict(kwargs, cache_size_limit=cache_size_limit)
        region_jit = lambda region_fn: jit(region_fn, fullgraph=True, **options)  # noqa: E731
    use_disk = kwargs.pop("disk_cache", None)
    if use_disk not in (None, True, False):
        raise TypeError(f"thunder_subclass.jit: disk_cache must be None, True or False, got {use_disk!r}")
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
            fn, lambda region_fn: jit(region_fn, fullgraph=True, cache_size_limit=cache_size_limit,
                                      disk_cache=use_disk, **kwargs))
    limit = cache.config.cache_size_limit if cache_size_limit is _DEFAULT else cache_size_limit
    policy = cache.CachePolicy(limit, fn, getattr(fn, "__qualname__", None) or type(fn).__qualname__)
    hooks.install()
    executors: Sequence = resolve_executors(kwargs.pop("executors", None))
    executors = [subclass_executor, *(ex for ex in executors if ex is not subclass_executor)]
    # FusedPrologueChecks last: it fuses the checks the transforms before it leave (thunder_subclass.guards.prologue)
    transforms = [*(kwargs.pop("transforms", None) or ()), TypedTensorEdges(), SavedTensorNames(), RecompilingCopies(),
                  FusedPrologueChecks()]
    # thunder 0.2.6's "split autograd" side channel makes two meta-device torch.randn per call (about 0.17 ms on a
    # 2-core CPU, a fifth of a small model's training step); without it thunder connects its autograd.Function the
    # classic way. Pass thunderfx_disable_split_autograd=False to get thunder's default back.
    kwargs.setdefault("thunderfx_disable_split_autograd", True)
    with warnings.catch_warnings():
        if dynamic:
            # thunder warns that its "symbolic values" cache option is "highly experimental": dynamic=True is the
            # plugin's supported option (its gaps are the plugin's to fix or document), not a development switch
            warnings.filterwarnings("ignore", message=r"The 'symbolic values' cache option is highly experimental")
        jfn = thunder.jit(fn, executors=executors, transforms=transforms, **kwargs)
    disk = None
    if cache.config.disk_cache if use_disk is None else use_disk:  # entries also kept on disk, for other processes (thunder_subclass.runtime.disk_cache)
        from thunder_subclass.runtime import disk_cache

        root = cache.config.disk_cache_dir or disk_cache.default_cache_dir()
        disk = disk_cache.DiskCache(root, cache.config.disk_cache_size_limit)
    return cache_policy.compiled_call(jfn, fn, policy, automatic_dynamic=automatic_dynamic, graph_break_jit=region_jit,
                                      disk_cache=disk)


class RecompilingCopies(Transform):
    """``copy.deepcopy`` of a compiled module gives a module compiled anew from a deep copy of the original module,
    with the same thunder options (executors, transforms, cache option, compile options), as ``thunder.jit`` made
    the original, and with graph breaks when the original has them (``thunder_subclass.jit`` without
    ``fullgraph=True``: its regions are compiled with the original's options): the copy has its own parameters, gradients, caches and statistics, and traces on its first call.
    (thunder 0.2.6 cannot deep-copy the compiled state itself: its traces hold symbols that pickle by executor name.)

    Applied as a thunder transform (``transform_module``: the ``ThunderModule`` becomes an instance of a subclass that
    defines ``__deepcopy__``), by ``thunder_subclass.jit`` and by the ``"tensor-subclass"`` plugin.

    Example::

        >>> import copy, torch, thunder_subclass
        >>> cm = thunder_subclass.jit(torch.nn.Linear(2, 2))
        >>> cm2 = copy.deepcopy(cm)
        >>> cm2.weight is cm.weight, torch.equal(cm2.weight, cm.weight)
        (False, True)
    """

    def transform_module(self, model) -> None:
        model.__class__ = _with_recompiling_deepcopy(type(model))


@functools.cache
def _with_recompiling_deepcopy(cls: type) -> type:
    if "__deepcopy__" in vars(cls):
        return cls
    return type(cls.__name__, (cls,), {"__deepcopy__": _deepcopy_compiled_module, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__})


def _deepcopy_compiled_module(self, memo: dict):
    """The ``__deepcopy__`` of a compiled module (:class:`RecompilingCopies`)."""
    import thunder
    from thunder.core.options import CACHE_OPTIONS

    cd = thunder.compile_data(self)
    record = _thunder_internals.jit_record(cd)
    # a copy starts as the original started: automatic dynamic shapes begin with constant values
    automatic_dynamic = record.fast_call and record.dynamic_shapes is not None
    cache_option = CACHE_OPTIONS.CONSTANT_VALUES if automatic_dynamic else cd.cache_option
    for ex in cd.executors_list:  # executors are registries shared by every jit, never copied
        memo[id(ex)] = ex
    model = copy.deepcopy(self._model, memo)
    transforms = copy.deepcopy(list(cd.transforms or ()), memo)  # a transform may refer to the module's parameters
    new = thunder.jit(
        model, langctx=cd.langctx, executors=cd.executors_list, sharp_edges=cd.sharp_edges, cache=cache_option,
        disable_torch_autograd=cd.disable_torch_autograd_support, transforms=transforms,
        debug_options=cd.debug_options, **cd.compile_options,
    )
    old_policy = record.policy
    if old_policy is not None:  # made by thunder_subclass.jit (cache_policy.compiled_call): the same bound for the copy
        policy = cache.CachePolicy(old_policy.limit, model, type(model).__qualname__)
        # made with graph breaks: so is the copy (its regions with the original's options)
        program = record.graph_break_program()
        new = cache_policy.compiled_call(new, model, policy, automatic_dynamic=automatic_dynamic,
                                         graph_break_jit=None if program is None else program.jit)
    memo[id(self)] = new
    return new


def explain(fn: Callable, /, *args, **kwargs) -> graph_breaks.GraphBreakReport:
    """Compile ``fn`` with :func:`jit` (or take a :func:`jit` result), call it once with ``args`` / ``kwargs``
    without the graph-break warning, and return its :class:`~thunder_subclass.runtime.graph_breaks.GraphBreakReport`:
    the breaks (the user's file:line, the reason, what ran eagerly) and the compiled regions (qualified name -> jitted
    function, for ``thunder.last_traces``). A new break compiles the children of the module that took it as regions
    in this call (a plain :func:`jit` call first runs that module's code eagerly, observing the submodule that holds
    the break); from the next call on, that submodule is an eager call inside its parents' compiled trace where it
    can be (docs/graph-breaks.md).

    Example::

        >>> import torch, thunder_subclass
        >>> def f(x):
        ...     return x[x > 0] * 2     # a shape that depends on the data
        >>> report = thunder_subclass.explain(f, torch.ones(3))
        >>> len(report.breaks), len(report.regions)
        (1, 0)
    """
    record = _thunder_internals.record_of(fn)
    compiled = fn if record is not None and record.graph_break_program() is not None else jit(fn)
    with graph_breaks.explaining(compiled):
        compiled(*args, **kwargs)
    return compiled.graph_breaks
