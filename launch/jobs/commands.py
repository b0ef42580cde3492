"""The commands and texts the launch sends to its nodes, built from the spec and the nodes'
facts: the node step that starts a job's container (up.sh), the container's launch script
(run.sh: the readiness check, the job's env), the launcher's commands, the supervisor's
command and what its session reads. Pure.
"""

from __future__ import annotations

from typing import Sequence, TypeVar

from dtrain import contract
from dtrain.contract import container_name, node_key_dir
from dtrain.launch.jobs import container, nccl_net, node_programs, supervision
from dtrain.launch.jobs import launchers
from dtrain.launch.jobs.spec import JobSpec, NodeFacts

READY_FAILED = contract.READY_FAILED  # the readiness check's exit code (launch/node/run.sh --ready-code)


T = TypeVar("T")


def split_spares(nodes: Sequence[T], k: int) -> tuple[list[T], list[T]]:
    """(the nodes that run ranks, the spares): the spares are the last k nodes given."""
    if not 0 <= k <= len(nodes):
        raise ValueError(f"split_spares: {k} spare(s) of {len(nodes)} node(s)")
    cut = len(nodes) - k
    return list(nodes[:cut]), list(nodes[cut:])


def supervisor_argv(job_dir: str, detach: bool) -> list[str]:
    """The supervisor's command in the first container (after run.sh); detach: in the
    background (setsid), its output to its files only (launch/node/detach.sh)."""
    sup = ["python3", f"{job_dir}/supervise.py", f"{job_dir}/plan.json"]
    return ["setsid", "-f", *node_programs.program_argv("detach.sh", sup)] if detach else sup


def container_spec(spec: JobSpec, node_dir: str = "", standby: bool = False) -> container.ContainerSpec:
    """The job's container, without the node's own flags (the node adds them: start.sh).
    The user's --env values are not in it: they go in the job's env file. node_dir: the
    job's directory on the nodes (supervisor, heartbeat, log; the workdir), mounted. standby:
    the first node's, which waits for the supervisor (launch/node/standby.sh) instead of a
    `docker exec` of it later (needs node_dir: its FIFOs are there)."""
    mounts = spec.mounts
    command: tuple[str, ...] = ()
    if node_dir:
        mounts += (container.Mount(node_dir, supervision.CONTAINER_JOB_DIR),)
        if spec.workdir:
            mounts += (container.Mount(f"{node_dir}/workdir", contract.WORKDIR),)
        if standby:
            command = tuple(node_programs.container_argv("standby.sh", [supervision.CONTAINER_JOB_DIR]))
    return container.ContainerSpec(job=spec.name, image=spec.image, mounts=mounts, command=command,
                                  shm_size=spec.shm_size, key_dir=node_key_dir(spec.name))


def watch_argv(spec: JobSpec, node_dir: str) -> list[str]:
    """The node's watchdog for the job (launch/node/watch.sh, put in node_dir by prepare)."""
    return [f"{node_dir}/watch.sh", container_name(spec.name), spec.image, node_dir, node_key_dir(spec.name),
            spec.imds, str(spec.spot_grace), str(spec.heartbeat_timeout), "detach" if spec.detach else "attach"]


def up_args(spec: JobSpec, registry_args: Sequence[str], public_key: str, node_dir: str = "",
            standby: bool = False, prefetch: bool = False) -> list[str]:
    """The arguments of the node step that does a whole launch on one node (launch/node/host/up.sh);
    with node_dir, the container mounts the job's directory and the node's watchdog starts.
    standby: the container waits for the job's supervisor (container_spec). prefetch: the node
    pulled the image lazily in this launch: once the container runs, prefetch_argv in it."""
    head, rest = container.docker_run_parts(container_spec(spec, node_dir, standby))
    watch = watch_argv(spec, node_dir) if node_dir else []
    ahead = prefetch_argv() if prefetch else []
    return [str(contract.SSH_PORT), *registry_args, spec.image, spec.pull, str(int(spec.ready_timeout)),
            node_key_dir(spec.name), public_key, container_name(spec.name), str(len(watch)), *watch,
            str(len(ahead)), *ahead, str(len(head)), *head, *rest]


def prefetch_argv() -> list[str]:
    """What reads the first step's ranges ahead of it in a container of an image pulled lazily
    (launch/node/prefetch.py; the list first_reads.py wrote into the image at build time)."""
    return ["python3", f"{contract.NODE_DIR}/prefetch.py", contract.FIRST_READS, contract.PREFETCH_DONE]


def up_argv(spec: JobSpec, registry_args: Sequence[str], public_key: str, node_dir: str = "") -> list[str]:
    """up_args as the node program's argv (a session of its own)."""
    return node_programs.host_argv("up", *up_args(spec, registry_args, public_key, node_dir))


def go_text(args: Sequence[str]) -> str:
    """What a first-round session (host/prepare.sh prepare_up) reads to go on with up: `go N`,
    then the N arguments, each ending in a NUL."""
    return f"go {len(args)}\n" + "".join(a + "\0" for a in args)


def counted_text(parts: Sequence[str]) -> str:
    """What host/supervise.sh reads: a line of each part's length in bytes, then the parts."""
    return " ".join(str(len(p.encode())) for p in parts) + "\n" + "".join(parts)


def run_argv(spec: JobSpec, facts: Sequence[NodeFacts], command: Sequence[str], *, ready: bool,
             fill_hosts: bool, exec_env: dict[str, str] | None = None, cwd: str | None = None,
             ready_skip: str = "", ready_beside: bool = False) -> list[str]:
    """`docker exec` of run_script_argv in the job's container on a node. cwd: where the command
    starts (`docker exec -w`); None: the image's WORKDIR."""
    env = [a for k, v in (exec_env or {}).items() for a in ("-e", f"{k}={v}")]
    where = ["-w", cwd] if cwd else []
    return ["docker", "exec", *env, *where, container_name(spec.name),
            *run_script_argv(spec, facts, command, ready=ready, fill_hosts=fill_hosts, ready_skip=ready_skip,
                             ready_beside=ready_beside)]


def run_script_argv(spec: JobSpec, facts: Sequence[NodeFacts], command: Sequence[str], *, ready: bool,
                    fill_hosts: bool, ready_skip: str = "", ready_beside: bool = False) -> list[str]:
    """command through launch/node/run.sh, as argv in the container (after `docker exec NAME`;
    the first node's standby runs it as it is): the job's env values exported from its file,
    the nodes in /etc/hosts (fill_hosts: this container's; ready: every container's, by ssh to
    each node's sshd first, but ready_skip's, the address of the node it runs on where the
    command reaches no sshd there; ready_beside: the command starts beside that check and waits
    for its end itself: the supervisor)."""
    opts = ["--env", f"{contract.JOB_KEY_MOUNT}/{contract.ENV_FILE}"]
    for f in facts:
        opts += ["--host", f.address, f.hostname]
    if fill_hosts:
        opts += ["--fill-hosts"]
    if ready:
        opts += ["--ready", str(int(spec.ready_timeout)), "--ready-code", str(READY_FAILED), "--ready-says",
                 contract.READY_SAYS, "--phase-says", contract.SUPERVISOR_EVENT,
                 "--port", str(contract.SSH_PORT)] + (["--ready-skip", ready_skip] if ready_skip else [])
        opts += ["--ready-beside"] if ready_beside else []
        for word in container.ready_ssh():
            opts += ["--ssh", word]
        opts += ["--connect", contract.node_script("ssh-connect.pl")]  # each master made with Nagle off
    return node_programs.container_argv("run.sh", [*opts, "--", *command])


def job_argv(spec: JobSpec, facts: Sequence[NodeFacts], iface: str, ompi: int = 4,
             subnet: str | None = None) -> list[str]:
    """mpirun / horovodrun argv run in the first node's container. subnet: where nodes name
    their NICs differently (nic.tcp_include), mpirun by subnet, each rank on its node's NIC."""
    return launchers.get(spec.launcher).argv(spec, facts, 0, iface, ompi, subnet=subnet)


def per_node_argv(spec: JobSpec, facts: Sequence[NodeFacts], rank: int, iface: str) -> list[str]:
    """A per-node launcher's command (torchrun) on node `rank`: `docker exec` of it in that
    node's container (/etc/hosts filled)."""
    return run_argv(spec, facts, launchers.get(spec.launcher).argv(spec, facts, rank, iface), ready=False,
                    fill_hosts=True)


def nccl_mode(spec: JobSpec, facts: Sequence[NodeFacts]) -> tuple[str, str]:
    """--nccl-check for these nodes (nccl_net.mode): (auto|warn|fail|off, why it is off or "")."""
    return nccl_net.mode(spec.nccl_check, any(f.gpus for f in facts), (*spec.env, *spec.forward),
                         len(facts) - spec.spares)


def node_names(facts: Sequence[NodeFacts]) -> dict[str, str]:
    """A node's hostname and address -> its host, as the launch names it (the timeline's rows)."""
    return {**{f.address: f.node.host for f in facts}, **{f.hostname: f.node.host for f in facts}}


def ready_error(output: str, error: str | None) -> str:
    lines = [ln.removeprefix(contract.READY_SAYS) for ln in output.splitlines() if ln.startswith(contract.READY_SAYS)]
    return f"containers started, but not every node's sshd answers on {contract.SSH_PORT}:\n  " + "\n  ".join(
        lines or [error or "no answer"])
