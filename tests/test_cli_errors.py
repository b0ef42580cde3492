"""Wrong CLI input: one line naming the flag and what is accepted, exit code 2, no traceback,
nothing started (no job record, no ssh). Runs the real `python3 -m invoke` (issue 11 item 5)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "10.213.0.1:5000/dtrain/pytorch-ddp:2.13.0-cpu-py311-debian12"
# A loopback port nothing listens on: were anything started, the ssh attempt would show in the output.
HOSTS = ("--hosts", "127.0.0.1:1", "--ssh-opt", "Port=1")


def invoke(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    # AWS: fake credentials and a closed loopback endpoint, so no request leaves the machine
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DTRAIN_HOME": str(tmp_path / "home"),
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_EC2_METADATA_DISABLED": "true", "AWS_MAX_ATTEMPTS": "1",
           "AWS_CONFIG_FILE": str(tmp_path / "aws-config"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "aws-credentials")}
    env.pop("AWS_PROFILE", None)
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
             ("--rdzv 'bogus'", "static or c10d")),
    "launcher": ((*LAUNCH, "--launcher", "srun", "--", "true"), ("--launcher 'srun'", "torchrun")),
    "workdir": ((*LAUNCH, "--workdir", "/nonexistent-dtrain-dir", "--", "true"),
                ("--workdir '/nonexistent-dtrain-dir'", "no such directory")),
    "workdir-dev": ((*LAUNCH, "--workdir", "/dev", "--", "true"), ("--workdir '/dev'", "system directory")),
    "progress-pattern-overflow": ((*LAUNCH, "--hang-timeout", "5", "--progress-pattern", "a{99999999999}", "--",
                                   "true"), ("--progress-pattern 'a{99999999999}'", "not a regular expression")),
    "region-empty": (("launch", "--image", IMAGE, "--ec2-tag", "k=v", "--region=", "--", "true"),
                     ("--region ''", "us-east-1")),
    "nodes-region-empty": (("nodes", "list", "--region="), ("--region ''",)),
    "sagemaker-region-empty": (("sagemaker", "run", "--region=", "--image", IMAGE, "--", "true"), ("--region ''",)),
    "node-selector": (("manifest", "--for", "mpijob", "--image", IMAGE, "--node-selector", "bad key=a value",
                       "--", "true"), ("--node-selector 'bad key'", "Kubernetes label key")),
    "ecs-cluster": (("manifest", "--for", "ecs", "--image", IMAGE, "--launcher", "ray", "--ecs-cluster", "a b;c",
                     "--", "python", "x.py"), ("--ecs-cluster 'a b;c'", "ECS cluster name")),
    "diagnose-long-name": (("diagnose", "x" * 300), ("diagnose", "longer than 255 bytes")),
    "workdir-limit": ((*LAUNCH, "--workdir", ".", "--workdir-limit", "lots", "--", "true"),
                      ("--workdir-limit 'lots'", "500m")),
    "max-restarts": ((*LAUNCH, "--max-restarts", "-1", "--", "true"), ("--max-restarts '-1'", "whole number")),
    "min-nodes": ((*LAUNCH, "--min-nodes", "-1", "--", "true"), ("--min-nodes '-1'", "whole number")),
    "min-nodes-above": ((*LAUNCH, "--min-nodes", "3", "--", "true"), ("--min-nodes 3", "1 node(s) given")),
    "spares": ((*LAUNCH, "--spares", "-1", "--", "true"), ("--spares '-1'", "whole number")),
    "spares-all": ((*LAUNCH, "--spares", "1", "--", "true"), ("--spares 1", "must be fewer than the 1 node(s) given")),
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
    # Flags Invoke used to convert itself (int defaults), with a traceback (issue 22 item 7, issue 23)
    "nodes-count": (("nodes", "up", "--name", "c1", "--count", "two", "--instance-type", "p3.2xlarge"),
                    ("--count 'two'", "whole number")),
    "nodes-timeout": (("nodes", "up", "--name", "c1", "--count", "2", "--timeout", "soon"), ("--timeout 'soon'",)),
    "nodes-name-long": (("nodes", "down", "--name", "n" * 300), ("--name", "300 characters")),
    "nodes-ssh-cidr": (("nodes", "up", "--name", "c1", "--count", "2", "--instance-type", "p3.2xlarge",
                        "--ssh-cidr", "1.2.3.4/40"), ("--ssh-cidr '1.2.3.4/40'", "/32")),
    "sagemaker-instances": (("sagemaker", "run", "--instances", "two", "--image", IMAGE, "--", "true"),
                            ("--instances 'two'",)),
    "sagemaker-instance-type": (("sagemaker", "run", "--instance-type", "p3.2xlarge", "--image", IMAGE,
                                 "--", "true"), ("--instance-type 'p3.2xlarge'", "ml.p3.2xlarge")),
    "sagemaker-image": (("sagemaker", "run", "--image", "bad image", "--", "true"), ("--image 'bad image'",)),
    "volume-iops": (("volume", "create", "--cluster", "c1", "--iops", "many"), ("--iops 'many'",)),
    "bench-max-bytes": (("bench-network", *HOSTS, "--image", IMAGE, "--max-bytes", "1GB"), ("--max-bytes '1GB'",)),
    "slots-5000-digits": ((*LAUNCH, "--slots", "9" * 5000, "--", "true"), ("--slots", "5000 characters")),
    "ssh-user": ((*LAUNCH, "--ssh-user", "-oProxyCommand=id", "--", "true"), ("--ssh-user",)),
    "env-name": ((*LAUNCH, "--env", "1BAD=x", "--", "true"), ("--env '1BAD=x'", "NAME=VALUE")),
    "env-subst": ((*LAUNCH, "--env", "$(id)=x", "--", "true"), ("--env '$(id)=x'",)),
    "shm-size": ((*LAUNCH, "--shm-size", "abc", "--", "true"), ("--shm-size 'abc'", "16g")),
    "manifest-output": (("manifest", "--for", "mpijob", "--image", IMAGE, "--output", "/nonexistent-dtrain/x.yaml",
                         "--", "true"), ("--output", "does not exist")),
    "no-credentials": (("nodes", "list", "--profile", "no-such-dtrain-profile"), ("AWS", "no-such-dtrain-profile")),
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
    from dtrain import engine

    for argv in (["false"], ["/nonexistent/dtrain-apt-get", "install"]):
        with pytest.raises(SystemExit) as exc, tasks.user_errors():
            engine._run(argv, capture_output=True)
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and argv[0] in err[0], err


def test_flag_helpers():
    import tasks
    from dtrain.values import BadValue as LaunchError  # the one parser's error (dtrain/values.py)

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


# ---------------------------------------------------------------- every flag of every task

# Each task's arguments come from Invoke's own metadata (Task.get_arguments), so a new flag is
# fuzzed without being listed here. BASE: arguments that make the task otherwise valid and
# harmless (no ssh can connect: 127.0.0.1:1; AWS goes to a closed loopback port).
BASE = {
    "render": ("--image", "no-such-family"),
    "build": ("--image", "no-such-family"),
    "push": ("--registry", "127.0.0.1:1", "--image", "no-such-family"),
    "launch": ("--image", IMAGE, *HOSTS, "--", "true"),
    "pull": ("--image", IMAGE, *HOSTS),
    "status": (), "logs": (), "stop": (), "report": (),
    "nodes": ("list",),
    "volume": ("create", "--cluster", "c1"),
    "cluster": ("status",),
    "demo": (),
    "doctor": HOSTS,
    "bench-network": ("--image", IMAGE, *HOSTS),
    "diagnose": ("latest",),
    "sagemaker": ("run", "--image", "123456789012.dkr.ecr.us-east-1.amazonaws.com/dtrain/x:1",
                  "--role", "arn:aws:iam::123456789012:role/r", "--", "true"),
    "manifest": ("--for", "mpijob", "--image", IMAGE, "--", "true"),
    "instance-types": (),
    "nodes-ssh": ("--cluster", "c1", "--config"),
    "exec": ("--cluster", "c1", "--", "true"),
}
NOT_FUZZED = {"test": "its only value flag, -k, is a pytest expression passed to pytest as one argv item"}
# Flags whose values are numbers (their defaults, where they have one, are digit strings).
NUMERIC = {"slots", "count", "min_count", "size", "iops", "timeout", "instances", "max_restarts", "min_nodes",
           "slots_per_worker"}
BAD_ANY = ("line\nbreak", "a" * 5000, "tab\there", "\x1b[31m")
BAD_NUMBER = ("two", "-1", "", "9" * 5000, "1e3", "0x10", " ")
BAD_BY_FLAG = {
    "env": ("1BAD=x", "A B=x", "=v", "$(id)=x", "NOEQUALS", "A-B=x"),
    "shm_size": ("abc", "0", "-1g", "1.5g", "16x"),
    "ssh_user": ("-oProxyCommand=x", "a b", "a;b", "u" * 300),
    "name": ("n" * 300, "a b", "-x", "a/b", "$(id)"),
    "job": ("a b", "-x", "../x"),
    "cluster": ("a b", "../x", "c" * 300),
    "image": ("bad image", "-x", "UPPER/CASE", "r.io/x:1$(id)", "r.io/x;id"),
    "ssh_cidr": ("1.2.3.4/99", "abc", "1.2.3", "::1/128"),
    "ssh_config": ("no-such-ssh-config",),
    "master_port": ("0", "70000", "http"),
    "launcher": ("srun", "MPIRUN"),
    "link_rate": ("fast", "1e9bit", "9" * 30 + "gbit"),
    "min_free_gb": ("-1", "nan", "inf", "lots"),
    "for_": ("helm",), "pull": ("sometimes",), "rdzv": ("etcd",), "address": ("both",),
    "workdir_limit": ("lots", "0", "-1m"),
    "iface": ("a b", "i" * 40),
    "region": ("", "us east 1", "us-east-1;id", "../x"),
    "progress_pattern": ("a{99999999999}", "(", "a{2,1}"),
    "node_selector": ("bad key=a value", "k=bad value", "a/b/c=x", "-k=v", "k=" + "v" * 64, "k" * 64 + "=v"),
    "ecs_cluster": ("a b;c", "", "c" * 256, "a/b"),
}
BAD_BY_TASK_FLAG = {
    ("sagemaker", "instance_type"): ("p3.2xlarge", "ml.", "ML P3"),
    ("nodes", "instance_type"): ("p3", "p3 2xlarge", "ml."),
    ("manifest", "output"): ("no-such-dir/x.yaml",),
    ("launch", "workdir"): ("/dev", "/", "/proc", "/sys", "/usr", "/dev/shm", "/nonexistent-dtrain-dir"),
    ("sagemaker", "workdir"): ("/dev", "/", "/proc"),
}
BAD_BY_TASK_FLAG.update({(t, "ssh_key"): ("no-such-key",) for t in ("launch", "pull", "doctor", "bench-network")})
FILE_FLAGS = {"hostfile", "env_file"}  # a binary file instead of text
BINARY = bytes(range(256)) * 4


def _flag(param: str) -> str:
    name = param.rstrip("_").replace("_", "-")
    return ("-" if len(name) == 1 else "--") + name


def _fuzz_cases() -> list[tuple[str, str, str]]:
    from invoke import Collection

    import tasks

    coll = Collection.from_module(tasks)
    assert set(coll.task_names) == set(BASE) | set(NOT_FUZZED), "a task without BASE arguments"
    cases = []
    for task_name in sorted(BASE):
        for arg in coll[task_name].get_arguments():
            # an int default makes Invoke convert the value itself (a traceback for `two`)
            assert arg.kind in (str, list, bool), f"{task_name} {_flag(arg.name)}: default {arg.default!r}"
            if arg.kind is bool or arg.positional:
                continue
            bad = list(BAD_ANY) + list(BAD_BY_FLAG.get(arg.name, ())) + list(
                BAD_BY_TASK_FLAG.get((task_name, arg.name), ()))
            if arg.name in NUMERIC or (isinstance(arg.default, str) and arg.default.isdigit()):
                bad += BAD_NUMBER
            if arg.name in FILE_FLAGS:
                bad.append("@binary")
            cases += [(task_name, arg.name, v) for v in bad]
    return cases


def _argv(task_name: str, param: str, value: str) -> list[str]:
    flag = _flag(param)
    base = list(BASE[task_name])
    cut = base.index("--") if "--" in base else len(base)
    head, tail = base[:cut], base[cut:]
    for other in NODE_SOURCES if flag in NODE_SOURCES else (flag,):  # the flag under test replaces the base's
        if other in head:
            i = head.index(other)
            del head[i:i + 2]
    if task_name == "diagnose" and param == "log":  # the positional LOG
        return [task_name, value]
    return [task_name, *head, f"{flag}={value}", *tail]


NODE_SOURCES = ("--hosts", "--hostfile", "--cluster", "--ec2-tag")


def _run_in_process(argv: list[str]) -> tuple[int, str, str]:
    """The CLI as `invoke` runs it (Invoke's Program over tasks.py), in this process: the
    parsing, conversion and task bodies are the same; sys.argv is set for `--` remainders."""
    import contextlib
    import io

    from invoke import Collection, Program

    import tasks

    out, err = io.StringIO(), io.StringIO()
    old_argv = sys.argv
    sys.argv = ["invoke", *argv]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                program_argv = ["invoke", *argv]  # Invoke's argv in this process: no program is started
                Program(namespace=Collection.from_module(tasks), version="0").run(program_argv)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if isinstance(e.code, str):
                    err.write(e.code + "\n")
            except BaseException:  # noqa: BLE001: a traceback is the failure under test
                import traceback

                err.write("Traceback (in process)\n" + traceback.format_exc())
                code = 99
    finally:
        sys.argv = old_argv
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def nowhere(tmp_path, monkeypatch):
    """DTRAIN_HOME in tmp, the working directory in tmp, AWS with fake credentials pointing at a
    closed loopback port (no traffic leaves the machine), no instance metadata."""
    monkeypatch.setenv("DTRAIN_HOME", str(tmp_path / "home"))
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:1",
                 "AWS_EC2_METADATA_DISABLED": "true", "AWS_MAX_ATTEMPTS": "1",
                 "AWS_CONFIG_FILE": str(tmp_path / "aws-config"),
                 "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "aws-credentials")}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    (work / "binary").write_bytes(BINARY)
    monkeypatch.chdir(work)
    return tmp_path


class Hang(BaseException):
    """A case that ran past CASE_TIMEOUT: reported as a failure of that case (a hang)."""


CASE_TIMEOUT = 10  # seconds; every case ends in well under one


def _refused_cases(root: Path, cases, argv_of, named_by) -> list[str]:
    """Run each case in process under signal.alarm (a blocked open() of a FIFO is interrupted,
    the case fails as a hang): exit 2, one line on stderr starting `error: ` naming the flag or
    the file, nothing on stdout, no traceback, nothing under DTRAIN_HOME or in the working
    directory but the fixtures. The failures, one text each."""
    import signal

    def hang(signum, frame):
        raise Hang(f"no answer within {CASE_TIMEOUT} s")

    fixtures = {p.name for p in (root / "work").iterdir()}
    old = signal.signal(signal.SIGALRM, hang)
    failures = []
    try:
        for case in cases:
            argv = argv_of(case)
            signal.alarm(CASE_TIMEOUT)
            try:
                code, out, err = _run_in_process(argv)
            finally:
                signal.alarm(0)
            lines = err.strip().splitlines()
            home = root / "home"
            left = [str(p.relative_to(root)) for p in home.rglob("*")] if home.exists() else []
            left += [p.name for p in (root / "work").iterdir() if p.name not in fixtures]
            if (code != 2 or len(lines) != 1 or not lines[0].startswith("error: ") or not named_by(case, err)
                    or out.strip() or "Traceback" in err or left):
                hung = f"HANG (no answer within {CASE_TIMEOUT} s): " if "Hang: no answer" in err else ""
                failures.append(f"{hung}{' '.join(repr(a) if ' ' in a or not a else a for a in argv)[:200]}\n"
                                f"    -> exit {code}, stdout {out[:200]!r}, stderr {err[:300]!r}, left {left}")
                shutil.rmtree(home, ignore_errors=True)
                for name in left:
                    p = root / "work" / name
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    finally:
        signal.signal(signal.SIGALRM, old)
    return failures


def test_every_flag_of_every_task_refuses_bad_values(nowhere):
    """Every non-boolean flag of every task, bad values: exit 2, one line on stderr naming the
    flag (or the file), nothing on stdout, no traceback, nothing under DTRAIN_HOME or here."""
    cases = _fuzz_cases()
    assert len(cases) > 300

    def named(case, err):
        _, param, value = case
        if param == "password" and value and value in err:  # a secret is never printed
            return False
        return _flag(param) in err or (value == "@binary" and "binary" in err)

    failures = _refused_cases(nowhere, cases, lambda case: _argv(
        case[0], case[1], str(nowhere / "work" / "binary") if case[2] == "@binary" else case[2]), named)
    assert not failures, f"{len(failures)} of {len(cases)} cases:\n" + "\n".join(failures)


# ---------------------------------------------------------------- every file-taking flag

# What each kind of file is, made in the working directory (or a path of the machine's).
# /proc/kmsg: a "regular" file (stat says so) whose read blocks for ever (as root); "huge": a
# sparse 10 GiB file.
FILE_KINDS = ("fifo", "/dev/zero", "/dev/null", "directory", "binary", "digits", "nested", "long-name", "empty",
              "/proc/kmsg", "huge")
CONTENT_KINDS = ("binary", "digits", "nested", "empty", "huge")  # only where dtrain reads what the file holds
# The local path kinds (tasks.LOCAL_PATHS) whose content dtrain reads; the others are handed on
# (a directory sent, an output written)
READ_KINDS = ("file", "ssh-key", "ssh-config", "json", "pem", "ini")
# where an empty file is refused (an empty job file, env file, ssh config or pip.conf is valid)
EMPTY_REFUSED = ("ssh-key", "json", "pem", "hostfile")
# A flag's help or name that speaks of a local file or directory
PATHLIKE_HELP = re.compile(r"\bfiles?\b|director|\bpath\b|\bDIR\b|socket|pip\.conf|bundle")
PATHLIKE_NAME = re.compile(r"(?:^|_)(?:file|dir|path|key|config|conf|bundle|socket|policy|catalog|root|bin)$|^f$")


def _file_fixtures(work: Path) -> None:
    os.mkfifo(work / "fifo")
    (work / "directory").mkdir()
    (work / "binary").write_bytes(BINARY)
    (work / "digits").write_text("9" * 5000 + "\n" + "slots: " + "9" * 5000 + "\n")
    (work / "nested").write_text("image: " + "[" * 20000 + "]" * 20000 + "\n")
    (work / "empty").write_text("")
    with open(work / "huge", "wb") as f:
        f.truncate(10 << 30)


def _file_flag_cases() -> list[tuple[str, str, str]]:
    """(task, param, kind) for every file-taking flag of every task (tasks.LOCAL_PATHS, checked
    against the flags' names and help so that a new file flag cannot be left out), and
    diagnose's LOG."""
    from invoke import Collection

    import tasks

    coll = Collection.from_module(tasks)
    cases, unlisted, used = [], [], set()
    for task_name in sorted(BASE):
        for arg in coll[task_name].get_arguments():
            if arg.kind is bool:
                continue
            key = (task_name, arg.name)
            listed = None if key in tasks.NOT_LOCAL_PATHS else tasks.LOCAL_PATHS.get(key) or \
                tasks.LOCAL_PATHS.get(arg.name)
            if not listed and key not in tasks.NOT_LOCAL_PATHS and arg.name not in tasks.NOT_LOCAL_PATHS and (
                    PATHLIKE_HELP.search(arg.help or "") or PATHLIKE_NAME.search(arg.name)):
                unlisted.append(f"{task_name} {_flag(arg.name)}: {arg.help}")
            if not listed:
                continue
            used.add(key if key in tasks.LOCAL_PATHS else arg.name)
            want = "json" if arg.name == "catalog" else listed[0]  # a catalog is read, then written
            kinds = [k for k in FILE_KINDS if k not in CONTENT_KINDS]
            if want in READ_KINDS:
                kinds += [k for k in CONTENT_KINDS if k != "empty" or want in EMPTY_REFUSED
                          or arg.name in EMPTY_REFUSED]
            elif want in ("dir", "dirs", "new-dir", "project", "socket", "channel"):  # a regular file: not these
                kinds = [k for k in kinds if k != "directory" or want == "socket"] + ["binary"]
            cases += [(task_name, arg.name, k) for k in kinds]
    assert not unlisted, "flags that name a file: add them to tasks.LOCAL_PATHS (or NOT_LOCAL_PATHS):\n" + \
        "\n".join(unlisted)
    assert used == set(tasks.LOCAL_PATHS), f"LOCAL_PATHS names no flag: {set(tasks.LOCAL_PATHS) - used}"
    cases += [("diagnose", "log", k) for k in FILE_KINDS if k not in ("binary", "digits", "nested", "empty", "huge")]
    return cases


def _kind_path(work: Path, kind: str) -> str:
    if kind.startswith("/"):
        return kind
    if kind == "long-name":
        return str(work / ("n" * 300))
    return str(work / kind)


def test_every_file_flag_refuses_what_is_not_its_kind_of_file(nowhere):
    """Every file-taking flag of every task given a FIFO, /dev/zero, /dev/null, a directory
    (a file where a directory is wanted), a binary file, 5,000-digit numbers, 20,000-deep
    nesting, an empty file and a 300-byte name: each one line naming the flag or the file, exit
    2, nothing created, no traceback, and no hang (each case under signal.alarm)."""
    work = nowhere / "work"
    _file_fixtures(work)
    cases = _file_flag_cases()
    assert len(cases) > 150

    def named(case, err):
        _, param, kind = case
        path = _kind_path(work, kind)
        return (_flag(param) in err or (param == "log" and "diagnose" in err)) or Path(path).name[:30] in err

    def argv(case):
        task_name, param, kind = case
        channel = (task_name, param) == ("sagemaker", "input")  # NAME=DIR
        return _argv(task_name, param, ("data=" if channel else "") + _kind_path(work, kind))

    failures = _refused_cases(nowhere, cases, argv, named)
    assert not failures, f"{len(failures)} of {len(cases)} cases:\n" + "\n".join(failures)


def test_values_parsers():
    """dtrain/values.py: one parser per kind of value, used by tasks.py, launch/ and images/."""
    from dtrain import values

    assert values.count("--n", "12", 1, 20) == 12
    assert values.number("--t", "1.5") == 1.5 and values.number("--t", "900") == 900
    assert values.size("--s", "16g") == 16 << 30 and values.size("--s", "500MiB") == 500 << 20
    assert values.docker_size("--shm-size", "16G") == "16g" and values.docker_size("--shm-size", "1024") == "1024b"
    assert values.env_pair("--env", "A_1=x=y") == ("A_1", "x=y") and values.env_pair("--env", "_=") == ("_", "")
    assert values.cidr("--ssh-cidr", "1.2.3.4") == "1.2.3.4/32" and values.cidr("--c", "10.0.0.0/8") == "10.0.0.0/8"
    assert values.instance_type("--t", "ml.p3.2xlarge", sagemaker=True) == "ml.p3.2xlarge"
    assert values.instance_type("--t", "u-6tb1.metal") == "u-6tb1.metal"
    assert values.name("--name", "job-1.a_b") == "job-1.a_b" and values.user("--u", "ubuntu") == "ubuntu"
    assert values.image("--image", "UPPER.io/case:1") == "UPPER.io/case:1"  # a host may have capitals
    with pytest.raises(values.BadValue, match="lowercase"):  # a first part without '.', ':PORT' or localhost is a path
        values.image("--image", "UPPER/case:1")
    bad = [(values.count, ("--n", "1.5", 0)), (values.count, ("--n", "9" * 30, 0)), (values.count, ("--n", "-1", 0)),
           (values.number, ("--t", "1e3")), (values.number, ("--t", "nan")), (values.size, ("--s", "0")),
           (values.size, ("--s", "abc")), (values.env_pair, ("--env", "1BAD=x")), (values.env_pair, ("--env", "A B=x")),
           (values.env_pair, ("--env", "=v")), (values.env_pair, ("--env", "$(id)=x")),
           (values.cidr, ("--c", "1.2.3.4/40")), (values.cidr, ("--c", "::1")),
           (values.instance_type, ("--t", "p3.2xlarge")), (values.name, ("--name", "n" * 64)),
           (values.user, ("--u", "-oProxyCommand=x")), (values.text, ("--x", "a\nb")), (values.text, ("--x", "a" * 5000))]
    for fn, args in bad:
        kwargs = {"sagemaker": True} if fn is values.instance_type else {}
        with pytest.raises(values.BadValue, match=re.escape(args[0])):
            fn(*args, **kwargs)


def test_file_and_region_parsers(tmp_path):
    """dtrain/values.py's file checks: each kind of path wanted, what each kind of file is."""
    from dtrain import values

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "key").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nx\n-----END OPENSSH PRIVATE KEY-----\n")
    (tmp_path / "key.pub").write_text("ssh-ed25519 AAAA x\n")
    (tmp_path / "cfg").write_text("# c\nHost node-*\n  User root\n  Port=22\n\n")
    (tmp_path / "pip.conf").write_text("[global]\nindex-url = http://127.0.0.1:1/simple\n")
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n")
    (tmp_path / "p.json").write_text('{"rules": []}')
    assert values.region("--region", "us-gov-west-1") == "us-gov-west-1"
    assert values.local_path("--d", str(tmp_path), "project") == tmp_path
    assert values.local_path("--o", str(tmp_path / "new.yaml"), "new-file") == tmp_path / "new.yaml"
    assert values.local_path("--o", str(tmp_path / "a" / "b"), "new-dir") == tmp_path / "a" / "b"
    assert values.ssh_key("--k", str(tmp_path / "key")) and values.ssh_config("--c", str(tmp_path / "cfg"))
    assert values.ini_file("--p", str(tmp_path / "pip.conf")) and values.pem_file("--c", str(tmp_path / "ca.pem"))
    assert values.json_file("--l", str(tmp_path / "p.json"), "a policy") == {"rules": []}
    bad = [(values.region, ("--region", "")), (values.region, ("--region", "us east 1")),
           (values.local_path, ("--f", str(tmp_path / "fifo"), "file"), "a named pipe (FIFO)"),
           (values.local_path, ("--f", "/dev/null", "file"), "a character device"),
           (values.local_path, ("--f", str(tmp_path), "file"), "a directory, not a regular file"),
           (values.local_path, ("--d", str(tmp_path / "key"), "dir"), "a regular file, not a directory"),
           (values.local_path, ("--f", "x" * 300, "file"), "longer than 255 bytes"),
           (values.local_path, ("--o", str(tmp_path / "no" / "x"), "new-file"), "does not exist"),
           (values.local_path, ("--w", "/proc/self", "project"), "system directory"),
           (values.local_path, ("--s", str(tmp_path / "key"), "socket"), "not a socket"),
           (values.ssh_key, ("--k", str(tmp_path / "key.pub")), "a public key"),
           (values.ssh_key, ("--k", str(tmp_path / "cfg")), "not an ssh private key"),
           (values.ssh_config, ("--c", str(tmp_path / "key.pub")), None),
           (values.ini_file, ("--p", str(tmp_path / "cfg")), "not a pip.conf"),
           (values.pem_file, ("--c", str(tmp_path / "key")), "CERTIFICATE"),
           (values.json_file, ("--l", str(tmp_path / "cfg"), "a policy"), "not valid JSON")]
    for fn, args, *says in bad:
        with pytest.raises(values.BadValue, match=re.escape(args[0])) as e:
            fn(*args)
        assert not says or says[0] is None or says[0] in str(e.value), str(e.value)
        assert "\n" not in str(e.value)


def test_env_names_are_one_rule():
    """--env, --env-file, SageMaker's env and the container env accept the same names."""
    from dtrain import values
    from dtrain.launch.errors import LaunchError
    from dtrain.launch.jobs import container
    from dtrain.launch.sagemaker import engine as sm

    for name in ("1BAD", "A B", "", "$(id)", "A-B", "É"):
        assert not values.env_name(name)
        assert not container._ENV_NAME_RE.match(name)
        with pytest.raises(LaunchError):
            sm.env_pairs([f"{name}=x"])
    for name in ("A", "_x", "NCCL_DEBUG"):
        assert values.env_name(name) and container._ENV_NAME_RE.match(name) and sm.env_pairs([f"{name}=1"])


def test_binary_hostfile_and_env_file_are_one_line_errors(tmp_path):
    from dtrain.launch.errors import LaunchError
    from dtrain.launch.jobs.container import parse_env_file
    from dtrain.launch.remote.hosts import parse_hostfile

    f = tmp_path / "bin"
    f.write_bytes(bytes(range(256)))
    for parse in (parse_env_file, parse_hostfile):
        with pytest.raises(LaunchError, match="not UTF-8"):
            parse(f)


@pytest.mark.parametrize("task", ["launch", "manifest"])
def test_help_into_a_pipe_closed_early_ends_quietly(tmp_path, task):
    """`dtrain launch --help | head`: the real `dtrain`, its stdout a pipe whose reader has gone
    (head exited): no BrokenPipeError traceback, exit 141 as a shell's SIGPIPE."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before dtrain writes: its first write breaks the pipe
    try:
        r = subprocess.run([sys.executable, "-m", "dtrain", task, "--help"], cwd=tmp_path, stdout=write,
                           stderr=subprocess.PIPE, text=True, timeout=60,
                           env={**os.environ, "DTRAIN_HOME": str(tmp_path / "home")})
    finally:
        os.close(write)
    assert (r.returncode, r.stderr) == (141, ""), r.stderr


def test_diagnose_reads_only_the_tail(tmp_path):
    """`invoke diagnose /dev/zero` ends; a large log is read from its last TAIL_BYTES."""
    from dtrain.launch.troubleshoot import diagnose as dg

    assert len(dg.read_tail(Path("/dev/zero"), 1 << 20)) == 1 << 20
    log = tmp_path / "big.log"
    log.write_bytes(b"x" * (3 << 20) + b"END")
    tail = dg.read_tail(log, 1 << 20)
    assert len(tail) == 1 << 20 and tail.endswith(b"END")
    r = invoke(tmp_path, "diagnose", "/dev/zero")  # a device is not a log: refused before it is opened
    assert_usage_error(r, tmp_path, "/dev/zero", "a character device")


@pytest.mark.parametrize("case", ["hostfile-slots", "hostfile-port", "hostfile-host", "jobfile-deep",
                                  "jobfile-digits", "diagnose-fifo", "manifest-fifo", "ssh-key-empty",
                                  "ssh-key-binary", "ssh-key-fifo"])
def test_issue_38_reproductions(tmp_path, case):
    """Each input of issue 38's "Tracebacks and hangs", as a user gives it (the real CLI in a
    process of its own, under a timeout): one line naming it, exit 2, nothing created."""
    hf = tmp_path / "hf"
    line = {"hostfile-slots": "127.0.0.1 slots=" + "9" * 5000, "hostfile-port": "127.0.0.1 port=" + "9" * 5000,
            "hostfile-host": "h" * 300 + " slots=1"}.get(case, "127.0.0.1")
    hf.write_text(line + "\n")
    job = tmp_path / "d.yaml"
    job.write_text("image: " + "[" * 20000 + "]" * 20000 + "\n" if case == "jobfile-deep" else
                   "image: x\nslots: " + "9" * 5000 + "\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    key = tmp_path / "key"
    key.write_bytes(b"" if case == "ssh-key-empty" else BINARY)
    args, needles = {
        "hostfile-slots": (("launch", "--image", IMAGE, "--hostfile", str(hf), "--", "true"), ("slots must be",)),
        "hostfile-port": (("launch", "--image", IMAGE, "--hostfile", str(hf), "--", "true"), ("port must be",)),
        "hostfile-host": (("launch", "--image", IMAGE, "--hostfile", str(hf), "--", "true"), ("at most 253",)),
        "jobfile-deep": (("launch", "-f", str(job), "--dump"), ("d.yaml", "nested too deep")),
        "jobfile-digits": (("launch", "-f", str(job), "--dump"), ("d.yaml", "more than 4300 digits")),
        "diagnose-fifo": (("diagnose", str(fifo)), ("fifo", "named pipe")),
        "manifest-fifo": (("manifest", "--for", "mpijob", "--image", IMAGE, "--output", str(fifo), "--", "true"),
                          ("--output", "named pipe")),
        "ssh-key-empty": ((*LAUNCH, "--ssh-key", str(key), "--", "true"), ("--ssh-key", "an empty file")),
        "ssh-key-binary": ((*LAUNCH, "--ssh-key", str(key), "--", "true"), ("--ssh-key", "not UTF-8")),
        "ssh-key-fifo": ((*LAUNCH, "--ssh-key", str(fifo), "--", "true"), ("--ssh-key", "named pipe")),
    }[case]
    assert_usage_error(invoke(tmp_path, *args), tmp_path, *needles)


# ---------------------------------------------------------------- records: damaged cluster.json

def _cluster_record() -> dict:
    """cluster.json as `nodes up --name c1` writes it (launch/infra/ec2.py save_cluster)."""
    import json

    from dtrain.launch.infra import ec2

    inst = ec2.Instance("i-0123", "127.0.0.1", None, "us-east-1a", "g5.12xlarge")
    return json.loads(ec2.Cluster("c1", "us-east-1", "dtrain-c1", "g5.12xlarge", True, 4, "root", None, (inst,),
                                  ssh_opts=("-o", "Port=1")).to_json())


def _damaged_records() -> dict[str, str | bytes]:
    """Damaged forms of cluster.json (issue 47: each was a traceback): file contents by name."""
    import json

    good = _cluster_record()
    text = json.dumps(good)
    forms: dict[str, str | bytes] = {
        "empty": "", "blank": " \n", "list": "[]", "null": "null", "number": "4", "string": '"c1"', "object": "{}",
        "truncated": text[: len(text) // 2], "garbage-after": text + "}", "not-json": "name: c1\n",
        "binary": BINARY, "bom": "\ufeff" + text, "nul": text.replace(":", ":\x00", 1),
        "slots-5000-digits": text.replace('"slots": 4', '"slots": ' + "9" * 5000),
        "slots-1e400": text.replace('"slots": 4', '"slots": 1e400'),
        "slots-zero": text.replace('"slots": 4', '"slots": 0'),
        "slots-huge": text.replace('"slots": 4', '"slots": 99999999999999999999'),
        "deep-list": "[" * 20000 + "]" * 20000, "deep-object": '{"a":' * 20000 + "1" + "}" * 20000,
        "instances-empty": json.dumps({**good, "instances": []}),
        "instances-object": json.dumps({**good, "instances": {"i": good["instances"][0]}}),
        "instances-nested": json.dumps({**good, "instances": [[good["instances"][0]]]}),
        "instance-ip": json.dumps({**good, "instances": [{**good["instances"][0], "private_ip": "x;id"}]}),
        "instance-missing-key": json.dumps({**good, "instances": [{"id": "i-1"}]}),
        "name-other": json.dumps({**good, "name": "c2"}),
        "user-newline": json.dumps({**good, "user": "root\nx"}),
        "ssh-opts-string": json.dumps({**good, "ssh_opts": "-oProxyCommand=id"}),
        "ssh-opts-number": json.dumps({**good, "ssh_opts": [1]}),
    }
    wrong = {"name": 1, "region": ["us-east-1"], "stack": None, "instance_type": 5, "nitro": "true", "slots": "4",
             "user": {"u": 1}, "identity": 1, "instances": "127.0.0.1", "security_group": [],
             "file_system": 0, "ssh_opts": {"-o": "x"}}
    for key, value in wrong.items():
        forms[f"{key}-wrong-type"] = json.dumps({**good, key: value})
    for key in ("name", "region", "stack", "instance_type", "nitro", "slots", "user", "identity", "instances"):
        forms[f"{key}-missing"] = json.dumps({k: v for k, v in good.items() if k != key})
    return forms


RECORD_COMMANDS = {  # every command that reads cluster.json (--cluster c1)
    "launch": ("launch", "--image", IMAGE, "--cluster", "c1", "--", "true"),
    "doctor": ("doctor", "--cluster", "c1"),
    "volume": ("volume", "create", "--cluster", "c1", "--size", "10"),
    "pull": ("pull", "--image", IMAGE, "--cluster", "c1"),
    "bench-network": ("bench-network", "--image", IMAGE, "--cluster", "c1"),
    "exec": ("exec", "--cluster", "c1", "--", "true"),
    "nodes ssh-config": ("nodes-ssh", "--config", "--cluster", "c1"),  # `nodes ssh-config c1` (dtrain/cli.py)
}


def test_every_command_that_reads_cluster_json_says_what_is_damaged(nowhere):
    """Each damaged form of cluster.json (and a FIFO, a directory, a file past the size limit in
    its place) through every command that reads it: exit 2, one line naming the file and what
    to do, nothing on stdout, no traceback, no hang, no job started."""
    import json
    import signal

    from dtrain.launch.infra import ec2

    d = nowhere / "home" / "clusters" / "c1"
    d.mkdir(parents=True)
    (d / "hostfile").write_text("127.0.0.1 slots=1 user=root\n")
    record = d / "cluster.json"
    record.write_text(json.dumps(_cluster_record()))
    assert ec2.load_cluster("c1").instances[0].private_ip == "127.0.0.1"  # the undamaged record is read
    forms = _damaged_records()
    assert len(forms) >= 40
    forms.update({"fifo": "@fifo", "directory": "@dir", "huge": "@huge"})

    def hang(signum, frame):
        raise Hang(f"no answer within {CASE_TIMEOUT} s")

    failures = []
    old = signal.signal(signal.SIGALRM, hang)
    try:
        for form, content in sorted(forms.items()):
            if record.is_dir():
                record.rmdir()
            else:
                record.unlink(missing_ok=True)
            if content == "@fifo":
                os.mkfifo(record)
            elif content == "@dir":
                record.mkdir()
            elif content == "@huge":
                with open(record, "wb") as f:
                    f.truncate(17 << 20)
            else:
                record.write_bytes(content if isinstance(content, bytes) else content.encode())
            for cmd, argv in RECORD_COMMANDS.items():
                signal.alarm(CASE_TIMEOUT)
                try:
                    code, out, err = _run_in_process(list(argv))
                finally:
                    signal.alarm(0)
                lines = err.strip().splitlines()
                jobs = nowhere / "home" / "jobs"
                if (code != 2 or len(lines) != 1 or not lines[0].startswith(f"error: {record}: ")
                        or "dtrain nodes" not in lines[0] or out.strip() or "Traceback" in err
                        or (jobs.exists() and any(jobs.iterdir()))):
                    failures.append(f"{form} via {cmd}: exit {code}, stdout {out[:200]!r}, stderr {err[:300]!r}")
    finally:
        signal.signal(signal.SIGALRM, old)
    assert not failures, f"{len(failures)} of {len(forms) * len(RECORD_COMMANDS)} cases:\n" + "\n".join(failures)


# ---------------------------------------------------------------- records a node or a job wrote (issue 47)

# job.json forms that no reader can take: the commands that read one job's record say so in one
# line naming the file (what of it), exit 2, no traceback, no terminal control printed.
HOSTILE_RECORDS = {
    "list": "[]", "null": "null", "string": '"running"', "number": "1e400", "nan": '{"started": NaN}',
    "infinity": '{"ended": Infinity}', "deep": "[" * 100_000 + "]" * 100_000, "digits": '{"pid": ' + "9" * 5000 + "}",
    "binary": "\udcff", "nodes-dict": '{"nodes": {"host": "a"}}', "state-list": '{"state": ["failed"]}',
    "final-string": '{"final": "failed"}', "final-reason": '{"final": {"reason": ["x"]}}',
    "quarantined-list": '{"quarantined": ["n2"]}', "stragglers-nested": '{"stragglers": {"n2": {"r": 1}}}',
    "huge-started": '{"started": 1e400}', "pid-string": '{"pid": "12"}', "ranks-null": '{"ranks": [null]}',
    "exit-huge": '{"exit_code": ' + "1" + "0" * 400 + "}", "ssh-opts": '{"ssh_opts": "-oProxyCommand=x"}',
    "escape-name": '{"name": "\\u001b]0;pwned\\u0007", "state": 5}',
    "long-state": '{"state": "' + "x" * 100_000 + '"}',
}
JOB_RECORD_COMMANDS = (("status", "--job"), ("logs", "--job"), ("stop", "--job"), ("report", "--job"))


def test_every_reader_of_a_record_refuses_a_hostile_one_in_one_line(nowhere):
    control = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
    failures = []
    for form, text in HOSTILE_RECORDS.items():
        d = nowhere / "home" / "jobs" / f"t-{form}"
        d.mkdir(parents=True)
        (d / "job.json").write_bytes(text.encode(errors="surrogateescape"))
        for command, flag in JOB_RECORD_COMMANDS:
            code, out, err = _run_in_process([command, flag, f"t-{form}"])
            lines = err.strip().splitlines()
            if (code != 2 or len(lines) != 1 or not lines[0].startswith(f"error: {d / 'job.json'}: not a readable")
                    or out.strip() or "Traceback" in err or control.search(out + err)):
                failures.append(f"{form}: {command} -> exit {code}, stdout {out[:200]!r}, stderr {err[:300]!r}")
    assert not failures, f"{len(failures)} cases:\n" + "\n".join(failures)
    assert not list(nowhere.glob("work/*-report.html"))
