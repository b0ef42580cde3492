"""The targets' seam (issue 39): one module per target, one registry, one declared interface;
nothing else compares target names (docs/architecture.md "Targets")."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from dtrain import ROOT, values
from dtrain.launch import jobtarget, targets
from dtrain.launch.errors import LaunchError
from dtrain.launch.infra import cluster as cl
from dtrain.launch.infra import ec2 as stack
from dtrain.launch.jobs import config
from dtrain.launch.jobs import jobfile
from dtrain.launch.jobs.login import Login
from dtrain.launch.jobs.supervision import EC2_IMDS
from dtrain.launch.remote.hosts import Node
from dtrain.launch.targets import NodeArgs, NodeProvider, Target

TARGET_DIR = ROOT / "launch" / "targets"
SHARED = {"__init__.py", "base.py", "common.py", "description.py"}  # the interface and what modules share


def _compared(names: tuple[str, ...]) -> re.Pattern:
    """A target name as a literal in a comparison or a membership test; or a `target ==`/`target in` test."""
    lit = "|".join(map(re.escape, names))
    return re.compile(
        rf"""(==|!=)\s*["']({lit})["']|["']({lit})["']\s*(==|!=)"""
        rf"""|\bin\s*[(\[{{][^)\]}}\n]*["']({lit})["']"""
        r"""|\[["']target["']\]\s*(==|!=|\bin\b)|\btarget(\.name)?\s*(==|!=|\bin\b\s*[(\[{"'])""")


def _python_files() -> list[Path]:
    # launch/other_tools/ (`dtrain manifest --for KIND`) included: each kind is its target's module
    # (issue 48); the `manifest` task's --for (for_) shares the names
    skip = {".venv", "tests", ".git", "node_modules"}
    return [p for p in ROOT.rglob("*.py") if not skip & set(p.relative_to(ROOT).parts) and TARGET_DIR not in p.parents]


def test_no_target_name_compared_outside_the_target_modules():
    # "nodes" is a common word (`k in ("nodes", "spares")`): caught where a target is compared
    pattern = _compared(tuple(n for n in targets.names() if n != "nodes"))
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
             for p in _python_files() for i, line in enumerate(p.read_text().splitlines(), 1)
             if pattern.search(line) and "for_" not in line]
    assert found == [], "ask the registry (targets.get(name).PROPERTY) instead:\n" + "\n".join(found)


@pytest.mark.parametrize("line", [
    'if cfg["target"] == "nodes":', 'if target != "sagemaker":', 'if cfg["target"] in ("nodes", "sagemaker"):',
    '"ecs" == target', 'refused = X if target.name != other else ()'])
def test_the_check_finds_a_comparison(line):
    assert _compared(targets.names()).search(line)


def test_every_module_is_one_registered_target_or_provider():
    modules = {p.name for p in TARGET_DIR.glob("*.py")} - SHARED
    registered = {type(t).__module__.rsplit(".", 1)[1] + ".py"
                  for t in (*targets.TARGETS.values(), *targets.PROVIDERS.values())}
    assert modules == registered  # a module and its registry line come together


@pytest.mark.parametrize("item", [*targets.TARGETS.values(), *targets.PROVIDERS.values()], ids=lambda t: type(t).__name__)
def test_every_target_implements_the_interface(item):
    base = Target if isinstance(item, Target) else NodeProvider
    assert isinstance(item, base) and not inspect.isabstract(type(item))
    assert isinstance(item.name, str) and item.name
    for attr in ("refused", "ignored") if base is Target else ("flags",):
        assert all(isinstance(k, str) for k in getattr(item, attr))
    if base is Target:  # what it refuses or ignores is a launch field, named as a flag in the errors
        assert set(item.refused) | set(item.ignored) <= set(jobfile.JobFile.model_fields)
    else:
        assert set(item.flags) <= set(jobfile.JobFile.model_fields) and isinstance(item.spot_notice, str)


def test_the_registry():
    assert targets.names() == jobfile.TARGETS  # jobs/ cannot import targets/: the job file's Literal agrees
    assert targets.names()[0] == "nodes"  # the default leads the choices
    assert all(targets.get(n).name == n for n in targets.names())
    assert targets.names(on_nodes=True) == ("nodes",)
    assert targets.names(writes=True) == ("mpijob", "pytorchjob", "ecs", "trainjob", "jobset")
    # the kinds `dtrain manifest --for` writes: the registry's targets that describe a job
    assert tuple(targets.describers()) == ("sagemaker", "mpijob", "pytorchjob", "ecs", "trainjob", "jobset")
    assert tuple(targets.PROVIDERS) == ("local", "ssh", "ec2")
    with pytest.raises(LaunchError) as e:
        targets.get("slurm")
    assert str(e.value) == "--target 'slurm': expected one of nodes, sagemaker, mpijob, pytorchjob, ecs, trainjob, jobset"
    with pytest.raises(LaunchError, match=r"^no node provider 'gcp': expected one of local, ssh, ec2$"):
        targets.provider("gcp")


def test_refused_and_ignored_per_target():
    sm, ecs, mpijob = targets.get("sagemaker"), targets.get("ecs"), targets.get("mpijob")
    assert "timeout" not in sm.refused and "timeout" in ecs.refused and "role" in mpijob.refused
    assert "workdir" in ecs.ignored and "workdir" not in sm.ignored
    assert "spares" in sm.refused and "spares" in ecs.refused
    assert "role" in targets.get("nodes").refused and targets.get("nodes").ignored == ("instance_type",)
    flags = {"image": "r/x:1", "target": "sagemaker", "timeout": "60", "workdir": ".", "max_restarts": "2"}
    assert jobtarget.check_fields(config.build(flags)) == []  # restarts: SageMaker's RetryStrategy
    with pytest.raises(LaunchError, match=r"^--max-restarts and --timeout: not for --target ecs \(.*take "
                                          r"them out for ecs$"):
        jobtarget.check_fields(config.build({**flags, "target": "ecs"}))
    assert "timeout" not in targets.get("trainjob").refused  # its activeDeadlineSeconds
    # a flag given as the default cancels the file's value: nothing to refuse
    assert jobtarget.check_fields(config.build({**flags, "target": "pytorchjob", "max_restarts": "0",
                                                "timeout": None})) == ["--workdir"]


def test_choose_the_provider_by_the_flags_given():
    assert targets.choose(NodeArgs()) is None
    assert targets.choose(NodeArgs(hosts="h1")).name == "ssh"
    assert targets.choose(NodeArgs(hostfile="hf")).name == "ssh"
    assert targets.choose(NodeArgs(ec2_tag="k=v")).name == "ec2"
    assert targets.choose(NodeArgs(cluster="c1")).name == "ec2"
    with pytest.raises(LaunchError) as e:
        targets.choose(NodeArgs(hosts="h1", ec2_tag="k=v"))
    assert str(e.value) == ("give exactly one of --hostfile FILE, --hosts h1:4,h2:4, --ec2-tag Key=Value "
                            "(got --hosts, --ec2-tag)")
    with pytest.raises(LaunchError, match=r"^give --cluster or one of --hostfile, --hosts, --ec2-tag, not both$"):
        targets.choose(NodeArgs(cluster="c1", hosts="h1"))
    with pytest.raises(values.BadValue, match=r"^--cluster '-bad': expected a name"):
        targets.choose(NodeArgs(cluster="-bad"))
    with pytest.raises(LaunchError, match=r"^give exactly one of --hostfile FILE, --hosts h1:4,h2:4, "
                                          r"--ec2-tag Key=Value$"):
        targets.nodes(NodeArgs())


def test_nodes_apply_the_ssh_defaults(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("10.0.0.1 slots=2 user=alice\n10.0.0.2\n")
    assert targets.nodes(NodeArgs(hostfile=str(hostfile)), ssh_user="bob", ssh_port=2222) == [
        Node("10.0.0.1", 2, port=2222, user="alice"), Node("10.0.0.2", 1, port=2222, user="bob")]
    assert targets.nodes(NodeArgs(hosts="h1:4,h2")) == [Node("h1", 4), Node("h2", 1)]


def test_cluster_nodes_are_the_hostfile_nodes_up_wrote(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(LaunchError, match=r"^--cluster c1: no hostfile at .*: no cluster of that name was made here "
                                          r"\(`dtrain nodes list` shows the clusters"):
        targets.nodes(NodeArgs(cluster="c1"))
    stack.cluster_dir("c1").mkdir(parents=True)
    (stack.cluster_dir("c1") / "hostfile").write_text("10.0.0.5 slots=8 user=ubuntu\n")
    assert targets.nodes(NodeArgs(cluster="c1", slots=2)) == [Node("10.0.0.5", 8, user="ubuntu")]


def test_spot_notice_only_where_ec2_names_the_nodes():
    assert targets.spot_notice(NodeArgs(ec2_tag="k=v")) == EC2_IMDS
    assert targets.spot_notice(NodeArgs(cluster="c1")) == EC2_IMDS
    assert targets.spot_notice(NodeArgs(hosts="h1")) == ""
    assert targets.spot_notice(NodeArgs()) == ""
    assert [p.name for p in targets.PROVIDERS.values() if p.spot_notice] == ["ec2"]


def test_registry_login_per_provider():
    plain = "10.213.0.1:5000/dtrain/pytorch-ddp:1"
    assert all(p.login(plain) == Login() for p in targets.PROVIDERS.values())  # no login for a plain registry
    ecr = "123456789012.dkr.ecr.us-east-1.amazonaws.com/dtrain/pytorch-ddp:1"
    assert targets.provider("local").login(ecr) == Login()  # the simulated cluster pulls from its own registry
    for name in ("ssh", "ec2"):  # an ECR image: a token from boto3, which has no credentials here
        with pytest.raises(LaunchError, match=rf"^ECR login for {re.escape(ecr)} failed"):
            targets.provider(name).login(ecr)


def test_ssh_users():
    ec2 = targets.provider("ec2")
    assert targets.provider("local").ssh_user() == "root"
    assert targets.provider("ssh").ssh_user() is None and ec2.ssh_user() is None


def test_up_and_down_where_the_provider_brings_nodes_up():
    with pytest.raises(LaunchError, match=r"^ssh: dtrain does not bring these nodes up$"):
        targets.provider("ssh").up(None)
    with pytest.raises(LaunchError, match=r"^ssh: dtrain does not take these nodes down$"):
        targets.provider("ssh").down()
    assert type(targets.provider("ec2")).down is not NodeProvider.down


def test_the_simulated_cluster_comes_up_and_down_through_launch_infra(monkeypatch):
    calls = []
    monkeypatch.setattr(cl, "up", lambda n, **kw: calls.append(("up", n, kw)) or "info")
    monkeypatch.setattr(cl, "down", lambda **kw: calls.append(("down", kw)))
    local = targets.provider("local")
    assert local.up("3", recreate=True) == "info"
    local.down()
    assert calls == [("up", 3, {"recreate": True}), ("down", {})]


def test_the_simulated_cluster_nodes(tmp_path, monkeypatch):
    monkeypatch.setattr(cl, "STATE_DIR", tmp_path)
    with pytest.raises(LaunchError, match=r"^the simulated cluster is not up \(no .*hostfile\): `dtrain cluster up"):
        targets.provider("local").discover(NodeArgs())
    (tmp_path / "hostfile").write_text("10.213.0.11 slots=1 port=22 user=root\n10.213.0.12 slots=1 port=22 user=root\n")
    assert [n.host for n in targets.provider("local").discover(NodeArgs())] == ["10.213.0.11", "10.213.0.12"]


def test_a_nodes_up_cluster_gives_its_nodes_and_recorded_ssh_options(tmp_path, monkeypatch):
    import tasks

    monkeypatch.setenv("HOME", str(tmp_path))
    assert targets.ssh_opts(NodeArgs(cluster="c2")) == ()  # none recorded: no cluster.json
    inst = stack.Instance("i-1", "10.0.0.7", None, "us-east-1a", "g5.12xlarge")
    stack.save_cluster(stack.Cluster("c2", "us-east-1", "dtrain-c2", "g5.12xlarge", True, 4, "ubuntu", None, (inst,),
                                     ssh_opts=("-o", "ProxyJump=bastion")))
    assert targets.ssh_opts(NodeArgs(cluster="c2")) == ("-o", "ProxyJump=bastion")
    assert targets.ssh_opts(NodeArgs(hosts="h1")) == ()
    assert tasks._ssh_opts(["ProxyJump=other"], None, "c2") == ("-o", "ProxyJump=bastion", "-o", "ProxyJump=other")
    assert tasks._nodes({"ssh_user": "alice", "cluster": "c2"}) == [Node("10.0.0.7", 4, user="ubuntu")]
    with pytest.raises(LaunchError, match=r"^give --cluster or one of --hostfile, --hosts, --ec2-tag, not both$"):
        tasks._nodes({"hosts": "h1", "cluster": "c2"})


def test_joining_gives_the_launchs_ssh_defaults_and_slots(tmp_path, monkeypatch):
    """targets.joining: nodes that come while a job runs get what the job's nodes got (the ssh
    user and key, --slots over each host's own); none where the provider's nodes cannot change."""
    from dtrain.launch.remote.hosts import Node

    assert targets.joining(targets.NodeArgs(hostfile=str(tmp_path / "h"))) is None
    monkeypatch.setattr(targets.provider("ec2"), "joining", lambda args: lambda: [Node("10.0.0.4", 8)])
    args = targets.NodeArgs(cluster="c1")
    [n] = targets.joining(args, ssh_user="ubuntu", ssh_key="/k", slots=2)()
    assert (n.host, n.slots, n.user, n.identity) == ("10.0.0.4", 2, "ubuntu", "/k")
    assert targets.joining(args)()[0].slots == 8
