"""Hang detection (--hang-timeout): the progress bookkeeping (launch/jobs/progress.py), the flags
and job-file keys, the event's line, and the supervisor's hang path on this machine (a real
supervise.py, a real rank process stopped with SIGSTOP, a real py-spy)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from dtrain import ROOT, contract
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import jobfile, progress, runplan, supervision
from dtrain.launch.jobs.spec import JobSpec
from dtrain.launch.jobs.launchers import launch_command

# timing bounds (a heartbeat, a supervisor's reaction): run with the cluster tests, not beside them (dtrain/suite.py)
pytestmark = pytest.mark.serial


def _render(launcher: str, ranks: list[str]):
    return supervision.Render(launcher, ranks[0], ranks=list(ranks))


def test_ranks_come_from_the_same_parsing_the_user_reads():
    mpi = _render("mpirun", ["node-1", "node-2"])
    # unbuffered mpirun output: rank 1's line split over two physical lines (output.MpiOutput)
    assert progress.ranks_of(mpi.feed("[1,1]<stdout>:step 3[1,0]<stdout>:step 4")) == [(0, "step 4")]
    assert progress.ranks_of(mpi.feed("[1,1]<stdout>:")) == [(1, "step 3")]
    assert progress.ranks_of(mpi.feed("mpirun noticed something")) == []  # not a rank's line
    torch = _render("torchrun", ["node-1", "node-1", "node-2", "node-2"])
    assert progress.ranks_of(torch.feed("[node-2] [default1]:step 7")) == [(3, "step 7")]
    assert progress.ranks_of(torch.feed("[node-2] torchrun's own line")) == []


def test_no_stall_while_any_rank_makes_progress_nor_before_the_first_progress():
    p = progress.Progress(2, started=100.0)
    assert p.stalled(1000.0, 10) is None  # imports, rendezvous: not timed
    p.feed(0, "x", 105.0)
    assert p.stalled(114.9, 10) is None
    stall = p.stalled(115.0, 10)
    assert stall is not None and stall.silent_for == 10.0


def test_the_rank_behind_is_the_one_whose_last_line_is_oldest():
    """Any line counts: a stopped rank's last line is older than those of the ranks that went
    on until they blocked in the collective waiting for it."""
    p = progress.Progress(4, started=0.0)
    for step in range(10):
        for r in range(4):
            p.feed(r, f"step {step}", step + 0.01 * r)
    for r in (0, 1, 3):  # rank 2 stopped: the others print step 10 and block
        p.feed(r, "step 10", 10 + 0.01 * r)
    p.feed(0, "rank 0 says more, as rank 0 often does", 10.05)
    stall = p.stalled(30.0, 15)
    assert stall.behind == (2,)
    assert stall.ago[2] == 21.0 and stall.steps[2] == 10


def test_with_a_pattern_the_ranks_with_fewer_steps_are_behind():
    p = progress.Progress(3, started=0.0, pattern=progress.compile_pattern(r"^step \d+"))
    assert not p.feed(0, "loading data", 1.0)
    for r in range(3):
        assert p.feed(r, "step 1", 2.0 + r)
    p.feed(0, "step 2", 6.0)
    p.feed(2, "step 2", 6.0)
    stall = p.stalled(20.0, 10)
    assert stall.behind == (1,) and stall.steps == {0: 2, 1: 1, 2: 2}


def test_a_rank_that_never_spoke_is_behind_and_ranks_outside_the_world_are_ignored():
    p = progress.Progress(2, started=0.0)
    p.feed(0, "hello", 1.0)
    assert not p.feed(5, "a rank of another attempt", 2.0)
    assert p.stalled(12.0, 10).behind == (1,)
    q = progress.Progress(3, started=0.0)  # all fell silent at once: none told apart, every rank
    for r in range(3):
        q.feed(r, "step 1", 1.0)
    assert q.stalled(11.0, 10).behind == (0, 1, 2)


def test_the_watch_reads_raw_supervisor_lines_and_the_event_names_nodes():
    ranks = ["node-1", "node-2"]
    w = progress.watch("mpirun", 5, "", ranks, now=0.0)
    w.feed("[1,0]<stdout>:step 1", 1.0)
    w.feed("[1,1]<stdout>:step 1", 1.2)
    w.feed("[1,0]<stdout>:step 2", 2.0)
    assert w.stalled(6.9) is None
    stall = w.stalled(7.0)
    fields = progress.event_fields(stall, ranks)
    assert fields == {"silent_for": 5.0, "ranks": [1], "nodes": ["node-2"], "ago": {"1": 5.8}, "steps": {"1": 1}}
    line = supervision.describe({"event": "hang", **json.loads(json.dumps(fields))})
    assert line == ("[launch] hang: no rank made progress for 5.0 s (--hang-timeout); behind: r1 on node-2 "
                    "(last progress 5.8 s ago, 1 line(s)); every rank's Python stack follows")
    assert progress.watch("mpirun", None, "", ranks, 0.0) is None


def test_render_shows_stack_lines_as_they_are():
    r = _render("mpirun", ["node-1", "node-2"])
    assert r.feed(contract.STACK_LINE + "[node-2 r1]   train (/x/hang_train.py:30)") == [
        "[node-2 r1]   train (/x/hang_train.py:30)"]


def _run_plan(argv: list[str], slots: int = 1, **policy) -> runplan.RunPlan:
    run = launch_command(JobSpec(image="i", command=tuple(argv), name="t"))
    nodes = [runplan.PlanNode("10.0.0.1", "node-1", slots, "lo")]
    plan = supervision.plan(run, nodes, ssh=[], policy=supervision.Policy(**policy), attached=False)
    return replace(plan, keep_containers=True)  # no teardown (it would signal pid 1)


def test_the_plan_carries_the_hang_settings():
    plan = _run_plan(["python", "t.py"], hang_timeout=12.5, progress_pattern="^s")
    back = runplan.RunPlan.from_json(json.loads(json.dumps(plan.to_json())))
    assert back.hang_timeout == 12.5 and back.progress_pattern == "^s"
    assert "dtrain/launch/node/stacks.sh" in supervision.builder_files()


# ---------------------------------------------------------------- flags and the job file


def _launch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(ROOT), "launch", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.mark.parametrize("args, says", [
    (["--hang-timeout", "0"], "--hang-timeout '0': expected a number > 0 and <= 86400"),
    (["--hang-timeout", "soon"], "--hang-timeout 'soon': expected a number > 0"),
    (["--hang-timeout", "10", "--progress-pattern", "step ("], "--progress-pattern 'step (': not a regular expression"),
    (["--progress-pattern", "^step"], "--progress-pattern is what --hang-timeout counts as progress"),
])
def test_bad_hang_flags_are_one_line_and_exit_2_before_any_node(args, says):
    r = _launch("--hosts", "10.255.255.1", "--image", "r/i:t", *args, "--", "true")
    assert r.returncode == 2, r.stdout + r.stderr
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_job_file_keys(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text("image: r/i:t\ncommand: python t.py\nhang_timeout: 30\nprogress_pattern: '^step [0-9]+'\n")
    got = jobfile.load(f)
    assert got["hang_timeout"] == "30" and got["progress_pattern"] == "^step [0-9]+"
    assert "hang_timeout: 30.0" in jobfile.dump({**got, "command": ["python", "t.py"]})
    f.write_text("image: r/i:t\n\nprogress_pattern: 'step ('\n")
    with pytest.raises(LaunchError, match=r"job.yaml:3: progress_pattern: .*not a regular expression"):
        jobfile.load(f)
    f.write_text("image: r/i:t\nhang_timeout: -1\n")
    with pytest.raises(LaunchError, match=r"job.yaml:2: hang_timeout '-1': expected a number > 0 and <= 86400"):
        jobfile.load(f)


# ---------------------------------------------------------------- the supervisor's hang path, here


RANK = """
import os, signal, sys, time
from pathlib import Path
rank = int(sys.argv[1])
mine, theirs = Path(f"step{rank}"), Path(f"step{1 - rank}")
def barrier(step):  # each rank waits for the other: a collective, as files
    mine.write_text(str(step))
    while not theirs.exists() or int(theirs.read_text() or -1) < step:
        time.sleep(0.02)
def step_loop():
    for step in range(1000):
        if rank == 1 and os.path.exists("stop-r1"):  # the test says when: SIGSTOP, here, in step_loop
            os.kill(os.getpid(), signal.SIGSTOP)
        print(f"[1,{rank}]<stdout>:step {step}", flush=True)
        barrier(step)
        time.sleep(0.1)
step_loop()
"""


def _stepped(path, step):
    try:
        return int(path.read_text() or -1) >= step
    except (OSError, ValueError):
        return False


def test_a_stopped_rank_is_named_its_stack_dumped_and_the_attempt_ends(tmp_path):
    """A real supervise.py (mpirun stands in: it starts two rank processes that print tagged
    lines as mpirun --tag-output does); rank 1 gets SIGSTOP: within the timeout + 5 s the log
    holds its Python stack (a frame of its file) and the hang event names it stopped, from
    its stack (a real py-spy), and with no restart left the job fails naming it. The supervisor
    and the ranks in a PID namespace of their own, as in a container (own_pids): rank 1 stops
    itself when told (its pid there is not this machine's)."""
    from test_supervise import _supervisor_env, own_pids

    (tmp_path / "rank.py").write_text(RANK)
    both = (f"OMPI_COMM_WORLD_RANK=0 {sys.executable} rank.py 0 & echo $! > r0.pid; "
            f"OMPI_COMM_WORLD_RANK=1 {sys.executable} rank.py 1 & echo $! > r1.pid; wait")
    plan = _run_plan(["sh", "-c", both, "sh"], slots=2, hang_timeout=3)
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_json()))
    proc = subprocess.Popen(own_pids([sys.executable, str(ROOT / "launch" / "node" / "supervise.py"), str(tmp_path / "plan.json")]),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_supervisor_env(tmp_path), cwd=tmp_path)
    try:
        # both ranks past their imports and in their step loop (a busy machine takes seconds to
        # start Python: a rank stopped, or sampled, while importing has no step_loop frame)
        deadline = time.monotonic() + 60
        pid_file = tmp_path / "r1.pid"
        while not (all(_stepped(tmp_path / f"step{r}", 2) for r in (0, 1)) and pid_file.exists() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline, "the ranks never reached step 2"
            time.sleep(0.1)
        pid = int((tmp_path / "r1.pid").read_text())  # in the namespace, as stacks.sh there sees it
        (tmp_path / "stop-r1").touch()
        t_stop = time.monotonic()
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()  # unshare --kill-child: the namespace's processes go with it
    # the ranks ended with the supervisor, the namespace's first process (no container here)
    log = (tmp_path / "output.log").read_text()
    events = [json.loads(ln[len(supervision.EVENT):]) for ln in log.splitlines() if ln.startswith(supervision.EVENT)]
    assert [e["event"] for e in events] == ["running", "hang", "failed"], log[-3000:]
    hang = events[1]
    # by progress (any line counts) rank 1 is behind, or both are where rank 1 stopped just after
    # its step line (they fell silent together): timing, which is why the verdict is the stacks'
    assert 1 in hang["ranks"] and set(hang["nodes"]) == {"node-1"} and hang["silent_for"] >= 3, hang
    stacks = [ln[len(contract.STACK_LINE):] for ln in log.splitlines() if ln.startswith(contract.STACK_LINE)]
    assert any(re.match(rf"\[node-1 r1\] stack of pid {pid}, state T: ", s) for s in stacks), stacks
    assert any(re.match(r"\[node-1 r1\]\s+step_loop \(.*rank\.py:\d+\)", s) for s in stacks), stacks
    # the verdict from the stacks: rank 1 stopped; rank 0's "barrier" is a loop over files, no collective
    other, stopped = hang["culprits"]  # in rank order
    assert (stopped["rank"], stopped["kind"], stopped["state"]) == (1, "stopped", "T"), hang
    assert re.match(r"(step_loop|barrier) \(.*\.py:\d+\)$", stopped["where"]), hang
    assert (other["rank"], other["kind"]) == (0, "outside") and re.match(r"barrier \(.*\.py:\d+\)$", other["where"]), hang
    reason = events[-1]["reason"]
    assert reason.startswith("hang: no rank made progress for ") and "; stopped: r1 (node-1, state T); " in reason, reason
    assert proc.returncode == 1
    assert time.monotonic() - t_stop < 60


def test_ranks_whose_last_step_lines_came_milliseconds_apart_are_not_told_apart():
    """A job that prints its step line after the step's collective: the stopped rank printed the
    same step as the others, a few ms apart (the lines' travel). Naming the rank whose line
    happened to arrive first would accuse a healthy rank: every rank is named, the stacks tell."""
    p = progress.Progress(4, started=0.0, pattern=progress.compile_pattern(r"^step "))
    for step in range(6):
        for r, jitter in zip(range(4), (0.004, 0.001, 0.006, 0.0)):
            p.feed(r, f"step {step}", step * 0.5 + jitter)
    stall = p.stalled(10.0, 5)
    assert stall.behind == (0, 1, 2, 3) and set(stall.steps.values()) == {6}
