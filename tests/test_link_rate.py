"""The simulated cluster's per-node link limit (tc token bucket), with a real transfer."""

from __future__ import annotations

import subprocess
import time

import pytest

from dtrain.launch.infra import cluster as cl
from dtrain.launch.infra import netns as nx

RATE = "100mbit"
SIZE = 16 * 2**20


def test_parse_rate_and_bucket():
    assert nx.parse_rate("1gbit") == 10**9 and nx.parse_rate("2.5Mbit") == 2_500_000
    for bad in ("1gb", "fast", "0mbit", "-1gbit"):
        with pytest.raises(ValueError, match="bad rate"):
            nx.parse_rate(bad)
    assert nx.tbf_args(10**9)[:4] == ["tbf", "rate", "1000000000bit", "burst"]
    assert int(nx.tbf_args(10**9)[4]) == 10**9 // 8 // 100  # 10 ms of traffic
    assert int(nx.tbf_args(10**6)[4]) == 64 * 1024  # never below 64 KiB


def _fetch_seconds(info) -> float:
    """Seconds for node-1 to fetch SIZE bytes from an HTTP server on node-2."""
    t0 = time.monotonic()
    r = cl.node_exec(1, ["curl", "-fsS", "-o", "/dev/null", "-w", "%{size_download}",
                         f"http://{info.addresses[1]}:8099/blob"], timeout=120)
    seconds = time.monotonic() - t0
    assert int(r.stdout) == SIZE
    return seconds


@pytest.mark.cluster
def test_link_rate_is_applied_and_limits_a_transfer(cluster, tmp_path):
    (tmp_path / "blob").write_bytes(b"\0" * SIZE)
    node2 = cl._node(2)
    server = subprocess.Popen(nx.node_argv(node2.netns, node2.name, [
        "python3", "-m", "http.server", "8099", "--bind", cluster.addresses[1], "--directory", str(tmp_path)]),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not nx.tcp_open(cluster.addresses[1], 8099):
            assert time.monotonic() < deadline, "http.server on node-2 did not start"
            time.sleep(0.1)
        free = _fetch_seconds(cluster)
        cl.up(len(cluster.nodes), quiet=True, link_rate=RATE)
        node_side = subprocess.run(["tc", "-n", "dtn1", "qdisc", "show", "dev", "ens5"],
                                   capture_output=True, text=True, check=True).stdout
        host_side = subprocess.run(["tc", "qdisc", "show", "dev", "dtv1"],
                                   capture_output=True, text=True, check=True).stdout
        assert "tbf" in node_side and "rate 100Mbit" in node_side, node_side
        assert "tbf" in host_side and "rate 100Mbit" in host_side, host_side
        limited = _fetch_seconds(cluster)
        rate = SIZE * 8 / limited
        # the same transfer, unlimited then limited: the limit is what bounds it
        assert rate <= 1.1 * nx.parse_rate(RATE), (rate, free, limited)
        assert limited >= 3 * free, (free, limited)
        cl.up(len(cluster.nodes), quiet=True)  # default: no limit
        assert "tbf" not in subprocess.run(["tc", "qdisc", "show", "dev", "dtv1"],
                                           capture_output=True, text=True, check=True).stdout
    finally:
        server.kill()
        server.wait()
        cl.up(len(cluster.nodes), quiet=True)
