"""Run a job: host-network containers on every node, then mpirun, horovodrun or torchrun.

    start_on_nodes: one ssh session per node (launch/node/host/up.sh): probe (docker, NIC,
    GPUs, EFA, sshd port) + pull + a fresh SSH key + the container (flags chosen by the node)
    -> Started(facts, image ID, Open MPI major): checks across nodes (same image, NIC name,
    hostnames, driver) passed
    -> the launcher's command (launch.jobs.launchers) built from the facts, run in the first
    container (or every one: torchrun) through launch/node/run.sh, whose first step is sshd
    reachable node to node (and /etc/hosts filled), while each node's session waits for its
    own sshd (a crash there ends the job)
    -> teardown

Every step runs on all nodes in parallel (launch.remote.transport). A failure at any step names
the node and the reason, and removes whatever was already started on every node. Ctrl-C does
the same. The job's output streams live, each line prefixed with node and rank, and is kept
in ~/.dtrain/jobs/<name>/output.log for `dtrain logs` and `dtrain diagnose`.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shlex
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence, TypeVar

from dtrain import contract
from dtrain.interrupts import Signalled, interrupt_code, sigterm_as_interrupt  # noqa: F401 (the job's public names)
from dtrain.contract import container_name, node_key_dir
from dtrain.terminal import clean
from dtrain.images.spec import vtuple
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import container, nccl_net, netgate, nic, node_programs, output, runplan, store, supervision
from dtrain.launch.analysis import timeline
from dtrain.launch.jobs import workdir as wdir
from dtrain.launch.jobs.sink import Sink
from dtrain.launch.jobs.spec import JobSpec, NodeFacts, Pulled, Started
from dtrain.launch.remote.fanout import (SSH_FAILURE, Fanout, NodeResult, host_lines, is_connection_error,
                                         raise_on_failure)
from dtrain.launch.remote.hosts import Node
from dtrain.launch.jobs import launchers
from dtrain.launch.jobs.launchers import env_file, launch_command, plan_nodes
from dtrain.launch.jobs.login import Login, login_for
from dtrain.launch.jobs.pull import RegistryAnswer, ask_registry, parse_ref, pull_on_nodes
from dtrain.launch.jobs.output import prefix_line, rank_nodes  # noqa: F401 (prefix_line: the job's public names)
from dtrain.launch.jobs.store import job_log, jobs_dir  # noqa: F401 (the job's public names)
from dtrain.launch.remote.transport import SshTransport, close_masters  # noqa: F401

FIRST_ROUND_S = 120  # the longest a node may take to answer the first round (its lock, the job's directory)
READY_FAILED = contract.READY_FAILED  # the readiness check's exit code (launch/node/run.sh --ready-code)
SSH_SAID = re.compile(r"^(Timeout, server .* not responding|Connection to .* closed|ssh: |client_loop: |"
                      r"Shared connection to |packet_write_wait: )")  # ssh's own lines about its link


class Relay:
    """Where the lines of the nodes' launch sessions go: the step that reads them now (the first
    round, then the start step, in the same sessions)."""

    def __init__(self, target: Callable[[Node, str], None]) -> None:
        self.target = target

    def __call__(self, node: Node, line: str) -> None:
        self.target(node, line)


@dataclass(frozen=True)
class Sessions:
    """The nodes' launch sessions after the first round (host/prepare.sh prepare_up): each
    waits for its start step's arguments and secrets on stdin (start_on_nodes sends them)."""

    fanout: Fanout
    relay: Relay


@dataclass(frozen=True)
class Prepared:
    """What the prepare step found (Job.prepare): the job's directory on every node, which nodes
    hold the image already, and the registry's answers asked once for every later step."""

    # host -> the job's directory there (absolute, as the node printed it: each node's own, also
    # where nodes share the home); empty where no prepare ran (doctor)
    node_dirs: dict[str, str] = field(default_factory=dict)
    held: dict[str, str] = field(default_factory=dict)  # host -> image ID of the nodes that hold it
    login: Login | None = None  # the registry login (ECR); None: asked by the start step
    digest: str = ""  # the registry's digest of the image (--pull always); "" unknown
    timeline: timeline.Timeline = ()  # each node's first round
    sessions: Sessions | None = None  # the nodes' sessions, open for the start step (None: it opens its own)
    absent: bool = False  # the registry said it has no such image (--pull always; HTTP 404)
    keys: Keys | None = None  # the job's keys, made while the nodes answered (None: the start step makes them)


class StartFailed(LaunchError):
    """start_on_nodes failed; `started` are the nodes where a container may exist."""

    def __init__(self, message: str, started: Sequence[Node]):
        super().__init__(message)
        self.started = list(started)


# ---------------------------------------------------------------- pure helpers


def parse_probe(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep and k.isidentifier():
            out[k] = v.strip()
    return out


def facts_from_probe(node: Node, text: str, iface: str | None) -> NodeFacts:
    p = parse_probe(text)
    if p.get("docker") != "ok":
        raise LaunchError(f"{node.host}: Docker engine not reachable: {p.get('docker') or 'no answer'}")
    address = p.get("addr") or node.host
    ipjson = p.get("ipjson", "")
    if iface:
        try:
            names = {i.get("ifname") for i in nic.links_of(ipjson)}
        except ValueError:
            names = set()
        if iface not in names:
            raise LaunchError(f"{node.host}: --iface {iface} does not exist "
                              f"(interfaces: {', '.join(sorted(n for n in names if n))})")
        chosen = iface
    else:
        chosen = nic.interface_for_address(ipjson, address, host=node.host)
    lock = p.get("memlock", "")
    try:
        network = nic.interface_network(ipjson, address, host=node.host)
    except LaunchError:
        network = ""
    return NodeFacts(node, address, p.get("hostname", node.host), chosen,
                     int(p.get("gpus") or 0), tuple(p.get("efa", "").split()), p.get("port", ""),
                     int(lock) if lock.isdigit() else -1, p.get("driver", ""),
                     tuple(p.get("port_jobs", "").split()), network,
                     nic.interface_address(ipjson, chosen) if iface else "")


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


def check_spares(spec: JobSpec, given: int) -> None:
    """--spares and --min-nodes against the nodes given: at least one node runs ranks."""
    if not 0 <= spec.spares < given:
        raise LaunchError(f"--spares {spec.spares}: must be fewer than the {given} node(s) given (the last ones "
                          "given are the spares; at least one runs the job)")
    ranked = given - spec.spares
    if spec.min_nodes is not None and not 1 <= spec.min_nodes <= ranked:
        raise LaunchError(f"--min-nodes {spec.min_nodes}: between 1 and the {ranked} node(s) "
                          + (f"that run ranks ({given} given, {spec.spares} spare(s))" if spec.spares else "given"))


def check_checkpoint_dir(spec: JobSpec) -> str | None:
    """--checkpoint-dir against the --mounts: on a read-only one is an error (nothing could be
    saved); on none, a warning (each container's own disk: a spare or a restarted container
    would not find it, and the run would start over), or None."""
    path = spec.checkpoint_dir
    if not path:
        return None
    under = sorted((m for m in spec.mounts if posixpath.commonpath([m.dst, posixpath.normpath(path)]) == m.dst),
                   key=lambda m: len(m.dst))
    if under and under[-1].readonly:
        raise LaunchError(f"--checkpoint-dir {path}: on a read-only --mount ({under[-1].dst}:ro); a checkpoint "
                          "must be writable (mount it rw)")
    if not under:
        return (f"--checkpoint-dir {path} is not under any --mount: each container's own disk, which a spare or a "
                "restart does not see (the run would start over); give a --mount every node shares, e.g. "
                "--mount /fsx --checkpoint-dir /fsx/ckpt")
    return None


def gate_out(facts: Sequence[NodeFacts], spares: int, gate: netgate.GateResult) -> dict[str, str]:
    """The network gate's culprits as the nodes the run leaves out ({hostname: why}): each node
    that would run ranks needs a spare that is not a culprit itself to take its place; without
    enough, the launch fails naming them (GateResult.failure)."""
    out = {f.hostname: f"slow link: {gate.culprits[f.node.host]}" for f in facts if f.node.host in gate.culprits}
    ranked, spare = split_spares(facts, spares)
    need = sum(f.hostname in out for f in ranked)
    have = sum(f.hostname not in out for f in spare)
    if need > have:
        raise LaunchError(gate.failure() + (f"; {have} healthy spare(s) for {need} node(s)" if spares else ""))
    return out


def port_jobs_hint(taken: Sequence[NodeFacts]) -> str:
    """When other dtrain jobs run where the port is taken, the likely holder and how to stop it."""
    jobs = sorted({j for f in taken for j in f.port_jobs})
    if not jobs:
        return ""
    return (f"\n  other dtrain job(s) running there: {', '.join(jobs)}; one job per node at a time "
            f"(dtrain stop --job {jobs[0]})")


def driver_too_old(driver: str, need: str) -> bool:
    """True when an NVIDIA driver version is older than an image's dtrain.min-driver label."""
    try:
        return bool(driver and need) and vtuple(driver) < vtuple(need)
    except ValueError:
        return False


def check_driver(facts: Sequence[NodeFacts], need: dict[str, str]) -> None:
    """Refuse GPU nodes whose driver is older than the image's CUDA needs (label dtrain.min-driver)."""
    old = [f"{f.node.host}: driver {f.driver} < {need[f.node.host]}" for f in facts
           if f.gpus and driver_too_old(f.driver, need.get(f.node.host, ""))]
    if old:
        raise LaunchError("the image's CUDA needs a newer NVIDIA driver (docs/troubleshooting.md#cuda-driver):\n  "
                          + "\n  ".join(old))


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
            standby: bool = False) -> list[str]:
    """The arguments of the node step that does a whole launch on one node (launch/node/host/up.sh);
    with node_dir, the container mounts the job's directory and the node's watchdog starts.
    standby: the container waits for the job's supervisor (container_spec)."""
    head, rest = container.docker_run_parts(container_spec(spec, node_dir, standby))
    watch = watch_argv(spec, node_dir) if node_dir else []
    return [str(contract.SSH_PORT), *registry_args, spec.image, spec.pull, str(int(spec.ready_timeout)),
            node_key_dir(spec.name), public_key, container_name(spec.name), str(len(watch)), *watch,
            str(len(head)), *head, *rest]


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


# ---------------------------------------------------------------- the start on nodes


def start_on_nodes(ssh: SshTransport, spec: JobSpec, nodes: Sequence[Node], public_key: str,
                   secrets: str, say: Callable[[str], None], node_dirs: Mapping[str, str] | None = None,
                   login: Login | None = None, *, t0: float | None = None,
                   on_phase: Callable[[timeline.Entry], None] | None = None,
                   sessions: Sessions | None = None, standby: str = "") -> tuple[Started, Fanout]:
    """One ssh session per node (up.sh): replace a stale container of this job, read the node's
    facts, pull the image, write the job key and env file, start the container with the node's
    own GPU/EFA/memlock flags. A node with the port taken or an old GPU driver starts nothing.

    Returns once every node's container runs and the checks across nodes pass: the facts, and
    the nodes' sessions, each still waiting for its container's sshd. secrets: the stdin of
    every session (registry password line, private key, host key, env file). Raises StartFailed naming
    the nodes where a container may exist; its own sessions are ended then.

    The nodes' phase lines (up.sh: `container`, then `sshd`) are timeline entries, times
    after t0 (the launch's start, epoch; default now): Started.timeline has each node's
    `container`; on_phase gets the later ones (`sshd`) as they come. sessions: the first
    round's, open (Job.prepare): the step goes on in them instead of sessions of its own.
    node_dirs: host -> the job's directory there (Prepared.node_dirs), mounted in its container.
    standby: the host whose container waits for the job's supervisor (container_spec); "" none."""
    began = time.monotonic()
    t0 = time.time() if t0 is None else t0
    login = login_for(spec.image) if login is None else login
    dirs = node_dirs or {}
    standby = standby if dirs.get(standby) and standby in {n.host for n in nodes} else ""
    args = {n.host: up_args(spec, login.args, public_key, dirs.get(n.host, ""), standby=n.host == standby)
            for n in nodes}
    lines: dict[str, list[str]] = {n.host: [] for n in nodes}
    running: set[str] = set()
    phases: list[timeline.Entry] = []
    news = threading.Condition()

    def on_line(n: Node, line: str) -> None:
        with news:
            if line.startswith(contract.SUPERVISOR_EVENT):
                late = n.host in running
                for entry in timeline.node_lines(n.host, [line], t0=t0, now=time.time()):
                    phases.append(entry)
                    if late and on_phase is not None:
                        on_phase(entry)
                return
            lines[n.host].append(line)
            if line == "run=1":
                running.add(n.host)
                news.notify_all()

    if sessions is None:
        fan = ssh.start(nodes, lambda n: node_programs.host_argv("up", *args[n.host]),
                        timeout=1800, stdin=lambda n: login.stdin + secrets, on_line=on_line)
    else:
        fan = sessions.fanout
        sessions.relay.target = on_line
        for n in nodes:
            fan.send(n.host, go_text(args[n.host]) + login.stdin + secrets)
    started = list(nodes)  # until the sessions say otherwise
    try:
        with news:  # until every container runs, or a session ended before starting its own
            while len(running) < len(nodes) and not set(fan.ended()) - running:
                news.wait(0.05)
        if len(running) < len(nodes):
            results = fan.results()
            # Where ssh never connected nothing started; anywhere else a container may exist.
            started = [n for n, r in zip(nodes, results) if not is_connection_error(r.returncode, r.stderr)]
            raise_on_failure(results, "starting containers")
        with news:
            out = {h: "\n".join(v) for h, v in lines.items()}
            result = replace(_check_nodes(spec, nodes, out, running), timeline=tuple(phases), standby=standby)
    except LaunchError as e:
        fan.cancel()
        raise StartFailed(str(e), started) from None
    except BaseException:
        fan.cancel()
        raise
    if warning := memlock_warning(result.facts):
        say(f"[launch] warning: {warning}")
    nic = result.facts[0].iface if result.subnet is None else \
        f"{'/'.join(sorted({f.iface for f in result.facts}))} (subnet {result.subnet})"
    say(f"[launch] {len(result.facts)} node(s): NIC {nic}, "
        f"{sum(f.gpus for f in result.facts)} GPU(s), image {result.image_id[:19]}; containers "
        f"{container_name(spec.name)} running with the job key ({time.monotonic() - began:.1f} s)")
    return result, fan


def nccl_mode(spec: JobSpec, facts: Sequence[NodeFacts]) -> tuple[str, str]:
    """--nccl-check for these nodes (nccl_net.mode): (auto|warn|fail|off, why it is off or "")."""
    return nccl_net.mode(spec.nccl_check, any(f.gpus for f in facts), (*spec.env, *spec.forward),
                         len(facts) - spec.spares)


def memlock_warning(facts: Sequence[NodeFacts]) -> str:
    """The nodes with EFA devices whose dockerd cannot lift the memlock limit (their containers get
    dockerd's ceiling: EFA registers memory and needs unlimited), as one line; "" where none. A
    node without EFA is not named: nothing the launch runs there needs more."""
    capped = [f for f in facts if f.memlock >= 0 and f.efa]
    if not capped:
        return ""
    return (f"dockerd cannot lift the memlock limit on {', '.join(f'{f.node.host} ({f.memlock // 1024} KiB)' for f in capped)}: "
            "containers get that, not unlimited; EFA needs unlimited (docs/troubleshooting.md#memlock)")


def _check_nodes(spec: JobSpec, nodes: Sequence[Node], out: dict[str, str], running: set[str]) -> Started:
    """The nodes' session output (by host) -> Started, after the checks across nodes: same
    image ID everywhere, GPU drivers new enough, one NIC name, the port free, one hostname each."""
    facts = [facts_from_probe(n, out[n.host], spec.iface) for n in nodes]
    info = {h: parse_probe(text).get("image", "").split() for h, text in out.items()}
    ids = {h: v[-1] for h, v in info.items()}
    if len(set(ids.values())) > 1:
        lines = "\n".join(f"  {h}: {i[:19]}" for h, i in ids.items())
        raise LaunchError(f"nodes hold different images for {spec.image}; all must run the same:\n{lines}")
    check_driver(facts, {h: v[0] for h, v in info.items() if len(v) == 3 and v[0] != "-"})
    label = next(iter(info.values()))
    launchers.get(spec.launcher).check_nodes({f.node.host: f.iface for f in facts})  # its own rule (horovodrun: one NIC)
    subnet = nic.tcp_include({f.node.host: (f.iface, f.address, f.network) for f in facts})
    taken = [f for f in facts if f.port_holder]
    if taken:
        raise LaunchError(f"port {contract.SSH_PORT} is taken (the containers' sshd needs it):\n" + "\n".join(
            f"  {f.node.host}: {f.port_holder}" for f in taken) + port_jobs_hint(taken))
    names = [f.hostname for f in facts]
    dup = {h for h in names if names.count(h) > 1}
    if dup:
        raise LaunchError(f"nodes share a hostname ({', '.join(sorted(dup))}): Open MPI needs "
                          "one hostname per node")
    missing = [n.host for n in nodes if n.host not in running]
    if missing:  # every reason a node declines is checked above; this is a safety net
        raise LaunchError(f"no container started on {', '.join(missing)}")
    ompi = int(label[1]) if len(label) == 3 and label[1].isdigit() else None
    return Started(facts, next(iter(ids.values())), ompi, subnet)


def pull_timeline(ended: dict[str, float | None], nodes: Sequence[Node], began: float,
                  t0: float) -> timeline.Timeline:
    """Each node's `pull` phase: from the pull step's start (began) to its pull's end; 0 s
    where nothing was pulled (the node held the image, or --pull never)."""
    return tuple(timeline.rounds("pull", {n.host: (began, ended.get(n.host) or began) for n in nodes}, t0))


# ---------------------------------------------------------------- the run


class Keys:
    """The job's keys, made by two ssh-keygen runs side by side in a new 0700 directory under
    parent (started at once; result() waits): the job's ed25519 pair, which every container
    trusts, and the host key all its containers' sshd use (their clients check none:
    templates/partials/ssh.j2). The directory goes in teardown."""

    def __init__(self, parent: Path, comment: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="key-", dir=parent))
        self._runs: list[subprocess.Popen] = []
        self._keys: tuple[str, str, str] | None = None
        try:
            for name in ("id_ed25519", "ssh_host_ed25519_key"):
                self._runs.append(subprocess.Popen(
                    ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(self.dir / name)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        except BaseException as e:  # nothing of it stays: the directory, a key the first run made
            self.remove()
            if isinstance(e, FileNotFoundError):
                raise LaunchError("ssh-keygen not found: dtrain makes each job's keys with OpenSSH's ssh-keygen "
                                  "(Debian/Ubuntu: apt-get install openssh-client)") from None
            raise

    def result(self) -> tuple[str, str, str]:
        """(private key, public key line, host key)."""
        if self._keys is None:
            for run in self._runs:
                _, err = run.communicate()
                if run.returncode:
                    raise LaunchError(f"ssh-keygen failed making the job's keys in {self.dir}: {err.strip()}")
            self._keys = ((self.dir / "id_ed25519").read_text(), (self.dir / "id_ed25519.pub").read_text().strip(),
                          (self.dir / "ssh_host_ed25519_key").read_text())
        return self._keys

    def remove(self) -> None:
        """The directory and the keys in it, once ssh-keygen is done writing them."""
        for run in self._runs:
            if run.poll() is None:
                run.kill()
            run.wait()
            if run.stderr:
                run.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Job:
    """One launch: `run()` drives the stages, each taking what the earlier ones returned:

        prepare(workdir) -> Prepared       the job's directory, the image held where, the login
        pull(prepared) -> Pulled           the image onto the nodes that lack it
        up(prepared, pulled) -> Started    a container on every node, their facts
        run_supervised(started, prepared, ompi) -> exit code   (or the launcher's own run: Ray)
        teardown()                         whatever the stages left on a node

    It returns the job's exit code and always tears down. What it keeps is only what teardown
    needs (the transport, the nodes that may hold a container, the key, the nodes' sessions)."""

    def __init__(self, spec: JobSpec, nodes: list[Node], say: Callable[[str], None] = print,
                 confirm: Callable[[], None] | None = None):
        if not nodes:
            raise LaunchError("no nodes: give --hostfile, --hosts or --ec2-tag")
        if not spec.command:
            raise LaunchError("no command: put it after `--`, e.g. dtrain launch ... -- python train.py")
        name = store.check_name(spec.name or store.default_name())
        self.spec = replace(spec, name=name)
        self.launcher = launchers.get(self.spec.launcher)
        self.nodes = nodes
        self.say: Callable[[str], None] = lambda text: say(clean(text, lines=True))  # it names nodes' hostnames
        self.confirm = confirm  # after the launch's own checks, before anything is sent (trust.check_hosts)
        self.dir = store.job_dir(name)
        # this launch on the nodes' locks of the name (host/prepare.sh): who, and a token of its own
        self.owner = f"{socket.gethostname()} pid {os.getpid()} launch {secrets.token_hex(4)}"
        self._lock: int | None = None  # the launcher's lock of the name (store.take_launch_lock)
        self.ssh = SshTransport(nodes, self.spec.ssh_opts)
        # for teardown: where this launch may have left something, set by the step that left it
        self.started: list[Node] = []  # nodes where a container or the job's directory may exist
        self.keys: Keys | None = None
        self._sessions: Fanout | None = None  # the nodes' launch sessions (prepare(), up())
        self._watch: threading.Thread | None = None
        self._up_failure: LaunchError | None = None
        self._teardown_lock = threading.Lock()
        self._closing = False
        self.sink = Sink()  # the job's output: the screen, output.log (opened by run)
        self.detached = False
        self._timed_out = False

    def _keys(self) -> Keys:
        """The job's keys, being made (Keys); where they go in teardown."""
        store.ensure_job_dir(self.spec.name)
        self.keys = Keys(self.dir, f"dtrain-{self.spec.name}")
        return self.keys

    # -- steps

    def up(self, prepared: Prepared = Prepared(), pulled: Pulled | None = None,
           rec: timeline.Recorder | None = None) -> Started:
        """start_on_nodes for this job (launch; doctor without the steps before): the job's keys
        (the first round's, or made now), the containers on every node; then a watcher ends the
        job if a node's sshd never comes up. rec: where the nodes' later phases (sshd) go, as
        they come."""
        private, public, host_key = (prepared.keys or self._keys()).result()
        self.started = list(self.nodes)
        policy = pulled.policy if pulled else self.spec.pull
        # attached, the first node's container waits for the supervisor: no `docker exec` later
        standby = self.nodes[0].host if not self.spec.detach and self.launcher.supervised else ""
        try:
            started, self._sessions = start_on_nodes(self.ssh, replace(self.spec, pull=policy), self.nodes,
                                                     public, private + host_key + env_file(self.spec.env), self.say,
                                                     prepared.node_dirs, prepared.login,
                                                     t0=rec.t0 if rec else None,
                                                     on_phase=(lambda e: rec.add([e])) if rec else None,
                                                     sessions=prepared.sessions, standby=standby)
        except StartFailed as e:
            self.started = e.started
            raise
        self._watch = threading.Thread(target=self._watch_up, name="dtrain-up", daemon=True)
        self._watch.start()
        if started.subnet is not None:
            self._write_node_env(started.facts)
        return started

    def gate_nodes(self, started: Started) -> netgate.GateResult:
        """The network gate (--check-network) between the started containers, on the job's NIC:
        a few seconds of TCP streams in two ring rounds (launch/jobs/netgate.py); says one line
        (lowest and median rate, time taken) and returns the result, whose .culprits name the
        nodes whose link is well below their peers' or the instance type's expectation."""
        result = netgate.run_gate(self.ssh, started.facts, container_name(self.spec.name))
        self.say(f"[launch] {result.summary()}")
        return result

    def _take_out(self, facts: Sequence[NodeFacts], out: dict[str, str]) -> None:
        """Nodes the gate named, before the job: their containers go, spares take their places
        (once every node's start session has ended: a container removed before its sshd was seen
        would end the job)."""
        if failure := self.up_failure(self.spec.ready_timeout + 30):
            raise failure
        if self._watch is not None and self._watch.is_alive():
            raise LaunchError(f"not every node's sshd came up within {self.spec.ready_timeout + 30:g} s")
        store.record(self.spec.name, quarantined=dict(out))
        nodes = [f.node for f in facts if f.hostname in out]
        for f in facts:
            if f.hostname in out:
                self.say(f"[launch] {f.hostname} taken out before the start: {out[f.hostname]}")
        raise_on_failure(self.ssh.run(nodes, lambda n: store.remove_argv(self.spec.name), timeout=60),
                         "removing the containers of the nodes the network gate named")

    def _write_node_env(self, facts: Sequence[NodeFacts]) -> None:
        """Where NICs differ: each node's NCCL/Gloo interface into node.env in the job's key
        directory (mounted in its container; read by nic.NODE_ENV_WRAPPER). Data on stdin."""
        path = f"{node_key_dir(self.spec.name)}/{nic.NODE_ENV_FILE}"
        by_host = {f.node.host: f for f in facts}
        results = self.ssh.run(self.nodes, lambda n: node_programs.program_argv("write-private.sh", [path]),
                               stdin=lambda n: nic.node_env_text(by_host[n.host].iface, skip=list(self.spec.env)),
                               timeout=60)
        raise_on_failure(results, "writing each node's NIC")

    def _watch_up(self) -> None:
        """The nodes' sessions after their container started: each ends when its sshd listens.
        One that fails instead (the container exited, sshd never listened) ends the job."""
        assert self._sessions is not None
        failed = [r for r in self._sessions.results() if not r.ok]
        if failed and not self._closing:
            self._up_failure = LaunchError(
                "containers started, but not every node's sshd came up:\n" +
                host_lines([(r.host, r.error or "failed") for r in failed]))
            self.teardown()

    def up_failure(self, timeout: float) -> LaunchError | None:
        """After the job: wait for the nodes' sessions to end; the failure of one, if any."""
        if self._watch is not None:
            self._watch.join(timeout)
        return self._up_failure

    def preflight(self, facts: Sequence[NodeFacts], argv: Sequence[str]) -> int | None:
        """From the first node's container, ssh to every node's container (the readiness check),
        then the launcher's check of its own tool there (launchers' preflight: mpirun's `mpirun
        --version`); returns Open MPI's major version where the check says it."""
        t0 = time.monotonic()
        r = self.ssh.run([facts[0].node], lambda n: run_argv(self.spec, facts, list(argv), ready=True, fill_hosts=False),
                         timeout=self.spec.ready_timeout + 30)[0]
        if not r.ok and r.returncode in (READY_FAILED, None):  # the readiness check, or no answer
            raise LaunchError(_ready_error(r.stdout + r.stderr, r.error))
        if not r.ok:
            said = [ln.strip() for ln in (r.stderr + r.stdout).splitlines()
                    if ln.strip() and not ln.startswith(contract.READY_SAYS)]
            raise LaunchError(f"--launcher {self.launcher.name}: the image fails the launcher's check on "
                              f"{facts[0].hostname}: {said[-1] if said else r.error or 'no output'}")
        found = self.launcher.preflight_result(r.stdout)
        self.say(f"[launch] sshd reachable on every node; {found.said} ({time.monotonic() - t0:.1f} s)")
        return found.ompi

    def pull(self, prepared: Prepared, t0: float = 0.0) -> Pulled:
        """The image onto every node before the containers (launch/jobs/pull.py): per node, bytes
        and rate while it pulls, then one summary line naming the slowest node; nothing pulled,
        and no session opened, where prepare found the image held (the registry's digest, for
        --pull always). The start step then pulls only where a node has no image of that name
        (a failed pull here, a local image there: it is used, with the warning below; no image:
        the start step's error names the node). t0: the launch's start (its timeline)."""
        t = time.time()
        if self.spec.pull == "never":
            return Pulled(self.spec.pull, pull_timeline({}, self.nodes, t, t0))
        if prepared.absent:  # a misspelt name or tag: no node would get it; one line, not one per node
            self.say(f"[launch] warning: {absent_line(self.spec.image)}")
            return Pulled("missing", pull_timeline({}, self.nodes, t, t0))
        tty = self.say is print and sys.stdout.isatty()
        out = sys.stdout if tty else _SayLines(self.say, "[launch] pull ")
        progress = []
        try:
            progress = pull_on_nodes(self.nodes, self.spec.image, self.spec.pull, ssh=self.ssh, out=out, tty=tty,
                                     login=prepared.login, digest=prepared.digest,
                                     show_present=False,  # "": not asked again
                                     held=prepared.held, clock=time.time)
        except LaunchError as e:
            self.say(f"[launch] warning: {e}\n  (a node that holds an image of that name uses it)")
        return Pulled("missing", pull_timeline({p.host: p.ended for p in progress if p.state == "pulled"},
                                               self.nodes, t, t0))

    def _registry(self) -> tuple[Login | None, RegistryAnswer]:
        """What the registry says once for every step: its login and (--pull always) the
        image's digest, or that it has no such image; (None, unknown) for --pull never."""
        if self.spec.pull == "never":
            return None, RegistryAnswer(None)
        login = login_for(self.spec.image)
        answer = RegistryAnswer(None)
        if self.spec.pull == "always":  # a registry this machine cannot reach costs at most 2 x 3 s
            answer = ask_registry(self.spec.image, user=login.user if login.registry else None,
                                  password=login.password if login.registry else None, timeout=3)
        return login, answer

    def prepare(self, wd: wdir.Workdir | None, t0: float = 0.0) -> Prepared:
        """Before the containers: each node's lock of the name (host/prepare.sh: a node where
        another launch holds it refuses, changing nothing), the job's directory on every node
        (each node's own, ~/.dtrain/nodes/HOST/jobs/<job>: dtrain/contract.py; made anew, with
        the node watchdog's program), then the workdir, sent to every node at once.
        The same round asks each node whether it holds the image already (pull()).
        t0: the launch's start (its timeline: each node's first round, as this launcher saw it)."""
        watch = contract.node_script("watch.sh")
        login, answer = self._registry()
        digest = answer.digest or ""
        # what each node is asked about the image (host/prepare.sh): IMAGE POLICY DIGEST
        question = () if login is None else (self.spec.image, self.spec.pull, digest)
        # First on each node its lock of the name (refused: exit 3, nothing changed there). The
        # session stays open: the start step goes on in it (host/prepare.sh prepare_up).
        argv = node_programs.host_argv("prepare_up", store.check_name(self.spec.name), self.owner, *question)
        said: dict[str, list[str]] = {n.host: [] for n in self.nodes}
        done: dict[str, float] = {}
        news = threading.Condition()

        def first_round(n: Node, line: str) -> None:
            with news:
                if line == "prepared=1":
                    done[n.host] = time.time()
                    news.notify_all()
                else:
                    said[n.host].append(line)

        relay = Relay(first_round)
        t = time.time()
        self.started = list(self.nodes)  # until the sessions say otherwise
        # their time limit: the pull step's (1800 s) while they wait, then the start step's
        self._sessions = sessions = self.ssh.start(self.nodes, lambda n: argv, stdin=lambda n: watch + "\0",
                                                   hold_stdin=True, timeout=3600, on_line=relay)
        keys = self._keys()  # ssh-keygen while the nodes answer: off the launch's path
        if self.launcher.supervised:
            supervision.supervisor_texts()  # and the supervisor's files read (run_supervised sends them)
        deadline = time.monotonic() + FIRST_ROUND_S
        with news:  # until every node prepared, or a session ended before it did
            while (len(done) < len(self.nodes) and not set(sessions.ended()) - set(done)
                   and time.monotonic() < deadline):
                news.wait(0.05)
        if len(done) < len(self.nodes):  # the others end now, before their start step
            for n in self.nodes:
                sessions.send(n.host, "", close=True)
            if not set(sessions.ended()) - set(done):  # no node failed: some did not answer in time
                sessions.cancel()
                silent = [n.host for n in self.nodes if n.host not in done]
                raise LaunchError(f"preparing the job's directory: no answer within {FIRST_ROUND_S} s from "
                                  f"{', '.join(silent)}")
            self._first_round_failed(sessions.results())
        took = timeline.rounds("first-round", {h: (t, done[h]) for h in done}, t0)
        with news:
            # the directory: the last absolute path a node printed (not an ssh warning on stderr)
            dirs = {h: ([x for x in lines if x.startswith("/")] or [""])[-1] for h, lines in said.items()}
            held = {h: line.split(" ", 1)[1] for h, lines in said.items() for line in lines
                    if line.startswith("held sha256:")}
        if missing := [h for h, d in dirs.items() if not d]:
            raise LaunchError(f"preparing the job's directory: no directory from {', '.join(missing)}")
        if wd is not None:
            wdir.sync(wd, self.nodes, self.spec.name, self.ssh, self.say, dirs=dirs)
        return Prepared(dirs, held, login, digest, tuple(took), Sessions(sessions, relay),
                        absent=answer.absent, keys=keys)

    def _first_round_failed(self, results: Sequence[NodeResult]) -> None:
        """The first round's results where a node did not prepare: the LaunchError naming it.
        teardown then removes only where this launch may hold the node's lock: never where
        another launch of the same name holds it (exit 3), nor where ssh never connected."""
        self.started = [n for n, r in zip(self.nodes, results)
                        if r.ok or (r.returncode != 3 and not is_connection_error(r.returncode, r.stderr))]
        locked = [r for r in results if r.returncode == 3]
        if locked:
            raise LaunchError(f"job {self.spec.name}: refused, another launch of that name holds it:\n" + "\n".join(
                f"  {r.host}: {(r.stderr.strip().splitlines() or ['its lock of the name is taken'])[-1]}"
                for r in locked))
        raise_on_failure(results, "preparing the job's directory")
        raise LaunchError("preparing the job's directory: a node ended its session without an answer")

    def plan(self, started: Started, node_dirs: Mapping[str, str], ompi: int,
             quarantined: dict[str, str] | None = None) -> runplan.RunPlan:
        """What the supervisor runs (plan.json): the launcher command apart from its nodes, the
        nodes (the last `--spares` of them ready, with no rank) and the restart policy; it builds
        each attempt's command from them (launchers.attempt_argv), the first one as the launch
        shows it. A per-node command (torchrun) runs in its container through
        launch/node/run.sh: the job's --env values from its file. quarantined: nodes taken out
        before the start ({host: why}; a spare takes each one's place). node_dirs: host -> the
        job's directory there (the plan names the first node's)."""
        spec = self.spec
        ranks, spares = (plan_nodes(f) for f in split_spares(started.facts, spec.spares))
        if quarantined:
            ranks, spares, _ = runplan.swap_out(ranks, spares, quarantined)
        policy = supervision.Policy(spec.restarts, spec.min_nodes or len(ranks), hang_timeout=spec.hang_timeout,
                                    progress_pattern=spec.progress_pattern, straggler_check=spec.straggler_check,
                                    replace_stragglers=spec.replace_stragglers)
        live = [f for f in started.facts if f.hostname not in (quarantined or {})]
        prefix = run_script_argv(spec, live, [], ready=False, fill_hosts=True) if self.launcher.per_node else []
        first = next(f.node.host for f in started.facts if f.hostname == ranks[0].hostname)
        node_dir = node_dirs.get(first, "")
        run = launch_command(spec, ompi, started.subnet)
        check, _ = nccl_mode(spec, started.facts)
        if check != "off":  # every rank's NCCL writes its INIT/NET lines to a file of the node's job dir
            run = replace(run, extra_env=run.extra_env + nccl_net.debug_env(supervision.CONTAINER_JOB_DIR))
        plan = supervision.plan(run, ranks, spares=spares,
                                quarantined=quarantined, ssh=container.supervisor_ssh(),
                                policy=policy, attached=not spec.detach, node_prefix=prefix, node_dir=node_dir)
        return replace(plan, nccl_check=check, efa_types=spec.efa_types) if check != "off" else plan

    def run_supervised(self, started: Started, node_dirs: Mapping[str, str], ompi: int,
                       quarantined: dict[str, str] | None = None, rec: timeline.Recorder | None = None) -> int:
        """The job under its supervisor in the first container (launch/node/supervise.py, started
        by launch/node/host/supervise.sh): attached, its output streams here until it ends;
        detached (--detach), this returns once the job runs, and the nodes supervise it alone.
        quarantined: nodes the network gate left out (spares take their places). rec: the
        launch's timeline so far; the readiness check's and the supervisor's phases join it (each
        node's first step, a restart's phases), and the log shows it as a table once every node
        made its first step (or the output ends before)."""
        plan = self.plan(started, node_dirs, ompi, quarantined)
        if why := nccl_mode(self.spec, started.facts)[1]:
            self.say(f"[launch] NCCL network check off: {why}")
        facts = [f for f in started.facts if f.hostname not in (quarantined or {})]  # the gate's left out
        first = next(f for f in facts if f.hostname == plan.nodes[0].hostname)  # a spare, where the gate took node 1
        rec = rec or timeline.Recorder(time.time())
        store.record(self.spec.name, state="running", ranks=runplan.rank_map(plan.nodes), first=first.node.host,
                     node_names=node_names(facts))
        # the first attempt's command, rank_output.py's name in it, not its text
        shown = runplan.shown_argv(launchers.attempt_argv(plan.run, plan.nodes)[0], plan.run.rank_output)
        spares = f", spares {', '.join(n.hostname for n in plan.spares)}" if plan.spares else ""
        self.say(f"[launch] {self.launcher.name} on {first.hostname}, supervised there"
                 + (f" (up to {plan.max_restarts} restart(s) on at least {plan.min_nodes} node(s){spares})"
                    if plan.max_restarts else spares) + f": {shlex.join(shown)}")
        job_dir = supervision.CONTAINER_JOB_DIR
        sup = supervisor_argv(job_dir, self.spec.detach)
        # ready: the supervisor reaches every container's sshd (mpirun's daemons; torchrun on
        # each node; its health probes), so their sshd answers first, whatever the launcher; its
        # own node's only where the launcher goes there by ssh too (mpirun does not: no handshake).
        # attached: python starts beside the check (detached, the node's program waits for the
        # supervisor's first event, which a failed check would never give: the check first)
        inner = run_script_argv(self.spec, facts, sup, ready=True, fill_hosts=True,
                                ready_skip="" if self.launcher.ssh_here else first.address,
                                ready_beside=not self.spec.detach)
        if started.standby == first.node.host:  # its container waits for run.sh's argv (standby.sh)
            mode = "standby"
        else:  # attached, docker exec -i: stdin's end stops the job
            mode = "detach" if self.spec.detach else "attach"
            inner = ["docker", "exec", *([] if self.spec.detach else ["-i"]), container_name(self.spec.name), *inner]
        argv = self.ssh.argv(first.node, node_programs.host_argv("supervise", node_dirs[first.node.host], mode, *inner))
        program, builders = supervision.supervisor_texts()
        payload = counted_text((program, json.dumps(plan.to_json()), builders))
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", start_new_session=True)
        assert proc.stdin and proc.stdout
        proc.stdin.write(payload)
        proc.stdin.flush()
        if self.spec.detach:
            proc.stdin.close()
        timer = None
        if self.spec.job_timeout:
            def expire() -> None:
                self._timed_out = True
                self.say(f"[launch] job timed out after {self.spec.job_timeout:g} s")
                self.teardown()
            timer = threading.Timer(self.spec.job_timeout, expire)
            timer.daemon = True
            timer.start()
        on_phase, show_timeline = self._timeline_sink(rec, facts, [n.hostname for n in plan.nodes])
        render = supervision.Render(self.launcher.name, first.hostname, t0=rec.t0, names=node_names(facts),
                                    on_phase=on_phase, quarantined=dict(quarantined or {}))
        ready_lines: list[str] = []
        last = ""  # ssh's own last word, where the link to the first node is lost
        if not self.spec.detach:  # the supervisor stops the job when these stop (a lost link)
            threading.Thread(target=_beat, args=(proc.stdin,), name="dtrain-beat", daemon=True).start()
        try:
            for lines in output.read_lines(proc.stdout.buffer.read1):  # what each read brought, at once
                with self.sink.batched():
                    for line in lines:
                        if SSH_SAID.match(line):
                            last = line.strip()
                        if line.startswith(contract.READY_SAYS):
                            ready_lines.append(line)
                            continue
                        seen, slow = len(render.quarantined), len(render.stragglers)
                        for shown in render.feed(line):
                            self.sink.emit(shown)
                        if len(render.quarantined) != seen:  # `dtrain status` says which nodes are out, and why
                            store.record(self.spec.name, quarantined=dict(render.quarantined))
                        if len(render.stragglers) != slow:  # ... and which are stragglers
                            store.record(self.spec.name, stragglers=dict(render.stragglers))
            for shown in render.flush():
                self.sink.emit(shown)
            show_timeline()  # where not every node made a first step (or detached: none yet)
            proc.wait()
        finally:
            if timer:
                timer.cancel()
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            if not self.spec.detach:
                try:
                    proc.stdin.close()
                except OSError:
                    pass  # a beat left unsent to a session that ended
        if self._timed_out:
            return 124
        final = render.final
        if proc.returncode == READY_FAILED and ready_lines and final is None:
            raise LaunchError(_ready_error("\n".join(ready_lines), None))
        if final is None and proc.returncode == SSH_FAILURE and not self._closing:
            self.started = [n for n in self.started if n != first.node]  # teardown does not wait on it
            raise LaunchError(lost_link_error(first, last, self.spec))
        if self.spec.detach:
            if final is not None or proc.returncode != 0:
                return render.exit_code or proc.returncode or 1
            self.detached = True
            n = self.spec.name
            self.say(f"[launch] job {n} detached: it runs on the nodes, supervised from {first.hostname}.\n"
                     f"  follow: dtrain logs --job {n} --follow\n  state:  dtrain status\n"
                     f"  stop:   dtrain stop --job {n}")
            return 0
        if final is None:
            return proc.returncode or 1
        store.record(self.spec.name, final=final)
        return render.exit_code or 0

    def _timeline_sink(self, rec: timeline.Recorder, facts: Sequence[NodeFacts],
                       ranked: Sequence[str]) -> tuple[Callable[[timeline.Entry], None], Callable[[], None]]:
        """(on_phase, show): on_phase adds an entry to rec; once every node of `ranked`
        (hostnames: the nodes that run a rank) made its first step, the timeline goes into the
        log as a table (show does it now, where it has not yet); a restart's phases go into the
        job's record as they come."""
        names = node_names(facts)
        hosts = [f.node.host for f in facts]
        ranked = [names.get(h, h) for h in ranked]
        shown = threading.Event()

        def show() -> None:
            if not shown.is_set():
                shown.set()
                for line in timeline.log_lines(rec.entries(), hosts):
                    self.sink.emit(line)
                store.record(self.spec.name, timeline=timeline.to_json(rec.entries()))

        def on_phase(entry: timeline.Entry) -> None:
            rec.add([entry])
            if entry.restart:
                store.record(self.spec.name, timeline=timeline.to_json(rec.entries()))
            elif timeline.complete(rec.entries(), ranked):
                show()

        return on_phase, show

    def teardown(self) -> None:
        """Remove the job's containers and keys everywhere (from any thread; once)."""
        with self._teardown_lock:
            self._closing = True
            if self._sessions is not None and not self._sessions.done():
                self._sessions.cancel()  # launch sessions still waiting for a node's sshd
            if self.started:
                name = container_name(self.spec.name)
                results = self.ssh.run(self.started, lambda n: store.remove_argv(self.spec.name), timeout=60)
                for r in results:
                    if not r.ok:
                        self.say(f"[launch] warning: could not remove {name} on {r.host}: {r.error}")
                self.started = []
            if self.keys:
                self.keys.remove()  # the job's private keys go with the job
            self.ssh.close()

    def _job(self, started: Started, node_dirs: Mapping[str, str], ompi: int, quarantined: dict[str, str] | None = None,
             rec: timeline.Recorder | None = None) -> int:
        """The job: Ray's steps, or the launcher's command under its supervisor; but where a
        node's sshd never came up (_watch_up ended the job), that is the error."""
        try:
            if not self.launcher.supervised:  # its own protocol (Ray: its cluster, the command its driver)
                code = self.launcher.run(OwnRun(self, started.facts))
            else:
                code = self.run_supervised(started, node_dirs, ompi, quarantined, rec)
        except LaunchError:
            if failure := self.up_failure(self.spec.ready_timeout + 30):
                raise failure from None
            raise
        if failure := self.up_failure(self.spec.ready_timeout + 30):
            raise failure
        return code

    def run(self) -> int:
        wd = wdir.scan(Path(self.spec.workdir), self.spec.workdir_limit) if self.spec.workdir else None
        check_spares(self.spec, len(self.nodes))
        unshared = check_checkpoint_dir(self.spec)
        if not self.launcher.supervised and (self.spec.detach or self.spec.restarts or self.spec.spares
                                             or self.spec.hang_timeout or self.spec.straggler_check):
            raise LaunchError("--detach, --max-restarts, --spares, --hang-timeout and --straggler-check are for "
                              f"{launchers.choices(launchers.names(supervised=True))}, not {self.launcher.name}"
                              + (f" ({self.launcher.output.why_not})" if self.launcher.output.why_not else ""))
        if self.confirm:
            self.confirm()
        # The launcher's lock of the name before anything of the job changes (here or on a node).
        self._lock = store.take_launch_lock(self.spec.name)
        rec = timeline.Recorder(time.time())  # the launch's timeline: every stage adds its phases
        store.new_record(self.spec.name, name=self.spec.name, image=self.spec.image, launcher=self.spec.launcher,
                         command=list(self.spec.command), nodes=[asdict(n) for n in self.nodes],
                         ssh_opts=list(self.spec.ssh_opts), detached=self.spec.detach,
                         progress_pattern=self.spec.progress_pattern,
                         **store.launcher_fields(), started=rec.t0, state="starting", exit_code=None,
                         timeline=[])  # dtrain report: a new launch's record, phases as they come
        self.sink.open(self.dir)
        for warning in ([unshared] if unshared else []) + self.launcher.notes(self.spec, len(self.nodes)):
            self.say(f"[launch] warning: {warning}")
        code = 1
        t0 = time.monotonic()
        restore = sigterm_as_interrupt()
        try:
            prepared = self.prepare(wd, rec.t0)
            rec.add(prepared.timeline)
            store.record(self.spec.name, node_dirs=prepared.node_dirs)
            pulled = self.pull(prepared, rec.t0)
            rec.add(pulled.timeline)
            started = self.up(prepared, pulled, rec)
            rec.add(started.timeline)
            quarantined: dict[str, str] = {}
            if self.spec.check_network:
                began = time.time()
                gate = self.gate_nodes(started)
                store.record(self.spec.name, gate=gate.to_json())  # dtrain report: per node and pair
                rec.add(timeline.rounds("network-gate", {f.node.host: (began, time.time()) for f in started.facts},
                                        rec.t0))
                if gate.culprits:  # the one place a launch learns of a slow node: spares take their place
                    if failure := self.up_failure(0):
                        raise failure  # a node whose container exited: that, not a slow link
                    quarantined = gate_out(started.facts, self.spec.spares, gate)
                    self._take_out(started.facts, quarantined)
            ompi = started.ompi or 4
            if check := self.launcher.preflight(started.ompi):  # the launcher's own tool (mpirun: its version)
                ompi = self.preflight([f for f in started.facts if f.hostname not in quarantined], check) or ompi
            self.say(f"[launch] launch took {time.monotonic() - t0:.1f} s; job output follows")
            code = self._job(started, prepared.node_dirs, ompi, quarantined, rec)
            if self.detached:
                store.record(self.spec.name, state="detached")
                return 0
            store.record(self.spec.name, state="succeeded" if code == 0 else "failed", exit_code=code)
            return code
        except KeyboardInterrupt as e:
            code, what = interrupt_code(e)
            store.record(self.spec.name, state="interrupted", exit_code=code)
            self.say(f"[launch] {what}: removing containers on every node")
            return code
        except LaunchError as e:
            # the CLI exits with USER_ERROR_EXIT for it (tasks.py user_errors): the record says the same
            store.record(self.spec.name, state="failed to launch", exit_code=contract.USER_ERROR_EXIT)
            self.sink.log_only(f"error: {e}")  # the CLI prints it; the log keeps it for diagnose and logs
            raise
        finally:
            if not self.detached:
                self.teardown()
            else:  # the nodes supervise it now: only this machine's copy of the key goes
                self.ssh.close()
                if self.keys:
                    self.keys.remove()
            self.sink.close()
            restore()
            store.record(self.spec.name, ended=time.time(), timeline=timeline.to_json(rec.entries()))
            store.release_launch_lock(self._lock)
            self._lock = None


class _SayLines:
    """A text stream whose complete lines go to say(), prefixed (pull's board, not on a terminal)."""

    def __init__(self, say: Callable[[str], None], prefix: str) -> None:
        self.say, self.prefix, self._buf = say, prefix, ""

    def write(self, text: str) -> int:
        self._buf += text
        *lines, self._buf = self._buf.split("\n")
        for line in lines:
            self.say(self.prefix + line)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def _beat(stdin) -> None:
    """An attached job's supervisor hears from its launcher: a line on its stdin every
    supervision.LAUNCHER_BEAT_S seconds until the pipe closes (the supervisor ends the job after
    supervision.LAUNCHER_SILENCE_S without one: a link lost the node's sshd never notices)."""
    while True:
        time.sleep(supervision.LAUNCHER_BEAT_S)
        try:
            stdin.write("\n")
            stdin.flush()
        except (OSError, ValueError):
            return


class OwnRun:
    """What a launcher that runs its own protocol (launchers' ITS_OWN: Ray) gets of the launch
    (launchers.base.Session): the job, its started nodes, and steps in their containers."""

    def __init__(self, job: Job, facts: Sequence[NodeFacts]):
        self.job, self.spec, self.facts = job, job.spec, list(facts)
        self._by_host = {f.node.host: f for f in self.facts}

    def say(self, line: str) -> None:
        self.job.say(line)

    def in_container(self, argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
        cwd = contract.WORKDIR if self.spec.workdir else None  # where the supervised launchers start too
        return run_argv(self.spec, self.facts, list(argv), ready=False, fill_hosts=True, exec_env=dict(env), cwd=cwd)

    def exec(self, argv: Sequence[str]) -> list[str]:
        return ["docker", "exec", container_name(self.spec.name), *argv]

    def on(self, facts: Sequence[NodeFacts], argv_of: Callable[[NodeFacts], list[str]], timeout: float,
           what: str) -> None:
        self.job.ssh.run([f.node for f in facts], lambda n: argv_of(self._by_host[n.host]), timeout=timeout,
                         what=what or None)

    def stream(self, fact: NodeFacts, argv: Sequence[str]) -> int:
        result = self.job.ssh.run([fact.node], lambda n: list(argv), timeout=self.spec.job_timeout, retries=0,
                                  on_line=lambda n, line: self.job.sink.emit(f"[{fact.hostname}] {line.rstrip()}"))[0]
        return _exit_code(result)

    def closing(self) -> bool:
        return self.job._closing


def node_names(facts: Sequence[NodeFacts]) -> dict[str, str]:
    """A node's hostname and address -> its host, as the launch names it (the timeline's rows)."""
    return {**{f.address: f.node.host for f in facts}, **{f.hostname: f.node.host for f in facts}}


def lost_link_error(first: NodeFacts, last: str, spec: JobSpec) -> str:
    """The ssh session to the job's first node (its supervisor's output) ended on its own: the
    link or the node is gone. What happens to the job there, and to what it left."""
    said = f" ({last})" if last else ""
    if spec.detach:
        return (f"lost the connection to {first.node.host} ({first.hostname}), the job's first node, while "
                f"starting job {spec.name}{said}; it may still run there: dtrain status, dtrain stop --job {spec.name}")
    return (f"lost the connection to {first.node.host} ({first.hostname}), the job's first node, where its "
            f"supervisor runs{said}: the supervisor stops the job once it sees the launcher gone, and each "
            f"node's watchdog removes the job's container and files there within {spec.heartbeat_timeout} s "
            f"of its last heartbeat")


def _ready_error(output: str, error: str | None) -> str:
    lines = [ln.removeprefix(contract.READY_SAYS) for ln in output.splitlines() if ln.startswith(contract.READY_SAYS)]
    return f"containers started, but not every node's sshd answers on {contract.SSH_PORT}:\n  " + "\n  ".join(
        lines or [error or "no answer"])


def _exit_code(r: NodeResult) -> int:
    if r.returncode is None:
        return 124 if r.error and "timed out" in r.error else 1
    return r.returncode


def absent_line(image: str) -> str:
    """The launch's one line where the registry has no such image (HTTP 404 to the launcher's
    HEAD request): nothing is pulled; the start step fails on every node without an image of
    that name, naming them."""
    ref = parse_ref(image)
    return (f"the registry {ref.registry} has no {ref.repository}:{ref.reference} (HTTP 404): check --image's "
            "name and tag (`dtrain push` prints what it pushed); nothing pulled, a node that holds an image "
            "of that name uses it")


