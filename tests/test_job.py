"""The launcher's pure pieces: probe parsing, rank mapping, output prefixes, job argv."""

from __future__ import annotations

import json

import pytest

from dtrain import contract
from dtrain.launch.errors import LaunchError
from dtrain.launch.remote.hosts import Node
from dtrain.launch.jobs import commands, job, runplan
from dtrain.launch.jobs.job import facts_from_probe, parse_probe
from dtrain.launch.jobs.commands import job_argv, per_node_argv
from dtrain.launch.jobs.output import prefix_line, rank_nodes
from dtrain.launch.jobs.spec import JobSpec, NodeFacts

IPJSON = json.dumps([
    {"ifname": "lo", "mtu": 65536, "addr_info": [{"family": "inet", "local": "127.0.0.1"}]},
    {"ifname": "ens5", "mtu": 9001, "addr_info": [{"family": "inet", "local": "10.0.0.11"}]},
    {"ifname": "docker0", "mtu": 1500, "addr_info": [{"family": "inet", "local": "172.17.0.1"}]},
])


def probe(**over) -> str:
    d = {"addr": "10.0.0.11", "hostname": "ip-10-0-0-11", "docker": "ok", "gpus": "8",
         "efa": "/dev/infiniband/uverbs0 /dev/infiniband/uverbs1", "port": "", "memlock": "unlimited",
         "ipjson": IPJSON} | over
    return "\n".join(f"{k}={v}" for k, v in d.items())


def test_probe_to_facts():
    f = facts_from_probe(Node("ip-10-0-0-11.ec2.internal", 8), probe(), None)
    assert (f.address, f.iface, f.gpus, f.memlock) == ("10.0.0.11", "ens5", 8, -1)
    assert f.efa == ("/dev/infiniband/uverbs0", "/dev/infiniband/uverbs1")
    assert facts_from_probe(Node("h", 1), probe(memlock="8388608"), None).memlock == 8388608


def test_memlock_warning_names_only_capped_nodes_with_efa():
    efa_capped = facts_from_probe(Node("a", 1), probe(memlock="8388608"), None)
    plain_capped = facts_from_probe(Node("b", 1), probe(memlock="8388608", efa="", gpus="0"), None)
    efa_unlimited = facts_from_probe(Node("c", 1), probe(), None)
    line = job.memlock_warning([efa_capped, plain_capped, efa_unlimited])
    assert line.startswith("dockerd cannot lift the memlock limit on a (8192 KiB):") and "\n" not in line, line
    assert job.memlock_warning([plain_capped, efa_unlimited]) == ""  # the simulated cluster: no warning


def test_probe_errors_name_the_node():
    with pytest.raises(LaunchError, match="h1: Docker engine not reachable: Cannot connect"):
        facts_from_probe(Node("h1", 1), probe(docker="Cannot connect to the Docker daemon"), None)
    with pytest.raises(LaunchError, match="h1: --iface eth9 does not exist .*ens5"):
        facts_from_probe(Node("h1", 1), probe(), "eth9")


def test_parse_probe_ignores_noise():
    assert parse_probe("motd line\naddr=1.2.3.4\n=x\n") == {"addr": "1.2.3.4"}


def facts(n: int, slots: int = 2) -> list[NodeFacts]:
    return [NodeFacts(Node(f"h{i}", slots), f"10.0.0.{i}", f"node-{i}", "ens5", 0, (), "")
            for i in range(1, n + 1)]


def test_ranks_fill_nodes_in_order():
    assert rank_nodes(facts(2, slots=2)) == ["node-1", "node-1", "node-2", "node-2"]


@pytest.mark.parametrize("line, want", [
    ("[1,3]<stdout>:loss 0.1", "[node-2 r3] loss 0.1"),
    ("[1,0]<stderr>:warning", "[node-1 r0] warning"),
    ("[1,2]<stdout>:loss 0.1[1,2]<stdout>:", "[node-2 r2] loss 0.1"),  # split write
    ("mpirun noticed that process rank 1 ...", "[node-1] mpirun noticed that process rank 1 ..."),
])
def test_mpirun_lines(line, want):
    from dtrain.launch.jobs.output import MpiOutput

    out = MpiOutput(["node-1", "node-1", "node-2", "node-2"], "node-1")
    assert out.feed(line) + out.flush() == [want]


def test_torchrun_lines_get_global_rank():
    assert prefix_line("[default1]:step 3", default_node="node-2", torch_base=4) == "[node-2 r5] step 3"
    assert prefix_line("W1121 warning", default_node="node-2", torch_base=4) == "[node-2] W1121 warning"


def test_job_argv_uses_addresses_and_tags_output_per_rank():
    """mpirun without --tag-output: each rank's command runs under launch/node/rank_output.py
    (its text in argv), which tags the rank's lines; horovodrun's command too."""
    spec = JobSpec(image="img", command=("python", "t.py"), name="j", env={"A": "1"})
    argv = job_argv(spec, facts(2), "ens5")
    program = contract.node_script("rank_output.py")
    assert argv[:2] == ["mpirun", "--allow-run-as-root"] and "--tag-output" not in argv
    assert argv[argv.index("-H") + 1] == "10.0.0.1:2,10.0.0.2:2"
    assert ["--mca", "btl_tcp_if_include", "ens5"] == argv[argv.index("btl_tcp_if_include") - 1:][:3]
    assert argv[argv.index("A") - 1] == "-x" and not any("A=" in a for a in argv)  # the value is not in argv
    assert argv[-7:] == ["python3", "-I", "-S", "-c", program, "python", "t.py"]
    assert runplan.shown_argv(argv, program)[-3:] == ["<launch/node/rank_output.py>", "python", "t.py"]
    hv = job_argv(JobSpec(image="i", command=("python", "t.py"), name="j", launcher="horovodrun"), facts(2), "ens5")
    assert "horovodrun" in hv and hv[hv.index("-p") + 1] == "2022" and "--network-interface" in hv
    assert hv[-7:] == ["python3", "-I", "-S", "-c", program, "python", "t.py"]


def test_torchrun_per_node():
    spec = JobSpec(image="img", command=("python", "t.py"), name="j", launcher="torchrun")
    argv = per_node_argv(spec, facts(3), 2, "ens5")
    assert argv[:2] == ["docker", "exec"] and "NCCL_SOCKET_IFNAME=ens5" in argv and "GLOO_SOCKET_IFNAME=ens5" in argv
    opts = argv[argv.index("dtrain-run") + 1:argv.index("--")]
    assert "--fill-hosts" in opts and opts[opts.index("--host") + 1:][:2] == ["10.0.0.1", "node-1"]
    run = argv[argv.index("torchrun"):]
    assert run[run.index("--node_rank") + 1] == "2" and run[run.index("--master_addr") + 1] == "10.0.0.1"
    assert run[-1] == "t.py"


def test_open_mpi_version_picks_the_ssh_parameter():
    from dtrain.launch.jobs.launchers.mpirun import ompi_major

    assert ompi_major("mpirun (Open MPI) 4.1.4\n\nReport bugs to ...") == 4
    assert ompi_major("mpirun (Open MPI) 5.0.3\n") == 5
    with pytest.raises(LaunchError, match="not Open MPI"):
        ompi_major("HYDRA build details: MPICH")
    spec = JobSpec(image="img", command=("python", "t.py"), name="j")
    five = job_argv(spec, facts(2), "ens5", ompi=5)
    assert five[five.index("plm_ssh_args") + 1].startswith("-p 2022 ") and "plm_rsh_args" not in five


def test_driver_older_than_the_image_needs_is_refused():
    from dtrain.launch.jobs.job import check_driver

    gpu = [NodeFacts(Node("h1", 8), "10.0.0.1", "n1", "ens5", 8, (), "", -1, "535.104.05"),
           NodeFacts(Node("h2", 8), "10.0.0.2", "n2", "ens5", 8, (), "", -1, "570.86.15")]
    with pytest.raises(LaunchError, match="h1: driver 535.104.05 < 560.35.05") as e:
        check_driver(gpu, {"h1": "560.35.05", "h2": "560.35.05"})
    assert "h2" not in str(e.value)
    check_driver(gpu, {"h1": "530.30.02", "h2": "530.30.02"})  # new enough
    check_driver(facts(2), {"h1": "560.35.05"})  # CPU nodes: nothing to check


def test_interleaved_mpirun_chunks_are_reassembled_per_rank():
    """Seen on the simulated cluster: rank 1's line lands inside rank 2's unfinished one."""
    from dtrain.launch.jobs.output import MpiOutput

    out = MpiOutput(["node-1", "node-2", "node-3"], "node-1")
    shown = []
    for line in ["[1,2]<stdout>:allreduce OK rank=2[1,1]<stdout>:allreduce OK rank=1",
                 "[1,2]<stdout>:",
                 "[1,0]<stdout>:allreduce OK rank=0",
                 "[1,1]<stderr>:KeyError[1,1]<stderr>:: [1,1]<stderr>:'X'",
                 "--------------------------------------------------------------------------",
                 "[1,0]<stdout>:"]:
        shown += out.feed(line)
    shown += out.flush()
    assert shown == ["[node-2 r1] allreduce OK rank=1",
                     "[node-3 r2] allreduce OK rank=2",
                     "[node-1 r0] allreduce OK rank=0",
                     "[node-2 r1] KeyError: 'X'",
                     "[node-1] --------------------------------------------------------------------------",
                     "[node-1 r0] "]


def test_port_taken_by_another_dtrain_job_names_it():
    from dtrain.launch.jobs.job import port_jobs_hint

    f = facts_from_probe(Node("h1", 1), probe(port="LISTEN 0 128 0.0.0.0:2022 users:((\"sshd.real\"))",
                                              port_jobs="train-a "), None)
    assert f.port_jobs == ("train-a",)
    assert "train-a" in port_jobs_hint([f]) and "dtrain stop --job train-a" in port_jobs_hint([f])
    assert port_jobs_hint([facts_from_probe(Node("h1", 1), probe(port="LISTEN python3"), None)]) == ""


def test_driver_check_is_one_comparison():
    from dtrain.launch.jobs.job import driver_too_old

    assert driver_too_old("535.104.05", "560.35.05") and not driver_too_old("570.86.15", "560.35.05")
    assert not driver_too_old("", "560.35.05") and not driver_too_old("535.104.05", "")


def test_job_store_records_and_lists(tmp_path, monkeypatch):
    from dtrain.launch.jobs import store

    monkeypatch.setenv("DTRAIN_HOME", str(tmp_path))
    store.record("j1", name="j1", launcher="mpirun", nodes=[{}], image="img", state="starting", pid=0)
    store.record("j1", state="succeeded", exit_code=0)
    assert store.load_job("j1")["state"] == "succeeded" and store.load_job(None)["name"] == "j1"
    assert store.status_rows()[1] == ("j1", "succeeded", "mpirun", "1", "img", "0")


def test_ecr_login_for_the_nodes_decodes_the_token_once(monkeypatch):
    """An ECR image gets a login (user, password from the one decoder, dtrain.ecr); the
    password travels on stdin only; any other image gets none."""
    from moto import mock_aws

    from dtrain import ecr
    from dtrain.launch.jobs.login import login_for

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    assert login_for("10.213.0.1:5000/dtrain/x:1").args == ["", ""]
    with mock_aws():
        login = login_for("123456789012.dkr.ecr.us-east-1.amazonaws.com/dtrain/x:1")
    assert login.args == ["123456789012.dkr.ecr.us-east-1.amazonaws.com", "AWS"]
    assert login.password and login.stdin == login.password + "\n"
    with pytest.raises(ValueError, match="not base64"):
        ecr.decode_token("%%%")


def test_run_argv_starts_the_command_in_cwd_when_given():
    from dtrain.launch.jobs.job import run_argv

    spec = JobSpec(image="img", command=("python", "t.py"), name="j", launcher="ray")
    plain = run_argv(spec, facts(2), ["python", "t.py"], ready=False, fill_hosts=True)
    assert "-w" not in plain[:plain.index("dtrain-j")]
    there = run_argv(spec, facts(2), ["python", "t.py"], ready=False, fill_hosts=True, cwd="/workdir")
    assert there[:there.index("dtrain-j")] == ["docker", "exec", "-w", "/workdir"]
    assert there[there.index("dtrain-j"):] == plain[plain.index("dtrain-j"):]


def test_signals_end_a_launch_with_128_plus_the_signal():
    import signal

    from dtrain.launch.jobs.job import interrupt_code
    from dtrain.interrupts import Signalled

    assert interrupt_code(KeyboardInterrupt()) == (130, "interrupted")
    assert interrupt_code(Signalled(signal.SIGTERM)) == (143, "SIGTERM received")
    assert interrupt_code(Signalled(signal.SIGHUP)) == (129, "SIGHUP received")


def test_a_checkpoint_dir_on_no_mount_is_warned_of_and_on_a_read_only_one_refused():
    from dtrain.launch.jobs.container import parse_mount

    def spec(ckpt, *mounts):
        return JobSpec(image="r/i:t", command=("true",), checkpoint_dir=ckpt,
                       mounts=tuple(parse_mount(m) for m in mounts))

    assert job.check_checkpoint_dir(spec(None)) is None
    assert job.check_checkpoint_dir(spec("/fsx/ckpt", "/fsx")) is None
    assert job.check_checkpoint_dir(spec("/ckpt", "/tmp/r/ckpt:/ckpt")) is None
    assert job.check_checkpoint_dir(spec("/data/out", "/data:ro", "/scratch:/data/out")) is None  # the deeper one, rw
    warning = job.check_checkpoint_dir(spec("/ckpt", "/fsx"))
    assert warning.startswith("--checkpoint-dir /ckpt is not under any --mount") and "/fsxx" not in warning
    assert job.check_checkpoint_dir(spec("/fsxx/ckpt", "/fsx")) is not None  # a prefix is not a parent
    with pytest.raises(LaunchError, match=r"^--checkpoint-dir /data/ckpt: on a read-only --mount \(/data:ro\)"):
        job.check_checkpoint_dir(spec("/data/ckpt", "/data:ro"))


def test_the_launch_refuses_a_read_only_checkpoint_dir_before_any_node_and_warns_of_an_unshared_one(tmp_path):
    import os, subprocess, sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "DTRAIN_HOME": str(tmp_path)}
    argv = [sys.executable, "-m", "invoke", "launch", "--hosts", "127.0.0.1:1", "--ssh-opt", "Port=1",
            "--image", "10.213.0.1:5000/dtrain/x:1", "--max-restarts", "1"]
    ro = subprocess.run([*argv, "--mount", "/data:ro", "--checkpoint-dir", "/data/ckpt", "--", "true"],
                        cwd=root, env=env, capture_output=True, text=True, timeout=60)
    assert (ro.returncode, ro.stderr.count("\n")) == (2, 1), ro.stderr
    assert ro.stderr.startswith("error: --checkpoint-dir /data/ckpt: on a read-only --mount") and "127.0.0.1" not in ro.stderr
    unshared = subprocess.run([*argv, "--checkpoint-dir", "/ckpt", "--", "true"],
                              cwd=root, env=env, capture_output=True, text=True, timeout=60)
    assert "[launch] warning: --checkpoint-dir /ckpt is not under any --mount" in unshared.stdout + unshared.stderr


def test_the_first_nodes_container_waits_for_the_supervisor_only_with_the_jobs_directory():
    """up's docker run for the standby node runs launch/node/standby.sh on the job's directory
    (mounted: its FIFOs are there) instead of the image's CMD; any other node's, or one without
    the directory (doctor), keeps the image's CMD."""
    from dtrain.launch.jobs import node_programs, supervision

    spec = JobSpec(image="reg/x:1", command=("true",), name="t")
    waits = commands.up_args(spec, ["", ""], "ssh-ed25519 AAAA", "/home/u/.dtrain/nodes/n1/jobs/t", standby=True)
    plain = commands.up_args(spec, ["", ""], "ssh-ed25519 AAAA", "/home/u/.dtrain/nodes/n1/jobs/t")
    standby = node_programs.container_argv("standby.sh", [supervision.CONTAINER_JOB_DIR])
    assert waits[-len(standby) - 1:] == ["reg/x:1", *standby] and plain[-1] == "reg/x:1"
    assert waits[:-len(standby)] == plain
    assert commands.container_spec(spec, "", standby=True).command == ()
    assert f"type=bind,src=/home/u/.dtrain/nodes/n1/jobs/t,dst={supervision.CONTAINER_JOB_DIR}" in waits


def test_read_lines_gives_each_reads_lines_as_text_mode_would():
    """output.read_lines (the launcher's and the supervisor's reader): a list per read, lines
    as Python's text mode ends them (\\r\\n split across reads too), UTF-8 across reads."""
    import io
    import random

    from dtrain.launch.jobs.output import read_lines

    def reads(chunks):
        it = iter([*chunks, b""])
        return lambda size: next(it)

    got = list(read_lines(reads([b"a\nb", b"c\r", b"\nd\re\xff\n", b"\xc3", b"\xa9 end"])))
    assert got == [["a"], ["bc", "d", "e\ufffd"], ["é end"]]
    rng = random.Random(7)
    for _ in range(300):
        pieces = [b"a", b"\r", b"\n", b"\r\n", "é".encode(), b"\xff"]
        data = b"".join(rng.choice(pieces) for _ in range(rng.randrange(40)))
        cuts = sorted(rng.sample(range(len(data) + 1), min(len(data) + 1, rng.randrange(6))))
        chunks = [data[i:j] for i, j in zip([0, *cuts], [*cuts, len(data)]) if data[i:j]]
        want = [line.rstrip("\n") for line in io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="replace")]
        assert [line for batch in read_lines(reads(chunks)) for line in batch] == want, (data, chunks)


def test_a_shown_line_is_one_write_with_its_newline(monkeypatch):
    """Ctrl-C between a line and its newline (print() writes them apart) glued the launch's
    `[launch] interrupted: ...` to the last rank line on the screen."""
    import io
    import sys

    writes: list[str] = []

    class Screen(io.StringIO):
        def write(self, s):
            writes.append(s)
            return super().write(s)

    monkeypatch.setattr(sys, "stdout", Screen())
    j = job.Job(JobSpec(image="img", command=("true",), name="t-emit"), [Node("10.0.0.1", 1)], say=print).sink
    j.emit("[node-1 r0] tick 5001")
    assert writes == ["[node-1 r0] tick 5001\n"]
    with j.batched():  # the lines of one read of the job's output: one write, each line ended
        j.emit("[node-1 r0] tick 5002")
        j.emit("[node-2 r1] tick 5002")
        assert writes == ["[node-1 r0] tick 5001\n"]
    assert writes[1:] == ["[node-1 r0] tick 5002\n[node-2 r1] tick 5002\n"]


def test_keys_are_a_pair_and_a_host_key_made_side_by_side_and_removed(tmp_path):
    """Keys: the job's ed25519 pair and its containers' host key, two different keys, 0600 in a
    0700 directory; result() gives the same answer every time; remove() leaves nothing."""
    import subprocess

    keys = job.Keys(tmp_path, "dtrain-t")
    private, public, host = keys.result()
    assert keys.result() == (private, public, host)
    assert private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----") and host.startswith("-----BEGIN OPENSSH")
    assert public.startswith("ssh-ed25519 ") and public.endswith(" dtrain-t") and private != host
    derived = subprocess.run(["ssh-keygen", "-y", "-f", str(keys.dir / "id_ed25519")], capture_output=True,
                             text=True, check=True).stdout.split()[:2]
    assert derived == public.split()[:2]
    assert oct(keys.dir.stat().st_mode & 0o777) == "0o700"
    assert {oct((keys.dir / f).stat().st_mode & 0o777) for f in ("id_ed25519", "ssh_host_ed25519_key")} == {"0o600"}
    keys.remove()
    assert list(tmp_path.iterdir()) == []


def test_without_ssh_keygen_keys_fail_naming_it_and_leave_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(LaunchError, match="ssh-keygen not found"):
        job.Keys(tmp_path, "dtrain-t")
    assert list(tmp_path.iterdir()) == []
