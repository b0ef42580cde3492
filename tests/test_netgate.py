"""The network gate (launch/jobs/netgate.py): the pairs, the verdict, the node program on
loopback addresses (real sockets, no cluster). The launch that fails on a throttled node is in
tests/test_netgate_cluster.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dtrain import contract
from dtrain.launch.jobs import netgate as ng

HOSTS = ["h1", "h2", "h3", "h4"]
FAST, SLOW = 2.0, 0.05


def _measure(hosts, slow_out=(), slow_in=()):
    """Pairs as the plan sends them, each as fast as its slower end allows."""
    return [ng.Pair(s, d, SLOW if s in slow_out or d in slow_in else FAST)
            for rnd in ng.plan_pairs(hosts) for s, d in rnd]


def test_two_rounds_each_node_sends_to_and_receives_from_two_peers():
    rounds = ng.plan_pairs(HOSTS)
    assert len(rounds) == 2
    for rnd in rounds:  # in a round every node sends once and receives once
        assert sorted(s for s, _ in rnd) == HOSTS and sorted(d for _, d in rnd) == HOSTS
    for h in HOSTS:
        peers, serve = ng.node_plan(rounds, h)
        assert len(set(peers)) == 2 and h not in peers and serve == 2
    three = ng.plan_pairs(HOSTS[:3])  # every ordered pair
    assert sorted(p for r in three for p in r) == sorted((a, b) for a in HOSTS[:3] for b in HOSTS[:3] if a != b)
    assert ng.plan_pairs(["a", "b"]) == [[("a", "b"), ("b", "a")]]
    assert ng.plan_pairs(["a"]) == [] and ng.plan_pairs([]) == []


@pytest.mark.parametrize("n", [3, 4, 6, 9])
@pytest.mark.parametrize("way", ["out", "in", "both"])
def test_a_slow_node_is_named_alone_whichever_way_its_link_is_slow(n, way):
    hosts = [f"h{i}" for i in range(n)]
    for bad in hosts:
        pairs = _measure(hosts, slow_out=[bad] if way in ("out", "both") else [],
                         slow_in=[bad] if way in ("in", "both") else [])
        found = ng.culprits(pairs, None)
        assert list(found) == [bad], (bad, found)
        assert "50 Mbit/s" in found[bad] and "peers' median 2 Gbit/s" in found[bad]


def test_healthy_nodes_pass_and_two_nodes_need_the_expectation():
    assert ng.culprits(_measure(HOSTS), None) == {}
    # 2 nodes: a slow pair cannot say which end, and without an expectation nothing is named
    assert ng.culprits(_measure(["a", "b"], slow_out=["b"]), None) == {}
    table = ng.load_expectations()
    p4d = table["p4d.24xlarge"]
    assert p4d.flow_gbps() == ng.FLOW_GBPS  # 400 Gbit/s link, one TCP flow reaches 5
    both = ng.culprits(_measure(["a", "b"], slow_out=["b"]), p4d)
    assert set(both) == {"a", "b"} and "one TCP flow reaches on p4d.24xlarge" in both["a"]
    # every node below the type's expectation: all named, though none is below its peers
    slow_all = [ng.Pair(p.src, p.dst, 1.0) for p in _measure(HOSTS)]
    assert set(ng.culprits(slow_all, p4d)) == set(HOSTS)
    assert ng.culprits(slow_all, None) == {}


def test_a_node_whose_streams_fail_is_named_with_the_error():
    pairs = [p if "h2" not in (p.src, p.dst) else ng.Pair(p.src, p.dst, None, "connect: Connection refused")
             for p in _measure(HOSTS)]
    found = ng.culprits(pairs, None)
    assert list(found) == ["h2"] and "Connection refused" in found["h2"]


def test_result_lines_and_statuses():
    pairs = _measure(HOSTS[:3], slow_out=["h3"])
    r = ng.GateResult(ng.node_rates(pairs), ng.culprits(pairs, None), tuple(pairs),
                      {"h1": "node-1", "h2": "node-2", "h3": "node-3"}, None, 2.5)
    assert [r.status(h) for h in HOSTS[:3]] == ["PASS", "PASS", "FAIL"]
    assert r.summary() == "network gate: 3 node(s), rate min 50 Mbit/s, median 2 Gbit/s (2.5 s)"
    assert r.failure().startswith("network gate: slow link on node-3 (h3): 50 Mbit/s, below 50%")
    lines = r.table()
    assert lines[0].split() == ["node", "send", "receive", "rate", "status", "detail"]
    assert "node-3 (h3)" in lines[3] and "FAIL" in lines[3]
    two = ng.GateResult({"a": 1.0, "b": 1.0}, {}, ())
    assert two.status("a") == "WARN"  # nothing to compare with


def test_parse_output_maps_addresses_to_hosts():
    text = ('{"from": "10.0.0.1", "to": "10.0.0.2", "bytes": 125000000, "seconds": 1.0}\n'
            '{"from": "10.0.0.1", "to": "10.0.0.3", "error": "connect: No route to host"}\n'
            'noise\n{"instance_type": "p4d.24xlarge"}\n')
    pairs, itype, error = ng.parse_output(text, {"10.0.0.1": "n1", "10.0.0.2": "n2"})
    assert pairs == [ng.Pair("n1", "n2", 1.0), ng.Pair("n1", "10.0.0.3", None, "connect: No route to host")]
    assert itype == "p4d.24xlarge" and error == ""
    assert ng.parse_output('{"error": "cannot listen on 10.0.0.1:2023: Address already in use"}', {})[2]


def test_the_node_program_measures_real_streams_on_loopback():
    """launch/node/netgate.py as the gate runs it, three 'nodes' on 127.0.0.x addresses."""
    hosts = ["127.0.0.21", "127.0.0.22", "127.0.0.23"]
    rounds = ng.plan_pairs(hosts)
    procs = {}
    for h in hosts:
        peers, serve = ng.node_plan(rounds, h)
        argv = ng.gate_argv("c", h, peers, serve, 0.3, 20, port=contract.NETGATE_PORT + 20000)
        assert argv[:5] == ["docker", "exec", "c", "python3", "-c"]
        procs[h] = subprocess.Popen([sys.executable, *argv[4:]], stdout=subprocess.PIPE, text=True)
    pairs = []
    for h, p in procs.items():
        out, _ = p.communicate(timeout=30)
        assert p.returncode == 0, out
        pairs += ng.parse_output(out, {})[0]
    assert len(pairs) == 6 and all(p.gbps and p.gbps > 0.1 for p in pairs), pairs
    assert ng.culprits(pairs, None) == {}


def test_link_rate_flag_every_node_and_one_node():
    from dtrain import values

    assert values.link_rates("--link-rate", None, 3) == (None, {})
    assert values.link_rates("--link-rate", ["1gbit"], 3) == (10**9, {})
    assert values.link_rates("--link-rate", ["1gbit,3=100mbit", "2=2.5mbit"], 3) == (
        10**9, {3: 10**8, 2: 2_500_000})
    assert values.link_rates("--link-rate", ["3=50mbit"], 4) == (None, {3: 50 * 10**6})
    for bad, says in (("4=1gbit", "a node from 1 to 3"), ("0=1gbit", "a node from 1 to 3"),
                      ("x=1gbit", "INDEX=RATE"), ("3=fast", "'3=fast': expected INDEX=RATE"),
                      ("1gb", "a rate such as 1gbit"), ("9" * 30 + "gbit", "a rate such as"), ("", "a rate")):
        with pytest.raises(values.BadValue, match=says):
            values.link_rates("--link-rate", [bad], 3)


def test_a_culprit_must_be_named_twice():
    first = ng.GateResult({"h1": 2.0, "h2": 2.0, "h3": 0.05}, {"h3": "slow", "h1": "busy"}, seconds=2.0)
    second = ng.GateResult({"h1": 2.0, "h2": 2.0, "h3": 0.05}, {"h3": "slow again"}, seconds=2.5)
    both = ng.confirmed(first, second)
    assert both.culprits == {"h3": "slow again"} and both.seconds == 4.5
    assert ng.confirmed(first, ng.GateResult(second.rates, {}, seconds=1)).culprits == {}
