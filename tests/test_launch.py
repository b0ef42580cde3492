"""Real jobs on the simulated cluster: 3 netns nodes, each with its own dockerd, docker0 at
172.17.0.1, sshd on 22 and a NIC named ens5; the images come from the cluster registry."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from dtrain.launch.troubleshoot.diagnose import diagnose
from dtrain.launch.errors import LaunchError
from dtrain.launch.remote.hosts import Node, parse_hostfile
from dtrain.launch.jobs.job import Job, container_name
from dtrain.launch.jobs.commands import job_argv
from dtrain.launch.jobs.store import job_log
from dtrain.launch.jobs.spec import JobSpec

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parent.parent
EX = "/opt/dtrain/node/examples"


def nodes_of(cluster, n: int) -> list[Node]:
    return parse_hostfile(cluster.hostfile)[:n]


def spec(cluster, image: str, command: list[str], name: str, **kw) -> JobSpec:
    return JobSpec(image=image, command=tuple(command), name=name,
                   ssh_opts=("-F", cluster.ssh_config), **kw)


def run(cluster, image, command, name, n=3, **kw) -> tuple[int, str]:
    job = Job(spec(cluster, image, command, name, **kw), nodes_of(cluster, n), say=lambda m: None)
    code = job.run()
    return code, job_log(name).read_text()


def on_node(cluster, i: int, script: str, check=True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ssh", "-F", cluster.ssh_config, f"node-{i}", script],
                       capture_output=True, text=True, timeout=120)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def exec_first(cluster, job: Job, facts, argv: list[str], limit: int, env: str = "") -> subprocess.CompletedProcess:
    """Run argv in the job's first container, killed after `limit` seconds."""
    remote = ["docker", "exec", *(["-e", env] if env else []), container_name(job.spec.name),
              "timeout", "-s", "KILL", str(limit), *argv]
    return subprocess.run(["ssh", "-F", cluster.ssh_config, facts[0].node.host, shlex.join(remote)],
                          capture_output=True, text=True, timeout=limit + 60)


def containers_left(cluster, name: str) -> list[str]:
    left = []
    for i in range(1, len(cluster.nodes) + 1):
        out = on_node(cluster, i, f"docker ps -aq --filter label=dtrain.job={name}").stdout.split()
        left += [f"node-{i}:{c}" for c in out]
    return left


# ---------------------------------------------------------------- jobs that must work


def test_horovod_tf_allreduce_on_3_nodes(cluster, remote_images):
    code, out = run(cluster, remote_images["horovod-tensorflow"],
                    ["python", f"{EX}/allreduce_check.py", "tensorflow"], "t-hvd3")
    assert code == 0, out
    oks = re.findall(r"^\[(node-\d) r(\d)\] allreduce OK rank=(\d) size=3 host=(node-\d) sum=6", out, re.M)
    assert sorted(o[2] for o in oks) == ["0", "1", "2"], out
    assert sorted(o[3] for o in oks) == ["node-1", "node-2", "node-3"], "one rank per node"
    assert all(o[0] == o[3] and o[1] == o[2] for o in oks), "prefix names the right node and rank"
    assert containers_left(cluster, "t-hvd3") == []


def _checksums(out: str) -> dict[str, set[str]]:
    sums: dict[str, set[str]] = {}
    for step, rank, value in re.findall(r"step (\d) rank (\d)/2 host node-\d grad-checksum (\S+)", out):
        sums.setdefault(step, set()).add(value)
    return sums


def test_nodes_resolve_each_other_in_every_container(cluster, remote_images):
    """The readiness ssh from the first container fills each container's /etc/hosts with every
    node's hostname and address; the nodes' own /etc/hosts stay as they were."""
    before = on_node(cluster, 2, "cat /etc/hosts").stdout
    code, out = run(cluster, remote_images["pytorch-ddp"],
                    ["bash", "-c", "echo $(getent hosts node-1 node-2 node-3 | sort)"], "t-hosts")
    assert code == 0, out
    want = " ".join(f"{n.address} {n.name}" for n in cluster.nodes[:3])
    lines = [ln for ln in out.splitlines() if ln.startswith("[node-")]
    assert len(lines) == 3 and all(ln.endswith("] " + want) for ln in lines), out
    assert on_node(cluster, 2, "cat /etc/hosts").stdout == before


def test_mpirun_reaches_each_other_node_over_one_master_and_leaves_none(cluster, remote_images):
    """The readiness check opens one ssh master per other node in the first container, which
    mpirun's daemon launch reuses; none to the first node itself (mpirun starts its ranks there
    without ssh). Once the job ends no master is left anywhere (the container went with them)."""
    script = 'if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then echo "masters $(ls /tmp | grep -c "^dtrain-mux-")"; fi'
    code, out = run(cluster, remote_images["pytorch-ddp"], ["bash", "-c", script], "t-masters")
    assert code == 0, out
    assert re.search(r"^\[node-1 r0\] masters 2$", out, re.M), out
    for i in (1, 2, 3):  # in the node's network namespace (its containers'; another simulated cluster's are not)
        assert on_node(cluster, i, "pgrep --ns $$ --nslist net -af 'dtrain-[m]ux-' || true").stdout == ""
    assert containers_left(cluster, "t-masters") == []


def test_mpirun_output_arrives_whole_each_rank_in_order(cluster, remote_images):
    """Each of 2 ranks prints 200,000 bare numbers as fast as it can: Open MPI's --tag-output
    lost 17% of such lines (4.1.4); under launch/node/rank_output.py every one is in the job's
    log with its node and rank, each rank's in order, and a line cut by a pause is one line."""
    script = ("import sys, time\n"
              "w = sys.stdout.write\n"
              "for i in range(200000): w(f'{i}\\n')\n"
              "w('half '); sys.stdout.flush(); time.sleep(0.2); w('line\\n')\n")
    code, out = run(cluster, remote_images["pytorch-ddp"], ["python", "-c", script], "t-lines", n=2)
    assert code == 0, out[-3000:]
    for node, rank in (("node-1", 0), ("node-2", 1)):
        got = re.findall(rf"^\[{node} r{rank}\] (\d+)$", out, re.M)
        assert got == [str(i) for i in range(200000)], f"{node}: {len(got)} lines"
        assert f"[{node} r{rank}] half line\n" in out
    assert not re.search(r"^\[node-\d\] \d+$", out, re.M), "a rank's line without its rank"


def test_ddp_torchrun_on_2_nodes(cluster, remote_images):
    code, out = run(cluster, remote_images["pytorch-ddp"], ["python", f"{EX}/ddp_grads.py"],
                    "t-ddp-torchrun", n=2, launcher="torchrun")
    assert code == 0, out
    sums = _checksums(out)
    assert len(sums) == 3 and all(len(v) == 1 for v in sums.values()), f"ranks disagree: {sums}"
    assert "[node-1 r0] step 0" in out and "[node-2 r1] step 0" in out


def test_ddp_mpirun_on_2_nodes(cluster, remote_images):
    master = cluster.nodes[0].address
    code, out = run(cluster, remote_images["pytorch-ddp"], ["python", f"{EX}/ddp_grads.py"],
                    "t-ddp-mpirun", n=2, env={"MASTER_ADDR": master, "MASTER_PORT": "29510"})
    assert code == 0, out
    sums = _checksums(out)
    assert len(sums) == 3 and all(len(v) == 1 for v in sums.values()), f"ranks disagree: {sums}"


def test_btl_tcp_if_include_matters(cluster, remote_images):
    """Without btl/oob_tcp_if_include Open MPI tries docker0 (172.17.0.1 on every node) and
    hangs or fails; the launcher's argv with the flags succeeds on the same containers."""
    job = Job(spec(cluster, remote_images["horovod-tensorflow"],
                   ["python", f"{EX}/allreduce_check.py", "tensorflow"], "t-btl"),
              nodes_of(cluster, 2), say=lambda m: None)
    try:
        facts = job.up().facts
        job.preflight(facts, job.launcher.preflight(None))  # every sshd answers; the image's mpirun
        good = job_argv(job.spec, facts, facts[0].iface)
        bad = [a for a in good]
        for flag in ("btl_tcp_if_include", "oob_tcp_if_include"):
            i = bad.index(flag)
            del bad[i - 1:i + 2]  # --mca NAME VALUE
        t0 = time.monotonic()
        without = exec_first(cluster, job, facts, bad, 45)
        assert without.returncode != 0, "expected a hang or failure without the flags:\n" + without.stdout
        assert "Bad port" not in without.stdout + without.stderr  # failed for the right reason
        keep_log("btl-iface", without.stdout + without.stderr)
        assert "btl-iface" in [f.entry.id for f in diagnose(without.stdout + without.stderr)]
        assert (without.stdout + without.stderr).count("allreduce OK") < 2
        assert time.monotonic() - t0 < 90
        with_flags = exec_first(cluster, job, facts, good, 120)
        assert with_flags.returncode == 0, with_flags.stdout + with_flags.stderr
        # the ranks' lines, tagged by launch/node/rank_output.py, come on mpirun's stderr
        oks = re.findall(r"^\[1,(\d)\]<stdout>:allreduce OK", with_flags.stderr, re.M)
        assert sorted(oks) == ["0", "1"], with_flags.stdout + with_flags.stderr
    finally:
        job.teardown()
    assert containers_left(cluster, "t-btl") == []


def keep_log(entry_id: str, text: str) -> None:
    """Keep a real failure's output (build/real-logs/) for tests/logs/ samples."""
    d = ROOT / "build" / "real-logs"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{entry_id}-sim.log").write_text(text)


def test_diagnose_on_real_failures(cluster, remote_images):
    """Failures made for real on the cluster, each recognised by `invoke diagnose`."""
    job = Job(spec(cluster, remote_images["horovod-tensorflow"], ["true"], "t-diag"),
              nodes_of(cluster, 2), say=lambda m: None)
    try:
        facts = job.up().facts
        job.preflight(facts, job.launcher.preflight(None))  # every sshd answers; the image's mpirun
        good = job_argv(job.spec, facts, facts[0].iface)

        def in_first(argv: list[str], env: str = "") -> str:
            r = exec_first(cluster, job, facts, argv, 60, env)
            assert r.returncode != 0, r.stdout
            return r.stdout + r.stderr

        # ssh to the nodes' own sshd on 22 (the host), not the containers' 2022
        argv = list(good)
        argv[argv.index("plm_rsh_args") + 1] = "-p 22"
        out = in_first(argv)
        keep_log("ssh-port-22", out)
        ids = [f.entry.id for f in diagnose(out)]
        assert "ssh-auth" in ids or "ssh-port-22" in ids, out
        assert "orte-daemons" in ids, out

        # a variable the job needs, set where mpirun runs but not forwarded with -x
        script = "import os; print(os.environ['DTRAIN_DATA_DIR'])"
        argv = good[:-1] + ["python", "-c", script]  # the job command ("true") is last
        out = in_first(argv, env="DTRAIN_DATA_DIR=/fsx/data")
        keep_log("env-not-forwarded", out)
        findings = {f.entry.id: f for f in diagnose(out)}
        assert "env-not-forwarded" in findings, out
        assert "node-2" in findings["env-not-forwarded"].nodes or 1 in findings["env-not-forwarded"].ranks
    finally:
        job.teardown()
    assert containers_left(cluster, "t-diag") == []


# ---------------------------------------------------------------- failure paths


def test_job_key_placed_with_root_ownership_and_removed_after(cluster, remote_images):
    """The per-job key: root's and 0600 in every container, in a 0700 tmpfs directory on each
    node during the job, gone from the nodes and from this machine afterwards. The job's host
    key, made by the launcher with it: the same in every container, root's and 0600, with the
    container's umask (0022) left to the command."""
    name = "t-key"
    job = Job(spec(cluster, remote_images["pytorch-ddp"],
                   ["bash", "-c", "echo key $(stat -c '%a %U' /root/.ssh/id_ed25519 /root/.ssh/authorized_keys "
                    "/run/dtrain-job /etc/ssh/ssh_host_ed25519_key) $(grep -c dtrain-t-key /root/.ssh/authorized_keys) "
                    "$(umask) $(ssh-keygen -y -f /etc/ssh/ssh_host_ed25519_key | cut -d' ' -f2)"], name),
              nodes_of(cluster, 2), say=lambda m: None)
    assert job.run() == 0
    lines = [ln for ln in job_log(name).read_text().splitlines() if " key " in ln]
    assert len(lines) == 2, lines
    for line in lines:
        assert " key 600 root 644 root 700 root 600 root 1 0022 AAAA" in line, line
    assert len({line.split()[-1] for line in lines}) == 1, lines
    assert job.keys is not None and not job.keys.dir.exists()
    for i in (1, 2):
        assert "dtrain-" not in on_node(cluster, i, "ls /dev/shm").stdout


def test_relaunch_replaces_a_stale_container_of_the_same_job(cluster, remote_images):
    """A container of the same job left on node-2 (holding port 2022) and its key directory
    are replaced, not reported as a taken port."""
    image = remote_images["pytorch-ddp"]
    on_node(cluster, 2, f"mkdir -p /dev/shm/dtrain-t-stale && docker run -d --name dtrain-t-stale --network host "
                        f"--label dtrain.job=t-stale {image} >/dev/null && sleep 1")
    code, log = run(cluster, image, ["true"], "t-stale")
    assert code == 0, log
    assert containers_left(cluster, "t-stale") == []
    assert "dtrain-" not in on_node(cluster, 2, "ls /dev/shm").stdout


def test_port_held_by_another_job_names_that_job(cluster, remote_images):
    image = remote_images["pytorch-ddp"]
    on_node(cluster, 2, f"docker run -d --name dtrain-t-other --network host --label dtrain.job=t-other "
                        f"{image} >/dev/null && sleep 1")
    try:
        with pytest.raises(LaunchError) as e:
            run(cluster, image, ["true"], "t-mine")
        msg = str(e.value)
        assert "port 2022 is taken" in msg and cluster.nodes[1].address in msg
        assert "dtrain stop --job t-other" in msg
    finally:
        on_node(cluster, 2, "docker rm -f dtrain-t-other >/dev/null")
    assert containers_left(cluster, "t-mine") == []


def test_unreachable_node_fails_and_leaves_nothing(cluster, remote_images, nic_down):
    job = Job(spec(cluster, remote_images["pytorch-ddp"], ["true"], "t-unreach"), nodes_of(cluster, 3),
              say=lambda m: None)
    with nic_down(3) as gone, pytest.raises(LaunchError) as e:
        job.run()
    assert gone in str(e.value)
    assert containers_left(cluster, "t-unreach") == []


def test_sshd_unreachable_after_start_removes_started_containers(cluster, remote_images):
    """A failure after containers run on every node (2022 blocked on node-3) removes them all."""
    rule = "INPUT -p tcp --dport 2022 -j DROP -m comment --comment dtrain-test"
    on_node(cluster, 3, f"iptables -I {rule}")  # ssh lands in node-3's netns
    try:
        with pytest.raises(LaunchError) as e:
            run(cluster, remote_images["pytorch-ddp"], ["true"], "t-blocked", ready_timeout=8)
        assert "10.213.0.13" in str(e.value) and "2022" in str(e.value)
    finally:
        on_node(cluster, 3, f"iptables -D {rule}")
    assert containers_left(cluster, "t-blocked") == []
    for i in (1, 2, 3):  # the check's masters to node-2 went with the first container
        assert on_node(cluster, i, "pgrep --ns $$ --nslist net -af 'dtrain-[m]ux-' || true").stdout == ""


def test_node_whose_sshd_never_listens_ends_the_running_job(cluster, remote_images):
    """The launcher goes on once every container runs; each node's session still waits for
    its sshd. Where that never comes (node-3's `ss` made blind, in its own mount namespace),
    the job already running elsewhere is ended, node-3 named, nothing left."""
    on_node(cluster, 3, "mount --bind /bin/false /usr/bin/ss")
    try:
        t0 = time.monotonic()
        with pytest.raises(LaunchError) as e:
            run(cluster, remote_images["pytorch-ddp"], ["sleep", "120"], "t-nosshd", ready_timeout=6)
        elapsed = time.monotonic() - t0
    finally:
        on_node(cluster, 3, "umount /usr/bin/ss")
    msg = str(e.value)
    assert "sshd came up" in msg and "10.213.0.13" in msg and "not listening on 2022 after 6 s" in msg, msg
    assert "10.213.0.11" not in msg and "10.213.0.12" not in msg
    assert elapsed < 60, f"the job was not ended ({elapsed:.0f} s)"
    assert containers_left(cluster, "t-nosshd") == []


def test_port_2022_taken_on_one_node(cluster, remote_images):
    addr = cluster.nodes[1].address
    on_node(cluster, 2, f"setsid nohup python3 -m http.server 2022 --bind {addr} >/dev/null 2>&1 & sleep 1")
    try:
        with pytest.raises(LaunchError) as e:
            run(cluster, remote_images["pytorch-ddp"], ["true"], "t-port")
        msg = str(e.value)
        assert "port 2022 is taken" in msg and addr in msg and "python3" in msg
        assert cluster.nodes[0].address not in msg
    finally:
        on_node(cluster, 2, "pkill -f 'http.server 2022'", check=False)
    assert containers_left(cluster, "t-port") == []


def test_rank_killed_mid_job_fails_fast(cluster, remote_images):
    script = ("echo rank $OMPI_COMM_WORLD_RANK up; "
              "if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then sleep 3; kill -9 $$; fi; sleep 300")
    t0 = time.monotonic()
    code, out = run(cluster, remote_images["pytorch-ddp"], ["bash", "-c", script], "t-kill")
    elapsed = time.monotonic() - t0
    assert code != 0
    assert elapsed < 120, f"the job did not fail fast ({elapsed:.0f} s)"
    assert re.search(r"rank 1 .*node-2|node-2.*rank 1", out, re.S), out[-2000:]
    assert containers_left(cluster, "t-kill") == []
    keep_log("rank-exit", out)
    found = {f.entry.id: f for f in diagnose(out)}
    assert "rank-exit" in found and 1 in found["rank-exit"].ranks, out[-2000:]


def test_torchrun_node_failure_stops_the_others(cluster, remote_images):
    script = ("import os, time; r = int(os.environ['RANK']); print('rank', r, 'up', flush=True); "
              "time.sleep(2); os._exit(3) if r == 1 else time.sleep(300)")
    t0 = time.monotonic()
    code, out = run(cluster, remote_images["pytorch-ddp"], ["python", "-c", script], "t-tkill",
                    n=2, launcher="torchrun")
    assert code != 0 and time.monotonic() - t0 < 120, out[-2000:]
    assert containers_left(cluster, "t-tkill") == []


def test_cli_bad_hostfile_line(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("10.0.0.1 slots=2\n10.0.0.2 slots=zero\n")
    r = subprocess.run([sys.executable, "-m", "invoke", "launch", "--hostfile", str(hostfile),
                        "--image", "x", "--", "true"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0
    assert f"{hostfile}:2" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------- the CLI around a running job


def _start_cli_job(cluster, image, name, env):
    argv = [sys.executable, "-m", "invoke", "launch", "--hostfile", cluster.hostfile,
            "--ssh-config", cluster.ssh_config, "--image", image, "--name", name, "--",
            "bash", "-c", "echo rank $OMPI_COMM_WORLD_RANK started; sleep 300"]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = Path(env["DTRAIN_HOME"]) / "jobs" / name / "output.log"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if log.exists() and len(re.findall(r"\] rank \d+ started", log.read_text())) == len(cluster.nodes):
            return proc
        if proc.poll() is not None:
            raise AssertionError(proc.stdout.read())
        time.sleep(0.5)
    proc.kill()
    raise AssertionError("the job's ranks did not start")


def _cli(env, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_ctrl_c_tears_down_every_node(cluster, remote_images, tmp_path):
    import os
    import signal

    env = {**os.environ, "DTRAIN_HOME": str(tmp_path)}
    proc = _start_cli_job(cluster, remote_images["pytorch-ddp"], "t-ctrlc", env)
    status = _cli(env, "status").stdout
    assert re.search(r"t-ctrlc\s+running\s+mpirun\s+3", status), status
    logs = _cli(env, "logs", "--job", "t-ctrlc").stdout
    assert "[node-3 r2] rank 2 started" in logs
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert time.monotonic() - t0 < 60
    # the user stopped it: said in one line, no failure diagnosis (review of issue 25)
    assert "[launch] job t-ctrlc interrupted (exit code 130); output: dtrain logs --job t-ctrlc" in out, out
    assert "failed with exit code" not in out and "No known failure signature" not in out, out
    assert containers_left(cluster, "t-ctrlc") == []
    assert re.search(r"t-ctrlc\s+interrupted", _cli(env, "status").stdout)


def test_stop_from_another_terminal(cluster, remote_images, tmp_path):
    import os

    env = {**os.environ, "DTRAIN_HOME": str(tmp_path)}
    proc = _start_cli_job(cluster, remote_images["pytorch-ddp"], "t-stop", env)
    r = _cli(env, "stop", "--job", "t-stop")
    assert r.returncode == 0 and "stopped t-stop" in r.stdout, r.stdout + r.stderr
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert containers_left(cluster, "t-stop") == []


def test_a_second_launch_of_a_running_name_is_refused_and_the_first_unharmed(cluster, remote_images, tmp_path):
    """Issue 22 #3: the same name launched again while it runs, from the same launcher (its lock)
    and from another one (DTRAIN_HOME of its own: the nodes' locks), is refused at once, naming
    the job and who holds it; the first job keeps its containers, keys and files, and stops as
    usual; the name is free again after."""
    import os

    image = remote_images["pytorch-ddp"]
    env = {**os.environ, "DTRAIN_HOME": str(tmp_path / "a")}
    proc = _start_cli_job(cluster, image, "t-twice", env)
    try:
        argv = ["launch", "--hostfile", cluster.hostfile, "--ssh-config", cluster.ssh_config, "--image", image,
                "--name", "t-twice", "--", "true"]
        t0 = time.monotonic()
        same = _cli(env, *argv)
        assert same.returncode == 2 and "Traceback" not in same.stderr, same.stdout + same.stderr
        assert re.search(r"job t-twice is already running: launched by pid \d+ on \S+", same.stderr), same.stderr
        assert time.monotonic() - t0 < 20
        other = _cli({**env, "DTRAIN_HOME": str(tmp_path / "b")}, *argv)
        assert other.returncode == 2 and "Traceback" not in other.stderr, other.stdout + other.stderr
        hosts = [n.host for n in parse_hostfile(cluster.hostfile)]
        for h in hosts:
            assert re.search(rf"{re.escape(h)}: job t-twice is already running on this node \(launched by \S+ pid "
                             rf"{proc.pid} ", other.stderr), other.stderr
        # the first job, unharmed
        assert proc.poll() is None
        for i in range(1, len(cluster.nodes) + 1):
            on_node(cluster, i, "test -n \"$(docker ps -q --filter name=^dtrain-t-twice$ --filter status=running)\" "
                                "&& test -f ~/.dtrain/nodes/$(hostname)/jobs/t-twice/watch.pid "
                                "&& test -d /dev/shm/dtrain-t-twice")
        assert re.search(r"t-twice\s+running\s+mpirun\s+3", _cli(env, "status").stdout)
        r = _cli(env, "stop", "--job", "t-twice")
        assert r.returncode == 0 and "stopped t-twice" in r.stdout, r.stdout + r.stderr
        proc.communicate(timeout=120)
        assert containers_left(cluster, "t-twice") == []
        for i in range(1, len(cluster.nodes) + 1):
            assert on_node(cluster, i, "ls -d ~/.dtrain/nodes/$(hostname)/jobs/t-twice* 2>/dev/null; true").stdout == ""
        again = _cli({**env, "DTRAIN_HOME": str(tmp_path / "b")}, *argv)
        assert again.returncode == 0, again.stdout + again.stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            _cli(env, "stop", "--job", "t-twice")


def _node_cli(cluster, i: int, *args: str) -> subprocess.CompletedProcess:
    """`invoke ARGS` run on node i itself, its own ~/.dtrain as the launcher's store."""
    cmd = shlex.join(["env", "-u", "DTRAIN_HOME", sys.executable, "-m", "invoke", *args])
    return subprocess.run(["ssh", "-F", cluster.ssh_config, f"node-{i}", f"cd {shlex.quote(str(ROOT))} && {cmd}"],
                          capture_output=True, text=True, timeout=400)


def test_launch_from_a_node_in_its_own_hostfile(cluster, remote_images):
    """Issue 22 #8: the launcher on node 1, whose hostfile lists it. Its store (~/.dtrain/jobs)
    and the node's job directories (~/.dtrain/nodes/HOST/jobs) are apart: the node's prepare and teardown
    leave the launcher's record and output whole, attached and detached."""
    import json

    image = remote_images["pytorch-ddp"]
    name = "t-fromnode"
    common = ["--hostfile", cluster.hostfile, "--ssh-config", cluster.ssh_config, "--image", image]
    clean = f"rm -rf ~/.dtrain/jobs/{name} ~/.dtrain/jobs/{name}-d"
    on_node(cluster, 1, clean)
    try:
        r = _node_cli(cluster, 1, "launch", *common, "--name", name, "--",
                      "bash", "-c", "echo rank $OMPI_COMM_WORLD_RANK hello")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "[node-3 r2] rank 2 hello" in r.stdout, r.stdout
        logs = _node_cli(cluster, 1, "logs", "--job", name)
        assert logs.returncode == 0 and "[node-1 r0] rank 0 hello" in logs.stdout, logs.stdout + logs.stderr
        rec = json.loads(on_node(cluster, 1, f"cat ~/.dtrain/jobs/{name}/job.json").stdout)
        assert (rec["name"], rec["state"], rec["exit_code"], len(rec["nodes"])) == (name, "succeeded", 0, 3), rec
        r = _node_cli(cluster, 1, "launch", *common, "--name", f"{name}-d", "--detach", "--",
                      "bash", "-c", "sleep 3; echo rank $OMPI_COMM_WORLD_RANK done")
        assert r.returncode == 0, r.stdout + r.stderr
        follow = _node_cli(cluster, 1, "logs", "--job", f"{name}-d", "--follow")
        assert follow.returncode == 0 and "[node-2 r1] rank 1 done" in follow.stdout, follow.stdout + follow.stderr
        status = _node_cli(cluster, 1, "status")
        assert status.returncode == 0, status.stderr
        assert re.search(rf"^{name}\s+succeeded\s", status.stdout, re.M), status.stdout
        assert re.search(rf"^{name}-d\s+detached: succeeded", status.stdout, re.M), status.stdout
        stop = _node_cli(cluster, 1, "stop", "--job", f"{name}-d")
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert containers_left(cluster, name) == [] and containers_left(cluster, f"{name}-d") == []
        on_node(cluster, 1, f"test -s ~/.dtrain/jobs/{name}/output.log && test -f ~/.dtrain/jobs/{name}-d/job.json")
    finally:
        on_node(cluster, 1, clean, check=False)


# ---------------------------------------------------------------- user values are data


def test_hostile_values_reach_the_ranks_as_data(cluster, remote_images):
    """Shell syntax in every user value that reaches a node or container (env names and
    values, mount paths, command arguments, ssh options, image, job name, hostname) is data:
    each rank sees the exact values, and the marker file exists nowhere."""
    import uuid

    from dtrain.launch.jobs.container import Mount

    mark = f"/tmp/dtrain-pwned-{uuid.uuid4().hex[:8]}"
    evil = [f"$(touch {mark})", f"`touch {mark}`", f"x; touch {mark}", f"'\"; touch {mark} #",
            f"a\ntouch {mark}", f"\\\"$(touch {mark})\\\"", "  spaced  "]
    env = {f"EVIL{i}": v for i, v in enumerate(evil)}
    d = f"/tmp/dtrain-evil $(touch {mark});`touch {mark}`"
    script = ("import json, os, sys; print('ARGS', json.dumps(sys.argv[1:])); "
              "print('ENV', json.dumps({k: v for k, v in os.environ.items() if k.startswith('EVIL')}, sort_keys=True)); "
              f"print('MOUNT', open('/mnt/evil/f').read().strip()); print('MARK', os.path.exists({mark!r}))")
    for i in (1, 2):  # the script in the mounted directory: torchrun takes a file, not -c
        on_node(cluster, i, f"mkdir -p -- {shlex.quote(d)} && echo in > {shlex.quote(d + '/f')} && "
                            f"printf '%s\\n' {shlex.quote(script)} > {shlex.quote(d + '/check.py')}")
    s = JobSpec(image=remote_images["pytorch-ddp"], command=("python", "/mnt/evil/check.py", *evil), name="t-evil",
                env=env, mounts=(Mount(d, "/mnt/evil", True),),
                ssh_opts=("-F", cluster.ssh_config, "-o", f'SetEnv=DTRAIN_X="$(touch {mark});`touch {mark}`"'))
    try:
        for launcher in ("mpirun", "torchrun"):
            job = Job(replace(s, launcher=launcher), nodes_of(cluster, 2), say=lambda m: None)
            assert job.run() == 0, job_log("t-evil").read_text()
            out = job_log("t-evil").read_text()
            import json

            args = [json.loads(ln.split("ARGS ", 1)[1]) for ln in out.splitlines() if " ARGS " in ln]
            envs = [json.loads(ln.split("ENV ", 1)[1]) for ln in out.splitlines() if " ENV " in ln]
            assert len(args) == 2 and all(a == evil for a in args), out
            assert len(envs) == 2 and all(e == env for e in envs), out
            assert out.count("MOUNT in") == 2 and out.count("MARK False") == 2, out
        # an image reference, a job name and a hostname with shell syntax: refused, nothing runs
        with pytest.raises(LaunchError):
            Job(replace(s, image=f"{remote_images['pytorch-ddp']}$(touch {mark})", name="t-evil-img"),
                nodes_of(cluster, 2), say=lambda m: None).run()
        with pytest.raises(LaunchError, match="bad job name"):
            Job(replace(s, name=f"x;touch {mark}"), nodes_of(cluster, 2), say=lambda m: None)
        with pytest.raises(ValueError, match="bad host"):
            Node(f"$(touch {mark})")
    finally:
        for i in (1, 2):
            on_node(cluster, i, f"rm -rf -- {shlex.quote(d)}", check=False)
    assert not Path(mark).exists()
    for i in (1, 2, 3):
        assert on_node(cluster, i, f"ls {mark} 2>&1 || true").stdout.strip().endswith("No such file or directory")
    assert containers_left(cluster, "t-evil") == [] and containers_left(cluster, "t-evil-img") == []


def test_env_file_values_are_never_printed_nor_in_argv(cluster, remote_images, tmp_path):
    """--env-file values (tokens) reach every rank, but the console, the job log and every
    process's argv on the launcher and the nodes show names only."""
    import hashlib
    import os

    secret = 'tok"en-' + os.urandom(6).hex()
    (tmp_path / "secrets.env").write_text(f"HF_TOKEN='{secret}'\n")
    env = {**os.environ, "DTRAIN_HOME": str(tmp_path)}
    argv = [sys.executable, "-m", "invoke", "launch", "--hostfile", cluster.hostfile,
            "--ssh-config", cluster.ssh_config, "--image", remote_images["pytorch-ddp"], "--name", "t-secret",
            "--env-file", str(tmp_path / "secrets.env"), "--",
            "python", "-c", "import hashlib, os, time; print('sha', hashlib.sha256(os.environ['HF_TOKEN'].encode())"
            ".hexdigest(), flush=True); time.sleep(15)"]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = tmp_path / "jobs" / "t-secret" / "output.log"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (log.exists() and log.read_text().count(" sha ") == 3):
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.5)
    seen = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    seen += "".join(on_node(cluster, i, "ps -eo args").stdout for i in (1, 2, 3))
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    want = hashlib.sha256(secret.encode()).hexdigest()
    assert log.read_text().count(f" sha {want}") == 3, log.read_text()
    assert "-x HF_TOKEN" in out  # the mpirun line names the variable
    for where, text in (("console", out), ("job log", log.read_text()), ("ps", seen)):
        assert secret not in text and secret.split('"')[1] not in text, where
    assert containers_left(cluster, "t-secret") == []


def test_registry_login_leaves_no_credential_on_the_nodes(cluster, remote_images):
    """The nodes' pull step with a login (as for ECR): `docker login` to the cluster registry
    goes into a Docker config of its own, deleted after the pull; the node's own
    ~/.docker/config.json is as it was, and no config directory is left in /dev/shm."""
    import base64

    from dtrain.launch.jobs import node_programs

    image = remote_images["pytorch-ddp"]
    registry = image.split("/", 1)[0]
    auth = base64.b64encode(b"dtrain-test:s3cr3t-pw").decode()
    look = "cat ~/.docker/config.json 2>/dev/null; ls -d /dev/shm/dtrain-docker-* 2>/dev/null; true"
    for i in (1, 2, 3):
        before = on_node(cluster, i, look).stdout
        step = node_programs.host_argv("pull", registry, "dtrain-test", image, "always")
        r = subprocess.run(["ssh", "-F", cluster.ssh_config, f"node-{i}", shlex.join(step)], input="s3cr3t-pw\n",
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and "image=" in r.stdout and "pull failed" not in r.stderr, r.stderr
        after = on_node(cluster, i, look).stdout
        assert after == before and auth not in after and "s3cr3t" not in after, after


# ---------------------------------------------------------------- Ray

def test_ray_train_torchtrainer_on_2_nodes(cluster, remote_images):
    """invoke launch --launcher ray: a head on node-1, a worker on node-2, then a TorchTrainer
    with one gloo worker per node; each worker's rank, host and allreduced sum (1+2)."""
    code, out = run(cluster, remote_images["ray-train"], ["python", f"{EX}/ray_train_check.py", "--workers", "2"],
                    "t-ray2", n=2, launcher="ray")
    assert code == 0, out
    rows = re.findall(r"^\[node-1\] ray-train OK rank=(\d) size=2 host=(node-\d) sum=(\d+)$", out, re.M)
    assert sorted(r[0] for r in rows) == ["0", "1"], out
    assert sorted(r[1] for r in rows) == ["node-1", "node-2"], "one Ray Train worker per node"
    assert all(r[2] == "3" for r in rows), out
    # the workers' own lines, forwarded by Ray to the driver, each once (Ray Train's print patch
    # off: launch/jobs/launchers/ray.py NO_PRINT_PATCH): gloo
    workers = re.findall(r"ray-train worker rank=(\d) size=2 host=(node-\d) backend=gloo sum=3", out)
    assert sorted(workers) == sorted((r[0], r[1]) for r in rows), out
    assert containers_left(cluster, "t-ray2") == []
