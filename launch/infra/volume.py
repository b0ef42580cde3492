"""A shared dataset volume for a cluster made by `nodes up`.

EBS: one io2 volume with Multi-Attach in the nodes' zone, attached to every node, formatted
once from the first node, mounted read-only on every node (ext4 is not a cluster filesystem:
several writers, or one writer and several readers, corrupt it or read garbage). EFS (the
cluster's stack made it with `nodes up --efs`): mounted read-write on every node.

Requests are pure functions (values in, boto3 kwargs out; the tests check them against
botocore's models); the node-side steps are launch/node/volume-format.sh and volume-mount.sh,
sent on ssh's stdin with their arguments quoted.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dtrain import contract
from dtrain.launch.errors import LaunchError
from dtrain.launch.infra.ec2 import CLUSTER_TAG, DATASET_TAG, Cluster, aws_error_text, dataset_volumes
from dtrain.launch.infra.instance_types import MULTI_ATTACH_MAX
from dtrain.launch.infra.regions import region_arg
from dtrain.launch.remote.hosts import Node
from dtrain.launch.remote.transport import SshTransport

NODE_DIR = contract.NODE_SCRIPTS
DEVICE_NAMES = tuple(f"/dev/sd{c}" for c in "fghijklmnop")  # AWS's recommended names for data volumes
MOUNT_TAG = "dtrain:mount"  # the volume's mount path: a cluster of the same name mounts it there again
IO2_SIZE_GB = (4, 16384)


@dataclass(frozen=True)
class VolumeSpec:
    cluster: str
    size_gb: int | None = None  # None with a snapshot: the snapshot's size
    snapshot: str | None = None
    iops: int = 3000
    mount_path: str = "/data"
    efs: bool = False
    fill_from: str | None = None  # a directory on the first node copied onto a new volume

    def __post_init__(self) -> None:
        if not self.mount_path.startswith("/"):
            raise LaunchError(f"--path {self.mount_path!r}: must be absolute")
        if self.fill_from is not None and not (
                self.fill_from.startswith("/") or re.fullmatch(r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/\S*)?",
                                                               self.fill_from)):
            raise LaunchError(f"--fill-from {self.fill_from!r}: an absolute directory on the first node, "
                              "or s3://BUCKET/PREFIX")
        if self.fill_from and self.efs:
            raise LaunchError("--fill-from is for a new io2 volume; on EFS, copy into the mounted path")
        if self.snapshot is not None and not re.fullmatch(r"snap-(?:[0-9a-f]{8}|[0-9a-f]{17})", self.snapshot):
            raise LaunchError(f"--from-snapshot {self.snapshot!r}: not a snapshot id; expected snap- and 8 or "
                              "17 hex digits, e.g. snap-0123456789abcdef0")
        if self.efs and (self.size_gb or self.snapshot):
            raise LaunchError("--efs takes no --size or --from-snapshot (EFS grows as you write)")
        if not self.efs and self.size_gb is None and not self.snapshot:
            raise LaunchError("--size GiB is required (or --from-snapshot SNAPSHOT-ID)")
        lo, hi = IO2_SIZE_GB
        if self.size_gb is not None and not lo <= self.size_gb <= hi:
            raise LaunchError(f"--size {self.size_gb}: io2 volumes are {lo} to {hi} GiB")


def zone_of(cluster: Cluster) -> str:
    """The one availability zone of every node; errors where Multi-Attach cannot work."""
    zones = sorted({i.availability_zone for i in cluster.instances})
    if len(zones) != 1:
        raise LaunchError(f"cluster {cluster.name}: nodes span zones {', '.join(zones)}; a Multi-Attach volume "
                          "attaches in one zone only (use --efs)")
    if not cluster.nitro:
        raise LaunchError(f"cluster {cluster.name}: {cluster.instance_type} is not a Nitro instance type; "
                          "EBS Multi-Attach needs Nitro (use --efs)")
    if len(cluster.instances) > MULTI_ATTACH_MAX:
        raise LaunchError(f"cluster {cluster.name}: {len(cluster.instances)} nodes; a Multi-Attach volume "
                          f"attaches to at most {MULTI_ATTACH_MAX} (use --efs)")
    return zones[0]


def create_volume_request(cluster: Cluster, spec: VolumeSpec, zone: str) -> dict[str, Any]:
    """CreateVolume kwargs: io2, Multi-Attach, in the nodes' zone, tagged with the cluster."""
    req: dict[str, Any] = {
        "AvailabilityZone": zone, "VolumeType": "io2", "Iops": spec.iops, "MultiAttachEnabled": True,
        "Encrypted": True,
        "TagSpecifications": [{"ResourceType": "volume", "Tags": [
            {"Key": CLUSTER_TAG, "Value": cluster.name}, {"Key": DATASET_TAG[0], "Value": DATASET_TAG[1]},
            {"Key": MOUNT_TAG, "Value": spec.mount_path}, {"Key": "Name", "Value": f"dtrain-{cluster.name}-data"}]}],
    }
    if spec.size_gb is not None:
        req["Size"] = spec.size_gb
    if spec.snapshot:
        req["SnapshotId"] = spec.snapshot
    return req


def free_device(used: set[str]) -> str:
    """The first of DEVICE_NAMES no instance uses (the same name on every node)."""
    free = [d for d in DEVICE_NAMES if d not in used and d.replace("/dev/sd", "/dev/xvd") not in used]
    if not free:
        raise LaunchError(f"no free device name among {DEVICE_NAMES[0]}..{DEVICE_NAMES[-1]} on the nodes "
                          "(each already has that many volumes attached)")
    return free[0]


def used_devices(ec2: Any, instance_ids: Sequence[str]) -> set[str]:
    """Device names the instances' block device mappings use."""
    res = ec2.describe_instances(InstanceIds=list(instance_ids))["Reservations"]
    return {b["DeviceName"] for r in res for i in r["Instances"] for b in i.get("BlockDeviceMappings", [])}


def attach_requests(volume_id: str, cluster: Cluster, device: str = DEVICE_NAMES[0]) -> list[dict[str, Any]]:
    return [{"VolumeId": volume_id, "InstanceId": i.id, "Device": device} for i in cluster.instances]


def nvme_device(volume_id: str) -> str:
    """Where a Nitro instance shows an EBS volume: its serial is the id without the dash."""
    return f"/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_{volume_id.replace('-', '')}"


def efs_dns(file_system: str, region: str) -> str:
    return f"{file_system}.efs.{region}.amazonaws.com"


def create_and_attach(session: Any, cluster: Cluster, spec: VolumeSpec, *, timeout: float = 300,
                      poll: float = 5, say: Callable[[str], None] = print) -> str:
    """Create the volume and attach it to every node; on failure detach and delete it."""
    from botocore.exceptions import ClientError

    zone = zone_of(cluster)
    ec2 = session.client("ec2")
    if spec.snapshot:
        check_snapshot(ec2, spec.snapshot, session.region_name)
    try:
        vol = ec2.create_volume(**create_volume_request(cluster, spec, zone))["VolumeId"]
    except ClientError as e:
        raise LaunchError(f"CreateVolume in {zone}: {aws_error_text(e)}") from None
    say(f"[volume] {vol}: io2 Multi-Attach in {zone}; attaching to {len(cluster.instances)} nodes")
    try:
        _wait(lambda: ec2.describe_volumes(VolumeIds=[vol])["Volumes"][0]["State"] == "available",
              vol, timeout, poll, "available")
        attach_everywhere(ec2, vol, cluster, timeout, poll)
    except BaseException as e:
        _remove(ec2, vol, cluster)
        if isinstance(e, ClientError):
            raise LaunchError(f"volume {vol}: {aws_error_text(e)}; volume deleted") from None
        raise
    return vol


def check_snapshot(ec2: Any, snapshot: str, region: str) -> None:
    """--from-snapshot names a snapshot this account can read in the region, ready to use: a
    read-only call before anything is created."""
    from botocore.exceptions import ClientError

    try:
        found = ec2.describe_snapshots(SnapshotIds=[snapshot])["Snapshots"]
    except ClientError as e:
        if e.response["Error"].get("Code") not in ("InvalidSnapshot.NotFound", "InvalidSnapshotID.Malformed"):
            raise LaunchError(f"--from-snapshot {snapshot}: DescribeSnapshots: {aws_error_text(e)}") from None
        found = []
    if not found:
        raise LaunchError(f"--from-snapshot {snapshot}: no such snapshot in region {region} (or not shared with "
                          f"this account); `aws ec2 describe-snapshots --owner-ids self --region {region}` lists yours")
    state = found[0].get("State", "completed")
    if state != "completed":
        raise LaunchError(f"--from-snapshot {snapshot}: the snapshot is {state}; a volume is made from a completed "
                          "one (wait, or take it again)")


def attach_everywhere(ec2: Any, vol: str, cluster: Cluster, timeout: float, poll: float) -> None:
    """Attach vol to every node under the first device name none of them uses, and wait."""
    ids = [i.id for i in cluster.instances]
    for req in attach_requests(vol, cluster, free_device(used_devices(ec2, ids))):
        ec2.attach_volume(**req)
    _wait(lambda: attached_to(ec2, vol, ids) == set(ids), vol, timeout, poll, "attached to every node")


def _wait(ok: Callable[[], bool], vol: str, timeout: float, poll: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise LaunchError(f"volume {vol}: not {what} after {timeout:.0f}s")
        time.sleep(poll)


def attached_to(ec2: Any, vol: str, instance_ids: Sequence[str]) -> set[str]:
    """The instances that show vol as attached (each instance's block device mappings)."""
    res = ec2.describe_instances(InstanceIds=list(instance_ids))["Reservations"]
    return {i["InstanceId"] for r in res for i in r["Instances"]
            for b in i.get("BlockDeviceMappings", [])
            if b.get("Ebs", {}).get("VolumeId") == vol and b["Ebs"].get("Status") == "attached"}


def remove(session: Any, vol: str, cluster: Cluster) -> None:
    """Detach the volume from every node and delete it (a failed step after the attach)."""
    _remove(session.client("ec2"), vol, cluster)


def _remove(ec2: Any, vol: str, cluster: Cluster) -> None:
    for i in cluster.instances:
        try:
            ec2.detach_volume(VolumeId=vol, InstanceId=i.id, Force=True)
        except Exception:  # noqa: BLE001 - not attached there; nothing to undo
            pass
    try:
        ec2.get_waiter("volume_available").wait(VolumeIds=[vol], WaiterConfig={"Delay": 2, "MaxAttempts": 60})
    except Exception:  # noqa: BLE001 - delete_volume below says what is wrong
        pass
    ec2.delete_volume(VolumeId=vol)


# --- node side --------------------------------------------------------------------------------


def script_command(node: Node, args: Sequence[str]) -> list[str]:
    """A node script (sent on stdin) run with args; sudo for a non-root user."""
    sudo = ["sudo", "-n"] if node.user not in (None, "root") else []
    return [*sudo, "sh", "-s", "--", *args]


def script_argv(node: Node, script: str, args: Sequence[str], ssh_opts: Sequence[str] = ()) -> list[str]:
    """ssh argv running launch/node/SCRIPT (sent on stdin) with args, quoted for the node's shell."""
    return SshTransport([node], ssh_opts, multiplex=False).argv(node, script_command(node, args))


def _run_script(nodes: Sequence[Node], script: str, args: Sequence[str], ssh_opts: Sequence[str],
                what: str, say: Callable[[str], None]) -> None:
    from dtrain.launch.remote.fanout import raise_on_failure

    text = (NODE_DIR / script).read_text()
    results = SshTransport(nodes, ssh_opts, multiplex=False).run(
        nodes, lambda n: script_command(n, args), stdin=lambda n: text, timeout=600, retries=2)
    for n, r in zip(nodes, results):
        for line in r.stdout.splitlines():
            say(f"[{n.host}] {line}")
    raise_on_failure(results, what)


FSTAB = "/etc/fstab"


def prepare(nodes: Sequence[Node], source: str, mount_path: str, *, kind: str = "ebs",
            fill_from: str | None = None, ssh_opts: Sequence[str] = (),
            say: Callable[[str], None] = print, fstab: str = FSTAB) -> None:
    """EBS: format once on the first node (copying fill_from there onto it), then mount
    read-only on every node. EFS: mount read-write on every node."""
    if kind == "ebs":
        _run_script(nodes[:1], "volume-format.sh", [source, *([fill_from] if fill_from else [])], ssh_opts,
                    "formatting the volume", say)
    _run_script(nodes, "volume-mount.sh", [kind, source, mount_path, fstab], ssh_opts,
                f"mounting {shlex.quote(source)} on {mount_path}", say)


def create(session: Any, cluster: Cluster, nodes: Sequence[Node], spec: VolumeSpec, *,
           ssh_opts: Sequence[str] = (), say: Callable[[str], None] = print, fstab: str = FSTAB) -> str:
    """The whole of `dtrain volume create`: the volume (or the cluster's EFS), on every node."""
    if spec.efs:
        if not cluster.file_system:
            raise LaunchError(f"cluster {cluster.name} has no EFS file system (nodes up without --efs): "
                              f"`dtrain nodes down --name {cluster.name}{region_arg(cluster.region)}`, then "
                              f"`dtrain nodes up --name {cluster.name} --efs ...`")
        prepare(nodes, efs_dns(cluster.file_system, cluster.region), spec.mount_path, kind="efs",
                ssh_opts=ssh_opts, say=say, fstab=fstab)
        return cluster.file_system
    vol = create_and_attach(session, cluster, spec, say=say)
    try:
        prepare(nodes, nvme_device(vol), spec.mount_path, fill_from=spec.fill_from, ssh_opts=ssh_opts, say=say,
                fstab=fstab)
    except BaseException as e:
        say(f"[volume] {vol}: a node step failed; unmounting, detaching and deleting it (nothing is left billed)")
        unmount(nodes, spec.mount_path, ssh_opts, fstab)
        remove(session, vol, cluster)
        if isinstance(e, LaunchError):
            what = " ".join(line.strip() for line in str(e).splitlines())
            raise LaunchError(f"{what}; volume {vol} deleted") from None
        raise
    return vol


def unmount(nodes: Sequence[Node], mount_path: str, ssh_opts: Sequence[str] = (), fstab: str = FSTAB) -> None:
    """Best effort: unmount mount_path and drop its fstab line on every node that answers."""
    text = (NODE_DIR / "volume-umount.sh").read_text()
    SshTransport(nodes, ssh_opts, multiplex=False).run(
        nodes, lambda n: script_command(n, [mount_path, fstab]), stdin=lambda n: text, timeout=60, retries=0)


def reattach(session: Any, cluster: Cluster, nodes: Sequence[Node], *, ssh_opts: Sequence[str] = (),
             timeout: float = 300, poll: float = 5, say: Callable[[str], None] = print) -> list[str]:
    """A cluster that comes back under its name gets its kept dataset volumes: attached to
    every node and mounted read-only where they were (tag dtrain:mount). Returns their ids;
    a volume in another zone is said and left."""
    ec2 = session.client("ec2")
    zones = {i.availability_zone for i in cluster.instances}
    done = []
    for v in dataset_volumes(session, cluster.name, status="available"):  # kept by `nodes down`
        tags = {t["Key"]: t["Value"] for t in v.get("Tags", [])}
        path = tags.get(MOUNT_TAG, "/data")
        if v["AvailabilityZone"] not in zones:
            say(f"[volume] {v['VolumeId']} (mounted at {path} before) is in {v['AvailabilityZone']}, the nodes in "
                f"{', '.join(sorted(zones))}: not attached (snapshot it and `dtrain volume create --from-snapshot`)")
            continue
        attach_everywhere(ec2, v["VolumeId"], cluster, timeout, poll)
        _run_script(nodes, "volume-mount.sh", ["ebs", nvme_device(v["VolumeId"]), path, FSTAB], ssh_opts,
                    f"mounting {v['VolumeId']} on {path}", say)
        say(f"[volume] {v['VolumeId']} mounted read-only at {path} on {len(nodes)} nodes (kept from before)")
        done.append(v["VolumeId"])
    return done
