"""`--target jobset` / `--for jobset` (launch/targets/jobset.py): a plain JobSet (jobset.x-k8s.io/v1alpha2)
from docs/launch.md's job file, valid strictly against JobSet v0.12.0's CRD and loaded by the
kubeflow-trainer-api 2.3.0 models of JobSet; p4d/p5 pod shape; the timeout as the Job's
activeDeadlineSeconds (issue 48)."""

from __future__ import annotations

import copy

import pytest
import yaml
from kubeflow_trainer_api import models

import docs_jobfile
from dtrain import contract
from dtrain.launch import targets
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs.launchers.torchrun import torchrun_argv
from dtrain.launch.other_tools import crds, describe
from dtrain.launch.other_tools import manifests as m
from dtrain.launch.targets import jobset as js

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/dtrain/pytorch-ddp:TAG"
SCHEMA = "crd-jobset-v1alpha2.json"


def _render(**kw):
    base = dict(image=IMAGE, command=("train.py",), name="job-1", workers=3)
    return m.load("jobset", m.render(m.ManifestSpec("jobset", **{**base, **kw})))


def test_the_documented_job_file_is_refused_in_one_message_naming_every_field(tmp_path):
    r = docs_jobfile.launch(docs_jobfile.project(tmp_path), "--target", "jobset", "--hosts", "h1,h2,h3")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    # every field named by the file's line and key, in the file's order (launch/jobtarget.py check_fields)
    assert r.stderr.startswith("error: job.yaml:11: spares, job.yaml:12: min_nodes, job.yaml:13: checkpoint_dir and "
                               "job.yaml:15: check_network: not for --target jobset"), r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("instance_type, efa", [("p4d.24xlarge", 4), ("p5.48xlarge", 32)])
def test_the_documented_job_file_written_valid_with_the_types_pod_shape(tmp_path, instance_type, efa):
    where = docs_jobfile.project(tmp_path, without=docs_jobfile.NODES_ONLY)
    r = docs_jobfile.launch(where, "--target", "jobset", "--hosts", "h1,h2,h3", "--instance-type", instance_type,
                            "--timeout", "600.5", "--output", "jobset.yaml")
    assert r.returncode == 0 and r.stdout == "wrote jobset.yaml\n", r.stderr
    text = (where / "jobset.yaml").read_text()
    assert text.startswith(describe.GENERATED) and "not-in-any-file" not in text
    doc = yaml.safe_load(text)
    assert crds.problems(SCHEMA, doc) == []
    assert models.JobsetV1alpha2JobSet.from_dict(doc).to_dict() == doc  # the field's own types load it whole
    spec = doc["spec"]
    assert spec["failurePolicy"] == {"maxRestarts": 2}  # the file's max_restarts: the whole set again
    assert spec["network"] == {"enableDNSHostnames": True, "publishNotReadyAddresses": True}
    (rjob,) = spec["replicatedJobs"]
    job = rjob["template"]["spec"]
    assert rjob["replicas"] == 1 and job["completions"] == job["parallelism"] == 3
    assert job["completionMode"] == "Indexed" and job["backoffLimit"] == 0
    assert job["activeDeadlineSeconds"] == 601  # --timeout, whole seconds up
    pod = job["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["restartPolicy"] == "Never"
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": instance_type}
    (c,) = pod["containers"]
    assert c["args"] == torchrun_argv(3, "$(NODE_RANK)", 8, "job-node-0-0.job", contract.MASTER_PORT,
                                      ["train.py", "--epochs", "10"])
    assert c["env"][0] == {"name": "NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": js.COMPLETION_INDEX}}}
    assert {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "job-env",
                                                                    "key": "WANDB_API_KEY"}}} in c["env"]
    shape = {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": efa, "hugepages-2Mi": "5120Mi"}
    assert c["resources"] == {"limits": shape, "requests": {**shape, "memory": "4096Mi"}}
    assert c["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16384Mi"}} in pod["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]


def test_mounts_iface_and_a_cpu_pod():
    doc = _render(mounts=("/data:/in:ro",), iface="eth1")
    pod = doc["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert {"name": "mount-0", "hostPath": {"path": "/data", "type": "Directory"}} in pod["volumes"]
    assert {"name": "mount-0", "mountPath": "/in", "readOnly": True} in c["volumeMounts"]
    assert {"name": "NCCL_SOCKET_IFNAME", "value": "eth1"} in c["env"]
    assert "resources" not in c and "securityContext" not in c and "nodeSelector" not in pod
    assert "failurePolicy" not in doc["spec"] and "activeDeadlineSeconds" not in doc["spec"]["replicatedJobs"][0][
        "template"]["spec"]


def test_the_schema_check_is_strict():
    doc = _render(gpus_per_worker=8, instance_type="p5.48xlarge")
    bad = copy.deepcopy(doc)
    job = bad["spec"]["replicatedJobs"][0]["template"]["spec"]
    job["template"]["spec"]["containers"][0]["resouces"] = job["template"]["spec"]["containers"][0].pop("resources")
    job["parallelism"] = "3"
    bad["spec"]["failurePolcy"] = {"maxRestarts": 1}
    found = crds.problems(SCHEMA, bad)
    pod = "spec.replicatedJobs[0].template.spec.template.spec"
    assert f"{pod}.containers[0].resouces: unknown field 'resouces'" in found
    assert "spec.replicatedJobs[0].template.spec.parallelism: '3' is not of type 'integer'" in found
    assert "spec.failurePolcy: unknown field 'failurePolcy'" in found
    assert describe.model_problems(models.JobsetV1alpha2JobSet, bad) != []
    with pytest.raises(describe.ManifestError, match=r"(?s)^JobSet \(JobSet v0.12.0 CRD.*resouces"):
        m.validate("jobset", bad)
    wrong_kind = {**doc, "apiVersion": "jobset.x-k8s.io/v1alpha1"}
    assert crds.problems(SCHEMA, wrong_kind) == [
        "apiVersion/kind: expected jobset.x-k8s.io/v1alpha2 JobSet, got jobset.x-k8s.io/v1alpha1 JobSet"]


def test_mpirun_is_refused_naming_the_kinds_that_run_it():
    with pytest.raises(LaunchError, match=r"^--launcher mpirun: not for --for jobset \(torchrun on every node; "
                                          r"mpirun: --for trainjob or mpijob\); use torchrun$"):
        _render(launcher="mpirun")
    t = targets.get("jobset")
    assert t is js.TARGET and t.writes and "jobset" in m.TARGETS
    assert {"timeout", "max_restarts", "mount"}.isdisjoint(t.refused)
