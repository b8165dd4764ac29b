"""Stage 3 (inputs and guards) at run time, a cheaper prologue: a cache entry's checks run as one generated function
instead of one call each.

In: the prologue trace thunder built for a ``thunder_subclass.jit`` call (unpacking of arguments, parameters, module
attributes and the per-call cache info, each followed by its check). What happens: each check asks its guard for an
inline expression. Out: the same unpacking, and before the return
ONE ``check_prologue`` bound symbol whose argument is a :class:`FusedChecks`: a Python function generated for this
trace from the checks it replaces, each one an inline expression with the same meaning as the check it stands for:

* thunder's ``check_tensor_metadata`` (a ``torch.Tensor`` with this shape, device, dtype and requires_grad),
  ``check_number_type_and_value`` (same type, equal or both NaN), ``check_string_value``, ``check_literal_like``
  (``==``), ``check_len``, ``check_none``, ``check_type`` and ``check_instance``;
* the plugin's ``check_subclass`` (:meth:`thunder_subclass.guards.SubclassSpec.matches`, inlined by
  :meth:`~thunder_subclass.guards.SubclassSpec.expression`), ``check_plain_tensor``, ``check_tensor_strides``,
  ``check_no_dispatch_mode``, ``check_module_slot_empty`` and ``check_module_forward`` (``state_guards``), ``check_object`` (:meth:`thunder_subclass.guards.ObjectSpec.expression`) and
  ``check_module_hooks`` (a module without hooks: its four hook dictionaries inline,
  and the global module hooks once per call: ``_thunder_internals.module_has_no_own_hooks_expression``).

Tensor metadata (thunder's ``check_tensor_metadata``, the outer and plain inner tensors of ``check_subclass``, and
``check_tensor_strides`` of a tensor checked so) is checked last, by torch's C++ tensor guard
(``torch._C._dynamo.guards.TensorGuards``, what dynamo's tensor guards run; through
``_thunder_internals.tensor_metadata_guard``) made from the first tensors the Python checks accept: one C++ call for
all of them instead of four or five attribute reads each in Python (on a quantized HF Llama the fused checks were
40% of a call under the profiler before, most of it these reads, each one through torchao's ``__torch_function__``). The C++ guard is stricter (it also compares dispatch keys and Python types): when it says
no, the same checks run in Python (:class:`_TensorChecks`), so the set of calls that hit is what it was.

Checks with symbolic values (``cache="symbolic values"``: shapes holding number proxies) and checks of other kinds
stay as they were. Every check still runs on every call, after all the unpacking, so a call for which any of them
fails raises (:class:`~thunder_subclass.guards.SubclassGuardFailure`, naming the first failing check), which thunder
treats as a cache miss, as before. What goes away is thunder's one Python call (and lowered symbol) per check: about
thirty for a 4-layer ``nn.Linear`` model.

Used by ``thunder_subclass.jit`` (the transform is the last of its transforms). ``thunder.compile(...,
plugins="tensor-subclass")`` does not add it: recipes may prune prologue checks (``PrunePrologueChecks``) after the
plugin's transforms, and need to see thunder's own check symbols to do so.
"""

from __future__ import annotations

from numbers import Number
from typing import Any

import torch
import thunder.core.prims as prims
from thunder.core.proxies import IntegerProxy, Proxy
from thunder.core.trace import from_trace, TraceProvenance
from thunder.core.transform_common import Transform

from thunder_subclass.executor import subclass_executor
from thunder_subclass.guards import MISSING, SubclassGuardFailure, guard_of, inline_tensor_check, is_same_value
from thunder_subclass._thunder_internals import (
    has_no_global_module_hooks,
    module_forward_hooks,
    tensor_metadata_guard,
)
from thunder_subclass.frontend.proxy import PLAIN_TENSOR_TYPES
from thunder_subclass.guards.unpack_cache import STEP_KINDS, UnpackCache
from thunder_subclass import _thunder_internals

__all__ = ["FusedChecks", "FusedPrologueChecks", "check_prologue", "fuse_prologue_checks"]

_P = prims.PrimIDs


class FusedChecks:
    """The checks of one prologue as one function of the checked values (``fn``), with the text of each check for
    error messages. Not printable as a literal: thunder passes it to the prologue as a global."""

    __slots__ = ("fn", "conditions", "source", "names", "_compiled")

    def __init__(self, fn, conditions: list[str], source: str, names: tuple[str, ...] = ()):
        self.fn, self.conditions, self.source = fn, conditions, source
        self.names = names  # the prologue's name of each checked value (v0, v1, ... in the conditions)
        self._compiled = None

    def __repr__(self) -> str:
        return f"FusedChecks({len(self.conditions)} checks)"

    def state(self) -> dict:
        """What :meth:`from_state` needs to make these checks again (in another process: the on-disk cache,
        ``thunder_subclass.runtime.disk_cache``): the generated source, the conditions, the names, the constants the source
        names (``c0``, ``c1``, ...) and the strides of the tensor checks."""
        namespace = self.fn.__globals__
        fixed = _Builder().constants
        tensor_checks = namespace.get("_tensor_checks")
        return {
            "source": self.source, "conditions": list(self.conditions), "names": list(self.names),
            "constants": {k: v for k, v in namespace.items() if k.startswith("c") and k[1:].isdigit() and k not in fixed},
            "strides": None if tensor_checks is None else list(tensor_checks.strides),
            "dims": None if tensor_checks is None or tensor_checks.dims is None else list(tensor_checks.dims),
        }

    @classmethod
    def from_state(cls, state: dict) -> "FusedChecks":
        """The checks :meth:`state` describes, with a new C++ tensor guard (made at the first call they accept)."""
        namespace = dict(_Builder().constants)
        namespace.update(state["constants"])
        exec(compile(state["source"], "<thunder_subclass fused prologue checks>", "exec"), namespace)
        if state["strides"] is not None:
            dims = state.get("dims")
            namespace["_tensor_checks"] = _TensorChecks(namespace["tensor_checks"], list(state["strides"]), namespace,
                                                        None if dims is None else [
                                                            None if d is None else tuple(d) for d in dims])
        return cls(namespace["fused_prologue_checks"], list(state["conditions"]), state["source"],
                   tuple(state["names"]))

    def _first_failing(self, values: tuple) -> tuple[str | None, BaseException | None, dict]:
        """``(condition, what it raised or None, namespace)`` of the first check that ``values`` fail; the condition
        is None when all hold. The generated function's constants are its globals; the values and the names bound by
        ``:=`` are locals, so that a later condition reads what an earlier one bound."""
        if self._compiled is None:
            self._compiled = [compile(c, "<thunder_subclass prologue check>", "eval") for c in self.conditions]
        namespace = {f"v{i}": v for i, v in enumerate(values)}
        for cond, code in zip(self.conditions, self._compiled):
            try:
                ok = eval(code, self.fn.__globals__, namespace)
            except Exception as e:  # noqa: BLE001 - reported as the failing check
                return cond, e, namespace
            if not ok:
                return cond, None, namespace
        return None, None, namespace

    def failure(self, values: tuple) -> str:
        """The first check that ``values`` fail, in words (only built when a miss is explained: see
        :class:`~thunder_subclass.guards.SubclassGuardFailure`)."""
        cond, error, namespace = self._first_failing(values)
        if cond is None:
            return "prologue check failed"
        if error is not None:
            return f"prologue check `{cond}`{self._readable(cond)} raised {type(error).__name__}: {error}"
        return f"prologue check `{cond}`{self._readable(cond)} failed{self._explained(cond, namespace)}"

    def first_failure_is_int_value(self, values: tuple) -> bool:
        """Whether the first check that ``values`` fail is an int compared by value (thunder's
        ``check_number_type_and_value`` of an int read while tracing: an attribute such as a cache layer's
        ``cumulative_length``), still an int: what automatic dynamic shapes takes as a size-like change."""
        cond, error, namespace = self._first_failing(values)
        if cond is None or error is not None:
            return False
        value = _int_value_condition(cond, self.fn.__globals__)
        return value is not None and type(namespace.get(value)) is int

    def _explained(self, cond: str, namespace: dict) -> str:
        """What a failing check of a constant that can say it (``c3(v1)`` with an ``explain`` method) says."""
        import re

        for const, value in re.findall(r"\b(c\d+)\((v\d+)\)", cond):
            check = self.fn.__globals__.get(const)
            explain = getattr(check, "explain", None)
            if callable(explain) and value in namespace and not check(namespace[value]):
                return f": {explain(namespace[value])}"
        return ""

    def _readable(self, cond: str) -> str:
        """The condition with the prologue's names for the values and the constants' values, for people."""
        import re

        constants = self.fn.__globals__

        def name(m: re.Match) -> str:
            kind, i = m.group(1), int(m.group(2))
            if kind == "v":
                return self.names[i] if i < len(self.names) else m.group(0)
            value = constants.get(m.group(0), m.group(0))
            text = getattr(value, "__qualname__", None) if isinstance(value, type) else repr(value)
            return text if text is not None and len(text) <= 80 else m.group(0)

        readable = re.sub(r"\b([vc])(\d+)\b", name, cond)
        return "" if readable == cond else f" (that is, `{readable}`)"


class _TensorChecks:
    """The metadata checks of a prologue's tensors (``python(*tensors)``, generated), run when torch's C++ tensor
    guard, the generated function's ``_tensor_guard`` global, is False or not made yet: it is made
    (``_thunder_internals.tensor_metadata_guard``) from the first tensors these checks accept, and made again from
    later ones that they accept and it does not (other dispatch keys, e.g. inference tensors), a few times at most.
    The C++ guard is stricter than the Python checks, so the two together accept exactly what the Python checks
    accept."""

    __slots__ = ("python", "strides", "namespace", "builds", "dims")

    MAX_BUILDS = 4

    def __init__(self, python, strides: list, namespace: dict, dims: list | None = None):
        self.python, self.strides, self.namespace, self.builds = python, strides, namespace, 0
        self.dims = dims  # each tensor's sizes with None for a symbolic dim, or None (its example's sizes)

    def __call__(self, *tensors) -> bool:
        if not self.python(*tensors):
            return False
        if self.builds < self.MAX_BUILDS:
            self.builds += 1
            guard = self.guard(tensors)
            if guard is not None:
                self.namespace["_tensor_guard"] = guard
        return True

    def guard(self, tensors: tuple):
        """The C++ guard for tensors like ``tensors``. torch's guard is False for an argument passed twice (dynamo's
        duplicate-input rule), and one tensor can be reached twice (tied weights): the guard gets each object once,
        and a generated function checks that the repeats are the same objects again."""
        first: dict[int, int] = {}
        unique, repeats = [], []
        for i, t in enumerate(tensors):
            j = first.setdefault(id(t), i)
            if j == i:
                unique.append(i)
            else:
                repeats.append((i, j))
        dims = None if self.dims is None else [self.dims[i] for i in unique]
        check = tensor_metadata_guard([tensors[i] for i in unique], [self.strides[i] for i in unique], dims)
        if check is None or not repeats:
            return check
        params = ", ".join(f"t{i}" for i in range(len(tensors)))
        same = " and ".join(f"t{i} is t{j}" for i, j in repeats)
        source = f"def tensor_guard({params}):\n    return {same} and _check({', '.join(f't{i}' for i in unique)})\n"
        namespace = {"_check": check}
        exec(compile(source, "<thunder_subclass tensor guard>", "exec"), namespace)
        return namespace["tensor_guard"]


def _no_guard(*tensors) -> bool:
    return False


def _check_prologue_impl(values: tuple, checks: FusedChecks) -> None:
    if not checks.fn(*values):  # the message (which check failed) is found only when it is read
        raise SubclassGuardFailure(explain=lambda: checks.failure(values),
                                   int_changed=lambda: checks.first_failure_is_int_value(values))


# DONT_DCE: no output, and dead-code elimination must keep it in the prologue
check_prologue = subclass_executor.register_operator(
    "check_prologue", meta=lambda values, checks: None, fn=_check_prologue_impl, tags=[prims.OpTags.DONT_DCE]
)

def _read_module_impl(module, cache):
    return cache(module)


# the module reads of a prologue and their checks, once per write (guards.unpack_cache; DONT_DCE: its checks)
read_module = subclass_executor.register_operator(
    "read_module", meta=lambda module, cache: None, fn=_read_module_impl,
    tags=[prims.OpTags.DONT_DCE]
)


def _int_value_condition(cond: str, constants: dict) -> str | None:
    """The checked value's name (``vN``) when ``cond`` is :func:`_same_value_expr`'s check of an int, else None."""
    import re

    m = re.fullmatch(r"\(type\((v\d+)\) is (c\d+) and \1 == c\d+\)", cond)
    return m.group(1) if m is not None and constants.get(m.group(2)) is int else None


def _same_value_expr(v: str, c: str, typ: str, value: Any) -> str:
    # thunder's check_number_type_and_value: type(n) == type(v) and (n == v or (n != n and v != v))
    if value != value:  # NaN
        return f"(type({v}) is {typ} and {v} != {v})"
    return f"(type({v}) is {typ} and {v} == {c})"


class _TensorSlot:
    """A tensor whose metadata the generated function checks after its other conditions (see :class:`_TensorChecks`):
    ``x`` names it there (an argument ``vN`` or a local bound by ``:=``)."""

    __slots__ = ("x", "shape", "dtype", "device", "requires_grad", "plain", "instance", "strides")

    def __init__(self, x, shape, dtype, device, requires_grad, plain, instance):
        self.x, self.shape, self.dtype, self.device, self.requires_grad = x, shape, dtype, device, requires_grad
        self.plain, self.instance, self.strides = plain, instance, None

    def condition(self, t: str, const) -> str:
        """The checks of this tensor in Python, for the tensor named ``t`` (``guards.inline_tensor_check``'s, after an
        ``isinstance`` check for thunder's tensor checks and before a stride check where there is one)."""
        meta = inline_tensor_check(const)(t, self.shape, self.dtype, self.device, bool(self.requires_grad), self.plain)
        return "(" + " and ".join(
            ([f"isinstance({t}, _Tensor)"] if self.instance else [])
            + [meta]
            + ([f"{t}.stride() == {const(tuple(self.strides))}"] if self.strides is not None else [])
        ) + ")"


class _Builder:
    def __init__(self):
        self.values: list[Proxy] = []
        self.value_index: dict[str, int] = {}
        self.constants: dict[str, Any] = {"_Tensor": torch.Tensor, "_plain": PLAIN_TENSOR_TYPES,
                                          "_dispatch_depth": torch._C._len_torch_dispatch_stack,
                                          "_same": is_same_value, "_MISSING": MISSING,
                                          "_no_global_hooks": has_no_global_module_hooks, "_hooks": module_forward_hooks,
                                          "_tensor_guard": _no_guard}
        self.conditions: list[str] = []
        self.slots: list[_TensorSlot] = []
        self.slot_of: dict[str, _TensorSlot] = {}  # argument name -> its first slot (for a later stride check)
        self.checks = 0
        self.locals = 0
        self.asked: set[str] = set()
        self.after: list[str] = []  # conditions on the tensors, after their metadata check (symbolic sizes' relations)

    def fresh(self) -> str:
        self.locals += 1
        return f"_w{self.locals}"

    def value(self, p: Proxy) -> str:
        i = self.value_index.get(p.name)
        if i is None:
            i = self.value_index[p.name] = len(self.values)
            self.values.append(p)
        return f"v{i}"

    def const(self, c: Any) -> str:
        name = f"c{len(self.constants)}"
        self.constants[name] = c
        return name

    def tensor(self, x: str, shape, dtype, device, requires_grad, plain: bool, strides=None,
               instance: bool = False) -> str:
        """A tensor metadata check, checked after the other conditions (see :class:`_TensorChecks`): no inline
        expression."""
        slot = _TensorSlot(x, shape, dtype, device, requires_grad, plain, instance)
        if strides is not None:
            slot.strides = tuple(strides)
        self.slots.append(slot)
        self.slot_of.setdefault(x, slot)
        return ""

    def __call__(self, c: Any) -> str:
        """``const``, as a guard's ``expression`` gets it (:class:`thunder_subclass.guards.Guard`)."""
        return self.const(c)

    def strides(self, x: str, strides: tuple) -> bool:
        """Checks ``strides`` of tensor ``x`` with its other metadata when it has a slot without strides yet."""
        slot = self.slot_of.get(x)
        if slot is None or slot.strides is not None or None in slot.shape or not all(type(s) is int for s in strides):
            return False
        slot.strides = strides
        return True

    def once(self, key: str) -> bool:
        """True the first time ``key`` is asked (a condition one prologue needs once, as the global hooks')."""
        if key in self.asked:
            return False
        self.asked.add(key)
        return True

    def add(self, bsym) -> bool:
        """The check as an expression, or False when it is not one this module fuses: a plugin check asks its guard
        (:func:`thunder_subclass.guards.guard_of`), thunder's own checks are in ``_THUNDER_CHECKS``."""
        args = bsym.args
        if not args or not isinstance(args[0], Proxy) or any(isinstance(a, Proxy) for a in args[1:]):
            return False
        guard = guard_of(bsym)
        if guard is not None:
            cond = guard.expression(self.value(args[0]), self)
        else:
            render = _THUNDER_CHECKS.get(bsym.sym.id)
            cond = render(self, *args) if render is not None else None
        if cond is None or cond is False:
            return False
        self.conditions.extend(c for c in ((cond,) if isinstance(cond, str) else cond) if c)
        self.checks += 1
        return True

    def build(self) -> FusedChecks:
        params = ", ".join(f"v{i}" for i in range(len(self.values)))
        conditions = list(self.conditions)
        source = ""
        if self.slots:
            names = ", ".join(slot.x for slot in self.slots)
            ts = [f"t{i}" for i in range(len(self.slots))]
            body = " and\n        ".join(slot.condition(t, self.const) for slot, t in zip(self.slots, ts))
            source = f"def tensor_checks({', '.join(ts)}):\n    return bool(\n        {body}\n    )\n\n"
            conditions.append(f"(_tensor_guard({names}) or _tensor_checks({names}))")
            conditions.extend(self.after)
        body = " and\n        ".join(conditions)
        source += f"def fused_prologue_checks({params}):\n    return bool(\n        {body}\n    )\n"
        # for failure messages: each check in Python, the tensors' after the others (as the function runs them)
        shown = self.conditions + [slot.condition(slot.x, self.const) for slot in self.slots] + self.after
        namespace = dict(self.constants)  # every constant named above
        exec(compile(source, "<thunder_subclass fused prologue checks>", "exec"), namespace)
        if self.slots:
            dims = [slot.shape for slot in self.slots]
            namespace["_tensor_checks"] = _TensorChecks(namespace["tensor_checks"],
                                                        [slot.strides for slot in self.slots], namespace,
                                                        dims if any(None in d for d in dims) else None)
        return FusedChecks(namespace["fused_prologue_checks"], shown, source, tuple(p.name for p in self.values))


def _tensor_metadata(b: _Builder, t, shape, device, dtype, requires_grad):
    if not isinstance(device, str) or not isinstance(dtype, torch.dtype):
        return None
    if all(type(s) is int for s in shape):
        b.tensor(b.value(t), torch.Size(shape), dtype, torch.device(device), requires_grad, False, instance=True)
        return ""
    if not all(type(s) is int or isinstance(s, IntegerProxy) for s in shape):
        return None
    # symbolic sizes: the C++ guard with None for those dims, then each size equal to its number (which the prologue
    # unpacked before: from this tensor's shape, or a number that ties it to another input)
    x = b.value(t)
    b.tensor(x, tuple(s if type(s) is int else None for s in shape), dtype, torch.device(device), requires_grad,
             False, instance=True)
    b.after.append("(" + " and ".join(f"{x}.shape[{k}] == {b.value(s)}" for k, s in enumerate(shape)
                                      if type(s) is not int) + ")")
    return ""


def _number(b: _Builder, n, value):
    if not isinstance(value, Number):
        return None
    return _same_value_expr(b.value(n), b.const(value), b.const(type(value)), value)


# thunder's own prologue checks: symbol id -> (builder, *args) -> expression ("": checked with the tensors; None: not
# fused)
_THUNDER_CHECKS = {
    _P.CHECK_TENSOR_SHAPE_AND_METADATA: _tensor_metadata,
    _P.CHECK_NUMBER_TYPE_AND_VALUE: _number,
    _P.CHECK_STRING_VALUE: lambda b, x, value: f"({b.value(x)} == {b.const(value)})",
    _P.CHECK_LITERAL_LIKE: lambda b, x, value: f"({b.value(x)} == {b.const(value)})",
    _P.CHECK_LEN: lambda b, x, n: f"(len({b.value(x)}) == {b.const(n)})",
    _P.CHECK_NONE: lambda b, x: f"({b.value(x)} is None)",
    _P.CHECK_TYPE: lambda b, x, typ: f"(type({b.value(x)}) is {b.const(typ)})",
    _P.CHECK_INSTANCE: lambda b, x, typ: f"isinstance({b.value(x)}, {b.const(typ)})",
}


def _module_reads(trace) -> tuple[list, dict]:
    """The reads of the jitted module and of what is reached from it (``unpack_cache.STEP_KINDS``): their bound
    symbols, and each value's index (0: the module, ``globals()['__function_obj']``)."""
    index: dict[str, int] = {}
    reads = []
    for bsym in trace.bound_symbols:
        if bsym.sym.id == _P.UNPACK_FUNCTION_OBJ and not index and isinstance(bsym.output, Proxy):
            index[bsym.output.name] = 0
            continue
        kind = STEP_KINDS.get(bsym.sym.name)
        args = bsym.args
        if (kind is None or bsym.kwargs or not args or not isinstance(args[0], Proxy) or args[0].name not in index
                or len(args) != (1 if kind == "thunder_module" else 2) or any(isinstance(a, Proxy) for a in args[1:])
                or not isinstance(bsym.output, Proxy) or bsym.output.name in index):
            continue
        index[bsym.output.name] = len(index)
        reads.append(bsym)
    return reads, index


def _is_tensor_check(bsym) -> bool:
    guard = guard_of(bsym)
    if guard is None:
        return bsym.sym.id == _P.CHECK_TENSOR_SHAPE_AND_METADATA
    return type(guard).__module__ in ("thunder_subclass.guards.tensors", "thunder_subclass.guards.layouts")


def _add_module_check(builder: _Builder, bsym, index: dict) -> bool:
    """Adds ``bsym`` to the checks of the module reads when it checks one value read from the module and is not a
    tensor check, and its conditions stand alone (no tensor slot, no name bound for another condition)."""
    args = bsym.args
    if not args or not isinstance(args[0], Proxy) or args[0].name not in index or _is_tensor_check(bsym):
        return False
    before = (len(builder.conditions), len(builder.slots), builder.checks, set(builder.asked))
    if not builder.add(bsym):
        return False
    if len(builder.slots) == before[1] and not any("_w" in c for c in builder.conditions[before[0]:]):
        return True
    del builder.conditions[before[0]:], builder.slots[before[1]:]
    builder.checks, builder.asked = before[2], before[3]
    builder.slot_of = {k: v for k, v in builder.slot_of.items() if v in builder.slots}
    return False


def fuse_prologue_checks(trace):
    """``trace`` (a prologue) with its fusible checks replaced by one ``check_prologue`` before its return, and the
    checks of speculated values (``thunder_subclass.runtime.speculation``: they run operations on the inputs) after every
    other check, so that an input of another type or shape is rejected before they run. Where dict version tags are
    available the reads of the jitted module and their checks other than tensor checks become one ``read_module``
    symbol (:class:`~thunder_subclass.guards.unpack_cache.UnpackCache`: read once per write)."""
    reads, index = _module_reads(trace) if _thunder_internals.dict_version_reader() is not None else ([], {})
    builder, module_checks, kept, speculated = _Builder(), _Builder(), [], []
    for bsym in trace.bound_symbols:
        if bsym.sym.name == "check_speculation":
            speculated.append(bsym)
        elif reads and _add_module_check(module_checks, bsym, index):
            continue
        elif not builder.add(bsym):
            kept.append(bsym)
    if not kept or kept[-1].sym.id != _P.RETURN:
        return trace
    if reads:
        return _with_module_reads(trace, reads, index, builder, module_checks, kept, speculated)
    fused = builder.checks >= 2
    if fused:
        body = [*kept[:-1], check_prologue.bind(tuple(builder.values), builder.build(), output=None)]
    elif speculated:
        body = [b for b in trace.bound_symbols[:-1] if b.sym.name != "check_speculation"]
    else:
        return trace
    new = from_trace(trace)
    new.bound_symbols = [*body, *speculated, kept[-1]]
    if fused:
        new.set_provenance(TraceProvenance(f"Fused {builder.checks} prologue checks (thunder_subclass)"))
    return new


def _with_module_reads(trace, reads, index, builder, module_checks, kept, speculated):
    read_ids = {id(b) for b in reads}
    rest = [b for b in kept[:-1] if id(b) not in read_ids]
    check = [check_prologue.bind(tuple(builder.values), builder.build(), output=None)] if builder.checks else []
    used = {p.name for b in [*rest, *check, *speculated, kept[-1]] for p in b.flat_proxy_args}
    proxies = {b.output.name: b.output for b in reads}
    exports = [name for name in index if name in used and name in proxies]
    steps = [(STEP_KINDS[b.sym.name], index[b.output.name], index[b.args[0].name],
              b.args[1] if len(b.args) > 1 else None) for b in reads]
    checks = module_checks.build() if module_checks.checks else None
    cache = UnpackCache(steps, len(index), [index[n] for n in exports], checks,
                        [index[p.name] for p in module_checks.values])
    unpack = read_module.bind(next(b.output for b in trace.bound_symbols if b.sym.id == _P.UNPACK_FUNCTION_OBJ),
                                cache, output=tuple(proxies[n] for n in exports) if exports else None)
    new = from_trace(trace)
    # right after the first unpack of the function object (read_module's argument): every use of what it reads comes
    # after that (a later unpack of the same object, a guarded object's, may follow those uses)
    pos = min(i for i, b in enumerate(rest) if b.sym.id == _P.UNPACK_FUNCTION_OBJ) + 1
    new.bound_symbols = [*rest[:pos], unpack, *rest[pos:], *check, *speculated, kept[-1]]
    new.set_provenance(TraceProvenance(
        f"Fused {builder.checks} prologue checks, {len(reads)} module reads and {module_checks.checks} of their checks "
        "read once per write (thunder_subclass)"))
    return new


class FusedPrologueChecks(Transform):
    """The transform ``thunder_subclass.jit`` appends: :func:`fuse_prologue_checks` on each new prologue."""

    def transform_traces_pre_prologue(self, prologue_trace, computation_trace, epilogue_trace, **kwargs):
        return fuse_prologue_checks(prologue_trace), computation_trace, epilogue_trace
