"""Stage 3, prologue guards on Python state that thunder's unpacking of the inputs leaves unchecked.

In: a value traced code read that thunder neither proxies nor checks in the prologue. Out: a prologue check that
holds on every call what the trace assumed about it; a call for which it fails is a cache miss and a new trace.

* An empty module slot (``self.bias`` of a ``Linear(bias=False)``, a buffer or submodule registered as None): thunder
  unpacks a parameter, buffer or submodule found in a module's ``_parameters`` / ``_buffers`` / ``_modules`` table,
  but records nothing for None, so a trace made for a bias-free module was reused for a biased one of the same
  sizes (under every cache option: the sizes matched, or were symbolic) and the bias was dropped. Assumption: the
  slot is still there and still None; checked every call (:class:`EmptyModuleSlot`) on the module (the
  user's, not thunder's ``ThunderModule`` wrapper). The other way round needs no new check: thunder's prologue
  fetches a parameter with ``get_parameter(name)``, which raises for None (a miss).
"""

from __future__ import annotations

import thunder.core.prims as prims

from thunder_subclass import _thunder_internals
from thunder_subclass.executor import subclass_executor
from thunder_subclass.guards import SubclassGuardFailure

__all__ = ["EmptyModuleSlot", "check_module_slot_empty", "guard_module_slot"]

_TABLE_KIND = {"_parameters": "parameter", "_buffers": "buffer", "_modules": "submodule"}


class EmptyModuleSlot:
    """The guard of one empty slot: a module's ``table`` (``"_parameters"``, ``"_buffers"``, ``"_modules"``) holds
    None at ``name``. Called on the module it answers whether that still holds (the fused prologue calls it so);
    :meth:`explain` says what is there instead; stored on disk by its table and name."""

    __slots__ = ("table", "name")

    def __init__(self, table: str, name: str):
        self.table, self.name = table, name

    def __repr__(self) -> str:
        return f"EmptyModuleSlot({self.table}[{self.name!r}])"

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

    def disk_state(self) -> tuple:  # thunder_subclass.disk_cache
        return self.table, self.name

    @classmethod
    def from_disk_state(cls, state: tuple) -> "EmptyModuleSlot":
        return cls(*state)


def _check_module_slot_empty_impl(module, slot: EmptyModuleSlot) -> None:
    if not slot(module):
        raise SubclassGuardFailure(slot.explain(module))


check_module_slot_empty = subclass_executor.register_operator(
    "check_module_slot_empty", meta=lambda module, slot: None, fn=_check_module_slot_empty_impl,
    tags=[prims.OpTags.DONT_DCE],
)


def guard_module_slot(obj, provenance) -> bool:
    """When ``provenance`` reads a module's parameter, buffer or submodule slot: guard it if it is empty (``obj`` is
    None; a tensor or module there is thunder's to check) and return True; else False (not such a read)."""
    from thunder.core.proxies import AnyProxy

    slot = _thunder_internals.module_slot_of(provenance)
    if slot is None:
        return False
    state = _thunder_internals.jit_state()
    jit_ctx = _thunder_internals.jit_context()
    if obj is not None or state is None or jit_ctx is None:
        return True
    module_record, table, name = slot
    seen = state.setdefault("empty_module_slots", set())
    if (id(module_record), table, name) in seen:
        return True
    seen.add((id(module_record), table, name))
    state.setdefault("empty_module_slot_records", []).append(module_record)  # its id stays its own
    holder = AnyProxy(None, prefix="module_with_empty_slot", history=module_record)
    jit_ctx.add_constraint((check_module_slot_empty, holder, EmptyModuleSlot(table, name)))
    return True
