"""Stragglers under DDP on the simulated cluster (issue 51): PyTorch's DDP pattern unedited
(launch/node/examples/ddp_train.py: a model, an optimizer, `loss.backward()`; gloo's gradient
allreduce waits inside `backward`, seen only in native frames) under torchrun on N fresh
simulated nodes, `dtrain launch --straggler-check 1`, OMP_NUM_THREADS=1.

Each run: EVEN_STEPS steps at full speed (nobody may be named), then the last node's container
gets `docker update --cpus 0.1` until a straggler is named or SLOW_FOR s pass, then the quota is
lifted and the run ends at full speed. Per run: the even part's length and whom it named, whom
the slowed part named and how long after the quota, rank 0's median step (even / slowed).
tests/test_straggler.py's DDP test is the 3-node case of this.

    python bench/bench_straggler_ddp.py [--nodes 4] [--runs 1] [--even-steps 200] [--steps 300]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dtrain import contract, engine  # noqa: E402
from dtrain.images import push as p  # noqa: E402
from dtrain.images.spec import load_all  # noqa: E402
from dtrain.launch.infra import cluster  # noqa: E402
from dtrain.launch.jobs.job import Job  # noqa: E402
from dtrain.launch.jobs.spec import JobSpec  # noqa: E402
from dtrain.launch.jobs.store import job_log  # noqa: E402
from dtrain.launch.remote.hosts import parse_hostfile  # noqa: E402
from dtrain.table import markdown  # noqa: E402

FAMILY = "pytorch-ddp"
SLOW_FOR = 120  # s the last node stays slow at most
NAMED = re.compile(r"^\[launch\] straggler: (r\d+ on \S+) waited in a collective in (\d+)/12 samples, "
                   r"the other ranks in ([\d.]+)/12", re.M)


def _quota(info, node: int, name: str, cpus: str | None) -> int:
    """The job's container on simulated node `node` under a CPU quota (None: every CPU)."""
    return subprocess.run(["docker", "-H", info.nodes[node - 1].docker_host, "update", "--cpus",
                           cpus or str(len(os.sched_getaffinity(0))), f"dtrain-{name}"],
                          capture_output=True, text=True, timeout=60).returncode


def one_run(info, image: str, n: int, even: int, steps: int, args: argparse.Namespace, name: str) -> dict:
    """One job; the times and verdicts of its even and slowed parts."""
    last = f"^\\[node-{n} r{n - 1}\\] step {{}} rank {n - 1}/{n} "
    job_log(name).unlink(missing_ok=True)
    seen: dict = {}

    def watch() -> None:
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline and "code" not in seen:
            path = job_log(name)
            text = path.read_text() if path.exists() else ""
            if "first" not in seen and re.search(last.format(1), text, re.M):
                seen["first"] = time.monotonic()
            if "slowed" not in seen and re.search(last.format(even), text, re.M):
                seen["even named"] = [m[0] for m in NAMED.findall(text)]
                seen["slowed"] = time.monotonic() if _quota(info, n, name, "0.1") == 0 else None
            # a verdict after the quota (one in the even part is in seen["even named"])
            if seen.get("slowed") and (len(NAMED.findall(text)) > len(seen["even named"])
                                       or time.monotonic() - seen["slowed"] > SLOW_FOR):
                seen["named at"] = time.monotonic()
                _quota(info, n, name, None)
                return
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    command = ("python", f"{contract.EXAMPLES}/ddp_train.py", "--steps", str(steps), "--width", str(args.width),
               "--batch", str(args.batch))
    spec = JobSpec(image=image, command=command, name=name, ssh_opts=("-F", info.ssh_config), launcher="torchrun",
                   straggler_check=args.check, env={"OMP_NUM_THREADS": "1"}, pull="missing")
    seen["code"] = Job(spec, parse_hostfile(info.hostfile)[:n], say=lambda m: None).run()
    watcher.join(5)
    out = job_log(name).read_text()
    if seen["code"] != 0 or not seen.get("slowed"):
        raise SystemExit(f"{name}: exit {seen['code']}, the quota {'set' if seen.get('slowed') else 'not set'}:\n"
                         + out[-3000:])
    step_ms = [float(m) for m in re.findall(r"^\[node-1 r0\] step \d+ rank 0/\d+ loss \S+ step_ms ([\d.]+)$", out, re.M)]
    named = NAMED.findall(out)[len(seen["even named"]):]
    slowed_part = step_ms[even:even + 20]
    return {"even s": seen["slowed"] - seen["first"], "even named": seen["even named"],
            "named": [f"{who}, {w}/12 against {o}/12" for who, w, o in named],
            "after quota": seen["named at"] - seen["slowed"] if named else None,
            "even ms": statistics.median(step_ms[:even]), "slowed ms": statistics.median(slowed_part) if slowed_part else 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--even-steps", type=int, default=200)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--check", type=float, default=1.0, help="--straggler-check seconds")
    args = ap.parse_args()
    engine.ensure_all()
    img = next(i for i in load_all([FAMILY]) if not i.gpu)
    info = cluster.up(args.nodes, recreate=True, quiet=True)
    engine.allow_insecure_registry(info.registry)
    image = p.push_registry([img], info.registry, out=lambda m: None)[0].remote
    rows = [("run", "even part (s)", "named in the even part", f"named once node-{args.nodes} is slowed",
             "s after the quota", "rank 0 step_ms, even / slowed")]
    try:
        for i in range(args.runs):
            r = one_run(info, image, args.nodes, args.even_steps, args.steps, args, f"bench-straggler-ddp-{i}")
            after = f"{r['after quota']:.1f}" if r["after quota"] is not None else f"nobody in {SLOW_FOR} s"
            rows.append((str(i + 1), f"{r['even s']:.1f}", ", ".join(r["even named"]) or "nobody",
                         "; ".join(r["named"]) or "nobody", after, f"{r['even ms']:.0f} / {r['slowed ms']:.0f}"))
            print(markdown(rows[:1] + rows[-1:]), flush=True)
    finally:
        cluster.down()
    print(f"\n{args.nodes} nodes, ddp_train.py --width {args.width} --batch {args.batch}, {args.even_steps} even steps, "
          f"--straggler-check {args.check:g}\n")
    print(markdown(rows))


if __name__ == "__main__":
    main()
