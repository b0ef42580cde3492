"""Rendered Dockerfiles: no drift, deterministic, and every point the images promise."""

from __future__ import annotations

import io
import re
import shlex
import subprocess

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from dtrain.images.render import OUTPUT, ROOT, context, output_path, render, render_all
from dtrain.images.spec import load_all

IMAGES = load_all()
IDS = [f"{i.family}:{i.tag}" for i in IMAGES]


def parse(text: str) -> list[dict]:
    # An in-memory file: without fileobj, setting .content writes ./Dockerfile.
    p = DockerfileParser(fileobj=io.BytesIO())
    p.content = text
    return p.structure


def stages(instrs: list[dict]) -> list[list[dict]]:
    out: list[list[dict]] = []
    for ins in instrs:
        if ins["instruction"] == "FROM":
            out.append([])
        if out:
            out[-1].append(ins)
    return out


BUILDER_STAGES = ("builder-os", "efa-build", "builder")
RUNTIME_STAGES = ("runtime-os", "efa", "runtime")


def sides(instrs: list[dict]) -> list[list[dict]]:
    """[builder side, runtime side]: the instructions of the builder stages (builder-os, the EFA
    stage's build half, builder) and of the runtime stages (runtime-os, the EFA stage, runtime)."""
    out: list[list[dict]] = [[], []]
    for st in stages(instrs):
        name = st[0]["value"].split()[-1]
        assert name in BUILDER_STAGES + RUNTIME_STAGES, name
        out[name in RUNTIME_STAGES] += st
    return out


def stage_names(instrs: list[dict]) -> list[str]:
    return [st[0]["value"].split()[-1] for st in stages(instrs)]


def runs(instrs: list[dict]) -> str:
    return "\n".join(i["value"] for i in instrs if i["instruction"] == "RUN")


def env_of(instrs: list[dict]) -> dict[str, str]:
    env: dict[str, str] = {}
    for i in instrs:
        if i["instruction"] == "ENV":
            for tok in shlex.split(i["value"]):
                k, _, v = tok.partition("=")
                env[k] = v
    return env


def test_no_drift():
    """dockerfiles/ is exactly what `invoke render` writes from images/*.yaml and templates/."""
    rendered = render_all()
    committed = sorted(OUTPUT.glob("*/*/Dockerfile"))
    assert sorted(rendered) == committed, "stale or missing files: run `invoke render`"
    for path, text in rendered.items():
        assert path.read_text() == text, f"{path.relative_to(ROOT)} drifted: run `invoke render`"


def test_deterministic():
    assert [render(i) for i in IMAGES] == [render(i) for i in load_all()]


@pytest.fixture(params=IMAGES, ids=IDS)
def image(request):
    img = request.param
    text = render(img)
    instrs = parse(text)
    return img, text, instrs, sides(instrs)


def test_generated_header(image):
    img, text, _, _ = image
    head = text.splitlines()[:3]
    assert head[0] == "# GENERATED FILE, DO NOT EDIT."
    assert f"Generated from images/{img.family}.yaml" in head[1]
    assert output_path(img) == OUTPUT / img.family / img.tag / "Dockerfile"


def test_multistage_runtime_has_no_compilers(image):
    img, _, instrs, st = image
    efa = ["efa-build"] if img.efa else []
    assert stage_names(instrs) == ["builder-os", *efa, "builder", "runtime-os",
                                   *(["efa"] if img.efa else []), "runtime"]
    builder, runtime = st
    rt = runs(runtime)
    for tool in ("g++", "cmake", "python3-dev", "libopenmpi-dev", "libnccl-dev", "-dev-cuda"):
        assert tool not in rt, f"{tool} in the runtime stage"
    copies = [i["value"] for i in runtime if i["instruction"] == "COPY"]
    assert "--from=builder /opt/venv /opt/venv" in copies
    base_args = [i["value"] for i in parse(render(img)) if i["instruction"] == "ARG"][:2]
    if img.gpu and not img.wheels:
        assert base_args == [f"BASE_IMAGE={img.nvidia_base('runtime')}",
                             f"BUILDER_IMAGE={img.nvidia_base('devel')}"]


def test_sshd_and_ssh_client(image):
    _, _, _, (_, runtime) = image
    rt = runs(runtime)
    sshd = rt.split("> /etc/ssh/sshd_config")[0]
    client = rt.split("> /etc/ssh/sshd_config")[1].split("> /etc/ssh/ssh_config")[0]
    for line in ("Port 2022", "StrictModes no", "PasswordAuthentication no",
                 "PermitRootLogin prohibit-password"):
        assert f"'{line}'" in sshd, line
    for line in ("Port 2022", "StrictHostKeyChecking no", "UserKnownHostsFile /dev/null"):
        assert f"'    {line}'" in client, line
    # Host keys: every RUN that makes them removes them again; the entrypoint makes them.
    # (Installing openssh-server makes them too: a later `rm` would leave them in that layer.)
    for run in [i["value"] for i in runtime if i["instruction"] == "RUN"]:
        if "openssh-server" in run:
            assert "/etc/ssh/ssh_host_*" in run
        if "ssh-keygen" in run:
            assert "rm -f /etc/ssh/ssh_host_*" in run.split("ssh-keygen", 1)[1]
    # One ed25519 host key, made at start (an RSA key costs ~0.6 s of CPU per container).
    assert "'HostKey /etc/ssh/ssh_host_ed25519_key'" in sshd
    entry = (ROOT / "launch/node/entrypoint.sh").read_text()
    assert 'ssh-keygen -q -t ed25519 -N "" -f "$hostkey"' in entry and "ssh-keygen -A" not in entry
    assert "ssh-keygen -A" not in rt


def test_no_private_keys_or_secrets_copied(image):
    _, text, instrs, _ = image
    assert "PRIVATE KEY" not in text
    for i in instrs:
        if i["instruction"] in ("COPY", "ADD"):
            assert not re.search(r"id_(rsa|ed25519|ecdsa)|\.pem|ca-certificates|pip\.conf", i["value"])
    # Secrets only as BuildKit secret mounts.
    assert "/etc/ssl/certs/ca-certificates.crt" not in "\n".join(
        i["value"] for i in instrs if i["instruction"] != "COMMENT")


def test_environment_and_ssh_setenv(image):
    img, _, _, (_, runtime) = image
    env = env_of(runtime)
    assert env["PATH"].startswith("/opt/venv/bin:")
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1" and env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS"):
        assert env[k] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"
    excluded = env["NCCL_SOCKET_IFNAME"].lstrip("^").split(",")
    assert env["NCCL_SOCKET_IFNAME"].startswith("^") and {"docker0", "lo"} <= set(excluded)
    if img.efa:
        assert "/opt/amazon/openmpi/bin" in env["PATH"]
        assert "/opt/aws-ofi-nccl/lib" in env["LD_LIBRARY_PATH"]
    if img.variant.tf_keras:
        assert env["TF_USE_LEGACY_KERAS"] == "1"
    # sshd's SetEnv repeats every ENV variable with the same value (non-interactive ssh).
    setenv = next(i["value"] for i in runtime
                  if i["instruction"] == "RUN" and "00-image-env.conf" in i["value"])
    quoted = dict(tok.split("=", 1) for tok in re.findall(r"'([A-Za-z_][A-Za-z0-9_]*=[^']*)'", setenv))
    assert quoted == env


def test_gpu_pins_efa_and_horovod_nccl(image):
    img, text, _, (builder, runtime) = image
    if not img.gpu:
        assert "nvidia" not in text.lower().replace("/usr/local/nvidia", "")
        return
    v = img.variant
    if img.wheels:  # CUDA from the framework's wheels: no apt CUDA package, no EFA stage
        for word in ("libnccl", "libcudnn", "nvidia/cuda:", "efa", "aws-ofi-nccl", "nccl-tests"):
            assert word not in runs(builder) + runs(runtime), word
        return
    cuda_mm = img.cuda_mm
    assert f"libnccl2={v.nccl}-1+cuda{cuda_mm}" in runs(builder)
    assert f"libnccl2={v.nccl}-1+cuda{cuda_mm}" in runs(runtime)
    assert f"={v.cudnn}-1" in runs(runtime)
    assert f"aws-efa-installer-{v.efa_installer}.tar.gz" in runs(runtime)
    assert f"aws-ofi-nccl-{v.aws_ofi_nccl}.tar.gz" in runs(builder)
    assert "test -f /opt/aws-ofi-nccl/lib/libnccl-net.so" in runs(runtime)
    if v.horovod:
        assert "HOROVOD_GPU_OPERATIONS=NCCL" in runs(builder)
        assert "grep -q '\\[X\\] NCCL'" in runs(runtime)


def test_build_time_smoke_step(image):
    img, _, _, (_, runtime) = image
    rt = runs(runtime)
    if img.variant.horovod:
        assert "horovodrun --check-build" in rt
        module = "horovod.tensorflow" if img.framework == "tensorflow" else "horovod.torch"
        assert f"import {module} as hvd; hvd.init()" in rt
    elif img.variant.ray:
        assert "ray --version" in rt
        assert "from ray.train.torch import TorchTrainer" in rt
    else:
        assert "torchrun --help" in rt
    module = "tensorflow" if img.framework == "tensorflow" else "torch"
    check = "python /tmp/cpu_build_check.py " + module
    assert (check in rt) == (not img.gpu)  # CPU images refuse a CUDA framework build
    if not img.gpu:
        assert "source=launch/node/cpu_build_check.py" in rt
    # Wheel GPU images check their CUDA build against the pins, and ldd, at build time.
    gpu_check = (f"python /tmp/gpu_build_check.py {module} --cuda={img.cuda_mm} "
                 f"--cudnn={img.variant.cudnn} --nccl={img.variant.nccl}")
    assert (gpu_check in rt) == img.wheels
    if img.wheels:
        assert "source=launch/node/gpu_build_check.py" in rt
        assert ("--horovod" in rt) == bool(img.variant.horovod)


def test_pins_in_labels(image):
    img, _, instrs, _ = image
    label = " ".join(i["value"] for i in instrs if i["instruction"] == "LABEL")
    for key in ("title", "description", "version", "revision", "created"):
        assert f"org.opencontainers.image.{key}=" in label
    v = img.variant
    for key in ("tensorflow", "tf_keras", "pytorch", "horovod", "cuda", "cudnn", "nccl",
                "efa_installer", "aws_ofi_nccl", "python"):
        if getattr(v, key):
            assert f'dtrain.version.{key.replace("_", "-")}="{getattr(v, key)}"' in label, key


def test_horovod_torch_cxx_patch():
    img = next(i for i in IMAGES if i.family == "horovod-pytorch" and not i.gpu)
    text = render(img)
    assert "s/CMAKE_CXX_STANDARD 14)/CMAKE_CXX_STANDARD 17)/" in text
    # both places the sdist sets it (raising only the torch one breaks the gloo link)
    assert "horovod-0.28.1/CMakeLists.txt /tmp/hvd/horovod-0.28.1/horovod/torch/CMakeLists.txt" in text
    tf = next(i for i in IMAGES if i.family == "horovod-tensorflow" and not i.gpu)
    assert "CMAKE_CXX_STANDARD" not in render(tf)


def test_cpu_families_share_runtime_base_layers():
    """The first runtime steps of the three CPU images are identical, so layers are shared."""
    cpu = [i for i in IMAGES if not i.gpu]
    prefixes = []
    for img in cpu:
        runtime = sides(parse(render(img)))[1]
        prefixes.append([(i["instruction"], i["value"]) for i in runtime][:6])
    assert prefixes[0] == prefixes[1] == prefixes[2]
    assert any(ins == "RUN" and "openssh-server" in val for ins, val in prefixes[0])


def test_context_has_no_undefined_names():
    for img in IMAGES:
        ctx = context(img)
        assert ctx["tag"] == img.tag


# ---------------------------------------------------------------- hadolint


def hadolint_ignored() -> list[str]:
    return yaml.safe_load((ROOT / ".hadolint.yaml").read_text()).get("ignored", [])


def test_hadolint_ignores_at_most_three_rules_with_reasons():
    ignored = hadolint_ignored()
    assert len(ignored) <= 3
    text = (ROOT / ".hadolint.yaml").read_text()
    for rule in ignored:
        assert re.search(rf"#.*{rule}", text), f"{rule} has no reason"


@pytest.mark.parametrize("img", IMAGES, ids=IDS)
def test_hadolint_passes(img, tmp_path):
    path = tmp_path / "Dockerfile"
    path.write_text(render(img))
    result = subprocess.run(["hadolint", "--config", str(ROOT / ".hadolint.yaml"), str(path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_builders_copied_into_the_images_import_on_their_own(tmp_path):
    """What a rendered Dockerfile copies to /opt/dtrain/py (and .dockerignore lets into the build
    context) is enough for node/sagemaker_train.py's imports: a module the builders import but
    the image lacks would fail every SageMaker job at start (seen: dtrain/values.py)."""
    import fnmatch
    import shutil
    import subprocess
    import sys

    template = render(IMAGES[0])
    allowed = [ln[1:] for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln.startswith("!")]
    copied = 0
    for line in template.splitlines():
        parts = line.split()
        if parts[:1] != ["COPY"] or not parts[-1].startswith("/opt/dtrain/py/"):
            continue
        dest = tmp_path / parts[-1][len("/opt/dtrain/py/"):]
        dest.mkdir(parents=True, exist_ok=True)
        for src in parts[1:-1]:
            assert any(fnmatch.fnmatch(src, a) for a in allowed), f".dockerignore keeps {src} out of the context"
            shutil.copy(ROOT / src, dest)
            copied += 1
    assert copied >= 6
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from dtrain.launch.jobs import container; from dtrain.launch.jobs.launchers import mpirun, torchrun; "
            "from dtrain.launch.remote.hosts import Node; "
            "assert mpirun.__file__.startswith(sys.argv[1]), mpirun.__file__")
    r = subprocess.run([sys.executable, "-S", "-c", code, str(tmp_path)], cwd=tmp_path, capture_output=True,
                       text=True, env={"PATH": "/usr/bin:/bin"}, timeout=60)
    assert r.returncode == 0, r.stderr
