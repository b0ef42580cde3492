"""Where the job's command starts, per launcher, on the simulated cluster (issue 22): every
launcher starts it in /workdir with --workdir (so `python train.py` and relative paths work),
and in the image's WORKDIR without it, on every node."""

from __future__ import annotations

import json
import re

import pytest

from dtrain import contract
from dtrain.launch.jobs.container import Mount
from test_launch import containers_left, on_node, run

pytestmark = [pytest.mark.cluster, pytest.mark.second_cluster]

FAMILY = {"mpirun": "pytorch-ddp", "horovodrun": "horovod-pytorch", "torchrun": "pytorch-ddp", "ray": "ray-train"}
WHERE = ("import os, socket\n"
         "data = open('data.txt').read().strip() if os.path.exists('data.txt') else '-'\n"
         "print('started', socket.gethostname(), os.getcwd(), data, flush=True)\n")


def _image_workdir(cluster, image: str) -> str:
    """The image's WORKDIR as node-1's engine has it ('' in its config means /)."""
    out = on_node(cluster, 1, f"docker image inspect --format '{{{{json .Config.WorkingDir}}}}' {image}").stdout
    return json.loads(out) or "/"


@pytest.mark.parametrize("with_workdir", [True, False], ids=["workdir", "no-workdir"])
@pytest.mark.parametrize("launcher", list(FAMILY))
def test_every_launcher_starts_the_command_in_the_same_directory(cluster, remote_images, tmp_path, launcher,
                                                                 with_workdir):
    code_dir = tmp_path / "code"
    code_dir.mkdir()
    (code_dir / "where.py").write_text(WHERE)
    (code_dir / "data.txt").write_text(f"data-for-{launcher}\n")
    image = remote_images[FAMILY[launcher]]
    name = f"t-cwd-{launcher}-{int(with_workdir)}"
    if with_workdir:
        code, out = run(cluster, image, ["python", "where.py"], name, n=2, launcher=launcher,
                        workdir=str(code_dir))
        want = (contract.WORKDIR, f"data-for-{launcher}")
    else:
        code, out = run(cluster, image, ["python", "/probe/where.py"], name, n=2, launcher=launcher,
                        mounts=(Mount(str(code_dir), "/probe", readonly=True),))
        want = (_image_workdir(cluster, image), "-")
    assert code == 0, out
    started = re.findall(r"started (node-\d) (\S+) (\S+)$", out, re.M)
    hosts = ["node-1"] if launcher == "ray" else ["node-1", "node-2"]  # Ray: one driver, on the head
    assert sorted(h for h, _, _ in started) == hosts, out
    assert {(cwd, data) for _, cwd, data in started} == {want}, out
    assert containers_left(cluster, name) == []
