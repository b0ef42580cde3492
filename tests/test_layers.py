"""The folders show which way things depend (issue 24): images/ uses nothing of launch/, and
running jobs (launch/jobs/) nothing of where nodes come from, troubleshooting or other tools,
where nodes come from (launch/infra/) nothing of jobs, and how nodes are reached (launch/remote/:
hosts, ssh, fan-out) nothing of any of them;
what several need (the engine, the contract, values) lives in dtrain/. Checked on every import
statement, at module level or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dtrain import ROOT

# folder -> module prefixes it must not import
FORBIDDEN = {
    "images": ("dtrain.launch",),
    "launch/jobs": ("dtrain.launch.infra", "dtrain.launch.troubleshoot", "dtrain.launch.other_tools",
                    "dtrain.launch.demo"),
    "launch/infra": ("dtrain.launch.jobs", "dtrain.launch.troubleshoot", "dtrain.launch.other_tools"),
    "launch/remote": ("dtrain.launch.jobs", "dtrain.launch.infra", "dtrain.launch.troubleshoot",
                      "dtrain.launch.other_tools", "dtrain.launch.demo"),
    "dtrain": ("dtrain.launch", "dtrain.images"),
}


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_imports_point_one_way(folder):
    bad = [f"{p.relative_to(ROOT)}:{line}: {name}"
           for p in sorted((ROOT / folder).glob("*.py"))
           for line, name in _imports(p)
           if name.startswith(FORBIDDEN[folder])]
    assert not bad, "\n".join(bad)
