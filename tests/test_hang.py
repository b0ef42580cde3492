"""A hang on the simulated cluster (--hang-timeout): one rank stopped with SIGSTOP through its
node's engine; the log names it stopped, from its stack (state T; the other rank waits in the
allreduce), and holds every rank's Python stack within the timeout
+ 5 s; the attempt ends as a failed one (a restart resumes the job, or the job fails naming
the hang), and every node is clean afterwards."""

from __future__ import annotations

import re
import subprocess
import threading
import time

import pytest

from dtrain.launch.jobs.store import job_log
from test_launch import EX
from test_wholerun import _job, _wait_clean

pytestmark = pytest.mark.cluster

TIMEOUT = 10


# The example's rank, not torchrun's agent nor launch/node/rank_output.py (whose command lines name
# the script too)
RANK_PROCESS = "^[^ ]*python[^ ]* (-u )?[^ ]*hang_train\\.py"


def _stop_rank_when(cluster, name: str, pattern: str, node: int, seen: dict) -> threading.Thread:
    """Once the job's log matches pattern: SIGSTOP the example's rank on node `node` (docker exec
    through that node's engine); seen["stopped"]: when; seen["stack"]: when the log first held
    that rank's stack."""
    def watch():
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            path = job_log(name)
            text = path.read_text() if path.exists() else ""
            if "stopped" not in seen and re.search(pattern, text, re.M):
                try:  # pkill: 1 where nothing matched; tried again until the deadline (seen["errors"])
                    r = subprocess.run(["docker", "-H", cluster.nodes[node - 1].docker_host, "exec", f"dtrain-{name}",
                                        "pkill", "-STOP", "-f", RANK_PROCESS],
                                       capture_output=True, text=True, timeout=30)
                    if r.returncode == 0:
                        seen["stopped"] = time.monotonic()
                    else:
                        seen.setdefault("errors", []).append(f"pkill exit {r.returncode}: {r.stderr.strip()}")
                except subprocess.TimeoutExpired as e:
                    seen.setdefault("errors", []).append(str(e))
            if "stopped" in seen and re.search(rf"^\[node-{node} r{node - 1}\] stack of pid", text, re.M):
                seen["stack"] = time.monotonic()
                return
            time.sleep(0.1)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun"])
def test_a_stopped_rank_is_named_with_its_stack_and_the_job_restarts(cluster, remote_images, launcher):
    """Under torchrun: one agent per node over the job's ssh; the stacks come from the workers
    (RANK) and the agents; the restart ends every node's torchrun (the stopped worker included)
    and starts them again."""
    name = f"t-hang-{launcher}"
    seen: dict = {}
    watcher = _stop_rank_when(cluster, name, r"^\[node-2 r1\] step 3 rank 1/2$", 2, seen)
    env = {"MASTER_ADDR": cluster.nodes[0].address, "MASTER_PORT": "29512"} if launcher == "mpirun" else {}
    code, out, _ = _job(cluster, remote_images["pytorch-ddp"],
                        ["python", f"{EX}/hang_train.py", "--steps", "8", "--step-seconds", "2"], name, n=2,
                        env=env, launcher=launcher, hang_timeout=TIMEOUT, progress_pattern="^step ", max_restarts=1)
    watcher.join(5)
    assert "stopped" in seen, (seen, out)
    # the verdict from the stacks (launch/analysis/stacks.py), not from how many lines each rank printed
    # torchrun's ranks record their collectives (launch/jobs/flightrec.py), but torch 2.13 writes no
    # dump for gloo: the line says so
    fr = "; flight recorder: no flight-recorder dump from any rank [^;]*" if launcher == "torchrun" else ""
    assert re.search(r"^\[launch\] hang: no rank made progress for 1\d\.\d s \(--hang-timeout\); "
                     r"stopped: r1 on node-2 \(state T\); r0 waits in a collective" + fr +
                     "; every rank's Python stack follows$", out, re.M), out
    # every rank's stack: the stopped one (state T) in its sleep, the other blocked in the allreduce
    assert re.search(r"^\[node-2 r1\] stack of pid \d+, state T: .*python.* .*hang_train\.py", out, re.M), out
    assert re.search(r"^\[node-2 r1\]\s+load_batch \(hang_train\.py:\d+\)", out, re.M), out
    assert re.search(r"^\[node-1 r0\]\s+train_step \(hang_train\.py:\d+\)", out, re.M), out
    assert "dtrain-rank-output" not in out, "the rank's output tagger (rank_output.py) is no rank: no stack of it"
    assert seen["stack"] - seen["stopped"] <= TIMEOUT + 5, seen
    assert re.search(r"^\[launch\] restart 1: hang: no rank made progress for [\d.]+ s; stopped: r1 \(node-2, state T\); "
                     + fr.lstrip("; ") + ("; " if fr else "") + r"same nodes", out, re.M), out
    assert re.search(r"^\[node-2 r1\] rank 1: done \(8 steps\)", out, re.M) and "[launch] job succeeded" in out, out
    assert code == 0
    _wait_clean(cluster, name)


def test_without_a_restart_the_job_fails_naming_the_hang(cluster, remote_images):
    name = "t-hang-fail"
    seen: dict = {}
    _stop_rank_when(cluster, name, r"^\[node-2 r1\] step 2 rank 1/2$", 2, seen)
    code, out, _ = _job(cluster, remote_images["pytorch-ddp"],
                        ["python", f"{EX}/hang_train.py", "--steps", "100", "--step-seconds", "2"], name, n=2,
                        env={"MASTER_ADDR": cluster.nodes[0].address, "MASTER_PORT": "29513"},
                        hang_timeout=TIMEOUT)
    assert code != 0, out
    assert re.search(r"^\[launch\] job failed \(exit 1\): hang: no rank made progress for 1\d\.\d s; "
                     r"stopped: r1 \(node-2, state T\); no restart left \(--max-restarts 0\)", out, re.M), out
    assert re.search(r"^\[node-2 r1\]\s+load_batch \(hang_train\.py:\d+\)", out, re.M), out
    _wait_clean(cluster, name)


@pytest.mark.second_cluster  # the first part's cluster is the fuller: dtrain/suite.py
def test_a_rank_that_skips_a_collective_is_named_and_the_flight_recorder_says_why_not_it(cluster, remote_images):
    """torchrun, 2 nodes, gloo: rank 1 skips step 5's allreduce (skip_collective.py). The hang
    line names it from the stacks (outside any collective, in `evaluate`); its flight recorder
    (TORCH_FR_BUFFER_SIZE, launch/jobs/flightrec.py) recorded the collectives, but torch 2.13
    writes no dump for gloo, and the line says why it cannot name it from there."""
    name = "t-hang-skip"
    code, out, _ = _job(cluster, remote_images["pytorch-ddp"],
                        ["python", f"{EX}/skip_collective.py", "--steps", "20", "--skip-at", "5"], name, n=2,
                        launcher="torchrun", hang_timeout=TIMEOUT, progress_pattern="^step ")
    assert code != 0, out
    assert re.search(r"^\[launch\] hang: no rank made progress for 1\d\.\d s \(--hang-timeout\); "
                     r"outside any collective: r1 on node-2 \(in evaluate \(skip_collective\.py:\d+\), state S\); "
                     r"r0 waits in a collective; flight recorder: no flight-recorder dump from any rank "
                     r"\(torch writes one for NCCL only, [^;]*\); every rank's Python stack follows$", out, re.M), out
    assert re.search(r"^\[node-2 r1\]\s+evaluate \(skip_collective\.py:\d+\)", out, re.M), out
    _wait_clean(cluster, name)
