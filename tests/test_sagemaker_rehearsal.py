"""The images as SageMaker bring-your-own training containers, rehearsed on the simulated cluster.

Each node starts its container as SageMaker starts one (`docker run --network host ... IMAGE
train`) with SageMaker's /opt/ml tree mounted: input/config/resourceconfig.json (hosts algo-1,
algo-2; this node's current_host; the NIC), hyperparameters.json as `invoke sagemaker run`
writes them (launch.jobs.sagemaker.hyperparameters), the `dtrain` channel with the job
key (mode 0644, as a downloaded S3 object), a `code` channel, model/ and output/. algo-N resolve
through --add-host. The job must complete on both and leave the model on the first host only.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from dtrain.launch.sagemaker import engine as sagemaker

pytestmark = [pytest.mark.cluster, pytest.mark.second_cluster]

EX = Path(__file__).resolve().parent.parent / "launch/node/examples"
HOSTS = ("algo-1", "algo-2")


def on_node(cluster, i: int, script: str, check: bool = True, timeout: int = 300) -> subprocess.CompletedProcess:
    r = subprocess.run(["ssh", "-F", cluster.ssh_config, f"node-{i}", script], capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0 or not check, r.stdout + r.stderr
    return r


def opt_ml(root: Path, host: str, iface: str, hps: dict[str, str], key: Path, code: dict[str, str | bytes]) -> Path:
    """One instance's /opt/ml as SageMaker lays it out before `train`."""
    ml = root / host
    (ml / "input/config").mkdir(parents=True)
    (ml / "input/config/resourceconfig.json").write_text(json.dumps(
        {"current_host": host, "current_instance_type": "ml.m5.xlarge", "current_group_name": "homogeneousCluster",
         "hosts": list(HOSTS), "network_interface_name": iface,
         "instance_groups": [{"instance_group_name": "homogeneousCluster", "instance_type": "ml.m5.xlarge",
                              "hosts": list(HOSTS)}]}))
    (ml / "input/config/hyperparameters.json").write_text(json.dumps(hps))
    (ml / "input/config/inputdataconfig.json").write_text(json.dumps(
        {name: {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated"} for name in ("code", "dtrain")}))
    for channel, files in (("dtrain", {"id_ed25519": key.read_text()}), ("code", code)):
        d = ml / "input/data" / channel
        d.mkdir(parents=True)
        for name, text in files.items():
            (d / name).write_bytes(text) if isinstance(text, bytes) else (d / name).write_text(text)
            (d / name).chmod(0o644)
    for d in ("model", "output"):
        (ml / d).mkdir()
    for p in [ml, *ml.rglob("*")]:
        if p.is_dir():
            p.chmod(0o755)
    return ml


def run_job(cluster, image: str, tmp_path: Path, command: list[str], launcher: str,
            code: dict[str, str | bytes] | None = None,
            state: list[Path] | None = None) -> tuple[list[int], list[str], list[Path]]:
    """Start `IMAGE train` on nodes 1 and 2 as SageMaker would; (exit codes, logs, /opt/ml dirs).
    state: each host's /opt/ml/checkpoints of an earlier run (SageMaker restores it from S3)."""
    key_dir = tmp_path / "key"
    key_dir.mkdir()
    key = sagemaker.make_key(key_dir)
    hps = sagemaker.hyperparameters(command, launcher, 1)
    root = tmp_path / "ml"
    mls = [opt_ml(root, h, cluster.node_ifname, hps, key, code or {}) for h in HOSTS]
    for ml, earlier in zip(mls, state or []):
        shutil.copytree(earlier, ml / "checkpoints")
    tmp_path.chmod(0o755)
    root.chmod(0o755)
    add_hosts = [x for h, n in zip(HOSTS, cluster.nodes) for x in ("--add-host", f"{h}:{n.address}")]
    names = [(i, f"sm-{h}") for i, h in zip((1, 2), HOSTS)]
    try:
        for (i, name), ml in zip(names, mls):
            argv = ["docker", "run", "-d", "--name", name, "--network", "host", *add_hosts,
                    "-v", f"{ml}:/opt/ml", image, "train"]
            on_node(cluster, i, f"docker rm -f {name} >/dev/null 2>&1; docker pull -q {shlex.quote(image)} >/dev/null"
                                f" && {shlex.join(argv)} >/dev/null")
        codes = [int(on_node(cluster, i, f"timeout 240 docker wait {name}").stdout.strip()) for i, name in names]
        logs = [on_node(cluster, i, f"docker logs {name} 2>&1").stdout for i, name in names]
    finally:
        for i, name in names:
            on_node(cluster, i, f"docker rm -f {name} >/dev/null", check=False)
    return codes, logs, mls


def _cleanup(mls: list[Path]) -> None:
    for ml in mls:  # files written as root inside the containers
        shutil.rmtree(ml, ignore_errors=True)


def test_horovod_job_as_sagemaker_runs_it(cluster, remote_images, tmp_path):
    codes, logs, mls = run_job(cluster, remote_images["horovod-pytorch"], tmp_path,
                               ["python", "/opt/dtrain/node/examples/allreduce_check.py", "torch"], "mpirun")
    assert codes == [0, 0], logs
    first, second = logs
    assert "runs: mpirun --allow-run-as-root -np 2 -H algo-1:1,algo-2:1" in first, first
    assert first.count("allreduce OK") == 2, first
    assert "host=node-1" in first and "host=node-2" in first, first
    assert "waiting for the job to end" in second, second
    assert (mls[0] / "model/allreduce.txt").read_text() == "OK size=2 sum=3\n"
    assert not (mls[1] / "model/allreduce.txt").exists()
    assert not (mls[0] / "output/failure").exists() and not (mls[1] / "output/failure").exists()
    _cleanup(mls)


def test_ddp_job_as_sagemaker_runs_it(cluster, remote_images, tmp_path):
    # The seed's case: an existing script in the working directory, uploaded as the `code` channel.
    codes, logs, mls = run_job(cluster, remote_images["pytorch-ddp"], tmp_path, ["python", "train.py"], "torchrun",
                               code={"train.py": (EX / "ddp_grads.py").read_text()})
    assert codes == [0, 0], logs
    for rank, log in enumerate(logs):
        assert f"torchrun --nnodes 2 --nproc_per_node 1 --node_rank {rank} --master_addr algo-1" in log, log
    sums = {line.rsplit(" ", 1)[-1] for log in logs for line in log.splitlines() if line.startswith("step 2 ")}
    assert len(sums) == 1, logs  # both ranks saw the same averaged gradients
    assert "rank 0/2 host node-1" in logs[0] and "rank 1/2 host node-2" in logs[1], logs
    assert (mls[0] / "model/model.pt").stat().st_size > 0
    assert not (mls[1] / "model/model.pt").exists()
    _cleanup(mls)


def test_failed_job_writes_failure_on_both_hosts(cluster, remote_images, tmp_path):
    codes, logs, mls = run_job(cluster, remote_images["horovod-pytorch"], tmp_path,
                               ["python", "-c", "import sys; print('bad batch'); sys.exit(3)"], "mpirun")
    assert codes == [1, 1], logs
    first = (mls[0] / "output/failure").read_text()
    assert first.startswith("mpirun exited with code 3 on algo-1") and "bad batch" in first, first
    assert "the job failed on algo-1 (mpirun exit code 3)" in (mls[1] / "output/failure").read_text()
    _cleanup(mls)


def test_requirements_installed_on_every_host_then_reused_from_the_state(cluster, remote_images, tmp_path):
    """The workdir's requirements.txt (a wheel beside it: the nodes have no index) is installed on
    both hosts before mpirun starts, reaches every rank through PYTHONPATH, and a second run whose
    /opt/ml/checkpoints is the first run's (as SageMaker restores the state from S3) runs no pip."""
    from test_sagemaker_flags import _wheel

    wheel = _wheel(tmp_path)
    code = {"requirements.txt": f"./{wheel.name}\n", wheel.name: wheel.read_bytes()}
    # one write per rank (print's separate words could interleave between the two ranks' output)
    command = ["python", "-c", "import socket, sys, tinypkg; "
               "sys.stdout.write(f'tinypkg {tinypkg.VERSION} {socket.gethostname()}\\n')"]
    runs = []
    for i in (1, 2):
        d = tmp_path / f"run{i}"
        d.mkdir()
        state = [ml / "checkpoints" for ml in runs[-1][2]] if runs else None
        runs.append(run_job(cluster, remote_images["horovod-pytorch"], d, command, "mpirun", code=code, state=state))
    for codes, logs, _ in runs:
        assert codes == [0, 0], logs
        assert "tinypkg 1.0 node-1" in logs[0] and "tinypkg 1.0 node-2" in logs[0], logs[0]
    first, second = runs
    assert all("requirements.txt: installing into /opt/ml/checkpoints/.dtrain/requirements/" in log
               for log in first[1]), first[1]
    assert all("requirements.txt: installed already" in log and "installing into" not in log
               for log in second[1]), second[1]
    for _, _, mls in runs:
        _cleanup(mls)
