"""Pulling an image onto nodes: pull.sh's lines, the progress board, and `invoke pull` on the
simulated cluster (real dockerd per node, real registry, real ssh)."""

from __future__ import annotations

import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import pull as pl
from dtrain.launch.jobs.job import Job
from test_launch import containers_left, nodes_of, on_node, spec

ROOT = Path(__file__).resolve().parent.parent


# --- parsers ---------------------------------------------------------------------------------


def test_parse_line_events():
    assert pl.parse_line("present sha256:abc") == pl.Event("present", image_id="sha256:abc")
    assert pl.parse_line("pulling") == pl.Event("pulling")
    assert pl.parse_line("progress 10 100 4") == pl.Event("progress", downloaded=10, total=100, unpacked=4)
    assert pl.parse_line("progress 10 100") == pl.Event("progress", downloaded=10, total=100)
    assert pl.parse_line("pulled sha256:def") == pl.Event("pulled", image_id="sha256:def")


@pytest.mark.parametrize("line", ["", "progress", "progress 1", "progress a b", "progress 1 2 3 4",
                                  "pulled", "present a b", "pulling now", "Warning: Permanently added"])
def test_parse_line_ignores_noise(line):
    assert pl.parse_line(line) is None


@pytest.mark.parametrize("image,want", [
    ("10.213.0.1:5000/dtrain/pytorch-ddp:2.13", pl.ImageRef("10.213.0.1:5000", "dtrain/pytorch-ddp", "2.13")),
    ("123.dkr.ecr.us-east-1.amazonaws.com/dtrain/x", pl.ImageRef("123.dkr.ecr.us-east-1.amazonaws.com", "dtrain/x", "latest")),
    ("ubuntu:22.04", pl.ImageRef("registry-1.docker.io", "library/ubuntu", "22.04")),
    ("localhost/a/b:1", pl.ImageRef("localhost", "a/b", "1")),
    ("r.io/a@sha256:" + "0" * 64, pl.ImageRef("r.io", "a", "sha256:" + "0" * 64)),
])
def test_parse_ref(image, want):
    assert pl.parse_ref(image) == want


@pytest.mark.parametrize("image", ["localhost:5000/a", "a/b/c:x", "ubuntu"])
def test_parse_ref_agrees_with_the_image_flag(image):
    """One parser: what `--image` accepts, the pull reads with the same domain and path."""
    from dtrain.reference import check

    ref = check(image)
    got = pl.parse_ref(image)
    assert (got.registry if ref.domain else "") == ref.domain and got.repository.endswith(ref.path)


@pytest.mark.parametrize("image", ["r.io/", "UPPER/case:1", "r.io/A B:1", "r.io/$(id):1"])
def test_parse_ref_rejects(image):
    with pytest.raises(LaunchError, match="--image"):
        pl.parse_ref(image)


def test_resolve_digest_of_a_digest_reference_asks_nothing():
    d = "sha256:" + "a" * 64
    assert pl.resolve_digest(f"nowhere.invalid/x@{d}") == d


# --- credentials never over plain http -----------------------------------------------------------

FAKE_DIGEST = "sha256:" + "ab" * 32


class FakeRegistry:
    """A registry on 127.0.0.1 that offers only plain http and records every request's
    headers. mode: "open" (the digest to anyone), "token" (the digest to a request with
    the token realm hands out, else a Bearer challenge to realm), "redirect" (307 to redirect_to)."""

    def __init__(self, mode="open", realm=None, redirect_to=None):
        import http.server
        import threading

        self.requests: list[tuple[str, str, dict[str, str]]] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                fake.requests.append((self.command, self.path, dict(self.headers.items())))
                if self.path.startswith("/token"):
                    body = b'{"token": "tok-123"}'
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if mode == "redirect":
                    self.send_response(307)
                    self.send_header("Location", redirect_to + self.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if mode == "token" and self.headers.get("Authorization") != "Bearer tok-123":
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", f'Bearer realm="{realm}",service="fake",scope="x"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Docker-Content-Digest", FAKE_DIGEST)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_HEAD = do_GET = _answer

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def authorizations(self) -> list[str]:
        return [h["Authorization"] for _, _, h in self.requests if "Authorization" in h]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_registries():
    made: list[FakeRegistry] = []

    def make(**kw) -> FakeRegistry:
        made.append(FakeRegistry(**kw))
        return made[-1]
    yield make
    for f in made:
        f.close()


def test_no_credential_reaches_an_http_registry_not_marked_insecure(fake_registries):
    reg = fake_registries(mode="open")
    got = pl.resolve_digest(f"{reg.host}/dtrain/x:1", user="AWS", password="ecr-token-secret", insecure=())
    assert got == FAKE_DIGEST  # unauthenticated over http: fine
    assert reg.requests and reg.authorizations() == []
    # marked insecure (explicitly, or by default as loopback, as docker does): the credential goes
    assert pl.resolve_digest(f"{reg.host}/dtrain/x:1", user="AWS", password="ecr-token-secret",
                             insecure=(reg.host,)) == FAKE_DIGEST
    assert pl.resolve_digest(f"{reg.host}/dtrain/x:1", user="AWS", password="ecr-token-secret") == FAKE_DIGEST
    assert len(reg.authorizations()) == 2 and all(a.startswith("Basic ") for a in reg.authorizations())


def test_an_http_registry_that_asks_for_a_token_gets_none_unless_marked(fake_registries):
    realm = fake_registries(mode="open")
    reg = fake_registries(mode="token", realm=f"http://{realm.host}/token")
    image = f"{reg.host}/dtrain/x:1"
    assert pl.resolve_digest(image, user="AWS", password="ecr-token-secret", insecure=()) is None
    assert pl.resolve_digest(image, insecure=()) is None  # nor an anonymous token
    assert reg.authorizations() == [] and realm.requests == []
    # both marked: the Basic credential to the realm, its token to the registry
    assert pl.resolve_digest(image, user="AWS", password="ecr-token-secret",
                             insecure=(reg.host, realm.host)) == FAKE_DIGEST
    assert [a[:6] for a in reg.authorizations()] == ["Basic ", "Bearer"]
    assert [a[:6] for a in realm.authorizations()] == ["Basic "]


def test_a_token_realm_given_as_http_is_refused(fake_registries):
    realm = fake_registries(mode="open")
    reg = fake_registries(mode="token", realm=f"http://{realm.host}/token")
    # the registry is marked insecure, its realm is not: nothing is sent to the realm
    assert pl.resolve_digest(f"{reg.host}/dtrain/x:1", user="AWS", password="ecr-token-secret",
                             insecure=(reg.host,)) is None
    assert realm.requests == [] and [a[:6] for a in reg.authorizations()] == ["Basic "]
    for url in (f"http://{realm.host}/token", "ftp://x/token", "file:///etc/passwd"):
        assert not pl.may_send_credentials(url, lambda r: False), url
    assert pl.may_send_credentials("https://auth.docker.io/token", lambda r: False)
    assert pl.registry_is_loopback("127.0.0.1:5000") and pl.registry_is_loopback("localhost")
    assert not pl.registry_is_loopback("10.213.0.1:5000") and not pl.registry_is_loopback("127x.example.com")


def test_a_redirect_never_carries_the_credential(fake_registries):
    other = fake_registries(mode="open")
    reg = fake_registries(mode="redirect", redirect_to=f"http://{other.host}")
    got = pl.resolve_digest(f"{reg.host}/dtrain/x:1", user="AWS", password="ecr-token-secret", insecure=(reg.host,))
    assert got == FAKE_DIGEST
    assert [a[:6] for a in reg.authorizations()] == ["Basic "]  # marked: it may have it
    assert other.requests and other.authorizations() == []  # its redirect target may not


def test_pull_argv_passes_values_as_arguments():
    image = "r.io/a:1; touch /tmp/pwned"
    argv = pl.pull_argv(image, "always", None)
    assert argv[:2] == ["bash", "-c"] and argv[2].endswith(pl.PULL_SH.read_text())
    assert argv[3:] == ["pull.sh", image, "always", ""]
    with pytest.raises(LaunchError, match="--pull never"):
        pl.pull_argv("r.io/a:1", "never", None)


# --- progress and renderer -------------------------------------------------------------------


def test_node_progress_rate_and_total_never_shrinks():
    p = pl.NodeProgress("n1")
    p.apply(pl.Event("pulling"), 10.0)
    p.apply(pl.Event("progress", downloaded=50 * 2**20, total=200 * 2**20), 12.0)
    p.apply(pl.Event("progress", downloaded=60 * 2**20, total=100 * 2**20), 12.5)  # a layer not sized yet
    assert p.total == 200 * 2**20 and p.rate(12.5) == 60 * 2**20 / 2.5
    p.apply(pl.Event("pulled", image_id="sha256:x"), 14.0)
    assert (p.state, p.downloaded, p.seconds(99.0)) == ("pulled", 200 * 2**20, 4.0)


def test_plain_board_prints_state_changes_and_names_the_slowest():
    out = io.StringIO()
    b = pl.Board(["node-1", "node-2", "node-3"], out, tty=False, every=5.0)
    b.feed("node-1", "present sha256:1", 0.0)
    b.feed("node-2", "pulling", 0.0)
    b.feed("node-3", "pulling", 0.0)
    b.feed("node-2", "progress 104857600 209715200 0", 1.0)  # within 5 s of the last line: quiet
    b.feed("node-2", "progress 157286400 209715200 0", 6.0)
    b.feed("node-2", "Warning: noise", 6.5)
    b.feed("node-2", "pulled sha256:2", 8.0)
    b.feed("node-3", "progress 209715200 209715200 209715200", 9.0)
    b.feed("node-3", "pulled sha256:2", 10.0)
    text = b.finish("r/img:1", 10.0)
    lines = out.getvalue().splitlines()
    assert lines[0] == "node-1  up to date, nothing pulled (0.0 s)"
    assert "node-2  pulling 150 MiB / 200 MiB  25 MiB/s  unpacked 0%  6.0 s" in lines
    assert not any("100 MiB / 200" in ln for ln in lines)
    assert "node-2  pulled  200 MiB / 200 MiB  25 MiB/s  unpacked 100%  8.0 s" in lines
    assert "\x1b" not in out.getvalue()
    assert text == ("r/img:1: pulled on 2, already on 1 of 3 nodes; "
                    "slowest node-3: 200 MiB in 10.0 s (20 MiB/s)")
    assert lines[-1] == text


def test_tty_board_redraws_one_line_per_node_in_place():
    out = io.StringIO()
    b = pl.Board(["a", "b"], out, tty=True, interval=0.2)
    b.feed("a", "pulling", 0.0)  # state change: drawn
    b.feed("a", "progress 1048576 2097152 0", 0.1)  # within the interval: not drawn
    b.feed("a", "progress 2097152 2097152 0", 0.5)
    b.fail("b", "ssh could not connect", 0.6)
    b.finish("img", 1.0)
    frames = out.getvalue().split("\x1b[2F")
    assert len(frames) == 4  # first draw, then 3 redraws moving up 2 lines (the last one + summary)
    assert frames[-1].startswith("\x1b[2Ka  pulling 2 MiB / 2 MiB")
    assert "\x1b[2Kb  FAILED: ssh could not connect\n" in frames[-1]
    assert frames[-1].endswith("img: pulled on 0, already on 0, failed on 1 (b) of 2 nodes\n")
    assert "1 MiB / 2 MiB" not in out.getvalue()


def test_board_can_leave_nodes_that_pull_nothing_to_the_summary():
    out = io.StringIO()
    b = pl.Board(["a", "b"], out, tty=False, show_present=False)
    b.feed("a", "present sha256:1", 0.0)
    b.feed("b", "pulling", 0.0)
    b.feed("b", "pulled sha256:1", 2.0)
    b.finish("img", 2.0)
    lines = out.getvalue().splitlines()
    assert not any(ln.startswith("a ") for ln in lines), lines
    assert lines[0] == "b  pulling (layer sizes not known yet)  0.0 s"
    assert lines[-1].startswith("img: pulled on 1, already on 1 of 2 nodes; slowest b:")


def test_nodes_known_to_hold_the_image_get_no_session_and_no_digest_lookup():
    """held: a launch's first round found the image on them; these hosts cannot be reached and
    the registry does not resolve, so any ssh or digest request would fail the call."""
    out = io.StringIO()
    nodes = [pl.Node("a.invalid"), pl.Node("b.invalid")]
    got = pl.pull_on_nodes(nodes, "nowhere.invalid/x:1", "always", out=out, tty=False, show_present=False,
                           held={"a.invalid": "sha256:1", "b.invalid": "sha256:1"}, ssh_opts=("-o", "ConnectTimeout=1"))
    assert [p.state for p in got] == ["present", "present"]
    assert out.getvalue() == "nowhere.invalid/x:1: pulled on 0, already on 2 of 2 nodes\n"


# --- on the simulated cluster ----------------------------------------------------------------


def _sh(info, host, cmd):
    return subprocess.run(["ssh", "-F", info.ssh_config, "-o", "BatchMode=yes", host, cmd],
                          capture_output=True, text=True, timeout=120, check=True).stdout


def _manifest_requests(info, repo: str) -> int:
    log = Path(info.hostfile).parent / "registry" / "registry.log"
    return len(re.findall(rf'"(?:HEAD|GET) /v2/{re.escape(repo)}/manifests/', log.read_text()))


@pytest.mark.cluster
def test_pull_sh_is_shellcheck_clean(engine):
    subprocess.run(["shellcheck", str(pl.PULL_SH)], check=True)


@pytest.mark.cluster
def test_invoke_pull_shows_progress_then_pulls_nothing_on_warm_nodes(cluster, remote_images, tmp_path):
    image = remote_images["pytorch-ddp"]
    hosts = cluster.names[:2]
    for h in hosts:  # fresh nodes: no image, no layer
        _sh(cluster, h, "docker ps -aq | xargs -r docker rm -f >/dev/null; docker image prune -af >/dev/null")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(ln + "\n" for ln in Path(cluster.hostfile).read_text().splitlines()[:2]))
    argv = [sys.executable, "-m", "invoke", "pull", "--hostfile", str(hostfile), "--ssh-config",
            cluster.ssh_config, "--image", image]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    repo = image.split("/", 1)[1].rsplit(":", 1)[0]

    cold = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert cold.returncode == 0, cold.stderr + cold.stdout
    for addr in cluster.addresses[:2]:
        assert re.search(rf"^{re.escape(addr)}  pulling \d+ MiB / \d+ MiB  \d+ MiB/s", cold.stdout, re.M), cold.stdout
        assert re.search(rf"^{re.escape(addr)}  pulled  (\d+) MiB / \1 MiB", cold.stdout, re.M), cold.stdout
    assert re.search(r"pulled on 2, already on 0 of 2 nodes; slowest 10\.213\.0\.1[12]: \d+ MiB in", cold.stdout)

    before = _manifest_requests(cluster, repo)
    warm = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert warm.returncode == 0, warm.stderr + warm.stdout
    assert "pulled on 0, already on 2 of 2 nodes" in warm.stdout, warm.stdout
    assert _manifest_requests(cluster, repo) - before == 1  # the launcher's HEAD, nothing from the nodes


@pytest.mark.cluster
def test_a_launch_shows_the_pull_where_a_node_lacks_the_image(cluster, remote_images):
    image = remote_images["pytorch-ddp"]
    repo = image.split("/", 1)[1].rsplit(":", 1)[0]
    for h in cluster.names[1:3]:
        _sh(cluster, h, f"docker pull -q {shlex.quote(image)} >/dev/null")
    _sh(cluster, cluster.names[0], f"docker rmi -f {shlex.quote(image)} >/dev/null")
    said: list[str] = []
    job = Job(spec(cluster, image, ["python", "-c", "print('step 1')"], "t-pull"), nodes_of(cluster, 3),
              say=said.append)
    assert job.run() == 0, said
    first, others = cluster.addresses[0], cluster.addresses[1:]
    assert any(re.match(rf"\[launch\] pull {re.escape(first)}  pulling \d+ MiB / \d+ MiB", m) for m in said), said
    assert not any(m.startswith(f"[launch] pull {a} ") for a in others for m in said), said  # only the summary counts them
    assert any(re.match(rf"\[launch\] pull {re.escape(image)}: pulled on 1, already on 2 of 3 nodes; "
                        rf"slowest {re.escape(first)}: \d+ MiB in", m) for m in said), said

    before = _manifest_requests(cluster, repo)
    said.clear()
    job = Job(spec(cluster, image, ["python", "-c", "print('step 1')"], "t-pull"), nodes_of(cluster, 3),
              say=said.append)
    programs: list[str] = []  # the launch's sessions, by step (host programs) or name: no pull.sh here
    real_start = job.ssh.start

    def start(nodes, command, **kw):
        for n in nodes:
            argv = list(command(n))
            programs.append(argv[8] if argv[3] == "dtrain-node" else argv[3])
        return real_start(nodes, command, **kw)
    job.ssh.start = start  # type: ignore[method-assign]  # ssh.run starts its sessions through it too
    assert job.run() == 0, said
    # one session per node for the first round and the start step (prepare_up); nothing pulled
    assert programs.count("prepare_up") == 3 and "pull.sh" not in programs and "up" not in programs, programs
    assert f"[launch] pull {image}: pulled on 0, already on 3 of 3 nodes" in said, said
    assert _manifest_requests(cluster, repo) - before == 1  # --pull always, warm: the launcher's one HEAD


@pytest.mark.cluster
def test_a_launch_of_an_image_the_registry_lacks_says_so_in_one_line(cluster, tmp_path):
    """A misspelt tag: the registry's 404 to the launcher's one HEAD request is one warning; no
    node pulls; the start step's error names every node on one line; the job's record keeps the
    CLI's exit code; nothing is left (review of issue 25: 4 lines per node, the same engine
    message each time)."""
    image = f"{cluster.registry}/dtrain/does-not-exist:1"
    r = subprocess.run([sys.executable, "-m", "invoke", "launch", "--hostfile", cluster.hostfile, "--ssh-config",
                        cluster.ssh_config, "--image", image, "--name", "t-absent", "--", "true"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "DTRAIN_HOME": str(tmp_path)})
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "Traceback" not in out, out
    assert (f"[launch] warning: the registry {cluster.registry} has no dtrain/does-not-exist:1 (HTTP 404): "
            "check --image's name and tag") in r.stdout, out
    assert "[launch] pull " not in out, out  # no node tried
    hosts = ", ".join(n.address for n in cluster.nodes)
    assert re.search(rf"error: starting containers failed on 3 of 3 hosts:\n  {re.escape(hosts)}: exit 1: image "
                     rf"{re.escape(image)} is not on this node and could not be pulled: .*manifest unknown", r.stderr), out
    assert len(out.splitlines()) == 3, out
    # `dtrain status` shows the exit code the shell saw (it said 1 while the CLI exited 2)
    st = subprocess.run([sys.executable, "-m", "invoke", "status"], capture_output=True, text=True, cwd=ROOT,
                        timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT), "DTRAIN_HOME": str(tmp_path)})
    row = next(line.split() for line in st.stdout.splitlines() if line.startswith("t-absent "))
    assert row[1:4] == ["failed", "to", "launch"] and row[-1] == str(r.returncode), st.stdout
    assert containers_left(cluster, "t-absent") == []
    for i in range(1, len(cluster.nodes) + 1):
        left = on_node(cluster, i, "ls ~/.dtrain/nodes/$(hostname)/jobs/ /dev/shm | grep -c t-absent", check=False)
        assert left.stdout.strip() == "0"


@pytest.mark.cluster
def test_invoke_pull_names_the_node_and_image_that_failed(cluster, tmp_path):
    image = f"{cluster.registry}/dtrain/does-not-exist:1"
    r = subprocess.run([sys.executable, "-m", "invoke", "pull", "--hostfile", cluster.hostfile, "--ssh-config",
                        cluster.ssh_config, "--image", image, "--pull", "missing"],
                       capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                       timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"pulling {image} failed on 3 of 3 nodes" in r.stderr
    # every node failed the same way: one line names them all (fanout.host_lines)
    assert re.search(rf"\n  10\.213\.0\.11, 10\.213\.0\.12, 10\.213\.0\.13: exit 1: docker pull {re.escape(image)} "
                     rf"failed .*not found", r.stderr), r.stderr
    assert r.stderr.count("not found") == 1, r.stderr
    assert "Traceback" not in r.stderr


# --- the registry's digest, from a real registry (docker-registry on a loopback port) ------------


@pytest.fixture
def registry(tmp_path):
    """A private docker-registry on 127.0.0.1 (not the cluster's): base URL."""
    import socket
    import time as _time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "config.yml").write_text(
        f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n")
    proc = subprocess.Popen(["docker-registry", "serve", str(tmp_path / "config.yml")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = _time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert proc.poll() is None and _time.monotonic() < deadline, "docker-registry did not start"
                _time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


def _put(url: str, body: bytes, ctype: str, method: str = "PUT") -> None:
    import urllib.request

    req = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": ctype})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status in (201, 202), r.status


def _push_blob(base: str, repo: str, data: bytes) -> str:
    import hashlib
    import urllib.request

    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    req = urllib.request.Request(f"http://{base}/v2/{repo}/blobs/uploads/", method="POST", data=b"")
    with urllib.request.urlopen(req, timeout=10) as r:
        loc = r.headers["Location"]
    loc = loc if loc.startswith("http") else f"http://{base}{loc}"
    _put(f"{loc}{'&' if '?' in loc else '?'}digest={digest}", data, "application/octet-stream")
    return digest


def test_resolve_digest_matches_what_the_registry_stores_for_each_manifest_kind(registry):
    import hashlib
    import json

    repo = "dtrain/t"
    config = _push_blob(registry, repo, b'{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}')
    layer = _push_blob(registry, repo, b"layer")

    def manifest(media: str, cfg_media: str, layer_media: str) -> bytes:
        return json.dumps({"schemaVersion": 2, "mediaType": media,
                           "config": {"mediaType": cfg_media, "size": 78, "digest": config},
                           "layers": [{"mediaType": layer_media, "size": 5, "digest": layer}]}).encode()

    docker_v2 = manifest("application/vnd.docker.distribution.manifest.v2+json",
                         "application/vnd.docker.container.image.v1+json",
                         "application/vnd.docker.image.rootfs.diff.tar.gzip")
    oci = manifest("application/vnd.oci.image.manifest.v1+json", "application/vnd.oci.image.config.v1+json",
                   "application/vnd.oci.image.layer.v1.tar+gzip")
    want = {}
    for tag, body, media in (("v2", docker_v2, "application/vnd.docker.distribution.manifest.v2+json"),
                             ("oci", oci, "application/vnd.oci.image.manifest.v1+json")):
        _put(f"http://{registry}/v2/{repo}/manifests/{tag}", body, media)
        want[tag] = "sha256:" + hashlib.sha256(body).hexdigest()
    for tag, media in (("list", "application/vnd.docker.distribution.manifest.list.v2+json"),
                       ("index", "application/vnd.oci.image.index.v1+json")):
        child = "application/vnd.docker.distribution.manifest.v2+json" if tag == "list" else \
            "application/vnd.oci.image.manifest.v1+json"
        body = json.dumps({"schemaVersion": 2, "mediaType": media, "manifests": [
            {"mediaType": child, "size": len(docker_v2 if tag == "list" else oci),
             "digest": want["v2" if tag == "list" else "oci"], "platform": {"architecture": "amd64", "os": "linux"}}]}
        ).encode()
        _put(f"http://{registry}/v2/{repo}/manifests/{tag}", body, media)
        want[tag] = "sha256:" + hashlib.sha256(body).hexdigest()

    for tag, digest in want.items():  # the top-level digest, never a converted or child one
        assert pl.resolve_digest(f"{registry}/{repo}:{tag}") == digest, tag
    assert pl.resolve_digest(f"{registry}/{repo}:absent") is None
    assert pl.resolve_digest("127.0.0.1:1/x/y:1", timeout=2) is None  # nothing listening
    # what the launch tells apart (review of issue 25: a misspelt image was a pull failure per node)
    assert pl.ask_registry(f"{registry}/{repo}:absent") == pl.RegistryAnswer(None, absent=True)
    assert pl.ask_registry(f"{registry}/dtrain/nosuchrepo:1") == pl.RegistryAnswer(None, absent=True)
    assert pl.ask_registry(f"{registry}/{repo}:v2") == pl.RegistryAnswer(want["v2"])
    assert pl.ask_registry("127.0.0.1:1/x/y:1", timeout=2) == pl.RegistryAnswer(None)  # no answer: not absent


def test_the_launch_says_in_one_line_that_the_registry_has_no_such_image():
    from dtrain.launch.jobs.job import absent_line

    line = absent_line("10.213.0.1:5000/dtrain/horovod-tensorflw:2.15.1-hvd0.28.1-cpu-py311-debian12")
    assert line.startswith("the registry 10.213.0.1:5000 has no dtrain/horovod-tensorflw:2.15.1-hvd0.28.1-cpu-py311-"
                           "debian12 (HTTP 404): check --image's name and tag") and "\n" not in line


def test_pull_argv_logs_in_first_into_a_config_of_its_own(tmp_path):
    """With a login, pull.sh reads the password line from stdin, runs `docker login` with it on
    stdin into a Docker config directory of its own, pulls with that config, and removes it."""
    import os
    import subprocess

    from dtrain.launch.jobs.login import Login

    log = tmp_path / "docker.log"
    fake = tmp_path / "docker"
    fake.write_text('#!/bin/bash\n'
                    'case $1 in\n'
                    '  login) echo "login $* cfg=$DOCKER_CONFIG pw=$(cat)" >> "$LOG" ;;\n'
                    '  image) [ -f "$LOG.pulled" ] && echo x || exit 1 ;;\n'
                    '  pull) echo "pull $* cfg=$DOCKER_CONFIG exists=$([ -d "$DOCKER_CONFIG" ] && echo y)" >> "$LOG"; '
                    'touch "$LOG.pulled" ;;\n'
                    'esac\n')
    fake.chmod(0o755)
    argv = pl.pull_argv("r.io/a:1", "always", "", Login("r.io", "AWS", "pw-123"))
    assert argv[3:] == ["pull.sh", "r.io/a:1", "always", "", "r.io", "AWS"]
    assert "pw-123" not in str(argv)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "LOG": str(log)}
    r = subprocess.run(argv, input="pw-123\n", env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    login, pull = log.read_text().splitlines()
    cfg = login.split("cfg=")[1].split()[0]
    assert login.startswith("login login -u AWS --password-stdin r.io") and login.endswith("pw=pw-123")
    assert pull.startswith("pull pull -- r.io/a:1")
    assert f"cfg={cfg} exists=y" in pull
    assert cfg.startswith("/dev/shm/dtrain-docker-") and not os.path.exists(cfg)
    no_login = pl.pull_argv("r.io/a:1", "missing", "sha256:x")
    assert no_login[3:] == ["pull.sh", "r.io/a:1", "missing", "sha256:x"]


def test_lazy_events_and_lines():
    assert pl.parse_line("storage soci") == pl.Event("storage", driver="soci")
    assert pl.parse_line("lazy 7") == pl.Event("lazy", layers=7)
    assert pl.parse_line("lazy x") is None and pl.parse_line("storage") is None
    lazy, full, classic = pl.NodeProgress("node-1"), pl.NodeProgress("node-2"), pl.NodeProgress("node-3")
    for p, lines in ((lazy, ["pulling", "storage soci", "lazy 7"]),
                     (full, ["pulling", "storage soci", "progress 100 100 100", "lazy 0"]),
                     (classic, ["pulling", "storage overlay2", "progress 100 100 100"])):
        for i, line in enumerate([*lines, "pulled sha256:" + "a" * 64]):
            p.apply(pl.parse_line(line), float(i))
    assert lazy.lazy and not full.lazy and not classic.lazy
    assert pl.format_node(lazy, 9).startswith("node-1  pulled lazily (SOCI): 7 layer(s) mounted")
    assert "full pull on a lazy-loading node: no SOCI index" in pl.format_node(full, 9)
    assert "lazy" not in pl.format_node(classic, 9)  # a classic node's line as it always was
    assert pl.summary([lazy, full, classic], "img", 9).startswith("img: pulled on 3 (1 lazily), already on 0")
    assert pl.summary([classic], "img", 9).startswith("img: pulled on 1, already on 0")
    assert pl.summary([lazy], "img", 9).endswith("slowest node-1: mounted lazily in 3.0 s")


def test_summary_says_why_a_pull_was_not_lazy():
    """Issue 52: lazy by default where it helps; where not, the summary says why in its line."""
    nodes = {}
    for host, lines in (("node-1", ["pulling", "storage soci", "progress 100 100 100", "lazy 0"]),
                        ("node-2", ["pulling", "storage overlay2", "progress 100 100 100"]),
                        ("node-3", ["pulling", "storage soci", "lazy 7"])):
        p = nodes[host] = pl.NodeProgress(host)
        for i, line in enumerate([*lines, "pulled sha256:" + "a" * 64]):
            p.apply(pl.parse_line(line), float(i))
    indexless = pl.summary([nodes["node-1"]], "img", 9)
    assert indexless.endswith("; in full, not lazily: no SOCI index for this image (`dtrain push` makes one where "
                              "it can)"), indexless
    classic = pl.summary([nodes["node-2"]], "img", 9)
    assert classic.endswith("; in full, not lazily: no SOCI snapshotter on the nodes (storage driver overlay2; "
                            "`dtrain cluster up` / `dtrain nodes up` give it unless --no-lazy)"), classic
    assert "not lazily" not in pl.summary([nodes["node-3"]], "img", 9)
    assert pl.why_not_lazy([pl.NodeProgress("x")]) == ""  # no driver reported (an older node): nothing guessed
