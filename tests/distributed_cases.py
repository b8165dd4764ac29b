"""Multi-process cases for test_distributed.py (issue 17): a spawn harness and the per-rank functions it runs.

Each rank builds the same model twice (same seed), trains one eagerly and one under ``thunder_subclass.jit`` for three
optimizer steps, and raises ``AssertionError`` naming the case when losses, gradients (as full tensors), gradient types
and placements, or parameters after the steps differ. The harness runs ``world`` processes with
``torch.multiprocessing.spawn`` on 127.0.0.1 with a free port, gloo (CPU) or NCCL (CUDA), a bounded collective
timeout and an overall deadline after which the processes are killed.
"""

from __future__ import annotations

import datetime
import os
import socket
import time

import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------------------------------------------
# Harness
# ---------------------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, fn, world: int, port: int, backend: str, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), GLOO_SOCKET_IFNAME="lo")
    import thunder_subclass  # noqa: F401  (before thunder)
    import torch.distributed as dist

    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        fn(rank, world, *args)  # an exception reaches run() with its traceback (mp.spawn's ProcessRaisedException)
        dist.barrier()  # ranks tear down together (a rank exiting while a peer's gloo threads run can abort)
    finally:
        dist.destroy_process_group()


def run(fn, world: int = 2, *, backend: str = "gloo", args: tuple = (), timeout: float = 300.0) -> float:
    """Run ``fn(rank, world, *args)`` on ``world`` spawned processes; an exception on any rank is raised here. Returns
    the wall time in seconds."""
    import torch.multiprocessing as mp

    start = time.monotonic()
    context = mp.spawn(_entry, args=(fn, world, free_port(), backend, args), nprocs=world, join=False)
    try:
        while not context.join(timeout=max(1.0, timeout - (time.monotonic() - start))):
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"{getattr(fn, '__name__', fn)} did not finish in {timeout:.0f} s")
    finally:
        for p in context.processes:
            if p.is_alive():
                p.kill()
                p.join(5)
    return time.monotonic() - start


# ---------------------------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------------------------


class MLP(torch.nn.Module):
    def __init__(self, d=16, h=32):
        super().__init__()
        self.up = torch.nn.Linear(d, h)
        self.down = torch.nn.Linear(h, d)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class Attention(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.hd = d // heads
        self.wq, self.wk, self.wv = (torch.nn.Linear(d, d, bias=False) for _ in range(3))
        self.wo = torch.nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.hd).transpose(1, 2)  # local heads under tensor parallelism
        k = self.wk(x).view(b, s, -1, self.hd).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.hd).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class FeedForward(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w1 = torch.nn.Linear(d, 4 * d, bias=False)
        self.w2 = torch.nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)))


class TransformerBlock(torch.nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.attention_norm = torch.nn.LayerNorm(d)
        self.attention = Attention(d, heads)
        self.ffn_norm = torch.nn.LayerNorm(d)
        self.feed_forward = FeedForward(d)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class ResidualBlock(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 2 * d)
        self.down = torch.nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Net(torch.nn.Module):
    def __init__(self, d=32, n=2):
        super().__init__()
        self.inp = torch.nn.Linear(d, d)
        self.blocks = torch.nn.ModuleList([ResidualBlock(d) for _ in range(n)])
        self.out = torch.nn.Linear(d, d)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x)


# ---------------------------------------------------------------------------------------------------------------
# Training and comparison
# ---------------------------------------------------------------------------------------------------------------


def full(t):
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def grad_kind(g) -> tuple:
    return type(g).__name__, tuple(getattr(g, "placements", ()))


def train(model, call, x, target, *, steps=3, optimizer="sgd", after_step=None) -> dict:
    """Losses, gradients (full tensors) and their kinds per step, parameters (full) after ``steps`` steps."""
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.1) if optimizer == "sgd" else torch.optim.AdamW(params, lr=0.01)
    losses, grads, kinds = [], [], []
    for _ in range(steps):
        loss = F.mse_loss(full(call(x)), target)
        opt.zero_grad()
        loss.backward()
        grads.append({n: full(p.grad).detach().clone() for n, p in model.named_parameters()})
        kinds.append({n: grad_kind(p.grad) for n, p in model.named_parameters()})
        opt.step()
        if after_step is not None:
            after_step(model)
        losses.append(full(loss).detach().clone())
    return dict(losses=losses, grads=grads, kinds=kinds,
                params={n: full(p).detach().clone() for n, p in model.named_parameters()})


def assert_same_training(what: str, ref: dict, got: dict, atol=1e-5, rtol=1e-4) -> None:
    errors = []
    for i, (a, b) in enumerate(zip(ref["losses"], got["losses"])):
        if not torch.allclose(a, b, atol=atol, rtol=rtol):
            errors.append(f"loss[{i}] {b.item()} (eager {a.item()})")
    for i, (ga, gb) in enumerate(zip(ref["grads"], got["grads"])):
        for n in ga:
            if not torch.allclose(ga[n], gb[n], atol=atol, rtol=rtol):
                errors.append(f"grad[{i}][{n}] max diff {(ga[n] - gb[n]).abs().max().item():.3g}")
    for n in ref["params"]:
        if not torch.allclose(ref["params"][n], got["params"][n], atol=atol, rtol=rtol):
            errors.append(f"param {n} after {len(ref['losses'])} steps max diff "
                          f"{(ref['params'][n] - got['params'][n]).abs().max().item():.3g}")
    if ref["kinds"] != got["kinds"]:
        errors.append(f"gradient types/placements {got['kinds'][0]} (eager {ref['kinds'][0]})")
    assert not errors, f"{what}: " + "; ".join(errors[:6])


def trace_text(traces) -> str:
    return "\n".join(str(t) for t in traces[-1:])


# ---------------------------------------------------------------------------------------------------------------
# Tensor parallelism and DTensor (2 processes)
# ---------------------------------------------------------------------------------------------------------------


def _device(backend: str) -> str:
    return "cuda" if backend == "nccl" else "cpu"


def tp_mlp(world, device):
    import thunder
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import thunder_subclass

    mesh = init_device_mesh(device, (world,))

    def make():
        torch.manual_seed(0)
        return parallelize_module(MLP().to(device), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})

    torch.manual_seed(1)
    x, target = torch.randn(8, 16, device=device), torch.randn(8, 16, device=device)
    m = make()
    ref = train(m, m, x, target)
    m = make()
    jm = thunder_subclass.jit(m)
    assert_same_training("TP MLP (ColwiseParallel, RowwiseParallel)", ref, train(m, jm, x, target))
    assert thunder.cache_misses(jm) == 1
    forward = trace_text(thunder.last_traces(jm))
    # RowwiseParallel's output: DTensor's Partial -> Replicate is an all_reduce symbol in the execution trace
    assert "_c10d_functional_all_reduce_default" in forward and "_c10d_functional_wait_tensor_default" in forward
    # DTensors are taken apart at the inputs (flatten_DTensor) and not rebuilt: the output is a plain tensor
    assert "flatten_DTensor" in forward and "unflatten_DTensor" not in forward


def sp_transformer_block(world, device):
    import thunder
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    import thunder_subclass

    mesh = init_device_mesh(device, (world,))
    plan = {  # torchtitan's llama plan
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }

    class SequenceParallelModel(torch.nn.Module):  # sequence-sharded input in, full output out
        def __init__(self):
            super().__init__()
            self.block = parallelize_module(TransformerBlock().to(device), mesh, plan)

        def forward(self, x_local):
            return DTensor.from_local(self.block(x_local), mesh, [Shard(1)]).full_tensor()

    def make():
        torch.manual_seed(0)
        return SequenceParallelModel()

    torch.manual_seed(1)
    x, target = torch.randn(2, 8, 32, device=device), torch.randn(2, 8, 32, device=device)
    x_local = x.chunk(world, dim=1)[torch.distributed.get_rank()].contiguous()
    m = make()
    ref = train(m, m, x_local, target)
    m = make()
    jm = thunder_subclass.jit(m)
    assert_same_training("SequenceParallel / PrepareModuleInput transformer block", ref, train(m, jm, x_local, target))
    forward, backward = trace_text(thunder.last_traces(jm)), trace_text(thunder.last_backward_traces(jm))
    assert "_c10d_functional_all_gather_into_tensor_default" in forward
    assert "_c10d_functional_reduce_scatter_tensor_default" in forward
    assert "_c10d_functional_" in backward


def dtensor_api(world, device):
    import thunder
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    import thunder_subclass

    mesh = init_device_mesh(device, (world,))
    rank = torch.distributed.get_rank()

    def from_local(x, w):
        dx = DTensor.from_local(x, mesh, [Shard(0)])
        y = torch.relu(dx @ w.t())  # Shard(0)
        s = y.sum(0).redistribute(mesh, [Replicate()])  # Partial(sum) -> Replicate: all_reduce
        full_y = y.full_tensor()  # all_gather
        return s.to_local() * 2 + full_y.sum(0), y.to_local()

    def distribute(x, w):
        dx = distribute_tensor(x, mesh, [Shard(1)])  # scatter (c10d::scatter_, waited on)
        y = dx.redistribute(mesh, [Replicate()])  # all_gather along dim 1
        return (y.to_local() @ w.to_local().t()).sum()

    def partial_to_shard(x, w):
        d = DTensor.from_local(x, mesh, [Partial()])
        r = d.redistribute(mesh, [Shard(0)])  # reduce_scatter
        return (r.to_local() * w.to_local()[: r.to_local().shape[0]]).sum(), r.full_tensor()

    torch.manual_seed(0)
    x0, w0 = torch.randn(4, 8, device=device) + rank, torch.randn(6, 8, device=device)
    from thunder_subclass._thunder_internals import torch_version
    from thunder_subclass.errors import TorchFeatureUnavailableError

    if torch_version() < (2, 11):  # c10d::scatter_ / broadcast_ have no fake implementation there: a typed error
        x, w = x0.clone(), torch.nn.Parameter(distribute_tensor(w0.clone(), mesh, [Replicate()]))
        try:
            thunder_subclass.jit(distribute)(x, w)
        except TorchFeatureUnavailableError as e:
            assert "distribute_tensor inside a thunder_subclass-compiled function" in str(e) and e.needs_torch == "2.11"
        else:
            raise AssertionError("distribute_tensor in compiled code under torch < 2.11 did not raise")
    for fn in (from_local, distribute, partial_to_shard) if torch_version() >= (2, 11) else (from_local, partial_to_shard):
        results = []
        for call in (fn, thunder_subclass.jit(fn)):
            x = x0.clone().requires_grad_(True)
            w = torch.nn.Parameter(distribute_tensor(w0.clone(), mesh, [Replicate()]))
            out = call(x, w)
            outs = out if isinstance(out, tuple) else (out,)
            sum(full(o).sum() for o in outs).backward()
            results.append(([o.detach().clone() for o in outs], x.grad, full(w.grad), grad_kind(w.grad)))
            jf = call
        (eo, ex, ew, ek), (o, gx, gw, k) = results
        for a, b in zip(eo, o):
            torch.testing.assert_close(b, a, msg=lambda m: f"{fn.__name__} output: {m}")
        assert (ex is None) == (gx is None), fn.__name__
        if ex is not None:
            torch.testing.assert_close(gx, ex, msg=lambda m: f"{fn.__name__} x.grad: {m}")
        torch.testing.assert_close(gw, ew, msg=lambda m: f"{fn.__name__} w.grad: {m}")
        assert k == ek, f"{fn.__name__}: w.grad {k}, eager {ek}"
        names = {b.sym.name for b in thunder.last_traces(jf)[0].bound_symbols}
        assert names & {"DTensor_from_local", "distribute_tensor"}, (fn.__name__, names)


def async_collective_inputs(world, device):
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate

    import thunder_subclass

    mesh = init_device_mesh(device, (world,))
    x = torch.randn(4, 4, device=device) + torch.distributed.get_rank()

    def f(a):
        return torch.sin(a) * 2

    for make in (
        lambda: funcol.all_reduce(x, "sum", mesh),  # an AsyncCollectiveTensor
        lambda: DTensor.from_local(x, mesh, [Partial()]).redistribute(mesh, [Replicate()], async_op=True),
    ):
        expected, got = f(make()), thunder_subclass.jit(f)(make())
        assert type(got) is type(expected), (type(got), type(expected))
        torch.testing.assert_close(full(got), full(expected))


def _raises(exc_type, match: str, fn, *args):
    import re

    try:
        fn(*args)
    except exc_type as e:
        assert re.search(match, str(e)), (match, str(e))
        return
    raise AssertionError(f"{fn} did not raise {exc_type.__name__}")


def mask_partial_embedding(world, device):
    # embedding on a row-sharded weight gives a _MaskPartial DTensor, whose placement keeps the mask embedding made;
    # the redistribute that follows applies it (a tensor of one operation's fake run read by a later one). The mask
    # buffer is reference-counted state on a placement DTensor caches and shares with eager calls of the same shapes:
    # fake runs (tracing, autodiff recording again, backward recording) must leave it as eager would see it
    import thunder
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    import thunder_subclass
    from thunder_subclass.errors import SubclassDispatchError, UnsupportedSubclassOperationError

    mesh = init_device_mesh(device, (world,))
    torch.manual_seed(0)
    weight, ids = torch.randn(10, 4, device=device), torch.tensor([[1, 3], [7, 9], [0, 5]], device=device)

    def f(ids, w):  # (a _MaskPartial is reduced once: eager refuses a second redistribute of it)
        replicated = torch.nn.functional.embedding(ids, w).redistribute(mesh, [Replicate()]) * 2
        return replicated, torch.nn.functional.embedding(ids, w).redistribute(mesh, [Shard(0)]).sin()

    def args(requires_grad=False):
        w = distribute_tensor(weight.clone(), mesh, [Shard(0)]).requires_grad_(requires_grad)
        return distribute_tensor(ids, mesh, [Replicate()]), w

    jf = thunder_subclass.jit(f)
    for _ in range(2):  # the second call is a cache hit
        for got, expected in zip(jf(*args()), f(*args())):
            assert got.placements == expected.placements, (got.placements, expected.placements)
            torch.testing.assert_close(got.to_local(), expected.to_local())
    torch.testing.assert_close(f(*args())[0].to_local(), torch.nn.functional.embedding(ids, weight) * 2)  # eager ok

    # training: the weight's gradient (through redistribute / full_tensor and embedding's backward) equals eager's
    def g(ids, w):
        return (torch.nn.functional.embedding(ids, w).redistribute(mesh, [Replicate()]) * 2,
                torch.nn.functional.embedding(ids, w).full_tensor().sin())

    def step(fn):
        ids_, w = args(requires_grad=True)
        a, b = fn(ids_, w)
        (a.full_tensor() * torch.arange(4.0, device=device)).sum().add(b.sum()).backward()
        return a, b, w.grad

    jg = thunder_subclass.jit(g)
    for _ in range(2):
        (a, b, grad), (ea, eb, egrad) = step(jg), step(g)
        assert a.placements == ea.placements and type(b) is type(eb) is torch.Tensor, (a.placements, type(b))
        torch.testing.assert_close(a.to_local(), ea.to_local())
        torch.testing.assert_close(b, eb)
        assert type(grad) is DTensor and grad.placements == egrad.placements, (grad.placements, egrad.placements)
        torch.testing.assert_close(grad.full_tensor(), egrad.full_tensor())
    assert thunder.cache_misses(jg) == 1, thunder.cache_misses(jg)
    assert egrad.full_tensor().abs().sum() > 0  # the rows ids selects have a gradient
    torch.testing.assert_close(f(*args())[0].to_local(), torch.nn.functional.embedding(ids, weight) * 2)  # eager ok

    # a second reduction of one value fails as in eager; an unreduced one cannot be returned (its mask is computed
    # inside the compiled code)
    def twice(ids, w):
        e = torch.nn.functional.embedding(ids, w)
        return e.redistribute(mesh, [Replicate()]), e.redistribute(mesh, [Replicate()])

    _raises(AssertionError, "", twice, *args())
    _raises(SubclassDispatchError, "DTensor.redistribute", thunder_subclass.jit(twice), *args())
    _raises(UnsupportedSubclassOperationError, "_MaskPartial placement that holds its mask",
            thunder_subclass.jit(lambda ids, w: torch.nn.functional.embedding(ids, w)), *args(True))


def tensor_parallel_cases(rank, world, backend):
    """Everything that traces through DTensor, in one process group (a spawn costs 10-20 s)."""
    device = _device(backend)
    for case in (tp_mlp, sp_transformer_block, dtensor_api, async_collective_inputs, mask_partial_embedding):
        case(world, device)


# ---------------------------------------------------------------------------------------------------------------
# FSDP2 (2 processes) and FSDP2 + TP (4 processes)
# ---------------------------------------------------------------------------------------------------------------


def _fsdp_net(mesh, device, *, reshard: bool, float8: str | None):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    m = Net(32).to(device)
    after_step = None
    if float8 is not None:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        all_gather = float8 == "float8 all-gather"
        convert_to_float8_training(m, config=Float8LinearConfig(enable_fsdp_float8_all_gather=all_gather))
        if all_gather:
            from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

            after_step = precompute_float8_dynamic_scale_for_fsdp
    for block in m.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(m, mesh=mesh, reshard_after_forward=reshard)
    return m, after_step


def fsdp2_case(world, device, *, reshard: bool, float8: str | None):
    import thunder

    from torch.distributed.device_mesh import init_device_mesh

    import thunder_subclass
    from thunder_subclass.fsdp import FSDPCompiledModule

    mesh = init_device_mesh(device, (world,))
    what = f"FSDP2 root + per-layer, reshard_after_forward={reshard}, float8={float8}"
    torch.manual_seed(1 + torch.distributed.get_rank())  # data parallel: each rank its own batch
    x, target = torch.randn(8, 32, device=device), torch.randn(8, 32, device=device)
    m, after = _fsdp_net(mesh, device, reshard=reshard, float8=float8)
    ref = train(m, m, x, target, optimizer="adamw", after_step=after)
    m, after = _fsdp_net(mesh, device, reshard=reshard, float8=float8)
    jm = thunder_subclass.jit(m)
    assert isinstance(jm, FSDPCompiledModule), type(jm)
    assert sorted(jm.compiled_modules) == ["blocks.0", "blocks.1", "inp", "out"], sorted(jm.compiled_modules)
    assert_same_training(what, ref, train(m, jm, x, target, optimizer="adamw", after_step=after))
    block = jm.compiled_modules["blocks.0"]
    assert block is jm.compiled_modules["blocks.1"]  # one jitted function (one trace) for both blocks
    assert thunder.cache_misses(block) == 1, thunder.cache_misses(block)
    forward = trace_text(thunder.last_traces(block))
    assert "_c10d" not in forward  # FSDP2's collectives run in its hooks, outside the trace
    if float8 == "float8 all-gather":
        # FSDP2 hands the region the Float8TrainingTensor that fsdp_post_all_gather made
        assert "flatten_Float8TrainingTensor" in forward and "aten__scaled_mm_default" in forward
    elif float8 is not None:
        assert "aten__scaled_mm_default" in forward


def fsdp2_cases(rank, world, backend, float8_cases):
    device = _device(backend)
    fsdp2_case(world, device, reshard=True, float8=None)
    fsdp2_case(world, device, reshard=False, float8=None)
    for float8 in float8_cases:
        fsdp2_case(world, device, reshard=True, float8=float8)


def tp_fsdp_2d(rank, world, backend):
    """TP inside each block on the ``tp`` mesh dimension, FSDP2 over ``dp`` (2 x 2 on 4 processes)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import thunder_subclass

    device = _device(backend)
    mesh = init_device_mesh(device, (2, world // 2), mesh_dim_names=("dp", "tp"))

    def make():
        torch.manual_seed(0)
        m = Net(32).to(device)
        for b in m.blocks:
            parallelize_module(b, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
            fully_shard(b, mesh=mesh["dp"])
        fully_shard(m, mesh=mesh["dp"])
        return m

    torch.manual_seed(1 + mesh["dp"].get_local_rank())  # the same batch within a TP group
    x, target = torch.randn(8, 32, device=device), torch.randn(8, 32, device=device)
    m = make()
    ref = train(m, m, x, target)
    m = make()
    assert_same_training("TP + FSDP2 on a 2-D mesh", ref, train(m, thunder_subclass.jit(m), x, target))
