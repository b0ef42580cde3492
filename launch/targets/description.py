"""What the targets that write a job description (mpijob.py, pytorchjob.py, ecs.py, trainjob.py,
jobset.py) share: each is also the `Describer` of its kind (launch/other_tools/describe.py), so
`dtrain manifest --for T` and `dtrain launch --target T` write the same document; here the launch's
fields become its spec, checked, rendered, written to --output or stdout."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from dtrain import values
from dtrain.launch.errors import LaunchError
from dtrain.launch.other_tools.describe import Describer
from dtrain.launch.targets.base import IGNORED, REFUSED, SAGEMAKER_ONLY, Target
from dtrain.launch.targets.common import env, slots

# beyond image, command, name, env, workers: the tool, not dtrain, times and waits for the job,
# and the image holds the code
_REFUSED = REFUSED + ("timeout",) + SAGEMAKER_ONLY
_IGNORED = IGNORED + ("workdir", "detach", "region")  # region: where the cluster runs is the tool's


class Description(Target, Describer):
    writes = True
    refused = _REFUSED
    ignored = _IGNORED
    # takes --instance-type: its GPUs and EFA interfaces per pod (describe.py), as `dtrain manifest`
    instance_type: ClassVar[bool] = True
    # launch fields of _REFUSED/_IGNORED the kind maps into its document (timeout, max_restarts,
    # mount, iface: ManifestSpec's fields of the same meaning); the rest stay refused or ignored
    maps: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        cls.refused = tuple(k for k in _REFUSED if k not in cls.maps)
        cls.ignored = tuple(k for k in _IGNORED if k not in cls.maps)

    def mapped(self, cfg: Mapping[str, Any]) -> dict[str, Any]:
        """The ManifestSpec fields of the launch fields the kind maps (None: not given)."""
        from dtrain.launch.jobs import container

        out: dict[str, Any] = {}
        if "timeout" in self.maps and cfg.get("timeout") is not None:  # LaunchConfig: typed, checked
            out["timeout_s"] = max(1, math.ceil(float(cfg["timeout"])))
        if "max_restarts" in self.maps and cfg.get("max_restarts") is not None:
            out["max_restarts"] = int(cfg["max_restarts"])
        if "mount" in self.maps and cfg.get("mount"):
            for m in cfg["mount"]:
                container.parse_mount(m)  # one line naming --mount where it is wrong
            out["mounts"] = tuple(cfg["mount"])
        if "iface" in self.maps and cfg.get("iface"):
            out["iface"] = values.name("--iface", cfg["iface"], 15)  # as a launch on nodes checks it
        return out

    @staticmethod
    def plain_env(cfg: Any) -> tuple[str, ...]:
        """The env names whose values the description writes: the job file's literal values
        (`EPOCHS: 10`); a name from the environment (`NAME:`, --env NAME), --env NAME=VALUE and an
        env_file's stay in the kind's secret (never written in a file meant to be committed)."""
        return tuple(sorted(getattr(cfg, "_literal_env", ())))

    def run(self, cfg: Mapping[str, Any], given: Mapping[str, Any], count: int | None, *, output: str | None,
            session: Any, note: Callable[[], None], err: Callable[[str], None] = print, force: bool = False) -> int:
        from dtrain.launch.jobs.jobfile import COMMAND_TEXT  # the file's `command:` named as such (located)
        from dtrain.launch.other_tools import describe

        if cfg["instance_type"] is not None and not self.instance_type:
            raise LaunchError(f"{cfg.named('instance_type')}: not for --target {self.name}; take it out for "
                              f"{self.name}")
        if cfg["instance_type"] is not None:
            values.ec2_instance_type(cfg.named("instance_type"), cfg["instance_type"])
        launcher = given.get("launcher")  # default: by the target
        if cfg["name"] is not None:
            values.name("--name", cfg["name"])
        env_items = [f"{k}={v}" for k, v in env(cfg).items()]
        name = cfg["name"] or describe.default_name(cfg["image"], list(cfg["command"] or ()), cfg._source)
        describe.check_output(output, force)
        try:
            spec = describe.spec_from_args(
                self, cfg["image"], list(cfg["command"] or ()), workers=count or 2, name=name,
                env=env_items, launcher=launcher, instance_type=cfg["instance_type"],
                slots_per_worker=slots(cfg), **self.mapped(cfg),  # hosts: h:8 -> 8 ranks per worker
                plain_env=self.plain_env(cfg))
            text = describe.render(spec, self)
        except describe.CommandRefused as e:  # the command may be the job file's: named as `command` (jobfile.located)
            raise LaunchError(f"{COMMAND_TEXT}: {e.why.replace('--for ', '--target ')}; give no command") from None
        except LaunchError as e:  # `dtrain manifest`'s words: --for is --target here
            raise type(e)(str(e).replace("--for ", "--target ")) from None
        note()
        for line in self.notes(spec, via="launch"):  # what it filled in, named (no values)
            err(line)
        print(describe.write(text, output, force), end="")
        if not cfg["name"]:  # once written: the name dtrain chose, and how to choose another
            err(f"[launch] name {name}: from {'the job file ' + cfg._source if cfg._source else 'the image and the command'}"
                f" (--name NAME to choose)")
        return 0
