"""What the targets that write a job description (mpijob.py, pytorchjob.py, ecs.py) share: the
description rendered by launch/other_tools/manifests.py (as `dtrain manifest --for T` does),
checked, written to --output or stdout."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from dtrain import values
from dtrain.launch.errors import LaunchError
from dtrain.launch.targets.base import IGNORED, REFUSED, SAGEMAKER_ONLY, Target
from dtrain.launch.targets.common import slots


class Description(Target):
    writes = True
    # beyond image, command, name, env, workers: the tool, not dtrain, times and waits for the job,
    # and the image holds the code
    refused = REFUSED + SAGEMAKER_ONLY + ("timeout",)  # Kubernetes' targets map it (deadline below)
    ignored = IGNORED + ("workdir", "detach", "region")  # region: where the cluster runs is the tool's
    # takes --instance-type: its GPUs and EFA interfaces per pod (manifests.py), as `dtrain manifest`
    instance_type: ClassVar[bool] = True
    # maps the launch's timeout to the job's deadline (Kubernetes: runPolicy.activeDeadlineSeconds)
    deadline: ClassVar[bool] = False

    def run(self, cfg: Any, given: Mapping[str, Any], count: int | None, *, output: str | None,
            session: Any, note: Callable[[], None], err: Callable[[str], None] = print, force: bool = False) -> int:
        from dtrain.launch.jobs.jobfile import COMMAND_TEXT  # the file's `command:` named as such (located)
        from dtrain.launch.other_tools import manifests as mf

        if cfg.instance_type is not None and not self.instance_type:
            raise LaunchError(f"{cfg.named('instance_type')}: not for --target {self.name}; take it out for "
                              f"{self.name}")
        if cfg.instance_type is not None:
            values.ec2_instance_type(cfg.named("instance_type"), cfg.instance_type)
        launcher = given.get("launcher")  # default: by the target
        env_items = [f"{k}={v}" for k, v in cfg.env_values().items()]
        mf.check_output(output, force)
        per_node = slots(cfg)  # hosts: h:8 -> 8 ranks per worker
        try:
            spec = mf.spec_from_args(
                self.name, cfg.image, list(cfg.command or ()), workers=count or 2, name=cfg.name or "dtrain-job",
                env=env_items, launcher=launcher, instance_type=cfg.instance_type, slots_per_worker=per_node,
                **({"active_deadline_s": math.ceil(cfg.timeout)} if self.deadline and cfg.timeout else {}))
            text = mf.render(spec)
        except mf.CommandRefused as e:  # the command may be the job file's: named as `command` (jobfile.located)
            raise LaunchError(f"{COMMAND_TEXT}: {e.why.replace('--for ', '--target ')}; give no command") from None
        except LaunchError as e:  # `dtrain manifest`'s words: --for is --target here
            raise type(e)(str(e).replace("--for ", "--target ")) from None
        note()
        for line in mf.placeholders(spec, via="launch"):  # what it filled in, named (no values)
            err(line)
        print(mf.write(text, output, force), end="")
        return 0
