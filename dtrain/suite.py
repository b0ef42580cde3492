"""`dtrain test`: dtrain's own tests, in at most 45 minutes on a 2-core machine (CI has 90).

The suite has parts that want different things from the machine. The cluster tests (marked
`docker` or `cluster`) drive a simulated cluster: much of their time is spent waiting (timeouts
that must pass, nodes that must answer, a hang that must be seen), so a core is often idle. So they
run in two parts at once, each on a simulated cluster of its own: the modules marked
`second_cluster` (they name no address or path of the first cluster, nor do the helpers they
import) on a second one (DTRAIN_SIM_SLOT=1: its own bridge, subnet, namespaces, registry;
launch/infra/cluster.py) at `nice 2`, the rest, the timing-bound ones among them, on the first. The unit part (everything else, 2,300 tests: short CPU bursts) runs beside
both, in a third pytest process at a lower priority (`nice`), taking the cycles the cluster parts
leave. Unit tests whose own timing a busy machine would upset (a heartbeat every second, a
supervisor that must notice within a bound) are marked `serial` and run in the first cluster part.

`parts()` says what runs (pure); `run()` runs it: the first cluster part in the foreground (its
output live), the others' output kept in files and shown after, each with its slowest tests
(`--durations`). The exit status is the first part's failure, else 0. Ctrl-C stops every part.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

# (a -m replaces pyproject's `-m 'not gpu_build'`: each says it again)
CLUSTER = "(docker or cluster or serial) and not second_cluster and not gpu_build"  # the foreground: the first cluster
SECOND = "(docker or cluster or serial) and second_cluster and not gpu_build"  # beside it, on a second simulated cluster
SECOND_SLOT = "1"  # DTRAIN_SIM_SLOT of the second cluster (launch/infra/cluster.py)
UNIT = "not docker and not cluster and not gpu_build"
BESIDE = "not docker and not cluster and not serial and not gpu_build"  # the unit part beside the cluster part
EVERYTHING = "not gpu_build"
NICE = 5  # the unit part's priority below the cluster parts' (the cluster parts' timing comes first)
SECOND_NICE = 2  # the second cluster part's, a little below the first's: the timing-bound (`serial`) tests run there
NO_TESTS = 5  # pytest's exit status when a -k expression leaves a part with nothing to run


@dataclass(frozen=True)
class Part:
    name: str
    argv: tuple[str, ...]
    beside: bool  # runs in the background, its output shown after the foreground part
    env: tuple[tuple[str, str], ...] = ()  # set for this part (the second cluster's slot)


def pytest_argv(marks: str, k: str | None, python: str = sys.executable) -> list[str]:
    argv = [python, "-m", "pytest", "-q", "--durations=25", "-m", marks]  # the slowest tests, in every run's output
    return argv + (["-k", k] if k else [])


def parts(k: str | None, unit: bool, serial: bool, python: str = sys.executable) -> list[Part]:
    """unit: the unit tests alone. serial: everything in one process, one test after another, on one
    simulated cluster (slower). Else the first cluster part in the foreground, the second cluster
    part and the unit part beside it."""
    if unit:
        return [Part("unit", tuple(pytest_argv(UNIT, k, python)), beside=False)]
    if serial:
        return [Part("all", tuple(pytest_argv(EVERYTHING, k, python)), beside=False)]
    return [Part("unit", ("nice", "-n", str(NICE), *pytest_argv(BESIDE, k, python)), beside=True),
            Part("second cluster", ("nice", "-n", str(SECOND_NICE), *pytest_argv(SECOND, k, python)), beside=True,
                 env=(("DTRAIN_SIM_SLOT", SECOND_SLOT),)),
            Part("cluster", tuple(pytest_argv(CLUSTER, k, python)), beside=False)]


def exit_status(codes: Sequence[int]) -> int:
    """The first failure; a part a -k expression left empty is not one unless every part is."""
    real = [c for c in codes if c != NO_TESTS]
    if not real:
        return NO_TESTS
    return next((c for c in real if c != 0), 0)


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60)} s"


def run(k: str | None, unit: bool, serial: bool, cwd: Path, say: Callable[[str], None] = print) -> int:
    plan = parts(k, unit, serial)
    scratch = Path(tempfile.mkdtemp(prefix="dtrain-test-"))
    beside: list[tuple[Part, subprocess.Popen, Path, float]] = []
    codes: list[int] = []
    try:
        for part in (p for p in plan if p.beside):
            slug = part.name.replace(" ", "-")
            log = scratch / f"{slug}.log"
            # its own --basetemp: the sessions' tmp_path trees never meet
            argv = [*part.argv, f"--basetemp={scratch / slug}"]
            with open(log, "wb") as out:
                proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **dict(part.env)},
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            beside.append((part, proc, log, time.monotonic()))
            how = (f" (nice {part.argv[2]}" + "".join(f", {k}={v}" for k, v in part.env) + ")") if part.argv[0] == "nice" \
                else "".join(f" ({k}={v})" for k, v in part.env)
            say(f"[test] the {part.name} tests run beside{how}; their output follows "
                f"the {' and '.join(p.name for p in plan if not p.beside)} tests' ({log})")
        for part in (p for p in plan if not p.beside):
            began = time.monotonic()
            codes.append(subprocess.call(list(part.argv), cwd=cwd, env={**os.environ, **dict(part.env)}))
            if beside:
                say(f"[test] the {part.name} tests took {_minutes(time.monotonic() - began)}")
        for part, proc, log, began in beside:
            if proc.poll() is None:
                say(f"[test] waiting for the {part.name} tests")
            code = proc.wait()
            took = time.monotonic() - began
            sys.stdout.write(f"\n[test] the {part.name} tests ({_minutes(took)}, beside the others):\n")
            sys.stdout.write(log.read_text(errors="replace"))
            sys.stdout.flush()
            codes.append(code)
    except KeyboardInterrupt:
        for _, proc, _, _ in beside:
            _stop(proc)
        raise
    finally:
        for _, proc, _, _ in beside:
            _stop(proc)
        shutil.rmtree(scratch, ignore_errors=True)
    return exit_status(codes)


def _stop(proc: subprocess.Popen) -> None:
    """The part and every process it started (its own session): SIGINT as Ctrl-C would, then KILL."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGINT, 20), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue
