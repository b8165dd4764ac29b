"""The supported torch range and the per-version shims of ``thunder_subclass._thunder_internals``."""

import importlib.util
import subprocess
import sys

import pytest
import torch

from thunder_subclass import ThunderVersionError
from thunder_subclass import _thunder_internals as internals


@pytest.mark.parametrize("version", ["2.9.1", "2.16.0", "3.0.0"])
def test_torch_outside_the_supported_range_is_a_version_error(monkeypatch, version):
    monkeypatch.setattr(torch, "__version__", version)
    with pytest.raises(ThunderVersionError, match=rf"supports torch >= 2.10, < 2.16, found {version}"):
        internals.check_versions()


@pytest.mark.parametrize("version", ["2.10.0+cu128", "2.13.0+cpu", "2.15.0"])
def test_torch_in_the_supported_range_passes(monkeypatch, version):
    monkeypatch.setattr(torch, "__version__", version)
    internals.check_versions()


def test_every_shim_names_the_torch_versions_it_serves():
    first, below = internals.TORCH_SUPPORTED
    for shim in internals.SHIMS:
        assert first <= shim.first <= shim.last < below and shim.why
    served = {s.apply.__name__ for s in internals.SHIMS if s.serves(internals.torch_version())}
    if internals.torch_version() >= (2, 14):
        assert "_function_apply_as_classmethod" in served


def test_autograd_function_in_eager_after_the_apply_shim():
    """Under torch 2.14/2.15 ``Function.apply`` is rebound as a classmethod calling torch's own C ``apply``:
    backward, setup_context with default arguments, functorch transforms and in-place functions behave as before."""
    apply = torch.autograd.Function.__dict__["apply"]
    assert isinstance(apply, classmethod)  # thunder 0.2.6 reads Function.apply.__func__

    class Exp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x.exp()
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, g):
            (y,) = ctx.saved_tensors
            return g * y

    class Scale(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(x, k=2.0):
            return x * k

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.k = inputs[1]

        @staticmethod
        def backward(ctx, g):
            return g * ctx.k, None

    class DoubleInPlace(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.mark_dirty(x)
            return x.mul_(2)

        @staticmethod
        def backward(ctx, g):
            return g * 2

    x = torch.randn(5, requires_grad=True)
    Exp.apply(x).sum().backward()
    torch.testing.assert_close(x.grad, x.detach().exp())
    x.grad = None
    Scale.apply(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))
    torch.testing.assert_close(torch.vmap(Scale.apply)(torch.ones(3, 4)), torch.full((3, 4), 2.0))
    torch.testing.assert_close(torch.func.grad(lambda t: Scale.apply(t, 3.0).sum())(torch.ones(3)), torch.full((3,), 3.0))
    a = torch.randn(4, requires_grad=True)
    DoubleInPlace.apply(a.clone()).sum().backward()
    torch.testing.assert_close(a.grad, torch.full_like(a, 2.0))
    assert type(Exp.apply(x).grad_fn).__name__ == "ExpBackward"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("nvfuser_direct") is None, reason="nvfuser_direct is not installed")
def test_nvfuser_direct_wheel_gives_thunder_the_nvfuser_function_it_imports():
    """With only nvfuser_direct installed (nvfuser-cu128-torch210), thunder 0.2.6's nvFuser executor imports
    ``compute_tensor_descriptor`` from ``nvfuser`` on every region call. Checked on CPU by reporting CUDA as
    available (thunder looks for nvFuser only then) in a fresh interpreter."""
    code = (
        "import sys, torch\n"
        "torch.cuda.is_available = lambda: True\n"
        "import thunder_subclass\n"
        "from thunder.executors import nvfuserex_impl as impl\n"
        "from thunder.executors.nvfuserex import nvfuserex\n"
        "assert nvfuserex is not None and impl.nvfuser.__name__ == 'nvfuser_direct'\n"
        "assert sys.modules['nvfuser']._thunder_subclass_shim\n"
        "print(impl.compute_contiguity((2, 3), (3, 1)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "((True, True), (1, 0))" in out.stdout
