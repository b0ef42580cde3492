"""What the project knows about EC2 instance types without asking AWS: one table, shared by
`doctor` (offline checks on a node) and `nodes up` (fallback when DescribeInstanceTypes lacks
a field). DescribeInstanceTypes' NetworkInfo.EfaSupported and Hypervisor are preferred."""

from __future__ import annotations

from typing import Any

# Types with an Elastic Fabric Adapter (NetworkInfo.EfaSupported). Source:
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html ("Supported instance types").
EFA_TYPES: frozenset[str] = frozenset({
    "p3dn.24xlarge", "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge",
    "g4dn.8xlarge", "g4dn.12xlarge", "g4dn.16xlarge", "g4dn.metal",
    "g5.8xlarge", "g5.12xlarge", "g5.16xlarge", "g5.24xlarge", "g5.48xlarge",
    "g6.8xlarge", "g6.12xlarge", "g6.16xlarge", "g6.24xlarge", "g6.48xlarge",
    "trn1.32xlarge", "trn1n.32xlarge",
})

# EFA interfaces per instance where a type has more than one network card (one EFA per card;
# DescribeInstanceTypes NetworkInfo.EfaInfo.MaximumEfaInterfaces, the same figures as moto's
# instance data). Every other type in EFA_TYPES takes 1. Used offline (doctor) and when
# DescribeInstanceTypes lacks NetworkCards.
EFA_INTERFACES: dict[str, int] = {
    "p4d.24xlarge": 4, "p4de.24xlarge": 4, "p5.48xlarge": 32, "p5e.48xlarge": 32, "p5en.48xlarge": 16,
    "trn1.32xlarge": 8, "trn1n.32xlarge": 16,
}

# GPUs per instance: `--target nodes` falls back to it when DescribeInstanceTypes cannot answer (permission denied,
# or an endpoint/mock without GpuInfo; real AWS and moto 5 both return GpuInfo); the job
# descriptions (other_tools/manifests.py) take it as --instance-type's GPUs per worker.
# g4dn.* = T4, g5.* = A10G, p3.* = V100, p4d/p4de = A100, p5 = H100.
KNOWN_GPU_COUNTS: dict[str, int] = {
    **{f"g4dn.{s}": 1 for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge")},
    "g4dn.12xlarge": 4,
    "g4dn.metal": 8,
    **{f"g5.{s}": 1 for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge")},
    "g5.12xlarge": 4,
    "g5.24xlarge": 4,
    "g5.48xlarge": 8,
    "p3.2xlarge": 1,
    "p3.8xlarge": 4,
    "p3.16xlarge": 8,
    "p3dn.24xlarge": 8,
    "p4d.24xlarge": 8,
    "p4de.24xlarge": 8,
    "p5.48xlarge": 8,
}


# EBS Multi-Attach works only on Nitro instances, and at most 16 of them per volume.
MULTI_ATTACH_MAX = 16


def efa_supported(info: dict[str, Any]) -> bool:
    """One DescribeInstanceTypes entry: does it take an EFA interface?"""
    flag = (info.get("NetworkInfo") or {}).get("EfaSupported")
    return bool(flag) if flag is not None else info["InstanceType"] in EFA_TYPES


def efa_count(instance_type: str) -> int:
    """EFA interfaces the type takes, from the table (0: no EFA); for the doctor, offline."""
    return EFA_INTERFACES.get(instance_type, 1) if instance_type in EFA_TYPES else 0


def efa_cards(info: dict[str, Any]) -> list[tuple[int, bool]]:
    """One DescribeInstanceTypes entry -> (NetworkCardIndex, takes "efa-only") of each network
    card that carries an EFA, card 0 first; at most EfaInfo.MaximumEfaInterfaces; [] without EFA.
    Without NetworkCards in the entry: the table's count, "efa-only" not assumed."""
    if not efa_supported(info):
        return []
    net = info.get("NetworkInfo") or {}
    most = (net.get("EfaInfo") or {}).get("MaximumEfaInterfaces") or efa_count(info["InstanceType"]) or 1
    cards = net.get("NetworkCards")
    if not cards:
        return [(i, False) for i in range(most)]
    found = sorted((int(c["NetworkCardIndex"]), "efa-only" in c.get("InterfaceTypes", ()))
                   for c in cards if "efa" in c.get("InterfaceTypes", ("efa",)))
    return found[:most] or [(0, False)]


def is_nitro(info: dict[str, Any]) -> bool:
    """Nitro (or bare metal, which is Nitro too): EBS Multi-Attach possible."""
    return info.get("Hypervisor") == "nitro" or bool(info.get("BareMetal"))


def gpu_count(instance_type: str) -> int | None:
    """GPUs of the type, from the table (None: not in it)."""
    return KNOWN_GPU_COUNTS.get(instance_type)
