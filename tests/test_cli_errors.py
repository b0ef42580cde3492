"""Wrong CLI input: one line naming the flag and what is accepted, exit code 2, no traceback,
nothing started (no job record, no ssh). Runs the real `python3 -m invoke` (issue 11 item 5)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "10.213.0.1:5000/dtrain/pytorch-ddp:2.13.0-cpu-py311-debian12"
# An address nothing listens on: were anything started, the ssh attempt would show in the output.
HOSTS = ("--hosts", "192.0.2.1:1")


def invoke(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DTRAIN_HOME": str(tmp_path / "home")}
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def assert_usage_error(r: subprocess.CompletedProcess, tmp_path: Path, *needles: str) -> None:
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "Traceback" not in out, out
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out
    for n in needles:
        assert n in lines[0], out
    assert not r.stdout.strip(), out  # nothing started, nothing printed
    home = tmp_path / "home"
    assert not home.exists() or not any(home.rglob("*.json")), "a job record was written"


LAUNCH = ("launch", "--image", IMAGE, *HOSTS)
CASES = {
    "slots": (("launch", "--image", IMAGE, "--ec2-tag", "k=v", "--slots", "abc", "--", "true"),
              ("--slots 'abc'", "whole number")),
    "timeout": ((*LAUNCH, "--timeout", "abc", "--", "true"), ("--timeout 'abc'", "number")),
    "timeout-negative": ((*LAUNCH, "--timeout", "-5", "--", "true"), ("--timeout",)),
    "master-port": ((*LAUNCH, "--launcher", "torchrun", "--master-port", "abc", "--", "true"),
                    ("--master-port 'abc'", "1 to 65535")),
    "master-port-range": ((*LAUNCH, "--launcher", "torchrun", "--master-port", "70000", "--", "true"),
                          ("--master-port '70000'", "1 to 65535")),
    "rdzv": ((*LAUNCH, "--launcher", "torchrun", "--rdzv", "bogus", "--", "true"),
             ("--rdzv bogus", "static or c10d")),
    "launcher": ((*LAUNCH, "--launcher", "srun", "--", "true"), ("--launcher srun", "torchrun")),
    "workdir": ((*LAUNCH, "--workdir", "/nonexistent-dtrain-dir", "--", "true"),
                ("--workdir /nonexistent-dtrain-dir", "not a directory")),
    "workdir-limit": ((*LAUNCH, "--workdir", ".", "--workdir-limit", "lots", "--", "true"),
                      ("--workdir-limit 'lots'", "500m")),
    "max-restarts": ((*LAUNCH, "--max-restarts", "-1", "--", "true"), ("--max-restarts '-1'", "whole number")),
    "min-nodes": ((*LAUNCH, "--min-nodes", "0", "--", "true"), ("--min-nodes '0'", "whole number")),
    "min-nodes-above": ((*LAUNCH, "--min-nodes", "3", "--", "true"), ("--min-nodes 3", "1 node(s) given")),
    "checkpoint-dir": ((*LAUNCH, "--checkpoint-dir", "ckpt", "--", "true"), ("--checkpoint-dir ckpt", "absolute")),
    "cluster-nodes": (("cluster", "up", "--nodes", "abc"), ("--nodes 'abc'", "1 to 64")),
    "manifest-workers": (("manifest", "--for", "mpijob", "--image", IMAGE, "--workers", "abc", "--", "true"),
                         ("--workers 'abc'", "whole number")),
    "doctor-min-free": (("doctor", *HOSTS, "--min-free-gb", "abc"), ("--min-free-gb 'abc'", ">= 0")),
    "launch-image-subst": (("launch", "--image", "reg/x:1$(touch /tmp/dtrain-pwned)", *HOSTS, "--", "true"),
                           ("--image", "not a valid image reference", "'$'")),
    "launch-image-dash": (("launch", "--image=-x", *HOSTS, "--", "true"), ("--image '-x'", "starts with '-'")),
    "launch-image-backtick": (("launch", "--image", "reg/x:`id`", *HOSTS, "--", "true"), ("--image", "'`'")),
    "doctor-image": (("doctor", *HOSTS, "--image", "reg/x;id"), ("--image 'reg/x;id'",)),
    "manifest-image": (("manifest", "--for", "mpijob", "--image", "Reg/X Y", "--", "true"), ("--image",)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_flag_is_one_line_exit_2(tmp_path, case):
    args, needles = CASES[case]
    assert_usage_error(invoke(tmp_path, *args), tmp_path, *needles)
    assert not Path("/tmp/dtrain-pwned").exists()


def test_engine_errors_are_user_errors(capsys):
    """A failing host set-up step (here: a program that fails, one that is missing) is an
    EngineError, which the tasks print as one line with exit code 2."""
    import tasks
    from dtrain.launch.infra import engine

    for argv in (["false"], ["/nonexistent/dtrain-apt-get", "install"]):
        with pytest.raises(SystemExit) as exc, tasks.user_errors():
            engine._run(argv, capture_output=True)
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and argv[0] in err[0], err


def test_flag_helpers():
    import tasks
    from dtrain.launch.errors import LaunchError

    assert tasks._int_flag("--n", "3", 1, 5) == 3 and tasks._int_flag("--n", 3, 1) == 3
    for bad in ("0", "6", "1.5", "", " ", "-1", "0x3", True):
        with pytest.raises(LaunchError, match="--n"):
            tasks._int_flag("--n", bad, 1, 5)
    assert tasks._float_flag("--t", "2.5") == 2.5
    assert tasks._float_flag("--g", "0", 0, or_equal=True) == 0
    for bad in ("0", "nan", "inf", "x", "-1"):
        with pytest.raises(LaunchError, match="--t"):
            tasks._float_flag("--t", bad)


def test_doctor_handles_an_image_without_labels():
    from dtrain.launch.troubleshoot.doctor import image_labels

    assert image_labels("null") == {} and image_labels("") == {} and image_labels(None) == {}
    assert image_labels("not json") == {}
    assert image_labels('{"dtrain.kind": "cpu"}') == {"dtrain.kind": "cpu"}
