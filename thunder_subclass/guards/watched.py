"""Stage 3 (inputs and guards) at run time, object checks run once per write instead of once per call:
:class:`WatchedCheck`.

In: an object guard whose check compares an object's value (``"equal"``: ``obj == snapshot``; ``"state"``: its
state read recursively, ``values.same_state``), which the prologue runs on every call: on a Hugging Face model the
model config (about sixty attributes, each read through transformers' ``__getattribute__``) was compared twice per
call. What happens: :class:`WatchedCheck` wraps that check and records the dict version tags of what it read (below).
Out: the same check, run in full only when something it depends on may have changed since the last call it
accepted; otherwise a few C-level reads of dict version tags (``_thunder_internals.dict_version_reader``).

Why that is the same answer. The full check is a function of the object's state: its attributes (its ``__dict__``),
the values they hold (dicts and tuples by their items, instances by their ``__dict__``), and the attributes of the
classes involved (methods included), as long as no code that runs reads anything else: :func:`_watch` accepts an
object only when every value it reaches is a number, string, ``None``, dtype or device (immutable), a tuple or
frozenset of such values, a ``dict`` (exact type), or an instance of Python classes none of which has ``__slots__``
or its own ``__dict__`` attribute, nor a ``__getattribute__``, ``__getattr__``, ``__eq__`` or ``__ne__`` of its own
(the default ones read only the instance and its classes; a dataclass's generated ``__eq__`` compares its fields,
read as attributes), unless the class is in :data:`STATE_ONLY_CLASSES`
(classes whose own methods of these names read only the instance's and the classes' attributes: transformers'
config classes). Anything else (a list, a set, a tensor, a function, a module, a class with slots...) has no
version tag, and the object is checked in full on every call, as before. Before the full check runs,
:func:`_watch` records the tag of every dict it reached (the instances' ``__dict__``, the nested dicts, the dicts
of the classes in each instance's MRO), the identity of each instance's type, MRO and ``__dict__``; after the
check accepts the object these records are kept. A later call compares them: the same object (held weakly), every
tag unchanged, every type, MRO and ``__dict__`` the same object. A write of any kind (``setattr``,
``object.__setattr__``, ``vars(obj)[k] = ...``, ``obj.__dict__.update``, ``del obj.x``, a nested ``dict`` changed,
``Cls.attr = ...``, ``obj.__class__ = ...``, ``obj.__dict__ = {...}``, ``Cls.__bases__ = ...``) fails one of these
comparisons, and the check runs in full again. A write between the recording and the full check changes a tag too
(the tags are read first).

Owner: one per guard in a fused prologue (``FusedChecks``' namespace), holding the last accepted object weakly and
its dicts strongly (forgotten when the object is freed). Where dict version tags are not available (not CPython 3.11)
:func:`watched` returns the check unchanged.
"""

from __future__ import annotations

import types
import weakref

import torch

from thunder_subclass import _thunder_internals
from thunder_subclass.guards.values import SCALARS

__all__ = ["STATE_ONLY_CLASSES", "StateCheck", "WatchedCheck", "watch_records", "watched"]

# (module, qualname) of classes whose own __getattribute__, __getattr__, __eq__ and __ne__ read only the instance's
# attributes and its classes' (read in transformers 5.24; PretrainedConfig is its older name): attribute_map lookups and
# __eq__ comparing the __dict__s
STATE_ONLY_CLASSES = frozenset({
    ("transformers.configuration_utils", "PreTrainedConfig"),
    ("transformers.configuration_utils", "PretrainedConfig"),
    ("transformers.integrations.heterogeneity.configuration_utils", "HeterogeneousConfigMixin"),
})

_IMMUTABLE = SCALARS | {torch.dtype, torch.device}
_SPECIAL = ("__getattribute__", "__getattr__", "__eq__", "__ne__", "__slots__")
_HEAPTYPE = 1 << 9
_LIMIT = 512  # the most values one watch reaches; a bigger object is checked in full


class _NotWatchable(Exception):
    pass


def _class_ok(cls: type) -> bool:
    if cls is object:
        return True
    if not cls.__flags__ & _HEAPTYPE:  # a builtin class under a Python one (dict, list...): state outside __dict__
        return False
    own = cls.__dict__
    if "__dict__" in own and type(own["__dict__"]) is not types.GetSetDescriptorType:
        return False
    if (cls.__module__, cls.__qualname__) in STATE_ONLY_CLASSES:
        return True
    slots = own.get("__slots__", ())
    return not slots and not any(name in own and not (name == "__eq__" and _is_dataclass_eq(cls, own[name]))
                                 for name in _SPECIAL[:-1])


def _is_dataclass_eq(cls: type, eq) -> bool:
    """Whether ``eq`` is the ``__eq__`` ``dataclasses`` made for ``cls``: it compares the fields, read as attributes."""
    import dataclasses

    code = getattr(eq, "__code__", None)
    return (dataclasses.is_dataclass(cls) and code is not None and code.co_filename == "<string>"
            and eq.__qualname__ == f"{cls.__qualname__}.__eq__")


def _watch(obj, dict_version) -> tuple | None:
    """``(instances, dicts)`` of ``obj``: each instance it reaches as ``(instance, type, mro, __dict__)``, each dict
    as ``(dict, version tag)``; None when it reaches a value without a version tag (see the module's text)."""
    instances, dicts, seen, classes = [], [], set(), set()
    count = 0

    def visit(v):
        nonlocal count
        count += 1
        if count > _LIMIT:
            raise _NotWatchable
        t = type(v)
        if t in _IMMUTABLE:
            return
        if id(v) in seen:
            return
        seen.add(id(v))
        if t is dict:
            dicts.append((v, dict_version(v)))
            for key, item in v.items():
                visit(key)
                visit(item)
            return
        if t is tuple or t is frozenset:
            for item in v:
                visit(item)
            return
        mro = t.__mro__
        if isinstance(v, (type, types.ModuleType, torch.Tensor)) or not all(_class_ok(c) for c in mro):
            raise _NotWatchable
        d = object.__getattribute__(v, "__dict__")
        if type(d) is not dict:
            raise _NotWatchable
        instances.append((v, t, mro, d))
        dicts.append((d, dict_version(d)))
        for c in mro[:-1]:
            if c not in classes:
                classes.add(c)
                cd = _thunder_internals.class_dict(c)
                if cd is None:
                    raise _NotWatchable
                dicts.append((cd, dict_version(cd)))
        for item in list(d.values()):
            visit(item)

    try:
        visit(obj)
    except _NotWatchable:
        return None
    if not instances and not dicts:
        return None  # an immutable value: nothing to watch (its check is cheap)
    return tuple(instances), tuple(dicts)


def watch_records(obj, dict_version) -> tuple | None:
    """``(instances, dicts)``: what a full check of ``obj``'s state depends on (see the module's text), or None when
    it cannot be watched (also read by ``guards.unpack_cache``)."""
    return _watch(obj, dict_version)


class StateCheck:
    """An ``"equal"`` or ``"state"`` spec's full check (``spec.matches``) as a callable of the fused prologue (which
    :func:`watched` wraps), which also says what changed when a miss is explained (``FusedChecks.failure`` calls
    ``explain``)."""

    __slots__ = ("spec",)

    def __init__(self, spec):
        self.spec = spec

    def __call__(self, obj) -> bool:
        return self.spec.matches(obj)

    def explain(self, obj) -> str:
        return self.spec.explain(obj)

    def __repr__(self) -> str:
        return f"<state check of the {self.spec.where or 'object'}>"


def _forget(check_ref, _):
    check = check_ref()
    if check is not None:
        check.last = None


class WatchedCheck:
    """``check(obj)`` (a guard's full check, ``obj -> bool``) run only when ``obj`` may have changed since the last
    object it accepted (see the module's text); ``explain`` and ``disk_state`` are the wrapped check's."""

    __slots__ = ("check", "dict_version", "last", "__weakref__")

    def __init__(self, check, dict_version):
        self.check, self.dict_version, self.last = check, dict_version, None

    def __call__(self, obj) -> bool:
        last = self.last
        if last is not None and last[0]() is obj:
            version = self.dict_version
            instances, dicts = last[1]
            if all(version(d) == tag for d, tag in dicts) and all(
                    type(v) is t and t.__mro__ is mro and object.__getattribute__(v, "__dict__") is d
                    for v, t, mro, d in instances):
                return True
        watch = _watch(obj, self.dict_version)  # (read before the full check: a write after it changes a tag)
        accepted = self.check(obj)
        self.last = None
        if accepted and watch is not None:
            try:
                self.last = (weakref.ref(obj, _forget.__get__(weakref.ref(self))), watch)
            except TypeError:  # an object without weak references is checked in full every call
                pass
        return accepted

    def explain(self, obj) -> str:
        return self.check.explain(obj)

    def __repr__(self) -> str:
        return f"<watched {self.check!r}>"

    def disk_state(self):  # thunder_subclass.runtime.disk_cache: an "equal" guard's spec (a new process watches anew)
        spec = getattr(self.check, "spec", None)
        return (spec,) if getattr(spec, "kind", None) == "equal" else NotImplemented

    @classmethod
    def from_disk_state(cls, state) -> "WatchedCheck":
        return watched(StateCheck(state[0]))


def watched(check):
    """``check`` run once per write (:class:`WatchedCheck`) where dict version tags are available, else ``check``."""
    dict_version = _thunder_internals.dict_version_reader()
    return check if dict_version is None else WatchedCheck(check, dict_version)
