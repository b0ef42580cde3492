"""Whether the user has connected to a node before: its host key in the known_hosts files ssh
would read for it. Asked locally (`ssh -G`, `ssh-keygen -F`): no connection is made.

ssh -G says, for the node and the ssh options in effect (the user's config, -F, -o), the name
ssh looks the key up under (HostKeyAlias, else HostName; `[name]:port` off port 22) and the
files (UserKnownHostsFile, GlobalKnownHostsFile); ssh-keygen -F finds it there, hashed
entries and patterns included.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence

from dtrain.launch.remote.hosts import Node

TIMEOUT_S = 10  # for each local ssh -G / ssh-keygen -F (they read files)


def _node_target(node: Node) -> list[str]:
    return [*(["-p", str(node.port)] if node.port else []), *(["-l", node.user] if node.user else []),
            *(["-J", node.jump] if node.jump else []), node.host]


MAX_JUMPS = 8  # jump hosts followed from one node's route (ProxyJump chains), then the rest count as unknown


def jumps(config: str) -> list[Node]:
    """The jump hosts (`[user@]host[:port]`, comma-separated) in `ssh -G` output's proxyjump: the
    hosts ssh connects to, with the user's key, before the node itself."""
    value = next((line.split(" ", 1)[1].strip() for line in config.splitlines()
                  if line.lower().startswith("proxyjump ")), "")
    if not value or value.lower() == "none":
        return []
    out = []
    for item in value.split(",")[:MAX_JUMPS]:
        item = item.strip().removeprefix("ssh://")
        user, _, hostport = item.rpartition("@")
        host, _, port = hostport.partition(":") if hostport.count(":") == 1 else (hostport, "", "")
        out.append(Node(host.strip("[]"), port=int(port) if port.isdigit() else None, user=user or None))
    return out


def _communicate(procs: Sequence[subprocess.Popen | None]) -> list[tuple[int | None, str]]:
    out: list[tuple[int | None, str]] = []
    for p in procs:
        if p is None:
            out.append((None, ""))
            continue
        try:
            text = p.communicate(timeout=TIMEOUT_S)[0]
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            out.append((None, ""))
            continue
        out.append((p.returncode, text))
    return out


def _start(argv: Sequence[str]) -> subprocess.Popen | None:
    try:
        return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
    except OSError:
        return None


def lookup(config: str) -> tuple[str, list[str]] | None:
    """From `ssh -G` output: (the name the host key is looked up under, the known_hosts files)."""
    seen: dict[str, str] = {}
    for line in config.splitlines():
        key, _, value = line.partition(" ")
        seen.setdefault(key.lower(), value.strip())
    name = seen.get("hostkeyalias") or seen.get("hostname")
    if not name or name == "none":
        return None
    port = seen.get("port", "22")
    files = [f for k in ("userknownhostsfile", "globalknownhostsfile") for f in seen.get(k, "").split()
             if f and f.lower() != "none"]
    return (name if port == "22" else f"[{name}]:{port}"), files


def unknown(nodes: Sequence[Node], ssh_opts: Sequence[str] = ()) -> list[Node]:
    """The nodes whose host key is in none of the known_hosts files ssh would read for them (one
    ssh cannot say of counts as unknown). Local only: nothing is sent to a node."""
    return _unknown(nodes, ssh_opts)[0]


def unknown_route(nodes: Sequence[Node], ssh_opts: Sequence[str] = ()) -> list[str]:
    """unknown(), and the jump hosts on the way to the nodes (ProxyJump from the options, the
    user's config or a hostfile's jump=) whose key is unknown: every host ssh would connect to
    that the user never has, by name (jump hosts as `host (jump host)`)."""
    bad, configs = _unknown(nodes, ssh_opts)
    hops = list(dict.fromkeys((j.host, j.port, j.user) for rc, text in configs if rc == 0 for j in jumps(text)))
    hop_nodes = [Node(h, port=p, user=u) for h, p, u in hops]
    # a jump host's own lookup without the route to it (first -o wins; else ssh -G sees a loop)
    bad_hops = _unknown(hop_nodes, ["-o", "ProxyJump=none", *ssh_opts])[0] if hop_nodes else []
    return [n.host for n in bad] + [f"{h.host} (jump host)" for h in bad_hops]


def _unknown(nodes: Sequence[Node], ssh_opts: Sequence[str]) -> tuple[list[Node], list[tuple[int | None, str]]]:
    configs = _communicate([_start(["ssh", "-G", *ssh_opts, *_node_target(n)]) for n in nodes])
    looks = [lookup(text) if rc == 0 else None for rc, text in configs]
    asks = sorted({(name, f) for look in looks if look for name in [look[0]] for f in look[1]
                   if os.path.isfile(f)})
    found = _communicate([_start(["ssh-keygen", "-F", name, "-f", f]) for name, f in asks])
    known = {name for (name, _), (rc, text) in zip(asks, found) if rc == 0 and text.strip()}
    return [n for n, look in zip(nodes, looks) if look is None or look[0] not in known], configs
