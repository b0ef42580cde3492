#!/usr/bin/env python3
"""Check a GPU image whose CUDA comes from the framework's PyPI wheels, without a GPU (issue 50).

Usage: gpu_build_check.py torch|tensorflow --cuda=MAJOR.MINOR --cudnn=X.Y.Z[.B] --nccl=X.Y.Z [--horovod]
                          [--companion=NAME:MINOR ...]

- the framework is its CUDA build, built with the pinned CUDA major.minor, cuDNN and NCCL
  (torch.version.cuda, torch.backends.cudnn.version(), torch.cuda.nccl.version(); TensorFlow's
  build info), and Horovod (--horovod) has its NCCL ops (nccl_built());
- each torch companion (--companion=torchvision:0.28, in a project image built from a wheel
  variant: images/project.py), when installed, is the minor built for this torch, has torch's
  local version label (none for PyPI's CUDA torch), and imports (a torchvision built for another
  torch fails with "operator torchvision::nms does not exist");
- every shared library of the framework's (and Horovod's), and what they link from the nvidia-*
  wheels, resolves (`ldd`: no
  "not found"), except the driver's own libraries, which the NVIDIA container toolkit mounts
  from the host when the container starts (DRIVER_LIBS).

No GPU is needed: nothing here creates a CUDA context. Prints one line per check; exit 0
when all pass, 1 with one line per problem (stderr) otherwise.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import sysconfig

# Libraries of the NVIDIA driver: on a GPU node the container toolkit mounts them into the
# container; an image must not carry them (they must match the host's kernel module).
DRIVER_LIBS = ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so", "libnvidia-nvvm.so")


def _parse(argv: list[str]) -> tuple[str, dict[str, str], bool, dict[str, str]]:
    usage = (f"usage: {os.path.basename(argv[0])} torch|tensorflow --cuda=X.Y --cudnn=V --nccl=V [--horovod] "
             "[--companion=NAME:MINOR ...]")
    if len(argv) < 2 or argv[1] not in ("torch", "tensorflow"):
        raise SystemExit(usage)
    pins: dict[str, str] = {}
    companions: dict[str, str] = {}
    horovod = False
    for arg in argv[2:]:
        key, eq, value = arg.partition("=")
        if arg == "--horovod":
            horovod = True
        elif eq and key == "--companion" and value.count(":") == 1 and all(value.split(":")):
            name, want = value.split(":")
            companions[name] = want
        elif eq and key in ("--cuda", "--cudnn", "--nccl") and value:
            pins[key[2:]] = value
        else:
            raise SystemExit(usage)
    if set(pins) != {"cuda", "cudnn", "nccl"} or (companions and argv[1] != "torch"):
        raise SystemExit(usage)
    return argv[1], pins, horovod, companions


def _vt(version: str, n: int) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:n])


def cudnn_int(version: str) -> int:
    """'9.20.0.48' -> 92000 and '8.9.4.25' -> 8904: what cudnnGetVersion() returns
    (cuDNN 9: major*10000 + minor*100 + patch; cuDNN 8: major*1000 + minor*100 + patch)."""
    major, minor_, patch = _vt(version, 3)
    return major * (10000 if major >= 9 else 1000) + minor_ * 100 + patch


def torch_problems(pins: dict[str, str]) -> list[str]:
    import torch

    out = []
    print(f"torch {torch.__version__}: CUDA {torch.version.cuda}")
    if torch.version.cuda is None:
        return [f"torch {torch.__version__} is the CPU build, not the CUDA {pins['cuda']} one"]
    if _vt(torch.version.cuda, 2) != _vt(pins["cuda"], 2):
        out.append(f"torch.version.cuda is {torch.version.cuda}, the pin says {pins['cuda']}")
    cudnn = torch.backends.cudnn.version()
    print(f"cuDNN {cudnn}")
    if cudnn != cudnn_int(pins["cudnn"]):
        out.append(f"torch.backends.cudnn.version() is {cudnn}, the pin {pins['cudnn']} is {cudnn_int(pins['cudnn'])}")
    nccl = torch.cuda.nccl.version()
    print(f"NCCL {'.'.join(map(str, nccl))}")
    if tuple(nccl) != _vt(pins["nccl"], 3):
        out.append(f"torch.cuda.nccl.version() is {nccl}, the pin says {pins['nccl']}")
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_nccl_available()):
        out.append("torch.distributed has no NCCL backend")
    return out


def tensorflow_problems(pins: dict[str, str]) -> list[str]:
    import tensorflow as tf

    info = tf.sysconfig.get_build_info()
    print(f"tensorflow {tf.__version__}: CUDA {info.get('cuda_version')}, cuDNN {info.get('cudnn_version')}")
    if not info.get("is_cuda_build"):
        return [f"tensorflow {tf.__version__} is not a CUDA build"]
    out = []
    if _vt(str(info.get("cuda_version", "0.0")), 2) != _vt(pins["cuda"], 2):
        out.append(f"TensorFlow was built with CUDA {info.get('cuda_version')}, the pin says {pins['cuda']}")
    if _vt(str(info.get("cudnn_version", "0")), 1) != _vt(pins["cudnn"], 1):
        out.append(f"TensorFlow was built with cuDNN {info.get('cudnn_version')}, the pin says {pins['cudnn']}")
    return out


def companion_problem(name: str, want: str, version: str, torch_version: str) -> str | None:
    """One companion's version against the image's torch: the minor built for it (compat.yaml
    torch_companions) and torch's local label ('2.13.0': none, '2.13.0+cpu': cpu); None when it fits."""
    label, mine = torch_version.partition("+")[2], version.partition("+")[2]
    if ".".join(version.partition("+")[0].split(".")[:2]) != want:
        return f"{name} {version} is not {want}.*, the {name} built for torch {torch_version}"
    if mine != label:
        return (f"{name} {version} is the {mine or 'PyPI'} build, the image's torch {torch_version} the "
                f"{label or 'PyPI'} one")
    return None


def companions_problems(companions: dict[str, str]) -> list[str]:
    import importlib.metadata as md

    import torch

    out = []
    for name, want in companions.items():
        try:
            version = md.version(name)
        except md.PackageNotFoundError:
            print(f"{name}: not installed")
            continue
        problem = companion_problem(name, want, version, torch.__version__)
        if problem is None:
            try:
                module = importlib.import_module(name)
                print(f"{name} {getattr(module, '__version__', version)}: matches torch {torch.__version__}")
            except BaseException as e:  # noqa: BLE001 - any failure to import is the finding
                problem = f"import {name} fails: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
        if problem:
            out.append(problem)
    return out


def horovod_problems(framework: str) -> list[str]:
    hvd = importlib.import_module("horovod.torch" if framework == "torch" else "horovod.tensorflow")
    print(f"horovod: nccl_built={hvd.nccl_built()} mpi_built={hvd.mpi_built()}")
    return [] if hvd.nccl_built() else ["Horovod was built without NCCL ops (HOROVOD_GPU_OPERATIONS=NCCL)"]


def shared_libraries(framework: str, more: tuple[str, ...] = ()) -> list[str]:
    """The framework's (and Horovod's) shared objects, extension modules included: what the
    framework loads; ldd follows them into the nvidia-* wheels (their RUNPATH)."""
    site = sysconfig.get_paths()["purelib"]
    roots = [os.path.join(site, d) for d in (framework, "horovod", *more) if os.path.isdir(os.path.join(site, d))]
    found = []
    for root in roots:
        for folder, _, files in os.walk(root):
            found += [os.path.join(folder, f) for f in files if f.endswith(".so") or ".so." in f]
    return sorted(found)


def unresolved(ldd_output: str) -> list[str]:
    """The libraries `ldd` reports "not found", the driver's own left out."""
    out = []
    for line in ldd_output.splitlines():
        name, _, rest = line.strip().partition(" => ")
        if rest.strip() == "not found" and not name.startswith(DRIVER_LIBS):
            out.append(name)
    return out


def ldd_problems(framework: str, more: tuple[str, ...] = ()) -> list[str]:
    libs = shared_libraries(framework, more)
    out = []
    for lib in libs:
        r = subprocess.run(["ldd", lib], capture_output=True, text=True)
        missing = unresolved(r.stdout)
        if missing:
            out.append(f"ldd {lib}: not found: {', '.join(missing)}")
    print(f"ldd: {len(libs)} shared libraries, {len(out)} with a library not found")
    if not libs:
        out.append(f"no shared library found under {framework}/ in site-packages")
    return out


def main(argv: list[str]) -> int:
    framework, pins, horovod, companions = _parse(argv)
    problems = torch_problems(pins) if framework == "torch" else tensorflow_problems(pins)
    if horovod:
        problems += horovod_problems(framework)
    problems += companions_problems(companions)
    problems += ldd_problems(framework, tuple(companions))
    for p in problems:
        print(f"error: GPU image check: {p}", file=sys.stderr)
    if not problems:
        print(f"{framework}: CUDA {pins['cuda']}, cuDNN {pins['cudnn']}, NCCL {pins['nccl']}: ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
