"""Secrets that must not leave (issue 38): a credential to a registry whose name only looks like
loopback, an `--env` value on disk after a launch, a job file's ssh option that runs a command
here, and a push's Docker config (the pushes themselves: tests/test_push.py).

Real components: a recording http server on 127.0.0.1, the CLI as a user runs it, a name that
resolves to 127.0.0.1 in a mount namespace of the test's own (its /etc/hosts bound over the
machine's there only; unshare needs root, as the cluster tests do)."""

from __future__ import annotations

import base64
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dtrain.images import push as P
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import jobfile
from dtrain.reference import is_loopback_registry

ROOT = Path(__file__).resolve().parent.parent
DIGEST = "sha256:" + "ab" * 32
PASSWORD = "ecr-token-s3cret-0815"


# ---------------------------------------------------------------- the loopback rule


@pytest.mark.parametrize("registry", ["127.0.0.1:5000", "127.9.8.7", "localhost", "localhost:5000", "[::1]:5000",
                                      "::1", "[::1]"])
def test_loopback_is_an_address_on_loopback_or_localhost(registry):
    assert is_loopback_registry(registry)
    assert registry == "::1" or P.is_loopback(registry)  # push takes HOST[:PORT], IPv6 in brackets


@pytest.mark.parametrize("registry", ["127.example.test", "127.example.test:5000", "127.0.0.1.nip.io:5000",
                                      "localhost.example.com", "localhostx:5000", "LOCALHOST", "127.1:5000",
                                      "127x.example.com", "10.213.0.1:5000", "[::ffff:127.0.0.1]:5000",
                                      "[fe80::1%eth0]:5000", "", "[::1", "128.0.0.1:5000"])
def test_a_name_that_looks_like_loopback_is_not(registry):
    assert not is_loopback_registry(registry)


class Recorder:
    """A registry on 127.0.0.1 that asks for Basic auth and records every request's headers."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_HEAD(self):
                outer.headers.append(dict(self.headers))
                if "Authorization" not in self.headers:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="r"')
                else:
                    self.send_response(200)
                    self.send_header("Docker-Content-Digest", DIGEST)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def authorizations(self) -> list[str]:
        return [h["Authorization"] for h in self.headers if "Authorization" in h]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorder():
    r = Recorder()
    yield r
    r.close()


ASK = """
import sys
from dtrain.launch.jobs import pull
print(pull.resolve_digest(sys.argv[1], user="AWS", password=sys.argv[2], timeout=5))
"""


def _ask_as_resolved(tmp_path: Path, image: str, names: str) -> str:
    """The launcher's registry request for image (pull.resolve_digest, an ECR-like credential),
    run where `names` resolve to 127.0.0.1: a mount namespace whose /etc/hosts says so."""
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n127.0.0.1 {names}\n")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts),
                        sys.executable, "-c", ASK, image, PASSWORD],
                       capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_no_credential_goes_over_http_to_a_dns_name_that_starts_with_127(recorder, tmp_path):
    """127.example.test resolves to 127.0.0.1 (here, as a DNS name may to anywhere): the
    request over http goes without the credential, and gets no digest; the same registry by
    its loopback address gets the credential (what docker sends there too)."""
    name = "127.example.test"
    got = _ask_as_resolved(tmp_path, f"{name}:{recorder.port}/dtrain/x:1", name)
    assert recorder.headers, "the request reached the recording registry"
    assert {h.get("Host") for h in recorder.headers} == {f"{name}:{recorder.port}"}
    assert recorder.authorizations() == [] and got == "None"
    got = _ask_as_resolved(tmp_path, f"127.0.0.1:{recorder.port}/dtrain/x:1", name)
    basic = "Basic " + base64.b64encode(f"AWS:{PASSWORD}".encode()).decode()
    assert recorder.authorizations() == [basic] and got == DIGEST


def test_push_asks_the_registry_over_http_only_where_the_rule_says(monkeypatch):
    """`docker manifest inspect --insecure` (plain http, with the login's credential) only for a
    loopback address or a registry the engine lists as insecure; never for a name."""
    monkeypatch.setattr(P, "_engine_trusts_plain_http", lambda registry: False)
    assert P.is_loopback("127.0.0.1:5000") and not P.is_loopback("127.example.test:5000")


# ---------------------------------------------------------------- --env values and DTRAIN_HOME


def test_no_env_value_in_any_file_under_dtrain_home_after_a_launch(tmp_path):
    """A launch that gets as far as its record (its node refuses ssh: a closed loopback port)
    keeps no --env or --env-file value in any file under DTRAIN_HOME: job.json, output.log,
    the lock. The values were on its command line and in the file."""
    home = tmp_path / "home"
    (tmp_path / "e.env").write_text("FROM_FILE=envfile-s3cret-1234\n")
    env = {**os.environ, "DTRAIN_HOME": str(home), "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_ENDPOINT_URL": "http://127.0.0.1:1"}
    r = subprocess.run([sys.executable, "-m", "dtrain", "launch", "--image", "127.0.0.1:5000/dtrain/x:1",
                        "--hosts", "127.0.0.1", "--ssh-opt", "Port=1", "--ssh-opt", "ConnectionAttempts=1",
                        "--name", "envjob", "--env", "TOKEN=flag-s3cret-5678", "--env-file", str(tmp_path / "e.env"),
                        "--", "true"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "127.0.0.1" in r.stderr and "Traceback" not in r.stderr, r.stderr
    files = [f for f in home.rglob("*") if f.is_file()]
    assert home / "jobs" / "envjob" / "job.json" in files and home / "jobs" / "envjob" / "output.log" in files
    for f in files:
        data = f.read_bytes()
        for secret in (b"flag-s3cret-5678", b"envfile-s3cret-1234"):
            assert secret not in data and base64.b64encode(secret) not in data, f
    job = json.loads((home / "jobs" / "envjob" / "job.json").read_text())
    assert job["state"] == "failed to launch" and set(job["pid_identity"]) == {"start", "cmdline_sha256"}


# ---------------------------------------------------------------- a job file's ssh options


@pytest.mark.parametrize("opt", ["ProxyCommand=touch {marker}", "ProxyCommand touch {marker}",
                                 "proxycommand=touch {marker}", "LocalCommand=touch {marker}",
                                 "PermitLocalCommand=yes", "KnownHostsCommand=/bin/touch {marker}",
                                 "Include={marker}", "Match=exec \"touch {marker}\"",
                                 "PKCS11Provider={marker}.so", "SendEnv=AWS_*", "ForwardAgent=yes",
                                 "ControlPath={marker}", "ProxyJump=;touch {marker}", "ProxyJump=-oProxyCommand=x",
                                 "User=$(touch {marker})", "UserKnownHostsFile={marker}",
                                 "Port=22\nProxyCommand=touch {marker}"])
def test_a_job_file_with_a_local_command_ssh_option_is_refused_with_one_line(tmp_path, opt):
    marker = tmp_path / "ran"
    value = opt.format(marker=marker)
    (tmp_path / "job.yaml").write_text("image: reg/x:1\nhosts: 127.0.0.1\nssh_opt:\n  - Port=1\n  - "
                                       + json.dumps(value) + "\ncommand: [\"true\"]\n")
    home = tmp_path / "home"
    r = subprocess.run([sys.executable, "-m", "dtrain", "launch", "-f", "job.yaml"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, env={**os.environ, "DTRAIN_HOME": str(home)})
    assert r.returncode == 2 and not r.stdout, r.stdout + r.stderr
    [line] = r.stderr.splitlines()
    key = value.replace("=", " ").split()[0]
    assert line.startswith("error: job.yaml:5: ssh_opt.1: ") and key[:8] in line, line
    assert "pass it with --ssh-opt on the command line" in line, line
    assert not marker.exists() and not home.exists()


@pytest.mark.parametrize("opt", ["ProxyJump=user@bastion.example.com", "ProxyJump=a@b:2222,ssh://c.example:22",
                                 "Port=2222", "Port 2222", "User=ubuntu", "IdentitiesOnly=no",
                                 "ConnectTimeout=10", "ServerAliveInterval = 30", "ServerAliveCountMax=3",
                                 "StrictHostKeyChecking=accept-new", "UserKnownHostsFile=/dev/null",
                                 "Compression=yes", "IdentitiesOnly=yes", "ConnectionAttempts=3", "BatchMode=yes",
                                 "LogLevel=ERROR", "AddressFamily=inet", "CheckHostIP=no",
                                 "TCPKeepAlive=yes"])
def test_a_job_file_may_give_ssh_options_that_run_nothing_here(tmp_path, opt):
    (tmp_path / "job.yaml").write_text(f"image: reg/x:1\nssh_opt:\n  - {json.dumps(opt)}\n")
    assert jobfile.load(tmp_path / "job.yaml")["ssh_opt"] == [opt]


def test_a_job_file_may_not_give_an_ssh_config_file(tmp_path):
    """An ssh config file can hold ProxyCommand: only --ssh-config on the command line."""
    (tmp_path / "cfg").write_text(f"Host *\n  ProxyCommand touch {tmp_path / 'ran'}\n")
    (tmp_path / "job.yaml").write_text("image: reg/x:1\nhosts: 127.0.0.1\nssh_config: cfg\ncommand: [\"true\"]\n")
    with pytest.raises(LaunchError) as e:
        jobfile.load(tmp_path / "job.yaml")
    assert str(e.value).startswith(f"{tmp_path / 'job.yaml'}:3: ssh_config: ")
    assert "pass --ssh-config on the command line" in str(e.value) and "\n" not in str(e.value)


def test_dump_leaves_out_what_a_job_file_may_not_give_and_says_so(tmp_path):
    """--dump with --ssh-config and a ProxyCommand: the file it prints loads (without them), and
    its first lines say to give them with -f on the command line."""
    r = subprocess.run([sys.executable, "-m", "dtrain", "launch", "--dump", "--image", "reg/x:1",
                        "--hosts", "h1", "--ssh-config", "/etc/ssh/ssh_config", "--ssh-opt", "Port=2222",
                        "--ssh-opt", "ProxyCommand=nc %h %p", "--", "true"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--ssh-opt 'ProxyCommand=nc %h %p' --ssh-config /etc/ssh/ssh_config" in r.stdout.splitlines()[1]
    (tmp_path / "job.yaml").write_text(r.stdout)
    got = jobfile.load(tmp_path / "job.yaml")
    assert got["ssh_opt"] == ["Port=2222"] and "ssh_config" not in got


# ---------------------------------------------------------------- push: a Docker config of its own


def test_the_own_docker_config_keeps_settings_and_no_credential(tmp_path):
    user = {"auths": {"r.io": {"auth": "dTpw"}}, "credsStore": "desktop", "credHelpers": {"r.io": "ecr-login"},
            "proxies": {"default": {"httpProxy": "http://proxy:3128"}}, "currentContext": "remote",
            "cliPluginsExtraDirs": ["/opt/plugins"], "experimental": "enabled"}
    got = P.own_config_json(user, tmp_path)
    assert got == {"proxies": user["proxies"], "currentContext": "remote", "experimental": "enabled",
                   "cliPluginsExtraDirs": [str(tmp_path / "cli-plugins"), "/opt/plugins"]}
    assert P.own_config_json("not a dict", tmp_path) == {"cliPluginsExtraDirs": [str(tmp_path / "cli-plugins")]}


def test_the_own_docker_config_is_private_and_gone_on_error_and_ctrl_c(tmp_path, monkeypatch):
    user = tmp_path / "user-docker"
    user.mkdir()
    (user / "config.json").write_text('{"auths": {"r.io": {"auth": "dTpw"}}, "currentContext": "default"}')
    (user / "contexts").mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(user))
    for exc in (P.PushError("failed"), KeyboardInterrupt()):
        with pytest.raises(type(exc)):
            with P.own_docker_config() as d:
                assert os.environ["DOCKER_CONFIG"] == str(d) != str(user)
                assert d.stat().st_mode & 0o777 == 0o700 and (d / "config.json").stat().st_mode & 0o777 == 0o600
                assert json.loads((d / "config.json").read_text())["currentContext"] == "default"
                assert "auths" not in json.loads((d / "config.json").read_text())
                assert (d / "contexts").resolve() == user / "contexts"
                raise exc
        assert not d.exists() and os.environ["DOCKER_CONFIG"] == str(user)


HOLD = """
import sys, time
from dtrain.images import push
with push.own_docker_config() as d:
    print(d, flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_the_own_docker_config_is_gone_when_the_push_is_signalled(tmp_path, sig):
    p = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                         stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                         "DOCKER_CONFIG": str(tmp_path)})
    assert p.stdout
    d = Path(p.stdout.readline().strip())
    assert d.is_dir() and d != tmp_path
    p.send_signal(sig)
    p.wait(timeout=30)
    deadline = time.monotonic() + 5
    while d.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not d.exists()


def test_the_docker_cli_finds_the_users_context_in_the_own_config(tmp_path, monkeypatch):
    """The user's current context (another engine, say) is still the one used inside."""
    user = tmp_path / "user-docker"
    user.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(user))
    monkeypatch.delenv("DOCKER_CONTEXT", raising=False)
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    subprocess.run([P.DOCKER, "context", "create", "dtrain-ctx-test", "--docker", "host=unix:///nonexistent.sock"],
                   check=True, capture_output=True)
    subprocess.run([P.DOCKER, "context", "use", "dtrain-ctx-test"], check=True, capture_output=True)
    with P.own_docker_config():
        r = subprocess.run([P.DOCKER, "context", "inspect", "--format", "{{.Name}} {{.Endpoints.docker.Host}}"],
                           capture_output=True, text=True)
    assert r.stdout.strip() == "dtrain-ctx-test unix:///nonexistent.sock", r.stderr


# ---------------------------------------------------------------- a SIGKILLed push's Docker config (issue 47)


def _holder(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    p = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                         stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                         "DOCKER_CONFIG": str(tmp_path)})
    assert p.stdout
    d = Path(p.stdout.readline().strip())
    assert d.is_dir() and d.name.startswith(f"{P.PUSH_CONFIG_PREFIX}{p.pid}-")
    return p, d


def test_the_next_push_removes_a_sigkilled_pushs_docker_config_and_no_live_ones(tmp_path, monkeypatch):
    """SIGKILL runs no `finally`: the killed push's config (where docker login writes the
    credential) stays on /dev/shm until the next push, which removes it; a push still running
    keeps its own."""
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    killed, stale = _holder(tmp_path)
    alive, live = _holder(tmp_path)
    try:
        (stale / "config.json").write_text('{"auths": {"r.io": {"auth": "dTpw"}}}')  # as docker login leaves it
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        assert stale.is_dir()  # nothing ran in the killed process
        assert stale in P.stale_push_configs(stale.parent) and live not in P.stale_push_configs(stale.parent)
        with P.own_docker_config() as mine:
            assert not stale.exists() and live.is_dir() and mine.is_dir()
        assert not mine.exists()
    finally:
        alive.send_signal(signal.SIGTERM)
        alive.wait(timeout=30)


def test_a_config_whose_pid_was_reused_by_another_process_is_stale(tmp_path):
    me = os.getpid()
    start = P.process_start(me)
    assert start is not None and P.process_start(2**22 + 1) is None
    reused = tmp_path / f"{P.PUSH_CONFIG_PREFIX}{me}-{int(start) - 1}-abc123"  # this pid, an earlier process
    mine = tmp_path / f"{P.PUSH_CONFIG_PREFIX}{me}-{start}-def456"
    other = tmp_path / "dtrain-push-docker-xyz"  # not ours to judge: an older name, kept
    link = tmp_path / f"{P.PUSH_CONFIG_PREFIX}1-1-link"
    for d in (reused, mine, other):
        d.mkdir()
    link.symlink_to(mine)
    assert P.remove_stale_push_configs(tmp_path) == [reused]
    assert not reused.exists() and mine.is_dir() and other.is_dir() and link.is_symlink()
