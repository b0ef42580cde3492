"""Ray Train's own example style across nodes (issue 40): a TorchTrainer with
ScalingConfig(num_workers=3) and no RunConfig(storage_path), as ray's torch_linear_example.py,
on 3 simulated nodes that share a host directory (`cluster.up(shared=...)`, as EFS) given to
the job as --mount: it ends with its metrics and every worker line shows once. A shape of its
own (own_cluster): it runs after the tests on the shared 3-node cluster."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from dtrain.images import push as P
from dtrain.images.spec import load_all
from dtrain.launch.infra import cluster as cl
from dtrain.launch.jobs.container import Mount
from dtrain.launch.jobs.job import Job
from dtrain.launch.jobs.store import job_log
from test_launch import containers_left, nodes_of, spec

pytestmark = [pytest.mark.cluster, pytest.mark.own_cluster, pytest.mark.second_cluster]  # a shape of its own: after the 3-node tests

ROOT = Path(__file__).resolve().parent.parent

# The shape of ray's python/ray/train/examples/pytorch/torch_linear_example.py: its dataset,
# train_func (prepare_data_loader, prepare_model, a checkpoint reported every epoch) and
# train_linear; no storage_path anywhere. Each worker also prints one line per epoch with its
# rank and host, so the test can count them.
EXAMPLE = '''
import argparse
import os
import socket
import tempfile

import numpy as np
import torch
import torch.nn as nn

import ray
import ray.train as train
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer


class LinearDataset(torch.utils.data.Dataset):
    def __init__(self, a, b, size=1000):
        x = np.arange(0, 10, 10 / size, dtype=np.float32)
        self.x = torch.from_numpy(x)
        self.y = torch.from_numpy(a * x + b)

    def __getitem__(self, index):
        return self.x[index, None], self.y[index, None]

    def __len__(self):
        return len(self.x)


def train_epoch(dataloader, model, loss_fn, optimizer):
    for X, y in dataloader:
        loss = loss_fn(model(X), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def validate_epoch(dataloader, model, loss_fn):
    num_batches = len(dataloader)
    model.eval()
    loss = 0
    with torch.no_grad():
        for X, y in dataloader:
            loss += loss_fn(model(X), y).item()
    loss /= num_batches
    return {"model": model.state_dict(), "loss": loss}


def train_func(config):
    data_size = config.get("data_size", 1000)
    val_size = config.get("val_size", 400)
    batch_size = config.get("batch_size", 32)
    hidden_size = config.get("hidden_size", 1)
    lr = config.get("lr", 1e-2)
    epochs = config.get("epochs", 3)

    train_dataset = LinearDataset(2, 5, size=data_size)
    val_dataset = LinearDataset(2, 5, size=val_size)
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=batch_size)
    validation_loader = torch.utils.data.DataLoader(val_dataset, batch_size=batch_size)

    train_loader = train.torch.prepare_data_loader(train_loader)
    validation_loader = train.torch.prepare_data_loader(validation_loader)

    model = nn.Linear(1, hidden_size)
    model = train.torch.prepare_model(model)

    loss_fn = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    for epoch in range(epochs):
        if train.get_context().get_world_size() > 1:
            train_loader.sampler.set_epoch(epoch)
        train_epoch(train_loader, model, loss_fn, optimizer)
        state_dict, loss = validate_epoch(validation_loader, model, loss_fn).values()
        rank = train.get_context().get_world_rank()
        print(f"linear-example epoch={epoch} rank={rank} host={socket.gethostname()} loss={loss:.4f}", flush=True)
        with tempfile.TemporaryDirectory() as tmpdir:
            torch.save(state_dict, os.path.join(tmpdir, "model.pt"))
            train.report({"loss": loss, "epoch": epoch}, checkpoint=Checkpoint.from_directory(tmpdir))


def train_linear(num_workers=2, use_gpu=False, epochs=3):
    config = {"lr": 1e-2, "hidden_size": 1, "batch_size": 4, "epochs": epochs}
    trainer = TorchTrainer(
        train_loop_per_worker=train_func,
        train_loop_config=config,
        run_config=RunConfig(),
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu),
    )
    result = trainer.fit()
    print(f"linear-example metrics {result.metrics}")
    return result.metrics


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-workers", "-n", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    args, _ = parser.parse_known_args()
    ray.init()
    train_linear(num_workers=args.num_workers, epochs=args.epochs)
'''


@pytest.fixture(scope="module")
def ray_shared(_cluster_session, engine, cpu_images, tmp_path_factory):
    """(cluster, the host directory every node has at the same path, the ray-train image's ref)."""
    shared = tmp_path_factory.mktemp("ray-shared")
    info = cl.up(3, recreate=True, quiet=True, shared={str(shared): str(shared)})
    engine.allow_insecure_registry(info.registry)
    imgs = [i for i in load_all() if not i.gpu and i.family == "ray-train"]
    ref = P.push_registry(imgs, info.registry, catalog_path=ROOT / "build" / "test-catalog-ray-shared.json")[0].remote
    return info, shared, ref


def test_ray_trains_example_without_storage_path_on_3_nodes_with_shared_storage(ray_shared, tmp_path):
    info, shared, image = ray_shared
    work = tmp_path / "work"
    work.mkdir()
    (work / "torch_linear_example.py").write_text(EXAMPLE)
    said: list[str] = []
    job = Job(spec(info, image, ["python", "torch_linear_example.py", "--num-workers", "3", "--epochs", "2"],
                   "t-ray-linear", launcher="ray", workdir=str(work), mounts=(Mount(str(shared), str(shared)),),
                   env={"RAY_DEDUP_LOGS": "0"}),  # Ray's own folding of alike lines ("[repeated 2x]") off
              nodes_of(info, 3), say=said.append)
    code = job.run()
    out = job_log("t-ray-linear").read_text()
    assert code == 0, out
    assert "Unable to set up cluster storage" not in out
    assert not [line for line in said if "warning" in line], said
    assert any(f"~/ray_results -> {shared}/ray_results on every node" in line for line in said), said
    assert re.search(r"linear-example metrics \{.*'loss': [0-9.e-]+.*'epoch': 1", out), out
    lines = re.findall(r"linear-example epoch=(\d) rank=(\d) host=(node-\d) loss=", out)
    counts = Counter((e, r) for e, r, _ in lines)
    assert sorted(counts) == [(e, r) for e in "01" for r in "012"], out
    assert set(counts.values()) == {1}, f"a worker line shown more than once: {counts}\n{out}"
    assert len({h for _, _, h in lines}) > 1, "workers off the head node"
    # the run's checkpoints are in the shared directory, written from the workers' nodes
    assert list(shared.glob("ray_results/*/checkpoint_*")), sorted(p.name for p in shared.rglob("*"))[:20]
    assert containers_left(info, "t-ray-linear") == []


# The example as Ray ships it, in the ray-train image (ray 2.60), run unedited.
SHIPPED_EXAMPLE = "/opt/venv/lib/python3.11/site-packages/ray/train/examples/pytorch/torch_linear_example.py"


def test_rays_own_torch_linear_example_unedited_on_3_nodes(ray_shared):
    """Ray's own torch_linear_example.py, unedited, from the image: 3 workers on 3 nodes end with
    its metrics (the driver's print of result.metrics), no storage error, and the workers'
    checkpoints land in the shared directory."""
    info, shared, image = ray_shared
    before = set(shared.glob("ray_results/*"))
    job = Job(spec(info, image, ["python", SHIPPED_EXAMPLE, "--num-workers", "3", "--epochs", "2"],
                   "t-ray-shipped", launcher="ray", mounts=(Mount(str(shared), str(shared)),)),
              nodes_of(info, 3), say=lambda m: None)
    code = job.run()
    out = job_log("t-ray-shipped").read_text()
    assert code == 0, out[-5000:]
    assert "Unable to set up cluster storage" not in out
    assert re.search(r"\{'loss': [0-9.e-]+", out), out[-3000:]
    runs = set(shared.glob("ray_results/*")) - before
    assert runs and any(r.glob("checkpoint_*") for r in runs), sorted(p.name for p in shared.rglob("*"))[:20]
    assert containers_left(info, "t-ray-shipped") == []


def test_a_ray_job_outlives_the_nodes_heartbeat_timeout(ray_shared):
    """No supervisor beats for Ray (its own protocol): the launch refreshes every node's heartbeat
    file itself, or each node's watchdog takes the job for gone after --heartbeat-timeout and
    stops its container (the driver then ends with 137: a Ray job longer than 90 s never
    finished). A driver that runs 3 x the timeout ends with its own exit code."""
    info, _, image = ray_shared
    job = Job(spec(info, image, ["python", "-c", "import time; time.sleep(15); print('driver done', flush=True)"],
                   "t-ray-beat", launcher="ray", heartbeat_timeout=5), nodes_of(info, 2), say=lambda m: None)
    code = job.run()
    out = job_log("t-ray-beat").read_text()
    assert code == 0 and "driver done" in out, out[-3000:]
    assert containers_left(info, "t-ray-beat") == []
