"""torchrun: one command in every node's container (the supervisor starts each over the job's
ssh), --nnodes and --node_rank from the attempt's nodes, NCCL and Gloo on each node's own NIC
(torchrun_argv, torchrun_env; the master port: contract.MASTER_PORT)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from dtrain import contract
from dtrain.launch.jobs import nic, runplan
from dtrain.launch.jobs.launchers.base import (EVERY_NODE, NODE_LINES, Attempt, Launcher, attempt_of, check_command,
                                               script_argv)


# --- the argv -------------------------------------------------------------------------

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
    check_command(command, "torchrun_argv")
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


def torchrun_env(iface: str) -> dict[str, str]:
    """NCCL and Gloo (c10d's store and CPU collectives) on the chosen NIC."""
    return nic.socket_env(iface)


class Torchrun(Launcher):
    name = "torchrun"
    placement = EVERY_NODE
    output = NODE_LINES  # `--tee 3`: `[defaultN]:` before each local rank's line
    sagemaker = True
    manifests = True
    flight_recorder = True

    def attempt(self, run: runplan.LaunchCommand, nodes: Sequence[runplan.PlanNode]) -> Attempt:
        if not nodes:
            raise ValueError("attempt_argv: no nodes")
        out = []
        for rank, n in enumerate(nodes):
            t = torchrun_argv(len(nodes), rank, n.slots, nodes[0].address, run.master_port,
                                       list(run.command), rdzv=run.rdzv, job_id=run.job)
            env = {**torchrun_env(n.iface), **dict(run.extra_env)}
            out.append(["env", *(f"{k}={v}" for k, v in env.items()), t[0], "--tee", "3", *t[1:]])
        return attempt_of(out)

    def sagemaker_argv(self, hosts: Sequence[str], rank: int, iface: str, slots: int, command: Sequence[str],
                       forward: Sequence[str], ssh: Sequence[str]) -> list[str] | None:
        """Every host runs torchrun, its node rank its place in the sorted hosts (SageMaker's
        `train` sets NCCL and Gloo on its NIC: exec_env)."""
        return torchrun_argv(len(hosts), rank, slots, hosts[0], contract.MASTER_PORT, list(command))

    def exec_env(self, iface: str) -> dict[str, str]:
        return torchrun_env(iface)
