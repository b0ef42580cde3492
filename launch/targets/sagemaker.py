"""`--target sagemaker`: the launch submitted as a SageMaker training job (launch/jobs/sagemaker.py's
`run`, as `dtrain sagemaker run` does). What it maps: the node shape (count: instances, slots:
processes per instance, instance_type: ml.TYPE, an EC2 type taken as its ml. twin), the workdir as
its code channel, timeout -> MaxRuntimeInSeconds (default 24 h), on_demand / max_wait -> managed
spot or not and its MaxWaitTimeInSeconds, volume_size -> VolumeSizeInGB, input -> data channels,
checkpoint_dir -> DTRAIN_CHECKPOINT_DIR at CheckpointConfig's local path (kept in S3 across
retries), max_restarts -> RetryStrategy."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dtrain import values
from dtrain.launch.errors import LaunchError
from dtrain.launch.targets.base import IGNORED, REFUSED, Target
from dtrain.launch.targets.common import slots


class SageMaker(Target):
    name = "sagemaker"
    refused = tuple(k for k in REFUSED if k not in ("max_restarts", "checkpoint_dir"))
    ignored = IGNORED

    def run(self, cfg: Any, given: Mapping[str, Any], count: int | None, *, output: str | None,
            session: Any, note: Callable[[], None], err: Callable[[str], None] = print, force: bool = False) -> int:
        import boto3

        from dtrain.launch.jobs import launchers, sagemaker as sm

        kind = cfg.instance_type
        if kind is None:
            raise LaunchError("--instance-type is required with --target sagemaker (e.g. ml.g5.12xlarge)")
        if not kind.startswith("ml."):
            kind = "ml." + values.ec2_instance_type(cfg.named("instance_type"), kind)  # the nodes' type: its twin
        values.instance_type(cfg.named("instance_type"), kind, sagemaker=True)
        launcher = given.get("launcher")  # default: by the image's family, as `dtrain sagemaker run`
        if launcher is not None:
            values.choice(cfg.named("launcher"), launcher, launchers.names(sagemaker=True))
        if cfg.name is not None:
            sm.check_job_name(cfg.named("name"), cfg.name)
        workdir = Path(cfg.workdir or ".")
        if not workdir.is_dir():
            raise LaunchError(f"--workdir {workdir}: not a directory")
        env = cfg.env_values()
        if cfg.checkpoint_dir is not None:  # where the job's own checkpoints persist on SageMaker
            env["DTRAIN_CHECKPOINT_DIR"] = sm.STATE_LOCAL
        runtime = {"max_runtime_s": max(1, math.ceil(cfg.timeout))} if cfg.timeout is not None else {}
        opts = sm.RunOptions(image=cfg.image, role_arn=cfg.role or "", command=tuple(cfg.command or ()),
                             instances=count or 1, instance_type=kind, name=cfg.name, launcher=launcher,
                             slots=slots(cfg), env=env, workdir=workdir, wait=not cfg.detach, spot=not cfg.on_demand,
                             volume_gb=cfg.volume_size, inputs=cfg.inputs(), retries=cfg.max_restarts or 0,
                             max_wait_s=math.ceil(cfg.max_wait) if cfg.max_wait is not None else None, **runtime)
        session = session or boto3.session.Session(region_name=cfg.region)
        note()
        job, code = sm.run(opts, session=session)
        if cfg.detach:
            print(job)
        return code


TARGET = SageMaker()
