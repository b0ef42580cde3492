"""A job's containers: what they are given (docker run's argv, mounts, env files and names) and
how dtrain reaches them (the ssh options to their sshd, contract.SSH_PORT). Pure but
parse_env_file (reads the file); bad user input raises LaunchError.

One builder for every ssh that goes from one container to another's sshd: the supervisor's
(RunPlan.ssh), mpirun's daemon launch (plm_rsh_args), run.sh's ready check, the doctor's peer
check and SageMaker's `train`. Pure: values in, argv words out. The image's ssh_config
(templates/partials/ssh.j2) already sets the port, host keys unchecked and the identity files;
the options here say it again where a caller may run with another config.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dtrain import contract, values
from dtrain.launch.errors import LaunchError

# The master connection per peer: the ready check (launch/node/run.sh) opens one per node, and
# mpirun's daemon launch and the supervisor's sessions (all from the first container) reuse it.
MUX = ("-o", "ControlMaster=auto", "-o", "ControlPath=/tmp/dtrain-mux-%C", "-o", "ControlPersist=600")


def ssh_options(*, port: int | None = contract.SSH_PORT, user: str | None = None, batch: bool = False,
                connect_timeout: int | None = None, unchecked: bool = False, attempts: int | None = None,
                mux: bool = False, keepalive: bool = False) -> list[str]:
    """ssh's options, in this order: `-p PORT` (None: ssh's default), `-l USER`, BatchMode,
    ConnectTimeout, host keys unchecked and ssh's chatter off (unchecked), ConnectionAttempts,
    the master connection (MUX), keepalives (a lost link ends the session:
    contract.ssh_keepalive_opts)."""
    opts = ["-p", str(port)] if port is not None else []
    if user is not None:
        opts += ["-l", user]
    if batch:
        opts += ["-o", "BatchMode=yes"]
    if connect_timeout is not None:
        opts += ["-o", f"ConnectTimeout={connect_timeout}"]
    if unchecked:
        opts += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"]
    if attempts is not None:
        opts += ["-o", f"ConnectionAttempts={attempts}"]
    if mux:
        opts += MUX
    if keepalive:
        opts += contract.ssh_keepalive_opts()
    return opts


def ssh_argv(**options) -> list[str]:
    """`ssh OPTIONS` (ssh_options), without the host and command."""
    return ["ssh", *ssh_options(**options)]


def supervisor_ssh() -> list[str]:
    """The supervisor's ssh to another container (RunPlan.ssh): as root, never prompting, over
    the master connection the ready check left, keepalives on."""
    return ssh_argv(user="root", batch=True, connect_timeout=3, unchecked=True, mux=True, keepalive=True)


def ready_ssh() -> list[str]:
    """run.sh's ready check to each node (its --ssh words): the master connection it leaves is
    the one mpirun's (mpirun_ssh) and the supervisor's sessions ride."""
    return ssh_argv(batch=True, connect_timeout=3, mux=True, keepalive=True)


def mpirun_ssh() -> list[str]:
    """mpirun's ssh options (its plm_rsh_args) inside a job's first container: the masters the
    ready check left."""
    return ssh_options(mux=True, keepalive=True)


def doctor_ssh() -> list[str]:
    """The doctor's peer check from a container (launch/node/doctor-container.sh's ssh)."""
    return ssh_argv(batch=True, connect_timeout=5)


# --- env names and env files ---------------------------------------------------------------

_ENV_NAME_RE = re.compile(rf"^{values.ENV_NAME.pattern}$", re.ASCII)  # the one rule: dtrain/values.py


def check_env_names(names: Sequence[str] | Mapping[str, str], what: str) -> None:
    """LaunchError naming `what` for a name that is no environment variable's (dtrain/values.py)."""
    for name in names:
        if not _ENV_NAME_RE.match(name):
            raise LaunchError(f"{what}: bad environment variable name {name!r}")


def parse_env_file(path: str | Path) -> dict[str, str]:
    """`KEY=VALUE` lines; `#` comment lines, blank lines and a leading `export ` allowed.

    One pair of matching surrounding quotes is stripped (no escapes, no interpolation); an
    unquoted value is kept verbatim, `#` included. A key given twice is an error.
    """
    path = Path(path)
    try:
        text = values.small_text_file(path, "env file", "KEY=VALUE lines")
    except values.BadValue as e:
        raise LaunchError(str(e)) from None
    result: dict[str, str] = {}
    first_line: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        where = f"{path}:{lineno}"
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export ") or line.startswith("export\t"):
            line = line[len("export") :].lstrip()
        key, eq, value = line.partition("=")
        key = key.rstrip()
        if not eq:
            raise LaunchError(f"{where}: expected KEY=VALUE, got {raw.strip()!r}")
        if not _ENV_NAME_RE.match(key):
            raise LaunchError(f"{where}: bad variable name {key!r}")
        value = value.strip()
        if value[:1] in ("'", '"'):
            if len(value) < 2 or value[-1] != value[0]:
                raise LaunchError(f"{where}: unterminated quote in value of {key}")
            value = value[1:-1]
        if key in first_line:
            raise LaunchError(f"{where}: {key} set twice, first on line {first_line[key]}")
        first_line[key] = lineno
        result[key] = value
    return result


# --- docker run ---------------------------------------------------------------------------

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_SHM_RE = re.compile(r"^[0-9]+[bkmgBKMG]?$")


@dataclass(frozen=True)
class Mount:
    src: str  # host path
    dst: str  # container path
    readonly: bool = False


def parse_mount(spec: str) -> Mount:
    """`/data`, `/data:ro`, `/src:/dst`, `/src:/dst:ro|rw`; both paths absolute."""
    parts = spec.split(":")
    mode = None
    if len(parts) >= 2 and parts[-1] in ("ro", "rw"):
        mode = parts.pop()
    if len(parts) not in (1, 2) or not all(parts):
        raise LaunchError(f"--mount {spec!r}: expected SRC[:DST][:ro|rw]")
    src, dst = parts[0], parts[-1]
    for p in (src, dst):
        if not p.startswith("/"):
            raise LaunchError(f"--mount {spec!r}: {p!r} is not an absolute path")
        if "," in p:
            raise LaunchError(f"--mount {spec!r}: commas in paths are not supported")
    return Mount(posixpath.normpath(src), posixpath.normpath(dst), readonly=mode == "ro")


@dataclass(frozen=True)
class ContainerSpec:
    """The whole container contract of a training node (the image runs sshd on 2022)."""

    job: str
    image: str
    mounts: tuple[Mount, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    shm_size: str | None = None  # None: --ipc host (host /dev/shm, what NCCL wants); else --shm-size
    key_dir: str | None = None  # node directory with the job's key pair, mounted at contract.JOB_KEY_MOUNT
    command: tuple[str, ...] = ()  # empty: the image's CMD
    name: str | None = None  # default dtrain-JOB
    # SYS_PTRACE: py-spy reads a rank's Python stack (a hang's dump: launch/node/stacks.sh)
    cap_add: tuple[str, ...] = ("SYS_PTRACE",)

    @property
    def container_name(self) -> str:
        return self.name or contract.container_name(self.job)


def docker_run_parts(spec: ContainerSpec) -> tuple[list[str], list[str]]:
    """docker run's argv around the flags that depend on the node: (head, rest). A launch sends
    both to the node, which puts its own flags between them (launch/node/host/start.sh node_flags:
    memlock, GPUs, EFA devices, from the node's probe)."""
    for what, value in (("job", spec.job), ("container name", spec.container_name)):
        if not _NAME_RE.match(value):
            raise LaunchError(f"bad {what} {value!r} (letters, digits, _ . -; starting alphanumeric)")
    if not spec.image or spec.image.startswith("-"):
        raise LaunchError(f"bad image {spec.image!r}")
    check_env_names(spec.env, "container env")
    head = ["docker", "run", "-d", "--name", spec.container_name, "--network", "host"]
    if spec.shm_size is None:
        head += ["--ipc", "host"]
    elif _SHM_RE.match(spec.shm_size):
        head += ["--shm-size", spec.shm_size]
    else:
        raise LaunchError(f"bad shm size {spec.shm_size!r} (e.g. 16g)")
    head += ["--tmpfs", contract.MPI_TMPDIR]
    for cap in spec.cap_add:
        if not re.fullmatch(r"[A-Z_]+", cap):
            raise LaunchError(f"bad capability {cap!r} (e.g. SYS_PTRACE)")
        head += ["--cap-add", cap]
    rest: list[str] = []
    for m in spec.mounts:
        rest += ["--mount", f"type=bind,src={m.src},dst={m.dst}" + (",readonly" if m.readonly else "")]
    if spec.key_dir:  # the entrypoint installs the pair as root's before starting sshd
        if not spec.key_dir.startswith("/") or "," in spec.key_dir:
            raise LaunchError(f"bad key directory {spec.key_dir!r}")
        rest += ["--mount", f"type=bind,src={spec.key_dir},dst={contract.JOB_KEY_MOUNT},readonly"]
    rest += ["--label", f"{contract.LABEL_JOB}={spec.job}"]
    for k, v in spec.env.items():
        rest += ["-e", f"{k}={v}"]
    return head, rest + [spec.image, *spec.command]

