"""`--target ecs`: the launch written as an ECS task definition (its workers as tasks; --instance-type passes to it)."""

from __future__ import annotations

from dtrain.launch.targets.description import Description


class Ecs(Description):
    name = "ecs"


TARGET = Ecs()
