"""EC2 nodes from nothing: one CloudFormation stack per cluster, and the hostfile of its nodes.

Data flows one way: flags -> NodesSpec -> preflight (read-only AWS calls; every bad input is
an error here, before anything is created) -> Resolved -> stack_template (pure dict) ->
create_stack -> wait_capacity -> capacity_decision (pure) -> hostfile. Everything the
cluster owns sits in the stack but its data: `dtrain volume create`'s volumes and the EFS file
system (Retain) carry the cluster's tag and outlive the stack; `nodes down` (delete_stack)
keeps them unless asked to delete them too.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from dtrain import contract, records, values
from dtrain.launch.errors import LaunchError
from dtrain.launch.infra import regions
from dtrain.launch.infra.instance_types import efa_cards, efa_supported, gpu_count, gpus_of, is_nitro

# The Deep Learning AMI (Ubuntu 22.04, NVIDIA driver, Docker and the NVIDIA container toolkit),
# through its public SSM parameter: CloudFormation resolves the newest id at create time.
DLAMI_PARAMETER = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
DLAMI_USER = "ubuntu"
# A CPU AMI with Docker: the ECS-optimized Amazon Linux 2023 (Docker preinstalled, user ec2-user).
CPU_AMI_PARAMETER = "/aws/service/ecs/optimized-ami/amazon-linux-2023/recommended/image_id"
AMI_ALIASES = {"gpu": (DLAMI_PARAMETER, DLAMI_USER), "cpu": (CPU_AMI_PARAMETER, "ec2-user")}
# The root disk, by default: the AMI's own snapshot, plus the largest GPU image three times over
# (unpacked, its compressed layers during a pull, and the next version beside it during an
# update), plus room for a dataset copy and logs. The largest GPU image (horovod-tensorflow,
# CUDA + cuDNN + NCCL + TF) is 15-20 GB unpacked.
LARGEST_IMAGE_GB = 20
ROOT_ROOM_GB = 100
SSH_USER_TAG = contract.SSH_USER_TAG  # on every instance: `launch --ec2-tag` reads the user from it
FIRST_BOOT = contract.NODE_SCRIPTS / "first-boot.sh"  # every node's user data
IDLE_DOWN = contract.NODE_SCRIPTS / "idle_down.py"  # --idle-down: in the user data, installed by first-boot.sh
IDLE_DOWN_MAX_MINUTES = 7 * 24 * 60
CLUSTER_TAG = "dtrain:cluster"  # on the stack and every instance: `dtrain launch --ec2-tag dtrain:cluster=C`
DATASET_TAG = ("dtrain:role", "dataset")  # on `volume create`'s volumes (root volumes have CLUSTER_TAG too)
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,62}$")
# Multi-EFA nodes (several network interfaces: no public IPv4 from AWS) outside a NAT'd subnet
# get an Elastic IP on each node's primary interface: their way in (ssh) and out (registry).
# Prices, USD (https://aws.amazon.com/vpc/pricing/): every public IPv4 address, an Elastic IP
# included, in use or idle, since 2024-02-01, the same in every region; a NAT gateway (the
# alternative way out) per hour and per GB it processes, in us-east-1 (other regions more).
PUBLIC_IPV4_USD_HOUR = 0.005
NAT_GATEWAY_USD_HOUR = 0.045
NAT_GATEWAY_USD_GB = 0.045
ADDRESS_QUOTA_CODE = "L-0263D0A3"  # Service Quotas, "EC2-VPC Elastic IPs" (5 per region by default)


def stack_name(cluster: str) -> str:
    return f"dtrain-{cluster}"


def clusters_dir() -> Path:
    return Path(os.environ.get("DTRAIN_HOME", "~/.dtrain")).expanduser() / "clusters"


def cluster_dir(cluster: str) -> Path:
    return clusters_dir() / cluster


@dataclass(frozen=True)
class NodesSpec:
    """What the user asked for (flags of `dtrain nodes up`)."""

    name: str
    count: int
    instance_type: str
    ssh_cidr: str | None = None  # who may ssh in, e.g. the caller's address/32 (None: decided by start)
    min_count: int | None = None  # None: all of count
    spot: bool = False
    subnet: str | None = None  # None: the default VPC's first subnet, unless new_vpc
    new_vpc: bool = False
    key_name: str | None = None
    efs: bool = False
    ami: str = "auto"  # gpu | cpu | ami-ID | /SSM/PARAMETER; auto: gpu on GPU types, else cpu
    efa_interfaces: int | None = None  # None: every EFA the type has (one per network card)
    ssh_group: str | None = None  # ssh from this security group instead of ssh_cidr (same VPC)
    ssh_user: str | None = None  # None: the AMI's user (ubuntu, ec2-user)
    root_size: int | None = None  # GiB; None: root_size_default
    s3_buckets: tuple[str, ...] = ()  # the nodes' role may read these (and write, with s3_write)
    s3_write: bool = False
    instance_profile: str | None = None  # an existing profile instead of the stack's; "none": no role
    lazy: bool = False  # lazy loading with SOCI on every node (first-boot.sh: DTRAIN_LAZY=1)
    idle_down: int | None = None  # minutes without a dtrain job before the nodes delete the stack (idle_down.py)

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise LaunchError(f"--name {self.name!r}: letters, digits and '-', starting with a letter (at most 63)")
        if self.count < 1:
            raise LaunchError(f"--count {self.count}: must be at least 1")
        if self.min_count is not None and not 1 <= self.min_count <= self.count:
            raise LaunchError(f"--min-count {self.min_count}: must be between 1 and --count ({self.count})")
        if self.efa_interfaces is not None and self.efa_interfaces < 1:
            raise LaunchError(f"--efa-interfaces {self.efa_interfaces}: must be at least 1 (default: all the type has)")
        if self.subnet and self.new_vpc:
            raise LaunchError("give --subnet or --new-vpc, not both")
        if self.ssh_cidr is not None:
            try:
                ipaddress.ip_network(self.ssh_cidr)
            except ValueError:
                raise LaunchError(f"--ssh-cidr {self.ssh_cidr!r}: not a CIDR (e.g. 203.0.113.7/32)") from None
        if not (self.ami in ("auto", *AMI_ALIASES) or re.fullmatch(r"ami-[0-9a-f]{8,17}", self.ami)
                or re.fullmatch(r"/[A-Za-z0-9_./-]+", self.ami)):
            raise LaunchError(f"--ami {self.ami!r}: expected gpu, cpu, an AMI id (ami-...) or an SSM "
                              "parameter path (/aws/service/...)")
        if self.root_size is not None and not 8 <= self.root_size <= 16384:
            raise LaunchError(f"--root-size {self.root_size}: GiB from 8 to 16384")
        for b in self.s3_buckets:
            if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", b):
                raise LaunchError(f"--s3-bucket {b!r}: not a bucket name (3-63 of a-z 0-9 . -)")
        if self.s3_write and not self.s3_buckets:
            raise LaunchError("--s3-write lets the nodes write to the --s3-bucket buckets, and none is given: "
                              "add --s3-bucket NAME (repeatable)")
        if self.instance_profile is not None and not re.fullmatch(r"[\w+=,.@-]{1,128}", self.instance_profile):
            raise LaunchError(f"--instance-profile {self.instance_profile!r}: not an instance profile name")
        if self.idle_down is not None and not 1 <= self.idle_down <= IDLE_DOWN_MAX_MINUTES:
            raise LaunchError(f"--idle-down {self.idle_down}: minutes from 1 to {IDLE_DOWN_MAX_MINUTES}")
        if self.idle_down is not None and self.instance_profile is not None:
            raise LaunchError(f"--idle-down lets the stack's own role delete its own stack; with --instance-profile "
                              f"{self.instance_profile} the nodes have no such role: drop one of the two")
        if self.instance_profile is not None and (self.s3_buckets or self.s3_write):
            raise LaunchError("--s3-bucket/--s3-write shape the stack's own role; with --instance-profile "
                              f"{self.instance_profile}, give that profile's role the bucket access instead")

    @property
    def minimum(self) -> int:
        return self.count if self.min_count is None else self.min_count


@dataclass(frozen=True)
class Resolved:
    """What preflight learnt from AWS, for the template."""

    efa: bool
    nitro: bool
    gpus: int  # per instance; slots in the hostfile (1 on CPU types)
    vpc_id: str | None  # None with new_vpc
    subnet_id: str | None
    availability_zone: str | None
    # The launch template's interfaces without Groups (network_interfaces); () = one, EFA if efa.
    interfaces: tuple[dict[str, Any], ...] = ()
    ami_id: str = "ami-00000000"  # what --ami resolved to
    root_device: str = "/dev/sda1"  # the AMI's RootDeviceName
    root_size: int = 200  # GiB
    ssh_user: str = DLAMI_USER
    address: str = "private"  # what the hostfile uses (start decides it: see decide_reach)
    ssh_rule: str = ""  # who may ssh in, in words (for messages)
    file_system: str | None = None  # the cluster's kept EFS (a name that comes back), or None
    addresses: int = 0  # Elastic IPs in the stack, one per node's primary interface (needs_addresses)
    warnings: tuple[str, ...] = ()  # one line each, said before the stack is made (gpu_ami_problem)
    # The zones still to try when this one has no capacity (zone, its subnet; None with --new-vpc),
    # in order; () when none or when the zone is pinned (zone_pin says why).
    other_zones: tuple[tuple[str, str | None], ...] = ()
    zone_pin: str = ""  # why the nodes cannot move to another zone ("--subnet S is in ...", the data's zone)


# --- preflight: read-only calls, every bad input an error before anything is created --------


def aws_error_text(e: Any) -> str:
    """'Code: Message' of a botocore ClientError, one line, without a missing part (AWS leaves
    Message out of some errors: it was printed as 'None')."""
    err = e.response.get("Error", {})
    code, message = err.get("Code") or "", " ".join(str(err.get("Message") or "").split())
    return ": ".join(p for p in (code, message) if p) or " ".join(str(e).split())


def _client_error(e: Any, what: str) -> LaunchError:
    return LaunchError(f"{what}: {aws_error_text(e)}")


def preflight(session: Any, spec: NodesSpec) -> Resolved:
    """Check the instance type, key pair, subnet / default VPC and that the stack is new."""
    from botocore.exceptions import ClientError

    ec2, cfn = session.client("ec2"), session.client("cloudformation")
    try:
        info = ec2.describe_instance_types(InstanceTypes=[spec.instance_type])["InstanceTypes"][0]
    except ClientError as e:
        if e.response["Error"].get("Code") == "InvalidInstanceType":
            raise LaunchError(f"--instance-type {spec.instance_type}: no such instance type in "
                              f"{ec2.meta.region_name} (see `aws ec2 describe-instance-types`)") from None
        raise _client_error(e, "DescribeInstanceTypes") from None
    # GPUs: the API's answer, else dtrain's snapshot of it (an endpoint without GpuInfo)
    gpus = gpus_of(info) or gpu_count(spec.instance_type) or 0
    if spec.key_name:
        try:
            ec2.describe_key_pairs(KeyNames=[spec.key_name])
        except ClientError as e:
            if e.response["Error"].get("Code") == "InvalidKeyPair.NotFound":
                raise LaunchError(f"--key-name {spec.key_name}: no such key pair in {ec2.meta.region_name} "
                                  "(create or import it: aws ec2 import-key-pair)") from None
            raise _client_error(e, "DescribeKeyPairs") from None
    offered = offered_zones(session, spec.instance_type)
    vpc_id = subnet_id = az = pinned = None
    others: tuple[tuple[str, str | None], ...] = ()
    if spec.subnet:
        try:
            sub = ec2.describe_subnets(SubnetIds=[spec.subnet])["Subnets"][0]
        except ClientError as e:
            if e.response["Error"].get("Code") == "InvalidSubnetID.NotFound":
                raise LaunchError(f"--subnet {spec.subnet}: no such subnet in {ec2.meta.region_name}") from None
            raise _client_error(e, "DescribeSubnets") from None
        if sub["AvailabilityZone"] not in offered:
            raise LaunchError(f"--subnet {spec.subnet}: {spec.instance_type} is not offered in its zone "
                              f"{sub['AvailabilityZone']}; it is in {', '.join(offered) or 'no zone of this region'}")
        vpc_id, subnet_id, az = sub["VpcId"], sub["SubnetId"], sub["AvailabilityZone"]
    elif not spec.new_vpc:
        vpcs = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
        if not vpcs:
            raise LaunchError(f"no default VPC in {ec2.meta.region_name}: pass --subnet SUBNET-ID or --new-vpc")
        subs = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpcs[0]["VpcId"]]},
                                             {"Name": "default-for-az", "Values": ["true"]}])["Subnets"]
        if not subs:
            raise LaunchError(f"default VPC {vpcs[0]['VpcId']} has no default subnet: pass --subnet SUBNET-ID")
        pinned = data_zone(session, spec.name)
        zone = pick_zone([s["AvailabilityZone"] for s in subs], offered, spec.instance_type, preferred=pinned)
        sub = next(s for s in subs if s["AvailabilityZone"] == zone)
        vpc_id, subnet_id, az = sub["VpcId"], sub["SubnetId"], sub["AvailabilityZone"]
        by_zone = {s["AvailabilityZone"]: s["SubnetId"] for s in subs}
        others = tuple((z, by_zone[z]) for z in zone_order(list(by_zone), offered) if z != zone)
    else:
        pinned = data_zone(session, spec.name)
        az = pick_zone(offered, offered, spec.instance_type, preferred=pinned)
        others = tuple((z, None) for z in zone_order(offered, offered) if z != az)
    if spec.subnet:
        pin = f"--subnet {spec.subnet} is in {az}"
    elif pinned == az:
        pin = (f"the cluster's dataset volume(s) {', '.join(v['VolumeId'] for v in dataset_volumes(session, spec.name))} "
               f"are in {az} (a volume attaches in its own zone only)")
    else:
        pin = ""
    warnings: list[str] = []
    ami_id, root_device, snapshot_gb, ami_user = resolve_ami(session, spec.ami, gpus=bool(gpus),
                                                             instance_type=spec.instance_type, warnings=warnings)
    root = spec.root_size or root_size_default(snapshot_gb)
    if root < snapshot_gb:
        raise LaunchError(f"--root-size {root}: the AMI {ami_id}'s snapshot is {snapshot_gb} GiB; "
                          f"give at least {snapshot_gb}")
    if spec.instance_profile not in (None, "none"):
        try:
            session.client("iam").get_instance_profile(InstanceProfileName=spec.instance_profile)
        except ClientError as e:
            if e.response["Error"].get("Code") == "NoSuchEntity":
                raise LaunchError(f"--instance-profile {spec.instance_profile}: no such instance profile "
                                  "(`aws iam list-instance-profiles`)") from None
            raise _client_error(e, "GetInstanceProfile") from None
    try:
        cfn.describe_stacks(StackName=stack_name(spec.name))
    except ClientError as e:
        if "does not exist" not in e.response["Error"].get("Message", ""):
            raise _client_error(e, "DescribeStacks") from None
    else:
        raise LaunchError(f"--name {spec.name}: cluster exists (stack {stack_name(spec.name)} in "
                          f"{session.region_name}); `dtrain nodes down --name {spec.name}"
                          f"{regions.region_arg(session.region_name)}` first, or pick another name")
    return Resolved(file_system=kept_file_system(session, spec.name) if spec.efs else None,
                    efa=efa_supported(info), nitro=is_nitro(info), gpus=gpus or 1, vpc_id=vpc_id,
                    subnet_id=subnet_id, availability_zone=az,
                    interfaces=tuple(network_interfaces(info, spec.efa_interfaces)),
                    ami_id=ami_id, root_device=root_device, root_size=root,
                    ssh_user=spec.ssh_user or ami_user, warnings=tuple(warnings),
                    other_zones=() if pin else others, zone_pin=pin)


def kept_file_system(session: Any, cluster: str) -> str | None:
    """The EFS file system an earlier cluster of this name left (tag dtrain:cluster=NAME), or None."""
    return next(iter(data_file_systems(session, cluster)), None)


def data_file_systems(session: Any, cluster: str) -> list[str]:
    """The cluster's EFS file systems (kept by `nodes down`), oldest first."""
    pages = session.client("efs").get_paginator("describe_file_systems").paginate()
    found = [(f.get("CreationTime", 0), f["FileSystemId"]) for p in pages for f in p["FileSystems"]
             if {"Key": CLUSTER_TAG, "Value": cluster} in f.get("Tags", [])
             and f.get("LifeCycleState") in ("available", "creating", None)]
    return [fid for _, fid in sorted(found, key=lambda x: str(x[0]))]


def offered_zones(session: Any, instance_type: str) -> list[str]:
    """The region's zones that offer the type (DescribeInstanceTypeOfferings), sorted."""
    from botocore.exceptions import ClientError

    try:
        pages = session.client("ec2").get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [instance_type]}])
        return sorted({o["Location"] for p in pages for o in p["InstanceTypeOfferings"]})
    except ClientError as e:
        raise _client_error(e, "DescribeInstanceTypeOfferings") from None


def pick_zone(candidates: Sequence[str], offered: Sequence[str], instance_type: str,
              preferred: str | None = None) -> str:
    """The zone for the nodes: preferred (where the cluster's data is) if a candidate that
    offers the type, else the first candidate that does; an error naming the zones that do."""
    usable = sorted(z for z in set(candidates) if z in set(offered))
    if not usable:
        raise LaunchError(f"--instance-type {instance_type}: offered in {', '.join(offered) or 'no zone'} of this "
                          "region, none of which has a default subnet here: pass --subnet SUBNET-ID in one of them")
    return preferred if preferred in usable else usable[0]


def zone_order(candidates: Sequence[str], offered: Sequence[str]) -> list[str]:
    """The candidate zones that offer the type, in the order `nodes up` tries them (pure)."""
    return sorted(z for z in set(candidates) if z in set(offered))


def dataset_volumes(session: Any, cluster: str, status: str | None = None) -> list[dict[str, Any]]:
    """The cluster's dataset volumes (tags dtrain:cluster=NAME, dtrain:role=dataset), by id;
    status: only those in that state (available: attached nowhere)."""
    filters = [{"Name": f"tag:{CLUSTER_TAG}", "Values": [cluster]},
               {"Name": f"tag:{DATASET_TAG[0]}", "Values": [DATASET_TAG[1]]}]
    if status:
        filters.append({"Name": "status", "Values": [status]})
    vols = session.client("ec2").describe_volumes(Filters=filters)["Volumes"]
    return sorted(vols, key=lambda v: v["VolumeId"])


def data_zone(session: Any, cluster: str) -> str | None:
    """The zone of the cluster's kept dataset volumes (a cluster of the same name comes back
    beside its data), or None."""
    from botocore.exceptions import ClientError

    try:
        vols = dataset_volumes(session, cluster)
    except ClientError:
        return None
    return min((v["AvailabilityZone"] for v in vols), default=None)


def root_size_default(snapshot_gb: int) -> int:
    """GiB: the AMI's snapshot + the largest image 3 times over + room, rounded up to 10."""
    return int(math.ceil((snapshot_gb + 3 * LARGEST_IMAGE_GB + ROOT_ROOM_GB) / 10) * 10)


def ami_user(image: dict[str, Any]) -> str:
    """The default ssh user of an AMI, from its name and description."""
    text = f"{image.get('Name', '')} {image.get('Description', '')}".lower()
    if "ubuntu" in text:
        return "ubuntu"
    if "debian" in text:
        return "admin"
    if any(k in text for k in ("amazon linux", "amzn", "al2023", "ecs-optimized", "ecs optimized")):
        return "ec2-user"
    return DLAMI_USER


# Words in an AMI's name or description that say it is made for GPUs (the NVIDIA driver and
# container toolkit): the Deep Learning AMIs, the ECS and EKS GPU-optimized AMIs, NVIDIA's own.
GPU_AMI_WORDS = ("gpu", "nvidia", "cuda", "deep learning", "dlami", "deeplearning")


def gpu_ami_problem(ami: str, image: dict[str, Any] | None, instance_type: str, gpus: bool) -> tuple[str, str] | None:
    """A CPU image on a GPU type (pure): ("refuse", line) for --ami cpu, ("warn", line) for an
    AMI whose name and description say nothing of GPUs; None when it fits."""
    if not gpus:
        return None
    if ami == "cpu":
        return ("refuse", f"--ami cpu on {instance_type}, a GPU type: the CPU AMI (ECS-optimized Amazon Linux) "
                          "has no NVIDIA driver, its GPUs would go unused; drop --ami (gpu is the default on GPU "
                          "types) or pick a CPU instance type")
    if ami in ("auto", "gpu") or image is None:
        return None
    text = f"{image.get('Name', '')} {image.get('Description', '')}".lower()
    if any(w in text for w in GPU_AMI_WORDS):
        return None
    return ("warn", f"[nodes] warning: --ami {ami} ({image.get('Name') or image.get('ImageId', '?')}) on "
                    f"{instance_type}, a GPU type: its name says nothing of a GPU image (NVIDIA driver, container "
                    "toolkit); the containers get no GPU unless it has them (--ami gpu: the Deep Learning AMI)")


def resolve_ami(session: Any, ami: str, *, gpus: bool, instance_type: str = "",
                warnings: list[str] | None = None) -> tuple[str, str, int, str]:
    """--ami -> (image id, root device name, root snapshot GiB, ssh user). gpu/cpu are the
    public SSM parameters in AMI_ALIASES; auto is gpu on types with GPUs, else cpu. With
    instance_type: a CPU image on a GPU type is refused (--ami cpu) or warned of (appended to
    warnings: gpu_ami_problem)."""
    from botocore.exceptions import ClientError

    problem = gpu_ami_problem(ami, None, instance_type, gpus) if instance_type else None
    if problem:  # --ami cpu: refused before anything is asked
        raise LaunchError(problem[1])
    alias = ("gpu" if gpus else "cpu") if ami == "auto" else ami
    parameter, user = AMI_ALIASES.get(alias, (alias if alias.startswith("/") else None, None))
    image_id = alias
    if parameter:
        try:
            image_id = session.client("ssm").get_parameter(Name=parameter)["Parameter"]["Value"]
        except ClientError as e:
            if e.response["Error"].get("Code") in ("ParameterNotFound", "ValidationException"):
                raise LaunchError(f"--ami {ami}: no SSM parameter {parameter} in {session.region_name}") from None
            raise _client_error(e, f"GetParameter {parameter}") from None
    try:
        images = session.client("ec2").describe_images(ImageIds=[image_id])["Images"]
    except ClientError as e:
        if e.response["Error"].get("Code", "").startswith("InvalidAMIID"):
            images = []
        else:
            raise _client_error(e, "DescribeImages") from None
    if not images:
        raise LaunchError(f"--ami {ami}: no image {image_id} in {session.region_name}")
    image = images[0]
    if image.get("Platform") == "windows" or image.get("RootDeviceType", "ebs") != "ebs":
        raise LaunchError(f"--ami {ami}: {image_id} is a {image.get('Platform') or image.get('RootDeviceType')} "
                          "image; dtrain nodes need a Linux AMI with an EBS root (Docker, ssh)")
    problem = gpu_ami_problem(ami, image, instance_type, gpus) if instance_type else None
    if problem and warnings is not None:
        warnings.append(problem[1])
    root = image.get("RootDeviceName") or "/dev/sda1"
    size = next((int(b["Ebs"].get("VolumeSize", 0)) for b in image.get("BlockDeviceMappings", [])
                 if b.get("DeviceName") == root and "Ebs" in b), 0)
    return image_id, root, size, user or ami_user(image)


# --- network interfaces: every EFA the type has ----------------------------------------------


def network_interfaces(info: dict[str, Any], limit: int | None = None) -> list[dict[str, Any]]:
    """One DescribeInstanceTypes entry -> the launch template's NetworkInterfaces (without
    Groups): one EFA per network card that has one (NetworkInfo.NetworkCards, at most
    EfaInfo.MaximumEfaInterfaces, at most limit), in AWS's layout for several cards
    (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html): card 0,
    device 0, an "efa" interface (ENA + EFA: the node's address); card i, device 1, an
    "efa-only" interface where the card offers it (no IP address taken from the subnet, IP
    traffic stays on card 0), else "efa". p4d.24xlarge: 4, p5.48xlarge: 32, g5.12xlarge: 1.
    Without EFA: one plain interface. An instance with more than one interface gets no
    public IPv4 address (see public_ip_error)."""
    cards = efa_cards(info)[:limit]
    if not cards:
        return [{"DeviceIndex": 0}]
    if len(cards) == 1:
        return [{"DeviceIndex": 0, "InterfaceType": "efa"}]
    return [{"NetworkCardIndex": 0, "DeviceIndex": 0, "InterfaceType": "efa"}] + [
        {"NetworkCardIndex": card, "DeviceIndex": 1, "InterfaceType": "efa-only" if only else "efa"}
        for card, only in cards[1:]]


def public_ip_error(spec: NodesSpec, interfaces: int, address: str = "private",
                    addresses: bool = False) -> str | None:
    """Why this cluster cannot work as asked, or None. AWS gives no public IPv4 address to an
    instance launched with more than one network interface (AssociatePublicIpAddress is then
    refused, and a subnet's auto-assign does not apply): such nodes have no public address to
    ssh to, and in a subnet whose only way out is an internet gateway (the default VPC's, the
    --new-vpc one) no way to a registry. addresses: the stack gives each node an Elastic IP
    (see needs_addresses), which is both. A subnet routed through a NAT gateway works from
    inside the VPC."""
    if interfaces <= 1 or addresses:
        return None
    what = f"{spec.instance_type} gets {interfaces} network interfaces (one per EFA)"
    fewer = f"--efa-interfaces 1 (one EFA and a public address: about 1/{interfaces} of the inter-node bandwidth)"
    if address == "public":
        return (f"{what}, and AWS gives no public IPv4 address to an instance with more than one, so they "
                f"cannot be reached at public addresses: run dtrain from inside the VPC (--address private; "
                f"from a bastion: --ssh-opt ProxyJump=HOST --ssh-cidr ITS-ADDRESS/32), or {fewer}")
    if not spec.subnet:
        where = "the new VPC" if spec.new_vpc else "the default VPC"
        return (f"{what}, so no public IPv4 address (AWS assigns none to an instance with more than one): "
                f"in {where} (internet gateway only) the nodes could not reach a registry; pass --subnet "
                f"SUBNET-ID of a subnet that reaches the internet through a NAT gateway, or {fewer}")
    return None


def subnet_default_route(session: Any, subnet_id: str, vpc_id: str | None) -> str | None:
    """The target of a subnet's 0.0.0.0/0 route (its route table, else the VPC's main one):
    igw-..., nat-..., another target's id, or None (no such route). Read-only."""
    from botocore.exceptions import ClientError

    ec2 = session.client("ec2")
    try:
        rts = ec2.describe_route_tables(
            Filters=[{"Name": "association.subnet-id", "Values": [subnet_id]}])["RouteTables"]
        if not rts and vpc_id:
            rts = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [vpc_id]},
                                                     {"Name": "association.main", "Values": ["true"]}])["RouteTables"]
    except ClientError:
        return None
    for r in (rts[0].get("Routes", []) if rts else []):
        if r.get("DestinationCidrBlock") == "0.0.0.0/0":
            return next((r[k] for k in ("NatGatewayId", "GatewayId", "TransitGatewayId", "InstanceId",
                                        "NetworkInterfaceId", "VpcPeeringConnectionId") if r.get(k)), "other")
    return None


def needs_addresses(spec: NodesSpec, interfaces: int, route: str | None) -> bool:
    """Whether each node gets an Elastic IP on its primary interface (pure): nodes with more
    than one network interface (no public IPv4 from AWS) in a subnet whose way out is an
    internet gateway (the default VPC's, the --new-vpc one, a --subnet routed to igw-...).
    The address is their way in (ssh from outside the VPC) and out (the registry); behind a
    NAT gateway (route nat-...) they have a way out already.

    Why not one address on node 1 as an ssh jump host and a NAT gateway for the rest: a NAT
    gateway costs NAT_GATEWAY_USD_HOUR plus NAT_GATEWAY_USD_GB of every image pulled through
    it (4 nodes x 20 GB: $3.60 a pull) and its own address, against PUBLIC_IPV4_USD_HOUR a
    node; and it needs a second (private) subnet and route table in any VPC, the default one
    included, where Elastic IPs need none."""
    if interfaces <= 1:
        return False
    return not spec.subnet or (route or "").startswith("igw-")


def addresses_line(count: int) -> str:
    """What `nodes up` says of the way in and out it chose, with the cost (pure)."""
    return (f"[nodes] way in and out: an Elastic IP on each node's primary interface, in the stack "
            f"({count} x ${PUBLIC_IPV4_USD_HOUR}/h = ${count * PUBLIC_IPV4_USD_HOUR:.3f}/h; a NAT gateway "
            f"instead: ${NAT_GATEWAY_USD_HOUR}/h + ${NAT_GATEWAY_USD_GB}/GB pulled)")


def address_quota(session: Any) -> tuple[int, int]:
    """(Elastic IPs allocated in the region, the most allowed: vpc-max-elastic-ips). Read-only."""
    from botocore.exceptions import ClientError

    ec2 = session.client("ec2")
    try:
        used = len(ec2.describe_addresses()["Addresses"])
        attrs = ec2.describe_account_attributes(AttributeNames=["vpc-max-elastic-ips"])["AccountAttributes"]
    except ClientError as e:
        raise _client_error(e, "DescribeAddresses") from None
    most = next((int(v["AttributeValue"]) for a in attrs for v in a.get("AttributeValues", [])), 5)
    return used, most


def address_quota_error(spec: NodesSpec, needed: int, used: int, most: int) -> str | None:
    """Why the region cannot give the nodes their Elastic IPs, or None (pure)."""
    if used + needed <= most:
        return None
    return (f"--count {spec.count}: {spec.instance_type}'s nodes each need an Elastic IP (several network "
            f"interfaces, no public IPv4 from AWS), and the region allows {most} with {used} allocated: "
            f"raise the quota EC2-VPC Elastic IPs ({ADDRESS_QUOTA_CODE}, Service Quotas), lower --count, "
            f"give --subnet of a subnet behind a NAT gateway (from inside its VPC), or --efa-interfaces 1")


# --- the template: a pure function of the spec and what preflight found ---------------------


def _new_vpc_resources(zone: str | None) -> dict[str, Any]:
    """A VPC with one public subnet in one zone that offers the type (a placement group is one zone)."""
    tag = [{"Key": "Name", "Value": {"Ref": "AWS::StackName"}}]
    return {
        "Vpc": {"Type": "AWS::EC2::VPC", "Properties": {
            "CidrBlock": "10.0.0.0/16", "EnableDnsSupport": True, "EnableDnsHostnames": True, "Tags": tag}},
        "InternetGateway": {"Type": "AWS::EC2::InternetGateway", "Properties": {"Tags": tag}},
        "GatewayAttachment": {"Type": "AWS::EC2::VPCGatewayAttachment", "Properties": {
            "VpcId": {"Ref": "Vpc"}, "InternetGatewayId": {"Ref": "InternetGateway"}}},
        "Subnet": {"Type": "AWS::EC2::Subnet", "Properties": {
            "VpcId": {"Ref": "Vpc"}, "CidrBlock": "10.0.0.0/20", "MapPublicIpOnLaunch": True,
            "AvailabilityZone": {"Ref": "Zone"} if zone else {"Fn::Select": [0, {"Fn::GetAZs": ""}]}, "Tags": tag}},
        "RouteTable": {"Type": "AWS::EC2::RouteTable", "Properties": {"VpcId": {"Ref": "Vpc"}, "Tags": tag}},
        "DefaultRoute": {"Type": "AWS::EC2::Route", "DependsOn": "GatewayAttachment", "Properties": {
            "RouteTableId": {"Ref": "RouteTable"}, "DestinationCidrBlock": "0.0.0.0/0",
            "GatewayId": {"Ref": "InternetGateway"}}},
        "SubnetRoutes": {"Type": "AWS::EC2::SubnetRouteTableAssociation", "Properties": {
            "SubnetId": {"Ref": "Subnet"}, "RouteTableId": {"Ref": "RouteTable"}}},
    }


def stack_template(spec: NodesSpec, res: Resolved) -> dict[str, Any]:
    """The CloudFormation template of one cluster (validated by cfn-lint in the tests)."""
    vpc = {"Ref": "Vpc"} if spec.new_vpc else res.vpc_id
    subnet = {"Ref": "Subnet"} if spec.new_vpc else res.subnet_id
    sg = {"Fn::GetAtt": ["SecurityGroup", "GroupId"]}
    tags = [{"Key": CLUSTER_TAG, "Value": spec.name}, {"Key": "Name", "Value": stack_name(spec.name)}]
    instance_tags = [*tags, {"Key": SSH_USER_TAG, "Value": res.ssh_user}]
    layout = res.interfaces or ({"DeviceIndex": 0, **({"InterfaceType": "efa"} if res.efa else {})},)
    # Every EFA interface needs the group (its self-referencing rules carry the EFA traffic).
    interfaces = [{**i, "Groups": [sg], "DeleteOnTermination": True} for i in layout]
    if spec.new_vpc and len(interfaces) == 1:  # AWS refuses it with more than one interface
        interfaces[0]["AssociatePublicIpAddress"] = True
    data: dict[str, Any] = {
        "ImageId": {"Ref": "AmiId"},
        "InstanceType": spec.instance_type,
        # IMDSv2 only; hop limit 2 so a container (one hop more) can still reach it.
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 2},
        "NetworkInterfaces": interfaces,
        # The root volume (from the AMI's snapshot) encrypted with the account's default EBS key.
        "BlockDeviceMappings": [{"DeviceName": res.root_device, "Ebs": {
            "Encrypted": True, "VolumeType": "gp3", "VolumeSize": res.root_size, "DeleteOnTermination": True}}],
        "TagSpecifications": [{"ResourceType": "instance", "Tags": instance_tags},
                              {"ResourceType": "volume", "Tags": tags}],
    }
    profile = _instance_profile(spec)
    if profile:
        data["IamInstanceProfile"] = profile
    data["UserData"] = user_data(spec, res)  # pigz for faster cold pulls; the EFS at /efs
    if spec.key_name:
        data["KeyName"] = spec.key_name
    if spec.spot:
        # One-time requests that terminate on interruption: what an Auto Scaling group accepts.
        data["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {
            "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
    resources: dict[str, Any] = {
        **(_new_vpc_resources(res.availability_zone) if spec.new_vpc else {}),
        **(_role_resources(spec, tags) if profile and spec.instance_profile is None else {}),
        "SecurityGroup": {"Type": "AWS::EC2::SecurityGroup", "Properties": {
            "GroupDescription": f"dtrain cluster {spec.name}: all traffic among members, ssh from the caller",
            "VpcId": vpc,
            "SecurityGroupIngress": [{"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
                                      **({"SourceSecurityGroupId": spec.ssh_group} if spec.ssh_group
                                         else {"CidrIp": {"Ref": "SshCidr"}}),
                                      "Description": "ssh from the caller"}],
            "SecurityGroupEgress": [{"IpProtocol": "-1", "CidrIp": "0.0.0.0/0", "Description": "all out"}],
            "Tags": tags}},
        "SelfIngress": {"Type": "AWS::EC2::SecurityGroupIngress", "Properties": {
            "GroupId": sg, "SourceSecurityGroupId": sg, "IpProtocol": "-1",
            "Description": "all traffic among members (MPI, NCCL, sshd on 2022, NFS)"}},
        # EFA needs a self-referencing outbound rule as well as the inbound one.
        "SelfEgress": {"Type": "AWS::EC2::SecurityGroupEgress", "Properties": {
            "GroupId": sg, "DestinationSecurityGroupId": sg, "IpProtocol": "-1",
            "Description": "all traffic to members (EFA requires it)"}},
        "PlacementGroup": {"Type": "AWS::EC2::PlacementGroup", "Properties": {"Strategy": "cluster"}},
        "LaunchTemplate": {"Type": "AWS::EC2::LaunchTemplate", "Properties": {
            "LaunchTemplateName": {"Ref": "AWS::StackName"}, "LaunchTemplateData": data}},
        "Nodes": {"Type": "AWS::AutoScaling::AutoScalingGroup", "Properties": {
            # MinSize is --min-count: below it CloudFormation fails the group and rolls back.
            "MinSize": str(spec.minimum), "MaxSize": str(spec.count), "DesiredCapacity": str(spec.count),
            "LaunchTemplate": {"LaunchTemplateId": {"Ref": "LaunchTemplate"},
                               "Version": {"Fn::GetAtt": ["LaunchTemplate", "LatestVersionNumber"]}},
            "VPCZoneIdentifier": [subnet],
            "PlacementGroup": {"Ref": "PlacementGroup"},
            "Tags": [{**t, "PropagateAtLaunch": True} for t in instance_tags]}},
    }
    outputs: dict[str, Any] = {
        "NodesGroup": {"Value": {"Ref": "Nodes"}},
        "SecurityGroupId": {"Value": sg},
        "SubnetId": {"Value": subnet},
    }
    if spec.efs:
        # The file system outlives the stack (Retain): `nodes down` keeps it unless --delete-data,
        # and a cluster of the same name mounts it again (preflight found it: res.file_system).
        fs: Any = res.file_system or {"Ref": "FileSystem"}
        if not res.file_system:
            resources["FileSystem"] = {"Type": "AWS::EFS::FileSystem", "DeletionPolicy": "Retain",
                                       "UpdateReplacePolicy": "Retain", "Properties": {
                                           "Encrypted": True, "PerformanceMode": "generalPurpose",
                                           "FileSystemTags": tags}}
        resources["MountTarget"] = {"Type": "AWS::EFS::MountTarget", "Properties": {
            "FileSystemId": fs, "SubnetId": subnet, "SecurityGroups": [sg]}}
        outputs["FileSystemId"] = {"Value": fs}
        resources["Nodes"]["DependsOn"] = "MountTarget"  # booting nodes mount it (user_data)
    if res.addresses:
        # One Elastic IP per node, associated by `nodes up` once the instances run (an Auto
        # Scaling group's instances are not known here). The group depends on them, so deleting
        # the stack (nodes down, a failed up) terminates the instances first, which disassociates
        # the addresses, and then releases them.
        names = [f"Address{k}" for k in range(1, res.addresses + 1)]
        for n in names:
            resources[n] = {"Type": "AWS::EC2::EIP", "Properties": {"Domain": "vpc", "Tags": tags},
                            **({"DependsOn": "GatewayAttachment"} if spec.new_vpc else {})}
        resources["Nodes"]["DependsOn"] = [*([resources["Nodes"]["DependsOn"]] if spec.efs else []), *names]
        outputs["Addresses"] = {"Value": {"Fn::Join": [",", [{"Fn::GetAtt": [n, "AllocationId"]} for n in names]]}}
    if spec.new_vpc:
        # The nodes after the VPC's way out (they pull at boot), so deleting the stack removes them
        # first: CloudFormation deletes in reverse dependency order, and detaching the internet
        # gateway or deleting the subnet while an instance still holds a public address or an
        # interface there fails (DependencyViolation: "has some mapped public address(es)").
        after = resources["Nodes"].get("DependsOn", [])
        resources["Nodes"]["DependsOn"] = [*([after] if isinstance(after, str) else after),
                                           "GatewayAttachment", "DefaultRoute", "SubnetRoutes"]
    return {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Description": f"dtrain cluster {spec.name}: {spec.count} x {spec.instance_type} (generated by dtrain)",
        "Parameters": {
            "AmiId": {"Type": "AWS::EC2::Image::Id", "Default": res.ami_id,
                      "Description": f"the nodes' AMI (--ami {spec.ami})"},
            **({"Zone": {"Type": "AWS::EC2::AvailabilityZone::Name", "Default": res.availability_zone,
                         "Description": "a zone that offers the instance type"}}
               if spec.new_vpc and res.availability_zone else {}),
            **({} if spec.ssh_group else {"SshCidr": {
                "Type": "String", "Default": spec.ssh_cidr or "0.0.0.0/32", "Description": "who may ssh to the nodes"}}),
        },
        "Resources": resources,
        "Outputs": outputs,
    }


def user_data(spec: NodesSpec, res: Resolved) -> dict[str, Any]:
    """launch/node/first-boot.sh; with --efs, the file system's id and the region set above
    it (AWS values, not user text) so it mounts the EFS at /efs at every boot; with --lazy,
    DTRAIN_LAZY=1 (lazy loading with SOCI); with Elastic IPs, DTRAIN_WAIT_ADDRESS=1 (no way
    out until `nodes up` associates them); with --idle-down, DTRAIN_IDLE_DOWN_S (seconds), the
    stack's name and region, and launch/node/idle_down.py (gzip, base64) for first-boot.sh to
    install as a service."""
    script = FIRST_BOOT.read_text()
    switches = ("DTRAIN_LAZY=1\n" if spec.lazy else "") + ("DTRAIN_WAIT_ADDRESS=1\n" if res.addresses else "")
    if spec.idle_down:
        switches += (f"DTRAIN_IDLE_DOWN_S={spec.idle_down * 60}\n"
                     f"DTRAIN_IDLE_PROGRAM={idle_program()}\n")
    if not spec.efs and not switches:
        return {"Fn::Base64": script}
    shebang, rest = script.split("\n", 1)
    head = f"{shebang}\n# set by dtrain nodes up (CloudFormation)\n" + switches
    if not spec.efs and not spec.idle_down:
        return {"Fn::Base64": head + rest}
    fs: Any = res.file_system or {"Ref": "FileSystem"}
    region = {"Ref": "AWS::Region"}
    pieces: list[tuple[Any, bool]] = [(head, False)]  # (part, a value: never joined to its neighbours)
    if spec.efs:
        pieces += [("DTRAIN_EFS_ID=", False), (fs, True), ("\nDTRAIN_EFS_REGION=", False), (region, True),
                   ("\n", False)]
    if spec.idle_down:
        pieces += [("DTRAIN_STACK=", False), ({"Ref": "AWS::StackName"}, True), ("\nDTRAIN_REGION=", False),
                   (region, True), ("\n", False)]
    parts: list[Any] = []
    joinable = False
    for part, value in pieces:  # adjacent text as one string
        if joinable and not value:
            parts[-1] += part
        else:
            parts.append(part)
        joinable = not value
    return {"Fn::Base64": {"Fn::Join": ["", [*parts, rest]]}}


def idle_down_line(spec: NodesSpec) -> str:
    """What `nodes up --idle-down` says before the stack is made (pure)."""
    return (f"[nodes] idle-down: the nodes delete stack {stack_name(spec.name)} once no dtrain job has run for "
            f"{spec.idle_down} min (the whole cluster goes; its data stays; their role may delete that stack "
            "and nothing else)")


def idle_program() -> str:
    """launch/node/idle_down.py as one line: gzip, then base64 (user data holds 16 KiB)."""
    import base64
    import gzip

    return base64.b64encode(gzip.compress(IDLE_DOWN.read_bytes(), mtime=0)).decode()


# What CloudFormation calls, with the caller's rights, to delete a cluster's stack: per resource
# type of stack_template (the Auto Scaling group, launch template, security group and its rules,
# placement group, Elastic IPs, EFS mount target, --new-vpc's network, the role and profile).
STACK_DELETION_ACTIONS = (
    "autoscaling:DeleteAutoScalingGroup", "autoscaling:UpdateAutoScalingGroup",
    "autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeScalingActivities",
    "ec2:DeleteLaunchTemplate", "ec2:DescribeLaunchTemplates", "ec2:DescribeLaunchTemplateVersions",
    "ec2:DeleteSecurityGroup", "ec2:RevokeSecurityGroupIngress", "ec2:RevokeSecurityGroupEgress",
    "ec2:DescribeSecurityGroups", "ec2:DescribeSecurityGroupRules",
    "ec2:DeletePlacementGroup", "ec2:DescribePlacementGroups",
    "ec2:ReleaseAddress", "ec2:DisassociateAddress", "ec2:DescribeAddresses",
    "ec2:DescribeInstances", "ec2:DescribeNetworkInterfaces",
    "elasticfilesystem:DeleteMountTarget", "elasticfilesystem:DescribeMountTargets",
    "ec2:DeleteVpc", "ec2:DeleteSubnet", "ec2:DeleteInternetGateway", "ec2:DetachInternetGateway",
    "ec2:DeleteRoute", "ec2:DeleteRouteTable", "ec2:DisassociateRouteTable", "ec2:DescribeVpcs",
    "ec2:DescribeSubnets", "ec2:DescribeInternetGateways", "ec2:DescribeRouteTables",
)
ROLE_DELETION_ACTIONS = (
    "iam:RemoveRoleFromInstanceProfile", "iam:DeleteInstanceProfile", "iam:GetInstanceProfile",
    "iam:DeleteRole", "iam:DeleteRolePolicy", "iam:DetachRolePolicy", "iam:GetRole",
    "iam:ListRolePolicies", "iam:ListAttachedRolePolicies", "iam:ListInstanceProfilesForRole",
)
VIA_CLOUDFORMATION = {"ForAnyValue:StringEquals": {"aws:CalledVia": ["cloudformation.amazonaws.com"]}}


def role_path(spec: NodesSpec) -> str:
    """The IAM path of the stack's role and instance profile (--idle-down: its rights name it)."""
    return f"/dtrain/{spec.name}/"


def idle_down_policy(spec: NodesSpec) -> dict[str, Any]:
    """The nodes' rights for --idle-down: DeleteStack on their own stack, and nothing else
    directly; what deleting it needs only through CloudFormation (aws:CalledVia), the IAM
    part only on the stack's own role and profile (their path). CloudFormation acts for the
    node on no other stack, since the node may start no operation on any other."""
    own = "arn:${AWS::Partition}:iam::${AWS::AccountId}:"
    return {"PolicyName": "dtrain-idle-down", "PolicyDocument": {"Version": "2012-10-17", "Statement": [
        {"Sid": "DeleteOwnStack", "Effect": "Allow", "Action": "cloudformation:DeleteStack",
         "Resource": {"Fn::Sub": "arn:${AWS::Partition}:cloudformation:${AWS::Region}:${AWS::AccountId}:"
                                 "stack/${AWS::StackName}/*"}},
        {"Sid": "StackResourcesThroughCloudFormation", "Effect": "Allow", "Action": list(STACK_DELETION_ACTIONS),
         "Resource": "*", "Condition": VIA_CLOUDFORMATION},
        {"Sid": "OwnRoleThroughCloudFormation", "Effect": "Allow", "Action": list(ROLE_DELETION_ACTIONS),
         "Resource": [{"Fn::Sub": f"{own}role{role_path(spec)}*"},
                      {"Fn::Sub": f"{own}instance-profile{role_path(spec)}*"}],
         "Condition": VIA_CLOUDFORMATION},
    ]}}


def _instance_profile(spec: NodesSpec) -> dict[str, Any] | None:
    """The launch template's IamInstanceProfile: the stack's own (the default), an existing
    one (--instance-profile NAME), or none (--instance-profile none)."""
    if spec.instance_profile == "none":
        return None
    if spec.instance_profile:
        return {"Name": spec.instance_profile}
    return {"Arn": {"Fn::GetAtt": ["InstanceProfile", "Arn"]}}


def _role_resources(spec: NodesSpec, tags: list[dict[str, str]]) -> dict[str, Any]:
    """The nodes' role: pull from ECR (the AWS managed read-only policy) and read (with
    --s3-write: also write) the buckets named by --s3-bucket."""
    policies = []
    if spec.s3_buckets:
        arns = [{"Fn::Sub": f"arn:${{AWS::Partition}}:s3:::{b}"} for b in spec.s3_buckets]
        objects = [{"Fn::Sub": f"arn:${{AWS::Partition}}:s3:::{b}/*"} for b in spec.s3_buckets]
        actions = ["s3:GetObject", *(["s3:PutObject", "s3:DeleteObject"] if spec.s3_write else [])]
        policies.append({"PolicyName": "dtrain-s3", "PolicyDocument": {"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": ["s3:ListBucket", "s3:GetBucketLocation"], "Resource": arns},
            {"Effect": "Allow", "Action": actions, "Resource": objects}]}})
    if spec.idle_down:
        policies.append(idle_down_policy(spec))
    path = {"Path": role_path(spec)} if spec.idle_down else {}
    return {
        "Role": {"Type": "AWS::IAM::Role", "Properties": {
            **path,
            "AssumeRolePolicyDocument": {"Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]},
            "ManagedPolicyArns": [{"Fn::Sub": "arn:${AWS::Partition}:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly"}],
            **({"Policies": policies} if policies else {}),
            "Tags": tags}},
        "InstanceProfile": {"Type": "AWS::IAM::InstanceProfile", "Properties": {**path, "Roles": [{"Ref": "Role"}]}},
    }


# --- create, wait, decide, delete -----------------------------------------------------------


@dataclass(frozen=True)
class Instance:
    id: str
    private_ip: str
    public_ip: str | None
    availability_zone: str
    instance_type: str


@dataclass(frozen=True)
class Cluster:
    """What `nodes up` leaves in ~/.dtrain/clusters/NAME/cluster.json (read by volume, launch)."""

    name: str
    region: str
    stack: str
    instance_type: str
    nitro: bool
    slots: int
    user: str
    identity: str | None
    instances: tuple[Instance, ...]
    security_group: str | None = None
    file_system: str | None = None
    ssh_opts: tuple[str, ...] = ()  # `nodes up --ssh-opt` (a ProxyJump): launch/doctor/volume --cluster reuse them

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Cluster":
        d = json.loads(text)
        d["instances"] = tuple(Instance(**i) for i in d["instances"])
        d["ssh_opts"] = tuple(d.get("ssh_opts", ()))
        d.setdefault("region", "")  # a record of an older dtrain: the default region
        return cls(**d)


def create_stack(session: Any, spec: NodesSpec, template: dict[str, Any]) -> str:
    """Start the stack (tagged with the cluster, deleted by CloudFormation if creation fails)."""
    from botocore.exceptions import ClientError

    regions.remember(session.region_name)  # `nodes list` looks there from now on, kept stacks included
    try:
        return session.client("cloudformation").create_stack(
            StackName=stack_name(spec.name), TemplateBody=json.dumps(template),
            Tags=[{"Key": CLUSTER_TAG, "Value": spec.name}], OnFailure="DELETE",
            Capabilities=["CAPABILITY_IAM"])["StackId"]
    except ClientError as e:
        raise _client_error(e, f"CreateStack {stack_name(spec.name)}") from None


def stack_status(session: Any, name: str) -> tuple[str, dict[str, str]]:
    """(StackStatus, outputs) of a cluster's stack."""
    st = session.client("cloudformation").describe_stacks(StackName=stack_name(name))["Stacks"][0]
    return st["StackStatus"], {o["OutputKey"]: o["OutputValue"] for o in st.get("Outputs", [])}


def running_instances(session: Any, name: str) -> list[Instance]:
    """The cluster's running instances (tag CLUSTER_TAG=name), in private-IP order."""
    pages = session.client("ec2").get_paginator("describe_instances").paginate(Filters=[
        {"Name": f"tag:{CLUSTER_TAG}", "Values": [name]},
        {"Name": "instance-state-name", "Values": ["running"]}])
    found = [Instance(id=i["InstanceId"], private_ip=i["PrivateIpAddress"], public_ip=i.get("PublicIpAddress"),
                      availability_zone=i["Placement"]["AvailabilityZone"], instance_type=i["InstanceType"])
             for p in pages for r in p["Reservations"] for i in r["Instances"] if i.get("PrivateIpAddress")]
    return sorted(found, key=lambda i: ipaddress.ip_address(i.private_ip))


def capacity_decision(count: int, minimum: int, up: int) -> str:
    """'all', 'partial' (at least minimum: go on with what started) or 'rollback'."""
    if up >= count:
        return "all"
    return "partial" if up >= minimum else "rollback"


def wait_capacity(session: Any, spec: NodesSpec, *, timeout: float = 900, poll: float = 10,
                  say: Callable[[str], None] = print) -> list[Instance]:
    """Wait for the stack, then for count running instances or the timeout; what is running.
    Returns early (what runs) when the stack failed or is gone, or when the group says the zone
    has no capacity (capacity_failure) while fewer than --min-count run."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    while True:
        status = stack_state(session, spec.name)
        if status == "CREATE_COMPLETE":
            break
        if status is None or not status.endswith("IN_PROGRESS"):
            return []  # CREATE_FAILED / ROLLBACK / DELETE (OnFailure=DELETE): no capacity to speak of
        if time.monotonic() > deadline:
            break
        up = running_instances(session, spec.name)
        if len(up) < spec.minimum and capacity_failure(session, spec.name):
            return up
        say(f"[nodes] stack {status} ({time.monotonic() - t0:.0f}s of at most {timeout:.0f}s)")
        time.sleep(poll)
    while True:
        up = running_instances(session, spec.name)
        if len(up) >= spec.count or time.monotonic() > deadline:
            return up
        if len(up) < spec.minimum and capacity_failure(session, spec.name):
            return up
        say(f"[nodes] {len(up)}/{spec.count} instances running ({time.monotonic() - t0:.0f}s of at most "
            f"{timeout:.0f}s)")
        time.sleep(poll)


# What EC2 and Auto Scaling say when a zone has no capacity for the type: RunInstances' error
# codes, and the words of a failed scaling activity or of CloudFormation's "Group did not
# stabilize" ("We currently do not have sufficient p4d.24xlarge capacity in the Availability
# Zone you requested (us-east-1a)", "There is no Spot capacity available that matches your request").
CAPACITY_WORDS = re.compile(r"InsufficientInstanceCapacity|InsufficientCapacity|InsufficientHostCapacity|"
                            r"do not have sufficient [\w.-]+ capacity|no Spot capacity available|"
                            r"capacity-not-available|MaxSpotInstanceCountExceeded", re.IGNORECASE)


def is_capacity_error(text: str) -> bool:
    """Whether an AWS message says the zone has no capacity for the type (pure)."""
    return bool(CAPACITY_WORDS.search(text or ""))


def nodes_group(session: Any, name: str) -> str | None:
    """The stack's Auto Scaling group (its physical id), or None before it is made or once gone."""
    from botocore.exceptions import ClientError

    try:
        res = session.client("cloudformation").describe_stack_resources(StackName=stack_name(name))["StackResources"]
    except ClientError:
        return None
    return next((r["PhysicalResourceId"] for r in res
                 if r.get("LogicalResourceId") == "Nodes" and r.get("PhysicalResourceId")), None)


def failed_activities(session: Any, name: str) -> list[str]:
    """The messages of the group's failed launches (DescribeScalingActivities), newest first."""
    from botocore.exceptions import ClientError

    group = nodes_group(session, name)
    if group is None:
        return []
    try:
        acts = session.client("autoscaling").describe_scaling_activities(
            AutoScalingGroupName=group, MaxRecords=20)["Activities"]
    except ClientError:
        return []
    return [" ".join(str(a.get("StatusMessage") or a.get("Description") or "").split())
            for a in acts if a.get("StatusCode") in ("Failed", "Cancelled")]


def stack_failure(session: Any, name: str) -> str:
    """Why the cluster's last stack failed (its first CREATE_FAILED event with a reason), found
    by id (ListStacks) so a stack CloudFormation deleted after the failure is read too; "" if none."""
    from botocore.exceptions import ClientError

    cfn = session.client("cloudformation")
    try:
        found = [st for p in cfn.get_paginator("list_stacks").paginate() for st in p["StackSummaries"]
                 if st["StackName"] == stack_name(name)]
        if not found:
            return ""
        newest = max(found, key=lambda st: str(st.get("CreationTime", "")))["StackId"]
        events = cfn.describe_stack_events(StackName=newest)["StackEvents"]
    except ClientError:
        return ""
    reasons = [" ".join(str(e["ResourceStatusReason"]).split()) for e in events
               if str(e.get("ResourceStatus", "")).endswith("FAILED") and e.get("ResourceStatusReason")
               and "cancelled" not in str(e["ResourceStatusReason"]).lower()]
    return reasons[-1] if reasons else ""


def capacity_failure(session: Any, name: str) -> str:
    """The group's message that its zone has no capacity for the type, or "" (read-only)."""
    return next((m for m in failed_activities(session, name) if is_capacity_error(m)), "")


def shortfall(session: Any, name: str) -> str:
    """Why fewer than --min-count instances run: a capacity message (scaling activity, stack
    event), else the stack's failure, else ""."""
    found = capacity_failure(session, name)
    return found or stack_failure(session, name)


def next_zone(res: Resolved, reason: str) -> tuple[str, str | None] | None:
    """The zone (and subnet) to try after res's zone gave too few instances, or None: the zone is
    pinned, none is left, or the failure is not one of capacity (pure). reason "" (instances that
    did not come up by the timeout, the stack standing) counts as capacity."""
    if res.zone_pin or not res.other_zones:
        return None
    if reason and not is_capacity_error(reason):
        return None
    return res.other_zones[0]


def move_line(spec: NodesSpec, zone: str | None, started: int, reason: str, to: str) -> str:
    """What `nodes up` says when it leaves a zone without capacity for the next one (pure)."""
    why = reason or f"not running after the wait (--min-count {spec.minimum})"
    return (f"[nodes] no capacity in {zone} for {spec.count} x {spec.instance_type}{' (spot)' if spec.spot else ''} "
            f"({started} started: {why}): deleting stack {stack_name(spec.name)} there (nothing of it stays in "
            f"{zone}), then trying {to}")


def spot_price_line(spec: NodesSpec, zone: str, price: Any) -> str:
    """The spot price in the zone `nodes up` moved to (a pricing.Price), said as the gate says it (pure)."""
    if price.usd is None:
        return f"[price] {price.missing} in {zone}; the on-demand price shown before stays its ceiling"
    return (f"[price] {spec.count} x {spec.instance_type} spot in {zone}: ${price.usd * spec.count:,.3f}/h "
            f"({price.source}); the on-demand price shown before stays its ceiling")


def capacity_in_zones(session: Any, spec: NodesSpec, res: Resolved, *, timeout: float = 900, poll: float = 10,
                      say: Callable[[str], None] = print) -> tuple[list[Instance], Resolved, str]:
    """wait_capacity in the stack's zone; below --min-count for want of capacity
    (InsufficientInstanceCapacity, or instances that did not come), delete the stack (waiting
    until it is gone: nothing bills in the zone it leaves) and make it again in the next zone
    that offers the type (res.other_zones), until one has capacity or none is left. Returns
    what runs, the Resolved of the zone it runs in, and why the last zone fell short ("")."""
    while True:
        up_ = wait_capacity(session, spec, timeout=timeout, poll=poll, say=say)
        if capacity_decision(spec.count, spec.minimum, len(up_)) != "rollback":
            return up_, res, ""
        reason = shortfall(session, spec.name)
        nxt = next_zone(res, reason)
        if nxt is None:
            return up_, res, reason
        say(move_line(spec, res.availability_zone, len(up_), reason, nxt[0]))
        if stack_state(session, spec.name) is not None:  # CloudFormation may have deleted it (OnFailure)
            delete_stack(session, spec.name, poll=poll)
        res = replace(res, availability_zone=nxt[0], subnet_id=nxt[1] or res.subnet_id,
                      other_zones=res.other_zones[1:])
        create_stack(session, spec, stack_template(spec, res))
        say(f"[nodes] stack {stack_name(spec.name)} creating in {nxt[0]}")
        if spec.spot:  # the spot price shown before was the first zone's
            from dtrain.launch.infra import pricing

            say(spot_price_line(spec, nxt[0], pricing.spot_now(session, spec.instance_type, nxt[0])))


def keep_partial(session: Any, name: str, up: int) -> None:
    """Lower the group's desired capacity to what started, so late instances do not appear
    outside the hostfile (the group keeps MinSize = --min-count)."""
    _, out = stack_status(session, name)
    session.client("autoscaling").update_auto_scaling_group(
        AutoScalingGroupName=out["NodesGroup"], DesiredCapacity=up)


def primary_interface(instance: dict[str, Any]) -> str:
    """A DescribeInstances entry's primary network interface (network card 0, device 0): the
    one with the node's address, where its Elastic IP goes."""
    for eni in instance.get("NetworkInterfaces", []):
        att = eni.get("Attachment") or {}
        if att.get("DeviceIndex") == 0 and att.get("NetworkCardIndex", 0) == 0:
            return eni["NetworkInterfaceId"]
    raise LaunchError(f"instance {instance['InstanceId']}: no primary network interface (card 0, device 0)")


def attach_addresses(session: Any, instances: Sequence[Instance], allocations: Sequence[str]) -> list[Instance]:
    """Associate the stack's Elastic IPs (allocation ids, one per node) with each instance's
    primary interface, in hostfile order; the instances with those public addresses."""
    from botocore.exceptions import ClientError

    ec2 = session.client("ec2")
    pairs = list(zip(instances, allocations))
    try:
        found = ec2.describe_instances(InstanceIds=[i.id for i in instances])["Reservations"]
        primary = {i["InstanceId"]: primary_interface(i) for r in found for i in r["Instances"]}
        for inst, alloc in pairs:
            ec2.associate_address(AllocationId=alloc, NetworkInterfaceId=primary[inst.id])
        public = {a["AllocationId"]: a["PublicIp"]
                  for a in ec2.describe_addresses(AllocationIds=[a for _, a in pairs])["Addresses"]}
    except ClientError as e:
        raise _client_error(e, "AssociateAddress") from None
    return [replace(inst, public_ip=public[alloc]) for inst, alloc in pairs]


def delete_stack(session: Any, name: str, *, wait: bool = True, timeout: float = 1800, poll: float = 10,
                 delete_data: bool = False) -> list[str]:
    """Delete the cluster's stack (everything it made but its data) and forget the cluster here.

    Its data (dataset volumes, the EFS file system) outlives it: returned as the ids kept, or
    with delete_data deleted too (after the stack, so nothing is mounted) and returned as the
    ids deleted. A gone stack with delete_data still deletes the data it left."""
    from botocore.exceptions import ClientError

    cfn = session.client("cloudformation")
    try:
        try:
            status = cfn.describe_stacks(StackName=stack_name(name))["Stacks"][0]["StackStatus"]
        except ClientError as e:
            if "does not exist" not in e.response["Error"].get("Message", ""):
                raise
            status = "DELETE_COMPLETE"
        if status == "DELETE_COMPLETE":  # a typo, or deleted before: say so, forget it here
            _forget(name)
            if delete_data and wait and kept_data(session, name):
                return delete_data_of(session, name, timeout=timeout, poll=poll)
            data = " and no dataset volume or EFS of the cluster either" if delete_data and wait else ""
            raise LaunchError(f"nodes down --name {name}: nothing to delete: no stack {stack_name(name)} in region "
                              f"{session.region_name}{data}; `dtrain nodes list` shows the clusters")
        cfn.delete_stack(StackName=stack_name(name))
        retried = False
        deadline = time.monotonic() + timeout
        while wait:
            try:
                status = cfn.describe_stacks(StackName=stack_name(name))["Stacks"][0]["StackStatus"]
            except ClientError as e:
                if "does not exist" in e.response["Error"].get("Message", ""):
                    break
                raise
            if status == "DELETE_COMPLETE":
                break
            if status == "DELETE_FAILED" and not retried:  # once more, after what may block it
                retried = True
                delete_loose_interfaces(session, name)
                cfn.delete_stack(StackName=stack_name(name))
                continue
            if status == "DELETE_FAILED" or time.monotonic() > deadline:
                raise LaunchError(f"stack {stack_name(name)}: {status}; see the CloudFormation console's events")
            time.sleep(poll)
        data: list[str] = []
        if wait:
            data = delete_data_of(session, name, timeout=timeout, poll=poll) if delete_data else kept_data(session, name)
    except ClientError as e:
        raise _client_error(e, f"DeleteStack {stack_name(name)}") from None
    _forget(name)
    return data


def delete_loose_interfaces(session: Any, name: str) -> list[str]:
    """Delete the network interfaces left unattached ("available") in the stack's own VPC
    (--new-vpc): an interface of a terminated instance that outlived it holds the subnet, and
    the subnet the VPC (DependencyViolation). Its ids; none for a stack in another's VPC."""
    from botocore.exceptions import ClientError

    try:
        res = session.client("cloudformation").describe_stack_resources(StackName=stack_name(name))["StackResources"]
        vpc = next((r["PhysicalResourceId"] for r in res if r.get("ResourceType") == "AWS::EC2::VPC"
                    and r.get("PhysicalResourceId")), None)
        if vpc is None:
            return []
        ec2 = session.client("ec2")
        loose = [i["NetworkInterfaceId"] for i in ec2.describe_network_interfaces(Filters=[
            {"Name": "vpc-id", "Values": [vpc]}, {"Name": "status", "Values": ["available"]}])["NetworkInterfaces"]]
        for eni in loose:
            ec2.delete_network_interface(NetworkInterfaceId=eni)
    except ClientError:
        return []  # the stack's own retry says what still blocks it
    return loose


def stack_addresses(session: Any, name: str, known: Sequence[str] = ()) -> list[str]:
    """The cluster's Elastic IPs (`PUBLIC-IP (ALLOCATION-ID)`): its stack's AWS::EC2::EIP
    resources while it stands, those tagged as its (CLUSTER_TAG, CloudFormation's stack-name
    tag), and those of `known` (an earlier answer: once the stack is gone) still allocated.
    Read-only."""
    from botocore.exceptions import ClientError

    ids = {k.split(" (")[0] for k in known} | {k.partition(" (")[2].rstrip(")") for k in known}
    try:
        ids |= {r.get("PhysicalResourceId", "") for r in session.client("cloudformation").describe_stack_resources(
            StackName=stack_name(name))["StackResources"]
            if r.get("ResourceType") == "AWS::EC2::EIP" and r.get("ResourceStatus") != "DELETE_COMPLETE"}
    except ClientError as e:
        if "does not exist" not in e.response["Error"].get("Message", ""):
            raise
    ours = ({"Key": CLUSTER_TAG, "Value": name}, {"Key": "aws:cloudformation:stack-name", "Value": stack_name(name)})
    found = [a for a in session.client("ec2").describe_addresses()["Addresses"]
             if {a.get("PublicIp"), a.get("AllocationId")} & ids or any(t in a.get("Tags", []) for t in ours)]
    return sorted(f"{a.get('PublicIp', '?')} ({a.get('AllocationId', '?')})" for a in found)


def addresses_left_line(had: int, left: Sequence[str]) -> str:
    """What `nodes down` says of the stack's Elastic IPs (had before the delete, left after it)
    (pure)."""
    if not left:
        return f"released its {had} Elastic IP(s): none of the stack's is left"
    return (f"Elastic IP(s) of the stack left, still billed: {', '.join(left)}; release each with "
            "`aws ec2 release-address --allocation-id ID`")


def kept_data(session: Any, name: str) -> list[str]:
    """Ids of the cluster's dataset volumes and EFS file systems (what `nodes down` keeps)."""
    return [v["VolumeId"] for v in dataset_volumes(session, name)] + data_file_systems(session, name)


def delete_data_of(session: Any, name: str, *, timeout: float = 600, poll: float = 10) -> list[str]:
    """Delete the cluster's dataset volumes and EFS file systems (their mount targets first)."""
    efs = session.client("efs")
    gone = delete_volumes(session, name)
    for fs in data_file_systems(session, name):
        for mt in efs.describe_mount_targets(FileSystemId=fs)["MountTargets"]:
            efs.delete_mount_target(MountTargetId=mt["MountTargetId"])
        deadline = time.monotonic() + timeout
        while efs.describe_mount_targets(FileSystemId=fs)["MountTargets"]:
            if time.monotonic() > deadline:
                raise LaunchError(f"EFS {fs}: mount targets still there after {timeout:.0f}s; delete it in the console")
            time.sleep(poll)
        efs.delete_file_system(FileSystemId=fs)
        gone.append(fs)
    return gone


def _forget(name: str) -> None:
    """Remove the cluster's files here (its hostfile and record)."""
    for f in ("cluster.json", "hostfile"):
        (cluster_dir(name) / f).unlink(missing_ok=True)
    if cluster_dir(name).is_dir() and not any(cluster_dir(name).iterdir()):
        cluster_dir(name).rmdir()


def delete_volumes(session: Any, name: str) -> list[str]:
    """Delete the dataset volumes `volume create` made for the cluster (tagged with it; with
    the EFS file system, what a cluster owns outside its stack). Call once the instances are gone."""
    from botocore.exceptions import ClientError

    ec2 = session.client("ec2")
    vols = dataset_volumes(session, name)
    for v in vols:
        for a in v.get("Attachments", []):  # left from terminated instances, usually none
            try:
                ec2.detach_volume(VolumeId=v["VolumeId"], InstanceId=a["InstanceId"], Force=True)
            except ClientError:
                pass  # already detached
        ec2.delete_volume(VolumeId=v["VolumeId"])
    return [v["VolumeId"] for v in vols]


def list_clusters(session: Any) -> list[tuple[str, str]]:
    """(cluster, stack status) of every dtrain stack in the region."""
    pages = session.client("cloudformation").get_paginator("describe_stacks").paginate()
    rows = []
    for p in pages:
        for st in p["Stacks"]:
            tag = {t["Key"]: t["Value"] for t in st.get("Tags", [])}.get(CLUSTER_TAG)
            if tag and st["StackStatus"] != "DELETE_COMPLETE":
                rows.append((tag, st["StackStatus"]))
    return sorted(rows)


# --- hostfile --------------------------------------------------------------------------------


def hostfile_text(cluster: Cluster, address: str = "private") -> str:
    """`IP slots=N user=U [identity=K]` per node: the launcher's hostfile format."""
    lines = []
    for i in cluster.instances:
        host = i.public_ip if address == "public" and i.public_ip else i.private_ip
        extra = f" identity={cluster.identity}" if cluster.identity else ""
        lines.append(f"{host} slots={cluster.slots} user={cluster.user}{extra}")
    return f"# dtrain cluster {cluster.name} ({cluster.stack}, {cluster.region})\n" + "\n".join(lines) + "\n"


def save_cluster(cluster: Cluster, address: str = "private") -> Path:
    """Write cluster.json and the hostfile, each replaced atomically (dtrain/records.py: a
    concurrent launch reads the old one or the new one); returns the hostfile's path."""
    d = cluster_dir(cluster.name)
    records.write(d / "cluster.json", cluster.to_json())
    records.write(d / "hostfile", hostfile_text(cluster, address))
    return d / "hostfile"


# --- the record follows the Auto Scaling group: a replaced node joins ----------------------------


def follow(record: Cluster, running: Sequence[Instance]) -> tuple[Cluster, list[Instance], list[Instance]]:
    """The record after the group replaced nodes (pure): the nodes still running keep their
    place, those gone leave, the group's new ones join at the end (private-IP order). Returns
    (the new record, gone, joined)."""
    now = {i.id: i for i in running}
    kept = [now[i.id] if now[i.id].public_ip else i for i in record.instances if i.id in now]
    known = {i.id for i in record.instances}
    joined = [i for i in running if i.id not in known]
    gone = [i for i in record.instances if i.id not in now]
    return replace(record, instances=tuple(kept + joined)), gone, joined


def record_address(name: str, record: Cluster) -> str:
    """The addresses the cluster's hostfile uses (public or private), read from it."""
    try:
        hosts = [line.split()[0] for line in cluster_hostfile(name).read_text().splitlines()
                 if line.strip() and not line.startswith("#")]
    except (LaunchError, OSError):
        return "private"
    public = {i.public_ip for i in record.instances if i.public_ip}
    return "public" if hosts and hosts[0] in public else "private"


def free_addresses(session: Any, name: str, running: Sequence[Instance]) -> list[str]:
    """The stack's Elastic IPs (allocation ids) associated with nothing: those a replaced node
    left."""
    _, out = stack_status(session, name)
    allocations = [a for a in out.get("Addresses", "").split(",") if a]
    if not allocations:
        return []
    ids = {i.id for i in running}
    found = session.client("ec2").describe_addresses(AllocationIds=allocations)["Addresses"]
    # AWS disassociates a terminated instance's address: one still associated is a node's
    held = {a["AllocationId"] for a in found if a.get("AssociationId") or a.get("InstanceId") in ids}
    return [a for a in allocations if a not in held]


def follow_group(session: Any, name: str, say: Callable[[str], None] = print) -> tuple[Cluster, Path, bool]:
    """`dtrain nodes sync --name NAME`: the cluster's record and hostfile follow its Auto Scaling
    group. A node the group replaced (a spot interruption, a failed health check) leaves, and
    the one that came instead joins with its address (on multi-EFA types, the Elastic IP the
    old one left: its way in and out). Each change is one line; returns (record, hostfile,
    whether anything changed)."""
    record = load_cluster(name)
    address = record_address(name, record)
    running = running_instances(session, name)
    updated, gone, joined = follow(record, running)
    if joined:
        free = free_addresses(session, name, running)
        if free:  # multi-EFA nodes: the Elastic IP a gone node left is the newcomer's way in and out
            attached = attach_addresses(session, joined[:len(free)], free)
            by_id = {i.id: i for i in attached}
            joined = [by_id.get(i.id, i) for i in joined]
            updated = replace(updated, instances=tuple(by_id.get(i.id, i) for i in updated.instances))

    def shown(i: Instance) -> str:
        return i.public_ip if address == "public" and i.public_ip else i.private_ip

    for i in gone:
        say(f"[nodes] {shown(i)} ({i.id}, {i.availability_zone}) left: no longer running in the group")
    for i in joined:
        say(f"[nodes] {shown(i)} ({i.id}, {i.availability_zone}) joined: the group's replacement")
    if not (gone or joined):
        say(f"[nodes] {name}: the hostfile matches the group ({len(record.instances)} nodes)")
        return record, cluster_hostfile(name), False
    if not updated.instances:
        raise LaunchError(f"--name {name}: no node of the cluster is running (stack {stack_name(name)}); "
                          f"`dtrain nodes list` shows it; `dtrain nodes down --name {name}` removes it")
    return updated, save_cluster(updated, address), True


def follow_cluster(session: Any, name: str, say: Callable[[str], None] = print) -> tuple[Cluster, bool]:
    """follow_group, then the nodes' worker list written again where anything changed (launch
    --cluster before the job; a running job's spares: launch/jobs/joining.py). AWS errors raise."""
    from dtrain.launch.remote.hosts import parse_hostfile

    cluster, hostfile, changed = follow_group(session, name, say=say)
    if changed:
        write_worker_list(parse_hostfile(hostfile), cluster, tuple(cluster.ssh_opts))  # its recorded options
    return cluster, changed


def cluster_problem(c: Cluster, name: str) -> str | None:
    """What is wrong in a cluster record the schema let through (pure): a name not the
    directory's, a value past its range or not one line, an address that is not one."""
    if c.name != name:
        return f"name: {values.shown(c.name)}, not this cluster's ({name})"
    for key in ("name", "region", "stack", "instance_type", "user", "identity", "security_group", "file_system"):
        v = getattr(c, key, None)
        if v is not None and (not v or len(v) > 4096 or not v.isprintable()):
            return f"{key}: not one line of printable text"
    if not 1 <= c.slots <= 4096:
        return f"slots: {c.slots if len(str(c.slots)) < 20 else 'a number of ' + str(len(str(c.slots))) + ' digits'}" \
            ", not from 1 to 4096"
    if not 1 <= len(c.instances) <= 10000:
        return f"instances: {len(c.instances)}, not from 1 to 10000"
    for k, i in enumerate(c.instances):
        for key in ("private_ip", "public_ip"):
            v = getattr(i, key)
            try:
                if v is not None:
                    ipaddress.ip_address(v)
            except ValueError:
                return f"instances.{k}.{key}: not an IP address"
        for key in ("id", "availability_zone", "instance_type"):
            v = getattr(i, key)
            if not v or len(v) > 255 or not v.isprintable():
                return f"instances.{k}.{key}: not one line of printable text"
    for o in c.ssh_opts:
        if len(o) > 4096 or not o.isprintable():
            return "ssh_opts: an option that is not one line of printable text"
    return None


def load_cluster(name: str) -> Cluster:
    """cluster.json of `nodes up --name NAME`, through its schema (the Cluster dataclass, strict;
    then cluster_problem): damage is one line naming the file, what is wrong and what to do."""
    path = cluster_dir(name) / "cluster.json"
    fix = (f"`dtrain nodes up --name {name}` wrote it: restore it, or `dtrain nodes down --name {name}` "
           "and `nodes up` again")
    try:
        cluster = records.read(path, Cluster, fix)
    except FileNotFoundError:
        raise LaunchError(f"--cluster {name}: no such cluster here ({path} missing; `dtrain nodes list`)") from None
    why = cluster_problem(cluster, name)
    if why:
        raise values.BadValue(f"{path}: {why}; {fix}")
    return cluster


def stack_state(session: Any, name: str) -> str | None:
    """The cluster's stack status, or None when there is no such stack (or it is deleted)."""
    from botocore.exceptions import ClientError

    try:
        stacks = session.client("cloudformation").describe_stacks(StackName=stack_name(name))["Stacks"]
    except ClientError as e:
        if "does not exist" in e.response["Error"].get("Message", ""):
            return None
        raise _client_error(e, f"DescribeStacks {stack_name(name)}") from None
    status = stacks[0]["StackStatus"]
    return None if status == "DELETE_COMPLETE" else status


def unfinished_cluster(name: str, status: str | None, region: str) -> LaunchError:
    """What to say of `--cluster NAME` with no cluster.json here, given its stack's status
    (pure): a stack kept by `nodes up --keep-on-failure`, or one still being made, is in
    `nodes list` but has no hostfile to use."""
    stack = stack_name(name)
    down = f"dtrain nodes down --name {name}{regions.region_arg(region)}"
    if status is None:
        return LaunchError(f"--cluster {name}: no such cluster (no stack {stack} in region {region}, no "
                           f"{cluster_dir(name) / 'cluster.json'}); `dtrain nodes list` shows the clusters")
    if status.endswith("IN_PROGRESS"):
        return LaunchError(f"--cluster {name}: stack {stack} is {status} in region {region}: a `nodes up` or "
                           f"`nodes down` is still at work; wait for it (`dtrain nodes list`), then try again")
    if status == "DELETE_FAILED":
        return LaunchError(f"--cluster {name}: stack {stack} is DELETE_FAILED in region {region}, still billed: "
                           f"`{down}` again deletes what is left")
    return LaunchError(f"--cluster {name}: stack {stack} is {status} in region {region} but `nodes up` did not "
                       f"finish (kept by --keep-on-failure, or made elsewhere), so there is no hostfile here; "
                       f"remove it with `{down}` (then `dtrain nodes up --name {name} ...` makes it anew)")


def cluster_hostfile(name: str) -> Path:
    """The hostfile `nodes up` wrote, for `dtrain launch --cluster NAME`."""
    path = cluster_dir(name) / "hostfile"
    if not path.exists():
        raise LaunchError(f"--cluster {name}: no hostfile at {path}: no cluster of that name was made here "
                          "(`dtrain nodes list` shows the clusters and what to do with each)")
    return path


# --- where this machine is, and how it reaches the nodes --------------------------------------


@dataclass(frozen=True)
class Vantage:
    """This machine as an EC2 instance sees itself (IMDSv2): its VPC, address, groups."""

    vpc_id: str
    private_ip: str
    security_groups: tuple[str, ...] = ()


def vantage(endpoint: str | None = None, timeout: float = 1.0) -> Vantage | None:
    """This machine's VPC, private address and security groups from the instance metadata
    service; None off EC2 (or AWS_EC2_METADATA_DISABLED=true, botocore's switch). endpoint:
    default AWS_EC2_METADATA_SERVICE_ENDPOINT, else http://169.254.169.254."""
    if endpoint is None:
        if os.environ.get("AWS_EC2_METADATA_DISABLED", "").lower() == "true":
            return None
        endpoint = os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or "http://169.254.169.254"
    base = endpoint.rstrip("/")

    def get(path: str, token: str) -> str:
        req = urllib.request.Request(f"{base}/latest/meta-data/{path}", headers={"X-aws-ec2-metadata-token": token})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read().decode().strip()

    try:
        req = urllib.request.Request(f"{base}/latest/api/token", method="PUT",
                                     headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            token = r.read().decode().strip()
        mac = get("mac", token)
        net = f"network/interfaces/macs/{mac}"
        return Vantage(vpc_id=get(f"{net}/vpc-id", token), private_ip=get("local-ipv4", token),
                       security_groups=tuple(get(f"{net}/security-group-ids", token).split()))
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class Reach:
    """How this machine reaches the nodes: the hostfile's addresses and the ssh rule."""

    address: str  # private | public
    ssh_cidr: str | None  # None with ssh_group, or when the caller's public /32 is still to be found
    ssh_group: str | None
    why: str


def decide_reach(requested: str, ssh_cidr: str | None, here: Vantage | None, vpc_id: str | None) -> Reach:
    """--address (auto, private, public) and --ssh-cidr -> Reach (pure). auto: private where
    this machine is in the cluster's VPC (ssh from its security group, else its address),
    public otherwise (ssh from this machine's public /32: ssh_cidr None, to be looked up)."""
    inside = here is not None and vpc_id is not None and here.vpc_id == vpc_id
    address = requested if requested != "auto" else ("private" if inside else "public")
    where = (f"this machine ({here.private_ip}) is in {vpc_id}" if inside
             else f"this machine is in another VPC ({here.vpc_id})" if here
             else "this machine is not in the nodes' VPC")
    if ssh_cidr:
        return Reach(address, ssh_cidr, None, f"{where}; {address} addresses; ssh from {ssh_cidr} (--ssh-cidr)")
    if address == "private" and inside:
        assert here is not None
        if here.security_groups:
            return Reach(address, None, here.security_groups[0],
                         f"{where}: private addresses; ssh from its security group {here.security_groups[0]}")
        return Reach(address, f"{here.private_ip}/32", None, f"{where}: private addresses; ssh from {here.private_ip}/32")
    if address == "private" and here is not None:  # a peered VPC: we connect from our private address
        return Reach(address, f"{here.private_ip}/32", None,
                     f"{where}: private addresses (--address private); ssh from {here.private_ip}/32")
    if address == "private":
        raise LaunchError("--address private from outside the nodes' VPC (a VPN, a bastion): pass --ssh-cidr "
                          "with the range your ssh comes from (the bastion's address/32)")
    return Reach(address, None, None, f"{where}: public addresses; ssh from this machine's public address")


def ssh_cidr_warning(cidr: str) -> str | None:
    """A warning when --ssh-cidr lets the whole internet reach the nodes' ssh (0.0.0.0/0, ::/0)."""
    if ipaddress.ip_network(cidr, strict=False).prefixlen != 0:
        return None
    return (f"[nodes] warning: --ssh-cidr {cidr} opens the nodes' ssh (port 22) to the whole internet; "
            "pass your own address/32 (the default) or your network's range")


# --- the whole of `nodes up` -----------------------------------------------------------------


def start(session: Any, spec: NodesSpec, say: Callable[[str], None] = print, address: str = "private",
          here: Vantage | None | Callable[[], Vantage | None] = None,
          confirm: Callable[[Resolved], None] | None = None) -> Resolved:
    """preflight, decide how this machine reaches the nodes, then create the stack (nothing
    is created when either fails). address: auto, private or public (see decide_reach);
    here: where this machine is, or a function that finds out (called only when it matters,
    after preflight); confirm: shown what will be rented (the Resolved about to be made: its
    zone, Elastic IPs, root disks) before anything is, it raises to create nothing
    (launch/infra/pricing.py nodes_up_gate: the price and the prompt)."""
    res = preflight(session, spec)
    if callable(here):
        here = here() if address == "auto" or (address == "private" and not spec.ssh_cidr) else None
    reach = decide_reach(address, spec.ssh_cidr, here, None if spec.new_vpc else res.vpc_id)
    route = (subnet_default_route(session, res.subnet_id, res.vpc_id)
             if len(res.interfaces) > 1 and spec.subnet and res.subnet_id else None)
    addresses = spec.count if needs_addresses(spec, len(res.interfaces), route) else 0
    problem = public_ip_error(spec, len(res.interfaces), reach.address, bool(addresses))
    if not problem and addresses:
        problem = address_quota_error(spec, addresses, *address_quota(session))
    if problem:
        raise LaunchError(problem)
    cidr = reach.ssh_cidr if (reach.ssh_cidr or reach.ssh_group) else caller_cidr()
    spec = replace(spec, ssh_cidr=cidr, ssh_group=reach.ssh_group)
    say(f"[nodes] {reach.why}" + ("" if reach.ssh_cidr or reach.ssh_group else f" ({cidr})"))
    warning = ssh_cidr_warning(cidr) if cidr else None
    if warning:
        say(warning)
    efas = sum(1 for i in res.interfaces if i.get("InterfaceType", "").startswith("efa")) or int(res.efa)
    if addresses:
        say(addresses_line(addresses))
    res = replace(res, address=reach.address, addresses=addresses,
                  ssh_rule=f"security group {spec.ssh_group}" if spec.ssh_group else f"{cidr}")
    for line in res.warnings:
        say(line)
    if spec.idle_down:
        say(idle_down_line(spec))
    if confirm is not None:
        confirm(res)
    create_stack(session, spec, stack_template(spec, res))
    say(f"[nodes] stack {stack_name(spec.name)} creating: {spec.count} x {spec.instance_type}"
        f"{' (spot)' if spec.spot else ''}{f', {efas} EFA' if efas else ''} in {res.availability_zone or 'one zone'}, "
        f"AMI {res.ami_id} (user {res.ssh_user}), root disk {res.root_size} GiB")
    return res


def finish(session: Any, spec: NodesSpec, res: Resolved, *, identity: str | None = None,
           address: str | None = None, ready: Callable[[Sequence[Instance]], None] | None = None,
           timeout: float = 900, poll: float = 10, say: Callable[[str], None] = print,
           keep_on_failure: bool = False, ssh_opts: Sequence[str] = ()) -> tuple[Cluster, Path]:
    """capacity (all, partial or rollback) -> ready(instances) -> cluster.json and hostfile.

    ready: waits until every node answers ssh and runs docker (see wait_ready), raising if
    not. On any failure, Ctrl-C included, the stack is deleted and that is said, unless
    keep_on_failure (then it is kept and that is said): nothing is left half-made unseen."""
    address = address or res.address
    stack = stack_name(spec.name)
    down = f"dtrain nodes down --name {spec.name}{regions.region_arg(session.region_name)}"
    try:
        up_, res, reason = capacity_in_zones(session, spec, res, timeout=timeout, poll=poll, say=say)
        decision = capacity_decision(spec.count, spec.minimum, len(up_))
        if decision == "rollback":
            where = f" in {res.availability_zone}" if res.availability_zone else ""
            stay = f"; not moved to another zone: {res.zone_pin}" if res.zone_pin else (
                "; no other zone of the region offers the type" if is_capacity_error(reason) or not reason else "")
            raise LaunchError(f"only {len(up_)} of {spec.count} instances started{where} (--min-count {spec.minimum})"
                              + (f": {reason}" if reason else "") + stay
                              + ("" if keep_on_failure else f"; rolled back: stack {stack} deleted"))
        if decision == "partial":
            say(f"[nodes] partial capacity: {len(up_)} of {spec.count} instances started "
                f"(>= --min-count {spec.minimum}); continuing with {len(up_)}")
            keep_partial(session, spec.name, len(up_))
        if res.addresses:
            _, out = stack_status(session, spec.name)
            up_ = attach_addresses(session, up_, out["Addresses"].split(","))
        if address == "public":
            bare = [i for i in up_ if not i.public_ip]
            if bare:
                raise LaunchError(f"--address public: instance {bare[0].id} ({bare[0].private_ip}) has no public "
                                  "IPv4 address (its subnet assigns none); run from inside the VPC with "
                                  "--address private, or use a subnet that maps public addresses")
        _, out = stack_status(session, spec.name)
        cluster = Cluster(name=spec.name, region=session.region_name, stack=stack,
                          instance_type=spec.instance_type, nitro=res.nitro, slots=res.gpus, user=res.ssh_user,
                          identity=identity, instances=tuple(up_), security_group=out.get("SecurityGroupId"),
                          file_system=out.get("FileSystemId"), ssh_opts=tuple(ssh_opts))
        if ready is not None:
            ready(up_)
    except KeyboardInterrupt:
        if keep_on_failure:
            say(f"[nodes] interrupted: stack {stack} kept (--keep-on-failure); delete it with `{down}`")
        else:
            made = "instances, security group, launch template" + (", Elastic IPs" if res.addresses else "")
            say(f"[nodes] interrupted: deleting stack {stack} (its {made}); "
                f"CloudFormation finishes in the background (`dtrain nodes list` shows it)")
            _delete_after_failure(session, spec.name, say)
        raise
    except BaseException:
        if keep_on_failure:
            say(f"[nodes] stack {stack} kept (--keep-on-failure): look at the nodes, then `{down}`")
        else:
            say(f"[nodes] deleting stack {stack} (nothing of this attempt is kept but the cluster's data)")
            _delete_after_failure(session, spec.name, say)
        raise
    return cluster, save_cluster(cluster, address)


def _delete_after_failure(session: Any, name: str, say: Callable[[str], None]) -> None:
    """Start deleting the stack after a failed up; a failure here is said, not raised over
    the error that brought us here."""
    try:
        delete_stack(session, name, wait=False)
    except Exception as e:  # noqa: BLE001 - the original error is what the user must see
        say(f"[nodes] could not delete stack {stack_name(name)}: {' '.join(str(e).split())}; "
            f"`dtrain nodes down --name {name}{regions.region_arg(session.region_name)}` again, or delete it in "
            "the CloudFormation console")


def up(session: Any, spec: NodesSpec, **options: Any) -> tuple[Cluster, Path]:
    """The whole of `nodes up`: start (address, here), then finish (its options)."""
    res = start(session, spec, say=options.get("say", print), address=options.pop("address", "private"),
                here=options.pop("here", None), confirm=options.pop("confirm", None))
    return finish(session, spec, res, **options)


# ssh errors that waiting does not heal: (text in ssh's error, seconds it may last while a node
# boots, what to do). A route this machine lacks never appears by itself; "No route to host"
# and a refused key can last the first seconds of a boot (ARP, cloud-init writing the key).
LASTING_SSH_ERRORS: tuple[tuple[str, float, str], ...] = (
    ("Network is unreachable", 0, "this machine has no route to that address: reach the nodes at addresses "
     "it routes to (--address public from outside the VPC), through a VPN, or --ssh-opt ProxyJump=BASTION"),
    ("Could not resolve hostname", 0, "the name does not resolve here: use the node's IP address"),
    ("REMOTE HOST IDENTIFICATION HAS CHANGED", 0, "a known_hosts entry of an earlier machine at this address: "
     "remove it (ssh-keygen -R ADDRESS) or pass --ssh-opt UserKnownHostsFile=/dev/null"),
    ("Host key verification failed", 0, "the node's host key is refused: remove the old entry (ssh-keygen -R "
     "ADDRESS) or pass --ssh-opt StrictHostKeyChecking=accept-new"),
    ("bad permissions", 0, "the private key is readable by others: chmod 600 it"),
    ("No route to host", 60, "the address cannot be reached from here (the node is gone, or a router or "
     "firewall rejects it): check the subnet's route table and the security group"),
    ("Permission denied (publickey", 60, "the nodes refuse the key: give --ssh-key the private key of the "
     "--key-name key pair, and --ssh-user the AMI's user"),
)


def lasting_ssh_error(error: str) -> tuple[float, str] | None:
    """(seconds it may last while a node boots, what to do) for an ssh error waiting does not
    heal, or None for one that may (connection refused or timed out while booting) (pure)."""
    return next(((grace, advice) for text, grace, advice in LASTING_SSH_ERRORS if text in error), None)


def wait_ready(nodes: Sequence[Any], *, ssh_opts: Sequence[str] = (), timeout: float = 600,
               first_timeout: float | None = None, poll: float = 5, hint: str = "",
               say: Callable[[str], None] = print) -> None:
    """Until every node (hosts.Node) answers ssh and its docker engine answers; LaunchError
    naming the nodes that did not by the timeout. first_timeout: give up sooner when no node
    at all has answered by then (a security group or route that lets nothing through), with
    the first node's error and hint (who may ssh in)."""
    from dtrain.launch.remote.transport import SshTransport

    t0 = time.monotonic()
    deadline = t0 + timeout
    pending = list(nodes)
    ssh = SshTransport(nodes, ssh_opts, multiplex=False)
    since: dict[tuple[str, str], float] = {}  # (host, lasting error) -> first seen
    while True:
        results = ssh.run(pending, lambda n: ["docker", "info", "--format", "{{.ServerVersion}}"],
                          timeout=30, retries=0)
        failed = [(n, r) for n, r in zip(pending, results) if not r.ok]
        if not failed:
            return
        pending = [n for n, _ in failed]
        now = time.monotonic()
        for n, r in failed:  # an error that does not heal stops the wait at once (after its grace)
            lasting = lasting_ssh_error(f"{r.error or ''}\n{r.stderr}")
            if lasting:
                first = since.setdefault((n.host, lasting[1]), now)
                if now - first >= lasting[0]:
                    raise LaunchError(f"{n.host}: {' '.join((r.error or '').split())}: {lasting[1]}")
        if first_timeout is not None and len(pending) == len(nodes) and now - t0 > first_timeout:
            n, r = failed[0]
            raise LaunchError(f"no node answered ssh + docker within {first_timeout:.0f}s: {n.host}: {r.error}"
                              + (f"; {hint}" if hint else ""))
        if now > deadline:
            detail = "; ".join(f"{n.host}: {r.error}" for n, r in failed)
            raise LaunchError(f"{len(failed)} node(s) not ready (ssh + docker) after {timeout:.0f}s: {detail}")
        say(f"[nodes] ssh + docker: {len(nodes) - len(pending)}/{len(nodes)} ready "
            f"({now - t0:.0f}s; waiting for {', '.join(n.host for n in pending[:4])}"
            f"{' ...' if len(pending) > 4 else ''})")
        time.sleep(poll)


def ssh_ready(identity: str | None, address: str = "private", ssh_opts: Sequence[str] = (),
              timeout: float = 600, user: str = DLAMI_USER, first_timeout: float | None = None,
              hint: str = "") -> Callable[[Sequence[Instance]], None]:
    """finish()'s ready step: wait_ready on the instances as the hostfile will name them."""
    from dtrain.launch.remote.hosts import Node

    def ready(instances: Sequence[Instance]) -> None:
        nodes = [Node(host=i.public_ip if address == "public" and i.public_ip else i.private_ip,
                      user=user, identity=identity) for i in instances]
        wait_ready(nodes, ssh_opts=ssh_opts, timeout=timeout, first_timeout=first_timeout, hint=hint)

    return ready


WORKER_LIST = "workers"  # ~/.dtrain/workers on every node: the cluster's private addresses (seed 002)


def worker_list(cluster: Cluster) -> str:
    """Every node's private address, one per line, in hostfile order."""
    return "".join(f"{i.private_ip}\n" for i in cluster.instances)


def write_worker_list(nodes: Sequence[Any], cluster: Cluster, ssh_opts: Sequence[str] = ()) -> None:
    """~/.dtrain/workers on every node (sent on stdin; the command is constant text)."""
    from dtrain.launch.remote.transport import SshTransport

    text = worker_list(cluster)
    cmd = ["sh", "-c", f'mkdir -p "$HOME/.dtrain" && cat > "$HOME/.dtrain/{WORKER_LIST}"']
    SshTransport(nodes, ssh_opts, multiplex=False).run(nodes, lambda n: cmd, stdin=lambda n: text, timeout=60,
                                                       retries=1, what="writing the worker list")


def caller_cidr(timeout: float = 10) -> str:
    """This machine's public IPv4 address as a /32 (https://checkip.amazonaws.com, or the URL in
    DTRAIN_CHECKIP_URL), for the ssh rule when the nodes are reached from outside their VPC."""
    url = os.environ.get("DTRAIN_CHECKIP_URL") or "https://checkip.amazonaws.com"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            addr = ipaddress.IPv4Address(r.read().decode().strip())
    except (OSError, ValueError) as e:
        raise LaunchError(f"cannot tell this machine's public address ({e}); pass --ssh-cidr A.B.C.D/32") from None
    return f"{addr}/32"
