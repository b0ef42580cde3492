"""What images, templates, node scripts and the launcher must agree on, in one place.

images/render.py passes `jinja()` into the templates (templates/partials/ssh.j2 reads the port
from it); the launcher passes these values to the node scripts (launch/node/*.sh) as arguments.
Change a value here, re-render (`dtrain render`) and rebuild the images.
"""

from __future__ import annotations

from pathlib import Path

SSH_PORT = 2022  # the containers' sshd (the host keeps 22)
MASTER_PORT = 29500  # torchrun's master (rendezvous) port: --master-port's default, manifests, SageMaker
NETGATE_PORT = 2023  # the network gate's streams between a job's containers (launch/node/netgate.py)
# Every ssh session dtrain opens probes the link: a peer silent for INTERVAL x COUNT seconds
# (a dropped link, a node gone) ends the session instead of leaving it waiting forever.
SSH_KEEPALIVE_INTERVAL_S = 5
SSH_KEEPALIVE_COUNT = 3


def ssh_keepalive_opts() -> list[str]:
    """ssh -o options: a dead link ends the session within SSH_KEEPALIVE_INTERVAL_S x SSH_KEEPALIVE_COUNT s."""
    return ["-o", f"ServerAliveInterval={SSH_KEEPALIVE_INTERVAL_S}", "-o", f"ServerAliveCountMax={SSH_KEEPALIVE_COUNT}"]

# Image and container labels.
LABEL_JOB = "dtrain.job"  # on every container a launch starts: the job's name
LABEL_KIND = "dtrain.kind"  # gpu or cpu
LABEL_MIN_DRIVER = "dtrain.min-driver"  # GPU images: the oldest NVIDIA driver their CUDA runs on
LABEL_OPENMPI_MAJOR = "dtrain.openmpi-major"  # Open MPI's major version in the image
LABEL_SSH_PORT = "dtrain.ssh-port"
LABEL_VERSION_PREFIX = "dtrain.version."  # dtrain.version.<pin>: python, pytorch, cuda, ...
LABEL_CUDA_FROM = "dtrain.cuda-from"  # where an image's CUDA comes from: cpu, nvidia/cuda (base + apt) or wheels (PyPI)
LABEL_EFA = "dtrain.efa"  # yes: the image has the EFA stage (EFA installer, aws-ofi-nccl, nccl-tests); no: it has not

NODE_DIR = "/opt/dtrain/node"  # launch/node/ inside every image
# What the family's first step reads from the image (launch/node/first_reads.py, run at build
# time); on a node that pulled the image lazily, launch/node/prefetch.py reads it ahead of the job
# and says what it did in PREFETCH_DONE (issue 52).
FIRST_READS = "/opt/dtrain/first-reads.json"
PREFETCH_DONE = "/tmp/dtrain-prefetch.json"
EXAMPLES = f"{NODE_DIR}/examples"  # launch/node/examples/: the demo's and the checks' programs
ENTRYPOINT = f"{NODE_DIR}/entrypoint.sh"  # no args: sshd -D on SSH_PORT; args: sshd, then exec them
JOB_KEY_MOUNT = "/run/dtrain-job"  # the job's key pair in the container; the entrypoint installs it
ENV_FILE = "env"  # in JOB_KEY_MOUNT: the job's --env values, NAME=base64(value) lines (0600)
# A tmpfs of each job container's own (docker run --tmpfs), gone with it: Open MPI's session
# directories (orte_tmpdir_base: mpirun's, each daemon's, each rank's files and PMIx's sockets).
# In the image's /tmp they are new files on overlayfs over the node's disk: about a fifth of each
# daemon's start in CPU (docs/benchmarks.md, "Issue 52: the warm launch's CPU").
MPI_TMPDIR = "/run/dtrain-mpi"
# The job's code in every container (--workdir's copy; a project image's COPY). Where it exists
# every launcher starts the command there, else in the image's WORKDIR (launch/node/supervise.py).
WORKDIR = "/workdir"
# What a node keeps under its ssh user's home is its own, also where nodes share one home (NFS
# /home: ParallelCluster, most Slurm clusters), keyed by its hostname (launch/node/host/prepare.sh
# node_root; a job's nodes have hostnames of their own):
#   ~/.dtrain/nodes/HOST/jobs/<job>/        the job's directory: watchdog, supervisor, plan,
#                                           heartbeat, log, FIFOs, workdir/ (--workdir's copy)
#   ~/.dtrain/nodes/HOST/jobs/<job>.lock/   the node's lock of the job's name (owner: the launch)
#   ~/.dtrain/nodes/HOST/workdir-cache/KEY  the last --workdir sent from a directory (rsync --link-dest)
# The node computes the path itself (the launcher passes the job's name; prepare prints the
# directory, which the launcher mounts and sends --workdir to). The job's keys and a registry
# login's Docker config are on the node's tmpfs (/dev/shm), never under the home.
# The job's directory on each node is mounted here in every container of the job.
CONTAINER_JOB_DIR = "/dtrain-job"
# A spot notice on a node of a running job: the supervisor creates this file in every container
# (each has its own node's job directory here) and each rank finds its path in CHECKPOINT_NOW_VAR:
# the job saves a checkpoint at its next step and rank 0 removes the file to say it is saved;
# then the supervisor swaps a spare in for the leaving node and restarts from that checkpoint.
CHECKPOINT_NOW = f"{CONTAINER_JOB_DIR}/checkpoint-now"
CHECKPOINT_NOW_VAR = "DTRAIN_CHECKPOINT_NOW"
# The supervisor's events among the job's output lines: this prefix, then one JSON object.
SUPERVISOR_EVENT = "dtrain-supervisor "
# The supervisor's stack dump after a hang (launch/node/stacks.sh's lines): this prefix, then
# the line as a user reads it (`[node-2 r1] ...`).
STACK_LINE = "dtrain-stack "
# The exit code of every error meant for the user (a bad flag or file, a launch that could not
# start): the CLI exits with it (tasks.py user_errors, dtrain/cli.py) and a job that failed to
# launch records it (launch/jobs/job.py), so `dtrain status` shows what the shell saw.
USER_ERROR_EXIT = 2
# The readiness check's exit code (launch/node/run.sh --ready, which gets it as --ready-code):
# a node's sshd did not answer; the launcher names the node.
READY_FAILED = 97
READY_SAYS = "dtrain-ready: "  # before each line of the readiness check's verdict (run.sh --ready-says)

# The timeline of a launch (launch/analysis/timeline.py): the phases each node measures of its own
# steps (lines `SUPERVISOR_EVENT{"event": "phase", "phase": P, "at": EPOCH, "seconds": S}` from
# launch/node/host/ and run.sh) or the launcher measures of its rounds, in their order; then a
# restart's phases, from the supervisor's `phase` events ({"phase": P, "node": host, "seconds": S}).
PHASE_EVENT = "phase"
LAUNCH_PHASES = ("first-round", "pull", "container", "sshd", "network-gate", "ready", "first-step")
RESTART_PHASES = ("detection", "checkpoint", "teardown", "spare-in", "resumed")

# launch/node/ on this machine: the node scripts the launcher sends over ssh.
NODE_SCRIPTS = Path(__file__).resolve().parent.parent / "launch" / "node"
if not NODE_SCRIPTS.is_dir():  # installed: dtrain/launch/node
    NODE_SCRIPTS = Path(__file__).resolve().parent / "launch" / "node"


def container_name(job: str) -> str:
    """The container of a job on every node."""
    return f"dtrain-{job}"


def node_key_dir(job: str) -> str:
    """The job's key pair on a node: tmpfs (never on disk; each machine's own), 0700, removed
    with the container."""
    return f"/dev/shm/{container_name(job)}"


def node_script(name: str) -> str:
    """The text of launch/node/<name>, sent to a node over ssh."""
    return (NODE_SCRIPTS / name).read_text()


def jinja() -> dict[str, object]:
    """The contract as the templates see it: `contract.ssh_port`, `contract.entrypoint`, ..."""
    return {"ssh_port": SSH_PORT, "entrypoint": ENTRYPOINT, "node_dir": NODE_DIR, "first_reads": FIRST_READS,
            "job_key_mount": JOB_KEY_MOUNT, "label_job": LABEL_JOB,
            "label_min_driver": LABEL_MIN_DRIVER, "label_openmpi_major": LABEL_OPENMPI_MAJOR}

# EC2 tag on the instances `nodes up` starts: their AMI's ssh user (`launch --ec2-tag` reads it).
SSH_USER_TAG = "dtrain:ssh-user"
