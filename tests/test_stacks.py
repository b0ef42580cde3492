"""A hang's culprit from its stack dump (launch/analysis/stacks.py): each rank stopped, in disk wait,
outside any collective or waiting inside one, read from launch/node/stacks.sh's lines as py-spy
0.4 writes them; the hang line that says it (supervision.hang_line), the attempt's end
(supervise.py) and `dtrain diagnose` of a log holding a dump."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dtrain import contract
from dtrain.launch.jobs import supervision
from dtrain.launch.analysis import stacks
from dtrain.launch.troubleshoot.diagnose import diagnose, format_report

LOGS = Path(__file__).parent / "logs"


def _dump(label: str, pid: int, state: str, threads: list[tuple[str, str, list[str]]],
          cmd: str = "python train.py") -> list[str]:
    """stacks.sh's lines for one process: its header, then py-spy's threads and frames."""
    out = [f"[{label}] stack of pid {pid}, state {state}: {cmd}"]
    for i, (status, name, frames) in enumerate(threads):
        out.append(f"[{label}]   Thread {pid + i} ({status}): \"{name}\"")
        out += [f"[{label}]       {f}" for f in frames]
    return out


# Frames as py-spy prints them (innermost first; files shortened to the part under site-packages)
ALL_REDUCE = ["all_reduce (torch/distributed/distributed_c10d.py:3252)", "wrapper (torch/distributed/c10d_logger.py:83)",
              "train_step (hang_train.py:29)", "main (hang_train.py:46)", "<module> (hang_train.py:56)"]
BARRIER = ["barrier (torch/distributed/distributed_c10d.py:4551)", "wrapper (torch/distributed/c10d_logger.py:83)",
           "main (hang_train.py:50)", "<module> (hang_train.py:56)"]
HVD_ALLREDUCE = ["synchronize (horovod/torch/mpi_ops.py:950)", "forward (horovod/torch/mpi_ops.py:185)",
                 "apply (torch/autograd/function.py:575)", "allreduce (horovod/torch/mpi_ops.py:231)",
                 "main (allreduce_check.py:27)", "<module> (allreduce_check.py:52)"]
HVD_TF = ["quick_execute (tensorflow/python/eager/execute.py:53)", "horovod_allreduce (<string>:118)",
          "_allreduce (horovod/tensorflow/mpi_ops.py:124)", "allreduce (horovod/tensorflow/__init__.py:129)",
          "main (allreduce_check.py:20)"]
DDP_SYNC = ["_sync_buffers (torch/nn/parallel/distributed.py:1847)", "_pre_forward (torch/nn/parallel/distributed.py:1561)",
            "forward (torch/nn/parallel/distributed.py:1636)", "_call_impl (torch/nn/modules/module.py:1762)",
            "_wrapped_call_impl (torch/nn/modules/module.py:1751)", "_run_batch (multinode.py:42)"]
BACKWARD = ["_engine_run_backward (torch/autograd/graph.py:824)", "backward (torch/autograd/__init__.py:353)",
            "backward (torch/_tensor.py:648)", "_run_batch (multinode.py:45)", "_run_epoch (multinode.py:52)"]
LOAD_BATCH = ["load_batch (hang_train.py:24)", "main (hang_train.py:47)", "<module> (hang_train.py:56)"]
# a real py-spy 0.4.0 dump of a rank spinning in its own loop (`x += 1`), its loader thread idle
COMPUTE = ["busy (spin.py:7)", "<module> (spin.py:10)"]
LOADER = ["wait (threading.py:327)", "get (queue.py:171)", "worker (spin.py:3)", "run (threading.py:982)",
          "_bootstrap_inner (threading.py:1045)", "_bootstrap (threading.py:1002)"]


def test_the_issue_case_a_stopped_rank_among_horovod_allreduces():
    """4 nodes under mpirun, rank 1 (second host) stopped after step 3: its stack in state T,
    the others inside Horovod's allreduce. Progress counts named r2 on sim3; the stacks name r1."""
    lines = [*_dump("sim1 r0", 41, "S", [("idle", "MainThread", HVD_ALLREDUCE)]),
             *_dump("sim2 r1", 38, "T", [("idle", "MainThread", LOAD_BATCH)]),
             *_dump("sim3 r2", 40, "S", [("idle", "MainThread", HVD_ALLREDUCE)]),
             *_dump("sim4 r3", 39, "S", [("idle", "MainThread", HVD_ALLREDUCE)])]
    v = stacks.of_dump(lines, 4)
    assert [(r, p.kind, p.state) for r, p in v.named] == [(1, "stopped", "T")]
    assert v.waiting == (0, 2, 3) and v.unread == ()
    ranks = ["sim1", "sim2", "sim3", "sim4"]
    ev = {"event": "hang", "silent_for": 10.4, "ranks": [2], "nodes": ["sim3"], "ago": {"2": 11.0}, "steps": {"2": 3},
          **stacks.event_fields(v, ranks)}
    ev = json.loads(json.dumps(ev))  # as the event travels
    assert supervision.describe(ev) == (
        "[launch] hang: no rank made progress for 10.4 s (--hang-timeout); stopped: r1 on sim2 (state T); "
        "r0, r2, r3 wait in a collective; every rank's Python stack follows")
    assert "sim3" not in supervision.hang_line(ev)
    assert stacks.culprit_text(ev, brief=True) == "stopped: r1 (sim2, state T)"


@pytest.mark.parametrize("frames, frame", [
    (ALL_REDUCE, "all_reduce (torch/distributed/distributed_c10d.py:3252)"),
    (BARRIER, "barrier (torch/distributed/distributed_c10d.py:4551)"),
    (HVD_ALLREDUCE, "synchronize (horovod/torch/mpi_ops.py:950)"),
    (HVD_TF, "_allreduce (horovod/tensorflow/mpi_ops.py:124)"),
    (DDP_SYNC, "_sync_buffers (torch/nn/parallel/distributed.py:1847)"),
    (BACKWARD, "_engine_run_backward (torch/autograd/graph.py:824)"),
    (["ncclGroupEnd (libnccl.so.2)", "c10d::ProcessGroupNCCL::allreduce (libtorch_cuda.so)", "all_reduce (x.py:3)"],
     "ncclGroupEnd (libnccl.so.2)"),
    (["gloo::transport::tcp::UnboundBuffer::waitRecv(int*, std::chrono::duration<long, std::ratio<1l, 1000l> >) "
      "(libtorch_cpu.so)", "step (train.py:9)"],
     "gloo::transport::tcp::UnboundBuffer::waitRecv(int*, std::chrono::duration<long, std::ratio<1l, 1000l> >) "
     "(libtorch_cpu.so)"),
])
def test_a_rank_inside_a_collective_waits(frames, frame):
    (proc,) = stacks.parse(_dump("node-1 r0", 57, "S", [("idle", "MainThread", frames)]))
    assert stacks.place(proc) == stacks.Place("collective", frame, "S")


@pytest.mark.parametrize("state, threads, kind, where", [
    ("R", [("active+gil", "MainThread", COMPUTE), ("idle", "loader", LOADER)], "outside", "busy (spin.py:7)"),
    ("S", [("idle", "MainThread", LOAD_BATCH)], "outside", "load_batch (hang_train.py:24)"),
    ("T", [("idle", "MainThread", ALL_REDUCE)], "stopped", ALL_REDUCE[0]),  # stopped inside: stopped all the same
    ("D", [("idle", "MainThread", ["read (reader.py:12)", "__getitem__ (data.py:30)"])], "disk", "read (reader.py:12)"),
    ("t", [("idle", "MainThread", ALL_REDUCE)], "collective", ALL_REDUCE[0]),  # a tracer's stop (py-spy's own)
    ("S", [], "unread", ""),  # no py-spy in the image: the header only
])
def test_where_a_process_is(state, threads, kind, where):
    (proc,) = stacks.parse(_dump("node-2 r1", 29, state, threads))
    assert stacks.place(proc) == stacks.Place(kind, where, state)


def test_a_stopped_rank_is_named_even_without_py_spy():
    lines = [*_dump("node-1 r0", 57, "S", [("idle", "MainThread", ALL_REDUCE)]),
             "[node-2 r1] stack of pid 29, state T: python train.py",
             "[node-2 r1]   (no py-spy in this image: SIGABRT to pid 29; its stack follows in its own output "
             "where faulthandler is on)"]
    v = stacks.of_dump(lines, 2)
    assert [(r, p.kind) for r, p in v.named] == [(1, "stopped")] and v.waiting == (0,)


def test_a_rank_in_a_compute_loop_is_named_with_its_frame():
    lines = [*_dump("node-1 r0", 57, "S", [("idle", "MainThread", BARRIER)]),
             *_dump("node-2 r1", 29, "R", [("active+gil", "MainThread", COMPUTE), ("idle", "loader", LOADER)])]
    ev = stacks.event_fields(stacks.of_dump(lines, 2), ["node-1", "node-2"])
    assert stacks.culprit_text(ev) == ("outside any collective: r1 on node-2 (in busy (spin.py:7), state R); "
                                       "r0 waits in a collective")


def test_when_every_rank_waits_the_progress_counts_tell_and_the_line_says_so():
    lines = [line for r in range(3) for line in _dump(f"node-{r + 1} r{r}", 50 + r, "S", [("idle", "MainThread", ALL_REDUCE)])]
    v = stacks.of_dump(lines, 3)
    assert v.named == () and v.waiting == (0, 1, 2) and v.read
    ev = {"silent_for": 10.0, "ranks": [2], "nodes": ["node-3"], "ago": {"2": 12.5}, "steps": {"2": 4},
          **stacks.event_fields(v, ["node-1", "node-2", "node-3"])}
    assert supervision.hang_line(ev) == (
        "hang: no rank made progress for 10.0 s (--hang-timeout); every rank waits in a collective (stacks); "
        "by progress, behind: r2 on node-3 (last progress 12.5 s ago, 4 line(s)); every rank's Python stack follows")
    nothing = stacks.event_fields(stacks.of_dump(["[node-1] no stacks: the dump did not end within 30 s"], 3),
                                  ["node-1", "node-2", "node-3"])
    assert supervision.hang_line({**ev, **nothing}).startswith(
        "hang: no rank made progress for 10.0 s (--hang-timeout); no rank's stack read; by progress, behind: r2 on node-3")


def test_an_event_without_a_verdict_reads_as_before():
    """An older supervisor's event (no culprits): behind, by progress."""
    ev = {"silent_for": 5.0, "ranks": [1], "nodes": ["node-2"], "ago": {"1": 5.8}, "steps": {"1": 1}}
    assert supervision.hang_line(ev) == ("hang: no rank made progress for 5.0 s (--hang-timeout); behind: r1 on node-2 "
                                         "(last progress 5.8 s ago, 1 line(s)); every rank's Python stack follows")


def test_a_rank_without_a_stack_is_named_where_every_other_waits():
    lines = [line for r in (0, 2, 3) for line in _dump(f"n{r} r{r}", 50 + r, "S", [("idle", "MainThread", HVD_ALLREDUCE)])]
    lines.append("[n1] no stacks: ssh: connect to host n1 port 2022: Connection refused")
    v = stacks.of_dump(lines, 4)
    assert [(r, p.kind) for r, p in v.named] == [(1, "unread")] and v.unread == (1,)
    assert stacks.culprit_text(stacks.event_fields(v, ["n0", "n1", "n2", "n3"])) == (
        "no stack read: r1 on n1; r0, r2, r3 wait in a collective")


def test_a_ranks_workers_do_not_make_it_a_culprit():
    """DataLoader workers carry their rank's label (RANK in their environment): the rank waits
    in its collective while a worker reads from disk (D) or idles on its queue."""
    lines = [*_dump("node-1 r0", 57, "S", [("idle", "MainThread", ALL_REDUCE)]),
             *_dump("node-1 r0", 91, "D", [("idle", "MainThread", ["read (reader.py:12)", "_worker_loop (torch/utils/data/_utils/worker.py:309)"])]),
             *_dump("node-2 r1", 29, "S", [("idle", "MainThread", LOAD_BATCH)]),
             *_dump("node-2", 12, "S", [("idle", "MainThread", ["_poll (torch/distributed/elastic/agent/server/api.py:900)"])])]
    at = stacks.places(stacks.parse(lines))
    assert at[0].kind == "collective" and at[1].kind == "outside" and set(at) == {0, 1}  # the agent has no rank


def test_parse_skips_locals_other_output_colours_and_the_prefix():
    lines = [contract.STACK_LINE + "[node-1 r0] stack of pid 57, state S: python t.py",
             contract.STACK_LINE + '[node-1 r0]   Thread 57 (idle): "MainThread"',
             contract.STACK_LINE + "[node-1 r0]       \x1b[32mtrain\x1b[0m (\x1b[36mt.py\x1b[0m:9)",
             contract.STACK_LINE + "[node-1 r0]           Locals:",
             contract.STACK_LINE + "[node-1 r0]               x: all_reduce (torch/distributed/distributed_c10d.py:1)",
             "[node-1 r0] step 5 (a rank's own line, amid the dump)",
             contract.STACK_LINE + "[node-1 r0]       main (t.py:20)\r"]
    (proc,) = stacks.parse(lines)
    assert proc.threads[0].frames == (stacks.Frame("train", "t.py:9"), stacks.Frame("main", "t.py:20"))
    assert stacks.place(proc).kind == "outside"


# ---------------------------------------------------------------- diagnose


def test_diagnose_names_the_culprit_from_a_dump_in_a_log():
    """tests/logs/hang.log: the cluster test's real log (progress named r1 behind; the stacks
    say why: stopped)."""
    (f,) = [f for f in diagnose((LOGS / "hang.log").read_text()) if f.entry.id == "hang"]
    assert f.notes == ("line 11: stopped: r1 on node-2 (state T); r0 waits in a collective",)
    assert "   stacks: line 11: stopped: r1 on node-2 (state T); r0 waits in a collective" in format_report([f])


def test_diagnose_of_a_dump_where_every_rank_waits():
    text = "\n".join([
        "[launch] hang: no rank made progress for 10.1 s (--hang-timeout); every rank waits in a collective "
        "(stacks); by progress, behind: r1 on node-2 (last progress 12.0 s ago, 3 line(s)); every rank's Python stack follows",
        *_dump("node-1 r0", 57, "S", [("idle", "MainThread", ALL_REDUCE)]),
        *_dump("node-2 r1", 29, "S", [("idle", "MainThread", BARRIER)]),
        "[launch] job failed (exit 1): hang: no rank made progress for 10.1 s",
        *_dump("node-2 r1", 30, "T", [("idle", "MainThread", LOAD_BATCH)]),  # after the [launch] line: not this dump's
    ])
    (f,) = [f for f in diagnose(text) if f.entry.id == "hang"]
    assert f.notes == ("line 1: every rank waits in a collective (stacks); by progress, behind: the ranks the hang "
                       "line names",)


# ---------------------------------------------------------------- stacks.sh, real processes


def test_stacks_sh_and_a_real_py_spy_give_the_verdict(tmp_path):
    """launch/node/stacks.sh on this machine, on two real processes of an attempt: one stopped
    with SIGSTOP, one spinning in its own loop; py-spy reads both, the verdict names both (no
    collective here)."""
    script = contract.node_script("stacks.sh")
    spin = "import sys\ndef busy():\n    open(sys.argv[1], 'w').close()\n    x = 0\n    while True:\n        x += 1\nbusy()\n"
    (tmp_path / "spin.py").write_text(spin)
    env = {**os.environ, "DTRAIN_TEST_ATTEMPT": "7"}
    # torchrun's workers have RANK, horovodrun's own (gloo) HOROVOD_RANK
    procs = [subprocess.Popen([sys.executable, str(tmp_path / "spin.py"), str(tmp_path / f"in{r}")], env={**env, var: str(r)})
             for r, var in enumerate(("RANK", "HOROVOD_RANK"))]
    try:
        deadline = time.monotonic() + 60  # both in busy(), past Python's start (seconds on a busy machine)
        while not all((tmp_path / f"in{r}").exists() for r in (0, 1)):
            assert time.monotonic() < deadline, "the processes never reached busy()"
            time.sleep(0.05)
        os.kill(procs[1].pid, signal.SIGSTOP)
        r = subprocess.run(["bash", "-s", "--", "DTRAIN_TEST_ATTEMPT", "7", "here"], input=script,
                           capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    finally:
        for p in procs:
            p.kill()
            p.wait()
    lines = r.stdout.splitlines()
    v = stacks.of_dump(lines, 2)
    assert dict((rk, (p.kind, p.state)) for rk, p in v.named) == {0: ("outside", "R"), 1: ("stopped", "T")}, r.stdout
    assert dict(v.named)[0].where.startswith("busy ("), r.stdout
