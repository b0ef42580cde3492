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
TRIES = 20  # polls at which a node that came and is not ready yet (NotYet: still booting) is tried


class NotYet(LaunchError):
    """A node that came is not ready yet (its sshd, its first boot, its engine): tried again at
    the next poll, up to TRIES times."""


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
    (known: its hosts, the ones done with here added) is made a spare (join) and offered (offer).
    One not ready yet (NotYet) is tried again at the next polls, TRIES in all; a known host that
    the provider stopped naming and names again is a new node at that address (a replacement
    given the Elastic IP the old one left). A provider that does not answer is said once per
    distinct reason; the job goes on."""
    every = poll_s() if every is None else every
    said: set[str] = set()
    tries: dict[str, int] = {}
    gone: set[str] = set()  # known hosts the provider stopped naming
    while not stop.wait(every):
        try:
            found = source()
        except Exception as e:  # noqa: BLE001 - any provider failure: said, asked again later
            why = " ".join(str(e).split())[:200] or type(e).__name__
            if why not in said:
                said.add(why)
                say(f"[launch] warning: new nodes for spares not asked ({why}); asked again in {every:g} s")
            continue
        named = {n.host for n in found}
        back = gone & named  # named again: another node at that address, new to the job
        known.difference_update(back)
        gone = (gone - back) | {h for h in known if h not in named}
        for node in new_nodes(found, known):
            if stop.is_set():
                return
            h = node.host
            tries[h] = tries.get(h, 0) + 1
            if tries[h] == 1:
                say(f"[launch] {h} came to the cluster: making it a spare of this job")
            try:
                spare = join(node)
            except NotYet as e:
                if tries[h] < TRIES:
                    if tries[h] == 1:
                        say(f"[launch] {h}: {e}; tried again every {every:g} s")
                    continue
                known.add(h)
                say(f"[launch] warning: {h} is not a spare of this job: {e} after {TRIES} tries")
                continue
            except Exception as e:  # noqa: BLE001 - the job goes on without it; the job's end ends a join under way
                if stop.is_set():
                    return
                known.add(h)
                why = str(e) if isinstance(e, LaunchError) else f"{type(e).__name__}: {' '.join(str(e).split())}"
                say(f"[launch] warning: {h} is not a spare of this job: {why}")
                continue
            known.add(h)
            tries.pop(h, None)
            if not stop.is_set():
                offer(spare)
