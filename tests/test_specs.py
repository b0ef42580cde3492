"""Spec validation: every kind of bad pin gives one readable message naming file, line, key, rule."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dtrain.images.spec import FAMILIES, SpecError, load_all, load_family

ROOT = Path(__file__).resolve().parent.parent

GPU = {
    "kind": "gpu", "os": "ubuntu22.04", "python": "3.10",
    "efa_installer": "1.38.0", "aws_ofi_nccl": "1.14.0", "nccl_tests": "2.13.13",
}


def write_spec(tmp_path: Path, family: str, variants: list[dict], **top) -> Path:
    doc = {"family": family, "description": "test", "variants": variants, **top}
    path = tmp_path / f"{family}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def error_of(path: Path) -> str:
    with pytest.raises(SpecError) as exc:
        load_family(path)
    return str(exc.value)


def test_shipped_specs_are_valid():
    images = load_all()
    assert {i.family for i in images} == set(FAMILIES)
    min_gpu = {"ray-train": 1}  # one CUDA line for Ray; two for the others
    for fam in FAMILIES:
        kinds = [i.variant.kind for i in images if i.family == fam]
        assert kinds.count("gpu") >= min_gpu.get(fam, 2) and kinds.count("cpu") == 1, fam


def test_tags_spell_the_stack():
    tags = {i.tag for i in load_all()}
    assert "2.3.1-hvd0.28.1-cu121-cudnn8-py310-ubuntu22.04" in tags
    assert "2.13.0-hvd0.28.1-cpu-py311-debian12" in tags
    assert "2.15.1-hvd0.28.1-cpu-py311-debian12" in tags
    assert "2.13.0-cpu-py311-debian12" in tags


def test_tensorflow_on_wrong_cuda(tmp_path):
    path = write_spec(tmp_path, "horovod-tensorflow", [{
        **GPU, "tensorflow": "2.15.1", "horovod": "0.28.1", "cuda": "11.8.0",
        "cudnn": "8.9.6.50", "nccl": "2.15.5", "targets": ["g5"]}])
    msg = error_of(path)
    assert "horovod-tensorflow.yaml:" in msg
    assert "variants[0].cuda: [compat.tensorflow]" in msg
    assert "TensorFlow 2.15 was built with CUDA 12.2" in msg


def test_cu128_torch_wheel_for_p3(tmp_path):
    path = write_spec(tmp_path, "pytorch-ddp", [{
        **GPU, "pytorch": "2.11.0", "cuda": "12.8.1", "cudnn": "9.8.0.87",
        "nccl": "2.25.1", "targets": ["g5", "p3"]}])
    msg = error_of(path)
    assert "variants[0].targets: [compat.torch_wheel_min_sm]" in msg
    assert "target p3 (V100, sm_70)" in msg
    assert "g5" not in msg.split("target")[1].split(")")[0]  # only p3 is named


def test_python_out_of_framework_range(tmp_path):
    path = write_spec(tmp_path, "pytorch-ddp", [{
        "kind": "cpu", "os": "ubuntu20.04", "python": "3.8", "pytorch": "2.9.0"}])
    msg = error_of(path)
    assert "variants[0].python: [compat.pytorch]" in msg
    assert "supports Python 3.10-3.14, not 3.8" in msg


def test_python_not_the_os_python(tmp_path):
    path = write_spec(tmp_path, "pytorch-ddp", [{
        "kind": "cpu", "os": "debian12", "python": "3.10", "pytorch": "2.13.0"}])
    assert "variants[0].python: [compat.os_python] debian12 ships Python 3.11, not 3.10" in error_of(path)


def test_unknown_key_named_with_line(tmp_path):
    path = tmp_path / "pytorch-ddp.yaml"
    path.write_text(
        "family: pytorch-ddp\n"
        "description: test\n"
        "variants:\n"
        "  - kind: cpu\n"
        "    os: debian12\n"
        "    python: '3.11'\n"
        "    pytorch: '2.13.0'\n"
        "    cudaa: '12.8.1'\n")
    msg = error_of(path)
    assert msg == f"{path}:8: variants[0].cudaa: unknown key"


def test_missing_key(tmp_path):
    path = write_spec(tmp_path, "pytorch-ddp", [{"kind": "cpu", "python": "3.11", "pytorch": "2.13.0"}])
    assert "variants[0].os: missing key" in error_of(path)


def test_missing_gpu_pin(tmp_path):
    path = write_spec(tmp_path, "pytorch-ddp", [{
        **GPU, "pytorch": "2.11.0", "cuda": "12.8.1", "cudnn": "9.8.0.87", "targets": ["g5"]}])
    assert "variants[0]: [gpu] GPU variants need 'nccl'" in error_of(path)


def test_base_tag_that_does_not_exist(tmp_path):
    path = write_spec(tmp_path, "pytorch-ddp", [{
        **GPU, "pytorch": "2.4.1", "cuda": "12.3.0", "cudnn": "9.1.0.70",
        "nccl": "2.21.5", "targets": ["g5"]}])
    msg = error_of(path)
    assert "variants[0].cuda: [compat.cuda_bases] no nvidia/cuda base image for CUDA 12.3.0" in msg


def test_base_tag_missing_for_os(tmp_path):
    path = write_spec(tmp_path, "pytorch-ddp", [{
        **GPU, "os": "ubuntu24.04", "python": "3.12", "pytorch": "2.4.1", "cuda": "11.8.0",
        "cudnn": "8.9.6.50", "nccl": "2.15.5", "targets": ["g5"]}])
    msg = error_of(path)
    assert "nvidia/cuda:11.8.0-cudnn8-runtime-ubuntu24.04 does not exist" in msg


def test_keras3_needs_tf_keras(tmp_path):
    path = write_spec(tmp_path, "horovod-tensorflow", [{
        **GPU, "tensorflow": "2.18.1", "horovod": "0.28.1", "cuda": "12.6.3",
        "cudnn": "9.5.1.17", "nccl": "2.23.4", "targets": ["g5"]}])
    msg = error_of(path)
    assert "[compat.horovod.keras3]" in msg and "pin tf_keras" in msg


def test_every_problem_reported_at_once(tmp_path):
    path = write_spec(tmp_path, "horovod-pytorch", [
        {**GPU, "pytorch": "2.11.0", "horovod": "0.28.1", "cuda": "12.8.1",
         "cudnn": "9.8.0.87", "nccl": "2.25.1", "targets": ["p3"]},
        {"kind": "cpu", "os": "debian12", "python": "3.10", "pytorch": "2.13.0", "horovod": "0.28.1"},
    ])
    lines = error_of(path).splitlines()
    assert any("variants[0].targets" in line for line in lines)
    assert any("variants[1].python" in line for line in lines)


def test_duplicate_tags(tmp_path):
    cpu = {"kind": "cpu", "os": "debian12", "python": "3.11", "pytorch": "2.13.0"}
    path = write_spec(tmp_path, "pytorch-ddp", [cpu, cpu])
    assert "[unique-tag] tag 2.13.0-cpu-py311-debian12 is also produced by variants[0]" in error_of(path)


def test_family_must_match_file_name(tmp_path):
    cpu = {"kind": "cpu", "os": "debian12", "python": "3.11", "pytorch": "2.13.0"}
    path = write_spec(tmp_path, "pytorch-ddp", [cpu])
    path.write_text(path.read_text().replace("family: pytorch-ddp", "family: horovod-pytorch"))
    assert "family: 'horovod-pytorch' must match the file name 'pytorch-ddp'" in error_of(path)


def test_family_keys(tmp_path):
    path = write_spec(tmp_path, "pytorch-ddp", [{
        "kind": "cpu", "os": "debian12", "python": "3.11", "pytorch": "2.13.0", "horovod": "0.28.1"}])
    assert "variants[0].horovod: [family] pytorch-ddp images do not take 'horovod'" in error_of(path)


def test_anchored_defaults_report_the_anchor_line(tmp_path):
    """A bad value inherited through a YAML merge key is reported where it is written."""
    path = tmp_path / "pytorch-ddp.yaml"
    path.write_text(
        "family: pytorch-ddp\n"
        "description: test\n"
        "gpu_defaults: &gpu\n"
        "  kind: gpu\n"
        "  os: ubuntu22.04\n"
        "  python: '3.11'\n"
        "  efa_installer: '1.38.0'\n"
        "  aws_ofi_nccl: '1.14.0'\n"
        "  nccl_tests: '2.13.13'\n"
        "variants:\n"
        "  - <<: *gpu\n"
        "    pytorch: '2.11.0'\n"
        "    cuda: '12.8.1'\n"
        "    cudnn: '9.8.0.87'\n"
        "    nccl: '2.25.1'\n"
        "    targets: [g5]\n")
    assert f"{path}:6: variants[0].python: [compat.os_python]" in error_of(path)


# ---------------------------------------------------------------- the CLI


def _copy_project(tmp_path: Path) -> Path:
    dst = tmp_path / "proj"
    for name in ("dtrain", "images", "templates", "launch"):
        shutil.copytree(ROOT / name, dst / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "tasks.py", dst / "tasks.py")
    return dst


def _invoke(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_cli_bad_spec_exits_nonzero_without_traceback(tmp_path):
    proj = _copy_project(tmp_path)
    spec = proj / "images" / "horovod-tensorflow.yaml"
    spec.write_text(spec.read_text().replace('cuda: "12.6.3"', 'cuda: "11.8.0"', 1))
    result = _invoke(proj, "render")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout
    assert "images/horovod-tensorflow.yaml:" in result.stderr
    assert "variants[0].cuda: [compat.tensorflow]" in result.stderr
    assert not (proj / "dockerfiles").exists(), "nothing is written when a spec is invalid"


def test_cli_unknown_family(tmp_path):
    result = _invoke(_copy_project(tmp_path), "render", "--image", "nosuch")
    assert result.returncode != 0
    assert "--image: unknown image family 'nosuch'" in result.stderr
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------- size budget


def test_cpu_variants_record_their_size():
    for img in load_all():
        if not img.gpu:
            assert img.variant.size_gib and 0.5 < img.variant.size_gib < 3, img.tag


@pytest.mark.parametrize("value", [0, -1, 500])
def test_size_budget_out_of_range(tmp_path, value):
    path = write_spec(tmp_path, "pytorch-ddp", [{
        "kind": "cpu", "os": "debian12", "python": "3.11", "pytorch": "2.13.0", "size_gib": value}])
    assert f"variants[0].size_gib: [size-budget] size_gib {value:g}: expected" in error_of(path)


def test_size_budget_not_a_number(tmp_path):
    path = write_spec(tmp_path, "pytorch-ddp", [{
        "kind": "cpu", "os": "debian12", "python": "3.11", "pytorch": "2.13.0", "size_gib": "big"}])
    assert "variants[0].size_gib" in error_of(path)


def test_size_over_budget_is_a_pure_check():
    from dtrain.images.spec import GIB, size_over_budget

    ref = "dtrain/pytorch-ddp:2.13.0-cpu-py311-debian12"
    assert size_over_budget(ref, int(1.11 * GIB), 1.11) is None
    assert size_over_budget(ref, int(1.33 * GIB), 1.11) is None  # within 1.2x (1.332 GiB)
    assert size_over_budget(ref, 5 * GIB, None) is None  # nothing recorded: no budget
    msg = size_over_budget(ref, int(5.1 * GIB), 1.11)
    assert msg and msg.startswith(f"{ref} is 5.10 GiB, over its budget of 1.33 GiB (1.2 x")
    assert size_over_budget(ref, int(1.34 * GIB), 1.11)


# ---------------------------------------------------------------- ray-train

RAY_CPU = {"kind": "cpu", "os": "debian12", "python": "3.11", "pytorch": "2.13.0", "ray": "2.60.0"}


def test_ray_tag_and_labels_spell_ray():
    from dtrain.images.render import context

    img = next(i for i in load_all(["ray-train"]) if not i.gpu)
    assert img.tag == "2.13.0-ray2.60.0-cpu-py311-debian12"
    assert context(img)["labels"]["dtrain.version.ray"] == "2.60.0"


def test_ray_needs_ray_and_pytorch(tmp_path):
    path = write_spec(tmp_path, "ray-train", [{k: v for k, v in RAY_CPU.items() if k != "ray"}])
    assert "variants[0]: [family] ray-train images need 'ray'" in error_of(path)


def test_ray_not_in_pytorch_ddp(tmp_path):
    path = write_spec(tmp_path, "pytorch-ddp", [RAY_CPU])
    assert "variants[0].ray: [family] pytorch-ddp images do not take 'ray'" in error_of(path)


def test_ray_unknown_version(tmp_path):
    path = write_spec(tmp_path, "ray-train", [{**RAY_CPU, "ray": "1.13.0"}])
    assert "variants[0].ray: [compat.ray] Ray 1.13.0 is not in compat.yaml" in error_of(path)


def test_ray_python_without_wheels(tmp_path):
    path = write_spec(tmp_path, "ray-train", [{**GPU, "os": "ubuntu20.04", "python": "3.8",
                                               "pytorch": "2.11.0", "ray": "2.60.0", "cuda": "12.8.1",
                                               "cudnn": "9.8.0.87", "nccl": "2.25.1", "targets": ["g5"]}])
    msg = error_of(path)
    assert "variants[0].python: [compat.ray] Ray 2.60.0 has wheels for Python 3.10-3.14, not 3.8" in msg


def test_ray_torch_outside_tested_range(tmp_path):
    path = write_spec(tmp_path, "ray-train", [{**RAY_CPU, "pytorch": "2.4.1"}])
    assert ("variants[0].pytorch: [compat.ray] Ray Train 2.60.0 is tested with PyTorch 2.9-2.13, "
            "not 2.4.1") in error_of(path)


def test_py_spy_pin_is_checked_and_labelled(tmp_path):
    from dtrain.images.render import context

    imgs = [i for i in load_all() if i.variant.py_spy]
    assert len(imgs) == len(load_all()), "every image can dump a hang's stacks"
    assert context(imgs[0])["labels"]["dtrain.version.py-spy"] == imgs[0].variant.py_spy
    path = write_spec(tmp_path, "ray-train", [{**RAY_CPU, "py_spy": "0.1.0"}])
    assert "variants[0].py_spy: [compat.py_spy] py-spy 0.1.0 is not in compat.yaml" in error_of(path)
    path = write_spec(tmp_path, "pytorch-ddp", [{"kind": "cpu", "os": "ubuntu24.04", "python": "3.12",
                                                 "pytorch": "2.13.0", "py_spy": "0.3.14"}])
    assert "variants[0].py_spy: [compat.py_spy] py-spy 0.3.14 reads Python 3.3-3.11, not 3.12" in error_of(path)


# ---------------------------------------------------------------- CUDA from PyPI wheels (issue 50)

WHEELS = {"kind": "gpu", "cuda_from": "wheels", "os": "debian12", "python": "3.11",
          "pytorch": "2.13.0", "cuda": "13.0.96", "cudnn": "9.20.0.48", "nccl": "2.29.7",
          "targets": ["g5"]}


# Horovod + TensorFlow has none: no nvcc wheel for TensorFlow's CUDA (compat.yaml no_nvcc).
WHEEL_FAMILIES = ("horovod-pytorch", "pytorch-ddp", "ray-train")


def test_every_family_but_horovod_tensorflow_has_a_wheel_gpu_variant_without_efa():
    images = load_all()
    assert not [i for i in images if i.family == "horovod-tensorflow" and i.wheels]
    for fam in WHEEL_FAMILIES:
        wheels = [i for i in images if i.family == fam and i.wheels]
        assert wheels, fam
        for img in wheels:
            assert img.gpu and not img.efa and img.cuda_source == "wheels"
            row = img.wheel_row
            assert row and (img.variant.cuda, img.variant.cudnn, img.variant.nccl) == (row.cuda, row.cudnn, row.nccl)
    assert all(i.efa for i in images if i.gpu and not i.wheels)  # the nvidia/cuda variants keep the EFA stage


def test_wheel_variant_tag_spells_the_wheels_cuda():
    tags = {i.tag for i in load_all() if i.wheels}
    assert "2.13.0-cu130-cudnn9-py311-debian12" in tags


def test_wheel_variant_with_a_cudnn_that_does_not_exist(tmp_path):
    path = write_spec(tmp_path, "pytorch-ddp", [{**WHEELS, "cudnn": "9.1.0.70"}])
    msg = error_of(path)
    assert "pytorch-ddp.yaml:" in msg and "variants[0].cudnn: [compat.cuda_wheels]" in msg
    assert "PyTorch 2.13.0's wheels bring cuDNN 9.20.0.48, not 9.1.0.70" in msg
    assert "source: PyPI torch 2.13.0 Requires-Dist" in msg  # the table's source, in the message
    assert msg.count("\n") == 0  # cuda and nccl are right: one problem, one line


def test_wheel_variant_of_a_framework_the_table_lacks(tmp_path):
    path = write_spec(tmp_path, "pytorch-ddp", [{**WHEELS, "pytorch": "2.12.0"}])
    msg = error_of(path)
    assert "variants[0].pytorch: [compat.cuda_wheels] PyTorch 2.12.0 has no row in compat.yaml" in msg
    assert "known: 2.13.0" in msg


def test_wheel_variant_cuda_the_framework_has_no_wheel_for(tmp_path):
    """A framework/CUDA pairing the table forbids: CUDA 12.4 wheels beside torch 2.13."""
    path = write_spec(tmp_path, "pytorch-ddp", [{**WHEELS, "cuda": "12.4.127"}])
    msg = error_of(path)
    assert "variants[0].cuda: [compat.cuda_wheels]" in msg
    assert "variants[0].cuda: [compat.pytorch] PyTorch 2.13 has no wheel for CUDA 12.4" in msg


def test_wheel_variant_carries_no_efa_stage(tmp_path):
    path = write_spec(tmp_path, "pytorch-ddp", [{**WHEELS, "efa_installer": "1.38.0"}])
    assert "variants[0].efa_installer: [wheels] 'cuda_from: wheels' variants carry no EFA stage" in error_of(path)


def test_cuda_from_on_a_cpu_variant(tmp_path):
    path = write_spec(tmp_path, "pytorch-ddp", [{
        "kind": "cpu", "cuda_from": "wheels", "os": "debian12", "python": "3.11", "pytorch": "2.13.0"}])
    assert "variants[0].cuda_from: [cpu] CPU variants do not take 'cuda_from'" in error_of(path)


def test_wheel_variant_targets_need_kernels(tmp_path):
    path = write_spec(tmp_path, "pytorch-ddp", [{**WHEELS, "targets": ["g5", "p3"]}])
    assert "cu130 torch wheels start at sm_75; target p3 (V100, sm_70)" in error_of(path)


def test_cli_refuses_a_bad_wheel_pin_at_render(tmp_path):
    """Refused at render, with the table's source, before anything is built or written."""
    proj = _copy_project(tmp_path)
    spec = proj / "images" / "pytorch-ddp.yaml"
    text = spec.read_text()
    assert text.count('cudnn: "9.20.0.48"') == 1
    spec.write_text(text.replace('cudnn: "9.20.0.48"', 'cudnn: "9.1.0.70"'))
    for args in (("render",), ("build", "--image", "pytorch-ddp", "--tag", "2.13.0-cu130-cudnn9-py311-debian12")):
        result = _invoke(proj, *args)
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr + result.stdout
        assert "[compat.cuda_wheels] PyTorch 2.13.0's wheels bring cuDNN 9.20.0.48, not 9.1.0.70" in result.stderr
        assert "source: PyPI torch 2.13.0 Requires-Dist" in result.stderr
    assert not (proj / "dockerfiles").exists()


def test_build_selects_the_wheel_gpu_variants():
    """`dtrain build --wheels`: every wheel GPU variant (the four families), nothing else."""
    from dtrain.images.build import select

    images = load_all()
    chosen = select(images, None, False, wheels=True)
    assert {i.family for i in chosen} == set(WHEEL_FAMILIES) and all(i.wheels for i in chosen)
    assert len(chosen) == sum(1 for i in images if i.wheels)
    assert all(not i.gpu for i in select(images, None, False))  # the default stays the CPU variants
    assert select(images, None, True, wheels=True) == images


def test_horovod_on_wheels_without_nvcc_is_refused_at_render(tmp_path):
    """TensorFlow's CUDA wheels have no nvcc: Horovod's NCCL ops cannot be built from them, so
    the variant is refused at render, with the table's reason and source, not at build."""
    path = write_spec(tmp_path, "horovod-tensorflow", [{
        "kind": "gpu", "cuda_from": "wheels", "os": "debian12", "python": "3.11", "tensorflow": "2.15.1",
        "horovod": "0.28.1", "cuda": "12.2.140", "cudnn": "8.9.4.25", "nccl": "2.16.5", "targets": ["g5"]}])
    msg = error_of(path)
    assert "variants[0].horovod: [compat.cuda_wheels] Horovod's NCCL ops are compiled with nvcc" in msg
    assert "TensorFlow 2.15.1's CUDA wheels have none (nvidia-cuda-nvcc-cu12 12.2.140" in msg
    assert "ships bin/ptxas only" in msg and msg.count("\n") == 0
    # The same framework and pins without Horovod are a valid wheel variant.
    path = write_spec(tmp_path, "horovod-tensorflow", [{
        "kind": "gpu", "cuda_from": "wheels", "os": "debian12", "python": "3.11", "tensorflow": "2.15.1",
        "cuda": "12.2.140", "cudnn": "8.9.4.25", "nccl": "2.16.5", "targets": ["g5"]}])
    assert "[compat.cuda_wheels]" not in error_of(path)  # only the family rule: it needs horovod
