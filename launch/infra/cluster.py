"""A local simulated multi-node "EC2" cluster on one Linux machine.

``up(N)`` builds N nodes, each one a network namespace wired into a host bridge
with its own hostname, its own dockerd (+ containerd) and its own sshd on port
22, plus a plain-HTTP registry on the bridge that every node trusts.  ``down()``
removes all of it.  See docs/cluster.md.

Layout (node i = 1..N)::

    host:   bridge dtbr0 10.213.0.1/24, registry 10.213.0.1:5000
    node i: netns dtn<i>, veth dtv<i> (host) <-> ens5 (node) 10.213.0.(10+i)/24,
            hostname node-<i>, docker0 172.17.0.1/16 (dockerd default, as on EC2),
            dockerd socket /var/lib/dtrain-cluster/node<i>/docker.sock,
            sshd on 10.213.0.(10+i):22 (root, cluster identity key only)

Lazy mode (``up(..., lazy=Lazy(root))``, ``dtrain cluster up``, lazy by default: ``lazy_mode``; issues 26, 52): every node
runs launch/node/lazy-node.sh instead (soci-snapshotter-grpc, containerd with it as a proxy
snapshotter, dockerd 26 on the containerd image store with storage driver ``soci``: Debian 13's
binaries unpacked under ``root``), and the registry speaks TLS with a self-signed certificate
the nodes' daemons trust (SSL_CERT_FILE: soci 0.4.1 fetches SOCI indexes over HTTPS only).

Shared directories (``up(..., shared={PATH: HOST_DIR})``): HOST_DIR is mounted at PATH on every
node, one directory for all, as NFS is on a real cluster (a home shared by the nodes, as
ParallelCluster and most Slurm clusters have: ``shared={"/root": DIR}``). Elsewhere each node keeps
its own ~/.dtrain (as each EC2 node has its own disk).

The functions here are plain Python; a thin Invoke task calls them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping

from dtrain.containerd import containerd_config
from dtrain.launch.infra import netns as nx
from dtrain.launch.infra.netns import sh
from dtrain.launch.remote.hosts import parse_hostfile
from dtrain.launch.remote.transport import close_masters

LAZY_NODE = Path(__file__).resolve().parent.parent / "node" / "lazy-node.sh"
LAZY_ROOT_ENV = "DTRAIN_LAZY_ROOT"  # where Debian 13's lazy-loading binaries are unpacked (dpkg -x)

class ClusterError(RuntimeError):
    """Raised for any user-facing cluster failure (message says what to do)."""


# --------------------------------------------------------------------------
# fixed layout

# A second simulated cluster beside the first (DTRAIN_SIM_SLOT=1..9): its own state directory,
# lock, bridge, subnet (10.213.SLOT.0/24), namespaces and veths, so two can run at once on one
# machine (`dtrain test` runs its cluster tests on two). Slot 0 (unset) is the layout above.
SLOT_ENV = "DTRAIN_SIM_SLOT"


def slot(env: Mapping[str, str] = os.environ) -> int:
    """The simulated cluster this process works on: $DTRAIN_SIM_SLOT, 0 when unset (pure)."""
    raw = env.get(SLOT_ENV, "").strip()
    if raw in ("", "0"):
        return 0
    if not (raw.isdigit() and 1 <= int(raw) <= 9):
        raise ClusterError(f"${SLOT_ENV}={raw!r}: expected a number from 0 to 9 (which simulated cluster)")
    return int(raw)


def _layout(n: int) -> tuple[Path, Path, str, str, str, str]:
    """(state dir, lock file, bridge, subnet prefix, netns prefix, veth prefix) of slot n (pure)."""
    tail = "" if n == 0 else f"-{n}"
    return (Path(f"/var/lib/dtrain-cluster{tail}"), Path(f"/run/dtrain-cluster{tail}.lock"), f"dtbr{n}",
            f"10.213.{n}.", "dtn" if n == 0 else f"dt{n}n", "dtv" if n == 0 else f"dt{n}v")


def _slot_at_import() -> int:
    try:
        return slot()
    except ClusterError:
        return 0  # refused by `up` and `down` (_check_platform), in one line, before anything is touched


STATE_DIR, LOCK_FILE, BRIDGE, SUBNET_PREFIX, NETNS_PREFIX, VETH_PREFIX = _layout(_slot_at_import())
PREFIXLEN = 24
BRIDGE_ADDR = SUBNET_PREFIX + "1"
REGISTRY_PORT = 5000
REGISTRY = f"{BRIDGE_ADDR}:{REGISTRY_PORT}"
NODE_IFNAME = "ens5"
MAX_NODES = 64
DOCKER_BIN = "/usr/bin/docker"  # the Debian CLI (matches dockerd 20.10; has buildx plugin path)

REQUIRED_BINARIES = ["ip", "iptables", "nsenter", "unshare", "dockerd", "containerd",
                     "containerd-shim-runc-v2", "runc", "docker-registry", "ssh-keygen",
                     "ssh"]
SSHD = "/usr/sbin/sshd"
# PATH in node ssh sessions: the Debian docker CLI (/usr/bin) before /usr/local/bin,
# whose newer docker CLI has no buildx and does not match dockerd 20.10.
_NODE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/sbin:/usr/local/bin"


# --------------------------------------------------------------------------
# data returned to callers


@dataclass(frozen=True)
class NodeInfo:
    index: int            # 1-based
    name: str             # hostname, e.g. "node-1" (also a Host alias in ssh_config)
    address: str          # 10.213.0.11
    netns: str            # dtn1 (/run/netns/dtn1)
    docker_socket: str    # /var/lib/dtrain-cluster/node1/docker.sock
    state_dir: str        # /var/lib/dtrain-cluster/node1
    ssh_port: int = 22
    user: str = "root"
    ifname: str = NODE_IFNAME  # the node's NIC (rename_nic; up(nic_names=...))

    @property
    def docker_host(self) -> str:
        """Value for DOCKER_HOST / ``docker -H`` to reach this node's engine from the host."""
        return f"unix://{self.docker_socket}"


@dataclass(frozen=True)
class Lazy:
    """Lazy mode's input: where Debian 13's soci-snapshotter, containerd and docker.io are
    unpacked (engine.LAZY_BINARIES under it)."""

    root: str


@dataclass(frozen=True)
class ClusterInfo:
    nodes: tuple[NodeInfo, ...]
    identity_file: str    # private key accepted by every node's sshd (user root)
    hostfile: str         # "10.213.0.11 slots=1 port=22 user=root" per node
    ssh_config: str       # snippet: Host node-1 ... ; use with ssh -F or Include
    registry: str         # "10.213.0.1:5000" (plain HTTP, insecure-registry on all nodes)
    mpi_hostfile: str = str(STATE_DIR / "hostfile.mpi")  # "10.213.0.11 slots=1": Open MPI
    #                       rejects port=/user= tokens ("parse error in the hostfile")
    bridge: str = BRIDGE
    bridge_address: str = BRIDGE_ADDR
    subnet: str = f"{SUBNET_PREFIX}0/{PREFIXLEN}"
    node_ifname: str = NODE_IFNAME
    state_dir: str = str(STATE_DIR)
    lazy: bool = False    # nodes load images lazily (SOCI); the registry speaks TLS
    registry_ca: str = ""  # lazy: a CA bundle holding the registry's certificate (SSL_CERT_FILE)
    shared: tuple[tuple[str, str], ...] = ()  # (path on every node, host directory mounted there), sorted

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    @property
    def addresses(self) -> list[str]:
        return [n.address for n in self.nodes]

    @property
    def docker_sockets(self) -> list[str]:
        return [n.docker_socket for n in self.nodes]

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for nd, n in zip(d["nodes"], self.nodes):
            nd["docker_host"] = n.docker_host
        if not self.shared:  # a record without shared directories stays one that older dtrains read
            del d["shared"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ClusterInfo":
        """The cluster's record in STATE_FILE; one written by another version of dtrain (a key
        this one does not know, or one it needs missing) is a ClusterError naming the file."""
        try:
            d = dict(d)
            nodes = tuple(NodeInfo(**{k: v for k, v in n.items() if k != "docker_host"})
                          for n in d.pop("nodes"))
            shared = tuple((str(a), str(b)) for a, b in d.pop("shared", ()))
            return cls(nodes=nodes, shared=shared, **d)
        except (TypeError, KeyError, AttributeError) as e:
            raise ClusterError(f"{STATE_FILE}: not a cluster record this version of dtrain reads ({e}); "
                               "remove that cluster with `dtrain cluster down` and bring it up again") from None


@dataclass
class ClusterStatus:
    up: bool                               # state recorded and every daemon answering
    nodes: int                             # number of nodes recorded (0 if none)
    info: ClusterInfo | None
    problems: list[str] = field(default_factory=list)   # what is missing/broken
    leftovers: list[str] = field(default_factory=list)  # resources with no state file

    def __str__(self) -> str:
        if self.info is None:
            s = "cluster: down"
            if self.leftovers:
                s += " (leftovers: " + ", ".join(self.leftovers) + "; run cluster down)"
            return s
        head = f"cluster: {'up' if self.up else 'DEGRADED'}, {self.nodes} node(s), registry {self.info.registry}"
        if self.info.lazy:
            head += f" (TLS: SSL_CERT_FILE={self.info.registry_ca}), lazy loading (SOCI)"
        lines = [head]
        for n in self.info.nodes:
            lines.append(f"  {n.name:8} {n.address:14} ssh root@{n.address}:22  DOCKER_HOST={n.docker_host}")
        lines += [f"  shared: {src} at {path} on every node" for path, src in self.info.shared]
        lines.append(f"  identity {self.info.identity_file}  hostfile {self.info.hostfile}")
        lines.append(f"  ssh -F {self.info.ssh_config} node-1")
        lines += [f"  problem: {p}" for p in self.problems]
        return "\n".join(lines)


# --------------------------------------------------------------------------
# paths


def _node_index_name(i: int) -> str:
    return f"node-{i}"


def _node(i: int) -> NodeInfo:
    d = STATE_DIR / f"node{i}"
    return NodeInfo(index=i, name=_node_index_name(i), address=f"{SUBNET_PREFIX}{10 + i}",
                    netns=f"{NETNS_PREFIX}{i}", docker_socket=str(d / "docker.sock"),
                    state_dir=str(d))


def _info(n: int, lazy: bool = False, shared: tuple[tuple[str, str], ...] = ()) -> ClusterInfo:
    return ClusterInfo(nodes=tuple(_node(i) for i in range(1, n + 1)),
                       identity_file=str(STATE_DIR / "id_ed25519"),
                       hostfile=str(STATE_DIR / "hostfile"),
                       ssh_config=str(STATE_DIR / "ssh_config"),
                       registry=REGISTRY, lazy=lazy,
                       registry_ca=str(STATE_DIR / "registry" / "ca-bundle.pem") if lazy else "",
                       shared=shared)


STATE_FILE = STATE_DIR / "state.json"


def _load_state() -> dict | None:
    try:
        return json.loads(STATE_FILE.read_text())
    except (OSError, ValueError):
        return None


def _save_state(state: dict) -> None:
    tmp = STATE_FILE.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(STATE_FILE)


# --------------------------------------------------------------------------
# helpers


def _log(quiet: bool, msg: str) -> None:
    if not quiet:
        print(f"[cluster] {msg}", file=sys.stderr, flush=True)


def _check_platform() -> None:
    slot()  # a bad $DTRAIN_SIM_SLOT: said before anything is touched
    if not sys.platform.startswith("linux"):
        raise ClusterError("the local cluster needs Linux (network namespaces, veth, bridges)")
    if os.geteuid() != 0:
        raise ClusterError("the local cluster needs root (ip netns, iptables, dockerd); "
                           "run it as root, e.g. sudo -E dtrain cluster.up")
    missing = [b for b in REQUIRED_BINARIES if shutil.which(b) is None]
    if not os.access(SSHD, os.X_OK):
        missing.append(SSHD)
    if not os.access(DOCKER_BIN, os.X_OK):
        missing.append(DOCKER_BIN)
    if missing:
        raise ClusterError("missing programs: " + ", ".join(missing) + " (Debian: apt-get install "
                           "iproute2 iptables util-linux docker.io docker-registry "
                           "openssh-server openssh-client)")


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK_FILE, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ClusterError(f"another cluster up/down is running (lock {LOCK_FILE})") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _wait(what: str, pred, timeout: float, pids: list[int] = (), logs: list[Path] = ()) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        if pred():
            return
        dead = [p for p in pids if not nx.pid_alive(p)]
        if dead or time.monotonic() > deadline:
            why = f"exited (pid {dead[0]})" if dead else f"not ready after {timeout:.0f}s"
            tail = ""
            for lp in logs:
                with contextlib.suppress(OSError):
                    t = lp.read_text(errors="replace").strip().splitlines()[-8:]
                    tail += f"\n--- {lp} (tail) ---\n" + "\n".join(t)
            raise ClusterError(f"{what} {why}{tail}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)


# --------------------------------------------------------------------------
# config files


def _registry_config(regdir: Path, tls: tuple[Path, Path] | None = None) -> str:
    """docker-registry's config; tls (certificate, key): HTTPS on the same address (lazy mode)."""
    tls_lines = f"""
  tls:
    certificate: {tls[0]}
    key: {tls[1]}""" if tls else ""
    return f"""version: 0.1
log:
  level: warn
  accesslog:
    disabled: false  # one line per request in registry.log (tests count manifest requests)
storage:
  filesystem:
    rootdirectory: {regdir / 'data'}
  delete:
    enabled: true
  cache:
    blobdescriptor: inmemory
http:
  addr: {REGISTRY}{tls_lines}
"""


def _containerd_config(d: Path) -> str:
    """A node's own containerd, under d/containerd (containerd_config, with its opt plugin's
    directory there too)."""
    c = d / "containerd"
    return containerd_config(c) + f"""
[plugins."io.containerd.internal.v1.opt"]
  path = "{c / 'opt'}"
"""


def lazy_containerd_config(d: Path) -> str:
    """A lazy node's containerd (lazy-node.sh): the classic node's, plus soci-snapshotter-grpc
    as the proxy snapshotter `soci` (its socket under d/soci)."""
    return _containerd_config(d) + f"""
[proxy_plugins.soci]
  type = "snapshot"
  address = "{d / 'soci' / 'soci.sock'}"
"""


def soci_config(background_fetch: bool = True) -> str:
    """soci-snapshotter-grpc's config: its defaults, the background fetcher on or off, and
    two retries (20 and 40 ms) for its own HTTP client instead of 8 (30 ms doubling: 7.7-8.6 s).
    launch/node/first-boot.sh writes the same on lazy `nodes up` nodes (tests/test_nodes.py).

    That client fetches an image's index and zTOCs, and for a layer it has no zTOC for (an image
    pushed without `--soci`) soci 0.4.1 first tries to fetch and unpack the layer itself, with
    no size: it asks the registry for the layer's digest as a *manifest*, which distribution
    2.8 answers with a 500, retried 8 times: ~8 s per layer before containerd unpacks it (fixed
    upstream in 0.5.0, "Eagerly resolve local blobs"; Debian 13 has 0.4.1). The keys are
    CamelCase: soci's [http] fields have no toml tags (`max_retries` there is ignored). [blob]
    (lazy reads) is set to its defaults explicitly: left out, it would inherit [http]'s."""
    return (f"[background_fetch]\ndisable = {'false' if background_fetch else 'true'}\n"
            "\n[http]\nMaxRetries = 2\nMinWaitMsec = 20\n"
            "\n[blob]\nmax_retries = 8\nmin_wait_msec = 30\n")


def daemon_json(driver: str, extra: dict | None = None) -> str:
    """dockerd 26's daemon.json on the containerd image store with `driver` as its snapshotter
    (soci: lazy; overlayfs); `overlay2`: the classic layer store."""
    base = ({"storage-driver": "overlay2"} if driver == "overlay2"
            else {"features": {"containerd-snapshotter": True}, "storage-driver": driver})
    return json.dumps({**base, **(extra or {})}) + "\n"


def check_lazy_root(root: str | Path) -> None:
    """ClusterError naming what lazy mode misses under root, and how to get it."""
    from dtrain import engine

    missing = engine.lazy_missing(Path(root))
    if missing:
        raise ClusterError(f"--lazy-root {root}: {', '.join(missing[:3])} missing: unpack Debian 13's "
                           f"{', '.join(engine.LAZY_PACKAGES)} there (dpkg -x), or leave out --lazy-root and "
                           f"${LAZY_ROOT_ENV}: `dtrain cluster up` then fetches them to {engine.LAZY_ROOT}")


LAZY_OFF = "lazy:       off, the nodes pull images in full"  # the head of lazy_mode's line


def lazy_mode(action: str, lazy: bool, no_lazy: bool, lazy_root: str | None, recreate: bool = False,
              say: Callable[[str], None] = print, env: dict[str, str] | None = None,
              recorded: Callable[[], dict | None] | None = None,
              fetch: Callable[[], Path] | None = None) -> Lazy | None:
    """`dtrain cluster`'s lazy flags (issue 52: lazy by default where it helps): `--lazy`
    insists (what is missing is an error), `--no-lazy` is the classic cluster, neither makes
    the nodes lazy where the host can (the binaries under --lazy-root / $DTRAIN_LAZY_ROOT, or
    engine.LAZY_ROOT, fetched there once), else the classic cluster and one line saying why.
    A classic cluster already up stays so without --recreate (said in that line)."""
    from dtrain import engine

    if lazy and no_lazy:
        raise ClusterError("--lazy and --no-lazy: pass one")
    if action != "up":
        if lazy or no_lazy or lazy_root:
            flag = "--lazy-root" if lazy_root else "--no-lazy" if no_lazy else "--lazy"
            raise ClusterError(f"{flag} is for `cluster up`, not `cluster {action}`")
        return None
    if no_lazy:
        if lazy_root:
            raise ClusterError("--lazy-root is for lazy nodes: drop --no-lazy")
        return None
    root = lazy_root or (os.environ if env is None else env).get(LAZY_ROOT_ENV)
    if root:  # named: what it misses is an error
        check_lazy_root(root)
        return Lazy(root)
    if not lazy and not recreate:
        state = (recorded or _load_state)() or {}
        if state.get("info") and not state["info"].get("lazy"):
            say(f"{LAZY_OFF}: the cluster that is up is classic; `dtrain cluster up --recreate` makes it lazy "
                "(--no-lazy to say so)")
            return None
    try:
        return Lazy(str((fetch or engine.ensure_lazy_binaries)()))
    except engine.EngineError as e:
        if lazy:
            raise ClusterError(f"--lazy: {e}") from None
        say(f"{LAZY_OFF}: {e} (--lazy insists, --no-lazy says so)")
        return None


def lazy_bin(root: Path, d: Path) -> Path:
    """BIN for lazy-node.sh: links to the binaries unpacked under root (engine.LAZY_BINARIES),
    leaving out Debian 13's runc."""
    from dtrain import engine

    check_lazy_root(root)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    for name, sub in engine.LAZY_BINARIES.items():
        (d / name).symlink_to(root / sub / name)
    return d


def _registry_tls(regdir: Path) -> tuple[Path, Path, Path]:
    """A self-signed certificate for the registry's address; (cert, key, CA bundle: the
    machine's CAs and it, for SSL_CERT_FILE)."""
    cert, key, bundle = regdir / "registry.crt", regdir / "registry.key", regdir / "ca-bundle.pem"
    sh(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-subj", "/CN=dtrain-cluster",
        "-addext", f"subjectAltName=IP:{BRIDGE_ADDR}", "-keyout", str(key), "-out", str(cert)])
    system = Path("/etc/ssl/certs/ca-certificates.crt")
    bundle.write_text((system.read_text() if system.exists() else "") + cert.read_text())
    return cert, key, bundle


def _registry_answers(tls: bool) -> bool:
    if not tls:
        return nx.http_tcp_get(BRIDGE_ADDR, REGISTRY_PORT, "/v2/") == 200
    import socket
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection((BRIDGE_ADDR, REGISTRY_PORT), timeout=2) as s, \
                ctx.wrap_socket(s) as t:
            t.sendall(f"GET /v2/ HTTP/1.0\r\nHost: {REGISTRY}\r\n\r\n".encode())
            return int(t.recv(4096).split(b" ", 2)[1]) == 200
    except (OSError, IndexError, ValueError):
        return False


# sshd runs `bash -c CMD` for every `ssh node CMD`, and bash reads ~/.bashrc then. The nodes
# share this machine's home directory, whose ~/.bashrc may be heavy (pyenv init: ~0.1 s of CPU
# per session, paid by every launch step). A node gets an EC2 Ubuntu AMI's first line instead:
# nothing for non-interactive shells.
_NODE_BASHRC = """# ~/.bashrc of a simulated dtrain node (launch/infra/cluster.py)
case $- in *i*) ;; *) return ;; esac
PS1='\\u@\\h:\\w\\$ '
"""


def _node_binds(node: NodeInfo, shared: tuple[tuple[str, str], ...] = ()) -> list[tuple[str, str]]:
    """What a node's mount namespace mounts over the host's, (source, path) in order: its own
    ~/.dtrain (each EC2 node has its own disk: the jobs' files a launch leaves there must not be
    shared between nodes) and a light ~/.bashrc, where no shared directory holds them; then the
    shared directories (the same host directory at the same path on every node, as NFS)."""
    home = Path.home()
    binds = []

    def covered(path: Path) -> bool:
        return any(path.is_relative_to(p) for p, _ in shared)

    if not covered(home / ".dtrain"):
        own = Path(node.state_dir) / "dtrain-home"
        own.mkdir(parents=True, exist_ok=True)
        (home / ".dtrain").mkdir(exist_ok=True)
        binds.append((str(own), str(home / ".dtrain")))
    rc = home / ".bashrc"
    if rc.exists() and not covered(rc):
        _write(STATE_DIR / "node-bashrc", _NODE_BASHRC)
        binds.append((str(STATE_DIR / "node-bashrc"), str(rc)))
    return binds + [(src, path) for path, src in shared]


def parse_shared(flag: str, given: list[str] | None) -> dict[str, str] | None:
    """`dtrain cluster up --shared HOST_DIR:PATH` (repeatable) as up()'s `shared` ({PATH: HOST_DIR};
    None for none); ClusterError naming the flag for a value that is not two absolute paths, or
    a PATH given twice. up() checks that both are directories (check_shared)."""
    out: dict[str, str] = {}
    for value in given or []:
        src, sep, path = value.rpartition(":")
        if not sep or not src.startswith("/") or not path.startswith("/"):
            raise ClusterError(f"{flag} {value!r}: expected HOST_DIR:PATH, both absolute, e.g. /srv/shared:/shared")
        if path in out:
            raise ClusterError(f"{flag} {value!r}: {path} is given twice")
        out[path] = src
    return out or None


def check_shared(shared: dict[str, str] | None) -> tuple[tuple[str, str], ...]:
    """up()'s `shared` ({path on every node: host directory}) as the cluster records it, sorted;
    ClusterError naming a path that is not an absolute directory of this machine (a mount
    needs one), or a host directory that is not one."""
    out = []
    for path, src in sorted((shared or {}).items()):
        if not (isinstance(path, str) and path.startswith("/") and Path(path).is_dir() and path != "/"):
            raise ClusterError(f"shared {path!r}: the path on the nodes must be an existing directory of this "
                               "machine (not /), as an absolute path")
        if not (isinstance(src, str) and src.startswith("/") and Path(src).is_dir()):
            raise ClusterError(f"shared {path}={src!r}: the host directory must exist, as an absolute path")
        out.append((str(Path(path)), str(Path(src))))
    return tuple(out)


def _sshd_config(n: NodeInfo) -> str:
    d = Path(n.state_dir)
    return f"""# dtrain simulated node {n.name}; generated by launch/infra/cluster.py
Port 22
ListenAddress {n.address}
HostKey {d / 'ssh_host_ed25519_key'}
PidFile {d / 'sshd.pid'}
AuthorizedKeysFile {STATE_DIR / 'authorized_keys'}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PrintMotd no
PrintLastLog no
UseDNS no
MaxStartups 100:30:200
MaxSessions 100
SetEnv DOCKER_HOST={n.docker_host} PATH={_NODE_PATH}
Subsystem sftp /usr/lib/openssh/sftp-server
"""


def _ssh_config(info: ClusterInfo) -> str:
    out = ["# dtrain local cluster; use: ssh -F " + info.ssh_config + " node-1",
           "# (or 'Include " + info.ssh_config + "' from your own ssh config)"]
    for n in info.nodes:
        out += [f"Host {n.name}", f"  HostName {n.address}", ""]
    out += [f"Host node-* {SUBNET_PREFIX}*",
            "  User root",
            f"  IdentityFile {info.identity_file}",
            "  IdentitiesOnly yes",
            "  StrictHostKeyChecking no",
            "  UserKnownHostsFile /dev/null",
            "  LogLevel ERROR",
            "  ConnectTimeout 10",
            ""]
    return "\n".join(out)


def _hostfile(info: ClusterInfo) -> str:
    return "".join(f"{n.address} slots=1 port={n.ssh_port} user={n.user}\n" for n in info.nodes)


# --------------------------------------------------------------------------
# up


def up(nodes: int, *, recreate: bool = False, quiet: bool = False,
       timeout: float = 90.0, nic_names: dict[int, str] | None = None,
       link_rate: str | int | None = None,
       node_link_rates: dict[int, str | int] | None = None, lazy: Lazy | None = None,
       shared: dict[str, str] | None = None) -> ClusterInfo:
    """Bring up ``nodes`` simulated nodes (idempotent for the same count).

    nic_names: {node index: NIC name} for nodes whose NIC is not NODE_IFNAME (e.g. {2: "eth0"}:
    mixed instance generations/AMIs); a running cluster's NICs are renamed to match, the
    others back to NODE_IFNAME.

    ``link_rate`` (tc units: ``1gbit``, ``500mbit``; or bits per second) limits each node's link both ways, as
    a NIC of that speed would (ECR throughput for benchmarks); None (default) removes any
    limit. It is (re)applied on every call, also to a cluster that is already up.
    ``node_link_rates`` ({index: rate}) gives those nodes their own rate instead (one slow
    node among fast ones: the network gate's tests); set_link_rate changes one node's later.

    ``lazy``: the nodes load images lazily (see the module's docstring); a cluster up in the
    other mode counts as another size (``recreate``).

    ``shared`` ({path on every node: host directory}): the host directory mounted at that path on
    every node, one for all (a home shared by the nodes: {"/root": DIR}); a cluster up with other
    shared directories counts as another size too.

    If a healthy cluster with the same node count is already up, it is returned
    unchanged.  A different count raises :class:`ClusterError` unless
    ``recreate=True`` (then the old cluster is torn down first; its registry's storage, the
    images pushed to it, is kept for the new one, as ECR outlives the nodes: a push of the same
    image finds every layer there).  Any failure tears down everything this call made and
    raises :class:`ClusterError`.
    """
    _check_platform()
    if not isinstance(nodes, int) or not 1 <= nodes <= MAX_NODES:
        raise ClusterError(f"nodes must be an integer in 1..{MAX_NODES}, got {nodes!r}")
    try:
        rate = _rate(link_rate) if link_rate is not None else None
        rates = {i: _rate(r) for i, r in (node_link_rates or {}).items()}
    except ValueError as e:
        raise ClusterError(f"--link-rate: {e}") from None
    bad = [i for i in rates if not 1 <= i <= nodes]
    if bad:
        raise ClusterError(f"--link-rate {bad[0]}=...: no node {bad[0]} (nodes 1..{nodes})")
    if lazy is not None:
        check_lazy_root(lazy.root)  # before anything is touched
    mounts = check_shared(shared)
    with _locked():
        kept = False  # the registry's storage of the cluster this call replaced (REGISTRY_KEPT)
        try:
            st = _status()
        except ClusterError:  # a record from another version of dtrain
            if not recreate:
                raise
            _log(quiet, f"{STATE_FILE} is from another version of dtrain; rebuilding")
            kept = _down(quiet, keep_registry=True) or kept
            st = _status()
        if st.info is not None and st.info.lazy != (lazy is not None):
            mode = "lazy" if st.info.lazy else "classic"
            if not recreate:
                raise ClusterError(refusal(st.nodes, mode))
            _log(quiet, f"existing cluster is in {mode} mode; rebuilding")
            kept = _down(quiet, keep_registry=True) or kept
            st = _status()
        if st.info is not None and st.info.shared != mounts:
            if not recreate:
                raise ClusterError(refusal(st.nodes, "shared"))
            _log(quiet, "existing cluster has other shared directories; rebuilding")
            kept = _down(quiet, keep_registry=True) or kept
            st = _status()
        if st.info is not None:
            if st.nodes == nodes and st.up:
                _log(quiet, f"already up with {nodes} node(s)")
                _set_link_rates(st.info, rate, rates, quiet)
                return _name_nics(st.info, nic_names or {}, quiet)
            if st.nodes != nodes and not recreate:
                raise ClusterError(refusal(st.nodes))
            _log(quiet, "existing cluster is " + ("degraded: " + "; ".join(st.problems)
                                                  if not st.up else f"{st.nodes} node(s)")
                 + "; rebuilding")
            kept = _down(quiet, keep_registry=True) or kept
        elif st.leftovers:
            _log(quiet, "cleaning leftovers: " + ", ".join(st.leftovers))
            kept = _down(quiet, keep_registry=True) or kept
        t0 = time.monotonic()
        try:
            info = _up(nodes, quiet, timeout, lazy, mounts, registry_data=REGISTRY_KEPT if kept else None)
        except BaseException as e:
            _log(quiet, f"up failed ({type(e).__name__}: {e}); tearing down")
            with contextlib.suppress(Exception):
                _down(quiet=True)
            if isinstance(e, (ClusterError, KeyboardInterrupt)):
                raise
            raise ClusterError(f"cluster up failed: {e}") from e
        _set_link_rates(info, rate, rates, quiet)
        _log(quiet, f"up: {nodes} node(s) in {time.monotonic() - t0:.1f}s; "
                    f"ssh -F {info.ssh_config} node-1")
        return _name_nics(info, nic_names or {}, quiet)


def refusal(nodes: int, mode: str | None = None) -> str:
    """Why up() refuses a cluster of another size (or mode, "lazy"/"classic"; "shared": other
    shared directories) that is up, and the commands that replace it (recreate=True in Python)."""
    what = {None: "is already up", "shared": "is up with other shared directories"}.get(mode, f"is up in {mode} mode")
    return (f"a cluster with {nodes} node(s) {what}; `dtrain cluster up --recreate ...` replaces it "
            "(or `dtrain cluster down` first)")


def _rate(rate: str | int) -> int:
    """A rate in tc units (1gbit) or bits per second -> bits per second; ValueError else."""
    if isinstance(rate, int) and not isinstance(rate, bool):
        if rate <= 0:
            raise ValueError(f"bad rate {rate!r}: bits per second > 0")
        return rate
    return nx.parse_rate(str(rate))


def _check_ifname(name: str) -> None:
    # Linux: at most 15 bytes; ours are also plain (no / : or spaces), and not the host veths'.
    if not (name and len(name) <= 15 and name.replace("_", "").replace("-", "").isalnum()
            and not name.startswith(VETH_PREFIX) and name not in ("lo", "docker0")):
        raise ClusterError(f"bad NIC name {name!r} (letters, digits, - _; at most 15; not lo/docker0/{VETH_PREFIX}*)")


def _name_nics(info: ClusterInfo, names: dict[int, str], quiet: bool) -> ClusterInfo:
    """Rename each node's NIC to names.get(index, NODE_IFNAME) where it differs (link down,
    rename, up: the address stays; the subnet route comes back with the link). Records it."""
    for i in names:
        if not 1 <= i <= len(info.nodes):
            raise ClusterError(f"nic_names: no node {i} (nodes 1..{len(info.nodes)})")
    nodes = []
    for node in info.nodes:
        want = names.get(node.index, NODE_IFNAME)
        _check_ifname(want)
        if want != node.ifname:
            _log(quiet, f"{node.name}: NIC {node.ifname} -> {want}")
            sh(["ip", "-n", node.netns, "-batch", "-"], input=(
                f"link set {node.ifname} down\nlink set {node.ifname} name {want}\nlink set {want} up\n"))
            _wait(f"{node.name}: sshd on {want}", lambda: nx.tcp_open(node.address, 22), 10)
        nodes.append(dataclasses.replace(node, ifname=want))
    if tuple(nodes) == info.nodes:
        return info
    info = dataclasses.replace(info, nodes=tuple(nodes))
    state = _load_state() or {}
    state["info"] = info.to_dict()
    _save_state(state)
    return info


def _set_link_rates(info: ClusterInfo, bits_per_s: int | None, per_node: dict[int, int], quiet: bool) -> None:
    """Each node's link limited to per_node.get(index, bits_per_s) both ways; None: unlimited."""
    if bits_per_s is not None:
        _log(quiet, f"links limited to {bits_per_s / 1e6:g} Mbit/s per node")
    for i, bits in sorted(per_node.items()):
        _log(quiet, f"node-{i}: link limited to {bits / 1e6:g} Mbit/s")
    for node in info.nodes:
        _node_link_rate(node, per_node.get(node.index, bits_per_s))


def _node_link_rate(node: NodeInfo, bits_per_s: int | None) -> None:
    """One node's link: the host end of its veth (what reaches the node: pulls, peers' traffic)
    and its own NIC (what it sends)."""
    nx.set_link_rate(f"{VETH_PREFIX}{node.index}", bits_per_s)
    nx.set_link_rate(node.ifname, bits_per_s, netns=node.netns)


def set_link_rate(index: int, bits_per_s: int | None) -> None:
    """Limit node `index`'s link both ways on the running cluster (tc, at once; the others stay
    as they are); None removes its limit. A later up() sets every node's rate again."""
    state = _load_state()
    if not state or "info" not in state:
        raise ClusterError("no simulated cluster is up (dtrain cluster up)")
    info = ClusterInfo.from_dict(state["info"])
    node = next((n for n in info.nodes if n.index == index), None)
    if node is None:
        raise ClusterError(f"no node {index} (nodes 1..{len(info.nodes)})")
    _node_link_rate(node, bits_per_s)


def _up(n: int, quiet: bool, timeout: float, lazy: Lazy | None = None,
        shared: tuple[tuple[str, str], ...] = (), registry_data: Path | None = None) -> ClusterInfo:
    info = _info(n, lazy is not None, shared)
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    os.chmod(STATE_DIR, 0o755)
    state: dict = {"nodes": n, "created": time.time(), "pids": {}, "info": info.to_dict()}
    _save_state(state)  # first, so a crash mid-way is still cleaned by down()

    def record(key: str, pid: int) -> None:
        state["pids"][key] = pid
        _save_state(state)

    # keys ------------------------------------------------------------------
    _log(quiet, "generating cluster identity and host keys")
    ident = Path(info.identity_file)
    if not ident.exists():
        sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dtrain-cluster",
            "-f", str(ident)])
    _write(STATE_DIR / "authorized_keys", Path(str(ident) + ".pub").read_text(), 0o600)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd privilege-separation dir
    for node in info.nodes:
        d = Path(node.state_dir)
        d.mkdir(parents=True, exist_ok=True)
        hk = d / "ssh_host_ed25519_key"
        if not hk.exists():
            sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", node.name, "-f", str(hk)])
        _write(d / "sshd_config", _sshd_config(node))
        if lazy:
            _write(d / "containerd.toml", lazy_containerd_config(d))
            _write(d / "soci.toml", soci_config())
            _write(d / "daemon.json", daemon_json("soci"))
        else:
            _write(d / "containerd.toml", _containerd_config(d))
            # dockerd 20.10 derives the engine ID from a libtrust key, by default the
            # shared /etc/docker/key.json: give every node its own, or all report one ID.
            _write(d / "daemon.json", json.dumps({"deprecated-key-path": str(d / "key.json")}) + "\n")

    # network ---------------------------------------------------------------
    _log(quiet, f"network: bridge {BRIDGE} {BRIDGE_ADDR}/{PREFIXLEN}, {n} namespace(s)")
    nx.ensure_bridge(BRIDGE, f"{BRIDGE_ADDR}/{PREFIXLEN}")
    # Bridged node<->node frames traverse the host FORWARD chain when
    # br_netfilter is loaded (bridge-nf-call-iptables=1), and a host dockerd
    # sets FORWARD policy DROP: accept our bridge explicitly.
    nx.ipt_ensure("FORWARD", ["-i", BRIDGE, "-o", BRIDGE, "-j", "ACCEPT"])
    nx.ipt_ensure("INPUT", ["-i", BRIDGE, "-p", "tcp", "--dport", str(REGISTRY_PORT), "-j", "ACCEPT"])
    for node in info.nodes:
        nx.add_node_netns(node.netns, BRIDGE, f"{VETH_PREFIX}{node.index}", node.ifname,
                          f"{node.address}/{PREFIXLEN}")
        nx.add_node_mntns(node.netns, binds=_node_binds(node, shared))

    # registry (host netns, bridge address only) ------------------------------
    regdir = STATE_DIR / "registry"
    regdir.mkdir(parents=True, exist_ok=True)
    tls = _registry_tls(regdir)[:2] if lazy else None
    _write(regdir / "config.yml", _registry_config(regdir, tls))
    if registry_data is not None and registry_data.is_dir():  # the replaced cluster's images (up's recreate)
        _log(quiet, "registry: keeping the images pushed to the cluster this one replaces")
        registry_data.rename(regdir / "data")
    (regdir / "data").mkdir(parents=True, exist_ok=True)
    rpid = nx.spawn(["docker-registry", "serve", str(regdir / "config.yml")], regdir / "registry.log")
    record("registry", rpid)

    # containerd per node, then dockerd per node (all started in parallel) -------
    _log(quiet, f"starting containerd + dockerd on {n} node(s)" + (" (lazy: soci-snapshotter-grpc, dockerd 26 on "
                                                                  "the containerd store)" if lazy else ""))
    bindir = lazy_bin(Path(lazy.root), STATE_DIR / "lazy-bin") if lazy else None
    for node in info.nodes if not lazy else ():
        d = Path(node.state_dir)
        pid = nx.spawn(nx.node_argv(node.netns, node.name,
                                    ["containerd", "--config", str(d / "containerd.toml")]),
                       d / "containerd.log")
        record(f"{node.name}/containerd", pid)
    for node in info.nodes:
        d = Path(node.state_dir)
        sock = d / "containerd" / "containerd.sock"
        if not lazy:
            _wait(f"{node.name}: containerd", sock.exists, timeout,
                  [state["pids"][f"{node.name}/containerd"]], [d / "containerd.log"])
        # lazy: lazy-node.sh starts soci-snapshotter-grpc and containerd, then execs dockerd
        first = ["env", f"SSL_CERT_FILE={info.registry_ca}", "bash", str(LAZY_NODE), str(d), str(bindir)] \
            if lazy else ["dockerd"]
        pid = nx.spawn(nx.node_argv(node.netns, node.name, [
            *first,
            "--config-file", str(d / "daemon.json"),
            "--data-root", str(d / "docker"),
            "--exec-root", str(d / "exec"),
            "--pidfile", str(d / "docker.pid"),
            "-H", node.docker_host,
            "--containerd", str(sock),
            "--containerd-namespace", "moby",
            "--insecure-registry", REGISTRY,
            "--log-level", "warn",
        ]), d / "dockerd.log")
        record(f"{node.name}/dockerd", pid)
        # sshd: -D keeps it in the foreground so the pid we record is sshd's.
        pid = nx.spawn(nx.node_argv(node.netns, node.name, [
            SSHD, "-D", "-f", str(d / "sshd_config"), "-E", str(d / "sshd.log")]),
            d / "sshd.out")
        record(f"{node.name}/sshd", pid)

    _wait("registry", lambda: _registry_answers(bool(lazy)), timeout, [rpid], [regdir / "registry.log"])
    for node in info.nodes:
        d = Path(node.state_dir)
        _wait(f"{node.name}: dockerd",
              lambda: (nx.http_unix_get(node.docker_socket, "/_ping") or (0,))[0] == 200,
              timeout, [state["pids"][f"{node.name}/dockerd"]],
              [d / "dockerd.log"] + ([d / "containerd.log", d / "soci.log"] if lazy else []))
        _wait(f"{node.name}: sshd", lambda: nx.tcp_open(node.address, 22), timeout,
              [state["pids"][f"{node.name}/sshd"]], [d / "sshd.log", d / "sshd.out"])
        _log(quiet, f"{node.name} ready: {node.address}, {node.docker_host}")

    # client-side files ----------------------------------------------------
    _write(Path(info.hostfile), _hostfile(info))
    _write(Path(info.mpi_hostfile), "".join(f"{n.address} slots=1\n" for n in info.nodes))
    _write(Path(info.ssh_config), _ssh_config(info))
    state["ready"] = True
    _save_state(state)
    return info


# --------------------------------------------------------------------------
# status


def status() -> ClusterStatus:
    """Describe the cluster: recorded state, daemons alive and answering, leftovers."""
    return _status()


def _leftovers() -> list[str]:
    out = [f"netns {ns}" for ns in nx.netns_list() if _ours_netns(ns)]
    if nx.MNTNS_DIR.is_dir():
        out += [f"mount namespace {p.name}" for p in nx.MNTNS_DIR.iterdir() if _ours_netns(p.name)]
    out += [f"link {l}" for l in nx.links_matching(VETH_PREFIX) if l[len(VETH_PREFIX):].rstrip("p").isdigit()]
    if nx.link_exists(BRIDGE):
        out.append(f"bridge {BRIDGE}")
    return out


def _ours_netns(ns: str) -> bool:
    return ns.startswith(NETNS_PREFIX) and ns[len(NETNS_PREFIX):].isdigit()


def _status() -> ClusterStatus:
    state = _load_state()
    if not state or "info" not in state:
        return ClusterStatus(up=False, nodes=0, info=None, leftovers=_leftovers())
    info = ClusterInfo.from_dict(state["info"])
    problems = []
    if not state.get("ready"):
        problems.append("up did not finish")
    pids = state.get("pids", {})
    for key, pid in sorted(pids.items()):
        if not nx.pid_alive(pid):
            problems.append(f"{key} (pid {pid}) not running")
    if not nx.link_exists(BRIDGE):
        problems.append(f"bridge {BRIDGE} missing")
    if "registry" in pids and not _registry_answers(info.lazy):
        problems.append(f"registry {REGISTRY} not answering")
    for node in info.nodes:
        if not nx.netns_exists(node.netns):
            problems.append(f"{node.name}: netns {node.netns} missing")
            continue
        if (nx.http_unix_get(node.docker_socket, "/_ping") or (0,))[0] != 200:
            problems.append(f"{node.name}: dockerd not answering on {node.docker_socket}")
        if not nx.tcp_open(node.address, 22):
            problems.append(f"{node.name}: sshd not answering on {node.address}:22")
    return ClusterStatus(up=not problems, nodes=int(state.get("nodes", len(info.nodes))),
                         info=info, problems=problems)


# --------------------------------------------------------------------------
# down


def down(*, quiet: bool = False, wait: bool = False) -> None:
    """Stop every daemon and remove namespaces, links, bridge, iptables rules and
    the state directory.  Safe to call when nothing (or only part) is up.

    The state directory (node image stores, registry blobs) is renamed away
    at once and deleted by a detached ``rm -rf`` unless ``wait=True``:
    unlinking a few GB of layers can take tens of seconds on disks mounted
    with ``discard``, and nothing else depends on it being gone."""
    _check_platform()
    with _locked():
        t0 = time.monotonic()
        _down(quiet, wait)
        _log(quiet, f"down in {time.monotonic() - t0:.1f}s")


TRASH_GLOB = f".{STATE_DIR.name}-trash-*"
# The registry's storage between the _down and the _up of a recreate (same file system: a rename).
REGISTRY_KEPT = STATE_DIR.parent / f".{STATE_DIR.name}-registry-kept"


def _remove_state_dir(quiet: bool, wait: bool, keep_registry: bool = False) -> bool:
    """The state directory away (renamed, then deleted); keep_registry: its registry storage moved
    to REGISTRY_KEPT first (True if there was one). Without it, a kept one left by an
    interrupted recreate goes too."""
    trash: list[Path] = []
    kept = False
    data = STATE_DIR / "registry" / "data"
    if REGISTRY_KEPT.exists() and (not keep_registry or data.is_dir()):  # an interrupted recreate's
        t = STATE_DIR.parent / TRASH_GLOB.replace("*", f"{os.getpid()}-{time.time_ns()}-kept")
        REGISTRY_KEPT.rename(t)
        trash.append(t)
    if keep_registry and data.is_dir():
        data.rename(REGISTRY_KEPT)
        kept = True
    if STATE_DIR.exists():
        t = STATE_DIR.parent / TRASH_GLOB.replace("*", f"{os.getpid()}-{time.time_ns()}")
        STATE_DIR.rename(t)
        trash.append(t)
    # earlier leftovers (a previous background delete that was interrupted)
    trash += [p for p in STATE_DIR.parent.glob(TRASH_GLOB) if p not in trash]
    if not trash:
        return kept
    _log(quiet, f"removing {STATE_DIR}" + ("" if wait else " (in the background)"))
    argv = ["rm", "-rf", "--one-file-system", *map(str, trash)]
    if wait:
        sh(argv, timeout=3600)
    else:
        nx.spawn(["nice", "-n", "10", *argv], Path(os.devnull))
    return kept


def _down(quiet: bool, wait: bool = False, keep_registry: bool = False) -> bool:
    """Everything away; keep_registry (up's recreate): the registry's storage to REGISTRY_KEPT
    (True if it was kept)."""
    state = _load_state() or {}
    pids: dict[str, int] = state.get("pids", {})
    namespaces = sorted(set(nx.netns_list()) | {k for k in
                        (f"{NETNS_PREFIX}{i}" for i in range(1, int(state.get("nodes", 0)) + 1))},
                        key=lambda s: (len(s), s))
    namespaces = [ns for ns in namespaces if _ours_netns(ns) and nx.netns_exists(ns)]

    def ours(pid: int) -> bool:
        return nx.pid_alive(pid) and f"{STATE_DIR}/" in nx.pid_cmdline(pid)  # not another slot's

    # 0. the ssh masters a launch keeps to each node for the next one (transport.MUX_PERSIST_S):
    # their sessions would outlive sshd in the node's netns, and a cluster made again at the
    # same addresses would be reached through a master whose link is gone
    hostfile, ssh_config = STATE_DIR / "hostfile", STATE_DIR / "ssh_config"
    if hostfile.is_file() and ssh_config.is_file():
        close_masters(parse_hostfile(str(hostfile)), ("-F", str(ssh_config)))
    # 1. containers: kill them via their dockerd so its shutdown is quick
    for key, pid in pids.items():
        if key.endswith("/dockerd") and ours(pid):
            sock = str(STATE_DIR / key.split("/")[0].replace("node-", "node") / "docker.sock")
            r = nx.http_unix_get(sock, "/containers/json?quiet=1", timeout=3)
            if r and r[0] == 200:
                ids = [c.get("Id") for c in json.loads(r[1] or b"[]")]
                if ids:
                    _log(quiet, f"{key.split('/')[0]}: killing {len(ids)} container(s)")
                    sh([DOCKER_BIN, "-H", f"unix://{sock}", "kill", *ids], check=False, timeout=30)
    # 2. daemons, in dependency order (all nodes at once per tier)
    for tier in ("dockerd", "containerd", "sshd"):
        victims = [pid for key, pid in pids.items() if key.endswith("/" + tier) and ours(pid)]
        if victims:
            _log(quiet, f"stopping {len(victims)} {tier}")
            killed = nx.stop_pids(victims, timeout=15)
            if killed:
                _log(quiet, f"  had to SIGKILL {tier} pid(s) {killed}")
    # 3. anything else still living in a node netns (shims, sessions, containers)
    for ns in namespaces:
        rest = nx.pids_in_netns(ns)
        if rest:
            _log(quiet, f"{ns}: stopping {len(rest)} leftover process(es)")
            nx.stop_pids(rest, timeout=3)
    # containerd shims are spawned into the node netns, but be thorough: any
    # shim or daemon that still names our state dir
    strays = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()
              and _comm(int(p)) in _DAEMON_COMMS and ours(int(p))]
    if strays:
        nx.stop_pids(sorted(set(strays)), timeout=5)
    # 4. mounts left under the state dir (overlay, netns/shm bind mounts)
    _unmount_under(STATE_DIR)
    # 5. network
    for ns in namespaces:
        nx.del_netns(ns)
    for pin in (nx.MNTNS_DIR.iterdir() if nx.MNTNS_DIR.is_dir() else ()):
        if _ours_netns(pin.name):
            nx.del_node_mntns(pin.name)
    for link in nx.links_matching(VETH_PREFIX):
        if link[len(VETH_PREFIX):].rstrip("p").isdigit():
            nx.del_link(link)
    nx.del_link(BRIDGE)
    nx.ipt_remove_tagged(BRIDGE)
    # 6. files
    return _remove_state_dir(quiet, wait, keep_registry)


_DAEMON_COMMS = {"dockerd", "containerd", "containerd-shim", "containerd-shim-runc-v2",
                 "runc", "sshd", "docker-registry", "docker-proxy",
                 "soci-snapshotte"}  # soci-snapshotter-grpc, as /proc/PID/comm cuts it (15 characters)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _unmount_under(root: Path) -> None:
    prefix = str(root).rstrip("/") + "/"
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    points = []
    for line in lines:
        mp = line.split()[4].replace("\\040", " ")
        if mp.startswith(prefix):
            points.append(mp)
    for mp in sorted(points, key=len, reverse=True):
        sh(["umount", "-l", mp], check=False)


# --------------------------------------------------------------------------
# conveniences for tests and tasks


def node_exec(index: int, argv: list[str], *, check: bool = True, timeout: float = 60):
    """Run ``argv`` on node ``index`` (its netns, its hostname, DOCKER_HOST set)."""
    node = _node(index)
    env_argv = ["env", f"DOCKER_HOST={node.docker_host}", *argv]
    return sh(nx.node_argv(node.netns, node.name, env_argv), check=check, timeout=timeout)


if __name__ == "__main__":  # tiny CLI for manual use: python -m dtrain.launch.infra.cluster up 2
    import argparse
    ap = argparse.ArgumentParser(prog="python -m dtrain.launch.infra.cluster")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("up")
    p.add_argument("--nodes", "-n", type=int, default=2)
    p.add_argument("--recreate", action="store_true")
    p.add_argument("--link-rate", help="limit each node's link, e.g. 1gbit (default: none)")
    sub.add_parser("down")
    sub.add_parser("status")
    a = ap.parse_args()
    try:
        if a.cmd == "up":
            print(json.dumps(up(a.nodes, recreate=a.recreate, link_rate=a.link_rate).to_dict(), indent=2))
        elif a.cmd == "down":
            down()
        else:
            print(status())
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
