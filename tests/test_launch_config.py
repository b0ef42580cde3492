"""One config model (issue 39): the job file's model (JobFile) is the schema of `dtrain launch`,
its flags, help and defaults; and one job file runs on every target (--target sagemaker against
moto on loopback, mpijob/pytorchjob/ecs as schema-checked descriptions)."""

from __future__ import annotations

import base64
import inspect
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from dtrain import contract
from dtrain.launch import jobtarget
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import config, jobfile
from dtrain.launch.jobs.spec import JobSpec
from dtrain.launch.other_tools import manifests as mf

ROOT = Path(__file__).resolve().parent.parent
DTRAIN = [sys.executable, "-m", "dtrain"]
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/dtrain/pytorch-ddp:2.13.0-cpu-py311-debian12"
ROLE = "arn:aws:iam::123456789012:role/r"


def _cli(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*DTRAIN, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


# ---------------------------------------------------------------- the task and the model agree


def test_launch_flags_are_the_models_fields_with_its_help_and_defaults():
    import tasks

    body = tasks.launch.body
    while hasattr(body, "__wrapped__"):
        body = body.__wrapped__
    params = inspect.signature(body).parameters
    task_only = {"f", "file", "dump", "output", "force"}
    fields = set(jobfile.JobFile.model_fields) - {"command"}  # command: what follows `--`
    off = {config.opposite(k) for k in config.SWITCHES}  # --no-check-network: a file's `true` turned off
    assert off and set(params) - {"c"} == fields | task_only | off
    assert all(params[k].default is False for k in off)
    assert set(tasks.LAUNCH_TASK_ONLY_HELP) == task_only
    assert tasks.LAUNCH_HELP == jobfile.help_texts()
    shown = "".join(_cli(ROOT, "launch", "--help").stdout.split())  # Invoke wraps the lines
    for key, f in jobfile.JobFile.model_fields.items():
        if key == "command":
            continue
        assert f.description and "--" + key.replace("_", "-") in shown, key
        assert "".join(f.description.split()) in shown, key
        # the task's default is "not given"; what applies is the model's launch_default
        assert params[key].default in (None, False), key
        assert (params[key].default is False) == (f.annotation == (bool | None) or "bool" in str(f.annotation)), key
    for key, text in tasks.LAUNCH_TASK_ONLY_HELP.items():
        assert "".join(text.split()) in shown, key
    d = jobfile.defaults()
    assert d["master_port"] == str(contract.MASTER_PORT) and d["target"] == "nodes"
    assert d["launcher"] == "mpirun" and d["pull"] == "always" and d["rdzv"] == "static"
    assert JobSpec.__dataclass_fields__["master_port"].default == contract.MASTER_PORT
    assert not hasattr(tasks, "LAUNCH_DEFAULTS")


def test_every_default_in_a_help_text_is_the_models():
    for key, value in jobfile.defaults().items():
        if key == "command" or value is None:
            continue
        assert f"default {value}" in jobfile.help_texts()[key] or f"{value} (default" in jobfile.help_texts()[key], key


def test_launch_spec_is_built_once_from_the_config(tmp_path):
    from dtrain.launch.jobs import config

    cfg = config.build({"image": "reg/x:1", "command": ["python", "t.py"], "launcher": "torchrun", "env": ["A=1"],
                        "spares": "1", "max_restarts": "2", "hang_timeout": "30"})
    spec = config.job_spec(cfg)
    assert (spec.image, spec.command, spec.launcher, spec.master_port) == ("reg/x:1", ("python", "t.py"), "torchrun",
                                                                          contract.MASTER_PORT)
    assert (spec.spares, spec.max_restarts, spec.hang_timeout, spec.env) == (1, 2, 30.0, {"A": "1"})


# ---------------------------------------------------------------- a bad value: the same words from a file and a flag


@pytest.mark.parametrize("key, value", [("master_port", "70000"), ("spares", "-1"), ("max_restarts", "5" * 300),
                                        ("hang_timeout", "0"), ("timeout", "-1"), ("slots", "0"), ("min_nodes", "-1"),
                                        ("shm_size", "lots"), ("name", "a b")])
def test_a_bad_value_from_the_file_and_from_the_flag_say_the_same(tmp_path, key, value):
    (tmp_path / "job.yaml").write_text(f"image: reg/x:1\nhosts: h1:1\ncommand: python t.py\n{key}: {value}\n")
    from_file = _cli(tmp_path, "launch", "-f", "job.yaml")
    flag = "--" + key.replace("_", "-")
    (tmp_path / "job2.yaml").write_text("image: reg/x:1\nhosts: h1:1\ncommand: python t.py\n")
    from_flag = _cli(tmp_path, "launch", "-f", "job2.yaml", flag, value)
    for r in (from_file, from_flag):
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("error: "), r.stderr
    assert from_file.stderr.startswith(f"error: job.yaml:4: {key} "), from_file.stderr
    assert from_flag.stderr.startswith(f"error: {flag} "), from_flag.stderr
    assert from_file.stderr.removeprefix(f"error: job.yaml:4: {key} ") == from_flag.stderr.removeprefix(f"error: {flag} ")


# ---------------------------------------------------------------- one job file, every target


def _project(tmp_path: Path) -> Path:
    """The job file the simulated cluster runs: 3 nodes, image, command, workdir, env."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("print('train')\n")
    (project / "requirements.txt").write_text("six\n")
    (project / "hostfile").write_text("node-1 slots=1\nnode-2 slots=1\nnode-3 slots=1\n")
    (project / "job.yaml").write_text(
        f"image: {IMAGE}\nhostfile: hostfile\nworkdir: .\ncommand: python train.py --epochs 1\n"
        "launcher: torchrun\nenv:\n  EPOCHS: 1\n  WANDB_MODE: offline\nssh_user: dtrain\n")
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    return project


def _recorded_create_training_job(moto_server: str) -> dict:
    with urllib.request.urlopen(f"{moto_server}/moto-api/recorder/download-recording", timeout=30) as r:
        entries = [json.loads(line) for line in r.read().decode().splitlines() if line.strip()]
    found = [e for e in entries if e["headers"].get("X-Amz-Target", "").endswith(".CreateTrainingJob")]
    assert len(found) == 1
    body = found[0]["body"]
    return json.loads(base64.b64decode(body) if found[0]["body_encoded"] else body)


def test_the_job_file_submitted_to_sagemaker_as_3_instances(tmp_path, moto_server, monkeypatch):
    import boto3

    project = _project(tmp_path)
    monkeypatch.chdir(tmp_path)  # moto's recording file lands here
    post = lambda action: urllib.request.urlopen(  # noqa: E731
        urllib.request.Request(f"{moto_server}/moto-api/recorder/{action}", method="POST"), timeout=30).close()
    post("start-recording")
    env = {"AWS_ENDPOINT_URL": moto_server, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
           "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true"}
    try:
        r = _cli(project, "launch", "-f", "job.yaml", "--target", "sagemaker", "--instance-type", "ml.m5.xlarge",
                 "--role", ROLE, "--name", "job-file-3", "--detach", env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.strip().splitlines()[-1] == "job-file-3"
        assert "--ssh-user ignored" in r.stderr
        req = _recorded_create_training_job(moto_server)
    finally:
        for action in ("stop-recording", "reset-recording"):
            post(action)
    assert req["ResourceConfig"]["InstanceCount"] == 3 and req["ResourceConfig"]["InstanceType"] == "ml.m5.xlarge"
    assert req["RoleArn"] == ROLE and req["AlgorithmSpecification"]["TrainingImage"] == IMAGE
    assert req["Environment"] == {"EPOCHS": "1", "WANDB_MODE": "offline"}
    assert json.loads(req["HyperParameters"]["dtrain_command"]) == ["python", "train.py", "--epochs", "1"]
    assert req["HyperParameters"]["dtrain_launcher"] == "torchrun"
    s3 = boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1", aws_access_key_id="testing",
                      aws_secret_access_key="testing")
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="sagemaker-us-east-1-123456789012",
                                                 Prefix="dtrain/job-file-3/code/")["Contents"]}
    assert {"dtrain/job-file-3/code/train.py", "dtrain/job-file-3/code/requirements.txt"} <= keys


@pytest.mark.parametrize("target", ["mpijob", "pytorchjob", "ecs"])
def test_the_job_file_as_a_valid_description(tmp_path, target):
    project = _project(tmp_path)
    launcher = {"mpijob": None, "pytorchjob": "torchrun", "ecs": "ray"}[target]  # what the tool runs
    (project / "job.yaml").write_text((project / "job.yaml").read_text().replace(
        "launcher: torchrun\n", f"launcher: {launcher}\n" if launcher else ""))
    r = _cli(project, "launch", "-f", "job.yaml", "--target", target)
    assert r.returncode == 0, r.stderr
    kind = "ecs-ray" if target == "ecs" else target  # ECS with a command: Ray's head and worker services
    doc = mf.load(kind, r.stdout)
    assert mf.problems(kind, doc) == []
    text = json.dumps(doc)
    assert "WANDB_MODE" in text and "train.py" in text and IMAGE in text
    if target == "mpijob":
        assert doc["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 3
    if target == "pytorchjob":
        specs = doc["spec"]["pytorchReplicaSpecs"]
        assert sum(s["replicas"] for s in specs.values()) == 3
    out = tmp_path / f"{target}.yaml"
    r = _cli(project, "launch", "-f", "job.yaml", "--target", target, "--output", str(out))
    assert r.returncode == 0 and out.read_text() == mf.render(mf.spec_from_args(
        target, IMAGE, ["python", "train.py", "--epochs", "1"], workers=3,
        env=["EPOCHS=1", "WANDB_MODE=offline"], launcher=launcher, name="job",  # the job file's name
        plain_env=("EPOCHS", "WANDB_MODE")))  # the file's literal values


def test_ecs_runs_a_command_only_as_a_ray_driver(tmp_path):
    r = _cli(_project(tmp_path), "launch", "-f", "job.yaml", "--target", "ecs", "--launcher", "mpirun")
    # the command is the file's: named by its line, as other file errors are
    assert r.returncode == 2 and r.stderr.startswith(
        "error: job.yaml:4: command: --target ecs: the task definition is the node container"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "after `--`" not in r.stderr
    (tmp_path / "flag").mkdir()
    r = _cli(_project(tmp_path / "flag"), "launch", "-f", "job.yaml", "--target", "ecs", "--launcher", "mpirun",
             "--", "python", "x.py")
    assert r.returncode == 2 and r.stderr.startswith(
        "error: the command after `--`: --target ecs: the task definition is the node container"), r.stderr


@pytest.mark.parametrize("target, args, message", [
    ("ecs", ["--spares", "1"], "--spares: not for --target ecs"),
    ("mpijob", ["--launcher", "mpirun", "--spares", "2"], "--spares: not for --target mpijob"),
    ("sagemaker", ["--hang-timeout", "60"], "--hang-timeout: not for --target sagemaker"),
    ("pytorchjob", ["--role", ROLE], "--role is SageMaker's only (--target sagemaker); --target pytorchjob has no "
                                     "equivalent"),
    ("sagemaker", ["--role", ROLE], "--instance-type is required with --target sagemaker"),
    ("nodes", ["--role", ROLE], "--role is SageMaker's only (--target sagemaker); --target nodes has no equivalent"),
    ("kubernetes", [], "--target 'kubernetes'"),
])
def test_fields_a_target_cannot_take_are_one_line(tmp_path, target, args, message):
    project = _project(tmp_path)
    r = _cli(project, "launch", "-f", "job.yaml", "--target", target, *args, env={"AWS_EC2_METADATA_DISABLED": "true"})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error: ") and message in r.stderr, r.stderr


@pytest.mark.parametrize("target", ["mpijob", "pytorchjob"])
def test_kubeflow_targets_take_the_instance_type_and_its_efa(tmp_path, target):
    """`launch -f job.yaml --target mpijob|pytorchjob --instance-type p4d.24xlarge`: the same file's
    job with each worker pod asking for the type's 4 EFA interfaces (manifests.py)."""
    r = _cli(_project(tmp_path), "launch", "-f", "job.yaml", "--target", target, "--instance-type", "p4d.24xlarge",
             "--launcher", "torchrun" if target == "pytorchjob" else "mpirun",
             env={"AWS_EC2_METADATA_DISABLED": "true"})
    assert r.returncode == 0, r.stderr
    assert "vpc.amazonaws.com/efa: 4" in r.stdout and "IPC_LOCK" in r.stdout


@pytest.mark.parametrize("target", ["mpijob", "ecs"])
def test_output_writes_the_description_and_says_so(tmp_path, target):
    """docs/other-tools.md: `--output FILE to write it`; --dump is the job file, on stdout only."""
    project = _project(tmp_path)
    extra = ["--launcher", "ray"] if target == "ecs" else ["--launcher", "mpirun"]
    r = _cli(project, "launch", "-f", "job.yaml", "--target", target, *extra, "--output", "o.out")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "wrote o.out\n" and IMAGE in (project / "o.out").read_text()
    r = _cli(project, "launch", "-f", "job.yaml", "--target", target, *extra, "--dump", "--output", "p.out")
    assert r.returncode == 2 and r.stderr.startswith("error: --output p.out: ") and "--dump" in r.stderr, r.stderr
    assert not (project / "p.out").exists()


def test_launch_instance_type_gives_the_types_gpus(tmp_path):
    """--instance-type p5.48xlarge: 8 slots per worker, -np 3x8, 8 GPUs beside the 32 EFA."""
    r = _cli(_project(tmp_path), "launch", "-f", "job.yaml", "--target", "mpijob", "--launcher", "mpirun",
             "--instance-type", "p5.48xlarge")
    assert r.returncode == 0, r.stderr
    doc = mf.load("mpijob", r.stdout)
    assert doc["spec"]["slotsPerWorker"] == 8
    worker = doc["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert worker["resources"]["limits"]["vpc.amazonaws.com/efa"] == 32
    argv = doc["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"]
    assert argv[argv.index("-np") + 1] == "24"


@pytest.mark.parametrize("args, message", [
    (["launch", "-f", "job.yaml", "--target", "ecs", "--launcher", "ray", "--instance-type", "p9.bogus"],
     "error: --instance-type 'p9.bogus': not an EC2 instance type"),
    (["launch", "-f", "job.yaml", "--target", "mpijob", "--launcher", "mpirun", "--instance-type", "p4d.24xlarg"],
     "error: --instance-type 'p4d.24xlarg': not an EC2 instance type; did you mean p4d.24xlarge"),
    (["manifest", "--for", "mpijob", "--image", IMAGE, "--instance-type", "p4d.24xlarg", "--", "python", "t.py"],
     "error: --instance-type 'p4d.24xlarg': not an EC2 instance type; did you mean p4d.24xlarge"),
    (["launch", "-f", "job.yaml", "--target", "mpijob", "--launcher", "mpirun", "--instance-type", "ml.g5.12xlarge"],
     "error: --instance-type 'ml.g5.12xlarge': a SageMaker type; the nodes' EC2 type has no ml. "
                 "(drop it: g5.12xlarge)"),
    (["launch", "-f", "job.yaml", "--target", "ecs", "--launcher", "ray", "--instance-type", "ml.g5.12xlarge"],
     "error: --instance-type 'ml.g5.12xlarge': a SageMaker type; the nodes' EC2 type has no ml."),
    (["manifest", "--for", "pytorchjob", "--image", IMAGE, "--instance-type", "ml.g5.12xlarge", "--", "t.py"],
     "error: --instance-type 'ml.g5.12xlarge': a SageMaker type; the nodes' EC2 type has no ml."),
    (["manifest", "--for", "mpijob", "--image", IMAGE, "--instance-type", "p4d.24xlarge", "--gpus-per-worker", "16",
      "--", "python", "t.py"], "error: --gpus-per-worker 16: a p4d.24xlarge has 8 GPUs (--instance-type p4d.24xlarge)"),
])
def test_a_bad_instance_type_for_the_nodes_is_one_line(tmp_path, args, message):
    project = _project(tmp_path)
    cut = args.index("--") if "--" in args else len(args)
    r = _cli(project, *args[:cut], "--output", "o.out", *args[cut:])
    assert r.returncode == 2 and r.stderr.startswith(message) and len(r.stderr.splitlines()) == 1, r.stderr
    assert not (project / "o.out").exists()


def test_a_field_from_the_file_a_target_refuses_names_the_file_line(tmp_path):
    project = _project(tmp_path)
    (project / "job.yaml").write_text((project / "job.yaml").read_text() + "spares: 1\n")
    r = _cli(project, "launch", "-f", "job.yaml", "--target", "ecs")
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "spares: not for --target ecs" in r.stderr
    assert "job.yaml:10: spares" in r.stderr, r.stderr


def test_target_from_the_file(tmp_path):
    project = _project(tmp_path)
    (project / "job.yaml").write_text((project / "job.yaml").read_text().replace("launcher: torchrun\n", "")
                                      + "target: mpijob\n")
    r = _cli(project, "launch", "-f", "job.yaml")
    assert r.returncode == 0, r.stderr
    assert mf.problems("mpijob", mf.load("mpijob", r.stdout)) == []


def test_check_fields_ignores_the_nodes_own_settings():
    from dtrain.launch.jobs import config

    cfg = {"image": "r/x:1", "target": "ecs", "ssh_user": "u", "pull": "always", "master_port": "29501"}
    assert jobtarget.check_fields(config.build(cfg)) == ["--ssh-user", "--master-port"]
    with pytest.raises(LaunchError, match="--mount: not for --target ecs"):
        jobtarget.check_fields(config.build({**cfg, "mount": ["/fsx"]}))
