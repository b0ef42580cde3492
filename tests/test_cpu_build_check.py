"""The CPU images' build-time check (launch/node/cpu_build_check.py, run by the smoke step):
a CUDA framework build fails the build with what to do (issue 11 item 9). Run against stub
framework modules, the check's real code in a real interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / "launch" / "node" / "cpu_build_check.py"


def stub(tmp_path: Path, framework: str, cuda: bool, dist: str | None = None) -> Path:
    d = tmp_path / "site"
    if framework == "torch":
        (d / "torch").mkdir(parents=True)
        (d / "torch" / "__init__.py").write_text(
            f"__version__ = {'2.13.0+cu121' if cuda else '2.13.0+cpu'!r}\nfrom torch import version\n")
        (d / "torch" / "version.py").write_text(f"cuda = {'12.1' if cuda else None!r}\n")
    else:
        (d / "tensorflow").mkdir(parents=True)
        (d / "tensorflow" / "__init__.py").write_text(
            "__version__ = '2.15.1'\n"
            f"class test:\n    is_built_with_cuda = staticmethod(lambda: {cuda})\n")
    if dist:  # an installed distribution's metadata, as pip leaves it
        info = d / f"{dist.replace('-', '_')}-2.15.1.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 2.15.1\n")
    return d


def run_check(site: Path, framework: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-S", str(CHECK), framework], env=env,
                          capture_output=True, text=True, timeout=60)


def test_cuda_torch_fails_with_what_to_do(tmp_path):
    r = run_check(stub(tmp_path, "torch", cuda=True), "torch")
    assert r.returncode == 1
    assert "torch 2.13.0+cu121 is the CUDA 12.1 build" in r.stderr
    assert "--wheelhouse" in r.stderr and "/opt/wheels" in r.stderr
    assert "Traceback" not in r.stderr


def test_cpu_torch_passes(tmp_path):
    r = run_check(stub(tmp_path, "torch", cuda=False), "torch")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "torch: CPU build"


@pytest.mark.parametrize("cuda,dist,ok", [(True, "tensorflow-cpu", False), (False, "tensorflow", False),
                                          (False, "tensorflow-cpu", True)])
def test_tensorflow(tmp_path, cuda, dist, ok):
    r = run_check(stub(tmp_path, "tensorflow", cuda=cuda, dist=dist), "tensorflow")
    assert (r.returncode == 0) == ok, r.stdout + r.stderr
    if not ok:
        assert "tensorflow-cpu" in r.stderr and "--wheelhouse" in r.stderr
