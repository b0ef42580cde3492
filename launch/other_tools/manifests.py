"""`dtrain manifest --for KIND`: job descriptions for other tools (Kubeflow Trainer v2's TrainJob
with its ClusterTrainingRuntime, a JobSet, Kubeflow MPIJob/PyTorchJob, an ECS task definition, a
SageMaker CreateTrainingJob request), for an image built here.

    ManifestSpec -> the kind (the --target module of that name, launch/targets/NAME.py, found
    through the targets' registry) -> its document -> validated: the operators' CRD schemas
    (schemas/, crds.py) or botocore's own service models; every problem names the field at fault

What every kind shares is describe.py; what one kind does is its module. Nothing here compares
a kind's name: a new kind is its target module and its registry line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dtrain import ROOT, contract
from dtrain.launch import targets
from dtrain.launch.errors import LaunchError
from dtrain.launch.other_tools import describe
from dtrain.launch.other_tools.describe import (  # noqa: F401 (the names `dtrain manifest` and its tests use)
    ENV_SECRET_NAME, GENERATED, INSTANCE_TYPE_LABEL, OUTPUT, PLACEHOLDER_ENV_SECRET, PLACEHOLDER_EXECUTION_ROLE,
    PLACEHOLDER_KEY_SECRET, PLACEHOLDER_ROLE, PLACEHOLDER_S3, POD_IFACE, SCHEMAS, CommandRefused, Describer,
    ManifestError, ManifestSpec, check_label, check_output, default_name, write)
from dtrain.launch.targets.mpijob import mpijob_mpirun_argv  # noqa: F401
from dtrain.launch.targets.sagemaker import sagemaker_job  # noqa: F401

EXAMPLES = ROOT / "docs" / "examples"


def kinds() -> dict[str, Describer]:
    """The kinds dtrain describes, by name: the registry's targets that are Describers."""
    return targets.describers()


TARGETS: tuple[str, ...] = tuple(kinds())
FILENAMES: dict[str, str] = {v: f for k in kinds().values() for v, f in k.filenames.items()}


def kind(name: str) -> Describer:
    """The kind called name, or the kind one of whose documents (variants: ecs-ray) it is."""
    for k in kinds().values():
        if name in k.filenames:
            return k
    raise LaunchError(f"--for {name}: use one of {', '.join(TARGETS)}")


def template_name(spec: ManifestSpec) -> str:
    """Which document of its kind spec gives (ECS with Ray: ecs-ray)."""
    return kind(spec.target).variant(spec)


def render(spec: ManifestSpec) -> str:
    """The document's text, validated (ManifestError names every field at fault)."""
    return describe.render(spec, kind(spec.target))


def placeholders(spec: ManifestSpec, via: str = "manifest") -> list[str]:
    """What to print beside the document: each placeholder it holds, then where --env comes from."""
    return kind(spec.target).notes(spec, via)


def env_secret_notes(spec: ManifestSpec, via: str = "manifest") -> list[str]:
    return kind(spec.target).env_secret_notes(spec, via)


def env_secret(spec: ManifestSpec) -> str:
    return kind(spec.target).env_secret(spec)


def load(variant: str, text: str) -> Any:
    return kind(variant).load(variant, text)


def problems(variant: str, doc: Any) -> list[str]:
    """Every schema problem of a document, one line each, naming the field; [] when valid."""
    return kind(variant).problems(variant, doc)


def validate(variant: str, doc: Any) -> None:
    describe.validate(kind(variant), variant, doc)


def load_target(path: Path) -> str:
    """The document (variant) of a file named as in FILENAMES (docs/examples)."""
    return next(t for t, f in FILENAMES.items() if f == Path(path).name)


def spec_from_args(target: str, image: str | None, command: list[str], **kw: Any) -> ManifestSpec:
    """ManifestSpec from `dtrain manifest` flags (describe.spec_from_args, for the kind called target)."""
    return describe.spec_from_args(kind(target), image, command, **kw)


# `dtrain manifest --timeout/--max-restarts`: the launch's fields (launch/jobs/config.py
# LaunchConfig, jobfile.NUMBERS' bounds), as a kind that maps them writes them (Description.maps)
LIMITS = ("timeout", "max_restarts")


def limits(target: str, **given: Any) -> dict[str, Any]:
    """ManifestSpec's fields for `dtrain manifest --timeout S --max-restarts N` (given: those
    flags, None: not given), each read by the launch's own parser and bounds, mapped as `dtrain
    launch --target` maps them (TrainJob, JobSet: activeDeadlineSeconds, failurePolicy.maxRestarts);
    a kind that has no equivalent refuses them in one line naming the kinds that take them."""
    from dtrain.launch.jobs.jobfile import number

    values = {k: number(k, v) for k, v in given.items() if k in LIMITS and v is not None}
    if not values:
        return {}
    k = kind(target)
    maps = getattr(k, "maps", ())
    refused = [key for key in values if key not in maps]
    if refused:
        takes = [n for n, d in kinds().items() if all(key in getattr(d, "maps", ()) for key in refused)]
        them = " and ".join("--" + key.replace("_", "-") for key in refused)
        raise LaunchError(f"{them}: --for {k.name} has no equivalent in its document; --for {' or '.join(takes)} "
                          f"take{'s' if len(takes) == 1 else ''} {'it' if len(refused) == 1 else 'them'}")
    return k.mapped(values) if values else {}


def default_gpus(target: str, instance_type: str | None, node_selector: dict[str, str]) -> int:
    return kind(target).default_gpus(instance_type, node_selector)


# ---------------------------------------------------------------- examples (docs/examples)

EXAMPLE_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/dtrain/{family}:{tag}"


def examples() -> dict[Path, str]:
    """docs/examples/<file>: one worked example per tool, as `dtrain manifest` writes them."""
    hvd = EXAMPLE_IMAGE.format(family="horovod-pytorch", tag="2.11.0-hvd0.28.1-cu128-cudnn9-py310-ubuntu22.04")
    ddp = EXAMPLE_IMAGE.format(family="pytorch-ddp", tag="2.11.0-cu128-cudnn9-py310-ubuntu22.04")
    ray = EXAMPLE_IMAGE.format(family="ray-train", tag="2.11.0-ray2.60.0-cu128-cudnn9-py310-ubuntu22.04")
    specs = [
        ManifestSpec("trainjob", ddp, (f"{contract.EXAMPLES}/ddp_grads.py",), name="ddp-grads", workers=2,
                     gpus_per_worker=8, instance_type="p5.48xlarge", timeout_s=3600, max_restarts=1),
        ManifestSpec("jobset", ddp, (f"{contract.EXAMPLES}/ddp_grads.py",), name="ddp-grads", workers=2,
                     gpus_per_worker=8, instance_type="p4d.24xlarge", timeout_s=3600),
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
