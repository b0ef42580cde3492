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

import contextlib
import ipaddress
import os
import posixpath
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from dtrain import contract
from dtrain.interrupts import interrupt_code, sigterm_as_interrupt
from dtrain.contract import container_name, node_key_dir
from dtrain.terminal import clean
from dtrain.images.spec import vtuple
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import commands, joining, netgate, nic, node_programs, runplan, store, supervision
from dtrain.launch.analysis import timeline
from dtrain.launch.jobs import workdir as wdir
from dtrain.launch.jobs.commands import go_text, ready_error, run_argv, split_spares, up_args
from dtrain.launch.jobs.session import Joiner, LinkLost, Outcome, Session
from dtrain.launch.jobs.sink import Sink
from dtrain.launch.jobs.spec import JobSpec, NodeFacts, Pulled, Started
from dtrain.launch.remote.fanout import (Fanout, NodeResult, host_lines, is_connection_error,
                                         raise_on_failure)
from dtrain.launch.remote.hosts import Node
from dtrain.launch.jobs import launchers
from dtrain.launch.jobs.launchers import env_file
from dtrain.launch.jobs.login import Login, login_for
from dtrain.launch.jobs.pull import RegistryAnswer, ask_registry, parse_ref, pull_on_nodes
from dtrain.launch.remote.transport import SshTransport

FIRST_ROUND_S = 120  # the longest a node may take to answer the first round (its lock, the job's directory)
READY_FAILED = commands.READY_FAILED


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


def join_problem(fact: NodeFacts, image_id: str, started: Started) -> str:
    """What keeps a node that came while the job runs from being its spare ("" nothing): not the
    job's image; a hostname a node of the job has (Open MPI and torchrun tell nodes apart by it);
    GPUs or slots no node of the job has (a spare takes a node's place at the same world size);
    another NIC name where the job's are one (the launcher's flags name it), or an address
    outside the job's subnet where they differ."""
    if image_id != started.image_id:
        return (f"it holds image {image_id[:19]} for the job's {started.image_id[:19]}: the tag moved since the "
                "start (push a new tag, or pull by digest)")
    if fact.hostname in {f.hostname for f in started.facts}:
        return f"its hostname {fact.hostname} is a node's of the job"
    if fact.gpus not in {f.gpus for f in started.facts}:
        return f"it has {fact.gpus} GPU(s), the job's nodes {sorted({f.gpus for f in started.facts})}"
    if fact.node.slots not in {f.node.slots for f in started.facts}:
        return f"it has {fact.node.slots} slot(s), the job's nodes {sorted({f.node.slots for f in started.facts})}"
    if started.subnet is None and fact.iface != started.facts[0].iface:
        return f"its NIC is {fact.iface}, the job's nodes' {started.facts[0].iface}"
    if started.subnet is not None and ipaddress.ip_address(fact.address) not in ipaddress.ip_network(started.subnet):
        return f"its address {fact.address} is outside the job's subnet {started.subnet}"
    return ""


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


# ---------------------------------------------------------------- the start on nodes


def start_on_nodes(ssh: SshTransport, spec: JobSpec, nodes: Sequence[Node], public_key: str,
                   secrets: str, say: Callable[[str], None], node_dirs: Mapping[str, str] | None = None,
                   login: Login | None = None, *, t0: float | None = None,
                   on_phase: Callable[[timeline.Entry], None] | None = None,
                   sessions: Sessions | None = None, standby: str = "",
                   prefetch: frozenset[str] = frozenset()) -> tuple[Started, Fanout]:
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
    standby: the host whose container waits for the job's supervisor (container_spec); "" none.
    prefetch: the hosts where the first step's reads are prefetched (they pulled the image lazily)."""
    began = time.monotonic()
    t0 = time.time() if t0 is None else t0
    login = login_for(spec.image) if login is None else login
    dirs = node_dirs or {}
    standby = standby if dirs.get(standby) and standby in {n.host for n in nodes} else ""
    args = {n.host: up_args(spec, login.args, public_key, dirs.get(n.host, ""), standby=n.host == standby,
                            prefetch=n.host in prefetch) for n in nodes}
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
    """One launch: `run()` drives the stages (Stage, STAGES below), each taking what the earlier
    ones returned (State):

        prepare(workdir) -> Prepared       the job's directory, the image held where, the login
        pull(prepared) -> Pulled           the image onto the nodes that lack it
        up(prepared, pulled) -> Started    a container on every node, their facts
        gate(started) -> quarantined       --check-network: the nodes a slow link takes out
        preflight(started) -> ompi         the launcher's own tool in the first container
        run(started, ...) -> Outcome       Session.run (launch/jobs/session.py), or the launcher's
                                           own run (Ray)
        teardown (end)                     whatever the stages left on a node

    It returns the job's exit code and always tears down. What it keeps is only what teardown
    needs (the transport, the nodes that may hold a container, the key, the nodes' sessions)."""

    def __init__(self, spec: JobSpec, nodes: list[Node], say: Callable[[str], None] = print,
                 confirm: Callable[[], None] | None = None, joining: Callable[[], list[Node]] | None = None):
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
        # the nodes' provider's nodes now (an EC2 cluster: its Auto Scaling group's), asked while an
        # attached job with --spares runs: a node new to the job joins as a spare (join, joining.py)
        self.joining = joining
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
        self._joins: list[Fanout] = []  # the sessions of nodes joining as spares (join)
        self.sink = Sink()  # the job's output: the screen, output.log (opened by run)

    @property
    def closing(self) -> bool:
        """The job is ending (its teardown began): nothing more starts on a node."""
        return self._closing

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
                                                     sessions=prepared.sessions, standby=standby,
                                                     # not while --check-network measures the links it would share
                                                     prefetch=pulled.lazy if pulled and not self.spec.check_network
                                                     else frozenset())
        except StartFailed as e:
            self.started = e.started
            raise
        self._watch = threading.Thread(target=self._watch_up, name="dtrain-up", daemon=True)
        self._watch.start()
        if started.subnet is not None:
            write_node_env(self, started.facts)
        return started

    def gate_nodes(self, started: Started) -> netgate.GateResult:
        """The network gate (--check-network) between the started containers, on the job's NIC:
        a few seconds of TCP streams in two ring rounds (launch/jobs/netgate.py); says one line
        (lowest and median rate, time taken) and returns the result, whose .culprits name the
        nodes whose link is well below their peers' or the instance type's expectation."""
        result = netgate.run_gate(self.ssh, started.facts, container_name(self.spec.name))
        self.say(f"[launch] {result.summary()}")
        return result

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
            raise LaunchError(ready_error(r.stdout + r.stderr, r.error))
        if not r.ok:
            said = [ln.strip() for ln in (r.stderr + r.stdout).splitlines()
                    if ln.strip() and not ln.startswith(contract.READY_SAYS)]
            raise LaunchError(f"--launcher {self.launcher.name}: the image fails the launcher's check on "
                              f"{facts[0].hostname}: {said[-1] if said else r.error or 'no output'}")
        found = self.launcher.preflight_result(r.stdout)
        self.say(f"[launch] sshd reachable on every node; {found.said} ({time.monotonic() - t0:.1f} s)")
        return found.ompi

    def prepare(self, wd: wdir.Workdir | None, t0: float = 0.0, joining: Sequence[Node] = ()) -> Prepared:
        """Before the containers: each node's lock of the name (host/prepare.sh: a node where
        another launch holds it refuses, changing nothing), the job's directory on every node
        (each node's own, ~/.dtrain/nodes/HOST/jobs/<job>: dtrain/contract.py; made anew, with
        the node watchdog's program), then the workdir, sent to every node at once.
        The same round asks each node whether it holds the image already (pull()).
        t0: the launch's start (its timeline: each node's first round, as this launcher saw it).
        joining: instead of the job's nodes, these, come while the job runs (join): their
        sessions are the Prepared's alone, the job's keys the ones made at the start."""
        nodes = list(joining) or self.nodes
        watch = contract.node_script("watch.sh")
        login, answer = registry(self.spec)
        digest = answer.digest or ""
        # what each node is asked about the image (host/prepare.sh): IMAGE POLICY DIGEST
        question = () if login is None else (self.spec.image, self.spec.pull, digest)
        # First on each node its lock of the name (refused: exit 3, nothing changed there). The
        # session stays open: the start step goes on in it (host/prepare.sh prepare_up).
        argv = node_programs.host_argv("prepare_up", store.check_name(self.spec.name), self.owner, *question)
        said: dict[str, list[str]] = {n.host: [] for n in nodes}
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
        if joining:
            with self._teardown_lock:  # the job's end and this join: one of them first, whole
                if self._closing:
                    raise LaunchError("the job is ending")
                self.started += [n for n in nodes if n not in self.started]  # until the sessions say otherwise
        else:
            self.started = list(nodes)
        # their time limit: the pull step's (1800 s) while they wait, then the start step's
        sessions = self.ssh.start(nodes, lambda n: argv, stdin=lambda n: watch + "\0",
                                  hold_stdin=True, timeout=3600, on_line=relay)
        if not joining:
            self._sessions = sessions
        else:
            with self._teardown_lock:
                self._joins.append(sessions)  # teardown ends them (a join under way when the job ends)
                if self._closing:  # it ran meanwhile: these sessions were not its to end
                    sessions.cancel()
                    raise LaunchError("the job is ending")
        keys = self.keys if joining and self.keys else self._keys()  # ssh-keygen while the nodes answer
        if self.launcher.supervised:
            supervision.supervisor_texts()  # and the supervisor's files read (Session.run sends them)
        deadline = time.monotonic() + FIRST_ROUND_S
        with news:  # until every node prepared, or a session ended before it did
            while (len(done) < len(nodes) and not set(sessions.ended()) - set(done)
                   and time.monotonic() < deadline):
                news.wait(0.05)
        if len(done) < len(nodes):  # the others end now, before their start step
            for n in nodes:
                sessions.send(n.host, "", close=True)
            if not set(sessions.ended()) - set(done):  # no node failed: some did not answer in time
                sessions.cancel()
                silent = [n.host for n in nodes if n.host not in done]
                raise LaunchError(f"preparing the job's directory: no answer within {FIRST_ROUND_S} s from "
                                  f"{', '.join(silent)}")
            first_round_failed(self, sessions.results(), nodes)
        took = timeline.rounds("first-round", {h: (t, done[h]) for h in done}, t0)
        with news:
            # the directory: the last absolute path a node printed (not an ssh warning on stderr)
            dirs = {h: ([x for x in lines if x.startswith("/")] or [""])[-1] for h, lines in said.items()}
            held = {h: line.split(" ", 1)[1] for h, lines in said.items() for line in lines
                    if line.startswith("held sha256:")}
        if missing := [h for h, d in dirs.items() if not d]:
            raise LaunchError(f"preparing the job's directory: no directory from {', '.join(missing)}")
        if wd is not None:
            wdir.sync(wd, nodes, self.spec.name, self.ssh, self.say, dirs=dirs)
        return Prepared(dirs, held, login, digest, tuple(took), Sessions(sessions, relay),
                        absent=answer.absent, keys=keys)

    def session(self, joiner: Joiner | None = None) -> Session:
        """The attached-supervisor session of this job (launch/jobs/session.py); joiner: what
        makes nodes that come while it runs its spares (joiner_of)."""
        return Session(self.spec, self.launcher, self.ssh, self.say, self.sink, stop=self.teardown,
                       closing=lambda: self._closing, joiner=joiner)

    def teardown(self) -> None:
        """Remove the job's containers and keys everywhere (from any thread; once)."""
        with self._teardown_lock:
            self._closing = True
            if self._sessions is not None and not self._sessions.done():
                self._sessions.cancel()  # launch sessions still waiting for a node's sshd
            for fan in self._joins:  # a node joining as a spare: its steps end here
                if not fan.done():
                    fan.cancel()
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

    def run(self) -> int:
        """The stages one after another (Stage, STAGES: each takes what the earlier ones
        returned, State); the job's exit code. Ctrl-C, SIGTERM and a failure at any stage end
        in the teardown stage, as the job's end does; a detached job's containers stay."""
        wd, unshared = checks(self)
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
        state = State(Stage.PREPARE, Given(wd, rec, time.monotonic()))
        restore = sigterm_as_interrupt()
        try:
            while state.stage is not Stage.TEARDOWN:
                state = STAGES[state.stage](self, state)
            return result(self.spec.name, state.outcome)
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
            self.end(detached=state.outcome is not None and state.outcome.detached)
            restore()
            store.record(self.spec.name, ended=time.time(), timeline=timeline.to_json(rec.entries()))

    def end(self, detached: bool) -> None:
        """The teardown stage: every container and key (teardown); detached, only this machine's
        copy of the key (the nodes supervise the job now). Then the log and the launch's lock."""
        if not detached:
            self.teardown()
        else:
            self.ssh.close()
            if self.keys:
                self.keys.remove()
        self.sink.close()
        store.release_launch_lock(self._lock)
        self._lock = None


def first_round_failed(job: Job, results: Sequence[NodeResult], nodes: Sequence[Node]) -> None:
    """The first round's results (of nodes) where a node did not prepare: the LaunchError
    naming it. teardown then removes only where this launch may hold the node's lock: never
    where another launch of the same name holds it (exit 3), nor where ssh never connected."""
    untouched = {n.host for n, r in zip(nodes, results)
                 if not r.ok and (r.returncode == 3 or is_connection_error(r.returncode, r.stderr))}
    job.started = [n for n in job.started if n.host not in untouched]
    locked = [r for r in results if r.returncode == 3]
    if locked:
        raise LaunchError(f"job {job.spec.name}: refused, another launch of that name holds it:\n" + "\n".join(
            f"  {r.host}: {(r.stderr.strip().splitlines() or ['its lock of the name is taken'])[-1]}"
            for r in locked))
    raise_on_failure(results, "preparing the job's directory")
    raise LaunchError("preparing the job's directory: a node ended its session without an answer")


def take_out(job: Job, facts: Sequence[NodeFacts], out: dict[str, str]) -> None:
    """Nodes the gate named, before the job: their containers go, spares take their places
    (once every node's start session has ended: a container removed before its sshd was seen
    would end the job)."""
    if failure := job.up_failure(job.spec.ready_timeout + 30):
        raise failure
    if job._watch is not None and job._watch.is_alive():
        raise LaunchError(f"not every node's sshd came up within {job.spec.ready_timeout + 30:g} s")
    store.record(job.spec.name, quarantined=dict(out))
    nodes = [f.node for f in facts if f.hostname in out]
    for f in facts:
        if f.hostname in out:
            job.say(f"[launch] {f.hostname} taken out before the start: {out[f.hostname]}")
    raise_on_failure(job.ssh.run(nodes, lambda n: store.remove_argv(job.spec.name), timeout=60),
                     "removing the containers of the nodes the network gate named")


# ---------------------------------------------------------------- the stages (Job.run)


def checks(job: Job) -> tuple[wdir.Workdir | None, str | None]:
    """Before anything is sent: the workdir read, the spares and flags checked, the user's
    confirmation (trust.check_hosts); (the workdir, the unshared checkpoint dir's warning)."""
    wd = wdir.scan(Path(job.spec.workdir), job.spec.workdir_limit) if job.spec.workdir else None
    check_spares(job.spec, len(job.nodes))
    unshared = check_checkpoint_dir(job.spec)
    if not job.launcher.supervised and (job.spec.detach or job.spec.restarts or job.spec.spares
                                         or job.spec.hang_timeout or job.spec.straggler_check):
        raise LaunchError("--detach, --max-restarts, --spares, --hang-timeout and --straggler-check are for "
                          f"{launchers.choices(launchers.names(supervised=True))}, not {job.launcher.name}"
                          + (f" ({job.launcher.output.why_not})" if job.launcher.output.why_not else ""))
    if job.confirm:
        job.confirm()
    return wd, unshared


def registry(spec: JobSpec) -> tuple[Login | None, RegistryAnswer]:
    """What the registry says once for every step: its login and (--pull always) the
    image's digest, or that it has no such image; (None, unknown) for --pull never."""
    if spec.pull == "never":
        return None, RegistryAnswer(None)
    login = login_for(spec.image)
    answer = RegistryAnswer(None)
    if spec.pull == "always":  # a registry this machine cannot reach costs at most 2 x 3 s
        answer = ask_registry(spec.image, user=login.user if login.registry else None,
                              password=login.password if login.registry else None, timeout=3)
    return login, answer


def pull(job: Job, prepared: Prepared, t0: float = 0.0) -> Pulled:
    """The image onto every node before the containers (launch/jobs/pull.py): per node, bytes
    and rate while it pulls, then one summary line naming the slowest node; nothing pulled,
    and no session opened, where prepare found the image held (the registry's digest, for
    --pull always). The start step then pulls only where a node has no image of that name
    (a failed pull here, a local image there: it is used, with the warning below; no image:
    the start step's error names the node). t0: the launch's start (its timeline)."""
    t = time.time()
    if job.spec.pull == "never":
        return Pulled(job.spec.pull, pull_timeline({}, job.nodes, t, t0))
    if prepared.absent:  # a misspelt name or tag: no node would get it; one line, not one per node
        job.say(f"[launch] warning: {absent_line(job.spec.image)}")
        return Pulled("missing", pull_timeline({}, job.nodes, t, t0))
    tty = job.say is print and sys.stdout.isatty()
    out = sys.stdout if tty else _SayLines(job.say, "[launch] pull ")
    progress = []
    try:
        progress = pull_on_nodes(job.nodes, job.spec.image, job.spec.pull, ssh=job.ssh, out=out, tty=tty,
                                 login=prepared.login, digest=prepared.digest,
                                 show_present=False,  # "": not asked again
                                 held=prepared.held, clock=time.time)
    except LaunchError as e:
        job.say(f"[launch] warning: {e}\n  (a node that holds an image of that name uses it)")
    return Pulled("missing", pull_timeline({p.host: p.ended for p in progress if p.state == "pulled"},
                                           job.nodes, t, t0),
                  lazy=frozenset(p.host for p in progress if p.state == "pulled" and p.lazy))


def write_node_env(job: Job, facts: Sequence[NodeFacts], nodes: Sequence[Node] | None = None) -> None:
    """Where NICs differ: each node's NCCL/Gloo interface into node.env in the job's key
    directory (mounted in its container; read by nic.NODE_ENV_WRAPPER). Data on stdin.
    nodes: those to write (the job's by default)."""
    path = f"{node_key_dir(job.spec.name)}/{nic.NODE_ENV_FILE}"
    by_host = {f.node.host: f for f in facts}
    results = job.ssh.run(job.nodes if nodes is None else nodes,
                          lambda n: node_programs.program_argv("write-private.sh", [path]),
                           stdin=lambda n: nic.node_env_text(by_host[n.host].iface, skip=list(job.spec.env)),
                           timeout=60)
    raise_on_failure(results, "writing each node's NIC")


class Stage(Enum):
    PREPARE = "prepare"
    PULL = "pull"
    UP = "up"
    GATE = "gate"
    PREFLIGHT = "preflight"
    RUN = "run"
    TEARDOWN = "teardown"


@dataclass(frozen=True)
class Given:
    """What every stage may read: the workdir read (None without --workdir), the launch's
    timeline (each stage adds its phases), and when the launch began (time.monotonic)."""

    wd: wdir.Workdir | None
    rec: timeline.Recorder
    t0: float


@dataclass(frozen=True)
class State:
    """Where the launch is: the stage to run next and what the stages before returned."""

    stage: Stage
    given: Given
    prepared: Prepared = Prepared()
    pulled: Pulled | None = None
    started: Started | None = None
    quarantined: Mapping[str, str] = field(default_factory=dict)  # the network gate's left out: {host: why}
    ompi: int = 4
    outcome: Outcome | None = None  # the job's end (the run stage)


def prepare_stage(job: Job, s: State) -> State:
    prepared = job.prepare(s.given.wd, s.given.rec.t0)
    s.given.rec.add(prepared.timeline)
    store.record(job.spec.name, node_dirs=prepared.node_dirs)
    return replace(s, stage=Stage.PULL, prepared=prepared)


def pull_stage(job: Job, s: State) -> State:
    pulled = pull(job, s.prepared, s.given.rec.t0)
    s.given.rec.add(pulled.timeline)
    return replace(s, stage=Stage.UP, pulled=pulled)


def up_stage(job: Job, s: State) -> State:
    started = job.up(s.prepared, s.pulled, s.given.rec)
    s.given.rec.add(started.timeline)
    return replace(s, stage=Stage.GATE, started=started)


def gate_stage(job: Job, s: State) -> State:
    """--check-network: the gate between the containers; the nodes it names are taken out
    before the job, spares in their places (the one place a launch learns of a slow node)."""
    assert s.started is not None
    if not job.spec.check_network:
        return replace(s, stage=Stage.PREFLIGHT)
    began = time.time()
    gate = job.gate_nodes(s.started)
    store.record(job.spec.name, gate=gate.to_json())  # dtrain report: per node and pair
    s.given.rec.add(timeline.rounds("network-gate", {f.node.host: (began, time.time()) for f in s.started.facts},
                                    s.given.rec.t0))
    if not gate.culprits:
        return replace(s, stage=Stage.PREFLIGHT)
    if failure := job.up_failure(0):
        raise failure  # a node whose container exited: that, not a slow link
    quarantined = gate_out(s.started.facts, job.spec.spares, gate)
    take_out(job, s.started.facts, quarantined)
    return replace(s, stage=Stage.PREFLIGHT, quarantined=quarantined)


def preflight_stage(job: Job, s: State) -> State:
    """The launcher's own tool checked (mpirun: its version, Open MPI's major for its flags)."""
    assert s.started is not None
    ompi = s.started.ompi or 4
    if check := job.launcher.preflight(s.started.ompi):
        ompi = job.preflight([f for f in s.started.facts if f.hostname not in s.quarantined], check) or ompi
    job.say(f"[launch] launch took {time.monotonic() - s.given.t0:.1f} s; job output follows")
    return replace(s, stage=Stage.RUN, ompi=ompi)


def run_stage(job: Job, s: State) -> State:
    """The job: Ray's steps, or the launcher's command under its supervisor (session.py); but
    where a node's sshd never came up (Job._watch_up ended the job), that is the error."""
    assert s.started is not None
    try:
        if not job.launcher.supervised:  # its own protocol (Ray: its cluster, the command its driver)
            with beating(job, s.prepared.node_dirs):
                outcome = Outcome(job.launcher.run(OwnRun(job, s.started.facts)))
        else:
            outcome = job.session(joiner_of(job, s.started, s.given.wd)).run(
                s.started, s.prepared.node_dirs, s.ompi, dict(s.quarantined), s.given.rec)
    except LaunchError as e:
        if isinstance(e, LinkLost):  # the first node is gone: teardown does not wait on it
            job.started = [n for n in job.started if n != e.node]
        if failure := job.up_failure(job.spec.ready_timeout + 30):
            raise failure from None
        raise
    if failure := job.up_failure(job.spec.ready_timeout + 30):
        raise failure
    return replace(s, stage=Stage.TEARDOWN, outcome=outcome)


def join(job: Job, node: Node, started: Started, wd: wdir.Workdir | None) -> runplan.PlanNode:
    """A node come while the job runs (its Auto Scaling group's replacement) made a warm spare
    of it: its lock of the name, the job's directory and workdir (prepare), the image where
    it has none, the container with the job's keys (start_on_nodes), its sshd answering; it
    must hold the job's image (the same ID), its GPUs, slots and NIC (or subnet) as the job's
    nodes have them, and a hostname of its own. Its PlanNode, for the supervisor
    (runplan.spare_line). joining.NotYet where it is still starting (its sshd, its first boot,
    its engine: host/booted.sh); LaunchError naming what keeps it out otherwise, its
    container removed; whatever is left there goes with the job (teardown)."""
    booted(job, node)
    prepared = job.prepare(wd, joining=[node])
    assert prepared.sessions is not None and job.keys is not None
    private, public, host_key = job.keys.result()
    try:
        try:
            new, fan = start_on_nodes(job.ssh, replace(job.spec, pull="missing"), [node], public,
                                      private + host_key + env_file(job.spec.env), lambda line: None,
                                      prepared.node_dirs, prepared.login, sessions=prepared.sessions)
        except StartFailed as e:
            raise LaunchError(str(e)) from None
        f = new.facts[0]
        if problem := "the job is ending" if job.closing else join_problem(f, new.image_id, started):
            raise LaunchError(problem)
        ready = threading.Thread(target=fan.results, daemon=True)  # each session ends once its sshd listens
        ready.start()
        ready.join(job.spec.ready_timeout + 30)
        if ready.is_alive() or not all(r.ok for r in fan.results()):
            raise LaunchError(f"its container's sshd did not come up within {job.spec.ready_timeout + 30:g} s")
        if started.subnet is not None:  # NIC names differ: its own into its node.env, as the others'
            write_node_env(job, [f], [node])
    except BaseException:
        prepared.sessions.fanout.cancel()
        if not job.closing:  # the job's teardown removes it otherwise
            job.ssh.run([node], lambda n: store.remove_argv(job.spec.name), timeout=60)
        raise
    return runplan.PlanNode(f.address, f.hostname, node.slots, f.iface, f.gpus)


def booted(job: Job, node: Node) -> None:
    """joining.NotYet where node is still starting (host/booted.sh); LaunchError where ssh
    refuses it for good (its key, its user)."""
    if job.closing:
        raise LaunchError("the job is ending")
    r = job.ssh.run([node], lambda n: node_programs.host_argv("booted"), timeout=60, retries=0)[0]
    if not r.ok:
        why = " ".join((r.error or r.stderr.strip() or f"exit {r.returncode}").split())[:200]
        if is_connection_error(r.returncode, r.stderr) or r.returncode is None:
            raise joining.NotYet(f"ssh does not reach it yet ({why})")
        raise LaunchError(f"ssh: {why}")
    said = (r.stdout.split() or ["?"])[-1]
    if said == "booting":
        raise joining.NotYet("its first boot (cloud-init) is still running")
    if said != "ready":
        raise joining.NotYet("its docker engine does not answer yet")


def joiner_of(job: Job, started: Started, wd: wdir.Workdir | None) -> Joiner | None:
    """An attached job with --spares on nodes that can change (Job.joining): each node that
    comes while it runs made a spare (Job.join) and offered to the supervisor (joining.follow)."""
    source = job.joining
    if source is None or not job.spec.spares or job.spec.detach:
        return None
    known = {n.host for n in job.nodes}
    return lambda offer, stop: joining.follow(source, known, lambda n: join(job, n, started, wd), offer, job.say, stop)


STAGES: dict[Stage, Callable[[Job, State], State]] = {
    Stage.PREPARE: prepare_stage, Stage.PULL: pull_stage, Stage.UP: up_stage, Stage.GATE: gate_stage,
    Stage.PREFLIGHT: preflight_stage, Stage.RUN: run_stage}  # Stage.TEARDOWN: Job.end, always


def result(name: str, outcome: Outcome | None) -> int:
    """The job's exit code from how it ended, as its record says it."""
    assert outcome is not None
    if outcome.detached:
        store.record(name, state="detached")
        return 0
    store.record(name, state="succeeded" if outcome.code == 0 else "failed", exit_code=outcome.code)
    return outcome.code


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


def heartbeat_argv(node_dir: str) -> list[str]:
    """Refresh the job's heartbeat file on a node (what its watchdog, launch/node/watch.sh, waits for)."""
    return ["touch", "--", f"{node_dir}/heartbeat"]


@contextlib.contextmanager
def beating(job: Job, node_dirs: Mapping[str, str]) -> Iterator[None]:
    """While a launcher of its own protocol runs (Ray: no supervisor beats), the launch refreshes
    every node's heartbeat file itself, six times per --heartbeat-timeout: without it each node's
    watchdog takes the job for gone after that timeout and stops its container (the launch's
    kill -9 stops these too, and the nodes' parts end, as a supervisor's silence ends them)."""
    every = max(0.5, job.spec.heartbeat_timeout / 6)
    done = threading.Event()

    def beat(node: Node) -> None:  # each node on its own: one that does not answer holds up no other
        while not done.is_set():
            job.ssh.run([node], lambda n: heartbeat_argv(node_dirs[n.host]), timeout=max(10.0, every), retries=0)
            done.wait(every)

    for n in job.nodes:
        if node_dirs.get(n.host):
            threading.Thread(target=beat, args=(n,), name=f"dtrain-heartbeat-{n.host}", daemon=True).start()
    try:
        yield
    finally:
        done.set()


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


