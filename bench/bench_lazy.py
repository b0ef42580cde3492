"""Lazy loading with SOCI: time to the first training step and bytes fetched before it,
`docker pull && docker run` on a node whose Docker uses the SOCI snapshotter (lazy) against the
same commands on a node with Docker 26's default classic layer store (overlay2: pull+run) and
on one with the containerd image store and the overlayfs snapshotter (what turning lazy loading
on switches a node to, for images without an index), and the floor (the image's compressed
bytes at the link rate).

Engines: Debian 13 (trixie)'s docker.io 26.1.5, containerd 1.7.24 and soci-snapshotter 0.4.1,
unpacked, not installed (this machine is Debian 12; all three are Go binaries linked against
glibc 2.34 at most; Debian 13's runc needs glibc 2.38, so Debian 12's runc 1.1.5 runs the
containers). engine.ensure_lazy_binaries() fetches them with apt from the machine's own sources
with suite trixie, in an apt state of their own, and unpacks them under /var/tmp/dtrain-lazy/root
(the bench calls it for the default --root; measured with soci-snapshotter_0.4.1-5+b3,
containerd_1.7.24~ds1-6+deb13u1, docker.io_26.1.5+dfsg1-9+deb13u1+b1).
Then, with the CPU images built in the host engine (`dtrain build`), as root:

    flock /tmp/dtrain-turn.lock python bench/bench_lazy.py [--root /var/tmp/dtrain-lazy/root]
        [--families pytorch-ddp,horovod-tensorflow] [--nodes 1,2] [--repeat 3] [--link-rate 1gbit]
        [--steady 90] [--tars DIR]

--tars DIR takes FAMILY.tar files (`docker save` of dtrain/FAMILY:TAG) instead of saving them
from the host engine. Everything runs on a network of its own: bridge lzbr0 10.214.0.1/24,
namespaces lz0 (builds the SOCI index) and lz1.. (the nodes, 10.214.0.11..), a registry
(Debian 12's docker-registry, distribution 2.8) with TLS on 10.214.0.1:5443 (SOCI 0.4.1 fetches
its index over HTTPS only), state under /var/tmp/dtrain-lazy/bench; all removed at the end.

What a node does (launch/node/lazy-node.sh, the program `dtrain cluster up --lazy` runs on
each node too; its configs from launch/infra/cluster.py): containerd with a proxy snapshotter `soci` (its
soci-snapshotter-grpc's socket), dockerd with `{"features": {"containerd-snapshotter": true},
"storage-driver": "soci"}` and `--containerd` that containerd. `docker pull` then mounts every
layer that has a zTOC as FUSE and fetches spans on first read; the index is found with the
OCI referrers fallback tag (sha256-DIGEST) that `soci push` writes. Indexes are built with
`soci create --min-layer-size 0`: Docker passes no layer size to the snapshotter, and a layer
without a zTOC makes soci 0.4.1 try to fetch it itself, fail after ~8 s ("size of descriptor
is 0"), then leave it to containerd.

The images are pushed to that registry from a builder (lz0) whose Docker uses the classic
store, so their layers are gzip as `dtrain push` makes them (a containerd-store engine pushes
a loaded image's layers uncompressed), pulled into its containerd with `ctr`, indexed there.

Rows: first step = until every node printed its first step (`docker pull -q REF && docker run
--rm --network host REF python lazy_train.py`, launch/node/examples/), each node emptied
(daemons restarted on fresh state) before every sample; bytes = what the node's link carried until then; the steady table:
median step time, lazy over the first 30 s and after 60 s, against a warm (fully pulled) node;
the import table: bytes a framework import fetched (background fetch off), after the pull.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import shutil
import ssl
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dtrain import contract, engine  # noqa: E402
from dtrain.images import soci  # noqa: E402
from dtrain.images.render import local_ref  # noqa: E402
from dtrain.images.spec import load_all  # noqa: E402
from dtrain.launch.infra import cluster  # noqa: E402
from dtrain.launch.infra import netns as nx  # noqa: E402
from dtrain.launch.jobs import node_programs  # noqa: E402
from dtrain.launch.jobs.container import ContainerSpec, Mount, docker_run_parts  # noqa: E402
from dtrain.table import markdown  # noqa: E402

LAZY_NODE = cluster.LAZY_NODE
TRAIN = ROOT / "launch" / "node" / "examples" / "lazy_train.py"  # mounted: the images may predate it
STATE = Path("/var/tmp/dtrain-lazy/bench")
BRIDGE, HOST_ADDR, PREFIXLEN, REG_PORT = "lzbr0", "10.214.0.1", 24, 5443
REGISTRY = f"{HOST_ADDR}:{REG_PORT}"
IPT_TAG = "dtrain-lazy"  # not the cluster's comment: `cluster down` must not touch these rules
# the node's storage: SOCI lazy loading, Docker 26's default (classic layer store, overlay2), and
# the containerd image store with the overlayfs snapshotter (what lazy loading switches the node to)
MODES = ("soci", "overlay2", "overlayfs")
FRAMEWORK = {"pytorch-ddp": "torch", "horovod-pytorch": "torch", "horovod-tensorflow": "tensorflow"}
ACCEPT = ", ".join(("application/vnd.oci.image.manifest.v1+json",
                    "application/vnd.docker.distribution.manifest.v2+json"))


# --- pure helpers (tests/test_bench_lazy.py) ---------------------------------------------------

def node_addr(i: int) -> str:
    return f"10.214.0.{10 + i}"


# a node's configs: the simulated cluster's lazy nodes' (containerd with the SOCI proxy
# snapshotter, soci-snapshotter-grpc's, dockerd's: overlay2 is the classic layer store, whose
# `docker push` gzips the layers)
containerd_config = cluster.lazy_containerd_config
soci_config = cluster.soci_config
daemon_json = cluster.daemon_json


def registry_config(root: Path, cert: Path, key: Path) -> str:
    return f"""version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: {REGISTRY}
  tls:
    certificate: {cert}
    key: {key}
"""


def parse_step(line: str) -> tuple[int, float] | None:
    """lazy_train.py's `step I UNIXTIME` -> (I, UNIXTIME); anything else None."""
    parts = line.split()
    if len(parts) != 3 or parts[0] != "step":
        return None
    try:
        return int(parts[1]), float(parts[2])
    except ValueError:
        return None


def step_median(times: list[float], start: float, end: float) -> float | None:
    """Median step duration (s) of the steps that ended between start and end seconds after
    the first step; None when fewer than 2 did."""
    if not times:
        return None
    durations = [b - a for a, b in zip(times, times[1:]) if start <= b - times[0] < end]
    return statistics.median(durations) if len(durations) >= 2 else None


def floor_seconds(nbytes: int, bits_per_s: int | None) -> float | None:
    """The least time nbytes take on a link of bits_per_s (None: unlimited, no floor)."""
    return None if bits_per_s is None else nbytes * 8 / bits_per_s


def mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


# --- the network, the registry, the nodes ----------------------------------------------------

def sh(*argv: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(list(argv), capture_output=True, text=True, env=env)
    if check and r.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])}: exit {r.returncode}: {(r.stderr or r.stdout)[-1500:]}")
    return r


def ipt(op: str, chain: str, rule: list[str]) -> bool:
    return sh("iptables", "-w", op, chain, *rule, "-m", "comment", "--comment", IPT_TAG, check=False).returncode == 0


IPT_RULES = [("FORWARD", ["-i", BRIDGE, "-o", BRIDGE, "-j", "ACCEPT"]),
             ("INPUT", ["-i", BRIDGE, "-p", "tcp", "--dport", str(REG_PORT), "-j", "ACCEPT"])]


def net_up(nodes: int) -> None:
    nx.ensure_bridge(BRIDGE, f"{HOST_ADDR}/{PREFIXLEN}")
    for chain, rule in IPT_RULES:
        if not ipt("-C", chain, rule):
            sh("iptables", "-w", "-I", chain, "1", *rule, "-m", "comment", "--comment", IPT_TAG)
    for i in range(nodes + 1):
        if not nx.netns_exists(f"lz{i}"):
            nx.add_node_netns(f"lz{i}", BRIDGE, f"lzv{i}", "ens5", f"{node_addr(i)}/{PREFIXLEN}")


def net_down() -> None:
    for ns in nx.netns_list():
        if ns.startswith("lz") and ns[2:].isdigit():
            nx.del_netns(ns)
    for link in nx.links_matching("lzv"):
        nx.del_link(link)
    nx.del_link(BRIDGE)
    for chain, rule in IPT_RULES:
        while ipt("-D", chain, rule):
            pass


def set_rate(i: int, bits_per_s: int | None) -> None:
    """Node i's link both ways (the host end of its veth: what reaches it; its own NIC)."""
    nx.set_link_rate(f"lzv{i}", bits_per_s)
    nx.set_link_rate("ens5", bits_per_s, netns=f"lz{i}")


def make_tls(d: Path) -> tuple[Path, Path, Path]:
    """A self-signed certificate for the registry's address; the bundle every client trusts
    (SSL_CERT_FILE: Go's x509 reads it on Linux)."""
    cert, key, bundle = d / "registry.crt", d / "registry.key", d / "ca-bundle.pem"
    sh("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=dtrain-lazy",
       "-addext", f"subjectAltName=IP:{HOST_ADDR}", "-keyout", str(key), "-out", str(cert))
    bundle.write_text(Path("/etc/ssl/certs/ca-certificates.crt").read_text() + cert.read_text())
    return cert, key, bundle


def make_bin(root: Path, d: Path) -> Path:
    """BIN for lazy-node.sh: the unpacked binaries under --root, not Debian 13's runc."""
    try:
        return cluster.lazy_bin(root, d)
    except cluster.ClusterError as e:
        raise SystemExit(str(e)) from None


@dataclass
class Node:
    """One simulated node (lzI): lazy-node.sh's daemons on fresh state, until stop()."""

    i: int
    bindir: Path
    env: dict
    driver: str = "soci"
    background_fetch: bool = True
    pid: int = 0
    dir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.dir = STATE / f"n{self.i}"

    @property
    def sock(self) -> str:
        return f"unix://{self.dir / 'docker.sock'}"

    def start(self) -> "Node":
        shutil.rmtree(self.dir, ignore_errors=True)
        (self.dir / "soci").mkdir(parents=True)
        (self.dir / "containerd.toml").write_text(containerd_config(self.dir))
        (self.dir / "soci.toml").write_text(soci_config(self.background_fetch))
        (self.dir / "daemon.json").write_text(daemon_json(self.driver))
        argv = ["nsenter", f"--net=/run/netns/lz{self.i}", "unshare", "-m", "--propagation", "private",
                "bash", str(LAZY_NODE), str(self.dir), str(self.bindir),
                "--config-file", str(self.dir / "daemon.json"), "--data-root", str(self.dir / "docker"),
                "--exec-root", str(self.dir / "exec"), "--pidfile", str(self.dir / "docker.pid"), "-H", self.sock,
                "--containerd", str(self.dir / "containerd" / "containerd.sock"), "--containerd-namespace", "moby",
                "--bridge", "none", "--iptables=false", "--ip6tables=false", "--userland-proxy=false"]
        with open(self.dir / "dockerd.log", "wb") as log:
            self.pid = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True, env=self.env).pid
        deadline = time.monotonic() + 60
        while self.docker("version", check=False).returncode != 0:
            if time.monotonic() > deadline or not nx.pid_alive(self.pid):
                raise SystemExit(f"lz{self.i}: dockerd did not start: see {self.dir}/*.log")
            time.sleep(0.2)
        return self

    def docker(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return sh("docker", "-H", self.sock, *args, check=check, env=self.env)

    def in_ns(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """argv in this node's network and mount namespaces (where soci's /var/lib dir is its own)."""
        return sh("nsenter", "-t", str(self.pid), "-m", "-n", *argv, env=self.env)

    def tx_bytes(self) -> int:
        return int(Path(f"/sys/class/net/lzv{self.i}/statistics/tx_bytes").read_text())

    def stop(self) -> None:
        """Every process of the node (daemons, shims, containers: all in its network
        namespace), then its state; its mounts went with its mount namespace."""
        if self.pid:
            try:
                os.killpg(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            nx.stop_pids([self.pid], timeout=20)
        nx.stop_pids(nx.pids_in_netns(f"lz{self.i}"), timeout=10)
        nx.stop_pids(nx.pids_in_netns(f"lz{self.i}"), timeout=5, sig=signal.SIGKILL)
        self.pid = 0
        shutil.rmtree(self.dir, ignore_errors=True)


def registry_layers(ref: str, cafile: Path) -> list[int]:
    repo, _, tag = ref.split("/", 1)[1].rpartition(":")
    req = urllib.request.Request(f"https://{REGISTRY}/v2/{repo}/manifests/{tag}", headers={"Accept": ACCEPT})
    with urllib.request.urlopen(req, timeout=10, context=ssl.create_default_context(cafile=str(cafile))) as r:
        return [x["size"] for x in json.load(r)["layers"]]


def publish(builder: Node, tar: Path, local: str, remote: str) -> None:
    """The image from a `docker save` tar into the registry with gzip layers (the builder's
    Docker uses the classic layer store: `docker push` from the containerd store would send
    the loaded layers uncompressed), then pulled into the builder's containerd and its SOCI
    index (every layer, see the docstring) built and pushed beside it."""
    builder.docker("load", "-q", "-i", str(tar))
    builder.docker("tag", local, remote)
    builder.docker("push", "-q", remote)
    csock = str(builder.dir / "containerd" / "containerd.sock")
    tools = soci.Tools(str(builder.bindir / "soci"), str(builder.bindir / "ctr"), None)
    for argv in soci.index_argvs(tools, csock, remote, None, None):  # `dtrain push --soci`'s commands
        builder.in_ns(*argv)


# --- samples -----------------------------------------------------------------------------------

@dataclass
class Run:
    first: float  # seconds from the start of the pull to this node's first step
    nbytes: int  # what the node's link carried until then
    steps: list[float]  # every step's end (unix time)


def run_on(node: Node, ref: str, framework: str, seconds: float, t0: float) -> Run:
    node.docker("pull", "-q", ref)
    argv = ["docker", "-H", node.sock, "run", "--rm", "--network", "host",
            "--mount", f"type=bind,src={TRAIN},dst=/lazy_train.py,readonly",
            ref, "python", "/lazy_train.py", "--framework", framework, "--seconds", str(seconds)]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=node.env)
    err: list[str] = []
    threading.Thread(target=lambda: err.extend(p.stderr), daemon=True).start()
    steps, nbytes = [], 0
    for line in p.stdout:
        step = parse_step(line)
        if step and not steps:
            nbytes = node.tx_bytes()
        if step:
            steps.append(step[1])
    if p.wait() != 0 or not steps:
        raise SystemExit(f"lz{node.i}: {ref}: exit {p.returncode}: {''.join(err)[-1500:]}")
    return Run(steps[0] - t0, nbytes, steps)


def sample(nodes: list[Node], ref: str, framework: str, seconds: float = 0) -> list[Run]:
    """Fresh nodes, then `docker pull && docker run` on all at once."""
    for n in nodes:
        n.stop()
        n.start()
    base = [n.tx_bytes() for n in nodes]
    t0 = time.time()
    with ThreadPoolExecutor(len(nodes)) as ex:
        runs = list(ex.map(lambda n: run_on(n, ref, framework, seconds, t0), nodes))
    for r, b in zip(runs, base):
        r.nbytes -= b
    return runs


def import_bytes(node: Node, ref: str, framework: str) -> tuple[int, int]:
    """(bytes of the lazy pull, bytes `import FRAMEWORK` then fetched), background fetch off."""
    node.stop()
    node.background_fetch = False
    node.start()
    b0 = node.tx_bytes()
    node.docker("pull", "-q", ref)
    b1 = node.tx_bytes()
    node.docker("run", "--rm", "--network", "host", ref, "python", "-c", f"import {framework}")
    b2 = node.tx_bytes()
    node.stop()
    node.background_fetch = True
    return b1 - b0, b2 - b1


def contract_check(node: Node, ref: str) -> str:
    """The launcher's own `docker run -d` (container.docker_run_parts and the node's flags: host network, a bind
    mount, the job key mount, env) on a lazy node; sshd must answer on SSH_PORT with the job's key."""
    node.stop()
    node.start()
    job = node.dir / "job"
    job.mkdir(mode=0o700)
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(job / "id_ed25519"))
    shutil.copy(job / "id_ed25519.pub", job / "authorized_keys")
    data = node.dir / "data"
    data.mkdir()
    (data / "marker").write_text("mounted\n")
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]  # capped as the launcher caps it
    spec = ContainerSpec(job="lazycheck", image=ref, mounts=(Mount(str(data), "/data", True),),
                         key_dir=str(job), env={"DTRAIN_LAZY": "yes"})
    head, rest = docker_run_parts(spec)
    argv = [*head, *node_programs.node_flags(0, (), "" if hard == resource.RLIM_INFINITY else str(hard)), *rest]
    node.docker("pull", "-q", ref)
    node.docker(*argv[1:])
    ssh = ["ssh", "-p", str(contract.SSH_PORT), "-i", str(job / "id_ed25519"), "-o", "BatchMode=yes",
           "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=3",
           "-o", "LogLevel=ERROR", f"root@{node_addr(node.i)}", "cat /data/marker && echo DTRAIN_LAZY=$DTRAIN_LAZY"]
    deadline = time.monotonic() + 60
    while True:
        r = sh("nsenter", f"--net=/run/netns/lz{node.i}", *ssh, check=False)
        if r.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    node.stop()
    if r.returncode != 0:
        return f"FAIL: ssh -p {contract.SSH_PORT}: exit {r.returncode}: {(r.stdout + r.stderr).strip()[-200:]}"
    return "ok: " + " / ".join(r.stdout.split())


# --- main --------------------------------------------------------------------------------------

def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--root", type=Path, default=engine.LAZY_ROOT,
                    help="where the Debian 13 packages are unpacked (dpkg -x; the default is fetched when missing)")
    ap.add_argument("--families", default="pytorch-ddp,horovod-tensorflow")
    ap.add_argument("--nodes", default="1,2")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--link-rate", default="1gbit")
    ap.add_argument("--steady", type=float, default=90, help="seconds of steps for the steady-state table (0: skip)")
    ap.add_argument("--tars", type=Path, help="FAMILY.tar files (docker save) instead of the host engine's images")
    args = ap.parse_args()
    if args.root == engine.LAZY_ROOT:
        engine.ensure_lazy_binaries()
    counts = [int(x) for x in args.nodes.split(",")]
    rate = nx.parse_rate(args.link_rate)
    imgs = [i for i in load_all(args.families.split(",")) if not i.gpu]
    shutil.rmtree(STATE, ignore_errors=True)
    STATE.mkdir(parents=True)
    nodes: list[Node] = []
    reg = None
    try:
        cert, key, bundle = make_tls(STATE)
        env = {**os.environ, "SSL_CERT_FILE": str(bundle)}
        bindir = make_bin(args.root, STATE / "bin")
        net_up(max(counts))
        (STATE / "registry.yml").write_text(registry_config(STATE / "registry", cert, key))
        reg = subprocess.Popen(["docker-registry", "serve", str(STATE / "registry.yml")], stdout=subprocess.DEVNULL,
                               stderr=open(STATE / "registry.log", "w"), start_new_session=True)
        builder = Node(0, bindir, env, driver="overlay2").start()
        nodes = [builder] + [Node(i, bindir, env) for i in range(1, max(counts) + 1)]
        first_rows = [("image", "compressed", "link", "nodes", "lazy: first step", "lazy: bytes/node",
                       "pull+run: first step", "pull+run, containerd store", "pull+run: bytes/node",
                       "floor (bytes/link)", "lazy / pull+run", "lazy / containerd store")]
        steady_rows = [("image", "link", "warm node step", "lazy step, first 30 s", "lazy step, after 60 s",
                        "lazy 0-30 s / warm", "lazy 60 s+ / warm")]
        import_rows = [("image", "compressed", "lazy pull (index, zTOCs, config)", "import fetched", "import / image")]
        contract_rows = [("image", "launcher's docker run on a lazy node: sshd on 2022, bind mount, env")]
        for img in imgs:
            framework = FRAMEWORK[img.family]
            tar = args.tars / f"{img.family}.tar" if args.tars else STATE / f"{img.family}.tar"
            if not args.tars:
                sh("docker", "save", "-o", str(tar), local_ref(img))
            remote = f"{REGISTRY}/dtrain/{img.family}:{img.tag}"
            publish(builder, tar, local_ref(img), remote)
            size = sum(registry_layers(remote, bundle))
            print(f"{remote}: {mib(size)} compressed, SOCI index pushed", file=sys.stderr, flush=True)
            contract_rows.append((img.family, contract_check(nodes[1], remote)))
            print(" | ".join(contract_rows[-1]), file=sys.stderr, flush=True)
            pulled, imported = import_bytes(nodes[1], remote, framework)
            import_rows.append((img.family, mib(size), mib(pulled), mib(imported), f"{imported / size:.0%}"))
            print(" | ".join(import_rows[-1]), file=sys.stderr, flush=True)
            for bits in (None, rate):
                for i in range(1, max(counts) + 1):
                    set_rate(i, bits)
                link = args.link_rate if bits else "unlimited"
                for n in counts:
                    runs: dict[str, list[list[Run]]] = {d: [] for d in MODES}
                    for _ in range(args.repeat):  # interleaved: a drift in the machine's speed hits all alike
                        for driver in MODES:
                            for nd in nodes[1:n + 1]:
                                nd.driver = driver
                            runs[driver].append(sample(nodes[1:n + 1], remote, framework))
                    first = {d: statistics.median(max(r.first for r in s) for s in runs[d]) for d in MODES}
                    nbytes = {d: statistics.median(statistics.mean(r.nbytes for r in s) for s in runs[d]) for d in MODES}
                    fl = floor_seconds(size, bits)
                    first_rows.append((img.family, mib(size), link, str(n), f"{first['soci']:.1f} s", mib(nbytes['soci']),
                                       f"{first['overlay2']:.1f} s", f"{first['overlayfs']:.1f} s",
                                       mib(nbytes['overlay2']), f"{fl:.1f} s" if fl else "-",
                                       f"{first['soci'] / first['overlay2']:.2f}x",
                                       f"{first['soci'] / first['overlayfs']:.2f}x"))
                    print(" | ".join(first_rows[-1]), file=sys.stderr, flush=True)
            if args.steady > 0:
                set_rate(1, rate)
                nodes[1].driver = "soci"
                lazy_steps = sample(nodes[1:2], remote, framework, args.steady)[0].steps
                nodes[1].driver = "overlay2"
                warm_steps = sample(nodes[1:2], remote, framework, args.steady)[0].steps
                warm = step_median(warm_steps, 0, args.steady + 1)
                early, late = step_median(lazy_steps, 0, 30), step_median(lazy_steps, 60, args.steady + 1)
                ms = lambda s: f"{s * 1000:.1f} ms" if s else "-"  # noqa: E731
                ratio = lambda s: f"{s / warm:.2f}x" if s and warm else "-"  # noqa: E731
                steady_rows.append((img.family, args.link_rate, ms(warm), ms(early), ms(late), ratio(early),
                                    ratio(late)))
                print(" | ".join(steady_rows[-1]), file=sys.stderr, flush=True)
            nodes[1].stop()
        for rows in (first_rows, steady_rows, import_rows, contract_rows):
            if len(rows) > 1:
                print(markdown(rows) + "\n")
    finally:
        for n in nodes:
            n.stop()
        if reg:
            reg.terminate()
            reg.wait(10)
        net_down()
        shutil.rmtree(STATE, ignore_errors=True)


if __name__ == "__main__":
    main()
