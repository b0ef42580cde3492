"""--progress-pattern is bounded (dtrain/patterns.py): patterns that backtrack without bound are
refused where they are given (the flag, the job file's key), and where a pattern is applied (the
supervisor's Progress.feed, `dtrain report`, which may read an old record's pattern) the line is
cut to patterns.MAX_LINE characters and a refused pattern is not run. Timing tests run under an
alarm (Python's re checks signals), so a regression fails instead of hanging."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from dtrain import ROOT, patterns, values
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import jobfile, progress
from dtrain.launch.analysis import report

# Known ReDoS shapes (OWASP's list, CVE write-ups) and their cousins: each takes minutes or more
# on a line of a few thousand characters.
REFUSED = [
    r"(a+)+$", r"(a*)*b", r"(a|aa)+$", r"(.*a){20}", r"(\w+\s?)+$", r"(x+x+)+y", r"(a|a?)+$",
    r"^(\d+)*$", r"(.*){1,32000}[bc]", r"(\s*\S+)*x", r"([a-z]+)*$", r"(a?){30}a{30}",
    r".*a.*a.*a.*b", r"(\w|\d\d)+$", r"(?:a+|b)+$", r"((ab)*)+$", r"\s*\s*\s*$", r"(a+)\1",
    r"^(([a-z])+.)+[A-Z]([a-z])+$", r"^([a-zA-Z0-9])(([\-.]|[_]+)?([a-zA-Z0-9]+))*(@){1}[a-z0-9]+[.]{1}(([a-z]{2,3})|([a-z]{2,3}[.]{1}[a-z]{2,3}))$",
    r"(a{2,5}.{2,5}.){3}[^b]{3}\w{2,5}$", r"\s+[^b]?\s+!", "x" * (patterns.MAX_PATTERN + 1),
    # found by test_random_patterns_that_pass_are_fast's generator before the check knew them
    r"( (a?+(\d*)?)?){0,40}!", r"a+\w{2,5}a??b{3}", r"[ab]([ab]+|.*)(a{3}){3}!", r"(\s*|[ab]{3}(\d)b?)[^b]{0,40}\d!",
    r"[^b]*[ab]{0,40}\s!", r"\s?[ab]+\w{0,40}!",
]
# What people write for a training loop's step line.
ACCEPTED = [
    r"step (\d+)", r"loss=([0-9.]+)", r"Epoch \d+/\d+", r"^step ", r"\bstep\s+\d+", r"it/s", r"(?i)iteration \d+",
    r"^\[rank\d+\] step \d+ loss [0-9.e+-]+$", r"train_loss[:=]\s*\d+(\.\d+)?", r"(\d+\.)+\d+", r"\d+%\|",
    r"global_step=\d+", r"^.*loss.*$", r"step (\d+)/(\d+)", r"^(?:Epoch|Step) \d+", r".*step", r"[0-9]+ it/s",
    r"\d{1,6}/\d{1,6}", r"^step [0-9]+", r"'step': \d+", r"\[\s*\d+/\s*\d+\]", r"(?P<step>\d+) steps?",
    r"iter(ation)? \d+", r"a++$", r"(?>a+)+$",
]
# Lines that make a backtracking pattern work hardest: long runs of one character and a mismatch.
HOSTILE = ["a" * 8000 + "!", "a " * 4000 + "!", "1" * 8000 + "x", "ab" * 4000 + "!", " " * 8000 + "x", "x" * 8000]


class _Slow(Exception):
    pass


@contextlib.contextmanager
def _within(seconds: float):
    """Fails the test (instead of hanging it) when the block runs longer than `seconds`."""
    def ring(*_):
        raise _Slow(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("pattern", REFUSED)
def test_a_pattern_that_backtracks_without_bound_is_refused_in_one_line(pattern):
    why = patterns.backtracking(pattern)
    assert why, pattern
    with pytest.raises(values.BadValue) as e:
        values.regex("--progress-pattern", pattern)
    msg = str(e.value)
    assert msg.startswith("--progress-pattern ") and "\n" not in msg and why in msg and "^step [0-9]+" in msg


@pytest.mark.parametrize("pattern", ACCEPTED)
def test_common_progress_patterns_pass_and_stay_fast_on_hostile_lines(pattern):
    assert patterns.backtracking(pattern) is None, pattern
    assert values.regex("--progress-pattern", pattern) == pattern
    rx = patterns.compile_bounded(pattern)
    with _within(10):  # each is well under a second here: a margin for a loaded machine
        for line in HOSTILE:
            patterns.search(rx, line)


def test_the_refused_ones_really_are_slow():
    """The check is not refusing fast patterns: the first ones take seconds on 30 characters + 1."""
    for pattern, line in ((r"(a+)+$", "a" * 26 + "!"), (r"(a|aa)+$", "a" * 34 + "!"), (r"(\w+\s?)+$", "a" * 26 + "!")):
        t = time.monotonic()
        with contextlib.suppress(_Slow), _within(5):
            re.search(pattern, line)
        assert time.monotonic() - t > 0.2, pattern


def test_a_line_is_searched_on_its_first_max_line_characters():
    rx = patterns.compile_bounded(r"step \d+")
    assert patterns.search(rx, "x" * (patterns.MAX_LINE - 10) + "step 12")
    assert not patterns.search(rx, "x" * patterns.MAX_LINE + "step 12")
    p = progress.Progress(1, started=0.0, pattern=progress.compile_pattern(r"step \d+"))
    assert p.feed(0, "step 1 " + "y" * 10**6, 1.0) and not p.feed(0, "y" * 10**6 + "step 2", 2.0)


def test_the_supervisor_compiles_no_unbounded_pattern():
    with pytest.raises(re.error, match="backtrack"):
        progress.compile_pattern(r"(a+)+$")


def test_the_job_file_key_is_refused_naming_file_and_line(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text("image: r/i:t\ncommand: python t.py\nhang_timeout: 30\nprogress_pattern: '(a+)+$'\n")
    with pytest.raises(LaunchError, match=r"job.yaml:4: progress_pattern: .*nested repetitions") as e:
        jobfile.load(f)
    assert "\n" not in str(e.value)


def test_the_flag_is_refused_before_any_node():
    r = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(ROOT), "launch", "--hosts", "10.255.255.1",
                        "--image", "r/i:t", "--hang-timeout", "10", "--progress-pattern", "(x+x+)+y", "--", "true"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--progress-pattern '(x+x+)+y': nested repetitions" in r.stderr


def _old_record(home, pattern: str) -> None:
    """A job recorded by a dtrain that did not check the pattern, whose ranks wrote hostile lines."""
    d = home / "jobs" / "old"
    d.mkdir(parents=True)
    job = {"name": "old", "image": "r/i:t", "launcher": "torchrun", "command": ["python", "t.py"],
           "nodes": [{"host": "10.213.0.11", "slots": 1}], "progress_pattern": pattern, "started": 1000.0,
           "ended": 1100.0, "state": "failed", "exit_code": 1}
    lines = [f"[node-1 r{i % 2}] " + ("a" * 5000 + "!" if i % 3 else f"step {i}") for i in range(60)]
    (d / "job.json").write_text(json.dumps(job))
    (d / "output.log").write_text("".join(s + "\n" for s in lines))
    (d / "output.times").write_text("".join(f"{1001 + i}.000 1\n" for i in range(len(lines))))


def test_report_of_an_old_record_with_a_hostile_pattern_finishes(tmp_path):
    """(a+)+$ on 5,000 a's and a ! would run for longer than the universe; the report does not run
    it (no steps), and a bounded pattern runs on each line's first MAX_LINE characters."""
    home = tmp_path / "home"
    _old_record(home, r"(a+)+$")
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "dtrain", "report", "--job", "old"], cwd=tmp_path, timeout=120,
                       env={**os.environ, "DTRAIN_HOME": str(home)}, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == "old-report.html\n", r.stderr
    assert time.monotonic() - t < 60
    with _within(20):
        run = report.read(json.loads((home / "jobs/old/job.json").read_text()),
                          (home / "jobs/old/output.log").read_text(), (home / "jobs/old/output.times").read_text())
    assert run.steps == ()
    with _within(20):
        steps = report.steps_of(report.stamp((home / "jobs/old/output.log").read_text(),
                                             (home / "jobs/old/output.times").read_text(), 1000.0), r"step \d+|a{100}")
    assert len(steps) == 60


def _random_pattern(rng, depth: int = 0) -> str:
    atoms = ["a", "b", ".", r"\w", r"\d", r"\s", "[ab]", "[^b]", "a?", " "]
    quantifiers = ["", "", "+", "*", "?", "{2,5}", "{0,40}", "{3}", "?+"]
    out = ""
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.25 and depth < 3:
            inner = _random_pattern(rng, depth + 1)
            if rng.random() < 0.3:
                inner += "|" + _random_pattern(rng, depth + 1)
            out += "(" + inner + ")" + rng.choice(quantifiers)
        else:
            out += rng.choice(atoms) + rng.choice(quantifiers)
    return out + rng.choice(["", "$", "!"])


def test_random_patterns_that_pass_are_fast():
    """Random patterns of the shapes that backtrack (nested, optional, alternated repetitions):
    every one the check lets through searches each hostile line within a few seconds."""
    import random

    rng = random.Random(47)
    passed = 0
    for _ in range(150):
        pattern = _random_pattern(rng)
        try:
            rx = patterns.compile_bounded(pattern)
        except re.error:
            continue
        passed += 1
        with _within(5):
            for line in HOSTILE:
                patterns.search(rx, line)
    assert passed > 40
