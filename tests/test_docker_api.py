"""The nodes' Docker Engine API path (curl on the socket) against this machine's real engine:
it must answer and create exactly what the docker CLI path does."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import uuid

import pytest

from dtrain.launch.jobs import commands as c
from dtrain.launch.jobs.job import image_script

pytestmark = pytest.mark.docker

MEMLOCK = 8 << 20  # at most what this machine's dockerd may set (its own hard limit)


def bash(script: str, cli: bool, **env: str) -> subprocess.CompletedProcess:
    """script after DOCKER_API_SH, on the API path or (cli) the docker CLI path."""
    e = {k: v for k, v in os.environ.items() if k not in ("DOCKER_HOST", "DTRAIN_DOCKER_CLI")}
    e.update(env, **({"DTRAIN_DOCKER_CLI": "1"} if cli else {}))
    return subprocess.run(["bash", "-c", c.DOCKER_API_SH + "\n" + 'echo "path=${sock:-cli}"\n' + script],
                          capture_output=True, text=True, env=e, timeout=120)


def docker(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *argv], capture_output=True, text=True, check=check)


def inspect(name: str) -> dict:
    return json.loads(docker("inspect", name).stdout)[0]


@pytest.fixture
def names():
    made: list[str] = []
    yield made
    for n in made:
        docker("rm", "-f", n, check=False)


def test_image_script_api_path_answers_as_the_cli(engine, cpu_images, names):
    labelled = cpu_images["pytorch-ddp"].ref  # carries dtrain.openmpi-major
    job = f"t-api-{uuid.uuid4().hex[:6]}"
    for image in (engine.BASE_IMAGE, labelled):
        outs = []
        for cli in (False, True):
            names.append(f"dtrain-{job}")
            docker("create", "--name", f"dtrain-{job}", engine.BASE_IMAGE, "true")  # a stale container
            r = bash(image_script(image, "never", job), cli)
            assert r.returncode == 0, r.stderr
            assert docker("inspect", f"dtrain-{job}", check=False).returncode != 0, (r.stdout, r.stderr)  # removed
            outs.append(r.stdout.splitlines())
        api, cli_out = outs
        assert api[0] == "path=/var/run/docker.sock" and cli_out[0] == "path=cli"
        assert api[1:] == cli_out[1:] and api[1] == "docker=ok", (api, cli_out)
        image_id = docker("image", "inspect", "-f", "{{.Id}}", image).stdout.strip()
        assert api[2].endswith(" " + image_id)
    labels = json.loads(docker("image", "inspect", "-f", "{{json .Config.Labels}}", labelled).stdout)
    assert api[2] == f"image={labels.get('dtrain.min-driver', '-')} {labels['dtrain.openmpi-major']} {image_id}"
    missing = [bash(image_script("dtrain/not-here:1", "never", job), cli) for cli in (False, True)]
    assert [m.returncode for m in missing] == [1, 1]
    assert missing[0].stderr == missing[1].stderr and "dtrain/not-here:1 is not on this node" in missing[0].stderr


def test_image_script_reports_an_engine_that_does_not_answer(tmp_path):
    import socket

    dead = tmp_path / "docker.sock"  # a socket file nobody listens on, as after dockerd died
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(dead))
    s.close()
    api = bash(image_script("x:1", "missing", "j"), False, DOCKER_HOST=f"unix://{dead}").stdout.splitlines()
    assert api[0] == f"path={dead}" and api[1].startswith(f"docker=Cannot connect to the Docker engine at {dead}")
    # no socket file at all: the CLI path, whose own error the launcher shows
    cli = bash(image_script("x:1", "missing", "j"), False, DOCKER_HOST="unix:///tmp/dtrain-no-such.sock")
    assert cli.stdout.splitlines()[0] == "path=cli" and cli.stdout.splitlines()[1].startswith("docker=")
    assert len(api) == len(cli.stdout.splitlines()) == 2  # and nothing after: no pull, no start


SPECS = [
    dict(mounts=(c.Mount("/etc", "/mnt/etc", True), c.Mount("/tmp", "/mnt/tmp")),
         env={"MSG": "a b 'c' \"d\"", "EMPTY": ""}, command=("sleep", "60"), key_dir="/tmp"),
    dict(shm_size="64m", command=("sh", "-c", "sleep 60")),
]


@pytest.mark.parametrize("kw", SPECS)
@pytest.mark.parametrize("efa", ["", "/dev/null /dev/zero"])
def test_api_create_makes_the_container_docker_run_makes(engine, names, kw, efa):
    """docker_create_script (Engine API) and docker_run_argv (CLI) for the same node flags:
    the engine records the same Config and HostConfig (the name and IDs aside)."""
    made = {}
    for how in ("api", "cli"):
        name = f"t-create-{how}-{uuid.uuid4().hex[:6]}"
        names.append(name)
        spec = c.ContainerSpec(job="t", image=engine.BASE_IMAGE, name=name, **kw)
        if how == "cli":
            docker(*c.docker_run_argv(c.ContainerSpec(job="t", image=engine.BASE_IMAGE, name=name, gpus=False,
                                                      efa_devices=tuple(efa.split()), memlock=MEMLOCK, **kw))[1:])
        else:
            r = bash(f"gpus=0 efa='{efa}' memlock={MEMLOCK}\n" + c.docker_create_script(spec), False)
            assert r.returncode == 0 and "path=/var/run/docker.sock" in r.stdout, r.stderr
        made[how] = inspect(name)
    for key in ("Config", "HostConfig"):
        # the CLI sends [] and {} where the API body leaves a field out (None): the same
        api, cli = ({k: v for k, v in made[how][key].items() if v not in (None, [], {}, "")
                     and k != "Hostname"} for how in ("api", "cli"))  # Hostname: from the ID
        if key == "Config":  # the docker CLI (28) does not keep the order of -e: seen in CI
            api["Env"], cli["Env"] = sorted(api["Env"]), sorted(cli["Env"])
        assert api == cli, key
    assert made["api"]["State"]["Running"] and made["cli"]["State"]["Running"]


def test_gpu_request_is_what_docker_run_gpus_all_sends(engine, names):
    """No GPU here: compare what create records (starting would need the NVIDIA runtime)."""
    name = f"t-gpu-cli-{uuid.uuid4().hex[:6]}"
    names.append(name)
    docker("create", "--name", name, "--gpus", "all", engine.BASE_IMAGE, "true")
    hc = c.node_host_config(True, (), -1)
    r = bash("gpus=8 efa= memlock=unlimited\n" + c.NODE_HOST_CONFIG_SH + '\nprintf "{%s}" "$node_hc"', False)
    assert json.loads(r.stdout.split("\n", 1)[1]) == hc  # the shell builds node_host_config's JSON
    api = f"t-gpu-api-{uuid.uuid4().hex[:6]}"
    names.append(api)
    body = c.create_body(c.ContainerSpec(job="t", image=engine.BASE_IMAGE, command=("true",)))
    body["HostConfig"].update(hc)
    r = bash(f"api POST '/containers/create?name={api}' {shlex.quote(json.dumps(body))}; echo $code", False)
    assert r.stdout.splitlines()[-1] == "201", r.stdout
    assert inspect(api)["HostConfig"]["DeviceRequests"] == inspect(name)["HostConfig"]["DeviceRequests"]
