"""DeepSpeed's multi-node runner: `deepspeed --hostfile H --launcher openmpi` in the first node's
container, which runs Open MPI's mpirun across the nodes (DeepSpeed's launcher/multinode_runner.py
OpenMPIRunner), every rank's lines tagged by launch/node/rank_output.py.

- The hostfile (`ADDRESS slots=N`, the attempt's nodes in rank order) is the attempt's file:
  the supervisor writes it into the job's directory of the first container before each attempt.
- `--launcher openmpi`, not pdsh: the images carry Open MPI (the family images' mpirun and
  ompi_info, which DeepSpeed's runner looks for), not pdsh. What DeepSpeed's runner hands mpirun
  of its own is `-n`, `-hostfile`, `--mca btl ^openib`, `-x UCX_TLS=tcp` and `-x PYTHONPATH`; the
  rest comes through `--launcher_args` (one string DeepSpeed splits with shlex.split: built
  here with shlex.join from dtrain's own values, never a user's): the containers' sshd on 2022
  (`plm_rsh_args`), Open MPI's TCP and Gloo/NCCL on the job's NIC (DeepSpeed's own default is
  `btl_tcp_if_include eth0`; giving ours drops it), MPI_DEFAULTS, and `-x NAME` for every
  variable the ranks get (the job's --env by name: no value in the argv).
- DeepSpeed's runner puts every variable of its environment named MLFLOW*, PYTHON*, UCX*, MV2*
  (and NCCL* on CUDA) into mpirun's argv with its value: the job's --env of such names leave the
  runner's environment (`env --unset`), and RANK_ENV reads them on each rank from its node's env
  file, so no --env value is in an argv.
- Ranks: Open MPI gives each its OMPI_COMM_WORLD_* variables; deepspeed.init_distributed()
  without RANK/WORLD_SIZE/LOCAL_RANK would ask mpi4py (not in the images), so each rank runs
  through RANK_ENV (python3 -I -S -c: it sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE from
  Open MPI's where unset, then execs the command); MASTER_ADDR is the first node, MASTER_PORT
  --master-port. `--no_python`: the command runs as given (`python train.py`, as mpirun takes it).
- CPU nodes (no GPU on any): DS_ACCELERATOR=cpu for the runner and every rank (DeepSpeed's
  accelerator; its ops are not built: DS_BUILD_OPS=0 is DeepSpeed's own default for a pip
  install). deepspeed.init_distributed() on a CPU node JIT-builds DeepSpeed's shared-memory op
  (deepspeed_shm_comm), which failed to build in the pytorch-ddp CPU image: a CPU job's ranks
  join with torch.distributed.init_process_group("gloo") (docs/launch.md).
- `--force_multi`: Open MPI on one node too (a restart left with one node), where DeepSpeed
  would otherwise start its ranks itself, without Open MPI's variables or rank_output.py.
- `--no_ssh_check`: DeepSpeed's check ssh'es on port 22; the launch's readiness check reached
  every node's sshd on 2022 already. `--log_level warning`: DeepSpeed's runner logs its whole
  mpirun command at info (rank_output.py's text in it).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from dtrain import contract
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import container, nic, runplan
from dtrain.launch.jobs.launchers.base import FIRST_NODE, MPI_TAGS, Attempt, Launcher, PreflightResult, attempt_of
from dtrain.launch.jobs.launchers.mpirun import mpi_defaults, ompi_major, training_env

HOSTFILE = "deepspeed-hostfile"  # the attempt's file, in the job's directory of the first container

# DeepSpeed's runner puts the value of every variable of its environment whose name starts so
# into mpirun's argv (`-x NAME=VALUE`: runner.py EXPORT_ENVS, and the CUDA accelerator's NCCL):
# the job's --env of such names (MLFLOW_TRACKING_TOKEN) are taken out of the runner's environment
# (`env -u NAME`), and each rank reads them from its node's copy of the job's env file instead.
EXPORTED = ("MLFLOW", "PYTHON", "MV2", "UCX", "NCCL")

# Each rank: `python3 -I -S -c RANK_ENV NAMES COMMAND...`: the job's --env variables NAMES
# (comma-separated; "-": none) from the node's env file (NAME=base64 lines, launch/node/run.sh
# reads the same), torch.distributed's variables from Open MPI's where unset, then the command.
RANK_ENV = ("import base64, os, sys\n"
            "e = os.environ\n"
            "names = set(sys.argv[1].split(',')) - {'-'}\n"
            "if names:\n"
            f"    with open('{contract.JOB_KEY_MOUNT}/{contract.ENV_FILE}') as f:\n"
            "        for line in f:\n"
            "            k, _, v = line.strip().partition('=')\n"
            "            if k in names:\n"
            "                e[k] = base64.b64decode(v).decode()\n"
            "for k, v in (('RANK', 'OMPI_COMM_WORLD_RANK'), ('WORLD_SIZE', 'OMPI_COMM_WORLD_SIZE'),\n"
            "             ('LOCAL_RANK', 'OMPI_COMM_WORLD_LOCAL_RANK'), ('LOCAL_WORLD_SIZE', 'OMPI_COMM_WORLD_LOCAL_SIZE')):\n"
            "    if k not in e and v in e:\n"
            "        e[k] = e[v]\n"
            "os.execvp(sys.argv[2], sys.argv[2:])\n")

# The launcher's check in the first container: DeepSpeed's command, and Open MPI's version.
PREFLIGHT = ("command -v deepspeed >/dev/null || { echo 'no deepspeed command in the image: build a project image "
             "whose requirements.txt brings deepspeed (dtrain build --project DIR --from pytorch-ddp)' >&2; exit 1; }; "
             "command -v ompi_info >/dev/null || { echo 'no ompi_info in the image: deepspeed --launcher openmpi "
             "needs Open MPI' >&2; exit 1; }; mpirun --version")


def hostfile_text(nodes: Sequence[runplan.PlanNode]) -> str:
    """DeepSpeed's hostfile: `ADDRESS slots=N`, in rank order."""
    return "".join(f"{n.address} slots={n.slots}\n" for n in nodes)


def launcher_args(run: runplan.LaunchCommand, nodes: Sequence[runplan.PlanNode], cpu: bool) -> list[str]:
    """What DeepSpeed's runner passes on to mpirun (--launcher_args, split again by DeepSpeed)."""
    where = run.subnet or nodes[0].iface  # by subnet where nodes name their NICs apart
    if any(k == "btl" for k, _ in run.mca):
        raise LaunchError("--mca btl: deepspeed's runner sets btl itself (^openib); leave it out")
    mca = {"pml": "ob1", "btl_tcp_if_include": where, "oob_tcp_if_include": where,
           "plm_rsh_args" if run.ompi < 5 else "plm_ssh_args": " ".join(container.mpirun_ssh()),
           **dict(mpi_defaults(run.mca, run.ompi, [*run.env_names, *run.forward])), **dict(run.mca)}  # the user's --mca replaces a built-in one
    values = {**training_env(nodes[0].iface), "GLOO_SOCKET_IFNAME": nodes[0].iface,
              "MASTER_ADDR": nodes[0].address, "MASTER_PORT": str(run.master_port),
              **({"DS_ACCELERATOR": "cpu"} if cpu else {})}
    names = [*run.forward, runplan.RESTART_VAR, *(k for k, _ in run.extra_env),
             *(n for n in run.env_names if n not in hidden(run))]
    args = ["--bind-to", "none", "--map-by", "slot"]
    for k, v in mca.items():
        args += ["--mca", k, v]
    for k, v in values.items():
        if k not in run.env_names:  # the user's --env value replaces a built-in one
            args += ["-x", f"{k}={v}"]
    for k in dict.fromkeys(names):
        args += ["-x", k]
    return args


def hidden(run: runplan.LaunchCommand) -> list[str]:
    """The job's --env names DeepSpeed's runner would put into mpirun's argv with their value."""
    return [n for n in run.env_names if n.startswith(EXPORTED)]


class DeepSpeed(Launcher):
    name = "deepspeed"
    placement = FIRST_NODE
    output = MPI_TAGS  # every rank under rank_output.py (its rank: OMPI_COMM_WORLD_RANK)
    ranks_over_ssh = True
    ssh_here = False  # mpirun starts the first node's ranks without ssh
    rank_output = True

    def preflight(self, ompi: int | None) -> list[str] | None:
        return ["sh", "-c", PREFLIGHT]

    def preflight_result(self, output: str) -> PreflightResult:
        ompi = ompi_major(output)
        return PreflightResult(ompi, f"deepspeed and Open MPI {ompi} in the image")

    def attempt(self, run: runplan.LaunchCommand, nodes: Sequence[runplan.PlanNode]) -> Attempt:
        if not nodes:
            raise ValueError("attempt: no nodes")
        cpu = not any(n.gpus for n in nodes)
        secret = hidden(run)
        wrapper = [nic.NODE_ENV_WRAPPER] if run.subnet else []  # each rank's NCCL/Gloo on its own node's NIC
        command = [*runplan.RANK_OUTPUT_HEAD, RANK_ENV, ",".join(secret) or "-", *wrapper, *run.command]
        argv = [*(["env", *(f"--unset={n}" for n in secret)] if secret else []), "deepspeed", "--hostfile", f"{run.files_dir}/{HOSTFILE}", "--launcher", "openmpi",
                "--master_addr", nodes[0].address, "--master_port", str(run.master_port),
                "--no_ssh_check", "--force_multi", "--no_python", "--log_level", "warning",
                "--launcher_args", shlex.join(launcher_args(run, nodes, cpu)),
                *runplan.rank_output_argv(run.rank_output, command)]
        return attempt_of([argv], env={"DS_ACCELERATOR": "cpu"} if cpu else {},
                          files={HOSTFILE: hostfile_text(nodes)})

    def exec_env(self, iface: str) -> dict[str, str]:
        return {}

