import json

import pytest

from dtrain.launch.jobs import container
from dtrain.launch.jobs.container import (ContainerSpec, Mount, docker_run_parts, parse_env_file, parse_mount,
                                          ssh_options)
from dtrain.launch.jobs.launchers.horovodrun import horovodrun_argv
from dtrain.launch.jobs.launchers.mpirun import mpi_flags, mpirun_argv
from dtrain.launch.jobs.launchers.ray import ray_env, ray_head_argv, ray_job_argv, ray_wait_argv, ray_worker_argv
from dtrain.launch.jobs.launchers.torchrun import torchrun_argv, torchrun_env
from dtrain.launch.jobs.nic import check_same_iface, interface_for_address
from dtrain.launch.errors import LaunchError
from dtrain.launch.remote.hosts import Node

NODES = [Node("10.0.0.1", 4), Node("10.0.0.2", 4)]
TAIL = [
    "-x", "NCCL_DEBUG", "-x", "PATH", "-x", "LD_LIBRARY_PATH",
    "-x", "NCCL_SOCKET_IFNAME=ens5", "-x", "OMP_NUM_THREADS=1",
    "-x", "OPENBLAS_NUM_THREADS=1", "-x", "GOTO_NUM_THREADS=1",
]  # fmt: skip


# --- mpirun --------------------------------------------------------------------------------


def test_mpirun_two_nodes_ompi4():
    argv = mpirun_argv(
        NODES,
        ["python", "train.py", "--epochs", "3"],
        iface="ens5",
        env={"WANDB_MODE": "offline", "MSG": "a b"},
        forward=["HF_TOKEN"],
    )
    assert argv == [
        "mpirun", "--allow-run-as-root", "-np", "8", "-H", "10.0.0.1:4,10.0.0.2:4",
        "--bind-to", "none", "--map-by", "slot",
        "--mca", "pml", "ob1", "--mca", "btl", "^openib",
        "--mca", "btl_tcp_if_include", "ens5", "--mca", "oob_tcp_if_include", "ens5",
        "--mca", "plm_rsh_args", "-p 2022",
        *TAIL,
        "-x", "WANDB_MODE=offline", "-x", "MSG=a b", "-x", "HF_TOKEN",
        "python", "train.py", "--epochs", "3",
    ]  # fmt: skip


def test_mpirun_ompi5_uses_plm_ssh_args():
    argv = mpirun_argv(NODES, ["python", "t.py"], iface="eth0", ompi_major=5,
                       ssh=ssh_options(port=2222))
    i = argv.index("plm_ssh_args")
    assert argv[i - 1 : i + 2] == ["--mca", "plm_ssh_args", "-p 2222"]
    assert "plm_rsh_args" not in argv


def test_mpi_flags_overrides_and_dedup():
    flags = mpi_flags(
        iface="ens5",
        env={"OMP_NUM_THREADS": "4", "PATH": "/opt/bin"},
        forward=["NCCL_DEBUG", "HF_TOKEN", "OMP_NUM_THREADS"],
        ssh=(),
        extra_mca=[("btl_tcp_if_include", "ens5,ens6"), ("plm_rsh_no_tree_spawn", "true")],
    )
    assert flags == [
        "--bind-to", "none", "--map-by", "slot",
        "--mca", "pml", "ob1", "--mca", "btl", "^openib",
        "--mca", "btl_tcp_if_include", "ens5,ens6", "--mca", "oob_tcp_if_include", "ens5",
        "--mca", "plm_rsh_no_tree_spawn", "true",
        "-x", "NCCL_DEBUG", "-x", "PATH=/opt/bin", "-x", "LD_LIBRARY_PATH",
        "-x", "NCCL_SOCKET_IFNAME=ens5", "-x", "OMP_NUM_THREADS=4",
        "-x", "OPENBLAS_NUM_THREADS=1", "-x", "GOTO_NUM_THREADS=1", "-x", "HF_TOKEN",
    ]  # fmt: skip


def test_mpirun_rejects():
    with pytest.raises(LaunchError, match="env: bad environment variable name 'A-B'"):
        mpirun_argv(NODES, ["x"], iface="ens5", env={"A-B": "1"})
    with pytest.raises(LaunchError, match="forward: bad environment variable name 'X=1'"):
        mpirun_argv(NODES, ["x"], iface="ens5", forward=["X=1"])
    with pytest.raises(ValueError):
        mpirun_argv(NODES, [], iface="ens5")
    with pytest.raises(ValueError):
        mpirun_argv(NODES, "python train.py", iface="ens5")
    with pytest.raises(ValueError):
        mpirun_argv([], ["x"], iface="ens5")


# --- horovodrun ----------------------------------------------------------------------------


def test_horovodrun_two_nodes():
    argv = horovodrun_argv(NODES, ["python", "train.py"], iface="ens5", env={"HOROVOD_FUSION_THRESHOLD": "0"})
    assert argv == [
        "env", "NCCL_SOCKET_IFNAME=ens5", "OMP_NUM_THREADS=1", "OPENBLAS_NUM_THREADS=1",
        "GOTO_NUM_THREADS=1", "HOROVOD_FUSION_THRESHOLD=0",
        "horovodrun", "-np", "8", "-H", "10.0.0.1:4,10.0.0.2:4", "-p", "2022",
        "--network-interface", "ens5",
        "python", "train.py",
    ]  # fmt: skip


def test_horovodrun_no_port():
    argv = horovodrun_argv([Node("h1", 2)], ["python", "t.py"], iface="eth0", ssh_port=None)
    assert "-p" not in argv[argv.index("horovodrun") :]


# --- torchrun ------------------------------------------------------------------------------


def test_torchrun_static():
    assert torchrun_argv(2, 1, 8, "10.0.0.1", 29500, ["train.py", "--lr", "0.1"]) == [
        "torchrun", "--nnodes", "2", "--nproc_per_node", "8", "--node_rank", "1",
        "--master_addr", "10.0.0.1", "--master_port", "29500", "train.py", "--lr", "0.1",
    ]  # fmt: skip


def test_torchrun_c10d():
    assert torchrun_argv(2, 0, 4, "10.0.0.1", 29400, ["-m", "pkg.train"], rdzv="c10d", job_id="exp1") == [
        "torchrun", "--nnodes", "2", "--nproc_per_node", "4",
        "--rdzv_backend", "c10d", "--rdzv_endpoint", "10.0.0.1:29400", "--rdzv_id", "exp1",
        "-m", "pkg.train",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "args, kw",
    [
        ((2, 2, 8, "a", 29500, ["t.py"]), {}),
        ((0, 0, 8, "a", 29500, ["t.py"]), {}),
        ((2, 0, 8, "a", 0, ["t.py"]), {}),
        ((2, 0, 8, "a", 29500, ["t.py"]), {"rdzv": "c10d"}),
        ((2, 0, 8, "a", 29500, ["t.py"]), {"rdzv": "etcd"}),
        ((2, 0, 8, "a", 29500, []), {}),
    ],
)
def test_torchrun_rejects(args, kw):
    with pytest.raises(ValueError):
        torchrun_argv(*args, **kw)


def test_torchrun_env():
    assert torchrun_env("ens5") == {"NCCL_SOCKET_IFNAME": "ens5", "GLOO_SOCKET_IFNAME": "ens5"}


# --- env files -----------------------------------------------------------------------------


def test_parse_env_file(tmp_path):
    p = tmp_path / "job.env"
    p.write_text(
        "# secrets\n"
        "\n"
        "A=1\n"
        "export B = two words\n"
        "C='single # not a comment'\n"
        'D="double"\n'
        "E=\n"
        "F=x=y\n"
        "G=unquoted # kept\n"
        "H=\"'\"\n"
    )
    assert parse_env_file(p) == {
        "A": "1",
        "B": "two words",
        "C": "single # not a comment",
        "D": "double",
        "E": "",
        "F": "x=y",
        "G": "unquoted # kept",
        "H": "'",
    }


@pytest.mark.parametrize(
    "line, message",
    [
        ("JUSTAKEY", "expected KEY=VALUE, got 'JUSTAKEY'"),
        ("1A=x", "bad variable name '1A'"),
        ("A-B=x", "bad variable name 'A-B'"),
        ("=x", "bad variable name ''"),
        ('Q="open', "unterminated quote in value of Q"),
        ("Q='", "unterminated quote in value of Q"),
        ("OK=again", "OK set twice, first on line 2"),
    ],
)
def test_parse_env_file_errors(tmp_path, line, message):
    p = tmp_path / "job.env"
    p.write_text(f"# c\nOK=1\n{line}\n")
    with pytest.raises(LaunchError) as e:
        parse_env_file(p)
    assert str(e.value) == f"{p}:3: {message}"


def test_parse_env_file_missing(tmp_path):
    with pytest.raises(LaunchError) as e:
        parse_env_file(tmp_path / "nope.env")
    assert str(e.value) == f"{tmp_path / 'nope.env'}: cannot read env file: No such file or directory"


# --- docker run ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, mount",
    [
        ("/datasets", Mount("/datasets", "/datasets")),
        ("/datasets:ro", Mount("/datasets", "/datasets", readonly=True)),
        ("/src:/dst", Mount("/src", "/dst")),
        ("/src/:/dst:ro", Mount("/src", "/dst", readonly=True)),
        ("/src:/dst:rw", Mount("/src", "/dst")),
    ],
)
def test_parse_mount(spec, mount):
    assert parse_mount(spec) == mount


@pytest.mark.parametrize(
    "spec, message",
    [
        ("data:ro", "'data' is not an absolute path"),
        ("/src:dst", "'dst' is not an absolute path"),
        ("/a:/b:/c", "expected SRC[:DST][:ro|rw]"),
        ("/a:/b:rx", "expected SRC[:DST][:ro|rw]"),
        ("/a::ro", "expected SRC[:DST][:ro|rw]"),
        ("", "expected SRC[:DST][:ro|rw]"),
        ("/a,b", "commas in paths are not supported"),
    ],
)
def test_parse_mount_errors(spec, message):
    with pytest.raises(LaunchError) as e:
        parse_mount(spec)
    assert str(e.value) == f"--mount {spec!r}: {message}"


def test_docker_run_full():
    """The argv around the node's own flags (host/start.sh node_flags puts them between)."""
    spec = ContainerSpec(
        job="exp1",
        image="dtrain/hvd-torch:1.0",
        mounts=(parse_mount("/datasets:ro"), parse_mount("/home/u/src:/workspace")),
        env={"NCCL_DEBUG": "INFO", "MSG": "a b"},
    )
    head, rest = docker_run_parts(spec)
    assert head == [
        "docker", "run", "-d", "--name", "dtrain-exp1", "--network", "host", "--ipc", "host",
        "--tmpfs", "/run/dtrain-mpi", "--cap-add", "SYS_PTRACE"]
    assert rest == [
        "--mount", "type=bind,src=/datasets,dst=/datasets,readonly",
        "--mount", "type=bind,src=/home/u/src,dst=/workspace",
        "--label", "dtrain.job=exp1",
        "-e", "NCCL_DEBUG=INFO", "-e", "MSG=a b",
        "dtrain/hvd-torch:1.0",
    ]  # fmt: skip


def test_docker_run_cpu_shm_and_command():
    spec = ContainerSpec(job="t", image="img", shm_size="16g", command=("sleep", "infinity"), name="n1")
    assert docker_run_parts(spec) == (
        ["docker", "run", "-d", "--name", "n1", "--network", "host", "--shm-size", "16g", "--tmpfs", "/run/dtrain-mpi",
             "--cap-add", "SYS_PTRACE"],
        ["--label", "dtrain.job=t", "img", "sleep", "infinity"],
    )  # fmt: skip


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"job": "a b"}, "bad job 'a b'"),
        ({"name": "-x"}, "bad container name '-x'"),
        ({"image": "--privileged"}, "bad image '--privileged'"),
        ({"shm_size": "lots"}, "bad shm size 'lots' (e.g. 16g)"),
        ({"env": {"A B": "1"}}, "container env: bad environment variable name 'A B'"),
        ({"cap_add": ("ALL --privileged",)}, "bad capability 'ALL --privileged'"),
    ],
)
def test_docker_run_rejects(kw, message):
    spec = ContainerSpec(**{"job": "j", "image": "img", **kw})
    with pytest.raises(LaunchError) as e:
        docker_run_parts(spec)
    assert str(e.value).startswith(message)


# --- interfaces ----------------------------------------------------------------------------

IP_J = json.dumps(
    [
        {"ifindex": 1, "ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
        {
            "ifindex": 2,
            "ifname": "ens5",
            "addr_info": [
                {"family": "inet", "local": "10.0.0.7", "prefixlen": 24},
                {"family": "inet6", "local": "fe80::1", "prefixlen": 64},
            ],
        },
        {"ifindex": 3, "ifname": "docker0", "addr_info": [{"family": "inet", "local": "172.17.0.1", "prefixlen": 16}]},
        {"ifindex": 4, "ifname": "veth12", "addr_info": []},
    ]
)


def test_interface_for_address():
    assert interface_for_address(IP_J, "10.0.0.7") == "ens5"


@pytest.mark.parametrize(
    "address, message",
    [
        ("127.0.0.1", "gpu-1: 127.0.0.1 sits on lo, not a physical NIC; use the node's private address"),
        ("172.17.0.1", "gpu-1: 172.17.0.1 sits on docker0, not a physical NIC; use the node's private address"),
        (
            "10.0.0.8",
            "gpu-1: no interface carries 10.0.0.8 "
            "(seen: lo=127.0.0.1, ens5=10.0.0.7, ens5=fe80::1, docker0=172.17.0.1)",
        ),
    ],
)
def test_interface_for_address_errors(address, message):
    with pytest.raises(LaunchError) as e:
        interface_for_address(IP_J, address, host="gpu-1")
    assert str(e.value) == message


def test_interface_for_address_bad_json():
    with pytest.raises(LaunchError, match="^cannot read `ip -j addr` output"):
        interface_for_address("not json", "10.0.0.7")


def test_check_same_iface():
    assert check_same_iface({"a": "ens5", "b": "ens5"}) == "ens5"
    with pytest.raises(LaunchError) as e:
        check_same_iface({"a": "ens5", "b": "eth0", "c": "ens5"})
    assert str(e.value) == (
        "nodes disagree on the network interface: ens5 on a, c; eth0 on b (use one instance type/AMI, or name the NIC)"
    )


def test_torchrun_drops_leading_python():
    from dtrain.launch.jobs.launchers.torchrun import torchrun_argv

    argv = torchrun_argv(2, 0, 1, "10.0.0.1", 29500, ["python3", "train.py", "--lr", "1"])
    assert argv[-3:] == ["train.py", "--lr", "1"]
    argv = torchrun_argv(2, 0, 1, "10.0.0.1", 29500, ["/opt/venv/bin/python", "-m", "pkg.train"])
    assert argv[-2:] == ["-m", "pkg.train"]
    assert torchrun_argv(1, 0, 1, "h", 1, ["train.py"])[-1] == "train.py"


# --- hostfile, ssh options, pod env references ----------------------------------------------


def test_mpirun_with_hostfile_instead_of_nodes():
    argv = mpirun_argv(None, ["python", "t.py"], iface="eth0", hostfile="/etc/mpi/hostfile", np=16,
                       ssh=ssh_options(attempts=10))
    assert argv[:6] == ["mpirun", "--allow-run-as-root", "-np", "16", "--hostfile", "/etc/mpi/hostfile"]
    assert "-H" not in argv
    i = argv.index("plm_rsh_args")
    assert argv[i + 1] == "-p 2022 -o ConnectionAttempts=10"
    assert argv[6:-2] == mpi_flags(iface="eth0", ssh=ssh_options(attempts=10))


def test_mpirun_nodes_and_hostfile_are_exclusive():
    with pytest.raises(ValueError, match="exactly one of nodes or hostfile"):
        mpirun_argv(NODES, ["t"], iface="eth0", hostfile="/h", np=2)
    with pytest.raises(ValueError, match="exactly one of nodes or hostfile"):
        mpirun_argv(None, ["t"], iface="eth0")
    with pytest.raises(ValueError, match="needs np"):
        mpirun_argv(None, ["t"], iface="eth0", hostfile="/h")
    with pytest.raises(ValueError, match="only with hostfile"):
        mpirun_argv(NODES, ["t"], iface="eth0", np=3)


def test_ssh_options_without_port():
    flags = mpi_flags(iface="eth0", ssh=ssh_options(port=None, attempts=10))
    assert flags[flags.index("plm_rsh_args") + 1] == "-o ConnectionAttempts=10"
    assert "plm_rsh_args" not in mpi_flags(iface="eth0", ssh=())


# The container-side ssh of every caller, word for word as each caller built it before the one
# builder (launch/jobs/container.py) replaced their own lists.
MUX_WORDS = ["-o", "ControlMaster=auto", "-o", "ControlPath=/tmp/dtrain-mux-%C", "-o", "ControlPersist=600",
             "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]


def test_container_ssh_of_each_caller():
    assert container.supervisor_ssh() == [
        "ssh", "-p", "2022", "-l", "root", "-o", "BatchMode=yes", "-o", "ConnectTimeout=3",
        "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", *MUX_WORDS]
    assert container.ready_ssh() == ["ssh", "-p", "2022", "-o", "BatchMode=yes", "-o", "ConnectTimeout=3",
                                     *MUX_WORDS]
    assert container.doctor_ssh() == ["ssh", "-p", "2022", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5"]
    assert container.ssh_argv(attempts=5) == ["ssh", "-p", "2022", "-o", "ConnectionAttempts=5"]  # SageMaker's
    flags = mpi_flags(iface="eth0", ssh=container.mpirun_ssh())
    assert flags[flags.index("plm_rsh_args") + 1] == ("-p 2022 -o ControlMaster=auto -o ControlPath=/tmp/dtrain-mux-%C "
                                                      "-o ControlPersist=600 -o ServerAliveInterval=5 "
                                                      "-o ServerAliveCountMax=3")
    assert " ".join(ssh_options(attempts=10)) == "-p 2022 -o ConnectionAttempts=10"  # SageMaker's, the MPIJob's mpirun


def test_the_mpirun_launcher_and_the_ready_check_share_the_master_connection():
    """run.sh's ready check gets its ssh as --ssh words; mpirun's plm_rsh_args and the
    supervisor's ssh carry the same master options, so both ride the masters it left."""
    from dtrain.launch.jobs import launchers
    from dtrain.launch.jobs.runplan import LaunchCommand
    from dtrain.launch.jobs.runplan import PlanNode

    run = LaunchCommand("mpirun", ("python", "t.py"))
    argv = launchers.attempt_argv(run, [PlanNode("10.0.0.1", "n1", 1, "eth0"), PlanNode("10.0.0.2", "n2", 1, "eth0")])[0]
    assert argv[argv.index("plm_rsh_args") + 1] == " ".join(["-p", "2022", *MUX_WORDS])


def test_torchrun_pod_env_references():
    argv = torchrun_argv(2, "$(RANK)", 8, "$(MASTER_ADDR)", "$(MASTER_PORT)", ["train.py"])
    assert argv == ["torchrun", "--nnodes", "2", "--nproc_per_node", "8", "--node_rank", "$(RANK)",
                    "--master_addr", "$(MASTER_ADDR)", "--master_port", "$(MASTER_PORT)", "train.py"]
    with pytest.raises(ValueError, match="neither an int nor a"):
        torchrun_argv(2, "1", 8, "h", 29500, ["t.py"])
    with pytest.raises(ValueError, match="master_port"):
        torchrun_argv(2, 0, 8, "h", "$RANK", ["t.py"])


# ---------------------------------------------------------------- Ray

def test_ray_head_and_worker():
    assert ray_head_argv(node_ip="10.0.0.1") == [
        "ray", "start", "--head", "--port=6379", "--include-dashboard=false", "--disable-usage-stats",
        "--node-ip-address=10.0.0.1"]
    assert ray_head_argv(6380, num_cpus=0, block=True)[-2:] == ["--num-cpus=0", "--block"]
    assert ray_worker_argv("head.example:6379", num_gpus=4, block=True) == [
        "ray", "start", "--address=head.example:6379", "--disable-usage-stats", "--num-gpus=4", "--block"]


@pytest.mark.parametrize("call", [
    lambda: ray_head_argv(0),
    lambda: ray_head_argv(num_cpus=-1),
    lambda: ray_worker_argv("head-without-port"),
    lambda: ray_worker_argv("--address=x:1"),
    lambda: ray_wait_argv("h:1", 0, 10),
    lambda: ray_job_argv("h:1", []),
])
def test_ray_rejects(call):
    with pytest.raises(ValueError):
        call()


def test_ray_job_and_wait():
    assert ray_job_argv("10.0.0.1:6379", ["python", "t.py", "--x", "a b"]) == [
        "env", "RAY_ADDRESS=10.0.0.1:6379", "python", "t.py", "--x", "a b"]
    assert ray_wait_argv("10.0.0.1:6379", 3, 60) == [
        "python", "/opt/dtrain/node/ray_wait.py", "--address", "10.0.0.1:6379", "--nodes", "3", "--timeout", "60"]
    assert ray_env("ens5") == {"GLOO_SOCKET_IFNAME": "ens5", "NCCL_SOCKET_IFNAME": "ens5"}


def test_ray_node_argvs_head_first_workers_join_it():
    from dtrain.launch.jobs.spec import JobSpec, NodeFacts
    from dtrain.launch.jobs.launchers import LAUNCHERS

    facts = [NodeFacts(Node(f"node-{i}"), f"10.213.0.{10 + i}", f"node-{i}", "ens5", 0, (), "")
             for i in (1, 2)]
    spec = JobSpec(image="img", command=("python", "t.py"), launcher="ray", name="j", env={"K": "s3cret"})
    ray = LAUNCHERS["ray"]
    assert ray.node_argv(facts, 0) == ["ray", "start", "--head", "--port=6379", "--include-dashboard=false",
                                       "--disable-usage-stats", "--node-ip-address=10.213.0.11"]
    assert ray.node_argv(facts, 1) == ["ray", "start", "--address=10.213.0.11:6379", "--disable-usage-stats",
                                       "--node-ip-address=10.213.0.12"]
    assert ray.argv(spec, facts, 0, "ens5") == ["env", "RAY_ADDRESS=10.213.0.11:6379", "python", "t.py"]
    assert ray.exec_env("ens5") == {"GLOO_SOCKET_IFNAME": "ens5", "NCCL_SOCKET_IFNAME": "ens5",
                                    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}
    assert "s3cret" not in str([ray.node_argv(facts, 0), ray.argv(spec, facts, 0, "ens5")])  # --env values: a file
