"""One launch, every target (issue 48): what `--dump` writes loads back with -f to the same launch
(paths relative to the file, the file's literal env values, names from the environment marked),
on the nodes and on every target: SageMaker's CreateTrainingJob (moto on loopback, its request
recorded), the MPIJob, PyTorchJob and ECS descriptions. The SageMaker job's fields (on-demand,
max wait, volume, inputs, restarts, checkpoints) come from the same model as any other; the node
shape (`hosts: h:8`, `count`, `slots`) reaches every target; docs/launch.md's job file goes to
every target in one run, or is refused in one message naming every field."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from dtrain import ROOT
from dtrain.launch.jobs import config, jobfile
from dtrain.launch.other_tools import manifests as mf

DTRAIN = [sys.executable, "-m", "dtrain"]
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/dtrain/pytorch-ddp:2.13.0-cpu-py311-debian12"
ROLE = "arn:aws:iam::123456789012:role/r"
AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
       "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true"}


def _cli(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*DTRAIN, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def _project(tmp_path: Path, extra: str = "") -> Path:
    """A project with the issue's job file: a literal env value, a name from the environment,
    the workdir as `.`, a hostfile beside it, hosts of 8 processes each."""
    project = tmp_path / "proj"
    (project / "data").mkdir(parents=True)
    (project / "data" / "part-0").write_text("x\n")
    (project / "train.py").write_text("print('train')\n")
    (project / "hostfile").write_text("node-1 slots=8\nnode-2 slots=8\n")
    (project / "job.yaml").write_text(
        f"image: {IMAGE}\nlauncher: torchrun\nhostfile: hostfile\nworkdir: .\ncommand: python train.py --epochs 10\n"
        "env:\n  EPOCHS: 10\n  WANDB_API_KEY:\nmax_restarts: 2\n" + extra)
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    return project


def _same(a: config.LaunchConfig, b: config.LaunchConfig) -> None:
    """The same launch: every field (a path as the file it names), the same fields given."""
    def fields(c: config.LaunchConfig) -> dict:
        d = c.model_dump()
        return {k: os.path.abspath(v) if k in jobfile.PATH_KEYS and v else v for k, v in d.items()}

    assert fields(a) == fields(b)
    assert a.given == b.given


# ---------------------------------------------------------------- --dump, then -f: the same launch


def test_dump_keeps_literals_relative_paths_and_marks_names_from_the_environment(tmp_path, monkeypatch):
    project = _project(tmp_path)
    monkeypatch.chdir(tmp_path)  # not the file's directory: its paths stay relative to the file
    environ = {"WANDB_API_KEY": "k-secret"}
    cfg = config.build({"env": ["WANDB_API_KEY"], "spares": "0"}, project / "job.yaml", environ=environ)
    text = config.dump(cfg)
    data = yaml.safe_load(text)
    assert data["env"] == {"EPOCHS": "10", "WANDB_API_KEY": None} and "k-secret" not in text
    assert data["workdir"] == "." and data["hostfile"] == "hostfile" and data["max_restarts"] == 2
    assert data["spares"] == 0  # given explicitly: kept, as given
    (project / "again.yaml").write_text(text)
    _same(config.build({"env": ["WANDB_API_KEY"]}, project / "again.yaml", environ=environ), cfg)


def test_dump_from_the_cli_loads_back_with_f(tmp_path):
    project = _project(tmp_path)
    env = {"WANDB_API_KEY": "k-secret"}
    r = _cli(tmp_path, "launch", "-f", "proj/job.yaml", "--env", "WANDB_API_KEY", "--max-restarts", "0", "--dump",
             env=env)
    assert r.returncode == 0, r.stderr
    assert "EPOCHS: '10'" in r.stdout and "workdir: .\n" in r.stdout and "WANDB_API_KEY:\n" in r.stdout
    assert "max_restarts: 0\n" in r.stdout  # the flag over the file's 2
    (project / "dumped.yaml").write_text(r.stdout)
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        _same(config.build({"env": ["WANDB_API_KEY"]}, project / "dumped.yaml", environ=env),
              config.build({"env": ["WANDB_API_KEY"], "max_restarts": "0"}, project / "job.yaml", environ=env))
    finally:
        os.chdir(cwd)


def test_dump_of_flags_alone_loads_back(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts").write_text("h1 slots=2\n")
    flags = {"hostfile": "hosts", "image": "reg/x:1", "launcher": "torchrun", "mount": ["/fsx:ro"], "timeout": "90",
             "command": ["python", "t.py"], "input": ["train=s3://bucket-1/p"], "on_demand": True, "volume_size": "200"}
    cfg = config.build(flags)
    (tmp_path / "job.yaml").write_text(config.dump(cfg))
    _same(config.build({}, tmp_path / "job.yaml"), cfg)


def test_a_flag_given_cancels_the_files_value(tmp_path):
    project = _project(tmp_path)
    environ = {"WANDB_API_KEY": "k"}
    cfg = config.build({"max_restarts": "0", "env": ["WANDB_API_KEY"]}, project / "job.yaml", environ=environ)
    assert cfg.max_restarts == 0 and not cfg.set("max_restarts") and cfg.named("max_restarts") == "--max-restarts"
    assert config.build({"env": ["WANDB_API_KEY"]}, project / "job.yaml", environ=environ).named(
        "max_restarts").endswith("job.yaml:9: max_restarts")


@pytest.mark.parametrize("target", ["mpijob", "pytorchjob", "ecs", "trainjob", "jobset"])
def test_dump_is_the_job_file_on_every_target(tmp_path, target):
    """--dump with a target that writes a description prints the job file (the lossless YAML),
    not the description (that is stdout or --output without --dump)."""
    project = _project(tmp_path)
    env = {"WANDB_API_KEY": "k"}
    r = _cli(project, "launch", "-f", "job.yaml", "--target", target, "--env", "WANDB_API_KEY", "--dump", env=env)
    assert r.returncode == 0, r.stderr
    data = yaml.safe_load(r.stdout)
    assert data["target"] == target and data["env"] == {"EPOCHS": "10", "WANDB_API_KEY": None}
    assert "GENERATED" not in r.stdout and "apiVersion" not in r.stdout and "k" not in data["env"].values()


def test_a_false_switch_or_a_zero_given_cancels_the_files_value(tmp_path):
    """--no-check-network over `check_network: true`, --min-nodes 0 over `min_nodes: 2`, --spares 0
    over `spares: 1`: the command line wins, even with false or zero (config.switches, merge)."""
    project = _project(tmp_path, "check_network: true\nmin_nodes: 2\nspares: 1\ndetach: true\n")
    environ = {"WANDB_API_KEY": "k"}
    flags = config.switches({"no_check_network": True, "min_nodes": "0", "spares": "0", "no_detach": True,
                             "env": ["WANDB_API_KEY"]})
    cfg = config.build(flags, project / "job.yaml", environ=environ)
    assert cfg.check_network is False and cfg.min_nodes == 0 and cfg.spares == 0 and cfg.detach is False
    assert not any(cfg.set(k) for k in ("check_network", "min_nodes", "spares", "detach"))
    assert config.job_spec(cfg).min_nodes is None and config.job_spec(cfg).check_network is False
    (project / "again.yaml").write_text(config.dump(cfg))  # the dump keeps them: the same launch
    _same(config.build({"env": ["WANDB_API_KEY"]}, project / "again.yaml", environ=environ), cfg)
    # not given: the file's value stands
    kept = config.build(config.switches({"env": ["WANDB_API_KEY"]}), project / "job.yaml", environ=environ)
    assert kept.check_network is True and kept.min_nodes == 2 and kept.detach is True
    with pytest.raises(config.LaunchError, match="--check-network and --no-check-network: give one"):
        config.switches({"check_network": True, "no_check_network": True})


def test_no_switch_flags_let_a_target_take_the_file(tmp_path):
    """The real CLI: a file's check_network/min_nodes that mpijob refuses, turned off by flags."""
    project = _project(tmp_path, "check_network: true\nmin_nodes: 2\n")
    env = {"WANDB_API_KEY": "k"}
    base = ["launch", "-f", "job.yaml", "--target", "mpijob", "--launcher", "mpirun", "--max-restarts", "0",
            "--env", "WANDB_API_KEY"]
    r = _cli(project, *base, env=env)
    assert r.returncode == 2 and "check_network" in r.stderr and "min_nodes" in r.stderr, r.stderr
    r = _cli(project, *base, "--no-check-network", "--min-nodes", "0", env=env)
    assert r.returncode == 0 and "kind: MPIJob" in r.stdout, r.stderr


# ---------------------------------------------------------------- every target reads the same launch


@pytest.mark.parametrize("target", ["mpijob", "pytorchjob", "ecs"])
def test_the_dumped_file_writes_the_same_description(tmp_path, target):
    project = _project(tmp_path)
    launcher = {"mpijob": "mpirun", "pytorchjob": "torchrun", "ecs": "ray"}[target]
    env = {"WANDB_API_KEY": "k"}
    common = ["--launcher", launcher, "--max-restarts", "0", "--env", "WANDB_API_KEY", "--name", "rt"]  # (no name:
    # each file's own, job and dumped)
    r = _cli(project, "launch", "-f", "job.yaml", *common, "--dump", env=env)
    assert r.returncode == 0, r.stderr
    (project / "dumped.yaml").write_text(r.stdout)
    first = _cli(project, "launch", "-f", "job.yaml", *common, "--target", target, env=env)
    again = _cli(project, "launch", "-f", "dumped.yaml", "--env", "WANDB_API_KEY", "--target", target, env=env)
    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    assert first.stdout == again.stdout
    kind = "ecs-ray" if target == "ecs" else target
    doc = mf.load(kind, again.stdout)
    assert mf.problems(kind, doc) == []
    if target == "mpijob":  # hostfile: slots=8 -> 8 ranks per worker, -np 16
        assert doc["spec"]["slotsPerWorker"] == 8 and doc["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    if target == "pytorchjob":
        container = doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
        assert "--nproc_per_node=8" in " ".join(container["args"] + container.get("command", [])) or \
            doc["spec"].get("nprocPerNode") == "8", container


@pytest.mark.parametrize("target", ["mpijob", "pytorchjob", "trainjob", "jobset", "ecs"])
def test_a_job_files_literal_env_is_a_plain_value_and_names_from_the_environment_a_secret(tmp_path, target):
    """`EPOCHS: 10` in the job file is not a secret (it is in a file already): written as a value;
    `WANDB_API_KEY:` (from the environment) and --env NAME=VALUE stay the Secret's, their values
    in no file (issue 47)."""
    project = _project(tmp_path)
    launcher = {"mpijob": "mpirun", "ecs": "ray"}.get(target, "torchrun")
    r = _cli(project, "launch", "-f", "job.yaml", "--target", target, "--launcher", launcher, "--max-restarts", "0",
             "--env", "WANDB_API_KEY", "--env", "HF_TOKEN=hf-s3cret", env={"WANDB_API_KEY": "k-s3cret"})
    assert r.returncode == 0, r.stderr
    assert "s3cret" not in r.stdout + r.stderr
    kind = "ecs-ray" if target == "ecs" else target
    doc = mf.load(kind, r.stdout)
    assert mf.problems(kind, doc) == []
    text = json.dumps(doc)
    if target == "ecs":
        assert '{"name": "EPOCHS", "value": "10"}' in text and '"valueFrom": "' in text
        assert '{"name": "WANDB_API_KEY", "valueFrom"' in text and '{"name": "HF_TOKEN", "valueFrom"' in text
    else:
        assert '{"name": "EPOCHS", "value": "10"}' in text
        for name in ("WANDB_API_KEY", "HF_TOKEN"):
            assert f'"key": "{name}"' in text, name
        assert '"key": "EPOCHS"' not in text
    assert "EPOCHS" not in r.stderr.split("not in the file")[0] and "HF_TOKEN, WANDB_API_KEY: not in the file" in r.stderr


def _recording(moto_server: str, action: str) -> None:
    urllib.request.urlopen(urllib.request.Request(f"{moto_server}/moto-api/recorder/{action}", method="POST"),
                           timeout=30).close()


def _created(moto_server: str) -> list[dict]:
    with urllib.request.urlopen(f"{moto_server}/moto-api/recorder/download-recording", timeout=30) as r:
        entries = [json.loads(line) for line in r.read().decode().splitlines() if line.strip()]
    found = [e for e in entries if e["headers"].get("X-Amz-Target", "").endswith(".CreateTrainingJob")]
    return [json.loads(base64.b64decode(e["body"]) if e["body_encoded"] else e["body"]) for e in found]


def test_sagemaker_on_demand_restarts_checkpoints_and_the_dump(tmp_path, moto_server, monkeypatch):
    """--on-demand: no managed spot; max_restarts -> RetryStrategy; checkpoint_dir -> the rank's
    DTRAIN_CHECKPOINT_DIR at CheckpointConfig's path; hostfile slots=8 -> 8 per instance; the
    volume and an input channel from the file; then the dumped file makes the same request."""
    project = _project(tmp_path, "checkpoint_dir: /fsx/ckpt\nvolume_size: 200\ninput: [train=data]\n")
    monkeypatch.chdir(tmp_path)  # moto's recording file lands here
    env = {"AWS_ENDPOINT_URL": moto_server, **AWS, "WANDB_API_KEY": "k"}
    args = ["--target", "sagemaker", "--instance-type", "ml.m5.xlarge", "--role", ROLE, "--detach",
            "--env", "WANDB_API_KEY"]
    r = _cli(project, "launch", "-f", "job.yaml", "--on-demand", "--env", "WANDB_API_KEY", "--dump", env=env)
    assert r.returncode == 0, r.stderr
    assert "on_demand: true" in r.stdout and "- train=data" in r.stdout
    (project / "dumped.yaml").write_text(r.stdout)
    _recording(moto_server, "start-recording")
    try:
        first = _cli(project, "launch", "-f", "job.yaml", "--on-demand", *args, "--name", "rt-1", env=env)
        again = _cli(project, "launch", "-f", "dumped.yaml", *args, "--name", "rt-2", env=env)
        spot = _cli(project, "launch", "-f", "job.yaml", *args, "--name", "rt-3", "--max-wait", "7200",
                    "--timeout", "3600", env=env)
        reqs = _created(moto_server)
    finally:
        for action in ("stop-recording", "reset-recording"):
            _recording(moto_server, action)
    for r in (first, again, spot):
        assert r.returncode == 0, r.stdout + r.stderr
    assert len(reqs) == 3
    req = reqs[0]
    assert "EnableManagedSpotTraining" not in req and "MaxWaitTimeInSeconds" not in req["StoppingCondition"]
    assert req["RetryStrategy"] == {"MaximumRetryAttempts": 2}
    assert req["Environment"]["DTRAIN_CHECKPOINT_DIR"] == req["CheckpointConfig"]["LocalPath"]
    assert req["Environment"]["EPOCHS"] == "10" and req["Environment"]["WANDB_API_KEY"] == "k"
    assert req["ResourceConfig"] == {"InstanceCount": 2, "InstanceType": "ml.m5.xlarge", "VolumeSizeInGB": 200}
    assert req["HyperParameters"]["dtrain_slots"] == "8"
    assert [c["ChannelName"] for c in req["InputDataConfig"]][0] == "train"

    def same(r: dict) -> dict:
        return {k: v for k, v in json.loads(json.dumps(r).replace("rt-2", "rt-1")).items() if k != "Tags"}

    assert same(reqs[1]) == same(req)  # the dumped file: the same job
    assert reqs[2]["EnableManagedSpotTraining"] is True
    assert reqs[2]["StoppingCondition"] == {"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 7200}


def test_on_demand_from_the_file(tmp_path):
    project = _project(tmp_path, "on_demand: true\n")
    cfg = config.build({"env": ["WANDB_API_KEY"]}, project / "job.yaml", environ={"WANDB_API_KEY": "k"})
    assert cfg.on_demand is True and cfg.named("on_demand").endswith("job.yaml:10: on_demand")


# ---------------------------------------------------------------- docs/launch.md's job file, every target


def _docs_job(tmp_path: Path) -> Path:
    text = (ROOT / "docs" / "launch.md").read_text()
    block = text.split("## A job file", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "job.yaml").write_text(block)
    return tmp_path / "job.yaml"


@pytest.mark.parametrize("target", ["sagemaker", "mpijob", "pytorchjob", "ecs"])
def test_the_documented_job_file_is_refused_in_one_message_naming_every_field(tmp_path, target):
    job = _docs_job(tmp_path)
    lines = {k: i for i, line in enumerate(job.read_text().splitlines(), start=1)
             for k in [line.split(":", 1)[0]] if line and not line.startswith((" ", "#"))}
    r = _cli(tmp_path, "launch", "-f", "job.yaml", "--target", target, "--env", "WANDB_API_KEY",
             env={"WANDB_API_KEY": "k", **AWS})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    refused = ["spares", "min_nodes", "check_network", "mount"] + (  # timeout: none in the file
        [] if target == "sagemaker" else ["checkpoint_dir"]) + (  # max_restarts: RetryStrategy, runPolicy's backoffLimit
        ["max_restarts"] if target == "ecs" else [])
    for key in refused:
        assert f"job.yaml:{lines[key]}: {key}" in r.stderr, (key, r.stderr)
    assert f"not for --target {target}" in r.stderr and "cluster" not in r.stderr  # no cluster was read


@pytest.mark.parametrize("target", ["sagemaker", "mpijob", "pytorchjob", "ecs"])
def test_the_documented_job_file_without_the_nodes_only_fields_goes_to_every_target(tmp_path, target, moto_server):
    """The file's node-only fields cancelled on the command line by their defaults (`--spares 0`,
    `--max-restarts 0`, `--min-nodes 0`, `--no-check-network`) or left out of a copy (mount: a
    list), its shape given (`--count 4`): one run each, no cluster read (none is up)."""
    _docs_job(tmp_path)
    (tmp_path / "train.py").write_text("print(1)\n")
    cancel = ["--spares", "0", "--count", "4", "--min-nodes", "0", "--no-check-network"]
    off = ["--max-restarts", "0"] if target == "ecs" else []  # sagemaker, mpijob, pytorchjob map the file's 2
    extra = {"sagemaker": ["--instance-type", "ml.m5.xlarge", "--role", ROLE, "--detach", "--name", "docs-1"],
             "ecs": ["--launcher", "ray"], "mpijob": ["--launcher", "mpirun"], "pytorchjob": []}[target]
    # the file's mount and checkpoint_dir (off the nodes) are dropped from a copy
    text = (tmp_path / "job.yaml").read_text()
    keep = [line for line in text.splitlines() if not line.startswith("mount:")
            and (target == "sagemaker" or not line.startswith("checkpoint_dir:"))]
    (tmp_path / "job.yaml").write_text("\n".join(keep) + "\n")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    r = _cli(tmp_path, "launch", "-f", "job.yaml", "--target", target, "--env", "WANDB_API_KEY", *cancel, *off,
             *extra, env={"WANDB_API_KEY": "k", "AWS_ENDPOINT_URL": moto_server, **AWS})
    assert r.returncode == 0, r.stdout + r.stderr
    if target != "sagemaker":
        kind = "ecs-ray" if target == "ecs" else target
        assert mf.problems(kind, mf.load(kind, r.stdout)) == []
        if target in ("mpijob", "pytorchjob"):  # the file's max_restarts: 2, as the operator's retries
            assert yaml.safe_load(r.stdout)["spec"]["runPolicy"]["backoffLimit"] == 2


@pytest.mark.parametrize("target", ["mpijob", "trainjob", "ecs", "nodes"])
def test_sagemakers_own_fields_are_named_as_sagemakers_in_one_message(tmp_path, target):
    """on_demand, max_wait, volume_size, input on another target: `FILE:LINE: key ... SageMaker's
    only; --target T has no equivalent`, every one in one line, beside the nodes-only ones."""
    project = _project(tmp_path, "spares: 1\non_demand: true\nvolume_size: 200\ninput: [train=data]\n")
    lines = {k: i for i, line in enumerate((project / "job.yaml").read_text().splitlines(), start=1)
             for k in [line.split(":", 1)[0]]}
    r = _cli(project, "launch", "-f", "job.yaml", "--target", target, "--env", "WANDB_API_KEY", "--max-restarts", "0",
             env={"WANDB_API_KEY": "k"})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    own = "job.yaml:{}: on_demand, job.yaml:{}: volume_size and job.yaml:{}: input".format(
        lines["on_demand"], lines["volume_size"], lines["input"])
    assert f"{own} are SageMaker's only (--target sagemaker); --target {target} has no equivalent" in r.stderr, r.stderr
    if target != "nodes":  # spares: the nodes' own, said so in the same line
        assert f"job.yaml:{lines['spares']}: spares: not for --target {target} (it runs on the nodes" in r.stderr


def test_every_target_says_what_it_does_with_every_field():
    """Each field is refused, ignored or honoured by each target: never two, never unknown; the
    SageMaker fields are honoured by SageMaker alone; the node shape by every target."""
    from dtrain.launch import targets

    fields = set(jobfile.JobFile.model_fields)
    for name in targets.names():
        t = targets.get(name)
        refused, ignored, honoured = set(t.refused), set(t.ignored), set(t.honoured())
        assert not refused & ignored and refused | ignored <= fields, name
        assert refused | ignored | honoured == fields, name
        assert {"count", "slots", "image", "command", "env", "name"} <= honoured, name
        sm_only = {"role", "on_demand", "max_wait", "volume_size", "input"}
        assert (sm_only <= honoured) == (name == "sagemaker"), name

