"""Straggler detection's bookkeeping (`dtrain launch --straggler-check SECONDS`).

In synchronous training every rank's step lasts as long as the slowest rank's: the others wait
for it inside the step's collective. The supervisor (launch/node/supervise.py) samples every
rank's Python stack every SECONDS (launch/node/stacks.sh, as a hang's dump does), `ranks_waiting`
reads one round of dumps into {rank: waiting in a collective?} (a collective's Python frame, or,
with stacks.sh's `py-spy dump --native`, its native wait: stacks.native_wait, which is how DDP's
gradient allreduce inside `backward` and a compiled step's collectives are seen), `History` keeps the last rounds
per rank, and `stragglers` is the verdict:

    over the last WINDOW samples of every rank, a rank is a straggler when the median of the
    other ranks' waiting fractions is at least OTHERS_WAIT and its own is at most FACTOR times
    that median (the others mostly wait, it rarely does), in CONFIRM rounds in a row.

No verdict before every rank has WINDOW samples, with fewer than 2 ranks, or when the others
do not mostly wait (an even run: every rank waits a little, none for long). Pure: the dumps are
arguments.
"""

from __future__ import annotations

import re
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from dtrain.launch.analysis import stacks

WINDOW = 12  # samples per rank the verdict looks at
FACTOR = 1 / 3  # the straggler waits at most this fraction of the others' median
OTHERS_WAIT = 2 / 3  # ... and the others wait in at least two thirds of their samples
CONFIRM = 3  # rounds in a row the verdict must hold before a rank is named

# Functions whose frame means "waiting for the other ranks": torch.distributed's collectives,
# Horovod's (its torch ops wait in `synchronize`), DDP's start-up and buffer sync.
COLLECTIVES = frozenset({
    "all_reduce", "allreduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
    "all_to_all_single", "reduce_scatter", "reduce_scatter_tensor", "broadcast", "broadcast_object_list",
    "barrier", "monitored_barrier", "reduce", "gather", "scatter", "_sync_buffers", "_sync_params_and_buffers",
    "_verify_param_shape_across_processes", "allgather", "alltoall", "broadcast_parameters", "grouped_allreduce",
})
HOROVOD_WAIT = "synchronize"  # horovod/torch/mpi_ops.py: an op's handle waited for


def is_collective_frame(function: str, path: str) -> bool:
    """Whether a stack frame (function, file) is a wait for the other ranks inside a collective."""
    name = function.rsplit(".", 1)[-1]  # a qualified name (Class.method) as newer Pythons give it
    return name in COLLECTIVES or (name == HOROVOD_WAIT and "horovod" in path)


def waits_in_collective(state: str, frames: Iterable[tuple[str, str]]) -> bool:
    """One process: waiting inside a collective (a collective's frame in any of its threads'
    stacks, and the process neither stopped (T) nor in disk wait (D))."""
    return state not in ("T", "D", "t") and any(is_collective_frame(f, p) for f, p in frames)


# Where a process blocked when py-spy read its native frames: (node, pid, its main thread's
# innermost Python frame as py-spy prints it). A native read pauses the process for seconds
# (docs/benchmarks.md), so the verdicts of a place's native reads (a collective's wait or not)
# are kept for the attempt, and once NATIVE_AGREE of them agree the place is settled: stacks.sh
# is given the settled places (known_places) and reads that process there Python-only, its
# verdict the majority's. At most 2 * NATIVE_AGREE - 1 pauses per process and place, and one
# unlucky read (a rank idle in `backward` for another reason) does not decide alone.
NativePlace = tuple[str, int, str]
NATIVE_AGREE = 2


def _python_frame(frame: stacks.Frame) -> bool:
    """A Python frame as py-spy prints it: a .py file, or <frozen runpy>, <string>, ... with a line."""
    return bool(re.search(r"(\.py|^<[^<>]*>):\d+$|\.py$", frame.file))


def native_place(proc: stacks.Proc) -> NativePlace | None:
    """Where `proc` blocks (NativePlace), or None: its main thread is not idle (py-spy's status,
    or, under Python 3.10 and older, its kernel state: stacks.sh's note, Proc.main_idle), or
    shows no frame. Read natively: its innermost Python frame; else its innermost frame, as
    stacks.sh takes it (the line after the main thread's)."""
    main = stacks.main_thread(proc)
    # a native read paused the process, so py-spy's status there is the thread's own, 3.10 too
    idle = main is not None and (main.status == "idle" or (proc.main_idle and not proc.native))
    if main is None or not idle or not main.frames:
        return None
    inner = next((f for f in main.frames if _python_frame(f)), None) if proc.native else main.frames[0]
    return None if inner is None else (proc.node, proc.pid, str(inner))


def native_verdicts(lines: Iterable[str]) -> dict[NativePlace, bool]:
    """The processes of one round that stacks.sh read natively: {where each blocks: waiting in a
    collective's native code (stacks.native_wait)}."""
    out: dict[NativePlace, bool] = {}
    for p in stacks.parse(lines):
        if p.rank is not None and p.native and (where := native_place(p)) is not None:
            out[where] = any(stacks.native_wait(t) for t in p.threads)
    return out


Known = Mapping[NativePlace, tuple[bool, ...]]  # each place's native verdicts, in the order read


def learn(known: Known, lines: Iterable[str]) -> dict[NativePlace, tuple[bool, ...]]:
    """known with one round's native verdicts added (a new mapping), less the places of the
    processes that are gone: a node that answered this round no longer lists them (a node that
    did not answer keeps its places). The memo holds only live processes' places."""
    lines = list(lines)
    procs = stacks.parse(lines)
    answered = {p.node for p in procs}
    alive = {(p.node, p.pid) for p in procs}
    out = {w: r for w, r in known.items() if w[0] not in answered or (w[0], w[1]) in alive}
    for where, v in native_verdicts(lines).items():
        out[where] = (*out.pop(where, ()), v)  # moved to the end: the order is of the latest read
    return out


def verdict(reads: Sequence[bool]) -> bool:
    """A place's verdict from its native reads: the majority's; a tie, the latest read's."""
    yes = sum(reads)
    return yes * 2 > len(reads) or (yes * 2 == len(reads) and bool(reads) and reads[-1])


def settled(reads: Sequence[bool]) -> bool:
    return max(sum(reads), len(reads) - sum(reads)) >= NATIVE_AGREE


# KNOWN is one argument of stacks.sh's command line (over ssh: one word of the remote command;
# Linux takes 128 KiB per argument): the latest settled places up to KNOWN_BYTES, each frame at
# most KNOWN_FRAME characters (a longer one is read natively again: it costs a pause, never a miss)
KNOWN_BYTES = 32 << 10
KNOWN_FRAME = 512


def known_places(known: Known, node: str) -> str:
    """stacks.sh's KNOWN argument for one node: `PID FRAME` per line, its settled places, the
    latest learnt first, at most KNOWN_BYTES."""
    lines, size = [], 0
    for (n, pid, frame), reads in reversed(list(known.items())):
        if n != node or not settled(reads) or len(frame) > KNOWN_FRAME or "\n" in frame:
            continue
        line = f"{pid} {frame}"
        size += len(line.encode()) + 1
        if size > KNOWN_BYTES:
            break
        lines.append(line)
    return "\n".join(lines)


def ranks_waiting(lines: Iterable[str], known: Known | None = None) -> dict[int, bool]:
    """One round of launch/node/stacks.sh's output (any nodes, read by stacks.parse, as a hang's
    dump is) -> {rank: waiting in a collective}. A rank with several processes (a data loader's
    workers share its RANK) waits when one does; a launcher's process (no rank in its label) is
    none. Not stacks.place's rule: backward as the innermost Python frame is a rank computing
    here, unless its native frames show DDP's allreduce wait (stacks.native_wait), read in this
    round or, at the same place, before (known: `learn`'s, of earlier rounds)."""
    known = known or {}
    out: dict[int, bool] = {}
    for p in stacks.parse(lines):
        if p.rank is not None:
            frames = [(f.func, f.file) for t in p.threads for f in t.frames]
            running = p.state not in ("T", "D", "t")
            if p.native:
                native = any(stacks.native_wait(t) for t in p.threads)
            else:
                where = native_place(p)
                native = where is not None and where in known and verdict(known[where])
            # blocked in its collective while its other threads run: the collective's own work
            # (a rank under a CPU quota, its gloo threads throttled too), not a wait for a peer
            native = native and not p.others_running
            out[p.rank] = out.get(p.rank, False) or waits_in_collective(p.state, frames) or (running and native)
    return out


NATIVE_UNREAD = "   (native frames not read: "  # stacks.sh's note under a process's header


def native_unread(lines: Iterable[str], told: set[str]) -> list[str]:
    """The notes of one round where py-spy could not read a process's native frames (its
    collective waits under C++ frames are then not seen), each process label once: `told`
    holds the labels said before and is added to."""
    out = []
    for ln in lines:
        label, sep, _ = ln.partition(NATIVE_UNREAD)
        if sep and label not in told:
            told.add(label)
            out.append(ln)
    return out


def ranks_of_dump(lines: Iterable[str]) -> dict[int, str]:
    """{rank: node} as stacks.sh's labels name them."""
    return {p.rank: p.node for p in stacks.parse(lines) if p.rank is not None}


@dataclass(frozen=True)
class Straggler:
    rank: int
    waiting: int  # samples of the window in which it waited in a collective
    others: float  # the other ranks' median, in samples
    samples: int  # the window


def stragglers(history: Mapping[int, Sequence[bool]], window: int = WINDOW, factor: float = FACTOR,
               others_wait: float = OTHERS_WAIT) -> list[Straggler]:
    """The verdict over each rank's last `window` samples (True: waiting in a collective), the
    slowest first; [] while a rank has fewer samples or fewer than 2 ranks are known."""
    if len(history) < 2 or any(len(h) < window for h in history.values()):
        return []
    waited = {r: sum(bool(x) for x in list(h)[-window:]) for r, h in history.items()}
    found = []
    for rank, w in waited.items():
        median = statistics.median(v for r, v in waited.items() if r != rank)
        if median >= others_wait * window and w <= factor * median:
            found.append(Straggler(rank, w, median, window))
    return sorted(found, key=lambda s: (s.waiting, s.rank))


@dataclass
class History:
    """Each rank's last `window` samples of one attempt."""

    window: int = WINDOW
    samples: dict[int, deque] = field(default_factory=dict)

    def add(self, round_: Mapping[int, bool]) -> None:
        for rank, waiting in round_.items():
            self.samples.setdefault(rank, deque(maxlen=self.window)).append(bool(waiting))

    streak: dict[int, int] = field(default_factory=dict)  # rounds in a row each rank was the verdict's

    def verdict(self, confirm: int = CONFIRM) -> list[Straggler]:
        """The verdict once it has held `confirm` rounds in a row for a rank (a burst of a few
        seconds, the machine's or the sampler's, names no one)."""
        now = stragglers(self.samples, self.window)
        self.streak = {s.rank: self.streak.get(s.rank, 0) + 1 for s in now}
        return [s for s in now if self.streak[s.rank] >= confirm]


def event_fields(s: Straggler, node: str, interval: float) -> dict:
    """The `straggler` event's fields."""
    return {"rank": s.rank, "node": node, "waiting": s.waiting, "others": s.others, "samples": s.samples,
            "interval": interval}


def line(ev: Mapping) -> str:
    """A `straggler` event as one line of the log."""
    n = ev.get("samples")
    return (f"straggler: r{ev.get('rank')} on {ev.get('node')} waited in a collective in {ev.get('waiting')}/{n} "
            f"samples, the other ranks in {ev.get('others'):g}/{n} (median), over the last "
            f"{float(ev.get('interval') or 0) * float(n or 0):g} s (--straggler-check {ev.get('interval'):g}): "
            f"the others wait for it")


def summary(ev: Mapping) -> str:
    """What `dtrain status` says of a straggler: `r1, in a collective 0/12 samples (others 10/12)`."""
    n = ev.get("samples")
    return f"r{ev.get('rank')}, in a collective {ev.get('waiting')}/{n} samples (others {ev.get('others'):g}/{n})"
