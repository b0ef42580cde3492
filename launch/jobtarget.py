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
named. Here, not in launch/jobs: running jobs (launch/jobs) uses nothing of other_tools.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from dtrain.launch import targets
from dtrain.launch.errors import LaunchError
from dtrain.launch.targets.common import env, flag, node_count

__all__ = ["check_fields", "env", "node_count", "run"]


def check_fields(cfg: Any) -> list[str]:
    """LaunchError naming, in one message, every field set that the target cannot honour (as the
    launch names it: the flag, or the job file's line and key); returns the flags it ignores."""
    target = targets.get(cfg.target)
    refused = [cfg.named(k) for k in target.refused if cfg.set(k)]
    if refused:
        raise LaunchError(target.refusal(refused))
    return [flag(k) for k in target.ignored if cfg.set(k)]


def run(cfg: Any, output: str | None = None, err: Callable[[str], None] | None = None,
        session=None, force: bool = False) -> int:
    """Run the launch `cfg` (launch/jobs/config.py LaunchConfig) on its target: on the nodes
    (targets/nodes.py), submitted (sagemaker) or written (mpijob, pytorchjob, ecs): the exit code."""
    from dtrain.launch.jobs import jobfile

    with jobfile.located(cfg.where):  # a value the job file gave: named by its line, not the flag
        return _run(cfg, output, err, session, force)


def _run(cfg: Any, output: str | None, err: Callable[[str], None] | None, session: Any, force: bool) -> int:
    err = err or (lambda line: print(line, file=sys.stderr))
    target = targets.get(cfg.target)
    if target.on_nodes:
        check_fields(cfg)
        return target.run(cfg, {}, None, output=output, session=session, note=lambda: None, err=err, force=force)
    ignored = check_fields(cfg)

    def note() -> None:  # once the launch is checked, before it is submitted or written
        if ignored:
            err(f"[launch] --target {target.name}: {', '.join(ignored)} ignored (the {target.name} job's own)")

    count = node_count(cfg)
    given = {k: getattr(cfg, k) for k in cfg.given}
    return target.run(cfg, given, count, output=output, session=session, note=note, err=err, force=force)
