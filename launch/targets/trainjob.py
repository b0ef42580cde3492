"""`--target trainjob` / `--for trainjob`: the launch written as a Kubeflow Trainer v2 `TrainJob`
(trainer.kubeflow.org/v1alpha1, Trainer v2.3) and the `ClusterTrainingRuntime` it runs on, in one
file of two documents. A TrainJob cannot set the pod's shape (host network, /dev/shm, EFA, huge
pages, IPC_LOCK, sshd on 2022): the runtime dtrain writes beside it holds it; the TrainJob names
the image, the command, the nodes and processes per node, the env (from a Secret) and the time
limit (activeDeadlineSeconds).

- torchrun (the default): the runtime's `torch` policy; the trainer's torch plugin sets PET_NNODES,
  PET_NODE_RANK, PET_MASTER_ADDR/PORT in the container `node`, read by the same torchrun argv as
  `dtrain launch` through $(VAR).
- mpirun: the runtime's `mpi` policy (OpenMPI, the key Secret at /root/.ssh, the hostfile at
  /etc/mpi/hostfile): the `launcher` job runs the same mpirun as the MPIJob's, the `node` jobs the
  image's sshd on 2022.

Built as plain objects, checked by the field's own models (PyPI kubeflow-trainer-api 2.3.0: every
field known, of its type; `from_dict(doc).to_dict() == doc`) and strictly against the CRDs of
Trainer v2.3.0 (schemas/crd-trainjob-v1alpha1.json, crd-clustertrainingruntime-v1alpha1.json)."""

from __future__ import annotations

from typing import Any

from dtrain import contract
from dtrain.launch.jobs import launchers as launcher_registry
from dtrain.launch.jobs.launchers.mpirun import mpirun_argv, training_env
from dtrain.launch.jobs.launchers.torchrun import torchrun_argv, torchrun_env
from dtrain.launch.other_tools import describe
from dtrain.launch.other_tools.describe import MPI_HOSTFILE, MPI_SSH, SSH_MOUNT, Describer, ManifestSpec
from dtrain.launch.targets.description import Description

API = "trainer.kubeflow.org/v1alpha1"
ANCESTOR = {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}  # the job the TrainJob's trainer fills in
FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"
TRAINJOB_SCHEMA = "crd-trainjob-v1alpha1.json"
RUNTIME_SCHEMA = "crd-clustertrainingruntime-v1alpha1.json"


def runtime_name(spec: ManifestSpec) -> str:
    """The runtime's name: cluster-scoped, so a namespace's job does not take another's."""
    return f"{spec.namespace}-{spec.name}-runtime" if spec.namespace else f"{spec.name}-runtime"


def _mpi(spec: ManifestSpec, kind: Describer) -> bool:
    """The document runs mpirun (a launcher that is not per node), else torchrun on every node."""
    return not launcher_registry.get(describe.launcher(spec, kind)).per_node


def _literal_env(builtin: dict[str, str], spec: ManifestSpec) -> list[dict[str, Any]]:
    return [{"name": k, "value": v} for k, v in describe.literal(builtin, spec).items()]


def runtime(spec: ManifestSpec, kind: Describer) -> dict[str, Any]:
    """The ClusterTrainingRuntime: the ML policy and the JobSet of host-network pods."""
    iface = describe.host_iface(spec)
    jobset: dict[str, Any] = {}
    if spec.max_restarts is not None:
        jobset["failurePolicy"] = {"maxRestarts": spec.max_restarts}
    if _mpi(spec, kind):
        policy = {"numNodes": spec.workers, "mpi": {"numProcPerNode": spec.slots, "mpiImplementation": "OpenMPI",
                                                     "sshAuthMountPath": SSH_MOUNT, "runLauncherAsNode": False}}
        env = _literal_env(training_env(iface), spec)
        launcher = describe.node_pod(spec, args=[], env=[], gpus=False, selector=False)
        node = describe.node_pod(spec, args=[], env=env, sshd=True)
        jobset |= {"network": {"publishNotReadyAddresses": True},
                   "successPolicy": {"operator": "All", "targetReplicatedJobs": ["launcher"]},
                   "replicatedJobs": [
                       {"name": "launcher", "replicas": 1, "dependsOn": [{"name": "node", "status": "Ready"}],
                        "template": describe.job_template(launcher, labels=ANCESTOR)},
                       {"name": "node", "replicas": 1, "template": describe.job_template(node)}]}
        framework = "mpi"
    else:
        policy = {"numNodes": spec.workers, "torch": {}}
        env = _literal_env(torchrun_env(iface), spec)
        node = describe.node_pod(spec, args=[], env=env)
        jobset["replicatedJobs"] = [{"name": "node", "replicas": 1,
                                     "template": describe.job_template(node, labels=ANCESTOR)}]
        framework = "torch"
    return {"apiVersion": API, "kind": "ClusterTrainingRuntime",
            "metadata": {"name": runtime_name(spec),
                         "labels": {FRAMEWORK_LABEL: framework, contract.LABEL_JOB: spec.name}},
            "spec": {"mlPolicy": policy, "template": {"spec": jobset}}}


def trainer_args(spec: ManifestSpec, kind: Describer) -> list[str]:
    """The command's argv, as `dtrain launch` builds it: mpirun over the plugin's hostfile, or
    torchrun with the torch plugin's PET_* variables."""
    if _mpi(spec, kind):
        return mpirun_argv(None, list(spec.command), iface=describe.host_iface(spec), env_names=list(spec.env),
                           ssh=MPI_SSH, hostfile=MPI_HOSTFILE, np=spec.workers * spec.slots)
    return torchrun_argv(spec.workers, "$(PET_NODE_RANK)", spec.slots, "$(PET_MASTER_ADDR)", "$(PET_MASTER_PORT)",
                         list(spec.command))


def trainjob(spec: ManifestSpec, kind: Describer) -> dict[str, Any]:
    trainer: dict[str, Any] = {"image": spec.image, "command": [contract.ENTRYPOINT], "args": trainer_args(spec, kind),
                               "numNodes": spec.workers, "numProcPerNode": spec.slots}
    if spec.env:
        trainer["env"] = describe.secret_env(spec, kind)
    body: dict[str, Any] = {"runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                           "name": runtime_name(spec)}}
    if spec.timeout_s is not None:
        body["activeDeadlineSeconds"] = spec.timeout_s
    body["trainer"] = trainer
    return {"apiVersion": API, "kind": "TrainJob", "metadata": describe.metadata(spec), "spec": body}


class TrainJob(Description):
    name = "trainjob"
    filenames = {"trainjob": "trainjob.yaml"}
    launchers = {"starts_cluster": False}  # torchrun (torch policy) or mpirun (mpi policy)
    runs = "Trainer v2's torch or mpi runtime"
    default_launcher = "torchrun"
    kubernetes = True
    maps = ("timeout", "max_restarts", "mount", "iface")
    what = {"trainjob": "TrainJob + ClusterTrainingRuntime (Kubeflow Trainer v2.3.0 CRDs, kubeflow-trainer-api 2.3.0)"}

    def text(self, spec: ManifestSpec) -> str:
        mpi = _mpi(spec, self)
        header = [
            f"GENERATED by `dtrain manifest --for {self.name}` (launch/targets/trainjob.py).",
            "Kubeflow Trainer v2.3 (trainer.kubeflow.org/v1alpha1): the ClusterTrainingRuntime holds the pod",
            "shape a TrainJob cannot set (host network, /dev/shm, EFA, GPUs); the TrainJob runs on it.",
            ("mpi policy: the launcher runs mpirun over /etc/mpi/hostfile; node pods run sshd on "
             f"{contract.SSH_PORT}." if mpi else "torch policy: torchrun on every node, from the PET_* variables."),
            *describe.efa_header(spec),
            "Apply both: kubectl apply -f FILE (the runtime is cluster-scoped).",
        ]
        return describe.yaml_documents(header, [runtime(spec, self), trainjob(spec, self)])

    def load(self, variant: str, text: str) -> Any:
        import yaml

        return list(yaml.safe_load_all(text))

    def problems(self, variant: str, doc: Any) -> list[str]:
        from kubeflow_trainer_api import models

        from dtrain.launch.other_tools import crds

        if not (isinstance(doc, list) and len(doc) == 2):
            return ["(document): expected two documents, the ClusterTrainingRuntime then the TrainJob"]
        rt, job = doc
        return ([f"ClusterTrainingRuntime {p}" for p in crds.problems(RUNTIME_SCHEMA, rt)]
                + describe.model_problems(models.TrainerV1alpha1ClusterTrainingRuntime, rt)
                + [f"TrainJob {p}" for p in crds.problems(TRAINJOB_SCHEMA, job)]
                + describe.model_problems(models.TrainerV1alpha1TrainJob, job))


TARGET = TrainJob()
