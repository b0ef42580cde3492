"""Network benchmark on the simulated cluster: allreduce bus bandwidth (nccl-tests' busbw) of
the CPU sweep (`dtrain bench-network`, launch/node/examples/allreduce_bw.py) across 2 and 4
nodes, beside raw TCP throughput between the same containers (a ring, each node sending to the
next), and their ratio. --env K=V (repeatable) runs the same sweep with more variables, to
compare a setting before/after.

    python bench/bench_network.py [--nodes 2,4] [--family pytorch-ddp] [--max-bytes 67108864]
                                  [--iters 5] [--tcp-streams 1] [--env K=V ...] [--mca K=V ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dtrain.images import build as b  # noqa: E402
from dtrain.images import push as p  # noqa: E402
from dtrain.images.spec import load_all  # noqa: E402
from dtrain import engine  # noqa: E402
from dtrain.launch.infra import cluster  # noqa: E402
from dtrain.launch.remote.hosts import parse_hostfile  # noqa: E402
from dtrain.launch.troubleshoot import network  # noqa: E402
from dtrain.table import markdown  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="2,4")
    ap.add_argument("--family", default="pytorch-ddp")
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--tcp-streams", type=int, default=1)
    ap.add_argument("--launcher", default=None)
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--mca", action="append", default=[], help="K=V: an Open MPI MCA parameter (mpirun)")
    args = ap.parse_args()
    counts = [int(x) for x in args.nodes.split(",")]
    env = dict(kv.split("=", 1) for kv in args.env)
    mca = tuple(tuple(kv.split("=", 1)) for kv in args.mca)
    engine.ensure_dockerd()
    # this tree's launch/node/ (allreduce_bw.py) in the image: a cached build, the last layer at most
    wheels = Path("/opt/wheels")
    b.build([args.family], None, False, b.BuildOptions(base_image=engine.BASE_IMAGE, ca_bundle=b.default_ca_bundle(),
                                                         wheelhouse=wheels if wheels.is_dir() else None),
            say=lambda m: None)
    info = cluster.up(max(counts), recreate=True, quiet=True)
    try:
        engine.allow_insecure_registry(info.registry)
        img = next(i for i in load_all([args.family]) if not i.gpu)
        image = p.push_registry([img], info.registry, out=lambda m: None)[0].remote
        rows = [("nodes", "size", "algbw GB/s", "busbw GB/s", "TCP GB/s (ring, least)", "busbw / TCP")]
        summary = [("nodes", "peak busbw GB/s", "TCP GB/s", "peak busbw / TCP", "verdict")]
        for n in counts:
            r = network.bandwidth(parse_hostfile(info.hostfile)[:n], image=image, launcher=args.launcher,
                                  max_bytes=args.max_bytes, iters=args.iters, tcp_streams=args.tcp_streams,
                                  env=env, extra_mca=mca, ssh_opts=("-F", info.ssh_config), name=f"bench-net-{n}",
                                  say=lambda m: None)
            if r.exit_code != 0 or not r.rows or not r.tcp_gbs:
                raise SystemExit(f"{n} nodes: the sweep failed (exit {r.exit_code}):\n{r.log[-3000:]}")
            for row in r.rows:
                rows.append((str(n), network._size(row.size), f"{row.algbw:.3f}", f"{row.busbw:.3f}",
                             f"{r.tcp_gbs:.3f}", f"{row.busbw / r.tcp_gbs:.2f}"))
            peak = max(x.busbw for x in r.rows)
            summary.append((str(n), f"{peak:.3f}", f"{r.tcp_gbs:.3f}", f"{peak / r.tcp_gbs:.2f}",
                            r.verdict.status))
        print(f"family {args.family}, env {env or '-'}, mca {dict(mca) or '-'}, tcp streams {args.tcp_streams}\n")
        print(markdown(summary))
        print()
        print(markdown(rows))
    finally:
        cluster.down(quiet=True)


if __name__ == "__main__":
    main()
