"""Ray: `ray start` in every container (node_argv: the head on the first node, workers joining
it), then argv, the command as a Ray driver in the head's container (launch/jobs/job.py
_run_ray; builders: commands.ray_head_argv, ray_worker_argv, ray_job_argv, RAY_PORT)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dtrain.launch.jobs import commands
from dtrain.launch.jobs.launchers.base import Launcher

if TYPE_CHECKING:
    from dtrain.launch.jobs.job import JobSpec, NodeFacts


class Ray(Launcher):
    name = "ray"
    supervised = False
    starts_cluster = True
    manifests = True

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
