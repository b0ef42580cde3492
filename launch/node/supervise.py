#!/usr/bin/env python3
"""The job's supervisor: runs in the first node's container, for foreground and detached jobs.

    python3 supervise.py PLAN.json

One attempt after another: start the launcher command (mpirun or horovodrun from here;
torchrun on every node over the job's ssh), watch every node (an ssh to its container each
`interval` seconds that also refreshes the heartbeat its node watchdog waits for), and when a
rank exits non-zero or a node is lost, stop the attempt and start the next one on the nodes
still healthy, while at least `min_nodes` remain and `max_restarts` allow. At the end every
node's container is stopped (its watchdog removes it and the node's job files).

The plan is written by the launcher (launch/jobs/supervision.py): the job's launcher command
apart from its nodes (commands.LaunchCommand), the nodes, the restart policy. Each attempt's
command comes from the same builder the launcher used (commands.attempt_argv, sent beside this
program with the rest of the launcher's dtrain modules) for the nodes the attempt has. Values
of the job's --env come from its 0600 file on each node (launch/node/run.sh exports them: this
program's environment, and torchrun's on the other nodes), never on a command line.

Output: the attempt's own lines (torchrun's with `[hostname] ` before them), and this program's events as lines
`dtrain-supervisor {json}` (start, lost, restart, succeeded, failed), on stdout and appended
to output.log beside the plan; the last event is also kept in state.json. Where output.log or
state.json cannot be written (a full disk), the job ends with an error naming the node and the
file, its output still drained. An attached job ends too when its launcher goes silent (no
line on stdin for the plan's launcher_silence seconds: a lost link). Standard library and
the launcher's dtrain modules only.
"""

from __future__ import annotations

import json
import os
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path


def _builders(here: Path) -> None:
    """The launcher's own dtrain modules (contract, command builders: launch/jobs/supervision.py
    builder_files), sent beside this program as builders.json: unpacked into the container's
    own /tmp (gone with the container; the job's directory keeps nothing of it) and imported
    from there. Where there is none (a test on the launcher's machine), the installed dtrain is."""
    bundle = here / "builders.json"
    if bundle.is_file():
        import tempfile

        root = Path(tempfile.mkdtemp(prefix="dtrain-builders-"))
        for rel, text in json.loads(bundle.read_text()).items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        sys.path.insert(0, str(root))


_builders(Path(__file__).resolve().parent)

from dtrain import contract  # noqa: E402
from dtrain.launch.jobs import commands  # noqa: E402

EVENT = contract.SUPERVISOR_EVENT
JOB_DIR = contract.CONTAINER_JOB_DIR
WORKDIR = contract.WORKDIR
# sh: SIGKILL every process whose environment has DTRAIN_RESTART={attempt} (the attempt's ranks)
KILL_ATTEMPT = ('for p in /proc/[0-9]*; do grep -qzx "%s={attempt}" "$p/environ" 2>/dev/null '
                '&& kill -9 "${{p#/proc/}}" 2>/dev/null; done; true') % commands.RESTART_VAR


# ---------------------------------------------------------------- pure


def start_dir(here: str, workdir: str = WORKDIR) -> str:
    """Where the command starts on every node: the job's code where the container has it, else
    `here`, where `docker exec` started this program: the image's WORKDIR (the same in every
    container of the job; the Ray driver starts there too: launch/jobs/job.py _run_ray). torchrun's
    ssh to a node would start in root's home: its line changes to this directory first."""
    return workdir if os.path.isdir(workdir) else here


def rank_map(nodes: list[dict]) -> list[str]:
    """Global rank -> hostname, as `--map-by slot` and torchrun's node ranks fill them."""
    return [n["hostname"] for n in nodes for _ in range(n["slots"])]


def next_step(alive: list[dict], lost: dict[str, str], attempt: int, code: int,
              min_nodes: int, max_restarts: int) -> tuple[str, str]:
    """After an attempt ended with `code` and `lost` ({hostname: reason}) among `alive`:
    ("succeeded"|"failed"|"restart", why)."""
    left = [n for n in alive if n["hostname"] not in lost]
    if code == 0 and not lost:
        return "succeeded", ""
    what = (f"lost {', '.join(f'{h} ({r})' for h, r in lost.items())}" if lost
            else f"the job exited {code}")
    if len(left) < min_nodes:
        return "failed", f"{what}: {len(left)} node(s) left, fewer than --min-nodes {min_nodes}"
    if attempt >= max_restarts:
        return "failed", f"{what}; no restart left (--max-restarts {max_restarts})"
    return "restart", what


# ---------------------------------------------------------------- the supervisor


class Supervisor:
    def __init__(self, plan: dict, job_dir: Path):
        self.plan = plan
        self.dir = job_dir
        self.nodes: list[dict] = plan["nodes"]
        self.me = self.nodes[0]
        self.ssh: list[str] = plan["ssh"]  # ssh argv prefix that reaches a node's container
        self.log = (job_dir / "output.log").open("a", buffering=1)
        self.write_error = ""  # set once output.log (or state.json) cannot be written: the job ends
        self.lock = threading.Lock()
        self.procs: list[subprocess.Popen] = []
        self.pumps: list[threading.Thread] = []  # the attempt's output readers
        self.stopping = threading.Event()  # the launcher went away (foreground) or stop asked
        self.cwd = start_dir(os.getcwd())
        self.state: dict = {"job": plan["job"], "launcher": plan["launcher"], "restarts": 0,
                            "nodes": [n["hostname"] for n in self.nodes], "started": time.time()}

    # -- output

    def cannot_write(self, name: str, e: OSError) -> str:
        """One line naming the node and the file on it (its path on the node where known)."""
        where = self.plan.get("node_dir") or str(self.dir)
        return (f"cannot write {where}/{name} on {self.me['hostname']} ({self.me['address']}): "
                f"{e.strerror or e}; free space there and launch again")

    def emit(self, line: str) -> None:
        with self.lock:
            if not self.write_error:
                try:
                    self.log.write(line + "\n")
                except OSError as e:  # a full disk: the job ends (watch), its output still drains
                    self.write_error = self.cannot_write("output.log", e)
            try:
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
            except (BrokenPipeError, ValueError):
                pass  # a foreground launcher that went away; the log still has it

    def event(self, name: str, **fields) -> None:
        self.state.update(state=name, **fields, updated=time.time())
        tmp = self.dir / "state.json.tmp"
        try:
            tmp.write_text(json.dumps(self.state))
            tmp.replace(self.dir / "state.json")
        except OSError as e:
            tmp.unlink(missing_ok=True)
            self.write_error = self.write_error or self.cannot_write("state.json", e)
        self.emit(EVENT + json.dumps({"event": name, **fields}))

    def _pump(self, proc: subprocess.Popen, prefix: str) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            self.emit(prefix + raw.rstrip("\r\n"))

    # -- nodes

    def remote(self, node: dict, command: str, *, tty: bool = False, mux: bool = True) -> list[str]:
        opts = (["-tt"] if tty else []) + ([] if mux else ["-o", "ControlPath=none"])
        return [*self.ssh, *opts, node["address"], command]

    def probe(self, node: dict) -> str:
        """'' when the node's container answers and is not leaving; else the reason."""
        check = f"touch {JOB_DIR}/heartbeat && test ! -e {JOB_DIR}/leaving"
        if node is self.me:
            return "" if subprocess.call(["sh", "-c", check]) == 0 else "leaving (spot notice)"
        try:
            r = subprocess.run(self.remote(node, check, mux=False), stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=self.plan.get("probe_timeout", 5))  # ssh's ConnectTimeout is 3
        except subprocess.TimeoutExpired:
            return f"sshd on {contract.SSH_PORT} did not answer"
        if r.returncode == 1:
            return "leaving (spot notice)"
        if r.returncode != 0:
            err = (r.stderr.strip().splitlines() or ["no answer"])[-1]
            return f"sshd on {contract.SSH_PORT} unreachable: {err}"
        return ""

    def probe_all(self, nodes: list[dict]) -> dict[str, str]:
        out: dict[str, str] = {}

        def one(n: dict) -> None:
            why = self.probe(n)
            if why:
                out[n["hostname"]] = why

        threads = [threading.Thread(target=one, args=(n,)) for n in nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    # -- one attempt

    def start(self, nodes: list[dict], attempt: int) -> None:
        """The attempt's launcher command for `nodes`, from the builders (commands.attempt_argv),
        as the launcher made the first one."""
        run = commands.LaunchCommand.from_json(self.plan["run"])
        env = {**os.environ, **dict(run.extra_env), commands.RESTART_VAR: str(attempt)}
        argvs = commands.attempt_argv(run, nodes)
        if run.launcher in ("mpirun", "horovodrun"):
            self.procs = [self._spawn(argvs[0], env)]
            return
        # torchrun: one per node over the job's ssh (a tty, so that ending this ssh ends the
        # node's torchrun: it stops its workers on SIGHUP); its argv runs through run.sh there
        # (node_prefix), which exports the job's --env values from that node's file.
        self.procs = []
        for n, argv in zip(nodes, argvs):
            line = (f"export {commands.RESTART_VAR}={attempt}; cd {shlex.quote(self.cwd)} && "
                    f"exec {shlex.join([*self.plan['node_prefix'], *argv])}")
            self.procs.append(self._spawn(self.remote(n, line, tty=True), env, f"[{n['hostname']}] "))

    def _spawn(self, argv: list[str], env: dict, prefix: str = "") -> subprocess.Popen:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=True, cwd=self.cwd)  # mpirun's ranks start there too
        pump = threading.Thread(target=self._pump, args=(proc, prefix), daemon=True)
        pump.start()
        self.pumps.append(pump)
        return proc

    def watch(self, nodes: list[dict]) -> tuple[int, dict[str, str]]:
        """Until the attempt ends: (its exit code, the nodes lost meanwhile with why)."""
        interval = float(self.plan.get("interval", 5))
        strikes: dict[str, int] = {}
        next_probe = time.monotonic() + interval
        while True:
            codes = [p.poll() for p in self.procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed or all(c == 0 for c in codes):
                return (failed[0] if failed else 0), {}
            if self.stopping.is_set():
                return 143, {}
            if self.write_error:
                return 1, {}
            if time.monotonic() >= next_probe:
                bad = self.probe_all(nodes)
                lost = {}
                for n in nodes:
                    host = n["hostname"]
                    strikes[host] = strikes.get(host, 0) + 1 if host in bad else 0
                    if host in bad and (bad[host].startswith("leaving")
                                        or strikes[host] >= int(self.plan.get("lost_after", 2))):
                        lost[host] = bad[host]
                if lost:
                    return 1, lost
                next_probe = time.monotonic() + interval
            time.sleep(0.2)

    def stop_attempt(self, grace: float = 10) -> None:
        """End the attempt's processes: TERM, then KILL after grace seconds."""
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        for pump in self.pumps:  # the attempt's last lines, before the event that ends it
            pump.join(5)
        self.pumps = []

    def kill_leftovers(self, nodes: list[dict], attempt: int) -> None:
        """Ranks of the ended attempt that outlived their launcher (a rank orphaned on this
        node, one whose orted missed the end): every process whose environment says this
        attempt, on every node still there."""
        line = KILL_ATTEMPT.format(attempt=int(attempt))
        procs = [subprocess.Popen(["sh", "-c", line] if n is self.me else self.remote(n, line, mux=False),
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for n in nodes]
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()

    # -- the job

    def run(self) -> int:
        alive = list(self.nodes)
        attempt = 0
        code = 0
        while True:
            self.state["restarts"] = attempt
            self.event("running", attempt=attempt, nodes=[n["hostname"] for n in alive],
                       ranks=rank_map(alive))
            self.start(alive, attempt)
            code, lost = self.watch(alive)
            t_end = time.monotonic()
            # A lost node stalls every collective: no rank can save anything more, and mpirun
            # waits for the lost node's daemon. Its ranks get 2 s, not the usual 10.
            self.stop_attempt(grace=2 if lost else 10)
            if self.stopping.is_set():
                self.event("failed", exit_code=code, reason="stopped: the launcher went away")
                break
            if self.write_error:  # a full disk here: no restart writes more
                self.event("failed", exit_code=1, reason=self.write_error, at_fault=[self.me["hostname"]])
                code = 1
                break
            if code != 0:  # a rank failed: which nodes are still there?
                time.sleep(float(self.plan.get("settle", 1)))
                lost.update(self.probe_all([n for n in alive if n["hostname"] not in lost]))
            if self.me["hostname"] in lost:
                lost.pop(self.me["hostname"])  # this node answers: it is running this
            if lost:
                self.event("lost", nodes=lost)
            step, why = next_step(alive, lost, attempt, code,
                                  int(self.plan.get("min_nodes", 1)), int(self.plan.get("max_restarts", 0)))
            alive = [n for n in alive if n["hostname"] not in lost]
            if step == "succeeded":
                self.event("succeeded", exit_code=0)
                code = 0
                break
            if step == "failed":
                self.event("failed", exit_code=code or 1, reason=why, at_fault=sorted(lost))
                code = code or 1
                break
            self.kill_leftovers(alive, attempt)
            attempt += 1
            self.event("restart", attempt=attempt, reason=why, dropped=sorted(lost),
                       ended_in=round(time.monotonic() - t_end, 1))
        self.teardown(alive)
        return code

    def teardown(self, alive: list[dict]) -> None:
        """Stop every other container still reachable (each node's watchdog then removes it and
        the node's job files), then this one."""
        if self.plan.get("keep_containers"):
            return
        procs = [subprocess.Popen(self.remote(n, "kill 1", mux=False), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for n in alive if n is not self.me]
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        try:
            self.log.flush()
        except OSError:
            pass  # a full disk: write_error said so
        os.kill(1, signal.SIGTERM)


def _watch_stdin(sup: Supervisor, silence: float | None) -> None:
    """Foreground: the launcher holds our stdin open and writes a line every few seconds; EOF
    (kill -9), or nothing for `silence` seconds (a lost link this node's sshd never notices),
    means it went away: the job stops, as a foreground job does when its terminal closes."""
    fd = sys.stdin.fileno()
    try:
        while select.select([fd], [], [], silence)[0] and os.read(fd, 4096):
            pass
    except (OSError, ValueError):
        pass
    sup.stopping.set()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: supervise.py PLAN.json", file=sys.stderr)
        return 2
    path = Path(argv[1])
    plan = json.loads(path.read_text())
    sup = Supervisor(plan, path.parent)
    if plan.get("attached"):
        silence = plan.get("launcher_silence")
        threading.Thread(target=_watch_stdin, args=(sup, float(silence) if silence else None), daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: sup.stopping.set())
    return sup.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
