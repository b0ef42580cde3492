"""EC2: running instances with a tag (--ec2-tag KEY=VALUE), or a cluster `dtrain nodes up` made
(--cluster NAME: its stack, launch/infra/ec2.py, and the hostfile it wrote). Each node polls the
instance metadata service for a spot interruption notice; an ECR image is pulled with a token
fetched here; the instance type tells the GPUs and EFA interfaces."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from typing import Any

from dtrain import contract
from dtrain import values
from dtrain.launch.errors import LaunchError
from dtrain.launch.infra import ec2 as stack
from dtrain.launch.infra.instance_types import gpu_count
from dtrain.launch.jobs.login import Login, login_for
from dtrain.launch.jobs.supervision import EC2_IMDS
from dtrain.launch.remote.hosts import Node
from dtrain.launch.jobs.jobfile import selecting
from dtrain.launch.targets.base import NodeArgs, NodeProvider
from dtrain.launch.targets.ssh import hostfile_nodes


def _parse_tag(tag: str) -> tuple[str, str]:
    key, eq, value = tag.partition("=")
    if not eq or not key or not value:
        raise LaunchError(f"--ec2-tag: expected KEY=VALUE, got {tag!r}")
    return key, value


def _gpu_count(type_info: dict[str, Any]) -> int | None:
    """GPUs of one DescribeInstanceTypes entry; None when it carries no GpuInfo."""
    gpus = (type_info.get("GpuInfo") or {}).get("Gpus") or []
    return sum(int(g.get("Count", 0)) for g in gpus) or None


def _slots_by_type(ec2: Any, types: list[str]) -> dict[str, int]:
    """GPUs per instance type: API first, then dtrain's DescribeInstanceTypes snapshot
    (launch/infra/instance_types.py); CPU types get 1 slot."""
    from botocore.exceptions import ClientError

    found: dict[str, int | None] = {}
    api_error: str | None = None
    try:
        for i in range(0, len(types), 100):  # the API takes at most 100 types per call
            for info in ec2.describe_instance_types(InstanceTypes=types[i : i + 100])["InstanceTypes"]:
                found[info["InstanceType"]] = _gpu_count(info)
    except ClientError as e:
        api_error = f"{e.response['Error'].get('Code')}: {e.response['Error'].get('Message')}"
    slots: dict[str, int] = {}
    for t in types:
        count = found.get(t) or gpu_count(t)
        if count is None and api_error is not None:
            raise LaunchError(
                f"cannot tell how many GPUs a {t} has (DescribeInstanceTypes failed: {api_error}; it is not in "
                "dtrain's instance-type data either); pass slots explicitly"
            )
        slots[t] = count or 1  # the API answered and lists no GPU: a CPU type, one process
    return slots


def reach_address(instance: dict[str, Any], here: stack.Vantage | None) -> str:
    """The address this machine reaches an instance at, as `nodes up --address auto` chooses
    (pure): private where this machine is in the instance's VPC, or where the instance has no
    public address (a VPN, a peering, a bastion); its public address otherwise (a laptop)."""
    inside = here is not None and here.vpc_id == instance.get("VpcId")
    public = instance.get("PublicIpAddress")
    return instance["PrivateIpAddress"] if inside or not public else public


_HERE_UNKNOWN = object()


def discover_ec2(
    tag: str,
    region: str | None = None,
    session: Any = None,
    *,
    slots: int | None = None,
    here: Any = _HERE_UNKNOWN,
) -> list[Node]:
    """Running EC2 instances tagged KEY=VALUE, as Nodes in private-IP order, each at the
    address this machine reaches it at (reach_address; here: where this machine is, found
    from the instance metadata service when not given).

    slots: per-node override; otherwise the instance type's GPU count (CPU types: 1).
    session: a boto3.Session; None builds a default one, so AWS_PROFILE, AWS_REGION and
    AWS_ENDPOINT_URL apply as boto3 reads them.
    """
    import boto3
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        NoCredentialsError,
        NoRegionError,
        ProfileNotFound,
    )

    key, value = _parse_tag(tag)
    if slots is not None and (isinstance(slots, bool) or slots < 1):
        raise LaunchError(f"slots must be > 0, got {slots!r}")
    try:
        session = session or boto3.Session()
        ec2 = session.client("ec2", region_name=region)
        pages = ec2.get_paginator("describe_instances").paginate(
            Filters=[
                {"Name": f"tag:{key}", "Values": [value]},
                {"Name": "instance-state-name", "Values": ["running"]},
            ]
        )
        instances = [i for page in pages for r in page["Reservations"] for i in r["Instances"]]
        instances = [i for i in instances if i.get("PrivateIpAddress")]
        if not instances:
            raise LaunchError(f"no running EC2 instances tagged {key}={value} in {ec2.meta.region_name}")
        per_type = {} if slots else _slots_by_type(ec2, sorted({i["InstanceType"] for i in instances}))
    except NoCredentialsError:
        raise LaunchError(
            "no AWS credentials found: set AWS_PROFILE (then `aws sso login` if it is an SSO profile), "
            "run `aws configure`, or export AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
        ) from None
    except NoRegionError:
        raise LaunchError("no AWS region: pass a region, or set AWS_REGION or region in your AWS profile") from None
    except ProfileNotFound as e:
        raise LaunchError(f"AWS profile not found: {e}") from None
    except ClientError as e:
        err = e.response.get("Error", {})
        raise LaunchError(f"EC2 {e.operation_name} failed: {err.get('Code')}: {err.get('Message')}") from None
    except BotoCoreError as e:
        raise LaunchError(f"EC2 discovery failed: {e}") from None

    instances.sort(key=lambda i: ipaddress.ip_address(i["PrivateIpAddress"]))
    if here is _HERE_UNKNOWN:
        here = stack.vantage()
    # `nodes up` tags its instances with their AMI's ssh user (ubuntu, ec2-user)
    return [Node(host=reach_address(i, here), slots=slots or per_type[i["InstanceType"]],
                 user={t["Key"]: t["Value"] for t in i.get("Tags", [])}.get(contract.SSH_USER_TAG))
            for i in instances]


def cluster_nodes(name: str) -> list[Node]:
    """The nodes of `dtrain nodes up --name NAME`: the hostfile it wrote here."""
    values.name("--cluster", name)
    try:
        path = stack.cluster_hostfile(name)
    except LaunchError as missing:
        from dtrain.launch.infra import fleet

        raise (fleet.standing_stack(name) or missing) from None  # a kept stack: what to do with it
    return hostfile_nodes(str(path))


class Ec2(NodeProvider):
    name = "ec2"
    flags = selecting("ec2")  # the launch fields that choose it: the model's (jobfile.py)
    spot_notice = EC2_IMDS  # each node's supervisor polls it (launch/node/watch.sh)

    def discover(self, args: NodeArgs) -> list[Node]:
        if args.cluster:
            return cluster_nodes(args.cluster)
        return discover_ec2(args.ec2_tag or "", args.region, slots=args.slots)

    def ssh_user(self) -> str | None:
        return None  # per node: the SSH_USER_TAG `nodes up` put on each instance (ubuntu, ec2-user)

    def ssh_opts(self, args: NodeArgs) -> tuple[str, ...]:
        """What `nodes up --ssh-opt` recorded for --cluster (a ProxyJump to a bastion)."""
        if args.cluster and os.path.lexists(stack.cluster_dir(args.cluster) / "cluster.json"):  # damaged: said
            return tuple(stack.load_cluster(args.cluster).ssh_opts)
        return ()

    def joining(self, args: NodeArgs) -> Callable[[], list[Node]] | None:
        """A cluster of `nodes up` (its record): its hostfile after following its Auto Scaling
        group (stack.follow_cluster: a node the group brought back, with its address)."""
        if not args.cluster or not (stack.cluster_dir(args.cluster) / "cluster.json").exists():
            return None
        name = args.cluster

        def now() -> list[Node]:
            import boto3

            stack.follow_cluster(boto3.Session(region_name=stack.load_cluster(name).region), name, say=lambda _: None)
            return cluster_nodes(name)

        return now

    def up(self, spec: stack.NodesSpec, **options: Any) -> tuple[stack.Cluster, Any]:
        """A cluster's stack (launch/infra/ec2.py `up`): options are its session and the rest."""
        session = options.pop("session")
        return stack.up(session, spec, **options)

    def down(self, name: str | None = None, **options: Any) -> Any:
        session = options.pop("session")
        return stack.delete_stack(session, name or "", **options)

    def login(self, image: str) -> Login:
        return login_for(image)  # ECR: a token from boto3, to each node on stdin


PROVIDER = Ec2()
