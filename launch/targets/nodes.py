"""`--target nodes` (the default): dtrain starts the containers on the nodes a provider gives and
runs the job there (launch/jobs/job.py): every launch field applies but SageMaker's own."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from dtrain.launch.errors import LaunchError
from dtrain.launch.targets.base import SAGEMAKER_ONLY, Target


class Nodes(Target):
    name = "nodes"
    on_nodes = True
    refused = ("instance_type",) + SAGEMAKER_ONLY  # the nodes are what they are; SageMaker's own

    def refusal(self, names: list[str]) -> str:
        return (f"{', '.join(names)} {'is' if len(names) == 1 else 'are'} for --target sagemaker (the nodes are "
                "given by --hosts, --hostfile, --cluster, --ec2-tag)")

    def run(self, cfg: Any, given: Mapping[str, Any], count: int | None, *, output: str | None,
            session: Any, note: Callable[[], None], err: Callable[[str], None] = print, force: bool = False) -> int:
        """The launch on its nodes: the job's exit code (a failure diagnosed on stderr)."""
        from dtrain.launch import targets
        from dtrain.launch.jobs import config, jobfile, trust
        from dtrain.launch.jobs.job import Job
        from dtrain.launch.targets.common import node_list, ssh_options

        if output is not None:
            raise LaunchError(f"--output is where --target {'|'.join(targets.names(writes=True))} writes the "
                              "description")
        with jobfile.located(cfg.where):
            nodes = node_list(cfg.hostfile, cfg.hosts, cfg.ec2_tag, cfg.region, cfg.slots, cfg.ssh_user,
                              cfg.ssh_key, cfg.cluster)
            if cfg.count is not None and cfg.count != len(nodes):
                raise LaunchError(f"--count {cfg.count}: the launch names {len(nodes)} node(s)")
            args = targets.NodeArgs(hostfile=cfg.hostfile, hosts=cfg.hosts, ec2_tag=cfg.ec2_tag, cluster=cfg.cluster)
            # AWS_EC2_METADATA_SERVICE_ENDPOINT (botocore's name): another metadata endpoint, which
            # turns the watch on for any nodes (tests: tests/imds.py)
            imds = os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT", "").rstrip("/") or targets.spot_notice(args)
            spec = config.job_spec(cfg, ssh_opts=ssh_options(cfg.ssh_opt, cfg.ssh_config, cfg.cluster), imds=imds,
                                   efa_types=targets.efa_types())
            # hosts the job file chose: known or confirmed before anything is sent
            job = Job(spec, nodes, confirm=lambda: trust.check_hosts(nodes, cfg.where, spec.ssh_opts))
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


TARGET = Nodes()
