#!/usr/bin/env python3
"""Idle nodes go away (`dtrain nodes up --idle-down MINUTES`, issue 49): on every node, a loop
that looks every --poll seconds for a running dtrain job container (label dtrain.job, what every
`dtrain launch` container carries) and, when none has run for --idle seconds, deletes the
cluster's own CloudFormation stack (DeleteStack, signed with Signature Version 4 from the node
role's credentials): the whole cluster goes, its data (volumes, EFS) stays as `nodes down` keeps
it. The role may delete that one stack and nothing else (launch/infra/ec2.py idle_down_policy).

first-boot.sh installs it as the systemd service dtrain-idle-down (its settings in
/etc/dtrain/idle-down.env: DTRAIN_STACK, DTRAIN_REGION, DTRAIN_IDLE_DOWN_S). Standard library
only (the host's python3). Flags for tests: --endpoint (a stand-in AWS), --imds (a stand-in
instance metadata service), --poll.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import hmac
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

JOB_LABEL = "dtrain.job"  # dtrain/contract.py LABEL_JOB (tests/test_idle_down.py checks they agree)
API_VERSION = "2010-05-15"


def say(line: str) -> None:
    print(f"dtrain idle-down: {line}", flush=True)


def job_running(docker: str = "docker") -> bool | None:
    """Whether a dtrain job container runs here; None when the engine cannot be asked."""
    try:
        out = subprocess.run([docker, "ps", "-q", "--filter", f"label={JOB_LABEL}"], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return bool(out.stdout.strip())


def imds_get(base: str, path: str, timeout: float = 2.0) -> str:
    req = urllib.request.Request(f"{base}/latest/api/token", method="PUT",
                                 headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        token = r.read().decode()
    req = urllib.request.Request(f"{base}/latest/meta-data/{path}", headers={"X-aws-ec2-metadata-token": token})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode()


def credentials(imds: str) -> tuple[str, str, str | None]:
    """(access key, secret key, session token): the environment's, else the node role's (IMDSv2)."""
    if os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"):
        return (os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"],
                os.environ.get("AWS_SESSION_TOKEN") or None)
    role = imds_get(imds, "iam/security-credentials/").split()[0]
    c = json.loads(imds_get(imds, f"iam/security-credentials/{role}"))
    return c["AccessKeyId"], c["SecretAccessKey"], c.get("Token")


def endpoint_of(region: str) -> str:
    """CloudFormation's regional endpoint (the China regions' domain differs)."""
    return f"https://cloudformation.{region}.amazonaws.com{'.cn' if region.startswith('cn-') else ''}/"


def signed_headers(url: str, body: bytes, region: str, creds: tuple[str, str, str | None],
                   now: dt.datetime, service: str = "cloudformation") -> dict[str, str]:
    """The headers of a Signature Version 4 POST of body to url (pure)."""
    access, secret, token = creds
    parts = urllib.parse.urlsplit(url)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    headers = {"content-type": "application/x-www-form-urlencoded; charset=utf-8", "host": parts.netloc,
               "x-amz-date": amz_date}
    if token:
        headers["x-amz-security-token"] = token
    names = ";".join(sorted(headers))
    canonical = "\n".join(["POST", parts.path or "/", parts.query, "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)),
                           names, hashlib.sha256(body).hexdigest()])
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = f"AWS4{secret}".encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (f"AWS4-HMAC-SHA256 Credential={access}/{scope}, SignedHeaders={names}, "
                                f"Signature={signature}")
    return headers


def delete_stack(stack: str, region: str, endpoint: str, imds: str) -> str | None:
    """DeleteStack of stack; None when AWS accepted it, else the error in one line."""
    body = urllib.parse.urlencode({"Action": "DeleteStack", "StackName": stack, "Version": API_VERSION}).encode()
    try:
        creds = credentials(imds)
    except (OSError, ValueError, KeyError, IndexError) as e:
        return f"no credentials (the node's role, from the instance metadata service): {e}"
    headers = signed_headers(endpoint, body, region, creds, dt.datetime.now(dt.timezone.utc))
    req = urllib.request.Request(endpoint, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()
        return None
    except urllib.error.HTTPError as e:
        text = e.read().decode(errors="replace")
        code = re.search(r"<Code>([^<]*)</Code>", text)
        message = re.search(r"<Message>([^<]*)</Message>", text)
        return f"HTTP {e.code}: {code.group(1) if code else ''}: {' '.join((message.group(1) if message else '').split())}"
    except OSError as e:
        return f"{endpoint}: {e}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="delete this cluster's stack once no dtrain job has run for a while")
    ap.add_argument("--stack", default=os.environ.get("DTRAIN_STACK"), help="the cluster's stack (DTRAIN_STACK)")
    ap.add_argument("--region", default=os.environ.get("DTRAIN_REGION"), help="its region (DTRAIN_REGION)")
    ap.add_argument("--idle", type=float, default=float(os.environ.get("DTRAIN_IDLE_DOWN_S") or 0),
                    help="seconds without a dtrain job before the stack is deleted (DTRAIN_IDLE_DOWN_S)")
    ap.add_argument("--poll", type=float, default=60.0, help="seconds between looks (default 60)")
    ap.add_argument("--endpoint", default=None, help="CloudFormation endpoint URL (tests: a stand-in)")
    ap.add_argument("--imds", default="http://169.254.169.254", help="instance metadata service (tests: a stand-in)")
    ap.add_argument("--docker", default="docker", help="the docker command")
    args = ap.parse_args(argv)
    if not args.stack or not re.fullmatch(r"[A-Za-z][A-Za-z0-9-]{0,127}", args.stack):
        say(f"--stack {args.stack!r}: not a stack name (DTRAIN_STACK)")
        return 2
    if not args.region or not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d+", args.region):
        say(f"--region {args.region!r}: not a region (DTRAIN_REGION)")
        return 2
    if args.idle <= 0 or args.poll <= 0:
        say("--idle and --poll: seconds above 0 (DTRAIN_IDLE_DOWN_S)")
        return 2
    endpoint = args.endpoint or endpoint_of(args.region)
    say(f"stack {args.stack} ({args.region}) is deleted after {args.idle:.0f} s without a dtrain job")
    last_job = time.monotonic()
    while True:
        running = job_running(args.docker)
        now = time.monotonic()
        if running is None:
            last_job = now  # an engine that cannot be asked may run a job: never taken for idle
            say("docker does not answer: counted as busy")
        elif running:
            last_job = now
        elif now - last_job >= args.idle:
            say(f"no dtrain job for {now - last_job:.0f} s: deleting stack {args.stack} ({args.region})")
            error = delete_stack(args.stack, args.region, endpoint, args.imds)
            if error is None:
                say(f"DeleteStack {args.stack} accepted: CloudFormation takes the cluster down")
                return 0
            say(f"DeleteStack {args.stack} failed ({error}); trying again in {args.poll:.0f} s")
        time.sleep(args.poll)


if __name__ == "__main__":
    sys.exit(main())
