"""A job file is data, not authority (issue 47, docs/launch.md "What a job file may do").

The attack as measured: a job.yaml in a cloned repository names the attacker's host, takes
AWS_SECRET_ACCESS_KEY from the launcher's environment, names ~/prod.env and `workdir: ~/`, and
an ECR image (the launcher would fetch a registry token and hand it to every node). Here a real
sshd on 127.0.0.1 (its own host key; the user's key authorized, so a connection would log in)
stands in for that host and records whatever reaches it, the CLI runs as a user runs it with a
fake HOME full of secrets, and moto (a server on 127.0.0.1) answers any AWS call. Nothing may
arrive, the user is told why in one line, exit 2, no traceback. Then each refusal on its own,
the control (a host the user knows: the same sshd does see the launch), `--env NAME`, the
allow-list, and the bounds on a job file's ssh options."""

from __future__ import annotations

import getpass
import os
import pty
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import jobfile, trust
from dtrain.launch.remote import known_hosts
from dtrain.launch.remote.hosts import Node

DTRAIN = [sys.executable, "-m", "dtrain"]
SECRET = "aws-s3cret-key-4711"
PROD = "prod-db-passw0rd-0815"
GH = "ghp_gh-t0ken-1234"
HISTORY = "history-marker-9876"
ECR = "123456789012.dkr.ecr.us-east-1.amazonaws.com/dtrain/x:1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def attacker(tmp_path):
    """A recording sshd on 127.0.0.1: the user's key logs in, and a forced command writes what
    each session brings (its command, environment, stdin) under rec/; its log says whether
    anything connected at all."""
    d = tmp_path / "attacker"
    rec = d / "rec"
    rec.mkdir(parents=True)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key")], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / ".ssh" / "id_ed25519")],
                   check=True)
    record = d / "record.sh"
    record.write_text("#!/bin/sh\n"
                      f'd={rec}/$$\nmkdir -p "$d"\n'
                      'printf %s "$SSH_ORIGINAL_COMMAND" > "$d/command"\nenv > "$d/env"\n'
                      'timeout 3 cat > "$d/stdin"\nexit 1\n')
    record.chmod(0o755)
    (d / "authorized_keys").write_text(f'command="{record}" ' + (home / ".ssh" / "id_ed25519.pub").read_text())
    port = _free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nPidFile {d}/sshd.pid\nAuthorizedKeysFile {d}/authorized_keys\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        "PermitRootLogin prohibit-password\nLogLevel VERBOSE\nAcceptEnv *\nPermitUserEnvironment yes\n")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    log = open(d / "sshd.log", "w")
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(d / "sshd_config"), "-h", str(d / "host_key")],
                            stderr=log)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd did not start: {(d / 'sshd.log').read_text()}")
            time.sleep(0.05)
    time.sleep(0.2)
    probe = len((d / "sshd.log").read_text())  # the readiness probe's own line ends here
    # the user's ssh config (given with --ssh-config, as a user does): the key and known_hosts of
    # the fake home, not /root's (ssh reads the passwd entry's home, not $HOME)
    (home / ".ssh" / "config").write_text(
        f"Host *\n  IdentityFile {home}/.ssh/id_ed25519\n  UserKnownHostsFile {home}/.ssh/known_hosts\n"
        f"  GlobalKnownHostsFile /dev/null\n  User {getpass.getuser()}\n  LogLevel ERROR\n")
    (home / ".ssh" / "known_hosts").write_text("")
    yield {"dir": d, "rec": rec, "port": port, "home": home, "log": d / "sshd.log", "probe": probe,
           "host_key": (d / "host_key.pub").read_text().split()[:2]}
    proc.terminate()
    proc.wait(5)
    log.close()


def _connections(attacker) -> list[str]:
    text = attacker["log"].read_text()[attacker["probe"]:]
    return [line for line in text.splitlines() if "Connection from" in line or "Accepted" in line]


def _received(attacker) -> bytes:
    return b"".join(f.read_bytes() for f in attacker["rec"].rglob("*") if f.is_file())


def _victim(tmp_path: Path, attacker) -> dict[str, str]:
    """The user's machine: a home with secrets in it, AWS and GitHub credentials in the
    environment, moto for AWS (never the network)."""
    home = attacker["home"]
    (home / "prod.env").write_text(f"DB_PASSWORD={PROD}\n")
    (home / ".bash_history").write_text(f"export X={HISTORY}\n")
    (home / ".cache" / "huggingface").mkdir(parents=True)
    (home / ".cache" / "huggingface" / "token").write_text("hf_t0ken\n")
    return {**os.environ, "HOME": str(home), "DTRAIN_HOME": str(home / ".dtrain"), "AWS_ACCESS_KEY_ID": "AKIAVICTIM",
            "AWS_SECRET_ACCESS_KEY": SECRET, "GITHUB_TOKEN": GH, "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true", "XDG_CONFIG_HOME": str(home / ".config"),
            "AWS_ENDPOINT_URL": "http://127.0.0.1:1"}  # AWS: a closed loopback port unless a test gives moto


def _repo(tmp_path: Path, attacker, *lines: str) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir(exist_ok=True)
    (repo / "train.py").write_text("print('hi')\n")
    head = [f"image: {ECR}", "hosts: 127.0.0.1",
            "ssh_opt:", f"  - Port={attacker['port']}", "  - ConnectionAttempts=1"]
    (repo / "job.yaml").write_text("\n".join([*head, *lines, "command: [python, train.py]"]) + "\n")
    return repo


def _launch(repo: Path, env: dict, attacker, *more: str) -> subprocess.CompletedProcess:
    return subprocess.run([*DTRAIN, "launch", "-f", "job.yaml", "--ssh-config", str(attacker["home"] / ".ssh" / "config"),
                           *more], cwd=repo, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=120)


def _refused(r: subprocess.CompletedProcess, *needles: str) -> str:
    assert r.returncode == 2 and not r.stdout and "Traceback" not in r.stderr, r.stdout + r.stderr
    [line] = r.stderr.splitlines()
    assert line.startswith("error: job.yaml:"), line
    for needle in needles:
        assert needle in line, line
    return line


HOSTILE = ["env:", "  AWS_SECRET_ACCESS_KEY:", "  GITHUB_TOKEN:", "env_file: ~/prod.env", "workdir: ~/"]


def test_the_hostile_job_file_sends_nothing_and_says_why(tmp_path, attacker, moto_server):
    """The measured attack, then the same file with each refused key taken out in turn: every
    run is refused in one line naming the file's line and key and the way to allow it, exit 2,
    no traceback, no job record, and the attacker's sshd sees no connection at all."""
    env = {**_victim(tmp_path, attacker), "AWS_ENDPOINT_URL": moto_server}
    steps = [(HOSTILE, "env_file '~/prod.env': a path in your home (~)", "--env-file on the command line"),
             ([line for line in HOSTILE if not line.startswith("env_file")], "workdir '~/': a path in your home",
              "--workdir on the command line"),
             (HOSTILE[:3], "env.AWS_SECRET_ACCESS_KEY: takes $AWS_SECRET_ACCESS_KEY from your environment",
              "pass --env AWS_SECRET_ACCESS_KEY on the command line"),
             ([], "hosts: the job file sends the job", "127.0.0.1")]
    for lines, *says in steps:
        repo = _repo(tmp_path, attacker, *lines)
        r = _launch(repo, env, attacker)
        line = _refused(r, *says)
        if not lines:
            assert "--hosts/--hostfile on the command line" in line and "ssh-keyscan" in line, line
        assert not (attacker["home"] / ".dtrain").exists(), line  # not even a job record
        assert _connections(attacker) == [] and _received(attacker) == b"", line
    for secret in (SECRET, PROD, GH, HISTORY):
        assert secret not in attacker["log"].read_text()


def test_the_allow_list_names_what_the_line_says(tmp_path, attacker, monkeypatch):
    """The refusal names the allow-list file; a name listed there is taken from the
    environment (the next check, the hosts, then stops the file)."""
    env = _victim(tmp_path, attacker)
    monkeypatch.setenv("XDG_CONFIG_HOME", env["XDG_CONFIG_HOME"])
    repo = _repo(tmp_path, attacker, "env:", "  AWS_SECRET_ACCESS_KEY:", "  EPOCHS: 10")
    allow = attacker["home"] / ".config" / "dtrain" / "env-allow"
    _refused(_launch(repo, env, attacker), f"or add the line AWS_SECRET_ACCESS_KEY to {allow}")
    allow.parent.mkdir(parents=True)
    allow.write_text("# names my job files may take\nAWS_SECRET_ACCESS_KEY\n")
    _refused(_launch(repo, env, attacker), "hosts: the job file sends the job")
    assert jobfile.load(repo / "job.yaml", environ={"AWS_SECRET_ACCESS_KEY": "v"})["env"] == [
        "AWS_SECRET_ACCESS_KEY=v", "EPOCHS=10"]
    allow.write_text("AWS-KEY\n")
    with pytest.raises(LaunchError, match=rf"^{allow}:1: 'AWS-KEY' is not a variable name"):
        jobfile.load(repo / "job.yaml", environ={})
    assert _connections(attacker) == []


def test_a_host_the_user_knows_is_reached_the_control(tmp_path, attacker):
    """The control: the same file with its host in the user's known_hosts does connect (the
    recording sshd sees the launch), so the checks above could fail."""
    env = _victim(tmp_path, attacker)
    kind, key = attacker["host_key"]
    (attacker["home"] / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{attacker['port']} {kind} {key}\n")
    repo = _repo(tmp_path, attacker)
    (repo / "job.yaml").write_text((repo / "job.yaml").read_text().replace(ECR, "127.0.0.1:1/dtrain/x:1"))
    r = _launch(repo, env, attacker)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert _connections(attacker), attacker["log"].read_text()
    assert b"bash -c" in _received(attacker)  # the recorder records what arrives


def _on_a_terminal(argv: list[str], cwd: Path, env: dict, answer: bytes) -> tuple[int, str]:
    """argv with a terminal as stdin and stderr; `answer` typed at the first `[y/N]`."""
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(cwd)
        os.execvpe(argv[0], argv, env)
    out, typed, deadline = b"", False, time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
        if not typed and b"[y/N]" in out:
            os.write(fd, answer)
            typed = True
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


def test_at_a_terminal_the_user_is_asked_and_no_sends_nothing(tmp_path, attacker, moto_server):
    """n (or anything but y): refused, nothing sent; y: the launch goes on (the ECR login from
    moto) and reaches the host."""
    env = {**_victim(tmp_path, attacker), "AWS_ENDPOINT_URL": moto_server}
    repo = _repo(tmp_path, attacker)
    argv = [*DTRAIN, "launch", "-f", "job.yaml", "--ssh-config", str(attacker["home"] / ".ssh" / "config")]
    code, out = _on_a_terminal(argv, repo, env, b"n\n")
    assert code == 2 and "Traceback" not in out, out
    assert "job.yaml:2: hosts: the job file sends the job" in out and "Connect to them? [y/N]" in out, out
    assert _connections(attacker) == []
    code, out = _on_a_terminal(argv, repo, env, b"y\n")
    assert code != 0 and "Traceback" not in out, out
    assert _connections(attacker), out  # yes: it goes on, and the host is reached


def test_hosts_from_the_command_line_are_not_asked_about(tmp_path, attacker):
    """--hosts (and the ssh options) typed by the user: today's meaning, accept-new included; they
    replace the nodes the file names (its hostfile here), which are neither asked about nor reached."""
    env = _victim(tmp_path, attacker)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "hosts").write_text("127.0.0.2 slots=8\n")
    (repo / "job.yaml").write_text("image: 127.0.0.1:1/dtrain/x:1\nhostfile: hosts\ncommand: [python, t.py]\n")
    r = _launch(repo, env, attacker, "--hosts", "127.0.0.1", "--ssh-opt", f"Port={attacker['port']}")
    assert r.returncode != 0 and "never connected" not in r.stderr and "127.0.0.2" not in r.stdout + r.stderr, r.stderr
    assert _connections(attacker)


# ---------------------------------------------------------------- --env NAME


def test_env_name_takes_the_value_from_the_environment_never_argv(tmp_path, attacker):
    """`--env NAME`: the value from the launcher's environment. While the launch runs against
    the recording sshd (a host the user chose), no process's command line (the launcher's,
    ssh's, rsync's) holds the value; a job file's `NAME:` is allowed by it."""
    env = {**_victim(tmp_path, attacker), "MY_TOKEN": "tok-s3cret-55aa"}
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "job.yaml").write_text("image: 127.0.0.1:1/dtrain/x:1\nenv:\n  MY_TOKEN:\ncommand: [python, t.py]\n")
    proc = subprocess.Popen([*DTRAIN, "launch", "-f", "job.yaml", "--ssh-config",
                             str(attacker["home"] / ".ssh" / "config"), "--hosts", "127.0.0.1", "--ssh-opt",
                             f"Port={attacker['port']}", "--env", "MY_TOKEN"], cwd=repo, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    seen, looked = [], 0
    while proc.poll() is None:
        for d in Path("/proc").iterdir():
            try:
                cmdline = (d / "cmdline").read_bytes()
            except OSError:
                continue
            looked += 1
            if b"tok-s3cret-55aa" in cmdline:
                seen.append(cmdline)
        time.sleep(0.01)
    out, err = proc.communicate()
    assert proc.returncode != 0 and b"Traceback" not in err, err
    assert looked and not seen and _connections(attacker)
    assert trust.cli_env(["MY_TOKEN", "A=1"], {"MY_TOKEN": "v"}) == (["MY_TOKEN=v", "A=1"], {"MY_TOKEN"})


def test_env_name_unset_is_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NOT_SET_HERE"}
    r = subprocess.run([*DTRAIN, "launch", "--image", "r/x:1", "--hosts", "127.0.0.1", "--env", "NOT_SET_HERE",
                        "--", "true"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr == ("error: --env NOT_SET_HERE: $NOT_SET_HERE is not set where dtrain "
                                              "runs: export it first, or give --env NOT_SET_HERE=VALUE\n"), r.stderr


def test_a_value_from_the_environment_that_env_cannot_take_is_refused_unshown(tmp_path):
    """A multi-line secret (a PEM key) taken by --env NAME or the file's NAME: one line naming
    the variable, never its value."""
    pem = "-----BEGIN KEY-----\nMIIsecretbody\n-----END KEY-----"
    with pytest.raises(LaunchError) as e:
        trust.cli_env(["PEM"], {"PEM": pem})
    assert str(e.value).startswith("--env PEM: $PEM is not one line of printable text") and "MII" not in str(e.value)
    (tmp_path / "job.yaml").write_text("image: r/x:1\nenv:\n  PEM:\n")
    with pytest.raises(LaunchError) as e:
        jobfile.load(tmp_path / "job.yaml", {"PEM": pem}, {"PEM"})
    assert str(e.value).startswith(f"{tmp_path / 'job.yaml'}:3: env.PEM: $PEM is not one line") and "MII" not in str(e.value)


def test_env_from_the_command_line_adds_to_the_files():
    merged = jobfile.merge({"env": ["EPOCHS=10", "A=file"]}, {"env": ["A=flag", "B=2"]})
    assert merged["env"] == ["EPOCHS=10", "A=file", "A=flag", "B=2"]  # later wins (values.env_pairs)


def test_nodes_from_the_command_line_replace_the_files_whichever_key():
    """The refusal says to give the hosts with --hosts/--hostfile: either replaces the file's."""
    merged = jobfile.merge({"hosts": "evil:8", "image": "r/x:1"}, {"hostfile": "mine", "hosts": None})
    assert merged == {"hostfile": "mine", "image": "r/x:1"}
    assert jobfile.merge({"hosts": "a"}, {"hostfile": None})["hosts"] == "a"


# ---------------------------------------------------------------- each refusal


@pytest.mark.parametrize("key", ["workdir", "env_file", "hostfile", "ssh_key"])
@pytest.mark.parametrize("value, says", [
    ("~/x", "a path in your home (~)"), ("/etc/passwd", "an absolute path"),
    ("../outside", "it leaves the job file's directory"), ("sub/../../outside", "it leaves the job file's directory"),
    ("link/x", "it leaves the job file's directory"),
])
def test_a_job_files_path_stays_inside_its_directory(tmp_path, key, value, says):
    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (repo / "link").symlink_to(tmp_path / "outside")  # a symlink committed in the repository
    (repo / "job.yaml").write_text(f"image: r/x:1\n{key}: {value}\n")
    with pytest.raises(LaunchError) as e:
        jobfile.load(repo / "job.yaml")
    text = str(e.value)
    assert text.startswith(f"{repo / 'job.yaml'}:2: {key} '{value}': {says}"), text
    assert f"give it with --{key.replace('_', '-')} on the command line" in text and "\n" not in text


def test_a_path_inside_stays_fine_and_a_flag_keeps_its_meaning(tmp_path):
    repo = tmp_path / "repo"
    (repo / "conf").mkdir(parents=True)
    (repo / "conf" / "e.env").write_text("A=1\n")
    (repo / "job.yaml").write_text("image: r/x:1\nworkdir: .\nenv_file: conf/../conf/e.env\n")
    got = jobfile.load(repo / "job.yaml")
    assert got["workdir"] == str(repo) and got["env_file"] == str(repo / "conf" / "e.env")
    given = jobfile.merge(got, {"workdir": str(tmp_path), "env_file": None})  # the user's own flag: as typed
    assert given["workdir"] == str(tmp_path)


@pytest.mark.parametrize("identity, says", [
    ("~/.ssh/id_rsa", "a path in your home (~)"), ("/root/.ssh/id_rsa", "an absolute path"),
    ("../../.ssh/id_rsa", "it leaves the job file's directory"), ("%d/.ssh/id_rsa", "ssh would expand its % or $"),
    ("${HOME}/.ssh/id_rsa", "ssh would expand its % or $"),
])
def test_a_job_files_hostfile_names_keys_inside_its_directory(tmp_path, identity, says):
    repo = tmp_path / "repo"
    (repo / "hosts").mkdir(parents=True)
    (repo / "hosts" / "list").write_text(f"127.0.0.1 slots=1\n127.0.0.2 identity={identity}\n")
    (repo / "job.yaml").write_text("image: r/x:1\nhostfile: hosts/list\n")
    with pytest.raises(LaunchError) as e:
        jobfile.load(repo / "job.yaml")
    assert str(e.value).startswith(f"{repo / 'job.yaml'}:2: hostfile list: identity '{identity}': {says}"), str(e.value)
    assert "give it with a --hostfile of yours" in str(e.value)


def test_a_hostfiles_relative_identity_is_relative_to_the_hostfile(tmp_path):
    from dtrain.launch.targets.ssh import hostfile_nodes

    (tmp_path / "hosts").mkdir()
    key = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "hosts" / "k")])
    assert key.returncode == 0
    (tmp_path / "hosts" / "list").write_text("h1 identity=k\n")
    [node] = hostfile_nodes(str(tmp_path / "hosts" / "list"))
    assert node.identity == str(tmp_path / "hosts" / "k")


@pytest.mark.parametrize("opt, says", [
    ("ConnectionAttempts=999999", "ConnectionAttempts 999999: a job file may give it from 1 to 10"),
    ("ConnectTimeout=86400", "ConnectTimeout 86400: a job file may give it from 1 to 120"),
    ("ServerAliveInterval=0", "ServerAliveInterval 0: a job file may give it from 1 to 300"),
    ("ServerAliveCountMax=500", "ServerAliveCountMax 500: a job file may give it from 1 to 10"),
    ("Port=0", "Port 0: a job file may give it from 1 to 65535"),
    ("StrictHostKeyChecking=no", "StrictHostKeyChecking 'no': not a value a job file may give it"),
    ("IdentityFile=~/.ssh/id_rsa", "IdentityFile names a file outside the job file's directory"),
    ("HostKeyAlias=github.com", "HostKeyAlias is not an ssh option a job file may give"),
])
def test_a_job_files_ssh_options_are_bounded(tmp_path, opt, says):
    (tmp_path / "job.yaml").write_text(f"image: r/x:1\nhosts: h1\nssh_opt:\n  - Port=22\n  - {opt}\n")
    with pytest.raises(LaunchError) as e:
        jobfile.load(tmp_path / "job.yaml")
    assert str(e.value).startswith(f"{tmp_path / 'job.yaml'}:5: ssh_opt.1: {says}"), str(e.value)
    assert "on the command line" in str(e.value) and "\n" not in str(e.value)


def test_a_bounded_option_is_refused_before_any_connection_and_the_flag_is_not_bounded(tmp_path, attacker):
    env = _victim(tmp_path, attacker)
    repo = _repo(tmp_path, attacker, "  - ConnectionAttempts=999999")
    (repo / "job.yaml").write_text((repo / "job.yaml").read_text().replace("  - ConnectionAttempts=1\n", ""))
    t0 = time.monotonic()
    _refused(_launch(repo, env, attacker), "ssh_opt.1: ConnectionAttempts 999999")
    assert time.monotonic() - t0 < 30 and _connections(attacker) == []
    assert jobfile.file_ssh_option("ConnectionAttempts=3") is None


# ---------------------------------------------------------------- known_hosts, asked locally


def test_unknown_hosts_are_those_ssh_would_not_find(tmp_path):
    kh = tmp_path / "known_hosts"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "hk")], check=True)
    kind, key = (tmp_path / "hk.pub").read_text().split()[:2]
    kh.write_text(f"known.example {kind} {key}\n[ported.example]:2222 {kind} {key}\n")
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(kh)], check=True, capture_output=True)  # hashed, as Debian does
    cfg = tmp_path / "cfg"
    cfg.write_text(f"Host *\n  UserKnownHostsFile {kh}\n  GlobalKnownHostsFile /dev/null\n"
                   "Host alias-node\n  HostKeyAlias known.example\n")
    opts = ["-F", str(cfg)]
    nodes = [Node("known.example"), Node("ported.example", port=2222), Node("ported.example"),
             Node("new.example"), Node("alias-node")]
    assert [n.host for n in known_hosts.unknown(nodes, opts)] == ["ported.example", "new.example"]
    assert known_hosts.lookup("hostname h\nport 22\nuserknownhostsfile /a /b\nglobalknownhostsfile none\n") == (
        "h", ["/a", "/b"])


def test_check_hosts_asks_only_where_the_file_chose(tmp_path):
    cfg = tmp_path / "cfg"
    cfg.write_text(f"Host *\n  UserKnownHostsFile {tmp_path / 'kh'}\n  GlobalKnownHostsFile /dev/null\n")
    nodes, opts = [Node("new.example")], ["-F", str(cfg)]
    asked = []
    trust.check_hosts(nodes, {"image": "j.yaml:1"}, opts, keys=jobfile.route_keys(), ask=lambda q: asked.append(q) or False)  # flags chose
    assert asked == []
    trust.check_hosts(nodes, {"hosts": "j.yaml:2"}, opts, keys=jobfile.route_keys(), ask=lambda q: asked.append(q) or True)  # confirmed
    assert len(asked) == 1 and asked[0].endswith("Connect to them? [y/N] ")
    with pytest.raises(LaunchError, match=r"^j\.yaml:3: ssh_opt: .*never connected.*: new\.example; nothing was sent"):
        trust.check_hosts(nodes, {"ssh_opt": "j.yaml:3"}, opts, keys=jobfile.route_keys(), ask=lambda q: False)


def test_a_jump_host_the_file_names_must_be_known_too(tmp_path):
    """A known node behind a jump host the user never connected to: ssh would connect to the jump
    host first (with the user's key), so it is asked about like a node; a known jump host passes."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "hk")], check=True)
    kind, key = (tmp_path / "hk.pub").read_text().split()[:2]
    kh = tmp_path / "kh"
    kh.write_text(f"node.example {kind} {key}\n[bastion.example]:2200 {kind} {key}\n")
    cfg = tmp_path / "cfg"
    cfg.write_text(f"Host *\n  UserKnownHostsFile {kh}\n  GlobalKnownHostsFile /dev/null\n")
    nodes, opts = [Node("node.example")], ["-F", str(cfg)]
    trust.check_hosts(nodes, {"hosts": "j.yaml:2"}, opts, keys=jobfile.route_keys(), ask=None)  # the node is known, no jump: passes
    with pytest.raises(LaunchError, match=r"^j\.yaml:4: ssh_opt: .*: evil\.example \(jump host\); nothing was sent"):
        trust.check_hosts(nodes, {"ssh_opt": "j.yaml:4"}, [*opts, "-o", "ProxyJump=u@evil.example:22"], keys=jobfile.route_keys(), ask=None)
    with pytest.raises(LaunchError, match=r": evil\.example \(jump host\)"):  # the second hop of a chain
        trust.check_hosts(nodes, {"ssh_opt": "j.yaml:4"}, [*opts, "-o", "ProxyJump=bastion.example:2200,evil.example"],
                          keys=jobfile.route_keys(), ask=None)
    with pytest.raises(LaunchError, match=r": evil\.example \(jump host\)"):  # a hostfile's jump=
        trust.check_hosts([Node("node.example", jump="evil.example")], {"hostfile": "j.yaml:1"}, opts, keys=jobfile.route_keys(), ask=None)
    trust.check_hosts(nodes, {"ssh_opt": "j.yaml:4"}, [*opts, "-o", "ProxyJump=bastion.example:2200"], keys=jobfile.route_keys(), ask=None)


# ---------------------------------------------------------------- --dump of a job file


def test_dump_of_a_job_file_keeps_its_relative_paths_and_literal_values(tmp_path):
    """`-f job.yaml --dump` from the file's directory: its paths as it had them (relative, so the
    dump loads again), its literal env values as they were, a name from the environment empty
    (its value nowhere in the output); the dump loads to what the file loads to."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "hosts").write_text("h1 slots=2\n")
    (repo / "job.yaml").write_text("image: r/x:1\nhostfile: hosts\nworkdir: .\nenv:\n  EPOCHS: 10\n  TOKEN:\n"
                                   "command: python t.py\n")
    r = subprocess.run([*DTRAIN, "launch", "-f", "job.yaml", "--dump", "--env", "TOKEN"], cwd=repo, text=True,
                       capture_output=True, timeout=120, env={**os.environ, "TOKEN": "tok-s3cret-77"})
    assert r.returncode == 0, r.stderr
    assert "tok-s3cret-77" not in r.stdout and "hostfile: hosts\n" in r.stdout and "workdir: .\n" in r.stdout
    assert "EPOCHS: '10'\n" in r.stdout and "TOKEN:\n" in r.stdout and "run the file with --env NAME" in r.stdout
    (repo / "again.yaml").write_text(r.stdout)
    environ = {"TOKEN": "v"}
    assert jobfile.load(repo / "again.yaml", environ, {"TOKEN"}) == jobfile.load(repo / "job.yaml", environ, {"TOKEN"})
    r = subprocess.run([*DTRAIN, "launch", "-f", "job.yaml", "--dump", "--env", "TOKEN", "--workdir", str(tmp_path)],
                       cwd=repo, text=True, capture_output=True, timeout=120, env={**os.environ, "TOKEN": "x"})
    assert r.returncode == 0 and f"--workdir {tmp_path}" in r.stdout.splitlines()[1], r.stdout + r.stderr
    assert "\nworkdir:" not in r.stdout
