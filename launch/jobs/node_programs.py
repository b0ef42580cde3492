"""The programs of launch/node/ as argv: what the launcher runs on a node or in a container.

One way for all of them: `bash -c PROGRAM NAME ARGS...`, the program text one argument and
every value (image, paths, names, the docker run argv) an argument of its own, so nothing a
user typed becomes shell text; secrets (registry password, job key, env values) go on stdin.
ssh_argv quotes the whole argv for the node's shell.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from dtrain import contract

# launch/node/host/: one function per file, main.sh last (it calls the step).
HOST_FILES = ("phase.sh", "probe.sh", "login.sh", "image.sh", "start.sh", "up.sh", "remove.sh", "doctor.sh", "holds.sh",
              "prepare.sh", "supervise.sh", "main.sh")


@functools.cache
def host_program() -> str:
    return "\n".join(contract.node_script(f"host/{f}") for f in HOST_FILES)


def host_argv(step: str, *args: str) -> list[str]:
    """argv for a node's shell: run STEP (up, pull, probe, remove, doctor, prepare, supervise) of launch/node/host/."""
    return ["bash", "-c", host_program(), "dtrain-node",
            contract.LABEL_JOB, contract.LABEL_MIN_DRIVER, contract.LABEL_OPENMPI_MAJOR, contract.SUPERVISOR_EVENT,
            step, *args]


def program_argv(script: str, args: Sequence[str]) -> list[str]:
    """argv for a node's shell or inside a container: launch/node/<script> with args."""
    return ["bash", "-c", contract.node_script(script), f"dtrain-{script.removesuffix('.sh')}", *args]


def container_argv(script: str, args: Sequence[str]) -> list[str]:
    """argv inside a container (after `docker exec NAME`): launch/node/<script> with args."""
    return program_argv(script, args)
