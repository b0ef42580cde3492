"""Hang detection's bookkeeping: which rank made progress when (`dtrain launch --hang-timeout`).

The supervisor (launch/node/supervise.py) feeds every output line of the attempt to `ranks_of`
(the same parsing the user's view uses: supervision.Render, so `[1,3]<stdout>:` tags and
torchrun's `[default1]:` prefixes mean the same rank here as on screen), then each rank's line to
`Progress.feed`. A line counts as progress when it matches the job's --progress-pattern, or, with
none, any line of a rank. `Progress.stalled` says when no rank made progress for `timeout`
seconds, and which ranks are behind. The clock starts at the attempt's first progress line:
imports, data set up and rendezvous before it take what they take (a start that never ends is
for --timeout). Pure: time is an argument.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field

from dtrain import patterns
from dtrain.launch.jobs.output import RANK_LINE


def compile_pattern(pattern: str | None) -> re.Pattern | None:
    """--progress-pattern as a regex (None: any line counts); re.error for a bad one, or one that
    can backtrack without bound (patterns.backtracking: the launcher refused it already)."""
    return patterns.compile_bounded(pattern) if pattern else None


def ranks_of(shown: list[str]) -> list[tuple[int, str]]:
    """(rank, text) of each of the user's lines (supervision.Render.feed's) that a rank wrote."""
    return [(int(m.group(2)), m.group(3)) for line in shown if (m := RANK_LINE.match(line))]


@dataclass(frozen=True)
class Stall:
    """No rank made progress for `silent_for` seconds; `behind`: the ranks that are behind."""

    silent_for: float
    behind: tuple[int, ...]
    steps: dict[int, int]  # progress lines per rank
    ago: dict[int, float]  # seconds since each rank's last progress (since the start: none yet)


@dataclass
class Progress:
    """Last progress time and count of progress lines per rank of one attempt."""

    world: int
    started: float
    pattern: re.Pattern | None = None
    last: dict[int, float] = field(default_factory=dict)
    steps: dict[int, int] = field(default_factory=dict)

    def feed(self, rank: int, line: str, now: float) -> bool:
        """One line of `rank`; True when it counts as progress."""
        if not 0 <= rank < self.world or (self.pattern is not None and not patterns.search(self.pattern, line)):
            return False
        self.last[rank] = now
        self.steps[rank] = self.steps.get(rank, 0) + 1
        return True

    def stalled(self, now: float, timeout: float) -> Stall | None:
        """None before the first progress and while some rank made progress within `timeout` s;
        else the Stall."""
        if not self.last:
            return None
        lasts = {r: self.last.get(r, self.started) for r in range(self.world)}
        silent = now - max(lasts.values())
        if silent < timeout:
            return None
        steps = {r: self.steps.get(r, 0) for r in range(self.world)}
        return Stall(round(silent, 1), behind(lasts, steps, counted=self.pattern is not None), steps,
                     {r: round(now - t, 1) for r, t in lasts.items()})


def behind(lasts: dict[int, float], steps: dict[int, int], *, counted: bool) -> tuple[int, ...]:
    """The ranks behind the others. With a progress pattern (one line per step), those with
    fewer steps than the most advanced; every rank where all made as many steps (a job that
    prints its step line after the step's collective: the stopped rank printed its last step
    with the others, a few ms apart, and which line arrived first is noise, not a culprit).
    Otherwise by time: a stopped rank's last line is older than those of the ranks that went
    on until they blocked waiting for it, so the ranks before the widest gap between
    last-progress times (every rank when all fell silent at once: nothing tells them apart)."""
    if counted:
        low = min(steps.values())
        return tuple(sorted(r for r, n in steps.items() if n == low))
    order = sorted(lasts, key=lambda r: (lasts[r], r))
    if len(order) < 2:
        return tuple(order)
    gaps = [lasts[b] - lasts[a] for a, b in zip(order, order[1:])]
    widest = max(gaps)
    if widest <= 0:
        return tuple(sorted(order))
    cut = gaps.index(widest) + 1
    return tuple(sorted(order[:cut]))


@dataclass
class Watch:
    """One attempt's hang watch in the supervisor: its output lines in (from every reader
    thread), a Stall out once no rank made progress for `timeout` s."""

    progress: Progress
    timeout: float
    render: object  # supervision.Render of the attempt: the user's view of each line
    lock: threading.Lock = field(default_factory=threading.Lock)

    def feed(self, line: str, now: float) -> None:
        with self.lock:
            for rank, text in ranks_of(self.render.feed(line)):
                self.progress.feed(rank, text, now)

    def stalled(self, now: float) -> Stall | None:
        with self.lock:
            return self.progress.stalled(now, self.timeout)


def watch(launcher: str, timeout: float | None, pattern: str, ranks: list[str], now: float) -> Watch | None:
    """The hang watch of an attempt on `ranks` (global rank -> hostname), from the run plan's
    hang_timeout and progress_pattern (runplan.RunPlan); None without --hang-timeout."""
    from dtrain.launch.jobs.supervision import Render

    if not timeout:
        return None
    return Watch(Progress(len(ranks), now, compile_pattern(pattern or None)), float(timeout),
                 Render(launcher, ranks[0] if ranks else "", ranks=list(ranks)))


def event_fields(stall: Stall, ranks: list[str]) -> dict:
    """The `hang` event's fields (supervision.hang_line shows them): the ranks behind, their
    nodes, seconds since their last progress and their progress lines."""
    return {"silent_for": stall.silent_for, "ranks": list(stall.behind),
            "nodes": [ranks[r] if r < len(ranks) else "?" for r in stall.behind],
            "ago": {str(r): stall.ago[r] for r in stall.behind},
            "steps": {str(r): stall.steps[r] for r in stall.behind}}
