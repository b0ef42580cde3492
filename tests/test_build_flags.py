"""`dtrain build`: every flag is checked before the Docker engine is asked for anything, and each
wrong one is one line naming the flag. PATH holds no dockerd and nothing may be printed on stdout:
were the engine touched first, `docker info` would print "docker engine is running" or starting
dockerd would fail with a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def build(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    empty = tmp_path / "bin"
    empty.mkdir(exist_ok=True)
    env = {**os.environ, "PATH": str(empty), "PYTHONPATH": str(ROOT), "DTRAIN_HOME": str(tmp_path / "home")}
    for var in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        env.pop(var, None)
    return subprocess.run([sys.executable, "-m", "invoke", "build", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def files(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    regular = tmp_path / "ca.pem"
    regular.write_text("x\n")
    project = tmp_path / "proj"
    project.mkdir()
    return {"fifo": str(fifo), "dir": str(tmp_path), "file": str(regular), "project": str(project),
            "missing": str(tmp_path / "missing")}


CASES = {
    "ca-missing": (("--ca-bundle", "{missing}"), ("--ca-bundle '{missing}': no such file",)),
    "ca-fifo": (("--ca-bundle", "{fifo}"), ("--ca-bundle '{fifo}': a named pipe (FIFO), not a regular file",)),
    "ca-dir": (("--ca-bundle", "{dir}"), ("--ca-bundle '{dir}': a directory, not a regular file",)),
    "ca-device": (("--ca-bundle", "/dev/zero"), ("--ca-bundle '/dev/zero': a character device, not a regular file",)),
    "pip-conf-fifo": (("--pip-conf", "{fifo}"), ("--pip-conf '{fifo}': a named pipe (FIFO), not a regular file",)),
    "wheelhouse-file": (("--wheelhouse", "{file}"), ("--wheelhouse '{file}': a regular file, not a directory",)),
    "wheelhouse-missing": (("--wheelhouse", "{missing}"), ("--wheelhouse '{missing}': no such directory",)),
    "project-file": (("--project", "{file}", "--from", "pytorch-ddp"), ("--project '{file}': a regular file, not a directory",)),
    "project-ca-fifo": (("--project", "{project}", "--from", "pytorch-ddp", "--ca-bundle", "{fifo}"),
                        ("--ca-bundle '{fifo}': a named pipe (FIFO), not a regular file",)),
    "project-wheelhouse": (("--project", "{project}", "--from", "pytorch-ddp", "--wheelhouse", "{fifo}"),
                           ("--wheelhouse '{fifo}': a named pipe (FIFO), not a directory",)),
    "project-no-from": (("--project", "{project}"), ("--project {project}: say which family",)),
    "project-from": (("--project", "{project}", "--from", "pytorch-ddp:nope"), ("--from pytorch-ddp:nope: ",
                                                                                "has no tag nope")),
    "from-upper": (("--project", "{project}", "--from", "Torch:1"), ("--from 'Torch:1'", "NAME or NAME:TAG")),
    "tag": (("--image", "pytorch-ddp", "--tag", "nope"), ("--tag nope: no variant has this tag; known: ",)),
    "tag-grammar": (("--tag", "-x"), ("--tag '-x'",)),
    "base-image": (("--base-image", "UPPER/case"), ("--base-image 'UPPER/case'", "lowercase")),
    "push-cache-tag": (("--push-cache", "r.io:5000/cache:t"), ("--push-cache 'r.io:5000/cache:t'", "without tag")),
    "from-alone": (("--from", "pytorch-ddp"), ("--from goes with --project",)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_wrong_flag_is_one_line_before_the_engine(case, tmp_path, files):
    args, needles = CASES[case]
    r = build(tmp_path, *(a.format(**files) for a in args))
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "Traceback" not in out and not r.stdout.strip(), out
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out
    for n in needles:
        assert n.format(**files) in lines[0], out


@pytest.mark.parametrize("text", ["from: [[[[", "[" * 5000 + "]" * 5000, "\x00\xff"])
def test_project_file_errors_are_one_line(text, tmp_path, files):
    (Path(files["project"]) / "dtrain.yaml").write_bytes(text.encode("latin-1"))
    r = build(tmp_path, "--project", files["project"])
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "dtrain.yaml" in lines[0], r.stdout + r.stderr
    assert not r.stdout.strip()


def test_project_file_that_is_a_fifo_is_refused(tmp_path, files):
    os.mkfifo(Path(files["project"]) / "dtrain.yaml")
    r = build(tmp_path, "--project", files["project"])
    assert r.returncode == 2 and "dtrain.yaml: a named pipe (FIFO), not a regular file" in r.stderr, r.stdout + r.stderr
