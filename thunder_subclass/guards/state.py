"""Stage 3 (inputs and guards), prologue guards on Python state that thunder's unpacking of the inputs leaves unchecked.

In: a value traced code read that thunder neither proxies nor checks in the prologue. What happens: the assumption the
trace makes about it is found (below). Out: a prologue check that
holds on every call what the trace assumed about it (a call for which it fails is a cache miss and a new trace), or,
for a value that differs on every call, a graph break. Each assumption and the check that holds it:

* An empty module slot (``self.bias`` of a ``Linear(bias=False)``, a buffer or submodule registered as None): thunder
  unpacks a parameter, buffer or submodule found in a module's ``_parameters`` / ``_buffers`` / ``_modules`` table,
  but records nothing for None, so a trace made for a bias-free module was reused for a biased one of the same
  sizes (under every cache option: the sizes matched, or were symbolic) and the bias was dropped. Assumption: the
  slot is still there and still None; checked every call (:class:`EmptyModuleSlot`) on the module (the user's, not
  thunder's ``ThunderModule`` wrapper). The other way round needs no new check: thunder's prologue fetches a
  parameter with ``get_parameter(name)``, which raises for None (a miss).
* The ``forward`` a module call ran (``module_calls``): thunder reads it as ``nn.Module`` machinery, unguarded, so
  ``model.forward = f`` (set on the instance) or a new ``forward`` on the class reused the old trace. Assumption: the
  instance's own ``forward`` (or its absence) and the class's are the same objects (:class:`ModuleForward`).
* Lasting Python state read out of the prologue's reach (``_thunder_internals.state_path_of``): ``type(obj).name``
  (a class attribute), and what traced code reads from a module it imports in its body. Assumption: the value read
  is equal (numbers, strings, containers of them), the same (functions, classes, modules) or of the same type (other
  objects); checked every call by following the same path again (:class:`StateRead`).
* ``os.environ`` reads (``os.environ[k]``, ``.get``, ``os.getenv``, ``k in os.environ``): the value (or its absence)
  is checked every call (:class:`StateRead` ``("environ", k)``; the disk cache stores the check too).
* An attribute of an input tensor (a flag on a parameter: ``getattr(param, "_is_sharded", False)``): thunder's
  interpreter holds the tensor as its proxy, which has none of the tensor's own Python attributes. An attribute the
  tensor holds is read from it and checked every call (:class:`StateRead` on the tensor); one it lacks is checked to
  be still missing (``guards.check_attribute_absent`` on the tensor).
* Calls whose answer differs on every call (Python's and NumPy's random generators, the clock, ``os.urandom``,
  ``uuid.uuid1/4``): no check can hold them, so such a call is a graph break (``UnsupportedGlobalStateError``): the
  function runs eagerly and draws as eager does. The clock read by ``logging`` to stamp a record is not a break
  (the record's time is the trace's; its message is not part of the result).
"""

from __future__ import annotations

import copy
import enum
import functools
import importlib
import sys
import types
from typing import Any

import torch

from thunder_subclass import _thunder_internals
from thunder_subclass.guards import Guard, check_attribute_absent, is_same_value, register_check

__all__ = ["EmptyModuleSlot", "ModuleForward", "StateRead", "check_module_forward", "check_module_slot_empty",
           "check_state_read", "guard_module_forward", "guard_module_slot", "guard_state_read",
           "guard_tensor_attribute_absent", "lookaside"]

_TABLE_KIND = {"_parameters": "parameter", "_buffers": "buffer", "_modules": "submodule"}


class EmptyModuleSlot(Guard):
    """The guard of one empty slot: a module's ``table`` (``"_parameters"``, ``"_buffers"``, ``"_modules"``) holds
    None at ``name``. Called on the module it answers whether that still holds (the fused prologue calls it so);
    :meth:`explain` says what is there instead; stored on disk by its table and name."""

    __slots__ = ("table", "name")

    def __init__(self, table: str, name: str):
        self.table, self.name = table, name

    def __repr__(self) -> str:
        return f"EmptyModuleSlot({self.table}[{self.name!r}])"

    def matches(self, module) -> bool:
        return self(module)

    def __call__(self, module) -> bool:
        slots = vars(_thunder_internals.user_module(module)).get(self.table)
        return slots is not None and self.name in slots and slots[self.name] is None

    def explain(self, module) -> str:
        slots = vars(_thunder_internals.user_module(module)).get(self.table)
        what = "missing" if slots is None or self.name not in slots else f"a {type(slots[self.name]).__name__}"
        return (f"the {_TABLE_KIND.get(self.table, self.table)} {self.name!r} of a "
                f"{type(_thunder_internals.user_module(module)).__name__} is {what}; the trace was made for None")

    def expression(self, v: str, const) -> str:
        return f"{const(self)}({v})"

    def disk_state(self) -> tuple:  # thunder_subclass.runtime.disk_cache
        return self.table, self.name

    @classmethod
    def from_disk_state(cls, state: tuple) -> "EmptyModuleSlot":
        return cls(*state)


check_module_slot_empty = register_check("check_module_slot_empty", ("module", "slot"))


def guard_module_slot(obj, provenance) -> None:
    """When ``provenance`` reads a module's parameter, buffer or submodule slot and finds it empty (``obj`` is None; a
    tensor or module there is thunder's to check): guard that it stays empty (:class:`EmptyModuleSlot`)."""
    from thunder.core.proxies import AnyProxy

    if obj is not None:
        return
    slot = _thunder_internals.module_slot_of(provenance)
    state = _thunder_internals.jit_state()
    jit_ctx = _thunder_internals.jit_context()
    if slot is None or state is None or jit_ctx is None:
        return
    module_record, table, name = slot
    seen = state.setdefault("empty_module_slots", {})
    if (id(module_record), table, name) in seen:
        return
    seen[(id(module_record), table, name)] = module_record  # (kept for the trace's lifetime, so its id stays its own)
    holder = AnyProxy(None, prefix="module_with_empty_slot", history=module_record)
    jit_ctx.add_constraint((check_module_slot_empty, holder, EmptyModuleSlot(table, name)))


class ModuleForward(Guard):
    """The guard of the ``forward`` a module call ran: the function set on the instance (``model.forward = f``, as
    libraries patch it; None: none set) and the class's ``forward``, each the same object as when traced. thunder reads
    ``forward`` as part of ``nn.Module``'s machinery, which the object guards leave to the module's type (a type check
    cannot see either change)."""

    __slots__ = ("instance", "cls")

    def __init__(self, instance, cls):
        self.instance, self.cls = instance, cls

    def __repr__(self) -> str:
        return "ModuleForward()"

    @staticmethod
    def _now(module) -> tuple:
        m = _thunder_internals.user_module(module)
        return vars(m).get("forward"), getattr(type(m), "forward", None)

    def matches(self, module) -> bool:
        return self(module)

    def __call__(self, module) -> bool:
        instance, cls = self._now(module)
        return instance is self.instance and cls is self.cls

    def explain(self, module) -> str:
        instance, cls = self._now(module)
        name = type(_thunder_internals.user_module(module)).__qualname__
        if instance is not self.instance:
            return (f"the forward set on the {name} instance is {instance!r}, the trace was made for "
                    f"{'none' if self.instance is None else repr(self.instance)}")
        return f"{name}.forward is {cls!r}, the trace was made for {self.cls!r}"

    def expression(self, v: str, const) -> str:
        return f"{const(self)}({v})"

    def disk_state(self) -> tuple:  # thunder_subclass.runtime.disk_cache
        return self.instance, self.cls

    @classmethod
    def from_disk_state(cls, state: tuple) -> "ModuleForward":
        return cls(*state)


check_module_forward = register_check("check_module_forward", ("module", "spec"))


def guard_module_forward(jit_ctx, module, provenance) -> None:
    """A call of ``module`` (reached by ``provenance``, one the prologue unpacks) ran its ``forward``: guard which one
    (:class:`ModuleForward`). Once per module path and trace."""
    from thunder.core.proxies import AnyProxy

    state = _thunder_internals.jit_state()
    if state is None:
        return
    seen = state.setdefault("module_forwards", {})
    if id(provenance) in seen:
        return
    seen[id(provenance)] = provenance  # (kept for the trace's lifetime, so its id stays its own)
    m = _thunder_internals.user_module(module)
    spec = ModuleForward(vars(m).get("forward"), getattr(type(m), "forward", None))
    jit_ctx.add_constraint((check_module_forward, AnyProxy(None, prefix="called_module", history=provenance), spec))


def guard_tensor_attribute_absent(obj, provenance, name) -> bool:
    """Traced code looked for attribute ``name`` of a tensor read from the inputs (a parameter, buffer or argument:
    ``getattr(param, "_is_sharded", False)``, ``hasattr``) and did not find it: checked every call to be still missing
    (``guards.check_attribute_absent`` on the tensor), so a flag set on the tensor later is a new trace. Returns
    whether ``obj`` was a tensor (the other objects are ``guards.guard_attribute_absent``'s)."""
    from thunder.core.proxies import AnyProxy, TensorProxy

    if not isinstance(obj, (torch.Tensor, TensorProxy)):  # (the interpreter holds an input tensor as its proxy)
        return False
    state = _thunder_internals.jit_state()
    jit_ctx = _thunder_internals.jit_context()
    if state is None or jit_ctx is None or type(name) is not str or (name.startswith("__") and name.endswith("__")):
        return True
    if not _thunder_internals.is_unpackable_provenance(provenance):
        return True
    seen = state.setdefault("absent_tensor_attributes", {})
    if (id(provenance), name) in seen:
        return True
    seen[(id(provenance), name)] = provenance  # (kept for the trace's lifetime, so its id stays its own)
    # the tensor's own proxy (which the prologue unpacks; a plain torch.Tensor is held by its proxy while tracing)
    holder = obj if isinstance(obj, TensorProxy) else AnyProxy(None, prefix="tensor", history=provenance)
    jit_ctx.add_constraint((check_attribute_absent, holder, name))
    return True


# ---------------------------------------------------------------------------------------------------------------
# Reads of lasting Python state the prologue cannot unpack: type(obj).name, modules imported inside traced code
# ---------------------------------------------------------------------------------------------------------------

_LITERALS = (type(None), bool, int, float, complex, str, bytes, enum.Enum, torch.dtype, torch.device)
_BY_IDENTITY = (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType, functools.partial)


def _is_literal(v, depth: int = 0) -> bool:
    if isinstance(v, _LITERALS):
        return True
    if depth < 4 and type(v) in (tuple, list, frozenset, set):
        return len(v) <= 256 and all(_is_literal(x, depth + 1) for x in v)
    if depth < 4 and type(v) is dict:
        return len(v) <= 256 and all(_is_literal(k, depth + 1) and _is_literal(x, depth + 1) for k, x in v.items())
    return False


class StateRead(Guard):
    """One read of lasting Python state that traced code made and thunder baked in unchecked (see
    ``_thunder_internals.state_path_of``): from ``anchor`` (``("type",)``: the type of the checked object, the user's
    module for a jitted one; ``("self",)``: the checked object itself; ``("import", name)``: ``sys.modules[name]``;
    ``("environ", key)``: ``os.environ.get(key)``, with no steps) along ``steps`` (``(".", attr)`` /
    ``("[]", key)``), the value is as when traced: ``kind`` ``"value"`` (equal, of the same type: numbers, strings,
    None, and containers of them, compared with a copy), ``"identity"`` (the same function, class or module) or
    ``"type"`` (an object of the same type; what the trace read from it has its own reads). Called on the checked
    object (None for an import anchor) it answers whether that holds."""

    __slots__ = ("anchor", "steps", "kind", "expected")

    def __init__(self, anchor: tuple, steps: tuple, kind: str, expected):
        self.anchor, self.steps, self.kind, self.expected = anchor, steps, kind, expected

    def __repr__(self) -> str:
        return f"StateRead({self.where()})"

    def where(self) -> str:
        if self.anchor[0] == "environ":
            return f"os.environ[{self.anchor[1]!r}]"
        base = {"type": "type(obj)", "self": "obj"}.get(self.anchor[0]) or self.anchor[1]
        return base + "".join(f".{k}" if s == "." else f"[{k!r}]" for s, k in self.steps)

    def read(self, holder):
        if self.anchor[0] == "environ":
            import os

            return os.environ.get(self.anchor[1])
        if self.anchor[0] == "self":
            obj = holder
        elif self.anchor[0] == "type":
            obj = type(_thunder_internals.user_module(holder))
        else:  # the traced function imports it on every call, as the check does (a new process: not yet imported)
            obj = sys.modules.get(self.anchor[1], _MISSING)
            if obj is _MISSING:
                try:
                    obj = importlib.import_module(self.anchor[1])
                except Exception:  # noqa: BLE001 - gone: not what the trace read
                    obj = _MISSING
        for step, key in self.steps:
            if obj is _MISSING:
                break
            try:
                obj = getattr(obj, key) if step == "." else obj[key]
            except Exception:  # noqa: BLE001 - gone: not what the trace read
                obj = _MISSING
        return obj

    def matches(self, holder=None) -> bool:
        return self(holder)

    def holds(self, value) -> bool:
        """Whether ``value``, read where the trace read it, is what the trace depends on."""
        if self.kind == "value":
            return is_same_value(value, self.expected)
        if self.kind == "identity":
            return value is self.expected
        return type(value) is self.expected

    def __call__(self, holder=None) -> bool:
        return self.holds(self.read(holder))

    def explain(self, holder=None) -> str:
        value = self.read(holder)
        if self.anchor[0] == "environ":
            return f"{self.where()} is {'not set' if value is None else repr(value)}, the trace was made for " \
                   f"{'it not set' if self.expected is None else repr(self.expected)}"
        now = "missing" if value is _MISSING else (
            f"a {type(value).__qualname__}" if self.kind == "type" else repr(value))
        was = f"a {self.expected.__qualname__}" if self.kind == "type" else repr(self.expected)
        return f"{self.where()} is {now}, the trace was made for {was}"

    def disk_state(self) -> tuple:  # thunder_subclass.runtime.disk_cache
        return self.anchor, self.steps, self.kind, self.expected

    @classmethod
    def from_disk_state(cls, state: tuple) -> "StateRead":
        anchor, steps, kind, expected = state
        return cls(tuple(anchor), tuple(tuple(s) for s in steps), kind, expected)


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


check_state_read = register_check("check_state_read", ("holder", "read"))


def guard_state_read(obj, provenance) -> bool:
    """When ``provenance`` reads lasting Python state out of the prologue's reach (``type(x).scale``, ``cfg.factor``
    after ``import cfg`` in traced code): guard the value read (see :class:`StateRead`) and return True."""
    from thunder.core.proxies import AnyProxy

    found = _thunder_internals.state_path_of(provenance)
    if found is None:
        return False
    state = _thunder_internals.jit_state()
    jit_ctx = _thunder_internals.jit_context()
    if state is None or jit_ctx is None or isinstance(obj, torch.Tensor) or _is_made_per_read(obj):
        return True
    anchor, steps = found
    if anchor[0] == "type" and _is_proxy_input(state, anchor[1]):
        return True  # type() of a tensor input answers the proxy's class while tracing, not the tensor's: not named
    kind, expected = _value_guard(obj)
    key = (anchor[0], id(anchor[1]) if anchor[0] == "type" else anchor[1], steps)
    seen = state.setdefault("state_reads", {})
    if key in seen:
        return True
    seen[key] = anchor[1]  # (a record: kept for the trace's lifetime, so its id stays its own)
    if anchor[0] == "type":
        holder = AnyProxy(None, prefix="state_holder", history=anchor[1])
        jit_ctx.add_constraint((check_state_read, holder, StateRead(("type",), steps, kind, expected)))
    else:
        jit_ctx.add_constraint((check_state_read, None, StateRead(anchor, steps, kind, expected)))
    return True


def _is_proxy_input(state: dict, record) -> bool:
    from thunder.core.proxies import Proxy

    seen = state.get("input_values", {}).get(id(record))  # (guards.guard_input_object's record of input values)
    return seen is not None and seen[0] is record and isinstance(seen[1], Proxy)


def _is_made_per_read(obj) -> bool:
    # a bound method is made anew by each read; what it runs is its function's (read, and guarded, on its own)
    return isinstance(obj, (types.MethodType, types.MethodWrapperType, types.BuiltinMethodType)) and \
        not isinstance(getattr(obj, "__self__", None), (type, types.ModuleType))


# ---------------------------------------------------------------------------------------------------------------
# Environment variables, and calls whose answer differs on every call
# ---------------------------------------------------------------------------------------------------------------

def _is_environ_read(fn, wrapped_args: tuple) -> bool:
    import os

    target = getattr(fn, "__func__", fn)
    if target is not type(os.environ).__getitem__:
        return False
    owner = fn.__self__ if hasattr(fn, "__func__") else (wrapped_args[0].value if wrapped_args else None)
    return owner is os.environ


def _environ_lookaside(fn):
    """``os.environ[key]`` (also what ``os.environ.get``, ``os.getenv`` and ``key in os.environ`` call), run as Python
    with the value read (None: not set) checked on every call (:class:`StateRead` ``("environ", key)``): thunder
    baked the first call's value into the trace."""
    from thunder.core.interpreter import interpreter_needs_wrap
    import os

    def environ_getitem(*args):
        key = args[-1]
        value = os.environ.get(key) if type(key) is str else None
        _guard_environ(key, value)
        return os.environ[key]  # (raises KeyError as eager does)

    return interpreter_needs_wrap(environ_getitem)


def _guard_environ(key, value) -> None:
    state = _thunder_internals.jit_state()
    jit_ctx = _thunder_internals.jit_context()
    if state is None or jit_ctx is None or type(key) is not str:
        return
    seen = state.setdefault("environ_reads", set())
    if key in seen:
        return
    seen.add(key)
    jit_ctx.add_constraint((check_state_read, None, StateRead(("environ", key), (), "value", value)))


_TIME_FUNCTIONS = ("time", "time_ns", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "process_time",
                   "process_time_ns", "thread_time", "thread_time_ns")


# modules that read the clock to stamp what they emit (a log record's time), not to compute: no graph break there
_TIMESTAMPING = frozenset({"logging", "warnings"})


def _differs_every_call(fn, wrapped_args: tuple) -> str | None:
    """``module.name`` of a function whose answer differs on every call (a draw from Python's or NumPy's random number
    generators, the clock, ``os.urandom``, ``uuid.uuid1/4``), else None."""
    import os
    import random
    import time
    import uuid

    owner = getattr(fn, "__self__", None)
    if isinstance(fn, types.MethodDescriptorType) and wrapped_args:  # _random.Random.random(rng): the C method
        owner = getattr(wrapped_args[0], "value", None)
    if isinstance(owner, random.Random):
        return f"random.{getattr(fn, '__name__', '?')}"
    np = sys.modules.get("numpy")
    if np is not None and isinstance(owner, (np.random.RandomState, np.random.Generator)):
        return f"numpy.random.{getattr(fn, '__name__', '?')}"
    if owner is time or (getattr(fn, "__module__", None) == "time" and getattr(fn, "__name__", None) in _TIME_FUNCTIONS):
        caller = _thunder_internals.caller_module_name() or ""
        if getattr(fn, "__name__", None) in _TIME_FUNCTIONS and caller.partition(".")[0] not in _TIMESTAMPING:
            return f"time.{fn.__name__}"
    if fn is os.urandom:
        return "os.urandom"
    if fn is uuid.uuid1 or fn is uuid.uuid4:
        return f"uuid.{fn.__name__}"
    return None


def _differs_every_call_lookaside(name: str):
    from thunder_subclass.errors import UnsupportedGlobalStateError, format_location

    def refuse(*args, **kwargs):
        where = format_location(*_thunder_internals.source_location())
        return _thunder_internals.raise_in_interpreter(UnsupportedGlobalStateError(
            f"{name}() at {where} returns another value on every call: a compiled program would return the value "
            f"of the call that traced, every time. Call it outside the compiled function and pass the value in (as "
            f"a tensor to reuse one trace), or draw from torch's generator (torch.rand), which the trace follows."
        ))

    return refuse


def _real_input(p):
    """The tensor that input proxy ``p`` stands for in the call being traced (``speculation.record_input``), or None."""
    state = _thunder_internals.jit_state()
    entry = None if state is None else state.get("real_inputs", {}).get(getattr(p, "name", None))
    return None if entry is None or entry[0] is not p else entry[1]()


def _tensor_attribute_lookaside(wrapped_args: tuple):
    """``getattr(t, name[, default])`` / ``t.name`` of an input tensor that holds ``name`` as a Python attribute of its
    own (a flag set on a parameter: ``param._is_sharded = True``): the interpreter holds the tensor as its proxy,
    which has no such attribute, so the trace took the default. Answered from the tensor, with the value checked every
    call (:class:`StateRead` on the tensor); None when this is not such a read."""
    from thunder.core.interpreter import wrap_const
    from thunder.core.proxies import TensorProxy

    if len(wrapped_args) not in (2, 3):
        return None
    p, name = getattr(wrapped_args[0], "value", None), getattr(wrapped_args[1], "value", None)
    if not isinstance(p, TensorProxy) or type(name) is not str or name.startswith("__"):
        return None
    real = _real_input(p)
    if real is None or name not in getattr(real, "__dict__", {}) or \
            not _thunder_internals.is_unpackable_provenance(wrapped_args[0].provenance):
        return None
    value = real.__dict__[name]
    if isinstance(value, torch.Tensor):
        return None  # (a tensor attribute: thunder's own reads)
    jit_ctx = _thunder_internals.jit_context()
    if jit_ctx is not None:
        kind, expected = _value_guard(value)
        jit_ctx.add_constraint((check_state_read, p, StateRead(("self",), ((".", name),), kind, expected)))
    return lambda *args: wrap_const(value)


def _value_guard(value) -> tuple[str, Any]:
    if _is_literal(value):
        return "value", copy.deepcopy(value)
    if isinstance(value, _BY_IDENTITY):
        return "identity", value
    return "type", type(value)


def lookaside(fn, wrapped_args: tuple):
    """The lookaside for reads of Python state that change between calls (``os.environ``; ``random``, the clock;
    an attribute set on an input tensor), or None."""
    if fn is getattr:
        return _tensor_attribute_lookaside(wrapped_args)
    try:
        if _is_environ_read(fn, wrapped_args):
            return _environ_lookaside(fn)
        name = _differs_every_call(fn, wrapped_args)
    except TypeError:  # an unhashable or odd callable: not one of these
        return None
    return None if name is None else _differs_every_call_lookaside(name)
