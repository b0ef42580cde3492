"""Lazy loading on the simulated cluster (issue 26): `dtrain cluster up --lazy`, `dtrain push
--soci` to its TLS registry, `dtrain doctor`'s lazy-load check and `dtrain launch` saying per
node how the image came.

Real components only: the cluster's nodes run launch/node/lazy-node.sh (Debian 13's
soci-snapshotter-grpc, containerd and dockerd 26, unpacked by engine.ensure_lazy_binaries:
fetched with apt when missing, never skipped), the registry speaks TLS with the cluster's
self-signed certificate. A shape of its own (own_cluster): it runs after the tests on the shared
3-node cluster, which the `cluster` fixture makes again where a test after it needs one.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from dtrain import contract, engine
from dtrain.images import push as P
from dtrain.launch.infra import cluster as cl
from dtrain.launch.jobs.pull import pull_on_nodes
from dtrain.launch.remote.hosts import parse_hostfile

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "tests" / "logs"

pytestmark = [pytest.mark.own_cluster, pytest.mark.second_cluster]  # a shape of its own: after the 3-node tests


@pytest.fixture(scope="module")
def lazy_cluster(_cluster_session):
    info = cl.up(2, recreate=True, quiet=True, lazy=cl.Lazy(str(engine.ensure_lazy_binaries())))
    engine.allow_insecure_registry(info.registry)
    return info


def dtrain(*args: str, env: dict | None = None, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dtrain", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env={**os.environ, **(env or {})})


@pytest.mark.cluster
def test_lazy_nodes_push_soci_doctor_and_launch(lazy_cluster, cpu_images, tmp_path):
    info = lazy_cluster
    assert info.lazy and Path(info.registry_ca).is_file()
    st = cl.status()
    assert st.up, st.problems
    assert "lazy loading (SOCI)" in str(st)

    # the index beside the image, in the cluster's TLS registry
    img = cpu_images["pytorch-ddp"]
    cert = {"SSL_CERT_FILE": info.registry_ca}
    r = dtrain("push", "--registry", info.registry, "--image", f"pytorch-ddp:{img.tag}", "--soci",
               "--soci-bin", str(engine.ensure_lazy_binaries()), "--catalog", str(tmp_path / "catalog.json"), env=cert)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    ref = f"{info.registry}/dtrain/pytorch-ddp:{img.tag}"
    assert f"SOCI index pushed beside {ref}" in r.stdout

    # doctor: every node can lazy-load
    r = dtrain("doctor", "--hostfile", info.hostfile, "--ssh-config", info.ssh_config, timeout=120)
    lazy_rows = [ln for ln in r.stdout.splitlines() if "lazy-load" in ln]
    assert len(lazy_rows) == 2 and all("can lazy-load: storage driver soci" in ln for ln in lazy_rows), r.stdout

    # launch: each node says it pulled lazily, and the job runs; in each container the prefetch
    # (issue 52) read what the image's list names, before or beside the job's own import
    wait = (f"import json, os, time; t = time.time()\nwhile not os.path.exists({contract.PREFETCH_DONE!r}) and "
            f"time.time() - t < 120: time.sleep(0.1)\nprint('prefetched', open({contract.PREFETCH_DONE!r}).read())\n"
            "import torch; print('lazy-ok', torch.__version__)")
    r = dtrain("launch", "--hostfile", info.hostfile, "--ssh-config", info.ssh_config, "--image", ref,
               "--name", "t-lazy", "--", "python", "-c", wait, env=cert, timeout=400)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    for node in parse_hostfile(info.hostfile):
        assert f"{node.host}  pulled lazily (SOCI): " in out, out[-3000:]
    assert "mounted lazily in" in out
    assert "(2 lazily)" in out and out.count("lazy-ok") >= 2
    done = [json.loads(m) for m in re.findall(r"prefetched (\{.*\})", out)]
    assert len(done) >= 2, out[-3000:]
    # pytorch-ddp's list: ~1,900 files, ~150 MiB (libtorch's pages the most); every one a file
    assert all(d["files"] > 1000 and d["bytes"] > 100 * 2**20 and d["skipped"] == 0 for d in done), done


@pytest.mark.cluster
def test_an_image_without_index_is_pulled_in_full_and_said_so(lazy_cluster, tmp_path):
    """A lazy node falls back to a full pull where the registry has no index for the image."""
    info = lazy_cluster
    src = tmp_path / "rootfs"
    src.mkdir()
    (src / "hello.txt").write_text(f"no index {uuid.uuid4()}\n")
    ref = f"{info.registry}/dtrain/noindex:{uuid.uuid4().hex[:8]}"
    tar = subprocess.run(["tar", "-C", str(src), "-c", "."], capture_output=True, check=True).stdout
    subprocess.run([P.DOCKER, "import", "-", ref], input=tar, capture_output=True, check=True)
    try:
        subprocess.run([P.DOCKER, "push", "-q", ref], capture_output=True, check=True, timeout=120)
        out = io.StringIO()
        nodes = parse_hostfile(info.hostfile)
        progress = pull_on_nodes(nodes, ref, ssh_opts=("-F", info.ssh_config), out=out, tty=False)
    finally:
        subprocess.run([P.DOCKER, "image", "rm", ref], capture_output=True)
    text = out.getvalue()
    assert all(p.state == "pulled" and p.driver == "soci" and p.lazy_layers == 0 for p in progress), text
    # soci 0.4.1's own fetch of the index-less layer gave up after two retries (cluster.soci_config),
    # not after the 8 that cost ~8 s per layer
    for node in info.nodes:
        log = (Path(node.state_dir) / "soci.log").read_text()
        assert "giving up after 3 attempt(s)" in log and "giving up after 9 attempt(s)" not in log, log[-2000:]
    assert text.count("full pull on a lazy-loading node") == 2, text
    print(text)  # the sample of tests/logs/lazy-full-pull.log
