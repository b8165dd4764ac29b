"""The package's import graph reads as its pipeline: no import cycles (lazy imports included), the thunder/torch
access layer (the ``_thunder_internals`` subpackage) imports no stage, and no module imports another's private names
(the internals' modules among themselves included)."""

import ast
import pathlib

import thunder_subclass

PACKAGE = pathlib.Path(thunder_subclass.__file__).parent


INTERNALS = "_thunder_internals"


def _module_name(path: pathlib.Path) -> str:
    """``guards`` for guards.py, ``_thunder_internals.tracing`` for a module of the internals subpackage,
    ``_thunder_internals`` for its ``__init__``."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """module -> the package modules it imports anywhere in its source (function-level imports included); a module of
    the internals subpackage is named ``_thunder_internals.<module>``, one of the subclass checker ``check.<module>``."""
    graph, private = {}, []
    paths = sorted(PACKAGE.glob("*.py")) + sorted((PACKAGE / INTERNALS).glob("*.py")) + sorted(
        (PACKAGE / "check").glob("*.py"))
    for path in paths:
        name, deps = _module_name(path), set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("thunder_subclass"):
                parts = node.module.split(".")[1:]
                if parts:
                    private += [(name, node.module, a.name) for a in node.names
                                if a.name.startswith("_") and not a.name.startswith("__")]
                if len(parts) >= 2 or (parts and parts[0] != INTERNALS):
                    deps.add(".".join(parts[:2]))
                    continue
                # `from thunder_subclass import x` / `from thunder_subclass._thunder_internals import x`: x is a module
                # of the package, or a name its __init__ exports
                for a in node.names:
                    where = PACKAGE / pathlib.Path(*parts)
                    if (where / f"{a.name}.py").exists() or (where / a.name / "__init__.py").exists():
                        deps.add(".".join([*parts, a.name]))
                    elif parts:
                        deps.add(parts[0])
        graph[name] = deps - {name}
    return graph, private


def test_no_import_cycles():
    graph, _ = _imports()
    order, state = [], {}

    def visit(m, path):
        if state.get(m) == "done":
            return
        assert state.get(m) != "open", f"import cycle: {' -> '.join(path + [m])}"
        state[m] = "open"
        for d in sorted(graph.get(m, ())):
            visit(d, path + [m])
        state[m] = "done"
        order.append(m)

    for m in graph:
        visit(m, [])


def test_internals_is_the_bottom_layer():
    graph, _ = _imports()
    internals = {m for m in graph if m == INTERNALS or m.startswith(f"{INTERNALS}.")}
    assert len(internals) >= 10, sorted(internals)  # one module per concern
    for m in internals:
        assert {d for d in graph[m] if d not in internals} <= {"errors"}, (m, graph[m])
    # the stages are wired into thunder's hooks from above, not imported by the hooks' module
    assert {"guards", "interpretation", "autograd", "tangents"} <= graph["hooks"]


def test_unrolling_does_not_call_up_into_autograd():
    graph, _ = _imports()
    assert "autograd" not in graph["interpretation"] and "autograd" not in graph["recording"]
    assert "interpretation" not in graph["recording"]


def test_the_checker_uses_the_pipeline_from_above():
    # check_subclass is an authoring tool: it compiles as a user would; no stage imports it (the package's __init__,
    # module "", exports it)
    graph, _ = _imports()
    checker = {m for m in graph if m == "check" or m.startswith("check.")}
    assert {"check.report", "check.values", "check.contract", "check.compiled", "check.programs"} <= checker
    assert not [m for m in graph if m and m not in checker and graph[m] & checker], "a stage imports the checker"


def test_no_module_imports_private_names_of_another():
    _, private = _imports()
    assert private == []
