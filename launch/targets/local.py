"""The local simulated cluster (`dtrain cluster up`, launch/infra/cluster.py): network namespaces
on this machine, reached as root with the cluster's key and ssh config, pulling from its plain
registry. No launch flag names it: its hostfile and ssh config are given as for any ssh hosts
(`dtrain cluster up` prints the line), and here it is a provider like the others."""

from __future__ import annotations

from typing import Any

from dtrain.launch.errors import LaunchError
from dtrain.launch.infra import cluster as cl
from dtrain.launch.jobs.login import Login
from dtrain.launch.remote.hosts import Node
from dtrain.launch.targets.base import NodeArgs, NodeProvider
from dtrain.launch.targets.ssh import hostfile_nodes


class Local(NodeProvider):
    name = "local"

    def discover(self, args: NodeArgs) -> list[Node]:
        hostfile = cl.STATE_DIR / "hostfile"  # `cluster up` writes it, `cluster down` removes it
        if not hostfile.is_file():
            raise LaunchError(f"the simulated cluster is not up (no {hostfile}): `dtrain cluster up --nodes N`")
        return hostfile_nodes(str(hostfile))

    def ssh_user(self) -> str | None:
        return "root"  # each node's sshd takes root with the cluster's key only

    def up(self, spec: Any, **options: Any) -> cl.ClusterInfo:
        """spec: the number of nodes; options: cluster.up's (recreate, nic_names, link_rate, lazy ...)."""
        return cl.up(int(spec), **options)

    def down(self, name: str | None = None, **options: Any) -> None:
        cl.down(**options)

    def login(self, image: str) -> Login:
        return Login()  # the cluster's registry is plain and open to its nodes


PROVIDER = Local()
