"""The simulated cluster's record (state.json) read back: this version's round-trips; one written
by another version of dtrain is a one-line error naming the file and the way out."""

from __future__ import annotations

import json

import pytest

from dtrain.launch.infra import cluster as cl


def test_record_round_trips():
    info = cl._info(3, lazy=True)
    assert cl.ClusterInfo.from_dict(json.loads(json.dumps(info.to_dict()))) == info


@pytest.mark.parametrize("change", [
    lambda d: d.update(speed="fast"),                    # a key this version does not know
    lambda d: d.pop("identity_file"),                    # one it needs, missing
    lambda d: d["nodes"][0].update(gpu_count=8),         # a node's key it does not know
    lambda d: d.pop("nodes"),
])
def test_record_from_another_version(change):
    d = json.loads(json.dumps(cl._info(2).to_dict()))
    change(d)
    with pytest.raises(cl.ClusterError) as e:
        cl.ClusterInfo.from_dict(d)
    msg = str(e.value)
    assert str(cl.STATE_FILE) in msg and "dtrain cluster down" in msg and "\n" not in msg
