"""What a target provides, declared once (SkyPilot's sky/provision/__init__.py is the model: one
interface, one module per cloud, a router that picks the module; docs/architecture.md "Targets").

Two kinds of target, one module each:

- a `NodeProvider` is where the nodes of a launch on nodes (`--target nodes`) come from: the
  simulated cluster (local.py), plain ssh hosts (ssh.py), EC2 (ec2.py). It finds the nodes of a
  running target (`discover`), brings nodes up and takes them down where it can (`up`/`down`,
  delegated to launch/infra), and says how its nodes are reached (`ssh_user`), whether a node hears
  of its interruption (`spot_notice`), how the nodes log in to the image's registry (`login`) and
  what an instance type has (`expectations`).
- a `Target` is a `--target` value: `nodes` (nodes.py), or a job described for another system,
  submitted (sagemaker.py) or written (mpijob.py, pytorchjob.py, ecs.py). It names the launch
  fields it refuses and ignores and runs the launch its way (`run`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs.login import Login
from dtrain.launch.remote.hosts import Node

# Fields the job relies on that a target off the nodes cannot honour: refused, every one named in
# one message (Target.refusal).
REFUSED = ("max_restarts", "min_nodes", "spares", "hang_timeout", "progress_pattern", "check_network", "mount",
           "checkpoint_dir", "straggler_check", "replace_stragglers", "nccl_check",
           # the nodes a launch brings up itself (launch/up.py): only --target nodes
           "up", "spot", "subnet", "ami", "key_name", "root_size", "up_timeout", "keep", "idle_down", "yes", "confirm_above")
# Fields about the nodes themselves: a target off the nodes has its own; a line on stderr says so.
IGNORED = ("ssh_user", "ssh_key", "ssh_opt", "ssh_config", "pull", "iface", "master_port", "rdzv",
           "shm_size", "workdir_limit", "no_spot_watch")
# Fields only a SageMaker training job has.
SAGEMAKER_ONLY = ("role", "on_demand", "max_wait", "volume_size", "input")


def _listed(names: list[str]) -> str:
    """a; a and b; a, b and c."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


@dataclass(frozen=True)
class NodeArgs:
    """The launch fields that name the nodes (one source: a provider's `flags`) and shape them."""

    hostfile: str | None = None
    hosts: str | None = None
    ec2_tag: str | None = None
    cluster: str | None = None
    region: str | None = None
    slots: int | None = None


class NodeProvider(ABC):
    """Where the nodes come from."""

    name: ClassVar[str]
    # The launch fields (JobFile keys) that select this provider, from the model (jobfile.selecting:
    # each such field says `nodes: PROVIDER`); () where no flag names it.
    flags: ClassVar[tuple[str, ...]] = ()
    # The metadata endpoint each node polls for a spot interruption notice ("": its nodes hear none).
    spot_notice: ClassVar[str] = ""

    @abstractmethod
    def discover(self, args: NodeArgs) -> list[Node]:
        """The nodes of the running target that args name (ssh defaults not applied yet)."""

    @abstractmethod
    def ssh_user(self) -> str | None:
        """The user its nodes take over ssh (None: ssh decides, or each node says)."""

    def ssh_opts(self, args: NodeArgs) -> tuple[str, ...]:
        """ssh options recorded for the nodes args name (before the user's: ssh takes the first)."""
        return ()

    def up(self, spec: Any, **options: Any) -> Any:
        """Bring nodes up (where the provider can; launch/infra does the work)."""
        raise LaunchError(f"{self.name}: dtrain does not bring these nodes up")

    def down(self, name: str | None = None, **options: Any) -> Any:
        """Take the nodes up() brought up down."""
        raise LaunchError(f"{self.name}: dtrain does not take these nodes down")

    def joining(self, args: NodeArgs) -> Callable[[], list[Node]] | None:
        """Where its nodes can change while a job runs (a group that replaces a node): a function
        that says the nodes args name now (raising where it cannot ask); None where they cannot."""
        return None

    @abstractmethod
    def login(self, image: str) -> Login:
        """How the nodes log in to the image's registry before pulling (Login(): none)."""


class Target(ABC):
    """A `--target` value: where the launch runs. Every launch field (launch/jobs/config.py
    LaunchConfig) is one of three to a target: refused (it cannot honour it: the launch is refused,
    every such field named in one message), ignored (the target's own: one line on stderr says
    so), or honoured (the rest: `honoured()`)."""

    name: ClassVar[str]
    on_nodes: ClassVar[bool] = False  # dtrain starts the containers on nodes (`dtrain launch` runs the Job)
    writes: ClassVar[bool] = False  # writes a description (--output FILE, or stdout)
    refused: ClassVar[tuple[str, ...]] = ()  # launch fields it cannot honour: refused, named
    ignored: ClassVar[tuple[str, ...]] = ()  # launch fields that are its own: ignored, a line says so

    @classmethod
    def honoured(cls) -> tuple[str, ...]:
        """The launch fields it reads (neither refused nor ignored)."""
        from dtrain.launch.jobs.jobfile import JobFile

        return tuple(k for k in JobFile.model_fields if k not in cls.refused and k not in cls.ignored)

    def refusal(self, names: list[str], keys: list[str] | None = None) -> str:
        """The one message for every field it cannot honour (names: as the launch names them, a
        flag or `FILE:LINE: key`; keys: their fields, in the same order): SageMaker's own fields
        said to be SageMaker's, the nodes' run-time ones said to need the nodes, in one line."""
        keys = keys if keys is not None else [n.rsplit(" ", 1)[-1].lstrip("-").replace("-", "_") for n in names]
        sagemaker = [n for n, k in zip(names, keys) if k in SAGEMAKER_ONLY]
        nodes = [n for n, k in zip(names, keys) if k not in SAGEMAKER_ONLY]
        parts = []
        if nodes:
            parts.append(f"{_listed(nodes)}: not for --target {self.name} (it runs on the nodes dtrain launches: "
                         f"--target nodes)")
        if sagemaker:
            parts.append(f"{_listed(sagemaker)} {'is' if len(sagemaker) == 1 else 'are'} SageMaker's only "
                         f"(--target sagemaker); --target {self.name} has no equivalent{self.sagemaker_hint}")
        return "; ".join(parts) + f"; take {'it' if len(names) == 1 else 'them'} out for {self.name}"

    sagemaker_hint: ClassVar[str] = ""  # after "has no equivalent" (nodes: where its nodes come from)

    @abstractmethod
    def run(self, cfg: Any, given: Mapping[str, Any], count: int | None, *, output: str | None,
            session: Any, note: Callable[[], None], err: Callable[[str], None] = print, force: bool = False) -> int:
        """Run the checked launch cfg (launch/jobs/config.py LaunchConfig; given: the fields set by
        the flags or the file; count: the nodes it names or its `count`, None where neither) and
        return the exit code (err: a line for stderr); note() once it is checked, before anything
        is submitted or written. force: --output may replace a file dtrain did not write."""
