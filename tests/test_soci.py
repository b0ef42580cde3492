"""`dtrain push --soci` (images/soci.py): the flags' checks, the commands, then a real push.

The real push uses Debian's docker-registry with TLS (a throw-away self-signed certificate)
and htpasswd auth on 127.0.0.1, the host engine, and Debian 13's soci-snapshotter and
containerd unpacked by engine.ensure_lazy_binaries (fetched with apt when missing: never
skipped). The index must be in the registry afterwards, found as a node finds it: the OCI
referrers fallback tag of the image's digest.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from dtrain import engine
from dtrain.images import push as P
from dtrain.images import soci as S
from test_push import PASSWORD, USER, _free_port, docker_config, registry, registry_config, test_image  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
SOCI_INDEX = "application/vnd.amazon.soci.index.v1+json"


# ================================================================ flags and commands


def test_missing_tools_name_what_to_install(tmp_path):
    with pytest.raises(S.SociError) as e:
        S.find_tools(str(tmp_path), None)
    msg = str(e.value)
    assert f"no `soci`, `ctr`, `containerd` found in {tmp_path}" in msg
    assert "soci-snapshotter" in msg and "Debian 13" in msg and "\n" not in msg
    # the machine's containerd: containerd itself is not needed
    (tmp_path / "usr" / "bin").mkdir(parents=True)
    for n in ("soci", "ctr"):
        (tmp_path / "usr" / "bin" / n).write_text("#!/bin/sh\n")
        (tmp_path / "usr" / "bin" / n).chmod(0o755)
    t = S.find_tools(str(tmp_path), "/run/containerd/containerd.sock")
    assert t.soci == str(tmp_path / "usr/bin/soci") and t.containerd is None


def test_private_containerd_needs_root_and_a_socket_must_be_one(tmp_path, monkeypatch):
    root = engine.ensure_lazy_binaries()
    with pytest.raises(S.SociError, match="needs root: run as root, or pass --containerd-socket"):
        S.setup(str(root), None, euid=1000)
    with pytest.raises(S.SociError, match=f"--containerd-socket {tmp_path}: not a socket"):
        S.setup(str(root), str(tmp_path))
    monkeypatch.setenv(S.BIN_ENV, str(root))
    assert S.setup(None, None, euid=0).tools.containerd == str(root / "usr/bin/containerd")


def test_tls_state_plain_tls_unreachable(tmp_path):
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a):
            pass

    plain = HTTPServer(("127.0.0.1", 0), H)
    tls = HTTPServer(("127.0.0.1", 0), H)
    cert, key = _cert(tmp_path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
    for s in (plain, tls):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        assert S.tls_state(f"127.0.0.1:{plain.server_port}") == "plain"
        assert S.tls_state(f"127.0.0.1:{tls.server_port}") == "tls"
        assert S.tls_state(f"127.0.0.1:{_free_port()}") == "unreachable"
    finally:
        plain.shutdown()
        tls.shutdown()
    with pytest.raises(S.SociError) as e:
        S.require_tls("10.213.0.1:5000", "plain")
    assert "registry 10.213.0.1:5000 speaks plain HTTP" in str(e.value) and "HTTPS only" in str(e.value)
    S.require_tls("r:1", "tls")
    S.require_tls("r:1", "unreachable")  # the push itself says so, naming the registry


def test_ecr_commands_carry_the_user_never_the_password(tmp_path):
    """What --ecr runs (moto has no registry to run it against): ctr pulls with --user AWS
    and reads the password from its terminal; soci push reads the engine's login."""
    tools = S.Tools("/b/soci", "/b/ctr", "/b/containerd")
    ref = "123456789012.dkr.ecr.us-east-1.amazonaws.com/dtrain/pytorch-ddp:t"
    pull, create, push = S.index_argvs(tools, "/s/c.sock", ref, "AWS", tmp_path / "lib")
    assert pull == ["/b/ctr", "--address", "/s/c.sock", "--namespace", S.NAMESPACE, "content", "fetch",
                    "--user", "AWS", ref]
    assert create[:5] == ["unshare", "-m", "--propagation", "private", "sh"]
    assert create[-9:] == ["/b/soci", "--address", "/s/c.sock", "--namespace", S.NAMESPACE, "create",
                           "--min-layer-size", "0", ref]
    assert push[-5:] == ["push", "--quiet", "--existing-index", "allow", ref]
    assert str(tmp_path / "lib") in create and S.SOCI_LIB in create
    # the machine's containerd: the machine's soci state, no mount namespace
    assert S.index_argvs(tools, "/s/c.sock", ref, None, None)[1][0] == "/b/soci"


def test_the_password_reaches_a_terminal_not_argv():
    prog = "import os,sys; print(os.isatty(0)); print(input()[::-1])"
    r = S.run_tool([sys.executable, "-c", prog], password="s3cret-pw")
    assert r.returncode == 0 and r.stdout.split() == ["True", "wp-terc3s"]


def _dtrain(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dtrain", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_cli_checks_soci_flags_before_anything(tmp_path):
    r = _dtrain("push", "--registry", "127.0.0.1:1", "--soci", "--soci-bin", str(tmp_path))
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: --soci: no `soci`") and "soci-snapshotter" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    # Without --soci the index is made by default: a --soci-bin that lacks the tools is still an error.
    r = _dtrain("push", "--registry", "127.0.0.1:1", "--soci-bin", str(tmp_path))
    assert r.returncode == 2 and "no `soci`" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = _dtrain("push", "--registry", "127.0.0.1:1", "--no-soci", "--soci-bin", str(tmp_path))
    assert r.returncode == 2 and "--soci-bin is for the SOCI index: drop --no-soci" in r.stderr, r.stderr
    r = _dtrain("push", "--registry", "127.0.0.1:1", "--no-soci", "--soci")
    assert r.returncode == 2 and "--soci and --no-soci: pass one" in r.stderr, r.stderr


# ================================================================ a real push with TLS


def _cert(d: Path) -> tuple[Path, Path]:
    cert, key = d / "registry.crt", d / "registry.key"
    if not cert.exists():
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                        "/CN=dtrain-soci-test", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                        "-out", str(cert)], check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="module")
def tls_registry(tmp_path_factory):
    """docker-registry with TLS and htpasswd auth on 127.0.0.1; (address, CA bundle)."""
    d = tmp_path_factory.mktemp("tlsreg")
    cert, key = _cert(d)
    bundle = d / "bundle.pem"
    bundle.write_text(Path("/etc/ssl/certs/ca-certificates.crt").read_text() + cert.read_text())
    port = registry_config(d, (cert, key))
    log = open(d / "registry.log", "wb")
    proc = subprocess.Popen([shutil.which("docker-registry"), "serve", str(d / "config.yml")], stdout=log,
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while S.tls_state(f"127.0.0.1:{port}") != "tls":
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"docker-registry did not start: {(d / 'registry.log').read_text()}")
        time.sleep(0.1)
    yield f"127.0.0.1:{port}", bundle
    proc.terminate()
    proc.wait(10)
    log.close()


def _get(url: str, bundle: Path, accept: str) -> dict:
    req = urllib.request.Request(url, headers={
        "Accept": accept, "Authorization": "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()})
    with urllib.request.urlopen(req, timeout=10, context=ssl.create_default_context(cafile=str(bundle))) as r:
        return json.load(r)


@pytest.mark.docker
def test_push_soci_puts_the_index_beside_the_image(test_image, tls_registry, docker_config, tmp_path, monkeypatch,
                                                  capfd):
    registry, bundle = tls_registry
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))  # ctr's and soci's (Go) trust
    monkeypatch.setenv(P.PASSWORD_ENV, PASSWORD)
    lazy = S.setup(str(engine.ensure_lazy_binaries()), None)
    # the private containerd's temp dir under a dir of this test's own: another test's soci push
    # (the other cluster part's, beside this one) is not this one's leftover (short: a socket path)
    own_tmp = Path(tempfile.mkdtemp(prefix="ts-", dir="/tmp"))
    with monkeypatch.context() as m:
        m.setattr(tempfile, "tempdir", str(own_tmp))
        [res] = P.push_registry([test_image], registry, user=USER, catalog_path=tmp_path / "c.json", soci=lazy)
    out, err = capfd.readouterr()
    assert f"SOCI index pushed beside {res.remote}" in out and PASSWORD not in out + err
    # found as the snapshotter finds it: the referrers fallback tag of the image's digest
    index = _get(f"https://{registry}/v2/dtrain/pytorch-ddp/manifests/{S.referrers_tag(res.digest)}", bundle,
                 "application/vnd.oci.image.index.v1+json")
    [desc] = [m for m in index["manifests"] if m.get("artifactType") == SOCI_INDEX]
    soci_index = _get(f"https://{registry}/v2/dtrain/pytorch-ddp/manifests/{desc['digest']}", bundle,
                      "application/vnd.oci.image.manifest.v1+json")
    assert soci_index["subject"]["digest"] == res.digest
    image = _get(f"https://{registry}/v2/dtrain/pytorch-ddp/manifests/{res.digest}", bundle,
                 "application/vnd.docker.distribution.manifest.v2+json")
    # a zTOC for every layer (--min-layer-size 0)
    assert sorted(z["annotations"]["com.amazon.soci.image-layer-digest"] for z in soci_index["layers"]) == \
        sorted(layer["digest"] for layer in image["layers"])
    # the private containerd and its temp dir are gone
    assert list(own_tmp.glob("dtrain-soci-*")) == []
    assert not [p for p in os.listdir("/proc") if p.isdigit() and f"{own_tmp}/dtrain-soci-" in _cmdline(p)]
    shutil.rmtree(own_tmp)


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.docker
def test_push_soci_refuses_a_plain_http_registry_before_pushing(test_image, registry, docker_config, tmp_path,
                                                                monkeypatch):
    monkeypatch.setenv(P.PASSWORD_ENV, PASSWORD)
    lazy = S.setup(str(engine.ensure_lazy_binaries()), None)
    with pytest.raises(S.SociError, match=f"registry {registry} speaks plain HTTP"):
        P.push_registry([test_image], registry, user=USER, catalog_path=tmp_path / "c.json", soci=lazy)
    assert not (tmp_path / "c.json").exists()


def test_trixie_sources_come_from_the_machines_own():
    text = """Types: deb
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""
    out = engine.suite_sources(text, "trixie")
    assert out == ("Types: deb\nURIs: http://mirror.example/debian\nSuites: trixie\nComponents: main\n"
                   "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")
    assert engine.suite_sources("Types: deb-src\nURIs: x\nSuites: bookworm\n", "trixie") == ""


def test_trixie_sources_keep_an_inline_key_and_skip_disabled_stanzas():
    """A Signed-By holding the key itself (continuation lines) is kept whole, not read as fields;
    a stanza with Enabled: no gives nothing (engine.deb822_stanzas, shared with apt_sources)."""
    key = " -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n mQINBGPL0BUBEADmW5NlOOM=\n -----END PGP PUBLIC KEY BLOCK-----"
    text = (f"# the machine's\ntypes: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\nComponents: main\n"
            f"Signed-By:\n{key}\n\nTypes: deb\nURIs: http://other.example/debian\nSuites: bookworm\n"
            f"Components: main\nEnabled: no\n")
    assert engine.suite_sources(text, "trixie") == (
        f"types: deb\nURIs: http://mirror.example/debian\nSuites: trixie\nComponents: main\nSigned-By: \n{key}\n")
    assert engine.apt_sources({"a.sources": text}) == [("http://mirror.example/debian", "bookworm", "main")]


def test_without_a_bin_dir_the_tools_come_from_the_fetched_packages(tmp_path, monkeypatch):
    """docs/launch.md's order as written on a fresh machine: `push --soci` with no --soci-bin, no
    $DTRAIN_SOCI_BIN and no soci on PATH takes the Debian 13 packages that `cluster up --lazy`
    fetches (engine.ensure_lazy_binaries), fetching them when missing."""
    monkeypatch.delenv(S.BIN_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no soci, ctr, containerd there
    asked = []

    def fetch():
        asked.append(1)
        return engine.ensure_lazy_binaries()

    lazy = S.setup(None, None, euid=0, fetch=fetch)
    assert asked == [1] and lazy.tools.soci == str(engine.LAZY_ROOT / "usr/bin/soci")
    assert lazy.tools.containerd == str(engine.LAZY_ROOT / "usr/bin/containerd")


# ================================================================ the index by default (issue 52)


def _say():
    lines: list[str] = []
    return lines, lines.append


def test_default_makes_the_index_where_it_can(tmp_path, monkeypatch):
    for name in ("soci", "ctr", "containerd"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    lines, say = _say()
    got = S.default_setup(str(tmp_path), None, "r:5000", say, euid=0, state=lambda r: "tls")
    assert got == S.Setup(S.Tools(str(tmp_path / "soci"), str(tmp_path / "ctr"), str(tmp_path / "containerd")))
    assert lines == []
    # ECR (registry None): no TLS probe at all
    assert S.default_setup(str(tmp_path), None, None, say, euid=0, state=lambda r: 1 / 0) is not None
    # the packages `cluster up` unpacked, found where nothing else names the tools
    root = tmp_path / "root"
    (root / "usr" / "bin").mkdir(parents=True)
    for name in ("soci", "ctr", "containerd"):
        (root / "usr" / "bin" / name).write_text("#!/bin/sh\n")
        (root / "usr" / "bin" / name).chmod(0o755)
    monkeypatch.delenv(S.BIN_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    got = S.default_setup(None, None, "r:5000", say, euid=0, lazy_root=root, state=lambda r: "tls")
    assert got is not None and got.tools.soci == str(root / "usr" / "bin" / "soci")
    got = S.default_setup(None, None, "r:5000", say, euid=0, lazy_root=tmp_path / "none", state=lambda r: "tls")
    assert got is None and len(lines) == 1
    assert lines[0].startswith(f"{S.OFF}: no soci/ctr/containerd on PATH nor in {tmp_path / 'none'}")


def test_default_says_why_not_in_one_line(tmp_path):
    lines, say = _say()
    assert S.default_setup(None, None, "10.213.0.1:5000", say, euid=0, state=lambda r: "plain") is None
    assert lines == [f"{S.OFF}: registry 10.213.0.1:5000 speaks plain HTTP, and soci 0.4.1 fetches indexes over "
                     "HTTPS only (`dtrain cluster up` gives the cluster's registry TLS unless --no-lazy; --no-soci "
                     "to say so)"]
    lines.clear()
    assert S.default_setup(None, None, "r:5000", say, euid=1000, state=lambda r: "tls") is None
    assert len(lines) == 1 and "a private one needs root" in lines[0]
    # --no-soci: nothing said, nothing probed
    lines.clear()
    assert S.from_flags(False, True, None, None, "r:5000", say) is None and lines == []
    # a flag that names something absent is an error, default or not
    with pytest.raises(S.SociError, match="not a socket"):
        S.default_setup(None, str(tmp_path / "no.sock"), None, say, euid=0)
    with pytest.raises(S.SociError, match="no `soci`"):
        S.default_setup(str(tmp_path), None, None, say, euid=0)


def test_cluster_registry_bundle_is_trusted_for_soci(tmp_path):
    bundle = tmp_path / "ca-bundle.pem"
    bundle.write_text("pem\n")
    cluster = ("10.213.0.1:5000", bundle)
    lines, say = _say()
    env: dict[str, str] = {}
    S.trust_cluster_ca("elsewhere:5000", say, env, cluster)
    assert env == {} and lines == []
    S.trust_cluster_ca("10.213.0.1:5000", say, env, cluster)
    assert env == {"SSL_CERT_FILE": str(bundle)} and len(lines) == 1
    env = {"SSL_CERT_FILE": "/mine.pem"}
    S.trust_cluster_ca("10.213.0.1:5000", say, env, cluster)
    assert env == {"SSL_CERT_FILE": "/mine.pem"}
    env = {}
    S.trust_cluster_ca("10.213.0.1:5000", say, env, ("10.213.0.1:5000", tmp_path / "absent.pem"))  # classic cluster
    assert env == {}
