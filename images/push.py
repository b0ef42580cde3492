"""Push built images to Amazon ECR or any Docker v2 registry, verify them, and catalog them.

Data flows one way: local image `dtrain/<family>:<tag>` (must be built) -> remote ref
`REGISTRY/PREFIX/<family>:<tag>` -> `docker push` (digest parsed from its output) ->
verification (the registry's manifest for that digest names the local image's config, and
`docker pull REF@DIGEST` gives back the same image ID) -> one catalog entry, written atomically.
Only verified pushes reach the catalog.

Pure functions (`remote_ref`, `parse_push_digest`, `catalog_entry`, `docker_error_message`,
`aws_error_message`, ...) hold the logic; small functions do one side effect each
(`ecr_prepare`, `docker_login`, `push_and_verify`, `record`); `push()` orchestrates.

Secrets (ECR tokens, registry passwords) only ever reach `docker login` on stdin. They are
registered with `_secret()` and scrubbed from every line this module prints or puts in an
error message, as a second line of defence. A push that logs in does so into a Docker config
directory of its own (own_docker_config: 0700, on tmpfs where there is one, DOCKER_CONFIG for
every docker call of the run, soci's too), removed at the end, failure, Ctrl-C or SIGTERM
included: no credential is left in ~/.docker/config.json (or a credential helper) after it. A
push killed with SIGKILL cannot clean up: its directory is named after its process (pid and
start time) and the next push removes it once that process is gone (remove_stale_push_configs).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from dtrain import contract, ecr, interrupts, table
from dtrain.images.errors import PushError
from dtrain.images.render import REPO_PREFIX, ROOT, local_ref

DOCKER = "/usr/bin/docker" if Path("/usr/bin/docker").exists() else (shutil.which("docker") or "docker")
CATALOG = ROOT / "build" / "catalog.json"
CATALOG_VERSION = 1
PASSWORD_ENV = "DTRAIN_REGISTRY_PASSWORD"
# How the user makes a missing image; the build task owns the exact flags.
BUILD_HINT = "dtrain build --image {family} --tag {tag}"


class ImageLike(Protocol):
    @property
    def family(self) -> str: ...
    @property
    def tag(self) -> str: ...


@dataclass(frozen=True)
class LocalImage:
    """An image named by family and tag (spec `Image` objects work too)."""

    family: str
    tag: str


@dataclass(frozen=True)
class Target:
    """Where to push: a registry host, and credentials for `docker login` (None: use the
    engine's existing login, or anonymous). The password never shows in repr()."""

    registry: str
    user: str | None = None
    password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.password:
            _secret(self.password)


@dataclass(frozen=True)
class EcrTarget(Target):
    account: str = ""
    region: str = ""


@dataclass(frozen=True)
class PushResult:
    local: str
    remote: str
    digest: str
    seconds: float
    entry: dict[str, Any]


# ---------------------------------------------------------------- secrets

_SECRETS: set[str] = set()


def _secret(value: str) -> str:
    """Remember a secret so `redact` scrubs it from anything printed or raised."""
    if value and len(value) >= 4:
        _SECRETS.add(value)
    return value


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    for s in sorted(set(secrets) | _SECRETS, key=len, reverse=True):
        if s:
            text = text.replace(s, "***")
    return text


# ---------------------------------------------------------------- pure helpers


_HOST_RE = re.compile(r"^[A-Za-z0-9.-]+(:[0-9]{1,5})?$|^\[[0-9A-Fa-f:]+\](:[0-9]{1,5})?$")
_PATH_RE = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def registry_host(value: str) -> str:
    """'https://host:5000/' or 'host:5000' -> 'host:5000'; PushError if it is not a host."""
    host = urlparse(value).netloc if "://" in value else value.rstrip("/")
    if not host or not _HOST_RE.match(host):
        raise PushError(f"registry must be HOST or HOST:PORT, not '{value}'")
    return host


def repo_name(prefix: str, family: str) -> str:
    """Repository path inside the registry: 'dtrain' + 'pytorch-ddp' -> 'dtrain/pytorch-ddp'."""
    name = f"{prefix.strip('/')}/{family}" if prefix.strip("/") else family
    if not _PATH_RE.match(name):
        raise PushError(f"'{name}' is not a valid repository name (lowercase letters, digits, "
                        "'.', '_', '-' and '/' between components)")
    return name


def remote_ref(registry: str, prefix: str, family: str, tag: str) -> str:
    """'127.0.0.1:5000', 'dtrain', 'pytorch-ddp', 'T' -> '127.0.0.1:5000/dtrain/pytorch-ddp:T'."""
    if not _TAG_RE.match(tag):
        raise PushError(f"'{tag}' is not a valid image tag")
    return f"{registry_host(registry)}/{repo_name(prefix, family)}:{tag}"


def split_ref(ref: str) -> tuple[str, str, str]:
    """'host:5000/a/b:tag' -> ('host:5000', 'a/b', 'tag'); a reference outside Docker's
    grammar is a PushError (dtrain/reference.py)."""
    from dtrain.reference import BadReference, parse

    try:
        r = parse(ref)
    except BadReference as e:
        raise PushError(f"image reference {ref!r}: {e}") from None
    if not r.domain:  # our refs always name a registry; keep the first component as one
        first, _, rest = r.path.partition("/")
        return first, rest, r.tag
    return r.domain, r.path, r.tag


def repository_of(ref: str) -> str:
    """'host/a/b:tag' -> 'host/a/b' (the part before @digest)."""
    registry, repo, _ = split_ref(ref)
    return f"{registry}/{repo}"


_DIGEST_RE = re.compile(r"^\S+: digest: (sha256:[0-9a-f]{64}) size: \d+\s*$", re.M)


def parse_push_digest(output: str) -> str | None:
    """The manifest digest from `docker push` output ('TAG: digest: sha256:... size: N')."""
    found = _DIGEST_RE.findall(output)
    return found[-1] if found else None


# `docker push`'s lines about one layer (its output off a terminal: a line per state change).
_LAYER_RE = re.compile(r"^([0-9a-f]{12}): (Preparing|Waiting|Pushing|Pushed|Layer already exists"
                       r"|Mounted from (\S+)|Retrying in (\d+) seconds?)\b")


@dataclass
class PushProgress:
    """What `docker push` said so far of each layer: id -> pushed | there | mounted (done), or
    the state it is in."""

    layers: dict[str, str] = field(default_factory=dict)

    def count(self, *states: str) -> int:
        return sum(1 for s in self.layers.values() if s in states)


def push_event(line: str, state: PushProgress) -> str | None:
    """Feed one line of `docker push`; return a line worth showing, if any: one per layer when
    it is done (`layer ID pushed (2/5)`) and docker's retries. The rest is not shown: the
    digest line is read by parse_push_digest, an error becomes one PushError naming the registry."""
    m = _LAYER_RE.match(line.strip())
    if not m:
        return None
    layer, what = m.group(1), m.group(2)
    if m.group(4):
        return f"layer {layer}: retrying in {m.group(4)} s"
    done = {"Pushed": "pushed", "Layer already exists": "there"}.get(what, "mounted" if m.group(3) else None)
    if done is None:
        state.layers.setdefault(layer, "waiting")
        return None
    state.layers[layer] = done
    said = {"pushed": "pushed", "there": "already in the registry"}.get(done, f"mounted from {m.group(3)}")
    return f"layer {layer} {said} ({state.count('pushed', 'there', 'mounted')}/{len(state.layers)})"


def push_summary(state: PushProgress, seconds: float) -> str:
    """`3 of 5 layers sent, 2 already in the registry (4.2 s)`."""
    return (f"{state.count('pushed')} of {len(state.layers)} layers sent, "
            f"{state.count('there', 'mounted')} already in the registry ({seconds:.1f} s)")


def _engine_trusts_plain_http(registry: str) -> bool:
    """The engine lists this registry under insecure-registries (e.g. the local cluster's)."""
    from dtrain.engine import registry_trusted

    return registry_trusted(registry)


def is_loopback(registry: str) -> bool:
    """True for registries the engine reaches over plain HTTP by default (127.0.0.0/8, ::1)."""
    from dtrain.reference import is_loopback_registry

    return is_loopback_registry(registry_host(registry))


def versions_from_labels(labels: dict[str, str] | None) -> dict[str, str]:
    """{'dtrain.version.python': '3.11', 'x': 'y'} -> {'python': '3.11'} (sorted)."""
    return {k[len(contract.LABEL_VERSION_PREFIX):]: v for k, v in sorted((labels or {}).items())
            if k.startswith(contract.LABEL_VERSION_PREFIX)}


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def catalog_entry(img: ImageLike, remote: str, digest: str, image_id: str,
                  labels: dict[str, str] | None, pushed_at: str) -> dict[str, Any]:
    """One catalog record; `ref` is its key."""
    registry, repo, tag = split_ref(remote)
    return {
        "ref": remote,
        "pinned": f"{registry}/{repo}@{digest}",
        "registry": registry,
        "repository": repo,
        "image": f"{REPO_PREFIX}/{img.family}",
        "family": img.family,
        "tag": tag,
        "digest": digest,
        "image_id": image_id,
        "versions": versions_from_labels(labels),
        "pushed_at": pushed_at,
    }


def merge_entry(catalog: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """A new catalog with `entry` replacing the one with the same ref in place, or appended."""
    images = list(catalog.get("images", []))
    for i, old in enumerate(images):
        if old.get("ref") == entry["ref"]:
            images[i] = entry
            break
    else:
        images.append(entry)
    return {**catalog, "version": CATALOG_VERSION, "images": images}


def docker_error_message(output: str, registry: str, action: str) -> str:
    """Turn `docker login/push/pull` output into one clear sentence naming the registry."""
    out = redact(output).strip()
    low = out.lower()
    last = next((ln.strip() for ln in reversed(out.splitlines()) if ln.strip()), "no output")
    if "server gave http response to https client" in low:
        return (f"registry {registry} speaks plain HTTP; the engine only allows that for "
                f"loopback addresses or registries in its insecure-registries setting")
    if any(s in low for s in ("connection refused", "no such host", "i/o timeout",
                              "network is unreachable", "server misbehaving", "no route to host",
                              "tls handshake timeout", "connection reset by peer",
                              "context deadline exceeded")):
        return f"registry {registry} is unreachable ({action}): {last}"
    if "x509:" in low or "certificate" in low:
        return f"registry {registry}: TLS certificate problem ({action}): {last}"
    m = re.search(r"not authorized to perform: (\S+) on resource: (\S+)", out)
    if m:
        return (f"registry {registry} denied {m.group(1)} on {m.group(2).rstrip('.,')} "
                f"({action}): {last}")
    if "tag invalid" in low and "immutable" in low:
        return (f"the tag already exists in an immutable repository on {registry} and cannot "
                f"be overwritten ({action}): {last}")
    if re.search(r"\b401\b", low) or any(
            s in low for s in ("unauthorized", "authentication required",
                               "no basic auth credentials", "incorrect username or password")):
        return (f"registry {registry} rejected the credentials ({action}): {last}; check "
                f"--user and the password (--password or ${PASSWORD_ENV})")
    if "denied" in low:
        return f"registry {registry} denied access ({action}): {last}"
    return f"docker {action} ({registry}) failed: {last}"


_DENIED = {"AccessDenied", "AccessDeniedException"}
_BAD_CREDS = {"UnrecognizedClientException", "InvalidClientTokenId", "InvalidSignatureException",
              "SignatureDoesNotMatch", "ExpiredToken", "ExpiredTokenException",
              "InvalidAccessKeyId", "AuthFailure"}


def _xml_field(text: str, tag: str) -> str | None:
    m = re.search(rf"<{tag}>(.*?)</{tag}>", text, re.S)
    return m.group(1).strip() if m else None


def aws_error_message(err: Exception, repository: str | None = None) -> str:
    """A botocore error -> one user-facing sentence (pure; unit-testable without AWS)."""
    from botocore.exceptions import (ClientError, EndpointConnectionError, NoCredentialsError,
                                     NoRegionError, PartialCredentialsError, ProfileNotFound)

    where = f" on repository {repository}" if repository else ""
    if isinstance(err, (NoCredentialsError, PartialCredentialsError)):
        return ("no AWS credentials found: set AWS_PROFILE (or pass --profile), set "
                "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or run on an instance with a role")
    if isinstance(err, ProfileNotFound):
        return f"AWS profile not found: {err}"
    if isinstance(err, NoRegionError):
        return "no AWS region: pass --region or set AWS_REGION"
    if isinstance(err, EndpointConnectionError):
        return f"cannot reach the ECR API: {err}"
    if isinstance(err, ClientError):
        e = err.response.get("Error", {})
        code, msg = e.get("Code", "Unknown"), e.get("Message", "")
        if msg.lstrip().startswith("<"):  # a query-style XML error body under a JSON API
            code = _xml_field(msg, "Code") or code
            msg = _xml_field(msg, "Message") or ""
        status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        action = f"ecr:{err.operation_name}"
        if code in _DENIED or (code in ("403", "Forbidden") and status in (403, None)):
            return f"AWS denied {action}{where}: {msg}".rstrip(": ")
        if code in _BAD_CREDS:
            return f"AWS rejected the credentials ({action}): {code}: {msg}".rstrip(": ")
        return f"{action}{where} failed: {code}: {msg}".rstrip(": ")
    return f"AWS error: {err}"


# ---------------------------------------------------------------- docker side effects


def _docker(*args: str, stdin: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([DOCKER, *args], input=stdin, capture_output=True, text=True,
                              timeout=timeout)
    except FileNotFoundError:
        raise PushError(f"docker CLI not found at {DOCKER}") from None
    except subprocess.TimeoutExpired:
        raise PushError(f"`docker {args[0]}` took more than {timeout:.0f}s") from None


def inspect_image(ref: str) -> dict[str, Any] | None:
    """`docker image inspect REF` as a dict, or None when the engine has no such image."""
    r = _docker("image", "inspect", ref)
    if r.returncode != 0:
        if "no such image" in r.stderr.lower():
            return None
        raise PushError(f"cannot inspect {ref}: {redact(r.stderr).strip()} (is the Docker "
                        "engine running?)")
    return json.loads(r.stdout)[0]


def not_built_message(images: Sequence[ImageLike]) -> str:
    """One line naming every image not built and the command that builds it."""
    return "not built yet: " + "; ".join(
        f"{local_ref(img)} (run `{BUILD_HINT.format(family=img.family, tag=img.tag)}`)" for img in images)


def require_built(images: Sequence[ImageLike]) -> dict[str, dict[str, Any]]:
    """{local ref: inspect data}; PushError naming, on one line, every image not built."""
    found, missing = {}, []
    for img in images:
        ref = local_ref(img)
        info = inspect_image(ref)
        if info is None:
            missing.append(img)
        else:
            found[ref] = info
    if missing:
        raise PushError(not_built_message(missing))
    return found


# What a Docker config of the run's own keeps of the user's config.json: settings the CLI needs to
# reach the same engine the same way. Never auths, credsStore or credHelpers (credentials).
CARRIED_SETTINGS = ("proxies", "currentContext", "experimental")


def user_docker_config_dir(environ: dict[str, str] | None = None) -> Path:
    """The Docker CLI's config directory: $DOCKER_CONFIG, else ~/.docker."""
    environ = os.environ if environ is None else environ
    return Path(environ.get("DOCKER_CONFIG") or Path("~/.docker").expanduser())


def own_config_json(user_config: Any, user_dir: Path) -> dict[str, Any]:
    """The config.json of a push's own Docker config: the user's settings that say which engine
    and how (CARRIED_SETTINGS), the user's CLI plugins still found; no credential. Pure."""
    user_config = user_config if isinstance(user_config, dict) else {}
    out = {k: user_config[k] for k in CARRIED_SETTINGS if k in user_config}
    extra = user_config.get("cliPluginsExtraDirs")
    out["cliPluginsExtraDirs"] = [str(user_dir / "cli-plugins"),
                                  *(d for d in (extra if isinstance(extra, list) else []) if isinstance(d, str))]
    return out


PUSH_CONFIG_PREFIX = "dtrain-push-docker-"  # + PID-STARTTIME- + mkdtemp's random part
_PUSH_CONFIG_RE = re.compile(re.escape(PUSH_CONFIG_PREFIX) + r"(\d+)-(\d+)-[A-Za-z0-9_]+")


def process_start(pid: int) -> str | None:
    """A process's start time (clock ticks since boot, /proc/PID/stat field 22), None when it is
    gone: with the pid it names one process, not a later one given the same pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


def stale_push_configs(parent: Path, start_of: Callable[[int], str | None] = process_start) -> list[Path]:
    """The push Docker configs under parent whose push is gone (SIGKILL, a crash: its `finally`
    never ran): named PUSH_CONFIG_PREFIX + PID-STARTTIME-..., this user's, a directory (not a
    link), and no process PID started at STARTTIME now."""
    out = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return []
    for e in entries:
        m = _PUSH_CONFIG_RE.fullmatch(e.name)
        if not m:
            continue
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if st.st_uid == os.getuid() and e.is_dir(follow_symlinks=False) and start_of(int(m[1])) != m[2]:
            out.append(Path(e.path))
    return sorted(out)


def remove_stale_push_configs(parent: Path) -> list[Path]:
    """Remove what stale_push_configs finds (the next push does it: own_docker_config)."""
    found = stale_push_configs(parent)
    for d in found:
        shutil.rmtree(d, ignore_errors=True)
    return found


def _private_tmp_parent() -> str | None:
    """/dev/shm (tmpfs: a credential never reaches a disk) where it is a writable directory."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK) else None


@contextlib.contextmanager
def own_docker_config() -> Iterator[Path]:
    """A Docker config directory of this run's own (mkdtemp: 0700) as DOCKER_CONFIG for every
    docker call inside (and soci's, which reads the login from it); removed on every exit, an
    error, Ctrl-C, SIGTERM or SIGHUP included. The user's contexts, plugins and proxies stay in
    use; the engine's TLS client keys too (DOCKER_CERT_PATH, where the user's TLS asks for them)."""
    user_dir = user_docker_config_dir()
    try:
        user_config = json.loads((user_dir / "config.json").read_text())
    except (OSError, ValueError):
        user_config = {}
    saved = {k: os.environ.get(k) for k in ("DOCKER_CONFIG", "DOCKER_CERT_PATH")}
    restore = interrupts.sigterm_as_interrupt()
    parent = _private_tmp_parent()
    remove_stale_push_configs(Path(parent or tempfile.gettempdir()))  # a SIGKILLed push's credential
    me = os.getpid()
    d = Path(tempfile.mkdtemp(prefix=f"{PUSH_CONFIG_PREFIX}{me}-{process_start(me) or 0}-", dir=parent))
    try:
        fd = os.open(d / "config.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(own_config_json(user_config, user_dir), f)
        if (user_dir / "contexts").is_dir():
            (d / "contexts").symlink_to(user_dir / "contexts")
        if saved["DOCKER_CERT_PATH"] is None and (os.environ.get("DOCKER_TLS_VERIFY") or os.environ.get("DOCKER_TLS")):
            os.environ["DOCKER_CERT_PATH"] = str(user_dir)
        os.environ["DOCKER_CONFIG"] = str(d)
        yield d
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(d, ignore_errors=True)
        restore()


def docker_login(target: Target) -> None:
    """`docker login --password-stdin`; the password goes through stdin only, into the Docker
    config DOCKER_CONFIG names (push: own_docker_config's)."""
    if not target.user:
        if target.password:
            raise PushError("a registry password needs a user: pass --user")
        return
    if not target.password:
        raise PushError(f"no password for {target.user}@{target.registry}: pass --password or "
                        f"set {PASSWORD_ENV}")
    r = _docker("login", "--username", target.user, "--password-stdin", target.registry,
                stdin=target.password, timeout=120)
    if r.returncode != 0:
        raise PushError(docker_error_message(r.stdout + r.stderr, target.registry, "login"))


def _stream(args: Sequence[str], out: Callable[[str], None],
            show: Callable[[str], str | None]) -> tuple[int, str]:
    """Run docker; each output line (redacted) goes through show(), and what it returns is
    printed, indented, as it comes. Returns (exit code, the whole output)."""
    try:
        p = subprocess.Popen([DOCKER, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, text=True, bufsize=1)
    except FileNotFoundError:
        raise PushError(f"docker CLI not found at {DOCKER}") from None
    lines = []
    assert p.stdout
    for line in p.stdout:
        line = redact(line.rstrip())
        lines.append(line)
        if line and (shown := show(line)):
            out(f"  {shown}")
    return p.wait(), "\n".join(lines)


def verify_digest(remote: str, digest: str, image_id: str) -> None:
    """Check the registry really holds `digest` for this image: its manifest names the
    local config (image ID), and pulling REPO@DIGEST gives back the same image."""
    registry = split_ref(remote)[0]
    pinned = f"{repository_of(remote)}@{digest}"
    # 1. Ask the registry directly (the engine caches manifests it has pulled by digest).
    plain_http = is_loopback(registry) or _engine_trusts_plain_http(registry)
    args = ["manifest", "inspect"] + (["--insecure"] if plain_http else []) + [pinned]
    r = _docker(*args, timeout=120)
    if r.returncode != 0:
        raise PushError(f"pushed {remote} but cannot read back {digest}: "
                        + docker_error_message(r.stdout + r.stderr, registry, "manifest inspect"))
    manifest = json.loads(r.stdout)
    config = (manifest.get("config") or {}).get("digest")
    if config and config != image_id:
        raise PushError(f"{pinned} holds image {config[:19]}, not the pushed {image_id[:19]}")
    # 2. Pull it back through the engine: drop the remote tag and digest ref first.
    _docker("image", "rm", remote)
    _docker("image", "rm", pinned)
    r = _docker("pull", "--quiet", pinned, timeout=1800)
    if r.returncode != 0:
        raise PushError(f"pushed {remote} but cannot pull back {digest}: "
                        + docker_error_message(r.stdout + r.stderr, registry, "pull"))
    info = inspect_image(pinned) or {}
    if info.get("Id") != image_id or pinned not in (info.get("RepoDigests") or []):
        raise PushError(f"pulled {pinned} back as {info.get('Id', '?')[:19]}, not the pushed "
                        f"{image_id[:19]}")
    _docker("tag", image_id, remote)  # as before the check: push_and_verify decides whether it stays


def refs_made_by_push(remote: str, remote_existed: bool, digests_before: Iterable[str],
                      digest: str | None) -> list[str]:
    """The references a push added to the engine and must remove after it: the remote tag
    unless the user had it before, and REPO@DIGEST (the push and the pull-back add it) unless
    the image listed it before. The local tag stays, so the image's content stays too."""
    made = [] if remote_existed else [remote]
    if digest and (pinned := f"{repository_of(remote)}@{digest}") not in set(digests_before):
        made.append(pinned)
    return made


def push_and_verify(local: str, remote: str, out: Callable[[str], None] = print) -> str:
    """Tag, push (streaming progress), verify by pulling back; return the manifest digest.
    Pushed or not, the engine keeps only the references it had before (refs_made_by_push)."""
    info = inspect_image(local)
    if info is None:
        raise PushError(f"{local} is not built")
    registry = split_ref(remote)[0]
    remote_existed = inspect_image(remote) is not None
    digest = None
    try:
        r = _docker("tag", local, remote)
        if r.returncode != 0:
            raise PushError(f"cannot tag {local} as {remote}: {redact(r.stderr).strip()}")
        progress, start = PushProgress(), time.monotonic()
        rc, output = _stream(["push", remote], out, lambda line: push_event(line, progress))
        if rc != 0:
            raise PushError(docker_error_message(output, registry, "push"))
        digest = parse_push_digest(output)
        if not digest:
            raise PushError(f"docker push {remote} reported no digest")
        out(f"  {push_summary(progress, time.monotonic() - start)}")
        verify_digest(remote, digest, info["Id"])
        return digest
    finally:
        for ref in refs_made_by_push(remote, remote_existed, info.get("RepoDigests") or [], digest):
            _docker("image", "rm", ref)  # untags only: never -f, the local tag keeps the image


# ---------------------------------------------------------------- catalog


def read_catalog(path: Path) -> dict[str, Any]:
    from dtrain.values import JSON_MAX, BadValue, small_text_file

    if not (path.exists() or path.is_symlink()):
        return {"version": CATALOG_VERSION, "images": []}
    try:  # values.read_user_file: a regular file, at most JSON_MAX, read from what was checked
        data = json.loads(small_text_file(path, "catalog", "a dtrain catalog (JSON)", JSON_MAX))
    except BadValue as e:
        raise PushError(f"cannot read catalog: {e}") from None
    except (OSError, ValueError) as e:
        raise PushError(f"cannot read catalog {path}: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("images", []), list):
        raise PushError(f"catalog {path} is not a dtrain catalog (no 'images' list)")
    return data


def record(catalog_path: Path, entry: dict[str, Any]) -> None:
    """Add or update one entry; the file is replaced atomically (tmp + rename) under a lock,
    so readers see the old or the new catalog and concurrent pushes lose no entry."""
    catalog_path = Path(catalog_path)
    catalog_path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = catalog_path.with_name(catalog_path.name + ".lock")
    try:  # neither truncated nor opened through a link planted at its name (a cloned project's build/)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise PushError(f"--catalog {catalog_path}: cannot open its lock {lock_path}: {e.strerror or e} "
                        "(a symbolic link there is refused: remove it)") from None
    with os.fdopen(fd, "r+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = merge_entry(read_catalog(catalog_path), entry)
        fd, tmp = tempfile.mkstemp(dir=catalog_path.parent, prefix=f".{catalog_path.name}.")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=2, sort_keys=False)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, catalog_path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


# ---------------------------------------------------------------- ECR


def aws_session(profile: str | None = None, region: str | None = None):
    """A boto3 session; botocore itself reads AWS_ENDPOINT_URL, profiles and credentials."""
    import boto3
    from botocore.exceptions import BotoCoreError

    try:
        return boto3.Session(profile_name=profile, region_name=region)
    except BotoCoreError as e:
        raise PushError(aws_error_message(e)) from None


def ecr_ensure_repository(client, name: str, *, scan_on_push: bool = True, immutable: bool = False,
                          lifecycle_policy: str | None = None, account: str | None = None,
                          out: Callable[[str], None] = print) -> None:
    """Create the repository if missing; never weaken an existing one (immutability and
    scan-on-push are switched on when asked, never off); put the lifecycle policy if given."""
    from botocore.exceptions import BotoCoreError, ClientError

    reg = {"registryId": account} if account else {}
    try:
        try:
            repo = client.describe_repositories(repositoryNames=[name], **reg)["repositories"][0]
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "RepositoryNotFoundException":
                raise
            repo = None
        if repo is None:
            with contextlib.suppress(client.exceptions.RepositoryAlreadyExistsException):
                client.create_repository(
                    repositoryName=name,
                    imageTagMutability="IMMUTABLE" if immutable else "MUTABLE",
                    imageScanningConfiguration={"scanOnPush": scan_on_push}, **reg)
                out(f"created ECR repository {name} (scan on push: {'on' if scan_on_push else 'off'}, "
                    f"tags: {'immutable' if immutable else 'mutable'})")
        else:
            if immutable and repo.get("imageTagMutability") != "IMMUTABLE":
                client.put_image_tag_mutability(repositoryName=name, imageTagMutability="IMMUTABLE", **reg)
                out(f"ECR repository {name}: tags made immutable")
            if scan_on_push and not repo.get("imageScanningConfiguration", {}).get("scanOnPush"):
                client.put_image_scanning_configuration(
                    repositoryName=name, imageScanningConfiguration={"scanOnPush": True}, **reg)
                out(f"ECR repository {name}: scan on push switched on")
        if lifecycle_policy is not None:
            client.put_lifecycle_policy(repositoryName=name, lifecyclePolicyText=lifecycle_policy, **reg)
            out(f"ECR repository {name}: lifecycle policy set")
    except (BotoCoreError, ClientError) as e:
        raise PushError(aws_error_message(e, name)) from None


def ecr_login_target(client, account: str | None = None) -> EcrTarget:
    """Get an authorization token and decode it into (registry, 'AWS', password)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        resp = client.get_authorization_token(**({"registryIds": [account]} if account else {}))
    except (BotoCoreError, ClientError) as e:
        raise PushError(aws_error_message(e)) from None
    data = resp["authorizationData"][0]
    token = _secret(data["authorizationToken"])
    try:
        user, password = ecr.decode_token(token)
    except ValueError as e:
        raise PushError(str(e)) from None
    _secret(password)
    registry = registry_host(data["proxyEndpoint"])
    return EcrTarget(registry=registry, user=user, password=password,
                     account=registry.split(".", 1)[0], region=client.meta.region_name or "")


def read_lifecycle_policy(path: str | Path | None) -> str | None:
    """The policy file's text, checked to be JSON; None when no file is given."""
    if path is None:
        return None
    from dtrain.values import JSON_MAX, BadValue, small_text_file

    try:  # opened, then checked on its descriptor, then read: what is sent is what was checked
        text = small_text_file(path, "lifecycle policy", "an ECR lifecycle policy (JSON)", JSON_MAX)
        json.loads(text)
    except BadValue as e:
        raise PushError(f"cannot read lifecycle policy: {e}") from None
    except ValueError as e:
        raise PushError(f"lifecycle policy {path} is not valid JSON: {e}") from None
    return text


def ecr_prepare(session, repo_names: str | Sequence[str], *, scan_on_push: bool = True,
                immutable: bool = False, lifecycle_policy: str | None = None,
                account: str | None = None, out: Callable[[str], None] = print) -> EcrTarget:
    """Ensure each repository exists as asked, then return the registry and its credentials."""
    from botocore.exceptions import BotoCoreError

    try:
        client = session.client("ecr")
    except BotoCoreError as e:
        raise PushError(aws_error_message(e)) from None
    for name in [repo_names] if isinstance(repo_names, str) else repo_names:
        ecr_ensure_repository(client, name, scan_on_push=scan_on_push, immutable=immutable,
                              lifecycle_policy=lifecycle_policy, account=account, out=out)
    return ecr_login_target(client, account)


# ---------------------------------------------------------------- orchestration


def summary_table(results: Sequence[PushResult]) -> str:
    rows = [("IMAGE", "TAG", "REMOTE", "DIGEST", "SECONDS")]
    for r in results:
        e = r.entry
        rows.append((e["image"], e["tag"], r.remote, r.digest[:19], f"{r.seconds:.1f}"))
    return table.text(rows)


def push(images: Sequence[ImageLike], target: Target, *, prefix: str = REPO_PREFIX,
         catalog_path: Path = CATALOG, login: bool = True, soci=None,
         out: Callable[[str], None] = print) -> list[PushResult]:
    """Push each image to `target`, verify it, record it; print a summary table.
    Every image is checked to be built before anything is pushed. An image whose push or
    verification fails raises PushError; images pushed before it stay recorded.
    soci (images/soci.py Setup, `--soci`): then a SOCI index is built and pushed beside each."""
    if not images:
        raise PushError("no images to push")
    built = require_built(images)
    remotes = [remote_ref(target.registry, prefix, img.family, img.tag) for img in images]
    with own_docker_config() if login and target.user else contextlib.nullcontext():
        if login:
            docker_login(target)
        results = []
        for img, remote in zip(images, remotes):
            local = local_ref(img)
            out(f"pushing {local} -> {remote}")
            start = time.monotonic()
            digest = push_and_verify(local, remote, out)
            info = built[local]
            entry = catalog_entry(img, remote, digest, info["Id"],
                                  (info.get("Config") or {}).get("Labels"), utc_now())
            record(catalog_path, entry)
            results.append(PushResult(local, remote, digest, time.monotonic() - start, entry))
            out(f"verified {remote}@{digest[:19]}")
        if soci is not None:
            from dtrain.images import soci as lazy

            lazy.build_indexes(soci, [r.remote for r in results], target.user, target.password, out)
    out("")
    out(summary_table(results))
    out(f"catalog: {catalog_path}")
    return results


def push_registry(images: Sequence[ImageLike], registry: str, *, user: str | None = None,
                  password: str | None = None, prefix: str = REPO_PREFIX,
                  catalog_path: Path = CATALOG, soci=None,
                  out: Callable[[str], None] = print) -> list[PushResult]:
    """`dtrain push --registry HOST[:PORT]`: any Docker v2 registry. The password comes
    from the argument or $DTRAIN_REGISTRY_PASSWORD. soci: see push(); the registry must
    speak TLS, checked first."""
    if password is None and user:
        password = os.environ.get(PASSWORD_ENV) or None
    target = Target(registry_host(registry), user, password)
    if soci is not None:
        from dtrain.images import soci as lazy

        lazy.require_tls(target.registry, lazy.tls_state(target.registry))
    return push(images, target, prefix=prefix, catalog_path=catalog_path, soci=soci, out=out)


def push_ecr(images: Sequence[ImageLike], *, profile: str | None = None,
             region: str | None = None, account: str | None = None,
             prefix: str = REPO_PREFIX, immutable: bool = False,
             lifecycle_policy: str | Path | None = None, scan_on_push: bool = True,
             catalog_path: Path = CATALOG, soci=None,
             out: Callable[[str], None] = print) -> list[PushResult]:
    """`dtrain push --ecr`: ensure the repositories, log in with a fresh token, push (soci:
    see push(); ECR has TLS and the referrers API)."""
    if not images:
        raise PushError("no images to push")
    policy = read_lifecycle_policy(lifecycle_policy)
    names = sorted({repo_name(prefix, img.family) for img in images})
    require_built(images)  # fail before touching AWS
    session = aws_session(profile, region)
    target = ecr_prepare(session, names, scan_on_push=scan_on_push, immutable=immutable,
                         lifecycle_policy=policy, account=account, out=out)
    out(f"logging in to {target.registry}")
    return push(images, target, prefix=prefix, catalog_path=catalog_path, soci=soci, out=out)


def select_images(image: str | None = None) -> tuple[list[ImageLike], list[str]]:
    """--image value -> (images to push, notes). None: every spec image that is built;
    'FAMILY': that family's spec images that are built; 'FAMILY:TAG': exactly that one
    (it must be built, any tag). Unbuilt images are skipped with a note unless named."""
    from dtrain.images.spec import SpecError, load_all

    if image and ":" in image:
        family, _, tag = image.partition(":")
        return [LocalImage(family, tag)], []
    try:
        specs = load_all([image] if image else None)
    except SpecError as e:
        raise PushError(str(e)) from None
    chosen, notes = [], []
    for img in specs:
        if inspect_image(local_ref(img)) is None:
            notes.append(f"skipping {local_ref(img)}: not built "
                         f"(`{BUILD_HINT.format(family=img.family, tag=img.tag)}`)")
        else:
            chosen.append(img)
    if not chosen:
        raise PushError("no image is built yet:\n  " + "\n  ".join(n[9:] for n in notes))
    return chosen, notes


def password_from_flag(value: str | None, read_stdin: Callable[[], str] | None = None) -> str | None:
    """`--password`: '-' reads the first line of stdin; None leaves it to $DTRAIN_REGISTRY_PASSWORD.
    Any other value is refused: argv shows in `ps` and shell history (the value is never echoed)."""
    if value is None:
        return None
    if value == "-":
        return (read_stdin or read_password_stdin)()
    raise PushError(f"--password takes no value on the command line (other users see argv in ps, and "
                    f"it stays in shell history): pass --password - and the password on stdin, or set "
                    f"${PASSWORD_ENV}")


def read_password_stdin() -> str:
    """For `--password -`: the first line of stdin, without its newline."""
    return sys.stdin.readline().rstrip("\r\n")


__all__ = [
    "PushError", "Target", "EcrTarget", "LocalImage", "PushResult", "CATALOG", "PASSWORD_ENV",
    "PushProgress", "push_event", "push_summary",
    "remote_ref", "repo_name", "local_ref", "parse_push_digest", "catalog_entry", "merge_entry",
    "docker_error_message", "aws_error_message", "versions_from_labels", "redact",
    "require_built", "docker_login", "own_docker_config", "own_config_json", "user_docker_config_dir",
    "push_and_verify", "refs_made_by_push", "verify_digest", "record",
    "read_catalog", "aws_session", "ecr_prepare", "ecr_ensure_repository", "ecr_login_target",
    "read_lifecycle_policy", "push", "push_registry", "push_ecr", "select_images",
    "summary_table", "read_password_stdin", "password_from_flag",
]
