"""`dtrain doctor`: the troubleshooting checklist as checks, run on every node in parallel.

Two passes. The host pass (one ssh per node) reads what a launch depends on: engine, GPUs
and driver, NVIDIA runtime, port 2022, the NIC, hostname, image, disk, clock, EFA. With an
image, the container pass starts a short-lived container per node exactly as `dtrain launch`
does and checks from inside: every peer's sshd on 2022, /dev/shm, memlock. Containers are
removed afterwards, whatever happened. `evaluate` is pure: facts in, rows out.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass
from typing import Callable, Literal, Sequence

from dtrain import contract, table
from dtrain.contract import container_name
from dtrain.launch.jobs import container, nic, node_programs, store
from dtrain.launch.remote.hosts import Node
from dtrain.launch.jobs.config import LaunchConfig, job_spec
from dtrain.launch.jobs.job import Job, driver_too_old, parse_probe
from dtrain.launch.remote.transport import SshTransport
from dtrain.launch.infra import instance_types
from dtrain.launch.infra.instance_types import efa_count
from dtrain.launch.troubleshoot import checklist

from dtrain.launch.errors import LaunchError

Status = Literal["PASS", "WARN", "FAIL"]
CHECKS = ("ssh", "docker", "lazy-load", "gpu-driver", "nvidia-runtime", "port-2022", "nic", "hostnames",
          "image-digest", "disk", "clock", "efa", "peer-2022", "shm", "memlock")

SHM_MIN_KB = 1024 * 1024  # 1 GiB: NCCL and DataLoader workers use /dev/shm
SHM_FAIL_KB = 256 * 1024
CLOCK_WARN_S, CLOCK_FAIL_S = 1.0, 5.0


@dataclass(frozen=True)
class Row:
    node: str
    check: str
    status: Status
    detail: str


@dataclass(frozen=True)
class Options:
    image: str | None = None
    iface: str | None = None
    shm_size: str | None = None  # as `dtrain launch --shm-size`; None: --ipc host
    min_free_gb: float = 10.0  # free space wanted on Docker's data root besides the image
    ssh_opts: tuple[str, ...] = ()
    job: str = ""  # port 2022 held by this job's container is fine


def host_argv(image: str | None) -> list[str]:
    """The host pass on one node: launch/node/host/doctor.sh (the launch's probe, then what only
    the doctor asks)."""
    return node_programs.host_argv("doctor", str(contract.SSH_PORT), *([image] if image else []))


def image_labels(text: str | None) -> dict[str, str]:
    """`docker image inspect -f '{{json .Config.Labels}}'` output as a dict: an image built
    elsewhere has no labels (`null`) or not ours; both mean "nothing known", not an error."""
    try:
        labels = json.loads(text or "{}")
    except json.JSONDecodeError:
        return {}
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


# ---------------------------------------------------------------- pure evaluation


def evaluate(nodes: Sequence[Node], host: dict[str, dict[str, str]], ssh_errors: dict[str, str],
             clock_skew: dict[str, float], containers: dict[str, dict[str, str]] | None,
             opts: Options) -> list[Row]:
    """Facts per node (host: parse_probe output; containers: container pass output, or None
    when it did not run) -> one row per node and check."""
    rows: list[Row] = []
    add = lambda n, c, s, d: rows.append(Row(n, c, s, d))  # noqa: E731
    reachable = [n.host for n in nodes if n.host not in ssh_errors]

    # NIC: the interface of each node's address; one name and one MTU on all nodes.
    nic_of: dict[str, tuple[str, int]] = {}
    for h in reachable:
        f = host[h]
        try:
            ifaces = json.loads(f.get("ipjson") or "[]")
            name = opts.iface or nic.interface_for_address(f.get("ipjson", ""), f.get("addr") or h, host=h)
            iface = next((i for i in ifaces if i.get("ifname") == name), None)
            nic_of[h] = (name, int(iface.get("mtu", 0)) if iface else -1)
        except Exception as e:  # noqa: BLE001 - a node's odd output is that node's FAIL
            nic_of[h] = (f"error: {e}", 0)
    names = {v[0] for v in nic_of.values()}
    shared, shared_error = None, ""
    if len(names) > 1 and not any(n.startswith("error") for n in names):
        try:  # nodes whose NICs are named differently work where they share a subnet
            shared = nic.tcp_include({h: (nic_of[h][0], host[h].get("addr") or h, nic.interface_network(
                host[h].get("ipjson", ""), host[h].get("addr") or h, host=h)) for h in nic_of})
        except LaunchError as e:
            shared_error = str(e)
    mtus = {v[1] for v in nic_of.values()}
    hostnames = [host[h].get("hostname", "") for h in reachable]

    digests = {h: host[h].get("image_id", "") for h in reachable} if opts.image else {}
    common = max(set(digests.values()) - {""}, key=list(digests.values()).count, default="")

    for n in nodes:
        h = n.host
        if h in ssh_errors:
            add(h, "ssh", "FAIL", ssh_detail(ssh_errors[h]))
            continue
        f = host[h]
        add(h, "ssh", "PASS", f"reached {f.get('hostname', h)} ({f.get('addr') or h})")
        docker_ok = f.get("docker") == "ok"
        engine = f"engine {f.get('docker_info', '').split('|')[0]}"
        if not docker_ok:
            add(h, "docker", "FAIL", f"engine not answering: {f.get('docker') or 'no answer'}")
        elif f.get("unpigz") == "":  # absent from older output: not known, not missing
            add(h, "docker", "WARN", f"{engine}; no unpigz on the node, so dockerd decompresses image layers "
                "with Go's gzip: cold pulls 1.4-1.5x slower (install pigz)")
        else:
            add(h, "docker", "PASS", engine)
        if docker_ok:
            add(h, "lazy-load", *lazy_verdict(f.get("docker_info", "")))
        else:
            add(h, "lazy-load", "FAIL", "engine not answering")

        labels = image_labels(f.get("image_labels")) if opts.image else {}
        gpus, driver = int(f.get("gpus") or 0), f.get("driver", "")
        need = labels.get(contract.LABEL_MIN_DRIVER, "")
        if labels.get(contract.LABEL_KIND) == "gpu" and not gpus:
            add(h, "gpu-driver", "FAIL", f"GPU image (needs driver >= {need}) but no NVIDIA GPU/driver here")
        elif gpus and driver_too_old(driver, need):
            add(h, "gpu-driver", "FAIL", f"driver {driver} < {need}, the image's CUDA minimum")
        elif gpus:
            add(h, "gpu-driver", "PASS", f"{gpus} GPU(s), driver {driver}" + (f" >= {need}" if need else ""))
        else:
            add(h, "gpu-driver", "PASS", "no NVIDIA GPU; CPU image" if opts.image else "no NVIDIA GPU")

        runtimes = f.get("docker_info", "").split("|")[1] if "|" in f.get("docker_info", "") else ""
        if gpus and "nvidia" not in runtimes:
            add(h, "nvidia-runtime", "FAIL", "GPUs present but Docker has no nvidia runtime "
                "(install nvidia-container-toolkit, then `nvidia-ctk runtime configure`)")
        else:
            add(h, "nvidia-runtime", "PASS", "nvidia runtime present" if gpus else "not needed: no GPUs")

        port, jobs = f.get("port", ""), f.get("port_jobs", "").split()  # jobs: only when taken
        if not port:
            add(h, "port-2022", "PASS", "free")
        elif opts.job and opts.job in jobs:
            add(h, "port-2022", "PASS", f"held by job {opts.job}'s container")
        else:
            add(h, "port-2022", "FAIL", f"taken: {port}" + (f" (dtrain jobs running: {' '.join(jobs)})" if jobs else ""))

        name, mtu = nic_of.get(h, ("?", 0))
        if name.startswith("error"):
            add(h, "nic", "FAIL", name)
        elif len(mtus) > 1 or (len(names) > 1 and not shared):
            others = ", ".join(f"{k}={v[0]}/mtu {v[1]}" for k, v in nic_of.items())
            add(h, "nic", "FAIL", f"{name} mtu {mtu}; nodes differ: {others}" + (f" ({shared_error})" if shared_error else ""))
        elif len(names) > 1:  # launch handles it: Open MPI by subnet, NCCL/Gloo per node
            add(h, "nic", "WARN", f"{name} mtu {mtu}; NIC names differ ({', '.join(sorted(names))}): mpirun and "
                f"torchrun use subnet {shared} and each node's own NIC; horovodrun needs one name")
        else:
            add(h, "nic", "PASS", f"{name} mtu {mtu}")

        hn = f.get("hostname", "")
        add(h, "hostnames", "FAIL" if hostnames.count(hn) > 1 else "PASS",
            f"{hn} is also the hostname of another node: Open MPI needs one per node"
            if hostnames.count(hn) > 1 else f"{hn} (unique)")

        if opts.image:
            d = digests.get(h, "")
            if not d:
                add(h, "image-digest", "WARN", f"{opts.image} not on this node yet (launch pulls it)")
            elif d != common:
                add(h, "image-digest", "FAIL", f"{d[:19]} differs from the other nodes' {common[:19]}")
            else:
                add(h, "image-digest", "PASS", d[:19])
        else:
            add(h, "image-digest", "WARN", "skipped: give --image")

        free_gb = int(f.get("disk_kb") or 0) / 1024**2
        image_gb = int(f.get("image_size") or 0) / 1024**3 if not digests.get(h) else 0.0
        want = opts.min_free_gb + image_gb
        add(h, "disk", "PASS" if free_gb >= want else "FAIL",
            f"{free_gb:.1f} GiB free on Docker's data root (want {want:.1f})")

        skew = clock_skew.get(h, 0.0)
        status: Status = "FAIL" if abs(skew) > CLOCK_FAIL_S else "WARN" if abs(skew) > CLOCK_WARN_S else "PASS"
        ntp = {"yes": ", NTP synchronised", "no": ", NTP not synchronised"}.get(f.get("ntp", ""), "")
        add(h, "clock", status, f"{skew:+.2f} s from this machine{ntp}")

        itype, efa = f.get("instance_type", ""), f.get("efa", "").split()
        add(h, "efa", *efa_image_verdict(efa_verdict(itype, len(efa), (containers or {}).get(h, {}).get("fi_efa")),
                                          labels, itype, len(efa)))

        c = (containers or {}).get(h)
        if containers is None:
            for check in ("peer-2022", "shm", "memlock"):
                add(h, check, "WARN", "skipped: give --image")
            continue
        if c is None:
            for check in ("peer-2022", "shm", "memlock"):
                add(h, check, "FAIL", "no container could run on this node (see the failures above)")
            continue
        bad = {k[5:]: v for k, v in c.items() if k.startswith("peer ") and v != "ok"}
        npeers = sum(1 for k in c if k.startswith("peer "))
        add(h, "peer-2022", "FAIL" if bad else "PASS",
            "; ".join(f"{p}: {v}" for p, v in bad.items()) if bad else f"ssh -p 2022 to all {npeers} node(s)")
        shm = int(c.get("shm_kb") or 0)
        add(h, "shm", "FAIL" if shm < SHM_FAIL_KB else "WARN" if shm < SHM_MIN_KB else "PASS",
            f"/dev/shm {shm // 1024} MiB" + ("" if shm >= SHM_MIN_KB else " (want >= 1024 MiB: --ipc host or --shm-size)"))
        lock = c.get("memlock", "")
        if lock == "unlimited":
            add(h, "memlock", "PASS", "unlimited")
        else:
            add(h, "memlock", "FAIL" if efa else "WARN",
                f"{lock} KiB, not unlimited" + (": EFA will fail to register memory" if efa else
                                               "; fine without EFA"))
    return rows


def lazy_verdict(docker_info: str) -> tuple[Status, str]:
    """Whether the node loads images lazily: its storage driver (docker_info's 4th field) is
    the SOCI snapshotter (Docker on the containerd image store; `dtrain cluster up` by default).
    Either way a PASS: a node that cannot pulls in full, as always."""
    fields = docker_info.split("|")
    driver = fields[3] if len(fields) >= 4 else ""
    if driver == "soci":
        return "PASS", (f"can lazy-load: storage driver soci (Docker {fields[0]} on the containerd image store); "
                        "images `dtrain push` indexed start before they are all there")
    return "PASS", (f"full pulls: storage driver {driver or 'unknown'}, no SOCI snapshotter (lazy loading off: a node "
                    "made with --no-lazy, or whose apt had no soci-snapshotter)")


def efa_image_verdict(verdict: tuple[Status, str], labels: dict[str, str], itype: str,
                      devices: int) -> tuple[Status, str]:
    """The `efa` check with `--image`: a GPU image without the EFA stage (label dtrain.efa=no: the
    variants built from PyPI's CUDA wheels) on a type with several EFA interfaces (p4d, p5: the
    type's expectation, instance_types.efa_count, or the devices the node has) is a WARN naming the
    family's EFA variant for the type (NCCL finds no aws-ofi-nccl and runs over TCP sockets). On a
    single-EFA type (g4dn/g5/g6, p3dn) the wheel variant is the documented choice: the node's
    verdict stands, with a note. A FAIL stays."""
    if verdict[0] == "FAIL" or labels.get(contract.LABEL_KIND) != "gpu" or labels.get(contract.LABEL_EFA) != "no":
        return verdict
    want = efa_count(itype) or 0
    if max(want, devices) < 2:  # no EFA, or one interface (g4dn/g5/g6, p3dn): the wheel variant's place
        return verdict if not (want or devices) else (
            verdict[0], verdict[1] + "; the image has no EFA stage (dtrain.efa=no): NCCL runs over TCP on this "
            "single-EFA node, as docs/images.md#which-variant advises for it")
    from dtrain.images.spec import SpecError, efa_variant

    family = labels.get("dtrain.family", "")
    try:
        use = efa_variant(family, itype)
    except SpecError:
        use = None
    where = f"{itype} has EFA" if efa_count(itype) else f"{devices} EFA device(s) here"
    return "WARN", (f"{where}, but the image has no EFA stage (dtrain.efa=no; CUDA from "
                    f"{labels.get(contract.LABEL_CUDA_FROM, '?')}): NCCL runs over TCP sockets; use "
                    + (use or f"a {family or 'dtrain'} variant with EFA") + " (docs/images.md#which-variant)"
                    + (f"; and {verdict[1]}" if verdict[0] == "WARN" else ""))


def efa_verdict(itype: str, devices: int, fi_efa: str | None = None) -> tuple[Status, str]:
    """The `efa` check: EFA devices on the node (/dev/infiniband/uverbs*) against what the
    instance type has (instance_types.efa_count: one per network card), and, from the
    container pass, how many libfabric's EFA provider sees there (`fi_info -p efa`: what NCCL's
    aws-ofi-nccl can use; None: no container pass, "": no fi_info in the image)."""
    want = efa_count(itype) if itype else 0
    if want is None:  # a type dtrain's data lacks: said, not taken for one without EFA
        return "PASS", f"{devices} EFA device(s); {instance_types.missing(itype)}"
    if not want and not devices:
        return "PASS", f"no EFA: not an EFA instance type ({itype or 'not EC2'})"
    if want and not devices:
        return "FAIL", f"{itype} supports EFA but no /dev/infiniband/uverbs* (attach an EFA interface)"
    fi = fi_efa.strip() if fi_efa is not None else None
    seen = "" if fi is None else f"; libfabric in the container (fi_info -p efa) sees {fi}" if fi.isdigit() \
        else "; no fi_info in the image"
    if want and devices < want:
        return "WARN", (f"{devices} of the {want} EFA devices {itype} has: the launch attached fewer interfaces "
                        f"than network cards, NCCL gets about {devices}/{want} of the bandwidth "
                        f"(docs/troubleshooting.md#efa-fewer){seen}")
    if fi and fi.isdigit() and int(fi) < devices:
        return "WARN", (f"{devices} EFA device(s) on the node, but libfabric in the container (fi_info -p efa) "
                        f"sees {fi}: NCCL uses only those (docs/troubleshooting.md#efa-unused)")
    return "PASS", f"{devices} EFA device(s)" + (f" ({itype} has {want})" if want else "") + seen


def entries_for(check: str) -> list[checklist.Entry]:
    return [e for e in checklist.ENTRIES if check in e.doctor_checks and not e.catch_all]


REFUSED = "connection refused"
_REFUSED_RE = re.compile(r"connect to host (\S+) port (\d+): Connection refused")


UNREACHABLE = "no route"
_UNREACHABLE_RE = re.compile(r"connect to host (\S+) port \d+: (Network is unreachable|No route to host|"
                            r"Connection timed out|Operation timed out)")


def ssh_detail(error: str) -> str:
    """The ssh row of a node the host pass could not reach. A refused connection (nothing
    listens on the port: no sshd, or another port) is its own result, said as such: no key or
    its modes is at fault there; so is no route to the node (connectivity: neither the port
    nor a key)."""
    u = _UNREACHABLE_RE.search(error)
    if u:
        return (f"{UNREACHABLE}: {u[2]} to {u[1]} from this machine; check its route to the node (ip route get "
                f"{u[1]}), the VPC/VPN, the security group, and that {u[1]} is an address reachable from here "
                "(a public one from outside the VPC)")
    m = _REFUSED_RE.search(error)
    if not m:
        return error
    return (f"{REFUSED}: nothing listens on {m[1]} port {m[2]}; is sshd running on the node, "
            f"and is {m[2]} its port (hostfile port=N, --ssh-opt Port=N)?")


def causes(check: str, details: Sequence[str]) -> list[str]:
    """The lines under `CHECK FAILED`: the checklist entries that can explain the failing rows'
    details; a refused connection is explained by itself, not by the check's entries."""
    lines = []
    if any(d.startswith(REFUSED) for d in details):
        lines.append(f"  {REFUSED} (not a key problem): start sshd on the node, or give the port it listens on")
    if any(d.startswith(UNREACHABLE) for d in details):
        lines.append(f"  {UNREACHABLE} (connectivity, not the port or a key): #ssh-no-route")
    if any(not d.startswith((REFUSED, UNREACHABLE)) for d in details):
        lines += [f"  #{e.id}: {e.title}" for e in entries_for(check) if e.id != "ssh-no-route"]
    return lines


def format_table(rows: Sequence[Row]) -> str:
    order = {c: i for i, c in enumerate(CHECKS)}
    rows = sorted(rows, key=lambda r: (r.node, order.get(r.check, 99)))
    out = [table.text([("node", "check", "status", "detail"),
                       *[(r.node, r.check, r.status, r.detail) for r in rows]])]
    failed = sorted({r.check for r in rows if r.status == "FAIL"}, key=lambda c: order.get(c, 99))
    for check in failed:
        out.append(f"\n{check} FAILED: see docs/troubleshooting.md")
        out += causes(check, [r.detail for r in rows if r.check == check and r.status == "FAIL"])
    counts = {s: sum(r.status == s for r in rows) for s in ("PASS", "WARN", "FAIL")}
    out.append(f"\n{counts['PASS']} passed, {counts['FAIL']} failed, {counts['WARN']} warnings")
    return "\n".join(out)


# ---------------------------------------------------------------- running it


def run(nodes: list[Node], opts: Options, say: Callable[[str], None] = print) -> list[Row]:
    ssh = SshTransport(nodes, opts.ssh_opts, multiplex=False)
    sent = time.time()
    results = ssh.run(nodes, lambda n: host_argv(opts.image), timeout=60, retries=1)
    host: dict[str, dict[str, str]] = {}
    errors: dict[str, str] = {}
    skew: dict[str, float] = {}
    for n, r in zip(nodes, results):
        if not r.ok and "docker=" not in r.stdout:
            errors[n.host] = r.error or "no answer"
            continue
        host[n.host] = parse_probe(r.stdout)
        # The node read its clock between sending and receiving: compare with the midpoint.
        remote = float(host[n.host].get("t") or 0)
        midpoint = sent + r.seconds / 2
        skew[n.host] = remote - midpoint if remote else 0.0
        if abs(skew[n.host]) < r.seconds / 2:  # within the measurement's own uncertainty
            skew[n.host] = 0.0
    containers = None
    if opts.image:
        containers = _container_pass(nodes, host, errors, opts, say)
    return evaluate(nodes, host, errors, skew, containers, opts)


def _container_pass(nodes: list[Node], host: dict[str, dict[str, str]], errors: dict[str, str],
                    opts: Options, say: Callable[[str], None]) -> dict[str, dict[str, str]]:
    """Start the image on every node whose engine answers and whose port is free, with the
    launch's own step (Job.up); check from inside; always remove the containers."""
    usable = [n for n in nodes if n.host not in errors and host[n.host].get("docker") == "ok"
              and not host[n.host].get("port")]
    if not usable:
        return {}
    name = store.default_name("doctor")
    spec = job_spec(LaunchConfig(image=opts.image, command=["true"], name=name, iface=opts.iface,
                                 shm_size=opts.shm_size), ssh_opts=opts.ssh_opts, ready_timeout=20)
    job = Job(spec, usable, say=lambda m: None)
    out: dict[str, dict[str, str]] = {}
    try:
        say(f"[doctor] starting {opts.image} on {len(usable)} node(s) for the in-container checks")
        try:
            started = job.up()
        finally:
            # Labels (GPU kind, min driver) of an image that was not on a node before the pull,
            # also where no container could start; the digest check keeps what the node held before.
            labels = job.ssh.run(usable, lambda n: ["docker", "image", "inspect", "-f", "{{json .Config.Labels}}",
                                                    opts.image or ""], timeout=60)
            for n, r in zip(usable, labels):
                if r.ok and not image_labels(host[n.host].get("image_labels")):
                    host[n.host]["image_labels"] = r.stdout.strip()
        check = ["docker", "exec", container_name(name), *node_programs.container_argv(
            "doctor-container.sh", [*container.doctor_ssh(), "--", *(f.address for f in started.facts)])]
        results = job.ssh.run(usable, lambda n: check, timeout=120, retries=1)
        for n, r in zip(usable, results):
            if r.ok:
                out[n.host] = {k: v for line in r.stdout.splitlines()
                               for k, sep, v in [line.partition("=")] if sep}
    except Exception as e:  # noqa: BLE001 - reported per node below, never half-done
        say(f"[doctor] container checks could not run: {e}")
    finally:
        job.teardown()
        shutil.rmtree(job.dir, ignore_errors=True)
    return out
