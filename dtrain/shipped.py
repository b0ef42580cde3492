"""The dtrain modules a program imports, at any depth, read from its import statements: what is
sent beside the supervisor (launch/jobs/supervision.py builder_files) and what the images copy
for SageMaker's `train` (images/render.py, templates/Dockerfile.j2), so neither is a hand list.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

# An import statement of dtrain, at any indent (a function's too), parenthesized over lines or not.
_DTRAIN_IMPORT = re.compile(r"^[ \t]*(from[ \t]+dtrain[\w.]*[ \t]+import[ \t]+(?:\([^)]*\)|[^\n]*)|import[ \t]+dtrain[^\n]*)",
                            re.M)


_TYPE_CHECKING = re.compile(r"if[ \t]+(typing\.)?TYPE_CHECKING[ \t]*:")


def _type_checking_only(text: str, at: int) -> bool:
    """Whether the import statement at offset `at` sits in an `if TYPE_CHECKING:` block (never
    run: its modules are not needed where the program runs)."""
    line = text[at:].split("\n", 1)[0]
    indent = len(line) - len(line.lstrip())
    if not indent:
        return False
    for above in reversed(text[:at].split("\n")[:-1]):
        stripped = above.strip()
        if stripped and not stripped.startswith("#") and len(above) - len(above.lstrip()) < indent:
            return bool(_TYPE_CHECKING.fullmatch(stripped))
    return False


def _dtrain_imports(path: Path) -> set[str]:
    """The dtrain modules a file's import statements name, at module level or in a function;
    `from A import B` names A.B where that is a module, else A; an `if TYPE_CHECKING:` block's
    imports aside. Each statement is found by _DTRAIN_IMPORT and read by ast (a whole file's
    parse would cost a launch 0.1 s); telling a module from a name imports packages only, never a
    module (a launch reads these: importing modules it does not run cost it ~4 ms)."""
    import ast
    import importlib.util

    def module(name: str) -> str:
        parent = name.rpartition(".")[0]
        try:  # A's spec first: where A is a module, not a package, B is a name in it (A not imported)
            spec = importlib.util.find_spec(parent)
            if spec is None or spec.submodule_search_locations is None:
                return parent
            return name if importlib.util.find_spec(name) else parent
        except ModuleNotFoundError:  # B is a name in module A, not a module
            return parent

    out = set()
    text = path.read_text()
    for m in _DTRAIN_IMPORT.finditer(text):
        if _type_checking_only(text, m.start()):
            continue
        for node in ast.parse(m.group(1).strip()).body:
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                out |= {module(f"{node.module}.{a.name}") for a in node.names}
    return {n for n in out if n == "dtrain" or n.startswith("dtrain.")}


@functools.cache
def shipped_modules(program: Path) -> tuple[str, ...]:
    """The dtrain modules program imports and theirs, at any depth, with their packages'
    __init__: paths under the import root (dtrain/launch/jobs/runplan.py), sorted."""
    import importlib.util

    seen: set[str] = set()
    todo = sorted(_dtrain_imports(program))
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for n in [".".join(parts[:i]) for i in range(1, len(parts) + 1)]:
            if n not in seen:
                seen.add(n)
                todo.extend(sorted(_dtrain_imports(Path(importlib.util.find_spec(n).origin)) - seen))
    return tuple(sorted(n.replace(".", "/") + ("/__init__.py" if importlib.util.find_spec(n).submodule_search_locations
                                             is not None else ".py") for n in seen))


def checkout_path(module_file: str) -> str:
    """A shipped module's path in the checkout (pyproject maps dtrain.launch to launch/)."""
    return module_file.removeprefix("dtrain/") if module_file.startswith("dtrain/launch/") else module_file
