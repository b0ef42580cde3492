"""Fan-out against real processes: local `sh -c` for most cases, a real sshd for the ssh path."""

import getpass
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from dtrain.launch.errors import LaunchError
from dtrain.launch.remote.fanout import NodeResult, raise_on_failure, run_all
from dtrain.launch.remote.hosts import Node, ssh_argv

# timing bounds (a heartbeat, a supervisor's reaction): run with the cluster tests, not beside them (dtrain/suite.py)
pytestmark = pytest.mark.serial

NODES = [Node("n1", 1), Node("n2", 1), Node("n3", 1)]


def sh(script, *args):
    return ["sh", "-c", script, "sh", *args]


def alive(pid: int) -> bool:
    """True while pid exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_dead(pid: int, within: float = 3.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


# A stand-in for ssh: refuses the connection (exit 255, ssh's message) the first N times.
FLAKY = """
n=$(cat "$1" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "$1"
if [ "$n" -le "$2" ]; then echo "ssh: connect to host $3 port 22: Connection refused" >&2; exit 255; fi
echo "ok after $n"
"""


def test_success_order_and_streaming():
    lines = []
    results = run_all(
        NODES,
        lambda n: sh('echo "hello from $1"; echo "warn $1" >&2', n.host),
        on_line=lambda node, line: lines.append((node.host, line)),
    )
    assert [(r.host, r.returncode, r.stdout, r.stderr, r.attempts, r.error) for r in results] == [
        (h, 0, f"hello from {h}\n", f"warn {h}\n", 1, None) for h in ("n1", "n2", "n3")
    ]
    assert all(r.ok and r.seconds < 5 for r in results)
    hosts = ("n1", "n2", "n3")
    assert sorted(lines) == sorted([(h, f"hello from {h}") for h in hosts] + [(h, f"warn {h}") for h in hosts])
    raise_on_failure(results, "hello")  # no error
    assert run_all([], lambda n: ["true"]) == []


def test_failure_is_not_retried():
    [r] = run_all([Node("n1", 1)], lambda n: sh("echo partial; echo 'boom: no such file' >&2; exit 3"))
    assert (r.returncode, r.attempts, r.error) == (3, 1, "exit 3: boom: no such file")
    # ssh's 255 without a connection message (auth failure) is not retried either.
    [r] = run_all([Node("n1", 1)], lambda n: sh("echo 'root@h: Permission denied (publickey).' >&2; exit 255"))
    assert (r.attempts, r.error) == (1, "exit 255: root@h: Permission denied (publickey).")
    # A connection message with another exit code is the remote command's business.
    [r] = run_all([Node("n1", 1)], lambda n: sh("echo 'curl: Connection refused' >&2; exit 7"))
    assert (r.attempts, r.error) == (1, "exit 7: curl: Connection refused")


def test_connection_refused_is_retried_with_backoff(tmp_path):
    start = time.monotonic()
    results = run_all(
        NODES,
        lambda n: sh(FLAKY, str(tmp_path / n.host), "2", n.host),
        retries=2,
        backoff=0.2,
    )
    assert [(r.attempts, r.returncode, r.stdout, r.error) for r in results] == [(3, 0, "ok after 3\n", None)] * 3
    # Backoff 0.2 then 0.4, nodes in parallel.
    assert 0.6 <= results[0].seconds < 3
    assert time.monotonic() - start < 3


def test_a_host_that_does_not_answer_gets_one_retry_not_all(tmp_path):
    """Each try at a host that never answers costs a whole connect timeout: one retry only
    (a refused connection, a busy sshd, keeps every retry)."""
    silent = sh('echo x >> "$1"; echo "ssh: connect to host $2 port 22: $3" >&2; exit 255')
    for why in ("Connection timed out", "No route to host"):
        log = tmp_path / why.replace(" ", "-")
        r = run_all([Node("n1", 1)], lambda n: [*silent, str(log), n.host, why], retries=3, backoff=0.01)[0]
        assert (r.attempts, log.read_text().count("x")) == (2, 2), why
        assert r.error == f"ssh could not connect (2 attempts): ssh: connect to host n1 port 22: {why}"


def test_retries_exhausted_names_the_reason(tmp_path):
    results = run_all(
        [Node("n1", 1), Node("n2", 1)],
        lambda n: sh(FLAKY, str(tmp_path / n.host), "9" if n.host == "n2" else "0", n.host),
        retries=3,
        backoff=0.01,
    )
    assert results[0].ok
    assert (results[1].attempts, results[1].returncode) == (4, 255)
    assert results[1].error == "ssh could not connect (4 attempts): ssh: connect to host n2 port 22: Connection refused"
    with pytest.raises(LaunchError) as e:
        raise_on_failure(results, "docker pull")
    assert str(e.value) == (
        "docker pull failed on 1 of 2 hosts:\n"
        "  n2: ssh could not connect (4 attempts): ssh: connect to host n2 port 22: Connection refused"
    )


def test_timeout_kills_process_group(tmp_path):
    pidfile = tmp_path / "grandchild"
    start = time.monotonic()
    [r] = run_all(
        [Node("n1", 1)],
        # The background sleep is a grandchild: only a process-group kill reaches it.
        lambda n: sh('sleep 30 & echo $! > "$1"; echo started; wait', str(pidfile)),
        timeout=0.5,
    )
    assert time.monotonic() - start < 5
    assert (r.returncode, r.attempts, r.error) == (None, 1, "timed out after 0.5s: started")
    assert wait_dead(int(pidfile.read_text()))


def test_concurrency_bound():
    # Each node prints its start and end times; at most 2 may overlap.
    results = run_all(
        [Node(f"n{i}", 1) for i in range(6)],
        lambda n: sh("date +%s.%N; sleep 0.3; date +%s.%N"),
        concurrency=2,
    )
    spans = [tuple(float(x) for x in r.stdout.split()) for r in results]
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda x: (x[0], x[1]))
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    assert peak == 2
    assert max(e for _, e in spans) - min(s for s, _ in spans) >= 0.85  # 3 waves of 0.3s


def test_command_not_found():
    [r] = run_all([Node("n1", 1)], lambda n: ["/nonexistent/ssh", "x"])
    assert (r.returncode, r.attempts) == (None, 1)
    assert r.error == "could not start /nonexistent/ssh: No such file or directory"


def test_make_argv_error_runs_nothing(tmp_path):
    def make(n):
        if n.host == "n3":
            raise ValueError("bad node")
        return sh('touch "$1"', str(tmp_path / n.host))

    with pytest.raises(ValueError, match="bad node"):
        run_all(NODES, make)
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_kills_all_children(tmp_path):
    def make(n):
        # `exec sleep` is the direct child; the `&` sleep is a grandchild in the same group.
        return sh('sleep 30 & echo $! > "$1.bg"; echo $$ > "$1"; exec sleep 30', str(tmp_path / n.host))

    def interrupt():
        deadline = time.monotonic() + 5
        while len(list(tmp_path.glob("*.bg"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_all(NODES, make, timeout=60)
    assert time.monotonic() - start < 5
    pids = [int(p.read_text()) for p in tmp_path.iterdir()]
    assert len(pids) == 6
    assert all(wait_dead(pid) for pid in pids)


def test_raise_on_failure_lists_every_host():
    results = [
        NodeResult("a", 0, "", "", 1, 0.1),
        NodeResult("b", 1, "", "x\n", 1, 0.1, "exit 1: x"),
        NodeResult("c", None, "", "", 1, 60.0, "timed out after 60s"),
    ]
    with pytest.raises(LaunchError) as e:
        raise_on_failure(results, "preflight")
    assert str(e.value) == "preflight failed on 2 of 3 hosts:\n  b: exit 1: x\n  c: timed out after 60s"


def test_hosts_that_failed_the_same_way_share_one_line():
    """A misspelt image fails on every node with the same engine message: one line naming them all
    (review of issue 25: 2 lines per node, twice), each distinct error on its own line, in order."""
    err = "exit 1: image r/x:1 is not on this node and could not be pulled: manifest unknown"
    results = [NodeResult(h, 1, "", "", 1, 0.1, err) for h in ("a", "b", "c")]
    results.insert(1, NodeResult("d", None, "", "", 1, 60.0, "timed out after 60s"))
    with pytest.raises(LaunchError) as e:
        raise_on_failure(results, "starting containers")
    assert str(e.value) == f"starting containers failed on 4 of 4 hosts:\n  a, b, c: {err}\n  d: timed out after 60s"


# --- a real sshd on 127.0.0.1 ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    d = tmp_path_factory.mktemp("sshd")
    for key in ("host_key", "id"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    (d / "authorized_keys").write_text((d / "id.pub").read_text())
    port = free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nPidFile {d}/sshd.pid\n"
        f"AuthorizedKeysFile {d}/authorized_keys\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\n"
    )
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    log = open(d / "sshd.log", "w")
    proc = subprocess.Popen(
        ["/usr/sbin/sshd", "-D", "-e", "-p", str(port), "-f", str(d / "sshd_config"), "-h", str(d / "host_key")],
        stderr=log,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd did not start: {(d / 'sshd.log').read_text()}")
            time.sleep(0.05)
    # The client's config lives in tmp too: -F keeps ~/.ssh untouched and the test hermetic.
    (d / "ssh_config").write_text(
        "Host dtrain-test\n"
        f"  HostName 127.0.0.1\n  Port {port}\n  User {getpass.getuser()}\n  IdentityFile {d}/id\n"
        "Host *\n"
        f"  UserKnownHostsFile {d}/known_hosts\n  GlobalKnownHostsFile /dev/null\n  LogLevel ERROR\n"
    )
    yield {"dir": d, "port": port, "opts": ["-F", str(d / "ssh_config")]}
    proc.terminate()
    proc.wait(5)
    log.close()


def test_ssh_through_real_sshd(sshd):
    node = Node("127.0.0.1", 4, port=sshd["port"], user=getpass.getuser(), identity=str(sshd["dir"] / "id"))
    lines = []
    results = run_all(
        [node],
        lambda n: ssh_argv(n, ["printf", "%s|", "a b", "$HOME", "it's"], extra_opts=sshd["opts"]),
        on_line=lambda n, line: lines.append(line),
    )
    [r] = results
    assert (r.returncode, r.stdout, r.attempts, r.error) == (0, "a b|$HOME|it's|", 1, None)
    assert lines == ["a b|$HOME|it's|"]
    # accept-new recorded the host key in the tmp known_hosts file.
    assert f"[127.0.0.1]:{sshd['port']} " in (sshd["dir"] / "known_hosts").read_text()


def test_ssh_config_supplies_port_user_identity(sshd):
    # A bare Node: HostName, Port, User, IdentityFile all come from the ssh config.
    make = lambda n: ssh_argv(n, ["sh", "-c", "echo remote; exit 4"], extra_opts=sshd["opts"])  # noqa: E731
    [r] = run_all([Node("dtrain-test", 1)], make)
    assert (r.returncode, r.stdout, r.attempts, r.error) == (4, "remote\n", 1, "exit 4: remote")


def test_ssh_closed_port_retries_then_fails(sshd):
    node = Node("127.0.0.1", 1, port=free_port(), identity=str(sshd["dir"] / "id"))
    results = run_all([node], lambda n: ssh_argv(n, ["true"], extra_opts=sshd["opts"]), retries=2, backoff=0.05)
    [r] = results
    assert (r.returncode, r.attempts) == (255, 3)
    assert r.error == (
        f"ssh could not connect (3 attempts): ssh: connect to host 127.0.0.1 port {node.port}: Connection refused"
    )
    with pytest.raises(LaunchError, match=r"^ssh check failed on 1 of 1 hosts:\n  127\.0\.0\.1: ssh could not connect"):
        raise_on_failure(results, "ssh check")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_broken_on_line_does_not_block_the_child():
    def on_line(node, line):
        raise RuntimeError("callback bug")

    # 200k lines overflow any pipe buffer: the output must keep being drained.
    [r] = run_all([Node("n1", 1)], lambda n: sh("seq 200000"), on_line=on_line, timeout=20)
    assert (r.returncode, r.error, len(r.stdout.splitlines())) == (0, None, 200000)


def test_a_held_stdin_is_a_dialogue_each_node_answers_then_reads_more():
    """hold_stdin: the text given first, then what send() adds once the node answered; a
    command that printed something and then failed to connect is not run again."""
    from dtrain.launch.remote.fanout import Fanout

    heard: dict[str, list[str]] = {n.host: [] for n in NODES}
    news = threading.Event()

    def on_line(n, line):
        heard[n.host].append(line)
        if all(heard.values()):
            news.set()

    fan = Fanout(NODES, lambda n: sh('read a; echo "got $a"; read b; echo "then $b"'),
                 stdin=lambda n: f"one {n.host}\n", hold_stdin=True, on_line=on_line, timeout=10)
    assert news.wait(5) and not fan.done()  # each answered, and waits for more
    for n in NODES:
        fan.send(n.host, f"two {n.host}\n")
    results = fan.results()
    assert [r.stdout for r in results] == [f"got one {n.host}\nthen two {n.host}\n" for n in NODES]
    # ssh's "Connection reset" after the command printed: it ran, so it is not run again
    fan = Fanout([NODES[0]], lambda n: sh('echo ran; echo "Connection reset by peer" >&2; exit 255'),
                 stdin=lambda n: "", hold_stdin=True, retries=2, backoff=0.01)
    fan.send(NODES[0].host, "", close=True)
    assert fan.results()[0].attempts == 1


def test_a_proxy_that_exits_is_a_connection_error_in_either_of_sshs_wordings():
    """ProxyCommand=/bin/false: depending on which side notices first, ssh says one or the other."""
    from dtrain.launch.remote.fanout import is_connection_error, is_unreachable
    for said in ("kex_exchange_identification: Connection closed by remote host",
                 "banner exchange: Connection to UNKNOWN port 65535: Broken pipe"):
        assert is_connection_error(255, said) and not is_unreachable(255, said)
    assert not is_connection_error(1, "banner exchange: Broken pipe")  # the job's own exit
    assert not is_connection_error(255, "Permission denied (publickey)")
