"""Where the time of a cold `docker pull` goes, on one idle simulated node.

For each CPU image (pushed to the cluster's registry), on node-1 with no image at all:

- pull:       `docker pull IMAGE` (dockerd 20.10: 3 downloads at a time, layers unpacked in order)
- download:   the same blobs over the same bridge, `curl` 3 at a time, written to the node's disk
- gunzip:     `gzip -dc` of every blob (Go's compress/gzip in dockerd is slower still)
- unpigz:     `unpigz -dc` of every blob, when pigz is installed (dockerd 20.10 uses it if on PATH)
- zstd -d:    the same layers recompressed with `zstd -3` (not timed), then `zstd -dc`
- tar -x:     the uncompressed layer tars extracted in order into a directory
- docker load: `docker save` of the pulled image (not timed), removed, then `docker load`:
              extraction plus layer registration, no download or decompression;
              registration = docker load - tar -x

    python bench/bench_pull_parts.py [--families horovod-tensorflow,pytorch-ddp] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dtrain.images import push as p  # noqa: E402
from dtrain.images.spec import load_all  # noqa: E402
from dtrain import engine  # noqa: E402
from dtrain.launch.infra import cluster  # noqa: E402
from dtrain.table import markdown  # noqa: E402

MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"


def on_node(script: str, *args: str, timeout: float = 600) -> tuple[float, str]:
    """Seconds and stdout of `bash -c script args` on node-1."""
    t0 = time.monotonic()
    r = cluster.node_exec(1, ["bash", "-c", script, "bench", *args], timeout=timeout)
    return time.monotonic() - t0, r.stdout


def clean_node() -> None:
    on_node('docker rm -f $(docker ps -aq) >/dev/null 2>&1; docker image prune -af >/dev/null; '
            'docker builder prune -af >/dev/null 2>&1; sync; true')


def layers(registry: str, repo: str, tag: str) -> list[tuple[str, int]]:
    _, out = on_node('curl -fsS -H "Accept: $1" "http://$2/v2/$3/manifests/$4"', MANIFEST_V2, registry, repo, tag)
    return [(layer["digest"], layer["size"]) for layer in json.loads(out)["layers"]]


def parts(info, image: str, work: Path) -> dict[str, float]:
    registry, _, rest = image.partition("/")
    repo, _, tag = rest.rpartition(":")
    blobs = layers(registry, repo, tag)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    res: dict[str, float] = {"bytes": sum(s for _, s in blobs)}
    clean_node()
    res["pull"], _ = on_node('docker pull -q "$1" >/dev/null', image)
    on_node('docker save "$1" -o "$2"', image, str(work / "image.tar"))
    clean_node()
    res["load"], _ = on_node('docker load -q -i "$1" >/dev/null', str(work / "image.tar"))
    clean_node()
    (work / "image.tar").unlink()
    urls = "".join(f"http://{registry}/v2/{repo}/blobs/{d} {work}/{i}.gz\n" for i, (d, _) in enumerate(blobs))
    (work / "urls").write_text(urls)
    res["download"], _ = on_node('xargs -P3 -n2 sh -c \'curl -fsS -o "$1" "$0"\' < "$1"; sync', str(work / "urls"))
    n = len(blobs)
    each = f'for i in $(seq 0 {n - 1}); do'
    res["gunzip"], _ = on_node(f'{each} gzip -dc "$1/$i.gz" >/dev/null; done', str(work))
    if shutil.which("unpigz"):
        res["unpigz"], _ = on_node(f'{each} unpigz -dc "$1/$i.gz" >/dev/null; done', str(work))
    on_node(f'{each} gzip -dc "$1/$i.gz" > "$1/$i.tar"; zstd -q -3 -T0 "$1/$i.tar" -o "$1/$i.zst"; rm "$1/$i.gz"; done; sync',
            str(work))
    res["zstd"], _ = on_node(f'{each} zstd -dc "$1/$i.zst" >/dev/null; done', str(work))
    res["tar"], _ = on_node(f'mkdir "$1/root"; {each} tar -xf "$1/$i.tar" -C "$1/root"; done; sync', str(work))
    shutil.rmtree(work, ignore_errors=True)
    return res


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout`: still take the cluster down
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", default="horovod-tensorflow,pytorch-ddp")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    families = args.families.split(",")
    engine.ensure_dockerd()
    info = cluster.up(1, recreate=True, quiet=True)
    try:
        engine.allow_insecure_registry(info.registry)
        imgs = [i for i in load_all(families) if not i.gpu]
        pushed = p.push_registry(imgs, info.registry, out=lambda m: None)
        work = Path(info.nodes[0].state_dir) / "bench-pull"
        rows = [("image", "compressed", "docker pull", "download", "gunzip", "unpigz", "zstd -d",
                 "tar -x", "docker load", "registration (load - tar)")]
        for r in pushed:
            runs = [parts(info, r.remote, work) for _ in range(args.repeat)]
            med = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
            s = lambda k: f"{med[k]:.1f} s" if k in med else "n/a"  # noqa: E731
            rows.append((r.remote.rsplit("/", 1)[1], f"{med['bytes'] / 2**20:.0f} MiB", s("pull"), s("download"),
                         s("gunzip"), s("unpigz"), s("zstd"), s("tar"), s("load"),
                         f"{med['load'] - med['tar']:.1f} s"))
        print(markdown(rows))
    finally:
        cluster.down(quiet=True)


if __name__ == "__main__":
    main()
