"""dtrain tasks: `invoke --list`. Each task parses flags and calls one function."""

from __future__ import annotations

import sys
from contextlib import contextmanager

from invoke import task


@contextmanager
def user_errors():
    """Known errors print one readable message and exit non-zero, without a traceback."""
    from images.spec import SpecError

    try:
        yield
    except SpecError as e:
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
