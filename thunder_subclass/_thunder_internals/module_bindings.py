"""The parameter, buffer and submodule tables of a plugin jit's ``ThunderModule``, kept bound to the module as it is
now (:class:`ModuleBindings`).

* ``core/module.py`` ``ThunderModule`` tables of parameters, buffers and submodules (private state, filled once by
  thunder) — refilled when the module's own ``_parameters``, ``_buffers`` or ``_modules`` changed: a parameter or
  submodule replaced after compiling is what the next call reads. The check runs before every call of the fast path
  (``runtime.fast_call_path``) and of the bound (``thunder_subclass.runtime.cache_policy.bounded``).

Owner of state: each :class:`ModuleBindings` belongs to the compiled module's per-call wrapper and holds the module
weakly; the generated check holds the dicts it reads (the module's own).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["ModuleBindings"]


class ModuleBindings:
    """The parameter, buffer and submodule tables of a plugin jit's ``ThunderModule`` (``_overrides_parameters``,
    ``_overrides_buffers``, ``_module_cache``: thunder 0.2.6 fills them once, in ``ThunderModule.__init__``,
    ``core/module.py``, and the prologue reads parameters, buffers and submodules from them every call), kept bound
    to the compiled module as it is now. :meth:`refresh`, called before each call, checks that every entry of each
    submodule's ``_parameters``, ``_buffers`` and ``_modules`` is the object it was when the tables were last filled
    (one generated expression, an identity test per entry), and fills them again when one was replaced, added or
    removed (``m.bias = nn.Parameter(...)``, ``m.weight = <another subclass>``, ``m.block = Block()``): the
    prologue then reads the new objects, whose checks make the call a hit (same kind of tensor: the new values are
    used) or a miss (a new trace of the module as it is). Entries a transform put in the tables (objects the module
    does not hold) are kept. Owned by the compiled module's per-call wrapper; holds the module weakly."""

    __slots__ = ("_module", "_check", "_own")

    def __init__(self, tm):
        import weakref

        self._module = weakref.ref(tm)
        self._own: set = set()
        self._check = None
        self._fill(tm, initial=True)

    def refresh(self) -> None:
        if not self._check():
            tm = self._module()
            if tm is not None:
                self._fill(tm, initial=False)

    def _fill(self, tm, initial: bool) -> None:
        model = tm._model
        modules = dict(model.named_modules(remove_duplicate=False))
        params = dict(model.named_parameters(remove_duplicate=False))
        buffers = dict(model.named_buffers(remove_duplicate=False))
        tables = ((tm._overrides_parameters, "p", params), (tm._overrides_buffers, "b", buffers))
        if initial:  # what thunder's tables hold of the module's own (not a transform's replacement)
            self._own = {(kind, k) for table, kind, live in tables for k, v in table.items() if live.get(k) is v}
        else:
            for table, kind, live in tables:
                for k in [k for k in table if (kind, k) in self._own and k not in live]:
                    del table[k]
                for k, v in live.items():
                    if (kind, k) in self._own or k not in table:
                        table[k] = v
                        self._own.add((kind, k))
            tm._module_cache.clear()
            tm._module_cache.update(modules)
        self._check = _identity_check(modules.values())


def _identity_check(modules) -> Callable[[], bool]:
    """A generated function, true while each module in ``modules`` has the same entries in its ``_parameters``,
    ``_buffers`` and ``_modules`` as now (the same objects, and no more): each dict's version tag is the one it has
    now (``dict_versions``: one C call per dict, whatever it holds), or, where tags are not available, its length and
    each entry compared."""
    from thunder_subclass._thunder_internals.dict_versions import dict_version_reader

    dict_version = dict_version_reader()
    consts: dict = {"_version": dict_version}
    conditions: list[str] = []
    seen: set = set()
    for m in modules:
        if id(m) in seen:
            continue
        seen.add(id(m))
        for d in (m._parameters, m._buffers, m._modules):
            name = f"d{len(consts)}"
            consts[name] = d
            if dict_version is not None and type(d) is dict:
                conditions.append(f"_version({name}) == {dict_version(d)}")
                continue
            conditions.append(f"len({name}) == {len(d)}")
            for k, v in d.items():
                value = f"c{len(consts)}"
                consts[value] = v
                conditions.append(f"{name}.get({k!r}) is {value}")
    source = "def is_current():\n    return " + (" and ".join(conditions) or "True") + "\n"
    namespace = dict(consts)
    exec(compile(source, "<thunder_subclass module bindings>", "exec"), namespace)
    return namespace["is_current"]
