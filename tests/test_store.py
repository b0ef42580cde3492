"""The job store (launch/jobs/store.py): names, locks, concurrent records, readers that survive
a bad record, stale entries of a launcher killed with -9, and stop that signals only its launcher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import store

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("DTRAIN_HOME", str(tmp_path))
    return tmp_path


def _py(code: str, home: Path, **kw) -> subprocess.Popen:
    """A python process of its own (the worktree on its path, DTRAIN_HOME set)."""
    env = {**os.environ, "DTRAIN_HOME": str(home)}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=ROOT, **kw)


def _wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


BAD_NAMES = ["", ".", "..", "a/b", "../x", "x/..", "/abs", "-x", ".hidden", "a b", "a\nb", "x" * 129, None, 7]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_never_become_paths(home, name):
    """Every path made from a name checks it: `stop` can never resolve to ~/.dtrain/jobs/ or ~/.dtrain."""
    from dtrain.launch.jobs.store import node_job_dir

    for f in (store.check_name, store.job_dir, store.job_log, node_job_dir, store.remove_argv):
        with pytest.raises(LaunchError, match="bad job name"):
            f(name)
    if isinstance(name, str) and name:
        with pytest.raises(LaunchError, match="bad job name"):
            store.record(name, state="x")
        with pytest.raises(LaunchError, match="bad job name"):
            store.stop(name)
    assert not any(home.iterdir()) or list(home.rglob("*")) == [home / "jobs"]


def test_a_record_naming_a_bad_name_is_never_stopped(home):
    """A job.json whose `name` says `..` (corrupt, or written by hand): stop refuses it."""
    d = home / "jobs" / "good"
    d.mkdir(parents=True)
    (d / "job.json").write_text(json.dumps({"name": "..", "nodes": []}))
    with pytest.raises(LaunchError, match="bad job name"):
        store.stop("good")
    assert d.is_dir()


def test_good_names_and_default_names_unique_per_launch():
    for name in ("a", "job-1", "A.b_c-9", "x" * 63):
        assert store.check_name(name) == name
    names = {store.default_name() for _ in range(200)}
    assert len(names) == 200 and all(store.check_name(n) for n in names)
    assert store.default_name("doctor").startswith("doctor-")


def test_concurrent_writers_of_one_record(home):
    """Two processes x 300 merges into one job.json: no error, no lost field, no temporary left."""
    code = """
        import sys
        from dtrain.launch.jobs import store
        who = sys.argv[1]
        for i in range(300):
            store.record("j", **{who: i})
    """
    procs = []
    for who in ("a", "b"):
        env = {**os.environ, "DTRAIN_HOME": str(home)}
        procs.append(subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), who], env=env, cwd=ROOT,
                                      stderr=subprocess.PIPE, text=True))
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    assert json.loads((home / "jobs" / "j" / "job.json").read_text()) == {"a": 299, "b": 299}
    assert sorted(p.name for p in (home / "jobs" / "j").iterdir()) == [".record.lock", "job.json"]


def test_the_launchers_files_are_private(home):
    store.record("j", state="starting")
    with store.open_private(store.job_log("j")) as f:
        f.write("x\n")
    d = home / "jobs" / "j"
    assert oct(d.stat().st_mode & 0o777) == "0o700"
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in d.iterdir()} == {
        "job.json": "0o600", "output.log": "0o600", ".record.lock": "0o600"}


def test_readers_survive_a_partial_or_corrupt_record_of_another_job(home):
    """One bad job.json (cut short, or only `ended` left) breaks neither status nor logs nor stop
    of the other jobs; the bad one is named where it is asked for."""
    store.new_record("good", name="good", state="succeeded", launcher="mpirun", nodes=[], image="img", exit_code=0)
    (home / "jobs" / "good" / "output.log").write_text("ok\n")
    time.sleep(0.02)
    for name, text in (("cut", '{"name": "cut", "sta'), ("partial", '{"ended": 1.0}'), ("list", "[1, 2]")):
        (home / "jobs" / name).mkdir()
        (home / "jobs" / name / "job.json").write_text(text)
    rows = {r[0]: r for r in store.status_rows()[1:]}
    assert rows["good"] == ("good", "succeeded", "mpirun", "0", "img", "0")
    assert rows["cut"][1].startswith("unreadable record") and rows["list"][1].startswith("unreadable record")
    assert rows["partial"][:2] == ("partial", "?")
    assert store.load_job("good")["state"] == "succeeded"
    assert store.load_job("partial")["name"] == "partial"
    with pytest.raises(LaunchError, match="cut/job.json: not a readable job record"):
        store.load_job("cut")
    with pytest.raises(LaunchError, match="output.log: no output kept"):
        store.read_log(store.job_log("partial"))
    assert store.stop("partial") == "partial"  # no nodes recorded: nothing to remove
    assert store.stop_line("partial", None) == "stopped partial"
    assert store.stop_line("good", "running") == "stopped good"
    assert store.stop_line("good", "interrupted") == ("good had already ended (interrupted); no container of it "
                                                      "is left on its nodes")
    env = {**os.environ, "DTRAIN_HOME": str(home)}
    for args in (["status"], ["logs", "--job", "good"], ["logs", "--job", "partial"], ["logs", "--job", "cut"]):
        r = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=120)
        assert "Traceback" not in r.stderr, (args, r.stderr)
        assert (r.returncode == 0) == (args[-1] in ("status", "good")), (args, r.stdout, r.stderr)
    # a job that had ended is not said to be stopped (review of issue 25: "stopped good")
    r = subprocess.run([sys.executable, "-m", "invoke", "stop", "--job", "good"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "good had already ended (succeeded); no container of it is left on its nodes\n", r.stdout


LAUNCHER = """
    import os, sys, tempfile, time
    from dtrain.launch.jobs import store
    name = sys.argv[1]
    store.take_launch_lock(name)
    store.new_record(name, name=name, state="running", nodes=[], **store.launcher_fields())
    tempfile.mkdtemp(prefix="key-", dir=store.job_dir(name))
    open(os.path.join(store.job_dir(name), "ready"), "w").close()
    time.sleep(600)
"""


def _launcher(home: Path, name: str) -> subprocess.Popen:
    env = {**os.environ, "DTRAIN_HOME": str(home)}
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(LAUNCHER), name], env=env, cwd=ROOT)
    _wait_for(home / "jobs" / name / "ready")
    return p


def test_second_launch_of_a_running_name_is_refused_naming_the_holder(home):
    p = _launcher(home, "j")
    try:
        before = (home / "jobs" / "j" / "job.json").read_text()
        with pytest.raises(LaunchError, match=rf"job j is already running: launched by pid {p.pid} on \S+"):
            store.take_launch_lock("j")
        assert (home / "jobs" / "j" / "job.json").read_text() == before
        assert store.status_rows()[1][:2] == ("j", "running")
    finally:
        p.kill()
        p.wait()


def test_a_launcher_killed_with_9_leaves_no_stale_entry(home):
    """The next reader of the store finds it: `launcher gone`, its key directory removed, the
    name free again."""
    p = _launcher(home, "j")
    assert list((home / "jobs" / "j").glob("key-*"))
    p.send_signal(signal.SIGKILL)
    p.wait()
    rows = store.status_rows()
    assert rows[1][:2] == ("j", "launcher gone"), rows
    assert not list((home / "jobs" / "j").glob("key-*"))
    assert store.load_job("j")["state"] == "launcher gone" and store.load_job("j")["ended"]
    store.release_launch_lock(store.take_launch_lock("j"))


def test_stop_never_signals_a_process_that_got_the_launchers_pid(home):
    """The recorded PID now held by an unrelated process (a sleep): stop leaves it alone; the
    launcher itself, where it still runs, is signalled."""
    p = _launcher(home, "j")
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        job = json.loads((home / "jobs" / "j" / "job.json").read_text())
        assert store.launcher_alive(job)
        store.record("j", pid=sleeper.pid)  # the launcher's identity, another process at the PID
        assert store.stop("j") == "j"
        time.sleep(0.3)
        assert sleeper.poll() is None, "the unrelated process was signalled"
        assert p.poll() is None
        store.record("j", pid=p.pid)  # the launcher itself: stopped
        assert store.stop("j") == "j"
        assert p.wait(timeout=30) == -signal.SIGTERM
    finally:
        sleeper.kill()
        sleeper.wait()
        p.kill()
        p.wait()


def test_process_identity_tells_processes_apart():
    import hashlib

    a = subprocess.Popen(["sleep", "30"])
    sleep_30 = hashlib.sha256(b"sleep\x0030\x00").hexdigest()
    try:
        for _ in range(100):  # until the child has exec'd sleep (before, its cmdline is python's)
            ident = store.process_identity(a.pid)
            if ident and ident["cmdline_sha256"] == sleep_30:
                break
            time.sleep(0.02)
        assert ident == {"start": ident["start"], "cmdline_sha256": sleep_30} and ident["start"]
        assert ident != store.process_identity(os.getpid())
    finally:
        a.kill()
        a.wait()
    assert store.process_identity(a.pid) is None


def test_the_record_keeps_no_argument_of_the_launcher(home):
    """job.json identifies the launcher by its start time and a digest of its command line, not
    the line: an `--env NAME=VALUE` on it stays off the disk; status and stop still know it."""
    secret = "s3cret-value-on-argv-4711"
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(LAUNCHER), "j", f"--env=TOKEN={secret}"],
                         env={**os.environ, "DTRAIN_HOME": str(home)}, cwd=ROOT)
    try:
        _wait_for(home / "jobs" / "j" / "ready")
        assert secret in Path(f"/proc/{p.pid}/cmdline").read_bytes().decode()  # it is on the launcher's argv
        for f in (home / "jobs").rglob("*"):
            assert not f.is_file() or secret.encode() not in f.read_bytes(), f
        job = store.load_job("j")
        assert set(job["pid_identity"]) == {"start", "cmdline_sha256"}, job
        assert store.launcher_alive(job) and store.status_rows()[1][:2] == ("j", "running")
        assert store.stop("j") == "j"
        assert p.wait(timeout=30) == -signal.SIGTERM
    finally:
        p.kill()
        p.wait()


def test_a_record_of_an_older_dtrain_still_names_its_launcher(home):
    """A job.json written before the digest (`cmdline` as text) still tells its launcher apart."""
    p = _launcher(home, "j")
    try:
        ident = store.process_identity(p.pid)
        line = Path(f"/proc/{p.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        store.record("j", pid_identity={"start": ident["start"], "cmdline": line})
        assert store.launcher_alive(store.load_job("j"))
        store.record("j", pid_identity={"start": ident["start"], "cmdline": line + " x"})
        assert not store.launcher_alive(store.load_job("j"))
        store.record("j", pid_identity={**ident, "start": "1"})  # same line, another start: another process
        assert not store.launcher_alive(store.load_job("j"))
    finally:
        p.kill()
        p.wait()


def test_stop_without_a_name_stops_the_newest_running_job_not_an_ended_one(home):
    """`dtrain stop` alone: the newest job that has not ended; with only ended jobs, one line
    saying so (it used to pick the newest ended job and try ssh to its nodes)."""
    store.record("old-running", state="detached", nodes=[])
    time.sleep(0.05)
    store.record("new-ended", state="failed", ended=time.time(), nodes=[])
    assert store.latest_running()["name"] == "old-running"
    store.record("old-running", state="stopped", ended=time.time())
    with pytest.raises(LaunchError, match=r"^no running job to stop \(`dtrain status` lists the jobs"):
        store.stop(None)


def test_a_launch_that_fails_to_start_records_the_exit_code_the_cli_returned(home):
    """`dtrain status` shows the exit code `dtrain launch` returned: a launch that stops on its
    own error (here: no node reachable, 127.0.0.1:1) exits 2 with one line, and its record says 2."""
    env = {**os.environ, "DTRAIN_HOME": str(home)}
    p = subprocess.run([sys.executable, "-m", "invoke", "launch", "--hosts", "127.0.0.1:1", "--ssh-opt", "Port=1",
                        "--image", "10.213.0.1:5000/dtrain/x:1", "--name", "nolaunch", "--", "true"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("error: ") and "127.0.0.1" in p.stderr and "Traceback" not in p.stderr
    record = json.loads((home / "jobs" / "nolaunch" / "job.json").read_text())
    assert (record["state"], record["exit_code"]) == ("failed to launch", p.returncode)
