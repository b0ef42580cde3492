"""Build rendered Dockerfiles into images with BuildKit.

`build_argv` is pure (options in, argv out). `build_one` runs it, shows one line per build
step (the full BuildKit log goes to build/logs/), and measures time, size and cache hits.
Secrets (CA bundle, pip config) only ever reach the build as `--secret`, never as files in
the context. The context is the repository root, narrowed by .dockerignore to launch/node/,
the pure command builders (image_sources()) and .wheelhouse/.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from dtrain import table
from dtrain.images.render import ROOT, image_repo, local_ref, output_path, render  # noqa: F401 (local_ref: build.local_ref)
from dtrain.images.render import train_sources
from dtrain.images.spec import Image, SpecError, load_all, size_over_budget

WHEELHOUSE = ROOT / ".wheelhouse"
LOG_DIR = ROOT / "build" / "logs"


def image_sources() -> tuple[str, ...]:
    """What the images copy from the checkout besides the wheels (.dockerignore lets these
    through): launch/node/ and the modules its sagemaker_train.py imports (render.train_sources)."""
    return ("launch/node", *(f for _, files in train_sources() for f in files))


class BuildError(Exception):
    """A build failed or cannot start. str() is the user-facing message."""


@dataclass(frozen=True)
class BuildOptions:
    base_image: str | None = None  # replaces both stages' base (BASE_IMAGE, BUILDER_IMAGE)
    builder_image: str | None = None  # replaces only the builder stage's base
    ca_bundle: Path | None = None  # BuildKit secret id=ca
    pip_conf: Path | None = None  # BuildKit secret id=pipconf
    wheelhouse: Path | None = None  # wheels offered to pip before any index
    push_cache: str | None = None  # registry repository for inline build cache
    no_cache: bool = False


@dataclass(frozen=True)
class BuildResult:
    family: str
    tag: str
    ref: str
    seconds: float
    size: int
    steps: int
    cached: int
    log: Path


@dataclass
class _Progress:
    steps: dict[str, str] = field(default_factory=dict)  # "#7" -> "[runtime 3/9] RUN ..."
    cached: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- pure parts


def select(images: list[Image], tag: str | None, all_variants: bool, wheels: bool = False) -> list[Image]:
    """Which variants to build: one tag, every variant, the GPU variants built from PyPI's CUDA
    wheels (`wheels`; with `all_variants`, everything), or (default) the CPU variants."""
    if tag:
        chosen = [i for i in images if i.tag == tag]
        if not chosen:
            known = ", ".join(sorted(i.tag for i in images))
            raise BuildError(f"--tag {tag}: no variant has this tag; known: {known}")
        return chosen
    if all_variants:
        return images
    return [i for i in images if i.wheels] if wheels else [i for i in images if not i.gpu]


def torch_wheel_present(wheel_names: list[str], version: str) -> bool:
    return any(re.match(rf"torch-{re.escape(version)}(\+[\w.]+)?-", n) for n in wheel_names)


def build_argv(img: Image, opts: BuildOptions, *, docker: str, dockerfile: Path,
               revision: str, created: str, wheels: list[str], target: str | None = None,
               cache_from: list[str] = ()) -> list[str]:
    ref = local_ref(img) if target is None else f"{local_ref(img)}-{target}"
    argv = [docker, "build", "--progress=plain", "-f", str(dockerfile), "-t", ref,
            "--build-arg", f"DTRAIN_REVISION={revision}",
            "--build-arg", f"DTRAIN_CREATED={created}"]
    if opts.base_image:
        argv += ["--build-arg", f"BASE_IMAGE={opts.base_image}",
                 "--build-arg", f"BUILDER_IMAGE={opts.builder_image or opts.base_image}"]
    elif opts.builder_image:
        argv += ["--build-arg", f"BUILDER_IMAGE={opts.builder_image}"]
    if img.framework == "pytorch" and torch_wheel_present(wheels, img.framework_version):
        argv += ["--build-arg", "TORCH_INDEX_URL="]  # the wheelhouse has it: no index needed
    if opts.ca_bundle:
        argv += ["--secret", f"id=ca,src={opts.ca_bundle}"]
    if opts.pip_conf:
        argv += ["--secret", f"id=pipconf,src={opts.pip_conf}"]
    if opts.push_cache:
        argv += ["--build-arg", "BUILDKIT_INLINE_CACHE=1"]
        for ref_ in cache_from:
            argv += ["--cache-from", ref_]
    if opts.no_cache:
        argv.append("--no-cache")
    if target:
        argv += ["--target", target]
    argv.append(str(ROOT))
    return argv


_STEP = re.compile(r"^(#\d+) (\[[^\]]*\d+/\d+\] .*)$")
_CACHED = re.compile(r"^(#\d+) CACHED$")
_ERROR = re.compile(r"^(#\d+ ERROR: .*|ERROR: .*|error: .*)$")


def progress_event(line: str, state: _Progress) -> str | None:
    """Feed one BuildKit plain-progress line; return a line worth showing, if any."""
    if m := _STEP.match(line):
        if m.group(1) in state.steps:
            return None  # BuildKit repeats a header when it switches between parallel steps
        state.steps[m.group(1)] = m.group(2)
        return " ".join(m.group(2).split())
    if m := _CACHED.match(line):
        if m.group(1) in state.steps:
            state.cached.add(m.group(1))
        return None
    if m := _ERROR.match(line):
        state.errors.append(m.group(1))
        return m.group(1)
    return None


def human_size(n: int) -> str:
    if n >= 1024**3:
        return f"{n / 1024**3:.2f} GiB"
    if n >= 1024**2:
        return f"{n / 1024**2:.0f} MiB"
    return f"{n / 1024:.0f} KiB"


def summary_table(results: list[BuildResult]) -> str:
    rows = [("image", "tag", "size", "build time", "layers cached")]
    for r in results:
        rows.append((f"dtrain/{r.family}", r.tag, human_size(r.size), f"{r.seconds:.1f} s",
                     f"{r.cached}/{r.steps}"))
    return table.text(rows, rule=True)


# ---------------------------------------------------------------- side effects


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def source_stamp() -> tuple[str, str]:
    """(revision, created) for the OCI labels: the commit and its time, so the same sources
    give the same image config (no wall-clock time in labels)."""
    rev = _git("rev-parse", "HEAD") or "unknown"
    if rev != "unknown" and _git("status", "--porcelain", "--", "images", "templates", *image_sources()):
        rev += "-dirty"
    created = _git("log", "-1", "--format=%cI") or "unknown"
    return rev, created


def sync_wheelhouse(src: Path | None) -> list[str]:
    """Make .wheelhouse/ hold exactly the wheels of `src` (hard links where possible)."""
    WHEELHOUSE.mkdir(exist_ok=True)
    wanted = {p.name: p for p in sorted(src.glob("*.whl"))} if src else {}
    if src and not src.is_dir():
        raise BuildError(f"--wheelhouse {src}: not a directory")
    for old in WHEELHOUSE.glob("*.whl"):
        if old.name not in wanted:
            old.unlink()
    for name, path in wanted.items():
        dst = WHEELHOUSE / name
        if dst.exists() and dst.stat().st_size == path.stat().st_size:
            continue
        try:
            os.link(path, dst)
        except OSError:
            shutil.copy2(path, dst)
    return sorted(wanted)


def default_ca_bundle() -> Path | None:
    """The CA bundle the host's pip trusts (a TLS-intercepting proxy's CA lives there)."""
    for var in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        value = os.environ.get(var)
        if value and Path(value).is_file():
            return Path(value)
    return None


def check_paths(opts: BuildOptions) -> None:
    """--ca-bundle and --pip-conf are regular files, --wheelhouse a directory (values.local_path,
    the CLI's one rule): checked before the engine starts (a FIFO or a device as a BuildKit
    secret would hang the build). One line naming the flag."""
    from dtrain.values import BadValue, local_path

    for label, path, want, what in (("--ca-bundle", opts.ca_bundle, "file", "a CA bundle"),
                                    ("--pip-conf", opts.pip_conf, "file", "a pip.conf"),
                                    ("--wheelhouse", opts.wheelhouse, "dir", "wheels")):
        if path is None:
            continue
        try:
            local_path(label, str(path), want, what)
        except BadValue as e:
            raise BuildError(str(e)) from None
        if not os.access(path, os.R_OK | (os.X_OK if want == "dir" else 0)):
            raise BuildError(f"{label} {path}: not readable by this user")


PEM_MAX = 16 << 20  # --ca-bundle: values.pem_file's limit


@contextlib.contextmanager
def secret_copies(opts: BuildOptions) -> Iterator[BuildOptions]:
    """opts with --ca-bundle and --pip-conf replaced by private copies (a 0700 temporary
    directory, removed after) of what values.read_user_file read and checked: BuildKit reads
    the copy, so the file it gets is the one checked, not whatever the path names by then (a
    FIFO or /proc/kmsg swapped in would hang the build). One line naming the flag otherwise."""
    import dataclasses
    import tempfile

    from dtrain.values import SMALL_FILE_MAX, BadValue, read_user_file

    given = [(name, flag, path, what, expected, limit) for name, flag, path, what, expected, limit in (
        ("ca_bundle", "--ca-bundle", opts.ca_bundle, "CA bundle", "PEM certificates", PEM_MAX),
        ("pip_conf", "--pip-conf", opts.pip_conf, "pip.conf", "INI sections such as [global]", SMALL_FILE_MAX))
        if path is not None]
    if not given:
        yield opts
        return
    with tempfile.TemporaryDirectory(prefix="dtrain-secrets-") as d:
        copies = {}
        for name, flag, path, what, expected, limit in given:
            try:
                data = read_user_file(path, what, expected, limit)
            except BadValue as e:
                raise BuildError(f"{flag} {e}") from None
            copy = Path(d) / name
            fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            copies[name] = copy
        yield dataclasses.replace(opts, **copies)


def check(families: list[str] | None, tag: str | None, all_variants: bool, opts: BuildOptions,
          wheels: bool = False) -> list[Image]:
    """Everything `build` can check without the engine: the variants, the rendered Dockerfiles,
    the flags' files. The variants to build."""
    try:
        images = select(load_all(families), tag, all_variants, wheels)
    except SpecError as e:
        raise BuildError(str(e)) from None
    _check_inputs(images, opts)
    return images


def _check_inputs(images: list[Image], opts: BuildOptions) -> None:
    check_paths(opts)
    for img in images:
        path = output_path(img)
        if not path.exists() or path.read_text() != render(img):
            raise BuildError(f"{path.relative_to(ROOT)} is missing or out of date: run `dtrain render`")


def _run_streaming(argv: list[str], log: Path, prefix: str, state: _Progress,
                   say: Callable[[str], None]) -> int:
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    with log.open("w") as out:
        out.write("$ " + " ".join(argv) + "\n")
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env, cwd=ROOT, bufsize=1)
        assert proc.stdout
        try:
            for line in proc.stdout:
                out.write(line)
                shown = progress_event(line.rstrip("\n"), state)
                if shown:
                    say(f"{prefix} {shown[:150]}")
            return proc.wait()
        except KeyboardInterrupt:
            proc.kill()
            proc.wait()
            raise


def _image_size(docker: str, ref: str) -> int:
    out = subprocess.run([docker, "image", "inspect", "-f", "{{.Size}}", ref],
                         capture_output=True, text=True)
    return int(out.stdout.strip() or 0)


def build_one(img: Image, opts: BuildOptions, *, docker: str, wheels: list[str],
              say: Callable[[str], None] = print) -> BuildResult:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / f"{img.family}-{img.tag}.log"
    prefix = f"[{img.family}]"
    revision, created = source_stamp()
    dockerfile = output_path(img)
    state = _Progress()
    start = time.monotonic()
    cache_refs: list[str] = []
    if opts.push_cache:
        cache_refs = [f"{opts.push_cache}:{img.tag}-builder", f"{opts.push_cache}:{img.tag}"]
        # Inline cache holds only the built target's layers: build and push the builder
        # stage on its own so the compile steps are cached too.
        argv = build_argv(img, opts, docker=docker, dockerfile=dockerfile, revision=revision,
                          created=created, wheels=wheels, target="builder", cache_from=cache_refs)
        if _run_streaming(argv, log, prefix, state, say) != 0:
            raise _failure(img, log, state)
    argv = build_argv(img, opts, docker=docker, dockerfile=dockerfile, revision=revision,
                      created=created, wheels=wheels, cache_from=cache_refs)
    log_main = log if not opts.push_cache else log.with_suffix(".runtime.log")
    if _run_streaming(argv, log_main, prefix, state, say) != 0:
        raise _failure(img, log_main, state)
    seconds = time.monotonic() - start
    ref = local_ref(img)
    if opts.push_cache:
        for src, dst in ((f"{ref}-builder", cache_refs[0]), (ref, cache_refs[1])):
            _push_cache(docker, src, dst)
        say(f"{prefix} build cache pushed to {opts.push_cache}")
    return BuildResult(img.family, img.tag, ref, seconds, _image_size(docker, ref),
                       len(state.steps), len(state.cached), log_main)


def _push_cache(docker: str, src: str, dst: str) -> None:
    """Tag src as dst and push it; then remove the references that made in the local engine
    (the tag, REPO@DIGEST), as `dtrain push` does: the next build reads the cache from the
    registry, and src keeps the image."""
    from dtrain.images.push import inspect_image, parse_push_digest, refs_made_by_push

    existed, digest = inspect_image(dst) is not None, None
    digests_before = (inspect_image(src) or {}).get("RepoDigests") or []
    try:
        for cmd in ([docker, "tag", src, dst], [docker, "push", dst]):
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise BuildError(f"pushing build cache {dst} failed: {r.stderr.strip()[-400:]}")
        digest = parse_push_digest(r.stdout)
    finally:
        for made in refs_made_by_push(dst, existed, digests_before, digest):
            subprocess.run([docker, "image", "rm", made], capture_output=True)


def require_engine() -> str:
    """The docker CLI, once the engine answers; the caller starts the engine (`dtrain build`:
    engine.ensure_dockerd, the demo and tests: engine.ensure_all), once."""
    from dtrain import engine

    docker = engine.docker_cli()
    if not engine.docker_ok():
        raise BuildError("the Docker engine does not answer (`docker info`): `dtrain build` starts it")
    return docker


def _failure(img: Image, log: Path, state: _Progress) -> BuildError:
    tail = log.read_text().splitlines()[-25:]
    return BuildError(
        f"building {local_ref(img)} failed"
        + (f": {state.errors[-1]}" if state.errors else "")
        + "\n--- last lines of the build log ---\n" + "\n".join(tail)
        + f"\n--- full log: {log.relative_to(ROOT)}")


def build(families: list[str] | None, tag: str | None, all_variants: bool, opts: BuildOptions,
          say: Callable[[str], None] = print, wheels: bool = False) -> list[BuildResult]:
    """Build the selected variants one after the other; print a summary table."""
    from dtrain import engine

    images = check(families, tag, all_variants, opts, wheels)
    docker = require_engine()
    if opts.base_image and not engine.image_exists(opts.base_image):
        raise BuildError(f"--base-image {opts.base_image} is not in the local engine "
                         "(pull or import it first)")
    wheels = sync_wheelhouse(opts.wheelhouse)
    if opts.ca_bundle:
        say(f"[build] CA bundle {opts.ca_bundle} goes in as a BuildKit secret (not stored in any layer)")
    results = []
    with secret_copies(opts) as opts:
        for n, img in enumerate(images, 1):
            say(f"[build] ({n}/{len(images)}) {local_ref(img)}")
            results.append(build_one(img, opts, docker=docker, wheels=wheels, say=say))
            say(f"[build] {local_ref(img)} built in {results[-1].seconds:.1f} s")
            over = size_over_budget(results[-1].ref, results[-1].size, img.variant.size_gib)
            if over:
                raise BuildError(over)
    say("\n" + summary_table(results))
    return results
