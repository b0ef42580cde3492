import re

import pytest

from dtrain.launch.remote import hosts
from dtrain.launch.errors import LaunchError
from dtrain.launch.remote.hosts import (
    Node,
    apply_ssh_defaults,
    hosts_list,
    parse_hostfile,
    parse_hosts_arg,
    ssh_argv,
)


def write(tmp_path, text):
    p = tmp_path / "hostfile"
    p.write_text(text)
    return p


# --- hostfile -----------------------------------------------------------------------------


def test_hostfile_full(tmp_path):
    p = write(
        tmp_path,
        "# training nodes\n"
        "\n"
        "10.0.0.1 slots=4\n"
        "  10.0.0.2   slots=4 port=2200 user=ubuntu identity=/keys/id_ed25519  # second\n"
        "gpu-3.internal\n",
    )
    assert parse_hostfile(p) == [
        Node("10.0.0.1", 4),
        Node("10.0.0.2", 4, port=2200, user="ubuntu", identity="/keys/id_ed25519"),
        Node("gpu-3.internal", 1),  # no slots: 1, as in mpirun hostfiles
    ]


@pytest.mark.parametrize(
    "line, message",
    [
        ("h1 slots=four", "slots must be an integer between 1 and 4096, got 'four'"),
        ("h1 slots=0", "slots must be an integer between 1 and 4096, got '0'"),
        ("h1 slots=-2", "slots must be an integer between 1 and 4096, got '-2'"),
        ("h1 slots=", "empty value for slots"),
        ("h1 slots=2 slots=3", "slots given twice"),
        ("h1 max_slots=4", "unknown key 'max_slots' in 'max_slots=4' (expected one of slots, port, user, identity, jump)"),
        ("h1 4", "unknown token '4' (expected KEY=VALUE, KEY one of slots, port, user, identity, jump)"),
        ("h1 port=70000", "port must be an integer between 1 and 65535, got '70000'"),
        ("h1 user=-oProxyCommand=x", "bad user '-oProxyCommand=x'"),
        ("ubuntu@h1 slots=1", "bad host 'ubuntu@h1' (put the user in user=NAME)"),
        ("h1:4", "bad host 'h1:4' (write slots=N, not HOST:N; IPv6 literals are not supported, use a name)"),
        ("-oProxyCommand=x", "bad host '-oProxyCommand=x'"),
        ("h1 jump=-oProxyCommand=x", "bad jump host '-oProxyCommand=x' (expected [USER@]HOST[:PORT])"),
        ("h1 jump=a@b@c", "bad jump host 'a@b@c' (expected [USER@]HOST[:PORT])"),
        ("h1 jump=bastion:0", "bad jump host 'bastion:0' (expected [USER@]HOST[:PORT])"),
        ("h1 jump=b1,b2", "bad jump host 'b1,b2' (expected [USER@]HOST[:PORT])"),
        ("h1 jump=", "empty value for jump"),
    ],
)
def test_hostfile_errors_name_file_and_line(tmp_path, line, message):
    p = write(tmp_path, f"# header\nok-host slots=1\n{line}\n")
    with pytest.raises(LaunchError) as e:
        parse_hostfile(p)
    assert str(e.value) == f"{p}:3: {message}"


def test_hostfile_jump_host(tmp_path):
    """jump=: the node is reached through that ssh jump host (nodes without a public address)."""
    p = write(tmp_path, "10.0.1.5 slots=8 user=ubuntu jump=ubuntu@203.0.113.9\n"
                        "10.0.1.6 slots=8 jump=bastion.example:2222\n10.0.1.7 jump=bastion\n")
    assert parse_hostfile(p) == [Node("10.0.1.5", 8, user="ubuntu", jump="ubuntu@203.0.113.9"),
                                 Node("10.0.1.6", 8, jump="bastion.example:2222"), Node("10.0.1.7", 1, jump="bastion")]
    with pytest.raises(ValueError, match="bad jump host"):
        Node("h1", jump="-J")


def test_hostfile_duplicate_names_both_lines(tmp_path):
    p = write(tmp_path, "h1 slots=2\nh2 slots=2\n\nh1 slots=4\n")
    with pytest.raises(LaunchError) as e:
        parse_hostfile(p)
    assert str(e.value) == f"{p}:4: duplicate host 'h1', already on line 1"


def test_hostfile_empty_and_missing(tmp_path):
    p = write(tmp_path, "# nothing\n\n")
    with pytest.raises(LaunchError, match=re.escape(f"{p}: no hosts in hostfile")):
        parse_hostfile(p)
    missing = tmp_path / "nope"
    with pytest.raises(LaunchError, match=re.escape(f"{missing}: cannot read hostfile: No such file or directory")):
        parse_hostfile(missing)


# --- --hosts -------------------------------------------------------------------------------


def test_hosts_arg():
    assert parse_hosts_arg("h1:4, h2:8,h3") == [Node("h1", 4), Node("h2", 8), Node("h3", 1)]
    assert hosts_list(parse_hosts_arg("h1:4,h2:8")) == "h1:4,h2:8"


@pytest.mark.parametrize(
    "value, message",
    [
        ("", "--hosts: no hosts given"),
        ("h1:4,", "--hosts entry 2: empty (stray comma?) in 'h1:4,'"),
        ("h1:0", "--hosts entry 1 ('h1:0'): slots must be an integer between 1 and 4096, got '0'"),
        ("h1:x", "--hosts entry 1 ('h1:x'): slots must be an integer between 1 and 4096, got 'x'"),
        ("h1:4,h2:4:1", "--hosts entry 2 ('h2:4:1'): expected HOST or HOST:SLOTS"),
        ("u@h1:4", "--hosts entry 1 ('u@h1:4'): bad host 'u@h1' (put the user in user=NAME)"),
        ("h1:4,h2:4,h1:2", "--hosts: duplicate host 'h1' (entries 1 and 3)"),
    ],
)
def test_hosts_arg_errors(value, message):
    with pytest.raises(LaunchError) as e:
        parse_hosts_arg(value)
    assert str(e.value) == message


def test_node_rejects_bad_values():
    with pytest.raises(ValueError):
        Node("h1", 0)
    with pytest.raises(ValueError):
        Node("h1", 1, port=0)
    with pytest.raises(ValueError):
        Node("-x", 1)


# --- ssh -----------------------------------------------------------------------------------


def test_apply_ssh_defaults_per_node_values_win():
    nodes = [Node("h1", 1), Node("h2", 1, user="admin", identity="/k2", port=2200)]
    assert apply_ssh_defaults(nodes, user="ubuntu", identity="/k") == [
        Node("h1", 1, user="ubuntu", identity="/k"),
        Node("h2", 1, user="admin", identity="/k2", port=2200),
    ]


def test_ssh_argv_full():
    node = Node("10.0.0.2", 4, port=2200, user="ubuntu", identity="/keys/id")
    assert ssh_argv(node, ["echo", "a b", "$HOME"], extra_opts=["-o", "LogLevel=ERROR"], connect_timeout=5) == [
        "ssh", "-p", "2200", "-i", "/keys/id", "-o", "IdentitiesOnly=yes",
        "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "StrictHostKeyChecking=accept-new",
        "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
        "-o", "LogLevel=ERROR",
        "ubuntu@10.0.0.2", "--", "echo 'a b' '$HOME'",
    ]  # fmt: skip


def test_ssh_argv_jump_host():
    """The node's jump= becomes -J, ahead of the caller's options (the first value wins in
    ssh); `ssh -G` (which connects nowhere) reads it as the ProxyJump of that connection."""
    import subprocess

    node = Node("10.0.1.5", 8, user="ubuntu", jump="ubuntu@bastion.example:2222")
    argv = ssh_argv(node, ["true"], extra_opts=["-o", "ProxyJump=other"])
    assert argv[:3] == ["ssh", "-J", "ubuntu@bastion.example:2222"] and argv[-3:] == ["ubuntu@10.0.1.5", "--", "true"]
    assert "-J" not in ssh_argv(Node("10.0.1.5", 8), ["true"])
    out = subprocess.run(["ssh", "-G", *argv[1:-2]], capture_output=True, text=True, timeout=10,
                         env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}).stdout
    assert "proxyjump ubuntu@bastion.example:2222" in out.splitlines(), out


def test_ssh_argv_leaves_unset_options_to_ssh_config():
    # No -p, -i, user@ or -F: Port/User/IdentityFile/ProxyJump from ~/.ssh/config still apply.
    argv = ssh_argv(Node("gpu-1", 1), ["true"])
    assert argv == [
        "ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "StrictHostKeyChecking=accept-new",
        "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
        "gpu-1", "--", "true",
    ]  # fmt: skip
    assert "-F" not in argv
    with pytest.raises(ValueError):
        ssh_argv(Node("gpu-1", 1), [])


# --- key exchange ---------------------------------------------------------------------------


def test_fast_kex_first_keeps_every_default_algorithm():
    from dtrain.launch.remote.hosts import fast_kex_order

    default = ["sntrup761x25519-sha512@openssh.com", "curve25519-sha256", "curve25519-sha256@libssh.org",
               "ecdh-sha2-nistp256", "diffie-hellman-group14-sha256"]
    assert fast_kex_order(default) == ["curve25519-sha256", "curve25519-sha256@libssh.org",
                                       "sntrup761x25519-sha512@openssh.com", "ecdh-sha2-nistp256",
                                       "diffie-hellman-group14-sha256"]
    ten = ["mlkem768x25519-sha256", "sntrup761x25519-sha512", "curve25519-sha256"]  # OpenSSH 10
    assert fast_kex_order(ten) == ["mlkem768x25519-sha256", "curve25519-sha256", "sntrup761x25519-sha512"]
    assert fast_kex_order(["ecdh-sha2-nistp256"]) == ["ecdh-sha2-nistp256"]  # nothing to promote


def test_kex_option_only_where_ssh_config_leaves_kex_alone(tmp_path):
    """With this machine's ssh: the fast exchanges go first; a config that sets KexAlgorithms
    (for that host, or on the command line) is left alone."""
    import subprocess

    from dtrain.launch.remote.hosts import fast_kex_order, kex_opts

    g = subprocess.run(["ssh", "-G", "-F", "none", "10.0.0.1"], capture_output=True, text=True).stdout
    default = next(line.split()[1] for line in g.splitlines() if line.startswith("kexalgorithms ")).split(",")
    plain = tmp_path / "plain"
    plain.write_text("Host *\n  User root\n")
    opts = kex_opts(Node("10.0.0.1"), ["-F", str(plain)])
    if fast_kex_order(default) == default:  # OpenSSH 10: already fast first, nothing to say
        assert opts == []
    else:
        assert opts == ["-o", "KexAlgorithms=" + ",".join(fast_kex_order(default))]
        assert sorted(fast_kex_order(default)) == sorted(default)
    set_here = tmp_path / "set"
    set_here.write_text("Host 10.0.0.*\n  KexAlgorithms ecdh-sha2-nistp256\n")
    assert kex_opts(Node("10.0.0.1"), ["-F", str(set_here)]) == []
    assert kex_opts(Node("10.0.0.2"), ["-F", str(plain), "-o", "KexAlgorithms=curve25519-sha256"]) == []


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/urandom", "/"])
def test_a_device_or_directory_as_hostfile_or_env_file_is_refused_before_reading(path):
    """/dev/zero would be read until memory runs out: refused as not a regular file."""
    from dtrain.launch.jobs.container import parse_env_file

    kind = "a directory" if path == "/" else "a character device"
    with pytest.raises(LaunchError, match=rf"^{path}: {kind}, not a regular file; expected a hostfile"):
        parse_hostfile(path)
    with pytest.raises(LaunchError, match=rf"^{path}: {kind}, not a regular file; expected an env file"):
        parse_env_file(path)


@pytest.mark.parametrize("line, needle", [
    ("127.0.0.1 slots=" + "9" * 5000, "slots must be an integer between 1 and 4096"),
    ("127.0.0.1 port=" + "9" * 5000, "port must be an integer between 1 and 65535"),
    ("a" * 254, "a host name is at most 253 characters"),
    ("a" * 64 + ".example.com", "each dot-separated part at most 63"),
    ("9" * 5000, "at most 253"),
])
def test_hostfile_numbers_and_names_are_bounded(tmp_path, line, needle):
    """A 5,000-digit slots= or port= (Python's int-string limit) and a host name longer than
    DNS allows: one line naming the file and line, the value shown cut short."""
    hf = tmp_path / "hf"
    hf.write_text(line + "\n")
    with pytest.raises(LaunchError, match=re.escape(needle)) as e:
        parse_hostfile(hf)
    assert str(e.value).startswith(f"{hf}:1: ") and len(str(e.value)) < 300
    assert parse_hostfile_text_ok(tmp_path, ("a" * 63 + ".") * 3 + "a" * 61)  # 253: the longest name


def parse_hostfile_text_ok(tmp_path, host):
    hf = tmp_path / "ok"
    hf.write_text(host + " slots=2\n")
    return parse_hostfile(hf)[0].host == host


def test_a_huge_hostfile_is_refused_before_reading(tmp_path):
    big = tmp_path / "hosts"
    with big.open("wb") as f:
        f.truncate((1 << 20) + 1)
    with pytest.raises(LaunchError, match=r"more than a hostfile has \(at most 1048576\)"):
        parse_hostfile(big)


def test_slots_are_capped(tmp_path):
    from dtrain.launch.remote.hosts import parse_hostfile, parse_hosts_arg

    f = tmp_path / "hosts"
    f.write_text("10.0.0.1 slots=8\n10.0.0.2 slots=99999999999\n")
    with pytest.raises(LaunchError, match=rf"^{f}:2: slots must be an integer between 1 and 4096, got '99999999999'"):
        parse_hostfile(f)
    with pytest.raises(LaunchError, match="slots must be an integer between 1 and 4096"):
        parse_hosts_arg("h1:5000")


@pytest.mark.cluster
def test_a_hostfile_jump_host_is_the_way_to_the_node_on_real_sshd(cluster, tmp_path):
    """`jump=` on real nodes: node-3 reached through node-1 (ssh -J) sees node-1's address as
    its client (SSH_CLIENT); without the key it sees this machine's bridge address."""
    import subprocess

    first, third = cluster.nodes[0], cluster.nodes[2]
    (tmp_path / "via").write_text(f"{third.address} port=22 user=root jump=root@{first.address}:22\n")
    (tmp_path / "direct").write_text(f"{third.address} port=22 user=root\n")
    [via], [direct] = hosts.parse_hostfile(tmp_path / "via"), hosts.parse_hostfile(tmp_path / "direct")

    def client(node) -> str:
        argv = hosts.ssh_argv(node, ["sh", "-c", 'echo "${SSH_CLIENT%% *}"'], extra_opts=("-F", cluster.ssh_config))
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    assert client(via) == first.address
    assert client(direct) != first.address and client(direct).startswith("10.213.")
