"""The job store: ~/.dtrain/jobs/<name>/ (job.json, output.log), and what reads it: status,
logs, follow, stop.

Guarantees (docs/launch.md "Job names, locks and stop"):
- names: check_name on every path made from a name (never empty, `.`, `..` or with `/`);
  default names are unique per launch (default_name);
- one launch per name: take_launch_lock (flock on job_dir/launch.lock, held for the launcher's
  life, released by the kernel even on kill -9); the nodes hold their own lock (host/prepare.sh);
- record: merged under a lock, written to a unique temporary file, then renamed; the job's
  directory 0700, its files 0600;
- readers survive a partial or corrupt record (read_record), and clear stale entries (sweep);
- stop signals the launcher only where the process at its PID is still the one recorded
  (start time and a digest of its command line: process_identity; the line itself is not
  kept, it can hold an --env value).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dtrain import contract, values
from dtrain.terminal import clean
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import events, node_programs
from dtrain.launch.remote.fanout import SSH_FAILURE, host_lines
from dtrain.launch.remote.hosts import Node
from dtrain.launch.remote.transport import SshTransport

LIVE_STATES = ("starting", "running")
LAUNCH_LOCK = "launch.lock"


def check_name(name: object) -> str:
    """A job name as every path made from it needs it (dtrain.values' rule for names: letters,
    digits, _ . -, first a letter or digit, so never empty, `.` or `..`, no `/`)."""
    if not isinstance(name, str) or not values.NAME.fullmatch(name) or len(name) > values.NAME_MAX:
        raise LaunchError(f"bad job name {name!r}: letters, digits, _ . - (starting with a letter or digit), "
                          f"at most {values.NAME_MAX} characters")
    return name


def default_name(prefix: str = "job") -> str:
    """A name of its own for each launch: the time, and random hex (two launches in the same
    second differ)."""
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def jobs_dir() -> Path:
    return Path(os.environ.get("DTRAIN_HOME", "~/.dtrain")).expanduser() / "jobs"


def job_dir(name: str) -> Path:
    return jobs_dir() / check_name(name)


def job_log(name: str) -> Path:
    return job_dir(name) / "output.log"


def ensure_job_dir(name: str) -> Path:
    """The job's directory here, 0700 (its key, its output)."""
    d = job_dir(name)
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    return d


def open_private(path: Path, mode: str = "w"):
    """A file of the job's directory, 0600."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode == "a" else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, mode)


@contextlib.contextmanager
def _locked(path: Path):
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_json(path: Path, data: dict) -> None:
    """Atomically: a temporary file of its own (0600) in the same directory, then renamed."""
    fd, tmp = tempfile.mkstemp(prefix=".job-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename makes it the record
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _read_json(path: Path) -> dict | None:
    try:
        data = events.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# What readers take from job.json, each with its type and bounds (launch/jobs/events.py's
# checks): its `final` and `quarantined`/`stragglers` came from a node, and a record can be
# damaged or left by another dtrain. A field of another type makes the record unreadable, one
# line naming the file and the key; fields not listed are not read by more than a truth test.
_FINAL = events.fields_of({"event": (events.NAME, events.O), "state": (events.NAME, events.O),
                           "exit_code": (events.maybe(events.EXIT), events.O), "reason": (events.TEXT, events.O),
                           "restarts": (events.COUNT, events.O)})
_LIST = events.list_of(lambda item: item)
_FINITE = events.number(-sys.float_info.max, sys.float_info.max)
RECORD_FIELDS: dict[str, events.Check] = {
    "name": events.NAME, "state": events.NAME, "launcher": events.NAME, "image": events.TEXT,
    "pid": events.whole(0, 1 << 31), "pid_identity": events.mapping(events.NAME, events.TEXT),
    "host": events.NAME, "first": events.NAME, "nodes": _LIST,  # each read by job_nodes
    "ranks": events.NAMES, "node_names": events.mapping(events.NAME, events.NAME),
    "ssh_opts": events.list_of(events.TEXT), "started": _FINITE, "ended": _FINITE,  # the report bounds them
    "exit_code": events.EXIT, "detached": events.flag, "final": _FINAL,
    "quarantined": events.mapping(events.NAME, events.TEXT), "stragglers": events.mapping(events.NAME, events.TEXT),
    "timeline": _LIST,  # each read by timeline.from_json "gate": events.fields_of({}),
    "progress_pattern": events.TEXT,
}


def record_problem(data: dict) -> str | None:
    """What of job.json's fields a reader cannot take (`KEY: why`, one line); None where all."""
    for key, check in RECORD_FIELDS.items():
        if data.get(key) is not None:
            try:
                check(data[key])
            except ValueError as e:
                return f"{key}: {clean(str(e))}"
    return None


def _check_record(path: Path) -> tuple[dict | None, str]:
    """(job.json as a dict, "") or (None, why it cannot be read: one line)."""
    try:
        raw = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        return None, f"cannot be read ({type(e).__name__})"
    try:
        data = events.loads(raw)
    except ValueError as e:
        return None, str(e)
    if not isinstance(data, dict):
        return None, f"not a JSON object but {type(data).__name__}"
    why = record_problem(data)
    if why:
        return None, why
    if not data.get("name"):
        data["name"] = path.parent.name
    return data, ""


def read_record(path: Path) -> dict | None:
    """job.json as a dict, its name that of its directory where it has none; None where it
    cannot be read, is not a JSON object, or a field a reader takes is not of its type
    (RECORD_FIELDS)."""
    return _check_record(path)[0]


def record(job: str, /, **fields) -> None:
    """Merge fields into job.json of the job named `job` (atomically; concurrent writers
    each see the other's fields)."""
    d = ensure_job_dir(job)
    with _locked(d / ".record.lock"):
        data = _read_json(d / "job.json") or {}
        data.update(fields)
        _write_json(d / "job.json", data)


def new_record(job: str, /, **fields) -> None:
    """job.json anew (a relaunch of a name keeps nothing of the launch before)."""
    d = ensure_job_dir(job)
    with _locked(d / ".record.lock"):
        _write_json(d / "job.json", fields)


# ---------------------------------------------------------------- the launcher: lock, identity


def _cmdline_digest(cmdline: bytes) -> str:
    """sha256 of a command line as the kernel gives it: identifies it, and keeps no argument
    (an `--env NAME=VALUE` of the launcher's) on disk."""
    import hashlib

    return hashlib.sha256(cmdline).hexdigest()


def _read_identity(pid: int) -> tuple[str, bytes] | None:
    """(start time, raw command line) of the process at pid; None where no such process is."""
    proc = Path(f"/proc/{pid}")
    if Path("/proc/self/stat").exists():
        try:
            stat = (proc / "stat").read_text()
            cmd = (proc / "cmdline").read_bytes()
        except OSError:
            return None
        fields = stat.rsplit(")", 1)[-1].split()
        return (fields[19] if len(fields) > 19 else ""), cmd
    r = subprocess.run(["ps", "-o", "lstart=", "-o", "args=", "-p", str(pid)], capture_output=True, text=True)
    out = r.stdout.strip()
    if r.returncode != 0 or not out:
        return None
    return out[:24], out[24:].strip().encode()


def process_identity(pid: int | None) -> dict | None:
    """What tells the process at pid from a later one given the same pid: its start time
    (clock ticks since boot) and a sha256 digest of its command line (not the line: it can
    hold a secret, `--env TOKEN=...`); None where no such process is."""
    if not pid or pid < 0:
        return None
    got = _read_identity(pid)
    if got is None:
        return None
    start, cmd = got
    return {"start": start, "cmdline_sha256": _cmdline_digest(cmd)}


def launcher_fields() -> dict:
    """What job.json keeps of the launcher, for stop and for the stale-entry sweep."""
    return {"pid": os.getpid(), "pid_identity": process_identity(os.getpid()), "host": socket.gethostname()}


def launcher_alive(job: dict) -> bool:
    """The job's launcher runs: its pid is there and is the process recorded (not a later
    one that the system gave the same pid). A record without the identity: never. A record
    of a dtrain before the digest (its `cmdline` as text) is still recognised."""
    pid, want = job.get("pid"), job.get("pid_identity")
    if not isinstance(pid, int) or not isinstance(want, dict) or pid <= 0:
        return False
    got = _read_identity(pid)
    if got is None or got[0] != want.get("start"):
        return False
    if "cmdline_sha256" in want:
        return _cmdline_digest(got[1]) == want["cmdline_sha256"]
    old = got[1].replace(b"\0", b" ").decode(errors="replace").strip()
    return isinstance(want.get("cmdline"), str) and old == want["cmdline"]


def take_launch_lock(name: str) -> int:
    """The launcher's lock on the name, before anything of the job is changed: an open file
    descriptor (flock) held for the launcher's life; the kernel releases it when the process
    ends, kill -9 included. LaunchError naming the job and its holder where it is taken."""
    d = ensure_job_dir(name)
    path = d / LAUNCH_LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 512).decode(errors="replace").strip() or "another launcher"
        os.close(fd)
        raise LaunchError(f"job {name} is already running: launched by {holder} (holds {path}); "
                          f"give this launch another --name, or stop that one: dtrain stop --job {name}") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode())
    os.set_inheritable(fd, False)
    return fd


def release_launch_lock(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def _lock_held(d: Path) -> bool:
    """Whether some launcher holds the job's launch lock now."""
    try:
        fd = os.open(d / LAUNCH_LOCK, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def sweep() -> list[str]:
    """Stale entries: a job whose record says starting/running but whose launcher is gone
    (killed with -9: no teardown ran) is marked `launcher gone` and its key directory here
    removed. Returns the names cleared. Every reader of the store calls it first."""
    import shutil

    cleared = []
    for p in jobs_dir().glob("*/job.json"):
        j = read_record(p)
        if j is None or j.get("state") not in LIVE_STATES or launcher_alive(j) or _lock_held(p.parent):
            continue
        for key in p.parent.glob("key-*"):
            shutil.rmtree(key, ignore_errors=True)
        with contextlib.suppress(LaunchError, OSError):
            record(p.parent.name, state="launcher gone", ended=j.get("ended") or time.time())
            cleared.append(p.parent.name)
    return cleared


# ---------------------------------------------------------------- readers


def load_job(name: str | None) -> dict:
    sweep()
    root = jobs_dir()
    if name:
        path = job_dir(name) / "job.json"
        if not path.exists():
            raise LaunchError(f"no job named {name} (jobs are in {root})")
        j, why = _check_record(path)
        if j is None:
            raise LaunchError(f"{path}: not a readable job record ({why}); remove {path.parent} if the job is over")
        return j
    for path in sorted(root.glob("*/job.json"), key=_mtime, reverse=True):
        j = read_record(path)
        if j is not None and values.NAME.fullmatch(j["name"]) and j["name"] == path.parent.name:
            return j
    raise LaunchError(f"no jobs yet (jobs are in {root})")


def latest_running() -> dict:
    """The newest job that has not ended (attached or detached): what `stop` without --job stops."""
    sweep()
    root = jobs_dir()
    for path in sorted(root.glob("*/job.json"), key=_mtime, reverse=True):
        j = read_record(path)
        if j is not None and values.NAME.fullmatch(j["name"]) and j["name"] == path.parent.name and not j.get("ended"):
            return j
    raise LaunchError("no running job to stop (`dtrain status` lists the jobs; `dtrain stop --job NAME` "
                      "cleans an ended one's nodes)")


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def read_log(path: Path) -> str:
    """A job's output.log here; LaunchError naming it where there is none."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        raise LaunchError(f"{path}: no output kept for this job") from None


def job_nodes(job: dict) -> list[Node]:
    """The nodes a record names; LaunchError naming the job where they cannot be read."""
    try:
        return [Node(**n) for n in job.get("nodes") or []]
    except (TypeError, ValueError):
        raise LaunchError(f"job {job.get('name')}: its record's nodes cannot be read "
                          f"({jobs_dir() / str(job.get('name'))}/job.json)") from None


def _first_node(job: dict) -> Node:
    nodes = job_nodes(job)
    if not nodes:
        raise LaunchError(f"job {job.get('name')}: no nodes recorded")
    return next((n for n in nodes if n.host == job.get("first")), nodes[0])


def node_file_argv(job: str, name: str, follow: bool = False) -> list[str]:
    """On a node: print the job's file (output.log, state.json) from its directory there (the
    node finds its own: host/prepare.sh job_file); follow: keep printing what is appended (tail -F)."""
    return node_programs.host_argv("job_file", check_name(job), name, "1" if follow else "0")


def detached_state(job: dict, ssh_opts: tuple[str, ...] = ()) -> dict:
    """A detached job's state.json from its first node (where its supervisor runs); once it
    has ended, kept in job.json too. {} where the node does not answer."""
    if job.get("final"):
        return job["final"]
    first = _first_node(job)
    ssh = SshTransport([first], ssh_opts or job.get("ssh_opts", []), multiplex=False)
    # One try: `status` asks every job's node at once (status_rows), and waits one connect timeout.
    r = ssh.run(ssh.nodes, lambda n: node_file_argv(job["name"], "state.json"), timeout=15, retries=0)[0]
    if not r.ok:
        return {}
    try:  # the supervisor's file, beside the job (untrusted): checked (launch/jobs/events.py)
        state = events.node_state(r.stdout, f"{first.host}: the job's state.json")
    except ValueError as e:
        raise LaunchError(f"job {job['name']}: {clean(str(e))}") from None
    if state.get("state") in ("succeeded", "failed"):
        record(job["name"], final=state, exit_code=state.get("exit_code"))
    return state


def node_logs(job: dict, follow: bool, out=sys.stdout, ssh_opts: tuple[str, ...] = ()) -> int:
    """A detached job's output as the launch shows it, read from its first node; follow:
    until the job ends. Returns the job's exit code where it ended, else 0. The supervisor's
    `phase` events in it (a restart's) join the timeline in the job's record."""
    from dtrain.launch.analysis import timeline
    from dtrain.launch.jobs.supervision import Render

    first = _first_node(job)
    ssh = SshTransport([first], ssh_opts or job.get("ssh_opts", []), multiplex=False)
    argv = ssh.argv(first, node_file_argv(job["name"], "output.log", follow))
    phases: list = []
    names = job.get("node_names") if isinstance(job.get("node_names"), dict) else {}
    render = Render(job.get("launcher") or "mpirun", (job.get("ranks") or [first.host])[0],
                    t0=float(job.get("started") or 0), names=names, on_phase=phases.append)
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
        restarts = [e for e in phases if e.restart]  # the launch's own came with the launch
        if restarts:
            now = read_record(job_dir(job["name"]) / "job.json") or {}
            record(job["name"], timeline=timeline.to_json(timeline.merge(timeline.from_json(now.get("timeline")),
                                                                          restarts)))
    if render.final is None and proc.returncode not in (0, -15):
        said = proc.stderr.read().strip()[-300:]
        if proc.returncode == SSH_FAILURE:  # ssh's own end: the keepalives found the link lost
            raise LaunchError(f"{first.host}: lost the connection to the job's first node ({said or 'no answer'}); "
                              f"the job runs on there under its supervisor: dtrain status, "
                              f"dtrain logs --job {job['name']} --follow")
        raise LaunchError(f"{first.host}: cannot read the job's output: {said}")
    return render.exit_code or 0


def status_rows(limit: int = 10, name: str | None = None) -> list[tuple[str, ...]]:
    """The latest jobs (or the job `name`), one row each; a record that cannot be read is a row
    saying so (the other jobs' rows are unaffected)."""
    sweep()
    rows = [("job", "state", "launcher", "nodes", "image", "exit")]
    if name is not None:
        load_job(name)  # a LaunchError naming it where there is no such job
    paths = [job_dir(name) / "job.json"] if name else sorted(jobs_dir().glob("*/job.json"), key=_mtime)[-limit:]
    checked = [(p, *_check_record(p)) for p in paths]
    records = [(p, j) for p, j, _ in checked]
    unread = {p: why for p, j, why in checked if j is None}

    def ask(j: dict) -> dict:
        try:
            return detached_state(j)
        except LaunchError as e:
            return {"state": str(e)}

    # Detached jobs' first nodes are asked at once: unreachable ones cost one timeout in all.
    asked = [j for _, j in records if j is not None and str(j.get("state")) == "detached"]
    with ThreadPoolExecutor(max_workers=max(1, len(asked))) as pool:
        states = dict(zip((id(j) for j in asked), pool.map(ask, asked)))
    for p, j in records:
        if j is None:
            rows.append((p.parent.name, f"unreadable record ({p}: {unread[p]})", "", "", "", ""))
            continue
        state = str(j.get("state", "?"))
        if state in LIVE_STATES and not launcher_alive(j):
            state += " (launcher gone)"
        if state == "detached":  # its supervisor on the first node knows
            now = states[id(j)]
            j["exit_code"] = now.get("exit_code", j.get("exit_code"))
            state = (f"detached: {now.get('state', 'no answer from its first node')}"
                     + (f", {now['restarts']} restart(s)" if now.get("restarts") else "")
                     + (f" ({now['reason']})" if now.get("state") == "failed" and now.get("reason") else ""))
            j["quarantined"] = now.get("quarantined") or j.get("quarantined")
            j["stragglers"] = now.get("stragglers") or j.get("stragglers")
        if isinstance(j.get("quarantined"), dict) and j["quarantined"]:
            state += "; quarantined " + ", ".join(f"{h} ({why})" for h, why in j["quarantined"].items())
        if isinstance(j.get("stragglers"), dict) and j["stragglers"]:  # --straggler-check
            state += "; straggler " + ", ".join(f"{h} ({what})" for h, what in j["stragglers"].items())
        nodes = j.get("nodes") if isinstance(j.get("nodes"), list) else []
        rows.append((str(j["name"]), state, str(j.get("launcher", "")), str(len(nodes)),
                     str(j.get("image", "")), "" if j.get("exit_code") is None else str(j["exit_code"])))
    return [tuple(clean(c) for c in row) for row in rows]  # a node's words, without terminal control


def job_timeline(name: str) -> str:
    """The job's timeline (launch/analysis/timeline.py) as tables: a row per node, a column per
    phase, seconds; a detached job's restarts read from its first node first (node_logs)."""
    from dtrain.launch.analysis import timeline

    job = load_job(name)
    if job.get("detached"):
        import io

        with contextlib.suppress(LaunchError):
            node_logs(job, False, out=io.StringIO())
        job = load_job(name)
    entries = timeline.from_json(job.get("timeline"))
    if not entries and "timeline" in job:  # a new launch's record: no phase reached
        return (f"no phase of job {name} has ended yet" if job.get("state") in ("starting", "running", "detached")
                else f"job {name}: the launch ended before its first phase")
    if not entries:
        return f"no timeline recorded for job {name} (a launch before dtrain recorded one)"
    order = [n.host for n in job_nodes(job)]
    return timeline.text(entries, order)


def follow(path: Path, job: dict, out=sys.stdout) -> None:
    """Print the log, then new lines while the job's launcher runs."""
    try:
        f = path.open(errors="replace")
    except OSError:
        raise LaunchError(f"{path}: no output kept for this job") from None
    with f:
        while True:
            line = f.readline()
            if line:
                out.write(clean(line, colour=True, lines=True))
                out.flush()
                continue
            now = read_record(path.parent / "job.json") or {}
            if not launcher_alive(job) or now.get("ended"):
                return
            time.sleep(0.2)


def remove_argv(job: str) -> list[str]:
    """The node step that removes a job's container, key directory and files (a detached
    job's log and state too) and releases the node's lock of the name; fine if none is there."""
    return node_programs.host_argv("remove", contract.container_name(job), contract.node_key_dir(job),
                                   check_name(job))


ENDED = ("succeeded", "failed", "failed to launch", "interrupted", "stopped", "launcher gone")


def stop_line(name: str, state_before: str | None) -> str:
    """What `stop` says: a job that had ended before it (its state then) is not "stopped" by it;
    stop only made sure that nothing of it is left on its nodes."""
    if state_before in ENDED:
        return f"{name} had already ended ({state_before}); no container of it is left on its nodes"
    return f"stopped {name}"


def stop(name: str | None, ssh_opts: tuple[str, ...] = ()) -> str:
    """Stop a job: signal its launcher (which tears down), then make sure no container is left.
    The launcher is signalled only where the process at its recorded PID is still it (same
    start time and command line): never a process that got the PID later."""
    job = load_job(name) if name else latest_running()
    name = check_name(job["name"])
    if not job.get("ended") and launcher_alive(job):
        os.kill(job["pid"], signal.SIGTERM)
        for _ in range(150):
            if not launcher_alive(job):
                break
            time.sleep(0.2)
    nodes = job_nodes(job)
    ssh = SshTransport(nodes, ssh_opts or job.get("ssh_opts", []), multiplex=False)
    results = ssh.run(nodes, lambda n: remove_argv(name), timeout=60)
    bad = [r for r in results if not r.ok]
    if job.get("state") == "detached" and not bad:
        record(name, state="stopped", ended=time.time())
    if bad:
        raise LaunchError("could not reach every node to remove the containers:\n" +
                          host_lines([(r.host, r.error or "failed") for r in bad]))
    return name
