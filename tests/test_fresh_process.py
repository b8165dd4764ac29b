"""Each feature example's first call in a fresh process (no earlier jit in the process registered anything)."""

import json
import os
import subprocess
import sys

import pytest

import fresh_examples

_RUNNER = os.path.join(os.path.dirname(__file__), "_fresh_runner.py")


@pytest.fixture(scope="module")
def fresh_results():
    # the runner forks a child per example from a process that imported thunder, which on a CUDA machine has
    # initialized CUDA (a forked child cannot use it): the examples are CPU programs, so the GPU is hidden
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, _RUNNER, *fresh_examples.EXAMPLES], capture_output=True, text=True,
                         timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("name", fresh_examples.EXAMPLES)
def test_first_call_in_fresh_process(name, fresh_results):
    error = fresh_results[name]
    assert error is None, f"{name} failed on its first call in a fresh process:\n{error}"
