"""`dtrain sagemaker`: SageMaker's task (the work: launch/sagemaker/).

Each task is declared here, beside its body: tasks.py names them for Invoke."""

from __future__ import annotations

import sys

from dtrain.launch.cli_support import task, user_errors, _int_flag, _choice_flag, _launcher_names, _image_flag  # noqa: F401
from dtrain.launch.cli.jobs import _jobfile, _remainder
from dtrain.launch.sagemaker.defaults import DEFAULT_MAX_RUN, RUN_DEFAULTS


@task(iterable=["input", "env", "metric", "from_job", "input_task", "dependencies", "tag"], help={
    "action": "run",
    "instances": f"number of instances (default {RUN_DEFAULTS['instances']})",
    "instance_type": f"e.g. ml.p3.2xlarge (default {RUN_DEFAULTS['instance_type']})",
    "image": "image reference in ECR (built and pushed here)",
    "role": "SageMaker execution role ARN (default: the account's dtrain-sagemaker role)",
    "create_role": "without --role: make the role dtrain-sagemaker when the account has none (SageMaker's trust; "
                   "ECR pull, its logs and metrics, the job's S3 buckets), reused by later runs",
    "input": "NAME=DIR or NAME=s3://BUCKET/PREFIX: an input channel at /opt/ml/input/data/NAME, $SM_CHANNEL_NAME "
             "(a local DIR is uploaded under the job's prefix first; repeatable)",
    "from_job": "[NAME=]JOB: an earlier job's output (model.tar.gz, output.tar.gz) as channel NAME "
                "(default previous; repeatable)",
    "on_demand": "on-demand instances (default: managed spot, resumable from the state directory)",
    "volume_size": f"GiB of EBS storage per instance (default {RUN_DEFAULTS['volume_gb']})",
    "max_run": f"run-time limit: seconds or a duration like 2h, 90m, 1h30m (default {DEFAULT_MAX_RUN})",
    "metric": "NAME=REGEX: a metric SageMaker takes from the log (the regex's first group; repeatable)",
    "task": "task name: runs of the same task share a state directory; a task Completed with the same code "
            "and settings is skipped, its output reused (default: the workdir's name)",
    "project": f"project the tasks belong to (a tag; the default output's prefix; default {RUN_DEFAULTS['project']})",
    "force": "run the task even when it Completed with the same code and settings",
    "input_task": "[CHANNEL=]TASK: the output of TASK's last job (Completed) as channel CHANNEL (default: "
                  "TASK's name; repeatable)",
    "dependencies": "DIR: a local package sent with the code (workdir rules) and put on PYTHONPATH as "
                    "`import NAME` (repeatable)",
    "tag": "KEY=VALUE: a tag on the training job (repeatable)",
    "local": "run the job's container on this machine's Docker, with SageMaker's /opt/ml under "
             "DOWNLOAD/JOB/opt-ml (one instance, local --input only; nothing reaches AWS)",
    "state_dir": "S3 URI of the state directory, /opt/ml/checkpoints in the job (default OUTPUT/state/TASK/)",
    "output": "S3 path for code, key, inputs, state and the model (default s3://sagemaker-REGION-ACCOUNT/PROJECT)",
    "workdir": "directory uploaded as the `code` channel; the command runs there, after its requirements.txt "
               "is installed (default: .)",
    "launcher": "mpirun or torchrun (default: torchrun for pytorch-ddp images, else mpirun)",
    "slots": "processes per instance (default: its GPUs, or 1)",
    "name": "training job name (default TASK-YYYYmmdd-HHMMSS)",
    "env": "K=V in the containers' environment (repeatable)",
    "wait": "stream the logs until the job ends, then download the output (default; --no-wait: wait until it has started, remove its key from S3, print the name)",
    "download": f"local directory for the output and the log, DIR/JOB/logs.txt (default ./{RUN_DEFAULTS['download']})",
    "region": "AWS region", "profile": "AWS profile",
    "yes": "go on without asking, whatever the price per hour",
    "confirm_above": "ask before a job above this many USD per hour (default $DTRAIN_CONFIRM_ABOVE, else 10); "
                     "without a terminal, refuse unless --yes",
})
def sagemaker(c, action, instances=None, instance_type=None, image=None, role=None, input=None,
              from_job=None, on_demand=False, volume_size=None, max_run=None, metric=None, task=None,
              state_dir=None, output=None, workdir=".", launcher=None, slots=None, name=None, env=None, wait=True,
              download=None, region=None, profile=None, project=None, force=False, input_task=None,
              dependencies=None, tag=None, create_role=False, local=False, yes=False, confirm_above=None):
    """Run a command as a distributed SageMaker training job: dtrain sagemaker run --instances 2 ... -- python train.py"""
    from pathlib import Path

    import boto3

    from dtrain.launch.errors import LaunchError
    from dtrain import values
    from dtrain.launch.sagemaker import engine as sm

    with user_errors():
        if action != "run":
            raise LaunchError(f"unknown action {action!r}: use run")
        _image_flag(image)
        if instance_type is not None:
            values.instance_type("--instance-type", instance_type, sagemaker=True)
        if launcher is not None:
            _choice_flag("--launcher", launcher, _launcher_names(sagemaker=True))
        if name is not None:
            sm.check_job_name("--name", name)
        if not Path(workdir).is_dir():
            raise LaunchError(f"--workdir {workdir}: not a directory")
        inputs = sm.parse_inputs(input or [])
        from_jobs = sm.parse_from_jobs(from_job or [], inputs)
        opts = sm.run_options(image=image or "", role_arn=role or "", command=_remainder(),
                              instances=_int_flag("--instances", instances, 1, 1000) if instances is not None else None,
                              instance_type=instance_type,
                              name=name, launcher=launcher,
                              slots=_jobfile.number("slots", slots) if slots is not None else None, inputs=inputs,
                              from_jobs=from_jobs, project=sm.check_project(project) if project is not None else None,
                              force=force,
                              input_tasks=sm.parse_input_tasks(input_task or [], {**inputs, **from_jobs}),
                              dependencies=sm.parse_dependencies(dependencies or []), tags=sm.parse_tags(tag or []),
                              create_role=create_role, task_state=True,
                              env=values.env_pairs("--env", env), spot=not on_demand, output_s3=output,
                              workdir=Path(workdir), wait=wait, **({"download": Path(download)} if download is not None else {}),
                              volume_gb=_jobfile.number("volume_size", volume_size) if volume_size is not None else None,
                              max_runtime_s=sm.parse_duration(max_run) if max_run is not None else None,
                              metrics=sm.parse_metrics(metric or []), task=task, state_s3=state_dir)
        if local:
            job, code = sm.run_local(opts)
        else:
            from functools import partial

            from dtrain.launch.infra import pricing

            gate = partial(pricing.sagemaker_gate, instance_type=opts.instance_type, count=opts.instances,
                           spot=opts.spot, above=pricing.threshold(confirm_above), yes=yes,
                           hours=opts.max_runtime_s / 3600)
            job, code = sm.run(opts, session=boto3.session.Session(profile_name=profile, region_name=region),
                               confirm=gate)
        if not wait:
            print(job)
        sys.exit(code)
