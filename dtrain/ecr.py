"""Amazon ECR, as both sides use it: images/push.py (docker login here) and the launcher
(docker login on each node, launch/jobs/login.py)."""

from __future__ import annotations

import base64
import re

# 123456789012.dkr.ecr.us-east-1.amazonaws.com[.cn]/repo...: (account, region)
REGISTRY_RE = re.compile(r"^(\d{12})\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com(\.cn)?/")


def decode_token(token: str) -> tuple[str, str]:
    """An authorizationToken from GetAuthorizationToken -> (user, password). ValueError when it
    is not base64 of 'user:password'."""
    try:
        user, password = base64.b64decode(token, validate=True).decode().split(":", 1)
    except (ValueError, UnicodeDecodeError):
        raise ValueError("ECR returned an authorization token that is not base64 'user:password'") from None
    return user, password
