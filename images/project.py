"""Project images: a family image plus a project's requirements and code (issue 13).

`invoke build --project DIR --from FAMILY[:TAG]` (or `from:` in DIR/dtrain.yaml) builds
`FROM dtrain/FAMILY:TAG`, installs DIR/requirements.txt in a layer cached by the file's
content, copies DIR to /workdir, and tags `dtrain/project-<dir name>:<content hash>`.

Data flows one way: DIR + --from -> `ProjectPlan` (pure: base image, pins, conflicts, tag)
-> Dockerfile text (templates/project.Dockerfile.j2) -> `docker build`. A requirement that
would move the family's framework pins (another torch, tensorflow, horovod) fails before
anything is built, naming the requirement and the pin.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml
from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from dtrain.images.build import LOG_DIR, BuildError, BuildOptions, _Progress, _run_streaming, local_ref
from dtrain.images.render import ROOT
from dtrain.images.spec import Image, SpecError, load_all

CONFIG = "dtrain.yaml"
REQUIREMENTS = "requirements.txt"
SKIP = {".git", "__pycache__", ".venv", ".mypy_cache", ".pytest_cache"}  # not part of the tag hash


@dataclass(frozen=True)
class ProjectPlan:
    directory: Path
    name: str  # repository-safe directory name
    base: Image
    requirements: str  # requirements.txt text ("" when absent)
    tag: str  # content hash

    @property
    def base_ref(self) -> str:
        return local_ref(self.base)

    @property
    def ref(self) -> str:
        return f"dtrain/project-{self.name}:{self.tag}"

    @property
    def requirements_sha256(self) -> str:
        return hashlib.sha256(self.requirements.encode()).hexdigest()


# ---------------------------------------------------------------- pure parts


def repo_name(directory: Path) -> str:
    """A directory name as a Docker path component: lower case, [a-z0-9] runs joined by . _ -."""
    parts = re.findall(r"[a-z0-9]+", directory.resolve().name.lower())
    if not parts:
        raise BuildError(f"--project {directory}: cannot make an image name from the directory "
                         "name; rename the directory (letters or digits)")
    return "-".join(parts)[:100]


def choose_base(from_: str, images: list[Image]) -> Image:
    """'FAMILY' (its CPU variant) or 'FAMILY:TAG' -> the spec image to build FROM."""
    family, _, tag = from_.partition(":")
    same = [i for i in images if i.family == family]
    if not same:
        known = ", ".join(sorted({i.family for i in images}))
        raise BuildError(f"--from {from_}: unknown family {family!r}; known: {known}")
    if tag:
        chosen = [i for i in same if i.tag == tag]
        if not chosen:
            raise BuildError(f"--from {from_}: {family} has no tag {tag}; known: "
                             + ", ".join(sorted(i.tag for i in same)))
        return chosen[0]
    cpu = [i for i in same if not i.gpu]
    if len(cpu) != 1:
        raise BuildError(f"--from {from_}: name the variant, {family}:TAG")
    return cpu[0]


def framework_pins(img: Image) -> tuple[dict[str, str], dict[str, str]]:
    """({distribution: pinned version}, {distribution: why it must not be installed}) for an image."""
    v = img.variant
    pins: dict[str, str] = {}
    forbidden: dict[str, str] = {}
    if v.pytorch:
        pins["torch"] = v.pytorch
    if v.tensorflow:
        tf, other = ("tensorflow", "tensorflow-cpu") if img.gpu else ("tensorflow-cpu", "tensorflow")
        pins[tf] = v.tensorflow
        forbidden[other] = (f"the image has {tf} {v.tensorflow}; {other} would install a second "
                            f"TensorFlow build beside it")
    if v.tf_keras:
        pins["tf-keras"] = v.tf_keras
    if v.horovod:
        pins["horovod"] = v.horovod
    return pins, forbidden


def _requirement_lines(text: str) -> list[tuple[int, str]]:
    """(line number, requirement) with comments, continuations and blank lines removed."""
    out, buf, start = [], "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        if buf.strip():
            out.append((start, buf.strip()))
        buf = ""
    return out


def conflicts(text: str, img: Image, source: str = REQUIREMENTS) -> list[str]:
    """Every requirement in `text` that the image's framework pins cannot satisfy, one line
    each, naming the file, line, requirement and pin; also lines this build cannot honour."""
    pins, forbidden = framework_pins(img)
    env = {**default_environment(), "python_version": img.variant.python,
           "python_full_version": img.variant.python + ".0", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64"}
    problems = []
    for n, line in _requirement_lines(text):
        where = f"{source}:{n}"
        if line.startswith("-"):
            if re.match(r"(-r|-c|-e|--requirement|--constraint|--editable)\b", line):
                problems.append(f"{where}: {line.split()[0]} is not supported in a project build; "
                                "list the packages in requirements.txt itself")
            continue  # --index-url, --find-links ...: pip options, not requirements
        spec = re.split(r"\s--?\w", line, maxsplit=1)[0].strip()  # drop per-line options (--hash)
        try:
            req = Requirement(spec)
        except InvalidRequirement as e:
            problems.append(f"{where}: {spec!r} is not a requirement ({e})")
            continue
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        name = canonicalize_name(req.name)
        image = local_ref(img)
        if name in forbidden:
            problems.append(f"{where}: {spec} conflicts with {image}: {forbidden[name]}")
        elif name in pins:
            pin = pins[name]
            if req.url:
                problems.append(f"{where}: {spec} conflicts with {image}, which pins {name}=={pin}; "
                                "drop it (the image has it)")
            elif not req.specifier.contains(pin, prereleases=True):
                problems.append(f"{where}: {spec} conflicts with {image}, which pins {name}=={pin}; "
                                f"drop it, allow {pin}, or build --from a variant with the version you need")
    return problems


def constraints(img: Image) -> list[str]:
    pins, _ = framework_pins(img)
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


def tree_hash(directory: Path, base_ref: str) -> str:
    """12 hex digits over the base reference, every file's path and bytes (not .git, caches)."""
    h = hashlib.sha256(base_ref.encode() + b"\0")
    for path in sorted(p for p in directory.rglob("*") if not SKIP & set(p.relative_to(directory).parts)):
        if path.is_file():
            h.update(str(path.relative_to(directory)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def plan(directory: Path, from_: str | None, images: list[Image] | None = None) -> ProjectPlan:
    """Everything the build needs, checked: the base, the requirements, the tag."""
    if not directory.is_dir():
        raise BuildError(f"--project {directory}: not a directory")
    config = directory / CONFIG
    if not from_ and config.is_file():
        try:
            doc = yaml.safe_load(config.read_text()) or {}
        except yaml.YAMLError as e:
            raise BuildError(f"{config}: not valid YAML: {e}") from None
        unknown = set(doc) - {"from"} if isinstance(doc, dict) else {"(not a mapping)"}
        if unknown:
            raise BuildError(f"{config}: unknown keys {', '.join(sorted(unknown))}; only `from: FAMILY[:TAG]`")
        from_ = str(doc.get("from") or "")
    if not from_:
        raise BuildError(f"--project {directory}: say which family image to build from: "
                         f"--from FAMILY[:TAG] or `from: FAMILY[:TAG]` in {CONFIG}")
    try:
        images = images if images is not None else load_all()
    except SpecError as e:
        raise BuildError(str(e)) from None
    base = choose_base(from_, images)
    req_path = directory / REQUIREMENTS
    text = req_path.read_text() if req_path.is_file() else ""
    problems = conflicts(text, base, str(req_path))
    if problems:
        raise BuildError("\n".join(problems))
    return ProjectPlan(directory.resolve(), repo_name(directory), base, text,
                       tree_hash(directory, local_ref(base)))


def dockerfile(p: ProjectPlan) -> str:
    from dtrain.images.render import _jinja

    return _jinja().get_template("project.Dockerfile.j2").render(
        name=p.name, base=p.base_ref, requirements=bool(p.requirements.strip()),
        requirements_sha256=p.requirements_sha256, constraints=constraints(p.base))


def build_argv(p: ProjectPlan, opts: BuildOptions, *, docker: str, dockerfile_path: Path) -> list[str]:
    argv = [docker, "build", "--progress=plain", "-f", str(dockerfile_path), "-t", p.ref]
    if opts.ca_bundle:
        argv += ["--secret", f"id=ca,src={opts.ca_bundle}"]
    if opts.pip_conf:
        argv += ["--secret", f"id=pipconf,src={opts.pip_conf}"]
    if opts.no_cache:
        argv.append("--no-cache")
    argv.append(str(p.directory))
    return argv


# ---------------------------------------------------------------- side effects


def build(directory: Path, from_: str | None, opts: BuildOptions,
          say: Callable[[str], None] = print) -> str:
    """Build the project image; returns its reference."""
    from dtrain.launch.infra import engine

    p = plan(directory, from_)
    for label, path in (("--ca-bundle", opts.ca_bundle), ("--pip-conf", opts.pip_conf)):
        if path and not path.is_file():
            raise BuildError(f"{label} {path}: no such file")
    engine.ensure_dockerd()
    docker = engine.docker_cli()
    if not engine.image_exists(p.base_ref):
        raise BuildError(f"{p.base_ref} is not built here: run `invoke build --image {p.base.family} "
                         f"--tag {p.base.tag}` first")
    out = ROOT / "build" / "project" / p.name
    out.mkdir(parents=True, exist_ok=True)
    path = out / "Dockerfile"
    path.write_text(dockerfile(p))
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / f"project-{p.name}.log"
    state, start = _Progress(), time.monotonic()
    say(f"[build] project {directory} FROM {p.base_ref} -> {p.ref}")
    if _run_streaming(build_argv(p, opts, docker=docker, dockerfile_path=path), log,
                      f"[project-{p.name}]", state, say) != 0:
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise BuildError(f"building {p.ref} failed" + (f": {state.errors[-1]}" if state.errors else "")
                         + f"\n--- last lines of the build log ---\n{tail}\n--- full log: {log}")
    say(f"[build] {p.ref} built in {time.monotonic() - start:.1f} s; push it with "
        f"`invoke push --registry HOST[:PORT] --image project-{p.name}:{p.tag}` (or --ecr)")
    return p.ref
