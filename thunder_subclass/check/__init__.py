"""A contract checker for tensor wrapper subclass authors: ``check_subclass`` (an authoring tool beside the
pipeline; it compiles with ``thunder_subclass.jit`` as a user would).

In: ``make_sample(seed)``, a function giving one instance of the subclass per seed (the same type, other values;
for seed 1 ideally another size), and optionally a function of one instance to check beyond the defaults.
What happens, in order (each check compares with eager PyTorch on the same instances; an operation eager itself
rejects on the sample does not apply and is skipped, never flagged):

* ``flatten`` — ``__tensor_flatten__`` names tensor attributes, every tensor the instance holds, and
  ``__tensor_unflatten__`` rebuilds an equal instance, also for a view's outer size and strides (:mod:`.contract`);
* ``guards`` — contexts compare equal for equal instances, unequal for other values; an equal instance hits the cache;
* ``fake`` — the instance builds from fake inner tensors and the programs run on it with the real results' metadata;
* ``metadata`` — results' outer size, dtype, stride and device agree with the operations' meta functions;
* ``ops`` — the default programs (:mod:`.programs`) and ``fn`` compiled equal eager; functional ones change no input
  (:mod:`.compiled`);
* ``grads`` — for floating samples, gradients through the same programs equal eager's;
* ``dynamic`` — a sample of another size reuses the trace (``dynamic=True``) where eager semantics allow.

Out: a :class:`SubclassReport` (``.ok``, ``.findings``, ``str()`` a table), or with ``raise_on_failure=True`` a
:class:`~thunder_subclass.errors.SubclassContractError` carrying it. ``python -m thunder_subclass.check
module:factory`` runs it from a shell (:mod:`.__main__`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from thunder_subclass.check.report import CHECKS, Finding, SubclassReport
from thunder_subclass.errors import SubclassContractError

__all__ = ["check_subclass", "SubclassReport", "Finding", "SubclassContractError", "CHECKS"]


def check_subclass(
    make_sample: Callable[[int], torch.Tensor],
    fn: Callable[[torch.Tensor], Any] | None = None,
    *,
    ops: list | None = None,
    grads: bool | None = None,
    dynamic: bool = True,
    raise_on_failure: bool = False,
) -> SubclassReport:
    """Check the tensor subclass that ``make_sample(seed)`` builds against the rules compilers rely on.

    ``fn``: a function of one instance, checked (fake, metadata, ops, grads, dynamic) like the default programs; like
    them it must leave its input unchanged.
    ``ops``: the default programs to run, by name (``None``: all; ``[]``: none, only ``fn``); an entry that is a
    function of one instance is checked as a program of its own.
    ``grads``: compare gradients (``None``: when the sample's dtype is floating). ``dynamic``: check that another
    size reuses the trace. ``raise_on_failure``: raise :class:`SubclassContractError` when there are findings.

    Example::

        import torch
        import thunder_subclass
        from torch.testing._internal.two_tensor import TwoTensor

        def make_sample(seed):
            g = torch.Generator().manual_seed(seed)
            n = 4 + seed
            return TwoTensor(torch.randn(n, 3, generator=g), torch.randn(n, 3, generator=g))

        report = thunder_subclass.check_subclass(make_sample, ops=["clone", "x * 2"])
        assert report.ok, report
    """
    from thunder_subclass.check import compiled, contract, programs

    x = make_sample(0)
    report = SubclassReport(type(x).__qualname__)
    if not isinstance(x, torch.Tensor) or type(x) is torch.Tensor:
        raise TypeError(f"make_sample(0) must return an instance of a tensor subclass; it returned {type(x)!r}")

    def make(seed: int) -> torch.Tensor:
        with torch.no_grad():
            return make_sample(seed)

    clock = time.perf_counter()

    def timed(check: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        report.seconds[check] = report.seconds.get(check, 0.0) + now - clock
        clock = now

    usable = contract.check_flatten(report, x)
    timed("flatten")
    if not usable:
        for check in CHECKS[1:]:
            report.skip(check, "skipped: flatten / unflatten must work first")
        return _finish(report, raise_on_failure)
    contract.check_guards(report, make, x)
    timed("guards")

    chosen = programs.default_programs()
    if ops is not None:
        names = {o for o in ops if isinstance(o, str)}
        unknown = names - {p.name for p in chosen}
        if unknown:
            raise ValueError(f"unknown programs {sorted(unknown)}; the default set is {[p.name for p in chosen]}")
        chosen = [p for p in chosen if p.name in names]
        chosen += [programs.user_program(o) for o in ops if not isinstance(o, str)]
    fn_program = programs.user_program(fn) if fn is not None else None
    if fn_program is not None:
        chosen.append(fn_program)
    applied, skipped = programs.eager_applicable(chosen, lambda: make(0))
    if skipped:
        report.note("ops", f"eager rejects, skipped: {', '.join(skipped)}")
    if fn_program is not None and all(a.program is not fn_program for a in applied):
        report.add("ops", f"fn must run in eager on make_sample(0); it raised ({skipped[-1]})")
    timed("ops")

    flagged = contract.check_fake(report, x, applied)
    timed("fake")
    flagged |= contract.check_metadata(report, x, applied)
    timed("metadata")
    if not contract.context_equals_itself(x):
        for check in ("ops", "grads", "dynamic"):
            report.skip(check, "skipped: a compiled call cannot pass its own guards until the flatten context compares "
                               "equal to itself (guards)")
        return _finish(report, raise_on_failure)
    if flagged:  # their finding is above; compiling them would repeat it
        report.note("ops", f"not compiled (flagged above): {', '.join(sorted(flagged))}")
    passed = compiled.check_ops(report, make, [a for a in applied if a.program.name not in flagged])
    timed("ops")
    if grads is None:
        grads = x.dtype.is_floating_point and x.dtype.itemsize > 1
    if grads:
        compiled.check_grads(report, make, passed)
    else:
        report.skip("grads", "skipped (grads=False)" if grads is False and x.dtype.itemsize > 1 and
                    x.dtype.is_floating_point else f"skipped: the sample's dtype is {x.dtype}")
    timed("grads")
    if dynamic:
        compiled.check_dynamic(report, make, passed, fn_program)
    else:
        report.skip("dynamic", "skipped (dynamic=False)")
    timed("dynamic")
    return _finish(report, raise_on_failure)


def _finish(report: SubclassReport, raise_on_failure: bool) -> SubclassReport:
    if raise_on_failure:
        report.raise_on_failure()
    return report
