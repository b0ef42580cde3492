"""Project images (issue 13): requirements that would move a family's framework pin are
refused before building, naming them; the Dockerfile has the layers in the cached order.
The real build, import and push run in tests/test_push.py (Docker)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from dtrain.images import project as pj
from dtrain.images.build import BuildError
from dtrain.images.spec import load_all

pytestmark = pytest.mark.second_cluster  # on a second simulated cluster in `dtrain test` (dtrain/suite.py)

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
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("2 problems: "), msg  # one line, every problem in it
    lines = msg.removeprefix("2 problems: ").split(" | ")
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
    assert kinds == ["ARG", "FROM", "COPY", "RUN", "RUN", "COPY", "WORKDIR", "LABEL"]
    assert ("ARG", "BASE_IMAGE=dtrain/horovod-pytorch:2.13.0-hvd0.28.1-cpu-py311-debian12") in instrs
    run, check = [v for k, v in instrs if k == "RUN"]
    assert "--mount=type=secret,id=ca" in run and "--mount=type=secret,id=pipconf" in run
    assert f"--mount=type=bind,from={p.support_ref},source=/dtrain,target=/tmp/dtrain-support" in check
    assert check.endswith("python /tmp/dtrain-support/check_requirements.py /tmp/dtrain-support/check.json")
    assert "--index-url" not in run and "--find-links" not in run  # no companion: nothing extra
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



# ---------------------------------------------------------------- companions and the import check (issue 22 §9)

TORCH_WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
TV_CPU = "torchvision-0.28.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"


def test_companion_table_follows_the_image_torch():
    assert pj.companion_table(base(DDP)) == {"torchaudio": None, "torchvision": "0.28"}
    assert pj.companion_table(base("horovod-pytorch"))["torchvision"] == "0.28"
    assert pj.companion_table(base(HVD_TF)) == {}  # TensorFlow: no torch companions
    gpu = base("pytorch-ddp:2.4.1-cu124-cudnn9-py310-ubuntu22.04")
    assert pj.companion_table(gpu) == {"torchaudio": "2.4", "torchvision": "0.19"}


@pytest.mark.parametrize("text,needles", [
    ("torchvision==0.20.0\n", ["requirements.txt:1: torchvision==0.20.0 does not match", "needs torchvision 0.28.*"]),
    ("TorchAudio\n", ["requirements.txt:1: TorchAudio: no torchaudio release is built for torch 2.13.0"]),
    ("torchvision @ https://example.com/tv.whl\n", ["without the URL", "torchvision 0.28.*"]),
])
def test_companions_that_cannot_match_are_named(text, needles):
    reqs = pj.applicable(text, base(DDP))
    comps, problems = pj.companions(reqs, base(DDP))
    assert comps == [] and len(problems) == 1, problems
    for n in needles:
        assert n in problems[0], problems[0]


def test_companions_are_picked_out_of_the_requirements():
    text = "six\ntorchvision>=0.28 ; python_version >= '3.8'\nnumpy\ntorchvision<0.1 ; python_version < '3'\n"
    comps, problems = pj.companions(pj.applicable(text, base(DDP)), base(DDP))
    assert problems == [] and [(c.where, c.name) for c in comps] == [("requirements.txt:2", "torchvision")]


def test_companion_wheels_match_version_flavour_and_python():
    comps, _ = pj.companions(pj.applicable("torchvision\n", base(DDP)), base(DDP))
    wheels = [TORCH_WHEEL, "torchvision-0.28.0-cp311-cp311-manylinux_2_28_x86_64.whl",  # PyPI's: no +cpu
              "torchvision-0.28.0+cpu-cp310-cp310-manylinux_2_28_x86_64.whl",  # another Python
              "torchvision-0.27.1+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",  # another torch
              "not-a-wheel.whl"]
    assert pj.companion_wheels(comps, base(DDP), wheels) == ([], ["torchvision"])
    assert pj.companion_wheels(comps, base(DDP), wheels + [TV_CPU]) == ([TV_CPU], [])


def test_torchvision_without_its_wheel_fails_before_building(tmp_path):
    """This machine's case: the image's CPU torch came from a wheelhouse without torchvision."""
    house = tmp_path / "wheels"
    house.mkdir()
    (house / TORCH_WHEEL).write_bytes(b"")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "requirements.txt").write_text("six\ntorchvision\n")
    with pytest.raises(BuildError) as exc:
        pj.plan(proj, DDP, IMAGES, wheelhouse=house)
    [line] = str(exc.value).splitlines()
    assert line.startswith(f"{proj}/requirements.txt:2: torchvision: the image's torch 2.13.0+cpu comes from "
                           f"--wheelhouse {house}, which has no torchvision 0.28.*+cpu wheel for Python 3.11")
    # With the wheel there, the companion comes from it (--no-index), pinned to the torch's minor.
    (house / TV_CPU).write_bytes(b"wheel bytes")
    p = pj.plan(proj, DDP, IMAGES, wheelhouse=house)
    assert p.support.wheels == (house / TV_CPU,) and p.support.companion_index is None
    text = pj.dockerfile(p)
    assert "pip install --no-cache-dir --no-index --find-links /tmp/dtrain-support/wheels" in text
    assert "'torch==2.13.0' 'torchvision==0.28.*'" in text
    assert dict(p.support.files)["companions.txt"] == b"torchvision\n"
    tag = p.tag
    (house / TV_CPU).write_bytes(b"other wheel bytes")  # another wheel: another support image and tag
    assert pj.plan(proj, DDP, IMAGES, wheelhouse=house).tag != tag


def test_without_wheelhouse_companions_come_from_the_family_index(tmp_path):
    (tmp_path / "requirements.txt").write_text("torchvision\n")
    p = pj.plan(tmp_path, DDP, IMAGES)
    from dtrain.images.render import torch_index

    assert p.support.companion_index == torch_index(base(DDP)) and p.support.wheels == ()
    text = pj.dockerfile(p)
    assert f"pip install --no-cache-dir --index-url {torch_index(base(DDP))}" in text
    assert "|| { echo 'dtrain-check: torchvision: cannot be installed from" in text
    # The echo is one single-quoted word: nothing in the message may end the quotes.
    line = next(ln for ln in text.splitlines() if "echo '" in ln)
    assert line.count("'") == 2, line


def test_check_plan_names_each_requirement_and_its_fix():
    reqs = pj.applicable("six==1.17.0\n# c\nPyYAML ; sys_platform == 'win32'\ntimm\n", base(DDP), "r.txt")
    plan = pj.check_plan(reqs, base(DDP))
    assert plan["requirements"] == [{"where": "r.txt:1", "spec": "six==1.17.0", "name": "six"},
                                    {"where": "r.txt:4", "spec": "timm", "name": "timm"}]
    assert plan["flavour"] == "cpu" and "torchvision 0.28.*+cpu wheel in --wheelhouse" in plan["companions"]["torchvision"]


def test_check_failures_are_read_from_the_build_log():
    log = ("#9 [4/6] RUN --mount=type=bind\n#9 1.20 dtrain-check: ok r.txt:1: six (six)\n"
           "#9 1.90 dtrain-check: r.txt:2: timm: import timm fails: RuntimeError: x; fix it\n"
           "#9 ERROR: executor failed running\n")
    assert pj.check_failures(log) == ["r.txt:2: timm: import timm fails: RuntimeError: x; fix it"]


def _fake_dist(site: Path, name: str, files: dict[str, str], top_level: str | None = None) -> None:
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    (info / "RECORD").write_text("".join(f"{rel},,\n" for rel in files) + f"{info.name}/RECORD,,\n")
    if top_level is not None:
        (info / "top_level.txt").write_text(top_level)


def test_check_script_imports_every_requirement(tmp_path):
    """images/check_requirements.py run for real (the host's Python) on installed distributions."""
    import json

    site = tmp_path / "site"
    _fake_dist(site, "goodpkg", {"goodmod/__init__.py": "X = 1\n", "_goodpriv.py": ""})
    _fake_dist(site, "badpkg", {"badmod.py": "raise RuntimeError('operator torchvision::nms does not exist')\n"},
               top_level="badmod\n")
    _fake_dist(site, "torchvision", {"torchvision_fake/__init__.py": ""})  # version 1.0: not +cpu
    plan = {"requirements": [{"where": "r.txt:1", "spec": "goodpkg", "name": "goodpkg"},
                             {"where": "r.txt:2", "spec": "badpkg>=1", "name": "badpkg"},
                             {"where": "r.txt:3", "spec": "absent", "name": "absent"}],
            "flavour": "cpu", "companions": {"torchvision": "TV-FIX"}, "fix": "GENERIC-FIX"}
    (tmp_path / "check.json").write_text(json.dumps(plan))
    r = subprocess.run([sys.executable, str(ROOT / "images" / "check_requirements.py"), str(tmp_path / "check.json")],
                       env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        "dtrain-check: ok r.txt:1: goodpkg (goodmod)",
        "dtrain-check: r.txt:2: badpkg>=1: import badmod fails: RuntimeError: operator torchvision::nms does not "
        "exist; it pulled in torchvision 1.0, not built for this image's torch; TV-FIX",
        "dtrain-check: r.txt:3: absent: not installed in the image; GENERIC-FIX"]
    plan["requirements"] = plan["requirements"][:1]
    (tmp_path / "check.json").write_text(json.dumps(plan))
    r = subprocess.run([sys.executable, str(ROOT / "images" / "check_requirements.py"), str(tmp_path / "check.json")],
                       env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "dtrain-check: ok r.txt:1: goodpkg (goodmod)\n", r.stdout + r.stderr


@pytest.mark.docker
def test_project_build_ends_with_an_import_check(cpu_images, ca_bundle, tmp_path):
    """Real builds FROM the pytorch-ddp CPU image: a requirement that imports passes the check;
    one that installs but cannot import (timm pulls PyPI's torchvision, built for CUDA torch)
    fails the build with one line naming it and the fix, not every rank at run time; a
    torchvision requirement whose wheel is not beside the image's torch fails before building."""
    from dtrain.images.build import BuildOptions
    from dtrain import engine

    wheels = Path("/opt/wheels")
    good = tmp_path / "good-proj"
    good.mkdir()
    (good / "requirements.txt").write_text("six==1.17.0\n")
    ref = pj.build(good, DDP, BuildOptions(ca_bundle=ca_bundle, wheelhouse=wheels), say=lambda _: None)
    log = (pj.LOG_DIR / "project-good-proj.log").read_text()
    assert re.search(r"dtrain-check: ok " + re.escape(f"{good}/requirements.txt:1: six==1.17.0 (six)"), log), log[-3000:]
    out = subprocess.run([engine.docker_cli(), "run", "--rm", "--entrypoint", "python", ref, "-c",
                          "import six, os; print(six.__version__, os.listdir('/tmp/dtrain-support'))"],
                         capture_output=True, text=True, timeout=120)
    # The support image was mounted, not copied: only BuildKit's empty mount point is left.
    assert out.stdout.split() == ["1.17.0", "[]"], out.stderr

    bad = tmp_path / "bad-proj"
    bad.mkdir()
    (bad / "requirements.txt").write_text("six==1.17.0\ntimm==1.0.31\n")
    with pytest.raises(BuildError) as exc:
        pj.build(bad, DDP, BuildOptions(ca_bundle=ca_bundle, wheelhouse=wheels), say=lambda _: None)
    [line] = str(exc.value).splitlines()
    assert line.startswith(f"building dtrain/project-bad-proj:")
    assert (f"failed: {bad}/requirements.txt:2: timm==1.0.31: import timm fails: RuntimeError: "
            "operator torchvision::nms does not exist; it pulled in torchvision 0.28.0") in line, line
    assert "list torchvision in requirements.txt and put a torchvision 0.28.*+cpu wheel in --wheelhouse" in line
    assert not engine.image_exists(pj.plan(bad, DDP, IMAGES, wheelhouse=wheels).ref)  # never tagged

    tv = tmp_path / "tv-proj"
    tv.mkdir()
    (tv / "requirements.txt").write_text("torchvision\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "invoke", "build", "--project", str(tv), "--from", DDP,
                        "--wheelhouse", str(wheels)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    [err] = r.stderr.strip().splitlines()
    assert err.startswith(f"error: {tv}/requirements.txt:1: torchvision: the image's torch 2.13.0+cpu comes "
                          f"from --wheelhouse {wheels}, which has no torchvision 0.28.*+cpu wheel"), err
    assert "[build]" not in r.stdout  # refused before any docker build


# ---------------------------------------------------------------- a project from a wheel GPU variant (issue 50)

WHEEL_GPU = "pytorch-ddp:2.13.0-cu130-cudnn9-py311-debian12"


def test_project_from_a_wheel_variant_runs_the_variants_check_and_torchvisions(tmp_path):
    """The wheel variant's own in-image check (launch/node/gpu_build_check.py: CUDA build, cuDNN,
    NCCL, ldd) runs again in the project image, with torchvision's version and import."""
    img = base(WHEEL_GPU)
    assert img.wheels
    (tmp_path / "requirements.txt").write_text("six\ntorchvision\n")
    p = pj.plan(tmp_path, WHEEL_GPU, IMAGES)
    files = dict(p.support.files)
    assert files["gpu_build_check.py"] == (ROOT / "launch" / "node" / "gpu_build_check.py").read_bytes()
    # torchvision comes from PyPI beside PyPI's torch: no PyTorch index, no separate install.
    assert p.support.companion_index in ("", None) and p.support.companion_pins == ("torchvision==0.28.*",)
    text = pj.dockerfile(p)
    check = next(ln for ln in text.splitlines() if "gpu_build_check.py" in ln and "python" in ln)
    assert check == (" && python /tmp/dtrain-support/gpu_build_check.py torch --cuda=13.0 --cudnn="
                     f"{img.variant.cudnn} --nccl={img.variant.nccl} --companion=torchvision:0.28"), check
    # It runs after the requirements' import check, in the same step.
    lines = text.splitlines()
    assert "check_requirements.py" in lines[lines.index(check) - 1]
    # The check plan: PyPI's torch has no local label, so torchvision's build has none either.
    plan = json.loads(files["check.json"])
    assert plan["flavour"] == ""
    assert "torchvision 0.28.* wheel in --wheelhouse" in plan["companions"]["torchvision"]
    assert "from PyPI" in plan["companions"]["torchvision"]


def test_project_from_a_cpu_or_nvidia_variant_has_no_gpu_check(tmp_path):
    (tmp_path / "requirements.txt").write_text("torchvision\n")
    for spec in (DDP, "pytorch-ddp:2.11.0-cu128-cudnn9-py310-ubuntu22.04"):
        p = pj.plan(tmp_path, spec, IMAGES)
        assert "gpu_build_check.py" not in dict(p.support.files) and pj.companion_check_args(p.base) == []
        assert "gpu_build_check" not in pj.dockerfile(p)


def test_wheelhouse_companion_for_a_wheel_variant_is_pypis_build(tmp_path):
    img = base(WHEEL_GPU)
    comps, _ = pj.companions(pj.applicable("torchvision\n", img), img)
    wheels = ["torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl", TV_CPU,
              "torchvision-0.28.0-cp311-cp311-manylinux_2_28_x86_64.whl"]
    assert pj.companion_wheels(comps, img, wheels) == (["torchvision-0.28.0-cp311-cp311-manylinux_2_28_x86_64.whl"], [])
    assert pj.companion_wheels(comps, img, wheels[:2]) == ([], ["torchvision"])


def test_wheel_project_dockerfile_passes_hadolint(tmp_path):
    (tmp_path / "requirements.txt").write_text("torchvision\n")
    path = tmp_path / "Dockerfile"
    path.write_text(pj.dockerfile(pj.plan(tmp_path, WHEEL_GPU, IMAGES)))
    r = subprocess.run(["hadolint", "--config", str(ROOT / ".hadolint.yaml"), str(path)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_check_script_flags_a_cpu_torchvision_beside_pypis_torch(tmp_path):
    """check_requirements.py with flavour "" (a wheel GPU base): a +cpu torchvision is foreign."""
    spec = __import__("importlib.util").util.spec_from_file_location("cr", ROOT / "images" / "check_requirements.py")
    cr = __import__("importlib.util").util.module_from_spec(spec)
    spec.loader.exec_module(cr)
    site = tmp_path / "site"
    _fake_dist(site, "torchvision", {"torchvision/__init__.py": ""})
    info = site / "torchvision-1.0.dist-info"
    sys.path.insert(0, str(site))
    try:
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\nVersion: 0.28.0+cpu\n")
        assert cr.foreign_companions({"torchvision": "F"}, "") == {"torchvision": "0.28.0+cpu"}
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\nVersion: 0.28.0\n")
        assert cr.foreign_companions({"torchvision": "F"}, "") == {}
        assert cr.foreign_companions({"torchvision": "F"}, "cpu") == {"torchvision": "0.28.0"}
    finally:
        sys.path.remove(str(site))
