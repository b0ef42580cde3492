"""Every import is declared in pyproject.toml (issue 22 item 1).

Twice CI passed while the README's first command failed on a fresh machine, because a package
the code imports (libopenmpi-dev, then pathspec) happened to be installed on the machine CI ran
on. deptry reads pyproject.toml and every import, and these tests fail on an import that is not
declared (DEP001) or that comes only through another package (DEP003). Two scans:
- the product (dtrain/, images/, launch/ but launch/node/, tasks.py): its imports must be plain
  dependencies, not dev ones (DEP004), except the dev-only schema generator's kubernetes;
- tests/ and bench/: may import the dev extra's packages, nothing undeclared.
launch/node/ runs inside the images, whose packages images/*.yaml pins; it is not scanned."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def deptry(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deptry", *args, "--no-ansi"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_the_products_imports_are_declared_dependencies():
    # k8s_schema.build() regenerates a committed schema from the kubernetes client: a dev task.
    r = deptry(".", "--per-rule-ignores", "DEP004=kubernetes")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Scanning" in r.stdout + r.stderr  # it looked at the code


def test_tests_and_benches_import_only_declared_packages():
    local = sorted({p.stem for d in ("tests", "bench") for p in (ROOT / d).glob("*.py")})
    first_party = [a for m in ("dtrain", "tasks", *local) for a in ("-kf", m)]
    r = deptry("tests", "bench", "--exclude", r"(^|/)(\.venv|__pycache__)(/|$)",
               "--ignore", "DEP002,DEP004", *first_party)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Scanning" in r.stdout + r.stderr


def test_deptry_catches_an_undeclared_import(tmp_path):
    """The check can fail: a project that imports a package it does not declare."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "p"\nversion = "0"\ndependencies = ["pyyaml"]\n')
    (tmp_path / "p.py").write_text("import yaml\nimport pathspec\n")
    r = subprocess.run([sys.executable, "-m", "deptry", ".", "--no-ansi"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "DEP001 'pathspec'" in r.stdout + r.stderr or "DEP003 'pathspec'" in r.stdout + r.stderr


def test_ci_runs_the_readmes_test_command_in_a_fresh_venv():
    """.ci/run is the README's test line, word for word, and that line installs into a virtual
    environment (not the machine's Python, where an undeclared package could hide)."""
    readme = (ROOT / "README.md").read_text().splitlines()
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert len(ci) == 1, ci
    assert ci[0] in readme, f".ci/run's command is not a line of README.md: {ci[0]}"
    assert ci[0].startswith("python3 -m venv .venv && . .venv/bin/activate && ")
    assert ci[0].endswith("dtrain test")
    demo = [line for line in readme if line.endswith("dtrain demo")]
    assert demo == [ci[0].replace("dtrain test", "dtrain demo")]
