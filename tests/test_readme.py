"""README.md runs as written: every ```python block runs on its own in a fresh Python process (its own imports,
its own model and tensors), from the repository root, with this checkout's thunder_subclass first on the path.

```bash blocks (shell commands) and ```text blocks (signatures, trace excerpts, tables) are not run; a fenced block
with no language or another one is an error, so that no example silently escapes the test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), os.pardir))
README = os.path.join(ROOT, "README.md")
LANGUAGES = {"python", "bash", "text"}
TIMEOUT_S = 120  # per block; each takes a few seconds (most of it importing thunder)

_FENCE = re.compile(r"^```(\S*)\s*$")


def readme_blocks(path: str = README) -> list[tuple[int, str, str]]:
    """``(line, language, code)`` of each fenced code block in ``path``; ``line`` is the block's first code line."""
    blocks, current = [], None
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            fence = _FENCE.match(line.rstrip("\n"))
            if current is None:
                if fence:
                    current = (number + 1, fence.group(1), [])
            elif fence and not fence.group(1):
                blocks.append((current[0], current[1], "".join(current[2])))
                current = None
            else:
                current[2].append(line)
    assert current is None, f"README.md: the code block opened at line {current[0] - 1} is not closed"
    return blocks


PYTHON_BLOCKS = [(line, code) for line, lang, code in readme_blocks() if lang == "python"]


def _first_line(code: str) -> str:
    return next((line.strip() for line in code.splitlines() if line.strip()), "")


def test_every_block_has_a_known_language():
    unknown = [(line, lang or "(none)") for line, lang, _ in readme_blocks() if lang not in LANGUAGES]
    assert not unknown, f"README.md code blocks must be ```python (run by this test), ```bash or ```text: {unknown}"
    assert PYTHON_BLOCKS, "README.md has no ```python block"


@pytest.mark.parametrize("line, code", PYTHON_BLOCKS, ids=[f"README.md:{line}" for line, _ in PYTHON_BLOCKS])
def test_python_block_runs(line, code):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONWARNINGS"] = "ignore"
    try:
        run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"README.md block at line {line} ({_first_line(code)!r}) ran longer than {TIMEOUT_S} s")
    if run.returncode != 0:
        error = run.stderr.strip().splitlines()
        pytest.fail(
            f"README.md block at line {line} ({_first_line(code)!r}) failed with exit status {run.returncode}: "
            f"{error[-1] if error else '(no error output)'}\n\n{run.stderr[-4000:]}",
            pytrace=False,
        )


def test_python_blocks_import_thunder_subclass_before_thunder():
    # under torch 2.13-2.15 thunder 0.2.6 only imports after thunder_subclass's shims (README, "Install")
    for line, code in PYTHON_BLOCKS:
        imports = [m.group(1) for m in re.finditer(r"^\s*(?:import|from)\s+(thunder_subclass|thunder)\b", code, re.M)]
        if "thunder" in imports:
            assert "thunder_subclass" in imports and imports.index("thunder_subclass") < imports.index("thunder"), (
                f"README.md block at line {line} ({_first_line(code)!r}) imports thunder before thunder_subclass"
            )


def test_no_issue_numbers_or_work_status():
    text = open(README, encoding="utf-8").read()
    found = re.findall(r"(?i)\bissues? #?\d+|\bstatus:|\bnot met\b|\btargets? \(", text)
    assert not found, f"README.md is user documentation; remove work-tracking text: {found}"
