"""Clusters you can reach by name (issue 49): `dtrain nodes ssh NAME [NODE]`, `nodes ssh-config`,
`dtrain exec --cluster NAME -- CMD`. The argv, the config block and the output tagging as pure
functions; then the commands against a real sshd on 127.0.0.1 standing in for the node of a
cluster record (`nodes up`'s cluster.json and hostfile), as launch --cluster reads it."""

from __future__ import annotations

import getpass
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from dtrain import ROOT, contract
from dtrain.terminal import shown
from dtrain.cli import reach_argv
from dtrain.launch import clusters
from dtrain.launch.errors import LaunchError
from dtrain.launch.remote import reach as rr
from dtrain.launch.remote.hosts import Node
from dtrain.values import BadValue
from test_fanout import sshd  # noqa: F401 - the module's real sshd on 127.0.0.1

HOSTILE = ["$(id)", "a;b", "`id`", "two words", "new\nline", "it's", "*", "--", "-o", "$HOME", "a\\b", ""]


# ---------------------------------------------------------------- pure: options, argv, config block


def test_options_read_every_form_ssh_takes():
    assert rr.options(["-o", "ProxyJump=bastion", "-oPort=2222", "-o", "User ubuntu", "-p", "22", "-i", "/k",
                       "-J", "j:2", "-l", "me", "-o", "LocalForward = 8265 localhost:8265"]) == [
        ("ProxyJump", "bastion"), ("Port", "2222"), ("User", "ubuntu"), ("Port", "22"), ("IdentityFile", "/k"),
        ("ProxyJump", "j:2"), ("User", "me"), ("LocalForward", "8265 localhost:8265")]


@pytest.mark.parametrize("argv", [["-F", "cfg"], ["-o"], ["-o", "NoValue"], ["-o", "=x"], ["-v"], ["host"],
                                  ["-o", "Bad-Key=1"]])
def test_options_refuse_what_a_config_cannot_hold(argv):
    with pytest.raises(LaunchError) as e:
        rr.options(argv, "cluster c's ssh options")
    assert str(e.value).startswith("cluster c's ssh options: ") and "\n" not in str(e.value)


def _node(**kw) -> Node:
    return Node("10.0.0.5", 8, **kw)


def test_login_argv_is_the_launchers_options_for_a_terminal():
    node = _node(port=2222, user="ubuntu", identity="/keys/id", jump="bastion")
    argv = rr.login_argv(node, [("ProxyCommand", "none")], (), ["-o", "LocalForward=1 localhost:1"])
    assert argv == ["ssh", "-o", "User=ubuntu", "-o", "Port=2222", "-o", "IdentityFile=/keys/id",
                    "-o", "IdentitiesOnly=yes", "-o", "ProxyJump=bastion", "-o", "ProxyCommand=none",
                    "-o", "StrictHostKeyChecking=accept-new", "-o", "ConnectTimeout=10",
                    *contract.ssh_keepalive_opts(), "-o", "LocalForward=1 localhost:1", "10.0.0.5"]
    assert "BatchMode=yes" not in " ".join(argv)  # a key's passphrase may be asked at a terminal


def test_the_clusters_options_win_over_dtrains_defaults():
    argv = rr.login_argv(_node(), [("StrictHostKeyChecking", "no"), ("UserKnownHostsFile", "/dev/null")])
    assert "StrictHostKeyChecking=no" in argv and "StrictHostKeyChecking=accept-new" not in argv


def test_a_command_is_one_word_each_quoted_for_the_nodes_shell():
    argv = rr.login_argv(_node(), [], ["printf", "%s|", *HOSTILE])
    assert argv[-2] == "--" and argv[-1] == shlex.join(["printf", "%s|", *HOSTILE])
    # what the node's shell makes of it: the words, literally
    out = subprocess.run(["bash", "-c", argv[-1]], capture_output=True, text=True, check=True).stdout
    assert out == "".join(f"{w}|" for w in HOSTILE)


def test_config_block_names_every_node():
    nodes = [Node("10.0.0.5", 8, user="ubuntu", identity="/home/me/my keys/id%1"), Node("10.0.0.6", 8, port=2200)]
    text = rr.config_block("c1", nodes, [("ProxyJump", "bastion")], "dtrain ssh config for c1")
    keep = contract.ssh_keepalive_opts()
    alive = "".join(f"  {o.split('=')[0]} {o.split('=')[1]}\n" for o in keep[1::2])
    assert text == (
        "# dtrain ssh config for c1\n"
        "Host dtrain-c1-1\n  HostName 10.0.0.5\n  User ubuntu\n  IdentityFile \"/home/me/my keys/id%%1\"\n"
        "  IdentitiesOnly yes\n  ProxyJump bastion\n  StrictHostKeyChecking accept-new\n  ConnectTimeout 10\n"
        f"{alive}\n"
        "Host dtrain-c1-2\n  HostName 10.0.0.6\n  Port 2200\n  ProxyJump bastion\n"
        f"  StrictHostKeyChecking accept-new\n  ConnectTimeout 10\n{alive}")
    # ssh reads it as written: the key's path one value with its blank (-G shows it before %%
    # becomes %), each option of the first Host its
    cfg = subprocess.run(["ssh", "-G", "-F", "/dev/stdin", "dtrain-c1-1"], input=text, capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert {"identityfile /home/me/my keys/id%%1", "hostname 10.0.0.5", "user ubuntu", "proxyjump bastion",
            "stricthostkeychecking accept-new", "identitiesonly yes"} <= set(cfg)


@pytest.mark.parametrize("value", ['a"b', "line\nbreak", ""])
def test_config_block_refuses_a_value_it_cannot_write(value):
    with pytest.raises(LaunchError):
        rr.config_block("c1", [_node()], [("ProxyCommand", value)], "x")


def test_a_nodes_text_cannot_drive_the_terminal():
    assert rr.tagged("node-1", "hi\tthere") == "[node-1] hi\tthere"
    assert shown("\x1b]0;owned\x07red \x1b[31mx\r\u202eevil\x9b") == \
        "\\x1b]0;owned\\x07red \\x1b[31mx\\x0d\\u202eevil\\x9b"


def test_nodes_ssh_words_become_the_tasks_flags():
    assert reach_argv(["dtrain", "nodes", "ssh", "c1"]) == ["dtrain", "nodes-ssh", "--cluster", "c1"]
    assert reach_argv(["dtrain", "nodes", "ssh", "c1", "2", "--ssh-opt", "X=1", "--", "ls", "3"]) == [
        "dtrain", "nodes-ssh", "--cluster", "c1", "--node", "2", "--ssh-opt", "X=1", "--", "ls", "3"]
    assert reach_argv(["dtrain", "nodes", "ssh-config", "c1", "--write"]) == [
        "dtrain", "nodes-ssh", "--config", "--cluster", "c1", "--write"]
    assert reach_argv(["dtrain", "nodes", "ssh"]) == ["dtrain", "nodes-ssh"]
    for other in (["dtrain", "nodes", "up", "--name", "x"], ["dtrain", "launch", "--", "nodes", "ssh"]):
        assert reach_argv(other) == other


def test_exec_runs_argv_or_the_container_program():
    assert clusters.remote_command(["echo", "$(id)"]) == ["echo", "$(id)"]
    argv = clusters.remote_command(["echo", "$(id)"], container=True, job="j1")
    assert argv[:2] == ["bash", "-c"] and argv[3:] == ["dtrain-exec-container", contract.LABEL_JOB, "j1", "echo", "$(id)"]
    with pytest.raises(BadValue, match="^--job: "):
        clusters.remote_command(["true"], job="j1")
    with pytest.raises(BadValue, match="^--job "):
        clusters.remote_command(["true"], container=True, job="../x")
    with pytest.raises(LaunchError, match="after `--`"):
        clusters.remote_command([])


def _docker_stub(tmp_path: Path, names: str) -> dict:
    """A `docker` on PATH: `ps` prints names (and the filter it got to filter.txt); `exec` prints its words."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "docker").write_text(
        "#!/bin/sh\nif [ \"$1\" = ps ]; then printf '%s\\n' \"$3\" > \"$STUB/filter.txt\"; "
        "printf '%s' \"$NAMES\"; exit 0; fi\n"
        "shift; for w in \"$@\"; do printf '<%s>' \"$w\"; done; echo\n")
    (bin_ / "docker").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "NAMES": names, "STUB": str(tmp_path)}


def test_the_container_program_picks_the_jobs_container(tmp_path):
    env = _docker_stub(tmp_path, "dtrain-j1\n")
    r = subprocess.run(clusters.remote_command(["echo", *HOSTILE], container=True, job="j1"), env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "<dtrain-j1><echo>" + "".join(f"<{w}>" for w in HOSTILE) + "\n"
    assert (tmp_path / "filter.txt").read_text() == f"label={contract.LABEL_JOB}=j1\n"


@pytest.mark.parametrize("names,says", [("", "no dtrain job container is running on "),
                                        ("dtrain-a\ndtrain-b\n", "2 dtrain job containers run on ")])
def test_the_container_program_says_where_there_is_not_one(tmp_path, names, says):
    r = subprocess.run(clusters.remote_command(["true"], container=True), env=_docker_stub(tmp_path, names),
                       capture_output=True, text=True)
    assert r.returncode == 3 and says in r.stderr and r.stdout == ""
    assert (tmp_path / "filter.txt").read_text() == f"label={contract.LABEL_JOB}\n"


# ---------------------------------------------------------------- a cluster record, a real sshd


def _record(home: Path, name: str, ips: list[str], ssh_opts: list[str], identity: str) -> None:
    from dtrain.launch.infra import ec2

    instances = tuple(ec2.Instance(f"i-{k:017x}", ip, None, "us-east-1a", "c5.large") for k, ip in enumerate(ips))
    c = ec2.Cluster(name=name, region="us-east-1", stack=f"dtrain-{name}", instance_type="c5.large", nitro=True,
                    slots=1, user=getpass.getuser(), identity=identity, instances=instances,
                    ssh_opts=tuple(ssh_opts))
    ec2.save_cluster(c)
    assert (home / "clusters" / name / "cluster.json").is_file()


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DTRAIN_HOME", str(tmp_path / "home"))
    from dtrain.launch.infra import cluster as cl

    monkeypatch.setattr(cl, "STATE_DIR", tmp_path / "no-simulated-cluster")
    return tmp_path / "home"


def _sshd_record(home: Path, sshd, name: str = "x") -> None:  # noqa: F811
    d = sshd["dir"]
    _record(home, name, ["127.0.0.1"], ["-o", f"Port={sshd['port']}", "-o", f"UserKnownHostsFile={d}/known_hosts",
                                        "-o", "GlobalKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"],
            str(d / "id"))


def dtrain(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dtrain", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, cwd=ROOT, env=os.environ.copy())


def test_unknown_cluster_lists_the_known_ones(home, sshd):  # noqa: F811
    _sshd_record(home, sshd, "c2")
    _sshd_record(home, sshd, "c1")
    for argv in (["exec", "--cluster", "nope", "--", "true"], ["nodes", "ssh", "nope"],
                 ["nodes", "ssh-config", "nope"]):
        r = dtrain(*argv)
        assert (r.returncode, r.stdout) == (2, "")
        # (the simulated cluster, where the lead's is up on this machine, is `local`, last)
        local = ", local" if Path("/var/lib/dtrain-cluster/hostfile").is_file() else ""
        assert r.stderr == f"error: --cluster nope: no such cluster; known: c1, c2{local}\n"


def test_a_node_out_of_range_is_one_line(home, sshd):  # noqa: F811
    _sshd_record(home, sshd)
    r = dtrain("nodes", "ssh", "x", "3", "--", "true")
    assert (r.returncode, r.stdout, r.stderr) == (2, "", "error: node '3': cluster x has nodes 1 to 1\n")
    r = dtrain("nodes", "ssh", "x", "10.1.1.1")
    assert r.returncode == 2 and "not a node of cluster x" in r.stderr and "127.0.0.1" in r.stderr


def test_exec_runs_on_the_node_each_line_tagged(home, sshd):  # noqa: F811
    _sshd_record(home, sshd)
    r = dtrain("exec", "--cluster", "x", "--", "echo", "hi")
    assert (r.returncode, r.stdout) == (0, "[node-1] hi\n"), r.stderr
    r = dtrain("exec", "--cluster", "x", "--", "printf", "%s\\n", *HOSTILE[:4], "\x1b[2Jgone")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"[node-1] {w}" for w in HOSTILE[:4]] + ["[node-1] \\x1b[2Jgone"]


def test_exec_fails_naming_the_node(home, sshd):  # noqa: F811
    _sshd_record(home, sshd)
    r = dtrain("exec", "--cluster", "x", "--", "sh", "-c", "echo oops >&2; exit 3")
    assert r.returncode == 1 and r.stdout == "[node-1] oops\n"
    assert r.stderr == "error: sh failed on 1 of 1 nodes: node-1 (127.0.0.1): exit 3: oops\n"


def test_nodes_ssh_runs_a_command_on_the_chosen_node(home, sshd):  # noqa: F811
    _sshd_record(home, sshd)
    r = dtrain("nodes", "ssh", "x", "1", "--", "printf", "%s|", *HOSTILE)
    assert (r.returncode, r.stdout) == (0, "".join(f"{w}|" for w in HOSTILE)), r.stderr
    r = dtrain("nodes", "ssh", "x", "--", "exit", "4")  # the default: the first node; ssh's exit status
    assert r.returncode == 4


def test_the_written_ssh_config_reaches_the_node(home, sshd):  # noqa: F811
    _sshd_record(home, sshd)
    r = dtrain("nodes", "ssh-config", "x", "--write")
    path = home / "ssh" / "x.config"
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"wrote {path}; add this line once, at the top of ~/.ssh/config: Include {home}/ssh/*.config\n"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    printed = dtrain("nodes", "ssh-config", "x")
    assert printed.stdout == path.read_text() and "Host dtrain-x-1\n" in printed.stdout
    r = subprocess.run(["ssh", "-F", str(path), "-o", "BatchMode=yes", "dtrain-x-1", "echo", "via-config"],
                       capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert (r.returncode, r.stdout) == (0, "via-config\n"), r.stderr
    # written again: its own file is replaced; a file dtrain did not write is not
    assert dtrain("nodes", "ssh-config", "x", "--write").returncode == 0
    path.write_text("Host mine\n")
    r = dtrain("nodes", "ssh-config", "x", "--write")
    assert r.returncode == 2 and "--force" in r.stderr and path.read_text() == "Host mine\n"
    assert dtrain("nodes", "ssh-config", "x", "--write", "--force").returncode == 0
    assert path.read_text().startswith(clusters.CONFIG_MARK)


def test_the_write_does_not_follow_a_link(home, sshd, tmp_path):  # noqa: F811
    _sshd_record(home, sshd)
    (home / "ssh").mkdir(mode=0o700)
    target = tmp_path / "elsewhere"
    target.write_text("keep\n")
    (home / "ssh" / "x.config").symlink_to(target)
    r = dtrain("nodes", "ssh-config", "x", "--write", "--force")
    assert r.returncode == 2 and "symbolic link" in r.stderr and target.read_text() == "keep\n"


def test_ssh_config_flags_are_for_their_action(home, sshd):  # noqa: F811
    _sshd_record(home, sshd)
    r = dtrain("nodes", "ssh", "x", "--write")
    assert r.returncode == 2 and r.stderr.startswith("error: --write and --force are for the ssh config")
    r = dtrain("nodes", "ssh-config", "x", "--node", "1")
    assert r.returncode == 2 and r.stderr.startswith("error: --node: is for `nodes ssh`")


def test_the_simulated_cluster_is_local(home, monkeypatch, tmp_path):
    """`local` is the simulated cluster's record (launch/infra/cluster.py's hostfile and state)."""
    from dtrain.launch.infra import cluster as cl

    state = tmp_path / "sim"
    state.mkdir()
    monkeypatch.setattr(cl, "STATE_DIR", state)
    monkeypatch.setattr(cl, "STATE_FILE", state / "state.json")
    with pytest.raises(LaunchError, match="no such cluster; known: none here"):
        clusters.reach("local")
    (state / "hostfile").write_text("10.213.0.11 slots=1 port=22 user=root\n10.213.0.12 slots=1 port=22 user=root\n")
    info = cl._info(2)
    (state / "state.json").write_text(json.dumps({"info": info.to_dict(), "ready": True}))  # as cluster.up writes it
    assert clusters.known() == ["local"]
    got = clusters.reach("local")
    assert [(n.host, n.user, n.identity) for n in got.nodes] == [
        ("10.213.0.11", "root", info.identity_file), ("10.213.0.12", "root", info.identity_file)]
    text = clusters.config_text("local")
    assert "Host dtrain-local-2\n  HostName 10.213.0.12\n" in text and "UserKnownHostsFile /dev/null" in text
    assert "StrictHostKeyChecking no" in text
