"""tests/imds.py as the program docs/launch.md tells a user to run to see a spot notice acted
on: a node's address gets no notice before --after, then the notice (IMDSv2: token first)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _notice(url: str) -> int:
    put = urllib.request.Request(f"{url}/latest/api/token", method="PUT",
                                 headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
    token = urllib.request.urlopen(put, timeout=5).read().decode()
    get = urllib.request.Request(f"{url}/latest/meta-data/spot/instance-action",
                                 headers={"X-aws-ec2-metadata-token": token})
    try:
        body = urllib.request.urlopen(get, timeout=5).read()
    except urllib.error.HTTPError as e:
        return e.code
    assert json.loads(body)["action"] == "terminate"
    return 200


def test_the_stand_in_gives_the_named_node_a_notice_after_the_delay():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([sys.executable, str(ROOT / "tests" / "imds.py"), "--listen", f"127.0.0.1:{port}",
                          "--notice", "127.0.0.1", "--after", "2"], stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        assert line.strip() == f"AWS_EC2_METADATA_SERVICE_ENDPOINT=http://127.0.0.1:{port}", line
        assert _notice(f"http://127.0.0.1:{port}") == 404
        assert p.stdout.readline().strip() == "spot notice for 127.0.0.1"
        assert _notice(f"http://127.0.0.1:{port}") == 200
    finally:
        p.kill()
        p.wait()
