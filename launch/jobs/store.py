"""The job store: ~/.dtrain/jobs/<name>/ (job.json, output.log), and what reads it: status,
logs, follow, stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dtrain import contract
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import node_programs
from dtrain.launch.jobs.fanout import SSH_FAILURE
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


def _first_node(job: dict) -> Node:
    nodes = [Node(**n) for n in job.get("nodes", [])]
    if not nodes:
        raise LaunchError(f"job {job.get('name')}: no nodes recorded")
    return next((n for n in nodes if n.host == job.get("first")), nodes[0])


def node_file_argv(job: str, name: str, follow: bool = False) -> list[str]:
    """On a node: print the job's file (output.log, state.json) from its directory there;
    follow: keep printing what is appended (tail -F)."""
    from dtrain.launch.jobs.workdir import node_job_dir

    return ["sh", "-c", 'f="$HOME/$1/$2"; [ -f "$f" ] || { echo "no $2 of the job on this node" >&2; exit 1; }; '
            'if [ "$3" = 1 ]; then exec tail -n +1 -F "$f" 2>/dev/null; else exec cat "$f"; fi',
            "dtrain-job-file", node_job_dir(job), name, "1" if follow else "0"]


def detached_state(job: dict, ssh_opts: tuple[str, ...] = ()) -> dict:
    """A detached job's state.json from its first node (where its supervisor runs); once it
    has ended, kept in job.json too. {} where the node does not answer."""
    if job.get("final"):
        return job["final"]
    ssh = SshTransport([_first_node(job)], ssh_opts or job.get("ssh_opts", []), multiplex=False)
    # One try: `status` asks every job's node at once (status_rows), and waits one connect timeout.
    r = ssh.run(ssh.nodes, lambda n: node_file_argv(job["name"], "state.json"), timeout=15, retries=0)[0]
    try:
        state = json.loads(r.stdout) if r.ok else {}
    except json.JSONDecodeError:
        state = {}
    if state.get("state") in ("succeeded", "failed"):
        record(job["name"], final=state, exit_code=state.get("exit_code"))
    return state


def node_logs(job: dict, follow: bool, out=sys.stdout, ssh_opts: tuple[str, ...] = ()) -> int:
    """A detached job's output as the launch shows it, read from its first node; follow:
    until the job ends. Returns the job's exit code where it ended, else 0."""
    from dtrain.launch.jobs.supervision import Render

    first = _first_node(job)
    ssh = SshTransport([first], ssh_opts or job.get("ssh_opts", []), multiplex=False)
    argv = ssh.argv(first, node_file_argv(job["name"], "output.log", follow))
    render = Render(job.get("launcher", "mpirun"), (job.get("ranks") or [first.host])[0])
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace")
    assert proc.stdout and proc.stderr
    try:
        for raw in proc.stdout:
            for shown in render.feed(raw.rstrip("\n")):
                out.write(shown + "\n")
            out.flush()
            if render.final is not None:
                break
        for shown in render.flush():
            out.write(shown + "\n")
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait()
    if render.final is None and proc.returncode not in (0, -15):
        said = proc.stderr.read().strip()[-300:]
        if proc.returncode == SSH_FAILURE:  # ssh's own end: the keepalives found the link lost
            raise LaunchError(f"{first.host}: lost the connection to the job's first node ({said or 'no answer'}); "
                              f"the job runs on there under its supervisor: invoke status, "
                              f"invoke logs --job {job['name']} --follow")
        raise LaunchError(f"{first.host}: cannot read the job's output: {said}")
    return render.exit_code or 0


def status_rows(limit: int = 10) -> list[tuple[str, ...]]:
    rows = [("job", "state", "launcher", "nodes", "image", "exit")]
    paths = sorted(jobs_dir().glob("*/job.json"), key=lambda p: p.stat().st_mtime)[-limit:]
    jobs = [json.loads(p.read_text()) for p in paths]
    # Detached jobs' first nodes are asked at once: unreachable ones cost one timeout in all.
    asked = [j for j in jobs if j.get("state") == "detached"]
    with ThreadPoolExecutor(max_workers=max(1, len(asked))) as pool:
        states = dict(zip((id(j) for j in asked), pool.map(detached_state, asked)))
    for j in jobs:
        state = j.get("state", "?")
        if state in ("starting", "running") and not _alive(j.get("pid")):
            state += " (launcher gone)"
        if state == "detached":  # its supervisor on the first node knows
            now = states[id(j)]
            j["exit_code"] = now.get("exit_code", j.get("exit_code"))
            state = (f"detached: {now.get('state', 'no answer from its first node')}"
                     + (f", {now['restarts']} restart(s)" if now.get("restarts") else "")
                     + (f" ({now['reason']})" if now.get("state") == "failed" and now.get("reason") else ""))
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
    """The node step that removes a job's container, key directory and files (a detached
    job's log and state too); fine if none is there."""
    from dtrain.launch.jobs.workdir import node_job_dir

    return node_programs.host_argv("remove", contract.container_name(job), contract.node_key_dir(job),
                                   node_job_dir(job))


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
    if job.get("state") == "detached" and not bad:
        record(job["name"], state="stopped", ended=time.time())
    if bad:
        raise LaunchError("could not reach every node to remove the containers:\n" +
                          "\n".join(f"  {r.host}: {r.error}" for r in bad))
    return job["name"]
