"""The `dtrain` command: every task of the checkout's tasks.py, from any directory.

`invoke X` finds tasks.py by searching up from the current directory, so it works only inside
dtrain's checkout, and there "the current directory" (the code `sagemaker run` uploads, a
relative `--workdir`) is dtrain's own tree. `dtrain X` is the same program (Invoke's Program
over the same tasks, so every task, flag and help text is the same), loaded from the checkout
this package was installed from, and run in the user's directory: relative paths and "the
current directory as code" mean the user's."""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Iterable
from types import ModuleType

from invoke import Collection, Program
from invoke.exceptions import Exit, ParseError

import dtrain
from dtrain import contract


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


# tasks whose job command follows `--` (tasks.py's _remainder()): a word the parser does not know
# after their flags is almost always that command without its `--`
COMMAND_TASKS = {"launch": "dtrain launch ... -- python train.py",
                 "manifest": "dtrain manifest ... -- python train.py",
                 "sagemaker": "dtrain sagemaker run ... -- python train.py",
                 "nodes-ssh": "dtrain nodes ssh NAME [NODE] -- CMD", "exec": "dtrain exec --cluster NAME -- CMD"}


def parse_error_line(message: str, task: str | None, flags: Iterable[str]) -> str:
    """The one `error: ...` line for a command line Invoke could not parse. message: Invoke's
    (e.g. "No idea what '--hostfle' is!"); task: the task being parsed (None before any); flags:
    that task's flags. An unknown flag is named with the task's closest flag; an unknown word
    after a task that runs a command is named as a command missing its `--`."""
    where = f"dtrain {task}: " if task else ""
    helps = f"dtrain --help {task}" if task else "dtrain --list; dtrain --help TASK"
    if m := re.fullmatch(r"Flag <Argument: (\w+)> needed value and was not given one!", message):
        name = m.group(1).replace("_", "-")
        return f"error: {where}{'-' if len(name) == 1 else '--'}{name} needs a value ({helps})"
    m = re.fullmatch(r"No idea what '(.*)' is!", message)
    if m is None:
        return f"error: {message} ({helps})"
    token = m.group(1)
    if token.startswith("-"):
        flag = token.split("=", 1)[0]
        close = typo_of(flag, flags)
        hint = f"; did you mean {close}?" if close else ""
        return f"error: {where}no flag {flag}{hint} ({helps})"
    if task is None:
        return f"error: no task {token!r} ({helps})"
    if task in COMMAND_TASKS:
        return (f"error: {where}{token!r} is not a flag or a task; the job's command goes after `--`: "
                f"{COMMAND_TASKS[task]}")
    return f"error: {where}{token!r} is not a flag of {task} or a task ({helps})"


def edits(a: str, b: str) -> int:
    """Edits (insert, delete, replace, swap two neighbours) that turn a into b (pure)."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        row = [i]
        for j, cb in enumerate(b, 1):
            best = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                best = min(best, prev2[j - 2] + 1)
            row.append(best)
        prev2, prev = prev, row
    return prev[-1]


def typo_of(flag: str, flags: Iterable[str]) -> str | None:
    """The task's flag that `flag` is a typo of, or None (pure): the closest long flag at most
    one edit in four letters away (at least one). A flag with a word more or less is another
    flag, not a typo: --max-wait is not --wait (4 edits), --hostfle is --hostfile (1)."""
    name = flag.removeprefix("--")
    most = max(1, len(name) // 4)
    scored = sorted((edits(name, f.removeprefix("--")), f) for f in flags if f.startswith("--") and f != flag)
    return scored[0][1] if scored and scored[0][0] <= most else None


def _usage_error(e: ParseError) -> Exit:
    ctx = e.context
    return Exit(parse_error_line(str(e), ctx.name if ctx is not None and ctx.name else None,
                                 ctx.flags if ctx is not None else ()), code=contract.USER_ERROR_EXIT)


HELP_FLAGS = ("--help", "-h")
# `dtrain nodes ACTION NAME [NODE]` for these actions is the task nodes-ssh (with these flags):
# Invoke has no optional positional arguments, and `nodes` takes one (up, down, list).
REACH_ACTIONS = {"ssh": (), "ssh-config": ("--config",)}


def reach_argv(argv: list[str]) -> list[str]:
    """`dtrain nodes ssh NAME [NODE] ...` -> `dtrain nodes-ssh --cluster NAME [--node NODE] ...`,
    `dtrain nodes ssh-config NAME ...` -> `dtrain nodes-ssh --config --cluster NAME ...` (pure;
    NAME and NODE are the words right after the action, before any flag; the rest stays)."""
    if len(argv) < 3 or argv[1] != "nodes" or argv[2] not in REACH_ACTIONS:
        return argv
    rest = list(argv[3:])
    words = []
    while rest and len(words) < 2 and not rest[0].startswith("-"):
        words.append(rest.pop(0))
    out = [argv[0], "nodes-ssh", *REACH_ACTIONS[argv[2]]]
    out += ["--cluster", words[0]] if words else []
    out += ["--node", words[1]] if len(words) > 1 else []
    return out + rest


def help_argv(argv: list[str], tasks: Iterable[str]) -> list[str]:
    """Help the way users ask for it, as Invoke's `dtrain --help TASK` (pure; argv[0] is the
    program): `dtrain --help nodes up`, `dtrain nodes --help`, `dtrain nodes up --help` and
    `dtrain -h nodes` all mean the help of `nodes` (an action such as `up` is its first
    argument; Invoke alone took `up` for a task, or `--help` for the action). Words after `--`
    are a job's command, never dtrain's."""
    head = argv[1:]
    if "--" in head:
        head = head[:head.index("--")]
    if not any(a in HELP_FLAGS for a in head):
        return argv
    names = set(tasks)
    task = next((a for a in head if a in names), None)
    return argv if task is None else [argv[0], "--help", task]


class DtrainProgram(Program):
    """Invoke's Program, where a command line it cannot parse (an unknown task or flag, a flag
    without its value) is one `error: ...` line and exit 2, as every other usage error."""

    def run(self, argv=None, exit: bool = True):  # type: ignore[no-untyped-def]
        argv = list(sys.argv if argv is None else argv.split() if isinstance(argv, str) else argv)
        return super().run(help_argv(reach_argv(argv), self.namespace.task_names), exit=exit)

    def parse_core(self, argv):  # type: ignore[no-untyped-def]
        try:
            return super().parse_core(argv)
        except ParseError as e:
            raise _usage_error(e) from None

    def parse_tasks(self) -> None:
        try:
            super().parse_tasks()
        except ParseError as e:
            raise _usage_error(e) from None


def program() -> Program:
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("dtrain")
    except PackageNotFoundError:
        ver = "checkout"
    return DtrainProgram(namespace=Collection.from_module(tasks_module()), name="dtrain",
                   binary="dtrain", binary_names=["dtrain"], version=ver)


def main() -> None:
    """`dtrain`; a reader that stops early (`dtrain launch --help | head`) ends it quietly, exit
    141 as a shell's SIGPIPE (the Python docs' recipe: stdout to devnull, so the flush at exit
    does not fail again)."""
    import os

    try:
        program().run()
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)
