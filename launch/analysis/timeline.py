"""The timeline of a launch: per node and per phase, when it began and how long it took.

Each phase is measured where it happens: the launcher times its own rounds (the first round,
the pull), the node programs time their steps (launch/node/host/up.sh: the container, its sshd;
launch/node/run.sh --ready: each node's sshd reached from the first container) and print them
as event lines (`contract.SUPERVISOR_EVENT{"event": "phase", ...}`), the supervisor's output
gives the first step (each node's first line of the job) and, on a restart, the supervisor's
own `phase` events (detection, teardown, spare in, resumed). Each becomes an `Entry`; the job
keeps them in its record (`timeline`), shows them as a table in its log once every node made
its first step, and `dtrain status JOB` prints them. Pure functions, but for Recorder (a lock).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

from dtrain import contract
from dtrain.terminal import clean
from dtrain.launch.jobs import events

PHASES = contract.LAUNCH_PHASES
RESTART_PHASES = contract.RESTART_PHASES
PREFIX = "[launch] timeline"  # before each line of the table in the job's log


@dataclass(frozen=True)
class Entry:
    node: str  # the node as the launch names it (its host); "" for the job as a whole
    phase: str  # one of contract.LAUNCH_PHASES, or RESTART_PHASES where restart > 0
    start: float  # seconds after the launch began (a node's own steps: by its clock)
    seconds: float
    restart: int = 0  # 0: the launch; N: the job's Nth restart


Timeline = tuple[Entry, ...]


def _num(value: object) -> float | None:
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return x if x == x and abs(x) != float("inf") else None


def _in_bounds(x: float) -> bool:
    """A time of the timeline (seconds after the launch) that can be drawn: finite, within
    events.MAX_EPOCH either side (a node's clock may be behind the launcher's; a record
    without its start counts from 0)."""
    return -events.MAX_EPOCH <= x <= events.MAX_EPOCH


def from_event(ev: Mapping, *, t0: float, now: float, node: str = "", restart: int = 0,
               names: Mapping[str, str] | None = None) -> Entry | None:
    """A `phase` event -> Entry; None where it is not one or its times cannot be read.
    Times: "at" and "end" (epoch seconds, a node's own clock) or "seconds" (then it ended
    `now`, the time it arrived); t0: the launch's start (epoch). node: who said it, where
    the event names none; names: a node's hostname or address -> its host."""
    if ev.get("event") != contract.PHASE_EVENT or not isinstance(ev.get("phase"), str):
        return None
    at, end, seconds = _num(ev.get("at")), _num(ev.get("end")), _num(ev.get("seconds"))
    if seconds is None and at is not None and end is not None:
        seconds = end - at
    if seconds is None:
        return None
    if at is None:
        at = (end if end is not None else now) - seconds
    who = str(ev.get("node") or node)
    if not (_in_bounds(at - t0) and -events.MAX_SECONDS <= seconds <= events.MAX_SECONDS):
        return None
    return Entry((names or {}).get(who, who), ev["phase"], round(at - t0, 3), round(max(seconds, 0.0), 3),
                 int(_num(ev.get("restart")) or restart))


def event_of(line: str) -> dict | None:
    """A `dtrain-supervisor {json}` event line (contract.SUPERVISOR_EVENT) as its checked fields
    (launch/jobs/events.py: the schema of each kind); None where the line is not an event line;
    events.BadEvent (why, one line) where it is one that the schema refuses (a node's lines are
    untrusted: the job runs beside the supervisor)."""
    if not line.startswith(contract.SUPERVISOR_EVENT):
        return None
    return events.parse(line[len(contract.SUPERVISOR_EVENT):])


def parse_event(line: str) -> dict | None:
    """A `dtrain-supervisor {json}` event line as its checked fields, else None (not an event
    line, or one the schema refuses: event_of says why)."""
    try:
        return event_of(line)
    except events.BadEvent:
        return None


def restart_of(ev: Mapping, attempt: int, restarts: int) -> int:
    """Which restart a `phase` event belongs to, where it does not say ("restart": N): the
    supervisor emits detection and teardown before its `restart` event, spare-in and resumed
    after it. attempt: the latest `running` event's; restarts: the latest `restart` event's."""
    if isinstance(ev.get("restart"), int):
        return ev["restart"]
    phase = ev.get("phase")
    if phase not in RESTART_PHASES:
        return 0
    return max(restarts, attempt + 1 if phase in ("detection", "teardown") else attempt, 1)


def node_lines(node: str, lines: Iterable[str], *, t0: float, now: float) -> list[Entry]:
    """The phase events among a node program's output lines (launch/node/host/)."""
    out = []
    for line in lines:
        ev = parse_event(line.rstrip("\n"))
        entry = from_event(ev, t0=t0, now=now, node=node) if ev else None
        if entry is not None:
            out.append(entry)
    return out


def rounds(phase: str, spans: Mapping[str, tuple[float, float]], t0: float) -> list[Entry]:
    """The launcher's own measure of a round: host -> (start, end), epoch seconds."""
    return [Entry(host, phase, round(a - t0, 3), round(max(b - a, 0.0), 3)) for host, (a, b) in spans.items()]


def merge(old: Iterable[Entry], new: Iterable[Entry]) -> Timeline:
    """old and new, where one (restart, node, phase) is in both: new's (a log read twice)."""
    seen: dict[tuple[int, str, str], Entry] = {}
    for e in (*old, *new):
        seen[(e.restart, e.node, e.phase)] = e
    return tuple(seen.values())


def to_json(entries: Iterable[Entry]) -> list[dict]:
    return [asdict(e) for e in entries]


def from_json(data: object) -> Timeline:
    """A record's `timeline` -> entries; what cannot be read is left out (an older record)."""
    out = []
    for d in data if isinstance(data, list) else []:
        if not isinstance(d, dict):
            continue
        start, seconds = _num(d.get("start")), _num(d.get("seconds"))
        if start is None or seconds is None or not isinstance(d.get("phase"), str):
            continue
        restart = _num(d.get("restart")) or 0
        if (not (_in_bounds(start) and 0 <= seconds <= events.MAX_SECONDS and 0 <= restart <= events.MAX_COUNT)
                or len(d["phase"]) > events.MAX_NAME):
            continue
        out.append(Entry(str(d.get("node", ""))[:events.MAX_TEXT], d["phase"], start, seconds, int(restart)))
    return tuple(out)


def _columns(entries: Sequence[Entry], known: Sequence[str]) -> list[str]:
    phases = {e.phase for e in entries}
    return [p for p in known if p in phases] + sorted(phases - set(known))


def rows(entries: Iterable[Entry], nodes: Sequence[str] = ()) -> list[list[list[str]]]:
    """Tables (header first) of seconds: the launch's (a row per node, a column per phase and
    `done at`, when the node's last phase ended), then one per restart, headed `restart N`.
    nodes: the order of rows (the rest follow, sorted)."""
    entries = list(entries)
    tables = []
    for restart in sorted({e.restart for e in entries}):
        these = [e for e in entries if e.restart == restart]
        cols = _columns(these, PHASES if restart == 0 else RESTART_PHASES)
        hosts = [h for h in nodes if any(e.node == h for e in these)]
        hosts += sorted({e.node for e in these} - set(hosts))
        table = [["launch" if restart == 0 else f"restart {restart}", *map(clean, cols), "done at"]]
        for h in hosts:
            mine = {e.phase: e for e in these if e.node == h}
            done = max(e.start + e.seconds for e in mine.values())
            table.append([clean(h) or "(job)", *(f"{mine[c].seconds:.2f}" if c in mine else "-" for c in cols),
                          f"{done:.2f}"])
        tables.append(table)
    return tables


def text(entries: Iterable[Entry], nodes: Sequence[str] = ()) -> str:
    """The timeline as aligned tables, seconds (`dtrain status JOB`)."""
    from dtrain.table import text as aligned

    return "\n\n".join(aligned(t) for t in rows(entries, nodes))


def log_lines(entries: Iterable[Entry], nodes: Sequence[str] = ()) -> list[str]:
    """The timeline as the job's log shows it, each line `[launch] timeline ...`."""
    from dtrain.table import text as aligned

    return [f"{PREFIX} {line}" for t in rows(entries, nodes) for line in aligned(t).splitlines()]


def complete(entries: Iterable[Entry], nodes: Iterable[str], phase: str = "first-step") -> bool:
    """Every node has an entry of phase in the launch."""
    have = {e.node for e in entries if e.restart == 0 and e.phase == phase}
    return set(nodes) <= have


class Recorder:
    """The entries of one launch as they arrive, from the stages' return values and from the
    threads that read the nodes' sessions (a node's sshd, the supervisor's events)."""

    def __init__(self, t0: float):
        self.t0 = t0
        self._lock = threading.Lock()
        self._entries: Timeline = ()

    def add(self, entries: Iterable[Entry]) -> None:
        with self._lock:
            self._entries = merge(self._entries, entries)

    def entries(self) -> Timeline:
        with self._lock:
            return self._entries
