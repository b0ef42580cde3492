"""Hugging Face `accelerate launch` (launch/jobs/launchers/accelerate.py): the seam's proof, one
module and one registry line. Its argv and env for 3 nodes, pinned; the run on the simulated
cluster needs a project image whose requirements.txt brings accelerate."""

from __future__ import annotations

import pytest

from dtrain import contract
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import launchers, runplan, supervision
from dtrain.launch.jobs.job import JobSpec, NodeFacts, per_node_argv
from dtrain.launch.jobs.launchers.accelerate import accelerate_argv
from dtrain.launch.remote.hosts import Node

CHECKPOINT = f"{contract.CHECKPOINT_NOW_VAR}={contract.CHECKPOINT_NOW}"


def facts(n: int = 3, slots: int = 2) -> list[NodeFacts]:
    return [NodeFacts(Node(f"h{i}", slots), f"10.0.0.{i}", f"node-{i}", f"ens{4 + i}", 0, (), "")
            for i in range(1, n + 1)]


def spec(**kw) -> JobSpec:
    return JobSpec(**{"image": "img", "command": ("python", "train.py", "--lr", "0.1"), "name": "j",
                      "launcher": "accelerate", "env": {"HF_TOKEN": "s3cret"}, **kw})


def test_one_command_per_node_for_3_nodes():
    run = launchers.launch_command(spec())
    assert run.per_node and run.rank_output == ""  # the supervisor ssh's each node; torchrun-style tags
    argvs = launchers.attempt_argv(run, launchers.plan_nodes(facts()))
    assert argvs == [[
        "env", f"NCCL_SOCKET_IFNAME=ens{4 + r}", f"GLOO_SOCKET_IFNAME=ens{4 + r}", CHECKPOINT,
        "accelerate", "launch", "--multi_gpu", "--num_machines", "3", "--machine_rank", str(r - 1),
        "--num_processes", "6", "--main_process_ip", "10.0.0.1", "--main_process_port", "29500",
        "--rdzv_backend", "static", "--same_network", "--tee", "3", "train.py", "--lr", "0.1",
    ] for r in (1, 2, 3)]
    assert "s3cret" not in str(argvs)  # --env values: the node's file, never the argv


def test_the_launcher_as_the_launch_and_the_supervisor_use_it():
    acc = launchers.get("accelerate")
    assert (acc.per_node, acc.needs_ssh, acc.ssh_here, acc.rank_output, acc.supervised) == (True, False, True,
                                                                                             False, True)
    assert not (acc.sagemaker or acc.manifests or acc.mpi_ranks or acc.same_iface or acc.starts_cluster)
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
