"""`--target sagemaker`: the launch submitted as a SageMaker training job (launch/sagemaker/engine.py's
`run`, as `dtrain sagemaker run` does): as many instances as the launch names nodes, the workdir
as its code channel, the launch's timeout as its run-time limit (default 24 h), on_demand / max_wait
-> managed spot or not and its MaxWaitTimeInSeconds, volume_size, input -> data channels,
checkpoint_dir -> DTRAIN_CHECKPOINT_DIR at CheckpointConfig's local path, max_restarts ->
RetryStrategy, slots (or the hosts' own, h:8) -> ranks per instance, an EC2 instance type -> its
ml. twin. `dtrain manifest --for sagemaker`
writes the CreateTrainingJob request of an image's command (the Describer part, checked
against botocore's model)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dtrain import values
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import launchers as launcher_registry
from dtrain.launch.sagemaker import engine as sm_engine
from dtrain.launch.other_tools import describe
from dtrain.launch.other_tools.describe import PLACEHOLDER_ROLE, PLACEHOLDER_S3, Describer, ManifestSpec
from dtrain.launch.targets.base import IGNORED, REFUSED, Target
from dtrain.launch.targets.common import slots

SAGEMAKER_INSTANCE = {0: sm_engine.RUN_DEFAULTS["instance_type"], 1: "ml.g5.xlarge", 4: "ml.g5.12xlarge", 8: "ml.p4d.24xlarge"}


def sagemaker_job(spec: ManifestSpec) -> sm_engine.TrainingJob:
    """The training job `dtrain sagemaker run` would create, for an image path command (no
    workdir upload). Across instances mpirun needs the job key: the `dtrain` channel points at
    OUTPUT/NAME/dtrain/, where you put a fresh id_ed25519 (docs/other-tools.md)."""
    launcher = spec.launcher or "mpirun"
    needs_key = spec.workers > 1 and launcher_registry.get(launcher).ranks_over_ssh
    job_s3 = f"{spec.output_s3.rstrip('/')}/{spec.name}"
    return sm_engine.TrainingJob(
        name=spec.name, image=spec.image, role_arn=spec.role_arn, command=spec.command,
        output_s3=spec.output_s3, instances=spec.workers,
        code_s3=f"{job_s3}/{sm_engine.CODE_CHANNEL}/",  # the command's work directory (dtrain_workdir)
        instance_type=spec.instance_type or SAGEMAKER_INSTANCE[spec.gpus_per_worker], launcher=launcher,
        slots=spec.slots, key_s3=f"{job_s3}/{sm_engine.KEY_CHANNEL}/" if needs_key else None,
        env=spec.env, volume_gb=spec.volume_gb, max_runtime_s=spec.max_runtime_s)


class SageMaker(Target, Describer):
    name = "sagemaker"
    # maps max_restarts (RetryStrategy) and checkpoint_dir (CheckpointConfig's local path)
    refused = tuple(k for k in REFUSED if k not in ("max_restarts", "checkpoint_dir"))
    ignored = IGNORED
    # the description (dtrain manifest --for sagemaker)
    filenames = {"sagemaker": "sagemaker-training-job.json"}
    launchers = {"sagemaker": True}
    runs = "launch/node/sagemaker_train.py"
    default_launcher = "mpirun"
    ec2_types = False  # ml.* types, its own
    what = {"sagemaker": "SageMaker CreateTrainingJob"}
    placeholder_fields = {"sagemaker": (("role_arn", PLACEHOLDER_ROLE, "RoleArn", "--role-arn"),
                                        ("output_s3", PLACEHOLDER_S3, "OutputDataConfig.S3OutputPath", "--output-s3"))}

    def check(self, spec: ManifestSpec) -> None:
        if not spec.instance_type and spec.gpus_per_worker not in SAGEMAKER_INSTANCE:
            raise LaunchError(f"SageMaker: give --instance-type for {spec.gpus_per_worker} GPUs per instance")

    def default_gpus(self, instance_type: str | None, node_selector: dict[str, str]) -> int:
        return 0  # its instance type is chosen by the GPUs, not the other way

    def env_secret_notes(self, spec: ManifestSpec, via: str = "manifest") -> list[str]:
        return []  # the request carries the environment

    def text(self, spec: ManifestSpec) -> str:
        ctx = describe.context(spec, self) | {"request": sm_engine.create_training_job_request(sagemaker_job(spec))}
        return describe.jinja().get_template("sagemaker.j2").render(ctx)

    def load(self, variant: str, text: str) -> Any:
        return json.loads(text)

    def problems(self, variant: str, doc: Any) -> list[str]:
        return describe.boto_problems("sagemaker", "CreateTrainingJob", doc)

    def run(self, cfg: Any, given: Mapping[str, Any], count: int | None, *, output: str | None,
            session: Any, note: Callable[[], None], err: Callable[[str], None] = print, force: bool = False) -> int:
        import boto3

        sm = sm_engine
        kind = cfg.instance_type
        if kind is None:
            raise LaunchError("--instance-type is required with --target sagemaker (e.g. ml.g5.12xlarge)")
        if not kind.startswith("ml."):
            kind = "ml." + values.ec2_instance_type(cfg.named("instance_type"), kind)  # the nodes' type: its twin
        values.instance_type(cfg.named("instance_type"), kind, sagemaker=True)
        launcher = given.get("launcher")  # default: by the image's family, as `dtrain sagemaker run`
        if launcher is not None:
            values.choice(cfg.named("launcher"), launcher, launcher_registry.names(sagemaker=True))
        if cfg.name is not None:
            sm.check_job_name(cfg.named("name"), cfg.name)
        workdir = Path(cfg.workdir or ".")
        if not workdir.is_dir():
            raise LaunchError(f"--workdir {workdir}: not a directory")
        env = cfg.env_values()
        if cfg.checkpoint_dir is not None:  # where the job's own checkpoints persist on SageMaker
            env["DTRAIN_CHECKPOINT_DIR"] = sm.STATE_LOCAL
        opts = sm.run_options(image=cfg.image, role_arn=cfg.role or "", command=cfg.command or (),
                              instances=count, instance_type=kind, name=cfg.name, launcher=launcher,
                              slots=slots(cfg), env=env, workdir=workdir, wait=not cfg.detach, spot=not cfg.on_demand,
                              volume_gb=cfg.volume_size, inputs=cfg.inputs(), retries=cfg.max_restarts,
                              max_runtime_s=max(1, math.ceil(cfg.timeout)) if cfg.timeout is not None else None,
                              max_wait_s=math.ceil(cfg.max_wait) if cfg.max_wait is not None else None)
        session = session or boto3.session.Session(region_name=cfg.region)
        note()
        job, code = sm.run(opts, session=session)
        if cfg.detach:
            print(job)
        return code

TARGET = SageMaker()
