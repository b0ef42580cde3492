"""The job store: ~/.dtrain/jobs/<name>/ (job.json, output.log), and what reads it: status,
logs, follow, stop."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from dtrain import contract
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import node_programs
from dtrain.launch.jobs.hosts import Node
from dtrain.launch.jobs.transport import SshTransport


def jobs_dir() -> Path:
    return Path(os.environ.get("DTRAIN_HOME", "~/.dtrain")).expanduser() / "jobs"


def job_dir(name: str) -> Path:
    return jobs_dir() / name


def job_log(name: str) -> Path:
    return job_dir(name) / "output.log"


def record(job: str, /, **fields) -> None:
    """Merge fields into job.json of the job named `job` (atomically)."""
    d = job_dir(job)
    d.mkdir(parents=True, exist_ok=True)
    path = d / "job.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(fields)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


def load_job(name: str | None) -> dict:
    root = jobs_dir()
    if name:
        path = root / name / "job.json"
        if not path.exists():
            raise LaunchError(f"no job named {name} (jobs are in {root})")
        return json.loads(path.read_text())
    jobs = sorted(root.glob("*/job.json"), key=lambda p: p.stat().st_mtime)
    if not jobs:
        raise LaunchError(f"no jobs yet (jobs are in {root})")
    return json.loads(jobs[-1].read_text())


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def status_rows(limit: int = 10) -> list[tuple[str, ...]]:
    rows = [("job", "state", "launcher", "nodes", "image", "exit")]
    paths = sorted(jobs_dir().glob("*/job.json"), key=lambda p: p.stat().st_mtime)[-limit:]
    for p in paths:
        j = json.loads(p.read_text())
        state = j.get("state", "?")
        if state in ("starting", "running") and not _alive(j.get("pid")):
            state += " (launcher gone)"
        rows.append((j["name"], state, j.get("launcher", ""), str(len(j.get("nodes", []))),
                     j.get("image", ""), "" if j.get("exit_code") is None else str(j["exit_code"])))
    return rows


def follow(path: Path, job: dict, out=sys.stdout) -> None:
    """Print the log, then new lines while the job's launcher runs."""
    with path.open() as f:
        while True:
            line = f.readline()
            if line:
                out.write(line)
                out.flush()
                continue
            if not _alive(job.get("pid")) or json.loads((path.parent / "job.json").read_text()).get("ended"):
                return
            time.sleep(0.2)


def remove_argv(job: str) -> list[str]:
    """The node step that removes a job's container and key directory (fine if neither is there)."""
    return node_programs.host_argv("remove", contract.container_name(job), contract.node_key_dir(job))


def stop(name: str | None, ssh_opts: tuple[str, ...] = ()) -> str:
    """Stop a job: signal its launcher (which tears down), then make sure no container is left."""
    job = load_job(name)
    if _alive(job.get("pid")) and not job.get("ended"):
        os.kill(job["pid"], signal.SIGTERM)
        for _ in range(150):
            if not _alive(job["pid"]):
                break
            time.sleep(0.2)
    nodes = [Node(**n) for n in job.get("nodes", [])]
    ssh = SshTransport(nodes, ssh_opts or job.get("ssh_opts", []), multiplex=False)
    results = ssh.run(nodes, lambda n: remove_argv(job["name"]), timeout=60)
    bad = [r for r in results if not r.ok]
    if bad:
        raise LaunchError("could not reach every node to remove the containers:\n" +
                          "\n".join(f"  {r.host}: {r.error}" for r in bad))
    return job["name"]
