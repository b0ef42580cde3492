"""`dtrain launch --target T`: the same launch (JobFile's fields, flags over the job file) run
somewhere other than the nodes: a SageMaker training job (launch/jobs/sagemaker.py's `run`, as
`dtrain sagemaker run` does) or the description of a job for another tool
(launch/other_tools/manifests.py, as `dtrain manifest` does).

What carries over: image, command, launcher, name, env (and env_file), workdir (SageMaker: the
code channel, its requirements.txt installed), the number of nodes the launch names (--hosts,
--hostfile, --cluster's hostfile, --ec2-tag: instances, workers, replicas), timeout (SageMaker's
run-time limit), detach (SageMaker: return once the job has started). How the nodes are reached
(ssh_*, slots), pulled (pull) and wired (iface, master_port, rdzv, shm_size, workdir_limit,
no_spot_watch) is the target's own: said to be ignored on stderr. What a target would silently
drop and the job relies on (restarts, spares, the hang watch, mounts, the network gate) is refused,
named. Here, not in launch/jobs: running jobs (launch/jobs) uses nothing of other_tools.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

from dtrain import values
from dtrain.launch.errors import LaunchError

# Fields the job relies on that a target cannot honour: refused, by target.
REFUSED = ("max_restarts", "min_nodes", "spares", "hang_timeout", "progress_pattern", "check_network", "mount",
           "checkpoint_dir")
# Fields about the nodes themselves: the target has its own; a line on stderr says so.
IGNORED = ("slots", "ssh_user", "ssh_key", "ssh_opt", "ssh_config", "pull", "iface", "master_port", "rdzv",
           "shm_size", "workdir_limit", "no_spot_watch")
# What each description target takes beyond image, command, name, env, workers.
MANIFEST_REFUSED = ("timeout", "role")
# ... and ignores: the image holds the code; the tool, not dtrain, waits for the job.
MANIFEST_IGNORED = ("workdir", "detach")


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _given(cfg: Mapping[str, Any], key: str) -> bool:
    return cfg.get(key) not in (None, [], (), False)


def check_fields(cfg: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[str]:
    """LaunchError for the first field the target cannot take (one line: the flag and the target);
    returns the flags it ignores."""
    target = cfg["target"]
    refused = REFUSED + (MANIFEST_REFUSED if target != "sagemaker" else ())
    for key in refused:
        if _given(cfg, key):
            raise LaunchError(f"{_flag(key)}: not for --target {target} (it runs on the nodes dtrain launches: "
                              f"--target nodes); take it out for {target}")
    ignored = IGNORED + (MANIFEST_IGNORED if target != "sagemaker" else ())
    return [_flag(k) for k in ignored if _given(cfg, k) and cfg.get(k) != defaults.get(k)]


def node_count(cfg: Mapping[str, Any]) -> int | None:
    """How many nodes the launch names (None: none named)."""
    from dtrain.launch.remote.hosts import nodes_from_args

    hostfile = cfg["hostfile"]
    if cfg["cluster"]:
        from dtrain.launch.infra.ec2 import cluster_hostfile

        values.name("--cluster", cfg["cluster"])
        if hostfile or cfg["hosts"] or cfg["ec2_tag"]:
            raise LaunchError("give --cluster or one of --hostfile, --hosts, --ec2-tag, not both")
        hostfile = str(cluster_hostfile(cfg["cluster"]))
    if not (hostfile or cfg["hosts"] or cfg["ec2_tag"]):
        return None
    if cfg["region"] is not None:
        values.region("--region", cfg["region"])
    return len(nodes_from_args(hostfile=hostfile, hosts=cfg["hosts"], ec2_tag=cfg["ec2_tag"], region=cfg["region"]))


def env(cfg: Mapping[str, Any]) -> dict[str, str]:
    """--env-file's pairs, then --env's (later ones win)."""
    from dtrain.launch.jobs import commands

    if cfg["env_file"]:
        values.local_path("--env-file", cfg["env_file"], "file", "an env file")
    return {**(commands.parse_env_file(cfg["env_file"]) if cfg["env_file"] else {}),
            **values.env_pairs("--env", cfg["env"])}


def run(given: Mapping[str, Any], output: str | None = None, err: Callable[[str], None] | None = None,
        session=None) -> int:
    """Submit (sagemaker) or write (mpijob, pytorchjob, ecs) the launch `given` (the flags over the
    job file; defaults() fill the rest): the exit code."""
    from dtrain.launch.jobs import jobfile

    cfg = {**jobfile.defaults(), **given}

    err = err or (lambda line: print(line, file=sys.stderr))
    target = cfg["target"]
    if target not in jobfile.TARGETS:
        raise LaunchError(f"--target {target!r}: expected one of {', '.join(jobfile.TARGETS)}")
    if not cfg["image"]:
        raise LaunchError("--image is required")
    ignored = check_fields(cfg, jobfile.defaults())

    def note() -> None:  # once the launch is checked, before it is submitted or written
        if ignored:
            err(f"[launch] --target {target}: {', '.join(ignored)} ignored (the {target} job's own)")

    count = node_count(cfg)
    if target == "sagemaker":
        return _sagemaker(cfg, given, count, session, note)
    if cfg["instance_type"] is not None and target != "ecs":
        raise LaunchError(f"--instance-type: not for --target {target}; take it out for {target}")
    return _manifest(cfg, given, count, output, note, err)


def _sagemaker(cfg: Mapping[str, Any], given: Mapping[str, Any], count: int | None, session,
               note: Callable[[], None]) -> int:
    import boto3

    from dtrain.launch.jobs import jobfile, launchers, sagemaker as sm

    if cfg["instance_type"] is None:
        raise LaunchError("--instance-type is required with --target sagemaker (e.g. ml.g5.12xlarge)")
    values.instance_type("--instance-type", cfg["instance_type"], sagemaker=True)
    launcher = given.get("launcher")  # default: by the image's family, as `dtrain sagemaker run`
    if launcher is not None:
        values.choice("--launcher", launcher, launchers.names(sagemaker=True))
    if cfg["name"] is not None:
        sm.check_job_name("--name", cfg["name"])
    timeout = jobfile.number("timeout", cfg["timeout"]) if cfg["timeout"] is not None else None
    workdir = Path(cfg["workdir"] or ".")
    if not workdir.is_dir():
        raise LaunchError(f"--workdir {workdir}: not a directory")
    opts = sm.RunOptions(image=cfg["image"], role_arn=cfg["role"] or "", command=tuple(cfg["command"]),
                         instances=count or 1, instance_type=cfg["instance_type"], name=cfg["name"],
                         launcher=launcher, env=env(cfg), workdir=workdir, wait=not cfg["detach"],
                         **({"max_runtime_s": max(1, math.ceil(float(timeout)))} if timeout is not None else {}))
    session = session or boto3.session.Session(region_name=cfg["region"])
    note()
    job, code = sm.run(opts, session=session)
    if cfg["detach"]:
        print(job)
    return code


def _manifest(cfg: Mapping[str, Any], given: Mapping[str, Any], count: int | None, output: str | None,
              note: Callable[[], None], err: Callable[[str], None]) -> int:
    from dtrain.launch.other_tools import manifests as mf

    launcher = given.get("launcher")  # default: by the target
    if cfg["name"] is not None:
        values.name("--name", cfg["name"])
    env_items = [f"{k}={v}" for k, v in env(cfg).items()]
    mf.check_output(output)
    try:
        spec = mf.spec_from_args(
            cfg["target"], cfg["image"], list(cfg["command"]), workers=count or 2, name=cfg["name"] or "dtrain-job",
            env=env_items, launcher=launcher, instance_type=cfg["instance_type"])
        text = mf.render(spec)
    except LaunchError as e:  # `dtrain manifest`'s words: --for is --target here
        raise type(e)(str(e).replace("--for ", "--target ")) from None
    note()
    for line in mf.placeholders(spec):
        err(line)
    print(mf.write(text, output), end="")
    return 0
