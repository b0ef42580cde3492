"""`--target mpijob` / `--for mpijob`: the launch written as a Kubeflow MPIJob (kubeflow/mpi-operator,
kubeflow.org/v2beta1, checked against the CRD of its v0.8.0 release): a launcher pod runs the
command over the worker pods with mpirun."""

from __future__ import annotations

from typing import Any

from dtrain.launch.jobs.launchers.mpirun import mpirun_argv, training_env
from dtrain.launch.other_tools import describe
from dtrain.launch.other_tools.describe import MPI_HOSTFILE, MPI_SSH, POD_IFACE, SSH_MOUNT, Crd, ManifestSpec
from dtrain.launch.targets.description import Description


def mpijob_mpirun_argv(spec: ManifestSpec) -> list[str]:
    """The launcher's mpirun: operator-written hostfile, pod NIC, the images' sshd port. The
    user's env goes as `-x NAME` only, its values in the launcher pod's env (as `dtrain launch`
    keeps them out of argv): an argv shows in `ps` and in every describe of the pod."""
    return mpirun_argv(None, list(spec.command), iface=POD_IFACE, env_names=list(spec.env), ssh=MPI_SSH,
                       hostfile=MPI_HOSTFILE, np=spec.workers * spec.slots)


class MpiJob(Description, Crd):
    name = "mpijob"
    filenames = {"mpijob": "mpijob.yaml"}
    launchers = {"per_node": False, "starts_cluster": False}
    runs = "one mpirun in the Launcher pod"
    schema_file = "crd-mpijob-v2beta1.json"
    maps = ("timeout", "max_restarts")  # runPolicy: activeDeadlineSeconds, backoffLimit
    what = {"mpijob": "MPIJob (mpi-operator v0.8.0 CRD)"}

    def text(self, spec: ManifestSpec) -> str:
        ctx: dict[str, Any] = describe.context(spec, self) | {
            "mpirun": mpijob_mpirun_argv(spec), "ssh_mount": SSH_MOUNT,
            "launcher_env": spec.plain_values,  # mpirun -x NAME: the job file's literals, as the Secret's names
            "env": describe.literal(training_env(POD_IFACE), spec)}
        return describe.jinja().get_template("mpijob.j2").render(ctx)


TARGET = MpiJob()
