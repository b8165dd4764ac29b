import os
import sys
import tempfile

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

# The disk cache is on by default (thunder_subclass.runtime.disk_cache): the tests never write into the user's cache
# directory. Each test gets a directory of its own (_private_disk_cache), in this process and, through the
# environment, in the subprocesses it starts, so no test is served an entry another test stored and every test runs
# as it does alone.
_SESSION_CACHE = tempfile.TemporaryDirectory(prefix="thunder_subclass_test_cache_")
os.environ["THUNDER_SUBCLASS_CACHE_DIR"] = os.path.join(_SESSION_CACHE.name, "collection")

import thunder_subclass  # noqa: E402  (must come before thunder)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _private_disk_cache():
    config = thunder_subclass.config
    saved = (config.disk_cache, config.disk_cache_dir, config.disk_cache_size_limit)
    saved_env = os.environ["THUNDER_SUBCLASS_CACHE_DIR"]
    config.disk_cache_dir = os.environ["THUNDER_SUBCLASS_CACHE_DIR"] = tempfile.mkdtemp(dir=_SESSION_CACHE.name)
    try:
        yield
    finally:
        config.disk_cache, config.disk_cache_dir, config.disk_cache_size_limit = saved
        os.environ["THUNDER_SUBCLASS_CACHE_DIR"] = saved_env


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
