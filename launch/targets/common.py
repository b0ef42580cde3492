"""What the targets off the nodes share: the launch's env, the flag a field is, the node shape."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs.jobfile import choosing


def flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def given(cfg: Mapping[str, Any], key: str) -> bool:
    return cfg.get(key) not in (None, [], (), False)


def env(cfg: Any) -> dict[str, str]:
    """--env-file's pairs, then --env's (later ones win)."""
    return cfg.env_values()


def local_nodes(cfg: Any) -> list:
    """The nodes a hostfile or --hosts name, read here (no node, no AWS)."""
    from dtrain.launch.remote.hosts import parse_hosts_arg
    from dtrain.launch.targets.ssh import hostfile_nodes

    if not (cfg.hosts or cfg.hostfile) or cfg.ec2_tag or cfg.cluster:
        return []
    return hostfile_nodes(cfg.hostfile) if cfg.hostfile else parse_hosts_arg(cfg.hosts)


def slots(cfg: Any) -> int | None:
    """Processes per node on a target off the nodes: `slots`, else the nodes' own (`hosts: h:8`,
    a hostfile's slots=8) where they agree and say more than one, else None (the target's
    default: the instance type's GPUs, or 1)."""
    if cfg.slots is not None:
        return cfg.slots
    per = {n.slots for n in local_nodes(cfg)}
    if len(per) > 1:
        raise LaunchError(f"{cfg.named(node_key(cfg))}: the nodes have different slots "
                          f"({', '.join(map(str, sorted(per)))}); a target off the nodes runs as many processes on "
                          "every node: give slots")
    return next(iter(per)) if per and per != {1} else None


def node_key(cfg: Any) -> str:
    return next((k for k in choosing() if cfg.get(k)), "slots")  # the field that named the nodes

