"""Reaching a cluster's nodes by hand (transport only, pure): the argv of an ssh login to one node
(`dtrain nodes ssh`), an ssh config block naming every node (`dtrain nodes ssh-config`), and how
a node's output is shown (`dtrain exec`'s tagged lines, terminal controls made visible).

The same nodes and ssh options the launcher uses (hosts.Node, a cluster's recorded options) go
in; what the options say is written once, as ssh's own config keywords, so that the argv and
the config block agree.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from dtrain import contract
from dtrain.terminal import shown
from dtrain.launch.errors import LaunchError
from dtrain.launch.remote.hosts import Node

# ssh's command-line flags that take a value and the config keyword each one sets.
_FLAG_KEYWORDS = {"-p": "Port", "-i": "IdentityFile", "-J": "ProxyJump", "-l": "User"}
_KEYWORD = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")
# Keywords whose value ssh expands %-tokens in: a literal % is written %%.
_TOKENS = {"identityfile", "userknownhostsfile", "certificatefile", "controlpath", "identityagent",
           "localcommand", "proxycommand", "knownhostscommand", "remotecommand"}


def options(ssh_opts: Sequence[str], where: str = "ssh options") -> list[tuple[str, str]]:
    """ssh command-line options (`-o Key=Value`, `-oKey=Value`, `-o 'Key Value'`, -p, -i, -J, -l)
    as (keyword, value) pairs, in order; anything else (-F FILE, a flag without its value) is one
    line naming `where`: it has no config keyword."""
    out: list[tuple[str, str]] = []
    items = list(ssh_opts)
    i = 0
    while i < len(items):
        flag = items[i]
        if flag == "-o" or flag in _FLAG_KEYWORDS:
            if i + 1 >= len(items):
                raise LaunchError(f"{where}: {flag} without its value")
            value, i = items[i + 1], i + 2
        elif flag.startswith("-o") and len(flag) > 2:
            flag, value, i = "-o", flag[2:], i + 1
        else:
            raise LaunchError(f"{where}: {shlex.quote(flag)} is not an ssh option an ssh config can hold "
                              "(-o KEY=VALUE, -p, -i, -J, -l)")
        if flag == "-o":
            key = re.split(r"[=\s]", value, maxsplit=1)[0]
            rest = value[len(key):].lstrip(" \t")
            rest = rest[1:].lstrip(" \t") if rest.startswith("=") else rest
            if not _KEYWORD.match(key) or not rest:
                raise LaunchError(f"{where}: -o {shlex.quote(value)}: expected KEY=VALUE")
            out.append((key, rest))
        else:
            out.append((_FLAG_KEYWORDS[flag], value))
    return out


def _config_value(key: str, value: str) -> str:
    """value as one ssh config argument: %% where ssh expands tokens, in double quotes where
    it has blanks; a value that cannot be written so (a newline, a double quote) is refused."""
    if not value or not value.isprintable() or '"' in value:
        raise LaunchError(f"ssh option {key}: {value!r} cannot be written in an ssh config")
    if key.lower() in _TOKENS:
        value = value.replace("%", "%%")
    return f'"{value}"' if any(c.isspace() for c in value) or "#" in value else value


def node_options(node: Node, recorded: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """Everything ssh is told for node, as config keywords, in the order it decides (the first
    value of a keyword wins): the node's own (port, key, jump host), the cluster's recorded
    options, then dtrain's defaults where neither set them (the launcher's: keys checked as
    accept-new, keepalives)."""
    own: list[tuple[str, str]] = [("HostName", node.host)]
    if node.user:
        own.append(("User", node.user))
    if node.port is not None:
        own.append(("Port", str(node.port)))
    if node.identity:
        own += [("IdentityFile", node.identity), ("IdentitiesOnly", "yes")]
    if node.jump:
        own.append(("ProxyJump", node.jump))
    keep = contract.ssh_keepalive_opts()
    defaults = [("StrictHostKeyChecking", "accept-new"), ("ConnectTimeout", "10"),
                *((o.split("=", 1)[0], o.split("=", 1)[1]) for o in keep[1::2])]
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for key, value in [*own, *recorded, *defaults]:
        if key.lower() not in seen:
            seen.add(key.lower())
            out.append((key, value))
    return out


def alias(cluster: str, index: int) -> str:
    """The ssh config's name of a cluster's node (1-based): dtrain-NAME-1."""
    return f"dtrain-{cluster}-{index}"


def config_block(cluster: str, nodes: Sequence[Node], recorded: Sequence[tuple[str, str]], header: str) -> str:
    """An ssh config with one `Host dtrain-CLUSTER-I` entry per node (header: its comment lines'
    text, one line)."""
    out = [f"# {header}"]
    for i, node in enumerate(nodes, 1):
        out.append(f"Host {alias(cluster, i)}")
        out += [f"  {key} {_config_value(key, value)}" for key, value in node_options(node, recorded)]
        out.append("")
    return "\n".join(out)


def login_argv(node: Node, recorded: Sequence[tuple[str, str]], command: Sequence[str] = (),
               user_opts: Sequence[str] = ()) -> list[str]:
    """`ssh -o K=V ... [user@]host [-- 'quoted command']`: a login to node as the launcher reaches
    it (the same options, as node_options orders them), for a terminal (no BatchMode: a key's
    passphrase may be asked). user_opts (`-o K=V` ...) come after the cluster's (ssh keeps the
    first: the cluster's win). command: argv words, each quoted for the node's shell."""
    argv = ["ssh"]
    for key, value in node_options(node, recorded):
        if key != "HostName":
            argv += ["-o", f"{key}={value}"]
    argv += list(user_opts)
    argv.append(node.host)
    if command:
        argv += ["--", shlex.join(command)]
    return argv


def tagged(tag: str, line: str) -> str:
    """`[tag] line`, the line with control characters shown as escapes (terminal.shown)."""
    return f"[{tag}] {shown(line)}"
