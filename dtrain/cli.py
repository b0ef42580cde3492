"""The `dtrain` command: every task of the checkout's tasks.py, from any directory.

`invoke X` finds tasks.py by searching up from the current directory, so it works only inside
dtrain's checkout, and there "the current directory" (the code `sagemaker run` uploads, a
relative `--workdir`) is dtrain's own tree. `dtrain X` is the same program (Invoke's Program
over the same tasks, so every task, flag and help text is the same), loaded from the checkout
this package was installed from, and run in the user's directory: relative paths and "the
current directory as code" mean the user's."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from invoke import Collection, Program
from invoke.exceptions import Exit, ParseError

import dtrain


def tasks_module() -> ModuleType:
    """tasks.py of the checkout dtrain was installed from (pip install -e)."""
    path = dtrain.ROOT / "tasks.py"
    if not path.is_file():
        sys.exit(f"error: {path}: no tasks.py beside the dtrain package; install dtrain from its "
                 "checkout with `pip install -e DIR`")
    spec = importlib.util.spec_from_file_location("dtrain_tasks", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class DtrainProgram(Program):
    """Invoke's Program, where a command line it cannot parse (an unknown task or flag, a flag
    without its value) is one `error: ...` line and exit 2, as every other usage error."""

    def parse_core(self, argv):  # type: ignore[no-untyped-def]
        try:
            return super().parse_core(argv)
        except ParseError as e:
            raise Exit(f"error: {e} (dtrain --list; dtrain --help TASK)", code=2) from None

    def parse_tasks(self) -> None:
        try:
            super().parse_tasks()
        except ParseError as e:
            raise Exit(f"error: {e} (dtrain --list; dtrain --help TASK)", code=2) from None


def program() -> Program:
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("dtrain")
    except PackageNotFoundError:
        ver = "checkout"
    return DtrainProgram(namespace=Collection.from_module(tasks_module()), name="dtrain",
                   binary="dtrain", binary_names=["dtrain"], version=ver)


def main() -> None:
    program().run()
