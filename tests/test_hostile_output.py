"""What a node or a job sends back is hostile input (issue 47): forged `dtrain-supervisor`
events, a node's state.json, a record's times, terminal escapes in what dtrain prints.

Through the parts (Render, events, the report) and through the real `dtrain` (logs, status,
report) with a real sshd on 127.0.0.1 as the job's first node (its HOME in tmp: the node
program reads the job's files there): one line each, no traceback, no terminal control byte
in stdout or stderr."""

from __future__ import annotations

import getpass
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dtrain import contract
from dtrain.launch.jobs import events
from dtrain.launch.analysis import report
from dtrain.launch.analysis import timeline
from dtrain.launch.jobs.supervision import Render
from dtrain.terminal import clean

ROOT = Path(__file__).resolve().parent.parent
EV = contract.SUPERVISOR_EVENT
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # what no print of dtrain may hold (\t, \n aside)
T0 = 1_764_150_000.0


def _ev(payload: str) -> str:
    return EV + payload


NESTED = '{"event": "hang", "culprits": ' + "[" * 100_000 + "]" * 100_000 + "}"
# The 20 forged events: (what, line, shown) where shown: the event is one a user reads (its
# text cleaned), else it is skipped with one warning line.
FORGED = [
    ("string where a number", _ev('{"event": "running", "attempt": "1", "nodes": ["n1"]}'), False),
    ("dict where a list", _ev('{"event": "running", "nodes": {"n1": 1}}'), False),
    ("null where a list", _ev('{"event": "checkpoint-now", "nodes": null}'), False),
    ("list where a dict", _ev('{"event": "lost", "nodes": ["n1", "n2"]}'), False),
    ("list where a dict (replaced)", _ev('{"event": "restart", "attempt": 1, "replaced": ["n1"]}'), False),
    ("unknown kind", _ev('{"event": "pwn", "x": 1}'), False),
    ("no kind", _ev('{"phase": "pull", "seconds": 1}'), False),
    ("missing field", _ev('{"event": "spare-in", "replaces": "n1"}'), False),
    ("huge number", _ev('{"event": "phase", "phase": "teardown", "restart": 1, "seconds": 1e308}'), False),
    ("integer literal 10**400", _ev('{"event": "restart", "attempt": ' + "1" + "0" * 400 + "}"), False),
    ("NaN", _ev('{"event": "phase", "phase": "teardown", "restart": 1, "seconds": NaN}'), False),
    ("Infinity", _ev('{"event": "phase", "phase": "ready", "at": Infinity, "end": 1}'), False),
    ("negative time", _ev('{"event": "phase", "phase": "teardown", "restart": 1, "seconds": -5}'), False),
    ("100 KB string", _ev(json.dumps({"event": "failed", "exit_code": 1, "reason": "x" * 100_000})), False),
    ("format of a string", _ev('{"event": "straggler", "rank": 1, "node": "n1", "others": "x", "interval": 1}'),
     False),
    ("culprit without rank", _ev('{"event": "hang", "culprits": [{"node": "n1"}]}'), False),
    ("deeply nested", _ev(NESTED), False),
    ("not an object", _ev('[1, 2, 3]'), False),
    ("OSC title in a reason", _ev(json.dumps({"event": "quarantined", "node": "n3",
                                              "reason": "\x1b]0;pwned\x07slow\x1b[2J\x9b31m"})), True),
    ("escapes in host names", _ev(json.dumps({"event": "running", "attempt": 0, "nodes": ["\x1b[2Jn1", "n\x9b2"],
                                              "ranks": ["n1"]})), True),
]
FINAL = _ev(json.dumps({"event": "failed", "exit_code": 3, "reason": "rank 0 said \x1b]0;pwned\x07 \x9b2J bye"}))
BAD_UTF8 = (EV + '{"event": "quarantined", "node": "n2", "reason": "').encode() + b"\xff\xfe\xc0" + b'"}'


def test_twenty_forged_events_are_skipped_with_one_warning_or_shown_clean():
    assert len(FORGED) == 20
    for what, line, shown in FORGED:
        r = Render("mpirun", "n1", on_phase=lambda e: None)
        out = r.feed(line)
        assert len(out) == 1, (what, out)
        assert not CONTROL.search(out[0]), (what, out)
        if shown:
            assert out[0].startswith("[launch] ") and "warning" not in out[0], (what, out)
        else:
            assert out[0].startswith("[launch] warning: skipped a malformed supervisor event: "), (what, out)
            assert len(out[0]) < 300, what
    assert Render("mpirun", "n1").feed(FORGED[18][1]) == ["[launch] spare n3 out: slow (quarantined)"]


def test_a_skipped_event_changes_nothing_the_render_keeps():
    r = Render("mpirun", "n1")
    for _, line, _ in FORGED[:18]:
        r.feed(line)
    assert (r.final, r.quarantined, r.stragglers, r.exit_code) == (None, {}, {}, None)
    r.feed(FINAL)
    assert r.exit_code == 3 and r.final["reason"].startswith("rank 0 said")


def test_the_schema_keeps_a_real_supervisors_events():
    """What launch/node/supervise.py, run.sh and host/phase.sh write reads as before."""
    real = [{"event": "running", "attempt": 0, "nodes": ["n1", "n2"], "ranks": ["n1", "n2"], "spares": []},
            {"event": "lost", "nodes": {"n2": "no heartbeat for 6.0 s"}},
            {"event": "phase", "restart": 1, "phase": "detection", "node": "n2", "seconds": 6.01},
            {"event": "restart", "attempt": 1, "reason": "lost n2", "dropped": [], "replaced": {"n2": "n3"},
             "ended_in": 2.5},
            {"event": "phase", "phase": "ready", "node": "10.0.0.2", "at": 1764150000.5, "end": 1764150001},
            {"event": "hang", "silent_for": 30.0, "ranks": [1], "nodes": ["n2"], "ago": {"1": 31.2},
             "steps": {"1": 4}, "culprits": [{"rank": 1, "node": "n2", "kind": "stopped", "where": "", "state": "T"}],
             "waiting": [0], "unread": []},
            {"event": "straggler", "attempt": 0, "rank": 1, "node": "n2", "waiting": 0, "others": 10.0,
             "samples": 12, "interval": 0.5},
            {"event": "failed", "exit_code": 1, "reason": "rank 1 failed", "at_fault": []},
            {"event": "succeeded", "exit_code": 0}]
    for ev in real:
        assert events.parse(json.dumps(ev)) == ev


def test_json_from_a_node_refuses_nan_infinity_and_depth():
    for text in ("NaN", "[Infinity]", '{"a": -Infinity}', "[" * 50_000):
        with pytest.raises(ValueError):
            events.loads(text)
    assert events.loads('{"a": 1e308}') == {"a": 1e308}


def test_clean_removes_terminal_control_and_keeps_colours_where_asked():
    assert clean("a\x1b]0;pwned\x07b\x1b[2Jc\x9b31md\x1b]8;;http://x\x1b\\e\rf\x00g\u202eh") == "abcdefgh"
    assert clean("x\ny") == "x y" and clean("x\ny\tz", lines=True) == "x\ny\tz"
    assert clean("\x1b[31mred\x1b[0m \x1b[2J", colour=True) == "\x1b[31mred\x1b[0m "
    assert clean("\x1b[31mred\x1b[0m") == "red"
    assert clean(5) == "5" and clean("plain") == "plain"


def test_the_timeline_draws_no_time_out_of_bounds():
    rows = [{"node": "a", "phase": "pull", "start": 1e308, "seconds": 1.0},
            {"node": "a", "phase": "pull", "start": 1.0, "seconds": -3.0},
            {"node": "a", "phase": "sshd", "start": 1.0, "seconds": 1e300},
            {"node": "a", "phase": "x" * 1000, "start": 1.0, "seconds": 1.0},
            {"node": "a", "phase": "pull", "start": 1.0, "seconds": 2.0, "restart": 1e300},
            {"node": "\x1b[2Ja", "phase": "container", "start": 2.0, "seconds": 1.5}]
    entries = timeline.from_json(rows)
    assert [(e.phase, e.start, e.seconds) for e in entries] == [("container", 2.0, 1.5)]
    assert not CONTROL.search(timeline.text(entries))
    ev = {"event": "phase", "phase": "ready", "at": 1.0, "end": 2.0}
    assert timeline.from_event(ev, t0=1e308, now=0.0) is None


def _no_bad_numbers(page: str) -> None:
    """No NaN or infinity drawn: every number in an attribute of the SVG is finite."""
    for attr in re.findall(r'\b(?:x|y|x1|x2|y1|y2|width|height|cx|cy)="([^"]*)"', page):
        assert re.fullmatch(r"-?[\d.]+(?:e[+-]?\d+)?", attr), attr
    assert not re.search(r"\b(?:nan|inf)(?:s|\b)", page, re.I)
    assert not CONTROL.search(page.replace("\n", ""))


def test_the_report_of_huge_times_draws_finite_ticks_and_says_what_it_left_out():
    job = {"name": "t-huge", "state": "failed", "launcher": "torchrun", "image": "x/y:z", "started": T0,
           "ended": T0 + 1e300, "nodes": [{"host": "10.0.0.1"}], "exit_code": 1,
           "final": {"reason": "boom \x1b]0;pwned\x07"},
           "timeline": [{"node": "10.0.0.1", "phase": "pull", "start": 1e308, "seconds": 5.0},
                        {"node": "10.0.0.1", "phase": "container", "start": 1.0, "seconds": 2.0}],
           "gate": {"nodes": {"10.0.0.1": {"gbps": 1e308, "status": "PASS"}},
                    "pairs": [{"src": "a", "dst": "b", "gbps": float("inf")}]}}
    log = "[node-1 r0] step 1\n[node-1 r0] step 2\n[node-1 r0] step 3\n[launch] job failed (exit 1)\n"
    times = f"{T0 + 1} 1\n1e308 1\nnan 1\n{T0 + 4} 99999999999\n"
    run = report.read(job, log, times)
    assert run.duration is None and [e.phase for e in run.entries] == ["container"]
    assert all(s.at is None or abs(s.at) < 100 for s in run.steps)
    page = report.html(run)
    _no_bad_numbers(page)
    assert "not drawn" in page and "output.times" in page
    assert "boom" in page and "pwned" not in page and "\x1b" not in page and "\x07" not in page


def test_the_report_of_negative_durations_and_a_record_without_times():
    job = {"name": "t-neg", "state": "failed", "started": T0, "ended": T0 - 50, "nodes": [{"host": "h"}],
           "timeline": [{"node": "h", "phase": "pull", "start": -5.0, "seconds": 2.0}]}
    run = report.read(job, "[launch] job failed\n", f"{T0 - 1e9} 1\n")
    assert run.duration is None
    page = report.html(run)
    _no_bad_numbers(page)
    assert "before its start" in page


# ---------------------------------------------------------------- the real dtrain, a real sshd


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """A real sshd on 127.0.0.1 (a job's first node), its sessions' HOME in tmp (SetEnv)."""
    d = tmp_path_factory.mktemp("node")
    for key in ("host_key", "id"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    (d / "authorized_keys").write_text((d / "id.pub").read_text())
    (d / "home").mkdir()
    port = _free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nPidFile {d}/sshd.pid\n"
        f"AuthorizedKeysFile {d}/authorized_keys\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\n"
        f"SetEnv HOME={d}/home\n")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    log = open(d / "sshd.log", "w")
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(d / "sshd_config"), "-h", str(d / "host_key")],
                            stderr=log)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd did not start: {(d / 'sshd.log').read_text()}")
            time.sleep(0.05)
    host = (Path("/proc/sys/kernel/hostname").read_text().strip() or socket.gethostname())
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", host)
    yield {"dir": d, "port": port, "jobs": d / "home" / ".dtrain" / "nodes" / host / "jobs"}
    proc.terminate()
    proc.wait(5)
    log.close()


def _detached(home: Path, node: dict, name: str, state: str | None = None, log: bytes | None = None) -> None:
    """A detached job's record here, and its files on the node (state.json, output.log)."""
    d = home / "jobs" / name
    d.mkdir(parents=True)
    (d / "job.json").write_text(json.dumps({
        "name": name, "state": "detached", "detached": True, "launcher": "mpirun", "image": "x/y:z",
        "nodes": [{"host": "127.0.0.1", "port": node["port"], "user": getpass.getuser(),
                   "identity": str(node["dir"] / "id")}],
        "ssh_opts": ["-o", f"UserKnownHostsFile={node['dir']}/known_hosts", "-o", "GlobalKnownHostsFile=/dev/null",
                     "-o", "LogLevel=ERROR"],
        "started": T0, "ranks": ["n1"], "first": "127.0.0.1", "timeline": []}))
    (d / "output.log").write_text("[launch] detached\n")
    there = node["jobs"] / name
    there.mkdir(parents=True)
    if state is not None:
        (there / "state.json").write_text(state)
    if log is not None:
        (there / "output.log").write_bytes(log)


def _dtrain(home: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dtrain", *argv], cwd=cwd, capture_output=True, timeout=120,
                          env={**os.environ, "DTRAIN_HOME": str(home)})


def _text(r: subprocess.CompletedProcess) -> tuple[str, str]:
    out, err = r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
    assert "Traceback" not in out + err, out + err
    for stream in (r.stdout, r.stderr):
        assert not CONTROL.search(stream.decode(errors="replace")), stream
    return out, err


def test_dtrain_logs_of_twenty_forged_events_one_line_each(node, tmp_path):
    home = tmp_path / "home"
    lines = [line.encode() for _, line, _ in FORGED] + [BAD_UTF8, b"[n1] the job's own \x1b[32mgreen\x1b[0m line",
                                                        b"\x1b]0;title\x07[n1] \x1b[2Jcleared", FINAL.encode()]
    _detached(home, node, "t-forged", log=b"\n".join(lines) + b"\n")
    r = _dtrain(home, "logs", "--job", "t-forged", cwd=tmp_path)
    assert b"\x1b[32mgreen\x1b[0m" in r.stdout  # the job's colours are the job's
    r.stdout = r.stdout.replace(b"\x1b[32m", b"").replace(b"\x1b[0m", b"")
    out, err = _text(r)
    assert r.returncode == 3, (out, err)  # the job's exit code, from its final event
    shown = out.splitlines()
    assert shown[0] == "[launch] detached"
    warned = [ln for ln in shown if ln.startswith("[launch] warning: skipped a malformed supervisor event")]
    assert len(warned) == 18, out
    assert "[launch] spare n3 out: slow (quarantined)" in shown
    assert any(ln.startswith("[launch] spare n2 out: \ufffd") for ln in shown), out  # bad UTF-8: replaced
    assert shown[-1] == "[launch] job failed (exit 3): rank 0 said   bye", out
    assert len(shown) == 1 + 20 + 1 + 2 + 1, out


STATES = {
    "[]": "not a JSON object but list", "null": "not a JSON object but NoneType",
    '"running"': "not a JSON object but str", '{"state": ["failed"]}': "state: should be text",
    '{"state": "failed", "exit_code": "1"}': "exit_code: should be a whole number",
    '{"state": "running", "restarts": 1e400}': "restarts: should be a whole number",
    '{"state": "running", "restarts": ' + "9" * 400 + "}": "restarts: should be a whole number",
    '{"state": "failed", "reason": NaN}': "NaN is not a number JSON allows",
    '{"state": "running", "quarantined": {"n2": {"why": 1}}}': "quarantined: ['n2'] should be text",
    '{"state": "running", "stragglers": ["n2"]}': "stragglers: should be an object",
    "[" * 100_000: "nested too deeply",
}


def test_dtrain_status_of_a_hostile_state_json_is_one_line_each(node, tmp_path):
    for i, (state, why) in enumerate(STATES.items()):
        home = tmp_path / f"home{i}"
        _detached(home, node, f"t-state{i}", state=state)
        r = _dtrain(home, "status", "--job", f"t-state{i}", cwd=tmp_path)
        out, err = _text(r)
        rows = [ln for ln in out.splitlines() if ln.startswith(f"t-state{i} ")]
        assert r.returncode == 0 and len(rows) == 1 and not err, (state, out, err)
        assert f"detached: job t-state{i}: 127.0.0.1: the job's state.json: {why}" in rows[0], (state, rows)


def test_dtrain_status_of_a_failed_state_shows_its_reason_clean(node, tmp_path):
    home = tmp_path / "home"
    _detached(home, node, "t-clean", state=json.dumps(
        {"state": "failed", "exit_code": 4, "reason": "\x1b]0;pwned\x07oom\x1b[2J", "restarts": 1,
         "quarantined": {"n2\x1b[H": "lost\x9b2J"}, "extra": [1, {"x": None}]}))
    r = _dtrain(home, "status", cwd=tmp_path)
    out, err = _text(r)
    assert r.returncode == 0, err
    row = next(ln for ln in out.splitlines() if ln.startswith("t-clean "))
    assert "detached: failed, 1 restart(s) (oom); quarantined n2 (lost)" in row, row
    assert row.rstrip().endswith("4"), row
    assert json.loads((home / "jobs" / "t-clean" / "job.json").read_text())["final"]["exit_code"] == 4


def test_dtrain_report_of_huge_times_writes_a_page_without_nan(tmp_path):
    home = tmp_path / "home"
    d = home / "jobs" / "t-rep"
    d.mkdir(parents=True)
    (d / "job.json").write_text(json.dumps({
        "name": "t-rep", "state": "failed", "launcher": "mpirun", "image": "x/y:z", "started": T0,
        "ended": 1e300, "exit_code": 1, "nodes": [{"host": "127.0.0.1"}],
        "timeline": [{"node": "127.0.0.1", "phase": "pull", "start": 1e308, "seconds": 1e308},
                     {"node": "127.0.0.1", "phase": "container", "start": -1e12, "seconds": 1.0},
                     {"node": "127.0.0.1", "phase": "sshd", "start": 1.0, "seconds": 0.5}]}))
    (d / "output.log").write_bytes(b"[n1 r0] step \x1b]0;x\x07\n[n1 r0] step\n" + BAD_UTF8 + b"\n")
    (d / "output.times").write_text(f"1e308 1\n{T0 + 2} 1\n-inf 1\n")
    r = _dtrain(home, "report", "--job", "t-rep", cwd=tmp_path)
    out, err = _text(r)
    assert (r.returncode, out, err) == (0, "t-rep-report.html\n", ""), err
    page = (tmp_path / "t-rep-report.html").read_text()
    _no_bad_numbers(page)
    assert "2 timeline entr(ies)" in page and "2 row(s) of output.times" in page


def test_dtrain_commands_on_a_record_with_nan_are_one_line(tmp_path):
    home = tmp_path / "home"
    d = home / "jobs" / "t-nan"
    d.mkdir(parents=True)
    (d / "job.json").write_text('{"name": "t-nan", "state": "failed", "started": NaN}')
    for argv in (("status", "--job", "t-nan"), ("logs", "--job", "t-nan"), ("report", "--job", "t-nan"),
                 ("stop", "--job", "t-nan")):
        r = _dtrain(home, *argv, cwd=tmp_path)
        out, err = _text(r)
        assert r.returncode == 2 and not out and len(err.splitlines()) == 1, (argv, out, err)
        assert err.startswith(f"error: {d / 'job.json'}: not a readable job record (NaN is not a number"), err


def test_the_gates_node_output_of_other_types_is_left_out():
    from dtrain.launch.jobs import netgate

    text = ('{"from": "10.0.0.1", "to": "10.0.0.2", "bytes": "x", "seconds": 1.0}\n'
            '{"from": ["10.0.0.1"], "to": "10.0.0.2", "bytes": 1, "seconds": 1.0}\n'
            '{"from": "10.0.0.1", "to": "10.0.0.2", "bytes": 1, "seconds": NaN}\n'
            '{"from": "10.0.0.1", "to": "10.0.0.2", "bytes": 1, "seconds": 1e308}\n'
            + "[" * 100_000 + "\n"
            '{"from": "10.0.0.1", "to": "10.0.0.3", "bytes": 125000000, "seconds": 1}\n')
    pairs, _, _ = netgate.parse_output(text, {})
    assert pairs == [netgate.Pair("10.0.0.1", "10.0.0.3", 1.0)]


from test_report import _png_pixels, chromium  # noqa: E402,F401 (the fixture: Debian's chromium, headless)


@pytest.mark.docker  # needs what `dtrain test` installs (chromium), as test_report's render does
def test_the_report_of_hostile_times_renders_in_headless_chromium(chromium, tmp_path):
    job = {"name": "t-huge", "state": "failed", "launcher": "torchrun", "image": "x/y:z", "started": T0,
           "ended": T0 + 1e300, "nodes": [{"host": "10.0.0.1"}], "exit_code": 1,
           "final": {"reason": "boom \x1b]0;pwned\x07"},
           "timeline": [{"node": "10.0.0.1", "phase": "pull", "start": 1e308, "seconds": 5.0},
                        {"node": "10.0.0.1", "phase": "container", "start": 1.0, "seconds": 2.0}],
           "gate": {"nodes": {"10.0.0.1": {"gbps": 1e308, "status": "PASS"}}}}
    log = "[node-1 r0] step 1\n[node-1 r0] step 2\n[node-1 r0] step 3\n[launch] job failed (exit 1)\n"
    page = tmp_path / "report.html"
    report.write(report.read(job, log, f"{T0 + 1} 1\n1e308 1\n{T0 + 3} 1\n{T0 + 4} 99999999999\n"), page)
    dom = chromium(tmp_path / "profile", "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count('<rect class="phase"') == 1 and "not drawn" in dom.stdout
    assert not re.search(r"NaN|Infinity", dom.stdout), dom.stdout[-2000:]
    assert "CONSOLE" not in dom.stderr and "Uncaught" not in dom.stderr, dom.stderr[-2000:]
    shot = tmp_path / "report.png"
    r = chromium(tmp_path / "profile", f"--screenshot={shot}", page.as_uri())
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    assert len(_png_pixels(shot.read_bytes())[2]) > 20  # text, a lane and a bar: not a blank page


def test_dtrain_logs_and_diagnose_print_a_jobs_escapes_only_as_colours(tmp_path):
    """A foreground job's output.log (its lines as the launch showed them) with escapes the job
    wrote: `dtrain logs` keeps its colours only, `dtrain diagnose` quotes its lines without any."""
    home = tmp_path / "home"
    d = home / "jobs" / "t-esc"
    d.mkdir(parents=True)
    (d / "job.json").write_text(json.dumps({"name": "t-esc", "state": "failed", "exit_code": 139, "started": T0,
                                            "nodes": [{"host": "127.0.0.1"}]}))
    blas = ("[node-1 r5] [1,5]<stderr>:\x1b]0;pwned\x07BLAS : Program is Terminated. Because you tried to allocate "
            "too many memory regions.\x1b[2J\x9b1;1H")
    (d / "output.log").write_bytes(f"[node-1 r0] \x1b[1;31mred\x1b[0m epoch 1\n{blas}\n".encode()
                                   + b"[node-1 r0] \xff\xfe bytes\r overwritten\n")
    r = _dtrain(home, "logs", "--job", "t-esc", cwd=tmp_path)
    assert r.returncode == 0 and b"\x1b[1;31mred\x1b[0m" in r.stdout, r
    r.stdout = r.stdout.replace(b"\x1b[1;31m", b"").replace(b"\x1b[0m", b"")
    out, _ = _text(r)
    assert out.splitlines() == ["[node-1 r0] red epoch 1",
                                "[node-1 r5] [1,5]<stderr>:BLAS : Program is Terminated. Because you tried to "
                                "allocate too many memory regions.", "[node-1 r0] \ufffd\ufffd bytes", " overwritten"]  # \r: a line's end
    r = _dtrain(home, "diagnose", "t-esc", cwd=tmp_path)
    out, err = _text(r)
    assert r.returncode == 1 and "BLAS : Program is Terminated" in out and "pwned" not in out, (out, err)


def test_a_rank_of_5000_digits_in_a_jobs_line_is_text_everywhere(tmp_path):
    """A rank's number is read back from a job's lines by Render (mpirun's tags, torchrun's
    local ranks), stacks, stragglers, the report and diagnose: 5000 digits are a job's text."""
    from dtrain.launch.analysis import stacks
    from dtrain.launch.analysis import straggler
    from dtrain.launch.jobs.output import MpiOutput, prefix_line

    big = "9" * 5000
    assert stacks.of_dump([f"[n r{big}] stack of pid 1, state T: x", f"[n r0] stack of pid {big}, state T: x"],
                          2).named == ()
    assert straggler.ranks_waiting([f"[n r{big}] stack of pid 1, state S: x"]) == {}
    assert report.steps_of([report.Line(1.0, f"[n r{big}] step")], "") == []
    assert report.restarts_of([report.Line(1.0, f"[launch] restart {big}: x")]) == []
    assert MpiOutput(["a"], "a").feed(f"[1,{big}]<stdout>:x") == [f"[a] [1,{big}]<stdout>:x"]
    assert prefix_line(f"[default{big}]:x", default_node="a", torch_base=0) == f"[a] [default{big}]:x"
    r = Render("torchrun", "n1")
    assert r.feed(f"[n1] [default{big}]:hi") == [f"[n1] [n1] [default{big}]:hi"]  # n1 runs no rank yet
    log = tmp_path / "big.log"
    log.write_text(f"[node-1 r{big}] BLAS : Program is Terminated. Because you tried to allocate too many memory "
                   f"regions.\n[1,{big}]<stderr>:x\n[rank{big}]: y\n")
    r = subprocess.run([sys.executable, "-m", "dtrain", "diagnose", str(log)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "blas-regions" in r.stdout and "Traceback" not in r.stderr, r.stderr


def test_every_event_the_schema_admits_is_shown_without_error():
    """Events of every kind, their fields drawn from values each field's check admits (bounds,
    empty text, escapes, missing optional fields): Render shows each as one line, never raises."""
    import random

    rng = random.Random(47)
    values = [0, 1, 10**6, -1, 0.5, 3.1536e8, 4102444800.0, "", "x", "\x9b", "a" * 300, [], ["n1"], [0, 1], {},
              {"n1": "why"}, {"1": 2.0}, {"1": 3}, True, None, 255, -255,
              [{"rank": 0, "node": "n1", "kind": "stopped", "state": "T"}, {"rank": 2, "kind": "outside", "where": "f"}]]

    def admitted(check) -> list:
        out = []
        for v in values:
            try:
                check(v)
                out.append(v)
            except ValueError:
                pass
        return out

    for _ in range(3000):
        kind = rng.choice(list(events.KINDS))
        ev = {"event": kind}
        for name, (check, default) in events.KINDS[kind].items():
            if (default is events.REQUIRED or rng.random() < 0.7) and admitted(check):
                ev[name] = rng.choice(admitted(check))
        for launcher in ("mpirun", "torchrun"):
            r = Render(launcher, "n1", on_phase=lambda e: None)
            r.feed(EV + json.dumps({"event": "running", "attempt": 0, "nodes": ["n1"], "ranks": ["n1"]}))
            out = r.feed(EV + json.dumps(ev))
            assert len(out) <= 1 and not any(CONTROL.search(x) for x in out), (ev, out)
            assert "warning" not in "".join(out), (ev, out)
            r.flush()
            assert r.exit_code is None or -255 <= r.exit_code <= 255


def test_a_nodes_ip_addr_output_of_other_types_is_left_out():
    from dtrain.launch.jobs import nic

    hostile = json.dumps([5, None, {"ifname": ["x"]}, {"ifname": "eth9", "addr_info": "x"},
                          {"ifname": "eth1", "addr_info": [7, {"family": "inet", "local": {"a": 1}}]},
                          {"ifname": "ens5", "addr_info": [{"family": "inet", "local": "10.0.3.7", "prefixlen": 16}]}])
    assert [link["ifname"] for link in nic.links_of(hostile)] == ["ens5"]
    assert nic.interface_for_address(hostile, "10.0.3.7") == "ens5"
    assert nic.interface_network(hostile, "10.0.3.7") == "10.0.0.0/16"
    assert nic.interface_address(hostile, "ens5") == "10.0.3.7"
    assert nic.interface_address("[" * 100_000, "ens5") == ""
    with pytest.raises(Exception, match="cannot read `ip -j addr` output"):
        nic.interface_for_address('[{"ifname": NaN}]', "10.0.3.7", host="n1")
