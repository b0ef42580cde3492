"""`--target trainjob` / `--for trainjob` (launch/targets/trainjob.py): Kubeflow Trainer v2's TrainJob
and the ClusterTrainingRuntime beside it, from docs/launch.md's job file, valid against Trainer
v2.3.0's CRDs (strictly) and loaded by the field's own models (kubeflow-trainer-api 2.3.0); the pod
shape of p4d/p5 nodes (EFA, GPUs, huge pages, IPC_LOCK, /dev/shm) in the runtime (issue 48)."""

from __future__ import annotations

import copy

import pytest
import yaml
from kubeflow_trainer_api import models

import docs_jobfile
from dtrain import contract
from dtrain.launch import targets
from dtrain.launch.errors import LaunchError
from dtrain.launch.infra import instance_types
from dtrain.launch.jobs.launchers.mpirun import mpirun_argv
from dtrain.launch.jobs.launchers.torchrun import torchrun_argv
from dtrain.launch.other_tools import crds, describe
from dtrain.launch.other_tools import manifests as m
from dtrain.launch.targets import trainjob as tj

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/dtrain/pytorch-ddp:TAG"  # the documented file's
RUNTIME, TRAINJOB = "crd-clustertrainingruntime-v1alpha1.json", "crd-trainjob-v1alpha1.json"


def _node_job(runtime, name="node"):
    return next(j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"] if j["name"] == name)


def _pod(runtime, name="node"):
    return _node_job(runtime, name)["template"]["spec"]["template"]["spec"]


def _render(**kw):
    base = dict(image=IMAGE, command=("train.py", "--epochs", "10"), name="job-1", workers=4)
    return m.load("trainjob", m.render(m.ManifestSpec("trainjob", **{**base, **kw})))


def test_the_documented_job_file_is_refused_in_one_message_naming_every_field(tmp_path):
    r = docs_jobfile.launch(docs_jobfile.project(tmp_path), "--target", "trainjob", "--hosts", "h1,h2,h3,h4",
                            "--output", str(tmp_path / "out.yaml"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    # every field named by the file's line and key, in the file's order (launch/jobtarget.py check_fields)
    assert r.stderr.startswith("error: job.yaml:11: spares, job.yaml:12: min_nodes, job.yaml:13: checkpoint_dir and "
                               "job.yaml:15: check_network: not for --target trainjob"), r.stderr
    # what TrainJob maps is not refused: restarts (failurePolicy), the mount (hostPath), the timeout
    assert "max_restarts" not in r.stderr and "mount" not in r.stderr
    assert not (tmp_path / "out.yaml").exists()


@pytest.mark.parametrize("instance_type, efa", [("p4d.24xlarge", 4), ("p5.48xlarge", 32)])
def test_the_documented_job_file_written_valid_with_the_types_pod_shape(tmp_path, instance_type, efa):
    assert instance_types.efa_count(instance_type) == efa and instance_types.gpu_count(instance_type) == 8
    where = docs_jobfile.project(tmp_path, without=docs_jobfile.NODES_ONLY)
    r = docs_jobfile.launch(where, "--target", "trainjob", "--hosts", "h1,h2,h3,h4", "--instance-type", instance_type,
                            "--timeout", "7200", "--output", "trainjob.yaml")
    assert r.returncode == 0 and r.stdout == "wrote trainjob.yaml\n", r.stderr
    text = (where / "trainjob.yaml").read_text()
    assert text.startswith(describe.GENERATED) and "not-in-any-file" not in text  # --env: no value in the file
    runtime, job = yaml.safe_load_all(text)
    assert crds.problems(RUNTIME, runtime) == [] and crds.problems(TRAINJOB, job) == []
    # the field's own models load both documents, and give back exactly what was written
    assert models.TrainerV1alpha1ClusterTrainingRuntime.from_dict(runtime).to_dict() == runtime
    assert models.TrainerV1alpha1TrainJob.from_dict(job).to_dict() == job
    # the TrainJob: 4 nodes (the hosts), the type's 8 GPUs as processes, the time limit, env from the Secret
    spec = job["spec"]
    assert spec["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                  "name": "job-runtime"}
    assert spec["activeDeadlineSeconds"] == 7200
    assert spec["trainer"]["numNodes"] == 4 and spec["trainer"]["numProcPerNode"] == 8
    assert spec["trainer"]["image"] == IMAGE
    assert spec["trainer"]["args"] == torchrun_argv(4, "$(PET_NODE_RANK)", 8, "$(PET_MASTER_ADDR)",
                                                    "$(PET_MASTER_PORT)", ["train.py", "--epochs", "10"])
    assert spec["trainer"]["env"] == [  # the file's literal: a value; a name from the environment: the Secret's
        {"name": "EPOCHS", "value": "10"},
        {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "job-env", "key": "WANDB_API_KEY"}}}]
    # the runtime: the pod shape a TrainJob cannot set
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 4, "torch": {}}
    assert runtime["spec"]["template"]["spec"]["failurePolicy"] == {"maxRestarts": 2}  # the file's max_restarts
    assert _node_job(runtime)["template"]["metadata"]["labels"] == tj.ANCESTOR
    pod = _pod(runtime)
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": instance_type}
    (c,) = pod["containers"]
    assert c["name"] == "node"  # the container the trainer fills in
    shape = {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": efa, "hugepages-2Mi": "5120Mi"}
    assert c["resources"] == {"limits": shape, "requests": {**shape, "memory": "4096Mi"}}
    assert c["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16384Mi"}} in pod["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert {"name": "mount-0", "hostPath": {"path": "/fsx", "type": "Directory"}} in pod["volumes"]
    assert {"name": "mount-0", "mountPath": "/fsx"} in c["volumeMounts"]
    assert {"name": "NCCL_SOCKET_IFNAME", "value": describe.HOST_IFACE} in c["env"]
    assert "[launch] env WANDB_API_KEY: not in the file" in r.stderr and "EPOCHS" not in r.stderr  # a literal: in it


def test_mpirun_runs_on_the_mpi_policy_with_sshd_on_2022():
    runtime, job = _render(launcher="mpirun", gpus_per_worker=8, instance_type="p5.48xlarge",
                           env={"HF_TOKEN": "x"}, iface="enp1s0")
    assert crds.problems(RUNTIME, runtime) == [] and crds.problems(TRAINJOB, job) == []
    assert runtime["spec"]["mlPolicy"]["mpi"] == {"numProcPerNode": 8, "mpiImplementation": "OpenMPI",
                                                  "sshAuthMountPath": "/root/.ssh", "runLauncherAsNode": False}
    assert runtime["metadata"]["labels"][tj.FRAMEWORK_LABEL] == "mpi"
    launcher_job, node_job = _node_job(runtime, "launcher"), _node_job(runtime, "node")
    assert launcher_job["dependsOn"] == [{"name": "node", "status": "Ready"}]
    assert launcher_job["template"]["metadata"]["labels"] == tj.ANCESTOR  # the trainer's command runs there
    node = _pod(runtime, "node")["containers"][0]
    assert "args" not in node  # the image's entrypoint alone: sshd on 2022
    assert node["ports"] == [{"name": "ssh", "containerPort": contract.SSH_PORT, "protocol": "TCP"}]
    assert node["readinessProbe"]["tcpSocket"] == {"port": 2022}
    assert node["resources"]["limits"]["vpc.amazonaws.com/efa"] == 32
    launcher = _pod(runtime, "launcher")
    assert "resources" not in launcher["containers"][0] and "nodeSelector" not in launcher  # mpirun only
    assert launcher["hostNetwork"] is True  # Open MPI's TCP paths are the nodes' NIC (--iface)
    assert job["spec"]["trainer"]["args"] == mpirun_argv(
        None, ["train.py", "--epochs", "10"], iface="enp1s0", env_names=["HF_TOKEN"], ssh=describe.MPI_SSH,
        hostfile="/etc/mpi/hostfile", np=32)
    assert "x" not in [a for a in job["spec"]["trainer"]["args"]]  # the value: only in the Secret


def test_the_runtime_of_a_namespaced_job_is_named_apart():
    """ClusterTrainingRuntime is cluster-scoped: job-1 of two namespaces must not share one."""
    runtime, job = _render(namespace="team-a")
    assert runtime["metadata"]["name"] == job["spec"]["runtimeRef"]["name"] == "team-a-job-1-runtime"
    assert "namespace" not in runtime["metadata"] and job["metadata"]["namespace"] == "team-a"
    assert _render()[0]["metadata"]["name"] == "job-1-runtime"


def test_a_cpu_job_asks_for_no_gpu_efa_or_capability():
    runtime, job = _render(workers=2)
    c = _pod(runtime)["containers"][0]
    assert "resources" not in c and "securityContext" not in c and "nodeSelector" not in _pod(runtime)
    assert job["spec"]["trainer"]["numProcPerNode"] == 1
    assert "activeDeadlineSeconds" not in job["spec"]  # no timeout given: none
    assert "failurePolicy" not in runtime["spec"]["template"]["spec"]


def test_the_schema_check_is_strict():
    """An unknown field anywhere (a typo in the pod, in the trainer, at the top) and a wrong
    type are errors naming the field: the API server would prune the first silently."""
    runtime, job = _render(gpus_per_worker=8, instance_type="p4d.24xlarge")
    bad_rt = copy.deepcopy(runtime)
    pod = _pod(bad_rt)
    pod["contaners"] = pod.pop("containers")
    bad_rt["spec"]["mlPolicy"]["numNodes"] = "4"
    where = "spec.template.spec.replicatedJobs[0].template.spec.template.spec"
    found = crds.problems(RUNTIME, bad_rt)
    assert f"{where}.contaners: unknown field 'contaners'" in found
    assert f"{where}: 'containers' is a required property" in found
    assert "spec.mlPolicy.numNodes: '4' is not of type 'integer'" in found
    bad_job = copy.deepcopy(job)
    bad_job["spec"]["trainer"]["imagee"] = bad_job["spec"]["trainer"].pop("image")
    bad_job["spec"]["trainer"]["numProcPerNode"] = 8.5
    bad_job["metadata"]["nme"] = "x"
    found = crds.problems(TRAINJOB, bad_job)
    assert "spec.trainer.imagee: unknown field 'imagee'" in found
    assert "metadata.nme: unknown field 'nme'" in found
    assert any(p.startswith("spec.trainer.numProcPerNode: 8.5 is not") for p in found), found
    # the models too: a field they do not know, a value of another type
    assert describe.model_problems(models.TrainerV1alpha1TrainJob, bad_job) != []
    wrong = copy.deepcopy(job)
    wrong["spec"]["trainer"]["numNodes"] = "4"
    assert describe.model_problems(models.TrainerV1alpha1TrainJob, wrong) != []
    assert crds.problems(TRAINJOB, wrong) == ["spec.trainer.numNodes: '4' is not of type 'integer'"]
    with pytest.raises(describe.ManifestError,
                       match=r"(?s)^TrainJob \+ ClusterTrainingRuntime .*TrainJob spec.trainer.imagee: unknown field"):
        m.validate("trainjob", [runtime, bad_job])
    assert m.problems("trainjob", [runtime, job]) == []
    assert m.problems("trainjob", [job]) == ["(document): expected two documents, the ClusterTrainingRuntime "
                                             "then the TrainJob"]


def test_the_target_is_one_registered_module_with_its_fields():
    t = targets.get("trainjob")
    assert t is tj.TARGET and t.writes and "trainjob" in m.TARGETS
    assert {"timeout", "max_restarts", "mount"}.isdisjoint(t.refused) and "iface" not in t.ignored
    assert {"spares", "min_nodes", "checkpoint_dir", "check_network", "role"} <= set(t.refused)
    with pytest.raises(LaunchError, match=r"^--launcher ray: only for --for ecs"):
        m.render(m.ManifestSpec("trainjob", IMAGE, ("x.py",), launcher="ray"))
