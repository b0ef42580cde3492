"""dtrain: container images and a launcher for distributed training on your own GPU nodes.

The source tree keeps its product layout (images/, launch/, templates/ at the top); installed,
they are the subpackages dtrain.images and dtrain.launch (pyproject's package-dir). Run from a
checkout without installing, this package reaches them beside it."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the checkout: templates/, dockerfiles/, docs/

if (ROOT / "images" / "spec.py").is_file() and (ROOT / "launch" / "node").is_dir():
    __path__.append(str(ROOT))  # noqa: F821 (a package's own __path__): dtrain.images is ROOT/images
elif (Path(__file__).resolve().parent / "checkout" / "tasks.py").is_file():
    # installed from a wheel (pip install DIR, not -e): the checkout's files are dtrain/checkout/
    ROOT = Path(__file__).resolve().parent / "checkout"
