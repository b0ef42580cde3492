"""Load image specs (images/<family>.yaml) and check them against images/compat.yaml.

Data flows one way: YAML -> pydantic models (shape: unknown/missing keys, types) ->
compat rules (meaning: versions that work together) -> `Image` objects the renderer uses.
Every problem becomes one line naming the file, line, key and rule; all problems in a
file are reported together in one SpecError.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from dtrain.yamlfile import line_of as yaml_line

IMAGES_DIR = Path(__file__).resolve().parent
COMPAT_FILE = IMAGES_DIR / "compat.yaml"
FAMILIES = ("horovod-tensorflow", "horovod-pytorch", "pytorch-ddp", "ray-train")


class SpecError(Exception):
    """A spec breaks a rule. str() is the user-facing message, one problem per line."""


# ---------------------------------------------------------------- versions


def vtuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def minor(version: str) -> str:
    """'2.18.1' -> '2.18'"""
    return ".".join(version.split(".")[:2])


def same_major_at_least(have: str, want: str) -> bool:
    """'12.6' serves what was built for '12.5' (NVIDIA minor-version compatibility); '11.8' does not."""
    h, w = vtuple(have), vtuple(want)
    return h[0] == w[0] and h >= w


def in_range(version: str, bounds: list[str]) -> bool:
    lo, hi = bounds
    return vtuple(lo) <= vtuple(minor(version)) <= vtuple(hi)


# ---------------------------------------------------------------- models (shape)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Variant(_Strict):
    kind: Literal["gpu", "cpu"]
    os: str
    python: str
    tensorflow: str | None = None
    tf_keras: str | None = None
    pytorch: str | None = None
    horovod: str | None = None
    ray: str | None = None
    # GPU only. cuda_from: where CUDA, cuDNN and NCCL come from: "nvidia" (default; the
    # nvidia/cuda base and NVIDIA's apt packages) or "wheels" (the framework's own PyPI
    # nvidia-* wheels on the plain OS base: compat.yaml cuda_wheels pins them).
    cuda_from: Literal["nvidia", "wheels"] | None = None
    cuda: str | None = None
    cudnn: str | None = None
    nccl: str | None = None
    efa_installer: str | None = None
    aws_ofi_nccl: str | None = None
    nccl_tests: str | None = None  # NVIDIA/nccl-tests release: all_reduce_perf (dtrain doctor --bandwidth)
    py_spy: str | None = None  # py-spy (PyPI): a hang's stack dump (dtrain launch --hang-timeout)
    targets: list[str] | None = None
    # Recorded image size in GiB (docs/benchmarks.md); `dtrain build` fails past
    # SIZE_BUDGET_FACTOR times it, as AWS Deep Learning Containers do.
    size_gib: float | None = None


class FamilySpec(_Strict):
    family: str
    description: str
    gpu_defaults: dict[str, Any] | None = None  # holds the YAML anchor; not used directly
    variants: list[Variant]


class _CudaBase(_Strict):
    cudnn_tag: str
    cudnn: str
    nccl: str
    os: list[str]
    min_driver: str


class _WheelRow(_Strict):
    """What one framework release's PyPI wheel pins (Requires-Dist ==), compat.yaml cuda_wheels."""
    cuda: str
    cudnn: str
    nccl: str
    min_driver: str
    nvcc: list[str]  # the requirements that bring this CUDA release's nvcc and CCCL (Horovod's NCCL ops)
    nvcc_build_only: list[str]  # distributions of it the builder removes once Horovod is built
    no_nvcc: str | None = None  # nvcc: [] because no nvcc wheel exists for this CUDA: why, and the source
    source: str


class _Gpu(_Strict):
    gpu: str
    sm: int


class _TfRow(_Strict):
    python: list[str]
    cuda: str
    cudnn: str


class _TorchRow(_Strict):
    python: list[str]
    cxx: int
    cuda: list[str]
    numpy: str


class _HorovodRow(_Strict):
    tensorflow: list[str]
    pytorch: list[str]
    keras3_from_tensorflow: str
    sdist_cxx: int
    torch_cxx: int


class _RayRow(_Strict):
    python: list[str]
    pytorch: list[str]


class _PySpyRow(_Strict):
    python: list[str]


class Compat(_Strict):
    os_python: dict[str, str]
    cuda_bases: dict[str, _CudaBase]
    cuda_wheels: dict[str, dict[str, _WheelRow]]  # framework -> exact version -> its wheel pins
    ec2_gpus: dict[str, _Gpu]
    tensorflow: dict[str, _TfRow]
    pytorch: dict[str, _TorchRow]
    torch_wheel_min_sm: dict[str, int]
    torch_companions: dict[str, dict[str, str]]  # torch minor -> {companion: its minor}
    horovod: dict[str, _HorovodRow]
    ray: dict[str, _RayRow]
    py_spy: dict[str, _PySpyRow]


# ---------------------------------------------------------------- the validated image


@dataclass(frozen=True)
class Image:
    """One variant of one family, validated, with everything derived from its pins."""

    family: str
    index: int
    variant: Variant
    compat: Compat
    source: str  # e.g. images/horovod-pytorch.yaml

    @property
    def gpu(self) -> bool:
        return self.variant.kind == "gpu"

    @property
    def wheels(self) -> bool:
        """A GPU variant whose CUDA comes from the framework's PyPI nvidia-* wheels."""
        return self.gpu and self.variant.cuda_from == "wheels"

    @property
    def efa(self) -> bool:
        """The variant carries the EFA stage (EFA installer, aws-ofi-nccl, nccl-tests)."""
        return self.gpu and self.variant.efa_installer is not None

    @property
    def cuda_source(self) -> str:
        """Where the image's CUDA comes from, as the label dtrain.cuda-from says: cpu, nvidia/cuda, wheels."""
        return "cpu" if not self.gpu else ("wheels" if self.wheels else "nvidia/cuda")

    @property
    def wheel_row(self) -> _WheelRow | None:
        """compat.yaml cuda_wheels row of this variant's framework release (wheel variants)."""
        return self.compat.cuda_wheels.get(self.framework, {}).get(self.framework_version)

    @property
    def min_driver(self) -> str:
        if self.wheels:
            row = self.wheel_row
            return row.min_driver if row else ""
        return self.cuda_base.min_driver

    @property
    def framework(self) -> Literal["tensorflow", "pytorch"]:
        return "tensorflow" if self.variant.tensorflow else "pytorch"

    @property
    def framework_version(self) -> str:
        return self.variant.tensorflow or self.variant.pytorch or ""

    @property
    def cuda_mm(self) -> str:
        """'12.8.1' -> '12.8'"""
        return minor(self.variant.cuda or "")

    @property
    def cuda_short(self) -> str:
        """'12.8.1' -> 'cu128', the torch wheel variant name."""
        return "cu" + self.cuda_mm.replace(".", "")

    @property
    def cuda_base(self) -> _CudaBase:
        return self.compat.cuda_bases[self.variant.cuda or ""]

    @property
    def tag(self) -> str:
        v = self.variant
        parts = [self.framework_version]
        if v.horovod:
            parts.append(f"hvd{v.horovod}")
        if v.ray:
            parts.append(f"ray{v.ray}")
        if self.gpu:
            parts += [self.cuda_short, f"cudnn{vtuple(v.cudnn or '0')[0]}"]
        else:
            parts.append("cpu")
        parts += ["py" + v.python.replace(".", ""), v.os]
        return "-".join(parts)

    def nvidia_base(self, flavour: Literal["devel", "runtime"]) -> str:
        v = self.variant
        return f"nvidia/cuda:{v.cuda}-{self.cuda_base.cudnn_tag}-{flavour}-{v.os}"

    @property
    def horovod_cxx(self) -> int:
        """C++ standard Horovod's torch extension is compiled with (the sdist patch)."""
        if not self.variant.horovod or self.framework != "pytorch":
            return 0
        row = self.compat.horovod[self.variant.horovod]
        torch_cxx = self.compat.pytorch[minor(self.framework_version)].cxx
        return row.sdist_cxx if torch_cxx <= row.sdist_cxx else row.torch_cxx


# ---------------------------------------------------------------- YAML with line numbers (dtrain/yamlfile.py)


def _fmt_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _read_yaml(path: Path) -> tuple[Any, yaml.Node | None]:
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError(f"{path}: cannot read: {e.strerror}") from None
    try:
        return yaml.safe_load(text), yaml.compose(text)
    except yaml.YAMLError as e:
        raise SpecError(f"{path}: not valid YAML: {e}") from None


def _shape_errors(err: ValidationError, label: str, root: yaml.Node | None) -> list[str]:
    out = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if p not in ("gpu", "cpu"))
        line = yaml_line(root, loc) or yaml_line(root, loc[:-1])
        where = f"{label}:{line}" if line else label
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif e["type"] == "missing":
            msg = "missing key"
        else:
            msg = e["msg"]
        out.append(f"{where}: {_fmt_loc(loc)}: {msg}")
    return out


# ---------------------------------------------------------------- loading


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(IMAGES_DIR.parent))
    except ValueError:
        return str(path)


def load_compat(path: Path = COMPAT_FILE) -> Compat:
    data, root = _read_yaml(path)
    try:
        return Compat.model_validate(data)
    except ValidationError as e:
        raise SpecError("\n".join(_shape_errors(e, _rel(path), root))) from None


def load_family(path: Path, compat: Compat | None = None) -> list[Image]:
    """Load and validate one family file; raise SpecError listing every problem."""
    compat = compat or load_compat()
    label = _rel(path)
    data, root = _read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError(f"{label}: expected a mapping with keys family, description, variants")
    try:
        spec = FamilySpec.model_validate(data)
    except ValidationError as e:
        raise SpecError("\n".join(_shape_errors(e, label, root))) from None

    problems: list[str] = []
    if spec.family != path.stem:
        problems.append(f"{label}:{yaml_line(root, ('family',))}: family: "
                        f"'{spec.family}' must match the file name '{path.stem}'")
    images = [Image(spec.family, i, v, compat, label) for i, v in enumerate(spec.variants)]
    for img in images:
        for key, rule, msg in check_variant(img):
            loc = ("variants", img.index) + ((key,) if key else ())
            line = yaml_line(root, loc)
            where = f"{label}:{line}" if line else label
            problems.append(f"{where}: {_fmt_loc(loc)}: [{rule}] {msg}")
    seen: dict[str, int] = {}
    for img in images:
        if img.tag in seen:
            problems.append(f"{label}: variants[{img.index}]: [unique-tag] tag {img.tag} "
                            f"is also produced by variants[{seen[img.tag]}]")
        seen.setdefault(img.tag, img.index)
    if problems:
        raise SpecError("\n".join(problems))
    return images


def family_path(family: str) -> Path:
    return IMAGES_DIR / f"{family}.yaml"


def load_all(families: list[str] | None = None) -> list[Image]:
    """Every image of the given families (all by default), validated."""
    compat = load_compat()
    names = families or list(FAMILIES)
    unknown = [f for f in names if f not in FAMILIES]
    if unknown:
        raise SpecError(f"unknown image family {', '.join(unknown)}; known: {', '.join(FAMILIES)}")
    out: list[Image] = []
    errors: list[str] = []
    for name in names:
        try:
            out += load_family(family_path(name), compat)
        except SpecError as e:
            errors.append(str(e))
    if errors:
        raise SpecError("\n".join(errors))
    return out


def efa_variant(family: str, instance_type: str) -> str | None:
    """The image to use on an EFA instance type: the first variant of `family` with the EFA
    stage whose targets hold the type's family ('p4d.24xlarge' -> p4d), as dtrain/FAMILY:TAG;
    None when there is none (or the family is unknown)."""
    if family not in FAMILIES:
        return None
    kind = instance_type.split(".")[0]
    for img in load_family(family_path(family)):
        if img.efa and kind in (img.variant.targets or []):
            return f"dtrain/{img.family}:{img.tag}"
    return None


# ---------------------------------------------------------------- size budget

SIZE_BUDGET_FACTOR = 1.2
GIB = 1024**3


def size_over_budget(ref: str, size_bytes: int, recorded_gib: float | None,
                     factor: float = SIZE_BUDGET_FACTOR) -> str | None:
    """None when the image is within `factor` x its recorded size (or none is recorded),
    else the message naming the image, its size and the budget."""
    if recorded_gib is None:
        return None
    budget = recorded_gib * factor
    if size_bytes <= budget * GIB:
        return None
    return (f"{ref} is {size_bytes / GIB:.2f} GiB, over its budget of {budget:.2f} GiB "
            f"({factor:g} x the recorded size_gib {recorded_gib:g} in its images/*.yaml variant); "
            "find what grew (a CUDA framework wheel in a CPU image?) or, if the growth is wanted, "
            "record the new size")


# ---------------------------------------------------------------- rules (meaning)

Problem = tuple[str | None, str, str]  # (key in the variant, rule name, message)

_GPU_KEYS = ("cuda", "cudnn", "nccl", "efa_installer", "aws_ofi_nccl", "nccl_tests", "targets")
# The EFA stage: what an nvidia/cuda variant adds and a wheel variant leaves out.
_EFA_KEYS = ("efa_installer", "aws_ofi_nccl", "nccl_tests")
_FAMILY_KEYS = {
    "horovod-tensorflow": ({"tensorflow", "horovod"}, {"pytorch", "ray"}),
    "horovod-pytorch": ({"pytorch", "horovod"}, {"tensorflow", "tf_keras", "ray"}),
    "pytorch-ddp": ({"pytorch"}, {"tensorflow", "tf_keras", "horovod", "ray"}),
    "ray-train": ({"pytorch", "ray"}, {"tensorflow", "tf_keras", "horovod"}),
}


def check_variant(img: Image) -> list[Problem]:
    """Every rule of compat.yaml that this variant breaks. Stops early only where later
    rules would be meaningless (an unknown version has no row to check against)."""
    v, c = img.variant, img.compat
    out: list[Problem] = []

    required, forbidden = _FAMILY_KEYS.get(img.family, (set(), set()))
    for key in sorted(required):
        if getattr(v, key) is None:
            out.append((None, "family", f"{img.family} images need '{key}'"))
    for key in sorted(forbidden):
        if getattr(v, key) is not None:
            out.append((key, "family", f"{img.family} images do not take '{key}'"))
    for key in _GPU_KEYS:
        if img.wheels and key in _EFA_KEYS:
            if getattr(v, key) is not None:
                out.append((key, "wheels", f"'cuda_from: wheels' variants carry no EFA stage: drop "
                            f"'{key}' (the EFA installer, aws-ofi-nccl and nccl-tests are built on "
                            "the nvidia/cuda base: use cuda_from: nvidia for EFA)"))
            continue
        if img.gpu and getattr(v, key) is None:
            out.append((None, "gpu", f"GPU variants need '{key}'"))
        if not img.gpu and getattr(v, key) is not None:
            out.append((key, "cpu", f"CPU variants do not take '{key}'"))
    if not img.gpu and v.cuda_from is not None:
        out.append(("cuda_from", "cpu", "CPU variants do not take 'cuda_from'"))
    if v.size_gib is not None and not 0.01 <= v.size_gib <= 100:
        out.append(("size_gib", "size-budget", f"size_gib {v.size_gib:g}: expected the image's "
                    "recorded size in GiB, between 0.01 and 100"))
    if out:
        return out

    if v.os not in c.os_python:
        return [("os", "compat.os_python", f"unknown OS '{v.os}'; known: {', '.join(c.os_python)}")]
    if v.python != c.os_python[v.os]:
        out.append(("python", "compat.os_python",
                    f"{v.os} ships Python {c.os_python[v.os]}, not {v.python}"))
    if img.wheels:
        out += _check_cuda_wheels(img)
    elif img.gpu:
        out += _check_cuda(img)
    if v.tensorflow:
        out += _check_tensorflow(img)
    if v.pytorch:
        out += _check_pytorch(img)
    if v.horovod:
        out += _check_horovod(img)
    if v.ray:
        out += _check_ray(img)
    if v.py_spy:
        out += _check_py_spy(img)
    return out


def _check_cuda(img: Image) -> list[Problem]:
    v, c = img.variant, img.compat
    assert v.cuda and v.cudnn and v.nccl and v.targets is not None
    if v.cuda not in c.cuda_bases:
        return [("cuda", "compat.cuda_bases",
                 f"no nvidia/cuda base image for CUDA {v.cuda}; known: {', '.join(c.cuda_bases)}")]
    base = c.cuda_bases[v.cuda]
    out: list[Problem] = []
    if v.os not in base.os:
        out.append(("os", "compat.cuda_bases",
                    f"nvidia/cuda:{v.cuda}-{base.cudnn_tag}-runtime-{v.os} does not exist "
                    f"(CUDA {v.cuda} comes for {', '.join(base.os)})"))
    if not same_major_at_least(v.cudnn, base.cudnn):
        out.append(("cudnn", "compat.cuda_bases",
                    f"cuDNN {v.cudnn} cannot replace the {base.cudnn} in the CUDA {v.cuda} base "
                    f"(same major, same or newer)"))
    if not same_major_at_least(v.nccl, base.nccl):
        out.append(("nccl", "compat.cuda_bases",
                    f"NCCL {v.nccl} is older than the {base.nccl} in the CUDA {v.cuda} base"))
    for t in v.targets:
        if t not in c.ec2_gpus:
            out.append(("targets", "compat.ec2_gpus",
                        f"unknown EC2 instance family '{t}'; known: {', '.join(c.ec2_gpus)}"))
    return out


def _check_cuda_wheels(img: Image) -> list[Problem]:
    """A wheel variant's CUDA, cuDNN and NCCL are what its framework's wheel requires, exactly:
    pip installs those, so any other pin names a build that does not exist."""
    v, c = img.variant, img.compat
    assert v.cuda and v.cudnn and v.nccl and v.targets is not None
    out: list[Problem] = []
    for t in v.targets:
        if t not in c.ec2_gpus:
            out.append(("targets", "compat.ec2_gpus",
                        f"unknown EC2 instance family '{t}'; known: {', '.join(c.ec2_gpus)}"))
    fw, version = img.framework, img.framework_version
    name = {"pytorch": "PyTorch", "tensorflow": "TensorFlow"}[fw]
    row = img.wheel_row
    if row is None:
        known = ", ".join(c.cuda_wheels.get(fw, {})) or "none"
        return out + [(fw, "compat.cuda_wheels",
                       f"{name} {version} has no row in compat.yaml cuda_wheels.{fw} (known: {known}): "
                       "add the CUDA, cuDNN and NCCL its PyPI wheel requires (Requires-Dist), with the source")]
    if v.horovod and not row.nvcc:
        out.append(("horovod", "compat.cuda_wheels",
                    f"Horovod's NCCL ops are compiled with nvcc, and {name} {version}'s CUDA wheels have "
                    f"none ({row.no_nvcc or 'no nvcc in cuda_wheels'}): build Horovod with {name} on "
                    "GPU from an nvidia/cuda variant (cuda_from: nvidia)"))
    what = {"cuda": ("CUDA", row.cuda), "cudnn": ("cuDNN", row.cudnn), "nccl": ("NCCL", row.nccl)}
    for key, (label, want) in what.items():
        have = getattr(v, key)
        if have != want:
            out.append((key, "compat.cuda_wheels",
                        f"{name} {version}'s wheels bring {label} {want}, not {have}: no wheel set "
                        f"gives {label} {have} with it (source: {row.source})"))
    return out


def _framework_row(img: Image, key: str, name: str, table: dict) -> tuple[Any, list[Problem]]:
    """The compat row of the variant's framework version, and the Python range check."""
    version = getattr(img.variant, key)
    row = table.get(minor(version))
    if row is None:
        return None, [(key, f"compat.{key}", f"{name} {version} is not in compat.yaml (known: {', '.join(table)})")]
    py = img.variant.python
    if in_range(py, row.python):
        return row, []
    return row, [("python", f"compat.{key}",
                  f"{name} {minor(version)} supports Python {row.python[0]}-{row.python[1]}, not {py}")]


def _check_tensorflow(img: Image) -> list[Problem]:
    v, c = img.variant, img.compat
    row, out = _framework_row(img, "tensorflow", "TensorFlow", c.tensorflow)
    if row is None:
        return out
    if img.gpu and (img.wheels or v.cuda in c.cuda_bases):
        if not same_major_at_least(img.cuda_mm, row.cuda):
            out.append(("cuda", "compat.tensorflow",
                        f"TensorFlow {minor(v.tensorflow)} was built with CUDA {row.cuda}; CUDA {v.cuda} "
                        f"is not compatible (needs CUDA {vtuple(row.cuda)[0]}.x, at least {row.cuda})"))
        if not same_major_at_least(minor(v.cudnn or "0.0"), row.cudnn):
            out.append(("cudnn", "compat.tensorflow",
                        f"TensorFlow {minor(v.tensorflow)} was built with cuDNN {row.cudnn}; "
                        f"cuDNN {v.cudnn} is not compatible"))
    return out


def _check_pytorch(img: Image) -> list[Problem]:
    v, c = img.variant, img.compat
    row, out = _framework_row(img, "pytorch", "PyTorch", c.pytorch)
    if row is None:
        return out
    if img.gpu and (img.wheels or v.cuda in c.cuda_bases):
        if img.cuda_mm not in row.cuda:
            out.append(("cuda", "compat.pytorch",
                        f"PyTorch {minor(v.pytorch)} has no wheel for CUDA {img.cuda_mm} "
                        f"(wheels: {', '.join(row.cuda)})"))
        min_sm = c.torch_wheel_min_sm.get(img.cuda_short)
        for t in v.targets or []:
            gpu = c.ec2_gpus.get(t)
            if gpu and min_sm is not None and gpu.sm < min_sm:
                out.append(("targets", "compat.torch_wheel_min_sm",
                            f"{img.cuda_short} torch wheels start at sm_{min_sm}; target {t} "
                            f"({gpu.gpu}, sm_{gpu.sm}) would have no kernels"))
    return out


def _check_horovod(img: Image) -> list[Problem]:
    v, c = img.variant, img.compat
    assert v.horovod
    row = c.horovod.get(v.horovod)
    if row is None:
        return [("horovod", "compat.horovod",
                 f"Horovod {v.horovod} is not in compat.yaml (known: {', '.join(c.horovod)})")]
    out: list[Problem] = []
    fw, version = img.framework, img.framework_version
    bounds = row.tensorflow if fw == "tensorflow" else row.pytorch
    if not in_range(version, bounds):
        out.append((fw, "compat.horovod",
                    f"Horovod {v.horovod} builds against {fw} {bounds[0]}-{bounds[1]}, not {version}"))
    if v.tensorflow:
        keras3 = vtuple(minor(v.tensorflow)) >= vtuple(row.keras3_from_tensorflow)
        if keras3 and not v.tf_keras:
            out.append(("tensorflow", "compat.horovod.keras3",
                        f"TensorFlow {v.tensorflow} ships Keras 3, which Horovod {v.horovod} does not "
                        f"support: pin tf_keras: \"{minor(v.tensorflow)}.x\" (Keras 2, used with "
                        f"TF_USE_LEGACY_KERAS=1) or use TensorFlow < {row.keras3_from_tensorflow}"))
        if v.tf_keras and not keras3:
            out.append(("tf_keras", "compat.horovod.keras3",
                        f"TensorFlow {v.tensorflow} still has Keras 2 built in; drop tf_keras"))
        if v.tf_keras and keras3 and minor(v.tf_keras) != minor(v.tensorflow):
            out.append(("tf_keras", "compat.horovod.keras3",
                        f"tf_keras {v.tf_keras} does not match TensorFlow {minor(v.tensorflow)}"))
    return out


def _check_py_spy(img: Image) -> list[Problem]:
    v, c = img.variant, img.compat
    row = c.py_spy.get(v.py_spy or "")
    if row is None:
        return [("py_spy", "compat.py_spy", f"py-spy {v.py_spy} is not in compat.yaml (known: {', '.join(c.py_spy)})")]
    if not in_range(v.python, row.python):
        return [("py_spy", "compat.py_spy",
                 f"py-spy {v.py_spy} reads Python {row.python[0]}-{row.python[1]}, not {v.python}")]
    return []


def _check_ray(img: Image) -> list[Problem]:
    v, c = img.variant, img.compat
    assert v.ray and v.pytorch
    row = c.ray.get(v.ray)
    if row is None:
        return [("ray", "compat.ray", f"Ray {v.ray} is not in compat.yaml (known: {', '.join(c.ray)})")]
    out: list[Problem] = []
    if not in_range(v.python, row.python):
        out.append(("python", "compat.ray",
                    f"Ray {v.ray} has wheels for Python {row.python[0]}-{row.python[1]}, not {v.python}"))
    if not in_range(v.pytorch, row.pytorch):
        out.append(("pytorch", "compat.ray",
                    f"Ray Train {v.ray} is tested with PyTorch {row.pytorch[0]}-{row.pytorch[1]}, not {v.pytorch}"))
    return out
