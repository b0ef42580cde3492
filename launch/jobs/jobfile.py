"""A job file: the flags of `dtrain launch` as YAML, checked in beside the code.

    dtrain launch -f job.yaml                  the job the file describes
    dtrain launch -f job.yaml --nodes ...      flags given on the command line override the file
    dtrain launch --image ... -- cmd --dump    print the file a set of flags means

Every key is a `dtrain launch` flag, with `_` for `-` (`max_restarts:` is `--max-restarts`), and
`command:` is what follows `--`. The file is validated by one model (JobFile): an unknown key or
a bad value is one line naming the file, its line and the key.

A job file is data, not authority (docs/launch.md, "What a job file may do"): it is committed
with the code and run by others, so what it says may not reach past the project it came with.
- Its paths (PATH_KEYS, a hostfile's identity=) are relative to its directory and stay inside
  it: no `~`, no absolute path, no `..` or symlink out (`inside`). A flag's path keeps its meaning.
- `env: {NAME: }` (no value: the launcher's own $NAME) only for a name the user allowed:
  `--env NAME` on the command line or a line of the allow-list file outside any project
  (trust.env_allow_file); literal values (`EPOCHS: 10`) are the file's own.
- `ssh_opt` takes only the options in FILE_SSH_OPTIONS (none of them runs a local command, loads
  code, forwards the agent, ports or the environment, reads another config or loosens host key
  checking), each value checked, numbers bounded (FILE_SSH_BOUNDS); `ssh_config` is refused (an
  ssh config file can hold ProxyCommand, LocalCommand, `Match exec`). Both are for the command
  line (--ssh-opt, --ssh-config).
- Hosts it names that the user has never connected to are confirmed or refused before the first
  ssh (launch/jobs/trust.py `check_hosts`).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from dtrain import values
from dtrain.contract import MASTER_PORT
from dtrain.yamlfile import TooDeep, compose_load, duplicate_key, line_of, plain_text
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import launchers
from dtrain.launch.jobs.nccl_net import MODES
from dtrain.launch.remote.hosts import MAX_SLOTS

# Where a launch runs: its nodes (the default), a SageMaker training job, or the description of one
# for another tool (launch/other_tools/manifests.py), written for the user to submit.
TARGETS = ("nodes", "sagemaker", "mpijob", "pytorchjob", "ecs", "trainjob", "jobset")

PATH_KEYS = ("hostfile", "env_file", "workdir", "ssh_key", "ssh_config")

# The choices of a launch, declared once (tests/test_launch_model.py fails on a second copy in
# the package): the fields' Literal types, JobSpec's and the checks read these.
PULL = ("always", "missing", "never")  # as docker's --pull
RDZV = ("static", "c10d")  # torchrun's rendezvous
NCCL_CHECK = MODES  # nccl_net.MODES: the supervisor on a node reads it (standard library only)

# ssh options a job file may give (ssh -o KEY=VALUE), each with the values it may have. None of
# them runs a command here (ProxyCommand, LocalCommand, KnownHostsCommand, Match exec), loads code
# (PKCS11Provider, SecurityKeyProvider), sends the agent, ports or variables to a node (ForwardAgent,
# *Forward, SendEnv, SetEnv), reads another config (Include), or takes ssh's multiplexing
# (ControlPath), names a file here (IdentityFile: `ssh_key:` is the file's key, inside its
# directory) or loosens host key checking (StrictHostKeyChecking only yes or accept-new; no
# HostKeyAlias, which would check a new host against a known one's key: trust.check_hosts). Values
# are checked too: ssh splices ProxyJump's user and host, and User, into a command line of its
# own; UserKnownHostsFile is written to, so only /dev/null; numbers are bounded (FILE_SSH_BOUNDS).
_WORD = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}"
_HOST = r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\])"
_JUMP = rf"(?:ssh://)?(?:{_WORD}@)?{_HOST}(?::[0-9]{{1,5}})?"
_YES_NO = r"(?i:yes|no)"
_NUMBER = r"[0-9]{1,6}"
FILE_SSH_OPTIONS = {
    "AddressFamily": r"(?i:any|inet|inet6)",
    "BatchMode": _YES_NO,
    "CheckHostIP": _YES_NO,
    "Compression": _YES_NO,
    "ConnectionAttempts": _NUMBER,
    "ConnectTimeout": _NUMBER,
    "IdentitiesOnly": _YES_NO,
    "LogLevel": r"(?i:quiet|fatal|error|info|verbose|debug[123]?)",
    "Port": _NUMBER,
    "ProxyJump": rf"(?i:none)|{_JUMP}(?:,{_JUMP})*",
    "ServerAliveCountMax": _NUMBER,
    "ServerAliveInterval": _NUMBER,
    "StrictHostKeyChecking": r"(?i:yes|accept-new)",
    "TCPKeepAlive": _YES_NO,
    "User": _WORD,
    "UserKnownHostsFile": r"/dev/null",
}
# The numbers a job file may give them: (least, most). A failed launch ends within minutes, not
# days (ConnectionAttempts=999999 held one for 181 s measured), and a lost node is noticed.
FILE_SSH_BOUNDS = {"ConnectionAttempts": (1, 10), "ConnectTimeout": (1, 120), "ServerAliveCountMax": (1, 10),
                   "ServerAliveInterval": (1, 300), "Port": (1, 65535)}
_BY_LOWER = {k.lower(): k for k in FILE_SSH_OPTIONS}
_LOCAL_COMMAND = {"proxycommand", "localcommand", "permitlocalcommand", "knownhostscommand", "include", "match",
                  "pkcs11provider", "securitykeyprovider", "xauthlocation"}
_SSH_OPTION = re.compile(r"\s*([A-Za-z][A-Za-z0-9]*)\s*(?:=|\s)\s*(.*?)\s*", re.S)


def file_ssh_option(value: str) -> str | None:
    """Why a job file may not give this `ssh -o` value (None: it may). Pure."""
    m = _SSH_OPTION.fullmatch(value)
    if not m:
        return f"{value!r} is not an ssh option (KEY=VALUE, e.g. ProxyJump=user@bastion)"
    key, arg = m.group(1), m.group(2)
    if key.lower() in _LOCAL_COMMAND:
        return (f"{key} can run a command on the launching machine, and a job file is run by others: "
                f"take it out of the file and pass it with --ssh-opt on the command line")
    name = _BY_LOWER.get(key.lower())
    if key.lower() == "identityfile":
        return ("IdentityFile names a file outside the job file's directory to ssh (~ and %d expanded): give "
                "the key as ssh_key: (a path inside it), or pass --ssh-key/--ssh-opt on the command line")
    if name is None:
        return (f"{key} is not an ssh option a job file may give ({', '.join(FILE_SSH_OPTIONS)}): "
                f"take it out of the file and pass it with --ssh-opt on the command line")
    if not re.fullmatch(FILE_SSH_OPTIONS[name], arg):
        return (f"{name} {arg!r}: not a value a job file may give it: take it out of the file and pass it "
                f"with --ssh-opt on the command line")
    lo, hi = FILE_SSH_BOUNDS.get(name, (None, None))
    if lo is not None and not lo <= int(arg) <= hi:
        return (f"{name} {arg}: a job file may give it from {lo} to {hi}: take it out of the file or pass it "
                f"with --ssh-opt on the command line")
    return None


def check_file_ssh(job: "JobFile", doc: yaml.Node | None, where: str) -> None:
    """LaunchError `FILE:LINE: ssh_opt.I: ...` for an ssh option a job file may not give, or
    `FILE:LINE: ssh_config: ...` for an ssh config file (it can hold ProxyCommand)."""
    if job.ssh_config is not None:
        raise LaunchError(f"{where}:{line_of(doc, ('ssh_config',)) or 1}: ssh_config: an ssh config file can run "
                          f"commands on the launching machine (ProxyCommand, LocalCommand, Match exec), and a job "
                          f"file is run by others: take it out of the file and pass --ssh-config on the command line")
    for i, opt in enumerate(job.ssh_opt or []):
        why = file_ssh_option(opt)
        if why:
            raise LaunchError(f"{where}:{line_of(doc, ('ssh_opt', i)) or 1}: ssh_opt.{i}: {why}")


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


# The numbers of a launch: (whole?, lo, hi). values.count (whole) or values.number (> lo) checks
# them, from a flag (tasks.launch_spec) and from a job file (JobFile) alike.
NUMBERS = {"slots": (True, 1, MAX_SLOTS), "master_port": (True, 1, 65535), "max_restarts": (True, 0, 1000),
           "min_nodes": (True, 0, None), "spares": (True, 0, 1000), "timeout": (False, 0, None),
           "hang_timeout": (False, 0, 86400), "straggler_check": (False, 0, 3600), "count": (True, 1, 10000),
           "max_wait": (False, 0, None), "volume_size": (True, 1, 16384), "root_size": (True, 8, 16384),
           "idle_down": (True, 1, 7 * 24 * 60), "up_timeout": (False, 0, 86400)}  # idle_down: ec2.IDLE_DOWN_MAX_MINUTES (tests/test_launch_up.py)

# The fields of a launch that brings its own nodes (launch/up.py): `up` names them, the rest need it.
UP_KEYS = ("up", "spot", "subnet", "ami", "key_name", "root_size", "up_timeout", "keep", "idle_down", "yes",
           "confirm_above")
# The price's confirmation is the user's, never a shared file's (a job file run by others).
COMMAND_LINE_ONLY = ("yes", "confirm_above")


_TYPE_COUNT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9.-]*)\s*:\s*([0-9]+)\s*")
_COUNT_X_TYPE = re.compile(r"\s*([0-9]+)\s*[xX*]\s*([A-Za-z0-9][A-Za-z0-9.-]*)\s*")


def up_shape(text: str) -> tuple[str, int]:
    """(instance type, count) of --up: TYPE:COUNT or COUNT x TYPE (pure); BadValue naming --up."""
    m = _TYPE_COUNT.fullmatch(text)
    if m:
        itype, count = m.group(1), m.group(2)
    else:
        m = _COUNT_X_TYPE.fullmatch(text)
        if not m:
            raise values.BadValue(f"--up {values.shown(text)}: expected TYPE:COUNT (e.g. p4d.24xlarge:4) or "
                                  "COUNT x TYPE (e.g. 4 x p4d.24xlarge)")
        count, itype = m.group(1), m.group(2)
    values.instance_type("--up", itype)
    return itype, values.count(f"--up {itype}:", count, 1, 10000)


class BadNumber(ValueError):
    """A number of the file refused by its flag's parser: `KEY 'VALUE': expected ...` (parse)."""


def number(key: str, text: Any) -> int | float:
    """The value of the launch's number `key` (NUMBERS), or BadValue naming its flag."""
    whole, lo, hi = NUMBERS[key]
    return values.count(_flag(key), text, lo, hi) if whole else values.number(_flag(key), text, lo, hi=hi)


class JobFile(BaseModel):
    """What `dtrain launch` takes, by flag name: the one schema of a launch. Each field's
    description is the flag's help; json_schema_extra's launch_default is what applies where
    neither a flag nor the file gives it (defaults()). None: not given."""

    model_config = ConfigDict(extra="forbid")

    image: Optional[str] = Field(None, description="image reference every node pulls (ECR: logged in with a token from boto3)")
    command: Optional[list[str]] = Field(None, description="what follows `--`: the job's command")  # a list, or one string split as a shell would (no shell runs it)
    launcher: Optional[Literal[launchers.names()]] = Field(None, description=(  # the registry's (launch/jobs/launchers/)
        "mpirun (default), horovodrun, torchrun, ray (a Ray cluster, then the command as its driver; image: "
        "ray-train), accelerate (Hugging Face accelerate launch on every node) or deepspeed (DeepSpeed's runner "
        "over Open MPI)"),
        json_schema_extra={"launch_default": "mpirun"})
    name: Optional[str] = Field(None, description=(
        "job name (default job-YYYYmmdd-HHMMSS-XXXXXX, unique per launch); a name in use by a running job is "
        "refused, an ended one's is reused"))
    target: Optional[Literal[TARGETS]] = Field(None, description=(
        "where the job runs: nodes (default: the nodes given, in containers), sagemaker (a training job: "
        "--instance-type, --role; as many instances as nodes), mpijob, pytorchjob, ecs, trainjob (Kubeflow "
        "Trainer v2) or jobset (the job description, printed or --output)"), json_schema_extra={"launch_default": "nodes"})
    instance_type: Optional[str] = Field(None, description="--target sagemaker: the instances' type, e.g. ml.g5.12xlarge")
    role: Optional[str] = Field(None, description="--target sagemaker: the SageMaker execution role ARN")
    on_demand: Optional[bool] = Field(None, description=(
        "--target sagemaker: an on-demand training job (default: managed spot, resumed from its checkpoints)"))
    max_wait: Optional[float] = Field(None, description=(
        "--target sagemaker, spot: the most seconds to wait for spot capacity and run, at least --timeout "
        "(default twice the run-time limit)"))
    volume_size: Optional[int] = Field(None, description="--target sagemaker: GB of storage per instance (default 100)",
                                       json_schema_extra={"launch_default": 100})
    input: Optional[list[str]] = Field(None, description=(
        "--target sagemaker: NAME=DIR or NAME=s3://BUCKET/PREFIX, a data channel at /opt/ml/input/data/NAME "
        "(repeatable; a DIR is uploaded)"))
    # where the nodes come from (one of cluster, hostfile, hosts, ec2_tag) and how to reach them
    cluster: Optional[str] = Field(None, description=(
        "a cluster made by `dtrain nodes up --name C`: its hostfile (~/.dtrain/clusters/C/hostfile)"),
        json_schema_extra={"nodes": "ec2", "shown": "--cluster NAME"})
    hostfile: Optional[str] = Field(None, description="lines `HOST slots=N [port=22] [user=U] [identity=KEY]`",
                                    json_schema_extra={"nodes": "ssh", "shown": "--hostfile FILE"})
    hosts: Optional[str] = Field(None, description="h1:4,h2:4", json_schema_extra={"nodes": "ssh", "shown": "--hosts h1:4,h2:4"})
    ec2_tag: Optional[str] = Field(None, description="Key=Value: running instances with this tag (private IPs; slots = GPUs)",
                                   json_schema_extra={"nodes": "ec2", "shown": "--ec2-tag Key=Value"})
    region: Optional[str] = Field(None, description="AWS region for --ec2-tag and --up (and --target sagemaker)",
                                  json_schema_extra={"nodes": "any"})
    slots: Optional[int] = Field(None, description=(
        "processes per node, on every target (default: each host's slots, e.g. --hosts h1:8; for --ec2-tag and "
        "the targets off the nodes the GPUs of the instance type, else 1)"), json_schema_extra={"nodes": "any"})
    count: Optional[int] = Field(None, description=(
        "how many nodes (SageMaker instances, workers, replicas) where the launch names no nodes; with nodes "
        "named, their number must be this"))
    # nodes the launch brings up itself, one CloudFormation stack as `dtrain nodes up` makes, and takes down after
    up: Optional[str] = Field(None, description=(
        "bring the nodes up for this launch and take them down after it: TYPE:COUNT (e.g. p4d.24xlarge:4, or "
        "'4 x p4d.24xlarge'); with --spares K, K more; the price per hour (and for --timeout) is shown first and "
        "asked above --confirm-above; on success, failure or Ctrl-C the stack is deleted unless --keep"))
    spot: Optional[bool] = Field(None, description="with --up: spot instances")
    subnet: Optional[str] = Field(None, description=(
        "with --up: the nodes' subnet (default: the default VPC's, in a zone that offers the type)"))
    ami: Optional[str] = Field(None, description=(
        "with --up: gpu (Deep Learning AMI), cpu, ami-ID or an SSM parameter path (default: gpu on GPU types, "
        "else cpu)"))
    key_name: Optional[str] = Field(None, description="with --up: the EC2 key pair for ssh (its private key: --ssh-key)")
    root_size: Optional[int] = Field(None, description="with --up: root disk GiB (default: the AMI's + room for images)")
    up_timeout: Optional[float] = Field(None, description=(
        "with --up: seconds to wait for capacity, and again for ssh + docker on every node (default 900)"))
    keep: Optional[bool] = Field(None, description=(
        "with --up: keep the nodes after the job (their price per hour and the command that takes them down "
        "are said); `dtrain launch --cluster NAME` runs the next job there"))
    idle_down: Optional[int] = Field(None, description=(
        "with --up: keep the nodes, and they delete their own stack once no dtrain job has run for this many "
        "minutes"))
    yes: Optional[bool] = Field(None, description=(
        "with --up: go on without asking, whatever the price per hour (command line only)"))
    confirm_above: Optional[float] = Field(None, description=(
        "with --up: ask before renting above this many USD per hour (default $DTRAIN_CONFIRM_ABOVE, else 10); "
        "without a terminal, refuse unless --yes (command line only)"))
    ssh_user: Optional[str] = Field(None, description="ssh user on the nodes (default: from the hostfile or ~/.ssh/config)",
                                    json_schema_extra={"nodes": "any"})
    ssh_key: Optional[str] = Field(None, description="ssh identity for the nodes", json_schema_extra={"nodes": "any"})
    ssh_opt: Optional[list[str]] = Field(None, description="extra ssh -o option to reach the nodes (repeatable)",
                                         json_schema_extra={"nodes": "any"})
    ssh_config: Optional[str] = Field(None, description="ssh config file for reaching the nodes (ssh -F), e.g. the local cluster's",
                                      json_schema_extra={"nodes": "any"})
    # the job
    env: Optional[dict[str, Optional[str]]] = Field(None, description=(
        "K=V for every rank (repeatable); K alone takes K's value from your environment (a secret: its value "
        "never in argv)"))  # NAME: value, or NAME: (empty) for the launcher's $NAME
    env_file: Optional[str] = Field(None, description="file of K=V lines; every variable is forwarded to every rank")
    iface: Optional[str] = Field(None, description="network interface for MPI/NCCL/Gloo (default: the NIC of each node's address)")
    mount: Optional[list[str]] = Field(None, description="/host/path[:/container/path][:ro] (repeatable), e.g. /fsx:ro")
    shm_size: Optional[str] = Field(None, description="container /dev/shm size, e.g. 16g (default: --ipc host)")
    master_port: Optional[int] = Field(None, description=f"torchrun master port (default {MASTER_PORT})",
                                       json_schema_extra={"launch_default": MASTER_PORT})
    rdzv: Optional[Literal[RDZV]] = Field(None, description="torchrun rendezvous: static (default) or c10d",
                                                      json_schema_extra={"launch_default": "static"})
    pull: Optional[Literal[PULL]] = Field(None, description=(
        "always (default: unless the node holds the registry's digest, with progress), missing (only where "
        "absent) or never"), json_schema_extra={"launch_default": "always"})
    timeout: Optional[float] = Field(None, description="stop the job after this many seconds")
    workdir: Optional[str] = Field(None, description=(
        "directory sent to every node (rsync, only what changed; .gitignore/.dtrainignore apply), mounted at "
        "/workdir, the job's working directory"))
    workdir_limit: Optional[str] = Field(None, description="refuse a --workdir larger than this (default 1g; data belongs on a --mount)",
                                         json_schema_extra={"launch_default": "1g"})
    detach: Optional[bool] = Field(None, description=(
        "return once the job runs; the nodes supervise it (dtrain logs --follow, status, stop)"))
    max_restarts: Optional[int] = Field(None, description=(
        "restart the job after a failed rank or a lost node, this many times (default 0; with --spares, one per "
        "spare)"))
    min_nodes: Optional[int] = Field(None, description=(
        "with no spare left, restart on the nodes left while at least this many remain (default, and 0: all of them)"))
    spares: Optional[int] = Field(None, description=(
        "keep the last K nodes given ready (image, container, sshd) with no rank; a lost node, or one given a "
        "spot notice, is swapped for one and the job restarts at full size"))
    checkpoint_dir: Optional[str] = Field(None, description=(
        "DTRAIN_CHECKPOINT_DIR for every rank: where it saves and resumes (a path in the containers, e.g. on a "
        "--mount)"))
    no_spot_watch: Optional[bool] = Field(None, description=(
        "with --ec2-tag or --cluster, each node polls EC2's spot interruption notice and leaves the job cleanly "
        "(time to checkpoint); this turns it off"))
    check_network: Optional[bool] = Field(None, description=(
        "before the job, a few seconds of TCP streams between the containers (the network gate); a node whose "
        "link is well below its peers' or its instance type's fails the launch, named (with --spares, a spare "
        "takes its place)"))
    hang_timeout: Optional[float] = Field(None, description=(
        "when no rank has made progress for this many seconds: every rank's Python stack into the log, the "
        "ranks behind named, the attempt ended (a failed attempt: --max-restarts applies); default off"))
    progress_pattern: Optional[str] = Field(None, description=(
        "with --hang-timeout, a rank's output line matching this regex is progress (default: any line of a rank); "
        "at most 512 characters, none that backtracks without bound such as (a+)+; a line's first 2048 "
        "characters are searched"))
    straggler_check: Optional[float] = Field(None, description=(
        "every this many seconds, every rank's Python stack is sampled (py-spy); the rank the others wait for "
        "(rarely inside a collective while they mostly are) is named as a straggler in the log and in dtrain "
        "status; default off"))
    replace_stragglers: Optional[bool] = Field(None, description=(
        "with --straggler-check and --spares: a straggler (not the first node) is swapped for a spare at a "
        "checkpoint (the job is asked to checkpoint now, as for a spot notice), quarantined as a straggler, and "
        "the job restarts at full size"))
    nccl_check: Optional[Literal[NCCL_CHECK]] = Field(None, description=(
        "at the first collective, the network NCCL chose on every node (its INIT/NET lines, written to the job's "
        "directory) against the node's (EFA on an EFA instance type, as many NICs as the type has): fail ends the "
        "job naming the node, the cause and the fix; warn says so; off; default fail on GPU nodes that should "
        "use EFA (a job on 2 nodes or more), warn on other GPU nodes, off without GPUs or where --env sets NCCL_DEBUG"))

    @field_validator(*NUMBERS, mode="before")
    @classmethod
    def _number(cls, v: Any, info: ValidationInfo) -> Any:
        """The flag's own parser (dtrain/values.py) and bounds: a value from the file and from the
        flag are refused in the same words."""
        if v is None:
            return v
        if isinstance(v, bool):  # YAML's true/yes/on: not 1
            raise BadNumber(f"{str(v).lower()!r}: expected a number, not a yes/no value")
        try:
            return number(info.field_name, f"{v:g}" if isinstance(v, float) else str(v))
        except values.BadValue as e:
            raise BadNumber(str(e).removeprefix(_flag(info.field_name) + " ")) from None

    @field_validator("command", mode="before")
    @classmethod
    def _split(cls, v: Union[str, list, None]) -> Any:
        return shlex.split(v) if isinstance(v, str) else v

    @field_validator("command")
    @classmethod
    def _nonempty(cls, v: Optional[list[str]]) -> Optional[list[str]]:
        if v is not None and not v:
            raise ValueError("an empty command")
        return v

    @field_validator("progress_pattern")
    @classmethod
    def _regex(cls, v: Optional[str]) -> Optional[str]:
        if v is not None:
            try:
                values.regex("progress_pattern", v)
            except values.BadValue as e:
                raise ValueError(str(e).removeprefix("progress_pattern ")) from None
        return v

    @field_validator("env", mode="before")
    @classmethod
    def _env_numbers(cls, v: Any) -> Any:
        """`EPOCHS: 10` means the text 10 (`true`: true), as in an env file."""
        if not isinstance(v, dict):
            return v
        return {k: (str(x).lower() if isinstance(x, bool) else str(x) if isinstance(x, (int, float)) else x)
                for k, x in v.items()}

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: Optional[dict[str, Optional[str]]]) -> Optional[dict[str, Optional[str]]]:
        for k in v or {}:
            if not values.env_name(k):
                raise ValueError(f"{k!r} is not a variable name (letters, digits, _; not starting with a digit)")
        return v


def defaults() -> dict[str, Any]:
    """{field: value} where neither a flag nor the job file says, in the flags' (string) form;
    None: no value (the field's help says what that means)."""
    out: dict[str, Any] = {k: launch_default(k) for k in JobFile.model_fields}
    return {**{k: str(v) if isinstance(v, int) else v for k, v in out.items()}, "command": []}


def launch_default(key: str) -> Any:
    """The value of field `key` where neither a flag nor the job file gives it (typed; None: none)."""
    return (JobFile.model_fields[key].json_schema_extra or {}).get("launch_default")


def _extra(key: str) -> dict[str, Any]:
    return JobFile.model_fields[key].json_schema_extra or {}  # type: ignore[return-value]


def node_fields() -> tuple[str, ...]:
    """The launch fields that name the nodes of `--target nodes` or reach them (json_schema_extra's
    `nodes`), in the model's order: every task that works on nodes takes them as flags (launch/cli/),
    none listed by hand (tests/test_node_flags.py)."""
    return tuple(k for k in JobFile.model_fields if "nodes" in _extra(k))


def selecting(provider: str) -> tuple[str, ...]:
    """The fields that choose a node provider (launch/targets/): `nodes: PROVIDER` ("any": every
    provider's nodes take it)."""
    return tuple(k for k in node_fields() if _extra(k)["nodes"] == provider)


def choosing() -> tuple[str, ...]:
    """The fields that choose where the nodes come from (a provider's own: not `nodes: any`)."""
    return tuple(k for k in node_fields() if _extra(k)["nodes"] != "any")


def route_keys() -> tuple[str, ...]:
    """The keys of a job file that choose where the job goes: the nodes (choosing()), and the ssh
    options that route to them (a ProxyJump or a Port can put another host behind a name):
    trust.check_hosts asks about the hosts these chose."""
    return (*choosing(), "ssh_opt")


def shown(key: str) -> str:
    """How an error shows a field that chooses nodes: `--hosts h1:4,h2:4`."""
    return _extra(key).get("shown") or "--" + key.replace("_", "-")


def help_texts() -> dict[str, str]:
    """{field: the flag's help}: `dtrain launch --help` (tasks.py) reads them."""
    return {k: f.description or "" for k, f in JobFile.model_fields.items() if k != "command"}


def _env_key_line(doc: yaml.Node | None, err: dict) -> tuple:
    """An error in env's names: the loc of the bad name itself (its own line)."""
    if err["loc"] == ("env",) and "is not a variable name" in err["msg"]:
        bad = err["msg"].split("'")[1]
        return ("env", bad)
    return tuple(err["loc"])


def parse(text: str, where: str) -> JobFile:
    """A job file's text -> JobFile; LaunchError `FILE:LINE: KEY: problem` (one line)."""
    try:
        doc, data = compose_load(text)
    except TooDeep as e:
        raise LaunchError(f"{where}: {e}; expected a mapping of launch flags") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f":{mark.line + 1}" if mark is not None else ""
        why = " ".join(str(getattr(e, "problem", None) or e).split())  # one line: the parser's may hold two
        raise LaunchError(f"{where}{at}: not YAML ({why})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise LaunchError(f"{where}: expected a mapping of launch flags (image:, command:, ...), got {type(data).__name__}")
    twice = duplicate_key(doc)
    if twice:
        key, line, first = twice
        raise LaunchError(f"{where}:{line}: {values.shown(key)}: given twice (first on line {first}); YAML would "
                          "silently keep the last: give it once")
    if isinstance(data.get("env"), dict):  # `A: 0755` is the text 0755 (YAML 1.1 reads 493), `B: yes` is yes
        written = plain_text(doc, "env")
        data["env"] = {k: written.get(k, v) if isinstance(k, str) else v for k, v in data["env"].items()}
    try:
        return JobFile.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = _env_key_line(doc, err)
        line = line_of(doc, loc)
        key = ".".join(str(p) for p in loc) or "(top)"
        msg = "unknown key (see dtrain launch --help)" if err["type"] == "extra_forbidden" else err["msg"]
        more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
        bad = (err.get("ctx") or {}).get("error")
        sep = ": "
        if isinstance(bad, BadNumber):  # `KEY 'VALUE': expected ...`, the flag's own words
            sep, msg = " ", str(bad)
        raise LaunchError(f"{where}{f':{line}' if line else ''}: {key}{sep}{msg}{more}") from None


def inside(base: Path, value: str, where: str, key: str, *, start: Path | None = None, ssh: bool = False) -> str:
    """A job file's path `value` (relative to `start`, default its directory `base`) made absolute,
    or LaunchError `WHERE: KEY 'VALUE': ...` where it could name a file outside base: `~`, an
    absolute path, `..` or a symlink out (resolved, then checked); with ssh, `%` and `$` too (ssh
    expands %d, ${HOME} in a key's path). A flag's path is the user's own: not checked here."""
    if value.startswith("~"):
        why = "a path in your home (~)"
    elif os.path.isabs(value):
        why = "an absolute path"
    elif ssh and ("%" in value or "$" in value):
        why = "ssh would expand its % or $ (%d is your home)"
    else:
        root = base.resolve()
        real = ((start or base) / value).resolve()
        if real == root or root in real.parents:
            return str(real)
        why = "it leaves the job file's directory (by .. or a symlink)"
    flag = f"{_flag(key)} on the command line" if key in JobFile.model_fields else "a --hostfile of yours"
    raise LaunchError(f"{where}: {key} {values.shown(value)}: {why}; a job file is run by others, so its paths "
                      f"stay inside its directory ({base}): move the file there, or give it with {flag}")


def _hostfile_identities(hostfile: str, base: Path, where: str) -> None:
    """A hostfile the job file names: each identity= inside the job file's directory (relative to
    the hostfile, as launch/targets/ssh.py reads it). One it cannot read: the later checks say."""
    from dtrain.launch.remote.hosts import parse_hostfile

    try:
        nodes = parse_hostfile(hostfile)
    except LaunchError:
        return
    for identity in dict.fromkeys(n.identity for n in nodes if n.identity):
        inside(base, identity, f"{where}: hostfile {Path(hostfile).name}", "identity", start=Path(hostfile).parent,
               ssh=True)


def load(path: str | Path, environ: Mapping[str, str] | None = None, allowed: Iterable[str] = ()) -> dict[str, Any]:
    """The flags a job file gives: {flag name: value} in the form the launch task takes them
    (env and mount as lists of strings, paths relative to the file made absolute). Its paths stay
    inside its directory (`inside`); `env: {NAME: }` takes $NAME from environ only for a name in
    `allowed` (the command line's `--env NAME`) or the allow-list file (trust.env_allowed)."""
    from dtrain.launch.jobs import trust

    path = Path(path)
    try:
        values.local_path("-f", str(path), "file", "a job file")
        text = values.small_text_file(path, "job file", "YAML of launch flags")
    except values.BadValue as e:
        raise LaunchError(str(e)) from None
    job = parse(text, str(path))
    doc = compose_load(text)[0]
    if job.ssh_opt or job.ssh_config is not None:
        check_file_ssh(job, doc, str(path))
    for key in COMMAND_LINE_ONLY:
        if getattr(job, key) is not None:
            raise LaunchError(f"{path}:{line_of(doc, (key,)) or 1}: {key}: the price's confirmation is yours, and a job "
                              f"file is run by others: take it out of the file and pass {_flag(key)} on the command "
                              "line")
    out = {k: v for k, v in job.model_dump().items() if v is not None}
    for key, v in out.items():  # numbers as the command line gives them: the flags' own checks apply
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[key] = f"{v:g}" if isinstance(v, float) else str(v)
    for key in PATH_KEYS:
        if key in out:
            out[key] = inside(path.parent, out[key], f"{path}:{line_of(doc, (key,)) or 1}", key, ssh=key == "ssh_key")
    for i, item in enumerate(out.get("input") or []):  # NAME=DIR: the DIR inside the file's directory too
        name, eq, where = item.partition("=")
        if eq and where and not where.startswith("s3://"):
            at = f"{path}:{line_of(doc, ('input', i)) or 1}"
            out["input"][i] = f"{name}={inside(path.parent, where, at, 'input')}"
    if "hostfile" in out:
        _hostfile_identities(out["hostfile"], path.parent, f"{path}:{line_of(doc, ('hostfile',)) or 1}")
    if "env" in out:
        environ = os.environ if environ is None else environ
        allowed = set(allowed)
        if any(v is None and k not in allowed for k, v in out["env"].items()):
            allowed |= trust.env_allowed()
        pairs = []
        for k, v in out["env"].items():
            if v is None:
                at = f"{path}:{line_of(doc, ('env', k))}: env.{k}"
                if k not in allowed:
                    raise LaunchError(f"{at}: takes ${k} from your environment, and a job file is run by others: "
                                      f"pass --env {k} on the command line (its value from your environment), or "
                                      f"add the line {k} to {trust.env_allow_file()}")
                if k not in environ:
                    raise LaunchError(f"{at}: no value here and ${k} is not set where dtrain runs")
                v = trust.environ_value(k, environ, at)
            pairs.append(f"{k}={v}")
        out["env"] = pairs
    return out


def origins(path: str | Path, keys: Iterable[str]) -> dict[str, str]:
    """{key: "FILE:LINE"} for the job file's top-level keys among `keys` (those a launch takes
    from the file, not from a flag): where a later check of a value names it (located)."""
    doc = compose_load(values.small_text_file(Path(path), "job file", "YAML of launch flags"))[0]
    return {k: f"{path}:{line_of(doc, (k,)) or 1}" for k in keys}


# how an error names the command (what follows `--`): from the file, `FILE:LINE: command`
COMMAND_TEXT = "the command after `--`"


@contextmanager
def located(where: Mapping[str, str]) -> Iterator[None]:
    """A LaunchError or BadValue about a flag whose value came from the job file (where: {key:
    "FILE:LINE"}, origins) names the file, line and key instead of the flag: `--spares 9: must
    be fewer...` -> `job.yaml:7: spares 9: must be fewer...`. Checks of a value against others
    (the node count) run after the file is read, in the flags' own terms."""
    try:
        yield
    except (LaunchError, values.BadValue) as e:
        text = str(e)
        for key, at in where.items():
            flag = COMMAND_TEXT if key == "command" else "--" + key.replace("_", "-")
            if text == flag or text.startswith((flag + " ", flag + ":")):
                raise type(e)(f"{at}: {key}{text[len(flag):]}") from None
        raise


# The keys that name the nodes: one source. The command line's replaces the file's, whichever.
NODE_KEYS = ("cluster", "hostfile", "hosts", "ec2_tag", "up")


def merge(from_file: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """The file's flags, then the command line's (given ones only: not None, not empty; False and 0
    are given: `--no-check-network`, `--min-nodes 0` over the file's). env
    adds up: the file's pairs, then --env's (a name given twice: the command line's value). Nodes
    named on the command line (--hosts, --hostfile, ...) replace the file's, whichever key."""
    given = {k: v for k, v in flags.items() if v is not None and v != [] and v != ()}  # False, 0: given
    if from_file.get("env") and given.get("env"):
        given["env"] = [*from_file["env"], *given["env"]]
    if any(k in given for k in NODE_KEYS):  # other nodes on the command line: the file's --up shape goes too
        drop = set(NODE_KEYS) | (set() if "up" in given else set(UP_KEYS))
        from_file = {k: v for k, v in from_file.items() if k not in drop}
    return {**from_file, **given}


def _stays_inside(path: str) -> bool:
    """A path as typed that a job file beside it (here) may give: relative, no `..`, no `~`."""
    return not (path.startswith("~") or os.path.isabs(path) or ".." in Path(path).parts)


def _here(path: str) -> str:
    """An absolute path under the working directory as a relative one (a job file's path, made
    absolute by load, dumped as the file had it when run from its directory)."""
    if os.path.isabs(path):
        for cwd in dict.fromkeys((Path.cwd(), Path.cwd().resolve())):
            if Path(path).is_relative_to(cwd):
                return str(Path(path).relative_to(cwd))
    return path


def literal_env(path: str | Path) -> dict[str, str]:
    """A job file's literal env values ({NAME: value}, `EPOCHS: 10`): not secrets (they are in the
    file), so --dump writes them back; the names it takes from the environment it leaves empty."""
    job = parse(values.small_text_file(Path(path), "job file", "YAML of launch flags"), str(path))
    return {k: v for k, v in (job.env or {}).items() if v is not None}


def dump(given: dict[str, Any], literal: Mapping[str, str] | None = None) -> str:
    """The job file a set of flags means. --env values are not written (a file is shared, a
    secret is not): each name is left empty, taken from the environment when the file runs with
    --env NAME; a job file's literal values (literal: literal_env) stay. A path a job file may not
    give (absolute outside here, ~, ..) is left out and named, as a flag for the command line; a
    relative one stays as typed (the file saved here)."""
    data: dict[str, Any] = {}
    left_out = []  # what a job file may not give (check_file_ssh): the command line's
    for key in JobFile.model_fields:
        v = given.get(key)
        if v in (None, [], (), False):
            continue
        if key in PATH_KEYS:
            v = _here(v)
        if key == "ssh_config" or (key in PATH_KEYS and not _stays_inside(v)):
            left_out.append((_flag(key), v))
            continue
        if key == "ssh_opt":
            left_out += [("--ssh-opt", o) for o in v if file_ssh_option(o)]
            v = [o for o in v if not file_ssh_option(o)]
            if not v:
                continue
        if key == "env":
            pairs = [kv.partition("=")[::2] for kv in v]
            v = {k: (x if (literal or {}).get(k) == x else None) for k, x in pairs}
        elif key == "command":
            v = list(v)
        data[key] = v
    for key in COMMAND_LINE_ONLY:  # the user's, not a shared file's
        if key in data:
            v = data.pop(key)
            if v is not True:
                left_out.append((_flag(key), str(v)))
    for key in ("slots", "master_port", "max_restarts", "min_nodes", "spares", "root_size", "idle_down"):
        if key in data:
            data[key] = int(data[key])
    for key in ("timeout", "hang_timeout", "straggler_check"):
        if key in data:
            data[key] = float(data[key])
    return written(data, left_out)


def written(data: dict[str, Any], left_out: Sequence[tuple[str, str]]) -> str:
    """A job file's text for `data` (checked to read back), with the comments that say what is
    not in it: env names without values, and the flags a job file may not give (left_out)."""
    JobFile.model_validate(data)  # what is written reads back
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=False).replace(": null\n", ":\n")
    if None in (data.get("env") or {}).values():
        text = ("# env: values are not written here; run the file with --env NAME for each (its value from\n"
                "# your environment), or give them in an env_file:\n") + text
    if left_out:
        text = ("# not written here (a job file may not give them: they can run commands on the launching\n"
                "# machine or name files outside its directory): give them with -f on the command line: "
                + " ".join(f"{flag} {shlex.quote(v)}" for flag, v in left_out)
                + "\n") + text
    return text
