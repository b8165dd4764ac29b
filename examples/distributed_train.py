"""Train a small model on several processes under thunder_subclass.jit, printing its losses next to eager's.

    torchrun --nproc-per-node 2 examples/distributed_train.py            # CPU, gloo
    torchrun --nproc-per-node 2 examples/distributed_train.py --backend nccl   # one GPU per process

1. FSDP2 + torchao float8 training: ``convert_to_float8_training`` with float8 all-gather, ``fully_shard`` on each
   block and on the root, AdamW. ``thunder_subclass.jit`` compiles the code between FSDP2's hooks (each block, the
   input and output projections) and keeps the hooks eager: FSDP2 all-gathers and reduce-scatters as usual.
2. Tensor parallelism: ``parallelize_module`` with ``ColwiseParallel`` / ``RowwiseParallel`` on an MLP, SGD. The
   whole model is traced: DTensor's collectives are symbols of the execution trace.

Each model is built twice from the same seed; one copy trains eagerly, the other compiled, on the same batches.
"""

import argparse
import copy
import datetime
import os

import thunder_subclass  # before thunder (compatibility shims)

import thunder
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Model(torch.nn.Module):
    def __init__(self, d=64, n_blocks=2):
        super().__init__()
        self.inp = torch.nn.Linear(d, d)
        self.blocks = torch.nn.ModuleList(Block(d) for _ in range(n_blocks))
        self.out = torch.nn.Linear(d, d)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


class MLP(torch.nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def train_both(title, make, batches, optimizer, after_step=None):
    """Train an eager and a compiled copy from ``make()``; rank 0 prints the losses side by side."""
    eager, compiled = make(), make()
    runs = {"eager": (eager, eager), "thunder_subclass": (compiled, thunder_subclass.jit(compiled))}
    losses = {name: [] for name in runs}
    for name, (model, call) in runs.items():
        opt = optimizer(model.parameters())
        for x, target in batches:
            loss = F.mse_loss(full(call(x)), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if after_step is not None:
                after_step(model)
            losses[name].append(full(loss).item())
    same = all(abs(a - b) <= 1e-5 + 1e-4 * abs(a) for a, b in zip(losses["eager"], losses["thunder_subclass"]))
    if dist.get_rank() == 0:
        print(f"\n{title}, {dist.get_world_size()} processes")
        print(f"{'step':>4}  {'eager loss':>12}  {'thunder_subclass loss':>22}")
        for i, (a, b) in enumerate(zip(losses["eager"], losses["thunder_subclass"])):
            print(f"{i:>4}  {a:12.6f}  {b:22.6f}")
        print("same as eager" if same else "DIFFERENT from eager", flush=True)
    return runs["thunder_subclass"][1]


def fsdp2_float8(mesh, device, steps):
    from torch.distributed.fsdp import fully_shard
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training, precompute_float8_dynamic_scale_for_fsdp

    def make():
        torch.manual_seed(0)
        model = Model().to(device)
        convert_to_float8_training(model, config=Float8LinearConfig(enable_fsdp_float8_all_gather=True))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    torch.manual_seed(1 + dist.get_rank())  # data parallel: each rank its own batches
    batches = [(torch.randn(16, 64, device=device), torch.randn(16, 64, device=device)) for _ in range(steps)]
    compiled = train_both("FSDP2 + float8 (float8 all-gather)", make, batches,
                          lambda p: torch.optim.AdamW(p, lr=1e-3), after_step=precompute_float8_dynamic_scale_for_fsdp)
    if dist.get_rank() == 0 and os.environ.get("SHOW_TRACES"):
        print(thunder.last_traces(compiled.compiled_modules["blocks.0"])[-1])


def tensor_parallel(mesh, device, steps):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    def make():
        torch.manual_seed(0)
        return parallelize_module(MLP().to(device), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})

    torch.manual_seed(1)  # tensor parallel: the same batches on every rank
    batches = [(torch.randn(16, 64, device=device), torch.randn(16, 64, device=device)) for _ in range(steps)]
    compiled = train_both("tensor parallel (ColwiseParallel, RowwiseParallel)", make, batches,
                          lambda p: torch.optim.SGD(p, lr=0.1))
    if dist.get_rank() == 0 and os.environ.get("SHOW_TRACES"):
        print(thunder.last_traces(compiled)[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    args = parser.parse_args()
    device = "cuda" if args.backend == "nccl" else "cpu"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    else:
        torch.set_num_threads(1)
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=120))
    try:
        mesh = init_device_mesh(device, (dist.get_world_size(),))
        try:
            import torchao.float8  # noqa: F401
        except ImportError:
            if dist.get_rank() == 0:
                print("torchao is not installed: skipping FSDP2 + float8 (pip install torchao)")
        else:
            fsdp2_float8(mesh, device, args.steps)
        tensor_parallel(mesh, device, args.steps)
        # Every rank reaches teardown together: a rank that destroys its process group and exits while a peer's gloo
        # threads still talk to it can abort at interpreter exit ("terminate called without an active exception").
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
