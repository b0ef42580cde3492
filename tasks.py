"""dtrain tasks: `dtrain --list`. Each task parses flags and calls one function."""

from __future__ import annotations

import sys

from dtrain.launch.cli_support import (  # noqa: F401  the tasks' shared plumbing (tests read LOCAL_PATHS here)
    task, SECRET_PARAMS, LOCAL_PATHS, NOT_LOCAL_PATHS, user_errors, _one_line, _int_flag,
    _float_flag, _choice_flag, _launcher_names, _image_flag, _family_flag, _env_flags, _flag_name)


@task(help={"image": "one family (horovod-tensorflow, horovod-pytorch, pytorch-ddp); default all",
            "check": "do not write; fail if dockerfiles/ differs from the specs"})
def render(c, image=None, check=False):
    """Validate images/*.yaml against compat.yaml and write dockerfiles/<family>/<tag>/Dockerfile."""
    from dtrain.images import render as r

    with user_errors():
        _family_flag(image)
        families = [image] if image else None
        if check:
            stale = [p for p, text in r.render_all(families).items()
                     if not p.exists() or p.read_text() != text]
            for p in stale:
                print(f"out of date: {p.relative_to(r.ROOT)}", file=sys.stderr)
            if stale:
                sys.exit("error: dockerfiles/ is out of date; run `dtrain render`")
            print("dockerfiles/ matches images/*.yaml")
            return
        changed, removed = r.write_all(families)
        for p in changed:
            print(f"wrote   {p.relative_to(r.ROOT)}")
        for p in removed:
            print(f"removed {p.relative_to(r.ROOT)}")
        print(f"{len(changed)} written, {len(removed)} removed, all others unchanged")


@task(help={
    "image": "one family; default all three",
    "tag": "one variant by tag (see dockerfiles/<family>/)",
    "all": "every variant, GPU ones too (needs the nvidia/cuda bases); default: CPU variants",
    "wheels": "the GPU variants whose CUDA comes from PyPI's wheels (no nvidia/cuda base needed)",
    "base_image": "base for both stages, e.g. a mirrored or imported image (dtrain/debian:bookworm)",
    "builder_image": "base for the builder stage only",
    "ca_bundle": "CA bundle for pip/curl/apt inside the build, as a BuildKit secret "
                 "(default: the host pip's, from PIP_CERT)",
    "pip_conf": "pip.conf for the build (private index), as a BuildKit secret",
    "wheelhouse": "directory of wheels offered to pip first (offline builds)",
    "push_cache": "registry repository to pull and push inline build cache",
    "no_cache": "ignore the layer cache",
    "project": "a project directory: build FROM a family image with its requirements.txt and code "
               "(docs/images.md)",
    "from_": "with --project: FAMILY or FAMILY:TAG to build from (default: `from:` in DIR/dtrain.yaml)",
})
def build(c, image=None, tag=None, all=False, base_image=None, builder_image=None, ca_bundle=None,
          pip_conf=None, wheelhouse=None, push_cache=None, no_cache=False, project=None, from_=None,
          wheels=False):
    """Build images with BuildKit from dockerfiles/ (run `dtrain render` first), or a project image."""
    from pathlib import Path

    from dtrain import engine, values
    from dtrain.images import build as b

    with user_errors():
        _family_flag(image)
        if tag is not None:
            from dtrain.reference import check_tag

            check_tag(tag, "--tag")
        _family_flag(from_, "--from", tag_ok=True)
        for flag, ref in (("--base-image", base_image), ("--builder-image", builder_image)):
            _image_flag(ref, flag)
        if push_cache is not None:
            from dtrain.reference import check_repository

            check_repository(push_cache, "--push-cache")
        if project or from_:
            from dtrain.images import project as pj

            if not project:
                raise b.BuildError("--from goes with --project DIR")
            opts = b.BuildOptions(ca_bundle=Path(ca_bundle) if ca_bundle else b.default_ca_bundle(),
                                  pip_conf=Path(pip_conf) if pip_conf else None, no_cache=no_cache,
                                  wheelhouse=Path(wheelhouse) if wheelhouse else None)
            checked = pj.check(Path(project), from_, opts)  # every flag before the engine starts
            engine.ensure_dockerd()
            pj.build(Path(project), from_, opts, checked=checked)
            return
        opts = b.BuildOptions(
            base_image=base_image, builder_image=builder_image,
            ca_bundle=Path(ca_bundle) if ca_bundle else b.default_ca_bundle(),
            pip_conf=Path(pip_conf) if pip_conf else None,
            wheelhouse=Path(wheelhouse) if wheelhouse else None,
            push_cache=push_cache, no_cache=no_cache)
        b.check([image] if image else None, tag, all, opts, wheels=wheels)  # every flag before the engine starts
        engine.ensure_dockerd()
        b.build([image] if image else None, tag, all, opts, wheels=wheels)


@task(help={
    "ecr": "push to Amazon ECR (repositories created with scan-on-push)",
    "registry": "push to this v2 registry HOST[:PORT]",
    "image": "FAMILY or FAMILY:TAG; default every built image",
    "account": "ECR registry account id (default: the caller's)",
    "region": "AWS region", "profile": "AWS profile",
    "repo_prefix": "repository prefix (default dtrain)",
    "immutable": "ECR: immutable tags", "lifecycle_policy": "ECR lifecycle policy JSON file",
    "user": "registry user", "password": "'-': the registry password from stdin (default $DTRAIN_REGISTRY_PASSWORD); a value is refused",
    "catalog": "catalog path (default build/catalog.json)",
    "soci": "insist on each image's SOCI index beside it (lazy loading): by default it is made where it can be "
            "(root, soci, a registry with TLS), else one line says why",
    "no_soci": "push no SOCI index", "soci_bin": "directory with soci, ctr, containerd (default $DTRAIN_SOCI_BIN, then PATH)",
    "containerd_socket": "the machine's containerd socket for the SOCI index (default: a private containerd, as root)",
})
def push(c, ecr=False, registry=None, image=None, account=None, region=None, profile=None,
         repo_prefix="dtrain", immutable=False, lifecycle_policy=None, user=None, password=None,
         catalog=None, soci=False, no_soci=False, soci_bin=None, containerd_socket=None):
    """Push built images to ECR or a registry, verify the digest by pulling it back, record it in the catalog."""
    from pathlib import Path

    from dtrain.images import push as p

    import re

    from dtrain import values

    with user_errors():
        _family_flag(image, tag_ok=True)
        if registry is not None:
            from dtrain.reference import check_registry

            check_registry(registry, "--registry")
        from dtrain.reference import check_path

        check_path(repo_prefix, "--repo-prefix")
        if account is not None and not re.fullmatch(r"[0-9]{12}", account, re.ASCII):
            raise values.BadValue(f"--account {values.shown(account)}: expected a 12-digit AWS account id")
        password = p.password_from_flag(password)  # never a value in argv: '-' (stdin) or the env
        if ecr == bool(registry):
            raise p.PushError("pass exactly one of --ecr or --registry HOST[:PORT]")
        from dtrain.images import soci as s

        from dtrain.launch.infra import cluster as cl

        lazy = s.from_flags(soci, no_soci, soci_bin, containerd_socket, registry,  # issue 52: by default
                            cluster=(cl.REGISTRY, cl.STATE_DIR / "registry" / "ca-bundle.pem"))
        images, notes = p.select_images(image)
        for n in notes:
            print(n)
        path = Path(catalog) if catalog else p.CATALOG
        if ecr:
            p.push_ecr(images, profile=profile, region=region, account=account, prefix=repo_prefix,
                       immutable=immutable, lifecycle_policy=lifecycle_policy, catalog_path=path, soci=lazy)
        else:
            p.push_registry(images, registry, user=user, password=password, prefix=repo_prefix,
                            catalog_path=path, soci=lazy)


@task(help={"k": "only tests matching this pytest -k expression",
            "unit": "only the tests that need neither Docker nor the simulated cluster",
            "serial": "every test in one process, one after another (slower: the unit tests no longer run beside "
                      "the cluster tests)"})
def test(c, k=None, unit=False, serial=False):
    """Run the tests; installs and starts what they need (root, Linux).

    Debian packages, the Docker engine, the debootstrapped base image. The unit tests run beside
    the cluster tests, at a lower priority (dtrain/suite.py); the slowest of each are listed."""
    from dtrain import ROOT, suite

    if not unit:
        from dtrain import engine

        with user_errors():
            engine.ensure_all()
    sys.exit(suite.run(k, unit, serial, cwd=ROOT))  # dtrain's own tests, from any directory


# ---------------------------------------------------------------- running jobs

from dtrain.launch.jobs import jobfile as _jobfile  # noqa: E402  the launch flags' help: the job file's model
from dtrain.launch.jobs import config as _config  # noqa: E402  the switches' opposites

LAUNCH_HELP = _jobfile.help_texts()
NODE_HELP = {k: LAUNCH_HELP[k] for k in ("cluster", "hostfile", "hosts", "ec2_tag", "region", "slots", "ssh_user",
                                         "ssh_key", "ssh_opt", "ssh_config")}
# `dtrain launch` flags that are not fields of a launch (JobFile): which file, what to do with it.
LAUNCH_TASK_ONLY_HELP = {
    "f": "a job file (YAML, the flags below by name: docs/launch.md#a-job-file); flags given here override it",
    "file": "the same as -f",
    "dump": "print the job file these flags (and -f) mean, and exit, whatever the --target (a description: "
            "--output, or stdout without --dump)",
    "output": "--target mpijob|pytorchjob|ecs|trainjob|jobset: write the description to this file instead of stdout",
    "force": "with --output: replace the file there even where dtrain did not write it",
}


def _nodes(hostfile, hosts, ec2_tag, region, slots, ssh_user, ssh_key, cluster=None):
    from dtrain.launch.launching import node_list

    return node_list(hostfile, hosts, ec2_tag, region, slots, ssh_user, ssh_key, cluster)


def _ssh_opts(ssh_opt, ssh_config=None, cluster=None):
    from dtrain.launch.launching import ssh_options

    return ssh_options(ssh_opt, ssh_config, cluster)


def _launch_signature(body):
    """The launch task's flags are the model's fields (Invoke reads the signature): one flag per
    JobFile field, list fields repeatable, booleans switches; then the task's own."""
    import inspect

    fields = [k for k in _jobfile.JobFile.model_fields if k != "command"]
    params = [inspect.Parameter(k, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=False if k in _FLAG_BOOLS else None)
              for k in ["c", *LAUNCH_TASK_ONLY_HELP, *fields, *_SWITCH_OFF]]
    params[0] = inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    body.__signature__ = inspect.Signature(params)
    return body


# each switch's opposite (--no-check-network over a file's `check_network: true`: launch/jobs/config.py)
_SWITCH_OFF = {_config.opposite(k): f"turns off {_config.flag(k)} (over a job file's `{k}: true`)" for k in _config.SWITCHES}
_FLAG_BOOLS = {k for k, f in _jobfile.JobFile.model_fields.items() if "bool" in str(f.annotation)} | {"dump", "force",
                                                                                                         *_SWITCH_OFF}
_FLAG_LISTS = [k for k, f in _jobfile.JobFile.model_fields.items()
               if ("list" in str(f.annotation) or "dict" in str(f.annotation)) and k != "command"]  # env: K=V items


@task(iterable=_FLAG_LISTS, help={**LAUNCH_HELP, **LAUNCH_TASK_ONLY_HELP, **_SWITCH_OFF})
@_launch_signature
def launch(c, f=None, file=None, dump=False, output=None, force=False, **flags):
    """Start host-network containers on every node and run the job: dtrain launch ... -- CMD ... (or -f job.yaml)"""
    with user_errors():
        from dtrain.launch import jobtarget
        from dtrain.launch.jobs import config

        if f and file and f != file:
            raise config.LaunchError(f"-f {f} and --file {file}: give one job file")
        _force_flag(force, output)
        cfg = config.build(config.switches({**flags, "command": _remainder() or None}), f or file)
        if dump:  # the job file, on every target (the description: without --dump)
            if output is not None:
                raise config.LaunchError(f"--output {output}: where a description goes; --dump prints the job "
                                         "file on stdout (> FILE to save it)")
            print(config.dump(cfg), end="")
            return
        sys.exit(jobtarget.run(cfg, output=output, force=force))


@task(iterable=["ssh_opt"], help={
    **NODE_HELP,
    "image": "image reference to bring onto every node",
    "pull": "always (default: unless the node holds the registry's digest; one manifest request) "
            "or missing (only where no image of that name is)",
})
def pull(c, image=None, cluster=None, hostfile=None, hosts=None, ec2_tag=None, region=None, slots=None, ssh_user=None,
         ssh_key=None, ssh_opt=None, ssh_config=None, pull=None):
    """Pre-stage an image on nodes ahead of a launch, with per-node progress: dtrain pull --hosts h1,h2 --image REF"""
    from dtrain.launch.errors import LaunchError
    from dtrain.launch import targets
    from dtrain.launch.jobs import pull as pl

    with user_errors():
        if not image:
            raise LaunchError("--image is required (e.g. --image 10.213.0.1:5000/dtrain/pytorch-ddp:TAG)")
        _image_flag(image)
        pull = _choice_flag("--pull", pull or _jobfile.launch_default("pull"), pl.POLICIES)
        nodes = _nodes(hostfile, hosts, ec2_tag, region, slots, ssh_user, ssh_key, cluster)
        provider = targets.choose(targets.NodeArgs(hostfile=hostfile, hosts=hosts, ec2_tag=ec2_tag, cluster=cluster))
        login = provider.login(image)  # ECR: a token from boto3, to each node on stdin
        pl.pull_on_nodes(nodes, image, pull, ssh_opts=_ssh_opts(ssh_opt, ssh_config, cluster), out=sys.stdout, login=login)


def _force_flag(force, output) -> None:
    """--force is for --output (what it may replace)."""
    if force and output is None:
        from dtrain import values

        raise values.BadValue("--force: replaces the --output file; give --output FILE, or leave --force out")


def _remainder():
    argv = sys.argv
    return argv[argv.index("--") + 1:] if "--" in argv else []


@task(help={"job": "a job's name: its row, and the timeline of its launch and restarts (seconds per node and phase)"})
def status(c, job=None):
    """Recent jobs and their state; with --job JOB: that job and its timeline."""
    from dtrain.launch.jobs.store import job_timeline, status_rows

    from dtrain.table import text

    with user_errors():
        if job is not None:
            from dtrain import values

            values.name("--job", job)
        print(text(status_rows(name=job)))
        if job is not None:
            print()
            print(job_timeline(job))


@task(help={"job": "job name or `latest` (default: the latest)",
            "output": "the HTML file to write (default: JOB-report.html in this directory)",
            "force": "replace the file there even where dtrain did not write it"})
def report(c, job=None, output=None, force=False):
    """Write a job's run as one self-contained HTML file.

    Phases per node, restarts and why, step times per rank, the network gate, hangs with their
    stacks, the events. --job latest (or none): the latest job."""
    from pathlib import Path

    from dtrain import values
    from dtrain.launch.analysis import report as rep

    with user_errors():
        if job is not None:
            values.name("--job", job)
        run = rep.load(None if job == "latest" else job)
        print(rep.write(run, Path(output) if output else rep.default_output(run.name), force))


@task(help={"job": "job name (default: the latest)",
            "follow": "keep printing while it runs (a detached job: from its first node, until it ends)"})
def logs(c, job=None, follow=False):
    """Print a job's output (every line prefixed with node and rank)."""
    from dtrain.launch.jobs.store import follow as follow_log, job_log, load_job, node_logs, read_log
    from dtrain.terminal import clean

    with user_errors():
        if job is not None:
            from dtrain import values

            values.name("--job", job)
        j = load_job(job)
        path = job_log(j["name"])
        if j.get("detached"):  # the launch's lines, then the job's, from its first node
            print(clean(read_log(path), colour=True, lines=True), end="", flush=True)
            sys.exit(node_logs(j, bool(follow)))
        if follow:
            follow_log(path, j)
        else:
            print(clean(read_log(path), colour=True, lines=True), end="")


@task(iterable=["ssh_opt"], help={"job": "job name (default: the latest)", "ssh_opt": NODE_HELP["ssh_opt"],
                                  "ssh_config": NODE_HELP["ssh_config"]})
def stop(c, job=None, ssh_opt=None, ssh_config=None):
    """Stop a job: its launcher tears down, and no container of it is left on any node."""
    from dtrain.launch.jobs.store import load_job, stop as stop_job, stop_line

    with user_errors():
        before = None
        if job is not None:
            from dtrain import values

            values.name("--job", job)
            before = load_job(job).get("state")
        print(stop_line(stop_job(job, _ssh_opts(ssh_opt, ssh_config)), before))


# ---------------------------------------------------------------- reaching a cluster's nodes (launch/clusters.py)


@task(iterable=["ssh_opt"], help={
    "cluster": "the cluster: a `nodes up --name` name, or local (the simulated cluster)",
    "node": "its index 1..N, or its host (default: the first)",
    "config": "print an ssh config block instead: Host dtrain-NAME-1 ... one per node",
    "write": "with --config: write the block to DTRAIN_HOME/ssh/NAME.config and print the Include line",
    "force": "with --write: replace a file there dtrain did not write",
    "ssh_opt": "ssh -o option for this login (repeatable), e.g. LocalForward=8265 localhost:8265"})
def nodes_ssh(c, cluster=None, node=None, config=False, write=False, force=False, ssh_opt=None):
    """ssh into a cluster's node: dtrain nodes ssh NAME [NODE] [-- CMD]; its ssh config: dtrain nodes ssh-config NAME [--write]."""
    import os

    from dtrain import values
    from dtrain.launch import clusters

    with user_errors():
        if not cluster:
            raise values.BadValue("nodes ssh: name the cluster: dtrain nodes ssh NAME [NODE] "
                                  f"(known: {', '.join(clusters.known()) or 'none'})")
        if (write or force) and not config:
            raise values.BadValue("--write and --force are for the ssh config: dtrain nodes ssh-config NAME --write")
        if config:
            for given, flag in ((node, "--node"), (ssh_opt, "--ssh-opt"), (_remainder(), "a command after --")):
                if given:
                    raise values.BadValue(f"{flag}: is for `nodes ssh`; `nodes ssh-config NAME` takes the "
                                          "cluster's name only (its block names every node)")
            if write:
                path = clusters.write_config(cluster, force=force)
                print(f"wrote {path}; add this line once, at the top of ~/.ssh/config: {clusters.include_line()}")
            else:
                print(clusters.config_text(cluster), end="")
            return
        argv = clusters.login_argv(cluster, node, _remainder(), ssh_opt)
        sys.stdout.flush()
        try:
            os.execvp(argv[0], argv)  # the terminal is ssh's now
        except OSError as e:
            raise values.BadValue(f"cannot run ssh: {e.strerror or e}") from None


@task(name="exec", iterable=["ssh_opt"], help={
    "cluster": "the cluster: a `nodes up --name` name, or local (the simulated cluster)",
    "container": "run the command inside the job's container on each node (docker exec)",
    "job": "with --container: the job whose container (default: the one running on each node)",
    "timeout": "seconds the command may run on each node (default: no limit)",
    "ssh_opt": NODE_HELP["ssh_opt"]})
def exec_(c, cluster=None, container=False, job=None, timeout=None, ssh_opt=None):
    """Run a command on every node of a cluster at once, lines tagged [node-I]: dtrain exec --cluster NAME -- CMD ARGS..."""
    from dtrain import values
    from dtrain.launch import clusters

    with user_errors():
        if not cluster:
            raise values.BadValue("exec: --cluster NAME is required "
                                  f"(known: {', '.join(clusters.known()) or 'none'})")
        seconds = values.number("--timeout", timeout, 0, hi=86400 * 7) if timeout is not None else None
        code, _, failed = clusters.exec_on(cluster, _remainder(), container=container, job=job, timeout=seconds,
                                           ssh_opt=ssh_opt, line=lambda text: print(text, flush=True))
    if code:
        print(f"error: {failed}", file=sys.stderr)
        sys.exit(code)


# ---------------------------------------------------------------- EC2 nodes and a dataset volume


def _aws(profile, region):
    import boto3

    return boto3.Session(profile_name=profile, region_name=region)


@task(iterable=["ssh_opt", "s3_bucket"], help={
    "action": "up, down, list or sync (the hostfile follows the Auto Scaling group: a replaced node joins)",
    "all_regions": "with list: every region of the account (DescribeRegions), not only those dtrain has used here",
    "name": "cluster name (stack dtrain-NAME; instances tagged dtrain:cluster=NAME)",
    "count": "instances wanted", "min_count": "go on with this many if fewer start (default: --count)",
    "instance_type": "EC2 instance type, e.g. p4d.24xlarge", "spot": "spot instances (launch template)",
    "subnet": "subnet for the nodes (default: the default VPC's subnet in a zone that offers the type)",
    "new_vpc": "make a VPC in the stack",
    "key_name": "EC2 key pair for ssh", "ssh_key": "its private key file here (written into the hostfile)",
    "ssh_cidr": "who may ssh in (default: this machine's security group inside the VPC, else its public address /32)",
    "efs": "an EFS file system (kept by `nodes down`; mounted at boot at /efs, $EFS_MOUNT)",
    "lazy": "nodes load images lazily (SOCI snapshotter from the node's apt, Docker on the containerd store; the "
            "default, --no-lazy: classic); images `dtrain push` indexed",
    "address": "hostfile addresses: auto (default: private from inside the nodes' VPC, else public), private or public",
    "efa_interfaces": "EFA interfaces per node (default: every one the type has, e.g. 4 on p4d.24xlarge)",
    "ssh_opt": NODE_HELP["ssh_opt"] + "; kept for `--cluster NAME`, e.g. ProxyJump=bastion",
    "region": "AWS region (down: default the cluster's, from its record or the regions dtrain has used)",
    "profile": "AWS profile",
    "timeout": "seconds to wait for capacity, and again for ssh + docker (default 900)",
    "keep_on_failure": "keep the stack when up fails (default: delete it)",
    "ssh_user": "ssh user on the nodes (default: the AMI's: ubuntu, ec2-user)",
    "ami": "gpu (Deep Learning AMI), cpu (ECS-optimized AL2023), ami-ID or an SSM parameter path "
           "(default: gpu on GPU types, else cpu)",
    "root_size": "root disk GiB (default: the AMI's + 3 x the largest image + 100)",
    "s3_bucket": "a bucket the nodes' role may read (repeatable; s3://NAME accepted)",
    "s3_write": "the role may also write to the --s3-bucket buckets (checkpoints)",
    "instance_profile": "an existing instance profile instead of the stack's role, or none",
    "delete_data": "with down: delete the cluster's dataset volumes and EFS too (default: kept)",
    "yes": "with up: go on without asking, whatever the price per hour",
    "confirm_above": "with up: ask before renting above this many USD per hour (default $DTRAIN_CONFIRM_ABOVE, else 10); "
                     "without a terminal, refuse unless --yes",
    "hours": "with up: also show the price for this many hours",
    "idle_down": "with up: the nodes delete their own stack once no dtrain job has run for this many minutes "
                 "(data kept; the role may delete that stack and nothing else)",
})
def nodes(c, action, name=None, count=None, min_count=None, instance_type=None, spot=False, subnet=None,
          new_vpc=False, key_name=None, ssh_key=None, ssh_cidr=None, efs=False, lazy=True, address="auto", ssh_opt=None,
          region=None, profile=None, timeout="900", efa_interfaces=None, keep_on_failure=False, ssh_user=None,
          ami="auto", root_size=None, s3_bucket=None, s3_write=False, instance_profile=None, delete_data=False,
          all_regions=False, yes=False, confirm_above=None, hours=None, idle_down=None):
    """EC2 nodes from one CloudFormation stack: dtrain nodes up --name C --count 4 --instance-type T | down | list."""
    from dtrain.launch.errors import LaunchError
    from dtrain.launch.infra import ec2

    from dtrain import values

    with user_errors():
        _choice_flag("action", action, ("up", "down", "list", "sync"))
        if name is not None:
            values.name("--name", name)
        count = values.count("--count", count, 1, 10000) if count is not None else None
        min_count = values.count("--min-count", min_count, 1, 10000) if min_count is not None else None
        seconds = values.number("--timeout", timeout, 0, hi=86400)
        ssh_cidr = values.cidr("--ssh-cidr", ssh_cidr) if ssh_cidr is not None else None
        _choice_flag("--address", address, ("auto", "private", "public"))
        if instance_type is not None:
            values.instance_type("--instance-type", instance_type)
        if ssh_user is not None:
            values.user("--ssh-user", ssh_user)
        if ssh_key is not None:
            values.ssh_key("--ssh-key", ssh_key)
        from dtrain.launch.infra import fleet, pricing

        above = pricing.threshold(confirm_above) if action == "up" else 0.0
        hours = values.number("--hours", hours, 0) if hours is not None else None
        idle_down = values.count("--idle-down", idle_down, 1, ec2.IDLE_DOWN_MAX_MINUTES) if idle_down is not None else None
        if action == "list":
            for line in fleet.list_lines(lambda r: _aws(profile, r), region, all_regions):
                print(line)
            return
        if not name:
            raise LaunchError(f"nodes {action}: --name is required")
        if action == "down":
            if fleet.down_named(lambda r: _aws(profile, r), region, name, delete_data):
                sys.exit(1)  # something stays billed: said, line by line
            return
        if action == "sync":
            _nodes_sync(name, profile, region, ssh_opt)
            return
        session = _aws(profile, region)
        if not count or not instance_type:
            raise LaunchError("nodes up: --count and --instance-type are required")
        buckets = tuple(b.removeprefix("s3://").rstrip("/") for b in (s3_bucket or []))
        spec = ec2.NodesSpec(name=name, count=count, instance_type=instance_type, ssh_cidr=ssh_cidr,
                             min_count=min_count, spot=spot, subnet=subnet,
                             new_vpc=new_vpc, key_name=key_name, efs=efs, lazy=lazy,
                             efa_interfaces=_int_flag("--efa-interfaces", efa_interfaces, 1, 64)
                             if efa_interfaces is not None else None,
                             ssh_user=ssh_user, ami=ami,
                             root_size=_int_flag("--root-size", root_size, 8, 16384) if root_size is not None else None,
                             s3_buckets=buckets, s3_write=s3_write, instance_profile=instance_profile,
                             idle_down=idle_down)
        ssh_opts = _ssh_opts(ssh_opt)
        gate = pricing.nodes_up_gate(session, instance_type=instance_type, count=count, spot=spot, above=above,
                                     yes=yes, hours=hours)
        res = ec2.start(session, spec, address=address, here=ec2.vantage, confirm=gate)
        hint = (f"the security group lets ssh in from {res.ssh_rule} only; check that this machine's ssh "
                f"comes from there and can route to the nodes' {res.address} addresses")
        ready = ec2.ssh_ready(ssh_key, res.address, ssh_opts, timeout=seconds, user=res.ssh_user,
                              first_timeout=min(300.0, seconds), hint=hint)
        cluster, hostfile = ec2.finish(session, spec, res, identity=ssh_key, timeout=seconds, ready=ready,
                                       keep_on_failure=keep_on_failure, ssh_opts=ssh_opts)
        print(f"{len(cluster.instances)} nodes up ({res.address} addresses, user {res.ssh_user}); hostfile: {hostfile}")
        from dtrain.launch.infra import volume as vol
        from dtrain.launch.remote.hosts import parse_hostfile

        up_nodes = parse_hostfile(hostfile)
        ec2.write_worker_list(up_nodes, cluster, ssh_opts)
        print(f"worker list on every node: ~/.dtrain/{ec2.WORKER_LIST} (private addresses, one per line)")
        vol.reattach(session, cluster, up_nodes, ssh_opts=ssh_opts)
        print(f"launch with: dtrain launch --cluster {name} --image IMAGE -- CMD")


def _nodes_sync(name, profile, region, ssh_opt):
    """`nodes sync --name C`: the record and hostfile follow the group (ec2.follow_group), then the
    worker list on every node, as `nodes up` writes it."""
    from dtrain.launch.infra import ec2, regions
    from dtrain.launch.remote.hosts import parse_hostfile

    record = ec2.load_cluster(name)
    cluster, hostfile, changed = ec2.follow_group(_aws(profile, region or record.region or regions.default_region()),
                                                  name)
    if changed:
        ec2.write_worker_list(parse_hostfile(hostfile), cluster, _ssh_opts(ssh_opt, cluster=name))
        print(f"{len(cluster.instances)} nodes; hostfile: {hostfile}; worker list rewritten on every node")


@task(help={"refresh": "write both snapshots again from AWS with your credentials: DescribeInstanceTypes (the "
                       "region's) and the Pricing API (us-east-1, us-west-2, eu-west-1)",
            "region": "AWS region (prices shown for it; default us-east-1)", "profile": "AWS profile"})
def instance_types(c, refresh=False, region=None, profile=None):
    """EC2's data on the types dtrain knows (GPUs, EFA, vCPUs, memory, spot, price): dtrain instance-types [--refresh]."""
    from dtrain.launch.infra import pricing

    with user_errors():
        if refresh:
            pricing.refresh_all(_aws(profile, region))
            return
        print("\n".join(pricing.type_table(region or "us-east-1")))


@task(iterable=["ssh_opt"], help={
    "action": "create",
    "cluster": "a cluster made by `dtrain nodes up`",
    "size": "GiB (io2, 4 to 16384)", "from_snapshot": "snapshot id to make the volume from",
    "iops": "provisioned IOPS (default 3000)", "path": "mount path on every node (default /data)",
    "fill_from": "a directory on the first node copied onto a new volume before it goes read-only",
    "efs": "mount the cluster's EFS (nodes up --efs) read-write instead",
    "ssh_opt": NODE_HELP["ssh_opt"], "ssh_config": NODE_HELP["ssh_config"], "profile": "AWS profile",
})
def volume(c, action, cluster=None, size=None, from_snapshot=None, iops="3000", path="/data", fill_from=None,
           efs=False, ssh_opt=None, ssh_config=None, profile=None):
    """A dataset volume on every node of a cluster: io2 Multi-Attach, read-only (or EFS, read-write)."""
    from dtrain.launch.errors import LaunchError
    from dtrain.launch.infra import ec2, volume as vol

    with user_errors():
        if action != "create":
            raise LaunchError(f"unknown action {action!r}: use create")
        if not cluster:
            raise LaunchError("volume create: --cluster is required")
        from dtrain import values

        values.name("--cluster", cluster)
        ssh_opts = _ssh_opts(ssh_opt, ssh_config, cluster)
        spec = vol.VolumeSpec(cluster=cluster, size_gb=_int_flag("--size", size, 4, 16384) if size is not None else None,
                              snapshot=from_snapshot, iops=_int_flag("--iops", iops, 100, 256000), mount_path=path,
                              efs=efs, fill_from=fill_from)
        info = _cluster_record(cluster, profile)
        nodes = _nodes(None, None, None, None, None, None, None, cluster)
        made = vol.create(_aws(profile, info.region), info, nodes, spec, ssh_opts=ssh_opts)
        mode = "read-write" if efs else "read-only"
        print(f"{made} mounted {mode} on {len(nodes)} nodes at {path}; "
              f"use it with: dtrain launch --cluster {cluster} --mount {path}:ro ...")


def _cluster_record(cluster, profile):
    """The cluster `nodes up` wrote here; where there is none, what its stack's state says
    (kept by --keep-on-failure, still being made, or none at all), asked read-only in the
    regions dtrain has used."""
    from dtrain.launch.errors import LaunchError
    from dtrain.launch.infra import ec2, fleet

    try:
        return ec2.load_cluster(cluster)
    except LaunchError as missing:
        raise (fleet.standing_stack(cluster, profile) or missing) from None


# ---------------------------------------------------------------- local simulated cluster


@task(iterable=["nic", "link_rate", "shared"], help={"action": "up, down or status", "nodes": "number of nodes for `up` (default 2)",
            "recreate": "with up: replace a cluster of another size",
            "link_rate": "with up: limit each node's link both ways, e.g. 1gbit; INDEX=RATE for one node, "
                         "e.g. 1gbit,3=100mbit (repeatable; default: no limit)",
            "nic": "with up: INDEX=NAME names node INDEX's NIC (default ens5), e.g. 2=eth0 (repeatable)",
            "shared": "with up: HOST_DIR:PATH mounts this machine's HOST_DIR at PATH (an existing directory "
                      "here) on every node, one directory for all, as EFS or NFS (repeatable); a job's "
                      "--mount PATH then shares it, e.g. Ray Train's storage",
            "lazy": "with up: insist on lazy nodes (SOCI snapshotter, Docker 26 on the containerd store; the registry "
                    "gets TLS): the default where the host can, else one line says why",
            "no_lazy": "with up: classic nodes (full pulls), plain-HTTP registry",
            "lazy_root": "with up: where Debian 13's soci-snapshotter, containerd, docker.io are unpacked "
                         "(default $DTRAIN_LAZY_ROOT, then /var/tmp/dtrain-lazy/root)"})
def cluster(c, action, nodes="2", recreate=False, nic=None, link_rate=None, lazy=False, lazy_root=None,
            shared=None, no_lazy=False):
    """Local simulated cluster (root, Linux): dtrain cluster up --nodes 3 | down | status."""
    from dtrain.launch import targets
    from dtrain.launch.infra import cluster as cl

    with user_errors():
        _choice_flag("action", action, ("up", "down", "status"))
        count = _int_flag("--nodes", nodes, 1, cl.MAX_NODES)
        from dtrain import values

        every, per_node = values.link_rates("--link-rate", link_rate, count)
        mode = cl.lazy_mode(action, lazy, no_lazy, lazy_root, recreate)  # issue 52: lazy by default
        if action == "up":
            names = {}
            for kv in nic or []:
                i, sep, name = kv.partition("=")
                if not sep or not i.isdigit():
                    raise cl.ClusterError(f"--nic {kv}: expected INDEX=NAME, e.g. 2=eth0")
                names[int(i)] = name
            local = targets.provider("local")  # launch/targets/local.py: launch/infra/cluster.py's up
            info = local.up(count, recreate=recreate, nic_names=names, link_rate=every, node_link_rates=per_node,
                            lazy=mode, shared=cl.parse_shared("--shared", shared))
            print(f"hostfile:   {info.hostfile}\nssh config: {info.ssh_config}\nregistry:   {info.registry}")
            for path, src in info.shared:
                print(f"shared:     {src} at {path} on every node (a job shares it with --mount {path})")
            if info.lazy:
                print(f"lazy:       nodes load SOCI-indexed images lazily; the registry speaks TLS "
                      f"({info.registry_ca}): dtrain push --registry {info.registry} adds the index")
            print(f"launch with: dtrain launch --hostfile {info.hostfile} --ssh-config {info.ssh_config} "
                  f"--image {info.registry}/dtrain/FAMILY:TAG -- CMD")
        elif action == "down":
            targets.provider("local").down()
        elif action == "status":
            st = cl.status()
            print("up" if st.up else "down", f"({st.nodes} nodes)")
            for problem in st.problems + st.leftovers:
                print(f"  {problem}")
        else:
            raise cl.ClusterError(f"unknown action {action!r}: use up, down or status")


@task(help={"nodes": "nodes in the simulated cluster (default 2)", "keep": "leave the cluster up",
            "epochs": "training epochs (default 3)"})
def demo(c, nodes="2", keep=False, epochs="3"):
    """The main job end to end: build the CPU Horovod image, simulated cluster, real training, teardown."""
    from dtrain.launch import demo as d

    with user_errors():
        sys.exit(d.run(_int_flag("--nodes", nodes, 1, 64), keep, _int_flag("--epochs", epochs, 1)))


# ---------------------------------------------------------------- troubleshooting


NETWORK_HELP = {
    "image": "the job's image: the sweep runs inside it",
    "gpu": "GPU image: nccl-tests all_reduce_perf, one GPU per slot (default: CPU, allreduce_bw.py)",
    "launcher": "mpirun, horovodrun or torchrun (default: torchrun for pytorch-ddp on CPU, else mpirun)",
    "max_bytes": "largest message in bytes (default 1 GiB; smaller keeps a slow network's run short)",
    "iters": "timed allreduces per size (default 5)",
    "instance_type": "EC2 instance type to compare with (default: instance metadata, IMDSv2)",
    "env": "K=V for every rank (repeatable), e.g. NCCL_NSOCKS_PERTHREAD=4",
    "iface": "network interface (default: the NIC of each node's address)",
    "tcp_streams": "TCP connections per node pair for the raw throughput figure (default 1)",
}


def _bandwidth_flags(launcher, max_bytes, iters, env, tcp_streams, iface) -> None:
    """The sweep's flags, checked before any node is reached."""
    if launcher is not None:
        _choice_flag("--launcher", launcher, _launcher_names(supervised=True))
    _int_flag("--max-bytes", max_bytes, 8, 1 << 40)
    _int_flag("--iters", iters, 1, 100000)
    _int_flag("--tcp-streams", tcp_streams, 1, 64)
    _env_flags(env)
    if iface is not None:
        from dtrain import values

        values.name("--iface", iface, 15)


def _bandwidth(image, gpu, launcher, max_bytes, iters, instance_type, env, iface, tcp_streams, nodes, ssh_opts):
    from dtrain.launch.errors import LaunchError
    from dtrain.launch.troubleshoot import network

    if not image:
        raise LaunchError("--image is required: the sweep runs inside the job's image")
    _image_flag(image)
    envs = _env_flags(env)
    result = network.bandwidth(nodes, image=image, gpu=bool(gpu), launcher=launcher,
                               max_bytes=_int_flag("--max-bytes", max_bytes, 8, 1 << 40), iters=_int_flag("--iters", iters, 1),
                               instance_type=instance_type, env=envs, iface=iface,
                               tcp_streams=_int_flag("--tcp-streams", tcp_streams, 1, 64), ssh_opts=ssh_opts)
    print(network.report(result))
    if result.exit_code != 0:
        raise LaunchError(f"the sweep job failed with exit code {result.exit_code}; output: dtrain logs")
    return result


def _gate(image, iface, instance_type, nodes, ssh_opts) -> int:
    """doctor --bandwidth --quick: the network gate's table; 1 where a node FAILs."""
    from dtrain.launch.errors import LaunchError
    from dtrain.launch.troubleshoot import network

    if not image:
        raise LaunchError("--image is required: the network gate runs inside the job's image")
    r = network.quick(nodes, image=image, iface=iface, ssh_opts=ssh_opts, instance_type=instance_type)
    print("\n".join(r.table()))
    print(r.summary())
    if r.culprits:
        print(r.failure())
    return 1 if r.culprits else 0


@task(iterable=["ssh_opt", "env"], help={
    **NODE_HELP,
    "image": "image to check with (digest on every node, and the in-container checks)",
    "iface": "network interface to check (default: the NIC of each node's address)",
    "shm_size": "as `dtrain launch --shm-size` (default --ipc host)",
    "min_free_gb": "free GiB wanted on Docker's data root besides the image (default 10)",
    "job": "a running job whose container may hold port 2022",
    "bandwidth": "run the allreduce bandwidth sweep instead (as `dtrain bench-network`; needs --image)",
    "quick": "with --bandwidth: the launch's network gate instead of the sweep (seconds; names a node whose "
             "link is well below its peers'): PASS/WARN/FAIL per node",
    **{k: v for k, v in NETWORK_HELP.items() if k not in ("image", "iface")},
})
def doctor(c, cluster=None, hostfile=None, hosts=None, ec2_tag=None, region=None, slots=None, ssh_user=None,
           ssh_key=None, ssh_opt=None, ssh_config=None, image=None, iface=None, shm_size=None,
           min_free_gb="10", job=None, bandwidth=False, gpu=False, launcher=None, max_bytes="1073741824",
           iters="5", instance_type=None, env=None, tcp_streams="1", quick=False):
    """Check every node in parallel against the troubleshooting checklist; non-zero exit on any FAIL."""
    from dtrain.launch.troubleshoot import doctor as dr

    from dtrain import values

    with user_errors():
        _image_flag(image)
        free = _float_flag("--min-free-gb", min_free_gb, 0, or_equal=True)
        _bandwidth_flags(launcher, max_bytes, iters, env, tcp_streams, iface)
        if shm_size is not None:
            shm_size = values.docker_size("--shm-size", shm_size, "16g")
        if job is not None:
            values.name("--job", job)
        if quick and not bandwidth:
            raise values.BadValue("--quick goes with --bandwidth: dtrain doctor --bandwidth --quick --image REF")
        if instance_type is not None:
            values.instance_type("--instance-type", instance_type)
        nodes = _nodes(hostfile, hosts, ec2_tag, region, slots, ssh_user, ssh_key, cluster)
        if bandwidth and quick:
            sys.exit(_gate(image, iface, instance_type, nodes, _ssh_opts(ssh_opt, ssh_config, cluster)))
        if bandwidth:
            r = _bandwidth(image, gpu, launcher, max_bytes, iters, instance_type, env, iface, tcp_streams,
                           nodes, _ssh_opts(ssh_opt, ssh_config, cluster))
            sys.exit(1 if r.verdict.status == "FAIL" else 0)
        rows = dr.run(nodes, dr.Options(image=image, iface=iface, shm_size=shm_size,
                                        min_free_gb=free,
                                        ssh_opts=_ssh_opts(ssh_opt, ssh_config, cluster), job=job or ""))
        print(dr.format_table(rows))
        sys.exit(1 if any(r.status == "FAIL" for r in rows) else 0)


@task(iterable=["env", "ssh_opt"], help={**NODE_HELP, **NETWORK_HELP})
def bench_network(c, image=None, cluster=None, hostfile=None, hosts=None, ec2_tag=None, region=None, slots=None,
                  ssh_user=None, ssh_key=None, ssh_opt=None, ssh_config=None, gpu=False, launcher=None,
                  max_bytes="1073741824", iters="5", instance_type=None, env=None, iface=None, tcp_streams="1"):
    """Allreduce bus bandwidth sweep across the nodes in the job's image, beside raw TCP; PASS/WARN/FAIL."""
    with user_errors():
        _image_flag(image)
        _bandwidth_flags(launcher, max_bytes, iters, env, tcp_streams, iface)
        r = _bandwidth(image, gpu, launcher, max_bytes, iters, instance_type, env, iface, tcp_streams,
                       _nodes(hostfile, hosts, ec2_tag, region, slots, ssh_user, ssh_key, cluster),
                       _ssh_opts(ssh_opt, ssh_config, cluster))
        sys.exit(1 if r.verdict.status == "FAIL" else 0)


@task(positional=["log"], help={"log": "a job's output file, a job name from `dtrain status`, "
                                        "or `latest` (the latest job)"})
def diagnose(c, log=None):
    """Match a failed job's output against the known failure signatures: dtrain diagnose LOG|JOB|latest."""
    from dtrain.launch.errors import LaunchError
    from dtrain.launch.troubleshoot import diagnose as dg
    from dtrain.launch.jobs.store import job_log, load_job

    with user_errors():
        if not log:
            raise dg.DiagnoseError("give a log file, a job name or `latest`: dtrain diagnose LOG|JOB|latest")
        path = dg.log_path(log)
        if path is None:
            try:
                path = job_log(load_job(None if log == "latest" else log)["name"])
            except LaunchError:
                if log != "latest" and dg.looks_like_file(log):
                    raise dg.DiagnoseError(f"{log}: no such file (nor a job of that name)") from None
                raise
        findings = dg.diagnose_file(path)
        print(dg.format_report(findings))
        sys.exit(1 if findings else 0)


# ---------------------------------------------------------------- other tools


@task(iterable=["input", "env", "metric", "from_job", "input_task", "dependencies", "tag"], help={
    "action": "run",
    "instances": "number of instances (default 1)",
    "instance_type": "e.g. ml.p3.2xlarge (default ml.m5.2xlarge)",
    "image": "image reference in ECR (built and pushed here)",
    "role": "SageMaker execution role ARN (default: the account's dtrain-sagemaker role)",
    "create_role": "without --role: make the role dtrain-sagemaker when the account has none (SageMaker's trust; "
                   "ECR pull, its logs and metrics, the job's S3 buckets), reused by later runs",
    "input": "NAME=DIR or NAME=s3://BUCKET/PREFIX: an input channel at /opt/ml/input/data/NAME, $SM_CHANNEL_NAME "
             "(a local DIR is uploaded under the job's prefix first; repeatable)",
    "from_job": "[NAME=]JOB: an earlier job's output (model.tar.gz, output.tar.gz) as channel NAME "
                "(default previous; repeatable)",
    "on_demand": "on-demand instances (default: managed spot, resumable from the state directory)",
    "volume_size": "GiB of EBS storage per instance (default 100)",
    "max_run": "run-time limit: seconds or a duration like 2h, 90m, 1h30m (default 24h)",
    "metric": "NAME=REGEX: a metric SageMaker takes from the log (the regex's first group; repeatable)",
    "task": "task name: runs of the same task share a state directory; a task Completed with the same code "
            "and settings is skipped, its output reused (default: the workdir's name)",
    "project": "project the tasks belong to (a tag; the default output's prefix; default dtrain)",
    "force": "run the task even when it Completed with the same code and settings",
    "input_task": "[CHANNEL=]TASK: the output of TASK's last job (Completed) as channel CHANNEL (default: "
                  "TASK's name; repeatable)",
    "dependencies": "DIR: a local package sent with the code (workdir rules) and put on PYTHONPATH as "
                    "`import NAME` (repeatable)",
    "tag": "KEY=VALUE: a tag on the training job (repeatable)",
    "local": "run the job's container on this machine's Docker, with SageMaker's /opt/ml under "
             "DOWNLOAD/JOB/opt-ml (one instance, local --input only; nothing reaches AWS)",
    "state_dir": "S3 URI of the state directory, /opt/ml/checkpoints in the job (default OUTPUT/state/TASK/)",
    "output": "S3 path for code, key, inputs, state and the model (default s3://sagemaker-REGION-ACCOUNT/PROJECT)",
    "workdir": "directory uploaded as the `code` channel; the command runs there, after its requirements.txt "
               "is installed (default: .)",
    "launcher": "mpirun or torchrun (default: torchrun for pytorch-ddp images, else mpirun)",
    "slots": "processes per instance (default: its GPUs, or 1)",
    "name": "training job name (default TASK-YYYYmmdd-HHMMSS)",
    "env": "K=V in the containers' environment (repeatable)",
    "wait": "stream the logs until the job ends, then download the output (default; --no-wait: wait until it has started, remove its key from S3, print the name)",
    "download": "local directory for the output and the log, DIR/JOB/logs.txt (default ./output)",
    "region": "AWS region", "profile": "AWS profile",
    "yes": "go on without asking, whatever the price per hour",
    "confirm_above": "ask before a job above this many USD per hour (default $DTRAIN_CONFIRM_ABOVE, else 10); "
                     "without a terminal, refuse unless --yes",
})
def sagemaker(c, action, instances="1", instance_type="ml.m5.2xlarge", image=None, role=None, input=None,
              from_job=None, on_demand=False, volume_size=None, max_run="24h", metric=None, task=None,
              state_dir=None, output=None, workdir=".", launcher=None, slots=None, name=None, env=None, wait=True,
              download="output", region=None, profile=None, project="dtrain", force=False, input_task=None,
              dependencies=None, tag=None, create_role=False, local=False, yes=False, confirm_above=None):
    """Run a command as a distributed SageMaker training job: dtrain sagemaker run --instances 2 ... -- python train.py"""
    from pathlib import Path

    import boto3

    from dtrain.launch.errors import LaunchError
    from dtrain import values
    from dtrain.launch.sagemaker import engine as sm

    with user_errors():
        if action != "run":
            raise LaunchError(f"unknown action {action!r}: use run")
        _image_flag(image)
        values.instance_type("--instance-type", instance_type, sagemaker=True)
        if launcher is not None:
            _choice_flag("--launcher", launcher, _launcher_names(sagemaker=True))
        if name is not None:
            sm.check_job_name("--name", name)
        if not Path(workdir).is_dir():
            raise LaunchError(f"--workdir {workdir}: not a directory")
        inputs = sm.parse_inputs(input or [])
        from_jobs = sm.parse_from_jobs(from_job or [], inputs)
        opts = sm.RunOptions(image=image or "", role_arn=role or "", command=tuple(_remainder()),
                             instances=_int_flag("--instances", instances, 1, 1000), instance_type=instance_type,
                             name=name, launcher=launcher,
                             slots=_jobfile.number("slots", slots) if slots is not None else None, inputs=inputs,
                             from_jobs=from_jobs, project=sm.check_project(project), force=force,
                             input_tasks=sm.parse_input_tasks(input_task or [], {**inputs, **from_jobs}),
                             dependencies=sm.parse_dependencies(dependencies or []), tags=sm.parse_tags(tag or []),
                             create_role=create_role, task_state=True,
                             env=values.env_pairs("--env", env), spot=not on_demand, output_s3=output, workdir=Path(workdir),
                             download=Path(download), wait=wait,
                             volume_gb=_jobfile.number("volume_size", volume_size or _jobfile.launch_default("volume_size")),
                             max_runtime_s=sm.parse_duration(max_run), metrics=sm.parse_metrics(metric or []),
                             task=task, state_s3=state_dir)
        if local:
            job, code = sm.run_local(opts)
        else:
            from functools import partial

            from dtrain.launch.infra import pricing

            gate = partial(pricing.sagemaker_gate, instance_type=opts.instance_type, count=opts.instances,
                           spot=opts.spot, above=pricing.threshold(confirm_above), yes=yes,
                           hours=opts.max_runtime_s / 3600)
            job, code = sm.run(opts, session=boto3.session.Session(profile_name=profile, region_name=region),
                               confirm=gate)
        if not wait:
            print(job)
        sys.exit(code)


@task(iterable=["env", "node_selector"], help={
    "for_": "trainjob, jobset, mpijob, pytorchjob, ecs or sagemaker",
    "image": "image reference (built here, pushed with dtrain push)",
    "workers": "workers / replicas / instances (default 2)",
    "gpus_per_worker": "GPUs per worker (0: CPU; default: --instance-type's, else 0)",
    "name": "job name (default: the image's repository and a short hash of the command, e.g. pytorch-ddp-1a2b3c)",
    "launcher": "mpirun or torchrun where the tool allows both; ray with --for ecs (Ray head and "
                "worker services, seed 001)",
    "ray_head_address": "ECS + ray: DNS name or IP the workers join the head at "
                        "(default ray-head.dtrain.internal; docs/other-tools.md)",
    "ecs_cluster": "ECS + ray: cluster of the services (default dtrain)",
    "env": "K=V for every rank (repeatable); Kubernetes / ECS: the file names K only, its value comes from a "
           "secret (printed: how to make it)",
    "node_selector": "K=V Kubernetes nodeSelector (repeatable)",
    "namespace": "Kubernetes namespace",
    "slots_per_worker": "MPIJob slotsPerWorker (default: GPUs per worker, or 1)",
    "role_arn": "SageMaker execution role ARN",
    "output_s3": "SageMaker output S3 path",
    "instance_type": "SageMaker instance type; Kubernetes / ECS: the nodes' EC2 type (its EFA interfaces "
                     "on every worker, e.g. p4d.24xlarge)",
    "execution_role_arn": "ECS task execution role ARN",
    "ssh_key_secret_arn": "ECS: Secrets Manager ARN of the job's SSH key",
    "env_secret_arn": "ECS: Secrets Manager ARN of the JSON object holding the --env values",
    "output": "write to this file instead of stdout",
    "force": "with --output: replace the file there even where dtrain did not write it",
    "timeout": "trainjob, jobset: the job's time limit in seconds (activeDeadlineSeconds), as launch --timeout",
    "max_restarts": "trainjob, jobset: restart the whole job this many times (JobSet failurePolicy.maxRestarts), "
                    "as launch --max-restarts",
})
def manifest(c, for_=None, image=None, workers="2", gpus_per_worker=None, name=None, launcher=None,
             env=None, node_selector=None, namespace=None, slots_per_worker=None, role_arn=None,
             output_s3=None, instance_type=None, execution_role_arn=None, ssh_key_secret_arn=None,
             output=None, ray_head_address=None, ecs_cluster=None, env_secret_arn=None, force=False, timeout=None,
             max_restarts=None):
    """Job description for Kubeflow Trainer v2 (TrainJob), JobSet, MPIJob/PyTorchJob, ECS or SageMaker, schema-validated.

    dtrain manifest --for mpijob --image REF -- CMD"""
    from dtrain.launch.other_tools import manifests as mf

    from dtrain import values

    with user_errors():
        _image_flag(image)
        if for_ is not None:
            _choice_flag("--for", for_, mf.TARGETS)
        given_name = name is not None
        name = values.name("--name", name) if given_name else mf.default_name(image, _remainder())
        values.env_pairs("--env", env)
        if launcher is not None:
            _choice_flag("--launcher", launcher, _launcher_names(manifests=True))
        if slots_per_worker is not None:
            _int_flag("--slots-per-worker", slots_per_worker, 1, 1024)
        if instance_type is not None and for_ == "sagemaker":
            values.instance_type("--instance-type", instance_type, sagemaker=True)
        elif instance_type is not None:
            values.ec2_instance_type("--instance-type", instance_type)
        _force_flag(force, output)
        mf.check_output(output, force)
        spec = mf.spec_from_args(
            for_, image, _remainder(), workers=_int_flag("--workers", workers, 1, 1024),
            gpus_per_worker=None if gpus_per_worker is None else _int_flag("--gpus-per-worker", gpus_per_worker, 0, 64),
            name=name,
            env=env, node_selector=node_selector, launcher=launcher, namespace=namespace,
            slots_per_worker=slots_per_worker, role_arn=role_arn, output_s3=output_s3,
            instance_type=instance_type, execution_role_arn=execution_role_arn,
            ssh_key_secret_arn=ssh_key_secret_arn, ray_head_address=ray_head_address,
            ecs_cluster=ecs_cluster, env_secret_arn=env_secret_arn,
            **mf.limits(for_, timeout=timeout, max_restarts=max_restarts))  # trainjob, jobset
        text = mf.render(spec)
        for line in mf.placeholders(spec):
            print(line, file=sys.stderr)
        print(mf.write(text, output, force), end="")
        if not given_name:  # once written: the name dtrain chose
            print(f"[manifest] name {name}: from the image and the command (--name NAME to choose)", file=sys.stderr)
