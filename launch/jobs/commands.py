"""Pure command builders: plain values in, argv (list[str]) out; no I/O except parse_env_file.

Programming mistakes (an empty command, nnodes=0) raise ValueError; bad user input
(env names, mount specs, env files, ip output) raises LaunchError.
"""

from __future__ import annotations

import ipaddress
import json
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dtrain import contract, values
from dtrain.launch.errors import LaunchError
from dtrain.launch.remote.hosts import Node, hosts_list

_ENV_NAME_RE = re.compile(rf"^{values.ENV_NAME.pattern}$", re.ASCII)  # the one rule: dtrain/values.py

# What `mpirun --tag-output` puts before each chunk a rank writes, and launch/node/rank_output.py
# before each line: `[1,3]<stdout>:` (job, rank; the job part is absent in some versions, and in
# horovodrun's Gloo prefix). Group 1 is the rank, group 2 the stream.
MPI_OUTPUT_TAG = r"\[(?:\d+,)?(\d+)\]<(stdout|stderr)>:"

# Forwarded by name from the launcher's environment to every rank.
MPI_FORWARD = ("NCCL_DEBUG", "PATH", "LD_LIBRARY_PATH")


def training_env(iface: str) -> dict[str, str]:
    """Variables every MPI/Horovod rank gets: NCCL on the chosen NIC, one BLAS/OpenMP thread."""
    return {
        "NCCL_SOCKET_IFNAME": iface,
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "GOTO_NUM_THREADS": "1",
    }


def _check_env_names(names: Sequence[str] | Mapping[str, str], what: str) -> None:
    for name in names:
        if not _ENV_NAME_RE.match(name):
            raise LaunchError(f"{what}: bad environment variable name {name!r}")


def _check_command(command: Sequence[str], who: str) -> None:
    if not command or isinstance(command, str):
        raise ValueError(f"{who}: command must be a non-empty list of strings, got {command!r}")


def _total_slots(nodes: Sequence[Node], who: str) -> int:
    if not nodes:
        raise ValueError(f"{who}: no nodes")
    return sum(n.slots for n in nodes)


# --- mpirun --------------------------------------------------------------------------------


def mpi_flags(
    *,
    iface: str,
    ompi_major: int = 4,
    env: Mapping[str, str] | None = None,
    forward: Sequence[str] = (),
    ssh_port: int | None = contract.SSH_PORT,
    extra_mca: Sequence[tuple[str, str]] = (),
    ssh_options: Sequence[str] = (),
    env_names: Sequence[str] = (),
) -> list[str]:
    """Every mpirun flag but -np/-H: the one place the MPI contract lives (Open MPI 4 or 5).

    ssh_port: the containers' sshd port; None leaves ssh's default. ssh_options: more ssh
    arguments after `-p PORT` in the same MCA value (e.g. `-o ConnectionAttempts=10`). User env
    overrides the built-in values in place; extra_mca overrides built-in MCA params of the same name.
    env_names: user variables whose values mpirun takes from its own environment (`-x NAME`, so
    no value is in the argv), replacing built-in values in place as env does.
    """
    env = dict(env or {})
    _check_env_names(env, "env")
    _check_env_names(forward, "forward")
    _check_env_names(env_names, "env")
    if ompi_major < 3:
        raise ValueError(f"Open MPI {ompi_major} is not supported (3, 4 or 5)")
    mca: dict[str, str] = {
        "pml": "ob1",
        "btl": "^openib",
        "btl_tcp_if_include": iface,
        "oob_tcp_if_include": iface,
    }
    rsh_args = ([f"-p {ssh_port}"] if ssh_port is not None else []) + list(ssh_options)
    if rsh_args:
        # One argv element "-p 2022"; Open MPI 5 (PRRTE) renamed the rsh launcher to ssh.
        mca["plm_rsh_args" if ompi_major < 5 else "plm_ssh_args"] = " ".join(rsh_args)
    mca.update(dict(extra_mca))

    exports: dict[str, str | None] = dict.fromkeys(MPI_FORWARD)
    exports.update(training_env(iface))
    exports.update(env)  # a user value replaces a default, keeping its position
    exports.update(dict.fromkeys(env_names))
    for name in forward:
        exports.setdefault(name, None)

    # --bind-to/--map-by: the double-dash spellings work on Open MPI 4 and 5 (5 warns on -bind-to).
    flags = ["--bind-to", "none", "--map-by", "slot"]
    for key, value in mca.items():
        flags += ["--mca", key, value]
    for name, value in exports.items():
        flags += ["-x", name if value is None else f"{name}={value}"]
    return flags


def mpirun_argv(
    nodes: Sequence[Node] | None,
    command: Sequence[str],
    *,
    iface: str,
    ompi_major: int = 4,
    env: Mapping[str, str] | None = None,
    forward: Sequence[str] = (),
    ssh_port: int | None = contract.SSH_PORT,
    extra_mca: Sequence[tuple[str, str]] = (),
    ssh_options: Sequence[str] = (),
    hostfile: str | None = None,
    np: int | None = None,
    env_names: Sequence[str] = (),
) -> list[str]:
    """`mpirun --allow-run-as-root -np N -H h:s,... <mpi_flags> command...` (no shell).

    Either nodes (-H, N = their slots) or hostfile + np (`-np N --hostfile PATH`, for a host
    list written by someone else, e.g. the MPI operator's /etc/mpi/hostfile), never both.
    """
    _check_command(command, "mpirun_argv")
    if (nodes is None) == (hostfile is None):
        raise ValueError("mpirun_argv: give exactly one of nodes or hostfile")
    if hostfile is not None:
        if np is None or np < 1:
            raise ValueError(f"mpirun_argv: a hostfile needs np > 0, got {np!r}")
        hosts = ["--hostfile", hostfile]
    else:
        if np is not None:
            raise ValueError("mpirun_argv: np comes from the nodes' slots; pass it only with hostfile")
        np = _total_slots(nodes, "mpirun_argv")
        hosts = ["-H", hosts_list(nodes)]
    return [
        "mpirun", "--allow-run-as-root", "-np", str(np), *hosts,
        *mpi_flags(iface=iface, ompi_major=ompi_major, env=env, forward=forward,
                   ssh_port=ssh_port, extra_mca=extra_mca, ssh_options=ssh_options, env_names=env_names),
        *command,
    ]  # fmt: skip


# --- horovodrun ----------------------------------------------------------------------------


def horovodrun_argv(
    nodes: Sequence[Node],
    command: Sequence[str],
    *,
    iface: str,
    ssh_port: int | None = contract.SSH_PORT,
    env: Mapping[str, str] | None = None,
    env_names: Sequence[str] = (),
) -> list[str]:
    """`env K=V... horovodrun -np N -H h:s,... -p 2022 --network-interface IFACE command...`.

    horovodrun has no -x: it forwards its own whole environment to every rank (mpirun -x for
    each exportable variable, or the Gloo env), and with --network-interface it sets
    btl_tcp_if_include and NCCL_SOCKET_IFNAME itself. So env goes into horovodrun's own
    environment via env(1); NCCL_SOCKET_IFNAME is set there too, for the Gloo path.
    env_names: user variables already in horovodrun's environment (their values are not in
    the argv); a built-in value of the same name is left out.
    """
    _check_command(command, "horovodrun_argv")
    np = _total_slots(nodes, "horovodrun_argv")
    variables = training_env(iface)
    variables.update(env or {})
    _check_env_names(variables, "env")
    _check_env_names(env_names, "env")
    for name in env_names:
        variables.pop(name, None)
    argv = ["env", *(f"{k}={v}" for k, v in variables.items())]
    argv += ["horovodrun", "-np", str(np), "-H", hosts_list(nodes)]
    if ssh_port is not None:
        argv += ["-p", str(ssh_port)]
    argv += ["--network-interface", iface, *command]
    return argv


# --- torchrun ------------------------------------------------------------------------------


_POD_ENV_REF = re.compile(r"^\$\([A-Za-z_][A-Za-z0-9_]*\)$")


def torchrun_argv(
    nnodes: int,
    node_rank: int | str,
    nproc_per_node: int,
    master_addr: str,
    master_port: int | str,
    command: Sequence[str],
    *,
    rdzv: str = "static",
    job_id: str | None = None,
) -> list[str]:
    """torchrun for one node. command is `[script, args...]` or `["-m", module, args...]`.

    static: fixed ranks, --node_rank + --master_addr/--master_port (rank 0 is the master).
    c10d: ranks assigned at rendezvous on master_addr:master_port, keyed by job_id.
    Underscore spellings: accepted by every torchrun (the dashed ones only from torch 2.x).
    node_rank and master_port may be a Kubernetes env reference such as "$(RANK)": the kubelet
    fills it in from the pod's env (Kubeflow's training operator sets RANK, MASTER_PORT).
    """
    _check_command(command, "torchrun_argv")
    if nnodes < 1 or nproc_per_node < 1:
        raise ValueError(f"torchrun_argv: nnodes={nnodes}, nproc_per_node={nproc_per_node} must be > 0")
    for what, value in (("node_rank", node_rank), ("master_port", master_port)):
        if isinstance(value, str) and not _POD_ENV_REF.match(value):
            raise ValueError(f"torchrun_argv: {what} {value!r} is neither an int nor a $(VAR) reference")
    if isinstance(master_port, int) and not 1 <= master_port <= 65535:
        raise ValueError(f"torchrun_argv: bad master_port {master_port}")
    argv = ["torchrun", "--nnodes", str(nnodes), "--nproc_per_node", str(nproc_per_node)]
    if rdzv == "static":
        if isinstance(node_rank, int) and not 0 <= node_rank < nnodes:
            raise ValueError(f"torchrun_argv: node_rank {node_rank} not in [0, {nnodes})")
        argv += ["--node_rank", str(node_rank), "--master_addr", master_addr, "--master_port", str(master_port)]
    elif rdzv == "c10d":
        if not job_id:
            raise ValueError("torchrun_argv: c10d rendezvous needs a job_id")
        argv += ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"{master_addr}:{master_port}", "--rdzv_id", job_id]
    else:
        raise ValueError(f"torchrun_argv: rdzv must be 'static' or 'c10d', got {rdzv!r}")
    return argv + script_argv(command)


def script_argv(command: Sequence[str]) -> list[str]:
    """The command as a launcher that runs the script with its own Python takes it (torchrun,
    accelerate launch): `python train.py` (the form mpirun takes) becomes `train.py`, and
    `python -m pkg` becomes `-m pkg`."""
    command = list(command)
    if len(command) > 1 and re.fullmatch(r"(.*/)?python(3(\.\d+)?)?", command[0]):
        command = command[1:]
    return command


def torchrun_env(iface: str) -> dict[str, str]:
    """NCCL and Gloo (c10d's store and CPU collectives) on the chosen NIC."""
    return {"NCCL_SOCKET_IFNAME": iface, "GLOO_SOCKET_IFNAME": iface}


# --- Ray -----------------------------------------------------------------------------------

RAY_PORT = 6379  # the head's GCS port: workers join HEAD:6379, the job's RAY_ADDRESS
# What a Ray node needs beside its address: no dashboard (not in the image), no usage report.
_RAY_COMMON = ["--include-dashboard=false", "--disable-usage-stats"]


def _ray_resources(node_ip: str | None, num_cpus: int | None, num_gpus: int | None,
                   block: bool) -> list[str]:
    argv = [f"--node-ip-address={node_ip}"] if node_ip else []
    for what, value in (("num-cpus", num_cpus), ("num-gpus", num_gpus)):
        if value is not None:
            if value < 0:
                raise ValueError(f"ray: --{what} {value} must be >= 0")
            argv.append(f"--{what}={value}")
    return argv + (["--block"] if block else [])


def ray_head_argv(port: int = RAY_PORT, *, node_ip: str | None = None, num_cpus: int | None = None,
                  num_gpus: int | None = None, block: bool = False) -> list[str]:
    """`ray start --head` on port (the GCS). node_ip: the address peers reach this node at (the
    launch's node address; Ray's own guess may pick another NIC). block: stay in the foreground
    (a container's main process, as on ECS); without it `ray start` daemonizes and returns."""
    if not 1 <= port <= 65535:
        raise ValueError(f"ray_head_argv: bad port {port}")
    return ["ray", "start", "--head", f"--port={port}", *_RAY_COMMON,
            *_ray_resources(node_ip, num_cpus, num_gpus, block)]


def ray_worker_argv(head_address: str, *, node_ip: str | None = None, num_cpus: int | None = None,
                    num_gpus: int | None = None, block: bool = False) -> list[str]:
    """`ray start --address HEAD:PORT`: a worker node joining the head's cluster."""
    if not head_address or head_address.startswith("-") or ":" not in head_address:
        raise ValueError(f"ray_worker_argv: head_address {head_address!r} must be HOST:PORT")
    return ["ray", "start", f"--address={head_address}", "--disable-usage-stats",
            *_ray_resources(node_ip, num_cpus, num_gpus, block)]


def ray_stop_argv() -> list[str]:
    """Stop every Ray process of this node (container)."""
    return ["ray", "stop", "--force"]


def ray_env(iface: str) -> dict[str, str]:
    """For `ray start`: the Ray workers it spawns inherit it, so Ray Train's torch process group
    (Gloo, NCCL) uses the chosen NIC."""
    return {"GLOO_SOCKET_IFNAME": iface, "NCCL_SOCKET_IFNAME": iface}


# In the image (COPY launch/node/ to contract.NODE_DIR).
RAY_WAIT_SCRIPT = f"{contract.NODE_DIR}/ray_wait.py"


def ray_wait_argv(head_address: str, nodes: int, timeout: float) -> list[str]:
    """Wait (from inside the cluster) until the head at head_address sees `nodes` alive nodes."""
    if nodes < 1:
        raise ValueError(f"ray_wait_argv: nodes={nodes} must be > 0")
    return ["python", RAY_WAIT_SCRIPT, "--address", head_address, "--nodes", str(nodes),
            "--timeout", f"{timeout:g}"]


def ray_job_argv(head_address: str, command: Sequence[str]) -> list[str]:
    """The user's script as a Ray driver of the cluster: RAY_ADDRESS set, so `ray.init()` and Ray
    Train's TorchTrainer join it (run in the head's container)."""
    _check_command(command, "ray_job_argv")
    return ["env", f"RAY_ADDRESS={head_address}", *command]


# --- one attempt: the launcher command for the nodes a job has now ---------------------------

# ssh inside the first container: the readiness check opens one master connection per node
# and mpirun's daemon launch (all from that container: no tree spawn) reuses them.
CONTAINER_SSH_MUX = ("-o", "ControlMaster=auto", "-o", "ControlPath=/tmp/dtrain-mux-%C",
                     "-o", "ControlPersist=600", *contract.ssh_keepalive_opts())  # keepalives: a lost link ends it

# Open MPI settings every mpirun gets unless --mca sets them: the first container starts every
# node's daemon over the connections the ready step left; two TCP connections per peer for MPI
# traffic (EC2 caps one flow at 5 Gbit/s outside a cluster placement group; on the simulated
# cluster the CPU allreduce's busbw went from 0.53 to 0.99 of raw TCP, docs/benchmarks.md).
MPI_DEFAULTS = (("plm_rsh_no_tree_spawn", "1"), ("btl_tcp_links", "2"))

# Every rank of every attempt: which attempt it is (0 first; a checkpoint contract variable).
RESTART_VAR = "DTRAIN_RESTART"


def mpi_defaults(extra: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """MPI_DEFAULTS less the keys the user's --mca sets."""
    given = {k for k, _ in extra}
    return [(k, v) for k, v in MPI_DEFAULTS if k not in given]


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
    at, its hostname, its ranks and the NIC the job uses there."""

    address: str
    hostname: str
    slots: int
    iface: str


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
    beat: float = 0.25
    suspect_after: float = 0.6
    connect_timeout: float = 1.0
    lost_after: float = 30.0
    checkpoint_grace: float = 60.0  # after a spot notice: how long the job gets to checkpoint
    settle: float = 1.0  # after a failed rank: wait this long before asking which nodes are left
    keep_containers: bool = False  # tests: leave the containers at the end
    # hangs: no rank's progress for hang_timeout s (None: not watched) dumps every rank's stack and
    # ends the attempt; progress: a rank's line matching progress_pattern ("": any line of a rank)
    hang_timeout: float | None = None
    progress_pattern: str = ""
    # stragglers: every rank's stack sampled every straggler_check s (None: not watched); the
    # rank the others wait for is named (launch/jobs/straggler.py)
    straggler_check: float | None = None
    replace_stragglers: bool = False  # a straggler (not the first node) swapped for a spare at a checkpoint

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
            elif k == "quarantined":
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
            elif k == "quarantined":
                v = tuple(tuple(p) for p in v)
            elif isinstance(v, list):
                v = tuple(v)
            kw[k] = v
        return cls(**kw)


# --- env files -----------------------------------------------------------------------------


def parse_env_file(path: str | Path) -> dict[str, str]:
    """`KEY=VALUE` lines; `#` comment lines, blank lines and a leading `export ` allowed.

    One pair of matching surrounding quotes is stripped (no escapes, no interpolation); an
    unquoted value is kept verbatim, `#` included. A key given twice is an error.
    """
    path = Path(path)
    try:
        text = values.small_text_file(path, "env file", "KEY=VALUE lines")
    except values.BadValue as e:
        raise LaunchError(str(e)) from None
    result: dict[str, str] = {}
    first_line: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        where = f"{path}:{lineno}"
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export ") or line.startswith("export\t"):
            line = line[len("export") :].lstrip()
        key, eq, value = line.partition("=")
        key = key.rstrip()
        if not eq:
            raise LaunchError(f"{where}: expected KEY=VALUE, got {raw.strip()!r}")
        if not _ENV_NAME_RE.match(key):
            raise LaunchError(f"{where}: bad variable name {key!r}")
        value = value.strip()
        if value[:1] in ("'", '"'):
            if len(value) < 2 or value[-1] != value[0]:
                raise LaunchError(f"{where}: unterminated quote in value of {key}")
            value = value[1:-1]
        if key in first_line:
            raise LaunchError(f"{where}: {key} set twice, first on line {first_line[key]}")
        first_line[key] = lineno
        result[key] = value
    return result


# --- docker run ----------------------------------------------------------------------------

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_SHM_RE = re.compile(r"^[0-9]+[bkmgBKMG]?$")


@dataclass(frozen=True)
class Mount:
    src: str  # host path
    dst: str  # container path
    readonly: bool = False


def parse_mount(spec: str) -> Mount:
    """`/data`, `/data:ro`, `/src:/dst`, `/src:/dst:ro|rw`; both paths absolute."""
    parts = spec.split(":")
    mode = None
    if len(parts) >= 2 and parts[-1] in ("ro", "rw"):
        mode = parts.pop()
    if len(parts) not in (1, 2) or not all(parts):
        raise LaunchError(f"--mount {spec!r}: expected SRC[:DST][:ro|rw]")
    src, dst = parts[0], parts[-1]
    for p in (src, dst):
        if not p.startswith("/"):
            raise LaunchError(f"--mount {spec!r}: {p!r} is not an absolute path")
        if "," in p:
            raise LaunchError(f"--mount {spec!r}: commas in paths are not supported")
    return Mount(posixpath.normpath(src), posixpath.normpath(dst), readonly=mode == "ro")


@dataclass(frozen=True)
class ContainerSpec:
    """The whole container contract of a training node (the image runs sshd on 2022)."""

    job: str
    image: str
    gpus: bool = True
    efa_devices: tuple[str, ...] = ()  # e.g. /dev/infiniband/uverbs0
    mounts: tuple[Mount, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    shm_size: str | None = None  # None: --ipc host (host /dev/shm, what NCCL wants); else --shm-size
    memlock: int = -1  # bytes; -1 = unlimited (EFA/RDMA pin memory). Capped where the host cannot.
    key_dir: str | None = None  # node directory with the job's key pair, mounted at contract.JOB_KEY_MOUNT
    command: tuple[str, ...] = ()  # empty: the image's CMD
    name: str | None = None  # default dtrain-JOB
    # SYS_PTRACE: py-spy reads a rank's Python stack (a hang's dump: launch/node/stacks.sh)
    cap_add: tuple[str, ...] = ("SYS_PTRACE",)

    @property
    def container_name(self) -> str:
        return self.name or contract.container_name(self.job)


def docker_run_parts(spec: ContainerSpec) -> tuple[list[str], list[str]]:
    """docker run's argv around the node-dependent flags (node_flags): (head, rest). A launch
    sends both to the node, which puts its own node_flags between them (launch/node/host/start.sh)."""
    for what, value in (("job", spec.job), ("container name", spec.container_name)):
        if not _NAME_RE.match(value):
            raise LaunchError(f"bad {what} {value!r} (letters, digits, _ . -; starting alphanumeric)")
    if not spec.image or spec.image.startswith("-"):
        raise LaunchError(f"bad image {spec.image!r}")
    _check_env_names(spec.env, "container env")
    head = ["docker", "run", "-d", "--name", spec.container_name, "--network", "host"]
    if spec.shm_size is None:
        head += ["--ipc", "host"]
    elif _SHM_RE.match(spec.shm_size):
        head += ["--shm-size", spec.shm_size]
    else:
        raise LaunchError(f"bad shm size {spec.shm_size!r} (e.g. 16g)")
    for cap in spec.cap_add:
        if not re.fullmatch(r"[A-Z_]+", cap):
            raise LaunchError(f"bad capability {cap!r} (e.g. SYS_PTRACE)")
        head += ["--cap-add", cap]
    rest: list[str] = []
    for m in spec.mounts:
        rest += ["--mount", f"type=bind,src={m.src},dst={m.dst}" + (",readonly" if m.readonly else "")]
    if spec.key_dir:  # the entrypoint installs the pair as root's before starting sshd
        if not spec.key_dir.startswith("/") or "," in spec.key_dir:
            raise LaunchError(f"bad key directory {spec.key_dir!r}")
        rest += ["--mount", f"type=bind,src={spec.key_dir},dst={contract.JOB_KEY_MOUNT},readonly"]
    rest += ["--label", f"{contract.LABEL_JOB}={spec.job}"]
    for k, v in spec.env.items():
        rest += ["-e", f"{k}={v}"]
    return head, rest + [spec.image, *spec.command]


def node_flags(gpus: bool, efa_devices: Sequence[str], memlock: int) -> list[str]:
    """The flags that depend on the node: unlimited (or the host's cap of) locked memory, GPUs, EFA."""
    argv = ["--ulimit", f"memlock={memlock}" if memlock < 0 else f"memlock={memlock}:{memlock}"]
    if gpus:
        argv += ["--gpus", "all"]
    for dev in efa_devices:
        if not dev.startswith("/dev/"):
            raise LaunchError(f"bad device {dev!r} (expected a /dev path)")
        argv += ["--device", dev]
    return argv


def docker_run_argv(spec: ContainerSpec) -> list[str]:
    """`docker run -d` for one node: host network, shared IPC, unlimited memlock, GPUs, EFA."""
    head, rest = docker_run_parts(spec)
    return head + node_flags(spec.gpus, spec.efa_devices, spec.memlock) + rest


# --- network interface ---------------------------------------------------------------------

# Docker bridges and container veths carry addresses but never the node's traffic.
_BRIDGE_PREFIXES = ("docker", "br-", "veth")


def _links(ip_addr_json: str, address: str, where: str) -> tuple[list, ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """`ip -j addr` output as its list of links, and address parsed; a LaunchError naming where."""
    try:
        links = json.loads(ip_addr_json)
        want = ipaddress.ip_address(address)
    except ValueError as e:
        raise LaunchError(f"{where}cannot read `ip -j addr` output / address {address!r}: {e}") from None
    return (links if isinstance(links, list) else []), want


def interface_for_address(ip_addr_json: str, address: str, *, host: str | None = None) -> str:
    """The NIC carrying `address`, from a node's `ip -j addr` output; never lo or a docker bridge."""
    where = f"{host}: " if host else ""
    links, want = _links(ip_addr_json, address, where)
    seen = []
    for link in links:
        name = link.get("ifname", "?")
        for info in link.get("addr_info") or []:
            local = info.get("local")
            seen.append(f"{name}={local}")
            try:
                match = local is not None and ipaddress.ip_address(local) == want
            except ValueError:
                continue
            if match:
                if name == "lo" or name.startswith(_BRIDGE_PREFIXES):
                    raise LaunchError(
                        f"{where}{address} sits on {name}, not a physical NIC; use the node's private address"
                    )
                return name
    raise LaunchError(f"{where}no interface carries {address} (seen: {', '.join(seen) or 'none'})")


def interface_address(ip_addr_json: str, iface: str) -> str:
    """The first IPv4 address of NIC `iface` in a node's `ip -j addr` output ("" where none)."""
    try:
        links = json.loads(ip_addr_json or "[]")
    except ValueError:
        return ""
    for link in links if isinstance(links, list) else []:
        if link.get("ifname") == iface:
            for info in link.get("addr_info") or []:
                if info.get("family") == "inet" and info.get("local"):
                    return str(info["local"])
    return ""


def check_same_iface(per_node: Mapping[str, str]) -> str:
    """The one NIC name all nodes share (NCCL_SOCKET_IFNAME, btl_tcp_if_include take one)."""
    if not per_node:
        raise ValueError("check_same_iface: no nodes")
    by_iface: dict[str, list[str]] = {}
    for host, iface in per_node.items():
        by_iface.setdefault(iface, []).append(host)
    if len(by_iface) == 1:
        return next(iter(by_iface))
    groups = "; ".join(f"{iface} on {', '.join(hosts)}" for iface, hosts in by_iface.items())
    raise LaunchError(f"nodes disagree on the network interface: {groups} (use one instance type/AMI, or name the NIC)")


# --- nodes whose NICs are named differently ------------------------------------------------

# In every image (templates/Dockerfile.j2 copies launch/node/ to /opt/dtrain/node/): sources
# the node's own env file (node_env_text, written by the launch into the job's key directory,
# mounted at JOB_KEY_MOUNT), then runs the rank's command.
NODE_ENV_WRAPPER = f"{contract.NODE_DIR}/node_env.sh"
NODE_ENV_FILE = "node.env"  # in the job's key directory


def interface_network(ip_addr_json: str, address: str, *, host: str | None = None) -> str:
    """The network (e.g. `10.0.0.0/16`) of the address/prefix `address` holds, from `ip -j addr`."""
    where = f"{host}: " if host else ""
    links, want = _links(ip_addr_json, address, where)
    for link in links:
        for info in link.get("addr_info") or []:
            try:
                iface = ipaddress.ip_interface(f"{info.get('local')}/{info.get('prefixlen')}")
            except ValueError:
                continue
            if iface.ip == want:
                return str(iface.network)
    raise LaunchError(f"{where}no interface carries {address}")


def tcp_include(per_node: Mapping[str, tuple[str, str, str]]) -> str | None:
    """Open MPI's btl/oob_tcp_if_include for nodes given as {host: (iface, address, network)}:
    None when every node names its NIC alike (the name is the value, as before); else the one
    subnet that holds every node's address (Open MPI matches each node's own NIC by it).
    LaunchError when the NICs differ and no node's subnet holds all the others."""
    if not per_node:
        raise ValueError("tcp_include: no nodes")
    if len({iface for iface, _, _ in per_node.values()}) == 1:
        return None
    unknown = [h for h, (_, _, net) in per_node.items() if not net]
    if unknown:
        raise LaunchError(f"{', '.join(unknown)}: no subnet found for the node's address, and NIC names differ "
                          f"({', '.join(sorted({i for i, _, _ in per_node.values()}))}); give the nodes one NIC name")
    nets = sorted({ipaddress.ip_network(net) for _, _, net in per_node.values()},
                  key=lambda n: n.prefixlen)
    addrs = [ipaddress.ip_address(a) for _, a, _ in per_node.values()]
    for net in nets:  # the widest first
        if all(a.version == net.version and a in net for a in addrs):
            return str(net)
    groups = "; ".join(f"{h} {a} on {n} ({i})" for h, (i, a, n) in per_node.items())
    raise LaunchError(f"nodes name their NICs differently and share no subnet: {groups} "
                      "(put the nodes in one subnet, or give them one NIC name)")


def node_env_text(iface: str, skip: Sequence[str] = ()) -> str:
    """The per-node env file: NCCL and Gloo on this node's own NIC (names in skip are left to
    the user's value)."""
    if not re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", iface):
        raise LaunchError(f"bad interface name {iface!r}")
    return "".join(f"{k}={v}\n" for k, v in torchrun_env(iface).items() if k not in skip)


def mpirun_mixed_argv(
    nodes: Sequence[Node],
    command: Sequence[str],
    *,
    subnet: str,
    iface: str,
    **kw,
) -> list[str]:
    """mpirun_argv for nodes whose NICs are named differently: Open MPI's TCP paths by subnet
    (btl/oob_tcp_if_include SUBNET), and each rank's command run through NODE_ENV_WRAPPER,
    which sets NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME to its node's own NIC. iface: the value
    every rank gets before the wrapper replaces it (the first node's NIC)."""
    ipaddress.ip_network(subnet)  # ValueError: a programming mistake
    extra = [("btl_tcp_if_include", subnet), ("oob_tcp_if_include", subnet), *kw.pop("extra_mca", ())]
    return mpirun_argv(nodes, [NODE_ENV_WRAPPER, *command], iface=iface, extra_mca=extra, **kw)
