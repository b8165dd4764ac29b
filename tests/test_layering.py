"""The package's import graph reads as its pipeline: no import cycles (lazy imports included), the folders import
only folders before them (guards, frontend, transforms, runtime), the thunder/torch access layer (the
``_thunder_internals`` subpackage) imports no stage, and no module imports another's private names (the internals'
modules among themselves included)."""

import ast
import pathlib

import thunder_subclass

PACKAGE = pathlib.Path(thunder_subclass.__file__).parent


INTERNALS = "_thunder_internals"
# the folders of the pipeline, bottom first (docs/how-it-works.md): a module of a folder imports no module of a folder
# after it; the top-level modules (plugin, hooks, errors, executor, rules, ...) are the public API and the wiring
FOLDERS = ("guards", "frontend", "transforms", "runtime")


def _module_name(path: pathlib.Path) -> str:
    """``plugin`` for plugin.py, ``frontend.proxy`` for frontend/proxy.py, ``_thunder_internals.fixes`` for the
    ``__init__`` of the internals' fixes subpackage, ``""`` for the package's own ``__init__``."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_of(parts: list[str]) -> str:
    """The package module that the dotted ``parts`` (below ``thunder_subclass``) name or are a name of: the longest
    prefix that is a module or a package."""
    for n in range(len(parts), 0, -1):
        where = PACKAGE.joinpath(*parts[:n])
        if where.with_suffix(".py").exists() or (where / "__init__.py").exists():
            return ".".join(parts[:n])
    return ""


def _imports() -> dict[str, set[str]]:
    """module -> the package modules it imports anywhere in its source (function-level imports included), each named
    by its dotted path below ``thunder_subclass`` (``frontend.proxy``, ``_thunder_internals.fixes.iteration``; a name
    an ``__init__`` exports counts as that package)."""
    graph, private = {}, []
    for path in sorted(PACKAGE.rglob("*.py")):
        name, deps = _module_name(path), set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("thunder_subclass"):
                parts = node.module.split(".")[1:]
                if parts:
                    private += [(name, node.module, a.name) for a in node.names
                                if a.name.startswith("_") and not a.name.startswith("__")]
                deps |= {_module_of([*parts, a.name]) for a in node.names}
            elif isinstance(node, ast.Import):
                deps |= {_module_of(a.name.split(".")[1:]) for a in node.names if a.name.startswith("thunder_subclass.")}
        graph[name] = deps - {name}
    return graph, private


def _folder(module: str) -> str | None:
    top = module.split(".")[0]
    return top if top in FOLDERS else None


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
    assert {"guards", "frontend.interpretation", "transforms.autograd", "transforms.tangents"} <= graph["hooks"]
    # the interpreter fixes are one subpackage of the layer, a part a concern
    assert {"_thunder_internals.fixes.attributes", "_thunder_internals.fixes.iteration"} <= internals


def test_folders_import_only_folders_before_them():
    # guards (inputs) -> frontend (interpretation) -> transforms -> runtime -> plugin / hooks: a folder imports no
    # module of a folder after it, and none imports the entry modules. One exception, measured: the guards are built
    # on the frontend's representation of values (frontend.proxy, frontend.fake, and the strides of an input's layout
    # that x.stride() under symbolic sizes reads, frontend.symbolic_strides; the symbolic sizes of a jagged
    # NestedTensor input, frontend.jagged), which import no guard
    graph, _ = _imports()
    order = {f: i for i, f in enumerate(FOLDERS)}
    values = {"frontend.proxy", "frontend.fake", "frontend.symbolic_strides", "frontend.jagged"}
    assert {_folder(m) for m in graph} >= set(FOLDERS)
    for m, deps in graph.items():
        if _folder(m) is None:
            continue
        for d in deps:
            assert d not in ("plugin", "hooks"), f"{m} imports the entry module {d}"
            if _folder(d) is None or _folder(d) == _folder(m):
                continue
            if _folder(m) == "guards" and d in values:
                continue
            assert order[_folder(d)] < order[_folder(m)], f"{m} imports {d}, a later stage"
    for m in values:
        assert not [d for d in graph[m] if _folder(d) == "guards"], (m, graph[m])


def test_unrolling_does_not_call_up_into_autograd():
    graph, _ = _imports()
    assert "transforms.autograd" not in graph["frontend.interpretation"]
    assert "transforms.autograd" not in graph["frontend.recording"]
    assert "frontend.interpretation" not in graph["frontend.recording"]


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
    # most 600 lines named by concern; beside them the prologue that runs a cache entry's checks as one function
    # (its one symbol, check_prologue, is not a guard kind)
    from thunder_subclass import guards
    from thunder_subclass.guards import protocol

    folder = PACKAGE / "guards"
    assert {p.stem for p in folder.glob("*.py")} == {
        "__init__", "protocol", "values", "tensors", "layouts", "objects", "inputs", "object_reads", "write_backs",
        "state", "prologue", "watched", "container_writes", "unpack_cache"}
    for path in folder.glob("*.py"):
        source = path.read_text()
        assert len(source.splitlines()) <= 600, path.name
        if path.stem not in ("protocol", "prologue"):
            assert "register_operator" not in source, f"{path.name} registers a symbol by hand"
    checks = [getattr(guards, n) for n in dir(guards) if n.startswith("check_") and n != "check_function"]
    assert len(checks) >= 13
    for sym in checks:
        assert sym.id in protocol._GUARD_OF, sym.name
    state_guards = __import__("thunder_subclass.guards.state", fromlist=["x"])
    for sym in (state_guards.check_module_slot_empty, state_guards.check_module_forward, state_guards.check_state_read):
        assert sym.id in protocol._GUARD_OF, sym.name


def test_the_internals_layer_holds_no_cache_policy():
    # the decisions of the per-call path (automatic dynamic shapes, the cache bound, the entry index) live above the
    # layer, in cache_policy, and reach it as one CallPort: no module of the layer switches a jit's cache option,
    # defines an automatic-dynamic or index class, or holds the cache policy's attribute
    graph, _ = _imports()
    assert "runtime.cache" in graph["runtime.cache_policy"] and "runtime.cache_policy" in graph["plugin"]
    for path in sorted((PACKAGE / INTERNALS).rglob("*.py")):
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
    from thunder_subclass.runtime import cache_policy

    for step in ("graph breaks", "remembered call", "fast hit", "AutomaticDynamicShapes", "bound", "thunder's own"):
        assert step in cache_policy.compiled_call.__doc__, step


# one stage numbering for docstrings, the package's __init__ and docs/how-it-works.md
STAGES = {1: "entry", 2: "per call", 3: "inputs and guards", 4: "interpretation", 5: "autograd",
          6: "flatten and executors", 7: "incoming gradients"}
# the stages each folder holds; top-level stage modules by name
STAGES_OF = {"runtime": {2}, "guards": {3}, "frontend": {3, 4}, "transforms": {5, 6, 7}}
TOP_LEVEL_STAGE_MODULES = {"plugin": 1, "fsdp": 1, "distributed": 4, "hf": 4, "inductor_executor": 6}
# the parts of the guards package that are not a stage of their own but guard kinds and their helpers
GUARD_PARTS = {"guards.protocol", "guards.values", "guards.tensors", "guards.objects", "guards.inputs",
               "guards.object_reads", "guards.write_backs"}


def _stage_modules() -> dict[str, str]:
    """module -> its docstring, for every module of a pipeline folder (its __init__ excepted, but for the guards')
    and the top-level stage modules."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        in_folder = _folder(name) is not None and (path.stem != "__init__" or name == "guards")
        if (in_folder and name not in GUARD_PARTS) or name in TOP_LEVEL_STAGE_MODULES:
            found[name] = ast.get_docstring(ast.parse(path.read_text())) or ""
    return found


def test_each_plugin_attribute_key_is_spelt_in_one_module():
    # issue 42: the per-jit state is one JitRecord on the compile data (_thunder_internals/jit_record.py), so the
    # per-jit attributes once on compiled functions / modules are gone; a marker kept on a thunder object (a trace,
    # a proxy, a hooked function) is named by one module, which the others ask
    owners: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                key = node.value
            elif isinstance(node, ast.Attribute):
                key = node.attr
            else:
                continue
            if key.startswith("_thunder_subclass_") and key.isidentifier():
                owners.setdefault(key, set()).add(str(path.relative_to(PACKAGE)))
    assert {k: sorted(v) for k, v in owners.items() if len(v) > 1} == {}
    moved = {"_thunder_subclass_cache_policy", "_thunder_subclass_graph_breaks", "_thunder_subclass_fast_call",
             "_thunder_subclass_dynamic_shapes"}  # now JitRecord's policy, graph_breaks, fast_call, dynamic_shapes
    assert moved.isdisjoint(owners), moved & set(owners)
    assert set(owners["_thunder_subclass_jit_record"]) == {"_thunder_internals/jit_record.py"}


def test_every_stage_module_opens_with_its_stage_then_in_what_happens_out():
    import re

    modules = _stage_modules()
    assert len(modules) >= 30, sorted(modules)
    for name, doc in modules.items():
        m = re.match(r"Stage (\d) \(([^,)]+)", doc)
        assert m, f"{name}: the docstring does not open with its stage: {doc[:80]!r}"
        number, stage = int(m[1]), m[2]
        assert STAGES.get(number) == stage, f"{name}: stage {number} is {STAGES.get(number)!r}, not {stage!r}"
        allowed = STAGES_OF.get(_folder(name)) or {TOP_LEVEL_STAGE_MODULES[name]}
        assert number in allowed, f"{name} is stage {number}, which lives in {allowed}"
        flowing = " ".join(doc.split())
        for part in ("In:", "What happens", "Out"):
            assert part in flowing, f"{name}: the docstring has no {part!r}"


def test_one_numbering_in_the_package_docstring_and_how_it_works():
    import re

    init = thunder_subclass.__doc__
    how = (PACKAGE.parent / "docs" / "how-it-works.md").read_text()
    for number, stage in STAGES.items():
        assert re.search(rf"^{number}\. {stage}[:,] ", init, re.M), f"__init__ does not list stage {number}, {stage}"
        assert re.search(rf"^{number}\. \*\*{stage}\*\* ", how, re.M | re.I), f"how-it-works.md: stage {number}"
    # the package's pipeline names every stage module
    for name in _stage_modules():
        if name != "guards":
            assert f"``{name.split('.')[-1]}``" in init or f"``{name}``" in init, f"__init__ does not name {name}"
