"""Cold start as the user sees it (issue 42): `dtrain launch` on fresh lazy nodes against the
by-hand `docker pull && docker run` on fresh ordinary nodes, same image, same first step.

Every sample starts from a fresh simulated cluster of N nodes: `dtrain cluster up --nodes N
--lazy` (launch/node/lazy-node.sh: soci-snapshotter-grpc, containerd, dockerd 26) for the lazy
side, `dtrain cluster up --nodes N` (dockerd 20.10, the classic store) for the by-hand side. The
image is pushed once, with its SOCI index (`dtrain push --soci`'s code), and the registry's files
are put back (hard links) into each fresh cluster's registry, so no sample pays for a push.

- lazy, dtrain:  `dtrain launch --hostfile H --ssh-config S --image REF -- FIRST_STEP`, a process
                 of its own, as the user runs it (its pull step, digest check, containers, sshd,
                 the supervisor); the time from starting it until every node printed its first step
- by hand:       parallel `ssh node 'docker pull -q REF && docker run --rm --network host REF
                 FIRST_STEP'` on the ordinary nodes; until every node printed
- floor:         the image's compressed bytes at the link rate (a full pull's floor; "-" unlimited)
- bytes/node:    what each node's link carried from the start until the job ended (veth counters)

A sample that fails is said on stderr (`RETRIED: ...`, with the launch's output) and taken once
more on fresh nodes; a second failure stops the bench. Rounds are interleaved: per round and node count one lazy sample and one by-hand sample, their
order turned each round; medians of --repeat. Once with the links as they are, once at
--link-rate per node.

FIRST_STEP for the CPU images: `python -c "import time, torch; print('step0', time.time())"`.

--gpu-sizes 4,10 adds a GPU-shaped image per size (GB, uncompressed): the pytorch-ddp image plus
layers of large shared-library-shaped files (`launch/node/examples/cuda_shaped.py`: 256 MiB files, each 64 KiB
block half random bytes and half zeros: gzip halves them, as it roughly does, by assumption, CUDA's libraries),
written straight into the registry as gzip layers (no engine holds 10 GB); its first step imports
torch, then reads each library as a loader would touch it: the 64 KiB ELF head and 3% at one
offset (~3% of the GPU libraries' bytes; `import torch` with CUDA maps libtorch_cuda, cuBLAS and
cuDNN and reads a small part of them). One node (a 10 GB pull+run on 4 simulated nodes is 40 GB
unpacked on this machine's disk), at --gpu-link-rate, medians of --gpu-repeat. --gpu-touch GB:
the first step loads only the libraries in the first GB of them (the image grew by libraries
it never loads, as CUDA images grow by architectures and libraries a job does not use).

    python bench/bench_lazy_launch.py [--nodes 1,2,4] [--repeat 3] [--link-rate 1gbit] [--prefetch]
                                      [--gpu-sizes 4,10] [--gpu-repeat 3] [--gpu-link-rate 1gbit]
                                      [--gpu-image FAMILY:TAG] [--no-cpu] [--no-index [--old-soci-config]]

--gpu-image FAMILY:TAG adds a real GPU image built here (issue 50: CUDA from PyPI's wheels on the
Debian base), pushed with its SOCI index: 1 node at --gpu-link-rate, medians of --gpu-repeat; its
first step (REAL_GPU_STEP) imports torch, builds a model and an optimizer, asks
torch.cuda.is_available() (False without a GPU) and takes one step where it answers. The share of
the image the first step reads is its lazy bytes/node over the compressed size.

--prefetch (issue 52) runs instead, per node count and link: lazy with the prefetch of what the
first step reads (the image's list, launch/node/prefetch.py), lazy without it (the same image with
the list whited out in one more layer, indexed) and by hand, interleaved; the floor is the first
step's own bytes (the no-prefetch side's bytes/node) at the link rate. With --gpu-image, that
image the same way (1 node, --gpu-link-rate, --gpu-repeat rounds; --no-cpu: that image only):

    python bench/bench_lazy_launch.py --prefetch --no-cpu --gpu-image pytorch-ddp:2.13.0-cu130-cudnn9-py311-debian12

--no-index adds pytorch-ddp's layers under a manifest without a SOCI index (1 node, unlimited):
a lazy node pulls it in full; --old-soci-config runs the lazy nodes with soci's default HTTP
retries (what issue 42 changed: launch/infra/cluster.py soci_config).
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import io
import json
import os
import re
import runpy
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dtrain import engine  # noqa: E402
from dtrain.images import soci  # noqa: E402
from dtrain.images.spec import load_all  # noqa: E402
from dtrain.launch.infra import cluster  # noqa: E402
from dtrain.launch.infra import netns as nx  # noqa: E402
from dtrain.table import markdown  # noqa: E402

SAVED = Path("/var/tmp/dtrain-bench-lazy-registry")  # the registry's files between fresh clusters
CUDA_SHAPED = ROOT / "launch" / "node" / "examples" / "cuda_shaped.py"  # runs in the image: launch/node
FAMILY = "pytorch-ddp"
CPU_STEP = ["python", "-c", "import time, torch; print('step0', time.time())"]
GPU_STEP = ["python", "/opt/cuda-shaped/cuda_shaped.py", "load", "/opt/cuda-shaped"]
# --gpu-image: what a training script touches before CUDA is asked (torch.cuda.is_available() is
# False without a GPU), then one step on the CPU
REAL_GPU_STEP = ["python", "-c", "import time, torch; m = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), "
                 "torch.nn.Linear(512, 10)); o = torch.optim.SGD(m.parameters(), lr=0.1); "
                 "dev = 'cuda' if torch.cuda.is_available() else 'cpu'; m.to(dev); "
                 "torch.nn.functional.cross_entropy(m(torch.randn(64, 512, device=dev)), "
                 "torch.randint(0, 10, (64,), device=dev)).backward(); o.step(); print('step0', time.time())"]
# the lazy sides of --prefetch: the same first step, then (after `step0`, outside the time) what the
# prefetch did, where the image has the list (contract.FIRST_READS, PREFETCH_DONE)
def prefetch_step(step: list[str]) -> list[str]:
    """step (`python -c CODE`), then what the prefetch did."""
    return ["python", "-c", step[2] + "; import os, json; t = time.time()\n"
            "while os.path.exists('/opt/dtrain/first-reads.json') and not os.path.exists('/tmp/dtrain-prefetch.json') "
            "and time.time() - t < 60: time.sleep(0.1)\n"
            "os.path.exists('/tmp/dtrain-prefetch.json') and print('prefetch', open('/tmp/dtrain-prefetch.json').read())"]


PREFETCH_STEP = prefetch_step(CPU_STEP)
STEP = re.compile(r"\bstep0 (\d+\.\d+)")
ACCEPT = "application/vnd.docker.distribution.manifest.v2+json"
LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"


# --- pure helpers ------------------------------------------------------------------------------

def step_times(text: str) -> list[float]:
    """Every `step0 UNIXTIME` in a job's output (one per rank)."""
    return [float(m.group(1)) for m in STEP.finditer(text)]


def floor_s(nbytes: int, bits_per_s: int | None) -> float | None:
    return None if bits_per_s is None else nbytes * 8 / bits_per_s


def layer_plan(total: int, per_file: int, per_layer: int) -> list[int]:
    """Files per layer for `total` bytes of libraries: whole files of `per_file`, at most
    `per_layer` bytes a layer (as CUDA images spread their libraries over a few layers)."""
    files = max(1, round(total / per_file))
    per = max(1, per_layer // per_file)
    return [min(per, files - i) for i in range(0, files, per)]


# --- the cluster ---------------------------------------------------------------------------------

def fresh(n: int, lazy_root: Path | None, rate: str | None) -> cluster.ClusterInfo:
    """A new cluster of n nodes (lazy or classic) whose registry holds the saved files."""
    cluster.down(quiet=True)
    info = cluster.up(n, recreate=True, quiet=True, link_rate=rate,
                      lazy=cluster.Lazy(str(lazy_root)) if lazy_root else None)
    data = cluster.STATE_DIR / "registry" / "data"
    subprocess.run(["cp", "-al", f"{SAVED}/.", str(data)], check=True)
    return info


def rx_bytes(index: int) -> int:
    """What node `index` received: its veth's host end transmitted."""
    return int(Path(f"/sys/class/net/{cluster.VETH_PREFIX}{index}/statistics/tx_bytes").read_text())


def lazy_launch(info, ref: str, n: int, step: list[str], name: str, keep_output: bool = False) -> tuple[float, int, str]:
    """`dtrain launch` as the user runs it: (seconds to the last first step, bytes/node, its pull
    lines; keep_output: its whole output instead)."""
    before = [rx_bytes(i) for i in range(1, n + 1)]
    env = {**os.environ, "SSL_CERT_FILE": info.registry_ca}
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "dtrain", "launch", "--hostfile", info.hostfile, "--ssh-config",
                        info.ssh_config, "--image", ref, "--name", name, "--", *step],
                       capture_output=True, text=True, env=env, timeout=1800, cwd=tempfile.gettempdir())
    out = r.stdout + r.stderr
    steps = step_times(out)
    if r.returncode != 0 or len(steps) < n:
        raise SystemExit(f"dtrain launch on {n} lazy node(s): exit {r.returncode}, {len(steps)} first step(s):\n"
                         + out[-3000:])
    nbytes = statistics.mean(rx_bytes(i) - b for i, b in zip(range(1, n + 1), before))
    pulls = "; ".join(ln.strip() for ln in out.splitlines() if "pulled" in ln or "full pull" in ln)
    return max(steps) - t0, int(nbytes), out if keep_output else pulls


def by_hand(info, ref: str, n: int, step: list[str]) -> tuple[float, int]:
    import shlex

    cmd = (f"docker pull -q {shlex.quote(ref)} >/dev/null && "
           f"docker run --rm --network host {shlex.quote(ref)} {shlex.join(step)}")
    hosts = info.names[:n]
    before = [rx_bytes(i) for i in range(1, n + 1)]

    def one(h: str) -> str:
        r = subprocess.run(["ssh", "-F", info.ssh_config, h, cmd], capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            raise SystemExit(f"{h}: by hand: exit {r.returncode}: {r.stderr[-1500:]}")
        return r.stdout

    t0 = time.time()
    with ThreadPoolExecutor(n) as ex:
        outs = list(ex.map(one, hosts))
    if not all(step_times(o) for o in outs):
        raise SystemExit(f"by hand: a node printed no first step: {[o[-300:] for o in outs]}")
    t = max(max(step_times(o)) for o in outs) - t0
    nbytes = statistics.mean(rx_bytes(i) - b for i, b in zip(range(1, n + 1), before))
    return t, int(nbytes)


# --- the images --------------------------------------------------------------------------------

class Registry:
    """The cluster's registry over TLS (lazy mode), for what the bench writes straight into it."""

    def __init__(self, info) -> None:
        self.host, _, port = info.registry.partition(":")
        self.port = int(port)
        self.ctx = ssl.create_default_context(cafile=info.registry_ca)

    def request(self, method: str, path: str, body=None, headers: dict | None = None) -> tuple[int, dict, bytes]:
        c = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=600, blocksize=1 << 20)
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            c.close()

    def blob(self, repo: str, path: Path | bytes) -> tuple[str, int]:
        """Upload a blob (a file or bytes), monolithically; (digest, size)."""
        h = hashlib.sha256()
        if isinstance(path, bytes):
            h.update(path)
            size = len(path)
        else:
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 22), b""):
                    h.update(chunk)
            size = path.stat().st_size
        digest = "sha256:" + h.hexdigest()
        st, _, _ = self.request("HEAD", f"/v2/{repo}/blobs/{digest}")
        if st == 200:
            return digest, size
        st, hdr, body = self.request("POST", f"/v2/{repo}/blobs/uploads/")
        if st != 202:
            raise SystemExit(f"blob upload start: {st} {body[:300]!r}")
        loc = hdr.get("Location") or hdr.get("location")
        loc = re.sub(r"^https?://[^/]+", "", loc)
        sep = "&" if "?" in loc else "?"
        data = path if isinstance(path, bytes) else open(path, "rb")
        try:
            st, _, body = self.request("PUT", f"{loc}{sep}digest={digest}", body=data,
                                       headers={"Content-Length": str(size), "Content-Type": "application/octet-stream"})
        finally:
            if not isinstance(data, bytes):
                data.close()
        if st != 201:
            raise SystemExit(f"blob upload {digest}: {st} {body[:300]!r}")
        return digest, size

    def mount(self, repo: str, out_repo: str, digests: list[str]) -> None:
        """repo's blobs into out_repo (a cross-repository mount: nothing uploaded)."""
        for d in digests:
            st, _, _ = self.request("POST", f"/v2/{out_repo}/blobs/uploads/?mount={d}&from={repo}")
            if st != 201:
                raise SystemExit(f"mount {d} from {repo} into {out_repo}: {st}")

    def manifest(self, repo: str, tag: str) -> dict:
        st, _, body = self.request("GET", f"/v2/{repo}/manifests/{tag}", headers={"Accept": ACCEPT})
        if st != 200:
            raise SystemExit(f"manifest {repo}:{tag}: {st}")
        return json.loads(body)

    def blob_bytes(self, repo: str, digest: str) -> bytes:
        st, _, body = self.request("GET", f"/v2/{repo}/blobs/{digest}")
        if st != 200:
            raise SystemExit(f"blob {digest}: {st}")
        return body

    def put_manifest(self, repo: str, tag: str, manifest: dict) -> None:
        st, _, body = self.request("PUT", f"/v2/{repo}/manifests/{tag}", body=json.dumps(manifest).encode(),
                                   headers={"Content-Type": ACCEPT})
        if st != 201:
            raise SystemExit(f"manifest put {repo}:{tag}: {st} {body[:300]!r}")


def gzip_layer(write, tmp: Path) -> tuple[Path, str]:
    """A layer from write(tarfile): gzip'd with pigz into tmp; (file, diff_id)."""
    diff = hashlib.sha256()
    with open(tmp, "wb") as out:
        pigz = subprocess.Popen(["pigz", "-1", "-c"], stdin=subprocess.PIPE, stdout=out)

        class Tee(io.RawIOBase):
            def writable(self) -> bool:
                return True

            def write(self, b) -> int:
                diff.update(b)
                pigz.stdin.write(b)
                return len(b)

        with tarfile.open(fileobj=Tee(), mode="w|", format=tarfile.PAX_FORMAT) as tf:
            write(tf)
        pigz.stdin.close()
        if pigz.wait() != 0:
            raise SystemExit("pigz failed")
    return tmp, "sha256:" + diff.hexdigest()


def add_file(tf: tarfile.TarFile, name: str, size: int, reader) -> None:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode, ti.mtime = size, 0o755, 0
    tf.addfile(ti, reader)


def add_dir(tf: tarfile.TarFile, name: str) -> None:
    ti = tarfile.TarInfo(name)
    ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, 0
    tf.addfile(ti)


def gpu_shaped(reg: Registry, base_ref: str, gb: float, say) -> str:
    """The base image plus GB of CUDA-shaped libraries, written straight into the registry."""
    cs = runpy.run_path(str(CUDA_SHAPED), run_name="cuda_shaped")  # its shapes (a program of the image's)

    repo, _, tag = base_ref.split("/", 1)[1].rpartition(":")
    out_repo, out_tag = "dtrain/gpu-shaped", f"{gb:g}gb"
    m = reg.manifest(repo, tag)
    cfg = json.loads(reg.blob_bytes(repo, m["config"]["digest"]))
    reg.mount(repo, out_repo, [ly["digest"] for ly in m["layers"]])  # the base's layers, no upload
    plan = layer_plan(int(gb * 1e9), cs["FILE_BYTES"], int(2e9))
    layers: list[tuple[str, int, str]] = []
    with tempfile.TemporaryDirectory(dir="/var/tmp") as td:
        def program(tf: tarfile.TarFile) -> None:
            add_dir(tf, "opt/cuda-shaped")
            src = CUDA_SHAPED.read_bytes()
            add_file(tf, "opt/cuda-shaped/cuda_shaped.py", len(src), io.BytesIO(src))

        parts = [program] + [
            (lambda tf, li=li, k=k: [add_file(tf, f"opt/cuda-shaped/lib{li}_{j}.so", cs["FILE_BYTES"],
                                              cs["Stream"](cs["FILE_BYTES"])) for j in range(k)])
            for li, k in enumerate(plan)]
        for i, part in enumerate(parts):
            t0 = time.monotonic()
            f, diff_id = gzip_layer(part, Path(td) / f"layer{i}.gz")
            digest, size = reg.blob(out_repo, f)
            f.unlink()
            layers.append((digest, size, diff_id))
            say(f"  layer {i + 1}/{len(parts)}: {size / 2**20:.0f} MiB compressed ({time.monotonic() - t0:.0f} s)")
    cfg["rootfs"]["diff_ids"] += [d for _, _, d in layers]
    cfg.setdefault("history", []).extend({"created_by": "bench_lazy_launch: cuda-shaped"} for _ in layers)
    cfg_bytes = json.dumps(cfg).encode()
    cdigest, csize = reg.blob(out_repo, cfg_bytes)
    m["config"] = {**m["config"], "digest": cdigest, "size": csize}
    m["layers"] = m["layers"] + [{"mediaType": LAYER_GZIP, "digest": d, "size": s} for d, s, _ in layers]
    reg.put_manifest(out_repo, out_tag, m)
    return f"{cluster.REGISTRY}/{out_repo}:{out_tag}"


def without_index(reg: Registry, ref: str, suffix: str = "noindex") -> str:
    """ref's layers under a manifest of its own (one more config label), for which the
    registry holds no SOCI index: what a lazy node meets with an image pushed without --soci."""
    repo, _, tag = ref.split("/", 1)[1].rpartition(":")
    out_repo = f"{repo}-{suffix}"
    m = reg.manifest(repo, tag)
    cfg = json.loads(reg.blob_bytes(repo, m["config"]["digest"]))
    cfg.setdefault("config", {}).setdefault("Labels", {})[f"bench.dtrain/{suffix}"] = "1"
    reg.mount(repo, out_repo, [ly["digest"] for ly in m["layers"]])
    digest, size = reg.blob(out_repo, json.dumps(cfg).encode())
    m["config"] = {**m["config"], "digest": digest, "size": size}
    reg.put_manifest(out_repo, tag, m)
    return f"{cluster.REGISTRY}/{out_repo}:{tag}"


def without_list(reg: Registry, ref: str, root: Path, say) -> str:
    """ref plus one layer that removes the first step's list (contract.FIRST_READS: an overlay
    whiteout), indexed: the same image as a lazy node sees it, where the launch has nothing to
    prefetch (as for an image built before the list existed)."""
    from dtrain import contract

    repo, _, tag = ref.split("/", 1)[1].rpartition(":")
    out_repo = f"{repo}-nolist"
    m = reg.manifest(repo, tag)
    cfg = json.loads(reg.blob_bytes(repo, m["config"]["digest"]))
    reg.mount(repo, out_repo, [ly["digest"] for ly in m["layers"]])
    folder, _, name = contract.FIRST_READS.lstrip("/").rpartition("/")
    with tempfile.TemporaryDirectory(dir="/var/tmp") as td:
        f, diff_id = gzip_layer(lambda tf: add_file(tf, f"{folder}/.wh.{name}", 0, io.BytesIO(b"")),
                                Path(td) / "whiteout.gz")
        digest, size = reg.blob(out_repo, f)
    cfg["rootfs"]["diff_ids"].append(diff_id)
    cfg.setdefault("history", []).append({"created_by": "bench_lazy_launch: no first-reads list"})
    cdigest, csize = reg.blob(out_repo, json.dumps(cfg).encode())
    m["config"] = {**m["config"], "digest": cdigest, "size": csize}
    m["layers"] = m["layers"] + [{"mediaType": LAYER_GZIP, "digest": digest, "size": size}]
    reg.put_manifest(out_repo, tag, m)
    out = f"{cluster.REGISTRY}/{out_repo}:{tag}"
    soci.build_indexes(soci.setup(str(root), None), [out], out=say)
    return out


def prefetch_result(text: str) -> str:
    """What the prefetch said in a job's output (the step prints contract.PREFETCH_DONE's JSON
    after its `step0` line, PREFETCH_STEP): "files, MiB in s" per node, or "" where none ran."""
    out = []
    for m in re.finditer(r"prefetch (\{.*?\})", text):
        try:
            d = json.loads(m.group(1))
            out.append(f"{d['files']} files, {d['bytes'] / 2**20:.0f} MiB in {d['seconds']:.1f} s")
        except (ValueError, KeyError, TypeError):
            continue
    return "; ".join(out)


def image_sizes(reg: Registry, ref: str) -> int:
    repo, _, tag = ref.split("/", 1)[1].rpartition(":")
    return sum(x["size"] for x in reg.manifest(repo, tag)["layers"])


def push(info, root: Path, image: str, say) -> str:
    """`dtrain push --soci` of a local FAMILY:TAG into the cluster's registry; its reference there."""
    env = {**os.environ, "SSL_CERT_FILE": info.registry_ca}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "dtrain", "push", "--registry", info.registry, "--image", image,
                        "--soci", "--soci-bin", str(root), "--catalog", str(Path(tempfile.mkdtemp()) / "catalog.json")],
                       capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    if r.returncode != 0:
        raise SystemExit(f"dtrain push --soci {image}: {r.stdout[-1500:]}{r.stderr[-1500:]}")
    ref = f"{info.registry}/dtrain/{image}"
    say(f"pushed {ref} with its SOCI index ({time.monotonic() - t0:.0f} s)")
    return ref


def prepare(root: Path, gpu_sizes: list[float], say, gpu_image: str | None = None
            ) -> tuple[str, str, dict[float, str], dict[str, int], str | None]:
    """Push pytorch-ddp with its SOCI index (and the GPU-shaped images, indexed; and its layers
    again without one; and --gpu-image, a real GPU image, with its index), save the registry's
    files; (cpu ref, no-index ref, {GB: ref}, {ref: compressed bytes}, real GPU ref or None)."""
    info = cluster.up(1, recreate=True, quiet=True, lazy=cluster.Lazy(str(root)))
    engine.allow_insecure_registry(info.registry)
    img = next(i for i in load_all([FAMILY]) if not i.gpu)
    cpu = push(info, root, f"{FAMILY}:{img.tag}", say)
    real = push(info, root, gpu_image, say) if gpu_image else None
    reg = Registry(info)
    gpu: dict[float, str] = {}
    os.environ["SSL_CERT_FILE"] = info.registry_ca  # soci and ctr read it
    for gb in gpu_sizes:
        t0 = time.monotonic()
        say(f"GPU-shaped image, {gb:g} GB of libraries:")
        ref = gpu_shaped(reg, cpu, gb, say)
        soci.build_indexes(soci.setup(str(root), None), [ref], out=say)
        gpu[gb] = ref
        say(f"{ref}: {image_sizes(reg, ref) / 2**30:.2f} GiB compressed ({time.monotonic() - t0:.0f} s)")
    noindex = without_index(reg, cpu)
    say(f"{noindex}: the same layers, no SOCI index")
    sizes = {ref: image_sizes(reg, ref) for ref in [cpu, noindex, *gpu.values(), *([real] if real else [])]}
    shutil.rmtree(SAVED, ignore_errors=True)
    subprocess.run(["cp", "-al", str(cluster.STATE_DIR / "registry" / "data"), str(SAVED)], check=True)
    return cpu, noindex, gpu, sizes, real


# --- --variants: soci settings side by side (lazy side only, 1 node) ----------------------------

SOCI_DEFAULT = cluster.soci_config
# what each variant adds to the lazy nodes' soci.toml (root keys first: go-toml puts a key after a
# table header into that table) or, "span" variants, the --span-size of the image's index
VARIANTS: dict[str, tuple[str, str, int | None]] = {
    "default": ("", "", None),
    "memcache": ('filesystem_cache_type = "memory"\n', "", None),
    "fuse": ("", "\n[fuse]\nattr_timeout = 3600\nentry_timeout = 3600\nnegative_timeout = 3600\n", None),
    "bgfetch": ("", "\nsilence_period_msec = 1\nfetch_period_msec = 5\n", None),
    "span1m": ("", "", 1 << 20),
    "span2m": ("", "", 2 << 20),
}


def variant_config(name: str) -> str:
    root, extra, _ = VARIANTS[name]
    text = SOCI_DEFAULT()
    if name == "bgfetch":  # into the [background_fetch] table, its first lines
        head, _, rest = text.partition("\n\n")
        return root + head + extra + "\n" + rest
    return root + text + extra


def span_image(reg: Registry, ref: str, span: int, root: Path, say) -> str:
    """ref's layers under a manifest of its own, indexed with `soci create --span-size span`."""
    copy = without_index(reg, ref, f"span{span}")
    real = soci.index_argvs

    def with_span(*a, **kw):
        argvs = real(*a, **kw)
        create = argvs[1]
        i = create.index("create")
        argvs[1] = [*create[:i + 1], "--span-size", str(span), *create[i + 1:]]
        return argvs

    soci.index_argvs = with_span
    try:
        soci.build_indexes(soci.setup(str(root), None), [copy], out=say)
    finally:
        soci.index_argvs = real
    return copy


def variants(root: Path, reg: Registry, cpu: str, names: list[str], repeat: int, say) -> list[tuple[str, ...]]:
    refs = {n: span_image(reg, cpu, VARIANTS[n][2], root, say) if VARIANTS[n][2] else cpu for n in names}
    shutil.rmtree(SAVED)
    subprocess.run(["cp", "-al", str(cluster.STATE_DIR / "registry" / "data"), str(SAVED)], check=True)
    runs: dict[str, list[tuple[float, int]]] = {n: [] for n in names}
    for i in range(repeat):
        for n in (names if i % 2 == 0 else names[::-1]):
            cluster.soci_config = lambda background_fetch=True, n=n: variant_config(n)
            try:
                info = fresh(1, root, None)
            finally:
                cluster.soci_config = SOCI_DEFAULT
            t, b, _ = lazy_launch(info, refs[n], 1, CPU_STEP, f"lzv-{n}-{i}")
            runs[n].append((t, b))
            say(f"  variant {n} #{i}: {t:.1f} s, {b / 2**20:.0f} MiB")
    rows = [("soci variant", "lazy: dtrain launch (median)", "bytes/node", "samples, s")]
    for n in names:
        rows.append((n, f"{statistics.median(t for t, _ in runs[n]):.1f} s",
                     f"{statistics.median(b for _, b in runs[n]) / 2**20:.0f} MiB",
                     ", ".join(f"{t:.1f}" for t, _ in runs[n])))
    return rows


# --- main --------------------------------------------------------------------------------------

def prefetch_grid(root: Path, ref: str, nolist: str, size: int, counts: list[int], rates: list[str | None],
                  repeat: int, label: str, step: list[str] = CPU_STEP) -> list[tuple[str, ...]]:
    """--prefetch: per link rate and node count, lazy with the prefetch (the image's list), lazy
    without (the same image, the list whited out) and by hand, interleaved, the order turned
    each round; medians of repeat. The floor here is the first step's own bytes (what a lazy
    node carried without the prefetch) at the link rate."""
    rows = [("image", "link", "nodes", "lazy + prefetch", "bytes/node", "lazy, no prefetch", "bytes/node",
             "by hand pull+run", "step's bytes at the link", "prefetch / by hand", "no prefetch / by hand",
             "what the prefetch did (last sample)", "samples, s (prefetch; none; by hand)")]
    for rate in rates:
        bits = nx.parse_rate(rate) if rate else None
        for n in counts:
            runs: dict[str, list[tuple[float, int]]] = {"pf": [], "none": [], "hand": []}
            said = ""
            for i in range(repeat):
                sides = ["pf", "none", "hand"]
                for side in sides[i % 3:] + sides[:i % 3]:
                    # a job name holds 63 characters at most: the label's first 20 (it is the same each round)
                    tag = f"{re.sub('[^a-z0-9]+', '-', label)[:20]}-{rate or 'u'}-{n}-{i}"
                    if side == "hand":
                        t, b = by_hand(fresh(n, None, rate), ref, n, step)
                    else:
                        info = fresh(n, root, rate)
                        t, b, out = lazy_launch(info, ref if side == "pf" else nolist, n, prefetch_step(step),
                                                f"pf-{side}-{tag}", keep_output=True)
                        if side == "pf":
                            said = prefetch_result(out) or "nothing said"
                    runs[side].append((t, b))
                    print(f"  {label} {rate or 'unlimited'} {n} node(s) #{i}: {side} {t:.1f} s, {b / 2**20:.0f} MiB/node"
                          + (f" [{said}]" if side == "pf" else ""), file=sys.stderr, flush=True)
            med = {k: (statistics.median(t for t, _ in v), statistics.median(b for _, b in v)) for k, v in runs.items()}
            fl = floor_s(med["none"][1], bits)
            rows.append((label, rate or "unlimited", str(n), f"{med['pf'][0]:.1f} s", f"{med['pf'][1] / 2**20:,.0f} MiB",
                         f"{med['none'][0]:.1f} s", f"{med['none'][1] / 2**20:,.0f} MiB", f"{med['hand'][0]:.1f} s",
                         f"{fl:.1f} s" if fl else "-", f"{med['pf'][0] / med['hand'][0]:.2f}x",
                         f"{med['none'][0] / med['hand'][0]:.2f}x", said,
                         "; ".join(", ".join(f"{t:.1f}" for t, _ in runs[k]) for k in ("pf", "none", "hand"))))
            print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    return rows


def grid(root: Path, ref: str, size: int, step: list[str], counts: list[int], rates: list[str | None],
         repeat: int, label: str) -> list[tuple[str, ...]]:
    rows = []
    for rate in rates:
        bits = nx.parse_rate(rate) if rate else None
        for n in counts:
            lazy, hand = [], []
            for i in range(repeat):  # interleaved, the order turned each round
                order = ("lazy", "hand") if i % 2 == 0 else ("hand", "lazy")
                for side in order:
                    if side == "lazy":
                        name = f"lz-{re.sub('[^a-z0-9]+', '-', label)}-{rate or 'u'}-{n}-{i}"
                        try:
                            info = fresh(n, root, rate)
                            t, b, pulls = lazy_launch(info, ref, n, step, name)
                        except SystemExit as e:  # said, and taken again once on fresh nodes: a shared machine
                            print(f"  RETRIED: {name} failed: {str(e)[-1500:]}", file=sys.stderr, flush=True)
                            info = fresh(n, root, rate)
                            t, b, pulls = lazy_launch(info, ref, n, step, name + "-again")
                        lazy.append((t, b))
                        print(f"  {label} {rate or 'unlimited'} {n} node(s) #{i}: lazy {t:.1f} s, "
                              f"{b / 2**20:.0f} MiB/node [{pulls[:300]}]", file=sys.stderr, flush=True)
                    else:
                        info = fresh(n, None, rate)
                        t, b = by_hand(info, ref, n, step)
                        hand.append((t, b))
                        print(f"  {label} {rate or 'unlimited'} {n} node(s) #{i}: by hand {t:.1f} s, "
                              f"{b / 2**20:.0f} MiB/node", file=sys.stderr, flush=True)
            lt, lb = statistics.median(t for t, _ in lazy), statistics.median(b for _, b in lazy)
            ht, hb = statistics.median(t for t, _ in hand), statistics.median(b for _, b in hand)
            fl = floor_s(size, bits)
            rows.append((label, f"{size / 2**20:,.0f} MiB", rate or "unlimited", str(n), f"{lt:.1f} s",
                         f"{lb / 2**20:,.0f} MiB", f"{ht:.1f} s", f"{hb / 2**20:,.0f} MiB",
                         f"{fl:.1f} s" if fl else "-", f"{lt / ht:.2f}x",
                         f"{', '.join(f'{t:.1f}' for t, _ in lazy)}; {', '.join(f'{t:.1f}' for t, _ in hand)}"))
            print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    return rows


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout`: still take the cluster down
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--nodes", default="1,2,4")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--link-rate", default="1gbit")
    ap.add_argument("--no-cpu", action="store_true", help="only the GPU-shaped images")
    ap.add_argument("--gpu-sizes", default="", help="GB of CUDA-shaped libraries, e.g. 4,10")
    ap.add_argument("--gpu-repeat", type=int, default=3)
    ap.add_argument("--gpu-link-rate", default="1gbit")
    ap.add_argument("--gpu-image", help="a real GPU image built here, FAMILY:TAG (e.g. pytorch-ddp:2.13.0-cu130-cudnn9-"
                    "py311-debian12, CUDA from PyPI's wheels): 1 node at --gpu-link-rate, --gpu-repeat rounds; "
                    "its first step imports torch, builds a model and optimizer, asks for CUDA and steps on the CPU")
    ap.add_argument("--gpu-touch", type=float, help="GB: the first step loads only the libraries in the "
                    "first GB of them (sizes above it only: an image that grew by libraries the step never loads)")
    ap.add_argument("--no-index", action="store_true",
                    help="also the image pushed without an index (1 node, unlimited): a lazy node's full pull")
    ap.add_argument("--old-soci-config", action="store_true",
                    help="lazy nodes with soci's default HTTP retries (before issue 42's fix), for the no-index row")
    ap.add_argument("--prefetch", action="store_true",
                    help="instead: lazy with the prefetch, lazy without it (the list whited out) and by hand, "
                    "pytorch-ddp at --nodes, unlimited and at --link-rate (not with --no-cpu); with --gpu-image, "
                    "that image too (1 node, --gpu-link-rate, --gpu-repeat rounds, its first step REAL_GPU_STEP)")
    ap.add_argument("--variants", help=f"soci settings side by side instead, lazy side only, 1 node: {','.join(VARIANTS)}")
    args = ap.parse_args()
    if args.prefetch and args.no_cpu and not args.gpu_image:
        ap.error("--prefetch --no-cpu: nothing to measure without --gpu-image")
    if args.old_soci_config:
        cluster.soci_config = lambda background_fetch=True: (
            f"[background_fetch]\ndisable = {'false' if background_fetch else 'true'}\n")
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    engine.ensure_dockerd()
    root = engine.ensure_lazy_binaries()
    gpu_sizes = [float(x) for x in args.gpu_sizes.split(",") if x]
    header = ("image", "compressed", "link", "nodes", "lazy: dtrain launch", "lazy: bytes/node",
              "by hand pull+run", "by hand: bytes/node", "floor (bytes/link)", "lazy / by hand",
              "samples, s (lazy; by hand)")
    try:
        cpu, noindex, gpu, sizes, real = prepare(root, gpu_sizes, say, args.gpu_image)
        if args.variants:
            info = cluster.up(1, recreate=True, quiet=True, lazy=cluster.Lazy(str(root)))  # prepare's, still up
            os.environ["SSL_CERT_FILE"] = info.registry_ca
            print(markdown(variants(root, Registry(info), cpu, args.variants.split(","), args.repeat, say)))
            return
        if args.prefetch:
            info = cluster.up(1, recreate=True, quiet=True, lazy=cluster.Lazy(str(root)))  # prepare's, still up
            os.environ["SSL_CERT_FILE"] = info.registry_ca
            nolist = None if args.no_cpu else without_list(Registry(info), cpu, root, say)
            nolist_real = without_list(Registry(info), real, root, say) if real else None
            shutil.rmtree(SAVED)
            subprocess.run(["cp", "-al", str(cluster.STATE_DIR / "registry" / "data"), str(SAVED)], check=True)
            rows = []
            if nolist:
                rows += prefetch_grid(root, cpu, nolist, sizes[cpu], [int(x) for x in args.nodes.split(",")],
                                      [None, args.link_rate], args.repeat, FAMILY)
            if real and nolist_real:  # the real GPU image: 1 node at --gpu-link-rate, --gpu-repeat rounds
                grid_rows = prefetch_grid(root, real, nolist_real, sizes[real], [1], [args.gpu_link_rate],
                                          args.gpu_repeat, args.gpu_image, REAL_GPU_STEP)
                rows += grid_rows[1:] if rows else grid_rows
            print(markdown(rows))
            return
        rows = [header]
        if not args.no_cpu:
            rows += grid(root, cpu, sizes[cpu], CPU_STEP, [int(x) for x in args.nodes.split(",")],
                         [None, args.link_rate], args.repeat, FAMILY)
        if args.no_index:
            rows += grid(root, noindex, sizes[noindex], CPU_STEP, [1], [None], args.repeat,
                         f"{FAMILY}, no index" + (" (soci's default retries)" if args.old_soci_config else ""))
        if real:
            rows += grid(root, real, sizes[real], REAL_GPU_STEP, [1], [args.gpu_link_rate], args.gpu_repeat,
                         args.gpu_image)
        for gb, ref in gpu.items():
            if args.gpu_touch is None or args.gpu_touch < gb:
                step = GPU_STEP + ([str(int(args.gpu_touch * 1e9))] if args.gpu_touch else [])
                rows += grid(root, ref, sizes[ref], step, [1], [args.gpu_link_rate], args.gpu_repeat,
                             f"gpu-shaped {gb:g} GB" + (f", first step loads {args.gpu_touch:g} GB of it"
                                                        if args.gpu_touch else ""))
        print(markdown(rows))
    finally:
        cluster.down(quiet=True)
        shutil.rmtree(SAVED, ignore_errors=True)


if __name__ == "__main__":
    main()
