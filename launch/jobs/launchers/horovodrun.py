"""horovodrun: one command in the first node's container (it runs mpirun or Gloo itself, and
forwards its whole environment to every rank: commands.horovodrun_argv)."""

from __future__ import annotations

from collections.abc import Sequence

from dtrain import contract
from dtrain.launch.jobs import commands
from dtrain.launch.jobs.launchers.base import Launcher
from dtrain.launch.remote.hosts import Node


class Horovodrun(Launcher):
    name = "horovodrun"
    needs_ssh = True
    ssh_here = True  # its own check of every host
    rank_output = True
    same_iface = True  # one --network-interface for all nodes
    mpi_ranks = True

    def attempt_argv(self, run: commands.LaunchCommand, nodes: Sequence[commands.PlanNode]) -> list[list[str]]:
        if not nodes:
            raise ValueError("attempt_argv: no nodes")
        peers = [Node(n.address, n.slots) for n in nodes]
        extra = [k for k, _ in run.extra_env]  # horovodrun forwards its whole environment (extra_env too)
        return [commands.horovodrun_argv(peers, commands.rank_output_argv(run.rank_output, run.command),
                                         iface=nodes[0].iface, ssh_port=contract.SSH_PORT,
                                         env_names=[*run.env_names, *extra])]
