"""The on-disk cache (``thunder_subclass.runtime.disk_cache``): a second process loads what the first stored, equal to
eager; corrupted, stale and foreign entries are never trusted.

The restart itself runs in subprocesses (``_disk_cache_runner.py``); the checks of what a load trusts run in this
process with a second ``thunder_subclass.jit`` of the same code (an empty in-memory cache: its first call goes to disk,
as a new process's would)."""

import dataclasses
import importlib
import json
import os
import pathlib
import subprocess
import sys
import textwrap
import warnings

import pytest
import thunder
import torch
from torch.testing._internal.two_tensor import TwoTensor

import thunder_subclass
from thunder_subclass.runtime import disk_cache

_RUNNER = os.path.join(os.path.dirname(__file__), "_disk_cache_runner.py")


def _run(cache_dir, *cases, env=None) -> dict:
    """One process of the runner; ``env`` values of None remove the variable."""
    env = {**os.environ, "THUNDER_SUBCLASS_DISK_CACHE": "1", "THUNDER_SUBCLASS_CACHE_DIR": str(cache_dir),
           "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    env = {k: v for k, v in env.items() if v is not None}
    out = subprocess.run([sys.executable, _RUNNER, *cases], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    for name, r in report["results"].items():
        assert r["error"] is None, f"{name}:\n{r['error']}"
    return report


@pytest.mark.slow
def test_second_process_loads_the_first_ones_compilation(tmp_path):
    # (guarded_module: its prologue checks a method's function and a torch state query, both stored)
    cases = ("plain_function", "twotensor_mlp", "int8_mlp", "guarded_module")
    first = _run(tmp_path, *cases)
    assert first["stats"]["stores"] == len(cases), first["stats"]
    assert first["stats"]["hits"] == 0
    assert not any(r["loaded"] for r in first["results"].values())
    second = _run(tmp_path, *cases)  # values equal eager checked in the runner
    assert second["stats"]["hits"] == len(cases), second["stats"]
    assert second["stats"]["misses"] == 0 and second["stats"]["stores"] == 0
    assert all(r["loaded"] for r in second["results"].values())


@pytest.mark.slow
def test_an_environment_variable_read_in_forward_is_checked_after_a_load(tmp_path):
    # the value read is a prologue check of the stored entry: process 2 with another value did not get process 1's
    first = _run(tmp_path, "environ_module", env={"THUNDER_SUBCLASS_TEST_FACTOR": "2"})
    assert first["stats"]["stores"] == 1, first["stats"]
    second = _run(tmp_path, "environ_module", env={"THUNDER_SUBCLASS_TEST_FACTOR": "5"})  # equal to eager (runner)
    assert second["stats"]["hits"] == 0 and second["stats"]["rejected"] == 1, second["stats"]
    assert not second["results"]["environ_module"]["loaded"]
    third = _run(tmp_path, "environ_module", env={"THUNDER_SUBCLASS_TEST_FACTOR": "2"})
    assert third["stats"]["hits"] == 1 and third["results"]["environ_module"]["loaded"], third["stats"]


@pytest.mark.slow
def test_a_helper_behind_lru_cache_edited_between_processes_is_a_miss(tmp_path):
    # functools.lru_cache's wrapper is C: the interpreter runs it natively and never decoded the helper's code, so its
    # file was not among the entry's recorded files and process 2 served process 1's factor
    helper_dir = tmp_path / "helpers"
    helper_dir.mkdir()
    source = "import functools\n\n\n@functools.lru_cache\ndef factor():\n    return {}\n"
    env = {"THUNDER_SUBCLASS_TEST_HELPER_DIR": str(helper_dir)}
    (helper_dir / "disk_cache_lru_helper.py").write_text(source.format("2.0"))
    first = _run(tmp_path / "cache", "lru_helper_module", env=env)
    assert first["stats"]["stores"] == 1, first["stats"]
    (helper_dir / "disk_cache_lru_helper.py").write_text(source.format("3.0 + 4.0"))
    second = _run(tmp_path / "cache", "lru_helper_module", env=env)  # equal to eager with the new helper (runner)
    assert second["stats"]["hits"] == 0 and second["stats"]["stale"] == 1, second["stats"]
    third = _run(tmp_path / "cache", "lru_helper_module", env=env)
    assert third["stats"]["hits"] == 1, third["stats"]


# Issue 44 item 3: on by default, training too, and every way an entry can be stale is a miss across processes.

@pytest.mark.slow
def test_on_by_default_with_an_environment_switch_off(tmp_path):
    first = _run(tmp_path, "plain_function", env={"THUNDER_SUBCLASS_DISK_CACHE": None})
    assert first["disk_cache"] is True and first["stats"]["stores"] == 1, first
    off = _run(tmp_path, "plain_function", env={"THUNDER_SUBCLASS_DISK_CACHE": "0"})
    assert off["disk_cache"] is False and not off["results"]["plain_function"]["loaded"]
    assert off["stats"]["hits"] == off["stats"]["misses"] == off["stats"]["stores"] == 0, off["stats"]
    second = _run(tmp_path, "plain_function", env={"THUNDER_SUBCLASS_DISK_CACHE": None})
    assert second["stats"]["hits"] == 1 and second["results"]["plain_function"]["loaded"], second["stats"]


@pytest.mark.slow
def test_a_restarted_training_step_loads_forward_and_backward(tmp_path):
    # gradients equal eager's and the backward trace is the loaded one (checked in the runner)
    cases = ("train_mlp", "train_int8_weight")
    first = _run(tmp_path, *cases)
    assert first["stats"]["stores"] == 2 and first["stats"]["hits"] == 0, first["stats"]
    second = _run(tmp_path, *cases)
    assert second["stats"]["hits"] == 2 and second["stats"]["stores"] == 0, second["stats"]
    assert all(r["loaded"] for r in second["results"].values())


@pytest.mark.slow
def test_a_restarted_program_with_eager_calls_is_recompiled_not_loaded(tmp_path):
    """A trace holding an eager call (or its backward) names the call by its place in this process's table of eager
    calls: it is not stored, so the restarted process compiles it again and its training steps equal eager's (a stored
    backward trace used to be loaded and fail with IndexError, or could have run another process's call)."""
    first = _run(tmp_path, "eager_call_training")
    assert first["stats"]["not_storable"] >= 1, first["stats"]
    stored = [p for p in tmp_path.rglob("*.json") if "eager_module_call" in p.read_text()]
    assert not stored, stored
    _run(tmp_path, "eager_call_training")  # (its regions may load) values and gradients equal eager: in the runner


@pytest.mark.slow
def test_a_restarted_training_step_with_subclass_outputs_loads_forward_and_backward(tmp_path):
    # a TwoTensor output: the gradient kinds its backward expects are stored; values, types and gradients equal
    # eager's, and a gradient of another kind (a plain one for the TwoTensor output, a TwoTensor one for a plain
    # output: scaled, whose backward saves nothing) is served after a load as in the first process: the call traced
    # again in-process (one miss), the backward for that kind built from its joint trace and fed the loaded forward's
    # saved tensors (checked in the runner)
    first = _run(tmp_path, "train_twotensor_mlp", "train_scaled_twotensor_grad")
    assert first["stats"]["stores"] == 2 and first["stats"]["hits"] == 0, first["stats"]
    assert first["stats"]["not_storable"] == 0, first["stats"]
    # (train_twotensor_mlp_plain_grad: the same model, a new jit: served by the entry train_twotensor_mlp stored)
    second = _run(tmp_path, "train_twotensor_mlp", "train_twotensor_mlp_plain_grad", "train_scaled_twotensor_grad")
    assert second["stats"]["hits"] == 3 and second["stats"]["stores"] == 0, second["stats"]
    assert all(r["loaded"] for r in second["results"].values())
    assert second["results"]["train_twotensor_mlp"]["traced"] == 0
    assert second["results"]["train_twotensor_mlp_plain_grad"]["traced"] == 1
    assert second["results"]["train_scaled_twotensor_grad"]["traced"] == 1


@pytest.mark.slow
def test_another_default_device_is_a_miss(tmp_path):
    # torch.ones(3) makes a tensor of the default device: the stored CPU program would answer on the CPU where eager
    # answers on the meta device (a device a CPU-only machine has)
    assert _run(tmp_path, "default_device_function")["stats"]["stores"] == 1
    second = _run(tmp_path, "default_device_function", env={"THUNDER_SUBCLASS_TEST_DEFAULT_DEVICE": "meta"})
    assert not second["results"]["default_device_function"]["loaded"], second["stats"]  # meta, as eager (runner)
    # another key (thunder's prologue checks the default device too: without the key it would reject the entry)
    assert second["stats"]["hits"] == 0 and second["stats"]["rejected"] == 0 and second["stats"]["stores"] == 1
    third = _run(tmp_path, "default_device_function", env={"THUNDER_SUBCLASS_TEST_DEFAULT_DEVICE": "meta"})
    assert third["stats"]["hits"] == 1 and third["results"]["default_device_function"]["loaded"], third["stats"]


@pytest.mark.slow
def test_an_edited_helper_module_is_a_miss(tmp_path):
    helper_dir = tmp_path / "helpers"
    helper_dir.mkdir()
    env = {"THUNDER_SUBCLASS_TEST_HELPER_DIR": str(helper_dir)}
    (helper_dir / "disk_cache_helper.py").write_text("def scale(x):\n    return x * 2\n")
    assert _run(tmp_path / "cache", "helper_module", env=env)["stats"]["stores"] == 1
    (helper_dir / "disk_cache_helper.py").write_text("def scale(x):\n    return x * 3 - 1\n")
    second = _run(tmp_path / "cache", "helper_module", env=env)  # equal to eager with the edited helper (runner)
    assert second["stats"]["hits"] == 0 and second["stats"]["stale"] == 1, second["stats"]
    assert not second["results"]["helper_module"]["loaded"]


@pytest.mark.slow
def test_another_class_of_the_same_module_and_name_is_a_miss(tmp_path):
    source = ("import torch\n\n\nclass Model(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
              "        self.lin = torch.nn.Linear(4, 4)\n\n    def forward(self, x):\n        return {}\n")
    for name, body in (("a", "self.lin(x).relu()"), ("b", "self.lin(x).sigmoid() * 2")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "disk_cache_same_name.py").write_text(source.format(body))
    first = _run(tmp_path / "cache", "same_name_model", env={"THUNDER_SUBCLASS_TEST_MODEL_DIR": str(tmp_path / "a")})
    assert first["stats"]["stores"] == 1
    second = _run(tmp_path / "cache", "same_name_model", env={"THUNDER_SUBCLASS_TEST_MODEL_DIR": str(tmp_path / "b")})
    assert second["stats"]["hits"] == 0 and not second["results"]["same_name_model"]["loaded"], second["stats"]
    third = _run(tmp_path / "cache", "same_name_model", env={"THUNDER_SUBCLASS_TEST_MODEL_DIR": str(tmp_path / "a")})
    assert third["results"]["same_name_model"]["loaded"], third["stats"]


@pytest.mark.slow
def test_a_changed_module_attribute_or_global_is_a_miss(tmp_path):
    # the factor is set in __init__, the shift is a module global: both read by forward, both guarded after a load
    def run(factor, shift):
        env = {"THUNDER_SUBCLASS_TEST_FACTOR": factor, "THUNDER_SUBCLASS_TEST_SHIFT": shift}
        return _run(tmp_path, "attribute_module", env=env)

    assert run("2", "0")["stats"]["stores"] == 1
    for factor, shift in (("3", "0"), ("2", "1")):  # equal to eager with these values (runner)
        report = run(factor, shift)
        assert not report["results"]["attribute_module"]["loaded"], (factor, shift, report["stats"])
        assert report["stats"]["rejected"] >= 1, report["stats"]
    assert run("2", "0")["results"]["attribute_module"]["loaded"]


@pytest.mark.slow
def test_another_default_dtype_is_a_miss(tmp_path):
    # torch.ones(3) makes a tensor of the default dtype: the stored float32 program would answer float32
    assert _run(tmp_path, "default_dtype_function")["stats"]["stores"] == 1
    second = _run(tmp_path, "default_dtype_function", env={"THUNDER_SUBCLASS_TEST_DEFAULT_DTYPE": "float64"})
    assert not second["results"]["default_dtype_function"]["loaded"], second["stats"]  # float64, as eager (runner)
    assert second["stats"]["hits"] == 0 and second["stats"]["stores"] == 1


@pytest.mark.slow
def test_another_library_version_is_a_miss(tmp_path):
    # each library's version faked in turn: process 1 stores one entry per version set (the real one last),
    # process 2, whose fakes are other versions, loads the real one only; process 3 with process 1's fakes, all
    first = _run(tmp_path, "version_sweep", env={"THUNDER_SUBCLASS_TEST_FAKE_VERSION": "one"})
    assert first["stats"]["stores"] == 5, first["stats"]
    second = _run(tmp_path, "version_sweep", env={"THUNDER_SUBCLASS_TEST_FAKE_VERSION": "two"})
    loaded = second["results"]["version_sweep"]["loaded"]
    assert loaded == {"torch": False, "thunder": False, "transformers": False, "torchao": False, "real": True}
    third = _run(tmp_path, "version_sweep", env={"THUNDER_SUBCLASS_TEST_FAKE_VERSION": "one"})
    assert all(third["results"]["version_sweep"]["loaded"].values()), third["stats"]


@pytest.mark.slow
def test_concurrent_first_processes_then_a_hit(tmp_path):
    env = {**os.environ, "THUNDER_SUBCLASS_DISK_CACHE": "1", "THUNDER_SUBCLASS_CACHE_DIR": str(tmp_path),
           "CUDA_VISIBLE_DEVICES": ""}
    procs = [subprocess.Popen([sys.executable, _RUNNER, "twotensor_mlp"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1])["results"]["twotensor_mlp"]["error"] is None
    assert not list(tmp_path.rglob("*.part"))  # no temporary file left behind
    report = _run(tmp_path, "twotensor_mlp")
    assert report["stats"]["hits"] == 1 and report["results"]["twotensor_mlp"]["loaded"], report["stats"]


# ---------------------------------------------------------------------------------------------------------------
# In this process: a second jit of the same code reads the disk as a new process would
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def disk(tmp_path):
    config = thunder_subclass.config
    saved = (config.disk_cache, config.disk_cache_dir, config.disk_cache_size_limit)
    config.disk_cache, config.disk_cache_dir = True, str(tmp_path / "cache")
    disk_cache.reset_disk_cache_stats()
    try:
        yield tmp_path / "cache"
    finally:
        config.disk_cache, config.disk_cache_dir, config.disk_cache_size_limit = saved
        disk_cache.reset_disk_cache_stats()


_HELPER_SOURCE = '''
def scale(x):
    return x * {factor}
'''

_MODEL_SOURCE = '''
import torch

import {helper}


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return {helper}.scale(self.lin(x)).relu()
'''


@pytest.fixture
def model_module(tmp_path, monkeypatch):
    """A module holding ``Model``, whose forward calls ``scale`` of a helper module; ``write(factor)`` (re)writes the
    helper with ``x * factor`` and returns the model's module."""
    tag = abs(hash(str(tmp_path)))
    name, helper = f"disk_cache_model_{tag}", f"disk_cache_helper_{tag}"
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / f"{name}.py").write_text(_MODEL_SOURCE.format(helper=helper))

    def write(factor: str):
        (tmp_path / f"{helper}.py").write_text(_HELPER_SOURCE.format(factor=factor))
        if helper in sys.modules:
            importlib.reload(sys.modules[helper])
        return importlib.import_module(name)

    yield write
    sys.modules.pop(name, None)
    sys.modules.pop(helper, None)


def _entries(root):
    return sorted(root.rglob("*.json"))


def _call(model, x):
    jm = thunder_subclass.jit(model)
    with torch.no_grad():
        out = jm(x)
        torch.testing.assert_close(out, model(x))
    return jm, out


def test_second_jit_loads_from_disk(disk, model_module):
    mod = model_module("2")
    model, x = mod.Model(), torch.randn(3, 4)
    _call(model, x)
    assert disk_cache.disk_cache_stats()["stores"] == 1 and len(_entries(disk)) == 1
    jm, _ = _call(model, x)
    stats = disk_cache.disk_cache_stats()
    assert stats["hits"] == 1 and stats["stores"] == 1
    assert isinstance(thunder.last_traces(jm)[-1], disk_cache.LoadedTrace)
    with torch.no_grad():  # later calls: in-memory cache hits of the loaded entry
        torch.testing.assert_close(jm(x + 1), model(x + 1))
    assert thunder.cache_hits(jm) == 1


def test_changed_source_of_a_traced_function_is_a_miss(disk, model_module):
    mod = model_module("2")
    model, x = mod.Model(), torch.randn(3, 4)
    _call(model, x)
    model_module("3.0")  # scale() changed, in a file the trace interpreted (not the model's own)
    _, out = _call(model, x)  # equal to eager with the new code (checked in _call)
    with torch.no_grad():
        torch.testing.assert_close(out, (model.lin(x) * 3.0).relu())
    stats = disk_cache.disk_cache_stats()
    assert stats["hits"] == 0 and stats["stale"] == 1 and stats["stores"] == 2, stats
    assert len(_entries(disk)) == 1  # the stale entry was removed, the new one stored


def test_corrupted_entry_is_recompiled_with_a_warning(disk, model_module):
    mod = model_module("2")
    model, x = mod.Model(), torch.randn(3, 4)
    _call(model, x)
    (entry,) = _entries(disk)
    text = entry.read_text()
    entry.write_text(text.replace("relu", "sigmoid"))  # the payload no longer matches its checksum
    with pytest.warns(thunder_subclass.DiskCacheWarning, match="unreadable .*checksum mismatch"):
        _call(model, x)
    (entry,) = _entries(disk)  # the corrupted file was removed, the new trace stored
    entry.write_text(entry.read_text()[: len(text) // 2])  # truncated
    with pytest.warns(thunder_subclass.DiskCacheWarning, match="unreadable"):
        _call(model, x)
    stats = disk_cache.disk_cache_stats()
    assert stats["corrupted"] == 2 and stats["hits"] == 0 and stats["stores"] == 3, stats


def test_an_entry_written_before_the_package_moved_into_folders_is_not_read(disk, model_module):
    # issue 42: the plugin's modules moved into folders (frontend/, transforms/, runtime/, guards/); an entry stored
    # before (format 2) names their old paths: it is not read (format 3 entries live in another directory), so it is
    # neither tried, nor counted stale, nor removed
    import hashlib
    import re

    mod = model_module("2")
    model, x = mod.Model(), torch.randn(3, 4)
    _call(model, x)
    (entry,) = _entries(disk)
    wrapper = json.loads(entry.read_text())
    payload = json.loads(wrapper["payload"])
    old_paths = re.sub(r"thunder_subclass\.(?:frontend|transforms|runtime)\.", "thunder_subclass.", wrapper["payload"])
    old_paths = old_paths.replace("thunder_subclass.guards.prologue", "thunder_subclass.guards.prologue")
    assert old_paths != wrapper["payload"]  # the entry names modules of the plugin
    old_payload = json.dumps({**json.loads(old_paths), "format": 2})
    old = disk / "v2" / entry.relative_to(disk / f"v{payload['format']}")
    old.parent.mkdir(parents=True, exist_ok=True)
    old.write_text(json.dumps({"payload": old_payload, "sha256": hashlib.sha256(old_payload.encode()).hexdigest()}))
    entry.unlink()
    disk_cache.reset_disk_cache_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("error", thunder_subclass.DiskCacheWarning)
        _call(model, x)  # equal to eager (checked in _call)
    stats = disk_cache.disk_cache_stats()
    assert stats["hits"] == 0 and stats["stale"] == 0 and stats["corrupted"] == 0 and stats["stores"] == 1, stats
    assert old.exists() and len(_entries(disk / f"v{payload['format']}")) == 1


def test_the_plugins_source_hash_covers_every_module_of_the_package():
    # an edit of any module of the plugin (in any of its folders) makes every stored entry a miss
    root, paths = disk_cache._plugin_source_files()
    assert root == pathlib.Path(thunder_subclass.__file__).resolve().parent
    names = {p.relative_to(root).as_posix() for p in paths}
    assert {"__init__.py", "plugin.py", "frontend/proxy.py", "guards/tensors.py", "transforms/flatten.py",
            "runtime/disk_cache.py", "_thunder_internals/fixes/attributes.py"} <= names


def test_other_shapes_are_other_entries(disk, model_module):
    mod = model_module("2")
    model = mod.Model()
    _call(model, torch.randn(3, 4))
    _call(model, torch.randn(5, 4))  # the stored entry's prologue rejects this call: traced, stored
    stats = disk_cache.disk_cache_stats()
    assert stats["rejected"] == 1 and stats["stores"] == 2 and len(_entries(disk)) == 2
    _call(model, torch.randn(3, 4))
    _call(model, torch.randn(5, 4))
    assert disk_cache.disk_cache_stats()["hits"] == 2


def test_another_subclass_type_is_not_served_the_stored_entry(disk):
    from thunder_subclass.demo import Int8Weight

    torch.manual_seed(0)
    x = torch.randn(2, 8)
    layer = torch.nn.Linear(8, 4).requires_grad_(False)
    layer.weight = torch.nn.Parameter(Int8Weight.from_float(layer.weight), requires_grad=False)
    _call(layer, x)
    layer = torch.nn.Linear(8, 4)  # the same module class, code and options: the same key
    layer.weight = torch.nn.Parameter(TwoTensor(layer.weight.detach(), layer.weight.detach() * 2))
    jm = thunder_subclass.jit(layer)
    with torch.no_grad():
        out, expected = jm(x), layer(x)
    assert type(out) is TwoTensor
    torch.testing.assert_close(out.a, expected.a)
    torch.testing.assert_close(out.b, expected.b)
    stats = disk_cache.disk_cache_stats()
    assert stats["rejected"] == 1 and stats["hits"] == 0 and stats["stores"] == 2, stats


def test_training_calls_are_stored_with_their_backward(disk, model_module):
    mod = model_module("2")
    model, x = mod.Model(), torch.randn(3, 4)

    def step(jm):
        out = jm(x)
        out.sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        return out, grads

    step(thunder_subclass.jit(model))
    assert disk_cache.disk_cache_stats()["stores"] == 1
    jm = thunder_subclass.jit(model)
    out, grads = step(jm)  # loaded: forward, backward
    assert isinstance(thunder.last_backward_traces(jm)[-1], disk_cache.LoadedTrace)
    expected, want = step(model)
    torch.testing.assert_close(out, expected)
    for a, b in zip(grads, want):
        torch.testing.assert_close(a, b)
    stats = disk_cache.disk_cache_stats()
    assert stats["hits"] == 1 and stats["stores"] == 1, stats
    with torch.no_grad():  # no gradients needed: not the stored training entry (the prologue checks requires_grad)
        torch.testing.assert_close(jm(x), model(x))
    assert disk_cache.disk_cache_stats()["rejected"] == 0 and thunder.cache_misses(jm) == 2


def test_a_loaded_backward_serves_create_graph(disk, model_module):
    # a gradient penalty through a loaded entry: the plugin's create_graph path (eager recomputation) as in memory
    mod = model_module("2")
    model, x = mod.Model(), torch.randn(3, 4, requires_grad=True)
    thunder_subclass.jit(model)(x).sum().backward()
    jm = thunder_subclass.jit(model)

    def penalty(f):
        (g,) = torch.autograd.grad(f(x).square().sum(), x, create_graph=True)
        (gg,) = torch.autograd.grad(g.square().sum(), model.lin.weight)
        return g, gg

    got, want = penalty(jm), penalty(model)
    assert isinstance(thunder.last_backward_traces(jm)[-1], disk_cache.LoadedTrace)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_a_loaded_backward_given_a_gradient_of_another_kind_traces_the_call_again(disk):
    layer = torch.nn.Linear(4, 2)
    layer.weight = torch.nn.Parameter(TwoTensor(layer.weight.detach(), layer.weight.detach() * 2))
    x = torch.randn(3, 4)
    thunder_subclass.jit(layer)(x).sum().backward()
    layer.zero_grad()
    jm = thunder_subclass.jit(layer)
    out = jm(x)  # loaded
    assert thunder.cache_misses(jm) == 1 and isinstance(thunder.last_traces(jm)[-1], disk_cache.LoadedTrace)
    grad = torch.full((3, 2), 0.5)  # a plain gradient for the TwoTensor output: a variant needs the joint trace
    out.backward(grad)
    got = [p.grad for p in layer.parameters()]
    layer.zero_grad()
    layer(x).backward(grad)
    for a, b in zip(thunder_subclass_flat(got), thunder_subclass_flat([p.grad for p in layer.parameters()])):
        assert type(a) is type(b)
        torch.testing.assert_close(a, b)
    # the trace made for it is a miss; the jit's cache keeps the loaded entry, and later calls use it
    assert thunder.cache_misses(jm) == 2 and len(jm._lc_cs.interpreter_cache) == 1
    assert isinstance(thunder.last_traces(jm)[-1], disk_cache.LoadedTrace)
    jm(x).backward(grad)  # the variant built once
    assert thunder.cache_misses(jm) == 2 and disk_cache.disk_cache_stats()["stores"] == 1


def test_a_loaded_backward_whose_call_is_gone_raises_for_a_gradient_of_another_kind(disk):
    w = torch.randn(4, requires_grad=True)

    def shifted_sine(x, w):
        return (x + w).sin()  # saves x + w, not x

    thunder_subclass.jit(shifted_sine)(torch.randn(3, 4), w).sum().backward()
    out = thunder_subclass.jit(shifted_sine)(torch.randn(3, 4), w)  # loaded; its first argument is freed now
    assert disk_cache.disk_cache_stats()["hits"] == 1
    with pytest.raises(thunder_subclass.SubclassGradientError,
                       match=r"loaded from the thunder_subclass disk cache.*TwoTensor.*traces again.*argument of the "
                             r"call was freed.*disk_cache=False"):
        out.backward(TwoTensor(torch.ones(3, 4), torch.ones(3, 4)))


def test_a_backward_for_subclass_outputs_is_stored_and_loaded(disk):
    layer = torch.nn.Linear(4, 2)
    layer.weight = torch.nn.Parameter(TwoTensor(layer.weight.detach(), layer.weight.detach() * 2))
    x = torch.randn(3, 4)

    def step(f, grad=None):
        out = f(x)
        out.backward(grad if grad is not None else torch.ones_like(out))
        grads = [p.grad for p in layer.parameters()]
        layer.zero_grad()
        return out, grads

    step(thunder_subclass.jit(layer))
    assert disk_cache.disk_cache_stats()["stores"] == 1, disk_cache.disk_cache_stats()
    jm = thunder_subclass.jit(layer)
    for grad in (None, TwoTensor(torch.full((3, 2), 0.5), torch.ones(3, 2))):
        got, want = step(jm, grad), step(layer, grad)
        assert isinstance(thunder.last_backward_traces(jm)[-1], disk_cache.LoadedTrace)
        for a, b in zip(thunder_subclass_flat(got), thunder_subclass_flat(want)):
            assert type(a) is type(b)
            torch.testing.assert_close(a, b)
    assert type(got[0]) is TwoTensor and thunder.cache_misses(jm) == 1  # the expected kind: no trace


class _TwoOutputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)
        self.lin.weight = torch.nn.Parameter(TwoTensor(self.lin.weight.detach(), self.lin.weight.detach() * 2))

    def forward(self, x):
        y = self.lin(x)
        return y.sin(), y * 3


def test_a_loaded_backward_fills_in_a_subclass_zero_gradient_for_an_unused_output(disk):
    model, x = _TwoOutputs(), torch.randn(3, 4)

    def step(f):
        first, _ = f(x)  # the second output unused: autograd hands the backward a plain zero gradient for it
        first.sum().backward()
        grads = [p.grad for p in model.parameters()]
        model.zero_grad()
        return grads

    step(thunder_subclass.jit(model))
    jm = thunder_subclass.jit(model)
    got, want = step(jm), step(model)
    assert disk_cache.disk_cache_stats()["hits"] == 1 and thunder.cache_misses(jm) == 1
    for a, b in zip(got, want):
        assert type(a) is type(b)
        torch.testing.assert_close(a, b)


def thunder_subclass_flat(values):
    out = []
    for v in values:
        if isinstance(v, (list, tuple)):
            out += thunder_subclass_flat(v)
        else:
            out += [v] + ([v.a, v.b] if type(v) is TwoTensor else [])
    return out


def test_registrations_turn_the_disk_cache_off(disk, model_module):
    mod = model_module("2")
    model, x = mod.Model(), torch.randn(3, 4)
    _call(model, x)

    def rule(*args):  # never called: the model has no TwoTensor
        raise AssertionError

    with thunder_subclass.register_grad_rule(TwoTensor, torch.mul, rule):
        _call(model, x)
    stats = disk_cache.disk_cache_stats()
    assert stats["hits"] == 0 and stats["stores"] == 1 and "registered" in stats["why_not_storable"][-1]


def test_size_bound_evicts_least_recently_used(disk, model_module):
    mod = model_module("2")
    model = mod.Model()
    _call(model, torch.randn(3, 4))
    (first,) = _entries(disk)
    thunder_subclass.config.disk_cache_size_limit = first.stat().st_size + 100  # room for one entry
    _call(model, torch.randn(5, 4))
    entries = _entries(disk)
    assert len(entries) == 1 and entries[0] != first


def test_functions_sharing_a_line_or_differing_in_closure_values_are_not_confused(disk):
    x = torch.randn(3)
    fs = [lambda t: t * 2, lambda t: t * 3]  # one file, one line, one name
    for f, factor in zip(fs, (2, 3)):
        with torch.no_grad():
            torch.testing.assert_close(thunder_subclass.jit(f)(x), x * factor)
    assert disk_cache.disk_cache_stats()["hits"] == 0

    def make(k):
        def g(t):
            return t * k

        return g

    for k in (2, 3, 2):
        with torch.no_grad():
            torch.testing.assert_close(thunder_subclass.jit(make(k))(x), x * k)
    stats = disk_cache.disk_cache_stats()
    assert stats["hits"] == 1 and stats["stores"] == 4, stats  # the closure's values are part of the key


@dataclasses.dataclass
class _Op:  # value equality, pickles by the names of its fields' values
    fn: object

    def __call__(self, x):
        return self.fn(x)


def test_closures_over_values_the_prologue_does_not_check_are_not_confused(disk):
    # thunder takes `op.fn` (read from a closure cell's object) as a constant of the trace, unchecked: the entry of
    # the sin closure served the cos closure (a wrong answer) until the closure's values became part of the key
    def make(op):
        def apply(x):
            return op(x) * 2

        return apply

    x = torch.randn(3)
    for fn in (torch.sin, torch.cos, torch.sin):
        with torch.no_grad():
            torch.testing.assert_close(thunder_subclass.jit(make(_Op(fn)))(x), fn(x) * 2)
    stats = disk_cache.disk_cache_stats()
    assert stats["hits"] == 1, stats  # the second sin closure: the same values, the same entry

    def unnamed(t):  # a closure over a local function: not describable, so not stored
        return t + 1

    with torch.no_grad():
        torch.testing.assert_close(thunder_subclass.jit(make(_Op(unnamed)))(x), (x + 1) * 2)
    assert "closure" in disk_cache.disk_cache_stats()["why_not_storable"][-1]


def _sin(x):
    return x.sin()


def _cos(x):
    return x.cos()


class _Holding(torch.nn.Module):
    def __init__(self, op):
        super().__init__()
        self.op, self.lin = op, torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.op(self.lin(x))


def test_a_modules_bound_method_is_stored_and_a_closure_over_a_module_is_not(disk):
    x = torch.randn(2, 3)
    for fn in (_sin, _cos, _sin):  # jit(model.forward): what forward reads from the module is checked
        model = _Holding(_Op(fn))
        with torch.no_grad():
            torch.testing.assert_close(thunder_subclass.jit(model.forward)(x), model(x))
    stats = disk_cache.disk_cache_stats()
    assert stats["hits"] == 1 and stats["stores"] == 2, stats

    def make(m):
        def call(t):
            return m(t)

        return call

    # thunder does not check what the trace reads from a module in a closure cell: the sin model's entry served the
    # cos model (a wrong answer) when a module there was named by its class
    for fn in (_sin, _cos):
        model = _Holding(_Op(fn))
        with torch.no_grad():
            torch.testing.assert_close(thunder_subclass.jit(make(model))(x), model(x))
    stats = disk_cache.disk_cache_stats()
    assert stats["hits"] == 1 and "closure" in stats["why_not_storable"][-1], stats


def test_what_cannot_be_named_is_not_storable():
    enc = disk_cache._Encoder()

    class Local:
        pass

    with pytest.raises(disk_cache.NotStorable, match="known by identity only"):
        enc.encode(object())
    with pytest.raises(disk_cache.NotStorable, match="no importable name"):
        enc.encode(Local)
    with pytest.raises(disk_cache.NotStorable, match="no importable name"):
        enc.encode(lambda: None)
    value = {"a": (1, 2.5, float("nan")), "dtype": torch.bfloat16, "size": torch.Size([2, 3]), "cls": TwoTensor,
             "op": torch.ops.aten.mm.default, "device": torch.device("cpu"), "s": frozenset({"x"})}
    decoded = disk_cache._decode(json.loads(json.dumps(enc.encode(value))))
    assert decoded.keys() == value.keys() and decoded["a"][2] != decoded["a"][2]
    assert {k: v for k, v in decoded.items() if k != "a"} == {k: v for k, v in value.items() if k != "a"}
    assert decoded["cls"] is TwoTensor and decoded["op"] is torch.ops.aten.mm.default


def test_builtin_classes_named_by_the_types_module_are_storable():
    # a prologue checking that a value is a Python function (transformers' loss_function lookup in a training step)
    import types

    enc = disk_cache._Encoder()
    for cls in (types.FunctionType, types.MethodType, types.BuiltinFunctionType, int, type(None)):
        assert disk_cache._decode(json.loads(json.dumps(enc.encode(cls)))) is cls


def test_on_by_default_a_jit_option_off_and_location(disk, model_module):
    assert type(thunder_subclass.config).__init__  # the default: on unless THUNDER_SUBCLASS_DISK_CACHE=0
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("THUNDER_SUBCLASS_DISK_CACHE", raising=False)
        assert type(thunder_subclass.config)().disk_cache is True
        for off in ("0", "false", "off"):
            mp.setenv("THUNDER_SUBCLASS_DISK_CACHE", off)
            assert type(thunder_subclass.config)().disk_cache is False
    mod = model_module("2")
    model, x = mod.Model(), torch.randn(3, 4)
    with torch.no_grad():
        thunder_subclass.jit(model, disk_cache=False)(x)
        assert disk_cache.disk_cache_stats()["stores"] == 0 and not _entries(disk)
        thunder_subclass.config.disk_cache = False
        thunder_subclass.jit(model, disk_cache=True)(x)  # the option wins over the setting
        assert disk_cache.disk_cache_stats()["stores"] == 1
    with pytest.raises(TypeError, match="disk_cache must be None, True or False, got 'yes'"):
        thunder_subclass.jit(model, disk_cache="yes")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("THUNDER_SUBCLASS_CACHE_DIR", "/some/where")
        assert str(disk_cache.default_cache_dir()) == "/some/where"
        mp.delenv("THUNDER_SUBCLASS_CACHE_DIR")
        mp.setenv("XDG_CACHE_HOME", "/xdg")
        assert str(disk_cache.default_cache_dir()) == "/xdg/thunder_subclass"


def test_the_test_session_never_writes_into_the_users_cache_directory():
    # (conftest: a directory per test, for this process and the subprocesses it starts)
    home = os.path.join(os.path.expanduser("~"), ".cache")
    for where in (thunder_subclass.config.disk_cache_dir, os.environ["THUNDER_SUBCLASS_CACHE_DIR"]):
        assert where and not os.path.abspath(where).startswith(home), where


# Issue 44 item 4: the cache is private to its user; an entry another user could have written is never read.

def test_directories_and_entries_are_private(disk, model_module):
    mod = model_module("2")
    _call(mod.Model(), torch.randn(3, 4))
    (entry,) = _entries(disk)
    assert oct(entry.stat().st_mode & 0o777) == oct(0o600)
    for d in (entry.parent, entry.parent.parent, disk):
        assert oct(d.stat().st_mode & 0o777) == oct(0o700), d


@pytest.mark.parametrize("where", ["cache directory", "key directory", "entry"])
def test_an_entry_others_can_write_is_not_read(disk, model_module, where):
    mod = model_module("2")
    model, x = mod.Model(), torch.randn(3, 4)
    _call(model, x)
    (entry,) = _entries(disk)
    target = {"cache directory": disk, "key directory": entry.parent, "entry": entry}[where]
    os.chmod(target, 0o777 if target.is_dir() else 0o666)
    with pytest.warns(thunder_subclass.DiskCacheWarning, match=r"is writable by other users \(mode 7*6*\)"):
        jm, _ = _call(model, x)  # compiled, equal to eager (checked in _call)
    assert not isinstance(thunder.last_traces(jm)[-1], disk_cache.LoadedTrace)
    stats = disk_cache.disk_cache_stats()
    assert stats["hits"] == 0 and stats["untrusted"] >= 1, stats
    assert entry.exists()  # not ours to remove


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown to another user needs root")
def test_an_entry_owned_by_another_user_is_not_read(disk, model_module):
    mod = model_module("2")
    model, x = mod.Model(), torch.randn(3, 4)
    _call(model, x)
    (entry,) = _entries(disk)
    os.chown(entry, 12345, -1)
    with pytest.warns(thunder_subclass.DiskCacheWarning, match=r"is owned by user id 12345, not by this process"):
        jm, _ = _call(model, x)
    assert not isinstance(thunder.last_traces(jm)[-1], disk_cache.LoadedTrace)
    assert disk_cache.disk_cache_stats()["hits"] == 0
