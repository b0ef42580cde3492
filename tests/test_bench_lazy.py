"""bench/bench_lazy.py's pure helpers: the node configs it writes and how it reads steps."""

from __future__ import annotations

import json
import runpy
import tomllib
from pathlib import Path

import pytest

B = runpy.run_path(str(Path(__file__).resolve().parent.parent / "bench" / "bench_lazy.py"), run_name="bench")


def test_containerd_config_names_the_soci_proxy_under_the_node_dir():
    cfg = tomllib.loads(B["containerd_config"](Path("/s/n1")))
    assert cfg["proxy_plugins"]["soci"] == {"type": "snapshot", "address": "/s/n1/soci/soci.sock"}
    assert cfg["grpc"]["address"] == "/s/n1/containerd/containerd.sock"
    assert cfg["root"].startswith("/s/n1/") and cfg["state"].startswith("/s/n1/")
    assert "io.containerd.grpc.v1.cri" in cfg["disabled_plugins"]


@pytest.mark.parametrize("on", [True, False])
def test_soci_config_background_fetch(on):
    assert tomllib.loads(B["soci_config"](on)) == {
        "background_fetch": {"disable": not on},
        # two retries for soci's own client (the no-index fallback's ~8 s per layer), CamelCase as
        # soci 0.4.1 reads it; lazy reads keep their defaults
        "http": {"MaxRetries": 2, "MinWaitMsec": 20}, "blob": {"max_retries": 8, "min_wait_msec": 30}}


def test_daemon_json_uses_the_containerd_store_with_the_driver():
    assert json.loads(B["daemon_json"]("soci")) == {"features": {"containerd-snapshotter": True},
                                                  "storage-driver": "soci"}
    assert json.loads(B["daemon_json"]("overlay2")) == {"storage-driver": "overlay2"}


@pytest.mark.parametrize("line, want", [("step 0 1700000000.5\n", (0, 1700000000.5)), ("step 12 3.25", (12, 3.25)),
                                        ("step x 1", None), ("2026 warning step", None), ("", None)])
def test_parse_step(line, want):
    assert B["parse_step"](line) == want


def test_step_median_windows_from_the_first_step():
    times = [100.0, 100.1, 100.2, 100.3, 160.0, 160.5, 161.0]
    assert B["step_median"](times, 0, 30) == pytest.approx(0.1)
    assert B["step_median"](times, 60, 70) == pytest.approx(0.5)
    assert B["step_median"](times, 30, 59) is None
    assert B["step_median"]([], 0, 30) is None


def test_floor_seconds():
    assert B["floor_seconds"](125_000_000, 10**9) == pytest.approx(1.0)
    assert B["floor_seconds"](1, None) is None
