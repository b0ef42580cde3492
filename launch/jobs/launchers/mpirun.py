"""mpirun: one command in the first node's container starts every rank over the containers'
sshd (Open MPI; builders: commands.mpirun_argv, mpi_flags, mpirun_mixed_argv)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dtrain.launch.jobs import commands, container
from dtrain.launch.jobs.launchers.base import Launcher
from dtrain.launch.remote.hosts import Node


class Mpirun(Launcher):
    name = "mpirun"
    needs_ssh = True
    ssh_here = False
    rank_output = True
    mpi_ranks = True
    sagemaker = True
    manifests = True

    def attempt_argv(self, run: commands.LaunchCommand, nodes: Sequence[commands.PlanNode]) -> list[list[str]]:
        """mpirun in the first node's container, -np/-H from nodes, Open MPI's TCP and NCCL on
        the first node's NIC (by subnet and each rank's own NIC where nodes name theirs apart)."""
        if not nodes:
            raise ValueError("attempt_argv: no nodes")
        peers = [Node(n.address, n.slots) for n in nodes]
        extra = [k for k, _ in run.extra_env]
        kw: dict[str, Any] = dict(
            iface=nodes[0].iface, env_names=list(run.env_names), ssh=container.mpirun_ssh(),
            forward=[*run.forward, commands.RESTART_VAR, *extra], ompi_major=run.ompi,
            extra_mca=[*commands.mpi_defaults(run.mca), *run.mca])
        command = commands.rank_output_argv(run.rank_output, run.command)
        argv = (commands.mpirun_argv(peers, command, **kw) if run.subnet is None
                else commands.mpirun_mixed_argv(peers, command, subnet=run.subnet, **kw))
        return [argv if run.rank_output else [argv[0], "--tag-output", *argv[1:]]]
