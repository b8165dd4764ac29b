"""``python -m thunder_subclass.demo``: a short verdict by default, the traces with ``--traces``, non-zero exit on a
mismatch with eager."""

import subprocess
import sys

import pytest

import torch
from torch.testing._internal.two_tensor import TwoTensor

from thunder_subclass import demo


@pytest.mark.slow
def test_demo_prints_traces_on_request():
    run = subprocess.run([sys.executable, "-m", "thunder_subclass.demo", "--traces"], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "OK: every compiled result equals eager's" in out
    assert "DIFFERS" not in out
    for title in ("inference: first trace", "inference: final execution trace", "training: final backward"):
        assert f"=== {title}" in out, out
    assert "unflatten_TwoTensor" in out  # the backward trace rebuilds the TwoTensor gradient


def test_demo_verdict_is_short_and_mismatch_fails(capsys, monkeypatch):
    assert demo.main([]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) <= 16, out
    assert "===" not in out and "--traces" in out
    assert "1 cache miss, 1 cache hit" in out  # the second inference call reuses the trace

    assert not demo._compare("x", torch.ones(2), torch.zeros(2))
    assert "DIFFERS from eager (max abs difference 1)" in capsys.readouterr().out
    a = torch.randn(3)  # both inner tensors count (assert_close on a TwoTensor compares only .a)
    assert not demo._compare("x", TwoTensor(a, a), TwoTensor(a, a + 1))
    assert not demo._compare("x", torch.ones(3), TwoTensor(a, a))
    monkeypatch.setattr(demo, "training_step", lambda show_traces: False)
    assert demo.main([]) == 1
    assert "FAIL" in capsys.readouterr().out
