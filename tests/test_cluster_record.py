"""The simulated cluster's record (state.json) read back: this version's round-trips; one written
by another version of dtrain is a one-line error naming the file and the way out."""

from __future__ import annotations

import json

import pytest

from dtrain.launch.infra import cluster as cl


def test_record_round_trips():
    info = cl._info(3, lazy=True)
    assert cl.ClusterInfo.from_dict(json.loads(json.dumps(info.to_dict()))) == info
    info = cl._info(4, shared=(("/root", "/var/tmp/home"), ("/srv", "/var/tmp/srv")))
    assert cl.ClusterInfo.from_dict(json.loads(json.dumps(info.to_dict()))) == info
    d = info.to_dict()
    del d["shared"]  # a record from before shared directories: none
    assert cl.ClusterInfo.from_dict(d).shared == ()
    assert "shared" not in cl._info(3).to_dict()  # unshared: the record older dtrains read (bench --against)


def test_shared_directories_are_checked_before_anything(tmp_path):
    """up(shared=...): each path on the nodes an existing directory (a mount needs one), each
    host directory one too; sorted as the record keeps them."""
    (tmp_path / "a").mkdir()
    (tmp_path / "f").write_text("x")
    assert cl.check_shared({str(tmp_path): str(tmp_path / "a"), "/srv/": str(tmp_path)}) == (
        ("/srv", str(tmp_path)), (str(tmp_path), str(tmp_path / "a")))
    assert cl.check_shared(None) == ()
    for bad, says in [({"/": str(tmp_path)}, "'/': the path on the nodes"),
                      ({"root": str(tmp_path)}, "'root': the path on the nodes"),
                      ({str(tmp_path / "f"): str(tmp_path)}, "the path on the nodes must be an existing directory"),
                      ({str(tmp_path): str(tmp_path / "nope")}, "the host directory must exist"),
                      ({str(tmp_path): "a"}, "the host directory must exist")]:
        with pytest.raises(cl.ClusterError, match=says):
            cl.check_shared(bad)


def test_a_node_whose_home_is_shared_keeps_no_dtrain_of_its_own(tmp_path, monkeypatch):
    """Where a shared directory holds ~/.dtrain (a shared home), the node's own ~/.dtrain is not
    mounted over it: what the nodes keep there is one directory for all, as on NFS."""
    monkeypatch.setattr(cl, "STATE_DIR", tmp_path / "state")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    node = cl._node(2)
    node = cl.NodeInfo(**{**node.__dict__, "state_dir": str(tmp_path / "state" / "node2")})
    own = cl._node_binds(node)
    assert own == [(str(tmp_path / "state" / "node2" / "dtrain-home"), str(tmp_path / "home" / ".dtrain"))]
    shared = (("/srv/data", "/var/tmp/data"), (str(tmp_path / "home"), "/var/tmp/home"))
    assert cl._node_binds(node, shared) == [("/var/tmp/data", "/srv/data"), ("/var/tmp/home", str(tmp_path / "home"))]
    assert cl._node_binds(node, shared[:1]) == own + [("/var/tmp/data", "/srv/data")]


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
    assert cl.refusal(4, "shared").startswith("a cluster with 4 node(s) is up with other shared directories;")
