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
        (PACKAGE / "check").glob("*.py")) + sorted((PACKAGE / "guards").glob("*.py"))
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


def test_guards_are_one_protocol_in_files_by_concern():
    # every guard kind is a Guard whose check symbol register_check made (none registered by hand), in files of at
    # most 600 lines named by concern
    from thunder_subclass import guards
    from thunder_subclass.guards import protocol

    folder = PACKAGE / "guards"
    assert {p.stem for p in folder.glob("*.py")} == {
        "__init__", "protocol", "values", "tensors", "layouts", "objects", "inputs", "object_reads", "write_backs"}
    for path in folder.glob("*.py"):
        source = path.read_text()
        assert len(source.splitlines()) <= 600, path.name
        if path.stem != "protocol":
            assert "register_operator" not in source, f"{path.name} registers a symbol by hand"
    checks = [getattr(guards, n) for n in dir(guards) if n.startswith("check_") and n != "check_function"]
    assert len(checks) >= 13
    for sym in checks:
        assert sym.id in protocol._GUARD_OF, sym.name
    state_guards = __import__("thunder_subclass.state_guards", fromlist=["x"])
    for sym in (state_guards.check_module_slot_empty, state_guards.check_module_forward, state_guards.check_state_read):
        assert sym.id in protocol._GUARD_OF, sym.name


def test_the_internals_layer_holds_no_cache_policy():
    # the decisions of the per-call path (automatic dynamic shapes, the cache bound, the entry index) live above the
    # layer, in cache_policy, and reach it as one CallPort: no module of the layer switches a jit's cache option,
    # defines an automatic-dynamic or index class, or holds the cache policy's attribute
    graph, _ = _imports()
    assert "cache_policy" in graph and "cache" in graph["cache_policy"] and "cache_policy" in graph["plugin"]
    for path in sorted((PACKAGE / INTERNALS).glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                assert not any(isinstance(t, ast.Attribute) and t.attr == "cache_option" for t in targets), (
                    f"{path.name}:{node.lineno} switches a cache option (a policy decision)")
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                assert not any(w in node.name.lower() for w in ("dynamic", "entryindex", "call_key", "bounded_call")), (
                    f"{path.name}: {node.name} is policy")
        assert "POLICY_ATTR" not in path.read_text(), path.name
    from thunder_subclass import cache_policy

    for step in ("graph breaks", "remembered call", "fast hit", "AutomaticDynamicShapes", "bound", "thunder's own"):
        assert step in cache_policy.compiled_call.__doc__, step
