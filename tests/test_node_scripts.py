"""The node programs (launch/node/) as files: run in bash with stand-in `docker`/`ss` shell
functions where a test must not touch an engine, and checked by shellcheck."""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from dtrain import contract
from dtrain.launch.jobs import node_programs
from dtrain.launch.jobs.container import ContainerSpec, docker_run_parts, parse_mount
from dtrain.launch.jobs.launchers import env_file

# timing bounds (a heartbeat, a supervisor's reaction): run with the cluster tests, not beside them (dtrain/suite.py)
pytestmark = pytest.mark.serial

NODE = contract.NODE_SCRIPTS
# docker_api_pl emptied: the engine is a fake `docker` function here, which the perl program (the
# real engine's socket) would go around; tests/test_node_docker.py runs both against a real one.
LIBRARY = node_programs.host_library() + "\ndocker_api_pl=\n"
LABELS = (f"LABEL_JOB={contract.LABEL_JOB} LABEL_MIN_DRIVER={contract.LABEL_MIN_DRIVER} "
          f"LABEL_OPENMPI_MAJOR={contract.LABEL_OPENMPI_MAJOR} SUPERVISOR_EVENT='{contract.SUPERVISOR_EVENT}'\n")


HOST = Path("/proc/sys/kernel/hostname").read_text().strip()  # this machine's: a node's key (host/prepare.sh node_root)


def node_jobs(home: Path) -> Path:
    """This machine's job directories as a node with this home keeps them (dtrain/contract.py)."""
    return home / ".dtrain" / "nodes" / HOST / "jobs"


def on_host_argv(hostname: str, call: str, *args: str) -> list[str]:
    """argv: the host library, then `call`, on a node named hostname (a UTS namespace of its own,
    as the simulated cluster's nodes have)."""
    return ["unshare", "--uts", "sh", "-c", 'printf %s "$0" > /proc/sys/kernel/hostname && exec "$@"', hostname,
            "bash", "-c", LIBRARY + "\n" + LABELS + "\n" + call, "t", *args]


def on_host(hostname: str, call: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(on_host_argv(hostname, call, *args), capture_output=True, text=True, env=env, timeout=60)


def host(call: str, *args: str, fake: str = "", stdin: str = "", env: dict | None = None) -> subprocess.CompletedProcess:
    """The host library's functions, then `call` (e.g. 'image "$@"') with args."""
    return subprocess.run(["bash", "-c", LIBRARY + "\n" + LABELS + fake + "\n" + call, "t", *args],
                          input=stdin, capture_output=True, text=True, env=env, timeout=60)


def test_every_node_program_passes_shellcheck():
    files = sorted(str(p) for p in NODE.rglob("*.sh"))
    assert len(files) >= 10, files
    r = subprocess.run(["shellcheck", "-x", *files], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
    # what a node runs: every host file together
    with tempfile.NamedTemporaryFile("w", suffix=".sh") as f:
        f.write(node_programs.host_program())
        f.flush()
        r = subprocess.run(["shellcheck", "-s", "bash", f.name], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout


def test_unknown_step_is_refused():
    r = subprocess.run(node_programs.host_argv("rm -rf /"), capture_output=True, text=True)
    assert r.returncode == 2 and "unknown step rm -rf /" in r.stderr


IMG_ID = "sha256:" + "a" * 64


def run_image(policy: str, inspect: str, pull_rc: int = 0, after_pull: str = "") -> tuple[int, str, str, list[str]]:
    """image() against a stand-in `docker` that answers the first image inspect with `inspect`,
    `docker pull` with exit pull_rc, later inspects with after_pull. (returncode, stdout,
    stderr, docker calls)."""
    fake = ("docker() { echo \"$1 $2\" >> \"$CALLS\"; case \"$1 $2\" in\n"
            "  'image inspect') if [ \"$(wc -l < \"$CALLS\")\" = 1 ]; then printf '%s\\n' \"$INSPECT\"; "
            "else printf '%s\\n' \"$AFTER\"; fi ;;\n"
            "  'pull -q') echo 'Error response from daemon: manifest unknown' >&2; return $PULL_RC ;;\n"
            "  esac; }\n")
    with tempfile.NamedTemporaryFile("r") as calls:
        r = host('image "$@"', "reg:5000/dtrain/x:1", policy, fake=fake,
                 env={"INSPECT": inspect, "AFTER": after_pull, "PULL_RC": str(pull_rc),
                      "CALLS": calls.name, "PATH": "/usr/bin:/bin"})
        return r.returncode, r.stdout, r.stderr, calls.read().splitlines()


def test_image_reads_the_image_from_one_typed_inspect():
    """One `docker image inspect` (an untyped `docker inspect` of the image and the job's
    container took twice as long); a missing image, as either CLI says it, is no engine error."""
    rc, out, err, calls = run_image("missing", f"{IMG_ID} 560.35.05 4 []")
    assert rc == 0 and out.splitlines() == ["docker=ok", f"image=560.35.05 4 {IMG_ID}"]
    assert calls == ["image inspect"]  # no pull: the image is there
    for says in ("Error: No such image: reg:5000/dtrain/x:1",
                 "Error response from daemon: No such image: reg:5000/dtrain/x:1"):
        rc, out, _, calls = run_image("never", says)
        assert rc == 1 and out.splitlines() == ["docker=ok"] and calls == ["image inspect"]


def test_image_reports_the_engine_error_and_stops():
    rc, out, _, calls = run_image("always", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock.")
    assert rc == 0 and out.strip() == "docker=Cannot connect to the Docker daemon at unix:///var/run/docker.sock."
    assert calls == ["image inspect"]


@pytest.mark.parametrize("policy, present, pull_rc, calls, ok", [
    ("missing", False, 0, ["image inspect", "pull -q", "image inspect"], True),
    ("missing", False, 1, ["image inspect", "pull -q", "image inspect"], False),
    ("always", True, 0, ["image inspect", "pull -q", "image inspect"], True),
    ("always", True, 1, ["image inspect", "pull -q", "image inspect"], True),  # warns, runs the local one
    ("never", False, 0, ["image inspect"], False),
    ("never", True, 0, ["image inspect"], True),
])
def test_image_pull_policies(policy, present, pull_rc, calls, ok):
    missing = "Error: No such image: reg:5000/dtrain/x:1"
    line = f"{IMG_ID} - 5 []"
    rc, out, err, seen = run_image(policy, line if present else missing, pull_rc,
                                   after_pull=line if (present or pull_rc == 0) else missing)
    assert seen == calls
    if ok:
        assert rc == 0 and out.splitlines()[-1] == f"image=- 5 {IMG_ID}"
        assert ("pull failed (Error response from daemon: manifest unknown); using the local image" in err) == (pull_rc != 0)
    else:
        assert rc == 1 and "image reg:5000/dtrain/x:1 is not on this node and could not be pulled" in err
        assert ("manifest unknown" in err) == (policy != "never")


@pytest.mark.parametrize("port, gpus, driver, min_driver, starts", [
    ("", "0", "", "-", True),                       # CPU node
    ("", "8", "570.86.15", "560.35.05", True),      # driver new enough
    ("", "8", "560.35.05", "560.35.05", True),
    ("", "8", "535.104.05", "560.35.05", False),    # too old: the launcher names it
    ("", "8", "535.104.05", "-", True),             # image without the label
    ("LISTEN 0 128 *:2022 users:((\"sshd\"))", "0", "", "-", False),
])
def test_node_declines_to_start_where_the_launcher_would_refuse(port, gpus, driver, min_driver, starts):
    from dtrain.launch.jobs.job import driver_too_old

    pre = f"port='{port}' gpus={gpus} driver='{driver}' min_driver='{min_driver}'\n"
    out = host(pre + "gate && echo go").stdout
    assert (out.strip() == "go") == starts
    if not port and gpus != "0" and min_driver != "-":  # the launcher's own check agrees
        assert starts == (not driver_too_old(driver, min_driver))


@pytest.mark.parametrize("gpus, efa, memlock, flags", [
    (0, "", "unlimited", ["--ulimit", "memlock=-1"]),
    (8, " /dev/infiniband/uverbs0 /dev/infiniband/uverbs1", "unlimited",
     ["--ulimit", "memlock=-1", "--gpus", "all", "--device", "/dev/infiniband/uverbs0",
      "--device", "/dev/infiniband/uverbs1"]),
    (1, "", "65536", ["--ulimit", "memlock=65536:65536", "--gpus", "all"]),
    (0, "", "", ["--ulimit", "memlock=-1"]),
])
def test_start_runs_docker_run_argv_with_the_nodes_flags(tmp_path, gpus, efa, memlock, flags):
    """start.sh, given a probe's values, runs exactly commands.docker_run_parts's argv with the
    node's flags (node_flags: their one definition) between its parts, and writes the key pair,
    the containers' host key and the env file 0600 in a 0700 directory."""
    base = dict(job="j", image="img:1", mounts=(parse_mount("/data:ro"),), key_dir=str(tmp_path / "kd"),
                command=("sleep", "1"))
    head, rest = docker_run_parts(ContainerSpec(**base))
    fake = ('docker() { printf "%s\\n" docker "$@" > "$OUT"; }\n'
            'ss() { echo LISTEN; }\n'
            f"gpus={gpus}; efa='{efa}'; memlock='{memlock}'\n")
    key = "-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----\n"
    host_key = key.replace("abc", "hk")
    envs = env_file({"TOKEN": "s3cr3t"})
    r = host('read_secrets; start "$@"', str(tmp_path / "kd"), "ssh-ed25519 AAA", "5", "2022", "dtrain-j",
             str(len(head)), *head, *rest, fake=fake, stdin=key + host_key + envs,
             env={**os.environ, "OUT": str(tmp_path / "argv")})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "argv").read_text().splitlines() == [*head, *flags, *rest]
    assert node_programs.node_flags(gpus, efa.split(), memlock) == flags  # what benches run here
    kd = tmp_path / "kd"
    assert (kd / "id_ed25519").read_text() == key and (kd / "env").read_text() == envs
    assert (kd / "ssh_host_ed25519_key").read_text() == host_key
    assert (kd / "authorized_keys").read_text() == "ssh-ed25519 AAA\n"
    assert oct(kd.stat().st_mode & 0o777) == "0o700"
    assert {oct((kd / f).stat().st_mode & 0o777) for f in ("env", "id_ed25519", "ssh_host_ed25519_key")} == {"0o600"}


def test_login_uses_a_docker_config_of_its_own_and_removes_it(tmp_path):
    """The registry password is the first stdin line; the login and the pull see a fresh
    DOCKER_CONFIG, gone after the pull; the keys and env file are the rest of stdin."""
    fake = ('docker() { echo "$1 cfg=${DOCKER_CONFIG:-none} $(ls -ld "${DOCKER_CONFIG:-/nonexistent}" 2>/dev/null | cut -c1-10)'
            ' stdin=$( [ "$1" = login ] && cat)" >> "$OUT";'
            ' case "$1 $2" in "image inspect") echo "$LINE" ;; esac; }\n')
    line = f"{IMG_ID} - 4 []"
    keys = "".join(f"-----BEGIN OPENSSH PRIVATE KEY-----\n{k}\n-----END OPENSSH PRIVATE KEY-----\n" for k in "kh")
    r = host('login "$1" "$2"; read_secrets; image "$3" always; echo "cfg_left=$login_cfg"; '
             'printf "%s" "$key$hostkey$envs"',
             "reg.example:5000", "AWS", "reg.example:5000/x:1", fake=fake,
             stdin="s3cr3t\n" + keys + "A=Yg==\n",
             env={**os.environ, "OUT": str(tmp_path / "calls"), "LINE": line})
    assert r.returncode == 0, r.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    login, inspect, pull = calls[0], calls[1], calls[2]
    cfg = login.split()[1].removeprefix("cfg=")
    assert login.startswith("login cfg=/dev/shm/dtrain-docker-") and "drwx------" in login and login.endswith("stdin=s3cr3t")
    assert pull.startswith(f"pull cfg={cfg} ") and inspect.startswith("image cfg=none")
    assert not Path(cfg).exists() and "cfg_left=\n" in r.stdout
    assert r.stdout.endswith(keys + "A=Yg==\n")


HOSTILE = ["$(touch /tmp/pwned)", "`touch /tmp/pwned`", "a; touch /tmp/pwned", "it's \"quoted\"",
           "two\nlines", "back\\slash", "  spaced  ", "", "ab", "a", "ends with newline\n\n", "x=y=="]


def test_run_sh_exports_env_values_exactly_and_fills_hosts_once(tmp_path):
    env = {f"V{i}": v for i, v in enumerate(HOSTILE)}
    (tmp_path / "env").write_text(env_file(env))
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n")
    script = contract.node_script("run.sh").replace("/etc/hosts", str(hosts))
    for _ in range(2):
        r = subprocess.run(["bash", "-c", script, "dtrain-run", "--env", str(tmp_path / "env"),
                            "--host", "10.0.0.1", "node-1", "--host", "10.0.0.2", "node-2", "--fill-hosts",
                            "--", "python3", "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
    import json

    got = json.loads(r.stdout)
    assert {k: got.get(k) for k in env} == env
    assert hosts.read_text().splitlines() == ["127.0.0.1 localhost", "# dtrain job nodes",
                                              "10.0.0.1 node-1", "10.0.0.2 node-2"]
    assert not Path("/tmp/pwned").exists()


def test_run_sh_ready_reaches_every_node_but_the_one_it_skips(tmp_path):
    """--ready: one ssh per --host (each node's sshd reached, its phase line said), none to
    --ready-skip's (the container's own node, where mpirun starts its ranks without ssh)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text('#!/bin/bash\nfor a; do :; done\necho "${@: -2:1}" >> "$REACHED"\n')
    (bin_dir / "ssh").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "REACHED": str(tmp_path / "reached")}
    hosts = [a for i in (1, 2, 3) for a in ("--host", f"10.0.0.{i}", f"node-{i}")]
    r = subprocess.run(["bash", "-c", contract.node_script("run.sh"), "dtrain-run", *hosts, "--ready", "5",
                        "--ready-skip", "10.0.0.1", "--phase-says", "EV ", "--", "echo", "ran"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and r.stdout == "ran\n", r.stderr
    assert sorted((tmp_path / "reached").read_text().split()) == ["root@10.0.0.2", "root@10.0.0.3"]
    assert sorted(ln.split('"node": "')[1][:8] for ln in r.stderr.splitlines()) == ["10.0.0.2", "10.0.0.3"]


@pytest.mark.parametrize("ssh_rc", [0, 255])
def test_run_sh_ready_beside_starts_the_command_at_once_and_gives_it_the_checks_end(tmp_path, ssh_rc):
    """--ready-beside: the command (the supervisor's ready_code) starts while the handshakes
    still run and gets their verdict on its fd 3: 0 once every node answered; where one never
    does, --ready-code, the node named on stderr. The check's process is reaped, nothing left."""
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(f'#!/bin/bash\nsleep 0.5\ndate +%s.%N >> "$ENDED"\nexit {ssh_rc}\n')
    (bin_dir / "ssh").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "ENDED": str(tmp_path / "ended")}
    probe = ("import importlib.util, os, time\nt = time.time()\n"
             f"s = importlib.util.spec_from_file_location('sv', {str(NODE / 'supervise.py')!r})\n"
             "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); code = m.ready_code()\n"
             "def parent(p):  # of a process that may end while /proc is read\n"
             "    try:\n        return open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[1]\n"
             "    except OSError:\n        return None\n"
             "print(t, code, 'DTRAIN_READY_FD' in os.environ, [p for p in os.listdir('/proc') if p.isdigit() "
             "and parent(p) == str(os.getpid())])\n")
    hosts = [a for i in (1, 2) for a in ("--host", f"10.0.0.{i}", f"node-{i}")]
    r = subprocess.run(["bash", "-c", contract.node_script("run.sh"), "dtrain-run", *hosts, "--ready", "1",
                        "--ready-code", "97", "--ready-says", "SAYS ", "--ready-beside", "--",
                        sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    started, code, left_env, children = r.stdout.split(" ", 3)
    ended = [float(x) for x in (tmp_path / "ended").read_text().split()]
    assert float(started) < min(ended)  # python started before any handshake was done
    assert code == ("0" if ssh_rc == 0 else "97") and left_env == "False" and children.strip() == "[]"
    assert ("SAYS sshd on 10.0.0" in r.stderr) == (ssh_rc != 0)


# A fake ssh for --connect: one line per call, "HOST master|session NODELAY", where NODELAY is
# TCP_NODELAY of the socket on its stdin (ssh-connect.pl's) and "-" where stdin is no socket.
FAKE_SSH = r"""#!/bin/bash
for a; do :; done
kind=session; host=${@: -2:1}
case " $* " in *" ProxyCommand=- "*" -f -N "*) kind=master; host=${@: -1} ;; esac
nd=$(python3 -c 'import socket, sys
try:
    s = socket.socket(fileno=0); print(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY), s.getpeername()[1]); s.detach()
except OSError:
    print("-")' 2>/dev/null)
echo "$host $kind $nd" >> "$REACHED"
"""


def _listeners(addrs: list[str]) -> tuple[list, int]:
    """A listening socket on each of addrs (loopback), all on one port."""
    import socket

    for _ in range(20):
        first = socket.create_server((addrs[0], 0))
        port = first.getsockname()[1]
        socks = [first]
        try:
            socks += [socket.create_server((a, port)) for a in addrs[1:]]
            return socks, port
        except OSError:
            for s in socks:
                s.close()
    raise RuntimeError("no common free port on " + ", ".join(addrs))


def test_ssh_connect_runs_ssh_on_a_socket_with_nagle_off(tmp_path):
    """ssh-connect.pl: the program it runs gets the connection on stdin and stdout, TCP_NODELAY
    set (the client's 40 ms stall in a key exchange gone); a refused port fails as ssh does."""
    import socket

    (srv,), port = _listeners(["127.0.0.1"])
    check = ("import socket; a = socket.socket(fileno=0); b = socket.socket(fileno=1); "
             "print(a.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY), a.getpeername()[1], "
             "b.getsockname() == a.getsockname(), file=__import__('sys').stderr); a.detach(); b.detach()")
    r = subprocess.run(["perl", str(NODE / "ssh-connect.pl"), "127.0.0.1", str(port), "3", "python3", "-c", check],
                       capture_output=True, text=True, timeout=30)
    srv.close()
    assert r.returncode == 0 and r.stderr == f"1 {port} True\n", r.stderr
    closed = socket.create_server(("127.0.0.1", 0))
    free = closed.getsockname()[1]
    closed.close()
    r = subprocess.run(["perl", str(NODE / "ssh-connect.pl"), "127.0.0.1", str(free), "3", "true"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 255 and r.stderr == f"ssh: connect to host 127.0.0.1 port {free}: Connection refused\n"


@pytest.mark.parametrize("family", ["AF_INET", "AF_INET6"])
def test_sshd_listen_runs_sshd_i_per_connection_with_nagle_off_and_ends_on_sigterm(tmp_path, family):
    """sshd-listen.pl (Perl builtins, Linux's socket numbers): listens on IPv6 and IPv4 at once,
    runs `SSHD -i ARGS` on each connection (stdin and stdout the socket, TCP_NODELAY set), and a
    container's `docker stop` (SIGTERM) ends it with 0."""
    import signal
    import socket

    fam = getattr(socket, family)
    if fam == socket.AF_INET6 and not socket.has_ipv6:
        pytest.fail("this machine has no IPv6: sshd-listen.pl's IPv6 socket cannot be checked")
    sshd = tmp_path / "sshd"
    sshd.write_text("#!/usr/bin/env python3\nimport socket, sys\ns = socket.socket(fileno=0)\n"
                    "print(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY), *sys.argv[1:], flush=True)\n"
                    "s.detach()\n")
    sshd.chmod(0o755)
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    proc = subprocess.Popen(["perl", str(NODE / "sshd-listen.pl"), str(port), str(sshd), "-e"],
                            stderr=subprocess.PIPE, text=True)
    try:
        addr = "::1" if fam == socket.AF_INET6 else "127.0.0.1"
        for _ in range(100):
            try:
                conn = socket.create_connection((addr, port), timeout=5)
                break
            except ConnectionRefusedError:
                time.sleep(0.02)
        else:
            raise AssertionError(f"nothing listens on {addr} port {port}: {proc.stderr}")
        with conn:
            assert conn.makefile().readline() == "1 -i -e\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()


def test_sshd_listen_names_a_port_it_cannot_take():
    import socket

    taken = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    port = taken.getsockname()[1]
    with taken:
        r = subprocess.run(["perl", str(NODE / "sshd-listen.pl"), str(port), "/bin/true"], capture_output=True,
                           text=True, timeout=10)
    assert r.returncode != 0 and r.stderr.startswith(f"sshd-listen.pl: cannot listen on port {port}: "), r.stderr


@pytest.mark.parametrize("with_perl", [True, False])
def test_run_sh_ready_connect_makes_each_master_with_nagle_off_then_the_session(tmp_path, with_perl):
    """--ready --connect: per node (not --ready-skip's) first the master connection, ssh -f -N on
    ssh-connect.pl's socket (TCP_NODELAY, the node's --port), then the session that fills its
    /etc/hosts; where the container has no perl, the session alone, as without --connect."""
    import shutil

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(FAKE_SSH)
    (bin_dir / "ssh").chmod(0o755)
    path = str(bin_dir)
    if not with_perl:  # only what run.sh and the fake ssh use, no perl
        for tool in ("bash", "mktemp", "rm", "sleep", "tail", "cat", "echo", "python3"):
            (bin_dir / tool).symlink_to(shutil.which(tool))
    else:
        path += ":" + os.environ["PATH"]
    socks, port = _listeners(["127.0.0.2", "127.0.0.3"])
    env = {**os.environ, "PATH": path, "REACHED": str(tmp_path / "reached")}
    hosts = [a for i in (1, 2, 3) for a in ("--host", f"127.0.0.{i}", f"node-{i}")]
    r = subprocess.run(["bash", "-c", contract.node_script("run.sh"), "dtrain-run", *hosts, "--ready", "5",
                        "--ready-skip", "127.0.0.1", "--port", str(port), "--ssh", "ssh", "--ssh", "-o",
                        "--ssh", "ControlPath=/tmp/none-%C", "--connect", contract.node_script("ssh-connect.pl"),
                        "--", "echo", "ran"], capture_output=True, text=True, env=env, timeout=60)
    for s in socks:
        s.close()
    assert r.returncode == 0 and r.stdout == "ran\n", r.stderr
    calls = (tmp_path / "reached").read_text().splitlines()
    for h in ("127.0.0.2", "127.0.0.3"):
        mine = [c.split(" ", 1)[1] for c in calls if c.startswith(f"root@{h} ")]
        assert mine == ([f"master 1 {port}", "session -"] if with_perl else ["session -"]), calls


def test_env_file_is_names_and_base64():
    text = env_file({"A": "x\ny", "B": '"'})
    assert text == f"A={base64.b64encode(b'x' + bytes([10]) + b'y').decode()}\nB=Ig==\n"


def test_up_waits_for_sshd_on_the_contract_port(tmp_path):
    """up passes the sshd port to start (the probe's $port is the port's holder, not the port)."""
    head, rest = docker_run_parts(ContainerSpec(job="j", image="img:1", key_dir=str(tmp_path / "kd")))
    fake = ('docker() { case "$1 $2" in "image inspect") echo "' + IMG_ID + ' - 4 []" ;; esac; }\n'
            'ss() { case "$*" in *"sport = :2022"*) [ -e "$SEEN" ] && echo LISTEN; : > "$SEEN" ;; esac; }\n'
            'nvidia-smi() { return 1; }\n')
    r = host('up "$@"', "2022", "", "", "img:1", "never", "5",
             str(tmp_path / "kd"), "ssh-ed25519 AAA", "dtrain-j", "0", "0", str(len(head)), *head, *rest, fake=fake,
             stdin="-----END OPENSSH PRIVATE KEY-----\n", env={**os.environ, "SEEN": str(tmp_path / "seen")})
    assert r.returncode == 0, r.stderr
    assert "started=1" in r.stdout and "run=1" in r.stdout


def _up_with(tmp_path, fake: str, calls: Path) -> subprocess.CompletedProcess:
    head, rest = docker_run_parts(ContainerSpec(job="j", image="img:1", key_dir=str(tmp_path / "kd")))
    return host('up "$@"', "2022", "", "", "img:1", "never", "5", str(tmp_path / "kd"), "ssh-ed25519 AAA",
                "dtrain-j", "0", "0", str(len(head)), *head, *rest, fake=fake + 'nvidia-smi() { return 1; }\n',
                stdin="-----END OPENSSH PRIVATE KEY-----\n", env={**os.environ, "CALLS": str(calls)})


def test_up_removes_a_container_of_the_job_that_holds_the_port_before_the_probe(tmp_path):
    """A container of this job an earlier launch left running holds 2022: up's probe removes it
    (`docker rm -f` of the job's container name) and looks again; the container starts."""
    calls = tmp_path / "calls"
    fake = ('docker() { echo "$1 $2 ${3:-}" >> "$CALLS"; case "$1 $2" in "image inspect") echo "' + IMG_ID + ' - 4 []" ;;'
            ' "rm -f") : > "$CALLS.gone" ;; esac; }\n'
            'ss() { if [ ! -e "$CALLS.gone" ] || [ -e "$CALLS.run" ]; then echo LISTEN; fi; }\n')
    fake = fake.replace('case "$1 $2" in', 'case "$1 $2" in "run -d") : > "$CALLS.run" ;;')
    r = _up_with(tmp_path, fake, calls)
    assert r.returncode == 0 and "run=1" in r.stdout and "port=" not in r.stdout, r.stdout + r.stderr
    assert calls.read_text().splitlines()[:3] == ["image inspect -f", "rm -f dtrain-j", "run -d --name"]


def test_up_starts_the_prefetch_in_the_container_only_where_asked(tmp_path):
    """up's AHEAD words (commands.prefetch_argv: a node that pulled the image lazily) run in the
    job's container once it runs, detached (`docker exec -d NAME ARGV`); with none, no exec."""
    from dtrain.launch.jobs.commands import prefetch_argv

    head, rest = docker_run_parts(ContainerSpec(job="j", image="img:1", key_dir=str(tmp_path / "kd")))
    fake = ('docker() { echo "$*" >> "$CALLS"; case "$1 $2" in "image inspect") echo "' + IMG_ID + ' - 4 []" ;; esac; }\n'
            'ss() { case "$*" in *"sport = :2022"*) [ -e "$CALLS.seen" ] && echo LISTEN; : > "$CALLS.seen" ;; esac; }\n'
            'nvidia-smi() { return 1; }\n')
    for ahead in (prefetch_argv(), []):
        calls = tmp_path / f"calls{len(ahead)}"
        r = host('up "$@"; wait', "2022", "", "", "img:1", "never", "5", str(tmp_path / "kd"), "ssh-ed25519 AAA",
                 "dtrain-j", "0", str(len(ahead)), *ahead, str(len(head)), *head, *rest, fake=fake,
                 stdin="-----END OPENSSH PRIVATE KEY-----\n", env={**os.environ, "CALLS": str(calls)})
        assert r.returncode == 0 and "run=1" in r.stdout, r.stdout + r.stderr
        execs = [c for c in calls.read_text().splitlines() if c.startswith("exec")]
        assert execs == ([" ".join(["exec", "-d", "dtrain-j", *ahead])] if ahead else []), calls.read_text()


def test_probe_alone_names_what_holds_the_port_and_removes_nothing(tmp_path):
    """The probe step of doctor and the like (no container name): the holder named, no container removed."""
    calls = tmp_path / "calls"
    fake = ('docker() { echo "$1 $2" >> "$CALLS"; }\nss() { echo "LISTEN 0 128 *:2022 *:*"; }\n'
            'nvidia-smi() { return 1; }\n')
    r = host('probe "$@"', "2022", fake=fake, env={**os.environ, "CALLS": str(calls)})
    assert r.returncode == 0 and "port=LISTEN 0 128 *:2022 *:*" in r.stdout.splitlines(), r.stdout
    assert "rm -f" not in (calls.read_text() if calls.exists() else "")


@pytest.mark.parametrize("says, started", [
    ('Conflict. The container name "/dtrain-j" is already in use by container "b1". You have to remove it.', True),
    ("Error response from daemon: no space left on device", False),
])
def test_start_removes_a_stopped_container_of_the_job_whose_name_is_taken_once(tmp_path, says, started):
    """docker run refused for the name (a stopped container of this job): removed, run again;
    any other refusal is the step's error, on stderr, nothing removed."""
    calls = tmp_path / "calls"
    fake = ('docker() { echo "$1 $2 ${3:-}" >> "$CALLS"; case "$1 $2" in "image inspect") echo "' + IMG_ID + ' - 4 []" ;;'
            ' "run -d") if [ ! -e "$CALLS.once" ]; then : > "$CALLS.once"; echo "$SAYS" >&2; return 125; fi ;;'
            ' esac; }\n'
            'ss() { [ ! -e "$CALLS.once" ] || [ "$(grep -c "^run" "$CALLS")" -lt 2 ] || echo LISTEN; }\n')
    r = _up_with(tmp_path, fake.replace("$SAYS", says.replace('"', '\\"')), calls)
    ran = [c for c in calls.read_text().splitlines() if c.split()[0] in ("run", "rm")]
    if started:
        assert r.returncode == 0 and "run=1" in r.stdout, r.stderr
        assert ran == ["run -d --name", "rm -f dtrain-j", "run -d --name"]
    else:
        assert r.returncode == 1 and r.stderr.strip().endswith(says) and ran == ["run -d --name"]


def test_prepare_makes_the_job_directory_anew_with_the_watchdog(tmp_path):
    job = node_jobs(tmp_path) / "j"
    (job / "workdir").mkdir(parents=True)
    (job / "workdir" / "stale.py").write_text("old")
    env = {**os.environ, "HOME": str(tmp_path)}
    r = host('prepare "$@"', "j", "me 1 t", stdin="#!/bin/bash\necho watch\n", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(job.resolve())
    assert (job / "watch.sh").read_text() == "#!/bin/bash\necho watch\n"
    assert list((job / "workdir").iterdir()) == [] and oct(job.stat().st_mode & 0o777) == "0o700"


def test_prepare_up_goes_on_with_up_in_the_same_session_when_the_launcher_says_go(tmp_path):
    """The first round and the start step in one session: prepare (the watchdog's program up to
    a NUL), `prepared=1`, then up with the arguments the launcher sends (`go N`, N NUL-ended
    words, empty ones too), the rest of stdin up's own."""
    from dtrain.launch.jobs.job import go_text

    env = {**os.environ, "HOME": str(tmp_path)}
    fake = "up() { printf '<%s>' \"$@\"; echo; echo \"cwd=$PWD\"; cat; }"
    args = ["2022", "", "", "r/x:1", "arg with\nnewline"]
    r = host('prepare_up "$@"', "j", "me 1 t", fake=fake, env=env,
             stdin="#!/bin/bash\necho watch\n\0" + go_text(args) + "KEY\nENV\n")
    assert r.returncode == 0, r.stderr
    job = (node_jobs(tmp_path) / "j").resolve()
    assert r.stdout.split("\n")[:2] == [str(job), "prepared=1"]
    assert "<2022><><><r/x:1><arg with\nnewline>\n" in r.stdout and r.stdout.endswith("KEY\nENV\n")
    assert f"cwd={tmp_path}" in r.stdout  # up runs where a session of its own would: the home directory
    assert (job / "watch.sh").read_text() == "#!/bin/bash\necho watch\n"
    # the launch ended before its start step (another node refused): nothing more here
    for stdin in ("w\0", "w\0stop\n"):
        r = host('prepare_up "$@"', "j", "me 1 t", fake=fake, env=env, stdin=stdin)
        assert r.returncode == 0 and r.stdout.splitlines() == [str(job), "prepared=1"], r.stdout
    # another launch holds the name: refused before anything
    r = host('prepare_up "$@"', "j", "other 2 u", fake=fake, env=env, stdin="w\0go 0\n")
    assert r.returncode == 3 and "prepared=1" not in r.stdout


@pytest.mark.parametrize("policy,digest,held", [
    ("missing", "", True),
    ("always", "sha256:d1", True),
    ("always", "sha256:d2", False),  # the registry has moved on: pull
    ("always", "", False),  # no digest from the registry: always pull
])
def test_prepare_with_an_image_says_whether_the_node_holds_it(tmp_path, policy, digest, held):
    fake = ("docker() { [ \"$1 $2 $3 $5 ${6:-}\" = 'image inspect -f r/x:1 ' ] || return 9; "
            "echo 'sha256:abc - 4 [\"r/x@sha256:d1\",\"q/x@sha256:d0\"]'; }")
    env = {**os.environ, "HOME": str(tmp_path)}
    r = host('prepare "$@"', "j", "me 1 t", "r/x:1", policy, digest, fake=fake,
             stdin="w", env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == str((node_jobs(tmp_path) / "j").resolve())  # the directory: still the last line
    assert lines[:-1] == (["held sha256:abc"] if held else [])


def test_prepare_with_an_image_the_node_lacks_says_nothing_of_it(tmp_path):
    fake = "docker() { echo 'Error: No such image: r/x:1'; return 1; }"
    r = host('prepare "$@"', "j", "me 1 t", "r/x:1", "missing", "", fake=fake,
             stdin="w", env={**os.environ, "HOME": str(tmp_path)})
    assert r.returncode == 0 and r.stdout.splitlines() == [str((node_jobs(tmp_path) / "j").resolve())]


@pytest.mark.parametrize("held", [True, False])
def test_the_start_step_reads_the_first_rounds_inspect_where_the_node_held_the_image(tmp_path, held):
    """prepare_up: one `docker image inspect` in the whole session where the node held the image
    (the first round's); where it did not (the pull step pulled it since), the start step asks
    the engine again and finds it."""
    from dtrain.launch.jobs.job import go_text

    calls = tmp_path / "calls"
    fake = ("docker() { echo \"$1 $2\" >> \"$CALLS\"; case \"$1 $2\" in 'image inspect') "
            "if [ -n \"$HELD\" ] || [ \"$(wc -l < \"$CALLS\")\" -gt 1 ]; then echo \"$LINE\"; "
            "else echo 'Error: No such image: r/x:1'; fi ;; esac; }\n"
            "ss() { :; }; probe() { :; }; gate() { :; }; start() { echo \"start $*\"; }")
    env = {**os.environ, "HOME": str(tmp_path), "CALLS": str(calls), "HELD": "1" if held else "",
           "LINE": f"{IMG_ID} - 4 []"}
    args = ["2022", "", "", "r/x:1", "missing", "60", "/dev/shm/k", "pub", "dtrain-j", "0", "0", "1", "docker"]
    r = host('prepare_up "$@"', "j", "me 1 t", "r/x:1", "missing", "", fake=fake,
             env=env, stdin="w\0" + go_text(args) + "KEY\n")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert (f"held {IMG_ID}" in lines) == held
    assert f"image=- 4 {IMG_ID}" in lines and "docker=ok" in lines
    assert calls.read_text().splitlines() == (["image inspect"] if held else ["image inspect", "image inspect"])


def test_prepare_takes_the_nodes_lock_of_the_name_and_remove_releases_it(tmp_path):
    """A second launch (another owner) of a name whose lock is held is refused (exit 3, naming
    the job and the holder) and changes nothing; the same launch may ask again; remove frees it."""
    env = {**os.environ, "HOME": str(tmp_path)}
    job = node_jobs(tmp_path) / "j"
    assert host('prepare "$@"', "j", "hostA pid 1 tok1", stdin="w", env=env).returncode == 0
    (job / "workdir" / "mine.py").write_text("first launch's")
    r = host('prepare "$@"', "j", "hostB pid 2 tok2", stdin="w", env=env)
    assert r.returncode == 3 and "job j is already running on this node" in r.stderr and "hostA pid 1 tok1" in r.stderr
    assert (job / "workdir" / "mine.py").exists(), "a refused launch changes nothing"
    assert host('prepare "$@"', "j", "hostA pid 1 tok1", stdin="w", env=env).returncode == 0
    fake = "docker() { return 0; }"
    r = host('remove "$@"', "dtrain-j", "/dev/shm/dtrain-j-test-absent", "j", fake=fake, env=env)
    assert r.returncode == 0, r.stderr
    assert not job.exists() and not (node_jobs(tmp_path) / "j.lock").exists()
    assert host('prepare "$@"', "j", "hostB pid 2 tok2", stdin="w", env=env).returncode == 0


def test_a_stale_node_lock_is_taken_over(tmp_path):
    """No watchdog alive and older than the grace (a launcher killed before its containers)."""
    env = {**os.environ, "HOME": str(tmp_path)}
    lock = node_jobs(tmp_path) / "j.lock"
    lock.mkdir(parents=True)
    (lock / "owner").write_text("gone 1 t\n")
    os.utime(lock, (time.time() - 4000, time.time() - 4000))
    r = host('prepare "$@"', "j", "me 2 t", stdin="w", env=env)
    assert r.returncode == 0, r.stderr
    assert (lock / "owner").read_text() == "me 2 t\n"


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/b", "/etc/x", ".dtrain", "a b", "-x", "j\n"])
def test_node_programs_refuse_a_bad_job_name(tmp_path, name):
    """Never $HOME, ~/.dtrain or a store's root: prepare, remove, job_file and keep_workdir check
    the name first."""
    env = {**os.environ, "HOME": str(tmp_path)}
    keep = node_jobs(tmp_path) / "other"
    keep.mkdir(parents=True)
    for step, args in [("prepare", (name, "me 1 t")), ("remove", ("dtrain-x", "/dev/shm/dtrain-x-absent", name)),
                       ("job_file", (name, "output.log", "0")), ("keep_workdir", (name, "0123456789abcdef"))]:
        if step == "remove" and not name:
            continue  # remove without NAME: no directory
        r = host(f'{step} "$@"', *args, fake="docker() { return 0; }", stdin="w", env=env)
        assert r.returncode == 2 and "bad job name" in r.stderr, (step, r.stderr)
    assert keep.is_dir() and sorted(p.name for p in tmp_path.rglob("*")) == [".dtrain", "jobs", "nodes", "other", HOST]
    r = host('HOME= remove "$@"', "dtrain-x", "/dev/shm/dtrain-x-absent", "j", fake="docker() { return 0; }", env=env)
    assert r.returncode != 0 and keep.is_dir()


@pytest.mark.parametrize("hostname, key", [("node-1", "node-1"), ("ip-10-0-0-5.ec2.internal", "ip-10-0-0-5.ec2.internal"),
                                           ("a b/c*", "a_b_c_"), (".hidden", "_.hidden"), ("..", "_.."), ("*", "_")])
def test_a_nodes_root_is_keyed_by_its_hostname(tmp_path, hostname, key):
    """Every file a node keeps under the home is under ~/.dtrain/nodes/HOST (HOST: its hostname,
    any character but letters, digits, _ . - made _, never `.`, `..` or hidden)."""
    r = on_host(hostname, 'node_root; echo "$nroot"; job_path j', env={**os.environ, "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"{tmp_path}/.dtrain/nodes/{key}", f"{tmp_path}/.dtrain/nodes/{key}/jobs/j"]


def test_nodes_sharing_one_home_make_their_job_directories_apart_at_once(tmp_path):
    """Issue 38: nodes whose home is one directory (NFS /home) each make the job's directory
    anew at the same moment, relaunch after relaunch: each its own (and its own lock), none
    fails, none removes another's. Four nodes, each in a UTS namespace of its own (as the
    simulated cluster's), one HOME."""
    env = {**os.environ, "HOME": str(tmp_path)}
    names = [f"node-{i}" for i in range(1, 5)]
    for launch in range(5):
        procs = [subprocess.Popen(on_host_argv(h, 'prepare "$@"', "j", f"launcher pid 1 launch {launch}"),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env) for h in names]
        outs = [p.communicate(f"#!/bin/bash\n# launch {launch}\n", timeout=60) for p in procs]
        assert [p.returncode for p in procs] == [0] * 4, [o[1] for o in outs]
        dirs = [o[0].strip() for o in outs]
        assert dirs == [str(tmp_path / ".dtrain" / "nodes" / h / "jobs" / "j") for h in names]
        for d in map(Path, dirs):
            assert (d / "watch.sh").read_text() == f"#!/bin/bash\n# launch {launch}\n"
            assert (d / "workdir").is_dir() and (d / "sup.in").is_fifo() and (d / "sup.out").is_fifo()
            assert (Path(f"{d}.lock") / "owner").read_text() == f"launcher pid 1 launch {launch}\n"
        (Path(dirs[0]) / "workdir" / "mine.py").write_text("node-1's")
        # a node removes its own part only
        r = subprocess.run(on_host_argv("node-2", 'remove "$@"', "dtrain-j", "/dev/shm/dtrain-j-absent", "j"),
                           capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        assert not Path(dirs[1]).exists() and not Path(f"{dirs[1]}.lock").exists()
        assert (Path(dirs[0]) / "workdir" / "mine.py").exists() and Path(f"{dirs[0]}.lock").is_dir()
        for h in (names[0], *names[2:]):  # the other launch of the name, as teardown does
            assert subprocess.run(on_host_argv(h, 'remove "$@"', "dtrain-j", "/dev/shm/dtrain-j-absent", "j"),
                                  env=env).returncode == 0
    assert sorted(p.name for p in (tmp_path / ".dtrain" / "nodes").iterdir()) == names
    assert all(not any((tmp_path / ".dtrain" / "nodes" / h / "jobs").iterdir()) for h in names)


def test_job_file_prints_this_nodes_file_of_the_job_or_one_an_older_dtrain_left(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path)}
    r = host('job_file "$@"', "j", "output.log", "0", env=env)
    assert r.returncode == 1 and r.stderr.strip() == "no output.log of the job on this node"
    old = tmp_path / ".dtrain" / "node-jobs" / "j"  # a job started before per-node directories
    old.mkdir(parents=True)
    (old / "state.json").write_text('{"state": "running"}')
    assert host('job_file "$@"', "j", "state.json", "0", env=env).stdout == '{"state": "running"}'
    (node_jobs(tmp_path) / "j").mkdir(parents=True)
    (node_jobs(tmp_path) / "j" / "state.json").write_text('{"state": "succeeded"}')
    assert host('job_file "$@"', "j", "state.json", "0", env=env).stdout == '{"state": "succeeded"}'
    r = host('job_file "$@"', "j", "watch.sh", "0", env=env)  # only the files `logs` and `status` read
    assert r.returncode == 2 and "no job file 'watch.sh'" in r.stderr


def test_remove_also_removes_a_job_an_older_dtrain_left(tmp_path):
    """`dtrain stop` of a job an older dtrain started (~/.dtrain/node-jobs/NAME, its lock beside)."""
    env = {**os.environ, "HOME": str(tmp_path)}
    old = tmp_path / ".dtrain" / "node-jobs"
    (old / "j" / "workdir").mkdir(parents=True)
    (old / "j.lock").mkdir()
    (old / "other").mkdir()
    r = host('remove "$@"', "dtrain-j", "/dev/shm/dtrain-j-absent", "j", fake="docker() { return 0; }", env=env)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in old.iterdir()) == ["other"]


def test_keep_workdir_makes_the_jobs_copy_this_nodes_cache_by_hard_links(tmp_path):
    """After --workdir's sync: the job's workdir/ becomes the node's cache of that directory
    (workdir.NODE_CACHE from the job's workdir/, where rsync's --link-dest looks), hard links,
    the last one replacing the one before; nodes sharing the home each keep their own."""
    from dtrain.launch.jobs import workdir

    env = {**os.environ, "HOME": str(tmp_path)}
    key = "0123456789abcdef"
    for h in ("node-1", "node-2"):
        r = subprocess.run(on_host_argv(h, 'prepare "$@"', "j", "me 1 t"), input="w", capture_output=True,
                           text=True, env=env)
        assert r.returncode == 0, r.stderr
        wd = Path(r.stdout.strip()) / "workdir"
        (wd / "sub").mkdir()
        (wd / "sub" / "a.py").write_text(h)
        for _ in range(2):
            r = subprocess.run(on_host_argv(h, 'keep_workdir "$@"', "j", key), capture_output=True, text=True, env=env)
            assert r.returncode == 0, r.stderr
        cache = (wd / workdir.NODE_CACHE / key).resolve()
        assert cache == tmp_path / ".dtrain" / "nodes" / h / "workdir-cache" / key
        assert os.path.samefile(cache / "sub" / "a.py", wd / "sub" / "a.py")
        assert sorted(p.name for p in cache.parent.iterdir()) == [key]  # no copy aside left
    r = host('keep_workdir "$@"', "j", "../../x", env=env)
    assert r.returncode == 2 and "bad workdir cache key" in r.stderr


def test_stop_watch_ends_the_watchdog_and_what_it_waits_on(tmp_path):
    """stop_watch (teardown, relaunch) kills the watchdog's process group, as start.sh starts it
    (setsid): its `sleep 2` does not outlive it (the demo's cluster teardown right after the job
    found one per node: `stopping 1 leftover process(es)`)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "docker").write_text("#!/bin/sh\necho running\n")  # the container runs on
    (bin_ / "docker").chmod(0o755)
    d = tmp_path / "node-jobs" / "t-watch"
    d.mkdir(parents=True)
    watch = subprocess.Popen(["bash", str(NODE / "watch.sh"), "dtrain-t-watch", "img", str(d),
                              "/dev/shm/dtrain-t-watch-absent"], env={**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"},
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)  # as start.sh's setsid

    def group() -> list[str]:  # the living processes of the watchdog's group: their names
        out = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                name, rest = stat.read_text().rsplit(")", 1)
            except OSError:
                continue
            state, _ppid, pgid = rest.split()[:3]
            if int(pgid) == watch.pid and state != "Z":
                out.append(name.split("(", 1)[1])
        return sorted(out)
    try:
        deadline = time.monotonic() + 10
        while "sleep" not in group() or not (d / "watch.pid").exists():
            assert time.monotonic() < deadline, group()
            time.sleep(0.05)
        assert (d / "watch.pid").read_text().strip() == str(watch.pid)
        r = host('stop_watch "$1"', str(d))
        assert r.returncode == 0, r.stderr
        watch.wait(5)
        time.sleep(0.2)
        assert group() == []
        assert not (d / "watch.pid").exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(watch.pid, 9)  # what this test started, whatever stop_watch left
        watch.wait(5)


def test_supervise_writes_its_files_then_runs_the_argv(tmp_path):
    """attach: supervise.py, the plan and the builders from stdin, then exec ARGV with the rest
    of stdin (its end stops a foreground job); detach: ARGV returns at once, the first events
    are printed."""
    from dtrain.launch.jobs.commands import counted_text

    d = tmp_path / "job"
    d.mkdir()
    sup = "# é → ü\nSUP\n\n"  # multibyte text and trailing newlines, exactly
    r = host('supervise "$@"', str(d), "attach", "sh", "-c", 'cat; echo " argv=$1"', "x", "1 2",
             stdin=counted_text([sup, '{"plan": 1}', '{"dtrain/x.py": "ü"}']) + "rest of stdin",
             env={**os.environ, "LC_ALL": "C.UTF-8"})
    assert r.returncode == 0, r.stderr
    assert r.stdout == "rest of stdin argv=1 2\n"
    assert (d / "supervise.py").read_text() == sup and (d / "plan.json").read_text() == '{"plan": 1}'
    assert (d / "builders.json").read_text() == '{"dtrain/x.py": "ü"}'
    assert oct((d / "plan.json").stat().st_mode & 0o777) == "0o600"
    started = ('(sleep 0.3; echo \'dtrain-supervisor {"event": "running", "attempt": 0}\' >> "$1/output.log") '
               '>/dev/null 2>&1 &')
    r = host('supervise "$@"', str(d), "detach", "sh", "-c", started, "x", str(d), stdin=counted_text(["SUP", "{}", "{}"]))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith('dtrain-supervisor {"event": "running"'), r.stdout
    r = host('supervise "$@"', str(d), "detach", "sh", "-c", "exit 97", stdin=counted_text(["SUP", "{}", "{}"]))
    assert r.returncode == 97  # the readiness check's code, for the launcher to name the node


def _standby(d: Path) -> subprocess.Popen:
    """launch/node/standby.sh as a container runs it: PID 1 of a PID namespace of its own
    (its kill -1 reaches that namespace only), the job's directory d with prepare's FIFOs."""
    os.mkfifo(d / "sup.in")
    os.mkfifo(d / "sup.out")
    return subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "bash", str(NODE / "standby.sh"), str(d)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_the_standby_runs_what_the_relay_sends_and_the_relay_gives_its_output_and_code(tmp_path):
    """host/supervise.sh standby mode (relay) -> launch/node/standby.sh: the argv exactly
    (spaces, UTF-8), the session's stdin the supervisor's (its end stops it), the output to the
    end and the exit code; a process the supervisor left (an ssh master holding its output) is
    killed, so the relay ends with the supervisor, and the standby ends after the relay."""
    d = tmp_path / "job"
    d.mkdir()
    standby = _standby(d)
    try:
        job = 'echo "argv: $*"; (sleep 100 &); while read -r l; do echo "got $l"; done; echo ended >&2; exit 7'
        t = time.monotonic()
        r = host('relay "$@"', str(d), "bash", "-c", job, "dtrain-run", "a b", "é ü",
                 stdin="beat\nbeat 2\n", env={**os.environ, "LC_ALL": "C.UTF-8"})
        assert r.returncode == 7, r.stderr
        assert r.stdout == "argv: a b é ü\ngot beat\ngot beat 2\nended\n", r.stdout
        assert time.monotonic() - t < 10  # not the orphan's 100 s
        assert standby.wait(15) == 7, standby.stdout.read() if standby.stdout else ""
        assert (d / "sup.rc").read_text() == "7\n"
    finally:
        standby.kill()
        standby.wait()


def test_the_relay_says_137_where_the_container_went_and_fails_where_no_standby_answers(tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    standby = _standby(d)
    relay = subprocess.Popen(["bash", "-c", LIBRARY + "\n" + LABELS + 'relay "$@"', "t", str(d), "sleep", "100"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while not _has_child(standby.pid, "sleep"):
            assert time.monotonic() < deadline, "the standby did not start the supervisor"
            time.sleep(0.05)
        standby.kill()  # `docker rm -f`: the namespace's init and everything in it
        out, err = relay.communicate(timeout=15)
        assert relay.returncode == 137 and out == "", (relay.returncode, out, err)
    finally:
        standby.kill()
        relay.kill()
        standby.wait()
        relay.wait()
    # FIFOs, but no container waiting on them: not a hang, one line and exit 1 after STANDBY_WAIT
    e = tmp_path / "none"
    e.mkdir()
    os.mkfifo(e / "sup.in")
    os.mkfifo(e / "sup.out")
    r = host('STANDBY_WAIT=0.5; relay "$@"', str(e), "true")
    assert r.returncode == 1 and r.stderr == "the job's container did not take its supervisor within 0.5 s\n", r.stderr


def test_the_standby_ends_where_the_launcher_went_mid_output_and_passes_an_empty_argument(tmp_path):
    """kill -9 of the launcher: its ssh session goes (the relay killed, the session's pipes
    closed) while the supervisor still prints; the supervisor sees its stdin end and stops, the
    standby writes its code and ends, though nothing reads sup.out any more. An empty argument
    arrives as one (counted as 0 bytes)."""
    d = tmp_path / "job"
    d.mkdir()
    standby = _standby(d)
    job = 'echo "argv: $#[$1]"; while read -r -t 0.01 _ || [ $? -gt 128 ]; do echo tick; done; exit 5'
    relay = subprocess.Popen(["bash", "-c", LIBRARY + "\n" + LABELS + 'relay "$@"', "t", str(d),
                              "bash", "-c", job, "dtrain-run", ""],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert relay.stdout.readline() == b"argv: 1[]\n"
        assert relay.stdout.readline() == b"tick\n"
        relay.kill()  # the relay, then what sshd does when the session goes: its pipes closed
        relay.stdin.close()
        relay.stdout.close()
        assert standby.wait(15) == 5, standby.stdout.read() if standby.stdout else ""
        assert (d / "sup.rc").read_text() == "5\n"
    finally:
        standby.kill()
        relay.kill()
        standby.wait()
        relay.wait()


def _has_child(pid: int, name: str) -> bool:
    """Whether any descendant of pid runs `name`."""
    kids = {pid}
    for _ in range(6):
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                comm, rest = stat.read_text().rsplit(")", 1)
            except OSError:
                continue
            if int(rest.split()[1]) in kids:
                if comm.split("(", 1)[1] == name:
                    return True
                kids.add(int(stat.parent.name))
    return False


def test_write_private_runs_from_its_file(tmp_path):
    """A node program that was shell text in a Python string (issue 39): a file of launch/node/
    run as `bash -c TEXT NAME ARGS...`, the values arguments; run here as the node's ssh session
    would (its home the current directory and $HOME)."""
    from dtrain.launch.jobs.node_programs import program_argv

    env = {**os.environ, "HOME": str(tmp_path)}
    run = lambda argv, **kw: subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,  # noqa: E731
                                            timeout=30, **kw)
    private = tmp_path / "kd" / "node.env"
    private.parent.mkdir()
    write = program_argv("write-private.sh", [str(private)])
    assert write[3:] == ["dtrain-write-private", str(private)]
    assert run(write, input="NCCL_SOCKET_IFNAME=ens5\n").returncode == 0
    assert private.read_text() == "NCCL_SOCKET_IFNAME=ens5\n"
    assert oct(private.stat().st_mode & 0o777) == "0o600"


def test_a_detached_supervisor_runs_from_detach_sh_without_the_sessions_streams(tmp_path):
    from dtrain.launch.jobs.commands import supervisor_argv

    assert supervisor_argv("/job", False) == ["python3", "/job/supervise.py", "/job/plan.json"]
    argv = supervisor_argv("/job", True)
    assert argv[:4] == ["setsid", "-f", "bash", "-c"] and argv[4] == (NODE / "detach.sh").read_text()
    assert argv[5:] == ["dtrain-detach", "python3", "/job/supervise.py", "/job/plan.json"]
    # the program with another command: its stdin empty, its stdout and stderr nowhere
    out = tmp_path / "out"
    probe = ["sh", "-c", f'read -r x; echo "got=$x" > {out}; echo to-stdout; echo to-stderr >&2']
    r = subprocess.run([*argv[:5], "dtrain-detach", *probe], input="typed\n", capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0 and r.stdout == r.stderr == ""
    for _ in range(100):
        if out.exists() and out.read_text():
            break
        time.sleep(0.05)
    assert out.read_text() == "got=\n"


def test_run_sh_ready_runs_the_builders_ssh_word_for_word(tmp_path):
    """--ready with job.py's --ssh words (container.ready_ssh): each node's session is exactly
    that argv, then root@HOST and the /etc/hosts filler."""
    from dtrain.launch.jobs import container

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text('#!/bin/bash\nprintf "%s\\n" ssh "$@" > "$REACHED.$$"\n')
    (bin_dir / "ssh").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "REACHED": str(tmp_path / "argv")}
    words = [a for w in container.ready_ssh() for a in ("--ssh", w)]
    r = subprocess.run(["bash", "-c", contract.node_script("run.sh"), "dtrain-run", "--host", "10.0.0.2", "node-2",
                        "--ready", "5", "--port", "2022", *words, "--", "true"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    (got,) = [p.read_text().splitlines() for p in tmp_path.glob("argv.*")]
    assert got[:-1] == [*container.ready_ssh(), "root@10.0.0.2"] and "/etc/hosts" in got[-1]


def test_doctor_container_reaches_each_peer_with_the_builders_ssh(tmp_path):
    """doctor-container.sh SSH... -- PEER...: one ssh per peer, exactly container.doctor_ssh's
    argv, then root@PEER and the check."""
    from dtrain.launch.jobs import container

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text('#!/bin/bash\nprintf "%s|" ssh "$@" >> "$REACHED"; echo >> "$REACHED"\n'
                                 'echo /usr/bin/orted\n')
    (bin_dir / "ssh").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "REACHED": str(tmp_path / "argv")}
    r = subprocess.run(["bash", "-c", contract.node_script("doctor-container.sh"), "dtrain-doctor-container",
                        *container.doctor_ssh(), "--", "10.0.0.2", "10.0.0.3"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "peer 10.0.0.2=ok" in r.stdout and "peer 10.0.0.3=ok" in r.stdout, r.stdout
    calls = [line.rstrip("|").split("|") for line in (tmp_path / "argv").read_text().splitlines()]
    assert calls == [[*container.doctor_ssh(), f"root@{p}", "command -v orted python"] for p in ("10.0.0.2", "10.0.0.3")]


def test_doctor_container_gives_a_firewalled_peer_about_10_s_not_20_connect_timeouts(tmp_path):
    """A peer whose port 2022 drops packets costs each try its whole connect timeout (5 s): the
    check gives up after ~10 s (two or three tries), where twenty tries took 110 s."""
    from dtrain.launch.jobs import container

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text('#!/bin/bash\necho x >> "$TRIES"; sleep 5\n'
                                 'echo "ssh: connect to host 10.0.0.3 port 2022: Connection timed out" >&2; exit 255\n')
    (bin_dir / "ssh").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TRIES": str(tmp_path / "tries")}
    began = time.monotonic()
    r = subprocess.run(["bash", "-c", contract.node_script("doctor-container.sh"), "dtrain-doctor-container",
                        *container.doctor_ssh(), "--", "10.0.0.3"], capture_output=True, text=True, env=env, timeout=60)
    took = time.monotonic() - began
    assert "peer 10.0.0.3=ssh: connect to host 10.0.0.3 port 2022: Connection timed out" in r.stdout, r.stdout
    assert 2 <= len((tmp_path / "tries").read_text().split()) <= 3 and 10 <= took < 20, took
