"""A node the Auto Scaling group brings back becomes a warm spare of the running job (issue 49),
the whole way, on the simulated cluster: `dtrain launch -f job.yaml` with `up: 2 x c5.xlarge` and
`spares: 1` on moto, whose instances get the simulated nodes' addresses (node-1..3; the group's
replacement gets the next one, node-4). While the job runs, the spare's instance is taken by the
group (terminated, replaced) and its NIC goes down: the spare is out, the launch follows the
group, makes node-4 ready (the job's directory, image and container) and offers it; the
supervisor takes it (`spare-joined`). Then node-2 is lost: node-4 takes its place and the job
ends at full size; the stack is deleted after. A shape of its own (own_cluster): the 4 nodes of
tests/test_shared_home.py (their home one directory: each node's job directory is its own)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3
import pytest

from dtrain.launch.infra import cluster as cl

from test_launch import containers_left
from test_launch_up import REGION, live_stacks
from test_nodes import moto_server  # noqa: F401 - fixture

pytestmark = [pytest.mark.cluster, pytest.mark.own_cluster, pytest.mark.second_cluster]

ROOT = Path(__file__).resolve().parent.parent

TRAIN = """import os, socket, time
attempt = os.environ.get("DTRAIN_RESTART", "0")
print(f"attempt {attempt} rank {os.environ['RANK']} on {socket.gethostname()}", flush=True)
if attempt == "0":
    time.sleep(900)
"""


@pytest.fixture
def four_nodes(shared_home_cluster):
    """(cluster, the pytorch-ddp CPU image's ref in its registry): the 4 nodes that share a home
    (tests/test_shared_home.py's, made once: the image is on every node already)."""
    info, _, ref = shared_home_cluster
    yield info, ref
    for node in info.nodes:  # whatever happened inside, every NIC up again
        subprocess.run(["ip", "link", "set", f"{cl.VETH_PREFIX}{node.index}", "up"], check=False)


def set_link(node, up: bool) -> None:
    subprocess.run(["ip", "link", "set", f"{cl.VETH_PREFIX}{node.index}", "up" if up else "down"], check=True)


def test_a_node_the_group_brings_back_joins_as_a_spare_and_takes_a_lost_nodes_place(tmp_path, moto_server, four_nodes):
    from imds import Imds
    from test_nodes_cli import AMI as NODE_AMI

    info, image = four_nodes
    url, env0 = moto_server
    session = boto3.Session(region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing")
    c = session.client("ec2", endpoint_url=url)
    prefix = info.nodes[0].address.rsplit(".", 1)[0]  # 10.213.N
    vpc = c.create_vpc(CidrBlock=f"{prefix.rsplit('.', 1)[0]}.0.0/16")["Vpc"]["VpcId"]
    subnet = c.create_subnet(VpcId=vpc, CidrBlock=f"{prefix}.0/24", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    for cidr in (f"{prefix}.0/29", f"{prefix}.8/31", f"{prefix}.10/32"):  # the bridge and below: not nodes
        c.create_subnet_cidr_reservation(SubnetId=subnet, Cidr=cidr, ReservationType="explicit")
    mine = c.create_security_group(GroupName="launcher", Description="this machine", VpcId=vpc)["GroupId"]
    imds = Imds("127.0.0.1")
    mac = "0e:00:00:00:00:01"
    imds.meta.update({"mac": mac, "local-ipv4": f"{prefix}.1", f"network/interfaces/macs/{mac}/vpc-id": vpc,
                      f"network/interfaces/macs/{mac}/security-group-ids": mine})
    env = {**{k: v for k, v in env0.items() if k != "AWS_EC2_METADATA_DISABLED"},
           "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.url, "DTRAIN_HOME": str(tmp_path / "home"),
           "DTRAIN_PRICES": "snapshot", "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
           "DTRAIN_JOIN_POLL_S": "2"}  # the group asked every 2 s (30 s by default)
    cfn = session.client("cloudformation", endpoint_url=url)
    asg = session.client("autoscaling", endpoint_url=url)
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(TRAIN)
    (project / "job.yaml").write_text(
        f"image: {image}\nlauncher: torchrun\nworkdir: .\ncommand: [python, train.py]\n"
        f"up: 2 x c5.xlarge\nspares: 1\nmax_restarts: 2\nsubnet: {subnet}\nami: {NODE_AMI}\nssh_user: root\n"
        "no_spot_watch: true\nup_timeout: 120\n")
    key = ["--ssh-key", info.identity_file, "--ssh-opt", "UserKnownHostsFile=/dev/null"]
    by_name = {n.name: n for n in info.nodes}
    lines: list[str] = []
    p = subprocess.Popen([sys.executable, "-m", "dtrain", "launch", "-f", "job.yaml", *key, "--name", "joins"],
                         cwd=project, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    killer = threading.Timer(600, p.kill)
    killer.start()
    try:
        with contextlib.ExitStack() as links:
            for line in p.stdout:
                lines.append(line)
                if line.startswith("[launch] job started on 2 node(s): node-1, node-2; spare(s) node-3"):
                    # the group takes the spare's instance (a spot interruption) and replaces it
                    ids = c.describe_instances(Filters=[{"Name": "private-ip-address",
                                                         "Values": [by_name["node-3"].address]}])
                    [inst] = [i for r in ids["Reservations"] for i in r["Instances"] if i["State"]["Name"] == "running"]
                    asg.terminate_instance_in_auto_scaling_group(InstanceId=inst["InstanceId"],
                                                                 ShouldDecrementDesiredCapacity=False)
                    set_link(by_name["node-3"], False)
                    links.callback(set_link, by_name["node-3"], True)
                elif line.startswith("[launch] spare node-4 ") and " joined" in line:
                    set_link(by_name["node-2"], False)  # a ranked node lost: the spare that joined takes its place
                    links.callback(set_link, by_name["node-2"], True)
                elif line.startswith("[launch] restart 1:"):
                    links.close()  # every link up again: the end's teardown reaches every node
        p.wait(60)
    finally:
        killer.cancel()
        p.kill()
        imds.close()
    out = "".join(lines)
    assert p.returncode == 0, out
    assert f"[launch] {by_name['node-4'].address} came to the cluster: making it a spare of this job" in out, out
    assert "[launch] spare node-3 out: " in out
    assert f"[launch] spare node-4 ({by_name['node-4'].address}) joined" in out
    assert "[launch] spare node-4 in for node-2 (quarantined: not used again by this job)" in out
    assert "[launch] job restarted (attempt 1) on 2 node(s): node-1, node-4" in out, out
    assert "attempt 1 rank 1 on node-4" in out and "attempt 1 rank 0 on node-1" in out, out
    assert "[up] the job ended: deleting stack dtrain-joins" in out
    deadline = time.monotonic() + 60
    while live_stacks(cfn) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert live_stacks(cfn) == []
    deadline = time.monotonic() + 120
    while containers_left(info, "joins") and time.monotonic() < deadline:  # node-2's and -3's: their watchdogs
        time.sleep(1)
    assert containers_left(info, "joins") == []
