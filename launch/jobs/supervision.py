"""The launcher's side of the job supervisor (launch/node/supervise.py, in the first container).

`plan` writes down what the supervisor runs: the launcher command for every node, made here
by the command builders, the restart policy and how to reach each node's container. The
supervisor's output is the job's own lines plus `dtrain-supervisor {json}` events; `Render`
turns both into what a user reads (`[node-2 r3] text`, `[launch] restart 1: ...`), for a
foreground job as it runs and for `dtrain logs` of a detached one. Pure, but for nothing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Sequence

from dtrain import contract

EVENT = "dtrain-supervisor "
EC2_IMDS = "http://169.254.169.254"  # where each EC2 node reads its spot interruption notice
CONTAINER_JOB_DIR = "/dtrain-job"  # the node's job directory in every container (supervise.JOB_DIR)
FINAL = ("succeeded", "failed")
LAUNCHER_BEAT_S = 5  # an attached launcher writes a line to its supervisor's stdin this often
LAUNCHER_SILENCE_S = 30  # the supervisor stops an attached job after this long without one
NODE_LINE = re.compile(r"^\[([A-Za-z0-9._-]+)\] (.*)$")  # torchrun lines, as the supervisor tags them


@dataclass(frozen=True)
class Policy:
    max_restarts: int = 0
    min_nodes: int = 1
    interval: float = 5.0  # seconds between health probes of every node
    lost_after: int = 2  # probes a node may miss in a row while the job runs


def plan(job: str, launcher: str, nodes: Sequence[dict], *, argv: Sequence[str] = (),
         node_argv: Sequence[Sequence[str]] = (), env: dict[str, str] | None = None,
         ssh: Sequence[str], policy: Policy = Policy(), attached: bool = True,
         prelude: Sequence[Sequence[str]] = (), node_env: dict[str, str] | None = None,
         node_dir: str = "") -> dict:
    """The supervisor's plan. nodes: [{address, hostname, slots}] in rank order, the first
    being where the supervisor runs; argv (mpirun, horovodrun) or node_argv (torchrun, one per
    node) for all of them; env: variables for the launcher command's own environment;
    node_env: written to every node's job directory as `env` (torchrun sources it); prelude:
    commands run once before the first attempt; node_dir: the job's directory on the first node
    (what an error about its files names). Values travel in this file, never argv."""
    if launcher in ("mpirun", "horovodrun") and not argv:
        raise ValueError(f"plan: {launcher} needs argv")
    if launcher == "torchrun" and len(node_argv) != len(nodes):
        raise ValueError("plan: torchrun needs one argv per node")
    if policy.min_nodes > len(nodes):
        raise ValueError(f"plan: --min-nodes {policy.min_nodes} > {len(nodes)} nodes")
    return {"job": job, "launcher": launcher, "nodes": [dict(n) for n in nodes], "argv": list(argv),
            "node_argv": [list(a) for a in node_argv], "env": dict(env or {}), "ssh": list(ssh),
            "max_restarts": policy.max_restarts, "min_nodes": policy.min_nodes,
            "interval": policy.interval, "lost_after": policy.lost_after, "attached": attached,
            "prelude": [list(a) for a in prelude], "node_env": None if node_env is None else dict(node_env),
            "launcher_silence": LAUNCHER_SILENCE_S, "node_dir": node_dir}


def container_ssh(mux: Sequence[str] = ()) -> list[str]:
    """ssh argv, without host, from one container of the job to another's sshd (2022)."""
    return ["ssh", "-p", "2022", "-l", "root", "-o", "BatchMode=yes", "-o", "ConnectTimeout=3",
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
            *([] if any(str(o).startswith("ServerAlive") for o in mux) else contract.ssh_keepalive_opts()), *mux]


def parse_event(line: str) -> dict | None:
    if not line.startswith(EVENT):
        return None
    try:
        ev = json.loads(line[len(EVENT):])
    except json.JSONDecodeError:
        return None
    return ev if isinstance(ev, dict) and "event" in ev else None


def describe(ev: dict) -> str:
    """One line for a user, for each event."""
    name = ev["event"]
    if name == "running":
        what = "started" if not ev.get("attempt") else f"restarted (attempt {ev['attempt']})"
        return f"[launch] job {what} on {len(ev.get('nodes', []))} node(s): {', '.join(ev.get('nodes', []))}"
    if name == "lost":
        return "[launch] lost " + "; ".join(f"{h}: {why}" for h, why in ev.get("nodes", {}).items())
    if name == "restart":
        took = f" (the attempt ended in {ev['ended_in']} s)" if "ended_in" in ev else ""
        return (f"[launch] restart {ev.get('attempt')}: {ev.get('reason')}; "
                f"dropped {', '.join(ev.get('dropped', [])) or 'none'}{took}")
    if name == "succeeded":
        return "[launch] job succeeded"
    if name == "failed":
        return f"[launch] job failed (exit {ev.get('exit_code')}): {ev.get('reason', '')}".rstrip(": ")
    return f"[launch] {name}"


@dataclass
class Render:
    """Supervisor output -> lines for a user. mpirun's tagged chunks are reassembled per rank
    (MpiOutput), torchrun's local ranks become global ones, events become [launch] lines."""

    launcher: str
    first: str  # the first node's hostname: where untagged mpirun lines come from
    ranks: list[str] = field(default_factory=list)
    final: dict | None = None
    _mpi: object = None

    def _attempt(self, ranks: list[str]) -> None:
        from dtrain.launch.jobs.output import MpiOutput

        self.ranks = ranks
        self._mpi = MpiOutput(ranks, self.first)

    def feed(self, line: str) -> list[str]:
        ev = parse_event(line)
        if ev is not None:
            out = self.flush()
            if ev["event"] == "running":
                self._attempt(list(ev.get("ranks", [])))
            if ev["event"] in FINAL:
                self.final = ev
            return out + [describe(ev)]
        if self.launcher == "torchrun":
            m = NODE_LINE.match(line)
            if m and m.group(1) in self.ranks:
                from dtrain.launch.jobs.output import prefix_line

                return [prefix_line(m.group(2), default_node=m.group(1), torch_base=self.ranks.index(m.group(1)))]
            return [f"[{self.first}] {line}"]
        if self._mpi is None:
            self._attempt(self.ranks)
        return self._mpi.feed(line)

    def flush(self) -> list[str]:
        return self._mpi.flush() if self._mpi is not None else []

    @property
    def exit_code(self) -> int | None:
        return None if self.final is None else int(self.final.get("exit_code") or 0)
