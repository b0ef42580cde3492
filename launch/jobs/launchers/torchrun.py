"""torchrun: one command in every node's container (the supervisor starts each over the job's
ssh), --nnodes and --node_rank from the attempt's nodes, NCCL and Gloo on each node's own NIC
(commands.torchrun_argv, torchrun_env; the master port: contract.MASTER_PORT)."""

from __future__ import annotations

from collections.abc import Sequence

from dtrain.launch.jobs import commands
from dtrain.launch.jobs.launchers.base import Launcher


class Torchrun(Launcher):
    name = "torchrun"
    per_node = True
    sagemaker = True
    manifests = True

    def attempt_argv(self, run: commands.LaunchCommand, nodes: Sequence[commands.PlanNode]) -> list[list[str]]:
        if not nodes:
            raise ValueError("attempt_argv: no nodes")
        out = []
        for rank, n in enumerate(nodes):
            t = commands.torchrun_argv(len(nodes), rank, n.slots, nodes[0].address, run.master_port,
                                       list(run.command), rdzv=run.rdzv, job_id=run.job)
            env = {**commands.torchrun_env(n.iface), **dict(run.extra_env)}
            out.append(["env", *(f"{k}={v}" for k, v in env.items()), t[0], "--tee", "3", *t[1:]])
        return out

    def exec_env(self, iface: str) -> dict[str, str]:
        return commands.torchrun_env(iface)
