"""The targets' registry (SkyPilot's router, sky/provision/__init__.py): `--target` values
(`TARGETS`, `get`, `names`) and where the nodes of `--target nodes` come from (`PROVIDERS`,
`provider`, `choose`, `nodes`). One line per module; what differs per target is in its module
(base.py declares what each provides; docs/architecture.md "Targets")."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from dtrain import values
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs.jobfile import node_fields, shown
from dtrain.launch.other_tools.describe import Describer
from dtrain.launch.remote.hosts import Node, apply_ssh_defaults
from dtrain.launch.targets import (ec2, ecs, jobset, local, mpijob, nodes as on_nodes, pytorchjob, sagemaker, ssh,
                                   trainjob)
from dtrain.launch.targets.base import NodeArgs, NodeProvider, Target

__all__ = ["NodeArgs", "NodeProvider", "PROVIDERS", "TARGETS", "Target", "choose", "describers", "get",
           "named", "names", "node_args", "nodes", "provider", "spot_notice", "ssh_opts"]

# --target values; the first is the default.
TARGETS: dict[str, Target] = {t.name: t for t in (
    on_nodes.TARGET,
    sagemaker.TARGET,
    mpijob.TARGET,
    pytorchjob.TARGET,
    ecs.TARGET,
    trainjob.TARGET,
    jobset.TARGET,
)}

# where the nodes come from
PROVIDERS: dict[str, NodeProvider] = {p.name: p for p in (
    local.PROVIDER,
    ssh.PROVIDER,
    ec2.PROVIDER,
)}

# The flags that name the nodes, as the errors list them (the providers' own, from the model): --cluster
# stands alone.
_NAMED_BY = tuple((k, shown(k)) for k in node_fields() if k in {f for p in PROVIDERS.values() for f in p.flags}
                  and k != "cluster")


def names(**having: bool) -> tuple[str, ...]:
    """The --target choices (the default first), e.g. names(writes=True)."""
    return tuple(n for n, t in TARGETS.items() if all(getattr(t, k) == v for k, v in having.items()))


def describers() -> dict[str, Describer]:
    """The targets that are also a kind of job description (`dtrain manifest --for NAME`), in
    the registry's order."""
    return {n: t for n, t in TARGETS.items() if isinstance(t, Describer)}


def get(name: str) -> Target:
    """The target called name, or one line listing the choices."""
    if name not in TARGETS:
        raise LaunchError(f"--target {name!r}: expected one of {', '.join(TARGETS)}")
    return TARGETS[name]


def provider(name: str) -> NodeProvider:
    if name not in PROVIDERS:
        raise LaunchError(f"no node provider {name!r}: expected one of {', '.join(PROVIDERS)}")
    return PROVIDERS[name]


def _by_flag(key: str) -> NodeProvider:
    return next(p for p in PROVIDERS.values() if key in p.flags)


def node_args(node: dict) -> NodeArgs:
    """NodeArgs of the node flags ({flag: value}; absent: None): the fields NodeArgs has."""
    import dataclasses

    return NodeArgs(**{f.name: node.get(f.name) for f in dataclasses.fields(NodeArgs)})


def named(args: NodeArgs) -> bool:
    """Whether args name any nodes."""
    return bool(args.cluster) or any(getattr(args, key) for key, _ in _NAMED_BY)


def choose(args: NodeArgs) -> NodeProvider | None:
    """The provider of the nodes args name (None: they name none); an error where they name
    more than one source."""
    given = [key for key, _ in _NAMED_BY if getattr(args, key)]
    if args.cluster:
        values.name("--cluster", args.cluster)
        if given:
            raise LaunchError("give --cluster or one of --hostfile, --hosts, --ec2-tag, not both")
        return _by_flag("cluster")
    if len(given) > 1:
        raise LaunchError(_exactly_one() + f" (got {', '.join('--' + k.replace('_', '-') for k in given)})")
    return _by_flag(given[0]) if given else None


def _named(args: NodeArgs) -> NodeProvider | None:
    """The provider whose flags args give, without the checks (nodes() makes them)."""
    return next((p for p in PROVIDERS.values() if any(getattr(args, f) for f in p.flags)), None)


def spot_notice(args: NodeArgs) -> str:
    """Where the nodes args name poll for a spot interruption notice ("": they hear none)."""
    return next((p.spot_notice for p in PROVIDERS.values() if p.spot_notice and any(getattr(args, f) for f in p.flags)),
                "")


def ssh_opts(args: NodeArgs) -> tuple[str, ...]:
    """The ssh options the provider of the nodes args name recorded for them."""
    chosen = _named(args)
    return chosen.ssh_opts(args) if chosen else ()


def joining(args: NodeArgs, *, ssh_user: str | None = None, ssh_key: str | None = None, slots: int | None = None
            ) -> Callable[[], list[Node]] | None:
    """The nodes args name as they are now, asked while a job runs (their provider's joining,
    with the ssh defaults nodes() gives and the launch's --slots over each host's own, as the
    job's nodes have them); None where they cannot change."""
    chosen = _named(args)
    source = chosen.joining(args) if chosen else None
    if source is None:
        return None

    def now() -> list[Node]:
        found = apply_ssh_defaults(source(), user=ssh_user, identity=ssh_key)
        return found if slots is None else [dataclasses.replace(n, slots=slots) for n in found]

    return now


def efa_types() -> tuple[tuple[str, int], ...]:
    """(instance type, EFA interfaces) of every type known to have EFA: what the launch's NCCL
    check (--nccl-check, launch/jobs/nccl_net.py) expects of a node whose DMI names that type,
    wherever its nodes come from (the one call of the table for it)."""
    from dtrain.launch.infra import instance_types

    known = instance_types.snapshot().types  # EC2's own data (DescribeInstanceTypes' dated snapshot)
    return tuple((t, n) for t in sorted(known) if (n := instance_types.efa_of(known[t])) > 0)


def _exactly_one() -> str:
    return "give exactly one of " + ", ".join(shown for _, shown in _NAMED_BY)


def nodes(args: NodeArgs, *, ssh_user: str | None = None, ssh_key: str | None = None,
          ssh_port: int | None = None) -> list[Node]:
    """The nodes args name, from their provider, with the ssh defaults where a node has none."""
    chosen = choose(args)
    if chosen is None:
        raise LaunchError(_exactly_one())
    return apply_ssh_defaults(chosen.discover(args), user=ssh_user, identity=ssh_key, port=ssh_port)
