"""Hugging Face `accelerate launch` (launch/jobs/launchers/accelerate.py): the seam's proof, one
module and one registry line. Its argv and env for 3 nodes, pinned; the run on the simulated
cluster needs a project image whose requirements.txt brings accelerate."""

from __future__ import annotations

import pytest

from dtrain import contract
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import launchers
from dtrain.launch.jobs import runplan, supervision
from dtrain.launch.jobs.launchers import base
from dtrain.launch.jobs.commands import per_node_argv
from dtrain.launch.jobs.spec import JobSpec, NodeFacts
from dtrain.launch.jobs.launchers.accelerate import accelerate_argv
from dtrain.launch.remote.hosts import Node

pytestmark = pytest.mark.second_cluster  # on a second simulated cluster in `dtrain test` (dtrain/suite.py)

CHECKPOINT = f"{contract.CHECKPOINT_NOW_VAR}={contract.CHECKPOINT_NOW}"


def facts(n: int = 3, slots: int = 2, gpus: int = 0) -> list[NodeFacts]:
    return [NodeFacts(Node(f"h{i}", slots), f"10.0.0.{i}", f"node-{i}", f"ens{4 + i}", gpus, (), "")
            for i in range(1, n + 1)]


def spec(**kw) -> JobSpec:
    return JobSpec(**{"image": "img", "command": ("python", "train.py", "--lr", "0.1"), "name": "j",
                      "launcher": "accelerate", "env": {"HF_TOKEN": "s3cret"}, **kw})


def test_one_command_per_node_for_3_nodes():
    run = launchers.launch_command(spec())
    assert run.per_node and run.rank_output == ""  # the supervisor ssh's each node; torchrun-style tags
    argvs = launchers.attempt_argv(run, launchers.plan_nodes(facts()))
    assert argvs == [[
        "env", f"NCCL_SOCKET_IFNAME=ens{4 + r}", f"GLOO_SOCKET_IFNAME=ens{4 + r}", "ACCELERATE_USE_CPU=true",
        CHECKPOINT, "accelerate", "launch", "--multi_gpu", "--num_machines", "3", "--machine_rank", str(r - 1),
        "--num_processes", "6", "--main_process_ip", "10.0.0.1", "--main_process_port", "29500",
        "--rdzv_backend", "static", "--same_network", "--tee", "3", "train.py", "--lr", "0.1",
    ] for r in (1, 2, 3)]
    assert "s3cret" not in str(argvs)  # --env values: the node's file, never the argv


def test_gpu_nodes_leave_accelerate_to_pick_nccl():
    """ACCELERATE_USE_CPU only where a node has no GPU: on CPU nodes without it accelerate 1.15
    sees no CUDA and every process trains alone (DistributedType.NO)."""
    run = launchers.launch_command(spec())
    gpu = launchers.attempt_argv(run, launchers.plan_nodes(facts(gpus=8, slots=8)))
    assert all("ACCELERATE_USE_CPU=true" not in a for a in gpu)
    assert [a[a.index("--num_processes") + 1] for a in gpu] == ["24"] * 3


def test_the_launcher_as_the_launch_and_the_supervisor_use_it():
    acc = launchers.get("accelerate")
    assert (acc.placement, acc.output, acc.ranks_over_ssh, acc.ssh_here, acc.rank_output) == (
        "every-node", base.NODE_LINES, False, True, False)
    assert (acc.per_node, acc.supervised, acc.preflight(None)) == (True, True, None)
    assert not (acc.sagemaker or acc.manifests or acc.mpi_ranks or acc.starts_cluster)
    assert acc.exec_env("ens5") == {"NCCL_SOCKET_IFNAME": "ens5", "GLOO_SOCKET_IFNAME": "ens5"}
    f = facts()
    assert acc.argv(spec(), f, 1, "eth9")[:3] == ["env", "NCCL_SOCKET_IFNAME=eth9", "GLOO_SOCKET_IFNAME=eth9"]
    argv = per_node_argv(spec(), f, 2, "ens7")  # docker exec of it in node 3's container
    assert argv[:2] == ["docker", "exec"] and argv[argv.index("--machine_rank") + 1] == "2"
    plan = supervision.plan(launchers.launch_command(spec(checkpoint_dir="/ckpt")),
                            launchers.plan_nodes(f), ssh=["ssh"])
    assert runplan.RunPlan.from_json(plan.to_json()) == plan
    assert "DTRAIN_CHECKPOINT_DIR=/ckpt" in launchers.attempt_argv(plan.run, plan.nodes)[0]
    assert "dtrain/launch/jobs/launchers/accelerate.py" in supervision.shipped_modules(contract.NODE_SCRIPTS / "supervise.py")


def test_c10d_rendezvous_module_and_master_port():
    run = launchers.launch_command(spec(rdzv="c10d", master_port=29611, command=("python", "-m", "pkg.train")))
    argv = launchers.attempt_argv(run, launchers.plan_nodes(facts()))[1]
    assert argv[argv.index("accelerate"):] == [
        "accelerate", "launch", "--multi_gpu", "--num_machines", "3", "--machine_rank", "1", "--num_processes",
        "6", "--main_process_ip", "10.0.0.1", "--main_process_port", "29611", "--rdzv_backend", "c10d",
        "--tee", "3", "-m", "pkg.train"]


def test_one_process_runs_without_multi_gpu():
    assert accelerate_argv(1, 0, 1, "10.0.0.1", 29500, ["t.py"]) == [
        "accelerate", "launch", "--num_machines", "1", "--machine_rank", "0", "--num_processes", "1",
        "--main_process_ip", "10.0.0.1", "--main_process_port", "29500", "--rdzv_backend", "static",
        "--same_network", "--tee", "3", "t.py"]


def test_nodes_with_different_slots_are_a_user_error():
    f = facts()
    f[1] = NodeFacts(Node("h2", 4), "10.0.0.2", "node-2", "ens6", 0, (), "")
    with pytest.raises(LaunchError, match=r"^--launcher accelerate: .*node-2:4"):
        launchers.attempt_argv(launchers.launch_command(spec()), launchers.plan_nodes(f))


@pytest.mark.parametrize("args", [(3, 3, 6), (3, 0, 2), (0, 0, 1)])
def test_bad_topology_is_a_programming_mistake(args):
    with pytest.raises(ValueError):
        accelerate_argv(*args, "10.0.0.1", 29500, ["t.py"])


ACC_SCRIPT = '''\
import torch
from accelerate import Accelerator

acc = Accelerator()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = acc.prepare(model, opt)
for step in range(3):
    x = torch.randn(8, 4) + acc.process_index  # each rank its own data: only DDP keeps them equal
    acc.backward(model(x).pow(2).mean())
    opt.step()
    opt.zero_grad()
    w = acc.unwrap_model(model).weight.sum().item()
    print(f"step {step} rank {acc.process_index}/{acc.num_processes} {acc.distributed_type} w {w:.6f}", flush=True)
print("gathered", acc.gather(torch.tensor([acc.process_index + 1.0])).tolist(), flush=True)
acc.wait_for_everyone()
acc.end_training()  # destroys the process group: without it Gloo's threads may abort the exit
# and no interpreter finalization: DDP keeps its gloo group alive past that, and a worker thread
# still releasing the last collective aborts torch 2.13's exit ("terminate called without an
# active exception", pytorch/pytorch#190489; launch/node/examples/ddp_grads.py does the same)
import os, sys  # noqa: E401,E402
sys.stdout.flush()
os._exit(0)
'''


@pytest.mark.cluster
def test_accelerate_trains_across_3_nodes_from_a_project_image(cluster, remote_images, ca_bundle, tmp_path):
    """The seam's proof on real nodes: a project whose requirements.txt brings accelerate, built
    FROM the pytorch-ddp CPU image and pushed to the cluster registry, runs `accelerate launch`
    on 3 simulated nodes with 2 processes each: 6 ranks in one Gloo group (gather sees all six)
    whose weights agree at every step, though each rank draws its own data."""
    import re
    from dataclasses import replace

    from dtrain.images import project as pj
    from dtrain.images.build import BuildOptions
    from dtrain.images.push import push_and_verify
    from dtrain.launch.jobs.job import Job
    from dtrain.launch.jobs.store import job_log
    from dtrain.launch.remote.hosts import parse_hostfile

    proj = tmp_path / "acc-demo"
    proj.mkdir()
    (proj / "requirements.txt").write_text("accelerate==1.15.0\n")
    (proj / "acc_train.py").write_text(ACC_SCRIPT)
    ref = pj.build(proj, "pytorch-ddp", BuildOptions(ca_bundle=ca_bundle), say=lambda m: None)
    remote = f"{cluster.registry}/{ref}"
    push_and_verify(ref, remote, out=lambda m: None)

    nodes = [replace(n, slots=2) for n in parse_hostfile(cluster.hostfile)[:3]]
    job = Job(JobSpec(image=remote, command=("python", "/workdir/acc_train.py"), name="t-accelerate",
                      launcher="accelerate", ssh_opts=("-F", cluster.ssh_config)), nodes, say=lambda m: None)
    code = job.run()
    out = job_log("t-accelerate").read_text()
    assert code == 0, out[-4000:]
    steps = re.findall(r"step (\d) rank (\d)/(\d) DistributedType\.(\w+) w (\S+)", out)
    assert sorted({(s, r) for s, r, *_ in steps}) == [(str(s), str(r)) for s in range(3) for r in range(6)], out[-3000:]
    assert {(n, t) for _, _, n, t, _ in steps} == {("6", "MULTI_CPU")}
    for s in "012":
        assert len({w for step, _, _, _, w in steps if step == s}) == 1, f"step {s}: ranks disagree"
    assert out.count("gathered [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]") == 6
