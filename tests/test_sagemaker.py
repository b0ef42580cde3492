"""SageMaker: the container's `train` program (pure parts), the CreateTrainingJob request checked
against botocore's model, and `invoke sagemaker run` against moto (S3, SageMaker, CloudWatch Logs).
The container side runs for real in tests/test_sagemaker_rehearsal.py."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import container
from dtrain.launch.jobs.launchers.mpirun import mpirun_argv
from dtrain.launch.jobs.launchers.torchrun import torchrun_argv
from dtrain.launch.remote.hosts import Node
from dtrain.launch.sagemaker import engine as sm

ROOT = Path(__file__).resolve().parent.parent
ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/dtrain/horovod-pytorch:t"


def _load_train():
    spec = importlib.util.spec_from_file_location("sagemaker_train", ROOT / "launch/node/sagemaker_train.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["sagemaker_train"] = mod
    spec.loader.exec_module(mod)
    return mod


train = _load_train()


def _ml(tmp_path: Path, current: str, hosts=("algo-2", "algo-1"), hps=None, channels=("code", "dtrain", "train")):
    (tmp_path / "input/config").mkdir(parents=True)
    (tmp_path / "input/config/resourceconfig.json").write_text(json.dumps(
        {"current_host": current, "hosts": list(hosts), "network_interface_name": "eth0"}))
    (tmp_path / "input/config/hyperparameters.json").write_text(json.dumps(
        hps if hps is not None else sm.hyperparameters(["python", "train.py", "--epochs", "3"], "mpirun", 8)))
    for c in channels:
        (tmp_path / "input/data" / c).mkdir(parents=True)
    return tmp_path


# ---------------------------------------------------------------- the container's `train`


def test_contract_hosts_sorted_and_first_host_runs_the_builders_mpirun(tmp_path):
    c = train.read_contract(_ml(tmp_path, "algo-1"))
    assert c.hosts == ("algo-1", "algo-2") and c.rank == 0 and c.iface == "eth0"
    job = train.job_args(c.hyperparameters, gpus=0)
    assert job == train.JobArgs(("python", "train.py", "--epochs", "3"), "mpirun", 8, "code")
    argv = train.launch_argv(c, job, forward=["SM_MODEL_DIR"])
    assert argv == mpirun_argv([Node("algo-1", 8), Node("algo-2", 8)], ["python", "train.py", "--epochs", "3"],
                                        iface="eth0", forward=["SM_MODEL_DIR"],
                                        ssh=container.ssh_options(attempts=10))


def test_other_hosts_only_serve_ssh_for_mpirun(tmp_path):
    c = train.read_contract(_ml(tmp_path, "algo-2"))
    assert train.launch_argv(c, train.job_args(c.hyperparameters, 0), []) is None


def test_every_host_runs_torchrun_with_its_rank(tmp_path):
    hps = sm.hyperparameters(["python", "main.py", "--resume"], "torchrun", None)
    c = train.read_contract(_ml(tmp_path, "algo-3", hosts=("algo-3", "algo-1", "algo-2"), hps=hps))
    job = train.job_args(c.hyperparameters, gpus=4)
    assert job.slots == 4  # the instance's GPUs
    assert train.launch_argv(c, job, []) == torchrun_argv(3, 2, 4, "algo-1", 29500, ["python", "main.py", "--resume"])


def test_sm_env_like_the_training_toolkit(tmp_path):
    hps = {**sm.hyperparameters(["x"], "mpirun", 1), "lr": "0.1"}
    c = train.read_contract(_ml(tmp_path, "algo-1", hps=hps))
    env = train.sm_env(c, 0, tmp_path)
    assert env["SM_HOSTS"] == '["algo-1", "algo-2"]' and env["SM_CURRENT_HOST"] == "algo-1"
    assert env["SM_MODEL_DIR"] == str(tmp_path / "model")
    assert env["SM_CHANNEL_TRAIN"] == str(tmp_path / "input/data/train")
    assert json.loads(env["SM_CHANNELS"]) == ["code", "train"]  # not the key channel
    assert json.loads(env["SM_HPS"]) == {"lr": "0.1"} and env["SM_HP_LR"] == "0.1"


@pytest.mark.parametrize("rc, hps, message", [
    ({"current_host": "algo-9", "hosts": ["algo-1"]}, None, "current_host 'algo-9' is not in hosts"),
    ({"current_host": "algo-1", "hosts": []}, None, "hosts must be a non-empty list"),
    ({"current_host": "algo-1", "hosts": ["algo-1"]}, {}, "hyperparameter dtrain_command is missing"),
    ({"current_host": "algo-1", "hosts": ["algo-1"]}, {"dtrain_command": "python train.py"}, "expected a non-empty JSON list"),
    ({"current_host": "algo-1", "hosts": ["algo-1"]}, {"dtrain_command": '["x"]', "dtrain_launcher": "srun"},
     "dtrain_launcher: 'srun'"),
])
def test_contract_errors_go_to_the_failure_file(tmp_path, rc, hps, message):
    _ml(tmp_path, "algo-1", hps=hps if hps is not None else sm.hyperparameters(["x"], "mpirun", 1))
    (tmp_path / "input/config/resourceconfig.json").write_text(json.dumps(rc))
    assert train.main(tmp_path) == 2
    assert message in (tmp_path / "output/failure").read_text()


def test_node_program_is_shellcheck_and_entrypoint_runs_it_for_train():
    entry = (ROOT / "launch/node/entrypoint.sh").read_text()
    assert 'set -- python3 /opt/dtrain/node/sagemaker_train.py' in entry
    assert "/opt/ml/input/data/dtrain/id_ed25519" in entry
    subprocess.run(["shellcheck", str(ROOT / "launch/node/entrypoint.sh")], check=True)


def test_image_gets_the_builders_the_train_program_imports():
    """The rendered Dockerfiles' COPY lines to /opt/dtrain/py, .dockerignore and
    build.image_sources() hold exactly the modules sagemaker_train.py imports (at any depth, a
    function's imports too, not a TYPE_CHECKING block's)."""
    from dtrain import contract, shipped
    from dtrain.images import build

    want = {shipped.checkout_path(m) for m in shipped.shipped_modules(contract.NODE_SCRIPTS / "sagemaker_train.py")}
    assert {"launch/jobs/launchers/mpirun.py", "launch/jobs/launchers/torchrun.py", "dtrain/reference.py"} <= want
    assert "launch/jobs/job.py" not in want  # the launchers import it for type checking only
    for dockerfile in sorted((ROOT / "dockerfiles").rglob("Dockerfile")):
        copied = {w for line in dockerfile.read_text().splitlines()
                  if line.startswith("COPY ") and "/opt/dtrain/py/" in line for w in line.split()[1:-1]}
        assert copied == want, dockerfile
    ignore = {line[1:] for line in (ROOT / ".dockerignore").read_text().splitlines()
              if line.startswith("!") and line.endswith(".py")}
    assert ignore == want
    assert set(build.image_sources()) - {"launch/node"} == want


# ---------------------------------------------------------------- the request


def _job(**kw):
    base = dict(name="ddp-imagenet", image="123456789012.dkr.ecr.us-east-1.amazonaws.com/dtrain/pytorch-ddp:t",
                role_arn=ROLE, command=("python", "main.py"), output_s3="s3://my-bucket/dtrain", instances=3,
                instance_type="ml.p3.2xlarge", launcher="torchrun", key_s3="s3://my-bucket/dtrain/j/dtrain/",
                code_s3="s3://my-bucket/dtrain/j/code/", inputs={"imagenet": "s3://bucket/imagenet-data"})
    return sm.TrainingJob(**{**base, **kw})


def test_request_is_valid_for_botocore_with_channels_and_spot():
    req = sm.create_training_job_request(_job(spot=True, checkpoint_s3="s3://my-bucket/dtrain/j/checkpoints/"))
    assert sm.request_problems(req) == []
    assert "ContainerEntrypoint" not in req["AlgorithmSpecification"]  # SageMaker runs `IMAGE train`
    assert [c["ChannelName"] for c in req["InputDataConfig"]] == ["imagenet", "code", "dtrain"]
    assert req["HyperParameters"] == {"dtrain_command": '["python", "main.py"]', "dtrain_launcher": "torchrun",
                                      "dtrain_per_node": "1", "dtrain_workdir": "code"}
    assert req["EnableManagedSpotTraining"] is True
    assert req["StoppingCondition"] == {"MaxRuntimeInSeconds": 86400, "MaxWaitTimeInSeconds": 172800}
    assert req["CheckpointConfig"]["LocalPath"] == "/opt/ml/checkpoints"


def test_botocore_catches_a_broken_request():
    req = sm.create_training_job_request(_job())
    req["ResourceConfig"]["InstanceCount"] = "3"
    req["AlgorithmSpecification"]["TrainingImag"] = "x"
    found = sm.request_problems(req)
    assert any("ResourceConfig.InstanceCount" in p for p in found)
    assert any('Unknown parameter in AlgorithmSpecification: "TrainingImag"' in p for p in found)


def test_request_refusals():
    with pytest.raises(LaunchError, match="spot needs a checkpoint"):
        sm.create_training_job_request(_job(spot=True))
    with pytest.raises(LaunchError, match="needs the job key channel"):
        sm.create_training_job_request(_job(launcher="mpirun", key_s3=None))
    with pytest.raises(LaunchError, match="bad training job name"):
        sm.create_training_job_request(_job(name="under_score"))
    with pytest.raises(LaunchError, match="channel 'dtrain' is taken"):
        sm.parse_inputs(["dtrain=s3://bucket/x"])
    with pytest.raises(LaunchError, match="expected NAME=DIR or NAME=s3://"):
        sm.parse_inputs(["imagenet"])


def test_workdir_honours_gitignore_and_size_limit(tmp_path):
    (tmp_path / "main.py").write_text("print(1)\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data/big.bin").write_bytes(b"x" * 2048)
    (tmp_path / ".gitignore").write_text("data/\n")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    files, size, left_out, links = sm.code_selection(tmp_path)
    assert files == [Path(".gitignore"), Path("main.py")] and left_out == links == []
    assert size == sum((tmp_path / f).stat().st_size for f in files)
    (tmp_path / ".gitignore").write_text("")
    with pytest.raises(LaunchError, match="at data/big.bin; put data in S3"):
        sm.code_selection(tmp_path, max_bytes=1024)
    with pytest.raises(LaunchError, match="over 2 files"):
        sm.code_selection(tmp_path, max_files=2)


# ---------------------------------------------------------------- invoke sagemaker run, against moto


def _workdir(tmp_path: Path) -> Path:
    wd = tmp_path / "work"
    wd.mkdir()
    (wd / "main.py").write_text("print('train')\n")
    (wd / "lib").mkdir()
    (wd / "lib/util.py").write_text("X = 1\n")
    return wd


def test_run_uploads_creates_streams_logs_and_downloads(aws, tmp_path):
    s3, logs = aws.client("s3"), aws.client("logs")
    s3.create_bucket(Bucket="my-bucket")
    name = "dtrain-test-1"
    # What SageMaker itself would do while the job runs: logs per instance (recent: CloudWatch
    # drops events older than 14 days), the model archive.
    logs.create_log_group(logGroupName=sm.LOG_GROUP)
    for host, line in (("algo-1", "epoch 1 loss 0.5"), ("algo-2", "rank 1 ready")):
        logs.create_log_stream(logGroupName=sm.LOG_GROUP, logStreamName=f"{name}/{host}-1700000000")
        logs.put_log_events(logGroupName=sm.LOG_GROUP, logStreamName=f"{name}/{host}-1700000000",
                            logEvents=[{"timestamp": int(time.time() * 1000), "message": line}])
    archive = tmp_path / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as t:
        t.add(_workdir(tmp_path) / "main.py", arcname="model.pt")
    s3.upload_file(str(archive), "my-bucket", f"dtrain/{name}/output/model.tar.gz")

    printed: list[str] = []
    opts = sm.run_options(image="123456789012.dkr.ecr.us-east-1.amazonaws.com/dtrain/horovod-pytorch:t", role_arn=ROLE,
                         command=("python", "main.py"), instances=2, instance_type="ml.g5.12xlarge", name=name,
                         inputs={"train": "s3://my-bucket/data/train"}, spot=True, output_s3="s3://my-bucket/dtrain",
                         workdir=tmp_path / "work", download=tmp_path / "out")
    assert sm.run(opts, session=aws, out=printed.append, poll_s=0) == (name, 0)

    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="my-bucket", Prefix=f"dtrain/{name}/")["Contents"]}
    assert {f"dtrain/{name}/code/main.py", f"dtrain/{name}/code/lib/util.py"} <= keys
    assert f"dtrain/{name}/dtrain/id_ed25519" not in keys  # removed once the job started
    d = aws.client("sagemaker").describe_training_job(TrainingJobName=name)
    assert d["HyperParameters"]["dtrain_command"] == '["python", "main.py"]'
    assert d["HyperParameters"]["dtrain_launcher"] == "mpirun"
    assert d["ResourceConfig"]["InstanceCount"] == 2 and d["EnableManagedSpotTraining"] is True
    assert not any("BEGIN OPENSSH" in v for v in d["HyperParameters"].values())
    assert "[algo-1] epoch 1 loss 0.5" in printed and "[algo-2] rank 1 ready" in printed
    assert (tmp_path / "out" / name / "model.tar.gz").read_bytes() == archive.read_bytes()


def _key_in_s3(s3, key: str) -> bool:
    return s3.list_objects_v2(Bucket="my-bucket", Prefix=key).get("KeyCount", 0) > 0


def test_run_no_wait_waits_for_the_start_and_deletes_the_key(aws, tmp_path):
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="my-bucket")
    opts = sm.run_options(image=IMAGE, role_arn=ROLE, command=("python", "main.py"), instances=2,
                         name="dtrain-nowait", output_s3="s3://my-bucket/x", workdir=_workdir(tmp_path), wait=False)
    printed: list[str] = []
    assert sm.run(opts, session=aws, out=printed.append, poll_s=0) == ("dtrain-nowait", 0)
    assert not _key_in_s3(s3, "x/dtrain-nowait/dtrain/id_ed25519")
    assert any("job key deleted" in line for line in printed)
    assert not any("PRIVATE KEY" in line for line in printed)


class _Progressing:
    """moto's training jobs are Completed at once; a real one passes through SecondaryStatus
    values (a spot one may be interrupted and restarted). This session hands out moto's
    clients, the sagemaker one answering DescribeTrainingJob with the next scripted status,
    and records at each call whether the key was in (moto's) S3 at that moment."""

    def __init__(self, session, statuses, key):
        self.session, self.statuses, self.key, self.seen = session, list(statuses), key, []

    def client(self, name):
        real = self.session.client(name)
        if name != "sagemaker":
            return real
        outer = self

        class Client:
            def __getattr__(self, attr):
                return getattr(real, attr)

            def describe_training_job(self, **kw):
                d = real.describe_training_job(**kw)
                primary, secondary = outer.statuses.pop(0)
                outer.seen.append((secondary, _key_in_s3(outer.session.client("s3"), outer.key)))
                return {**d, "TrainingJobStatus": primary, "SecondaryStatus": secondary}
        return Client()


def test_run_deletes_the_key_once_the_job_has_started_and_hands_it_to_a_spot_restart(aws, tmp_path):
    aws.client("s3").create_bucket(Bucket="my-bucket")
    key = "x/dtrain-spot/dtrain/id_ed25519"
    steps = [("InProgress", "Starting"), ("InProgress", "Downloading"), ("InProgress", "Training"),
             ("InProgress", "Training"), ("InProgress", "Interrupted"), ("InProgress", "Restarting"),
             ("InProgress", "Downloading"), ("InProgress", "Training"), ("Completed", "Completed")]
    session = _Progressing(aws, steps, key)
    opts = sm.run_options(image=IMAGE, role_arn=ROLE, command=("python", "main.py"), instances=2, spot=True,
                         name="dtrain-spot", output_s3="s3://my-bucket/x", workdir=_workdir(tmp_path), download=None)
    assert sm.run(opts, session=session, out=lambda _: None, poll_s=0) == ("dtrain-spot", 0)
    assert session.seen == [("Starting", True), ("Downloading", True), ("Training", True), ("Training", False),
                            ("Interrupted", False), ("Restarting", True), ("Downloading", True),
                            ("Training", True), ("Completed", False)]
    assert not _key_in_s3(aws.client("s3"), key)


def test_key_action():
    d = lambda primary, secondary: {"TrainingJobStatus": primary, "SecondaryStatus": secondary}  # noqa: E731
    assert sm.key_action(True, d("InProgress", "Starting")) is None
    assert sm.key_action(True, d("InProgress", "Downloading")) is None
    assert sm.key_action(True, d("InProgress", "Training")) == "delete"
    assert sm.key_action(True, d("Failed", "Failed")) == "delete"
    assert sm.key_action(False, d("InProgress", "Training")) is None
    assert sm.key_action(False, d("InProgress", "Restarting")) == "put"
    assert sm.key_action(False, d("Stopped", "Interrupted")) is None


def test_run_deletes_the_key_on_an_error(aws, tmp_path):
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="my-bucket")
    seen = []

    def out(line):  # the user's Ctrl-C (or any error) right after the job was created
        if "created training job" in line:
            seen.append(_key_in_s3(s3, "x/dtrain-err/dtrain/id_ed25519"))
            raise KeyboardInterrupt
    opts = sm.run_options(image=IMAGE, role_arn=ROLE, command=("python", "main.py"), instances=2,
                         name="dtrain-err", output_s3="s3://my-bucket/x", workdir=_workdir(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        sm.run(opts, session=aws, out=out, poll_s=0)
    assert seen == [True] and not _key_in_s3(s3, "x/dtrain-err/dtrain/id_ed25519")


def test_task_errors_are_one_line_exit_2():
    r = subprocess.run([sys.executable, "-m", "invoke", "sagemaker", "run", "--image", IMAGE, "--input", "data",
                        "--role", ROLE, "--", "python", "main.py"], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: --input 'data': expected NAME=DIR or NAME=s3://BUCKET/PREFIX (NAME: letters, digits, . - _)"], r.stderr


def test_code_leaves_out_the_output_and_the_data_channels(tmp_path):
    root = tmp_path / "proj"
    for rel in ("train.py", "output/dtrain-1/logs.txt", "output/dtrain-1/model.tar.gz", "data/a.csv", "data2/b.csv",
                "lib/data/c.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    files, _, _, _ = sm.code_selection(root, [root / "output", root / "data", tmp_path / "elsewhere"])
    assert files == [Path("data2/b.csv"), Path("lib/data/c.py"), Path("train.py")]
    assert len(sm.code_selection(root, [root])[0]) == 6  # --download . would not empty the code


def test_a_bad_download_directory_is_refused_before_anything_is_uploaded(aws, tmp_path):
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="my-bucket")
    wd = _workdir(tmp_path)
    for bad in (wd / "main.py", wd / "main.py" / "x"):
        opts = sm.run_options(image=IMAGE, role_arn=ROLE, command=("python", "main.py"), instances=1,
                             name="dtrain-dl", output_s3="s3://my-bucket/x", workdir=wd, download=bad)
        with pytest.raises(LaunchError, match=rf"^--download {bad}: .*main.py is not a directory"):
            sm.run(opts, session=aws, out=lambda m: None, poll_s=0)
    assert "Contents" not in s3.list_objects_v2(Bucket="my-bucket")
    assert aws.client("sagemaker").list_training_jobs()["TrainingJobSummaries"] == []


@pytest.mark.parametrize("launcher, per_node", [("mpirun", False), ("torchrun", True)])
def test_per_node_comes_from_the_launcher_module(tmp_path, launcher, per_node):
    """The node program does not compare launcher names: how hosts take part (every host runs the
    launcher, or the first across all) comes in dtrain_per_node, set from the launcher's module."""
    hps = sm.hyperparameters(["python", "main.py"], launcher, 2)
    assert hps["dtrain_per_node"] == ("1" if per_node else "0")
    c = train.read_contract(_ml(tmp_path, "algo-2", hosts=("algo-1", "algo-2"), hps=hps))
    job = train.job_args(c.hyperparameters, gpus=0)
    assert job.per_node is per_node
    assert (train.launch_argv(c, job, []) is None) is not per_node


def test_bad_per_node_hyperparameter(tmp_path):
    hps = {**sm.hyperparameters(["x"], "mpirun", 1), "dtrain_per_node": "yes"}
    c = train.read_contract(_ml(tmp_path, "algo-1", hps=hps))
    with pytest.raises(train.ContractError, match="dtrain_per_node: 'yes'"):
        train.job_args(c.hyperparameters, gpus=0)
