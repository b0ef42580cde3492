"""Whole runs on the simulated cluster (issue 13): the job's code on every node (--workdir),
restarts on the nodes left after a lost one, from the last checkpoint, spot notices, and
nothing left on any node afterwards."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from dtrain.launch.jobs.container import Mount
from dtrain.launch.jobs.job import Job
from dtrain.launch.jobs.store import job_log
from imds import Imds
from test_launch import EX, ROOT, containers_left, nodes_of, on_node, spec

pytestmark = pytest.mark.cluster


NODE_JOBS = "~/.dtrain/nodes/$(hostname)/jobs"  # a node's job directories (dtrain/contract.py), in its shell


def _job(cluster, image, command, name, n=3, say=None, **kw) -> tuple[int, str, Job]:
    job = Job(spec(cluster, image, command, name, **kw), nodes_of(cluster, n), say=say or (lambda m: None))
    code = job.run()
    return code, job_log(name).read_text(), job


def _node_files(cluster, name: str) -> list[str]:
    left = []
    for i in range(1, len(cluster.nodes) + 1):
        r = on_node(cluster, i, f"ls -d {NODE_JOBS}/{name} {NODE_JOBS}/{name}.lock /dev/shm/dtrain-{name} 2>/dev/null",
                    check=False)
        left += [f"node-{i}:{p}" for p in r.stdout.split()]
    return left


def _wait_clean(cluster, name: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not containers_left(cluster, name) and not _node_files(cluster, name):
            return
        time.sleep(2)
    raise AssertionError(f"left on the nodes: {containers_left(cluster, name) + _node_files(cluster, name)}")


def _when_in_log(name: str, pattern: str, action, timeout: float = 240) -> threading.Thread:
    """Run action() once the job's log matches pattern (in a thread)."""
    def watch():
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            path = job_log(name)
            if path.exists() and re.search(pattern, path.read_text(), re.M):
                action()
                return
            time.sleep(0.2)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def _link(cluster, i: int, state: str) -> None:
    """Node i's NIC (its veth on the host: this slot's prefix, launch/infra/cluster.py) up or down."""
    from dtrain.launch.infra import cluster as cl

    subprocess.run(["ip", "link", "set", f"{cl.VETH_PREFIX}{cluster.nodes[i - 1].index}", state], check=True)


def test_workdir_reaches_every_node_and_a_relaunch_sends_only_the_change(cluster, remote_images, tmp_path):
    proj = tmp_path / "proj"
    (proj / "pkg").mkdir(parents=True)
    (proj / "pkg" / "__init__.py").write_text("")
    (proj / "pkg" / "helper.py").write_text("GREETING = 'hello v1'\n")
    (proj / "assets.bin").write_bytes(bytes(range(256)) * 2048)  # 512 KiB the job reads
    (proj / "main.py").write_text(
        "import hashlib, os, socket\nfrom pkg.helper import GREETING\n"
        "print(GREETING, socket.gethostname(), os.getcwd(), hashlib.sha256(open('assets.bin','rb').read()).hexdigest()[:12])\n")
    (proj / ".gitignore").write_text("outputs/\n")
    (proj / "outputs").mkdir()
    (proj / "outputs" / "big.bin").write_bytes(b"x" * (3 << 20))  # ignored: never sent
    said: list[str] = []
    code, out, _ = _job(cluster, remote_images["pytorch-ddp"], ["python", "main.py"], "t-wd", say=said.append,
                        workdir=str(proj))
    assert code == 0, out
    hellos = re.findall(r"^\[(node-\d) r\d\] hello v1 (node-\d) /workdir ([0-9a-f]{12})$", out, re.M)
    assert sorted(h[1] for h in hellos) == ["node-1", "node-2", "node-3"], out
    assert len({h[2] for h in hellos}) == 1
    first = next(m for m in said if m.startswith("[launch] workdir"))
    sent1 = [int(b) for b in re.findall(r": (\d+) changed", first)]
    assert sent1 == [5, 5, 5], first  # .gitignore, main.py, assets.bin, pkg/__init__.py, pkg/helper.py
    _wait_clean(cluster, "t-wd")

    (proj / "pkg" / "helper.py").write_text("GREETING = 'hello v2!'\n")
    said.clear()
    code, out, _ = _job(cluster, remote_images["pytorch-ddp"], ["python", "main.py"], "t-wd", say=said.append,
                        workdir=str(proj))
    assert code == 0, out
    assert len(re.findall(r"hello v2! node-\d /workdir", out)) == 3, out
    second = next(m for m in said if m.startswith("[launch] workdir"))
    assert re.findall(r": (\d+) changed", second) == ["1", "1", "1"], second
    units = {"B": 1, "KiB": 1024, "MiB": 1024 ** 2}
    sizes = [float(n) * units[u] for n, u in re.findall(r"changed, ([\d.]+) (B|KiB|MiB)\b", second)]
    assert len(sizes) == 3 and all(s < 8 * 1024 for s in sizes), f"about the changed file, not 512 KiB: {second}"
    _wait_clean(cluster, "t-wd")


def _ckpt_job(cluster, remote_images, name, n, **kw):
    ckpt = Path("/tmp") / f"dtrain-ckpt-{uuid.uuid4().hex[:8]}"
    ckpt.mkdir()
    master = cluster.nodes[0].address
    return _job(cluster, remote_images["pytorch-ddp"],
                ["python", f"{EX}/ckpt_train.py", "--epochs", "8", "--steps", "10", "--step-seconds", "0.2"],
                name, n=n, env={"MASTER_ADDR": master, "MASTER_PORT": "29511"},
                mounts=(Mount(str(ckpt), "/ckpt"),), checkpoint_dir="/ckpt", heartbeat_timeout=20, **kw)


def test_a_lost_node_restarts_the_job_on_the_others_from_the_last_checkpoint(cluster, remote_images):
    name = "t-lost"
    _when_in_log(name, r"\] epoch 2 rank 0/3", lambda: _link(cluster, 3, "down"))
    try:
        code, out, _ = _ckpt_job(cluster, remote_images, name, 3, max_restarts=1, min_nodes=2)
    finally:
        _link(cluster, 3, "up")
    assert code == 0, out
    assert re.search(r"\[launch\] lost node-3: no heartbeat for [\d.]+ s and port 2022 unreachable", out), out
    assert "[launch] restart 1:" in out and "dropped node-3" in out, out
    resumed = re.findall(r"rank (\d)/2 host (node-\d) restart 1: resuming at epoch (\d)", out)
    assert sorted(r[1] for r in resumed) == ["node-1", "node-2"], out
    assert all(int(r[2]) >= 3 for r in resumed), f"resumed from the checkpoint, not epoch 1: {resumed}"
    assert re.search(r"\[node-1 r0\] epoch 8 rank 0/2", out) and "[launch] job succeeded" in out
    _wait_clean(cluster, name)  # node-3's own watchdog ends its part once the heartbeat stops


def test_fewer_nodes_than_min_nodes_fails_naming_the_lost_node(cluster, remote_images):
    name = "t-minnodes"
    _when_in_log(name, r"\] epoch 1 rank 0/2", lambda: on_node(cluster, 2, f"docker rm -f dtrain-{name}"))
    code, out, _ = _ckpt_job(cluster, remote_images, name, 2, max_restarts=2, min_nodes=2)
    assert code != 0, out
    assert re.search(r"\[launch\] job failed \(exit \d+\): lost node-2 \(sshd on 2022 unreachable.*\): "
                     r"1 node\(s\) left and no spare, fewer than --min-nodes 2", out), out
    _wait_clean(cluster, name)


def _phases(out: str) -> dict[str, float]:
    """A restart's timed steps from the log: {phase: seconds}."""
    return {m[0]: float(m[1]) for m in re.findall(r"\[launch\] restart 1: ([a-z-]+)(?: \S+)? ([\d.]+) s$", out, re.M)}


def test_a_lost_node_is_swapped_for_a_warm_spare_and_the_job_resumes_at_full_size(cluster, remote_images):
    """node-3 is a spare (ready, no rank). node-2's NIC goes down mid-run: lost within 3 s of its
    last heartbeat, node-3 takes its place, the job resumes from the checkpoint with 2 ranks
    (the same world size), node-2 is quarantined; every node is clean afterwards."""
    name = "t-spare"
    _when_in_log(name, r"\] epoch 2 rank 0/2", lambda: _link(cluster, 2, "down"))
    try:
        code, out, _ = _ckpt_job(cluster, remote_images, name, 3, spares=1)
    finally:
        _link(cluster, 2, "up")
    assert code == 0, out
    assert "[launch] job started on 2 node(s): node-1, node-2; spare(s) node-3" in out, out
    assert re.search(r"\[launch\] lost node-2: no heartbeat for [\d.]+ s and port 2022 unreachable", out), out
    assert "[launch] spare node-3 in for node-2" in out, out
    assert "[launch] restart 1: lost node-2" in out and "node-2 replaced by spare node-3" in out, out
    resumed = re.findall(r"rank (\d)/2 host (node-\d) restart 1: resuming at epoch (\d)", out)
    assert sorted(r[1] for r in resumed) == ["node-1", "node-3"], out
    assert all(int(r[2]) >= 3 for r in resumed), f"resumed from the checkpoint, not epoch 1: {resumed}"
    phases = _phases(out)
    assert phases["detection"] <= 3.0, phases
    assert {"detection", "teardown", "spare-in", "resumed"} <= set(phases), out
    assert "[launch] job succeeded" in out
    from dtrain.launch.jobs.store import status_rows

    row = next(r for r in status_rows(50) if r[0] == name)
    assert "quarantined node-2 (no heartbeat for" in row[1], row
    _wait_clean(cluster, name)


def test_a_busy_node_is_not_lost(cluster, remote_images):
    """A node whose CPUs are saturated and whose disk is under heavy writeback for 15 s keeps
    its place: no loss, no restart (its kernel answers, its heartbeat is only late)."""
    name = "t-busy"
    load = ("docker exec -d dtrain-t-busy sh -c 'for i in 1 2 3 4; do timeout 15 sh -c \"while :; do :; done\" & done; "
            "timeout 15 dd if=/dev/zero of=/tmp/dtrain-busy bs=1M count=3000 conv=fsync; rm -f /tmp/dtrain-busy'")
    _when_in_log(name, r"\] epoch 1 rank 0/3", lambda: on_node(cluster, 2, load))
    code, out, _ = _ckpt_job(cluster, remote_images, name, 3, max_restarts=1)
    assert code == 0, out
    assert "[launch] lost" not in out and "[launch] restart" not in out, out
    _wait_clean(cluster, name)


def test_a_spot_notice_checkpoints_now_and_a_spare_takes_the_leaving_nodes_place(cluster, remote_images):
    """The spot notice reaches node-2: the job is told to checkpoint now (rank 0 saves and says
    so), node-2 is taken out and the spare node-3 takes its place, the job resumes at full size
    from that checkpoint, well within the notice's two minutes."""
    name = "t-spot"
    imds = Imds(cluster.bridge_address)
    noticed: list[float] = []

    def notice() -> None:
        noticed.append(time.monotonic())
        imds.notice.add(cluster.nodes[1].address)
    try:
        _when_in_log(name, r"\] epoch 2 rank 0/2", notice)
        _when_in_log(name, r"restart 1: resuming at epoch", lambda: noticed.append(time.monotonic()))
        code, out, _ = _ckpt_job(cluster, remote_images, name, 3, spares=1, imds=imds.url)
    finally:
        imds.close()
    assert code == 0, out
    assert all(imds.asked.get(n.address) for n in cluster.nodes[:3]), f"every node watches: {imds.asked}"
    assert "[launch] spot notice: the job is asked to checkpoint now (DTRAIN_CHECKPOINT_NOW)" in out, out
    saved = re.search(r"\[node-1 r0\] rank 0: checkpoint now, in epoch (\d)", out)
    assert saved, out
    assert "[launch] lost node-2: leaving (spot notice)" in out and "[launch] spare node-3 in for node-2" in out, out
    resumed = re.findall(r"rank (\d)/2 host (node-\d) restart 1: resuming at epoch (\d)", out)
    assert sorted(r[1] for r in resumed) == ["node-1", "node-3"], out
    # from the checkpoint made on notice (or the epoch's own, where the epoch ended before the stop)
    assert all(int(r[2]) - int(saved.group(1)) in (0, 1) for r in resumed), f"{saved.group(0)}: {resumed}"
    assert noticed[1] - noticed[0] < 120, "resumed within the notice's two minutes"
    assert "[launch] job succeeded" in out
    _wait_clean(cluster, name)


def test_a_spot_notice_without_a_spare_goes_on_with_the_nodes_left(cluster, remote_images):
    name = "t-spot-nospare"
    imds = Imds(cluster.bridge_address)
    try:
        _when_in_log(name, r"\] epoch 2 rank 0/3", lambda: imds.notice.add(cluster.nodes[2].address))
        code, out, _ = _ckpt_job(cluster, remote_images, name, 3, max_restarts=1, min_nodes=2, imds=imds.url)
    finally:
        imds.close()
    assert code == 0, out
    assert "[launch] lost node-3: leaving (spot notice)" in out and "dropped node-3" in out, out
    assert re.search(r"rank 0/2 host node-1 restart 1: resuming at epoch [3-8]", out), out
    assert "[launch] job succeeded" in out
    _wait_clean(cluster, name)


# ---------------------------------------------------------------- detached jobs, a launcher that dies


def _cli(cluster, remote_images, home: Path, name: str, *extra: str, command: list[str]) -> list[str]:
    return [sys.executable, "-m", "invoke", "launch", "--hostfile", cluster.hostfile, "--ssh-config",
            cluster.ssh_config, "--image", remote_images["pytorch-ddp"], "--name", name, *extra, "--", *command]


def _env(home: Path) -> dict:
    return {**os.environ, "DTRAIN_HOME": str(home)}


TICKS = ["python", "-c", "import os, socket, time\n"
         "for i in range(N):\n    print('tick', i, socket.gethostname(), flush=True); time.sleep(1)"]


def _ticks(n: int) -> list[str]:
    return [TICKS[0], TICKS[1], TICKS[2].replace("N", str(n))]


def _invoke(home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, env=_env(home), capture_output=True,
                          text=True, timeout=timeout)


def test_a_detached_job_runs_on_without_the_launcher_and_logs_follow_it(cluster, remote_images, tmp_path):
    name = "t-detach"
    r = subprocess.run(_cli(cluster, remote_images, tmp_path, name, "--detach", command=_ticks(12)), cwd=ROOT,
                       env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"job {name} detached" in r.stdout and f"dtrain logs --job {name} --follow" in r.stdout, r.stdout
    status = _invoke(tmp_path, "status")
    assert re.search(rf"{name}\s+detached: running", status.stdout), status.stdout
    follow = _invoke(tmp_path, "logs", "--job", name, "--follow")
    assert follow.returncode == 0, follow.stdout + follow.stderr
    ticks = re.findall(r"^\[(node-\d) r\d\] tick 11 node-\d$", follow.stdout, re.M)
    assert sorted(ticks) == ["node-1", "node-2", "node-3"], follow.stdout
    assert "[launch] job succeeded" in follow.stdout, follow.stdout
    status = _invoke(tmp_path, "status")
    assert re.search(rf"{name}\s+detached: succeeded\s.*\s0\s*$", status.stdout, re.M), status.stdout
    def kept(i: int) -> list[str]:
        return on_node(cluster, i, f"ls -A {NODE_JOBS}/{name} 2>/dev/null; ls -d {NODE_JOBS}/{name}.lock "
                       f"/dev/shm/dtrain-{name} 2>/dev/null; true"
                       ).stdout.split()

    deadline = time.monotonic() + 60  # each node's watchdog removes its part
    while (containers_left(cluster, name) or kept(1) != ["output.log", "state.json"] or kept(2) or kept(3)) \
            and time.monotonic() < deadline:
        time.sleep(1)
    assert containers_left(cluster, name) == []
    # only the first node keeps the job's log and state (invoke logs reads them)
    assert [kept(i) for i in (1, 2, 3)] == [["output.log", "state.json"], [], []]
    assert _invoke(tmp_path, "stop", "--job", name).returncode == 0
    _wait_clean(cluster, name)


def test_invoke_stop_ends_a_detached_job_on_every_node(cluster, remote_images, tmp_path):
    name = "t-detach-stop"
    r = subprocess.run(_cli(cluster, remote_images, tmp_path, name, "--detach", command=_ticks(600)), cwd=ROOT,
                       env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(containers_left(cluster, name)) == 3
    stop = _invoke(tmp_path, "stop", "--job", name)
    assert stop.returncode == 0, stop.stderr
    assert containers_left(cluster, name) == []
    assert "stopped" in _invoke(tmp_path, "status").stdout


@pytest.mark.parametrize("how", ["kill -9", "SIGHUP"])
def test_a_launcher_that_dies_leaves_every_node_clean(cluster, remote_images, tmp_path, how):
    """kill -9 (no teardown runs here): the supervisor's stdin ends, it stops the job, and each
    node's watchdog removes what is there. SIGHUP (the terminal closed): the launcher tears down."""
    import signal

    name = "t-die-" + ("kill" if how == "kill -9" else "hup")
    proc = subprocess.Popen(_cli(cluster, remote_images, tmp_path, name, command=_ticks(600)), cwd=ROOT,
                            env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = tmp_path / "jobs" / name / "output.log"
    deadline = time.monotonic() + 240
    while not (log.exists() and log.read_text().count(" tick 1 ") == 3):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
        time.sleep(0.5)
    proc.send_signal(signal.SIGKILL if how == "kill -9" else signal.SIGHUP)
    out, _ = proc.communicate(timeout=120)
    if how == "SIGHUP":
        assert proc.returncode == 129 and "SIGHUP received: removing containers" in out, out  # 128 + SIGHUP
    else:  # the next command that reads the store clears the stale entry (issue 22 #4)
        status = _invoke(tmp_path, "status")
        assert re.search(rf"^{name}\s+launcher gone\s", status.stdout, re.M), status.stdout
        assert not list((tmp_path / "jobs" / name).glob("key-*"))
    _wait_clean(cluster, name, timeout=120)
