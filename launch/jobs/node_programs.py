"""The programs of launch/node/ as argv: what the launcher runs on a node or in a container.

One way for all of them: `bash -c PROGRAM NAME ARGS...`, the program text one argument and
every value (image, paths, names, the docker run argv) an argument of its own, so nothing a
user typed becomes shell text; secrets (registry password, job key, env values) go on stdin.
ssh_argv quotes the whole argv for the node's shell.
"""

from __future__ import annotations

import functools
import os
import shlex
import subprocess
from collections.abc import Sequence

from dtrain import contract

# launch/node/host/: one function per file, main.sh last (it calls the step).
HOST_FILES = ("phase.sh", "probe.sh", "login.sh", "image.sh", "start.sh", "up.sh", "remove.sh", "doctor.sh", "holds.sh",
              "booted.sh", "prepare.sh", "supervise.sh", "main.sh")


@functools.cache
def host_library() -> str:
    """launch/node/host/'s functions (every file but main.sh), then the perl program they run as
    text: $docker_api_pl, launch/node/docker-api.pl (image.sh inspect_image, holds.sh engine)."""
    return "\n".join([*(contract.node_script(f"host/{f}") for f in HOST_FILES if f != "main.sh"),
                      "# shellcheck disable=SC2016,SC1003 # a perl program's text, quoted",
                      f"docker_api_pl={shlex.quote(contract.node_script('docker-api.pl'))}"])


@functools.cache
def host_program() -> str:
    return host_library() + "\n" + contract.node_script("host/main.sh")


def host_argv(step: str, *args: str) -> list[str]:
    """argv for a node's shell: run STEP (up, pull, probe, remove, doctor, prepare, supervise, booted, ...) of launch/node/host/."""
    return ["bash", "-c", host_program(), "dtrain-node",
            contract.LABEL_JOB, contract.LABEL_MIN_DRIVER, contract.LABEL_OPENMPI_MAJOR, contract.SUPERVISOR_EVENT,
            step, *args]


def program_argv(script: str, args: Sequence[str]) -> list[str]:
    """argv for a node's shell or inside a container: launch/node/<script> with args."""
    return ["bash", "-c", contract.node_script(script), f"dtrain-{script.removesuffix('.sh')}", *args]


def container_argv(script: str, args: Sequence[str]) -> list[str]:
    """argv inside a container (after `docker exec NAME`): launch/node/<script> with args."""
    return program_argv(script, args)


def node_flags(gpus: int = 0, efa: Sequence[str] = (), memlock: str = "") -> list[str]:
    """docker run's flags that depend on a node, as host/start.sh's node_flags (their one
    definition) makes them from a probe's values: a GPU count, EFA device paths, dockerd's
    memlock limit in bytes ("" or "unlimited": unlimited). Runs bash here: for a program that
    starts a job's container on this machine as a node would (benches, tests)."""
    env = {**os.environ, "gpus": str(gpus), "efa": " ".join(efa), "memlock": memlock}
    text = contract.node_script("host/start.sh") + '\nnode_flags\nprintf "%s\\0" "${flags[@]}"\n'
    out = subprocess.run(["bash", "-c", text, "dtrain-node-flags"], env=env, capture_output=True, text=True,
                         check=True, timeout=30).stdout
    return out.split("\0")[:-1]
