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


def test_a_cluster_of_another_size_is_refused_with_the_commands_that_replace_it():
    """The CLI's user reads this line: it names `dtrain cluster up --recreate`, not the Python
    call (review of issue 25: it said "or up(..., recreate=True)")."""
    for msg in (cl.refusal(2), cl.refusal(3, "lazy")):
        assert "dtrain cluster up --recreate" in msg and "dtrain cluster down" in msg, msg
        assert "recreate=True" not in msg and "\n" not in msg
    assert cl.refusal(2).startswith("a cluster with 2 node(s) is already up;")
    assert cl.refusal(3, "lazy").startswith("a cluster with 3 node(s) is up in lazy mode;")
