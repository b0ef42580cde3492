"""`invoke push`: pure helpers, then real pushes.

Integration tests use real components only: the host Docker engine (/usr/bin/docker),
Debian's `docker-registry` with htpasswd auth on 127.0.0.1 (plain HTTP is allowed for
loopback), and a moto server for the ECR *API* (its registry host is fake, so the ECR flow
is tested up to `docker login`). Docker login state goes to a per-test DOCKER_CONFIG.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from botocore.exceptions import ClientError, NoCredentialsError

from dtrain.images import push as P
from dtrain.images.push import LocalImage, PushError, Target

# its registries are its own, on 127.0.0.1: on the second simulated cluster's side in `dtrain test`
pytestmark = pytest.mark.second_cluster

DOCKER = "/usr/bin/docker"
ROOT = Path(__file__).resolve().parent.parent
USER, PASSWORD = "pusher", "s3cret-Pa55word"
MOTO_ACCOUNT = "123456789012"
MOTO_PASSWORD = f"{MOTO_ACCOUNT}-auth-token"  # what moto's GetAuthorizationToken decodes to
MOTO_TOKEN = base64.b64encode(f"AWS:{MOTO_PASSWORD}".encode()).decode()


# ================================================================ pure helpers


def test_remote_ref():
    assert P.remote_ref("127.0.0.1:5050", "dtrain", "pytorch-ddp", "2.13.0-cpu-py311-debian12") \
        == "127.0.0.1:5050/dtrain/pytorch-ddp:2.13.0-cpu-py311-debian12"
    assert P.remote_ref("https://reg.example.com/", "", "horovod-pytorch", "t") \
        == "reg.example.com/horovod-pytorch:t"
    assert P.remote_ref("r.io", "team/ml/", "pytorch-ddp", "t") == "r.io/team/ml/pytorch-ddp:t"
    for bad in [("", "dtrain", "f", "t"), ("a b", "dtrain", "f", "t"),
                ("r.io", "Team", "f", "t"), ("r.io", "dtrain", "f", "-t"),
                ("r.io", "dtrain", "f", "t:x")]:
        with pytest.raises(PushError):
            P.remote_ref(*bad)


def test_images_not_built_are_named_on_one_line_with_their_build_command():
    msg = P.not_built_message([LocalImage("pytorch-ddp", "T1"), LocalImage("ray-train", "T2")])
    assert msg == ("not built yet: dtrain/pytorch-ddp:T1 (run `dtrain build --image pytorch-ddp --tag T1`); "
                   "dtrain/ray-train:T2 (run `dtrain build --image ray-train --tag T2`)")
    assert "\n" not in msg


def test_split_and_loopback():
    assert P.split_ref("127.0.0.1:5050/dtrain/pytorch-ddp:t") == ("127.0.0.1:5050", "dtrain/pytorch-ddp", "t")
    assert P.repository_of("h:1/a/b:t") == "h:1/a/b"
    assert P.is_loopback("127.0.0.1:5050") and P.is_loopback("localhost") and P.is_loopback("[::1]:5050")
    assert not P.is_loopback("123456789012.dkr.ecr.us-east-1.amazonaws.com")


def test_parse_push_digest():
    out = ("The push refers to repository [127.0.0.1:5999/dtrain/pushtest]\n"
           "639d6d91b35f: Preparing\n639d6d91b35f: Pushed\n"
           "1: digest: sha256:" + "ab" * 32 + " size: 523\n")
    assert P.parse_push_digest(out) == "sha256:" + "ab" * 32
    assert P.parse_push_digest("639d6d91b35f: Preparing\nunauthorized") is None


def test_push_shows_a_line_per_layer_done_and_a_summary():
    """Docker's state lines (a line per layer per state off a terminal) become one line per
    finished layer, its retries, and a summary; the rest is not shown."""
    raw = ["The push refers to repository [127.0.0.1:5999/dtrain/x]",
           "aaaaaaaaaaaa: Preparing", "bbbbbbbbbbbb: Preparing", "cccccccccccc: Preparing",
           "cccccccccccc: Waiting", "bbbbbbbbbbbb: Layer already exists", "aaaaaaaaaaaa: Pushing",
           "aaaaaaaaaaaa: Retrying in 5 seconds", "aaaaaaaaaaaa: Pushed",
           "cccccccccccc: Mounted from dtrain/y", "1: digest: sha256:" + "0" * 64 + " size: 945"]
    state = P.PushProgress()
    shown = [t for line in raw if (t := P.push_event(line, state))]
    assert shown == ["layer bbbbbbbbbbbb already in the registry (1/3)", "layer aaaaaaaaaaaa: retrying in 5 s",
                     "layer aaaaaaaaaaaa pushed (2/3)", "layer cccccccccccc mounted from dtrain/y (3/3)"]
    assert P.push_summary(state, 4.24) == "1 of 3 layers sent, 2 already in the registry (4.2 s)"
    assert P.push_event("unauthorized: authentication required", P.PushProgress()) is None


def test_catalog_entry_and_versions():
    labels = {"dtrain.version.python": "3.11", "dtrain.version.pytorch": "2.13.0",
              "dtrain.family": "pytorch-ddp", "org.opencontainers.image.version": "x"}
    e = P.catalog_entry(LocalImage("pytorch-ddp", "t1"), "r:5050/dtrain/pytorch-ddp:t1",
                        "sha256:" + "1" * 64, "sha256:" + "2" * 64, labels, "2026-01-01T00:00:00Z")
    assert e == {
        "ref": "r:5050/dtrain/pytorch-ddp:t1",
        "pinned": "r:5050/dtrain/pytorch-ddp@sha256:" + "1" * 64,
        "registry": "r:5050", "repository": "dtrain/pytorch-ddp", "image": "dtrain/pytorch-ddp",
        "family": "pytorch-ddp", "tag": "t1", "digest": "sha256:" + "1" * 64,
        "image_id": "sha256:" + "2" * 64, "versions": {"python": "3.11", "pytorch": "2.13.0"},
        "pushed_at": "2026-01-01T00:00:00Z",
    }


def test_merge_entry_updates_in_place():
    cat = {"version": 1, "images": [{"ref": "a", "digest": "1"}, {"ref": "b", "digest": "1"}]}
    out = P.merge_entry(cat, {"ref": "a", "digest": "2"})
    assert [(e["ref"], e["digest"]) for e in out["images"]] == [("a", "2"), ("b", "1")]
    out = P.merge_entry(out, {"ref": "c", "digest": "3"})
    assert [e["ref"] for e in out["images"]] == ["a", "b", "c"]
    assert cat["images"][0]["digest"] == "1"  # input untouched


def test_record_atomic_in_place_and_concurrent(tmp_path):
    path = tmp_path / "sub" / "catalog.json"
    P.record(path, {"ref": "x", "digest": "1"})
    P.record(path, {"ref": "y", "digest": "1"})
    P.record(path, {"ref": "x", "digest": "2"})
    data = json.loads(path.read_text())
    assert data["version"] == 1
    assert [(e["ref"], e["digest"]) for e in data["images"]] == [("x", "2"), ("y", "1")]
    threads = [threading.Thread(target=P.record, args=(path, {"ref": f"t{i}", "digest": "d"}))
               for i in range(16)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    refs = {e["ref"] for e in json.loads(path.read_text())["images"]}
    assert refs == {"x", "y"} | {f"t{i}" for i in range(16)}
    assert sorted(p.name for p in path.parent.iterdir()) == ["catalog.json", "catalog.json.lock"]


def test_record_refuses_a_corrupt_catalog(tmp_path):
    path = tmp_path / "catalog.json"
    path.write_text("{not json")
    with pytest.raises(PushError, match="cannot read catalog"):
        P.record(path, {"ref": "x"})
    assert path.read_text() == "{not json"


@pytest.mark.parametrize("output,want", [
    ('Get "http://127.0.0.1:1/v2/": dial tcp 127.0.0.1:1: connect: connection refused', "unreachable"),
    ('dial tcp: lookup x.dkr.ecr.us-east-1.amazonaws.com on 10.0.0.2:53: no such host', "unreachable"),
    ('Get "https://r:5050/v2/": dial tcp 10.1.1.1:5050: i/o timeout', "unreachable"),
    ("login attempt to http://r/v2/ failed with status: 401 Unauthorized", "rejected the credentials"),
    ("639d6d91b35f: Preparing\nno basic auth credentials", "rejected the credentials"),
    ("unauthorized: authentication required", "rejected the credentials"),
    ("denied: User: arn:aws:iam::1:user/u is not authorized to perform: ecr:InitiateLayerUpload "
     "on resource: arn:aws:ecr:us-east-1:1:repository/dtrain/pytorch-ddp", "denied ecr:InitiateLayerUpload"),
    ("tag invalid: The image tag 't' already exists in the 'dtrain/x' repository and cannot be "
     "overwritten because the repository is immutable.", "immutable"),
    ('Get "https://r:5050/v2/": http: server gave HTTP response to HTTPS client', "plain HTTP"),
])
def test_docker_error_message(output, want):
    msg = P.docker_error_message(output, "r:5050", "push")
    assert want in msg and "r:5050" in msg


def test_401_inside_a_layer_id_is_not_an_auth_error():
    msg = P.docker_error_message("4019cafe1234: Preparing\nblob upload unknown", "r", "push")
    assert "credentials" not in msg


def _client_error(code, message, op="CreateRepository", status=400):
    return ClientError({"Error": {"Code": code, "Message": message},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, op)


def test_aws_error_message_access_denied():
    """AccessDenied as real ECR returns it (JSON protocol); the moto test below covers the
    XML-bodied 403 a real IAM denial produces under moto."""
    msg = P.aws_error_message(_client_error(
        "AccessDeniedException", "User: arn:aws:iam::1:user/u is not authorized to perform: "
        "ecr:CreateRepository on resource: *", status=400), "dtrain/pytorch-ddp")
    assert msg.startswith("AWS denied ecr:CreateRepository on repository dtrain/pytorch-ddp: User:")
    xml = ('<?xml version="1.0"?><ErrorResponse><Errors><Error><Code>AccessDenied</Code>'
           '<Message>not allowed</Message></Error></Errors></ErrorResponse>')
    assert P.aws_error_message(_client_error("403", xml, "PutLifecyclePolicy", 403), "r") \
        == "AWS denied ecr:PutLifecyclePolicy on repository r: not allowed"
    assert "rejected the credentials" in P.aws_error_message(
        _client_error("UnrecognizedClientException", "bad token", "GetAuthorizationToken"))
    assert "no AWS credentials" in P.aws_error_message(NoCredentialsError())


def test_secrets_are_redacted_and_kept_out_of_repr():
    t = Target("r:5050", "u", "hunter2-very-secret")
    assert "hunter2" not in repr(t)
    assert P.redact("x hunter2-very-secret y") == "x *** y"


def test_password_only_from_stdin_or_the_environment():
    assert P.password_from_flag(None) is None
    assert P.password_from_flag("-", read_stdin=lambda: "from-stdin") == "from-stdin"
    with pytest.raises(PushError, match=r"--password - .* \$DTRAIN_REGISTRY_PASSWORD") as e:
        P.password_from_flag("hunter2-in-argv", read_stdin=lambda: "unused")
    assert "hunter2" not in str(e.value)


def test_cli_refuses_a_password_in_argv_with_one_line_and_exit_2():
    # refused before anything else: no image is looked at, no registry contacted (port 1: nothing there)
    r = subprocess.run([sys.executable, "-m", "invoke", "push", "--registry", "127.0.0.1:1", "--user", "u",
                        "--password", "hunter2-in-argv"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: --password takes no value"), r.stderr
    assert "hunter2" not in r.stdout + r.stderr


def test_lifecycle_policy_file(tmp_path):
    assert P.read_lifecycle_policy(None) is None
    good = tmp_path / "p.json"
    good.write_text('{"rules": []}')
    assert P.read_lifecycle_policy(good) == '{"rules": []}'
    bad = tmp_path / "bad.json"
    bad.write_text("{rules")
    with pytest.raises(PushError, match="not valid JSON"):
        P.read_lifecycle_policy(bad)
    with pytest.raises(PushError, match="cannot read"):
        P.read_lifecycle_policy(tmp_path / "missing.json")


def test_summary_table():
    r = P.PushResult("dtrain/pytorch-ddp:t", "h/dtrain/pytorch-ddp:t", "sha256:" + "a" * 64, 1.25,
                     {"image": "dtrain/pytorch-ddp", "tag": "t"})
    lines = P.summary_table([r]).splitlines()
    assert lines[0].split() == ["IMAGE", "TAG", "REMOTE", "DIGEST", "SECONDS"]
    assert lines[1].split() == ["dtrain/pytorch-ddp", "t", "h/dtrain/pytorch-ddp:t",
                                "sha256:aaaaaaaaaaaa", "1.2"]


# ================================================================ fixtures: real components


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ok(*cmd: str, timeout: float = 20) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=timeout).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture
def docker_config(tmp_path, monkeypatch):
    """Keep `docker login` state out of ~/.docker."""
    cfg = tmp_path / "docker-config"
    cfg.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(cfg))
    return cfg


@pytest.fixture(scope="session")
def test_image(engine, tmp_path_factory):
    """A tiny image imported offline, named like a built family image, with version labels.
    Unique content per session, so its digest is new to the registry and the engine."""
    src = tmp_path_factory.mktemp("img")
    (src / "hello.txt").write_text(f"dtrain push test {uuid.uuid4()}\n")
    (src / "etc").mkdir()
    (src / "etc" / "os-release").write_text("ID=pushtest\n")
    img = LocalImage("pytorch-ddp", f"pushtest-{uuid.uuid4().hex[:8]}")
    tar = subprocess.run(["tar", "-C", str(src), "-c", "."], capture_output=True, check=True).stdout
    r = subprocess.run([DOCKER, "import", "--change", "LABEL dtrain.version.python=3.11",
                        "--change", "LABEL dtrain.version.pytorch=2.13.0",
                        "--change", "LABEL dtrain.family=pytorch-ddp", "-", P.local_ref(img)],
                       input=tar, capture_output=True, check=True)
    image_id = r.stdout.decode().strip()
    yield img
    subprocess.run([DOCKER, "image", "rm", "-f", image_id], capture_output=True)


def registry_config(d: Path, tls: tuple[Path, Path] | None = None) -> int:
    """d/config.yml (and d/htpasswd, USER's bcrypt hash) for docker-registry on 127.0.0.1 and a
    free port, with TLS where tls is (certificate, key); the port."""
    ht = subprocess.run(["htpasswd", "-Bbn", USER, PASSWORD], capture_output=True, check=True, text=True)
    (d / "htpasswd").write_text(ht.stdout)
    port = _free_port()
    tls_field = f", tls: {{certificate: {tls[0]}, key: {tls[1]}}}" if tls else ""
    (d / "config.yml").write_text(f"""version: 0.1
log: {{level: warn}}
storage: {{filesystem: {{rootdirectory: {d / 'data'}}}}}
http: {{addr: 127.0.0.1:{port}{tls_field}}}
auth: {{htpasswd: {{realm: dtrain-test, path: {d / 'htpasswd'}}}}}
""")
    return port


@pytest.fixture(scope="session")
def registry(engine, tmp_path_factory):
    """Debian's docker-registry with htpasswd (bcrypt) auth on 127.0.0.1:<free port>."""
    exe = shutil.which("docker-registry")
    assert exe and shutil.which("htpasswd"), "launch.engine.ensure_packages installs docker-registry and apache2-utils"
    d = tmp_path_factory.mktemp("registry")
    port = registry_config(d)
    log = open(d / "registry.log", "wb")
    proc = subprocess.Popen([exe, "serve", str(d / "config.yml")], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"docker-registry did not start: {(d / 'registry.log').read_text()}")
            time.sleep(0.1)
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)
    log.close()
    # whatever a failed test left tagged for this throwaway registry goes with it (tags only)
    left = _engine_refs(f"127.0.0.1:{port}/")
    if left:
        subprocess.run([DOCKER, "image", "rm", *left], capture_output=True)


def _engine_refs(prefix: str) -> list[str]:
    """The host engine's tags and REPO@DIGEST references that start with prefix."""
    r = subprocess.run([DOCKER, "image", "ls", "--digests", "--format",
                        "{{.Repository}} {{.Tag}} {{.Digest}}"], capture_output=True, text=True, check=True)
    refs = set()
    for repo, tag, digest in (line.split() for line in r.stdout.splitlines()):
        if repo.startswith(prefix):
            refs |= {f"{repo}:{tag}"} if tag != "<none>" else set()
            refs |= {f"{repo}@{digest}"} if digest != "<none>" else set()
    return sorted(refs)


@pytest.fixture(scope="session")
def moto_url():
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def aws_env(moto_url, monkeypatch):
    """boto3 pointed at moto through AWS_ENDPOINT_URL only, with fake keys; no files, no IMDS."""
    for k in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return moto_url


def _ecr(**kw):
    import boto3

    return boto3.Session(region_name="us-east-1").client("ecr", **kw)


def _manifest_digest(registry: str, repo: str, ref: str) -> str:
    req = urllib.request.Request(
        f"http://{registry}/v2/{repo}/manifests/{ref}", method="HEAD",
        headers={"Authorization": "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode(),
                 "Accept": "application/vnd.docker.distribution.manifest.v2+json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.headers["Docker-Content-Digest"]


# ================================================================ registry: real pushes


@pytest.mark.docker
def test_push_verify_and_catalog(test_image, registry, docker_config, tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(P.PASSWORD_ENV, PASSWORD)
    catalog = tmp_path / "catalog.json"
    [res] = P.push_registry([test_image], registry, user=USER, catalog_path=catalog)
    remote = f"{registry}/dtrain/pytorch-ddp:{test_image.tag}"
    assert res.remote == remote
    # the registry itself says the tag points at the recorded digest
    assert _manifest_digest(registry, "dtrain/pytorch-ddp", test_image.tag) == res.digest
    local = P.inspect_image(P.local_ref(test_image))
    # the engine keeps only what it had: the local tag; no REGISTRY/... tag or digest reference
    assert _engine_refs(f"{registry}/") == [], local
    assert not any(d.startswith(f"{registry}/") for d in local["RepoDigests"]), local
    [entry] = json.loads(catalog.read_text())["images"]
    assert entry["ref"] == remote and entry["digest"] == res.digest
    assert entry["image"] == "dtrain/pytorch-ddp" and entry["tag"] == test_image.tag
    assert entry["image_id"] == local["Id"]
    assert entry["versions"] == {"python": "3.11", "pytorch": "2.13.0"}
    assert entry["pushed_at"].endswith("Z")
    out, err = capfd.readouterr()
    # one line per layer when it is done and a summary; none of docker's raw state lines
    assert re.search(r"^  layer [0-9a-f]{12} pushed \(1/1\)$", out, re.M), out
    assert re.search(r"^  1 of 1 layers sent, 0 already in the registry \(\d+\.\d s\)$", out, re.M), out
    assert "Preparing" not in out and "Pushed" not in out and "digest: sha256" not in out, out
    assert "IMAGE" in out and res.digest[:19] in out
    assert PASSWORD not in out + err

    # again: same digest, the one entry is updated in place, not duplicated
    P.record(catalog, {"ref": "other/ref:x", "digest": "sha256:0"})
    [res2] = P.push_registry([test_image], registry, user=USER, catalog_path=catalog)
    assert res2.digest == res.digest
    refs = [e["ref"] for e in json.loads(catalog.read_text())["images"]]
    assert refs == [remote, "other/ref:x"]
    assert _engine_refs(f"{registry}/") == []


SHIM = """#!/bin/sh
# the real docker CLI, after a line: the Docker config this call had, its mode, the command
printf '%s %s %s\\n' "${DOCKER_CONFIG:-none}" "$(stat -c %a "${DOCKER_CONFIG:-/nonexistent}" 2>/dev/null)" "$1" >> "$0.log"
exec /usr/bin/docker "$@"
"""


@pytest.mark.docker
def test_push_leaves_no_credential_in_any_docker_config(test_image, registry, docker_config, tmp_path, monkeypatch):
    """The login, the push, the manifest read and the pull-back run with a Docker config of the
    run's own (0700, /dev/shm), removed after: the user's Docker config and ~/.docker hold no
    credential, nothing of it is left. docker runs through a shim that records DOCKER_CONFIG."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    (docker_config / "config.json").write_text('{"auths": {}, "proxies": {}}\n')
    shim = tmp_path / "docker"
    shim.write_text(SHIM)
    shim.chmod(0o755)
    monkeypatch.setattr(P, "DOCKER", str(shim))
    before = set(Path("/dev/shm").glob(f"dtrain-push-docker-{os.getpid()}-*"))
    [res] = P.push_registry([test_image], registry, user=USER, password=PASSWORD, prefix="own-config",
                            catalog_path=tmp_path / "c.json")
    assert res.digest.startswith("sha256:")  # the registry asks for the login: it was used
    calls = [line.split(" ", 2) for line in Path(f"{shim}.log").read_text().splitlines()]
    own = {cfg for cfg, _, cmd in calls if cmd in ("login", "push", "manifest", "pull")}
    assert len(own) == 1 and str(docker_config) not in own, calls
    [d] = own
    assert d.startswith("/dev/shm/dtrain-push-docker-") and not Path(d).exists()
    assert {mode for cfg, mode, _ in calls if cfg == d} == {"700"}, calls
    assert [cmd for cfg, _, cmd in calls if cfg == d][0] == "login"
    assert set(Path("/dev/shm").glob(f"dtrain-push-docker-{os.getpid()}-*")) == before
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode())
    for f in [*docker_config.rglob("*"), *home.rglob("*")]:
        assert not f.is_file() or (basic not in f.read_bytes() and PASSWORD.encode() not in f.read_bytes()), f
    assert json.loads((docker_config / "config.json").read_text()) == {"auths": {}, "proxies": {}}


@pytest.mark.docker
def test_a_remote_tag_the_user_made_stays(test_image, registry, docker_config, tmp_path):
    """push removes only the references it made: a REGISTRY/... tag made before it stays."""
    remote = f"{registry}/mine/pytorch-ddp:{test_image.tag}"
    subprocess.run([DOCKER, "tag", P.local_ref(test_image), remote], check=True, capture_output=True)
    try:
        [res] = P.push_registry([test_image], registry, user=USER, password=PASSWORD, prefix="mine",
                                catalog_path=tmp_path / "c.json")
        assert res.remote == remote
        assert _engine_refs(f"{registry}/mine/") == [remote]
        assert P.inspect_image(remote)["Id"] == P.inspect_image(P.local_ref(test_image))["Id"]
    finally:
        subprocess.run([DOCKER, "image", "rm", remote], capture_output=True)


def test_refs_made_by_push():
    remote, d = "r:5050/dtrain/x:1", "sha256:" + "a" * 64
    assert P.refs_made_by_push(remote, False, [], d) == [remote, f"r:5050/dtrain/x@{d}"]
    assert P.refs_made_by_push(remote, True, [f"r:5050/dtrain/x@{d}"], d) == []
    assert P.refs_made_by_push(remote, False, [], None) == [remote]  # failed before a digest


@pytest.mark.docker
def test_verify_rejects_a_digest_of_another_image(test_image, registry, docker_config, tmp_path):
    [res] = P.push_registry([test_image], registry, user=USER, password=PASSWORD,
                            prefix="verify", catalog_path=tmp_path / "c.json")
    with P.own_docker_config():  # the push's login is gone with its run: a login of the test's own
        P.docker_login(Target(registry, USER, PASSWORD))
        with pytest.raises(PushError, match="not the pushed"):
            P.verify_digest(res.remote, res.digest, "sha256:" + "0" * 64)
        missing = "sha256:" + "f" * 64
        with pytest.raises(PushError, match="cannot read back"):
            P.verify_digest(res.remote, missing, P.inspect_image(P.local_ref(test_image))["Id"])


@pytest.mark.docker
def test_not_built_names_the_build_command(engine, registry, docker_config, tmp_path):
    catalog = tmp_path / "catalog.json"
    with pytest.raises(PushError) as e:
        P.push_registry([LocalImage("pytorch-ddp", "never-built-0")], registry, user=USER,
                        password=PASSWORD, catalog_path=catalog)
    assert "dtrain/pytorch-ddp:never-built-0" in str(e.value)
    assert "dtrain build --image pytorch-ddp --tag never-built-0" in str(e.value)
    assert not catalog.exists()


@pytest.mark.docker
def test_wrong_password_is_an_auth_error(test_image, registry, docker_config, tmp_path, capfd):
    catalog = tmp_path / "catalog.json"
    own_before = set(Path("/dev/shm").glob(f"dtrain-push-docker-{os.getpid()}-*"))
    with pytest.raises(PushError) as e:
        P.push_registry([test_image], registry, user=USER, password="wrong-password-42",
                        catalog_path=catalog)
    assert "rejected the credentials" in str(e.value) and registry in str(e.value)
    assert "wrong-password-42" not in str(e.value) + "".join(capfd.readouterr())
    assert not catalog.exists()
    assert set(Path("/dev/shm").glob(f"dtrain-push-docker-{os.getpid()}-*")) == own_before  # the login's config: gone
    assert _engine_refs(f"{registry}/") == []


@pytest.mark.docker
def test_push_without_login_is_refused_and_not_recorded(test_image, registry, docker_config, tmp_path):
    catalog = tmp_path / "catalog.json"
    with pytest.raises(PushError, match="rejected the credentials") as e:
        P.push_registry([test_image], registry, prefix="anon", catalog_path=catalog)
    assert registry in str(e.value)
    assert not catalog.exists()
    assert _engine_refs(f"{registry}/") == []  # the failed push's tag is gone too


@pytest.mark.docker
@pytest.mark.parametrize("login", [True, False])
def test_unreachable_registry(test_image, docker_config, tmp_path, login):
    closed = f"127.0.0.1:{_free_port()}"  # nothing listens there
    with pytest.raises(PushError) as e:
        P.push_registry([test_image], closed, user=USER if login else None,
                        password=PASSWORD if login else None, catalog_path=tmp_path / "c.json")
    assert f"registry {closed} is unreachable" in str(e.value)
    assert ("(login)" if login else "(push)") in str(e.value)
    assert _engine_refs(f"{closed}/") == []


# ================================================================ ECR (moto for the API only)


def test_ecr_prepare_creates_repository(aws_env, tmp_path):
    policy = json.dumps({"rules": [{"rulePriority": 1, "selection": {
        "tagStatus": "untagged", "countType": "sinceImagePushed", "countUnit": "days",
        "countNumber": 14}, "action": {"type": "expire"}}]})
    session = P.aws_session(region="us-east-1")
    target = P.ecr_prepare(session, ["prep/pytorch-ddp", "prep/horovod-pytorch"], immutable=True,
                           lifecycle_policy=policy, out=lambda s: None)
    assert target.registry == f"{MOTO_ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com"
    assert (target.user, target.password) == ("AWS", MOTO_PASSWORD)
    ecr = _ecr()
    for name in ("prep/pytorch-ddp", "prep/horovod-pytorch"):
        [repo] = ecr.describe_repositories(repositoryNames=[name])["repositories"]
        assert repo["imageScanningConfiguration"]["scanOnPush"] is True
        assert repo["imageTagMutability"] == "IMMUTABLE"
        assert json.loads(ecr.get_lifecycle_policy(repositoryName=name)["lifecyclePolicyText"]) \
            == json.loads(policy)
    # defaults: mutable tags, no lifecycle policy
    P.ecr_prepare(session, "prep2/pytorch-ddp", out=lambda s: None)
    [repo] = ecr.describe_repositories(repositoryNames=["prep2/pytorch-ddp"])["repositories"]
    assert repo["imageTagMutability"] == "MUTABLE"
    assert repo["imageScanningConfiguration"]["scanOnPush"] is True
    with pytest.raises(ecr.exceptions.LifecyclePolicyNotFoundException):
        ecr.get_lifecycle_policy(repositoryName="prep2/pytorch-ddp")


def test_ecr_existing_repository_is_never_weakened(aws_env):
    ecr = _ecr()
    ecr.create_repository(repositoryName="old/pytorch-ddp", imageTagMutability="MUTABLE",
                          imageScanningConfiguration={"scanOnPush": False})
    session = P.aws_session()
    P.ecr_prepare(session, "old/pytorch-ddp", immutable=True, out=lambda s: None)
    [repo] = ecr.describe_repositories(repositoryNames=["old/pytorch-ddp"])["repositories"]
    assert repo["imageTagMutability"] == "IMMUTABLE"
    assert repo["imageScanningConfiguration"]["scanOnPush"] is True
    P.ecr_prepare(session, "old/pytorch-ddp", immutable=False, out=lambda s: None)
    [repo] = ecr.describe_repositories(repositoryNames=["old/pytorch-ddp"])["repositories"]
    assert repo["imageTagMutability"] == "IMMUTABLE"


@pytest.mark.docker
def test_push_ecr_fails_at_login_clearly_and_never_shows_the_token(
        test_image, aws_env, docker_config, tmp_path, capfd):
    catalog = tmp_path / "catalog.json"
    with pytest.raises(PushError) as e:
        P.push_ecr([test_image], region="us-east-1", prefix="ecrflow", immutable=True,
                   catalog_path=catalog)
    host = f"{MOTO_ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com"
    msg = str(e.value)
    assert f"registry {host} is unreachable (login)" in msg
    out, err = capfd.readouterr()
    assert "created ECR repository ecrflow/pytorch-ddp" in out
    for secret in (MOTO_TOKEN, MOTO_PASSWORD):
        assert secret not in out and secret not in err and secret not in msg
        assert secret not in repr(e.value.__context__) and e.value.__cause__ is None
    assert not catalog.exists()
    assert not (docker_config / "config.json").exists() or \
        MOTO_PASSWORD not in (docker_config / "config.json").read_text()


def test_no_aws_credentials(monkeypatch):
    for k in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
              "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
              "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    start = time.monotonic()
    with pytest.raises(PushError, match="no AWS credentials found"):
        P.ecr_prepare(P.aws_session(region="us-east-1"), "nocreds/pytorch-ddp", out=lambda s: None)
    assert time.monotonic() - start < 15


def test_unknown_profile(monkeypatch):
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    with pytest.raises(PushError, match="AWS profile not found"):
        P.aws_session(profile="no-such-profile")


def test_real_access_denied_from_iam_policy(aws_env, monkeypatch):
    """moto enforces IAM once /moto-api/reset-auth sets the free-call count to 0: a user
    allowed only to describe repositories is denied ecr:CreateRepository."""
    import boto3

    iam = boto3.Session(region_name="us-east-1").client("iam")
    user = f"pusher-{uuid.uuid4().hex[:6]}"
    iam.create_user(UserName=user)
    iam.put_user_policy(UserName=user, PolicyName="describe-only", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Resource": "*",
                                                "Action": ["ecr:DescribeRepositories"]}]}))
    key = iam.create_access_key(UserName=user)["AccessKey"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])

    def set_auth(value: bytes) -> None:
        urllib.request.urlopen(urllib.request.Request(
            f"{aws_env}/moto-api/reset-auth", data=value, method="POST",
            headers={"Content-Type": "application/json"}), timeout=10).read()

    set_auth(b"0")
    try:
        with pytest.raises(PushError) as e:
            P.ecr_prepare(P.aws_session(region="us-east-1"), "denied/pytorch-ddp", out=lambda s: None)
    finally:
        set_auth(b"inf")
    assert str(e.value).startswith("AWS denied ecr:CreateRepository on repository denied/pytorch-ddp")
    assert f"user/{user}" in str(e.value)


def test_select_images_by_ref():
    assert P.select_images("pytorch-ddp:any-tag") == ([LocalImage("pytorch-ddp", "any-tag")], [])
    with pytest.raises(PushError, match="unknown image family"):
        P.select_images("no-such-family")


# ================================================================ build cache in a registry


def _registry_get(registry: str, path: str, accept: str = "") -> bytes:
    req = urllib.request.Request(f"http://{registry}/v2/{path}")
    req.add_header("Authorization", "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode())
    if accept:
        req.add_header("Accept", accept)
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read()


@pytest.mark.docker
def test_build_pushes_inline_cache_with_the_builder_stage(engine, registry, docker_config, cpu_images):
    """`invoke build --push-cache REPO` pushes the runtime image and the builder stage, each
    carrying BuildKit's inline cache, so a CI machine without local cache reuses the compile."""
    from dtrain.images import build as b

    subprocess.run([DOCKER, "login", "-u", USER, "--password-stdin", registry], input=PASSWORD,
                   text=True, check=True, capture_output=True)
    repo = f"{registry}/dtrain-cache/pytorch-ddp"
    wheels = Path("/opt/wheels")
    opts = b.BuildOptions(base_image=engine.BASE_IMAGE, ca_bundle=b.default_ca_bundle(),
                          wheelhouse=wheels if wheels.is_dir() else None, push_cache=repo)
    said: list[str] = []
    [result] = b.build(["pytorch-ddp"], None, False, opts, say=said.append)
    assert any("build cache pushed" in line for line in said)
    manifest_type = "application/vnd.docker.distribution.manifest.v2+json"
    for tag in (f"{result.tag}-builder", result.tag):
        manifest = json.loads(_registry_get(registry, f"dtrain-cache/pytorch-ddp/manifests/{tag}", manifest_type))
        config = json.loads(_registry_get(registry, f"dtrain-cache/pytorch-ddp/blobs/{manifest['config']['digest']}"))
        assert "moby.buildkit.cache.v0" in config, f"{tag}: no inline cache in the image config"
    assert _engine_refs(f"{repo}:") + _engine_refs(f"{repo}@") == []  # the cache's tags were removed


# ================================================================ project images (issue 13)


@pytest.mark.docker
def test_project_image_builds_imports_and_pushes(cpu_images, ca_bundle, registry, docker_config, tmp_path):
    """A real project build FROM the pytorch-ddp CPU image with a small requirements.txt:
    the package and the project's module import in the image, in /workdir; editing only the
    code keeps the requirements layer cached; `invoke push --image project-NAME:TAG` pushes it."""
    import os
    import sys

    from dtrain.images import project as pj
    from dtrain.images.build import BuildOptions

    proj = tmp_path / "mnist-demo"
    proj.mkdir()
    (proj / "requirements.txt").write_text("tabulate==0.9.0\n")
    (proj / "mymodule.py").write_text("import tabulate\nTABLE = tabulate.tabulate([[1, 2]])\n")
    lines: list[str] = []
    ref = pj.build(proj, "pytorch-ddp", BuildOptions(ca_bundle=ca_bundle), say=lines.append)
    assert ref.startswith("dtrain/project-mnist-demo:")
    out = subprocess.run([DOCKER, "run", "--rm", "--entrypoint", "python", ref, "-c",
                          "import os, mymodule, torch; print(os.getcwd(), torch.__version__); print(mymodule.TABLE)"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "/workdir 2.13.0+cpu"  # the framework pin did not move
    assert "1  2" in out.stdout
    labels = P.inspect_image(ref)["Config"]["Labels"]
    assert labels["dtrain.family"] == "pytorch-ddp" and labels["dtrain.project"] == "mnist-demo"

    # Only the code changed: the pip layer comes from the cache.
    (proj / "mymodule.py").write_text("import tabulate\nTABLE = tabulate.tabulate([[3, 4]])\n")
    lines.clear()
    ref2 = pj.build(proj, "pytorch-ddp", BuildOptions(ca_bundle=ca_bundle), say=lines.append)
    assert ref2 != ref
    log = (pj.LOG_DIR / "project-mnist-demo.log").read_text()
    assert re.search(r"#(\d+) \[(?:stage-0 )?\d/\d\] RUN --mount=type=secret,id=ca.*\n(?:#\1 sha256:\w+\n)?#\1 CACHED", log), \
        log[-2000:]

    name, tag = ref2.split("/", 1)[1].split(":")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "invoke", "push", "--registry", registry, "--image", f"{name}:{tag}",
                        "--user", USER, "--password", "-", "--catalog", str(tmp_path / "catalog.json")],
                       input=PASSWORD + "\n", cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    [entry] = json.loads((tmp_path / "catalog.json").read_text())["images"]
    assert entry["ref"] == f"{registry}/dtrain/{name}:{tag}"
    assert _manifest_digest(registry, f"dtrain/{name}", tag) == entry["digest"]
    assert _engine_refs(f"{registry}/dtrain/{name}") == [] and P.inspect_image(ref2) is not None
