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
    "localhost:5000/a/b:tag": Reference("localhost:5000", "a/b", "tag", ""),
    "a__b": Reference("", "a__b", "", ""),
    "a---b/c.d_e": Reference("", "a---b/c.d_e", "", ""),
    "[::1]:5000/x": Reference("[::1]:5000", "x", "", ""),
    "[2001:db8::1]/x": Reference("[2001:db8::1]", "x", "", ""),
    "reg.example.com:443/x": Reference("reg.example.com:443", "x", "", ""),
    "x:" + "t" * 128: Reference("", "x", "t" * 128, ""),  # 128 characters: the longest tag
    "x:_": Reference("", "x", "_", ""),
    "dtrain/x": Reference("", "dtrain/x", "", ""),  # no '.', ':' or localhost: a Docker Hub path
    "x@md5:" + "0" * 32: Reference("", "x", "", "md5:" + "0" * 32),
    "r.io/" + "a" * 250: Reference("r.io", "a" * 250, "", ""),  # a name of 255 characters
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
    "Reg/X": "repository names are lowercase, not 'Reg'",  # upper case in a path component
    "UPPER/case": "repository names are lowercase, not 'UPPER'; a registry host has a '.'",
    "reg.example.com/Team/x": "repository names are lowercase, not 'Team'",
    "Ubuntu": "lowercase",
    "reg//x": "empty path component",
    "reg/x/": "empty path component",
    "reg/x:": "':' with no tag",
    "reg/x:-tag": "tag '-tag': starts with",  # a tag starts with a word character
    "reg/x:" + "t" * 129: "tag of 129 characters (at most 128)",
    "reg/x@sha256:abc": "digest 'sha256:abc'",  # too short
    "reg/x@md5": "digest 'md5'",
    "reg/x@sha256:1@sha256:2": "more than one '@'",
    "a___b": "path component 'a___b'",
    "a._b": "path component 'a._b'",
    "a-": "path component 'a-'",
    "_a": "path component '_a'",
    "0123456789abcdef" * 4: "image id",
    "reg/x@sha256:" + "A" * 64: "64 lowercase hex",
    "reg/" + "a" * 300: "longer than 255",
    "r.io/" + "a" * 251: "longer than 255",  # 256
    "reg/x.:t": "path component 'x.'",
    "reg:port/x": "registry 'reg:port': expected HOST[:PORT]",
    "-reg.com/x": "starts with '-'",
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
    assert msg.startswith(f"--image {ref!r}: not a valid image reference: "), msg
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


def test_repository_registry_and_name_tag():
    from dtrain.reference import check_name_tag, check_registry, check_repository

    assert check_repository("r.io:5000/cache/x", "--push-cache").repository == "r.io:5000/cache/x"
    with pytest.raises(BadReference, match=r"^--push-cache 'r.io/x:t': a repository without tag"):
        check_repository("r.io/x:t", "--push-cache")
    with pytest.raises(BadReference, match=r"^--push-cache 'R/x': not a valid image reference: repository names"):
        check_repository("R/x", "--push-cache")
    assert check_registry("10.0.0.1:5000", "--registry") == "10.0.0.1:5000"
    assert check_registry("[::1]:5000", "--registry") == "[::1]:5000"
    for bad in ("a b", "h:port", "h/x", "", "-h"):
        with pytest.raises(BadReference, match=r"^--registry .*expected a registry HOST\[:PORT\]"):
            check_registry(bad, "--registry")
    assert check_name_tag("pytorch-ddp:2.13.0-cpu", "--from", "F") == ("pytorch-ddp", "2.13.0-cpu")
    for bad in ("Pytorch:1", "a:-1", "a:", "a/b:1"):
        with pytest.raises(BadReference, match=r"^--from .*expected NAME or NAME:TAG"):
            check_name_tag(bad, "--from", "F")


IMAGE_FLAGS = {
    "launch": ("launch", "--image", "UPPER/case", "--hosts", "127.0.0.1:1", "--", "true"),
    "pull": ("pull", "--image", "UPPER/case", "--hosts", "127.0.0.1:1"),
    "doctor": ("doctor", "--image", "UPPER/case", "--hosts", "127.0.0.1:1"),
    "bench-network": ("bench-network", "--image", "UPPER/case", "--hosts", "127.0.0.1:1"),
    "manifest": ("manifest", "--for", "mpijob", "--image", "UPPER/case", "--", "true"),
    "build": ("build", "--builder-image", "UPPER/case"),
    "push": ("push", "--registry", "UPPER case"),
    "push-prefix": ("push", "--registry", "127.0.0.1:1", "--repo-prefix", "Team"),
}


@pytest.mark.parametrize("task", sorted(IMAGE_FLAGS))
def test_every_task_refuses_a_reference_before_anything(task, tmp_path):
    """One line naming the flag, exit 2, no job record, no ssh (nothing listens on port 1: an
    attempt would print 'connection refused')."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    job = tmp_path / "job.yaml"
    env = {**os.environ, "PYTHONPATH": str(root), "DTRAIN_HOME": str(tmp_path / "home"), "HOME": str(tmp_path),
           "AWS_EC2_METADATA_DISABLED": "true"}
    r = subprocess.run([sys.executable, "-m", "invoke", *IMAGE_FLAGS[task]], cwd=root, env=env,
                       capture_output=True, text=True, timeout=60)
    out = r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), out
    assert "Traceback" not in out and "refused" not in out, out
    assert "UPPER" in lines[0] or "Team" in lines[0], out
    assert not any(p.is_file() for p in tmp_path.rglob("*") if p != job), sorted(tmp_path.rglob("*"))


def test_job_file_image_is_checked_before_anything(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    job = tmp_path / "job.yaml"
    job.write_text("image: UPPER/case\nhosts: 127.0.0.1:1\ncommand: ['true']\n")
    env = {**os.environ, "PYTHONPATH": str(root), "DTRAIN_HOME": str(tmp_path / "home"), "HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "invoke", "launch", "-f", str(job)], cwd=root, env=env,
                       capture_output=True, text=True, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stdout + r.stderr
    assert "job.yaml" in lines[0] and "repository names are lowercase" in lines[0], lines
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").rglob("*.json"))
