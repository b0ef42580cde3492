"""A training loop that prints one line per step before its collective: what hang detection sees.

    python hang_train.py [--steps 1000] [--step-seconds 1]

Each step every rank prints `step N rank R/W`, joins an allreduce (torch.distributed, gloo:
`train_step`), then waits for its next batch (`load_batch`, a sleep standing in for data
loading). Stop one rank mid-run (`kill -STOP`) and the others print their next step and block in
that step's allreduce, one line ahead of it: `dtrain launch --hang-timeout 10 --progress-pattern
'^step '` names the rank behind and dumps every rank's Python stack (docs/launch.md "Hangs").
Works under torchrun and under mpirun (ranks from Open MPI's variables; MASTER_ADDR/MASTER_PORT
must then be set).
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist


def load_batch(seconds: float) -> torch.Tensor:
    time.sleep(seconds)  # where a real job reads and decodes its next batch
    return torch.ones(1)


def train_step(batch: torch.Tensor) -> float:
    dist.all_reduce(batch)  # every rank waits here for every other one
    return float(batch)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--step-seconds", type=float, default=1.0)
    args = ap.parse_args()
    if "RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" in os.environ:
        os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
        os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    batch = torch.ones(1)
    for step in range(1, args.steps + 1):
        print(f"step {step} rank {rank}/{world}", flush=True)
        train_step(batch)
        batch = load_batch(args.step_seconds)
    dist.barrier()
    print(f"rank {rank}: done ({args.steps} steps)", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # the gloo group's teardown at exit can abort (pytorch#190489): ddp_grads.py


if __name__ == "__main__":
    main()
