"""Installing and removing every hook: :func:`install` (idempotent), :func:`uninstall`, :func:`is_installed`.

Called through ``thunder_subclass.hooks`` by ``thunder_subclass.jit`` and by the plugin when a model is compiled,
never at import time. Each hook module lists its own targets (``hook_targets``: owner, attribute, hook maker, next to
the hook and the thunder path it wraps); :func:`install` saves thunder's originals (an inherited attribute is
shadowed, and deleted again by :func:`uninstall`) and registers the plugin's symbols with thunder's torch_compile
executor (:mod:`.executors`). Compiled functions keep working after :func:`uninstall`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from thunder_subclass._thunder_internals import (
    autograd_hooks,
    dtensor_masks,
    interpreter_speed,
    module_dispatch,
    plugin_state,
    runtime,
    symbolic_values,
    tracing,
    transform_speed,
    fixes as interpreter_fixes,
)
from thunder_subclass._thunder_internals.fixes import dicts as interpreter_dicts
from thunder_subclass._thunder_internals.executors import (
    register_torch_compile_fusible,
    unregister_torch_compile_fusible,
)
from thunder_subclass._thunder_internals.missing_grads import remove_grad_fallbacks
from thunder_subclass._thunder_internals.plugin_state import Handlers
from thunder_subclass._thunder_internals.versions import ensure_thunder_importable


def _targets() -> list[tuple[Any, str, Callable]]:
    """Every hook as (owner, attribute, hook maker), in the order they are installed: each module below lists its own
    (``hook_targets``), next to the hooks and the thunder paths they wrap."""
    return [
        *tracing.hook_targets(),
        *runtime.hook_targets(),
        *autograd_hooks.hook_targets(),
        *interpreter_fixes.hook_targets(),
        *interpreter_dicts.hook_targets(),
        *interpreter_speed.hook_targets(),
        *symbolic_values.hook_targets(),
        *dtensor_masks.hook_targets(),
        *transform_speed.hook_targets(),
        *module_dispatch.hook_targets(),
    ]


_originals: dict[tuple[int, str], tuple[Any, str, Any]] = {}


_INHERITED = object()  # the hooked attribute was inherited, not in the owner's __dict__


def is_installed() -> bool:
    return bool(_originals)


def install(handlers: Handlers) -> None:
    """Install every hook (idempotent), acting through ``handlers``. Called through ``thunder_subclass.hooks``
    (by ``thunder_subclass.jit`` and the plugin), never at import."""
    ensure_thunder_importable()
    plugin_state.handlers = handlers
    if _originals:
        return
    for owner, name, make_hook in _targets():
        if type(owner) is dict:  # an entry of one of the interpreter's tables (opcode handlers, lookasides)
            original = owner[name]
            _originals[(id(owner), name)] = (owner, name, original)
            hook = make_hook(original)
            setattr(hook, plugin_state.HOOK_MARK, True)
            owner[name] = hook
            continue
        if name == "__code__":  # a function's code swapped in place: every module that bound the function by name
            original = owner.__code__
            _originals[(id(owner), name)] = (owner, name, original)
            owner.__code__ = make_hook(original)
            continue
        # an inherited attribute (StringProxy's comparisons come from Proxy) is shadowed, and deleted by uninstall
        original = owner.__dict__.get(name, _INHERITED)
        _originals[(id(owner), name)] = (owner, name, original)
        hook = make_hook(getattr(owner, name) if original is _INHERITED else original)
        setattr(hook, plugin_state.HOOK_MARK, True)
        setattr(owner, name, hook)
    plugin_state.hooks_installed = True
    register_torch_compile_fusible()


def uninstall() -> None:
    """Remove every hook, restoring thunder's own functions. Compiled functions keep working; new
    subclass compilations need :func:`install` again (``thunder_subclass.jit`` does it)."""
    for owner, name, original in _originals.values():
        if type(owner) is dict:
            owner[name] = original
        elif name == "__code__":
            owner.__code__ = original
        elif original is _INHERITED:
            delattr(owner, name)
        else:
            setattr(owner, name, original)
    _originals.clear()
    transform_speed.unhook_tree_flatten()
    plugin_state.hooks_installed = False
    unregister_torch_compile_fusible()
    remove_grad_fallbacks()
