"""Image build benchmark: cold build vs rebuild after touching only launch/node/, and sizes.

    python bench/bench_build.py [--cold]

--cold empties the BuildKit cache first (`docker builder prune -af`) and builds every CPU image
from nothing but the base image (minutes: compiles Horovod). An empty cache rather than
--no-cache: --no-cache leaves one copy of each identical step per image in the cache, and
later builds then stop sharing the common runtime layers between families. Without it
the "cold" column is left empty and only the rebuild and sizes are measured. Prints a table;
docs/benchmarks.md records the results with this command.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dtrain.images import build as b  # noqa: E402
from dtrain import engine  # noqa: E402
from dtrain.table import markdown  # noqa: E402

WHEELS = Path("/opt/wheels")


def build_all(opts: b.BuildOptions) -> dict[str, b.BuildResult]:
    quiet = lambda msg: None  # noqa: E731
    return {r.family: r for r in b.build(None, None, False, opts, say=quiet)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cold", action="store_true", help="also time a --no-cache build of each image")
    args = ap.parse_args()
    engine.ensure_all()
    base = dict(base_image=engine.BASE_IMAGE, ca_bundle=b.default_ca_bundle(),
                wheelhouse=WHEELS if WHEELS.is_dir() else None)
    if args.cold:
        subprocess.run([engine.docker_cli(), "builder", "prune", "-af"], check=True, capture_output=True)
    cold = build_all(b.BuildOptions(**base)) if args.cold else {}
    warm = build_all(b.BuildOptions(**base))  # make sure everything is cached
    marker = ROOT / "launch" / "node" / ".bench-touch"
    marker.write_text(f"{time.time()}\n")  # a change in launch/node/ only
    try:
        touched = build_all(b.BuildOptions(**base))
    finally:
        marker.unlink()
    build_all(b.BuildOptions(**base))  # back to the committed state
    rows = [("image", "size", "cold build", "rebuild after launch/node/ change", "ratio", "layers cached")]
    for fam, r in warm.items():
        c = cold.get(fam)
        t = touched[fam]
        rows.append((f"{fam}:{r.tag}", b.human_size(r.size), f"{c.seconds:.0f} s" if c else "-",
                     f"{t.seconds:.1f} s", f"{100 * t.seconds / c.seconds:.1f}%" if c else "-",
                     f"{t.cached}/{t.steps}"))
    print(markdown(rows))


if __name__ == "__main__":
    main()
