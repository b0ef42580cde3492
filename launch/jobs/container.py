"""How dtrain reaches a job's containers: the ssh options to their sshd (contract.SSH_PORT).

One builder for every ssh that goes from one container to another's sshd: the supervisor's
(RunPlan.ssh), mpirun's daemon launch (plm_rsh_args), run.sh's ready check, the doctor's peer
check and SageMaker's `train`. Pure: values in, argv words out. The image's ssh_config
(templates/partials/ssh.j2) already sets the port, host keys unchecked and the identity files;
the options here say it again where a caller may run with another config.
"""

from __future__ import annotations

from dtrain import contract

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
