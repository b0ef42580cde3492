"""A second simulated cluster beside the first ($DTRAIN_SIM_SLOT, launch/infra/cluster.py): each
slot has its own state directory, lock, bridge, subnet, namespaces and veths, so `dtrain test`
runs its cluster tests on two at once (dtrain/suite.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dtrain.launch.infra import cluster as cl

ROOT = Path(__file__).resolve().parent.parent


def test_slot_zero_is_the_documented_layout_and_others_share_nothing_with_it():
    assert cl.slot({}) == 0 and cl.slot({"DTRAIN_SIM_SLOT": "0"}) == 0 and cl.slot({"DTRAIN_SIM_SLOT": "1"}) == 1
    assert cl._layout(0) == (Path("/var/lib/dtrain-cluster"), Path("/run/dtrain-cluster.lock"), "dtbr0",
                             "10.213.0.", "dtn", "dtv")
    layouts = [cl._layout(n) for n in range(10)]
    for field in range(6):  # no two slots share a directory, lock, bridge, subnet or name prefix
        assert len({str(lay[field]) for lay in layouts}) == 10
    for lay in layouts:  # no slot's prefix is another's: `down` removes only its own namespaces and links
        others = [o for o in layouts if o != lay]
        assert not any(o[4].startswith(lay[4]) or o[5].startswith(lay[5]) for o in others)
        assert len(f"{lay[5]}64p") <= 15 and len(lay[2]) <= 15  # Linux interface names


@pytest.mark.parametrize("raw", ["x", "10", "-1", "1.5"])
def test_a_bad_slot_is_refused_in_one_line(raw):
    with pytest.raises(cl.ClusterError, match=r"\$DTRAIN_SIM_SLOT='.*': expected a number from 0 to 9"):
        cl.slot({"DTRAIN_SIM_SLOT": raw})
    r = subprocess.run([sys.executable, "-m", "dtrain", "cluster", "down"], capture_output=True, text=True,
                       env={**os.environ, "DTRAIN_SIM_SLOT": raw, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert f"$DTRAIN_SIM_SLOT={raw!r}: expected a number from 0 to 9" in r.stderr.strip().splitlines()[-1]


def test_the_slot_reaches_every_process_dtrain_starts():
    code = "from dtrain.launch.infra import cluster as c; print(c.STATE_DIR, c.REGISTRY, c.BRIDGE, c.NETNS_PREFIX)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "DTRAIN_SIM_SLOT": "3"}).stdout.split()
    assert out == ["/var/lib/dtrain-cluster-3", "10.213.3.1:5000", "dtbr3", "dt3n"]
