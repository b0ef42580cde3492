"""Every benchmark in bench/ loads: its imports resolve against the package as it is (a bench
is run by hand, so nothing else would notice a module that moved)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.parametrize("path", sorted(BENCH.glob("bench_*.py")), ids=lambda p: p.name)
def test_bench_loads(path):
    ns = runpy.run_path(str(path), run_name="bench")  # not __main__: nothing runs
    assert callable(ns.get("main")), f"{path.name} has no main()"
