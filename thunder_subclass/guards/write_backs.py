"""Write-backs: input lists and dicts the traced code changed get their new contents from the epilogue, every call.

In: the containers read from the inputs while tracing (``guards.object_reads`` records them with their contents
then). What happens at the end of a trace (:func:`write_back_input_containers`): a changed one is put back as it was,
and its new contents become a plan (old items by position, the computation's results, literals). Out: a
``write_back_container(obj, plan, *values)`` call in the epilogue, which gives the caller's object those contents as
eager leaves them, and for a container a module holds, a length or keys check in the prologue.
"""

from __future__ import annotations

import torch

from thunder_subclass import _thunder_internals
from thunder_subclass.guards.container_writes import same_items, set_contents
from thunder_subclass.errors import format_location
from thunder_subclass.guards.objects import ObjectSpec, Pending, check_object, describe_provenance, guarded_object_names
from thunder_subclass.guards.protocol import register_epilogue_op

__all__ = ["write_back_input_containers", "write_back_container", "is_held_container", "restore_container"]


_LITERAL_TYPES = (int, float, bool, str, type(None))


def write_back_input_containers() -> None:
    """At the end of a trace: an input list or dict (an argument, or one reached from the arguments or the module, read
    by traced code) that the traced code changed (``d["y"] = x * 2``, ``lst.append(t)``, ``lst[0] = t``, ``d.update``,
    ``del``, ``pop``, ...) holds the trace's proxies now. It is put back as it was (the prologue of the first call sees
    the caller's object as passed), and the epilogue gives the caller's object its new contents every call, with the
    computed tensors (``write_back_container``), as eager leaves them. A new item that is neither a tensor, a number
    proxy, a plain constant nor an item the container had raises ``UnsupportedTracingError``."""
    from thunder.core.proxies import Proxy

    state = _thunder_internals.jit_state()
    if state is None:
        return
    for obj, provenance, before, location in state.get("input_containers", ()):
        is_dict = type(obj) is dict
        after = list(obj.items()) if is_dict else list(obj)
        if same_items(after, before, is_dict):
            continue
        positions = {}  # id of an item (dict: key or value) the container had -> its position then
        for i, item in enumerate(before):
            for part, v in ((0, item[0]), (1, item[1])) if is_dict else ((1, item),):
                positions.setdefault((part, id(v)), i)
        values: list = []

        def source(v, part):
            i = positions.get((part, id(v))) if part is not None else None
            if i is not None:
                return ("o", i)
            if isinstance(v, Proxy):
                values.append(v)
                return ("v", len(values) - 1)
            if type(v) in _LITERAL_TYPES:
                return ("c", v)
            if type(v) in (list, tuple):  # made in the traced code: made anew each call
                return ("list" if type(v) is list else "tuple", tuple(source(i, None) for i in v))
            if type(v) is dict:
                return ("dict", tuple((source(k, None), source(i, None)) for k, i in v.items()))
            from thunder_subclass.errors import UnsupportedTracingError

            raise UnsupportedTracingError(
                f"the compiled function stores a {type(v).__qualname__} made in the compiled code into "
                f"{describe_provenance(provenance)}, a {type(obj).__name__} it was passed ("
                f"{_where_read(location)}): thunder_subclass gives the caller's containers the tensors, numbers, "
                "strings and lists, tuples and dicts of them stored into them, as eager does, but not other objects "
                "made in the compiled code. Return the object instead and store it outside the compiled function."
            )

        plan = tuple((source(k, 0), source(v, 1)) for k, v in after) if is_dict else tuple(source(v, 1) for v in after)
        restore_container(obj, before)
        _thunder_internals.call_in_epilogue(write_back_container, provenance, plan, *values)
        if id(obj) in state.get("held_containers", ()):
            # (a container a submodule holds is not guarded by its length or keys on reading; the plan rests on them)
            from thunder.core.proxies import AnyProxy

            spec = ObjectSpec("keys" if is_dict else "length", type(obj), Pending(obj), describe_provenance(provenance))
            name = f"guarded_object{next(guarded_object_names)}"
            _thunder_internals.jit_context().add_constraint(
                (check_object, AnyProxy(obj, name=name, history=provenance), spec))


def is_held_container(provenance) -> bool:
    """Whether ``provenance`` ends in an item or a non-dunder attribute (a container an object holds, not a
    ``__dict__`` or ``__globals__`` the interpreter reads on its way)."""
    import dis

    inst = provenance.inst.opname if isinstance(provenance.inst, dis.Instruction) else \
        getattr(provenance.inst, "name", None)
    if inst == "BINARY_SUBSCR":
        return True
    name = getattr(provenance.inputs[1], "value", None) if inst == "LOAD_ATTR" and len(provenance.inputs) == 2 else None
    return isinstance(name, str) and not (name.startswith("__") and name.endswith("__"))


def restore_container(obj, before: list) -> None:
    set_contents(obj, before)  # (only what differs: the container may be shared with other threads)


def _where_read(location: tuple) -> str:
    """``read at file:line``, or for an argument (read as the frame starts: no line) the compiled function's own
    ``def`` line."""
    if location[0] is not None:
        return f"read at {format_location(*location)}"
    import inspect

    fn = getattr(_thunder_internals.current_compile_data()[0], "fn", None)
    fn = getattr(fn, "forward", fn) if isinstance(fn, torch.nn.Module) else fn
    code = getattr(inspect.unwrap(fn), "__code__", None) if fn is not None else None
    if code is None:
        return "an argument"
    return f"an argument of {code.co_name} at {format_location(code.co_filename, code.co_firstlineno)}"


def _write_back_container_impl(obj, plan: tuple, *values) -> None:
    def value(src, old, part):
        kind, x = src
        if kind == "o":
            return old[x][part] if part is not None else old[x]
        if kind == "v":
            return values[x]
        if kind == "list" or kind == "tuple":
            items = [value(i, old, part) for i in x]
            return items if kind == "list" else tuple(items)
        if kind == "dict":
            return {value(k, old, part): value(i, old, part) for k, i in x}
        return x

    if type(obj) is dict:
        old = list(obj.items())
        set_contents(obj, [(value(k, old, 0), value(v, old, 1)) for k, v in plan])
    else:
        old = list(obj)
        set_contents(obj, [value(v, old, None) for v in plan])


# in the epilogue: the caller's input list/dict gets the contents the traced code left in it, each item taken from its
# old contents ("o", position), the computation's results ("v", index into values) or a literal ("c", value)
write_back_container = register_epilogue_op("write_back_container", ("obj", "plan", "*values"),
                                           _write_back_container_impl)


