"""Stage 3b, a cheaper prologue: a cache entry's checks run as one generated function instead of one call each.

In: the prologue trace thunder built for a ``thunder_subclass.jit`` call (unpacking of arguments, parameters, module
attributes and the per-call cache info, each followed by its check). Out: the same unpacking, and before the return
ONE ``check_prologue`` bound symbol whose argument is a :class:`FusedChecks`: a Python function generated for this
trace from the checks it replaces, each one an inline expression with the same meaning as the check it stands for:

* thunder's ``check_tensor_metadata`` (a ``torch.Tensor`` with this shape, device, dtype and requires_grad),
  ``check_number_type_and_value`` (same type, equal or both NaN), ``check_string_value``, ``check_literal_like``
  (``==``), ``check_len``, ``check_none``, ``check_type`` and ``check_instance``;
* the plugin's ``check_subclass`` (:meth:`thunder_subclass.guards.SubclassSpec.matches`, inlined by
  :meth:`~thunder_subclass.guards.SubclassSpec.expression`), ``check_plain_tensor``, ``check_tensor_strides``,
  ``check_no_dispatch_mode`` and ``check_module_hooks`` (a module without hooks:
  ``_thunder_internals.has_no_module_hooks``).

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
from thunder.core.proxies import Proxy
from thunder.core.trace import from_trace, TraceProvenance
from thunder.core.transform_common import Transform

from thunder_subclass.executor import subclass_executor
from thunder_subclass.guards import (
    MISSING,
    SubclassGuardFailure,
    is_same_value,
    check_no_dispatch_mode,
    check_plain_tensor,
    check_module_hooks,
    check_tensor_strides,
    check_subclass,
)
from thunder_subclass._thunder_internals import has_no_module_hooks, module_forward_hooks
from thunder_subclass.proxy import PLAIN_TENSOR_TYPES

__all__ = ["FusedChecks", "FusedPrologueChecks", "check_prologue", "fuse_prologue_checks"]

_P = prims.PrimIDs


class FusedChecks:
    """The checks of one prologue as one function of the checked values (``fn``), with the text of each check for
    error messages. Not printable as a literal: thunder passes it to the prologue as a global."""

    __slots__ = ("fn", "conditions", "source")

    def __init__(self, fn, conditions: list[str], source: str):
        self.fn, self.conditions, self.source = fn, conditions, source

    def __repr__(self) -> str:
        return f"FusedChecks({len(self.conditions)} checks)"

    def failure(self, values: tuple) -> str:
        namespace = dict(self.fn.__globals__)
        namespace.update({f"v{i}": v for i, v in enumerate(values)})
        for cond in self.conditions:
            try:
                ok = eval(cond, namespace)
            except Exception as e:  # noqa: BLE001 - reported as the failing check
                return f"prologue check `{cond}` raised {type(e).__name__}: {e}"
            if not ok:
                return f"prologue check `{cond}` failed"
        return "prologue check failed"


def _check_prologue_impl(values: tuple, checks: FusedChecks) -> None:
    if not checks.fn(*values):
        raise SubclassGuardFailure(checks.failure(values))


# DONT_DCE: no output, and dead-code elimination must keep it in the prologue
check_prologue = subclass_executor.register_operator(
    "check_prologue", meta=lambda values, checks: None, fn=_check_prologue_impl, tags=[prims.OpTags.DONT_DCE]
)


def _same_value_expr(v: str, c: str, typ: str, value: Any) -> str:
    # thunder's check_number_type_and_value: type(n) == type(v) and (n == v or (n != n and v != v))
    if value != value:  # NaN
        return f"(type({v}) is {typ} and {v} != {v})"
    return f"(type({v}) is {typ} and {v} == {c})"


class _Builder:
    def __init__(self):
        self.values: list[Proxy] = []
        self.value_index: dict[str, int] = {}
        self.constants: dict[str, Any] = {"_Tensor": torch.Tensor, "_plain": PLAIN_TENSOR_TYPES,
                                          "_dispatch_depth": torch._C._len_torch_dispatch_stack,
                                          "_same": is_same_value, "_MISSING": MISSING,
                                          "_no_hooks": has_no_module_hooks, "_hooks": module_forward_hooks}
        self.conditions: list[str] = []
        self.locals = 0

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

    def add(self, bsym) -> bool:
        """The check as an expression, or False when it is not one this module fuses."""
        sid, args = bsym.sym.id, bsym.args
        if not args or not isinstance(args[0], Proxy) or any(isinstance(a, Proxy) for a in args[1:]):
            return False
        if sid == check_module_hooks.id:  # guards.check_module_hooks
            v, hooks = self.value(args[0]), args[1].hooks
            self.conditions.append(f"_no_hooks({v})" if hooks == ((), ()) else f"(_hooks({v}) == {self.const(hooks)})")
        elif sid == check_subclass.id:
            self.conditions.append(args[1].expression(self.value(args[0]), self.const, self.fresh))
        elif sid == check_plain_tensor.id:
            self.conditions.append(f"type({self.value(args[0])}) in _plain")
        elif sid == check_tensor_strides.id:
            self.conditions.append(f"({self.value(args[0])}.stride() == {self.const(tuple(args[1]))})")
        elif sid == check_no_dispatch_mode.id:
            self.conditions.append(f"not ({self.const(args[1])}.involves_subclasses and _dispatch_depth())")
        elif sid == _P.CHECK_TENSOR_SHAPE_AND_METADATA:
            t, shape, device, dtype, requires_grad = args
            if not all(type(s) is int for s in shape) or not isinstance(device, str) or not isinstance(dtype, torch.dtype):
                return False
            v = self.value(t)
            self.conditions.append(
                f"(isinstance({v}, _Tensor) and {v}.shape == {self.const(tuple(shape))} and "
                f"{v}.device == {self.const(torch.device(device))} and {v}.dtype is {self.const(dtype)} and "
                f"{v}.requires_grad is {self.const(bool(requires_grad))})"
            )
        elif sid == _P.CHECK_NUMBER_TYPE_AND_VALUE:
            if not isinstance(args[1], Number):
                return False
            self.conditions.append(
                _same_value_expr(self.value(args[0]), self.const(args[1]), self.const(type(args[1])), args[1])
            )
        elif sid in (_P.CHECK_STRING_VALUE, _P.CHECK_LITERAL_LIKE):
            self.conditions.append(f"({self.value(args[0])} == {self.const(args[1])})")
        elif sid == _P.CHECK_LEN:
            self.conditions.append(f"(len({self.value(args[0])}) == {self.const(args[1])})")
        elif sid == _P.CHECK_NONE:
            self.conditions.append(f"({self.value(args[0])} is None)")
        elif sid == _P.CHECK_TYPE:
            self.conditions.append(f"(type({self.value(args[0])}) is {self.const(args[1])})")
        elif sid == _P.CHECK_INSTANCE:
            self.conditions.append(f"isinstance({self.value(args[0])}, {self.const(args[1])})")
        else:
            return False
        return True

    def build(self) -> FusedChecks:
        params = ", ".join(f"v{i}" for i in range(len(self.values)))
        body = " and\n        ".join(self.conditions)
        source = f"def fused_prologue_checks({params}):\n    return bool(\n        {body}\n    )\n"
        namespace = dict(self.constants)
        exec(compile(source, "<thunder_subclass fused prologue checks>", "exec"), namespace)
        return FusedChecks(namespace["fused_prologue_checks"], list(self.conditions), source)


def fuse_prologue_checks(trace):
    """``trace`` (a prologue) with its fusible checks replaced by one ``check_prologue`` before its return."""
    builder, kept = _Builder(), []
    for bsym in trace.bound_symbols:
        if not builder.add(bsym):
            kept.append(bsym)
    if len(builder.conditions) < 2 or not kept or kept[-1].sym.id != _P.RETURN:
        return trace
    checks = builder.build()
    new = from_trace(trace)
    new.bound_symbols = [*kept[:-1], check_prologue.bind(tuple(builder.values), checks, output=None), kept[-1]]
    new.set_provenance(TraceProvenance(f"Fused {len(builder.conditions)} prologue checks (thunder_subclass)"))
    return new


class FusedPrologueChecks(Transform):
    """The transform ``thunder_subclass.jit`` appends: :func:`fuse_prologue_checks` on each new prologue."""

    def transform_traces_pre_prologue(self, prologue_trace, computation_trace, epilogue_trace, **kwargs):
        return fuse_prologue_checks(prologue_trace), computation_trace, epilogue_trace
