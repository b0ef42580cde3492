"""A launch on nodes (`--target nodes`, the default): the nodes its flags name, from their provider
(launch/targets), the one JobSpec of it (launch/jobs/config.py `job_spec`), the Job run there, a
failure diagnosed. Also the node and ssh flags' reading that `pull`, `doctor`, `stop` share."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from typing import Any

from dtrain.launch import targets
from dtrain.launch.errors import LaunchError


def ssh_options(ssh_opt: Any = None, ssh_config: str | None = None, cluster: str | None = None) -> tuple[str, ...]:
    """ssh options from --ssh-config and --ssh-opt, after those `nodes up --ssh-opt` recorded for
    --cluster (a ProxyJump to a bastion): ssh takes the first value of an option, so the cluster's
    win over a repeated one; give the cluster a new one with nodes up."""
    from dtrain import values

    if ssh_config is not None:
        values.ssh_config("--ssh-config", ssh_config)
    recorded: tuple = ()
    if cluster:
        values.name("--cluster", cluster)
        recorded = targets.ssh_opts(targets.NodeArgs(cluster=cluster))  # its provider's record
    return (("-F", ssh_config) if ssh_config else ()) + tuple(recorded) + tuple(
        x for o in (ssh_opt or []) for x in ("-o", o))


def node_list(node: Mapping[str, Any]) -> list:
    """The nodes the node flags name (jobfile.node_fields(); absent or None: not given), from their
    provider (--cluster and --ec2-tag EC2, --hostfile and --hosts plain ssh hosts), each flag
    checked by its parser."""
    from dtrain import values
    from dtrain.launch.jobs.jobfile import number

    region, slots, ssh_user, ssh_key = (node.get(k) for k in ("region", "slots", "ssh_user", "ssh_key"))
    if ssh_user is not None:
        values.user("--ssh-user", ssh_user)
    if region is not None:
        values.region("--region", region)
    if ssh_key is not None:
        values.ssh_key("--ssh-key", ssh_key)
    if slots is not None:
        slots = number("slots", slots)  # the launch's bound (jobfile.NUMBERS)
    args = targets.node_args({**node, "slots": slots})  # the providers' own fields: the model's (jobfile.py)
    return targets.nodes(args, ssh_user=ssh_user, ssh_key=ssh_key)



def run_on_nodes(cfg: Any) -> int:
    """The launch `cfg` on its nodes: the job's exit code (a failure diagnosed on stderr)."""
    from dtrain.launch import up
    from dtrain.launch.jobs import config, jobfile, trust
    from dtrain.launch.jobs.job import Job

    if cfg.up:  # nodes the launch brings up itself, and takes down after
        return up.run(cfg, on_cluster=run_on_nodes)
    with jobfile.located(cfg.where):
        if cfg.cluster:  # an EC2 cluster: its hostfile follows its Auto Scaling group first
            up.follow(cfg.cluster)
        nodes = node_list({k: getattr(cfg, k) for k in jobfile.node_fields()})
        if cfg.count is not None and cfg.count != len(nodes):
            raise LaunchError(f"--count {cfg.count}: the launch names {len(nodes)} node(s)")
        if cfg.slots is not None:  # processes per node, over each host's own
            nodes = [dataclasses.replace(n, slots=cfg.slots) for n in nodes]
        args = targets.NodeArgs(hostfile=cfg.hostfile, hosts=cfg.hosts, ec2_tag=cfg.ec2_tag, cluster=cfg.cluster)
        # AWS_EC2_METADATA_SERVICE_ENDPOINT (botocore's name): another metadata endpoint, which
        # turns the watch on for any nodes (tests: tests/imds.py)
        imds = os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT", "").rstrip("/") or targets.spot_notice(args)
        spec = config.job_spec(cfg, ssh_opts=ssh_options(cfg.ssh_opt, cfg.ssh_config, cfg.cluster), imds=imds,
                               efa_types=targets.efa_types())
        # hosts the job file chose: known or confirmed before anything is sent
        # --spares on nodes that can change while the job runs (an EC2 cluster's group): a node
        # that comes joins as a spare (launch/jobs/joining.py)
        joining = targets.joining(args, ssh_user=cfg.ssh_user, ssh_key=cfg.ssh_key, slots=cfg.slots) \
            if spec.spares else None
        job = Job(spec, nodes, confirm=lambda: trust.check_hosts(nodes, cfg.where, spec.ssh_opts,
                                                                 keys=jobfile.route_keys()), joining=joining)
        code = job.run()
    if code != 0:
        report_failure(job.spec.name, code)
    return code


def report_failure(name: str, code: int) -> None:
    """A failed job's line on stderr and what `dtrain diagnose` finds in its output."""
    from dtrain.launch.jobs.store import job_log, load_job
    from dtrain.launch.troubleshoot import diagnose

    if load_job(name).get("state") == "interrupted":  # Ctrl-C, stop, SIGTERM: nothing to diagnose
        print(f"[launch] job {name} interrupted (exit code {code}); output: dtrain logs --job {name}",
              file=sys.stderr)
        return
    print(f"[launch] job {name} failed with exit code {code}; output: dtrain logs --job {name}", file=sys.stderr)
    print(diagnose.format_report(diagnose.diagnose_file(job_log(name))), file=sys.stderr)

