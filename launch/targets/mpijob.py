"""`--target mpijob`: the launch written as a Kubeflow MPIJob (kubeflow/mpi-operator v2beta1): a launcher pod runs the command over the worker pods."""

from __future__ import annotations

from dtrain.launch.targets.description import Description


class MpiJob(Description):
    name = "mpijob"
    deadline = True  # timeout -> runPolicy.activeDeadlineSeconds
    refused = tuple(k for k in Description.refused if k != "timeout")


TARGET = MpiJob()
