"""The launchers' seam: one module per launcher, one registry; nothing else compares launcher
names (docs/architecture.md: where a new launcher goes)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dtrain import ROOT
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import launchers, supervision

LAUNCHER_DIR = ROOT / "launch" / "jobs" / "launchers"


def _compared(names: tuple[str, ...]) -> re.Pattern:
    """A launcher name as a literal in a comparison, a membership test or a Literal[...]; or a
    `launcher ==`/`launcher in` test of any value."""
    lit = "|".join(map(re.escape, names))
    return re.compile(
        rf"""(==|!=)\s*["']({lit})["']|["']({lit})["']\s*(==|!=)"""
        rf"""|\bin\s*[(\[{{][^)\]}}\n]*["']({lit})["']"""
        rf"""|Literal\[[^\]\n]*["']({lit})["']"""
        r"""|launcher(\.name)?\s*(==|!=|\bin\b\s*[(\[{"'])""")


def _python_files() -> list[Path]:
    skip = {".venv", "tests", ".git", "node_modules"}
    return [p for p in ROOT.rglob("*.py") if not skip & set(p.relative_to(ROOT).parts)
            and LAUNCHER_DIR not in p.parents]


def test_no_launcher_name_compared_outside_the_launcher_modules():
    pattern = _compared(launchers.names())
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
             for p in _python_files() for i, line in enumerate(p.read_text().splitlines(), 1)
             if pattern.search(line)]
    assert found == [], "ask the registry (launchers.get(name).PROPERTY) instead:\n" + "\n".join(found)


@pytest.mark.parametrize("line", [
    'if run.launcher in ("mpirun", "horovodrun"):', 'if job.launcher == "torchrun":',
    'launcher: Optional[Literal["mpirun", "ray"]] = None', 'if self.launcher.name == "ray":',
    'x = spec.launcher != other', '"ray" == spec.launcher'])
def test_the_check_finds_a_comparison(line):
    assert _compared(launchers.names()).search(line)


def test_the_registry():
    assert launchers.names()[0] == "mpirun"  # the default launcher leads the choices
    assert set(launchers.names()) == set(launchers.LAUNCHERS)
    assert all(launchers.get(n).name == n for n in launchers.names())
    assert launchers.names(supervised=False) == ("ray",)
    assert launchers.names()[:4] == ("mpirun", "horovodrun", "torchrun", "ray")
    with pytest.raises(LaunchError, match=r"^--launcher srun: use mpirun, horovodrun, torchrun, ray"):
        launchers.get("srun")


def test_every_launcher_module_is_one_file_the_supervisor_gets():
    modules = {p.name for p in LAUNCHER_DIR.glob("*.py")} - {"__init__.py", "base.py"}
    registered = {type(la).__module__.rsplit(".", 1)[1] + ".py" for la in launchers.LAUNCHERS.values()}
    assert modules == registered  # a module and its registry line come together
    shipped = {Path(p).name for p in supervision.shipped_modules(ROOT / "launch" / "node" / "supervise.py") if "/launchers/" in p}
    assert shipped == modules | {"__init__.py", "base.py"}
