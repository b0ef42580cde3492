"""The job file (launch/jobs/jobfile.py): `dtrain launch -f job.yaml`, `--dump`, and its errors,
as a user meets them (the CLI from a directory that is not the checkout); the cluster test
runs one job from its flags and from the file its flags dump, and compares them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import jobfile, launchers

pytestmark = pytest.mark.second_cluster  # on a second simulated cluster in `dtrain test` (dtrain/suite.py)

DTRAIN = [sys.executable, "-m", "dtrain"]


def _cli(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*DTRAIN, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_dump_then_load_gives_the_same_flags(tmp_path):
    (tmp_path / "hosts").write_text("h1 slots=2\n")
    r = _cli(tmp_path, "launch", "--dump", "--hostfile", "hosts", "--image", "reg/x:1", "--env", "A=s3cret",
             "--mount", "/fsx:ro", "--max-restarts", "2", "--launcher", "torchrun", "--",
             "python", "train.py", "--lr", "0.1")
    assert r.returncode == 0, r.stderr
    assert "s3cret" not in r.stdout  # a value of --env is never written (nor printed)
    (tmp_path / "job.yaml").write_text(r.stdout)
    got = jobfile.load(tmp_path / "job.yaml", environ={"A": "s3cret"}, allowed={"A"})  # run with --env A
    assert got == {"image": "reg/x:1", "command": ["python", "train.py", "--lr", "0.1"], "launcher": "torchrun",
                   "hostfile": str(tmp_path / "hosts"), "env": ["A=s3cret"], "mount": ["/fsx:ro"],
                   "max_restarts": "2"}


def test_flags_on_the_command_line_override_the_file():
    merged = jobfile.merge({"image": "a", "launcher": "torchrun", "max_restarts": "2", "command": ["x"]},
                           {"image": None, "launcher": "mpirun", "max_restarts": None, "command": None, "env": []})
    assert merged == {"image": "a", "launcher": "mpirun", "max_restarts": "2", "command": ["x"]}


@pytest.mark.parametrize("text, where, says", [
    ("image: x\nimagee: y\n", ":2", "imagee: unknown key"),
    ("image: x\nmax_restarts: lots\n", ":2", "max_restarts 'lots': expected a whole number from 0 to 1000"),  # the flag's words
    ("image: x\nlauncher: mpi\n", ":2",  # the registry's launchers: 'mpirun', 'horovodrun', ... or 'accelerate'
     "launcher: Input should be " + launchers.choices([f"'{n}'" for n in launchers.names()])),
    ("image: x\nenv:\n  OK: 1\n  9BAD: 2\n", ":4", "env.9BAD: Value error, '9BAD' is not a variable name"),
    ("image: x\nmount:\n  - /a\n  - [1]\n", ":4", "mount.1: Input should be a valid string"),
    ("image: x\ncommand: []\n", ":2", "command: Value error, an empty command"),
    ("image: [x\n", ":2", "not YAML"),
    ("- image\n", "", "expected a mapping of launch flags"),
    ("image: " + "[" * 20000 + "]" * 20000 + "\n", "", "nested too deep"),  # was a RecursionError
    ("image: x\nslots: " + "9" * 5000 + "\n", "", "a number of more than 4300 digits"),  # int-string limit
    ("image: x\nprogress_pattern: a{99999999999}\n", ":2", "the repetition number is too large"),  # OverflowError
])
def test_a_bad_job_file_is_one_line_naming_the_file_line_and_key(tmp_path, text, where, says):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(LaunchError) as e:
        jobfile.load(path)
    assert str(e.value).startswith(f"{path}{where}: ") and says in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_a_value_checked_against_the_nodes_names_the_files_line_or_the_flag(tmp_path):
    """spares: checked against the node count once the nodes are known: the file's line where
    the file gave it, the flag where the command line did; no node is contacted either way."""
    (tmp_path / "hosts").write_text("h1\nh2\n")
    (tmp_path / "job.yaml").write_text("image: reg/x:1\nhostfile: hosts\nspares: 9\ncommand: python t.py\n")
    r = _cli(tmp_path, "launch", "-f", "job.yaml")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("error: job.yaml:3: spares 9: must be fewer than the 2 node(s) given"), r.stderr
    r = _cli(tmp_path, "launch", "-f", "job.yaml", "--spares", "5")
    assert r.returncode == 2 and r.stderr.startswith("error: --spares 5: must be fewer than the 2 node(s)"), r.stderr
    (tmp_path / "job.yaml").write_text("image: reg/x:1\nhostfile: hosts\nprogress_pattern: step\ncommand: x\n")
    r = _cli(tmp_path, "launch", "-f", "job.yaml")
    assert r.returncode == 2 and r.stderr.startswith("error: job.yaml:3: progress_pattern is what --hang-timeout"), \
        r.stderr


def test_located_leaves_other_errors_and_other_flags_alone():
    with pytest.raises(LaunchError, match="^--spare-parts 1: x$"), jobfile.located({"spares": "j.yaml:3"}):
        raise LaunchError("--spare-parts 1: x")
    with pytest.raises(LaunchError, match="^j.yaml:3: max_restarts 2: x$"), \
            jobfile.located({"max_restarts": "j.yaml:3"}):
        raise LaunchError("--max-restarts 2: x")


def test_the_cli_says_it_in_one_line_and_exits_non_zero(tmp_path):
    """env.TOKEN with no value, TOKEN allowed (the allow-list file) but not set: one line."""
    (tmp_path / "job.yaml").write_text("image: reg/x:1\nenv:\n  TOKEN:\ncommand: python t.py\n")
    (tmp_path / "cfg" / "dtrain").mkdir(parents=True)
    (tmp_path / "cfg" / "dtrain" / "env-allow").write_text("# mine\nTOKEN\n")
    env = {k: v for k, v in os.environ.items() if k != "TOKEN"}
    r = subprocess.run([*DTRAIN, "launch", "-f", "job.yaml"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120, env={**env, "XDG_CONFIG_HOME": str(tmp_path / "cfg")})
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.strip() == "error: job.yaml:3: env.TOKEN: no value here and $TOKEN is not set where dtrain runs"
    r = _cli(tmp_path, "launch", "-f", "absent.yaml")
    assert r.returncode != 0 and "absent.yaml" in r.stderr and "Traceback" not in r.stderr


def test_paths_in_a_job_file_are_relative_to_the_file(tmp_path):
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "job.yaml").write_text("image: x\nhostfile: hosts\nworkdir: .\nenv_file: conf/../e.env\n")
    got = jobfile.load(tmp_path / "proj" / "job.yaml")
    assert got["hostfile"] == str(tmp_path / "proj" / "hosts") and got["workdir"] == str(tmp_path / "proj")
    assert got["env_file"] == str(tmp_path / "proj" / "e.env")  # and never outside it: tests/test_jobfile_trust.py


def test_the_files_a_job_file_names_are_checked_before_anything_starts(tmp_path):
    """A FIFO as ssh_key (it would block), /dev as workdir, a binary ssh_config, an empty region:
    one line naming the job file's line and key, exit 2, no job record."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "bin").write_bytes(bytes(range(256)))
    head = "image: reg/x:1\nhosts: 127.0.0.1:1\ncommand: python t.py\n"
    for line, says in (("ssh_key: fifo", "ssh_key '" + str(tmp_path / "fifo") + "': a named pipe (FIFO)"),
                       ("workdir: /dev", "workdir '/dev': an absolute path; a job file is run by others"),
                       ("ssh_config: bin", "ssh_config: an ssh config file can run commands on the launching machine"),
                       ("env_file: fifo", "env_file '" + str(tmp_path / "fifo") + "': a named pipe (FIFO)"),
                       ("region: ''\nec2_tag: a=b", "region '': expected an AWS region")):
        (tmp_path / "job.yaml").write_text(("image: reg/x:1\ncommand: python t.py\n" if "ec2_tag" in line else head)
                                           + line + "\n")
        r = _cli(tmp_path, "launch", "-f", "job.yaml", env={"DTRAIN_HOME": str(tmp_path / "home"),
                                                            "AWS_EC2_METADATA_DISABLED": "true"})
        assert r.returncode == 2 and r.stderr.startswith("error: job.yaml:") and says in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "home").exists(), r.stderr


# ---------------------------------------------------------------- on the simulated cluster


@pytest.mark.cluster
def test_a_job_file_runs_the_same_job_as_its_flags(cluster, remote_images, tmp_path):
    """The flags, then the file they dump (-f): the same ranks on the same nodes, the same
    environment, the same record (image, launcher, command, nodes)."""
    import json

    work = tmp_path / "proj"
    work.mkdir()
    (work / "train.py").write_text("import os\nprint('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], "
                                   "os.environ['GREETING'], os.getcwd(), flush=True)\n")
    home = tmp_path / "home"
    nodes = ["--hostfile", cluster.hostfile, "--ssh-config", cluster.ssh_config]  # the user's: outside the project
    flags = [*nodes, "--image", remote_images["pytorch-ddp"], "--launcher", "torchrun", "--workdir", str(work),
             "--max-restarts", "1"]  # --dump writes the workdir under the working directory relative: `.`
    env = {"DTRAIN_HOME": str(home)}
    by_flags = _cli(work, "launch", *flags, "--name", "t-jf-flags", "--env", "GREETING=hello", "--",
                    "python", "train.py", env=env)
    assert by_flags.returncode == 0, by_flags.stdout + by_flags.stderr
    dumped = _cli(work, "launch", "--dump", *flags, "--env", "GREETING=hello", "--", "python", "train.py")
    assert dumped.returncode == 0, dumped.stderr
    (work / "job.yaml").write_text(dumped.stdout)
    # a job file may not give an ssh config (it can run commands) nor a path outside its directory: the flags do
    assert "\nssh_config:" not in dumped.stdout and "\nhostfile:" not in dumped.stdout and "\nworkdir: .\n" in dumped.stdout
    assert f"--hostfile {cluster.hostfile}" in dumped.stdout.splitlines()[1]
    by_file = _cli(work, "launch", "-f", "job.yaml", *nodes, "--env", "GREETING",  # its value from the environment
                   "--name", "t-jf-file", env={**env, "GREETING": "hello"})
    assert by_file.returncode == 0, by_file.stdout + by_file.stderr

    def ranks(name: str) -> list[str]:
        log = (home / "jobs" / name / "output.log").read_text()
        return sorted(re.findall(r"^\[(node-\d r\d+)\] (rank \d+ of \d+ hello /workdir)$", log, re.M))

    assert ranks("t-jf-flags") == ranks("t-jf-file") and len(ranks("t-jf-file")) == 3
    keep = ("image", "launcher", "command", "nodes", "state", "exit_code")
    records = [json.loads((home / "jobs" / n / "job.json").read_text()) for n in ("t-jf-flags", "t-jf-file")]
    assert [{k: r.get(k) for k in keep} for r in records][0] == [{k: r.get(k) for k in keep} for r in records][1]


def test_the_documented_job_file_is_valid():
    """docs/launch.md's example reads back (its env secret taken from the environment)."""
    from dtrain import ROOT

    text = (ROOT / "docs" / "launch.md").read_text()
    block = text.split("## A job file", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    job = jobfile.parse(block, "docs/launch.md")
    assert job.launcher == "torchrun" and job.command == ["python", "train.py", "--epochs", "10"]
    assert job.env == {"EPOCHS": "10", "WANDB_API_KEY": None}


def test_env_values_are_the_text_as_written_not_yaml_1_1_numbers():
    """`A: 0755` is the text 0755 for the rank, not 493; `yes`, `12:30`, `0x10` likewise (YAML
    1.1 would read True, 750, 16); quoted values and plain words are as they were."""
    job = jobfile.parse("image: r/x:1\nenv:\n  A: 0755\n  B: yes\n  F: 12:30\n  E: 0x10\n  H: 10\n  Q: '0755'\n"
                        "  W: word\n  N:\n", "j.yaml")
    assert job.env == {"A": "0755", "B": "yes", "F": "12:30", "E": "0x10", "H": "10", "Q": "0755", "W": "word",
                       "N": None}


def test_a_yes_no_value_is_not_a_number():
    for key in ("timeout", "max_restarts", "slots", "count", "hang_timeout"):
        with pytest.raises(LaunchError, match=rf"^j\.yaml:2: {key} 'true': expected a number, not a yes/no value$"):
            jobfile.parse(f"image: r/x:1\n{key}: true\n", "j.yaml")


def test_a_key_given_twice_is_refused_naming_both_lines():
    with pytest.raises(LaunchError, match=r"^j\.yaml:4: 'count': given twice \(first on line 2\)"):
        jobfile.parse("image: r/x:1\ncount: 2\ncommand: python t.py\ncount: 3\n", "j.yaml")
    with pytest.raises(LaunchError, match=r"^j\.yaml:4: 'A': given twice \(first on line 3\)"):  # nested too
        jobfile.parse("image: r/x:1\nenv:\n  A: 1\n  A: 2\n", "j.yaml")


def test_a_file_yaml_cannot_read_is_one_line():
    with pytest.raises(LaunchError) as e:
        jobfile.parse("image: r\x00x\n", "j.yaml")
    assert str(e.value).startswith("j.yaml: not YAML (unacceptable character") and "\n" not in str(e.value)
