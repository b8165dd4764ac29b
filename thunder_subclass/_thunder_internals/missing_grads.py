"""Operations thunder cannot differentiate: found while tracing, given a grad rule of the plugin's.

Hook map: reads ``transforms/autodiff.py``'s lookup of a bound symbol's gradient (``core/transforms.py``
``is_constant_for_vjp``: nothing to differentiate; an executor's grad transform,
``core/transforms.py`` ``_grad_fn_map``, ``augmented_forward_impls``, else the symbol's decomposition, failing at a
primitive with none: "Failed to find a gradient transform for bound symbol"), and writes ``_grad_fn_map`` (what
``thunder.core.transforms.register_grad`` writes) for the symbols :func:`register_grad_fallback` is given; removed by
:func:`remove_grad_fallbacks` (``install.uninstall``).

thunder 0.2.6 has no gradient for several primitives eager differentiates: ``flip``, ``lerp``, ``remainder``,
``trunc``, ``index_add``, ``nextafter``; a program that trains through one failed at its first call.
:func:`lacks_gradient` says whether a recorded bound symbol's decomposition reaches such a primitive, as thunder's
autodiff would find it. A registered fallback acts only for a plugin jit (:func:`~.plugin_state.is_plugin_active`);
for any other jit it raises thunder's own error, as if it were absent.
"""

from __future__ import annotations

from collections.abc import Callable

from thunder_subclass._thunder_internals.plugin_state import is_plugin_active

__all__ = ["lacks_gradient", "register_grad_fallback", "remove_grad_fallbacks"]

_registered: dict = {}  # symbol id -> the fallback written into thunder's _grad_fn_map


def _has_own_gradient(bsym, executors) -> bool:
    from thunder.core.transforms import _grad_fn_map, augmented_forward_impls, is_constant_for_vjp

    if is_constant_for_vjp(bsym):  # autodiff passes it through (integer or boolean results, comparisons, signbit)
        return True
    sid = bsym.sym.id
    if sid in _grad_fn_map or sid in augmented_forward_impls:
        return True
    for ex in executors:
        if ex.can_execute_or_fuse(bsym):
            return ex.get_grad_transform(bsym.sym) is not None
    return False


def lacks_gradient(bsym) -> bool:
    """``bsym`` (a torch-level call just recorded) has no gradient in thunder: neither it nor, recursively, every
    part of its decomposition has one of its own, down to a primitive without any."""
    from thunder.core.compile_data import get_compile_data

    cd = get_compile_data()
    executors = tuple(cd.executors_list) if cd is not None else ()
    pending = [bsym]
    while pending:
        b = pending.pop()
        if _has_own_gradient(b, executors):
            continue
        if b.sym.is_prim:
            return True
        pending.extend(b.subsymbols)
    return False


def register_grad_fallback(sym, grad_fn: Callable) -> None:
    """Give thunder's autodiff ``grad_fn`` (a grad transform: forward with ``prims.get_grad`` / ``put_grad``) for
    symbol ``sym``, once; for a jit that is not the plugin's it raises what thunder raised without it."""
    from thunder.core.transforms import _grad_fn_map

    if sym.id in _registered or sym.id in _grad_fn_map:
        return

    def fallback(*args, **kwargs):
        if not is_plugin_active():
            raise RuntimeError(f"Failed to find a gradient transform for {sym.name} (thunder 0.2.6 has none)")
        return grad_fn(*args, **kwargs)

    _grad_fn_map[sym.id] = fallback
    _registered[sym.id] = fallback


def remove_grad_fallbacks() -> None:
    """Take every registered fallback out of thunder's ``_grad_fn_map``."""
    from thunder.core.transforms import _grad_fn_map

    for sid, fallback in _registered.items():
        if _grad_fn_map.get(sid) is fallback:
            del _grad_fn_map[sid]
    _registered.clear()
