"""Launch benchmark on the simulated cluster: time from `dtrain launch` to all ranks running,
for 1, 2, 4 and 8 nodes, beside the two ways people do it by hand (image already on nodes):

- sequential: `while read host; do ssh $host docker run -d ... ; done` (one node after another)
- parallel:   the same `ssh host docker run -d` to every node at once, nothing else; once
              with ssh's defaults, once with the key exchange dtrain prefers (launch.hosts)

The dtrain columns are the whole launch: probe, pull check, containers, per-job keys, sshd
reachable node to node, and mpirun starting one rank per node (each rank prints its start
time; the slowest counts). Cold: no ssh connection to the nodes is open, as for the by-hand
loops. Warm: the ssh master connections a launch keeps for a minute are still open.

    python bench/bench_launch.py [--nodes 1,2,4,8] [--repeat 3]

--scale 8,16,32 measures instead what does not depend on the simulated nodes sharing this
machine's cores: the launcher's own CPU time (this process, and with its ssh children), the
ssh sessions it opens per node, and the warm launch beside the bare parallel fan-out. It
launches a slim copy of the image (below, `slim`), so that 32 nodes need not each unpack the
1.1 GB framework before anything can be timed; the launch path does not touch the framework.

    python bench/bench_launch.py --scale 8,16,32 [--repeat 3]

Each count's last warm launch's timeline (launch/analysis/timeline.py: seconds per node and phase,
`dtrain status --job`) is printed after its row, on stderr: where the launch's time goes.

--against REV compares the working tree's warm launch with git revision REV's (one with
launch/analysis/timeline.py, issue 25 on), interleaved to take the shared machine's drift out: per
round the bare parallel fan-out, then one warm launch of each revision, each from a fresh process
that imports that revision's code, the revisions' order turned each round (the second launch of
a round pays for the first's leftovers: both places are reported; --repeat is rounded up so that
each revision is first as often). Each revision launches the slim image with its own
launch/node/ in /opt/dtrain/node (entrypoint, standby, listeners); those images are removed at
the end. Each count's last launch of each revision shows its timeline on stderr. Beside the
seconds, each launch's machine CPU-seconds from its start to its ranks running (as --scale's,
the idle machine's share not taken off: the same for every revision).

    python bench/bench_launch.py --against REV [--nodes 2,8] [--repeat 6]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = Path(os.environ.get("BENCH_DTRAIN_TREE") or ROOT)  # --against: the revision a launch runs
sys.path.insert(0, str(CODE))

from dtrain.images import push as p  # noqa: E402
from dtrain.images.spec import load_all  # noqa: E402
from dtrain import engine  # noqa: E402
from dtrain.launch.infra import cluster  # noqa: E402
from dtrain.launch.remote.hosts import Node, kex_opts, parse_hostfile  # noqa: E402
from dtrain.launch.jobs.job import Job  # noqa: E402
from dtrain.launch.jobs.spec import JobSpec  # noqa: E402
from dtrain.launch.analysis import timeline  # noqa: E402
from dtrain.launch.jobs.store import job_log, load_job  # noqa: E402
from dtrain.launch.remote.transport import close_masters  # noqa: E402
from dtrain.table import markdown  # noqa: E402

FAMILY = "pytorch-ddp"


def ssh(info, host: str, cmd: str, opts: list[str] | None = None) -> None:
    subprocess.run(["ssh", "-F", info.ssh_config, *(opts or []), host, cmd], check=True, capture_output=True)


def by_hand(info, image: str, hosts: list[str], parallel: bool, fast_kex: bool = False) -> float:
    run = f"docker run -d --name bench-hand --network host {image} >/dev/null"
    # the key exchange order dtrain asks for (launch.hosts.kex_opts), for a like-for-like column
    opts = kex_opts(Node(hosts[0]), ["-F", info.ssh_config]) if fast_kex else []
    t0 = time.monotonic()
    if parallel:
        with ThreadPoolExecutor(len(hosts)) as ex:
            list(ex.map(lambda h: ssh(info, h, run, opts), hosts))
    else:
        for h in hosts:
            ssh(info, h, run, opts)
    seconds = time.monotonic() - t0
    with ThreadPoolExecutor(len(hosts)) as ex:
        list(ex.map(lambda h: ssh(info, h, "docker rm -f bench-hand >/dev/null"), hosts))
    return seconds


def dtrain(info, image: str, n: int, i: int | str, cold: bool) -> float:
    name = f"bench-{n}-{i}-{'cold' if cold else 'warm'}"
    nodes = parse_hostfile(info.hostfile)[:n]
    if cold:
        close_masters(nodes, ("-F", info.ssh_config))
    # --pull missing: the image is on every node, as in the by-hand runs beside it
    spec = JobSpec(image=image, command=("bash", "-c", "date +%s.%N"), name=name, pull="missing",
                   ssh_opts=("-F", info.ssh_config))
    t0 = time.time()
    code = Job(spec, nodes, say=lambda m: None).run()
    if code != 0:
        raise SystemExit(f"launch on {n} nodes failed: {job_log(name).read_text()[-2000:]}")
    # "[node-3 r2] 1795432513.275": each rank's line (not mpirun's own, such as a plm:rsh warning)
    starts = [float(m.group(1)) for m in re.finditer(r"^\[node-\d+ r\d+\] (\d+\.\d+)$", job_log(name).read_text(), re.M)]
    assert len(starts) == n, starts
    return max(starts) - t0


class _CountingPopen(subprocess.Popen):
    """subprocess.Popen that counts the ssh sessions started on nodes (`ssh -G`, which only
    reads the config, and `ssh -O`, which talks to a local master, are not counted)."""

    started: list[list[str]] = []

    def __init__(self, args, *a, **kw):
        if isinstance(args, (list, tuple)) and args and args[0] == "ssh" and not {"-G", "-O"} & set(args):
            _CountingPopen.started.append(list(args))
        super().__init__(args, *a, **kw)


def slim(image: str) -> str:
    """image without /opt/venv (the framework), flattened into one layer with its config
    (entrypoint, env, labels, port) kept: what a launch uses (the OS, sshd, Open MPI, the system
    python3 for the supervisor, /opt/dtrain) is all there. Tagged IMAGE-slim in this engine."""
    tag = f"{image}-slim"
    cfg = json.loads(subprocess.run(["docker", "image", "inspect", "--format", "{{json .Config}}", image],
                                    check=True, capture_output=True, text=True).stdout)
    changes = [f"ENV {e.partition('=')[0]}={json.dumps(e.partition('=')[2])}" for e in cfg.get("Env") or []]
    changes += [f"LABEL {k}={json.dumps(v)}" for k, v in (cfg.get("Labels") or {}).items()]
    changes += [f"EXPOSE {port}" for port in cfg.get("ExposedPorts") or {}]
    changes.append(f"ENTRYPOINT {json.dumps(cfg['Entrypoint'])}")
    cid = subprocess.run(["docker", "create", image], check=True, capture_output=True, text=True).stdout.strip()
    try:
        export = subprocess.Popen(["docker", "export", cid], stdout=subprocess.PIPE)
        imp = subprocess.Popen(["docker", "import", *(a for c in changes for a in ("--change", c)), "-", tag],
                               stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        assert export.stdout is not None and imp.stdin is not None
        with tarfile.open(fileobj=export.stdout, mode="r|") as src, \
                tarfile.open(fileobj=imp.stdin, mode="w|", format=tarfile.PAX_FORMAT) as dst:
            for m in src:
                if m.name != "opt/venv" and not m.name.startswith("opt/venv/"):
                    dst.addfile(m, src.extractfile(m) if m.isreg() else None)
        imp.stdin.close()
        if export.wait() or imp.wait():
            raise SystemExit(f"making {tag} failed (docker export/import)")
    finally:
        subprocess.run(["docker", "rm", cid], capture_output=True)
    return tag


def on_nodes(info, family: str, tag: str) -> str:
    """The local image FAMILY:TAG pushed to the cluster's registry and pulled onto every node
    (where not already there): its reference there."""
    from dtrain.launch.jobs.pull import pull_on_nodes

    image = p.push_registry([p.LocalImage(family, tag)], info.registry, out=lambda m: None)[0].remote
    pull_on_nodes(parse_hostfile(info.hostfile), image, "missing", ssh_opts=("-F", info.ssh_config),
                  out=open(os.devnull, "w"))
    return image


def shown_timeline(info, n: int, job: str) -> str:
    """The timeline of the bench's job on the first n nodes, as `dtrain status --job` shows it."""
    hosts = [x.host for x in parse_hostfile(info.hostfile)[:n]]
    return timeline.text(timeline.from_json(load_job(job).get("timeline")), hosts)


def _cpu() -> tuple[float, float]:
    """(this process's user+sys seconds, its waited-for children's)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def _mem_used_gib() -> float:
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    kib = lambda k: int(info[k].split()[0])  # noqa: E731
    return (kib("MemTotal") - kib("MemAvailable")) / 2**20


def machine_cpu() -> float:
    """CPU-seconds the whole machine has been busy (every process, kernel work included:
    /proc/stat's first line less idle and iowait)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = f
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def busy(fn) -> tuple[float, float]:
    """(CPU-seconds the machine spent while fn ran, wall seconds)."""
    c0, t0 = machine_cpu(), time.monotonic()
    fn()
    return machine_cpu() - c0, time.monotonic() - t0


def bare_cpu(info, image: str, hosts: list[str], idle: float) -> tuple[float, float]:
    """The bare parallel fan-out's machine CPU-seconds, less idle: (`docker run -d` on every
    node; that and the `docker rm -f` after it)."""
    run = f"docker run -d --name bench-hand --network host {image} >/dev/null"
    c0, t0 = machine_cpu(), time.monotonic()
    with ThreadPoolExecutor(len(hosts)) as ex:
        list(ex.map(lambda h: ssh(info, h, run), hosts))
    c1, t1 = machine_cpu(), time.monotonic()
    with ThreadPoolExecutor(len(hosts)) as ex:
        list(ex.map(lambda h: ssh(info, h, "docker rm -f bench-hand >/dev/null"), hosts))
    c2, t2 = machine_cpu(), time.monotonic()
    return c1 - c0 - idle * (t1 - t0), c2 - c0 - idle * (t2 - t0)


def warm_cpu(info, image: str, n: int, i: int | str, idle: float) -> tuple[float, float, float]:
    """A warm launch's machine CPU-seconds, less idle: (from its start until the last rank
    printed its start, cut from /proc/stat read every 5 ms beside it; start to teardown; and
    the launch's seconds to the ranks running)."""
    import threading

    samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append((time.time(), machine_cpu()))
            time.sleep(0.005)

    th = threading.Thread(target=sample, daemon=True)
    t0, c0 = time.time(), machine_cpu()
    th.start()
    seconds = dtrain(info, image, n, i, cold=False)
    stop.set()
    th.join()
    t2, c2 = time.time(), machine_cpu()
    ranks = t0 + seconds
    c1 = next((c for t, c in samples if t >= ranks), c2)
    t1 = next((t for t, _ in samples if t >= ranks), t2)
    return c1 - c0 - idle * (t1 - t0), c2 - c0 - idle * (t2 - t0), seconds


def background() -> float:
    """The machine's CPU-seconds per second with nothing launched (2 s)."""
    return busy(lambda: time.sleep(2))[0] / 2


def scale(counts: list[int], repeat: int) -> None:
    """Launcher CPU, ssh sessions per node, warm launch vs bare parallel ssh, at each count; the
    whole machine's CPU-seconds of a warm launch (to the last rank running; and start to
    teardown) and of the bare fan-out (`docker run -d` on every node; and then `docker rm -f`),
    less the idle machine's over as long."""
    rows = [("nodes", "launcher CPU (own)", "launcher CPU (+ssh clients)", "ssh sessions per node",
             "dtrain cold", "dtrain warm", "bare parallel ssh", "warm vs parallel", "memory used",
             "machine CPU-s: dtrain warm to ranks running", "machine CPU-s: bare run -d",
             "CPU-s, ranks running vs run -d", "machine CPU-s: dtrain warm start to teardown",
             "machine CPU-s: bare run -d + rm -f", "CPU-s, start to teardown vs run -d + rm -f")]
    mem0 = _mem_used_gib()
    for n in counts:
        info = cluster.up(n, recreate=True, quiet=True)
        engine.allow_insecure_registry(info.registry)
        img = next(i for i in load_all([FAMILY]) if not i.gpu)
        slim(p.local_ref(img))
        image = on_nodes(info, img.family, f"{img.tag}-slim")
        os.sync()
        dtrain(info, image, 1, 0, cold=True)  # warm-up
        runs: dict[str, list[float]] = {k: [] for k in ("own", "all", "ssh", "cold", "warm", "par", "cw", "cwr", "cb", "cr")}
        mem = 0.0
        for i in range(repeat):
            subprocess.Popen = _CountingPopen  # type: ignore[misc]  # fanout starts ssh via subprocess.Popen
            _CountingPopen.started.clear()
            own0, kids0 = _cpu()
            try:
                runs["cold"].append(dtrain(info, image, n, i, cold=True))
            finally:
                subprocess.Popen = _CountingPopen.__mro__[1]  # type: ignore[misc]
            own1, kids1 = _cpu()
            runs["own"].append(own1 - own0)
            runs["all"].append(own1 - own0 + kids1 - kids0)
            runs["ssh"].append(len(_CountingPopen.started) / n)
            mem = max(mem, _mem_used_gib())
            runs["warm"].append(dtrain(info, image, n, i, cold=False))
            runs["par"].append(by_hand(info, image, list(info.names[:n]), True))
            idle = background()
            to_ranks, cycle, _ = warm_cpu(info, image, n, f"{i}c", idle)
            runs["cw"].append(cycle)
            runs["cwr"].append(to_ranks)
            run_only, cycle = bare_cpu(info, image, list(info.names[:n]), idle)
            runs["cb"].append(cycle)
            runs["cr"].append(run_only)
            print(f"  {n} nodes, round {i + 1}: idle {idle:.2f} CPU-s/s; machine CPU-s: warm to ranks running "
                  f"{to_ranks:.2f}, warm start to teardown {runs['cw'][-1]:.2f}, "
                  f"bare run -d {run_only:.2f}, bare run -d + rm -f {cycle:.2f}", file=sys.stderr, flush=True)
        m = {k: statistics.median(v) for k, v in runs.items()}
        rows.append((str(n), f"{m['own']:.2f} s", f"{m['all']:.2f} s", f"{m['ssh']:.1f}", f"{m['cold']:.2f} s",
                     f"{m['warm']:.2f} s", f"{m['par']:.2f} s", f"{m['warm'] / m['par']:.2f}x",
                     f"{mem - mem0:+.1f} GiB", f"{m['cwr']:.2f}", f"{m['cr']:.2f}", f"{m['cwr'] / m['cr']:.2f}x",
                     f"{m['cw']:.2f}", f"{m['cb']:.2f}", f"{m['cw'] / m['cb']:.2f}x"))
        print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
        print(shown_timeline(info, n, f"bench-{n}-{repeat - 1}-warm"), file=sys.stderr, flush=True)
    print(markdown(rows))


def revision_tree(rev: str, dest: Path) -> tuple[str, Path]:
    """(REV's short hash, the checkout's REV unpacked into dest): git archive, no worktree left."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--short", f"{rev}^{{commit}}"],
                         capture_output=True, text=True)
    if sha.returncode:
        raise SystemExit(f"--against {rev}: not a revision of {ROOT}")
    dest.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", sha.stdout.strip()], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
    if archive.wait():
        raise SystemExit(f"--against {rev}: git archive failed")
    return sha.stdout.strip(), dest


def node_image(slim_ref: str, tree: Path, suffix: str) -> str:
    """slim_ref with tree's launch/node/ in /opt/dtrain/node: the image as that revision would
    have built it, as far as a launch can tell. Tagged SLIM_REF-SUFFIX in this engine."""
    tag = f"{slim_ref}-{suffix}"
    r = subprocess.run(["docker", "build", "-q", "-t", tag, "-f", "-", str(tree / "launch" / "node")],
                       input=f"FROM {slim_ref}\nCOPY . /opt/dtrain/node/\n", text=True, capture_output=True)
    if r.returncode:
        raise SystemExit(f"making {tag} failed: {r.stderr.strip()[-2000:]}")
    return tag


def one_launch(tree: Path, n: int, image: str, name: str) -> tuple[float, float, str]:
    """A warm launch of tree's code in a fresh process (this file, --one): its seconds, the
    machine's CPU-seconds from its start to its ranks running (warm_cpu, the idle machine's not
    taken off: the same for every revision) and its timeline. Stopped (Ctrl-C reaches it too; this process's SIGTERM is passed on), the launch
    is waited for: its teardown removes its containers and keys."""
    proc = subprocess.Popen([sys.executable, __file__, "--one", str(n), image, name],
                            env={**os.environ, "BENCH_DTRAIN_TREE": str(tree)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate()
    except BaseException:
        if not isinstance(sys.exc_info()[1], KeyboardInterrupt):
            proc.terminate()
        proc.communicate()
        raise
    if proc.returncode:
        raise SystemExit(f"launch of {tree} on {n} nodes failed:\n{out[-2000:]}{err[-2000:]}")
    seconds, cpu = out.split()[-2:]
    return float(seconds), float(cpu), err


def against(revs: list[str], counts: list[int], repeat: int) -> None:
    """The working tree beside each of revs, interleaved (module docstring, --against). The
    images it makes in this engine are removed at the end."""
    made: list[str] = []  # images made in this engine, removed at the end
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as tmp:
        trees = {"working tree": ("wt", ROOT)}
        for i, rev in enumerate(revs):
            sha, tree = revision_tree(rev, Path(tmp) / str(i))
            if sha in trees:
                raise SystemExit(f"--against {rev}: {sha} is given twice")
            trees[sha] = (sha, tree)
        if repeat % len(trees):
            repeat += len(trees) - repeat % len(trees)
            print(f"--repeat {repeat}: each revision first in a round as often as the others", file=sys.stderr)
        try:
            _against(trees, counts, repeat, made)
        finally:
            if made:
                subprocess.run(["docker", "image", "rm", *made], capture_output=True)


def _against(trees: dict[str, tuple[str, Path]], counts: list[int], repeat: int, made: list[str]) -> None:
    """against's rounds (trees: label -> (image suffix, code)); the images it makes go in made."""
    info = cluster.up(max(counts), recreate=True, quiet=True)
    engine.allow_insecure_registry(info.registry)
    img = next(i for i in load_all([FAMILY]) if not i.gpu)
    slim_ref = slim(p.local_ref(img))
    made.append(slim_ref)
    images = {}
    for label, (suffix, tree) in trees.items():
        made.append(node_image(slim_ref, tree, suffix))
        images[label] = on_nodes(info, img.family, f"{img.tag}-slim-{suffix}")
    os.sync()
    labels = list(trees)
    head = ["nodes", "rounds", "bare parallel ssh"]
    head += [f"{label}: warm (vs bare)" for label in labels]
    head += [f"{label}: range; first / later in a round" for label in labels]
    head += [f"{label}: machine CPU-s to ranks running (range)" for label in labels]
    rows = [tuple(head)]
    med = lambda xs: f"{statistics.median(xs):.2f} s" if xs else "-"  # noqa: E731
    for n in counts:
        for label in labels:  # masters up, caches warm: a launch of each before anything is timed
            one_launch(trees[label][1], n, images[label], f"w-{trees[label][0]}")
        bare: list[float] = []
        runs: dict[str, list[tuple[float, bool]]] = {label: [] for label in labels}
        cpus: dict[str, list[float]] = {label: [] for label in labels}
        shown: dict[str, str] = {}
        for i in range(repeat):
            bare.append(by_hand(info, images[labels[0]], list(info.names[:n]), True))
            order = labels[i % len(labels):] + labels[:i % len(labels)]
            for j, label in enumerate(order):
                seconds, cpu, shown[label] = one_launch(trees[label][1], n, images[label], f"r{i}-{trees[label][0]}")
                runs[label].append((seconds, j == 0))
                cpus[label].append(cpu)
            print(f"{n} nodes, round {i + 1}: bare {bare[-1]:.2f} s, "
                  + ", ".join(f"{label} {runs[label][-1][0]:.2f} s ({cpus[label][-1]:.2f} CPU-s)" for label in order),
                  file=sys.stderr, flush=True)
        for label in labels:
            print(f"{label}, its last launch on {n} nodes:\n{shown[label]}", file=sys.stderr, flush=True)
        b = statistics.median(bare)
        times = {label: [t for t, _ in runs[label]] for label in labels}
        row = [str(n), str(repeat), f"{b:.2f} s"]
        row += [f"{statistics.median(times[label]):.2f} s ({statistics.median(times[label]) / b:.2f}x)"
                for label in labels]
        row += [f"{min(times[label]):.2f}-{max(times[label]):.2f} s; "
                f"{med([t for t, first in runs[label] if first])} / {med([t for t, first in runs[label] if not first])}"
                for label in labels]
        row += [f"{statistics.median(cpus[label]):.2f} ({min(cpus[label]):.2f}-{max(cpus[label]):.2f})" for label in labels]
        rows.append(tuple(row))
    print(markdown(rows))


def one() -> None:
    """--one N IMAGE NAME: one warm launch of BENCH_DTRAIN_TREE's code; its seconds and the
    machine's CPU-seconds to its ranks running on stdout, its timeline on stderr."""
    import dtrain.launch.jobs.job as job_module

    n, image, name = int(sys.argv[2]), sys.argv[3], sys.argv[4]
    if not Path(job_module.__file__).resolve().is_relative_to(CODE.resolve()):
        raise SystemExit(f"--one: dtrain imported from {job_module.__file__}, not from {CODE}")
    info = cluster.status().info
    if info is None:
        raise SystemExit("--one: no simulated cluster is up")
    to_ranks, _, seconds = warm_cpu(info, image, n, name, 0.0)
    print(f"{seconds:.3f} {to_ranks:.3f}")
    print(shown_timeline(info, n, f"bench-{n}-{name}-warm"), file=sys.stderr)


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        return one()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout`: still take the cluster down
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="1,2,4,8")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--scale", help="node counts for the launcher-cost table instead, e.g. 8,16,32")
    ap.add_argument("--against", action="append", metavar="REV",
                    help="a git revision whose warm launch is timed beside the working tree's (repeatable)")
    args = ap.parse_args()
    if args.against:
        engine.ensure_dockerd()
        try:
            against(args.against, [int(x) for x in args.nodes.split(",")], args.repeat)
        finally:
            cluster.down(quiet=True)
        return
    if args.scale:
        engine.ensure_dockerd()
        try:
            scale([int(x) for x in args.scale.split(",")], args.repeat)
        finally:
            cluster.down(quiet=True)
        return
    counts = [int(x) for x in args.nodes.split(",")]
    engine.ensure_dockerd()
    info = cluster.up(max(counts), recreate=True, quiet=True)
    try:
        engine.allow_insecure_registry(info.registry)
        img = next(i for i in load_all([FAMILY]) if not i.gpu)
        image = p.push_registry([img], info.registry, out=lambda m: None)[0].remote
        with ThreadPoolExecutor(len(info.nodes)) as ex:  # image already on every node, as measured by hand
            list(ex.map(lambda h: ssh(info, h, f"docker pull -q {image} >/dev/null"), info.names))
        os.sync()  # the pulls wrote ~1 GiB per node: writeback would compete with what is timed
        dtrain(info, image, 1, 0, cold=True)  # warm-up
        rows = [("nodes", "sequential ssh loop", "bare parallel ssh", "dtrain cold (all ranks running)",
                 "cold vs parallel", "cold vs sequential", "dtrain warm", "warm vs parallel",
                 "bare parallel, dtrain's kex", "cold vs that")]
        for n in counts:
            hosts = list(info.names[:n])
            runs: dict[str, list[float]] = {k: [] for k in ("seq", "par", "fast", "cold", "warm")}
            for i in range(args.repeat):  # interleaved: a drift in the machine's speed hits all alike
                runs["seq"].append(by_hand(info, image, hosts, False))
                runs["par"].append(by_hand(info, image, hosts, True))
                runs["fast"].append(by_hand(info, image, hosts, True, fast_kex=True))
                runs["cold"].append(dtrain(info, image, n, i, cold=True))
                runs["warm"].append(dtrain(info, image, n, i, cold=False))
            seq, par, fast, cold, warm = (statistics.median(runs[k]) for k in ("seq", "par", "fast", "cold", "warm"))
            rows.append((str(n), f"{seq:.2f} s", f"{par:.2f} s", f"{cold:.2f} s", f"{cold / par:.2f}x",
                         f"{seq / cold:.2f}x faster", f"{warm:.2f} s", f"{warm / par:.2f}x",
                         f"{fast:.2f} s", f"{cold / fast:.2f}x"))
        print(markdown(rows))
    finally:
        cluster.down(quiet=True)


if __name__ == "__main__":
    main()
