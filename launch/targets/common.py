"""What the targets off the nodes share: the launch's env, the flag a field is, the node shape."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dtrain.launch.errors import LaunchError


def flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def given(cfg: Mapping[str, Any], key: str) -> bool:
    return cfg.get(key) not in (None, [], (), False)


def env(cfg: Any) -> dict[str, str]:
    """--env-file's pairs, then --env's (later ones win)."""
    return cfg.env_values()


def node_count(cfg: Any) -> int | None:
    """How many nodes a target off the nodes runs on: `count` where the launch gives it (no node
    is read: no cluster need be up; nodes named too must be as many), else the number of nodes the
    launch names (a hostfile, --hosts, a cluster's hostfile; --ec2-tag asks EC2); None: neither."""
    from dtrain.launch import targets

    args = targets.NodeArgs(hostfile=cfg.hostfile, hosts=cfg.hosts, ec2_tag=cfg.ec2_tag, cluster=cfg.cluster,
                            region=cfg.region, slots=cfg.slots)
    if cfg.count is not None:
        if cfg.hosts or cfg.hostfile:
            n = len(_local_nodes(cfg))
            if n != cfg.count:
                raise LaunchError(f"{cfg.named('count')} {cfg.count}: the launch names {n} node(s) "
                                  f"({cfg.named(_node_key(cfg))}): give one, or both the same")
        return cfg.count
    if args.cluster:
        targets.choose(args)  # --cluster's checks first
    elif not targets.named(args):
        return None
    return len(targets.nodes(args))


def _local_nodes(cfg: Any) -> list:
    """The nodes a hostfile or --hosts name, read here (no node, no AWS)."""
    from dtrain.launch import targets

    if not (cfg.hosts or cfg.hostfile) or cfg.ec2_tag or cfg.cluster:
        return []
    return targets.nodes(targets.NodeArgs(hostfile=cfg.hostfile, hosts=cfg.hosts))


def slots(cfg: Any) -> int | None:
    """Processes per node on a target off the nodes: `slots`, else the nodes' own (`hosts: h:8`,
    a hostfile's slots=8) where they agree and say more than one, else None (the target's
    default: the instance type's GPUs, or 1)."""
    if cfg.slots is not None:
        return cfg.slots
    per = {n.slots for n in _local_nodes(cfg)}
    if len(per) > 1:
        raise LaunchError(f"{cfg.named(_node_key(cfg))}: the nodes have different slots "
                          f"({', '.join(map(str, sorted(per)))}); a target off the nodes runs as many processes on "
                          "every node: give slots")
    return next(iter(per)) if per and per != {1} else None


def _node_key(cfg: Any) -> str:
    return next((k for k in ("hosts", "hostfile", "cluster", "ec2_tag") if cfg.get(k)), "slots")


def ssh_options(ssh_opt: Any = None, ssh_config: str | None = None, cluster: str | None = None) -> tuple[str, ...]:
    """ssh options from --ssh-config and --ssh-opt, after those `nodes up --ssh-opt` recorded for
    --cluster (a ProxyJump to a bastion): ssh takes the first value of an option, so the cluster's
    win over a repeated one; give the cluster a new one with nodes up."""
    from dtrain import values
    from dtrain.launch import targets

    if ssh_config is not None:
        values.ssh_config("--ssh-config", ssh_config)
    recorded: tuple = ()
    if cluster:
        values.name("--cluster", cluster)
        recorded = targets.ssh_opts(targets.NodeArgs(cluster=cluster))  # its provider's record
    return (("-F", ssh_config) if ssh_config else ()) + tuple(recorded) + tuple(
        x for o in (ssh_opt or []) for x in ("-o", o))


def node_list(hostfile: str | None = None, hosts: str | None = None, ec2_tag: str | None = None,
              region: str | None = None, slots: Any = None, ssh_user: str | None = None, ssh_key: str | None = None,
              cluster: str | None = None) -> list:
    """The nodes the flags name, from their provider (--cluster and --ec2-tag EC2, --hostfile and
    --hosts plain ssh hosts), each flag checked by its parser."""
    from dtrain import values
    from dtrain.launch import targets
    from dtrain.launch.jobs.jobfile import number

    if ssh_user is not None:
        values.user("--ssh-user", ssh_user)
    if region is not None:
        values.region("--region", region)
    if ssh_key is not None:
        values.ssh_key("--ssh-key", ssh_key)
    if slots is not None:
        slots = number("slots", slots)  # the launch's bound (jobfile.NUMBERS)
    args = targets.NodeArgs(hostfile=hostfile, hosts=hosts, ec2_tag=ec2_tag, cluster=cluster, region=region,
                            slots=slots)
    return targets.nodes(args, ssh_user=ssh_user, ssh_key=ssh_key)
