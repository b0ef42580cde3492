"""The launch's timeline (launch/analysis/timeline.py): node phase lines -> entries -> tables, the
supervisor's phase events through Render, and the node programs' own lines."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dtrain import contract
from dtrain.launch.jobs import node_programs, store
from dtrain.launch.analysis import timeline
from dtrain.launch.jobs.job import Job
from dtrain.launch.jobs.spec import JobSpec
from dtrain.launch.remote.hosts import parse_hostfile
from dtrain.launch.jobs.supervision import Render
from dtrain.launch.analysis.timeline import Entry

EV = contract.SUPERVISOR_EVENT
T0 = 1000.0
ROOT = Path(__file__).resolve().parent.parent


def phase_line(**fields) -> str:
    return EV + json.dumps({"event": "phase", **fields})


def test_node_lines_become_entries_timed_after_the_launch_start():
    lines = ["docker=ok", phase_line(phase="container", at=1001.25, end=1001.75), "run=1",
             phase_line(phase="sshd", at=1001.75, end=1002.0), EV + "{not json", "addr=10.0.0.1"]
    assert timeline.node_lines("n1", lines, t0=T0, now=2000.0) == [
        Entry("n1", "container", 1.25, 0.5), Entry("n1", "sshd", 1.75, 0.25)]


def test_an_event_with_seconds_only_ended_when_it_arrived_and_names_its_node():
    ev = {"event": "phase", "phase": "detection", "node": "node-2", "seconds": 2.5}
    e = timeline.from_event(ev, t0=T0, now=1010.0, restart=1, names={"node-2": "10.0.0.2"})
    assert e == Entry("10.0.0.2", "detection", 7.5, 2.5, 1)
    assert timeline.from_event({"event": "phase", "phase": "x"}, t0=T0, now=T0) is None  # no time
    assert timeline.from_event({"event": "running"}, t0=T0, now=T0) is None
    negative = timeline.from_event({"event": "phase", "phase": "sshd", "at": 5, "end": 4}, t0=0, now=0)
    assert negative is not None and negative.seconds == 0  # a clock step back is not a negative phase


def test_restart_phases_belong_to_the_restart_around_them():
    # detection and teardown come before the supervisor's `restart` event, spare-in and resumed after
    assert timeline.restart_of({"phase": "detection"}, attempt=0, restarts=0) == 1
    assert timeline.restart_of({"phase": "teardown"}, attempt=0, restarts=0) == 1
    assert timeline.restart_of({"phase": "spare-in"}, attempt=0, restarts=1) == 1
    assert timeline.restart_of({"phase": "resumed"}, attempt=1, restarts=1) == 1
    assert timeline.restart_of({"phase": "detection"}, attempt=1, restarts=1) == 2
    assert timeline.restart_of({"phase": "resumed", "restart": 3}, attempt=1, restarts=1) == 3
    assert timeline.restart_of({"phase": "ready"}, attempt=0, restarts=0) == 0


def test_merge_keeps_one_entry_per_node_phase_and_restart():
    a = Entry("n1", "sshd", 1.0, 0.5)
    b = Entry("n1", "sshd", 1.0, 0.6)
    c = Entry("n1", "detection", 9.0, 2.0, 1)
    assert timeline.merge([a, c], [b]) == (b, c)


def test_json_round_trip_leaves_out_what_it_cannot_read():
    entries = (Entry("n1", "first-round", 0.0, 0.2), Entry("", "teardown", 9.0, 0.4, 1))
    data = timeline.to_json(entries) + [{"phase": "sshd"}, "junk", {"phase": 3, "start": 0, "seconds": 1}]
    assert timeline.from_json(json.loads(json.dumps(data))) == entries
    assert timeline.from_json(None) == () and timeline.from_json({"a": 1}) == ()


def test_table_has_a_row_per_node_a_column_per_phase_in_order_and_restarts_apart():
    entries = [Entry("n2", "container", 0.3, 0.8), Entry("n1", "first-round", 0.0, 0.2),
               Entry("n1", "container", 0.3, 0.7), Entry("n2", "first-round", 0.0, 0.25),
               Entry("n1", "first-step", 1.5, 0.4), Entry("n2", "detection", 20.0, 2.0, 1),
               Entry("", "teardown", 22.0, 0.5, 1)]
    launch, restart = timeline.rows(entries, nodes=["n1", "n2"])
    assert launch == [["launch", "first-round", "container", "first-step", "done at"],
                      ["n1", "0.20", "0.70", "0.40", "1.90"],
                      ["n2", "0.25", "0.80", "-", "1.10"]]
    assert restart == [["restart 1", "detection", "teardown", "done at"],
                       ["n2", "2.00", "-", "22.00"],
                       ["(job)", "-", "0.50", "22.50"]]
    lines = timeline.log_lines(entries, ["n1", "n2"])
    assert all(line.startswith("[launch] timeline ") for line in lines)
    assert lines[0].split()[2:] == ["launch", "first-round", "container", "first-step", "done", "at"]
    assert "restart 1" in timeline.text(entries, ["n1", "n2"])


def test_complete_once_every_node_made_its_first_step():
    entries = [Entry("n1", "first-step", 1.0, 0.1), Entry("n2", "first-step", 1.0, 0.2, 1)]
    assert timeline.complete(entries, ["n1"]) and not timeline.complete(entries, ["n1", "n2"])


def test_render_times_each_nodes_first_line_and_passes_phase_events_on():
    now = [T0 + 5.0]
    got: list[Entry] = []
    r = Render("mpirun", "node-1", t0=T0, names={"node-1": "10.0.0.1", "node-2": "10.0.0.2", "10.0.0.2": "10.0.0.2"},
               on_phase=got.append, clock=lambda: now[0])
    assert r.feed(phase_line(phase="ready", node="10.0.0.2", at=T0 + 4.0, end=T0 + 4.5)) == []  # not shown
    r.feed(EV + json.dumps({"event": "running", "attempt": 0, "nodes": ["node-1", "node-2"],
                            "ranks": ["node-1", "node-2"]}))
    now[0] = T0 + 6.0
    shown = r.feed("[1,1]<stdout>:step 1")
    assert shown == ["[node-2 r1] step 1"]
    now[0] = T0 + 7.0
    r.feed("[1,0]<stdout>:step 1")
    r.feed("[1,0]<stdout>:step 2")  # only the first line counts
    assert got == [Entry("10.0.0.2", "ready", 4.0, 0.5), Entry("10.0.0.2", "first-step", 5.0, 1.0),
                   Entry("10.0.0.1", "first-step", 5.0, 2.0)]
    got.clear()
    assert r.feed(phase_line(phase="detection", node="node-2", seconds=1.5, restart=1)) == [
        "[launch] restart 1: detection node-2 1.5 s"]  # a restart's phases are shown as they come
    r.feed(EV + json.dumps({"event": "restart", "attempt": 1, "reason": "lost node-2", "dropped": ["node-2"]}))
    r.feed(phase_line(phase="resumed", node="", seconds=3.0))
    r.feed(EV + json.dumps({"event": "running", "attempt": 1, "nodes": ["node-1"], "ranks": ["node-1"]}))
    r.feed("[1,0]<stdout>:step 1")  # a restart's lines are no first step
    assert [(e.node, e.phase, e.restart) for e in got] == [("10.0.0.2", "detection", 1), ("", "resumed", 1)]


def test_node_programs_print_phase_lines_the_launcher_reads():
    """phase.sh's `phase` as up.sh and start.sh use it: a line timeline.node_lines reads."""
    program = node_programs.host_program().replace('\nmain "$@"', "\n")
    r = subprocess.run(["bash", "-c", program + '\nSUPERVISOR_EVENT="$1"; now; a=$t; phase container "$a"',
                        "t", EV], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    (e,) = timeline.node_lines("n1", r.stdout.splitlines(), t0=0.0, now=0.0)
    assert e.node == "n1" and e.phase == "container" and 0 <= e.seconds < 5 and e.start > 1e9
    # bash without $EPOCHREALTIME (before 5.0): date's time
    r = subprocess.run(["bash", "-c", program + '\nunset EPOCHREALTIME; SUPERVISOR_EVENT="$1"; now; a=$t; '
                        'phase sshd "$a"', "t", EV], capture_output=True, text=True, timeout=30)
    (e,) = timeline.node_lines("n1", r.stdout.splitlines(), t0=0.0, now=0.0)
    assert e.phase == "sshd" and 0 <= e.seconds < 5


@pytest.mark.cluster
def test_a_launch_records_every_phase_of_every_node_and_status_prints_them(cluster, remote_images, tmp_path,
                                                                           monkeypatch):
    """A 2-node launch: its record has each phase of the launch for each node (non-negative
    times), its log the table (and none of the nodes' phase lines), `dtrain status --job` too."""
    monkeypatch.setenv("DTRAIN_HOME", str(tmp_path))
    nodes = parse_hostfile(cluster.hostfile)[:2]
    name = "t-timeline"
    spec = JobSpec(image=remote_images["pytorch-ddp"], command=("python", "-c", "print('step 1', flush=True)"),
                   name=name, ssh_opts=("-F", cluster.ssh_config))
    assert Job(spec, nodes, say=lambda m: None).run() == 0
    entries = timeline.from_json(store.load_job(name)["timeline"])
    got = {(e.node, e.phase): e for e in entries}
    assert len(got) == len(entries)
    # under mpirun the ready check leaves out the first node (mpirun starts its ranks there
    # without ssh): every other phase of every node, and no `ready` of the first
    skipped = (nodes[0].host, "ready")
    phases = [p for p in contract.LAUNCH_PHASES if p != "network-gate"]  # only with --check-network
    for n in nodes:
        for phase in phases:
            e = got.get((n.host, phase))
            if (n.host, phase) == skipped:
                assert e is None, e
                continue
            assert e is not None and e.start >= 0 and e.seconds >= 0 and e.restart == 0, (n.host, phase, entries)
    assert {e.node for e in entries} == {n.host for n in nodes}
    log = store.job_log(name).read_text()
    assert f"{timeline.PREFIX} launch" in log and contract.SUPERVISOR_EVENT not in log, log
    assert log.index("[node-") < log.index(timeline.PREFIX)  # after every node's first step
    r = subprocess.run([sys.executable, "-m", "invoke", "status", "--job", name], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, env={**os.environ, "DTRAIN_HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert re.search(r"^launch\s+" + r"\s+".join(phases) + r"\s+done at$", r.stdout, re.M), r.stdout
    assert re.search(rf"^{re.escape(nodes[0].host)}(\s+\d+\.\d\d){{4}}\s+-(\s+\d+\.\d\d){{2}}$", r.stdout, re.M), r.stdout
    for n in nodes[1:]:
        assert re.search(rf"^{re.escape(n.host)}(\s+\d+\.\d\d){{7}}$", r.stdout, re.M), r.stdout
