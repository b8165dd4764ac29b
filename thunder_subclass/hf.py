"""Stage 4 (interpretation), Hugging Face transformers: lookasides for the transformers functions thunder 0.2.6 cannot
trace.

In: a call of such a function in traced code. What happens: it is traced as the equivalent below. Out: the symbols of
that equivalent. Interpreter lookasides, consulted by ``thunder_subclass.hooks`` for every call a plugin jit traces.
Active only when the user's program has imported transformers (this module never imports it, and changes nothing in it):
the table below is built from ``sys.modules["transformers.masking_utils"]`` the first time a traced call finds it
loaded. The general interpreter fixes that Hugging Face models also need (``type.__call__``, iteration of user
Sequences, ``torch.cat`` of the empty cache initialiser, ``enable_gqa``, objects such as ``DynamicCache`` returned from
the traced code, attribute writes on the cache passed in, slice clamping) are hooks in
``thunder_subclass._thunder_internals``.

Mask expansion (transformers 4.53-4.57 ``masking_utils._vmap_for_bhqkv``, 5.x ``_vmap_expansion_sdpa`` when vmap is
used): an index-based mask function is expanded over (batch, head, query, key) by four nested ``torch.vmap`` calls,
which thunder's interpreter cannot trace (functorch's C++ transforms). It is traced as what transformers 5.x does by
default (``_non_vmap_expansion_sdpa``): the index vectors are reshaped to broadcast against each other, the mask
function is called once and the result is expanded to vmap's shape. ``TransformGetItemToIndex`` (a
TorchFunctionMode that turns ``tensor[scalar_tensor]`` into ``aten.index`` for vmap) becomes a null context: with
broadcast index tensors, ordinary advanced indexing does that.

thunder's ``HFTransformers`` recipe registers ``masking_utils.sdpa_mask_recent_torch`` as an opaque symbol that
promises a mask tensor even where the function returns None; plugin jits trace the function itself.

Tested with transformers 4.55, 4.57 and 5.x (Llama, Qwen2, Mistral).
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Callable
from typing import Any

from thunder_subclass._thunder_internals import interpret_call

__all__ = ["lookaside", "broadcast_expansion"]


def broadcast_expansion(mask_function: Callable, bh_indices: bool = True) -> Callable:
    """What ``torch.vmap``-nested expansion of an index-based ``mask_function`` over (b, h, q, kv) computes, by
    broadcasting: the result has vmap's shape ``[B, H, Q, KV]`` (``[Q, KV]`` when ``bh_indices`` is False)."""

    def expanded(batch_idx, head_idx, q_idx, kv_idx):
        if bh_indices:
            out = mask_function(
                batch_idx[:, None, None, None],
                head_idx[None, :, None, None],
                q_idx[None, None, :, None],
                kv_idx[None, None, None, :],
            )
            return out.expand(batch_idx.shape[0], head_idx.shape[0], q_idx.shape[0], kv_idx.shape[0])
        out = mask_function(batch_idx, head_idx, q_idx[:, None], kv_idx[None, :])
        return out.expand(q_idx.shape[0], kv_idx.shape[0])

    return expanded


def _sdpa_expansion(mask_function: Callable) -> Callable:
    return broadcast_expansion(mask_function, True)


def _same_function(fn: types.FunctionType) -> Callable:
    """A copy of ``fn`` (same code, globals, defaults, closure), so that lookasides keyed by ``fn`` do not apply."""
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__ = fn.__qualname__
    return copy


def _null_context(*args, **kwargs):
    return contextlib.nullcontext()


_tables: dict[int, dict] = {}  # id(transformers.masking_utils) -> {transformers function: replacement}


def _replacements() -> dict:
    masking_utils = sys.modules.get("transformers.masking_utils")
    if masking_utils is None:
        return {}
    table = _tables.get(id(masking_utils))
    if table is None:
        table = {}
        for name, replacement in (
            ("_vmap_for_bhqkv", broadcast_expansion),  # 4.53 .. 4.57
            ("_vmap_expansion_sdpa", _sdpa_expansion),  # 5.x, use_vmap=True
            ("TransformGetItemToIndex", _null_context),
        ):
            fn = getattr(masking_utils, name, None)
            if fn is not None:
                table[fn] = replacement
        # thunder's HFTransformers recipe (SDPAMaskTransform) makes sdpa_mask_recent_torch an opaque symbol whose
        # meta always promises a mask tensor while the function returns None when the mask can be skipped (no
        # padding: sdpa runs with is_causal): the trace then indexes None at run time. In plugin jits the function
        # is traced as written instead (its vmap expansion by the replacement above).
        fn = getattr(masking_utils, "sdpa_mask_recent_torch", None)
        if isinstance(fn, types.FunctionType):
            table[fn] = _same_function(fn)
        _tables[id(masking_utils)] = table
    return table


def lookaside(fn: Any, wrapped_args: tuple) -> Callable | None:
    """A lookaside tracing the replacement of a transformers function ``fn`` (see the module docstring), or None."""
    try:
        replacement = _replacements().get(fn)
    except TypeError:  # unhashable callable
        return None
    if replacement is None:
        return None

    def traced(*args, **kwargs):
        return interpret_call(replacement, *args, **kwargs)

    return traced
