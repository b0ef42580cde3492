"""`dtrain launch`, `pull`, `status`, `report`, `logs`, `stop`, `nodes ssh`, `exec`: running jobs' tasks
(the work: launch/launching.py, launch/jobs/). The launch's flags are the job file's fields (JobFile).

Each task is declared here, beside its body: tasks.py names them for Invoke."""

from __future__ import annotations

import sys

from dtrain.launch.cli_support import task, user_errors, _choice_flag, _image_flag  # noqa: F401


from dtrain.launch.jobs import jobfile as _jobfile  # noqa: E402  the launch flags' help: the job file's model


from dtrain.launch.jobs import config as _config  # noqa: E402  the switches' opposites


LAUNCH_HELP = _jobfile.help_texts()


# the flags that name the nodes and reach them: the model's (jobfile.node_fields), each task that
# works on nodes takes them all (_node_signature)
NODE_FLAGS = _jobfile.node_fields()
NODE_HELP = {k: LAUNCH_HELP[k] for k in NODE_FLAGS}


# `dtrain launch` flags that are not fields of a launch (JobFile): which file, what to do with it.
LAUNCH_TASK_ONLY_HELP = {
    "f": "a job file (YAML, the flags below by name: docs/launch.md#a-job-file); flags given here override it",
    "file": "the same as -f",
    "dump": "print the job file these flags (and -f) mean, and exit, whatever the --target (a description: "
            "--output, or stdout without --dump)",
    "output": "--target mpijob|pytorchjob|ecs|trainjob|jobset: write the description to this file instead of stdout",
    "force": "with --output: replace the file there even where dtrain did not write it",
}


def _nodes(node):
    """The nodes the node flags name ({flag: value}; absent or None: not given)."""
    from dtrain.launch.launching import node_list

    return node_list(node)


def _node_signature(body):
    """A task that works on nodes takes every node flag (NODE_FLAGS, default None) after its own
    (Invoke reads the signature); the body gets them as **node."""
    import inspect

    own = [p for p in inspect.signature(body).parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    node = [inspect.Parameter(k, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None) for k in NODE_FLAGS]
    body.__signature__ = inspect.Signature([*own, *node])
    return body


def _ssh_opts(ssh_opt, ssh_config=None, cluster=None):
    from dtrain.launch.launching import ssh_options

    return ssh_options(ssh_opt, ssh_config, cluster)


def _node_ssh_opts(node):
    """The ssh options of the nodes the node flags name."""
    return _ssh_opts(node.get("ssh_opt"), node.get("ssh_config"), node.get("cluster"))


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

NODE_LISTS = [k for k in NODE_FLAGS if k in _FLAG_LISTS]  # the repeatable node flags (ssh_opt)


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


@task(iterable=NODE_LISTS, help={
    **NODE_HELP,
    "image": "image reference to bring onto every node",
    "pull": "always (default: unless the node holds the registry's digest; one manifest request) "
            "or missing (only where no image of that name is)",
})
@_node_signature
def pull(c, image=None, pull=None, **node):
    """Pre-stage an image on nodes ahead of a launch, with per-node progress: dtrain pull --hosts h1,h2 --image REF"""
    from dtrain.launch.errors import LaunchError
    from dtrain.launch import targets
    from dtrain.launch.jobs import pull as pl

    with user_errors():
        if not image:
            raise LaunchError("--image is required (e.g. --image 10.213.0.1:5000/dtrain/pytorch-ddp:TAG)")
        _image_flag(image)
        pull = _choice_flag("--pull", pull or _jobfile.launch_default("pull"), pl.POLICIES)
        nodes = _nodes(node)
        provider = targets.choose(targets.node_args(node))
        login = provider.login(image)  # ECR: a token from boto3, to each node on stdin
        pl.pull_on_nodes(nodes, image, pull, ssh_opts=_node_ssh_opts(node), out=sys.stdout, login=login)


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
