"""`dtrain doctor`, `bench-network`, `diagnose`: troubleshooting's tasks (the work: launch/troubleshoot/).

Each task is declared here, beside its body: tasks.py names them for Invoke."""

from __future__ import annotations

import sys

from dtrain.launch.cli_support import task, user_errors, _int_flag, _float_flag, _choice_flag, _launcher_names, _image_flag, _env_flags  # noqa: F401
from dtrain.launch.cli.jobs import NODE_HELP, NODE_LISTS, _node_signature, _node_ssh_opts, _nodes


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


@task(iterable=[*NODE_LISTS, "env"], help={
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
@_node_signature
def doctor(c, image=None, iface=None, shm_size=None, min_free_gb="10", job=None, bandwidth=False, gpu=False,
           launcher=None, max_bytes="1073741824", iters="5", instance_type=None, env=None, tcp_streams="1", quick=False,
           **node):
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
        nodes, ssh_opts = _nodes(node), _node_ssh_opts(node)
        if bandwidth and quick:
            sys.exit(_gate(image, iface, instance_type, nodes, ssh_opts))
        if bandwidth:
            r = _bandwidth(image, gpu, launcher, max_bytes, iters, instance_type, env, iface, tcp_streams,
                           nodes, ssh_opts)
            sys.exit(1 if r.verdict.status == "FAIL" else 0)
        rows = dr.run(nodes, dr.Options(image=image, iface=iface, shm_size=shm_size,
                                        min_free_gb=free,
                                        ssh_opts=ssh_opts, job=job or ""))
        print(dr.format_table(rows))
        sys.exit(1 if any(r.status == "FAIL" for r in rows) else 0)


@task(iterable=["env", *NODE_LISTS], help={**NODE_HELP, **NETWORK_HELP})
@_node_signature
def bench_network(c, image=None, gpu=False, launcher=None, max_bytes="1073741824", iters="5", instance_type=None,
                  env=None, iface=None, tcp_streams="1", **node):
    """Allreduce bus bandwidth sweep across the nodes in the job's image, beside raw TCP; PASS/WARN/FAIL."""
    with user_errors():
        _image_flag(image)
        _bandwidth_flags(launcher, max_bytes, iters, env, tcp_streams, iface)
        r = _bandwidth(image, gpu, launcher, max_bytes, iters, instance_type, env, iface, tcp_streams,
                       _nodes(node), _node_ssh_opts(node))
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
