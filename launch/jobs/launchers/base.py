"""What a launcher provides: a small strategy, as DeepSpeed's launcher/multinode_runner.py
runners are. The same job description and the nodes in; an attempt out (the argv, the env,
the files to put on the node, how its output names ranks); the launcher checks its own tool,
validates its own nodes and, where it is not run under the supervisor, runs its own protocol.
Nothing here is a boolean with a second meaning: each declaration says one thing.

    name          what --launcher names (the registry's key: launch/jobs/launchers/__init__.py)
    placement     where an attempt's command runs: FIRST_NODE (one command in the first node's
                  container starts every rank over ssh: mpirun, horovodrun, deepspeed),
                  EVERY_NODE (one command in every node's container, each started by the
                  supervisor over the job's ssh, through run.sh: torchrun, accelerate), or
                  ITS_OWN (not under the supervisor: the launcher's `run` drives the nodes: Ray)
    output        how the attempt's lines name their rank (RankOutput): MPI_TAGS
                  (`[1,R]<stdout>:`, rank_output.py or --tag-output), NODE_LINES (each node's
                  lines, torchrun's `[defaultN]:` local ranks), or none with the one line the
                  launch says: hang detection, the first-step timeline and straggler naming read
                  ranks from these lines, and do nothing for a launcher whose lines name none
    ranks_over_ssh  the ranks reach the other nodes' sshd (the containers' sshd must answer node
                  to node before the command; a SageMaker job or a manifest across nodes needs
                  the job key)
    ssh_here      the command reaches its own node's sshd too (torchrun: the supervisor's ssh to
                  every node; horovodrun: its own check of every host); False: the readiness check
                  leaves that node out (mpirun starts the ranks there without ssh)
    rank_output   each rank's command runs under launch/node/rank_output.py, which tags its lines
    mpi_ranks     the ranks are MPI processes: an MPI program (all_reduce_perf) runs under it
    starts_cluster  starts its own cluster on every node (a head, workers) and runs the command
                  as its driver (Ray); on ECS its own task definitions (template ecs-NAME)
    sagemaker     `dtrain sagemaker run` takes it: sagemaker_argv is SageMaker's `train` command
    manifests     `dtrain manifest --launcher` takes it
    flight_recorder  the ranks are PyTorch processes whose flight recorder dtrain turns on and reads
                  on a hang or a failed attempt (launch/jobs/flightrec.py)

    attempt(run, nodes) -> Attempt  one attempt's command (a supervised launcher): argvs (one
                  for the first node, or one per node where EVERY_NODE), env (the launcher
                  command's environment), files (put in the job's directory of the first node's
                  container before the command runs)
    preflight(ompi) / preflight_result(output)  the check of the launcher's own tool in the first
                  node's container once every node's sshd answers (mpirun: `mpirun --version`,
                  Open MPI's major version); None: nothing to check
    check_nodes(ifaces)  the launcher's own rule on the nodes (horovodrun: one NIC name)
    run(session)  an ITS_OWN launcher's protocol (Ray: head, workers, the driver)
    sagemaker_argv(hosts, rank, iface, slots, command, forward)  SageMaker's `train` command on
                  host `rank` (launch/node/sagemaker_train.py asks the registry for it)
    argv(spec, facts, rank, iface, ompi, subnet)  the command for node `rank` (0 when FIRST_NODE)
    exec_env(iface)  variables set by `docker exec -e` (non-secret; the user's --env come after
                  them, from the job's env file: launch/node/run.sh)
    notes(spec, nodes)  warnings said before the job starts (Ray: no shared storage across nodes)

The user's --env values never appear here: commands name the variables (`-x NAME`), and the
values reach the command's environment from a file (env_file).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from dtrain import contract
from dtrain.launch.jobs import runplan
from dtrain.launch.remote.hosts import Node

if TYPE_CHECKING:
    from dtrain.launch.jobs.spec import JobSpec, NodeFacts

# --- what a launcher declares ------------------------------------------------------------

FIRST_NODE = "first-node"  # one command in the first node's container starts every rank
EVERY_NODE = "every-node"  # one command in every node's container, started by the supervisor
ITS_OWN = "its-own"  # not under the supervisor: the launcher's run() drives the nodes
PLACEMENTS = (FIRST_NODE, EVERY_NODE, ITS_OWN)


@dataclass(frozen=True)
class RankOutput:
    """How an attempt's lines name the rank that wrote them: `reader` is what reads them
    (supervision.Render: "mpi-tags" -> output.MpiOutput, "node-lines" -> output.prefix_line);
    "" where the lines name no rank, and `why_not` is the one line the launch says then
    (hang detection, the first-step timeline and straggler naming need each line's rank)."""

    reader: str
    why_not: str = ""

    def __post_init__(self) -> None:
        if self.reader not in ("mpi-tags", "node-lines", ""):
            raise ValueError(f"RankOutput: unknown reader {self.reader!r}")
        if not self.reader and not self.why_not:
            raise ValueError("RankOutput: a launcher whose lines name no rank says why (why_not)")

    @property
    def attributed(self) -> bool:
        return bool(self.reader)


# `[1,R]<stdout>:` before each line (launch/node/rank_output.py, or Open MPI's --tag-output)
MPI_TAGS = RankOutput("mpi-tags")
# each node's lines, tagged with the node by the supervisor; torchrun's `[defaultN]:` local ranks
NODE_LINES = RankOutput("node-lines")


@dataclass(frozen=True)
class Attempt:
    """One attempt's command, as the supervisor runs it (launch/node/supervise.py start)."""

    argvs: tuple[tuple[str, ...], ...]  # [the first node's] (FIRST_NODE) or one per node (EVERY_NODE)
    env: tuple[tuple[str, str], ...] = ()  # the launcher command's environment (non-secret values)
    # (name, text): written into the job's directory of the first node's container (run.files_dir)
    # before the command runs, every attempt (a hostfile of the attempt's nodes)
    files: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.argvs or not all(self.argvs):
            raise ValueError("Attempt: no command")
        for name, _ in self.files:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", name):
                raise ValueError(f"Attempt: file name {name!r} must be a plain name in the job's directory")


def attempt_of(argvs: Sequence[Sequence[str]], env: Mapping[str, str] | None = None,
               files: Mapping[str, str] | None = None) -> Attempt:
    return Attempt(tuple(tuple(a) for a in argvs), tuple((env or {}).items()), tuple((files or {}).items()))


@dataclass(frozen=True)
class PreflightResult:
    """What the preflight found: Open MPI's major version where the tool says it (the plan's
    `ompi`), and the words the launch says."""

    ompi: int | None
    said: str


class Session(Protocol):
    """What an ITS_OWN launcher's run() gets from the launch (launch/jobs/job.py OwnRun): the
    job, its started nodes and how to reach them."""

    spec: JobSpec
    facts: Sequence[NodeFacts]

    def say(self, line: str) -> None: ...

    def in_container(self, argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
        """argv run in the job's container through run.sh (the job's --env values from its file,
        the workdir as the other launchers start in), docker exec -e env."""
        ...

    def exec(self, argv: Sequence[str]) -> list[str]:
        """argv run in the job's container as it is (docker exec)."""
        ...

    def on(self, facts: Sequence[NodeFacts], argv_of: Callable[[NodeFacts], list[str]], timeout: float,
           what: str) -> None:
        """argv_of(node) on each of these nodes at once; LaunchError naming a node that failed
        `what` ("": failures not checked)."""
        ...

    def stream(self, fact: NodeFacts, argv: Sequence[str]) -> int:
        """argv on that node, its output the job's (`[hostname] line`), until --timeout; its exit code."""
        ...

    def closing(self) -> bool:
        """The launch is ending (interrupted, timed out): its teardown removes the containers."""
        ...


def check_command(command: Sequence[str], who: str) -> None:
    if not command or isinstance(command, str):
        raise ValueError(f"{who}: command must be a non-empty list of strings, got {command!r}")


def total_slots(nodes: Sequence[Node], who: str) -> int:
    if not nodes:
        raise ValueError(f"{who}: no nodes")
    return sum(n.slots for n in nodes)


def script_argv(command: Sequence[str]) -> list[str]:
    """The command as a launcher that runs the script with its own Python takes it (torchrun,
    accelerate launch): `python train.py` (the form mpirun takes) becomes `train.py`, and
    `python -m pkg` becomes `-m pkg`."""
    command = list(command)
    if len(command) > 1 and re.fullmatch(r"(.*/)?python(3(\.\d+)?)?", command[0]):
        command = command[1:]
    return command


def plan_nodes(facts: Sequence[NodeFacts]) -> list[runplan.PlanNode]:
    """The nodes as the plan and the builders take them, in rank order."""
    return [runplan.PlanNode(f.address, f.hostname, f.node.slots, f.iface, f.gpus) for f in facts]


def launch_command(spec: JobSpec, launcher: Launcher, ompi: int = 4, subnet: str | None = None
                   ) -> runplan.LaunchCommand:
    """The job's launcher command apart from its nodes (the supervisor's plan holds it)."""
    extra = ((("DTRAIN_CHECKPOINT_DIR", spec.checkpoint_dir),) if spec.checkpoint_dir else ()) + (
        (contract.CHECKPOINT_NOW_VAR, contract.CHECKPOINT_NOW),)
    return runplan.LaunchCommand(
        launcher=spec.launcher, command=tuple(spec.command), env_names=tuple(spec.env), forward=tuple(spec.forward),
        extra_env=extra, mca=tuple(spec.extra_mca), ompi=ompi, subnet=subnet, master_port=spec.master_port,
        rdzv=spec.rdzv, job=spec.name, per_node=launcher.per_node,
        rank_output=contract.node_script("rank_output.py") if launcher.rank_output else "")


class Launcher:
    """The defaults a launcher module overrides (a supervised launcher run from the first node)."""

    name = ""
    placement = FIRST_NODE
    output: RankOutput = MPI_TAGS
    ranks_over_ssh = False
    ssh_here = True
    rank_output = False
    mpi_ranks = False
    starts_cluster = False
    sagemaker = False
    manifests = False
    flight_recorder = False

    # derived, for the registry's names(**having) and the node programs' plan (runplan.per_node)
    @property
    def per_node(self) -> bool:
        return self.placement == EVERY_NODE

    @property
    def supervised(self) -> bool:
        return self.placement != ITS_OWN

    def attempt(self, run: runplan.LaunchCommand, nodes: Sequence[runplan.PlanNode]) -> Attempt:
        raise NotImplementedError(f"{self.name} is not run under the supervisor")

    def attempt_argv(self, run: runplan.LaunchCommand, nodes: Sequence[runplan.PlanNode]) -> list[list[str]]:
        """The attempt's argvs (attempt(run, nodes).argvs) as lists."""
        return [list(a) for a in self.attempt(run, nodes).argvs]

    def preflight(self, ompi: int | None) -> list[str] | None:
        """The check of this launcher's own tool, run in the first node's container once every
        node's sshd answers (ompi: Open MPI's major version where the image's label says it);
        None: nothing to check."""
        return None

    def preflight_result(self, output: str) -> PreflightResult:
        """The preflight's output -> what it found; LaunchError (one line) where the tool is not
        what this launcher needs."""
        return PreflightResult(None, "")

    def check_nodes(self, ifaces: Mapping[str, str]) -> None:
        """The launcher's own rule on the started nodes ({host: the job's NIC there}):
        LaunchError (one line) where they do not fit it."""

    def run(self, session: Session) -> int:
        """An ITS_OWN launcher's protocol on the started nodes; its exit code."""
        raise NotImplementedError(f"{self.name} runs under the supervisor")

    def sagemaker_argv(self, hosts: Sequence[str], rank: int, iface: str, slots: int, command: Sequence[str],
                       forward: Sequence[str], ssh: Sequence[str]) -> list[str] | None:
        """SageMaker's `train` command on host `rank` of `hosts` (sorted; launch/node/
        sagemaker_train.py); None: that host runs nothing (the first host starts every rank).
        ssh: the ssh options its ranks reach the other hosts with."""
        raise NotImplementedError(f"{self.name} does not run on SageMaker")

    def argv(self, spec: JobSpec, facts: Sequence[NodeFacts], rank: int, iface: str, ompi: int = 4,
             subnet: str | None = None) -> list[str]:
        """The command run on node `rank` (0: the first, where mpirun and horovodrun run; ompi:
        5 renamed plm_rsh_args to plm_ssh_args; subnet: where nodes name their NICs differently,
        Open MPI by subnet and each rank on its own NIC). iface: the NIC the first node's
        command names (the nodes' own, where they differ)."""
        nodes = plan_nodes(facts)
        nodes[rank] = replace(nodes[rank], iface=iface)
        argvs = self.attempt_argv(launch_command(spec, self, ompi, subnet), nodes)
        return argvs[rank if self.per_node else 0]

    def exec_env(self, iface: str) -> dict[str, str]:
        return {}

    def notes(self, spec: JobSpec, nodes: int) -> list[str]:
        """Warnings the launch says before anything starts (one line each), for this job on
        `nodes` nodes: what the launcher needs that the job lacks (Ray: shared storage), and
        where its lines name no rank, what that leaves undone."""
        if self.output.attributed:
            return []
        return [f"{self.name}: hang detection, the first-step timeline and straggler naming read each line's "
                f"rank, and {self.output.why_not}"]
