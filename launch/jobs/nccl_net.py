"""The network NCCL really uses, read from its own INIT/NET lines, and whether it is the one the
node should use (issue 51). Pure: lines in, a typed result out; standard library only (the
supervisor imports it in the container: launch/node/supervise.py `check_nccl`, and `dtrain
diagnose` reads a log with it).

How the lines are had: for a GPU job the launcher gives every rank NCCL_DEBUG=INFO,
NCCL_DEBUG_SUBSYS=INIT,NET and NCCL_DEBUG_FILE=<job dir>/nccl.%h.%p (`debug_env`), so NCCL
writes them to one file per rank in the node's job directory, not into the job's output; the
supervisor reads those files on every node once a rank says which network it uses
(launch/node/nccl_net.sh), and `verdict` compares NCCL's choice with what the node has: its
instance type's EFA interfaces (`Expect.efa`, the launcher's table: launch/infra/instance_types.py
`efa_count`) and the EFA devices the container sees.

The lines, as NCCL and aws-ofi-nccl print them (sources in tests/test_nccl_net.py):

    NCCL INFO NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: ... using internal implementation
    NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.
    NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v10)
    NCCL INFO NET/OFI Using aws-ofi-nccl 1.4.0aws
    NCCL INFO NET/OFI Selected Provider is efa (found 4 nics)      (newer: "..., fabric is efa-direct (found 4 nics)")
    NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>
    NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.0.0.1<0>
    NCCL INFO Using network AWS Libfabric | Libfabric | Socket | IB
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

# The modes of --nccl-check; "auto" (the launcher's default on GPU nodes of a job across nodes):
# fail where the node should use EFA, else warn.
MODES = ("warn", "fail", "off")
# The variables the check sets for every rank; where the user sets one of the first two
# (--env, --env-file), the check is off: NCCL's output is theirs.
USER_VARS = ("NCCL_DEBUG", "NCCL_DEBUG_FILE")
FILE_PREFIX = "nccl."
# How long the supervisor waits for a rank's "Using network" line after the ranks start: NCCL
# makes its communicators at the first collective (or init_process_group with device_id), after
# the job has loaded its model and data.
WAIT_S = 900
# The variables of a rank that steer the network, read from its environment on the node
# (nccl_net.sh): names only are chosen here, none of them a secret.
RANK_VARS = ("FI_PROVIDER", "FI_EFA_IFACE", "NCCL_NET", "NCCL_NET_PLUGIN", "NCCL_IB_DISABLE")


def debug_env(job_dir: str) -> tuple[tuple[str, str], ...]:
    """What every rank gets so that NCCL writes its INIT and NET lines to one file per process
    (%h: its hostname, %p: its pid) in the node's job directory, not into the job's output."""
    return (("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "INIT,NET"),
            ("NCCL_DEBUG_FILE", f"{job_dir}/{FILE_PREFIX}%h.%p"))


def mode(flag: str | None, gpus: bool, user_vars: Iterable[str], nodes: int = 2) -> tuple[str, str]:
    """(the supervisor's mode: "auto", "warn", "fail" or "off"; why it is off, or ""). flag:
    --nccl-check (None: not given); gpus: the nodes have GPUs; user_vars: the job's --env names;
    nodes: how many run ranks (on one, NCCL's network carries nothing: auto only warns)."""
    if flag == "off":
        return "off", ""
    if not gpus:
        return "off", "" if flag is None else "no GPU on the nodes: NCCL does not run"
    mine = sorted(set(user_vars) & set(USER_VARS))
    if mine:
        return "off", f"{', '.join(mine)} set by --env: NCCL's output is the job's own"
    return flag or ("auto" if nodes > 1 else "warn"), ""


# ---------------------------------------------------------------- the lines

_INFO = re.compile(r"NCCL INFO (.*)$")
_USING = re.compile(r"(?:Using network|Initialized NET plugin) (\S.*?)\s*$")
_SELECTED = re.compile(r"NET/OFI Selected [Pp]rovider is ([\w;+-]+)(?:, fabric is [\w;+-]+)?(?: \(found (\d+) nics?\))?")
_NDEV = re.compile(r"NET/OFI Forcing AWS OFI ndev (\d+)")  # aws-ofi-nccl before "(found N nics)"
_OFI_VERSION = re.compile(r"NET/OFI (?:Using|Initializing) aws-ofi-nccl (\S+)")
_PLATFORM = re.compile(r"NET/OFI Running on (\S+?) platform")
_LOADED = re.compile(r"NET/Plugin ?: ?Loaded (?:net|coll|collnet)? ?plugin (.+?)(?: \(v\d+\))?\.?$")
_NO_PLUGIN = re.compile(r"NET/Plugin ?: ?(?:dlerror=|Plugin load (?:\(\S+\) )?returned \d+ ?: ?|No plugin found|"
                        r"Could not find: )")
_LIB = re.compile(r"(lib[\w.-]*net[\w.-]*\.so)")
_SOCKET_IFS = re.compile(r"NET/Socket ?: Using ((?:\[\d+\]\S+ ?)+)")
_IB_IFS = re.compile(r"NET/IB ?: Using ((?:\[\d+\]\S+ ?)+)")
_OFI_FAILED = re.compile(r"NET/OFI (No eligible providers were found|aws-ofi-nccl initialization failed|"
                         r"Couldn't find any optimal provider|Could not find any optimal provider|"
                         r"OFI fi_getinfo\(\) call failed.*?)\s*$")


@dataclass(frozen=True)
class NcclNet:
    """What one process's NCCL said about its network."""

    network: str = ""  # OFI (aws-ofi-nccl, libfabric), IB (NCCL's verbs), Socket (TCP); "": not said yet
    name: str = ""  # as NCCL names it: "AWS Libfabric", "Libfabric", "IB", "Socket"
    provider: str = ""  # OFI: libfabric's provider (efa, tcp, sockets, "tcp;ofi_rxm")
    nics: int | None = None  # OFI: the devices it found; IB, Socket: the interfaces listed
    interfaces: tuple[str, ...] = ()  # Socket: eth0; IB: mlx5_0:1/IB
    plugin: str = ""  # the external net plugin ("aws-ofi-nccl", the loaded one's name), "internal" where none loaded
    version: str = ""  # aws-ofi-nccl's version
    missing: str = ""  # the plugin library NCCL did not find ("libnccl-net.so")
    ofi_error: str = ""  # why aws-ofi-nccl gave up ("No eligible providers were found")
    platform: str = ""  # aws-ofi-nccl's "Running on p4d.24xlarge platform"

    def said(self) -> str:
        """One phrase: what NCCL chose."""
        if self.network == "OFI":
            nics = f", {self.nics} NIC(s)" if self.nics is not None else ""
            ver = f" {self.version}" if self.version else ""
            return f"OFI (aws-ofi-nccl{ver}) provider {self.provider or '?'}{nics}"
        ifs = f" on {' '.join(self.interfaces)}" if self.interfaces else ""
        why = ""
        if self.missing:
            why = f" ({self.missing} not found: no net plugin)"
        elif self.ofi_error:
            why = f" (aws-ofi-nccl: {self.ofi_error})"
        return f"{self.network or 'no network said yet'}{ifs}{why}"


def _network(name: str) -> str:
    low = name.lower()
    if "libfabric" in low or "ofi" in low:
        return "OFI"
    if low.startswith("ib"):
        return "IB"
    if low.startswith("socket"):
        return "Socket"
    return name


def _message(line: str) -> str:
    """The text after `NCCL INFO ` (NCCL's own prefix: host:pid:tid [dev]), or the line."""
    m = _INFO.search(line)
    return m.group(1) if m else line.strip()


def parse(lines: Iterable[str]) -> NcclNet:
    """One process's lines (a rank's NCCL_DEBUG_FILE, or a log of one rank) -> what it chose.
    The last word wins where a line repeats (a second communicator says it again)."""
    n = NcclNet()
    for raw in lines:
        if "NET" not in raw and "network" not in raw:
            continue
        s = _message(raw)
        if s.startswith("NET/OFI") and n.plugin in ("", "internal"):  # aws-ofi-nccl speaks: it is loaded
            n = replace(n, plugin="aws-ofi-nccl")
        if m := _USING.search(s):
            n = replace(n, name=m.group(1), network=_network(m.group(1)))
        elif m := _SELECTED.search(s):
            n = replace(n, provider=m.group(1), nics=int(m.group(2)) if m.group(2) else n.nics,
                        plugin=n.plugin if n.plugin not in ("", "internal") else "aws-ofi-nccl")
        elif m := _NDEV.search(s):
            n = replace(n, nics=int(m.group(1)) if n.nics is None else n.nics)
        elif m := _OFI_VERSION.search(s):
            n = replace(n, version=m.group(1), plugin="aws-ofi-nccl")
        elif m := _PLATFORM.search(s):
            n = replace(n, platform=m.group(1))
        elif m := _LOADED.search(s):
            n = replace(n, plugin=n.plugin if n.plugin == "aws-ofi-nccl" else m.group(1))
        elif _NO_PLUGIN.search(s):
            lib = _LIB.search(s)
            n = replace(n, missing=lib.group(1) if lib else "libnccl-net.so", plugin=n.plugin or "internal")
        elif "Using internal" in s and "NET/Plugin" in s:
            n = replace(n, plugin=n.plugin or "internal")
        elif m := _SOCKET_IFS.search(s):
            ifs = tuple(re.findall(r"\[\d+\]([^:\s]+)", m.group(1)))
            n = replace(n, interfaces=ifs)
        elif m := _IB_IFS.search(s):
            n = replace(n, interfaces=tuple(re.findall(r"\[\d+\](\S+)", m.group(1))))
        elif m := _OFI_FAILED.search(s):
            n = replace(n, ofi_error=m.group(1))
    if n.network in ("Socket", "IB") and n.interfaces:
        n = replace(n, nics=len(n.interfaces))
    if n.network == "OFI" and not n.plugin:
        n = replace(n, plugin="aws-ofi-nccl")
    return n


def split_files(text: str) -> dict[str, list[str]]:
    """launch/node/nccl_net.sh's output -> {"": its key=value lines, FILE: that file's lines}."""
    out: dict[str, list[str]] = {"": []}
    current = ""
    for line in text.splitlines():
        if line.startswith("file="):
            current = line[5:]
            out.setdefault(current, [])
        else:
            out[current].append(line)
    return out


# ---------------------------------------------------------------- the verdict


@dataclass(frozen=True)
class Expect:
    """What a node has, as the check sees it in the container."""

    instance_type: str = ""  # DMI's product name ("" off EC2)
    efa: int = 0  # EFA interfaces the instance type takes (0: none, or an unknown type)
    devices: int = 0  # /dev/infiniband/uverbs* in the container (dtrain passes every one the node has; -1: unknown)
    memlock: str = ""  # `ulimit -l` in the container ("unlimited" where it is)
    env: tuple[tuple[str, str], ...] = ()  # RANK_VARS a rank has, (name, value)

    @property
    def want(self) -> int:
        """EFA interfaces NCCL should use: the type's, or the devices the node has where more."""
        return max(self.efa, self.devices)

    def text(self) -> str:
        where = f" ({self.instance_type})" if self.instance_type else ""
        if not self.want:
            return f"no EFA{where}, any network"
        return f"EFA x{self.want}{where}"


@dataclass(frozen=True)
class Verdict:
    ok: bool
    chose: str  # what NCCL chose (NcclNet.said)
    expected: str  # Expect.text
    cause: str = ""  # the checklist entry (docs/troubleshooting.md#ID)
    why: str = ""  # the likely cause, one phrase
    fix: str = ""


EFA_VARIANT = ("use a dtrain GPU image (aws-ofi-nccl in /opt/aws-ofi-nccl/lib, on LD_LIBRARY_PATH), or put "
               "the plugin's libnccl-net.so on LD_LIBRARY_PATH of the image")


def _why_no_efa(e: Expect) -> tuple[str, str, str]:
    """Why libfabric's EFA provider did not come up on a node that should have it: (cause id,
    why, fix), from what the container shows, the likeliest first."""
    env = dict(e.env)
    if env.get("FI_PROVIDER", "efa") not in ("efa", ""):
        return ("efa-not-selected", f"FI_PROVIDER={env['FI_PROVIDER']} is set for the ranks",
                "leave FI_PROVIDER unset or set it to efa (--env)")
    if not e.devices:
        return ("efa-unused", "the container has no /dev/infiniband/uverbs* device (none passed: the node has none)",
                "attach the type's EFA interfaces at instance launch (dtrain nodes up does) and load the efa "
                "driver (the EFA installer), then check `ls /dev/infiniband` on the node")
    if e.memlock and e.memlock != "unlimited":
        return ("memlock", f"memlock is {e.memlock} KiB in the container; EFA needs unlimited",
                "let dockerd lift it: LimitMEMLOCK=infinity in its systemd unit")
    return ("efa-not-selected", "libfabric's efa provider did not come up in the container",
            "run `dtrain doctor --image IMAGE` (check efa: fi_info -p efa in the container); allow all traffic "
            "within the security group")


def verdict(net: NcclNet, e: Expect) -> Verdict:
    """NCCL's choice on a node against what the node has: OK, or the mismatch with its likely
    cause and fix. A node that should use no EFA takes any network."""
    chose, expected = net.said(), e.text()
    want = e.want
    if not net.network or not want:
        return Verdict(True, chose, expected)
    if net.network == "OFI" and net.provider.split(";")[0] == "efa":
        if net.nics is not None and net.nics < want:
            if e.devices < 0:  # a log: what the container had is not known
                return Verdict(False, chose, expected, "efa-fewer",
                               f"NCCL found {net.nics} of the {e.efa} EFA interfaces {e.instance_type or 'the type'} has",
                               "launch the instances with one EFA interface per network card (dtrain nodes up does) "
                               "and pass every /dev/infiniband/uverbs* device to the container (dtrain launch does)")
            if e.devices < e.efa:
                return Verdict(False, chose, expected, "efa-fewer",
                               f"the node has {e.devices} of the {e.efa} EFA devices its type takes",
                               "launch the instances with one EFA interface per network card (dtrain nodes up does)")
            return Verdict(False, chose, expected, "efa-fewer",
                           f"NCCL found {net.nics} of the {e.devices} EFA devices in the container",
                           "leave FI_EFA_IFACE unset (it narrows libfabric's devices)"
                           if dict(e.env).get("FI_EFA_IFACE") else
                           "run `dtrain doctor --image IMAGE` (fi_info -p efa in the container)")
        return Verdict(True, chose, expected)
    if net.network == "OFI":
        cause, why, fix = _why_no_efa(e)
        return Verdict(False, chose, expected, cause if cause != "efa-unused" else "efa-not-selected", why, fix)
    if net.network == "IB":
        return Verdict(False, chose, expected, "efa-unused",
                       "NCCL's own IB transport, not aws-ofi-nccl: the EFA plugin is not in the image", EFA_VARIANT)
    # Socket (or anything else): the plugin is missing or gave up
    if net.missing or net.plugin in ("", "internal"):
        return Verdict(False, chose, expected, "efa-unused",
                       f"no net plugin in the image ({net.missing or 'libnccl-net.so'} not found): an image "
                       "without aws-ofi-nccl on an EFA type", EFA_VARIANT)
    cause, why, fix = _why_no_efa(e)
    return Verdict(False, chose, expected, cause, f"aws-ofi-nccl gave up ({net.ofi_error or 'no provider'}): {why}", fix)


def expect_of(info: Sequence[str], efa_types: dict[str, int]) -> Expect:
    """nccl_net.sh's key=value lines (itype, uverbs, memlock, env NAME=VALUE) -> Expect, the
    type's EFA count from efa_types ({instance type: EFA interfaces}: the launcher's table)."""
    kv: dict[str, str] = {}
    env: list[tuple[str, str]] = []
    for line in info:
        if line.startswith("env "):
            name, _, value = line[4:].partition("=")
            if name in RANK_VARS:
                env.append((name, value))
            continue
        k, sep, v = line.partition("=")
        if sep:
            kv[k] = v.strip()
    itype = kv.get("itype", "")
    devices = kv.get("uverbs", "0")
    return Expect(itype, int(efa_types.get(itype, 0)), int(devices) if devices.isdigit() else 0,
                  kv.get("memlock", ""), tuple(dict(env).items()))


def judge_node(text: str, efa_types: dict[str, int]) -> tuple[Verdict, Expect, int]:
    """A node's nccl_net.sh output -> (the verdict of its worst rank, what the node has, the
    ranks whose NCCL said its network). Where no rank said one: an OK verdict whose chose is
    "no network said yet"."""
    parts = split_files(text)
    e = expect_of(parts.pop(""), efa_types)
    nets = [parse(lines) for lines in parts.values()]
    said = [n for n in nets if n.network]
    verdicts = [verdict(n, e) for n in said] or [verdict(NcclNet(), e)]
    return next((v for v in verdicts if not v.ok), verdicts[0]), e, len(said)


def line(node: str, v: Verdict) -> str:
    """One line for a user: the node, what NCCL chose, what was expected, the cause and the fix."""
    if v.ok:
        return f"NCCL network on {node}: {v.chose}; expected {v.expected}: OK"
    return (f"NCCL network mismatch on {node} ({v.cause}): {v.chose}; expected {v.expected}; "
            f"likely {v.why}; fix: {v.fix} (docs/troubleshooting.md#{v.cause})")


def fails(check: str, v: Verdict, e: Expect) -> bool:
    """Whether a mismatch ends the launch: --nccl-check fail, or auto where the node should use EFA."""
    return not v.ok and (check == "fail" or (check == "auto" and e.want > 0))


# ---------------------------------------------------------------- the event


def event_fields(check: str, said: dict[str, str], efa_types: dict[str, int]) -> tuple[dict, list[str]]:
    """Every node's nccl_net.sh output ({hostname: text}, in rank order) -> (the `nccl-net`
    event's fields: check, nodes {host: {ok, chose, expected, ranks[, cause, why, fix]}}, fails;
    the nodes whose mismatch ends the job)."""
    nodes: dict[str, dict] = {}
    bad: list[str] = []
    for host, text in said.items():
        v, e, ranks = judge_node(text, efa_types)
        nodes[host] = {"ok": v.ok, "chose": v.chose, "expected": v.expected, "ranks": ranks}
        if not v.ok:
            nodes[host].update(cause=v.cause, why=v.why, fix=v.fix)
        if fails(check, v, e):
            bad.append(host)
    return {"check": check, "nodes": nodes, "fails": bad}, bad


def warnings(said: dict[str, str], most: int = 20) -> list[str]:
    """NCCL's WARN lines among the nodes' reports ({hostname: text}), each once, as
    `[hostname] line`: with NCCL_DEBUG_FILE NCCL writes them to its file, not the job's output,
    so the supervisor puts them back in the log (dtrain diagnose reads them there)."""
    out: list[str] = []
    for host, text in said.items():
        for ln in text.splitlines():
            if " NCCL WARN " in ln and f"[{host}] {ln}" not in out:
                out.append(f"[{host}] {ln}")
    return out[:most]


def _verdict_of(d: dict) -> Verdict:
    return Verdict(bool(d.get("ok")), str(d.get("chose", "?")), str(d.get("expected", "?")), str(d.get("cause", "")),
                   str(d.get("why", "")), str(d.get("fix", "")))


def event_line(ev: dict) -> str:
    """The `nccl-net` event as one line: the first mismatch in full (the others named), or what
    every node chose."""
    nodes = ev.get("nodes") or {}
    if not isinstance(nodes, dict):
        return "NCCL network: unreadable event"
    wrong = [h for h, d in nodes.items() if isinstance(d, dict) and not d.get("ok")]
    if wrong:
        more = f"; also on {', '.join(wrong[1:])}" if wrong[1:] else ""
        ends = ("" if set(wrong) & set(ev.get("fails") or ()) else
                f" (--nccl-check {ev.get('check')}: the job goes on)")
        return line(wrong[0], _verdict_of(nodes[wrong[0]])) + more + ends
    read = {h: d for h, d in nodes.items() if isinstance(d, dict) and d.get("ranks")}
    if not read:
        return (f"NCCL network not checked: no rank said which network it uses within {WAIT_S} s "
                "(no NCCL communicator yet, or an image without NCCL)")
    by: dict[tuple[str, str], list[str]] = {}
    for h, d in read.items():
        by.setdefault((str(d.get("chose")), str(d.get("expected"))), []).append(h)
    silent = [h for h in nodes if h not in read]
    return "; ".join(f"NCCL network on {', '.join(hs)}: {chose}; expected {exp}: OK" for (chose, exp), hs in by.items()) + (
        f"; no word from {', '.join(silent)}" if silent else "")


def summary(fields: dict) -> str:
    """What state.json keeps (dtrain status): OK, or the nodes with a mismatch and why."""
    nodes = fields.get("nodes") or {}
    wrong = {h: d for h, d in nodes.items() if not d.get("ok")}
    if wrong:
        return "; ".join(f"{h}: {d.get('chose')} ({d.get('cause')})" for h, d in wrong.items())
    return "OK" if any(d.get("ranks") for d in nodes.values()) else "not checked"


def failure(fields: dict, bad: Sequence[str]) -> str:
    """The reason of the job's `failed` event where the check ends it."""
    d = (fields.get("nodes") or {}).get(bad[0], {})
    return (f"NCCL network mismatch on {', '.join(bad)} ({d.get('cause')}): {d.get('chose')}, expected "
            f"{d.get('expected')}; --nccl-check warn only warns")
