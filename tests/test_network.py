"""The bandwidth check (parsers, expectations, verdict, IMDSv2) and nodes whose NICs differ.

Unit tests run anywhere; the `cluster` ones run real jobs on the simulated cluster."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest

from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import nic
from dtrain.launch.jobs.launchers.mpirun import mpirun_argv, mpirun_mixed_argv
from dtrain.launch.remote.hosts import Node, parse_hostfile
from dtrain.launch.jobs.job import Job
from dtrain.launch.jobs.commands import job_argv
from dtrain.launch.jobs.store import job_log
from dtrain.launch.jobs.spec import JobSpec, NodeFacts
from dtrain.launch.troubleshoot import checklist, network

OURS = """\
[node-1 r0] allreduce_bw size=1048576 ranks=2 time_us=2000.0 algbw=0.524 busbw=0.524
[node-1 r0] allreduce_bw size=2097152 ranks=2 time_us=3000.0 algbw=0.699 busbw=0.699
[node-1 r0] tcp_bw rank=0 src=node-1 dst=node-2 gbs=1.500
[node-1 r0] tcp_bw rank=1 src=node-2 dst=node-1 gbs=1.200
[node-1 r0] tcp_bw_min gbs=1.200 streams=1 seconds=2
"""

# all_reduce_perf 2.13 (root column), as mpirun --tag-output and the launch prefix print it
NCCL = """\
[node-1 r0] [1,0]<stdout>:#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
[node-1 r0] [1,0]<stdout>:#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
[node-1 r0] [1,0]<stdout>:     1048576        262144     float     sum      -1    303.15    3.46    6.49      0    301.2    3.48    6.53      0
[node-1 r0] [1,0]<stdout>:  1073741824     268435456     float     sum      -1   35215   30.49   57.17      0    35198   30.51   57.20      0
[node-1 r0] [1,0]<stdout>:# Avg bus bandwidth    : 31.8
"""
# the older layout, without root
NCCL_OLD = "     1048576        262144   float     sum   1035.3    1.01    1.90  5e-07    643.4    1.63    3.06  5e-07\n"


def test_busbw_is_nccl_tests_definition():
    assert network.bus_bandwidth(10.0, 2) == 10.0
    assert network.bus_bandwidth(10.0, 4) == 15.0
    assert network.bus_bandwidth(10.0, 1) == 0.0


def test_parse_our_lines_and_tcp():
    rows = network.parse_sweep(OURS)
    assert [(r.size, r.busbw) for r in rows] == [(1 << 20, 0.524), (2 << 20, 0.699)]
    assert network.parse_tcp(OURS) == 1.2
    assert network.parse_tcp("nothing") is None


def test_parse_all_reduce_perf_out_of_place():
    rows = network.parse_sweep(NCCL)
    assert [(r.size, r.algbw, r.busbw) for r in rows] == [(1 << 20, 3.46, 6.49), (1 << 30, 30.49, 57.17)]
    assert [(r.size, r.busbw) for r in network.parse_sweep(NCCL_OLD)] == [(1 << 20, 1.90)]


def test_table_shows_busbw_beside_tcp():
    table = network.format_table(network.parse_sweep(OURS), 1.2)
    assert "1 MiB" in table and "2 MiB" in table and "busbw/TCP" in table
    assert "0.58" in table.splitlines()[-1]  # 0.699 / 1.2


def test_expectations_cite_a_source_and_say_unknown():
    table = network.load_expectations()
    assert table["p4d.24xlarge"].busbw == 57.2 and "nccl/issues/527" in table["p4d.24xlarge"].source
    assert table["p5.48xlarge"].busbw is None
    assert all(e.source.startswith("https://") for e in table.values())


def _rows(peak):
    return [network.SweepRow(1 << 30, 1.0, peak, peak)]


def test_verdict_against_the_expectation():
    p4d = network.load_expectations()["p4d.24xlarge"]
    assert network.verdict(_rows(50), None, p4d, "Selected Provider is efa").status == "PASS"
    low = network.verdict(_rows(8), None, p4d, "NCCL INFO Using network Socket", gpu=True)
    assert low.status == "FAIL"
    assert low.causes[:2] == ("efa-not-selected", "efa-unused")
    assert network.verdict(_rows(30), None, p4d, "", gpu=True).status == "WARN"


def test_nccl_found_fewer_efa_nics_than_the_type_has():
    p4d = network.load_expectations()["p4d.24xlarge"]
    one_nic = "NCCL INFO NET/OFI Selected Provider is efa (found 1 nics)"
    assert "efa-fewer" in network.verdict(_rows(20.3), None, p4d, one_nic, gpu=True).causes
    newer = "NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 2 nics)"
    assert "efa-fewer" in network.verdict(_rows(20.3), None, p4d, newer, gpu=True).causes
    four = "NCCL INFO NET/OFI Selected Provider is efa (found 4 nics)"
    assert "efa-fewer" not in network.verdict(_rows(30), None, p4d, four, gpu=True).causes


def test_verdict_without_a_figure_uses_tcp_and_causes_are_checklist_entries():
    p5 = network.load_expectations()["p5.48xlarge"]
    assert network.verdict(_rows(0.7), 1.2, p5).status == "PASS"
    v = network.verdict(_rows(0.1), 1.2, None, "NET/Socket : Using 1 threads and 1 sockets per thread", gpu=True)
    assert v.status == "FAIL" and "nccl-few-sockets" in v.causes
    assert network.verdict(_rows(0.1), None, None).status == "WARN"
    assert network.verdict([], 1.0, None).status == "FAIL"
    for cause in ("efa-not-selected", "efa-unused", "efa-fewer", "nccl-few-sockets", "nccl-iface", "btl-iface"):
        assert cause in checklist.BY_ID


class _Imds(http.server.BaseHTTPRequestHandler):
    def do_PUT(self):
        ok = self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        self.send_response(200 if ok else 400)
        self.end_headers()
        self.wfile.write(b"tok")

    def do_GET(self):
        ok = self.path == "/latest/meta-data/instance-type" and self.headers.get("X-aws-ec2-metadata-token") == "tok"
        self.send_response(200 if ok else 401)
        self.end_headers()
        self.wfile.write(b"p4d.24xlarge" if ok else b"")

    def log_message(self, *a):
        pass


def test_instance_type_from_imdsv2(monkeypatch):
    srv = http.server.HTTPServer(("127.0.0.1", 0), _Imds)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", f"http://127.0.0.1:{srv.server_port}")
        assert network.instance_type_from_imds() == "p4d.24xlarge"
    finally:
        srv.shutdown()
    assert network.instance_type_from_imds("http://127.0.0.1:9", timeout=0.5) is None


def test_sweep_command():
    cpu = network.sweep_command(gpu=False, backend="hvd-tf", max_bytes=1 << 24)
    assert cpu[:3] == ["python", "/opt/dtrain/node/examples/allreduce_bw.py", "hvd-tf"]
    assert cpu[cpu.index("--max-bytes") + 1] == str(1 << 24)
    gpu = network.sweep_command(gpu=True, max_bytes=1 << 30)
    assert gpu[0] == network.ALL_REDUCE_PERF and gpu[gpu.index("-e") + 1] == str(1 << 30)
    with pytest.raises(LaunchError, match="--max-bytes"):
        network.sweep_command(gpu=False, max_bytes=100)
    assert network.cpu_backend(network.family_of("10.213.0.1:5000/dtrain/pytorch-ddp:cpu-x")) == "torch"


# ---------------------------------------------------------------- NICs named differently

IPJSON = json.dumps([
    {"ifname": "lo", "addr_info": [{"local": "127.0.0.1", "prefixlen": 8}]},
    {"ifname": "eth0", "addr_info": [{"local": "10.0.3.7", "prefixlen": 16}]},
])


def test_interface_network():
    assert nic.interface_network(IPJSON, "10.0.3.7") == "10.0.0.0/16"
    with pytest.raises(LaunchError, match="no interface carries 10.9.9.9"):
        nic.interface_network(IPJSON, "10.9.9.9", host="n2")


def test_tcp_include_same_names_keeps_the_name():
    assert nic.tcp_include({"a": ("ens5", "10.0.0.1", "10.0.0.0/16"),
                                 "b": ("ens5", "10.1.0.1", "10.1.0.0/16")}) is None


def test_tcp_include_mixed_names_takes_the_shared_subnet():
    assert nic.tcp_include({"a": ("ens5", "10.0.1.5", "10.0.0.0/16"),
                                 "b": ("eth0", "10.0.2.5", "10.0.2.0/24")}) == "10.0.0.0/16"


def test_tcp_include_no_shared_subnet_is_a_clear_error():
    with pytest.raises(LaunchError, match=r"share no subnet: a 10.0.1.5 on 10.0.1.0/24 \(ens5\); "
                                          r"b 10.0.2.5 on 10.0.2.0/24 \(eth0\)"):
        nic.tcp_include({"a": ("ens5", "10.0.1.5", "10.0.1.0/24"),
                              "b": ("eth0", "10.0.2.5", "10.0.2.0/24")})


def test_tcp_include_unknown_subnet_is_an_error():
    with pytest.raises(LaunchError, match="b: no subnet found"):
        nic.tcp_include({"a": ("ens5", "10.0.1.5", "10.0.0.0/16"), "b": ("eth0", "10.0.2.5", "")})


def test_mixed_mpirun_argv_uses_subnet_and_the_wrapper():
    argv = mpirun_mixed_argv([Node("10.0.0.1"), Node("10.0.0.2")], ["python", "t.py"],
                                      subnet="10.0.0.0/16", iface="ens5")
    i = argv.index("btl_tcp_if_include")
    assert argv[i + 1] == "10.0.0.0/16" and argv[argv.index("oob_tcp_if_include") + 1] == "10.0.0.0/16"
    assert argv.count("btl_tcp_if_include") == 1
    assert argv[-3:] == [nic.NODE_ENV_WRAPPER, "python", "t.py"]
    # same NIC names: the argv is what it was
    assert nic.NODE_ENV_WRAPPER not in mpirun_argv([Node("h")], ["x"], iface="ens5")


def test_node_env_text():
    assert nic.node_env_text("eth0") == "NCCL_SOCKET_IFNAME=eth0\nGLOO_SOCKET_IFNAME=eth0\n"
    assert nic.node_env_text("eth0", skip=["NCCL_SOCKET_IFNAME"]) == "GLOO_SOCKET_IFNAME=eth0\n"
    with pytest.raises(LaunchError):
        nic.node_env_text("eth0\nX=1")


def test_job_argv_mixed():
    facts = [NodeFacts(Node("a"), "10.0.0.1", "n1", "ens5", 0, (), ""),
             NodeFacts(Node("b"), "10.0.0.2", "n2", "eth0", 0, (), "")]
    spec = JobSpec(image="i", command=("python", "t.py"))
    argv = job_argv(spec, facts, "ens5", subnet="10.0.0.0/16")
    assert argv[argv.index("btl_tcp_if_include") + 1] == "10.0.0.0/16"
    assert nic.NODE_ENV_WRAPPER in argv


def test_node_env_wrapper_is_shellcheck_clean_and_sets_values(tmp_path):
    import subprocess

    script = Path(__file__).resolve().parent.parent / "launch/node/node_env.sh"
    subprocess.run(["shellcheck", str(script)], check=True)
    f = tmp_path / "node.env"
    f.write_text("NCCL_SOCKET_IFNAME=eth0\nbad name=1\n")
    out = subprocess.run([str(script), "sh", "-c", 'echo "$NCCL_SOCKET_IFNAME"'], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "DTRAIN_NODE_ENV": str(f), "NCCL_SOCKET_IFNAME": "ens5"})
    assert out.stdout.strip() == "eth0", out.stderr


# ---------------------------------------------------------------- on the simulated cluster

EX = "/opt/dtrain/node/examples"


@pytest.fixture
def mixed_nics(cluster):
    """node-2's NIC named eth0, the others ens5; renamed back afterwards."""
    from dtrain.launch.infra import cluster as cl

    info = cl.up(len(cluster.nodes), quiet=True, nic_names={2: "eth0"})
    yield info
    cl.up(len(cluster.nodes), quiet=True)


def _spec(info, image, command, name, **kw):
    return JobSpec(image=image, command=tuple(command), name=name, ssh_opts=("-F", info.ssh_config), **kw)


@pytest.mark.cluster
def test_mixed_nic_names_mpirun(mixed_nics, remote_images):
    info = mixed_nics
    master = info.nodes[0].address
    said: list[str] = []
    job = Job(_spec(info, remote_images["pytorch-ddp"], ["python", f"{EX}/allreduce_check.py", "ddp"], "t-mixed-mpi",
                    env={"MASTER_ADDR": master, "MASTER_PORT": "29511"}),
              parse_hostfile(info.hostfile)[:3], say=said.append)
    code = job.run()
    out = job_log("t-mixed-mpi").read_text()
    assert code == 0, out
    assert any("3 node(s): NIC ens5/eth0 (subnet 10.213.0.0/24)" in m for m in said), said
    assert out.count("allreduce OK") == 3, out


@pytest.mark.cluster
def test_mixed_nic_names_torchrun(mixed_nics, remote_images):
    info = mixed_nics
    job = Job(_spec(info, remote_images["pytorch-ddp"], ["python", f"{EX}/allreduce_check.py", "ddp"], "t-mixed-tr",
                    launcher="torchrun"), parse_hostfile(info.hostfile)[:3], say=lambda m: None)
    code = job.run()
    out = job_log("t-mixed-tr").read_text()
    assert code == 0, out
    assert out.count("allreduce OK") == 3, out


@pytest.mark.cluster
def test_mixed_nic_names_horovodrun_is_refused(mixed_nics, remote_images):
    info = mixed_nics
    job = Job(_spec(info, remote_images["horovod-tensorflow"], ["true"], "t-mixed-hvd", launcher="horovodrun"),
              parse_hostfile(info.hostfile)[:3], say=lambda m: None)
    with pytest.raises(LaunchError, match="disagree on the network interface: ens5 on .*; eth0 on"):
        job.run()


@pytest.mark.cluster
def test_cpu_sweep_on_2_nodes(cluster, remote_images):
    r = network.bandwidth(parse_hostfile(cluster.hostfile)[:2], image=remote_images["pytorch-ddp"],
                          max_bytes=4 << 20, iters=2, tcp_seconds=1, ssh_opts=("-F", cluster.ssh_config),
                          name="t-bw", say=lambda m: None)
    assert r.exit_code == 0, r.log
    assert [row.size for row in r.rows] == [1 << 20, 2 << 20, 4 << 20], r.log
    assert all(row.busbw > 0 for row in r.rows) and r.tcp_gbs and r.tcp_gbs > 0
    assert r.verdict.status in ("PASS", "WARN", "FAIL")
    assert "busbw/TCP" in network.report(r)


@pytest.mark.cluster
def test_doctor_nic_warns_on_mixed_names_with_a_shared_subnet(mixed_nics):
    from dtrain.launch.troubleshoot import doctor as dr

    info = mixed_nics
    rows = {(r.node, r.check): r for r in dr.run(parse_hostfile(info.hostfile)[:3],
                                                  dr.Options(ssh_opts=("-F", info.ssh_config)), say=lambda m: None)}
    nic = rows[(info.nodes[1].address, "nic")]
    assert nic.status == "WARN" and "subnet 10.213.0.0/24" in nic.detail, nic
