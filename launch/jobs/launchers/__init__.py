"""The launchers, one module each (base.py says what a launcher provides), and their registry:
the CLI's --launcher choices, the job file's `launcher`, manifests, checks and the supervisor
ask it (`get(name)`) instead of comparing names. A new launcher: one module, one line below.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import runplan
from dtrain.launch.jobs.launchers import base
from dtrain.launch.jobs.launchers.accelerate import Accelerate
from dtrain.launch.jobs.launchers.base import Attempt, Launcher, plan_nodes
from dtrain.launch.jobs.launchers.deepspeed import DeepSpeed
from dtrain.launch.jobs.launchers.horovodrun import Horovodrun
from dtrain.launch.jobs.launchers.mpirun import Mpirun
from dtrain.launch.jobs.launchers.ray import Ray
from dtrain.launch.jobs.launchers.torchrun import Torchrun

if TYPE_CHECKING:
    from dtrain.launch.jobs.spec import JobSpec

__all__ = ["LAUNCHERS", "Attempt", "Launcher", "attempt", "attempt_argv", "choices", "env_file", "get", "launch_command", "names",
           "plan_nodes"]

LAUNCHERS: dict[str, Launcher] = {c.name: c() for c in (Mpirun, Horovodrun, Torchrun, Ray, Accelerate,
                                                     DeepSpeed)}

def names(**having: bool) -> tuple[str, ...]:
    """The launchers' names, in registry order; having: only those whose properties have these
    values (names(supervised=True))."""
    return tuple(n for n, la in LAUNCHERS.items() if all(getattr(la, k) == v for k, v in having.items()))


def choices(chosen: Sequence[str]) -> str:
    """`a, b or c`, as an error message lists them."""
    return ", ".join(chosen[:-1]) + f" or {chosen[-1]}" if len(chosen) > 1 else "".join(chosen)


def get(name: str) -> Launcher:
    """The launcher --launcher names; LaunchError (one line, naming the choices) for another."""
    try:
        return LAUNCHERS[name]
    except (KeyError, TypeError):
        raise LaunchError(f"--launcher {name}: use {choices(names())}") from None


def attempt(run: runplan.LaunchCommand, nodes: Sequence[runplan.PlanNode]) -> Attempt:
    """One attempt on `nodes` (in rank order): its argvs ([argv] run in the first node's
    container: mpirun, horovodrun, deepspeed; or one per node: torchrun), env and files. The one
    author of the command: the launch and every restart of the supervisor
    (launch/node/supervise.py) call it, each with the nodes it has."""
    if not nodes:
        raise ValueError("attempt: no nodes")
    launcher = LAUNCHERS.get(run.launcher)
    if launcher is None or not launcher.supervised:
        raise ValueError(f"attempt: no supervised launcher {run.launcher!r}")
    return launcher.attempt(run, nodes)


def attempt_argv(run: runplan.LaunchCommand, nodes: Sequence[runplan.PlanNode]) -> list[list[str]]:
    """The argvs of attempt(run, nodes)."""
    return [list(a) for a in attempt(run, nodes).argvs]


def launch_command(spec: JobSpec, ompi: int = 4, subnet: str | None = None) -> runplan.LaunchCommand:
    """The job's launcher command apart from its nodes (the supervisor's plan holds it)."""
    return base.launch_command(spec, get(spec.launcher), ompi, subnet)


def env_file(env: Mapping[str, str]) -> str:
    """The job's --env values as the container reads them (launch/node/run.sh): NAME=base64 lines."""
    return "".join(f"{k}={base64.b64encode(v.encode()).decode()}\n" for k, v in env.items())
