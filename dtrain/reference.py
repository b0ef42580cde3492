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
    """Docker's rule (splitDockerDomain): the first of several components is a registry when it
    has '.' or ':' or is 'localhost'. Docker also takes a first component with upper case for a
    host; here it is a path component, refused as not lower case ('UPPER/case' is a typo far
    more often than a registry host without a dot or port)."""
    return "." in first or ":" in first or first == "localhost"


def parse(ref: str) -> Reference:
    """Split a reference into its parts, or raise BadReference saying which part is wrong."""
    m = _REFERENCE.fullmatch(ref)
    if not m:
        raise BadReference(_why(ref))
    domain, path = m.group("domain") or "", m.group("path")
    if domain and not _looks_like_domain(domain):
        if domain != domain.lower():
            raise BadReference(_why(ref))
        domain, path = "", f"{domain}/{path}"  # 'dtrain/x' is a Docker Hub path, not a host
    if len(m.group("name")) > NAME_MAX:
        raise BadReference(f"repository name longer than {NAME_MAX} characters")
    if _HEX64.fullmatch(ref):
        raise BadReference("64 hexadecimal digits are an image id, not a name")
    digest = m.group("digest") or ""
    if digest.startswith("sha256:") and not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise BadReference("a sha256 digest is 64 lowercase hex digits")
    return Reference(domain, path, m.group("tag") or "", digest)


_HEX64 = re.compile(r"[a-f0-9]{64}")
_TAG_RE = re.compile(_TAG, re.ASCII)
_PATH_RE = re.compile(_PATH_COMPONENT, re.ASCII)
_DOMAIN_RE = re.compile(_DOMAIN, re.ASCII)
_DIGEST_RE = re.compile(_DIGEST, re.ASCII)


def _why(ref: str) -> str:
    """Which part of a reference the grammar refuses, in words (pure; for the message)."""
    if not ref:
        return "empty"
    if ref.startswith("-"):
        return "starts with '-'"
    bad = sorted({c for c in ref if not (c.isascii() and (c.isalnum() or c in "._-/:@[]"))})
    if bad:
        return "character(s) not allowed: " + " ".join(repr(c) for c in bad)
    rest, at, digest = ref.partition("@")
    if at:
        if "@" in digest:
            return "more than one '@'"
        if not _DIGEST_RE.fullmatch(digest):
            return f"digest {digest!r}: expected ALGORITHM:HEX, e.g. sha256: and 64 hex digits"
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    name, tag = (rest[:colon], rest[colon + 1:]) if colon > slash else (rest, None)
    if tag is not None:
        if not tag:
            return "':' with no tag after it"
        if len(tag) > 128:
            return f"tag of {len(tag)} characters (at most 128)"
        if not _TAG_RE.fullmatch(tag):
            return f"tag {tag!r}: starts with a letter, digit or '_', then letters, digits, '_', '.', '-'"
    parts = name.split("/")
    has_domain = len(parts) > 1 and _looks_like_domain(parts[0])
    if has_domain and not _DOMAIN_RE.fullmatch(parts[0]):
        return f"registry {parts[0]!r}: expected HOST[:PORT] (a port is digits)"
    for i, part in enumerate(parts[1:] if has_domain else parts):
        if not part:
            return "empty path component (two '/' together, or one at an end)"
        if part != part.lower():
            hint = "; a registry host has a '.' or ':PORT' or is localhost" if i == 0 and len(parts) > 1 \
                and not has_domain else ""
            return f"repository names are lowercase, not {part!r}{hint}"
        if not _PATH_RE.fullmatch(part):
            return (f"path component {part!r}: lowercase letters and digits, separated by one '.', "
                    "one or two '_', or '-'s")
    return "does not match Docker's reference grammar"


def check(ref: str, flag: str = "--image") -> Reference:
    """parse(), with the message naming the flag: for CLI input."""
    try:
        return parse(ref)
    except BadReference as e:
        generic = str(e).startswith(("empty", "starts with", "character", "does not match"))
        form = "; expected [REGISTRY[:PORT]/]NAME[:TAG][@sha256:DIGEST]" if generic else ""
        raise BadReference(f"{flag} {ref!r}: not a valid image reference: {e}{form}") from None


def check_repository(ref: str, flag: str) -> Reference:
    """check() for a repository alone, without tag or digest (--push-cache: tags are added)."""
    r = check(ref, flag)
    if r.tag or r.digest:
        raise BadReference(f"{flag} {ref!r}: a repository without tag or digest, e.g. "
                           f"{r.repository} (its tags are made from each image's)")
    return r


def check_registry(host: str, flag: str) -> str:
    """A registry HOST[:PORT] (the grammar's domain: a DNS name, an IPv4 or [IPv6] address)."""
    if not _DOMAIN_RE.fullmatch(host):
        raise BadReference(f"{flag} {host!r}: expected a registry HOST[:PORT], e.g. 10.213.0.1:5000")
    return host


def check_name_tag(text: str, flag: str, example: str) -> tuple[str, str]:
    """NAME or NAME:TAG, where NAME is one path component (a family, a project image's name)."""
    name, colon, tag = text.partition(":")
    if not _PATH_RE.fullmatch(name) or (colon and not _TAG_RE.fullmatch(tag)):
        why = _why(text) if text else "empty"
        raise BadReference(f"{flag} {text!r}: expected NAME or NAME:TAG ({why}), e.g. {example}")
    return name, tag


def check_tag(tag: str, flag: str, example: str = "2.13.0-cpu-py311-debian12") -> str:
    """A tag alone (the grammar's: a word character, then up to 127 of word, '.', '-')."""
    if not _TAG_RE.fullmatch(tag):
        raise BadReference(f"{flag} {tag!r}: expected a tag (letters, digits, '_', '.', '-', not starting "
                           f"with '.' or '-', at most 128), e.g. {example}")
    return tag


def check_path(path: str, flag: str, example: str = "dtrain") -> str:
    """Repository path components alone, without a registry (a repository prefix)."""
    if not path or not all(_PATH_RE.fullmatch(p) for p in path.split("/")):
        why = _why(path) if path else "empty"
        raise BadReference(f"{flag} {path!r}: expected lowercase path components separated by '/' ({why}), "
                           f"e.g. {example}")
    return path


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
