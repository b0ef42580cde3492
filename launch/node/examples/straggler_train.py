"""A synchronous training loop whose ranks compute, then wait for each other: what straggler
detection sees (`dtrain launch --straggler-check SECONDS`).

    python straggler_train.py [--steps 200] [--work 40]

Each step every rank computes (`compute`: --work matrix products of 128 x 128, the forward and
backward standing in), then joins the step's allreduce (torch.distributed, gloo: `sync`), where
it waits for the slowest rank, and prints `step N rank R/W compute_ms C step_ms S`. Slow one
node (its container's CPU quota: `docker update --cpus 0.2`) and that rank's compute_ms grows,
every rank's step_ms with it, and the others spend their steps in `sync`. Works under torchrun
and under mpirun (ranks from Open MPI's variables; MASTER_ADDR/MASTER_PORT must then be set).

The checkpoint contract (`--checkpoint-dir`, as ckpt_train.py): when DTRAIN_CHECKPOINT_NOW's file
appears (a spot notice, or `--replace-stragglers` taking a straggler out), rank 0 writes the
step reached to DTRAIN_CHECKPOINT_DIR/straggler_train.json and removes the file; a restarted
attempt resumes after that step (rank 0 reads it and broadcasts it to every rank).
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def compute(x: torch.Tensor, work: int) -> torch.Tensor:
    for _ in range(work):
        x = torch.tanh(x @ x)  # the step's own work: a slow node makes it slow
    return x.sum().reshape(1)


def sync(grad: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(grad)  # every rank waits here for the slowest one
    return grad


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--work", type=int, default=40)
    args = ap.parse_args()
    if "RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" in os.environ:
        os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
        os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.rand(128, 128) / 128
    ckdir, now = os.environ.get("DTRAIN_CHECKPOINT_DIR"), os.environ.get("DTRAIN_CHECKPOINT_NOW")
    path = os.path.join(ckdir, "straggler_train.json") if ckdir else ""
    done = torch.tensor([json.load(open(path))["step"] if rank == 0 and path and os.path.exists(path) else 0])
    dist.broadcast(done, 0)  # every rank resumes where rank 0's checkpoint says
    print(f"rank {rank}/{world} restart {os.environ.get('DTRAIN_RESTART', '0')}: starting after step {int(done)}",
          flush=True)
    for step in range(int(done) + 1, args.steps + 1):
        t0 = time.perf_counter()
        grad = compute(x, args.work)
        t1 = time.perf_counter()
        sync(grad)
        t2 = time.perf_counter()
        print(f"step {step} rank {rank}/{world} compute_ms {1000 * (t1 - t0):.1f} step_ms {1000 * (t2 - t0):.1f}",
              flush=True)
        if rank == 0 and path and now and os.path.exists(now):
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path + ".tmp", "w") as f:
                json.dump({"step": step}, f)
            os.replace(path + ".tmp", path)
            os.remove(now)  # tells the supervisor: saved
            print(f"rank 0: checkpoint now, after step {step}", flush=True)
    dist.barrier()
    print(f"rank {rank}: done ({args.steps} steps)", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # the gloo group's teardown at exit can abort (pytorch#190489): ddp_grads.py


if __name__ == "__main__":
    main()
