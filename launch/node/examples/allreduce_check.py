"""Proves every rank took part: allreduce of (rank + 1) must equal n(n+1)/2 on every rank.

Usage: python allreduce_check.py [tensorflow|torch]   (Horovod)
       python allreduce_check.py ddp                   (torch.distributed, gloo; under torchrun or mpirun)
"""

import os
import socket
import sys

kind = sys.argv[1] if len(sys.argv) > 1 else "tensorflow"
host = socket.gethostname()

if kind == "tensorflow":
    import tensorflow as tf
    import horovod.tensorflow as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    total = float(hvd.allreduce(tf.constant(float(rank + 1)), op=hvd.Sum))
elif kind == "torch":
    import torch
    import horovod.torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    total = float(hvd.allreduce(torch.tensor(float(rank + 1)), op=hvd.Sum))
else:
    import torch
    import torch.distributed as dist

    # torchrun sets RANK/WORLD_SIZE/MASTER_*; under mpirun take them from Open MPI.
    if "RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" in os.environ:
        os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
        os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    t = torch.tensor(float(rank + 1))
    dist.all_reduce(t)
    total = float(t)
    # Joins gloo's worker threads while Python is alive: left to interpreter exit, one still
    # releasing the allreduce can abort the process (see ddp_grads.py).
    dist.destroy_process_group()

expected = size * (size + 1) / 2
status = "OK" if total == expected else "MISMATCH"
model_dir = os.environ.get("SM_MODEL_DIR")  # SageMaker's model directory: rank 0 leaves the result
if model_dir and rank == 0:
    with open(os.path.join(model_dir, "allreduce.txt"), "w") as f:
        f.write(f"{status} size={size} sum={total:g}\n")
print(f"allreduce {status} rank={rank} size={size} host={host} sum={total:g} expected={expected:g}", flush=True)
sys.exit(0 if status == "OK" else 1)
