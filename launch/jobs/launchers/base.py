"""What a launcher provides (one small class per launcher, as DeepSpeed's multinode_runner.py):
the same job description and the nodes in, the command to run in a node's container out, and
the properties the rest of dtrain asks instead of comparing launcher names.

    name          what --launcher names (the registry's key: launch/jobs/launchers/__init__.py)
    per_node      False: one command in the first node's container starts every rank over ssh
                  (mpirun, horovodrun); True: one command in every node's container (torchrun)
    needs_ssh     the containers' sshd must answer node to node before the command (readiness
                  check; a SageMaker job across instances needs the job key), and the image's
                  Open MPI major version matters
    ssh_here      the command reaches its own node's sshd too (torchrun: the supervisor's ssh to
                  every node; horovodrun: its own check of every host); False: the readiness check
                  leaves that node out (mpirun starts the ranks there without ssh)
    rank_output   each rank's command runs under launch/node/rank_output.py, which tags its lines
    supervised    the command runs under launch/node/supervise.py (restarts, spares, --detach,
                  --hang-timeout); False: the launcher runs its own steps (Ray's cluster)
    same_iface    every node must name the job's NIC alike (horovodrun: one --network-interface)
    mpi_ranks     the ranks are MPI processes: an MPI program (all_reduce_perf) runs under it
    starts_cluster  starts its own cluster on every node (a head, workers) and runs the command
                  as its driver (Ray); on ECS its own task definitions (template ecs-NAME)
    sagemaker     `dtrain sagemaker run` takes it (launch/node/sagemaker_train.py runs it)
    manifests     `dtrain manifest --launcher` takes it

    attempt_argv(run, nodes)  the command of one attempt (a supervised launcher): [argv] for the
                  first node, or one argv per node where per_node
    argv(spec, facts, rank, iface, ompi, subnet)  the command for node `rank` (0 when not per_node)
    exec_env(iface)  variables set by `docker exec -e` (non-secret; the user's --env come after
                  them, from the job's env file: launch/node/run.sh)
    notes(spec, nodes)  warnings said before the job starts (Ray: no shared storage across nodes)

The user's --env values never appear here: commands name the variables (`-x NAME`), and the
values reach the command's environment from a file (env_file).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from dtrain import contract
from dtrain.launch.jobs import runplan
from dtrain.launch.remote.hosts import Node

if TYPE_CHECKING:
    from dtrain.launch.jobs.job import JobSpec, NodeFacts


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
    per_node = False
    needs_ssh = False
    ssh_here = True
    rank_output = False
    supervised = True
    same_iface = False
    mpi_ranks = False
    starts_cluster = False
    sagemaker = False
    manifests = False

    def attempt_argv(self, run: runplan.LaunchCommand, nodes: Sequence[runplan.PlanNode]) -> list[list[str]]:
        raise NotImplementedError(f"{self.name} is not run under the supervisor")

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
        `nodes` nodes: what the launcher needs that the job lacks (Ray: shared storage)."""
        return []
