"""`--target sagemaker`: the launch submitted as a SageMaker training job (launch/jobs/sagemaker.py's
`run`, as `dtrain sagemaker run` does): as many instances as the launch names nodes, the workdir
as its code channel, the launch's timeout as its run-time limit. `dtrain manifest --for sagemaker`
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
from dtrain.launch.jobs import launchers as launcher_registry, sagemaker as sm_engine
from dtrain.launch.other_tools import describe
from dtrain.launch.other_tools.describe import PLACEHOLDER_ROLE, PLACEHOLDER_S3, Describer, ManifestSpec
from dtrain.launch.targets.base import IGNORED, REFUSED, Target
from dtrain.launch.targets.common import env

SAGEMAKER_INSTANCE = {0: "ml.m5.2xlarge", 1: "ml.g5.xlarge", 4: "ml.g5.12xlarge", 8: "ml.p4d.24xlarge"}


def sagemaker_job(spec: ManifestSpec) -> sm_engine.TrainingJob:
    """The training job `dtrain sagemaker run` would create, for an image path command (no
    workdir upload). Across instances mpirun needs the job key: the `dtrain` channel points at
    OUTPUT/NAME/dtrain/, where you put a fresh id_ed25519 (docs/other-tools.md)."""
    launcher = spec.launcher or "mpirun"
    needs_key = spec.workers > 1 and launcher_registry.get(launcher).needs_ssh
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
    refused = REFUSED
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

    def run(self, cfg: Mapping[str, Any], given: Mapping[str, Any], count: int | None, *, output: str | None,
            session: Any, note: Callable[[], None], err: Callable[[str], None] = print, force: bool = False) -> int:
        import boto3

        from dtrain.launch.jobs import jobfile, launchers, sagemaker as sm

        if cfg["instance_type"] is None:
            raise LaunchError("--instance-type is required with --target sagemaker (e.g. ml.g5.12xlarge)")
        values.instance_type("--instance-type", cfg["instance_type"], sagemaker=True)
        launcher = given.get("launcher")  # default: by the image's family, as `dtrain sagemaker run`
        if launcher is not None:
            values.choice("--launcher", launcher, launchers.names(sagemaker=True))
        if cfg["name"] is not None:
            sm.check_job_name("--name", cfg["name"])
        timeout = jobfile.number("timeout", cfg["timeout"]) if cfg["timeout"] is not None else None
        workdir = Path(cfg["workdir"] or ".")
        if not workdir.is_dir():
            raise LaunchError(f"--workdir {workdir}: not a directory")
        opts = sm.RunOptions(image=cfg["image"], role_arn=cfg["role"] or "", command=tuple(cfg["command"]),
                             instances=count or 1, instance_type=cfg["instance_type"], name=cfg["name"],
                             launcher=launcher, env=env(cfg), workdir=workdir, wait=not cfg["detach"],
                             **({"max_runtime_s": max(1, math.ceil(float(timeout)))} if timeout is not None else {}))
        session = session or boto3.session.Session(region_name=cfg["region"])
        note()
        job, code = sm.run(opts, session=session)
        if cfg["detach"]:
            print(job)
        return code


TARGET = SageMaker()
