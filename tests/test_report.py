"""`dtrain report` (launch/analysis/report.py): a job's record, output.log and output.times -> one
self-contained HTML page; the launcher's side of what it reads (output.times, the gate in the
record); the CLI's error lines; and the page rendered by a real headless Chromium."""

from __future__ import annotations

import json
import os
import re
import statistics
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from dtrain.launch.jobs.sink import Sink
from dtrain.launch.jobs import netgate
from dtrain.launch.analysis import report
from dtrain.launch.analysis.timeline import Entry, to_json

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_764_150_000.0
HOSTS = ("10.213.0.11", "10.213.0.12", "10.213.0.13")
NAMES = {"10.213.0.11": "node-1", "10.213.0.12": "node-2", "10.213.0.13": "node-3"}


def recorded_job(name: str = "t-report", **extra) -> dict:
    """A job.json as job.py and store.py write it: 2 nodes run the job, a spare (node-3), a
    restart after a hang (the timeline's restart 1 rows), the gate's results."""
    launch = [Entry(h, p, s + i * 0.05, d) for i, h in enumerate(HOSTS)
              for p, s, d in (("first-round", 0.0, 0.2), ("pull", 0.2, 3.1), ("container", 3.3, 1.2),
                              ("sshd", 4.5, 0.1), ("network-gate", 4.6, 2.0))]
    launch += [Entry(h, "first-step", 7.0, 1.1) for h in HOSTS[:2]]
    restart = [Entry("10.213.0.12", "detection", 21.0, 10.1, 1), Entry("", "teardown", 31.1, 2.13, 1),
               Entry("", "resumed", 33.3, 2.7, 1)]
    gate = netgate.GateResult(rates={HOSTS[0]: 9.4, HOSTS[1]: 9.1, HOSTS[2]: 2.2}, culprits={},
                              pairs=(netgate.Pair(HOSTS[0], HOSTS[1], 9.4), netgate.Pair(HOSTS[1], HOSTS[2], 9.1),
                                     netgate.Pair(HOSTS[2], HOSTS[0], 2.2, "")),
                              names=dict(NAMES), seconds=2.0)
    return {"name": name, "image": "10.213.0.1:5000/dtrain/pytorch-ddp:1", "launcher": "torchrun",
            "command": ["python", "train.py"], "nodes": [{"host": h, "slots": 1} for h in HOSTS],
            "ssh_opts": [], "detached": False, "progress_pattern": r"^step \d+", "started": T0, "state": "succeeded",
            "exit_code": 0, "ranks": ["node-1", "node-2"], "first": HOSTS[0], "node_names": dict(NAMES),
            "gate": gate.to_json(), "quarantined": {"10.213.0.13": "slow link: 2.2 Gbit/s"},
            "ended": T0 + 60.0, "timeline": to_json(launch + restart), **extra}


def timed(lines: list[str], start: float = 8.0, every: float = 0.5) -> tuple[str, str]:
    """output.log and output.times for lines written one write each, `every` s apart."""
    log = "".join(line + "\n" for line in lines)
    times = "".join(f"{T0 + start + i * every:.3f} 1\n" for i in range(len(lines)))
    return log, times


HANG_LOG = (ROOT / "tests/logs/hang.log").read_text().splitlines()  # a real run's log: a hang, a restart


def test_stamp_gives_each_line_the_time_of_the_write_that_brought_it():
    lines = report.stamp("a\nb\nc\nd\n", f"{T0 + 1:.3f} 2\n{T0 + 2.5:.3f} 1\nnot a row\n", T0)
    assert [(x.at, x.text) for x in lines] == [(1.0, "a"), (1.0, "b"), (2.5, "c"), (None, "d")]


def test_the_launchers_log_writes_come_with_their_times(tmp_path, monkeypatch):
    """sink.py's output.times (the launcher's job output): one `EPOCH COUNT` row per write to output.log, a batch one row."""
    import io

    monkeypatch.setattr(sys, "stdout", io.StringIO())
    j = Sink()
    j.open(tmp_path)
    j.emit("[launch] job started on 1 node(s): node-1")
    with j.batched():
        j.emit("[node-1 r0] step 1")
        j.emit("[node-1 r0] step 2")
    j.log_only("error: the end")
    j.close()
    rows = (tmp_path / "output.times").read_text().splitlines()
    assert [r.split()[1] for r in rows] == ["1", "2", "1"]
    lines = report.stamp((tmp_path / "output.log").read_text(), (tmp_path / "output.times").read_text(),
                         float(rows[0].split()[0]) - 5)
    assert [x.text for x in lines] == ["[launch] job started on 1 node(s): node-1", "[node-1 r0] step 1",
                                       "[node-1 r0] step 2", "error: the end"]
    assert all(x.at is not None and 4.9 < x.at < 10 for x in lines)
    assert lines[1].at == lines[2].at


def test_a_recorded_run_with_a_restart_reads_into_phases_restarts_hangs_and_steps():
    log, times = timed(HANG_LOG)
    run = report.read(recorded_job(), log, times)
    assert run.nodes == HOSTS and run.names["10.213.0.12"] == "node-2"
    assert [(r.attempt, r.why) for r in run.restarts] == [
        (1, "hang: no rank made progress for 10.1 s; behind: r1 (node-2); same nodes (the attempt ended in 2.1 s)")]
    assert len(run.hangs) == 1 and run.hangs[0].line.startswith("hang: no rank made progress for 10.1 s")
    assert run.hangs[0].dump[0] == "[node-1 r0] stack of pid 57, state S: python /opt/dtrain/node/examples/hang_train.py --steps 8 --step-seconds 2"
    assert len(run.hangs[0].dump) == 12 and run.hangs[0].dump[-1].endswith("<module> (hang_train.py:56)")
    # ^step \d+: 4 + 3 lines before the restart, 8 + 8 after; the first of each attempt has no time before it
    assert [(s.attempt, s.rank) for s in run.steps].count((0, 0)) == 4
    assert [(s.attempt, s.rank) for s in run.steps].count((1, 1)) == 8
    assert [s.seconds for s in run.steps if (s.attempt, s.rank) == (1, 0)][0] is None
    assert {s.seconds for s in run.steps if s.seconds is not None} > {1.0}  # 2 lines apart, 0.5 s each
    assert [g.node for g in run.gate] == list(HOSTS) and run.gate[2].status == "WARN"
    assert run.quarantined == {"10.213.0.13": "slow link: 2.2 Gbit/s"}
    assert run.events[0].text == "[launch] job started on 2 node(s): node-1, node-2" and run.events[0].at == 8.0
    assert run.attempts == (
        report.Attempt(0, 8.0, 20.0, "restart 1: hang: no rank made progress for 10.1 s; behind: r1 (node-2); "
                                     "same nodes (the attempt ended in 2.1 s)"),
        report.Attempt(1, 20.5, 31.5, "job succeeded"))


def test_restart_phase_lines_are_not_restarts():
    lines = [report.Line(1.0, "[launch] restart 1: teardown 2.13 s"),
             report.Line(2.0, "[launch] restart 1: detection 10.213.0.12 10.1 s"),
             report.Line(3.0, "[launch] restart 2: lost node-2: no answer; node-2 replaced by spare node-3")]
    assert report.restarts_of(lines) == [report.Restart(2, 3.0, "lost node-2: no answer; node-2 replaced by spare node-3")]


def test_the_page_has_a_lane_per_node_the_restart_marked_the_steps_the_gate_and_the_events():
    log, times = timed(HANG_LOG)
    page = report.html(report.read(recorded_job(), log, times))
    for h in HOSTS:
        assert f'<g class="lane" data-node="{h}">' in page
        assert f'<tr class="gate-node" data-node="{h}">' in page
    assert page.count('class="phase"') == 3 * 5 + 2 + 3
    assert 'data-phase="teardown"' in page and 'data-phase="network-gate"' in page
    assert '<g class="restart-mark">' in page and "restart 1 at" in page
    assert page.count('<rect class="attempt"') == 2 and "<td>how it ended</td>" not in page
    assert "<td>restart 1: hang: no rank made progress for 10.1 s; behind: r1 (node-2); same nodes" in page
    assert page.count('<figure class="rank') == 2 and "r1 on node-2: median" in page
    assert "<details><summary>at " in page and "load_batch (hang_train.py:24)" in page
    assert "slow link: 2.2 Gbit/s" in page and "succeeded" in page
    assert not re.search(r"<script|https?://(?!www\.w3\.org/2000/svg)|@import|url\(", page)  # nothing to fetch


def test_a_rank_well_behind_the_others_stands_out():
    lines = []
    for step in range(1, 11):
        lines += [f"[node-1 r0] step {step}", f"[node-2 r1] step {step}"]
    log = "".join(line + "\n" for line in lines)
    # rank 0 every 1 s, rank 1 every 2.5 s
    times = "".join(f"{T0 + 10 + (i // 2) * (1.0 if i % 2 == 0 else 2.5):.3f} 1\n" for i in range(len(lines)))
    run = report.read(recorded_job(), log, times)
    assert report.stragglers(run.steps) == {1: 2.5}
    page = report.html(run)
    assert '<figure class="rank straggler" data-rank="1">' in page and '<figure class="rank" data-rank="0">' in page
    even = report.read(recorded_job(), log, "".join(f"{T0 + 10 + (i // 2):.3f} 1\n" for i in range(len(lines))))
    assert report.stragglers(even.steps) == {}


def test_every_value_of_the_job_is_text_in_the_page():
    evil = "<script>alert(1)</script>"
    job = recorded_job(image=f"img{evil}", quarantined={"10.213.0.13": f"why {evil}"},
                       node_names={"10.213.0.11": f"n{evil}"}, progress_pattern="step",
                       final={"reason": f"exit {evil}"}, state="failed", exit_code=1,
                       timeline=to_json([Entry("10.213.0.11", f"ph{evil}", 0.0, 1.0)]))
    log, times = timed([f"[node-1 r0] step 1 {evil}", f"[node-1 r0] step 2 {evil}",
                        f"[launch] restart 1: lost {evil}; same nodes", f"[launch] hang: {evil}",
                        f"[node-1 r0] stack of pid 1, state T: {evil}", "[launch] job failed (exit 1)"])
    page = report.html(report.read(job, log, times))
    assert "<script" not in page and "alert(1)</script>" not in page
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 8
    assert 'data-phase="ph&lt;script&gt;' in page  # in an attribute too


def test_a_record_without_times_timeline_or_gate_says_so():
    old = {"name": "t-old", "state": "succeeded", "nodes": [{"host": "h1", "slots": 1}], "exit_code": 0}
    page = report.html(report.read(old, "[h1 r0] hello\n", ""))
    assert "no timeline recorded for this job" in page and "no step times: the log has no times" in page
    assert "no network gate in this launch" in page and '<g class="lane" data-node="h1">' in page
    restarted = report.read(old, "[launch] job started on 1 node(s): h1\n[launch] restart 1: lost h1: gone; same nodes\n", "")
    assert restarted.attempts == () and "<td>lost h1: gone; same nodes</td>" in report.html(restarted)


def test_an_attempt_without_an_end_in_the_log_ends_with_the_record():
    log, times = timed(["[launch] job started on 2 node(s): node-1, node-2", "[node-1 r0] step 1"])
    run = report.read(recorded_job(), log, times)
    assert run.attempts == (report.Attempt(0, 8.0, 60.0, "the log ends"),)


def _dtrain(home: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """The real `dtrain` (dtrain/cli.py), in cwd, with its store at home."""
    return subprocess.run([sys.executable, "-m", "dtrain", *argv], cwd=cwd, env={**os.environ, "DTRAIN_HOME": str(home)},
                          capture_output=True, text=True, timeout=120)


def test_no_jobs_and_an_unknown_job_are_one_line_each_and_write_nothing(tmp_path):
    none = _dtrain(tmp_path / "home", "report", cwd=tmp_path)
    assert (none.returncode, none.stderr.splitlines()) == (2, [f"error: no jobs yet (jobs are in {tmp_path}/home/jobs)"])
    unknown = _dtrain(tmp_path / "home", "report", "--job", "nope", "--output", "r.html", cwd=tmp_path)
    assert (unknown.returncode, unknown.stderr.splitlines()) == (
        2, [f"error: no job named nope (jobs are in {tmp_path}/home/jobs)"])
    assert not (tmp_path / "r.html").exists() and not list((tmp_path / "home").rglob("*.json"))


def _store_job(home: Path, job: dict, log: str, times: str) -> None:
    d = home / "jobs" / job["name"]
    d.mkdir(parents=True)
    (d / "job.json").write_text(json.dumps(job))
    (d / "output.log").write_text(log)
    (d / "output.times").write_text(times)


def test_the_command_writes_the_latest_jobs_report_here_or_where_asked(tmp_path):
    home = tmp_path / "home"
    log, times = timed(HANG_LOG)
    _store_job(home, recorded_job("t-cli"), log, times)
    r = _dtrain(home, "report", cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (0, "t-cli-report.html\n", "")
    assert '<g class="lane" data-node="10.213.0.12">' in (tmp_path / "t-cli-report.html").read_text()
    r = _dtrain(home, "report", "--job", "t-cli", "--output", str(tmp_path / "out" / "x.html"), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("error: --output") and len(r.stderr.splitlines()) == 1


def test_report_of_latest_is_private_and_an_unwritable_output_is_one_line(tmp_path):
    home = tmp_path / "home"
    log, times = timed(HANG_LOG)
    _store_job(home, recorded_job("t-cli"), log, times)
    r = _dtrain(home, "report", "--job", "latest", "--output", "new.html", cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (0, "new.html\n", "")
    assert (tmp_path / "new.html").stat().st_mode & 0o777 == 0o600  # as private as the job's store
    (tmp_path / "mine.html").write_text("old")
    (tmp_path / "mine.html").chmod(0o644)
    r = _dtrain(home, "report", "--output", "mine.html", cwd=tmp_path)  # not dtrain's: --force replaces it
    assert r.returncode == 2 and "--force" in r.stderr and (tmp_path / "mine.html").read_text() == "old"
    r = _dtrain(home, "report", "--output", "mine.html", "--force", cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "mine.html").stat().st_mode & 0o777 == 0o644
    assert "<html" in (tmp_path / "mine.html").read_text()
    for where in ("/proc/x.html", str(tmp_path)):
        r = _dtrain(home, "report", "--output", where, cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.startswith(f"error: --output '{where}': "), r.stderr
        assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr


def test_the_report_summary_in_dtrain_help_is_a_whole_sentence(tmp_path):
    r = _dtrain(tmp_path / "home", "--help", cwd=tmp_path)
    line = next(ln for ln in r.stdout.splitlines() if ln.split()[:1] == ["report"])
    assert line.rstrip().endswith("."), line


def test_a_failed_launch_is_reported_from_what_the_real_launcher_recorded(tmp_path, monkeypatch):
    """A launch that cannot reach its node: the store as the launcher left it (record, log, times).
    It ends before its first phase: the error's lines that say why are events too."""
    home = tmp_path / "home"
    r = _dtrain(home, "launch", "--hosts", "127.0.0.1", "--ssh-opt", "ProxyCommand=/bin/false",
                "--image", "x/y:z", "--name", "t-fail", "--", "python", "-c", "1", cwd=tmp_path)
    assert r.returncode != 0
    d = home / "jobs" / "t-fail"
    assert (d / "output.times").exists() and (d / "output.log").exists()
    monkeypatch.setenv("DTRAIN_HOME", str(home))
    run = report.load("t-fail")
    assert run.state == "failed to launch" and run.nodes == ("127.0.0.1",) and run.entries == ()
    logged = (d / "output.log").read_text().splitlines()
    said = [ln.text for ln in run.events]
    assert said == [ln for ln in logged if ln.startswith(("[launch]", "error:", "  "))]
    why = next(i for i, t in enumerate(said) if t.startswith("error: preparing the job's directory failed"))
    assert said[why + 1].startswith("  127.0.0.1: ssh could not connect"), said
    assert run.events and all(ln.at is not None and 0 <= ln.at < 120 for ln in run.events)
    page = report.html(run)
    assert '<g class="lane" data-node="127.0.0.1">' in page and "failed to launch" in page
    assert "the launch ended before its first phase" in page and "a launch before dtrain" not in page
    assert "127.0.0.1: ssh could not connect" in page


# ---------------------------------------------------------------- a real browser


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def _png_pixels(data: bytes) -> tuple[int, int, set[bytes]]:
    """A PNG's width, height and distinct colours (8-bit RGB or RGBA; the row filters undone)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, bpp = 8, b"", 0, 0, 3
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6), (depth, colour)
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, stride = zlib.decompress(idat), width * bpp
    prev, seen = bytearray(stride), set()
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            line[x] = (line[x] + (0, a, b, (a + b) // 2, _paeth(a, b, c))[f]) & 0xFF
        seen.update(bytes(line[x:x + 3]) for x in range(0, stride, bpp))
        prev = line
    return width, height, seen


BROWSER = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", "--enable-logging=stderr",
           "--window-size=1400,1000"]


@pytest.fixture(scope="module")
def chromium():
    """Debian's chromium, as `dtrain test` installs it (engine.PACKAGES); a headless run of it."""
    from dtrain import engine

    engine.ensure_packages(("chromium",))

    def run(profile: Path, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["chromium", *BROWSER, f"--user-data-dir={profile}", *args], capture_output=True,
                              text=True, timeout=120)
    return run


@pytest.mark.docker  # needs what `dtrain test` installs (engine.PACKAGES: chromium), not a unit run
def test_the_report_of_a_run_with_a_restart_renders_in_headless_chromium(chromium, tmp_path):
    log, times = timed(HANG_LOG)
    page = tmp_path / "report.html"
    report.write(report.read(recorded_job(), log, times), page)
    dom = chromium(tmp_path / "profile", "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    for h in HOSTS:
        assert re.search(rf'<g class="lane" data-node="{re.escape(h)}"><text[^>]*>[^<]+</text><rect ', dom.stdout)
    assert dom.stdout.count('<rect class="phase"') == 20 and dom.stdout.count("<polyline") == 4
    assert "CONSOLE" not in dom.stderr and "Uncaught" not in dom.stderr, dom.stderr[-2000:]
    shot = tmp_path / "report.png"
    r = chromium(tmp_path / "profile", f"--screenshot={shot}", page.as_uri())
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    width, height, colours = _png_pixels(shot.read_bytes())
    assert (width, height) == (1400, 1000)
    assert len(colours) > 20, colours  # text, lanes and bars, not a blank page
    print(f"screenshot: {shot}")


@pytest.mark.cluster
def test_a_real_run_with_a_hang_and_a_restart_is_reported_and_renders(cluster, remote_images, chromium, tmp_path):
    """A job on the simulated cluster (torchrun, the network gate, a rank stopped after its 3rd
    step, a restart): its report from the store has every node's phases, the restart and why,
    both ranks' step times in both attempts, the gate's rates and the hang's stacks; Chromium
    renders it."""
    from test_hang import TIMEOUT, _stop_rank_when
    from test_launch import EX, nodes_of
    from test_wholerun import _job, _wait_clean

    name = "t-report-run"
    seen: dict = {}
    _stop_rank_when(cluster, name, r"^\[node-2 r1\] step 3 rank 1/2$", 2, seen)
    code, out, _ = _job(cluster, remote_images["pytorch-ddp"],
                        ["python", f"{EX}/hang_train.py", "--steps", "6", "--step-seconds", "1"], name, n=2,
                        launcher="torchrun", hang_timeout=TIMEOUT, progress_pattern="^step ", max_restarts=1,
                        check_network=True)
    assert code == 0 and "stopped" in seen, (seen, out)
    _wait_clean(cluster, name)
    run = report.load(name)
    hosts = tuple(n.host for n in nodes_of(cluster, 2))
    assert run.nodes == hosts and run.state == "succeeded" and run.timed
    assert {e.node for e in run.entries if e.restart == 0 and e.phase == "container"} == set(hosts)
    assert [r.attempt for r in run.restarts] == [1] and "hang: no rank made progress" in run.restarts[0].why
    assert {(s.rank, s.attempt) for s in run.steps if s.seconds is not None} == {(0, 0), (1, 0), (0, 1), (1, 1)}
    resumed = [s.seconds for s in run.steps if s.seconds is not None and s.attempt == 1]
    assert 0.5 < statistics.median(resumed) < 5, resumed  # --step-seconds 1: the lines timed as they came
    assert sorted(g.node for g in run.gate) == sorted(hosts) and all(g.gbps > 0 for g in run.gate)
    assert run.hangs and any("stack of pid" in line for line in run.hangs[0].dump)
    # torchrun: the flight recorder's part of the hang line (gloo: why it names nobody), beside the stacks'
    assert "; flight recorder: no flight-recorder dump from any rank (" in run.hangs[0].line, run.hangs[0].line
    page = tmp_path / "run.html"
    report.write(run, page)
    dom = chromium(tmp_path / "profile", "--dump-dom", page.as_uri())
    assert dom.returncode == 0 and "CONSOLE" not in dom.stderr, dom.stderr[-2000:]
    for h in hosts:
        assert f'<g class="lane" data-node="{h}">' in dom.stdout
    assert dom.stdout.count('<figure class="rank') == 2 and '<g class="restart-mark">' in dom.stdout
    shot = tmp_path / "run.png"
    r = chromium(tmp_path / "profile", f"--screenshot={shot}", page.as_uri())
    assert r.returncode == 0 and len(_png_pixels(shot.read_bytes())[2]) > 20, r.stderr[-2000:]
    print(f"screenshot: {shot}")


def test_a_hang_dump_that_starts_with_a_process_without_a_rank_is_kept_whole():
    """The hang dump as stacks.sh writes it under torchrun: the agent's stack (`[node-1] ...`, no
    rank) comes before the ranks'; every line of it belongs to the hang (seen on the cluster)."""
    from dtrain.launch.analysis import report as rp

    text = ["[node-1 r0] step 4", "[launch] hang: no rank made progress for 10.1 s; stopped: r1 on node-2 (state T)",
            "[node-1] stack of pid 40, state S: /opt/venv/bin/torchrun --nnodes 2",
            '[node-1]   Thread 40 (idle): "MainThread"', "[node-1]       _invoke_run (api.py:923)",
            "[node-1 r0] stack of pid 50, state S: python hang_train.py",
            "[node-1 r0]       all_reduce (torch/distributed/distributed_c10d.py:3252)",
            "[launch] restart 1: hang"]
    [hang] = rp.hangs_of([rp.Line(float(i), t) for i, t in enumerate(text)])
    assert hang.dump == tuple(text[2:7])
