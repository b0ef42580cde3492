"""The troubleshooting checklist, as data.

Every known way a dtrain job fails is one `Entry`: a stable id, the symptom (with the exact
messages the tools print), the cause, the fix (the dtrain flag or image property that prevents
it), how to confirm it (`dtrain doctor` check ids, `dtrain diagnose` signatures) and a source.

Two consumers read these entries:

- `launch/troubleshoot/diagnose.py` matches `Entry.signatures` against job logs (`dtrain diagnose`);
- `render_markdown()` writes docs/troubleshooting.md. The committed file must equal the render
  (tests/test_diagnose.py), so edit this file and run `python -m dtrain.launch.troubleshoot.checklist --write`.

Signatures are matched one log line at a time: they must not span lines (no `\\s` that could
eat a newline; use a space or `[ \\t]`). Named groups `rank`, `local_rank` and `node` in a
signature, when present, say which rank or node the line is about.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from dtrain import ROOT
DOC = ROOT / "docs" / "troubleshooting.md"

# The `dtrain doctor` checks the entries refer to: id -> what the check verifies on every node.
DOCTOR_CHECKS: dict[str, str] = {
    "ssh": "the launcher reaches every node's host sshd (port 22) with BatchMode ssh (a refused connection "
           "is said as such: nothing listens on the port, so sshd is not running or uses another port)",
    "docker": "the Docker engine runs and the launcher's user may use it (WARN where `unpigz` is "
              "not on the node: dockerd then decompresses layers with Go's gzip, and a cold pull "
              "takes 1.4-1.5x as long, docs/benchmarks.md)",
    "lazy-load": "whether the node loads images lazily: Docker's storage driver is the SOCI snapshotter "
                 "(`soci`, Docker on the containerd image store: `dtrain cluster up`, `nodes up` by default); else it pulls "
                 "in full, as a node always did",
    "nvidia-runtime": "where the node has NVIDIA GPUs, Docker has the nvidia runtime (`--gpus all` works)",
    "gpu-driver": "the host driver is at least the image CUDA's min_driver (images/compat.yaml)",
    "port-2022": "nothing but the dtrain container's sshd listens on port 2022 of the node",
    "peer-2022": "from each node's container, `ssh -p 2022 <peer> command -v orted python` "
                 "succeeds for every peer, without prompts",
    "nic": "the interface carrying each node's address (never lo, docker0, br-*, veth*) has the "
           "same MTU on every node, and the same name (WARN where names differ but the nodes "
           "share a subnet: mpirun and torchrun handle that, horovodrun does not)",
    "hostnames": "node hostnames are unique (the launcher also writes every node's name and "
                 "address into each container's /etc/hosts)",
    "image-digest": "every node runs the same image digest (same Horovod, framework, NCCL)",
    "shm": "/dev/shm in the container is at least 1 GiB (FAIL under 256 MiB)",
    "memlock": "`ulimit -l` in the container is unlimited",
    "efa": "EFA instance types (read from DMI, no network) have /dev/infiniband/uverbs* devices, "
           "as many as the type has EFA interfaces (one per network card; WARN with fewer), and "
           "with `--image` libfabric in the container sees them (`fi_info -p efa`); with `--image`, "
           "WARN where the image has no EFA stage (label `dtrain.efa=no`: the GPU variants built "
           "from PyPI's CUDA wheels) on an EFA instance type, naming the family's EFA variant",
    "clock": "node clocks agree within a few seconds and are synchronised",
    "disk": "Docker's data root has room for the image and the job",
}


@dataclass(frozen=True)
class Entry:
    """One checklist entry. Text fields are Markdown."""

    id: str
    title: str
    symptom: str
    cause: str
    fix: str
    confirm: str
    source: tuple[str, ...]
    # Exact messages as they appear in logs: shown in the doc, and each must match a signature.
    messages: tuple[str, ...] = ()
    signatures: tuple[re.Pattern[str], ...] = ()
    doctor_checks: tuple[str, ...] = ()
    # A consequence reported by many causes ("a rank exited"): listed after the specific ones.
    catch_all: bool = False
    related: tuple[str, ...] = ()


def _re(*patterns: str) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p) for p in patterns)


OMPI_FAQ_TCP = "https://www.open-mpi.org/faq/?category=tcp"
OMPI_FAQ_RUNNING = "https://www.open-mpi.org/faq/?category=running"
OMPI_FAQ_RSH = "https://www.open-mpi.org/faq/?category=rsh"
OMPI_MPIRUN4 = "https://www.open-mpi.org/doc/v4.1/man1/mpirun.1.php"
HVD_DOCKER = "https://horovod.readthedocs.io/en/stable/docker_include.html"
HVD_MPI = "https://horovod.readthedocs.io/en/stable/mpi_include.html"
HVD_TROUBLE = "https://horovod.readthedocs.io/en/stable/troubleshooting_include.html"
NCCL_ENV = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"
NCCL_TROUBLE = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html"
AWS_EFA_NCCL = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start-nccl.html"
DOCKER_RUN = "https://docs.docker.com/reference/cli/docker/container/run/"
SSHD_CONFIG = "https://man.openbsd.org/sshd_config"
SSH_CONFIG = "https://man.openbsd.org/ssh_config"
SSH = "https://man.openbsd.org/ssh"
TORCHRUN = "https://pytorch.org/docs/stable/elastic/run.html"
EFA_NCCL = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start-nccl.html"
CUDA_COMPAT = "https://docs.nvidia.com/deploy/cuda-compatibility/index.html"

ENTRIES: tuple[Entry, ...] = (
    Entry(
        id="ssh-port-22",
        title="ssh reached the host's sshd (port 22), not the container's (port 2022)",
        symptom="mpirun stops at once, before any rank prints. The remote shell is the host's, "
                "where Open MPI is not installed.",
        messages=(
            "bash: orted: command not found",
            "ssh: connect to host node-2 port 22: Connection refused",
        ),
        signatures=_re(r"\borted: command not found",
                       r"ssh: connect to host \S+ port 22: (?!Network is unreachable|No route to host)"),
        cause="mpirun starts its daemon `orted` on each node over ssh. Without "
              "`--mca plm_rsh_args \"-p 2022\"` ssh uses port 22, which on a host-network "
              "container is the **host's** sshd, not the container's. The host has no `orted` "
              "(or refuses the key), so the daemons never start.",
        fix="Let `dtrain launch` build the command: it always passes "
            "`--mca plm_rsh_args \"-p 2022\"` (Open MPI 4) or `plm_ssh_args` (Open MPI 5). "
            "Inside dtrain images the ssh client already defaults to port 2022 "
            "(`/etc/ssh/ssh_config`: `Port 2022`), so a hand-written mpirun run *inside* a "
            "dtrain container is safe; one run on the host is not.",
        confirm="`dtrain doctor` checks `port-2022` and `peer-2022`; by hand: "
                "`ssh -p 2022 node-2 command -v orted` from inside a container prints a path. "
                "If ssh did reach the container and `orted` is still missing, see "
                "[remote-path](#remote-path).",
        source=(HVD_DOCKER, OMPI_FAQ_RSH),
        doctor_checks=("port-2022", "peer-2022"),
        related=("remote-path", "ompi5-plm-args"),
    ),
    Entry(
        id="ompi5-plm-args",
        title="Open MPI 5 does not honour `plm_rsh_args` (it is `plm_ssh_args`)",
        symptom="A command line that works with Open MPI 4 lands on port 22 with Open MPI 5. "
                "The daemon is `prted` in Open MPI 5, so the shell complains about it instead "
                "of `orted`; Open MPI may also name the old variable as deprecated.",
        messages=(
            "bash: prted: command not found",
            "  Deprecated variable: plm_rsh_args",
        ),
        signatures=_re(r"\bprted: command not found",
                       r"Deprecated variable: +plm_rsh_\w+"),
        cause="Open MPI 5 launches through PRRTE, whose ssh launcher parameters are "
              "`plm_ssh_args` / `plm_ssh_agent`. The Open MPI 4 names (`plm_rsh_*`) are at best "
              "deprecated aliases (reported as \"A deprecated MCA variable value was specified "
              "in the environment or on the command line\"), and `OMPI_MCA_plm_rsh_args` in the "
              "environment is not read by PRRTE at all. Without the port, ssh goes to 22.",
        fix="`dtrain launch` reads the image's Open MPI major version (`mpirun --version`) and "
            "passes `--mca plm_ssh_args \"-p 2022\"` for 5, `--mca plm_rsh_args \"-p 2022\"` "
            "for 4. dtrain's GPU images ship Open MPI 4 (EFA installer `--mpi=openmpi4`).",
        confirm="`dtrain launch` prints the mpirun command it runs and the Open MPI version it "
                "found in the image; `mpirun --version` in the image.",
        source=("https://docs.open-mpi.org/en/v5.0.x/launching-apps/ssh.html",
                "https://docs.open-mpi.org/en/v5.0.x/mca.html"),
        doctor_checks=(),
        related=("ssh-port-22",),
    ),
    Entry(
        id="remote-path",
        title="`orted` or `python` not found in the non-interactive ssh session",
        symptom="ssh reaches the container, but the command mpirun runs there is not found or "
                "cannot load its libraries.",
        messages=(
            "bash: python: command not found",
            "/usr/bin/env: 'python': No such file or directory",
            "mpirun was unable to launch the specified application as it could not access",
            "mpirun was unable to find the specified executable file, and therefore",
            "rank_output.py: cannot run 'python': No such file or directory",
            "orted: error while loading shared libraries: libopen-rte.so.40: cannot open "
            "shared object file: No such file or directory",
        ),
        signatures=_re(
            r"\b(?:python3?|horovodrun|torchrun): command not found",
            r"env: .?python3?.?: No such file or directory",
            r"\b(?:mpirun|prterun) was unable to launch the specified application as it could "
            r"not access",
            r"\b(?:mpirun|prterun) was unable to find the specified executable file",
            r"rank_output\.py: cannot run '[^']*': No such file or directory",  # launch/node/rank_output.py
            r"\b(?:orted|prted|python3?): error while loading shared libraries",
        ),
        cause="Docker `ENV` is the environment of the container's first process, not of "
              "ssh sessions: sshd gives each session a fresh environment with its compiled-in "
              "default `PATH`, and the non-interactive shell mpirun uses reads no "
              "`/etc/profile` or `~/.profile` (Debian's `~/.bashrc` returns early when not "
              "interactive). So `/opt/venv/bin`, `/opt/amazon/openmpi/bin` and their "
              "`LD_LIBRARY_PATH` are missing unless something puts them there.",
        fix="dtrain images copy their whole `ENV` into sshd's `SetEnv` "
            "(`/etc/ssh/sshd_config.d/00-image-env.conf`, rewritten by the entrypoint with any "
            "`docker run -e` additions), so non-interactive sessions get the image's PATH. With "
            "another image: pass `--prefix /opt/amazon/openmpi` to mpirun (or build Open MPI "
            "with `--enable-orterun-prefix-by-default`) and use the absolute path of python.",
        confirm="`dtrain doctor` check `peer-2022` runs `command -v orted python` over ssh on "
                "port 2022; by hand: `ssh -p 2022 node-2 env | grep PATH`.",
        source=(OMPI_FAQ_RUNNING, SSHD_CONFIG),
        doctor_checks=("peer-2022",),
        related=("ssh-port-22",),
    ),
    Entry(
        id="ssh-unreachable",
        title="ssh to a node's port 2022 is refused, times out or cannot resolve the name",
        symptom="mpirun (or the launcher) cannot open ssh to one node.",
        messages=(
            "ssh: connect to host node-2 port 2022: Connection refused",
            "ssh: connect to host node-2 port 2022: Connection timed out",
            "ssh: Could not resolve hostname node-9: Name or service not known",
        ),
        signatures=_re(r"ssh: connect to host \S+ port (?!22:)\d+: (?!Network is unreachable|No route to host)",
                       r"ssh: Could not resolve hostname \S+"),
        cause="Refused: the dtrain container is not running on that node (or its sshd died: "
              "`docker logs`). Timed out / no route: the security group or a firewall drops "
              "port 2022 between the nodes, or the address is wrong. Could not resolve: the "
              "name in the host list is not in DNS or `/etc/hosts` on the node that connects.",
        fix="`dtrain launch` starts the containers and waits for port 2022 on every node "
            "before mpirun. Allow all traffic between the nodes in the security group (a rule "
            "that references the group itself; EFA needs it anyway). Use names every node "
            "resolves, or IP addresses.",
        confirm="`dtrain doctor` checks `peer-2022` and `hostnames`.",
        source=(SSH, "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start.html"),
        doctor_checks=("peer-2022", "port-2022", "hostnames"),
    ),
    Entry(
        id="ssh-no-route",
        title="no route from this machine to a node (Network is unreachable, No route to host; "
              "doctor: port 22 timed out)",
        symptom="ssh fails at once, on any port, before sshd or a key is involved: `dtrain nodes up` "
                "stops with it, `dtrain doctor` fails the `ssh` check with it.",
        messages=(
            "ssh: connect to host 10.213.77.12 port 22: Network is unreachable",
            "ssh: connect to host node-2 port 2022: No route to host",
        ),
        signatures=_re(r"ssh: connect to host \S+ port \d+: (?:Network is unreachable|No route to host)"),
        cause="A connectivity problem, not sshd, the port or a key: \"Network is unreachable\" is "
              "this machine's own routing table having no route to the address (a private VPC "
              "address from a laptop, a VPN that is down); \"No route to host\" is a router or the "
              "local network saying the address cannot be reached (the node is gone or not up yet, "
              "or a firewall rejects with ICMP); a timeout on port 22 is packets dropped on the way "
              "(a security group without the rule for this machine's address, a node whose link is "
              "down, a private address from outside the VPC).",
        fix="Reach the node at an address this machine routes to: from outside the VPC its public "
            "address (`dtrain nodes up --address public`, the default there; `--ec2-tag` uses public "
            "addresses from outside the instances' VPC), else through a bastion (`--ssh-opt "
            "ProxyJump=HOST`) or a VPN into the VPC; check the subnet's route table and the "
            "security group's rule for the port.",
        confirm="`ip route get ADDRESS` on this machine names the route (or says unreachable); "
                "`dtrain doctor` check `ssh`.",
        source=(SSH, "https://docs.aws.amazon.com/vpc/latest/userguide/VPC_Route_Tables.html"),
        doctor_checks=("ssh",),
        related=("ssh-unreachable",),
    ),
    Entry(
        id="sshd-port-busy",
        title="the container's sshd cannot bind port 2022",
        symptom="The node container exits at start, or runs without sshd; peers then get "
                "\"Connection refused\" on 2022.",
        messages=(
            "Bind to port 2022 on 0.0.0.0 failed: Address already in use.",
            "Cannot bind any address.",
        ),
        signatures=_re(r"Bind to port \d+ on \S+ failed: Address already in use",
                       r"^(?:.*\bsshd\b.*)?Cannot bind any address\.?$"),
        cause="With `--network host` the container shares the host's ports. Another process "
              "on the host (a stale dtrain container, a second job, an sshd of the host "
              "configured for 2022) already listens on 2022.",
        fix="`dtrain launch` replaces a leftover container of the same job name, and refuses "
            "to start when another process holds 2022, naming any other dtrain job running on "
            "that node (one job per node at a time: `dtrain stop --job NAME`). Find other "
            "holders with `ss -ltnp 'sport = :2022'`.",
        confirm="`dtrain doctor` check `port-2022`.",
        source=(SSHD_CONFIG, "https://docs.docker.com/engine/network/drivers/host/"),
        doctor_checks=("port-2022",),
        related=("ssh-unreachable",),
    ),
    Entry(
        id="ssh-host-key",
        title="ssh refuses the peer's host key",
        symptom="ssh stops before authenticating.",
        messages=(
            "Host key verification failed.",
            "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @",
            "No ED25519 host key is known for [node-2]:2022 and you have requested strict "
            "checking.",
        ),
        signatures=_re(r"Host key verification failed\.",
                       r"WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!",
                       r"No \S+ host key is known for \S+ and you have requested strict checking"),
        cause="Host keys are new for every dtrain container or job (made when the container "
              "starts, or by the launcher for a job's containers; keys never ship in the "
              "image), so a `known_hosts` entry from an earlier container no longer matches, "
              "and an unknown key cannot be accepted without a prompt in a non-interactive "
              "session. A client config with `StrictHostKeyChecking yes`, or a "
              "mounted `known_hosts`, causes this.",
        fix="dtrain images set `StrictHostKeyChecking no` and `UserKnownHostsFile /dev/null` "
            "in `/etc/ssh/ssh_config`: the nodes of a job are containers on a private network "
            "that the launcher itself started. Do not mount a `known_hosts` or an "
            "`~/.ssh/config` that overrides these into the container.",
        confirm="`dtrain doctor` check `peer-2022`.",
        source=(SSH_CONFIG,),
        doctor_checks=("peer-2022",),
    ),
    Entry(
        id="ssh-auth",
        title="ssh public-key authentication is refused (key not authorised, or StrictModes)",
        symptom="The client reports \"Permission denied (publickey)\"; the refusing sshd "
                "(`docker logs` of the peer's container) may say why.",
        messages=(
            "root@node-2: Permission denied (publickey).",
            "Authentication refused: bad ownership or modes for directory /root/.ssh",
        ),
        signatures=_re(r"Permission denied \(publickey",
                       r"Authentication refused: bad ownership or modes for"),
        cause="The job's public key is not in the peer container's "
              "`/root/.ssh/authorized_keys`, or sshd with `StrictModes yes` (the default) "
              "ignores it because `.ssh` or `authorized_keys` is group/world writable or owned "
              "by another user, which is how the Kubeflow MPI operator mounts them (read-only, "
              "root-owned, 0644). If ssh went to the host's port 22 instead, the host does not "
              "know the key either: see [ssh-port-22](#ssh-port-22).",
        fix="dtrain images set `StrictModes no` in `sshd_config`, and `dtrain launch` installs "
            "the job's key in every container. Do not bake keys into images.",
        confirm="`dtrain doctor` check `peer-2022`; `ssh -v -p 2022 node-2 true` shows which "
                "keys were offered.",
        source=(SSHD_CONFIG,),
        doctor_checks=("peer-2022",),
        related=("ssh-port-22", "ssh-key-perms"),
    ),
    Entry(
        id="ssh-key-perms",
        title="the ssh client ignores a private key readable by others",
        symptom="The client prints a banner and skips the key; authentication then fails.",
        messages=(
            "@         WARNING: UNPROTECTED PRIVATE KEY FILE!          @",
            "Permissions 0644 for '/root/.ssh/id_ed25519' are too open.",
            "Load key \"/root/.ssh/id_ed25519\": bad permissions",
        ),
        signatures=_re(r"WARNING: UNPROTECTED PRIVATE KEY FILE!",
                       r"Permissions 0\d+ for '[^'\n]+' are too open",
                       r"Load key \"[^\"\n]+\": bad permissions"),
        cause="ssh refuses private keys that group or others may read. A key mounted from a "
              "Kubernetes secret or copied with default modes is 0644.",
        fix="`dtrain launch` writes the job key into each container with mode 0600. When "
            "mounting your own, set the secret's `defaultMode: 0600` (or copy it and "
            "`chmod 600`).",
        confirm="`dtrain doctor` checks `ssh` and `peer-2022`.",
        source=(SSH,),
        doctor_checks=("ssh", "peer-2022"),
        related=("ssh-auth",),
    ),
    Entry(
        id="btl-iface",
        title="Open MPI's TCP BTL uses docker0 or lo",
        symptom="The job hangs in `MPI_Init`/`hvd.init()` or at the first collective, often "
                "with these warnings (the first one's wording, \"a another\", is Open MPI's).",
        messages=(
            "WARNING: Open MPI accepted a TCP connection from what appears to be a",
            "[node-1][[12345,1],0][btl_tcp_endpoint.c:625:mca_btl_tcp_endpoint_recv_connect_ack]"
            " received unexpected process identifier [[12345,1],3]",
            "WARNING: Open MPI failed to TCP connect to a peer MPI process.  This",
            "[node-2][[12345,1],2][btl_tcp_endpoint.c:803:mca_btl_tcp_endpoint_complete_connect]"
            " connect() to 172.17.0.1 failed: Connection refused (111)",
        ),
        signatures=_re(
            r"Open MPI accepted a TCP connection from what appears to be",
            r"received unexpected process identifier",
            r"Open MPI failed to TCP connect to a peer MPI process",
            r"mca_btl_tcp_endpoint_complete_connect\] connect\(\) to \S+ failed",
        ),
        cause="Open MPI's TCP BTL uses every interface it finds except loopback "
              "(`btl_tcp_if_exclude` defaults to `127.0.0.1/8,sppp`). In a host-network "
              "container that includes `docker0` (172.17.0.1 on **every** node): ranks "
              "advertise it, peers connect to it and reach themselves or nothing. A node whose "
              "name resolves to 127.0.1.1 (Debian/Ubuntu `/etc/hosts`) advertises loopback.",
        fix="`dtrain launch` passes `--mca btl_tcp_if_include <nic>` (and the same for oob) "
            "with the interface that carries each node's address, after checking it has the "
            "same name on every node (`--iface` overrides). By hand, a CIDR (`10.0.0.0/16`) "
            "also works when interface names differ.",
        confirm="`dtrain doctor` check `nic`; rerun with `--mca btl_base_verbose 30` to see "
                "the interfaces each rank uses.",
        source=(OMPI_FAQ_TCP, HVD_MPI),
        doctor_checks=("nic",),
        related=("oob-iface", "nccl-iface"),
    ),
    Entry(
        id="oob-iface",
        title="Open MPI's out-of-band (ORTE) channel uses the wrong interface",
        symptom="mpirun hangs or fails while starting the daemons, before any rank prints; "
                "the btl flag alone does not help.",
        messages=(
            "[node-2:01234] [[12345,0],1] tcp_peer_send_blocking: send() to socket 9 failed: "
            "Broken pipe (32)",
            "ORTE does not know how to route a message to the specified daemon",
            "None of the TCP networks specified to be included for out-of-band communications",
        ),
        signatures=_re(
            r"tcp_peer_send_blocking: send\(\) to socket \d+ failed",
            r"(?:ORTE|PRTE) does not know how to route a message to the specified daemon",
            r"None of the TCP networks specified to be included for out-of-band",
        ),
        cause="The daemons call back to mpirun over the out-of-band channel, which picks "
              "interfaces independently of the BTL (`oob_tcp_if_include`). It can pick "
              "`docker0` or an unroutable address, or be told an interface name that does not "
              "exist on some node.",
        fix="`dtrain launch` passes `--mca oob_tcp_if_include` with the same interface or CIDR "
            "as `btl_tcp_if_include`. Use a CIDR when interface names differ between nodes "
            "(`ens5` vs `eth0`).",
        confirm="`dtrain doctor` check `nic`; rerun with `--mca oob_base_verbose 10`.",
        source=(OMPI_FAQ_TCP,),
        doctor_checks=("nic",),
        related=("btl-iface",),
    ),
    Entry(
        id="env-not-forwarded",
        title="an environment variable set for the job is missing on remote ranks",
        symptom="Ranks on the launch node work; ranks on other nodes fail on a missing "
                "variable, or silently behave differently (NCCL on another NIC, debug off, "
                "another data path).",
        messages=(
            "ValueError: Error initializing torch.distributed using env:// rendezvous: "
            "environment variable MASTER_ADDR expected, but not set",
            "KeyError: 'DTRAIN_DATA_DIR'",
        ),
        signatures=_re(
            r"environment variable \w+ expected, but not set",
            r"KeyError: '[A-Z][A-Z0-9]*_[A-Z0-9_]+'",
        ),
        cause="mpirun does not copy the caller's environment to remote processes: only "
              "variables named with `-x NAME` (or `-x NAME=value`) are exported. Remote ranks "
              "get the container's environment instead.",
        fix="`dtrain launch` passes `-x` for PATH, LD_LIBRARY_PATH, NCCL_DEBUG, "
            "NCCL_SOCKET_IFNAME, the BLAS thread variables, and every `--env K=V` and every "
            "variable of `--env-file`. Add variables to the job's env, not to your shell.",
        confirm="`dtrain launch` prints the mpirun command with every `-x`; in the job, "
                "print the variable from every rank.",
        source=(OMPI_MPIRUN4, HVD_MPI),
        doctor_checks=(),
    ),
    Entry(
        id="mpirun-root",
        title="mpirun refuses to run as root",
        symptom="mpirun exits at once.",
        messages=("mpirun has detected an attempt to run as root.",),
        signatures=_re(r"has detected an attempt to run as root"),
        cause="Open MPI refuses root unless told otherwise; containers run as root.",
        fix="dtrain images set `OMPI_ALLOW_RUN_AS_ROOT=1` and "
            "`OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1`. With another image add "
            "`--allow-run-as-root`.",
        confirm="`docker inspect` shows the image's Env; `dtrain launch` prints the mpirun command.",
        source=(OMPI_MPIRUN4,),
        doctor_checks=(),
    ),
    Entry(
        id="hostnames-dup",
        title="two nodes share a hostname (or the host list is wrong)",
        symptom="Open MPI places ranks as if two nodes were one: too few slots, several ranks "
                "on one GPU, or inter-node traffic over shared memory that hangs.",
        messages=(
            "There are not enough slots available in the system to satisfy the 16",
            "node-1:2345:2345 [1] NCCL WARN Duplicate GPU detected : rank 9 and rank 1 both "
            "on CUDA device 1e000",
        ),
        signatures=_re(r"There are not enough slots available in the system to satisfy",
                       r"Duplicate GPU detected : rank \d+ and rank \d+ both on CUDA device"),
        cause="The host list does not describe the nodes: fewer slots than `-np` (a node "
              "missing from `-H`/the hostfile, or two nodes under one name). Host-network "
              "containers report the host's hostname, and Open MPI and Horovod tell nodes "
              "apart by name: nodes cloned with one fixed hostname (or all `localhost`) can "
              "be taken for one node, giving wrong local ranks, several ranks on one GPU, or "
              "shared-memory transport between nodes. NCCL's duplicate-GPU error also appears "
              "when a script selects the GPU by global rank instead of local rank.",
        fix="`dtrain launch` builds the host list from the inventory's addresses with explicit "
            "slots and refuses duplicates. Give every node a unique hostname; pin the GPU with "
            "`hvd.local_rank()` / `LOCAL_RANK`.",
        confirm="`dtrain doctor` check `hostnames`; `mpirun --display-map hostname`.",
        source=(OMPI_MPIRUN4, NCCL_TROUBLE),
        doctor_checks=("hostnames",),
    ),
    Entry(
        id="blas-regions",
        title="OpenBLAS runs out of memory regions (too many threads per rank)",
        symptom="Ranks die at the first CPU matrix operation on large nodes.",
        messages=(
            "BLAS : Program is Terminated. Because you tried to allocate too many memory "
            "regions.",
            "OpenBLAS blas_thread_init: pthread_create failed for thread 63 of 96: Resource "
            "temporarily unavailable",
        ),
        signatures=_re(r"BLAS : Program is Terminated\. Because you tried to allocate too many "
                       r"memory regions",
                       r"OpenBLAS blas_thread_init: pthread_create failed"),
        cause="Each rank's OpenBLAS starts one thread per core and has a fixed table of buffer "
              "regions (NUM_THREADS at build time). With 8 ranks on a 96-core node that is 768 "
              "threads competing for the cores and the table overflows.",
        fix="dtrain images set `OMP_NUM_THREADS=1`, `OPENBLAS_NUM_THREADS=1` and "
            "`GOTO_NUM_THREADS=1`, and `dtrain launch` forwards them with `-x`. Raise them per "
            "job only if cores per rank allow.",
        confirm="`dtrain diagnose` reports it as `blas-regions`; `docker inspect` shows the "
                "image's Env.",
        source=("https://github.com/OpenMathLib/OpenBLAS/issues/1882",
                "https://github.com/OpenMathLib/OpenBLAS/wiki/Faq"),
        doctor_checks=(),
    ),
    Entry(
        id="hvd-stall",
        title="Horovod stall: a subset of ranks submitted a collective",
        symptom="Training hangs; rank 0 prints the stall warning every minute, then lists the "
                "missing ranks and tensors.",
        messages=(
            "[2024-05-01 10:02:11.512345: W /tmp/pip-req-build-x/horovod/common/"
            "stall_inspector.cc:107] One or more tensors were submitted to be reduced, "
            "gathered or broadcasted by subset of ranks and are waiting for remainder of ranks "
            "for more than 60 seconds. This may indicate that different ranks are trying to "
            "submit different tensors or that only subset of ranks is submitting tensors, "
            "which will cause deadlock.",
        ),
        signatures=_re(r"One or more tensors were submitted to be reduced, gathered or "
                       r"broadcasted by subset of ranks"),
        cause="Ranks run different code paths: different Horovod, framework or model versions "
              "on different nodes (so different tensor names or counts), rank-dependent control "
              "flow (evaluation or checkpointing on rank 0 only while others continue), a "
              "different number of batches per rank, or a rank that died or is stuck (see the "
              "listed missing ranks).",
        fix="Run one image on every node (`dtrain launch` pulls, then refuses to start when "
            "the nodes hold different image IDs). "
            "Give every rank the same number of steps (shard the data evenly, "
            "`drop_remainder`), and do rank-0-only work outside collectives.",
        confirm="`dtrain doctor` check `image-digest`; the warning lists the missing ranks: "
                "read those ranks' output first.",
        source=(HVD_TROUBLE, "https://github.com/horovod/horovod/issues/403"),
        doctor_checks=("image-digest",),
        related=("hvd-version",),
    ),
    Entry(
        id="hvd-version",
        title="Horovod was built against another framework version",
        symptom="`import horovod.torch` / `horovod.tensorflow` fails on some or all nodes.",
        messages=(
            "horovod.common.exceptions.HorovodVersionMismatchError: Framework pytorch "
            "installed with version 2.3.0+cu121 but found version 2.3.1+cu121.",
            "ImportError: /opt/venv/lib/python3.10/site-packages/horovod/torch/"
            "mpi_lib_v2.cpython-310-x86_64-linux-gnu.so: undefined symbol: "
            "_ZN3c1017RegisterOperatorsD1Ev",
        ),
        signatures=_re(r"HorovodVersionMismatchError",
                       r"Framework \S+ installed with version \S+ but found version",
                       r"horovod/\S+\.so: undefined symbol"),
        cause="Horovod compiles against the framework present at install time. Installing or "
              "upgrading torch/tensorflow afterwards (a `pip install` in the job, a different "
              "image on one node) breaks the ABI.",
        fix="Use dtrain images unchanged: the framework and Horovod are pinned together "
            "(`images/*.yaml`, checked by `images/compat.yaml`) and the build runs "
            "`horovodrun --check-build` and `hvd.init()`. Put extra packages in a derived "
            "image that does not touch the framework.",
        confirm="`dtrain doctor` check `image-digest`; in the container: "
                "`horovodrun --check-build`.",
        source=(HVD_TROUBLE,
                "https://github.com/horovod/horovod/blob/master/horovod/common/exceptions.py"),
        doctor_checks=("image-digest",),
        related=("hvd-stall",),
    ),
    Entry(
        id="nccl-iface",
        title="NCCL uses the wrong interface (lo, docker0, a bridge)",
        symptom="NCCL init hangs or times out across nodes; with `NCCL_DEBUG=INFO` the chosen "
                "interface is shown.",
        messages=(
            "node-1:1234:1234 [0] NCCL INFO Bootstrap : Using docker0:172.17.0.1<0>",
            "node-1:1234:1234 [0] NCCL INFO Bootstrap: Using lo:127.0.0.1<0>",
            "node-1:1234:1290 [0] NCCL INFO NET/Socket : Using [0]docker0:172.17.0.1<0>",
            "node-1:1234:1234 [0] NCCL WARN Bootstrap : no socket interface found",
        ),
        signatures=_re(
            r"NCCL INFO Bootstrap ?: Using (?:lo|docker\d*|br-[0-9a-f]+|veth\w*):",
            r"NET/Socket ?: Using .*\[\d+\](?:lo|docker\d*|br-[0-9a-f]+|veth\w*):",
            r"NCCL WARN Bootstrap ?: no socket interface found",
        ),
        cause="Without `NCCL_SOCKET_IFNAME`, NCCL takes `ib*` interfaces first, then any "
              "interface except `docker*` and `lo`, and falls back to `docker*`, then `lo`, "
              "only when nothing else is up. So in a host-network container it can still pick "
              "a user-defined Docker bridge (`br-*`), a `veth*` or a second NIC the other nodes "
              "cannot reach, and an `NCCL_SOCKET_IFNAME` set wrongly (naming `docker0`, or "
              "set on one node only) forces a bad choice. A value that matches no interface "
              "on a node gives \"no socket interface found\".",
        fix="dtrain images set `NCCL_SOCKET_IFNAME=^docker0,lo`; `dtrain launch` sets it to "
            "the node's routable interface and forwards it with `-x`.",
        confirm="`dtrain doctor` check `nic`; rerun with `-x NCCL_DEBUG=INFO` and read the "
                "`Bootstrap : Using` line of each node.",
        source=(NCCL_ENV, NCCL_TROUBLE),
        doctor_checks=("nic",),
        related=("btl-iface", "efa-unused"),
    ),
    Entry(
        id="efa-unused",
        title="NCCL does not use EFA (aws-ofi-nccl failed), falls back to sockets",
        symptom="The job runs but inter-node bandwidth is a fraction of what the instance "
                "offers; with `NCCL_DEBUG=INFO` NCCL says `Using network Socket` instead of "
                "`Using network AWS Libfabric` / `Libfabric`.",
        messages=(
            "node-1:1234:1234 [0] NCCL WARN NET/OFI OFI fi_getinfo() call failed: No data "
            "available",
            "node-1:1234:1234 [0] NCCL INFO NET/OFI No eligible providers were found",
            "node-1:1234:1234 [0] NCCL WARN NET/OFI Unable to find a protocol that worked.  "
            "Failing initialization.",
            "node-1:1234:1234 [0] NCCL WARN NET/OFI aws-ofi-nccl initialization failed",
            "node-1:1234:1234 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using "
            "internal network plugin.",
            "node-1:1234:1234 [0] NCCL INFO NET/Plugin : dlerror=libnccl-net.so: cannot open shared object "
            "file: No such file or directory No plugin found (libnccl-net.so), using internal implementation",
            "[launch] NCCL network mismatch on node-2 (efa-unused): Socket on ens5 (libnccl-net.so "
            "not found: no net plugin); expected EFA x4 (p4d.24xlarge); likely no net plugin in the "
            "image (libnccl-net.so not found): an image without aws-ofi-nccl on an EFA type; fix: use "
            "a dtrain GPU image (aws-ofi-nccl in /opt/aws-ofi-nccl/lib, on LD_LIBRARY_PATH), or put "
            "the plugin's libnccl-net.so on LD_LIBRARY_PATH of the image "
            "(docs/troubleshooting.md#efa-unused)",
        ),
        signatures=_re(
            r"NET/OFI .*fi_getinfo\(\) call failed",
            r"NET/OFI No eligible providers were found",
            r"NET/OFI Unable to find a protocol that worked",
            r"NET/OFI aws-ofi-nccl initialization failed",
            r"NET/Plugin ?: (?:Could not find: libnccl-net|No plugin found|dlerror=libnccl-net)",
            r"\[launch\] NCCL network mismatch on (?P<node>\S+) \(efa-unused\)",
        ),
        cause="The EFA devices are not passed into the container (`/dev/infiniband/uverbs*`), "
              "the instance type has no EFA or it was not enabled at launch, the security "
              "group does not allow all traffic from itself, or the plugin is not on "
              "`LD_LIBRARY_PATH`, or the image has no EFA stage at all (label `dtrain.efa=no`: "
              "the GPU variants built from PyPI's CUDA wheels, made for g4dn, g5 and g6). On "
              "instance types without EFA these lines are expected.",
        fix="`dtrain launch` passes the EFA devices (`--device /dev/infiniband/uverbsN`) on "
            "EFA instance types; dtrain GPU images ship libfabric with the EFA provider and "
            "aws-ofi-nccl in `/opt/aws-ofi-nccl/lib` (on `LD_LIBRARY_PATH`). Enable EFA on "
            "the instances and allow all traffic within the security group. On p4d and p5 run "
            "the family's EFA variant (the `ubuntu22.04` tags; docs/images.md, \"Which variant\").",
        confirm="`dtrain doctor` check `efa` (`fi_info -p efa` in the container; WARN naming the "
                "EFA variant when the image has none); "
                "`NCCL_DEBUG=INFO` shows `Using network AWS Libfabric` when it works. `dtrain launch` "
                "checks it at the first collective on GPU nodes (`--nccl-check`, default fail on EFA types): "
                "the `[launch] NCCL network mismatch on NODE (efa-unused)` line names what NCCL chose "
                "(Socket without `libnccl-net.so`: an image without aws-ofi-nccl; NCCL's IB transport) "
                "and the fix.",
        source=(EFA_NCCL, "https://github.com/aws/aws-ofi-nccl"),
        doctor_checks=("efa",),
        related=("memlock", "nccl-iface"),
    ),
    Entry(
        id="efa-not-selected",
        title="aws-ofi-nccl loaded but chose a provider other than EFA",
        symptom="On an EFA instance type the job runs, `dtrain doctor --bandwidth` says WARN or "
                "FAIL, and NCCL's log (`NCCL_DEBUG=INFO`) has no `Selected Provider is efa` line; "
                "it names another libfabric provider instead.",
        messages=(
            "node-1:1234:1234 [0] NCCL INFO NET/OFI Selected Provider is tcp;ofi_rxm (found 1 nics)",
            "[launch] NCCL network mismatch on node-2 (efa-not-selected): OFI (aws-ofi-nccl) provider "
            "tcp;ofi_rxm, 1 NIC(s); expected EFA x4 (p4d.24xlarge); likely FI_PROVIDER=tcp is set for "
            "the ranks; fix: leave FI_PROVIDER unset or set it to efa (--env) "
            "(docs/troubleshooting.md#efa-not-selected)",
        ),
        signatures=_re(r"NET/OFI Selected [Pp]rovider is (?!efa\b)\w+",
                       r"\[launch\] NCCL network mismatch on (?P<node>\S+) \(efa-not-selected\)"),
        cause="libfabric found no usable EFA device in the container (devices not passed, EFA "
              "not enabled on the instance, the security group blocks traffic from itself), or "
              "`FI_PROVIDER` names another provider, so the plugin runs over TCP.",
        fix="Launch with dtrain (it passes `/dev/infiniband/uverbs*` on EFA types), enable EFA "
            "at instance launch, allow all traffic within the security group, and leave "
            "`FI_PROVIDER` unset or `efa`.",
        confirm="`dtrain doctor --bandwidth` (reads NCCL's log for `Selected Provider is efa`); "
                "`dtrain doctor` check `efa`; `fi_info -p efa` in the container. `dtrain launch --nccl-check` "
                "(default on GPU nodes) reads it at the first collective and names the node and the ranks' "
                "`FI_PROVIDER` where it is set.",
        source=(AWS_EFA_NCCL,),
        doctor_checks=("efa",),
        related=("efa-unused",),
    ),
    Entry(
        id="efa-fewer",
        title="Fewer EFA devices than the instance type has: NCCL uses a fraction of the fabric",
        symptom="NCCL runs over EFA (`Selected Provider is efa`) but inter-node busbw is a "
                "fraction of the type's: aws-ofi-nccl's line says `(found 1 nics)` on a "
                "p4d.24xlarge (4 EFA) or p5.48xlarge (32). nccl-tests on 2 x p4d.24xlarge: 77.9 "
                "GB/s busbw with 4 EFA, 20.3 GB/s with 1. Nothing fails: no line of NCCL's is an error, "
                "and NCCL's log alone cannot tell it from a single-EFA type; `dtrain launch`'s check, "
                "which knows the node's type, names it.",
        cause="The instances were launched with one EFA interface (a launch template or "
              "`run-instances` with one `NetworkInterfaces` entry, `DeviceIndex 0`, no "
              "`NetworkCardIndex`). An EFA is one per network card: p4d/p4de have 4, p5/p5e 32, "
              "p5en 16, trn1 8; each card needs its own interface at launch.",
        fix="`dtrain nodes up` attaches every EFA the type has (DescribeInstanceTypes "
            "`NetworkCards`, `EfaInfo.MaximumEfaInterfaces`): card 0 device 0 `efa`, card i "
            "device 1 `efa-only`. Such instances get no public IPv4 address (AWS assigns none "
            "with more than one interface): `nodes up` gives each an Elastic IP in the stack where "
            "their subnet reaches the internet through an internet gateway (docs/nodes.md, \"No "
            "public address with more than one interface\"), or put them in a subnet behind a NAT "
            "gateway (`--subnet`) and run the launcher inside the VPC. Elsewhere, "
            "launch with one interface per network card the same way.",
        messages=(
            "[launch] NCCL network mismatch on node-2 (efa-fewer): OFI (aws-ofi-nccl) provider efa, 1 "
            "NIC(s); expected EFA x4 (p4d.24xlarge); likely the node has 1 of the 4 EFA devices its "
            "type takes; fix: launch the instances with one EFA interface per network card (dtrain "
            "nodes up does) (docs/troubleshooting.md#efa-fewer)",
        ),
        signatures=_re(r"\[launch\] NCCL network mismatch on (?P<node>\S+) \(efa-fewer\)"),
        confirm="`dtrain launch` on GPU nodes compares NCCL's `found N nics` with the node's type at "
                "the first collective (`--nccl-check`, default fail on EFA types): its line "
                "`NCCL network mismatch on NODE (efa-fewer)` is what `dtrain diagnose` matches. "
                "`dtrain doctor` check `efa` (WARN `1 of the 4 EFA devices p4d.24xlarge has`; "
                "with `--image`, how many `fi_info -p efa` sees in the container); "
                "`dtrain doctor --bandwidth` (the `found N nics` of NCCL's log against the type).",
        source=("https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html",
                "https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_EfaInfo.html"),
        doctor_checks=("efa",),
        related=("efa-unused", "efa-not-selected"),
    ),
    Entry(
        id="nccl-few-sockets",
        title="NCCL on TCP with one socket per thread: a fraction of the link",
        symptom="On an instance type without EFA (or with EFA unused) `dtrain doctor --bandwidth` "
                "reports busbw far below the TCP throughput between the nodes; NCCL's log says "
                "`NET/Socket : Using 1 threads and 1 sockets per thread`.",
        messages=("node-1:1234:1290 [0] NCCL INFO NET/Socket : Using 1 threads and 1 sockets per thread",),
        signatures=_re(r"NET/Socket ?: Using [12] threads? and 1 sockets? per thread"),
        cause="NCCL's socket transport opens `NCCL_SOCKET_NTHREADS` x `NCCL_NSOCKS_PERTHREAD` "
              "connections per peer. One TCP flow on EC2 is limited to about 5 Gbit/s outside a "
              "placement group (10 inside), so one or two sockets leave most of a 25-100 Gbit/s "
              "link unused.",
        fix="On TCP-only types set e.g. `-e NCCL_SOCKET_NTHREADS=4 -e NCCL_NSOCKS_PERTHREAD=4` "
            "(their product at most 64), and put the nodes in a cluster placement group.",
        confirm="`dtrain doctor --bandwidth` before and after; the `NET/Socket : Using N threads "
                "and M sockets per thread` line of NCCL's log.",
        source=(NCCL_ENV, "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-network-bandwidth.html"),
        related=("efa-unused", "nccl-iface"),
    ),
    Entry(
        id="slow-link",
        title="one node's link is well below its peers' (the network gate names it)",
        symptom="`dtrain launch --check-network` stops before the job's first step with one line naming "
                "the node, its measured rate and what it was compared with, and removes everything it "
                "started; `dtrain doctor --bandwidth --quick` shows that node FAIL. Without the gate: "
                "training runs at a fraction of its speed, every step waiting on one node.",
        messages=("error: network gate: slow link on node-3 (10.213.0.13): 47.9 Mbit/s, below 50% of its "
                  "peers' median 2.41 Gbit/s (docs/troubleshooting.md#slow-link)",),
        signatures=_re(r"network gate: slow link on (?P<node>[^ ;:(]+)"),
        cause="What the gate measured (launch/jobs/netgate.py): inside the job's containers, on the "
              "job's NIC, every node sends one TCP stream for 1 s to its neighbour in a ring, then one "
              "to the next but one (python3 sockets: launch/node/netgate.py), so each node sends to two "
              "peers and receives from two, one stream each way at a time. A node's rate is the lower "
              "of its best send and its best receive: a node slow one way is slow in both pairs of that "
              "way, its peers each keep a fast one. The node is named when its rate is below half its "
              "peers' median, or below half of what one TCP flow reaches on its instance type "
              "(min(`link_gbps`, 5 Gbit/s, AWS's single-flow limit outside a cluster placement group), "
              "from `launch/jobs/network_expectations.yaml`, the table `doctor --bandwidth` uses). "
              "On EC2: an instance on degraded hardware, a node in another Availability Zone or "
              "outside the placement group, an instance type smaller than the others, traffic over "
              "the instance's allowance (ENA drops it), a path through a NAT or proxy.",
        fix="Replace the node: stop and start the instance (it moves to other hardware), or launch "
            "without it (drop it from the hostfile). Put the nodes in one cluster placement group, "
            "of one instance type.",
        confirm="`dtrain doctor --bandwidth --quick --image REF`: per node its best send and receive, "
                "its rate and PASS/WARN/FAIL (WARN: below 75% of the peers' median, or nothing to "
                "compare with: 2 nodes on a type the table does not know). On the node, "
                "`ethtool -S <nic> | grep allowance_exceeded`: ENA's counts of packets dropped over "
                "the instance's allowance.",
        source=("https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-network-bandwidth.html",
                "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/monitoring-network-performance-ena.html"),
        related=("nccl-few-sockets", "efa-unused"),
    ),
    Entry(
        id="memlock",
        title="locked-memory limit too low for EFA / verbs memory registration",
        symptom="Warnings at start, then memory registration failures or crashes in the "
                "first collective.",
        messages=(
            "libibverbs: Warning: RLIMIT_MEMLOCK is 32768 bytes.",
            "node-1:1234:1300 [0] NCCL WARN NET/OFI Unable to register memory (type = 2) for "
            "device 0. RC: -12, Error: Cannot allocate memory",
            "The OpenFabrics (openib) BTL failed to initialize while trying to",
            "[launch] NCCL network mismatch on node-2 (memlock): Socket on enp73s0 pod-id-link0 "
            "(aws-ofi-nccl: aws-ofi-nccl initialization failed); expected EFA x4 (p4d.24xlarge); "
            "likely aws-ofi-nccl gave up (aws-ofi-nccl initialization failed): memlock is 65536 KiB "
            "in the container; EFA needs unlimited; fix: let dockerd lift it: LimitMEMLOCK=infinity "
            "in its systemd unit (docs/troubleshooting.md#memlock)",
        ),
        signatures=_re(
            r"RLIMIT_MEMLOCK is \d+ bytes",
            r"Unable to register memory.*Cannot allocate memory",
            r"failed to initialize while trying to",
            r"\[launch\] NCCL network mismatch on (?P<node>\S+) \(memlock\)",
        ),
        cause="RDMA (EFA, verbs) pins the buffers it registers; the container's `memlock` "
              "ulimit caps how much. Docker's default is 64 KiB (libibverbs warns at 32 KiB "
              "and below, and only for non-root).",
        fix="`dtrain launch` runs node containers with `--ulimit memlock=-1` (unlimited); where "
            "dockerd itself cannot lift the limit it uses dockerd's ceiling, and warns on nodes with EFA "
            "devices (`dtrain doctor` reports it on every node).",
        confirm="`dtrain doctor` check `memlock` (`ulimit -l` in the container is "
                "`unlimited`).",
        source=(EFA_NCCL, "https://www.open-mpi.org/faq/?category=openfabrics#ib-locked-pages",
                DOCKER_RUN),
        doctor_checks=("memlock",),
        related=("efa-unused",),
    ),
    Entry(
        id="shm",
        title="/dev/shm too small in the container",
        symptom="NCCL fails to set up intra-node transport, DataLoader workers die, or a "
                "process dies with SIGBUS.",
        messages=(
            "node-1:1234:1290 [0] misc/shmutils.cc:72 NCCL WARN Error: failed to extend "
            "/dev/shm/nccl-UbzKZ9 to 9637892 bytes",
            "node-1:1234:1290 [0] misc/shmutils.cc:113 NCCL WARN Error while creating shared "
            "memory segment /dev/shm/nccl-UbzKZ9 (size 9637888)",
            "ERROR: Unexpected bus error encountered in worker. This might be caused by "
            "insufficient shared memory (shm).",
            "Bus error (core dumped)",
            "It appears as if there is not enough space for /dev/shm/vader_segment.node-1.0 "
            "(the shared-memory backing",
        ),
        signatures=_re(
            r"failed to extend /dev/shm/",
            r"Error while creating shared memory segment",
            r"Unexpected bus error encountered in worker",
            r"\bBus error\b",
            r"It appears as if there is not enough space for \S+ \(the shared-memory backing",
        ),
        cause="Docker gives containers a 64 MiB `/dev/shm`. NCCL's shared-memory transport, "
              "PyTorch DataLoader workers and Open MPI's vader BTL all allocate there.",
        fix="`dtrain launch` runs node containers with `--ipc=host` (the host's /dev/shm), or "
            "`--shm-size` when you pass one.",
        confirm="`dtrain doctor` check `shm` (`df -h /dev/shm` in the container).",
        source=(NCCL_TROUBLE, DOCKER_RUN,
                "https://github.com/pytorch/pytorch#using-pre-built-images"),
        doctor_checks=("shm",),
    ),
    Entry(
        id="docker-gpu",
        title="the container does not see the GPUs",
        symptom="`docker run --gpus` fails, or the framework finds no GPU.",
        messages=(
            "docker: Error response from daemon: could not select device driver \"\" with "
            "capabilities: [[gpu]].",
            "nvidia-container-cli: initialization error: nvml error: driver not loaded: "
            "unknown.",
            "RuntimeError: No CUDA GPUs are available",
        ),
        signatures=_re(
            r"could not select device driver \S* with capabilities: \[\[gpu\]\]",
            r"nvidia-container-cli: initialization error",
            r"No CUDA GPUs are available",
        ),
        cause="The NVIDIA Container Toolkit is not installed or not registered with Docker "
              "(no `nvidia` runtime), the NVIDIA driver is not loaded on the host, or the "
              "container was started without `--gpus`.",
        fix="Install the NVIDIA Container Toolkit and run `nvidia-ctk runtime configure "
            "--runtime=docker` then restart Docker (the EC2 Deep Learning AMIs ship it). "
            "`dtrain launch` passes `--gpus all` on every node where `nvidia-smi` finds GPUs. "
            "On nodes without GPUs, launch the CPU variant of the image "
            "([gpu-image-cpu-node](#gpu-image-cpu-node)).",
        confirm="`dtrain doctor` check `nvidia-runtime`.",
        source=("https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/"
                "install-guide.html",
                "https://docs.docker.com/engine/containers/resource_constraints/#gpu"),
        doctor_checks=("nvidia-runtime", "docker"),
        related=("cuda-driver", "gpu-image-cpu-node"),
    ),
    Entry(
        id="cuda-driver",
        title="host NVIDIA driver older than the image's CUDA",
        symptom="The container refuses to start, or CUDA initialisation fails in every rank.",
        messages=(
            "nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.8, "
            "please update your driver to a newer version, or use an earlier cuda container: "
            "unknown.",
            "CUDA driver version is insufficient for CUDA runtime version",
            "forward compatibility was attempted on non supported HW",
            "RuntimeError: The NVIDIA driver on your system is too old (found version 12020).",
            "failed call to cuInit: CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE: forward "
            "compatibility was attempted on non supported HW",
        ),
        signatures=_re(
            r"nvidia-container-cli: requirement error: unsatisfied condition: cuda",
            r"CUDA driver version is insufficient for CUDA runtime version",
            r"forward compatibility was attempted on non supported HW",
            r"The NVIDIA driver on your system is too old",
            r"CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
        ),
        cause="Each CUDA toolkit needs a minimum driver (images/compat.yaml `min_driver`). "
              "nvidia/cuda images declare it in `NVIDIA_REQUIRE_CUDA`, which the container "
              "toolkit enforces. The forward-compatibility package only works on data-center "
              "GPUs; on others CUDA reports \"forward compatibility was attempted on non "
              "supported HW\".",
        fix="Pick the image whose CUDA the node's driver supports (`dtrain launch` refuses an "
            "image whose `dtrain.min-driver` label is above a node's driver), or update the driver.",
        confirm="`dtrain doctor` check `gpu-driver` (compares `nvidia-smi` with the image's "
                "`dtrain.version.*` labels).",
        source=(CUDA_COMPAT,
                "https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html"),
        doctor_checks=("gpu-driver",),
        related=("docker-gpu",),
    ),
    Entry(
        id="cuda-cpu-wheel",
        title="a GPU script on the CPU image (PyTorch built without CUDA)",
        symptom="Every rank fails at its first CUDA call, before any step: a script written for GPUs "
                "(`torch.cuda.set_device(LOCAL_RANK)`, `.cuda()`, `backend=\"nccl\"`: the unedited "
                "pytorch/examples ddp-tutorial `multinode.py`) launched with a CPU image.",
        messages=(
            "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'",
            "AssertionError: Torch not compiled with CUDA enabled",
            "RuntimeError: Distributed package doesn't have NCCL built in",
        ),
        signatures=_re(r"module 'torch\._C' has no attribute '_cuda_\w+'",
                       r"Torch not compiled with CUDA enabled",
                       r"Distributed package doesn't have NCCL built in"),
        cause="The image's torch is the CPU build (dtrain's `-cpu-` variants: `torch==X+cpu`): "
              "`torch.cuda` has no device functions, a tensor cannot move to a GPU, and its "
              "torch.distributed has no NCCL. The script assumes GPU nodes.",
        fix="On GPU nodes launch the GPU variant of the image (a `-cu128-` tag, `dtrain images`). To "
            "run the script on CPU nodes, make it device-agnostic: pick the device with "
            "`torch.cuda.is_available()` (else `torch.device(\"cpu\")`), call `torch.cuda.set_device` "
            "only with CUDA, `init_process_group(backend=\"gloo\")` on CPU, and `DDP(model)` without "
            "`device_ids`.",
        confirm="In the image, `python -c 'import torch; print(torch.__version__, torch.version.cuda)'` "
                "prints a `+cpu` version and `None`.",
        source=("https://pytorch.org/docs/stable/notes/cuda.html#device-agnostic-code",
                "https://github.com/pytorch/examples/tree/main/distributed/ddp-tutorial-series",
                "https://pytorch.org/docs/stable/distributed.html#backends"),
        related=("gpu-image-cpu-node", "nccl-no-gpu"),
    ),
    Entry(
        id="gpu-image-cpu-node",
        title="a GPU image on nodes without NVIDIA GPUs (or without the NVIDIA runtime)",
        symptom="The image's CUDA build of torch finds no NVIDIA driver in the container: every "
                "rank fails at its first CUDA call; NVIDIA's own images warn as they start.",
        messages=(
            "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an "
            "NVIDIA GPU and installed a driver from http://www.nvidia.com/Download/index.aspx",
            "WARNING: The NVIDIA Driver was not detected.  GPU functionality will not be available.",
        ),
        signatures=_re(r"Found no NVIDIA driver on your system",
                       r"The NVIDIA Driver was not detected"),
        cause="The driver's libraries reach a container only through the NVIDIA container runtime "
              "(`--gpus`): a node without NVIDIA GPUs has none (`dtrain launch` passes `--gpus all` "
              "only where `nvidia-smi` finds GPUs), and on a GPU node without the NVIDIA Container "
              "Toolkit Docker cannot give them (`could not select device driver`: "
              "[docker-gpu](#docker-gpu)).",
        fix="On CPU nodes launch the CPU variant of the image (a `-cpu-` tag) with a device-agnostic "
            "script ([cuda-cpu-wheel](#cuda-cpu-wheel)); for GPUs, launch on GPU nodes whose Docker has "
            "the nvidia runtime.",
        confirm="`dtrain doctor` check `nvidia-runtime` (where the node has GPUs); `nvidia-smi` on the "
                "node lists none on a CPU node.",
        source=("https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/"
                "install-guide.html",
                "https://pytorch.org/docs/stable/notes/cuda.html#device-agnostic-code"),
        doctor_checks=("nvidia-runtime",),
        related=("docker-gpu", "cuda-cpu-wheel", "no-gpu"),
    ),
    Entry(
        id="no-gpu",
        title="a rank finds no GPU of its own (no device visible, more ranks than GPUs)",
        symptom="The driver is there but a rank's CUDA call fails: no device at all, or "
                "`torch.cuda.set_device(LOCAL_RANK)` past the node's GPUs.",
        messages=(
            "RuntimeError: CUDA error: no CUDA-capable device is detected",
            "RuntimeError: CUDA error: invalid device ordinal",
        ),
        signatures=_re(r"no CUDA-capable device is detected",
                       r"CUDA error: invalid device ordinal"),
        cause="`torch.cuda.device_count()` is 0 in the container (the GPUs not given to it, "
              "`CUDA_VISIBLE_DEVICES` empty or wrong) or lower than the ranks on the node: with "
              "`device_count() == 0`, or `LOCAL_RANK` at or above it, `set_device` asks for a device "
              "that does not exist (`invalid device ordinal`).",
        fix="One rank per GPU: the hostfile's `slots=` (torchrun's `--nproc-per-node`) no more than the "
            "node's GPUs (`--ec2-tag` takes them from the instance type), and `CUDA_VISIBLE_DEVICES` "
            "left unset; on nodes without GPUs, the CPU image ([cuda-cpu-wheel](#cuda-cpu-wheel)).",
        confirm="`python -c 'import torch; print(torch.cuda.device_count())'` in the container, against "
                "the ranks the node runs.",
        source=("https://pytorch.org/docs/stable/generated/torch.cuda.set_device.html",
                "https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html"),
        doctor_checks=("nvidia-runtime",),
        related=("gpu-image-cpu-node", "docker-gpu", "hostnames-dup"),
    ),
    Entry(
        id="nccl-no-gpu",
        title="NCCL asked for without GPUs (`backend=\"nccl\"` on CPU nodes)",
        symptom="`init_process_group(\"nccl\")` fails in every rank, or the first collective does.",
        messages=(
            "RuntimeError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!",
            "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
            "ProcessGroupNCCL.cpp:3699, unhandled cuda error (run with NCCL_DEBUG=INFO for details), "
            "NCCL version 2.27.3",
        ),
        signatures=_re(r"ProcessGroupNCCL is only supported with GPUs, no GPUs found",
                       r"NCCL error in: \S+, unhandled cuda error"),
        cause="NCCL moves tensors between GPUs only: a rank that sees no GPU cannot create its NCCL "
              "communicator, and a CUDA call inside NCCL that fails (no device, a device not this "
              "rank's) ends the collective with `unhandled cuda error`.",
        fix="On CPU nodes use gloo: `init_process_group(backend=\"gloo\")` (the CPU image's torch has "
            "no NCCL: [cuda-cpu-wheel](#cuda-cpu-wheel)). On GPU nodes give each rank its GPU before "
            "the first collective (`torch.cuda.set_device(LOCAL_RANK)`) and rerun with "
            "`-x NCCL_DEBUG=INFO` to see the CUDA call that failed.",
        confirm="`dtrain diagnose` reports it as `nccl-no-gpu`; `NCCL_DEBUG=INFO` names the CUDA error.",
        source=("https://pytorch.org/docs/stable/distributed.html#backends", NCCL_TROUBLE),
        related=("no-gpu", "cuda-cpu-wheel"),
    ),
    Entry(
        id="rdzv-unreachable",
        title="torchrun workers cannot reach the rendezvous (master) address",
        symptom="torchrun on the other nodes waits, then fails; the master node may be "
                "waiting for them.",
        messages=(
            "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The "
            "connection to the C10d store has failed. See inner exception for details.",
            "[W socket.cpp:697] [c10d] The IPv4 network addresses of (node-1, 29500) cannot "
            "be retrieved (gai error: -2 - Name or service not known).",
            "torch.distributed.DistNetworkError: The client socket has timed out after 900s "
            "while trying to connect to (node-1, 29500).",
            "The client socket has failed to connect to any network address of (node-1, "
            "29500).",
            "socket.gaierror: [Errno -2] Name or service not known",
        ),
        signatures=_re(
            r"RendezvousConnectionError",
            r"network addresses of \(\S+, \d+\) cannot be retrieved",
            r"The client socket has timed out after .* while trying to connect to",
            r"The client socket has failed to connect to any network address",
            r"gaierror: \[Errno -[23]\]",
        ),
        cause="`--rdzv-endpoint` / `MASTER_ADDR` names a host that other nodes cannot resolve "
              "(a short hostname only the master knows, `localhost`) or reach (security group, "
              "the master's address on docker0), or the rendezvous port is closed or the "
              "master never started.",
        fix="`dtrain launch` passes the first node's address (never a name) and a fixed port: "
            "`--master_addr/--master_port`, or `--rdzv_endpoint` with `--rdzv c10d`. Allow "
            "traffic between the nodes.",
        confirm="`dtrain doctor` checks `hostnames` and `nic`; from a worker: "
                "`python -c \"import socket; socket.create_connection(('node-1', 29500), 5)\"`.",
        source=(TORCHRUN,
                "https://pytorch.org/docs/stable/distributed.html#environment-variable-"
                "initialization"),
        doctor_checks=("hostnames", "nic"),
        related=("nccl-iface",),
    ),
    Entry(
        id="disk-full",
        title="no space left on the node's disk",
        symptom="Pulling the image fails, or checkpoints and logs fail mid-run.",
        messages=(
            "failed to register layer: write /opt/venv/lib/python3.10/site-packages/torch/lib/"
            "libtorch_cuda.so: no space left on device",
            "OSError: [Errno 28] No space left on device",
        ),
        # /dev/shm exhaustion says the same words: that is the shm entry.
        signatures=_re(r"^(?!.*/dev/shm).*[Nn]o space left on device"),
        cause="GPU images are 10-20 GB; old images, stopped containers and checkpoints fill "
              "the root volume (Docker's data root is on it by default).",
        fix="Give nodes a large enough root or data volume; `docker system prune` old dtrain "
            "images; write checkpoints to a mounted volume, not the container layer.",
        confirm="`dtrain doctor` check `disk`.",
        source=("https://docs.docker.com/engine/manage-resources/pruning/",),
        doctor_checks=("disk",),
        related=("shm",),
    ),
    Entry(
        id="clock-skew",
        title="the node's clock is wrong",
        symptom="Image pulls or AWS calls fail on one node with signature or certificate "
                "errors.",
        messages=(
            "x509: certificate has expired or is not yet valid",
            "An error occurred (InvalidSignatureException) when calling the "
            "GetAuthorizationToken operation: Signature expired: 20240501T100000Z is now "
            "earlier than 20240501T100512Z (20240501T101012Z - 5 min.)",
        ),
        signatures=_re(r"certificate has expired or is not yet valid",
                       r"Signature expired: \S+ is now earlier than"),
        cause="AWS request signatures and TLS certificates are checked against the node's "
              "clock; a clock off by minutes fails both. Timestamps in logs then also "
              "disagree between nodes.",
        fix="Run chrony against the Amazon Time Sync Service (169.254.169.123), as Amazon "
            "Linux and the Deep Learning AMIs do by default.",
        confirm="`dtrain doctor` check `clock`.",
        source=("https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/set-time.html",),
        doctor_checks=("clock",),
    ),
    Entry(
        id="host-oom",
        title="a rank was killed with SIGKILL (host out of memory)",
        symptom="One rank disappears without a Python traceback; mpirun or torchrun reports "
                "signal 9.",
        messages=(
            "mpirun noticed that process rank 3 with PID 4567 on node node-2 exited on signal "
            "9 (Killed).",
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) "
            "local_rank: 1 (pid: 4567) of binary: /opt/venv/bin/python",
            "  exitcode  : -9 (pid: 4567)",
            "Out of memory: Killed process 4567 (python) total-vm:98765432kB",
        ),
        signatures=_re(
            r"process rank (?P<rank>\d+) with PID \d+ on node (?P<node>\S+) exited on signal "
            r"9 \(Killed\)",
            r"failed \(exitcode: -9\) local_rank: (?P<local_rank>\d+)",
            r"exitcode +: -9\b",
            r"Out of memory: Kill(?:ed)? process",
        ),
        cause="The kernel's OOM killer (or a container `--memory` limit) killed the rank: too "
              "many DataLoader workers, a dataset loaded into memory once per rank, or "
              "pinned-memory buffers, times the ranks on the node.",
        fix="Budget host memory per rank (node memory / ranks per node); lower "
            "`num_workers`, load data lazily or via shared memory. `dtrain launch` sets no "
            "container memory limit. `dmesg -T | grep -i 'killed process'` on the node "
            "confirms.",
        confirm="`dtrain diagnose` reports it as `host-oom`; `dmesg` on the node named in the "
                "message.",
        source=("https://docs.docker.com/engine/containers/resource_constraints/"
                "#understand-the-risks-of-running-out-of-memory",),
        doctor_checks=(),
        related=("rank-exit",),
    ),
    Entry(
        id="pg-exit-abort",
        title="a rank aborts at exit after its last step (torch worker thread vs interpreter shutdown)",
        symptom="Every step ran and printed, then one rank (not always the same one, not on "
                "every run) dies with SIGABRT as the job ends; mpirun reports `exited on signal "
                "6 (Aborted)`, torchrun `exitcode: -6`, and the job fails.",
        messages=("terminate called without an active exception",),
        signatures=_re(r"terminate called without an active exception"),
        cause="A torch.distributed worker thread (gloo's `pt_gloo_runloop`) was still "
              "releasing the last collective when Python began to shut down; it needs the GIL, "
              "and a thread that asks for it during interpreter finalization is killed, which "
              "aborts the process (pytorch/pytorch#190489, open in torch 2.13). It happens when "
              "the process group is still alive at exit: no `destroy_process_group()`, or "
              "something (a DDP model) still holds the group. dtrain's own `ddp_grads.py` "
              "failed this way in about 1 run in 4 on 2 CPU cores, found by CI.",
        fix="Call `dist.destroy_process_group()` on every rank once training is done: with "
            "nothing else holding the group it joins the worker threads. A DDP model keeps the "
            "group alive, so there flush stdout/stderr and end with `os._exit(0)` after "
            "`destroy_process_group()`, as `/opt/dtrain/node/examples/ddp_grads.py` does. If "
            "the message appears mid-training, it is another thread: read that rank's earlier "
            "lines.",
        confirm="`dtrain diagnose` reports it as `pg-exit-abort`; every step line is present "
                "on every rank before the abort.",
        source=("https://github.com/pytorch/pytorch/issues/190489",
                "https://pytorch.org/docs/stable/distributed.html#shutdown"),
        doctor_checks=(),
        related=("rank-exit",),
    ),
    Entry(
        id="hang",
        title="the job hangs: no rank makes progress (reading a hang's stack dump)",
        symptom="Output stops while the job still runs. With `dtrain launch --hang-timeout S` "
                "the supervisor reads every rank's Python stack after S seconds, names the ranks "
                "not waiting in a collective (stopped, in disk wait, elsewhere), and the stacks "
                "follow (`[node r<rank>] stack of pid P, state X: ...`, then its frames, innermost "
                "first); without it, PyTorch's watchdog ends the job after its collective timeout "
                "(NCCL: 10 min by default).",
        messages=(
            "[launch] hang: no rank made progress for 10.4 s (--hang-timeout); stopped: r1 on "
            "node-2 (state T); r0, r2, r3 wait in a collective; every rank's Python stack follows",
            "[launch] hang: no rank made progress for 10.4 s (--hang-timeout); every rank waits in "
            "a collective (stacks); by progress, behind: r1 on node-2 (last progress 12.6 s ago, "
            "3 line(s)); every rank's Python stack follows",
            "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=212, "
            "OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for "
            "600041 milliseconds before timing out.",
        ),
        signatures=_re(r"hang: no rank made progress for [\d.]+ s",
                       r"\[Rank (?P<rank>\d+)\] Watchdog caught collective operation timeout"),
        cause="One rank stopped while the others wait for it in a collective: it is stuck "
              "in data loading (a dead DataLoader worker, a network file system), in user code "
              "(rank-dependent control flow: a rank-0-only evaluation or checkpoint that "
              "itself calls a collective, a different number of batches per rank), paused "
              "(SIGSTOP, a debugger, swapping), or it entered a different collective than the "
              "others. Every other rank then waits in the collective until the timeout.",
        fix="Read the dump rank by rank. **Which rank:** the hang line names the ranks the "
            "stacks show not waiting in a collective (ranks all blocked in the same collective are "
            "the victims, not the cause; `dtrain diagnose` reads a dump in a log the same way); "
            "only where every rank waits does it fall back to the `behind` ranks, those with fewer "
            "progress lines than the others (with `--progress-pattern`, one line per step) or "
            "silent first. With NCCL a collective returns before it completes, so its waiters show "
            "the line that waits for the GPU (`loss.item()`) and are named too: the stopped or "
            "odd one out is the culprit. **Where:** the innermost frames of each stack: `all_reduce`, "
            "`barrier`, `broadcast`, `allreduce` (Horovod), or DDP's backward (`_sync_buffers`, "
            "`backward`) mean the rank waits for others; `__next__` of a DataLoader, `read`, "
            "`_recv` on a queue, `open` mean data loading; any other frame of your own code is "
            "where that rank is. `state T` is a stopped process, `D` one waiting on disk, `R` "
            "one computing (a rank spinning in a loop). **Different collectives:** ranks "
            "blocked in different collective calls (`barrier` on one, `all_reduce` on "
            "another) ran different code paths. Without `--hang-timeout`, make the wait "
            "shorter and fatal: `init_process_group(timeout=timedelta(minutes=5))` and "
            "`TORCH_NCCL_ASYNC_ERROR_HANDLING=1` (`NCCL_ASYNC_ERROR_HANDLING` before torch "
            "2.2), so a hung collective ends the process and the launcher's restart applies; "
            "`py-spy dump --pid P` in the container (`docker exec`) shows one stack by hand.",
        confirm="`dtrain diagnose` reports it as `hang`; the dump's frames name the rank's "
                "file and line. `dtrain launch --hang-timeout 10 --progress-pattern '^step ' "
                "-- python /opt/dtrain/node/examples/hang_train.py` and `kill -STOP` of one "
                "rank in its container shows a dump to compare with (docs/launch.md, Hangs).",
        source=("https://github.com/benfred/py-spy#how-does-py-spy-work",
                "https://pytorch.org/docs/stable/distributed.html#torch.distributed.init_process_group",
                "https://pytorch.org/docs/stable/torch_nccl_environment_variables.html"),
        doctor_checks=(),
        related=("hvd-stall", "rank-exit"),
    ),
    Entry(
        id="straggler",
        title="one rank is slower than the others: every step waits for it",
        symptom="Steps get slower on every rank at once, mid-run, with no error: one node "
                "slowed down (thermal throttling, a noisy neighbour, a degraded link, a slow "
                "disk under its data loader) and every synchronous step waits for it. With "
                "`dtrain launch --straggler-check S` the supervisor names it.",
        messages=(
            "[launch] straggler: r2 on node-3 waited in a collective in 1/12 samples, the other "
            "ranks in 6.5/12 (median), over the last 12 s (--straggler-check 1): the others wait "
            "for it",
        ),
        signatures=_re(r"straggler: r(?P<rank>\d+) on (?P<node>\S+) waited in a collective"),
        cause="In synchronous training (DDP, Horovod, any allreduce per step) every rank's step "
              "lasts as long as the slowest rank's: the others wait for it inside the step's "
              "collective. The rank named rarely waits there while the others mostly do: its "
              "node computes, loads data or sends more slowly than theirs.",
        fix="Look at the named node: its CPU or GPU clocks and temperature (`nvidia-smi -q -d "
            "CLOCK,TEMPERATURE,PERFORMANCE`: a throttle reason), other processes on it, its "
            "link (`dtrain launch --check-network`), its disk. Take it out: `dtrain stop`, then "
            "launch again from the checkpoint without it (the hostfile minus that node, or "
            "`--spares` with a spare last).",
        confirm="`dtrain diagnose` reports it as `straggler`; `dtrain status --job NAME` shows "
                "`straggler NODE (rN, ...)`. `launch/node/examples/straggler_train.py` with one "
                "node's container slowed (`docker update --cpus 0.1`) shows one (docs/launch.md, "
                "Stragglers).",
        source=("https://github.com/NVIDIA/nvidia-resiliency-ext",
                "https://github.com/intelligent-machine-learning/dlrover/issues/678",
                "https://github.com/benfred/py-spy#how-does-py-spy-work"),
        doctor_checks=(),
        related=("hang", "slow-link"),
    ),
    Entry(
        id="straggler-native",
        title="`--straggler-check` names nobody under DDP or a compiled step",
        symptom="Steps slow down on every rank and `--straggler-check` names no straggler, or a "
                "hang's dump shows every rank in `backward` (`_engine_run_backward`) or in "
                "compiled code, none of them `waiting in a collective`; where py-spy could not "
                "read a rank's native frames while sampling, the log says so once per process.",
        messages=("[node-2 r1]   (native frames not read: Error: Failed to suspend process)",),
        signatures=_re(r"\(native frames not read: (?P<why>[^)]*)\)"),
        cause="DDP allreduces the gradients inside `loss.backward()`, from C++ (c10d's "
              "Reducer), and a compiled step (torch.compile, a TensorFlow function) calls its "
              "collectives from C++ too: the Python stack of a rank waiting for the others is "
              "the same as that of a rank computing. The supervisor reads native frames too "
              "(`py-spy dump --native`, where a rank's main thread is idle): a rank blocked in "
              "`c10d::Reducer::finalize_backward`, a c10d Work's `wait`, gloo's transport, "
              "Horovod's background loop or MPI waits in a collective. Native frames are lost "
              "where py-spy cannot unwind them: an image without py-spy 0.4 (it then reads "
              "Python only), a container without CAP_SYS_PTRACE, a stripped library. With NCCL "
              "a rank also waits on the host for the GPU (`loss.item()`, "
              "`cudaStreamSynchronize`), which is a collective's wait only under a c10d frame: "
              "a bare one may be the rank's own kernels, and is not counted.",
        fix="Use the images' py-spy (0.4.0) and run the containers as dtrain does "
            "(CAP_SYS_PTRACE). `py-spy dump --native --pid P` in the container (`docker exec`) "
            "shows what the sampler sees: a waiting rank's innermost named frame is "
            "`c10d::Reducer::finalize_backward` or `...Work...::wait`. Where the ranks wait on "
            "the GPU (NCCL), compare their steps' times instead (`--progress-pattern '^step '`, "
            "one line per step), or time the step's phases on each rank. A native read pauses "
            "the rank about 2 s (libtorch's symbols), two or three times per process and place "
            "it blocks at (docs/launch.md).",
        confirm="`launch/node/examples/ddp_train.py` (PyTorch's DDP pattern, unedited) with one "
                "node's container slowed (`docker update --cpus 0.1`) under `--straggler-check 1` "
                "names that node, and an even run names nobody (the 3 simulated nodes: "
                "`tests/test_straggler.py`). A hang's dump reads Python frames only (it must "
                "come within seconds).",
        source=("https://github.com/benfred/py-spy#can-py-spy-profile-native-extensions",
                "https://pytorch.org/docs/stable/notes/ddp.html",
                "https://github.com/pytorch/pytorch/blob/main/torch/csrc/distributed/c10d/reducer.cpp"),
        doctor_checks=(),
        related=("straggler", "hang"),
    ),
    Entry(
        id="collective-skipped",
        title="a rank did not enter the collective the others wait in (flight recorder)",
        symptom="A torchrun job hangs or fails on a collective's timeout, and the hang line (or a "
                "`[supervisor]` line after a failed attempt) gives the flight recorder's verdict.",
        messages=(
            "flight recorder: r1 (node-2) (entered up to #3) did not enter gloo:all_reduce #4 of "
            "process group 0 that r0 waits in",
            "flight recorder: r2 (node-3) (entered up to #7), r3 (node-3) (entered up to #6) did not enter "
            "nccl:all_reduce #8 of process group 0 that r0, r1 wait in",
            "flight recorder: r1 (node-2) (entered none) did not enter nccl:broadcast #0 of process group 1 "
            "that r0 waits in",
        ),
        # the first rank named (with its node where the supervisor knew it), then any others
        signatures=_re(r"flight recorder: r(?P<rank>\d+)(?: \((?P<node>[^)]+)\))? \(entered (?:up to #\d+|none)\)"
                       r"(?:, r\d+(?: \([^)]+\))? \(entered (?:up to #\d+|none)\))*(?: and \d+ more)? did not enter"),
        cause="Every process group numbers its collectives; dtrain turns on PyTorch's flight "
              "recorder for torchrun's ranks (TORCH_FR_BUFFER_SIZE=2000, a dump on an NCCL "
              "timeout or asked through the rank's debug pipe, into the node's job directory: "
              "`flightrec_rank_R`). The rank named entered fewer collectives of that group than "
              "the others: rank-dependent control flow (an evaluation, a checkpoint or a log "
              "step on some ranks only, a different number of batches per rank) or an exception "
              "caught and skipped on that rank. With gloo torch 2.13 records the collectives but "
              "writes no dump (the line then says `no flight-recorder dump from any rank`): the "
              "stacks' verdict in the same line stands alone.",
        fix="Read the named rank's stack in the dump that follows (its innermost frame is where "
            "it went instead) and make every rank call the same collectives in the same order: "
            "move the rank-only work outside the collective sequence, or let every rank join "
            "(`dist.barrier()` after rank 0's checkpoint). For gloo, call "
            "`torch._C._distributed_c10d._dump_fr_trace` in the job on a timeout's exception "
            "to get the records. Set any of TORCH_FR_BUFFER_SIZE, TORCH_FR_DUMP_TEMP_FILE, "
            "TORCH_NCCL_DEBUG_INFO_PIPE_FILE with `--env` and dtrain leaves the recorder to you.",
        confirm="`launch/node/examples/skip_collective.py` (rank 1 skips step 5's allreduce) under "
                "`--hang-timeout 10` names r1 from the stacks; its records, dumped in the rank, "
                "name it by sequence number (`tests/data/flight_recorder`).",
        source=("https://pytorch.org/docs/stable/torch_nccl_environment_variables.html",
                "https://pytorch.org/tutorials/prototype/flight_recorder_tutorial.html"),
        doctor_checks=(),
        related=("hang", "straggler-native"),
    ),
    Entry(
        id="gpu-oom",
        title="a rank ran out of GPU memory",
        symptom="A rank raises an out-of-memory error, usually at the first step or the "
                "first evaluation.",
        messages=(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
            "has a total capacity of 22.19 GiB of which 1.02 GiB is free.",
            "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when "
            "allocating tensor with shape[256,64,112,112]",
            "node-1:1234:1290 [0] NCCL WARN Cuda failure 'out of memory'",
            "failed to allocate 13.83G (14851977216 bytes) from device: "
            "CUDA_ERROR_OUT_OF_MEMORY: out of memory",
        ),
        signatures=_re(r"CUDA out of memory\. Tried to allocate",
                       r"OOM when allocating tensor",
                       r"CUDA_ERROR_OUT_OF_MEMORY",
                       r"NCCL WARN Cuda failure .*out of memory"),
        cause="The per-GPU batch does not fit, or two ranks share one GPU (the device was not "
              "set from the local rank). In Horovod and DDP the batch size in the script is "
              "per GPU: scaling to more GPUs does not shrink it.",
        fix="Pin each rank to `hvd.local_rank()` / `LOCAL_RANK`; lower the per-GPU batch (or "
            "use gradient accumulation).",
        confirm="`dtrain diagnose` reports it as `gpu-oom`; `nvidia-smi` while the job runs "
                "shows one process per GPU.",
        source=("https://pytorch.org/docs/stable/notes/cuda.html#memory-management",
                "https://horovod.readthedocs.io/en/stable/pytorch.html"),
        doctor_checks=(),
        related=("hostnames-dup", "throughput"),
    ),
    Entry(
        id="throughput",
        title="per-GPU numbers read as total throughput (\"multi-node is slower\")",
        symptom="No error. The job prints images/s or samples/s and the number barely moves, "
                "or drops, when nodes are added.",
        cause="Each Horovod/DDP rank processes its own batch: what a rank prints (and "
              "`Img/sec per GPU` in the Horovod benchmarks) is **per GPU**. Total throughput is "
              "per-GPU × number of ranks (`Total img/sec on N GPU(s)`). A per-GPU figure that "
              "falls a little from 1 to 2 nodes is the expected cost of inter-node allreduce. "
              "Likewise time per step stays about constant while an epoch (over a sharded "
              "dataset) gets shorter.",
        fix="Compare total throughput (per-GPU × ranks) or time per epoch. Scaling efficiency "
            "= per-GPU at N nodes / per-GPU at 1 node; well below ~0.8 across nodes points at "
            "the network: see [efa-unused](#efa-unused) and [nccl-iface](#nccl-iface).",
        confirm="Nothing to match: read the numbers. Run the Horovod synthetic benchmark on 1 "
                "and N nodes and compare `Total img/sec`.",
        source=("https://horovod.readthedocs.io/en/stable/benchmarks_include.html",),
        doctor_checks=(),
        related=("efa-unused", "nccl-iface"),
    ),
    Entry(
        id="orte-daemons",
        title="Open MPI could not start or keep its daemons (a consequence: find the cause)",
        symptom="mpirun reports that its daemons failed. This is what mpirun says after "
                "[ssh-port-22](#ssh-port-22), [remote-path](#remote-path), "
                "[oob-iface](#oob-iface), [ssh-auth](#ssh-auth) or a crashed node: look for "
                "those first.",
        messages=(
            "ORTE was unable to reliably start one or more daemons.",
            "An ORTE daemon has unexpectedly failed after launch and before",
            "ORTE has lost communication with a remote daemon.",
            "PRTE has lost communication with a remote daemon.",
        ),
        signatures=_re(
            r"(?:ORTE|PRTE) was unable to reliably start one or more daemons",
            r"An (?:ORTE|PRTE) daemon has unexpectedly failed after launch",
            r"(?:ORTE|PRTE) has lost communication with a remote daemon",
        ),
        cause="The daemon on a node never started (ssh failed, `orted` not found, libraries "
              "missing), could not call back to mpirun (out-of-band interface, firewall), or "
              "its node or container went away.",
        fix="Fix the specific cause reported above it. If none is: rerun with "
            "`--mca plm_base_verbose 10 --debug-daemons` and read the ssh command mpirun "
            "runs.",
        confirm="`dtrain doctor` checks `peer-2022` and `nic`.",
        source=(OMPI_FAQ_RUNNING, OMPI_FAQ_RSH),
        doctor_checks=("peer-2022", "nic"),
        catch_all=True,
        related=("ssh-port-22", "remote-path", "oob-iface"),
    ),
    Entry(
        id="ray-storage",
        title="Ray Train's storage is not one directory for every node",
        symptom="A Ray Train run (`--launcher ray`) across nodes fails as its workers start, "
                "every worker off the head node raising the error below; on one node the same "
                "script runs.",
        messages=(
            "RuntimeError: Unable to set up cluster storage with the following settings:",
            "Check that all nodes in the cluster have read/write access to the configured storage "
            "path. `RunConfig(storage_path)` should be set to a cloud storage URI or a shared "
            "filesystem path accessible by all nodes in your cluster ('s3://bucket' or '/mnt/nfs'). "
            "A local path on the head node is not accessible by worker nodes. See: "
            "https://docs.ray.io/en/latest/train/user-guides/persistent-storage.html",
        ),
        signatures=_re(
            r"Unable to set up cluster storage with the following settings",
            r"shared filesystem path accessible by all nodes in your cluster",
        ),
        cause="Ray Train keeps a run's results and checkpoints at `RunConfig(storage_path)`; "
              "without one, at `~/ray_results` as the driver expands it (Ray 2.60 reads no "
              "variable for it). The driver writes a marker file there and every worker checks "
              "for it at that path: each container's `~/ray_results` is its own disk, so workers "
              "on other nodes do not find it. Ray's own examples set no `storage_path`.",
        fix="Give the job a `--mount PATH` that every node shares (EFS: `dtrain volume create "
            "--efs`; FSx or NFS mounted on the nodes; the simulated cluster: `dtrain cluster up "
            "--shared HOST_DIR:PATH`): with `--launcher ray` dtrain makes each container's "
            "`~/ray_results` a link to `PATH/ray_results` before `ray start`, so the script runs "
            "unchanged. Or set `RunConfig(storage_path=\"s3://bucket/prefix\")` in the script.",
        confirm="The launch says `[launch] warning: ray: no writable --mount ...` before the job, "
                "and `[launch] ray: ... ~/ray_results -> PATH/ray_results` when it links it.",
        source=("https://docs.ray.io/en/latest/train/user-guides/persistent-storage.html",),
        doctor_checks=(),
    ),
    Entry(
        id="rank-exit",
        title="a rank exited non-zero (a consequence: find the first failing rank)",
        symptom="The launcher reports that a process failed and tears the job down. The "
                "message names the first rank to fail; the real error is in that rank's own "
                "output, usually earlier in the log.",
        messages=(
            "Primary job  terminated normally, but 1 process returned",
            "mpirun noticed that process rank 1 with PID 2345 on node node-2 exited on signal "
            "11 (Segmentation fault).",
            "mpirun detected that one or more processes exited with non-zero status, thus "
            "causing",
            "  Process name: [[12345,1],3]",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
            "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) "
            "local_rank: 0 (pid: 123) of binary: /opt/venv/bin/python",
            "RuntimeError: Horovod detected that one or more processes exited with non-zero "
            "status, thus causing the job to be terminated. The first process to do so was:",
            "Horovod has been shut down. This was caused by an exception on one of the ranks "
            "or an attempt to allreduce, allgather or broadcast a tensor after one of the "
            "ranks finished execution.",
        ),
        signatures=_re(
            r"Primary job +terminated normally, but \d+ process(?:es)? returned",
            r"(?:mpirun|prterun) noticed that process rank (?P<rank>\d+) with PID \d+ on node "
            r"(?P<node>\S+) exited on signal",
            r"(?:mpirun|prterun) detected that one or more processes exited with non-zero status",
            r"Process name: \[\[\d+,\d+\],(?P<rank>\d+)\]",
            r"ChildFailedError",
            r"failed \(exitcode: -?\d+\) local_rank: (?P<local_rank>\d+)",
            r"Horovod detected that one or more processes exited with non-zero status",
            r"Horovod has been shut down\. This was caused by an exception on one of the ranks",
        ),
        cause="Any error in one rank. The launcher then kills the others, which may print "
              "secondary errors (broken connections, Horovod shut down) that are not the cause.",
        fix="Read the first failing rank's output: `dtrain diagnose` lists rank-scoped lines "
            "with their rank and node. Run Open MPI with `--tag-output` (dtrain's launcher "
            "prefixes every line with `[node r<rank>]`) so lines can be attributed.",
        confirm="`dtrain diagnose` reports this after any specific cause it found.",
        source=(OMPI_MPIRUN4, "https://pytorch.org/docs/stable/elastic/errors.html"),
        doctor_checks=(),
        catch_all=True,
        related=("host-oom",),
    ),
    Entry(
        id="lazy-full-pull",
        title="A lazy-loading node pulled the whole image",
        symptom="`dtrain launch`'s pull step says `full pull on a lazy-loading node` for a node whose "
                "`dtrain doctor` check `lazy-load` says it can lazy-load, and nothing is read lazily. (With "
                "soci's default config the pull also takes about 8 s more per layer; dtrain's lazy nodes "
                "retry twice, not 8 times: about 1.3x a classic node's pull+run, measured.)",
        messages=(
            "node-1  pulled 330 MiB / 330 MiB  40 MiB/s  unpacked 100%  (full pull on a lazy-loading node: "
            "no SOCI index for this image; `dtrain push` makes one)  8.3 s",
        ),
        signatures=_re(r"full pull on a lazy-loading node"),
        cause="The node's SOCI snapshotter found no index it could read for the image's digest, so "
              "containerd pulled and unpacked every layer. The image was pushed with `--no-soci` (or where `dtrain push` "
              "said it could not make the index: not root, no soci, a plain-HTTP registry), or pushed again after it was indexed (a new digest); or the registry has no TLS (soci "
              "0.4.1 fetches the index over HTTPS only); or its certificate is not one the snapshotter "
              "trusts (a self-signed one needs `SSL_CERT_FILE` in soci-snapshotter-grpc's environment). "
              "Without an index soci 0.4.1 then tries to fetch each layer itself, and with Docker's "
              "size-0 descriptors it asks for the layer as a manifest, which a registry such as "
              "distribution 2.8 answers with a 500: `giving up after 3 attempt(s)` in its log on "
              "dtrain's nodes (`[http] MaxRetries = 2`), `giving up after 9 attempt(s)` (~8 s a layer) "
              "with soci's defaults.",
        fix="Push with `dtrain push` (the index by default; `--soci` insists) to a registry with TLS (ECR; the "
            "simulated cluster's in `dtrain cluster up`, lazy by default: push finds its bundle). The launch "
            "itself goes on either way: a node that finds no index pulls in full.",
        confirm="`dtrain doctor` check `lazy-load`; the registry's referrers fallback tag of the "
                "image's digest (`sha256-HEX`) holds the index; the snapshotter's log (on the simulated "
                "cluster /var/lib/dtrain-cluster/nodeN/soci.log) says why it skipped the index.",
        source=("https://github.com/awslabs/soci-snapshotter/blob/v0.4.1/docs/getting-started.md",),
        doctor_checks=("lazy-load",),
    ),
)

BY_ID: dict[str, Entry] = {e.id: e for e in ENTRIES}


# --------------------------------------------------------------------------------------------
# docs/troubleshooting.md

_INTRO = """\
# Troubleshooting multi-node jobs

<!-- GENERATED FILE, DO NOT EDIT. Generated from launch/troubleshoot/checklist.py by
     `python -m dtrain.launch.troubleshoot.checklist --write`; a test fails if the two differ. -->

Every entry below is a failure that cost someone days. Each has a stable id, the symptom with
the exact messages the tools print, the cause, the fix (what dtrain does to prevent it), how to
confirm it, and a source. The same entries drive two commands:

- **`dtrain doctor`** checks the nodes *before* a job: ssh, Docker, the GPU runtime and driver,
  port 2022, interfaces, hostnames, `/dev/shm`, memlock, EFA, clocks, disk. Each check has an id
  (table below); an entry's *Confirm* line names the checks that catch it.
- **`dtrain diagnose LOG`** reads a job's log *after* it failed and reports every entry whose
  messages appear in it, with the matching lines (and their rank and node when the line says),
  the cause and the fix. Specific causes come first, in the order they appear in the log;
  consequences such as "a rank exited non-zero" come last. LOG is a regular file (a pipe or a
  device is refused in one line), a job name, or `latest`. Without Invoke:
  `python -m dtrain.launch.troubleshoot.diagnose LOG`.

Logs are easiest to read with every line attributed: dtrain's launcher prefixes lines with
`[<node> r<rank>] `, and Open MPI's `--tag-output` with `[<job>,<rank>]<stderr>:`; `invoke
diagnose` understands both, as well as torchrun's `[default<local_rank>]:` and PyTorch's
`[rank<N>]:` prefixes.

When nothing matches: run `dtrain doctor`, rerun with `-x NCCL_DEBUG=INFO` (and, for Open MPI,
`--mca btl_base_verbose 30 --mca oob_base_verbose 10`), and look at `docker logs` of the node
containers, where sshd writes why it refused a connection.
"""


def _md_code(text: str) -> str:
    return "```\n" + text + "\n```"


def render_markdown() -> str:
    """docs/troubleshooting.md, from ENTRIES and DOCTOR_CHECKS."""
    out = [_INTRO]
    out.append("## `dtrain doctor` checks\n")
    out.append("| check | what it verifies | entries |")
    out.append("| --- | --- | --- |")
    for cid, what in DOCTOR_CHECKS.items():
        users = ", ".join(f"[{e.id}](#{e.id})" for e in ENTRIES if cid in e.doctor_checks)
        out.append(f"| `{cid}` | {what} | {users} |")
    out.append("")
    out.append("## Entries\n")
    out.append("| id | title |")
    out.append("| --- | --- |")
    for e in ENTRIES:
        out.append(f"| [{e.id}](#{e.id}) | {e.title} |")
    out.append("")
    for e in ENTRIES:
        out.append(f'<a id="{e.id}"></a>')
        out.append(f"### `{e.id}`: {e.title}\n")
        out.append(f"**Symptom.** {e.symptom}\n")
        if e.messages:
            out.append(_md_code("\n".join(e.messages)) + "\n")
        out.append(f"**Cause.** {e.cause}\n")
        out.append(f"**Fix.** {e.fix}\n")
        confirm = e.confirm
        if e.signatures and "dtrain diagnose" not in confirm:
            confirm += f" `dtrain diagnose` reports it as `{e.id}`."
        out.append(f"**Confirm.** {confirm}\n")
        if e.doctor_checks:
            out.append("**Doctor checks.** " + ", ".join(f"`{c}`" for c in e.doctor_checks)
                       + "\n")
        if e.related:
            out.append("**See also.** " + ", ".join(f"[{r}](#{r})" for r in e.related) + "\n")
        out.append("**Source.** " + ", ".join(f"<{s}>" for s in e.source) + "\n")
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = render_markdown()
    if args == ["--write"]:
        DOC.parent.mkdir(parents=True, exist_ok=True)
        DOC.write_text(text)
        print(f"wrote {DOC.relative_to(ROOT)}")
    elif args == ["--check"]:
        if not DOC.exists() or DOC.read_text() != text:
            print(f"error: {DOC.relative_to(ROOT)} is out of date; run "
                  "`python -m dtrain.launch.troubleshoot.checklist --write`", file=sys.stderr)
            return 1
        print(f"{DOC.relative_to(ROOT)} matches launch/troubleshoot/checklist.py")
    elif not args:
        sys.stdout.write(text)
    else:
        print("usage: python -m dtrain.launch.troubleshoot.checklist [--write | --check]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
