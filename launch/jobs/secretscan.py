"""Files that hold secrets by what they contain: a small set of well-known signatures.

`kind(path)` reads at most HEAD_BYTES of a regular file (never a FIFO or device: O_NONBLOCK,
O_NOFOLLOW, and the caller lstat-ed it) and names the first signature found, or None. Files
whose suffix says they are binary data (checkpoints, arrays, archives, media) are not opened;
a file whose first SNIFF_BYTES hold a NUL byte is binary and not scanned further. A dataset
directory of thousands of files is read about HEAD_BYTES a file (docs/launch.md has a figure).

The signatures (gitleaks' and detect-secrets' best-known ones, kept small): PEM private keys
(RSA, EC, DSA, OpenSSH, PKCS#8, encrypted, PGP), AWS access key ids and secret keys, GCP
service-account JSON, kubeconfigs with users, GitHub, GitLab, Hugging Face, Slack, OpenAI and
Anthropic, Google API, Stripe, npm and PyPI tokens; and in env-style files (ENV_STYLE:
`.env`-like names, shell, ini/cfg/conf/properties, txt, no suffix) an assignment of a value of
8 or more characters to a name ending TOKEN, SECRET, PASSWORD, API_KEY, ... (a `$VAR`, `<...>`
or `{...}` value is no secret). The AWS documentation's example keys (...EXAMPLE) are not.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

HEAD_BYTES = 64 * 1024  # read at most this much of each file
SNIFF_BYTES = 8192  # a NUL byte in here: binary, not scanned
BINARY_SUFFIXES = frozenset((
    ".pt", ".pth", ".bin", ".safetensors", ".ckpt", ".npy", ".npz", ".parquet", ".arrow", ".feather",
    ".h5", ".hdf5", ".onnx", ".tfrecord", ".tar", ".gz", ".tgz", ".zip", ".bz2", ".xz", ".zst", ".7z",
    ".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".tif", ".tiff", ".mp4", ".avi", ".mov", ".wav",
    ".flac", ".mp3", ".ogg", ".so", ".o", ".a", ".pyc", ".whl", ".pdf", ".lmdb", ".mdb", ".db", ".sqlite",
))
ENV_STYLE_SUFFIXES = frozenset((".env", ".envrc", ".sh", ".bash", ".zsh", ".ini", ".cfg", ".conf",
                                ".properties", ".txt", ""))

# name -> (literals, one of which the head holds before the regex is tried (`bytes.find` is
# fast; a regex over 64 KiB is not), matched in the lower-cased head when lower; the regex)
_SIGNATURES: dict[str, tuple[tuple[bytes, ...], bool, bytes]] = {
    "a private key": ((b"PRIVATE KEY",), False, rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"),
    "an AWS access key id": ((b"AKIA", b"ASIA"), False, rb"\b(?:AKIA|ASIA)(?![0-9A-Z]{9}EXAMPLE\b)[0-9A-Z]{16}\b"),
    "an AWS secret key": ((b"secret",), True, rb"(?i:aws_?secret_?access_?key)[\"']?\s*[:=]\s*[\"']?"
                                               rb"(?![A-Za-z0-9/+]*EXAMPLE)[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+])"),
    "a GCP service-account key": ((b"service_account",), False, rb"\"type\"\s*:\s*\"service_account\""),
    "a GitHub token": ((b"ghp_", b"gho_", b"ghu_", b"ghs_", b"ghr_", b"github_pat_"), False,
                       rb"\b(?:gh[pousr]_[A-Za-z0-9]{36}\b|github_pat_[A-Za-z0-9_]{22,})"),
    "a GitLab token": ((b"glpat-",), False, rb"\bglpat-[A-Za-z0-9_-]{20,}"),
    "a Hugging Face token": ((b"hf_",), False, rb"\bhf_[A-Za-z0-9]{30,}\b"),
    "a Slack token": ((b"xox", b"hooks.slack.com"), False,
                      rb"\bxox[abposr]-[A-Za-z0-9-]{10,}|hooks\.slack\.com/services/T[A-Za-z0-9_]+/B[A-Za-z0-9_]+/"),
    "an API key": ((b"sk-", b"AIza", b"k_live_", b"npm_", b"pypi-"), False,
                   rb"\bsk-(?:proj|ant)-[A-Za-z0-9_-]{20,}|\bAIza[0-9A-Za-z_-]{35}\b|\b[sr]k_live_[0-9A-Za-z]{20,}"
                   rb"|\bnpm_[A-Za-z0-9]{36}\b|\bpypi-AgEIcHlwaS5vcmc[A-Za-z0-9_-]{50,}"),
}
_COMPILED = [(name, marks, lower, re.compile(rx)) for name, (marks, lower, rx) in _SIGNATURES.items()]
_KUBECONFIG = (re.compile(rb"(?m)^kind:[ \t]*[\"']?Config[\"']?[ \t]*\r?$"), re.compile(rb"(?m)^users:"))
_ASSIGNMENT_MARKS = (b"token", b"secret", b"passw", b"api_key", b"apikey", b"access_key", b"private_key",
                     b"auth_key", b"credential")
_ASSIGNMENT = re.compile(
    rb"(?im)^[ \t]*(?:export[ \t]+)?[A-Za-z0-9_.-]*(?:TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|ACCESS_KEY|"
    rb"SECRET_KEY|PRIVATE_KEY|AUTH_KEY|CREDENTIALS?)[ \t]*=[ \t]*[\"']?(?![$<{])[^\s\"'#]{8,}")


def env_style(name: str) -> bool:
    """KEY=VALUE files: .env-like names, shell, ini-like, txt, no suffix."""
    low = name.lower()
    return low.startswith(".env") or Path(low).suffix in ENV_STYLE_SUFFIXES


def kind_of(data: bytes, name: str) -> str | None:
    """The first signature data (a file's head) holds, named; None. Pure."""
    low = data.lower()
    for what, marks, lower, rx in _COMPILED:
        hay = low if lower else data
        if any(m in hay for m in marks) and rx.search(data):
            return what
    if b"kind:" in data and all(rx.search(data) for rx in _KUBECONFIG):
        return "a kubeconfig"
    if env_style(name) and any(m in low for m in _ASSIGNMENT_MARKS) and _ASSIGNMENT.search(data):
        return "a secret assignment"
    return None


def kind(path: Path) -> str | None:
    """What secret path (a regular file) holds by its first HEAD_BYTES, or None (binary, skipped,
    unreadable: the caller's own read says so)."""
    if path.suffix.lower() in BINARY_SUFFIXES:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read(HEAD_BYTES)
    if b"\0" in data[:SNIFF_BYTES]:
        return None
    return kind_of(data, path.name)
