"""Ray Train across the cluster: a TorchTrainer with one CPU worker per node (gloo) allreduces
rank+1; every worker reports its rank, host and the sum, and the driver prints them all.

    python ray_train_check.py [--workers N] [--storage PATH_OR_S3_URI]

Run with RAY_ADDRESS set (dtrain launch --launcher ray does, in the head's container). The sum
must be N(N+1)/2 on every worker. Storage: where Ray Train keeps its run's results (a local path
on the head here; s3://bucket/prefix on ECS, the seed's shared storage).
"""

from __future__ import annotations

import argparse
import os
import socket

os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # one line per worker, not "[repeated 2x]"

import ray  # noqa: E402
import ray.train  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from ray.train import RunConfig, ScalingConfig  # noqa: E402
from ray.train.torch import TorchConfig, TorchTrainer  # noqa: E402


@ray.remote(num_cpus=0)
class Board:
    """Where every worker leaves its row for the driver (Ray Train's result holds metrics only
    with a checkpoint, and only rank 0's)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, str, int]] = []

    def put(self, row: tuple[int, str, int]) -> None:
        self.rows.append(row)

    def get(self) -> list[tuple[int, str, int]]:
        return sorted(self.rows)


def train_loop(config: dict) -> None:
    ctx = ray.train.get_context()
    rank, size = ctx.get_world_rank(), ctx.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)  # the process group Ray Train set up (gloo on CPU)
    host = socket.gethostname()
    print(f"ray-train worker rank={rank} size={size} host={host} backend={dist.get_backend()} "
          f"sum={int(t.item())}", flush=True)
    ray.get(config["board"].put.remote((rank, host, int(t.item()))))
    ray.train.report({"sum": int(t.item())})


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--storage", default="/tmp/dtrain-ray-results")
    args = p.parse_args()

    ray.init()  # RAY_ADDRESS
    print(f"ray cluster: {len([n for n in ray.nodes() if n['Alive']])} node(s), "
          f"{ray.cluster_resources().get('CPU', 0):g} CPU", flush=True)
    board = Board.remote()
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"board": board},
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False,
                                     placement_strategy="SPREAD"),
        run_config=RunConfig(storage_path=args.storage, name="ray-train-check"),
    )
    trainer.fit()
    want = args.workers * (args.workers + 1) // 2
    rows = ray.get(board.get.remote())
    ok = len(rows) == args.workers
    for rank, host, total in rows:
        good = total == want
        ok &= good
        print(f"ray-train {'OK' if good else 'BAD'} rank={rank} size={args.workers} host={host} sum={total}",
              flush=True)
    if len(rows) != args.workers:
        print(f"ray-train BAD: {len(rows)} of {args.workers} workers reported", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
