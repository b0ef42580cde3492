"""Pull an image on many nodes at once, only where needed, with progress.

The registry's manifest digest is resolved once here (one HEAD request); every node then runs
launch/node/pull.sh, which pulls nothing when it already holds that digest and otherwise
reports `progress DL TOTAL UNPACKED` lines. The parsers and the renderer are pure (time is
passed in); `resolve_digest` (HTTP) and `pull_on_nodes` (ssh) are the side effects.
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from dtrain import contract
from dtrain.launch.errors import LaunchError
from dtrain.launch.remote.hosts import Node
from dtrain.launch.jobs.login import Login
from dtrain.launch.remote.fanout import host_lines
from dtrain.launch.remote.transport import SshTransport

PULL_SH = Path(__file__).resolve().parents[1] / "node" / "pull.sh"  # launch/node/pull.sh
POLICIES = ("always", "missing")

# Everything a tag can point to: OCI index, Docker manifest list, OCI and Docker v2 manifests.
# The digest the registry answers with is the one the engine records in RepoDigests.
MANIFEST_ACCEPT = ", ".join([
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
])
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


# --- image references ------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageRef:
    registry: str  # host[:port]
    repository: str
    reference: str  # tag or sha256:... digest


def parse_ref(image: str) -> ImageRef:
    """`[registry/]repo[:tag][@digest]` as the docker CLI reads it (docker.io when the first
    part has no dot, colon or is not localhost)."""
    from dtrain.reference import BadReference, check

    try:
        ref = check(image)  # the one parser (dtrain/reference.py): Docker's grammar and domain rule
    except BadReference as e:
        raise LaunchError(str(e)) from None
    registry, repo = ref.domain, ref.path
    if not registry:
        registry = "registry-1.docker.io"
        if "/" not in repo:
            repo = "library/" + repo
    return ImageRef(registry, repo, ref.digest or ref.tag or "latest")


# --- the registry's digest (launcher side, once) -----------------------------------------------


def registry_is_loopback(registry: str) -> bool:
    """The one rule (dtrain/reference.py is_loopback_registry)."""
    from dtrain.reference import is_loopback_registry

    return is_loopback_registry(registry)


def engine_marks_insecure(registry: str) -> bool:
    """This machine's Docker engine lists registry in its insecure-registries (daemon.json, as
    the simulated cluster's 10.213.0.1:5000 is); False where there is no engine to ask."""
    from dtrain.engine import EngineError, registry_trusted

    try:
        return registry_trusted(registry)
    except (EngineError, OSError):
        return False


def _marked(insecure: Collection[str] | None) -> Callable[[str], bool]:
    """registry -> whether a credential may go to it over plain http. insecure None: loopback
    or this machine's engine's insecure-registries (asked at most once per registry, and only
    when a credential would otherwise go over http); else exactly the registries given."""
    if insecure is not None:
        given = frozenset(insecure)
        return lambda registry: registry in given
    seen: dict[str, bool] = {}

    def marked(registry: str) -> bool:
        if registry not in seen:
            seen[registry] = registry_is_loopback(registry) or engine_marks_insecure(registry)
        return seen[registry]
    return marked


def may_send_credentials(url: str, marked: Callable[[str], bool]) -> bool:
    """A credential goes to url only over https, or over http to a registry marked insecure."""
    parts = urllib.parse.urlsplit(url)
    return parts.scheme == "https" or (parts.scheme == "http" and bool(parts.netloc) and marked(parts.netloc))


def _bearer_token(challenge: str, auth: str | None, timeout: float,
                  marked: Callable[[str], bool]) -> str | None:
    """An anonymous (or Basic-authenticated) token for a `Bearer realm=...` challenge; None
    when the realm is not https (nor on a registry marked insecure): nothing is sent to it."""
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    if "realm" not in params or not may_send_credentials(params["realm"], marked):
        return None
    query = "&".join(f"{k}={urllib.request.quote(v)}" for k, v in params.items() if k in ("service", "scope"))
    req = urllib.request.Request(f"{params['realm']}?{query}")
    if auth:
        req.add_unredirected_header("Authorization", auth)  # never carried to a redirect's target
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = json.load(r)
    return body.get("token") or body.get("access_token")


@dataclass(frozen=True)
class RegistryAnswer:
    """What the registry said of an image: its manifest digest (None: not known), and whether
    it said it has no such manifest (HTTP 404: a misspelt name or tag, or not pushed)."""

    digest: str | None
    absent: bool = False


def resolve_digest(image: str, *, user: str | None = None, password: str | None = None,
                   timeout: float = 10.0, insecure: Collection[str] | None = None) -> str | None:
    """The registry's manifest digest for image (HEAD /v2/REPO/manifests/TAG), or None when it
    cannot be had (no answer, auth it cannot do, no such image): the nodes then decide by
    themselves. ask_registry: the same request, and whether the registry said it has no such image."""
    return ask_registry(image, user=user, password=password, timeout=timeout, insecure=insecure).digest


def ask_registry(image: str, *, user: str | None = None, password: str | None = None,
                 timeout: float = 10.0, insecure: Collection[str] | None = None) -> RegistryAnswer:
    """The registry's manifest digest for image (HEAD /v2/REPO/manifests/TAG), None where it
    cannot be had (no answer, auth it cannot do), absent where the registry answers 404.

    https first; plain http where https cannot connect (insecure registries as on the
    simulated cluster). Bearer challenges (Docker Hub) get an anonymous token; user/password
    (an ECR token) go as Basic. No credential (Basic, or a token) ever goes over plain http,
    to the registry or to a token realm, unless that registry is marked insecure: insecure
    None means loopback or this machine's engine's insecure-registries (as docker does), a
    collection means exactly those host[:port] names. Unauthenticated requests may use http."""
    ref = parse_ref(image)
    if _DIGEST_RE.match(ref.reference):
        return RegistryAnswer(ref.reference)
    marked = _marked(insecure)
    basic = ("Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()) if user else None
    for scheme in ("https", "http"):
        url = f"{scheme}://{ref.registry}/v2/{ref.repository}/manifests/{ref.reference}"
        def trusted(url: str = url) -> bool:  # https, or http to a marked registry (asked lazily)
            return may_send_credentials(url, marked)
        auth = basic if basic and trusted() else None
        for _ in range(2):  # once plain, once with the token a 401 asked for
            req = urllib.request.Request(url, method="HEAD", headers={"Accept": MANIFEST_ACCEPT})
            if auth:
                req.add_unredirected_header("Authorization", auth)  # never carried to a redirect's target
            try:
                with urllib.request.urlopen(req, timeout=timeout) as r:
                    digest = r.headers.get("Docker-Content-Digest", "")
                    return RegistryAnswer(digest if _DIGEST_RE.match(digest) else None)
            except urllib.error.HTTPError as e:
                if e.code == 404:  # MANIFEST_UNKNOWN / NAME_UNKNOWN (a HEAD answer has no body)
                    return RegistryAnswer(None, absent=True)
                challenge = e.headers.get("WWW-Authenticate", "")
                if e.code != 401 or not challenge.lower().startswith("bearer") or not trusted():
                    return RegistryAnswer(None)  # over plain http to an unmarked registry: no token is sent
                try:
                    token = _bearer_token(challenge, basic, timeout, marked)
                except (OSError, ValueError):
                    return RegistryAnswer(None)
                if not token:
                    return RegistryAnswer(None)
                auth = f"Bearer {token}"
            except (urllib.error.URLError, ssl.SSLError, OSError):
                break  # try the next scheme
    return RegistryAnswer(None)


# --- pull.sh's lines -------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    kind: str  # present | pulling | progress | storage | lazy | pulled
    image_id: str = ""
    downloaded: int = 0
    total: int = 0
    unpacked: int = 0
    driver: str = ""  # storage: Docker's storage driver (soci: the node loads images lazily)
    layers: int = 0  # lazy: layers the pull mounted lazily


def parse_line(line: str) -> Event | None:
    """One stdout line of pull.sh as an Event; None for anything else (ssh banners, noise)."""
    parts = line.split()
    if not parts:
        return None
    kind, args = parts[0], parts[1:]
    if kind in ("present", "pulled") and len(args) == 1:
        return Event(kind, image_id=args[0])
    if kind == "pulling" and not args:
        return Event(kind)
    if kind == "storage" and len(args) == 1:
        return Event(kind, driver=args[0])
    if kind == "lazy" and len(args) == 1 and args[0].isdigit():
        return Event(kind, layers=int(args[0]))
    if kind == "progress" and len(args) in (2, 3) and all(a.isdigit() for a in args):
        nums = [int(a) for a in args] + [0]
        return Event(kind, downloaded=nums[0], total=nums[1], unpacked=nums[2])
    return None


@dataclass
class NodeProgress:
    """What one node has done so far; times are time.monotonic() values passed in."""

    host: str
    state: str = "waiting"  # waiting | present | pulling | pulled | failed
    downloaded: int = 0
    total: int = 0
    unpacked: int = 0
    started: float | None = None
    ended: float | None = None
    error: str = ""
    image_id: str = ""
    driver: str = ""  # Docker's storage driver, where the node pulled (soci: lazy-loading node)
    lazy_layers: int | None = None  # a lazy-loading node: layers mounted lazily (0: a full pull)

    @property
    def lazy(self) -> bool:
        """The image came lazily: a SOCI node mounted its layers instead of pulling them."""
        return bool(self.lazy_layers)

    def apply(self, ev: Event, now: float) -> None:
        if self.started is None:
            self.started = now
        if ev.kind == "storage":
            self.driver = ev.driver
        elif ev.kind == "lazy":
            self.lazy_layers = ev.layers
        elif ev.kind == "progress":
            self.state = "pulling"
            # the total grows as the engine learns each layer's size; never let it shrink
            self.downloaded, self.total = ev.downloaded, max(self.total, ev.total, ev.downloaded)
            self.unpacked = ev.unpacked
        elif ev.kind == "pulling":
            self.state = "pulling"
        else:
            self.state, self.image_id, self.ended = ev.kind, ev.image_id, now
            if ev.kind == "pulled":
                self.downloaded = self.unpacked = self.total

    def fail(self, error: str, now: float) -> None:
        self.state, self.error, self.ended = "failed", error, now

    def seconds(self, now: float) -> float:
        if self.started is None:
            return 0.0
        return (self.ended if self.ended is not None else now) - self.started

    def rate(self, now: float) -> float:
        """Bytes per second downloaded, over the node's whole pull."""
        s = self.seconds(now)
        return self.downloaded / s if s > 0 else 0.0


def _mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def format_node(p: NodeProgress, now: float) -> str:
    """One line for one node: `node-1  pulling  120/505 MiB  40 MiB/s  unpacked 12%  3.1 s`."""
    s = f"{p.seconds(now):.1f} s"
    if p.state == "waiting":
        return f"{p.host}  connecting"
    if p.state == "present":
        return f"{p.host}  up to date, nothing pulled ({s})"
    if p.state == "failed":
        return f"{p.host}  FAILED: {p.error}"
    if p.state == "pulling" and not p.total and not p.downloaded:
        return f"{p.host}  pulling (layer sizes not known yet)  {s}"
    if p.state == "pulled" and p.lazy:
        return f"{p.host}  pulled lazily (SOCI): {p.lazy_layers} layer(s) mounted, read on first use  {s}"
    pct = f"  unpacked {100 * p.unpacked // p.total}%" if p.total else ""
    if p.state == "pulled" and p.driver == "soci":  # a lazy-loading node that found no index
        pct += "  (full pull on a lazy-loading node: no SOCI index for this image; `dtrain push` makes one)"
    head = "pulled " if p.state == "pulled" else "pulling"
    total = _mib(p.total) if p.total else "?"
    return f"{p.host}  {head} {_mib(p.downloaded)} / {total}  {_mib(p.rate(now))}/s{pct}  {s}"


def why_not_lazy(full: Sequence[NodeProgress]) -> str:
    """Why nodes pulled in full (issue 52: lazy is the default where it helps): a lazy-loading
    node (storage driver soci) found no SOCI index; a node with another driver has no snapshotter."""
    indexless = [p.host for p in full if p.driver == "soci"]
    classic = [p for p in full if p.driver and p.driver != "soci"]
    if indexless:
        return "; in full, not lazily: no SOCI index for this image (`dtrain push` makes one where it can)"
    if classic:
        return (f"; in full, not lazily: no SOCI snapshotter on the nodes (storage driver {classic[0].driver}; "
                "`dtrain cluster up` / `dtrain nodes up` give it unless --no-lazy)")
    return ""


def summary(progress: Sequence[NodeProgress], image: str, now: float) -> str:
    """The closing line: what was pulled where, and the slowest node."""
    pulled = [p for p in progress if p.state == "pulled"]
    present = [p for p in progress if p.state == "present"]
    failed = [p for p in progress if p.state == "failed"]
    lazy = [p for p in pulled if p.lazy]
    parts = [f"{image}: pulled on {len(pulled)}" + (f" ({len(lazy)} lazily)" if lazy else "")
             + f", already on {len(present)}"]
    if failed:
        parts.append(f"failed on {len(failed)} ({', '.join(p.host for p in failed)})")
    text = ", ".join(parts) + f" of {len(progress)} nodes"
    full = [p for p in pulled if not p.lazy]
    if full:
        slow = max(full, key=lambda p: p.seconds(now))
        text += (f"; slowest {slow.host}: {_mib(slow.total)} in {slow.seconds(now):.1f} s "
                 f"({_mib(slow.rate(now))}/s)") + why_not_lazy(full)
    elif lazy:  # layers mounted, not downloaded: no size nor rate to speak of
        slow = max(lazy, key=lambda p: p.seconds(now))
        text += f"; slowest {slow.host}: mounted lazily in {slow.seconds(now):.1f} s"
    return text


class Board:
    """Renders every node's progress: on a terminal one line per node, redrawn in place (at
    most every `interval` s); otherwise plain lines, on a state change and every `every` s."""

    def __init__(self, hosts: Sequence[str], out: TextIO, *, tty: bool | None = None,
                 interval: float = 0.2, every: float = 5.0, show_present: bool = True) -> None:
        self.nodes = {h: NodeProgress(h) for h in hosts}
        self.show_present = show_present  # False: nodes that pull nothing only count in the summary
        self.out = out
        self.tty = out.isatty() if tty is None else tty
        self.interval, self.every = interval, every
        self._drawn = 0  # lines drawn last time (tty)
        self._last_draw = float("-inf")
        self._last_plain: dict[str, tuple[str, float]] = {}

    def feed(self, host: str, line: str, now: float) -> None:
        ev = parse_line(line)
        if ev is None:
            return
        node = self.nodes[host]
        before = node.state
        node.apply(ev, now)
        self._show(host, before != node.state, now)

    def fail(self, host: str, error: str, now: float) -> None:
        self.nodes[host].fail(error, now)
        self._show(host, True, now)

    def _show(self, host: str, changed: bool, now: float) -> None:
        if self.tty:
            if changed or now - self._last_draw >= self.interval:
                self.draw(now)
            return
        state, at = self._last_plain.get(host, ("", float("-inf")))
        node = self.nodes[host]
        if node.state == "present" and not self.show_present:
            return
        if changed or node.state != state or now - at >= self.every:
            self.out.write(format_node(node, now) + "\n")
            self.out.flush()
            self._last_plain[host] = (node.state, now)

    def draw(self, now: float) -> None:
        """Redraw every node's line in place (tty only)."""
        lines = [format_node(p, now) for p in self.nodes.values() if self.show_present or p.state != "present"]
        up = f"\x1b[{self._drawn}F" if self._drawn else ""
        self.out.write(up + "".join(f"\x1b[2K{ln}\n" for ln in lines))
        self.out.flush()
        self._drawn, self._last_draw = len(lines), now

    def finish(self, image: str, now: float) -> str:
        if self.tty:
            self.draw(now)
        text = summary(list(self.nodes.values()), image, now)
        self.out.write(text + "\n")
        self.out.flush()
        return text


# --- on the nodes ----------------------------------------------------------------------------


def pull_argv(image: str, policy: str, digest: str | None, login: Login | None = None) -> list[str]:
    """The command a node runs: pull.sh's text as bash -c's script, values as its arguments.
    login (ECR): the node logs in first (launch/node/host/login.sh), the password on stdin."""
    if policy not in POLICIES:
        raise LaunchError(f"--pull {policy}: use always or missing")
    script = "\n".join([contract.node_script("host/login.sh"), contract.node_script("host/holds.sh"),
                        PULL_SH.read_text()])
    return ["bash", "-c", script, "pull.sh", image, policy, digest or "", *(login.args if login else [])]


def pull_on_nodes(nodes: Sequence[Node], image: str, policy: str = "always", *,
                  ssh_opts: Sequence[str] = (), out: TextIO = sys.stderr, tty: bool | None = None,
                  digest: str | None = None, timeout: float = 1800, login: Login | None = None,
                  clock: Callable[[], float] = time.monotonic, ssh: SshTransport | None = None,
                  show_present: bool = True, held: Mapping[str, str] | None = None) -> list[NodeProgress]:
    """Bring image onto every node (policy always|missing) with progress on `out`; raises
    LaunchError naming every node that failed. digest: the registry's, when the caller has
    it (else resolved here, once). login: a registry login run first on each node (ECR:
    login.login_for), the password on its stdin. ssh: the caller's transport (a launch's, its
    connections kept open); else one of its own. show_present: a line for each node that
    already holds the image (else only the summary counts them). held: host -> image ID for the
    nodes the caller already knows hold it (a launch's first round asked them): counted as
    present, no session opened to them."""

    parse_ref(image)
    held = held or {}
    todo = [n for n in nodes if n.host not in held]
    password = login.password if login and login.registry else None
    if digest is None and policy == "always" and todo:
        digest = resolve_digest(image, user=login.user if password else None, password=password)
    argv = pull_argv(image, policy, digest, login if password else None)
    board = Board([n.host for n in nodes], out, tty=tty, show_present=show_present)
    for host, image_id in held.items():
        board.feed(host, f"present {image_id}", clock())
    stdin = (lambda n: login.stdin) if password is not None else None
    lock = threading.Lock()  # one board, fed from every node's reader thread

    def feed(n: Node, line: str) -> None:
        with lock:
            board.feed(n.host, line, clock())

    results = []
    if todo:
        transport = SshTransport(todo, ssh_opts) if ssh is None else ssh
        try:
            results = transport.run(todo, lambda n: argv, timeout=timeout, on_line=feed, stdin=stdin)
        finally:
            if ssh is None:
                transport.close()
    for r in results:
        if not r.ok:
            board.fail(r.host, r.error or "failed", clock())
    board.finish(image, clock())
    failed = [p for p in board.nodes.values() if p.state == "failed"]
    if failed:
        raise LaunchError(f"pulling {image} failed on {len(failed)} of {len(nodes)} nodes:\n"
                          + host_lines([(p.host, p.error) for p in failed]))
    return list(board.nodes.values())

