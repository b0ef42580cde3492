"""Hang benchmark on the simulated cluster: one rank stopped with SIGSTOP mid-run, the time until
the log names the stopped rank (from the stacks) and holds every rank's Python stack (`--hang-timeout`).

The job: launch/node/examples/hang_train.py under mpirun on N nodes (one rank each; a step line
before each allreduce, 1 s steps), `--hang-timeout T --progress-pattern '^step '`, no restart.
After its third step the last rank gets SIGSTOP (`docker exec ... pkill -STOP` through that
node's engine). Measured from the stop: the `hang` line (detected and named from the stacks,
which are read before it since issue 41), the stopped rank's stack
(the first of the dump's lines for it) and the last stack line before the job's end (every
node's dump in). Target: stacks dumped within T + 5 s.

    python bench/bench_hang.py [--nodes 2,3] [--timeout 10] [--runs 3]
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
sys.path.insert(0, str(ROOT / "bench"))  # bench_recovery's _wait_for

from dtrain.images import build, push as p  # noqa: E402
from dtrain.images.spec import load_all  # noqa: E402
from dtrain import contract, engine  # noqa: E402
from dtrain.launch.infra import cluster  # noqa: E402
from dtrain.launch.remote.hosts import parse_hostfile  # noqa: E402
from dtrain.launch.jobs.job import Job  # noqa: E402
from dtrain.launch.jobs.spec import JobSpec  # noqa: E402
from dtrain.launch.jobs.store import job_log  # noqa: E402
from dtrain.table import markdown  # noqa: E402
from bench_recovery import _wait_for  # noqa: E402 (the same wait: a line in the job's log)

FAMILY = "pytorch-ddp"
EX = contract.EXAMPLES
# the rank's python, not launch/node/rank_output.py before it (whose command line names the script too)
RANK_PROCESS = "^[^ ]*python[^ ]* (-u )?[^ ]*hang_train\\.py"


def one(info, image: str, n: int, timeout: float, run: int) -> tuple[float, float, float]:
    """(stop -> hang line, stop -> the stopped rank's stack, stop -> the job ended), seconds."""
    name = f"bench-hang-{n}-{run}"
    job_log(name).unlink(missing_ok=True)
    last = n - 1
    spec = JobSpec(image=image, name=name, pull="missing", ssh_opts=("-F", info.ssh_config),
                   command=("python", f"{EX}/hang_train.py", "--steps", "1000", "--step-seconds", "1"),
                   env={"MASTER_ADDR": info.nodes[0].address, "MASTER_PORT": "29514"},
                   hang_timeout=timeout, progress_pattern="^step ")
    job = Job(spec, parse_hostfile(info.hostfile)[:n], say=lambda m: None)
    result: dict = {}
    runner = threading.Thread(target=lambda: result.update(code=job.run(), end=time.monotonic()), daemon=True)
    runner.start()
    _wait_for(name, rf"^\[node-{n} r{last}\] step 3 rank {last}/{n}$")
    subprocess.run(["docker", "-H", info.nodes[last].docker_host, "exec", f"dtrain-{name}",
                    "pkill", "-STOP", "-f", RANK_PROCESS], check=True, timeout=30)
    t0 = time.monotonic()
    hang = _wait_for(name, rf"^\[launch\] hang: .* stopped: r{last} on node-{n} \(state T\)")
    stack = _wait_for(name, rf"^\[node-{n} r{last}\]\s+load_batch \(hang_train\.py:\d+\)")
    runner.join(300)
    if result.get("code") in (None, 0):
        raise SystemExit(f"{name}: expected the job to fail on the hang: {job_log(name).read_text()[-2000:]}")
    return hang - t0, stack - t0, result["end"] - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="2,3")
    ap.add_argument("--timeout", type=float, default=10)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    counts = [int(x) for x in args.nodes.split(",")]
    engine.ensure_all()
    img = next(i for i in load_all([FAMILY]) if not i.gpu)
    # this checkout's image (its examples: hang_train.py), from the layer cache as the tests build it
    build.build([FAMILY], img.tag, False, build.BuildOptions(
        base_image=engine.BASE_IMAGE, ca_bundle=build.default_ca_bundle(),
        wheelhouse=Path("/opt/wheels") if Path("/opt/wheels").is_dir() else None), say=lambda m: None)
    rows = [("nodes", "--hang-timeout (s)", "stop -> hang named (s)", "stop -> its stack in the log (s)",
             "target (s)", "stop -> job ended (s)", "runs")]
    info = cluster.up(max(3, *counts), recreate=True, quiet=True)  # the first n nodes of it
    engine.allow_insecure_registry(info.registry)
    image = p.push_registry([img], info.registry, out=lambda m: None)[0].remote
    for n in counts:
        got = [one(info, image, n, args.timeout, r) for r in range(args.runs)]
        med = [statistics.median(g[i] for g in got) for i in range(3)]
        rows.append((str(n), f"{args.timeout:g}", f"{med[0]:.1f}", f"{med[1]:.1f}", f"<= {args.timeout + 5:g}",
                     f"{med[2]:.1f}", str(len(got))))
        print(markdown(rows[:1] + rows[-1:]), flush=True)
    print(markdown(rows))


if __name__ == "__main__":
    main()
