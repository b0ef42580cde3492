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
    return [*(["-p", str(node.port)] if node.port else []), *(["-l", node.user] if node.user else []), node.host]


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
    configs = _communicate([_start(["ssh", "-G", *ssh_opts, *_node_target(n)]) for n in nodes])
    looks = [lookup(text) if rc == 0 else None for rc, text in configs]
    asks = sorted({(name, f) for look in looks if look for name in [look[0]] for f in look[1]
                   if os.path.isfile(f)})
    found = _communicate([_start(["ssh-keygen", "-F", name, "-f", f]) for name, f in asks])
    known = {name for (name, _), (rc, text) in zip(asks, found) if rc == 0 and text.strip()}
    return [n for n, look in zip(nodes, looks) if look is None or look[0] not in known]
