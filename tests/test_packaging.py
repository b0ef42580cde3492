"""A regular install (`pip install DIR`, not -e) runs dtrain: the wheel holds every file of the
checkout the commands read at run time (tasks.py, the node scripts, templates, dockerfiles,
images/*.yaml, the schemas and snapshots), and `dtrain` from it, outside the checkout, runs its
help, `render --check`, `manifest` and `launch --dump` (pyproject.toml's packages, package-dir and
package-data; dtrain/__init__.py's ROOT for an installed copy)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dtrain import ROOT

# where a file of the checkout lands in the wheel (pyproject.toml [tool.setuptools.package-dir])
LANDS = {"dtrain/": "dtrain/", "images/": "dtrain/images/", "launch/": "dtrain/launch/",
         "templates/": "dtrain/checkout/templates/", "dockerfiles/": "dtrain/checkout/dockerfiles/",
         "tasks.py": "dtrain/checkout/tasks.py"}


def _checkout_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=60).stdout.splitlines()
    return [f for f in out if (ROOT / f).is_file()]


def _in_wheel(path: str) -> str | None:
    """The wheel path of a checkout file that must ship (None: it need not)."""
    for src, dst in LANDS.items():
        if path == src or (src.endswith("/") and path.startswith(src)):
            return dst + path[len(src):] if src.endswith("/") else dst
    return None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of this checkout's files, built from a copy (no build/ left in the checkout)."""
    copy, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for f in _checkout_files():
        (copy / f).parent.mkdir(parents=True, exist_ok=True)
        (copy / f).write_bytes((ROOT / f).read_bytes())
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(copy)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (built,) = out.glob("dtrain-*.whl")
    return built


def test_the_wheel_holds_every_file_the_commands_read(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {w for f in _checkout_files() if "__pycache__" not in f for w in [_in_wheel(f)] if w}
    for must in ("dtrain/checkout/tasks.py", "dtrain/launch/node/run.sh", "dtrain/images/spec.py",
                 "dtrain/launch/other_tools/schemas/crd-trainjob-v1alpha1.json", "dtrain/launch/infra/prices.json",
                 "dtrain/checkout/templates/manifests/mpijob.j2", "dtrain/launch/analysis/report.py",
                 "dtrain/launch/sagemaker/engine.py"):
        assert must in wanted, must  # the rule above covers them
    assert sorted(wanted - names) == []


def test_dtrain_from_the_wheel_runs_outside_the_checkout(wheel, tmp_path):
    """The wheel unpacked (what pip installs) first on the path, run from a directory that is not
    the checkout: dtrain and its data are the wheel's (ROOT is its dtrain/checkout/)."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "DTRAIN_HOME": str(tmp_path / "home")}

    def dtrain(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "dtrain", *args], cwd=work, env=env, capture_output=True,
                              text=True, timeout=120)

    r = subprocess.run([sys.executable, "-c", "import dtrain; print(dtrain.__file__); print(dtrain.ROOT)"], cwd=work,
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == [str(site / "dtrain" / "__init__.py"), str(site / "dtrain" / "checkout")], r.stderr
    for args in (["--help"], ["launch", "--help"], ["render", "--check"]):
        r = dtrain(*args)
        assert r.returncode == 0 and "error" not in r.stderr, (args, r.stdout + r.stderr)
    r = dtrain("manifest", "--for", "trainjob", "--image", "reg/x:1", "--", "train.py")
    assert r.returncode == 0 and "kind: TrainJob" in r.stdout, r.stderr
    r = dtrain("launch", "--hosts", "h1,h2", "--image", "reg/x:1", "--dump", "--", "python", "t.py")
    assert r.returncode == 0 and "hosts: h1,h2" in r.stdout, r.stderr
