"""mpirun: one command in the first node's container starts every rank over the containers'
sshd (Open MPI; builders: mpirun_argv, mpi_flags, mpirun_mixed_argv)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dtrain import contract
from dtrain.launch.jobs import container, nic, runplan
from dtrain.launch.jobs.container import check_env_names
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs.launchers.base import Attempt, Launcher, PreflightResult, attempt_of, check_command, total_slots
from dtrain.launch.remote.hosts import Node, hosts_list


# --- the argv (mpirun_argv; mpi_flags: every flag but -np/-H) -------------------------

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


def mpi_flags(
    *,
    iface: str,
    ompi_major: int = 4,
    env: Mapping[str, str] | None = None,
    forward: Sequence[str] = (),
    ssh: Sequence[str] | None = None,
    extra_mca: Sequence[tuple[str, str]] = (),
    env_names: Sequence[str] = (),
) -> list[str]:
    """Every mpirun flag but -np/-H: the one place the MPI contract lives (Open MPI 4 or 5).

    ssh: the ssh options of mpirun's daemon launch, one MCA value (container.ssh_options; None:
    its default, `-p 2022`; empty: ssh's own defaults). User env
    overrides the built-in values in place; extra_mca overrides built-in MCA params of the same name.
    env_names: user variables whose values mpirun takes from its own environment (`-x NAME`, so
    no value is in the argv), replacing built-in values in place as env does.
    """
    env = dict(env or {})
    check_env_names(env, "env")
    check_env_names(forward, "forward")
    check_env_names(env_names, "env")
    if ompi_major < 3:
        raise ValueError(f"Open MPI {ompi_major} is not supported (3, 4 or 5)")
    mca: dict[str, str] = {
        "pml": "ob1",
        "btl": "^openib",
        "btl_tcp_if_include": iface,
        "oob_tcp_if_include": iface,
    }
    rsh_args = container.ssh_options() if ssh is None else list(ssh)
    if rsh_args:
        # One argv element "-p 2022 -o ..."; Open MPI 5 (PRRTE) renamed the rsh launcher to ssh.
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
    ssh: Sequence[str] | None = None,
    extra_mca: Sequence[tuple[str, str]] = (),
    hostfile: str | None = None,
    np: int | None = None,
    env_names: Sequence[str] = (),
) -> list[str]:
    """`mpirun --allow-run-as-root -np N -H h:s,... <mpi_flags> command...` (no shell).

    Either nodes (-H, N = their slots) or hostfile + np (`-np N --hostfile PATH`, for a host
    list written by someone else, e.g. the MPI operator's /etc/mpi/hostfile), never both.
    """
    check_command(command, "mpirun_argv")
    if (nodes is None) == (hostfile is None):
        raise ValueError("mpirun_argv: give exactly one of nodes or hostfile")
    if hostfile is not None:
        if np is None or np < 1:
            raise ValueError(f"mpirun_argv: a hostfile needs np > 0, got {np!r}")
        hosts = ["--hostfile", hostfile]
    else:
        if np is not None:
            raise ValueError("mpirun_argv: np comes from the nodes' slots; pass it only with hostfile")
        np = total_slots(nodes, "mpirun_argv")
        hosts = ["-H", hosts_list(nodes)]
    return [
        "mpirun", "--allow-run-as-root", "-np", str(np), *hosts,
        *mpi_flags(iface=iface, ompi_major=ompi_major, env=env, forward=forward,
                   ssh=ssh, extra_mca=extra_mca, env_names=env_names),
        *command,
    ]  # fmt: skip


def mpirun_mixed_argv(
    nodes: Sequence[Node],
    command: Sequence[str],
    *,
    subnet: str,
    iface: str,
    **kw,
) -> list[str]:
    """mpirun_argv for nodes whose NICs are named differently: Open MPI's TCP paths by subnet
    (btl/oob_tcp_if_include SUBNET), and each rank's command run through nic.NODE_ENV_WRAPPER,
    which sets NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME to its node's own NIC. iface: the value
    every rank gets before the wrapper replaces it (the first node's NIC)."""
    ipaddress.ip_network(subnet)  # ValueError: a programming mistake
    extra = [("btl_tcp_if_include", subnet), ("oob_tcp_if_include", subnet), *kw.pop("extra_mca", ())]
    return mpirun_argv(nodes, [nic.NODE_ENV_WRAPPER, *command], iface=iface, extra_mca=extra, **kw)


# Open MPI settings every mpirun gets unless --mca sets them: the first container starts every
# node's daemon over the connections the ready step left; two TCP connections per peer for MPI
# traffic (EC2 caps one flow at 5 Gbit/s outside a cluster placement group; on the simulated
# cluster the CPU allreduce's busbw went from 0.53 to 0.99 of raw TCP, docs/benchmarks.md).
MPI_DEFAULTS = (("plm_rsh_no_tree_spawn", "1"), ("btl_tcp_links", "2"))
# Open MPI 4 only (ORTE's name; PRRTE's differs): the session directories on each container's
# tmpfs (contract.MPI_TMPDIR) instead of /tmp on overlayfs.
MPI4_DEFAULTS = (("orte_tmpdir_base", contract.MPI_TMPDIR),)
# Where the user chose the session directories' place, by --mca or --env, no MPI4_DEFAULTS: ORTE
# refuses orte_tmpdir_base beside either of the other two (it exits), and TMPDIR is its default.
TMPDIR_KEYS = ("orte_tmpdir_base", "orte_local_tmpdir_base", "orte_remote_tmpdir_base")
TMPDIR_VARS = ("TMPDIR", *(f"OMPI_MCA_{k}" for k in TMPDIR_KEYS))


def mpi_defaults(extra: Sequence[tuple[str, str]], ompi: int = 4, env_names: Sequence[str] = ()) -> list[tuple[str, str]]:
    """MPI_DEFAULTS (and MPI4_DEFAULTS for Open MPI 3 and 4) less the keys the user's --mca sets:
    for mpirun in a job's container (dtrain launch), which has the tmpfs. env_names: the job's
    --env and --forward names; one of TMPDIR_VARS, or a TMPDIR_KEYS key in extra, leaves the
    tmpdir out."""
    given = {k for k, _ in extra}
    chosen = bool(given & set(TMPDIR_KEYS) or set(env_names) & set(TMPDIR_VARS))
    mpi4 = MPI4_DEFAULTS if ompi < 5 and not chosen else ()
    return [(k, v) for k, v in (*MPI_DEFAULTS, *mpi4) if k not in given]


def ompi_major(version_output: str) -> int:
    """`mpirun --version` -> 4 for 'mpirun (Open MPI) 4.1.4'; 5 for PRRTE's 'mpirun (Open MPI) 5.0.3'."""
    m = re.search(r"\(Open MPI\) (\d+)\.", version_output)
    if not m:
        raise LaunchError(f"the image's mpirun is not Open MPI: {version_output.strip()[:200]!r}")
    return int(m.group(1))


class OpenMpiTool:
    """The preflight of a launcher that runs Open MPI's mpirun (mpirun, horovodrun): where the
    image's label does not say Open MPI's major version, ask its mpirun."""

    def preflight(self, ompi: int | None) -> list[str] | None:
        return ["mpirun", "--version"] if ompi is None else None

    def preflight_result(self, output: str) -> PreflightResult:
        ompi = ompi_major(output)
        return PreflightResult(ompi, f"Open MPI {ompi} in the image")


class Mpirun(OpenMpiTool, Launcher):
    name = "mpirun"
    ranks_over_ssh = True
    ssh_here = False
    rank_output = True
    mpi_ranks = True
    sagemaker = True
    manifests = True

    def attempt(self, run: runplan.LaunchCommand, nodes: Sequence[runplan.PlanNode]) -> Attempt:
        """mpirun in the first node's container, -np/-H from nodes, Open MPI's TCP and NCCL on
        the first node's NIC (by subnet and each rank's own NIC where nodes name theirs apart)."""
        if not nodes:
            raise ValueError("attempt_argv: no nodes")
        peers = [Node(n.address, n.slots) for n in nodes]
        extra = [k for k, _ in run.extra_env]
        kw: dict[str, Any] = dict(
            iface=nodes[0].iface, env_names=list(run.env_names), ssh=container.mpirun_ssh(),
            forward=[*run.forward, runplan.RESTART_VAR, *extra], ompi_major=run.ompi,
            extra_mca=[*mpi_defaults(run.mca, run.ompi, [*run.env_names, *run.forward]), *run.mca])
        command = runplan.rank_output_argv(run.rank_output, run.command)
        argv = (mpirun_argv(peers, command, **kw) if run.subnet is None
                else mpirun_mixed_argv(peers, command, subnet=run.subnet, **kw))
        return attempt_of([argv if run.rank_output else [argv[0], "--tag-output", *argv[1:]]])

    def sagemaker_argv(self, hosts: Sequence[str], rank: int, iface: str, slots: int, command: Sequence[str],
                       forward: Sequence[str], ssh: Sequence[str]) -> list[str] | None:
        """The first host runs mpirun across every host; the others only serve its ssh."""
        if rank != 0:
            return None
        return mpirun_argv([Node(h, slots) for h in hosts], list(command), iface=iface, forward=forward, ssh=ssh)
