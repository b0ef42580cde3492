"""Lazy loading by default where it helps (issue 52): `dtrain cluster up` makes lazy nodes where
the host can (else one line says why), `dtrain push` builds the SOCI index where it can, and
`dtrain launch` takes the lazy path on its own where the node has the snapshotter and the image
its index. The flag choice is pure (cluster.lazy_mode, with its reads passed in); the end-to-end
case, a fresh cluster + push + launch with no lazy flag at all, runs on a simulated cluster of
its own (own_cluster: after the tests on the shared 3-node cluster, which the `cluster` fixture
makes again, classic, where a later test needs it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dtrain import engine
from dtrain.launch.infra import cluster as cl
from dtrain.launch.remote.hosts import parse_hostfile

pytestmark = pytest.mark.second_cluster  # on a second simulated cluster in `dtrain test` (dtrain/suite.py)

ROOT = Path(__file__).resolve().parent.parent


def _lines():
    out: list[str] = []
    return out, out.append


def _root_with_binaries(d: Path) -> Path:
    for name, sub in engine.LAZY_BINARIES.items():
        (d / sub).mkdir(parents=True, exist_ok=True)
        (d / sub / name).write_text("#!/bin/sh\n")
    return d


def _no_fetch() -> Path:
    raise engine.EngineError("lazy loading's binaries: no Debian release source in /etc/apt/sources.list.d/"
                             "debian.sources to fetch soci-snapshotter containerd docker.io (trixie) from")


# ---------------------------------------------------------------- the flags (no cluster)


def test_cluster_up_is_lazy_by_default_where_the_host_can(tmp_path):
    root = _root_with_binaries(tmp_path / "root")
    said, say = _lines()
    mode = cl.lazy_mode("up", False, False, None, say=say, env={}, recorded=lambda: None, fetch=lambda: root)
    assert mode == cl.Lazy(str(root)) and said == []
    # $DTRAIN_LAZY_ROOT names the binaries: taken as they are, nothing fetched
    mode = cl.lazy_mode("up", False, False, None, say=say, env={cl.LAZY_ROOT_ENV: str(root)},
                        recorded=lambda: None, fetch=_no_fetch)
    assert mode == cl.Lazy(str(root))


def test_cluster_up_where_the_host_cannot_is_classic_with_one_line():
    said, say = _lines()
    assert cl.lazy_mode("up", False, False, None, say=say, env={}, recorded=lambda: None, fetch=_no_fetch) is None
    assert said == [f"{cl.LAZY_OFF}: lazy loading's binaries: no Debian release source in /etc/apt/sources.list.d/"
                    "debian.sources to fetch soci-snapshotter containerd docker.io (trixie) from (--lazy insists, "
                    "--no-lazy says so)"]
    # --lazy insists: the same reason is an error, one line
    with pytest.raises(cl.ClusterError, match=r"^--lazy: lazy loading's binaries: no Debian release source"):
        cl.lazy_mode("up", True, False, None, say=say, env={}, recorded=lambda: None, fetch=_no_fetch)


def test_a_classic_cluster_that_is_up_stays_classic_without_recreate(tmp_path):
    root = _root_with_binaries(tmp_path / "root")
    said, say = _lines()
    classic = {"info": {"lazy": False}}
    assert cl.lazy_mode("up", False, False, None, say=say, env={}, recorded=lambda: classic, fetch=lambda: root) is None
    assert len(said) == 1 and "the cluster that is up is classic; `dtrain cluster up --recreate` makes it lazy" in said[0]
    # --recreate, --lazy, or a lazy cluster up: lazy
    for kw in ({"recreate": True}, {}):
        assert cl.lazy_mode("up", bool(not kw), False, None, say=say, env={}, recorded=lambda: classic,
                            fetch=lambda: root, **kw) == cl.Lazy(str(root))
    assert cl.lazy_mode("up", False, False, None, say=say, env={}, recorded=lambda: {"info": {"lazy": True}},
                        fetch=lambda: root) == cl.Lazy(str(root))


def test_no_lazy_and_the_flags_other_actions_refuse(tmp_path):
    said, say = _lines()
    assert cl.lazy_mode("up", False, True, None, say=say, env={}, recorded=lambda: None, fetch=_no_fetch) is None
    assert said == []  # --no-lazy: said by the user, not again
    assert cl.lazy_mode("down", False, False, None, say=say) is None
    for args, msg in ((("up", True, True, None), "--lazy and --no-lazy: pass one"),
                      (("up", False, True, str(tmp_path)), "--lazy-root is for lazy nodes: drop --no-lazy"),
                      (("down", True, False, None), "--lazy is for `cluster up`, not `cluster down`"),
                      (("status", False, True, None), "--no-lazy is for `cluster up`, not `cluster status`"),
                      (("status", False, False, str(tmp_path)), "--lazy-root is for `cluster up`, not `cluster status`")):
        with pytest.raises(cl.ClusterError, match="^" + msg.replace("(", r"\(").replace(")", r"\)")):
            cl.lazy_mode(*args, say=say, env={}, recorded=lambda: None, fetch=_no_fetch)
    # a named root that lacks the binaries is an error, not a fallback
    with pytest.raises(cl.ClusterError, match=r"^--lazy-root .*: usr/bin/soci.* missing"):
        cl.lazy_mode("up", False, False, str(tmp_path / "empty"), say=say, env={}, recorded=lambda: None)


def test_cli_no_lazy_with_lazy_is_one_line_exit_2():
    r = subprocess.run([sys.executable, "-m", "dtrain", "cluster", "status", "--no-lazy"], capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == "error: --no-lazy is for `cluster up`, not `cluster status`", \
        r.stdout + r.stderr


# ---------------------------------------------------------------- the whole path, no lazy flag


def dtrain(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dtrain", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env=env)


@pytest.mark.cluster
@pytest.mark.own_cluster
def test_fresh_cluster_push_launch_without_a_lazy_flag_starts_lazily(_cluster_session, engine, cpu_images, tmp_path):
    """Issue 52's "done when": `dtrain cluster up` + `dtrain push` + `dtrain launch`, no --lazy,
    no --soci, no SSL_CERT_FILE: the nodes mount the image lazily."""
    env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", cl.LAZY_ROOT_ENV, "DTRAIN_SOCI_BIN")}
    # From nothing, as a user's first `cluster up`: a recreate keeps what the nodes before held
    # (the registry's images, a lazy node's snapshots), so a pull would find the layers it needs
    # already there (0 KiB, no new lazy mount) and say nothing of lazy loading.
    r = dtrain("cluster", "down", env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    r = dtrain("cluster", "up", "--nodes", "2", env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "lazy:       nodes load SOCI-indexed images lazily" in r.stdout, r.stdout
    info = cl.status().info
    assert info is not None and info.lazy and len(info.nodes) == 2
    engine.allow_insecure_registry(info.registry)  # the host engine's trust, as for any cluster

    img = cpu_images["pytorch-ddp"]
    r = dtrain("push", "--registry", info.registry, "--image", f"pytorch-ddp:{img.tag}",
               "--catalog", str(tmp_path / "catalog.json"), env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    ref = f"{info.registry}/dtrain/pytorch-ddp:{img.tag}"
    assert f"SOCI index pushed beside {ref}" in r.stdout, r.stdout[-2000:]

    r = dtrain("launch", "--hostfile", info.hostfile, "--ssh-config", info.ssh_config, "--image", ref,
               "--name", "t-lazy-default", "--", "python", "-c", "import torch; print('lazy-ok', torch.__version__)",
               env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    for node in parse_hostfile(info.hostfile):
        assert f"{node.host}  pulled lazily (SOCI): " in out, out[-3000:]
    assert "(2 lazily)" in out and "not lazily" not in out and out.count("lazy-ok") >= 2, out[-3000:]
