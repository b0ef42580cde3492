"""Recovery benchmark on the simulated cluster: a lost node to the job running again at full
size on a warm spare, for 3 + 1 and 6 + 1 nodes, beside a fresh warm launch of the same job and
a relaunch by hand.

The job: launch/node/examples/ckpt_train.py under mpirun (DDP, gloo, a checkpoint every epoch)
on N nodes with `--spares 1` (N + 1 nodes given; the last is the spare: image, container and
sshd ready, no rank). Mid-run the last ranked node's NIC goes down (its veth on the host: the
node is gone for the others, as a lost instance is).

- loss -> detected: from the NIC going down to `[launch] lost` in the job's log (the
  heartbeat's silence, then the port check; the supervisor also logs `restart 1: detection`).
- loss -> resumed: to the first rank of the restarted job, on the spare, printing that it
  resumes (`restart 1: resuming at epoch E`), at the same world size.
- fresh warm launch: `dtrain launch` of the same job on N nodes that hold the image, ssh warm,
  from the command to the first rank's `starting at epoch 1` line.
- by hand: what a user without spares does after noticing: the same launch on the N healthy
  nodes (the spare in the lost one's place), from the command to the first rank's resume line.
  The time a person takes to notice is not in it.

A table of each round comes first: the restart's phases from the job's record (detection,
checkpoint, teardown, spare-in, resumed), loss -> resumed and that round's warm launch.

    python bench/bench_recovery.py [--nodes 3,6] [--repeat 1]
"""

from __future__ import annotations

import argparse
import re
import statistics
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
from dtrain.launch.jobs.container import Mount  # noqa: E402
from dtrain.launch.remote.hosts import parse_hostfile  # noqa: E402
from dtrain.launch.jobs.job import Job  # noqa: E402
from dtrain.launch.jobs.spec import JobSpec  # noqa: E402
from dtrain.launch.jobs.store import job_log, load_job  # noqa: E402
from dtrain.launch.analysis import timeline  # noqa: E402
from dtrain.table import markdown  # noqa: E402

FAMILY = "pytorch-ddp"
EX = contract.EXAMPLES
RESUMED = re.compile(r"restart 1: resuming at epoch \d")


def _spec(info, image: str, name: str, ckpt: Path, **kw) -> JobSpec:
    return JobSpec(image=image, name=name, pull="missing", ssh_opts=("-F", info.ssh_config),
                   command=("python", f"{EX}/ckpt_train.py", "--epochs", "6", "--steps", "10", "--step-seconds", "0.2"),
                   env={"MASTER_ADDR": info.nodes[0].address, "MASTER_PORT": "29512"},
                   mounts=(Mount(str(ckpt), "/ckpt"),), checkpoint_dir="/ckpt", heartbeat_timeout=20, **kw)


def _ckpt() -> Path:
    ckpt = Path("/tmp") / f"dtrain-bench-ckpt-{uuid.uuid4().hex[:8]}"
    ckpt.mkdir()
    return ckpt


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


def _background(job: Job) -> tuple[threading.Thread, dict]:
    result: dict = {}
    runner = threading.Thread(target=lambda: result.update(code=job.run()), daemon=True)
    runner.start()
    return runner, result


def phases(name: str) -> dict[str, float]:
    """The first restart's timed steps (the supervisor's `phase` events, as the job's record keeps
    them: launch/analysis/timeline.py): {phase: seconds}."""
    return {e.phase: e.seconds for e in timeline.from_json(load_job(name).get("timeline")) if e.restart == 1}


def spare(info, image: str, n: int) -> tuple[float, float, dict[str, float]]:
    """(loss -> detected, loss -> resumed at full size on the spare, seconds; the restart's
    phases from its log)."""
    name = f"bench-spare-{n}"
    nodes = parse_hostfile(info.hostfile)[:n + 1]
    _fresh_log(name)
    job = Job(_spec(info, image, name, _ckpt(), spares=1), nodes, say=lambda m: None)
    runner, result = _background(job)
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
    return lost - t0, t1 - t0, phases(name)


def warm_launch(info, image: str, n: int, ckpt: Path, name: str, pattern: str) -> float:
    """A launch of the job on n nodes that hold the image, from the command to `pattern`."""
    nodes = parse_hostfile(info.hostfile)[:n - 1] + parse_hostfile(info.hostfile)[n:n + 1]
    _fresh_log(name)
    t0 = time.monotonic()
    job = Job(_spec(info, image, name, ckpt), nodes, say=lambda m: None)
    runner, _ = _background(job)
    t1 = _wait_for(name, pattern)
    runner.join(600)
    return t1 - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="3,6")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    counts = [int(x) for x in args.nodes.split(",")]
    engine.ensure_all()
    img = next(i for i in load_all([FAMILY]) if not i.gpu)
    rows = [("nodes", "loss -> detected (s)", "loss -> resumed at full size, spare (s)", "fresh warm launch (s)",
             "by hand: relaunch -> resumed (s)", "resumed vs warm launch")]
    # each round's restart, phase by phase (the supervisor's own timing), beside its warm launch
    rounds = [("nodes", "round", *(f"{k} (s)" for k in contract.RESTART_PHASES), "loss -> resumed (s)", "warm launch (s)", "ratio")]
    for n in counts:
        info = cluster.up(n + 1, recreate=True, quiet=True)
        engine.allow_insecure_registry(info.registry)
        image = p.push_registry([img], info.registry, out=lambda m: None)[0].remote
        samples = {k: [] for k in ("detect", "resumed", "warm", "hand")}
        for i in range(args.repeat):
            detect, resumed, steps = spare(info, image, n)
            samples["detect"].append(detect)
            samples["resumed"].append(resumed)
            samples["warm"].append(warm_launch(info, image, n, _ckpt(), f"bench-warm-{n}", r"starting at epoch 1"))
            rounds.append((f"{n} + 1", str(i + 1), *(f"{steps[k]:.2f}" if k in steps else "-" for k in contract.RESTART_PHASES),
                           f"{resumed:.2f}", f"{samples['warm'][-1]:.2f}", f"{resumed / samples['warm'][-1]:.2f}x"))
            print(markdown(rounds[:1] + rounds[-1:]), flush=True)
            ckpt = _ckpt()
            warm_launch(info, image, n, ckpt, f"bench-hand-{n}-0", r"training done")  # a checkpoint to resume from
            samples["hand"].append(warm_launch(info, image, n, ckpt, f"bench-hand-{n}", r"resuming at epoch \d"))
        med = {k: statistics.median(v) for k, v in samples.items()}
        rows.append((f"{n} + 1", f"{med['detect']:.1f}", f"{med['resumed']:.1f}", f"{med['warm']:.1f}",
                     f"{med['hand']:.1f}", f"{med['resumed'] / med['warm']:.2f}x"))
        print(markdown(rows[:1] + rows[-1:]), flush=True)
    print(markdown(rounds))
    print(markdown(rows))


if __name__ == "__main__":
    main()
