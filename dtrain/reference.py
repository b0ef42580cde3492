"""Docker image references: a pure validator of the engine's own grammar.

The grammar is distribution/reference's (regexp.go), the one `docker pull` applies:

    reference  := name [ ":" tag ] [ "@" digest ]
    name       := [ domain "/" ] path-component [ "/" path-component ]*
    domain     := host [ ":" port ]            host: DNS-style name or [IPv6]
    path-component := [a-z0-9]+ ( separator [a-z0-9]+ )*     separator: . _ __ -+
    tag        := [\\w][\\w.-]{0,127}
    digest     := algorithm ":" hex{32,}       (sha256: exactly 64 lowercase hex)

Anything outside it (spaces, `$`, backticks, quotes, `;`, a leading `-`, newlines) is
refused before a reference reaches an argv or a node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN_NAME = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*"
_IPV6 = r"\[[a-fA-F0-9:]+\]"
_DOMAIN = rf"(?:{_DOMAIN_NAME}|{_IPV6})(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"

_REFERENCE = re.compile(
    rf"(?P<name>(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*))"
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?", re.ASCII)
NAME_MAX = 255  # distribution/reference: NameTotalLengthMax


class BadReference(ValueError):
    """Not a Docker image reference; str() says why."""


@dataclass(frozen=True)
class Reference:
    domain: str  # "" when the name has no registry part (Docker Hub)
    path: str
    tag: str
    digest: str

    @property
    def repository(self) -> str:
        return f"{self.domain}/{self.path}" if self.domain else self.path


def _looks_like_domain(first: str) -> bool:
    """Docker's rule: the first component is a registry when it has '.' or ':', is
    'localhost', or has upper case (path components cannot)."""
    return "." in first or ":" in first or first == "localhost" or first != first.lower()


def parse(ref: str) -> Reference:
    """Split a reference into its parts, or raise BadReference."""
    m = _REFERENCE.fullmatch(ref)
    if not m:
        raise BadReference(_why(ref))
    if len(m.group("name")) > NAME_MAX:
        raise BadReference(f"repository name longer than {NAME_MAX} characters")
    domain, path = m.group("domain") or "", m.group("path")
    if domain and not _looks_like_domain(domain):
        domain, path = "", f"{domain}/{path}"  # 'dtrain/x' is a Docker Hub path, not a host
    digest = m.group("digest") or ""
    if digest.startswith("sha256:") and not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise BadReference("a sha256 digest is 64 lowercase hex digits")
    return Reference(domain, path, m.group("tag") or "", digest)


def _why(ref: str) -> str:
    if not ref:
        return "empty"
    if ref.startswith("-"):
        return "starts with '-'"
    bad = sorted({c for c in ref if not (c.isascii() and (c.isalnum() or c in "._-/:@[]"))})
    if bad:
        return "character(s) not allowed: " + " ".join(repr(c) for c in bad)
    return "does not match Docker's reference grammar (lower-case path components, tag of word characters)"


def check(ref: str, flag: str = "--image") -> Reference:
    """parse(), with the message naming the flag: for CLI input."""
    try:
        return parse(ref)
    except BadReference as e:
        raise BadReference(f"{flag} {ref!r}: not a valid image reference ({e}); expected "
                           "REGISTRY[:PORT]/NAME[:TAG][@sha256:DIGEST], "
                           "e.g. 10.213.0.1:5000/dtrain/pytorch-ddp:2.13.0-cpu-py311-debian12") from None


def registry_host_part(registry: str) -> str:
    """host[:port] -> host: '[::1]:5000' -> '::1', '127.0.0.1:5000' -> '127.0.0.1', '::1' -> '::1'
    (an IPv6 address without brackets has no port)."""
    if registry.startswith("["):
        end = registry.find("]")
        return registry[1:end] if end > 0 else registry
    return registry if registry.count(":") > 1 else registry.split(":", 1)[0]


def is_loopback_registry(registry: str) -> bool:
    """The one rule for "may plain http (and a credential over it) go to this registry without
    being told": host[:port] whose host is exactly `localhost` or an IP address on loopback
    (127.0.0.0/8, ::1). A DNS name is never loopback here, whatever it looks like
    (`127.example.test` can resolve anywhere), and no name is resolved."""
    import ipaddress

    host = registry_host_part(registry)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
