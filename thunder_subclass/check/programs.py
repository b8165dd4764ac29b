"""The programs the subclass checker runs on a sample: the default operation set and the user's function.

In: a sample subclass instance. Out: :class:`Program` s, each a function of the sample and of plain operands made
for it (deterministically, from its outer size and dtype), and :func:`eager_applicable`: the programs eager PyTorch
itself runs on the sample, with their results. A program eager rejects does not apply to the subclass and is left
out by every check (noted in the report, never flagged).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["Program", "default_programs", "user_program", "operands_for", "eager_applicable"]


@dataclasses.dataclass(frozen=True)
class Program:
    """``fn(sample, *operands(sample))``; ``functional``: it must leave its inputs unchanged."""

    name: str
    fn: Callable[..., Any]
    operands: Callable[[torch.Tensor], tuple] = lambda x: ()
    functional: bool = True

    def __call__(self, x: torch.Tensor, *operands: Any) -> Any:
        return self.fn(x, *operands)


def _plain(shape, dtype, seed: int = 0) -> torch.Tensor:
    """A plain CPU tensor of ``shape``: random for floating dtypes, small integers otherwise (deterministic)."""
    g = torch.Generator().manual_seed(1234 + seed)
    if dtype.is_floating_point and dtype.itemsize > 1:
        return torch.randn(tuple(shape), generator=g, dtype=torch.float32).to(dtype)
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(tuple(shape), generator=g).to(torch.float32)
    return torch.randint(-3, 4, tuple(shape), generator=g).to(dtype if dtype != torch.bool else torch.int64)


def _on(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return t.to(x.device) if x.device.type in ("cpu", "meta") else t


def _like(x: torch.Tensor) -> tuple:
    return (_on(x, _plain(x.shape, x.dtype)),)


def _matmul_rhs(x: torch.Tensor) -> tuple:
    return (_on(x, _plain((x.shape[-1], 3), x.dtype)),)


def _linear_input(x: torch.Tensor) -> tuple:
    return (_on(x, _plain((2, x.shape[-1]), x.dtype)),)


def _other_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float32 else torch.float32


def default_programs() -> list[Program]:
    """clone, detach, views, elementwise ops with a plain tensor and with scalars, reductions, matmul and linear (the
    sample as the weight), ``to(dtype)``."""
    return [
        Program("clone", lambda x: x.clone()),
        Program("detach", lambda x: x.detach()),
        Program("view(-1)", lambda x: x.view(-1)),
        Program("transpose(0, 1)", lambda x: x.transpose(0, 1)),
        Program("unsqueeze(0)", lambda x: x.unsqueeze(0)),
        Program("x[0]", lambda x: x[0]),
        Program("narrow(0, 0, 1)", lambda x: x.narrow(0, 0, 1)),
        Program("x + tensor", lambda x, y: x + y, _like),
        Program("tensor * x", lambda x, y: y * x, _like),
        Program("x * 2", lambda x: x * 2),
        Program("x + 1", lambda x: x + 1),
        Program("sum()", lambda x: x.sum()),
        Program("sum(0)", lambda x: x.sum(0)),
        Program("mean(-1)", lambda x: x.mean(-1)),
        Program("x @ tensor", lambda x, y: x @ y, _matmul_rhs),
        Program("linear(tensor, x)", lambda x, y: F.linear(y, x), _linear_input),
        Program("to(dtype)", lambda x: x.to(_other_dtype(x))),
    ]


def user_program(fn: Callable[[torch.Tensor], Any]) -> Program:
    """``fn`` as a program, named ``fn (name)`` after its ``__name__`` (``fn`` for a lambda)."""
    name = getattr(fn, "__name__", "fn")
    return Program(f"fn ({name})" if name != "<lambda>" else "fn", lambda x: fn(x))


def operands_for(program: Program, x: torch.Tensor) -> tuple | None:
    """The program's plain operands for ``x``; None when they cannot be made (a shape without a last size)."""
    try:
        return program.operands(x)
    except Exception:
        return None


@dataclasses.dataclass
class Applied:
    """A program eager ran on ``sample``: its ``result``, and the first inner tensor of the sample it changed."""

    program: Program
    operands: tuple
    sample: torch.Tensor
    result: Any
    changed: str | None


def eager_applicable(programs: list[Program], make: Callable[[], torch.Tensor]) -> tuple[list[Applied], list[str]]:
    """The programs eager runs on a fresh sample from ``make`` (:class:`Applied`), and the names (with eager's
    error) of those it does not."""
    from thunder_subclass.check.values import changed_inner, clone_inner

    applies, skipped = [], []
    for program in programs:
        x = make()
        operands = operands_for(program, x)
        if operands is None:
            skipped.append(f"{program.name} (no operands for this shape)")
            continue
        before = clone_inner(x)
        try:
            result = program(x, *operands)
        except Exception as e:
            skipped.append(f"{program.name} ({type(e).__name__})")
            continue
        applies.append(Applied(program, operands, x, result, changed_inner(x, before) if program.functional else None))
    return applies, skipped
