"""The node list: hostfiles, --hosts, EC2 discovery, and the ssh argv that reaches a node.

Everything here is pure except `parse_hostfile` (reads one file), `discover_ec2` (AWS API)
and `kex_opts` (asks the local ssh client, `ssh -G`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


# --- EC2 discovery -------------------------------------------------------------------------

# Fallback GPU counts, used only when DescribeInstanceTypes cannot answer (permission denied,
# or an endpoint/mock without GpuInfo). Real AWS and moto 5 both return GpuInfo.
# g4dn.* = T4, g5.* = A10G, p3.* = V100, p4d/p4de = A100, p5 = H100.
KNOWN_GPU_COUNTS: dict[str, int] = {
    **{f"g4dn.{s}": 1 for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge")},
    "g4dn.12xlarge": 4,
    "g4dn.metal": 8,
    **{f"g5.{s}": 1 for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge")},
    "g5.12xlarge": 4,
    "g5.24xlarge": 4,
    "g5.48xlarge": 8,
    "p3.2xlarge": 1,
    "p3.8xlarge": 4,
    "p3.16xlarge": 8,
    "p3dn.24xlarge": 8,
    "p4d.24xlarge": 8,
    "p4de.24xlarge": 8,
    "p5.48xlarge": 8,
}


def _parse_tag(tag: str) -> tuple[str, str]:
    key, eq, value = tag.partition("=")
    if not eq or not key or not value:
        raise LaunchError(f"--ec2-tag: expected KEY=VALUE, got {tag!r}")
    return key, value


def _gpu_count(type_info: dict[str, Any]) -> int | None:
    """GPUs of one DescribeInstanceTypes entry; None when it carries no GpuInfo."""
    gpus = (type_info.get("GpuInfo") or {}).get("Gpus") or []
    return sum(int(g.get("Count", 0)) for g in gpus) or None


def _slots_by_type(ec2: Any, types: list[str]) -> dict[str, int]:
    """GPUs per instance type: API first, then KNOWN_GPU_COUNTS; CPU types get 1 slot."""
    from botocore.exceptions import ClientError

    found: dict[str, int | None] = {}
    api_error: str | None = None
    try:
        for i in range(0, len(types), 100):  # the API takes at most 100 types per call
            for info in ec2.describe_instance_types(InstanceTypes=types[i : i + 100])["InstanceTypes"]:
                found[info["InstanceType"]] = _gpu_count(info)
    except ClientError as e:
        api_error = f"{e.response['Error'].get('Code')}: {e.response['Error'].get('Message')}"
    slots: dict[str, int] = {}
    for t in types:
        count = found.get(t) or KNOWN_GPU_COUNTS.get(t)
        if count is None and api_error is not None:
            raise LaunchError(
                f"cannot tell how many GPUs a {t} has (DescribeInstanceTypes failed: {api_error}); "
                "pass slots explicitly"
            )
        slots[t] = count or 1  # the API answered and lists no GPU: a CPU type, one process
    return slots


def discover_ec2(
    tag: str,
    region: str | None = None,
    session: Any = None,
    *,
    slots: int | None = None,
) -> list[Node]:
    """Running EC2 instances tagged KEY=VALUE, as Nodes on their private IPs, in IP order.

    slots: per-node override; otherwise the instance type's GPU count (CPU types: 1).
    session: a boto3.Session; None builds a default one, so AWS_PROFILE, AWS_REGION and
    AWS_ENDPOINT_URL apply as boto3 reads them.
    """
    import boto3
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        NoCredentialsError,
        NoRegionError,
        ProfileNotFound,
    )

    key, value = _parse_tag(tag)
    if slots is not None and (isinstance(slots, bool) or slots < 1):
        raise LaunchError(f"slots must be > 0, got {slots!r}")
    try:
        session = session or boto3.Session()
        ec2 = session.client("ec2", region_name=region)
        pages = ec2.get_paginator("describe_instances").paginate(
            Filters=[
                {"Name": f"tag:{key}", "Values": [value]},
                {"Name": "instance-state-name", "Values": ["running"]},
            ]
        )
        instances = [i for page in pages for r in page["Reservations"] for i in r["Instances"]]
        instances = [i for i in instances if i.get("PrivateIpAddress")]
        if not instances:
            raise LaunchError(f"no running EC2 instances tagged {key}={value} in {ec2.meta.region_name}")
        per_type = {} if slots else _slots_by_type(ec2, sorted({i["InstanceType"] for i in instances}))
    except NoCredentialsError:
        raise LaunchError(
            "no AWS credentials found: set AWS_PROFILE (then `aws sso login` if it is an SSO profile), "
            "run `aws configure`, or export AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
        ) from None
    except NoRegionError:
        raise LaunchError("no AWS region: pass a region, or set AWS_REGION or region in your AWS profile") from None
    except ProfileNotFound as e:
        raise LaunchError(f"AWS profile not found: {e}") from None
    except ClientError as e:
        err = e.response.get("Error", {})
        raise LaunchError(f"EC2 {e.operation_name} failed: {err.get('Code')}: {err.get('Message')}") from None
    except BotoCoreError as e:
        raise LaunchError(f"EC2 discovery failed: {e}") from None

    instances.sort(key=lambda i: ipaddress.ip_address(i["PrivateIpAddress"]))
    # `nodes up` tags its instances with their AMI's ssh user (ubuntu, ec2-user)
    return [Node(host=i["PrivateIpAddress"], slots=slots or per_type[i["InstanceType"]],
                 user={t["Key"]: t["Value"] for t in i.get("Tags", [])}.get(contract.SSH_USER_TAG))
            for i in instances]


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


def nodes_from_args(*, hostfile: str | None = None, hosts: str | None = None,
                    ec2_tag: str | None = None, region: str | None = None,
                    slots: int | None = None, ssh_user: str | None = None,
                    ssh_key: str | None = None, ssh_port: int | None = None) -> list[Node]:
    """The node list from exactly one of --hostfile, --hosts, --ec2-tag, with ssh defaults."""
    given = [name for name, v in (("--hostfile", hostfile), ("--hosts", hosts), ("--ec2-tag", ec2_tag)) if v]
    if len(given) != 1:
        raise LaunchError("give exactly one of --hostfile FILE, --hosts h1:4,h2:4, --ec2-tag Key=Value"
                          + (f" (got {', '.join(given)})" if given else ""))
    if hostfile:
        nodes = parse_hostfile(hostfile)
        for key in dict.fromkeys(n.identity for n in nodes if n.identity):  # ssh reads it: a key, not a FIFO
            try:
                values.ssh_key("identity", key)
            except values.BadValue as e:
                raise LaunchError(f"{hostfile}: {e}") from None
    elif hosts:
        nodes = parse_hosts_arg(hosts)
    else:
        nodes = discover_ec2(ec2_tag, region, slots=slots)
    return apply_ssh_defaults(nodes, user=ssh_user, identity=ssh_key, port=ssh_port)


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
