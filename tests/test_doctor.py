"""invoke doctor: each check FAILs for a real cause made on the simulated cluster, and PASSes
once it is fixed. GPU, EFA and clock causes cannot be made on this machine: their rules are
tested on `evaluate` with recorded facts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dtrain.launch.troubleshoot import doctor as dr
from dtrain.launch.remote.hosts import Node, parse_hostfile

ROOT = Path(__file__).resolve().parent.parent


def nodes(cluster, n=3):
    return parse_hostfile(cluster.hostfile)[:n]


def check(cluster, image=None, n=3, **kw) -> dict[tuple[str, str], dr.Row]:
    rows = dr.run(nodes(cluster, n), dr.Options(image=image, ssh_opts=("-F", cluster.ssh_config), **kw),
                  say=lambda m: None)
    return {(r.node, r.check): r for r in rows}


def status(rows, node, name) -> str:
    return rows[(node, name)].status


def on_node(cluster, i, script, check=True):
    r = subprocess.run(["ssh", "-F", cluster.ssh_config, f"node-{i}", script], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 or not check, r.stderr
    return r


def addr(cluster, i) -> str:
    return cluster.nodes[i - 1].address


@pytest.mark.cluster
def test_healthy_cluster_passes(cluster, remote_images):
    rows = check(cluster, remote_images["horovod-tensorflow"])
    fails = [r for r in rows.values() if r.status == "FAIL"]
    assert not fails, fails
    assert {r.check for r in rows.values()} == set(dr.CHECKS)
    efa = [r for r in rows.values() if r.check == "efa"]  # the simulated nodes have no EFA: never a failure
    assert efa and all(r.status == "PASS" and r.detail.startswith("no EFA") for r in efa), efa


@pytest.mark.cluster
def test_docker_engine_down(cluster):
    state = json.loads(Path(cluster.state_dir, "state.json").read_text())
    pid = state["pids"]["node-2/dockerd"]
    os.kill(pid, signal.SIGSTOP)  # the engine stops answering, as a hung or dead dockerd
    try:
        rows = check(cluster, n=2)
        assert status(rows, addr(cluster, 2), "docker") == "FAIL"
        assert status(rows, addr(cluster, 1), "docker") == "PASS"
    finally:
        os.kill(pid, signal.SIGCONT)
    assert status(check(cluster, n=2), addr(cluster, 2), "docker") == "PASS"


@pytest.mark.cluster
def test_port_2022_taken(cluster):
    a = addr(cluster, 2)
    on_node(cluster, 2, f"setsid nohup python3 -m http.server 2022 --bind {a} >/dev/null 2>&1 & sleep 1")
    try:
        r = check(cluster, n=2)[(a, "port-2022")]
        assert r.status == "FAIL" and "python3" in r.detail
    finally:
        on_node(cluster, 2, "pkill -f 'http.server 2022'", check=False)
    time.sleep(0.5)
    assert status(check(cluster, n=2), a, "port-2022") == "PASS"


@pytest.mark.cluster
def test_nic_mtu_differs(cluster):
    on_node(cluster, 3, "ip link set ens5 mtu 1400")
    try:
        rows = check(cluster)
        assert all(status(rows, addr(cluster, i), "nic") == "FAIL" for i in (1, 2, 3))
        assert "mtu 1400" in rows[(addr(cluster, 3), "nic")].detail
    finally:
        on_node(cluster, 3, "ip link set ens5 mtu 1500")
    assert status(check(cluster), addr(cluster, 3), "nic") == "PASS"


@pytest.mark.cluster
def test_duplicate_hostnames(cluster):
    on_node(cluster, 3, "hostname node-2")  # node-3's own UTS namespace
    try:
        rows = check(cluster)
        assert status(rows, addr(cluster, 3), "hostnames") == "FAIL"
        assert status(rows, addr(cluster, 2), "hostnames") == "FAIL"
        assert status(rows, addr(cluster, 1), "hostnames") == "PASS"
    finally:
        on_node(cluster, 3, "hostname node-3")
    assert status(check(cluster), addr(cluster, 3), "hostnames") == "PASS"


@pytest.mark.cluster
def test_other_image_on_one_node(cluster, remote_images):
    tf, ddp = remote_images["horovod-tensorflow"], remote_images["pytorch-ddp"]
    on_node(cluster, 2, f"docker pull -q {ddp} >/dev/null && docker tag {ddp} {tf}")
    try:
        rows = check(cluster, tf)
        assert status(rows, addr(cluster, 2), "image-digest") == "FAIL"
        assert status(rows, addr(cluster, 1), "image-digest") == "PASS"
    finally:
        on_node(cluster, 2, f"docker pull -q {tf}")
    assert status(check(cluster, tf), addr(cluster, 2), "image-digest") == "PASS"


@pytest.mark.cluster
def test_small_shm_in_container(cluster, remote_images):
    image = remote_images["pytorch-ddp"]
    rows = check(cluster, image, n=2, shm_size="64m")
    r = rows[(addr(cluster, 1), "shm")]
    assert r.status == "FAIL" and "64 MiB" in r.detail
    assert status(check(cluster, image, n=2), addr(cluster, 1), "shm") == "PASS"


@pytest.mark.cluster
def test_memlock_reflects_the_node(cluster, remote_images):
    rows = check(cluster, remote_images["pytorch-ddp"], n=1)
    r = rows[(addr(cluster, 1), "memlock")]
    real = on_node(cluster, 1, "cat /proc/$(pgrep -o dockerd)/limits | awk '/Max locked/ {print $5}'").stdout.strip()
    if real == "unlimited":
        assert r.status == "PASS"
    else:  # this machine's dockerd cannot lift the limit: a real cause, a WARN without EFA
        assert r.status == "WARN" and str(int(real) // 1024) in r.detail


@pytest.mark.cluster
def test_peer_2022_blocked(cluster, remote_images):
    rule = "INPUT -p tcp --dport 2022 -j DROP -m comment --comment dtrain-test"
    on_node(cluster, 3, f"iptables -I {rule}")
    try:
        rows = check(cluster, remote_images["pytorch-ddp"])
        r = rows[(addr(cluster, 1), "peer-2022")]
        assert r.status == "FAIL" and addr(cluster, 3) in r.detail and addr(cluster, 2) not in r.detail
    finally:
        on_node(cluster, 3, f"iptables -D {rule}")
    assert status(check(cluster, remote_images["pytorch-ddp"]), addr(cluster, 1), "peer-2022") == "PASS"


@pytest.mark.cluster
def test_disk_requirement(cluster):
    rows = check(cluster, n=1, min_free_gb=10**6)
    assert status(rows, addr(cluster, 1), "disk") == "FAIL"
    assert status(check(cluster, n=1), addr(cluster, 1), "disk") == "PASS"


@pytest.mark.cluster
def test_unreachable_node_and_gpu_image(cluster, engine, tmp_path, nic_down):
    """A node that does not answer, and a GPU image on nodes without GPUs."""
    docker = engine.docker_cli()
    ref = f"{cluster.registry}/dtrain/doctor-gpu-label:1"
    subprocess.run(f"tar -cf - -T /dev/null | {docker} import --change 'LABEL dtrain.kind=gpu' "
                   f"--change 'LABEL dtrain.min-driver=570.124.06' - {ref} && {docker} push -q {ref}",
                   shell=True, check=True, capture_output=True)
    ns = nodes(cluster, 1) + [nodes(cluster, 3)[2]]
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"{addr(cluster, 1)} slots=1 port=22 user=root\n{addr(cluster, 3)} slots=1 port=22 user=root\n")
    with nic_down(3) as gone:
        rows = {(r.node, r.check): r for r in dr.run(ns, dr.Options(image=ref, ssh_opts=("-F", cluster.ssh_config)),
                                                      say=lambda m: None)}
        # The CLI: exit non-zero, the failing row, and the checklist entries that explain it.
        out = subprocess.run([sys.executable, "-m", "invoke", "doctor", "--hostfile", str(hostfile),
                              "--ssh-config", cluster.ssh_config], cwd=ROOT, capture_output=True, text=True)
    assert status(rows, gone, "ssh") == "FAIL"
    r = rows[(addr(cluster, 1), "gpu-driver")]
    assert r.status == "FAIL" and "570.124.06" in r.detail
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"{gone}  ssh" in out.stdout and "ssh FAILED" in out.stdout, out.stdout
    # a node whose NIC is down has no route: a connectivity problem, not a key's (issue 47)
    assert "#ssh-no-route" in out.stdout and "#ssh-key-perms" not in out.stdout, out.stdout


# ---------------------------------------------------------------- rules without a real cause here


def facts(**over) -> dict[str, str]:
    ipjson = json.dumps([{"ifname": "ens5", "mtu": 9001, "addr_info": [{"family": "inet", "local": "10.0.0.1"}]}])
    base = {"addr": "10.0.0.1", "hostname": "ip-10-0-0-1", "docker": "ok",
            "docker_info": '24.0|{"runc":{}}|/var/lib/docker', "gpus": "0", "driver": "", "port": "",
            "disk_kb": str(200 * 1024**2), "instance_type": "", "efa": "", "ntp": "yes",
            "ipjson": ipjson}
    return base | over


def one(f, containers=None, skew=0.0, **opts):
    n = Node("10.0.0.1", 8)
    rows = dr.evaluate([n], {"10.0.0.1": f}, {}, {"10.0.0.1": skew}, containers, dr.Options(**opts))
    return {r.check: r for r in rows}


def test_driver_older_than_image_needs():
    f = facts(gpus="8", driver="535.104.05", docker_info='24.0|{"nvidia":{},"runc":{}}|/x',
              image_id="sha256:aa", image_labels=json.dumps({"dtrain.kind": "gpu", "dtrain.min-driver": "560.35.05"}))
    r = one(f, image="img")["gpu-driver"]
    assert r.status == "FAIL" and "535.104.05 < 560.35.05" in r.detail
    f["driver"] = "570.86.15"
    assert one(f, image="img")["gpu-driver"].status == "PASS"


def test_gpus_without_nvidia_runtime():
    assert one(facts(gpus="4", driver="570.1"))["nvidia-runtime"].status == "FAIL"
    assert one(facts(gpus="4", driver="570.1", docker_info='24|{"nvidia":{}}|/x'))["nvidia-runtime"].status == "PASS"


def test_efa_instance_without_devices():
    assert one(facts(instance_type="p4d.24xlarge"))["efa"].status == "FAIL"
    assert one(facts(instance_type="g5.12xlarge", efa="/dev/infiniband/uverbs0"))["efa"].status == "PASS"
    r = one(facts(instance_type="g5.xlarge"))["efa"]
    assert r.status == "PASS" and r.detail.startswith("no EFA")


P4D_EFA = " ".join(f"/dev/infiniband/uverbs{i}" for i in range(4))


def test_efa_fewer_devices_than_the_type_has():
    r = one(facts(instance_type="p4d.24xlarge", efa="/dev/infiniband/uverbs0"))["efa"]
    assert r.status == "WARN" and "1 of the 4 EFA devices p4d.24xlarge has" in r.detail and "#efa-fewer" in r.detail
    assert "efa-fewer" in [e.id for e in dr.entries_for("efa")]
    r = one(facts(instance_type="p4d.24xlarge", efa=P4D_EFA))["efa"]
    assert (r.status, r.detail) == ("PASS", "4 EFA device(s) (p4d.24xlarge has 4)")
    p5 = " ".join(f"/dev/infiniband/uverbs{i}" for i in range(32))
    assert one(facts(instance_type="p5.48xlarge", efa=p5))["efa"].status == "PASS"
    assert one(facts(instance_type="p5.48xlarge", efa=P4D_EFA))["efa"].status == "WARN"


def test_efa_devices_libfabric_sees_in_the_container():
    c = {"peer 10.0.0.1": "ok", "shm_kb": str(4 * 1024**2), "memlock": "unlimited"}
    r = one(facts(instance_type="p4d.24xlarge", efa=P4D_EFA), containers={"10.0.0.1": {**c, "fi_efa": "4"}},
            image="i")["efa"]
    assert r.status == "PASS" and r.detail.endswith("libfabric in the container (fi_info -p efa) sees 4")
    r = one(facts(instance_type="p4d.24xlarge", efa=P4D_EFA), containers={"10.0.0.1": {**c, "fi_efa": "1"}},
            image="i")["efa"]
    assert r.status == "WARN" and "sees 1: NCCL uses only those" in r.detail
    r = one(facts(instance_type="p4d.24xlarge", efa=P4D_EFA), containers={"10.0.0.1": {**c, "fi_efa": ""}},
            image="i")["efa"]
    assert r.status == "PASS" and r.detail.endswith("no fi_info in the image")
    # a node without EFA: never a failure, whatever libfabric says
    r = one(facts(instance_type="c5.xlarge"), containers={"10.0.0.1": {**c, "fi_efa": "0"}}, image="i")["efa"]
    assert r.status == "PASS" and r.detail.startswith("no EFA")


def test_port_2022_held_by_the_named_job_passes():
    taken = facts(port="LISTEN 0 128 *:2022 users:((\"sshd.real\"))", port_jobs="train-a ")
    assert one(taken, job="train-a")["port-2022"].status == "PASS"
    r = one(taken)["port-2022"]
    assert r.status == "FAIL" and "dtrain jobs running: train-a" in r.detail


def test_memlock_fails_with_efa():
    c = {"peer 10.0.0.1": "ok", "shm_kb": str(4 * 1024**2), "memlock": "64"}
    assert one(facts(efa="/dev/infiniband/uverbs0"), containers={"10.0.0.1": c}, image="i")["memlock"].status == "FAIL"
    assert one(facts(), containers={"10.0.0.1": c}, image="i")["memlock"].status == "WARN"


def test_clock_skew():
    assert one(facts(), skew=0.3)["clock"].status == "PASS"
    assert one(facts(), skew=2.5)["clock"].status == "WARN"
    assert one(facts(), skew=-30)["clock"].status == "FAIL"


def test_table_names_checklist_entries():
    rows = [dr.Row("n1", "port-2022", "FAIL", "taken"), dr.Row("n1", "ssh", "PASS", "ok")]
    text = dr.format_table(rows)
    assert "port-2022 FAILED" in text and "#sshd-port-busy" in text
    assert text.strip().endswith("1 passed, 1 failed, 0 warnings")


def test_no_unpigz_warns_under_docker():
    """dockerd decompresses layers with unpigz when it is on the node (docs/benchmarks.md:
    a cold pull took 1.4-1.5x as long without it); older node output says nothing: not a warning."""
    r = one(facts(unpigz=""))["docker"]
    assert r.status == "WARN" and "install pigz" in r.detail and "engine 24.0" in r.detail
    assert one(facts(unpigz="/usr/bin/unpigz"))["docker"].status == "PASS"
    assert one(facts())["docker"].status == "PASS"
    assert one(facts(docker="Cannot connect", unpigz=""))["docker"].status == "FAIL"


def test_lazy_load_says_whether_the_node_can():
    lazy = one(facts(docker_info='26.1.5|{"runc":{}}|/var/lib/docker|soci'))["lazy-load"]
    assert lazy.status == "PASS" and lazy.detail.startswith("can lazy-load: storage driver soci (Docker 26.1.5")
    full = one(facts(docker_info='24.0|{"runc":{}}|/var/lib/docker|overlay2'))["lazy-load"]
    assert full.status == "PASS" and full.detail.startswith("full pulls: storage driver overlay2")
    assert "unknown" in one(facts())["lazy-load"].detail  # an older node program's 3 fields
    assert one(facts(docker="Cannot connect"))["lazy-load"].status == "FAIL"


def test_refused_connection_is_its_own_result(tmp_path):
    """A loopback port nothing listens on: the ssh row says the connection was refused and asks
    about sshd and the port; no checklist entry about keys is offered for it."""
    import socket

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DTRAIN_HOME": str(tmp_path / "home")}
    r = subprocess.run([sys.executable, "-m", "dtrain", "doctor", "--hosts", "127.0.0.1", "--ssh-opt",
                        f"Port={port}"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"connection refused: nothing listens on 127.0.0.1 port {port}; is sshd running" in r.stdout, r.stdout
    assert "ssh FAILED" in r.stdout and "#ssh-key-perms" not in r.stdout, r.stdout


def test_unreachable_network_is_connectivity_not_a_port_or_key(tmp_path):
    """`dtrain doctor --hosts` to an address this machine has no route to (a network namespace
    with only loopback: "Network is unreachable" is real and no packet leaves): the ssh row
    says no route and what to check; no key-permission or port-22 entry is offered."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DTRAIN_HOME": str(tmp_path / "home")}
    r = subprocess.run(["unshare", "-n", sys.executable, "-m", "dtrain", "doctor", "--hosts", "10.213.77.12"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "no route: Network is unreachable to 10.213.77.12 from this machine; check its route" in r.stdout, r.stdout
    assert "(connectivity, not the port or a key): #ssh-no-route" in r.stdout, r.stdout
    assert "#ssh-key-perms" not in r.stdout and "#ssh-port-22" not in r.stdout, r.stdout


def test_failure_causes_follow_the_details():
    refused = dr.ssh_detail("ssh could not connect (2 attempts): ssh: connect to host n1 port 22: Connection refused")
    assert refused.startswith("connection refused: nothing listens on n1 port 22")
    other = dr.ssh_detail("root@n2: Permission denied (publickey).")
    assert other == "root@n2: Permission denied (publickey)."
    # a timeout is dropped packets (a security group, a link down): connectivity, like no route
    timed = dr.ssh_detail("ssh could not connect (2 attempts): ssh: connect to host n2 port 22: Connection timed out")
    assert timed.startswith("no route: Connection timed out to n2")
    assert dr.causes("ssh", [timed]) == ["  no route (connectivity, not the port or a key): #ssh-no-route"]
    assert not any("#ssh-key-perms" in line for line in dr.causes("ssh", [refused]))
    both = dr.causes("ssh", [refused, other])
    assert any("connection refused" in line for line in both) and any("#ssh-key-perms" in line for line in both)


def test_nic_from_recorded_facts_one_name_passes_names_apart_in_one_subnet_warn():
    """The nic check on recorded `ip -j addr` output (launch/jobs/nic.py): one node's NIC
    passes; two nodes naming theirs apart but sharing a subnet get Open MPI's subnet, a WARN."""
    def ipjson(name, local):
        return json.dumps([{"ifname": name, "mtu": 9001,
                            "addr_info": [{"family": "inet", "local": local, "prefixlen": 24}]}])

    assert one(facts())["nic"].status == "PASS"
    a, b = Node("10.0.0.1", 8), Node("10.0.0.2", 8)
    got = {"10.0.0.1": facts(), "10.0.0.2": facts(addr="10.0.0.2", hostname="ip-10-0-0-2",
                                                  ipjson=ipjson("eth0", "10.0.0.2"))}
    got["10.0.0.1"]["ipjson"] = ipjson("ens5", "10.0.0.1")
    rows = dr.evaluate([a, b], got, {}, {"10.0.0.1": 0.0, "10.0.0.2": 0.0}, None, dr.Options())
    nic = {r.node: r for r in rows if r.check == "nic"}
    assert {r.status for r in nic.values()} == {"WARN"} and "10.0.0.0/24" in nic["10.0.0.2"].detail, nic
