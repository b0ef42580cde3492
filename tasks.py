"""dtrain tasks: `invoke --list`. Each task parses flags and calls one function."""

from __future__ import annotations

import sys
from contextlib import contextmanager

from invoke import task as _task


def task(*args, **kwargs):
    """Invoke's @task without auto short flags (they collide: --ssh-user became `--`)."""
    kwargs.setdefault("auto_shortflags", False)
    if len(args) == 1 and callable(args[0]) and not kwargs.get("help"):
        return _task(auto_shortflags=False)(args[0])
    return _task(*args, **kwargs)


@contextmanager
def user_errors():
    """Known errors print one readable message and exit non-zero, without a traceback."""
    from dtrain.images.build import BuildError
    from dtrain.images.push import PushError
    from dtrain.images.spec import SpecError
    from dtrain.launch.troubleshoot.diagnose import DiagnoseError
    from dtrain.launch.errors import LaunchError

    try:
        from dtrain.launch.infra.cluster import ClusterError
    except ImportError:  # before the cluster module lands
        ClusterError = LaunchError

    try:
        yield
    except (SpecError, BuildError, PushError, LaunchError, ClusterError, DiagnoseError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


@task(help={"image": "one family (horovod-tensorflow, horovod-pytorch, pytorch-ddp); default all",
            "check": "do not write; fail if dockerfiles/ differs from the specs"})
def render(c, image=None, check=False):
    """Validate images/*.yaml against compat.yaml and write dockerfiles/<family>/<tag>/Dockerfile."""
    from dtrain.images import render as r

    with user_errors():
        families = [image] if image else None
        if check:
            stale = [p for p, text in r.render_all(families).items()
                     if not p.exists() or p.read_text() != text]
            for p in stale:
                print(f"out of date: {p.relative_to(r.ROOT)}", file=sys.stderr)
            if stale:
                sys.exit("error: dockerfiles/ is out of date; run `invoke render`")
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
    "base_image": "base for both stages, e.g. a mirrored or imported image (dtrain/debian:bookworm)",
    "builder_image": "base for the builder stage only",
    "ca_bundle": "CA bundle for pip/curl/apt inside the build, as a BuildKit secret "
                 "(default: the host pip's, from PIP_CERT)",
    "pip_conf": "pip.conf for the build (private index), as a BuildKit secret",
    "wheelhouse": "directory of wheels offered to pip first (offline builds)",
    "push_cache": "registry repository to pull and push inline build cache",
    "no_cache": "ignore the layer cache",
})
def build(c, image=None, tag=None, all=False, base_image=None, builder_image=None, ca_bundle=None,
          pip_conf=None, wheelhouse=None, push_cache=None, no_cache=False):
    """Build images with BuildKit from dockerfiles/ (run `invoke render` first)."""
    from pathlib import Path

    from dtrain.images import build as b

    with user_errors():
        opts = b.BuildOptions(
            base_image=base_image, builder_image=builder_image,
            ca_bundle=Path(ca_bundle) if ca_bundle else b.default_ca_bundle(),
            pip_conf=Path(pip_conf) if pip_conf else None,
            wheelhouse=Path(wheelhouse) if wheelhouse else None,
            push_cache=push_cache, no_cache=no_cache)
        b.build([image] if image else None, tag, all, opts)


@task(help={
    "ecr": "push to Amazon ECR (repositories created with scan-on-push)",
    "registry": "push to this v2 registry HOST[:PORT]",
    "image": "FAMILY or FAMILY:TAG; default every built image",
    "account": "ECR registry account id (default: the caller's)",
    "region": "AWS region", "profile": "AWS profile",
    "repo_prefix": "repository prefix (default dtrain)",
    "immutable": "ECR: immutable tags", "lifecycle_policy": "ECR lifecycle policy JSON file",
    "user": "registry user", "password": "registry password ('-' reads stdin; default $DTRAIN_REGISTRY_PASSWORD)",
    "catalog": "catalog path (default build/catalog.json)",
})
def push(c, ecr=False, registry=None, image=None, account=None, region=None, profile=None,
         repo_prefix="dtrain", immutable=False, lifecycle_policy=None, user=None, password=None,
         catalog=None):
    """Push built images to ECR or a registry, verify the digest by pulling it back, record it in the catalog."""
    from pathlib import Path

    from dtrain.images import push as p

    with user_errors():
        if ecr == bool(registry):
            raise p.PushError("pass exactly one of --ecr or --registry HOST[:PORT]")
        images, notes = p.select_images(image)
        for n in notes:
            print(n)
        path = Path(catalog) if catalog else p.CATALOG
        if ecr:
            p.push_ecr(images, profile=profile, region=region, account=account, prefix=repo_prefix,
                       immutable=immutable, lifecycle_policy=lifecycle_policy, catalog_path=path)
        else:
            if password == "-":
                password = p.read_password_stdin()
            p.push_registry(images, registry, user=user, password=password, prefix=repo_prefix,
                            catalog_path=path)


@task(help={"k": "only tests matching this pytest -k expression",
            "unit": "only the tests that need neither Docker nor the simulated cluster"})
def test(c, k=None, unit=False):
    """Run the tests; installs and starts what they need (root, Linux).

    Debian packages, the Docker engine, the debootstrapped base image."""
    import subprocess

    args = [sys.executable, "-m", "pytest", "-q"]
    if unit:
        args += ["-m", "not docker and not cluster"]
    else:
        from dtrain.launch.infra import engine

        engine.ensure_all()
    if k:
        args += ["-k", k]
    sys.exit(subprocess.call(args))


# ---------------------------------------------------------------- running jobs

NODE_HELP = {
    "hostfile": "lines `HOST slots=N [port=22] [user=U] [identity=KEY]`",
    "hosts": "h1:4,h2:4",
    "ec2_tag": "Key=Value: running instances with this tag (private IPs; slots = GPUs)",
    "region": "AWS region for --ec2-tag",
    "slots": "slots per node for --ec2-tag (default: GPUs of the instance type)",
    "ssh_user": "ssh user on the nodes (default: from the hostfile or ~/.ssh/config)",
    "ssh_key": "ssh identity for the nodes",
    "ssh_opt": "extra ssh -o option to reach the nodes (repeatable)",
    "ssh_config": "ssh config file for reaching the nodes (ssh -F), e.g. the local cluster's",
}


def _nodes(hostfile, hosts, ec2_tag, region, slots, ssh_user, ssh_key):
    from dtrain.launch.jobs.hosts import nodes_from_args

    return nodes_from_args(hostfile=hostfile, hosts=hosts, ec2_tag=ec2_tag, region=region,
                           slots=int(slots) if slots else None, ssh_user=ssh_user, ssh_key=ssh_key)


def _ssh_opts(ssh_opt, ssh_config=None):
    return (("-F", ssh_config) if ssh_config else ()) + tuple(x for o in (ssh_opt or []) for x in ("-o", o))


@task(iterable=["env", "mount", "ssh_opt"], help={
    **NODE_HELP,
    "image": "image reference every node pulls (ECR: logged in with a token from boto3)",
    "launcher": "mpirun (default), horovodrun or torchrun",
    "name": "job name (default job-YYYYmmdd-HHMMSS); re-using a name replaces its containers",
    "env": "K=V for every rank (repeatable)",
    "env_file": "file of K=V lines; every variable is forwarded to every rank",
    "iface": "network interface for MPI/NCCL/Gloo (default: the NIC of each node's address)",
    "mount": "/host/path[:/container/path][:ro] (repeatable), e.g. /fsx:ro",
    "shm_size": "container /dev/shm size, e.g. 16g (default: --ipc host)",
    "master_port": "torchrun master port (default 29500)",
    "rdzv": "torchrun rendezvous: static (default) or c10d",
    "pull": "always (default: pull the tag on every node), missing (only where absent) or never",
    "timeout": "stop the job after this many seconds",
})
def launch(c, image=None, launcher="mpirun", name=None, hostfile=None, hosts=None, ec2_tag=None,
           region=None, slots=None, ssh_user=None, ssh_key=None, ssh_opt=None, ssh_config=None, env=None,
           env_file=None, iface=None, mount=None, shm_size=None, master_port=29500, rdzv="static",
           pull="always", timeout=None):
    """Start host-network containers on every node and run the job: invoke launch ... -- CMD ..."""
    from dtrain.launch.jobs import commands
    from dtrain.launch.errors import LaunchError
    from dtrain.launch.jobs.job import Job, JobSpec

    with user_errors():
        if not image:
            raise LaunchError("--image is required (e.g. --image 10.213.0.1:5000/dtrain/horovod-tensorflow:TAG)")
        command = tuple(_remainder())
        if pull not in ("always", "missing", "never"):
            raise LaunchError(f"--pull {pull}: use always, missing or never")
        if launcher not in ("mpirun", "horovodrun", "torchrun"):
            raise LaunchError(f"--launcher {launcher}: use mpirun, horovodrun or torchrun")
        envs = dict(commands.parse_env_file(env_file)) if env_file else {}
        for kv in env or []:
            k, sep, v = kv.partition("=")
            if not sep:
                raise LaunchError(f"--env {kv}: expected K=V")
            envs[k] = v
        spec = JobSpec(image=image, command=command, launcher=launcher, name=name or "", env=envs,
                       iface=iface, mounts=tuple(commands.parse_mount(m) for m in mount or []),
                       shm_size=shm_size, master_port=int(master_port), rdzv=rdzv, pull=pull,
                       job_timeout=float(timeout) if timeout else None, ssh_opts=_ssh_opts(ssh_opt, ssh_config))
        job = Job(spec, _nodes(hostfile, hosts, ec2_tag, region, slots, ssh_user, ssh_key))
        code = job.run()
        if code != 0:
            _report_failure(job.spec.name, code)
        sys.exit(code)


@task(iterable=["ssh_opt"], help={
    **NODE_HELP,
    "image": "image reference to bring onto every node",
    "pull": "always (default: unless the node holds the registry's digest; one manifest request) "
            "or missing (only where no image of that name is)",
})
def pull(c, image=None, hostfile=None, hosts=None, ec2_tag=None, region=None, slots=None, ssh_user=None,
         ssh_key=None, ssh_opt=None, ssh_config=None, pull="always"):
    """Pre-stage an image on nodes ahead of a launch, with per-node progress: invoke pull --hosts h1,h2 --image REF"""
    from dtrain.launch.errors import LaunchError
    from dtrain.launch.jobs import pull as pl
    from dtrain.launch.jobs.job import _ecr_login_script

    with user_errors():
        if not image:
            raise LaunchError("--image is required (e.g. --image 10.213.0.1:5000/dtrain/pytorch-ddp:TAG)")
        if pull not in pl.POLICIES:
            raise LaunchError(f"--pull {pull}: use always or missing")
        nodes = _nodes(hostfile, hosts, ec2_tag, region, slots, ssh_user, ssh_key)
        login = _ecr_login_script(image)  # ECR: a token from boto3, to each node on stdin
        pl.pull_on_nodes(nodes, image, pull, ssh_opts=_ssh_opts(ssh_opt, ssh_config), out=sys.stdout,
                         login_script=login.script, login_password=login.password)


def _remainder():
    argv = sys.argv
    return argv[argv.index("--") + 1:] if "--" in argv else []


def _report_failure(name, code):
    print(f"[launch] job {name} failed with exit code {code}; output: invoke logs --job {name}",
          file=sys.stderr)
    from dtrain.launch.troubleshoot import diagnose
    from dtrain.launch.jobs.job import job_log

    print(diagnose.format_report(diagnose.diagnose_file(job_log(name))), file=sys.stderr)


@task
def status(c):
    """Recent jobs and their state."""
    from dtrain.launch.jobs.job import status_rows

    rows = status_rows()
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip())


@task(help={"job": "job name (default: the latest)", "follow": "keep printing while it runs"})
def logs(c, job=None, follow=False):
    """Print a job's output (every line prefixed with node and rank)."""
    from dtrain.launch.jobs.job import follow as follow_log, job_log, load_job

    with user_errors():
        j = load_job(job)
        path = job_log(j["name"])
        if follow:
            follow_log(path, j)
        else:
            print(path.read_text(), end="")


@task(iterable=["ssh_opt"], help={"job": "job name (default: the latest)", "ssh_opt": NODE_HELP["ssh_opt"],
                                  "ssh_config": NODE_HELP["ssh_config"]})
def stop(c, job=None, ssh_opt=None, ssh_config=None):
    """Stop a job: its launcher tears down, and no container of it is left on any node."""
    from dtrain.launch.jobs.job import stop as stop_job

    with user_errors():
        print(f"stopped {stop_job(job, _ssh_opts(ssh_opt, ssh_config))}")


# ---------------------------------------------------------------- local simulated cluster


@task(help={"action": "up, down or status", "nodes": "number of nodes for `up` (default 2)",
            "recreate": "with up: replace a cluster of another size",
            "link_rate": "with up: limit each node's link both ways, e.g. 1gbit (default: no limit)"})
def cluster(c, action, nodes=2, recreate=False, link_rate=None):
    """Local simulated cluster (root, Linux): invoke cluster up --nodes 3 | down | status."""
    from dtrain.launch.infra import cluster as cl

    with user_errors():
        if action == "up":
            info = cl.up(int(nodes), recreate=recreate, link_rate=link_rate)
            print(f"hostfile:   {info.hostfile}\nssh config: {info.ssh_config}\nregistry:   {info.registry}")
            print(f"launch with: invoke launch --hostfile {info.hostfile} --ssh-config {info.ssh_config} "
                  f"--image {info.registry}/dtrain/FAMILY:TAG -- CMD")
        elif action == "down":
            cl.down()
        elif action == "status":
            st = cl.status()
            print("up" if st.up else "down", f"({st.nodes} nodes)")
            for problem in st.problems + st.leftovers:
                print(f"  {problem}")
        else:
            raise cl.ClusterError(f"unknown action {action!r}: use up, down or status")


@task(help={"nodes": "nodes in the simulated cluster (default 2)", "keep": "leave the cluster up",
            "epochs": "training epochs (default 3)"})
def demo(c, nodes=2, keep=False, epochs=3):
    """The main job end to end: build the CPU Horovod image, simulated cluster, real training, teardown."""
    from dtrain.launch import demo as d

    with user_errors():
        sys.exit(d.run(int(nodes), keep, int(epochs)))


# ---------------------------------------------------------------- troubleshooting


@task(iterable=["ssh_opt"], help={
    **NODE_HELP,
    "image": "image to check with (digest on every node, and the in-container checks)",
    "iface": "network interface to check (default: the NIC of each node's address)",
    "shm_size": "as `invoke launch --shm-size` (default --ipc host)",
    "min_free_gb": "free GiB wanted on Docker's data root besides the image (default 10)",
    "job": "a running job whose container may hold port 2022",
})
def doctor(c, hostfile=None, hosts=None, ec2_tag=None, region=None, slots=None, ssh_user=None,
           ssh_key=None, ssh_opt=None, ssh_config=None, image=None, iface=None, shm_size=None,
           min_free_gb=10.0, job=None):
    """Check every node in parallel against the troubleshooting checklist; non-zero exit on any FAIL."""
    from dtrain.launch.troubleshoot import doctor as dr

    with user_errors():
        nodes = _nodes(hostfile, hosts, ec2_tag, region, slots, ssh_user, ssh_key)
        rows = dr.run(nodes, dr.Options(image=image, iface=iface, shm_size=shm_size,
                                        min_free_gb=float(min_free_gb),
                                        ssh_opts=_ssh_opts(ssh_opt, ssh_config), job=job or ""))
        print(dr.format_table(rows))
        sys.exit(1 if any(r.status == "FAIL" for r in rows) else 0)


@task(help={"log": "a job's output file, or a job name from `invoke status` (default: the latest job)"})
def diagnose(c, log=None):
    """Match a failed job's output against the known failure signatures (docs/troubleshooting.md)."""
    from pathlib import Path

    from dtrain.launch.troubleshoot import diagnose as dg
    from dtrain.launch.jobs.job import job_log, load_job

    with user_errors():
        path = Path(log) if log and Path(log).exists() else job_log(load_job(log)["name"])
        findings = dg.diagnose_file(path)
        print(dg.format_report(findings))
        sys.exit(1 if findings else 0)


# ---------------------------------------------------------------- other tools


@task(iterable=["env", "node_selector"], help={
    "for_": "mpijob, pytorchjob, ecs or sagemaker",
    "image": "image reference (built here, pushed with invoke push)",
    "workers": "workers / replicas / instances (default 2)",
    "gpus_per_worker": "GPUs per worker (0: CPU)",
    "name": "job name (default dtrain-job)",
    "launcher": "mpirun or torchrun where the tool allows both",
    "env": "K=V for every rank (repeatable)",
    "node_selector": "K=V Kubernetes nodeSelector (repeatable)",
    "namespace": "Kubernetes namespace",
    "slots_per_worker": "MPIJob slotsPerWorker (default: GPUs per worker, or 1)",
    "role_arn": "SageMaker execution role ARN",
    "output_s3": "SageMaker output S3 path",
    "instance_type": "SageMaker / ECS instance type",
    "execution_role_arn": "ECS task execution role ARN",
    "ssh_key_secret_arn": "ECS: Secrets Manager ARN of the job's SSH key",
    "output": "write to this file instead of stdout",
})
def manifest(c, for_=None, image=None, workers=2, gpus_per_worker=0, name="dtrain-job", launcher=None,
             env=None, node_selector=None, namespace=None, slots_per_worker=None, role_arn=None,
             output_s3=None, instance_type=None, execution_role_arn=None, ssh_key_secret_arn=None,
             output=None):
    """Job description for Kubeflow MPIJob/PyTorchJob, ECS or SageMaker, schema-validated.

    invoke manifest --for mpijob --image REF -- CMD"""
    from pathlib import Path

    from dtrain.launch.other_tools import manifests as mf

    with user_errors():
        text = mf.render(mf.spec_from_args(
            for_, image, _remainder(), workers=workers, gpus_per_worker=gpus_per_worker, name=name,
            env=env, node_selector=node_selector, launcher=launcher, namespace=namespace,
            slots_per_worker=slots_per_worker, role_arn=role_arn, output_s3=output_s3,
            instance_type=instance_type, execution_role_arn=execution_role_arn,
            ssh_key_secret_arn=ssh_key_secret_arn))
        if output:
            Path(output).write_text(text)
            print(f"wrote {output}")
        else:
            print(text, end="")
