"""Launch benchmark on the simulated cluster: time from `invoke launch` to all ranks running,
for 1, 2, 4 and 8 nodes, beside the two ways people do it by hand (image already on nodes):

- sequential: `while read host; do ssh $host docker run -d ... ; done` (one node after another)
- parallel:   the same `ssh host docker run -d` to every node at once, nothing else; once
              with ssh's defaults, once with the key exchange dtrain prefers (launch.hosts)

The dtrain columns are the whole launch: probe, pull check, containers, per-job keys, sshd
reachable node to node, and mpirun starting one rank per node (each rank prints its start
time; the slowest counts). Cold: no ssh connection to the nodes is open, as for the by-hand
loops. Warm: the ssh master connections a launch keeps for a minute are still open.

    python bench/bench_launch.py [--nodes 1,2,4,8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dtrain.images import push as p  # noqa: E402
from dtrain.images.spec import load_all  # noqa: E402
from dtrain.launch.infra import cluster, engine  # noqa: E402
from dtrain.launch.jobs.hosts import Node, kex_opts, parse_hostfile  # noqa: E402
from dtrain.launch.jobs.job import Job, JobSpec  # noqa: E402
from dtrain.launch.jobs.store import job_log  # noqa: E402
from dtrain.launch.jobs.transport import close_masters  # noqa: E402
from dtrain.table import markdown  # noqa: E402

FAMILY = "pytorch-ddp"


def ssh(info, host: str, cmd: str, opts: list[str] | None = None) -> None:
    subprocess.run(["ssh", "-F", info.ssh_config, *(opts or []), host, cmd], check=True, capture_output=True)


def by_hand(info, image: str, hosts: list[str], parallel: bool, fast_kex: bool = False) -> float:
    run = f"docker run -d --name bench-hand --network host {image} >/dev/null"
    # the key exchange order dtrain asks for (launch.hosts.kex_opts), for a like-for-like column
    opts = kex_opts(Node(hosts[0]), ["-F", info.ssh_config]) if fast_kex else []
    t0 = time.monotonic()
    if parallel:
        with ThreadPoolExecutor(len(hosts)) as ex:
            list(ex.map(lambda h: ssh(info, h, run, opts), hosts))
    else:
        for h in hosts:
            ssh(info, h, run, opts)
    seconds = time.monotonic() - t0
    with ThreadPoolExecutor(len(hosts)) as ex:
        list(ex.map(lambda h: ssh(info, h, "docker rm -f bench-hand >/dev/null"), hosts))
    return seconds


def dtrain(info, image: str, n: int, i: int, cold: bool) -> float:
    name = f"bench-{n}-{i}-{'cold' if cold else 'warm'}"
    nodes = parse_hostfile(info.hostfile)[:n]
    if cold:
        close_masters(nodes, ("-F", info.ssh_config))
    # --pull missing: the image is on every node, as in the by-hand runs beside it
    spec = JobSpec(image=image, command=("bash", "-c", "date +%s.%N"), name=name, pull="missing",
                   ssh_opts=("-F", info.ssh_config))
    t0 = time.time()
    code = Job(spec, nodes, say=lambda m: None).run()
    if code != 0:
        raise SystemExit(f"launch on {n} nodes failed: {job_log(name).read_text()[-2000:]}")
    starts = [float(line.rsplit(" ", 1)[1]) for line in job_log(name).read_text().splitlines()
              if line.startswith("[node-")]
    assert len(starts) == n, starts
    return max(starts) - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="1,2,4,8")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    counts = [int(x) for x in args.nodes.split(",")]
    engine.ensure_dockerd()
    info = cluster.up(max(counts), recreate=True, quiet=True)
    try:
        engine.allow_insecure_registry(info.registry)
        img = next(i for i in load_all([FAMILY]) if not i.gpu)
        image = p.push_registry([img], info.registry, out=lambda m: None)[0].remote
        with ThreadPoolExecutor(len(info.nodes)) as ex:  # image already on every node, as measured by hand
            list(ex.map(lambda h: ssh(info, h, f"docker pull -q {image} >/dev/null"), info.names))
        os.sync()  # the pulls wrote ~1 GiB per node: writeback would compete with what is timed
        dtrain(info, image, 1, 0, cold=True)  # warm-up
        rows = [("nodes", "sequential ssh loop", "bare parallel ssh", "dtrain cold (all ranks running)",
                 "cold vs parallel", "cold vs sequential", "dtrain warm", "warm vs parallel",
                 "bare parallel, dtrain's kex", "cold vs that")]
        for n in counts:
            hosts = list(info.names[:n])
            runs: dict[str, list[float]] = {k: [] for k in ("seq", "par", "fast", "cold", "warm")}
            for i in range(args.repeat):  # interleaved: a drift in the machine's speed hits all alike
                runs["seq"].append(by_hand(info, image, hosts, False))
                runs["par"].append(by_hand(info, image, hosts, True))
                runs["fast"].append(by_hand(info, image, hosts, True, fast_kex=True))
                runs["cold"].append(dtrain(info, image, n, i, cold=True))
                runs["warm"].append(dtrain(info, image, n, i, cold=False))
            seq, par, fast, cold, warm = (statistics.median(runs[k]) for k in ("seq", "par", "fast", "cold", "warm"))
            rows.append((str(n), f"{seq:.2f} s", f"{par:.2f} s", f"{cold:.2f} s", f"{cold / par:.2f}x",
                         f"{seq / cold:.2f}x faster", f"{warm:.2f} s", f"{warm / par:.2f}x",
                         f"{fast:.2f} s", f"{cold / fast:.2f}x"))
        print(markdown(rows))
    finally:
        cluster.down(quiet=True)


if __name__ == "__main__":
    main()
