"""DeepSpeed's multi-node runner (launch/jobs/launchers/deepspeed.py): the launcher interface's
proof, one module and one registry line. Its argv, env and hostfile for 3 nodes, pinned; on the
simulated cluster, a project image whose requirements.txt brings deepspeed runs `deepspeed
--launcher openmpi` on 3 nodes: every rank's lines tagged, the allreduce's result equal on
every rank, a SIGSTOPped rank named by the hang check, the first-step timeline complete."""

from __future__ import annotations

import re
import shlex

import pytest

from dtrain import contract
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import launchers, runplan, supervision
from dtrain.launch.jobs.commands import job_argv
from dtrain.launch.jobs.spec import JobSpec, NodeFacts
from dtrain.launch.jobs.launchers import base
from dtrain.launch.jobs.launchers.deepspeed import HOSTFILE, RANK_ENV
from dtrain.launch.remote.hosts import Node

pytestmark = pytest.mark.second_cluster  # on a second simulated cluster in `dtrain test` (dtrain/suite.py)


def facts(n: int = 3, slots: int = 2, gpus: int = 0) -> list[NodeFacts]:
    return [NodeFacts(Node(f"h{i}", slots), f"10.0.0.{i}", f"node-{i}", "ens5", gpus, (), "")
            for i in range(1, n + 1)]


def spec(**kw) -> JobSpec:
    return JobSpec(**{"image": "img", "command": ("python", "train.py", "--lr", "0.1"), "name": "j",
                      "launcher": "deepspeed", "env": {"HF_TOKEN": "s3cret"}, **kw})


def _attempt(**kw) -> tuple[runplan.LaunchCommand, base.Attempt]:
    run = launchers.launch_command(spec(**kw))
    return run, launchers.attempt(run, launchers.plan_nodes(facts()))


def test_one_deepspeed_command_in_the_first_container_with_its_hostfile():
    run, att = _attempt(checkpoint_dir="/ckpt")
    assert not run.per_node and run.rank_output == contract.node_script("rank_output.py")
    assert att.files == ((HOSTFILE, "10.0.0.1 slots=2\n10.0.0.2 slots=2\n10.0.0.3 slots=2\n"),)
    assert att.env == (("DS_ACCELERATOR", "cpu"),)  # CPU nodes: DeepSpeed's CPU accelerator
    [argv] = att.argvs
    assert list(argv[:16]) == [
        "deepspeed", "--hostfile", f"{contract.CONTAINER_JOB_DIR}/{HOSTFILE}", "--launcher", "openmpi",
        "--master_addr", "10.0.0.1", "--master_port", "29500", "--no_ssh_check", "--force_multi", "--no_python",
        "--log_level", "warning", "--launcher_args", argv[15]]
    # each rank: rank_output.py tags its lines, RANK_ENV gives torch.distributed its variables
    assert list(argv[16:]) == [*runplan.RANK_OUTPUT_HEAD, run.rank_output, *runplan.RANK_OUTPUT_HEAD, RANK_ENV,
                               "-", "python", "train.py", "--lr", "0.1"]
    mpi = shlex.split(argv[15])  # what DeepSpeed's runner hands mpirun
    pairs = dict(zip(mpi[1::2], mpi[2::2]))
    assert mpi[:4] == ["--bind-to", "none", "--map-by", "slot"]
    mca = {a: b for f, a, b in zip(mpi, mpi[1:], mpi[2:]) if f == "--mca"}
    assert mca["btl_tcp_if_include"] == mca["oob_tcp_if_include"] == "ens5"  # not DeepSpeed's eth0
    assert mca["plm_rsh_args"].startswith("-p 2022")  # the containers' sshd
    assert "btl" not in mca  # DeepSpeed's runner sets it: Open MPI refuses a parameter twice
    exports = [b for f, b in zip(mpi, mpi[1:]) if f == "-x"]
    assert {"MASTER_ADDR=10.0.0.1", "MASTER_PORT=29500", "GLOO_SOCKET_IFNAME=ens5", "NCCL_SOCKET_IFNAME=ens5",
            "DS_ACCELERATOR=cpu", "HF_TOKEN", runplan.RESTART_VAR, "DTRAIN_CHECKPOINT_DIR"} <= set(exports)
    assert pairs and "s3cret" not in str(att)  # --env values: the node's file, never the argv


def test_env_deepspeed_would_export_with_its_value_reaches_the_ranks_from_the_env_file():
    """DeepSpeed's runner puts MLFLOW_*, PYTHON*, UCX_*, MV2_*, NCCL_* of its environment into
    mpirun's argv with their values: such --env names leave its environment (env --unset), and
    each rank reads them from its node's env file (RANK_ENV)."""
    run, att = _attempt(env={"MLFLOW_TRACKING_TOKEN": "s3cret", "HF_TOKEN": "t0ken"})
    [argv] = att.argvs
    assert list(argv[:3]) == ["env", "--unset=MLFLOW_TRACKING_TOKEN", "deepspeed"]
    i = argv.index(RANK_ENV)
    assert argv[i + 1] == "MLFLOW_TRACKING_TOKEN" and argv[i + 2:] == ("python", "train.py", "--lr", "0.1")
    exports = shlex.split(argv[argv.index("--launcher_args") + 1])
    assert "HF_TOKEN" in exports and "MLFLOW_TRACKING_TOKEN" not in exports
    assert "s3cret" not in str(att) and "t0ken" not in str(att)


def test_rank_env_gives_torch_distributed_its_variables_from_open_mpis():
    import os
    import subprocess
    import sys

    env = {"PATH": os.environ["PATH"], "OMPI_COMM_WORLD_RANK": "4", "OMPI_COMM_WORLD_SIZE": "6",
           "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "LOCAL_RANK": "kept"}
    r = subprocess.run([sys.executable, "-I", "-S", "-c", RANK_ENV, "-", sys.executable, "-c",
                        "import os; print(*(os.environ[k] for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', "
                        "'LOCAL_WORLD_SIZE')))"], env=env, capture_output=True, text=True, timeout=30)
    assert (r.returncode, r.stdout) == (0, "4 6 kept 2\n"), r.stderr


def test_gpu_nodes_open_mpi_5_and_the_users_mca():
    run = launchers.launch_command(spec(extra_mca=(("btl_tcp_links", "4"),)), ompi=5)
    att = launchers.attempt(run, launchers.plan_nodes(facts(gpus=8)))
    assert att.env == ()
    mpi = shlex.split(att.argvs[0][15])
    mca = {a: b for f, a, b in zip(mpi, mpi[1:], mpi[2:]) if f == "--mca"}
    assert "plm_ssh_args" in mca and "plm_rsh_args" not in mca  # Open MPI 5 (PRRTE)
    assert mca["btl_tcp_links"] == "4" and "DS_ACCELERATOR=cpu" not in mpi
    with pytest.raises(LaunchError, match=r"^--mca btl: deepspeed's runner sets btl itself"):
        launchers.attempt(launchers.launch_command(spec(extra_mca=(("btl", "tcp,self"),))),
                          launchers.plan_nodes(facts()))


def test_the_launcher_as_the_launch_and_the_supervisor_use_it():
    ds = launchers.get("deepspeed")
    assert (ds.placement, ds.output, ds.ranks_over_ssh, ds.ssh_here, ds.rank_output) == (
        base.FIRST_NODE, base.MPI_TAGS, True, False, True)
    assert ds.output.attributed and ds.notes(spec(), 3) == []  # hang, timeline, stragglers: every rank's lines
    assert not (ds.sagemaker or ds.manifests or ds.starts_cluster)
    check = ds.preflight(4)  # its own tool checked even where the image's label says Open MPI's version
    assert check[:2] == ["sh", "-c"] and "command -v deepspeed" in check[2]
    assert ds.preflight_result("mpirun (Open MPI) 4.1.4\n").ompi == 4
    with pytest.raises(LaunchError, match="not Open MPI"):
        ds.preflight_result("HYDRA build details")
    plan = supervision.plan(launchers.launch_command(spec()), launchers.plan_nodes(facts()), ssh=["ssh"])
    assert runplan.RunPlan.from_json(plan.to_json()) == plan
    assert launchers.attempt(plan.run, plan.nodes).files[0][0] == HOSTFILE
    assert job_argv(spec(), facts(), "ens5")[0] == "deepspeed"
    assert "dtrain/launch/jobs/launchers/deepspeed.py" in supervision.shipped_modules(
        contract.NODE_SCRIPTS / "supervise.py")


def test_nodes_whose_nics_differ_go_by_subnet():
    run = launchers.launch_command(spec(), subnet="10.0.0.0/16")
    argv = launchers.attempt(run, launchers.plan_nodes(facts())).argvs[0]
    mpi = shlex.split(argv[15])
    mca = {a: b for f, a, b in zip(mpi, mpi[1:], mpi[2:]) if f == "--mca"}
    assert mca["btl_tcp_if_include"] == "10.0.0.0/16"
    assert argv[-5:] == (f"{contract.NODE_DIR}/node_env.sh", "python", "train.py", "--lr", "0.1")


DS_SCRIPT = '''\
"""Each step: print `step N rank R/W`, allreduce (gloo) the rank's value times N, print the sum."""
import argparse
import os
import time

import deepspeed
import torch
import torch.distributed as dist


def load_batch(seconds):
    time.sleep(seconds)  # where a real job reads its next batch


def train_step(value):
    dist.all_reduce(value)  # every rank waits here for every other one
    return float(value)


ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=6)
ap.add_argument("--step-seconds", type=float, default=1.0)
args = ap.parse_args()
# torch.distributed directly: deepspeed.init_distributed() on a CPU node JIT-builds DeepSpeed's
# shared-memory op (deepspeed_shm_comm), which failed to build in the CPU image
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
print(f"ranks {rank}/{world} local {os.environ['LOCAL_RANK']} accelerator {os.environ.get('DS_ACCELERATOR')} "
      f"note {os.environ.get('MLFLOW_RUN_NOTE')} deepspeed {deepspeed.__version__}", flush=True)
for step in range(1, args.steps + 1):
    print(f"step {step} rank {rank}/{world}", flush=True)
    total = train_step(torch.tensor([rank + 1.0]) * step)
    print(f"sum {step} {total:g} rank {rank} attempt {os.environ.get('DTRAIN_RESTART')}", flush=True)
    load_batch(args.step_seconds)
dist.barrier()
print(f"rank {rank}: done ({args.steps} steps)", flush=True)
dist.destroy_process_group()
os._exit(0)  # the gloo group's teardown at exit can abort (pytorch#190489)
'''


@pytest.mark.cluster
def test_deepspeed_on_3_nodes_from_a_project_image_with_a_hang_named(cluster, remote_images, ca_bundle, tmp_path,
                                                                     monkeypatch):
    """A project whose requirements.txt brings deepspeed, built FROM the pytorch-ddp CPU image
    and pushed to the cluster registry, runs on 3 simulated nodes under `deepspeed --launcher
    openmpi`. Rank 1 (node-2) is stopped with SIGSTOP at its step 3: the hang check names it
    from its stack (state T); the restart runs every step, each rank's lines tagged with its
    node and rank, every rank's allreduce equal to the expected sum."""
    from dtrain.images import project as pj
    from dtrain.images.build import BuildOptions
    from dtrain.images.push import push_and_verify
    from dtrain.launch.jobs import store
    from test_hang import _stop_rank_when
    from test_wholerun import _job, _wait_clean

    proj = tmp_path / "ds-demo"
    proj.mkdir()
    (proj / "requirements.txt").write_text("deepspeed==0.19.8\n")
    (proj / "ds_train.py").write_text(DS_SCRIPT)
    ref = pj.build(proj, "pytorch-ddp", BuildOptions(ca_bundle=ca_bundle), say=lambda m: None)
    remote = f"{cluster.registry}/{ref}"
    push_and_verify(ref, remote, out=lambda m: None)

    name, steps = "t-deepspeed", 6
    seen: dict = {}
    import test_hang

    monkeypatch.setattr(test_hang, "RANK_PROCESS", "^[^ ]*python[^ ]* (-u )?[^ ]*ds_train\\.py")  # not its tagger
    watcher = _stop_rank_when(cluster, name, r"^\[node-2 r1\] step 3 rank 1/3$", 2, seen)
    said: list[str] = []  # the launch's own lines (the screen's; the log holds the job's)
    code, out, _ = _job(cluster, remote, ["python", "/workdir/ds_train.py", "--steps", str(steps)], name, n=3,
                        launcher="deepspeed", env={"MLFLOW_RUN_NOTE": "from the env file"}, master_port=29514, hang_timeout=10, progress_pattern="^step ",
                        max_restarts=1, say=said.append)
    watcher.join(5)
    assert "stopped" in seen, (seen, out[-3000:])
    assert any(re.match(r"\[launch\] sshd reachable on every node; deepspeed and Open MPI \d in the image", s)
               for s in said), said
    assert re.search(r"^\[launch\] hang: no rank made progress for 1\d\.\d s \(--hang-timeout\); "
                     r"stopped: r1 on node-2 \(state T\)", out, re.M), out[-4000:]
    assert re.search(r"^\[node-2 r1\] stack of pid \d+, state T: .*ds_train\.py", out, re.M), out[-4000:]
    assert re.search(r"^\[node-2 r1\]\s+load_batch \(ds_train\.py:\d+\)", out, re.M), out[-4000:]
    assert code == 0 and "[launch] job succeeded" in out, out[-4000:]
    # every rank's lines tagged with its own node and rank; the restart's sums equal on every rank
    lines = re.findall(r"^(.*)(step|sum) (\d+) .*rank (\d)\b.*$", out, re.M)
    assert lines and all(tag == f"[node-{int(r) + 1} r{r}] " for tag, _, _, r in lines), out[-4000:]
    sums = re.findall(r"^\[node-\d r(\d)\] sum (\d+) (\S+) rank \d attempt 1$", out, re.M)
    assert sorted((int(s), int(r)) for r, s, _ in sums) == [(s, r) for s in range(1, steps + 1) for r in range(3)]
    assert all(float(v) == 6 * int(s) for _, s, v in sums)  # (1 + 2 + 3) x step, on every rank
    for r in range(3):  # the --env value DeepSpeed would have put in mpirun's argv: from each node's env file
        assert re.search(rf"^\[node-{r + 1} r{r}\] ranks {r}/3 local 0 accelerator cpu note from the env file "
                         r"deepspeed 0\.19\.8$",
                         out, re.M), out[-4000:]
    timeline = store.load_job(name)["timeline"]  # each node's first step, read from its ranks' lines
    assert len({e["node"] for e in timeline if e["phase"] == "first-step" and e["restart"] == 0}) == 3, timeline
    _wait_clean(cluster, name)
