"""A containerd of its own (stdlib only: the simulated cluster's module imports it under the
system python3): `dtrain push`'s private one for the SOCI index, and each simulated node's
(launch/infra/cluster.py)."""

from __future__ import annotations

from pathlib import Path


def containerd_config(state: Path) -> str:
    """A private containerd: everything under state, CRI off, no metrics or debug socket."""
    return f"""version = 2
root = "{state / 'root'}"
state = "{state / 'state'}"
disabled_plugins = ["io.containerd.grpc.v1.cri"]

[grpc]
  address = "{state / 'containerd.sock'}"

[ttrpc]
  address = "{state / 'containerd.sock.ttrpc'}"

[debug]
  address = ""
  level = "warn"

[metrics]
  address = ""
"""
