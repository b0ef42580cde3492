"""`dtrain demo` (README's first command) on a machine where the user's simulated cluster of that
size is already up: the demo runs on it and leaves it up (review of issue 25: it took it down)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.second_cluster  # on a second simulated cluster in `dtrain test` (dtrain/suite.py)

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.docker
@pytest.mark.cluster
def test_demo_leaves_a_cluster_that_was_up_before_it(cluster, tmp_path):
    from dtrain.launch.infra import cluster as cl

    nodes = len(cluster.nodes)
    r = subprocess.run([sys.executable, "-m", "dtrain", "demo", "--nodes", str(nodes), "--epochs", "1"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=480,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert f"[cluster] already up with {nodes} node(s)" in out, out[-4000:]
    # the host step checks the engine, the build after it does not again (it said so twice)
    assert out.count("[dtrain] docker engine is") == 1, out[:2000]
    assert "epoch 1 mean loss over" in out, out[-4000:]
    assert "[demo] cluster kept (it was up before the demo)" in out and "[cluster] down" not in out, out[-4000:]
    st = cl.status()
    assert st.up and st.nodes == nodes and st.info == cluster, str(st)
