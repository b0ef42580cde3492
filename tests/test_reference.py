"""Image references against Docker's grammar (distribution/reference): good ones parse into
their parts, hostile or malformed ones are refused with a message naming the flag."""

from __future__ import annotations

import pytest

from dtrain.reference import BadReference, Reference, check, parse

D64 = "sha256:" + "0123456789abcdef" * 4

GOOD = {
    "ubuntu": Reference("", "ubuntu", "", ""),
    "dtrain/pytorch-ddp:2.13.0-cpu-py311-debian12": Reference("", "dtrain/pytorch-ddp", "2.13.0-cpu-py311-debian12", ""),
    "10.213.0.1:5000/dtrain/horovod-tensorflow:T": Reference("10.213.0.1:5000", "dtrain/horovod-tensorflow", "T", ""),
    "localhost:5000/a_b/c--d/e.f:v1.0_rc-1": Reference("localhost:5000", "a_b/c--d/e.f", "v1.0_rc-1", ""),
    "localhost/x": Reference("localhost", "x", "", ""),
    f"123456789012.dkr.ecr.us-east-1.amazonaws.com/dtrain/x@{D64}":
        Reference("123456789012.dkr.ecr.us-east-1.amazonaws.com", "dtrain/x", "", D64),
    f"reg.example.com/x:tag@{D64}": Reference("reg.example.com", "x", "tag", D64),
    "[::1]:5000/x:y": Reference("[::1]:5000", "x", "y", ""),
    "Registry.Example.com/x": Reference("Registry.Example.com", "x", "", ""),
}

HOSTILE = {
    "reg/x:1$(touch /tmp/p)": "'$'",
    "reg/x:`id`": "'`'",
    "reg/x:1;id": "';'",
    "reg/x:1 && id": "' '",
    'reg/x:"1"': "'\"'",
    "reg/x:1'": "\"'\"",
    "reg/x:1\nid": "'\\n'",
    "-x": "starts with '-'",
    "--privileged": "starts with '-'",
    "": "empty",
    "Reg/X": "grammar",  # upper case in a path component
    "reg//x": "grammar",
    "reg/x:": "grammar",
    "reg/x:-tag": "grammar",  # a tag starts with a word character
    "reg/x:" + "t" * 129: "grammar",
    "reg/x@sha256:abc": "grammar",  # too short
    "reg/x@sha256:" + "A" * 64: "64 lowercase hex",
    "reg/" + "a" * 300: "longer than 255",
    "reg/x.:t": "grammar",
    "reg:port/x": "grammar",
}


@pytest.mark.parametrize("ref", sorted(GOOD))
def test_good_references(ref):
    assert parse(ref) == GOOD[ref]
    assert check(ref) == GOOD[ref]


@pytest.mark.parametrize("ref", sorted(HOSTILE))
def test_hostile_references(ref):
    with pytest.raises(BadReference) as exc:
        check(ref, "--image")
    msg = str(exc.value)
    assert msg.startswith(f"--image {ref!r}: not a valid image reference"), msg
    assert HOSTILE[ref] in msg, msg
    assert "\n" not in msg  # one line, even for a reference with a newline


def test_repository():
    assert parse("h:1/a/b:t").repository == "h:1/a/b"
    assert parse("a/b:t").repository == "a/b"


def test_push_split_ref_uses_the_grammar():
    from dtrain.images import push as P

    assert P.split_ref(f"h:1/a/b:t@{D64}") == ("h:1", "a/b", "t")
    with pytest.raises(P.PushError, match="image reference"):
        P.split_ref("h:1/a/b:t$(id)")
