"""`--target nodes` (the default): dtrain starts the containers on the nodes a provider gives
(`tasks.launch` builds the Job); every launch field applies."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dtrain.launch.errors import LaunchError
from dtrain.launch.targets.base import Target


class Nodes(Target):
    name = "nodes"
    on_nodes = True

    def run(self, cfg: Mapping[str, Any], given: Mapping[str, Any], count: int | None, *, output: str | None,
            session: Any, note: Callable[[], None], err: Callable[[str], None] = print, force: bool = False) -> int:
        raise LaunchError("--target nodes: the launch runs on its nodes (dtrain launch), not as a job elsewhere")


TARGET = Nodes()
