"""One small class per launcher (as DeepSpeed's multinode_runner.py): the same job description
and the nodes' facts in, the command to run in a node's container out.

    name       what --launcher names
    per_node   False: one command in the first node's container starts every rank over ssh
               (mpirun, horovodrun); True: one command in every node's container (torchrun)
    needs_ssh  the containers' sshd must answer node to node before the command (readiness
               check), and the image's Open MPI major version matters
    argv(spec, facts, rank, iface, ompi, subnet)  the command for node `rank` (0 when not per_node)
    exec_env(iface)  variables set by `docker exec -e` (non-secret; the user's --env come after
               them, from the job's env file: launch/node/run.sh)

The user's --env values never appear here: commands name the variables (`-x NAME`), and the
values reach the command's environment from a file (env_file).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from dtrain import contract
from dtrain.launch.jobs import commands
from dtrain.launch.jobs.hosts import Node

if TYPE_CHECKING:
    from dtrain.launch.jobs.job import JobSpec, NodeFacts

# ssh inside the first container: the readiness check opens one master connection per node
# and mpirun's daemon launch (all from that container: no tree spawn) reuses them.
CONTAINER_SSH_MUX = ("-o", "ControlMaster=auto", "-o", "ControlPath=/tmp/dtrain-mux-%C",
                     "-o", "ControlPersist=600", *contract.ssh_keepalive_opts())  # keepalives: a lost link ends it


def env_file(env: Mapping[str, str]) -> str:
    """The job's --env values as the container reads them (launch/node/run.sh): NAME=base64 lines."""
    return "".join(f"{k}={base64.b64encode(v.encode()).decode()}\n" for k, v in env.items())


def _addresses(facts: Sequence[NodeFacts]) -> list[Node]:
    return [Node(f.address, f.node.slots) for f in facts]


# Open MPI settings every mpirun gets unless --mca sets them: the first container starts every
# node's daemon over the connections the ready step left; two TCP connections per peer for MPI
# traffic (EC2 caps one flow at 5 Gbit/s outside a cluster placement group; on the simulated
# cluster the CPU allreduce's busbw went from 0.53 to 0.99 of raw TCP, docs/benchmarks.md).
MPI_DEFAULTS = (("plm_rsh_no_tree_spawn", "1"), ("btl_tcp_links", "2"))


def mpi_defaults(extra: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """MPI_DEFAULTS less the keys the user's --mca sets."""
    given = {k for k, _ in extra}
    return [(k, v) for k, v in MPI_DEFAULTS if k not in given]


class Mpirun:
    name = "mpirun"
    per_node = False
    needs_ssh = True

    def argv(self, spec: JobSpec, facts: Sequence[NodeFacts], rank: int, iface: str, ompi: int = 4,
             subnet: str | None = None) -> list[str]:
        """mpirun in the first container (ompi: 5 renamed plm_rsh_args to plm_ssh_args; subnet:
        where nodes name their NICs differently, Open MPI by subnet and each rank on its own NIC)."""
        build = commands.mpirun_argv if subnet is None else \
            (lambda *a, **k: commands.mpirun_mixed_argv(*a, subnet=subnet, **k))
        argv = build(_addresses(facts), list(spec.command), iface=iface,
                     env_names=list(spec.env), forward=list(spec.forward),
                     ssh_port=contract.SSH_PORT, ompi_major=ompi, ssh_options=CONTAINER_SSH_MUX,
                     extra_mca=[*mpi_defaults(spec.extra_mca), *spec.extra_mca])
        return [argv[0], "--tag-output", *argv[1:]]

    def exec_env(self, iface: str) -> dict[str, str]:
        return {}


class Horovodrun(Mpirun):
    name = "horovodrun"

    def argv(self, spec: JobSpec, facts: Sequence[NodeFacts], rank: int, iface: str, ompi: int = 4,
             subnet: str | None = None) -> list[str]:
        return commands.horovodrun_argv(_addresses(facts), list(spec.command), iface=iface,
                                        ssh_port=contract.SSH_PORT, env_names=list(spec.env))


class Torchrun:
    name = "torchrun"
    per_node = True
    needs_ssh = False

    def argv(self, spec: JobSpec, facts: Sequence[NodeFacts], rank: int, iface: str, ompi: int = 4,
             subnet: str | None = None) -> list[str]:
        run = commands.torchrun_argv(len(facts), rank, facts[rank].node.slots, facts[0].address, spec.master_port,
                                     list(spec.command), rdzv=spec.rdzv, job_id=spec.name)
        return [run[0], "--tee", "3", *run[1:]]

    def exec_env(self, iface: str) -> dict[str, str]:
        return commands.torchrun_env(iface)


class Ray:
    """Ray: `ray start` in every container (node_argv: the head on the first node, workers
    joining it), then argv, the command as a Ray driver in the head's container."""

    name = "ray"
    per_node = False
    needs_ssh = False

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
