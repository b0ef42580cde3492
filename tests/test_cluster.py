"""Tests for the local simulated cluster (launch/infra/cluster.py).

Real components only: network namespaces, dockerd/containerd per node, sshd,
the registry, ssh.  Needs root on Linux with iproute2, iptables, docker.io,
docker-registry, openssh-server and debootstrap installed.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from dtrain import engine
from dtrain.launch.infra import cluster
from dtrain.launch.infra import netns as nx

# a shape of its own, and it takes the cluster down: after the 3-node tests and the other own_cluster modules
pytestmark = [pytest.mark.cluster, pytest.mark.own_cluster(takes_down=True)]

N = 2
DOCKER = cluster.DOCKER_BIN
TEST_TAR = Path("/var/cache/dtrain/bookworm-minbase-sshd.tar")
IMAGE = f"{cluster.REGISTRY}/dtrain-test/sshd:1"


def ensure_sshd_rootfs_tar() -> Path:
    """Offline-capable test image source: a debootstrap'ed bookworm minbase with
    openssh-server and iproute2, cached as a tarball (built once, needs the
    Debian mirror the first time)."""
    if TEST_TAR.exists():
        return TEST_TAR
    TEST_TAR.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=TEST_TAR.parent) as tmp:
        root = Path(tmp) / "rootfs"
        subprocess.run(["debootstrap", "--variant=minbase", "--include=openssh-server,iproute2",
                        "bookworm", str(root), engine.debian_mirror()],
                       check=True, capture_output=True)
        part = TEST_TAR.with_suffix(".tar.part")
        subprocess.run(["tar", "-C", str(root), "-cf", str(part), "."], check=True)
        part.replace(TEST_TAR)
    return TEST_TAR


def run(argv, check=True, timeout=120, **kw) -> subprocess.CompletedProcess:
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if check and cp.returncode != 0:
        raise AssertionError(f"{argv} rc={cp.returncode}\nstdout={cp.stdout}\nstderr={cp.stderr}")
    return cp


def ssh(info: cluster.ClusterInfo, target: str, cmd: str, **kw) -> subprocess.CompletedProcess:
    return run(["ssh", "-F", info.ssh_config, "-o", "BatchMode=yes", target, cmd], **kw)


@pytest.fixture(scope="module")
def info():
    cluster.down(quiet=True)  # clean slate, tolerates nothing being up
    t0 = time.monotonic()
    ci = cluster.up(N)
    print(f"up({N}) took {time.monotonic() - t0:.1f}s")
    yield ci
    cluster.down()


def test_info_and_files(info):
    assert info.names == [f"node-{i}" for i in range(1, N + 1)]
    assert info.addresses == [f"10.213.0.{10 + i}" for i in range(1, N + 1)]
    assert info.registry == "10.213.0.1:5000"
    assert info.docker_sockets == [f"/var/lib/dtrain-cluster/node{i}/docker.sock"
                                   for i in range(1, N + 1)]
    assert Path(info.hostfile).read_text() == "".join(
        f"10.213.0.{10 + i} slots=1 port=22 user=root\n" for i in range(1, N + 1))
    assert Path(info.identity_file).stat().st_mode & 0o077 == 0
    assert "Host node-1\n  HostName 10.213.0.11" in Path(info.ssh_config).read_text()
    st = cluster.status()
    assert st.up and st.nodes == N and st.problems == [], str(st)
    # the ClusterInfo round-trips through the state file
    assert cluster.ClusterInfo.from_dict(json.loads(json.dumps(info.to_dict()))) == info


def test_distinct_hostnames_over_ssh(info):
    for node in info.nodes:
        assert ssh(info, node.name, "hostname").stdout.strip() == node.name
        # by address too, the way a hostfile-driven launcher connects
        out = run(["ssh", "-i", info.identity_file, "-o", "IdentitiesOnly=yes",
                   "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                   "-o", "BatchMode=yes", "-p", "22", f"root@{node.address}", "hostname"]).stdout
        assert out.strip() == node.name


def test_each_node_has_its_own_engine(info):
    ids = set()
    for node in info.nodes:
        out = ssh(info, node.name,
                  "echo $DOCKER_HOST; command -v docker; "
                  "docker info --format '{{.ID}}|{{.Name}}|{{.DockerRootDir}}|{{.ServerVersion}}'"
                  ).stdout.split("\n")
        assert out[0] == node.docker_host
        assert out[1] == "/usr/bin/docker"
        eid, name, root, _ver = out[2].split("|")
        assert name == node.name
        assert root == f"{node.state_dir}/docker"
        ids.add(eid)
    assert len(ids) == N


def test_node_interfaces_like_ec2(info):
    for node in info.nodes:
        out = ssh(info, node.name, "ip -4 -o addr show").stdout
        addrs = {parts[1]: parts[3] for parts in (l.split() for l in out.splitlines())}
        assert addrs.get("ens5") == f"{node.address}/24", out
        assert addrs.get("docker0") == "172.17.0.1/16", out  # same on every node, as on EC2


def push_test_image_from_node1(info) -> None:
    """Import the sshd rootfs on node 1's engine and push it to the cluster registry."""
    n1 = info.nodes[0]
    with open(ensure_sshd_rootfs_tar(), "rb") as f:
        run([DOCKER, "-H", n1.docker_host, "import", "-", IMAGE], stdin=f)
    run([DOCKER, "-H", n1.docker_host, "push", IMAGE])


def test_registry_push_on_node1_pull_on_node2(info):
    n1, n2 = info.nodes[0], info.nodes[1]
    push_test_image_from_node1(info)
    ssh(info, n2.name, f"docker rmi -f {IMAGE} >/dev/null 2>&1; docker pull -q {IMAGE}")
    out = ssh(info, n2.name, f"docker image inspect --format '{{{{.Id}}}}' {IMAGE}").stdout.strip()
    assert out == run([DOCKER, "-H", n1.docker_host, "image", "inspect", "--format",
                       "{{.Id}}", IMAGE]).stdout.strip()


def test_host_network_container_sshd_reachable_from_other_node(info):
    """The launcher pattern: docker run --network host <image> sshd -p 2022 on
    node 1, reached from node 2 with ssh -p 2022."""
    n1, n2 = info.nodes[0], info.nodes[1]
    if run([DOCKER, "-H", n1.docker_host, "image", "inspect", IMAGE], check=False).returncode:
        push_test_image_from_node1(info)  # when run on its own
    ssh(info, n1.name,
        "docker rm -f dt-sshd >/dev/null 2>&1; "
        f"docker run -d --name dt-sshd --network host "
        f"-v {info.identity_file}.pub:/root/.ssh/authorized_keys:ro {IMAGE} "
        "sh -c 'mkdir -p /run/sshd && exec /usr/sbin/sshd -D -e -p 2022'")
    deadline = time.monotonic() + 20
    while not nx.tcp_open(n1.address, 2022) and time.monotonic() < deadline:
        time.sleep(0.2)
    # from node 2's host shell, into node 1's container
    out = ssh(info, n2.name,
              f"hostname; ssh -i {info.identity_file} -o IdentitiesOnly=yes -o BatchMode=yes "
              "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR "
              f"-p 2022 root@{n1.address} 'hostname; cat /proc/1/comm; cat /etc/debian_version'"
              ).stdout.split()
    assert out[0] == n2.name
    assert out[1] == n1.name          # host-network container: node's hostname
    assert out[2] == "sshd"           # we are inside the container (pid 1 is its sshd)
    assert out[3].startswith("12.")
    # the node's own sshd (port 22) is a different process namespace: pid 1 is not sshd there
    assert ssh(info, n1.name, "cat /proc/1/comm").stdout.strip() != "sshd"


MPI_ALLREDUCE_C = r"""
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int rank, size; char host[64]; double x, sum = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank); MPI_Comm_size(MPI_COMM_WORLD, &size);
    gethostname(host, sizeof host); x = rank + 1;
    MPI_Allreduce(&x, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    printf("rank %d/%d on %s sum=%g\n", rank, size, host, sum);
    MPI_Finalize(); return 0;
}
"""


def test_mpirun_across_nodes_and_the_docker0_clash(info):
    """Open MPI across the nodes works with btl_tcp_if_include, and without it
    the TCP BTL tries docker0 (172.17.0.1 on every node, as on EC2) and fails."""
    work = cluster.STATE_DIR / "mpitest"   # the nodes share the host filesystem
    work.mkdir(exist_ok=True)
    (work / "allreduce.c").write_text(MPI_ALLREDUCE_C)
    run(["mpicc", "-o", str(work / "allreduce"), str(work / "allreduce.c")])
    assert Path(info.mpi_hostfile).read_text() == "".join(
        f"{n.address} slots=1\n" for n in info.nodes)
    base = (f"mpirun --allow-run-as-root -np {N} --hostfile {info.mpi_hostfile} "
            f"--mca plm_rsh_agent 'ssh -F {info.ssh_config}' --mca btl tcp,self")
    ok = ssh(info, "node-1", f"timeout 60 {base} --mca btl_tcp_if_include {info.subnet} "
                             f"--mca oob_tcp_if_include {info.subnet} {work / 'allreduce'}").stdout
    want = N * (N + 1) / 2
    assert sorted(ok.split("\n")[:-1]) == [f"rank {i}/{N} on node-{i + 1} sum={want:g}"
                                             for i in range(N)], ok
    bad = ssh(info, "node-1", f"timeout 8 {base} {work / 'allreduce'}", check=False)
    # it hangs (timeout -> 124) after the TCP BTL dialled 172.17.0.1, which is
    # the local docker0 on every node: "connect() to 172.17.0.1:1024 failed" or
    # "accepted a TCP connection ... cannot find a corresponding process entry"
    assert bad.returncode != 0 and "sum=" not in bad.stdout, bad.stdout + bad.stderr
    assert ("172.17.0.1" in bad.stderr or "corresponding process" in bad.stderr
            or bad.returncode == 124), bad.stderr


def test_up_is_idempotent_and_refuses_other_size(info):
    t0 = time.monotonic()
    again = cluster.up(N, quiet=True)
    assert again == info
    assert time.monotonic() - t0 < 5
    with pytest.raises(cluster.ClusterError, match=r"already up; `dtrain cluster up --recreate \.\.\.` replaces it"):
        cluster.up(N + 1, quiet=True)
    assert cluster.status().up


def test_a_recreate_keeps_the_registrys_images_for_the_new_nodes(info):
    """up(recreate=True) of another shape (here: a shared directory) keeps what was pushed to the
    registry, as ECR outlives the nodes (the next shape's push finds every layer: a push of the CPU
    images to an empty registry took 190 s of CI's run per cluster made again); the new nodes'
    engines are new and pull it from there. Nothing of it is left between (REGISTRY_KEPT)."""
    push_test_image_from_node1(info)
    shared = Path(tempfile.mkdtemp(prefix="dt-shared-"))
    try:
        other = cluster.up(N, recreate=True, quiet=True, shared={str(shared): str(shared)})
        assert other.shared == ((str(shared), str(shared)),) and cluster.status().up
        assert not cluster.REGISTRY_KEPT.exists()
        n2 = other.nodes[1].name
        assert ssh(other, n2, f"docker image inspect {IMAGE}", check=False).returncode != 0  # a new engine
        ssh(other, n2, f"docker pull -q {IMAGE}")  # from the kept registry
    finally:
        again = cluster.up(N, recreate=True, quiet=True)  # as the module's fixture made it
        shutil.rmtree(shared)
    assert again == info and cluster.status().up
    ssh(info, info.nodes[0].name, f"docker pull -q {IMAGE}")
    assert not cluster.REGISTRY_KEPT.exists()


def _daemon_pids() -> list[str]:
    out = run(["ps", "-eo", "pid=,stat=,args="]).stdout
    return [l for l in out.splitlines() if f"{cluster.STATE_DIR}/" in l and " Z" not in l  # not another slot's
            and "ps -eo" not in l]


def _assert_nothing_left():
    assert [ns for ns in nx.netns_list() if ns.startswith("dtn")] == []
    assert not nx.link_exists(cluster.BRIDGE)
    assert nx.links_matching("dtv") == []
    assert _daemon_pids() == []
    # (another simulated cluster, $DTRAIN_SIM_SLOT, may be up beside this one: its rules and mounts stay)
    assert not [r for r in run(["iptables", "-S"]).stdout.splitlines()
                if "dtrain-cluster" in r and f"-i {cluster.BRIDGE} " in r]
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    assert not [p for p in points if p == str(cluster.STATE_DIR) or p.startswith(f"{cluster.STATE_DIR}/")]
    assert not cluster.STATE_DIR.exists() and not cluster.REGISTRY_KEPT.exists()
    st = cluster.status()
    assert st.info is None and not st.up and st.leftovers == []


def test_down_removes_everything(info, capfd):
    """Also after a launch's steps: the ssh masters they keep to each node for the next launch
    are closed first, so no session is left to find in a node's netns (the demo's teardown
    said `stopping 2 leftover process(es)`) and no master outlives its node."""
    from dtrain.launch.remote.hosts import parse_hostfile
    from dtrain.launch.remote.transport import SshTransport, mux_dir

    nodes = parse_hostfile(info.hostfile)
    ssh = SshTransport(nodes, ("-F", info.ssh_config))
    assert all(r.ok for r in ssh.run(nodes, lambda n: ["true"]))
    ssh.close()  # as a launch ends: the shared masters stay

    def masters() -> list[str]:  # the nodes with a live master in the shared directory
        return [n.host for n in nodes if run(["ssh", "-F", info.ssh_config, "-o", f"ControlPath={mux_dir()[0]}/%C",
                                              "-O", "check", n.host], check=False).returncode == 0]
    assert masters() == [n.host for n in nodes]  # (the test would prove nothing without them)
    state = json.loads((cluster.STATE_DIR / "state.json").read_text())
    pids = list(state["pids"].values())
    assert len(pids) == 1 + 3 * N  # registry + (containerd, dockerd, sshd) per node
    assert _daemon_pids()
    t0 = time.monotonic()
    capfd.readouterr()
    cluster.down()
    print(f"down took {time.monotonic() - t0:.1f}s")
    said = capfd.readouterr().err
    assert "leftover process" not in said, said
    assert not any(nx.pid_alive(p) for p in pids)
    assert masters() == []
    _assert_nothing_left()
    cluster.down(quiet=True)  # idempotent on nothing


def test_failed_up_leaves_nothing_behind():
    """A real failure mid-way (registry port taken) must tear down everything."""
    cluster.down(quiet=True)
    blocker = socket.socket()
    # IP_FREEBIND: bind the bridge address before the bridge exists
    blocker.setsockopt(socket.SOL_IP, getattr(socket, "IP_FREEBIND", 15), 1)
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # ignore TIME_WAIT
    blocker.bind((cluster.BRIDGE_ADDR, cluster.REGISTRY_PORT))
    blocker.listen(1)  # occupies the port; never answers HTTP
    try:
        with pytest.raises(cluster.ClusterError, match="registry") as exc:
            cluster.up(N, quiet=True, timeout=15)
        assert "address already in use" in str(exc.value)  # the registry log tail
    finally:
        blocker.close()
    _assert_nothing_left()


def test_refuses_without_root_or_bad_size():
    with pytest.raises(cluster.ClusterError, match="nodes must be"):
        cluster.up(0)
    if shutil.which("setpriv"):
        cp = run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                  "/usr/bin/python3", "-c", "from dtrain.launch.infra import cluster; cluster.up(2)"],
                 check=False, cwd=str(Path(__file__).resolve().parents[1]),
                 env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
        assert cp.returncode != 0 and "needs root" in cp.stderr, cp.stderr
