"""Cold start on the simulated cluster: fresh nodes (no image, no layer) to the first step.

For each CPU image and node count, in one run, each measured after emptying the nodes:

- dtrain:  `dtrain launch`'s path as it is (Job.run, --pull always: its pull step with
           progress, launch/jobs/pull.py) running `python -c "import FRAMEWORK; print(time)"` on every rank; the time
           is until the last rank printed (the framework imported: its first step can start)
- by hand: parallel `ssh node 'docker pull IMAGE && docker run --network host IMAGE python -c ...'`
- floor:   the same blobs fetched and unpacked with standard tools on every node in parallel,
           `curl | gzip -d | tar -x`, 3 layers at a time (as dockerd), no run

once with the links as they are and once limited to --link-rate (tc, launch.infra.cluster).

    python bench/bench_coldstart.py [--families horovod-tensorflow,pytorch-ddp] [--nodes 1,2,4,8]
                                    [--repeat 3] [--link-rate 1gbit]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dtrain.images import build as b  # noqa: E402
from dtrain.images import push as p  # noqa: E402
from dtrain.images.spec import load_all  # noqa: E402
from dtrain import engine  # noqa: E402
from dtrain.launch.infra import cluster  # noqa: E402
from dtrain.launch.remote.hosts import parse_hostfile  # noqa: E402
from dtrain.launch.jobs.job import Job  # noqa: E402
from dtrain.launch.jobs.store import job_log  # noqa: E402
from dtrain.launch.jobs.spec import JobSpec  # noqa: E402
from dtrain.table import markdown  # noqa: E402

FRAMEWORK = {"horovod-tensorflow": "tensorflow", "horovod-pytorch": "torch", "pytorch-ddp": "torch"}
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
FLOOR_DIR = "/var/tmp/dtrain-floor"
WHEELS = Path("/opt/wheels")  # offered to pip first, as in tests/conftest.py  # on the node's disk, as Docker's data root is


def first_step(family: str) -> list[str]:
    return ["python", "-c", f"import time, {FRAMEWORK[family]}; print('step0', time.time())"]


def ssh(info, host: str, argv: list[str]) -> str:
    import shlex

    r = subprocess.run(["ssh", "-F", info.ssh_config, host, shlex.join(argv)], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{host}: {argv[:3]} failed: {r.stderr[-1000:]}")
    return r.stdout


def on_all(info, hosts: list[str], argv: list[str]) -> list[str]:
    with ThreadPoolExecutor(len(hosts)) as ex:
        return list(ex.map(lambda h: ssh(info, h, argv), hosts))


def empty_nodes(info, hosts: list[str]) -> None:
    on_all(info, hosts, ["bash", "-c", "docker ps -aq | xargs -r docker rm -f >/dev/null; "
                         f"docker image prune -af >/dev/null; rm -rf {FLOOR_DIR}; sync"])


def layers(image: str) -> list[tuple[str, int]]:
    registry, _, rest = image.partition("/")
    repo, _, tag = rest.rpartition(":")
    req = urllib.request.Request(f"http://{registry}/v2/{repo}/manifests/{tag}", headers={"Accept": MANIFEST_V2})
    with urllib.request.urlopen(req, timeout=10) as r:
        return [(x["digest"], x["size"]) for x in json.load(r)["layers"]]


def dtrain(info, image: str, family: str, n: int, name: str) -> float:
    spec = JobSpec(image=image, command=tuple(first_step(family)), name=name, pull="always",
                   ssh_opts=("-F", info.ssh_config), ready_timeout=600)
    t0 = time.time()
    code = Job(spec, parse_hostfile(info.hostfile)[:n], say=lambda m: None).run()
    if code != 0:
        raise SystemExit(f"launch on {n} nodes failed: {job_log(name).read_text()[-2000:]}")
    steps = [float(ln.rsplit(" ", 1)[1]) for ln in job_log(name).read_text().splitlines() if " step0 " in ln]
    assert len(steps) == n, steps
    return max(steps) - t0


def by_hand(info, image: str, family: str, hosts: list[str]) -> float:
    import shlex

    cmd = (f"docker pull -q {shlex.quote(image)} >/dev/null && "
           f"docker run --rm --network host {shlex.quote(image)} {shlex.join(first_step(family))}")
    t0 = time.time()
    outs = on_all(info, hosts, ["bash", "-c", cmd])
    return max(float(o.split()[-1]) for o in outs) - t0


def floor(info, image: str, hosts: list[str]) -> float:
    registry, _, rest = image.partition("/")
    repo = rest.rpartition(":")[0]
    urls = [f"http://{registry}/v2/{repo}/blobs/{d}" for d, _ in layers(image)]
    # each layer into a directory of its own (the unpacking work without overlay semantics),
    # under the node's name: the simulated nodes share this machine's /var/tmp
    script = (f'mkdir -p {FLOOR_DIR}/$(hostname) && printf "%s\\n" "$@" | xargs -P3 -I{{}} sh -c '
              f'\'d={FLOOR_DIR}/$(hostname)/$(basename "$1"); mkdir "$d" && curl -fsS "$1" | gzip -d | tar -x -C "$d"\' _ {{}}')
    t0 = time.monotonic()
    on_all(info, hosts, ["bash", "-c", script, "floor", *urls])
    return time.monotonic() - t0


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout`: still take the cluster down
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", default="horovod-tensorflow,pytorch-ddp")
    ap.add_argument("--nodes", default="1,2,4,8")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--link-rate", default="1gbit")
    args = ap.parse_args()
    counts = [int(x) for x in args.nodes.split(",")]
    engine.ensure_dockerd()
    info = cluster.up(max(counts), recreate=True, quiet=True)
    try:
        engine.allow_insecure_registry(info.registry)
        # the images as this checkout renders them (tags are shared with other checkouts)
        built = b.build(None, None, False, b.BuildOptions(
            base_image=engine.BASE_IMAGE, ca_bundle=b.default_ca_bundle(),
            wheelhouse=WHEELS if WHEELS.is_dir() else None), say=lambda m: None)
        for r in built:
            print(f"size {r.ref} {r.size} bytes ({r.size / 1e9:.2f} GB)", file=sys.stderr, flush=True)
        imgs = [i for i in load_all(args.families.split(",")) if not i.gpu]
        pushed = p.push_registry(imgs, info.registry, out=lambda m: None)
        rows = [("image", "compressed", "link", "nodes", "dtrain cold", "by hand pull+run", "floor (curl\\|gzip\\|tar)",
                 "dtrain / by hand", "dtrain / floor")]
        for r in pushed:
            family = r.entry["family"]
            size = sum(s for _, s in layers(r.remote))
            for rate in (None, args.link_rate):
                cluster.up(max(counts), quiet=True, link_rate=rate)
                for n in counts:
                    hosts = info.names[:n]
                    runs: dict[str, list[float]] = {"dtrain": [], "hand": [], "floor": []}
                    for i in range(args.repeat):  # interleaved: a drift in the machine's speed hits all alike
                        empty_nodes(info, hosts)
                        runs["dtrain"].append(dtrain(info, r.remote, family, n, f"cold-{family}-{n}-{i}-{rate}"))
                        empty_nodes(info, hosts)
                        runs["hand"].append(by_hand(info, r.remote, family, hosts))
                        empty_nodes(info, hosts)
                        runs["floor"].append(floor(info, r.remote, hosts))
                    d, h, f = (statistics.median(runs[k]) for k in ("dtrain", "hand", "floor"))
                    rows.append((family, f"{size / 2**20:.0f} MiB", rate or "unlimited", str(n), f"{d:.1f} s",
                                 f"{h:.1f} s", f"{f:.1f} s", f"{d / h:.2f}x", f"{d / f:.2f}x"))
                    print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
            empty_nodes(info, info.names)
        print(markdown(rows))
    finally:
        cluster.down(quiet=True)


if __name__ == "__main__":
    main()
