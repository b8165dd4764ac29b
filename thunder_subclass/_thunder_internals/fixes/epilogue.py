"""Interpreter fixes, the epilogue: what traced code wrote to objects it did not make reaches the caller.

Part of the interpreter fixes (:mod:`~thunder_subclass._thunder_internals.fixes` dispatches to each part's
``lookasides()`` table and installs its ``hook_targets()``); each acts only while a plugin jit traces
(:func:`~.plugin_state.is_plugin_active`) and names what it works around:

* ``core/jit_ext.py`` ``process_recorded_modifications`` — attribute writes of dtypes, devices and strings on input
  objects (its assertion admits Proxy, int, float, tuple, None, Device); attribute writes on an object the prologue
  has no proxy for, above all the compiled module itself (``self.hidden = h.detach()``, ``self.steps += 1``: thunder
  skipped them without a word), become epilogue writes on the object fetched by its provenance (a jitted module's
  ``ThunderModule._model``); also calls ``Handlers.end_of_trace``
  (thunder records item writes only for modules' member dicts: the plugin writes back the input lists and dicts
  the traced code changed) and appends the plugin's epilogue calls (``thunder_state.call_in_epilogue``: in-place
  view ops replayed on the caller's object, input containers' new contents).
* ``core/jit_ext.py`` ``build_value_from_wrapped`` — a Python object made in the traced code and returned
  (``DynamicCache``) is rebuilt by the epilogue from its class and ``__dict__`` ("unhandled value of type"); a named
  tuple of ``torch.return_types`` (``x.topk(2)``) is rebuilt from its items (thunder wrote a call with keywords).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from thunder_subclass._thunder_internals import plugin_state
from thunder_subclass._thunder_internals.plugin_state import is_plugin_active
from thunder_subclass._thunder_internals.thunder_state import (
    STATE_KEY,
    call_in_epilogue,
    is_unpackable_provenance,
)
from thunder_subclass._thunder_internals.torch_state import RaggedSymbolicSize, is_nested_int


class _ConstantAttributeValueMeta(type):
    def __instancecheck__(cls, obj):
        return _epilogue_attribute_value(obj)


class _ConstantAttributeValue(metaclass=_ConstantAttributeValueMeta):
    """What ``isinstance(v, NoneType)`` admits inside ``process_recorded_modifications`` for a plugin jit."""


def _hook_process_recorded_modifications(original):
    # wraps thunder.core.jit_ext.process_recorded_modifications, which asserts that a value the traced code writes to
    # an attribute of an input object (the epilogue's pack_attr) is a Proxy, int, float, tuple, None or thunder Device
    # (the tuple is built from jit_ext's module globals when it runs). transformers' DynamicLayer writes
    # `self.dtype = key_states.dtype` on a cache layer generate() passes in: "trying to set .dtype ... to object of
    # type dtype"; transformers 5.x's dynamic RoPE sets `config.rope_parameters = {...}`. For a plugin jit,
    # jit_ext.NoneType admits what the epilogue can hold (_epilogue_attribute_value: printable constants, and tuples,
    # lists and dicts of them and of proxies) while it runs.
    @functools.wraps(original)
    def process_recorded_modifications(ctx, epilogue_trace):
        import thunder.core.jit_ext as jit_ext

        if not is_plugin_active():
            return original(ctx, epilogue_trace)
        unwritten = _attribute_writes_thunder_drops(ctx)
        buffers = _take_buffer_writes(ctx)
        saved = jit_ext.NoneType
        jit_ext.NoneType = _ConstantAttributeValue
        try:
            original(ctx, epilogue_trace)
        finally:
            jit_ext.NoneType = saved
        plugin_state.handlers.end_of_trace()
        _write_attributes_in_epilogue(unwritten)
        _write_buffers_in_epilogue(buffers)
        _add_epilogue_calls(ctx, epilogue_trace)

    return process_recorded_modifications


def _take_buffer_writes(ctx) -> list[tuple[Any, dict[str, Any]]]:
    """The buffer writes of the traced code (``self.register_buffer(name, t)``, ``self._buffers[name] = t``:
    transformers' dynamic RoPE in ``generate``), taken out of thunder's recorded modifications, each as (provenance of
    the module, {name: last value written, wrapped}); written back by :func:`_write_buffers_in_epilogue`. thunder
    writes them with ``prims.pack_buffer`` on the module path from the root, printed as ``root.set_buffer(name, t)``,
    a method of ``ThunderModule`` only: with a jitted bound method (``model.forward = jit(model.forward)``) it failed,
    either finding no module path from the root ("assert provenance.inputs[0].inst is PseudoInst.LOAD_ATTR") or in
    the epilogue ("'LlamaForCausalLM' object has no attribute 'set_buffer'"); with a jitted module the buffer went
    to thunder's override table only, and the user's module kept the old buffer, which eager replaces."""
    from thunder.core.compile_data import get_compile_data
    from thunder.core.interpreter import PseudoInst

    from thunder_subclass._thunder_internals.thunder_state import hooked_module_provenance

    taken = []
    for modified in list(ctx._additional_outputs):
        provenance = modified.provenance
        if provenance.inst is not PseudoInst.LOAD_ATTR or provenance.inputs[1].inst is not PseudoInst.CONSTANT \
                or provenance.inputs[1].value != "_buffers" or not isinstance(modified.value, dict):
            continue
        owner = provenance.inputs[0]
        if owner.inst is PseudoInst.INPUT_FN:
            fn = getattr(get_compile_data(), "fn", None)
            if fn is not None:
                owner = hooked_module_provenance(fn, owner)
        if not is_unpackable_provenance(owner):
            continue  # (thunder's own path)
        last: dict[str, Any] = {}
        for inst, *args in ctx._additional_outputs[modified]:
            if inst != PseudoInst.STORE_SUBSCR:
                break
            _, key, value = args
            last[key.value] = value
        else:
            del ctx._additional_outputs[modified]
            taken.append((owner, last))
    return taken


def _write_buffers_in_epilogue(writes: list) -> None:
    from thunder.core.interpreter import unwrap

    for owner, last in writes:
        for name, wrapped in last.items():
            call_in_epilogue(_set_module_buffer_symbol(), owner, name, unwrap(wrapped))


def _set_module_buffer(module, name: str, value) -> None:
    """``module._buffers[name] = value``, as the traced code did (on the user's module under a ``ThunderModule``)."""
    from thunder.core.module import ThunderModule

    if isinstance(module, ThunderModule):
        module._overrides_buffers[name] = value  # what thunder's get_buffer reads
        module = module._model
    module._buffers[name] = value


@functools.cache
def _set_module_buffer_symbol():
    import thunder.core.prims as prims

    sym = plugin_state.handlers.executor.register_operator(
        "set_module_buffer", meta=lambda module, name, value: None, fn=_set_module_buffer,
        tags=[prims.OpTags.DONT_DCE])
    plugin_state.remember_symbol_origin(sym, _set_module_buffer, _set_module_buffer_symbol)
    return sym


def _attribute_writes_thunder_drops(ctx) -> list[tuple[Any, str, dict[str, Any]]]:
    """The attribute writes (``obj.name = value`` in traced code) that ``process_recorded_modifications`` skips without
    a word: on an object whose provenance carries no prologue proxy, above all the compiled module itself (provenance
    ``INPUT_FN``: ``self.hidden = h.detach()``, ``self.steps += 1`` in the root's ``forward`` were silently not done,
    plain ``thunder.jit`` too). Each as (provenance to write through, the object's class name for errors, {name: last
    value written, wrapped})."""
    from thunder.core.compile_data import get_compile_data
    from thunder.core.interpreter import PseudoInst

    from thunder_subclass._thunder_internals.thunder_state import hooked_module_provenance

    dropped = []
    for modified, modifications in ctx._additional_outputs.items():
        provenance = modified.provenance
        if not isinstance(modified.value, dict) or provenance.inst is not PseudoInst.LOAD_ATTR \
                or provenance.inputs[1].inst is not PseudoInst.CONSTANT or provenance.inputs[1].value != "__dict__":
            continue
        owner = provenance.inputs[0]
        if hasattr(owner, "proxy") or not is_unpackable_provenance(owner):
            # thunder's pack_attr writes it; or an object made while tracing (thunder's own SequenceIter, its
            # next_pos), which no call after this one sees
            continue
        name = "object"
        if owner.inst is PseudoInst.INPUT_FN:
            fn = getattr(get_compile_data(), "fn", None)  # the jitted callable (INPUT_FN while interpreting)
            if fn is not None:
                name = type(fn).__name__
                # the prologue fetches a jitted module as its ThunderModule: the write goes to the user's module
                owner = hooked_module_provenance(fn, owner)
        last: dict[str, Any] = {}
        for inst, *args in modifications:
            if inst == PseudoInst.STORE_SUBSCR:
                _, key, value = args
                last[key.value] = value
        if last:
            dropped.append((owner, name, last))
    return dropped


def _epilogue_attribute_value(v) -> bool:
    """Whether the epilogue can hold ``v`` (a value written to an attribute): proxies, constants and tuples, lists and
    dicts of them."""
    import thunder
    from thunder.core.proxies import Proxy

    if v is None or isinstance(v, (Proxy, bool, int, float, complex, str, torch.dtype, torch.device,
                                   thunder.dtypes.dtype, thunder.devices.Device)):
        return True
    if type(v) in (tuple, list):
        return all(_epilogue_attribute_value(x) for x in v)
    if type(v) is dict:
        return all(type(k) in (str, int) and _epilogue_attribute_value(x) for k, x in v.items())
    return False


def _write_attributes_in_epilogue(writes: list) -> None:
    """Epilogue calls (``prims.pack_attr``, thunder's own write) for the writes :func:`_attribute_writes_thunder_drops`
    found, on the object fetched from the inputs by its provenance; a value the epilogue cannot hold is a typed
    error (it was dropped)."""
    import thunder.core.prims as prims
    from thunder.core.interpreter import unwrap

    from thunder_subclass.errors import UnsupportedTracingError

    for owner, owner_name, last in writes:
        for name, wrapped in last.items():
            value = unwrap(wrapped)
            if not _epilogue_attribute_value(value):
                raise UnsupportedTracingError(
                    f"the compiled code sets {owner_name}.{name} (an attribute of the compiled module or of an object "
                    f"reached from it) to an object of type {type(value).__name__}, which the compiled function "
                    f"cannot write back after each call: assign tensors, numbers, strings, dtypes, devices or "
                    f"tuples, lists and dicts of them, or return the object and assign it outside the compiled call"
                )
            call_in_epilogue(prims.pack_attr, owner, name, value)


def _add_epilogue_calls(ctx, epilogue_trace) -> None:
    # the calls call_in_epilogue collected, each on a proxy of the caller's object made from its provenance (one per
    # object): not a computation input, so thunder passes it from the prologue to the epilogue
    from thunder.core.proxies import Proxy
    from thunder.core.trace import tracectx

    objects: dict[int, Any] = {}
    for sym, history, args in ctx.__dict__.get(STATE_KEY, {}).get("epilogue_calls", ()):
        obj = objects.get(id(history))
        if obj is None:
            obj = objects[id(history)] = Proxy(history=history)
            epilogue_trace.add_name(obj.name)
        with tracectx(epilogue_trace):
            epilogue_trace.bound_symbols.append(sym.bind(obj, *args, output=None))


@functools.cache
def _object_rebuild_symbol():
    from thunder.core.proxies import AnyProxy

    def meta(typ, state):
        return AnyProxy(None)

    def impl(typ, state):
        obj = typ.__new__(typ)
        obj.__dict__.update(state)
        return obj

    sym = plugin_state.handlers.executor.register_operator("python_object_rebuild", meta=meta, fn=impl)
    plugin_state.remember_symbol_origin(sym, impl, _object_rebuild_symbol)
    return sym


def _returned_nested_int(v):
    """The epilogue's value for nested int ``v`` returned by the compiled function: read again at run time from the
    input it comes from (eager's nested int of the call's NestedTensor), or a typed error."""
    from thunder.core.proxies import Proxy

    found = plugin_state.handlers.nested_int_source(v)
    if found is None:
        from thunder_subclass.errors import UnsupportedSubclassOperationError

        raise UnsupportedSubclassOperationError(
            f"the compiled function returns {v}, the ragged size of a jagged NestedTensor (a nested int) whose offsets "
            f"the compiled code computed: the compiled program would return the one seen when it was traced, also for "
            f"a NestedTensor with other offsets on a cache hit. Return the NestedTensor and read its .shape outside "
            f"the compiled function (the ragged size of an input NestedTensor can be returned)."
        )
    history, dim, factor = found
    return _nested_size_symbol()(Proxy(history=history), dim, factor)


@functools.cache
def _size_symbol():
    from thunder.core.proxies import AnyProxy

    def meta(items):
        return AnyProxy(None)

    def impl(items):
        return torch.Size(items)

    sym = plugin_state.handlers.executor.register_operator("torch_size_of_items", meta=meta, fn=impl)
    plugin_state.remember_symbol_origin(sym, impl, _size_symbol)
    return sym


@functools.cache
def _nested_size_symbol():
    from thunder.core.proxies import AnyProxy

    def meta(t, dim, factor):
        return AnyProxy(None)

    def impl(t, dim, factor):
        if dim is None:  # a plain offsets input: the ragged size of NestedTensors built on it
            from torch.nested._internal.nested_tensor import get_tensor_symint

            n = get_tensor_symint(t, coeff=1)
        else:
            n = t.size(dim)
        return n if factor == 1 else n * factor

    sym = plugin_state.handlers.executor.register_operator("nested_int_of_input", meta=meta, fn=impl)
    plugin_state.remember_symbol_origin(sym, impl, _nested_size_symbol)
    return sym


@functools.cache
def _return_type_symbol():
    from thunder.core.proxies import AnyProxy

    def meta(typ, items):
        return AnyProxy(None)

    def impl(typ, items):
        return typ(items)

    sym = plugin_state.handlers.executor.register_operator("torch_return_type_of_items", meta=meta, fn=impl)
    plugin_state.remember_symbol_origin(sym, impl, _return_type_symbol)
    return sym


def _is_torch_return_type(v) -> bool:
    return isinstance(v, tuple) and type(v).__module__ == "torch.return_types"


def _is_plain_object(v) -> bool:
    """An object that ``build_value_from_wrapped`` has no rule for: not a constant, collection, dataclass, tensor,
    module, type or callable; a Python object with a ``__dict__``."""
    import dataclasses
    import enum
    import types

    import thunder
    import thunder.core.baseutils as baseutils
    import thunder.core.codeutils as codeutils
    from thunder.core.proxies import ProxyInterface

    if isinstance(v, (thunder.dtypes.dtype, thunder.devices.Device, ProxyInterface, codeutils.ContextObject,
                      torch.finfo, enum.Enum, type, torch.Tensor, torch.nn.Module, types.ModuleType)):
        return False
    if type(v) in (str, object) or baseutils.is_base_printable(v) or baseutils.is_collection(v) or callable(v):
        return False
    return type(v).__module__ != "builtins" and hasattr(v, "__dict__") and not dataclasses.is_dataclass(v)


def _hook_build_value_from_wrapped(original):
    # wraps thunder.core.jit_ext.build_value_from_wrapped (the epilogue's return value; recursive through the module
    # global), which knows inputs, constants, dataclasses, tuples, lists and dicts: any other object made in the
    # traced code and returned raises "unhandled value of type <class '...DynamicCache'>". Such an object is rebuilt
    # by the epilogue from its class and its __dict__, with the attributes the traced code set taken as their values
    # in the trace (proxies become the computed tensors).
    @functools.wraps(original)
    def build_value_from_wrapped(wrapped_v):
        import thunder.core.jit_ext as jit_ext
        from thunder.core.interpreter import unwrap

        v = unwrap(wrapped_v)
        if is_plugin_active() and is_nested_int(v):
            return _returned_nested_int(v)
        if is_plugin_active() and isinstance(v, (tuple, list)) and any(is_nested_int(e) for e in v) \
                and not hasattr(wrapped_v, "anyproxy"):
            # x.shape of a jagged NestedTensor (a torch.Size, which takes no proxy), or a tuple holding nested ints
            # the interpreter did not wrap one by one: each read again at run time
            witems = getattr(wrapped_v, "item_wrappers", None) or [None] * len(v)
            items = [_returned_nested_int(e) if is_nested_int(e) else
                     jit_ext.build_value_from_wrapped(w) if w is not None else e for w, e in zip(witems, v)]
            if type(v) in (torch.Size, RaggedSymbolicSize):
                return _size_symbol()(items)
            if _is_torch_return_type(v):
                return _return_type_symbol()(type(v), items)
            return type(v)(items)
        if is_plugin_active() and _is_torch_return_type(v) and not hasattr(wrapped_v, "anyproxy"):
            # a named tuple of torch's (x.topk(2), x.max(1)) returned as eager returns it: thunder's code generation
            # writes it as a call with keywords (torch.return_types.topk(values=..., indices=...)), which its
            # constructor does not take
            witems = getattr(wrapped_v, "item_wrappers", None) or [None] * len(v)
            items = [jit_ext.build_value_from_wrapped(w) if w is not None else e for w, e in zip(witems, v)]
            return _return_type_symbol()(type(v), items)
        if (
            is_plugin_active()
            and not hasattr(wrapped_v, "anyproxy")
            and not jit_ext.should_register_for_prologue(wrapped_v.provenance)
            and _is_plain_object(v)
        ):
            state = {}
            for k, value in vars(v).items():
                w = wrapped_v.attribute_wrappers.get(k)
                state[k] = jit_ext.build_value_from_wrapped(w) if w is not None else value
            return _object_rebuild_symbol()(type(v), state)
        return original(wrapped_v)

    return build_value_from_wrapped


def hook_targets() -> list[tuple[Any, str, Callable]]:
    import thunder.core.jit_ext as jit_ext

    return [
        (jit_ext, "process_recorded_modifications", _hook_process_recorded_modifications),
        (jit_ext, "build_value_from_wrapped", _hook_build_value_from_wrapped),
    ]


def lookasides() -> dict:
    return {}
