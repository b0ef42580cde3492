"""dtrain tasks: `invoke --list`. Each task parses flags and calls one function."""

from __future__ import annotations

import sys
from contextlib import contextmanager

from invoke import task


@contextmanager
def user_errors():
    """Known errors print one readable message and exit non-zero, without a traceback."""
    from images.build import BuildError
    from images.spec import SpecError

    try:
        yield
    except (SpecError, BuildError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


@task(help={"image": "one family (horovod-tensorflow, horovod-pytorch, pytorch-ddp); default all",
            "check": "do not write; fail if dockerfiles/ differs from the specs"})
def render(c, image=None, check=False):
    """Validate images/*.yaml against compat.yaml and write dockerfiles/<family>/<tag>/Dockerfile."""
    from images import render as r

    with user_errors():
        families = [image] if image else None
        if check:
            stale = [p for p, text in r.render_all(families).items()
                     if not p.exists() or p.read_text() != text]
            for p in stale:
                print(f"out of date: {p.relative_to(r.ROOT)}", file=sys.stderr)
            if stale:
                sys.exit("error: dockerfiles/ is out of date; run `invoke render`")
            print("dockerfiles/ matches images/*.yaml")
            return
        changed, removed = r.write_all(families)
        for p in changed:
            print(f"wrote   {p.relative_to(r.ROOT)}")
        for p in removed:
            print(f"removed {p.relative_to(r.ROOT)}")
        print(f"{len(changed)} written, {len(removed)} removed, all others unchanged")


@task(help={
    "image": "one family; default all three",
    "tag": "one variant by tag (see dockerfiles/<family>/)",
    "all": "every variant, GPU ones too (needs the nvidia/cuda bases); default: CPU variants",
    "base_image": "base for both stages, e.g. a mirrored or imported image (dtrain/debian:bookworm)",
    "builder_image": "base for the builder stage only",
    "ca_bundle": "CA bundle for pip/curl/apt inside the build, as a BuildKit secret "
                 "(default: the host pip's, from PIP_CERT)",
    "pip_conf": "pip.conf for the build (private index), as a BuildKit secret",
    "wheelhouse": "directory of wheels offered to pip first (offline builds)",
    "push_cache": "registry repository to pull and push inline build cache",
    "no_cache": "ignore the layer cache",
})
def build(c, image=None, tag=None, all=False, base_image=None, builder_image=None, ca_bundle=None,
          pip_conf=None, wheelhouse=None, push_cache=None, no_cache=False):
    """Build images with BuildKit from dockerfiles/ (run `invoke render` first)."""
    from pathlib import Path

    from images import build as b

    with user_errors():
        opts = b.BuildOptions(
            base_image=base_image, builder_image=builder_image,
            ca_bundle=Path(ca_bundle) if ca_bundle else b.default_ca_bundle(),
            pip_conf=Path(pip_conf) if pip_conf else None,
            wheelhouse=Path(wheelhouse) if wheelhouse else None,
            push_cache=push_cache, no_cache=no_cache)
        b.build([image] if image else None, tag, all, opts)


@task(help={"k": "only tests matching this pytest -k expression",
            "unit": "skip tests that need Docker or the simulated cluster"})
def test(c, k=None, unit=False):
    """Run the test suite (installs and starts what the integration tests need: root, Linux)."""
    args = ["python", "-m", "pytest", "-q"]
    if unit:
        args += ["-m", "not docker and not cluster"]
    if k:
        args += ["-k", k]
    c.run(" ".join(args), pty=False)
