"""Every dtrain cluster and what it bills, in every region: `nodes list` and `nodes down`.

`nodes list` asks each region dtrain has used (launch/infra/regions.py: remembered by `nodes
up`, and the regions of the records here), or with --all-regions every region of the account
(DescribeRegions), for the stacks tagged dtrain:cluster, and shows each with what it runs and
what to do with it. `nodes down` deletes the stack (ec2.delete_stack) and then looks for what
is still billed: the stack itself (DELETE_FAILED), its instances, its Elastic IPs, and with
--delete-data its volumes and file systems; each is one line with the command that removes it,
and the exit code says whether anything is left.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dtrain.launch.errors import LaunchError
from dtrain.launch.infra import ec2, regions

BILLED_STATES = ("pending", "running", "stopping", "stopped", "shutting-down")


@dataclass(frozen=True)
class Row:
    """One cluster as `nodes list` shows it."""

    name: str
    region: str
    status: str  # the stack's status; "no stack" for a record here whose stack is gone
    instance_type: str = "-"
    count: int = 0
    addresses: tuple[str, ...] = ()
    created: dt.datetime | None = None
    spot: bool = False
    recorded: bool = False  # a cluster.json (and hostfile) here: `launch --cluster NAME` works


def state(row: Row) -> str:
    """usable, kept (a stack without a record here: --keep-on-failure, or made elsewhere),
    failed (DELETE_FAILED, still billed), busy (IN_PROGRESS), gone (a record, no stack)."""
    if row.status == "no stack":
        return "gone"
    if row.status == "DELETE_FAILED":
        return "failed"
    if row.status.endswith("IN_PROGRESS"):
        return "busy"
    if row.recorded and row.status in ("CREATE_COMPLETE", "UPDATE_COMPLETE"):
        return "usable"
    return "kept"


def hint(row: Row, default: str | None) -> str:
    """The command that goes with the row's state (pure)."""
    where = regions.region_arg(row.region, default)
    down = f"dtrain nodes down --name {row.name}{where}"
    return {"usable": f"dtrain launch --cluster {row.name} --image IMAGE -- CMD",
            "kept": f"{down}  (no hostfile here: remove it, then nodes up again)",
            "failed": f"{down}  (retries the delete; still billed)",
            "busy": "wait: a nodes up or down is at work",
            "gone": f"{down}  (forgets the record)"}[state(row)]


def price(row: Row) -> str:
    """The cluster's price per hour as shown in `nodes list` (the price-list snapshot:
    pricing.cluster_price_per_hour, no AWS call): "$12.34", "<=$12.34" for spot (the on-demand
    ceiling), the instances only, "?" where the snapshot lacks the type or region, "" for a cluster with no nodes."""
    from dtrain.launch.infra import pricing

    if not row.count or row.instance_type in ("", "-"):
        return ""
    record = {"region": row.region, "instance_type": row.instance_type, "spot": False,
              "instances": [{}] * row.count}  # the instances (their public IPv4, $0.005/h each, aside)
    usd, _ = pricing.cluster_price_per_hour(record)
    if usd is None:
        return "?"
    return f"<=${usd:,.2f}" if row.spot else f"${usd:,.2f}"


def age(created: dt.datetime | None, now: dt.datetime) -> str:
    if created is None:
        return "-"
    s = max(0, int((now - created).total_seconds()))
    return f"{s // 86400}d{s % 86400 // 3600}h" if s >= 86400 else f"{s // 3600}h{s % 3600 // 60}m" \
        if s >= 3600 else f"{s // 60}m"


COLUMNS: tuple[tuple[str, Callable[[Row, dt.datetime], str]], ...] = (
    ("CLUSTER", lambda r, now: r.name),
    ("REGION", lambda r, now: r.region),
    ("STACK", lambda r, now: r.status),
    ("TYPE", lambda r, now: r.instance_type),
    ("NODES", lambda r, now: str(r.count)),
    ("SPOT", lambda r, now: "spot" if r.spot else "-"),
    ("AGE", lambda r, now: age(r.created, now)),
    ("STATE", lambda r, now: state(r)),
    ("$/H", lambda r, now: price(r)),
    ("ADDRESSES", lambda r, now: ",".join(r.addresses) or "-"),
)


def table(rows: Sequence[Row], default: str | None, now: dt.datetime | None = None) -> list[str]:
    """`nodes list`'s lines: a header, one line per cluster, then the command for each (pure)."""
    if not rows:
        return []
    now = now or dt.datetime.now(dt.timezone.utc)
    cols = [(h, f) for h, f in COLUMNS if h != "$/H" or any(price(r) for r in rows)]
    cells = [[h for h, _ in cols]] + [[f(r, now) for _, f in cols] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in cells]
    return lines + [f"{r.name} ({r.region}): {hint(r, default)}" for r in rows]


def region_rows(session: Any, recorded: dict[str, str]) -> list[Row]:
    """The dtrain stacks of one region (its session), with their instances (read-only)."""
    region = session.region_name
    stacks = {}
    for page in session.client("cloudformation").get_paginator("describe_stacks").paginate():
        for st in page["Stacks"]:
            tag = {t["Key"]: t["Value"] for t in st.get("Tags", [])}.get(ec2.CLUSTER_TAG)
            if tag and st["StackStatus"] != "DELETE_COMPLETE":
                stacks[tag] = st
    if not stacks:
        return []
    found: dict[str, list[dict[str, Any]]] = {}
    pages = session.client("ec2").get_paginator("describe_instances").paginate(Filters=[
        {"Name": "tag-key", "Values": [ec2.CLUSTER_TAG]}, {"Name": "instance-state-name", "Values": list(BILLED_STATES)}])
    for page in pages:
        for r in page["Reservations"]:
            for i in r["Instances"]:
                tag = {t["Key"]: t["Value"] for t in i.get("Tags", [])}.get(ec2.CLUSTER_TAG)
                found.setdefault(tag or "", []).append(i)
    rows = []
    for name, st in sorted(stacks.items()):
        inst = sorted(found.get(name, []), key=lambda i: ipaddress.ip_address(i.get("PrivateIpAddress", "0.0.0.0")))
        types = sorted({i["InstanceType"] for i in inst})
        rows.append(Row(name=name, region=region, status=st["StackStatus"], instance_type=",".join(types) or "-",
                        count=len(inst), created=st.get("CreationTime"),
                        addresses=tuple(i.get("PublicIpAddress") or i.get("PrivateIpAddress", "?") for i in inst),
                        spot=any(i.get("InstanceLifecycle") == "spot" for i in inst),
                        recorded=recorded.get(name) == region))
    return rows


def all_regions(session: Any) -> list[str]:
    """Every region enabled for the account (DescribeRegions), sorted."""
    return sorted(r["RegionName"] for r in session.client("ec2").describe_regions()["Regions"])


def list_rows(session_for: Callable[[str], Any], where: Sequence[str], recorded: dict[str, str]) -> list[Row]:
    """The rows of every region in `where`, and a row for each record here whose region was
    asked and whose stack is gone."""
    rows: list[Row] = []
    for region in where:
        rows += region_rows(session_for(region), recorded)
    seen = {(r.name, r.region) for r in rows}
    rows += [Row(name=n, region=reg, status="no stack", recorded=True) for n, reg in sorted(recorded.items())
             if reg in where and (n, reg) not in seen]
    return rows


def list_lines(session_for: Callable[[str | None], Any], region: str | None, everywhere: bool) -> list[str]:
    """`nodes list`: the clusters of --region, or of every region dtrain has used here, or
    (everywhere: --all-regions) of every region of the account. session_for(region) is a boto3
    session (None: the default region)."""
    default = session_for(region).region_name
    where = [region] if region else regions.used(default)
    if not where and not everywhere:
        raise LaunchError("nodes list: no AWS region: pass --region R (or --all-regions), or set AWS_REGION")
    if everywhere:
        where = all_regions(session_for(default))
    rows = list_rows(session_for, where, regions.recorded_regions())
    if not rows:
        return [f"no clusters (no dtrain stack in region{'s' if len(where) > 1 else ''} {', '.join(where)})"]
    return table(rows, regions.default_region())


def down_named(session_for: Callable[[str | None], Any], region: str | None, name: str, delete_data: bool) -> int:
    """`nodes down --name NAME`: in --region, else the cluster's (its record here, else the first
    region dtrain has used that has its stack); 1 while anything stays billed (see down)."""
    if region is None:
        region = regions.recorded_regions().get(name)
    if region is None:
        found = find_stack(name, session_for, regions.used(session_for(None).region_name))
        region = found[0] if found else None
    return down(session_for(region), name, delete_data)


def find_stack(name: str, session_for: Callable[[str], Any], where: Sequence[str]) -> tuple[str, str] | None:
    """(region, status) of the cluster's stack in the first region of `where` that has it, or None."""
    for region in where:
        status = ec2.stack_state(session_for(region), name)
        if status is not None:
            return region, status
    return None


def standing_stack(name: str, profile: str | None = None) -> LaunchError | None:
    """What to say of --cluster NAME that has no record here while its stack stands in a region
    dtrain has used (kept by --keep-on-failure, still being made, DELETE_FAILED): the state and
    the command that works; None where no such stack is found or AWS cannot be asked."""
    import boto3

    where = regions.used()  # only where dtrain made stacks: nothing is asked on a machine that made none
    if not where:
        return None
    try:
        found = find_stack(name, lambda r: boto3.session.Session(profile_name=profile, region_name=r), where)
    except Exception:  # noqa: BLE001 - no credentials or region: the missing record is the answer
        return None
    # AWS answered: no such stack where dtrain looked (those regions named)
    return ec2.unfinished_cluster(name, found[1], found[0]) if found else ec2.unfinished_cluster(name, None,
                                                                                                ", ".join(where))


# --- what `nodes down` leaves billed -----------------------------------------------------------


def leftovers(session: Any, name: str, had_addresses: Sequence[str], delete_data: bool) -> list[str]:
    """One line per thing of the cluster still billed after `nodes down`, each with the command
    that removes it: the stack (DELETE_FAILED, with what blocked it), its instances, its Elastic
    IPs, and with delete_data its dataset volumes and EFS file systems (read-only)."""
    region = session.region_name
    arg = f" --region {region}"
    lines = []
    status = ec2.stack_state(session, name)
    if status is not None:
        why = blocked_by(session, name)
        lines.append(f"stack {ec2.stack_name(name)} {status}{f' ({why})' if why else ''}: "
                     f"`dtrain nodes down --name {name}{regions.region_arg(region)}` again")
    pages = session.client("ec2").get_paginator("describe_instances").paginate(Filters=[
        {"Name": f"tag:{ec2.CLUSTER_TAG}", "Values": [name]},
        {"Name": "instance-state-name", "Values": list(BILLED_STATES)}])
    for page in pages:
        for r in page["Reservations"]:
            for i in r["Instances"]:
                lines.append(f"instance {i['InstanceId']} ({i['State']['Name']}): "
                             f"`aws ec2 terminate-instances --instance-ids {i['InstanceId']}{arg}`")
    for a in ec2.stack_addresses(session, name, had_addresses):
        ip, _, alloc = a.partition(" (")
        lines.append(f"Elastic IP {ip} ({alloc.rstrip(')')}): "
                     f"`aws ec2 release-address --allocation-id {alloc.rstrip(')')}{arg}`")
    if delete_data:
        for v in ec2.dataset_volumes(session, name):
            lines.append(f"volume {v['VolumeId']}: `aws ec2 delete-volume --volume-id {v['VolumeId']}{arg}`")
        for fs in ec2.data_file_systems(session, name):
            lines.append(f"EFS {fs}: `aws efs delete-file-system --file-system-id {fs}{arg}`")
    return lines


def blocked_by(session: Any, name: str) -> str:
    """What the stack could not delete and why (its resources in DELETE_FAILED), or ""."""
    from botocore.exceptions import ClientError

    try:
        res = session.client("cloudformation").describe_stack_resources(
            StackName=ec2.stack_name(name))["StackResources"]
    except ClientError:
        return ""
    failed = [f"{r.get('LogicalResourceId', '?')} {r.get('PhysicalResourceId', '')}: "
              f"{' '.join(str(r.get('ResourceStatusReason', '')).split())}".strip()
              for r in res if r.get("ResourceStatus") == "DELETE_FAILED" and r.get("ResourceStatusReason")]
    if failed:
        return "; ".join(failed)
    try:  # the stack's own event says why
        events = session.client("cloudformation").describe_stack_events(StackName=ec2.stack_name(name))["StackEvents"]
    except ClientError:
        return ""
    return next((" ".join(str(e["ResourceStatusReason"]).split()) for e in events
                 if e.get("ResourceStatus") == "DELETE_FAILED" and e.get("ResourceStatusReason")), "")


def down(session: Any, name: str, delete_data: bool, say: Callable[[str], None] = print) -> int:
    """The whole of `nodes down`: delete the stack (and with delete_data the cluster's data),
    say what it did, then what is still billed; 0 when nothing is, 1 otherwise."""
    before = ec2.stack_state(session, name)
    had = ec2.stack_addresses(session, name) if before is not None else []
    where = f"region {session.region_name}"
    failure = None
    try:
        data = ec2.delete_stack(session, name, delete_data=delete_data)
    except LaunchError as e:
        if before is None:
            raise
        failure, data = str(e), []
    if failure:
        say(failure)
    elif before is None:  # only --delete-data had something to do: the data a gone stack left
        say(f"no stack {ec2.stack_name(name)} in {where} (deleted before): nothing to delete there; "
            f"deleted the data it left: {', '.join(data)}")
    elif delete_data:
        say(f"deleted stack {ec2.stack_name(name)}" + (f" and its data: {', '.join(data)}" if data else ""))
    else:
        say(f"deleted stack {ec2.stack_name(name)}" + (
            f"; kept its data: {', '.join(data)} (a cluster named {name} mounts it again; "
            f"`dtrain nodes down --name {name}{regions.region_arg(session.region_name)} --delete-data` deletes it)"
            if data else ""))
    left = leftovers(session, name, had, delete_data)
    if had and not any(line.startswith("Elastic IP ") for line in left):
        say(ec2.addresses_left_line(len(had), []))
    if not left:
        return 0
    say(f"still billed in {where} ({len(left)}):")
    for line in left:
        say(f"  {line}")
    return 1
