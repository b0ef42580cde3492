"""A launch that brings its own nodes (issue 49): `dtrain launch -f job.yaml` with `up: 4 x
p4d.24xlarge` shows the price and asks, makes the stack (`nodes up`'s code), runs the job on it
and deletes it after; a refused price creates nothing; a failure or Ctrl-C while the nodes are
awaited deletes the stack; `--keep` keeps it and says its price per hour and how to take it down
(launch/up.py). And `launch --cluster NAME` on an EC2 cluster follows its Auto Scaling group first.

The real program against a moto server on loopback: moto's instance addresses are invented, so
ssh never leaves this machine (ProxyCommand=/bin/false). The whole run, job included, is the
cluster test at the end: moto hands the instances the simulated cluster's addresses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3
import pytest

from dtrain import values
from dtrain.launch import up
from dtrain.launch.errors import LaunchError
from dtrain.launch.infra import ec2
from dtrain.launch.jobs import config, jobfile

from test_nodes import aws, moto_server, quiet, running, spec  # noqa: F401 - fixtures
from test_nodes_addresses import cfn_releases_addresses  # noqa: F401 - fixture (autouse there): moto releases EIPs

ROOT = Path(__file__).resolve().parent.parent
REGION = "us-east-1"
AMI = "ami-dca37ea5"  # moto's "Deep Learning AMI Ubuntu" image
IMAGE = "10.213.0.1:5000/dtrain/pytorch-ddp:1"
JOB = f"""image: {IMAGE}
command: [python, train.py]
up: 4 x p4d.24xlarge
ami: {AMI}
ssh_opt: [UserKnownHostsFile=/dev/null]
"""


# ---------------------------------------------------------------- the shape and the fields


@pytest.mark.parametrize("text, want", [("p4d.24xlarge:4", ("p4d.24xlarge", 4)), ("4 x p4d.24xlarge", ("p4d.24xlarge", 4)),
                                        (" 2X g5.12xlarge ", ("g5.12xlarge", 2)), ("c5.xlarge : 1", ("c5.xlarge", 1))])
def test_shape(text, want):
    assert up.shape(text) == want


@pytest.mark.parametrize("text, message", [
    ("p4d.24xlarge", "--up 'p4d.24xlarge': expected TYPE:COUNT (e.g. p4d.24xlarge:4) or COUNT x TYPE"),
    ("p4d.24xlarge:0", "--up p4d.24xlarge: '0': expected a whole number from 1 to 10000"),
    ("p4d.24xlarge:four", "--up 'p4d.24xlarge:four': expected TYPE:COUNT"),
    ("4 x p4d;rm", "--up '4 x p4d;rm': expected TYPE:COUNT"),
])
def test_bad_shape_is_one_line_naming_up(text, message):
    with pytest.raises(values.BadValue) as e:
        up.shape(text)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_cluster_name():
    assert up.cluster_name("train-7") == "train-7"
    assert up.cluster_name("7.run_a") == "up-7-run-a"
    assert up.cluster_name(None, now=0) == "up-19700101-000000"
    assert len(up.cluster_name("a" * 80)) == 63
    ec2.NodesSpec(name=up.cluster_name("7.run_a"), count=1, instance_type="c5.xlarge")  # a name nodes up takes


def test_the_stack_holds_the_spares_too():
    cfg = config.build({"image": IMAGE, "command": ["true"], "up": "p4d.24xlarge:4", "spares": "1", "spot": True,
                        "ami": AMI, "root_size": "300", "idle_down": "30"})
    s = up.nodes_spec(cfg, "c1")
    assert (s.count, s.instance_type, s.spot, s.ami, s.root_size, s.idle_down) == (5, "p4d.24xlarge", True, AMI, 300, 30)


def test_idle_down_bound_is_the_nodes():
    assert jobfile.NUMBERS["idle_down"][2] == ec2.IDLE_DOWN_MAX_MINUTES


@pytest.mark.parametrize("flags, message", [
    ({"keep": True}, "--keep is for the nodes a launch brings up: give --up TYPE:COUNT too"),
    ({"spot": True}, "--spot is for the nodes a launch brings up"),
    ({"up": "c5.xlarge:2", "hosts": "h1,h2"}, "--up brings its own nodes: give --up or --hosts, not both"),
    ({"up": "c5.xlarge:2", "count": "2"}, "--count 2: --up TYPE:COUNT says how many nodes"),
    ({"up": "c5.xlarge:2", "detach": True}, "--detach returns while the job runs, and --up takes the nodes down"),
    ({"up": "c5.xlarge:2", "confirm_above": "-1"}, "--confirm-above '-1': expected a number >= 0"),
    ({"up": "c5.xlarge:2", "idle_down": "0"}, "--idle-down '0': expected a whole number from 1 to 10080"),
])
def test_bad_launch_fields(flags, message):
    with pytest.raises((LaunchError, values.BadValue)) as e:
        config.build({"image": IMAGE, "command": ["true"], **flags})
    assert str(e.value).startswith(message), str(e.value)


def test_a_job_file_may_not_confirm_the_price(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text(JOB + '"yes": true\n')  # quoted: YAML 1.1 reads a bare yes as true
    with pytest.raises(LaunchError, match=rf"^{f}:6: yes: the price's confirmation is yours, .* pass --yes on the "
                                          "command line$"):
        config.build({}, f)
    f.write_text(JOB + "confirm_above: 1000\n")
    with pytest.raises(LaunchError, match=rf"^{f}:6: confirm_above: .* pass --confirm-above on"):
        config.build({}, f)
    # nor is it written into one
    f.write_text(JOB)
    text = config.dump(config.build({"yes": True, "confirm_above": "100"}, f))
    assert "up: 4 x p4d.24xlarge" in text and "--confirm-above 100" in text.splitlines()[1]
    assert "yes:" not in text and "confirm_above:" not in text


def test_nodes_on_the_command_line_replace_the_files_up(tmp_path):
    f = tmp_path / "job.yaml"
    f.write_text(JOB + "spot: true\nkeep: true\n")
    cfg = config.build({"cluster": "c1"}, f)
    assert cfg.cluster == "c1" and cfg.up is None and not cfg.spot and not cfg.keep
    cfg = config.build({"up": "c5.xlarge:2"}, f)
    assert cfg.up == "c5.xlarge:2" and cfg.spot and cfg.keep


def test_other_targets_refuse_up(tmp_path):
    from dtrain.launch import jobtarget

    cfg = config.build({"image": IMAGE, "command": ["true"], "up": "c5.xlarge:2", "target": "mpijob"})
    with pytest.raises(LaunchError, match=r"--up"):
        jobtarget.check_fields(cfg)


def test_kept_lines_say_the_price_and_the_way_down():
    def kept(region: str) -> ec2.Cluster:
        return ec2.Cluster(name="c1", region=region, stack="dtrain-c1", instance_type="p4d.24xlarge", nitro=True,
                           slots=8, user="ubuntu", identity=None,
                           instances=tuple(ec2.Instance(f"i-{i}", f"10.0.0.{i}", None, f"{region}a", "p4d.24xlarge")
                                           for i in range(2)))

    lines = up.kept_lines(kept(REGION), 30)
    assert lines[0].startswith("[up] kept: cluster c1 (2 x p4d.24xlarge, us-east-1) bills $43.92/h (2 x p4d.24xlarge "
                               "on-demand (AWS price list snapshot of "), lines[0]
    assert lines[0].endswith("; they delete their own stack after 30 min without a dtrain job"), lines[0]
    assert lines[1] == "[up] take it down: dtrain nodes down --name c1 --region us-east-1"
    assert lines[2] == "[up] next job there: dtrain launch --cluster c1 --image IMAGE -- CMD"
    # a region the price list lacks: said, not guessed
    assert up.kept_lines(kept("ap-south-2"), None)[0].startswith(
        "[up] kept: cluster c1 (2 x p4d.24xlarge, ap-south-2) bills a price not known here (p4d.24xlarge on-demand "
        "in ap-south-2: not in the AWS price list snapshot of ")


# ---------------------------------------------------------------- launch --cluster follows the group


def test_launch_cluster_follows_the_group_in_one_line(aws):
    cluster, _ = ec2.up(aws, spec(count=2, spot=True), address="public", poll=0.05, timeout=5, say=quiet,
                        ssh_opts=("-o", "ProxyCommand=/bin/false"))
    said: list[str] = []
    up.follow("c1", say=said.append, session=aws)
    assert said == []  # the hostfile matches: nothing to say
    lost = cluster.instances[1]
    aws.client("ec2").terminate_instances(InstanceIds=[lost.id])  # a spot interruption; the group replaces it
    [new] = [i for i in running(aws) if i["InstanceId"] not in {x.id for x in cluster.instances}]
    # the nodes' addresses are moto's (ssh stops here): the worker list cannot be written, said after the line
    with pytest.raises(LaunchError, match=r"writing the worker list failed on "):
        up.follow("c1", say=said.append, session=aws)
    assert said == [f"[launch] cluster c1 follows its Auto Scaling group: {lost.public_ip} ({lost.id}, "
                    f"{lost.availability_zone}) left: no longer running in the group; {new['PublicIpAddress']} "
                    f"({new['InstanceId']}, {new['Placement']['AvailabilityZone']}) joined: the group's "
                    "replacement; now 2 nodes"]
    assert ec2.load_cluster("c1").instances[-1].id == new["InstanceId"]


def test_aws_not_answering_is_said_and_the_recorded_nodes_are_used(aws, monkeypatch):
    ec2.up(aws, spec(count=1), address="public", poll=0.05, timeout=5, say=quiet)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "")  # a session without credentials: botocore's NoCredentialsError
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "")
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    said: list[str] = []
    up.follow("c1", say=said.append)
    assert len(said) == 1 and "Unable to locate credentials" in said[0], said
    assert said[0].startswith("[launch] cluster c1: hostfile not checked against its Auto Scaling group (") and \
        said[0].endswith("launching on the recorded nodes")
    # the group has no node at all: the launch stops, in one line
    aws.client("autoscaling").update_auto_scaling_group(AutoScalingGroupName=ec2.nodes_group(aws, "c1"),
                                                        MinSize=0, MaxSize=0, DesiredCapacity=0)
    for i in running(aws):
        aws.client("ec2").terminate_instances(InstanceIds=[i["InstanceId"]])
    with pytest.raises(LaunchError, match=r"^--name c1: no node of the cluster is running"):
        up.follow("c1", say=quiet, session=aws)


def test_a_cluster_without_a_record_is_not_followed(tmp_path, monkeypatch):
    monkeypatch.setenv("DTRAIN_HOME", str(tmp_path))
    (tmp_path / "clusters" / "h").mkdir(parents=True)
    (tmp_path / "clusters" / "h" / "hostfile").write_text("10.0.0.5 slots=1\n")
    said: list[str] = []
    up.follow("h", say=said.append)  # a hostfile alone: no AWS call, nothing said
    assert said == []


# ---------------------------------------------------------------- the real program on moto


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


@pytest.fixture
def laptop(moto_server, checkip, tmp_path):
    """(env, cloudformation client, project dir with job.yaml): a laptop outside any VPC."""
    url, env = moto_server
    env = {**{k: v for k, v in env.items() if not k.startswith("DTRAIN_")}, "DTRAIN_HOME": str(tmp_path / "home"),
           "DTRAIN_CHECKIP_URL": checkip, "DTRAIN_PRICES": "snapshot", "PYTHONPATH": str(ROOT),
           "PYTHONUNBUFFERED": "1"}
    project = tmp_path / "project"
    project.mkdir()
    (project / "job.yaml").write_text(JOB)
    cfn = boto3.client("cloudformation", endpoint_url=url, region_name=REGION, aws_access_key_id="testing",
                       aws_secret_access_key="testing")
    return env, cfn, project


def live_stacks(cfn) -> list[str]:
    return [s["StackName"] for s in cfn.describe_stacks()["Stacks"] if s["StackStatus"] != "DELETE_COMPLETE"]


def dtrain(project: Path, env: dict, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dtrain", *args], cwd=project, capture_output=True, text=True,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def test_the_price_is_shown_and_a_refusal_creates_nothing(laptop):
    env, cfn, project = laptop
    r = dtrain(project, env, "launch", "-f", "job.yaml", "--timeout", "7200")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stdout + r.stderr
    assert r.stderr.startswith("error: nodes up (4 x p4d.24xlarge): $") and "add --yes" in r.stderr
    assert "[nodes] to rent in us-east-1: 4 x p4d.24xlarge (on-demand), 4 Elastic IP(s)" in r.stdout, r.stdout
    assert "[price] 4 x p4d.24xlarge on-demand: $87.831/h (AWS price list snapshot of " in r.stdout
    total = next(line for line in r.stdout.splitlines() if line.startswith("[price] total: "))
    per_hour = float(total.split("$")[1].split("/h")[0].replace(",", ""))
    assert total == f"[price] total: ${per_hour:,.2f}/h, ${per_hour * 2:,.2f} for 2 h", total  # --timeout 7200
    assert live_stacks(cfn) == []
    # the threshold raised past the price: it goes on without asking (and fails at ssh: see below)
    r = dtrain(project, env, "launch", "-f", "job.yaml", "--confirm-above", "100", "--up-timeout", "2",
               "--ssh-opt", "ProxyCommand=/bin/false")
    assert "[nodes] stack dtrain-up-" in r.stdout and r.returncode == 2, r.stdout + r.stderr
    assert live_stacks(cfn) == []


def test_a_failure_while_the_nodes_are_awaited_deletes_the_stack(laptop):
    env, cfn, project = laptop
    r = dtrain(project, env, "launch", "-f", "job.yaml", "--yes", "--name", "run1", "--up-timeout", "2",
               "--ssh-opt", "ProxyCommand=/bin/false", "--keep")  # --keep keeps nodes after a job, not a failed up
    assert r.returncode == 2 and r.stderr.startswith("error: no node answered ssh + docker within 2s: "), r.stderr
    assert "[nodes] stack dtrain-run1 creating: 4 x p4d.24xlarge, 4 EFA in us-east-1" in r.stdout, r.stdout
    assert "[nodes] deleting stack dtrain-run1" in r.stdout
    assert live_stacks(cfn) == []


def test_ctrl_c_while_the_nodes_are_awaited_deletes_the_stack(laptop):
    env, cfn, project = laptop
    p = subprocess.Popen([sys.executable, "-m", "dtrain", "launch", "-f", "job.yaml", "--yes", "--name", "run2",
                          "--up-timeout", "120", "--ssh-opt", "ProxyCommand=/bin/false"], cwd=project, env=env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: list[str] = []
    try:
        for line in p.stdout:
            out.append(line)
            if line.startswith("[nodes] ssh + docker: 0/4 ready"):  # the stack is made; the wait is on
                assert live_stacks(cfn) == ["dtrain-run2"]
                p.send_signal(signal.SIGINT)
                break
        rest, err = p.communicate(timeout=120)
    finally:
        p.kill()
    text = "".join(out) + rest
    assert p.returncode == 130, text + err
    assert "[nodes] interrupted: deleting stack dtrain-run2" in text, text + err
    deadline = time.monotonic() + 30
    while live_stacks(cfn) and time.monotonic() < deadline:  # CloudFormation deletes in the background
        time.sleep(0.5)
    assert live_stacks(cfn) == []


# ---------------------------------------------------------------- the whole run, on the simulated cluster


@pytest.mark.cluster
def test_one_command_runs_the_job_on_nodes_it_brings_up_and_takes_down(tmp_path, moto_server, cluster,
                                                                      remote_images):
    """From a project directory with job.yaml (`up: 1 x c5.xlarge`): the price, the stack (moto hands
    the instances the simulated nodes' addresses: tests/test_nodes_cli.py's world), the job run there
    and streamed, the stack deleted. Then a failing job: deleted too. Then --keep: kept, with its
    price per hour and the command that takes it down, which does."""
    from imds import Imds
    from test_nodes_cli import AMI as NODE_AMI

    url, env0 = moto_server
    session = boto3.Session(region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing")
    c = session.client("ec2", endpoint_url=url)
    vpc = c.create_vpc(CidrBlock="10.213.0.0/16")["Vpc"]["VpcId"]
    subnet = c.create_subnet(VpcId=vpc, CidrBlock="10.213.0.0/24", AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
    for cidr in ("10.213.0.0/29", "10.213.0.8/31", "10.213.0.10/32"):  # the bridge and below: not nodes
        c.create_subnet_cidr_reservation(SubnetId=subnet, Cidr=cidr, ReservationType="explicit")
    mine = c.create_security_group(GroupName="launcher", Description="this machine", VpcId=vpc)["GroupId"]
    imds = Imds("127.0.0.1")
    mac = "0e:00:00:00:00:01"
    imds.meta.update({"mac": mac, "local-ipv4": "10.213.0.1", f"network/interfaces/macs/{mac}/vpc-id": vpc,
                      f"network/interfaces/macs/{mac}/security-group-ids": mine})
    env = {**{k: v for k, v in env0.items() if k != "AWS_EC2_METADATA_DISABLED"},
           "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.url, "DTRAIN_HOME": str(tmp_path / "home"),
           "DTRAIN_PRICES": "snapshot", "PYTHONPATH": str(ROOT)}
    cfn = session.client("cloudformation", endpoint_url=url)
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("import os\nprint('hello from rank', os.environ['RANK'], flush=True)\n")
    (project / "fail.py").write_text("raise SystemExit(3)\n")
    (project / "job.yaml").write_text(
        f"image: {remote_images['pytorch-ddp']}\nlauncher: torchrun\nworkdir: .\ncommand: [python, train.py]\n"
        # one node a launch: moto numbers the subnet's addresses on (.11, .12, .13: node-1, -2, -3)
        f"up: 1 x c5.xlarge\nsubnet: {subnet}\nami: {NODE_AMI}\nssh_user: root\n"
        "no_spot_watch: true\nup_timeout: 120\n")  # the metadata stand-in is this machine's, not the nodes'
    # the user's own: a job file's ssh options make its hosts ones to confirm (trust.check_hosts)
    key = ["--ssh-key", cluster.identity_file, "--ssh-opt", "UserKnownHostsFile=/dev/null"]
    try:
        r = dtrain(project, env, "launch", "-f", "job.yaml", *key, "--name", "one", timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "[price] 1 x c5.xlarge on-demand: $" in r.stdout and "[price] total: $" in r.stdout, r.stdout
        assert "[nodes] stack dtrain-one creating: 1 x c5.xlarge" in r.stdout
        assert "hello from rank 0" in r.stdout + r.stderr, r.stdout + r.stderr
        assert "[up] the job ended: deleting stack dtrain-one" in r.stdout and "deleted stack dtrain-one" in r.stdout
        assert live_stacks(cfn) == []

        r = dtrain(project, env, "launch", "-f", "job.yaml", *key, "--name", "two", "--", "python", "fail.py", timeout=600)
        assert r.returncode != 0 and "[up] the job failed (exit code " in r.stdout, r.stdout + r.stderr
        assert live_stacks(cfn) == []

        r = dtrain(project, env, "launch", "-f", "job.yaml", *key, "--name", "three", "--keep", timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        assert live_stacks(cfn) == ["dtrain-three"]
        assert "[up] kept: cluster three (1 x c5.xlarge, us-east-1) bills $" in r.stdout, r.stdout
        # the region is said where it is not the default one (regions.region_arg): here it is
        assert "[up] take it down: dtrain nodes down --name three\n" in r.stdout, r.stdout
        r = dtrain(project, env, "nodes", "down", "--name", "three", "--region", REGION)
        assert r.returncode == 0 and live_stacks(cfn) == [], r.stdout + r.stderr
    finally:
        imds.close()
