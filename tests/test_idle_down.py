"""`nodes up --idle-down MINUTES` (issue 49): the node program launch/node/idle_down.py, its
rights (the role's policy: its own stack's DeleteStack and nothing else directly), its place in
the user data (first-boot.sh installs it as a service), its AWS call against moto on loopback,
and its timer on the simulated cluster: it fires after the idle time without a job, not during one."""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.parse
import urllib.request

import boto3
import cfnlint.api
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from dtrain import contract
from dtrain.launch.errors import LaunchError
from dtrain.launch.infra import ec2
from imds import Imds

from test_nodes import AMI_PARAM, CIDR, REGION, RESOLVED, invoke

# timing bounds (a heartbeat, a supervisor's reaction): run with the cluster tests, not beside them (dtrain/suite.py)
pytestmark = pytest.mark.serial

PROGRAM = ec2.IDLE_DOWN
spec_ = importlib.util.spec_from_file_location("idle_down", PROGRAM)
idle_down = importlib.util.module_from_spec(spec_)
spec_.loader.exec_module(idle_down)

ROLE_CREDS = {"Code": "Success", "AccessKeyId": "ASIATESTNODEROLE", "SecretAccessKey": "node-role-secret",
              "Token": "node-role-token", "Expiration": "2099-01-01T00:00:00Z"}


def spec(**kw) -> ec2.NodesSpec:
    return ec2.NodesSpec(**{**dict(name="c1", count=2, instance_type="g5.12xlarge", ssh_cidr=CIDR, ami=AMI_PARAM,
                                   idle_down=30), **kw})


def role_statements(template: dict) -> list[dict]:
    role = template["Resources"]["Role"]["Properties"]
    [policy] = [p for p in role["Policies"] if p["PolicyName"] == "dtrain-idle-down"]
    return policy["PolicyDocument"]["Statement"]


def lint(template: dict) -> list[str]:
    return [str(m) for m in cfnlint.api.lint(json.dumps(template, indent=1),
                                             config=cfnlint.api.ManualArgs(regions=[REGION]))]


# --- the rights -------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["default-vpc", "new-vpc-efs-spot"])
def test_idle_down_template_is_cfn_lint_clean(case):
    if case == "default-vpc":
        t = ec2.stack_template(spec(subnet="subnet-0123456789abcdef0"), RESOLVED["plain"])
    else:
        t = ec2.stack_template(spec(new_vpc=True, efs=True, spot=True), RESOLVED["efa"])
    assert lint(t) == []
    assert t["Resources"]["Role"]["Properties"]["Path"] == "/dtrain/c1/"
    assert t["Resources"]["InstanceProfile"]["Properties"]["Path"] == "/dtrain/c1/"


def test_the_role_may_delete_its_own_stack_and_nothing_else():
    t = ec2.stack_template(spec(), RESOLVED["plain"])
    statements = role_statements(t)
    direct = [s for s in statements if "Condition" not in s]
    # what the node itself may call: DeleteStack, on this stack only
    assert direct == [{"Sid": "DeleteOwnStack", "Effect": "Allow", "Action": "cloudformation:DeleteStack",
                       "Resource": {"Fn::Sub": "arn:${AWS::Partition}:cloudformation:${AWS::Region}:"
                                               "${AWS::AccountId}:stack/${AWS::StackName}/*"}}]
    # everything else only through CloudFormation (which acts for the node on that stack alone)
    for s in statements:
        assert s["Effect"] == "Allow" and "NotAction" not in s and "NotResource" not in s
        actions = [s["Action"]] if isinstance(s["Action"], str) else s["Action"]
        assert all("*" not in a for a in actions), actions
        verbs = {a.split(":")[1] for a in actions}
        assert all(v.startswith(("Delete", "Describe", "Get", "List", "Revoke", "Release", "Disassociate",
                                 "Detach", "Remove", "Update")) for v in verbs), verbs
        if s is not direct[0]:
            assert s["Condition"] == {"ForAnyValue:StringEquals": {"aws:CalledVia": ["cloudformation.amazonaws.com"]}}
    assert not any(a.startswith(("cloudformation:", "iam:Pass", "iam:Create", "iam:Put", "iam:Attach",
                                 "ec2:Run", "ec2:Create", "ec2:Terminate"))
                   for s in statements if s is not direct[0] for a in s["Action"])
    # the role's own deletion: only the stack's role and profile (their path names the cluster)
    [iam] = [s for s in statements if s.get("Sid") == "OwnRoleThroughCloudFormation"]
    assert all(a.startswith("iam:") for a in iam["Action"])
    assert iam["Resource"] == [{"Fn::Sub": "arn:${AWS::Partition}:iam::${AWS::AccountId}:role/dtrain/c1/*"},
                               {"Fn::Sub": "arn:${AWS::Partition}:iam::${AWS::AccountId}:instance-profile/dtrain/c1/*"}]
    # what deleting each resource type of the stack needs is there
    have = {a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    for needed in ("autoscaling:DeleteAutoScalingGroup", "ec2:DeleteLaunchTemplate", "ec2:DeleteSecurityGroup",
                   "ec2:DeletePlacementGroup", "ec2:ReleaseAddress", "elasticfilesystem:DeleteMountTarget",
                   "ec2:DeleteVpc", "iam:DeleteRole", "iam:DeleteInstanceProfile"):
        assert needed in have, needed
    # without --idle-down the role has no such rights
    plain = ec2.stack_template(spec(idle_down=None), RESOLVED["plain"])
    assert "Policies" not in plain["Resources"]["Role"]["Properties"]
    assert "Path" not in plain["Resources"]["Role"]["Properties"]


@pytest.mark.parametrize("kw, message", [
    (dict(idle_down=0), r"^--idle-down 0: minutes from 1 to 10080$"),
    (dict(idle_down=10081), r"^--idle-down 10081: minutes from 1 to 10080$"),
    (dict(instance_profile="mine"), r"^--idle-down lets the stack's own role delete its own stack; with "
                                    r"--instance-profile mine"),
    (dict(instance_profile="none"), r"^--idle-down .* --instance-profile none"),
])
def test_bad_idle_down(kw, message):
    with pytest.raises(LaunchError, match=message):
        spec(**kw)


def test_the_label_is_the_launchers():
    assert idle_down.JOB_LABEL == contract.LABEL_JOB


def test_signature_is_botocores():
    """The node program signs as botocore does (Signature Version 4), token included."""
    url = "https://cloudformation.eu-west-1.amazonaws.com/"
    body = b"Action=DeleteStack&StackName=dtrain-c1&Version=2010-05-15"
    req = AWSRequest(method="POST", url=url, data=body,
                     headers={"content-type": "application/x-www-form-urlencoded; charset=utf-8"})
    SigV4Auth(Credentials("AKID", "SECRET", "TOKEN"), "cloudformation", "eu-west-1").add_auth(req)
    now = dt.datetime.strptime(req.headers["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.timezone.utc)
    mine = idle_down.signed_headers(url, body, "eu-west-1", ("AKID", "SECRET", "TOKEN"), now)
    assert mine["x-amz-security-token"] == req.headers["X-Amz-Security-Token"] == "TOKEN"
    assert mine["authorization"] == req.headers["Authorization"]
    assert idle_down.endpoint_of("cn-north-1") == "https://cloudformation.cn-north-1.amazonaws.com.cn/"


# --- the user data ----------------------------------------------------------------------------


def test_user_data_carries_the_program_and_first_boot_installs_it(tmp_path):
    t = ec2.stack_template(spec(), RESOLVED["plain"])
    parts = t["Resources"]["LaunchTemplate"]["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
    head = parts[0]
    assert f"DTRAIN_IDLE_DOWN_S={30 * 60}\n" in head and head.endswith("\nDTRAIN_STACK=")
    program = head.split("DTRAIN_IDLE_PROGRAM=")[1].split("\n")[0]
    assert gzip.decompress(base64.b64decode(program)) == PROGRAM.read_bytes()
    assert parts[1:4] == [{"Ref": "AWS::StackName"}, "\nDTRAIN_REGION=", {"Ref": "AWS::Region"}]
    assert parts[4:] == ["\n", ec2.FIRST_BOOT.read_text().split("\n", 1)[1]]
    size = len("".join(p for p in parts if isinstance(p, str)).encode())
    assert size < 16 * 1024 - 200, size  # EC2's user data limit, with room for the stack's name

    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log = tmp_path / "calls.log"
    (bin_ / "systemctl").write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    (bin_ / "unpigz").write_text("#!/bin/sh\n")
    for tool in ("mkdir", "base64", "gunzip", "gzip", "cat"):
        (bin_ / tool).symlink_to(shutil.which(tool))
    for f in bin_.iterdir():
        f.chmod(0o755)
    env = {"PATH": str(bin_), "DTRAIN_IDLE_DOWN_S": "1800", "DTRAIN_IDLE_PROGRAM": program,
           "DTRAIN_STACK": "dtrain-c1", "DTRAIN_REGION": "us-east-1", "DTRAIN_IDLE_LIB": str(tmp_path / "lib"),
           "DTRAIN_IDLE_ETC": str(tmp_path / "etc"), "DTRAIN_UNIT_DIR": str(tmp_path / "units")}
    r = subprocess.run(["/bin/bash", str(ec2.FIRST_BOOT)], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "lib" / "idle_down.py").read_bytes() == PROGRAM.read_bytes()
    assert (tmp_path / "etc" / "idle-down.env").read_text() == \
        "DTRAIN_STACK=dtrain-c1\nDTRAIN_REGION=us-east-1\nDTRAIN_IDLE_DOWN_S=1800\n"
    unit = (tmp_path / "units" / "dtrain-idle-down.service").read_text()
    assert "ExecStart=/usr/bin/python3 /usr/local/lib/dtrain/idle_down.py" in unit
    assert "EnvironmentFile=/etc/dtrain/idle-down.env" in unit
    assert "enable --now dtrain-idle-down.service" in log.read_text()


# --- the AWS call, against moto on loopback ----------------------------------------------------


@pytest.fixture
def moto_loopback(monkeypatch, tmp_path):
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"), timeout=10).read()
    monkeypatch.setenv("DTRAIN_HOME", str(tmp_path / "home"))
    for k in ("AWS_PROFILE",):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    yield url
    server.stop()


def node_env() -> dict[str, str]:
    """The node's environment: no AWS credentials (the role's come from the metadata service)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}


def test_the_node_program_deletes_its_stack_on_moto(moto_loopback, tmp_path):
    session = boto3.Session(region_name=REGION)
    session.client("ssm").put_parameter(Name=AMI_PARAM, Value="ami-dca37ea5", Type="String")
    s = spec(count=2)
    res = ec2.start(session, s, say=lambda _m: None)
    ec2.finish(session, s, res, poll=0.05, timeout=5, say=lambda _m: None)
    assert ec2.stack_state(session, "c1") == "CREATE_COMPLETE"
    iam = session.client("iam")
    [role] = [r for r in iam.list_roles()["Roles"] if r["Path"] == "/dtrain/c1/"]
    policy = iam.get_role_policy(RoleName=role["RoleName"], PolicyName="dtrain-idle-down")["PolicyDocument"]
    text = urllib.parse.unquote(policy if isinstance(policy, str) else json.dumps(policy))
    # the deployed role's policy (moto keeps it as the text it was given): its own stack's ARN resolved
    assert "cloudformation:DeleteStack" in text and f"arn:aws:cloudformation:{REGION}:123456789012:stack/dtrain-c1/*" in text
    imds = Imds("127.0.0.1")
    imds.meta.update({"iam/security-credentials/": "dtrain-c1-Role-X",
                      "iam/security-credentials/dtrain-c1-Role-X": json.dumps(ROLE_CREDS)})
    no_job = tmp_path / "docker"
    no_job.write_text("#!/bin/sh\nexit 0\n")  # `docker ps` with no dtrain container running
    no_job.chmod(0o755)
    try:
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, str(PROGRAM), "--stack", "dtrain-c1", "--region", REGION, "--idle", "1",
                            "--poll", "0.2", "--endpoint", moto_loopback + "/", "--imds", imds.url,
                            "--docker", str(no_job)], env=node_env(), capture_output=True, text=True, timeout=60)
        took = time.monotonic() - t0
    finally:
        imds.close()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "DeleteStack dtrain-c1 accepted" in r.stdout and took >= 1
    assert "node-role-secret" not in r.stdout + r.stderr
    assert ec2.stack_state(session, "c1") is None
    assert session.client("autoscaling").describe_auto_scaling_groups()["AutoScalingGroups"] == []


def test_a_refused_delete_is_said_and_tried_again(moto_loopback, tmp_path):
    imds = Imds("127.0.0.1")  # no role: no credentials
    no_job = tmp_path / "docker"
    no_job.write_text("#!/bin/sh\nexit 0\n")
    no_job.chmod(0o755)
    try:
        with pytest.raises(subprocess.TimeoutExpired) as e:
            subprocess.run([sys.executable, str(PROGRAM), "--stack", "dtrain-c1", "--region", REGION, "--idle", "0.2",
                            "--poll", "0.2", "--endpoint", moto_loopback + "/", "--imds", imds.url,
                            "--docker", str(no_job)], env=node_env(), capture_output=True, text=True, timeout=3)
    finally:
        imds.close()
    out = (e.value.stdout or b"").decode() if isinstance(e.value.stdout, bytes) else (e.value.stdout or "")
    assert "DeleteStack dtrain-c1 failed (no credentials" in out and "trying again in 0 s" in out


# --- the timer, on the simulated cluster -------------------------------------------------------


def _sleep_image(node, tmp_path) -> str:
    """A one-binary image (sleep and the libraries it loads) in the node's own engine."""
    rootfs = tmp_path / "rootfs.tar"
    sleep = shutil.which("sleep")
    libs = [line.split("=>")[-1].split("(")[0].strip() for line in
            subprocess.run(["ldd", sleep], capture_output=True, text=True, check=True).stdout.splitlines()]
    with tarfile.open(rootfs, "w") as tar:
        tar.add(os.path.realpath(sleep), arcname="bin/sleep")
        for lib in (x for x in libs if x.startswith("/")):
            tar.add(os.path.realpath(lib), arcname=lib.lstrip("/"))
    ref = "dtrain-idle-test:1"
    subprocess.run(["docker", "-H", node.docker_host, "import", str(rootfs), ref], check=True, capture_output=True)
    return ref


@pytest.mark.cluster
def test_the_timer_fires_after_the_idle_time_and_not_during_a_job(cluster, tmp_path, monkeypatch):
    """node-1 runs idle_down.py over ssh (its own engine, its own network), the stand-ins for
    CloudFormation (moto) and the metadata service on the bridge: with no job the stack goes
    after the idle time; with a dtrain job container running it stays, and goes once the job ends."""
    from moto.server import ThreadedMotoServer

    from dtrain.launch.remote.hosts import parse_hostfile
    from dtrain.launch.remote.transport import SshTransport

    bridge = cluster.registry.split(":")[0]
    server = ThreadedMotoServer(ip_address=bridge, port=0)
    server.start()
    url = "http://{}:{}".format(*server.get_host_and_port())
    imds = Imds(bridge)
    imds.meta.update({"iam/security-credentials/": "role",
                      "iam/security-credentials/role": json.dumps(ROLE_CREDS)})
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(k, v)
    cfn = boto3.client("cloudformation", region_name=REGION, endpoint_url=url)
    template = json.dumps({"Resources": {"Handle": {"Type": "AWS::CloudFormation::WaitConditionHandle"}}})
    node = cluster.nodes[0]
    [first] = parse_hostfile(cluster.hostfile)[:1]
    ssh = SshTransport([first], ("-F", cluster.ssh_config), multiplex=False)
    program = PROGRAM.read_text()
    idle = 3.0

    def run_on_node(seconds: float) -> tuple[str, float]:
        """idle_down.py on node-1 (sent on stdin) for at most `seconds`; its output, its time."""
        argv = ["timeout", str(seconds), "python3", "-", "--stack", "dtrain-idle", "--region", REGION,
                "--idle", str(idle), "--poll", "0.5", "--endpoint", url + "/", "--imds", imds.url]
        t0 = time.monotonic()
        [r] = ssh.run([first], lambda n: argv, stdin=lambda n: program, timeout=seconds + 30, retries=0)
        return r.stdout, time.monotonic() - t0

    def stack_there() -> bool:
        return any(s["StackName"] == "dtrain-idle" and s["StackStatus"] != "DELETE_COMPLETE"
                   for s in cfn.describe_stacks()["Stacks"])

    try:
        # 1. no job: it fires after the idle time
        cfn.create_stack(StackName="dtrain-idle", TemplateBody=template)
        out, took = run_on_node(30)
        assert "DeleteStack dtrain-idle accepted" in out, out
        assert idle <= took < idle + 10, took
        assert not stack_there()
        print(f"idle-down, no job: fired after {took:.1f} s (idle {idle} s, over ssh)")
        # 2. a job (a container with the launcher's label) runs for longer than the idle time: no fire
        cfn.create_stack(StackName="dtrain-idle", TemplateBody=template)
        ref = _sleep_image(node, tmp_path)
        job = subprocess.run(["docker", "-H", node.docker_host, "run", "-d", "--rm", "--label",
                              f"{contract.LABEL_JOB}=idle-test", ref, "/bin/sleep", "8"],
                             capture_output=True, text=True, check=True).stdout.strip()
        try:
            out, took = run_on_node(6)  # the job runs for all of it
            assert "DeleteStack" not in out and "no dtrain job" not in out, out
            assert stack_there()
            # 3. the job ends: the idle time counts from then
            out, took = run_on_node(30)
            assert "DeleteStack dtrain-idle accepted" in out, out
            assert not stack_there()
            print(f"idle-down, after the job: fired after {took:.1f} s (the job's last ~2 s + idle {idle} s)")
        finally:
            subprocess.run(["docker", "-H", node.docker_host, "rm", "-f", job], capture_output=True)
    finally:
        imds.close()
        server.stop()


def test_cli_bad_idle_down_is_one_line_and_creates_nothing(moto_loopback):
    env = {**node_env(), "AWS_ENDPOINT_URL": moto_loopback, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent"}
    base = ["nodes", "up", "--name", "c1", "--count", "2", "--instance-type", "c5.xlarge", "--ssh-cidr", CIDR,
            "--ami", "ami-dca37ea5"]
    r = invoke(env, *base, "--idle-down", "soon")
    assert r.returncode == 2 and r.stderr == "error: --idle-down 'soon': expected a whole number from 1 to 10080\n"
    r = invoke(env, *base, "--idle-down", "30", "--instance-profile", "mine")
    assert r.returncode == 2 and r.stderr.startswith("error: --idle-down lets the stack's own role") \
        and r.stderr.count("\n") == 1, r.stderr
    cfn = boto3.client("cloudformation", region_name=REGION, endpoint_url=moto_loopback)
    assert cfn.describe_stacks()["Stacks"] == []
