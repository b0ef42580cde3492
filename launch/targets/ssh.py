"""Plain ssh hosts (--hostfile FILE, --hosts h1:4,h2:4): machines dtrain neither made nor takes down."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dtrain import values
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs.login import Login, login_for
from dtrain.launch.remote.hosts import Node, parse_hostfile, parse_hosts_arg
from dtrain.launch.jobs.jobfile import selecting
from dtrain.launch.targets.base import NodeArgs, NodeProvider


def hostfile_nodes(hostfile: str) -> list[Node]:
    """The hostfile's nodes; each identity= names a private key (ssh reads it: a key, not a FIFO),
    a relative one relative to the hostfile's directory (as a job file's paths are to its own)."""
    here = Path(hostfile).parent
    nodes = [dataclasses.replace(n, identity=str(here / n.identity))
             if n.identity and not n.identity.startswith(("~", "/", "%", "$")) else n
             for n in parse_hostfile(hostfile)]
    for key in dict.fromkeys(n.identity for n in nodes if n.identity):
        try:
            values.ssh_key("identity", key)
        except values.BadValue as e:
            raise LaunchError(f"{hostfile}: {e}") from None
    return nodes


class SshHosts(NodeProvider):
    name = "ssh"
    flags = selecting("ssh")  # the launch fields that choose it: the model's (jobfile.py)

    def discover(self, args: NodeArgs) -> list[Node]:
        return hostfile_nodes(args.hostfile) if args.hostfile else parse_hosts_arg(args.hosts or "")

    def ssh_user(self) -> str | None:
        return None  # the hostfile's user=, --ssh-user, else ~/.ssh/config

    def login(self, image: str) -> Login:
        return login_for(image)  # an ECR image: a token from boto3; any other registry: none


PROVIDER = SshHosts()
