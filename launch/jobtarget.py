"""`dtrain launch --target T`: the same launch (JobFile's fields, flags over the job file) run
somewhere other than the nodes: a SageMaker training job (launch/jobs/sagemaker.py's `run`, as
`dtrain sagemaker run` does) or the description of a job for another tool
(launch/other_tools/manifests.py, as `dtrain manifest` does).

What carries over: image, command, launcher, name, env (and env_file), workdir (SageMaker: the
code channel, its requirements.txt installed), the number of nodes the launch names (--hosts,
--hostfile, --cluster's hostfile, --ec2-tag: instances, workers, replicas), timeout (SageMaker's
run-time limit), detach (SageMaker: return once the job has started). How the nodes are reached
(ssh_*, slots), pulled (pull) and wired (iface, master_port, rdzv, shm_size, workdir_limit,
no_spot_watch) is the target's own: said to be ignored on stderr. What a target would silently
drop and the job relies on (restarts, spares, the hang watch, mounts, the network gate) is refused,
every such field named in one message; a description that can map one (trainjob, jobset: the
timeout, restarts, mounts) maps it (its module's `maps`). Here, not in launch/jobs: running jobs (launch/jobs) uses nothing of other_tools.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Mapping

from dtrain import values
from dtrain.launch import targets
from dtrain.launch.errors import LaunchError
from dtrain.launch.targets.base import NodeArgs
from dtrain.launch.targets.common import env, flag, given as _given

__all__ = ["check_fields", "env", "node_count", "run"]


def check_fields(cfg: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[str]:
    """LaunchError naming every field given that the target cannot take, in one line (one field:
    `--spares: not for --target T ...`, as a job file's line names it); returns the flags it ignores."""
    target = targets.get(cfg["target"])
    refused = [flag(key) for key in target.refused if _given(cfg, key)]
    if refused:
        raise LaunchError(f"{', '.join(refused)}: not for --target {target.name} (it runs on the nodes dtrain "
                          f"launches: --target nodes); take {'it' if len(refused) == 1 else 'them'} out for "
                          f"{target.name}")
    return [flag(k) for k in target.ignored if _given(cfg, k) and cfg.get(k) != defaults.get(k)]


def node_count(cfg: Mapping[str, Any]) -> int | None:
    """How many nodes the launch names (None: none named)."""
    args = NodeArgs(hostfile=cfg["hostfile"], hosts=cfg["hosts"], ec2_tag=cfg["ec2_tag"], cluster=cfg["cluster"],
                    region=cfg["region"])
    if args.cluster:
        targets.choose(args)  # --cluster's checks first, before --region's
    elif not targets.named(args):
        return None
    if cfg["region"] is not None:
        values.region("--region", cfg["region"])
    return len(targets.nodes(args))


def run(given: Mapping[str, Any], output: str | None = None, err: Callable[[str], None] | None = None,
        session=None, force: bool = False) -> int:
    """Submit (sagemaker) or write (trainjob, jobset, mpijob, pytorchjob, ecs) the launch `given` (the flags over the
    job file; defaults() fill the rest): the exit code. The target's module does it (launch/targets/)."""
    from dtrain.launch.jobs import jobfile

    cfg = {**jobfile.defaults(), **given}

    err = err or (lambda line: print(line, file=sys.stderr))
    target = targets.get(cfg["target"])
    if not cfg["image"]:
        raise LaunchError("--image is required")
    ignored = check_fields(cfg, jobfile.defaults())

    def note() -> None:  # once the launch is checked, before it is submitted or written
        if ignored:
            err(f"[launch] --target {target.name}: {', '.join(ignored)} ignored (the {target.name} job's own)")

    count = node_count(cfg)
    return target.run(cfg, given, count, output=output, session=session, note=note, err=err, force=force)
