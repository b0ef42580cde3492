"""Messages of `dtrain nodes` and `dtrain volume` that must say what is so (issue 38): the real
program against a moto server on loopback, nothing made on refused input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

ROOT = Path(__file__).resolve().parent.parent
REGION = "us-east-1"


@pytest.fixture
def world(moto_server, tmp_path):
    """(run the CLI, a boto3 session on the moto server, DTRAIN_HOME)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=moto_server, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
               AWS_DEFAULT_REGION=REGION, AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
               AWS_EC2_METADATA_DISABLED="true", DTRAIN_HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT))
    session = boto3.Session(region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "dtrain", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)

    def client(service: str):
        return session.client(service, endpoint_url=moto_server)

    return run, client, tmp_path / "home"


def one_error(r: subprocess.CompletedProcess) -> str:
    out = r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), out
    assert "Traceback" not in out, out
    return lines[0]


def kept_stack(client, name: str) -> None:
    """A stack as `nodes up --keep-on-failure` leaves it: in `nodes list`, no cluster.json here."""
    template = {"Resources": {"Sg": {"Type": "AWS::EC2::SecurityGroup",
                                     "Properties": {"GroupDescription": "kept"}}}}
    client("cloudformation").create_stack(StackName=f"dtrain-{name}", TemplateBody=json.dumps(template),
                                          Tags=[{"Key": "dtrain:cluster", "Value": name}])


def dataset_volume(client, name: str) -> str:
    return client("ec2").create_volume(
        AvailabilityZone=f"{REGION}a", Size=8, VolumeType="io2", Iops=100,
        TagSpecifications=[{"ResourceType": "volume", "Tags": [
            {"Key": "dtrain:cluster", "Value": name}, {"Key": "dtrain:role", "Value": "dataset"}]}])["VolumeId"]


def volumes_of(client, name: str) -> list[str]:
    return [v["VolumeId"] for v in client("ec2").describe_volumes(
        Filters=[{"Name": "tag:dtrain:cluster", "Values": [name]}])["Volumes"]]


def stacks(client) -> list[str]:
    return [s["StackName"] for s in client("cloudformation").describe_stacks()["Stacks"]
            if s["StackStatus"] != "DELETE_COMPLETE"]


def test_volume_create_on_a_kept_stack_says_its_state(world):
    run, client, home = world
    kept_stack(client, "kept")
    (home / "regions").parent.mkdir(parents=True, exist_ok=True)
    (home / "regions").write_text("us-east-1\n")  # as `nodes up` records the region it made a stack in
    listed = run("nodes", "list")
    row = listed.stdout.splitlines()[1].split() if listed.returncode == 0 else []
    assert row[:3] == ["kept", "us-east-1", "CREATE_COMPLETE"] and "kept" in row[3:], listed.stdout + listed.stderr
    msg = one_error(run("volume", "create", "--cluster", "kept", "--size", "8"))
    assert "stack dtrain-kept is CREATE_COMPLETE in region us-east-1" in msg, msg
    assert "--keep-on-failure" in msg and "dtrain nodes down --name kept" in msg, msg
    assert "no such cluster" not in msg, msg
    assert volumes_of(client, "kept") == []


def test_volume_create_on_no_cluster_says_so(world):
    run, client, home = world
    msg = one_error(run("volume", "create", "--cluster", "nope", "--size", "8"))
    # no region used here: AWS is not asked, the missing record is the answer
    assert msg.startswith("error: --cluster nope: no such cluster here (") and "dtrain nodes list" in msg, msg
    (home / "regions").parent.mkdir(parents=True, exist_ok=True)
    (home / "regions").write_text("us-east-1\n")
    msg = one_error(run("volume", "create", "--cluster", "nope", "--size", "8"))
    assert "--cluster nope: no such cluster (no stack dtrain-nope in region us-east-1" in msg, msg


def test_nodes_up_s3_write_without_a_bucket_is_refused(world):
    run, client, home = world
    msg = one_error(run("nodes", "up", "--name", "s3w", "--count", "1", "--instance-type", "c5.xlarge",
                        "--s3-write"))
    assert "--s3-write" in msg and "--s3-bucket" in msg, msg
    assert "dtrain-s3w" not in stacks(client)
    assert not home.exists() or not any(home.rglob("*"))


def test_nodes_down_delete_data_of_a_gone_stack(world):
    run, client, home = world
    vol = dataset_volume(client, "gone")
    r = run("nodes", "down", "--name", "gone", "--delete-data")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no stack dtrain-gone in region us-east-1 (deleted before): nothing to delete there" in r.stdout, r.stdout
    assert f"deleted the data it left: {vol}" in r.stdout and "deleted stack" not in r.stdout, r.stdout
    assert volumes_of(client, "gone") == []
    # again: nothing at all
    msg = one_error(run("nodes", "down", "--name", "gone", "--delete-data"))
    assert "nothing to delete: no stack dtrain-gone in region us-east-1 and no dataset volume or EFS" in msg, msg


def test_nodes_down_of_a_kept_stack_deletes_it(world):
    run, client, home = world
    kept_stack(client, "kept2")
    r = run("nodes", "down", "--name", "kept2")
    assert r.returncode == 0 and r.stdout.strip() == "deleted stack dtrain-kept2", r.stdout + r.stderr
    assert "dtrain-kept2" not in stacks(client)


@pytest.mark.parametrize("snapshot, needle", [
    ("snap-nope", "--from-snapshot 'snap-nope': not a snapshot id"),
    ("snap-0123456789abcdef0", "--from-snapshot snap-0123456789abcdef0: no such snapshot in region us-east-1"),
])
def test_volume_from_a_missing_snapshot_names_it(world, snapshot, needle):
    run, client, home = world
    from dtrain.launch.infra import ec2

    c = ec2.Cluster(name="c1", region=REGION, stack="dtrain-c1", instance_type="c5.xlarge", nitro=True, slots=1,
                    user="ubuntu", identity=None, instances=(ec2.Instance("i-0123456789abcdef0", "127.0.0.1", None,
                                                                          f"{REGION}a", "c5.xlarge"),))
    d = home / "clusters" / "c1"
    d.mkdir(parents=True)
    (d / "cluster.json").write_text(c.to_json())
    (d / "hostfile").write_text("127.0.0.1 slots=1 user=ubuntu port=1\n")
    msg = one_error(run("volume", "create", "--cluster", "c1", "--from-snapshot", snapshot))
    assert needle in msg and "None" not in msg, msg
    assert volumes_of(client, "c1") == []


def test_check_snapshot_passes_a_completed_one(aws):
    from dtrain.launch.infra import volume

    ec2 = aws.client("ec2")
    vol = ec2.create_volume(AvailabilityZone=f"{REGION}a", Size=8)["VolumeId"]
    snap = ec2.create_snapshot(VolumeId=vol)["SnapshotId"]
    volume.check_snapshot(ec2, snap, REGION)  # no error


def test_aws_error_text_leaves_out_a_missing_message():
    from botocore.exceptions import ClientError

    from dtrain.launch.infra.ec2 import aws_error_text

    e = ClientError({"Error": {"Code": "InvalidSnapshot.NotFound"}}, "CreateVolume")
    assert aws_error_text(e) == "InvalidSnapshot.NotFound"
    e = ClientError({"Error": {"Code": "X", "Message": "two\nlines"}}, "CreateVolume")
    assert aws_error_text(e) == "X: two lines"
