"""docs/launch.md's own job file ("A job file"), as a user copies it, and `dtrain launch` run on it
from a temporary project: what the description targets' tests feed every target (issue 48)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the fields of the documented file a description target cannot honour (the nodes-only features)
NODES_ONLY = ("min_nodes", "spares", "check_network", "checkpoint_dir")


def text() -> str:
    """The YAML block under docs/launch.md's "## A job file"."""
    doc = (ROOT / "docs" / "launch.md").read_text()
    section = doc[doc.index("## A job file"):]
    block = section[section.index("```yaml\n") + len("```yaml\n"):]
    return block[:block.index("```")]


def project(tmp_path: Path, *, without: tuple[str, ...] = ()) -> Path:
    """A directory holding job.yaml: the documented file, less the keys `without`."""
    lines = [line for line in text().splitlines(keepends=True)
             if not any(line.startswith(f"{key}:") for key in without)]
    where = tmp_path / "proj"
    where.mkdir(exist_ok=True)
    (where / "job.yaml").write_text("".join(lines))
    return where


def launch(where: Path, *args: str) -> subprocess.CompletedProcess:
    """`dtrain launch -f job.yaml ARGS` there; the file's `WANDB_API_KEY:` (no value) from the environment."""
    return subprocess.run([sys.executable, "-m", "dtrain", "launch", "-f", "job.yaml", "--env", "WANDB_API_KEY",
                           *args], cwd=where, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "WANDB_API_KEY": "not-in-any-file",
                               "AWS_EC2_METADATA_DISABLED": "true"})
