"""Ray: `ray start` in every container (node_argv: the head on the first node, workers joining
it), then argv, the command as a Ray driver in the head's container (launch/jobs/job.py
_run_ray; builders: ray_head_argv, ray_worker_argv, ray_job_argv, RAY_PORT)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dtrain import contract
from dtrain.launch.jobs.launchers.base import Launcher, check_command

if TYPE_CHECKING:
    from dtrain.launch.jobs.job import JobSpec, NodeFacts


# --- the argv of `ray start`, the wait and the driver ---------------------------------

RAY_PORT = 6379  # the head's GCS port: workers join HEAD:6379, the job's RAY_ADDRESS

# What a Ray node needs beside its address: no dashboard (not in the image), no usage report.
_RAY_COMMON = ["--include-dashboard=false", "--disable-usage-stats"]


def _ray_resources(node_ip: str | None, num_cpus: int | None, num_gpus: int | None,
                   block: bool) -> list[str]:
    argv = [f"--node-ip-address={node_ip}"] if node_ip else []
    for what, value in (("num-cpus", num_cpus), ("num-gpus", num_gpus)):
        if value is not None:
            if value < 0:
                raise ValueError(f"ray: --{what} {value} must be >= 0")
            argv.append(f"--{what}={value}")
    return argv + (["--block"] if block else [])


def ray_head_argv(port: int = RAY_PORT, *, node_ip: str | None = None, num_cpus: int | None = None,
                  num_gpus: int | None = None, block: bool = False) -> list[str]:
    """`ray start --head` on port (the GCS). node_ip: the address peers reach this node at (the
    launch's node address; Ray's own guess may pick another NIC). block: stay in the foreground
    (a container's main process, as on ECS); without it `ray start` daemonizes and returns."""
    if not 1 <= port <= 65535:
        raise ValueError(f"ray_head_argv: bad port {port}")
    return ["ray", "start", "--head", f"--port={port}", *_RAY_COMMON,
            *_ray_resources(node_ip, num_cpus, num_gpus, block)]


def ray_worker_argv(head_address: str, *, node_ip: str | None = None, num_cpus: int | None = None,
                    num_gpus: int | None = None, block: bool = False) -> list[str]:
    """`ray start --address HEAD:PORT`: a worker node joining the head's cluster."""
    if not head_address or head_address.startswith("-") or ":" not in head_address:
        raise ValueError(f"ray_worker_argv: head_address {head_address!r} must be HOST:PORT")
    return ["ray", "start", f"--address={head_address}", "--disable-usage-stats",
            *_ray_resources(node_ip, num_cpus, num_gpus, block)]


def ray_stop_argv() -> list[str]:
    """Stop every Ray process of this node (container)."""
    return ["ray", "stop", "--force"]


def ray_env(iface: str) -> dict[str, str]:
    """For `ray start`: the Ray workers it spawns inherit it, so Ray Train's torch process group
    (Gloo, NCCL) uses the chosen NIC."""
    return {"GLOO_SOCKET_IFNAME": iface, "NCCL_SOCKET_IFNAME": iface}


# In the image (COPY launch/node/ to contract.NODE_DIR).
RAY_WAIT_SCRIPT = f"{contract.NODE_DIR}/ray_wait.py"


def ray_wait_argv(head_address: str, nodes: int, timeout: float) -> list[str]:
    """Wait (from inside the cluster) until the head at head_address sees `nodes` alive nodes."""
    if nodes < 1:
        raise ValueError(f"ray_wait_argv: nodes={nodes} must be > 0")
    return ["python", RAY_WAIT_SCRIPT, "--address", head_address, "--nodes", str(nodes),
            "--timeout", f"{timeout:g}"]


def ray_job_argv(head_address: str, command: Sequence[str]) -> list[str]:
    """The user's script as a Ray driver of the cluster: RAY_ADDRESS set, so `ray.init()` and Ray
    Train's TorchTrainer join it (run in the head's container)."""
    check_command(command, "ray_job_argv")
    return ["env", f"RAY_ADDRESS={head_address}", *command]


class Ray(Launcher):
    name = "ray"
    supervised = False
    starts_cluster = True
    manifests = True

    @staticmethod
    def head_address(facts: Sequence[NodeFacts]) -> str:
        return f"{facts[0].address}:{RAY_PORT}"

    def node_argv(self, facts: Sequence[NodeFacts], rank: int) -> list[str]:
        f = facts[rank]
        if rank == 0:
            return ray_head_argv(RAY_PORT, node_ip=f.address)
        return ray_worker_argv(self.head_address(facts), node_ip=f.address)

    def argv(self, spec: JobSpec, facts: Sequence[NodeFacts], rank: int, iface: str, ompi: int = 4,
             subnet: str | None = None) -> list[str]:
        return ray_job_argv(self.head_address(facts), list(spec.command))

    def exec_env(self, iface: str) -> dict[str, str]:
        return ray_env(iface)
