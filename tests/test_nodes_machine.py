"""`nodes up` as a new user meets it (issue 23): how this machine reaches the nodes (address
and ssh rule from where it is: IMDSv2), the AMI, the root disk, the nodes' role, the zone that
offers the type, data kept by `nodes down`. Pure functions, then moto and cfn-lint."""

from __future__ import annotations

import json

import cfnlint.api
import pytest
from botocore.validate import validate_parameters

from dtrain.launch.errors import LaunchError
from dtrain.launch.infra import ec2, volume
from imds import Imds

from test_nodes import AMI_PARAM, REGION, aws  # noqa: F401 - aws: moto with the AMI's parameter, DTRAIN_HOME

HERE = ec2.Vantage(vpc_id="vpc-1", private_ip="10.0.0.5", security_groups=("sg-1", "sg-2"))


def spec(**kw) -> ec2.NodesSpec:
    return ec2.NodesSpec(**{**dict(name="c1", count=2, instance_type="c5.xlarge", ssh_cidr="10.9.0.0/16",
                                   ami=AMI_PARAM), **kw})


def lint(template: dict) -> list[str]:
    return [str(m) for m in cfnlint.api.lint(json.dumps(template, indent=1),
                                             config=cfnlint.api.ManualArgs(regions=[REGION]))]


# --- where this machine is -------------------------------------------------------------------


@pytest.mark.parametrize("requested, cidr, here, vpc, want", [
    ("auto", None, HERE, "vpc-1", ("private", None, "sg-1")),          # inside: its security group
    ("auto", None, ec2.Vantage("vpc-1", "10.0.0.5"), "vpc-1", ("private", "10.0.0.5/32", None)),
    ("auto", None, HERE, "vpc-2", ("public", None, None)),             # another VPC: public, its /32 later
    ("auto", None, None, "vpc-1", ("public", None, None)),             # a laptop
    ("auto", None, HERE, None, ("public", None, None)),                # --new-vpc: never inside
    ("auto", "1.2.3.4/32", None, "vpc-1", ("public", "1.2.3.4/32", None)),  # --ssh-cidr wins
    ("private", None, HERE, "vpc-2", ("private", "10.0.0.5/32", None)),    # peered VPC
    ("public", None, HERE, "vpc-1", ("public", None, None)),
])
def test_decide_reach(requested, cidr, here, vpc, want):
    r = ec2.decide_reach(requested, cidr, here, vpc)
    assert (r.address, r.ssh_cidr, r.ssh_group) == want and r.why


def test_private_from_outside_needs_a_cidr():
    with pytest.raises(LaunchError, match=r"^--address private from outside the nodes' VPC .*--ssh-cidr"):
        ec2.decide_reach("private", None, None, "vpc-1")


def test_vantage_from_imds():
    imds = Imds("127.0.0.1")
    try:
        assert ec2.vantage(imds.url) is None  # no such paths: not an answer
        mac = "0e:00:00:00:00:01"
        imds.meta.update({"mac": mac, "local-ipv4": "10.0.0.5",
                          f"network/interfaces/macs/{mac}/vpc-id": "vpc-1",
                          f"network/interfaces/macs/{mac}/security-group-ids": "sg-1\nsg-2"})
        assert ec2.vantage(imds.url) == HERE
    finally:
        imds.close()
    assert ec2.vantage("http://127.0.0.1:9", timeout=0.5) is None  # nothing listening: off EC2


def test_vantage_respects_botocores_switch(monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert ec2.vantage() is None


def test_inside_the_vpc_ssh_comes_from_this_machines_group(aws):
    c = aws.client("ec2")
    vpc = c.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"][0]["VpcId"]
    mine = c.create_security_group(GroupName="mine", Description="this machine", VpcId=vpc)["GroupId"]
    said: list[str] = []
    res = ec2.start(aws, spec(ssh_cidr=None), address="auto", here=ec2.Vantage(vpc, "172.31.0.9", (mine,)),
                    say=said.append)
    assert res.address == "private" and res.ssh_rule == f"security group {mine}"
    assert any("private addresses; ssh from its security group " + mine in m for m in said), said
    sg = c.describe_security_groups(Filters=[{"Name": "tag:dtrain:cluster", "Values": ["c1"]}])["SecurityGroups"][0]
    assert any(p.get("FromPort") == 22 and [g["GroupId"] for g in p["UserIdGroupPairs"]] == [mine]
               for p in sg["IpPermissions"]), sg["IpPermissions"]


def test_outside_the_public_address_comes_from_checkip(aws, monkeypatch):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    import threading

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"127.0.0.7\n")

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("DTRAIN_CHECKIP_URL", f"http://127.0.0.1:{srv.server_address[1]}/")
    try:
        said: list[str] = []
        res = ec2.start(aws, spec(ssh_cidr=None), address="auto", here=None, say=said.append)
    finally:
        srv.shutdown()
    assert res.address == "public" and res.ssh_rule == "127.0.0.7/32"
    assert any("public addresses; ssh from this machine's public address (127.0.0.7/32)" in m for m in said), said


# --- AMI, root disk, role, zone ----------------------------------------------------------------


def test_ami_values():
    for good in ("auto", "gpu", "cpu", "ami-0123456789abcdef0", "/aws/service/x/y"):
        spec(ami=good)
    with pytest.raises(LaunchError, match=r"^--ami 'ubuntu': expected gpu, cpu, an AMI id"):
        spec(ami="ubuntu")
    assert ec2.ami_user({"Name": "al2023-ami-ecs-hvm"}) == "ec2-user"
    assert ec2.ami_user({"Name": "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)"}) == "ubuntu"
    assert ec2.root_size_default(75) == 240 and ec2.root_size_default(0) == 160


def test_ami_resolution_root_device_and_size(aws):
    ami_id, root, size, user = ec2.resolve_ami(aws, AMI_PARAM, gpus=True)
    assert (ami_id, root, size) == ("ami-dca37ea5", "/dev/sda1", 15)
    assert ec2.resolve_ami(aws, "ami-dca37ea5", gpus=False)[0] == "ami-dca37ea5"
    # cpu: the ECS-optimized AL2023's public parameter (moto serves it), user ec2-user
    assert ec2.resolve_ami(aws, "cpu", gpus=False)[3] == "ec2-user"
    with pytest.raises(LaunchError, match=r"^--ami /nope: no SSM parameter /nope in us-east-1"):
        ec2.resolve_ami(aws, "/nope", gpus=False)
    with pytest.raises(LaunchError, match=r"^--ami ami-0000000000000000f: no image ami-0000000000000000f"):
        ec2.resolve_ami(aws, "ami-0000000000000000f", gpus=False)
    res = ec2.preflight(aws, spec(root_size=None))
    assert res.root_size == ec2.root_size_default(15) and res.root_device == "/dev/sda1"
    with pytest.raises(LaunchError, match=r"^--root-size 10: the AMI ami-dca37ea5's snapshot is 15 GiB"):
        ec2.preflight(aws, spec(root_size=10))


def test_zone_offers_the_type():
    assert ec2.pick_zone(["us-east-1a", "us-east-1e"], ["us-east-1e"], "p5.48xlarge") == "us-east-1e"
    assert ec2.pick_zone(["a", "b"], ["a", "b"], "t", preferred="b") == "b"
    assert ec2.pick_zone(["a", "b"], ["a", "b"], "t", preferred="z") == "a"
    with pytest.raises(LaunchError, match=r"^--instance-type p5.48xlarge: offered in us-east-1c of this region"):
        ec2.pick_zone(["us-east-1a"], ["us-east-1c"], "p5.48xlarge")


def test_subnet_in_a_zone_without_the_type_is_refused(aws):
    offered = set(ec2.offered_zones(aws, "p4d.24xlarge"))
    c = aws.client("ec2")
    subs = c.describe_subnets()["Subnets"]
    bad = next(s for s in subs if s["AvailabilityZone"] not in offered)
    with pytest.raises(LaunchError, match=rf"^--subnet {bad['SubnetId']}: p4d.24xlarge is not offered in its zone"):
        ec2.preflight(aws, spec(instance_type="p4d.24xlarge", subnet=bad["SubnetId"]))
    res = ec2.preflight(aws, spec(instance_type="p4d.24xlarge", efa_interfaces=1))
    assert res.availability_zone in offered
    new = ec2.preflight(aws, spec(instance_type="p4d.24xlarge", new_vpc=True, efa_interfaces=1))
    t = ec2.stack_template(spec(instance_type="p4d.24xlarge", new_vpc=True, efa_interfaces=1), new)
    assert t["Resources"]["Subnet"]["Properties"]["AvailabilityZone"] == {"Ref": "Zone"}
    assert t["Parameters"]["Zone"]["Default"] == new.availability_zone in offered


@pytest.mark.parametrize("kw", [{}, {"s3_buckets": ("my-data",)}, {"s3_buckets": ("a-b", "c.d"), "s3_write": True},
                                {"instance_profile": "existing"}, {"instance_profile": "none"},
                                {"new_vpc": True, "efs": True}])
def test_role_variants_lint_and_deploy(aws, kw):
    if kw.get("instance_profile") == "existing":
        iam = aws.client("iam")
        iam.create_instance_profile(InstanceProfileName="existing")
    s = spec(**kw)
    res = ec2.preflight(aws, s)
    t = ec2.stack_template(s, res)
    assert lint(t) == []
    data = t["Resources"]["LaunchTemplate"]["Properties"]["LaunchTemplateData"]
    if kw.get("instance_profile") == "none":
        assert "IamInstanceProfile" not in data and "Role" not in t["Resources"]
    elif kw.get("instance_profile"):
        assert data["IamInstanceProfile"] == {"Name": "existing"} and "Role" not in t["Resources"]
    else:
        role = t["Resources"]["Role"]["Properties"]
        assert role["ManagedPolicyArns"] == [
            {"Fn::Sub": "arn:${AWS::Partition}:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly"}]
        actions = [a for p in role.get("Policies", []) for st in p["PolicyDocument"]["Statement"] for a in st["Action"]]
        assert ("s3:GetObject" in actions) == bool(kw.get("s3_buckets"))
        assert ("s3:PutObject" in actions) == bool(kw.get("s3_write"))
    model = aws.client("cloudformation").meta.service_model.operation_model("CreateStack").input_shape
    validate_parameters({"StackName": "dtrain-c1", "TemplateBody": json.dumps(t), "Capabilities": ["CAPABILITY_IAM"],
                         "OnFailure": "DELETE"}, model)
    ec2.create_stack(aws, s, t)
    status, out = ec2.stack_status(aws, "c1")
    assert status == "CREATE_COMPLETE"


def test_bad_machine_flags():
    for kw, msg in [({"root_size": 4}, "--root-size 4"), ({"s3_buckets": ("Bad_Bucket",)}, "--s3-bucket 'Bad_Bucket'"),
                    ({"instance_profile": "a b"}, "--instance-profile 'a b'")]:
        with pytest.raises(LaunchError, match=msg):
            spec(**kw)


def test_missing_instance_profile_is_refused(aws):
    with pytest.raises(LaunchError, match=r"^--instance-profile nope: no such instance profile"):
        ec2.preflight(aws, spec(instance_profile="nope"))


# --- data that outlives the nodes ------------------------------------------------------------


def test_efs_is_kept_and_mounted_again_by_a_cluster_of_the_same_name(aws):
    s = spec(efs=True, subnet=None)
    first, _ = ec2.up(aws, s, poll=0.05, timeout=5, say=lambda m: None)
    assert first.file_system
    kept = ec2.delete_stack(aws, "c1", poll=0.05)
    assert kept == [first.file_system]
    fss = aws.client("efs").describe_file_systems()["FileSystems"]
    assert [f["FileSystemId"] for f in fss] == [first.file_system]  # Retain: the stack left it
    res = ec2.preflight(aws, s)
    assert res.file_system == first.file_system
    t = ec2.stack_template(s, res)
    assert "FileSystem" not in t["Resources"] and lint(t) == []
    assert t["Resources"]["MountTarget"]["Properties"]["FileSystemId"] == first.file_system
    second, _ = ec2.up(aws, s, poll=0.05, timeout=5, say=lambda m: None)
    assert second.file_system == first.file_system
    gone = ec2.delete_stack(aws, "c1", poll=0.05, delete_data=True)
    assert gone == [first.file_system]
    assert aws.client("efs").describe_file_systems()["FileSystems"] == []


def test_device_names_are_chosen_free():
    assert volume.free_device(set()) == "/dev/sdf"
    assert volume.free_device({"/dev/sda1", "/dev/sdf", "/dev/xvdg"}) == "/dev/sdh"
    with pytest.raises(LaunchError, match="no free device name"):
        volume.free_device(set(volume.DEVICE_NAMES))


def test_fill_from_values():
    volume.VolumeSpec(cluster="c", size_gb=8, fill_from="s3://my-bucket/imagenet/train")
    volume.VolumeSpec(cluster="c", size_gb=8, fill_from="/home/ubuntu/data")
    with pytest.raises(LaunchError, match=r"^--fill-from 'data': an absolute directory"):
        volume.VolumeSpec(cluster="c", size_gb=8, fill_from="data")
    with pytest.raises(LaunchError, match=r"^--fill-from 's3://Bad_Bucket/x'"):
        volume.VolumeSpec(cluster="c", size_gb=8, fill_from="s3://Bad_Bucket/x")


def test_ssh_user_tag_is_what_ec2_tag_discovery_uses(aws):
    from dtrain.launch.targets.ec2 import discover_ec2

    ec2.up(aws, spec(ami="cpu"), poll=0.05, timeout=5, say=lambda m: None)
    found = discover_ec2(f"{ec2.CLUSTER_TAG}=c1", session=aws)
    assert [n.user for n in found] == ["ec2-user", "ec2-user"]
    assert "user=ec2-user" in (ec2.cluster_dir("c1") / "hostfile").read_text()


def test_efs_is_mounted_at_boot_by_the_user_data(aws, tmp_path):
    """With --efs the user data carries the file system's id (a Ref, or the kept one's id) and
    first-boot.sh writes the fstab line and EFS_MOUNT, and mounts it (a stand-in `mount`)."""
    import subprocess

    s = spec(efs=True)
    res = ec2.preflight(aws, s)
    t = ec2.stack_template(s, res)
    assert lint(t) == []
    parts = t["Resources"]["LaunchTemplate"]["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
    assert {"Ref": "FileSystem"} in parts and {"Ref": "AWS::Region"} in parts
    assert t["Resources"]["Nodes"]["DependsOn"] == "MountTarget"
    kept = ec2.stack_template(s, ec2.Resolved(**{**res.__dict__, "file_system": "fs-0123456789abcdef0"}))
    kept_parts = kept["Resources"]["LaunchTemplate"]["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
    assert "fs-0123456789abcdef0" in kept_parts
    # what the node runs: the parts joined as CloudFormation would, the Refs resolved
    script = "".join({"Ref": "FileSystem"} == p and "fs-0123456789abcdef0" or {"Ref": "AWS::Region"} == p and REGION
                     or p for p in parts)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "mount").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/mounted\n")
    (tmp_path / "bin" / "mount").chmod(0o755)
    (tmp_path / "bin" / "unpigz").write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "unpigz").chmod(0o755)
    fstab, envfile = tmp_path / "fstab", tmp_path / "environment"
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "DTRAIN_FSTAB": str(fstab), "DTRAIN_ENVIRONMENT": str(envfile),
           "DTRAIN_EFS_PATH": str(tmp_path / "efs")}
    for _ in range(2):  # a second boot adds nothing
        r = subprocess.run(["/bin/bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
    assert fstab.read_text() == (f"fs-0123456789abcdef0.efs.{REGION}.amazonaws.com:/ {tmp_path / 'efs'} nfs4 "
                                 "nfsvers=4.1,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,noresvport,"
                                 "_netdev,nofail 0 0 # dtrain\n")
    assert envfile.read_text() == f"EFS_MOUNT={tmp_path / 'efs'}\n"
    assert (tmp_path / "mounted").read_text() == f"{tmp_path / 'efs'}\n{tmp_path / 'efs'}\n"


def test_a_windows_ami_or_a_profile_with_buckets_is_refused(aws):
    win = aws.client("ec2").describe_images(Filters=[{"Name": "platform", "Values": ["windows"]}])["Images"]
    assert win, "moto lists Windows images"
    with pytest.raises(LaunchError, match=rf"^--ami {win[0]['ImageId']}: {win[0]['ImageId']} is a windows image"):
        ec2.resolve_ami(aws, win[0]["ImageId"], gpus=False)
    with pytest.raises(LaunchError, match=r"^--s3-bucket/--s3-write shape the stack's own role"):
        spec(instance_profile="existing", s3_buckets=("my-data",))
