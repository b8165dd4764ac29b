"""Stage 3 (inputs and guards) at run time, the module half of a prologue read once per write: :class:`UnpackCache`.

In: the reads a prologue makes from the jitted module and what it reaches from it (thunder's ``unpack_submodule``,
``unpack_parameter``, ``unpack_buffer``, ``unpack_attr``, ``unpack_getitem`` of values rooted at the module:
``guards.prologue`` picks them) and the checks of the values read that are not tensor checks (types, numbers,
strings, ``None``, the module hooks, forward and empty slots, object guards). On a Hugging Face model these are
about 300 attribute reads (many through transformers' ``__getattribute__``) and 300 checks per call.
What happens: the first call runs them all, then records, for each read whose answer is a function of dicts it can
watch (below), those dicts' version tags, and for each check whose answer is a function of the values read and of
watched dicts, nothing more; the other reads and checks are run on every call (a generated function per set of
them). A later call compares the records (:class:`_Watch`: a few ``map`` calls of C functions) and, when all are
the same, reuses the values read; when one differs, everything runs again and is recorded anew.
Out: the values the rest of the prologue uses (arguments of the per-call checks, the computation's inputs), the
same objects a fresh read would give.

Which read is watched (``_Reader``). ``obj.name`` where every class of ``type(obj)`` is a Python class without
``__slots__``, without its own ``__dict__`` attribute and without its own ``__getattribute__`` or ``__getattr__``
(except ``nn.Module.__getattr__``, which reads the module's ``_parameters``, ``_buffers`` and ``_modules``, and the
classes of ``watched.STATE_ONLY_CLASSES``, transformers' configs), and ``name`` is found in the instance's
``__dict__``, in a module's three tables, or in a class's dict as a value that is not a descriptor (a property or a
method is read every call); ``d[k]`` of a ``dict`` or a ``tuple``; the module paths of thunder's unpacking (each
module on the path read so). The answer then depends only on: the instance's type, its classes' MRO, its
``__dict__`` (the object), the version tags of that ``__dict__``, of its classes' dicts, of the tables and dicts
read. Every kind of write (``setattr``, ``object.__setattr__``, ``vars(m)[k] = ...``, ``del``, ``Cls.attr = ...``,
``obj.__class__ = ...``, ``obj.__dict__ = {...}``, ``register_parameter``/``register_buffer``, ``load_state_dict(...,
assign=True)``, a submodule replaced) changes one of them. A read on a value that is not watched (a cell, a function,
a list, a tensor) and every read after it run each call. Tensors' metadata is never cached: it can change without a
write to any dict (``p.data = ...``, ``p.requires_grad_()``, ``p.resize_()``); their checks stay in the per-call
fused checks (``guards.prologue``).

Which check is watched (``_check_kind``): a type or ``is None`` check (the value is the same object, its type is
recorded), a number or string compared by value (immutable), the module's own hooks all empty (its four hook dicts'
tags recorded), ``ModuleForward`` and ``EmptyModuleSlot`` (the instance's ``__dict__`` and table recorded), an object
guard comparing state (``watched.watch_records``). Others, and every check of a value read each call, run each
call. Where dict version tags are not available every read and check runs each call, as before.
"""

from __future__ import annotations

import keyword
import operator
import re
import types
import weakref
from collections import OrderedDict
from itertools import repeat

import torch

from thunder_subclass import _thunder_internals
from thunder_subclass.guards import SubclassGuardFailure
from thunder_subclass.guards.state import EmptyModuleSlot, ModuleForward
from thunder_subclass.guards.values import SCALARS
from thunder_subclass.guards.watched import STATE_ONLY_CLASSES, WatchedCheck, watch_records

__all__ = ["UnpackCache", "STEP_KINDS"]

# thunder's unpacking prims a prologue reads the module with -> the step kind here
STEP_KINDS = {"unpack_thunder_module": "thunder_module", "unpack_submodule": "submodule",
              "unpack_parameter": "parameter", "unpack_buffer": "buffer", "unpack_attr": "attr",
              "unpack_getitem": "getitem"}

_HEAPTYPE = 1 << 9
_DICTS = (dict, OrderedDict)
_IMMUTABLE = frozenset(SCALARS | {torch.dtype, torch.device})
_MODULE_TABLES = ("_parameters", "_buffers", "_modules")
_OVERRIDES = {"submodule": "_module_cache", "parameter": "_overrides_parameters", "buffer": "_overrides_buffers"}
_mro = operator.attrgetter("__mro__")
_ABSENT = object()
_class_dicts: "weakref.WeakKeyDictionary[type, dict | None]" = weakref.WeakKeyDictionary()


def _class_dict(cls: type):
    try:
        return _class_dicts[cls]
    except KeyError:
        found = _class_dicts[cls] = _thunder_internals.class_dict(cls)
        return found


def _read_class_ok(cls: type) -> bool:
    if cls is object:
        return True
    if not cls.__flags__ & _HEAPTYPE:
        return False
    own = cls.__dict__
    if "__dict__" in own and type(own["__dict__"]) is not types.GetSetDescriptorType:
        return False
    if own.get("__slots__"):
        return False
    state_only = (cls.__module__, cls.__qualname__) in STATE_ONLY_CLASSES
    if "__getattribute__" in own and not state_only:
        return False
    return "__getattr__" not in own or state_only or cls is torch.nn.Module or cls is _thunder_module_type()


def _thunder_module_type() -> type:
    global _THUNDER_MODULE
    if _THUNDER_MODULE is None:
        _THUNDER_MODULE = _thunder_internals.thunder_module_lookup()[1]
    return _THUNDER_MODULE


_THUNDER_MODULE = None


class _Watch:
    """What one accepted unpacking depends on: dicts with their version tags, objects with their types, instances
    with their ``__dict__`` objects, classes with their MROs. :meth:`same` is True when none of it changed."""

    def __init__(self, dict_version):
        self.dv = dict_version
        self.dicts, self.tags, self.objs, self.types = [], [], [], []
        self.holders, self.holder_ids, self.classes, self.mros = [], [], [], []
        self._seen: set[int] = set()

    def dict(self, d) -> None:
        if ("d", id(d)) not in self._seen:
            self._seen.add(("d", id(d)))
            self.dicts.append(d)
            self.tags.append(self.dv(d))

    def typed(self, obj) -> None:
        """Record ``type(obj)`` (only instances of Python classes can change class)."""
        if type(obj).__flags__ & _HEAPTYPE and ("t", id(obj)) not in self._seen:
            self._seen.add(("t", id(obj)))
            self.objs.append(obj)
            self.types.append(type(obj))

    def instance(self, obj) -> dict | None:
        """Watch ``obj``'s attributes (its ``__dict__`` and its classes'); its ``__dict__``, or None when they
        cannot be watched."""
        t = type(obj)
        if isinstance(obj, (type, types.ModuleType, torch.Tensor)) or not all(map(_read_class_ok, t.__mro__)):
            return None
        try:
            d = object.__getattribute__(obj, "__dict__")
        except AttributeError:
            return None
        if type(d) is not dict:
            return None
        if ("i", id(obj)) in self._seen:
            return d
        for c in t.__mro__[:-1]:
            if ("c", id(c)) not in self._seen:
                cd = _class_dict(c)
                if cd is None:
                    return None
                self._seen.add(("c", id(c)))
                self.classes.append(c)
                self.mros.append(c.__mro__)
                self.dict(cd)
        self._seen.add(("i", id(obj)))
        self.typed(obj)
        self.holders.append(obj)
        self.holder_ids.append(id(d))
        self.dict(d)
        return d

    def absorb(self, records: tuple) -> None:
        """``watched.watch_records`` of an object's state."""
        instances, dicts = records
        for v, t, mro, d in instances:
            if ("i", id(v)) not in self._seen:
                self._seen.add(("i", id(v)))
                self.typed(v)
                self.holders.append(v)
                self.holder_ids.append(id(d))
            for c in mro[:-1]:
                if ("c", id(c)) not in self._seen:
                    self._seen.add(("c", id(c)))
                    self.classes.append(c)
                    self.mros.append(c.__mro__)
        for d, tag in dicts:
            if ("d", id(d)) not in self._seen:
                self._seen.add(("d", id(d)))
                self.dicts.append(d)
                self.tags.append(tag)

    def same(self) -> bool:
        return (list(map(self.dv, self.dicts)) == self.tags
                and list(map(type, self.objs)) == self.types
                and list(map(id, map(object.__getattribute__, self.holders, repeat("__dict__")))) == self.holder_ids
                and list(map(_mro, self.classes)) == self.mros)


class _Reader:
    """Which reads of one unpacking are watched (see the module's text)."""

    def __init__(self, watch: _Watch):
        self.w = watch

    def attr(self, obj, name: str):
        """``(value,)`` of ``obj.name`` when that read is watched (and recorded in the watch), else None."""
        found = self._lookup(obj, name)
        return found if found is not _ABSENT else None

    def absent(self, obj, name: str) -> bool:
        """Whether ``hasattr(obj, name)`` is False by a watched lookup (recorded in the watch)."""
        return self._lookup(obj, name) is _ABSENT

    def _lookup(self, obj, name: str):
        """``(value,)``, ``_ABSENT`` (no such attribute, by a lookup that reads only watched dicts), or None (not
        watched)."""
        d = self.w.instance(obj)
        if d is None:
            return None
        t = type(obj)
        if name == "__dict__":
            return (d,)
        if name == "__class__":
            return (t,)
        mro = t.__mro__
        look = name
        if any("__getattribute__" in c.__dict__ for c in mro[:-1]):
            # a config class (STATE_ONLY_CLASSES): attribute_map renames first; a heterogeneous config's per-layer
            # rules read another object
            if d.get("_heterogeneity_spec") is not None:
                return None
            if name != "attribute_map":
                amap = d["attribute_map"] if "attribute_map" in d else self._class_attr(mro, "attribute_map")[1]
                if type(amap) is dict:
                    self.w.dict(amap)
                    look = amap.get(name, name)
                    if type(look) is not str:
                        return None
                elif amap is not None:
                    return None
        found, value = self._class_attr(mro, look)
        if found and hasattr(type(value), "__get__"):
            return None  # a property, a method, a slot...: computed at each read
        if look in d:
            return (d[look],)
        if found:
            return (value,)
        tm_type = _thunder_module_type()
        if isinstance(obj, tm_type) and t.__getattr__ is tm_type.__getattr__:
            # thunder's ThunderModule.__getattr__: _model from its _modules, the rest from the _model
            mods = d.get("_modules")
            if type(mods) not in _DICTS or "_model" not in mods:
                return None
            self.w.dict(mods)
            return (mods["_model"],) if look == "_model" else self._lookup(mods["_model"], look)
        if isinstance(obj, torch.nn.Module):
            tables = [d.get(n) for n in _MODULE_TABLES]
            if not all(type(tab) in _DICTS for tab in tables):
                return None
            for tab in tables:
                self.w.dict(tab)
            for tab in tables:
                if look in tab:
                    return (tab[look],)
            return _ABSENT if t.__getattr__ is torch.nn.Module.__getattr__ else None
        return _ABSENT if not any("__getattr__" in c.__dict__ for c in mro[:-1]) else None

    @staticmethod
    def _class_attr(mro, name):
        for c in mro:
            own = c.__dict__
            if name in own:
                return True, own[name]
        return False, None

    def path(self, tm, kind: str, name: str):
        """``(value,)`` of thunder's ``ThunderModule.get_submodule/get_parameter/get_buffer(name)`` when watched."""
        tm_type = _thunder_module_type()
        if not isinstance(tm, tm_type) or getattr(type(tm), f"get_{kind}") is not getattr(tm_type, f"get_{kind}"):
            return None
        d = self.w.instance(tm)
        if d is None:
            return None
        overrides = d.get(_OVERRIDES[kind])
        if type(overrides) is not dict:
            return None
        self.w.dict(overrides)
        if name in overrides:
            return (overrides[name],)
        found = self.attr(tm, "_model")
        if found is None:
            return None
        mod = found[0]
        if kind == "submodule":
            atoms, last = (name.split(".") if name else []), None
        else:
            prefix, _, last = name.rpartition(".")
            atoms = prefix.split(".") if prefix else []
        for atom in atoms:
            found = self.attr(mod, atom)
            if found is None or not isinstance(found[0], torch.nn.Module):
                return None
            mod = found[0]
        if last is None:
            return (mod,)
        return self.attr(mod, last)


# a condition of the fused checks -> what its answer depends on (None: run every call)
_V = r"(v\d+)"
_C = r"(c\d+)"
_PATTERNS = [
    ("type", re.compile(rf"\(type\({_V}\) is {_C}\)")),
    ("type", re.compile(rf"isinstance\({_V}, {_C}\)")),
    ("identity", re.compile(rf"\({_V} is None\)")),
    ("identity", re.compile(rf"\({_V} is {_C}\)")),
    ("number", re.compile(rf"\(type\({_V}\) is {_C} and \1 (?:== {_C}|!= \1)\)")),
    ("scalar", re.compile(rf"\({_V} == {_C}\)")),
    ("hooks", re.compile(rf"not \({_V}\._forward_pre_hooks or \1\._forward_hooks or \1\._backward_hooks or "
                         rf"\1\._backward_pre_hooks\)")),
    ("call", re.compile(rf"{_C}\({_V}\)")),
    ("typed call", re.compile(rf"\(type\({_V}\) is {_C} and {_C}\(\1\)\)")),
    ("absent", re.compile(rf"\(not hasattr\({_V}, {_C}\)\)")),
]


def _check_kind(cond: str) -> tuple[str, str] | None:
    """``(kind, value name)`` of a condition this module can watch, else None."""
    for kind, pattern in _PATTERNS:
        m = pattern.fullmatch(cond)
        if m is not None:
            if kind == "call":
                return kind, m.group(2)
            return kind, m.group(1)
    return None


class UnpackCache:
    """The module reads of one prologue (``steps``: ``(kind, out, in, key)`` on a list of values whose first is the
    jitted module) and the checks of what they read (``checks``, a ``FusedChecks`` of the values ``check_args``
    index, or None): run in full when something they depend on may have changed, else reused (see the module's
    text). Called with the jitted module, it returns the values ``exports`` indexes."""

    def __init__(self, steps, n_values: int, exports, checks=None, check_args=()):
        self.steps = tuple(tuple(s) for s in steps)
        self.n_values, self.exports = n_values, tuple(exports)
        self.checks, self.check_args = checks, tuple(check_args)
        self.namespace = dict(checks.fn.__globals__) if checks is not None else {}
        self.keys: list = []
        self.namespace["_thunder_module"] = _thunder_internals.thunder_module_lookup()[0]
        self.unpack = self._compile(self._unpack_source(), "unpack")
        self.dict_version = _thunder_internals.dict_version_reader()
        self.hits: dict[tuple, object] = {}  # (rerun steps, rerun checks) -> generated per-call function
        self.current = None  # (module, values, watch, per-call function)

    def __repr__(self) -> str:
        return f"UnpackCache({len(self.steps)} reads)"

    # -- generated code ---------------------------------------------------------------------------------------------

    def _key(self, key) -> str:
        self.namespace[f"_k{len(self.keys)}"] = key
        self.keys.append(key)
        return f"_k{len(self.keys) - 1}"

    def _line(self, step, src, dst: str) -> str:
        kind, _, i, key = step
        x = src(i)
        if kind == "thunder_module":
            return f"{dst} = _thunder_module({x})"
        if kind in ("submodule", "parameter", "buffer"):
            return f"{dst} = {x}.get_{kind}({self._key(key)})"
        if kind == "attr":
            if key.isidentifier() and not keyword.iskeyword(key) and not key.startswith("__"):
                return f"{dst} = {x}.{key}"
            return f"{dst} = getattr({x}, {self._key(key)})"
        return f"{dst} = {x}[{self._key(key)}]"

    def _unpack_source(self) -> str:
        lines = [self._line(s, lambda i: f"x{i}", f"x{s[1]}") for s in self.steps]
        values = ", ".join(f"x{i}" for i in range(self.n_values))
        body = "\n    ".join(lines + [f"return [{values}]"])
        return f"def unpack(x0):\n    {body}\n"

    def _compile(self, source: str, name: str):
        exec(compile(source, f"<thunder_subclass {name}>", "exec"), self.namespace)
        return self.namespace.pop(name)

    def _hit_function(self, rerun_steps: frozenset, rerun_checks: tuple):
        """``hit(x)``: the reads in ``rerun_steps`` run again on the cached values ``x``, the checks (indexes into
        ``checks.conditions``) in ``rerun_checks`` run, and the exported values (None when a check fails)."""
        computed = set()
        lines = []

        def src(i):
            return f"y{i}" if i in computed else f"x[{i}]"

        for s in self.steps:
            if s[1] in rerun_steps:
                lines.append(self._line(s, src, f"y{s[1]}"))
                computed.add(s[1])
        if rerun_checks:
            for j, i in enumerate(self.check_args):
                lines.append(f"v{j} = {src(i)}")
            conds = " and ".join(self.checks.conditions[k] for k in rerun_checks)
            lines.append(f"if not ({conds}):\n        return None")
        out = ", ".join(src(i) for i in self.exports)
        lines.append(f"return ({out}{',' if len(self.exports) == 1 else ''})")
        return self._compile("def hit(x):\n    " + "\n    ".join(lines) + "\n", "hit")

    # -- run time ---------------------------------------------------------------------------------------------------

    def __call__(self, module):
        current = self.current
        if current is not None and current[0] is module and current[2].same():
            out = current[3](current[1])
            if out is not None:
                return out
        return self.refresh(module)

    def refresh(self, module):
        """Every read and check run; what they depend on recorded (when it can be) for the next calls."""
        self.current = None
        values = self.unpack(module)
        if self.checks is not None:
            args = [values[i] for i in self.check_args]
            if not self.checks.fn(*args):
                checks = self.checks
                raise SubclassGuardFailure(explain=lambda: checks.failure(args),
                                           int_changed=lambda: checks.first_failure_is_int_value(args))
        if self.dict_version is None:
            return tuple(values[i] for i in self.exports)
        watch = _Watch(self.dict_version)
        rerun_steps = self._classify_steps(values, _Reader(watch))
        rerun_checks = self._classify_checks(values, rerun_steps, watch)
        key = (rerun_steps, rerun_checks)
        hit = self.hits.get(key)
        if hit is None:
            hit = self.hits[key] = self._hit_function(rerun_steps, rerun_checks)
        self.current = (module, values, watch, hit)
        return tuple(values[i] for i in self.exports)  # (the values just read and checked)

    def _classify_steps(self, values, reader: _Reader) -> frozenset:
        """The output indexes of the reads to run again each call."""
        rerun = set()
        for kind, out, i, key in self.steps:
            found = None
            if i not in rerun:
                try:
                    if kind == "thunder_module":
                        _, _, tmap = _thunder_internals.thunder_module_lookup()
                        ref = tmap.get(id(values[i])) if tmap is not None else None
                        if ref is not None and ref() is values[out]:
                            reader.w.dict(tmap)
                            found = (values[out],)
                    elif kind in _OVERRIDES:
                        found = reader.path(values[i], kind, key)
                    elif kind == "attr":
                        found = reader.attr(values[i], key)
                    elif type(values[i]) in _DICTS:
                        reader.w.dict(values[i])
                        found = (values[i][key],)
                    elif type(values[i]) is tuple:
                        found = (values[i][key],)
                except Exception:  # noqa: BLE001 - a read that does not answer as the prologue's did: run each call
                    found = None
            if found is None or found[0] is not values[out]:
                rerun.add(out)
        return frozenset(rerun)

    def _classify_checks(self, values, rerun_steps: frozenset, watch: _Watch) -> tuple:
        """The indexes (into ``checks.conditions``) of the checks to run each call."""
        if self.checks is None:
            return ()
        rerun = []
        constants = self.checks.fn.__globals__
        for k, cond in enumerate(self.checks.conditions):
            found = _check_kind(cond)
            ok = False
            if found is not None:
                kind, v = found
                i = self.check_args[int(v[1:])]
                if i not in rerun_steps:
                    ok = self._watch_check(kind, cond, values[i], constants, watch)
            if not ok:
                rerun.append(k)
        return tuple(rerun)

    @staticmethod
    def _watch_check(kind: str, cond: str, value, constants: dict, watch: _Watch) -> bool:
        if kind == "identity":
            return True
        if kind == "type":
            watch.typed(value)
            return True
        if kind == "number" or kind == "scalar":
            return type(value) in _IMMUTABLE
        if kind == "absent":
            name = constants.get(re.findall(r"\bc\d+\b", cond)[-1])
            return type(name) is str and _Reader(watch).absent(value, name)
        if kind == "hooks":  # four reads from the module's __dict__: cheaper each call than four version tags
            return False
        fn = constants.get(re.findall(r"\bc\d+\b", cond)[-1])
        if kind == "typed call":
            watch.typed(value)
        if isinstance(fn, (ModuleForward, EmptyModuleSlot)):
            user = _thunder_internals.user_module(value)
            if user is not value and watch.instance(value) is None:
                return False
            d = watch.instance(user)
            if d is None:
                return False
            if isinstance(fn, EmptyModuleSlot):
                table = d.get(fn.table)
                if type(table) not in _DICTS:
                    return False
                watch.dict(table)
            return True
        if isinstance(fn, WatchedCheck) and watch.dv is not None:
            if type(value) in _IMMUTABLE:
                return True
            records = watch_records(value, watch.dv)
            if records is None:
                return False
            watch.absorb(records)
            return True
        return False

    # -- the on-disk cache ------------------------------------------------------------------------------------------

    def disk_state(self) -> tuple:  # thunder_subclass.runtime.disk_cache: a new process reads and records anew
        return self.steps, self.n_values, self.exports, self.checks, self.check_args

    @classmethod
    def from_disk_state(cls, state: tuple) -> "UnpackCache":
        steps, n_values, exports, checks, check_args = state
        return cls(steps, n_values, exports, checks, check_args)
