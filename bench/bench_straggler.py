"""Straggler detection's cost and latency (`--straggler-check`), with the real supervisor on this
machine: launch/node/supervise.py runs two rank processes (an `mpirun` that runs the command
itself stands in, as in tests/test_progress.py) that each step compute (a busy loop of WORK s,
one core) and then meet at a file barrier (a function named `barrier`: a collective to the
sampler). The sampler reads both ranks' stacks with launch/node/stacks.sh and py-spy as it does
in a container.

- cost: both ranks WORK s a step; the ranks' ms per step without sampling and with
  `--straggler-check` at each interval (medians of the runs; the ranks' own clocks).
- latency: rank 1 computes SLOW x as long as rank 0; from the attempt's `running` event to the
  `straggler` event naming rank 1, in seconds and in rank 1's steps.

    python bench/bench_straggler.py [--intervals 1,0.5,0.2] [--steps 100] [--work 0.05] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dtrain.launch.jobs import runplan, supervision  # noqa: E402
from dtrain.launch.jobs.spec import JobSpec  # noqa: E402
from dtrain.launch.jobs.launchers import launch_command  # noqa: E402
from dtrain.table import markdown  # noqa: E402

RANKS = """
import sys, time
from pathlib import Path
rank, work, steps = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
mine, theirs = Path(f"step{rank}"), Path(f"step{1 - rank}")
def barrier(step):
    mine.write_text(str(step))
    while not theirs.exists() or int(theirs.read_text() or -1) < step:
        time.sleep(0.005)
def compute(seconds):
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        pass
t0 = time.perf_counter()
for step in range(steps):
    compute(work)
    barrier(step)
print(f"[1,{rank}]<stdout>:ms_per_step {1000 * (time.perf_counter() - t0) / steps:.2f}", flush=True)
"""


def run(works: tuple[float, float], steps: int, check: float | None) -> tuple[list[float], float | None]:
    """(each rank's ms per step, seconds from `running` to the first `straggler` event or None)."""
    with tempfile.TemporaryDirectory(prefix="bench-straggler-") as d:
        tmp = Path(d)
        (tmp / "ranks.py").write_text(RANKS)
        (tmp / "bin").mkdir()
        (tmp / "bin" / "mpirun").write_text('#!/bin/sh\nwhile [ "$1" != sh ]; do shift; done\nexec "$@"\n')
        (tmp / "bin" / "mpirun").chmod(0o755)
        both = " ".join(f"OMPI_COMM_WORLD_RANK={r} {sys.executable} ranks.py {r} {works[r]} {steps} &" for r in (0, 1))
        cmd = launch_command(JobSpec(image="i", command=("sh", "-c", both + " wait", "sh"), name="bench"))
        plan = supervision.plan(cmd, [runplan.PlanNode("10.0.0.1", "node-1", 2, "lo")], ssh=[],
                                policy=supervision.Policy(straggler_check=check), attached=False)
        (tmp / "plan.json").write_text(json.dumps(replace(plan, keep_containers=True).to_json()))
        env = {**os.environ, "PATH": f"{tmp / 'bin'}:{Path(sys.executable).parent}:{os.environ['PATH']}"}
        proc = subprocess.Popen([sys.executable, str(ROOT / "launch" / "node" / "supervise.py"), str(tmp / "plan.json")],
                                stdout=subprocess.PIPE, text=True, env=env, cwd=tmp)
        assert proc.stdout is not None
        t_run = named = None
        ms: list[float] = []
        for line in proc.stdout:
            now = time.monotonic()
            if '"event": "running"' in line:
                t_run = now
            if '"event": "straggler"' in line and named is None and t_run is not None:
                named = now - t_run
            ms += [float(x) for x in re.findall(r"ms_per_step ([\d.]+)", line)]  # two ranks' lines may share a read
        if proc.wait() != 0 or len(ms) != 2:
            raise SystemExit(f"the run failed (exit {proc.returncode}): {(tmp / 'output.log').read_text()[-2000:]}")
        return ms, named


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--intervals", default="1,0.5,0.2")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--work", type=float, default=0.05)
    ap.add_argument("--slow", type=float, default=5.0)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    intervals = [float(x) for x in a.intervals.split(",")]
    rows = [("--straggler-check (s)", "ms per step (median of ranks x runs)", "vs off", "runs")]
    base = None
    for check in [None, *intervals]:
        ms = [m for _ in range(a.runs) for m in run((a.work, a.work), a.steps, check)[0]]
        med = statistics.median(ms)
        base = base or med
        rows.append(("off" if check is None else f"{check:g}", f"{med:.1f}",
                     "" if check is None else f"{100 * (med / base - 1):+.1f}%", str(a.runs)))
    print(markdown(rows))
    print()
    rows = [("--straggler-check (s)", "rank 1's step (ms)", "running -> straggler named (s)", "in rank 1's steps",
             "runs")]
    for check in intervals:
        got = [run((a.work, a.work * a.slow), a.steps, check) for _ in range(a.runs)]
        lat = [n for _, n in got if n is not None]
        step = statistics.median(max(ms) for ms, _ in got)
        rows.append((f"{check:g}", f"{step:.0f}", f"{statistics.median(lat):.1f}" if lat else "not named",
                     f"{statistics.median(lat) * 1000 / step:.0f}" if lat else "", f"{len(lat)}/{a.runs}"))
    print(markdown(rows))


if __name__ == "__main__":
    main()
