"""`dtrain nodes up / list / down` and `dtrain volume create` as a user runs them (issue 23):
the real program, from a temporary directory that is not the checkout, against a moto server
on loopback, with nodes that really answer ssh: moto hands the instances the simulated
cluster's addresses (a VPC 10.213.0.0/16 whose subnet reserves .0-.10, so its first instances
are 10.213.0.11, .12, ...: node-1, node-2), and an instance metadata service on loopback says
this machine is in that VPC, so `--address auto` picks private addresses and ssh from this
machine's security group. An unreachable node is a simulated node whose link is down."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from imds import Imds
from test_wholerun import _link

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parent.parent
REGION = "us-east-1"
AMI = "ami-dca37ea5"  # moto's "Deep Learning AMI Ubuntu" image


def dtrain(cwd: Path, env: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """The `dtrain` program (dtrain/cli.py; in CI the console script of the fresh venv is the same)."""
    return subprocess.run([sys.executable, "-m", "dtrain", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**env, "PYTHONPATH": str(ROOT)})


@pytest.fixture
def world(moto_server, tmp_path, cluster):
    """(env, aws session, subnet id, security group of "this machine", user dir)."""
    session = boto3.Session(region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing")
    c = session.client("ec2", endpoint_url=moto_server)
    vpc = c.create_vpc(CidrBlock="10.213.0.0/16")["Vpc"]["VpcId"]
    subnet = c.create_subnet(VpcId=vpc, CidrBlock="10.213.0.0/24", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    for cidr in ("10.213.0.0/29", "10.213.0.8/31", "10.213.0.10/32"):  # the bridge and below: not nodes
        c.create_subnet_cidr_reservation(SubnetId=subnet, Cidr=cidr, ReservationType="explicit")
    mine = c.create_security_group(GroupName="launcher", Description="this machine", VpcId=vpc)["GroupId"]
    imds = Imds("127.0.0.1")
    mac = "0e:00:00:00:00:01"
    imds.meta.update({"mac": mac, "local-ipv4": "10.213.0.1", f"network/interfaces/macs/{mac}/vpc-id": vpc,
                      f"network/interfaces/macs/{mac}/security-group-ids": mine})
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=moto_server, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
               AWS_DEFAULT_REGION=REGION, AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
               AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.url, DTRAIN_HOME=str(tmp_path / "home"))
    user_dir = tmp_path / "my-project"
    user_dir.mkdir()
    yield env, session.client("cloudformation", endpoint_url=moto_server), subnet, mine, user_dir, cluster
    imds.close()


def up_args(subnet: str, identity: str, *extra: str, count: int = 2) -> list[str]:
    return ["nodes", "up", "--name", "e2e", "--count", str(count), "--instance-type", "c5.xlarge", "--subnet", subnet,
            "--ami", AMI, "--ssh-user", "root", "--ssh-key", identity,
            "--ssh-opt", "UserKnownHostsFile=/dev/null", *extra]


def live_stacks(cfn) -> list[str]:
    return [s["StackName"] for s in cfn.describe_stacks()["Stacks"] if s["StackStatus"] != "DELETE_COMPLETE"]


def test_nodes_up_list_down_with_the_defaults(world):
    env, cfn, subnet, mine, user_dir, cluster = world
    r = dtrain(user_dir, env, *up_args(subnet, cluster.identity_file, "--timeout", "120"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"private addresses; ssh from its security group {mine}" in r.stdout, r.stdout
    assert "2 nodes up (private addresses, user root)" in r.stdout, r.stdout
    hostfile = Path(env["DTRAIN_HOME"]) / "clusters" / "e2e" / "hostfile"
    assert hostfile.read_text().splitlines()[1:] == [
        f"10.213.0.{11 + i} slots=1 user=root identity={cluster.identity_file}" for i in range(2)]
    # the worker list on every node (each simulated node has its own ~/.dtrain)
    for node in cluster.nodes[:2]:
        workers = Path(node.state_dir) / "dtrain-home" / "workers"
        assert workers.read_text() == "10.213.0.11\n10.213.0.12\n"
    r = dtrain(user_dir, env, "nodes", "list")
    row = r.stdout.splitlines()[1].split()
    # AGE (row[6]) varies; $/H (row[8]) is the price-list snapshot's 2 x c5.xlarge on-demand in us-east-1
    assert r.returncode == 0 and row[:6] + row[7:8] + row[9:10] == ["e2e", REGION, "CREATE_COMPLETE", "c5.xlarge", "2",
                                                                   "-", "usable", "10.213.0.11,10.213.0.12"], \
        r.stdout + r.stderr
    assert row[8].startswith("$"), r.stdout
    assert r.stdout.splitlines()[2] == f"e2e ({REGION}): dtrain launch --cluster e2e --image IMAGE -- CMD", r.stdout
    r = dtrain(user_dir, env, "nodes", "down", "--name", "e2e")
    assert r.returncode == 0 and r.stdout == "deleted stack dtrain-e2e\n", r.stdout + r.stderr
    r = dtrain(user_dir, env, "nodes", "list")
    assert r.stdout.startswith("no clusters (no dtrain stack in region us-east-1)"), r.stdout
    assert live_stacks(cfn) == [] and not hostfile.exists()
    r = dtrain(user_dir, env, "nodes", "down", "--name", "e2e")  # again, or a typo
    assert r.returncode == 2 and r.stderr.startswith(
        "error: nodes down --name e2e: nothing to delete: no stack dtrain-e2e"), r.stderr


@pytest.mark.parametrize("keep", [False, True])
def test_nodes_up_that_reaches_nothing_stops_early_and_says_what_it_did(world, keep):
    env, cfn, subnet, mine, user_dir, cluster = world
    for i in (1, 2):
        _link(cluster, i, "down")
    try:
        r = dtrain(user_dir, env, *up_args(subnet, cluster.identity_file, "--timeout", "20",
                                           *(["--keep-on-failure"] if keep else [])))
    finally:
        for i in (1, 2):
            _link(cluster, i, "up")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("error: no node answered ssh + docker within 20s: 10.213.0.11: "), r.stderr
    assert f"the security group lets ssh in from security group {mine} only" in r.stderr
    if keep:
        assert "stack dtrain-e2e kept (--keep-on-failure)" in r.stdout, r.stdout
        assert live_stacks(cfn) == ["dtrain-e2e"]
        r = dtrain(user_dir, env, "nodes", "down", "--name", "e2e")
        assert r.returncode == 0, r.stderr
    else:
        assert "deleting stack dtrain-e2e" in r.stdout, r.stdout
    assert live_stacks(cfn) == []


def test_volume_create_whose_node_step_fails_leaves_nothing(world):
    """The mount step fails on the nodes (no such device: moto attaches nothing real): one line,
    exit 2, and the io2 volume it made is detached and deleted."""
    env, cfn, subnet, mine, user_dir, cluster = world
    r = dtrain(user_dir, env, *up_args(subnet, cluster.identity_file, "--timeout", "120", count=1))
    assert r.returncode == 0, r.stdout + r.stderr
    ec2c = boto3.client("ec2", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=REGION,
                        aws_access_key_id="testing", aws_secret_access_key="testing")
    r = dtrain(user_dir, env, "volume", "create", "--cluster", "e2e", "--size", "8")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stdout + r.stderr
    assert "is not a block device on node-1" in r.stderr and r.stderr.rstrip().endswith("deleted"), r.stderr
    assert "unmounting, detaching and deleting it" in r.stdout, r.stdout
    assert ec2c.describe_volumes(Filters=[{"Name": "tag:dtrain:role", "Values": ["dataset"]}])["Volumes"] == []
    r = dtrain(user_dir, env, "nodes", "down", "--name", "e2e")
    assert r.returncode == 0, r.stderr


def walkthrough() -> list[list[str]]:
    """The `dtrain` lines of docs/nodes.md's walkthrough block, as argv (comments dropped)."""
    import re
    import shlex

    text = (ROOT / "docs" / "nodes.md").read_text()
    block = text.split("<!-- run by tests/test_nodes_cli.py::test_the_docs_walkthrough", 1)[1]
    block = block.split("```sh\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    return [shlex.split(re.sub(r"\s#.*$", "", line))[1:] for line in block.splitlines() if line.startswith("dtrain ")]


def test_the_docs_walkthrough(world):
    """docs/nodes.md's walkthrough, line by line, with this test's values for its placeholders
    (subnet, key) and what only the simulated nodes need (moto's AMI, user root, no known_hosts).
    The volume step fails on them (moto attaches no disk) and must leave nothing; the launch
    line is parsed by tests/test_documented_commands.py and run by the cluster tests."""
    env, cfn, subnet, mine, user_dir, cluster = world
    lines = walkthrough()
    assert [a[:2] for a in lines] == [["nodes", "up"], ["nodes", "list"], ["volume", "create"], ["launch", "--cluster"],
                                      ["nodes", "down"]], lines
    for argv in lines:
        argv = [{"subnet-0123456789abcdef0": subnet, "~/.ssh/mykey.pem": cluster.identity_file}.get(a, a) for a in argv]
        if argv[:2] == ["nodes", "up"]:
            # one node: moto keeps one attachment per Multi-Attach volume, and a second holder
            # then fails its termination (InvalidVolume.NotFound) after the volume is deleted
            argv[argv.index("--count") + 1] = "1"
            r = dtrain(user_dir, env, *argv, "--ami", AMI, "--ssh-user", "root",
                       "--ssh-opt", "UserKnownHostsFile=/dev/null", "--timeout", "120")
            assert r.returncode == 0 and "1 nodes up (private addresses, user root)" in r.stdout, r.stdout + r.stderr
        elif argv[:2] == ["nodes", "list"]:
            r = dtrain(user_dir, env, *argv)
            lines = r.stdout.splitlines()
            assert len(lines) == 3 and lines[1].split()[:3] == ["train", REGION, "CREATE_COMPLETE"], r.stdout + r.stderr
            assert lines[1].split()[7] == "usable", r.stdout
        elif argv[:2] == ["volume", "create"]:
            r = dtrain(user_dir, env, *argv)
            assert r.returncode == 2 and "is not a block device on node-1" in r.stderr, r.stdout + r.stderr
            assert r.stderr.rstrip().endswith("deleted") and "Traceback" not in r.stderr
        elif argv[0] == "launch":
            continue
        else:
            r = dtrain(user_dir, env, *argv)
            assert r.returncode == 0 and r.stdout == "deleted stack dtrain-train\n", r.stdout + r.stderr
    assert live_stacks(cfn) == []
