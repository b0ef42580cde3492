"""Nodes that share one home directory (issue 38), as NFS /home on AWS ParallelCluster and most
Slurm clusters: 4 simulated nodes whose /root is one host directory (cluster.up(shared=...)).
Every launch makes the job's directory anew on every node at the same moment; each node's is
its own (~/.dtrain/nodes/HOST/jobs/NAME), so relaunches of one name pass on all 4 and no node
makes, locks or removes another's. A shape of its own (own_cluster): it runs after the tests on
the shared 3-node cluster, which the `cluster` fixture makes again where a test after it needs one.
"""

from __future__ import annotations

import io
import re
import threading
import time
from pathlib import Path

import pytest

from dtrain.launch.jobs import store
from dtrain.launch.jobs.job import Job
from dtrain.launch.jobs.store import job_log
from test_launch import containers_left, nodes_of, spec

pytestmark = [pytest.mark.cluster, pytest.mark.own_cluster, pytest.mark.second_cluster]  # a shape of its own: after the 3-node tests

ROOT = Path(__file__).resolve().parent.parent
NODES = 4
HOSTS = [f"node-{i}" for i in range(1, NODES + 1)]


@pytest.fixture
def shared_home(shared_home_cluster):
    """(cluster, the host directory that is every node's home, the image's ref in its registry)."""
    return shared_home_cluster


def _node_dirs(home: Path, name: str) -> list[Path]:
    return [home / ".dtrain" / "nodes" / h / "jobs" / name for h in HOSTS]


def _left(home: Path, name: str) -> list[str]:
    """What of job `name` is left in the shared home: any node's directory or lock of it."""
    return sorted(str(p.relative_to(home)) for p in (home / ".dtrain" / "nodes").glob(f"*/jobs/{name}*"))


def _wait_clean(info, home: Path, name: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while (_left(home, name) or containers_left(info, name)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _left(home, name) == [] and containers_left(info, name) == []


class _Watch(threading.Thread):
    """While a job runs: each node's job directory as the shared home holds it, once every rank
    has left its mark there (`here-HOST`): {directory: the marks in it}."""

    def __init__(self, home: Path, name: str) -> None:
        super().__init__(daemon=True)
        self.home, self.name, self.seen, self.done = home, name, {}, threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            marks = sorted((self.home / ".dtrain" / "nodes").glob(f"*/jobs/{self.name}/here-*"))
            if len(marks) >= NODES:
                self.seen = {d: sorted(p.name for p in d.glob("here-*")) for d in {m.parent for m in marks}}
                return
            time.sleep(0.05)


# Each rank marks its node's job directory (mounted at /dtrain-job), then, once every rank had
# time to, says what marks it sees there: only its own where each node's directory is its own.
RANK = ("touch /dtrain-job/here-$(hostname); sleep 4; "
        "echo \"sees $(cd /dtrain-job && echo here-*) workdir $(cat /workdir/marker)\"")


def test_relaunches_of_one_name_pass_on_4_nodes_that_share_a_home(shared_home, tmp_path):
    info, home, image = shared_home
    name = "t-shared-home"
    proj = tmp_path / "proj"
    proj.mkdir()
    for launch in range(4):
        (proj / "marker").write_text(f"v{launch}")
        said: list[str] = []
        watch = _Watch(home, name)
        watch.start()
        job = Job(spec(info, image, ["bash", "-c", RANK], name, workdir=str(proj)), nodes_of(info, NODES),
                  say=said.append)
        try:
            code = job.run()
        finally:
            watch.done.set()
        out = job_log(name).read_text()
        assert code == 0, f"launch {launch}:\n{out}"
        # each node's own directory, with its own rank's mark only, seen from the shared home ...
        assert watch.seen == {d: [f"here-{d.parent.parent.name}"] for d in _node_dirs(home, name)}, (launch, watch.seen)
        # ... and from inside each container
        sees = sorted(re.findall(r"^\[(node-\d) r\d\] sees (\S+) workdir (\S+)$", out, re.M))
        assert sees == [(h, f"here-{h}", f"v{launch}") for h in HOSTS], out
        # --workdir: one file, sent to each node's own directory and kept in each node's cache
        sent = next(m for m in said if m.startswith("[launch] workdir"))
        assert re.findall(r": (\d+) changed", sent) == ["1"] * NODES, sent
        for h in HOSTS:
            cache = list((home / ".dtrain" / "nodes" / h / "workdir-cache").iterdir())
            assert len(cache) == 1 and (cache[0] / "marker").read_text() == f"v{launch}", (h, cache)
        _wait_clean(info, home, name)
    assert sorted(p.name for p in (home / ".dtrain" / "nodes").iterdir()) == HOSTS
    assert not (home / ".dtrain" / "node-jobs").exists()


def test_a_detached_job_on_nodes_that_share_a_home_is_read_and_stopped_through_its_first_node(shared_home):
    """status and logs read the first node's own output.log and state.json (host/prepare.sh
    job_file); stop removes every node's own part."""
    info, home, image = shared_home
    name = "t-shared-detach"
    job = Job(spec(info, image, ["bash", "-c", "echo rank on $(hostname); sleep 2"], name, detach=True),
              nodes_of(info, NODES), say=lambda m: None)
    assert job.run() == 0
    deadline = time.monotonic() + 120
    while (state := store.detached_state(store.load_job(name)).get("state")) != "succeeded":
        assert time.monotonic() < deadline and state in ("running", None), state
        time.sleep(1)
    out = io.StringIO()
    assert store.node_logs(store.load_job(name), follow=False, out=out) == 0
    assert sorted(re.findall(r"^\[(node-\d) r\d\] rank on (node-\d)$", out.getvalue(), re.M)) == \
        [(h, h) for h in HOSTS], out.getvalue()
    first = _node_dirs(home, name)[0]
    deadline = time.monotonic() + 60  # each node's watchdog removes its part; the first keeps log and state
    def kept() -> tuple[list[str], list[str]]:
        return _left(home, name), sorted(p.name for p in first.iterdir()) if first.is_dir() else []

    while kept() != ([str(first.relative_to(home))], ["output.log", "state.json"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert kept() == ([str(first.relative_to(home))], ["output.log", "state.json"])
    assert store.stop(name) == name
    _wait_clean(info, home, name)
