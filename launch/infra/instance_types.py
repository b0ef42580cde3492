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

# EBS Multi-Attach works only on Nitro instances, and at most 16 of them per volume.
MULTI_ATTACH_MAX = 16


def efa_supported(info: dict[str, Any]) -> bool:
    """One DescribeInstanceTypes entry: does it take an EFA interface?"""
    flag = (info.get("NetworkInfo") or {}).get("EfaSupported")
    return bool(flag) if flag is not None else info["InstanceType"] in EFA_TYPES


def is_nitro(info: dict[str, Any]) -> bool:
    """Nitro (or bare metal, which is Nitro too): EBS Multi-Attach possible."""
    return info.get("Hypervisor") == "nitro" or bool(info.get("BareMetal"))
