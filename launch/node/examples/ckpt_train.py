"""torch DDP (gloo) training that survives restarts: a checkpoint every epoch, resumed from.

    python ckpt_train.py [--epochs 5] [--steps 10] [--step-seconds 0.1]

DTRAIN_CHECKPOINT_DIR (set by `dtrain launch --checkpoint-dir`): rank 0 writes checkpoint.pt
there after every epoch (atomically); every rank loads it at start and prints the epoch it
resumes at. DTRAIN_RESTART: which attempt this is (0 first). DTRAIN_CHECKPOINT_NOW: a file
that appears when a node of the job got a spot notice; rank 0 then saves the model as it is
(the epoch restarts with these weights) at its next step and removes the file, which tells
the supervisor the checkpoint is saved: it swaps a spare in and restarts. SIGTERM (a spot notice, a stop)
ends the rank after its current step with exit code 143: the last epoch's checkpoint is what a
restart resumes from. Works under torchrun and under mpirun (ranks from
Open MPI's variables; MASTER_ADDR/MASTER_PORT must then be set).
"""

import argparse
import os
import signal
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

stop = False


def _on_term(signum, frame):
    global stop
    stop = True


def save(path: Path, epoch: int, model: torch.nn.Module) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"epoch": epoch, "model": model.state_dict()}, tmp)
    os.replace(tmp, path)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--step-seconds", type=float, default=0.1)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, _on_term)
    if "RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" in os.environ:
        os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
        os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = os.environ.get("DTRAIN_RESTART", "0")
    ckdir = os.environ.get("DTRAIN_CHECKPOINT_DIR")
    path = Path(ckdir) / "checkpoint.pt" if ckdir else None
    now = os.environ.get("DTRAIN_CHECKPOINT_NOW")

    torch.manual_seed(0)
    module = torch.nn.Linear(16, 1)
    start = 1
    if path and path.exists():
        state = torch.load(path)
        module.load_state_dict(state["model"])
        start = state["epoch"] + 1
    print(f"rank {rank}/{world} host {socket.gethostname()} restart {restart}: "
          f"{'resuming at' if start > 1 else 'starting at'} epoch {start}", flush=True)
    model = DDP(module)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1000 * start + rank)
    target = torch.randn(16, 1, generator=torch.Generator().manual_seed(7))
    for epoch in range(start, args.epochs + 1):
        total = 0.0
        for _ in range(args.steps):
            x = torch.randn(32, 16, generator=gen)
            loss = (model(x) - x @ target).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss)
            time.sleep(args.step_seconds)
            if path and rank == 0 and now and os.path.exists(now):
                save(path, epoch - 1, model.module)
                os.remove(now)
                print(f"rank 0: checkpoint now, in epoch {epoch} (resumes at epoch {epoch})", flush=True)
            if stop:
                print(f"rank {rank}: SIGTERM in epoch {epoch}; the checkpoint holds epoch {epoch - 1}",
                      flush=True)
                os._exit(143)
        mean = torch.tensor([total / args.steps])
        dist.all_reduce(mean)
        if path and rank == 0:
            save(path, epoch, model.module)
        print(f"epoch {epoch} rank {rank}/{world} loss {float(mean) / world:.4f}", flush=True)
    print(f"rank {rank}: training done ({args.epochs} epochs)", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # DDP keeps the gloo group alive: see ddp_grads.py (pytorch#190489)


if __name__ == "__main__":
    main()
