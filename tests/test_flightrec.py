"""The flight recorder's dumps read (launch/jobs/flightrec.py): which rank did not enter the
collective the others wait in. The dumps are real (tests/data/flight_recorder/README.md: torch
2.13.0+cpu, gloo, two processes on 127.0.0.1, rank 1 skipping an all_reduce)."""

from __future__ import annotations

import pickle
from pathlib import Path

from dtrain.launch.jobs import flightrec

DATA = Path(__file__).resolve().parent / "data" / "flight_recorder"


def _dumps(ext: str) -> dict[int, dict]:
    return {r: flightrec.load((DATA / f"rank{r}.{ext}").read_bytes()) for r in (0, 1)}


def test_the_rank_that_skipped_a_collective_is_named_from_real_dumps():
    for ext in ("pickle", "json"):
        dumps = _dumps(ext)
        assert [flightrec.last_entered(d) for d in dumps.values()] == [{"0": 4}, {"0": 3}], ext
        (b,) = flightrec.behind(dumps)
        assert (b.pg, b.ranks, b.entered, b.seq, b.op, b.waiting) == ("0", (1,), (3,), 4, "gloo:all_reduce", (0,))
        assert flightrec.text([b], 2, 2, ["node-1", "node-2"]) == (
            "flight recorder: r1 (node-2) (entered up to #3) did not enter gloo:all_reduce #4 of process "
            "group 0 that r0 waits in")


def test_agreeing_dumps_name_nobody_and_no_dump_says_why():
    d = _dumps("pickle")
    assert flightrec.behind({0: d[1], 1: d[1]}) == []
    assert flightrec.text([], 2, 2) == "flight recorder: 2/2 ranks' dumps agree on the last collective"
    assert flightrec.text([], 0, 4) == f"flight recorder: {flightrec.NO_DUMP_GLOO}"
    # from the entries where pg_status is missing (an older dump)
    no_status = {k: v for k, v in d[0].items() if k != "pg_status"}
    assert flightrec.last_entered(no_status) == {"0": 4}


def test_a_dump_is_untrusted_no_class_is_unpickled():
    class Boom:
        def __reduce__(self):
            return (print, ("ran",))

    assert flightrec.load(pickle.dumps({"entries": [Boom()]})) is None
    assert flightrec.load(b"") is None and flightrec.load(b"not a dump") is None
    assert flightrec.load(b"[1, 2]") is None and flightrec.load(b"\x80\x04K\x01.") is None  # not a dict


def test_torchrun_ranks_record_and_dump_into_the_job_dir():
    env = dict(flightrec.env("/dtrain-job"))
    assert env["TORCH_FR_BUFFER_SIZE"] == str(flightrec.BUFFER)
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env  # deprecated: torch 2.13 warns on every rank
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == "/dtrain-job/flightrec_rank_" and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"


def test_fr_dumps_sh_sends_each_rank_s_dump_once_and_asks_through_the_pipe(tmp_path):
    """launch/node/fr_dumps.sh over a job dir: rank 0's dump already there (a timeout wrote it),
    rank 1's written only once its debug pipe gets a line (as NCCL's watchdog does: a fifo a
    reader here stands in for); both come back, name r1, and are read once."""
    import os
    import subprocess
    import threading

    from dtrain import contract

    prefix = str(tmp_path / flightrec.PREFIX)
    (tmp_path / f"{flightrec.PREFIX}0").write_bytes((DATA / "rank0.pickle").read_bytes())
    os.mkfifo(f"{prefix}1.pipe")

    def watchdog():
        with open(f"{prefix}1.pipe") as pipe:
            pipe.readline()
        (tmp_path / f"{flightrec.PREFIX}1").write_bytes((DATA / "rank1.pickle").read_bytes())

    t = threading.Thread(target=watchdog, daemon=True)
    t.start()
    run = ["bash", "-s", "--", prefix, "5"]
    r = subprocess.run(run, input=contract.node_script("fr_dumps.sh"), capture_output=True, text=True, timeout=30)
    t.join(5)
    dumps = flightrec.read_lines(r.stdout.splitlines())
    assert sorted(dumps) == [0, 1], r.stdout[:300] + r.stderr
    assert [b.ranks for b in flightrec.behind(dumps)] == [(1,)]
    again = subprocess.run(run, input=contract.node_script("fr_dumps.sh"), capture_output=True, text=True, timeout=30)
    assert again.stdout.strip() == "fr-none"  # read once: a later hang reads its own
    assert flightrec.read_lines(["fr 1 !!notbase64", "fr x AAAA", "other"]) == {}


def test_dead_ranks_pipes_are_asked_at_once_not_one_after_another(tmp_path):
    """A failed attempt's ranks are gone but their debug pipes stay, with no reader: each ask
    blocks its 2 s. Eight of them (a node's ranks) are asked at once: fr_dumps.sh ends in about
    2 s, not 16 (past the supervisor's wait), and says there is no dump."""
    import os
    import subprocess
    import time

    from dtrain import contract

    prefix = str(tmp_path / flightrec.PREFIX)
    for r in range(8):
        os.mkfifo(f"{prefix}{r}.pipe")
    t0 = time.monotonic()
    r = subprocess.run(["bash", "-s", "--", prefix, "5"], input=contract.node_script("fr_dumps.sh"),
                       capture_output=True, text=True, timeout=30)
    took = time.monotonic() - t0
    assert r.stdout.strip() == "fr-none" and took < 6, (took, r.stdout, r.stderr)


def test_the_hang_line_carries_the_flight_recorder_s_verdict():
    from dtrain.launch.jobs import supervision

    ev = {"silent_for": 10.4, "ranks": [1], "nodes": ["node-2"], "culprits": [], "waiting": [0, 1], "unread": [],
          "flight_recorder": flightrec.text(flightrec.behind(_dumps("pickle")), 2, 2, ["node-1", "node-2"])}
    assert supervision.hang_line(ev) == (
        "hang: no rank made progress for 10.4 s (--hang-timeout); every rank waits in a collective (stacks); by "
        "progress, behind: r1 on node-2 (last progress ? s ago, 0 line(s)); flight recorder: r1 (node-2) (entered "
        "up to #3) did not enter gloo:all_reduce #4 of process group 0 that r0 waits in; every rank's Python stack "
        "follows")


def test_the_launch_gives_torchrun_s_ranks_the_recorder_unless_the_job_sets_it():
    """session.supervisor_plan: torchrun's ranks get flightrec.env (each node's job directory);
    mpirun's do not (no hang check reads them there); a job that sets TORCH_FR_BUFFER_SIZE keeps its own."""
    from dtrain.launch.jobs import config, launchers, session
    from dtrain.launch.jobs.spec import NodeFacts, Started
    from dtrain.launch.remote.hosts import Node

    def plan(**cfg):
        spec = config.job_spec(config.build({"image": "reg/x:1", "command": ["python", "t.py"], **cfg}))
        facts = [NodeFacts(Node(f"10.0.0.{i}", 8), f"10.0.0.{i}", f"node-{i}", "ens5", 0, (), "") for i in (1, 2)]
        return session.supervisor_plan(spec, launchers.get(spec.launcher), Started(facts, "sha256:x", 4),
                                       {"10.0.0.1": "/d"}, 4)

    env = dict(plan(launcher="torchrun").run.extra_env)
    assert {k: env[k] for k in dict(flightrec.env("/dtrain-job"))} == dict(flightrec.env("/dtrain-job"))
    assert "TORCH_FR_BUFFER_SIZE" not in dict(plan(launcher="mpirun").run.extra_env)
    own = dict(plan(launcher="torchrun", env=["TORCH_FR_BUFFER_SIZE=10"]).run.extra_env)
    assert "TORCH_FR_DUMP_TEMP_FILE" not in own


def test_late_dumps_are_said_not_waited_for():
    assert flightrec.late(3.0) == "flight recorder: no dumps gathered within 3 s of the stacks"


def test_the_hang_line_waits_for_the_dumps_a_bounded_time():
    """supervise.in_background (how on_hang gathers the dumps beside the stacks): a gathering
    that has not ended is given up after the bound, never waited for; one that ended is read."""
    import importlib.util
    import time

    spec = importlib.util.spec_from_file_location("supervise", Path(__file__).resolve().parent.parent
                                                  / "launch" / "node" / "supervise.py")
    sup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sup)
    slow = sup.in_background(lambda: time.sleep(30) or "late")
    t0 = time.monotonic()
    assert slow(0.5) is None and time.monotonic() - t0 < 5
    quick = sup.in_background(lambda: "flight recorder: 2/2 ranks' dumps agree on the last collective")
    assert quick(10).startswith("flight recorder: 2/2")
    assert sup.flightrec_late() == flightrec.late(sup.FR_AFTER_STACKS) and sup.FR_AFTER_STACKS <= 5


def test_a_hostile_dump_names_nobody_it_should_not_and_never_raises():
    """A dump is whatever a node's file held: numbers that do not fit, records that are not
    records, `entries` that is no list; read_lines, last_entered, behind and text take each
    without an exception, skip what is not a record, and keep the line bounded."""
    import base64
    import json

    inf = float("inf")
    hostile = [
        {"pg_status": {"0": {"last_enqueued_collective": inf}}},
        {"pg_status": {"0": {"last_enqueued_collective": float("nan")}}},
        {"pg_status": {"0": {"last_enqueued_collective": 10 ** 30}}, "entries": 5},
        {"pg_status": {"0": {"last_enqueued_collective": -3}}},
        {"pg_status": {"0": "x"}, "entries": "abc"},
        {"pg_status": [1, 2], "entries": [1, None, {"collective_seq_id": inf, "pg_id": "0"}]},
        {"entries": {"not": "a list"}},
        {"pg_status": {(1, 2): {"last_enqueued_collective": True}}},
        {"entries": [{"collective_seq_id": "9" * 5000, "pg_id": "0"}]},
    ]
    for d in hostile:
        assert flightrec.last_entered(d) == {}, d
        assert flightrec.behind({0: d, 1: d}) == []
    # json's Infinity loads as a float: skipped, not an OverflowError
    assert flightrec.last_entered(flightrec.load(b'{"pg_status": {"0": {"last_enqueued_collective": Infinity}}}')) == {}
    # a whole float and a digit string are numbers; an op's name is printable and bounded
    odd = {"entries": [{"collective_seq_id": 4.0, "pg_id": "0", "profiling_name": "x\ny" * 100}]}
    assert flightrec.last_entered(odd) == {"0": 4}
    ((_, op),) = flightrec.ops(odd).items()
    assert len(op) <= flightrec.MAX_NAME and op.isprintable()
    # a group id that is no short printable name or int64 is not judged: cutting or merging ids
    # could pair unrelated groups, and str() of a 5000-digit int raises
    for pg in ("p\x1b[31m", "g" * 500, 10 ** 5000, (1, 2), None, True):
        d = {"pg_status": {pg: {"last_enqueued_collective": 3}}, "entries": [{"pg_id": pg, "collective_seq_id": 3}]}
        assert flightrec.last_entered(d) == {} and flightrec.ops(d) == {}, pg
    # a rank's file name that is no plausible rank: skipped, not a ValueError on a 5000-digit int
    line = "fr " + "9" * 5000 + " " + base64.b64encode(json.dumps({"entries": []}).encode()).decode()
    assert flightrec.read_lines([line, "fr ² AAAA"]) == {}


def test_the_line_stays_bounded_with_many_groups_and_ranks():
    """1000 ranks of which 900 are behind in 50 process groups: the line names the first groups
    and ranks, says how many more, and stays under MAX_LINE (past events.MAX_TEXT the hang event
    would be dropped)."""
    from dtrain.launch.jobs import events

    dumps = {r: {"pg_status": {str(g): {"last_enqueued_collective": 5 if r < 100 else 4} for g in range(50)}}
             for r in range(1000)}
    found = flightrec.behind(dumps)
    assert len(found) == 50 and all(len(b.ranks) == 900 for b in found)
    text = flightrec.text(found, 1000, 1000, [f"node-{r // 8}" for r in range(1000)])
    assert len(text) <= flightrec.MAX_LINE < events.MAX_TEXT
    assert text.startswith("flight recorder: r100 (node-12) (entered up to #4), r101 (node-12)")
    assert "and 892 more did not enter ? #5 of process group 0 that r0, r1" in text
    assert "r7 and 92 more wait in" in text
    few = flightrec.text(found[:5], 1000, 1000)
    assert few.endswith("; and 1 more process groups") and len(few) <= flightrec.MAX_LINE


def test_a_restart_clears_the_ended_attempt_s_dumps(tmp_path):
    """supervise.end_attempt_line (kill_leftovers, between attempts): after it, the job dir has
    no flight-recorder dump of the ended attempt (one a rank wrote after the last read, one
    read already), so the next attempt's hang cannot name a rank from the last attempt's
    records; debug pipes (the next attempt's, where the line ran late) and the job's other files
    stay."""
    import importlib.util
    import os
    import subprocess

    spec = importlib.util.spec_from_file_location("supervise", Path(__file__).resolve().parent.parent
                                                  / "launch" / "node" / "supervise.py")
    sup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sup)
    for name in ("0", "1.read", "12"):
        (tmp_path / f"{flightrec.PREFIX}{name}").write_bytes((DATA / "rank0.pickle").read_bytes())
    os.mkfifo(tmp_path / f"{flightrec.PREFIX}3.pipe")
    (tmp_path / "output.log").write_text("kept")
    (tmp_path / "flightrec_notes.txt").write_text("kept")
    # attempt 987654: no process here has DTRAIN_RESTART=987654, nothing is killed
    r = subprocess.run(["bash", "-c", sup.end_attempt_line(987654, str(tmp_path))], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flightrec_notes.txt", f"{flightrec.PREFIX}3.pipe",
                                                          "output.log"]
    # the directory is quoted: a job dir with a space works, and no glob of it runs
    assert f"find '{tmp_path} x' -maxdepth 1" in sup.end_attempt_line(1, f"{tmp_path} x")


def test_older_torch_gets_the_buffer_under_the_name_it_reads():
    """torch before 2.9 reads TORCH_NCCL_TRACE_BUFFER_SIZE only (2.4.1: the GPU EFA images):
    the buffer goes under that name there; newer, or unknown, TORCH_FR_BUFFER_SIZE."""
    env = flightrec.env("/dtrain-job")
    old = dict(flightrec.for_torch(env, "2.4.1+cu124"))
    assert old["TORCH_NCCL_TRACE_BUFFER_SIZE"] == str(flightrec.BUFFER) and "TORCH_FR_BUFFER_SIZE" not in old
    assert {k: v for k, v in old.items() if "BUFFER" not in k} == {k: v for k, v in env if "BUFFER" not in k}
    for newer in ("2.9.0", "2.13.0+cpu", "3.0", None, "", "nightly", "2"):
        assert flightrec.for_torch(env, newer) == env, newer
    assert flightrec.torch_release("2.10.1") == (2, 10) and flightrec.torch_release("x.y") is None


def test_the_supervisor_renames_the_buffer_for_the_image_s_torch(tmp_path):
    """The real supervisor (launch/node/supervise.py) beside a torch 2.4.1 (its metadata on the
    path, as in the GPU EFA image): the rank's environment has TORCH_NCCL_TRACE_BUFFER_SIZE,
    not the name that torch ignores."""
    import json
    import os
    import subprocess
    import sys
    from dataclasses import replace

    from dtrain import ROOT
    from dtrain.launch.jobs import runplan, supervision
    from dtrain.launch.jobs.launchers import launch_command
    from dtrain.launch.jobs.spec import JobSpec

    site = tmp_path / "site"
    (site / "torch-2.4.1.dist-info").mkdir(parents=True)
    (site / "torch-2.4.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.4.1\n")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "mpirun").write_text('#!/bin/sh\nwhile [ "$1" != sh ]; do shift; done\nexec "$@"\n')
    (tmp_path / "bin" / "mpirun").chmod(0o755)
    run = launch_command(JobSpec(image="i", command=("sh", "-c", "env | grep BUFFER_SIZE", "sh"), name="t"))
    run = replace(run, extra_env=run.extra_env + flightrec.env(str(tmp_path)))
    plan = supervision.plan(run, [runplan.PlanNode("10.0.0.1", "node-1", 1, "lo")], ssh=[],
                            policy=supervision.Policy(), attached=False)
    (tmp_path / "plan.json").write_text(json.dumps(replace(plan, keep_containers=True).to_json()))
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "PYTHONPATH": str(site)}
    r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable,
                        str(ROOT / "launch" / "node" / "supervise.py"), str(tmp_path / "plan.json")],
                       capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
    assert f"TORCH_NCCL_TRACE_BUFFER_SIZE={flightrec.BUFFER}" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    assert "TORCH_FR_BUFFER_SIZE" not in r.stdout, r.stdout[-2000:]


def test_a_rank_that_entered_no_collective_of_the_group_is_named():
    """torch starts a group's last_enqueued_collective at -1: a rank at -1 entered none of it,
    and the others wait for it (the pickle's int and the JSON form's string alike)."""
    for none in (-1, "-1"):
        dumps = {0: {"pg_status": {"1": {"last_enqueued_collective": 0}},
                     "entries": [{"pg_id": 1, "collective_seq_id": 0, "profiling_name": "nccl:broadcast"}]},
                 1: {"pg_status": {"1": {"last_enqueued_collective": none}}}}
        (b,) = flightrec.behind(dumps)
        assert (b.ranks, b.entered, b.op) == ((1,), (-1,), "nccl:broadcast"), b
        assert flightrec.text([b], 2, 2, ["node-1", "node-2"]) == (
            "flight recorder: r1 (node-2) (entered none) did not enter nccl:broadcast #0 of process group 1 that r0 "
            "waits in")


def test_a_large_dump_is_read_in_linear_time():
    """1,000 groups each behind and 100,000 records (half a megabyte pickled): the ops are
    indexed once per dump, not searched per group (77 s before), and only the newest
    MAX_ENTRIES records are read."""
    import time

    entries = [{"pg_id": str(i % 1000), "collective_seq_id": i // 1000, "profiling_name": "gloo:all_reduce"}
               for i in range(100_000)]
    ahead = {"pg_status": {str(g): {"last_enqueued_collective": 99} for g in range(1000)}, "entries": entries}
    late = {"pg_status": {str(g): {"last_enqueued_collective": 98} for g in range(1000)}}
    t0 = time.monotonic()
    found = flightrec.behind({0: ahead, 1: late})
    took = time.monotonic() - t0
    assert len(found) == 1000 and found[0].op == "gloo:all_reduce" and took < 5, took
    assert len(flightrec._entries(ahead)) == flightrec.MAX_ENTRIES
