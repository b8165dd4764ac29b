"""Time per training step on 2 processes (gloo, CPU): eager vs thunder_subclass vs torch.compile, for FSDP2 (plain
and torchao float8 with float8 all-gather) and tensor parallelism.

    python benchmarks/bench_distributed.py [--steps 30] [--width 64]

Each configuration is a model built from the same seed, sharded the same way, trained with AdamW on the same batches.
All configurations of one scenario run in the same spawned processes, interleaved step by step (round r runs one step
of every configuration), so machine noise hits them alike; the table gives the median step time of each (first
``--warmup`` steps left out: they compile), the ratio to eager, and the first step (compile) time. Prints a table;
writes ``benchmarks/table_distributed.txt``.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import pathlib
import socket
import statistics
import sys
import time

import torch

MODES = ("eager", "thunder_subclass", "aot_eager", "inductor")


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Net(torch.nn.Module):
    def __init__(self, d, n=2):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(d) for _ in range(n))
        self.out = torch.nn.Linear(d, d)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.out(x)


class MLP(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _build(scenario: str, mesh, d: int):
    torch.manual_seed(0)
    after = None
    if scenario == "tensor parallel MLP":
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        return parallelize_module(MLP(d), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()}), after
    from torch.distributed.fsdp import fully_shard

    m = Net(d)
    if scenario == "FSDP2 + float8 all-gather":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training, precompute_float8_dynamic_scale_for_fsdp

        convert_to_float8_training(m, config=Float8LinearConfig(enable_fsdp_float8_all_gather=True))
        after = precompute_float8_dynamic_scale_for_fsdp
    for b in m.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m, after


def _compile(mode: str, m):
    if mode == "thunder_subclass":
        import thunder_subclass

        return thunder_subclass.jit(m)
    if mode in ("aot_eager", "inductor"):
        return torch.compile(m, backend=mode)
    return m


def _rank_main(rank: int, world: int, port: int, scenarios: list, modes: list, steps: int, warmup: int, d: int,
               batch: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    import thunder_subclass  # (before thunder)
    import torch.distributed as dist

    thunder_subclass.config.disk_cache = False  # first calls here trace (restarts: bench_cold_start.py)
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    try:
        mesh = init_device_mesh("cpu", (world,))
        for scenario in scenarios:
            runs = []
            for mode in modes:
                m, after = _build(scenario, mesh, d)
                runs.append((mode, m, _compile(mode, m), torch.optim.AdamW(m.parameters(), lr=1e-3), after, []))
            torch.manual_seed(1)
            batches = [(torch.randn(batch, d), torch.randn(batch, d)) for _ in range(4)]
            for step in range(steps):
                x, target = batches[step % len(batches)]
                for mode, m, call, opt, after, times in runs:
                    dist.barrier()
                    t = time.perf_counter()
                    loss = torch.nn.functional.mse_loss(call(x), target)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    if after is not None:
                        after(m)
                    times.append(time.perf_counter() - t)
            if rank == 0:
                queue.put((scenario, {mode: times for mode, *_, times in runs}))
        dist.barrier()  # ranks tear down together
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--scenarios", default="FSDP2,FSDP2 + float8 all-gather,tensor parallel MLP")
    args = parser.parse_args(argv)
    import torch.multiprocessing as mp

    scenarios, modes = args.scenarios.split(","), args.modes.split(",")
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.spawn(_rank_main, args=(2, _free_port(), scenarios, modes, args.steps, args.warmup, args.width, args.batch,
                               queue), nprocs=2, join=True)
    lines = [f"2 processes, gloo, CPU, {os.cpu_count()} cores; width {args.width}, batch {args.batch}; median of "
             f"{args.steps - args.warmup} steps after {args.warmup} (interleaved); torch {torch.__version__}",
             "", f"| {'scenario':<26} | {'mode':<16} | {'step ms':>8} | {'/ eager':>7} | {'first step s':>12} |",
             f"|{'-' * 28}|{'-' * 18}|{'-' * 10}|{'-' * 9}|{'-' * 14}|"]
    for _ in scenarios:
        scenario, results = queue.get()
        eager = statistics.median(results["eager"][args.warmup:]) if "eager" in results else float("nan")
        for mode, times in results.items():
            med = statistics.median(times[args.warmup:])
            lines.append(f"| {scenario:<26} | {mode:<16} | {med * 1e3:8.2f} | {med / eager:7.2f} | {times[0]:12.2f} |")
    table = "\n".join(lines)
    print(table)
    pathlib.Path(__file__).with_name("table_distributed.txt").write_text(table + "\n")
    return table


if __name__ == "__main__":
    sys.exit(main() and 0)
