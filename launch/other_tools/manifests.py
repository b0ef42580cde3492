"""Job descriptions for other tools: Kubeflow MPIJob/PyTorchJob, an ECS task definition, a
SageMaker CreateTrainingJob request, for an image built here.

    ManifestSpec -> context(spec) (pure) -> templates/manifests/<target>.j2 -> text
                 -> validate(target, text): the operators' CRD schemas (launch/schemas/) or
                    botocore's own service models; every problem names the field at fault

The launch commands inside come from the launcher modules (launch/jobs/launchers/), the
builders `dtrain launch` uses, so flags cannot drift between the two.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import jinja2
import yaml

from dtrain.launch.jobs import container, launchers
from dtrain.launch.jobs.launchers.mpirun import mpirun_argv, training_env
from dtrain.launch.jobs.launchers.ray import RAY_PORT, ray_head_argv, ray_job_argv, ray_worker_argv
from dtrain.launch.jobs.launchers.torchrun import torchrun_argv, torchrun_env
from dtrain.launch.errors import LaunchError
from dtrain.launch.infra import instance_types
from dtrain.launch.jobs import sagemaker

from dtrain import ROOT, contract, outfile
TEMPLATES = ROOT / "templates" / "manifests"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
EXAMPLES = ROOT / "docs" / "examples"

Target = Literal["mpijob", "pytorchjob", "ecs", "sagemaker"]
TARGETS: tuple[str, ...] = ("mpijob", "pytorchjob", "ecs", "sagemaker")
FILENAMES = {"mpijob": "mpijob.yaml", "pytorchjob": "pytorchjob.yaml",
             "ecs": "ecs-task-definition.json", "sagemaker": "sagemaker-training-job.json",
             "ecs-ray": "ecs-ray.json"}  # ecs-ray: --for ecs --launcher ray (template_name)

POD_IFACE = "eth0"  # a pod's (and a SageMaker container's) one NIC
MPI_HOSTFILE = "/etc/mpi/hostfile"  # written by the MPI operator v2 into the launcher
SSH_MOUNT = "/root/.ssh"  # where the MPI operator mounts the job's key Secret
MASTER_PORT = 23456  # the training operator's default; it sets MASTER_PORT from it
MPI_SSH = container.ssh_options(attempts=10)  # the operator's own retry while workers start
SAGEMAKER_INSTANCE = {0: "ml.m5.2xlarge", 1: "ml.g5.xlarge", 4: "ml.g5.12xlarge", 8: "ml.p4d.24xlarge"}
PLACEHOLDER_ROLE = "arn:aws:iam::123456789012:role/SageMakerExecutionRole"
PLACEHOLDER_S3 = "s3://my-bucket/dtrain/output"
PLACEHOLDER_EXECUTION_ROLE = "arn:aws:iam::123456789012:role/ecsTaskExecutionRole"
PLACEHOLDER_KEY_SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:dtrain-ssh-key"
PLACEHOLDER_ENV_SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:dtrain-env"
# --env values never reach a Kubernetes or ECS description (a file meant to be committed): each
# NAME is read from a secret the user creates from a file (env_secret_notes says how). Kubernetes:
# the Secret ENV_SECRET_NAME.format(name=job), one key per NAME (valueFrom.secretKeyRef); ECS: a
# Secrets Manager secret holding a JSON object, one key per NAME (secrets[].valueFrom ARN:NAME::).
ENV_SECRET_NAME = "{name}-env"

# What each target's template runs, as the launchers' properties (launch/jobs/launchers/base.py):
# a launcher without them is refused, one line naming the ones that fit.
TARGET_LAUNCHERS: dict[str, dict[str, bool]] = {
    "mpijob": {"per_node": False, "starts_cluster": False},  # the Launcher pod's one mpirun
    "pytorchjob": {"per_node": True, "starts_cluster": False},  # one torchrun per replica
    "ecs": {},  # the node container, or Ray's head and workers
    "sagemaker": {"sagemaker": True},  # launch/node/sagemaker_train.py runs it
}
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"  # the kubelet's well-known label
# EFA in a pod (the EKS user guide, "Run machine learning training on Amazon EKS with Elastic
# Fabric Adapter", and its EFA device plugin): the plugin's resource, one per interface; 2 MiB
# huge pages for libfabric, with a memory request beside them (Kubernetes asks for one);
# IPC_LOCK to pin memory for RDMA (the memlock limit itself is the node runtime's: unlimited
# on the EKS-optimized accelerated AMIs; a pod spec has no ulimit field).
EFA_RESOURCE = "vpc.amazonaws.com/efa"
EFA_HUGEPAGES = ("hugepages-2Mi", "5120Mi")
EFA_CAPABILITIES = ("IPC_LOCK",)
EFA_DEVICE = "/dev/infiniband/uverbs{}"  # ECS: one device per EFA interface (linuxParameters.devices)

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # DNS-1035 label: pods, services
_NAMESPACE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # DNS-1123 label, at most 63
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ManifestError(LaunchError):
    """A generated or given document does not match the tool's schema; one problem per line."""


class CommandRefused(LaunchError):
    """The target's document runs no command and one was given; `why` says so without naming
    where the command came from (`dtrain launch` names the job file's line)."""

    def __init__(self, message: str, why: str) -> None:
        super().__init__(message)
        self.why = why


@dataclass(frozen=True)
class ManifestSpec:
    target: Target
    image: str
    command: tuple[str, ...]  # mpirun: the program (python train.py); torchrun: the script (train.py)
    name: str = "dtrain-job"
    workers: int = 2  # nodes (pods, ECS tasks, SageMaker instances)
    gpus_per_worker: int = 0  # 0: CPU
    slots_per_worker: int | None = None  # ranks per worker; default: the GPUs, or 1 on CPU
    launcher: str | None = None  # a launcher with `manifests` (launch/jobs/launchers/); default by target
    # ECS with launcher ray: the DNS name workers join the head at (see ecs_ray_context)
    ray_head_address: str = "ray-head.dtrain.internal"
    ecs_cluster: str = "dtrain"  # ECS: the cluster the Ray services run in
    env: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)  # Kubernetes
    namespace: str | None = None  # Kubernetes
    shm_size_mib: int = 16384  # ECS /dev/shm; Kubernetes: a memory-backed emptyDir
    memory_reservation_mib: int = 4096  # ECS
    execution_role_arn: str = PLACEHOLDER_EXECUTION_ROLE  # ECS: reads the ssh key secret
    ssh_key_secret_arn: str = PLACEHOLDER_KEY_SECRET  # ECS: the job's private key (Secrets Manager)
    env_secret_arn: str = PLACEHOLDER_ENV_SECRET  # ECS: the secret (a JSON object) the env values come from
    role_arn: str = PLACEHOLDER_ROLE  # SageMaker
    output_s3: str = PLACEHOLDER_S3  # SageMaker
    # SageMaker's type (default by GPUs); Kubernetes and ECS: the nodes' EC2 type, whose EFA
    # interfaces every worker gets (Kubernetes: also the workers' nodeSelector); Kubernetes
    # without it: the node_selector's node.kubernetes.io/instance-type, if any
    instance_type: str | None = None
    volume_gb: int = 100  # SageMaker
    max_runtime_s: int = 86400  # SageMaker

    @property
    def slots(self) -> int:
        return self.slots_per_worker or max(self.gpus_per_worker, 1)

    @property
    def ec2_type(self) -> str | None:
        """The workers' EC2 instance type, where the spec names one (ml.p4d.24xlarge: p4d.24xlarge)."""
        given = self.instance_type or (self.node_selector.get(INSTANCE_TYPE_LABEL) if self.target in _API else None)
        return given.removeprefix("ml.") if given else None

    @property
    def efa(self) -> int:
        """EFA interfaces each worker gets: the type's (launch/infra/instance_types.py, EC2's
        DescribeInstanceTypes), 0 without (a type the data lacks: refused in _check)."""
        return (instance_types.efa_count(self.ec2_type) or 0) if self.ec2_type else 0


_LABEL_NAME_RE = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", re.ASCII)
_DNS_SUBDOMAIN_RE = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*", re.ASCII)
_ECS_CLUSTER_RE = re.compile(r"[A-Za-z0-9_-]{1,255}", re.ASCII)


def check_label(flag: str, key: str, value: str) -> None:
    """A Kubernetes label (nodeSelector) KEY=VALUE: KEY is [PREFIX/]NAME, PREFIX a DNS subdomain
    of at most 253, NAME and VALUE at most 63 of letters, digits, - _ . (alphanumeric at both
    ends; VALUE may be empty). LaunchError naming the flag otherwise."""
    prefix, slash, name = key.rpartition("/")
    prefix_ok = not slash or (len(prefix) <= 253 and _DNS_SUBDOMAIN_RE.fullmatch(prefix))
    if not (_LABEL_NAME_RE.fullmatch(name) and prefix_ok):
        raise LaunchError(f"{flag} {key!r}: not a Kubernetes label key ([PREFIX/]NAME: NAME at most 63 letters, "
                          "digits, - _ . starting and ending alphanumeric; PREFIX a DNS name), e.g. "
                          "node.kubernetes.io/instance-type=p4d.24xlarge")
    if value and not _LABEL_NAME_RE.fullmatch(value):
        raise LaunchError(f"{flag} {key}={value!r}: not a Kubernetes label value (at most 63 letters, digits, - _ . "
                          "starting and ending alphanumeric, or empty)")


def _check(spec: ManifestSpec) -> None:
    if spec.target not in TARGETS:
        raise LaunchError(f"--for {spec.target}: use one of {', '.join(TARGETS)}")
    if not spec.image or spec.image.startswith("-") or any(c.isspace() for c in spec.image):
        raise LaunchError(f"bad image {spec.image!r}")
    if spec.launcher is not None and (spec.launcher not in launchers.LAUNCHERS
                                      or not launchers.get(spec.launcher).manifests):
        ecs = {n for n in launchers.names(manifests=True) if launchers.get(n).starts_cluster}
        raise LaunchError(f"--launcher {spec.launcher}: use "
                          + launchers.choices([n + " (ECS)" * (n in ecs) for n in launchers.names(manifests=True)]))
    cluster = spec.launcher is not None and launchers.get(spec.launcher).starts_cluster  # Ray's head and workers
    node_only = spec.target == "ecs" and not cluster  # the node container: sshd on 2022
    if node_only and spec.command:
        why = ("--for ecs: the task definition is the node container (sshd on 2022), it runs no command; run the "
               "job with mpirun on one of the tasks (docs/other-tools.md, \"Amazon ECS\"), or use --launcher ray")
        raise CommandRefused(why + "; give no command after `--`", why)
    if not spec.command and not node_only:
        raise LaunchError("no command: put it after `--`, e.g. dtrain manifest ... -- python train.py")
    if not _NAME_RE.match(spec.name) or len(spec.name) > 40:
        raise LaunchError(f"bad job name {spec.name!r} (lower-case letters, digits and -, at most 40)")
    if spec.namespace is not None and not _NAMESPACE_RE.match(spec.namespace):
        raise LaunchError(f"--namespace {spec.namespace!r}: not a Kubernetes namespace (a DNS-1123 label: "
                          "lower-case letters, digits and -, starting and ending with a letter or digit, at most 63)")
    for key, value in spec.node_selector.items():
        check_label("--node-selector", key, value)
    if not _ECS_CLUSTER_RE.fullmatch(spec.ecs_cluster):
        raise LaunchError(f"--ecs-cluster {spec.ecs_cluster!r}: not an ECS cluster name (letters, digits, - and _, "
                          "at most 255)")
    for name in spec.env:
        if not _ENV_NAME_RE.match(name):
            raise LaunchError(f"--env {name!r}: not an environment variable name (letters, digits and _)")
    if spec.workers < 1 or spec.gpus_per_worker < 0 or spec.slots < 1:
        raise LaunchError(f"workers={spec.workers}, gpus per worker={spec.gpus_per_worker}: must be "
                          "at least 1 worker and 0 or more GPUs")
    most = instance_types.gpu_count(spec.ec2_type) if spec.ec2_type else None
    if spec.ec2_type and most is None and spec.target != "sagemaker":  # GPUs, EFA unknown: said, not 0
        raise LaunchError(f"{_type_flag(spec)}: {instance_types.missing(spec.ec2_type)}")
    if most is not None and spec.gpus_per_worker > most:
        raise LaunchError(f"--gpus-per-worker {spec.gpus_per_worker}: a {spec.ec2_type} has {most} GPUs "
                          f"({_type_flag(spec)}); give at most {most}")
    if cluster and spec.target != "ecs":
        raise LaunchError(f"--launcher {spec.launcher}: only for --for ecs (a Ray head and worker services), "
                          f"not {spec.target}")
    fits = TARGET_LAUNCHERS[spec.target]
    if spec.launcher is not None and not all(getattr(launchers.get(spec.launcher), k) == v for k, v in fits.items()):
        runs = {"mpijob": "one mpirun in the Launcher pod", "pytorchjob": "one command per replica",
                "ecs": "", "sagemaker": "launch/node/sagemaker_train.py"}[spec.target]
        raise LaunchError(f"--launcher {spec.launcher}: not for --for {spec.target} ({runs}); use "
                          + launchers.choices(launchers.names(manifests=True, **fits)))
    if cluster and not re.match(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$", spec.ray_head_address):
        raise LaunchError(f"--ray-head-address {spec.ray_head_address!r}: expected a DNS name or IP address")
    if spec.target == "sagemaker" and not spec.instance_type and spec.gpus_per_worker not in SAGEMAKER_INSTANCE:
        raise LaunchError(f"SageMaker: give --instance-type for {spec.gpus_per_worker} GPUs per instance")


def _type_flag(spec: ManifestSpec) -> str:
    """The flag that named the workers' EC2 type."""
    return (f"--instance-type {spec.instance_type}" if spec.instance_type
            else f"--node-selector {INSTANCE_TYPE_LABEL}={spec.ec2_type}")


def _resources(spec: ManifestSpec) -> dict[str, Any]:
    """A worker pod's resources: its GPUs; on an EFA type also every EFA interface and the huge
    pages (limits equal to requests: extended resources and huge pages take no overcommit),
    with a memory request (not a limit) as Kubernetes asks beside huge pages."""
    limits: dict[str, Any] = {"nvidia.com/gpu": spec.gpus_per_worker} if spec.gpus_per_worker else {}
    if not spec.efa:
        return {"limits": limits} if limits else {}
    limits |= {EFA_RESOURCE: spec.efa, EFA_HUGEPAGES[0]: EFA_HUGEPAGES[1]}
    return {"limits": limits, "requests": {**limits, "memory": f"{spec.memory_reservation_mib}Mi"}}


def _worker_selector(spec: ManifestSpec) -> dict[str, str]:
    """The worker pods' nodeSelector: the given one, and the instance type where one is given."""
    if spec.instance_type and spec.target in _API:
        return {INSTANCE_TYPE_LABEL: spec.ec2_type, **spec.node_selector}
    return dict(spec.node_selector)


def _ecs_devices(spec: ManifestSpec) -> list[dict[str, Any]]:
    """ECS: the type's EFA devices mapped into the container (as AWS Batch's and ECS's EFA docs)."""
    return [{"hostPath": EFA_DEVICE.format(i), "containerPath": EFA_DEVICE.format(i),
             "permissions": ["read", "write", "mknod"]} for i in range(spec.efa)]


def mpijob_mpirun_argv(spec: ManifestSpec) -> list[str]:
    """The launcher's mpirun: operator-written hostfile, pod NIC, the images' sshd port. The
    user's env goes as `-x NAME` only, its values in the launcher pod's env (as `dtrain launch`
    keeps them out of argv): an argv shows in `ps` and in every describe of the pod."""
    return mpirun_argv(None, list(spec.command), iface=POD_IFACE, env_names=list(spec.env),
                                ssh=MPI_SSH,
                                hostfile=MPI_HOSTFILE, np=spec.workers * spec.slots)


def pytorchjob_torchrun_argv(spec: ManifestSpec) -> list[str]:
    """torchrun on every replica; the operator sets RANK (0 on the Master) and MASTER_* per pod."""
    return torchrun_argv(spec.workers, "$(RANK)", spec.slots, "$(MASTER_ADDR)", "$(MASTER_PORT)",
                                  list(spec.command))


def sagemaker_job(spec: ManifestSpec) -> sagemaker.TrainingJob:
    """The training job `dtrain sagemaker run` would create, for an image path command (no
    workdir upload). Across instances mpirun needs the job key: the `dtrain` channel points at
    OUTPUT/NAME/dtrain/, where you put a fresh id_ed25519 (docs/other-tools.md)."""
    launcher = spec.launcher or "mpirun"
    needs_key = spec.workers > 1 and launchers.get(launcher).ranks_over_ssh
    job_s3 = f"{spec.output_s3.rstrip('/')}/{spec.name}"
    return sagemaker.TrainingJob(
        name=spec.name, image=spec.image, role_arn=spec.role_arn, command=spec.command,
        output_s3=spec.output_s3, instances=spec.workers,
        code_s3=f"{job_s3}/{sagemaker.CODE_CHANNEL}/",  # the command's work directory (dtrain_workdir)
        instance_type=spec.instance_type or SAGEMAKER_INSTANCE[spec.gpus_per_worker], launcher=launcher,
        slots=spec.slots, key_s3=f"{job_s3}/{sagemaker.KEY_CHANNEL}/" if needs_key else None,
        env=spec.env, volume_gb=spec.volume_gb, max_runtime_s=spec.max_runtime_s)


def _ecs_command(spec: ManifestSpec) -> list[str]:
    """Install the job key from the secret env var, drop the variable, then sshd on 2022."""
    script = ("set -eu; umask 077; mkdir -p /root/.ssh; "
              'printf "%s\\n" "$DTRAIN_SSH_KEY" > /root/.ssh/id_ed25519; '
              "ssh-keygen -y -f /root/.ssh/id_ed25519 > /root/.ssh/authorized_keys; "
              f"unset DTRAIN_SSH_KEY; exec {contract.ENTRYPOINT}")
    return ["/bin/bash", "-c", script]


def ecs_ray_context(spec: ManifestSpec) -> dict[str, Any]:
    """Seed 001 on ECS: a head service (1 task, no GPU) and a worker service (spec.workers tasks,
    one per instance, spec.gpus_per_worker GPUs each), host networking, the same `ray start`
    argv as `dtrain launch --launcher ray` (blocking: the task's main process).

    Workers find the head by a DNS name (spec.ray_head_address) that the user points at the
    head's instance (a Route 53 private record, or the instance's private DNS name): ECS
    service discovery (Cloud Map) registers host-network tasks as SRV records only, which
    `ray start --address` cannot read (A records need awsvpc networking). A worker that
    starts before the head fails and ECS starts it again, until it joins."""
    head = f"{spec.ray_head_address}:{RAY_PORT}"
    return {
        "ray_head": ray_head_argv(RAY_PORT, num_gpus=0, block=True),
        "ray_worker": ray_worker_argv(head, num_gpus=spec.gpus_per_worker, block=True),
        "ray_job": shlex.join(ray_job_argv(head, list(spec.command))),
        "ray_port": RAY_PORT,
    }


def _literal(builtin: dict[str, str], spec: ManifestSpec) -> dict[str, str]:
    """dtrain's own env of a pod (the NIC, NCCL's), less what the user's env gives (from the secret)."""
    return {k: v for k, v in builtin.items() if k not in spec.env}


def env_secret(spec: ManifestSpec) -> str:
    """Where the user's env values come from: the Kubernetes Secret's name, or the ECS secret's ARN."""
    return spec.env_secret_arn if spec.target == "ecs" else ENV_SECRET_NAME.format(name=spec.name)


def env_secret_notes(spec: ManifestSpec, via: str = "manifest") -> list[str]:
    """One line naming the env the description reads from a secret and how to make that secret
    from a file (no value on a command line); [] without --env or for SageMaker (its request
    carries the environment)."""
    if not spec.env or spec.target == "sagemaker":
        return []
    names = ", ".join(sorted(spec.env))
    if spec.target == "ecs":
        flag = ("give its ARN with --env-secret-arn" if via == "manifest" else
                "give its ARN with dtrain manifest --for ecs ... --env-secret-arn ARN")
        return [f"[{via}] env {names}: not in the file; each comes from the JSON key of that name in the Secrets "
                f"Manager secret secrets[].valueFrom names: create it from a file holding a JSON object of those "
                f"keys (aws secretsmanager create-secret --name {spec.name}-env --secret-string file://FILE) and "
                f"{flag}"]
    ns = f" --namespace {spec.namespace}" if spec.namespace else ""
    return [f"[{via}] env {names}: not in the file; each comes from the key of that name in the Secret "
            f"{env_secret(spec)}: create it from a file of NAME=VALUE lines (kubectl create secret generic "
            f"{env_secret(spec)} --from-env-file=FILE{ns})"]


def context(spec: ManifestSpec) -> dict[str, Any]:
    """Everything a template needs, derived from one checked spec."""
    _check(spec)
    ctx: dict[str, Any] = {"spec": spec, "name": spec.name, "image": spec.image, "slots": spec.slots,
                           "entrypoint": contract.ENTRYPOINT, "ssh_port": contract.SSH_PORT,
                           "resources": _resources(spec), "capabilities": list(EFA_CAPABILITIES) if spec.efa else [],
                           "shm_size": f"{spec.shm_size_mib}Mi", "devices": _ecs_devices(spec),
                           "node_selector": _worker_selector(spec), "namespace": spec.namespace}
    # the user's env: by name from a secret (env_secret_notes), never its values
    ctx |= {"secret_env": sorted(spec.env), "env_secret": env_secret(spec)}
    if spec.target == "mpijob":
        ctx |= {"mpirun": mpijob_mpirun_argv(spec), "ssh_mount": SSH_MOUNT, "launcher_env": {},
                "env": _literal(training_env(POD_IFACE), spec)}
    elif spec.target == "pytorchjob":
        ctx |= {"torchrun": pytorchjob_torchrun_argv(spec), "master_port": MASTER_PORT,
                "env": _literal(torchrun_env(POD_IFACE), spec)}
    elif template_name(spec) != spec.target:  # ecs-ray
        ctx |= ecs_ray_context(spec)
    elif spec.target == "ecs":
        ctx |= {"command": _ecs_command(spec), "env": {}}
    else:
        ctx |= {"request": sagemaker.create_training_job_request(sagemaker_job(spec))}
    return ctx


def _jinja() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             autoescape=False)
    env.filters["json"] = lambda v: json.dumps(v, ensure_ascii=False)
    env.filters["json_block"] = lambda v: json.dumps(v, ensure_ascii=False, indent=2)
    return env


def template_name(spec: ManifestSpec) -> str:
    cluster = spec.launcher is not None and launchers.get(spec.launcher).starts_cluster
    return f"{spec.target}-{spec.launcher}" if spec.target == "ecs" and cluster else spec.target


_PLACEHOLDERS = {  # target -> (the spec's field, its placeholder, the document's field, the flag)
    "ecs": (("execution_role_arn", PLACEHOLDER_EXECUTION_ROLE, "executionRoleArn", "--execution-role-arn"),
            ("ssh_key_secret_arn", PLACEHOLDER_KEY_SECRET, "secrets DTRAIN_SSH_KEY valueFrom",
             "--ssh-key-secret-arn"),
            ("env_secret_arn", PLACEHOLDER_ENV_SECRET, "secrets (--env) valueFrom", "--env-secret-arn")),
    "ecs-ray": (("execution_role_arn", PLACEHOLDER_EXECUTION_ROLE, "executionRoleArn", "--execution-role-arn"),
                ("env_secret_arn", PLACEHOLDER_ENV_SECRET, "secrets (--env) valueFrom", "--env-secret-arn")),
    "sagemaker": (("role_arn", PLACEHOLDER_ROLE, "RoleArn", "--role-arn"),
                  ("output_s3", PLACEHOLDER_S3, "OutputDataConfig.S3OutputPath", "--output-s3")),
}


def placeholders(spec: ManifestSpec, via: str = "manifest") -> list[str]:
    """One line per placeholder the description holds (a role or secret ARN, an S3 path that
    AWS would refuse), naming the field and the flag that gives it; no values. Ray's ECS
    services take a role and a secret only for --env. via="launch" (`dtrain launch --target T`,
    which has no such flags): the line says to write the description with `dtrain manifest` and
    the flag. Then env_secret_notes: where the --env values come from."""
    name = template_name(spec)
    how = {"manifest": "dtrain manifest {flag}",
           "launch": "or write the description with dtrain manifest --for {target} ... {flag} ARN"}[via]
    return [f"[{via}] {doc_field}: a placeholder, replace it ({how.format(flag=flag, target=spec.target)})"
            for field_name, placeholder, doc_field, flag in _PLACEHOLDERS.get(name, ())
            if getattr(spec, field_name) == placeholder
            and (name == spec.target and field_name != "env_secret_arn" or spec.env)] + env_secret_notes(spec, via)


def render(spec: ManifestSpec) -> str:
    """The document's text, validated (ManifestError names every field at fault)."""
    ctx = context(spec)
    name = template_name(spec)
    text = _jinja().get_template(f"{name}.j2").render(ctx)
    validate(name, load(name, text))
    return text


GENERATED = "# GENERATED by `dtrain manifest"  # the YAML descriptions' first line (templates/manifests/)


def _written_by_dtrain(head: bytes) -> bool:
    """A description dtrain wrote: YAML under its GENERATED first line, or JSON (ECS, SageMaker:
    no comments there) carrying the job label (contract.LABEL_JOB) where the templates put it."""
    if head.startswith(GENERATED.encode()):
        return True
    try:
        doc = json.loads(head)
    except (ValueError, RecursionError):
        return False
    todo, seen = [doc], 0
    while todo and seen < 100_000:
        node = todo.pop()
        seen += 1
        if isinstance(node, dict):
            if contract.LABEL_JOB in node or node.get("Key") == contract.LABEL_JOB:
                return True
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return False


OUTPUT = outfile.Kind(f"no first line {GENERATED}`, no {contract.LABEL_JOB} label", _written_by_dtrain)


def check_output(output: str | None, force: bool = False, flag: str = "--output") -> None:
    """--output's directory exists, and the file there is dtrain's own earlier description or
    none (or --force), not a link, not a device: checked before anything is rendered."""
    if output is not None:
        outfile.check(output, flag=flag, kind=OUTPUT, force=force)


def write(text: str, output: str | None, force: bool = False, flag: str = "--output") -> str:
    """The rendered description into --output (None: nothing written) as dtrain/outfile.py writes
    (no link followed, no foreign file replaced without --force, atomically); what to print: the
    text, or the line that names the file."""
    if not output:
        return text
    outfile.write(output, text, flag=flag, kind=OUTPUT, force=force)
    return f"wrote {output}\n"


def load_target(path: Path) -> str:
    """The target of a file named as in FILENAMES (docs/examples)."""
    return next(t for t, f in FILENAMES.items() if f == Path(path).name)


def load(target: str, text: str) -> dict[str, Any]:
    return yaml.safe_load(text) if target in ("mpijob", "pytorchjob") else json.loads(text)


# ---------------------------------------------------------------- validation


def _strict(node: Any, podspec: dict[str, Any]) -> Any:
    """CRD schema -> JSON Schema that refuses unknown fields, with the strict PodSpec spliced in."""
    if isinstance(node, list):
        return [_strict(n, podspec) for n in node]
    if not isinstance(node, dict):
        return node
    if node.get("x-dtrain-podspec"):
        return copy.deepcopy(podspec)
    out = {k: _strict(v, podspec) for k, v in node.items()}
    if "properties" in out and "additionalProperties" not in out \
            and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_schema(target: str) -> dict[str, Any]:
    """The JSON Schema a Kubernetes document of `target` is checked against."""
    file = {"mpijob": "mpijob-v2beta1.yaml", "pytorchjob": "pytorchjob-v1.yaml"}[target]
    k8s = json.loads((SCHEMAS / "k8s-1.27-podtemplatespec.json").read_text())
    crd = yaml.safe_load((SCHEMAS / file).read_text())
    schema = _strict(crd, {"$ref": "#/$defs/V1PodSpec"})
    schema["properties"]["metadata"] = {"$ref": "#/$defs/V1ObjectMeta"}
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    schema["$defs"] = k8s["$defs"]
    return schema


_BOTO_OPERATIONS = {"ecs": ("ecs", "RegisterTaskDefinition"), "sagemaker": ("sagemaker", "CreateTrainingJob")}
# ecs-ray: one document of four ECS requests, each checked against its own operation's model.
ECS_RAY_PARTS = {"headTaskDefinition": "RegisterTaskDefinition", "workerTaskDefinition": "RegisterTaskDefinition",
                 "headService": "CreateService", "workerService": "CreateService"}
_API = {"mpijob": ("kubeflow.org/v2beta1", "MPIJob"), "pytorchjob": ("kubeflow.org/v1", "PyTorchJob")}


def _path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(document)"


def problems(target: str, doc: Any) -> list[str]:
    """Every schema problem of a document, one line each, naming the field; [] when valid."""
    if target == "ecs-ray":
        return _ecs_ray_problems(doc)
    if target in _BOTO_OPERATIONS:
        return _boto_problems(*_BOTO_OPERATIONS[target], doc)
    import jsonschema

    validator = jsonschema.Draft202012Validator(crd_schema(target))
    out = []
    for err in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
        where = _path(err.absolute_path)
        if err.validator == "additionalProperties" and err.validator_value is False:
            known = set(err.schema.get("properties", {}))
            for extra in sorted(set(err.instance) - known):
                out.append(f"{_path([*err.absolute_path, extra])}: unknown field {extra!r}")
        elif err.validator == "pattern" and "KMGTPE" in err.validator_value:
            out.append(f"{where}: {err.instance!r} is not a Kubernetes quantity (e.g. 8, 500m, 16Gi)")
        else:
            out.append(f"{where}: {err.message}")
    api, kind = _API[target]
    if isinstance(doc, dict) and (doc.get("apiVersion"), doc.get("kind")) != (api, kind):
        out.append(f"apiVersion/kind: expected {api} {kind}, got {doc.get('apiVersion')} {doc.get('kind')}")
    return out


def _boto_problems(service: str, op: str, params: Any) -> list[str]:
    import botocore.session
    from botocore.exceptions import ParamValidationError
    from botocore.validate import validate_parameters

    model = botocore.session.get_session().get_service_model(service).operation_model(op)
    try:
        validate_parameters(params, model.input_shape)
    except ParamValidationError as e:
        report = str(e.kwargs.get("report", e))
        return [line.strip() for line in report.splitlines() if line.strip()]
    return []


def _ecs_ray_problems(doc: Any) -> list[str]:
    if not isinstance(doc, dict):
        return ["(document): expected an object with " + ", ".join(ECS_RAY_PARTS)]
    out = [f"{k}: unknown part (known: {', '.join(ECS_RAY_PARTS)})" for k in doc if k not in ECS_RAY_PARTS]
    for part, op in ECS_RAY_PARTS.items():
        if part not in doc:
            out.append(f"{part}: missing ({op} request)")
        else:
            out += [f"{part} ({op}): {p}" for p in _boto_problems("ecs", op, doc[part])]
    return out


def validate(target: str, doc: Any) -> None:
    found = problems(target, doc)
    if found:
        what = {"mpijob": "MPIJob (mpi-operator v0.4 CRD)", "pytorchjob": "PyTorchJob (training-operator v1.7.0 CRD)",
                "ecs": "ECS RegisterTaskDefinition", "sagemaker": "SageMaker CreateTrainingJob",
                "ecs-ray": "ECS Ray head/worker (RegisterTaskDefinition, CreateService)"}[target]
        raise ManifestError(f"{what}: {len(found)} problem(s):\n" + "\n".join(f"  {p}" for p in found))


def _pairs(items: list[str] | None, what: str) -> dict[str, str]:
    """K=V flags; --env's by the one env rule (dtrain/values.py env_pair)."""
    from dtrain import values

    if what == "--env":
        try:
            return values.env_pairs(what, items)
        except values.BadValue as e:
            raise LaunchError(str(e)) from None
    out = {}
    for kv in items or []:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            raise LaunchError(f"{what} {kv!r}: expected K=V")
        out[k] = v
    return out


def spec_from_args(target: str, image: str | None, command: list[str], *, workers: int | str = 2,
                   gpus_per_worker: int | str | None = None, name: str = "dtrain-job",
                   env: list[str] | None = None, node_selector: list[str] | None = None,
                   **options: Any) -> ManifestSpec:
    """ManifestSpec from `dtrain manifest` flags (strings, repeatable K=V lists); the rest of
    ManifestSpec's fields pass through by name (None means the default). GPUs per worker not
    given: the instance type's (Kubernetes, ECS; default_gpus), else 0."""
    if not image:
        raise LaunchError("--image is required")
    try:
        nums = {"workers": int(workers), "gpus_per_worker": int(gpus_per_worker) if gpus_per_worker is not None
                else default_gpus(target, options.get("instance_type"), _pairs(node_selector, "--node-selector"))}
        for key in ("slots_per_worker", "shm_size_mib", "memory_reservation_mib", "volume_gb", "max_runtime_s"):
            if options.get(key) is not None:
                options[key] = int(options[key])
    except ValueError as e:
        raise LaunchError(f"expected a number: {e}") from None
    known = set(ManifestSpec.__dataclass_fields__)
    unknown = set(options) - known
    if unknown:
        raise ValueError(f"spec_from_args: unknown options {sorted(unknown)}")
    return ManifestSpec(target, image, tuple(command), name=name, env=_pairs(env, "--env"),
                        node_selector=_pairs(node_selector, "--node-selector"), **nums,
                        **{k: v for k, v in options.items() if v is not None})


def default_gpus(target: str, instance_type: str | None, node_selector: dict[str, str]) -> int:
    """GPUs per worker when --gpus-per-worker is not given: the nodes' EC2 type's
    (launch/infra/instance_types.py, EC2's DescribeInstanceTypes; --instance-type, or the
    Kubernetes nodeSelector's node.kubernetes.io/instance-type), 0 for a type without GPUs or
    none named; a type the data lacks is refused (one line), not taken for 0 GPUs. SageMaker:
    0 (its instance type is chosen by the GPUs, not the other way)."""
    if target == "sagemaker":
        return 0
    given = instance_type or (node_selector.get(INSTANCE_TYPE_LABEL) if target in _API else None)
    if not given:
        return 0
    gpus = instance_types.gpu_count(given)
    if gpus is None:
        flag = f"--instance-type {instance_type}" if instance_type else f"--node-selector {INSTANCE_TYPE_LABEL}={given}"
        raise LaunchError(f"{flag}: {instance_types.missing(given)}")
    return gpus


# ---------------------------------------------------------------- examples (docs/examples)

EXAMPLE_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/dtrain/{family}:{tag}"


def examples() -> dict[Path, str]:
    """docs/examples/<file>: one worked example per tool, as `dtrain manifest` writes them."""
    hvd = EXAMPLE_IMAGE.format(family="horovod-pytorch", tag="2.11.0-hvd0.28.1-cu128-cudnn9-py310-ubuntu22.04")
    ddp = EXAMPLE_IMAGE.format(family="pytorch-ddp", tag="2.11.0-cu128-cudnn9-py310-ubuntu22.04")
    ray = EXAMPLE_IMAGE.format(family="ray-train", tag="2.11.0-ray2.60.0-cu128-cudnn9-py310-ubuntu22.04")
    specs = [
        ManifestSpec("mpijob", hvd, ("python", f"{contract.EXAMPLES}/allreduce_check.py", "torch"),
                     name="hvd-allreduce", workers=2, gpus_per_worker=8,
                     node_selector={"node.kubernetes.io/instance-type": "p4d.24xlarge"}),
        ManifestSpec("pytorchjob", ddp, (f"{contract.EXAMPLES}/ddp_grads.py",), name="ddp-grads",
                     workers=2, gpus_per_worker=8),
        ManifestSpec("ecs", hvd, (), name="hvd-allreduce", workers=2, gpus_per_worker=8),
        ManifestSpec("ecs", ray, ("python", f"{contract.EXAMPLES}/ray_train_check.py", "--workers", "2",
                                  "--storage", "s3://my-bucket/dtrain/ray-results"),
                     name="ray-train", workers=2, gpus_per_worker=1, launcher="ray"),
        ManifestSpec("sagemaker", ddp, (f"{contract.EXAMPLES}/ddp_grads.py",), name="ddp-grads",
                     workers=2, gpus_per_worker=8, launcher="torchrun"),
    ]
    return {EXAMPLES / FILENAMES[template_name(s)]: render(s) for s in specs}


def write_examples() -> list[Path]:
    changed = []
    for path, text in examples().items():
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            changed.append(path)
    return changed


if __name__ == "__main__":  # python -m dtrain.launch.other_tools.manifests: rewrite docs/examples
    for p in write_examples():
        print(f"wrote {p.relative_to(ROOT)}")
