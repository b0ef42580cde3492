"""The launcher's side of the job supervisor (launch/node/supervise.py, in the first container).

`plan` writes down what the supervisor runs: the launcher command apart from its nodes (the
supervisor builds each attempt's with the same builder, sent with it: builder_files), the
nodes, the restart policy and how to reach each node's container. The
supervisor's output is the job's own lines plus `dtrain-supervisor {json}` events; `Render`
turns both into what a user reads (`[node-2 r3] text`, `[launch] restart 1: ...`), for a
foreground job as it runs and for `dtrain logs` of a detached one. Pure, but for nothing.
"""

from __future__ import annotations

import functools
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from dtrain import contract
from dtrain.shipped import shipped_modules
from dtrain.launch.jobs import events, launchers, nccl_net, output, runplan
from dtrain.launch.analysis import stacks
from dtrain.launch.analysis import straggler
from dtrain.launch.analysis import timeline
from dtrain.launch.analysis.timeline import event_of, parse_event
from dtrain.terminal import clean

EVENT = contract.SUPERVISOR_EVENT
EC2_IMDS = "http://169.254.169.254"  # where each EC2 node reads its spot interruption notice
CONTAINER_JOB_DIR = contract.CONTAINER_JOB_DIR
FINAL = ("succeeded", "failed")
LAUNCHER_BEAT_S = 5  # an attached launcher writes a line to its supervisor's stdin this often
LAUNCHER_SILENCE_S = 30  # the supervisor stops an attached job after this long without one
NODE_LINE = re.compile(r"^\[([A-Za-z0-9._-]+)\] (.*)$")  # torchrun lines, as the supervisor tags them


@dataclass(frozen=True)
class Policy:
    max_restarts: int = 0
    min_nodes: int = 1
    hang_timeout: float | None = None  # --hang-timeout: no rank's progress for this long ends the attempt
    progress_pattern: str = ""  # --progress-pattern: what counts as progress ("": any line of a rank)
    straggler_check: float | None = None  # --straggler-check: every rank's stack sampled this often
    replace_stragglers: bool = False  # --replace-stragglers: a straggler swapped for a spare at a checkpoint


def plan(run: runplan.LaunchCommand, nodes: Sequence[runplan.PlanNode], *, ssh: Sequence[str],
         policy: Policy = Policy(), spares: Sequence[runplan.PlanNode] = (),
         quarantined: Mapping[str, str] | None = None, attached: bool = True, node_prefix: Sequence[str] = (),
         node_dir: str = "") -> runplan.RunPlan:
    """The supervisor's plan (plan.json on the first node). run: the launcher command apart from
    its nodes, which the supervisor builds for each attempt's nodes (launchers.attempt_argv);
    nodes: in rank order, the first being where the supervisor runs; spares: ready, no rank,
    swapped in for a lost one; quarantined: {hostname: why} taken out before the start;
    node_prefix: what runs a per-node command in its container (torchrun: launch/node/run.sh and
    its options); node_dir: the job's directory on the first node (what an error about its
    files names). No --env value is in it: names only."""
    if policy.min_nodes > len(nodes):
        raise ValueError(f"plan: --min-nodes {policy.min_nodes} > {len(nodes)} nodes")
    launchers.attempt_argv(run, nodes)  # a programming mistake fails here, not on the node
    return runplan.RunPlan(run=run, nodes=tuple(nodes), spares=tuple(spares),
                            quarantined=tuple((quarantined or {}).items()), ssh=tuple(ssh),
                            node_prefix=tuple(node_prefix), max_restarts=policy.max_restarts,
                            min_nodes=policy.min_nodes, attached=attached, launcher_silence=LAUNCHER_SILENCE_S,
                            node_dir=node_dir, hang_timeout=policy.hang_timeout,
                            progress_pattern=policy.progress_pattern, straggler_check=policy.straggler_check,
                            replace_stragglers=policy.replace_stragglers)


# The launcher's dtrain modules the supervisor imports (contract, values, the command builders,
# hang detection), and the modules those import, at any depth: read from launch/node/supervise.py's
# import statements (ast), so a new import is sent too. Sent beside it (builders.json), so every
# attempt's command is this launcher's, whatever dtrain the image holds.
# launch/node/ programs the supervisor runs in the containers (contract.node_script reads them
# there from beside the builders), so an image older than this launcher runs this one's.
SUPERVISOR_NODE_PROGRAMS = ("stacks.sh", "nccl_net.sh", "fr_dumps.sh")


def builder_files() -> dict[str, str]:
    """The supervisor's modules (shipped_modules of launch/node/supervise.py) and
    SUPERVISOR_NODE_PROGRAMS: {path under the import root: text}, read from this dtrain (its
    files found, not imported: this launcher runs few of them)."""
    import importlib.util

    out = {}
    for rel in shipped_modules(contract.NODE_SCRIPTS / "supervise.py"):
        name = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        out[rel] = Path(importlib.util.find_spec(name).origin).read_text()
    for script in SUPERVISOR_NODE_PROGRAMS:
        out[f"dtrain/launch/node/{script}"] = contract.node_script(script)
    return out


@functools.cache
def supervisor_texts() -> tuple[str, str]:
    """(launch/node/supervise.py, builder_files as JSON): what goes beside each launch's plan to
    the first node, read once a process. A launch reads them while its nodes answer the first
    round (Job.prepare), not between its containers and its supervisor (~5 ms of reading files
    and their import statements)."""
    return contract.node_script("supervise.py"), json.dumps(builder_files())


def describe(ev: dict) -> str:
    """One line for a user, for each event."""
    name = ev["event"]
    if name == "running":
        what = "started" if not ev.get("attempt") else f"restarted (attempt {ev['attempt']})"
        spares = f"; spare(s) {', '.join(ev['spares'])}" if ev.get("spares") else ""
        return f"[launch] job {what} on {len(ev.get('nodes', []))} node(s): {', '.join(ev.get('nodes', []))}{spares}"
    if name == "lost":
        return "[launch] lost " + "; ".join(f"{h}: {why}" for h, why in ev.get("nodes", {}).items())
    if name == "restart":
        took = f" (the attempt ended in {ev['ended_in']} s)" if "ended_in" in ev else ""
        swapped = [f"{h} replaced by spare {s}" for h, s in (ev.get("replaced") or {}).items()]
        dropped = [f"dropped {', '.join(ev['dropped'])}"] if ev.get("dropped") else []
        return (f"[launch] restart {ev.get('attempt')}: {ev.get('reason')}; "
                f"{'; '.join(swapped + dropped) or 'same nodes'}{took}")
    if name == "spare-in":
        return f"[launch] spare {ev.get('node')} in for {ev.get('replaces')} (quarantined: not used again by this job)"
    if name == "quarantined":
        return f"[launch] spare {ev.get('node')} out: {ev.get('reason')} (quarantined)"
    if name == "spare-joined":
        at = f" ({ev['address']})" if ev.get("address") else ""
        return f"[launch] spare {ev.get('node')}{at} joined: it takes the place of a node lost from now on"
    if name == "checkpoint-now":
        return (f"[launch] spot notice: the job is asked to checkpoint now ({contract.CHECKPOINT_NOW_VAR}) "
                f"on {', '.join(ev.get('nodes', []))}")
    if name == "phase":
        where = f" {ev['node']}" if ev.get("node") else ""
        return f"[launch] restart {ev.get('restart')}: {ev.get('phase')}{where} {ev.get('seconds')} s"
    if name == "hang":
        return "[launch] " + hang_line(ev)
    if name == "straggler":
        return "[launch] " + straggler.line(ev)
    if name == "nccl-net":
        return "[launch] " + nccl_net.event_line(ev)
    if name == "succeeded":
        return "[launch] job succeeded"
    if name == "failed":
        return f"[launch] job failed (exit {ev.get('exit_code')}): {ev.get('reason', '')}".rstrip(": ")
    return f"[launch] {name}"


def hang_line(ev: dict) -> str:
    """A `hang` event ({silent_for, ranks, nodes, ago, steps} and the stacks' verdict:
    culprits, waiting, unread: launch/analysis/stacks.py) as one line: the ranks the stacks name,
    or, where they name none (or an older supervisor sent no verdict), the ranks behind by
    progress."""
    head = f"hang: no rank made progress for {ev.get('silent_for')} s (--hang-timeout); "
    tail = "; every rank's Python stack follows"
    named = stacks.culprit_text(ev)
    fr = f"; {ev['flight_recorder']}" if ev.get("flight_recorder") else ""  # torchrun: launch/jobs/flightrec.py
    if named:
        return head + named + fr + tail
    nodes, ago, steps = ev.get("nodes", []), ev.get("ago", {}), ev.get("steps", {})
    who = ", ".join(f"r{r} on {n} (last progress {ago.get(str(r), '?')} s ago, {steps.get(str(r), 0)} line(s))"
                    for r, n in zip(ev.get("ranks", []), nodes))
    said = stacks.fallback_text(ev) if "culprits" in ev else "behind"
    return head + f"{said}: {who or 'none told apart'}" + fr + tail


@dataclass
class Render:
    """Supervisor output -> lines for a user. mpirun's tagged chunks are reassembled per rank
    (MpiOutput), torchrun's local ranks become global ones, events become [launch] lines.

    The timeline (launch/analysis/timeline.py): `phase` events (the readiness check's, a restart's)
    and each node's first line of the job (its `first-step`, timed from the `running` event of
    the first attempt) go to on_phase as entries, times after t0 (the launch's start, epoch);
    names: a hostname or address -> the node's host (the timeline's rows)."""

    launcher: str
    first: str  # the first node's hostname: where untagged mpirun lines come from
    ranks: list[str] = field(default_factory=list)
    final: dict | None = None
    quarantined: dict[str, str] = field(default_factory=dict)  # nodes out of the job for good, and why
    stragglers: dict[str, str] = field(default_factory=dict)  # node -> the straggler named there (straggler.summary)
    _lost: dict[str, str] = field(default_factory=dict)
    _mpi: object = None
    t0: float = 0.0
    names: Mapping[str, str] = field(default_factory=dict)
    on_phase: Callable[[timeline.Entry], None] | None = None
    clock: Callable[[], float] = time.time
    _attempt_no: int = -1  # the latest `running` event's attempt
    _restarts: int = 0  # the latest `restart` event's
    _running_at: float | None = None  # when the first attempt's `running` event came
    _stepped: set = field(default_factory=set)  # hostnames whose first step is in

    def _phase(self, entry: timeline.Entry | None) -> None:
        if entry is not None and self.on_phase is not None:
            self.on_phase(entry)

    def _first_steps(self, shown: list[str]) -> None:
        """A node's first line of the first attempt: its first step."""
        if self._running_at is None or self._attempt_no != 0 or self.on_phase is None:
            return
        for line in shown:
            m = output.RANK_LINE.match(line)
            if m and m.group(1) not in self._stepped:
                self._stepped.add(m.group(1))
                host = self.names.get(m.group(1), m.group(1))
                self._phase(timeline.Entry(host, "first-step", round(self._running_at - self.t0, 3),
                                           round(max(self.clock() - self._running_at, 0.0), 3)))

    def _event(self, ev: dict) -> None:
        """What the timeline takes from an event."""
        if ev["event"] == "running":
            self._attempt_no = int(ev.get("attempt") or 0)
            if self._attempt_no == 0:
                self._running_at = self.clock()
        elif ev["event"] == "restart":
            self._restarts = int(ev.get("attempt") or 0)
        elif ev["event"] == contract.PHASE_EVENT:
            self._phase(timeline.from_event(ev, t0=self.t0, now=self.clock(), names=self.names,
                                            restart=timeline.restart_of(ev, self._attempt_no, self._restarts)))

    def _attempt(self, ranks: list[str]) -> None:
        from dtrain.launch.jobs.output import MpiOutput

        self.ranks = ranks
        self._mpi = MpiOutput(ranks, self.first)

    def feed(self, line: str) -> list[str]:
        """The lines a user reads for one line of the supervisor's output, without terminal
        control (dtrain/terminal.py; a job's own colours kept)."""
        shown = [clean(s, colour=True) for s in self._feed(line)]
        self._first_steps(shown)
        return shown

    def _feed(self, line: str) -> list[str]:
        if line.startswith(contract.STACK_LINE):  # a hang's stack dump: already `[node rN] ...`
            return [line[len(contract.STACK_LINE):]]
        try:
            ev = event_of(line)
        except events.BadEvent as e:  # forged or garbled: skipped, said once
            return self._flush() + [events.problem(str(e))]
        if ev is not None:
            out = self._flush()
            self._event(ev)
            if ev["event"] == contract.PHASE_EVENT and ev.get("phase") in contract.LAUNCH_PHASES:
                return out  # the launch's own (run.sh --ready): the log shows them as a table
            if ev["event"] == "running":
                self._attempt(list(ev.get("ranks", [])))
            if ev["event"] == "lost":
                self._lost = dict(ev.get("nodes") or {})
            if ev["event"] == "restart":
                taken = [*(ev.get("replaced") or {}), *(ev.get("dropped") or [])]
                self.quarantined.update({h: self._lost.get(h, "taken out") for h in taken})
            if ev["event"] == "quarantined":
                self.quarantined[str(ev.get("node"))] = str(ev.get("reason", ""))
            if ev["event"] == "straggler":
                self.stragglers[str(ev.get("node"))] = straggler.summary(ev)
            if ev["event"] in FINAL:
                self.final = ev
            return out + [clean(describe(ev))]
        reader = launchers.get(self.launcher).output.reader  # how its lines name their rank
        if reader != "mpi-tags":  # the supervisor tags each node's lines (a per-node command's)
            m = NODE_LINE.match(line)
            if m and m.group(1) in self.ranks:
                from dtrain.launch.jobs.output import prefix_line

                if reader != "node-lines":  # no rank in them: the node only
                    return [f"[{m.group(1)}] {m.group(2)}"]
                return [prefix_line(m.group(2), default_node=m.group(1), torch_base=self.ranks.index(m.group(1)))]
            return [f"[{self.first}] {line}"]
        if self._mpi is None:
            self._attempt(self.ranks)
        return self._mpi.feed(line)

    def flush(self) -> list[str]:
        shown = [clean(s, colour=True) for s in self._flush()]
        self._first_steps(shown)
        return shown

    def _flush(self) -> list[str]:
        return self._mpi.flush() if self._mpi is not None else []

    @property
    def exit_code(self) -> int | None:
        return None if self.final is None else int(self.final.get("exit_code") or 0)
