"""Multi-EFA nodes (p4d: 4 network interfaces, p5: 32) from outside their VPC with the defaults
(issue 40): AWS gives an instance with several interfaces no public IPv4, so the stack gives
each node an Elastic IP on its primary interface, its way in (ssh) and out (the registry).
The template (cfn-lint), the stack in moto, the line `nodes up` prints, and that `nodes down`
and a failed up leave no address, instance or stack."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import boto3
import cfnlint.api
import pytest
from moto.ec2.models import ec2_backends
from moto.ec2.models.elastic_ip_addresses import ElasticAddress

from dtrain.launch.errors import LaunchError
from dtrain.launch.infra import ec2
from dtrain.launch.remote.hosts import parse_hostfile
from test_nodes import (AMI_PARAM, CIDR, REGION, aws, invoke, moto_server,  # noqa: F401 - fixtures
                        quiet, running, spec, stacks)


@pytest.fixture(autouse=True)
def cfn_releases_addresses(monkeypatch):
    """moto 5's CloudFormation makes an AWS::EC2::EIP but never releases it on DeleteStack
    (ElasticAddress has no delete); AWS does (after the group, which DependsOn it: its
    instances' termination disassociates it). This gives moto AWS's behaviour, so an address
    made outside the stack would still be caught: it stays in describe_addresses."""
    def delete(self, account_id, region_name):
        backend = ec2_backends[account_id][region_name]
        if self.association_id:
            backend.disassociate_address(association_id=self.association_id)
        backend.release_address(allocation_id=self.allocation_id)

    monkeypatch.setattr(ElasticAddress, "delete", delete, raising=False)


def addresses(session) -> list[dict]:
    return session.client("ec2").describe_addresses()["Addresses"]


def lint(template: dict) -> list[str]:
    return [str(m) for m in cfnlint.api.lint(json.dumps(template, indent=1),
                                             config=cfnlint.api.ManualArgs(regions=[REGION]))]


# --- the decision and its cost (pure) --------------------------------------------------------


def test_which_nodes_get_addresses():
    s = spec(instance_type="p4d.24xlarge")
    assert ec2.needs_addresses(s, 4, None)                      # the default VPC: internet gateway only
    assert ec2.needs_addresses(spec(instance_type="p4d.24xlarge", new_vpc=True), 4, None)
    assert not ec2.needs_addresses(s, 1, None)                  # one interface: AWS's own public address
    sub = spec(instance_type="p4d.24xlarge", subnet="subnet-0123456789abcdef0")
    assert ec2.needs_addresses(sub, 4, "igw-0abc")              # a public subnet of the user's
    assert not ec2.needs_addresses(sub, 4, "nat-0abc")          # behind a NAT gateway: a way out already
    assert not ec2.needs_addresses(sub, 4, None)                # no default route: the user's (VPC endpoints)
    assert ec2.public_ip_error(s, 4, "public", addresses=True) is None
    assert ec2.public_ip_error(sub, 4, "public").startswith("p4d.24xlarge gets 4 network interfaces")


def test_the_choice_line_names_the_cost():
    assert ec2.addresses_line(4) == (
        "[nodes] way in and out: an Elastic IP on each node's primary interface, in the stack "
        "(4 x $0.005/h = $0.020/h; a NAT gateway instead: $0.045/h + $0.045/GB pulled)")


def test_address_quota():
    s = spec(instance_type="p5.48xlarge", count=4)
    assert ec2.address_quota_error(s, 4, 1, 5) is None
    msg = ec2.address_quota_error(s, 4, 2, 5)
    assert msg.startswith("--count 4: p5.48xlarge's nodes each need an Elastic IP") and \
        "allows 5 with 2 allocated" in msg and ec2.ADDRESS_QUOTA_CODE in msg and "\n" not in msg


# --- the template: cfn-lint ------------------------------------------------------------------


@pytest.mark.parametrize("new_vpc", [False, True])
@pytest.mark.parametrize("itype, eips", [("p4d.24xlarge", 2), ("p5.48xlarge", 2), ("g5.12xlarge", 0)])
def test_template_from_outside_lints(aws, itype, eips, new_vpc):
    """start() from outside the VPC (public addresses), the template it created read back."""
    said: list[str] = []
    res = ec2.start(aws, spec(instance_type=itype, count=2, new_vpc=new_vpc), address="public", say=said.append)
    assert res.addresses == eips
    body = aws.client("cloudformation").get_template(StackName="dtrain-c1")["TemplateBody"]
    t = body if isinstance(body, dict) else json.loads(body)
    assert lint(t) == []
    eip = {k: r for k, r in t["Resources"].items() if r["Type"] == "AWS::EC2::EIP"}
    assert sorted(eip) == [f"Address{k}" for k in range(1, eips + 1)]
    user_data = t["Resources"]["LaunchTemplate"]["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]
    assert ("\nDTRAIN_WAIT_ADDRESS=1\n" in user_data) == bool(eips)
    way_out = ["GatewayAttachment", "DefaultRoute", "SubnetRoutes"] if new_vpc else []  # the nodes go before it
    assert t["Resources"]["Nodes"].get("DependsOn", []) == sorted(eip) + way_out
    if eips:  # instances go first on delete
        assert all(r["Properties"]["Domain"] == "vpc" for r in eip.values())
        assert all(r.get("DependsOn") == ("GatewayAttachment" if new_vpc else None) for r in eip.values())
        assert [m for m in said if "way in and out" in m] == [ec2.addresses_line(2)]
    else:
        assert not any("way in and out" in m for m in said)
    assert len(addresses(aws)) == eips


def test_template_with_efs_and_addresses_lints(aws):
    s = spec(instance_type="p4d.24xlarge", count=2, efs=True, new_vpc=True)
    res = ec2.preflight(aws, s)
    t = ec2.stack_template(s, dataclasses.replace(res, addresses=2))
    assert lint(t) == []
    assert t["Resources"]["Nodes"]["DependsOn"] == ["MountTarget", "Address1", "Address2", "GatewayAttachment",
                                                  "DefaultRoute", "SubnetRoutes"]


# --- deployed in moto: up with the defaults, down, a failed up --------------------------------


@pytest.mark.parametrize("itype, efas", [("p4d.24xlarge", 4), ("p5.48xlarge", 32)])
def test_up_multi_efa_from_outside_then_down_leaves_no_address(aws, itype, efas):
    said: list[str] = []
    cluster, hostfile = ec2.up(aws, spec(instance_type=itype, count=2), address="public", poll=0.05, timeout=5,
                               say=said.append)
    assert any(f"2 x {itype}, {efas} EFA in " in m for m in said), said
    data = aws.client("ec2").describe_launch_template_versions(
        LaunchTemplateName="dtrain-c1")["LaunchTemplateVersions"][0]["LaunchTemplateData"]
    assert len(data["NetworkInterfaces"]) == efas
    eips = addresses(aws)
    assert len(eips) == 2
    # each on the primary interface (card 0, device 0) of its own node; the hostfile uses them
    found = aws.client("ec2").describe_instances(InstanceIds=[i.id for i in cluster.instances])["Reservations"]
    primary = {ec2.primary_interface(i) for r in found for i in r["Instances"]}
    assert {a["NetworkInterfaceId"] for a in eips} == primary and len(primary) == 2
    assert [n.host for n in parse_hostfile(hostfile)] == [i.public_ip for i in cluster.instances]
    assert sorted(i.public_ip for i in cluster.instances) == sorted(a["PublicIp"] for a in eips)
    assert ec2.load_cluster("c1") == cluster

    ec2.delete_stack(aws, "c1", poll=0.05)
    assert addresses(aws) == [] and stacks(aws) == [] and running(aws) == []


def _nodes_down(name: str) -> str:
    """`dtrain nodes down --name NAME` (tasks.py's body, in this process's moto): what it prints."""
    import contextlib
    import io

    import tasks

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            tasks.nodes.body(None, "down", name=name, region=REGION)
        except SystemExit as e:  # something stays billed: exit 1, after saying what
            assert e.code == 1
            return out.getvalue() + "[exit 1]\n"
    return out.getvalue()


def test_nodes_down_says_the_stacks_addresses_are_released_or_names_those_left(aws):
    ec2.up(aws, spec(instance_type="p4d.24xlarge", count=2), address="public", poll=0.05, timeout=5, say=quiet)
    assert len(ec2.stack_addresses(aws, "c1")) == 2 and ec2.stack_addresses(aws, "c2") == []
    assert _nodes_down("c1") == "deleted stack dtrain-c1\nreleased its 2 Elastic IP(s): none of the stack's is left\n"
    assert addresses(aws) == [] and ec2.stack_addresses(aws, "c1") == []

    ec2.up(aws, spec(name="c2", instance_type="p4d.24xlarge", count=2), address="public", poll=0.05, timeout=5,
           say=quiet)
    stray = aws.client("ec2").allocate_address(Domain="vpc")  # one the stack did not make, tagged as the cluster's
    aws.client("ec2").create_tags(Resources=[stray["AllocationId"]], Tags=[{"Key": ec2.CLUSTER_TAG, "Value": "c2"}])
    said = _nodes_down("c2").splitlines()
    assert said == ["deleted stack dtrain-c2", f"still billed in region {REGION} (1):",
                    f"  Elastic IP {stray['PublicIp']} ({stray['AllocationId']}): `aws ec2 release-address "
                    f"--allocation-id {stray['AllocationId']} --region {REGION}`", "[exit 1]"], said


def test_an_interrupted_up_names_the_elastic_ips_among_what_it_deletes(aws):
    said: list[str] = []

    def interrupted(_instances):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ec2.up(aws, spec(instance_type="p4d.24xlarge", count=2), address="public", ready=interrupted,
               poll=0.05, timeout=5, say=said.append)
    assert any("interrupted: deleting stack dtrain-c1 (its instances, security group, launch template, "
               "Elastic IPs)" in m for m in said), said
    said.clear()
    with pytest.raises(KeyboardInterrupt):
        ec2.up(aws, spec(name="c3", count=1), address="public", ready=interrupted, poll=0.05, timeout=5,
               say=said.append)
    assert any("(its instances, security group, launch template); " in m for m in said), said


def test_inside_the_vpc_the_addresses_are_the_way_out(aws):
    """From inside the default VPC (private addresses): the nodes still need a way out, so they
    get their addresses, and the hostfile keeps the private ones."""
    cluster, hostfile = ec2.up(aws, spec(instance_type="p4d.24xlarge", count=2), address="private",
                               poll=0.05, timeout=5, say=quiet)
    assert len(addresses(aws)) == 2 and all(i.public_ip for i in cluster.instances)
    assert [n.host for n in parse_hostfile(hostfile)] == [i.private_ip for i in cluster.instances]


def test_a_failed_up_leaves_no_address(aws):
    def not_ready(_instances):
        raise LaunchError("2 node(s) not ready (ssh + docker)")

    with pytest.raises(LaunchError, match="not ready"):
        ec2.up(aws, spec(instance_type="p4d.24xlarge", count=2), address="public", ready=not_ready,
               poll=0.05, timeout=5, say=quiet)
    assert addresses(aws) == [] and stacks(aws) == [] and running(aws) == []


def test_too_few_addresses_left_is_refused_before_anything_is_created(aws):
    for _ in range(4):
        aws.client("ec2").allocate_address(Domain="vpc")
    with pytest.raises(LaunchError, match=r"^--count 2: p4d\.24xlarge's nodes each need an Elastic IP .* "
                                          r"allows 5 with 4 allocated"):
        ec2.up(aws, spec(instance_type="p4d.24xlarge", count=2), address="public", poll=0.05, timeout=5, say=quiet)
    assert len(addresses(aws)) == 4 and stacks(aws) == [] and running(aws) == []


def test_a_public_subnet_of_the_users_gets_addresses(aws):
    c = aws.client("ec2")
    vpc = c.create_vpc(CidrBlock="10.40.0.0/16")["Vpc"]["VpcId"]
    sub = c.create_subnet(VpcId=vpc, CidrBlock="10.40.0.0/20", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    assert ec2.subnet_default_route(aws, sub, vpc) is None
    igw = c.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
    c.attach_internet_gateway(InternetGatewayId=igw, VpcId=vpc)
    rt = c.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
    c.create_route(RouteTableId=rt, DestinationCidrBlock="0.0.0.0/0", GatewayId=igw)
    c.associate_route_table(RouteTableId=rt, SubnetId=sub)
    assert ec2.subnet_default_route(aws, sub, vpc) == igw
    cluster, _ = ec2.up(aws, spec(instance_type="p4d.24xlarge", count=1, subnet=sub), address="public",
                        poll=0.05, timeout=5, say=quiet)
    assert cluster.instances[0].public_ip == addresses(aws)[0]["PublicIp"]


# --- the CLI, with the defaults: checkip on loopback, ssh stopped before any invented address ---


@pytest.fixture
def checkip():
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"127.0.0.7\n")

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/"
    srv.shutdown()


def test_cli_p4d_with_the_defaults_from_outside(moto_server, checkip):
    """`nodes up --instance-type p4d.24xlarge` and no other choice, from outside the VPC: the
    choice line, the stack with an address per node; ssh never leaves this machine
    (ProxyCommand=/bin/false: moto's addresses are invented), so up fails and deletes it all."""
    url, env = moto_server
    r = invoke({**env, "DTRAIN_CHECKIP_URL": checkip}, "nodes", "up", "--name", "c1", "--count", "2",
               "--instance-type", "p4d.24xlarge", "--ami", "ami-dca37ea5", "--timeout", "3",
               "--ssh-opt", "ProxyCommand=/bin/false", "--yes")  # --yes: $43.9/h, no terminal to ask
    assert "[nodes] this machine is not in the nodes' VPC: public addresses; ssh from this machine's public " \
           "address (127.0.0.7/32)\n" in r.stdout, r.stdout
    assert ec2.addresses_line(2) + "\n" in r.stdout
    assert "2 x p4d.24xlarge, 4 EFA in " in r.stdout
    assert r.returncode == 2 and r.stderr.startswith("error: no node answered ssh + docker within 3s") \
        and r.stderr.count("\n") == 1, r.stderr
    s = boto3.Session(region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing")
    assert s.client("ec2", endpoint_url=url).describe_addresses()["Addresses"] == [], r.stdout + r.stderr
    assert [st for st in s.client("cloudformation", endpoint_url=url).describe_stacks()["Stacks"]
            if st["StackStatus"] != "DELETE_COMPLETE"] == []


# --- first boot waits for the way out ---------------------------------------------------------


def test_first_boot_waits_for_the_public_address(tmp_path):
    """DTRAIN_WAIT_ADDRESS=1: the packages are fetched only once the instance metadata (a
    loopback stand-in) shows a public address, the third time it is asked."""
    asked: list[str] = []

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_PUT(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"tok")

        def do_GET(self):
            asked.append(self.headers.get("X-aws-ec2-metadata-token", ""))
            ok = self.path == "/latest/meta-data/public-ipv4" and len(asked) >= 3
            self.send_response(200 if ok else 404)
            self.end_headers()
            self.wfile.write(b"127.0.0.9" if ok else b"")

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log = tmp_path / "apt.log"
    (bin_ / "apt-get").write_text(f'#!/bin/sh\necho "asked $*" >> {log}\n')
    (bin_ / "apt-get").chmod(0o755)
    for tool in ("curl", "sleep"):  # only these and the stand-in: this machine's unpigz must not count
        (bin_ / tool).symlink_to(shutil.which(tool))
    env = {"PATH": str(bin_), "DTRAIN_WAIT_ADDRESS": "1", "DTRAIN_ADDRESS_RETRY_S": "0.1",
           "DTRAIN_IMDS": f"http://127.0.0.1:{srv.server_address[1]}"}
    try:
        r = subprocess.run(["/bin/bash", str(ec2.FIRST_BOOT)], env=env, capture_output=True, text=True, timeout=30)
    finally:
        srv.shutdown()
    assert r.returncode == 0, r.stderr
    assert asked == ["tok"] * 3
    assert log.read_text().startswith("asked ")
