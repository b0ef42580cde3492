"""The network gate on the simulated cluster: 4 nodes, one node's link throttled with tc (the
cluster's per-node link rate): the time to name it, beside the full `doctor --bandwidth` sweep's
time on the same nodes (which judges the cluster, but names no node).

    python bench/bench_netgate.py [--nodes 4] [--slow-node 4] [--rate 100mbit] [--repeat 3]
                                  [--family pytorch-ddp] [--sweep-max-bytes 16777216] [--sweep-iters 3]

Per run of the gate (`doctor --bandwidth --quick`: the image's containers started as a launch
starts them, the gate, teardown): the gate alone (what `launch --check-network` adds to a
launch), the whole command, and which node it named; unthrottled too (what every
`--check-network` launch pays). Medians of --repeat runs; the sweep runs once (minutes).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dtrain import engine  # noqa: E402
from dtrain.images import push as p  # noqa: E402
from dtrain.images.spec import load_all  # noqa: E402
from dtrain.launch.infra import cluster  # noqa: E402
from dtrain.launch.infra.netns import parse_rate  # noqa: E402
from dtrain.launch.remote.hosts import parse_hostfile  # noqa: E402
from dtrain.launch.troubleshoot import network  # noqa: E402
from dtrain.table import markdown  # noqa: E402


def gate_runs(nodes, image: str, ssh_opts, repeat: int) -> list[tuple[float, float, str, str]]:
    """(gate seconds, command seconds, named nodes, min/median line) per run."""
    out = []
    for _ in range(repeat):
        t0 = time.monotonic()
        r = network.quick(nodes, image=image, ssh_opts=ssh_opts, say=lambda m: None)
        total = time.monotonic() - t0
        named = ", ".join(r.names.get(h, h) for h in r.culprits) or "none"
        out.append((r.seconds, total, named, r.summary().split(": ", 1)[1]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--slow-node", type=int, default=4)
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--family", default="pytorch-ddp")
    ap.add_argument("--sweep-max-bytes", type=int, default=16 << 20)
    ap.add_argument("--sweep-iters", type=int, default=3)
    ap.add_argument("--no-sweep", action="store_true")
    args = ap.parse_args()
    engine.ensure_dockerd()
    info = cluster.up(args.nodes, recreate=True, quiet=True)
    try:
        engine.allow_insecure_registry(info.registry)
        img = next(i for i in load_all([args.family]) if not i.gpu)
        image = p.push_registry([img], info.registry, out=lambda m: None)[0].remote
        nodes = parse_hostfile(info.hostfile)[:args.nodes]
        ssh_opts = ("-F", info.ssh_config)
        free = gate_runs(nodes, image, ssh_opts, 1 + args.repeat)[1:]  # the first pulls the image
        cluster.set_link_rate(args.slow_node, parse_rate(args.rate))
        try:
            slow = gate_runs(nodes, image, ssh_opts, args.repeat)
            sweep = None
            if not args.no_sweep:
                t0 = time.monotonic()
                r = network.bandwidth(nodes, image=image, max_bytes=args.sweep_max_bytes, iters=args.sweep_iters,
                                      ssh_opts=ssh_opts, name="bench-netgate-sweep", say=lambda m: None)
                sweep = (time.monotonic() - t0, r.verdict.status, r.verdict.detail)
        finally:
            cluster.set_link_rate(args.slow_node, None)
        med = statistics.median
        rows = [("links", "gate alone s", "doctor --bandwidth --quick s", "named", "rates (last run)")]
        rows.append(("all free", f"{med(x[0] for x in free):.1f}", f"{med(x[1] for x in free):.1f}",
                     "/".join(sorted({x[2] for x in free})), free[-1][3]))
        rows.append((f"node-{args.slow_node} at {args.rate}", f"{med(x[0] for x in slow):.1f}",
                     f"{med(x[1] for x in slow):.1f}", "/".join(sorted({x[2] for x in slow})), slow[-1][3]))
        print(f"{args.nodes} simulated nodes, {args.family}, medians of {args.repeat} (gate: 2 x 1 s streams per node)\n")
        print(markdown(rows))
        if sweep:
            print(f"\nfull sweep (doctor --bandwidth, max {args.sweep_max_bytes >> 20} MiB, {args.sweep_iters} iters, "
                  f"node-{args.slow_node} at {args.rate}): {sweep[0]:.1f} s, {sweep[1]}: {sweep[2]} (no node named)")
        print("\nper run, throttled: " + "; ".join(f"{x[0]:.1f}/{x[1]:.1f} s {x[2]}" for x in slow))
    finally:
        cluster.up(3, recreate=True, quiet=True)  # the shared cluster back at its usual size


if __name__ == "__main__":
    main()
