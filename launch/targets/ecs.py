"""`--target ecs` / `--for ecs`: the launch written as an ECS task definition (its workers as tasks,
the node container: sshd on 2022; --instance-type passes to it), or with `--launcher ray` Ray's
head and worker services (the `ecs-ray` document). Checked against botocore's own models."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from dtrain import contract
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs.launchers.ray import RAY_PORT, ray_head_argv, ray_job_argv, ray_worker_argv
from dtrain.launch.other_tools import describe
from dtrain.launch.other_tools.describe import (PLACEHOLDER_ENV_SECRET, PLACEHOLDER_EXECUTION_ROLE,
                                                PLACEHOLDER_KEY_SECRET, CommandRefused, ManifestSpec)
from dtrain.launch.targets.description import Description

EFA_DEVICE = "/dev/infiniband/uverbs{}"  # one device per EFA interface (linuxParameters.devices)
# ecs-ray: one document of four ECS requests, each checked against its own operation's model.
ECS_RAY_PARTS = {"headTaskDefinition": "RegisterTaskDefinition", "workerTaskDefinition": "RegisterTaskDefinition",
                 "headService": "CreateService", "workerService": "CreateService"}
_ROLE = ("execution_role_arn", PLACEHOLDER_EXECUTION_ROLE, "executionRoleArn", "--execution-role-arn")
_ENV = ("env_secret_arn", PLACEHOLDER_ENV_SECRET, "secrets (--env) valueFrom", "--env-secret-arn")


def ecs_devices(spec: ManifestSpec) -> list[dict[str, Any]]:
    """The type's EFA devices mapped into the container (as AWS Batch's and ECS's EFA docs)."""
    return [{"hostPath": EFA_DEVICE.format(i), "containerPath": EFA_DEVICE.format(i),
             "permissions": ["read", "write", "mknod"]} for i in range(spec.efa)]


def ecs_command(spec: ManifestSpec) -> list[str]:
    """Install the job key from the secret env var, drop the variable, then sshd on 2022."""
    script = ("set -eu; umask 077; mkdir -p /root/.ssh; "
              'printf "%s\\n" "$DTRAIN_SSH_KEY" > /root/.ssh/id_ed25519; '
              "ssh-keygen -y -f /root/.ssh/id_ed25519 > /root/.ssh/authorized_keys; "
              f"unset DTRAIN_SSH_KEY; exec {contract.ENTRYPOINT}")
    return ["/bin/bash", "-c", script]


def ecs_ray_context(spec: ManifestSpec) -> dict[str, Any]:
    """Seed 001 on ECS: a head service (1 task, no GPU) and a worker service (spec.workers tasks,
    one per instance, spec.gpus_per_worker GPUs each), host networking, the same `ray start`
    argv as `dtrain launch --launcher ray` (blocking: the task's main process).

    Workers find the head by a DNS name (spec.ray_head_address) that the user points at the
    head's instance (a Route 53 private record, or the instance's private DNS name): ECS
    service discovery (Cloud Map) registers host-network tasks as SRV records only, which
    `ray start --address` cannot read (A records need awsvpc networking). A worker that
    starts before the head fails and ECS starts it again, until it joins."""
    head = f"{spec.ray_head_address}:{RAY_PORT}"
    return {
        "ray_head": ray_head_argv(RAY_PORT, num_gpus=0, block=True),
        "ray_worker": ray_worker_argv(head, num_gpus=spec.gpus_per_worker, block=True),
        "ray_job": shlex.join(ray_job_argv(head, list(spec.command))),
        "ray_port": RAY_PORT,
    }


class Ecs(Description):
    name = "ecs"
    filenames = {"ecs": "ecs-task-definition.json", "ecs-ray": "ecs-ray.json"}
    clusters = True  # Ray's head and workers
    what = {"ecs": "ECS RegisterTaskDefinition",
            "ecs-ray": "ECS Ray head/worker (RegisterTaskDefinition, CreateService)"}
    placeholder_fields = {
        "ecs": (_ROLE, ("ssh_key_secret_arn", PLACEHOLDER_KEY_SECRET, "secrets DTRAIN_SSH_KEY valueFrom",
                        "--ssh-key-secret-arn"), _ENV),
        "ecs-ray": (("execution_role_arn", PLACEHOLDER_EXECUTION_ROLE, "executionRoleArn", "--execution-role-arn"),
                    _ENV)}

    def variant(self, spec: ManifestSpec) -> str:
        return "ecs-ray" if describe.cluster_launcher(spec) else "ecs"

    def runs_command(self, spec: ManifestSpec) -> bool:
        return self.variant(spec) != "ecs"  # the node container runs sshd only

    def check(self, spec: ManifestSpec) -> None:
        if self.variant(spec) == "ecs" and spec.command:  # the node container: sshd on 2022
            why = ("--for ecs: the task definition is the node container (sshd on 2022), it runs no command; run "
                   "the job with mpirun on one of the tasks (docs/other-tools.md, \"Amazon ECS\"), or use "
                   "--launcher ray")
            raise CommandRefused(why + "; give no command", why)
        if describe.cluster_launcher(spec) and not re.match(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$",
                                                            spec.ray_head_address):
            raise LaunchError(f"--ray-head-address {spec.ray_head_address!r}: expected a DNS name or IP address")

    def env_secret(self, spec: ManifestSpec) -> str:
        return spec.env_secret_arn

    def env_secret_notes(self, spec: ManifestSpec, via: str = "manifest") -> list[str]:
        if not spec.secret_names:
            return []
        names = ", ".join(spec.secret_names)
        flag = ("give its ARN with --env-secret-arn" if via == "manifest" else
                "give its ARN with dtrain manifest --for ecs ... --env-secret-arn ARN")
        return [f"[{via}] env {names}: not in the file; each comes from the JSON key of that name in the Secrets "
                f"Manager secret secrets[].valueFrom names: create it from a file holding a JSON object of those "
                f"keys (aws secretsmanager create-secret --name {spec.name}-env --secret-string file://FILE) and "
                f"{flag}"]

    def text(self, spec: ManifestSpec) -> str:
        ctx = describe.context(spec, self) | {"devices": ecs_devices(spec)}
        if self.variant(spec) == "ecs-ray":
            ctx |= ecs_ray_context(spec)
        else:
            ctx |= {"command": ecs_command(spec), "env": {}}
        return describe.jinja().get_template(f"{self.variant(spec)}.j2").render(ctx)

    def load(self, variant: str, text: str) -> Any:
        return json.loads(text)

    def problems(self, variant: str, doc: Any) -> list[str]:
        if variant == "ecs":
            return describe.boto_problems("ecs", "RegisterTaskDefinition", doc)
        if not isinstance(doc, dict):
            return ["(document): expected an object with " + ", ".join(ECS_RAY_PARTS)]
        out = [f"{k}: unknown part (known: {', '.join(ECS_RAY_PARTS)})" for k in doc if k not in ECS_RAY_PARTS]
        for part, op in ECS_RAY_PARTS.items():
            if part not in doc:
                out.append(f"{part}: missing ({op} request)")
            else:
                out += [f"{part} ({op}): {p}" for p in describe.boto_problems("ecs", op, doc[part])]
        return out


TARGET = Ecs()
