"""thunder_subclass: compile models holding PyTorch tensor wrapper subclasses with lightning-thunder.

Import ``thunder_subclass`` before (or instead of) ``thunder``: under torch 2.13-2.15, thunder 0.2.6 only imports after
the compatibility shims in ``thunder_subclass._thunder_internals`` has run.

Pipeline (module per stage): ``plugin`` (entry, with ``cache``: the cache bound and miss reasons) -> ``guards`` (input proxies, prologue) -> ``interpretation``
(unroll ``__torch_dispatch__`` on fakes, with ``recording``) -> ``aten_symbols`` -> ``autograd`` / ``rules`` ->
``flatten`` (before executors) -> ``tangents`` (incoming gradients); ``inductor_executor`` (optional fusion executor:
regions compiled by inductor without dynamo). Below them: ``proxy``, ``fake``,
``subclass_symbols``, ``executor``; at the bottom ``_thunder_internals`` (every access to thunder internals);
``hooks`` wires the stages into thunder's hooks.
"""

from thunder_subclass._thunder_internals import ensure_thunder_importable as _ensure_thunder_importable

_ensure_thunder_importable()

from thunder_subclass.errors import (  # noqa: E402
    HigherOrderGradientError,
    UnsupportedBackwardEffectError,
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
from thunder_subclass.runtime.graph_breaks import GraphBreak, GraphBreakReport, GraphBreakWarning  # noqa: E402
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
