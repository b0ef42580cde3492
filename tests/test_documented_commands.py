"""Every `invoke ...` command line shown in README.md and docs/*.md code blocks is accepted by
the real CLI (issue 11 item 6): parsed out of the Markdown, so new docs are checked too.

Each line is parsed by Invoke's own parser against tasks.py (every flag and positional must
be known). Those that can run without AWS, Docker or the simulated cluster are also run as a
real `python3 -m invoke` process: they may fail fast on a placeholder (a missing file, an
image reference like REF), but with one line and exit code <= 2, never "No idea what" or a
traceback.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from invoke import Collection
from invoke.parser import ParseError, Parser

from dtrain.cli import reach_argv
from test_nodes import moto_server  # noqa: F401 - a moto server on loopback and the env to reach it

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Placeholders in the docs' examples.
ENV = {"REPO": "123456789012.dkr.ecr.us-east-1.amazonaws.com", "ECR": "123456789012.dkr.ecr.us-east-1.amazonaws.com",
       "PW": "x"}
# Tasks that run here with no AWS, Docker or cluster (their placeholders fail fast).
RUNNABLE = {"render", "manifest", "diagnose", "status", "logs", "stop", "doctor", "report"}
NEEDS_AWS = ("--ecr", "--ec2-tag")


def documented_commands() -> list[tuple[str, str]]:
    """(where, command line) for every `invoke` command in a fenced code block, with
    continuation lines joined, comments, redirections, env prefixes and `a && b` split off."""
    found = []
    for doc in DOCS:
        in_block, buf, start = False, "", 0
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            if line.strip().startswith("```"):
                in_block, buf = not in_block, ""
                continue
            if not in_block:
                continue
            text = line.strip()
            buf, start = (f"{buf} {text}", start) if buf else (text, n)
            if buf.endswith("\\"):
                buf = buf[:-1]
                continue
            for part in re.split(r"&&|;", buf):
                part = re.sub(r"\s#.*$", "", part).strip()
                if "|" in part and "invoke" in part.split("|", 1)[1] and "--" not in part.split("|", 1)[0]:
                    part = part.split("|", 1)[1].strip()  # `echo x | invoke ...`
                part = re.sub(r"^(\w+=\S*\s+)+", "", part)  # VAR=... invoke
                if part.startswith("dtrain "):  # the same program (dtrain/cli.py)
                    part = "invoke " + part[len("dtrain "):]
                if part.startswith("invoke "):
                    found.append((f"{doc.relative_to(ROOT)}:{start}", part))
            buf = ""
    return found


def test_dtrain_lines_are_checked_too():
    assert any(line.startswith("invoke launch --hostfile hosts") for _, line in documented_commands())


def argv_of(line: str) -> tuple[list[str], list[str]]:
    """Invoke's argv and the command after `--`, synopsis brackets and alternatives resolved."""
    line = re.sub(r">\s*\S+$", "", line)  # `> file`
    for k, v in ENV.items():
        line = line.replace(f"${k}", v)
    argv = [t.split("|")[0] if not t.startswith("|") else t
            for t in shlex.split(line.replace("[", "").replace("]", ""))]
    argv = reach_argv(["dtrain", *argv[1:]])[1:]  # drop `invoke`; `nodes ssh NAME` as dtrain/cli.py reads it
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


COMMANDS = documented_commands()
IDS = [w for w, _ in COMMANDS]


def test_the_docs_have_commands():
    tasks_seen = {argv_of(line)[0][0] for _, line in COMMANDS}
    assert {"demo", "test", "build", "push", "launch", "diagnose", "manifest", "cluster"} <= tasks_seen


@pytest.fixture(scope="module")
def parser() -> Parser:
    sys.path.insert(0, str(ROOT))
    import tasks

    return Parser(contexts=Collection.from_module(tasks).to_contexts())


@pytest.mark.parametrize("where,line", COMMANDS, ids=IDS)
def test_documented_command_parses(parser, where, line):
    argv, _ = argv_of(line)
    try:
        result = parser.parse_argv(argv)
    except ParseError as e:
        pytest.fail(f"{where}: `{line}`: {e}")
    assert result and result[0].name == argv[0], f"{where}: `{line}`"


@pytest.mark.parametrize("where,line", [c for c in COMMANDS if argv_of(c[1])[0][0] in RUNNABLE
                                        and not any(f in c[1] for f in NEEDS_AWS)],
                         ids=[w for w, line in COMMANDS if argv_of(line)[0][0] in RUNNABLE
                              and not any(f in line for f in NEEDS_AWS)])
def test_documented_command_runs(tmp_path, where, line):
    argv, command = argv_of(line)
    if argv[0] == "render" and "--check" not in argv:
        argv.append("--check")  # the same parsing; does not write into the checkout
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DTRAIN_HOME": str(tmp_path / "home")}
    r = subprocess.run([sys.executable, "-m", "invoke", *argv, *(["--", *command] if command else [])],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert "No idea what" not in out and "Traceback" not in out, f"{where}: `{line}`\n{out}"
    assert r.returncode in (0, 1, 2), f"{where}: `{line}` exited {r.returncode}\n{out}"
    assert "Can't find any collection" not in out
    if r.returncode == 2:
        assert len(r.stderr.strip().splitlines()) == 1, f"{where}: `{line}`\n{out}"


# --- README's real-nodes example, run as written from a laptop (moto) -----------------------


def readme_real_nodes() -> list[list[str]]:
    """The `dtrain` lines of README's "A job on real nodes" block, as argv (comments dropped)."""
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- run against moto by tests/test_documented_commands.py::test_readme_real_nodes_example",
                       1)[1]
    block = block.split("```sh\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    return [shlex.split(re.sub(r"\s#.*$", "", line))[1:] for line in block.splitlines() if line.startswith("dtrain ")]


@pytest.fixture
def checkip():
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"127.0.0.7\n")

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/"
    srv.shutdown()


def test_readme_real_nodes_example(moto_server, checkip, tmp_path):
    """README's real-nodes lines from a laptop (no metadata service; checkip on loopback),
    against moto: the instances `nodes up` makes are the ones `--ec2-tag` names, at their public
    addresses. What only the test needs is added: moto's AMI, a short timeout, the stack kept
    for the next lines, and ssh stopped before it leaves this machine (moto invents the
    addresses). build and push need Docker and are left to the cluster tests."""
    import boto3

    _url, env = moto_server
    env = {**env, "DTRAIN_CHECKIP_URL": checkip, "DTRAIN_HOME": str(tmp_path / "home")}
    key = tmp_path / "mykey.pem"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    s = boto3.Session(region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
    e = s.client("ec2", endpoint_url=env["AWS_ENDPOINT_URL"])
    e.import_key_pair(KeyName="mykey", PublicKeyMaterial=(tmp_path / "mykey.pem.pub").read_bytes())
    stop_ssh = ["--ssh-opt", "ProxyCommand=/bin/false"]
    lines = readme_real_nodes()
    assert [a[0] for a in lines] == ["build", "push", "nodes", "doctor", "launch", "nodes"], lines
    public: list[str] = []
    for argv in lines:
        argv = [str(key) if a == "~/.ssh/mykey.pem" else a for a in argv]
        if argv[0] in ("build", "push"):
            continue
        # --yes: the README's 2 x g5.12xlarge is above the default --confirm-above and this run has no terminal to ask
        extra = {"nodes up": ["--ami", "ami-dca37ea5", "--timeout", "3", "--keep-on-failure", "--yes", *stop_ssh],
                 "doctor": stop_ssh}.get(" ".join(argv[:2]) if argv[0] == "nodes" else argv[0], [])
        if argv[0] == "launch":
            i = argv.index("--")
            argv = [*argv[:i], *stop_ssh, *argv[i:]]
        r = subprocess.run([sys.executable, "-m", "dtrain", *argv, *extra], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300, env={**env, "PYTHONPATH": str(ROOT)})
        out = r.stdout + r.stderr
        assert "Traceback" not in out, out
        if argv[:2] == ["nodes", "up"]:
            assert r.returncode == 2 and "no node answered ssh + docker within 3s" in r.stderr, out
            found = e.describe_instances(Filters=[{"Name": "tag:dtrain:cluster", "Values": ["train"]},
                                                  {"Name": "instance-state-name", "Values": ["running"]}])
            public = [i["PublicIpAddress"] for res in found["Reservations"] for i in res["Instances"]]
            assert len(public) == 2 and all(public), found
            assert r.stderr.split("within 3s: ")[1].split(":")[0] in public, out  # ssh went to a public one
        elif argv[0] == "doctor":
            assert r.returncode == 1 and "no running EC2 instances" not in out, out
            assert all(ip in r.stdout for ip in public), out
        elif argv[0] == "launch":
            assert r.returncode == 2 and r.stderr.startswith("error: "), out
            assert "no running EC2 instances" not in out and any(ip in r.stderr for ip in public), out
        else:
            assert r.returncode == 0 and r.stdout.startswith("deleted stack dtrain-train; kept its data: fs-"), out
