"""docs/other-tools.md names files and Python objects of this repository: each must exist (the
schemas moved to launch/other_tools/schemas/ and the doc kept the old paths)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "docs" / "other-tools.md", ROOT / "docs" / "architecture.md"]
TOP = ("launch/", "dtrain/", "images/", "templates/", "tests/", "docs/", "dockerfiles/")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_repository_path_named_exists(doc):
    named = {m.split("::")[0].rstrip(",") for m in re.findall(r"`([^`\s]+)`", doc.read_text()) if m.startswith(TOP)}
    assert named, "the doc names no path: the pattern is wrong"
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, missing


def test_every_python_object_named_exists(doc=DOCS[0]):
    named = set(re.findall(r"`(dtrain\.(?:launch|images)(?:\.[A-Za-z_]+)+)", doc.read_text()))
    found = 0
    for dotted in sorted(named):
        parts = dotted.split(".")
        for i in range(len(parts), 0, -1):  # the longest importable module, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for attr in parts[i:]:
                obj = getattr(obj, attr)
            found += 1
            break
    assert found >= 2, named


def test_ecs_example_takes_no_command():
    """The usage block shows `-- CMD` only where the target takes one: `--for ecs` refuses it."""
    for line in DOCS[0].read_text().splitlines():
        if line.startswith("dtrain manifest --for") and "-- CMD" in line:
            target = line.split("--for ", 1)[1].split()[0]
            assert "ecs" not in target.split("|") or "--launcher ray" in line, line
