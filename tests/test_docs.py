"""README.md and the pages under docs/ run as written, and their links lead somewhere.

Every ```python block runs on its own in a fresh Python process (its own imports, its own model and tensors), from the
repository root, with this checkout's thunder_subclass first on the path. ```bash blocks (shell commands) and ```text
blocks (signatures, trace excerpts) are not run; a fenced block with no language or another one is an error, so that
no example silently escapes the test.

Every relative link (``[text](path)``, ``[text](path#anchor)``, ``[text](#anchor)``, images included) points to an
existing file, and an anchor to a heading of the linked Markdown file (GitHub's rule for heading ids).
"""

from __future__ import annotations

import concurrent.futures
import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), os.pardir))
DOCS = ["README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]
LANGUAGES = {"python", "bash", "text"}
# per block, a guard against hangs: most blocks take seconds, the Hugging Face generate block about a minute of CPU
# time, several minutes of wall time on a shared machine
TIMEOUT_S = 300

_FENCE = re.compile(r"^```(\S*)\s*$")


def code_blocks(doc: str) -> list[tuple[int, str, str]]:
    """``(line, language, code)`` of each fenced code block in ``doc`` (relative to the repository root); ``line`` is
    the block's first code line."""
    blocks, current = [], None
    with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
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
    assert current is None, f"{doc}: the code block opened at line {current[0] - 1} is not closed"
    return blocks


PYTHON_BLOCKS = [(doc, line, code) for doc in DOCS for line, lang, code in code_blocks(doc) if lang == "python"]


def _first_line(code: str) -> str:
    return next((line.strip() for line in code.splitlines() if line.strip()), "")


def test_docs_exist():
    assert "docs/index.md" in DOCS, DOCS
    assert any(doc == "README.md" for doc, _, _ in PYTHON_BLOCKS), "README.md has no ```python block"


def test_every_block_has_a_known_language():
    unknown = [(doc, line, lang or "(none)") for doc in DOCS for line, lang, _ in code_blocks(doc)
               if lang not in LANGUAGES]
    assert not unknown, f"code blocks must be ```python (run by this test), ```bash or ```text: {unknown}"


def _run_block(code: str):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONWARNINGS"] = "ignore"
    try:
        return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None


@pytest.fixture(scope="module")
def block_runs(request):
    """The selected blocks' fresh processes, started two at a time when the first block test runs (each block is
    still its own process; the machine's two cores run two of them at once)."""
    selected = [item.callspec.params for item in request.session.items
                if getattr(item, "originalname", None) == "test_python_block_runs"]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        yield {(p["doc"], p["line"]): pool.submit(_run_block, p["code"]) for p in selected}


@pytest.mark.slow
@pytest.mark.parametrize("doc, line, code", PYTHON_BLOCKS, ids=[f"{doc}:{line}" for doc, line, _ in PYTHON_BLOCKS])
def test_python_block_runs(doc, line, code, block_runs):
    future = block_runs.get((doc, line))
    run = future.result() if future is not None else _run_block(code)
    if run is None:
        pytest.fail(f"{doc} block at line {line} ({_first_line(code)!r}) ran longer than {TIMEOUT_S} s")
    if run.returncode != 0:
        error = run.stderr.strip().splitlines()
        pytest.fail(
            f"{doc} block at line {line} ({_first_line(code)!r}) failed with exit status {run.returncode}: "
            f"{error[-1] if error else '(no error output)'}\n\n{run.stderr[-4000:]}",
            pytrace=False,
        )


def test_python_blocks_import_thunder_subclass_before_thunder():
    # under torch 2.13-2.15 thunder 0.2.6 only imports after thunder_subclass's shims (docs/stacks.md)
    for doc, line, code in PYTHON_BLOCKS:
        imports = [m.group(1) for m in re.finditer(r"^\s*(?:import|from)\s+(thunder_subclass|thunder)\b", code, re.M)]
        if "thunder" in imports:
            assert "thunder_subclass" in imports and imports.index("thunder_subclass") < imports.index("thunder"), (
                f"{doc} block at line {line} ({_first_line(code)!r}) imports thunder before thunder_subclass"
            )


@pytest.mark.parametrize("doc", DOCS)
def test_no_issue_numbers_or_work_status(doc):
    text = open(os.path.join(ROOT, doc), encoding="utf-8").read()
    found = re.findall(r"(?i)\bissues? #?\d+|\bstatus:|\bnot met\b|\btargets? \(", text)
    assert not found, f"{doc} is user documentation; remove work-tracking text: {found}"


def test_readme_setup_is_what_ci_runs():
    """README's two set-up commands are the first commands `.ci/run` runs, in the same order; what CI runs after them
    (the transformers 4.x leg) is a command README names."""
    def commands(text: str) -> list[str]:
        lines = (re.sub(r"\s+#.*$", "", line).strip() for line in text.splitlines())
        return [line for line in lines if line and not line.startswith("#")]

    setup = next(code for _, lang, code in code_blocks("README.md") if lang == "bash")
    ci = [c for c in commands(open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read())
          if not c.startswith(("set ", "cd "))]
    assert ci[:len(commands(setup))] == commands(setup), (commands(setup), ci)
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    assert all(f"`{c}`" in readme for c in ci[len(commands(setup)):]), ci


# --- links ------------------------------------------------------------------------------------------------------

_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _prose(doc: str) -> list[str]:
    """The lines of ``doc`` outside fenced code blocks, inline code spans removed."""
    lines, fenced = [], False
    with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
        for line in f:
            if _FENCE.match(line.rstrip("\n")):
                fenced = not fenced
                continue
            lines.append("" if fenced else re.sub(r"(`+).*?\1", "", line))
    return lines


def heading_ids(doc: str) -> set[str]:
    """The anchors GitHub gives the headings of ``doc``: the text lowercased, inline code marks, link targets and
    punctuation other than ``-`` and ``_`` dropped, spaces made ``-``; repeated ids get ``-1``, ``-2``, ..."""
    ids, seen = set(), {}
    with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
        fenced = False
        for line in f:
            if _FENCE.match(line.rstrip("\n")):
                fenced = not fenced
                continue
            m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))
            slug = re.sub(r"[^\w\- ]", "", text.replace("`", "").lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            ids.add(slug if n == 0 else f"{slug}-{n}")
    return ids


def relative_links(doc: str) -> list[tuple[int, str]]:
    links = []
    for number, line in enumerate(_prose(doc), start=1):
        for m in _LINK.finditer(line):
            target = m.group(1)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not checked
                links.append((number, target))
    return links


def test_heading_ids_follow_github():
    assert heading_ids("docs/limits.md") >= {
        "opaque-reference-attributes-need-torch--211",  # ">=" and "." dropped, both spaces kept
        "requires_grad_-inside-compiled-code",  # code marks dropped, "_" kept
        "thunders-dynamo-path-is-not-supported",
    }


@pytest.mark.parametrize("doc", DOCS)
def test_relative_links_resolve(doc):
    broken = []
    links = relative_links(doc)
    for line, target in links:
        path, _, anchor = target.partition("#")
        file = os.path.normpath(os.path.join(ROOT, os.path.dirname(doc), path)) if path else os.path.join(ROOT, doc)
        if not os.path.exists(file):
            broken.append(f"{doc}:{line}: {target} (no file {os.path.relpath(file, ROOT)})")
        elif anchor:
            if not file.endswith(".md"):
                broken.append(f"{doc}:{line}: {target} (an anchor into a file that is not Markdown)")
            elif anchor not in heading_ids(os.path.relpath(file, ROOT)):
                broken.append(f"{doc}:{line}: {target} (no heading with id {anchor!r})")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_docs_page_is_reachable_from_the_index():
    linked = {os.path.normpath(os.path.join("docs", path.partition("#")[0])) for _, path in relative_links("docs/index.md")}
    missing = [doc for doc in DOCS if doc.startswith("docs/") and doc != "docs/index.md" and doc not in linked]
    assert not missing, f"docs/index.md does not link {missing}"


def test_internals_page_has_a_section_per_internals_module():
    # a module of the layer is named by its path below it: `runtime`, `fixes` (the fixes subpackage's __init__),
    # `fixes/attributes`
    package = os.path.join(ROOT, "thunder_subclass", "_thunder_internals")
    modules = sorted(
        os.path.relpath(p, package)[:-3].removesuffix("/__init__")
        for p in glob.glob(os.path.join(package, "**", "*.py"), recursive=True) if p != os.path.join(package, "__init__.py"))
    sections = {m.group(1) for m in re.finditer(r"^## `([\w/]+)`: ", open(os.path.join(ROOT, "docs", "internals.md"),
                                                                      encoding="utf-8").read(), re.M)}
    assert modules and sections == set(modules), (sorted(sections), modules)
