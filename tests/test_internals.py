"""The internals module: import order, idempotent install, removal, inert for plain thunder.jit (issue 2)."""

import subprocess
import sys

import pytest

import thunder
import torch

import thunder_subclass
from thunder_subclass import _thunder_internals
from subclasses import TwoTensor


@pytest.mark.slow
def test_import_in_fresh_interpreter_leaves_thunder_importable():
    code = "import thunder_subclass, thunder; import torch; print(thunder.jit(lambda x: x + 1)(torch.ones(2)).tolist())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("[2.0, 2.0]")


@pytest.mark.slow
def test_import_hides_only_thunders_transformer_engine_warning():
    # thunder 0.2.6 warns "transformer_engine module not found!" at import; thunder_subclass's own import of thunder
    # filters exactly that warning, and removes its filter afterwards (other warnings, later ones, still show)
    code = (
        "import warnings; warnings.simplefilter('always')\n"
        "import thunder_subclass\n"
        "assert not [f for f in warnings.filters if f[1] is not None and 'transformer' in f[1].pattern], warnings.filters\n"
        "warnings.warn('transformer_engine module not found!')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # the one warning seen is the script's own (line 4 of <string>), none came from thunder's import
    assert out.stderr.count("transformer_engine module not found!") == 1, out.stderr
    assert "<string>:4: UserWarning: transformer_engine module not found!" in out.stderr, out.stderr
    assert "transformer_engineex.py" not in out.stderr, out.stderr


def test_install_is_idempotent_and_uninstall_restores_thunder():
    import thunder.core.symbol as symbol

    thunder_subclass.install_hooks()
    hooked = symbol.Symbol.__call__
    thunder_subclass.install_hooks()
    assert symbol.Symbol.__call__ is hooked and getattr(hooked, "_thunder_subclass_hook", False)
    thunder_subclass.uninstall_hooks()
    assert not getattr(symbol.Symbol.__call__, "_thunder_subclass_hook", False)
    assert not _thunder_internals.is_installed()
    # jit installs again on use
    x = TwoTensor(torch.ones(2), torch.zeros(2))
    out = thunder_subclass.jit(lambda t: t + 1)(x)
    assert type(out) is TwoTensor and _thunder_internals.is_installed()


def test_plain_thunder_jit_is_unchanged_while_hooks_are_installed():
    def f(x):
        return (x * 2).sin()

    x = torch.randn(3)
    thunder_subclass.uninstall_hooks()
    jf_before = thunder.jit(f)
    jf_before(x)
    before = str(thunder.last_traces(jf_before)[-1])
    thunder_subclass.install_hooks()
    jf_after = thunder.jit(f)
    torch.testing.assert_close(jf_after(x), f(x))
    assert str(thunder.last_traces(jf_after)[-1]) == before
    assert "check_plain_tensor" not in str(thunder.last_prologue_traces(jf_after)[-1])


def test_torch_compile_fusion_of_aten_symbols_is_registered_only_while_installed():
    # a pointwise aten op without a thunder equivalent joins thunder's torch_compile regions (issue 7); the
    # registration in thunder's shared torch_compile executor is undone by uninstall and redone by install
    from thunder.executors.torch_compile import torch_compile_ex

    def f(t):
        return torch.special.erfcx(t.abs() * 2).sin() + 1

    x = TwoTensor(torch.randn(3, 4), torch.randn(3, 4))
    jf = thunder_subclass.jit(f, executors=[torch_compile_ex])
    out, expected = jf(x), f(x)
    assert type(out) is TwoTensor
    torch.testing.assert_close(out.a, expected.a)
    torch.testing.assert_close(out.b, expected.b)
    names = [b.sym.name for b in thunder.last_traces(jf)[-1].bound_symbols]
    assert sum(n.startswith("TorchCompile") for n in names) == 1 and "aten_special_erfcx_default" not in names, names
    sym = thunder_subclass.frontend.aten_symbols.aten_symbol(torch.ops.aten.special_erfcx.default)
    assert sym.id in torch_compile_ex.implmap
    thunder_subclass.uninstall_hooks()
    try:
        assert sym.id not in torch_compile_ex.implmap
    finally:
        thunder_subclass.install_hooks()
    assert sym.id in torch_compile_ex.implmap
    # not pointwise: joins regions through an opaque custom-op wrapper that keeps eager input layouts
    scaled_mm = thunder_subclass.frontend.aten_symbols.aten_symbol(torch.ops.aten._scaled_mm.default)
    assert torch_compile_ex.implmap[scaled_mm.id].execution_transform is not None
    assert torch.ops.thunder_subclass_opaque.aten__scaled_mm_default.default._schema.arguments[1].name == "mat2"
    # in-place ops stay outside
    assert thunder_subclass.frontend.aten_symbols.aten_symbol(torch.ops.aten.add_.Tensor).id not in torch_compile_ex.implmap


_TRACEBACK_PROGRAM = '''
import os, sys, traceback
import torch
import thunder_subclass, thunder
import thunder.core.interpreter as interpreter
from torch.testing._internal.two_tensor import TwoTensor


def helper(d):
    return d["missing"] + 1


def f(x):
    for _ in range(2):  # the interpreter ends the loop with a StopIteration, caught: a made-up frame each
        x = x * 2
    return helper({}) + x


def user_frames(jfn, x):
    try:
        jfn(x)
    except KeyError as e:
        return [(fr.lineno, fr.name, fr.line) for fr in traceback.extract_tb(e.__traceback__) if fr.filename == __file__]
    raise AssertionError("no KeyError")


eager = user_frames(f, torch.ones(2))
thunder_subclass.install_hooks()
hooked = interpreter.InterpreterFrame.get_or_make_python_frame
assert getattr(hooked, "_thunder_subclass_hook", False)
plain = user_frames(thunder.jit(f), torch.ones(2))  # thunder's own frames (the hooks act only for plugin jits)
plugin = user_frames(thunder_subclass.jit(f), TwoTensor(torch.ones(2), torch.ones(2)))
# the interpreter's bytecode was read from the cache while the plugin jit traced
cached = interpreter.dis._instructions[f.__code__]
assert cached == tuple(__import__("dis").get_instructions(f.__code__))
thunder_subclass.uninstall_hooks()
assert interpreter.InterpreterFrame.get_or_make_python_frame is hooked.__wrapped__
assert interpreter.dis is sys.modules["dis"]
print(repr((eager, plain, plugin)))
'''


@pytest.mark.slow
def test_tracebacks_from_interpreted_code_show_the_user_lines_in_a_fresh_process(tmp_path):
    # thunder's interpreter puts a made-up frame per interpreted function into the traceback (the hook on
    # InterpreterFrame.get_or_make_python_frame makes it without thunder's 5 ms busy wait): the user's file, line, function
    # name and source line, as in eager and in plain thunder.jit
    script = tmp_path / "program.py"
    script.write_text(_TRACEBACK_PROGRAM)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    eager, plain, plugin = eval(out.stdout.strip().splitlines()[-1])
    lines = _TRACEBACK_PROGRAM.splitlines()
    helper_line = 1 + lines.index('    return d["missing"] + 1')
    f_line = 1 + lines.index("    return helper({}) + x")
    assert eager[-2:] == [(f_line, "f", "return helper({}) + x"), (helper_line, "helper", 'return d["missing"] + 1')]
    assert plugin == plain and plain[-2:] == eager[-2:], (plugin, plain)


def test_interpreter_fixes_are_parts_by_concern_each_with_its_table():
    # each part: its own hook targets and lookaside table (a dict keyed by function), at most 600 lines; the merged
    # lookaside finds a part's fix by the function (or the callable's type), thunder's own call otherwise
    import inspect
    import itertools
    import operator

    from thunder_subclass._thunder_internals.fixes import iteration as fixes_iteration
    from thunder_subclass._thunder_internals import fixes as interpreter_fixes

    assert len(interpreter_fixes.PARTS) == 7
    targets = []
    for part in interpreter_fixes.PARTS:
        assert len(inspect.getsource(part).splitlines()) <= 600, part.__name__
        assert isinstance(part.lookasides(), dict), part.__name__
        targets += part.hook_targets()
    assert [t[:2] for t in targets] == [t[:2] for t in interpreter_fixes.hook_targets()] and len(targets) == 20
    assert itertools.chain in fixes_iteration.lookasides()
    assert interpreter_fixes.interpreter_fix_lookaside(itertools.chain, (), {}) is not None
    assert interpreter_fixes.interpreter_fix_lookaside(operator.itemgetter(1), (object(),), {}) is not None
    assert interpreter_fixes.interpreter_fix_lookaside(len, (object(),), {}) is None
    assert interpreter_fixes.interpreter_fix_lookaside([].append, (), {}) is None  # (a method: not a fix)


def _branchy(x):
    if x.sum() > 0:  # a data-dependent branch: speculated, counted per source line
        return x * 2
    return x - 1


def test_per_jit_state_is_one_typed_record_on_the_compile_data():
    # the call port, the per-thread grad mode and the speculation counts live in one JitRecord, under one key
    jf = thunder_subclass.jit(_branchy)
    x = torch.ones(3)
    torch.testing.assert_close(jf(x), _branchy(x))
    torch.testing.assert_close(jf(-x), _branchy(-x))  # the other branch: a miss, a second trace
    assert thunder.cache_misses(jf) == 2
    cd = thunder.compile_data(jf)
    assert [k for k in vars(cd) if k.startswith("_thunder_subclass")] == ["_thunder_subclass_jit_record"]
    record = _thunder_internals.jit_record(cd)
    assert isinstance(record, _thunder_internals.JitRecord)
    assert isinstance(record.call_port, _thunder_internals.CallPort)
    assert record.grad_mode is not None and cd.is_grad_enabled is torch.is_grad_enabled()
    assert sum(record.speculations.values()) == 2, record.speculations


def _wrapper_chain(compiled):
    """``compiled`` and what it wraps: the module's forward functions, each wrapper's ``__wrapped__``."""
    seen, todo = [], [compiled, getattr(compiled, "_forward_fn", None)]
    while todo:
        obj = todo.pop()
        if obj is not None and all(obj is not s for s in seen):
            seen.append(obj)
            todo.append(vars(obj).get("__wrapped__") if hasattr(obj, "__dict__") else None)
    return seen


@pytest.mark.parametrize("kind", ["function", "module"])
def test_per_jit_policy_fast_call_and_graph_breaks_live_in_the_record_not_on_the_compiled_object(kind):
    # the cache policy, the fast-call flag, automatic dynamic shapes and the graph-break program: JitRecord fields,
    # not attributes of the compiled function / ThunderModule / its wrappers
    fn = torch.nn.Linear(3, 2) if kind == "module" else _branchy
    jf = thunder_subclass.jit(fn)
    x = torch.ones(2, 3)
    torch.testing.assert_close(jf(x), fn(x))
    torch.testing.assert_close(jf(torch.ones(4, 3)), fn(torch.ones(4, 3)))  # a second size: a miss
    record = _thunder_internals.record_of(jf)
    assert record is _thunder_internals.jit_record(thunder.compile_data(jf))
    assert isinstance(record.policy, thunder_subclass.runtime.cache.CachePolicy)
    assert record.fast_call is True
    assert isinstance(record.dynamic_shapes, thunder_subclass.runtime.cache_policy.AutomaticDynamicShapes)
    assert record.graph_break_program() is not None and jf.graph_breaks is record.graph_break_program().report
    for obj in _wrapper_chain(jf):
        assert [k for k in vars(obj) if k.startswith("_thunder_subclass")] == [], obj
    assert len(thunder_subclass.explain_recompiles(jf)) == 1  # (reads the record's policy)
    plain = thunder.jit(fn)
    assert _thunder_internals.record_of(plain) is None and _thunder_internals.record_of(fn) is None
    with pytest.raises(TypeError, match="is not a function or module compiled by thunder_subclass.jit"):
        thunder_subclass.explain_recompiles(plain)
