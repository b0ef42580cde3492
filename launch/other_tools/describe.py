"""What every job description shares, and the interface a description kind provides.

    ManifestSpec --check(spec, kind)--> kind.text(spec) (its template or its models)
                 --kind.problems(variant, doc)--> [] or ManifestError naming every field

A kind is a `Describer`: the `--target`/`--for` module that writes it (launch/targets/NAME.py)
declares what its document runs (`launchers`), its files, how it is built and checked; nothing
here compares a kind's name. `manifests.py` finds a kind by name through the targets' registry;
the target modules call this module directly (no cycle).

The launch commands inside come from the launcher modules (launch/jobs/launchers/), the
builders `dtrain launch` uses, so flags cannot drift between the two.
"""

from __future__ import annotations

import hashlib
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import jinja2
import yaml

from dtrain import ROOT, contract, outfile
from dtrain.launch.errors import LaunchError
from dtrain.launch.infra import instance_types
from dtrain.launch.jobs import container, launchers
from dtrain.launch.sagemaker.defaults import RUN_DEFAULTS as SAGEMAKER_DEFAULTS

TEMPLATES = ROOT / "templates" / "manifests"
SCHEMAS = Path(__file__).resolve().parent / "schemas"

POD_IFACE = "eth0"  # a pod's (and a SageMaker container's) one NIC
MPI_HOSTFILE = "/etc/mpi/hostfile"  # written by the MPI operator v2 (and Trainer v2's MPI plugin) into the launcher
SSH_MOUNT = "/root/.ssh"  # where the MPI operator mounts the job's key Secret
MPI_SSH = container.ssh_options(attempts=10)  # the operator's own retry while workers start
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
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"  # the kubelet's well-known label
# EFA in a pod (the EKS user guide, "Run machine learning training on Amazon EKS with Elastic
# Fabric Adapter", and its EFA device plugin): the plugin's resource, one per interface; 2 MiB
# huge pages for libfabric, with a memory request beside them (Kubernetes asks for one);
# IPC_LOCK to pin memory for RDMA (the memlock limit itself is the node runtime's: unlimited
# on the EKS-optimized accelerated AMIs; a pod spec has no ulimit field).
EFA_RESOURCE = "vpc.amazonaws.com/efa"
GPU_RESOURCE = "nvidia.com/gpu"
EFA_HUGEPAGES = ("hugepages-2Mi", "5120Mi")
EFA_CAPABILITIES = ("IPC_LOCK",)

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # DNS-1035 label: pods, services
_NAMESPACE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # DNS-1123 label, at most 63
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_NAME_RE = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", re.ASCII)
_DNS_SUBDOMAIN_RE = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*", re.ASCII)
_ECS_CLUSTER_RE = re.compile(r"[A-Za-z0-9_-]{1,255}", re.ASCII)


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
    target: str  # the kind's name (a --for / --target value)
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
    # names of env whose values are written as they are: a job file's literal values (`EPOCHS: 10`,
    # not secrets: they are in a file already); every other name (--env, names from the
    # environment, an env_file's) is read from the kind's secret, never written (issue 47)
    plain_env: tuple[str, ...] = ()
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
    volume_gb: int = SAGEMAKER_DEFAULTS["volume_gb"]
    max_runtime_s: int = SAGEMAKER_DEFAULTS["max_runtime_s"]
    # the launch's fields a kind may map (TrainJob, JobSet): the job's time limit
    # (activeDeadlineSeconds), whole-job restarts (failurePolicy.maxRestarts), host paths
    # (--mount: hostPath volumes), the host NIC of a host-network pod (--iface)
    timeout_s: int | None = None
    max_restarts: int | None = None
    mounts: tuple[str, ...] = ()
    iface: str | None = None

    @property
    def secret_names(self) -> list[str]:
        """The env names read from the kind's secret (sorted)."""
        return sorted(k for k in self.env if k not in self.plain_env)

    @property
    def plain_values(self) -> dict[str, str]:
        """The env written as values: the job file's literals."""
        return {k: self.env[k] for k in sorted(self.env) if k in self.plain_env}

    @property
    def slots(self) -> int:
        return self.slots_per_worker or max(self.gpus_per_worker, 1)

    @property
    def ec2_type(self) -> str | None:
        """The workers' EC2 instance type, where the spec names one (ml.p4d.24xlarge:
        p4d.24xlarge; a Kubernetes nodeSelector's node.kubernetes.io/instance-type)."""
        given = self.instance_type or self.node_selector.get(INSTANCE_TYPE_LABEL)
        return given.removeprefix("ml.") if given else None

    @property
    def efa(self) -> int:
        """EFA interfaces each worker gets: the type's (launch/infra/instance_types.py, EC2's
        DescribeInstanceTypes), 0 without (a type the data lacks: refused in check)."""
        return (instance_types.efa_count(self.ec2_type) or 0) if self.ec2_type else 0


class Describer(ABC):
    """A kind of job description, as the `--target`/`--for` module that writes it provides it."""

    name: ClassVar[str]
    # variant -> docs/examples file name; the first variant is the kind's own (ECS has Ray's too)
    filenames: ClassVar[dict[str, str]]
    # the launcher properties its document runs (launch/jobs/launchers/base.py); `runs` says
    # what in words, for the refusal of a launcher that does not fit
    launchers: ClassVar[dict[str, bool]] = {}
    runs: ClassVar[str] = ""
    default_launcher: ClassVar[str | None] = None
    clusters: ClassVar[bool] = False  # describes a launcher's own cluster (Ray's head and workers: ECS)
    # the kind's instance-type data is EC2's (launch/infra/instance_types.py); SageMaker's ml.* types are its own
    ec2_types: ClassVar[bool] = True
    # the user's env from a Kubernetes Secret (True) or as the kind's own (ecs.py, sagemaker.py override env_secret_notes)
    kubernetes: ClassVar[bool] = False
    # what the validation errors call the document, per variant
    what: ClassVar[dict[str, str]] = {}
    # variant -> (spec field, its placeholder, the document's field, the flag): placeholders named
    placeholder_fields: ClassVar[dict[str, tuple[tuple[str, str, str, str], ...]]] = {}

    def variant(self, spec: ManifestSpec) -> str:
        """Which of the kind's documents spec gives (its filenames' keys)."""
        return next(iter(self.filenames))

    def runs_command(self, spec: ManifestSpec) -> bool:
        """Whether the document runs the spec's command (ECS's node container runs none)."""
        return True

    def check(self, spec: ManifestSpec) -> None:
        """The kind's own checks beyond check(spec, kind)'s (LaunchError, one line)."""

    def default_gpus(self, instance_type: str | None, node_selector: dict[str, str]) -> int:
        """GPUs per worker when --gpus-per-worker is not given: the nodes' EC2 type's, 0 for a
        type without GPUs or none named; a type the data lacks is refused (one line)."""
        given = instance_type or (node_selector.get(INSTANCE_TYPE_LABEL) if self.kubernetes else None)
        if not given:
            return 0
        gpus = instance_types.gpu_count(given)
        if gpus is None:
            flag = (f"--instance-type {instance_type}" if instance_type
                    else f"--node-selector {INSTANCE_TYPE_LABEL}={given}")
            raise LaunchError(f"{flag}: {instance_types.missing(given)}")
        return gpus

    @abstractmethod
    def text(self, spec: ManifestSpec) -> str:
        """The document's text, not yet validated (spec checked)."""

    def load(self, variant: str, text: str) -> Any:
        return yaml.safe_load(text)

    @abstractmethod
    def problems(self, variant: str, doc: Any) -> list[str]:
        """Every schema problem of the document, one line each naming the field; [] when valid."""

    def env_secret(self, spec: ManifestSpec) -> str:
        """Where the user's env values come from: the Kubernetes Secret's name (ECS: the secret's ARN)."""
        return ENV_SECRET_NAME.format(name=spec.name)

    def env_secret_notes(self, spec: ManifestSpec, via: str = "manifest") -> list[str]:
        """One line naming the env the description reads from a secret and how to make that
        secret from a file (no value on a command line); [] without --env."""
        if not spec.secret_names:
            return []
        names = ", ".join(spec.secret_names)
        ns = f" --namespace {spec.namespace}" if spec.namespace else ""
        return [f"[{via}] env {names}: not in the file; each comes from the key of that name in the Secret "
                f"{self.env_secret(spec)}: create it from a file of NAME=VALUE lines (kubectl create secret generic "
                f"{self.env_secret(spec)} --from-env-file=FILE{ns})"]

    def notes(self, spec: ManifestSpec, via: str = "manifest") -> list[str]:
        """Lines for stderr beside the written document: placeholders it holds, then where env comes from."""
        return placeholders(spec, self, via)


# ---------------------------------------------------------------- checks shared by every kind


def default_name(image: str, command: Sequence[str], source: str | None = None) -> str:
    """The job's name where none is given (pure): the job file's name (`train-gpt.yaml`:
    train-gpt), else the image's repository and a short hash of the command
    (`reg/dtrain/pytorch-ddp:TAG -- python train.py`: pytorch-ddp-1a2b3c), as a DNS-1123 label
    check() takes (lower-case letters, digits and -, at most 40): two jobs no longer share
    `dtrain-job` (their Secrets, runtimes and pods)."""
    def label(text: str, most: int) -> str:
        return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:most].strip("-")

    if source and label(Path(source).stem, 40):
        return label(Path(source).stem, 40)
    repo = image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]
    digest = hashlib.sha256("\0".join(command).encode()).hexdigest()[:6]
    return f"{label(repo, 33) or 'job'}-{digest}"


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


def cluster_launcher(spec: ManifestSpec) -> bool:
    """The spec's launcher starts a cluster of its own (Ray's head and workers)."""
    return spec.launcher is not None and launchers.get(spec.launcher).starts_cluster


def check(spec: ManifestSpec, kind: Describer) -> None:
    """The spec's values, then the kind's own checks; LaunchError (one line) at the first fault."""
    if not spec.image or spec.image.startswith("-") or any(c.isspace() for c in spec.image):
        raise LaunchError(f"bad image {spec.image!r}")
    if spec.launcher is not None and (spec.launcher not in launchers.LAUNCHERS
                                      or not launchers.get(spec.launcher).manifests):
        ecs = {n for n in launchers.names(manifests=True) if launchers.get(n).starts_cluster}
        raise LaunchError(f"--launcher {spec.launcher}: use "
                          + launchers.choices([n + " (ECS)" * (n in ecs) for n in launchers.names(manifests=True)]))
    kind.check(spec)  # a kind that runs no command says so before "no command"
    if not spec.command and kind.runs_command(spec):
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
    if spec.ec2_type and most is None and kind.ec2_types:  # GPUs, EFA unknown: said, not 0
        raise LaunchError(f"{type_flag(spec)}: {instance_types.missing(spec.ec2_type)}")
    if most is not None and spec.gpus_per_worker > most:
        raise LaunchError(f"--gpus-per-worker {spec.gpus_per_worker}: a {spec.ec2_type} has {most} GPUs "
                          f"({type_flag(spec)}); give at most {most}")
    fits = kind.launchers
    if cluster_launcher(spec) and not kind.clusters:  # only ECS describes a Ray cluster
        raise LaunchError(f"--launcher {spec.launcher}: only for --for ecs (a Ray head and worker services), "
                          f"not {spec.target}")
    if spec.launcher is not None and not all(getattr(launchers.get(spec.launcher), k) == v for k, v in fits.items()):
        raise LaunchError(f"--launcher {spec.launcher}: not for --for {spec.target}"
                          + (f" ({kind.runs})" if kind.runs else "") + "; use "
                          + launchers.choices(launchers.names(manifests=True, **fits)))


def type_flag(spec: ManifestSpec) -> str:
    """The flag that named the workers' EC2 type."""
    return (f"--instance-type {spec.instance_type}" if spec.instance_type
            else f"--node-selector {INSTANCE_TYPE_LABEL}={spec.ec2_type}")


def launcher(spec: ManifestSpec, kind: Describer) -> str | None:
    """The launcher the document runs: the given one, else the kind's default."""
    return spec.launcher or kind.default_launcher


# ---------------------------------------------------------------- a Kubernetes pod's shape


def resources(spec: ManifestSpec) -> dict[str, Any]:
    """A worker pod's resources: its GPUs; on an EFA type also every EFA interface and the huge
    pages (limits equal to requests: extended resources and huge pages take no overcommit),
    with a memory request (not a limit) as Kubernetes asks beside huge pages."""
    limits: dict[str, Any] = {GPU_RESOURCE: spec.gpus_per_worker} if spec.gpus_per_worker else {}
    if not spec.efa:
        return {"limits": limits} if limits else {}
    limits |= {EFA_RESOURCE: spec.efa, EFA_HUGEPAGES[0]: EFA_HUGEPAGES[1]}
    return {"limits": limits, "requests": {**limits, "memory": f"{spec.memory_reservation_mib}Mi"}}


def worker_selector(spec: ManifestSpec) -> dict[str, str]:
    """The worker pods' nodeSelector: the given one, and the instance type where one is given."""
    if spec.instance_type:
        return {INSTANCE_TYPE_LABEL: spec.ec2_type, **spec.node_selector}
    return dict(spec.node_selector)


def literal(builtin: dict[str, str], spec: ManifestSpec) -> dict[str, str]:
    """dtrain's own env of a pod (the NIC, NCCL's), less what the user's env gives, then the user's
    plain values (a job file's literals); the other names come from the secret."""
    return {**{k: v for k, v in builtin.items() if k not in spec.env}, **spec.plain_values}


def context(spec: ManifestSpec, kind: Describer) -> dict[str, Any]:
    """What every template gets, derived from one checked spec (the kind adds its own)."""
    return {"spec": spec, "name": spec.name, "image": spec.image, "slots": spec.slots,
            "entrypoint": contract.ENTRYPOINT, "ssh_port": contract.SSH_PORT,
            "resources": resources(spec), "capabilities": list(EFA_CAPABILITIES) if spec.efa else [],
            "shm_size": f"{spec.shm_size_mib}Mi", "node_selector": worker_selector(spec),
            "namespace": spec.namespace,
            # the user's env: by name from a secret (env_secret_notes), never its values
            "secret_env": spec.secret_names, "plain_env": spec.plain_values, "env_secret": kind.env_secret(spec)}


def jinja() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             autoescape=False)
    env.filters["json"] = lambda v: json.dumps(v, ensure_ascii=False)
    env.filters["json_block"] = lambda v: json.dumps(v, ensure_ascii=False, indent=2)
    return env


# ---------------------------------------------------------------- render, validate, write


def placeholders(spec: ManifestSpec, kind: Describer, via: str = "manifest") -> list[str]:
    """One line per placeholder the description holds (a role or secret ARN, an S3 path that
    AWS would refuse), naming the field and the flag that gives it; no values. In a variant
    (ECS's Ray services) they are there only with --env. via="launch" (`dtrain launch --target T`, which has no
    such flags): the line says to write the description with `dtrain manifest` and the flag.
    Then env_secret_notes: where the --env values come from."""
    name, own = kind.variant(spec), next(iter(kind.filenames))  # a variant's secrets: only with --env
    how = {"manifest": "dtrain manifest {flag}",
           "launch": "or write the description with dtrain manifest --for {target} ... {flag} ARN"}[via]
    return [f"[{via}] {doc_field}: a placeholder, replace it ({how.format(flag=flag, target=spec.target)})"
            for field_name, placeholder, doc_field, flag in kind.placeholder_fields.get(name, ())
            if getattr(spec, field_name) == placeholder
            and (name == own and field_name != "env_secret_arn" or spec.secret_names)] + kind.env_secret_notes(spec, via)


def validate(kind: Describer, variant: str, doc: Any) -> None:
    found = kind.problems(variant, doc)
    if found:
        raise ManifestError(f"{kind.what[variant]}: {len(found)} problem(s):\n" + "\n".join(f"  {p}" for p in found))


def render(spec: ManifestSpec, kind: Describer) -> str:
    """The document's text, checked and validated (ManifestError names every field at fault)."""
    check(spec, kind)
    text = kind.text(spec)
    variant = kind.variant(spec)
    validate(kind, variant, kind.load(variant, text))
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


# ---------------------------------------------------------------- from flags


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


def spec_from_args(kind: Describer, image: str | None, command: list[str], *, workers: int | str = 2,
                   gpus_per_worker: int | str | None = None, name: str = "dtrain-job",
                   env: list[str] | None = None, node_selector: list[str] | None = None,
                   **options: Any) -> ManifestSpec:
    """ManifestSpec from `dtrain manifest` flags (strings, repeatable K=V lists); the rest of
    ManifestSpec's fields pass through by name (None means the default). GPUs per worker not
    given: the instance type's (kind.default_gpus), else 0."""
    if not image:
        raise LaunchError("--image is required")
    try:
        nums = {"workers": int(workers), "gpus_per_worker": int(gpus_per_worker) if gpus_per_worker is not None
                else kind.default_gpus(options.get("instance_type"), _pairs(node_selector, "--node-selector"))}
        for key in ("slots_per_worker", "shm_size_mib", "memory_reservation_mib", "volume_gb", "max_runtime_s",
                    "timeout_s", "max_restarts"):
            if options.get(key) is not None:
                options[key] = int(options[key])
    except ValueError as e:
        raise LaunchError(f"expected a number: {e}") from None
    known = set(ManifestSpec.__dataclass_fields__)
    unknown = set(options) - known
    if unknown:
        raise ValueError(f"spec_from_args: unknown options {sorted(unknown)}")
    return ManifestSpec(kind.name, image, tuple(command), name=name, env=_pairs(env, "--env"),
                        node_selector=_pairs(node_selector, "--node-selector"), **nums,
                        **{k: v for k, v in options.items() if v is not None})


# ---------------------------------------------------------------- validators the kinds use


class Crd(Describer):
    """A Kubernetes custom resource checked against its operator's CRD schema (crds.py)."""

    kubernetes = True
    schema_file: ClassVar[str]  # schemas/crd-*.json

    def problems(self, variant: str, doc: Any) -> list[str]:
        from dtrain.launch.other_tools import crds

        return crds.problems(self.schema_file, doc)


def model_problems(model: Any, doc: Any, where: str = "") -> list[str]:
    """The field's own models (kubeflow-trainer-api): doc loads (types as the API's) and loads
    back the same (no field the models do not know); one line per problem."""
    import pydantic

    try:
        back = model.from_dict(doc)
    except (pydantic.ValidationError, ValueError, TypeError, AttributeError) as e:
        first = str(e).splitlines()
        return [f"{where}{model.__name__}: " + " ".join(line.strip() for line in first[:3])]
    if back is None or back.to_dict() != doc:
        return [f"{where}{model.__name__}: the models load a different document (a field they do not know, "
                "or of another type)"]
    return []


def boto_problems(service: str, op: str, params: Any) -> list[str]:
    """Every problem of a request against botocore's own model of the AWS API, one line each."""
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


# ---------------------------------------------------------------- a host-network pod (TrainJob, JobSet)

HOST_IFACE = "ens5"  # a host-network pod's NIC: the node's first ENA interface on EKS's AL2023 AMIs (--iface)
SHM_VOLUME = "dshm"


def host_iface(spec: ManifestSpec) -> str:
    return spec.iface or HOST_IFACE


def secret_env(spec: ManifestSpec, kind: Describer) -> list[dict[str, Any]]:
    """The user's env: a job file's literal values as they are, each other NAME from the key NAME
    of the kind's Secret (never a value)."""
    return [{"name": k, "value": v} for k, v in spec.plain_values.items()] + [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": kind.env_secret(spec), "key": k}}}
        for k in spec.secret_names]


def node_container(spec: ManifestSpec, *, name: str, args: list[str], env: list[dict[str, Any]],
                   gpus: bool = True, sshd: bool = False) -> dict[str, Any]:
    """One container of a host-network pod: the image's entrypoint with args (none: sshd on 2022,
    then ready when it listens), /dev/shm and the --mount paths, and on a GPU pod the type's GPUs,
    EFA interfaces, huge pages and IPC_LOCK (resources())."""
    from dtrain.launch.jobs import container as docker

    c: dict[str, Any] = {"name": name, "image": spec.image, "imagePullPolicy": "IfNotPresent",
                         "command": [contract.ENTRYPOINT]}
    if args:
        c["args"] = list(args)
    if env:
        c["env"] = env
    if sshd:
        c["ports"] = [{"name": "ssh", "containerPort": contract.SSH_PORT, "protocol": "TCP"}]
        c["readinessProbe"] = {"tcpSocket": {"port": contract.SSH_PORT}, "periodSeconds": 2}
    res = resources(spec) if gpus else {}
    if res:
        c["resources"] = res
    if gpus and spec.efa:
        c["securityContext"] = {"capabilities": {"add": list(EFA_CAPABILITIES)}}
    mounts = [docker.parse_mount(m) for m in spec.mounts]
    c["volumeMounts"] = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}] + [
        {"name": f"mount-{i}", "mountPath": m.dst, **({"readOnly": True} if m.readonly else {})}
        for i, m in enumerate(mounts)]
    return c


def host_pod(spec: ManifestSpec, containers: list[dict[str, Any]], *, selector: bool = True) -> dict[str, Any]:
    """A host-network pod (the nodes' NICs, EFA, the ports the images listen on, as `dtrain launch`
    runs its containers), the nodes' DNS for the job's names, never restarted in place (a failed
    pod fails its Job; JobSet restarts the whole set, failurePolicy.maxRestarts)."""
    from dtrain.launch.jobs import container as docker

    pod: dict[str, Any] = {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet", "restartPolicy": "Never",
                           "containers": containers}
    if selector and worker_selector(spec):
        pod["nodeSelector"] = worker_selector(spec)
    pod["volumes"] = [{"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": f"{spec.shm_size_mib}Mi"}}] + [
        {"name": f"mount-{i}", "hostPath": {"path": m.src, "type": "Directory"}}
        for i, m in enumerate(docker.parse_mount(m) for m in spec.mounts)]
    return pod


def node_pod(spec: ManifestSpec, *, args: list[str], env: list[dict[str, Any]], gpus: bool = True,
             sshd: bool = False, selector: bool = True) -> dict[str, Any]:
    """The pod template of one node of a host-network job (TrainJob's runtime, JobSet): its one
    container `node` (node_container: the GPUs, EFA, huge pages, IPC_LOCK, /dev/shm, mounts) in
    host_pod's pod."""
    return host_pod(spec, [node_container(spec, name="node", args=args, env=env, gpus=gpus, sshd=sshd)],
                    selector=selector)


def metadata(spec: ManifestSpec) -> dict[str, Any]:
    """A job document's metadata: its name, the job label, the namespace where given."""
    meta: dict[str, Any] = {"name": spec.name, "labels": {contract.LABEL_JOB: spec.name}}
    if spec.namespace:
        meta["namespace"] = spec.namespace
    return meta


def efa_header(spec: ManifestSpec) -> list[str]:
    """The header line saying what each node pod asks for on an EFA type ([] without EFA)."""
    return [f"{spec.ec2_type}: each node pod asks for its {spec.efa} EFA interface(s) ({EFA_RESOURCE}), "
            f"{spec.gpus_per_worker} GPU(s), 2 MiB huge pages and IPC_LOCK."] if spec.efa else []


def job_template(pod: dict[str, Any], *, nodes: int | None = None, labels: dict[str, str] | None = None
                 ) -> dict[str, Any]:
    """A batch/v1 Job template of one pod per node (nodes: Indexed, that many; None: the
    runtime's controller sets the count), no retries of its own."""
    spec: dict[str, Any] = {"backoffLimit": 0}
    if nodes is not None:
        spec |= {"completionMode": "Indexed", "completions": nodes, "parallelism": nodes}
    spec["template"] = {"spec": pod}
    out: dict[str, Any] = {"spec": spec}
    if labels:
        out = {"metadata": {"labels": labels}, **out}
    return out


def yaml_documents(header: list[str], docs: list[dict[str, Any]]) -> str:
    """YAML of one or more documents under dtrain's GENERATED header lines (keys in order)."""
    body = "---\n".join(yaml.safe_dump(d, sort_keys=False, default_flow_style=False, width=1000) for d in docs)
    return "".join(f"# {line}\n" for line in header) + body
