#!/usr/bin/env python3
"""SageMaker's `train` (bring-your-own container): `docker run IMAGE train` on every instance.

The entrypoint installs the job key from the `dtrain` channel and starts sshd on 2022, then
runs this program, which reads SageMaker's contract under /opt/ml:
  input/config/resourceconfig.json   hosts, current_host, network_interface_name
  input/config/hyperparameters.json  dtrain_command (JSON list), dtrain_launcher, dtrain_per_node
                                     ("1": every host runs it; "0", the default: the first host
                                     across all over ssh), dtrain_slots, dtrain_workdir (a channel;
                                     default `code`), dtrain_pythonpath (a channel whose directory
                                     goes first on PYTHONPATH: --dependencies)
  input/data/<channel>/              channels (File mode); `dtrain` holds the job's ssh key
and runs the job with the project's own command builders (the launcher modules of dtrain.launch.jobs.launchers):
  mpirun   (Horovod images): the first host (sorted hosts[0]) waits for every host's sshd,
           runs mpirun across all; then tells the others the exit code, and they exit with it.
  torchrun (pytorch-ddp): every host runs torchrun, node rank = its place in sorted hosts.
SM_* variables the SageMaker training toolkit would set are set where absent. On error the
reason goes to /opt/ml/output/failure (SageMaker's FailureReason) and the exit code is non-zero.

Before the command, every host installs the workdir's requirements.txt (pip install --target)
into the state directory /opt/ml/checkpoints/.dtrain/requirements/<hash>/ and puts it on
PYTHONPATH. SageMaker keeps that directory in S3 across runs of the task (CheckpointConfig), so
a second run with the same requirements, Python and machine finds it and runs no pip at all.
For mpirun the first host waits until every other host has installed (its `ready` file).
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# In the image the pure builders live in /opt/dtrain/py (templates/Dockerfile.j2); in a checkout
# that path does not exist and the installed or checked-out dtrain package is used.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "py"))

from dtrain import contract  # noqa: E402
from dtrain.launch.jobs import container  # noqa: E402
from dtrain.launch.jobs import launchers  # noqa: E402

ML = Path("/opt/ml")
KEY_CHANNEL = "dtrain"  # the job's ssh key; never a hyperparameter (they show in the console)
SSH_PORT = contract.SSH_PORT
# mpirun's ssh to the other hosts: retried while their sshd starts; this program's own, fewer
MPI_SSH = container.ssh_options(attempts=10)
SSH = container.ssh_argv(attempts=5)
DONE_DIR = Path("/run/dtrain-sagemaker")  # where the first host leaves mpirun's exit code
READY = "ready"  # DONE_DIR/ready on every host: `ok` once its requirements are installed, else the error
REQUIREMENTS = "requirements.txt"
STATE_CACHE = ".dtrain/requirements"  # under /opt/ml/checkpoints (the task's state directory)
SSHD_WAIT_S = 600.0
FAILURE_MAX = 1000  # SageMaker keeps the first 1024 characters of the failure reason


class ContractError(Exception):
    """A file or hyperparameter of SageMaker's contract is missing or wrong."""


@dataclass(frozen=True)
class Contract:
    hosts: tuple[str, ...]  # sorted: hosts[0] is the first host
    current_host: str
    iface: str
    hyperparameters: dict[str, str]
    channels: dict[str, str]  # name -> directory

    @property
    def rank(self) -> int:
        return self.hosts.index(self.current_host)


@dataclass(frozen=True)
class JobArgs:
    command: tuple[str, ...]
    launcher: str  # a launcher of the registry that runs on SageMaker (launchers.names(sagemaker=True))
    slots: int
    workdir: str | None  # a channel name, or None
    per_node: bool = False  # every host runs the launcher; False: the first across all over ssh
    pythonpath: str | None = None  # a channel name: its directory goes on PYTHONPATH (--dependencies)


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise ContractError(f"{path}: cannot read: {e.strerror or e}") from None
    except ValueError as e:
        raise ContractError(f"{path}: not JSON: {e}") from None
    if not isinstance(data, dict):
        raise ContractError(f"{path}: expected a JSON object")
    return data


def read_contract(ml: Path = ML) -> Contract:
    """The instance's view of the job, from the files SageMaker writes before `train`."""
    rc_path = ml / "input/config/resourceconfig.json"
    rc = _read_json(rc_path)
    hosts, current = rc.get("hosts"), rc.get("current_host")
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) for h in hosts):
        raise ContractError(f"{rc_path}: hosts must be a non-empty list of names")
    if current not in hosts:
        raise ContractError(f"{rc_path}: current_host {current!r} is not in hosts {hosts}")
    hp_path = ml / "input/config/hyperparameters.json"
    hps = _read_json(hp_path) if hp_path.exists() else {}
    data = ml / "input/data"
    channels = {p.name: str(p) for p in sorted(data.iterdir()) if p.is_dir()} if data.is_dir() else {}
    return Contract(tuple(sorted(hosts)), current, str(rc.get("network_interface_name") or "eth0"),
                    {str(k): str(v) for k, v in hps.items()}, channels)


def gpu_count(dev: Path = Path("/dev")) -> int:
    return sum(1 for p in dev.glob("nvidia[0-9]*"))


def job_args(hps: dict[str, str], gpus: int) -> JobArgs:
    """The job from the dtrain_* hyperparameters (values are strings, as SageMaker keeps them)."""
    raw = hps.get("dtrain_command")
    if not raw:
        raise ContractError("hyperparameter dtrain_command is missing (a JSON list: the training command)")
    try:
        command = json.loads(raw)
    except ValueError:
        command = None
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        raise ContractError(f"hyperparameter dtrain_command: expected a non-empty JSON list of strings, got {raw!r}")
    launcher = hps.get("dtrain_launcher", "mpirun")
    if launcher not in launchers.names(sagemaker=True):
        raise ContractError(f"hyperparameter dtrain_launcher: {launcher!r}; "
                            f"use {launchers.choices(launchers.names(sagemaker=True))}")
    per_node = hps.get("dtrain_per_node", "0")
    if per_node not in ("0", "1"):
        raise ContractError(f"hyperparameter dtrain_per_node: {per_node!r}; expected 0 or 1")
    slots_raw = hps.get("dtrain_slots") or str(max(gpus, 1))
    if not slots_raw.isdigit() or int(slots_raw) < 1:
        raise ContractError(f"hyperparameter dtrain_slots: {slots_raw!r} is not a positive integer")
    return JobArgs(tuple(command), launcher, int(slots_raw), hps.get("dtrain_workdir", "code") or None,
                   per_node=per_node == "1", pythonpath=hps.get("dtrain_pythonpath") or None)


def job_pythonpath(c: Contract, job: JobArgs, site: Path | None) -> list[str]:
    """What goes first on PYTHONPATH, in order: the dependencies' channel (each dependency is a
    directory in it, so `import NAME` works), then the requirements installed for the job."""
    paths = []
    if job.pythonpath is not None:
        if job.pythonpath not in c.channels:
            raise ContractError(f"hyperparameter dtrain_pythonpath: no channel {job.pythonpath!r} "
                                f"(channels: {', '.join(c.channels) or 'none'})")
        paths.append(c.channels[job.pythonpath])
    if site is not None:
        paths.append(str(site))
    return paths


def _env_name(channel: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in channel).upper()


def sm_env(c: Contract, gpus: int, ml: Path = ML) -> dict[str, str]:
    """What the SageMaker training toolkit gives a script (SM_*), for scripts written for it."""
    user = {k: v for k, v in c.hyperparameters.items() if not k.startswith("dtrain_")}
    channels = {k: v for k, v in c.channels.items() if k != KEY_CHANNEL}
    env = {
        "SM_HOSTS": json.dumps(list(c.hosts)), "SM_CURRENT_HOST": c.current_host,
        "SM_NETWORK_INTERFACE_NAME": c.iface, "SM_NUM_GPUS": str(gpus),
        "SM_MODEL_DIR": str(ml / "model"), "SM_OUTPUT_DIR": str(ml / "output"),
        "SM_OUTPUT_DATA_DIR": str(ml / "output/data"), "SM_INPUT_DIR": str(ml / "input"),
        "SM_INPUT_CONFIG_DIR": str(ml / "input/config"), "SM_CHECKPOINT_DIR": str(ml / "checkpoints"),
        "SM_CHANNELS": json.dumps(sorted(channels)), "SM_HPS": json.dumps(user),
    }
    env |= {f"SM_CHANNEL_{_env_name(k)}": v for k, v in channels.items()}
    env |= {f"SM_HP_{_env_name(k)}": v for k, v in user.items()}
    return env


def launch_argv(c: Contract, job: JobArgs, forward: list[str]) -> list[str] | None:
    """This host's launch command, from the launcher's module (the registry's
    sagemaker_argv); None: a host that runs nothing itself (mpirun's non-first hosts only
    serve ssh)."""
    return launchers.get(job.launcher).sagemaker_argv(c.hosts, c.rank, c.iface, job.slots, job.command, forward,
                                                      MPI_SSH)


def requirements_key(text: str, python: str, machine: str) -> str:
    """The cache directory's name: the requirements, the Python version and the machine."""
    return hashlib.sha256("\0".join((text, python, machine)).encode()).hexdigest()[:24]


def pip_argv(python: str, requirements: Path, target: Path) -> list[str]:
    return [python, "-m", "pip", "install", "--no-input", "--disable-pip-version-check", "--no-warn-script-location",
            "--target", str(target), "-r", str(requirements)]


def with_pythonpath(env: dict[str, str], path: str) -> dict[str, str]:
    old = env.get("PYTHONPATH")
    return {**env, "PYTHONPATH": f"{path}:{old}" if old else path}


# ---------------------------------------------------------------- side effects


def install_requirements(workdir: Path | None, state: Path, env: dict[str, str],
                         python: str = sys.executable) -> Path | None:
    """Install workdir/requirements.txt into the state directory's cache (once per content);
    returns the directory to put on PYTHONPATH, or None when there is no requirements.txt."""
    req = workdir.absolute() / REQUIREMENTS if workdir else None
    if req is None or not req.is_file():
        return None
    key = requirements_key(req.read_text(errors="replace"), platform.python_version(), platform.machine())
    target = state.absolute() / STATE_CACHE / key
    if (target / ".complete").is_file():
        print(f"dtrain sagemaker: {REQUIREMENTS}: installed already ({target}); not reinstalling", flush=True)
        return target
    partial = target.with_name(f"{key}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    print(f"dtrain sagemaker: {REQUIREMENTS}: installing into {target}", flush=True)
    try:
        # In the workdir: a relative path in requirements.txt (./wheels/x.whl) is the workdir's.
        r = subprocess.run(pip_argv(python, req, partial), env=env, cwd=workdir, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, errors="replace")
    except OSError as e:
        raise ContractError(f"{req}: cannot run pip ({e})") from None
    sys.stdout.write(r.stdout)
    sys.stdout.flush()
    if r.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        lines = [ln.strip() for ln in r.stdout.splitlines() if ln.strip()]
        why = next((ln for ln in reversed(lines) if ln.startswith("ERROR:")), lines[-1] if lines else "no output")
        raise ContractError(f"{req}: pip install failed (exit code {r.returncode}): {why}; "
                            f"fix {REQUIREMENTS} or the index pip uses")
    (partial / ".complete").write_text(req.read_text(errors="replace"))
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


def mark_ready(problem: str | None, done: Path = DONE_DIR) -> None:
    """This host's install result, for the first host of an mpirun job (read over ssh)."""
    done.mkdir(parents=True, exist_ok=True)
    (done / f"{READY}.tmp").write_text(f"{problem}\n" if problem else "ok\n")
    (done / f"{READY}.tmp").rename(done / READY)


def wait_for_ready(hosts: tuple[str, ...], timeout: float = SSHD_WAIT_S) -> None:
    """Every other host has installed its requirements (or the reason it could not)."""
    deadline = time.monotonic() + timeout
    for host in hosts:
        while True:
            try:
                r = subprocess.run([*SSH, host,
                                    f"cat {DONE_DIR}/{READY}"], capture_output=True, text=True, timeout=120)
                state = r.stdout.strip() if r.returncode == 0 else None
            except (OSError, subprocess.TimeoutExpired):
                state = None
            if state == "ok":
                break
            if state:
                raise ContractError(f"{host}: {state}")
            if time.monotonic() > deadline:
                raise ContractError(f"{host}: its {REQUIREMENTS} was not installed after {timeout:.0f} s")
            time.sleep(1)


def write_failure(reason: str, ml: Path = ML) -> None:
    print(f"dtrain sagemaker: {reason}", file=sys.stderr, flush=True)
    try:
        (ml / "output").mkdir(parents=True, exist_ok=True)
        (ml / "output/failure").write_text(reason[-FAILURE_MAX:])
    except OSError as e:
        print(f"dtrain sagemaker: cannot write {ml}/output/failure: {e}", file=sys.stderr)


def wait_for_sshd(hosts: tuple[str, ...], timeout: float = SSHD_WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    for host in hosts:
        while True:
            try:
                socket.create_connection((host, SSH_PORT), timeout=2).close()
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise ContractError(f"{host}:{SSH_PORT}: sshd not reachable after {timeout:.0f} s ({e}); "
                                        "is the host resolvable and its container up?") from None
                time.sleep(0.5)


def run_tee(argv: list[str], cwd: str | None, env: dict[str, str]) -> tuple[int, list[str]]:
    """Run argv, copying its output to ours (CloudWatch), and keep the last lines for the failure."""
    tail: collections.deque[str] = collections.deque(maxlen=15)
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    # SageMaker stops a job with SIGTERM: pass it on to the whole launch (mpirun, torchrun).
    def stop(*_: object) -> None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, stop)
    assert proc.stdout is not None
    for raw in proc.stdout:
        sys.stdout.buffer.write(raw)
        sys.stdout.flush()
        tail.append(raw.decode(errors="replace").rstrip())
    return proc.wait(), list(tail)


def notify_hosts(hosts: tuple[str, ...], code: int) -> None:
    """Leave the job's exit code on every other host; their `train` waits for it."""
    script = f"mkdir -p {DONE_DIR} && cat > {DONE_DIR}/exit.tmp && mv {DONE_DIR}/exit.tmp {DONE_DIR}/exit"
    for host in hosts:
        try:
            r = subprocess.run([*SSH, host, script],
                               input=f"{code}\n", text=True, capture_output=True, timeout=120)
            problem = r.stderr.strip() if r.returncode != 0 else ""
        except (OSError, subprocess.TimeoutExpired) as e:
            problem = str(e)
        if problem:  # SageMaker ends that host's container when this one exits anyway
            print(f"dtrain sagemaker: {host}: cannot report the exit code: {problem}", file=sys.stderr)


def wait_for_first_host(first: str) -> int:
    path = DONE_DIR / "exit"
    print(f"dtrain sagemaker: serving ssh for mpirun on {first}; waiting for the job to end", flush=True)
    while not path.exists():
        time.sleep(1)
    return int(path.read_text().strip() or 1)


def main(ml: Path = ML) -> int:
    try:
        c = read_contract(ml)
        gpus = gpu_count()
        job = job_args(c.hyperparameters, gpus)
        if job.workdir and job.workdir not in c.channels and job.workdir != "code":
            raise ContractError(f"hyperparameter dtrain_workdir: no channel {job.workdir!r} "
                                f"(channels: {', '.join(c.channels) or 'none'})")
        job_pythonpath(c, job, None)  # its channel is there
    except ContractError as e:
        write_failure(str(e), ml)
        return 2
    for d in ("model", "output/data", "checkpoints"):
        (ml / d).mkdir(parents=True, exist_ok=True)
    extra = {k: v for k, v in sm_env(c, gpus, ml).items() if k not in os.environ}
    if job.per_node:  # the launcher's own variables (torchrun: NCCL and Gloo on this host's NIC)
        extra |= launchers.get(job.launcher).exec_env(c.iface)
    env = {**os.environ, **extra}
    cwd = c.channels.get(job.workdir) if job.workdir else None
    try:
        site = install_requirements(Path(cwd) if cwd else None, ml / "checkpoints", env)
    except ContractError as e:
        if not job.per_node and c.rank != 0:
            mark_ready(str(e))
        write_failure(str(e), ml)
        return 2
    paths = job_pythonpath(c, job, site)
    if paths:
        env = with_pythonpath(env, ":".join(paths))
    # Every rank gets the SM_* variables (and PYTHONPATH), whether SageMaker or this program set them.
    forward = sorted(k for k in env if k.startswith("SM_")) + (["PYTHONPATH"] if paths else [])
    argv = launch_argv(c, job, forward=forward)
    if argv is None:
        mark_ready(None)
        code = wait_for_first_host(c.hosts[0])
        if code != 0:
            write_failure(f"the job failed on {c.hosts[0]} (mpirun exit code {code}); see its log", ml)
        return 0 if code == 0 else 1
    try:
        if not job.per_node:
            wait_for_sshd(c.hosts)
            wait_for_ready(c.hosts[1:])
        print(f"dtrain sagemaker: {c.current_host} ({c.rank + 1}/{len(c.hosts)}) runs: {' '.join(argv)}", flush=True)
        code, tail = run_tee(argv, cwd, env)
    except (ContractError, OSError) as e:
        code, tail = 127, [str(e)]
    if not job.per_node and len(c.hosts) > 1:
        notify_hosts(c.hosts[1:], code)
    if code != 0:
        write_failure(f"{argv[0]} exited with code {code} on {c.current_host}; last output:\n" + "\n".join(tail), ml)
    return 0 if code == 0 else 1


if __name__ == "__main__":
    # PID 1 in the container ignores SIGTERM without a handler: end promptly when SageMaker stops us.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
