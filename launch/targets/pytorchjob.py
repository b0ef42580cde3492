"""`--target pytorchjob`: the launch written as a Kubeflow PyTorchJob (training-operator v1): torchrun in every replica."""

from __future__ import annotations

from dtrain.launch.targets.description import Description


class PyTorchJob(Description):
    name = "pytorchjob"
    deadline = True  # timeout -> runPolicy.activeDeadlineSeconds
    refused = tuple(k for k in Description.refused if k != "timeout")


TARGET = PyTorchJob()
