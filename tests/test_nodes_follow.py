"""A replaced spot node joins (issue 49): the cluster's record and hostfile follow its Auto
Scaling group (`dtrain nodes sync --name C`): a node the group replaced leaves, the new one joins
with its address, on multi-EFA types with the Elastic IP the old one left. On moto, whose group
replaces a terminated instance at once, as AWS's does after a spot interruption."""

from __future__ import annotations

import pytest

from dtrain.launch.errors import LaunchError
from dtrain.launch.infra import ec2
from dtrain.launch.remote.hosts import parse_hostfile

from test_nodes import aws, invoke, moto_server, quiet, running, spec  # noqa: F401 - fixtures
from test_nodes_addresses import cfn_releases_addresses  # noqa: F401 - fixture (autouse there)


def inst(i: int, public: str | None = None) -> ec2.Instance:
    return ec2.Instance(id=f"i-{i}", private_ip=f"10.0.0.{i}", public_ip=public, availability_zone="us-east-1a",
                        instance_type="g5.12xlarge")


def test_follow_keeps_the_order_of_the_survivors_and_appends_the_newcomers():
    record = ec2.Cluster(name="c1", region="us-east-1", stack="dtrain-c1", instance_type="g5.12xlarge", nitro=True,
                         slots=4, user="ubuntu", identity=None, instances=(inst(9), inst(3), inst(5)))
    after, gone, joined = ec2.follow(record, [inst(2), inst(3), inst(9)])
    assert [i.id for i in after.instances] == ["i-9", "i-3", "i-2"]
    assert gone == [inst(5)] and joined == [inst(2)]
    same, gone, joined = ec2.follow(record, list(record.instances))
    assert same == record and gone == joined == []


def test_a_replaced_spot_node_joins_the_hostfile(aws):
    cluster, hostfile = ec2.up(aws, spec(count=3, spot=True), identity="/k/id", address="public", poll=0.05,
                               timeout=5, say=quiet)
    before = parse_hostfile(hostfile)
    lost = cluster.instances[1]
    aws.client("ec2").terminate_instances(InstanceIds=[lost.id])  # a spot interruption
    [new] = [i for i in running(aws) if i["InstanceId"] not in {x.id for x in cluster.instances}]
    said: list[str] = []
    after, path, changed = ec2.follow_group(aws, "c1", say=said.append)
    assert changed and path == hostfile
    nodes = parse_hostfile(hostfile)
    assert [n.host for n in nodes] == [before[0].host, before[2].host, new["PublicIpAddress"]]
    assert all(n.slots == 4 and n.user == "ubuntu" and n.identity == "/k/id" for n in nodes)
    assert ec2.load_cluster("c1") == after and after.instances[-1].id == new["InstanceId"]
    assert said == [f"[nodes] {lost.public_ip} ({lost.id}, {lost.availability_zone}) left: no longer running in "
                    "the group",
                    f"[nodes] {new['PublicIpAddress']} ({new['InstanceId']}, "
                    f"{new['Placement']['AvailabilityZone']}) joined: the group's replacement"]
    # again: nothing to do, said so
    said.clear()
    assert ec2.follow_group(aws, "c1", say=said.append)[2] is False
    assert said == ["[nodes] c1: the hostfile matches the group (3 nodes)"]


def test_a_replaced_multi_efa_node_gets_the_elastic_ip_the_old_one_left(aws):
    cluster, hostfile = ec2.up(aws, spec(instance_type="p4d.24xlarge", count=2), address="public", poll=0.05,
                               timeout=5, say=quiet)
    lost = cluster.instances[0]
    c = aws.client("ec2")
    # AWS disassociates the address of a terminated instance; moto keeps it: do as AWS does
    [assoc] = [a["AssociationId"] for a in c.describe_addresses()["Addresses"] if a["PublicIp"] == lost.public_ip]
    c.terminate_instances(InstanceIds=[lost.id])
    c.disassociate_address(AssociationId=assoc)
    after, _, changed = ec2.follow_group(aws, "c1", say=quiet)
    assert changed and len(after.instances) == 2
    new = after.instances[-1]
    assert new.id != lost.id and new.public_ip == lost.public_ip  # the address it left
    [eip] = [a for a in c.describe_addresses()["Addresses"] if a["PublicIp"] == lost.public_ip]
    found = c.describe_instances(InstanceIds=[new.id])["Reservations"][0]["Instances"][0]
    assert eip["NetworkInterfaceId"] == ec2.primary_interface(found)  # on the newcomer's primary interface
    # the other node keeps its own
    [kept] = [a for a in c.describe_addresses()["Addresses"] if a["PublicIp"] == cluster.instances[1].public_ip]
    assert kept["AssociationId"] and kept["NetworkInterfaceId"] != eip["NetworkInterfaceId"]
    assert [n.host for n in parse_hostfile(hostfile)] == [cluster.instances[1].public_ip, lost.public_ip]


def test_no_record_is_one_line(aws):
    with pytest.raises(LaunchError, match=r"^--cluster c7: no such cluster here"):
        ec2.follow_group(aws, "c7", say=quiet)


def test_cli_sync_without_a_record(moto_server):
    _, env = moto_server
    r = invoke(env, "nodes", "sync", "--name", "c7")
    assert r.returncode == 2 and r.stderr.startswith("error: --cluster c7: no such cluster here") \
        and r.stderr.count("\n") == 1, r.stderr
