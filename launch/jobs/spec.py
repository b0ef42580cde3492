"""The launch's values: what to run (JobSpec, made in one place: launch/jobs/config.py
`job_spec`), what the probe found on each node (NodeFacts), and what the pull and start stages
return (Pulled, Started). Out of launch/jobs/job.py: the launchers, the network gate and the
configuration name these types without importing the stages that use them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dtrain import contract
from dtrain.launch.analysis import timeline
from dtrain.launch.jobs import container
from dtrain.launch.jobs import workdir as wdir
from dtrain.launch.jobs.jobfile import launch_default
from dtrain.launch.remote.hosts import Node

Launcher = str  # a name in the launchers' registry (launch/jobs/launchers/)


@dataclass(frozen=True)
class JobSpec:
    image: str
    command: tuple[str, ...]
    launcher: Launcher = launch_default("launcher")  # the launch's defaults, declared once (jobfile.JobFile)
    name: str = ""
    env: dict[str, str] = field(default_factory=dict)  # --env K=V, for every rank (values by file)
    forward: tuple[str, ...] = ()  # names forwarded from the launching container's env
    iface: str | None = None  # override the detected NIC
    mounts: tuple[container.Mount, ...] = ()
    shm_size: str | None = None  # None: --ipc host
    master_port: int = contract.MASTER_PORT
    rdzv: str = launch_default("rdzv")  # one of jobfile.RDZV
    pull: str = launch_default("pull")  # one of jobfile.PULL, as docker's --pull
    ready_timeout: float = 60
    job_timeout: float | None = None
    ssh_opts: tuple[str, ...] = ()  # extra ssh -o options to reach the nodes
    extra_mca: tuple[tuple[str, str], ...] = ()
    workdir: str | None = None  # sent to every node, mounted at /workdir (launch.jobs.workdir)
    workdir_limit: int = wdir.DEFAULT_LIMIT
    detach: bool = False  # return once the job runs; its supervision stays on the nodes
    max_restarts: int | None = None  # restarts after a failed rank or a lost node (None: one per spare)
    min_nodes: int | None = None  # fewest nodes to restart on (None: every node)
    spares: int = 0  # the last `spares` nodes given are kept ready, no rank, swapped in for a lost one
    checkpoint_dir: str | None = None  # DTRAIN_CHECKPOINT_DIR for every rank (a path in the containers)
    hang_timeout: float | None = None  # no rank's progress for this long: stacks dumped, the attempt ends
    progress_pattern: str = ""  # a rank's line matching this regex is progress ("": any line)
    straggler_check: float | None = None  # every rank's stack sampled this often: the rank the others wait for named
    replace_stragglers: bool = False  # ... and swapped for a spare at a checkpoint (with spares)
    imds: str = ""  # each node watches this instance metadata endpoint for spot notices ("" off)
    heartbeat_timeout: int = 90  # a node stops its part of the job after this long without one
    spot_grace: int = 90  # after a spot notice, how long the node waits for the supervisor to take it out
    check_network: bool = False  # the network gate between the containers before the job (netgate)
    nccl_check: str | None = None  # --nccl-check: warn, fail, off (None: by the nodes, nccl_net.mode)
    efa_types: tuple[tuple[str, int], ...] = ()  # (instance type, EFA interfaces) of the types with EFA

    @property
    def restarts(self) -> int:
        """--max-restarts, or one restart per spare where it is not given."""
        return self.spares if self.max_restarts is None else self.max_restarts


@dataclass(frozen=True)
class NodeFacts:
    """What the probe found on one node."""

    node: Node
    address: str  # the node's own address of the SSH connection: what peers use
    hostname: str
    iface: str
    gpus: int
    efa: tuple[str, ...]
    port_holder: str  # "" when the sshd port is free
    memlock: int = -1  # dockerd's hard RLIMIT_MEMLOCK in bytes; -1 = unlimited
    driver: str = ""  # NVIDIA driver version, "" without GPUs
    port_jobs: tuple[str, ...] = ()  # dtrain jobs running on the node when the port is taken
    network: str = ""  # the subnet of address, e.g. 10.0.0.0/16 ("" where unknown)
    iface_address: str = ""  # with --iface: that NIC's IPv4 address ("": address is on the job's NIC)


@dataclass(frozen=True)
class Started:
    """What start_on_nodes returns: every node's container runs, the checks across nodes passed."""

    facts: list[NodeFacts]
    image_id: str
    ompi: int | None  # Open MPI major of the image (its label), None when unlabelled
    subnet: str | None = None  # where NIC names differ: Open MPI's subnet (nic.tcp_include)
    timeline: timeline.Timeline = ()  # each node's `container` phase (its sshd's comes later: on_phase)
    standby: str = ""  # the host whose container waits for the supervisor (launch/node/standby.sh)


@dataclass(frozen=True)
class Pulled:
    """What the pull step leaves to the start step: its pull policy (`missing` once the image
    was pulled here first: a node whose pull failed but holds an image of that name uses it)."""

    policy: str
    timeline: timeline.Timeline = ()  # each node's pull (0 s where it held the image)
    lazy: frozenset[str] = frozenset()  # the hosts that pulled it lazily (SOCI): the start prefetches there
