"""The node list: hostfiles, --hosts, and the ssh argv that reaches a node. Transport only: where
nodes come from (a cloud, the simulated cluster) is launch/targets/.

Everything here is pure except `parse_hostfile` (reads one file) and `kex_opts` (asks the local
ssh client, `ssh -G`).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dtrain import contract
from dtrain import values
from dtrain.launch.errors import LaunchError

# Host names and IPv4 addresses. No leading "-" (it would become an ssh option), no ":"
# (it is the slots separator of -H lists, so IPv6 literals are out: use a name).
_HOST_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
_USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
_INT_RE = re.compile(r"^[0-9]+$")
_HOSTFILE_KEYS = ("slots", "port", "user", "identity", "jump")
MAX_SLOTS = 4096  # processes per node (the --slots flag's bound too): far above any instance's GPUs


@dataclass(frozen=True)
class Node:
    """One machine of the job, as the launcher reaches it over ssh (host sshd, not the container's)."""

    host: str  # IP or name, as ssh and mpirun -H will see it
    slots: int = 1  # processes (GPUs) on this node
    port: int | None = None  # host ssh port; None: ssh decides (22, or Port in ~/.ssh/config)
    user: str | None = None  # None: ssh decides (User in ~/.ssh/config, else the local user)
    identity: str | None = None  # private key path; None: ssh decides (agent, config, defaults)
    jump: str | None = None  # ssh jump host `[user@]host[:port]` (ssh -J); None: ssh decides (ProxyJump in config)

    def __post_init__(self) -> None:
        if not host_ok(self.host):
            raise ValueError(f"bad host {self.host!r}")
        if isinstance(self.slots, bool) or not isinstance(self.slots, int) or self.slots < 1:
            raise ValueError(f"{self.host}: slots must be a positive int, got {self.slots!r}")
        if self.port is not None and not 1 <= self.port <= 65535:
            raise ValueError(f"{self.host}: bad port {self.port!r}")
        if self.user is not None and not _USER_RE.match(self.user):
            raise ValueError(f"{self.host}: bad user {self.user!r}")
        if self.jump is not None and not jump_ok(self.jump):
            raise ValueError(f"{self.host}: bad jump host {self.jump!r}")


# --- hostfile and --hosts ------------------------------------------------------------------


HOST_MAX = 253  # a DNS name's longest; each dot-separated label at most LABEL_MAX
LABEL_MAX = 63


def host_ok(host: str) -> bool:
    """A host name or IPv4 address as ssh and mpirun -H take it, within DNS's lengths."""
    return bool(_HOST_RE.match(host)) and len(host) <= HOST_MAX and all(
        len(label) <= LABEL_MAX for label in host.split("."))


def jump_ok(jump: str) -> bool:
    """One ssh jump host as `ssh -J` takes it: `[user@]host[:port]` (no leading "-", no list)."""
    rest, at, host_port = jump.rpartition("@")
    host, colon, port = host_port.partition(":")
    return ((not at or bool(_USER_RE.match(rest))) and host_ok(host)
            and (not colon or (bool(_INT_RE.match(port)) and len(port) <= 5 and 1 <= int(port) <= 65535)))


def _check_host(token: str, where: str) -> str:
    if host_ok(token):
        return token
    if _HOST_RE.match(token):
        raise LaunchError(f"{where}: bad host {values.shown(token)}: a host name is at most {HOST_MAX} characters, "
                          f"each dot-separated part at most {LABEL_MAX}")
    if "@" in token:
        hint = " (put the user in user=NAME)"
    elif ":" in token:
        hint = " (write slots=N, not HOST:N; IPv6 literals are not supported, use a name)"
    else:
        hint = ""
    raise LaunchError(f"{where}: bad host {values.shown(token)}{hint}")


def _positive_int(value: str, what: str, where: str, *, maximum: int | None = None) -> int:
    # at most 18 digits before int(): Python refuses to convert 4,300 or more (a ValueError)
    if (not _INT_RE.match(value) or len(value) > 18 or int(value) < 1
            or (maximum is not None and int(value) > maximum)):
        limit = f" between 1 and {maximum}" if maximum else " (> 0)"
        raise LaunchError(f"{where}: {what} must be an integer{limit}, got {values.shown(value)}")
    return int(value)


def _parse_hostfile_line(line: str, where: str) -> Node:
    host, *tokens = line.split()
    host = _check_host(host, where)
    fields: dict[str, str] = {}
    for token in tokens:
        key, eq, value = token.partition("=")
        if not eq:
            raise LaunchError(
                f"{where}: unknown token {token!r} (expected KEY=VALUE, KEY one of {', '.join(_HOSTFILE_KEYS)})"
            )
        if key not in _HOSTFILE_KEYS:
            known = ", ".join(_HOSTFILE_KEYS)
            raise LaunchError(f"{where}: unknown key {key!r} in {token!r} (expected one of {known})")
        if key in fields:
            raise LaunchError(f"{where}: {key} given twice")
        if not value:
            raise LaunchError(f"{where}: empty value for {key}")
        fields[key] = value
    user = fields.get("user")
    if user is not None and not _USER_RE.match(user):
        raise LaunchError(f"{where}: bad user {user!r}")
    jump = fields.get("jump")
    if jump is not None and not jump_ok(jump):
        raise LaunchError(f"{where}: bad jump host {values.shown(jump)} (expected [USER@]HOST[:PORT])")
    return Node(
        host=host,
        # Missing slots means 1, as in mpirun and horovodrun hostfiles.
        slots=_positive_int(fields.get("slots", "1"), "slots", where, maximum=MAX_SLOTS),
        port=_positive_int(fields["port"], "port", where, maximum=65535) if "port" in fields else None,
        user=user,
        identity=fields.get("identity"),
        jump=jump,
    )


def parse_hostfile(path: str | Path) -> list[Node]:
    """Read `HOST [slots=N] [port=P] [user=U] [identity=PATH] [jump=[USER@]HOST[:PORT]]` lines
    (jump: reach HOST through that ssh jump host, `ssh -J`); `#` starts a comment.

    slots defaults to 1 (mpirun's rule). Errors name FILE:LINE.
    """
    path = Path(path)
    try:
        text = values.small_text_file(path, "hostfile", "`HOST slots=N` lines")
    except values.BadValue as e:
        raise LaunchError(str(e)) from None
    nodes: list[Node] = []
    first_line: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{lineno}"
        node = _parse_hostfile_line(line, where)
        if node.host in first_line:
            raise LaunchError(f"{where}: duplicate host {node.host!r}, already on line {first_line[node.host]}")
        first_line[node.host] = lineno
        nodes.append(node)
    if not nodes:
        raise LaunchError(f"{path}: no hosts in hostfile")
    return nodes


def parse_hosts_arg(value: str) -> list[Node]:
    """Parse `--hosts h1:4,h2:4` (slots default to 1). Errors name the entry."""
    nodes: list[Node] = []
    first_entry: dict[str, int] = {}
    entries = value.split(",")
    if not value.strip():
        raise LaunchError("--hosts: no hosts given")
    for i, entry in enumerate(entries, start=1):
        entry = entry.strip()
        where = f"--hosts entry {i} ({entry!r})"
        if not entry:
            raise LaunchError(f"--hosts entry {i}: empty (stray comma?) in {value!r}")
        host, colon, slots = entry.partition(":")
        if ":" in slots:
            raise LaunchError(f"{where}: expected HOST or HOST:SLOTS")
        host = _check_host(host, where)
        node = Node(host=host, slots=_positive_int(slots, "slots", where, maximum=MAX_SLOTS) if colon else 1)
        if host in first_entry:
            raise LaunchError(f"--hosts: duplicate host {host!r} (entries {first_entry[host]} and {i})")
        first_entry[host] = i
        nodes.append(node)
    return nodes


def hosts_list(nodes: Sequence[Node]) -> str:
    """`h1:4,h2:4`, the -H form shared by mpirun and horovodrun."""
    return ",".join(f"{n.host}:{n.slots}" for n in nodes)


# --- ssh -----------------------------------------------------------------------------------


def apply_ssh_defaults(
    nodes: Iterable[Node],
    user: str | None = None,
    identity: str | None = None,
    port: int | None = None,
) -> list[Node]:
    """Fill user/identity/port where a node has none; per-node values win."""
    return [
        dataclasses.replace(
            n,
            user=n.user or user,
            identity=n.identity or identity,
            port=n.port if n.port is not None else port,
        )
        for n in nodes
    ]


def ssh_argv(
    node: Node,
    command: Sequence[str],
    *,
    extra_opts: Sequence[str] = (),
    connect_timeout: int = 10,
    strict_host_key_checking: str = "accept-new",
) -> list[str]:
    """`ssh [-p P] [-i ID] [-J JUMP] -o ... [user@]host -- 'quoted command'`.

    Options not set on the node are left out, so ~/.ssh/config (User, Port, ProxyJump,
    IdentityFile) still applies; no -F, no -o that overrides routing. The remote side runs
    the command through the user's shell, hence the single shlex.join'ed argument.
    """
    if not command:
        raise ValueError("ssh_argv: empty command (an interactive login is not what you want here)")
    argv = ["ssh"]
    if node.port is not None:
        argv += ["-p", str(node.port)]
    if node.identity:
        # IdentitiesOnly: offer this key only, not every key in the agent (MaxAuthTries).
        argv += ["-i", node.identity, "-o", "IdentitiesOnly=yes"]
    if node.jump:
        argv += ["-J", node.jump]  # the hostfile's jump=: before extra_opts, so it wins over a ProxyJump there
    argv += [
        "-o", "BatchMode=yes",
        "-o", f"ConnectTimeout={connect_timeout}",
        "-o", f"StrictHostKeyChecking={strict_host_key_checking}",
        *contract.ssh_keepalive_opts(),  # a lost link ends the session (docs/launch.md#a-lost-link-a-full-disk)
    ]  # fmt: skip
    argv += list(extra_opts)
    argv += [f"{node.user}@{node.host}" if node.user else node.host, "--", shlex.join(command)]
    return argv


# --- key exchange ---------------------------------------------------------------------------

# A launch opens one ssh connection per node from this machine. OpenSSH 9.0-9.8 prefer
# sntrup761x25519, whose key generation costs the client ~70 ms of CPU per connection (measured
# here: 8 nodes, 1.9 -> 1.3 CPU-s). mlkem768x25519 (9.9+, post-quantum too) and curve25519
# cost a few ms. Same algorithms, these first; only where ssh config leaves KexAlgorithms alone.
FAST_KEX = ("mlkem768x25519-sha256", "curve25519-sha256", "curve25519-sha256@libssh.org")


def fast_kex_order(default: Sequence[str]) -> list[str]:
    """The client's default KexAlgorithms with the fast ones (FAST_KEX, where present) first."""
    first = [k for k in FAST_KEX if k in default]
    return first + [k for k in default if k not in first]


def _ssh_config_values(argvs: Sequence[Sequence[str]], key: str) -> list[str | None]:
    """Each `ssh -G ...`'s value for key (lower case), None where ssh cannot say; run at once."""
    import subprocess

    procs = []
    for argv in argvs:
        try:
            procs.append(subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
        except OSError:
            procs.append(None)
    values: list[str | None] = []
    for p in procs:
        out = ""
        if p is not None:
            try:
                out = p.communicate(timeout=10)[0]
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
        values.append(next((line.partition(" ")[2].strip() for line in out.splitlines()
                            if line.partition(" ")[0] == key), None))
    return values


def kex_opts(node: Node, extra_opts: Sequence[str] = ()) -> list[str]:
    """`-o KexAlgorithms=...` (fast first) for ssh to node, or [] when the ssh config in effect
    for it (user's, system's, extra_opts) sets KexAlgorithms, or it is already fast first."""
    target = [*(["-p", str(node.port)] if node.port else []), *(["-l", node.user] if node.user else []), node.host]
    default, effective = _ssh_config_values([["ssh", "-G", "-F", "none", *target],
                                             ["ssh", "-G", *extra_opts, *target]], "kexalgorithms")
    if not default or effective != default:
        return []
    order = fast_kex_order(default.split(","))
    return [] if order == default.split(",") else ["-o", "KexAlgorithms=" + ",".join(order)]
