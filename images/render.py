"""Render validated image specs into dockerfiles/<family>/<tag>/Dockerfile.

`context(img)` is a pure function from an Image to the template's variables; `render(img)`
fills templates/Dockerfile.j2; `write_all()` writes every file and removes stale ones.
Output is deterministic: the same pins give byte-identical Dockerfiles.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2

from dtrain import contract, shipped
from dtrain.images.spec import Image, load_all, minor, vtuple

from dtrain import ROOT
TEMPLATES = ROOT / "templates"
OUTPUT = ROOT / "dockerfiles"
REPO_PREFIX = "dtrain"  # local image names: dtrain/<family>:<tag>
CPU_BASE = "debian:bookworm-slim"  # CPU default base; `dtrain build --base-image` overrides it

# Wheel GPU variants: the CUDA home the builder assembles from the nvidia-* wheels (Horovod's build).
CUDA_WHEELS_HOME = "/opt/cuda-wheels"
_BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _env(img: Image) -> dict[str, str]:
    """The image's environment. Values are literal (no $VAR) so sshd's SetEnv can repeat them."""
    if img.gpu and not img.wheels:
        path = ("/opt/venv/bin:/opt/amazon/openmpi/bin:/opt/amazon/efa/bin:"
                "/usr/local/nvidia/bin:/usr/local/cuda/bin:" + _BASE_PATH)
        ld = ("/opt/aws-ofi-nccl/lib:/opt/amazon/openmpi/lib:/opt/amazon/efa/lib:"
              "/usr/local/cuda/lib64:/usr/local/nvidia/lib:/usr/local/nvidia/lib64")
    else:
        path = "/opt/venv/bin:" + _BASE_PATH
        ld = "/usr/lib/x86_64-linux-gnu/openmpi/lib"
    env = {
        "PATH": path,
        "LD_LIBRARY_PATH": ld,
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        # Open MPI refuses root without these; containers run as root.
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        # Shared-memory transport without CMA (process_vm_readv), which containers forbid.
        "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
        # One BLAS/OpenMP thread per rank: avoids "BLAS : Program is Terminated. Because you
        # tried to allocate too many memory regions" and oversubscription.
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "GOTO_NUM_THREADS": "1",
        # NCCL never picks the docker bridge or loopback; the launcher narrows it to one NIC.
        "NCCL_SOCKET_IFNAME": "^docker0,lo",
        "NCCL_DEBUG": "WARN",
    }
    if img.variant.tf_keras:
        env["TF_USE_LEGACY_KERAS"] = "1"
    return env


def _cudnn_pkgs(img: Image, dev: bool) -> list[str]:
    v = img.variant
    assert v.cudnn
    major = vtuple(v.cudnn)[0]
    if major >= 9:  # cuDNN 9 packages are per CUDA major: libcudnn9-cuda-12=9.5.1.17-1
        cuda_major = vtuple(v.cuda or "0")[0]
        names = [f"libcudnn9-cuda-{cuda_major}"] + ([f"libcudnn9-dev-cuda-{cuda_major}"] if dev else [])
        return [f"{n}={v.cudnn}-1" for n in names]
    names = [f"libcudnn{major}"] + ([f"libcudnn{major}-dev"] if dev else [])
    return [f"{n}={v.cudnn}-1+cuda{img.cuda_mm}" for n in names]


def _nccl_pkgs(img: Image, dev: bool) -> list[str]:
    pin = f"{img.variant.nccl}-1+cuda{img.cuda_mm}"
    return [f"libnccl2={pin}"] + ([f"libnccl-dev={pin}"] if dev else [])


def _horovod_build_env(img: Image) -> dict[str, str]:
    fw = img.framework
    env = {
        "HOROVOD_WITH_MPI": "1",
        "HOROVOD_WITHOUT_GLOO": "1",
        "HOROVOD_WITHOUT_MXNET": "1",
        "HOROVOD_WITH_TENSORFLOW" if fw == "tensorflow" else "HOROVOD_WITHOUT_TENSORFLOW": "1",
        "HOROVOD_WITH_PYTORCH" if fw == "pytorch" else "HOROVOD_WITHOUT_PYTORCH": "1",
    }
    if img.gpu:
        sms = sorted({img.compat.ec2_gpus[t].sm for t in img.variant.targets or []})
        env |= {
            "HOROVOD_GPU_OPERATIONS": "NCCL",
            "HOROVOD_NCCL_LINK": "SHARED",
            "HOROVOD_CUDA_HOME": CUDA_WHEELS_HOME if img.wheels else "/usr/local/cuda",
            "HOROVOD_BUILD_CUDA_CC_LIST": ",".join(str(s) for s in sms),
        }
        if img.wheels:
            env["HOROVOD_NCCL_HOME"] = CUDA_WHEELS_HOME
            # Horovod asks torch whether it is a CUDA build (horovod/cmake/Modules/FindPytorch.cmake:
            # torch.version.cuda and torch.utils.cpp_extension.CUDA_HOME, which reads CUDA_HOME).
            env["CUDA_HOME"] = CUDA_WHEELS_HOME
    return dict(sorted(env.items()))


def _labels(img: Image) -> dict[str, str]:
    v = img.variant
    labels = {
        "org.opencontainers.image.description": _description(img),
        "org.opencontainers.image.version": img.tag,
        "org.opencontainers.image.vendor": "dtrain",
        "org.opencontainers.image.licenses": "Apache-2.0",
        "dtrain.family": img.family,
        contract.LABEL_KIND: v.kind,
        "dtrain.os": v.os,
        contract.LABEL_SSH_PORT: str(contract.SSH_PORT),
        contract.LABEL_OPENMPI_MAJOR: "4",
        f"{contract.LABEL_VERSION_PREFIX}python": v.python,
    }
    pins = ["tensorflow", "tf_keras", "pytorch", "horovod", "ray", "cuda", "cudnn", "nccl",
            "efa_installer", "aws_ofi_nccl", "nccl_tests", "py_spy"]
    for key in pins:
        value = getattr(v, key)
        if value:
            labels[f"{contract.LABEL_VERSION_PREFIX}{key.replace('_', '-')}"] = value
    if img.gpu:
        labels[contract.LABEL_MIN_DRIVER] = img.min_driver
        labels["dtrain.targets"] = ",".join(v.targets or [])
    # Which recipe: where CUDA comes from (cpu, nvidia/cuda, wheels) and whether the EFA stage is
    # in (dtrain doctor warns when an image without it runs on an EFA instance type).
    labels[contract.LABEL_CUDA_FROM] = img.cuda_source
    labels[contract.LABEL_EFA] = "yes" if img.efa else "no"
    return labels


def _description(img: Image) -> str:
    fw = {"tensorflow": "TensorFlow", "pytorch": "PyTorch"}[img.framework]
    if img.variant.horovod:
        what = f"Horovod {img.variant.horovod} + {fw}"
    elif img.variant.ray:
        what = f"Ray {img.variant.ray} (Ray Train) + {fw}"
    else:
        what = f"{fw} (torchrun/DDP)"
    where = f"CUDA {img.variant.cuda}" if img.gpu else "CPU"
    if img.wheels:
        where += " (PyPI wheels, no EFA)"
    return f"{what} {img.framework_version}, {where}, Python {img.variant.python}, {img.variant.os}"


def image_repo(img: Image) -> str:
    return f"{REPO_PREFIX}/{img.family}"


def local_ref(img: Any) -> str:
    """The name `dtrain build` gives an image: dtrain/<family>:<tag> (anything with .family, .tag)."""
    return f"{REPO_PREFIX}/{img.family}:{img.tag}"


def torch_flavour(img: Image) -> str:
    """The torch wheel's local version label: 'cpu' or the CUDA variant ('cu128')."""
    return img.cuda_short if img.gpu else "cpu"


def torch_index(img: Image) -> str:
    """The PyTorch index a family image takes torch from when the wheelhouse lacks it; none
    for a wheel GPU variant (PyPI's default torch is the CUDA build the pins name)."""
    if img.wheels:
        return ""
    return f"https://download.pytorch.org/whl/{torch_flavour(img)}"


def train_sources() -> list[tuple[str, list[str]]]:
    """What the images copy to /opt/dtrain/py for SageMaker's `train`: the modules
    launch/node/sagemaker_train.py imports (dtrain/shipped.py), as (folder under the import
    root, [checkout paths]), one COPY each."""
    by_dir: dict[str, list[str]] = {}
    for m in shipped.shipped_modules(contract.NODE_SCRIPTS / "sagemaker_train.py"):
        by_dir.setdefault(m.rpartition("/")[0], []).append(shipped.checkout_path(m))
    return sorted(by_dir.items())


def gpu_check_args(img: Image) -> list[str]:
    """launch/node/gpu_build_check.py's argv for a wheel variant: the framework (and Horovod's
    module) and the pins its CUDA build must match."""
    v = img.variant
    module = "tensorflow" if img.framework == "tensorflow" else "torch"
    args = [module, f"--cuda={img.cuda_mm}", f"--cudnn={v.cudnn}", f"--nccl={v.nccl}"]
    if v.horovod:
        args.append("--horovod")
    return args


def first_step_modules(img: Image) -> list[str]:
    """What a training script of the family imports first: launch/node/first_reads.py records what
    importing them (and, with torch, one small step) reads from the image, for a lazy node's prefetch."""
    v = img.variant
    if img.framework == "tensorflow":
        return ["tensorflow"] + (["horovod.tensorflow"] if v.horovod else [])
    return ["torch", "torch.distributed"] + (["horovod.torch"] if v.horovod else []) \
        + (["ray", "ray.train.torch"] if v.ray else [])


def context(img: Image) -> dict[str, Any]:
    """Everything the templates need, derived from one validated Image."""
    v = img.variant
    ctx: dict[str, Any] = {
        "img": img,
        "v": v,
        "contract": contract.jinja(),
        "train_sources": train_sources(),
        "first_step_modules": first_step_modules(img),
        "gpu": img.gpu,
        "tag": img.tag,
        "repo": image_repo(img),
        "env": _env(img),
        "labels": _labels(img),
        "wheels": img.wheels,
        "efa": img.efa,
        "cuda_apt": img.gpu and not img.wheels,
        "cuda_wheels_home": CUDA_WHEELS_HOME,  # cuDNN and NCCL from NVIDIA's apt repository
        "runtime_base": img.nvidia_base("runtime") if img.gpu and not img.wheels else CPU_BASE,
        "builder_base": img.nvidia_base("devel") if img.gpu and not img.wheels else CPU_BASE,
    }
    if img.wheels:
        ctx["gpu_check_args"] = gpu_check_args(img)
    if img.gpu and not img.wheels:
        ctx |= {
            "cudnn_pkgs": _cudnn_pkgs(img, dev=True),
            "nccl_pkgs": _nccl_pkgs(img, dev=True),
            "cudnn_runtime_pkgs": _cudnn_pkgs(img, dev=False),
            "nccl_runtime_pkgs": _nccl_pkgs(img, dev=False),
        }
    if img.framework == "tensorflow":
        tf = ("tensorflow[and-cuda]" if img.wheels else "tensorflow") if img.gpu else "tensorflow-cpu"
        first = f'"{tf}=={v.tensorflow}"' if img.wheels else f"{tf}=={v.tensorflow}"  # [and-cuda]: quoted
        ctx["tf_pip"] = [first] + ([f"tf-keras=={v.tf_keras}"] if v.tf_keras else [])
    else:
        ctx["torch_index"] = torch_index(img)
        ctx["torch_pip"] = f"torch==={v.pytorch}" if img.wheels else f"torch=={v.pytorch}"
        ctx["torch_numpy"] = img.compat.pytorch[minor(v.pytorch)].numpy
    if v.horovod:
        ctx |= {
            "horovod_row": img.compat.horovod[v.horovod],
            "horovod_build_env": _horovod_build_env(img),
            "hvd_module": "horovod.tensorflow" if img.framework == "tensorflow" else "horovod.torch",
            "check_build": (["TensorFlow"] if img.framework == "tensorflow" else ["PyTorch"])
            + ["MPI"] + (["NCCL"] if img.gpu else []),
        }
    return ctx


def _jinja() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,  # a missing pin is an error, not an empty string
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render(img: Image) -> str:
    text = _jinja().get_template("Dockerfile.j2").render(context(img))
    # Collapse runs of blank lines left by conditional blocks.
    lines, out = text.splitlines(), []
    for line in lines:
        if line.strip() or (out and out[-1].strip()):
            out.append(line.rstrip())
    return "\n".join(out).strip() + "\n"


def output_path(img: Image, root: Path = OUTPUT) -> Path:
    return root / img.family / img.tag / "Dockerfile"


def render_all(families: list[str] | None = None) -> dict[Path, str]:
    """{path: text} for every image of the given families (all by default)."""
    return {output_path(img): render(img) for img in load_all(families)}


def write_all(families: list[str] | None = None, root: Path = OUTPUT) -> tuple[list[Path], list[Path]]:
    """Write rendered Dockerfiles; remove ones no spec produces any more.
    Returns (changed or new files, removed files)."""
    imgs = load_all(families)
    wanted = {output_path(img, root): render(img) for img in imgs}
    changed = []
    for path, text in wanted.items():
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            changed.append(path)
    removed = []
    for fam in {img.family for img in imgs}:
        for old in sorted((root / fam).glob("*/Dockerfile")):
            if old not in wanted:
                old.unlink()
                old.parent.rmdir() if not any(old.parent.iterdir()) else None
                removed.append(old)
    return changed, removed


__all__ = ["context", "render", "render_all", "write_all", "output_path", "image_repo", "local_ref", "minor"]
