"""Issue 42 item 4: move the package's flat modules into folders that show the pipeline, and rewrite every import.

Run from the repository root: ``python scripts/relayout42.py``. Idempotent: a module already moved is skipped, and
the rewrite only touches references to old paths, so the script can be run again after merging a branch that still
imports the old paths (it then rewrites that branch's new imports; a module the branch *added* at the top level
stays where it is).

What it does:

1. ``git mv`` each module of :data:`MOVES` to its new place, and creates the new packages' ``__init__.py`` (a
   one-line docstring; the stage lists are written by hand afterwards);
2. rewrites, in every ``.py`` / ``.md`` / ``.ipynb`` / ``.txt`` / ``.sh`` file under :data:`ROOTS`:

   * dotted paths ``thunder_subclass.<old>`` -> ``thunder_subclass.<new>`` (imports, ``import x.y as z``,
     ``monkeypatch`` strings, ``sys.modules`` keys, docstrings);
   * file paths ``thunder_subclass/<old>.py`` -> ``thunder_subclass/<new>.py``;
   * ``from thunder_subclass import a, b`` (and ``from thunder_subclass._thunder_internals import ...``) naming moved
     modules: one ``from <new package> import <module>`` line per moved name (``<new> as <old name>`` where the
     module was renamed, so the code using it is unchanged), the other names left on the original line.

What it cannot do (done by hand, in later commits): relative ``:mod:`` references in docstrings, bare module file
names in prose (``prologue.py``), the layering test's rules, the disk cache's format number.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

PKG = "thunder_subclass"

# old dotted path (below thunder_subclass) -> new dotted path
MOVES = {
    # what runs while thunder interprets the user's code: proxies, fakes, symbols, recording, unrolling, lookasides
    "proxy": "frontend.proxy",
    "fake": "frontend.fake",
    "subclass_symbols": "frontend.subclass_symbols",
    "aten_symbols": "frontend.aten_symbols",
    "recording": "frontend.recording",
    "interpretation": "frontend.interpretation",
    "torch_function": "frontend.torch_function",
    "module_calls": "frontend.module_calls",
    "native_effects": "frontend.native_effects",
    "checkpoints": "frontend.checkpoints",
    "grad_modes": "frontend.grad_modes",
    # transforms of the trace: autograd and its checks, flatten, incoming gradients
    "autograd": "transforms.autograd",
    "backward_effects": "transforms.backward_effects",
    "higher_order": "transforms.higher_order",
    "random_ops": "transforms.random_ops",
    "flatten": "transforms.flatten",
    "tangents": "transforms.tangents",
    # what runs per call and between calls: the cache policy, the disk cache, graph breaks
    "cache": "runtime.cache",
    "cache_policy": "runtime.cache_policy",
    "disk_cache": "runtime.disk_cache",
    "disk_trust": "runtime.disk_trust",
    "graph_breaks": "runtime.graph_breaks",
    "eager_calls": "runtime.eager_calls",
    "eager_call_state": "runtime.eager_call_state",
    "unreached_grads": "runtime.unreached_grads",
    "speculation": "runtime.speculation",
    # the guards' other two rooms: the fused prologue that runs them, and the guards on Python state
    "prologue": "guards.prologue",
    "state_guards": "guards.state",
    # the interpreter fixes as one subpackage of the bottom layer
    "_thunder_internals.interpreter_fixes": "_thunder_internals.fixes",
    "_thunder_internals.fixes_attributes": "_thunder_internals.fixes.attributes",
    "_thunder_internals.fixes_comparisons": "_thunder_internals.fixes.comparisons",
    "_thunder_internals.fixes_constant_keys": "_thunder_internals.fixes.constant_keys",
    "_thunder_internals.fixes_epilogue": "_thunder_internals.fixes.epilogue",
    "_thunder_internals.fixes_exceptions": "_thunder_internals.fixes.exceptions",
    "_thunder_internals.fixes_iteration": "_thunder_internals.fixes.iteration",
    "_thunder_internals.fixes_torch_calls": "_thunder_internals.fixes.torch_calls",
    "_thunder_internals.interpreter_dicts": "_thunder_internals.fixes.dicts",
}

NEW_PACKAGES = {
    "frontend": "Stages that run while thunder interprets the user's code (see ``thunder_subclass.__init__``).",
    "transforms": "Transforms of the traced program, one a module (see ``thunder_subclass.__init__``).",
    "runtime": "What runs per call and between calls (see ``thunder_subclass.__init__``).",
}

ROOTS = ("thunder_subclass", "tests", "benchmarks", "scripts", "notebooks", "docs", "examples", "README.md")
SUFFIXES = {".py", ".md", ".ipynb", ".txt", ".sh", ".toml"}
SELF = pathlib.Path(__file__).resolve()


def _file(dotted: str, package: bool = False) -> pathlib.Path:
    parts = dotted.split(".")
    return pathlib.Path(PKG, *parts, "__init__.py") if package else pathlib.Path(PKG, *parts[:-1], parts[-1] + ".py")


def _is_package(new: str) -> bool:
    """A move whose target is a package (its ``__init__``): another move puts a module below it."""
    return any(other.startswith(new + ".") for other in MOVES.values())


def move_files() -> None:
    for folder, doc in NEW_PACKAGES.items():
        init = pathlib.Path(PKG, folder, "__init__.py")
        if not init.exists():
            init.parent.mkdir(exist_ok=True)
            init.write_text(f'"""{doc}"""\n')
            subprocess.run(["git", "add", str(init)], check=True)
    for old, new in MOVES.items():
        src, dst = _file(old), _file(new, _is_package(new))
        if not src.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "mv", str(src), str(dst)], check=True)


# longest first, so that ``_thunder_internals.fixes_x`` is tried before anything shorter
_OLD = sorted(MOVES, key=len, reverse=True)
_DOTTED = re.compile(r"\b" + re.escape(PKG) + r"\.(" + "|".join(re.escape(o) for o in _OLD) + r")\b(?!\.py)")
_SLASHED = re.compile(re.escape(PKG) + r"/(" + "|".join(re.escape(o.replace(".", "/")) for o in _OLD) + r")\.py\b")
_FROM = re.compile(
    r"^(?P<indent>[ \t]*)from (?P<base>" + re.escape(PKG) + r"(?:\._thunder_internals)?) import "
    r"(?P<names>\([^)]*\)|[^\n]*)$", re.M)


def _new_path(old: str) -> str:
    return f"{PKG}.{MOVES[old]}"


def _rewrite_from(m: re.Match) -> str:
    indent, base, names = m["indent"], m["base"], m["names"]
    prefix = base[len(PKG) + 1:] + "." if base != PKG else ""
    comment = ""
    body = names
    if body.startswith("("):
        body = body[1:-1]
        inner_comments = re.findall(r"#[^\n]*", body)
        body = re.sub(r"#[^\n]*", "", body)
        comment = inner_comments[0] if inner_comments else ""
    else:
        body, hash_, rest = body.partition("#")
        comment = hash_ + rest if hash_ else ""
    items = [i.strip() for i in body.replace("\n", " ").split(",") if i.strip()]
    kept, moved = [], []
    for item in items:
        name, _, alias = (p.strip() for p in item.partition(" as "))
        old = prefix + name
        if old in MOVES:
            moved.append((old, alias or name))
        else:
            kept.append(item)
    if not moved:
        return m.group(0)
    suffix = f"  {comment.strip()}" if comment else ""
    groups: dict[str, list[str]] = {base: kept} if kept else {}
    for old, local in moved:
        new_package, _, new_name = _new_path(old).rpartition(".")
        groups.setdefault(new_package, []).append(new_name if new_name == local else f"{new_name} as {local}")
    return "\n".join(_render(indent, package, names, suffix) for package, names in groups.items())


def _render(indent: str, package: str, names: list[str], suffix: str) -> str:
    """One ``from package import names`` statement, parenthesized one name a line when longer than 120 characters."""
    line = f"{indent}from {package} import {', '.join(names)}{suffix}"
    if len(line) <= 120:
        return line
    body = "".join(f"{indent}    {n},\n" for n in names)
    return f"{indent}from {package} import ({suffix}\n{body}{indent})"


def rewrite_text(text: str) -> str:
    text = _FROM.sub(_rewrite_from, text)
    text = _DOTTED.sub(lambda m: _new_path(m[1]), text)
    text = _SLASHED.sub(lambda m: f"{PKG}/{MOVES[m[1].replace('/', '.')].replace('.', '/')}"
                        + ("/__init__.py" if _is_package(MOVES[m[1].replace('/', '.')]) else ".py"), text)
    return text


def rewrite_files() -> list[pathlib.Path]:
    changed = []
    for root in ROOTS:
        root = pathlib.Path(root)
        paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in paths:
            if path.suffix not in SUFFIXES or path.resolve() == SELF or "__pycache__" in path.parts:
                continue
            text = path.read_text()
            new = rewrite_text(text)
            if new != text:
                path.write_text(new)
                changed.append(path)
    return changed


if __name__ == "__main__":
    if not pathlib.Path(PKG, "__init__.py").exists():
        sys.exit("run from the repository root")
    move_files()
    for p in rewrite_files():
        print("rewrote", p)
