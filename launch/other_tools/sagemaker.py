"""SageMaker training jobs from dtrain images: `invoke sagemaker run` and `invoke manifest --for sagemaker`.

    TrainingJob (plain values) -> create_training_job_request(job) (pure) -> botocore-validated dict
    run(...): workdir + job key -> S3, CreateTrainingJob, CloudWatch logs until it ends, output

The images are bring-your-own containers: SageMaker runs `IMAGE train` on every instance and
launch/node/sagemaker_train.py reads the dtrain_* hyperparameters this module writes. The job's
ssh key travels in the `dtrain` input channel (an S3 prefix), never in hyperparameters: those
show in the console and in DescribeTrainingJob.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dtrain.launch.errors import LaunchError

KEY_CHANNEL = "dtrain"  # launch/node/sagemaker_train.py and entrypoint.sh read the key from it
CODE_CHANNEL = "code"  # the uploaded workdir; the command runs there
LOG_GROUP = "/aws/sagemaker/TrainingJobs"
TERMINAL = ("Completed", "Failed", "Stopped")
WORKDIR_MAX_BYTES = 100 * 1024 * 1024  # bigger inputs belong in an --input channel
WORKDIR_MAX_FILES = 5000

_JOB_NAME_RE = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")  # CreateTrainingJob's pattern
_CHANNEL_RE = re.compile(r"^[A-Za-z0-9\.\-_]+$")


@dataclass(frozen=True)
class TrainingJob:
    """Everything a CreateTrainingJob request of a dtrain image is made of."""

    name: str
    image: str
    role_arn: str
    command: tuple[str, ...]
    output_s3: str  # S3OutputPath; the job's model.tar.gz lands under it
    instances: int = 1
    instance_type: str = "ml.m5.2xlarge"
    launcher: str = "mpirun"  # mpirun (Horovod images) or torchrun (pytorch-ddp)
    slots: int | None = None  # ranks per instance; None: its GPUs, or 1
    key_s3: str | None = None  # S3 prefix holding id_ed25519 (channel `dtrain`); needed when instances > 1
    code_s3: str | None = None  # S3 prefix of the workdir (channel `code`)
    inputs: Mapping[str, str] = field(default_factory=dict)  # channel -> s3:// prefix
    env: Mapping[str, str] = field(default_factory=dict)
    spot: bool = False
    checkpoint_s3: str | None = None  # with spot: where /opt/ml/checkpoints is kept
    volume_gb: int = 100
    max_runtime_s: int = 86400
    max_wait_s: int | None = None  # spot: default 2 x max_runtime_s
    tags: Mapping[str, str] = field(default_factory=dict)


def check_s3_uri(uri: str, what: str) -> tuple[str, str]:
    """(bucket, key prefix) of s3://bucket/prefix."""
    m = re.fullmatch(r"s3://([a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(?:/(.*))?", uri or "")
    if not m:
        raise LaunchError(f"{what} {uri!r}: expected s3://BUCKET/PREFIX")
    return m.group(1), (m.group(2) or "").strip("/")


def parse_inputs(items: Sequence[str]) -> dict[str, str]:
    """--input NAME=s3://... (repeatable) -> {channel: uri}."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, uri = item.partition("=")
        if not sep or not _CHANNEL_RE.match(name):
            raise LaunchError(f"--input {item!r}: expected NAME=s3://BUCKET/PREFIX (NAME: letters, digits, . - _)")
        if name in (KEY_CHANNEL, CODE_CHANNEL) or name in out:
            raise LaunchError(f"--input {item!r}: channel {name!r} is taken; use another name")
        check_s3_uri(uri, f"--input {name}")
        out[name] = uri
    return out


def hyperparameters(command: Sequence[str], launcher: str, slots: int | None) -> dict[str, str]:
    """What launch/node/sagemaker_train.py reads (strings: SageMaker keeps only strings)."""
    if launcher not in ("mpirun", "torchrun"):
        raise LaunchError(f"--launcher {launcher}: use mpirun or torchrun")
    hps = {"dtrain_command": json.dumps(list(command)), "dtrain_launcher": launcher, "dtrain_workdir": CODE_CHANNEL}
    if slots is not None:
        hps["dtrain_slots"] = str(slots)
    return hps


def default_launcher(image: str) -> str:
    return "torchrun" if "pytorch-ddp" in image else "mpirun"


def _channel(name: str, uri: str) -> dict[str, Any]:
    return {"ChannelName": name, "InputMode": "File",
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": uri,
                                            "S3DataDistributionType": "FullyReplicated"}}}


def create_training_job_request(job: TrainingJob) -> dict[str, Any]:
    """The CreateTrainingJob request (pure). `invoke sagemaker run` sends it; `invoke manifest
    --for sagemaker` prints it. No ContainerEntrypoint: SageMaker runs `IMAGE train`."""
    if not _JOB_NAME_RE.match(job.name):
        raise LaunchError(f"bad training job name {job.name!r} (letters, digits and -, at most 63)")
    if not job.command:
        raise LaunchError("no command: put it after `--`, e.g. invoke sagemaker run ... -- python train.py")
    if job.instances < 1:
        raise LaunchError(f"--instances {job.instances}: must be at least 1")
    if job.instances > 1 and job.launcher == "mpirun" and not job.key_s3:
        raise LaunchError("mpirun across instances needs the job key channel (key_s3)")
    check_s3_uri(job.output_s3, "--output")
    channels = [_channel(k, v) for k, v in job.inputs.items()]
    if job.code_s3:
        channels.append(_channel(CODE_CHANNEL, job.code_s3))
    if job.key_s3:
        channels.append(_channel(KEY_CHANNEL, job.key_s3))
    req: dict[str, Any] = {
        "TrainingJobName": job.name,
        "RoleArn": job.role_arn,
        "AlgorithmSpecification": {"TrainingImage": job.image, "TrainingInputMode": "File"},
        "HyperParameters": hyperparameters(job.command, job.launcher, job.slots),
        "ResourceConfig": {"InstanceCount": job.instances, "InstanceType": job.instance_type,
                           "VolumeSizeInGB": job.volume_gb},
        "OutputDataConfig": {"S3OutputPath": job.output_s3},
        "StoppingCondition": {"MaxRuntimeInSeconds": job.max_runtime_s},
        "Environment": dict(job.env),
        "Tags": [{"Key": "dtrain.job", "Value": job.name}, *({"Key": k, "Value": v} for k, v in job.tags.items())],
    }
    if channels:
        req["InputDataConfig"] = channels
    if job.spot:
        if not job.checkpoint_s3:
            raise LaunchError("--spot needs a checkpoint S3 URI (a spot job may be interrupted and resumed)")
        req["EnableManagedSpotTraining"] = True
        req["CheckpointConfig"] = {"S3Uri": job.checkpoint_s3, "LocalPath": "/opt/ml/checkpoints"}
        req["StoppingCondition"]["MaxWaitTimeInSeconds"] = job.max_wait_s or 2 * job.max_runtime_s
    return req


def request_problems(req: Mapping[str, Any]) -> list[str]:
    """botocore's own check of the request against the service model; [] when valid."""
    import botocore.session
    from botocore.exceptions import ParamValidationError
    from botocore.validate import validate_parameters

    model = botocore.session.get_session().get_service_model("sagemaker").operation_model("CreateTrainingJob")
    try:
        validate_parameters(dict(req), model.input_shape)
    except ParamValidationError as e:
        report = str(e.kwargs.get("report", e))
        return [line.strip() for line in report.splitlines() if line.strip()]
    return []


# ---------------------------------------------------------------- workdir, key (local side)


def workdir_files(root: Path) -> list[Path]:
    """The files to upload, relative to root: git's view (tracked and untracked, .gitignore
    honoured) inside a git work tree, else every file but .git/ and __pycache__/."""
    try:
        r = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, text=True, timeout=60)
    except OSError:
        r = None
    if r is not None and r.returncode == 0:
        files = [Path(p) for p in r.stdout.split("\0") if p]
        return sorted(p for p in files if (root / p).is_file())
    skip = {".git", "__pycache__"}
    return sorted(p.relative_to(root) for p in root.rglob("*")
                  if p.is_file() and not skip & set(p.relative_to(root).parts))


def check_workdir(root: Path, files: Sequence[Path], max_bytes: int = WORKDIR_MAX_BYTES,
                  max_files: int = WORKDIR_MAX_FILES) -> int:
    total = sum((root / f).stat().st_size for f in files)
    if len(files) > max_files or total > max_bytes:
        raise LaunchError(f"--workdir {root}: {len(files)} files, {total / 2**20:.0f} MiB (limit {max_files} files, "
                          f"{max_bytes / 2**20:.0f} MiB); put data in S3 and pass it with --input NAME=s3://...")
    return total


def make_key(directory: Path) -> Path:
    """A fresh ed25519 key pair for one job, in a 0700 directory; returns the private key's path."""
    directory.chmod(0o700)
    key = directory / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dtrain-sagemaker", "-f", str(key)],
                   check=True, capture_output=True)
    return key


# ---------------------------------------------------------------- AWS side effects


def upload(s3, root: Path, files: Sequence[Path], bucket: str, prefix: str) -> None:
    for f in files:
        s3.upload_file(str(root / f), bucket, f"{prefix}/{f.as_posix()}")


def log_lines(logs, job: str, tokens: dict[str, str | None]) -> Iterator[str]:
    """New lines of every log stream of the job (one per instance: JOB/algo-N-...), prefixed."""
    try:
        streams = logs.describe_log_streams(logGroupName=LOG_GROUP, logStreamNamePrefix=f"{job}/")["logStreams"]
    except logs.exceptions.ResourceNotFoundException:
        return
    for s in streams:
        name = s["logStreamName"]
        while True:
            kw: dict[str, Any] = {"logGroupName": LOG_GROUP, "logStreamName": name, "startFromHead": True}
            if tokens.get(name):
                kw["nextToken"] = tokens[name]
            r = logs.get_log_events(**kw)
            for e in r["events"]:
                yield f"[{name.split('/', 1)[-1].rsplit('-', 1)[0]}] {e['message']}"
            if r.get("nextForwardToken") in (None, tokens.get(name)):
                break
            tokens[name] = r["nextForwardToken"]
            if not r["events"]:
                break


def wait(sm, logs, job: str, out: Callable[[str], None] = print, poll_s: float = 10.0) -> dict[str, Any]:
    """Print the job's CloudWatch logs until it ends; returns the last DescribeTrainingJob."""
    tokens: dict[str, str | None] = {}
    last = None
    while True:
        d = sm.describe_training_job(TrainingJobName=job)
        status = (d["TrainingJobStatus"], d.get("SecondaryStatus"))
        if status != last:
            out(f"[sagemaker] {job}: {status[0]} ({status[1]})")
            last = status
        for line in log_lines(logs, job, tokens):
            out(line)
        if d["TrainingJobStatus"] in TERMINAL:
            return d
        time.sleep(poll_s)


def download_output(s3, d: Mapping[str, Any], dest: Path) -> list[Path]:
    """The job's model.tar.gz (and output.tar.gz beside it, when the job wrote /opt/ml/output/data)."""
    uri = (d.get("ModelArtifacts") or {}).get("S3ModelArtifacts")
    if not uri:
        return []
    bucket, key = check_s3_uri(uri, "ModelArtifacts")
    dest.mkdir(parents=True, exist_ok=True)
    got = []
    for k in (key, key.rsplit("/", 1)[0] + "/output.tar.gz"):
        target = dest / k.rsplit("/", 1)[-1]
        try:
            s3.download_file(bucket, k, str(target))
        except Exception as e:  # noqa: BLE001 -- botocore ClientError (404) or S3 transfer errors
            if k == key:
                raise LaunchError(f"cannot download {uri}: {e}") from None
            continue
        got.append(target)
    return got


def default_output(session) -> str:
    """s3://sagemaker-REGION-ACCOUNT/dtrain, as the SageMaker SDK's default bucket (created if absent)."""
    account = session.client("sts").get_caller_identity()["Account"]
    bucket = f"sagemaker-{session.region_name}-{account}"
    s3 = session.client("s3")
    try:
        s3.head_bucket(Bucket=bucket)
    except Exception:  # noqa: BLE001 -- absent: make it, as the SDK does
        kw = {} if session.region_name == "us-east-1" else {
            "CreateBucketConfiguration": {"LocationConstraint": session.region_name}}
        s3.create_bucket(Bucket=bucket, **kw)
    return f"s3://{bucket}/dtrain"


def check_job_name(flag: str, name: str) -> str:
    """CreateTrainingJob's pattern: letters, digits and '-', starting alphanumeric, at most 63."""
    if not _JOB_NAME_RE.match(name):
        raise LaunchError(f"{flag} {name[:80]!r}: expected letters, digits and '-', starting with a letter "
                          "or digit, at most 63 (SageMaker's training job names)")
    return name


def job_name(now: float | None = None) -> str:
    return "dtrain-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))


@dataclass(frozen=True)
class RunOptions:
    image: str
    role_arn: str
    command: tuple[str, ...]
    instances: int = 1
    instance_type: str = "ml.m5.2xlarge"
    name: str | None = None
    launcher: str | None = None  # default by image family
    slots: int | None = None
    inputs: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    spot: bool = False
    output_s3: str | None = None  # default s3://sagemaker-REGION-ACCOUNT/dtrain
    workdir: Path = Path(".")
    download: Path | None = Path("output")  # None: do not download
    wait: bool = True
    volume_gb: int = 100
    max_runtime_s: int = 86400


def run(opts: RunOptions, session=None, out: Callable[[str], None] = print, poll_s: float = 10.0) -> tuple[str, int]:
    """`invoke sagemaker run`: returns (job name, exit code: 0 Completed, 1 otherwise / not waited)."""
    import boto3

    from dtrain import values

    if not opts.role_arn:
        raise LaunchError("--role is required (the SageMaker execution role ARN)")
    if not opts.image:
        raise LaunchError("--image is required (an ECR image built and pushed here)")
    values.image("--image", opts.image)  # before anything is uploaded
    values.instance_type("--instance-type", opts.instance_type, sagemaker=True)
    session = session or boto3.session.Session()
    name = opts.name or job_name()
    output = (opts.output_s3 or default_output(session)).rstrip("/")
    bucket, prefix = check_s3_uri(output, "--output")
    base = f"{prefix}/{name}" if prefix else name
    root = Path(opts.workdir).resolve()
    if not root.is_dir():
        raise LaunchError(f"--workdir {root}: not a directory")
    files = workdir_files(root)
    size = check_workdir(root, files)
    launcher = opts.launcher or default_launcher(opts.image)
    job = TrainingJob(name=name, image=opts.image, role_arn=opts.role_arn, command=opts.command,
                      output_s3=output, instances=opts.instances, instance_type=opts.instance_type,
                      launcher=launcher, slots=opts.slots, key_s3=f"s3://{bucket}/{base}/{KEY_CHANNEL}/",
                      code_s3=f"s3://{bucket}/{base}/{CODE_CHANNEL}/" if files else None,
                      inputs=opts.inputs, env=opts.env, spot=opts.spot,
                      checkpoint_s3=f"s3://{bucket}/{base}/checkpoints/" if opts.spot else None,
                      volume_gb=opts.volume_gb, max_runtime_s=opts.max_runtime_s)
    req = create_training_job_request(job)
    found = request_problems(req)
    if found:
        raise LaunchError("CreateTrainingJob request: " + "; ".join(found))
    s3, sm, logs = session.client("s3"), session.client("sagemaker"), session.client("logs")
    out(f"[sagemaker] uploading {len(files)} files ({size / 2**20:.1f} MiB) of {root} to s3://{bucket}/{base}/code/")
    upload(s3, root, files, bucket, f"{base}/{CODE_CHANNEL}")
    with tempfile.TemporaryDirectory(prefix="dtrain-sm-") as tmp:
        key = make_key(Path(tmp))
        s3.upload_file(str(key), bucket, f"{base}/{KEY_CHANNEL}/id_ed25519",
                       ExtraArgs={"ServerSideEncryption": "AES256"})
    sm.create_training_job(**req)
    out(f"[sagemaker] created training job {name} ({opts.instances} x {opts.instance_type}, {launcher})")
    if not opts.wait:
        return name, 0
    d = wait(sm, logs, name, out, poll_s)
    # The key is only needed while the job runs: remove it (a resumed spot job restarts within the job).
    s3.delete_object(Bucket=bucket, Key=f"{base}/{KEY_CHANNEL}/id_ed25519")
    if d["TrainingJobStatus"] != "Completed":
        out(f"[sagemaker] {name} {d['TrainingJobStatus']}: {d.get('FailureReason', 'no reason given')}")
        return name, 1
    if opts.download is not None:
        for p in download_output(s3, d, Path(opts.download) / name):
            out(f"[sagemaker] downloaded {p}")
    return name, 0


def env_pairs(items: Sequence[str]) -> dict[str, str]:
    from dtrain import values

    out = {}
    for kv in items:
        try:
            k, v = values.env_pair("--env", kv)
        except values.BadValue as e:
            raise LaunchError(str(e)) from None
        out[k] = v
    return out

