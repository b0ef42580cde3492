"""Ray: `ray start` in every container (node_argv: the head on the first node, workers joining
it), then argv, the command as a Ray driver in the head's container: Ray's protocol is its own
(Ray.run, not the supervisor; builders: ray_head_argv, ray_worker_argv, ray_job_argv, RAY_PORT).

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
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dtrain import contract
from dtrain.launch.jobs import node_programs
from dtrain.launch.jobs.launchers.base import ITS_OWN, Launcher, RankOutput, Session, check_command

RESULTS = "ray_results"  # the directory Ray Train's default storage_path names, under a shared --mount
# Ray Train's workers also hand each print() to a logger that writes it to the console again
# (ray/train/v2/_internal/logging/patch_print.py, where Ray's worker has replaced sys.stdout):
# every line a worker prints would reach the driver twice. Off: printed once, by Ray's own
# forwarding of the worker's output (a user's --env, read after these, can turn it on again).
NO_PRINT_PATCH = {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}

if TYPE_CHECKING:
    from dtrain.launch.jobs.spec import JobSpec, NodeFacts


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
    placement = ITS_OWN
    output = RankOutput("", "Ray's driver prints its workers' lines without their rank (it runs the job, "
                            "not the supervisor): --hang-timeout and --straggler-check are not for it")
    starts_cluster = True
    manifests = True

    def notes(self, spec: JobSpec, nodes: int) -> list[str]:
        if nodes < 2 or self.shared_storage(spec):
            return []
        return ["ray: no writable --mount, so Ray Train's default storage (~/ray_results) is each "
                "container's own, and a TorchTrainer without RunConfig(storage_path=s3://... or a shared "
                "path) fails across nodes (\"Unable to set up cluster storage\"); give --mount PATH that "
                "every node shares (EFS: dtrain volume create --efs; the simulated cluster: dtrain cluster "
                "up --shared DIR:PATH)"]

    def run(self, session: Session) -> int:
        """A head in the first node's container, a worker in each other one (`ray start`; Ray's
        daemons stay in the container), wait until the head sees every node, then the command as
        a Ray driver in the head's container (RAY_ADDRESS set), its output streamed. Every step
        runs through run.sh (session.in_container), so the job's --env values come from its file,
        and starts where the other launchers start the command. Ray stops everywhere afterwards
        (the containers go anyway)."""
        spec, facts = session.spec, session.facts
        first = facts[0]
        head = self.head_address(facts)
        env = self.exec_env(first.iface)
        storage = self.shared_storage(spec)
        by_host = {f.node.host: i for i, f in enumerate(facts)}
        session.say(f"[launch] ray: head {head} on {first.hostname}, {len(facts) - 1} worker node(s)"
                    + (f"; Ray Train's default storage ~/ray_results -> {storage} on every node" if storage else ""))
        try:
            t0 = time.monotonic()
            session.on([first], lambda f: session.in_container(self.node_argv(facts, 0, storage), env),
                       spec.ready_timeout + 30, "starting the Ray head")
            if len(facts) > 1:
                session.on(facts[1:], lambda f: session.in_container(self.node_argv(facts, by_host[f.node.host],
                                                                                    storage), env),
                           spec.ready_timeout + 30, "starting Ray workers")
            wait = ray_wait_argv(head, len(facts), spec.ready_timeout)
            session.on([first], lambda f: session.in_container(wait, env), spec.ready_timeout + 60,
                       "waiting for every Ray node")
            session.say(f"[launch] ray cluster of {len(facts)} node(s) up ({time.monotonic() - t0:.1f} s)")
            return session.stream(first, session.in_container(ray_job_argv(head, list(spec.command)), env))
        finally:
            if not session.closing():
                session.on(facts, lambda f: session.exec(ray_stop_argv()), 60, "")

    @staticmethod
    def head_address(facts: Sequence[NodeFacts]) -> str:
        return f"{facts[0].address}:{RAY_PORT}"

    @staticmethod
    def shared_storage(spec: JobSpec) -> str | None:
        """Ray Train's default storage on shared storage: MOUNT/ray_results on the job's first
        writable --mount (dtrain cannot tell a shared path from a node's own: a --mount is
        taken as shared, as --checkpoint-dir takes it); None without one."""
        writable = [m for m in spec.mounts if not m.readonly]
        return posixpath.join(writable[0].dst, RESULTS) if writable else None

    def node_argv(self, facts: Sequence[NodeFacts], rank: int, storage: str | None = None) -> list[str]:
        """`ray start` on node `rank`; storage: the shared directory ~/ray_results becomes a link to
        first (launch/node/ray-storage.sh), for Ray Train's default storage_path."""
        f = facts[rank]
        if rank == 0:
            argv = ray_head_argv(RAY_PORT, node_ip=f.address)
        else:
            argv = ray_worker_argv(self.head_address(facts), node_ip=f.address)
        return node_programs.program_argv("ray-storage.sh", [storage, *argv]) if storage else argv

    def argv(self, spec: JobSpec, facts: Sequence[NodeFacts], rank: int, iface: str, ompi: int = 4,
             subnet: str | None = None) -> list[str]:
        return ray_job_argv(self.head_address(facts), list(spec.command))

    def exec_env(self, iface: str) -> dict[str, str]:
        return ray_env(iface) | NO_PRINT_PATCH
