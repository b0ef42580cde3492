"""Shared integration fixtures: the real engine, the CPU images, the simulated cluster.

Nothing here skips: when a component cannot start, the fixture raises and the tests that
need it fail. Images are built once per session (cached by layer across sessions on the
same machine); the cluster comes up once with 3 nodes and goes down at the end.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

# Ctrl-C as a terminal delivers it, whatever started the suite: a shell that runs it in the
# background (or nohup) starts it with SIGINT ignored, which Python, and every program it
# starts, would inherit; then no Ctrl-C test can interrupt anything. A handler (unlike an
# ignored signal) is reset to the default in every program the tests start.
signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parent.parent
WHEELS = Path("/opt/wheels")
CLUSTER_NODES = 3


@pytest.fixture(scope="session", autouse=True)
def dtrain_home(tmp_path_factory):
    """Job records of this test session stay out of ~/.dtrain."""
    import os

    os.environ["DTRAIN_HOME"] = str(tmp_path_factory.mktemp("dtrain-home"))


@pytest.fixture(scope="session")
def engine():
    from dtrain import engine as e

    e.ensure_all()
    return e


@pytest.fixture(scope="session")
def ca_bundle(tmp_path_factory) -> Path:
    """The host's CA bundle plus a freshly generated marker CA: the secret-scan test looks
    for the marker in every layer, so a leak of the bundle cannot go unnoticed."""
    from dtrain.images.build import default_ca_bundle

    d = tmp_path_factory.mktemp("ca")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ed25519", "-nodes", "-days", "1",
                    "-subj", "/CN=dtrain secret-scan marker CA", "-keyout", str(d / "marker.key"),
                    "-out", str(d / "marker.pem")], check=True, capture_output=True)
    host = default_ca_bundle()
    bundle = d / "ca-bundle.pem"
    bundle.write_text((host.read_text() if host else "") + (d / "marker.pem").read_text())
    return bundle


@pytest.fixture(scope="session")
def pip_conf(tmp_path_factory) -> Path:
    """A harmless pip.conf with a marker line, passed as the pipconf secret."""
    path = tmp_path_factory.mktemp("pip") / "pip.conf"
    path.write_text("[global]\ndisable-pip-version-check = true\n# dtrain-pipconf-marker-7f3a9c\n")
    return path


@pytest.fixture(scope="session")
def cpu_images(engine, ca_bundle, pip_conf):
    """Build the CPU variant of every family; returns {family: BuildResult}."""
    from dtrain.images import build as b

    opts = b.BuildOptions(base_image=engine.BASE_IMAGE, ca_bundle=ca_bundle, pip_conf=pip_conf,
                          wheelhouse=WHEELS if WHEELS.is_dir() else None)
    results = b.build(None, None, False, opts)
    return {r.family: r for r in results}


@pytest.fixture(scope="session")
def _cluster_session(engine):
    from dtrain.launch.infra import cluster as cl

    yield
    cl.down()


@pytest.fixture
def cluster(_cluster_session, engine):
    """The shared 3-node cluster, (re)made if another test module took it down: `up` is a
    no-op when it is already healthy with this size."""
    from dtrain.launch.infra import cluster as cl

    info = cl.up(CLUSTER_NODES, recreate=True, quiet=True)
    engine.allow_insecure_registry(info.registry)
    return info


@pytest.fixture
def nic_down(cluster):
    """nic_down(i): a context in which simulated node i's NIC (its veth on the host, dtv<index>)
    is down, giving its address: how a test makes a node unreachable (never an address where no
    node is). Up again after, whatever happened inside."""
    import contextlib

    @contextlib.contextmanager
    def down(i: int):
        node = cluster.nodes[i - 1]
        subprocess.run(["ip", "link", "set", f"dtv{node.index}", "down"], check=True)
        try:
            yield node.address
        finally:
            subprocess.run(["ip", "link", "set", f"dtv{node.index}", "up"], check=True)

    return down


@pytest.fixture
def remote_images(cluster, cpu_images):
    """CPU images pushed to the cluster's registry: {family: remote ref}."""
    from dtrain.images import push as p
    from dtrain.images.spec import load_all

    imgs = [i for i in load_all() if not i.gpu]
    results = p.push_registry(imgs, cluster.registry, catalog_path=ROOT / "build" / "test-catalog.json")
    return {r.entry["family"]: r.remote for r in results}


# ---------------------------------------------------------------- AWS: moto only, on loopback


@pytest.fixture
def moto_server():
    """A moto server on 127.0.0.1 (a free port), for the real CLI in a subprocess."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws(monkeypatch):
    """In-process moto with fake credentials: a boto3 session in us-east-1."""
    import boto3
    from moto import mock_aws

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    with mock_aws():
        yield boto3.session.Session(region_name="us-east-1")
