"""The network gate on the simulated cluster: `dtrain launch --check-network` runs the job where
every link is as fast as its peers', and fails naming the node whose link is throttled (tc, the
cluster's per-node link rate), leaving nothing on any node."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from dtrain.launch.infra import cluster as cl
from dtrain.launch.infra import netns as nx
from dtrain.launch.analysis import timeline
from dtrain.launch.jobs.store import job_log, load_job
from dtrain.launch.remote.hosts import parse_hostfile

pytestmark = pytest.mark.cluster

DTRAIN = str(Path(sys.executable).parent / "dtrain")
SLOW = "50mbit"


def _launch(cluster, image: str, name: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([DTRAIN, "launch", "--hostfile", cluster.hostfile, "--ssh-config", cluster.ssh_config,
                           "--image", image, "--name", name, "--check-network", *extra, "--",
                           "python", "-c", "print('job ran')"], capture_output=True, text=True, timeout=400)


def _left_on_nodes(cluster, name: str) -> list[str]:
    """The job's containers (any dtrain-* one), key directory and job directory, on every node."""
    left = []
    for i in range(1, len(cluster.nodes) + 1):
        r = cl.node_exec(i, ["sh", "-c", f"docker ps -aq --filter name=dtrain-; ls -d /dev/shm/dtrain-{name} "
                                         f"$HOME/.dtrain/nodes/$(hostname)/jobs/{name} 2>/dev/null; true"])
        left += [f"node-{i}: {x}" for x in r.stdout.split()]
    return left


def test_check_network_runs_the_job_and_names_a_throttled_node(cluster, remote_images):
    image = remote_images["pytorch-ddp"]
    ok = _launch(cluster, image, "t-gate-ok")  # first: the image onto every node at full speed
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "[launch] network gate: 3 node(s), rate min" in ok.stdout, ok.stdout
    assert len(re.findall(r"^\[node-\d r\d\] job ran$", ok.stdout, re.M)) == 3, ok.stdout
    # the gate is a phase of the launch's timeline, every node's row: the log's table and the record's
    assert re.search(r"^\[launch\] timeline launch .*\bnetwork-gate\b", ok.stdout, re.M), ok.stdout
    gated = [e for e in timeline.from_json(load_job("t-gate-ok")["timeline"]) if e.phase == "network-gate"]
    assert sorted(e.node for e in gated) == sorted(n.host for n in parse_hostfile(cluster.hostfile)) and all(e.seconds > 0 for e in gated)
    try:
        cl.set_link_rate(3, nx.parse_rate(SLOW))
        slow = _launch(cluster, image, "t-gate-slow")
    finally:
        cl.set_link_rate(3, None)
    assert slow.returncode == 2, slow.stdout + slow.stderr
    errors = [line for line in slow.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, slow.stderr
    assert errors[0].startswith("error: network gate: slow link on node-3 (10.213.0.13): "), errors
    assert "Mbit/s, below 50% of its peers' median" in errors[0] and "node-1" not in errors[0] \
        and "node-2" not in errors[0], errors
    assert not re.search(r"^\[node-\d r\d\] job ran$", slow.stdout, re.M), slow.stdout
    assert _left_on_nodes(cluster, "t-gate-slow") == []
    # the job's log keeps the error line: diagnose, run on the job by name, finds slow-link on node-3
    diag = subprocess.run([DTRAIN, "diagnose", "t-gate-slow"], capture_output=True, text=True, timeout=60)
    assert diag.returncode == 1 and "slow-link" in diag.stdout and "node-3" in diag.stdout, \
        diag.stdout + diag.stderr + job_log("t-gate-slow").read_text()


def test_with_a_spare_the_throttled_node_is_taken_out_and_the_spare_runs_in_its_place(cluster, remote_images):
    """node-1 (rank 0, where the supervisor would run) is throttled; node-3 is the spare: the gate
    names node-1, the spare takes rank 0 (the supervisor runs there), the job runs on node-3 and
    node-2, and node-1 keeps nothing of the job."""
    image = remote_images["pytorch-ddp"]
    try:
        cl.set_link_rate(1, nx.parse_rate(SLOW))
        r = _launch(cluster, image, "t-gate-spare", "--spares", "1")
    finally:
        cl.set_link_rate(1, None)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^\[launch\] node-1 taken out before the start: slow link: ", r.stdout, re.M), r.stdout
    assert sorted(re.findall(r"^\[(node-\d) r\d\] job ran$", r.stdout, re.M)) == ["node-2", "node-3"], r.stdout
    assert "supervised there" in r.stdout and "on node-3, supervised there" in r.stdout, r.stdout
    assert _left_on_nodes(cluster, "t-gate-spare") == []
