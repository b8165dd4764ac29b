"""The subclass checker's results: findings, one verdict per check, the report and its table.

In: what each check of :mod:`thunder_subclass.check` observed. Out: a :class:`SubclassReport` (``.ok``,
``.findings``, ``str()`` a table of check, verdict and detail) and, on request, a :class:`SubclassContractError`
carrying it.
"""

from __future__ import annotations

import dataclasses
import textwrap

from thunder_subclass.errors import SubclassContractError

__all__ = ["CHECKS", "Finding", "SubclassReport"]

# in the order they run: a later check reads what an earlier one needs (a flatten that works, a fake run that works)
CHECKS = ("flatten", "guards", "fake", "metadata", "ops", "grads", "dynamic")


@dataclasses.dataclass(frozen=True)
class Finding:
    """One broken rule: ``check`` (one of :data:`CHECKS`) and ``message`` (what was expected, what happened, the
    fix)."""

    check: str
    message: str

    def __str__(self) -> str:
        return f"[{self.check}] {self.message}"


@dataclasses.dataclass
class SubclassReport:
    """What :func:`thunder_subclass.check_subclass` found for one subclass.

    ``findings``: the broken rules (empty when ``ok``); ``notes``: per check, what was checked or why it was skipped
    (an operation eager itself rejects, a check turned off); ``seconds``: per check, the time it took.
    """

    subclass: str
    findings: list[Finding] = dataclasses.field(default_factory=list)
    notes: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    skipped: set[str] = dataclasses.field(default_factory=set)
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.findings

    def add(self, check: str, message: str) -> None:
        assert check in CHECKS, check
        self.findings.append(Finding(check, message))

    def note(self, check: str, text: str) -> None:
        self.notes.setdefault(check, []).append(text)

    def skip(self, check: str, why: str) -> None:
        self.skipped.add(check)
        self.note(check, why)

    def verdict(self, check: str) -> str:
        if any(f.check == check for f in self.findings):
            return "FAIL"
        return "skipped" if check in self.skipped else "ok"

    def findings_of(self, check: str) -> list[Finding]:
        return [f for f in self.findings if f.check == check]

    def raise_on_failure(self) -> None:
        if not self.ok:
            raise SubclassContractError(str(self), report=self)

    def __str__(self) -> str:
        width = 100
        rows = []
        for check in CHECKS:
            details = _without_repeated_fixes([f.message for f in self.findings_of(check)]) or \
                self.notes.get(check, []) or [""]
            for i, detail in enumerate(details):
                lines = textwrap.wrap(detail, width) or [""]
                for j, line in enumerate(lines):
                    first = i == 0 and j == 0
                    rows.append((check if first else "", self.verdict(check) if first else "", line))
        head = f"check_subclass({self.subclass}): " + (
            "ok" if self.ok else f"{len(self.findings)} finding{'s' * (len(self.findings) != 1)}")
        cw = max(len("check"), *(len(r[0]) for r in rows))
        vw = max(len("verdict"), *(len(r[1]) for r in rows))
        out = [head, f"{'check':<{cw}}  {'verdict':<{vw}}  detail", f"{'-' * cw}  {'-' * vw}  {'-' * 6}"]
        out += [f"{c:<{cw}}  {v:<{vw}}  {d}".rstrip() for c, v, d in rows]
        return "\n".join(out)


def _without_repeated_fixes(messages: list[str]) -> list[str]:
    """The messages, a fix that repeats the previous message's written as "Fix: as above." (the table only)."""
    out, previous = [], None
    for m in messages:
        head, sep, fix = m.partition(" Fix: ")
        out.append(f"{head} Fix: as above." if sep and fix == previous else m)
        previous = fix if sep else None
    return out
