"""PyTorch's DDP example pattern, unedited: a model wrapped in DistributedDataParallel, an
optimizer, `loss.backward()` and `optimizer.step()`; no explicit collective in the script. DDP
allreduces the gradients inside `backward` (gloo here), so a rank the others wait for is only
seen in native frames (`--straggler-check` samples them: docs/troubleshooting.md).

    python ddp_train.py [--steps 200] [--width 256] [--layers 4] [--batch 64]

Prints `step N rank R/W loss L step_ms S` each step, and `rank R: done (N steps)`. Works under
torchrun and under mpirun (ranks from Open MPI's variables; MASTER_ADDR/MASTER_PORT must be set).
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    if "RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" in os.environ:
        os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
        os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = DDP(nn.Sequential(*layers, nn.Linear(args.width, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        x = torch.randn(args.batch, args.width, generator=gen)
        y = torch.randn(args.batch, 1, generator=gen)
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"step {step} rank {rank}/{world} loss {loss.item():.4f} step_ms {1000 * (time.perf_counter() - t0):.1f}",
              flush=True)
    print(f"rank {rank}: done ({args.steps} steps)", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # the gloo group's teardown at exit can abort (pytorch#190489): ddp_grads.py


if __name__ == "__main__":
    main()
