"""Ray: `ray start` in every container (node_argv: the head on the first node, workers joining
it), then argv, the command as a Ray driver in the head's container (launch/jobs/job.py
_run_ray; builders: commands.ray_head_argv, ray_worker_argv, ray_job_argv, RAY_PORT).

Ray Train's storage: a TorchTrainer without RunConfig(storage_path) keeps its run under
`~/ray_results` (ray.train.constants.DEFAULT_STORAGE_PATH, expanded in the driver; Ray 2.60's
Train reads no variable for it: RAY_STORAGE only the old API's RunConfig, and Tune refuses
TUNE_RESULT_DIR and RAY_AIR_LOCAL_CACHE_DIR), and every worker checks a marker file the driver
wrote there: across nodes it must be one directory. With a writable --mount (a path every node
shares), every container's ~/ray_results is a link to MOUNT/ray_results (launch/node/
ray-storage.sh) before `ray start`; without one, across nodes, the launch says so (notes).
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dtrain.launch.jobs import commands, node_programs
from dtrain.launch.jobs.launchers.base import Launcher

RESULTS = "ray_results"  # the directory Ray Train's default storage_path names, under a shared --mount
# Ray Train's workers also hand each print() to a logger that writes it to the console again
# (ray/train/v2/_internal/logging/patch_print.py, where Ray's worker has replaced sys.stdout):
# every line a worker prints would reach the driver twice. Off: printed once, by Ray's own
# forwarding of the worker's output (a user's --env, read after these, can turn it on again).
NO_PRINT_PATCH = {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}

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

    @staticmethod
    def shared_storage(spec: JobSpec) -> str | None:
        """Ray Train's default storage on shared storage: MOUNT/ray_results on the job's first
        writable --mount (dtrain cannot tell a shared path from a node's own: a --mount is
        taken as shared, as --checkpoint-dir takes it); None without one."""
        writable = [m for m in spec.mounts if not m.readonly]
        return posixpath.join(writable[0].dst, RESULTS) if writable else None

    def notes(self, spec: JobSpec, nodes: int) -> list[str]:
        if nodes < 2 or self.shared_storage(spec):
            return []
        return ["ray: no writable --mount, so Ray Train's default storage (~/ray_results) is each "
                "container's own, and a TorchTrainer without RunConfig(storage_path=s3://... or a shared "
                "path) fails across nodes (\"Unable to set up cluster storage\"); give --mount PATH that "
                "every node shares (EFS: dtrain volume create --efs; the simulated cluster: dtrain cluster "
                "up --shared DIR:PATH)"]

    def node_argv(self, facts: Sequence[NodeFacts], rank: int, storage: str | None = None) -> list[str]:
        """`ray start` on node `rank`; storage: the shared directory ~/ray_results becomes a link to
        first (launch/node/ray-storage.sh), for Ray Train's default storage_path."""
        f = facts[rank]
        if rank == 0:
            argv = commands.ray_head_argv(commands.RAY_PORT, node_ip=f.address)
        else:
            argv = commands.ray_worker_argv(self.head_address(facts), node_ip=f.address)
        return node_programs.program_argv("ray-storage.sh", [storage, *argv]) if storage else argv

    def argv(self, spec: JobSpec, facts: Sequence[NodeFacts], rank: int, iface: str, ompi: int = 4,
             subnet: str | None = None) -> list[str]:
        return commands.ray_job_argv(self.head_address(facts), list(spec.command))

    def exec_env(self, iface: str) -> dict[str, str]:
        return commands.ray_env(iface) | NO_PRINT_PATCH
