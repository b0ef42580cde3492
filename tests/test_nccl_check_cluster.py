"""--nccl-check end to end on the simulated cluster (issue 51). Its nodes have no GPU, so NCCL
never runs there and the launch turns the check off (nccl_net.mode); here it is forced on
(session.nccl_mode), and each rank is a stand-in that writes the debug file NCCL would, at the path
NCCL_DEBUG_FILE gives it: the variables reach every rank through mpirun, launch/node/nccl_net.sh
runs in every container (the first's locally, the others' over the supervisor's ssh), and a
wrong network ends the job within seconds with the line naming the node, NCCL's choice, what
was expected and the fix; every node is clean afterwards."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from dtrain.launch.jobs import session
from test_wholerun import _job, _wait_clean

pytestmark = pytest.mark.cluster

# NCCL in a container without a net plugin, on sockets (NVIDIA/nccl#1231, NVIDIA/nccl#1053)
LINES = ("n:1:1 [0] NCCL INFO NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such file or "
         "directory No plugin found (libnccl-net.so), using internal implementation\n"
         "n:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>\n"
         "n:1:1 [0] NCCL INFO Using network Socket\n")
# the rank: NCCL's file (%h: the hostname up to its first dot, %p: the pid), then a long first step
RANK = ("import os, socket, time; p = os.environ['NCCL_DEBUG_FILE'].replace('%h', socket.gethostname().split('.')[0])"
        ".replace('%p', str(os.getpid())); open(p, 'w').write(" + repr(LINES) + "); print('step 0', flush=True); "
        "time.sleep(120)")


def _dmi() -> str:
    try:
        return Path("/sys/devices/virtual/dmi/id/product_name").read_text().strip()
    except OSError:
        return ""


def test_a_wrong_nccl_network_ends_the_job_in_seconds_naming_the_node(cluster, remote_images, monkeypatch):
    monkeypatch.setattr(session, "nccl_mode", lambda spec, facts: ("fail", ""))
    name = "t-nccl-check"
    t0 = time.monotonic()
    code, out, _ = _job(cluster, remote_images["pytorch-ddp"], ["python3", "-c", RANK], name, n=2,
                        efa_types=((_dmi(), 4),))  # the nodes' type (the machine's DMI) takes 4 EFA here
    took = time.monotonic() - t0
    assert code == 1, out
    assert took < 100, out  # the ranks sleep 120 s: the check ended the job
    assert re.search(r"^\[launch\] NCCL network mismatch on node-\d \(efa-unused\): Socket on eth0 "
                     r"\(libnccl-net\.so not found: no net plugin\); expected EFA x4.*fix: use a dtrain GPU image", out,
                     re.M), out
    assert re.search(r"^\[launch\] job failed \(exit 1\): NCCL network mismatch on node-1, node-2 \(efa-unused\)",
                     out, re.M), out
    assert "restart" not in out.split("NCCL network mismatch", 1)[1], out  # no restart: it would pick the same
    _wait_clean(cluster, name)
