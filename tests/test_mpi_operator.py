"""The images under the Kubeflow MPI operator's conditions, reproduced on the simulated cluster:
/root/.ssh mounted read-only from a Secret (root-owned, 0644 files), the operator's hostfile at
/etc/mpi/hostfile, and the MPIJob launcher's own mpirun argv (launch.manifests) run across two
nodes. Only the NIC differs: a pod's eth0 is a node's ens5 here."""

from __future__ import annotations

import shlex
import subprocess
import time

import pytest

from dtrain.launch.other_tools import manifests

pytestmark = pytest.mark.cluster

EX = "/opt/dtrain/node/examples"


def on_node(cluster, i: int, script: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ssh", "-F", cluster.ssh_config, f"node-{i}", script], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 or not check, r.stdout + r.stderr
    return r


def test_mpijob_argv_with_operator_mounts(cluster, remote_images, tmp_path):
    image = remote_images["horovod-tensorflow"]
    spec = manifests.ManifestSpec(target="mpijob", image=image, workers=2,
                                  command=("python", f"{EX}/allreduce_check.py", "tensorflow"))
    argv = manifests.mpijob_mpirun_argv(spec)
    assert "--hostfile" in argv and "/etc/mpi/hostfile" in argv and "-H" not in argv
    here = [("ens5" if a == manifests.POD_IFACE else a.replace("=eth0", "=ens5")) for a in argv]
    assert sum(a != b for a, b in zip(argv, here)) == 3  # btl, oob, NCCL_SOCKET_IFNAME only

    # The Secret volume: a key pair and authorized_keys, all 0644 and root-owned, read-only.
    ssh_dir, mpi_dir = tmp_path / "ssh", tmp_path / "mpi"
    ssh_dir.mkdir()
    mpi_dir.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "521", "-N", "", "-f", str(ssh_dir / "id_rsa")], check=True)
    (ssh_dir / "authorized_keys").write_text((ssh_dir / "id_rsa.pub").read_text())
    for f in ssh_dir.iterdir():
        f.chmod(0o644)
    ssh_dir.chmod(0o755)
    (mpi_dir / "hostfile").write_text("".join(f"{n.address} slots=1\n" for n in cluster.nodes[:2]))
    tmp_path.chmod(0o755)

    names = []
    try:
        for i in (1, 2):
            name = f"mpiop-{i}"
            on_node(cluster, i, f"docker rm -f {name} >/dev/null 2>&1; docker pull -q {image} >/dev/null && "
                                f"docker run -d --name {name} --network host "
                                f"-v {ssh_dir}:/root/.ssh:ro -v {mpi_dir}:/etc/mpi:ro {image} >/dev/null")
            names.append((i, name))
        inside = on_node(cluster, 1, "docker exec mpiop-1 sh -c 'stat -c \"%a %U\" /root/.ssh/id_rsa; "
                                     "touch /root/.ssh/x 2>&1 || true'").stdout
        assert "644 root" in inside and "Read-only file system" in inside
        for _ in range(50):  # both workers' sshd up on 2022
            if all(on_node(cluster, i, f"docker exec mpiop-{i} sh -c 'ss -Hltn \"sport = :2022\" | grep -q 2022'",
                           check=False).returncode == 0 for i in (1, 2)):
                break
            time.sleep(0.2)
        out = on_node(cluster, 1, shlex.join(["docker", "exec", "mpiop-1", "timeout", "-s", "KILL", "120", *here]))
        assert out.stdout.count("allreduce OK") == 2, out.stdout + out.stderr
        assert "host=node-1" in out.stdout and "host=node-2" in out.stdout
    finally:
        for i, name in names:
            on_node(cluster, i, f"docker rm -f {name} >/dev/null", check=False)
