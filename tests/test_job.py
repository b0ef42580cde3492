"""The launcher's pure pieces: probe parsing, rank mapping, output prefixes, job argv."""

from __future__ import annotations

import json

import pytest

from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs.hosts import Node
from dtrain.launch.jobs.job import (JobSpec, NodeFacts, facts_from_probe, job_argv, parse_probe, prefix_line,
                        rank_nodes, torchrun_node_argv)

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
    from dtrain.launch.jobs.job import MpiOutput

    out = MpiOutput(["node-1", "node-1", "node-2", "node-2"], "node-1")
    assert out.feed(line) + out.flush() == [want]


def test_torchrun_lines_get_global_rank():
    assert prefix_line("[default1]:step 3", default_node="node-2", torch_base=4) == "[node-2 r5] step 3"
    assert prefix_line("W1121 warning", default_node="node-2", torch_base=4) == "[node-2] W1121 warning"


def test_job_argv_uses_addresses_and_tags_output():
    spec = JobSpec(image="img", command=("python", "t.py"), name="j", env={"A": "1"})
    argv = job_argv(spec, facts(2), "ens5")
    assert argv[:3] == ["mpirun", "--tag-output", "--allow-run-as-root"]
    assert argv[argv.index("-H") + 1] == "10.0.0.1:2,10.0.0.2:2"
    assert ["--mca", "btl_tcp_if_include", "ens5"] == argv[argv.index("btl_tcp_if_include") - 1:][:3]
    assert "A=1" in argv and argv[-2:] == ["python", "t.py"]
    hv = job_argv(JobSpec(image="i", command=("python", "t.py"), name="j", launcher="horovodrun"), facts(2), "ens5")
    assert "horovodrun" in hv and hv[hv.index("-p") + 1] == "2022" and "--network-interface" in hv


def test_torchrun_per_node():
    spec = JobSpec(image="img", command=("python", "t.py"), name="j", launcher="torchrun")
    argv = torchrun_node_argv(spec, facts(3), 2, "ens5")
    assert argv[:2] == ["docker", "exec"] and "NCCL_SOCKET_IFNAME=ens5" in argv and "GLOO_SOCKET_IFNAME=ens5" in argv
    run = argv[argv.index("torchrun"):]
    assert run[run.index("--node_rank") + 1] == "2" and run[run.index("--master_addr") + 1] == "10.0.0.1"
    assert run[-1] == "t.py"


def test_open_mpi_version_picks_the_ssh_parameter():
    from dtrain.launch.jobs.job import ompi_major

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


IMG_ID = "sha256:" + "a" * 64
CONTAINER_ID = "b" * 64


def run_image_script(policy: str, inspect: str, pull_rc: int = 0, after_pull: str = "") -> tuple[int, str, str, list[str]]:
    """image_script's docker CLI path (no Engine API socket: sock=) in bash against a stand-in
    `docker` (a shell function) that answers the first inspect with `inspect`, `docker pull`
    with exit pull_rc, later inspects with after_pull. (returncode, stdout, stderr, docker
    calls). The API path, against a real engine: test_image_script_api_path_answers_as_the_cli."""
    import subprocess
    import tempfile

    from dtrain.launch.jobs.job import image_script

    fake = ("sock=\ndocker() { echo \"$1 $2\" >> \"$CALLS\"; case $1 in\n"
            "  inspect) if [ \"$(wc -l < \"$CALLS\")\" = 1 ]; then printf '%s\\n' \"$INSPECT\"; "
            "else printf '%s\\n' \"$AFTER\"; fi ;;\n"
            "  pull) echo 'Error response from daemon: manifest unknown' >&2; return $PULL_RC ;;\n"
            "  esac; }\n")
    with tempfile.NamedTemporaryFile("r") as calls:
        r = subprocess.run(["bash", "-c", fake + image_script("reg:5000/dtrain/x:1", policy, "j")],
                           capture_output=True, text=True,
                           env={"INSPECT": inspect, "AFTER": after_pull, "PULL_RC": str(pull_rc),
                                "CALLS": calls.name, "PATH": "/usr/bin:/bin"})
        return r.returncode, r.stdout, r.stderr, calls.read().splitlines()


def test_image_script_reads_image_and_stale_container_from_one_inspect():
    here = f"{IMG_ID} 560.35.05 4\n{CONTAINER_ID} - -"
    rc, out, err, calls = run_image_script("missing", here)
    assert rc == 0 and out.splitlines() == ["docker=ok", f"image=560.35.05 4 {IMG_ID}"]
    assert calls == ["inspect -f", "rm -f"]  # no pull: the image is there; the stale container goes
    rc, out, _, calls = run_image_script("missing", f"{IMG_ID} - -\n"
                                                    "Error: No such object: dtrain-j")
    assert out.splitlines()[-1] == f"image=- - {IMG_ID}" and calls == ["inspect -f"]


def test_image_script_reports_the_engine_error_and_stops():
    rc, out, _, calls = run_image_script("always", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock.")
    assert rc == 0 and out.strip() == "docker=Cannot connect to the Docker daemon at unix:///var/run/docker.sock."
    assert calls == ["inspect -f"]


@pytest.mark.parametrize("policy, present, pull_rc, calls, ok", [
    ("missing", False, 0, ["inspect -f", "pull -q", "inspect -f"], True),
    ("missing", False, 1, ["inspect -f", "pull -q", "inspect -f"], False),
    ("always", True, 0, ["inspect -f", "pull -q", "inspect -f"], True),
    ("always", True, 1, ["inspect -f", "pull -q", "inspect -f"], True),  # warns, runs the local one
    ("never", False, 0, ["inspect -f"], False),
    ("never", True, 0, ["inspect -f"], True),
])
def test_image_script_pull_policies(policy, present, pull_rc, calls, ok):
    missing = "Error: No such object: reg:5000/dtrain/x:1\nError: No such object: dtrain-j"
    line = f"{IMG_ID} - 5"
    rc, out, err, seen = run_image_script(policy, line if present else missing, pull_rc,
                                          after_pull=line if (present or pull_rc == 0) else missing)
    assert seen == calls
    if ok:
        assert rc == 0 and out.splitlines()[-1] == f"image=- 5 {IMG_ID}"
        assert ("pull failed (Error response from daemon: manifest unknown); using the local image" in err) == (pull_rc != 0)
    else:
        assert rc == 1 and "image reg:5000/dtrain/x:1 is not on this node and could not be pulled" in err
        assert ("manifest unknown" in err) == (policy != "never")


def test_interleaved_mpirun_chunks_are_reassembled_per_rank():
    """Seen on the simulated cluster: rank 1's line lands inside rank 2's unfinished one."""
    from dtrain.launch.jobs.job import MpiOutput

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
    assert "train-a" in port_jobs_hint([f]) and "invoke stop --job train-a" in port_jobs_hint([f])
    assert port_jobs_hint([facts_from_probe(Node("h1", 1), probe(port="LISTEN python3"), None)]) == ""


@pytest.mark.parametrize("port, gpus, driver, min_driver, starts", [
    ("", "0", "", "-", True),                       # CPU node
    ("", "8", "570.86.15", "560.35.05", True),      # driver new enough
    ("", "8", "560.35.05", "560.35.05", True),
    ("", "8", "535.104.05", "560.35.05", False),    # too old: the launcher names it
    ("", "8", "535.104.05", "-", True),             # image without the label
    ("LISTEN 0 128 *:2022 users:((\"sshd\"))", "0", "", "-", False),
])
def test_node_declines_to_start_where_the_launcher_would_refuse(port, gpus, driver, min_driver, starts):
    import subprocess

    from dtrain.launch.jobs.job import _GATE

    pre = f"port='{port}' gpus={gpus} driver='{driver}' min_driver='{min_driver}'\n"
    out = subprocess.run(["bash", "-c", pre + _GATE + "\necho go"], capture_output=True, text=True).stdout
    assert (out.strip() == "go") == starts


def test_hosts_script_appends_once():
    import subprocess
    import tempfile

    from dtrain.launch.jobs.job import hosts_script

    script = hosts_script(facts(2))
    with tempfile.NamedTemporaryFile("w+", suffix=".hosts") as f:
        f.write("127.0.0.1 localhost\n")
        f.flush()
        for _ in range(2):
            subprocess.run(["bash", "-c", script.replace("/etc/hosts", f.name)], check=True)
        assert open(f.name).read().splitlines() == [
            "127.0.0.1 localhost", "# dtrain job nodes", "10.0.0.1 node-1", "10.0.0.2 node-2"]


def test_torchrun_fills_hosts_before_it_starts():
    spec = JobSpec(image="img", command=("python", "t.py"), name="j", launcher="torchrun")
    argv = torchrun_node_argv(spec, facts(2), 0, "ens5")
    i = argv.index("bash")
    assert argv[i + 1] == "-c" and "10.0.0.2 node-2" in argv[i + 2] and argv[i + 2].endswith('exec "$@"')
    assert argv[i + 4] == "torchrun"


def test_registry_password_then_key_share_stdin():
    """The login script reads the password line; the key is the rest of stdin (up_script)."""
    import subprocess

    from dtrain.launch.jobs.job import _Login

    login = _Login("IFS= read -r pw\nprintf '%s\\n' \"$pw\" | docker login --password-stdin reg >/dev/null\n", "s3cr3t")
    fake = 'docker() { echo "login got $(cat)" >&2; }\n'
    r = subprocess.run(["bash", "-c", fake + login.script + 'key=$(cat); printf "%s" "$key"'],
                       input=login.stdin + "PRIVATE\nKEY\n", capture_output=True, text=True, check=True)
    assert r.stderr.strip() == "login got s3cr3t" and r.stdout == "PRIVATE\nKEY"
    assert _Login().stdin == ""
