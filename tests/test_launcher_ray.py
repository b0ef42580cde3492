"""The Ray launcher (launch/jobs/launchers/ray.py): Ray Train's default storage on a shared
--mount (launch/node/ray-storage.sh links ~/ray_results there before `ray start`), the warning
before a launch across nodes without one, each worker line once; and `dtrain cluster up
--shared` (the simulated cluster's shared directory, as EFS)."""

from __future__ import annotations

import os
import subprocess

import pytest

from dtrain import contract
from dtrain.launch.infra import cluster as cl
from dtrain.launch.jobs.container import Mount
from dtrain.launch.jobs.job import container_name, run_argv
from dtrain.launch.jobs.spec import JobSpec, NodeFacts
from dtrain.launch.jobs.launchers import LAUNCHERS
from dtrain.launch.remote.hosts import Node

RAY = LAUNCHERS["ray"]
FACTS = [NodeFacts(Node(f"node-{i}"), f"10.213.0.{10 + i}", f"node-{i}", "ens5", 0, (), "") for i in (1, 2, 3)]


def ray_spec(*mounts: Mount) -> JobSpec:
    return JobSpec(image="img", command=("python", "t.py"), launcher="ray", name="j", mounts=mounts)


def test_shared_storage_is_the_first_writable_mount():
    assert RAY.shared_storage(ray_spec()) is None
    assert RAY.shared_storage(ray_spec(Mount("/fsx", "/data", True))) is None  # read-only: not for results
    assert RAY.shared_storage(ray_spec(Mount("/fsx", "/data", True), Mount("/efs", "/shared"),
                                       Mount("/x", "/y"))) == "/shared/ray_results"


def test_across_nodes_without_shared_storage_the_launch_warns_in_one_line():
    (line,) = RAY.notes(ray_spec(), 3)
    assert "\n" not in line and "--mount" in line and "Unable to set up cluster storage" in line
    assert RAY.notes(ray_spec(), 1) == []  # one node: ~/ray_results is every worker's
    assert RAY.notes(ray_spec(Mount("/efs", "/shared")), 3) == []
    assert RAY.notes(ray_spec(Mount("/fsx", "/data", True)), 3) != []
    for name, launcher in LAUNCHERS.items():  # the other launchers have nothing to say
        if name != RAY.name:
            assert launcher.notes(ray_spec(), 3) == []


def test_ray_start_links_the_default_storage_first_where_there_is_shared_storage():
    head = RAY.node_argv(FACTS, 0)
    assert head[:3] == ["ray", "start", "--head"]
    linked = RAY.node_argv(FACTS, 0, "/shared/ray_results")
    assert linked == ["bash", "-c", contract.node_script("ray-storage.sh"), "dtrain-ray-storage",
                      "/shared/ray_results", *head]
    assert RAY.node_argv(FACTS, 2, "/shared/ray_results")[5:] == RAY.node_argv(FACTS, 2)


def _ray_storage(home, argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(home)}
    return subprocess.run(["bash", "-c", contract.node_script("ray-storage.sh"), "dtrain-ray-storage", *argv],
                          env=env, capture_output=True, text=True, timeout=30)


def test_ray_storage_script_links_home_ray_results_and_runs_the_command(tmp_path):
    home, shared = tmp_path / "home", tmp_path / "shared" / "ray_results"
    home.mkdir()
    r = _ray_storage(home, [str(shared), "sh", "-c", 'echo "ran $0"', "x"])
    assert r.returncode == 0 and r.stdout == "ran x\n", r.stderr
    assert (home / "ray_results").is_symlink() and os.readlink(home / "ray_results") == str(shared)
    assert shared.is_dir()
    (home / "ray_results" / "marker").write_text("1")  # what the driver writes, the workers see
    assert (shared / "marker").read_text() == "1"
    r = _ray_storage(home, [str(tmp_path / "other"), "true"])  # a later job's mount: the link follows
    assert r.returncode == 0 and os.readlink(home / "ray_results") == str(tmp_path / "other")
    r = _ray_storage(home, [str(tmp_path / "other"), "false"])  # the command's exit code is the script's
    assert r.returncode == 1


def test_ray_storage_script_leaves_an_image_directory_and_says_so(tmp_path):
    home = tmp_path / "home"
    (home / "ray_results").mkdir(parents=True)
    r = _ray_storage(home, [str(tmp_path / "shared"), "true"])
    assert r.returncode == 0 and not (home / "ray_results").is_symlink()
    assert r.stderr.count("\n") == 1 and "left as it is" in r.stderr


def test_each_worker_line_once_ray_trains_print_patch_is_off_in_every_ray_step():
    """Ray Train 2.60's workers print a line and log it to the console again where Ray has
    replaced sys.stdout (every worker): the line reached the driver, and the launch output,
    twice. Every `docker exec` of the Ray steps (ray start, whose raylet starts the workers,
    and the driver) carries RAY_TRAIN_ENABLE_PRINT_PATCH=0; the user's --env come after it."""
    env = RAY.exec_env("ens5")
    assert env["RAY_TRAIN_ENABLE_PRINT_PATCH"] == "0"
    argv = run_argv(ray_spec(), FACTS, RAY.node_argv(FACTS, 1), ready=False, fill_hosts=True, exec_env=env)
    i = argv.index("RAY_TRAIN_ENABLE_PRINT_PATCH=0")
    assert argv[:2] == ["docker", "exec"] and argv[i - 1] == "-e" and argv.index(container_name("j")) > i


@pytest.mark.parametrize("given, want", [
    (None, None), ([], None), (["/srv/a:/shared"], {"/shared": "/srv/a"}),
    (["/srv/a:/shared", "/srv/b:/data"], {"/shared": "/srv/a", "/data": "/srv/b"}),
])
def test_cluster_up_shared_flag(given, want):
    assert cl.parse_shared("--shared", given) == want


@pytest.mark.parametrize("bad, message", [
    ("/srv/a", "expected HOST_DIR:PATH"), ("srv/a:/shared", "both absolute"), ("/srv/a:shared", "both absolute"),
])
def test_cluster_up_shared_flag_refuses_in_one_line(bad, message):
    with pytest.raises(cl.ClusterError, match=f"^--shared '{bad}': .*{message}"):
        cl.parse_shared("--shared", [bad])
    with pytest.raises(cl.ClusterError, match="given twice"):
        cl.parse_shared("--shared", ["/a:/s", "/b:/s"])


def test_the_launch_says_it_before_any_node_and_not_with_a_mount(tmp_path):
    """`dtrain launch --launcher ray` on 2 nodes without a writable --mount: the warning line
    comes first, before the nodes are tried (here nothing listens: the launch then fails)."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "DTRAIN_HOME": str(tmp_path)}
    argv = [sys.executable, "-m", "invoke", "launch", "--launcher", "ray", "--hosts", "127.0.0.1:1,127.0.0.2:1",
            "--ssh-opt", "Port=1", "--image", "10.213.0.1:5000/dtrain/ray-train:1", "--pull", "never"]
    bare = subprocess.run([*argv, "--", "python", "t.py"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120)
    out = bare.stdout + bare.stderr
    warned = [line for line in out.splitlines() if "[launch] warning: ray: no writable --mount" in line]
    assert bare.returncode != 0 and len(warned) == 1, out
    assert out.index(warned[0]) < out.index("127.0.0.1"), out
    mounted = subprocess.run([*argv, "--mount", "/data", "--", "python", "t.py"], cwd=root, env=env,
                             capture_output=True, text=True, timeout=120)
    assert "no writable --mount" not in mounted.stdout + mounted.stderr
