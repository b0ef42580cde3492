#!/usr/bin/env python3
"""The job's supervisor: runs in the first node's container, for foreground and detached jobs.

    python3 supervise.py PLAN.json

One attempt after another: start the launcher command (mpirun or horovodrun from here;
torchrun on every node over the job's ssh) and watch every node. Health: each other node's
container holds a standing session to this one and sends a line every `beat` seconds (BEAT,
which also refreshes the heartbeat file its node watchdog waits for); a node silent for
`suspect_after` seconds whose sshd port does not take a TCP connection within
`connect_timeout` is lost (a NIC down, an instance gone: about 1 s), while one that is only
slow (a busy CPU, a disk under writeback: its kernel still answers) is lost only after
`lost_after` seconds of silence. A node whose session ends (its container gone) is lost at
once. A node given a spot notice says `leaving` in its beat: the job is told to checkpoint
now (contract.CHECKPOINT_NOW), then the attempt ends. With the plan's `hang_timeout`, an
attempt none of whose ranks made progress for that long (launch/jobs/progress.py) is a hang:
every rank's Python stack is read (launch/node/stacks.sh), the `hang` event names the ranks
not waiting in a collective (launch/analysis/stacks.py; by progress where all wait), the stacks go
into the output, and the attempt ends as a failed one. With `straggler_check`, every
rank's stack is sampled that often (stacks.sh too) and the rank the others wait for is named
once per attempt (a `straggler` event: launch/analysis/straggler.py's rule; the attempt goes on;
with `replace_stragglers` and a spare left, it is taken out as a node given a spot notice is:
checkpoint now, then a spare in its place, the node quarantined as a straggler).

When a rank exits non-zero, or a node is lost or leaving, the attempt stops and the next one
starts: a lost or leaving node is swapped for a warm spare in its place (runplan.swap_out:
same world size; the node is quarantined, not used again by this job), or, with no spare
left, dropped while at least `min_nodes` remain; `max_restarts` bounds the attempts. An
attached job's launcher may offer a spare while the job runs (a line on stdin, runplan.SPARE_LINE:
a node its Auto Scaling group brought back, made ready): it joins the spares. At the
end every node's container is stopped (its watchdog removes it and the node's job files).

The plan is written by the launcher (runplan.RunPlan, launch/jobs/supervision.py): the job's
launcher command apart from its nodes, the nodes and spares, the restart policy. Each
attempt's command comes from the same builder the launcher used (launchers.attempt_argv, sent
beside this program with the rest of the launcher's dtrain modules) for the nodes the attempt
has. Values of the job's --env come from its 0600 file on each node (launch/node/run.sh
exports them: this program's environment, and torchrun's on the other nodes), never on a
command line.

Output: the attempt's own lines (torchrun's with `[hostname] ` before them), and this program's
events as lines `dtrain-supervisor {json}` (running, lost, checkpoint-now, quarantined,
spare-in, spare-joined, hang, straggler, nccl-net, restart, phase, succeeded, failed; a hang's stacks as `dtrain-stack ` lines), on stdout and appended to output.log beside the
plan; the state (nodes, spares, quarantined, the last event) is kept in state.json. Where
output.log or state.json cannot be written (a full disk), the job ends with an error naming
the node and the file, its output still drained. An attached job ends too when its launcher
goes silent (no line on stdin for the plan's launcher_silence seconds: a lost link). Standard
library and the launcher's dtrain modules only.
"""

from __future__ import annotations

import errno
import json
import os
import random
import select
import selectors
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Collection, NamedTuple, Sequence


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
        sys.dont_write_bytecode = True  # their .pyc would go with the container unread: ~3 ms of writes


_builders(Path(__file__).resolve().parent)

from dtrain import contract  # noqa: E402
from dtrain.launch.jobs import launchers, output, progress, runplan  # noqa: E402
# stacks and straggler (--hang-timeout's verdict, --straggler-check) are imported where they are
# used: this program's imports are on every launch's path (~8 ms of a container's CPU), and
# builder_files sends them all the same (shipped_modules reads a function's imports too).

EVENT = contract.SUPERVISOR_EVENT
JOB_DIR = contract.CONTAINER_JOB_DIR
WORKDIR = contract.WORKDIR
# sh: SIGKILL every process whose environment has DTRAIN_RESTART={attempt} (the attempt's ranks)
# After a lost node, the attempt's ranks get this long after SIGTERM before SIGKILL: every
# collective is stalled, so nothing more can be saved (a checkpoint is written whole or not at all:
# a temporary file, then a rename), and the ranks left over are killed next on every node.
LOST_GRACE = 0.1
# This container's hosts file, where a spare that joins is named (DTRAIN_HOSTS_FILE: another, for tests)
HOSTS = os.environ.get("DTRAIN_HOSTS_FILE", "/etc/hosts")
# Why a node is taken out, for which the job is asked to checkpoint first (CHECKPOINT_NOW): it still
# runs its ranks (a spot notice: `leaving`; --replace-stragglers: `straggler`)
CHECKPOINT_FIRST = ("leaving", "straggler")
# The heartbeat sessions open once the first attempt printed its first line, or this many
# seconds after its start if sooner: their key exchanges (one per other node) must not compete
# with the launcher's daemons and the ranks' start. A node lost before is the launcher's own
# failure (mpirun: a daemon that cannot start), and an attempt that ends first opens them then.
HEARTBEAT_AFTER = 1.0
KILL_ATTEMPT = ('for p in /proc/[0-9]*; do grep -qzx "%s={attempt}" "$p/environ" 2>/dev/null '
                '&& kill -9 "${{p#/proc/}}" 2>/dev/null; done; true') % runplan.RESTART_VAR


# ---------------------------------------------------------------- pure


def end_attempt_line(attempt: int, job_dir: str = JOB_DIR) -> str:
    """The shell line that ends an attempt on a node (kill_leftovers): every process whose
    environment says this attempt (KILL_ATTEMPT), then the attempt's flight-recorder dumps in
    the job directory (launch/jobs/flightrec.py PREFIX: read or not), so the next attempt's hang
    reads its own, never one a rank of this attempt wrote after the last read."""
    from dtrain.launch.jobs import flightrec

    # regular files only: a late line (an ssh that took its time) never removes the next
    # attempt's debug pipes, and a new attempt's dumps come only on a collective's timeout
    return (KILL_ATTEMPT.format(attempt=int(attempt)) + f"; find {shlex.quote(job_dir)} -maxdepth 1 -type f "
            f"-name {shlex.quote(flightrec.PREFIX + '*')} -delete 2>/dev/null; true")


def hosts_lines(nodes: Sequence[runplan.PlanNode]) -> str:
    """/etc/hosts lines naming nodes (a container's, where a spare joins the run)."""
    return "".join(f"{n.address} {n.hostname}\n" for n in nodes)


def start_dir(here: str, workdir: str = WORKDIR) -> str:
    """Where the command starts on every node: the job's code where the container has it, else
    `here`, where `docker exec` started this program: the image's WORKDIR (the same in every
    container of the job; the Ray driver starts there too: launch/jobs/launchers/ray.py Ray.run). torchrun's
    ssh to a node would start in root's home: its line changes to this directory first."""
    return workdir if os.path.isdir(workdir) else here


def next_step(nodes: Sequence[runplan.PlanNode], spares: Sequence[runplan.PlanNode], out: dict[str, str],
              attempt: int, code: int, min_nodes: int, max_restarts: int, cause: str = "") -> tuple[str, str]:
    """After an attempt on `nodes` ended with `code` and `out` ({hostname: why}: lost, leaving)
    among them, or for `cause` (a hang): ("succeeded"|"failed"|"restart", why). Each node taken
    out is replaced by a spare while any is left; without one the run goes on smaller, down to
    min_nodes. The first node runs this supervisor: it cannot be swapped."""
    if code == 0 and not out and not cause:
        return "succeeded", ""
    what = (f"lost {', '.join(f'{h} ({r})' for h, r in out.items())}" if out
            else cause or f"the job exited {code}")
    if nodes[0].hostname in out:
        return "failed", (f"{what}: {nodes[0].hostname} is the job's first node, where its supervisor runs; "
                          "launch again to resume from the checkpoint")
    left, _, _ = runplan.swap_out(nodes, spares, out)
    if len(left) < min_nodes:
        return "failed", f"{what}: {len(left)} node(s) left and no spare, fewer than --min-nodes {min_nodes}"
    if attempt >= max_restarts:
        return "failed", f"{what}; no restart left (--max-restarts {max_restarts})"
    return "restart", what


def verdict(silent: float, port_answers: bool | None, plan: runplan.RunPlan) -> str:
    """Whether a node silent for `silent` seconds is lost: its reason, or "" (not yet).
    port_answers: whether its sshd port took a TCP connection (None: not asked yet)."""
    if silent >= plan.lost_after:
        return f"no heartbeat for {silent:.0f} s"
    if silent >= plan.suspect_after and port_answers is False:
        return f"no heartbeat for {silent:.1f} s and port {contract.SSH_PORT} unreachable"
    return ""


# A node's side of its heartbeat, run in its container over the standing session (no value of the
# job in it): for each line the supervisor sends (every `beat` seconds) a line back, `leaving`
# once the node's watchdog has seen a spot notice, and every few lines the heartbeat file its
# watchdog waits for, in the background (a disk under writeback must not hold up the answer).
# With nothing from the supervisor for HEAR_S seconds (taken out of the job, the link or the
# first node gone) it ends: the heartbeat file ages and the node's watchdog removes the job there.
HEAR_S = 10
BEAT = ('n=0; while IFS= read -r -t {hear} _; do if [ -e {dir}/leaving ]; then echo leaving; else echo beat; fi '
        '|| exit 0; if [ $((n % {every})) -eq 0 ]; then (touch {dir}/heartbeat &); fi; n=$((n + 1)); done')


def beat_line(beat: float) -> str:
    script = BEAT.format(dir=JOB_DIR, hear=HEAR_S, every=max(1, round(5 / beat)))
    return f"exec bash -c {shlex.quote(script)}"


def mux_opts(mux: bool | str) -> list[str]:
    """ssh's options for a session to a node's container. mux: True, over the node's master (the
    ready check's; made by this session where there is none); False, a connection of its own;
    "existing", over the master where one is up, else a connection of its own, never made a
    master (ControlMaster=no: a master this session made would end with it, taking mpirun's
    sessions on it along)."""
    if mux is True:
        return []
    if mux is False:
        return ["-o", "ControlPath=none"]
    if mux == "existing":
        return ["-o", "ControlMaster=no"]
    raise ValueError(f"mux_opts: mux {mux!r}")


PORT_TRIES = 3  # SYNs the port check sends, timeout/PORT_TRIES apart


def port_answers(address: str, timeout: float, tries: int = PORT_TRIES) -> bool:
    """Whether address:SSH_PORT takes a TCP connection within `timeout` s: the node's kernel
    answers even while its processes are starved of CPU; a node whose NIC is down or that is
    gone does not. `tries` connections, started timeout/tries apart (each sends one SYN: the
    kernel's own retry comes only after 1 s), so one lost SYN is not a lost node; a refusal
    (nothing listens: the container is gone) answers at once. Where this thread was held up
    (a starved supervisor), every try is still sent and the last gets timeout/tries, and the
    sockets are looked at once more before the answer is no."""
    start = time.monotonic()
    gap = timeout / tries
    socks: list[socket.socket] = []

    def answered(ready: list) -> bool | None:
        for key, _ in ready:
            err = key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)  # type: ignore[union-attr]
            if err == 0:
                return True
            if err in (errno.ECONNREFUSED, errno.ECONNRESET):
                return False  # its kernel answered: nothing listens there
            sel.unregister(key.fileobj)  # another error (no route): the other tries go on
        return None

    try:
        family, _, _, _, where = socket.getaddrinfo(address, contract.SSH_PORT, type=socket.SOCK_STREAM)[0]
        with selectors.DefaultSelector() as sel:
            last = start
            while True:
                now = time.monotonic()
                if len(socks) < tries and now >= start + len(socks) * gap:
                    s = socket.socket(family, socket.SOCK_STREAM)
                    socks.append(s)
                    s.setblocking(False)
                    if s.connect_ex(where) not in (0, errno.EINPROGRESS):
                        return False  # refused at once, no route
                    sel.register(s, selectors.EVENT_WRITE)
                    last = now
                end = max(start + timeout, last + gap)
                if len(socks) == tries and now >= end:
                    return bool(answered(sel.select(0)))  # a late look: this thread may have been held up
                wake = min(end, start + len(socks) * gap) if len(socks) < tries else end
                if (verdict := answered(sel.select(max(0.0, wake - time.monotonic())))) is not None:
                    return verdict
    except OSError:
        return False
    finally:
        for s in socks:
            s.close()


# ---------------------------------------------------------------- health


class Health:
    """Every other node's heartbeat: one standing ssh session each to its container running BEAT,
    read by a thread. lost() says which nodes are lost or leaving, and why."""

    def __init__(self, sup: "Supervisor"):
        self.sup = sup
        self.plan = sup.plan
        self.lock = threading.Lock()
        self.seen: dict[str, float] = {}  # hostname -> when its last line came
        self.leaving: set[str] = set()
        self.ended: dict[str, str] = {}  # hostname -> why its session ended
        self.probing: dict[str, tuple[float, bool | None]] = {}  # hostname -> (asked when, port answers)
        self.news = threading.Event()  # a port check answered: the watch looks at once
        self.procs: dict[str, subprocess.Popen] = {}
        self.closed = threading.Event()
        threading.Thread(target=self._beat_here, daemon=True).start()
        threading.Thread(target=self._ask, daemon=True).start()

    def _beat_here(self) -> None:
        try:
            self.beat_here()
        except OSError:
            pass  # a full disk: the supervisor's own writes say so

    def _ask(self) -> None:
        """A line to every node's heartbeat session every `beat` seconds: each answers one."""
        while not self.closed.wait(self.plan.beat):
            for proc in list(self.procs.values()):
                try:
                    proc.stdin.write("\n")
                    proc.stdin.flush()
                except (OSError, ValueError):
                    pass  # a session that ended (its reader says why) or a full pipe (a stalled link)

    def watch(self, node: runplan.PlanNode) -> None:
        if node.hostname in self.procs or node is self.sup.me:
            return
        with self.lock:
            self.seen[node.hostname] = time.monotonic()
        # over the ready check's master: a session, not a key exchange of its own (7 of them on 8 nodes,
        # ~20 ms of CPU each at both ends, while the ranks start); its end is the master's too (a lost link)
        proc = subprocess.Popen(self.sup.remote(node, beat_line(self.plan.beat), mux="existing"),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, errors="replace", start_new_session=True)
        assert proc.stdin is not None
        os.set_blocking(proc.stdin.fileno(), False)  # a stalled link must not hold up the others
        self.procs[node.hostname] = proc
        if self.closed.is_set():  # close() ran meanwhile (from another thread): this one goes too
            self.forget(node.hostname)
            return
        threading.Thread(target=self._read, args=(node, proc), daemon=True).start()

    def _read(self, node: runplan.PlanNode, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:
            with self.lock:
                self.seen[node.hostname] = time.monotonic()
                if line.startswith("leaving"):
                    self.leaving.add(node.hostname)
        err = (proc.stderr.read().strip().splitlines() or ["its session ended"])[-1]
        proc.wait()
        with self.lock:
            if node.hostname in self.procs and not self.sup.stopping.is_set():
                self.ended[node.hostname] = f"sshd on {contract.SSH_PORT} unreachable: {err}"
        # no news here: the next look asks its port, whose answer is news (a session that keeps
        # ending while its port answers is opened again once per look at most, not in a loop)

    def _probe(self, node: runplan.PlanNode, asked: float) -> None:
        ok = port_answers(node.address, self.plan.connect_timeout)
        with self.lock:
            if self.probing.get(node.hostname, (0.0, None))[0] == asked:
                self.probing[node.hostname] = (asked, ok)
        self.news.set()

    def beat_here(self) -> None:
        """This node's own heartbeat file, for its watchdog (in the background: a disk under
        writeback must not hold up the supervisor)."""
        while not self.closed.wait(5):
            Path(f"{JOB_DIR}/heartbeat").touch()

    def silent_for(self, hostname: str, now: float) -> float:
        with self.lock:
            return now - self.seen.get(hostname, now)

    def lost(self, nodes: Sequence[runplan.PlanNode]) -> dict[str, str]:
        """{hostname: why} of the nodes among `nodes` that are lost or leaving now. A node silent
        past suspect_after gets its port asked (in the background, again every 2 s)."""
        now = time.monotonic()
        out: dict[str, str] = {}
        for n in nodes:
            h = n.hostname
            if n is self.sup.me:
                if os.path.exists(f"{JOB_DIR}/leaving"):
                    out[h] = "leaving (spot notice)"
                continue
            with self.lock:
                silent = now - self.seen.get(h, now)
                ended = self.ended.get(h)
                leaving = h in self.leaving
                asked, answer = self.probing.get(h, (0.0, None))
            if ended and answer is False:
                out[h] = ended  # its session ended and its port refuses: the container or node is gone
            elif ended and answer is True:
                self._rewatch(n)  # its session ended (the first node stalled?) but it answers: a new one
            elif ended:
                if not asked:
                    with self.lock:
                        self.probing[h] = (now, None)
                    threading.Thread(target=self._probe, args=(n, now), daemon=True).start()
            elif leaving:
                out[h] = "leaving (spot notice)"
            elif silent >= self.plan.suspect_after:
                why = verdict(silent, answer, self.plan)
                if why:
                    out[h] = why
                elif answer is not None and now - asked >= 2 or not asked:
                    with self.lock:
                        self.probing[h] = (now, None)
                    threading.Thread(target=self._probe, args=(n, now), daemon=True).start()
            elif asked:
                with self.lock:
                    self.probing.pop(h, None)  # it answered again: a later silence asks again
        return out

    def _rewatch(self, node: runplan.PlanNode) -> None:
        with self.lock:
            self.ended.pop(node.hostname, None)
            self.probing.pop(node.hostname, None)
        self.procs.pop(node.hostname, None)
        self.watch(node)

    def forget(self, hostname: str) -> None:
        """Stop watching a node (quarantined, or the job is ending)."""
        proc = self.procs.pop(hostname, None)
        if proc and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        self.closed.set()
        for h in list(self.procs):
            self.forget(h)


# ---------------------------------------------------------------- the supervisor


class AttemptEnd(NamedTuple):
    """How an attempt ended: its exit code, the nodes lost or leaving meanwhile with why, the
    spares lost meanwhile with why, and why it hung ("" unless the hang watch ended it)."""
    code: int
    out: dict[str, str]
    spare_out: dict[str, str]
    hung: str = ""
    fatal: str = ""  # why the job ends without a restart (a wrong NCCL network: check_nccl)
    joined: tuple[runplan.PlanNode, ...] = ()  # spares that joined meanwhile (join_offered)


class Supervisor:
    def __init__(self, plan: runplan.RunPlan, job_dir: Path):
        self.plan = plan
        self.dir = job_dir
        self.me = plan.nodes[0]
        self.log = (job_dir / "output.log").open("a", buffering=1)
        self.write_error = ""  # set once output.log (or state.json) cannot be written: the job ends
        self.lock = threading.Lock()
        self.procs: list[subprocess.Popen] = []
        self.pumps: list[tuple[str, threading.Thread]] = []  # the attempt's output readers: (node, reader)
        self.first_line = threading.Event()  # the attempt printed something
        self.stopping = threading.Event()  # the launcher went away (foreground) or stop asked
        self.hang: progress.Watch | None = None  # the attempt's hang watch (--hang-timeout)
        self.sampling = threading.Event()  # set: the attempt's straggler sampling ends (--straggler-check)
        self.slow: dict[str, str] = {}  # stragglers to swap for a spare (--replace-stragglers): host -> why
        self.nccl_fatal: tuple[str, list[str]] | None = None  # --nccl-check's mismatch that ends the job: (why, nodes)
        self.cwd = start_dir(os.getcwd())
        self.health = Health(self)
        self.watching = threading.Lock()  # held once the heartbeat sessions are opened (watch_all)
        self.offered: list[runplan.PlanNode] = []  # spares the launcher offered (stdin), not yet taken
        self.joined: list[runplan.PlanNode] = []  # every spare that joined while the job ran
        self.state: dict = {"job": plan.run.job, "launcher": plan.run.launcher, "restarts": 0,
                            "nodes": [n.hostname for n in plan.nodes], "spares": [n.hostname for n in plan.spares],
                            "quarantined": dict(plan.quarantined), "started": time.time()}

    # -- output

    def cannot_write(self, name: str, e: OSError) -> str:
        """One line naming the node and the file on it (its path on the node where known)."""
        where = self.plan.node_dir or str(self.dir)
        return (f"cannot write {where}/{name} on {self.me.hostname} ({self.me.address}): "
                f"{e.strerror or e}; free space there and launch again")

    def emit(self, line: str) -> None:
        self.emit_all([line])

    def emit_all(self, lines: Sequence[str]) -> None:
        """Lines to the log and the launcher: one write and one flush for all (a flush per line
        is a packet per line over ssh, and most of the launcher's time on chatty output)."""
        text = "".join(line + "\n" for line in lines)
        with self.lock:
            if not self.write_error:
                try:
                    self.log.write(text)
                except OSError as e:  # a full disk: the job ends (watch), its output still drains
                    self.write_error = self.cannot_write("output.log", e)
            try:
                sys.stdout.write(text)
                sys.stdout.flush()
            except (BrokenPipeError, ValueError):
                pass  # a foreground launcher that went away; the log still has it

    def event(self, name: str, **fields) -> None:
        if name != "phase":
            self.state.update(state=name, **fields, updated=time.time())
            self.save_state()
        self.emit(EVENT + json.dumps({"event": name, **fields}))

    def save_state(self) -> None:
        tmp = self.dir / "state.json.tmp"
        try:
            tmp.write_text(json.dumps(self.state))
            tmp.replace(self.dir / "state.json")
        except OSError as e:
            tmp.unlink(missing_ok=True)
            self.write_error = self.write_error or self.cannot_write("state.json", e)

    def phase(self, restart: int, phase: str, seconds: float, node: str = "") -> None:
        """One step of restart number `restart`, timed (the job's timeline shows them):
        detection, checkpoint, teardown, spare-in, resumed."""
        self.event("phase", restart=restart, phase=phase, node=node, seconds=round(seconds, 2))

    def _pump(self, proc: subprocess.Popen, prefix: str) -> None:
        """The attempt's output, as each read brings it, to the log and the launcher."""
        assert proc.stdout is not None
        for raw in output.read_lines(proc.stdout.buffer.read1):
            self.first_line.set()
            lines = [prefix + line for line in raw]
            self.emit_all(lines)
            if self.hang is not None:
                now = time.monotonic()
                for line in lines:
                    self.hang.feed(line, now)

    # -- nodes

    def remote(self, node: runplan.PlanNode, command: str, *, tty: bool = False, mux: bool | str = True) -> list[str]:
        """ssh's argv for command in node's container; mux: mux_opts'."""
        opts = (["-tt"] if tty else []) + mux_opts(mux)
        # before the plan's own options: ssh keeps the first value it is given for an option
        return [*self.plan.ssh[:1], *opts, *self.plan.ssh[1:], node.address, command]

    def on_nodes(self, nodes: Sequence[runplan.PlanNode], line: str, timeout: float = 15, stdin: str = "") -> None:
        """A fixed shell line in each node's container (this one's too), all at once; stdin: its
        input there (data never goes into the line)."""
        procs = [subprocess.Popen(["sh", "-c", line] if n is self.me else self.remote(n, line, mux=False),
                                  stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for n in nodes]
        for p in procs:
            if p.stdin is not None:
                try:
                    p.stdin.write(stdin.encode())
                    p.stdin.close()
                except OSError:
                    pass  # its session ended: the wait below reaps it
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()

    # -- one attempt

    def start(self, nodes: Sequence[runplan.PlanNode], attempt: int) -> None:
        """The attempt's launcher command for `nodes`, from the builders (launchers.attempt_argv),
        as the launcher made the first one."""
        run = self.plan.run
        att = launchers.attempt(run, nodes)
        env = {**os.environ, **dict(run.extra_env), **dict(att.env), runplan.RESTART_VAR: str(attempt)}
        argvs = [list(a) for a in att.argvs]
        for name, text in att.files:  # the launcher's files for this attempt (a hostfile of its nodes)
            path = Path(run.files_dir) / name
            try:
                path.with_name(name + ".tmp").write_text(text)
                path.with_name(name + ".tmp").replace(path)
            except OSError as e:  # the job ends (watch), as for its log
                self.write_error = self.write_error or self.cannot_write(name, e)
        self.first_line.clear()
        self.sampling.set()  # the previous attempt's sampler ends; this attempt's starts below
        self.slow = {}
        if self.plan.straggler_check:
            self.sampling = threading.Event()
            threading.Thread(target=sample_stragglers, args=(self, nodes, attempt, self.sampling), daemon=True).start()
        self.hang = progress.watch(run.launcher, self.plan.hang_timeout, self.plan.progress_pattern,
                                   runplan.rank_map(nodes), time.monotonic())
        if not run.per_node:  # mpirun, horovodrun: one command here starts every rank
            self.procs = [self._spawn(argvs[0], env)]
            return
        # torchrun: one per node over the job's ssh (a tty, so that ending this ssh ends the
        # node's torchrun: it stops its workers on SIGHUP); its argv runs through run.sh there
        # (node_prefix), which exports the job's --env values from that node's file.
        self.procs = []
        for n, argv in zip(nodes, argvs):
            line = (f"export {runplan.RESTART_VAR}={attempt}; cd {shlex.quote(self.cwd)} && "
                    f"exec {shlex.join([*self.plan.node_prefix, *argv])}")
            self.procs.append(self._spawn(self.remote(n, line, tty=True), env, f"[{n.hostname}] ", n.hostname))

    def _spawn(self, argv: list[str], env: dict, prefix: str = "", node: str = "") -> subprocess.Popen:
        """argv with its output read into the log (a line prefix); node: the one it runs on over
        ssh (torchrun's sessions), whose output ends with the ssh master's channel."""
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=True, cwd=self.cwd)  # mpirun's ranks start there too
        pump = threading.Thread(target=self._pump, args=(proc, prefix), daemon=True)
        pump.start()
        self.pumps.append((node, pump))
        return proc

    def watch(self, nodes: Sequence[runplan.PlanNode], spares: Sequence[runplan.PlanNode]) -> AttemptEnd:
        """Until the attempt ends: how it ended (AttemptEnd). A lost spare only leaves the spares;
        a spare the launcher offers meanwhile joins them (AttemptEnd.joined)."""
        spare_out: dict[str, str] = {}
        joined: list[runplan.PlanNode] = []
        while True:
            self.health.news.clear()
            end = attempt_end(self, nodes, (*spares, *joined), spare_out)
            if end is not None:
                return end._replace(joined=tuple(joined))
            # the spares still there: a lost one's address is not asked (its hosts file)
            joined += join_offered(self, nodes, [s for s in (*spares, *joined) if s.hostname not in spare_out])
            self.health.news.wait(0.1)  # a look every 0.1 s, and at once when a port check answers

    def offer(self, node: runplan.PlanNode) -> None:
        """A spare from the launcher (its stdin line, runplan.SPARE_LINE): taken by the watch."""
        with self.lock:
            self.offered.append(node)

    def checkpoint_now(self, nodes: Sequence[runplan.PlanNode]) -> float:
        """A spot notice: ask the job to save a checkpoint (contract.CHECKPOINT_NOW in every
        container) and wait until rank 0 removes the file here (saved), the attempt ends, or
        checkpoint_grace passes. Returns the seconds it took."""
        t0 = time.monotonic()
        flag = contract.CHECKPOINT_NOW
        self.on_nodes(nodes, f"touch {flag}")
        self.event("checkpoint-now", nodes=[n.hostname for n in nodes])
        while time.monotonic() - t0 < self.plan.checkpoint_grace and os.path.exists(flag):
            if any(p.poll() is not None for p in self.procs) or self.stopping.is_set():
                break
            time.sleep(0.1)
        saved = not os.path.exists(flag)
        self.on_nodes(nodes, f"rm -f {flag}")
        self.phase(self.state["restarts"] + 1, "checkpoint", time.monotonic() - t0)
        if not saved:
            self.emit(f"[supervisor] no checkpoint confirmed within {self.plan.checkpoint_grace:g} s "
                      f"(rank 0 removes {flag} once saved): restarting from the last one")
        return time.monotonic() - t0

    def stop_attempt(self, grace: float = 10, lost: Collection[str] = ()) -> None:
        """End the attempt's processes: TERM, then KILL after grace seconds; then read their last
        lines. Not from a lost node's session: an ssh session over a master hands its output pipe
        to the master, which keeps it open until its keepalives give the link up (5 s and more)."""
        self.sampling.set()
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
        for node, pump in self.pumps:  # the attempt's last lines, before the event that ends it
            pump.join(0 if node in lost else 5)
        self.pumps = []

    def kill_leftovers(self, nodes: Sequence[runplan.PlanNode], attempt: int) -> None:
        """Ranks of the ended attempt that outlived their launcher (a rank orphaned on this
        node, one whose orted missed the end): every process whose environment says this
        attempt, on every node still there; and the attempt's flight-recorder files."""
        self.on_nodes(nodes, end_attempt_line(attempt))

    def quarantine(self, hostname: str, why: str, spare: bool = False) -> None:
        """A node out of this job for good: not watched, not used again; its container stopped
        where it still answers (its watchdog then removes it; one that does not answer is
        removed by its watchdog once the heartbeat stops)."""
        self.health.forget(hostname)
        self.state["quarantined"][hostname] = why
        if spare:
            self.state["spares"] = [h for h in self.state["spares"] if h != hostname]
            self.event("quarantined", node=hostname, reason=why, spare=True)
        node = next((n for n in (*self.plan.nodes, *self.plan.spares, *self.joined) if n.hostname == hostname), None)
        if node is not None and node is not self.me:  # unreachable now: the ssh gives up after its timeout
            subprocess.Popen(self.remote(node, "kill 1", mux=False), stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    # -- the job

    def run(self) -> int:
        nodes, spares = self.plan.nodes, self.plan.spares
        attempt = 0
        code = 0
        while True:
            self.state.update(restarts=attempt, nodes=[n.hostname for n in nodes], spares=[n.hostname for n in spares])
            self.event("running", attempt=attempt, nodes=[n.hostname for n in nodes], ranks=runplan.rank_map(nodes),
                       spares=[n.hostname for n in spares])
            t_start = time.monotonic()
            self.start(nodes, attempt)
            if attempt == 0:  # the heartbeat sessions once the job runs (HEARTBEAT_AFTER)
                threading.Thread(target=self.watch_later, args=((*nodes, *spares),), daemon=True).start()
                if self.plan.nccl_check not in ("", "off"):
                    threading.Thread(target=check_nccl, args=(self, nodes), daemon=True).start()
            else:
                self.watch_all((*nodes, *spares))  # where the first attempt ended before they opened
                threading.Thread(target=self._resumed, args=(t_start, attempt), daemon=True).start()
            end = self.watch(nodes, spares)
            spares = (*spares, *end.joined)
            if end.code != 0:
                self.watch_all((*nodes, *spares))  # which nodes are still there? asks them
            spares = tuple(s for s in spares if s.hostname not in end.spare_out)
            t_end = time.monotonic()
            code, out, step, why = judge(self, nodes, spares, end, attempt, t_end)
            if step != "restart":
                break
            nodes, spares = restart(self, nodes, spares, out, attempt, why, t_end)
            attempt += 1
        self.health.close()
        teardown(self, [*nodes, *spares])
        return code

    def watch_later(self, nodes: Sequence[runplan.PlanNode]) -> None:
        """watch_all once the first attempt printed a line, or HEARTBEAT_AFTER s after its start."""
        self.first_line.wait(HEARTBEAT_AFTER)
        self.watch_all(nodes)

    def watch_all(self, nodes: Sequence[runplan.PlanNode]) -> None:
        """Open every node's heartbeat session (Health.watch), once for the job: later calls, and
        any once the job is ending (Health.close), do nothing."""
        if self.watching.acquire(blocking=False):
            for n in nodes:
                if self.health.closed.is_set() or self.stopping.is_set():
                    break
                self.health.watch(n)

    def _resumed(self, t_start: float, attempt: int) -> None:
        """The restarted attempt's first line: the job runs again."""
        if self.first_line.wait(600) and self.state.get("restarts") == attempt:
            self.phase(attempt, "resumed", time.monotonic() - t_start)


# ---------------------------------------------------------------- an attempt's watch


def attempt_end(sup: "Supervisor", nodes: Sequence[runplan.PlanNode], spares: Sequence[runplan.PlanNode],
                spare_out: dict[str, str]) -> AttemptEnd | None:
    """One look at the attempt: how it ended, or None while it runs (spare_out: the spares
    lost so far, with why; those lost now are added and quarantined)."""
    codes = [p.poll() for p in sup.procs]
    failed = [c for c in codes if c not in (None, 0)]
    if failed or all(c == 0 for c in codes):
        return AttemptEnd(failed[0] if failed else 0, {}, spare_out)
    if sup.stopping.is_set():
        return AttemptEnd(143, {}, spare_out)
    if sup.write_error:
        return AttemptEnd(1, {}, spare_out)
    for h, why in sup.health.lost([s for s in spares if s.hostname not in spare_out]).items():
        spare_out[h] = why
        sup.quarantine(h, why, spare=True)
    out = sup.health.lost(nodes)
    if out:
        return AttemptEnd(1, out, spare_out)
    if sup.slow and len(spares) > len(spare_out):  # --replace-stragglers, a spare left
        return AttemptEnd(1, dict(sup.slow), spare_out)
    if sup.nccl_fatal is not None:
        return AttemptEnd(1, {}, spare_out, fatal=sup.nccl_fatal[0])
    if sup.hang is not None and (stall := sup.hang.stalled(time.monotonic())):
        return AttemptEnd(1, {}, spare_out, hung=on_hang(sup, nodes, stall))
    return None


def join_offered(sup: "Supervisor", nodes: Sequence[runplan.PlanNode], spares: Sequence[runplan.PlanNode]
                 ) -> list[runplan.PlanNode]:
    """The spares offered since the last look that the run does not know (runplan.merge_spares):
    each one's container learns the run's hostnames and theirs learn its (/etc/hosts: torchrun's
    rendezvous names node 1 by hostname), its heartbeat session opens, the `spare-joined`
    event says it. One refused is said in a line. Returns the joined ones."""
    with sup.lock:
        offered, sup.offered = sup.offered, []
    if not offered:
        return []
    merged, refused = runplan.merge_spares(nodes, spares, sup.state["quarantined"], offered)
    for h, why in refused.items():
        sup.emit(f"[supervisor] {h} not taken as a spare: {why}")
    new = list(merged[len(spares):])
    for n in new:
        have = (*nodes, *spares)
        add_hosts(sup, [m for m in have], hosts_lines([n]))
        add_hosts(sup, [n], hosts_lines(have))
        sup.joined.append(n)
        sup.state["spares"] = [*sup.state["spares"], n.hostname]
        sup.event("spare-joined", node=n.hostname, address=n.address, slots=n.slots, gpus=n.gpus)
        if not (sup.health.closed.is_set() or sup.stopping.is_set()):
            sup.health.watch(n)
        spares = (*spares, n)
    return new


def add_hosts(sup: "Supervisor", nodes: Sequence[runplan.PlanNode], text: str) -> None:
    """text appended to the /etc/hosts of each node's container (HOSTS in this one)."""
    if sup.me in nodes:
        try:
            with open(HOSTS, "a") as f:
                f.write(text)
        except OSError as e:
            sup.emit(f"[supervisor] cannot add to {HOSTS} on {sup.me.hostname}: {e.strerror or e}")
    sup.on_nodes([n for n in nodes if n is not sup.me], "cat >> /etc/hosts", stdin=text)


# ---------------------------------------------------------------- the restart policy


def judge(sup: "Supervisor", nodes: Sequence[runplan.PlanNode], spares: Sequence[runplan.PlanNode],
          end: AttemptEnd, attempt: int, t_end: float) -> tuple[int, dict[str, str], str, str]:
    """The ended attempt stopped (a leaving node's checkpoint first) and judged: (the job's exit
    code, the nodes out with why, the step: "restart", or "ended" once its final event is said,
    why). spares: those left after the attempt."""
    code, out = end.code, dict(end.out)
    if out:  # said at once: the detection, before the attempt's teardown
        for h in out:
            sup.phase(attempt + 1, "detection", sup.health.silent_for(h, t_end), node=h)
        sup.event("lost", nodes=out)
    said = set(out)
    leaving = [n for n in nodes if out.get(n.hostname, "").startswith(CHECKPOINT_FIRST)]
    if leaving and not sup.stopping.is_set():
        sup.checkpoint_now([n for n in nodes if n.hostname not in out or n in leaving])
    # A lost node stalls every collective: no rank can save anything more, and mpirun
    # waits for the lost node's daemon. Its ranks get LOST_GRACE, not the usual 10 s.
    sup.stop_attempt(grace=LOST_GRACE if out and not leaving else 1 if end.hung or end.fatal else 10,
                     lost=[h for h, why in out.items() if not why.startswith(CHECKPOINT_FIRST)])
    if sup.stopping.is_set():
        sup.event("failed", exit_code=code, reason="stopped: the launcher went away")
        return code, out, "ended", ""
    if sup.write_error:  # a full disk here: no restart writes more
        sup.event("failed", exit_code=1, reason=sup.write_error, at_fault=[sup.me.hostname])
        return 1, out, "ended", ""
    if end.fatal and sup.nccl_fatal is not None:  # a restart would pick the same network
        sup.event("failed", exit_code=1, reason=end.fatal, at_fault=sup.nccl_fatal[1])
        return 1, out, "ended", ""
    if code != 0 and not out:  # a rank failed: which nodes are still there? (a node gone
        # silent just now is judged within suspect_after + connect_timeout: wait that long)
        deadline = time.monotonic() + max(sup.plan.settle, sup.plan.suspect_after + sup.plan.connect_timeout + 0.5)
        while not out and time.monotonic() < deadline:
            time.sleep(0.1)
            out = sup.health.lost(nodes)
    if code != 0 and not out and not end.hung and launchers.get(sup.plan.run.launcher).flight_recorder:
        # a rank failed: a collective's timeout wrote each rank's flight recorder (NCCL)
        if fr := flight_recorder(sup, nodes, runplan.rank_map(nodes), only_found=True):
            sup.emit(f"[supervisor] {fr}")
    if sup.me.hostname in out and not out[sup.me.hostname].startswith(CHECKPOINT_FIRST):
        out.pop(sup.me.hostname)  # this node answers: it is running this
    if set(out) - said:
        sup.event("lost", nodes={h: why for h, why in out.items() if h not in said})
    step, why = next_step(nodes, spares, out, attempt, code, sup.plan.min_nodes, sup.plan.max_restarts,
                          cause=end.hung)
    if step == "succeeded":
        sup.event("succeeded", exit_code=0)
        return 0, out, "ended", why
    if step == "failed":
        sup.event("failed", exit_code=code or 1, reason=why, at_fault=sorted(out))
        return code or 1, out, "ended", why
    return code, out, "restart", why


def restart(sup: "Supervisor", nodes: Sequence[runplan.PlanNode], spares: Sequence[runplan.PlanNode],
            out: dict[str, str], attempt: int, why: str,
            t_end: float) -> tuple[Sequence[runplan.PlanNode], Sequence[runplan.PlanNode]]:
    """The nodes out swapped for spares (runplan.swap_out) or dropped, and quarantined; the
    ended attempt's leftover ranks killed; the `restart` event. Returns (nodes, spares) of the next."""
    t_swap = time.monotonic()
    nodes, spares, took = runplan.swap_out(nodes, spares, out)
    for h, why_out in out.items():
        sup.quarantine(h, why_out)
    for h, spare in took.items():
        sup.event("spare-in", node=spare, replaces=h)
    sup.kill_leftovers(nodes, attempt)
    sup.phase(attempt + 1, "teardown", time.monotonic() - t_end)
    if took:
        sup.phase(attempt + 1, "spare-in", time.monotonic() - t_swap, node=",".join(took.values()))
    sup.event("restart", attempt=attempt + 1, reason=why, dropped=sorted(set(out) - set(took)),
              replaced={h: s for h, s in took.items()}, ended_in=round(time.monotonic() - t_end, 1))
    return nodes, spares


def teardown(sup: "Supervisor", alive: Sequence[runplan.PlanNode]) -> None:
    """Stop every other container still reachable (each node's watchdog then removes it and
    the node's job files), then this one."""
    if sup.plan.keep_containers:
        return
    procs = [subprocess.Popen(sup.remote(n, "kill 1", mux=False), stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for n in alive if n is not sup.me]
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
    try:
        sup.log.flush()
    except OSError:
        pass  # a full disk: write_error said so
    os.kill(1, signal.SIGTERM)


# ---------------------------------------------------------------- the hang and straggler checks



def on_hang(sup: "Supervisor", nodes: Sequence[runplan.PlanNode], stall: progress.Stall) -> str:
    """Every process's Python stack of the attempt on every node (launch/node/stacks.sh in
    each container, all at once), the `hang` event naming the culprits from those stacks
    (launch/analysis/stacks.py: the ranks not waiting in a collective; by progress where every
    rank waits), then the stacks, node by node; the reason the attempt ends."""
    from dtrain.launch.analysis import stacks

    ranks = runplan.rank_map(nodes)
    fields = progress.event_fields(stall, ranks)
    script = contract.node_script("stacks.sh")
    args = ["bash", "-s", "--", runplan.RESTART_VAR, str(int(sup.state["restarts"]))]
    dumps: dict[str, list[str]] = {}

    def one(n: runplan.PlanNode) -> None:
        argv = [*args, n.hostname]
        if n is not sup.me:
            argv = sup.remote(n, shlex.join(argv), mux=False)
        try:
            r = subprocess.run(argv, input=script, capture_output=True, text=True, errors="replace", timeout=30)
            lines = r.stdout.splitlines()
            if r.returncode != 0:
                lines.append(f"[{n.hostname}] no stacks: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
        except subprocess.TimeoutExpired:
            lines = [f"[{n.hostname}] no stacks: the dump did not end within 30 s"]
        dumps[n.hostname] = lines

    # torchrun: its ranks' flight recorder (launch/jobs/flightrec.py), gathered beside the stacks
    fr = in_background(lambda: flight_recorder(sup, nodes, ranks)) \
        if launchers.get(sup.plan.run.launcher).flight_recorder else None
    threads = [threading.Thread(target=one, args=(n,)) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = [line for n in nodes for line in dumps.get(n.hostname, [])]
    fields.update(stacks.event_fields(stacks.of_dump(lines, len(ranks)), ranks))
    if fr is not None:  # never holds the hang line more than FR_AFTER_STACKS s past the stacks
        fields["flight_recorder"] = fr(FR_AFTER_STACKS) or flightrec_late()
    sup.event("hang", **fields)
    for line in lines:
        sup.emit(contract.STACK_LINE + line)
    named = stacks.culprit_text(fields, brief=True)
    if not named:
        who = ", ".join(f"r{r} ({h})" for r, h in zip(fields["ranks"], fields["nodes"])) or "none told apart"
        named = f"{stacks.fallback_text(fields)}: {who}"
    said = f"; {fields['flight_recorder']}" if fields.get("flight_recorder") else ""
    return f"hang: no rank made progress for {stall.silent_for} s; {named}{said}"


# s a node's round of --straggler-check may take: stacks.sh's reads, a Python-only one (5 s at most)
# then, for a blocked rank, its turn (NATIVE_WAIT: 2 s) and a native read (NATIVE_S: 8 s), and the
# ssh command's own time
SAMPLE_WAIT = 20
FR_AFTER_STACKS = 3.0  # s a hang line waits for the flight recorder's dumps once the stacks are read
FR_ASK_WAIT = 3  # s fr_dumps.sh waits for the dumps it asked a rank's debug pipe for


def in_background(fn: Callable[[], str]) -> Callable[[float], str | None]:
    """fn started in a thread of its own now; the function returned waits for its result at
    most the seconds it is given (None then: fn goes on alone, its result dropped)."""
    box: list[str] = []
    t = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    t.start()

    def result(wait: float) -> str | None:
        t.join(wait)
        return box[0] if box else None
    return result


def flightrec_late() -> str:
    from dtrain.launch.jobs import flightrec

    return flightrec.late(FR_AFTER_STACKS)


def flight_recorder(sup: "Supervisor", nodes: Sequence[runplan.PlanNode], ranks: Sequence[str],
                    only_found: bool = False) -> str:
    """Every container's flight-recorder dumps (launch/node/fr_dumps.sh: NCCL's asked for
    through their debug pipes, FR_ASK_WAIT s at most), read into which ranks did not enter the
    collective the others wait in (launch/jobs/flightrec.py), as the hang line says it;
    only_found: "" where no rank left a dump (a rank's failure: most are no collective's timeout)."""
    from dtrain.launch.jobs import flightrec

    script = contract.node_script("fr_dumps.sh")
    argv0 = ["bash", "-s", "--", f"{JOB_DIR}/{flightrec.PREFIX}", str(FR_ASK_WAIT)]
    out: dict[str, list[str]] = {}

    def one(n: runplan.PlanNode) -> None:
        argv = argv0 if n is sup.me else sup.remote(n, shlex.join(argv0))
        try:
            out[n.hostname] = subprocess.run(argv, input=script, capture_output=True, text=True,
                                             errors="replace", timeout=FR_ASK_WAIT + 10).stdout.splitlines()
        except (subprocess.TimeoutExpired, OSError):
            out[n.hostname] = []

    threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:  # the dumps come from the nodes: whatever they hold, the hang line and the restart go on
        dumps = flightrec.read_lines(line for n in nodes for line in out.get(n.hostname, []))
        if only_found and not dumps:
            return ""
        return flightrec.text(flightrec.behind(dumps), len(dumps), len(ranks), list(ranks))
    except Exception as e:  # noqa: BLE001
        return f"flight recorder: the ranks' dumps could not be read ({type(e).__name__})"


def sample_stragglers(sup: "Supervisor", nodes: Sequence[runplan.PlanNode], attempt: int, done: threading.Event) -> None:
    """--straggler-check: every `straggler_check` s, every rank's stack on every node at once
    (launch/node/stacks.sh over the multiplexed ssh), read into {rank: waiting in a collective}
    (straggler.ranks_waiting); each rank the verdict names (straggler.stragglers) is a
    `straggler` event, once per attempt, and in state.json's `stragglers` (dtrain status)."""
    from dtrain.launch.analysis import stacks, straggler

    interval = float(sup.plan.straggler_check or 0)
    history = straggler.History()
    named: set[int] = set()
    told: set[str] = set()  # the processes whose native frames could not be read, said once
    known: straggler.Known = {}  # native reads' verdicts by place: a settled place is read Python-only
    script = contract.node_script("stacks.sh")
    args = ["bash", "-s", "--", runplan.RESTART_VAR, str(int(attempt))]
    wait = interval
    while not done.wait(wait):
        t0 = time.monotonic()
        dumps: dict[str, list[str]] = {}

        def one(n: runplan.PlanNode) -> None:
            # no native read where Python shows the wait, nor where one was read before
            argv = [*args, n.hostname, "sample", stacks.SEEN_IN_PYTHON, straggler.known_places(known, n.hostname)]
            argv = argv if n is sup.me else sup.remote(n, shlex.join(argv))
            try:
                dumps[n.hostname] = subprocess.run(argv, input=script, capture_output=True, text=True,
                                                   errors="replace", timeout=max(SAMPLE_WAIT, 3 * interval)).stdout.splitlines()
            except subprocess.TimeoutExpired:
                dumps[n.hostname] = []

        threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if done.is_set():
            return
        lines = [line for n in nodes for line in dumps.get(n.hostname, [])]
        history.add(straggler.ranks_waiting(lines, known))
        known = straggler.learn(known, lines)
        for line in straggler.native_unread(lines, told):  # once per process: its C++ waits are not seen
            sup.emit(contract.STACK_LINE + line)
        where = straggler.ranks_of_dump(lines)
        # one round every interval on average, start to start, at a random phase: a fixed period
        # close to the step time would sample the same part of every step (aliasing)
        wait = max(0.05, interval * random.uniform(0.5, 1.5) - (time.monotonic() - t0))
        for s in history.verdict():
            if s.rank in named:
                continue
            named.add(s.rank)
            fields = straggler.event_fields(s, where.get(s.rank, "?"), interval)
            sup.state.setdefault("stragglers", {})[fields["node"]] = straggler.summary(fields)
            sup.save_state()
            sup.emit(EVENT + json.dumps({"event": "straggler", "attempt": attempt, **fields}))
            if sup.plan.replace_stragglers and fields["node"] != sup.me.hostname:  # it runs this
                sup.slow.setdefault(fields["node"], "straggler: " + straggler.summary(fields))


def check_nccl(sup: "Supervisor", nodes: Sequence[runplan.PlanNode]) -> None:
    """--nccl-check, on the first attempt: every container's NCCL debug files (one per rank,
    the plan's nccl_check gave the ranks NCCL_DEBUG_FILE) read by launch/node/nccl_net.sh
    once a rank said which network it uses (at most nccl_net.WAIT_S after the start), judged
    against what each node has (nccl_net.judge_node); one `nccl-net` event, and in
    state.json. A mismatch where it fails (nccl_net.fails: `fail`, or `auto` on a node that
    should use EFA) ends the job, naming the node, NCCL's choice, what was expected and the fix."""
    from dtrain.launch.jobs import nccl_net

    script = contract.node_script("nccl_net.sh")
    args = ["bash", "-s", "--", JOB_DIR, str(nccl_net.WAIT_S), *nccl_net.RANK_VARS]
    said: dict[str, str] = {}

    def one(n: runplan.PlanNode) -> None:
        argv = args if n is sup.me else sup.remote(n, shlex.join(args))
        try:
            said[n.hostname] = subprocess.run(argv, input=script, capture_output=True, text=True, errors="replace",
                                              timeout=nccl_net.WAIT_S + 30).stdout
        except (subprocess.TimeoutExpired, OSError):
            said[n.hostname] = ""

    threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if sup.state.get("restarts") != 0 or sup.stopping.is_set():
        return  # the first attempt ended meanwhile: its check says nothing of the next
    fields, bad = nccl_net.event_fields(sup.plan.nccl_check, {n.hostname: said.get(n.hostname, "") for n in nodes},
                                        dict(sup.plan.efa_types))
    sup.state["nccl"] = nccl_net.summary(fields)
    sup.save_state()
    sup.emit(EVENT + json.dumps({"event": "nccl-net", **fields}))
    sup.emit_all([contract.STACK_LINE + w for w in nccl_net.warnings(said)])  # shown as they are
    if bad:
        sup.nccl_fatal = (nccl_net.failure(fields, bad), bad)


def _watch_stdin(sup: Supervisor, silence: float | None) -> None:
    """Foreground: the launcher holds our stdin open and writes a line every few seconds; EOF
    (kill -9), or nothing for `silence` seconds (a lost link this node's sshd never notices),
    means it went away: the job stops, as a foreground job does when its terminal closes. A
    line that offers a spare (runplan.SPARE_LINE) goes to the watch (Supervisor.offer)."""
    fd = sys.stdin.fileno()
    pending = b""
    try:
        while select.select([fd], [], [], silence)[0] and (chunk := os.read(fd, 4096)):
            *lines, pending = (pending + chunk).split(b"\n")
            pending = pending[-65536:]  # a line that long is no offer: the rest of it is dropped
            for line in lines:
                if line.startswith(runplan.SPARE_LINE.encode()):
                    try:
                        sup.offer(runplan.parse_spare_line(line.decode("utf-8", "replace")))
                    except ValueError as e:
                        sup.emit(f"[supervisor] a spare the launcher offered is not one: {e}")
    except (OSError, ValueError):
        pass
    sup.stopping.set()


def ready_code() -> int:
    """Where this program started beside the readiness check (launch/node/run.sh --ready-beside:
    python's start overlaps the handshakes), that check's exit code once it ends (0: every
    node's sshd answered), read from its pipe; its process is reaped. 0 where there is none."""
    fd = os.environ.pop("DTRAIN_READY_FD", "")
    pid = os.environ.pop("DTRAIN_READY_PID", "")
    if not fd.isdigit():
        return 0
    said = b""
    while not said.endswith(b"\n") and (chunk := os.read(int(fd), 64)):
        said += chunk
    os.close(int(fd))
    if pid.isdigit():
        try:
            os.waitpid(int(pid), 0)
        except ChildProcessError:
            pass
    return int(said) if said.strip().isdigit() else contract.READY_FAILED


def torch_version() -> str | None:
    """The torch installed beside this Python (the job's image: every container runs the same),
    from its metadata, without importing it (milliseconds, while the readiness check runs)."""
    from importlib import metadata

    try:
        return metadata.version("torch")
    except (metadata.PackageNotFoundError, ValueError, OSError):
        return None


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: supervise.py PLAN.json", file=sys.stderr)
        return 2
    path = Path(argv[1])
    plan = runplan.RunPlan.from_json(json.loads(path.read_text()))
    if "TORCH_FR_BUFFER_SIZE" in dict(plan.run.extra_env):  # dtrain's flight recorder, as this image's torch names it
        from dtrain.launch.jobs import flightrec

        plan = replace(plan, run=replace(plan.run, extra_env=flightrec.for_torch(plan.run.extra_env, torch_version())))
    if code := ready_code():  # a node's sshd did not answer: the check named it on stderr
        return code
    sup = Supervisor(plan, path.parent)
    if plan.attached:
        silence = plan.launcher_silence
        threading.Thread(target=_watch_stdin, args=(sup, float(silence) if silence else None), daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: sup.stopping.set())
    return sup.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
