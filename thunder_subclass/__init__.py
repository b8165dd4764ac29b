"""thunder_subclass: compile models holding PyTorch tensor wrapper subclasses with lightning-thunder.

Import ``thunder_subclass`` before (or instead of) ``thunder``: under torch 2.13-2.15, thunder 0.2.6 only imports after
the compatibility shims in ``thunder_subclass._thunder_internals`` has run.

Pipeline, in the order a call meets it (one numbering with ``docs/how-it-works.md``; each stage module's docstring
opens with its stage, then In / What happens / Out):

1. entry: ``plugin`` (``jit``, the ``"tensor-subclass"`` plugin), ``fsdp`` (FSDP2 models, compiled between their
   hooks); ``hooks`` wires stages 3-7 into thunder's hooks.
2. per call, ``runtime/``: ``cache_policy`` composes the wrappers a call runs through (graph breaks, the remembered
   call, the fast hit, automatic dynamic shapes, the cache bound and miss reasons of ``cache``); ``disk_cache`` (with
   ``disk_trust``); programs thunder cannot trace whole: ``graph_breaks`` (regions at module boundaries),
   ``eager_calls`` (a submodule called eagerly inside a region, with ``eager_call_state`` and ``unreached_grads``),
   ``speculation`` (data-dependent branches computed while tracing and guarded).
3. inputs and guards, ``guards/``: an input becomes a proxy (``frontend.proxy``) with prologue guards, one
   protocol (``guards.protocol``), guards on Python state (``guards.state``); a cache entry's checks run as one
   generated function (``guards.prologue``), value checks once per write (``guards.watched``), the module reads
   once per write (``guards.unpack_cache``), an input's layout (``guards.layouts``); the caller's containers given
   their contents back (``guards.write_backs``, ``guards.container_writes``).
4. interpretation, ``frontend/``: torch operations on subclass proxies unrolled through ``__torch_dispatch__``
   (``interpretation``) on fakes (``fake``), recorded (``recording``) as aten-level symbols (``aten_symbols``) between
   ``flatten_<Cls>`` / ``unflatten_<Cls>`` (``subclass_symbols``); ``torch_function``, ``module_calls``,
   ``native_effects``, ``checkpoints``, ``grad_modes``, ``aliased_writes`` (writes into views with gradients: a graph
   break), ``symbolic_strides`` (``x.stride()`` under symbolic sizes), ``jagged`` (a jagged NestedTensor's symbolic
   sizes); ``distributed`` and ``hf`` (top level) for DTensor and transformers.
5. autograd, ``transforms/``: ``autograd`` (grad rules, ``rules`` for registered ones), ``backward_effects``,
   ``higher_order``, ``random_ops``, ``overwrites``, ``nll_loss``, ``fallback_grads``.
6. flatten and executors: ``transforms.flatten`` (subclasses leave the program; executor implementations of
   ``rules`` claim operations; ``redundant`` drops detaches and repeated backward operations, ``int8_linear`` claims
   int8 weight-only linears for one aten kernel), then thunder's executors, or ``inductor_executor``, and thunder's
   forward/backward split.
7. incoming gradients: ``transforms.tangents``.

Beside the pipeline: ``executor`` (the plugin's operator executor, home of its symbols), ``errors``, ``rules`` (the
extension points), ``check`` (``check_subclass``), ``demo``, ``examples``. At the bottom: ``_thunder_internals``
(every access to thunder and torch internals), importing no stage.
"""

from thunder_subclass._thunder_internals import ensure_thunder_importable as _ensure_thunder_importable

_ensure_thunder_importable()

from thunder_subclass.errors import (  # noqa: E402
    HigherOrderGradientError,
    UnsupportedBackwardEffectError,
    UnsupportedAliasedWriteError,
    UnsupportedCheckpointError,
    SubclassGradientError,
    SubclassGradRuleError,
    SubclassDispatchError,
    SubclassProtocolError,
    SubclassRegistrationError,
    TensorSubclassError,
    ThunderVersionError,
    TorchFeatureUnavailableError,
    TraceSelfCheckError,
    UnsupportedSubclassOperationError,
    CacheLimitWarning,
    DiskCacheWarning,
    SubclassContractError,
)
from thunder_subclass.plugin import PLUGIN_NAME, TensorSubclassPlugin, explain, jit  # noqa: E402
from thunder_subclass.runtime.graph_breaks import (  # noqa: E402
    GraphBreak,
    GraphBreakReport,
    GraphBreakWarning,
    explaining,
)
from thunder_subclass.runtime.cache import config, explain_recompiles, last_miss_reasons  # noqa: E402
from thunder_subclass.runtime.disk_cache import disk_cache_stats, reset_disk_cache_stats  # noqa: E402
from thunder_subclass.frontend.proxy import SubclassTensorProxy  # noqa: E402
from thunder_subclass.rules import RuleHandle, make_subclass, register_grad_rule, register_implementation  # noqa: E402
from thunder_subclass.frontend.aten_symbols import register_aten_symbol  # noqa: E402
from thunder_subclass.hooks import install as install_hooks, uninstall as uninstall_hooks  # noqa: E402
from thunder_subclass.inductor_executor import inductor_ex  # noqa: E402
from thunder_subclass.check import SubclassReport, check_subclass  # noqa: E402


def _register_plugin_name() -> None:
    import thunder.plugins

    thunder.plugins.register_plugin(PLUGIN_NAME, TensorSubclassPlugin)


_register_plugin_name()

__version__ = "0.1.0"

__all__ = [
    "jit",
    "explain",
    "explaining",
    "GraphBreak",
    "GraphBreakReport",
    "GraphBreakWarning",
    "config",
    "explain_recompiles",
    "last_miss_reasons",
    "CacheLimitWarning",
    "DiskCacheWarning",
    "disk_cache_stats",
    "reset_disk_cache_stats",
    "inductor_ex",
    "TensorSubclassPlugin",
    "PLUGIN_NAME",
    "SubclassTensorProxy",
    "TensorSubclassError",
    "SubclassProtocolError",
    "SubclassDispatchError",
    "UnsupportedSubclassOperationError",
    "HigherOrderGradientError",
    "UnsupportedBackwardEffectError",
    "UnsupportedAliasedWriteError",
    "UnsupportedCheckpointError",
    "SubclassGradientError",
    "SubclassGradRuleError",
    "SubclassRegistrationError",
    "SubclassContractError",
    "check_subclass",
    "SubclassReport",
    "register_grad_rule",
    "register_implementation",
    "make_subclass",
    "register_aten_symbol",
    "RuleHandle",
    "ThunderVersionError",
    "TorchFeatureUnavailableError",
    "TraceSelfCheckError",
    "install_hooks",
    "uninstall_hooks",
]
