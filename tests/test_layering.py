"""The package's import graph reads as its pipeline: no import cycles (lazy imports included), the thunder/torch
access layer imports no stage, and no module imports another's private names."""

import ast
import pathlib

import thunder_subclass

PACKAGE = pathlib.Path(thunder_subclass.__file__).parent


def _imports() -> dict[str, set[str]]:
    """module -> the package modules it imports anywhere in its source (function-level imports included)."""
    graph, private = {}, []
    for path in sorted(PACKAGE.glob("*.py")):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("thunder_subclass"):
                parts = node.module.split(".")
                if len(parts) > 1:
                    deps.add(parts[1])
                    private += [(path.stem, node.module, a.name) for a in node.names
                                if a.name.startswith("_") and not a.name.startswith("__")]
                else:
                    deps.update(a.name for a in node.names)
        graph[path.stem] = deps - {path.stem}
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
    assert graph["_thunder_internals"] <= {"errors"}, graph["_thunder_internals"]
    # the stages are wired into thunder's hooks from above, not imported by the hooks' module
    assert {"guards", "interpretation", "autograd", "tangents"} <= graph["hooks"]


def test_unrolling_does_not_call_up_into_autograd():
    graph, _ = _imports()
    assert "autograd" not in graph["interpretation"] and "autograd" not in graph["recording"]
    assert "interpretation" not in graph["recording"]


def test_no_module_imports_private_names_of_another():
    _, private = _imports()
    assert private == []
