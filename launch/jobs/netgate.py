"""The network gate: a test of seconds between every node's container of a job, on the job's
NIC, that names a node whose link is well below its peers' (`dtrain launch --check-network`,
`dtrain doctor --bandwidth --quick`); and the expectations table it and `doctor --bandwidth`
judge against (network_expectations.yaml, one file for both).

The pairs (plan_pairs): every node sends one TCP stream to a neighbour in a ring (i -> i+1),
then to the next but one (i -> i+2). Each node sends to two different peers and receives from
two different peers, and at no time carries more than one stream each way (a receiver serves
one stream at a time: launch/node/netgate.py). A node whose link is slow one way shows in
both pairs it sends in (or both it receives in); its peers each have a fast pair left. Two
rounds are the fewest that tell "A sends slowly" from "B receives slowly" (one ring round
cannot), and they stay two at any size, unlike every pair (n-1 rounds) or a bisection (log n
rounds of half the cluster against the other half, which names a half, then needs more).
On 3 nodes the two rounds are every ordered pair; 2 nodes are one round, both ways at once
(a slow pair there cannot say which end: only the expectation can judge).

A node's rate (node_rates) is the lower of its best send and its best receive: a healthy
node has a fast pair each way (to a healthy peer), a slow one has none. culprits: a node is
slow when its rate is below PEER_FRACTION of the median of the other nodes' rates (3 nodes
or more), or below EXPECT_FRACTION of what one TCP flow reaches on its instance type
(min(link_gbps, AWS's single-flow limit)), where the table knows the type.

A node named once is measured again (run_gate's confirm): only a node named twice is a
culprit, so a CPU busy for a second on one node does not fail a launch.

Pure functions apart from run_gate, which runs the node program in started containers.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Mapping, Sequence

import yaml

from dtrain import contract
from dtrain.launch.jobs import events
from dtrain.launch.remote.transport import SshTransport

if TYPE_CHECKING:
    from dtrain.launch.jobs.spec import NodeFacts

EXPECTATIONS = Path(__file__).with_name("network_expectations.yaml")
PEER_FRACTION = 0.5  # slow: below half the median of the other nodes
EXPECT_FRACTION = 0.5  # slow: below half of what one flow reaches on the instance type
# "Bandwidth for single-flow traffic is limited to 5 Gbps when instances are not in the same
# cluster placement group" (10 within one): https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-network-bandwidth.html
FLOW_GBPS = 5.0
WARN_FRACTION = 0.75  # doctor --quick: WARN below this share of the peers' median
DEFAULT_SECONDS = 1.0  # each stream; the gate sends two streams per node
Status = Literal["PASS", "WARN", "FAIL"]


# ---------------------------------------------------------------- the expectations table


@dataclass(frozen=True)
class Expectation:
    instance_type: str
    busbw: float | None  # GB/s, nccl-tests' allreduce busbw; None: unknown
    link_gbps: float | None  # Gbit/s, the instance's network bandwidth as AWS lists it
    efa: bool
    source: str

    def flow_gbps(self) -> float | None:
        """What one TCP flow between two such instances reaches at best (Gbit/s)."""
        return None if self.link_gbps is None else min(float(self.link_gbps), FLOW_GBPS)


def load_expectations(path: Path = EXPECTATIONS) -> dict[str, Expectation]:
    data = yaml.safe_load(path.read_text())["instance_types"]
    out = {}
    for itype, d in data.items():
        bus = d.get("busbw")
        if bus != "unknown" and not isinstance(bus, (int, float)):
            raise ValueError(f"{path}: instance_types.{itype}.busbw: a number or 'unknown', got {bus!r}")
        out[itype] = Expectation(itype, None if bus == "unknown" else float(bus), d.get("link_gbps"),
                                 bool(d.get("efa")), d["source"])
    return out


def expectation_for(instance_type: str | None, table: dict[str, Expectation]) -> Expectation | None:
    return table.get(instance_type or "")


# ---------------------------------------------------------------- pairs and verdict (pure)


@dataclass(frozen=True)
class Pair:
    """One stream as its receiver measured it; gbps None: it failed (error says why)."""

    src: str
    dst: str
    gbps: float | None
    error: str = ""


def plan_pairs(hosts: Sequence[str]) -> list[list[tuple[str, str]]]:
    """Rounds of (sender, receiver): the ring i -> i+1, then i -> i+2; 2 nodes: one round, both
    ways; fewer: nothing to measure."""
    n = len(hosts)
    if n < 2:
        return []
    if n == 2:
        return [[(hosts[0], hosts[1]), (hosts[1], hosts[0])]]
    return [[(hosts[i], hosts[(i + k) % n]) for i in range(n)] for k in (1, 2)]


def node_plan(rounds: Sequence[Sequence[tuple[str, str]]], host: str) -> tuple[list[str], int]:
    """What one node's program does: the peers it sends to, in order, and how many it serves."""
    return ([dst for r in rounds for src, dst in r if src == host],
            sum(1 for r in rounds for _, dst in r if dst == host))


def node_rates(results: Sequence[Pair]) -> dict[str, float]:
    """Per node, the lower of its best send and its best receive (Gbit/s; a failed pair is 0)."""
    sent: dict[str, float] = {}
    got: dict[str, float] = {}
    for p in results:
        rate = p.gbps or 0.0
        sent[p.src] = max(sent.get(p.src, 0.0), rate)
        got[p.dst] = max(got.get(p.dst, 0.0), rate)
    return {h: min(sent.get(h, 0.0), got.get(h, 0.0)) for h in dict.fromkeys([*sent, *got])}


def _peers_median(rates: Mapping[str, float], host: str) -> float | None:
    others = [r for h, r in rates.items() if h != host]
    return statistics.median(others) if len(others) >= 2 else None


def culprits(results: Sequence[Pair], expectation: Expectation | None) -> dict[str, str]:
    """{host: why} for every node whose link is well below its peers' (3 nodes or more) or
    below the instance type's expectation; {} when none is."""
    rates = node_rates(results)
    errors = {h: p.error for p in results if p.gbps is None for h in (p.src, p.dst)}
    flow = expectation.flow_gbps() if expectation else None
    out: dict[str, str] = {}
    for host, rate in rates.items():
        why = []
        med = _peers_median(rates, host)
        if med is not None and rate < PEER_FRACTION * med:
            why.append(f"below {PEER_FRACTION:.0%} of its peers' median {gbps(med)}")
        if flow is not None and rate < EXPECT_FRACTION * flow:
            why.append(f"below {EXPECT_FRACTION:.0%} of the {gbps(flow)} one TCP flow reaches on "
                       f"{expectation.instance_type}")
        if why:
            failed = f" (every stream failed: {errors[host]})" if rate == 0 and host in errors else ""
            out[host] = f"{gbps(rate)}, " + " and ".join(why) + failed
    return out


def gbps(x: float) -> str:
    return f"{x:.3g} Gbit/s" if x >= 1 else f"{x * 1000:.3g} Mbit/s"


# A pair's line of the node program: its types and bounds (bytes within 2**62, seconds within ten years).
_MEASURED = events.fields_of({"from": (events.NAME, events.REQUIRED), "to": (events.NAME, events.REQUIRED),
                              "bytes": (events.whole(0, 1 << 62), events.O), "seconds": (events.SECONDS, events.O),
                              "error": (events.TEXT, events.O)})


def parse_output(text: str, host_of: Mapping[str, str]) -> tuple[list[Pair], str, str]:
    """One node's program output -> (the pairs it sent, its instance type, its own error: "" or
    why it could not run, e.g. the port taken). host_of: address -> host (the program speaks
    in addresses)."""
    pairs, itype, error = [], "", ""
    for line in text.splitlines():
        try:
            d = events.loads(line)
        except ValueError:
            continue
        if not isinstance(d, dict):
            continue
        if "instance_type" in d:
            itype = str(d["instance_type"])
        elif "error" in d and "from" not in d:
            error = str(d["error"])
        elif "from" in d and "to" in d:
            try:  # a node's words: a line of other types or out of bounds is left out (events.py)
                measured = _MEASURED(d)
            except ValueError:
                continue
            src, dst = host_of.get(measured["from"], measured["from"]), host_of.get(measured["to"], measured["to"])
            if "error" in measured or not measured.get("seconds") or "bytes" not in measured:
                pairs.append(Pair(src, dst, None, str(measured.get("error", "no bytes counted"))))
            else:
                pairs.append(Pair(src, dst, measured["bytes"] * 8 / measured["seconds"] / 1e9))
    return pairs, itype, error


# ---------------------------------------------------------------- the result


@dataclass(frozen=True)
class GateResult:
    rates: dict[str, float]  # host -> Gbit/s (node_rates)
    culprits: dict[str, str]  # host -> why
    pairs: tuple[Pair, ...] = ()
    names: dict[str, str] = field(default_factory=dict)  # host -> hostname
    expectation: Expectation | None = None
    seconds: float = 0.0  # wall time of the gate

    def name(self, host: str) -> str:
        n = self.names.get(host, "")
        return f"{n} ({host})" if n and n != host else host

    def status(self, host: str) -> Status:
        """doctor --quick's verdict on one node: FAIL a culprit; WARN below WARN_FRACTION of the
        peers' median, or nothing to compare with; else PASS."""
        if host in self.culprits:
            return "FAIL"
        med = _peers_median(self.rates, host)
        if med is None and (self.expectation is None or self.expectation.flow_gbps() is None):
            return "WARN"
        return "WARN" if med is not None and self.rates.get(host, 0) < WARN_FRACTION * med else "PASS"

    def summary(self) -> str:
        """One line: how many nodes, the lowest and median rate, how long it took."""
        r = sorted(self.rates.values())
        if not r:
            return f"network gate: nothing to measure on {len(self.names) or 1} node ({self.seconds:.1f} s)"
        return (f"network gate: {len(r)} node(s), rate min {gbps(r[0])}, median "
                f"{gbps(statistics.median(r))} ({self.seconds:.1f} s)")

    def failure(self) -> str:
        """One line naming the culprits, measured against expected (for a failed launch)."""
        return ("network gate: slow link on " + "; ".join(f"{self.name(h)}: {why}" for h, why in self.culprits.items())
                + " (docs/troubleshooting.md#slow-link)")

    def to_json(self) -> dict:
        """What the job's record keeps of the gate (dtrain report): per node (by host) its
        rate, verdict and why; every pair measured; the wall time."""
        return {"seconds": round(self.seconds, 3),
                "nodes": {h: {"name": self.names.get(h, ""), "gbps": round(rate, 3), "status": self.status(h),
                              "why": self.culprits.get(h, "")} for h, rate in self.rates.items()},
                "pairs": [{"src": p.src, "dst": p.dst, "gbps": p.gbps, "error": p.error} for p in self.pairs]}

    def table(self) -> list[str]:
        """Lines to print: per node its best send and receive, its rate and verdict."""
        best_out: dict[str, float] = {}
        best_in: dict[str, float] = {}
        for p in self.pairs:
            best_out[p.src] = max(best_out.get(p.src, 0.0), p.gbps or 0.0)
            best_in[p.dst] = max(best_in.get(p.dst, 0.0), p.gbps or 0.0)
        rows = [("node", "send", "receive", "rate", "status", "detail")]
        for h, rate in self.rates.items():
            rows.append((self.name(h), gbps(best_out.get(h, 0.0)), gbps(best_in.get(h, 0.0)), gbps(rate),
                         self.status(h), self.culprits.get(h, "")))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


# ---------------------------------------------------------------- running it


def gate_argv(container: str, me: str, peers: Sequence[str], serve: int, seconds: float, timeout: float,
              port: int = contract.NETGATE_PORT) -> list[str]:
    """`docker exec` of launch/node/netgate.py in the job's container on one node."""
    return ["docker", "exec", container, "python3", "-c", contract.node_script("netgate.py"),
            "--me", me, "--port", str(port), "--seconds", f"{seconds:g}", "--serve", str(serve),
            "--timeout", f"{timeout:g}", *[a for p in peers for a in ("--to", p)]]


def gate_address(f: "NodeFacts") -> str:
    """Where a node's peers reach it on the job's NIC: the address of --iface's NIC where the
    launch was told one, else the node's own address (its NIC is the job's)."""
    return f.iface_address or f.address


def confirmed(first: GateResult, second: GateResult) -> GateResult:
    """Two runs of the gate as one: a culprit is a node both named (a slow link stays slow; a
    node whose CPU was busy for a second does not), with the second run's figures."""
    keep = {h: why for h, why in second.culprits.items() if h in first.culprits}
    return replace(second, culprits=keep, seconds=first.seconds + second.seconds)


def run_gate(ssh: SshTransport, facts: Sequence["NodeFacts"], container: str,
             seconds: float = DEFAULT_SECONDS, *, expectations: dict[str, Expectation] | None = None,
             instance_type: str | None = None, confirm: bool = True) -> GateResult:
    """The gate on started containers (host network; `container` on every node): every node's
    program at once, then the verdict. instance_type: the type to judge against (default: the
    one most nodes report). confirm: where a node is named, measure again and name only the
    nodes named twice (a clean run costs one measurement)."""
    table = expectations if expectations is not None else load_expectations()
    first = _measure(ssh, facts, container, seconds, table, instance_type)
    if not confirm or not first.culprits:
        return first
    return confirmed(first, _measure(ssh, facts, container, seconds, table, instance_type))


def _measure(ssh: SshTransport, facts: Sequence["NodeFacts"], container: str, seconds: float,
             table: dict[str, Expectation], instance_type: str | None) -> GateResult:
    t0 = time.monotonic()
    hosts = [f.node.host for f in facts]
    addr = {f.node.host: gate_address(f) for f in facts}
    host_of = {a: h for h, a in addr.items()}
    rounds = plan_pairs(hosts)
    timeout = len(rounds) * (seconds + 5) + 10
    argv = {}
    for h in hosts:
        peers, serve = node_plan(rounds, h)
        argv[h] = gate_argv(container, addr[h], [addr[p] for p in peers], serve, seconds, timeout)
    results = ssh.run([f.node for f in facts], lambda n: argv[n.host], timeout=timeout + 30) if rounds else []
    pairs: list[Pair] = []
    types: list[str] = []
    for h, r in zip(hosts, results):
        got, itype, error = parse_output(r.stdout, host_of)
        sent = {p.dst for p in got}
        pairs += got
        why = error or r.error or "no answer"
        pairs += [Pair(h, p, None, why) for p in node_plan(rounds, h)[0] if p not in sent]
        if itype:
            types.append(itype)
    itype = instance_type or (max(set(types), key=types.count) if types else None)
    expect = expectation_for(itype, table)
    return GateResult(node_rates(pairs), culprits(pairs, expect), tuple(pairs),
                      {f.node.host: f.hostname for f in facts}, expect, time.monotonic() - t0)
