"""Clusters you can reach by name (issue 49): `dtrain nodes ssh NAME [NODE]`, `dtrain nodes
ssh-config NAME`, `dtrain exec --cluster NAME -- CMD`.

A name is a cluster `dtrain nodes up --name NAME` recorded under DTRAIN_HOME (its cluster.json
and hostfile: the nodes, user, key and ssh options `launch --cluster NAME` uses, read through the
same providers, launch/targets/), or `local`, the simulated cluster of `dtrain cluster up` (its
hostfile, identity key and no known_hosts: its host keys are new with every `cluster up`). One
way to reach a node: the nodes and options the launcher would use, made into an ssh login
(launch/remote/reach.py), an ssh config block, or a fan-out of one command
(launch/remote/transport.py), each node's lines tagged `[node-I]`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dtrain import contract, outfile, values
from dtrain.terminal import shown
from dtrain.launch.errors import LaunchError
from dtrain.launch.remote import reach as rr
from dtrain.launch.remote.fanout import NodeResult
from dtrain.launch.remote.hosts import Node, apply_ssh_defaults

SIMULATED = "local"  # the simulated cluster's name (where no `nodes up --name local` record is here)
# What the simulated cluster's ssh config (launch/infra/cluster.py) says of its nodes' host keys:
# new with every `cluster up`, so none is kept.
SIMULATED_OPTS = ("-o", "UserKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=no", "-o", "LogLevel=ERROR")
CONFIG_MARK = "# dtrain ssh config"  # the first line of a file `nodes ssh-config --write` wrote


@dataclass(frozen=True)
class Reach:
    """How a cluster's nodes are reached: the nodes (user, key, port, jump host each) and the ssh
    options recorded for them (argv form, as `launch --cluster` passes them)."""

    name: str
    what: str  # "EC2 cluster (region, stack)" / "the simulated cluster"
    nodes: tuple[Node, ...]
    ssh_opts: tuple[str, ...]


def _clusters_dir() -> Path:
    from dtrain.launch.infra import ec2

    return ec2.clusters_dir()


def _simulated_up() -> bool:
    from dtrain.launch.infra import cluster as cl

    return (cl.STATE_DIR / "hostfile").is_file()


def known() -> list[str]:
    """The names of the clusters here: the records of `nodes up`, then `local` if the simulated
    cluster is up."""
    d = _clusters_dir()
    try:
        names = sorted(p.name for p in d.iterdir() if os.path.lexists(p / "cluster.json"))
    except OSError:
        names = []
    return names + ([SIMULATED] if _simulated_up() and SIMULATED not in names else [])


def _unknown(name: str) -> LaunchError:
    have = known()
    listed = ", ".join(have) if have else "none here (`dtrain nodes up --name NAME`, or `dtrain cluster up`)"
    return LaunchError(f"--cluster {name}: no such cluster; known: {listed}")


def reach(name: str) -> Reach:
    """The cluster called name, as the launcher reaches it; one line where there is none."""
    from dtrain.launch import targets

    values.name("--cluster", name)
    if os.path.lexists(_clusters_dir() / name / "cluster.json"):
        from dtrain.launch.infra import ec2

        record = ec2.load_cluster(name)  # schema-checked: damage is one line naming the file
        args = targets.NodeArgs(cluster=name)
        return Reach(name, f"EC2 cluster {name} ({record.region}, stack {record.stack})",
                     tuple(targets.nodes(args)), tuple(targets.ssh_opts(args)))
    if name == SIMULATED and _simulated_up():
        from dtrain.launch.infra import cluster as cl

        local = targets.provider("local")
        nodes = local.discover(targets.NodeArgs())
        try:
            info = cl.ClusterInfo.from_dict(json.loads(cl.STATE_FILE.read_text())["info"])  # cluster.py's state
        except (OSError, ValueError, KeyError, TypeError, cl.ClusterError) as e:
            raise LaunchError(f"{cl.STATE_FILE}: cannot read the simulated cluster's record ({e}); "
                              "`dtrain cluster up` again") from None
        return Reach(name, "the simulated cluster (dtrain cluster up)",
                     tuple(apply_ssh_defaults(nodes, user=local.ssh_user(), identity=info.identity_file)),
                     SIMULATED_OPTS)
    raise _unknown(name)


def pick(cluster: Reach, node: str | None) -> tuple[int, Node]:
    """(index 1..N, node) of NODE: an index, a host as the hostfile names it, or its ssh alias
    dtrain-NAME-I; the first where None."""
    if node is None:
        return 1, cluster.nodes[0]
    count = len(cluster.nodes)
    for i, n in enumerate(cluster.nodes, 1):
        if node in (str(i), n.host, rr.alias(cluster.name, i)):
            return i, n
    if node.isdigit():
        raise LaunchError(f"node {values.shown(node)}: cluster {cluster.name} has nodes 1 to {count}")
    raise LaunchError(f"node {values.shown(node)}: not a node of cluster {cluster.name} (an index 1 to {count}, "
                      f"or one of its hosts: {', '.join(n.host for n in cluster.nodes[:8])}"
                      f"{' ...' if count > 8 else ''})")


def user_opts(ssh_opt: Sequence[str] | None) -> tuple[str, ...]:
    """--ssh-opt KEY=VALUE (repeatable) as ssh argv: `-o KEY=VALUE` each."""
    return tuple(x for o in (ssh_opt or ()) for x in ("-o", o))


def login_argv(name: str, node: str | None, command: Sequence[str] = (),
               ssh_opt: Sequence[str] | None = None) -> list[str]:
    """The ssh argv that logs in to node of cluster name (or runs command there)."""
    extra = user_opts(ssh_opt)
    rr.options(extra, "--ssh-opt")  # each one an ssh option: KEY=VALUE
    cluster = reach(name)
    _, chosen = pick(cluster, node)
    recorded = rr.options(cluster.ssh_opts, f"cluster {name}'s ssh options")
    return rr.login_argv(chosen, recorded, command, extra)


def config_text(name: str) -> str:
    """The ssh config block of cluster name: `Host dtrain-NAME-1` ... one per node."""
    cluster = reach(name)
    recorded = rr.options(cluster.ssh_opts, f"cluster {name}'s ssh options")
    head = (f"{CONFIG_MARK} for {cluster.what}: `ssh {rr.alias(name, 1)}`; "
            f"written by `dtrain nodes ssh-config {name}`")
    return rr.config_block(name, cluster.nodes, recorded, head[2:])


def config_dir() -> Path:
    return Path(os.environ.get("DTRAIN_HOME", "~/.dtrain")).expanduser() / "ssh"


def include_line() -> str:
    """The one line to put at the top of ~/.ssh/config (before any Host) for every cluster's file."""
    where = str(config_dir() / "*.config")
    return f'Include "{where}"' if any(c.isspace() for c in where) else f"Include {where}"


def write_config(name: str, *, force: bool = False) -> Path:
    """config_text(name) in DTRAIN_HOME/ssh/NAME.config (outfile: no link followed, a file dtrain
    did not write replaced only with force, atomically)."""
    text = config_text(name)
    d = config_dir()
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise values.BadValue(f"--write: cannot make {values.shown_path(d)}: {e.strerror or e}") from None
    return outfile.write(d / f"{name}.config", text, flag="--write", kind=outfile.marked(CONFIG_MARK),
                         force=force, mode=0o600)


def remote_command(command: Sequence[str], *, container: bool = False, job: str | None = None) -> list[str]:
    """The argv run on each node: command itself, or (container) command inside the job's
    container there (launch/node/exec-container.sh: the container labelled with the job)."""
    if job is not None:
        values.name("--job", job)
        if not container:
            raise values.BadValue("--job: names the job whose container runs the command; add --container")
    if not command:
        raise LaunchError("exec: give the command after `--`: dtrain exec --cluster NAME -- CMD ARGS...")
    if not container:
        return list(command)
    from dtrain.launch.jobs import node_programs

    return node_programs.program_argv("exec-container.sh", [contract.LABEL_JOB, job or "", *command])


def node_tag(index: int) -> str:
    return f"node-{index}"


def exec_on(name: str, command: Sequence[str], *, container: bool = False, job: str | None = None,
            timeout: float | None = None, ssh_opt: Sequence[str] | None = None,
            line: Callable[[str], None] = print) -> tuple[int, list[NodeResult], str]:
    """command on every node of cluster name at once, each line of its output passed to line()
    as `[node-I] text` (control characters shown as escapes: terminal.shown). (exit code: 0 where every node succeeded, else 1;
    the results; "" or the one line naming the failed nodes)."""
    from dtrain.launch.remote.transport import SshTransport

    remote = remote_command(command, container=container, job=job)
    extra = user_opts(ssh_opt)
    rr.options(extra, "--ssh-opt")
    cluster = reach(name)
    tags = {n.host: node_tag(i) for i, n in enumerate(cluster.nodes, 1)}
    ssh = SshTransport(cluster.nodes, (*cluster.ssh_opts, *extra), multiplex=False)
    results = ssh.run(cluster.nodes, lambda n: remote, timeout=timeout,
                      on_line=lambda n, text: line(rr.tagged(tags[n.host], text)))
    return (0, results, "") if all(r.ok for r in results) else (1, results, failure_line(results, tags, command))


def failure_line(results: Sequence[NodeResult], tags: dict[str, str], command: Sequence[str]) -> str:
    """One line: which nodes failed and how (their text cleaned)."""
    failed = [r for r in results if not r.ok]
    what = "; ".join(f"{tags[r.host]} ({r.host}): {shown(r.error or 'failed')}" for r in failed)
    return f"{shown(command[0])} failed on {len(failed)} of {len(results)} nodes: {what}"
