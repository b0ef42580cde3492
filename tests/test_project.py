"""Project images (issue 13): requirements that would move a family's framework pin are
refused before building, naming them; the Dockerfile has the layers in the cached order.
The real build, import and push run in tests/test_push.py (Docker)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from dtrain.images import project as pj
from dtrain.images.build import BuildError
from dtrain.images.spec import load_all

ROOT = Path(__file__).resolve().parent.parent
IMAGES = load_all()


def base(spec: str):
    return pj.choose_base(spec, IMAGES)


DDP = "pytorch-ddp"
HVD_TF = "horovod-tensorflow"


@pytest.mark.parametrize("family,text,needles", [
    (DDP, "torch>=2.14\n", ["requirements.txt:1: torch>=2.14 conflicts with dtrain/pytorch-ddp:2.13.0-cpu",
                            "pins torch==2.13.0"]),
    (DDP, "numpy\n# comment\nTorch == 2.12.0  # older\n", ["requirements.txt:3: Torch == 2.12.0", "torch==2.13.0"]),
    (DDP, "torch @ https://example.com/torch-2.13.0-cp311-none-any.whl\n", ["torch @ https", "drop it"]),
    ("horovod-pytorch", "horovod==0.27.0\n", ["horovod==0.27.0 conflicts", "horovod==0.28.1"]),
    (HVD_TF, "tensorflow-cpu<2.15\n", ["tensorflow-cpu<2.15", "tensorflow-cpu==2.15.1"]),
    (HVD_TF, "tensorflow\n", ["requirements.txt:1: tensorflow conflicts", "second TensorFlow build"]),
    (DDP, "-r other.txt\n", ["-r is not supported"]),
    (DDP, "torch==\n", ["is not a requirement"]),
])
def test_conflicts_are_named(family, text, needles):
    problems = pj.conflicts(text, base(family))
    assert len(problems) == 1, problems
    for n in needles:
        assert n in problems[0], problems[0]


@pytest.mark.parametrize("family,text", [
    (DDP, "tabulate==0.9.0\nnumpy\n"),
    (DDP, "torch>=2.0,<3\n"),
    (DDP, "torch==2.13.*\n"),
    (DDP, "torch==2.13.0 --hash=sha256:" + "0" * 64 + "\n"),
    (DDP, "torch<2 ; python_version < '3.8'\n"),  # marker false for the image's Python 3.11
    (DDP, "--extra-index-url https://example.com/simple\n\n"),
    (HVD_TF, "tensorflow-cpu==2.15.1\nhorovod>=0.28\n"),
])
def test_compatible_requirements_pass(family, text):
    assert pj.conflicts(text, base(family)) == []


def test_every_conflict_reported_at_once(tmp_path):
    (tmp_path / "requirements.txt").write_text("torch==1.13.1\ntabulate\nhorovod==0.20.0\n")
    with pytest.raises(BuildError) as exc:
        pj.plan(tmp_path, "horovod-pytorch", IMAGES)
    lines = str(exc.value).splitlines()
    assert len(lines) == 2, lines
    assert ":1: torch==1.13.1 conflicts with dtrain/horovod-pytorch:2.13.0-hvd0.28.1-cpu" in lines[0]
    assert ":3: horovod==0.20.0 conflicts" in lines[1] and "pins horovod==0.28.1" in lines[1]
    assert all(ln.startswith(str(tmp_path / "requirements.txt")) for ln in lines)


def test_base_choice():
    assert base("pytorch-ddp").tag == "2.13.0-cpu-py311-debian12"
    assert base("pytorch-ddp:2.4.1-cu124-cudnn9-py310-ubuntu22.04").gpu
    for bad, msg in (("nosuch", "unknown family 'nosuch'"), ("pytorch-ddp:nope", "has no tag nope")):
        with pytest.raises(BuildError, match=msg):
            base(bad)


def test_plan_reads_dtrain_yaml_and_names_the_image(tmp_path):
    proj = tmp_path / "My Project_2"
    proj.mkdir()
    (proj / "dtrain.yaml").write_text("from: pytorch-ddp\n")
    (proj / "train.py").write_text("print('hi')\n")
    p = pj.plan(proj, None, IMAGES)
    assert p.base.family == "pytorch-ddp" and p.requirements == ""
    assert p.ref.startswith("dtrain/project-my-project-2:") and len(p.tag) == 12
    (proj / "train.py").write_text("print('changed')\n")
    assert pj.plan(proj, None, IMAGES).tag != p.tag  # the tag follows the content
    (proj / "dtrain.yaml").write_text("form: pytorch-ddp\n")
    with pytest.raises(BuildError, match="unknown keys form"):
        pj.plan(proj, None, IMAGES)
    (proj / "dtrain.yaml").unlink()
    with pytest.raises(BuildError, match="--from FAMILY"):
        pj.plan(proj, None, IMAGES)


def test_dockerfile_layers_in_cache_order(tmp_path):
    (tmp_path / "requirements.txt").write_text("tabulate==0.9.0\n")
    p = pj.plan(tmp_path, "horovod-pytorch", IMAGES)
    text = pj.dockerfile(p)
    df = DockerfileParser(path=str(tmp_path / "Dockerfile"))
    df.content = text
    instrs = [(i["instruction"], i["value"]) for i in df.structure]
    kinds = [k for k, _ in instrs if k not in ("COMMENT",)]
    assert kinds == ["ARG", "FROM", "COPY", "RUN", "COPY", "WORKDIR", "LABEL"]
    assert ("ARG", "BASE_IMAGE=dtrain/horovod-pytorch:2.13.0-hvd0.28.1-cpu-py311-debian12") in instrs
    run = next(v for k, v in instrs if k == "RUN")
    assert "--mount=type=secret,id=ca" in run and "--mount=type=secret,id=pipconf" in run
    assert "'horovod==0.28.1' 'torch==2.13.0'" in run
    assert "-c /tmp/dtrain-project/constraints.txt -r /tmp/dtrain-project/requirements.txt" in run
    assert instrs[-3:-1] == [("COPY", ". /workdir"), ("WORKDIR", "/workdir")]
    assert p.requirements_sha256 in text
    # Without requirements: no pip layer at all.
    (tmp_path / "requirements.txt").unlink()
    assert "pip install" not in pj.dockerfile(pj.plan(tmp_path, "horovod-pytorch", IMAGES))


def test_build_argv_passes_secrets_as_secrets(tmp_path):
    from dtrain.images.build import BuildOptions

    p = pj.plan(tmp_path, "pytorch-ddp", IMAGES)
    argv = pj.build_argv(p, BuildOptions(ca_bundle=Path("/ca.pem")), docker="docker",
                         dockerfile_path=Path("/x/Dockerfile"))
    assert argv[:6] == ["docker", "build", "--progress=plain", "-f", "/x/Dockerfile", "-t"]
    assert argv[6] == p.ref and ["--secret", "id=ca,src=/ca.pem"] == argv[7:9]
    assert argv[-1] == str(tmp_path.resolve())


def test_cli_conflict_is_one_line_per_requirement_and_builds_nothing(tmp_path):
    (tmp_path / "requirements.txt").write_text("torch==2.0.0\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "invoke", "build", "--project", str(tmp_path), "--from",
                        "pytorch-ddp"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        f"error: {tmp_path}/requirements.txt:1: torch==2.0.0 conflicts with dtrain/pytorch-ddp:"
        "2.13.0-cpu-py311-debian12, which pins torch==2.13.0; drop it, allow 2.13.0, or build --from a "
        "variant with the version you need"]


def test_project_dockerfile_passes_hadolint(tmp_path):
    (tmp_path / "requirements.txt").write_text("tabulate==0.9.0\n")
    path = tmp_path / "Dockerfile"
    path.write_text(pj.dockerfile(pj.plan(tmp_path, "horovod-tensorflow", IMAGES)))
    r = subprocess.run(["hadolint", "--config", str(ROOT / ".hadolint.yaml"), str(path)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
