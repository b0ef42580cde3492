"""`nodes up` across zones (issue 49): a zone without capacity for the type (EC2's
InsufficientInstanceCapacity in the group's scaling activity, or fewer than --min-count
instances) is left, its stack deleted before the next zone's is made, and the move said on one
line; a zone pinned by --subnet or by the cluster's dataset volume is not left.

The capacity error is injected into moto (the only stand-in for AWS here): its Auto Scaling
group launches at most a zone's capacity, and its DescribeScalingActivities answers a failed
activity in the words EC2 Auto Scaling uses, as AWS does when a zone has none."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

import pytest
from moto.autoscaling.models import FakeAutoScalingGroup
from moto.autoscaling.responses import AutoScalingResponse
from moto.core.responses import ActionResult

from dtrain.launch.errors import LaunchError
from dtrain.launch.infra import ec2

from test_nodes import aws, quiet, running, spec, stacks  # noqa: F401 - aws: moto, DTRAIN_HOME

# EC2 Auto Scaling's words for a launch a zone had no capacity for (a failed scaling activity)
ICE = ("Could not launch On-Demand Instances. InsufficientInstanceCapacity - We currently do not have "
       "sufficient {type} capacity in the Availability Zone you requested ({zone}). Our system will be working on "
       "provisioning additional capacity. Launching EC2 instance failed.")
SPOT_ICE = ("Could not launch Spot Instances. InsufficientInstanceCapacity - There is no Spot capacity available "
            "that matches your request. Launching EC2 instance failed.")
# CloudFormation's reason when the group did not reach MinSize
STABILIZE = ("Group did not stabilize. {current/minSize/maxSize} group size = 0/4/4. Failed Scaling Activity: "
             "Could not launch On-Demand Instances. InsufficientInstanceCapacity - We currently do not have "
             "sufficient p4d.24xlarge capacity in the Availability Zone you requested (us-east-1a).")


@pytest.fixture
def capacity(monkeypatch):
    """zone -> instances moto's groups may still launch there (a zone not named: no limit)."""
    left: dict[str, int] = {}
    activities: dict[str, list[dict]] = {}
    launch = FakeAutoScalingGroup.replace_autoscaling_group_instances

    def limited(self, count_needed, propagated_tags):
        zone = self.availability_zones[0]
        n = min(count_needed, left.get(zone, count_needed))
        if zone in left:
            left[zone] -= n
        if n < count_needed:
            activities.setdefault(self.name, []).insert(0, {
                "ActivityId": str(uuid.uuid4()), "AutoScalingGroupName": self.name,
                "Description": f"Launching a new EC2 instance. Status Reason: {ICE}",
                "Cause": "an instance was started in response to a difference between desired and actual capacity",
                "StartTime": dt.datetime.now(dt.timezone.utc), "StatusCode": "Failed",
                "StatusMessage": ICE.format(type=self.instance_type, zone=zone)})
        if n:
            launch(self, n, propagated_tags)

    def describe(self):
        return ActionResult({"Activities": activities.get(self._get_param("AutoScalingGroupName"), [])})

    monkeypatch.setattr(FakeAutoScalingGroup, "replace_autoscaling_group_instances", limited)
    monkeypatch.setattr(AutoScalingResponse, "describe_scaling_activities", describe)
    return left


def zones(session) -> list[str]:
    """The default subnets' zones that offer g5.12xlarge, in the order nodes up tries them."""
    subs = session.client("ec2").describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"]
    return ec2.zone_order([s["AvailabilityZone"] for s in subs], ec2.offered_zones(session, "g5.12xlarge"))


def zones_of_instances(session) -> set[str]:
    return {i["Placement"]["AvailabilityZone"] for i in running(session)}


def test_capacity_error_in_the_first_zone_ends_in_the_second(aws, capacity):
    first, second = zones(aws)[:2]
    capacity[first] = 0
    said: list[str] = []
    cluster, _ = ec2.up(aws, spec(count=3), poll=0.05, timeout=5, say=said.append)
    assert {i.availability_zone for i in cluster.instances} == {second} and len(cluster.instances) == 3
    assert ec2.load_cluster("c1").instances == cluster.instances
    moved = [m for m in said if m.startswith("[nodes] no capacity")]
    assert moved == [f"[nodes] no capacity in {first} for 3 x g5.12xlarge (0 started: "
                     f"{ICE.format(type='g5.12xlarge', zone=first)}): deleting stack dtrain-c1 there (nothing of "
                     f"it stays in {first}), then trying {second}"]
    # nothing of the first zone's stack is left: one stack, one group, every instance in the second zone
    assert stacks(aws) == ["dtrain-c1"] and zones_of_instances(aws) == {second}
    groups = aws.client("autoscaling").describe_auto_scaling_groups()["AutoScalingGroups"]
    assert len(groups) == 1 and groups[0]["AvailabilityZones"] == [second]
    assert len(aws.client("ec2").describe_launch_templates()["LaunchTemplates"]) == 1


def test_a_partial_fill_below_min_count_moves_on(aws, capacity):
    first, second = zones(aws)[:2]
    capacity[first] = 1  # 1 of 4 starts, --min-count 2
    said: list[str] = []
    cluster, _ = ec2.up(aws, spec(count=4, min_count=2), poll=0.05, timeout=5, say=said.append)
    assert len(cluster.instances) == 4 and {i.availability_zone for i in cluster.instances} == {second}
    assert sum(m.startswith(f"[nodes] no capacity in {first} for 4 x g5.12xlarge (1 started: ") for m in said) == 1
    assert zones_of_instances(aws) == {second} and len(running(aws)) == 4


def test_a_partial_fill_at_min_count_stays(aws, capacity):
    first = zones(aws)[0]
    capacity[first] = 2
    said: list[str] = []
    cluster, _ = ec2.up(aws, spec(count=4, min_count=2), poll=0.05, timeout=0.5, say=said.append)
    assert len(cluster.instances) == 2 and zones_of_instances(aws) == {first}
    assert not any(m.startswith("[nodes] no capacity") for m in said)
    assert any("partial capacity: 2 of 4" in m for m in said)


def test_no_zone_with_capacity_leaves_nothing(aws, capacity):
    every = zones(aws)
    for z in every:
        capacity[z] = 0
    said: list[str] = []
    with pytest.raises(LaunchError, match=rf"^only 0 of 2 instances started in {every[-1]} \(--min-count 2\): "
                                          r"Could not launch .*InsufficientInstanceCapacity.*; no other zone of the "
                                          r"region offers the type; rolled back: stack dtrain-c1 deleted$"):
        ec2.up(aws, spec(count=2), poll=0.05, timeout=5, say=said.append)
    assert sum(m.startswith("[nodes] no capacity") for m in said) == len(every) - 1
    assert stacks(aws) == [] and running(aws) == []


def test_the_datas_zone_is_not_left(aws, capacity):
    first = zones(aws)[0]
    vol = aws.client("ec2").create_volume(AvailabilityZone=first, Size=10, VolumeType="io2", Iops=100,
                                          TagSpecifications=[{"ResourceType": "volume", "Tags": [
                                              {"Key": ec2.CLUSTER_TAG, "Value": "c1"},
                                              {"Key": ec2.DATASET_TAG[0], "Value": ec2.DATASET_TAG[1]}]}])["VolumeId"]
    capacity[first] = 0
    said: list[str] = []
    with pytest.raises(LaunchError, match=rf"^only 0 of 2 instances started in {first} .*; not moved to another zone: "
                                          rf"the cluster's dataset volume\(s\) {vol} are in {first} \(a volume "
                                          r"attaches in its own zone only\); rolled back"):
        ec2.up(aws, spec(count=2), poll=0.05, timeout=5, say=said.append)
    assert not any(m.startswith("[nodes] no capacity") for m in said)
    assert stacks(aws) == [] and running(aws) == []


def test_a_failure_that_is_not_capacity_does_not_move():
    res = ec2.Resolved(efa=False, nitro=True, gpus=1, vpc_id="vpc-1", subnet_id="subnet-a",
                       availability_zone="us-east-1a", other_zones=(("us-east-1b", "subnet-b"),))
    assert ec2.next_zone(res, ICE.format(type="p4d.24xlarge", zone="us-east-1a")) == ("us-east-1b", "subnet-b")
    assert ec2.next_zone(res, SPOT_ICE) == ("us-east-1b", "subnet-b")
    assert ec2.next_zone(res, STABILIZE) == ("us-east-1b", "subnet-b")
    assert ec2.next_zone(res, "") == ("us-east-1b", "subnet-b")  # not running by the timeout
    assert ec2.next_zone(res, "API: iam:CreateRole User: arn:aws:iam::1:user/u is not authorized") is None
    assert ec2.next_zone(res, "Resource handler returned message: \"The image id '[ami-1]' does not exist\"") is None
    assert ec2.next_zone(dataclasses.replace(res, zone_pin="--subnet subnet-a is in us-east-1a"), SPOT_ICE) is None
    assert ec2.next_zone(dataclasses.replace(res, other_zones=()), SPOT_ICE) is None


def test_new_vpc_tries_the_zones_that_offer_the_type(aws):
    res = ec2.preflight(aws, spec(new_vpc=True))
    offered = ec2.offered_zones(aws, "g5.12xlarge")
    assert [res.availability_zone, *(z for z, _ in res.other_zones)] == offered
    assert all(sub is None for _, sub in res.other_zones) and not res.zone_pin
    t = ec2.stack_template(spec(new_vpc=True), dataclasses.replace(res, availability_zone=offered[1]))
    assert t["Parameters"]["Zone"]["Default"] == offered[1]


def test_a_given_subnet_pins_its_zone(aws):
    sub = aws.client("ec2").describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"][0]
    res = ec2.preflight(aws, spec(subnet=sub["SubnetId"]))
    assert res.other_zones == () and res.zone_pin == f"--subnet {sub['SubnetId']} is in {sub['AvailabilityZone']}"


def test_a_spot_move_says_the_new_zones_spot_price(aws, capacity):
    first, second = zones(aws)[:2]
    capacity[first] = 0
    said: list[str] = []
    ec2.up(aws, spec(count=2, spot=True), poll=0.05, timeout=5, say=said.append)
    [line] = [m for m in said if m.startswith("[price]")]
    # moto's spot price history: $0.00001 an hour in every zone
    assert line.startswith(f"[price] 2 x g5.12xlarge spot in {second}: $0.000/h (EC2 spot price now in "), line
    assert line.endswith("; the on-demand price shown before stays its ceiling")
    assert said.index(line) == said.index(f"[nodes] stack dtrain-c1 creating in {second}") + 1
