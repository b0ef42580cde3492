"""Idempotent host setup: Debian packages, the local Docker engine, the base image.

Works on a fresh, container-like Debian bookworm machine without systemd:
every function checks first and only acts when something is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

# Debian packages the project needs on the host.
PACKAGES: tuple[str, ...] = (
    "docker.io",  # dockerd 20.10 and /usr/bin/docker with built-in BuildKit
    "debootstrap",  # builds the base image offline (no registry pulls)
    "openssh-server",
    "openssh-client",
    "openmpi-bin",
    "libopenmpi-dev",  # mpi.h for mpicc: tests/test_cluster.py compiles an MPI program
    "gcc",  # the C compiler mpicc wraps (libopenmpi-dev pulls only gfortran-12)
    "docker-registry",  # local registry for the simulated cluster
    "iproute2",
    "iptables",  # dockerd needs working iptables for its bridge network
    "apache2-utils",  # htpasswd for registry auth
    "shellcheck",  # tests check the node programs (launch/node/)
    "containerd",  # dockerd's runtime (a docker.io dependency; the cluster starts its own)
    "runc",
    "openssl",  # the tests' throw-away CA (conftest.ca_bundle)
    "procps",  # ps: the cluster tests look for leftover processes
    "curl", "zstd",  # bench/bench_pull_parts.py: the pull's parts by hand; curl: the nodes' spot watch
    "rsync",  # --workdir: the launcher's side and the (simulated) nodes'; EC2 AMIs ship it
    "git",  # tests make throw-away repositories (SageMaker's source upload, workdir sync)
    "pigz",  # dockerd decompresses layers with unpigz when it is on PATH (docs/benchmarks.md: cold pull)
    "chromium",  # tests/test_report.py renders `dtrain report`'s page in a real headless browser
)
# Programs from the base system (Debian Essential/required: bash, coreutils, tar, util-linux,
# mount, dpkg, apt) are not listed; tests/test_host_packages.py checks every program the
# tests, benches and the demo run against this list and that base.

DOCKER_CLI = Path("/usr/bin/docker")  # 20.10 from docker.io: BuildKit built in
DOCKER_SOCK = Path("/var/run/docker.sock")
DOCKERD_LOG = Path("/var/log/dtrain/dockerd.log")
CACHE_DIR = Path("/var/cache/dtrain")
BASE_IMAGE = "dtrain/debian:bookworm"
SUITE = "bookworm"  # the base image's Debian release, the machine's own (Debian 12)
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))

# Keep image layers small: no recommends, no cached .debs (like the official image).
_APT_CONF = (
    'APT::Install-Recommends "false";\n'
    'APT::Install-Suggests "false";\n'
    'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb '
    '/var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };\n'
    'Acquire::GzipIndexes "true";\n'
)

# `docker import` sets no config; give the base an explicit PATH/LANG/CMD.
_IMPORT_CHANGES = (
    "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "--change", "ENV LANG=C.UTF-8",
    "--change", 'CMD ["bash"]',
)


class EngineError(RuntimeError):
    """Host set-up failed (a package, dockerd, the base image); str() says what to look at."""


def deb822_stanzas(text: str) -> list[dict[str, str]]:
    """The stanzas of a deb822 file (apt's `.sources`) as {Field: value}, field names as written,
    comment lines left out; a continuation line (leading space or tab: a Signed-By key block)
    stays in its field's value after a newline, so a stanza written back is the same."""
    stanzas = []
    for block in re.split(r"\n[ \t]*\n", text):
        fields: dict[str, str] = {}
        last = ""
        for line in block.splitlines():
            if line.startswith("#"):
                continue
            if line[:1] in (" ", "\t"):
                if last:
                    fields[last] += "\n" + line
            elif ":" in line:
                last, _, value = line.partition(":")
                last = last.strip()
                fields[last] = value.strip()
        if fields:
            stanzas.append(fields)
    return stanzas


def deb822_field(stanza: dict[str, str], name: str, default: str = "") -> str:
    """A stanza's field by name, in any case (deb822 field names are case-insensitive)."""
    return next((v for k, v in stanza.items() if k.lower() == name.lower()), default)


def apt_sources(texts: dict[str, str]) -> list[tuple[str, str, str]]:
    """(uri, suite, components) of every enabled `deb` source in apt's files ({path: text}):
    one-line `.list` files and deb822 `.sources` stanzas (Enabled: no and other Types skipped)."""
    found: list[tuple[str, str, str]] = []
    for path, text in texts.items():
        if path.endswith(".sources"):
            for f in deb822_stanzas(text):
                if "deb" in deb822_field(f, "Types").split() and deb822_field(f, "Enabled", "yes").lower() != "no":
                    found += [(uri, suite, deb822_field(f, "Components"))
                              for uri in deb822_field(f, "URIs").split() for suite in deb822_field(f, "Suites").split()]
        else:
            for line in text.splitlines():
                words = [w for w in line.split("#", 1)[0].split() if not (w.startswith("[") or w.endswith("]"))]
                if len(words) >= 3 and words[0] == "deb":
                    found.append((words[1], words[2], " ".join(words[3:])))
    return found


def base_sources(sources: list[tuple[str, str, str]], suite: str = SUITE) -> str:
    """The base image's sources.list: the machine's own apt sources for `suite` and its -updates
    and -security suites, main only (debootstrap sets just "SUITE main"). EngineError naming
    apt's files when the machine has no source for `suite`: this project names no mirror."""
    wanted = (suite, f"{suite}-updates", f"{suite}-security")
    lines = [f"deb {uri} {s} main" for uri, s, comps in sources if s in wanted and "main" in comps.split()]
    if not any(line.split()[2] == suite for line in lines):
        raise EngineError(f"no apt source for Debian {suite} main in {APT_SOURCES[0]} or {APT_SOURCES[1]}/: "
                          f"the base image is debootstrapped from this machine's own Debian mirror")
    return "\n".join(dict.fromkeys(lines)) + "\n"


def host_apt_sources() -> list[tuple[str, str, str]]:
    """apt_sources of this machine's apt files."""
    files = [APT_SOURCES[0], *sorted(APT_SOURCES[1].glob("*.list")), *sorted(APT_SOURCES[1].glob("*.sources"))]
    return apt_sources({str(p): p.read_text(errors="replace") for p in files if p.is_file()})


def debian_mirror(suite: str = SUITE) -> str:
    """The machine's Debian mirror for `suite` (what debootstrap fetches from)."""
    return base_sources(host_apt_sources(), suite).split()[1]


def _say(msg: str) -> None:
    print(f"[dtrain] {msg}", flush=True)


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """Run cmd (check=True); a failure or a missing program becomes an EngineError."""
    try:
        return subprocess.run(cmd, check=True, **kw)
    except subprocess.CalledProcessError as e:
        err = (e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or "").strip()
        raise EngineError(f"`{' '.join(cmd[:3])}` failed with exit code {e.returncode}"
                          + (f": {err.splitlines()[-1]}" if err else "")) from None
    except FileNotFoundError:
        raise EngineError(f"{cmd[0]}: not found (Debian bookworm with apt-get is expected)") from None


def _quiet_ok(cmd: list[str], timeout: float = 20) -> bool:
    """True if cmd exits 0 (output discarded)."""
    try:
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


# --------------------------------------------------------------------- packages

def missing_packages(packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Packages from `packages` that dpkg does not report as installed."""
    r = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${Status}\n", *packages],
                       capture_output=True, text=True)
    ok = {ln.split()[0] for ln in r.stdout.splitlines() if ln.endswith(" installed")}
    return [p for p in packages if p not in ok]


def ensure_packages(packages: tuple[str, ...] = PACKAGES) -> None:
    """apt-get install whatever is missing (needs root)."""
    missing = missing_packages(packages)
    if not missing:
        _say(f"host packages present ({len(packages)})")
        return
    _say(f"installing host packages: {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _say("apt-get update ...")
    _run(["apt-get", "update", "-q"], env=env)
    _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], env=env)
    still = missing_packages(packages)
    if still:
        raise EngineError(f"apt-get did not install: {' '.join(still)}")
    _say("host packages installed")


# ----------------------------------------------------------------------- docker

def docker_cli() -> str:
    """Path of a docker CLI with built-in BuildKit (the 20.10 one from docker.io).

    /usr/local/bin/docker (v28) may shadow it on PATH but has no buildx plugin,
    so `docker build` there fails; always call this path explicitly.
    """
    if not DOCKER_CLI.exists():
        raise EngineError(f"{DOCKER_CLI} missing: run ensure_packages() (docker.io)")
    return str(DOCKER_CLI)


def run_cli() -> str:
    """A docker CLI to run a container with (not to build: docker_cli): the one on PATH (Docker
    Desktop's, a distribution's; any version runs `docker run`), else DOCKER_CLI."""
    found = shutil.which("docker")
    if found:
        return found
    if DOCKER_CLI.exists():
        return str(DOCKER_CLI)
    raise EngineError("no `docker` on PATH: install Docker (Docker Desktop, docker.io or docker-ce) "
                      "and put its `docker` on PATH")


def docker(*args: str, **kw) -> subprocess.CompletedProcess:
    """Run the docker CLI (check=True); extra kwargs go to subprocess.run."""
    return _run([docker_cli(), *args], **kw)


def docker_ok() -> bool:
    """True if the daemon answers `docker info`."""
    return _quiet_ok([docker_cli(), "info"])


def _select_iptables() -> None:
    """Make sure `iptables` works; fall back to iptables-legacy if nft fails.

    On this host both iptables-nft (Debian default) and -legacy work; kernels
    without nf_tables need the legacy backend, else dockerd dies with
    "failed to create NAT chain DOCKER".
    """
    probe = ["-t", "nat", "-L", "-n"]
    if _quiet_ok(["iptables", *probe]):
        return
    legacy = shutil.which("iptables-legacy")
    if legacy and _quiet_ok([legacy, *probe]):
        _say("iptables (nft) unusable; switching alternatives to iptables-legacy")
        for tool in ("iptables", "ip6tables"):
            _run(["update-alternatives", "--set", tool, f"/usr/sbin/{tool}-legacy"],
                 stdout=subprocess.DEVNULL)
        return
    raise EngineError("neither iptables-nft nor iptables-legacy works; dockerd needs one")


def ensure_dockerd(timeout: float = 60) -> None:
    """Start the host dockerd if its socket does not answer (no systemd needed)."""
    docker_cli()
    if docker_ok():
        _say("docker engine is running")
        return
    _select_iptables()
    DOCKERD_LOG.parent.mkdir(parents=True, exist_ok=True)
    _say(f"starting dockerd (log: {DOCKERD_LOG})")
    # A stale pid file from a dead daemon makes dockerd refuse to start.
    pid = Path("/var/run/docker.pid")
    if pid.exists() and not _pid_alive(pid):
        pid.unlink()
    with open(DOCKERD_LOG, "ab") as log:
        proc = subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if docker_ok():
            _say("docker engine is up")
            return
        if proc.poll() is not None:
            raise EngineError(f"dockerd exited with code {proc.returncode}; see {DOCKERD_LOG}")
        time.sleep(1)
    raise EngineError(f"dockerd did not answer within {timeout:.0f}s; see {DOCKERD_LOG}")


def _pid_alive(pidfile: Path) -> bool:
    try:
        os.kill(int(pidfile.read_text().strip()), 0)
    except (ValueError, ProcessLookupError, PermissionError):
        return False
    return True


# ------------------------------------------------------------------- base image

def image_exists(ref: str) -> bool:
    return _quiet_ok([docker_cli(), "image", "inspect", ref])


def _debootstrap_rootfs(rootfs: Path) -> None:
    """debootstrap --variant=minbase bookworm, then trim it for use as an image."""
    if rootfs.exists():
        shutil.rmtree(rootfs)  # leftover of an interrupted run
    sources = base_sources(host_apt_sources())
    mirror = sources.split()[1]
    _say(f"debootstrap minbase {SUITE} -> {rootfs} from {mirror} (a few minutes)")
    _run(["debootstrap", "--variant=minbase", SUITE, str(rootfs), mirror])
    (rootfs / "etc/apt/sources.list").write_text(sources)
    (rootfs / "etc/apt/apt.conf.d/90dtrain").write_text(_APT_CONF)
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for f in (rootfs / junk).glob("*"):
            if f.is_file():
                f.unlink()


def base_tarball(ref: str = BASE_IMAGE) -> Path:
    """Cached rootfs tarball for `ref` (reused across runs on the same machine)."""
    return CACHE_DIR / f"{ref.replace('/', '_').replace(':', '_')}.tar"


def ensure_base_image(ref: str = BASE_IMAGE) -> None:
    """Import the debootstrapped base image `ref` if the engine lacks it."""
    if image_exists(ref):
        _say(f"base image {ref} present")
        return
    tarball = base_tarball(ref)
    if not tarball.exists():
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        rootfs = CACHE_DIR / "rootfs.tmp"
        _debootstrap_rootfs(rootfs)
        _say(f"packing {tarball}")
        part = tarball.with_suffix(".tar.part")
        _run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(part), "."])
        part.rename(tarball)  # atomic: a half-written tarball is never reused
        shutil.rmtree(rootfs)
    else:
        _say(f"reusing cached {tarball}")
    _say(f"importing {tarball} as {ref}")
    with open(tarball, "rb") as f:
        docker("import", *_IMPORT_CHANGES, "-", ref, stdin=f, stdout=subprocess.DEVNULL)
    _say(f"base image {ref} ready")


def ensure_all(ref: str = BASE_IMAGE) -> None:
    """Everything a build or test needs on this host."""
    ensure_packages()
    ensure_dockerd()
    ensure_base_image(ref)


DAEMON_JSON = Path("/etc/docker/daemon.json")


def allow_insecure_registry(registry: str, timeout: float = 20) -> None:
    """Let the host engine push to a plain-HTTP registry (the simulated cluster's) without
    a restart: `insecure-registries` in daemon.json is reloaded on SIGHUP."""
    import json

    conf = json.loads(DAEMON_JSON.read_text()) if DAEMON_JSON.exists() else {}
    regs = conf.setdefault("insecure-registries", [])
    if registry in regs and registry_trusted(registry):
        return
    if registry not in regs:
        regs.append(registry)
        DAEMON_JSON.parent.mkdir(parents=True, exist_ok=True)
        DAEMON_JSON.write_text(json.dumps(conf, indent=2) + "\n")
    pid = Path("/var/run/docker.pid")
    if pid.exists() and _pid_alive(pid):
        os.kill(int(pid.read_text().strip()), 1)  # SIGHUP: reload configuration
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if registry_trusted(registry):
            _say(f"docker engine trusts plain-HTTP registry {registry}")
            return
        time.sleep(0.5)
    raise EngineError(f"dockerd did not pick up insecure registry {registry} from {DAEMON_JSON}")


def registry_trusted(registry: str) -> bool:
    """The engine reaches this registry over plain HTTP (it is in insecure-registries)."""
    import json

    out = subprocess.run([docker_cli(), "info", "--format", "{{json .RegistryConfig.IndexConfigs}}"],
                         capture_output=True, text=True).stdout
    try:
        return json.loads(out or "{}").get(registry, {}).get("Secure") is False
    except json.JSONDecodeError:
        return False


# ------------------------------------------------------------ lazy loading (issue 26)

# Debian 13 (trixie) packages for lazy loading with SOCI: soci-snapshotter 0.4.1 (soci,
# soci-snapshotter-grpc), containerd 1.7.24, docker.io 26.1.5. This host is Debian 12: they
# are unpacked (dpkg -x), not installed; Debian 12's runc runs the containers (Debian 13's
# needs glibc 2.38). `dtrain cluster up --lazy --lazy-root`, `dtrain push --soci --soci-bin`
# and bench/bench_lazy.py take the directory.
LAZY_PACKAGES: tuple[str, ...] = ("soci-snapshotter", "containerd", "docker.io")
LAZY_SUITE = "trixie"
LAZY_ROOT = Path("/var/tmp/dtrain-lazy/root")
LAZY_BINARIES = {"soci": "usr/bin", "soci-snapshotter-grpc": "usr/bin", "containerd": "usr/bin",
                 "ctr": "usr/bin", "containerd-shim-runc-v2": "usr/bin", "dockerd": "usr/sbin",
                 "docker-proxy": "usr/sbin"}


def lazy_missing(root: Path) -> list[str]:
    """The LAZY_BINARIES not under root (relative paths)."""
    return [f"{sub}/{name}" for name, sub in LAZY_BINARIES.items() if not (root / sub / name).is_file()]


def suite_sources(deb822: str, suite: str) -> str:
    """The machine's apt sources (deb822 text) for another release: each enabled `deb` stanza
    whose Suites name a release itself (bookworm, not bookworm-updates/-security), with Suites:
    suite and every other field (Signed-By: the keyring) as it was."""
    out = []
    for fields in deb822_stanzas(deb822):
        suites = deb822_field(fields, "Suites").split()
        if ("deb" in deb822_field(fields, "Types").split() and deb822_field(fields, "Enabled", "yes").lower() != "no"
                and any("-" not in s for s in suites)):
            out.append("\n".join(f"{k}: {suite if k.lower() == 'suites' else v}" for k, v in fields.items()))
    return "\n\n".join(out) + "\n" if out else ""


def ensure_lazy_binaries(root: Path = LAZY_ROOT, sources: Path = Path("/etc/apt/sources.list.d/debian.sources")) -> Path:
    """LAZY_PACKAGES unpacked under root: fetched with apt from the machine's own sources with
    suite LAZY_SUITE, in an apt state of their own beside root (the .debs are kept there)."""
    if not lazy_missing(root):
        return root
    base = root.parent
    try:
        text = suite_sources(sources.read_text(), LAZY_SUITE)
    except OSError as e:
        raise EngineError(f"lazy loading's binaries: cannot read the machine's apt sources {sources}: {e.strerror}") from None
    if not text:
        raise EngineError(f"lazy loading's binaries: no Debian release source in {sources} to fetch "
                          f"{' '.join(LAZY_PACKAGES)} ({LAZY_SUITE}) from")
    apt, debs = base / "apt", base / "debs"
    (apt / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    debs.mkdir(parents=True, exist_ok=True)
    (apt / f"{LAZY_SUITE}.sources").write_text(text)
    opts = ["-o", f"Dir::Etc::sourcelist={apt / f'{LAZY_SUITE}.sources'}", "-o", "Dir::Etc::sourceparts=-",
            "-o", f"Dir::State::Lists={apt / 'lists'}", "-o", f"Dir::Cache={apt / 'cache'}"]
    _say(f"fetching {' '.join(LAZY_PACKAGES)} ({LAZY_SUITE}) into {debs}")
    _run(["apt-get", *opts, "update", "-q"], capture_output=True)
    _run(["apt-get", *opts, "download", *LAZY_PACKAGES], cwd=debs, capture_output=True)
    for deb in sorted(debs.glob("*.deb")):
        _run(["dpkg", "-x", str(deb), str(root)], capture_output=True)
    missing = lazy_missing(root)
    if missing:
        raise EngineError(f"lazy loading's binaries: {', '.join(missing)} still missing under {root} after unpacking "
                          f"{' '.join(LAZY_PACKAGES)}")
    return root
