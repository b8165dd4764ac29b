"""Interpreter fixes, torch calls: torch functions and arguments as torch takes them.

Part of the interpreter fixes (:mod:`~thunder_subclass._thunder_internals.fixes` dispatches to each part's
``lookasides()`` table and installs its ``hook_targets()``); each acts only while a plugin jit traces
(:func:`~.plugin_state.is_plugin_active`) and names what it works around:

* ``torch.cat`` / ``F.scaled_dot_product_attention`` / ``torch.tensor`` (lookasides) — ATen's rule skipping 1-D
  empty tensors in ``cat`` (thunder's ``prims.cat_meta``: IndexError on DynamicCache's ``torch.tensor([])``);
  ``enable_gqa``, which thunder's ``ltorch.scaled_dot_product_attention`` lacks; ``torch.tensor`` of a number proxy
  under ``cache="symbolic values"`` (thunder: "NameError: name 'n' is not defined"; Gemma's embedding scale).
* ``core/symbol.py`` ``Symbol.__call__`` (through the hook of :mod:`.tracing`) — a torch-level symbol's arguments as
  torch takes them (:func:`torch_arguments`): Python types as dtypes (``torch.tensor([-1], dtype=int)``,
  ``x.to(float)``), torch's keyword names (``F.linear(input=x, weight=w)``), ``F.nll_loss``'s default
  ``ignore_index``.
* ``clang/__init__.py`` ``_basic_indexing`` — slice bounds below ``-length`` are clamped as in Python / torch.
"""

from __future__ import annotations

import functools
import operator
import inspect
from collections.abc import Callable
from typing import Any

import torch

from thunder_subclass._thunder_internals.plugin_state import is_plugin_active
from thunder_subclass._thunder_internals.symbolic_values import pin_input_numbers
from thunder_subclass._thunder_internals.thunder_state import (
    is_interpreting,
    source_location,
    torch_callables_of_symbol,
)


def _is_legacy_empty(t) -> bool:
    from thunder.core.proxies import TensorProxy

    return isinstance(t, (TensorProxy, torch.Tensor)) and len(t.shape) == 1 and t.shape[0] == 0


def _cat(tensors, dim=0, *, out=None):
    """``torch.cat`` with ATen's legacy rule (``aten/src/ATen/native/TensorShape.cpp``): 1-D tensors of size 0 are
    skipped, so ``cat([torch.tensor([]), x], dim=-2)`` is ``x`` (transformers' DynamicCache starts from
    ``torch.tensor([])``). thunder's ``ltorch.cat`` canonicalizes ``dim`` against the first tensor
    (``prims.cat_meta``): IndexError."""
    import thunder.torch as ltorch

    if out is not None:
        raise NotImplementedError("torch.cat(..., out=) is not supported by thunder")
    tensors = list(tensors)
    kept = [t for t in tensors if not _is_legacy_empty(t)]
    if kept and len(kept) != len(tensors) and all(t.dtype == kept[0].dtype for t in tensors):
        tensors = kept
    return ltorch.cat(tensors, dim)


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """``F.scaled_dot_product_attention`` with torch >= 2.5's ``enable_gqa`` (key/value heads repeated to the query's
    head count), which thunder 0.2.6's ``ltorch.scaled_dot_product_attention`` lacks: "unexpected keyword argument
    'enable_gqa'" (transformers 5.x passes it whenever the mask is None)."""
    import thunder.torch as ltorch

    if enable_gqa and key.shape[-3] != query.shape[-3]:
        repeats = query.shape[-3] // key.shape[-3]
        key = ltorch.repeat_interleave(key, repeats, dim=-3)
        value = ltorch.repeat_interleave(value, repeats, dim=-3)
    return ltorch.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale=scale)


def _tensor(data, *, dtype=None, device=None, requires_grad=False, pin_memory=False):
    """``torch.tensor`` of a number proxy (``cache="symbolic values"``: ``torch.tensor(config.hidden_size ** 0.5)``,
    Gemma's embedding scale) as a 0-dim ``full`` of the dtype torch infers from the Python type (bool, int64, the
    default float dtype, its complex counterpart). thunder's ``ltorch.tensor`` accepts only numbers and sequences
    (``isinstance(x, (Number, Sequence))``) and its error message names an undefined variable: "NameError: name 'n'
    is not defined". Everything else goes to thunder's ``ltorch.tensor``."""
    import thunder.torch as ltorch
    from thunder.core.proxies import NumberProxy

    if isinstance(data, NumberProxy) and not requires_grad and not pin_memory:
        if dtype is None:
            python_type = data.python_type
            default = torch.get_default_dtype()
            dtype = {bool: torch.bool, int: torch.int64, float: default}.get(python_type)
            if dtype is None:  # complex
                dtype = {torch.float64: torch.complex128, torch.float16: torch.complex32}.get(default, torch.complex64)
        return ltorch.full((), data, device=device, dtype=dtype)
    return ltorch.tensor(data, dtype=dtype, device=device, requires_grad=requires_grad, pin_memory=pin_memory)


def _traced_symbol_lookaside(fn):
    from thunder.core.interpreter import interpreter_needs_wrap
    from thunder.core.jit_ext import recursively_proxy

    def lookaside(*args, **kwargs):
        recursively_proxy(*args, **kwargs)
        return interpreter_needs_wrap(fn)(*args, **kwargs)

    return lookaside


@functools.cache
def _fixed_torch_functions() -> dict:
    cat = _traced_symbol_lookaside(_cat)
    return {
        torch.cat: cat,
        torch.concat: cat,
        torch.concatenate: cat,
        torch.nn.functional.scaled_dot_product_attention: _traced_symbol_lookaside(_sdpa),
        torch.tensor: _traced_symbol_lookaside(_tensor),
    }


def _data_dependent_number(fn, v):
    """``bool(n)`` (an ``if`` on it), ``int(n)``, ``float(n)`` of a number thunder does not know while tracing: one
    computed from tensor data (``x.sum().item() > 0``; thunder 0.2.6's ``prims.item`` gives a number proxy without
    value). thunder's bool lookaside took such a number as false and baked that branch into the trace: a silently
    wrong result for inputs that take the other branch (plain ``thunder.jit`` too). Raised as thunder's own error for a
    tensor in a branch, so that ``thunder_subclass.jit`` runs the code eagerly (a graph break) and
    ``fullgraph=True`` reports it."""
    raise NotImplementedError(
        f"converting {v.name}, a number computed from tensor data (e.g. by .item()), to a Python "
        f"{fn.__name__} is not supported (data dependency)"
    )


# torch's Python argument parser takes Python types where it takes a dtype (torch/csrc/utils/python_arg_parser.cpp)
_PYTHON_TYPE_DTYPES = {int: torch.int64, float: torch.float64, bool: torch.bool, complex: torch.complex128}
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _as_dtype(v):
    return _PYTHON_TYPE_DTYPES.get(v, v) if type(v) is type else v


_meta_parameters: dict = {}  # a symbol's meta -> (its keyword names, whether it takes **kwargs, its signature)


def _meta_keywords(sym) -> tuple[frozenset, bool, Any]:
    meta = sym.meta
    found = _meta_parameters.get(meta)
    if found is None:
        try:
            sig = inspect.signature(meta)
        except (TypeError, ValueError):
            found = (frozenset(), True, None)
        else:
            params = sig.parameters.values()
            found = (frozenset(p.name for p in params if p.kind is not inspect.Parameter.POSITIONAL_ONLY),
                     any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params), sig)
        _meta_parameters[meta] = found
    return found


@functools.cache
def _torch_signatures() -> dict:
    # torch's own parameter names of every overridable torch function (its C functions have no inspectable
    # signature): the test lambdas of torch.overrides, e.g. F.linear -> lambda input, weight, bias=None: -1
    return torch.overrides.get_testing_overrides()


def _torch_keywords_as_positions(sym, args: tuple, kwargs: dict, meta_sig) -> tuple[tuple, dict]:
    for fn in torch_callables_of_symbol(sym):
        signature_of = _torch_signatures().get(fn)
        if signature_of is None:
            continue
        try:
            tsig = inspect.signature(signature_of)
            # (the lambdas leave some keyword-only parameters out, torch.add's alpha: those stay keywords)
            bound = tsig.bind(*args, **{k: v for k, v in kwargs.items() if k in tsig.parameters})
        except (TypeError, ValueError):
            continue
        rest = {k: v for k, v in kwargs.items() if k not in tsig.parameters}
        params = list(tsig.parameters.values())
        positional = [p for p in params if p.kind in _POSITIONAL]
        given = [i for i, p in enumerate(positional) if p.name in bound.arguments]
        new_args = [bound.arguments.get(p.name, p.default) for p in positional[: given[-1] + 1]] if given else []
        new_kwargs = dict(rest)
        for p in params:
            if p.name not in bound.arguments:
                continue
            if p.kind is inspect.Parameter.VAR_POSITIONAL:
                new_args.extend(bound.arguments[p.name])
            elif p.kind is inspect.Parameter.KEYWORD_ONLY:
                new_kwargs[p.name] = bound.arguments[p.name]
            elif p.kind is inspect.Parameter.VAR_KEYWORD:
                new_kwargs.update(bound.arguments[p.name])
        try:
            meta_sig.bind(*new_args, **new_kwargs)
        except TypeError:
            continue
        return tuple(new_args), new_kwargs
    return args, kwargs


def torch_arguments(sym, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The arguments of a call of torch-level symbol ``sym`` (from a torch function, method or operator in traced
    code) as thunder's symbol takes them, where torch takes more than thunder 0.2.6 does:

    * a Python type where a dtype goes (``torch.tensor([-1], dtype=int)``, ``x.to(float)``, ``torch.zeros(n,
      dtype=bool)``: int64, float64, bool, complex128 as torch's argument parser maps them; thunder: "ValueError:
      <class 'int'> had an unexpected type <class 'type'>"; transformers' ``StaticSlidingWindowLayer.update``);
    * torch's keyword names for arguments thunder names otherwise (``F.linear(input=x, weight=w, bias=b)``: thunder's
      ``ltorch.linear(a, w, bias)`` raised "unexpected keyword argument 'weight'"): bound to torch's signature (the
      ``torch.overrides`` test lambdas name every overridable function's parameters) and passed by position.

    * torch's factory keywords at the values that change nothing (``torch.ones(2, requires_grad=False)``,
      ``pin_memory=False``, ``layout=torch.strided``), which some of thunder's factories lack ("ones() got an
      unexpected keyword argument 'requires_grad'"): left out. ``requires_grad=True`` on a factory makes a new leaf
      that collects a gradient, which a trace cannot: ``UnsupportedTracingError`` naming the line (thunder 0.2.6
      raised a TypeError or a bare NotImplementedError).

    * ``F.nll_loss`` without ``ignore_index``: eager's default, -100 (thunder's ``ltorch.nll_loss`` defaults to None,
      which its forward reads as -1, its backward compares the target with — "ValueError: None had an unexpected
      type" whenever the loss is differentiated — and its torch executor passes to torch: "nll_loss_nd(): argument
      'ignore_index' must be int, not NoneType" with a ``weight``).

    Anything else is returned unchanged."""
    if sym.id == "torch.nn.functional.nll_loss" and len(args) < 4 and kwargs.get("ignore_index") is None:
        kwargs = {**kwargs, "ignore_index": -100}
    if kwargs:
        names, var_keyword, meta_sig = _meta_keywords(sym)
        if "requires_grad" in kwargs or "pin_memory" in kwargs or "layout" in kwargs:
            kwargs = _factory_keywords(sym, kwargs, names, var_keyword)
        if not var_keyword and not names.issuperset(kwargs):
            args, kwargs = _torch_keywords_as_positions(sym, args, kwargs, meta_sig)
        for v in kwargs.values():
            if type(v) is type:
                kwargs = {k: _as_dtype(v) for k, v in kwargs.items()}
                break
    for a in args:
        if type(a) is type:
            return tuple(_as_dtype(a) for a in args), kwargs
    return args, kwargs


# torch's tensor-factory keywords and the value at which each changes nothing about the tensor made
_INERT_FACTORY_KEYWORDS = (("requires_grad", False), ("pin_memory", False), ("layout", torch.strided))


def _factory_keywords(sym, kwargs: dict, names: frozenset, var_keyword: bool) -> dict:
    requires_grad = kwargs.get("requires_grad", False)
    if type(requires_grad) is bool and requires_grad and sym.name != "requires_grad_":
        from thunder_subclass.errors import UnsupportedTracingError, format_location

        raise UnsupportedTracingError(
            f"{sym.name}(..., requires_grad=True) at {format_location(*source_location())} makes a new leaf "
            "tensor that collects a gradient inside the compiled function, which a thunder trace cannot hold (its "
            "gradient would be lost). Make the tensor outside the compiled function (an argument, or an nn.Parameter "
            "of the module) and pass it in; inside, requires_grad=False (the default) works as in eager."
        )
    dropped = {k for k, inert in _INERT_FACTORY_KEYWORDS
               if k in kwargs and (var_keyword or k not in names) and _is_inert(kwargs[k], inert)}
    return {k: v for k, v in kwargs.items() if k not in dropped} if dropped else kwargs


def _is_inert(value, inert) -> bool:
    if type(inert) is bool:
        return type(value) is bool and value is inert
    return value is inert


def _clamp_bound(b, length):
    from thunder.core.proxies import NumberProxy

    value = b.value if isinstance(b, NumberProxy) else b
    length_value = length.value if isinstance(length, NumberProxy) else length
    if not isinstance(value, int) or isinstance(value, bool) or not isinstance(length_value, int):
        return b
    if value >= -length_value:
        return b
    for p in (b, length):  # under symbolic values the clamping holds for these numbers only
        if isinstance(p, NumberProxy) and is_interpreting():
            pin_input_numbers(p)
    return -length_value


def _hook_basic_indexing(original):
    # wraps thunder.clang._basic_indexing, which rejects slice bounds below -length ("start=-4095 is not a valid
    # index for length 16") where Python and torch clamp them (x[-4095:] of a length-16 dim is all of it;
    # transformers' sliding-window cache layers slice `[:, :, -self.sliding_window + 1:, :]`)
    @functools.wraps(original)
    def _basic_indexing(a, /, key):
        if not is_plugin_active():
            return original(a, key)
        new_key, dim = [], 0
        for x in key:  # a list, ellipses resolved; None entries add a dimension and index none of a's
            if isinstance(x, slice) and dim < len(a.shape):
                x = slice(_clamp_bound(x.start, a.shape[dim]), _clamp_bound(x.stop, a.shape[dim]), x.step)
            new_key.append(x)
            dim += x is not None
        return original(a, new_key)

    return _basic_indexing


def _number_conversion(fn, wrapped_args: tuple, wrapped_kwargs: dict):
    if len(wrapped_args) != 1:
        return None
    from thunder.core.interpreter import interpreter_needs_wrap, unwrap
    from thunder.core.proxies import NumberProxy

    v = unwrap(wrapped_args[0])
    if isinstance(v, NumberProxy) and v.value is None:
        return interpreter_needs_wrap(functools.partial(_data_dependent_number, fn))
    return None


def _fixed_torch_function(fn, wrapped_args: tuple, wrapped_kwargs: dict):
    return _fixed_torch_functions()[fn]


def hook_targets() -> list[tuple[Any, str, Callable]]:
    import thunder.clang as clang

    return [(clang, "_basic_indexing", _hook_basic_indexing)]


def lookasides() -> dict:
    """function -> ``choose(fn, wrapped_args, wrapped_kwargs)``: its lookaside for this call, or None."""
    return {**{fn: _number_conversion for fn in (bool, int, float, operator.index)},
            **{fn: _fixed_torch_function for fn in _fixed_torch_functions()}}
