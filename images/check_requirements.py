"""The last step of a project build: every requirement's top-level modules import in the image.

Runs inside the image with its Python (standard library only), from the project's support
image (images/project.py writes it there with the JSON plan it reads):

    python check_requirements.py CHECK.json

CHECK.json: {"requirements": [{"where": "requirements.txt:3", "spec": "six==1.17.0",
"name": "six"}, ...], "flavour": "cpu", "companions": {"torchvision": "FIX", ...},
"fix": "FIX for any other failure"}. Prints one `dtrain-check: ...` line per requirement; a
failure names the file and line, the requirement, the module, the error and what to do, and
the script exits 1 (the build fails here, not every rank at run time).
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import json
import sys

PREFIX = "dtrain-check:"
SKIP = {"tests", "test", "testing", "docs", "examples", "benchmarks"}


def top_level_modules(dist: md.Distribution) -> list[str]:
    """The importable top-level names a distribution installs: top_level.txt, else RECORD."""
    text = dist.read_text("top_level.txt")
    if text:
        names = [n.strip().replace("/", ".") for n in text.splitlines()]
    else:
        names = []
        for f in dist.files or []:
            parts = f.parts
            if not parts or parts[0] in ("..", "__pycache__") or parts[0].endswith((".dist-info", ".data")):
                continue
            if len(parts) > 1:
                names.append(parts[0])
            elif parts[0].endswith(".py"):
                names.append(parts[0][:-3])
            elif parts[0].endswith(".so"):
                names.append(parts[0].split(".")[0])
    names = [n for n in dict.fromkeys(names) if n.isidentifier() and n not in SKIP]
    public = [n for n in names if not n.startswith("_")]
    return public or names


def foreign_companions(companions: dict[str, str], flavour: str) -> dict[str, str]:
    """{name: installed version} for companions installed without the image's torch flavour
    (PyPI's build beside a +cpu torch, pulled in as some requirement's dependency; or a +cpu
    build beside PyPI's CUDA torch, flavour "")."""
    out = {}
    for name in companions:
        try:
            version = md.version(name)
        except md.PackageNotFoundError:
            continue
        if version.partition("+")[2] != flavour:  # flavour "": PyPI's CUDA torch (a wheel GPU variant)
            out[name] = version
    return out


def check(plan: dict) -> list[str]:
    """One line per requirement: `dtrain-check: ok ...` or `dtrain-check: WHERE: ... fails ...`."""
    companions = plan.get("companions", {})
    foreign = foreign_companions(companions, plan["flavour"])
    lines = []
    for req in plan["requirements"]:
        where, spec = req["where"], req["spec"]
        try:
            dist = md.distribution(req["name"])
        except md.PackageNotFoundError:
            lines.append(f"{PREFIX} {where}: {spec}: not installed in the image; {plan['fix']}")
            continue
        modules = top_level_modules(dist)
        failed = None
        for mod in modules:
            try:
                importlib.import_module(mod)
            except BaseException as e:  # noqa: BLE001 - any failure to import is the finding
                first = (str(e).strip().splitlines() or [""])[0][:300]
                failed = f"import {mod} fails: {type(e).__name__}: {first}"
                break
        if failed is None:
            lines.append(f"{PREFIX} ok {where}: {spec} ({', '.join(modules) or 'no modules'})")
            continue
        named = [n for n in companions if n in failed or n == req["name"]] + list(foreign)
        fix = companions[named[0]] if named else plan["fix"]
        if foreign and not named[:1] == [req["name"]]:
            got = ", ".join(f"{n} {v}" for n, v in foreign.items())
            fix = f"it pulled in {got}, not built for this image's torch; {fix}"
        lines.append(f"{PREFIX} {where}: {spec}: {failed}; {fix}")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} CHECK.json", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        plan = json.load(f)
    lines = check(plan)
    for line in lines:
        print(line, flush=True)
    return 1 if any(not ln.startswith(f"{PREFIX} ok ") for ln in lines) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
