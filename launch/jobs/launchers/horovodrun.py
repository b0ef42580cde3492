"""horovodrun: one command in the first node's container (it runs mpirun or Gloo itself, and
forwards its whole environment to every rank: horovodrun_argv)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dtrain import contract
from dtrain.launch.jobs import runplan
from dtrain.launch.jobs.container import check_env_names
from dtrain.launch.jobs import nic
from dtrain.launch.jobs.launchers.base import Attempt, Launcher, attempt_of, check_command, total_slots
from dtrain.launch.jobs.launchers.mpirun import OpenMpiTool, training_env
from dtrain.launch.remote.hosts import Node, hosts_list


# --- the argv -------------------------------------------------------------------------

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
    check_command(command, "horovodrun_argv")
    np = total_slots(nodes, "horovodrun_argv")
    variables = training_env(iface)
    variables.update(env or {})
    check_env_names(variables, "env")
    check_env_names(env_names, "env")
    for name in env_names:
        variables.pop(name, None)
    argv = ["env", *(f"{k}={v}" for k, v in variables.items())]
    argv += ["horovodrun", "-np", str(np), "-H", hosts_list(nodes)]
    if ssh_port is not None:
        argv += ["-p", str(ssh_port)]
    argv += ["--network-interface", iface, *command]
    return argv


class Horovodrun(OpenMpiTool, Launcher):
    name = "horovodrun"
    ranks_over_ssh = True
    ssh_here = True  # its own check of every host
    rank_output = True
    mpi_ranks = True

    def check_nodes(self, ifaces: Mapping[str, str]) -> None:
        """One --network-interface for all nodes: every node names the job's NIC alike."""
        nic.check_same_iface(ifaces)

    def attempt(self, run: runplan.LaunchCommand, nodes: Sequence[runplan.PlanNode]) -> Attempt:
        if not nodes:
            raise ValueError("attempt_argv: no nodes")
        peers = [Node(n.address, n.slots) for n in nodes]
        extra = [k for k, _ in run.extra_env]  # horovodrun forwards its whole environment (extra_env too)
        return attempt_of([horovodrun_argv(peers, runplan.rank_output_argv(run.rank_output, run.command),
                                           iface=nodes[0].iface, ssh_port=contract.SSH_PORT,
                                           env_names=[*run.env_names, *extra])])
