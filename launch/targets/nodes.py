"""`--target nodes` (the default): dtrain starts the containers on the nodes a provider gives and
runs the job there (launch/jobs/job.py): every launch field applies but SageMaker's own."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dtrain.launch.errors import LaunchError
from dtrain.launch.targets.base import SAGEMAKER_ONLY, Target


class Nodes(Target):
    name = "nodes"
    on_nodes = True
    refused = SAGEMAKER_ONLY  # SageMaker's own
    ignored = ("instance_type",)  # the nodes are what they are (their type: the provider's, the probe's)

    sagemaker_hint = " (the nodes are given by --hosts, --hostfile, --cluster, --ec2-tag)"

    def run(self, cfg: Any, given: Mapping[str, Any], count: int | None, *, output: str | None,
            session: Any, note: Callable[[], None], err: Callable[[str], None] = print, force: bool = False) -> int:
        """The launch on its nodes (launch/launching.py, which imports this registry's providers)."""
        raise LaunchError("--target nodes: the launch runs on its nodes (launch/launching.py run_on_nodes)")


TARGET = Nodes()
