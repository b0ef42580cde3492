"""The plan of a supervised run: what the launcher makes once (launch/jobs/job.py plan), writes
to the first node as plan.json, and the supervisor (launch/node/supervise.py) reads to build
every attempt's command with launchers.attempt_argv. Plain values, no I/O; no --env value in it.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dtrain import contract

# Every rank of every attempt: which attempt it is (0 first; a checkpoint contract variable).
RESTART_VAR = "DTRAIN_RESTART"


@dataclass(frozen=True)
class LaunchCommand:
    """What the launcher command of a job is made of, apart from its nodes: made once by the
    launcher (launch/jobs/launchers/), written into the supervisor's plan, and given to
    launchers.attempt_argv with the nodes of each attempt, on the launcher and in the supervisor alike.
    No --env value is in it: only names (the values come from each node's 0600 file)."""

    launcher: str  # a supervised launcher's name (launch/jobs/launchers/)
    command: tuple[str, ...]
    env_names: tuple[str, ...] = ()  # the job's --env names
    forward: tuple[str, ...] = ()  # more names every rank gets from the launcher command's environment
    # non-secret values every rank gets (DTRAIN_CHECKPOINT_DIR): mpirun and horovodrun take them
    # from their own environment (the supervisor's: launcher_env), torchrun from its argv
    extra_env: tuple[tuple[str, str], ...] = ()
    mca: tuple[tuple[str, str], ...] = ()  # the user's --mca
    ompi: int = 4  # Open MPI's major version in the image
    subnet: str | None = None  # where nodes name their NICs differently (tcp_include)
    master_port: int = contract.MASTER_PORT
    rdzv: str = "static"
    job: str = ""
    # mpirun, horovodrun: the text of launch/node/rank_output.py, which runs each rank's command
    # and tags its lines itself ("": Open MPI's --tag-output tags them, losing some; see there)
    rank_output: str = ""
    per_node: bool = False  # one command per node, each started over ssh (torchrun), else one in the first
    files_dir: str = contract.CONTAINER_JOB_DIR  # where an attempt's files go (the job's directory in the first container)

    def to_json(self) -> dict[str, Any]:
        return {k: (list(map(list, v)) if k in ("extra_env", "mca") else list(v) if isinstance(v, tuple) else v)
                for k, v in self.__dict__.items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LaunchCommand:
        pairs = ("extra_env", "mca")
        return cls(**{k: (tuple(tuple(p) for p in v) if k in pairs else tuple(v) if isinstance(v, list) else v)
                      for k, v in data.items()})


@dataclass(frozen=True)
class PlanNode:
    """One node of a run as the builders and the supervisor see it: the address peers reach it
    at, its hostname, its ranks, the NIC the job uses there and its GPUs (0: a CPU node)."""

    address: str
    hostname: str
    slots: int
    iface: str
    gpus: int = 0


# What `mpirun --tag-output` puts before each chunk a rank writes, and launch/node/rank_output.py
# before each line: `[1,3]<stdout>:` (job, rank; the job part is absent in some versions, and in
# horovodrun's Gloo prefix). Group 1 is the rank, group 2 the stream.
MPI_OUTPUT_TAG = r"\[(?:\d+,)?(\d{1,9})\]<(stdout|stderr)>:"

# What runs launch/node/rank_output.py (its text follows) before a rank's command: -I -S, only
# the standard library, whatever PYTHON* variables the job sets.
RANK_OUTPUT_HEAD = ("python3", "-I", "-S", "-c")

RANK_OUTPUT_SHOWN = "<launch/node/rank_output.py>"  # its text where a command is shown


def rank_output_argv(program: str, command: Sequence[str]) -> list[str]:
    """The rank's command under rank_output.py (its text: program), which tags each line of its
    output with the rank; the command as it is where program is ""."""
    return [*RANK_OUTPUT_HEAD, program, *command] if program and command else list(command)


def shown_argv(argv: Sequence[str], program: str) -> list[str]:
    """argv as the launch shows it: rank_output.py's text as RANK_OUTPUT_SHOWN."""
    return [RANK_OUTPUT_SHOWN if program and a == program else a for a in argv]


def rank_map(nodes: Sequence[PlanNode]) -> list[str]:
    """Global rank -> hostname, as `--map-by slot` and torchrun's node ranks fill them."""
    return [n.hostname for n in nodes for _ in range(n.slots)]


def swap_out(nodes: Sequence[PlanNode], spares: Sequence[PlanNode], out: Mapping[str, str]
             ) -> tuple[tuple[PlanNode, ...], tuple[PlanNode, ...], dict[str, str]]:
    """Take the nodes named in `out` ({hostname: why}) out of a run: each active one is replaced,
    in its place in rank order, by the first spare left, or dropped where none is; a spare named
    there is dropped. Returns (nodes, spares, {replaced hostname: the spare's hostname}). The
    launcher (a node the network gate names) and the supervisor (a node lost, leaving) both
    call it."""
    left = [s for s in spares if s.hostname not in out]
    kept: list[PlanNode] = []
    took: dict[str, str] = {}
    for n in nodes:
        if n.hostname not in out:
            kept.append(n)
        elif left:
            spare = left.pop(0)
            kept.append(spare)
            took[n.hostname] = spare.hostname
    return tuple(kept), tuple(left), took


# A spare that came while the job runs (a node its Auto Scaling group brought back, made ready by
# the attached launcher: launch/jobs/joining.py): one line on the supervisor's stdin, this word
# then the node as JSON (PlanNode's fields). The supervisor reads every other line as a beat.
SPARE_LINE = "spare "
_HOSTNAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,62})")  # a Linux hostname: 64 characters at most
_IFACE = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")  # a Linux interface name (IFNAMSIZ - 1)
_ADDRESS = re.compile(r"[0-9A-Fa-f:.]{2,45}")  # IPv4 or IPv6, no scope (ipaddress takes `%` and anything after)


def plan_node(data: Any) -> PlanNode:
    """A PlanNode from its JSON object, every field checked (a line from outside this process):
    ValueError naming the field."""
    if not isinstance(data, dict) or set(data) - set(PlanNode.__dataclass_fields__):
        raise ValueError(f"not a node: expected an object of {', '.join(PlanNode.__dataclass_fields__)}")
    address, hostname, iface = (data.get(k) for k in ("address", "hostname", "iface"))
    slots, gpus = data.get("slots"), data.get("gpus", 0)
    try:
        if not isinstance(address, str) or not _ADDRESS.fullmatch(address):
            raise ValueError
        ipaddress.ip_address(address)
    except ValueError:
        raise ValueError("address: not an IP address") from None
    if not isinstance(hostname, str) or not _HOSTNAME.fullmatch(hostname):
        raise ValueError("hostname: not a hostname")
    if not isinstance(iface, str) or not _IFACE.fullmatch(iface):
        raise ValueError("iface: not an interface name")
    for key, v, low in (("slots", slots, 1), ("gpus", gpus, 0)):
        if type(v) is not int or not low <= v <= 4096:
            raise ValueError(f"{key}: not a whole number from {low} to 4096")
    return PlanNode(address, hostname, slots, iface, gpus)


def spare_line(node: PlanNode) -> str:
    """The supervisor's stdin line that offers node as a spare (SPARE_LINE)."""
    return SPARE_LINE + json.dumps(asdict(node), separators=(",", ":")) + "\n"


def parse_spare_line(line: str) -> PlanNode:
    """SPARE_LINE's node; ValueError naming what is wrong."""
    if not line.startswith(SPARE_LINE):
        raise ValueError(f"not a {SPARE_LINE.strip()!r} line")
    try:
        data = json.loads(line[len(SPARE_LINE):])
    except ValueError:
        raise ValueError("not JSON after the word") from None
    return plan_node(data)


def merge_spares(nodes: Sequence[PlanNode], spares: Sequence[PlanNode], out: Collection[str],
                 offered: Sequence[PlanNode]) -> tuple[tuple[PlanNode, ...], dict[str, str]]:
    """spares with each offered node the run does not know appended, in order; out: hostnames
    taken out of the run (quarantined: never used again). Returns (spares, {hostname: why} of
    those refused: a hostname or address of a node the run has or had)."""
    merged = list(spares)
    refused: dict[str, str] = {}
    for n in offered:
        hostnames = {m.hostname for m in (*nodes, *merged)}
        addresses = {m.address for m in (*nodes, *merged)}
        if n.hostname in out:
            refused[n.hostname] = "taken out of this job before"
        elif n.hostname in hostnames:
            refused[n.hostname] = "a node of this job has that hostname"
        elif n.address in addresses:
            refused[n.hostname] = f"a node of this job has its address {n.address}"
        else:
            merged.append(n)
    return tuple(merged), refused


@dataclass(frozen=True)
class RunPlan:
    """What a supervised run is: made once by the launcher (launch/jobs/job.py plan), written to
    the first node as plan.json, read by the supervisor (launch/node/supervise.py), which builds
    every attempt's command from it with launchers.attempt_argv. No --env value is in it: names only."""

    run: LaunchCommand  # the launcher command apart from its nodes
    nodes: tuple[PlanNode, ...]  # the ranks' nodes in rank order; the first runs the supervisor
    spares: tuple[PlanNode, ...] = ()  # ready (image, container, sshd), no rank: swapped in for a lost node
    quarantined: tuple[tuple[str, str], ...] = ()  # (hostname, why): taken out before the start
    ssh: tuple[str, ...] = ()  # ssh argv, without host, from this container to another's sshd
    node_prefix: tuple[str, ...] = ()  # what runs a per-node command in its container (torchrun)
    max_restarts: int = 0
    min_nodes: int = 1  # fewest nodes to go on with when no spare is left
    attached: bool = True  # a launcher holds the supervisor's stdin (it ends the job when it goes)
    launcher_silence: float = 30  # an attached job ends after this long without a line from its launcher
    node_dir: str = ""  # the job's directory on the first node (what an error about its files names)
    # health: each node's container sends a line every `beat` s over a standing session; a node
    # silent for `suspect_after` s whose sshd port does not take a connection within
    # `connect_timeout` s is lost; one silent for `lost_after` s is lost whatever its port says
    # (the port check sends 3 SYNs in that time, supervise.port_answers: one lost is not a loss)
    beat: float = 0.25
    suspect_after: float = 0.3  # a beat late by 0.05 s only gets its port asked (each silence: every 2 s)
    connect_timeout: float = 0.5
    lost_after: float = 30.0
    checkpoint_grace: float = 60.0  # after a spot notice: how long the job gets to checkpoint
    settle: float = 1.0  # after a failed rank: wait this long before asking which nodes are left
    keep_containers: bool = False  # tests: leave the containers at the end
    # hangs: no rank's progress for hang_timeout s (None: not watched) dumps every rank's stack and
    # ends the attempt; progress: a rank's line matching progress_pattern ("": any line of a rank)
    hang_timeout: float | None = None
    progress_pattern: str = ""
    # stragglers: every rank's stack sampled every straggler_check s (None: not watched); the
    # rank the others wait for is named (launch/analysis/straggler.py)
    straggler_check: float | None = None
    replace_stragglers: bool = False  # a straggler (not the first node) swapped for a spare at a checkpoint
    # NCCL's network on the first attempt (launch/jobs/nccl_net.py): "auto", "warn", "fail" ("" or
    # "off": not checked); efa_types: (instance type, EFA interfaces) for the types that have EFA
    nccl_check: str = ""
    efa_types: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValueError("RunPlan: no nodes")
        if not 1 <= self.min_nodes <= len(self.nodes):
            raise ValueError(f"RunPlan: min_nodes {self.min_nodes} not in 1..{len(self.nodes)}")
        names = [n.hostname for n in (*self.nodes, *self.spares)]
        if len(set(names)) != len(names):
            raise ValueError(f"RunPlan: a node twice in {names}")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in self.__dict__.items():
            if k == "run":
                v = v.to_json()
            elif k in ("nodes", "spares"):
                v = [n.__dict__ for n in v]
            elif k in ("quarantined", "efa_types"):
                v = [list(p) for p in v]
            elif isinstance(v, tuple):
                v = list(v)
            out[k] = v
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunPlan:
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"plan: unknown key(s) {sorted(unknown)} (a launcher newer than this supervisor?)")
        kw: dict[str, Any] = {}
        for k, v in data.items():
            if k == "run":
                v = LaunchCommand.from_json(v)
            elif k in ("nodes", "spares"):
                v = tuple(PlanNode(**n) for n in v)
            elif k in ("quarantined", "efa_types"):
                v = tuple(tuple(p) for p in v)
            elif isinstance(v, list):
                v = tuple(v)
            kw[k] = v
        return cls(**kw)

