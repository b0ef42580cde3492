"""`invoke nodes`: the generated CloudFormation template (cfn-lint), and the stack deployed
against moto's CloudFormation, EC2 and Auto Scaling APIs: create, partial capacity, delete,
and every bad input refused before anything is created."""

from __future__ import annotations

import base64
import dataclasses
import json
import shutil
import re
import subprocess
import sys
import tomllib

import boto3
import cfnlint.api
import pytest
from moto import mock_aws

from dtrain import ROOT
from dtrain.launch.errors import LaunchError
from dtrain.launch.infra import cluster, ec2
from dtrain.launch.infra import instance_types
from dtrain.launch.remote.hosts import parse_hostfile
from dtrain.launch.targets.ec2 import discover_ec2

REGION = "us-east-1"
AMI_PARAM = "/dtrain-test/dlami"  # moto reserves /aws/...; the real default is ec2.DLAMI_PARAMETER
CIDR = "203.0.113.7/32"


@pytest.fixture
def aws(monkeypatch, tmp_path):
    monkeypatch.setenv("DTRAIN_HOME", str(tmp_path / "home"))
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with mock_aws():
        session = boto3.Session(region_name=REGION)
        session.client("ssm").put_parameter(Name=AMI_PARAM, Value="ami-dca37ea5", Type="String")
        yield session


def spec(**kw) -> ec2.NodesSpec:
    base = dict(name="c1", count=3, instance_type="g5.12xlarge", ssh_cidr=CIDR, ami=AMI_PARAM)
    return ec2.NodesSpec(**{**base, **kw})


def quiet(_msg: str) -> None:
    pass


def stacks(session) -> list[str]:
    return [s["StackName"] for s in session.client("cloudformation").describe_stacks()["Stacks"]
            if s["StackStatus"] != "DELETE_COMPLETE"]


def running(session) -> list[dict]:
    """Instances not terminated (running, pending, stopped)."""
    res = session.client("ec2").describe_instances(
        Filters=[{"Name": "instance-state-name", "Values": ["running", "pending", "stopped"]}])["Reservations"]
    return [i for r in res for i in r["Instances"]]


# --- template ------------------------------------------------------------------------------


RESOLVED = {
    "efa": ec2.Resolved(efa=True, nitro=True, gpus=4, vpc_id=None, subnet_id=None, availability_zone=None),
    "plain": ec2.Resolved(efa=False, nitro=True, gpus=1, vpc_id="vpc-0123456789abcdef0",
                          subnet_id="subnet-0123456789abcdef0", availability_zone="us-east-1a"),
}


@pytest.mark.parametrize("case", ["new-vpc-efa-spot-efs", "subnet-plain-key", "lazy", "lazy-efs"])
def test_template_passes_cfn_lint(case):
    if case.startswith("new-vpc"):
        s, res = spec(new_vpc=True, spot=True, efs=True), RESOLVED["efa"]
    elif case.startswith("lazy"):
        s, res = spec(new_vpc=True, lazy=True, efs=case == "lazy-efs"), RESOLVED["efa"]
    else:
        s, res = spec(instance_type="c5.xlarge", subnet="subnet-0123456789abcdef0", key_name="k"), RESOLVED["plain"]
    matches = cfnlint.api.lint(json.dumps(ec2.stack_template(s, res), indent=1),
                               config=cfnlint.api.ManualArgs(regions=[REGION]))
    assert [str(m) for m in matches] == []


def test_cfn_lint_catches_a_broken_template():
    t = ec2.stack_template(spec(), RESOLVED["plain"])
    t["Resources"]["Nodes"]["Properties"]["MaxSize"] = {"Ref": "NoSuchParameter"}
    matches = cfnlint.api.lint(json.dumps(t), config=cfnlint.api.ManualArgs(regions=[REGION]))
    assert any("NoSuchParameter" in str(m) for m in matches)


def test_template_content():
    t = ec2.stack_template(spec(new_vpc=True, spot=True), RESOLVED["efa"])
    r = t["Resources"]
    data = r["LaunchTemplate"]["Properties"]["LaunchTemplateData"]
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["InstanceMarketOptions"]["MarketType"] == "spot"
    assert data["NetworkInterfaces"][0]["InterfaceType"] == "efa"
    assert data["UserData"] == {"Fn::Base64": (ROOT / "launch/node/first-boot.sh").read_text()}
    # preflight resolved --ami (an SSM parameter, an alias or an id) to the id in the template
    assert t["Parameters"]["AmiId"] == {"Type": "AWS::EC2::Image::Id", "Default": RESOLVED["efa"].ami_id,
                                        "Description": f"the nodes' AMI (--ami {AMI_PARAM})"}
    assert ec2.DLAMI_PARAMETER.startswith("/aws/service/deeplearning/ami/")
    sg = {"Fn::GetAtt": ["SecurityGroup", "GroupId"]}
    assert r["SelfEgress"]["Properties"]["DestinationSecurityGroupId"] == sg  # EFA's rule
    assert r["SelfIngress"]["Properties"]["SourceSecurityGroupId"] == sg
    assert r["PlacementGroup"]["Properties"]["Strategy"] == "cluster"
    assert r["Nodes"]["Properties"]["PlacementGroup"] == {"Ref": "PlacementGroup"}
    plain = ec2.stack_template(spec(instance_type="c5.xlarge", subnet="subnet-0123456789abcdef0"), RESOLVED["plain"])
    lt = plain["Resources"]["LaunchTemplate"]["Properties"]["LaunchTemplateData"]
    assert "InterfaceType" not in lt["NetworkInterfaces"][0] and "InstanceMarketOptions" not in lt
    assert "Vpc" not in plain["Resources"] and "FileSystem" not in plain["Resources"]


def test_root_volumes_are_encrypted():
    for s, res in ((spec(new_vpc=True, spot=True, efs=True), RESOLVED["efa"]),
                   (spec(instance_type="c5.xlarge", subnet="subnet-0123456789abcdef0"), RESOLVED["plain"])):
        data = ec2.stack_template(s, res)["Resources"]["LaunchTemplate"]["Properties"]["LaunchTemplateData"]
        assert data["BlockDeviceMappings"] == [{"DeviceName": res.root_device, "Ebs": {
            "Encrypted": True, "VolumeType": "gp3", "VolumeSize": res.root_size, "DeleteOnTermination": True}}]


def test_ssh_open_to_the_world_is_warned_about(aws):
    said: list[str] = []
    ec2.start(aws, spec(ssh_cidr="0.0.0.0/0", count=1), say=said.append)
    assert any(m.startswith("[nodes] warning: --ssh-cidr 0.0.0.0/0 opens the nodes' ssh") for m in said), said
    assert ec2.ssh_cidr_warning("::/0") and ec2.ssh_cidr_warning(CIDR) is None
    assert ec2.ssh_cidr_warning("10.0.0.0/8") is None
    lt = aws.client("ec2").describe_launch_template_versions(LaunchTemplateName="dtrain-c1")
    [mapping] = lt["LaunchTemplateVersions"][0]["LaunchTemplateData"]["BlockDeviceMappings"]
    assert mapping["Ebs"]["Encrypted"] is True  # what CloudFormation made of it


def test_capacity_decision():
    assert ec2.capacity_decision(4, 2, 4) == "all"
    assert ec2.capacity_decision(4, 2, 3) == "partial"
    assert ec2.capacity_decision(4, 2, 2) == "partial"
    assert ec2.capacity_decision(4, 2, 1) == "rollback"
    assert ec2.capacity_decision(4, 4, 3) == "rollback"


def test_doctor_reads_efa_from_the_instance_type_data():
    from dtrain.launch.troubleshoot import doctor

    assert doctor.efa_count is instance_types.efa_count
    assert doctor.efa_verdict("p5en.48xlarge", 16)[0] == "PASS"  # not in the old hand table
    assert doctor.efa_verdict("p5en.48xlarge", 0)[0] == "FAIL"
    status, detail = doctor.efa_verdict("m7i.large", 0)  # not in the data: said, not "not an EFA type"
    assert status == "PASS" and "m7i.large is not in dtrain's instance-type data" in detail


# --- deployed against moto -------------------------------------------------------------------


def test_up_default_vpc_then_down_leaves_nothing(aws):
    cluster, hostfile = ec2.up(aws, spec(key_name=None, spot=True), identity="/k/id", poll=0.05, timeout=5, say=quiet)
    assert stacks(aws) == ["dtrain-c1"]
    nodes = parse_hostfile(hostfile)
    assert len(nodes) == 3 and all(n.slots == 4 and n.user == "ubuntu" and n.identity == "/k/id" for n in nodes)
    # the launcher's --ec2-tag finds the same nodes: at their private addresses from inside their
    # VPC (as this hostfile), at their public ones from outside (a laptop), as nodes up chooses
    inside = ec2.Vantage(vpc_id=aws.client("ec2").describe_vpcs()["Vpcs"][0]["VpcId"], private_ip="172.31.0.9")
    found = discover_ec2(f"{ec2.CLUSTER_TAG}=c1", session=aws, here=inside)
    assert [n.host for n in found] == [n.host for n in nodes]
    outside = discover_ec2(f"{ec2.CLUSTER_TAG}=c1", session=aws)
    assert all(i.public_ip for i in cluster.instances)
    assert [n.host for n in outside] == [i.public_ip for i in cluster.instances]
    assert ec2.cluster_hostfile("c1") == hostfile
    assert ec2.load_cluster("c1") == cluster and cluster.nitro
    lts = aws.client("ec2").describe_launch_template_versions(LaunchTemplateName="dtrain-c1")
    data = lts["LaunchTemplateVersions"][0]["LaunchTemplateData"]
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["InstanceMarketOptions"]["MarketType"] == "spot"
    assert data["NetworkInterfaces"][0]["InterfaceType"] == "efa"  # g5.12xlarge has EFA
    assert base64.b64decode(data["UserData"]).decode() == ec2.FIRST_BOOT.read_text()
    sg = aws.client("ec2").describe_security_groups(GroupIds=[cluster.security_group])["SecurityGroups"][0]
    perms = sg["IpPermissions"]
    assert any(p.get("FromPort") == 22 and [r["CidrIp"] for r in p["IpRanges"]] == [CIDR]
               for p in perms)
    assert any(p["IpProtocol"] == "-1" and p["UserIdGroupPairs"] for p in perms)  # all among members
    assert ec2.list_clusters(aws) == [("c1", "CREATE_COMPLETE")]

    ec2.delete_stack(aws, "c1", poll=0.05)
    assert stacks(aws) == [] and running(aws) == []
    assert aws.client("autoscaling").describe_auto_scaling_groups()["AutoScalingGroups"] == []
    assert aws.client("ec2").describe_launch_templates()["LaunchTemplates"] == []
    assert [g["GroupName"] for g in aws.client("ec2").describe_security_groups()["SecurityGroups"]] == ["default"]
    assert not ec2.cluster_dir("c1").exists()
    with pytest.raises(LaunchError, match="no such cluster"):
        ec2.load_cluster("c1")
    # a second `nodes down` (or a typo) is an error naming the stack, not "deleted"
    with pytest.raises(LaunchError, match="no stack dtrain-c1 in region"):
        ec2.delete_stack(aws, "c1", poll=0.05)
    with pytest.raises(LaunchError, match="no stack dtrain-c1x"):
        ec2.delete_stack(aws, "c1x", poll=0.05)


def test_up_new_vpc_with_efs(aws):
    cluster, _ = ec2.up(aws, spec(new_vpc=True, efs=True, count=2, instance_type="c5.xlarge"),
                        poll=0.05, timeout=5, say=quiet)
    assert len(cluster.instances) == 2 and cluster.slots == 1 and cluster.file_system
    vpcs = aws.client("ec2").describe_vpcs(Filters=[{"Name": "cidr", "Values": ["10.0.0.0/16"]}])["Vpcs"]
    assert len(vpcs) == 1 and all(i.private_ip.startswith("10.0.") for i in cluster.instances)
    lt = aws.client("ec2").describe_launch_template_versions(LaunchTemplateName="dtrain-c1")
    assert lt["LaunchTemplateVersions"][0]["LaunchTemplateData"]["NetworkInterfaces"][0]["AssociatePublicIpAddress"]
    targets = aws.client("efs").describe_mount_targets(FileSystemId=cluster.file_system)["MountTargets"]
    assert len(targets) == 1
    # (moto leaves a terminated instance's network interfaces behind, so deleting a new VPC's
    # stack fails there with DependencyViolation; the default-VPC test above covers delete.)


def test_partial_capacity_continues_with_what_started(aws):
    s = spec(count=4, min_count=2)
    res = ec2.start(aws, s, say=quiet)
    ids = sorted(i["InstanceId"] for i in running(aws))
    # 2 of 4 do not run (moto's group replaces terminated instances at once; stopped ones are
    # to the cluster what instances that never started are: not running)
    aws.client("ec2").stop_instances(InstanceIds=ids[:2])
    said: list[str] = []
    cluster, hostfile = ec2.finish(aws, s, res, poll=0.05, timeout=0.5, say=said.append)
    assert len(cluster.instances) == 2 and len(parse_hostfile(hostfile)) == 2
    assert any("partial capacity: 2 of 4" in m for m in said)
    group = aws.client("autoscaling").describe_auto_scaling_groups()["AutoScalingGroups"][0]
    assert group["DesiredCapacity"] == 2 and group["MinSize"] == 2
    assert stacks(aws) == ["dtrain-c1"]


def test_below_min_count_rolls_back(aws):
    # --subnet pins the zone (tests/test_nodes_zones.py: without it, the next zone is tried)
    sub = aws.client("ec2").describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"]
    sub = min(sub, key=lambda x: x["AvailabilityZone"])
    s = spec(count=3, min_count=2, subnet=sub["SubnetId"])
    res = ec2.start(aws, s, say=quiet)
    ids = sorted(i["InstanceId"] for i in running(aws))
    aws.client("ec2").stop_instances(InstanceIds=ids[:2])
    zone = sub["AvailabilityZone"]
    with pytest.raises(LaunchError, match=rf"^only 1 of 3 instances started in {zone} \(--min-count 2\); not moved "
                                          rf"to another zone: --subnet {sub['SubnetId']} is in {zone}; rolled back"):
        ec2.finish(aws, s, res, poll=0.05, timeout=0.5, say=quiet)
    assert stacks(aws) == [] and running(aws) == []
    assert not (ec2.cluster_dir("c1") / "hostfile").exists()


def test_ready_failure_rolls_back(aws):
    def not_ready(_instances):
        raise LaunchError("2 node(s) not ready (ssh + docker)")

    with pytest.raises(LaunchError, match="not ready"):
        ec2.up(aws, spec(count=2), ready=not_ready, poll=0.05, timeout=5, say=quiet)
    assert stacks(aws) == [] and running(aws) == []


def _no_default_vpc(session):
    c = session.client("ec2")
    vpc = c.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    for sub in c.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"]:
        c.delete_subnet(SubnetId=sub["SubnetId"])
    for igw in c.describe_internet_gateways()["InternetGateways"]:
        c.detach_internet_gateway(InternetGatewayId=igw["InternetGatewayId"], VpcId=vpc)
        c.delete_internet_gateway(InternetGatewayId=igw["InternetGatewayId"])
    c.delete_vpc(VpcId=vpc)


@pytest.mark.parametrize("kw, setup, message", [
    ({"instance_type": "p9.huge"}, None, r"^--instance-type p9.huge: no such instance type in us-east-1"),
    ({"key_name": "missing"}, None, r"^--key-name missing: no such key pair in us-east-1"),
    ({"subnet": "subnet-0000000000000000f"}, None, r"^--subnet subnet-0000000000000000f: no such subnet"),
    ({}, _no_default_vpc, r"^no default VPC in us-east-1: pass --subnet SUBNET-ID or --new-vpc$"),
])
def test_bad_input_is_refused_before_anything_is_created(aws, kw, setup, message):
    if setup:
        setup(aws)
    with pytest.raises(LaunchError, match=message) as e:
        ec2.up(aws, spec(**kw), poll=0.05, timeout=5, say=quiet)
    assert "\n" not in str(e.value)
    assert stacks(aws) == [] and running(aws) == []


def test_existing_cluster_name_is_refused(aws):
    ec2.up(aws, spec(count=1), poll=0.05, timeout=5, say=quiet)
    with pytest.raises(LaunchError, match="^--name c1: cluster exists"):
        ec2.up(aws, spec(count=1), poll=0.05, timeout=5, say=quiet)
    assert len(running(aws)) == 1


@pytest.mark.parametrize("kw, message", [
    ({"name": "1bad"}, "--name '1bad'"), ({"count": 0}, "--count 0"), ({"min_count": 5}, "--min-count 5"),
    ({"ssh_cidr": "me"}, "--ssh-cidr 'me'"), ({"subnet": "subnet-1", "new_vpc": True}, "not both"),
])
def test_bad_flags(kw, message):
    with pytest.raises(LaunchError, match=message):
        spec(**kw)


def test_hostfile_public_addresses():
    inst = (ec2.Instance("i-1", "10.0.0.5", "198.51.100.5", "us-east-1a", "c5.xlarge"),
            ec2.Instance("i-2", "10.0.0.6", None, "us-east-1a", "c5.xlarge"))
    c = ec2.Cluster(name="c", region=REGION, stack="dtrain-c", instance_type="c5.xlarge", nitro=True, slots=1,
                    user="ubuntu", identity=None, instances=inst)
    assert ec2.hostfile_text(c, "public").splitlines()[1:] == ["198.51.100.5 slots=1 user=ubuntu",
                                                              "10.0.0.6 slots=1 user=ubuntu"]


# --- the CLI: one-line errors, exit 2, nothing created; launch --cluster ----------------------


@pytest.fixture
def moto_server(monkeypatch, tmp_path):
    import socket

    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=url, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
               AWS_DEFAULT_REGION=REGION, AWS_SHARED_CREDENTIALS_FILE="/nonexistent",
               AWS_CONFIG_FILE="/nonexistent", AWS_EC2_METADATA_DISABLED="true", DTRAIN_HOME=str(tmp_path / "home"))
    yield url, env
    server.stop()


def invoke(env, *args):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=root, capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(root)}, timeout=120)


def test_cli_bad_instance_type_is_one_line_and_creates_nothing(moto_server):
    url, env = moto_server
    r = invoke(env, "nodes", "up", "--name", "c1", "--count", "2", "--instance-type", "p9.huge",
               "--ssh-cidr", CIDR)
    assert r.returncode == 2 and r.stderr == "error: --instance-type p9.huge: no such instance type in us-east-1 " \
        "(see `aws ec2 describe-instance-types`)\n", r.stderr
    s = boto3.Session(region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing")
    assert s.client("cloudformation", endpoint_url=url).describe_stacks()["Stacks"] == []
    r = invoke(env, "nodes", "list")
    assert r.returncode == 0 and r.stdout.startswith("no clusters (no dtrain stack in region ")


def test_cli_multi_efa_without_elastic_ips_left_is_one_line_and_creates_nothing(moto_server):
    url, env = moto_server
    s = boto3.Session(region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing")
    for _ in range(4):  # of the region's 5 (moto's vpc-max-elastic-ips)
        s.client("ec2", endpoint_url=url).allocate_address(Domain="vpc")
    r = invoke(env, "nodes", "up", "--name", "c1", "--count", "2", "--instance-type", "p4d.24xlarge",
               "--ssh-cidr", CIDR, "--ami", "ami-dca37ea5", "--address", "private")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: --count 2: p4d.24xlarge's nodes each need an Elastic IP") and \
        "--efa-interfaces 1" in r.stderr, r.stderr
    assert len(s.client("ec2", endpoint_url=url).describe_addresses()["Addresses"]) == 4
    r = invoke(env, "nodes", "up", "--name", "c1", "--count", "2", "--instance-type", "p4d.24xlarge",
               "--ssh-cidr", CIDR, "--efa-interfaces", "four")
    assert r.returncode == 2 and r.stderr == "error: --efa-interfaces 'four': expected a whole number from 1 to 64\n"
    s = boto3.Session(region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing")
    assert s.client("cloudformation", endpoint_url=url).describe_stacks()["Stacks"] == []


def test_launch_cluster_uses_the_clusters_hostfile(moto_server, tmp_path, monkeypatch):
    import tasks

    _, env = moto_server
    d = tmp_path / "home" / "clusters" / "c9"
    d.mkdir(parents=True)
    (d / "hostfile").write_text("10.0.0.5 slots=2 user=ubuntu\n10.0.0.6 slots=2 user=ubuntu\n")
    monkeypatch.setenv("DTRAIN_HOME", str(tmp_path / "home"))
    key = tmp_path / "id"  # --ssh-key must be a file here
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nx\n-----END OPENSSH PRIVATE KEY-----\n")
    nodes = tasks._nodes({"ssh_key": str(key), "cluster": "c9"})
    assert [(n.host, n.slots, n.user, n.identity) for n in nodes] == \
        [("10.0.0.5", 2, "ubuntu", str(key)), ("10.0.0.6", 2, "ubuntu", str(key))]
    r = invoke(env, "launch", "--cluster", "c9", "--hostfile", str(d / "hostfile"), "--image", "img", "--", "true")
    assert r.returncode == 2 and "give --cluster or one of --hostfile" in r.stderr
    r = invoke(env, "launch", "--cluster", "nope", "--image", "img", "--", "true")
    assert r.returncode == 2 and r.stderr.startswith("error: --cluster nope: no hostfile at ")


# --- waiting for ssh + docker, on the simulated cluster's real sshd and dockerd -------------


@pytest.mark.cluster
def test_wait_ready_on_real_nodes(cluster, nic_down):
    nodes = parse_hostfile(cluster.hostfile)
    ec2.wait_ready(nodes, ssh_opts=("-F", cluster.ssh_config), timeout=60, say=quiet)
    with nic_down(3) as gone, pytest.raises(
            LaunchError, match=rf"^1 node\(s\) not ready \(ssh \+ docker\) after 1s: {re.escape(gone)}: "):
        ec2.wait_ready(nodes, ssh_opts=("-F", cluster.ssh_config), timeout=1, say=quiet)


# a stand-in apt-get: `update` refreshes the lists (when apt works at all); `install` needs them
APT = """#!/bin/bash
echo "${*:4}" >> "$LOG"
[ "$BROKEN" = 0 ] || exit 100
[ "$4" = update ] && : > "$LISTS" && exit 0  # builtins only: PATH holds the stand-ins alone
[ -e "$LISTS" ] || exit 100
"""


@pytest.mark.parametrize("have_unpigz, lists, broken, calls", [
    (True, False, 0, ""),                                            # the AMI has it: nothing to do
    (False, True, 0, "install -y pigz\n"),
    (False, False, 0, "install -y pigz\nupdate\ninstall -y pigz\n"),  # stale lists: update, again
    (False, False, 1, "install -y pigz\nupdate\n"),                   # no apt mirror: boot anyway
])
def test_first_boot_installs_pigz_and_never_fails_the_boot(tmp_path, have_unpigz, lists, broken, calls):
    """launch/node/first-boot.sh (every node's user data) with a stand-in apt-get that records
    its arguments: the real one would change this machine."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "apt-get").write_text(APT)
    if have_unpigz:
        (bin_ / "unpigz").write_text("#!/bin/sh\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    if lists:
        (tmp_path / "lists").touch()
    log = tmp_path / "apt.log"
    # only the stand-ins on PATH: this machine's own unpigz must not count
    env = {"PATH": str(bin_), "LOG": str(log), "LISTS": str(tmp_path / "lists"), "BROKEN": str(broken)}
    r = subprocess.run(["/bin/bash", str(ec2.FIRST_BOOT)], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert (log.read_text() if log.exists() else "") == calls


def test_nodes_cli_list_empty_and_down_typo(aws, monkeypatch, capsys):
    """`nodes list` with no cluster says so; `nodes down --name typo` is an error naming the
    stack (exit 2), not "deleted" (moto: no stack exists)."""
    from invoke import Context

    import tasks

    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    tasks.nodes(Context(), "list")
    assert capsys.readouterr().out.strip() == f"no clusters (no dtrain stack in region {REGION})"
    with pytest.raises(SystemExit) as exc:
        tasks.nodes(Context(), "down", name="typo")
    out = capsys.readouterr()
    assert exc.value.code == 2 and "deleted" not in out.out
    assert out.err.strip() == (f"error: nodes down --name typo: nothing to delete: no stack dtrain-typo in region "
                               f"{REGION}; "
                               "`dtrain nodes list` shows the clusters")


# --- every EFA the type has (one per network card) -------------------------------------------


def _type_info(session, instance_type: str) -> dict:
    """moto's DescribeInstanceTypes entry (its instance data mirrors AWS's, NetworkCards included)."""
    return session.client("ec2").describe_instance_types(InstanceTypes=[instance_type])["InstanceTypes"][0]


def _private_subnet(session) -> str:
    c = session.client("ec2")
    vpc = c.create_vpc(CidrBlock="10.40.0.0/16")["Vpc"]["VpcId"]
    return c.create_subnet(VpcId=vpc, CidrBlock="10.40.0.0/20", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]


# type -> (EFA interfaces, interfaces): g5.xlarge has no EFA (one plain interface), g5.12xlarge one.
EFA_LAYOUTS = {"p4d.24xlarge": (4, 4), "p5.48xlarge": (32, 32), "g5.12xlarge": (1, 1), "g5.xlarge": (0, 1)}


@pytest.mark.parametrize("itype", sorted(EFA_LAYOUTS))
def test_efa_layout_from_describe_instance_types(aws, itype):
    info = _type_info(aws, itype)
    efas, total = EFA_LAYOUTS[itype]
    assert (info["NetworkInfo"].get("EfaInfo") or {}).get("MaximumEfaInterfaces", 0) == efas  # moto's data
    layout = ec2.network_interfaces(info)
    assert len(layout) == total
    assert sum(i.get("InterfaceType", "interface").startswith("efa") for i in layout) == efas
    assert layout[0]["DeviceIndex"] == 0 and layout[0].get("NetworkCardIndex", 0) == 0
    if efas:
        assert layout[0]["InterfaceType"] == "efa"  # ENA + EFA: the node's address
    else:
        assert "InterfaceType" not in layout[0]
    if total > 1:  # AWS's multi-card layout: card i, device 1, one interface per card
        assert [i["NetworkCardIndex"] for i in layout] == list(range(total))
        assert all(i["DeviceIndex"] == 1 and i["InterfaceType"] == "efa-only" for i in layout[1:])
    assert ec2.network_interfaces(info, 1) == [{"DeviceIndex": 0, **({"InterfaceType": "efa"} if efas else {})}]
    assert len(ec2.network_interfaces(info, 2)) == min(2, total)


def test_efa_layout_without_network_cards_uses_the_snapshot():
    """An entry without NetworkCards (an older API answer): the snapshot's count, plain "efa"."""
    info = {"InstanceType": "p4d.24xlarge", "NetworkInfo": {"EfaSupported": True}}
    assert ec2.network_interfaces(info) == [
        {"NetworkCardIndex": 0, "DeviceIndex": 0, "InterfaceType": "efa"},
        *({"NetworkCardIndex": i, "DeviceIndex": 1, "InterfaceType": "efa"} for i in (1, 2, 3))]
    assert ec2.network_interfaces({"InstanceType": "c5.xlarge"}) == [{"DeviceIndex": 0}]
    assert ec2.network_interfaces({"InstanceType": "g5.12xlarge"}) == [{"DeviceIndex": 0, "InterfaceType": "efa"}]


@pytest.mark.parametrize("itype", sorted(EFA_LAYOUTS))
def test_efa_layout_template_lints_and_deploys(aws, itype):
    """The whole path: preflight reads the type from moto, the template passes cfn-lint, the
    stack is created in moto, and its launch template carries every interface."""
    efas, total = EFA_LAYOUTS[itype]
    s = spec(instance_type=itype, count=2, subnet=_private_subnet(aws))
    res = ec2.preflight(aws, s)
    t = ec2.stack_template(s, res)
    matches = cfnlint.api.lint(json.dumps(t, indent=1), config=cfnlint.api.ManualArgs(regions=[REGION]))
    assert [str(m) for m in matches] == []
    ifaces = t["Resources"]["LaunchTemplate"]["Properties"]["LaunchTemplateData"]["NetworkInterfaces"]
    sg = {"Fn::GetAtt": ["SecurityGroup", "GroupId"]}
    assert len(ifaces) == total and all(i["Groups"] == [sg] for i in ifaces)
    assert not any("AssociatePublicIpAddress" in i for i in ifaces)
    said = []
    cluster, _ = ec2.up(aws, s, poll=0.05, timeout=5, say=said.append)
    assert len(cluster.instances) == 2
    [line] = [m for m in said if " creating: " in m]
    assert f", {efas} EFA in " in line if efas else "EFA" not in line
    data = aws.client("ec2").describe_launch_template_versions(
        LaunchTemplateName="dtrain-c1")["LaunchTemplateVersions"][0]["LaunchTemplateData"]
    got = sorted((i.get("NetworkCardIndex", 0), i["DeviceIndex"], i.get("InterfaceType", "interface"))
                 for i in data["NetworkInterfaces"])
    want = sorted((i.get("NetworkCardIndex", 0), i["DeviceIndex"], i.get("InterfaceType", "interface"))
                  for i in ec2.network_interfaces(_type_info(aws, itype)))
    assert got == want and len(got) == total
    ec2.delete_stack(aws, "c1", poll=0.05)
    assert stacks(aws) == []


@pytest.mark.parametrize("kw, address, message", [
    # (the default VPC and --new-vpc give such nodes Elastic IPs: tests/test_nodes_addresses.py)
    ({"subnet": "private"}, "public", r"^p4d\.24xlarge gets 4 network interfaces .*cannot be reached at public "
                                      r"addresses: run dtrain from inside the VPC .*or --efa-interfaces 1 "),
])
def test_multi_efa_without_a_public_address_is_refused_before_anything_is_created(aws, kw, address, message):
    if kw.get("subnet") == "private":
        kw = {"subnet": _private_subnet(aws)}
    with pytest.raises(LaunchError, match=message):
        ec2.up(aws, spec(instance_type="p4d.24xlarge", **kw), address=address, poll=0.05, timeout=5, say=quiet)
    assert stacks(aws) == [] and running(aws) == []


def test_efa_interfaces_1_keeps_a_public_address(aws):
    """--efa-interfaces 1 on a multi-card type: the old single interface, public address allowed."""
    s = spec(instance_type="p4d.24xlarge", count=1, new_vpc=True, efa_interfaces=1)
    t = ec2.stack_template(s, ec2.preflight(aws, s))
    ifaces = t["Resources"]["LaunchTemplate"]["Properties"]["LaunchTemplateData"]["NetworkInterfaces"]
    assert [(i["DeviceIndex"], i["InterfaceType"], i["AssociatePublicIpAddress"]) for i in ifaces] == [(0, "efa", True)]
    # deployed in the default VPC: moto's CloudFormation gives a new VPC's instances no public address
    cluster, _ = ec2.up(aws, dataclasses.replace(s, new_vpc=False), address="public", poll=0.05, timeout=5, say=quiet)
    assert len(cluster.instances) == 1 and cluster.instances[0].public_ip
    hostfile = (ec2.cluster_dir("c1") / "hostfile").read_text()
    assert cluster.instances[0].public_ip in hostfile
    with pytest.raises(LaunchError, match=r"^--efa-interfaces 0: must be at least 1"):
        spec(efa_interfaces=0)


def test_lazy_user_data_sets_the_switch_above_the_script():
    script = ec2.FIRST_BOOT.read_text()
    shebang, rest = script.split("\n", 1)
    lazy = ec2.user_data(spec(lazy=True), RESOLVED["efa"])["Fn::Base64"]
    assert lazy == f"{shebang}\n# set by dtrain nodes up (CloudFormation)\nDTRAIN_LAZY=1\n{rest}"
    both = ec2.user_data(spec(lazy=True, efs=True), RESOLVED["efa"])["Fn::Base64"]["Fn::Join"][1]
    assert both[0].endswith("DTRAIN_LAZY=1\nDTRAIN_EFS_ID=") and both[-1] == rest


SYSTEMCTL = """#!/bin/sh
echo "$@" >> "$LOG"
"""


@pytest.mark.parametrize("have_package", [True, False])
def test_first_boot_lazy_configures_soci_and_keeps_the_amis_daemon_json(tmp_path, have_package):
    """first-boot.sh with DTRAIN_LAZY=1, stand-ins for apt-get and systemctl: the unit, the
    containerd proxy snapshotter (once), Docker on the containerd store with the nvidia runtime
    kept; where the package cannot be had, the node is left as it was and the boot goes on."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "apt-get").write_text(APT)
    (bin_ / "systemctl").write_text(SYSTEMCTL)
    (bin_ / "unpigz").write_text("#!/bin/sh\n")
    (bin_ / "python3").symlink_to(sys.executable)
    for tool in ("mkdir", "grep"):
        (bin_ / tool).symlink_to(shutil.which(tool))
    for f in bin_.iterdir():
        f.chmod(0o755)
    if have_package:
        (tmp_path / "lists").touch()
    etc = tmp_path / "etc"
    daemon = etc / "docker" / "daemon.json"
    daemon.parent.mkdir(parents=True)
    daemon.write_text(json.dumps({"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}))
    conf = etc / "containerd" / "config.toml"
    conf.parent.mkdir()
    conf.write_text('disabled_plugins = ["cri"]\n')
    log = tmp_path / "calls.log"
    env = {"PATH": str(bin_), "LOG": str(log), "LISTS": str(tmp_path / "lists"), "BROKEN": "0" if have_package else "1",
           "DTRAIN_LAZY": "1", "DTRAIN_DAEMON_JSON": str(daemon), "DTRAIN_CONTAINERD_CONF": str(conf),
           "DTRAIN_UNIT_DIR": str(etc / "systemd"), "DTRAIN_SOCI_CONF": str(etc / "soci" / "config.toml")}
    for _ in range(2):  # a second run (a reboot that runs user data again) changes nothing more
        r = subprocess.run(["/bin/bash", str(ec2.FIRST_BOOT)], env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
    calls = log.read_text()
    if not have_package:
        assert "install -y soci-snapshotter" in calls and "enable" not in calls and "restart" not in calls
        assert json.loads(daemon.read_text()) == {"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}
        return
    assert calls.count("install -y soci-snapshotter") == 2 and "enable --now dtrain-soci.service" in calls
    assert "restart containerd docker" in calls
    assert json.loads(daemon.read_text()) == {"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}},
                                              "features": {"containerd-snapshotter": True}, "storage-driver": "soci"}
    assert conf.read_text().count("[proxy_plugins.soci]") == 1
    assert "ExecStart=/usr/bin/soci-snapshotter-grpc" in (etc / "systemd" / "dtrain-soci.service").read_text()
    # soci's own client retries twice, as on the simulated lazy nodes (cluster.soci_config)
    assert tomllib.loads((etc / "soci" / "config.toml").read_text()) == tomllib.loads(cluster.soci_config())
