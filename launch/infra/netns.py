"""Low-level Linux helpers for the local simulated cluster.

Network namespaces, veth pairs, a host bridge, tagged iptables rules, and
starting/stopping daemons inside a node's network namespace with the node's
own hostname.  Everything here shells out to iproute2/iptables/nsenter/unshare;
nothing is Docker- or ssh-specific (that lives in :mod:`launch.cluster`).

Why ``nsenter --net=/run/netns/X unshare --uts`` and not ``ip netns exec X``:
``ip netns exec`` also unshares the mount namespace and remounts /sys for the
new netns, which hides the cgroup v1 hierarchy, and dockerd then dies with
"Devices cgroup isn't mounted".  nsenter only switches the network namespace,
and the node's own mount namespace (:func:`add_node_mntns`), which differs from the
host's by one thing: a private /dev/shm, as each real machine has its own.
"""

from __future__ import annotations

import errno
import os
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterable, Sequence

from dtrain import values

NETNS_DIR = Path("/run/netns")
MNTNS_DIR = Path("/run/dtrain-mntns")
IPT_COMMENT = "dtrain-cluster"


class CommandError(RuntimeError):
    """A helper command failed; the message carries the command and its stderr."""


def sh(argv: Sequence[str], *, check: bool = True, input: str | None = None,
       timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``argv`` and capture output; raise :class:`CommandError` on failure."""
    try:
        cp = subprocess.run(list(argv), input=input, capture_output=True,
                            text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise CommandError(f"{argv[0]}: not found ({e})") from None
    except subprocess.TimeoutExpired:
        raise CommandError(f"timed out after {timeout}s: {' '.join(argv)}") from None
    if check and cp.returncode != 0:
        msg = (cp.stderr or cp.stdout).strip()
        raise CommandError(f"{' '.join(argv)} -> rc={cp.returncode}: {msg}")
    return cp


# --------------------------------------------------------------------------
# links, bridges, namespaces


def link_exists(name: str, netns: str | None = None) -> bool:
    argv = ["ip"] + (["-n", netns] if netns else []) + ["link", "show", "dev", name]
    return sh(argv, check=False).returncode == 0


def netns_list() -> list[str]:
    out = sh(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def netns_exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def links_matching(prefix: str) -> list[str]:
    """Host-namespace link names starting with ``prefix`` (veth peers lose the @suffix)."""
    out = sh(["ip", "-o", "link", "show"], check=False).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            name = parts[1].strip().split("@", 1)[0]
            if name.startswith(prefix):
                names.append(name)
    return names


def ensure_bridge(name: str, cidr: str) -> None:
    """Create bridge ``name`` with address ``cidr`` (e.g. 10.213.0.1/24), up."""
    if not link_exists(name):
        sh(["ip", "link", "add", name, "type", "bridge"])
    addrs = sh(["ip", "-o", "-4", "addr", "show", "dev", name]).stdout
    if f" {cidr} " not in addrs:
        sh(["ip", "addr", "add", cidr, "dev", name])
    sh(["ip", "link", "set", name, "up"])


def add_node_netns(netns: str, bridge: str, host_veth: str, node_ifname: str,
                   cidr: str, gateway: str | None = None) -> None:
    """Create ``netns`` wired into ``bridge``: host end ``host_veth``, node end
    renamed ``node_ifname`` (e.g. ens5) with address ``cidr``."""
    tmp_peer = f"{host_veth}p"  # <= 15 chars; renamed inside the netns
    sh(["ip", "netns", "add", netns])
    sh(["ip", "link", "add", host_veth, "type", "veth", "peer", "name", tmp_peer])
    sh(["ip", "link", "set", tmp_peer, "netns", netns])
    sh(["ip", "link", "set", host_veth, "master", bridge])
    sh(["ip", "link", "set", host_veth, "up"])
    batch = [
        "link set lo up",
        f"link set {tmp_peer} name {node_ifname}",
        f"addr add {cidr} dev {node_ifname}",
        f"link set {node_ifname} up",
    ]
    if gateway:
        batch.append(f"route add default via {gateway} dev {node_ifname}")
    sh(["ip", "-n", netns, "-batch", "-"], input="\n".join(batch) + "\n")


def parse_rate(rate: str) -> int:
    """`1gbit`, `500mbit`, `100kbit` (tc's decimal bit units) -> bits per second; ValueError else."""
    try:
        return values.bit_rate("rate", rate)
    except values.BadValue:
        raise ValueError(f"bad rate {rate!r}: use e.g. 1gbit, 500mbit, 100kbit") from None


def tbf_args(bits_per_s: int) -> list[str]:
    """`tc qdisc replace ... root tbf` arguments for a rate: a bucket of 10 ms of traffic
    (at least 64 KiB, so a 250 Hz timer can keep up) and up to 50 ms queued."""
    burst = max(bits_per_s // 8 // 100, 64 * 1024)
    return ["tbf", "rate", f"{bits_per_s}bit", "burst", str(burst), "latency", "50ms"]


def set_link_rate(link: str, bits_per_s: int | None, netns: str | None = None) -> None:
    """Limit what `link` sends to bits_per_s (token bucket); None removes the limit."""
    where = ["-n", netns] if netns else []
    if bits_per_s is None:
        sh(["tc", *where, "qdisc", "del", "dev", link, "root"], check=False)
    else:
        sh(["tc", *where, "qdisc", "replace", "dev", link, "root", *tbf_args(bits_per_s)])


def add_node_mntns(name: str, shm_size: str = "1g", binds: Sequence[tuple[str, str]] = ()) -> None:
    """Pin a mount namespace for a node at MNTNS_DIR/name, with a tmpfs of its own on /dev/shm
    and the files in binds (src, dst) mounted over the host's; everything else stays shared
    with the host. The pin file must sit on a private mount."""
    MNTNS_DIR.mkdir(parents=True, exist_ok=True)
    if not _mounted(MNTNS_DIR):
        sh(["mount", "--bind", str(MNTNS_DIR), str(MNTNS_DIR)])
        sh(["mount", "--make-private", str(MNTNS_DIR)])
    del_node_mntns(name)
    pin = MNTNS_DIR / name
    pin.touch()
    script = f"mount -t tmpfs -o mode=1777,size={shlex.quote(shm_size)} dtrain-shm /dev/shm"
    for src, dst in binds:
        script += f" && mount --bind {shlex.quote(src)} {shlex.quote(dst)}"
    sh(["unshare", f"--mount={pin}", "--propagation", "private", "sh", "-c", script])


def del_node_mntns(name: str) -> None:
    """Unpin a node's mount namespace (it ends with its last process)."""
    pin = MNTNS_DIR / name
    if _mounted(pin):
        sh(["umount", str(pin)], check=False)
    pin.unlink(missing_ok=True)


def _mounted(path: Path) -> bool:
    """A mount point (os.path.ismount misses a bind mount of a directory onto itself)."""
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(path) for line in f)


def del_netns(netns: str) -> None:
    if netns_exists(netns):
        sh(["ip", "netns", "del", netns], check=False)


def del_link(name: str) -> None:
    if link_exists(name):
        sh(["ip", "link", "del", name], check=False)


def netns_inode(netns: str) -> tuple[int, int] | None:
    try:
        st = os.stat(NETNS_DIR / netns)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def pids_in_netns(netns: str) -> list[int]:
    """Every process whose network namespace is ``netns`` (skipping zombies)."""
    key = netns_inode(netns)
    if key is None:
        return []
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{d}/ns/net")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == key and pid_alive(int(d)):
            pids.append(int(d))
    return pids


# --------------------------------------------------------------------------
# iptables (host namespace), every rule tagged with a comment so down() can
# find exactly the ones we added


def ipt_ensure(chain: str, rule: Sequence[str], table: str = "filter") -> None:
    spec = list(rule) + ["-m", "comment", "--comment", IPT_COMMENT]
    if sh(["iptables", "-w", "-t", table, "-C", chain, *spec], check=False).returncode != 0:
        sh(["iptables", "-w", "-t", table, "-I", chain, "1", *spec])


def ipt_remove_tagged(bridge: str, table: str = "filter") -> int:
    """Delete every rule carrying our comment on this bridge (another simulated cluster's rules
    stay); return how many were removed."""
    cp = sh(["iptables", "-w", "-t", table, "-S"], check=False)
    if cp.returncode != 0:
        return 0
    n = 0
    for line in cp.stdout.splitlines():
        args = shlex.split(line)
        if line.startswith("-A ") and IPT_COMMENT in args and "-i" in args and args[args.index("-i") + 1] == bridge:
            args[0] = "-D"
            if sh(["iptables", "-w", "-t", table, *args], check=False).returncode == 0:
                n += 1
    return n


# --------------------------------------------------------------------------
# processes


def node_argv(netns: str, hostname: str, argv: Sequence[str]) -> list[str]:
    """argv that runs ``argv`` in ``netns`` and the node's mount namespace (same name), in a
    fresh UTS namespace named ``hostname``.

    nsenter and unshare (without --fork) exec, so the resulting pid *is* the
    final program's pid."""
    return ["nsenter", f"--net={NETNS_DIR / netns}", f"--mount={MNTNS_DIR / netns}", "unshare", "--uts", "sh", "-c",
            'hostname "$0" && exec "$@"', hostname, *argv]


def spawn(argv: Sequence[str], log_path: Path) -> int:
    """Start a daemon detached (own session, stdin /dev/null, output to log_path)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        p = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True,
                             close_fds=True)
    return p.pid


def _proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except OSError:
        return None
    return data.rsplit(")", 1)[1].split()[0]


def pid_alive(pid: int) -> bool:
    _reap(pid)
    st = _proc_state(pid)
    return st is not None and st not in ("Z", "X")


def pid_cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    except OSError:
        pass


def stop_pids(pids: Iterable[int], timeout: float = 10.0, sig: int = signal.SIGTERM) -> list[int]:
    """Signal ``pids`` with ``sig``, wait up to ``timeout``, SIGKILL survivors.
    Returns the pids that had to be killed."""
    pids = [p for p in pids if pid_alive(p)]
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)
    killed = [p for p in pids if pid_alive(p)]
    for p in killed:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(pid_alive(p) for p in killed):
        time.sleep(0.05)
    return killed


# --------------------------------------------------------------------------
# readiness probes


def tcp_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def http_unix_get(sock_path: str, path: str, timeout: float = 2.0) -> tuple[int, bytes] | None:
    """Minimal HTTP/1.0 GET over a unix socket (to ping dockerd without the CLI)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(sock_path)
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: docker\r\n\r\n".encode())
        chunks = []
        while True:
            b = s.recv(65536)
            if not b:
                break
            chunks.append(b)
    except OSError as e:
        if e.errno not in (errno.ENOENT, errno.ECONNREFUSED, errno.ECONNRESET) and not isinstance(e, socket.timeout):
            raise
        return None
    finally:
        s.close()
    data = b"".join(chunks)
    try:
        head, _, body = data.partition(b"\r\n\r\n")
        code = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None
    return code, body


def http_tcp_get(host: str, port: int, path: str, timeout: float = 2.0) -> int | None:
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(f"GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\n\r\n".encode())
            data = s.recv(4096)
        return int(data.split(b" ", 2)[1])
    except (OSError, IndexError, ValueError):
        return None
