"""EC2 discovery (launch/targets/ec2.py, --ec2-tag): running instances with a tag, in moto."""

import re

import boto3
import pytest
from moto import mock_aws

from dtrain.launch.errors import LaunchError
from dtrain.launch.remote.hosts import Node
from dtrain.launch.targets import ec2 as provider
from dtrain.launch.targets.ec2 import discover_ec2


# --- EC2 -----------------------------------------------------------------------------------

REGION = "us-east-1"


@pytest.fixture
def aws_env(monkeypatch):
    for k in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_EC2"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # this machine: not an instance


def _launch(ec2, itype, ip, tags, *, subnet):
    r = ec2.run_instances(
        ImageId="ami-12345678",
        MinCount=1,
        MaxCount=1,
        InstanceType=itype,
        SubnetId=subnet,
        PrivateIpAddress=ip,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
    )
    return r["Instances"][0]["InstanceId"]


@pytest.fixture
def fleet(aws_env):
    with mock_aws():
        ec2 = boto3.client("ec2", region_name=REGION)
        vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/16")["Subnet"]["SubnetId"]
        job = {"dtrain": "exp1"}
        # Launch out of IP order; 10.0.0.10 must sort after 10.0.0.9 (numeric, not text).
        _launch(ec2, "g5.12xlarge", "10.0.0.10", job, subnet=subnet)
        _launch(ec2, "c5.xlarge", "10.0.1.5", job, subnet=subnet)
        _launch(ec2, "g5.12xlarge", "10.0.0.9", job, subnet=subnet)
        stopped = _launch(ec2, "g5.12xlarge", "10.0.0.3", job, subnet=subnet)
        ec2.stop_instances(InstanceIds=[stopped])
        _launch(ec2, "g5.12xlarge", "10.0.0.4", {"dtrain": "other"}, subnet=subnet)
        yield ec2


def test_discover_ec2_order_slots_filtering(fleet):
    assert discover_ec2("dtrain=exp1") == [
        Node("10.0.0.9", 4),  # g5.12xlarge: 4 GPUs
        Node("10.0.0.10", 4),
        Node("10.0.1.5", 1),  # c5.xlarge: no GPU, one process
    ]  # the stopped 10.0.0.3 and the other job's 10.0.0.4 are left out


def test_discover_ec2_slots_override_and_session(fleet):
    nodes = discover_ec2("dtrain=exp1", region=REGION, session=boto3.Session(), slots=2)
    assert [(n.host, n.slots) for n in nodes] == [("10.0.0.9", 2), ("10.0.0.10", 2), ("10.0.1.5", 2)]


def test_discover_ec2_honours_aws_endpoint_url(aws_env, monkeypatch):
    # Nothing is hard-coded: boto3 itself picks up AWS_ENDPOINT_URL (here a local moto server).
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
        ec2 = boto3.client("ec2", region_name=REGION)
        vpc = ec2.create_vpc(CidrBlock="10.1.0.0/16")["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.1.0.0/24")["Subnet"]["SubnetId"]
        _launch(ec2, "p4d.24xlarge", "10.1.0.20", {"dtrain": "remote"}, subnet=subnet)
        assert discover_ec2("dtrain=remote") == [Node("10.1.0.20", 8)]
    finally:
        server.stop()


def test_discover_ec2_uses_public_addresses_from_outside_the_vpc(aws_env):
    """Instances with public addresses (the default VPC's subnet maps them): from outside their
    VPC (a laptop: no metadata service) their public addresses, as `nodes up` chooses; from an
    instance in their VPC the private ones; one without a public address keeps its private one."""
    from dtrain.launch.infra.ec2 import Vantage

    with mock_aws():
        ec2 = boto3.client("ec2", region_name=REGION)
        for _ in range(2):
            ec2.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1, InstanceType="c5.xlarge",
                              TagSpecifications=[{"ResourceType": "instance",
                                                  "Tags": [{"Key": "dtrain:cluster", "Value": "train"}]}])
        found = ec2.describe_instances()["Reservations"]
        inst = sorted((i for r in found for i in r["Instances"]), key=lambda i: tuple(
            int(x) for x in i["PrivateIpAddress"].split(".")))
        assert all(i.get("PublicIpAddress") for i in inst)
        outside = discover_ec2("dtrain:cluster=train")
        assert [n.host for n in outside] == [i["PublicIpAddress"] for i in inst]
        inside = discover_ec2("dtrain:cluster=train", here=Vantage(vpc_id=inst[0]["VpcId"], private_ip="172.31.0.9"))
        assert [n.host for n in inside] == [i["PrivateIpAddress"] for i in inst]
    assert provider.reach_address({"PrivateIpAddress": "10.0.0.5", "VpcId": "vpc-1"}, None) == "10.0.0.5"


def test_discover_ec2_nothing_matches(fleet):
    with pytest.raises(LaunchError) as e:
        discover_ec2("dtrain=nope")
    assert str(e.value) == "no running EC2 instances tagged dtrain=nope in us-east-1"


def test_discover_ec2_bad_tag():
    with pytest.raises(LaunchError, match=re.escape("--ec2-tag: expected KEY=VALUE, got 'dtrain'")):
        discover_ec2("dtrain")


def test_discover_ec2_no_credentials(monkeypatch, tmp_path):
    for k in (
        "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE",
    ):  # fmt: skip
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(LaunchError, match=r"^no AWS credentials found: set AWS_PROFILE"):
        discover_ec2("dtrain=exp1", region=REGION)


def test_discover_ec2_unknown_profile(monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_PROFILE", "does-not-exist")
    with pytest.raises(LaunchError, match="^AWS profile not found: .*does-not-exist"):
        discover_ec2("dtrain=exp1", region=REGION)


class _NoGpuInfo:
    """An EC2 client whose DescribeInstanceTypes lacks GpuInfo, or is denied."""

    def __init__(self, real, denied=False):
        self._real, self._denied = real, denied

    def __getattr__(self, name):
        return getattr(self._real, name)

    def describe_instance_types(self, **kw):
        if self._denied:
            from botocore.exceptions import ClientError

            raise ClientError(
                {"Error": {"Code": "UnauthorizedOperation", "Message": "not allowed"}}, "DescribeInstanceTypes"
            )
        out = self._real.describe_instance_types(**kw)
        for t in out["InstanceTypes"]:
            t.pop("GpuInfo", None)
        return out


class _Session:
    def __init__(self, client):
        self._client = client

    def client(self, service, region_name=None):
        return self._client


def test_discover_ec2_falls_back_to_the_snapshot(fleet):
    # DescribeInstanceTypes without GpuInfo: the shipped snapshot of it answers (g5.12xlarge: 4).
    nodes = discover_ec2("dtrain=exp1", session=_Session(_NoGpuInfo(fleet)))
    assert [(n.host, n.slots) for n in nodes] == [("10.0.0.9", 4), ("10.0.0.10", 4), ("10.0.1.5", 1)]


def test_discover_ec2_denied_type_lookup(fleet):
    # Denied: a type in the snapshot still works (c5.xlarge: no GPU, one slot); one it lacks is
    # an error, not a silent 1.
    session = _Session(_NoGpuInfo(fleet, denied=True))
    assert [n.slots for n in discover_ec2("dtrain=exp1", session=session)] == [4, 4, 1]
    subnet = fleet.describe_subnets(Filters=[{"Name": "cidr-block", "Values": ["10.0.0.0/16"]}])["Subnets"][0]["SubnetId"]
    _launch(fleet, "m7i.large", "10.0.2.7", {"dtrain": "exp2"}, subnet=subnet)
    with pytest.raises(LaunchError) as e:
        discover_ec2("dtrain=exp2", session=session)
    assert str(e.value) == (
        "cannot tell how many GPUs a m7i.large has "
        "(DescribeInstanceTypes failed: UnauthorizedOperation: not allowed; it is not in dtrain's instance-type "
        "data either); pass slots explicitly"
    )
    assert [n.slots for n in discover_ec2("dtrain=other", session=session)] == [4]


def test_snapshot_gpu_counts():
    # What the 17-entry hand table said, now read from EC2's DescribeInstanceTypes snapshot, and
    # the types it lacked.
    assert provider.gpu_count("p4d.24xlarge") == 8
    assert provider.gpu_count("p5.48xlarge") == 8
    assert provider.gpu_count("g4dn.12xlarge") == 4
    assert provider.gpu_count("p3.8xlarge") == 4
    assert provider.gpu_count("p5en.48xlarge") == 8
    assert provider.gpu_count("g6e.12xlarge") == 4
    assert provider.gpu_count("c5.xlarge") == 0
    assert provider.gpu_count("m7i.large") is None