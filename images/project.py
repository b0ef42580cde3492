"""Project images: a family image plus a project's requirements and code (issue 13).

`dtrain build --project DIR --from FAMILY[:TAG]` (or `from:` in DIR/dtrain.yaml) builds
`FROM dtrain/FAMILY:TAG`, installs DIR/requirements.txt in a layer cached by the file's
content, copies DIR to /workdir, and tags `dtrain/project-<dir name>:<content hash>`.

Data flows one way: DIR + --from -> `ProjectPlan` (pure: base image, pins, conflicts, tag)
-> Dockerfile text (templates/project.Dockerfile.j2) -> `docker build`. A requirement that
would move the family's framework pins (another torch, tensorflow, horovod) fails before
anything is built, naming the requirement and the pin.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml
from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion

from dtrain import contract
from dtrain.images.build import secret_copies
from dtrain.images.build import (LOG_DIR, BuildError, BuildOptions, _Progress, _run_streaming, local_ref,
                                 require_engine, torch_wheel_present)
from dtrain.images.render import ROOT, minor, torch_flavour, torch_index
from dtrain.images.spec import Image, SpecError, load_all
from dtrain.yamlfile import compose_load

CONFIG = "dtrain.yaml"
REQUIREMENTS = "requirements.txt"
SKIP = {".git", "__pycache__", ".venv", ".mypy_cache", ".pytest_cache"}  # not part of the tag hash
CHECK_SCRIPT = Path(__file__).resolve().parent / "check_requirements.py"
GPU_CHECK_SCRIPT = contract.NODE_SCRIPTS / "gpu_build_check.py"  # the wheel variants' own check
SUPPORT_DIR = "/tmp/dtrain-support"  # where the project Dockerfile mounts the support image
CHECK_PREFIX = "dtrain-check:"


@dataclass(frozen=True)
class Req:
    """One requirement that applies to the image (its marker holds)."""
    where: str  # "DIR/requirements.txt:3"
    spec: str  # the line as written, options dropped
    name: str  # canonical distribution name
    req: Requirement = field(compare=False)


@dataclass(frozen=True)
class Support:
    """What the build mounts from the support image: the import check, its plan, the
    companion requirements and the wheels they come from (when from a wheelhouse)."""
    files: tuple[tuple[str, bytes], ...]  # (relative path, content); wheels are paths below
    wheels: tuple[Path, ...]
    companion_index: str | None  # pip --index-url for the companions, when not from wheels
    companion_pins: tuple[str, ...]  # constraints, e.g. torchvision==0.28.*
    companion_names: tuple[str, ...]

    @property
    def digest(self) -> str:
        h = hashlib.sha256()
        for name, data in self.files:
            h.update(name.encode() + b"\0" + data + b"\0")
        for w in self.wheels:
            h.update(b"wheels/" + w.name.encode() + b"\0" + w.read_bytes() + b"\0")
        return h.hexdigest()[:12]


@dataclass(frozen=True)
class ProjectPlan:
    directory: Path
    name: str  # repository-safe directory name
    base: Image
    requirements: str  # requirements.txt text ("" when absent)
    tag: str  # content hash
    support: Support | None = None  # None when there are no requirements

    @property
    def base_ref(self) -> str:
        return local_ref(self.base)

    @property
    def ref(self) -> str:
        return f"dtrain/project-{self.name}:{self.tag}"

    @property
    def support_ref(self) -> str:
        return f"dtrain/project-{self.name}-support:{self.support.digest}" if self.support else ""

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


def choose_base(from_: str, images: list[Image], label: str = "--from") -> Image:
    """'FAMILY' (its CPU variant) or 'FAMILY:TAG' -> the spec image to build FROM (label: where
    from_ came from, for the message)."""
    family, _, tag = from_.partition(":")
    same = [i for i in images if i.family == family]
    if not same:
        known = ", ".join(sorted({i.family for i in images}))
        raise BuildError(f"{label} {from_}: unknown family {family!r}; known: {known}")
    if tag:
        chosen = [i for i in same if i.tag == tag]
        if not chosen:
            raise BuildError(f"{label} {from_}: {family} has no tag {tag}; known: "
                             + ", ".join(sorted(i.tag for i in same)))
        return chosen[0]
    cpu = [i for i in same if not i.gpu]
    if len(cpu) != 1:
        raise BuildError(f"{label} {from_}: name the variant, {family}:TAG")
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
    env = _marker_env(img)
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


def _marker_env(img: Image) -> dict[str, str]:
    return {**default_environment(), "python_version": img.variant.python,
            "python_full_version": img.variant.python + ".0", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64"}


def applicable(text: str, img: Image, source: str = REQUIREMENTS) -> list[Req]:
    """The requirements pip installs in the image (valid, marker true), in file order."""
    env, out = _marker_env(img), []
    for n, line in _requirement_lines(text):
        if line.startswith("-"):
            continue
        spec = re.split(r"\s--?\w", line, maxsplit=1)[0].strip()
        try:
            req = Requirement(spec)
        except InvalidRequirement:
            continue  # conflicts() reports it
        if req.marker is None or req.marker.evaluate(env):
            out.append(Req(f"{source}:{n}", spec, canonicalize_name(req.name), req))
    return out


def companion_table(img: Image) -> dict[str, str | None]:
    """{companion: its minor built for this image's torch, or None when no release is}
    (compat.yaml torch_companions); {} for a TensorFlow image."""
    if img.framework != "pytorch":
        return {}
    table = img.compat.torch_companions
    row = table.get(minor(img.framework_version), {})
    return {name: row.get(name) for name in sorted({n for r in table.values() for n in r})}


def local_label(img: Image) -> str:
    """The local version label of the image's torch as installed: '' for a wheel GPU variant
    (PyPI's default torch, 2.13.0, is the CUDA build and has none), else 'cpu' or 'cu128'."""
    return "" if img.wheels else torch_flavour(img)


def with_label(version: str, label: str) -> str:
    return f"{version}+{label}" if label else version


def companion_check_args(img: Image) -> list[str]:
    """launch/node/gpu_build_check.py's argv in a project image built from a wheel GPU variant:
    the variant's own checks (its CUDA build, cuDNN, NCCL, ldd) again, since a requirement can
    move an nvidia-* wheel, plus each torch companion's version and import when one is installed
    (`--companion=torchvision:0.28`); [] for any other base."""
    if not img.wheels:
        return []
    from dtrain.images.render import gpu_check_args

    return gpu_check_args(img) + [f"--companion={n}:{m}" for n, m in companion_table(img).items() if m]


def _allows_minor(req: Requirement, want: str) -> bool:
    return any(req.specifier.contains(f"{want}.{patch}", prereleases=True) for patch in range(10))


def companions(reqs: list[Req], img: Image) -> tuple[list[Req], list[str]]:
    """(the requirements that are framework companions, one line per one that cannot match)."""
    table, torch, ref = companion_table(img), img.framework_version, local_ref(img)
    out, problems = [], []
    for r in reqs:
        if r.name not in table:
            continue
        want = table[r.name]
        if want is None:
            problems.append(f"{r.where}: {r.spec}: no {r.name} release is built for torch {torch} ({ref}); "
                            f"drop it or build --from a variant with an older torch (images/compat.yaml "
                            "torch_companions)")
        elif r.req.url:
            problems.append(f"{r.where}: {r.spec}: {r.name} must come from where the image's torch comes "
                            f"from; write `{r.name}` without the URL (it gets {r.name} {want}.*, built for "
                            f"torch {torch})")
        elif not _allows_minor(r.req, want):
            problems.append(f"{r.where}: {r.spec} does not match {ref}: torch {torch} needs {r.name} "
                            f"{want}.*; allow it, or build --from a variant whose torch matches")
        else:
            out.append(r)
    return out, problems


def companion_wheels(comps: list[Req], img: Image, wheels: list[str]) -> tuple[list[str], list[str]]:
    """(wheel file names that serve the companions, one line per companion the wheelhouse lacks)."""
    table, flavour, py = companion_table(img), local_label(img), img.variant.python.replace(".", "")
    chosen, missing = [], []
    for r in comps:
        want = table[r.name]
        found = []
        for w in wheels:
            try:
                name, version, _, tags = parse_wheel_filename(w)
            except (InvalidWheelFilename, InvalidVersion):
                continue
            if (name == r.name and (version.local or "") == flavour and f"{version.major}.{version.minor}" == want
                    and r.req.specifier.contains(version, prereleases=True)
                    and any(t.interpreter in (f"cp{py}", "py3") for t in tags)):
                found.append(w)
        if found:
            chosen.append(max(found, key=lambda w: parse_wheel_filename(w)[1]))
        else:
            missing.append(r.name)
    return chosen, missing


def check_plan(reqs: list[Req], img: Image) -> dict:
    """What check_requirements.py reads: the requirements and the fix for each kind of failure."""
    torch, flavour = img.framework_version, local_label(img)
    comps = {}
    for name, want in companion_table(img).items():
        comps[name] = (f"{name} must be the build for torch {with_label(torch, flavour)}: list {name} in "
                       f"requirements.txt and put a {name} {with_label(want + '.*', flavour)} wheel in "
                       "--wheelhouse DIR beside the torch wheel (without --wheelhouse it comes from "
                       + ("PyPI, as the image's torch did)" if img.wheels else "the family's PyTorch index)")
                       if want else
                       f"no {name} release is built for torch {torch}: drop the requirement that needs it")
    py = img.variant.python
    fw = f"{img.framework} {img.framework_version}"
    return {"requirements": [{"where": r.where, "spec": r.spec, "name": r.name} for r in reqs],
            "flavour": flavour if img.framework == "pytorch" else "",
            "companions": comps,
            "fix": f"it installed but does not import with this image's Python {py} and {fw}: pin a "
                   "version that supports them, add what it needs to requirements.txt, or drop it"}


def support(text: str, img: Image, source: str, wheelhouse: Path | None,
            wheels: list[str] | None) -> tuple[Support, list[str]]:
    """The support image's content for a requirements text, and one line per companion that
    cannot come from the framework's source (the wheelhouse when it holds the image's torch)."""
    reqs = applicable(text, img, source)
    comps, problems = companions(reqs, img)
    chosen: list[str] = []
    index = None
    if comps and wheels is not None and torch_wheel_present(wheels, img.framework_version):
        chosen, missing = companion_wheels(comps, img, wheels)
        table, flavour, torch = companion_table(img), local_label(img), img.framework_version
        where = "PyPI has" if img.wheels else f"the PyTorch index for {flavour} builds has"
        for r in comps:
            if r.name in missing:
                problems.append(
                    f"{r.where}: {r.spec}: the image's torch {with_label(torch, flavour)} comes from --wheelhouse "
                    f"{wheelhouse}, which has no {r.name} {with_label(table[r.name] + '.*', flavour)} wheel for "
                    f"Python {img.variant.python}: put that wheel there ({where} it), or drop {r.name}"
                    + ("" if img.wheels else f"; PyPI's {r.name} is built for another torch and fails to import"))
    elif comps:
        index = torch_index(img)
    table = companion_table(img)
    files = (("check_requirements.py", CHECK_SCRIPT.read_bytes()),
             ("check.json", (json.dumps(check_plan(reqs, img), indent=1) + "\n").encode()),
             ("companions.txt", "".join(r.spec + "\n" for r in comps).encode()))
    if img.wheels:  # the wheel variant's own in-image check, run again after the requirements
        files += (("gpu_build_check.py", GPU_CHECK_SCRIPT.read_bytes()),)
    return Support(files, tuple(wheelhouse / w for w in chosen) if wheelhouse else (), index,
                   tuple(f"{r.name}=={table[r.name]}.*" for r in comps),
                   tuple(r.name for r in comps)), problems


def constraints(img: Image) -> list[str]:
    pins, _ = framework_pins(img)
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


REQUIREMENTS_MAX = 1 << 20  # bytes of a requirements.txt; more is not a list of packages


def requirements_text(req_path: Path) -> str:
    """A project's requirements.txt ("" when there is none), read by values.read_user_file: a
    regular file of at most REQUIREMENTS_MAX bytes, not a link (a cloned project's link to
    /proc/kmsg or to a file outside it), not a FIFO; BuildError, one line, otherwise."""
    from dtrain.values import BadValue, small_text_file

    if not (req_path.exists() or req_path.is_symlink()):
        return ""
    try:
        return small_text_file(req_path, "requirements.txt", "pip requirement lines", REQUIREMENTS_MAX, follow=False)
    except BadValue as e:
        raise BuildError(str(e)) from None


def tree_hash(directory: Path, base_ref: str) -> str:
    """12 hex digits over the base reference, every file's path and bytes (not .git, caches); a
    symbolic link by where it points (the build context sends it as a link, and a link to
    /proc/kmsg or a FIFO must not be read), a file streamed from the descriptor it was checked on
    (opened O_NONBLOCK|O_NOFOLLOW: a file swapped for a FIFO meanwhile is not waited on)."""
    import stat

    h = hashlib.sha256(base_ref.encode() + b"\0")
    for path in sorted(p for p in directory.rglob("*") if not SKIP & set(p.relative_to(directory).parts)):
        rel = str(path.relative_to(directory)).encode()
        try:
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                h.update(rel + b"\0->" + os.fsencode(os.readlink(path)) + b"\0")
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError as e:
            raise BuildError(f"--project {directory}: cannot read {path}: {e.strerror or e}") from None
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            h.update(rel + b"\0")
            while chunk := f.read(1 << 20):
                h.update(chunk)
            h.update(b"\0")
    return h.hexdigest()[:12]


def plan(directory: Path, from_: str | None, images: list[Image] | None = None,
         wheelhouse: Path | None = None) -> ProjectPlan:
    """Everything the build needs, checked: the base, the requirements, the tag."""
    if not directory.is_dir():
        raise BuildError(f"--project {directory}: not a directory")
    config = directory / CONFIG
    label = "--from"
    if not from_ and (config.exists() or config.is_symlink()):
        from dtrain.values import BadValue, small_text_file

        label = f"{config}: from:"
        try:
            doc = compose_load(small_text_file(config, "project file", "`from: FAMILY[:TAG]`", follow=False))[1] or {}
        except BadValue as e:
            raise BuildError(str(e)) from None
        except yaml.YAMLError as e:  # too deep, 5,000 digits: a YAMLError too (compose_load)
            raise BuildError(f"{config}: not valid YAML: {' '.join(str(e).split())}") from None
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
    base = choose_base(from_, images, label)
    req_path = directory / REQUIREMENTS
    text = requirements_text(req_path)
    problems = conflicts(text, base, str(req_path))
    if wheelhouse is not None and not wheelhouse.is_dir():
        raise BuildError(f"--wheelhouse {wheelhouse}: not a directory")
    wheels = sorted(p.name for p in wheelhouse.glob("*.whl")) if wheelhouse else None
    sup, more = support(text, base, str(req_path), wheelhouse, wheels)
    problems += more
    if problems:  # one line: each problem names its requirements.txt line
        raise BuildError(problems[0] if len(problems) == 1 else
                         f"{len(problems)} problems: " + " | ".join(problems))
    has_reqs = bool(text.strip())
    key = local_ref(base) + (f"\0{sup.digest}" if has_reqs else "")
    return ProjectPlan(directory.resolve(), repo_name(directory), base, text, tree_hash(directory, key),
                       sup if has_reqs else None)


def dockerfile(p: ProjectPlan) -> str:
    from dtrain.images.render import _jinja

    sup = p.support
    index_failure = ""
    if sup and sup.companion_index:
        names = ", ".join(sup.companion_names)
        index_failure = (f"{CHECK_PREFIX} {names}: cannot be installed from {sup.companion_index}, the PyTorch "
                         f"index the torch of the image comes from; put the {names} wheels built for torch "
                         f"{p.base.framework_version}+{torch_flavour(p.base)} in a directory with the torch "
                         "wheel and build with --wheelhouse DIR, or drop them").replace("'", "")
    return _jinja().get_template("project.Dockerfile.j2").render(
        name=p.name, base=p.base_ref, requirements=sup is not None,
        requirements_sha256=p.requirements_sha256, constraints=constraints(p.base) + list(sup.companion_pins if sup else ()),
        support=p.support_ref, support_dir=SUPPORT_DIR, companion_wheels=bool(sup and sup.wheels),
        gpu_check=companion_check_args(p.base),
        companion_index=sup.companion_index if sup else None, index_failure=index_failure)


def check_failures(log_text: str) -> list[str]:
    """The import check's (and companion install's) failure lines in a BuildKit plain log."""
    out = []
    for line in log_text.splitlines():
        m = re.match(rf"^#\d+ [\d.]+ {re.escape(CHECK_PREFIX)} (.*)$", line)
        if m and not m.group(1).startswith("ok "):
            out.append(m.group(1))
    return list(dict.fromkeys(out))


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


def check(directory: Path, from_: str | None, opts: BuildOptions) -> ProjectPlan:
    """Everything a project build can check without the engine: the flags' files, the plan."""
    from dtrain.images.build import check_paths

    check_paths(opts)
    return plan(directory, from_, wheelhouse=opts.wheelhouse)


def build(directory: Path, from_: str | None, opts: BuildOptions,
          say: Callable[[str], None] = print, checked: ProjectPlan | None = None) -> str:
    """Build the project image (`checked`: check()'s plan, made before the engine started);
    returns its reference."""
    from dtrain import engine

    p = checked or check(directory, from_, opts)
    docker = require_engine()
    if not engine.image_exists(p.base_ref):
        raise BuildError(f"{p.base_ref} is not built here: run `dtrain build --image {p.base.family} "
                         f"--tag {p.base.tag}` first")
    out = ROOT / "build" / "project" / p.name
    out.mkdir(parents=True, exist_ok=True)
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / f"project-{p.name}.log"
    state, start = _Progress(), time.monotonic()
    if p.support and not engine.image_exists(p.support_ref):
        _build_support(p, out / "support", docker, LOG_DIR / f"project-{p.name}-support.log", say)
    path = out / "Dockerfile"
    path.write_text(dockerfile(p))
    say(f"[build] project {directory} FROM {p.base_ref} -> {p.ref}")
    with secret_copies(opts) as copies:  # BuildKit reads the --ca-bundle/--pip-conf that were checked
        code = _run_streaming(build_argv(p, copies, docker=docker, dockerfile_path=path), log,
                              f"[project-{p.name}]", state, say)
    if code != 0:
        failures = check_failures(log.read_text())
        if failures:  # the import check (or the companion install) says what is wrong, one line each
            raise BuildError("\n".join(f"building {p.ref} failed: {f}" for f in failures)
                             + f" (build log: {log})")
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise BuildError(f"building {p.ref} failed" + (f": {state.errors[-1]}" if state.errors else "")
                         + f"\n--- last lines of the build log ---\n{tail}\n--- full log: {log}")
    say(f"[build] {p.ref} built in {time.monotonic() - start:.1f} s; push it with "
        f"`dtrain push --registry HOST[:PORT] --image project-{p.name}:{p.tag}` (or --ecr)")
    return p.ref


def _build_support(p: ProjectPlan, ctx: Path, docker: str, log: Path, say: Callable[[str], None]) -> None:
    """Build the support image (FROM scratch: the check, its plan, companion wheels) that the
    project Dockerfile bind-mounts; nothing of it stays in the project image's layers."""
    assert p.support
    shutil.rmtree(ctx, ignore_errors=True)
    (ctx / "wheels").mkdir(parents=True)
    for name, data in p.support.files:
        (ctx / name).write_bytes(data)
    for w in p.support.wheels:
        try:
            os.link(w, ctx / "wheels" / w.name)
        except OSError:
            shutil.copy2(w, ctx / "wheels" / w.name)
    dockerfile_path = ctx.parent / "support.Dockerfile"
    dockerfile_path.write_text("FROM scratch\nCOPY . /dtrain/\n")
    argv = [docker, "build", "--progress=plain", "-f", str(dockerfile_path), "-t", p.support_ref, str(ctx)]
    say(f"[build] support image {p.support_ref} (import check"
        + (f", {len(p.support.wheels)} companion wheel(s)" if p.support.wheels else "") + ")")
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    r = subprocess.run(argv, capture_output=True, text=True, env=env)
    log.write_text("$ " + " ".join(argv) + "\n" + r.stdout + r.stderr)
    if r.returncode != 0:
        raise BuildError(f"building {p.support_ref} failed: {(r.stderr.strip().splitlines() or [''])[-1]} "
                         f"(log: {log})")
