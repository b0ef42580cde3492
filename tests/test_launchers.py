"""The launch paths besides mpirun + static torchrun, run end to end on the simulated cluster:
horovodrun (Horovod's own launcher) and torchrun with c10d rendezvous, each checking every
rank's result."""

from __future__ import annotations

import re

import pytest

from test_launch import EX, containers_left, run

pytestmark = [pytest.mark.cluster, pytest.mark.second_cluster]


def test_horovodrun_allreduce_on_2_nodes(cluster, remote_images):
    code, out = run(cluster, remote_images["horovod-pytorch"], ["python", f"{EX}/allreduce_check.py", "torch"],
                    "t-hvdrun", n=2, launcher="horovodrun")
    assert code == 0, out
    oks = re.findall(r"allreduce OK rank=(\d) size=2 host=(node-\d) sum=3", out)
    assert sorted(oks) == [("0", "node-1"), ("1", "node-2")], out
    assert containers_left(cluster, "t-hvdrun") == []


def test_torchrun_c10d_on_2_nodes(cluster, remote_images):
    code, out = run(cluster, remote_images["pytorch-ddp"], ["python", f"{EX}/allreduce_check.py", "ddp"],
                    "t-c10d", n=2, launcher="torchrun", rdzv="c10d")
    assert code == 0, out
    oks = re.findall(r"allreduce OK rank=(\d) size=2 host=(node-\d) sum=3", out)
    assert sorted(r for r, _ in oks) == ["0", "1"] and sorted(h for _, h in oks) == ["node-1", "node-2"], out
    assert containers_left(cluster, "t-c10d") == []


def test_mpi_defaults_yield_to_the_users_mca():
    from dtrain.launch.jobs.launchers.mpirun import mpi_defaults

    tmp = ("orte_tmpdir_base", "/run/dtrain-mpi")  # Open MPI 4's session directories on the job container's tmpfs
    assert mpi_defaults([]) == [("plm_rsh_no_tree_spawn", "1"), ("btl_tcp_links", "2"), tmp]
    assert mpi_defaults([("btl_tcp_links", "4")]) == [("plm_rsh_no_tree_spawn", "1"), tmp]
    assert mpi_defaults([("orte_tmpdir_base", "/scratch")]) == [("plm_rsh_no_tree_spawn", "1"), ("btl_tcp_links", "2")]
    assert mpi_defaults([], ompi=5) == [("plm_rsh_no_tree_spawn", "1"), ("btl_tcp_links", "2")]  # PRRTE: its own name
    # the user chose the session directories' place: ORTE exits on orte_tmpdir_base beside the other two
    for extra in ([("orte_local_tmpdir_base", "/scratch")], [("orte_remote_tmpdir_base", "/scratch")]):
        assert tmp not in mpi_defaults(extra)
    for name in ("TMPDIR", "OMPI_MCA_orte_local_tmpdir_base", "OMPI_MCA_orte_tmpdir_base"):
        assert tmp not in mpi_defaults([], env_names=[name])
    assert tmp in mpi_defaults([], env_names=["TMP", "OMPI_MCA_btl"])
