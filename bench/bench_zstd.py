"""Would zstd layers make a cold pull faster? Docker 23+ pulls them (20.10 cannot).

For each CPU image, pushed to the simulated cluster's registry as built (gzip layers) and
again as a copy with the same layers recompressed with `zstd -3` (an OCI manifest, the same
config, so the same image ID), a second dockerd of version 23 or later (--dockerd, with its
own data root under /var/tmp) in node-1's network namespace, emptied before every sample.
Not in the host's: a dockerd started with `--bridge none` deletes the `docker0` of the
namespace it runs in, which the host engine needs.

- gzip pull:   `docker pull IMAGE`, what a user pulls by hand
- zstd pull:   `docker pull IMAGE-zstd`
- docker load: `docker save` of the image (not timed), then `docker load`: the engine's
               extraction and registration with no download and no decompression, the
               least any path through this engine's layer store can take
- no pigz:     the gzip pull again, the engine restarted with MOBY_DISABLE_PIGZ=1: dockerd
               decompresses with Go's gzip, as on a node without pigz installed

This machine's own engine is Docker 20.10 (Debian 12). Debian 13's docker.io (26.1) runs here
with Debian 12's containerd and runc, unpacked rather than installed: Debian 13 (trixie)'s
package docker.io, version 26.1.5+dfsg1-9+deb13u1+b1, amd64, fetched with apt from a trixie
source list (or any Debian mirror's pool) and unpacked:

    dpkg -x docker.io_26.1.5+dfsg1-9+deb13u1+b1_amd64.deb /var/tmp/docker26
    python bench/bench_zstd.py --dockerd /var/tmp/docker26/usr/sbin/dockerd [--families pytorch-ddp] [--repeat 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dtrain.images import push as p  # noqa: E402
from dtrain.images.spec import load_all  # noqa: E402
from dtrain import engine  # noqa: E402
from dtrain.launch.infra import cluster  # noqa: E402
from dtrain.launch.infra import netns as nx  # noqa: E402
from dtrain.table import markdown  # noqa: E402

V2 = "application/vnd.docker.distribution.manifest.v2+json"
OCI = "application/vnd.oci.image.manifest.v1+json"
ZSTD_LAYER = "application/vnd.oci.image.layer.v1.tar+zstd"
STATE = Path("/var/tmp/dtrain-bench-zstd")


def _req(method: str, url: str, data: bytes | None = None, headers: dict[str, str] | None = None):
    return urllib.request.urlopen(urllib.request.Request(url, data=data, method=method, headers=headers or {}))


def push_zstd(remote: str, level: int = 3) -> tuple[str, int, int]:
    """Copy REGISTRY/REPO:TAG to REPO:TAG-zstd, every layer recompressed with zstd. Returns the
    new reference and the gzip and zstd byte counts."""
    registry, _, rest = remote.partition("/")
    repo, _, tag = rest.rpartition(":")
    base = f"http://{registry}/v2/{repo}"
    man = json.load(_req("GET", f"{base}/manifests/{tag}", headers={"Accept": V2}))
    layers = []
    for layer in man["layers"]:
        gz = _req("GET", f"{base}/blobs/{layer['digest']}").read()
        tar = subprocess.run(["gzip", "-dc"], input=gz, capture_output=True, check=True).stdout
        z = subprocess.run(["zstd", "-q", f"-{level}", "-T0", "-c"], input=tar, capture_output=True, check=True).stdout
        digest = "sha256:" + hashlib.sha256(z).hexdigest()
        loc = _req("POST", f"{base}/blobs/uploads/").headers["Location"]
        loc = loc if loc.startswith("http") else f"http://{registry}{loc}"
        _req("PUT", f"{loc}{'&' if '?' in loc else '?'}digest={digest}", data=z,
             headers={"Content-Type": "application/octet-stream"})
        layers.append({"mediaType": ZSTD_LAYER, "digest": digest, "size": len(z)})
    manifest = {"schemaVersion": 2, "mediaType": OCI, "layers": layers,
                "config": {**man["config"], "mediaType": "application/vnd.oci.image.config.v1+json"}}
    _req("PUT", f"{base}/manifests/{tag}-zstd", data=json.dumps(manifest).encode(), headers={"Content-Type": OCI})
    return f"{remote}-zstd", sum(x["size"] for x in man["layers"]), sum(x["size"] for x in layers)


class Engine:
    """A second dockerd with its own roots and socket, in a node's namespaces (``node``:
    a cluster NodeInfo); the host's engine is left alone."""

    def __init__(self, dockerd: str, registry: str, node, *, pigz: bool = True):
        shutil.rmtree(STATE, ignore_errors=True)
        STATE.mkdir(parents=True)
        (STATE / "daemon.json").write_text("{}")
        self.sock = f"unix://{STATE}/docker.sock"
        self.log = open(STATE / "dockerd.log", "w")
        argv = [dockerd, "--data-root", str(STATE / "data"), "--exec-root", str(STATE / "exec"), "-H", self.sock,
                "--pidfile", str(STATE / "docker.pid"), "--config-file", str(STATE / "daemon.json"),
                "--bridge", "none", "--iptables=false", "--ip6tables=false", "--userland-proxy=false",
                "--insecure-registry", registry]
        self.proc = subprocess.Popen(nx.node_argv(node.netns, node.name, argv), stdout=self.log,
                                     stderr=subprocess.STDOUT,
                                     env={**os.environ, **({} if pigz else {"MOBY_DISABLE_PIGZ": "1"})})
        deadline = time.monotonic() + 60
        while self.docker("version", check=False).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise SystemExit(f"--dockerd: {dockerd} did not start: see {STATE / 'dockerd.log'}")
            time.sleep(0.5)
        self.version = self.docker("version", "--format", "{{.Server.Version}}").stdout.strip()
        if int(self.version.split(".")[0]) < 23:
            self.stop()
            raise SystemExit(f"--dockerd: {dockerd} is Docker {self.version}; zstd layers need 23 or later")

    def docker(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["docker", "-H", self.sock, *args], check=check, capture_output=True, text=True)

    def timed(self, *args: str) -> float:
        t0 = time.monotonic()
        self.docker(*args)
        return time.monotonic() - t0

    def empty(self) -> None:
        ids = self.docker("images", "-aq").stdout.split()
        if ids:
            self.docker("rmi", "-f", *ids, check=False)
        self.docker("image", "prune", "-af", check=False)
        subprocess.run(["sync"], check=True)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(STATE, ignore_errors=True)


def sample(eng: Engine, gzip_ref: str, zstd_ref: str) -> dict[str, float]:
    res = {}
    eng.empty()
    res["gzip"] = eng.timed("pull", "-q", gzip_ref)
    eng.docker("save", "-o", str(STATE / "image.tar"), gzip_ref)
    eng.empty()
    res["zstd"] = eng.timed("pull", "-q", zstd_ref)
    eng.empty()
    res["load"] = eng.timed("load", "-q", "-i", str(STATE / "image.tar"))
    (STATE / "image.tar").unlink()
    eng.empty()
    return res


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout`: still take the cluster down
    ap = argparse.ArgumentParser()
    ap.add_argument("--dockerd", required=True, help="a dockerd binary of Docker 23 or later")
    ap.add_argument("--families", default="horovod-tensorflow,pytorch-ddp")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    engine.ensure_dockerd()
    info = cluster.up(1, recreate=True, quiet=True)  # for its registry
    eng = None
    try:
        engine.allow_insecure_registry(info.registry)
        imgs = [i for i in load_all(args.families.split(",")) if not i.gpu]
        pushed = p.push_registry(imgs, info.registry, out=lambda m: None)
        eng = Engine(args.dockerd, info.registry, info.nodes[0])
        meds, sizes = {}, {}
        for r in pushed:
            zref, *sizes[r.remote] = push_zstd(r.remote)
            runs = [sample(eng, r.remote, zref) for _ in range(args.repeat)]
            meds[r.remote] = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
        eng.stop()
        eng = Engine(args.dockerd, info.registry, info.nodes[0], pigz=False)
        for r in pushed:
            runs = []
            for _ in range(args.repeat):
                eng.empty()
                runs.append(eng.timed("pull", "-q", r.remote))
            meds[r.remote]["nopigz"] = statistics.median(runs)
        eng.empty()
        rows = [("image", "engine", "gzip bytes", "zstd bytes", "gzip pull", "zstd pull", "zstd / gzip",
                 "docker load", "load / gzip pull", "gzip pull, no pigz", "pigz / no pigz")]
        for r in pushed:
            med, (gz_bytes, z_bytes) = meds[r.remote], sizes[r.remote]
            rows.append((r.remote.rsplit("/", 1)[1], f"Docker {eng.version}", f"{gz_bytes / 2**20:.0f} MiB",
                         f"{z_bytes / 2**20:.0f} MiB", f"{med['gzip']:.1f} s", f"{med['zstd']:.1f} s",
                         f"{med['zstd'] / med['gzip']:.2f}x", f"{med['load']:.1f} s",
                         f"{med['load'] / med['gzip']:.2f}x", f"{med['nopigz']:.1f} s",
                         f"{med['gzip'] / med['nopigz']:.2f}x"))
        print(markdown(rows))
    finally:
        if eng:
            eng.stop()
        cluster.down(quiet=True)


if __name__ == "__main__":
    main()
