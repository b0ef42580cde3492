"""torch DDP (gloo) training steps; prints a checksum of the gradients on every rank.

All ranks must print the same checksum: DDP averaged their gradients. Works under torchrun
and under mpirun (ranks taken from Open MPI's variables; MASTER_ADDR/PORT must be set).
Under SageMaker (SM_MODEL_DIR set) rank 0 saves the model there.
"""

import os
import socket
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def train(rank: int, size: int) -> None:
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank sees different data
    for step in range(3):
        x = torch.randn(8, 16, generator=gen)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        checksum = sum(float(p.grad.double().sum()) for p in model.parameters())
        print(f"step {step} rank {rank}/{size} host {socket.gethostname()} grad-checksum {checksum:.10f}",
              flush=True)
        opt.step()
    model_dir = os.environ.get("SM_MODEL_DIR")  # SageMaker's model directory (uploaded at the end)
    if model_dir and rank == 0:
        torch.save(model.module.state_dict(), os.path.join(model_dir, "model.pt"))
        print(f"rank 0 saved the model to {model_dir}/model.pt", flush=True)


if __name__ == "__main__":
    if "RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" in os.environ:
        os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
        os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
    dist.init_process_group("gloo")
    train(dist.get_rank(), dist.get_world_size())
    dist.destroy_process_group()
    # Exit without interpreter finalization. DDP keeps the gloo group alive past
    # destroy_process_group, so its worker threads are not joined; one still releasing the
    # last collective then needs the GIL while Python finalizes, and torch 2.13 aborts the
    # process ("terminate called without an active exception", pytorch/pytorch#190489).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
