"""Spares that join a running job (issue 49): where the job's nodes come from a provider that can
say its nodes now (an EC2 cluster of `nodes up`: its Auto Scaling group, which replaces a node
that a spot interruption or a failed health check took), an attached job with --spares asks it
every POLL_S seconds. A node new to the job is made ready as its spares were at the start
(Job.join: the job's directory, image and container, its sshd answering) and offered to the
supervisor on its stdin (runplan.spare_line); the supervisor takes it as a spare (`spare-joined`)
for the next node lost. One line says each step; a node that cannot be one is said and left."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Collection, Sequence

from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import runplan
from dtrain.launch.remote.hosts import Node

# How often the nodes' provider is asked (an AWS API call each: DescribeAutoScalingGroups and
# DescribeInstances); DTRAIN_JOIN_POLL_S: another period (tests).
POLL_S = 30.0


def poll_s() -> float:
    try:
        return max(0.5, float(os.environ.get("DTRAIN_JOIN_POLL_S", POLL_S)))
    except ValueError:
        return POLL_S


def new_nodes(found: Sequence[Node], known: Collection[str]) -> list[Node]:
    """The nodes found whose host the job has not seen (pure), in the order found, once each."""
    seen = set(known)
    out = []
    for n in found:
        if n.host not in seen:
            seen.add(n.host)
            out.append(n)
    return out


def follow(source: Callable[[], list[Node]], known: set[str], join: Callable[[Node], runplan.PlanNode],
           offer: Callable[[runplan.PlanNode], None], say: Callable[[str], None], stop: threading.Event,
           every: float | None = None) -> None:
    """Until stop: every `every` seconds the provider's nodes (source); each one new to the job
    (known: its hosts, the ones seen here added) is made a spare (join) and offered (offer).
    A provider that does not answer is said once per distinct reason; the job goes on."""
    every = poll_s() if every is None else every
    said: set[str] = set()
    while not stop.wait(every):
        try:
            found = source()
        except Exception as e:  # noqa: BLE001 - any provider failure: said, asked again later
            why = " ".join(str(e).split())[:200] or type(e).__name__
            if why not in said:
                said.add(why)
                say(f"[launch] warning: new nodes for spares not asked ({why}); asked again in {every:g} s")
            continue
        for node in new_nodes(found, known):
            known.add(node.host)
            if stop.is_set():
                return
            say(f"[launch] {node.host} came to the cluster: making it a spare of this job")
            try:
                spare = join(node)
            except Exception as e:  # noqa: BLE001 - the job goes on without it; the job's end ends a join under way
                if stop.is_set():
                    return
                why = str(e) if isinstance(e, LaunchError) else f"{type(e).__name__}: {' '.join(str(e).split())}"
                say(f"[launch] warning: {node.host} is not a spare of this job: {why}")
                continue
            if not stop.is_set():
                offer(spare)
