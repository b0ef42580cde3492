"""Job descriptions for Kubeflow, ECS and SageMaker: real schemas, same launch flags, no drift."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dtrain.launch.jobs import container
from dtrain.launch.sagemaker import engine as sagemaker
from dtrain.launch.jobs.launchers.mpirun import mpi_flags, mpirun_argv, training_env
from dtrain.launch.jobs.launchers.ray import ray_head_argv, ray_worker_argv
from dtrain.launch.jobs.launchers.torchrun import torchrun_argv, torchrun_env

from dtrain.launch.other_tools import k8s_schema
from dtrain.launch.other_tools import manifests as m
from dtrain.launch.errors import LaunchError

ROOT = Path(__file__).resolve().parent.parent
HVD = "registry.example.com/dtrain/horovod-pytorch:2.13.0-hvd0.28.1-cpu-py311-debian12"
DDP = "registry.example.com/dtrain/pytorch-ddp:2.13.0-cpu-py311-debian12"
CMD = ("python", "train.py", "--epochs", "3")


def spec(target, **kw):
    base = dict(image=DDP if target in ("pytorchjob",) else HVD, command=CMD, name="job-1",
                workers=3, gpus_per_worker=4)
    if target == "pytorchjob":
        base["command"] = ("train.py", "--epochs", "3")
    if target == "sagemaker":
        base["workers"] = 1
    if target == "ecs" and kw.get("launcher") != "ray":
        base["command"] = ()  # the node container: it runs no command
    return m.ManifestSpec(target, **{**base, **kw})


def test_ecs_node_container_refuses_a_command_it_would_drop():
    with pytest.raises(LaunchError, match=r"^--for ecs: the task definition is the node container .*give no command"):
        m.render(m.ManifestSpec("ecs", image=HVD, command=CMD, name="job-1", workers=2))
    with pytest.raises(LaunchError, match=r"^no command"):
        m.render(m.ManifestSpec("mpijob", image=HVD, command=(), name="job-1", workers=2))


def doc(target, **kw):
    return m.load(target, m.render(spec(target, **kw)))


VARIANTS = [(t, kw) for t in m.TARGETS for kw in (
    {}, {"gpus_per_worker": 0}, {"gpus_per_worker": 8, "node_selector": {"pool": "gpu"}, "namespace": "ml",
                                  "env": {"WANDB_MODE": "offline"}})]


@pytest.mark.parametrize("target,kw", VARIANTS, ids=[f"{t}-{i % 3}" for i, (t, _) in enumerate(VARIANTS)])
def test_every_generated_document_is_schema_valid(target, kw):
    d = doc(target, **kw)
    assert m.problems(target, d) == []


# ---------------------------------------------------------------- Kubernetes schemas


def _worker_pod(d):
    return d["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]


def test_pod_template_typos_are_rejected_by_name():
    d = doc("mpijob")
    pod = _worker_pod(d)
    pod["contaners"] = pod.pop("containers")
    pod["nodeSelecter"] = {"a": "b"}
    d["spec"]["slotsPerWorker"] = "4"
    found = m.problems("mpijob", d)
    where = "spec.mpiReplicaSpecs.Worker.template.spec"
    assert f"{where}.contaners: unknown field 'contaners'" in found
    assert f"{where}.nodeSelecter: unknown field 'nodeSelecter'" in found
    assert f"{where}: 'containers' is a required property" in found
    assert "spec.slotsPerWorker: '4' is not of type 'integer'" in found
    with pytest.raises(m.ManifestError, match="contaners"):
        m.validate("mpijob", d)


def test_deep_and_operator_level_typos_are_rejected():
    d = doc("pytorchjob")
    master = d["spec"]["pytorchReplicaSpecs"]["Master"]
    c = master["template"]["spec"]["containers"][0]
    c["imagePullPolcy"] = c.pop("imagePullPolicy")
    c["resources"]["limits"]["nvidia.com/gpu"] = "four"
    master["template"]["spec"]["volumes"][0]["emptyDir"]["medum"] = "Memory"
    d["spec"]["runPolicy"]["cleanPodPolcy"] = "All"
    d["metadata"]["nme"] = "x"
    found = m.problems("pytorchjob", d)
    pod = "spec.pytorchReplicaSpecs.Master.template.spec"
    assert found == [
        "metadata.nme: unknown field 'nme'",
        f"{pod}.containers[0].imagePullPolcy: unknown field 'imagePullPolcy'",
        f"{pod}.containers[0].resources.limits.nvidia.com/gpu: 'four' is not a Kubernetes quantity "
        "(e.g. 8, 500m, 16Gi)",
        f"{pod}.volumes[0].emptyDir.medum: unknown field 'medum'",
        "spec.runPolicy.cleanPodPolcy: unknown field 'cleanPodPolcy'",
    ]


def test_wrong_kind_is_named():
    d = doc("mpijob")
    d["apiVersion"] = "kubeflow.org/v1"
    assert m.problems("mpijob", d) == ["apiVersion/kind: expected kubeflow.org/v2beta1 MPIJob, got kubeflow.org/v1 MPIJob"]


def test_stored_schemas_name_their_source():
    """Each CRD schema is its project's own, of a named release (crds.py writes the note)."""
    from dtrain.launch.other_tools import crds

    releases = {"crd-mpijob-v2beta1.json": "kubeflow/mpi-operator/blob/v0.8.0/",
                "crd-pytorchjob-v1.json": "kubeflow/trainer/blob/v1.9.4/",
                "crd-trainjob-v1alpha1.json": "kubeflow/trainer/blob/v2.3.0/",
                "crd-clustertrainingruntime-v1alpha1.json": "kubeflow/trainer/blob/v2.3.0/",
                "crd-jobset-v1alpha2.json": "kubernetes-sigs/jobset/blob/v0.12.0/"}
    assert {p.name for p in m.SCHEMAS.glob("crd-*.json")} == set(releases)
    for name, release in releases.items():
        note = crds.stored(name)["$comment"]
        assert f"Source: https://github.com/{release}" in note and "Apache-2.0" in note and "commit " in note
    assert crds.kind("crd-mpijob-v2beta1.json") == ("kubeflow.org/v2beta1", "MPIJob")
    assert crds.kind("crd-pytorchjob-v1.json") == ("kubeflow.org/v1", "PyTorchJob")
    total = sum(p.stat().st_size for p in m.SCHEMAS.iterdir())
    assert total < 2_000_000


def test_k8s_podspec_schema_matches_the_pinned_client():
    """The stored strict PodSpec is exactly what the kubernetes 27.2.0 client's models give."""
    assert k8s_schema.OUTPUT.read_text() == k8s_schema.render(), "run python -m dtrain.launch.other_tools.k8s_schema"


def _fields(schema):
    return set(schema.get("properties", {}))


def test_pytorchjob_schema_fields_equal_training_operator_v1_9_4_sdk():
    from kubeflow.training import models as sdk

    from dtrain.launch.other_tools import crds

    def names(cls):
        return {cls.attribute_map[a] for a in cls.openapi_types}

    crd = crds.stored("crd-pytorchjob-v1.json")
    s = crd["properties"]["spec"]
    assert _fields(crd) == names(sdk.KubeflowOrgV1PyTorchJob)
    assert _fields(s) == names(sdk.KubeflowOrgV1PyTorchJobSpec)
    sp = s["properties"]
    assert _fields(sp["runPolicy"]) == names(sdk.KubeflowOrgV1RunPolicy)
    assert _fields(sp["runPolicy"]["properties"]["schedulingPolicy"]) == names(sdk.KubeflowOrgV1SchedulingPolicy)
    assert _fields(sp["elasticPolicy"]) == names(sdk.KubeflowOrgV1ElasticPolicy)
    assert _fields(sp["pytorchReplicaSpecs"]["additionalProperties"]) == names(sdk.KubeflowOrgV1ReplicaSpec)


# ---------------------------------------------------------------- AWS request shapes (botocore)


def test_ecs_broken_documents_name_the_field():
    d = doc("ecs")
    c = d["containerDefinitions"][0]
    c["ulimit"] = c.pop("ulimits")
    c["memoryReservation"] = "4096"
    found = m.problems("ecs", d)
    assert any(p.startswith('Unknown parameter in containerDefinitions[0]: "ulimit"') for p in found)
    assert any(p.startswith("Invalid type for parameter containerDefinitions[0].memoryReservation")
               for p in found)
    with pytest.raises(m.ManifestError, match="RegisterTaskDefinition"):
        m.validate("ecs", d)


def test_sagemaker_broken_documents_name_the_field():
    d = doc("sagemaker")
    d["ResourceConfig"]["InstanceCount"] = "1"
    d["StopingCondition"] = d.pop("StoppingCondition")
    del d["RoleArn"]
    found = m.problems("sagemaker", d)
    assert any(p.startswith('Unknown parameter in input: "StopingCondition"') for p in found)
    assert any(p.startswith("Invalid type for parameter ResourceConfig.InstanceCount") for p in found)
    assert 'Missing required parameter in input: "RoleArn"' in found


# ---------------------------------------------------------------- the contract inside


def test_mpijob_mpirun_is_launch_commands_output():
    d = doc("mpijob", env={"WANDB_MODE": "offline"})
    launcher = d["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    expected = mpirun_argv(None, list(CMD), iface="eth0", env_names=["WANDB_MODE"],
                                    ssh=container.ssh_options(attempts=10),
                                    hostfile="/etc/mpi/hostfile", np=12)
    assert launcher["command"] == ["/opt/dtrain/node/entrypoint.sh"]
    assert launcher["args"] == expected
    # The flags are exactly mpi_flags, the ones `invoke launch` passes, in the same order.
    flags = mpi_flags(iface="eth0", env_names=["WANDB_MODE"], ssh=container.ssh_options(attempts=10))
    assert expected == ["mpirun", "--allow-run-as-root", "-np", "12", "--hostfile", "/etc/mpi/hostfile",
                        *flags, *CMD]
    assert "-H" not in expected
    i = expected.index("plm_rsh_args")
    assert expected[i + 1].startswith("-p 2022")
    assert expected[expected.index("btl_tcp_if_include") + 1] == "eth0"
    assert expected[expected.index("oob_tcp_if_include") + 1] == "eth0"
    assert "NCCL_SOCKET_IFNAME=eth0" in expected


def test_mpijob_env_values_are_in_no_file_the_pods_read_them_from_a_secret():
    env = {"WANDB_API_KEY": "s3cret-value-1", "NCCL_SOCKET_IFNAME": "eth9"}  # a user value, a built-in one
    text = m.render(spec("mpijob", env=env))
    assert "s3cret-value-1" not in text and "eth9" not in text
    d = m.load("mpijob", text)
    launcher = d["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    argv = launcher["args"]
    xs = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    assert "WANDB_API_KEY" in xs and "NCCL_SOCKET_IFNAME" in xs  # names only
    ref = {"secretKeyRef": {"name": "job-1-env", "key": "WANDB_API_KEY"}}
    assert {e["name"]: e["valueFrom"] for e in launcher["env"]} == {
        "NCCL_SOCKET_IFNAME": {"secretKeyRef": {"name": "job-1-env", "key": "NCCL_SOCKET_IFNAME"}},
        "WANDB_API_KEY": ref}  # mpirun -x NAME reads them here
    worker = {e["name"]: e for e in d["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["env"]}
    assert worker["WANDB_API_KEY"]["valueFrom"] == ref and "value" not in worker["NCCL_SOCKET_IFNAME"]
    assert worker["OMP_NUM_THREADS"]["value"] == training_env("eth0")["OMP_NUM_THREADS"]  # dtrain's own: literal
    assert m.problems("mpijob", d) == []


SECRET_VALUE = "v4lue-that-must-not-be-written-47"


@pytest.mark.parametrize("target, kw", [("mpijob", {}), ("pytorchjob", {"namespace": "ml"}), ("ecs", {}),
                                        ("ecs", {"launcher": "ray"})])
def test_no_env_value_reaches_a_description_only_its_name(target, kw):
    env = {"HF_TOKEN": SECRET_VALUE, "DB_PASSWORD": SECRET_VALUE + "2", "MODE": "offline-" + SECRET_VALUE}
    command = () if target == "ecs" and not kw else CMD
    s = m.ManifestSpec(target, image=RAY if kw.get("launcher") else HVD, command=command, name="job-1",
                       workers=2, env=env, **kw)
    text = m.render(s)
    assert SECRET_VALUE not in text and "offline" not in text
    name = m.template_name(s)
    d = m.load(name, text)
    assert m.problems(name, d) == []
    notes = m.placeholders(s)
    assert not any(SECRET_VALUE in line for line in notes)
    [note] = [line for line in notes if "env DB_PASSWORD, HF_TOKEN, MODE: not in the file" in line]
    if target == "ecs":
        defs = [d] if name == "ecs" else [d["headTaskDefinition"], d["workerTaskDefinition"]]
        for td in defs:
            secrets = {x["name"]: x["valueFrom"] for x in td["containerDefinitions"][0]["secrets"]}
            assert secrets["HF_TOKEN"] == m.PLACEHOLDER_ENV_SECRET + ":HF_TOKEN::"
            assert td["executionRoleArn"] == m.PLACEHOLDER_EXECUTION_ROLE
        assert "--secret-string file://FILE" in note and "--env-secret-arn" in note
        assert "[manifest] secrets (--env) valueFrom: a placeholder, replace it (dtrain manifest --env-secret-arn)" \
            in notes
        given = m.render(dataclasses.replace(s, env_secret_arn="arn:aws:secretsmanager:eu-west-1:1:secret:x"))
        assert "arn:aws:secretsmanager:eu-west-1:1:secret:x:MODE::" in given
    else:
        ns = " --namespace ml" if kw.get("namespace") else ""
        assert note.endswith(f"(kubectl create secret generic job-1-env --from-env-file=FILE{ns})")


def test_the_cli_writes_no_env_value_and_says_how_to_make_the_secret(tmp_path):
    out = tmp_path / "job.yaml"
    r = subprocess.run([sys.executable, "-m", "dtrain", "manifest", "--for", "pytorchjob", "--image", HVD,
                        "--env", f"HF_TOKEN={SECRET_VALUE}", "--output", str(out), "--", "train.py"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert SECRET_VALUE not in out.read_text() + r.stdout + r.stderr
    name = m.default_name(HVD, ["train.py"])  # no --name: the image's repository and the command's hash
    assert f"kubectl create secret generic {name}-env --from-env-file=FILE" in r.stderr
    assert f"[manifest] name {name}: from the image and the command (--name NAME to choose)" in r.stderr


@pytest.mark.parametrize("namespace", ["ml\n  labels: {x: y}", "ml: x", "ML", "-ml", "ml-", "a" * 64, "",
                                       "ml\nspec: {}", "name: evil"])
def test_namespace_must_be_a_dns_1123_label(namespace):
    for target in ("mpijob", "pytorchjob"):
        with pytest.raises(LaunchError, match="--namespace .*DNS-1123"):
            m.render(spec(target, namespace=namespace))
    assert m.load("mpijob", m.render(spec("mpijob", namespace="team-1")))["metadata"]["namespace"] == "team-1"
    assert m.render(spec("mpijob", namespace="a" * 63))


def test_env_names_cannot_inject_yaml():
    for target in ("mpijob", "pytorchjob"):
        with pytest.raises(LaunchError, match="--env"):
            m.render(spec(target, env={"A\n              value: x\n            - name: B": "1"}))


def test_mpijob_workers_run_sshd_on_2022_with_gpus():
    d = doc("mpijob", gpus_per_worker=8, node_selector={"pool": "p4d"})
    s = d["spec"]
    assert s["slotsPerWorker"] == 8 and s["sshAuthMountPath"] == "/root/.ssh"
    w = s["mpiReplicaSpecs"]["Worker"]
    assert w["replicas"] == 3
    c = w["template"]["spec"]["containers"][0]
    assert c["command"] == ["/opt/dtrain/node/entrypoint.sh"] and "args" not in c
    assert c["ports"] == [{"name": "ssh", "containerPort": 2022}]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": 8}}
    assert w["template"]["spec"]["nodeSelector"] == {"pool": "p4d"}
    assert w["template"]["spec"]["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory",
                                                                               "sizeLimit": "16384Mi"}}]
    launcher = s["mpiReplicaSpecs"]["Launcher"]
    assert launcher["replicas"] == 1 and "resources" not in launcher["template"]["spec"]["containers"][0]
    assert "nodeSelector" not in launcher["template"]["spec"]  # mpirun only: any node, not a GPU one
    cpu = doc("mpijob", gpus_per_worker=0)["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert "resources" not in cpu["containers"][0]


def test_pytorchjob_torchrun_and_env():
    d = doc("pytorchjob")
    specs = d["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 2
    assert d["spec"]["nprocPerNode"] == "4"
    for role in ("Master", "Worker"):
        c = specs[role]["template"]["spec"]["containers"][0]
        assert c["name"] == "pytorch"  # the only container the operator gives RANK/MASTER_* to
        assert c["args"] == torchrun_argv(3, "$(RANK)", 4, "$(MASTER_ADDR)", "$(MASTER_PORT)",
                                                   ["train.py", "--epochs", "3"])
        assert {e["name"]: e["value"] for e in c["env"]} == torchrun_env("eth0")
    single = doc("pytorchjob", workers=1)["spec"]["pytorchReplicaSpecs"]
    assert list(single) == ["Master"]


def test_ecs_task_definition_contract():
    d = doc("ecs", gpus_per_worker=8)
    assert d["networkMode"] == "host" and d["requiresCompatibilities"] == ["EC2"]
    c = d["containerDefinitions"][0]
    assert c["resourceRequirements"] == [{"type": "GPU", "value": "8"}]
    assert c["ulimits"] == [{"name": "memlock", "softLimit": -1, "hardLimit": -1}]
    assert c["linuxParameters"]["sharedMemorySize"] == 16384
    assert c["portMappings"][0]["containerPort"] == 2022
    script = c["command"][0]
    assert c["entryPoint"] == ["/bin/bash", "-c"]
    assert script.endswith("unset DTRAIN_SSH_KEY; exec /opt/dtrain/node/entrypoint.sh")  # sshd -D on 2022
    assert c["secrets"][0]["name"] == "DTRAIN_SSH_KEY"
    assert "resourceRequirements" not in doc("ecs", gpus_per_worker=0)["containerDefinitions"][0]


def test_sagemaker_request_contract():
    """`IMAGE train` (no ContainerEntrypoint): the image's sagemaker_train.py reads the dtrain_*
    hyperparameters; the request is the one `invoke sagemaker run` sends (one builder)."""
    d = doc("sagemaker", role_arn="arn:aws:iam::111122223333:role/Train", output_s3="s3://bkt/out",
            gpus_per_worker=8)
    a = d["AlgorithmSpecification"]
    assert a == {"TrainingImage": HVD, "TrainingInputMode": "File"}
    assert d["HyperParameters"] == {"dtrain_command": json.dumps(list(CMD)), "dtrain_launcher": "mpirun",
                                    "dtrain_per_node": "0", "dtrain_workdir": "code", "dtrain_slots": "8"}
    assert d["ResourceConfig"] == {"InstanceCount": 1, "InstanceType": "ml.p4d.24xlarge", "VolumeSizeInGB": 100}
    assert d["RoleArn"] == "arn:aws:iam::111122223333:role/Train"
    assert d["OutputDataConfig"] == {"S3OutputPath": "s3://bkt/out"}
    # the work directory it names (dtrain_workdir) is a channel of the request: OUTPUT/NAME/code/;
    # one instance: mpirun needs no ssh key, so no `dtrain` channel
    assert d["InputDataConfig"] == [{"ChannelName": "code", "InputMode": "File", "DataSource": {"S3DataSource": {
        "S3DataType": "S3Prefix", "S3Uri": "s3://bkt/out/job-1/code/", "S3DataDistributionType": "FullyReplicated"}}}]
    assert d == sagemaker.create_training_job_request(m.sagemaker_job(spec(
        "sagemaker", role_arn="arn:aws:iam::111122223333:role/Train", output_s3="s3://bkt/out", gpus_per_worker=8)))


def test_sagemaker_multi_instance():
    d = doc("sagemaker", workers=3, output_s3="s3://bkt/out")
    assert d["ResourceConfig"]["InstanceCount"] == 3
    assert {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in d["InputDataConfig"]} == {
        "dtrain": "s3://bkt/out/job-1/dtrain/", "code": "s3://bkt/out/job-1/code/"}
    t = doc("sagemaker", workers=2, launcher="torchrun", command=("train.py",))
    assert t["HyperParameters"]["dtrain_launcher"] == "torchrun"
    assert [c["ChannelName"] for c in t["InputDataConfig"]] == ["code"]  # torchrun needs no ssh key


@pytest.mark.parametrize("kw,msg", [
    ({"target": "mpijob", "command": ()}, "no command"),
    ({"target": "mpijob", "name": "Bad_Name"}, "bad job name"),
    ({"target": "mpijob", "workers": 0}, "at least 1 worker"),
    ({"target": "helm"}, "--for helm"),
    ({"target": "sagemaker", "workers": 1, "gpus_per_worker": 3}, "--instance-type"),
])
def test_bad_specs_are_refused(kw, msg):
    target = kw.pop("target")
    base = dict(image=HVD, command=CMD, workers=2)
    with pytest.raises(LaunchError, match=msg):
        m.render(m.ManifestSpec(target, **{**base, **kw}))


# ---------------------------------------------------------------- docs/examples


def test_examples_no_drift():
    """docs/examples/ is exactly what `python -m dtrain.launch.other_tools.manifests` writes."""
    rendered = m.examples()
    assert sorted(rendered) == sorted(m.EXAMPLES.iterdir()), "stale or missing: python -m dtrain.launch.other_tools.manifests"
    for path, text in rendered.items():
        assert path.read_text() == text, f"{path.name} drifted: python -m dtrain.launch.other_tools.manifests"
        assert m.problems(m.load_target(path), m.load(m.load_target(path), text)) == []


def test_docs_show_every_example():
    text = (m.ROOT / "docs" / "other-tools.md").read_text()
    for path in m.examples():
        assert f"examples/{path.name}" in text


def test_deterministic():
    assert m.render(spec("mpijob")) == m.render(spec("mpijob"))
    json.loads(m.render(spec("ecs")))
    assert copy.deepcopy(doc("mpijob")) == doc("mpijob")


def test_spec_from_args_for_the_task():
    s = m.spec_from_args("mpijob", HVD, ["python", "t.py"], workers="3", gpus_per_worker="8",
                         env=["A=1"], node_selector=["pool=gpu"], namespace=None, shm_size_mib="1024")
    assert (s.workers, s.gpus_per_worker, s.env, s.node_selector, s.namespace, s.shm_size_mib) == \
        (3, 8, {"A": "1"}, {"pool": "gpu"}, None, 1024)
    with pytest.raises(LaunchError, match="--env 'A': expected NAME=VALUE"):
        m.spec_from_args("mpijob", HVD, ["t"], env=["A"])
    with pytest.raises(LaunchError, match="--image is required"):
        m.spec_from_args("mpijob", None, ["t"])


# ---------------------------------------------------------------- ECS: Ray head and workers (seed 001)

RAY = "registry.example.com/dtrain/ray-train:2.13.0-ray2.60.0-cpu-py311-debian12"


def ray_doc(**kw):
    s = m.ManifestSpec("ecs", **{**dict(image=RAY, command=CMD, name="job-1", workers=3, gpus_per_worker=1,
                                        launcher="ray"), **kw})
    return m.load("ecs-ray", m.render(s))


def test_ecs_ray_head_and_worker_services():
    d = ray_doc(ray_head_address="ray-head.example.internal", ecs_cluster="ml")
    assert m.problems("ecs-ray", d) == []
    head, worker = (d[k]["containerDefinitions"][0] for k in ("headTaskDefinition", "workerTaskDefinition"))
    for part in ("headTaskDefinition", "workerTaskDefinition"):
        assert d[part]["networkMode"] == "host" and d[part]["requiresCompatibilities"] == ["EC2"]
    # the same builders as `invoke launch --launcher ray`, blocking as the task's main process
    assert head["entryPoint"] == ["/opt/dtrain/node/entrypoint.sh"]
    assert head["command"] == ray_head_argv(6379, num_gpus=0, block=True)
    assert worker["command"] == ray_worker_argv("ray-head.example.internal:6379", num_gpus=1, block=True)
    assert head["dockerLabels"]["dtrain.ray-job"] == (
        "env RAY_ADDRESS=ray-head.example.internal:6379 python train.py --epochs 3")
    assert worker["resourceRequirements"] == [{"type": "GPU", "value": "1"}]
    assert "resourceRequirements" not in head
    assert d["headService"]["desiredCount"] == 1 and d["workerService"]["desiredCount"] == 3
    assert d["workerService"]["taskDefinition"] == d["workerTaskDefinition"]["family"] == "job-1-ray-worker"
    assert d["workerService"]["cluster"] == "ml"
    assert d["workerService"]["placementConstraints"] == [{"type": "distinctInstance"}]
    assert "resourceRequirements" not in ray_doc(gpus_per_worker=0)["workerTaskDefinition"]["containerDefinitions"][0]


def test_ecs_ray_broken_parts_name_the_request_and_field():
    d = ray_doc()
    d["workerService"]["desiredCount"] = "three"
    d["headTaskDefinition"]["containerDefinitions"][0]["memoryReservaton"] = 1
    del d["headService"]
    d["extra"] = {}
    found = "\n".join(m.problems("ecs-ray", d))
    assert "workerService (CreateService): Invalid type for parameter desiredCount" in found
    assert "headTaskDefinition (RegisterTaskDefinition): Unknown parameter in containerDefinitions[0]" in found
    assert "memoryReservaton" in found
    assert "headService: missing (CreateService request)" in found
    assert "extra: unknown part" in found


@pytest.mark.parametrize("kw,message", [
    ({"target": "mpijob"}, "--launcher ray: only for --for ecs"),
    ({"ray_head_address": "head; rm -rf /"}, "--ray-head-address"),
])
def test_ecs_ray_rejects(kw, message):
    base = dict(target="ecs", image=RAY, command=CMD, launcher="ray")
    with pytest.raises(LaunchError) as e:
        m.render(m.ManifestSpec(**{**base, **kw}))
    assert message in str(e.value)


def test_node_selector_and_ecs_cluster_follow_their_services_rules():
    """nodeSelector keys and values are Kubernetes labels; --ecs-cluster an ECS cluster name:
    a value the service would refuse is one line naming the flag, before anything is written."""
    from dtrain.launch.other_tools import manifests as mf

    for key, value in (("node.kubernetes.io/instance-type", "p4d.24xlarge"), ("k", ""), ("a.b-c/x_y.z", "v-1"),
                       ("k" * 63, "v" * 63)):
        mf.check_label("--node-selector", key, value)
    for key, value in (("bad key", "a value"), ("k", "bad value"), ("a/b/c", "x"), ("-k", "v"), ("k" * 64, "v"),
                       ("k", "v" * 64), ("Upper.Case/k", "v"), ("/k", "v"), ("k", "-v")):
        with pytest.raises(LaunchError, match="^--node-selector "):
            mf.check_label("--node-selector", key, value)
    spec = mf.spec_from_args("ecs", "r.io/x:1", ["python", "t.py"], launcher="ray", ecs_cluster="my_cluster-1")
    assert "my_cluster-1" in mf.render(spec)
    for bad in ("a b;c", "c" * 256, "a/b"):
        with pytest.raises(LaunchError, match=r"^--ecs-cluster .*not an ECS cluster name"):
            mf.render(mf.spec_from_args("ecs", "r.io/x:1", ["python", "t.py"], launcher="ray", ecs_cluster=bad))


# ---------------------------------------------------------------- EFA instance types

# p5en and g6e were outside the old hand table (0 GPUs were requested, their EFA still was: issue 47).
EFA_TYPES = [("p4d.24xlarge", 4), ("p5.48xlarge", 32), ("p5en.48xlarge", 16), ("g6e.12xlarge", 1),
             ("g5.2xlarge", 0)]  # g5.2xlarge: no EFA
GPUS = {"p4d.24xlarge": 8, "p5.48xlarge": 8, "p5en.48xlarge": 8, "g6e.12xlarge": 4,
        "g5.2xlarge": 1}  # each type's GPUs (AWS's instance type pages)


def _pods(d):
    """(role, pod spec) of every replica of a Kubeflow document."""
    replicas = d["spec"].get("mpiReplicaSpecs") or d["spec"]["pytorchReplicaSpecs"]
    return [(role, r["template"]["spec"]) for role, r in replicas.items()]


@pytest.mark.parametrize("target", ["mpijob", "pytorchjob"])
@pytest.mark.parametrize("instance_type,efa", EFA_TYPES)
def test_kubeflow_workers_get_every_efa_of_the_type(target, instance_type, efa):
    """Each training pod asks for the type's EFA interfaces (the EFA device plugin's resource),
    2 MiB huge pages with a memory request, IPC_LOCK, and a sized memory /dev/shm; the MPIJob's
    Launcher pod asks for none of it and is pinned nowhere. Schema-valid either way."""
    gpus = GPUS[instance_type]
    d = doc(target, gpus_per_worker=gpus, instance_type=instance_type)
    assert m.problems(target, d) == []
    for role, pod in _pods(d):
        c = pod["containers"][0]
        if role == "Launcher":
            assert "nodeSelector" not in pod and "resources" not in c and "securityContext" not in c, pod
            assert "volumes" not in pod
            continue
        assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": instance_type}
        assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16384Mi"}}]
        if efa:
            want = {"nvidia.com/gpu": gpus, "vpc.amazonaws.com/efa": efa, "hugepages-2Mi": "5120Mi"}
            assert c["resources"] == {"limits": want, "requests": {**want, "memory": "4096Mi"}}
            assert c["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
        else:
            assert c["resources"] == {"limits": {"nvidia.com/gpu": gpus}} and "securityContext" not in c


def test_kubeflow_efa_from_the_node_selector_and_a_kept_selector():
    """The type named by --node-selector node.kubernetes.io/instance-type counts as --instance-type;
    the user's other labels stay on the workers (and off the launcher)."""
    d = doc("mpijob", node_selector={"node.kubernetes.io/instance-type": "p5.48xlarge", "pool": "train"})
    worker = d["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker["containers"][0]["resources"]["limits"]["vpc.amazonaws.com/efa"] == 32
    assert worker["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5.48xlarge", "pool": "train"}
    assert "nodeSelector" not in d["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]


@pytest.mark.parametrize("instance_type,efa", EFA_TYPES)
def test_ecs_maps_every_efa_device_of_the_type(instance_type, efa):
    d = doc("ecs", gpus_per_worker=GPUS[instance_type], instance_type=instance_type)
    assert m.problems("ecs", d) == []
    lp = d["containerDefinitions"][0]["linuxParameters"]
    assert [x["hostPath"] for x in lp.get("devices", [])] == [f"/dev/infiniband/uverbs{i}" for i in range(efa)]
    assert all(x["containerPath"] == x["hostPath"] and x["permissions"] == ["read", "write", "mknod"]
               for x in lp.get("devices", []))
    assert d["containerDefinitions"][0]["ulimits"] == [{"name": "memlock", "softLimit": -1, "hardLimit": -1}]
    ray = ray_doc(instance_type=instance_type)
    assert m.problems("ecs-ray", ray) == []
    worker = ray["workerTaskDefinition"]["containerDefinitions"][0]["linuxParameters"]
    assert len(worker.get("devices", [])) == efa
    assert "devices" not in ray["headTaskDefinition"]["containerDefinitions"][0]["linuxParameters"]  # CPU head


@pytest.mark.parametrize("target,launcher,fits", [
    ("pytorchjob", "mpirun", "torchrun"), ("mpijob", "torchrun", "mpirun"), ("sagemaker", "ray", None)])
def test_a_launcher_the_target_cannot_run_is_one_line(target, launcher, fits):
    """PyTorchJob runs one torchrun per replica, MPIJob one mpirun: another launcher is refused
    (by the launchers' properties), naming the ones that fit."""
    with pytest.raises(LaunchError) as e:
        m.render(spec(target, launcher=launcher))
    line = str(e.value)
    assert line.startswith(f"--launcher {launcher}: ") and "\n" not in line
    if fits:
        assert line.endswith(f"use {fits}"), line


def test_placeholders_are_named_one_line_each():
    """ECS's execution role and key secret, SageMaker's role and output: each placeholder filled
    in is one line on stderr naming the field and its flag, never a value; none once given."""
    ecs = spec("ecs")
    assert m.placeholders(ecs) == [
        "[manifest] executionRoleArn: a placeholder, replace it (dtrain manifest --execution-role-arn)",
        "[manifest] secrets DTRAIN_SSH_KEY valueFrom: a placeholder, replace it (dtrain manifest --ssh-key-secret-arn)"]
    assert m.placeholders(spec("ecs", execution_role_arn="arn:aws:iam::111122223333:role/x",
                               ssh_key_secret_arn="arn:aws:secretsmanager:us-east-1:111122223333:secret:k")) == []
    assert [x.split(":")[0] for x in m.placeholders(spec("sagemaker"))] == ["[manifest] RoleArn",
                                                                           "[manifest] OutputDataConfig.S3OutputPath"]
    assert m.placeholders(spec("ecs", launcher="ray", command=CMD)) == []  # Ray's services take neither
    assert m.placeholders(spec("mpijob")) == []



def test_launch_target_ecs_names_its_placeholders_and_maps_the_efa_devices(tmp_path):
    """`dtrain launch --target ecs --instance-type p4d.24xlarge`: the same lines, through its err."""
    from dtrain.launch import jobtarget
    from dtrain.launch.jobs import config

    lines: list[str] = []
    cfg = config.build({"target": "ecs", "image": HVD, "hosts": "10.0.0.1,10.0.0.2", "instance_type": "p4d.24xlarge"})
    code = jobtarget.run(cfg, output=str(tmp_path / "td.json"), err=lines.append)
    name = m.default_name(HVD, [])  # no --name: the image's repository and the command's hash, said last
    assert code == 0 and lines == m.placeholders(spec("ecs", name=name), via="launch") + [
        f"[launch] name {name}: from the image and the command (--name NAME to choose)"]
    # `launch` has no --execution-role-arn: the line names what does, for the command that printed it
    assert lines[0] == ("[launch] executionRoleArn: a placeholder, replace it (or write the description with "
                        "dtrain manifest --for ecs ... --execution-role-arn ARN)")
    td = json.loads((tmp_path / "td.json").read_text())
    assert len(td["containerDefinitions"][0]["linuxParameters"]["devices"]) == 4
    assert td["containerDefinitions"][0]["resourceRequirements"] == [{"type": "GPU", "value": "8"}]  # the type's


# ---------------------------------------------------------------- the instance type's GPUs


@pytest.mark.parametrize("target", ["mpijob", "pytorchjob", "ecs"])
@pytest.mark.parametrize("instance_type", ["p4d.24xlarge", "p5.48xlarge", "p5en.48xlarge"])
def test_the_instance_types_gpus_are_the_default(target, instance_type):
    """--instance-type without --gpus-per-worker: each worker gets the type's 8 GPUs (slots,
    nproc, GPU limits, ECS resourceRequirements), beside its EFA interfaces."""
    command = [] if target == "ecs" else list(spec(target).command)
    s = m.spec_from_args(target, HVD, command, workers=2, instance_type=instance_type)
    assert s.gpus_per_worker == 8 and s.slots == 8
    text = m.render(s)
    if target == "mpijob":
        d = yaml.safe_load(text)
        assert d["spec"]["slotsPerWorker"] == 8
        assert _worker_pod(d)["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
        argv = d["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"]
        assert argv[argv.index("-np") + 1] == "16"
    elif target == "pytorchjob":
        d = yaml.safe_load(text)
        assert d["spec"]["nprocPerNode"] == "8"
        assert all(p["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8 for _, p in _pods(d))
    else:
        c = json.loads(text)["containerDefinitions"][0]
        assert c["resourceRequirements"] == [{"type": "GPU", "value": "8"}]
        assert len(c["linuxParameters"]["devices"]) == instance_types_efa(instance_type)
    ray = m.spec_from_args("ecs", HVD, list(CMD), launcher="ray", instance_type=instance_type)
    worker = json.loads(m.render(ray))["workerTaskDefinition"]["containerDefinitions"][0]
    assert worker["resourceRequirements"] == [{"type": "GPU", "value": "8"}]
    assert len(worker["linuxParameters"]["devices"]) == instance_types_efa(instance_type)


def instance_types_efa(instance_type):
    return {"p4d.24xlarge": 4, "p5.48xlarge": 32, "p5en.48xlarge": 16}[instance_type]


@pytest.mark.parametrize("target", ["mpijob", "pytorchjob", "ecs"])
def test_g6e_workers_ask_for_its_4_gpus_and_its_efa(target):
    """g6e.12xlarge (4 x L40S, one EFA), from EC2's DescribeInstanceTypes: its GPUs by default."""
    command = [] if target == "ecs" else list(CMD)
    s = m.spec_from_args(target, HVD, command, workers=2, instance_type="g6e.12xlarge")
    assert (s.gpus_per_worker, s.efa) == (4, 1)
    text = m.render(s)
    if target == "ecs":
        c = json.loads(text)["containerDefinitions"][0]
        assert c["resourceRequirements"] == [{"type": "GPU", "value": "4"}]
        assert len(c["linuxParameters"]["devices"]) == 1
    else:
        limits = [p["containers"][0]["resources"]["limits"] for role, p in _pods(yaml.safe_load(text))
                  if role != "Launcher"]
        assert limits and all(x["nvidia.com/gpu"] == 4 and x["vpc.amazonaws.com/efa"] == 1 for x in limits)


def test_a_type_the_data_lacks_is_said_not_taken_for_zero_gpus():
    """m7i.large is an EC2 type (botocore knows it) outside dtrain's DescribeInstanceTypes
    snapshot: one line naming the flag and the way to add it, never a manifest with 0 GPUs."""
    for kw in ({"instance_type": "m7i.large"}, {"instance_type": "m7i.large", "gpus_per_worker": 0},
               {"node_selector": ["node.kubernetes.io/instance-type=m7i.large"]}):
        with pytest.raises(LaunchError) as e:
            m.render(m.spec_from_args("mpijob", HVD, list(CMD), **kw))
        assert "m7i.large is not in dtrain's instance-type data" in str(e.value)
        assert "`dtrain instance-types --refresh` adds it" in str(e.value) and "\n" not in str(e.value)
        assert str(e.value).startswith(("--instance-type m7i.large: ", "--node-selector node.kubernetes.io/"))


def test_a_misspelled_type_is_still_refused():
    from dtrain import values

    with pytest.raises(values.BadValue, match=r"--instance-type 'p5en\.48xlage': not an EC2 instance type; did you "
                                              r"mean p5en\.48xlarge"):
        values.ec2_instance_type("--instance-type", "p5en.48xlage")


def test_given_gpus_win_and_more_than_the_type_has_is_one_line():
    assert m.spec_from_args("mpijob", HVD, list(CMD), gpus_per_worker=2, instance_type="p4d.24xlarge").slots == 2
    assert m.spec_from_args("mpijob", HVD, list(CMD), instance_type="c5.xlarge").gpus_per_worker == 0  # CPU type
    with pytest.raises(LaunchError) as e:
        m.render(m.spec_from_args("mpijob", HVD, list(CMD), gpus_per_worker=16, instance_type="p4d.24xlarge"))
    assert str(e.value) == ("--gpus-per-worker 16: a p4d.24xlarge has 8 GPUs (--instance-type p4d.24xlarge); "
                            "give at most 8")


@pytest.mark.parametrize("target", ["mpijob", "ecs"])
def test_launch_target_writes_no_env_value_either(tmp_path, target):
    out = tmp_path / "job.txt"
    r = subprocess.run([sys.executable, "-m", "dtrain", "launch", "--target", target, "--image", HVD,
                        "--env", f"HF_TOKEN={SECRET_VALUE}", "--output", str(out),
                        *([] if target == "ecs" else ["--", "python", "train.py"])],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert SECRET_VALUE not in out.read_text() + r.stdout + r.stderr
    assert "[launch] env HF_TOKEN: not in the file" in r.stderr


# ---------------------------------------------------------------- --timeout / --max-restarts (docs/other-tools.md)


def _manifest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    from dtrain import ROOT

    return subprocess.run([sys.executable, "-m", "dtrain", "manifest", "--image", "reg/x:1", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin"})


@pytest.mark.parametrize("kind", ["trainjob", "jobset", "mpijob", "pytorchjob"])
def test_manifest_timeout_and_max_restarts_as_launch_maps_them(tmp_path, kind):
    """`dtrain manifest --timeout 3600 --max-restarts 0`: activeDeadlineSeconds and JobSet's
    failurePolicy.maxRestarts (0 given: written), as `dtrain launch --target KIND` writes them;
    MPIJob and PyTorchJob: their runPolicy's activeDeadlineSeconds and backoffLimit."""
    r = _manifest(tmp_path, "--for", kind, "--timeout", "3600", "--max-restarts", "0", "--", "t.py")
    assert r.returncode == 0, r.stderr
    docs = list(yaml.safe_load_all(r.stdout))
    text = json.dumps(docs)
    if kind in ("mpijob", "pytorchjob"):
        (doc,) = docs
        assert doc["spec"]["runPolicy"] == {"cleanPodPolicy": "Running", "activeDeadlineSeconds": 3600, "backoffLimit": 0}
        assert m.problems(kind, doc) == []
        plain = yaml.safe_load(_manifest(tmp_path, "--for", kind, "--", "t.py").stdout)
        assert plain["spec"]["runPolicy"] == {"cleanPodPolicy": "Running"}  # not given: the operator's defaults
        return
    assert '"activeDeadlineSeconds": 3600' in text and '"failurePolicy": {"maxRestarts": 0}' in text
    assert m.problems(kind, docs[0] if kind == "jobset" else docs) == []
    assert m.limits(kind, timeout="90.5", max_restarts=None) == {"timeout_s": 91}


@pytest.mark.parametrize("args, says", [
    (["--for", "ecs", "--timeout", "60"], "error: --timeout: --for ecs has no equivalent in its document; "
                                          "--for mpijob or pytorchjob or trainjob or jobset take it"),
    (["--for", "ecs", "--max-restarts", "1", "--timeout", "5"], "error: --timeout and --max-restarts: --for ecs"),
    (["--for", "jobset", "--timeout", "0"], "error: --timeout '0': expected a number > 0"),
    (["--for", "trainjob", "--max-restarts", "-1"], "error: --max-restarts '-1'"),
])
def test_manifest_limits_refused_in_one_line(tmp_path, args, says):
    r = _manifest(tmp_path, *args, "--", "t.py")
    assert r.returncode == 2 and r.stderr.startswith(says) and len(r.stderr.splitlines()) == 1, r.stderr


def test_the_default_name_is_the_jobs_own():
    """No --name: not `dtrain-job` for every job (their Secrets, runtimes, pods would collide), but
    the job file's name, else the image's repository and a short hash of the command: a DNS-1123
    label of at most 40 that check() takes."""
    a = m.default_name("reg.example/dtrain/pytorch-ddp:2.13@sha256:" + "0" * 64, ["python", "train.py"])
    b = m.default_name("reg.example/dtrain/pytorch-ddp:2.13", ["python", "eval.py"])
    assert a.startswith("pytorch-ddp-") and b.startswith("pytorch-ddp-") and a != b
    assert m.default_name("x/y:1", ["python", "train.py"]) == m.default_name("z/y:2", ["python", "train.py"])
    assert m.default_name("r/y:1", [], "Train_GPT.v2.yaml") == "train-gpt-v2"
    long = m.default_name("r/" + "A_" * 60 + ":1", ["t"])
    assert len(long) <= 40 and re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", long)
    for name in (a, b, long, m.default_name("r/y:1", [], "job.yaml")):
        m.render(m.spec_from_args("jobset", "reg/x:1", ["t.py"], name=name))  # check() takes it
