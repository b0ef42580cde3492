"""Run a job: host-network containers on every node, then mpirun, horovodrun or torchrun.

    one ssh session per node: probe (docker, NIC, GPUs, EFA, port 2022) + pull + a fresh SSH
    key + the container (flags chosen by the node); once every container runs:
    -> checks across nodes (same image, NIC name, hostnames, driver) -> the job, whose first
    step from the first container is sshd reachable node to node (and /etc/hosts filled),
    while each node's session waits for its own sshd (a crash there ends the job)
    -> teardown

Every step runs on all nodes in parallel (launch.fanout). A failure at any step names the
node and the reason, and removes whatever was already started on every node. Ctrl-C does
the same. The job's output streams live, each line prefixed with node and rank, and is kept
in ~/.dtrain/jobs/<name>/output.log for `invoke logs` and `invoke diagnose`.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Literal, Sequence

from dtrain.launch.jobs import commands
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs.fanout import Fanout, NodeResult, is_connection_error, raise_on_failure, run_all
from dtrain.launch.jobs.hosts import Node, kex_opts, ssh_argv

Launcher = Literal["mpirun", "horovodrun", "torchrun", "ray"]
SSH_PORT = 2022
LABEL = "dtrain.job"
# ssh inside the first container: the readiness check opens one master connection per node
# and mpirun's daemon launch (all from that container: no tree spawn) reuses them.
CONTAINER_SSH_MUX = ("-o", "ControlMaster=auto", "-o", "ControlPath=/tmp/dtrain-mux-%C",
                     "-o", "ControlPersist=600")
READY_FAILED = 97  # exit code of the readiness check inside the job command


MUX_PERSIST_S = 60  # seconds an idle ssh master to a node outlives its launch (Ansible keeps 60 too)


def mux_dir() -> tuple[Path, bool]:
    """(directory for ssh master sockets, private?): the user's shared /tmp/dtrain-ssh-UID when
    it is a 0700 directory of theirs; else a fresh private one, closed with the job. /tmp, not
    ~/.dtrain: a socket path must stay under ~100 characters."""
    d = Path(tempfile.gettempdir()) / f"dtrain-ssh-{os.getuid()}"
    try:
        d.mkdir(mode=0o700, exist_ok=True)
        st = d.lstat()
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700:
            return d, False
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="dtrain-ssh-")), True


def close_masters(nodes: Sequence[Node], ssh_opts: Sequence[str] = (), where: Path | None = None) -> None:
    """Close the ssh master connections to nodes (default: the shared ones of mux_dir())."""
    where = where or mux_dir()[0]
    procs = [subprocess.Popen(["ssh", *ssh_opts, "-o", f"ControlPath={where}/%C", "-O", "exit",
                               f"{n.user}@{n.host}" if n.user else n.host, *(["-p", str(n.port)] if n.port else [])],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for n in nodes]
    for p in procs:
        p.wait()


def jobs_dir() -> Path:
    return Path(os.environ.get("DTRAIN_HOME", "~/.dtrain")).expanduser() / "jobs"


@dataclass(frozen=True)
class JobSpec:
    image: str
    command: tuple[str, ...]
    launcher: Launcher = "mpirun"
    name: str = ""
    env: dict[str, str] = field(default_factory=dict)  # -e K=V, forwarded to every rank
    forward: tuple[str, ...] = ()  # names forwarded from the launching container's env
    iface: str | None = None  # override the detected NIC
    mounts: tuple[commands.Mount, ...] = ()
    shm_size: str | None = None  # None: --ipc host
    master_port: int = 29500
    rdzv: Literal["static", "c10d"] = "static"
    pull: Literal["always", "missing", "never"] = "always"  # as docker's --pull
    ready_timeout: float = 60
    job_timeout: float | None = None
    ssh_opts: tuple[str, ...] = ()  # extra ssh -o options to reach the nodes
    extra_mca: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class NodeFacts:
    """What the probe found on one node."""

    node: Node
    address: str  # the node's own address of the SSH connection: what peers use
    hostname: str
    iface: str
    gpus: int
    efa: tuple[str, ...]
    port_holder: str  # "" when port 2022 is free
    memlock: int = -1  # dockerd's hard RLIMIT_MEMLOCK in bytes; -1 = unlimited
    driver: str = ""  # NVIDIA driver version, "" without GPUs
    port_jobs: tuple[str, ...] = ()  # dtrain jobs running on the node when port 2022 is taken


# ---------------------------------------------------------------- pure helpers

# Shell builtins where they do (a node may run this with the launch's other steps on few cores).
PROBE_SCRIPT = r"""
set -u
set -- ${SSH_CONNECTION:-}; addr=${3:-}; echo "addr=$addr"
read -r h < /proc/sys/kernel/hostname; echo "hostname=$h"
gpus=0 driver=
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
  echo "gpus=$gpus"; echo "driver=$driver"
fi
efa=; for d in /dev/infiniband/uverbs*; do [ -e "$d" ] && efa="$efa $d"; done; echo "efa=$efa"
# ss filters in the kernel (reading /proc/net/tcp costs ~10x more); -p, slow (it reads every
# process), only to name a holder.
port=$(ss -Hltn 'sport = :2022' 2>/dev/null)
if [ -n "$port" ]; then
  port=$(ss -Hltnp 'sport = :2022' 2>/dev/null | head -1)
  echo "port=$port"
  echo "port_jobs=$(docker ps --filter label=dtrain.job --format '{{.Label "dtrain.job"}}' 2>/dev/null | tr '\n' ' ')"
fi
# dockerd writes its pid without a newline: read fails at EOF but sets dpid.
dpid=; read -r dpid 2>/dev/null < /var/run/docker.pid; [ -n "$dpid" ] || dpid=$(pgrep -o dockerd)
memlock=; while read -r a b c d e f; do [ "$a $b $c" != "Max locked memory" ] || memlock=$e; done \
  2>/dev/null < /proc/${dpid:-0}/limits; echo "memlock=$memlock"
echo "ipjson=$(ip -j addr 2>/dev/null)"
"""


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
        names = {i.get("ifname") for i in json.loads(ipjson or "[]")}
        if iface not in names:
            raise LaunchError(f"{node.host}: --iface {iface} does not exist "
                              f"(interfaces: {', '.join(sorted(n for n in names if n))})")
        chosen = iface
    else:
        chosen = commands.interface_for_address(ipjson, address, host=node.host)
    lock = p.get("memlock", "")
    return NodeFacts(node, address, p.get("hostname", node.host), chosen,
                     int(p.get("gpus") or 0), tuple(p.get("efa", "").split()), p.get("port", ""),
                     int(lock) if lock.isdigit() else -1, p.get("driver", ""),
                     tuple(p.get("port_jobs", "").split()))


def port_jobs_hint(taken: Sequence[NodeFacts]) -> str:
    """When other dtrain jobs run where 2022 is taken, the likely holder and how to stop it."""
    jobs = sorted({j for f in taken for j in f.port_jobs})
    if not jobs:
        return ""
    return (f"\n  other dtrain job(s) running there: {', '.join(jobs)}; one job per node at a time "
            f"(invoke stop --job {jobs[0]})")


def _vt(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version))


def check_driver(facts: Sequence[NodeFacts], need: dict[str, str]) -> None:
    """Refuse GPU nodes whose driver is older than the image's CUDA needs (label dtrain.min-driver)."""
    old = [f"{f.node.host}: driver {f.driver} < {need[f.node.host]}" for f in facts
           if f.gpus and f.driver and need.get(f.node.host) and _vt(f.driver) < _vt(need[f.node.host])]
    if old:
        raise LaunchError("the image's CUDA needs a newer NVIDIA driver (docs/troubleshooting.md#cuda-driver):\n  "
                          + "\n  ".join(old))


def container_name(job: str) -> str:
    return f"dtrain-{job}"


def node_key_dir(job: str) -> str:
    """The job's key pair on a node: tmpfs (never on disk), 0700, removed with the container."""
    return f"/dev/shm/{container_name(job)}"


def remove_script(job: str) -> str:
    """Remove a job's container and key directory from a node; fine if neither is there."""
    return f"docker rm -f {container_name(job)} >/dev/null 2>&1; rm -rf {node_key_dir(job)}; true"


# Where a node has no Engine API path (commands.DOCKER_API_SH), one `docker inspect` answers
# three questions: does the engine answer, is the image here (and its labels), is a container
# of this job left over. Image IDs start with sha256:, container IDs are bare hex.
# `with`: an image without any label has no Labels map, and `index` of it fails the command.
_INSPECT_FMT = ('{{.Id}} {{with .Config.Labels}}{{or (index . "dtrain.min-driver") "-"}} '
                '{{or (index . "dtrain.openmpi-major") "-"}}{{else}}- -{{end}}')


def image_script(image: str, pull: str, job: str | None = None) -> str:
    """bash for a node, after commands.DOCKER_API_SH: inspect the image (and the job's stale
    container, removed if there), pull per policy (always|missing|never), then print
    `docker=ok` (or the engine's error, and stop) and `image=<min-driver> <openmpi-major> <id>`.
    Exits 1 naming the image when it is neither on the node nor pullable. The engine is asked
    through its API where it can be (curl), and answers are parsed with builtins: a process
    costs ~1-2 ms of CPU, a docker CLI call 20-35, and a launch runs this on every node at once."""
    q = shlex.quote(image)
    name = f" {container_name(job)}" if job else ""
    pulled = f'perr=$(docker pull -q {q} 2>&1 >/dev/null)'
    lines = [
        f"fmt={shlex.quote(_INSPECT_FMT)}; perr=",
        # $out as `docker inspect -f "$fmt" IMAGE [CONTAINER]` prints it
        "inspect() {",
        '  if [ -z "$sock" ]; then out=$(docker inspect -f "$fmt" "$@" 2>&1); return; fi',
        '  out=; api GET "/images/$1/json"',
        "  case $code in",
        "    200) local id=${body#*\\\"Id\\\":\\\"} cfg=${body#*\\\"Config\\\":} md=- om=-",
        '      [[ $cfg =~ $re_md ]] && md=${BASH_REMATCH[1]}; [[ $cfg =~ $re_om ]] && om=${BASH_REMATCH[1]}',
        '      out="${id%%\\"*} $md $om" ;;',
        "    404) ;;",
        '    *) out=$(apierr) ;;',
        "  esac",
        '  [ -n "${2:-}" ] || return 0',
        '  api GET "/containers/$2/json"',
        "  case $code in",
        "    200) local cid=${body#*\\\"Id\\\":\\\"}; out+=$'\\n'\"${cid%%\\\"*} -\" ;;",
        "    404) ;;",
        "    *) out+=$'\\n'\"$(apierr)\" ;;",
        "  esac",
        "}",
        """re_md='"dtrain\\.min-driver":"([^"]*)"'; re_om='"dtrain\\.openmpi-major":"([^"]*)"'""",
        # the image's line (sha256:...), a stale container's (bare hex id), or the engine's error
        "scan() { line= stale= err=; while IFS= read -r l; do case $l in",
        "  sha256:*) [ -n \"$line\" ] || line=$l ;; 'Error: No such object: '*|'') ;;",
        "  *) if [[ $l =~ ^[0-9a-f]{64}\\  ]]; then stale=1; else err=$l; fi ;;",
        '  esac; done <<< "$out"; }',
        f"inspect {q}{name}; scan",
        'if [ -n "$err" ]; then echo "docker=$err"; exit 0; fi',
        "echo docker=ok",
    ]
    if job:
        lines += [f'[ -z "$stale" ] || docker rm -f {container_name(job)} >/dev/null 2>&1']
    again = f"inspect {q}; scan"
    lines += {
        "always": [f'{pulled} || echo "pull failed (${{perr##*$\'\\n\'}}); using the local image" >&2',
                   again],
        "missing": [f'[ -n "$line" ] || {{ {pulled}; {again}; }}'],
        "never": [],
    }[pull]
    lines += [
        f'[ -n "$line" ] || {{ echo "image {image} is not on this node and could not be pulled'
        '${perr:+: ${perr##*$\'\\n\'}}" >&2; exit 1; }',
        'set -- $line; min_driver=$2; echo "image=$2 $3 $1"',
    ]
    return "\n".join(lines)


def start_script(container: commands.ContainerSpec, public_key: str, timeout: float) -> str:
    """bash for a node, after the probe's variables ($gpus $efa $memlock: PROBE_SCRIPT) and the
    private key ($key) are set: write the pair to container.key_dir, start the container with
    flags for this node, wait until its sshd listens on 2022. Fails with the container's last
    log lines if it exits, or after `timeout` seconds."""
    q = shlex.quote
    name = container.container_name
    return "\n".join([
        "echo started=1",  # from here on, the launcher removes what may be on this node
        "umask 077",
        f"kd={q(container.key_dir or '')}",
        'rm -rf "$kd" && mkdir "$kd" && printf "%s\\n" "$key" > "$kd/id_ed25519" && '
        f'printf "%s\\n" {q(public_key)} > "$kd/authorized_keys" '
        '|| { echo "cannot write the job key to $kd" >&2; exit 1; }',
        commands.docker_create_script(container),
        "echo run=1",  # the launcher may go on now; this session still reports sshd (or a crash)
        # ss asks the kernel for just this socket: polling /proc/net/tcp cost ~40 ms a look.
        f"SECONDS=0; i=0; until [ -n \"$(ss -Hltn 'sport = :{SSH_PORT}' 2>/dev/null)\" ]; do",
        "  i=$((i + 1))",
        f"  if [ $((i % 10)) = 0 ] && [ \"$(docker inspect -f '{{{{.State.Running}}}}' {name} 2>/dev/null)\" != true ]; then",
        f"    echo \"container {name} exited: $(docker logs --tail 3 {name} 2>&1 | tr '\\n' ' ')\" >&2; exit 1",
        "  fi",
        f"  if [ $SECONDS -ge {int(timeout)} ]; then echo \"sshd in {name} not listening on {SSH_PORT} after "
        f"{int(timeout)} s\" >&2; exit 1; fi",
        "  sleep 0.1",
        "done",
    ])


# Where the node itself declines to start (the launcher then names every such node at once):
# port 2022 taken, or a GPU driver older than the image's label dtrain.min-driver.
_GATE = r"""
[ -z "$port" ] || exit 0
if [ "$gpus" != 0 ] && [ -n "$driver" ] && [ "${min_driver:--}" != - ] &&
   [ "$(printf '%s\n' "$min_driver" "$driver" | sort -V | head -1)" != "$min_driver" ]; then exit 0; fi
"""


# The job's private key, the rest of a node script's stdin, into $key (builtins: no process).
_READ_KEY = "IFS= read -r -d '' key; key=${key%$'\\n'}"


def up_script(login: str, image: str, pull: str, container: commands.ContainerSpec,
              public_key: str, timeout: float) -> str:
    """The whole launch on one node, in one ssh session: stdin carries the registry password
    line (read by `login`, _Login.script) then the job's private key. Prints the probe's key=value facts and
    `image=...`; then, unless the node declines (_GATE), `started=1` and starts the container."""
    return "\n".join([
        login, _READ_KEY, commands.DOCKER_API_SH, image_script(image, pull, container.job), PROBE_SCRIPT, _GATE,
        start_script(container, public_key, timeout),
    ])


def hosts_script(facts: Sequence[NodeFacts]) -> str:
    """sh, run in each container: every node's hostname resolves to its address there
    (appended to the container's own /etc/hosts once; the node's file is not touched)."""
    lines = ["# dtrain job nodes", *(f"{f.address} {f.hostname}" for f in facts)]
    return ("grep -qx '# dtrain job nodes' /etc/hosts || printf '%s\\n' "
            + " ".join(shlex.quote(x) for x in lines) + " >> /etc/hosts")


def rank_nodes(facts: Sequence[NodeFacts]) -> list[str]:
    """Global rank -> hostname, as `--map-by slot` fills the -H list in order."""
    out = []
    for f in facts:
        out += [f.hostname] * f.node.slots
    return out


def prefix_line(line: str, *, default_node: str, torch_base: int) -> str:
    """torchrun's '[default1]:text' -> '[node-2 r5] text' (the node's first global rank + local
    rank); other lines get the node. mpirun's output goes through MpiOutput."""
    if m := re.match(r"^\[default(\d+)\]:(.*)$", line):
        return f"[{default_node} r{torch_base + int(m.group(1))}] {m.group(2)}"
    return f"[{default_node}] {line}"


def ompi_major(version_output: str) -> int:
    """`mpirun --version` -> 4 for 'mpirun (Open MPI) 4.1.4'; 5 for PRRTE's 'mpirun (Open MPI) 5.0.3'."""
    m = re.search(r"\(Open MPI\) (\d+)\.", version_output)
    if not m:
        raise LaunchError(f"the image's mpirun is not Open MPI: {version_output.strip()[:200]!r}")
    return int(m.group(1))


class MpiOutput:
    """Turns `mpirun --tag-output` lines into `[node r<rank>] text` lines.

    Open MPI tags every chunk a rank writes. Unbuffered output (PYTHONUNBUFFERED=1) writes a
    line's text and its newline separately, so chunks of different ranks share one physical
    line: `[1,2]<stdout>:loss 0.3[1,1]<stdout>:loss 0.4` then `[1,2]<stdout>:`. Each tagged
    segment before the last one of a line is an unfinished line of its rank: kept until that
    rank's newline arrives."""

    _TAG = re.compile(commands.MPI_OUTPUT_TAG)

    def __init__(self, ranks: list[str], default_node: str):
        self.ranks, self.default_node = ranks, default_node
        self.pending: dict[int, str] = {}

    def _fmt(self, rank: int, text: str) -> str:
        node = self.ranks[rank] if rank < len(self.ranks) else "?"
        return f"[{node} r{rank}] {text}"

    def feed(self, line: str) -> list[str]:
        parts = self._TAG.split(line)  # [before, rank, text, rank, text, ...]
        out = [f"[{self.default_node}] {parts[0]}"] if parts[0] or len(parts) == 1 else []
        segments = list(zip(parts[1::2], parts[2::2]))
        for i, (rank_s, text) in enumerate(segments):
            rank = int(rank_s)
            text = self.pending.pop(rank, "") + text
            if i < len(segments) - 1:
                self.pending[rank] = text  # no newline yet for this rank
            elif text or i == 0:
                out.append(self._fmt(rank, text))
        return out

    def flush(self) -> list[str]:
        out = [self._fmt(r, t) for r, t in sorted(self.pending.items())]
        self.pending.clear()
        return out


def job_argv(spec: JobSpec, facts: Sequence[NodeFacts], iface: str, ompi: int = 4) -> list[str]:
    """mpirun / horovodrun argv run in the first node's container (ompi: Open MPI's major
    version in the image: 5 renamed plm_rsh_args to plm_ssh_args)."""
    nodes = [Node(f.address, f.node.slots) for f in facts]
    if spec.launcher == "mpirun":
        argv = commands.mpirun_argv(nodes, list(spec.command), iface=iface, env=spec.env,
                                    forward=list(spec.forward), ssh_port=SSH_PORT, ompi_major=ompi,
                                    ssh_options=CONTAINER_SSH_MUX,
                                    extra_mca=[("plm_rsh_no_tree_spawn", "1"), *spec.extra_mca])
        return [argv[0], "--tag-output", *argv[1:]]
    return commands.horovodrun_argv(nodes, list(spec.command), iface=iface, ssh_port=SSH_PORT,
                                    env=spec.env)


def torchrun_node_argv(spec: JobSpec, facts: Sequence[NodeFacts], rank: int, iface: str) -> list[str]:
    f = facts[rank]
    env = {**commands.torchrun_env(iface), **spec.env}
    run = commands.torchrun_argv(len(facts), rank, f.node.slots, facts[0].address, spec.master_port,
                                 list(spec.command), rdzv=spec.rdzv, job_id=spec.name)
    run = [run[0], "--tee", "3", *run[1:]]
    return ["docker", "exec", *sum((["-e", f"{k}={v}"] for k, v in env.items()), []),
            container_name(spec.name), "bash", "-c", hosts_script(facts) + '; exec "$@"', "dtrain-torchrun", *run]


def _in_container(job: str, argv: list[str], env: dict[str, str] | None = None) -> list[str]:
    """`docker exec [-e K=V...] CONTAINER argv...` for the job's container on a node."""
    return ["docker", "exec", *sum((["-e", f"{k}={v}"] for k, v in (env or {}).items()), []),
            container_name(job), *argv]


def ray_node_argvs(spec: JobSpec, facts: Sequence[NodeFacts], iface: str) -> dict[str, list[str]]:
    """Per node (by host): `ray start` in its container: the head on the first node, workers
    joining FIRST_ADDRESS:6379 on the others, each at its own address, on the job's NIC."""
    head = f"{facts[0].address}:{commands.RAY_PORT}"
    env = {**commands.ray_env(iface), **spec.env}
    out = {}
    for i, f in enumerate(facts):
        argv = (commands.ray_head_argv(commands.RAY_PORT, node_ip=f.address) if i == 0 else
                commands.ray_worker_argv(head, node_ip=f.address))
        out[f.node.host] = _in_container(spec.name, argv, env)
    return out


# ---------------------------------------------------------------- the run


class Job:
    """One launch. `run()` returns the job's exit code; it always tears down."""

    def __init__(self, spec: JobSpec, nodes: list[Node], say: Callable[[str], None] = print):
        if not nodes:
            raise LaunchError("no nodes: give --hostfile, --hosts or --ec2-tag")
        if not spec.command:
            raise LaunchError("no command: put it after `--`, e.g. invoke launch ... -- python train.py")
        name = spec.name or time.strftime("job-%Y%m%d-%H%M%S")
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", name):
            raise LaunchError(f"bad job name {name!r} (letters, digits, _ . -)")
        self.spec = replace(spec, name=name)
        self.nodes = nodes
        self.say = say
        self.dir = jobs_dir() / name
        self.facts: list[NodeFacts] = []
        self.started: list[Node] = []  # nodes where a container may exist
        self.keydir: Path | None = None
        self.ompi: int | None = None  # Open MPI major in the image: label, else `mpirun --version`
        self._mux: Path | None = None
        self._mux_private = False
        self._kex: list[str] | None = None
        self._kex_lock = threading.Lock()
        self._ready = False
        self._up: Fanout | None = None  # the nodes' launch sessions (up())
        self._up_watch: threading.Thread | None = None
        self._up_failure: LaunchError | None = None
        self._teardown_lock = threading.Lock()
        self._closing = False
        self._out_lock = threading.Lock()
        self._log = None

    # -- helpers

    def _ssh(self, node: Node, argv: list[str]) -> list[str]:
        with self._kex_lock:  # asked once, for the first node (ssh -G)
            if self._kex is None:
                self._kex = kex_opts(self.nodes[0], self.spec.ssh_opts)
        return ssh_argv(node, argv, extra_opts=[*self.spec.ssh_opts, *self._kex, *self._mux_opts])

    @property
    def _mux_opts(self) -> list[str]:
        """One ssh connection per node, reused by every step of the job and kept for
        MUX_PERSIST_S after it: a launch soon after the last one skips the ssh handshakes."""
        if self._mux is None:
            self._mux, self._mux_private = mux_dir()
        return ["-o", "ControlMaster=auto", "-o", f"ControlPath={self._mux}/%C",
                "-o", f"ControlPersist={MUX_PERSIST_S}"]

    def _close_mux(self) -> None:
        """Masters in the shared directory stay (they exit when idle); a private one goes now."""
        if self._mux is None or not self._mux_private:
            return
        close_masters(self.nodes, self.spec.ssh_opts, self._mux)
        shutil.rmtree(self._mux, ignore_errors=True)
        self._mux = None

    def _on_all(self, what: str, make: Callable[[Node], list[str]], nodes: Sequence[Node] | None = None,
                timeout: float | None = 120, stdin: Callable[[Node], str | None] | None = None,
                ) -> list[NodeResult]:
        nodes = list(nodes or self.nodes)
        results = run_all(nodes, lambda n: self._ssh(n, make(n)), timeout=timeout, stdin=stdin)
        raise_on_failure(results, what)
        return results

    def _emit(self, line: str) -> None:
        with self._out_lock:
            print(line, flush=True)
            if self._log:
                self._log.write(line + "\n")
                self._log.flush()

    def _record(self, **fields) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / "job.json"
        data = json.loads(path.read_text()) if path.exists() else {}
        data.update(fields)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(path)

    # -- steps

    def _keypair(self) -> tuple[str, str]:
        """A fresh ed25519 pair for this job only: (private, public)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.keydir = Path(tempfile.mkdtemp(prefix="key-", dir=self.dir))
        key = self.keydir / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"dtrain-{self.spec.name}",
                        "-f", str(key)], check=True)
        return key.read_text(), (self.keydir / "id_ed25519.pub").read_text().strip()

    def _container(self, f: NodeFacts | None = None) -> commands.ContainerSpec:
        """The job's container; f: the node's facts where known here (else the node decides)."""
        return commands.ContainerSpec(
            job=self.spec.name, image=self.spec.image, mounts=self.spec.mounts, env=self.spec.env,
            shm_size=self.spec.shm_size, key_dir=node_key_dir(self.spec.name),
            **({"gpus": f.gpus > 0, "efa_devices": f.efa, "memlock": f.memlock} if f else {}))

    def up(self) -> None:
        """One ssh session per node: replace a stale container of this job, read the node's
        facts, pull the image, write the job key, start the container with the node's own
        GPU/EFA/memlock flags. A node with port 2022 taken or an old GPU driver starts nothing.
        Returns once every node's container runs and the checks across nodes pass; each node's
        session then goes on waiting for its container's sshd (_watch_up), while the job's
        first step waits for every sshd too. Any failure leaves teardown() to remove what
        started."""
        t0 = time.monotonic()
        login = _ecr_login_script(self.spec.image)
        private, public = self._keypair()
        script = up_script(login.script, self.spec.image, self.spec.pull, self._container(), public,
                           self.spec.ready_timeout)
        secret = login.stdin + private
        lines: dict[str, list[str]] = {n.host: [] for n in self.nodes}
        running: set[str] = set()
        news = threading.Condition()

        def on_line(n: Node, line: str) -> None:
            with news:
                lines[n.host].append(line)
                if line == "run=1":
                    running.add(n.host)
                    news.notify_all()

        fan = Fanout(self.nodes, lambda n: self._ssh(n, ["bash", "-c", script]), timeout=1800,
                     stdin=lambda n: secret, on_line=on_line)
        self._up = fan
        self.started = list(self.nodes)  # until the sessions say otherwise
        with news:  # until every container runs, or a session ended before starting its own
            while len(running) < len(self.nodes) and not set(fan.ended()) - running:
                news.wait(0.05)
        if len(running) < len(self.nodes):
            results = fan.results()
            # Where ssh never connected nothing started; anywhere else a container may exist.
            self.started = [n for n, r in zip(self.nodes, results)
                            if not is_connection_error(r.returncode, r.stderr)]
            raise_on_failure(results, "starting containers")
        with news:
            out = {h: "\n".join(v) for h, v in lines.items()}
        self.facts = [facts_from_probe(n, out[n.host], self.spec.iface) for n in self.nodes]
        self._check_images(out)
        commands.check_same_iface({f.node.host: f.iface for f in self.facts})
        taken = [f for f in self.facts if f.port_holder]
        if taken:
            raise LaunchError("port 2022 is taken (the containers' sshd needs it):\n" + "\n".join(
                f"  {f.node.host}: {f.port_holder}" for f in taken) + port_jobs_hint(taken))
        dup = {h for h in (f.hostname for f in self.facts) if [g.hostname for g in self.facts].count(h) > 1}
        if dup:
            raise LaunchError(f"nodes share a hostname ({', '.join(sorted(dup))}): Open MPI needs "
                              "one hostname per node")
        missing = [n.host for n in self.nodes if n.host not in running]
        if missing:  # every reason a node declines is checked above; this is a safety net
            raise LaunchError(f"no container started on {', '.join(missing)}")
        capped = [f for f in self.facts if f.memlock >= 0]
        if capped:
            self.say(f"[launch] warning: dockerd cannot lift the memlock limit on "
                     f"{', '.join(f'{f.node.host} ({f.memlock // 1024} KiB)' for f in capped)}: "
                     "containers get that, not unlimited; EFA needs unlimited "
                     "(docs/troubleshooting.md#memlock)")
        self._up_watch = threading.Thread(target=self._watch_up, name="dtrain-up", daemon=True)
        self._up_watch.start()
        self.say(f"[launch] {len(self.facts)} node(s): NIC {self.facts[0].iface}, "
                 f"{sum(f.gpus for f in self.facts)} GPU(s), image {self.image_id[:19]}; containers "
                 f"{container_name(self.spec.name)} running with the job key "
                 f"({time.monotonic() - t0:.1f} s)")

    def _watch_up(self) -> None:
        """The nodes' sessions after their container started: each ends when its sshd listens.
        One that fails instead (the container exited, sshd never listened) ends the job."""
        assert self._up is not None
        failed = [r for r in self._up.results() if not r.ok]
        if failed and not self._closing:
            self._up_failure = LaunchError(
                "containers started, but not every node's sshd came up:\n" +
                "\n".join(f"  {r.host}: {r.error}" for r in failed))
            self.teardown()

    def up_failure(self, timeout: float) -> LaunchError | None:
        """After the job: wait for the nodes' sessions to end; the failure of one, if any."""
        if self._up_watch is not None:
            self._up_watch.join(timeout)
        return self._up_failure

    def _check_images(self, out: dict[str, str]) -> None:
        """Same image ID on every node; GPU drivers new enough; the image's Open MPI major.
        out: each node's probe output, by host."""
        info = {h: parse_probe(text).get("image", "").split() for h, text in out.items()}
        ids = {h: v[-1] for h, v in info.items()}
        if len(set(ids.values())) > 1:
            lines = "\n".join(f"  {h}: {i[:19]}" for h, i in ids.items())
            raise LaunchError(f"nodes hold different images for {self.spec.image}; all must run the same:\n{lines}")
        check_driver(self.facts, {h: v[0] for h, v in info.items() if len(v) == 3 and v[0] != "-"})
        self.image_id = next(iter(ids.values()))
        label = next(iter(info.values()))
        if len(label) == 3 and label[1].isdigit():
            self.ompi = int(label[1])

    def pull(self) -> None:
        """Pull and check the image on every node (doctor, which has its own probe)."""
        t0 = time.monotonic()
        login = _ecr_login_script(self.spec.image)
        script = login.script + commands.DOCKER_API_SH + "\n" + image_script(self.spec.image, self.spec.pull)
        results = self._on_all(f"pulling {self.spec.image}", lambda n: ["bash", "-c", script],
                               timeout=1800, stdin=(lambda n: login.stdin) if login.stdin else None)
        self._check_images({r.host: r.stdout for r in results})
        self.say(f"[launch] image {self.spec.image} ({self.image_id[:19]}) on every node "
                 f"({time.monotonic() - t0:.1f} s)")

    def start_containers(self) -> None:
        """For facts known here (doctor, which has its own probe): per node, the job key into
        its /dev/shm, `docker run`, wait until the container's sshd listens on 2022."""
        t0 = time.monotonic()
        private, public = self._keypair()
        by_host = {f.node.host: f for f in self.facts}

        def make(n: Node) -> list[str]:
            f = by_host[n.host]
            known = (f"{_READ_KEY}; gpus={f.gpus}; efa={shlex.quote(' '.join(f.efa))}; "
                     f"memlock={f.memlock if f.memlock >= 0 else 'unlimited'}\n")
            return ["bash", "-c", known + commands.DOCKER_API_SH + "\n" +
                    start_script(self._container(f), public, self.spec.ready_timeout)]

        self.started = list(self.nodes)
        self._on_all("starting containers", make, stdin=lambda n: private,
                     timeout=self.spec.ready_timeout + 120)
        self.say(f"[launch] containers {container_name(self.spec.name)} started with the job key, "
                 f"sshd listening ({time.monotonic() - t0:.1f} s)")

    def _ready_script(self) -> str:
        """Run in the first container: ssh to every node's 2022 at once, leaving a master
        connection per node (CONTAINER_SSH_MUX) that mpirun's daemon launch reuses; each
        session fills that container's /etc/hosts (hosts_script)."""
        targets = " ".join(shlex.quote(f.address) for f in self.facts)
        mux = " ".join(CONTAINER_SSH_MUX)
        hosts = shlex.quote(hosts_script(self.facts))
        return (f"deadline=$(( $(date +%s) + {int(self.spec.ready_timeout)} )); pids=; for h in {targets}; do "
                f"( until ssh -p {SSH_PORT} -o BatchMode=yes -o ConnectTimeout=3 {mux} root@$h {hosts} "
                f"</dev/null >/dev/null 2>/tmp/ssh-$h.err; do "
                "if [ $(date +%s) -ge $deadline ]; then echo \"dtrain-ready: sshd on $h:2022 not reachable: "
                "$(tail -1 /tmp/ssh-$h.err)\" >&2; exit 1; fi; sleep 0.1; done ) & pids=\"$pids $!\"; done; "
                f"for p in $pids; do wait $p || exit {READY_FAILED}; done")

    def wait_ready(self) -> None:
        """From the first node's container, ssh to every node's container on 2022."""
        t0 = time.monotonic()
        first = self.facts[0].node
        version = "" if self.ompi else "; mpirun --version"
        results = run_all([first], lambda n: self._ssh(n, ["docker", "exec", container_name(self.spec.name),
                                                           "bash", "-c", self._ready_script() + version]),
                          timeout=self.spec.ready_timeout + 30)
        if not results[0].ok:
            raise LaunchError(_ready_error(results[0].stdout + results[0].stderr, results[0].error))
        r = results
        self._ready = True
        if not self.ompi:
            self.ompi = ompi_major(r[0].stdout)
        self.say(f"[launch] sshd reachable on every node; Open MPI {self.ompi} in the image "
                 f"({time.monotonic() - t0:.1f} s)")

    def run_job(self) -> int:
        iface = self.facts[0].iface
        ranks = rank_nodes(self.facts)
        self._record(state="running", ranks=ranks)
        if self.spec.launcher == "torchrun":
            return self._run_torchrun(iface)
        if self.spec.launcher == "ray":
            return self._run_ray(iface)
        job = job_argv(self.spec, self.facts, iface, self.ompi or 4)
        self.say(f"[launch] {self.spec.launcher} on {self.facts[0].hostname}: {shlex.join(job)}")
        # Unless done already, the readiness check runs in the same command, just before the job.
        ready = "" if self._ready else self._ready_script() + " && "
        argv = ["docker", "exec", container_name(self.spec.name), "bash", "-c", ready + "exec " + shlex.join(job)]
        first = self.facts[0]
        ready_lines: list[str] = []

        out = MpiOutput(ranks, first.hostname)

        def on_line(n: Node, line: str) -> None:
            line = line.rstrip("\n")
            if line.startswith("dtrain-ready: "):
                ready_lines.append(line)
            else:
                for shown in out.feed(line):
                    self._emit(shown)

        results = run_all([first.node], lambda n: self._ssh(n, argv), timeout=self.spec.job_timeout,
                          retries=0, on_line=on_line)
        for shown in out.flush():
            self._emit(shown)
        if results[0].returncode == READY_FAILED and ready_lines:
            raise LaunchError(_ready_error("\n".join(ready_lines), None))
        return _exit_code(results[0])

    def _run_torchrun(self, iface: str) -> int:
        """One torchrun per node. The first node to fail stops the others (they would wait on
        it until a collective times out), and its exit code is the job's."""
        bases = [sum(f.node.slots for f in self.facts[:i]) for i in range(len(self.facts))]
        self.say(f"[launch] torchrun on {len(self.facts)} node(s), master {self.facts[0].address}:"
                 f"{self.spec.master_port}")
        procs = []
        for i, f in enumerate(self.facts):
            argv = self._ssh(f.node, torchrun_node_argv(self.spec, self.facts, i, iface))
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, errors="replace",
                                    start_new_session=True)
            pump = threading.Thread(target=self._pump, args=(proc, f.hostname, bases[i]), daemon=True)
            pump.start()
            procs.append((f, proc, pump))
        deadline = time.monotonic() + self.spec.job_timeout if self.spec.job_timeout else None
        first_failure: int | None = None
        try:
            while any(p.poll() is None for _, p, _ in procs):
                failed = [(f, p.returncode) for f, p, _ in procs if p.returncode not in (None, 0)]
                if failed and first_failure is None:
                    f, first_failure = failed[0]
                    self.say(f"[launch] torchrun on {f.hostname} exited {first_failure}: "
                             "stopping the other nodes")
                    self.teardown()
                if deadline and time.monotonic() > deadline:
                    self.say(f"[launch] job timed out after {self.spec.job_timeout:g} s")
                    first_failure = first_failure or 124
                    self.teardown()
                    deadline = None
                time.sleep(0.1)
        finally:
            for _, p, pump in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                pump.join(2)
        if first_failure is not None:
            return first_failure
        return next((p.returncode for _, p, _ in procs if p.returncode != 0), 0)

    def _run_ray(self, iface: str) -> int:
        """Ray: a head in the first node's container, a worker in each other one (`ray start`
        through docker exec; Ray's daemons stay in the container), wait until the head sees
        every node, then the command as a Ray driver in the head's container (RAY_ADDRESS set),
        its output streamed. Ray stops everywhere afterwards (the containers go anyway)."""
        ray = ray_node_argvs(self.spec, self.facts, iface)
        head = f"{self.facts[0].address}:{commands.RAY_PORT}"
        first = self.facts[0]
        self.say(f"[launch] ray: head {head} on {first.hostname}, {len(self.facts) - 1} worker node(s)")
        try:
            t0 = time.monotonic()
            self._on_all("starting the Ray head", lambda n: ray[n.host],
                         nodes=[first.node], timeout=self.spec.ready_timeout + 30)
            if len(self.facts) > 1:
                self._on_all("starting Ray workers", lambda n: ray[n.host], nodes=[f.node for f in self.facts[1:]],
                             timeout=self.spec.ready_timeout + 30)
            wait = commands.ray_wait_argv(head, len(self.facts), self.spec.ready_timeout)
            self._on_all("waiting for every Ray node", lambda n: _in_container(self.spec.name, wait),
                         nodes=[first.node], timeout=self.spec.ready_timeout + 60)
            self.say(f"[launch] ray cluster of {len(self.facts)} node(s) up ({time.monotonic() - t0:.1f} s)")
            job = _in_container(self.spec.name, commands.ray_job_argv(head, list(self.spec.command)))
            results = run_all([first.node], lambda n: self._ssh(n, job), timeout=self.spec.job_timeout,
                              retries=0, on_line=lambda n, line: self._emit(f"[{first.hostname}] {line.rstrip()}"))
            return _exit_code(results[0])
        finally:
            if not self._closing:
                stop = _in_container(self.spec.name, commands.ray_stop_argv())
                run_all([f.node for f in self.facts], lambda n: self._ssh(n, stop), timeout=60)

    def _pump(self, proc: subprocess.Popen, hostname: str, base: int) -> None:
        assert proc.stdout
        for line in proc.stdout:
            self._emit(prefix_line(line.rstrip("\n"), default_node=hostname, torch_base=base))

    def teardown(self) -> None:
        """Remove the job's containers and keys everywhere (from any thread; once)."""
        with self._teardown_lock:
            self._closing = True
            if self._up is not None and not self._up.done():
                self._up.cancel()  # launch sessions still waiting for a node's sshd
            self._teardown()

    def _teardown(self) -> None:
        name = container_name(self.spec.name)
        if self.started:
            results = run_all(self.started, lambda n: self._ssh(n, ["sh", "-c", remove_script(self.spec.name)]),
                              timeout=60)
            bad = [r for r in results if not r.ok]
            for r in bad:
                self.say(f"[launch] warning: could not remove {name} on {r.host}: {r.error}")
            self.started = []
        if self.keydir and self.keydir.exists():
            shutil.rmtree(self.keydir, ignore_errors=True)  # the job's private key goes with the job
        self._close_mux()

    def _job(self) -> int:
        """run_job(); but where a node's sshd never came up (_watch_up ended the job), that is
        the error."""
        try:
            code = self.run_job()
        except LaunchError:
            if failure := self.up_failure(self.spec.ready_timeout + 30):
                raise failure from None
            raise
        if failure := self.up_failure(self.spec.ready_timeout + 30):
            raise failure
        return code

    def run(self) -> int:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._record(name=self.spec.name, image=self.spec.image, launcher=self.spec.launcher,
                     command=list(self.spec.command), nodes=[asdict(n) for n in self.nodes],
                     ssh_opts=list(self.spec.ssh_opts),
                     pid=os.getpid(), started=time.time(), state="starting", exit_code=None)
        self._log = (self.dir / "output.log").open("w")
        code = 1
        t0 = time.monotonic()
        restore = _sigterm_as_interrupt()
        try:
            self.up()
            if self.spec.launcher not in ("torchrun", "ray") and self.ompi is None:
                self.wait_ready()  # no Open MPI label in the image: ask its mpirun
            self.say(f"[launch] launch took {time.monotonic() - t0:.1f} s; job output follows")
            code = self._job()
            self._record(state="succeeded" if code == 0 else "failed", exit_code=code)
            return code
        except KeyboardInterrupt:
            self._record(state="interrupted", exit_code=130)
            self.say("[launch] interrupted: removing containers on every node")
            return 130
        except LaunchError:
            self._record(state="failed to launch", exit_code=code)
            raise
        finally:
            self.teardown()
            if self._log:
                self._log.close()
            restore()
            self._record(ended=time.time())


def _ready_error(output: str, error: str | None) -> str:
    lines = [ln.removeprefix("dtrain-ready: ") for ln in output.splitlines() if ln.startswith("dtrain-ready: ")]
    return "containers started, but not every node's sshd answers on 2022:\n  " + "\n  ".join(
        lines or [error or "no answer"])


def _exit_code(r: NodeResult) -> int:
    if r.returncode is None:
        return 124 if r.error and "timed out" in r.error else 1
    return r.returncode


def _sigterm_as_interrupt() -> Callable[[], None]:
    """`invoke stop` sends SIGTERM: treat it like Ctrl-C so teardown runs."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, old)


# ---------------------------------------------------------------- ECR on the nodes

_ECR = re.compile(r"^(\d{12})\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com(\.cn)?/")


@dataclass(frozen=True)
class _Login:
    script: str = ""  # reads the password line from stdin, then `docker login`
    password: str | None = None

    @property
    def stdin(self) -> str:
        """What the script reads first from its standard input."""
        return "" if self.password is None else self.password + "\n"


def _ecr_login_script(image: str) -> _Login:
    """For ECR images: a token fetched here with boto3, handed to `docker login` on each node
    through stdin (never argv, never printed): the script reads it as its first line."""
    m = _ECR.match(image)
    if not m:
        return _Login()
    try:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError

        client = boto3.client("ecr", region_name=m.group(2))
        data = client.get_authorization_token(registryIds=[m.group(1)])["authorizationData"][0]
    except (BotoCoreError, ClientError) as e:
        raise LaunchError(f"ECR login for {image} failed: {e}") from None
    user, _, password = base64.b64decode(data["authorizationToken"]).decode().partition(":")
    registry = image.split("/", 1)[0]
    script = ("IFS= read -r pw\n"
              f"printf '%s\\n' \"$pw\" | "
              f"docker login -u {shlex.quote(user)} --password-stdin {shlex.quote(registry)} >/dev/null "
              f"|| {{ echo 'docker login to {registry} failed' >&2; exit 1; }}\n")
    return _Login(script, password)


# ---------------------------------------------------------------- status, logs, stop


def load_job(name: str | None) -> dict:
    root = jobs_dir()
    if name:
        path = root / name / "job.json"
        if not path.exists():
            raise LaunchError(f"no job named {name} (jobs are in {root})")
        return json.loads(path.read_text())
    jobs = sorted(root.glob("*/job.json"), key=lambda p: p.stat().st_mtime)
    if not jobs:
        raise LaunchError(f"no jobs yet (jobs are in {root})")
    return json.loads(jobs[-1].read_text())


def job_log(name: str) -> Path:
    return jobs_dir() / name / "output.log"


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def status_rows(limit: int = 10) -> list[tuple[str, ...]]:
    rows = [("job", "state", "launcher", "nodes", "image", "exit")]
    paths = sorted(jobs_dir().glob("*/job.json"), key=lambda p: p.stat().st_mtime)[-limit:]
    for p in paths:
        j = json.loads(p.read_text())
        state = j.get("state", "?")
        if state in ("starting", "running") and not _alive(j.get("pid")):
            state += " (launcher gone)"
        rows.append((j["name"], state, j.get("launcher", ""), str(len(j.get("nodes", []))),
                     j.get("image", ""), "" if j.get("exit_code") is None else str(j["exit_code"])))
    return rows


def follow(path: Path, job: dict, out=sys.stdout) -> None:
    """Print the log, then new lines while the job's launcher runs."""
    with path.open() as f:
        while True:
            line = f.readline()
            if line:
                out.write(line)
                out.flush()
                continue
            if not _alive(job.get("pid")) or json.loads((path.parent / "job.json").read_text()).get("ended"):
                return
            time.sleep(0.2)


def stop(name: str | None, ssh_opts: tuple[str, ...] = ()) -> str:
    """Stop a job: signal its launcher (which tears down), then make sure no container is left."""
    job = load_job(name)
    if _alive(job.get("pid")) and not job.get("ended"):
        os.kill(job["pid"], signal.SIGTERM)
        for _ in range(150):
            if not _alive(job["pid"]):
                break
            time.sleep(0.2)
    nodes = [Node(**n) for n in job.get("nodes", [])]
    opts = list(ssh_opts or job.get("ssh_opts", []))
    results = run_all(nodes, lambda n: ssh_argv(n, ["sh", "-c", remove_script(job["name"])], extra_opts=opts),
                      timeout=60)
    bad = [r for r in results if not r.ok]
    if bad:
        raise LaunchError("could not reach every node to remove the containers:\n" +
                          "\n".join(f"  {r.host}: {r.error}" for r in bad))
    return job["name"]
