"""A rank that skips a collective the others enter: rank-dependent control flow, the classic hang.

    python skip_collective.py [--steps 100] [--skip-at 5] [--skipper 1]

Each step every rank prints `step N rank R/W` and joins an allreduce (gloo). At step --skip-at
rank --skipper leaves its allreduce out and goes on to `evaluate` (a long sleep standing in for
an evaluation only it runs); the others wait in that step's allreduce. `dtrain launch
--hang-timeout 10` names it from the stacks; under torchrun its flight recorder's sequence
numbers say the same where torch writes a dump (NCCL; launch/jobs/flightrec.py).
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist


def evaluate() -> None:
    time.sleep(3600)  # only this rank: the others wait in the allreduce it skipped


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--skip-at", type=int, default=5)
    ap.add_argument("--skipper", type=int, default=1)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(1)
    for step in range(1, args.steps + 1):
        print(f"step {step} rank {rank}/{world}", flush=True)
        if step == args.skip_at and rank == args.skipper:
            evaluate()
        else:
            dist.all_reduce(t)
        time.sleep(0.2)
    print(f"rank {rank}: done ({args.steps} steps)", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # the gloo group's teardown at exit can abort (pytorch#190489): ddp_grads.py


if __name__ == "__main__":
    main()
