"""The node programs' docker steps (launch/node/host/) against this machine's real engine."""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest

from dtrain import contract
from dtrain.launch.jobs import container, node_programs

pytestmark = pytest.mark.docker

MEMLOCK = 8 << 20  # at most what this machine's dockerd may set (its own hard limit)
LIBRARY = node_programs.host_library()
LABELS = (f"LABEL_JOB={contract.LABEL_JOB} LABEL_MIN_DRIVER={contract.LABEL_MIN_DRIVER} "
          f"LABEL_OPENMPI_MAJOR={contract.LABEL_OPENMPI_MAJOR}\n")


# where docker-api.pl must make the call: the CLI, asked for one, fails loudly
PERL_ONLY = 'docker_brief() { case $1 in run|image) echo "the CLI was asked: $*" >&2; return 99 ;; esac; docker "$@"; }\n'


def host(call: str, *args: str, stdin: str = "", cli: bool | None = None, **env: str) -> subprocess.CompletedProcess:
    """call after the host library; cli: the engine steps by the docker CLI (True) or by
    docker-api.pl alone (False); None: as a node would (the CLI where the program declines)."""
    e = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"} | env
    how = {True: "docker_api_pl=\n", False: PERL_ONLY, None: ""}[cli]
    return subprocess.run(["bash", "-c", LIBRARY + "\n" + LABELS + how + call, "t", *args],
                          input=stdin, capture_output=True, text=True, env=e, timeout=120)


def docker(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *argv], capture_output=True, text=True, check=check)


@pytest.fixture
def names():
    made: list[str] = []
    yield made
    for n in made:
        docker("rm", "-f", n, check=False)


@pytest.mark.parametrize("cli", [False, True], ids=["docker-api.pl", "cli"])
def test_image_step_reads_labels_with_one_typed_inspect(engine, cpu_images, cli):
    """The image's labels and ID; a missing image as this engine's CLI says it (`No such image`)
    is the image missing, not an engine error. Asked of the socket by perl, and by the CLI."""
    labelled = cpu_images["pytorch-ddp"].ref  # carries dtrain.openmpi-major
    r = host('image "$@"', labelled, "never", cli=cli)
    assert r.returncode == 0, r.stderr
    image_id = docker("image", "inspect", "-f", "{{.Id}}", labelled).stdout.strip()
    labels = json.loads(docker("image", "inspect", "-f", "{{json .Config.Labels}}", labelled).stdout)
    assert r.stdout.splitlines() == ["docker=ok", f"image={labels.get(contract.LABEL_MIN_DRIVER, '-')} "
                                                  f"{labels[contract.LABEL_OPENMPI_MAJOR]} {image_id}"]
    missing = host('image "$@"', "dtrain/not-here:1", "never", cli=cli)
    assert missing.returncode == 1 and missing.stdout.splitlines() == ["docker=ok"]
    assert "dtrain/not-here:1 is not on this node" in missing.stderr


def test_start_step_replaces_a_stopped_container_of_the_job_that_takes_its_name(engine, names, tmp_path):
    """A container of the job left stopped by an earlier launch: docker run refuses the name, the
    start step removes that container and runs the job's, once."""
    name = f"dtrain-t-stale-{uuid.uuid4().hex[:6]}"
    names.append(name)
    old = docker("create", "--name", name, engine.BASE_IMAGE, "true").stdout.strip()
    spec = container.ContainerSpec(job="t", image=engine.BASE_IMAGE, name=name, key_dir=str(tmp_path / "kd"),
                           command=("sleep", "60"))
    head, rest = container.docker_run_parts(spec)
    r = host(f'gpus=0 efa= memlock={MEMLOCK}; ss() {{ echo LISTEN; }}; read_secrets; start "$@"',
             str(tmp_path / "kd"), "ssh-ed25519 AAA", "5", "2022", name, str(len(head)), *head, *rest,
             stdin="-----END OPENSSH PRIVATE KEY-----\n")
    assert r.returncode == 0, r.stderr
    now = json.loads(docker("inspect", name).stdout)[0]
    assert now["Id"] != old and now["State"]["Running"]


def test_image_step_reports_an_engine_that_does_not_answer():
    r = host('image "$@"', "x:1", "missing", DOCKER_HOST="unix:///tmp/dtrain-no-such.sock")
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and len(lines) == 1 and lines[0].startswith("docker=")  # nothing after: no pull


@pytest.mark.parametrize("kw", [
    dict(mounts=(container.Mount("/etc", "/mnt/etc", True), container.Mount("/tmp", "/mnt/tmp")),
         command=("sleep", "60")),
    dict(shm_size="64m", command=("sh", "-c", "sleep 60")),
])
def test_start_step_makes_the_container_docker_run_argv_makes(engine, names, tmp_path, kw):
    """start.sh (the node's flags from its probe) and docker_run_parts's argv with the flags put
    between here: the engine records the same Config and HostConfig (the name and IDs aside)."""
    made = {}
    for how in ("node", "node-cli", "argv"):  # node: docker-api.pl's run; node-cli: the CLI's
        name = f"t-start-{how}-{uuid.uuid4().hex[:6]}"
        names.append(name)
        kd = tmp_path / how
        spec = container.ContainerSpec(job="t", image=engine.BASE_IMAGE, name=name, key_dir=str(kd), **kw)
        if how == "argv":
            kd.mkdir()
            head, rest = container.docker_run_parts(spec)
            docker(*head[1:], *node_programs.node_flags(0, (), str(MEMLOCK)), *rest)
        else:
            head, rest = container.docker_run_parts(spec)
            r = host(f'gpus=0 efa= memlock={MEMLOCK}; ss() {{ echo LISTEN; }}; read_secrets; start "$@"',
                     str(kd), "ssh-ed25519 AAA", "5", "2022", name, str(len(head)), *head, *rest,
                     stdin="-----END OPENSSH PRIVATE KEY-----\n", cli=how == "node-cli")
            assert "the CLI was asked" not in r.stderr
            assert r.returncode == 0, r.stderr
        made[how] = json.loads(docker("inspect", name).stdout)[0]
    for key in ("Config", "HostConfig"):
        node, cli, argv = ({k: v for k, v in made[how][key].items() if k != "Hostname"} for how in ("node", "node-cli", "argv"))
        for d in (node, cli, argv):  # the key directories differ by path only
            for m in d.get("Mounts") or []:
                if m["Target"] == contract.JOB_KEY_MOUNT:
                    m["Source"] = "KEYDIR"
        assert node == argv and cli == argv, key
    assert all(m["State"]["Running"] for m in made.values())
