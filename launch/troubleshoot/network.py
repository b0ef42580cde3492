"""`dtrain doctor --bandwidth` / `dtrain bench-network`: an allreduce bus-bandwidth sweep across
the nodes, inside the job's own image, launched as a job (same flags as `dtrain launch`), next
to raw TCP throughput between the same containers; then a verdict against the expectation for
the instance type (launch/jobs/network_expectations.yaml, shared with the network gate:
launch/jobs/netgate.py) with the likely causes from the checklist.

GPU images: nccl-tests' all_reduce_perf (built into the GPU variants). CPU images:
launch/node/examples/allreduce_bw.py (gloo or Horovod) with the same busbw definition.
Parsing, the table and the verdict are pure functions. `quick` (`doctor --bandwidth --quick`)
runs the launch's network gate instead: seconds, naming a slow node (launch/jobs/netgate.py).
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from typing import Callable, Literal, Sequence

from dtrain import contract
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import launchers
from dtrain.launch.infra.instance_types import efa_count
from dtrain.launch.jobs.netgate import (EXPECTATIONS, Expectation, GateResult, expectation_for,  # noqa: F401
                                        load_expectations, run_gate)  # (EXPECTATIONS: the table is the gate's too)
from dtrain.launch.remote.hosts import Node

EX = contract.EXAMPLES
ALL_REDUCE_PERF = "/opt/nccl-tests/build/all_reduce_perf"
MIN_BYTES, MAX_BYTES = 1 << 20, 1 << 30
Status = Literal["PASS", "WARN", "FAIL"]


@dataclass(frozen=True)
class SweepRow:
    size: int  # bytes
    time_us: float
    algbw: float  # GB/s (1e9 bytes): size / time
    busbw: float  # algbw * 2(n-1)/n


def bus_bandwidth(algbw: float, ranks: int) -> float:
    """nccl-tests' busbw for allreduce (doc/PERFORMANCE.md): algbw * 2(n-1)/n."""
    if ranks < 1:
        raise ValueError(f"ranks must be > 0, got {ranks}")
    return algbw * 2 * (ranks - 1) / ranks


# "[node-1 r0] " (the launch's prefix) or "[1,0]<stdout>:" (mpirun --tag-output) before a line
_PREFIX = re.compile(r"^(?:\[\d+,\d+\]<std(?:out|err)>:|\[[^\]]*\]\s?)*")
_OURS = re.compile(r"allreduce_bw size=(\d+) ranks=(\d+) time_us=([\d.]+) algbw=([\d.]+) busbw=([\d.]+)")
# all_reduce_perf: size count type redop [root] time algbw busbw #wrong|error (out-of-place first)
_NCCL = re.compile(r"^\s*(\d+)\s+(\d+)\s+\w+\s+\w+\s+(?:-?\d+\s+)?([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+\S+")
_TCP = re.compile(r"tcp_bw_min gbs=([\d.]+)")


def parse_sweep(text: str) -> list[SweepRow]:
    """Rows of allreduce_bw.py's `allreduce_bw ...` lines, or of all_reduce_perf's table
    (out-of-place columns), in size order; launch prefixes and mpirun tags are skipped."""
    rows: dict[int, SweepRow] = {}
    for raw in text.splitlines():
        line = _PREFIX.sub("", raw)
        if m := _OURS.search(line):
            size, _, t, alg, bus = m.groups()
            rows[int(size)] = SweepRow(int(size), float(t), float(alg), float(bus))
        elif not line.lstrip().startswith("#") and (m := _NCCL.match(line)):
            size, _, t, alg, bus = m.groups()
            rows[int(size)] = SweepRow(int(size), float(t), float(alg), float(bus))
    return [rows[s] for s in sorted(rows)]


def parse_tcp(text: str) -> float | None:
    """The least per-rank TCP throughput (GB/s) of allreduce_bw.py's ring, if printed."""
    found = _TCP.findall(text)
    return float(found[-1]) if found else None


def _size(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def format_table(rows: Sequence[SweepRow], tcp_gbs: float | None) -> str:
    """size, time, algbw, busbw, and busbw / TCP (the TCP figure is the same on every row)."""
    out = [f"{'size':>9}  {'time (us)':>11}  {'algbw GB/s':>10}  {'busbw GB/s':>10}  {'TCP GB/s':>8}  "
           f"{'busbw/TCP':>9}"]
    for r in rows:
        tcp = f"{tcp_gbs:8.3f}" if tcp_gbs else f"{'-':>8}"
        ratio = f"{r.busbw / tcp_gbs:9.2f}" if tcp_gbs else f"{'-':>9}"
        out.append(f"{_size(r.size):>9}  {r.time_us:11.1f}  {r.algbw:10.3f}  {r.busbw:10.3f}  {tcp}  {ratio}")
    return "\n".join(out)


# ---------------------------------------------------------------- expectations and verdict


@dataclass(frozen=True)
class Verdict:
    status: Status
    detail: str
    causes: tuple[str, ...] = ()  # checklist entry ids, likeliest first


# Causes read from NCCL's log (NCCL_DEBUG=INFO), as checklist ids.
_EFA_SELECTED = re.compile(r"Selected [Pp]rovider is efa")
# aws-ofi-nccl: "NET/OFI Selected Provider is efa (found 4 nics)" (newer: "..., fabric is efa-direct (found 4 nics)").
_EFA_NICS = re.compile(r"Selected [Pp]rovider is efa\b.*?\(found (\d+) nics?\)")
_SOCKETS = re.compile(r"Using network Socket")
_FEW_SOCKETS = re.compile(r"NET/Socket ?: Using 1 threads? and 1 sockets? per thread")
_BAD_NIC = re.compile(r"(?:Bootstrap ?|NET/Socket ?): Using (?:\[\d+\])?(?:lo|docker\d*|br-[0-9a-f]+|veth\w*):")


def likely_causes(expect: Expectation | None, nccl_log: str, gpu: bool) -> tuple[str, ...]:
    """Checklist ids that explain a low busbw, from what NCCL's log says (or does not)."""
    causes = []
    if _BAD_NIC.search(nccl_log):
        causes.append("nccl-iface")
    if gpu and expect is not None and expect.efa and not _EFA_SELECTED.search(nccl_log):
        causes.append("efa-not-selected")
    nics = [int(n) for n in _EFA_NICS.findall(nccl_log)]
    if gpu and expect is not None and nics and min(nics) < (efa_count(expect.instance_type) or 0):
        causes.append("efa-fewer")  # NCCL found fewer EFA devices than the type has
    if gpu and _SOCKETS.search(nccl_log):
        causes.append("efa-unused" if expect is not None and expect.efa else "nccl-few-sockets")
    if gpu and (_FEW_SOCKETS.search(nccl_log) or (expect is not None and not expect.efa and _SOCKETS.search(nccl_log))):
        causes.append("nccl-few-sockets")
    if not gpu:
        causes.append("btl-iface")  # CPU: Gloo/Open MPI on a slower NIC than the one measured
    return tuple(dict.fromkeys(causes))


def verdict(rows: Sequence[SweepRow], tcp_gbs: float | None, expect: Expectation | None,
            nccl_log: str = "", gpu: bool = False) -> Verdict:
    """PASS at >= 80% of the expected busbw (50% of the measured TCP throughput where no
    figure is known), WARN at >= half of that, else FAIL, with the likely causes."""
    if not rows:
        return Verdict("FAIL", "no allreduce results in the job's output", ("rank-exit",))
    peak = max(r.busbw for r in rows)
    if expect is not None and expect.busbw is not None:
        want, against = expect.busbw * 0.8, f"expected {expect.busbw:g} GB/s on {expect.instance_type} ({expect.source})"
    elif tcp_gbs:
        want, against = tcp_gbs * 0.5, f"TCP between the nodes {tcp_gbs:.3f} GB/s" + (
            f"; expected busbw for {expect.instance_type} unknown" if expect else "")
    else:
        return Verdict("WARN", f"peak busbw {peak:.3f} GB/s; nothing to compare with (no expectation, no TCP figure)")
    status: Status = "PASS" if peak >= want else "WARN" if peak >= want / 2 else "FAIL"
    detail = f"peak busbw {peak:.3f} GB/s vs {against}"
    return Verdict(status, detail, () if status == "PASS" else likely_causes(expect, nccl_log, gpu))


# ---------------------------------------------------------------- instance type (IMDSv2)


def instance_type_from_imds(endpoint: str | None = None, timeout: float = 1.0) -> str | None:
    """The EC2 instance type from instance metadata (IMDSv2: a session token, then the GET), or
    None off EC2. endpoint: default AWS_EC2_METADATA_SERVICE_ENDPOINT, else 169.254.169.254."""
    base = (endpoint or os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or "http://169.254.169.254").rstrip("/")
    try:
        req = urllib.request.Request(f"{base}/latest/api/token", method="PUT",
                                     headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            token = r.read().decode()
        req = urllib.request.Request(f"{base}/latest/meta-data/instance-type",
                                     headers={"X-aws-ec2-metadata-token": token})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read().decode().strip() or None
    except (urllib.error.URLError, OSError, ValueError):
        return None


# ---------------------------------------------------------------- the sweep as a job


def cpu_backend(family: str) -> str:
    """allreduce_bw.py's backend for an image family."""
    return {"pytorch-ddp": "torch", "horovod-pytorch": "hvd-torch", "horovod-tensorflow": "hvd-tf"}.get(family, "torch")


def sweep_command(*, gpu: bool, backend: str = "torch", min_bytes: int = MIN_BYTES, max_bytes: int = MAX_BYTES,
                  iters: int = 5, tcp_seconds: float = 2.0, tcp_streams: int = 1) -> list[str]:
    """The job's command: all_reduce_perf (one GPU per rank) or allreduce_bw.py."""
    if min_bytes < 4 or max_bytes < min_bytes:
        raise LaunchError(f"--max-bytes {max_bytes} must be >= --min-bytes {min_bytes} >= 4")
    if gpu:
        return [ALL_REDUCE_PERF, "-b", str(min_bytes), "-e", str(max_bytes), "-f", "2", "-g", "1",
                "-n", str(iters)]
    return ["python", f"{EX}/allreduce_bw.py", backend, "--min-bytes", str(min_bytes), "--max-bytes",
            str(max_bytes), "--iters", str(iters), "--tcp-seconds", f"{tcp_seconds:g}",
            "--tcp-streams", str(tcp_streams)]


@dataclass(frozen=True)
class Result:
    rows: list[SweepRow]
    tcp_gbs: float | None
    verdict: Verdict
    exit_code: int
    log: str


def run_sweep(spec, nodes: list[Node], *, gpu: bool = False, instance_type: str | None = None,
              say: Callable[[str], None] = print) -> Result:
    """Run spec (a JobSpec whose command is sweep_command(...)) as a job, parse its output, judge.
    NCCL_DEBUG=INFO is added for GPU sweeps (the verdict reads the provider and transport)."""
    from dtrain.launch.jobs.job import Job
    from dtrain.launch.jobs.store import job_log

    if gpu and "NCCL_DEBUG" not in spec.env:
        spec = replace(spec, env={**spec.env, "NCCL_DEBUG": "INFO"})
    job = Job(spec, nodes, say=say)
    code = job.run()
    log = job_log(job.spec.name).read_text()
    rows, tcp = parse_sweep(log), parse_tcp(log)
    itype = instance_type or instance_type_from_imds()
    v = verdict(rows, tcp, expectation_for(itype, load_expectations()), log, gpu)
    return Result(rows, tcp, v, code, log)


def report(result: Result) -> str:
    lines = [format_table(result.rows, result.tcp_gbs), "", f"{result.verdict.status}: {result.verdict.detail}"]
    for cid in result.verdict.causes:
        lines.append(f"  likely cause: docs/troubleshooting.md#{cid}")
    return "\n".join(lines)


def to_json(result: Result) -> str:
    return json.dumps({"rows": [r.__dict__ for r in result.rows], "tcp_gbs": result.tcp_gbs,
                       "status": result.verdict.status, "detail": result.verdict.detail,
                       "causes": list(result.verdict.causes)})


def family_of(image: str) -> str:
    """The image family a reference names (the tag spells the stack: .../dtrain/pytorch-ddp:...)."""
    name = image.rsplit("/", 1)[-1].split(":")[0].split("@")[0]
    return name


def bandwidth(nodes: list[Node], *, image: str, gpu: bool = False, launcher: str | None = None,
              max_bytes: int = MAX_BYTES, min_bytes: int = MIN_BYTES, iters: int = 5,
              tcp_seconds: float = 2.0, tcp_streams: int = 1, instance_type: str | None = None,
              env: dict[str, str] | None = None, iface: str | None = None,
              ssh_opts: tuple[str, ...] = (), name: str = "", extra_mca: tuple[tuple[str, str], ...] = (),
              say: Callable[[str], None] = print) -> Result:
    """The sweep as a job of `image` on `nodes`: all_reduce_perf under mpirun on GPU images;
    on CPU images allreduce_bw.py with the family's backend (torchrun for gloo, mpirun for
    Horovod) unless launcher says otherwise."""
    from dtrain.launch.jobs.config import LaunchConfig, job_spec

    backend = cpu_backend(family_of(image))
    launcher = launcher or ("mpirun" if gpu or backend != "torch" else "torchrun")
    if launcher not in launchers.names(supervised=True):
        raise LaunchError(f"--launcher {launcher}: use {launchers.choices(launchers.names(supervised=True))}")
    if gpu and not launchers.get(launcher).mpi_ranks:
        raise LaunchError(f"--launcher {launcher}: all_reduce_perf is an MPI program; use mpirun")
    command = sweep_command(gpu=gpu, backend=backend, min_bytes=min_bytes, max_bytes=max_bytes, iters=iters,
                            tcp_seconds=tcp_seconds, tcp_streams=tcp_streams)
    spec = job_spec(LaunchConfig(image=image, command=list(command), launcher=launcher, name=name, env=dict(env or {}),
                                 iface=iface, timeout=1800), ssh_opts=ssh_opts, extra_mca=tuple(extra_mca))
    return run_sweep(spec, nodes, gpu=gpu, instance_type=instance_type, say=say)


# ---------------------------------------------------------------- the quick check: the network gate


def quick(nodes: list[Node], *, image: str, iface: str | None = None, ssh_opts: tuple[str, ...] = (),
          instance_type: str | None = None, say: Callable[[str], None] = print) -> GateResult:
    """`doctor --bandwidth --quick`: the launch's network gate (launch/jobs/netgate.py) instead of
    the sweep: the image's containers started on every node as a launch starts them (Job.up),
    a few seconds of TCP streams between them, the containers always removed."""
    import shutil

    from dtrain.launch.jobs import store
    from dtrain.launch.jobs.config import LaunchConfig, job_spec
    from dtrain.launch.jobs.job import Job

    spec = job_spec(LaunchConfig(image=image, command=["true"], name=store.default_name("netgate"), iface=iface),
                    ssh_opts=ssh_opts, ready_timeout=20)
    job = Job(spec, nodes, say=lambda m: None)
    try:
        say(f"[doctor] starting {image} on {len(nodes)} node(s) for the network gate")
        started = job.up()
        return run_gate(job.ssh, started.facts, contract.container_name(job.spec.name), instance_type=instance_type)
    finally:
        job.teardown()
        shutil.rmtree(job.dir, ignore_errors=True)
