"""The network interface a job uses on each node: read from a node's `ip -j addr`, one name all
nodes share, or (where they name it apart) Open MPI's subnet and each node's own env file.
Pure: values in, values out; bad input raises LaunchError naming the node.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence

from dtrain import contract
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import events

# Docker bridges and container veths carry addresses but never the node's traffic.
_BRIDGE_PREFIXES = ("docker", "br-", "veth")


# A link of `ip -j addr` as dtrain reads it: a node's words, so each field checked (events.py)
_LINK = events.fields_of({"ifname": (events.NAME, events.O), "addr_info": (events.list_of(events.fields_of(
    {"family": (events.NAME, events.O), "local": (events.NAME, events.O),
     "prefixlen": (events.whole(0, 128), events.O)})), events.O)})


def links_of(ip_addr_json: str) -> list[dict]:
    """A node's `ip -j addr` output as its links ({ifname, addr_info: [{family, local}]}), strict
    JSON; a link of other types is left out. ValueError where it is not JSON."""
    data = events.loads(ip_addr_json or "[]")
    out = []
    for link in data if isinstance(data, list) else []:
        try:
            out.append(_LINK(link))
        except ValueError:
            continue
    return out


def _links(ip_addr_json: str, address: str, where: str) -> tuple[list, ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """`ip -j addr` output as its list of links, and address parsed; a LaunchError naming where."""
    try:
        links = links_of(ip_addr_json)
        want = ipaddress.ip_address(address)
    except ValueError as e:
        raise LaunchError(f"{where}cannot read `ip -j addr` output / address {address!r}: {e}") from None
    return links, want


def interface_for_address(ip_addr_json: str, address: str, *, host: str | None = None) -> str:
    """The NIC carrying `address`, from a node's `ip -j addr` output; never lo or a docker bridge."""
    where = f"{host}: " if host else ""
    links, want = _links(ip_addr_json, address, where)
    seen = []
    for link in links:
        name = link.get("ifname", "?")
        for info in link.get("addr_info") or []:
            local = info.get("local")
            seen.append(f"{name}={local}")
            try:
                match = local is not None and ipaddress.ip_address(local) == want
            except ValueError:
                continue
            if match:
                if name == "lo" or name.startswith(_BRIDGE_PREFIXES):
                    raise LaunchError(
                        f"{where}{address} sits on {name}, not a physical NIC; use the node's private address"
                    )
                return name
    raise LaunchError(f"{where}no interface carries {address} (seen: {', '.join(seen) or 'none'})")


def interface_address(ip_addr_json: str, iface: str) -> str:
    """The first IPv4 address of NIC `iface` in a node's `ip -j addr` output ("" where none)."""
    try:
        links = links_of(ip_addr_json)
    except ValueError:
        return ""
    for link in links:
        if link.get("ifname") == iface:
            for info in link.get("addr_info") or []:
                if info.get("family") == "inet" and info.get("local"):
                    return str(info["local"])
    return ""


def check_same_iface(per_node: Mapping[str, str]) -> str:
    """The one NIC name all nodes share (NCCL_SOCKET_IFNAME, btl_tcp_if_include take one)."""
    if not per_node:
        raise ValueError("check_same_iface: no nodes")
    by_iface: dict[str, list[str]] = {}
    for host, iface in per_node.items():
        by_iface.setdefault(iface, []).append(host)
    if len(by_iface) == 1:
        return next(iter(by_iface))
    groups = "; ".join(f"{iface} on {', '.join(hosts)}" for iface, hosts in by_iface.items())
    raise LaunchError(f"nodes disagree on the network interface: {groups} (use one instance type/AMI, or name the NIC)")


# --- nodes whose NICs are named differently ------------------------------------------------

# In every image (templates/Dockerfile.j2 copies launch/node/ to /opt/dtrain/node/): sources
# the node's own env file (node_env_text, written by the launch into the job's key directory,
# mounted at JOB_KEY_MOUNT), then runs the rank's command.
NODE_ENV_WRAPPER = f"{contract.NODE_DIR}/node_env.sh"

NODE_ENV_FILE = "node.env"  # in the job's key directory


def interface_network(ip_addr_json: str, address: str, *, host: str | None = None) -> str:
    """The network (e.g. `10.0.0.0/16`) of the address/prefix `address` holds, from `ip -j addr`."""
    where = f"{host}: " if host else ""
    links, want = _links(ip_addr_json, address, where)
    for link in links:
        for info in link.get("addr_info") or []:
            try:
                iface = ipaddress.ip_interface(f"{info.get('local')}/{info.get('prefixlen')}")
            except ValueError:
                continue
            if iface.ip == want:
                return str(iface.network)
    raise LaunchError(f"{where}no interface carries {address}")


def tcp_include(per_node: Mapping[str, tuple[str, str, str]]) -> str | None:
    """Open MPI's btl/oob_tcp_if_include for nodes given as {host: (iface, address, network)}:
    None when every node names its NIC alike (the name is the value, as before); else the one
    subnet that holds every node's address (Open MPI matches each node's own NIC by it).
    LaunchError when the NICs differ and no node's subnet holds all the others."""
    if not per_node:
        raise ValueError("tcp_include: no nodes")
    if len({iface for iface, _, _ in per_node.values()}) == 1:
        return None
    unknown = [h for h, (_, _, net) in per_node.items() if not net]
    if unknown:
        raise LaunchError(f"{', '.join(unknown)}: no subnet found for the node's address, and NIC names differ "
                          f"({', '.join(sorted({i for i, _, _ in per_node.values()}))}); give the nodes one NIC name")
    nets = sorted({ipaddress.ip_network(net) for _, _, net in per_node.values()},
                  key=lambda n: n.prefixlen)
    addrs = [ipaddress.ip_address(a) for _, a, _ in per_node.values()]
    for net in nets:  # the widest first
        if all(a.version == net.version and a in net for a in addrs):
            return str(net)
    groups = "; ".join(f"{h} {a} on {n} ({i})" for h, (i, a, n) in per_node.items())
    raise LaunchError(f"nodes name their NICs differently and share no subnet: {groups} "
                      "(put the nodes in one subnet, or give them one NIC name)")


def socket_env(iface: str) -> dict[str, str]:
    """NCCL and Gloo (c10d's store and CPU collectives) on the NIC iface."""
    return {"NCCL_SOCKET_IFNAME": iface, "GLOO_SOCKET_IFNAME": iface}


def node_env_text(iface: str, skip: Sequence[str] = ()) -> str:
    """The per-node env file: NCCL and Gloo on this node's own NIC (names in skip are left to
    the user's value)."""
    if not re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", iface):
        raise LaunchError(f"bad interface name {iface!r}")
    return "".join(f"{k}={v}\n" for k, v in socket_env(iface).items() if k not in skip)

