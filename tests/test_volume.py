"""`invoke volume create`: the EBS requests (botocore's models, moto), the clear refusals, the
node-side scripts (shellcheck), and a rehearsal on the simulated cluster: one loop device
"attached" to every node, formatted once, mounted read-only in each node's own mount
namespace, read by a 3-node job; writes fail."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ParamValidationError
from botocore.validate import validate_parameters
from moto import mock_aws

from dtrain.launch.errors import LaunchError
from dtrain.launch.infra import ec2, volume
from dtrain.launch.remote.hosts import Node, parse_hostfile

ROOT = Path(__file__).resolve().parent.parent
REGION = "us-east-1"


def inst(i: int, zone: str = "us-east-1a") -> ec2.Instance:
    return ec2.Instance(f"i-{i:017x}", f"10.0.0.{10 + i}", None, zone, "c5.xlarge")


def cluster_of(instances, nitro=True, fs=None) -> ec2.Cluster:
    return ec2.Cluster(name="c1", region=REGION, stack="dtrain-c1", instance_type="c5.xlarge", nitro=nitro,
                       slots=1, user="ubuntu", identity=None, instances=tuple(instances), file_system=fs)


def validate(operation: str, params: dict) -> None:
    model = boto3.client("ec2", region_name=REGION).meta.service_model.operation_model(operation)
    validate_parameters(params, model.input_shape)


# --- requests and refusals (pure) -----------------------------------------------------------


def test_requests_match_botocore_models():
    c = cluster_of([inst(1), inst(2)])
    req = volume.create_volume_request(c, volume.VolumeSpec(cluster="c1", size_gb=100, snapshot="snap-0123abcd"),
                                       volume.zone_of(c))
    assert req["VolumeType"] == "io2" and req["MultiAttachEnabled"] is True and req["AvailabilityZone"] == "us-east-1a"
    validate("CreateVolume", req)
    for r in volume.attach_requests("vol-0123", c):
        validate("AttachVolume", r)
    with pytest.raises(ParamValidationError):  # the check itself bites
        validate("CreateVolume", {**req, "MultiAttach": True})


@pytest.mark.parametrize("c, message", [
    (cluster_of([inst(1), inst(2, "us-east-1b")]), "nodes span zones us-east-1a, us-east-1b"),
    (cluster_of([inst(1)], nitro=False), "c5.xlarge is not a Nitro instance type"),
    (cluster_of([inst(i) for i in range(17)]), "attaches to at most 16"),
])
def test_multi_attach_refusals(c, message):
    with pytest.raises(LaunchError, match=message):
        volume.zone_of(c)


@pytest.mark.parametrize("kw, message", [
    ({}, "--size GiB is required"), ({"size_gb": 2}, "io2 volumes are 4 to 16384 GiB"),
    ({"efs": True, "size_gb": 10}, "--efs takes no --size"), ({"size_gb": 10, "mount_path": "data"}, "absolute"),
])
def test_bad_volume_flags(kw, message):
    with pytest.raises(LaunchError, match=message):
        volume.VolumeSpec(cluster="c1", **kw)


def test_devices_and_script_argv():
    assert volume.nvme_device("vol-0abc") == "/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol0abc"
    assert volume.efs_dns("fs-1", REGION) == "fs-1.efs.us-east-1.amazonaws.com"
    argv = volume.script_argv(Node("10.0.0.1", user="ubuntu"), "volume-mount.sh", ["ebs", "/dev/x", "/my data;rm"])
    assert argv[-1] == "sudo -n sh -s -- ebs /dev/x '/my data;rm'"
    assert volume.script_argv(Node("10.0.0.1", user="root"), "volume-mount.sh", ["efs", "a", "/d"])[-1] == \
        "sh -s -- efs a /d"


def test_node_scripts_are_shellcheck_clean():
    scripts = sorted(str(p) for p in (ROOT / "launch" / "node").glob("volume-*.sh"))
    assert len(scripts) == 3  # format, mount, umount
    r = subprocess.run(["shellcheck", *scripts], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_efs_needs_the_clusters_file_system():
    with pytest.raises(LaunchError, match="has no EFS file system"):
        volume.create(None, cluster_of([inst(1)]), [Node("10.0.0.11")], volume.VolumeSpec(cluster="c1", efs=True))


# --- against moto --------------------------------------------------------------------------


@pytest.fixture
def aws(monkeypatch, tmp_path):
    monkeypatch.setenv("DTRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        session = boto3.Session(region_name=REGION)
        session.client("ssm").put_parameter(Name="/dtrain-test/dlami", Value="ami-dca37ea5", Type="String")
        yield session


def nodes_up(session, count):
    spec = ec2.NodesSpec(name="c1", count=count, instance_type="c5.xlarge", ssh_cidr="203.0.113.7/32",
                         ami="/dtrain-test/dlami")
    return ec2.up(session, spec, poll=0.05, timeout=5, say=lambda m: None)[0]


def test_volume_attached_to_every_node(aws):
    c = nodes_up(aws, 3)
    vol = volume.create_and_attach(aws, c, volume.VolumeSpec(cluster="c1", size_gb=100), poll=0.05,
                                   say=lambda m: None)
    v = aws.client("ec2").describe_volumes(VolumeIds=[vol])["Volumes"][0]
    assert (v["VolumeType"], v["MultiAttachEnabled"], v["Size"], v["AvailabilityZone"]) == \
        ("io2", True, 100, c.instances[0].availability_zone)
    assert volume.attached_to(aws.client("ec2"), vol, [i.id for i in c.instances]) == {i.id for i in c.instances}


def test_nodes_down_keeps_the_dataset_volume_unless_delete_data(aws):
    # one node: moto keeps one attachment per volume, and fails to terminate a second holder
    c = nodes_up(aws, 1)
    vol = volume.create_and_attach(aws, c, volume.VolumeSpec(cluster="c1", size_gb=8), poll=0.05,
                                   say=lambda m: None)
    assert ec2.delete_stack(aws, "c1", poll=0.05) == [vol]  # kept, and said
    left = {v["VolumeId"]: v for v in aws.client("ec2").describe_volumes()["Volumes"]}
    assert vol in left
    assert ec2.data_zone(aws, "c1") == left[vol]["AvailabilityZone"]  # a cluster of the name comes back there
    # the stack is gone; --delete-data still deletes what it left
    assert ec2.delete_stack(aws, "c1", poll=0.05, delete_data=True) == [vol]
    assert vol not in [v["VolumeId"] for v in aws.client("ec2").describe_volumes()["Volumes"]]
    with pytest.raises(LaunchError, match="no stack dtrain-c1"):
        ec2.delete_stack(aws, "c1", poll=0.05, delete_data=True)


def test_failed_attach_deletes_the_volume(aws):
    c = nodes_up(aws, 2)
    gone = ec2.Instance("i-00000000000000000", "10.0.0.99", None, c.instances[0].availability_zone, "c5.xlarge")
    bad = cluster_of([*c.instances, gone])
    with pytest.raises(LaunchError, match="volume deleted"):
        volume.create_and_attach(aws, bad, volume.VolumeSpec(cluster="c1", size_gb=8), poll=0.05, say=lambda m: None)
    vols = aws.client("ec2").describe_volumes(
        Filters=[{"Name": "tag:dtrain:role", "Values": ["dataset"]}])["Volumes"]
    assert vols == []


# --- rehearsal on the simulated cluster ------------------------------------------------------

MOUNT = "/mnt/dtrain-test-dataset"

READ_AND_HASH = (
    "import hashlib, os\n"
    "rank = os.environ['OMPI_COMM_WORLD_RANK']\n"
    "digest = hashlib.sha256(open('/data/shard-0.bin', 'rb').read()).hexdigest()\n"
    "print(f'rank {rank} sha256 {digest}', flush=True)\n"
    "try:\n"
    "    open('/data/written-by-' + rank, 'w').write('x')\n"
    "    print(f'rank {rank} write SUCCEEDED', flush=True)\n"
    "except OSError as e:\n"
    "    print(f'rank {rank} write refused: {e.strerror}', flush=True)\n"
)


@pytest.fixture
def loop_device(tmp_path):
    backing = tmp_path / "dataset.img"
    with open(backing, "wb") as f:
        f.truncate(64 * 1024 * 1024)  # sparse
    dev = subprocess.run(["losetup", "--find", "--show", str(backing)], capture_output=True, text=True,
                         check=True).stdout.strip()
    yield dev
    subprocess.run(["losetup", "-d", dev], check=False)


@pytest.mark.cluster
def test_rehearsal_one_device_read_only_on_3_nodes(cluster, remote_images, loop_device, tmp_path):
    from dtrain.launch.jobs import container
    from dtrain.launch.jobs.job import Job
    from dtrain.launch.jobs.store import job_log
    from dtrain.launch.jobs.spec import JobSpec

    nodes = parse_hostfile(cluster.hostfile)[:3]
    opts = ("-F", cluster.ssh_config)
    src = tmp_path / "dataset"  # on node-1 (the nodes share the host's filesystem)
    src.mkdir()
    data = os.urandom(1 << 20)
    (src / "shard-0.bin").write_bytes(data)
    said: list[str] = []
    fstab = tmp_path / "fstab"  # the nodes share this machine's /etc: each writes this one instead
    fstab.write_text("# the host's lines\n")
    try:
        volume.prepare(nodes, loop_device, MOUNT, fill_from=str(src), ssh_opts=opts, say=said.append,
                       fstab=str(fstab))
        assert sum("formatted" in m for m in said) == 1 and said[0].startswith(f"[{nodes[0].host}]"), said
        # mounted again at boot: one nofail line (the 3 nodes rewrite the same shared file here,
        # one at a time: the script locks it)
        assert fstab.read_text().splitlines() == [
            "# the host's lines", f"{loop_device} {MOUNT} ext4 ro,noload,nofail,_netdev 0 0 # dtrain"]
        assert not os.path.ismount(MOUNT), "mounted in the nodes' namespaces only, not the host's"
        for i in range(1, 4):
            r = subprocess.run(["ssh", "-F", cluster.ssh_config, f"node-{i}",
                                f"findmnt -n -o OPTIONS --mountpoint {MOUNT}; touch {MOUNT}/x"],
                               capture_output=True, text=True, timeout=60)
            assert re.match(r"^ro,", r.stdout), r.stdout + r.stderr
            assert "Read-only file system" in r.stderr
        # formatting while a node has it mounted is refused; mounting again is a no-op
        with pytest.raises(LaunchError, match="is mounted on node-1; unmount it on every node first"):
            volume.prepare(nodes, loop_device, MOUNT, ssh_opts=opts, say=said.append, fstab=str(fstab))
        said.clear()
        volume._run_script(nodes, "volume-mount.sh", ["ebs", loop_device, MOUNT, str(fstab)], opts, "mount",
                           said.append)
        assert sum(f"already has {loop_device}" in m for m in said) == 3, said

        # a 3-node job reads the same file through it; the bind mount is rw, the filesystem refuses
        name = "t-volume"
        job = Job(JobSpec(image=remote_images["horovod-tensorflow"], name=name, ssh_opts=opts,
                          command=("python", "-c", READ_AND_HASH),
                          mounts=(container.parse_mount(f"{MOUNT}:/data"),)), nodes, say=lambda m: None)
        code = job.run()
        out = job_log(name).read_text()
        assert code == 0, out
        sums = re.findall(r"rank (\d) sha256 (\w+)", out)
        assert sorted(r for r, _ in sums) == ["0", "1", "2"], out
        assert {s for _, s in sums} == {hashlib.sha256(data).hexdigest()}, out
        assert len(re.findall(r"rank \d write refused: Read-only file system", out)) == 3, out

        # unmounted everywhere, prepared again: the filesystem (and its data) is not formatted over
        for i in range(1, 4):
            subprocess.run(["ssh", "-F", cluster.ssh_config, f"node-{i}", f"umount {MOUNT}"], check=True, timeout=60)
        said.clear()
        volume.prepare(nodes, loop_device, MOUNT, ssh_opts=opts, say=said.append, fstab=str(fstab))
        assert any("already holds ext4; not formatting" in m for m in said), said
        r = subprocess.run(["ssh", "-F", cluster.ssh_config, "node-3", f"sha256sum {MOUNT}/shard-0.bin"],
                           capture_output=True, text=True, timeout=60)
        assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()
        # what a failed `volume create` does on every node: unmounted, its fstab line gone
        volume.unmount(nodes, MOUNT, opts, str(fstab))
        assert fstab.read_text() == "# the host's lines\n"
        for i in range(1, 4):
            r = subprocess.run(["ssh", "-F", cluster.ssh_config, f"node-{i}",
                                f"findmnt -n -o SOURCE --mountpoint {MOUNT} || echo none"],
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0 and r.stdout == "none\n", f"node-{i}: {r.stdout}{r.stderr}"
    finally:
        for i in range(1, 4):
            subprocess.run(["ssh", "-F", cluster.ssh_config, f"node-{i}", f"umount {MOUNT} && rmdir {MOUNT}"],
                           capture_output=True, timeout=60)


def test_fill_from_s3_syncs_onto_the_new_filesystem(loop_device, tmp_path):
    """volume-format.sh DEVICE s3://BUCKET/PREFIX: formats, mounts it in a temporary place,
    runs `aws s3 sync` into it (the node's AWS CLI and role; a stand-in `aws` here that records
    its argv and copies a directory standing for the bucket), unmounts. The stand-in is the
    only fake: the format, the mount and the copy onto ext4 are real."""
    bucket = tmp_path / "bucket"
    (bucket / "train").mkdir(parents=True)
    (bucket / "train" / "0.tar").write_bytes(b"x" * 4096)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "aws").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/aws.argv\ncp -a {bucket}/. "$5"\n')
    (bin_ / "aws").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"}
    script = ROOT / "launch" / "node" / "volume-format.sh"
    r = subprocess.run(["bash", str(script), loop_device, "s3://my-bucket/imagenet"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    argv = (tmp_path / "aws.argv").read_text().split()
    assert argv[:4] == ["s3", "sync", "--only-show-errors", "s3://my-bucket/imagenet"], argv
    assert "copied s3://my-bucket/imagenet onto" in r.stdout
    check = tmp_path / "check"
    check.mkdir()
    subprocess.run(["mount", "-o", "ro", loop_device, str(check)], check=True)
    try:
        assert (check / "train" / "0.tar").read_bytes() == b"x" * 4096
    finally:
        subprocess.run(["umount", str(check)], check=True)
    # without the AWS CLI on the node: one line, nothing formatted over
    env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
    r = subprocess.run(["bash", str(script), loop_device, "s3://my-bucket/imagenet"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("volume-format: no aws command on "), r.stderr


def test_umount_drops_only_dtrains_line_for_that_exact_path(tmp_path):
    """volume-umount.sh compares the path as text: /mnt/a.b's line goes, /mnt/axb's (which the
    path read as a pattern would match) and a line that is not dtrain's stay."""
    fstab = tmp_path / "fstab"
    keep = ["# the host's lines", "/dev/y /mnt/axb ext4 ro,noload,nofail,_netdev 0 0 # dtrain",
            "fs:/ /mnt/a.b nfs4 nfsvers=4.1 0 0"]
    before = [keep[0], "/dev/x /mnt/a.b ext4 ro,noload,nofail,_netdev 0 0 # dtrain", *keep[1:]]
    fstab.write_text("\n".join(before) + "\n")
    r = subprocess.run(["bash", str(ROOT / "launch" / "node" / "volume-umount.sh"), str(tmp_path / "a.b-missing"),
                        str(fstab)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert fstab.read_text().splitlines() == before  # nothing for a path it never mounted
    r = subprocess.run(["bash", str(ROOT / "launch" / "node" / "volume-umount.sh"), "/mnt/a.b", str(fstab)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert fstab.read_text().splitlines() == keep
