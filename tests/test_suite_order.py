"""The suite makes its 3-node cluster once (docs/benchmarks.md, "The test suite's time"): a test
module that brings up a cluster of another shape (recreate, lazy, shared directories) or takes
it down is marked `own_cluster`, which conftest.py's pytest_collection_modifyitems runs after
every test on the shared 3-node cluster."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import _cluster_order

TESTS = Path(__file__).resolve().parent
# up(...) with another shape, or down(...), called on the cluster module (imported as cl or cluster)
SHAPE = re.compile(r"\b(?:cl|cluster)\.(?:up\([^)\n]*(?:recreate=True|lazy=|shared=)|down\()")


def shape_changers() -> list[str]:
    return sorted(p.name for p in TESTS.glob("test_*.py") if SHAPE.search(p.read_text()))


def test_every_module_that_changes_the_clusters_shape_is_marked_own_cluster():
    found = shape_changers()
    assert {"test_cluster.py", "test_lazy_cluster.py", "test_ray_cluster.py", "test_shared_home.py"} <= set(found)
    unmarked = [name for name in found if "own_cluster" not in (TESTS / name).read_text()]
    assert unmarked == [], f"{unmarked}: mark them pytest.mark.own_cluster (tests/conftest.py)"


def test_the_order_puts_own_shapes_after_the_shared_cluster_and_takers_down_last():
    class Item:
        def __init__(self, mark):
            self.mark = mark

        def get_closest_marker(self, name):
            return self.mark if name == "own_cluster" else None

    shared, own = Item(None), Item(pytest.mark.own_cluster.mark)
    down = Item(pytest.mark.own_cluster(takes_down=True).mark)
    assert sorted([down, own, shared], key=_cluster_order) == [shared, own, down]
