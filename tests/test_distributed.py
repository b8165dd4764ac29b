"""torch.distributed under thunder_subclass.jit (issue 17): tensor parallelism and DTensor code traced through,
FSDP2 compiled between its hooks, float8 under FSDP2, TP + FSDP2 on a 2-D mesh; each equal to the same model run
eagerly for three optimizer steps. Processes are spawned on 127.0.0.1 (gloo on CPU; NCCL for the ``cuda`` variants),
a free port per test, bounded time (``distributed_cases.run``). Cases that share a process group run in one spawn
(a spawn with imports costs 10-20 s on 2 CPU cores); the example is run with torchrun."""

import os
import pathlib
import subprocess
import sys

import pytest
import torch

import distributed_cases as cases

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="torch.distributed with gloo is not available",
)

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _float8_cases() -> tuple:
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        return ()
    return ("float8", "float8 all-gather")


def _needs_gpus(n: int):
    return pytest.mark.skipif(
        torch.cuda.device_count() < n or not torch.distributed.is_nccl_available(),
        reason=f"needs {n} CUDA GPUs and NCCL",
    )


def test_tensor_parallel_and_dtensor_code():
    # TP MLP (Colwise/Rowwise), SequenceParallel / PrepareModuleInput transformer block, DTensor API in user code
    # (from_local, to_local, redistribute, full_tensor, distribute_tensor, Partial -> Replicate / Shard),
    # AsyncCollectiveTensor inputs
    cases.run(cases.tensor_parallel_cases, 2, args=("gloo",))


def test_fsdp2_and_float8_under_fsdp2():
    # root + per-layer fully_shard, reshard_after_forward True and False, AdamW; torchao float8 training under FSDP2
    # with and without float8 all-gather
    cases.run(cases.fsdp2_cases, 2, args=("gloo", _float8_cases()))


def test_tensor_parallel_and_fsdp2_on_a_2d_mesh():
    cases.run(cases.tp_fsdp_2d, 4, args=("gloo",))


@pytest.mark.slow
def test_example_runs_under_torchrun():
    # torchrun is `python -m torch.distributed.run`
    pytest.importorskip("torchao.float8")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(cases.free_port()), str(ROOT / "examples" / "distributed_train.py"), "--steps", "2"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    for line in ("FSDP2 + float8", "tensor parallel"):
        assert line in out.stdout, out.stdout
    assert "DIFFERENT" not in out.stdout, out.stdout


@pytest.mark.cuda
@_needs_gpus(2)
def test_tensor_parallel_and_dtensor_code_nccl():
    cases.run(cases.tensor_parallel_cases, 2, backend="nccl", args=("nccl",))


@pytest.mark.cuda
@_needs_gpus(2)
def test_fsdp2_and_float8_under_fsdp2_nccl():
    cases.run(cases.fsdp2_cases, 2, backend="nccl", args=("nccl", _float8_cases()))


@pytest.mark.cuda
@_needs_gpus(4)
def test_tensor_parallel_and_fsdp2_on_a_2d_mesh_nccl():
    cases.run(cases.tp_fsdp_2d, 4, backend="nccl", args=("nccl",))
