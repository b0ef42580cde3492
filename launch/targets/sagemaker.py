"""`--target sagemaker`: the launch submitted as a SageMaker training job (launch/jobs/sagemaker.py's
`run`, as `dtrain sagemaker run` does): as many instances as the launch names nodes, the workdir
as its code channel, the launch's timeout as its run-time limit."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dtrain import values
from dtrain.launch.errors import LaunchError
from dtrain.launch.targets.base import IGNORED, REFUSED, Target
from dtrain.launch.targets.common import env


class SageMaker(Target):
    name = "sagemaker"
    refused = REFUSED
    ignored = IGNORED

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
