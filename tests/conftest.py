"""Shared integration fixtures: the real engine, the CPU images, the simulated cluster.

Nothing here skips: when a component cannot start, the fixture raises and the tests that
need it fail. Images are built once per session (cached by layer across sessions on the
same machine); the cluster comes up once with 3 nodes and goes down at the end.

What keeps the suite's time down (docs/benchmarks.md, "The test suite's time"): the 3-node
cluster is made once and every test that needs it runs on it, the modules marked `own_cluster`
(a cluster of another shape: size, lazy, shared directories) run after all of them
(pytest_collection_modifyitems; tests/test_suite_order.py), a recreate keeps the registry's
images (cluster.up), and `remote_images` pushes only where the registry does not hold what this
session pushed (not before every test).
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


def pytest_configure(config):
    config.addinivalue_line("markers", "own_cluster(takes_down=False): brings up a simulated cluster of its own "
                                       "shape (size, lazy, shared directories): runs after every test on the shared "
                                       "3-node cluster; takes_down: it takes the cluster down (its registry too): "
                                       "after the other own_cluster modules")


def _cluster_order(item) -> tuple[int, int]:
    own = item.get_closest_marker("own_cluster")
    return (0, 0) if own is None else (1, int(bool(own.kwargs.get("takes_down"))))


def pytest_collection_modifyitems(session, config, items):
    """The tests on the shared 3-node cluster first, the `own_cluster` modules after them (those
    that take the cluster down last), each in the order collected: a shape is made once, never the
    3-node cluster again after one of them (a cluster made again costs every node's pulls), and
    each recreate keeps the registry's images (cluster.up) for the next shape's pushes."""
    items[:] = sorted(items, key=_cluster_order)


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


@pytest.fixture(scope="session")
def _shared_home_dir(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("shared-home")
    home.chmod(0o700)
    return home


@pytest.fixture
def shared_home_cluster(_cluster_session, engine, cpu_images, _shared_home_dir):
    """(cluster, the host directory that is every node's home, the pytorch-ddp CPU image's ref in
    its registry): 4 simulated nodes whose /root is one host directory (cluster.up(shared=...)),
    made once for every own_cluster module of that shape (tests/test_shared_home.py,
    tests/test_spare_join_cluster.py: the second finds it up, the image on every node)."""
    import os

    from dtrain.images import push as P
    from dtrain.images.spec import load_all
    from dtrain.launch.infra import cluster as cl

    # the home of the nodes' ssh user (root), as its sessions get it
    info = cl.up(4, recreate=True, quiet=True, shared={os.path.expanduser("~root"): str(_shared_home_dir)})
    engine.allow_insecure_registry(info.registry)
    if info.registry not in _shared_home_pushed:  # once a session (a recreate keeps the registry's images)
        imgs = [i for i in load_all() if not i.gpu and i.family == "pytorch-ddp"]
        root = Path(__file__).resolve().parent.parent
        _shared_home_pushed[info.registry] = P.push_registry(
            imgs, info.registry, catalog_path=root / "build" / "test-catalog-shared-home.json")[0].remote
    return info, _shared_home_dir, _shared_home_pushed[info.registry]


_shared_home_pushed: dict[str, str] = {}  # registry -> the pytorch-ddp CPU image's ref there


@pytest.fixture
def nic_down(cluster):
    """nic_down(i): a context in which simulated node i's NIC (its veth on the host, dtv<index>;
    another slot's prefix on a second cluster) is down, giving its address: how a test makes a node
    unreachable (never an address where no node is). Up again after, whatever happened inside."""
    import contextlib

    from dtrain.launch.infra import cluster as cl

    @contextlib.contextmanager
    def down(i: int):
        node = cluster.nodes[i - 1]
        veth = f"{cl.VETH_PREFIX}{node.index}"
        subprocess.run(["ip", "link", "set", veth, "down"], check=True)
        try:
            yield node.address
        finally:
            subprocess.run(["ip", "link", "set", veth, "up"], check=True)

    return down


def registry_digest(ref: str) -> str | None:
    """The manifest digest the (plain-HTTP) registry holds for REGISTRY/REPO:TAG, None if none."""
    import urllib.error
    import urllib.request

    registry, _, rest = ref.partition("/")
    repo, _, tag = rest.rpartition(":")
    req = urllib.request.Request(f"http://{registry}/v2/{repo}/manifests/{tag}", method="HEAD", headers={
        "Accept": "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"})
    try:  # no proxy: the cluster's registry is on this machine's bridge
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=10) as r:
            return r.headers.get("Docker-Content-Digest")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise


_PUSHED: dict[str, tuple[str, str]] = {}  # remote ref -> (local image ID, digest) this session pushed


@pytest.fixture
def remote_images(cluster, cpu_images):
    """CPU images pushed to the cluster's registry: {family: remote ref}. Pushed (and verified
    by pulling back) unless the registry holds the digest this session pushed of the same local
    image: once per cluster, not once per test (the 81 tests that use it each pushed all four)."""
    from dtrain.images import push as p
    from dtrain.images.spec import load_all

    imgs = [i for i in load_all() if not i.gpu]
    refs = {i.family: p.remote_ref(cluster.registry, p.REPO_PREFIX, i.family, i.tag) for i in imgs}

    def pushed(img) -> bool:
        ref = refs[img.family]
        was = _PUSHED.get(ref)
        return (was is not None and (p.inspect_image(p.local_ref(img)) or {}).get("Id") == was[0]
                and registry_digest(ref) == was[1])

    if not all(pushed(i) for i in imgs):
        results = p.push_registry(imgs, cluster.registry, catalog_path=ROOT / "build" / "test-catalog.json")
        _PUSHED.update({r.remote: (r.entry["image_id"], r.digest) for r in results})
        refs = {r.entry["family"]: r.remote for r in results}
    return refs


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
