#!/usr/bin/env python3
"""Wait until a Ray cluster has a number of alive nodes; exit 1 naming those it has after a timeout.

    ray_wait.py --address HEAD:6379 --nodes N [--timeout SECONDS]

Run inside the cluster (the head's container) by `dtrain launch --launcher ray`, between starting
the nodes and the job. Connects as a short-lived driver (ray.init) and reads ray.nodes().
"""

from __future__ import annotations

import argparse
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--address", required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--timeout", type=float, default=60)
    args = p.parse_args()

    import ray

    deadline = time.monotonic() + args.timeout
    ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
    try:
        while True:
            alive = sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"])
            if len(alive) >= args.nodes:
                print(f"ray-ready: {len(alive)} node(s): {' '.join(alive)}", flush=True)
                return 0
            if time.monotonic() > deadline:
                print(f"ray-wait: {len(alive)} of {args.nodes} node(s) joined {args.address} after "
                      f"{args.timeout:g} s: {' '.join(alive) or 'none'}", file=sys.stderr)
                return 1
            time.sleep(0.5)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
