"""The job supervisor (launch/node/supervise.py runs in the first container, with the standard
library and the launcher's dtrain builders): an attempt on the surviving nodes runs what the
launcher's own builder makes for those nodes, and the restart decisions."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace

import pytest

from dtrain import ROOT
from dtrain.launch.jobs import launchers, runplan, supervision
from dtrain.launch.remote.hosts import Node
from dtrain.launch.jobs.spec import JobSpec, NodeFacts
from dtrain.launch.jobs.launchers import LAUNCHERS, launch_command, plan_nodes
from dtrain.launch.jobs.supervision import EVENT

# timing bounds (a heartbeat, a supervisor's reaction): run with the cluster tests, not beside them (dtrain/suite.py)
pytestmark = pytest.mark.serial

_spec = importlib.util.spec_from_file_location("supervise", ROOT / "launch" / "node" / "supervise.py")
sv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sv)

NODES = [Node("10.0.0.1", 2), Node("10.0.0.2", 1), Node("10.0.0.3", 4)]
PLAN_NODES = [runplan.PlanNode(n.host, f"node-{i + 1}", n.slots, "ens5") for i, n in enumerate(NODES)]
CMD = ["python", "train.py", "-np", "9", "-H", "x:1", "--nnodes", "7"]  # the user's own look-alike flags stay


FACTS = [NodeFacts(n, n.host, f"node-{i + 1}", "ens5" if i != 2 else "eth0", 0, (), "", network="10.0.0.0/24")
         for i, n in enumerate(NODES)]


def _supervisor_argvs(tmp_path, plan: runplan.RunPlan, keep: list[int], attempt: int = 1) -> list[list[str]]:
    """What the supervisor runs for an attempt on the nodes `keep` (its processes not started)."""
    sup = sv.Supervisor(plan, tmp_path)
    ran: list[list[str]] = []
    sup._spawn = lambda argv, env, prefix="", node="": ran.append(argv)
    sup.remote = lambda node, line, **kw: shlex.split(line.split(" && exec ", 1)[1])
    sup.start([plan.nodes[i] for i in keep], attempt)
    return ran


@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun", "torchrun"])
@pytest.mark.parametrize("keep", [[0, 1, 2], [0, 2], [0, 1], [0]])
def test_a_restart_on_fewer_nodes_runs_what_the_launchers_builder_makes_for_them(tmp_path, launcher, keep):
    """One author of the launch command: the supervisor's attempt on the nodes left is exactly
    the launcher's own command for those nodes (mpirun's -np/-H, torchrun's --nnodes and
    node ranks; the user's look-alike flags untouched)."""
    spec = JobSpec(image="i", command=tuple(CMD), launcher=launcher, name="j", env={"TOKEN": "s3cret"},
                   checkpoint_dir="/ckpt", extra_mca=(("btl_tcp_links", "4"),), rdzv="c10d")
    same_nic = [replace(f, iface="ens5") for f in FACTS]
    facts = same_nic if launcher == "horovodrun" else FACTS
    subnet = None if launcher == "horovodrun" else "10.0.0.0/24"
    prefix = ["bash", "-c", "run.sh", "--"] if launcher == "torchrun" else []
    plan = supervision.plan(launch_command(spec, 5, subnet), plan_nodes(facts), ssh=["ssh"],
                            policy=supervision.Policy(min_nodes=1), node_prefix=prefix)
    plan = runplan.RunPlan.from_json(json.loads(json.dumps(plan.to_json())))  # as the supervisor reads it
    left = [facts[i] for i in keep]
    builder = LAUNCHERS[launcher]
    if launcher == "torchrun":
        want = [[*prefix, *builder.argv(spec, left, r, f.iface, 5, subnet)] for r, f in enumerate(left)]
    else:
        want = [builder.argv(spec, left, 0, left[0].iface, 5, subnet)]
    got = _supervisor_argvs(tmp_path, plan, keep)
    assert got == want
    assert "s3cret" not in json.dumps(plan.to_json()) + str(got)  # --env values travel by file, never argv
    if launcher == "mpirun":
        assert got[0][got[0].index("-H") + 1] == ",".join(f"{f.address}:{f.node.slots}" for f in left)
        assert got[0][-len(CMD):] == CMD


def test_stop_attempt_does_not_wait_for_the_output_of_a_lost_nodes_session(tmp_path):
    """A session over an ssh master (torchrun's on each node) hands its output pipe to the master,
    which keeps it open until its keepalives give a dead link up: stop_attempt does not wait for
    that pipe's end where the node is lost (it did, 5 s: a restart's teardown); the lines the
    session printed are in the log."""
    import os
    import sys

    plan = supervision.plan(launch_command(JobSpec(image="i", command=("true",), name="j"), 5, None),
                            plan_nodes(FACTS), ssh=["ssh"], policy=supervision.Policy(min_nodes=1))
    sup = sv.Supervisor(runplan.RunPlan.from_json(json.loads(json.dumps(plan.to_json()))), tmp_path)
    # the master's part: a process outside the session's process group that holds its stdout
    holder = ("import subprocess, sys; p = subprocess.Popen(['sleep', '30'], start_new_session=True, stdout=sys.stdout); "
              "print('held by', p.pid, flush=True); subprocess.run(['sleep', '30'])")
    sup.procs = [sup._spawn([sys.executable, "-c", holder], dict(os.environ), "[node-2] ", "node-2")]
    log = tmp_path / "output.log"
    deadline = time.monotonic() + 10
    while "held by" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(log.read_text().split("held by ", 1)[1].split()[0])
    try:
        t0 = time.monotonic()
        sup.stop_attempt(grace=0.3, lost=["node-2"])
        assert time.monotonic() - t0 < 2
        assert sup.procs[0].poll() is not None and sup.pumps == []
    finally:
        os.kill(pid, 9)


def test_rank_map_follows_slots_in_node_order():
    assert runplan.rank_map(PLAN_NODES) == ["node-1", "node-1", "node-2", "node-3", "node-3", "node-3", "node-3"]


def test_next_step():
    alive = PLAN_NODES
    assert sv.next_step(alive, (), {}, 0, 0, 2, 1) == ("succeeded", "")
    step, why = sv.next_step(alive, (), {"node-3": "sshd on 2022 unreachable: Connection refused"}, 0, 1, 2, 1)
    assert step == "restart" and "node-3" in why and "Connection refused" in why
    step, why = sv.next_step(alive, (), {"node-3": "gone"}, 1, 1, 2, 1)
    assert step == "failed" and "--max-restarts 1" in why
    step, why = sv.next_step(alive, (), {"node-2": "gone", "node-3": "gone"}, 0, 1, 2, 3)
    assert step == "failed" and "1 node(s) left and no spare, fewer than --min-nodes 2" in why and "node-2" in why
    step, why = sv.next_step(alive, (), {}, 0, 3, 1, 2)  # a rank failed, every node still there
    assert step == "restart" and "exited 3" in why
    assert sv.next_step(alive, (), {}, 2, 3, 1, 2)[0] == "failed"
    spare = runplan.PlanNode("10.0.0.4", "node-4", 2, "ens5")
    # with a spare, two lost of three still restart at full size... one replaced, one dropped
    assert sv.next_step(alive, (spare,), {"node-2": "gone", "node-3": "gone"}, 0, 1, 2, 3)[0] == "restart"
    assert sv.next_step(alive, (spare,), {"node-2": "gone", "node-3": "gone"}, 0, 1, 3, 3)[0] == "failed"
    step, why = sv.next_step(alive, (spare,), {"node-1": "leaving (spot notice)"}, 0, 1, 1, 3)
    assert step == "failed" and "first node, where its supervisor runs" in why


def test_swap_out_puts_a_spare_in_the_lost_nodes_place():
    n1, n2, n3 = PLAN_NODES
    s4, s5 = runplan.PlanNode("10.0.0.4", "node-4", 2, "ens5"), runplan.PlanNode("10.0.0.5", "node-5", 2, "ens5")
    assert runplan.swap_out(PLAN_NODES, (s4, s5), {"node-2": "gone"}) == ((n1, s4, n3), (s5,), {"node-2": "node-4"})
    assert runplan.swap_out(PLAN_NODES, (s4,), {"node-2": "x", "node-3": "y"}) == ((n1, s4), (), {"node-2": "node-4"})
    assert runplan.swap_out(PLAN_NODES, (s4, s5), {"node-4": "spare lost"}) == (tuple(PLAN_NODES), (s5,), {})
    assert runplan.swap_out(PLAN_NODES, (), {}) == (tuple(PLAN_NODES), (), {})


def test_a_node_is_lost_only_when_silent_and_unreachable_or_silent_for_long():
    plan = _plan(["true"])
    assert sv.verdict(0.4, None, plan) == ""
    assert sv.verdict(2.0, None, plan) == ""  # not asked yet: the port check decides
    assert sv.verdict(2.0, True, plan) == ""  # slow (a busy CPU, a disk under writeback), not lost
    assert "port 2022 unreachable" in sv.verdict(2.0, False, plan)
    assert sv.verdict(plan.lost_after, True, plan) == f"no heartbeat for {plan.lost_after:.0f} s"


def _full_listener() -> tuple[socket.socket, socket.socket]:
    """A loopback listener whose accept queue is full (backlog 0, one connection queued): the
    kernel drops every further SYN, as a node whose NIC is down answers none."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    queued = socket.create_connection(listener.getsockname(), timeout=2)
    return listener, queued


def test_the_port_check_answers_at_once_or_within_its_timeout_and_one_lost_syn_is_not_a_loss(monkeypatch):
    """port_answers: a port that takes connections answers True at once, a refusing one False
    at once (the container gone); one that drops SYNs False after the timeout. Its SYNs go
    timeout/3 apart, so where the first is dropped and a later one taken (the queue freed 0.1 s
    in) it is True: a single connect would wait for the kernel's retry, 1 s, past the timeout."""
    listener, queued = _full_listener()
    port = listener.getsockname()[1]
    monkeypatch.setattr(sv.contract, "SSH_PORT", port)
    try:
        t0 = time.monotonic()
        assert sv.port_answers("127.0.0.1", 0.6) is False
        assert 0.55 < time.monotonic() - t0 < 2
        freed = threading.Timer(0.1, lambda: listener.accept()[0].close())
        t0 = time.monotonic()
        freed.start()
        assert sv.port_answers("127.0.0.1", 0.9) is True  # SYNs at 0, 0.3 and 0.6 s
        assert 0.05 < time.monotonic() - t0 < 1.0  # not the first SYN's retry (1 s)
        freed.join()
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))  # bound, not listening: refused
        monkeypatch.setattr(sv.contract, "SSH_PORT", probe.getsockname()[1])
        t0 = time.monotonic()
        assert sv.port_answers("127.0.0.1", 5) is False and time.monotonic() - t0 < 0.5
        probe.listen(4)
        assert sv.port_answers("127.0.0.1", 5) is True and time.monotonic() - t0 < 0.5
        probe.close()
    finally:
        queued.close()
        listener.close()


def test_a_port_check_held_up_past_its_timeout_still_sends_every_syn_and_looks_once_more(monkeypatch):
    """A supervisor starved of CPU (here: its clock jumps 5 s once the first SYN is sent, as if
    the thread slept through the timeout): the other SYNs are still sent, the last given its
    share of the timeout, and a connection made meanwhile is seen, not taken for unreachable."""
    real, real_socket = time.monotonic, socket.socket
    made: list[float] = []

    class Counted(real_socket):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(real())

    listener, queued = _full_listener()  # SYNs dropped: every try is sent, then no
    monkeypatch.setattr(sv.contract, "SSH_PORT", listener.getsockname()[1])
    monkeypatch.setattr(sv.socket, "socket", Counted)  # the socket module's: the listeners are made
    monkeypatch.setattr(sv.time, "monotonic", lambda: real() + (5.0 if made else 0.0))
    try:
        t0 = real()
        assert sv.port_answers("127.0.0.1", 0.6) is False
        assert len(made) == 3 and real() - made[-1] >= 0.19, (made, real())
        assert real() - t0 < 1.0
    finally:
        queued.close()
        listener.close()
    made.clear()
    listener = real_socket()  # made is empty meanwhile: the clock is the real one
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    monkeypatch.setattr(sv.contract, "SSH_PORT", listener.getsockname()[1])
    try:
        assert sv.port_answers("127.0.0.1", 0.6) is True  # the first SYN's answer, seen late
    finally:
        listener.close()


def test_the_plan_reads_back_and_refuses_what_it_does_not_know():
    plan = _plan(["python", "train.py"])
    plan = replace(plan, spares=(runplan.PlanNode("10.0.0.4", "node-4", 1, "ens5"),), quarantined=(("node-9", "slow"),))
    assert runplan.RunPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    with pytest.raises(ValueError, match="unknown key"):
        runplan.RunPlan.from_json({**plan.to_json(), "hang": 1})
    with pytest.raises(ValueError, match="a node twice"):
        replace(plan, spares=plan.nodes)


def test_render_turns_supervisor_output_into_user_lines():
    from dtrain.launch.jobs.supervision import EVENT, Render

    import json
    r = Render("mpirun", "node-1")
    lines = [EVENT + json.dumps({"event": "running", "attempt": 0, "nodes": ["node-1", "node-2"],
                                 "ranks": ["node-1", "node-2"]}),
             "[1,1]<stdout>:epoch 1", "[1,0]<stdout>:epoch 1",
             EVENT + json.dumps({"event": "lost", "nodes": {"node-2": "sshd on 2022 unreachable"}}),
             EVENT + json.dumps({"event": "restart", "attempt": 1, "reason": "lost node-2", "dropped": ["node-2"]}),
             EVENT + json.dumps({"event": "running", "attempt": 1, "nodes": ["node-1"], "ranks": ["node-1"]}),
             "[1,0]<stdout>:resuming at epoch 2",
             EVENT + json.dumps({"event": "succeeded", "exit_code": 0})]
    out = [shown for line in lines for shown in r.feed(line)]
    assert out == ["[launch] job started on 2 node(s): node-1, node-2",
                   "[node-2 r1] epoch 1", "[node-1 r0] epoch 1",
                   "[launch] lost node-2: sshd on 2022 unreachable",
                   "[launch] restart 1: lost node-2; dropped node-2",
                   "[launch] job restarted (attempt 1) on 1 node(s): node-1",
                   "[node-1 r0] resuming at epoch 2", "[launch] job succeeded"]
    assert r.exit_code == 0


def test_render_gives_torchrun_lines_global_ranks():
    from dtrain.launch.jobs.supervision import EVENT, Render

    import json
    r = Render("torchrun", "node-1")
    r.feed(EVENT + json.dumps({"event": "running", "attempt": 0, "nodes": ["node-1", "node-3"],
                               "ranks": ["node-1", "node-1", "node-3", "node-3"]}))
    assert r.feed("[node-3] [default1]:loss 0.5") == ["[node-3 r3] loss 0.5"]
    assert r.feed("[node-1] torchrun warning") == ["[node-1] torchrun warning"]
    r.feed(EVENT + json.dumps({"event": "failed", "exit_code": 1, "reason": "lost node-3"}))
    assert r.exit_code == 1


def own_pids(argv: list[str]) -> list[str]:
    """argv in a PID namespace of its own, /proc its own too, as the supervisor runs in a job's
    container: on this machine it would otherwise see (stacks.sh, the attempt's ranks by their
    DTRAIN_RESTART) and kill (KILL_ATTEMPT) the ranks of the cluster tests that run beside it."""
    return ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", *argv]


def _supervisor_env(tmp_path) -> dict:
    """PATH with an `mpirun` that runs the user's command (the words from `sh` on) itself."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "mpirun").write_text('#!/bin/sh\nwhile [ "$1" != sh ]; do shift; done\nexec "$@"\n')
    (bin_dir / "mpirun").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _run_supervisor(tmp_path, plan: runplan.RunPlan, **kw) -> subprocess.CompletedProcess:
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_json()))
    return subprocess.run(own_pids([sys.executable, str(ROOT / "launch" / "node" / "supervise.py"), str(tmp_path / "plan.json")]),
                          capture_output=True, text=True, env=_supervisor_env(tmp_path), **kw)


def _plan(argv: list[str], **extra) -> runplan.RunPlan:
    # keep_containers: no teardown (it would signal pid 1)
    nodes = [runplan.PlanNode("10.0.0.1", "node-1", 1, "lo")]
    run = launch_command(JobSpec(image="i", command=tuple(argv), name="t"))
    plan = supervision.plan(run, nodes, ssh=[], policy=supervision.Policy(max_restarts=2), attached=False)
    return replace(plan, keep_containers=True, **extra)


def test_a_full_disk_ends_the_job_naming_the_node_and_the_file(tmp_path):
    """output.log on a full disk (/dev/full: every write fails with ENOSPC): the job ends with
    an error naming the node and the path, and no restart; the ranks' output still drains
    (before, the pump thread died, the pipe filled and the ranks blocked: a silent hang)."""
    (tmp_path / "output.log").symlink_to("/dev/full")
    rank = "for i in $(seq 20000); do echo line $i of a rank that talks a lot; done; sleep 120"
    t0 = time.monotonic()
    r = _run_supervisor(tmp_path, _plan(["sh", "-c", rank, "sh"], node_dir="/home/u/.dtrain/jobs/t"), timeout=60)
    assert time.monotonic() - t0 < 30, "the job must end, not wait for the rank"
    assert r.returncode == 1, r.stderr
    events = [json.loads(ln[len(EVENT):]) for ln in r.stdout.splitlines() if ln.startswith(EVENT)]
    assert [e["event"] for e in events] == ["running", "failed"], r.stdout[-2000:]
    assert events[-1]["reason"].startswith(
        "cannot write /home/u/.dtrain/jobs/t/output.log on node-1 (10.0.0.1): No space left on device"), events[-1]


def test_an_attached_job_stops_when_its_launcher_goes_silent(tmp_path):
    """A lost link the node's sshd never notices: the launcher's lines on stdin stop, and after
    launcher_silence seconds the supervisor stops the job."""
    plan = _plan(["sh", "-c", "sleep 120", "sh"], attached=True, launcher_silence=2)
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_json()))
    t0 = time.monotonic()
    with subprocess.Popen(own_pids([sys.executable, str(ROOT / "launch" / "node" / "supervise.py"), str(tmp_path / "plan.json")]),
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_supervisor_env(tmp_path)) as p:
        for _ in range(4):  # a launcher that beats keeps the job
            time.sleep(1)
            p.stdin.write("\n")
            p.stdin.flush()
        assert p.poll() is None
        out = p.stdout.read()  # stdin stays open, silent (communicate() would close it)
        p.wait(10)
    assert 6 < time.monotonic() - t0 < 30
    assert '"event": "failed"' in out and "the launcher went away" in out, out


def test_every_ssh_session_probes_the_link():
    """Keepalives on the launcher's ssh and the containers' (a lost link ends the session)."""
    from dtrain.launch.jobs import container
    from dtrain.launch.remote.hosts import ssh_argv

    for argv in (ssh_argv(NODES[0], ["true"]), container.supervisor_ssh(), container.ready_ssh(),
                 container.mpirun_ssh()):
        assert argv.count("ServerAliveInterval=5") == 1 and argv.count("ServerAliveCountMax=3") == 1, argv


def test_the_command_starts_in_the_jobs_code_where_it_exists_else_where_the_supervisor_started(tmp_path):
    from dtrain import contract

    assert sv.WORKDIR == contract.WORKDIR
    assert sv.start_dir("/", workdir=str(tmp_path)) == str(tmp_path)
    assert sv.start_dir("/opt/app", workdir=str(tmp_path / "absent")) == "/opt/app"


def test_on_a_node_the_supervisor_imports_the_launchers_builders_sent_beside_it(tmp_path):
    """In the container no dtrain is installed (or an older one is): the supervisor runs on the
    builders the launcher sent (builders.json), with a Python that has nothing but the standard
    library (-I -S: no site-packages, no user paths)."""
    import shutil

    shutil.copy(ROOT / "launch" / "node" / "supervise.py", tmp_path / "supervise.py")
    (tmp_path / "builders.json").write_text(json.dumps(supervision.builder_files()))
    (tmp_path / "plan.json").write_text(json.dumps(_plan(["sh", "-c", "echo rank says hi", "sh"]).to_json()))
    r = subprocess.run(own_pids([sys.executable, "-I", "-S", str(tmp_path / "supervise.py"), str(tmp_path / "plan.json")]),
                       capture_output=True, text=True, env=_supervisor_env(tmp_path), timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "rank says hi" in r.stdout and '"event": "succeeded"' in r.stdout, r.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "builders.json", "output.log", "plan.json",
                                                          "state.json", "supervise.py"]  # nothing unpacked here


def _fake_ssh(tmp_path) -> str:
    """An `ssh` for the supervisor's sessions to other nodes, on this machine: the heartbeat line
    runs here (answering the supervisor's lines on its stdin), its lines passed on while no file
    `down-ADDRESS` exists (then silence, as a NIC that went down); every other line (kill,
    touch) does nothing here."""
    path = tmp_path / "bin" / "fake-ssh"
    path.parent.mkdir(exist_ok=True)
    path.write_text('#!/bin/bash\naddr=${@: -2:1} line=${@: -1}\n'
                    f'case $line in "exec bash -c"*) ;; *) exit 0 ;; esac\n'
                    f'sh -c "$line" | while read -r l; do [ -e "{tmp_path}/down-$addr" ] || echo "$l"; done\n')
    path.chmod(0o755)
    return str(path)


def test_a_silent_unreachable_node_is_lost_within_3_s_and_a_spare_takes_its_place(tmp_path):
    """Three nodes (127.0.0.x: nothing listens on their port 2022, as a node whose NIC is down)
    of which the last is a spare. node-2 goes silent: lost within 3 s (silent 1.5 s, then its port
    refuses), the spare takes its place in rank order, the job restarts at full size, node-2 is
    quarantined."""
    nodes = [runplan.PlanNode(f"127.0.0.{i}", f"node-{i}", 1, "lo") for i in (1, 2, 3)]
    job = ('echo "attempt $DTRAIN_RESTART"; [ "$DTRAIN_RESTART" = 1 ] && exit 0; '
           f'sleep 1; touch {tmp_path}/down-127.0.0.2; echo "down at $(date +%s.%N)"; sleep 60')
    plan = replace(_plan(["sh", "-c", job, "sh"]), nodes=tuple(nodes[:2]), spares=(nodes[2],),
                   ssh=(_fake_ssh(tmp_path),), min_nodes=2)
    r = _run_supervisor(tmp_path, plan, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    events = [json.loads(ln[len(EVENT):]) for ln in r.stdout.splitlines() if ln.startswith(EVENT)]
    names = [e["event"] for e in events if e["event"] != "phase"]
    assert names == ["running", "lost", "spare-in", "restart", "running", "succeeded"], r.stdout
    lost = next(e for e in events if e["event"] == "lost")
    assert list(lost["nodes"]) == ["node-2"] and "port 2022 unreachable" in lost["nodes"]["node-2"], lost
    detection = next(e for e in events if e["event"] == "phase" and e["phase"] == "detection")
    assert detection["node"] == "node-2" and detection["seconds"] <= 3, detection
    rerun = [e for e in events if e["event"] == "running"][1]
    assert rerun["nodes"] == ["node-1", "node-3"] and rerun["spares"] == [], rerun
    restart = next(e for e in events if e["event"] == "restart")
    assert restart["replaced"] == {"node-2": "node-3"} and restart["dropped"] == [], restart
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["quarantined"] == {"node-2": lost["nodes"]["node-2"]} and state["nodes"] == ["node-1", "node-3"]


def test_a_nodes_heartbeat_answers_each_line_and_ends_when_the_supervisor_goes_silent():
    """The node's side answers every line the supervisor sends; with nothing for HEAR_S seconds
    (a node taken out of the job, a link gone) it ends, so the node's heartbeat file ages and its
    watchdog removes the job there."""
    line = sv.beat_line(0.5)
    assert line.startswith("exec bash -c ")
    with subprocess.Popen(["bash", "-c", shlex.split(line)[3]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True) as p:
        for _ in range(3):
            p.stdin.write("\n")
            p.stdin.flush()
            assert p.stdout.readline() == "beat\n"
        t0 = time.monotonic()
        p.wait(sv.HEAR_S + 5)
        assert sv.HEAR_S - 0.5 < time.monotonic() - t0 < sv.HEAR_S + 2


def test_the_spares_are_the_last_k_nodes_given():
    from dtrain.launch.jobs.job import split_spares

    assert split_spares(["a", "b", "c", "d"], 1) == (["a", "b", "c"], ["d"])
    assert split_spares(("a", "b"), 0) == (["a", "b"], [])
    assert split_spares(["a", "b"], 2) == ([], ["a", "b"])
    with pytest.raises(ValueError, match="3 spare"):
        split_spares(["a", "b"], 3)


def test_the_gates_culprits_are_left_out_while_healthy_spares_can_take_their_places():
    from dtrain.launch.errors import LaunchError
    from dtrain.launch.jobs import netgate
    from dtrain.launch.jobs.job import gate_out

    facts = [NodeFacts(Node(f"10.0.0.{i}", 1), f"10.0.0.{i}", f"node-{i}", "ens5", 0, (), "") for i in (1, 2, 3, 4)]
    slow = lambda *hosts: netgate.GateResult(rates={}, culprits={h: "0.1 Gbit/s" for h in hosts})  # noqa: E731
    assert gate_out(facts, 1, slow("10.0.0.2")) == {"node-2": "slow link: 0.1 Gbit/s"}
    assert gate_out(facts, 1, slow("10.0.0.4")) == {"node-4": "slow link: 0.1 Gbit/s"}  # a spare: just dropped
    with pytest.raises(LaunchError, match="0 healthy spare"):
        gate_out(facts, 1, slow("10.0.0.2", "10.0.0.4"))
    with pytest.raises(LaunchError, match="slow link on"):
        gate_out(facts, 0, slow("10.0.0.3"))
    # the plan: the spare in the culprit's place, rank 0 too
    spec = JobSpec(image="i", command=("python", "t.py"), name="j", spares=1)
    run = launch_command(spec)
    ranks, spares = plan_nodes(facts[:3]), plan_nodes(facts[3:])
    nodes, left, took = runplan.swap_out(ranks, spares, {"node-1": "slow link"})
    assert [n.hostname for n in nodes] == ["node-4", "node-2", "node-3"] and left == () and took == {"node-1": "node-4"}
    assert launchers.attempt_argv(run, nodes)[0][launchers.attempt_argv(run, nodes)[0].index("-H") + 1].startswith("10.0.0.4:1")


def test_a_spare_offered_while_the_job_runs_joins_and_takes_a_lost_nodes_place(tmp_path):
    """An attached job on node-1 and node-2, no spare: the launcher offers node-3 on the
    supervisor's stdin (a node the Auto Scaling group brought back, made ready: issue 49). It
    joins (`spare-joined`; the hosts files learn it, node-1's here); one with a hostname the run
    has, and a line that is no node, are refused in a line each. Then node-2 goes silent: node-3
    takes its place and the job ends at full size."""
    nodes = [runplan.PlanNode(f"127.0.0.{i}", f"node-{i}", 1, "lo") for i in (1, 2, 3)]
    state = tmp_path / "state.json"
    job = ('echo "attempt $DTRAIN_RESTART"; [ "$DTRAIN_RESTART" = 1 ] && exit 0; '
           f'until grep -q node-3 {state}; do sleep 0.1; done; touch {tmp_path}/down-127.0.0.2; sleep 60')
    plan = replace(_plan(["sh", "-c", job, "sh"], attached=True, launcher_silence=30), nodes=tuple(nodes[:2]),
                   ssh=(_fake_ssh(tmp_path),), min_nodes=2)
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_json()))
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n")
    bad = runplan.SPARE_LINE + json.dumps({"address": "127.0.0.9 x", "hostname": "node-9", "slots": 1, "iface": "lo"})
    with subprocess.Popen(own_pids([sys.executable, str(ROOT / "launch" / "node" / "supervise.py"), str(tmp_path / "plan.json")]),
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                          env={**_supervisor_env(tmp_path), "DTRAIN_HOSTS_FILE": str(hosts)}) as p:
        time.sleep(0.5)
        p.stdin.write("\n" + bad + "\n" + runplan.spare_line(replace(nodes[2], address="127.0.0.8", hostname="node-2"))
                      + runplan.spare_line(nodes[2]))
        p.stdin.flush()
        killer = threading.Timer(60, p.kill)
        killer.start()
        out = p.stdout.read()  # stdin stays open, silent (its end would stop the job)
        killer.cancel()
        p.wait(10)
    assert p.returncode == 0, out
    events = [json.loads(ln[len(EVENT):]) for ln in out.splitlines() if ln.startswith(EVENT)]
    assert [e["event"] for e in events if e["event"] != "phase"] == [
        "running", "spare-joined", "lost", "spare-in", "restart", "running", "succeeded"], out
    joined = next(e for e in events if e["event"] == "spare-joined")
    assert joined == {"event": "spare-joined", "node": "node-3", "address": "127.0.0.3", "slots": 1, "gpus": 0}
    assert "[supervisor] a spare the launcher offered is not one: address: not an IP address" in out
    assert "[supervisor] node-2 not taken as a spare: a node of this job has that hostname" in out
    rerun = [e for e in events if e["event"] == "running"][1]
    assert rerun["nodes"] == ["node-1", "node-3"], rerun
    assert next(e for e in events if e["event"] == "restart")["replaced"] == {"node-2": "node-3"}
    assert hosts.read_text() == "127.0.0.1 localhost\n127.0.0.3 node-3\n"  # node-1's: the new spare named
    assert supervision.describe(joined) == ("[launch] spare node-3 (127.0.0.3) joined: it takes the place of a "
                                            "node lost from now on")


def test_heartbeat_sessions_ride_a_master_where_one_is_up_and_never_become_one(tmp_path, monkeypatch):
    """The heartbeat's ssh: ControlMaster=no before the plan's own options (ssh keeps the first
    value), the masters' ControlPath kept: over the ready check's master, or a connection of its
    own where there is none, never a master whose end would take mpirun's sessions along."""
    from dtrain.launch.jobs import container

    nodes = (runplan.PlanNode("10.0.0.1", "node-1", 1, "lo"), runplan.PlanNode("10.0.0.2", "node-2", 1, "lo"))
    plan = replace(_plan(["true"]), nodes=nodes, ssh=tuple(container.supervisor_ssh()))
    sup = sv.Supervisor(plan, tmp_path)
    ran: list[list[str]] = []

    class Popen:
        def __init__(self, argv, **kw):
            ran.append(argv)
            self.stdin = open(os.devnull, "w")
            self.stdout = self.stderr = open(os.devnull)

        def wait(self, *a):
            return 0

    monkeypatch.setattr(sv.subprocess, "Popen", Popen)
    monkeypatch.setattr(sv.os, "set_blocking", lambda *a: None)
    health = sv.Health(sup)
    health.watch(nodes[1])
    health.closed.set()
    argv = ran[0]
    assert argv[:3] == [plan.ssh[0], "-o", "ControlMaster=no"] and "ControlPath=none" not in argv
    assert any(a.startswith("ControlPath=/") for a in argv) and argv[-2] == "10.0.0.2"
    assert sup.remote(nodes[1], "x", mux=False)[1:3] == ["-o", "ControlPath=none"]
    assert sup.remote(nodes[1], "x")[1:3] != ["-o", "ControlPath=none"]
    with pytest.raises(ValueError):
        sup.remote(nodes[1], "x", mux="none")
