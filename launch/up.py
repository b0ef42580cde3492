"""A launch that brings its own nodes (`dtrain launch --up TYPE:COUNT`, or `up:` in the job file):
the price first, the stack after, the job on it, the stack gone after.

    shape (TYPE:COUNT) -> nodes_spec -> pricing.nodes_up_gate (price; ask above --confirm-above)
        -> ec2.start (the stack: `nodes up`'s code) -> ec2.finish (capacity, ssh + docker ready)
        -> worker list -> the job on it (launching.run_on_nodes, as `launch --cluster NAME`)
        -> the stack deleted (fleet.down: `nodes down`'s code), unless --keep / --idle-down

Nothing bills that the user did not ask to keep: a refused price creates nothing; a failure or a
Ctrl-C while the stack is made or the nodes are awaited deletes it (ec2.finish); after that, the
job's end, its failure or a Ctrl-C during it deletes it too (`finally`). With --keep (or
--idle-down MINUTES) the nodes stay, and their price per hour and the command that takes them
down are said.

Also `follow` (`launch --cluster NAME` on an EC2 cluster): before the launch, the hostfile follows
the cluster's Auto Scaling group (what `nodes sync --name` does), said in one line.
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable

from dtrain.launch.errors import LaunchError

WAIT_DEFAULT = 900  # seconds for capacity, and again for ssh + docker (as `nodes up --timeout`)


def shape(text: str) -> tuple[str, int]:
    """(instance type, count) of --up (jobfile.up_shape: the field's own parser)."""
    from dtrain.launch.jobs.jobfile import up_shape

    return up_shape(text)


def cluster_name(job_name: str | None, now: float | None = None) -> str:
    """The stack's cluster name (pure): the job's name where it makes one (letters, digits, '-',
    starting with a letter, at most 63), else up-YYYYmmdd-HHMMSS."""
    if job_name:
        name = re.sub(r"[^A-Za-z0-9-]+", "-", job_name).strip("-")
        name = name if name[:1].isalpha() else f"up-{name}"
        return name[:63].rstrip("-")
    return "up-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))


def nodes_spec(cfg: Any, name: str) -> Any:
    """The stack the launch asks for (ec2.NodesSpec; pure): --up's count and the --spares more."""
    from dtrain.launch.infra import ec2

    itype, count = shape(cfg.up)
    return ec2.NodesSpec(name=name, count=count + (cfg.spares or 0), instance_type=itype, spot=bool(cfg.spot),
                         subnet=cfg.subnet, key_name=cfg.key_name, ami=cfg.ami or "auto", ssh_user=cfg.ssh_user,
                         root_size=cfg.root_size, idle_down=cfg.idle_down)


def down_command(name: str, region: str) -> str:
    from dtrain.launch.infra import regions

    return f"dtrain nodes down --name {name}{regions.region_arg(region)}"


def kept_lines(cluster: Any, idle_down: int | None) -> list[str]:
    """What is said of nodes kept after the job (pure but for the price-list snapshot): their
    price per hour, the command that takes them down, the next launch's."""
    from dtrain.launch.infra import pricing

    usd, why = pricing.cluster_price_per_hour(cluster)
    price = f"${usd:,.2f}/h ({why})" if usd is not None else f"a price not known here ({why})"
    down = down_command(cluster.name, cluster.region)
    idle = (f"; they delete their own stack after {idle_down} min without a dtrain job" if idle_down else "")
    return [f"[up] kept: cluster {cluster.name} ({len(cluster.instances)} x {cluster.instance_type}, "
            f"{cluster.region}) bills {price}{idle}",
            f"[up] take it down: {down}",
            f"[up] next job there: dtrain launch --cluster {cluster.name} --image IMAGE -- CMD"]


def session_for(region: str | None) -> Any:
    import boto3

    session = boto3.Session(region_name=region)
    if not session.region_name:
        raise LaunchError("--up: no AWS region: give --region (or set AWS_DEFAULT_REGION / a profile's region)")
    return session


def run(cfg: Any, on_cluster: Callable[[Any], int], session: Any = None, say: Callable[[str], None] = print) -> int:
    """The launch `cfg` (a LaunchConfig with `up`) on nodes it brings up: the job's exit code.
    on_cluster(cfg): the launch on a cluster's nodes (launching.run_on_nodes, passed in: this
    module is below launching.py)."""
    from dtrain.launch.infra import ec2, fleet, pricing

    session = session or session_for(cfg.region)
    name = cluster_name(cfg.name)
    spec = nodes_spec(cfg, name)
    keep = bool(cfg.keep or cfg.idle_down)
    wait = float(cfg.up_timeout or WAIT_DEFAULT)
    above = pricing.threshold(None if cfg.confirm_above is None else f"{cfg.confirm_above:g}")
    hours = cfg.timeout / 3600 if cfg.timeout else None
    gate = pricing.nodes_up_gate(session, instance_type=spec.instance_type, count=spec.count, spot=spec.spot,
                                 above=above, yes=bool(cfg.yes), hours=hours, say=say)
    ssh_opts = tuple(x for o in (cfg.ssh_opt or []) for x in ("-o", o))  # recorded with the cluster, as `nodes up --ssh-opt`
    # a refused price, or any error before the stack is asked for: nothing is created
    res = ec2.start(session, spec, say=say, address="auto", here=ec2.vantage, confirm=gate)
    hint = (f"the security group lets ssh in from {res.ssh_rule} only; check that this machine's ssh "
            f"comes from there and can route to the nodes' {res.address} addresses")
    ready = ec2.ssh_ready(cfg.ssh_key, res.address, ssh_opts, timeout=wait, user=res.ssh_user,
                          first_timeout=min(300.0, wait), hint=hint)
    # a failure or Ctrl-C from here until the nodes are ready: finish deletes the stack (and says so)
    cluster, hostfile = ec2.finish(session, spec, res, identity=cfg.ssh_key, timeout=wait, ready=ready, say=say,
                                   ssh_opts=ssh_opts)
    code: int | None = None
    try:
        from dtrain.launch.remote.hosts import parse_hostfile

        ec2.write_worker_list(parse_hostfile(hostfile), cluster, ssh_opts)
        say(f"[up] {len(cluster.instances)} x {cluster.instance_type} up ({res.address} addresses); the job runs on "
            f"cluster {name}")
        code = on_cluster(cfg.model_copy(update={"up": None, "cluster": name}))  # as --cluster NAME
        return code
    finally:
        if keep:
            for line in kept_lines(ec2.load_cluster(name), cfg.idle_down):
                say(line)
        else:
            why = ("the job ended" if code == 0 else f"the job failed (exit code {code})" if code is not None
                   else "the launch stopped")
            say(f"[up] {why}: deleting stack {ec2.stack_name(name)} (--keep keeps the nodes)")
            if fleet.down(session, name, False, say=say):
                say(f"[up] something stays billed (above): `{down_command(name, session.region_name)}` again")


# ---------------------------------------------------------------- launch --cluster NAME


def follow(name: str, say: Callable[[str], None] = print, session: Any = None) -> None:
    """Before `launch --cluster NAME` on an EC2 cluster (its record, cluster.json): the record and
    hostfile follow its Auto Scaling group (ec2.follow_group, as `nodes sync --name`), and the
    worker list is written again where anything changed; said in one line. AWS not answering
    (no credentials, no network) is said, and the launch goes on with the recorded nodes."""
    from dtrain.launch.infra import ec2

    if not (ec2.cluster_dir(name) / "cluster.json").exists():
        return  # not an EC2 cluster of `nodes up` (a hostfile alone): nothing to follow
    record = ec2.load_cluster(name)
    changes: list[str] = []
    try:
        cluster, hostfile, changed = ec2.follow_group(session or session_for(record.region), name,
                                                      say=changes.append)
    except LaunchError as e:
        if "no node of the cluster is running" in str(e):
            raise  # the group has none: the launch cannot go on
        say(f"[launch] cluster {name}: hostfile not checked against its Auto Scaling group ({e}); launching on "
            "the recorded nodes")
        return
    except Exception as e:  # noqa: BLE001 - any AWS failure: the recorded nodes, and why
        say(f"[launch] cluster {name}: hostfile not checked against its Auto Scaling group "
            f"({' '.join(str(e).split())[:160]}); launching on the recorded nodes")
        return
    if not changed:
        return
    from dtrain.launch import targets
    from dtrain.launch.remote.hosts import parse_hostfile

    said = "; ".join(line.removeprefix("[nodes] ") for line in changes)
    say(f"[launch] cluster {name} follows its Auto Scaling group: {said}; now {len(cluster.instances)} nodes")
    ec2.write_worker_list(parse_hostfile(hostfile), cluster, tuple(targets.ssh_opts(targets.NodeArgs(cluster=name))))
