"""Interpreter fixes, constant keys: what traced code reads from dict key objects and set items is guarded.

Part of the interpreter fixes (:mod:`~thunder_subclass._thunder_internals.fixes` dispatches to each part's
``lookasides()`` table and installs its ``hook_targets()``); each acts only while a plugin jit traces
(:func:`~.plugin_state.is_plugin_active`) and names what it works around:

* ``core/interpreter.py`` ``populate_item_wrappers`` — thunder wraps a dict's keys as constants, so what traced code
  read from a key object (``for k in TABLE: x + k.n``) was inlined unchecked. The keys of a dict read from the inputs
  (and the items of a tuple key) are marked; values read from them are guarded through the key object
  (``thunder_state.constant_rooted_path``, ``Handlers.input_object``). ``iter()`` of an input set or frozenset
  (lookaside) iterates a constant tuple of its items, marked the same way (thunder iterated it natively);
  ``vars(obj)`` (lookaside) reads ``obj.__dict__`` through the interpreter (thunder called it natively);
  ``itertools`` functions that hand objects back or to a callback (``tee`` included), ``functools.cmp_to_key``
  and ``operator.attrgetter`` / ``itemgetter`` / ``methodcaller`` calls
  (lookasides) run Python versions through the interpreter; ``getattr`` with a computed name reads it as a constant.
* ``core/jit_ext.py`` ``unpack_inputs`` and ``_infer_name_postfix_from_provenance`` — values under object dict keys
  (a global dict keyed by objects, iterated) unpacked by the prologue, with valid names.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


from thunder_subclass._thunder_internals import plugin_state
from thunder_subclass._thunder_internals.plugin_state import is_plugin_active
from thunder_subclass._thunder_internals.symbolic_values import unpacked_parameters_tagged
from thunder_subclass._thunder_internals.thunder_state import (
    SetItems,
    constant_rooted_path,
    is_unpackable_provenance,
    mark_dict_key,
)


def _set_iter(wrapped_set):
    """``iter(s)`` of a set or frozenset read from the inputs: an iterator over a constant tuple of its items in
    CPython's order, marked so that what traced code reads from an item is guarded through it (thunder iterates a set
    natively: its items came back without provenance, and ``k.n`` of an item was inlined unchecked). The set's own
    guard checks its items and their order (``guards._guard_container_size``)."""
    from thunder.core.interpreter import _interpret_call, wrap_const

    items = wrap_const(tuple(wrapped_set.value))
    mark_dict_key(items.provenance, (SetItems(items.value), ()))
    return _interpret_call(tuple.__iter__, items)


@functools.cache
def _constant_key_proxy_class():
    from thunder.core.proxies import AnyProxy

    class ConstantKeyProxy(AnyProxy):
        """The prologue's name for an object used as a dict key (``TABLE[K1]``). thunder orders the prologue's
        unpacked values by their paths, the keys of subscripts included, and proxies refuse comparisons: these
        compare by creation order among themselves and after any other key."""

        _DEFAULT_PREFIX = "key"
        _made = 0

        def __init__(self, o, /, **kwargs):
            super().__init__(o, **kwargs)
            ConstantKeyProxy._made += 1
            self._order = ConstantKeyProxy._made

        def __eq__(self, other):
            return self is other

        __hash__ = AnyProxy.__hash__

        def __lt__(self, other):
            return isinstance(other, ConstantKeyProxy) and self._order < other._order

        def __gt__(self, other):
            return not isinstance(other, ConstantKeyProxy) or self._order > other._order

        def __le__(self, other):
            return self is other or self < other

        def __ge__(self, other):
            return self is other or self > other

        def replace(self, **changes):
            kwargs = dict(name=self.name, history=self.history, tags=self.tags)
            kwargs.update(changes)
            return ConstantKeyProxy(self._o, **kwargs)

    return ConstantKeyProxy


@functools.cache
def _constant_object_symbol():
    def meta(obj):
        return _constant_key_proxy_class()(obj)

    def impl(obj):
        return obj

    sym = plugin_state.handlers.executor.register_operator("python_constant_object", meta=meta, fn=impl)
    plugin_state.remember_symbol_origin(sym, impl, _constant_object_symbol)
    return sym


def _name_constant_keys(ctx, prologue_trace, inputs) -> None:
    """Each object other than an int or str used as a dict key on the path of a value the prologue unpacks
    (``TABLE[K1]``, K1 a module-level object: iterating ``TABLE`` reads its items that way) gets a proxy made from it
    at the top of the prologue (``python_constant_object``), set as the key's provenance record's proxy. thunder's
    ``unpack_inputs`` (``from_binary_subscr``) unpacks only int, str and proxy keys: "Exception occured unpacking
    object from ProvenanceRecord(...)" (plain thunder too)."""
    from thunder.core.interpreter import ProvenanceRecord, PseudoInst
    from thunder.core.proxies import Proxy
    from thunder.core.trace import tracectx

    seen: set[int] = set()
    made: dict[int, Any] = {}

    def visit(record):
        if not isinstance(record, ProvenanceRecord) or id(record) in seen:
            return
        seen.add(id(record))
        if record.inst is PseudoInst.BINARY_SUBSCR and len(record.inputs) == 2:
            key = record.inputs[1]
            if (isinstance(key, ProvenanceRecord) and key.inst is PseudoInst.CONSTANT
                    and not isinstance(key.value, (int, str, Proxy)) and getattr(key, "proxy", None) is None):
                proxy = made.get(id(key.value))
                if proxy is None:
                    with tracectx(prologue_trace):
                        proxy = made[id(key.value)] = _constant_key_proxy_class()(key.value)
                        prologue_trace.bound_symbols.append(_constant_object_symbol().bind(key.value, output=proxy))
                key.proxy = proxy
        for i in record.inputs:
            visit(i)

    for v in inputs:
        p = v if isinstance(v, Proxy) else getattr(v, "proxy", None)
        visit(getattr(p, "history", None))
    for _, *args in ctx._constraints:
        for a in args:
            if isinstance(a, Proxy):
                visit(a.history)


def _hook_name_postfix(original):
    # wraps thunder.core.jit_ext._infer_name_postfix_from_provenance, which names a tensor read from the inputs after
    # its path, with str() of each key: TABLE[K1] gave "t___globals___TABLE_<__main__.Key object at 0x...>", which
    # the prologue's Python cannot hold ("SyntaxError: invalid syntax"). For a plugin jit such a name is not used (the
    # tensor gets thunder's default name)
    @functools.wraps(original)
    def _infer_name_postfix_from_provenance(pr):
        postfix = original(pr)
        if postfix and is_plugin_active() and not f"t{postfix}".isidentifier():
            return ""
        return postfix

    return _infer_name_postfix_from_provenance


def _hook_unpack_inputs(original):
    # wraps thunder.core.jit_ext.unpack_inputs (the prologue's unpacking of every value read from the inputs): for a
    # plugin jit, object dict keys are named first (_name_constant_keys), and under symbolic values parameters are
    # tagged meanwhile (symbolic_values.unpacked_parameters_tagged)
    @functools.wraps(original)
    def unpack_inputs(ctx, prologue_trace, pro_to_comp_inps, pro_to_epi_inps, *args, **kwargs):
        if not is_plugin_active():
            return original(ctx, prologue_trace, pro_to_comp_inps, pro_to_epi_inps, *args, **kwargs)
        _name_constant_keys(ctx, prologue_trace, [*pro_to_comp_inps, *pro_to_epi_inps])
        pro_to_comp_inps, pro_to_epi_inps = _parents_first(pro_to_comp_inps), _parents_first(pro_to_epi_inps)
        with unpacked_parameters_tagged():
            return original(ctx, prologue_trace, pro_to_comp_inps, pro_to_epi_inps, *args, **kwargs)

    return unpack_inputs


def _parents_first(proxies) -> list:
    """``proxies`` (values the prologue unpacks) ordered by the depth of their provenance, shallowest first (stable).
    thunder's ``object.__setattr__`` lookaside sets the provenance's ``proxy`` of each object the traced code writes
    an attribute of; unpacking a written object below another written one (``self.config.rope_parameters = ...``
    after ``self.max_seq_len_cached = ...``: transformers' dynamic RoPE) then found the parent's proxy not unpacked
    yet ("KeyError" in ``from_load_attr``), when the child came first in thunder's order."""
    def depth(v) -> int:
        history = getattr(getattr(v, "proxy", v), "history", None)  # (thunder passes Variables of proxies)
        n, todo, seen = 0, [history], set()
        while todo:
            h = todo.pop()
            if h is None or id(h) in seen:
                continue
            seen.add(id(h))
            n += 1
            todo.extend(getattr(h, "inputs", ()))
        return n

    return sorted(proxies, key=depth)


def _hook_populate_item_wrappers(original):
    # wraps thunder.core.interpreter.populate_item_wrappers (a module global its containers' track_items calls): the
    # keys of a dict read from the inputs are wrapped as constants, so values traced code read from a key object
    # (``for k in TABLE: x + k.n``) were inlined unchecked: changing ``k.n`` reused the trace. For a plugin jit,
    # the record of each key that is not an int or str is marked; values read from it through attributes and items
    # are guarded through the key object (Handlers.input_object, thunder_state.constant_rooted_path)
    @functools.wraps(original)
    def populate_item_wrappers(obj):
        original(obj)
        if not is_plugin_active():
            return
        from thunder.core.interpreter import PseudoInst

        def constant_of(w, value) -> bool:
            return getattr(w.provenance, "inst", None) is PseudoInst.CONSTANT and w.provenance.value is value

        if type(obj.value) is dict and getattr(obj, "key_wrappers", None) and is_unpackable_provenance(obj.provenance):
            for k, wk in obj.key_wrappers.items():
                if type(k) not in (int, str) and constant_of(wk, k):
                    mark_dict_key(wk.provenance)
        elif type(obj.value) in (tuple, list) and obj.item_wrappers and constant_of(obj, obj.value):
            # the items of a tuple key (``for a, b in TABLE``): thunder wraps items of a constant as constants
            rooted = constant_rooted_path(obj.provenance, allow_empty=True)
            if rooted is not None:
                root, path = rooted
                for i, (v, wv) in enumerate(zip(obj.value, obj.item_wrappers)):
                    if wv is not None and type(v) not in (int, str) and constant_of(wv, v):
                        mark_dict_key(wv.provenance, (root, (*path, ("[]", i))))

    return populate_item_wrappers


def _iter_of_a_set(fn, wrapped_args: tuple, wrapped_kwargs: dict):
    if len(wrapped_args) == 1 and not wrapped_kwargs:
        s = wrapped_args[0]
        if type(getattr(s, "value", None)) in (set, frozenset) and is_unpackable_provenance(s.provenance):
            return _set_iter
    return None


def hook_targets() -> list[tuple[Any, str, Callable]]:
    import thunder.core.interpreter as interpreter
    import thunder.core.jit_ext as jit_ext

    return [
        (jit_ext, "unpack_inputs", _hook_unpack_inputs),
        (jit_ext, "_infer_name_postfix_from_provenance", _hook_name_postfix),
        (interpreter, "populate_item_wrappers", _hook_populate_item_wrappers),
    ]


def lookasides() -> dict:
    """function -> ``choose(fn, wrapped_args, wrapped_kwargs)``: its lookaside for this call, or None."""
    return {iter: _iter_of_a_set}
