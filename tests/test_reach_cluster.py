"""`nodes ssh`, `nodes ssh-config` and `exec` on the simulated cluster (issue 49): `local` reaches
every node, on its host and inside a job's container."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dtrain import ROOT, contract

pytestmark = pytest.mark.cluster

HOSTILE = ["$(id)", "a;b", "`id`", "two words", "it's", "*"]


def dtrain(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dtrain", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, cwd=ROOT, env=os.environ.copy())


def test_exec_and_nodes_ssh_reach_every_node(cluster):
    r = dtrain("exec", "--cluster", "local", "--", "hostname")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == [f"[node-{i}] node-{i}" for i in range(1, len(cluster.nodes) + 1)]
    r = dtrain("exec", "--cluster", "local", "--", "printf", "%s\\n", *HOSTILE)
    assert r.returncode == 0, r.stderr
    for i in range(1, len(cluster.nodes) + 1):  # each node's lines in order, the words literal
        assert [ln for ln in r.stdout.splitlines() if ln.startswith(f"[node-{i}] ")] == [
            f"[node-{i}] {w}" for w in HOSTILE]
    for i, node in enumerate(cluster.nodes, 1):
        for which in (str(i), node.address):
            r = dtrain("nodes", "ssh", "local", which, "--", "hostname")
            assert (r.returncode, r.stdout) == (0, f"{node.name}\n"), r.stderr
    r = dtrain("nodes", "ssh", "local", str(len(cluster.nodes) + 1), "--", "true")
    assert (r.returncode, r.stdout) == (2, "") and "has nodes 1 to" in r.stderr


def test_exec_fails_naming_the_failed_nodes(cluster):
    r = dtrain("exec", "--cluster", "local", "--", "sh", "-c", 'test "$(hostname)" = node-1 || exit 5')
    assert r.returncode == 1 and r.stdout == ""
    others = [f"node-{i}" for i in range(2, len(cluster.nodes) + 1)]
    assert r.stderr.startswith(f"error: sh failed on {len(others)} of {len(cluster.nodes)} nodes: node-2 (")
    assert all(f"{n} (" in r.stderr for n in others) and "node-1 (" not in r.stderr
    assert len(r.stderr.splitlines()) == 1


def test_the_written_ssh_config_reaches_every_node(cluster):
    r = dtrain("nodes", "ssh-config", "local", "--write", "--force")
    assert r.returncode == 0, r.stderr
    path = r.stdout.split("wrote ", 1)[1].split(";", 1)[0]
    for i, node in enumerate(cluster.nodes, 1):
        r = subprocess.run(["ssh", "-F", path, "-o", "BatchMode=yes", f"dtrain-local-{i}", "hostname"],
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert (r.returncode, r.stdout) == (0, f"{node.name}\n"), r.stderr


def test_exec_in_the_jobs_container(cluster, remote_images):
    image = next(iter(remote_images.values()))
    name = "dtrain-reachtest"
    try:
        r = dtrain("exec", "--cluster", "local", "--container", "--job", "reachtest", "--", "true")
        assert r.returncode == 1 and "no container of job reachtest is running on node-1" in r.stdout, r.stderr
        assert r.stderr.startswith(f"error: true failed on {len(cluster.nodes)} of {len(cluster.nodes)} nodes: ")
        r = dtrain("exec", "--cluster", "local", "--", "docker", "run", "-d", "--name", name, "--network", "none",
                   "--label", f"{contract.LABEL_JOB}=reachtest", "--entrypoint", "sleep", image, "600", timeout=900)
        assert r.returncode == 0, r.stdout + r.stderr
        r = dtrain("exec", "--cluster", "local", "--container", "--job", "reachtest", "--",
                   "sh", "-c", 'printf "%s|" "$@"; echo; cat /proc/1/comm', "sh", *HOSTILE)
        assert r.returncode == 0, r.stdout + r.stderr
        for i in range(1, len(cluster.nodes) + 1):  # inside the container: pid 1 is its sleep
            assert [ln for ln in r.stdout.splitlines() if ln.startswith(f"[node-{i}] ")] == [
                f"[node-{i}] " + "".join(f"{w}|" for w in HOSTILE), f"[node-{i}] sleep"]
        r = dtrain("exec", "--cluster", "local", "--container", "--", "cat", "/proc/1/comm")  # the only one
        assert r.returncode == 0 and r.stdout.count("] sleep") == len(cluster.nodes), r.stdout + r.stderr
        r = dtrain("exec", "--cluster", "local", "--container", "--job", "other", "--", "true")
        assert r.returncode == 1 and "no container of job other is running on node-1" in r.stdout
        assert "[node-1] " in r.stdout  # the node's own words, tagged
    finally:
        dtrain("exec", "--cluster", "local", "--", "docker", "rm", "-f", name)
