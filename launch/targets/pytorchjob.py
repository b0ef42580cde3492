"""`--target pytorchjob` / `--for pytorchjob`: the launch written as a Kubeflow PyTorchJob (the
training operator's kubeflow.org/v1, checked against the CRD of v1.9.4, its last v1 release;
Kubeflow Trainer v2 replaces it: trainjob.py): torchrun on every replica."""

from __future__ import annotations

from typing import Any

from dtrain.launch.jobs.launchers.torchrun import torchrun_argv, torchrun_env
from dtrain.launch.other_tools import describe
from dtrain.launch.other_tools.describe import POD_IFACE, Crd, ManifestSpec
from dtrain.launch.targets.description import Description

MASTER_PORT = 23456  # the training operator's default; it sets MASTER_PORT from it


def pytorchjob_torchrun_argv(spec: ManifestSpec) -> list[str]:
    """torchrun on every replica; the operator sets RANK (0 on the Master) and MASTER_* per pod."""
    return torchrun_argv(spec.workers, "$(RANK)", spec.slots, "$(MASTER_ADDR)", "$(MASTER_PORT)", list(spec.command))


class PyTorchJob(Description, Crd):
    name = "pytorchjob"
    filenames = {"pytorchjob": "pytorchjob.yaml"}
    launchers = {"per_node": True, "starts_cluster": False}
    runs = "one command per replica"
    default_launcher = "torchrun"
    schema_file = "crd-pytorchjob-v1.json"
    maps = ("timeout", "max_restarts")  # runPolicy: activeDeadlineSeconds, backoffLimit
    what = {"pytorchjob": "PyTorchJob (training-operator v1.9.4 CRD)"}

    def text(self, spec: ManifestSpec) -> str:
        ctx: dict[str, Any] = describe.context(spec, self) | {
            "torchrun": pytorchjob_torchrun_argv(spec), "master_port": MASTER_PORT,
            "env": describe.literal(torchrun_env(POD_IFACE), spec)}
        return describe.jinja().get_template("pytorchjob.j2").render(ctx)


TARGET = PyTorchJob()
