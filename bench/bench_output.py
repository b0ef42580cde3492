"""Output benchmark on the simulated cluster: ranks that print many short lines fast, and how
many of those lines arrive, each with its rank, under dtrain's launch and under mpirun by hand.

The job: each of N ranks (one per node) prints `start EPOCH`, then L bare numbers (`0` to
`L-1`, as fast as Python writes them), then `end`. Ways:

- dtrain:   `dtrain launch` (mpirun; launch/node/rank_output.py tags each rank's lines)
- by hand:  `mpirun --tag-output` with dtrain's flags, run in the first container of a job
            that is up (detached, `sleep`): Open MPI tags each rank's lines itself
- floor:    the same mpirun without --tag-output: every line arrives, with nothing that says
            which rank printed it

Columns: the lines that arrived of N x L with their rank (by hand: its tag; the floor: none
has one, so all numbers count), whether each rank's arrived in order, and seconds from the
first rank's start to the last rank's `end` line read by the launcher (dtrain: its job log,
polled every 10 ms; by hand: mpirun's output as this process reads it).

    python bench/bench_output.py [--nodes 2] [--lines 200000] [--runs 3]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dtrain.images import push as p  # noqa: E402
from dtrain.images.spec import load_all  # noqa: E402
from dtrain import contract, engine  # noqa: E402
from dtrain.launch.infra import cluster  # noqa: E402
from dtrain.launch.remote.hosts import Node, parse_hostfile  # noqa: E402
from dtrain.launch.jobs import container, store  # noqa: E402
from dtrain.launch.jobs.launchers.mpirun import mpi_defaults, mpirun_argv  # noqa: E402
from dtrain.launch.jobs.job import Job, container_name  # noqa: E402
from dtrain.launch.jobs.spec import JobSpec  # noqa: E402
from dtrain.launch.jobs.output import MpiOutput  # noqa: E402
from dtrain.launch.jobs.store import job_log  # noqa: E402
from dtrain.table import markdown  # noqa: E402

FAMILY = "pytorch-ddp"
IFACE = "ens5"  # the simulated nodes' NIC


def script(lines: int) -> str:
    return ("import sys, time\n"
            "w = sys.stdout.write\n"
            "w(f'start {time.time():.6f}\\n')\n"
            f"for i in range({lines}): w(f'{{i}}\\n')\n"
            "w('end\\n')\n")


def count(shown: list[str], n: int, lines: int) -> tuple[int, bool, float]:
    """[node rR] lines -> (numbers with their rank, each rank's in order, first start)."""
    got: dict[str, list[int]] = {}
    starts = []
    for line in shown:
        m = re.match(r"^\[[^\]\s]+ r(\d+)\] (\d+|start (\S+))$", line)
        if not m:
            continue
        if m.group(3):
            starts.append(float(m.group(3)))
        else:
            got.setdefault(m.group(1), []).append(int(m.group(2)))
    in_order = len(got) == n and all(v == list(range(len(v))) for v in got.values())
    return sum(map(len, got.values())), in_order, min(starts) if starts else float("nan")


def dtrain(info, image: str, n: int, lines: int, name: str) -> tuple[int, bool, float]:
    job_log(name).unlink(missing_ok=True)
    spec = JobSpec(image=image, command=("python", "-c", script(lines)), name=name, pull="missing",
                   ssh_opts=("-F", info.ssh_config))
    job = Job(spec, parse_hostfile(info.hostfile)[:n], say=lambda m: None)
    ended: dict[str, float] = {}

    def watch() -> None:  # when the log holds every rank's `end`
        while not ended:
            path = job_log(name)
            if path.exists() and len(re.findall(r"^\[\S+ r\d+\] end$", path.read_text(), re.M)) == n:
                ended["at"] = time.time()
            time.sleep(0.01)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    if job.run() != 0:
        raise SystemExit(f"{name} failed: {job_log(name).read_text()[-2000:]}")
    t.join(5)
    arrived, in_order, start = count(job_log(name).read_text().splitlines(), n, lines)
    return arrived, in_order, ended.get("at", float("nan")) - start


def by_hand(info, name: str, n: int, lines: int, tag: bool) -> tuple[int, bool, float]:
    """mpirun in the first container of the running job `name`, as a user would type it."""
    peers = [Node(x.address, 1) for x in info.nodes[:n]]
    argv = mpirun_argv(peers, ["python", "-c", script(lines)], iface=IFACE,
                                ssh=container.mpirun_ssh(), extra_mca=mpi_defaults(()))
    if tag:
        argv = [argv[0], "--tag-output", *argv[1:]]
    proc = subprocess.Popen(["docker", "-H", info.nodes[0].docker_host, "exec", container_name(name), *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    assert proc.stdout is not None
    raw, ends, last = [], 0, float("nan")
    for line in proc.stdout:
        raw.append(line.rstrip("\n"))
        if line.endswith("end\n"):
            ends += 1
            if ends == n:
                last = time.time()
    if proc.wait() != 0:
        raise SystemExit(f"by-hand mpirun failed: {raw[-20:]}")
    if tag:
        m = MpiOutput([f"node-{i + 1}" for i in range(n)], "node-1")
        shown = [s for line in raw for s in m.feed(line)] + m.flush()
        arrived, in_order, start = count(shown, n, lines)
    else:  # no rank on any line: every number counts, order unknown
        arrived = sum(1 for line in raw if line.isdigit())
        in_order = False
        start = min(float(line.split()[1]) for line in raw if line.startswith("start "))
    return arrived, in_order, last - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--lines", type=int, default=200000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    n, lines = args.nodes, args.lines
    engine.ensure_all()
    info = cluster.status().info
    if info is None or len(info.names) < n:
        info = cluster.up(max(n, 3), recreate=True, quiet=True)
    engine.allow_insecure_registry(info.registry)
    img = next(i for i in load_all([FAMILY]) if not i.gpu)
    image = p.push_registry([p.LocalImage(img.family, img.tag)], info.registry, out=lambda m: None)[0].remote
    res: dict[str, list[tuple[int, bool, float]]] = {"dtrain": [], "by hand (--tag-output)": [], "floor (untagged)": []}
    up = "bench-output-up"  # the by-hand runs' containers (one job per node: between dtrain's runs)
    spec = JobSpec(image=image, command=("sleep", "3600"), name=up, pull="missing", detach=True,
                   ssh_opts=("-F", info.ssh_config))
    for r in range(args.runs):  # interleaved: each run, each way once
        res["dtrain"].append(dtrain(info, image, n, lines, f"bench-output-{r}"))
        if Job(spec, parse_hostfile(info.hostfile)[:n], say=lambda m: None).run() != 0:
            raise SystemExit(f"{up} failed: {job_log(up).read_text()[-2000:]}")
        try:
            res["by hand (--tag-output)"].append(by_hand(info, up, n, lines, tag=True))
            res["floor (untagged)"].append(by_hand(info, up, n, lines, tag=False))
        finally:
            store.stop(up, ("-F", info.ssh_config))
        print(r, {k: v[-1] for k, v in res.items()}, file=sys.stderr, flush=True)
    rows = [("way", f"lines arrived with their rank (of {n * lines:,})", "each rank's complete and in order",
             "seconds (median)")]
    for way, runs in res.items():
        arrived = [a for a, _, _ in runs]
        rows.append((way, " / ".join(f"{a:,}" for a in arrived) + ("" if "floor" not in way else " (no rank)"),
                     "yes" if all(o for _, o, _ in runs) else "no" if "floor" not in way else "-",
                     f"{statistics.median(s for _, _, s in runs):.2f}"))
    print(markdown(rows))


if __name__ == "__main__":
    main()
