"""Nothing billed hides (issue 47): the region goes with every record, hint and command; `nodes
list` looks in every region dtrain has used (and --all-regions); `nodes down` finds the
cluster's region, says what stays billed and exits 1 while anything does; a --new-vpc stack is
torn down in the order AWS needs, and one that fails to delete stays in view; `nodes up` stops
at once on an ssh error that waiting does not heal.

AWS is moto (in-process, or a moto server on loopback for the real CLI), with
AWS_EC2_METADATA_DISABLED=true; this machine's public address comes from a checkip server on
loopback; moto invents the instances' addresses, so ssh to them is stopped before it leaves
this machine (ProxyCommand=/bin/false). "Network is unreachable" is real: ssh in a network
namespace that has only loopback, where no packet can leave."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import shlex
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3
import pytest

from dtrain.launch.errors import LaunchError
from dtrain.launch.infra import ec2, fleet, regions
from test_nodes import AMI_PARAM, REGION, aws, invoke, moto_server, quiet, spec  # noqa: F401 - fixtures

ROOT = Path(__file__).resolve().parent.parent
WEST = "us-west-2"


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
def cfn_keeps_failed_stacks(monkeypatch):
    """AWS's DeleteStack: a stack whose resources cannot all be deleted stays, DELETE_FAILED,
    with the reason in its events (moto 5 drops it from view and raises instead). moto's
    CloudFormation cannot delete a route table, route or gateway attachment, so a --new-vpc
    stack there is one AWS would refuse to delete for a blocking resource."""
    from moto.cloudformation.models import CloudFormationBackend

    def delete_stack(self, name_or_stack_id):
        stack = next((s for s in self.stacks.values() if name_or_stack_id in (s.stack_id, s.name)), None)
        if stack is None:
            return
        try:
            stack.resource_map.delete()
        except Exception as e:  # noqa: BLE001 - what AWS reports as the stack's reason
            stack._add_stack_event("DELETE_FAILED", resource_status_reason=str(e))
            stack.status = "DELETE_FAILED"
            return
        stack._add_stack_event("DELETE_COMPLETE")
        stack.status = "DELETE_COMPLETE"
        self.deleted_stacks[stack.stack_id] = self.stacks.pop(stack.stack_id)

    monkeypatch.setattr(CloudFormationBackend, "delete_stack", delete_stack)


def nodes(*args: str, **kw) -> tuple[str, int]:
    """`dtrain nodes ARGS` (tasks.py's body, in this process's moto): (stdout, exit code)."""
    import tasks

    out = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out):
        try:
            tasks.nodes.body(None, *args, **kw)
        except SystemExit as e:
            code = int(e.code or 0)
    return out.getvalue(), code


def argv_kw(command: str) -> tuple[list[str], dict[str, str]]:
    """`dtrain nodes down --name X [--region R]` -> (positional, keyword arguments of tasks.nodes)."""
    words = shlex.split(command)
    assert words[:2] == ["dtrain", "nodes"], command
    pos, kw, rest = [], {}, words[2:]
    while rest:
        w = rest.pop(0)
        if w.startswith("--"):
            kw[w[2:].replace("-", "_")] = rest.pop(0)
        else:
            pos.append(w)
    return pos, kw


# --- the region in every record, hint and command ----------------------------------------------


def test_region_arg_only_where_it_is_not_the_default(monkeypatch):
    assert regions.region_arg("us-west-2", "us-east-1") == " --region us-west-2"
    assert regions.region_arg("us-east-1", "us-east-1") == ""
    assert regions.region_arg("us-west-2", None) == " --region us-west-2"
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    monkeypatch.delenv("AWS_REGION", raising=False)
    assert regions.region_arg("us-west-2") == ""


def test_a_record_of_an_older_dtrain_without_a_region_still_loads():
    c = ec2.Cluster(name="old", region="us-east-1", stack="dtrain-old", instance_type="c5.xlarge", nitro=True,
                    slots=1, user="ubuntu", identity=None, instances=())
    d = __import__("json").loads(c.to_json())
    del d["region"]
    assert ec2.Cluster.from_json(__import__("json").dumps(d)).region == ""


def test_a_kept_stack_in_another_region_is_listed_and_its_hint_removes_it(aws, monkeypatch):
    """A stack kept by --keep-on-failure in us-west-2, with the default region us-east-1: the
    kept line's command has --region; `nodes list` (no flag) shows it with its type, count,
    state and the command; `launch --cluster west` says the same; that command removes it."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.delenv("AWS_REGION", raising=False)
    west = boto3.Session(region_name=WEST)
    west.client("ssm").put_parameter(Name=AMI_PARAM, Value="ami-dca37ea5", Type="String")
    said: list[str] = []

    def not_ready(_instances):
        raise LaunchError("no node answered ssh + docker")

    with pytest.raises(LaunchError):
        ec2.up(west, spec(name="west", count=2, instance_type="c5.xlarge"), ready=not_ready,
               keep_on_failure=True, poll=0.05, timeout=5, say=said.append)
    kept = [m for m in said if "kept (--keep-on-failure)" in m]
    assert kept and kept[0].endswith("then `dtrain nodes down --name west --region us-west-2`"), said
    assert not (ec2.cluster_dir("west") / "cluster.json").exists()  # no record: only the regions file

    out, code = nodes("list")
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["CLUSTER", "REGION", "STACK", "TYPE", "NODES", "SPOT", "AGE", "STATE",
                                              "$/H", "ADDRESSES"], out
    row = lines[1].split()
    # the price: "?" where the snapshot has no price for the region (launch/infra/prices.json: us-west-2's EC2
    # prices are not in it), never a guess
    assert row[:9] == ["west", WEST, "CREATE_COMPLETE", "c5.xlarge", "2", "-", "0m", "kept", "?"], out
    hint = "dtrain nodes down --name west --region us-west-2"
    assert lines[2] == f"west ({WEST}): {hint}  (no hostfile here: remove it, then nodes up again)", out

    import tasks

    with pytest.raises(LaunchError, match=r"stack dtrain-west is CREATE_COMPLETE in region us-west-2 .*remove it "
                                          r"with `dtrain nodes down --name west --region us-west-2`"):
        tasks._nodes({"cluster": "west"})

    pos, kw = argv_kw(hint)
    out, code = nodes(*pos, **kw)
    assert (out, code) == ("deleted stack dtrain-west\n", 0)
    assert fleet.region_rows(west, {}) == []
    out, code = nodes("list")
    assert out == f"no clusters (no dtrain stack in regions {REGION}, {WEST})\n", out


def test_nodes_down_finds_the_region_by_itself(aws, monkeypatch):
    """`nodes down --name NAME` without --region: the record's region (a cluster up in us-west-2)."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    west = boto3.Session(region_name=WEST)
    west.client("ssm").put_parameter(Name=AMI_PARAM, Value="ami-dca37ea5", Type="String")
    cluster, _ = ec2.up(west, spec(name="w2", count=1, instance_type="c5.xlarge"), poll=0.05, timeout=5, say=quiet)
    assert regions.recorded_regions() == {"w2": WEST} and cluster.region == WEST
    out, code = nodes("list")
    assert out.splitlines()[1].split()[:8] == ["w2", WEST, "CREATE_COMPLETE", "c5.xlarge", "1", "-", "0m", "usable"]
    assert out.splitlines()[2] == "w2 (us-west-2): dtrain launch --cluster w2 --image IMAGE -- CMD"
    assert nodes("down", name="w2") == ("deleted stack dtrain-w2\n", 0)
    assert ec2.stack_state(west, "w2") is None and regions.recorded_regions() == {}


def test_list_all_regions_asks_every_region(aws, monkeypatch):
    """--all-regions: a stack made in eu-west-1 without dtrain knowing the region (no record, no
    regions file) is found."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    eu = boto3.Session(region_name="eu-west-1")
    eu.client("ssm").put_parameter(Name=AMI_PARAM, Value="ami-dca37ea5", Type="String")
    ec2.up(eu, spec(name="far", count=1, instance_type="c5.xlarge"), poll=0.05, timeout=5, say=quiet)
    regions.regions_file().unlink()
    for rec in ec2.clusters_dir().glob("*/cluster.json"):
        rec.unlink()
    assert nodes("list")[0].startswith("no clusters (no dtrain stack in region us-east-1)")
    out, code = nodes("list", all_regions=True)
    assert code == 0 and out.splitlines()[1].split()[:3] == ["far", "eu-west-1", "CREATE_COMPLETE"], out


def test_the_table_and_its_hints_are_pure():
    now = dt.datetime(2026, 1, 2, 12, 0, tzinfo=dt.timezone.utc)
    rows = [fleet.Row("a", "us-east-1", "CREATE_COMPLETE", "p4d.24xlarge", 2, ("3.1.1.1", "3.1.1.2"),
                      now - dt.timedelta(hours=26), True, True),
            fleet.Row("b", "us-west-2", "DELETE_FAILED", created=now - dt.timedelta(minutes=5)),
            fleet.Row("c", "us-east-1", "no stack", recorded=True)]
    lines = fleet.table(rows, "us-east-1", now)
    assert [ln.split()[:8] for ln in lines[1:4]] == [
        ["a", "us-east-1", "CREATE_COMPLETE", "p4d.24xlarge", "2", "spot", "1d2h", "usable"],
        ["b", "us-west-2", "DELETE_FAILED", "-", "0", "-", "5m", "failed"],
        ["c", "us-east-1", "no", "stack", "-", "0", "-", "-"]]
    assert lines[4:] == ["a (us-east-1): dtrain launch --cluster a --image IMAGE -- CMD",
                         "b (us-west-2): dtrain nodes down --name b --region us-west-2  (retries the delete; "
                         "still billed)",
                         "c (us-east-1): dtrain nodes down --name c  (forgets the record)"]
    # the price column (fleet.price, the snapshot): a's 2 spot p4d at most their on-demand price, b none, c none
    assert lines[0].split()[8] == "$/H" and lines[1].split()[8].startswith("<=$"), lines
    assert "$/H" not in fleet.table(rows[1:], "us-east-1", now)[0]  # shown once a price is known


# --- nodes down: what stays billed -------------------------------------------------------------


def test_nodes_down_names_an_instance_left_and_exits_1(aws, monkeypatch):
    """An instance tagged as the cluster's but not the stack's (started by hand): the stack goes,
    the instance is named with the command that terminates it, exit 1."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    ec2.up(aws, spec(count=1, instance_type="c5.xlarge"), poll=0.05, timeout=5, say=quiet)
    e = aws.client("ec2")
    subnet = e.describe_subnets()["Subnets"][0]["SubnetId"]
    stray = e.run_instances(ImageId="ami-dca37ea5", MinCount=1, MaxCount=1, InstanceType="c5.xlarge",
                            SubnetId=subnet, TagSpecifications=[{"ResourceType": "instance", "Tags": [
                                {"Key": ec2.CLUSTER_TAG, "Value": "c1"}]}])["Instances"][0]["InstanceId"]
    out, code = nodes("down", name="c1")
    assert code == 1 and out.splitlines() == [
        "deleted stack dtrain-c1", f"still billed in region {REGION} (1):",
        f"  instance {stray} (running): `aws ec2 terminate-instances --instance-ids {stray} --region {REGION}`"], out
    e.terminate_instances(InstanceIds=[stray])
    assert fleet.leftovers(aws, "c1", [], delete_data=True) == []


def _closure(template: dict, name: str) -> set[str]:
    """Every resource `name` depends on (DependsOn, Ref, Fn::GetAtt), transitively: CloudFormation
    deletes `name` before any of them."""
    res = template["Resources"]

    def direct(node) -> set[str]:
        if isinstance(node, dict):
            found = set()
            for k, v in node.items():
                if k == "Ref" and v in res:
                    found.add(v)
                elif k == "Fn::GetAtt" and v[0] in res:
                    found.add(v[0])
                else:
                    found |= direct(v)
            return found
        if isinstance(node, list):
            return set().union(*(direct(v) for v in node)) if node else set()
        return set()

    seen: set[str] = set()
    todo = [name]
    while todo:
        r = res[todo.pop()]
        deps = direct(r.get("Properties", {}))
        on = r.get("DependsOn", [])
        deps |= {on} if isinstance(on, str) else set(on)
        todo += [d for d in deps if d not in seen]
        seen |= deps
    return seen


@pytest.mark.parametrize("kw, addresses", [({}, 0), ({"efs": True}, 0), ({"instance_type": "p4d.24xlarge"}, 2)])
def test_new_vpc_teardown_removes_the_nodes_before_the_way_out(kw, addresses):
    """In the --new-vpc template the nodes (and the EFS mount target, the Elastic IPs) are
    deleted before the gateway attachment, the route, the subnet and the VPC: no instance holds
    a public address or an interface there when CloudFormation detaches or deletes them."""
    s = spec(new_vpc=True, count=2, **{"instance_type": "c5.xlarge", **kw})
    res = ec2.Resolved(efa=False, nitro=True, gpus=1, vpc_id=None, subnet_id=None, availability_zone="us-east-1a",
                       addresses=addresses)
    t = ec2.stack_template(s, res)
    before = _closure(t, "Nodes")
    assert {"GatewayAttachment", "DefaultRoute", "SubnetRoutes", "Subnet", "Vpc", "InternetGateway"} <= before
    for way_out in ("GatewayAttachment", "DefaultRoute", "Subnet", "Vpc"):
        assert "Nodes" not in _closure(t, way_out)  # no cycle: the nodes really go first


def test_a_new_vpc_stack_that_fails_to_delete_stays_in_view(aws, monkeypatch, cfn_keeps_failed_stacks):
    """DELETE_FAILED (moto cannot delete the VPC's routes: a blocking resource): `nodes down`
    retries once, then exits 1 naming the stack, its reason and the command; the record stays,
    so `nodes list` shows it as failed with that command."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    ec2.up(aws, spec(new_vpc=True, count=1, instance_type="c5.xlarge"), poll=0.05, timeout=5, say=quiet)
    out, code = nodes("down", name="c1")
    lines = out.splitlines()
    assert code == 1 and lines[0] == "stack dtrain-c1: DELETE_FAILED; see the CloudFormation console's events", out
    assert lines[1].startswith(f"still billed in region {REGION} ("), out  # moto may leave the instance too
    assert lines[2].startswith("  stack dtrain-c1 DELETE_FAILED (") and "has dependencies" in lines[2], out
    assert lines[2].endswith("): `dtrain nodes down --name c1` again"), out
    assert (ec2.cluster_dir("c1") / "cluster.json").exists()
    events = aws.client("cloudformation").describe_stack_events(StackName="dtrain-c1")["StackEvents"]
    assert sum(e["ResourceStatus"] == "DELETE_FAILED" for e in events) == 2  # retried once
    out, _ = nodes("list")
    assert out.splitlines()[1].split()[:3] == ["c1", REGION, "DELETE_FAILED"], out
    assert out.splitlines()[2] == "c1 (us-east-1): dtrain nodes down --name c1  (retries the delete; still billed)"


# --- the real CLI, from outside the VPC: kept stack in another region --------------------------


def test_cli_kept_stack_in_us_west_2_and_its_printed_command(moto_server, checkip):
    """`dtrain nodes up --region us-west-2 --keep-on-failure` that cannot reach its node (ssh
    stopped on this machine): the printed down command carries --region; `nodes list` without
    --region shows the stack; running the printed command removes it, exit 0."""
    url, env = moto_server
    env = {**env, "DTRAIN_CHECKIP_URL": checkip}
    r = invoke(env, "nodes", "up", "--name", "west", "--region", WEST, "--count", "1", "--instance-type",
               "c5.xlarge", "--ami", "ami-dca37ea5", "--timeout", "3", "--keep-on-failure",
               "--ssh-opt", "ProxyCommand=/bin/false", "--yes")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stdout + r.stderr
    command = "dtrain nodes down --name west --region us-west-2"
    assert f"look at the nodes, then `{command}`" in r.stdout, r.stdout
    r = invoke(env, "nodes", "list")
    assert r.returncode == 0 and r.stdout.splitlines()[1].split()[:3] == ["west", WEST, "CREATE_COMPLETE"], r.stdout
    assert f"west ({WEST}): {command}  (no hostfile here" in r.stdout, r.stdout
    r = invoke(env, *shlex.split(command)[1:])
    assert (r.returncode, r.stdout) == (0, "deleted stack dtrain-west\n"), r.stdout + r.stderr
    s = boto3.Session(region_name=WEST, aws_access_key_id="testing", aws_secret_access_key="testing")
    assert [st for st in s.client("cloudformation", endpoint_url=url).describe_stacks()["Stacks"]
            if st["StackStatus"] != "DELETE_COMPLETE"] == []


# --- nodes up: errors that waiting does not heal --------------------------------------------


def test_lasting_ssh_errors():
    assert ec2.lasting_ssh_error("ssh: connect to host 10.0.0.5 port 22: Network is unreachable")[0] == 0
    assert ec2.lasting_ssh_error("Host key verification failed.")[0] == 0
    assert ec2.lasting_ssh_error("ubuntu@10.0.0.5: Permission denied (publickey).")[0] == 60
    assert ec2.lasting_ssh_error("ssh: connect to host 10.0.0.5 port 22: No route to host")[0] == 60
    for healing in ("ssh: connect to host 10.0.0.5 port 22: Connection refused",
                    "ssh: connect to host 10.0.0.5 port 22: Connection timed out",
                    "kex_exchange_identification: Connection closed by remote host"):
        assert ec2.lasting_ssh_error(healing) is None


def test_an_unreachable_network_fails_the_wait_at_once():
    """wait_ready with the defaults of `nodes up` (10 minutes, 5 before giving up on no answer)
    from a network namespace with only loopback: real ssh says "Network is unreachable", and
    the wait stops within seconds, naming the node, the error and what to do."""
    program = ("import time\nfrom dtrain.launch.infra import ec2\nfrom dtrain.launch.remote.hosts import Node\n"
               "t = time.monotonic()\ntry:\n"
               "    ec2.wait_ready([Node(host='10.213.77.12', user='ubuntu'), Node(host='10.213.77.13', user='ubuntu')],"
               " timeout=600, first_timeout=300, poll=5, say=print)\n"
               "except Exception as e:\n    print(type(e).__name__, e)\nprint(f'{time.monotonic() - t:.0f}s')\n")
    t0 = time.monotonic()
    r = subprocess.run(["unshare", "-n", sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": "/root"})
    assert time.monotonic() - t0 < 60, r.stdout + r.stderr
    assert r.stdout.startswith("LaunchError 10.213.77.12: ") and "Network is unreachable: this machine has no route " \
        "to that address" in r.stdout, r.stdout + r.stderr
    assert "ready (" not in r.stdout  # no "0/2 ready" progress: it stopped at the first answer
