"""The checks that compile: ops, grads and dynamic (and the cache-hit half of guards).

In: the programs eager ran on a sample (:class:`~thunder_subclass.check.programs.Applied`), the sample factory and
the report. What happens: each program is compiled with ``thunder_subclass.jit`` and run on a fresh sample; its
results are compared with eager's (values, types, layouts) and its input with a copy taken before; a second equal
sample must hit the cache; gradients through the same programs are compared with eager's; a sample of another size
must reuse the trace. Out: findings added to the report.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import thunder
import torch

from thunder_subclass.check.programs import Applied, Program
from thunder_subclass.check.report import SubclassReport
from thunder_subclass.check.values import (
    changed_inner,
    clone_inner,
    difference,
    flatten,
    plain_structure,
)

__all__ = ["check_ops", "check_grads", "check_dynamic"]


def _miss_reason(jf) -> str:
    """The last cache miss's first reason, in the readable form (names and values) where the text has one."""
    import thunder_subclass

    reasons = thunder_subclass.last_miss_reasons(jf)
    if not reasons:
        return "no reason recorded"
    text = reasons[0]
    start = text.find("(that is, `")
    if start >= 0:
        end = text.find("`)", start)
        text = "prologue check " + text[start + len("(that is, "):end + 1] + " failed"
    return text if len(text) <= 600 else text[:600] + "..."


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


def check_ops(report: SubclassReport, make: Callable[[int], torch.Tensor], applied: list[Applied]) -> list[Applied]:
    """Each program compiled equals eager; functional programs leave their input unchanged (in eager and compiled).
    Returns the programs that compiled and agreed (the grads check reuses them)."""
    import thunder_subclass

    name = type(applied[0].sample).__qualname__ if applied else "the subclass"
    passed, hit_checked = [], False
    for a in applied:
        label = a.program.name
        if a.changed:
            report.add("ops", f"{label}: a functional operation must leave its input unchanged; in eager it changed "
                              f"the {name}'s inner tensor {a.changed!r}. Fix: in __torch_dispatch__, compute results "
                              f"into new tensors (no in-place ops on the inputs' inner tensors) except for in-place "
                              f"operations (names ending in '_').")
            continue
        x = make(0)
        before = clone_inner(x)
        # a graph break would run it eagerly; disk_cache=False: the check traces (an entry another check, or an earlier
        # run, stored would not show how this subclass compiles now) and leaves nothing in the user's cache
        jf = thunder_subclass.jit(a.program.fn, fullgraph=True, disk_cache=False)
        try:
            result = jf(x, *a.operands)
        except Exception as e:
            report.add("ops", f"{label}: compiled with thunder_subclass.jit it must run as in eager; it raised "
                              f"{_short(e)} (the error names the line to fix; where it names none in the subclass, "
                              f"look it up in thunder_subclass's docs/limits.md)")
            continue
        d = difference(result, a.result, exact=False)
        if d:
            report.add("ops", f"{label}: compiled, the result must equal eager's in values, type and layout; {d}.")
            continue
        changed = changed_inner(x, before)
        if changed:
            report.add("ops", f"{label}: compiled, a functional operation must leave its input unchanged; it changed "
                              f"the inner tensor {changed!r}.")
            continue
        passed.append(a)
        if not hit_checked:
            hit_checked = True
            jf(make(0), *a.operands)
            if thunder.cache_misses(jf) != 1:
                report.add("guards", f"{label}: a second call with an equal {name} (make_sample(0) again) must reuse "
                                     f"the cached trace; it was traced again ({_miss_reason(jf)}). Fix: make the "
                                     f"flatten context compare equal (==) for equal instances.")
    report.note("ops", f"{len(passed)} of {len(applied)} programs equal eager compiled")
    return passed


def _loss(out: Any) -> Any:
    """The sum of the floating tensors in ``out`` (summed by their own ``sum``)."""
    leaves = out if isinstance(out, (tuple, list)) else (out,)
    total = None
    for t in leaves:
        if isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.requires_grad:
            s = t.sum()
            total = s if total is None else total + s
    return total


def _floating(out: Any) -> bool:
    leaves = out if isinstance(out, (tuple, list)) else (out,)
    return any(isinstance(t, torch.Tensor) and t.dtype.is_floating_point for t in leaves)


def _grad_program(program: Program) -> Callable:
    def loss(x, *operands):
        out = _loss(program(x, *operands))
        return out if out is not None else x.new_zeros(())

    return loss


class _NoGradient(Exception):
    """The program's floating result does not require grad although its input does: gradients stop."""


def _grad_of(fn: Callable, x: torch.Tensor, operands: tuple) -> Any:
    x.requires_grad_(True)
    loss = fn(x, *operands)
    if not loss.requires_grad:
        raise _NoGradient
    (g,) = torch.autograd.grad(loss, x, allow_unused=True)
    return g


def check_grads(report: SubclassReport, make: Callable[[int], torch.Tensor], passed: list[Applied]) -> None:
    """Gradients through each program that compiled equal eager's, in value and type, and reach the subclass."""
    import thunder_subclass

    name = type(passed[0].sample).__qualname__ if passed else "the subclass"
    compared, skipped = 0, []

    for a in passed:
        label, fn = a.program.name, _grad_program(a.program)
        if not _floating(a.result) or a.program.name == "detach":
            continue  # nothing to differentiate
        try:
            expected = _grad_of(fn, make(0), a.operands)
        except _NoGradient:
            report.add("grads", f"{label}: the {name} requires grad and the operation is differentiable, but its "
                                f"floating result does not require grad in eager: gradients stop at the subclass. "
                                f"Fix: implement the operation in __torch_dispatch__ (below autograd), or in "
                                f"__torch_function__ with differentiable torch calls on the instance (not under "
                                f"no_grad / on detached inner tensors); pass grads=False if the subclass is for "
                                f"inference only.")
            continue
        except Exception as e:
            skipped.append(f"{label} ({type(e).__name__})")
            continue
        try:
            got = _grad_of(thunder_subclass.jit(fn, fullgraph=True, disk_cache=False), make(0), a.operands)
        except _NoGradient:
            got = None
        except Exception as e:
            report.add("grads", f"{label}: the gradient of {name} through the compiled program must be computed as "
                                f"in eager; it raised {_short(e)}")
            continue
        compared += 1
        if got is None:
            report.add("grads", f"{label}: eager gives the {name} a gradient; compiled gives none (the gradient does "
                                f"not reach it).")
            continue
        # layouts of gradients are free (eager's sum backward gives an expanded gradient, compilers a dense one)
        d = difference(got, expected, exact=False, where="the gradient", strides=False)
        if d:
            report.add("grads", f"{label}: the gradient of the {name} must equal eager's; {d}. Fix: the backward "
                                f"operations' dispatch must compute what eager's does on the inner tensors.")
    report.note("grads", f"{compared} gradients compared with eager's"
                + (f"; eager cannot differentiate: {', '.join(skipped)}" if skipped else ""))


def check_dynamic(report: SubclassReport, make: Callable[[int], torch.Tensor], passed: list[Applied],
                  fn_program: Program | None) -> None:
    """A sample of another size reuses the trace of the first (``dynamic=True``) where eager semantics allow: the
    two samples' flatten contexts agree apart from sizes."""
    import thunder_subclass

    from thunder_subclass.check.programs import operands_for

    x0 = make(0)
    other = next(((s, t) for s in (1, 2, 3) for t in [make(s)] if tuple(t.shape) != tuple(x0.shape)), None)
    if other is None:
        report.skip("dynamic", "make_sample gives one size for seeds 0-3: give seed 1 another size to check it")
        return
    seed, x1 = other
    candidates = [fn_program] if fn_program is not None else []
    by_name = {a.program.name: a.program for a in passed}
    candidates += [by_name[n] for n in ("x * 2", "x + 1", "clone", "detach") if n in by_name]
    program = next((p for p in candidates if p is not None), None)
    if program is None:
        report.skip("dynamic", "no elementwise program applies to the sample")
        return
    ops0, ops1 = operands_for(program, x0), operands_for(program, x1)
    try:
        expected = program(make(seed), *ops1)
    except Exception as e:
        report.skip("dynamic", f"eager cannot run {program.name} on make_sample({seed}) ({type(e).__name__})")
        return
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # thunder calls its symbolic values experimental
            jf = thunder_subclass.jit(program.fn, dynamic=True, fullgraph=True, disk_cache=False)
            jf(x0, *ops0)
            got = jf(x1, *ops1)
    except Exception as e:
        report.add("dynamic", f"{program.name}: compiled with dynamic=True, a sample of another size "
                              f"{tuple(x1.shape)} must run as in eager; it raised {_short(e)}")
        return
    d = difference(got, expected, exact=False)
    if d:
        report.add("dynamic", f"{program.name} on a sample of another size {tuple(x1.shape)}: {d}.")
        return
    misses = thunder.cache_misses(jf)
    if misses == 1:
        report.note("dynamic", f"{program.name}: sizes {tuple(x0.shape)} and {tuple(x1.shape)} share one trace")
        return
    c0, c1 = flatten(x0)[1], flatten(x1)[1]
    s0, s1 = (plain_structure(_without_sizes(c, t)) for c, t in ((c0, x0), (c1, x1)))
    if s0 != s1:
        report.note("dynamic", f"{program.name}: traced again for size {tuple(x1.shape)}, as it must be: the flatten "
                               f"contexts differ beyond sizes ({c0!r} vs {c1!r})")
        return
    report.add("dynamic", f"{program.name}: with dynamic=True a sample of another size ({tuple(x0.shape)} then "
                          f"{tuple(x1.shape)}) must reuse the trace, as its flatten contexts agree apart from sizes; "
                          f"it was traced again ({_miss_reason(jf)}). Fix: keep sizes out of the flatten context (pass "
                          f"them as outer_size to __tensor_unflatten__) and do not branch on sizes or read them as "
                          f"Python ints in __torch_dispatch__.")


def _without_sizes(ctx: Any, t: torch.Tensor) -> Any:
    """``ctx`` with the sample's sizes and strides (as tuples or single numbers) replaced by a marker."""
    plain = lambda seq: tuple(int(s) for s in seq if type(s) is int)  # nested ints left out
    shapes = (plain(t.shape), plain(t.stride()))
    numbers = set(shapes[0])

    def walk(v):
        if isinstance(v, (tuple, list, torch.Size)):
            if isinstance(v, torch.Size) or plain(v) in shapes and len(plain(v)) == len(v):
                return "<size>"
            return type(v)(walk(x) for x in v)
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if type(v) is int and v in numbers:
            return "<size>"
        return v

    return walk(ctx)
