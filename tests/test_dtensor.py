"""DTensor programs as PyTorch's own DTensor compile tests write them (issue 25), on a world of size 1 (gloo, one
process, a file store): the subclass machinery they exercise (placements, view strategies, functional collectives
returning ``AsyncCollectiveTensor``) is the same as on several ranks. Multi-process programs:
``tests/test_distributed.py``."""

import tempfile

import pytest
import torch

import thunder_subclass
from subclasses import TwoTensor
from test_training import assert_same


@pytest.fixture(scope="module")
def mesh():
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


def _permuted_linear(x, y, z):
    xt = x.permute(0, 2, 1).contiguous()
    return torch._C._nn.linear(xt, y, z).permute(0, 2, 1)


def _leaves():
    torch.manual_seed(0)
    return [torch.randn(4, 4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True),
            torch.randn(4, requires_grad=True)]


def _dtensors(mesh, leaves):
    from torch.distributed.tensor import DTensor, Replicate, Shard

    x, y, z = leaves
    return (DTensor.from_local(x, mesh, [Shard(1)], run_check=False),
            DTensor.from_local(y, mesh, [Shard(1)], run_check=False),
            DTensor.from_local(z, mesh, [Replicate()], run_check=False))


@pytest.mark.parametrize("grad", ["default", "permuted", "contiguous"])
def test_linear_backward_on_dtensors_from_a_permuted_shard1_input(mesh, grad):
    # the gradient of the linear's output is a permuted DTensor: its outer and local strides must describe one layout
    # while the backward is recorded (DTensor's view strategy reads both)
    from torch.distributed.tensor import DTensor

    def run(fn):
        leaves = _leaves()
        out = fn(*_dtensors(mesh, leaves))
        if grad == "default":
            out.contiguous().sum().backward()
        else:
            g = torch.ones(4, 4, 4) if grad == "contiguous" else torch.ones(4, 4, 4).permute(0, 2, 1)
            out.backward(DTensor.from_local(g, mesh, out.placements, run_check=False))
        return out, leaves

    out, leaves = run(thunder_subclass.jit(_permuted_linear))
    expected, eleaves = run(_permuted_linear)
    assert type(out) is DTensor and out.placements == expected.placements and out.stride() == expected.stride()
    torch.testing.assert_close(out.to_local(), expected.to_local())
    for got, want in zip(leaves, eleaves):
        assert_same(got.grad, want.grad)


def test_linear_backward_on_two_tensors_from_a_permuted_input():
    def run(fn):
        leaves = _leaves()
        args = [TwoTensor(t, t * 2) for t in leaves]
        fn(*args).contiguous().sum().backward()
        return leaves

    for got, want in zip(run(thunder_subclass.jit(_permuted_linear)), run(_permuted_linear)):
        assert_same(got.grad, want.grad)


@pytest.mark.parametrize("f", [lambda x: x + 1, lambda x: x.clone(), lambda x: x * 2], ids=["add", "clone", "mul"])
def test_two_tensor_gradient_of_async_collective_tensors(mesh, f):
    # a gradient of another kind than the outputs' (inner AsyncCollectiveTensors, as funcol returns them): a backward
    # made for that kind runs; for add and clone the gradient passes through to the input unchanged
    import torch.distributed._functional_collectives as funcol

    def run(fn):
        torch.manual_seed(0)
        x = TwoTensor(torch.randn(4), torch.randn(4)).requires_grad_()
        g = TwoTensor(funcol.all_reduce(torch.ones(4), "sum", mesh), funcol.all_reduce(torch.full((4,), 2.0), "sum", mesh))
        fn(x).backward(g)
        return x.grad

    got, expected = run(thunder_subclass.jit(f)), run(f)
    assert type(got) is TwoTensor and type(got.a) is type(expected.a)
    torch.testing.assert_close(got.a.wait() if hasattr(got.a, "wait") else got.a,
                               expected.a.wait() if hasattr(expected.a, "wait") else expected.a)
    torch.testing.assert_close(got.b.wait() if hasattr(got.b, "wait") else got.b,
                               expected.b.wait() if hasattr(expected.b, "wait") else expected.b)
