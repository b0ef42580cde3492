"""launch/node/gpu_build_check.py's pure parts (the in-image run: tests/test_gpu_wheels.py)."""

from __future__ import annotations

import importlib.util

import pytest

from dtrain import contract

spec = importlib.util.spec_from_file_location("gpu_build_check", contract.NODE_SCRIPTS / "gpu_build_check.py")
gbc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gbc)


@pytest.mark.parametrize("version, code", [("9.20.0.48", 92000), ("9.1.0.70", 90100), ("8.9.4.25", 8904),
                                           ("8.6.0", 8600)])
def test_cudnn_version_as_cudnn_reports_it(version, code):
    assert gbc.cudnn_int(version) == code


def test_unresolved_names_missing_libraries_but_not_the_drivers():
    out = ("\tlinux-vdso.so.1 (0x00007ffd)\n"
           "\tlibcudart.so.13 => /opt/venv/lib/python3.11/site-packages/nvidia/cu13/lib/libcudart.so.13 (0x7f)\n"
           "\tlibnccl.so.2 => not found\n"
           "\tlibcuda.so.1 => not found\n"
           "\tlibnvidia-ml.so.1 => not found\n")
    assert gbc.unresolved(out) == ["libnccl.so.2"]


def test_arguments():
    assert gbc._parse(["x", "torch", "--cuda=13.0", "--cudnn=9.20.0.48", "--nccl=2.29.7"]) == (
        "torch", {"cuda": "13.0", "cudnn": "9.20.0.48", "nccl": "2.29.7"}, False, {})
    assert gbc._parse(["x", "tensorflow", "--cuda=12.2", "--cudnn=8.9.4.25", "--nccl=2.16.5", "--horovod"])[2]
    assert gbc._parse(["x", "torch", "--cuda=13.0", "--cudnn=9", "--nccl=2", "--companion=torchvision:0.28"])[3] == {
        "torchvision": "0.28"}
    pins = ["--cuda=13.0", "--cudnn=9", "--nccl=2"]
    for bad in (["x"], ["x", "jax"], ["x", "torch", "--cuda=13.0"], ["x", "torch", *pins, "--other=1"],
                ["x", "torch", *pins, "--companion=torchvision"], ["x", "torch", *pins, "--companion=:0.28"],
                ["x", "tensorflow", *pins, "--companion=torchvision:0.28"]):
        with pytest.raises(SystemExit):
            gbc._parse(bad)


@pytest.mark.parametrize("version, torch, problem", [
    ("0.28.0", "2.13.0", None),  # PyPI's both: the wheel GPU variant's case
    ("0.28.1+cpu", "2.13.0+cpu", None),
    ("0.27.1", "2.13.0", "torchvision 0.27.1 is not 0.28.*, the torchvision built for torch 2.13.0"),
    ("0.28.0+cpu", "2.13.0", "torchvision 0.28.0+cpu is the cpu build, the image's torch 2.13.0 the PyPI one"),
    ("0.28.0", "2.13.0+cpu", "torchvision 0.28.0 is the PyPI build, the image's torch 2.13.0+cpu the cpu one"),
])
def test_companion_version_against_the_image_torch(version, torch, problem):
    assert gbc.companion_problem("torchvision", "0.28", version, torch) == problem
