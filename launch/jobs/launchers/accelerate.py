"""Hugging Face `accelerate launch`: one command in every node's container, as torchrun (it runs
torch.distributed.run itself): --num_machines and --machine_rank from the attempt's nodes,
--num_processes the ranks of all nodes (accelerate gives each node num_processes/num_machines,
so every node takes the same number), NCCL and Gloo on each node's own NIC.

`--multi_gpu` picks accelerate's torch.distributed.run path on GPU and CPU nodes alike. On a node
without a GPU, ACCELERATE_USE_CPU=true makes each process join over Gloo (accelerate's
PartialState: without it, no CUDA means DistributedType.NO and every process trains alone, seen
with accelerate 1.15). Not `--cpu`: accelerate refuses it beside `--multi_gpu`, and alone it runs
one process per node that expects mpirun's environment.
static rendezvous: `--same_network` (--main_process_ip/port are the master's address, ranks by
--machine_rank); c10d: they are the rendezvous endpoint. `--tee 3`: each rank's lines tagged
as torchrun's (launch/jobs/output.py). An accelerate config file in the image still gives the
settings these flags leave (mixed precision, dynamo), but `--multi_gpu` overrides its
distributed_type. Flags: accelerate's `accelerate launch --help` (commands/launch.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import runplan
from dtrain.launch.jobs.launchers.base import EVERY_NODE, NODE_LINES, Attempt, Launcher, attempt_of, script_argv
from dtrain.launch.jobs.launchers.torchrun import torchrun_env


def accelerate_argv(num_machines: int, machine_rank: int, num_processes: int, main_ip: str, main_port: int,
                    command: Sequence[str], *, rdzv: str = "static") -> list[str]:
    """`accelerate launch` on machine `machine_rank` of num_machines (num_processes: all of them)."""
    if not command or isinstance(command, str):
        raise ValueError(f"accelerate_argv: command must be a non-empty list of strings, got {command!r}")
    if not 0 <= machine_rank < num_machines or num_processes < num_machines:
        raise ValueError(f"accelerate_argv: machine {machine_rank} of {num_machines}, {num_processes} processes")
    if rdzv not in ("static", "c10d"):
        raise ValueError(f"accelerate_argv: rdzv must be 'static' or 'c10d', got {rdzv!r}")
    argv = ["accelerate", "launch", *(["--multi_gpu"] if num_processes > 1 else []),
            "--num_machines", str(num_machines), "--machine_rank", str(machine_rank),
            "--num_processes", str(num_processes),
            "--main_process_ip", main_ip, "--main_process_port", str(main_port),
            "--rdzv_backend", rdzv, *(["--same_network"] if rdzv == "static" else []), "--tee", "3"]
    return argv + script_argv(command)


class Accelerate(Launcher):
    name = "accelerate"
    placement = EVERY_NODE
    output = NODE_LINES  # `--tee 3`, as torchrun's

    def attempt(self, run: runplan.LaunchCommand, nodes: Sequence[runplan.PlanNode]) -> Attempt:
        if not nodes:
            raise ValueError("attempt_argv: no nodes")
        slots = {n.slots for n in nodes}
        if len(slots) > 1:
            raise LaunchError("--launcher accelerate: accelerate runs as many processes on every node; the nodes "
                              f"have {', '.join(f'{n.hostname}:{n.slots}' for n in nodes)} slots")
        total = sum(n.slots for n in nodes)
        out = []
        for rank, n in enumerate(nodes):
            cpu = {} if n.gpus else {"ACCELERATE_USE_CPU": "true"}
            env = {**torchrun_env(n.iface), **cpu, **dict(run.extra_env)}
            out.append(["env", *(f"{k}={v}" for k, v in env.items()),
                        *accelerate_argv(len(nodes), rank, total, nodes[0].address, run.master_port,
                                         run.command, rdzv=run.rdzv)])
        return attempt_of(out)

    def exec_env(self, iface: str) -> dict[str, str]:
        return torchrun_env(iface)
