"""Recovery benchmark on the simulated cluster: the time from a node's loss to the job running
again on the nodes left, for 3 and 6 nodes, beside a relaunch by hand.

The job: launch/node/examples/ckpt_train.py under mpirun (DDP, gloo, a checkpoint every epoch),
`--max-restarts 1 --min-nodes N-1`. Mid-run the last node's NIC goes down (its veth on the
host: the node is gone for the others, as a lost instance is).

- dtrain: from the NIC going down to the first rank of the restarted job printing that it
  resumes (`restart 1: resuming at epoch E`), and beside it when the loss was reported and how
  long the failed attempt took to end: detection (health probes every second, two missed)
  + the failed attempt's end + the restart on N-1 nodes + the ranks' start.
- by hand: what a user without restarts does after noticing: `dtrain launch` again on the N-1
  nodes left (image already there, ssh warm), from the command to the first rank's resume line.
  The time to notice is not counted (dtrain's detection is).

    python bench/bench_recovery.py [--nodes 3,6]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dtrain.images import push as p  # noqa: E402
from dtrain.images.spec import load_all  # noqa: E402
from dtrain import contract, engine  # noqa: E402
from dtrain.launch.infra import cluster  # noqa: E402
from dtrain.launch.jobs.commands import Mount  # noqa: E402
from dtrain.launch.remote.hosts import parse_hostfile  # noqa: E402
from dtrain.launch.jobs.job import Job, JobSpec  # noqa: E402
from dtrain.launch.jobs.store import job_log  # noqa: E402
from dtrain.table import markdown  # noqa: E402

FAMILY = "pytorch-ddp"
EX = contract.EXAMPLES
RESUMED = re.compile(r"restart 1: resuming at epoch \d")


def _spec(info, image: str, name: str, ckpt: Path, n: int, restarts: int) -> JobSpec:
    return JobSpec(image=image, name=name, pull="missing", ssh_opts=("-F", info.ssh_config),
                   command=("python", f"{EX}/ckpt_train.py", "--epochs", "6", "--steps", "10", "--step-seconds", "0.2"),
                   env={"MASTER_ADDR": info.nodes[0].address, "MASTER_PORT": "29512"},
                   mounts=(Mount(str(ckpt), "/ckpt"),), checkpoint_dir="/ckpt", health_interval=1.0,
                   heartbeat_timeout=20, max_restarts=restarts, min_nodes=max(1, n - 1) if restarts else None)


def _fresh_log(name: str) -> None:
    """A job name's log from an earlier run would answer _wait_for at once."""
    job_log(name).unlink(missing_ok=True)


def _wait_for(name: str, pattern: str, timeout: float = 300) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = job_log(name)
        if path.exists() and re.search(pattern, path.read_text(), re.M):
            return time.monotonic()
        time.sleep(0.05)
    raise SystemExit(f"{name}: no line matching {pattern!r} within {timeout:.0f} s")


def _link(index: int, state: str) -> None:
    subprocess.run(["ip", "link", "set", f"{cluster.VETH_PREFIX}{index}", state], check=True)


def dtrain(info, image: str, n: int) -> tuple[float, float, float]:
    """(loss -> detected, the failed attempt's end, loss -> resumed), seconds."""
    name = f"bench-recover-{n}"
    ckpt = Path("/tmp") / f"dtrain-bench-ckpt-{uuid.uuid4().hex[:8]}"
    ckpt.mkdir()
    nodes = parse_hostfile(info.hostfile)[:n]
    _fresh_log(name)
    job = Job(_spec(info, image, name, ckpt, n, 1), nodes, say=lambda m: None)
    result: dict = {}
    runner = threading.Thread(target=lambda: result.update(code=job.run()), daemon=True)
    runner.start()
    try:
        _wait_for(name, r"\] epoch 2 rank 0/")
        t0 = time.monotonic()
        _link(n, "down")
        lost = _wait_for(name, r"^\[launch\] lost ")
        t1 = _wait_for(name, RESUMED.pattern)
    finally:
        runner.join(600)
        _link(n, "up")
    if result.get("code") != 0:
        raise SystemExit(f"{name} failed: {job_log(name).read_text()[-2000:]}")
    ended = re.search(r"the attempt ended in ([\d.]+) s", job_log(name).read_text())
    return lost - t0, float(ended.group(1)) if ended else float("nan"), t1 - t0


def by_hand(info, image: str, n: int) -> float:
    """A relaunch on the n-1 nodes left, from the command to the first rank resuming."""
    name = f"bench-hand-{n}"
    ckpt = Path("/tmp") / f"dtrain-bench-ckpt-{uuid.uuid4().hex[:8]}"
    ckpt.mkdir()
    nodes = parse_hostfile(info.hostfile)[:n - 1]
    first = Job(_spec(info, image, name + "-0", ckpt, n - 1, 0), nodes, say=lambda m: None)
    if first.run() != 0:  # a checkpoint to resume from, as the lost run left
        raise SystemExit(f"{name}: the first run failed")
    spec = _spec(info, image, name, ckpt, n - 1, 0)
    _fresh_log(name)
    t0 = time.monotonic()
    job = Job(spec, nodes, say=lambda m: None)
    runner = threading.Thread(target=job.run, daemon=True)
    runner.start()
    t1 = _wait_for(name, r"resuming at epoch \d")
    runner.join(600)
    return t1 - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="3,6")
    counts = [int(x) for x in ap.parse_args().nodes.split(",")]
    engine.ensure_all()
    img = next(i for i in load_all([FAMILY]) if not i.gpu)
    rows = [("nodes", "loss -> detected (s)", "failed attempt ended in (s)", "dtrain: loss -> resumed on N-1 (s)",
             "by hand: relaunch on N-1 -> resumed (s)")]
    for n in counts:
        info = cluster.up(n, recreate=True, quiet=True)
        engine.allow_insecure_registry(info.registry)
        image = p.push_registry([img], info.registry, out=lambda m: None)[0].remote
        detect, ended, auto = dtrain(info, image, n)
        hand = by_hand(info, image, n)
        rows.append((str(n), f"{detect:.1f}", f"{ended:.1f}", f"{auto:.1f}", f"{hand:.1f}"))
        print(markdown(rows[:1] + rows[-1:]), flush=True)
    print(markdown(rows))


if __name__ == "__main__":
    main()
