"""`dtrain manifest`: job descriptions for other tools (the work: launch/other_tools/).

Each task is declared here, beside its body: tasks.py names them for Invoke."""

from __future__ import annotations

import sys

from dtrain.launch.cli_support import task, user_errors, _int_flag, _choice_flag, _launcher_names, _image_flag  # noqa: F401
from dtrain.launch.cli.jobs import _force_flag, _remainder


@task(iterable=["env", "node_selector"], help={
    "for_": "trainjob, jobset, mpijob, pytorchjob, ecs or sagemaker",
    "image": "image reference (built here, pushed with dtrain push)",
    "workers": "workers / replicas / instances (default 2)",
    "gpus_per_worker": "GPUs per worker (0: CPU; default: --instance-type's, else 0)",
    "name": "job name (default: the image's repository and a short hash of the command, e.g. pytorch-ddp-1a2b3c)",
    "launcher": "mpirun or torchrun where the tool allows both; ray with --for ecs (Ray head and "
                "worker services, seed 001)",
    "ray_head_address": "ECS + ray: DNS name or IP the workers join the head at "
                        "(default ray-head.dtrain.internal; docs/other-tools.md)",
    "ecs_cluster": "ECS + ray: cluster of the services (default dtrain)",
    "env": "K=V for every rank (repeatable); Kubernetes / ECS: the file names K only, its value comes from a "
           "secret (printed: how to make it)",
    "node_selector": "K=V Kubernetes nodeSelector (repeatable)",
    "namespace": "Kubernetes namespace",
    "slots_per_worker": "MPIJob slotsPerWorker (default: GPUs per worker, or 1)",
    "role_arn": "SageMaker execution role ARN",
    "output_s3": "SageMaker output S3 path",
    "instance_type": "SageMaker instance type; Kubernetes / ECS: the nodes' EC2 type (its EFA interfaces "
                     "on every worker, e.g. p4d.24xlarge)",
    "execution_role_arn": "ECS task execution role ARN",
    "ssh_key_secret_arn": "ECS: Secrets Manager ARN of the job's SSH key",
    "env_secret_arn": "ECS: Secrets Manager ARN of the JSON object holding the --env values",
    "output": "write to this file instead of stdout",
    "force": "with --output: replace the file there even where dtrain did not write it",
    "timeout": "trainjob, jobset: the job's time limit in seconds (activeDeadlineSeconds), as launch --timeout",
    "max_restarts": "trainjob, jobset: restart the whole job this many times (JobSet failurePolicy.maxRestarts), "
                    "as launch --max-restarts",
})
def manifest(c, for_=None, image=None, workers="2", gpus_per_worker=None, name=None, launcher=None,
             env=None, node_selector=None, namespace=None, slots_per_worker=None, role_arn=None,
             output_s3=None, instance_type=None, execution_role_arn=None, ssh_key_secret_arn=None,
             output=None, ray_head_address=None, ecs_cluster=None, env_secret_arn=None, force=False, timeout=None,
             max_restarts=None):
    """Job description for Kubeflow Trainer v2 (TrainJob), JobSet, MPIJob/PyTorchJob, ECS or SageMaker, schema-validated.

    dtrain manifest --for mpijob --image REF -- CMD"""
    from dtrain.launch.other_tools import manifests as mf

    from dtrain import values

    with user_errors():
        _image_flag(image)
        if for_ is not None:
            _choice_flag("--for", for_, mf.TARGETS)
        given_name = name is not None
        name = values.name("--name", name) if given_name else mf.default_name(image, _remainder())
        values.env_pairs("--env", env)
        if launcher is not None:
            _choice_flag("--launcher", launcher, _launcher_names(manifests=True))
        if slots_per_worker is not None:
            _int_flag("--slots-per-worker", slots_per_worker, 1, 1024)
        if instance_type is not None and for_ == "sagemaker":
            values.instance_type("--instance-type", instance_type, sagemaker=True)
        elif instance_type is not None:
            values.ec2_instance_type("--instance-type", instance_type)
        _force_flag(force, output)
        mf.check_output(output, force)
        spec = mf.spec_from_args(
            for_, image, _remainder(), workers=_int_flag("--workers", workers, 1, 1024),
            gpus_per_worker=None if gpus_per_worker is None else _int_flag("--gpus-per-worker", gpus_per_worker, 0, 64),
            name=name,
            env=env, node_selector=node_selector, launcher=launcher, namespace=namespace,
            slots_per_worker=slots_per_worker, role_arn=role_arn, output_s3=output_s3,
            instance_type=instance_type, execution_role_arn=execution_role_arn,
            ssh_key_secret_arn=ssh_key_secret_arn, ray_head_address=ray_head_address,
            ecs_cluster=ecs_cluster, env_secret_arn=env_secret_arn,
            **mf.limits(for_, timeout=timeout, max_restarts=max_restarts))  # trainjob, jobset
        text = mf.render(spec)
        for line in mf.placeholders(spec):
            print(line, file=sys.stderr)
        print(mf.write(text, output, force), end="")
        if not given_name:  # once written: the name dtrain chose
            print(f"[manifest] name {name}: from the image and the command (--name NAME to choose)", file=sys.stderr)
