"""`dtrain push`: a SOCI index built for each pushed image and pushed beside it (issue 26), by
default where it can be (issue 52: `from_flags`; `--soci` insists, `--no-soci` skips).

Nodes whose Docker runs on the containerd image store with the SOCI snapshotter
(`dtrain cluster up`, lazy by default; docs/launch.md "Lazy loading") then start the image before it is
all there. What the index needs, found by bench/bench_lazy.py (docs/benchmarks.md "Lazy
loading (SOCI)"):
- the image's layers as the registry holds them (gzip): they are fetched back into a containerd
  (`ctr content fetch`), not taken from the local engine;
- a zTOC for every layer (`soci create --min-layer-size 0`: Docker passes the snapshotter no
  layer size, and a layer without one costs ~8 s on the node);
- a registry with TLS: soci 0.4.1 fetches the index over HTTPS only. `soci push` writes the
  OCI referrers fallback tag (sha256-DIGEST) where the registry has no referrers API; ECR has one.

The containerd is a private one started for the purpose (its state in a temp dir removed on
every exit, Ctrl-C included), or the machine's when its socket is given. soci 0.4.1 keeps its
artifact database under the fixed /var/lib/soci-snapshotter-grpc: with the private containerd
every soci command runs in a mount namespace of its own where the temp dir is mounted there.

Credentials never reach argv: `ctr` gets `--user USER` and reads the password from its
terminal (a pty this module feeds); `soci push` reads the engine's login (the Docker config
`docker login` wrote moments before).

Pure functions build the argv; `build_indexes()` runs them.
"""

from __future__ import annotations

import contextlib
import os
import pty
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from dtrain.containerd import containerd_config
from dtrain.images.errors import PushError

BIN_ENV = "DTRAIN_SOCI_BIN"  # a directory holding soci, ctr, containerd (e.g. an unpacked package)
NAMESPACE = "dtrain-soci"  # the containerd namespace the image is pulled into to be indexed
SOCI_LIB = "/var/lib/soci-snapshotter-grpc"  # soci 0.4.1's fixed state directory
INSTALL_HINT = ("install Debian 13's packages soci-snapshotter and containerd (or the soci-snapshotter "
                "0.4.1 release and containerd 1.7), or pass --soci-bin DIR / set $" + BIN_ENV)


class SociError(PushError):
    """--soci cannot go on; str() is the one-line message."""


@dataclass(frozen=True)
class Tools:
    soci: str
    ctr: str
    containerd: str | None  # None: the machine's containerd is used (socket given)


@dataclass(frozen=True)
class Setup:
    """How the indexes are built: the tools, and the machine's containerd socket (None: a
    private containerd)."""

    tools: Tools
    socket: str | None = None


def find_tools(bin_dir: str | None, socket_path: str | None,
               which: Callable[[str, str | None], str | None] = lambda n, p: shutil.which(n, path=p)) -> Tools:
    """soci, ctr (and containerd unless the machine's socket is given) from bin_dir (any of
    DIR, DIR/usr/bin, DIR/usr/sbin: an unpacked package tree works) or else PATH."""
    path = os.pathsep.join(str(Path(bin_dir) / sub) for sub in ("", "usr/bin", "usr/sbin")) if bin_dir else None
    names = ("soci", "ctr") + (() if socket_path else ("containerd",))
    found = {n: which(n, path) for n in names}
    missing = [n for n, p in found.items() if not p]
    if missing:
        where = f"in {bin_dir}" if bin_dir else "on PATH"
        raise SociError(f"--soci: no {', '.join(f'`{n}`' for n in missing)} found {where}: {INSTALL_HINT}")
    return Tools(found["soci"], found["ctr"], found.get("containerd"))


def setup(bin_dir: str | None, socket_path: str | None, euid: int | None = None,
          fetch: Callable[[], Path] | None = None) -> Setup:
    """--soci's flags checked before anything runs. Without --soci-bin, $DTRAIN_SOCI_BIN or the
    tools on PATH, the Debian 13 packages `dtrain cluster up` uses are taken from where
    it unpacks them, fetched there first if missing (fetch: engine.ensure_lazy_binaries)."""
    if socket_path is not None and not Path(socket_path).is_socket():
        raise SociError(f"--containerd-socket {socket_path}: not a socket (is containerd running there?)")
    if socket_path is None and (os.geteuid() if euid is None else euid) != 0:
        raise SociError("--soci starts a private containerd, which needs root: run as root, or pass "
                        "--containerd-socket PATH of the machine's containerd")
    chosen = bin_dir or os.environ.get(BIN_ENV) or None
    if chosen is None:
        try:
            return Setup(find_tools(None, socket_path), socket_path)
        except SociError:
            from dtrain import engine

            chosen = str((fetch or engine.ensure_lazy_binaries)())
    return Setup(find_tools(chosen, socket_path), socket_path)


OFF = "push: no SOCI index, the nodes will pull these images in full"  # the head of default_setup's line


def from_flags(soci: bool, no_soci: bool, bin_dir: str | None, socket_path: str | None,
               registry: str | None, say: Callable[[str], None] = print,
               cluster: tuple[str, Path] | None = None) -> Setup | None:
    """`dtrain push`'s SOCI flags: `--soci` insists (any reason it cannot is an error),
    `--no-soci` skips the index, neither makes it where it can be made (default_setup).
    cluster: the simulated cluster's (registry, CA bundle), from the push task (images/ knows
    nothing of launch/)."""
    if soci and no_soci:
        raise SociError("--soci and --no-soci: pass one")
    if no_soci and (bin_dir or socket_path):
        raise SociError(f"{'--soci-bin' if bin_dir else '--containerd-socket'} is for the SOCI index: drop --no-soci")
    if no_soci:
        return None
    trust_cluster_ca(registry, say, cluster=cluster)
    return setup(bin_dir, socket_path) if soci else default_setup(bin_dir, socket_path, registry, say)


def trust_cluster_ca(registry: str | None, say: Callable[[str], None], env: dict[str, str] | None = None,
                     cluster: tuple[str, Path] | None = None) -> None:
    """The simulated cluster's registry (`dtrain cluster up`, lazy: TLS with a self-signed
    certificate): soci trusts its bundle where $SSL_CERT_FILE names none. cluster: (its
    registry, its bundle), as launch/infra/cluster.py has them; None: nothing to trust."""
    if cluster is None:
        return
    env = os.environ if env is None else env
    address, bundle = cluster
    if registry == address and "SSL_CERT_FILE" not in env and bundle.is_file():
        env["SSL_CERT_FILE"] = str(bundle)
        say(f"push: the simulated cluster's registry: SSL_CERT_FILE={bundle} for soci")


def default_setup(bin_dir: str | None, socket_path: str | None, registry: str | None,
                  say: Callable[[str], None] = print, euid: int | None = None,
                  lazy_root: Path | None = None, state: Callable[[str], str] | None = None) -> Setup | None:
    """`dtrain push` without --soci/--no-soci (issue 52, lazy by default where it helps): the
    Setup where the index can be made (root or --containerd-socket; the tools from --soci-bin,
    $DTRAIN_SOCI_BIN, PATH or the packages `cluster up` unpacked, never fetched here; a
    registry with TLS, or ECR), else None and one line saying why. A flag that names something
    absent is still an error."""
    if socket_path is not None and not Path(socket_path).is_socket():
        raise SociError(f"--containerd-socket {socket_path}: not a socket (is containerd running there?)")
    if socket_path is None and (os.geteuid() if euid is None else euid) != 0:
        say(f"{OFF}: the index needs a containerd, and a private one needs root (run as root, pass "
            "--containerd-socket PATH, or --no-soci to say so)")
        return None
    if registry is not None and (state or tls_state)(registry) == "plain":
        say(f"{OFF}: registry {registry} speaks plain HTTP, and soci 0.4.1 fetches indexes over HTTPS only "
            "(`dtrain cluster up` gives the cluster's registry TLS unless --no-lazy; --no-soci to say so)")
        return None
    chosen = bin_dir or os.environ.get(BIN_ENV) or None
    if chosen is not None:
        return Setup(find_tools(chosen, socket_path), socket_path)  # named: its absence is an error
    try:
        return Setup(find_tools(None, socket_path), socket_path)
    except SociError:
        pass
    from dtrain import engine

    root = lazy_root or engine.LAZY_ROOT
    try:
        return Setup(find_tools(str(root), socket_path), socket_path)
    except SociError:
        say(f"{OFF}: no soci/ctr/containerd on PATH nor in {root} ({INSTALL_HINT}; `dtrain cluster up` or "
            "`dtrain push --soci` fetches Debian 13's there; --no-soci to say so)")
        return None


def tls_state(registry: str, timeout: float = 5.0) -> str:
    """'tls' where registry HOST[:PORT] answers a TLS handshake (certificate not checked
    here), 'plain' where it answers but not with TLS, 'unreachable' where nothing answers."""
    host, _, port = registry.rpartition(":") if registry.rsplit(":", 1)[-1].isdigit() else (registry, "", "443")
    host = host.strip("[]")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as s:
            with ctx.wrap_socket(s, server_hostname=host):
                return "tls"
    except ssl.SSLError:
        return "plain"
    except OSError:
        return "unreachable"


def require_tls(registry: str, state: str) -> None:
    if state == "plain":
        raise SociError(f"--soci: registry {registry} speaks plain HTTP, and soci 0.4.1 fetches its index over "
                        "HTTPS only: give the registry TLS (`dtrain cluster up` does for the cluster's)")


def in_own_soci_lib(lib: Path | None, argv: Sequence[str]) -> list[str]:
    """argv run with lib mounted over soci's fixed state directory, in a mount namespace of
    its own (None: argv as it is, on the machine's)."""
    if lib is None:
        return list(argv)
    return ["unshare", "-m", "--propagation", "private", "sh", "-c",
            'mount --bind "$0" "$1" && shift && exec "$@"', str(lib), SOCI_LIB, *argv]


def index_argvs(tools: Tools, address: str, ref: str, user: str | None, lib: Path | None) -> list[list[str]]:
    """The three commands that index ref: fetch its layers into containerd's content store
    (`ctr content fetch`: the image's record and blobs, nothing unpacked), a zTOC for every
    layer, push the index (and zTOCs) beside the image."""
    soci = [tools.soci, "--address", address, "--namespace", NAMESPACE]
    return [
        [tools.ctr, "--address", address, "--namespace", NAMESPACE, "content", "fetch",
         *(["--user", user] if user else []), ref],
        in_own_soci_lib(lib, [*soci, "create", "--min-layer-size", "0", ref]),
        in_own_soci_lib(lib, [*soci, "push", "--quiet", "--existing-index", "allow", ref]),
    ]


# ---------------------------------------------------------------- side effects


def run_tool(argv: Sequence[str], password: str | None = None, timeout: float = 1800) -> subprocess.CompletedProcess:
    """argv with its output captured; a password goes to its terminal (a pty on stdin, which
    `ctr --user USER` reads its password prompt from), never to argv or the environment."""
    if password is None:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    master, slave = pty.openpty()
    try:
        os.write(master, password.encode() + b"\n")
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=slave)
    finally:
        os.close(slave)
        os.close(master)
    return p


@contextlib.contextmanager
def private_containerd(containerd: str, timeout: float = 30) -> Iterator[tuple[str, Path]]:
    """A containerd of its own in a temp dir: yields (its socket, a soci state dir); stopped
    and the dir removed on every exit (an error, Ctrl-C, SIGTERM: the caller's handler)."""
    tmp = Path(tempfile.mkdtemp(prefix="dtrain-soci-"))
    proc = None
    try:
        (tmp / "containerd.toml").write_text(containerd_config(tmp / "containerd"))
        (tmp / "soci-lib").mkdir()
        with open(tmp / "containerd.log", "wb") as log:
            proc = subprocess.Popen([containerd, "--config", str(tmp / "containerd.toml")], stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        sock = tmp / "containerd" / "containerd.sock"
        deadline = time.monotonic() + timeout
        while not sock.is_socket():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (tmp / "containerd.log").read_text(errors="replace").strip().splitlines()[-3:]
                raise SociError(f"--soci: the private containerd did not start: {' / '.join(tail) or 'no output'}")
            time.sleep(0.1)
        Path(SOCI_LIB).mkdir(parents=True, exist_ok=True)  # the mount point (soci's own path)
        yield str(sock), tmp / "soci-lib"
    finally:
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        _unmount_under(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


def _unmount_under(root: Path) -> None:
    """containerd's own mounts left under root (none in normal runs: nothing is unpacked)."""
    prefix = str(root) + "/"
    with contextlib.suppress(OSError):
        points = [ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()]
        for mp in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
            subprocess.run(["umount", "-l", mp], capture_output=True)


def _failed(step: str, ref: str, r: subprocess.CompletedProcess, secrets: Sequence[str]) -> SociError:
    text = (r.stderr or r.stdout or "").strip()
    for s in secrets:
        if s:
            text = text.replace(s, "***")
    last = text.splitlines()[-1] if text else f"exit {r.returncode}"
    hint = ""
    if "x509" in text or "certificate" in text:
        hint = " (the registry's certificate is not trusted: point $SSL_CERT_FILE at a bundle holding it)"
    elif "http: server gave HTTP response to HTTPS client" in text:
        hint = " (soci 0.4.1 needs a registry with TLS)"
    return SociError(f"--soci: {step} {ref} failed: {last}{hint}")


def index_one(setup_: Setup, address: str, lib: Path | None, ref: str, user: str | None,
              password: str | None) -> None:
    """Pull ref's layers into containerd, index them, push the index beside the image; the
    pulled image is removed again (the machine's containerd keeps nothing of it)."""
    pull, create, push_ = index_argvs(setup_.tools, address, ref, user, lib)
    try:
        for step, argv, pw in (("pulling", pull, password if user else None), ("indexing", create, None),
                               ("pushing the index of", push_, None)):
            r = run_tool(argv, pw)
            if r.returncode != 0:
                raise _failed(step, ref, r, [password or ""])
    finally:
        if setup_.socket:
            run_tool([setup_.tools.ctr, "--address", address, "--namespace", NAMESPACE, "images", "rm", ref])


def build_indexes(setup_: Setup, refs: Sequence[str], user: str | None = None, password: str | None = None,
                  out: Callable[[str], None] = print) -> None:
    """A SOCI index for each pushed ref, pushed beside it."""
    with contextlib.ExitStack() as stack:
        if setup_.socket:
            address, lib = setup_.socket, None
        else:
            assert setup_.tools.containerd
            address, lib = stack.enter_context(private_containerd(setup_.tools.containerd))
        for ref in refs:
            start = time.monotonic()
            out(f"SOCI index for {ref}")
            index_one(setup_, address, lib, ref, user, password)
            out(f"SOCI index pushed beside {ref} ({time.monotonic() - start:.1f} s)")


def referrers_tag(digest: str) -> str:
    """The OCI referrers fallback tag `soci push` writes for an image's manifest digest
    (sha256:abc -> sha256-abc): how a node (and `dtrain launch`) finds the index."""
    return digest.replace(":", "-", 1)


__all__ = ["SociError", "Tools", "Setup", "find_tools", "setup", "tls_state", "require_tls", "index_argvs",
           "build_indexes", "referrers_tag", "BIN_ENV", "NAMESPACE"]
