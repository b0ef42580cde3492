"""`sagemaker run`'s flags from issue 23 (seed 003, simple-sagemaker): --volume-size, --max-run,
--input NAME=DIR, --metric, --task/--state-dir, --from-job, spot by default (--on-demand), the
log kept under the download directory, and requirements.txt installed in the container (cached
in the state directory). The request is checked by botocore; AWS is moto."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import boto3
import pytest

from dtrain.launch.errors import LaunchError
from dtrain.launch.sagemaker import engine as sm
from test_sagemaker import ROLE, _job, _ml, train

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/dtrain/pytorch-ddp:2.13.0-cpu-py311-debian12"


# ---------------------------------------------------------------- flags (pure)


@pytest.mark.parametrize("text, seconds", [("7200", 7200), ("2h", 7200), ("90m", 5400), ("1h30m", 5400),
                                           ("1d", 86400), ("45s", 45), (" 2H ", 7200)])
def test_max_run_durations(text, seconds):
    assert sm.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["0", "", "2 hours", "-5", "1.5h", "h", "29d", "2h-1m"])
def test_max_run_refusals(text):
    with pytest.raises(LaunchError, match="--max-run .*expected seconds or a duration like 2h"):
        sm.parse_duration(text)


def test_metrics_become_metric_definitions_botocore_accepts():
    metrics = sm.parse_metrics(["loss=loss: ([0-9.]+)", r"top1=\* Acc@1 (\S+)"])
    assert metrics == [{"Name": "loss", "Regex": "loss: ([0-9.]+)"}, {"Name": "top1", "Regex": r"\* Acc@1 (\S+)"}]
    req = sm.create_training_job_request(_job(metrics=metrics))
    assert req["AlgorithmSpecification"]["MetricDefinitions"] == metrics
    assert sm.request_problems(req) == []
    assert "MetricDefinitions" not in sm.create_training_job_request(_job())["AlgorithmSpecification"]


@pytest.mark.parametrize("item, message", [
    ("loss", "expected NAME=REGEX"),
    ("loss=loss: [0-9.]+", "needs a group around the value"),
    ("loss=loss: ([0-9.]+", "does not compile"),
])
def test_metric_refusals(item, message):
    with pytest.raises(LaunchError, match=message):
        sm.parse_metrics([item])
    with pytest.raises(LaunchError, match="given twice"):
        sm.parse_metrics(["a=(x)", "a=(y)"])


def test_inputs_local_directories_and_s3(tmp_path):
    (tmp_path / "data").mkdir()
    got = sm.parse_inputs(["train=data", "imagenet=s3://bucket/imagenet-data"], base=tmp_path)
    assert got == {"train": str(tmp_path / "data"), "imagenet": "s3://bucket/imagenet-data"}
    with pytest.raises(LaunchError, match="is not a directory"):
        sm.parse_inputs(["train=nothere"], base=tmp_path)
    with pytest.raises(LaunchError, match="channel 'code' is taken"):
        sm.parse_inputs(["code=data"], base=tmp_path)
    with pytest.raises(LaunchError, match="channel 'train' is taken"):
        sm.parse_inputs(["train=data", "train=s3://bucket/x"], base=tmp_path)


def test_from_job_channels():
    assert sm.parse_from_jobs(["dtrain-prep-1"], {}) == {"previous": "dtrain-prep-1"}
    assert sm.parse_from_jobs(["data=prep", "model=pretrain"], {}) == {"data": "prep", "model": "pretrain"}
    with pytest.raises(LaunchError, match="channel 'data' is taken"):
        sm.parse_from_jobs(["data=prep"], {"data": "s3://b/x"})
    with pytest.raises(LaunchError, match="is not a training job name"):
        sm.parse_from_jobs(["under_score"], {})


def test_task_name_and_state_uri(tmp_path):
    assert sm.task_name(None, tmp_path / "My Project!") == "My-Project"
    assert sm.task_name("imagenet-3node", tmp_path) == "imagenet-3node"
    with pytest.raises(LaunchError, match="--task"):
        sm.task_name("a/b", tmp_path)
    assert sm.state_uri("s3://b/dtrain/", "imagenet") == "s3://b/dtrain/state/imagenet/"


def test_on_demand_keeps_the_state_directory_spot_waits_at_least_the_run_time():
    state = "s3://my-bucket/dtrain/state/t/"
    req = sm.create_training_job_request(_job(checkpoint_s3=state, volume_gb=280, max_runtime_s=7200))
    assert "EnableManagedSpotTraining" not in req and req["CheckpointConfig"] == {
        "S3Uri": state, "LocalPath": "/opt/ml/checkpoints"}
    assert req["ResourceConfig"]["VolumeSizeInGB"] == 280
    assert req["StoppingCondition"] == {"MaxRuntimeInSeconds": 7200}
    spot = sm.create_training_job_request(_job(checkpoint_s3=state, spot=True, max_runtime_s=7200))
    assert spot["StoppingCondition"] == {"MaxRuntimeInSeconds": 7200, "MaxWaitTimeInSeconds": 14400}
    assert sm.request_problems(spot) == []
    with pytest.raises(LaunchError, match="MaxWaitTimeInSeconds 3600 must be at least the run time 7200"):
        sm.create_training_job_request(_job(checkpoint_s3=state, spot=True, max_runtime_s=7200, max_wait_s=3600))


def test_instance_type_checked_against_botocores_list():
    assert any("'ml.p3.2xlarg' is not a SageMaker training instance type" in p
               for p in sm.request_problems(sm.create_training_job_request(_job(instance_type="ml.p3.2xlarg"))))


# ---------------------------------------------------------------- run, against moto


def test_run_uploads_data_chains_a_job_keeps_state_and_the_log(aws, tmp_path):
    s3, logs = aws.client("s3"), aws.client("logs")
    s3.create_bucket(Bucket="my-bucket")
    work = tmp_path / "imagenet"
    work.mkdir()
    (work / "main.py").write_text("print('train')\n")
    data = tmp_path / "data"
    (data / "val").mkdir(parents=True)
    (data / "train.tar").write_bytes(b"t" * 10)
    (data / "val/0.tar").write_bytes(b"v" * 10)
    base = dict(image=IMAGE, role_arn=ROLE, command=("python", "main.py"), output_s3="s3://my-bucket/dtrain",
                workdir=work, download=tmp_path / "out")
    sm.run(sm.run_options(**base, name="prep", wait=False), session=aws, out=lambda _: None)
    name = "train-1"
    logs.create_log_group(logGroupName=sm.LOG_GROUP)
    logs.create_log_stream(logGroupName=sm.LOG_GROUP, logStreamName=f"{name}/algo-1-1700000000")
    logs.put_log_events(logGroupName=sm.LOG_GROUP, logStreamName=f"{name}/algo-1-1700000000",
                        logEvents=[{"timestamp": int(time.time() * 1000), "message": "Acc@1 46.340"}])
    s3.put_object(Bucket="my-bucket", Key=f"dtrain/{name}/output/model.tar.gz", Body=b"model")  # SageMaker's part
    printed: list[str] = []
    opts = sm.run_options(**base, name=name, instances=3, inputs={"data": str(data)}, from_jobs={"previous": "prep"},
                         volume_gb=280, max_runtime_s=3600, metrics=[{"Name": "top1", "Regex": r"Acc@1 (\S+)"}])
    assert sm.run(opts, session=aws, out=printed.append, poll_s=0) == (name, 0)

    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="my-bucket", Prefix=f"dtrain/{name}/input/")["Contents"]}
    assert keys == {f"dtrain/{name}/input/data/train.tar", f"dtrain/{name}/input/data/val/0.tar"}
    d = aws.client("sagemaker").describe_training_job(TrainingJobName=name)
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in d["InputDataConfig"]}
    assert channels["data"] == f"s3://my-bucket/dtrain/{name}/input/data/"
    assert channels["previous"] == "s3://my-bucket/dtrain/prep/output/"  # prep's model.tar.gz is there
    assert d["EnableManagedSpotTraining"] is True  # spot by default
    assert d["CheckpointConfig"] == {"S3Uri": "s3://my-bucket/dtrain/state/imagenet/", "LocalPath": "/opt/ml/checkpoints"}
    assert d["ResourceConfig"]["VolumeSizeInGB"] == 280 and d["ResourceConfig"]["InstanceCount"] == 3
    assert d["StoppingCondition"] == {"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 7200}
    log = (tmp_path / "out" / name / "logs.txt").read_text().splitlines()
    assert "[algo-1] Acc@1 46.340" in log and log == [line for line in printed if line in log]
    assert f"[sagemaker] {name}: Completed (Completed)" in log


def test_run_refuses_before_uploading(aws, tmp_path):
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="my-bucket")
    work = tmp_path / "w"
    work.mkdir()
    (work / "main.py").write_text("x\n")
    base = dict(image=IMAGE, role_arn=ROLE, command=("python", "main.py"), output_s3="s3://my-bucket/dtrain",
                workdir=work, wait=False)
    with pytest.raises(LaunchError, match="'ml.p3.2xlarg' is not a SageMaker training instance type"):
        sm.run(sm.run_options(**base, name="typo", instance_type="ml.p3.2xlarg"), session=aws, out=lambda _: None)
    with pytest.raises(LaunchError, match="--from-job previous=nosuchjob: cannot describe the job"):
        sm.run(sm.run_options(**base, name="chain", from_jobs={"previous": "nosuchjob"}), session=aws, out=lambda _: None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(LaunchError, match="the directory has no files"):
        sm.run(sm.run_options(**base, name="empty", inputs={"d": str(tmp_path / "empty")}), session=aws,
               out=lambda _: None)
    assert "Contents" not in s3.list_objects_v2(Bucket="my-bucket")


def test_run_on_demand_with_a_named_task_and_state_dir(aws, tmp_path):
    aws.client("s3").create_bucket(Bucket="my-bucket")
    work = tmp_path / "w"
    work.mkdir()
    (work / "main.py").write_text("x\n")
    base = dict(image=IMAGE, role_arn=ROLE, command=("python", "main.py"), output_s3="s3://my-bucket/dtrain",
                workdir=work, wait=False, spot=False)
    sm.run(sm.run_options(**base, name="od-1", task="imagenet-1-node"), session=aws, out=lambda _: None)
    sm.run(sm.run_options(**base, name="od-2", state_s3="s3://my-bucket/keep/"), session=aws, out=lambda _: None)
    describe = aws.client("sagemaker").describe_training_job
    first, second = describe(TrainingJobName="od-1"), describe(TrainingJobName="od-2")
    assert not first.get("EnableManagedSpotTraining") and "MaxWaitTimeInSeconds" not in first["StoppingCondition"]
    assert first["CheckpointConfig"]["S3Uri"] == "s3://my-bucket/dtrain/state/imagenet-1-node/"
    assert second["CheckpointConfig"]["S3Uri"] == "s3://my-bucket/keep/"


@pytest.mark.parametrize("flags, message", [
    (["--max-run", "2 hours"], "error: --max-run '2 hours': expected seconds or a duration like 2h"),
    (["--volume-size", "0"], "error: --volume-size '0': expected a whole number from 1 to 16384"),
    (["--metric", "loss=loss: [0-9]+"], "error: --metric loss: the regex needs a group around the value"),
    (["--input", "data=nothere"], "error: --input 'data=nothere': "),
])
def test_task_flag_errors_are_one_line(tmp_path, flags, message):
    r = subprocess.run([sys.executable, "-m", "dtrain", "sagemaker", "run", "--image", IMAGE, "--role", ROLE, *flags,
                        "--", "python", "main.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(message), r.stderr


# ---------------------------------------------------------------- requirements.txt in the container


def _wheel(directory: Path, name: str = "tinypkg", version: str = "1.0") -> Path:
    """A pure-Python wheel made by hand (no index, no network)."""
    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n",
             f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{name}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                  "Tag: py3-none-any\n"}
    record = [f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b'=').decode()},"
              f"{len(t.encode())}" for p, t in files.items()]
    files[f"{name}-{version}.dist-info/RECORD"] = "\n".join([*record, f"{name}-{version}.dist-info/RECORD,,"]) + "\n"
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, t in files.items():
            z.writestr(p, t)
    return path


def test_requirements_installed_once_then_from_the_state_directory(tmp_path):
    code, state = tmp_path / "code", tmp_path / "state"
    wheels = code / "wheels"
    wheels.mkdir(parents=True)
    _wheel(wheels)
    (code / "requirements.txt").write_text("./wheels/tinypkg-1.0-py3-none-any.whl\n")  # the workdir's path
    env = {**os.environ, "PIP_NO_INDEX": "1"}
    site = train.install_requirements(code, state, env)
    assert site is not None and site.parent == state / ".dtrain/requirements" and (site / ".complete").is_file()
    r = subprocess.run([sys.executable, "-c", "import tinypkg; print(tinypkg.VERSION)"], capture_output=True,
                       text=True, env=train.with_pythonpath(env, str(site)), cwd=tmp_path)
    assert r.stdout.strip() == "1.0", r.stderr
    # Warm: no pip at all (the wheel is gone and the "python" would fail), same directory.
    (wheels / "tinypkg-1.0-py3-none-any.whl").unlink()
    assert train.install_requirements(code, state, env, python="/bin/false") == site
    # Other requirements: another directory.
    (code / "requirements.txt").write_text(f"{_wheel(wheels, version='2.0')}\n")
    assert train.install_requirements(code, state, env) != site
    assert train.install_requirements(tmp_path / "nothing", state, env) is None
    (code / "requirements.txt").write_text("# nothing yet\n")
    assert (train.install_requirements(code, state, env) / ".complete").is_file()


def test_requirements_failure_is_one_line_naming_the_file(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "requirements.txt").write_text("no-such-package-dtrain-test==1.0\n")
    with pytest.raises(train.ContractError) as e:
        train.install_requirements(code, tmp_path / "state", {**os.environ, "PIP_NO_INDEX": "1"})
    text = str(e.value)
    assert "\n" not in text and text.startswith(f"{code}/requirements.txt: pip install failed (exit code 1): ERROR:")
    assert not list((tmp_path / "state").rglob(".complete"))


def test_train_fails_before_the_command_when_pip_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    ml = _ml(tmp_path, "algo-1", hosts=("algo-1",))
    (ml / "input/data/code/requirements.txt").write_text("no-such-package-dtrain-test==1.0\n")
    assert train.main(ml) == 2
    assert "requirements.txt: pip install failed" in (ml / "output/failure").read_text()


# ---------------------------------------------------------------- the command, from a user's directory


def _recorded_create_training_job(moto_server: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(f"{moto_server}/moto-api/recorder/download-recording", timeout=30) as r:
        entries = [json.loads(line) for line in r.read().decode().splitlines() if line.strip()]
    found = [e for e in entries if e["headers"].get("X-Amz-Target", "").endswith(".CreateTrainingJob")]
    assert len(found) == 1, [e["headers"].get("X-Amz-Target") for e in entries]
    body = found[0]["body"]
    return json.loads(base64.b64decode(body) if found[0]["body_encoded"] else body)


def documented_sagemaker_run() -> list[str]:
    """The `dtrain sagemaker run` line of docs/other-tools.md (argv after `dtrain`), with this
    test's image and role for its placeholders."""
    import re
    import shlex

    text = (ROOT / "docs" / "other-tools.md").read_text()
    block = text.split("```sh\ncd ~/imagenet", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    [line] = [ln for ln in block.splitlines() if ln.startswith("dtrain sagemaker run")]
    line = line.replace("$ECR/dtrain/pytorch-ddp:TAG", IMAGE).replace("arn:aws:iam::ACCOUNT:role/SageMakerRole", ROLE)
    assert "$" not in line and "ACCOUNT" not in line, line
    return shlex.split(re.sub(r"\s#.*$", "", line))[1:]


def test_dtrain_sagemaker_run_with_requirements_data_and_3_instances(tmp_path, moto_server, monkeypatch):
    """Issue 23's done-when: `python -m dtrain sagemaker run` from a directory that is not the
    checkout, with requirements.txt, a local data directory and 3 instances; the request that
    reached the (moto) service is the one botocore's model accepts."""
    import urllib.request

    monkeypatch.chdir(tmp_path)  # moto's recording file lands here
    urllib.request.urlopen(urllib.request.Request(f"{moto_server}/moto-api/recorder/start-recording", method="POST"),
                           timeout=30).close()
    s3 = boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    s3.create_bucket(Bucket="proj-bucket")
    project = tmp_path / "imagenet"
    (project / "data/train").mkdir(parents=True)
    (project / "main.py").write_text("print('train')\n")
    (project / "requirements.txt").write_text("six\n")
    (project / ".gitignore").write_text("data/\n")
    (project / "data/train/0.tar").write_bytes(b"x" * 100)
    env = {"AWS_ENDPOINT_URL": moto_server, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
           "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "PYTHONPATH": str(ROOT),
           # 3 x ml.p3.2xlarge is above the default $10/h: no terminal here to ask (issue 49)
           "DTRAIN_CONFIRM_ABOVE": "100"}
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    argv = documented_sagemaker_run()  # docs/other-tools.md's example, its placeholders filled in
    cut = argv.index("--")
    argv = [*argv[:cut], "--output", "s3://proj-bucket/dtrain", "--name", "imagenet-3-nodes", "--no-wait", *argv[cut:]]
    r = subprocess.run([sys.executable, "-m", "dtrain", *argv], cwd=project, capture_output=True, text=True,
                       timeout=120, env={**os.environ, **env})
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == "imagenet-3-nodes"
    assert "[price] 3 x ml.p3.2xlarge managed spot, at most: $11.475/h (AWS price list snapshot of " in r.stdout

    try:
        req = _recorded_create_training_job(moto_server)
    finally:  # the recorder is process-wide: later in-process moto tests must not record (nor into a file)
        for action in ("stop-recording", "reset-recording"):
            urllib.request.urlopen(urllib.request.Request(f"{moto_server}/moto-api/recorder/{action}", method="POST"),
                                   timeout=30).close()
    assert sm.request_problems(req) == []
    assert req["ResourceConfig"] == {"InstanceCount": 3, "InstanceType": "ml.p3.2xlarge", "VolumeSizeInGB": 280}
    assert req["StoppingCondition"] == {"MaxRuntimeInSeconds": 43200, "MaxWaitTimeInSeconds": 86400}
    assert req["EnableManagedSpotTraining"] is True
    assert req["CheckpointConfig"] == {"S3Uri": "s3://proj-bucket/dtrain/state/imagenet/",
                                       "LocalPath": "/opt/ml/checkpoints"}
    assert req["AlgorithmSpecification"]["MetricDefinitions"] == [{"Name": "top1", "Regex": r"Acc@1 (\S+)"}]
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in req["InputDataConfig"]}
    prefix = "s3://proj-bucket/dtrain/imagenet-3-nodes"
    assert channels == {"data": f"{prefix}/input/data/", "code": f"{prefix}/code/", "dtrain": f"{prefix}/dtrain/"}
    assert json.loads(req["HyperParameters"]["dtrain_command"]) == ["python", "main.py", "--epochs", "10", "--resume",
                                                                    "/opt/ml/checkpoints/checkpoint.pth.tar"]
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="proj-bucket", Prefix="dtrain/imagenet-3-nodes/")["Contents"]}
    assert {"dtrain/imagenet-3-nodes/code/main.py", "dtrain/imagenet-3-nodes/code/requirements.txt",
            "dtrain/imagenet-3-nodes/input/data/train/0.tar"} <= keys
    assert not any(k.startswith("dtrain/imagenet-3-nodes/code/data/") for k in keys)  # gitignored: a channel instead
