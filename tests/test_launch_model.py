"""One launch model (issue 48): every default, bound and choice of a launch is declared once
(launch/jobs/jobfile.py's JobFile and its constants; a few homes named below), and a JobSpec is
made in one place (launch/jobs/config.py `job_spec`). An AST scan of the package fails on a
second copy, naming the file and line."""

from __future__ import annotations

import ast
from pathlib import Path

from dtrain import ROOT
from dtrain.launch.jobs import jobfile, launchers, nccl_net
from dtrain.launch.jobs.jobfile import JobFile

# The package's Python: what ships (node programs aside: they run in images, standard library only).
SOURCES = sorted(p for d in ("dtrain", "images", "launch") for p in (ROOT / d).rglob("*.py")
                 if "node" not in p.relative_to(ROOT).parts[:2]) + [ROOT / "tasks.py"]
JOBSPEC_HOME = ("launch/jobs/config.py", "job_spec")
# The choices of a launch and the one file each is written in.
CHOICES = {frozenset(jobfile.PULL): "launch/jobs/jobfile.py", frozenset(jobfile.RDZV): "launch/jobs/jobfile.py",
           frozenset(nccl_net.MODES): "launch/jobs/nccl_net.py",  # shipped to nodes: the supervisor's
           frozenset(jobfile.TARGETS): "launch/jobs/jobfile.py",
           frozenset(launchers.names()): "launch/jobs/launchers/__init__.py"}
# Left to the launchers' own reshaping (issue 48's launcher part): accelerate checks torchrun's
# rendezvous choices itself. Each entry is one known copy; a new one fails.
KNOWN_COPIES = {("launch/jobs/launchers/accelerate.py", frozenset(jobfile.RDZV))}
# Modules that may not import the job file's model: runplan.py is the supervisor's plan on a node
# (standard library only); torchrun.py and accelerate.py are left to the launchers' reshaping.
NODE_SIDE_DEFAULTS = {("launch/jobs/runplan.py", "rdzv"), ("launch/jobs/launchers/torchrun.py", "rdzv"),
                      ("launch/jobs/launchers/accelerate.py", "rdzv")}
# Tasks whose flag of the same name means something else: exec's --timeout (a command's seconds),
# nodes up's --count (instances to start) and --timeout (seconds to wait for them).
OTHER_MEANING = {("launch/cli/jobs.py", "exec_"), ("launch/cli/nodes.py", "nodes")}
DEFAULTS = {k: jobfile.launch_default(k) for k in JobFile.model_fields if jobfile.launch_default(k) is not None}
BOUND_FLAGS = {"--" + k.replace("_", "-") for k in jobfile.NUMBERS}


def _trees():
    for path in SOURCES:
        yield str(path.relative_to(ROOT)), ast.parse(path.read_text(), str(path))


def _strings(node: ast.AST) -> frozenset | None:
    elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else None
    if not elts or len(elts) < 2 or not all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in elts):
        return None
    return frozenset(e.value for e in elts)


def _functions(tree: ast.AST):
    """(function name or "", node) for every node, with the function it is in."""
    def walk(node: ast.AST, fn: str):
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else fn
            yield name, child
            yield from walk(child, name)
    yield from walk(tree, "")


def test_a_jobspec_is_made_in_one_place():
    found = []
    for rel, tree in _trees():
        for fn, node in _functions(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "JobSpec":
                found.append((rel, fn, node.lineno))
    assert [(rel, fn) for rel, fn, _ in found] == [JOBSPEC_HOME], found


def test_every_choice_is_written_once():
    copies = []
    for rel, tree in _trees():
        for node in ast.walk(tree):
            got = _strings(node)
            if got in CHOICES and CHOICES[got] != rel and (rel, got) not in KNOWN_COPIES:
                copies.append(f"{rel}:{node.lineno}: {sorted(got)}")
    assert copies == [], "a launch's choices written again (use jobfile's constants): " + "; ".join(copies)


def test_every_bound_is_written_once():
    """A launch number's bounds are jobfile.NUMBERS (jobfile.number checks them): a flag named
    as a launch field checked with bounds of its own is a second copy."""
    copies = []
    for rel, tree in _trees():
        for fn, node in _functions(tree):
            if not isinstance(node, ast.Call) or not node.args or (rel, fn) in OTHER_MEANING:
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            first = node.args[0]
            if (name in ("count", "number", "_int_flag", "_float_flag") and isinstance(first, ast.Constant)
                    and first.value in BOUND_FLAGS and len(node.args) > 2):
                copies.append(f"{rel}:{node.lineno}: {first.value}")
    assert copies == [], "bounds written again (use jobfile.number): " + "; ".join(copies)


def test_every_default_is_written_once():
    """A parameter or a field named as a launch field, defaulting to the launch's default, is a
    second copy of it (JobSpec reads jobfile.launch_default)."""
    copies = []
    for rel, tree in _trees():
        if rel == "launch/jobs/jobfile.py":
            continue
        for node in ast.walk(tree):
            pairs = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                pos = args.posonlyargs + args.args
                pairs += list(zip([a.arg for a in pos[len(pos) - len(args.defaults):]], args.defaults))
                pairs += [(a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                pairs.append((node.target.id, node.value))
            for name, value in pairs:
                if (name in DEFAULTS and isinstance(value, ast.Constant)
                        and value.value in (DEFAULTS[name], str(DEFAULTS[name]))
                        and (rel, name) not in NODE_SIDE_DEFAULTS):
                    copies.append(f"{rel}:{value.lineno}: {name}={value.value!r}")
    assert copies == [], "a launch default written again (use jobfile.launch_default): " + "; ".join(copies)


def test_the_scan_finds_what_it_looks_for(tmp_path):
    """The scan itself: a copy of each kind in a file is found."""
    text = ('def f(pull="always"):\n    x = ("static", "c10d")\n    values.count("--spares", v, 0, 9)\n'
            '    return JobSpec(image="i")\n')
    tree = ast.parse(text)
    assert any(_strings(n) == frozenset(jobfile.RDZV) for n in ast.walk(tree))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert any(getattr(c.func, "attr", "") == "count" and c.args[0].value in BOUND_FLAGS for c in calls)
    assert any(getattr(c.func, "id", "") == "JobSpec" for c in calls)
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))
    assert fn.args.args[0].arg == "pull" and fn.args.defaults[0].value == DEFAULTS["pull"]


# ---------------------------------------------------------------- no class over 300 lines (issue 48)

MAX_CLASS_LINES = 300


def _long_classes(tree: ast.AST, limit: int = MAX_CLASS_LINES) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of each class, nested ones too, longer than `limit` lines."""
    return [(n.name, n.lineno, n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
            if isinstance(n, ast.ClassDef) and n.end_lineno - n.lineno + 1 > limit]


def test_no_class_is_over_300_lines():
    """Every class of the package (dtrain/, images/, launch/ with its node programs, tasks.py;
    not tests/ nor bench/) is at most 300 lines: a longer one is split into pieces of their own
    (as Job's stages, session and output; the supervisor's restart policy and checks)."""
    sources = sorted(p for d in ("dtrain", "images", "launch") for p in (ROOT / d).rglob("*.py")) + [ROOT / "tasks.py"]
    assert ROOT / "launch" / "node" / "supervise.py" in sources and ROOT / "launch" / "jobs" / "job.py" in sources
    long = [f"{p.relative_to(ROOT)}:{line}: class {name} is {n} lines (at most {MAX_CLASS_LINES})"
            for p in sources for name, line, n in _long_classes(ast.parse(p.read_text(), str(p)))]
    assert not long, "\n".join(long)


def test_the_class_length_scan_sees_a_long_class():
    """The scan is not blind: a class of 301 lines (nested in a function too) is named, one of
    300 is not."""
    body = "".join(f"    x{i} = {i}\n" for i in range(299))
    assert _long_classes(ast.parse(f"class A:\n{body}    y = 0\n")) == [("A", 1, 301)]
    assert _long_classes(ast.parse(f"class B:\n{body}")) == []
    nested = "def f():\n" + "".join("    " + line + "\n" for line in f"class C:\n{body}    y = 0".splitlines())
    assert _long_classes(ast.parse(nested)) == [("C", 2, 301)]


def test_tasks_py_names_the_tasks_and_stays_under_500_lines():
    """tasks.py is what Invoke reads: each task is declared beside its body in launch/cli/ (issue 48)."""
    lines = (ROOT / "tasks.py").read_text().splitlines()
    assert len(lines) < 500, f"tasks.py has {len(lines)} lines: declare a new task in launch/cli/"
