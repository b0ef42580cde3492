#!/usr/bin/env python3
"""Build-time check of a CPU image: the framework must be its CPU build (issue 11 item 9).

Without a CPU wheel pip silently falls back to PyPI's CUDA torch (5 GiB instead of 1 GiB).
Usage: cpu_build_check.py torch|tensorflow. Exit 0 and one line when it is the CPU build;
exit 1 with what to do when it is not.
"""

import importlib.metadata
import sys

HOW = {
    "torch": "give the build the CPU wheel: `dtrain build --wheelhouse DIR` with "
             "torch-VERSION+cpu-*.whl in DIR (on the build machines: /opt/wheels), or make "
             "https://download.pytorch.org/whl/cpu reachable from the build",
    "tensorflow": "install tensorflow-cpu, not tensorflow: `dtrain build --wheelhouse DIR` with the "
                  "tensorflow_cpu wheel in DIR (on the build machines: /opt/wheels), or a reachable index",
}


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def problem(framework: str) -> str | None:
    """None when `framework` is its CPU build, else what is wrong."""
    if framework == "torch":
        import torch

        if torch.version.cuda:
            return f"torch {torch.__version__} is the CUDA {torch.version.cuda} build, not the CPU one"
        return None
    if framework == "tensorflow":
        import tensorflow as tf

        if tf.test.is_built_with_cuda():
            return f"tensorflow {tf.__version__} is built with CUDA, not the CPU build (tensorflow-cpu)"
        if _installed("tensorflow") and not _installed("tensorflow-cpu"):
            return "the `tensorflow` distribution is installed instead of `tensorflow-cpu`"
        return None
    raise SystemExit(f"usage: {sys.argv[0]} torch|tensorflow")


def main(argv: list[str]) -> int:
    framework = argv[1] if len(argv) == 2 else ""
    why = problem(framework)
    if why:
        print(f"error: CPU image check: {why}; {HOW[framework]}", file=sys.stderr)
        return 1
    print(f"{framework}: CPU build")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
