"""`dtrain demo`: the main job end to end on a local simulated cluster.

Host setup -> build the CPU Horovod+TensorFlow image -> 2-node cluster -> push to its
registry -> a real Horovod training over mpirun across the nodes -> cluster down (a cluster of
that size that was up before the demo is used and left up).
"""

from __future__ import annotations

import time

from dtrain.images import build as b
from dtrain.images import push as p
from dtrain.images.spec import load_all
from dtrain import contract, engine
from dtrain.launch.infra import cluster
from dtrain.launch.remote.hosts import parse_hostfile
from dtrain.launch.jobs.config import LaunchConfig, job_spec
from dtrain.launch.jobs.job import Job

FAMILY = "horovod-tensorflow"
TRAIN = ("python", f"{contract.EXAMPLES}/hvd_tf_synthetic.py", "--epochs", "3")


def say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def run(nodes: int = 2, keep: bool = False, epochs: int = 3) -> int:
    t0 = time.monotonic()
    say("1/5 host: Debian packages, Docker engine, debootstrapped base image")
    engine.ensure_all()
    img = next(i for i in load_all([FAMILY]) if not i.gpu)
    say(f"2/5 building {b.local_ref(img)} (cached after the first run)")
    b.build([FAMILY], img.tag, False, b.BuildOptions(base_image=engine.BASE_IMAGE,
                                                     ca_bundle=b.default_ca_bundle()))
    say(f"3/5 simulated cluster: {nodes} nodes (netns, own dockerd and sshd each, NIC ens5)")
    before = cluster.status()
    info = cluster.up(nodes)
    theirs = before.up and before.nodes == nodes  # up() returned the user's cluster unchanged: it stays
    code = 1
    try:
        engine.allow_insecure_registry(info.registry)
        say(f"4/5 pushing to the cluster's registry {info.registry}")
        p.push_registry([img], info.registry, catalog_path=p.CATALOG)
        image = f"{info.registry}/dtrain/{FAMILY}:{img.tag}"
        say(f"5/5 launching Horovod training on {nodes} nodes with mpirun")
        spec = job_spec(LaunchConfig(image=image, command=[*TRAIN[:-1], str(epochs)], launcher="mpirun", name="demo"),
                        ssh_opts=("-F", info.ssh_config))
        code = Job(spec, parse_hostfile(info.hostfile)).run()
    finally:
        if keep or theirs:
            why = "it was up before the demo" if theirs else "--keep"
            say(f"cluster kept ({why}): ssh -F {info.ssh_config} node-1; `dtrain cluster down` removes it")
        else:
            cluster.down()
    say(f"{'done' if code == 0 else f'job failed with exit code {code}'} in {time.monotonic() - t0:.0f} s")
    return code
