"""launch/node/docker-api.pl: a node's `docker image inspect` asked of the engine's socket, the
same line as the CLI's template (launch/node/host/image.sh inspect_image) or exit 3 for the CLI."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import uuid
from pathlib import Path

import pytest

from dtrain import contract, engine as eng
from dtrain.launch.jobs import container, node_programs

PROGRAM = contract.NODE_SCRIPTS / "docker-api.pl"
LABELS = (contract.LABEL_MIN_DRIVER, contract.LABEL_OPENMPI_MAJOR)
ID = "sha256:" + "ab" * 32
FMT = (f'{{{{.Id}}}} {{{{with .Config.Labels}}}}{{{{or (index . "{LABELS[0]}") "-"}}}} '
       f'{{{{or (index . "{LABELS[1]}") "-"}}}}{{{{else}}}}- -{{{{end}}}} {{{{json .RepoDigests}}}}')


def api(ref: str, *, env: dict | None = None) -> subprocess.CompletedProcess:
    return call("image", ref, *LABELS, env=env)


def call(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")} | (env or {})
    return subprocess.run(["perl", str(PROGRAM), *argv], capture_output=True, text=True, env=e, timeout=30)


class Engine:
    """A unix socket answering each request with the next canned HTTP response (the last one
    again once they run out); keeps the requests, bodies included."""

    def __init__(self, path: Path, *responses: bytes):
        self.path, self.responses, self.requests = path, list(responses), []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Its thread ended before its socket is closed: a thread still in accept() on a closed
        descriptor would take the next test's server's connections once the number is reused."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes accept()
        except OSError:
            pass
        self.thread.join(10)
        self.sock.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                self._answer(conn)
            except Exception as e:  # noqa: BLE001  # said in the test's failure, not lost with the thread
                self.requests.append(("error", repr(e)))
                conn.close()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(body) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                body += chunk
            self.requests.append((head.decode().split("\r\n")[0], body.decode()))
            conn.sendall(self.responses[min(len(self.requests), len(self.responses)) - 1])


def http(status: str, body: object | str) -> bytes:
    text = body if isinstance(body, str) else json.dumps(body)
    return f"HTTP/1.0 {status}\r\nContent-Type: application/json\r\n\r\n{text}".encode()


@pytest.fixture
def fake(tmp_path):
    made: list[Engine] = []

    def start(*responses: bytes) -> dict:
        made.append(Engine(tmp_path / f"e{len(made)}.sock", *responses))
        return {"DOCKER_HOST": f"unix://{made[-1].path}", "HOME": str(tmp_path)}

    start.engines = made
    yield start
    for e in made:
        e.close()


def test_the_line_has_the_id_both_labels_and_the_repo_digests(fake):
    digests = ["r:5000/a/b@sha256:" + "1" * 64, "q/a@sha256:" + "2" * 64]
    env = fake(http("200 OK", {"Id": ID, "RepoTags": ["a:1"], "RepoDigests": digests,
                               "Config": {"Env": ["A=x&y<z>", "B=\"q\"\\n"], "Labels": {
                                   LABELS[0]: "570.124.06", LABELS[1]: "4", "other": "a & b \u00e9"}},
                               "ContainerConfig": {"Labels": {LABELS[0]: "1"}}, "Size": 12.5e3, "Os": None}))
    r = api("r:5000/a/b:1", env=env)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == f"{ID} 570.124.06 4 {json.dumps(digests, separators=(',', ':'))}\n"


@pytest.mark.parametrize("config, want", [
    ({"Labels": None}, "- -"),
    ({}, "- -"),
    (None, "- -"),
    ({"Labels": {LABELS[1]: ""}}, "- -"),  # the CLI's `or`: an empty value is `-`
    ({"Labels": {LABELS[1]: "5"}}, "- 5"),
])
def test_labels_unset_or_empty_are_dashes_and_no_digests_are_an_empty_list(fake, config, want):
    r = api("a:1", env=fake(http("200 OK", {"Id": ID, "RepoDigests": [], "Config": config})))
    assert (r.returncode, r.stdout) == (0, f"{ID} {want} []\n")


def test_a_missing_image_prints_nothing(fake):
    env = fake(http("404 Not Found", {"message": "No such image: a/b:1"}))
    r = api("a/b:1", env=env)
    assert (r.returncode, r.stdout) == (0, "")


@pytest.mark.parametrize("response", [
    http("500 Internal Server Error", {"message": "boom"}),
    http("200 OK", "{\"Id\": \"sha256:12\"}"),  # not an image ID
    http("200 OK", "{\"Id\": \"" + ID + "\", "),  # cut short
    http("200 OK", "not json"),
    b"garbage",
    b"",
    http("200 OK", {"Id": ID, "Config": {"Labels": {LABELS[0]: "5 6"}}}),  # a space would split the line
    http("200 OK", {"Id": ID, "Config": {"Labels": {LABELS[0]: "a\u00e9"}}}),  # an escape kept: the CLI says it
    http("200 OK", {"Id": ID, "RepoDigests": ["a\"b"]}),
])
def test_anything_else_the_engine_says_leaves_it_to_the_cli(fake, response):
    r = api("a:1", env=fake(response))
    assert (r.returncode, r.stdout) == (3, "")


@pytest.mark.parametrize("env", [
    {"DOCKER_DEFAULT_PLATFORM": "linux/arm64"}, {"DOCKER_API_VERSION": "1.41"}, {"DOCKER_CONTENT_TRUST": "1"},
    {"DOCKER_HOST": "tcp://127.0.0.1:2375"},
    {"DOCKER_HOST": "ssh://u@h"},
    {"DOCKER_CONTEXT": "remote"},
    {"DOCKER_HOST": "unix:///nonexistent/dtrain.sock"},
])
def test_another_engine_or_none_leaves_it_to_the_cli(env):
    r = api("a:1", env=env)
    assert (r.returncode, r.stdout) == (3, "")


def test_a_context_or_proxies_in_the_cli_config_leave_it_to_the_cli(fake, tmp_path):
    env = fake(http("200 OK", {"Id": ID}))
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "config.json").write_text(json.dumps({"currentContext": "remote"}))
    assert api("a:1", env=env | {"DOCKER_CONFIG": str(conf)}).returncode == 3
    # the CLI puts the proxies in every container it makes
    (conf / "config.json").write_text(json.dumps({"proxies": {"default": {"httpProxy": "http://127.0.0.1:3128"}}}))
    assert call(*run_parts(), env=env | {"DOCKER_CONFIG": str(conf)}).returncode == 3
    (conf / "config.json").write_text(json.dumps({"currentContext": "default", "auths": {}}))
    assert api("a:1", env=env | {"DOCKER_CONFIG": str(conf)}).returncode == 0


@pytest.mark.parametrize("ref", ["a/../../info", "a b", "a?x", "-a", "", "a\nb", "a#b"])
def test_a_reference_outside_its_characters_is_not_sent(fake, ref):
    env = fake(http("200 OK", {"Id": ID}))
    assert api(ref, env=env).returncode == 3


@pytest.mark.docker
def test_it_answers_as_the_cli_on_this_machines_engine(engine, cpu_images, tmp_path):
    """The CLI's template and this program, on images with labels, without any, with an empty one
    and one whose JSON the engine escapes; by name, short and long ID; a missing one."""
    tag = f"dtrain/t-api-{uuid.uuid4().hex[:8]}:1"
    df = (f"FROM {eng.BASE_IMAGE}\nLABEL {LABELS[0]}=\"\" {LABELS[1]}=\"4\" "
          "other=\"a & <b>\" note=\"caf\u00e9\"\n")
    subprocess.run(["docker", "build", "-q", "-t", tag, "-"], input=df, text=True, check=True, capture_output=True)
    try:
        full = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", tag], capture_output=True, text=True,
                              check=True).stdout.strip()
        refs = [eng.BASE_IMAGE, cpu_images["pytorch-ddp"].ref, tag, full, full.removeprefix("sha256:")[:12],
                "dtrain/t-api-missing:1"]
        for ref in refs:
            cli = subprocess.run(["docker", "image", "inspect", "-f", FMT, ref], capture_output=True, text=True)
            r = api(ref)
            assert r.returncode == 0, (ref, r.stderr)
            assert r.stdout == (cli.stdout if cli.returncode == 0 else ""), ref
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


CID = "c0" * 32
RUN_OK = (http("201 Created", {"Id": CID, "Warnings": []}), "HTTP/1.0 204 No Content\r\n\r\n".encode())


def run_parts(**kw) -> list[str]:
    """docker run's argv after `docker`, as a launch gives it (memlock as node_flags puts it)."""
    spec = container.ContainerSpec(**({"job": "t", "image": "r:5000/a/b:1", "name": "dtrain-t",
                                       "key_dir": "/dev/shm/dtrain-t"} | kw))
    head, rest = container.docker_run_parts(spec)
    return [*head[1:], "--ulimit", "memlock=-1", *rest]


def test_run_sends_the_containers_fields_as_the_cli_would_and_starts_it(fake):
    env = fake(*RUN_OK)
    odd = "x y \"q\" \\ \u00e9 \t\n$(id) `id` ;"
    argv = run_parts(command=("sleep", odd), shm_size="2g", cap_add=("SYS_PTRACE",), env={"A": odd, "B": ""},
                     mounts=(container.Mount("/data/in", "/in", True), container.Mount("/w", "/w")))
    r = call(*argv, env=env)
    assert (r.returncode, r.stdout, r.stderr) == (0, CID + "\n", "")
    (create, body), (start, _) = fake.engines[-1].requests
    assert create == "POST /containers/create?name=dtrain-t HTTP/1.0" and start == f"POST /containers/{CID}/start HTTP/1.0"
    made = json.loads(body)
    assert made["Image"] == "r:5000/a/b:1" and made["Cmd"] == ["sleep", odd]
    assert made["Env"] == [f"A={odd}", "B="] and made["Labels"] == {contract.LABEL_JOB: "t"}
    host = made["HostConfig"]
    assert host["NetworkMode"] == "host" and made["NetworkingConfig"] == {"EndpointsConfig": {"host": {}}}
    assert host["ShmSize"] == 2 << 30 and "IpcMode" not in host and host["CapAdd"] == ["CAP_SYS_PTRACE"]
    assert host["Tmpfs"] == {contract.MPI_TMPDIR: ""} and host["Ulimits"] == [{"Name": "memlock", "Soft": -1, "Hard": -1}]
    assert host["Mounts"] == [{"Type": "bind", "Source": "/data/in", "Target": "/in", "ReadOnly": True},
                              {"Type": "bind", "Source": "/w", "Target": "/w", "ReadOnly": False},
                              {"Type": "bind", "Source": "/dev/shm/dtrain-t", "Target": contract.JOB_KEY_MOUNT,
                               "ReadOnly": True}]


def test_run_without_a_command_sends_none_and_the_image_decides(fake):
    assert call(*run_parts(shm_size=None), env=fake(*RUN_OK)).returncode == 0
    made = json.loads(fake.engines[-1].requests[0][1])
    assert "Cmd" not in made and made["HostConfig"]["IpcMode"] == "host" and "ShmSize" not in made["HostConfig"]


@pytest.mark.parametrize("extra", [
    ["--gpus", "all"], ["--device", "/dev/infiniband/uverbs0"], ["-v", "/a:/b"], ["--network", "bridge"],
    ["-e", "NAME"], ["--mount", 'type=bind,"src=/a,b",dst=/c'], ["--mount", "type=volume,src=v,dst=/c"],
    ["--tmpfs", "/t:size=1m"], ["--shm-size", "1.5g"], ["--ulimit", "memlock=unlimited"], ["--privileged"],
])
def test_run_leaves_flags_it_does_not_read_to_the_cli_and_sends_nothing(fake, extra):
    env = fake(*RUN_OK)
    argv = run_parts()
    r = call(*argv[:4], *extra, *argv[4:], env=env)  # after `run -d --name NAME`
    assert (r.returncode, r.stdout) == (3, "") and fake.engines[-1].requests == []
    assert call(*argv[:4], "--label", "x=y", *argv[4:], env=env).returncode == 0  # one it reads: sent


def test_run_leaves_a_refused_create_to_the_cli_and_says_a_failed_start_as_the_cli(fake):
    env = fake(http("409 Conflict", {"message": "Conflict. The container name \"/dtrain-t\" is already in use"}))
    r = call(*run_parts(), env=env)
    assert (r.returncode, r.stdout) == (3, "") and len(fake.engines[-1].requests) == 1
    for message, code in (("OCI runtime create failed: \"x\" not found.", 125),
                          ("exec: \"/x\": stat /x: no such file or directory: unknown", 127),
                          ("exec: \"/x\": permission denied", 126)):
        r = call(*run_parts(), env=fake(RUN_OK[0], http("500 Internal Server Error", {"message": message})))
        assert (r.returncode, r.stdout) == (code, "")
        assert r.stderr == f"docker: Error response from daemon: {message.removesuffix('.')}.\n"


@pytest.mark.parametrize("start", [b"", b"garbage", None])
def test_once_the_container_is_made_a_failure_is_said_here_never_left_to_the_cli(fake, start):
    """After the engine's 201 the CLI would make a second container: a start that gets no answer,
    or a create answer without an ID, is exit 125 and a line naming the container."""
    env = fake(RUN_OK[0], start) if start is not None else fake(http("201 Created", {"Warnings": []}))
    r = call(*run_parts(), env=env)
    assert r.returncode == 125 and r.stderr.startswith("docker: error starting container ")


def test_rm_removes_by_force_and_a_missing_container_is_no_error(fake):
    env = fake("HTTP/1.0 204 No Content\r\n\r\n".encode())
    assert call("rm", "-f", "dtrain-t", env=env).returncode == 0
    assert fake.engines[-1].requests[0][0] == "DELETE /containers/dtrain-t?force=1 HTTP/1.0"
    r = call("rm", "-f", "dtrain-t", env=fake(http("404 Not Found", {"message": "No such container: dtrain-t"})))
    assert (r.returncode, r.stderr) == (0, "")  # the CLI's `rm -f` since Docker 23
    assert call("rm", "-f", "dtrain-t", env=fake(http("500 Internal Server Error", {"message": "x"}))).returncode == 3
    assert call("rm", "-f", "a/../b", env=env).returncode == 3
    assert call("rm", "dtrain-t", env=env).returncode == 3


def _same(a, b) -> list[str]:
    """Where two inspects differ, an empty list and none counted alike."""
    empty = (None, [], {}, "")
    if isinstance(a, dict) or isinstance(b, dict):
        a, b = a or {}, b or {}
        return [f"{k}: {d}" for k in sorted(set(a) | set(b)) for d in _same(a.get(k), b.get(k))]
    return [] if a == b or (a in empty and b in empty) else [f"{a!r} != {b!r}"]


@pytest.mark.docker
def test_run_makes_the_container_the_cli_makes_on_this_machines_engine(engine, tmp_path):
    """The same argv through the CLI and through this program: the two containers' configs agree;
    a start that fails is said as the CLI says it; rm -f removes."""
    (tmp_path / "kd").mkdir()
    tag = uuid.uuid4().hex[:6]
    names = [f"dtrain-t-api-cli-{tag}", f"dtrain-t-api-pl-{tag}"]
    spec = dict(image=eng.BASE_IMAGE, key_dir=str(tmp_path / "kd"), command=("sleep", "60"), shm_size="64m",
                cap_add=("SYS_PTRACE",), env={"A": "x \"y\" \u00e9"},
                mounts=(container.Mount(str(tmp_path), "/job"), container.Mount("/etc", "/mnt/etc", True)))
    try:
        for name, pre in zip(names, (["docker"], ["perl", str(PROGRAM)])):
            argv = run_parts(name=name, **spec)
            argv[argv.index("memlock=-1")] = f"memlock={8 << 20}:{8 << 20}"  # what this machine's dockerd may set
            r = subprocess.run([*pre, *argv], capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
        a, b = (json.loads(subprocess.run(["docker", "inspect", n], capture_output=True, text=True).stdout)[0]
                for n in names)
        assert b["State"]["Running"]
        assert _same(a["Config"], b["Config"]) == [] and _same(a["HostConfig"], b["HostConfig"]) == []
        assert call("rm", "-f", names[1]).returncode == 0
        assert subprocess.run(["docker", "inspect", names[1]], capture_output=True).returncode == 1
        bad = run_parts(name=names[1], image=eng.BASE_IMAGE, key_dir=str(tmp_path / "kd"), command=("/no-such-program",))
        bad[bad.index("memlock=-1")] = f"memlock={8 << 20}:{8 << 20}"
        r = call(*bad)
        names.append(f"dtrain-t-api-bad-{tag}")  # the CLI's own try at it, under a name of its own
        cli = subprocess.run(["docker", *[names[2] if a == names[1] else a for a in bad]], capture_output=True, text=True)
        assert r.returncode == cli.returncode == 127 and "no-such-program" in r.stderr
        assert r.stderr.splitlines()[0] == cli.stderr.splitlines()[0].rstrip(".") + "."
    finally:
        subprocess.run(["docker", "rm", "-f", *names], capture_output=True)


def test_caps_go_as_the_cli_sends_them_sorted_once_and_all_alone(fake):
    assert call(*run_parts(cap_add=("SYS_PTRACE", "NET_ADMIN", "CAP_SYS_PTRACE")), env=fake(*RUN_OK)).returncode == 0
    assert json.loads(fake.engines[-1].requests[0][1])["HostConfig"]["CapAdd"] == ["CAP_NET_ADMIN", "CAP_SYS_PTRACE"]
    assert call(*run_parts(cap_add=("SYS_PTRACE", "ALL")), env=fake(*RUN_OK)).returncode == 0
    assert json.loads(fake.engines[-1].requests[0][1])["HostConfig"]["CapAdd"] == ["ALL"]


def host_engine(call_: str, *args: str, env: dict) -> subprocess.CompletedProcess:
    """The host library's `engine` (launch/node/host/holds.sh) with its docker CLI a stand-in
    that says it was asked."""
    shim = 'docker_brief() { echo "cli $*"; return 7; }\n'
    e = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")} | env
    return subprocess.run(["bash", "-c", node_programs.host_library() + "\n" + shim + call_, "t", *args],
                          capture_output=True, text=True, env=e, timeout=30)


@pytest.mark.parametrize("code, cli", [(0, False), (1, False), (125, False), (126, False), (3, True), (255, True)])
def test_engine_leaves_to_the_cli_what_the_program_leaves_it(code, cli):
    r = host_engine(f'docker_api_pl="exit {code};"; engine rm -f x', env={})
    assert (r.returncode, r.stdout) == ((7, "cli rm -f x\n") if cli else (code, ""))


def test_engine_without_perl_asks_the_cli_and_a_gpu_nodes_run_goes_to_it_at_once(fake, tmp_path):
    r = host_engine('PATH=/nonexistent; engine rm -f x', env={})
    assert (r.returncode, r.stdout) == (7, "cli rm -f x\n")
    env = fake(*RUN_OK)
    r = host_engine('engine "$@"', *run_parts()[:4], "--gpus", "all", *run_parts()[4:], env=env)
    assert r.stdout.startswith("cli run -d ") and fake.engines[-1].requests == []


def test_engine_sends_the_bytes_it_was_given_whatever_the_users_perl_settings(fake):
    env = fake(*RUN_OK) | {"PERL_UNICODE": "SA", "PERL5OPT": "-CSA"}
    r = host_engine('engine "$@"', *run_parts(env={"A": "caf\u00e9"}), env=env)
    assert (r.returncode, r.stdout) == (0, CID + "\n"), r.stderr
    assert "A=caf\u00e9" in json.loads(fake.engines[-1].requests[0][1])["Env"]
