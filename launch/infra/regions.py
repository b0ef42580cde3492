"""The regions dtrain has made clusters in, and `--region R` in every command it prints.

A stack lives in one region; a command printed without its region runs against the default
one and misses it. `nodes up` remembers each region it creates a stack in (DTRAIN_HOME/regions,
one per line) and each cluster.json carries its region, so `nodes list` can look everywhere
dtrain has been, and `nodes down --name NAME` finds the region by itself.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

_REGION_RE = re.compile(r"[a-z]{2}(-[a-z]+)+-\d{1,2}")


def home() -> Path:
    return Path(os.environ.get("DTRAIN_HOME", "~/.dtrain")).expanduser()


def regions_file() -> Path:
    return home() / "regions"


def recorded_regions() -> dict[str, str]:
    """cluster name -> region, from every cluster.json here (a record without a region, or
    unreadable, is left out)."""
    found = {}
    for rec in sorted((home() / "clusters").glob("*/cluster.json")):
        try:
            region = json.loads(rec.read_text()).get("region")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(region, str) and _REGION_RE.fullmatch(region):
            found[rec.parent.name] = region
    return found


def remember(region: str) -> None:
    """Add region to the regions dtrain has used (before a stack is created there)."""
    if not _REGION_RE.fullmatch(region or ""):
        return
    path = regions_file()
    known = used()
    if region in known:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text("".join(f"{r}\n" for r in sorted({*_listed(), region})))
    tmp.replace(path)


def _listed() -> set[str]:
    try:
        lines = regions_file().read_text().split()
    except OSError:
        return set()
    return {r for r in lines if _REGION_RE.fullmatch(r)}


def used(default: str | None = None) -> list[str]:
    """Every region dtrain has used here (remembered, or in a cluster record), the default first."""
    rest = sorted((_listed() | set(recorded_regions().values())) - {default})
    return ([default] if default else []) + rest


def default_region() -> str | None:
    """The region a command without --region (and without --profile) runs in: AWS_REGION,
    AWS_DEFAULT_REGION or the default profile's region, as boto3 reads them; None if none."""
    try:
        import boto3

        return boto3.session.Session().region_name
    except Exception:  # noqa: BLE001 - a broken config: no default to leave the flag out for
        return None


def region_arg(region: str | None, default: str | None = "auto") -> str:
    """' --region R' for a printed command where R is not the default region, else '' (default
    'auto': found with default_region)."""
    if not region:
        return ""
    if default == "auto":
        default = default_region()
    return "" if region == default else f" --region {region}"
