"""The folders show which way things depend (issue 24): images/ uses nothing of launch/, and
running jobs (launch/jobs/) nothing of where nodes come from, troubleshooting or other tools,
where nodes come from (launch/infra/) nothing of jobs, and how nodes are reached (launch/remote/:
hosts, ssh, fan-out) nothing of any of them;
what several need (the engine, the contract, values) lives in dtrain/. Checked on every import
statement, at module level or inside a function, in every file under each folder (subfolders
included, so a new subpackage is covered). The programs of launch/node/ run on nodes and in
containers with the image's python: each imports only the standard library, what the images pin,
and the dtrain modules sent with it (issue 39). No import cycle among dtrain's modules (issue 39).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from dtrain import ROOT

# folder -> module prefixes it must not import
FORBIDDEN = {
    "images": ("dtrain.launch",),
    "launch/jobs": ("dtrain.launch.infra", "dtrain.launch.troubleshoot", "dtrain.launch.other_tools",
                    "dtrain.launch.demo", "dtrain.launch.targets", "dtrain.launch.jobtarget"),
    "launch/infra": ("dtrain.launch.jobs", "dtrain.launch.troubleshoot", "dtrain.launch.other_tools",
                     "dtrain.launch.targets", "dtrain.launch.jobtarget"),
    # transport only (issue 39): nothing of where nodes come from, no AWS SDK
    "launch/remote": ("dtrain.launch.jobs", "dtrain.launch.infra", "dtrain.launch.troubleshoot",
                      "dtrain.launch.other_tools", "dtrain.launch.demo", "dtrain.launch.targets",
                      "dtrain.launch.jobtarget", "boto3", "botocore"),
    "dtrain": ("dtrain.launch", "dtrain.images"),
}
# The folders of the installed package (pyproject's package-dir): folder -> its import name.
PACKAGE_DIRS = {"dtrain": "dtrain", "images": "dtrain.images", "launch": "dtrain.launch"}

# launch/node/ programs (subfolders included) -> what each may import beyond the standard library:
# the dtrain modules sent with it (supervise.py: builders.json, launch/jobs/supervision.py;
# sagemaker_train.py: /opt/dtrain/py in the images, templates/Dockerfile.j2) and the packages the
# images pin (images/*.yaml). A new program is checked too: it is not in this table, so it may
# import the standard library only.
NODE_ALLOWED = {
    "supervise.py": ("dtrain",),
    "sagemaker_train.py": ("dtrain",),
    "ray_wait.py": ("ray",),
    "cpu_build_check.py": ("torch", "tensorflow"),
    "gpu_build_check.py": ("torch", "tensorflow"),  # horovod by importlib, in the wheel GPU images
    "examples/allreduce_bw.py": ("torch", "horovod", "tensorflow"),
    "examples/allreduce_check.py": ("torch", "horovod", "tensorflow"),
    "examples/ckpt_train.py": ("torch",),
    "examples/ddp_grads.py": ("torch",),
    "examples/hang_train.py": ("torch",),
    "examples/straggler_train.py": ("torch",),
    "examples/ddp_train.py": ("torch",),
    "examples/skip_collective.py": ("torch",),
    "examples/hvd_tf_synthetic.py": ("tensorflow", "horovod", "numpy"),
    "examples/lazy_train.py": ("torch", "tensorflow"),
    "examples/cuda_shaped.py": ("torch",),  # bench_lazy_launch's GPU-shaped image
    "examples/ray_train_check.py": ("ray", "torch"),
}
# The one import cycle left, resolved by moving the launchers into a package (issue 39):
# job -> launchers -> netgate -> job. Remove it from here with that change.
KNOWN_CYCLES: tuple[set[str], ...] = ()


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (for type names only: never run)."""
    return {id(n) for block in ast.walk(tree)
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
            for stmt in block.body for n in ast.walk(stmt)}


def _imports(path: Path, package: str = "", *, runtime: bool = False) -> list[tuple[int, str]]:
    """(line, module) of every import in path, at any depth; `from A import B` gives A.B.
    package: the file's package, for relative imports. runtime: without those under
    `if TYPE_CHECKING:`."""
    out = []
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_only(tree) if runtime else set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return out


def _modules() -> dict[str, Path]:
    """Every dtrain module: import name -> file (launch/node/ excepted: programs, not modules)."""
    out = {}
    for folder, name in PACKAGE_DIRS.items():
        for p in sorted((ROOT / folder).rglob("*.py")):
            rel = p.relative_to(ROOT / folder).with_suffix("")
            if rel.parts[0] == "node" and folder == "launch":
                continue
            parts = [name, *rel.parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = p
    return out


def _target(name: str, modules: dict[str, Path]) -> str | None:
    """The dtrain module an imported name is in (`from A import B`: A.B where a module, else A)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps = {_target(imported, modules) for _, imported in _imports(path, package, runtime=True)}
        graph[name] = {d for d in deps if d and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = set()
            while True:
                w = stack.pop()
                on.discard(w)
                scc.add(w)
                if w == v:
                    break
            if len(scc) > 1:
                out.append(scc)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_imports_point_one_way(folder):
    bad = [f"{p.relative_to(ROOT)}:{line}: {name}"
           for p in sorted((ROOT / folder).rglob("*.py"))
           for line, name in _imports(p)
           if name.startswith(FORBIDDEN[folder])]
    assert not bad, "\n".join(bad)


def test_layers_cover_every_folder():
    """Every folder of Python files under the package dirs is under a FORBIDDEN folder, or is
    launch/node/ (its own test): a new folder is not left out by a shallow glob."""
    covered = {ROOT / f for f in FORBIDDEN} | {ROOT / "launch" / "node"}
    free = {p.parent for d in PACKAGE_DIRS for p in (ROOT / d).rglob("*.py")
            if not any(p.is_relative_to(c) for c in covered)}
    # launch/ itself and its other folders (troubleshoot, other_tools, demo.py) may use any layer
    assert all(f == ROOT / "launch" or f.parent == ROOT / "launch" for f in free), sorted(map(str, free))


def test_remote_is_transport_only():
    """launch/remote/ reaches nodes; where they come from (EC2 and its SDK) is launch/targets/."""
    remote = sorted((ROOT / "launch" / "remote").rglob("*.py"))
    assert remote and not [name for p in remote for _, name in _imports(p) if name.split(".")[0] in ("boto3", "botocore")]
    assert not [p.name for p in remote if "ec2" in p.read_text().lower()]
    assert {"boto3", "botocore"} <= set(FORBIDDEN["launch/remote"])


def test_node_programs_import_only_what_their_image_has():
    std = sys.stdlib_module_names | {"__future__"}
    node = ROOT / "launch" / "node"
    programs = sorted(node.rglob("*.py"))
    assert {p.relative_to(node).as_posix() for p in programs} >= set(NODE_ALLOWED)
    bad = [f"{p.relative_to(ROOT)}:{line}: {name}"
           for p in programs
           for line, name in _imports(p)
           if name.split(".")[0] not in std | set(NODE_ALLOWED.get(p.relative_to(node).as_posix(), ()))]
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    found = [c for c in cycles(_graph()) if c not in KNOWN_CYCLES]
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(sorted(c)) for c in found)


def test_cycle_finder_finds_one():
    """The finder is not blind: a -> b -> c -> a and d -> a give one cycle, without d."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []
    modules = _modules()
    assert "dtrain.launch.jobs.job" in modules and "dtrain.images.spec" in modules
    assert "dtrain.launch.jobs.runplan" in _graph()["dtrain.launch.jobs.session"]


def test_supervisor_gets_the_modules_it_imports(tmp_path):
    """The modules sent with the supervisor (builders.json) are read from its imports: a new
    import, in a function or over lines, is sent, with what it imports and its packages."""
    from dtrain import contract
    from dtrain.launch.jobs import supervision

    program = tmp_path / "prog.py"
    program.write_text("import os\nfrom typing import TYPE_CHECKING\n\ndef f():\n    from dtrain import table\n\n"
                       "from dtrain.launch.jobs import (\n    output,\n)\n"
                       "if TYPE_CHECKING:\n    # never run\n    from dtrain.launch.jobs.job import JobSpec\n")
    assert supervision.shipped_modules(program) == (
        "dtrain/__init__.py", "dtrain/contract.py", "dtrain/launch/__init__.py", "dtrain/launch/jobs/__init__.py",
        "dtrain/launch/jobs/output.py", "dtrain/launch/jobs/runplan.py", "dtrain/table.py")
    files = supervision.builder_files()
    assert set(files) == {*supervision.shipped_modules(contract.NODE_SCRIPTS / "supervise.py"),
                          *(f"dtrain/launch/node/{p}" for p in supervision.SUPERVISOR_NODE_PROGRAMS)}
    assert "dtrain/launch/node/nccl_net.sh" in files and "dtrain/launch/jobs/nccl_net.py" in files  # --nccl-check
    # what the hand list of before sent (issue 39) is still sent
    assert set(files) >= {"dtrain/__init__.py", "dtrain/contract.py", "dtrain/values.py", "dtrain/launch/__init__.py",
                          "dtrain/launch/errors.py", "dtrain/launch/jobs/__init__.py", "dtrain/launch/jobs/runplan.py",
                          "dtrain/launch/jobs/container.py", "dtrain/launch/jobs/nic.py",
                          "dtrain/launch/jobs/launchers/mpirun.py", "dtrain/launch/jobs/launchers/torchrun.py",
                          "dtrain/launch/remote/__init__.py", "dtrain/launch/remote/hosts.py",
                          "dtrain/launch/jobs/output.py", "dtrain/launch/jobs/supervision.py",
                          "dtrain/launch/jobs/progress.py", "dtrain/launch/analysis/timeline.py",
                          # imported inside the functions that use them (--hang-timeout, --straggler-check):
                          # found all the same, or the verdicts would fail mid-job in a container
                          "dtrain/launch/analysis/stacks.py", "dtrain/launch/analysis/straggler.py"}
