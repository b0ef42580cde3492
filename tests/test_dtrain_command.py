"""The `dtrain` command (issue 23): the tasks of tasks.py from any directory, where the current
directory is the user's. Runs the real program from a temporary directory that is not the
checkout; AWS calls go to a moto server on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from invoke import Collection

ROOT = Path(__file__).resolve().parent.parent
ROLE = "arn:aws:iam::123456789012:role/sm"


def dtrain(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dtrain", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def task_names() -> set[str]:
    sys.path.insert(0, str(ROOT))
    try:
        import tasks
    finally:
        sys.path.remove(str(ROOT))
    return set(Collection.from_module(tasks).task_names)


def test_every_task_is_there_from_another_directory(tmp_path):
    r = dtrain(tmp_path, "--list")
    assert r.returncode == 0, r.stderr
    listed = {line.split()[0] for line in r.stdout.splitlines()[1:] if line.startswith("  ") and line.split()}
    assert task_names() <= listed, task_names() - listed
    r = dtrain(tmp_path, "--help", "launch")
    assert r.returncode == 0 and "Usage: dtrain [--core-opts] launch" in r.stdout and "--image" in r.stdout


def test_the_installed_console_script_runs_from_another_directory(tmp_path):
    """pip install -e '.[dev]' (the README's line) puts `dtrain` beside the interpreter."""
    script = Path(sys.executable).parent / "dtrain"
    assert script.is_file(), f"{script}: no dtrain command; install with pip install -e '.[dev]'"
    r = subprocess.run([str(script), "--help", "render"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "Usage: dtrain [--core-opts] render" in r.stdout, r.stderr
    r = subprocess.run([str(script), "nosuchtask"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "nosuchtask" in r.stderr and "Traceback" not in r.stderr


def test_sagemaker_run_uploads_the_users_directory(tmp_path, moto_server):
    """From the user's project directory, the code channel is that directory, not dtrain's tree."""
    import boto3

    env = {"AWS_ENDPOINT_URL": moto_server, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
           "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    s3 = boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    s3.create_bucket(Bucket="proj-bucket")
    project = tmp_path / "my-project"
    project.mkdir()
    (project / "train.py").write_text("print('hello from my project')\n")
    (project / "requirements.txt").write_text("six\n")
    r = dtrain(project, "sagemaker", "run", "--instances", "2", "--image",
               "123456789012.dkr.ecr.us-east-1.amazonaws.com/dtrain/pytorch-ddp:2.13.0-cpu-py311-debian12",
               "--role", ROLE, "--output", "s3://proj-bucket/runs", "--name", "dtrain-userdir", "--no-wait",
               "--", "python", "train.py", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "dtrain-userdir" in r.stdout
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="proj-bucket", Prefix="runs/dtrain-userdir/code/")["Contents"]}
    assert keys == {"runs/dtrain-userdir/code/train.py", "runs/dtrain-userdir/code/requirements.txt"}, keys


def test_a_command_line_dtrain_cannot_parse_is_one_line_and_exit_2(tmp_path):
    """Each names what is wrong: the unknown flag with the task's closest one, a job command
    missing its `--`, a flag without its value (review of issue 25: Invoke's "No idea what
    'python' is!" did not say that the `--` was missing)."""
    image = "10.213.0.1:5000/dtrain/horovod-tensorflow:2.15.1-hvd0.28.1-cpu-py311-debian12"
    for args, what in [
        (("launch", "--hostfle", "hosts", "--image", image, "--", "python", "train.py"),
         "error: dtrain launch: no flag --hostfle; did you mean --hostfile? (dtrain --help launch)"),
        (("launch", "--max-restart=2", "--", "true"), "no flag --max-restart; did you mean --max-restarts?"),
        (("launch", "--nosuch"), "error: dtrain launch: no flag --nosuch (dtrain --help launch)"),
        # a word more is another flag, not a typo: --max-wait (SageMaker's spot wait) is not --wait
        (("sagemaker", "run", "--max-wait", "3600", "--", "true"),
         "error: dtrain sagemaker: no flag --max-wait (dtrain --help sagemaker)"),
        (("launch", "--hostfile", "hosts", "--image", image, "python", "train.py"),
         "error: dtrain launch: 'python' is not a flag or a task; the job's command goes after `--`: "
         "dtrain launch ... -- python train.py"),
        (("manifest", "--for", "mpijob", "python"), "the job's command goes after `--`"),
        (("status", "foo"), "error: dtrain status: 'foo' is not a flag of status or a task"),
        (("nosuchtask",), "error: no task 'nosuchtask' (dtrain --list"),
        (("nodes", "up", "--count"), "error: dtrain nodes: --count needs a value (dtrain --help nodes)"),
        (("launch", "-f"), "error: dtrain launch: -f needs a value"),
    ]:
        r = dtrain(tmp_path, *args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, (args, r.stderr)
        assert r.stderr.startswith("error: ") and what in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)


def test_a_suggestion_is_a_typo_of_a_flag_not_another_flag():
    from dtrain.cli import typo_of

    flags = ["--wait", "--no-wait", "--max-run", "--hostfile", "--max-restarts", "--instances", "-f"]
    assert [typo_of(f, flags) for f in ("--hostfle", "--max-restart", "--wiat", "--max-rn", "--instance")] == \
        ["--hostfile", "--max-restarts", "--wait", "--max-run", "--instances"]
    assert [typo_of(f, flags) for f in ("--max-wait", "--wait-max", "--run", "--x", "--hosts")] == [None] * 5


def test_help_for_an_action_the_way_users_type_it(tmp_path):
    """`dtrain --help nodes up`, `dtrain nodes --help`, `dtrain nodes up --help`, `dtrain -h
    volume create`: the task's help, exit 0 (Invoke alone said "no task 'up'", or took --help
    for the action)."""
    for args, task in ((("--help", "nodes", "up"), "nodes"), (("nodes", "--help"), "nodes"),
                       (("nodes", "up", "--help"), "nodes"), (("-h", "volume", "create"), "volume"),
                       (("cluster", "up", "-h"), "cluster"), (("--help", "launch"), "launch")):
        r = dtrain(tmp_path, *args)
        assert r.returncode == 0 and f"Usage: dtrain [--core-opts] {task} [--options]" in r.stdout, \
            (args, r.stdout + r.stderr)
        assert not r.stderr, (args, r.stderr)


def test_help_words_after_the_double_dash_are_the_jobs():
    from dtrain.cli import help_argv

    tasks = {"launch", "nodes", "volume"}
    assert help_argv(["dtrain", "--help", "nodes", "up"], tasks) == ["dtrain", "--help", "nodes"]
    assert help_argv(["dtrain", "nodes", "up", "--help"], tasks) == ["dtrain", "--help", "nodes"]
    argv = ["dtrain", "launch", "--image", "r/x", "--", "python", "t.py", "--help"]
    assert help_argv(argv, tasks) == argv  # the job's own --help
    assert help_argv(["dtrain", "--help"], tasks) == ["dtrain", "--help"]
    assert help_argv(["dtrain", "nodes", "up"], tasks) == ["dtrain", "nodes", "up"]
