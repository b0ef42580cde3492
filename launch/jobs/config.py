"""The launch configuration: one typed value from flag or file to every target (issue 48).

    flags (tasks.launch) + job file (jobfile.load) -> build() -> LaunchConfig -> the target's run
                                                                            -> job_spec() -> Job (nodes)
                                                              -> dump() -> a job file that builds the same

`LaunchConfig` is the job file's model (`JobFile`: every field a flag, its help, its choices, its
bounds in `jobfile.NUMBERS`) with the launch's defaults filled in (`jobfile.launch_default`), each
value checked by its flag's own parser (dtrain/values.py) and the rules between fields as
validators. It is built once, here; a value the job file gave is named by the file's line in any
error (`jobfile.located`), one the command line gave by its flag.

`job_spec` is the one place a JobSpec (what `Job` runs on nodes) is made: the launch on nodes, the
demo, the doctor's and the network checks' containers all come through it
(tests/test_launch_model.py fails on a JobSpec made anywhere else in the package).
"""

from __future__ import annotations

import os
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from pydantic import PrivateAttr, ValidationError, field_validator, model_validator

from dtrain import values
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import jobfile
from dtrain.launch.jobs.jobfile import BadNumber, JobFile

if TYPE_CHECKING:
    from dtrain.launch.jobs.spec import JobSpec


def flag(key: str) -> str:
    """The flag a field is: max_restarts -> --max-restarts."""
    return "--" + key.replace("_", "-")


# the switches (on_demand, detach, check_network, ...): each has its opposite flag, so a command
# line can turn off what a job file turns on (`--no-check-network` over `check_network: true`);
# no_spot_watch's opposite is --spot-watch
# (not the command line's own: a job file never gives `yes`, so there is nothing to turn off)
SWITCHES = tuple(k for k, f in JobFile.model_fields.items()
                 if "bool" in str(f.annotation) and k not in jobfile.COMMAND_LINE_ONLY)


def opposite(key: str) -> str:
    """The field name of a switch's opposite flag: check_network -> no_check_network, no_spot_watch -> spot_watch."""
    return key.removeprefix("no_") if key.startswith("no_") else f"no_{key}"


def switches(flags: Mapping[str, Any]) -> dict[str, Any]:
    """Invoke's values of the launch flags as build() takes them (pure): a switch not given is
    None (the job file's value stands), --X is True, its opposite --no-X False (over the file's);
    both given: LaunchError naming the two."""
    out = dict(flags)
    for k in SWITCHES:
        on, off = bool(out.get(k)), bool(out.pop(opposite(k), False))
        if on and off:
            raise LaunchError(f"{flag(k)} and {flag(opposite(k))}: give one")
        out[k] = True if on else False if off else None
    return out


class LaunchConfig(JobFile):
    """A launch: JobFile's fields with the launch's defaults, every value checked. Not given
    fields hold their default (None: none); `given` says which fields the flags or the file set."""

    _given: frozenset = PrivateAttr(frozenset())  # the fields the flags or the file gave
    _where: dict = PrivateAttr(default_factory=dict)  # {field: "FILE:LINE"}: those the job file gave
    _base: Optional[Path] = PrivateAttr(None)  # the job file's directory (None: none read)
    _literal_env: frozenset = PrivateAttr(frozenset())  # env names whose values are the job file's literals
    _source: Optional[str] = PrivateAttr(None)  # the job file's name (a description's default job name)

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        filled = {k: jobfile.launch_default(k) for k in JobFile.model_fields if data.get(k) is None}
        return {**data, **{k: v for k, v in filled.items() if v is not None}}

    # ---- each value by its flag's own parser (the same words from a file: jobfile.located)

    @field_validator("image")
    @classmethod
    def _image(cls, v: Optional[str]) -> Optional[str]:
        return None if v is None else values.image("--image", v)

    @field_validator("name", "iface")
    @classmethod
    def _name(cls, v: Optional[str], info: Any) -> Optional[str]:
        if v is not None:
            values.name(flag(info.field_name), v, *((15,) if info.field_name == "iface" else ()))
        return v

    @field_validator("shm_size")
    @classmethod
    def _shm(cls, v: Optional[str]) -> Optional[str]:
        return None if v is None else values.docker_size("--shm-size", v, "16g")

    @field_validator("ssh_user")
    @classmethod
    def _user(cls, v: Optional[str]) -> Optional[str]:
        return None if v is None else values.user("--ssh-user", v)

    @field_validator("region")
    @classmethod
    def _region(cls, v: Optional[str]) -> Optional[str]:
        return None if v is None else values.region("--region", v)

    @field_validator("ssh_key")
    @classmethod
    def _key(cls, v: Optional[str]) -> Optional[str]:
        return None if v is None else values.ssh_key("--ssh-key", v)

    @field_validator("ssh_config")
    @classmethod
    def _ssh_config(cls, v: Optional[str]) -> Optional[str]:
        return None if v is None else values.ssh_config("--ssh-config", v)

    @field_validator("env_file", "workdir")
    @classmethod
    def _local(cls, v: Optional[str], info: Any) -> Optional[str]:
        if v is not None:
            kind = ("file", "an env file") if info.field_name == "env_file" else ("project", "")
            values.local_path(flag(info.field_name), v, *kind)
        return v

    @field_validator("workdir_limit")
    @classmethod
    def _limit(cls, v: Optional[str]) -> Optional[str]:
        from dtrain.launch.jobs.workdir import parse_size

        if v is not None:
            parse_size(v)
        return v

    @field_validator("progress_pattern")
    @classmethod
    def _regex(cls, v: Optional[str]) -> Optional[str]:
        return None if v is None else values.regex("--progress-pattern", v)

    @field_validator("checkpoint_dir")
    @classmethod
    def _checkpoint(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not v.startswith("/"):
            raise values.BadValue(f"--checkpoint-dir {v}: expected an absolute path in the containers")
        return v

    @field_validator("mount")
    @classmethod
    def _mounts(cls, v: Optional[list[str]]) -> Optional[list[str]]:
        from dtrain.launch.jobs import container

        for m in v or []:
            container.parse_mount(m)
        return v

    @field_validator("input")
    @classmethod
    def _inputs(cls, v: Optional[list[str]]) -> Optional[list[str]]:
        from dtrain.launch.sagemaker.engine import parse_inputs

        for item in v or []:  # each local DIR a directory (a FIFO or device is one line, not a hang)
            where = item.partition("=")[2]
            if where and not where.startswith("s3://"):
                values.local_path(f"--input {values.shown(item)}:", where, "dir", "an input channel's data")
        parse_inputs(v or [])  # `dtrain sagemaker run --input`'s own rules (names, S3 URIs, one per channel)
        return v

    @field_validator("up")
    @classmethod
    def _up(cls, v: Optional[str]) -> Optional[str]:
        if v is not None:
            jobfile.up_shape(v)  # TYPE:COUNT or COUNT x TYPE, else BadValue naming --up
        return v

    @field_validator("confirm_above", mode="before")
    @classmethod
    def _above(cls, v: Any) -> Any:
        return None if v is None else values.number("--confirm-above", v if isinstance(v, str) else f"{v:g}", 0,
                                                    or_equal=True)

    # ---- the rules between fields

    @model_validator(mode="after")
    def _rules(self) -> "LaunchConfig":
        if not self.image:
            raise LaunchError("--image is required (e.g. --image 10.213.0.1:5000/dtrain/horovod-tensorflow:TAG)")
        if self.progress_pattern is not None and self.hang_timeout is None:
            raise LaunchError("--progress-pattern is what --hang-timeout counts as progress: give --hang-timeout too")
        if self.replace_stragglers and not self.straggler_check:
            raise LaunchError("--replace-stragglers swaps out what --straggler-check finds: give --straggler-check too")
        if self.replace_stragglers and not self.spares:
            raise LaunchError("--replace-stragglers needs a spare: --spares 0 gives none" if self.spares == 0
                              else "--replace-stragglers swaps a straggler for a spare: give --spares K too")
        if self.max_wait is not None and self.on_demand:
            raise LaunchError(f"--max-wait {self.max_wait:g}: the wait for spot capacity; not with --on-demand")
        if self.max_wait is not None and self.timeout is not None and self.max_wait < self.timeout:
            raise LaunchError(f"--max-wait {self.max_wait:g}: must be at least --timeout {self.timeout:g} (the wait "
                              "includes the run)")
        if self.up:
            other = next((k for k in jobfile.NODE_KEYS if k != "up" and getattr(self, k)), None)
            if other:
                raise LaunchError(f"--up brings its own nodes: give --up or {flag(other)}, not both")
            if self.count is not None:
                raise LaunchError(f"--count {self.count}: --up TYPE:COUNT says how many nodes (and --spares K more)")
            if self.detach and not (self.keep or self.idle_down):
                raise LaunchError("--detach returns while the job runs, and --up takes the nodes down when the launch "
                                  "returns: add --keep or --idle-down MINUTES")
        else:
            needs = next((k for k in jobfile.UP_KEYS if getattr(self, k) not in (None, False)), None)
            if needs:
                raise LaunchError(f"{flag(needs)} is for the nodes a launch brings up: give --up TYPE:COUNT too")
        return self

    # ---- what the targets read

    def __getitem__(self, key: str) -> Any:  # cfg["image"]: a target written against the dict of before
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)

    @property
    def given(self) -> frozenset:
        return self._given

    @property
    def where(self) -> dict[str, str]:
        """{field: "FILE:LINE"} for the fields the job file gave."""
        return dict(self._where)

    def named(self, key: str) -> str:
        """How a message names field `key`: the file's line and key, or the flag."""
        return f"{self._where[key]}: {key}" if key in self._where else flag(key)

    def set(self, key: str) -> bool:
        """Field `key` holds a value other than its default: a target that cannot honour it says so."""
        v = getattr(self, key)
        return v not in (None, [], (), False, "") and v != jobfile.launch_default(key)

    def env_values(self) -> dict[str, str]:
        """--env-file's pairs, then env's (later ones win): what every rank gets."""
        from dtrain.launch.jobs import container

        return {**(container.parse_env_file(self.env_file) if self.env_file else {}),
                **{k: v or "" for k, v in (self.env or {}).items()}}

    def inputs(self) -> dict[str, str]:
        """{channel: DIR or s3:// URI} of `input`."""
        return dict(item.split("=", 1) for item in self.input or [])


# ---------------------------------------------------------------- built once


def _choices(key: str) -> tuple[str, ...]:
    ann = JobFile.model_fields[key].annotation
    for arg in typing.get_args(ann):
        if typing.get_origin(arg) is typing.Literal:
            return typing.get_args(arg)
    return ()


def _error(e: ValidationError) -> Exception:
    """The first problem of a validation, in the flag's words (jobfile.located turns them into
    the file's line and key where the file gave the value)."""
    err = e.errors()[0]
    key = str(err["loc"][0]) if err["loc"] else ""
    bad = (err.get("ctx") or {}).get("error")
    if isinstance(bad, BadNumber):
        return values.BadValue(f"{flag(key)} {bad}")
    if isinstance(bad, (values.BadValue, LaunchError)):
        return bad
    if err["type"] == "literal_error":
        choices = _choices(key)
        return values.BadValue(f"{flag(key)} {values.shown(err['input'])}: use {', '.join(choices[:-1])} or "
                               f"{choices[-1]}")
    return values.BadValue(f"{flag(key)}: {err['msg']}")


def build(flags: Mapping[str, Any], path: str | Path | None = None,
          environ: Mapping[str, str] | None = None) -> LaunchConfig:
    """The launch that the command line's `flags` ({field: value}, None: not given; env as --env
    items; switches() turns Invoke's into these) and the job file at `path` mean: the file's
    values, then the flags' (a flag given, even `--max-restarts 0`, `--min-nodes 0` or
    `--no-check-network` (False), replaces the file's value); every value checked, the first
    problem one LaunchError (or BadValue) naming the flag or the file's line."""
    from dtrain.launch.jobs import trust

    flags = dict(flags)
    flags["env"], bare = trust.cli_env(flags.get("env"), environ)  # --env NAME: the value from the environment
    from_file = jobfile.load(path, environ, allowed=bare) if path else {}
    literal = jobfile.literal_env(path) if path else {}
    given = jobfile.merge(from_file, {k: v for k, v in flags.items() if k in JobFile.model_fields})
    where = jobfile.origins(path, [k for k in from_file if given.get(k) is from_file[k]]) if path else {}
    data = dict(given)
    with jobfile.located(where):
        if "env" in data:
            data["env"] = values.env_pairs("--env", data["env"])
        try:
            cfg = LaunchConfig.model_validate(data)
        except ValidationError as e:
            raise _error(e) from None
    cfg._given = frozenset(given)
    cfg._where = where
    cfg._base = Path(path).parent.resolve() if path else None
    cfg._source = Path(path).name if path else None
    cfg._literal_env = frozenset(k for k, v in literal.items() if (cfg.env or {}).get(k) == v)
    return cfg


def job_spec(cfg: LaunchConfig, *, ssh_opts: tuple[str, ...] = (), imds: str = "",
             efa_types: tuple[tuple[str, int], ...] = (), **tuning: Any) -> "JobSpec":
    """The JobSpec of the launch `cfg` on nodes: the one place one is made. ssh_opts, imds (the
    spot notice's endpoint) and efa_types come from the nodes' provider (launch/targets);
    tuning: what no flag sets (ready_timeout, extra_mca)."""
    from dtrain.launch.jobs import container
    from dtrain.launch.jobs.spec import JobSpec
    from dtrain.launch.jobs.workdir import parse_size

    return JobSpec(image=cfg.image or "", command=tuple(cfg.command or ()), launcher=cfg.launcher,
                   name=cfg.name or "", env=cfg.env_values(), iface=cfg.iface,
                   mounts=tuple(container.parse_mount(m) for m in cfg.mount or []), shm_size=cfg.shm_size,
                   master_port=cfg.master_port, rdzv=cfg.rdzv, pull=cfg.pull, job_timeout=cfg.timeout,
                   ssh_opts=tuple(ssh_opts), workdir=cfg.workdir, workdir_limit=parse_size(cfg.workdir_limit),
                   detach=bool(cfg.detach), max_restarts=cfg.max_restarts, min_nodes=cfg.min_nodes or None,
                   spares=cfg.spares or 0, checkpoint_dir=cfg.checkpoint_dir, hang_timeout=cfg.hang_timeout,
                   progress_pattern=cfg.progress_pattern or "", imds="" if cfg.no_spot_watch else imds,
                   check_network=bool(cfg.check_network), straggler_check=cfg.straggler_check,
                   replace_stragglers=bool(cfg.replace_stragglers), nccl_check=cfg.nccl_check,
                   efa_types=tuple(efa_types), **tuning)


# ---------------------------------------------------------------- written back (--dump)


def _relative(path: str, base: Path) -> str | None:
    """A path as a job file in `base` gives it (relative, inside base), or None where it cannot."""
    real = Path(os.path.abspath(path))
    for root in dict.fromkeys((base, base.resolve())):
        if real == root or real.is_relative_to(root):
            rel = str(real.relative_to(root))
            return rel or "."
    return None


def dump(cfg: LaunchConfig) -> str:
    """The job file `cfg` means, to be saved in the job file's directory (-f), else the current
    directory: loaded back with -f it builds the same launch on every target. What it holds:
    - the fields given (by the flags or the file), typed as the model reads them;
    - paths relative to that directory (a relative one stays relative); one outside it, and what a
      job file may not give (ssh_config, ssh options that run commands), is left out and named in
      a comment, to give with -f on the command line;
    - env: the job file's literal values as written; every other name empty (`NAME:`: its value
      from the environment when the file runs with --env NAME): a value given with --env is never
      written (a file is shared, a secret is not)."""
    base = cfg._base or Path.cwd()
    data: dict[str, Any] = {}
    left_out: list[tuple[str, str]] = []
    for key in JobFile.model_fields:
        if key not in cfg.given:
            continue
        v = getattr(cfg, key)
        if v is None or (isinstance(v, (list, tuple, dict)) and not v):  # 0 and false stay: given
            continue
        if key == "ssh_config" or key in jobfile.COMMAND_LINE_ONLY:  # never a shared file's
            if v is not True:
                left_out.append((flag(key), v if isinstance(v, str) else f"{v:g}"))
            continue
        if key in jobfile.PATH_KEYS:
            rel = _relative(v, base)
            if rel is None:
                left_out.append((flag(key), v))
                continue
            v = rel
        elif key == "input":
            kept = []
            for item in v:
                name, _, where = item.partition("=")
                rel = where if where.startswith("s3://") else _relative(where, base)
                (kept.append(f"{name}={rel}") if rel is not None else left_out.append(("--input", item)))
            if not kept:
                continue
            v = kept
        elif key == "ssh_opt":
            left_out += [("--ssh-opt", o) for o in v if jobfile.file_ssh_option(o)]
            v = [o for o in v if not jobfile.file_ssh_option(o)]
            if not v:
                continue
        elif key == "env":
            v = {k: (x if k in cfg._literal_env else None) for k, x in v.items()}
        elif isinstance(v, (list, tuple)):
            v = list(v)
        data[key] = v
    return jobfile.written(data, left_out)
