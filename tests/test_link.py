"""A lost link or a full disk never hangs (issue 22): on the simulated cluster, a node's link
goes down (its host-side veth), or its job directory is a small full tmpfs."""

from __future__ import annotations

import io
import re
import subprocess
import threading
import time

import pytest

from dtrain import contract
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import store
from dtrain.launch.jobs.job import Job
from dtrain.launch.jobs.store import job_log
from test_launch import containers_left, nodes_of, on_node, spec
from test_wholerun import _link, _node_files, _ticks, _wait_clean, _when_in_log

pytestmark = [pytest.mark.cluster, pytest.mark.second_cluster]

KEEPALIVE_S = contract.SSH_KEEPALIVE_INTERVAL_S * contract.SSH_KEEPALIVE_COUNT


def test_the_first_nodes_link_lost_under_an_attached_launch_ends_it_naming_the_node(cluster, remote_images):
    name = "t-lostfirst"
    first = cluster.nodes[0].address
    down_at: list[float] = []

    def down() -> None:
        _link(cluster, 1, "down")
        down_at.append(time.monotonic())

    _when_in_log(name, r"\] tick 2 node-1$", down)
    job = Job(spec(cluster, remote_images["pytorch-ddp"], _ticks(600), name, heartbeat_timeout=20),
              nodes_of(cluster, 3), say=lambda m: None)
    try:
        with pytest.raises(LaunchError) as e:
            job.run()
        ended = time.monotonic()
    finally:
        _link(cluster, 1, "up")
    assert down_at, job_log(name).read_text()
    assert ended - down_at[0] < 30, f"the launch took {ended - down_at[0]:.0f} s to notice"
    assert f"lost the connection to {first} (node-1), the job's first node" in str(e.value), e.value
    # node-1's supervisor stops the job once the launcher is silent; each node's watchdog
    # removes what is left (node-2 and node-3 were torn down by the launcher).
    _wait_clean(cluster, name, timeout=120)


def test_a_launch_to_an_unreachable_host_fails_within_two_connect_timeouts(cluster, remote_images):
    name = "t-unreach"
    _link(cluster, 3, "down")
    t0 = time.monotonic()
    try:
        with pytest.raises(LaunchError) as e:
            Job(spec(cluster, remote_images["pytorch-ddp"], ["true"], name), nodes_of(cluster, 3),
                say=lambda m: None).run()
        took = time.monotonic() - t0
    finally:
        _link(cluster, 3, "up")
    # one connect timeout (10 s), one retry, and no second wait on it in teardown: before, 3
    # attempts and teardown's own retries took 64 s. The margin is for the 2 healthy nodes'
    # rounds on 2 shared cores (31 s seen in a CI run with other work beside it, 36.5 to 40.3 s
    # in whole runs here with both cluster parts beside it); the attempt count is asserted below.
    assert took < 2 * 10 + 30, f"took {took:.0f} s: {e.value}"
    assert re.search(rf"preparing the job's directory failed on 1 of 3 hosts:\n  {cluster.nodes[2].address}: "
                     r"ssh could not connect \(2 attempts\)", str(e.value)), e.value
    assert containers_left(cluster, name) == [] and _node_files(cluster, name) == []


def _detached(cluster, remote_images, name: str) -> dict:
    job = Job(spec(cluster, remote_images["pytorch-ddp"], _ticks(600), name, detach=True, heartbeat_timeout=20),
              nodes_of(cluster, 3), say=lambda m: None)
    assert job.run() == 0
    return store.load_job(name)


def test_logs_follow_of_a_detached_job_ends_when_the_first_nodes_link_is_lost(cluster, remote_images):
    name = "t-lostfollow"
    record = _detached(cluster, remote_images, name)
    out = io.StringIO()
    result: list[object] = []

    def follow() -> None:
        try:
            result.append(store.node_logs(record, follow=True, out=out))
        except LaunchError as e:
            result.append(e)

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 120
        while " tick 2 node-1" not in out.getvalue():
            assert time.monotonic() < deadline and t.is_alive(), out.getvalue()
            time.sleep(0.2)
        _link(cluster, 1, "down")
        t0 = time.monotonic()
        t.join(KEEPALIVE_S + 15)
        took = time.monotonic() - t0
    finally:
        _link(cluster, 1, "up")
    assert not t.is_alive(), "logs --follow still waits on a lost link"
    assert took < KEEPALIVE_S + 10, took
    assert isinstance(result[0], LaunchError), result
    assert f"{cluster.nodes[0].address}: lost the connection to the job's first node" in str(result[0]), result[0]
    store.stop(name)
    _wait_clean(cluster, name, timeout=120)


def test_status_asks_unreachable_nodes_at_once(cluster, tmp_path, monkeypatch):
    """Three detached jobs whose first nodes do not answer: about one connect timeout in all."""
    monkeypatch.setenv("DTRAIN_HOME", str(tmp_path))
    nodes = nodes_of(cluster, 3)
    for i, n in enumerate(nodes):
        store.record(f"t-status-{i}", name=f"t-status-{i}", state="detached", launcher="mpirun",
                     nodes=[{"host": n.host, "slots": n.slots, "user": n.user, "port": n.port}],
                     ssh_opts=["-F", cluster.ssh_config], image="x", first=n.host)
    for i in (1, 2, 3):
        _link(cluster, i, "down")
    try:
        t0 = time.monotonic()
        store.detached_state(store.load_job("t-status-0"))
        one = time.monotonic() - t0
        t0 = time.monotonic()
        rows = store.status_rows()
        took = time.monotonic() - t0
    finally:
        for i in (1, 2, 3):
            _link(cluster, i, "up")
    assert [r[1] for r in rows[1:]] == ["detached: no answer from its first node"] * 3, rows
    assert took < one * 1.5 + 2, f"status took {took:.1f} s, one node {one:.1f} s"


def test_a_full_job_directory_ends_the_job_naming_the_node_and_the_path(cluster, remote_images):
    """node-1's job directories on a 1 MiB tmpfs, filled while the job runs: the supervisor
    cannot append to output.log; the job ends with an error naming the node and the file."""
    name = "t-full"
    jobs = "~/.dtrain/nodes/$(hostname)/jobs"
    on_node(cluster, 1, f"mkdir -p {jobs} && mount -t tmpfs -o size=1m dtrain-full {jobs}")
    filled: list[float] = []

    def fill() -> None:
        on_node(cluster, 1, f"dd if=/dev/zero of={jobs}/fill bs=64k >/dev/null 2>&1; true")
        filled.append(time.monotonic())

    _when_in_log(name, r"^\[node-1 r0\] tick 20 x", fill)
    try:
        job = Job(spec(cluster, remote_images["pytorch-ddp"],
                       ["python", "-c", "import time\nfor i in range(3000):\n"
                        "    print('tick', i, 'x' * 80, flush=True); time.sleep(0.02)"], name),
                  nodes_of(cluster, 2), say=lambda m: None)
        code = job.run()
        ended = time.monotonic()
        out = job_log(name).read_text()
    finally:
        on_node(cluster, 1, f"umount {jobs}", check=False)
    assert filled, out
    assert code == 1, out
    assert ended - filled[0] < 30, f"{ended - filled[0]:.0f} s after the disk filled"
    m = re.search(r"^\[launch\] job failed \(exit 1\): cannot write (\S+)/output\.log on node-1 "
                  rf"\({cluster.nodes[0].address}\): No space left on device", out, re.M)
    assert m and m.group(1).endswith(f"/.dtrain/nodes/node-1/jobs/{name}"), out[-3000:]
    _wait_clean(cluster, name)


def test_a_watchdog_that_cannot_write_its_pid_file_still_removes_the_key(cluster):
    """watch.sh in a full job directory (its pid file cannot be written): when the job's
    container is gone it still removes the key directory and the job's files."""
    name = "t-wdfull"
    keys = contract.node_key_dir(name)
    script = contract.node_script("watch.sh")
    on_node(cluster, 1, f"""set -e
d=$(mktemp -d /tmp/dtrain-wdfull.XXXXXX); echo "$d" > /tmp/dtrain-wdfull.path
mount -t tmpfs -o size=64k dtrain-wdfull "$d"; mkdir "$d/job"
mkdir -p {keys}; echo key > {keys}/id_ed25519; echo A=Yg== > {keys}/env
dd if=/dev/zero of="$d/fill" bs=4k >/dev/null 2>&1 || true
""")
    try:
        p = subprocess.run(["ssh", "-F", cluster.ssh_config, "node-1",
                            f'd=$(cat /tmp/dtrain-wdfull.path); cat > /tmp/dtrain-wdfull.sh; '
                            f'if echo x 2>/dev/null > "$d/job/probe"; then echo writable; fi; rm -f "$d/job/probe"; '
                            f'timeout 60 bash /tmp/dtrain-wdfull.sh dtrain-{name} none "$d/job" {keys} "" 30 90 attach; '
                            f'echo "rc=$?"; ls -d {keys} "$d/job" 2>&1; true'],
                           input=script, capture_output=True, text=True, timeout=120)
    finally:
        on_node(cluster, 1, 'd=$(cat /tmp/dtrain-wdfull.path); umount "$d"; rmdir "$d"; '
                            f'rm -rf /tmp/dtrain-wdfull.path /tmp/dtrain-wdfull.sh {keys}', check=False)
    assert "writable" not in p.stdout, "the job directory must be full for this test"
    assert "rc=0" in p.stdout, p.stdout + p.stderr
    assert f"ls: cannot access '{keys}'" in p.stdout, p.stdout
    assert re.search(r"ls: cannot access '\S+/job'", p.stdout), p.stdout
