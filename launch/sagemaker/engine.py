"""SageMaker training jobs from dtrain images: `dtrain sagemaker run` and `dtrain manifest --for sagemaker`.

    TrainingJob (plain values) -> create_training_job_request(job) (pure) -> botocore-validated dict
    run(...): workdir + job key -> S3, CreateTrainingJob, CloudWatch logs until it ends, output

The images are bring-your-own containers: SageMaker runs `IMAGE train` on every instance and
launch/node/sagemaker_train.py reads the dtrain_* hyperparameters this module writes. The job's
ssh key travels in the `dtrain` input channel (an S3 prefix), never in hyperparameters: those
show in the console and in DescribeTrainingJob.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dtrain import contract
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import launchers
from dtrain.launch.jobs.jobfile import launch_default
from dtrain.launch.sagemaker.defaults import DEFAULT_MAX_RUN, DEFAULT_PROJECT, RUN_DEFAULTS  # noqa: F401

KEY_CHANNEL = "dtrain"  # launch/node/sagemaker_train.py and entrypoint.sh read the key from it
CODE_CHANNEL = "code"  # the uploaded workdir; the command runs there
DEPS_CHANNEL = "deps"  # --dependencies DIR: DIR's name under it; the channel goes on PYTHONPATH
ROLE_NAME = "dtrain-sagemaker"  # --create-role makes it; without --role it is looked up
TASK_TAG, PROJECT_TAG, DIGEST_TAG = "dtrain:task", "dtrain:project", "dtrain:digest"
MAX_TAGS = 50  # CreateTrainingJob's limit, dtrain's own four included
FROM_JOB_CHANNEL = "previous"  # --from-job JOB without NAME=
MAX_RETRIES = 30  # RetryStrategy.MaximumRetryAttempts' most (the service's bound)
STATE_LOCAL = "/opt/ml/checkpoints"  # the state directory inside the job (CheckpointConfig.LocalPath)
MAX_RUN_S = 28 * 24 * 3600  # CreateTrainingJob's limit on MaxRuntimeInSeconds
LOG_GROUP = "/aws/sagemaker/TrainingJobs"
TERMINAL = ("Completed", "Failed", "Stopped")
WORKDIR_MAX_BYTES = 100 * 1024 * 1024  # bigger inputs belong in an --input channel
WORKDIR_MAX_FILES = 5000

_JOB_NAME_RE = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")  # CreateTrainingJob's pattern
_CHANNEL_RE = re.compile(r"^[A-Za-z0-9\.\-_]+$")
_TASK_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_DURATION_RE = re.compile(r"(\d+)([dhms])")
_UNIT_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}




@dataclass(frozen=True)
class TrainingJob:
    """Everything a CreateTrainingJob request of a dtrain image is made of."""

    name: str
    image: str
    role_arn: str
    command: tuple[str, ...]
    output_s3: str  # S3OutputPath; the job's model.tar.gz lands under it
    instances: int = 1
    instance_type: str = RUN_DEFAULTS["instance_type"]
    launcher: str = launch_default("launcher")  # mpirun (Horovod images) or torchrun (pytorch-ddp)
    slots: int | None = None  # ranks per instance; None: its GPUs, or 1
    key_s3: str | None = None  # S3 prefix holding id_ed25519 (channel `dtrain`); needed when instances > 1
    code_s3: str | None = None  # S3 prefix of the workdir (channel `code`)
    deps_s3: str | None = None  # S3 prefix of the --dependencies (channel `deps`, put on PYTHONPATH)
    inputs: Mapping[str, str] = field(default_factory=dict)  # channel -> s3:// prefix
    env: Mapping[str, str] = field(default_factory=dict)
    spot: bool = False
    checkpoint_s3: str | None = None  # the state directory: S3 <-> /opt/ml/checkpoints (needed with spot)
    volume_gb: int = RUN_DEFAULTS["volume_gb"]
    max_runtime_s: int = RUN_DEFAULTS["max_runtime_s"]
    max_wait_s: int | None = None  # spot: default 2 x max_runtime_s
    retries: int = 0  # RetryStrategy.MaximumRetryAttempts (launch's max_restarts); 0: none
    tags: Mapping[str, str] = field(default_factory=dict)
    metrics: Sequence[Mapping[str, str]] = ()  # MetricDefinitions: {"Name", "Regex"}


def check_s3_uri(uri: str, what: str) -> tuple[str, str]:
    """(bucket, key prefix) of s3://bucket/prefix."""
    m = re.fullmatch(r"s3://([a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(?:/(.*))?", uri or "")
    if not m:
        raise LaunchError(f"{what} {uri!r}: expected s3://BUCKET/PREFIX")
    return m.group(1), (m.group(2) or "").strip("/")


def _check_channel(flag: str, item: str, name: str, taken: Mapping[str, str]) -> None:
    if not _CHANNEL_RE.match(name):
        raise LaunchError(f"{flag} {item!r}: channel name {name!r}: use letters, digits, . - _")
    if name in (KEY_CHANNEL, CODE_CHANNEL, DEPS_CHANNEL) or name in taken:
        raise LaunchError(f"{flag} {item!r}: channel {name!r} is taken; use another name")


def parse_inputs(items: Sequence[str], base: Path = Path(".")) -> dict[str, str]:
    """--input NAME=s3://... or NAME=DIR (repeatable) -> {channel: s3 uri or absolute local directory}.
    A local directory is uploaded by `run` and the channel points at the upload."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise LaunchError(f"--input {item!r}: expected NAME=DIR or NAME=s3://BUCKET/PREFIX "
                              "(NAME: letters, digits, . - _)")
        _check_channel("--input", item, name, out)
        if value.startswith("s3://"):
            check_s3_uri(value, f"--input {name}")
            out[name] = value
            continue
        d = (base / value).resolve()
        if not d.is_dir():
            raise LaunchError(f"--input {item!r}: {d} is not a directory (give a local directory or s3://BUCKET/PREFIX)")
        out[name] = str(d)
    return out


def parse_from_jobs(items: Sequence[str], taken: Mapping[str, str]) -> dict[str, str]:
    """--from-job [NAME=]JOB (repeatable) -> {channel: job name}; NAME defaults to `previous`."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, job = item.rpartition("=")
        name = name if sep else FROM_JOB_CHANNEL
        if not _JOB_NAME_RE.match(job):
            raise LaunchError(f"--from-job {item!r}: {job!r} is not a training job name")
        _check_channel("--from-job", item, name, {**taken, **out})
        out[name] = job
    return out


def parse_metrics(items: Sequence[str]) -> list[dict[str, str]]:
    """--metric NAME=REGEX (repeatable) -> MetricDefinitions. SageMaker takes the regex's first
    group from each log line as the metric's value."""
    out: list[dict[str, str]] = []
    for item in items:
        name, sep, regex = item.partition("=")
        if not sep or not name or not regex:
            raise LaunchError(f"--metric {item!r}: expected NAME=REGEX, e.g. --metric 'loss=loss: ([0-9.]+)'")
        if len(name) > 255 or len(regex) > 500:
            raise LaunchError(f"--metric {name}: the name takes at most 255 characters, the regex 500")
        try:
            groups = re.compile(regex).groups
        except re.error as e:
            raise LaunchError(f"--metric {name}: the regex does not compile: {e}") from None
        if groups < 1:
            raise LaunchError(f"--metric {name}: the regex needs a group around the value, e.g. 'loss: ([0-9.]+)'")
        if any(m["Name"] == name for m in out):
            raise LaunchError(f"--metric {name}: given twice")
        out.append({"Name": name, "Regex": regex})
    if len(out) > 40:
        raise LaunchError(f"--metric: {len(out)} metrics; SageMaker takes at most 40")
    return out


_TAG_KEY_RE = re.compile(r"^[\w .:/=+\-@]{1,128}$")
_TAG_VALUE_RE = re.compile(r"^[\w .:/=+\-@]{0,256}$")


def parse_tags(items: Sequence[str]) -> dict[str, str]:
    """--tag KEY=VALUE (repeatable) -> the training job's tags. SageMaker's characters (letters,
    digits, spaces, _ . : / = + - @); keys `aws:*` and dtrain's own (`dtrain:*`, `dtrain.job`) refused."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        shown = item if len(item) <= 80 and item.isprintable() else repr(item[:80])
        if not sep or not _TAG_KEY_RE.fullmatch(key) or not _TAG_VALUE_RE.fullmatch(value):
            raise LaunchError(f"--tag {shown}: expected KEY=VALUE (KEY 1-128, VALUE at most 256 of letters, "
                              "digits, spaces and _ . : / = + - @)")
        if key.lower().startswith(("aws:", "dtrain:")) or key == contract.LABEL_JOB:
            raise LaunchError(f"--tag {shown}: the key {key!r} is reserved (aws:*, dtrain:*, {contract.LABEL_JOB})")
        if key in out:
            raise LaunchError(f"--tag {key}: given twice")
        out[key] = value
    if len(out) > MAX_TAGS - 4:
        raise LaunchError(f"--tag: {len(out)} tags; SageMaker takes {MAX_TAGS}, {MAX_TAGS - 4} besides dtrain's own")
    return out


def check_project(project: str) -> str:
    """--project NAME: the tasks' namespace (a tag, and the default output's prefix)."""
    if not _TASK_RE.match(project or ""):
        shown = project if len(project) <= 80 and project.isprintable() else repr(project[:80])
        raise LaunchError(f"--project {shown}: use letters, digits, . - _ (at most 63, starting with a letter "
                          "or digit)")
    return project


def parse_input_tasks(items: Sequence[str], taken: Mapping[str, str]) -> dict[str, str]:
    """--input-task [CHANNEL=]TASK (repeatable) -> {channel: task}; CHANNEL defaults to TASK."""
    out: dict[str, str] = {}
    for item in items:
        channel, sep, task = item.rpartition("=")
        channel = channel if sep else task
        if not _TASK_RE.match(task):
            shown = item if len(item) <= 80 and item.isprintable() else repr(item[:80])
            raise LaunchError(f"--input-task {shown}: expected [CHANNEL=]TASK, TASK a task name (letters, digits, "
                              ". - _, at most 63)")
        _check_channel("--input-task", item, channel, {**taken, **out})
        out[channel] = task
    return out


def parse_dependencies(items: Sequence[str], base: Path = Path(".")) -> dict[str, Path]:
    """--dependencies DIR (repeatable) -> {DIR's name: DIR}: each goes to the `deps` channel as
    deps/NAME/, and the channel on PYTHONPATH, so `import NAME` works in the job."""
    out: dict[str, Path] = {}
    for item in items:
        d = (base / item).resolve()
        if not d.is_dir():
            raise LaunchError(f"--dependencies {item}: not a directory")
        if not _TASK_RE.match(d.name):
            raise LaunchError(f"--dependencies {item}: its name {d.name!r} is not a package name")
        if d.name in out:
            raise LaunchError(f"--dependencies {item}: a dependency named {d.name} is given already "
                              f"({out[d.name]}); they would land in one directory")
        out[d.name] = d
    return out


def parse_duration(value: str | int, flag: str = "--max-run") -> int:
    """Seconds from `7200`, `2h`, `90m`, `1h30m`, `1d` (1 s .. 28 days, SageMaker's limit)."""
    text = str(value).strip().lower()
    if text.isascii() and text.isdigit():
        seconds = int(text)
    elif text and _DURATION_RE.sub("", text) == "":
        seconds = sum(int(n) * _UNIT_S[u] for n, u in _DURATION_RE.findall(text))
    else:
        seconds = -1
    if not 1 <= seconds <= MAX_RUN_S:
        raise LaunchError(f"{flag} {value!r}: expected seconds or a duration like 2h, 90m, 1h30m "
                          f"(at most {MAX_RUN_S // 86400} days)")
    return seconds


def task_name(task: str | None, workdir: Path) -> str:
    """--task NAME, or the workdir's directory name (characters S3 keys and names take; others -> -)."""
    if task is not None:
        if not _TASK_RE.match(task):
            raise LaunchError(f"--task {task!r}: use letters, digits, . - _ (at most 63, starting with a letter or digit)")
        return task
    guess = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(workdir).resolve().name).strip("-._")[:63] or "default"
    return guess


def state_uri(output: str, task: str) -> str:
    """The task's state directory in S3: OUTPUT/state/TASK/ (kept across runs of the task)."""
    return f"{output.rstrip('/')}/state/{task}/"


def hyperparameters(command: Sequence[str], launcher: str, slots: int | None,
                    pythonpath: str | None = None) -> dict[str, str]:
    """What launch/node/sagemaker_train.py reads (strings: SageMaker keeps only strings)."""
    if launcher not in launchers.names(sagemaker=True):
        raise LaunchError(f"--launcher {launcher}: use {launchers.choices(launchers.names(sagemaker=True))}")
    # dtrain_per_node: every host runs the launcher (torchrun), or the first runs it across all
    # over ssh (mpirun): what the node program does differently, said here, not by name there
    hps = {"dtrain_command": json.dumps(list(command)), "dtrain_launcher": launcher,
           "dtrain_per_node": "1" if launchers.get(launcher).per_node else "0", "dtrain_workdir": CODE_CHANNEL}
    if slots is not None:
        hps["dtrain_slots"] = str(slots)
    if pythonpath is not None:  # a channel whose directory goes first on PYTHONPATH (--dependencies)
        hps["dtrain_pythonpath"] = pythonpath
    return hps


def default_launcher(image: str) -> str:
    return "torchrun" if "pytorch-ddp" in image else "mpirun"


def _channel(name: str, uri: str) -> dict[str, Any]:
    return {"ChannelName": name, "InputMode": "File",
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": uri,
                                            "S3DataDistributionType": "FullyReplicated"}}}


def create_training_job_request(job: TrainingJob) -> dict[str, Any]:
    """The CreateTrainingJob request (pure). `dtrain sagemaker run` sends it; `dtrain manifest
    --for sagemaker` prints it. No ContainerEntrypoint: SageMaker runs `IMAGE train`."""
    if not _JOB_NAME_RE.match(job.name):
        raise LaunchError(f"bad training job name {job.name!r} (letters, digits and -, at most 63)")
    if not job.command:
        raise LaunchError("no command: put it after `--`, e.g. dtrain sagemaker run ... -- python train.py")
    if job.instances < 1:
        raise LaunchError(f"--instances {job.instances}: must be at least 1")
    if job.instances > 1 and launchers.get(job.launcher).ranks_over_ssh and not job.key_s3:
        raise LaunchError(f"{job.launcher} across instances needs the job key channel (key_s3)")
    check_s3_uri(job.output_s3, "--output")
    if job.spot and job.max_wait_s is not None and job.max_wait_s < job.max_runtime_s:
        raise LaunchError(f"spot: MaxWaitTimeInSeconds {job.max_wait_s} must be at least the run time {job.max_runtime_s}")
    channels = [_channel(k, v) for k, v in job.inputs.items()]
    if job.code_s3:
        channels.append(_channel(CODE_CHANNEL, job.code_s3))
    if job.deps_s3:
        channels.append(_channel(DEPS_CHANNEL, job.deps_s3))
    if job.key_s3:
        channels.append(_channel(KEY_CHANNEL, job.key_s3))
    req: dict[str, Any] = {
        "TrainingJobName": job.name,
        "RoleArn": job.role_arn,
        "AlgorithmSpecification": {"TrainingImage": job.image, "TrainingInputMode": "File",
                                   **({"MetricDefinitions": [dict(m) for m in job.metrics]} if job.metrics else {})},
        "HyperParameters": hyperparameters(job.command, job.launcher, job.slots,
                                           DEPS_CHANNEL if job.deps_s3 else None),
        "ResourceConfig": {"InstanceCount": job.instances, "InstanceType": job.instance_type,
                           "VolumeSizeInGB": job.volume_gb},
        "OutputDataConfig": {"S3OutputPath": job.output_s3},
        "StoppingCondition": {"MaxRuntimeInSeconds": job.max_runtime_s},
        "Environment": dict(job.env),
        "Tags": [{"Key": contract.LABEL_JOB, "Value": job.name}, *({"Key": k, "Value": v} for k, v in job.tags.items())],
    }
    if channels:
        req["InputDataConfig"] = channels
    if job.spot and not job.checkpoint_s3:
        raise LaunchError("spot needs a checkpoint S3 URI (a spot job may be interrupted and resumed)")
    if job.checkpoint_s3:
        check_s3_uri(job.checkpoint_s3, "--state-dir")
        req["CheckpointConfig"] = {"S3Uri": job.checkpoint_s3, "LocalPath": STATE_LOCAL}
    if job.spot:
        req["EnableManagedSpotTraining"] = True
        req["StoppingCondition"]["MaxWaitTimeInSeconds"] = job.max_wait_s or 2 * job.max_runtime_s
    if job.retries:
        if not 1 <= job.retries <= MAX_RETRIES:
            raise LaunchError(f"--max-restarts {job.retries}: a SageMaker job retries from 1 to {MAX_RETRIES} times "
                              "(RetryStrategy)")
        req["RetryStrategy"] = {"MaximumRetryAttempts": job.retries}
    return req


def request_problems(req: Mapping[str, Any]) -> list[str]:
    """botocore's own check of the request against the service model; [] when valid."""
    import botocore.session
    from botocore.exceptions import ParamValidationError
    from botocore.validate import validate_parameters

    model = botocore.session.get_session().get_service_model("sagemaker").operation_model("CreateTrainingJob")
    found: list[str] = []
    try:
        validate_parameters(dict(req), model.input_shape)
    except ParamValidationError as e:
        report = str(e.kwargs.get("report", e))
        found = [line.strip() for line in report.splitlines() if line.strip()]
    # botocore does not check enums; the instance type is one (a typo would fail only at SageMaker).
    kinds = model.input_shape.members["ResourceConfig"].members["InstanceType"].enum
    kind = (req.get("ResourceConfig") or {}).get("InstanceType")
    if isinstance(kind, str) and kinds and kind not in kinds:
        found.append(f"--instance-type {kind!r} is not a SageMaker training instance type (e.g. ml.m5.2xlarge, "
                     "ml.p3.2xlarge, ml.g5.12xlarge)")
    return found


# ---------------------------------------------------------------- workdir, key (local side)


def code_selection(root: Path, not_code: Sequence[Path] = (), max_bytes: int = WORKDIR_MAX_BYTES,
                   max_files: int = WORKDIR_MAX_FILES, flag: str = "--workdir",
                   rules: bool = True) -> tuple[list[Path], int, list[str], list[str]]:
    """What goes to the `code` channel (flag --workdir; --dependencies DIR: the same rules): (files
    relative to root, their bytes, what was left out as it may hold secrets, the symlinks left
    out). launch --workdir's rules (workdir.select: .gitignore, .dtrainignore, the files that
    hold secrets by name or content), less the not_code directories inside root (the download
    directory, local --input directories), and less symlinks that do not lead to a file that goes
    itself (S3 gets a link's content: a link out of the workdir would carry what the rules never
    saw); FIFOs, sockets and devices are never read. rules=False: no ignore file (data_selection)."""
    from dtrain.launch.jobs import workdir as wdir

    root = root.resolve()
    skip = []
    for d in not_code:
        try:
            rel = d.resolve().relative_to(root)
        except ValueError:
            continue  # outside the workdir: nothing of it is uploaded as code anyway
        if rel != Path("."):
            skip.append(rel.as_posix())

    def check(rel: str, count: int, size: int) -> None:
        if count > max_files or size > max_bytes:
            raise LaunchError(f"{flag} {root}: over {max_files} files or {max_bytes / 2**20:.0f} MiB at {rel}; "
                              "put data in S3 and pass it with --input NAME=s3://... (or NAME=DIR), or leave it "
                              f"out with {wdir.DTRAINIGNORE}")

    wd = wdir.select(root, skip, check if rules else None, rules=rules)
    chosen = set(wd.files)
    files, links = [], []
    for rel in wd.files:
        path = root / rel
        if path.is_symlink():
            try:
                target = path.resolve(strict=True).relative_to(root).as_posix()
            except (OSError, ValueError, RuntimeError):
                target = None
            if target not in chosen or not (root / target).is_file() or (root / target).is_symlink():
                links.append(rel)
                continue
        files.append(Path(rel))
    return files, sum((root / f).stat().st_size for f in files), list(wd.left_out), links


def data_selection(root: Path) -> tuple[list[Path], int, list[str], list[str]]:
    """An --input NAME=DIR channel's files: all of DIR (data: no ignore file, no size limit) but
    what may hold secrets (by name, content, hard link), symlinks leading out of DIR or to a file
    left out, FIFOs, sockets and devices; as code_selection returns them."""
    return code_selection(root, rules=False)


def left_out_lines(left_out: Sequence[str], links: Sequence[str], data: bool = False) -> list[str]:
    """What the upload left out, by name: the files that may hold secrets, the symlinks. data:
    an --input directory's (no .dtrainignore sends one back there)."""
    from dtrain.launch.jobs import workdir as wdir

    lines = [wdir.left_out_line(left_out)] if left_out else []
    if lines and data:
        lines[0] = (f"left out {len(left_out)} that may hold secrets: {wdir.names(left_out)} (to send one, put it "
                    "in S3 yourself and pass --input NAME=s3://BUCKET/PREFIX)")
    if links:
        lines.append(f"left out {len(links)} symlink(s) leading out of the directory or to a file left out: "
                     + wdir.names(links))
    return lines


def check_download_dir(d: Path, inputs: Mapping[str, Path] | None = None) -> None:
    """--download: a directory, or one that can be made, not inside a local --input directory
    (checked before anything is uploaded)."""
    p = d.resolve()
    for ch, src in (inputs or {}).items():
        s = Path(src).resolve()
        if p == s or s in p.parents:
            raise LaunchError(f"--download {d}: inside --input {ch}={src}; the next run would upload the "
                              "outputs as data (and a download would overwrite inputs): give a --download "
                              "directory outside it")
    while not p.exists():
        p = p.parent
    if not p.is_dir():
        raise LaunchError(f"--download {d}: {p} is not a directory")
    if not os.access(p, os.W_OK | os.X_OK):
        raise LaunchError(f"--download {d}: {p} is not writable")


def make_key(directory: Path) -> Path:
    """A fresh ed25519 key pair for one job, in a 0700 directory; returns the private key's path."""
    directory.chmod(0o700)
    key = directory / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dtrain-sagemaker", "-f", str(key)],
                   check=True, capture_output=True)
    return key


# ---------------------------------------------------------------- AWS side effects


def upload(s3, root: Path, files: Sequence[Path], bucket: str, prefix: str, uploaded: list[str] | None = None) -> None:
    """Each file to s3://bucket/prefix/FILE; `uploaded` gets every key before its upload starts."""
    for f in files:
        key = f"{prefix}/{f.as_posix()}"
        if uploaded is not None:
            uploaded.append(key)
        s3.upload_file(str(root / f), bucket, key)


def from_job_uri(sm, job: str, channel: str) -> str:
    """The S3 prefix holding a finished job's model.tar.gz (and output.tar.gz): its output."""
    try:
        d = sm.describe_training_job(TrainingJobName=job)
    except Exception as e:  # noqa: BLE001 -- botocore ClientError (ValidationException: no such job)
        raise LaunchError(f"--from-job {channel}={job}: cannot describe the job: {e}") from None
    uri = (d.get("ModelArtifacts") or {}).get("S3ModelArtifacts")
    if d.get("TrainingJobStatus") != "Completed" or not uri:
        raise LaunchError(f"--from-job {channel}={job}: the job is {d.get('TrainingJobStatus')}, with no output; "
                          "use a Completed job")
    bucket, key = check_s3_uri(uri, f"--from-job {job}")
    return f"s3://{bucket}/{key.rsplit('/', 1)[0]}/"


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


# SecondaryStatus once the instances have downloaded their input channels (the job key among them).
_PAST_DOWNLOAD = ("Training", "Uploading", "Stopping", "Stopped", "Completed", "Failed",
                  "MaxRuntimeExceeded", "MaxWaitTimeExceeded")
_RESTARTING = ("Interrupted", "Restarting")  # a spot job's new instances download the inputs again


def job_started(d: Mapping[str, Any]) -> bool:
    """The job has its inputs (the key included): it trains, or it has ended."""
    return d["TrainingJobStatus"] in TERMINAL or d.get("SecondaryStatus") in _PAST_DOWNLOAD


def key_action(in_s3: bool, d: Mapping[str, Any]) -> str | None:
    """What to do with the job key in S3 after a DescribeTrainingJob: "delete" once the
    instances have it, "put" back for a spot restart's fresh download, else None."""
    if in_s3 and job_started(d):
        return "delete"
    if not in_s3 and d.get("SecondaryStatus") in _RESTARTING and d["TrainingJobStatus"] not in TERMINAL:
        return "put"
    return None


def wait(sm, logs, job: str, out: Callable[[str], None] = print, poll_s: float = 10.0,
         on_describe: Callable[[Mapping[str, Any]], None] | None = None,
         until: Callable[[Mapping[str, Any]], bool] | None = None) -> dict[str, Any]:
    """Print the job's status (and its CloudWatch logs, when logs is given) until it ends, or
    until `until(describe)`; on_describe sees every DescribeTrainingJob. Returns the last one."""
    tokens: dict[str, str | None] = {}
    last = None
    while True:
        d = sm.describe_training_job(TrainingJobName=job)
        status = (d["TrainingJobStatus"], d.get("SecondaryStatus"))
        if status != last:
            out(f"[sagemaker] {job}: {status[0]} ({status[1]})")
            last = status
        if on_describe is not None:
            on_describe(d)
        if logs is not None:
            for line in log_lines(logs, job, tokens):
                out(line)
        if d["TrainingJobStatus"] in TERMINAL or (until is not None and until(d)):
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


def default_output(session, project: str = DEFAULT_PROJECT) -> str:
    """s3://sagemaker-REGION-ACCOUNT/PROJECT, as the SageMaker SDK's default bucket (created if absent)."""
    account = session.client("sts").get_caller_identity()["Account"]
    bucket = f"sagemaker-{session.region_name}-{account}"
    s3 = session.client("s3")
    try:
        s3.head_bucket(Bucket=bucket)
    except Exception:  # noqa: BLE001 -- absent: make it, as the SDK does
        kw = {} if session.region_name == "us-east-1" else {
            "CreateBucketConfiguration": {"LocationConstraint": session.region_name}}
        s3.create_bucket(Bucket=bucket, **kw)
    return f"s3://{bucket}/{project}"


def check_job_name(flag: str, name: str) -> str:
    """CreateTrainingJob's pattern: letters, digits and '-', starting alphanumeric, at most 63."""
    if not _JOB_NAME_RE.match(name):
        raise LaunchError(f"{flag} {name[:80]!r}: expected letters, digits and '-', starting with a letter "
                          "or digit, at most 63 (SageMaker's training job names)")
    return name


def check_ecr_image(flag: str, image: str) -> str:
    """SageMaker training runs images from Amazon ECR only (a private registry needs a VPC and
    TrainingImageConfig, which dtrain does not set)."""
    from dtrain.ecr import REGISTRY_RE
    from dtrain.values import shown

    if not REGISTRY_RE.match(image):
        raise LaunchError(f"{flag} {shown(image)}: SageMaker runs images from Amazon ECR only: expected "
                          "ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPO:TAG (dtrain push --ecr puts one there)")
    return image


def check_new_job_name(sm, name: str, given: bool) -> None:
    """Refuse a training job name that exists (DescribeTrainingJob): its code folder would get
    this run's files, and its old model would be downloaded as this run's."""
    try:
        d = sm.describe_training_job(TrainingJobName=name)
    except Exception as e:  # noqa: BLE001 -- botocore ClientError
        code = getattr(e, "response", {}).get("Error", {}).get("Code")
        if code == "ValidationException":  # SageMaker's answer for a job that does not exist
            return
        raise
    what = f"--name {name}" if given else f"job name {name}"
    raise LaunchError(f"{what}: a training job of that name exists ({d.get('TrainingJobStatus')}); give another "
                      "--name, or leave --name out for a new generated name")


# ---------------------------------------------------------------- tasks: state, chaining, the role

def task_job_name(task: str, now: float | None = None, suffix: str | None = None) -> str:
    """A new job's name for a run of the task: TASK (as a job name takes it), the UTC time and 4
    random hex digits (SageMaker's names are unique for ever: every run gets its own; two runs
    in one second too)."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", task).strip("-")[:42].strip("-") or "task"
    return f"{slug}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}-{suffix or secrets.token_hex(2)}"


def task_tags(project: str, task: str, digest: str) -> dict[str, str]:
    return {PROJECT_TAG: project, TASK_TAG: task, DIGEST_TAG: digest}


def run_digest(settings: Mapping[str, Any], trees: Mapping[str, tuple[Path, Sequence[Path]]],
               data: Mapping[str, tuple[Path, Sequence[Path]]]) -> str:
    """What makes a run of a task the same run again: its settings (JSON), the content of the
    code and dependency files (trees: label -> (root, files)), the names and sizes of local data."""
    h = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    for label, (root, files) in sorted(trees.items()):
        for f in sorted(files):
            h.update(f"\0{label}/{f.as_posix()}\0".encode())
            h.update(hashlib.sha256((root / f).read_bytes()).digest())
    for label, (root, files) in sorted(data.items()):
        for f in sorted(files):
            h.update(f"\0{label}/{f.as_posix()}\0{(root / f).stat().st_size}".encode())
    return h.hexdigest()[:16]


def task_action(last: Mapping[str, Any] | None, digest: str, force: bool) -> str:
    """What a run does about the task's last job (its DescribeTrainingJob plus `Tags`):
    "run" a new job, "skip" (Completed with this code and these settings), or "attach" (the same
    run is InProgress: follow it). A job that is Stopping, or running other code, is refused."""
    if last is None:
        return "run"
    status, name = last["TrainingJobStatus"], last["TrainingJobName"]
    same = (last.get("Tags") or {}).get(DIGEST_TAG) == digest
    if status == "Completed":
        return "skip" if same and not force else "run"
    if status == "InProgress":
        if force or not same:
            why = "--force" if force else "this run's code or settings differ from it"
            raise LaunchError(f"--task {last['Tags'].get(TASK_TAG)}: job {name} of the task is InProgress and {why}; "
                              "two jobs would share its state directory: wait for it, or stop it "
                              f"(aws sagemaker stop-training-job --training-job-name {name})")
        return "attach"
    if status == "Stopping":
        raise LaunchError(f"--task {last['Tags'].get(TASK_TAG)}: job {name} of the task is Stopping; run again once "
                          "it is Stopped")
    return "run"  # Failed, Stopped: run the task again


def last_task_job(sm, project: str, task: str) -> dict[str, Any] | None:
    """The task's newest training job (as Search gives it, `Tags` as a dict), or None: the jobs
    tagged dtrain:project PROJECT and dtrain:task TASK (SageMaker's Search, by tag)."""
    kw: dict[str, Any] = {"Resource": "TrainingJob", "MaxResults": 100, "SortBy": "CreationTime",
                          "SortOrder": "Descending",
                          "SearchExpression": {"Operator": "And", "Filters": [
                              {"Name": f"Tags.{TASK_TAG}", "Operator": "Equals", "Value": task},
                              {"Name": f"Tags.{PROJECT_TAG}", "Operator": "Equals", "Value": project}]}}
    want = {TASK_TAG: task, PROJECT_TAG: project}
    found: list[dict[str, Any]] = []
    while True:
        r = sm.search(**kw)
        for x in r.get("Results", []):  # both tags checked here too (moto applies only the first filter)
            job = x.get("TrainingJob") or {}
            if want.items() <= {t["Key"]: t["Value"] for t in job.get("Tags", [])}.items():
                found.append(job)
        if not r.get("NextToken"):
            break
        kw["NextToken"] = r["NextToken"]
    if not found:
        return None
    newest = max(found, key=lambda j: j["CreationTime"])
    return {**newest, "Tags": {t["Key"]: t["Value"] for t in newest.get("Tags", [])}}


def output_prefix(d: Mapping[str, Any]) -> str | None:
    """The S3 prefix holding a Completed job's model.tar.gz (and output.tar.gz), or None."""
    uri = (d.get("ModelArtifacts") or {}).get("S3ModelArtifacts")
    if d.get("TrainingJobStatus") != "Completed" or not uri:
        return None
    bucket, key = check_s3_uri(uri, "ModelArtifacts")
    return f"s3://{bucket}/{key.rsplit('/', 1)[0]}/"


def input_task_uri(sm, project: str, channel: str, task: str) -> tuple[str, str]:
    """--input-task CHANNEL=TASK: (the task's last job, its output prefix); one line when the
    task has no job or its last one did not complete."""
    last = last_task_job(sm, project, task)
    if last is None:
        raise LaunchError(f"--input-task {channel}={task}: no task {task} in project {project} (run it first: "
                          f"dtrain sagemaker run --task {task} ...)")
    uri = output_prefix(last)
    if uri is None:
        raise LaunchError(f"--input-task {channel}={task}: its last job {last['TrainingJobName']} is "
                          f"{last['TrainingJobStatus']}; chain from a Completed task")
    return last["TrainingJobName"], uri


def role_policy(buckets: Sequence[str]) -> dict[str, Any]:
    """The inline policy of the role --create-role makes: pull from ECR, write the job's logs
    and metrics, read and write the given buckets (the output's, the inputs'); nothing else."""
    arns = sorted({f"arn:aws:s3:::{b}" for b in buckets} | {f"arn:aws:s3:::{b}/*" for b in buckets})
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "Ecr", "Effect": "Allow", "Resource": "*",
         "Action": ["ecr:GetAuthorizationToken", "ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer",
                    "ecr:BatchGetImage"]},
        {"Sid": "Logs", "Effect": "Allow", "Resource": f"arn:aws:logs:*:*:log-group:{LOG_GROUP}*",
         "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"]},
        {"Sid": "Metrics", "Effect": "Allow", "Resource": "*", "Action": ["cloudwatch:PutMetricData"]},
        {"Sid": "S3", "Effect": "Allow", "Resource": arns,
         "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:ListBucket", "s3:GetBucketLocation"]},
    ]}


TRUST = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"},
                                                 "Action": "sts:AssumeRole"}]}
ROLE_POLICY = "dtrain-training"


def find_role(iam) -> dict[str, Any] | None:
    """dtrain's execution role (ROLE_NAME), or None when the account has none."""
    try:
        return iam.get_role(RoleName=ROLE_NAME)["Role"]
    except Exception as e:  # noqa: BLE001 -- botocore ClientError
        if getattr(e, "response", {}).get("Error", {}).get("Code") == "NoSuchEntity":
            return None
        raise


def role_buckets(iam) -> set[str]:
    """The buckets dtrain's role may use now (its inline policy's S3 statement)."""
    try:
        doc = iam.get_role_policy(RoleName=ROLE_NAME, PolicyName=ROLE_POLICY)["PolicyDocument"]
    except Exception as e:  # noqa: BLE001 -- botocore ClientError (NoSuchEntity: made by hand)
        if getattr(e, "response", {}).get("Error", {}).get("Code") == "NoSuchEntity":
            return set()
        raise
    doc = json.loads(doc) if isinstance(doc, str) else doc
    found = set()
    for st in doc.get("Statement", []):
        if st.get("Sid") == "S3":
            res = st.get("Resource", [])
            found |= {r.split(":::", 1)[1] for r in ([res] if isinstance(res, str) else res) if "/" not in r}
    return found


def ensure_role(iam, role: Mapping[str, Any] | None, buckets: Sequence[str], out: Callable[[str], None]) -> str:
    """dtrain's role as this run needs it: made when absent (SageMaker's trust, role_policy), its
    policy widened to new buckets when dtrain made it (a role made by hand is left as it is);
    returns its ARN. Kept afterwards: the next run finds it."""
    if role is None:
        role = iam.create_role(RoleName=ROLE_NAME, AssumeRolePolicyDocument=json.dumps(TRUST),
                               Description="dtrain sagemaker run: SageMaker training execution role",
                               Tags=[{"Key": "dtrain:made-by", "Value": "dtrain sagemaker run --create-role"}])["Role"]
        iam.put_role_policy(RoleName=ROLE_NAME, PolicyName=ROLE_POLICY,
                            PolicyDocument=json.dumps(role_policy(sorted(set(buckets)))))
        out(f"[sagemaker] created IAM role {ROLE_NAME} ({role['Arn']}): SageMaker's trust, ECR pull, its logs and "
            f"metrics, S3 {', '.join(sorted(set(buckets)))}; later runs reuse it")
        return role["Arn"]
    have = role_buckets(iam)
    if have and not set(buckets) <= have:
        iam.put_role_policy(RoleName=ROLE_NAME, PolicyName=ROLE_POLICY,
                            PolicyDocument=json.dumps(role_policy(sorted(have | set(buckets)))))
        out(f"[sagemaker] IAM role {ROLE_NAME}: S3 access widened to {', '.join(sorted(set(buckets) - have))}")
    return role["Arn"]


@dataclass(frozen=True)
class RunOptions:
    """One SageMaker run, every field given: made only by run_options() (its defaults: RUN_DEFAULTS)."""

    image: str
    role_arn: str  # "": dtrain's role (ROLE_NAME), made with create_role
    command: tuple[str, ...]
    instances: int
    instance_type: str
    name: str | None  # None: TASK-YYYYmmdd-HHMMSS
    launcher: str | None  # None: by image family
    slots: int | None
    inputs: Mapping[str, str]  # channel -> s3:// uri or local directory
    env: Mapping[str, str]
    spot: bool  # --on-demand: False
    output_s3: str | None  # None: s3://sagemaker-REGION-ACCOUNT/PROJECT
    workdir: Path
    download: Path | None  # None: do not download (nor keep the log)
    wait: bool
    volume_gb: int
    max_runtime_s: int
    max_wait_s: int | None  # spot: None is 2 x max_runtime_s
    retries: int  # RetryStrategy (launch --max-restarts)
    task: str | None  # None: the workdir's directory name
    state_s3: str | None  # None: OUTPUT/state/TASK/
    from_jobs: Mapping[str, str]  # channel -> earlier job name
    metrics: Sequence[Mapping[str, str]]
    project: str
    force: bool  # run even when the task's last job Completed this same run
    input_tasks: Mapping[str, str]  # channel -> task (of the project)
    dependencies: Mapping[str, Path]  # name -> local directory
    tags: Mapping[str, str]
    create_role: bool  # make dtrain's role when role_arn is "" and the account has none
    task_state: bool  # skip/follow by the task's last job (`dtrain sagemaker run`; launch --target
    # sagemaker has no --force, so it keeps making a new job every time)


def run_options(*, image: str, role_arn: str, command: Sequence[str], **given: Any) -> RunOptions:
    """The run's options: what was given, the rest RUN_DEFAULTS'; a None given where the default is
    not None is "not given" (`download=None` is its own value: no download). The one place a
    RunOptions is made (tests/test_sagemaker_options.py)."""
    unknown = sorted(set(given) - set(RUN_DEFAULTS))
    if unknown:
        raise TypeError(f"run_options: unknown field(s) {', '.join(unknown)}")
    fields = {k: dict(v) if isinstance(v, dict) else v for k, v in RUN_DEFAULTS.items()}
    fields |= {k: v for k, v in given.items() if v is not None or RUN_DEFAULTS[k] is None or k == "download"}
    return RunOptions(image=image, role_arn=role_arn, command=tuple(command), **fields)


_STAND_IN = "s3://sagemaker-us-east-1-000000000000/x/output/"
_STAND_IN_ROLE = f"arn:aws:iam::000000000000:role/{ROLE_NAME}"


def _bucket(uri: str) -> str:
    return check_s3_uri(uri.rstrip("/"), "S3")[0]


def bucket_problem(flag: str, bucket: str, error: Mapping[str, Any], writes: bool) -> str | None:
    """What HeadBucket's refusal of a bucket the job uses means (pure), or None where the run can
    go on: a bucket that does not exist is always wrong; one refused (403) only where the job
    writes to it (an input of another account's may be readable to the job's role)."""
    code = str(error.get("Code", ""))
    if code in ("404", "NoSuchBucket", "NotFound"):
        return f"{flag}: no bucket {bucket}; make it (`aws s3 mb s3://{bucket}`) or name another"
    if code in ("403", "AccessDenied", "Forbidden"):
        return (f"{flag}: bucket {bucket} refuses these credentials (HeadBucket: 403): it is another account's, "
                "or your policy does not allow it; name a bucket of yours") if writes else None
    return f"{flag}: bucket {bucket}: HeadBucket: {code}: {' '.join(str(error.get('Message', '')).split())}"


def check_buckets(s3, used: Sequence[tuple[str, str, bool]]) -> None:
    """(flag, bucket, the job writes to it) -> a one-line LaunchError for the first that cannot
    serve, before anything is created (the role, an upload). Read-only (HeadBucket)."""
    for flag, bucket, writes in used:
        try:
            s3.head_bucket(Bucket=bucket)
        except Exception as e:  # noqa: BLE001 -- botocore ClientError
            err = getattr(e, "response", {}).get("Error", {})
            if not err:
                raise
            problem = bucket_problem(flag, bucket, err, writes)
            if problem:
                raise LaunchError(problem) from None


def run(opts: RunOptions, session=None, out: Callable[[str], None] = print, poll_s: float = 10.0,
        confirm: Callable[[Any], None] | None = None) -> tuple[str, int]:
    """`dtrain sagemaker run`: returns (job name, exit code: 0 Completed, 1 otherwise / not waited).
    A task whose last job Completed the same run is skipped (its output reused); one InProgress
    with the same run is followed; otherwise a new job TASK-TIME is created. confirm(session):
    called once every local check passed, before the first AWS call (the price and its prompt:
    launch/infra/pricing.py sagemaker_gate); it raises to stop with nothing made."""
    import boto3

    from dtrain import values

    if not opts.image:
        raise LaunchError("--image is required (an ECR image built and pushed here)")
    values.image("--image", opts.image)  # before anything is uploaded
    check_ecr_image("--image", opts.image)
    values.instance_type("--instance-type", opts.instance_type, sagemaker=True)
    if opts.name is not None:
        check_job_name("--name", opts.name)
    if opts.output_s3:
        check_s3_uri(opts.output_s3.rstrip("/"), "--output")
    check_project(opts.project)
    parse_tags([f"{k}={v}" for k, v in opts.tags.items()])
    # Local checks first: nothing reaches AWS (not even the default bucket) for refused input.
    root = Path(opts.workdir).resolve()
    if not root.is_dir():
        raise LaunchError(f"--workdir {root}: not a directory")
    local = {ch: Path(v) for ch, v in opts.inputs.items() if not v.startswith("s3://")}
    if opts.download is not None:
        check_download_dir(Path(opts.download), local)
    # The output (downloaded here by earlier runs) and the data channels are not code.
    files, size, left_out, links = code_selection(
        root, [*local.values(), *([Path(opts.download)] if opts.download is not None else [])])
    deps = {dep: code_selection(d, flag="--dependencies") for dep, d in opts.dependencies.items()}  # as the code
    task = task_name(opts.task, root)
    picked = {ch: data_selection(d) for ch, d in local.items()}
    data = {ch: got[0] for ch, got in picked.items()}
    for ch, found in data.items():
        if not found:
            raise LaunchError(f"--input {ch}={local[ch]}: the directory has no files")
    for dep, (dfiles, *_rest) in deps.items():
        if not dfiles:
            raise LaunchError(f"--dependencies {opts.dependencies[dep]}: no file to send (empty, or all left out)")
    for ch in opts.input_tasks:
        _check_channel("--input-task", ch, ch, {**opts.inputs, **opts.from_jobs})
    name = opts.name or task_job_name(task)
    launcher = opts.launcher or default_launcher(opts.image)

    def request(output: str, chained: Mapping[str, str], role_arn: str, tags: Mapping[str, str]) -> dict[str, Any]:
        bucket, prefix = check_s3_uri(output, "--output")
        base = f"{prefix}/{name}" if prefix else name
        inputs = {ch: f"s3://{bucket}/{base}/input/{ch}/" if ch in local else v for ch, v in opts.inputs.items()}
        job = TrainingJob(name=name, image=opts.image, role_arn=role_arn, command=opts.command,
                          output_s3=output, instances=opts.instances, instance_type=opts.instance_type,
                          launcher=launcher, slots=opts.slots, key_s3=f"s3://{bucket}/{base}/{KEY_CHANNEL}/",
                          code_s3=f"s3://{bucket}/{base}/{CODE_CHANNEL}/" if files else None,
                          deps_s3=f"s3://{bucket}/{base}/{DEPS_CHANNEL}/" if deps else None,
                          inputs={**inputs, **chained}, env=opts.env, spot=opts.spot,
                          checkpoint_s3=opts.state_s3 or state_uri(output, task), volume_gb=opts.volume_gb,
                          max_runtime_s=opts.max_runtime_s, max_wait_s=opts.max_wait_s, retries=opts.retries,
                          metrics=opts.metrics, tags={**tags, **opts.tags})
        req = create_training_job_request(job)
        found = request_problems(req)
        if found:
            raise LaunchError("CreateTrainingJob request: " + "; ".join(found))
        return req

    # The whole request, checked with stand-ins for what AWS tells (the default bucket, the
    # chained prefixes, the role) before the first AWS call.
    request(opts.output_s3.rstrip("/") if opts.output_s3 else "s3://sagemaker-us-east-1-000000000000/dtrain",
            {ch: _STAND_IN for ch in [*opts.from_jobs, *opts.input_tasks]}, opts.role_arn or _STAND_IN_ROLE,
            task_tags(opts.project, task, "0" * 16))
    session = session or boto3.session.Session()
    if confirm is not None:
        confirm(session)
    s3, sm, logs = session.client("s3"), session.client("sagemaker"), session.client("logs")
    role = None
    if not opts.role_arn:
        role = find_role(session.client("iam"))
        if role is None and not opts.create_role:
            raise LaunchError(f"--role: none given, and this account has no role {ROLE_NAME}: pass --role ARN (a "
                              f"SageMaker execution role), or --create-role to make {ROLE_NAME} once")
    from_jobs = {ch: from_job_uri(sm, job, ch) for ch, job in opts.from_jobs.items()}
    chained_jobs, chained = {}, {}
    for ch, t in opts.input_tasks.items():
        chained_jobs[ch], chained[ch] = input_task_uri(sm, opts.project, ch, t)
    settings = {"image": opts.image, "command": list(opts.command), "instances": opts.instances,
                "instance_type": opts.instance_type, "launcher": launcher, "slots": opts.slots, "env": dict(opts.env),
                "inputs": {ch: v for ch, v in opts.inputs.items() if ch not in local},
                "from_jobs": dict(opts.from_jobs),
                "input_tasks": chained_jobs, "spot": opts.spot, "volume_gb": opts.volume_gb,
                "max_runtime_s": opts.max_runtime_s, "metrics": [dict(m) for m in opts.metrics],
                "output": opts.output_s3, "state": opts.state_s3}
    digest = run_digest(settings, {"code": (root, files), **{f"deps/{k}": (opts.dependencies[k], v[0])
                                                             for k, v in deps.items()}},
                        {f"input/{ch}": (d, data[ch]) for ch, d in local.items()})
    last = last_task_job(sm, opts.project, task) if opts.task_state else None
    action = task_action(last, digest, opts.force)
    if last is not None and action != "run":
        return _follow(opts, task, last, action, s3, sm, logs, out, poll_s)
    if last is not None and last["TrainingJobStatus"] == "Completed":
        why = "--force" if opts.force else "the code or settings changed"
        out(f"[sagemaker] task {task}: job {last['TrainingJobName']} Completed it; running it again ({why})")
    check_new_job_name(sm, name, given=opts.name is not None)  # before any upload
    output = (opts.output_s3 or default_output(session, opts.project)).rstrip("/")
    buckets = sorted({_bucket(output), *(_bucket(u) for u in opts.inputs.values() if u.startswith("s3://")),
                      *(_bucket(u) for u in [*from_jobs.values(), *chained.values()]),
                      *([_bucket(opts.state_s3)] if opts.state_s3 else [])})
    request(output, {**from_jobs, **chained}, opts.role_arn or _STAND_IN_ROLE, task_tags(opts.project, task, digest))
    check_buckets(s3, [("--output", _bucket(output), True),
                       *([("--state-dir", _bucket(opts.state_s3), True)] if opts.state_s3 else []),
                       *((f"--input {ch}", _bucket(u), False) for ch, u in opts.inputs.items()
                         if u.startswith("s3://"))])  # before the role and the first upload
    role_arn = opts.role_arn or ensure_role(session.client("iam"), role, buckets, out)
    req = request(output, {**from_jobs, **chained}, role_arn, task_tags(opts.project, task, digest))
    bucket, prefix = check_s3_uri(output, "--output")
    base = f"{prefix}/{name}" if prefix else name
    state = req["CheckpointConfig"]["S3Uri"]
    inputs = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in req.get("InputDataConfig", [])}
    key_s3 = f"{base}/{KEY_CHANNEL}/id_ed25519"
    with tempfile.TemporaryDirectory(prefix="dtrain-sm-") as tmp:
        key_bytes = make_key(Path(tmp)).read_bytes()  # kept here only to hand a restarting spot job

    def put_key() -> None:
        s3.put_object(Bucket=bucket, Key=key_s3, Body=key_bytes, ServerSideEncryption="AES256")

    uploaded: list[str] = []  # removed again when the job is not created (an error, Ctrl-C)
    try:
        out(f"[sagemaker] uploading {len(files)} files ({size / 2**20:.1f} MiB) of {root} to "
            f"s3://{bucket}/{base}/code/")
        for note in left_out_lines(left_out, links):
            out(f"[sagemaker] {note}")
        upload(s3, root, files, bucket, f"{base}/{CODE_CHANNEL}", uploaded)
        for dep, (dfiles, dsize, dleft, dlinks) in deps.items():
            out(f"[sagemaker] uploading {len(dfiles)} files ({dsize / 2**20:.1f} MiB) of {opts.dependencies[dep]} to "
                f"s3://{bucket}/{base}/{DEPS_CHANNEL}/{dep}/ (on PYTHONPATH)")
            for note in left_out_lines(dleft, dlinks):
                out(f"[sagemaker] {dep}: {note}")
            upload(s3, opts.dependencies[dep], dfiles, bucket, f"{base}/{DEPS_CHANNEL}/{dep}", uploaded)
        for ch, d in local.items():
            out(f"[sagemaker] uploading {len(data[ch])} files of {d} to {inputs[ch]} (channel {ch})")
            for note in left_out_lines(picked[ch][2], picked[ch][3], data=True):
                out(f"[sagemaker] --input {ch}: {note}")
            upload(s3, d, data[ch], bucket, f"{base}/input/{ch}", uploaded)
        put_key()
        create_job(sm, req, retry_role=role is None and not opts.role_arn, poll_s=poll_s)
    except BaseException:
        try:
            delete_keys(s3, bucket, [*uploaded, key_s3])
        except Exception as e:  # noqa: BLE001 -- the first error is the one to show; this one is said
            out(f"[sagemaker] could not remove what was uploaded under s3://{bucket}/{base}/: "
                f"{' '.join(str(e).split())}")
        raise
    in_s3 = [True]  # whether the key is in S3 now (key_action decides what happens to it)

    def key_follows_the_job(d: Mapping[str, Any]) -> None:
        action = key_action(in_s3[0], d)
        if action == "delete":
            s3.delete_object(Bucket=bucket, Key=key_s3)
            out(f"[sagemaker] job key deleted from s3://{bucket}/{key_s3} (the instances have it)")
        elif action == "put":
            put_key()
        in_s3[0] = {"delete": False, "put": True}.get(action or "", in_s3[0])

    try:
        chained_note = "".join(f", channel {ch} <- task {t}" for ch, t in opts.input_tasks.items())
        out(f"[sagemaker] created training job {name} ({opts.instances} x {opts.instance_type}, {launcher}, "
            f"{'spot' if opts.spot else 'on-demand'}; task {task}, state {state}{chained_note})")
        if not opts.wait:  # only until the instances have the key: it must not stay in S3
            out("[sagemaker] --no-wait: waiting until the job has downloaded its inputs, to delete its key")
            wait(sm, None, name, out, poll_s, on_describe=key_follows_the_job, until=job_started)
            if opts.spot:
                out("[sagemaker] note: if SageMaker restarts this spot job, its new instances find no key "
                    "(run without --no-wait to have it put back)")
            return name, 0
        with log_copy(out, Path(opts.download) / name / "logs.txt" if opts.download is not None else None) as tee:
            d = wait(sm, logs, name, tee, poll_s, on_describe=key_follows_the_job)
    finally:  # any error, Ctrl-C included: the key does not stay behind
        s3.delete_object(Bucket=bucket, Key=key_s3)
    return name, _outcome(s3, d, opts.download, out)


def _outcome(s3, d: Mapping[str, Any], download: Path | None, out: Callable[[str], None]) -> int:
    """After the job ended: its failure reason, or its output downloaded to DOWNLOAD/JOB/."""
    name = d["TrainingJobName"]
    if d["TrainingJobStatus"] != "Completed":
        out(f"[sagemaker] {name} {d['TrainingJobStatus']}: {d.get('FailureReason', 'no reason given')}")
        return 1
    out(f"[sagemaker] output {output_prefix(d)}")
    if download is not None:
        for p in download_output(s3, d, Path(download) / name):
            out(f"[sagemaker] downloaded {p}")
    return 0


def _follow(opts: RunOptions, task: str, last: Mapping[str, Any], action: str, s3, sm, logs,
            out: Callable[[str], None], poll_s: float) -> tuple[str, int]:
    """The task's last job instead of a new one: Completed ("skip": its output, as a run would
    give it) or InProgress ("attach": its logs until it ends, then its output)."""
    name = last["TrainingJobName"]
    if action == "skip":
        out(f"[sagemaker] task {task}: completed already by job {name} with this code and these settings; "
            "skipped (--force runs it again)")
        return name, _outcome(s3, last, opts.download if opts.wait else None, out)  # --no-wait: no download
    out(f"[sagemaker] task {task}: job {name} is running it (InProgress); following it instead of starting another")
    if not opts.wait:
        return name, 0
    with log_copy(out, Path(opts.download) / name / "logs.txt" if opts.download is not None else None) as tee:
        d = wait(sm, logs, name, tee, poll_s)
    return name, _outcome(s3, d, opts.download, out)


def create_job(sm, req: Mapping[str, Any], retry_role: bool, poll_s: float, tries: int = 12) -> None:
    """CreateTrainingJob; its refusal is one line. A role made moments ago may not be assumable
    yet (IAM is eventually consistent): with retry_role, that refusal is retried for a minute."""
    for attempt in range(tries):
        try:
            sm.create_training_job(**req)
            return
        except Exception as e:  # noqa: BLE001 -- botocore ClientError
            err = getattr(e, "response", {}).get("Error", {})
            if not err:
                raise
            if retry_role and "assume" in str(err.get("Message", "")).lower() and attempt < tries - 1:
                time.sleep(poll_s / 2)
                continue
            raise LaunchError(f"CreateTrainingJob {req['TrainingJobName']}: {err.get('Code')}: "
                              f"{' '.join(str(err.get('Message', '')).split())}") from None


def delete_keys(s3, bucket: str, keys: Sequence[str]) -> None:
    for i in range(0, len(keys), 1000):
        s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]], "Quiet": True})


def _append(path: Path):
    """The job's log copy opened to append: never through a symbolic link at its name (one
    planted in a cloned project's output/ would have dtrain append elsewhere), never a FIFO or a
    device; LaunchError naming it."""
    import errno
    import stat

    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     0o644)
    except OSError as e:
        why = "a symbolic link; dtrain does not write through links" if e.errno == errno.ELOOP else e.strerror
        raise LaunchError(f"--download: {path}: {why}; remove it or give another --download") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise LaunchError(f"--download: {path}: not a regular file; remove it or give another --download")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "a", encoding="utf-8")


@contextmanager
def log_copy(out: Callable[[str], None], path: Path | None) -> Iterator[Callable[[str], None]]:
    """out, also appending every line to path (the job's log as streamed), when given."""
    if path is None:
        yield out
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with _append(path) as f:
        def tee(line: str) -> None:
            out(line)
            f.write(line + "\n")
            f.flush()

        yield tee
    out(f"[sagemaker] log saved to {path}")


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



# ---------------------------------------------------------------- --local: the same container here

LOCAL_HOST = "algo-1"
Tree = tuple[Path, Sequence[Path], str]  # (root, files relative to it, where under the channel)


def local_refusals(opts: RunOptions) -> list[str]:
    """What --local cannot do (one instance, local data only); each names its flag."""
    found = []
    if opts.instances != 1:
        found.append(f"--instances {opts.instances}: --local runs one instance (one container here)")
    found += [f"--input {ch}={v}: --local takes local directories only (NAME=DIR)"
              for ch, v in opts.inputs.items() if v.startswith("s3://")]
    found += [f"{flag}: not with --local (its output is in S3); download it and pass --input NAME=DIR"
              for flag, given in (("--from-job", opts.from_jobs), ("--input-task", opts.input_tasks)) if given]
    return found


def local_tree(ml: Path, hps: Mapping[str, str], channels: Mapping[str, Sequence[Tree]]) -> Path:
    """SageMaker's /opt/ml for one instance, as it lays it out before `train`: config
    (resourceconfig, hyperparameters, inputdataconfig), a copy of each channel's files, model/
    and output/data/. The container's eth0 is the NIC."""
    (ml / "input/config").mkdir(parents=True)
    (ml / "input/config/resourceconfig.json").write_text(json.dumps(
        {"current_host": LOCAL_HOST, "hosts": [LOCAL_HOST], "network_interface_name": "eth0"}))
    (ml / "input/config/hyperparameters.json").write_text(json.dumps(dict(hps)))
    (ml / "input/config/inputdataconfig.json").write_text(json.dumps(
        {ch: {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated"} for ch in channels}))
    for ch, trees in channels.items():
        (ml / "input/data" / ch).mkdir(parents=True)
        for root, files, under in trees:
            for f in files:
                dest = ml / "input/data" / ch / under / f
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes((root / f).read_bytes())
    for d in ("model", "output/data"):
        (ml / d).mkdir(parents=True)
    return ml


def local_argv(docker: str, image: str, ml: Path, state: Path, env_names: Sequence[str], gpus: bool,
               name: str) -> list[str]:
    """`docker run ... IMAGE train` as SageMaker starts the container, /opt/ml mounted from ml
    and the task's local state directory at /opt/ml/checkpoints; env by name only (the values
    come from this process's environment, never argv)."""
    return [docker, "run", "--rm", "--name", name, "--hostname", LOCAL_HOST, "-v", f"{ml}:/opt/ml",
            "-v", f"{state}:{STATE_LOCAL}", *(x for k in env_names for x in ("-e", k)),
            *(["--gpus", "all"] if gpus else []), image, "train"]


def run_local(opts: RunOptions, out: Callable[[str], None] = print,
              runner: Callable[[list[str], Mapping[str, str]], int] | None = None) -> tuple[str, int]:
    """`dtrain sagemaker run --local`: the training job's container on this machine's engine,
    with SageMaker's /opt/ml (channels, hyperparameters, so SM_*) at DOWNLOAD/JOB/opt-ml; the
    model is left in its model/, the state in DOWNLOAD/state/TASK (kept across local runs of the
    task, as OUTPUT/state/TASK is in S3). Nothing reaches AWS; no task state, no key."""
    from dtrain import values

    problems = local_refusals(opts)
    if problems:
        raise LaunchError(problems[0])
    if not opts.image:
        raise LaunchError("--image is required (an image built here)")
    values.image("--image", opts.image)
    if opts.name is not None:
        check_job_name("--name", opts.name)
    if not opts.command:
        raise LaunchError("no command: put it after `--`, e.g. dtrain sagemaker run --local ... -- python train.py")
    root = Path(opts.workdir).resolve()
    if not root.is_dir():
        raise LaunchError(f"--workdir {root}: not a directory")
    download = Path(opts.download if opts.download is not None else "output").resolve()
    local = {ch: Path(v) for ch, v in opts.inputs.items()}
    check_download_dir(download, local)
    files, _size, left_out, links = code_selection(root, [*local.values(), download])
    deps = {dep: code_selection(d, flag="--dependencies")[0] for dep, d in opts.dependencies.items()}
    task = task_name(opts.task, root)
    name = opts.name or task_job_name(task)
    hps = hyperparameters(opts.command, opts.launcher or default_launcher(opts.image), opts.slots,
                          DEPS_CHANNEL if deps else None)
    job_dir = download / name
    if job_dir.exists():
        raise LaunchError(f"--name {name}: {job_dir} exists; give another --name")
    channels: dict[str, list[Tree]] = {CODE_CHANNEL: [(root, files, "")]}
    picked = {ch: data_selection(d) for ch, d in local.items()}
    channels |= {ch: [(local[ch], got[0], "")] for ch, got in picked.items()}
    if deps:  # each dependency as deps/NAME/, as the upload lays it out
        channels[DEPS_CHANNEL] = [(opts.dependencies[k], f, k) for k, f in deps.items()]
    for note in left_out_lines(left_out, links):
        out(f"[sagemaker local] {note}")
    for ch, got in picked.items():
        for note in left_out_lines(got[2], got[3], data=True):
            out(f"[sagemaker local] --input {ch}: {note}")
    ml = local_tree(job_dir / "opt-ml", hps, channels)
    state = download / "state" / task
    state.mkdir(parents=True, exist_ok=True)
    if runner is None:
        from dtrain import engine

        try:
            docker, runner = engine.run_cli(), _run_streaming  # any docker on PATH runs it
        except engine.EngineError as e:
            shutil.rmtree(job_dir, ignore_errors=True)
            raise LaunchError(f"--local: {e}") from None
    else:
        docker = "docker"
    argv = local_argv(docker, opts.image, ml, state, sorted(opts.env), Path("/dev/nvidia0").exists(),
                      f"dtrain-local-{name}")
    out(f"[sagemaker local] {name}: {opts.image} train, /opt/ml at {ml}, state {state} (task {task})")
    code = runner(argv, {**os.environ, **opts.env})
    failure = ml / "output/failure"
    if code != 0:
        reason = failure.read_text(errors="replace").strip() if failure.is_file() else f"exit code {code}"
        out(f"[sagemaker local] {name} Failed: {reason}")
        return name, 1
    out(f"[sagemaker local] {name} Completed; model in {ml / 'model'}")
    return name, 0


def _run_streaming(argv: list[str], env: Mapping[str, str]) -> int:
    return subprocess.run(argv, env=dict(env), check=False).returncode
