"""`dtrain launch`'s dispatch: the launch (launch/jobs/config.py LaunchConfig, flags over the job
file) run where its `target` says: on its nodes (launch/launching.py), submitted as a SageMaker
training job (targets/sagemaker.py) or written as a job description for another tool
(targets/mpijob.py, pytorchjob.py, ecs.py, trainjob.py, jobset.py: each also the Describer of
its kind, launch/other_tools/describe.py).

Each target declares what it does with every launch field (targets/base.py Target): refused
(everything it cannot honour, named in one message: `--spares, job.yaml:7: mount: not for
--target ecs ...`), ignored (the nodes' own settings: one line on stderr), honoured (the rest).
A value the launch gives as its default (`--max-restarts 0`) is not refused. The node shape
every target reads: `count` (else the nodes the launch names, counted: a hostfile or --hosts
read here, a cluster's hostfile, --ec2-tag's instances), `slots` (else the hosts' own, `h:8`),
`instance_type`.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from dtrain.launch import targets
from dtrain.launch.errors import LaunchError
from dtrain.launch.targets.common import env, flag, local_nodes, node_key

__all__ = ["check_fields", "env", "node_count", "run"]


def check_fields(cfg: Any) -> list[str]:
    """LaunchError naming, in one message, every field set that the target cannot honour (as the
    launch names it: the flag, or the job file's line and key); returns the flags it ignores."""
    target = targets.get(cfg.target)
    keys = [k for k in target.refused if cfg.set(k)]
    line = lambda k: int(cfg.where[k].rsplit(":", 1)[1]) if k in cfg.where else 1 << 30  # noqa: E731  file order
    keys = sorted(keys, key=line)
    if keys:
        raise LaunchError(target.refusal([cfg.named(k) for k in keys], keys))
    return [flag(k) for k in target.ignored if cfg.set(k)]


def node_count(cfg: Any) -> int | None:
    """How many nodes a target off the nodes runs on: `count` where the launch gives it (no node
    is read: no cluster need be up; nodes named too must be as many), else the number of nodes the
    launch names (a hostfile, --hosts, a cluster's hostfile; --ec2-tag asks EC2); None: neither."""
    args = targets.NodeArgs(hostfile=cfg.hostfile, hosts=cfg.hosts, ec2_tag=cfg.ec2_tag, cluster=cfg.cluster,
                            region=cfg.region, slots=cfg.slots)
    if cfg.count is not None:
        if cfg.hosts or cfg.hostfile:
            n = len(local_nodes(cfg))
            if n != cfg.count:
                raise LaunchError(f"{cfg.named('count')} {cfg.count}: the launch names {n} node(s) "
                                  f"({cfg.named(node_key(cfg))}): give one, or both the same")
        return cfg.count
    if args.cluster:
        targets.choose(args)  # --cluster's checks first
    elif not targets.named(args):
        return None
    return len(targets.nodes(args))


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
        from dtrain.launch import launching

        ignored = check_fields(cfg)
        if ignored:
            err(f"[launch] --target {target.name}: {', '.join(ignored)} ignored (the nodes' own)")
        if output is not None:
            raise LaunchError(f"--output is where --target {'|'.join(targets.names(writes=True))} writes the "
                              "description")
        return launching.run_on_nodes(cfg)
    ignored = check_fields(cfg)

    def note() -> None:  # once the launch is checked, before it is submitted or written
        if ignored:
            err(f"[launch] --target {target.name}: {', '.join(ignored)} ignored (the {target.name} job's own)")

    count = node_count(cfg)
    given = {k: getattr(cfg, k) for k in cfg.given}
    return target.run(cfg, given, count, output=output, session=session, note=note, err=err, force=force)
