"""What EC2 says of its instance types, for the families dtrain runs on: GPUs (count, model,
memory), Neuron devices, vCPUs, memory, EFA (interfaces, network cards), architecture, spot.

The data is EC2's own: DescribeInstanceTypes' answer, kept in `instance_types.json` beside
this file (a dated snapshot, in the exact shape of the API's response, trimmed to the fields
dtrain reads) for offline use (doctor, manifests) and tests; `dtrain instance-types --refresh`
writes it again from DescribeInstanceTypes with the caller's credentials (`refresh`). `nodes
up` and `--ec2-tag` still ask the API itself first. A type that is not in the data is said
(`missing`), never taken for a type without GPUs.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

SNAPSHOT = Path(__file__).with_name("instance_types.json")
# The families the snapshot holds: the GPU and Trainium/Inferentia types dtrain trains on, and
# a few CPU families (the simulated examples, the doctor's CPU runs).
FAMILIES: tuple[str, ...] = (
    "p3", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en", "p6-b200", "p6-b300",
    "g4dn", "g5", "g5g", "g6", "g6e",
    "trn1", "trn1n", "trn2", "inf2",
    "c5", "c6i", "m5", "m6i", "r5",
)
# What of each DescribeInstanceTypes entry the snapshot keeps (InstanceTypeInfo's members;
# nested: the members kept of that structure, None: all of it).
KEPT: dict[str, Any] = {
    "InstanceType": None, "CurrentGeneration": None, "SupportedUsageClasses": None, "BareMetal": None,
    "Hypervisor": None, "ProcessorInfo": {"SupportedArchitectures": None},
    "VCpuInfo": {"DefaultVCpus": None}, "MemoryInfo": {"SizeInMiB": None},
    "GpuInfo": None, "NeuronInfo": None,
    "NetworkInfo": {"NetworkPerformance": None, "MaximumNetworkInterfaces": None, "MaximumNetworkCards": None,
                    "NetworkCards": None, "EfaSupported": None, "EfaInfo": None},
}
REFRESH = "dtrain instance-types --refresh"

# EBS Multi-Attach works only on Nitro instances, and at most 16 of them per volume.
MULTI_ATTACH_MAX = 16


@dataclass(frozen=True)
class Snapshot:
    taken: str  # YYYY-MM-DD
    source: str
    region: str
    types: dict[str, dict[str, Any]]


def load(path: Path = SNAPSHOT) -> Snapshot:
    doc = json.loads(path.read_text())
    meta = doc["snapshot"]
    entries = doc["DescribeInstanceTypes"]["InstanceTypes"]
    return Snapshot(meta["date"], meta["source"], meta["region"], {e["InstanceType"]: e for e in entries})


@functools.lru_cache(maxsize=1)
def snapshot() -> Snapshot:
    return load()


def info(instance_type: str) -> dict[str, Any] | None:
    """The type's DescribeInstanceTypes entry in the snapshot (an ml. prefix is dropped), or None."""
    return snapshot().types.get(instance_type.removeprefix("ml."))


def missing(instance_type: str) -> str:
    """The one line for a type the data lacks."""
    snap = snapshot()
    return (f"{instance_type} is not in dtrain's instance-type data (DescribeInstanceTypes of {snap.taken}, "
            f"families {', '.join(FAMILIES)}); `{REFRESH}` adds it from EC2")


def gpus_of(entry: dict[str, Any]) -> int:
    """GPUs of one DescribeInstanceTypes entry (0: none)."""
    return sum(int(g.get("Count", 0)) for g in (entry.get("GpuInfo") or {}).get("Gpus", []))


def gpu_count(instance_type: str) -> int | None:
    """GPUs per instance (0: a type without GPUs; None: not in the data)."""
    entry = info(instance_type)
    return None if entry is None else gpus_of(entry)


def efa_of(entry: dict[str, Any]) -> int:
    """EFA interfaces one DescribeInstanceTypes entry takes (0: no EFA)."""
    net = entry.get("NetworkInfo") or {}
    if not net.get("EfaSupported"):
        return 0
    return int((net.get("EfaInfo") or {}).get("MaximumEfaInterfaces") or 1)


def efa_count(instance_type: str) -> int | None:
    """EFA interfaces the type takes, one per network card that has one (0: no EFA; None: not
    in the data)."""
    entry = info(instance_type)
    return None if entry is None else efa_of(entry)


def link_gbps(instance_type: str) -> float | None:
    """The type's network bandwidth in Gbit/s from NetworkInfo.NetworkPerformance ("3200
    Gigabit", "4x 100 Gigabit": 400, "Up to 25 Gigabit": 25, its peak), or None (not in the
    data, or said in words only: "High")."""
    import re

    perf = ((info(instance_type) or {}).get("NetworkInfo") or {}).get("NetworkPerformance", "")
    m = re.fullmatch(r"(?:Up to )?(?:(\d+)x )?([\d.]+) Gigabit", perf)
    return None if not m else float(m.group(2)) * int(m.group(1) or 1)


def gpu_model(instance_type: str) -> str | None:
    """'NVIDIA H200 x8, 141 GiB each' style: the type's accelerators in words, or None."""
    entry = info(instance_type) or {}
    gpus = (entry.get("GpuInfo") or {}).get("Gpus") or []
    neuron = (entry.get("NeuronInfo") or {}).get("NeuronDevices") or []
    parts = [f"{g.get('Manufacturer', '')} {g.get('Name', '?')} x{g.get('Count', 0)}, "
             f"{round(g.get('MemoryInfo', {}).get('SizeInMiB', 0) / 1024)} GiB each".strip() for g in gpus]
    parts += [f"AWS {d.get('Name', '?')} x{d.get('Count', 0)}, "
              f"{round(d.get('MemoryInfo', {}).get('SizeInMiB', 0) / 1024)} GiB each" for d in neuron]
    return "; ".join(parts) or None


def architecture(instance_type: str) -> str | None:
    """x86_64 or arm64 (the first the type supports), or None when not in the data."""
    entry = info(instance_type)
    archs = ((entry or {}).get("ProcessorInfo") or {}).get("SupportedArchitectures") or []
    return archs[0] if archs else None


def spot_supported(instance_type: str) -> bool | None:
    entry = info(instance_type)
    return None if entry is None else "spot" in entry.get("SupportedUsageClasses", [])


def summary(entry: dict[str, Any]) -> str:
    """One line of a type: vCPUs, memory, accelerators, EFA, network, architecture, spot."""
    net = entry.get("NetworkInfo") or {}
    efa = efa_of(entry)
    archs = "/".join((entry.get("ProcessorInfo") or {}).get("SupportedArchitectures", []))
    acc = gpu_model(entry["InstanceType"]) if entry["InstanceType"] in snapshot().types else None
    return (f"{entry['InstanceType']}: {entry.get('VCpuInfo', {}).get('DefaultVCpus', '?')} vCPUs, "
            f"{round(entry.get('MemoryInfo', {}).get('SizeInMiB', 0) / 1024)} GiB, "
            f"{acc or 'no GPU'}, "
            f"{f'{efa} EFA' if efa else 'no EFA'} ({net.get('MaximumNetworkCards', 1)} network card(s), "
            f"{net.get('NetworkPerformance', '?')}), {archs}"
            f"{', spot' if 'spot' in entry.get('SupportedUsageClasses', []) else ', no spot'}")


# --- DescribeInstanceTypes' entries as such ---------------------------------------------------


def efa_supported(entry: dict[str, Any]) -> bool:
    """One DescribeInstanceTypes entry: does it take an EFA interface? Where the entry does not
    say (an endpoint or mock without NetworkInfo.EfaSupported), the snapshot's entry does."""
    flag = (entry.get("NetworkInfo") or {}).get("EfaSupported")
    if flag is not None:
        return bool(flag)
    return bool(efa_count(entry["InstanceType"]))


def efa_cards(entry: dict[str, Any]) -> list[tuple[int, bool]]:
    """One DescribeInstanceTypes entry -> (NetworkCardIndex, takes "efa-only") of each network
    card that carries an EFA, card 0 first; at most EfaInfo.MaximumEfaInterfaces; [] without EFA.
    Without NetworkCards in the entry: the snapshot's count, "efa-only" not assumed."""
    if not efa_supported(entry):
        return []
    net = entry.get("NetworkInfo") or {}
    most = (net.get("EfaInfo") or {}).get("MaximumEfaInterfaces") or efa_count(entry["InstanceType"]) or 1
    cards = net.get("NetworkCards")
    if not cards:
        return [(i, False) for i in range(most)]
    found = sorted((int(c["NetworkCardIndex"]), "efa-only" in c.get("InterfaceTypes", ()))
                   for c in cards if "efa" in c.get("InterfaceTypes", ("efa",)))
    return found[:most] or [(0, False)]


def is_nitro(entry: dict[str, Any]) -> bool:
    """Nitro (or bare metal, which is Nitro too): EBS Multi-Attach possible."""
    return entry.get("Hypervisor") == "nitro" or bool(entry.get("BareMetal"))


# --- the snapshot from EC2 (`dtrain instance-types --refresh`) --------------------------------


def _trim(value: Any, kept: dict[str, Any] | None) -> Any:
    if kept is None or not isinstance(value, dict):
        return value
    return {k: _trim(value[k], sub) for k, sub in kept.items() if k in value}


def family(instance_type: str) -> str:
    return instance_type.split(".", 1)[0]


def refresh(ec2: Any, families: tuple[str, ...] = FAMILIES, *, today: str | None = None,
            source: str = "") -> dict[str, Any]:
    """The snapshot document from DescribeInstanceTypes (ec2: a boto3 EC2 client), every type
    of the families, trimmed to KEPT, by type name."""
    pages = ec2.get_paginator("describe_instance_types").paginate()
    entries = [_trim(e, KEPT) for p in pages for e in p["InstanceTypes"] if family(e["InstanceType"]) in families]
    entries.sort(key=lambda e: (family(e["InstanceType"]), gpus_of(e), e.get("VCpuInfo", {}).get("DefaultVCpus", 0),
                                e["InstanceType"]))
    region = ec2.meta.region_name
    return {"snapshot": {"date": today or date.today().isoformat(), "region": region,
                         "source": source or f"EC2 DescribeInstanceTypes in {region} ({REFRESH})",
                         "families": list(families)},
            "DescribeInstanceTypes": {"InstanceTypes": entries}}


def write(doc: dict[str, Any], path: Path = SNAPSHOT) -> Path:
    path.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    snapshot.cache_clear()
    return path
