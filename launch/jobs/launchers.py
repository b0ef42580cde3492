"""One small class per launcher (as DeepSpeed's multinode_runner.py): the same job description
and the nodes' facts in, the command to run in a node's container out.

    name       what --launcher names
    per_node   False: one command in the first node's container starts every rank over ssh
               (mpirun, horovodrun); True: one command in every node's container (torchrun)
    needs_ssh  the containers' sshd must answer node to node before the command (readiness
               check), and the image's Open MPI major version matters
    ssh_here   the command reaches its own node's sshd too (torchrun: the supervisor's ssh to
               every node; horovodrun: its own check of every host); False: the readiness check
               leaves that node out (mpirun starts the ranks there without ssh)
    argv(spec, facts, rank, iface, ompi, subnet)  the command for node `rank` (0 when not per_node):
               commands.attempt_argv, the builder the supervisor calls on a restart too
    exec_env(iface)  variables set by `docker exec -e` (non-secret; the user's --env come after
               them, from the job's env file: launch/node/run.sh)

The user's --env values never appear here: commands name the variables (`-x NAME`), and the
values reach the command's environment from a file (env_file).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from dtrain import contract
from dtrain.launch.jobs import commands

if TYPE_CHECKING:
    from dtrain.launch.jobs.job import JobSpec, NodeFacts

CONTAINER_SSH_MUX = commands.CONTAINER_SSH_MUX  # the builders' (launch/jobs/commands.py)
MPI_DEFAULTS = commands.MPI_DEFAULTS
mpi_defaults = commands.mpi_defaults


def env_file(env: Mapping[str, str]) -> str:
    """The job's --env values as the container reads them (launch/node/run.sh): NAME=base64 lines."""
    return "".join(f"{k}={base64.b64encode(v.encode()).decode()}\n" for k, v in env.items())


def launch_command(spec: JobSpec, ompi: int = 4, subnet: str | None = None) -> commands.LaunchCommand:
    """The job's launcher command apart from its nodes (the supervisor's plan holds it)."""
    extra = ((("DTRAIN_CHECKPOINT_DIR", spec.checkpoint_dir),) if spec.checkpoint_dir else ()) + (
        (contract.CHECKPOINT_NOW_VAR, contract.CHECKPOINT_NOW),)
    return commands.LaunchCommand(
        launcher=spec.launcher, command=tuple(spec.command), env_names=tuple(spec.env), forward=tuple(spec.forward),
        extra_env=extra, mca=tuple(spec.extra_mca), ompi=ompi, subnet=subnet, master_port=spec.master_port,
        rdzv=spec.rdzv, job=spec.name,
        rank_output=contract.node_script("rank_output.py") if spec.launcher in ("mpirun", "horovodrun") else "")


def plan_nodes(facts: Sequence[NodeFacts]) -> list[commands.PlanNode]:
    """The nodes as the plan and the builders take them, in rank order."""
    return [commands.PlanNode(f.address, f.hostname, f.node.slots, f.iface) for f in facts]


class Mpirun:
    name = "mpirun"
    per_node = False
    needs_ssh = True
    ssh_here = False

    def argv(self, spec: JobSpec, facts: Sequence[NodeFacts], rank: int, iface: str, ompi: int = 4,
             subnet: str | None = None) -> list[str]:
        """The command run on node `rank` (0: the first, where mpirun and horovodrun run; ompi:
        5 renamed plm_rsh_args to plm_ssh_args; subnet: where nodes name their NICs differently,
        Open MPI by subnet and each rank on its own NIC). iface: the NIC the first node's
        command names (the nodes' own, where they differ)."""
        nodes = plan_nodes(facts)
        nodes[rank] = replace(nodes[rank], iface=iface)
        argvs = commands.attempt_argv(launch_command(spec, ompi, subnet), nodes)
        return argvs[rank if self.per_node else 0]

    def exec_env(self, iface: str) -> dict[str, str]:
        return {}


class Horovodrun(Mpirun):
    name = "horovodrun"
    ssh_here = True


class Torchrun(Mpirun):
    name = "torchrun"
    per_node = True
    needs_ssh = False
    ssh_here = True

    def exec_env(self, iface: str) -> dict[str, str]:
        return commands.torchrun_env(iface)


class Ray:
    """Ray: `ray start` in every container (node_argv: the head on the first node, workers
    joining it), then argv, the command as a Ray driver in the head's container."""

    name = "ray"
    per_node = False
    needs_ssh = False
    ssh_here = True

    @staticmethod
    def head_address(facts: Sequence[NodeFacts]) -> str:
        return f"{facts[0].address}:{commands.RAY_PORT}"

    def node_argv(self, facts: Sequence[NodeFacts], rank: int) -> list[str]:
        f = facts[rank]
        if rank == 0:
            return commands.ray_head_argv(commands.RAY_PORT, node_ip=f.address)
        return commands.ray_worker_argv(self.head_address(facts), node_ip=f.address)

    def argv(self, spec: JobSpec, facts: Sequence[NodeFacts], rank: int, iface: str, ompi: int = 4,
             subnet: str | None = None) -> list[str]:
        return commands.ray_job_argv(self.head_address(facts), list(spec.command))

    def exec_env(self, iface: str) -> dict[str, str]:
        return commands.ray_env(iface)


LAUNCHERS = {c.name: c() for c in (Mpirun, Horovodrun, Torchrun, Ray)}
