"""EC2 nodes from nothing: one CloudFormation stack per cluster, and the hostfile of its nodes.

Data flows one way: flags -> NodesSpec -> preflight (read-only AWS calls; every bad input is
an error here, before anything is created) -> Resolved -> stack_template (pure dict) ->
create_stack -> wait_capacity -> capacity_decision (pure) -> hostfile. Everything the
cluster owns sits in the stack, so `nodes down` (delete_stack) leaves nothing behind; the one
exception, `invoke volume create`'s volumes, carry the cluster's tag and are deleted with it.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dtrain import ROOT
from dtrain.launch.errors import LaunchError
from dtrain.launch.infra.instance_types import efa_cards, efa_supported, is_nitro

# The Deep Learning AMI (Ubuntu 22.04, NVIDIA driver, Docker and the NVIDIA container toolkit),
# through its public SSM parameter: CloudFormation resolves the newest id at create time.
DLAMI_PARAMETER = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
DLAMI_USER = "ubuntu"
DLAMI_ROOT_DEVICE = "/dev/sda1"  # the Ubuntu DLAMI's root device: its mapping here encrypts it
ROOT_VOLUME_GB = 200  # above the DLAMI's snapshot; room for a few training images (10-20 GiB each)
FIRST_BOOT = ROOT / "launch" / "node" / "first-boot.sh"  # every node's user data
CLUSTER_TAG = "dtrain:cluster"  # on the stack and every instance: `invoke launch --ec2-tag dtrain:cluster=C`
DATASET_TAG = ("dtrain:role", "dataset")  # on `volume create`'s volumes (root volumes have CLUSTER_TAG too)
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,62}$")


def stack_name(cluster: str) -> str:
    return f"dtrain-{cluster}"


def clusters_dir() -> Path:
    return Path(os.environ.get("DTRAIN_HOME", "~/.dtrain")).expanduser() / "clusters"


def cluster_dir(cluster: str) -> Path:
    return clusters_dir() / cluster


@dataclass(frozen=True)
class NodesSpec:
    """What the user asked for (flags of `invoke nodes up`)."""

    name: str
    count: int
    instance_type: str
    ssh_cidr: str  # who may ssh in, e.g. the caller's address/32
    min_count: int | None = None  # None: all of count
    spot: bool = False
    subnet: str | None = None  # None: the default VPC's first subnet, unless new_vpc
    new_vpc: bool = False
    key_name: str | None = None
    efs: bool = False
    ami_parameter: str = DLAMI_PARAMETER
    efa_interfaces: int | None = None  # None: every EFA the type has (one per network card)

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
        try:
            ipaddress.ip_network(self.ssh_cidr)
        except ValueError:
            raise LaunchError(f"--ssh-cidr {self.ssh_cidr!r}: not a CIDR (e.g. 203.0.113.7/32)") from None

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


# --- preflight: read-only calls, every bad input an error before anything is created --------


def _client_error(e: Any, what: str) -> LaunchError:
    err = e.response.get("Error", {})
    return LaunchError(f"{what}: {err.get('Code')}: {err.get('Message')}")


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
    gpus = sum(int(g.get("Count", 0)) for g in (info.get("GpuInfo") or {}).get("Gpus", [])) or 1
    if spec.key_name:
        try:
            ec2.describe_key_pairs(KeyNames=[spec.key_name])
        except ClientError as e:
            if e.response["Error"].get("Code") == "InvalidKeyPair.NotFound":
                raise LaunchError(f"--key-name {spec.key_name}: no such key pair in {ec2.meta.region_name} "
                                  "(create or import it: aws ec2 import-key-pair)") from None
            raise _client_error(e, "DescribeKeyPairs") from None
    vpc_id = subnet_id = az = None
    if spec.subnet:
        try:
            sub = ec2.describe_subnets(SubnetIds=[spec.subnet])["Subnets"][0]
        except ClientError as e:
            if e.response["Error"].get("Code") == "InvalidSubnetID.NotFound":
                raise LaunchError(f"--subnet {spec.subnet}: no such subnet in {ec2.meta.region_name}") from None
            raise _client_error(e, "DescribeSubnets") from None
        vpc_id, subnet_id, az = sub["VpcId"], sub["SubnetId"], sub["AvailabilityZone"]
    elif not spec.new_vpc:
        vpcs = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
        if not vpcs:
            raise LaunchError(f"no default VPC in {ec2.meta.region_name}: pass --subnet SUBNET-ID or --new-vpc")
        subs = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpcs[0]["VpcId"]]},
                                             {"Name": "default-for-az", "Values": ["true"]}])["Subnets"]
        if not subs:
            raise LaunchError(f"default VPC {vpcs[0]['VpcId']} has no default subnet: pass --subnet SUBNET-ID")
        sub = min(subs, key=lambda s: s["AvailabilityZone"])
        vpc_id, subnet_id, az = sub["VpcId"], sub["SubnetId"], sub["AvailabilityZone"]
    try:
        cfn.describe_stacks(StackName=stack_name(spec.name))
    except ClientError as e:
        if "does not exist" not in e.response["Error"].get("Message", ""):
            raise _client_error(e, "DescribeStacks") from None
    else:
        raise LaunchError(f"--name {spec.name}: cluster exists (stack {stack_name(spec.name)}); "
                          f"`invoke nodes down --name {spec.name}` first, or pick another name")
    return Resolved(efa=efa_supported(info), nitro=is_nitro(info), gpus=gpus, vpc_id=vpc_id,
                    subnet_id=subnet_id, availability_zone=az,
                    interfaces=tuple(network_interfaces(info, spec.efa_interfaces)))


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


def public_ip_error(spec: NodesSpec, interfaces: int, address: str = "private") -> str | None:
    """Why this cluster cannot work as asked, or None. AWS gives no public IPv4 address to an
    instance launched with more than one network interface (AssociatePublicIpAddress is then
    refused, and a subnet's auto-assign does not apply): such nodes have no public address to
    ssh to, and in a subnet whose only way out is an internet gateway (the default VPC's, the
    --new-vpc one) no way to a registry. A subnet routed through a NAT gateway works."""
    if interfaces <= 1:
        return None
    what = f"{spec.instance_type} gets {interfaces} network interfaces (one per EFA)"
    fewer = f"--efa-interfaces 1 (one EFA and a public address: about 1/{interfaces} of the inter-node bandwidth)"
    if address == "public":
        return (f"--address public: {what}, and AWS gives no public IPv4 address to an instance with more "
                f"than one; use --address private from inside the VPC (or a ProxyJump), or {fewer}")
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


def subnet_route_warning(spec: NodesSpec, interfaces: int, route: str | None) -> str | None:
    """A warning where multi-interface nodes (no public address) go into --subnet whose way
    out is an internet gateway: they reach no registry but through VPC endpoints."""
    if interfaces <= 1 or not spec.subnet or not (route or "").startswith("igw-"):
        return None
    return (f"warning: --subnet {spec.subnet} reaches the internet through {route}, but {spec.instance_type}'s "
            f"{interfaces} network interfaces leave its nodes without a public address: they reach no registry "
            "but through VPC endpoints; a subnet behind a NAT gateway (or --efa-interfaces 1) avoids that")


# --- the template: a pure function of the spec and what preflight found ---------------------


def _new_vpc_resources() -> dict[str, Any]:
    """A VPC with one public subnet in the region's first zone (a placement group is one zone)."""
    tag = [{"Key": "Name", "Value": {"Ref": "AWS::StackName"}}]
    return {
        "Vpc": {"Type": "AWS::EC2::VPC", "Properties": {
            "CidrBlock": "10.0.0.0/16", "EnableDnsSupport": True, "EnableDnsHostnames": True, "Tags": tag}},
        "InternetGateway": {"Type": "AWS::EC2::InternetGateway", "Properties": {"Tags": tag}},
        "GatewayAttachment": {"Type": "AWS::EC2::VPCGatewayAttachment", "Properties": {
            "VpcId": {"Ref": "Vpc"}, "InternetGatewayId": {"Ref": "InternetGateway"}}},
        "Subnet": {"Type": "AWS::EC2::Subnet", "Properties": {
            "VpcId": {"Ref": "Vpc"}, "CidrBlock": "10.0.0.0/20", "MapPublicIpOnLaunch": True,
            "AvailabilityZone": {"Fn::Select": [0, {"Fn::GetAZs": ""}]}, "Tags": tag}},
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
        "BlockDeviceMappings": [{"DeviceName": DLAMI_ROOT_DEVICE, "Ebs": {
            "Encrypted": True, "VolumeType": "gp3", "VolumeSize": ROOT_VOLUME_GB, "DeleteOnTermination": True}}],
        "TagSpecifications": [{"ResourceType": "instance", "Tags": tags},
                              {"ResourceType": "volume", "Tags": tags}],
    }
    data["UserData"] = {"Fn::Base64": FIRST_BOOT.read_text()}  # pigz, for faster cold pulls
    if spec.key_name:
        data["KeyName"] = spec.key_name
    if spec.spot:
        # One-time requests that terminate on interruption: what an Auto Scaling group accepts.
        data["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {
            "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
    resources: dict[str, Any] = {
        **(_new_vpc_resources() if spec.new_vpc else {}),
        "SecurityGroup": {"Type": "AWS::EC2::SecurityGroup", "Properties": {
            "GroupDescription": f"dtrain cluster {spec.name}: all traffic among members, ssh from the caller",
            "VpcId": vpc,
            "SecurityGroupIngress": [{"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "CidrIp": {"Ref": "SshCidr"},
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
            "Tags": [{**t, "PropagateAtLaunch": True} for t in tags]}},
    }
    outputs: dict[str, Any] = {
        "NodesGroup": {"Value": {"Ref": "Nodes"}},
        "SecurityGroupId": {"Value": sg},
        "SubnetId": {"Value": subnet},
    }
    if spec.efs:
        resources["FileSystem"] = {"Type": "AWS::EFS::FileSystem", "Properties": {
            "Encrypted": True, "PerformanceMode": "generalPurpose",
            "FileSystemTags": tags}}
        resources["MountTarget"] = {"Type": "AWS::EFS::MountTarget", "Properties": {
            "FileSystemId": {"Ref": "FileSystem"}, "SubnetId": subnet, "SecurityGroups": [sg]}}
        outputs["FileSystemId"] = {"Value": {"Ref": "FileSystem"}}
    return {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Description": f"dtrain cluster {spec.name}: {spec.count} x {spec.instance_type} (generated by dtrain)",
        "Parameters": {
            "AmiId": {"Type": "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>", "Default": spec.ami_parameter,
                      "Description": "public SSM parameter of the Deep Learning AMI"},
            "SshCidr": {"Type": "String", "Default": spec.ssh_cidr, "Description": "who may ssh to the nodes"},
        },
        "Resources": resources,
        "Outputs": outputs,
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

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Cluster":
        d = json.loads(text)
        d["instances"] = tuple(Instance(**i) for i in d["instances"])
        return cls(**d)


def create_stack(session: Any, spec: NodesSpec, template: dict[str, Any]) -> str:
    """Start the stack (tagged with the cluster, deleted by CloudFormation if creation fails)."""
    from botocore.exceptions import ClientError

    try:
        return session.client("cloudformation").create_stack(
            StackName=stack_name(spec.name), TemplateBody=json.dumps(template),
            Tags=[{"Key": CLUSTER_TAG, "Value": spec.name}], OnFailure="DELETE")["StackId"]
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
    """Wait for the stack, then for count running instances or the timeout; what is running."""
    deadline = time.monotonic() + timeout
    while True:
        status, _ = stack_status(session, spec.name)
        if status == "CREATE_COMPLETE":
            break
        if not status.endswith("IN_PROGRESS"):
            return []  # CREATE_FAILED / ROLLBACK / DELETE: no capacity to speak of
        if time.monotonic() > deadline:
            break
        time.sleep(poll)
    while True:
        up = running_instances(session, spec.name)
        if len(up) >= spec.count or time.monotonic() > deadline:
            return up
        say(f"[nodes] {len(up)}/{spec.count} running; waiting")
        time.sleep(poll)


def keep_partial(session: Any, name: str, up: int) -> None:
    """Lower the group's desired capacity to what started, so late instances do not appear
    outside the hostfile (the group keeps MinSize = --min-count)."""
    _, out = stack_status(session, name)
    session.client("autoscaling").update_auto_scaling_group(
        AutoScalingGroupName=out["NodesGroup"], DesiredCapacity=up)


def delete_stack(session: Any, name: str, *, wait: bool = True, timeout: float = 1800, poll: float = 10) -> None:
    """Delete the cluster's stack (everything it made) and forget the cluster locally."""
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
            raise LaunchError(f"nodes down --name {name}: no stack {stack_name(name)} in region "
                              f"{session.region_name}; `invoke nodes list` shows the clusters")
        cfn.delete_stack(StackName=stack_name(name))
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
            if status == "DELETE_FAILED" or time.monotonic() > deadline:
                raise LaunchError(f"stack {stack_name(name)}: {status}; see the CloudFormation console's events")
            time.sleep(poll)
        if wait:
            delete_volumes(session, name)
    except ClientError as e:
        raise _client_error(e, f"DeleteStack {stack_name(name)}") from None
    _forget(name)


def _forget(name: str) -> None:
    """Remove the cluster's files here (its hostfile and record)."""
    for f in ("cluster.json", "hostfile"):
        (cluster_dir(name) / f).unlink(missing_ok=True)
    if cluster_dir(name).is_dir() and not any(cluster_dir(name).iterdir()):
        cluster_dir(name).rmdir()


def delete_volumes(session: Any, name: str) -> list[str]:
    """Delete the dataset volumes `volume create` made for the cluster (tagged with it; the
    only things a cluster owns outside its stack). Call once the instances are gone."""
    from botocore.exceptions import ClientError

    ec2 = session.client("ec2")
    vols = ec2.describe_volumes(Filters=[{"Name": f"tag:{CLUSTER_TAG}", "Values": [name]},
                                         {"Name": f"tag:{DATASET_TAG[0]}", "Values": [DATASET_TAG[1]]}])["Volumes"]
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
    """Write cluster.json and the hostfile; returns the hostfile's path."""
    d = cluster_dir(cluster.name)
    d.mkdir(parents=True, exist_ok=True)
    (d / "cluster.json").write_text(cluster.to_json())
    (d / "hostfile").write_text(hostfile_text(cluster, address))
    return d / "hostfile"


def load_cluster(name: str) -> Cluster:
    path = cluster_dir(name) / "cluster.json"
    try:
        return Cluster.from_json(path.read_text())
    except FileNotFoundError:
        raise LaunchError(f"--cluster {name}: no such cluster here ({path} missing; `invoke nodes list`)") from None


def cluster_hostfile(name: str) -> Path:
    """The hostfile `nodes up` wrote, for `invoke launch --cluster NAME`."""
    path = cluster_dir(name) / "hostfile"
    if not path.exists():
        raise LaunchError(f"--cluster {name}: no hostfile at {path} (`invoke nodes up --name {name}` writes it)")
    return path


# --- the whole of `nodes up` -----------------------------------------------------------------


def ssh_cidr_warning(cidr: str) -> str | None:
    """A warning when --ssh-cidr lets the whole internet reach the nodes' ssh (0.0.0.0/0, ::/0)."""
    if ipaddress.ip_network(cidr, strict=False).prefixlen != 0:
        return None
    return (f"[nodes] warning: --ssh-cidr {cidr} opens the nodes' ssh (port 22) to the whole internet; "
            "pass your own address/32 (the default) or your network's range")


def start(session: Any, spec: NodesSpec, say: Callable[[str], None] = print, address: str = "private") -> Resolved:
    """preflight, then create the stack (nothing is created when preflight fails)."""
    warning = ssh_cidr_warning(spec.ssh_cidr)
    if warning:
        say(warning)
    res = preflight(session, spec)
    efas = sum(1 for i in res.interfaces if i.get("InterfaceType", "").startswith("efa")) or int(res.efa)
    problem = public_ip_error(spec, len(res.interfaces), address)
    if problem:
        raise LaunchError(problem)
    if len(res.interfaces) > 1 and res.subnet_id:
        route = subnet_default_route(session, res.subnet_id, res.vpc_id)
        warning = subnet_route_warning(spec, len(res.interfaces), route)
        if warning:
            say(f"[nodes] {warning}")
    create_stack(session, spec, stack_template(spec, res))
    say(f"[nodes] stack {stack_name(spec.name)} creating: {spec.count} x {spec.instance_type}"
        f"{' (spot)' if spec.spot else ''}{f', {efas} EFA' if efas else ''}")
    return res


def finish(session: Any, spec: NodesSpec, res: Resolved, *, identity: str | None = None,
           address: str = "private", ready: Callable[[Sequence[Instance]], None] | None = None,
           timeout: float = 900, poll: float = 10, say: Callable[[str], None] = print) -> tuple[Cluster, Path]:
    """capacity (all, partial or rollback) -> ready(instances) -> cluster.json and hostfile.

    ready: waits until every node answers ssh and runs docker (see wait_ready), raising if
    not. On any failure the stack is deleted: nothing is left half-made."""
    try:
        up_ = wait_capacity(session, spec, timeout=timeout, poll=poll, say=say)
        decision = capacity_decision(spec.count, spec.minimum, len(up_))
        if decision == "rollback":
            raise LaunchError(f"only {len(up_)} of {spec.count} instances started (--min-count {spec.minimum}); "
                              f"rolled back: stack {stack_name(spec.name)} deleted")
        if decision == "partial":
            say(f"[nodes] partial capacity: {len(up_)} of {spec.count} instances started "
                f"(>= --min-count {spec.minimum}); continuing with {len(up_)}")
            keep_partial(session, spec.name, len(up_))
        _, out = stack_status(session, spec.name)
        cluster = Cluster(name=spec.name, region=session.region_name, stack=stack_name(spec.name),
                          instance_type=spec.instance_type, nitro=res.nitro, slots=res.gpus, user=DLAMI_USER,
                          identity=identity, instances=tuple(up_), security_group=out.get("SecurityGroupId"),
                          file_system=out.get("FileSystemId"))
        if ready is not None:
            ready(up_)
    except BaseException:
        delete_stack(session, spec.name, wait=False)
        raise
    return cluster, save_cluster(cluster, address)


def up(session: Any, spec: NodesSpec, **options: Any) -> tuple[Cluster, Path]:
    """The whole of `nodes up`: start, then finish (finish's options)."""
    res = start(session, spec, say=options.get("say", print), address=options.get("address", "private"))
    return finish(session, spec, res, **options)


def wait_ready(nodes: Sequence[Any], *, ssh_opts: Sequence[str] = (), timeout: float = 600,
               poll: float = 5, say: Callable[[str], None] = print) -> None:
    """Until every node (hosts.Node) answers ssh and its docker engine answers; LaunchError
    naming the nodes that did not by the timeout."""
    from dtrain.launch.jobs.fanout import run_all
    from dtrain.launch.jobs.hosts import ssh_argv

    deadline = time.monotonic() + timeout
    pending = list(nodes)
    while True:
        results = run_all(pending, lambda n: ssh_argv(n, ["docker", "info", "--format", "{{.ServerVersion}}"],
                                                      extra_opts=ssh_opts),
                          timeout=30, retries=0)
        failed = [(n, r) for n, r in zip(pending, results) if not r.ok]
        if not failed:
            return
        pending = [n for n, _ in failed]
        if time.monotonic() > deadline:
            detail = "; ".join(f"{n.host}: {r.error}" for n, r in failed)
            raise LaunchError(f"{len(failed)} node(s) not ready (ssh + docker) after {timeout:.0f}s: {detail}")
        say(f"[nodes] waiting for ssh and docker on {', '.join(n.host for n in pending)}")
        time.sleep(poll)


def ssh_ready(identity: str | None, address: str = "private", ssh_opts: Sequence[str] = (),
              timeout: float = 600) -> Callable[[Sequence[Instance]], None]:
    """finish()'s ready step: wait_ready on the instances as the hostfile will name them."""
    from dtrain.launch.jobs.hosts import Node

    def ready(instances: Sequence[Instance]) -> None:
        nodes = [Node(host=i.public_ip if address == "public" and i.public_ip else i.private_ip,
                      user=DLAMI_USER, identity=identity) for i in instances]
        wait_ready(nodes, ssh_opts=ssh_opts, timeout=timeout)

    return ready


def caller_cidr(timeout: float = 10) -> str:
    """This machine's public IPv4 address as a /32 (https://checkip.amazonaws.com), for --ssh-cidr."""
    import urllib.request

    try:
        with urllib.request.urlopen("https://checkip.amazonaws.com", timeout=timeout) as r:
            addr = ipaddress.IPv4Address(r.read().decode().strip())
    except (OSError, ValueError) as e:
        raise LaunchError(f"cannot tell this machine's public address ({e}); pass --ssh-cidr A.B.C.D/32") from None
    return f"{addr}/32"
