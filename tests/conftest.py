import os
import sys
import tempfile

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

import thunder_subclass  # noqa: E402,F401  (must come before thunder)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def mesh():
    """A one-process gloo device mesh on CPU (process group set up from a temporary file, torn down after the test
    module); the tests that take it are skipped where torch.distributed with gloo is not available."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    with tempfile.NamedTemporaryFile() as f:
        dist.init_process_group("gloo", init_method=f"file://{f.name}", rank=0, world_size=1)
        try:
            yield init_device_mesh("cpu", (1,))
        finally:
            dist.destroy_process_group()
