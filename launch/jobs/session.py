"""The attached-supervisor session: the job under its supervisor in the first node's container
(launch/node/supervise.py, started by launch/node/host/supervise.sh). `supervisor_plan` writes
down what the supervisor runs; `Session.run` sends it with the supervisor's program, then reads the
supervisor's output (attached: until the job ends; detached: until it runs) into the job's
output (launch/jobs/sink.py) and the launch's timeline, and says how it ended (Outcome).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

from dtrain import contract
from dtrain.contract import container_name
from dtrain.launch.analysis import timeline
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import container, flightrec, launchers, nccl_net, node_programs, output, runplan, store, supervision
from dtrain.launch.jobs.commands import (READY_FAILED, counted_text, nccl_mode, node_names, ready_error,
                                        run_script_argv, split_spares, supervisor_argv)
from dtrain.launch.jobs.launchers import launch_command, plan_nodes
from dtrain.launch.jobs.launchers.base import Launcher
from dtrain.launch.jobs.sink import Sink
from dtrain.launch.jobs.spec import JobSpec, NodeFacts, Started
from dtrain.launch.remote.fanout import SSH_FAILURE
from dtrain.launch.remote.hosts import Node
from dtrain.launch.remote.transport import SshTransport

# What makes nodes that come while an attached job runs its spares (launch/jobs/job.py joiner_of):
# called in a thread with offer (a PlanNode to the supervisor) and the event set when the job ends.
Joiner = Callable[[Callable[[runplan.PlanNode], None], threading.Event], None]

SSH_SAID = re.compile(r"^(Timeout, server .* not responding|Connection to .* closed|ssh: |client_loop: |"
                      r"Shared connection to |packet_write_wait: )")  # ssh's own lines about its link


@dataclass(frozen=True)
class Outcome:
    """How the session ended: the job's exit code (124: --job-timeout), and whether the job
    runs on, detached (the nodes supervise it alone)."""

    code: int
    detached: bool = False


class LinkLost(LaunchError):
    """The ssh session to the first node ended on its own; `node`: that node (gone or
    unreachable: teardown does not wait on it)."""

    def __init__(self, message: str, node: Node):
        super().__init__(message)
        self.node = node


def supervisor_plan(spec: JobSpec, launcher: Launcher, started: Started, node_dirs: Mapping[str, str], ompi: int,
                    quarantined: dict[str, str] | None = None) -> runplan.RunPlan:
    """What the supervisor runs (plan.json): the launcher command apart from its nodes, the
    nodes (the last `--spares` of them ready, with no rank) and the restart policy; it builds
    each attempt's command from them (launchers.attempt_argv), the first one as the launch
    shows it. A per-node command (torchrun) runs in its container through
    launch/node/run.sh: the job's --env values from its file. quarantined: nodes taken out
    before the start ({host: why}; a spare takes each one's place). node_dirs: host -> the
    job's directory there (the plan names the first node's)."""
    ranks, spares = (plan_nodes(f) for f in split_spares(started.facts, spec.spares))
    if quarantined:
        ranks, spares, _ = runplan.swap_out(ranks, spares, quarantined)
    policy = supervision.Policy(spec.restarts, spec.min_nodes or len(ranks), hang_timeout=spec.hang_timeout,
                                progress_pattern=spec.progress_pattern, straggler_check=spec.straggler_check,
                                replace_stragglers=spec.replace_stragglers)
    live = [f for f in started.facts if f.hostname not in (quarantined or {})]
    prefix = run_script_argv(spec, live, [], ready=False, fill_hosts=True) if launcher.per_node else []
    first = next(f.node.host for f in started.facts if f.hostname == ranks[0].hostname)
    node_dir = node_dirs.get(first, "")
    run = launch_command(spec, ompi, started.subnet)
    check, _ = nccl_mode(spec, started.facts)
    if check != "off":  # every rank's NCCL writes its INIT/NET lines to a file of the node's job dir
        run = replace(run, extra_env=run.extra_env + nccl_net.debug_env(supervision.CONTAINER_JOB_DIR))
    if launcher.flight_recorder and not set(spec.env) & set(flightrec.USER_VARS):  # the hang's flight recorder
        run = replace(run, extra_env=run.extra_env + flightrec.env(supervision.CONTAINER_JOB_DIR))
    plan = supervision.plan(run, ranks, spares=spares,
                            quarantined=quarantined, ssh=container.supervisor_ssh(),
                            policy=policy, attached=not spec.detach, node_prefix=prefix, node_dir=node_dir)
    return replace(plan, nccl_check=check, efa_types=spec.efa_types) if check != "off" else plan


class Session:
    """One supervised run of a started job. stop: the launch's teardown (--job-timeout calls it
    from a timer); closing: whether the launch is being torn down already."""

    def __init__(self, spec: JobSpec, launcher: Launcher, ssh: SshTransport, say: Callable[[str], None], sink: Sink,
                 stop: Callable[[], None], closing: Callable[[], bool], joiner: Joiner | None = None) -> None:
        self.spec, self.launcher, self.ssh, self.say, self.sink = spec, launcher, ssh, say, sink
        self.stop, self.closing = stop, closing
        self.joiner = joiner  # attached: run in a thread while the job runs, offering spares (joining.py)

    def run(self, started: Started, node_dirs: Mapping[str, str], ompi: int,
            quarantined: dict[str, str] | None = None, rec: timeline.Recorder | None = None) -> Outcome:
        """The job under its supervisor in the first container (launch/node/supervise.py, started
        by launch/node/host/supervise.sh): attached, its output streams here until it ends;
        detached (--detach), this returns once the job runs, and the nodes supervise it alone.
        quarantined: nodes the network gate left out (spares take their places). rec: the
        launch's timeline so far; the readiness check's and the supervisor's phases join it (each
        node's first step, a restart's phases), and the log shows it as a table once every node
        made its first step (or the output ends before)."""
        plan = supervisor_plan(self.spec, self.launcher, started, node_dirs, ompi, quarantined)
        if why := nccl_mode(self.spec, started.facts)[1]:
            self.say(f"[launch] NCCL network check off: {why}")
        facts = [f for f in started.facts if f.hostname not in (quarantined or {})]  # the gate's left out
        first = next(f for f in facts if f.hostname == plan.nodes[0].hostname)  # a spare, where the gate took node 1
        rec = rec or timeline.Recorder(time.time())
        store.record(self.spec.name, state="running", ranks=runplan.rank_map(plan.nodes), first=first.node.host,
                     node_names=node_names(facts))
        # the first attempt's command, rank_output.py's name in it, not its text
        shown = runplan.shown_argv(launchers.attempt_argv(plan.run, plan.nodes)[0], plan.run.rank_output)
        spares = f", spares {', '.join(n.hostname for n in plan.spares)}" if plan.spares else ""
        self.say(f"[launch] {self.launcher.name} on {first.hostname}, supervised there"
                 + (f" (up to {plan.max_restarts} restart(s) on at least {plan.min_nodes} node(s){spares})"
                    if plan.max_restarts else spares) + f": {shlex.join(shown)}")
        job_dir = supervision.CONTAINER_JOB_DIR
        sup = supervisor_argv(job_dir, self.spec.detach)
        # ready: the supervisor reaches every container's sshd (mpirun's daemons; torchrun on
        # each node; its health probes), so their sshd answers first, whatever the launcher; its
        # own node's only where the launcher goes there by ssh too (mpirun does not: no handshake).
        # attached: python starts beside the check (detached, the node's program waits for the
        # supervisor's first event, which a failed check would never give: the check first)
        inner = run_script_argv(self.spec, facts, sup, ready=True, fill_hosts=True,
                                ready_skip="" if self.launcher.ssh_here else first.address,
                                ready_beside=not self.spec.detach)
        if started.standby == first.node.host:  # its container waits for run.sh's argv (standby.sh)
            mode = "standby"
        else:  # attached, docker exec -i: stdin's end stops the job
            mode = "detach" if self.spec.detach else "attach"
            inner = ["docker", "exec", *([] if self.spec.detach else ["-i"]), container_name(self.spec.name), *inner]
        argv = self.ssh.argv(first.node, node_programs.host_argv("supervise", node_dirs[first.node.host], mode, *inner))
        program, builders = supervision.supervisor_texts()
        payload = counted_text((program, json.dumps(plan.to_json()), builders))
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", start_new_session=True)
        assert proc.stdin and proc.stdout
        proc.stdin.write(payload)
        proc.stdin.flush()
        if self.spec.detach:
            proc.stdin.close()
        timer = None
        timed_out = threading.Event()
        if self.spec.job_timeout:
            def expire() -> None:
                timed_out.set()
                self.say(f"[launch] job timed out after {self.spec.job_timeout:g} s")
                self.stop()
            timer = threading.Timer(self.spec.job_timeout, expire)
            timer.daemon = True
            timer.start()
        on_phase, show_timeline = self._timeline_sink(rec, facts, [n.hostname for n in plan.nodes])
        render = supervision.Render(self.launcher.name, first.hostname, t0=rec.t0, names=node_names(facts),
                                    on_phase=on_phase, quarantined=dict(quarantined or {}))
        ready_lines: list[str] = []
        last = ""  # ssh's own last word, where the link to the first node is lost
        to_supervisor = _Lines(proc.stdin)  # the beats and the spares offered: whole lines, one writer at a time
        no_more = threading.Event()  # the job ended: no spare is offered any more
        if not self.spec.detach:  # the supervisor stops the job when these stop (a lost link)
            threading.Thread(target=_beat, args=(to_supervisor,), name="dtrain-beat", daemon=True).start()
            if self.joiner is not None:
                joiner = self.joiner
                threading.Thread(target=lambda: joiner(lambda n: to_supervisor.write(runplan.spare_line(n)), no_more),
                                 name="dtrain-join", daemon=True).start()
        try:
            for lines in output.read_lines(proc.stdout.buffer.read1):  # what each read brought, at once
                with self.sink.batched():
                    for line in lines:
                        if SSH_SAID.match(line):
                            last = line.strip()
                        if line.startswith(contract.READY_SAYS):
                            ready_lines.append(line)
                            continue
                        seen, slow = len(render.quarantined), len(render.stragglers)
                        for shown in render.feed(line):
                            self.sink.emit(shown)
                        if len(render.quarantined) != seen:  # `dtrain status` says which nodes are out, and why
                            store.record(self.spec.name, quarantined=dict(render.quarantined))
                        if len(render.stragglers) != slow:  # ... and which are stragglers
                            store.record(self.spec.name, stragglers=dict(render.stragglers))
            for shown in render.flush():
                self.sink.emit(shown)
            show_timeline()  # where not every node made a first step (or detached: none yet)
            proc.wait()
        finally:
            no_more.set()
            if timer:
                timer.cancel()
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            if not self.spec.detach:
                try:
                    proc.stdin.close()
                except OSError:
                    pass  # a beat left unsent to a session that ended
        if timed_out.is_set():
            return Outcome(124)
        final = render.final
        if proc.returncode == READY_FAILED and ready_lines and final is None:
            raise LaunchError(ready_error("\n".join(ready_lines), None))
        if final is None and proc.returncode == SSH_FAILURE and not self.closing():
            raise LinkLost(lost_link_error(first, last, self.spec), first.node)
        if self.spec.detach:
            if final is not None or proc.returncode != 0:
                return Outcome(render.exit_code or proc.returncode or 1)
            n = self.spec.name
            self.say(f"[launch] job {n} detached: it runs on the nodes, supervised from {first.hostname}.\n"
                     f"  follow: dtrain logs --job {n} --follow\n  state:  dtrain status\n"
                     f"  stop:   dtrain stop --job {n}")
            return Outcome(0, detached=True)
        if final is None:
            return Outcome(proc.returncode or 1)
        store.record(self.spec.name, final=final)
        return Outcome(render.exit_code or 0)

    def _timeline_sink(self, rec: timeline.Recorder, facts: Sequence[NodeFacts],
                       ranked: Sequence[str]) -> tuple[Callable[[timeline.Entry], None], Callable[[], None]]:
        """(on_phase, show): on_phase adds an entry to rec; once every node of `ranked`
        (hostnames: the nodes that run a rank) made its first step, the timeline goes into the
        log as a table (show does it now, where it has not yet); a restart's phases go into the
        job's record as they come."""
        names = node_names(facts)
        hosts = [f.node.host for f in facts]
        ranked = [names.get(h, h) for h in ranked]
        shown = threading.Event()

        def show() -> None:
            if not shown.is_set():
                shown.set()
                for line in timeline.log_lines(rec.entries(), hosts):
                    self.sink.emit(line)
                store.record(self.spec.name, timeline=timeline.to_json(rec.entries()))

        def on_phase(entry: timeline.Entry) -> None:
            rec.add([entry])
            if entry.restart:
                store.record(self.spec.name, timeline=timeline.to_json(rec.entries()))
            elif timeline.complete(rec.entries(), ranked):
                show()

        return on_phase, show


class _Lines:
    """The supervisor's stdin, written a whole line at a time from any thread."""

    def __init__(self, stdin) -> None:
        self.stdin = stdin
        self.lock = threading.Lock()

    def write(self, text: str) -> bool:
        """False once the pipe is closed (the job ended)."""
        with self.lock:
            try:
                self.stdin.write(text)
                self.stdin.flush()
                return True
            except (OSError, ValueError):
                return False


def _beat(to_supervisor: _Lines) -> None:
    """An attached job's supervisor hears from its launcher: a line on its stdin every
    supervision.LAUNCHER_BEAT_S seconds until the pipe closes (the supervisor ends the job after
    supervision.LAUNCHER_SILENCE_S without one: a link lost the node's sshd never notices)."""
    while True:
        time.sleep(supervision.LAUNCHER_BEAT_S)
        if not to_supervisor.write("\n"):
            return


def lost_link_error(first: NodeFacts, last: str, spec: JobSpec) -> str:
    """The ssh session to the job's first node (its supervisor's output) ended on its own: the
    link or the node is gone. What happens to the job there, and to what it left."""
    said = f" ({last})" if last else ""
    if spec.detach:
        return (f"lost the connection to {first.node.host} ({first.hostname}), the job's first node, while "
                f"starting job {spec.name}{said}; it may still run there: dtrain status, dtrain stop --job {spec.name}")
    return (f"lost the connection to {first.node.host} ({first.hostname}), the job's first node, where its "
            f"supervisor runs{said}: the supervisor stops the job once it sees the launcher gone, and each "
            f"node's watchdog removes the job's container and files there within {spec.heartbeat_timeout} s "
            f"of its last heartbeat")
