"""DTensor programs as PyTorch's own DTensor compile tests write them (issue 25), on a world of size 1 (gloo, one
process, a file store): the subclass machinery they exercise (placements, view strategies, functional collectives
returning ``AsyncCollectiveTensor``) is the same as on several ranks. Multi-process programs:
``tests/test_distributed.py``."""


import pytest
import torch

import thunder_subclass
from subclasses import TwoTensor
from test_training import assert_same


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


def test_fake_runs_leave_dtensor_mask_buffers_as_they_found_them():
    # DTensor caches the _MaskPartial placement that embedding on a row-sharded weight makes, and shares it (with its
    # reference-counted mask buffer) between calls of the same shapes, eager ones included; the plugin's fake runs
    # journal the buffers they change and put them back, and a traced value gets a copy of its own in the state its
    # fake run left (multi-process training: tests/distributed_cases.py mask_partial_embedding)
    pytest.importorskip("torch.distributed.tensor")
    from torch.distributed.tensor.placement_types import Replicate

    from thunder_subclass._thunder_internals import dtensor_masks

    assert dtensor_masks.mask_buffer_class() is not None, "this torch's _MaskPartial / MaskBuffer are not understood"
    _MaskPartial = dtensor_masks._mask_partial_classes()[0]  # (torch 2.10 names it MaskPartial)
    thunder_subclass.install_hooks()
    buffer_class = dtensor_masks.mask_buffer_class()
    assert getattr(buffer_class.materialize_mask, "_thunder_subclass_hook", False)
    cached = _MaskPartial(offset_shape=torch.Size([10, 4]), offset_dim=0)
    mask = torch.tensor([True, False])
    with dtensor_masks.isolated_mask_buffers() as after:
        cached.mask_buffer.materialize_mask(mask)
        assert cached.mask_buffer.refcount == 1
        ctx = ((cached, Replicate()), None)
    assert cached.mask_buffer.data is None and cached.mask_buffer.refcount == 0  # as found
    memo = {}
    owned = dtensor_masks.own_mask_buffers(ctx, after, memo)
    copy = owned[0][0]
    assert type(copy) is _MaskPartial and copy is not cached and owned[0][1] is ctx[0][1]
    assert copy.offset_shape == cached.offset_shape and copy.offset_dim == 0 and copy.reduce_op == cached.reduce_op
    assert copy.mask_buffer.data is mask and copy.mask_buffer.refcount == 1  # the state the run left
    assert dtensor_masks.holds_mask(owned) and not dtensor_masks.holds_mask(ctx)
    assert dtensor_masks.own_mask_buffers(ctx, after, memo)[0][0] is copy  # one copy per placement per run
    assert dtensor_masks.own_mask_buffers(owned, {}, {}) is owned  # a traced value's own copy stays
    with dtensor_masks.isolated_mask_buffers():  # a later fake run reducing the value: its copy is put back too
        copy.mask_buffer.release_mask()
        assert copy.mask_buffer.data is None
    assert copy.mask_buffer.data is mask and copy.mask_buffer.refcount == 1
    cached.mask_buffer.materialize_mask(mask)  # outside a plugin fake run: torch's own behaviour
    cached.mask_buffer.release_mask()
    assert cached.mask_buffer.refcount == 0
    thunder_subclass.uninstall_hooks()
    assert not getattr(buffer_class.materialize_mask, "_thunder_subclass_hook", False)
    thunder_subclass.install_hooks()


_global_mesh = _global_placement = None


def _from_local_with_globals(x):
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(x, _global_mesh, [_global_placement], run_check=False) * 2


def test_equal_mesh_and_placement_in_globals_reuse_the_trace_another_placement_is_a_new_one(mesh):
    # PyTorch's test_dtensor_dont_recompile_on_same_placement_devicemesh: the mesh and placement are globals rebound
    # to equal new objects between calls; a different placement must not reuse the trace (it returned the old
    # placement's result before: the globals DTensor.from_local received were not guarded)
    import thunder
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard

    global _global_mesh, _global_placement
    jf = thunder_subclass.jit(_from_local_with_globals)
    x = torch.randn(4, 4, requires_grad=True)
    for dim in (1, 1, 0, 0):
        _global_mesh, _global_placement = DeviceMesh("cpu", torch.arange(1)), Shard(dim)
        out, expected = jf(x), _from_local_with_globals(x)
        assert type(out) is DTensor and out.placements == expected.placements == (Shard(dim),)
        torch.testing.assert_close(out.to_local(), expected.to_local())
    assert (thunder.cache_misses(jf), thunder.cache_hits(jf)) == (2, 2)
    _global_mesh = _global_placement = None
