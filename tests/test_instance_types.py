"""EC2's own instance-type data (issue 47): the shipped snapshot is DescribeInstanceTypes'
answer in the API's exact shape (botocore's model checks it), `refresh` makes it from the API
(moto's DescribeInstanceTypes here), lookups say what a type has and say when the data lacks
it, and a CPU AMI on a GPU type is refused or warned of."""

from __future__ import annotations

import json
import re

import boto3
import botocore.session
import pytest
from botocore.validate import ParamValidator
from moto import mock_aws

from dtrain.launch.errors import LaunchError
from dtrain.launch.infra import ec2
from dtrain.launch.infra import instance_types as it

REGION = "us-east-1"


def _output_shape():
    return botocore.session.get_session().get_service_model("ec2").operation_model(
        "DescribeInstanceTypes").output_shape


def test_the_snapshot_is_describe_instance_types_answer_in_botocores_shape():
    doc = json.loads(it.SNAPSHOT.read_text())
    report = ParamValidator().validate(doc["DescribeInstanceTypes"], _output_shape())
    assert not report.has_errors(), report.generate_report()
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", doc["snapshot"]["date"]) and doc["snapshot"]["source"]
    names = [e["InstanceType"] for e in doc["DescribeInstanceTypes"]["InstanceTypes"]]
    assert len(names) == len(set(names))
    enum = set(botocore.session.get_session().get_service_model("ec2").shape_for("InstanceType").enum)
    assert set(names) <= enum  # every type is one EC2 names
    families = {it.family(n) for n in names}
    for want in ("p3", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en", "g4dn", "g5", "g6", "g6e", "trn1", "trn1n",
                 "c5", "m5"):
        assert want in families, want


def test_the_shape_check_catches_a_wrong_field():
    """The check above can fail: a count as text, or a field the model does not have."""
    bad = {"InstanceTypes": [{"InstanceType": "p5.48xlarge", "GpuInfo": {"Gpus": [{"Count": "8"}]}, "Gpus": 8}]}
    report = ParamValidator().validate(bad, _output_shape()).generate_report()
    assert "Unknown parameter in InstanceTypes[0]: \"Gpus\"" in report and "GpuInfo.Gpus[0].Count" in report


@pytest.mark.parametrize("itype, gpus, efa, model", [
    ("p5en.48xlarge", 8, 16, "H200"), ("p5e.48xlarge", 8, 32, "H200"), ("p5.48xlarge", 8, 32, "H100"),
    ("p4d.24xlarge", 8, 4, "A100"), ("g6e.12xlarge", 4, 1, "L40S"), ("g6.xlarge", 1, 0, "L4"),
    ("g5.48xlarge", 8, 1, "A10G"), ("p3.8xlarge", 4, 0, "V100"), ("trn1.32xlarge", 0, 8, "Trainium"),
    ("c5.xlarge", 0, 0, None),
])
def test_lookups(itype, gpus, efa, model):
    assert it.gpu_count(itype) == gpus
    assert it.efa_count(itype) == efa
    assert (model in (it.gpu_model(itype) or "")) if model else it.gpu_model(itype) is None
    assert it.spot_supported(itype) is True


def test_a_type_the_data_lacks_is_none_and_said():
    assert it.gpu_count("m7i.large") is None and it.efa_count("m7i.large") is None
    line = it.missing("m7i.large")
    assert "\n" not in line and line.startswith("m7i.large is not in dtrain's instance-type data")
    assert "dtrain instance-types --refresh" in line
    assert it.architecture("g5g.xlarge") == "arm64" and it.architecture("p5.48xlarge") == "x86_64"


def test_refresh_from_describe_instance_types(monkeypatch, tmp_path):
    """`dtrain instance-types --refresh`'s code against moto's DescribeInstanceTypes (AWS's
    data as moto recorded it): the families only, trimmed, in the model's shape, dated."""
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        doc = it.refresh(boto3.client("ec2", region_name=REGION), ("p5en", "g6e", "c5"), today="2026-01-02")
    assert doc["snapshot"]["date"] == "2026-01-02" and doc["snapshot"]["region"] == REGION
    entries = doc["DescribeInstanceTypes"]["InstanceTypes"]
    assert {it.family(e["InstanceType"]) for e in entries} == {"p5en", "g6e", "c5"}
    assert not ParamValidator().validate(doc["DescribeInstanceTypes"], _output_shape()).has_errors()
    assert all(set(e) <= set(it.KEPT) for e in entries)
    path = it.write(doc, tmp_path / "types.json")
    snap = it.load(path)
    assert it.gpus_of(snap.types["p5en.48xlarge"]) == 8 and it.efa_of(snap.types["p5en.48xlarge"]) == 16
    assert it.gpus_of(snap.types["g6e.12xlarge"]) == 4


def test_the_task_lists_the_types_with_their_price():
    from dtrain.launch.infra import pricing

    lines = pricing.type_table("us-east-1")
    assert lines[0].startswith("# EC2 DescribeInstanceTypes of ")
    p5en = next(x for x in lines if x.startswith("p5en.48xlarge:"))
    assert "NVIDIA H200 x8" in p5en and "16 EFA" in p5en and "$63.2960/h on-demand" in p5en
    assert next(x for x in pricing.type_table("eu-west-1") if x.startswith("p5en.48xlarge:")).endswith(
        "price: not in the snapshot")


# --- a CPU image on a GPU type ---------------------------------------------------------------


def test_gpu_ami_problem():
    cpu_image = {"ImageId": "ami-1", "Name": "al2023-ami-ecs-hvm-2023.0.2024", "Description": "Amazon Linux ECS"}
    dl_image = {"ImageId": "ami-2", "Name": "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)"}
    kind, line = ec2.gpu_ami_problem("cpu", None, "p4d.24xlarge", True)
    assert kind == "refuse" and line.startswith("--ami cpu on p4d.24xlarge, a GPU type")
    kind, line = ec2.gpu_ami_problem("ami-1", cpu_image, "g6e.xlarge", True)
    assert kind == "warn" and "\n" not in line and "al2023-ami-ecs-hvm" in line
    assert ec2.gpu_ami_problem("ami-2", dl_image, "g6e.xlarge", True) is None
    assert ec2.gpu_ami_problem("cpu", None, "c5.xlarge", False) is None
    assert ec2.gpu_ami_problem("gpu", None, "p5.48xlarge", True) is None


@pytest.fixture
def aws(monkeypatch, tmp_path):
    monkeypatch.setenv("DTRAIN_HOME", str(tmp_path / "home"))
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k, raising=False)
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(k, v)
    with mock_aws():
        yield boto3.Session(region_name=REGION)


def test_nodes_up_refuses_the_cpu_ami_on_a_gpu_type(aws):
    spec = ec2.NodesSpec(name="c1", count=1, instance_type="p5en.48xlarge", ssh_cidr="203.0.113.7/32", ami="cpu")
    with pytest.raises(LaunchError, match=r"^--ami cpu on p5en\.48xlarge, a GPU type"):
        ec2.preflight(aws, spec)


def test_nodes_up_warns_of_an_ami_that_is_not_a_gpu_image(aws):
    images = aws.client("ec2").describe_images(Owners=["amazon"])["Images"]
    plain = next(i for i in images if i.get("Platform") != "windows" and i.get("RootDeviceType") == "ebs"
                 and not any(w in f"{i.get('Name', '')} {i.get('Description', '')}".lower() for w in ec2.GPU_AMI_WORDS))
    said: list[str] = []
    spec = ec2.NodesSpec(name="c1", count=1, instance_type="g6e.xlarge", ssh_cidr="203.0.113.7/32",
                         ami=plain["ImageId"])
    res = ec2.start(aws, spec, say=said.append)
    warned = [x for x in said if x.startswith("[nodes] warning: --ami")]
    assert len(warned) == 1 and "g6e.xlarge, a GPU type" in warned[0], said
    assert res.gpus == 1  # from EC2's data: the slots of the hostfile


def test_the_network_expectations_agree_with_ec2s_data():
    """launch/jobs/network_expectations.yaml keeps measured busbw figures; its link rate and EFA
    flag of each type must be what EC2 says (jobs/ cannot import infra/: this test is the link)."""
    import yaml

    table = yaml.safe_load((it.SNAPSHOT.parent.parent / "jobs" / "network_expectations.yaml").read_text())
    for itype, row in table["instance_types"].items():
        assert it.link_gbps(itype) == row["link_gbps"], itype
        assert bool(it.efa_count(itype)) == row["efa"], itype
    assert it.link_gbps("p5en.48xlarge") == 3200 and it.link_gbps("c5.xlarge") == 10
    assert it.link_gbps("m7i.large") is None
