"""Extension points of stages 5 (autograd) and 6 (flatten and executors): grad rules and executor implementations
for (subclass type, torch op) pairs.

* :func:`register_grad_rule` — how a torch operation on a subclass is differentiated, replacing the default (PyTorch's
  derivative run through ``__torch_dispatch__``, ``thunder_subclass.transforms.autograd``). The rule follows thunder's
  ``OperatorExecutor.register_implementation(..., grad_transform=...)`` convention: called with the operation's
  arguments (proxies; subclass values are ``SubclassTensorProxy``), it computes the forward with thunder symbols,
  reads output gradients with ``thunder.core.transforms.get_grad`` and writes input gradients with ``put_grad``.
* :func:`register_implementation` — an executor *claims* the operation: its ``execution_transform`` replaces the
  unrolled aten-level subsymbols in the execution trace (e.g. a fused int8 GEMM instead of dequantize + matmul).

Which rule applies: the operation's subclass arguments are looked at in order; for each, its type and then its base
classes (``type(x).__mro__``) are tried, so **a rule registered for a base class applies to every subclass of it
that has no rule of its own**, and the first subclass argument with a matching rule decides. A rule registered with
``executor=`` is active only in jits whose executor list holds that executor, and wins over a rule without one;
among executors the one listed first wins.

``op`` may be a torch callable (``torch.mul``, ``torch.nn.functional.linear``, ``torch.Tensor.mul``) or the thunder
torch symbol (``thunder.torch.mul``); ``torch.mul``, ``Tensor.mul`` and ``a * b`` all reach ``thunder.torch.mul``, so
one rule covers all three.

Example::

    import torch, thunder_subclass
    from thunder.core.transforms import get_grad, put_grad
    import thunder.torch as ltorch

    @thunder_subclass.register_grad_rule(TwoTensor, torch.mul)
    def mul_rule(a, b):
        out = ltorch.mul(a, b)            # the forward, unrolled through dispatch as usual
        g = get_grad(out)
        put_grad(a, g * b * 3)            # a recognisably different derivative
        put_grad(b, g * a)
        return out

    ...
    mul_rule.remove()                     # or: with thunder_subclass.register_grad_rule(...): ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from thunder.core.compile_data import get_compile_data
from thunder.core.pytree import tree_flatten
from thunder.core.symbol import Symbol

from thunder_subclass._thunder_internals import torch_to_thunder_symbols
from thunder_subclass.errors import SubclassGradRuleError, SubclassRegistrationError, format_location
from thunder_subclass.frontend.interpretation import construct_subclass
from thunder_subclass.frontend.proxy import SubclassTensorProxy

__all__ = ["register_grad_rule", "register_implementation", "RuleHandle", "make_subclass"]


class RuleHandle:
    """What the registration functions return: ``.remove()`` unregisters; usable as a context manager (the rule is
    removed on exit) and, for grad rules registered with the decorator form, callable as the rule itself."""

    def __init__(self, table: dict, key: tuple, entry: _Entry):
        self._table, self._key, self.entry = table, key, entry
        self.__wrapped__ = entry.fn
        self.__doc__ = getattr(entry.fn, "__doc__", None)

    @property
    def active(self) -> bool:
        return any(e is self.entry for e in self._table.get(self._key, ()))

    def remove(self) -> None:
        entries = self._table.get(self._key, [])
        self._table[self._key] = [e for e in entries if e is not self.entry]
        if not self._table[self._key]:
            del self._table[self._key]

    def __call__(self, *args, **kwargs):
        return self.entry.fn(*args, **kwargs)

    def __enter__(self) -> RuleHandle:
        return self

    def __exit__(self, *exc) -> None:
        if self.active:
            self.remove()

    def __repr__(self) -> str:
        return f"<{self.entry.kind} {self.entry.name} for ({self.entry.subclass_type.__name__}, {self.entry.op_name})>"


class _Entry:
    def __init__(self, kind, subclass_type, op_name, fn, executor, checker=None):
        self.kind, self.subclass_type, self.op_name, self.fn = kind, subclass_type, op_name, fn
        self.executor, self.checker = executor, checker
        self.name = getattr(fn, "__qualname__", repr(fn))


_grad_rules: dict[tuple[type, Any, Any], list[_Entry]] = {}
_implementations: dict[tuple[type, Any, Any], list[_Entry]] = {}


def has_registrations() -> bool:
    """Whether any grad rule or executor implementation is registered now (the on-disk cache,
    ``thunder_subclass.runtime.disk_cache``, neither stores nor loads while one is: what a trace holds depends on them)."""
    return any(_grad_rules.values()) or any(_implementations.values())


def resolve_symbol(op: Any) -> Symbol:
    """The thunder torch symbol that ``op`` (a torch callable or a thunder symbol) is traced as."""
    if isinstance(op, Symbol):
        return op
    sym = torch_to_thunder_symbols().get(op) if _hashable(op) else None
    if not isinstance(sym, Symbol):
        raise SubclassRegistrationError(
            f"{getattr(op, '__qualname__', op)!r} is not a torch operation thunder traces as a symbol; pass a torch "
            "function or Tensor method (torch.mul, torch.nn.functional.linear, torch.Tensor.mul) or a thunder.torch "
            "symbol."
        )
    return sym


def _hashable(x) -> bool:
    try:
        hash(x)
        return True
    except TypeError:
        return False


def _check_subclass_type(subclass_type) -> None:
    if not (isinstance(subclass_type, type) and issubclass(subclass_type, torch.Tensor)):
        raise SubclassRegistrationError(f"subclass_type must be a torch.Tensor subclass, got {subclass_type!r}")


def _register(table, kind, subclass_type, op, fn, executor, allow_override, checker=None) -> RuleHandle:
    _check_subclass_type(subclass_type)
    sym = resolve_symbol(op)
    key = (subclass_type, sym.id, executor)
    entries = table.get(key, [])
    if entries and not allow_override:
        raise ValueError(
            f"a {kind} for ({subclass_type.__qualname__}, {sym.name})"
            f"{'' if executor is None else f' and executor {executor.name}'} is already registered "
            f"({entries[-1].name}); remove it first (handle.remove()) or pass allow_override=True."
        )
    entry = _Entry(kind, subclass_type, sym.name, fn, executor, checker)
    table[key] = [entry]
    return RuleHandle(table, key, entry)


def register_grad_rule(subclass_type: type, op: Any, grad_transform: Callable | None = None, /, *,
                       executor=None, allow_override: bool = False):
    """Differentiate ``op`` on ``subclass_type`` (and its subclasses without a rule) with ``grad_transform``.

    Call form ``register_grad_rule(TwoTensor, torch.mul, rule)`` returns a :class:`RuleHandle`; decorator form
    ``@register_grad_rule(TwoTensor, torch.mul)`` replaces the function by its handle. ``executor``: active only in
    jits using that executor. A second registration for the same (type, op, executor) raises ``ValueError`` unless
    ``allow_override=True``. See the module docstring for the convention ``grad_transform`` follows.
    """
    if grad_transform is None:
        return lambda fn: register_grad_rule(subclass_type, op, fn, executor=executor, allow_override=allow_override)
    return _register(_grad_rules, "grad rule", subclass_type, op, grad_transform, executor, allow_override)


def register_implementation(subclass_type: type, op: Any, execution_transform: Callable | None = None, /, *,
                            executor, checker: Callable | None = None, allow_override: bool = False):
    """Let ``executor`` run ``op`` on ``subclass_type`` itself: in the execution trace, ``execution_transform``
    (called with the operation's arguments, recording the executor's symbols; read inner tensors as ``x.attr``,
    build subclass results with :func:`make_subclass`) replaces the unrolled aten-level subsymbols, when
    ``executor`` is among the jit's executors and ``checker(*args, **kwargs)`` (if given) is true.
    Returns a :class:`RuleHandle`; usable as a decorator like :func:`register_grad_rule`.
    """
    if executor is None:
        raise SubclassRegistrationError("register_implementation needs the executor that claims the operation (executor=...)")
    if execution_transform is None:
        return lambda fn: register_implementation(subclass_type, op, fn, executor=executor, checker=checker,
                                                  allow_override=allow_override)
    return _register(_implementations, "implementation", subclass_type, op, execution_transform, executor,
                     allow_override, checker)


def make_subclass(cls: type, *args, **kwargs):
    """``cls(*args, **kwargs)`` on proxies inside a grad rule or an execution transform: the constructor runs on
    fakes and is recorded (its aten calls, then ``unflatten_<cls>``), as when traced code constructs a subclass."""
    return construct_subclass(cls, *args, **kwargs)


# ---------------------------------------------------------------------------------------------------------------
# Lookup (used by thunder_subclass.transforms.autograd and thunder_subclass.transforms.flatten)
# ---------------------------------------------------------------------------------------------------------------


def _find(table, sym_id, args, kwargs, *, use_checker: bool) -> _Entry | None:
    if not table:
        return None
    cd = get_compile_data()
    executors = list(cd.executors_list) if cd is not None else []

    def rank(e: _Entry):
        return executors.index(e.executor) if e.executor is not None else len(executors)

    for a in tree_flatten((args, kwargs))[0]:
        if not isinstance(a, SubclassTensorProxy):
            continue
        for cls in a.subclass_type.__mro__:
            candidates = [e for ex in [*executors, None] for e in table.get((cls, sym_id, ex), ())]
            if use_checker:
                candidates = [e for e in candidates if e.checker is None or e.checker(*args, **kwargs)]
            if candidates:
                return min(candidates, key=rank)
    return None


def find_grad_rule(sym_id, args, kwargs) -> _Entry | None:
    return _find(_grad_rules, sym_id, args, kwargs, use_checker=False)


def find_implementation(sym_id, args, kwargs) -> _Entry | None:
    return _find(_implementations, sym_id, args, kwargs, use_checker=True)


def call_rule(entry: _Entry, args, kwargs):
    """Run a user's rule, turning its exceptions (including typed errors of the subclass operations it calls) into
    :class:`SubclassGradRuleError` naming the rule, its source line, the subclass and the op."""
    try:
        return entry.fn(*args, **kwargs)
    except SubclassGradRuleError:
        raise
    except Exception as e:
        raise SubclassGradRuleError(
            f"{entry.kind} {entry.name} for ({entry.subclass_type.__qualname__}, {entry.op_name}) raised "
            f"{type(e).__name__} at {_rule_location(entry.fn, e)}: {e}\nFix the rule, or remove it "
            "(handle.remove()) to use the default."
        ) from e


def _rule_location(fn: Callable, e: BaseException) -> str:
    """The rule's source line where ``e`` left it (its innermost frame in the traceback), else its definition."""
    code = getattr(fn, "__code__", None)
    lineno = None
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            lineno = tb.tb_lineno
        tb = tb.tb_next
    if code is None:
        return format_location(None, None)
    return format_location(code.co_filename, lineno if lineno is not None else code.co_firstlineno)
