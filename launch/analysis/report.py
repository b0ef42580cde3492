"""`dtrain report`: one job's run as a picture, a self-contained HTML file (inline CSS and SVG,
no script, nothing fetched when it is viewed).

What it shows comes from what the job's store keeps (launch/jobs/store.py): the record's
timeline (timeline.Entry: per node and phase, the launch's and each restart's), its
quarantined nodes, the network gate's results (`gate`, netgate.GateResult.to_json), its end;
output.log's `[launch]` lines (restarts and why, hangs and the stack dumps after them) and the
ranks' progress lines (the record's --progress-pattern; none: every line of a rank, as the hang
watch counts them, launch/jobs/progress.py), timed by output.times (`EPOCH COUNT` per write of
the log, job.py).

Data flows one way: `read(job, log, times)` -> Run (typed, pure) -> `html(run)` -> str (pure);
`load(name)` is the one reader of the store, `write` the one writer. Every value of the job
(names, hosts, log lines) goes through html.escape.
"""

from __future__ import annotations

import contextlib
import html as _html
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dtrain import contract, outfile, patterns
from dtrain.launch.jobs import events
from dtrain.launch.analysis import timeline
from dtrain.terminal import clean
from dtrain.launch.jobs.output import RANK_LINE
from dtrain.launch.analysis.timeline import Entry

STRAGGLER_FACTOR = 1.5  # a rank whose median step is this much above the ranks' median stands out
_RESTART = re.compile(r"^\[launch\] restart (\d{1,9}): (.*)$")
_RESTARTED = re.compile(r"^\[launch\] job restarted \(attempt (\d{1,9})\)")
_PHASE_LINE = re.compile(r"^(%s)( \S+)? [\d.]+ s$" % "|".join(map(re.escape, contract.RESTART_PHASES)))


@dataclass(frozen=True)
class Line:
    """A line of output.log; at: seconds after the launch began (None: not timed)."""

    at: float | None
    text: str


@dataclass(frozen=True)
class Restart:
    attempt: int
    at: float | None
    why: str  # the supervisor's reason and what changed (spares in, nodes dropped)


@dataclass(frozen=True)
class Attempt:
    """One run of the job's command on its nodes: from the supervisor's `running` event to the
    restart after it or the job's end; how: that restart's reason or the end's line."""

    number: int
    start: float
    end: float
    how: str


@dataclass(frozen=True)
class Hang:
    at: float | None
    line: str  # `hang: no rank made progress ...` (supervision.hang_line)
    dump: tuple[str, ...]  # the ranks' stacks that followed it


@dataclass(frozen=True)
class Step:
    """A rank's progress line; seconds: since its previous one in the same attempt."""

    rank: int
    node: str
    attempt: int
    at: float
    seconds: float | None


@dataclass(frozen=True)
class GateNode:
    node: str
    gbps: float
    status: str
    why: str


@dataclass(frozen=True)
class GatePair:
    src: str
    dst: str
    gbps: float | None
    error: str


@dataclass(frozen=True)
class Run:
    name: str
    state: str
    launcher: str
    image: str
    exit_code: int | None
    nodes: tuple[str, ...]  # hosts, in the launch's order
    names: Mapping[str, str]  # host -> hostname where they differ (the ranks' lines name hostnames)
    duration: float | None
    entries: timeline.Timeline
    restarts: tuple[Restart, ...] = ()
    attempts: tuple[Attempt, ...] = ()
    hangs: tuple[Hang, ...] = ()
    steps: tuple[Step, ...] = ()
    pattern: str = ""
    timed: bool = False  # output.times was there: lines have times
    gate: tuple[GateNode, ...] = ()
    pairs: tuple[GatePair, ...] = ()
    quarantined: Mapping[str, str] = field(default_factory=dict)
    events: tuple[Line, ...] = ()  # the launch's own lines ([launch] ...)
    final: str = ""  # the job's last word (reason of a failure)
    recorded: bool = False  # the record is a launch's that records a timeline (empty: none reached a phase)
    notes: tuple[str, ...] = ()  # values of the record or the log refused (not finite, out of bounds)


# ---------------------------------------------------------------- record + log -> Run (pure)


def stamp(log: str, times: str, t0: float) -> list[Line]:
    """output.log's lines, each with the time of the write that brought it (output.times:
    `EPOCH COUNT` per write, in order); lines past what times covers are untimed."""
    return stamped(log, times, t0)[0]


def stamped(log: str, times: str, t0: float) -> tuple[list[Line], int]:
    """stamp's lines, and how many rows of output.times were refused: a time not finite or
    more than events.MAX_SECONDS from the launch's start, a count not a whole number within the
    lines left (such a row's lines stay untimed: a later row's lines keep their own)."""
    lines = log.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    ats: list[float | None] = []
    refused = 0
    for row in times.splitlines():
        parts = row.split()
        try:
            at, count = float(parts[0]) - t0, int(parts[1])
        except (ValueError, IndexError, OverflowError):
            refused += 1
            continue
        if not 0 <= count <= len(lines) - len(ats):
            refused += 1
            count = max(0, len(lines) - len(ats)) if count > 0 else 0
            at = float("nan")
        elif not -events.MAX_SECONDS <= at <= events.MAX_SECONDS:  # also NaN
            refused += 1
            at = float("nan")
        ats += [None if at != at else round(at, 3)] * count
    return [Line(ats[i] if i < len(ats) else None, text) for i, text in enumerate(lines)], refused


def _is_dump(text: str) -> bool:
    """A line of a rank's stack dump (py-spy's, as the hang watch shows it)."""
    return text.startswith("stack of pid") or text.startswith((" ", "\t"))


def steps_of(lines: Sequence[Line], pattern: str) -> list[Step]:
    """Each rank's progress lines (pattern: --progress-pattern; "": every line of a rank but a
    stack dump's), with the seconds since that rank's previous one in the same attempt."""
    rx = patterns.compile_bounded(pattern) if pattern else None  # an old record's: re.error if unbounded
    attempt = 0
    last: dict[tuple[int, int], float] = {}
    out = []
    for line in lines:
        if m := _RESTARTED.match(line.text):
            attempt = int(m.group(1))
            continue
        m = RANK_LINE.match(line.text)
        if not m or line.at is None:
            continue
        node, rank, text = m.group(1), int(m.group(2)), m.group(3)
        if (rx is not None and not patterns.search(rx, text)) or (rx is None and _is_dump(text)):
            continue
        before = last.get((attempt, rank))
        out.append(Step(rank, node, attempt, line.at, None if before is None else round(line.at - before, 3)))
        last[(attempt, rank)] = line.at
    return out


def restarts_of(lines: Sequence[Line]) -> list[Restart]:
    """`[launch] restart N: REASON; CHANGE (...)` lines (supervision.describe), not the
    restart's phase lines (`restart N: teardown 2.1 s`)."""
    out = []
    for line in lines:
        m = _RESTART.match(line.text)
        if m and not _PHASE_LINE.match(m.group(2)):
            out.append(Restart(int(m.group(1)), line.at, m.group(2)))
    return out


_STARTED = re.compile(r"^\[launch\] job (?:started|restarted \(attempt (\d{1,9})\)) on ")
_ENDED = ("[launch] job succeeded", "[launch] job failed", "[launch] job timed out", "error:")


def attempts_of(lines: Sequence[Line], end: float | None) -> list[Attempt]:
    """The attempts, from the `job started`/`job restarted (attempt N)` lines to the restart that
    ended each (`restart N: why`), the job's last word, or `end` (the record's)."""
    out: list[Attempt] = []
    cur: tuple[int, float] | None = None
    last = None
    for line in lines:
        if line.at is None:
            continue
        last = line.at
        m = _STARTED.match(line.text)
        r = _RESTART.match(line.text)
        if m:
            cur = (int(m.group(1) or 0), line.at)
        elif cur and r and not _PHASE_LINE.match(r.group(2)):
            out.append(Attempt(cur[0], cur[1], line.at, f"restart {r.group(1)}: {r.group(2)}"))
            cur = None
        elif cur and line.text.startswith(_ENDED):
            out.append(Attempt(cur[0], cur[1], line.at, line.text.removeprefix("[launch] ")))
            cur = None
    if cur is not None:
        out.append(Attempt(cur[0], cur[1], max(end or 0.0, last or 0.0, cur[1]), "the log ends"))
    return out


# A line of a node's output: `[NODE rR] ...` (a rank's) or `[NODE] ...` (a process without a
# rank, such as torchrun's agent, whose stack the hang dump shows too: launch/node/stacks.sh).
_NODE_LINE = re.compile(r"^\[([^\]\s]+)(?: r(\d{1,9}))?\] ?(.*)$")


def hangs_of(lines: Sequence[Line]) -> list[Hang]:
    """`[launch] hang: ...` lines, each with the stack dump lines after it."""
    out = []
    i = 0
    while i < len(lines):
        text = lines[i].text
        if text.startswith("[launch] hang:"):
            dump = []
            j = i + 1
            while j < len(lines) and (m := _NODE_LINE.match(lines[j].text)) and _is_dump(m.group(3)):
                dump.append(lines[j].text)
                j += 1
            out.append(Hang(lines[i].at, text.removeprefix("[launch] "), tuple(dump)))
            i = j
            continue
        i += 1
    return out


def _float(x: object, lo: float = -events.MAX_EPOCH, hi: float = events.MAX_EPOCH) -> float | None:
    """x as a number within lo..hi (finite); None where it is not one."""
    if isinstance(x, bool):
        return None
    try:
        v = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return v if lo <= v <= hi else None


MAX_GBPS = 100_000.0  # a link's rate the gate can report (Gbit/s); beyond: refused


def _list(x: object) -> list:
    return x if isinstance(x, list) else []


def gate_of(data: object) -> tuple[tuple[GateNode, ...], tuple[GatePair, ...]]:
    """The record's `gate` (netgate.GateResult.to_json); what cannot be read is left out."""
    if not isinstance(data, dict):
        return (), ()
    per_node = data.get("nodes") if isinstance(data.get("nodes"), dict) else {}
    nodes = tuple(GateNode(str(h), _float(d.get("gbps"), 0, MAX_GBPS) or 0.0, str(d.get("status", "")),
                           str(d.get("why", ""))) for h, d in per_node.items() if isinstance(d, dict))
    pairs = tuple(GatePair(str(p.get("src", "")), str(p.get("dst", "")), _float(p.get("gbps"), 0, MAX_GBPS),
                           str(p.get("error", ""))) for p in _list(data.get("pairs")) if isinstance(p, dict))
    return nodes, pairs


def read(job: Mapping, log: str = "", times: str = "") -> Run:
    """A job's record (job.json as a dict), its output.log and output.times -> Run."""
    notes = []
    t0 = _float(job.get("started"), 0) or 0.0
    ended = _float(job.get("ended"), 0)
    if ended is not None and t0 and not 0 <= ended - t0 <= events.MAX_SECONDS:
        notes.append(f"the record's end is {'before' if ended < t0 else 'too long after'} its start: not drawn")
        ended = None
    for key in ("started", "ended"):
        if job.get(key) is not None and _float(job.get(key), 0) is None:
            notes.append(f"the record's {key} is not a time before 2100: not drawn")
    lines, refused = stamped(log, times, t0)
    if refused:
        notes.append(f"{refused} row(s) of output.times are not a time and a count of lines: those lines are untimed")
    nodes = tuple(str(n.get("host", "")) for n in _list(job.get("nodes")) if isinstance(n, dict))
    names = job.get("node_names") if isinstance(job.get("node_names"), dict) else {}
    entries = tuple(x for x in timeline.from_json(job.get("timeline"))
                    if -events.MAX_SECONDS <= x.start <= events.MAX_SECONDS)
    if len(entries) < len(_list(job.get("timeline"))):
        notes.append(f"{len(_list(job.get('timeline'))) - len(entries)} timeline entr(ies) of the record are not "
                     f"a phase with times within {events.MAX_SECONDS} s of the launch: not drawn")
    gate, pairs = gate_of(job.get("gate"))
    final = job.get("final") if isinstance(job.get("final"), dict) else {}
    code = job.get("exit_code")
    pattern = job.get("progress_pattern") if isinstance(job.get("progress_pattern"), str) else ""
    try:
        steps = steps_of(lines, pattern)
    except re.error:
        steps = []
    return Run(
        name=str(job.get("name", "")), state=str(job.get("state", "?")), launcher=str(job.get("launcher", "")),
        image=str(job.get("image", "")), exit_code=code if isinstance(code, int) else None, nodes=nodes,
        names={str(k): str(v) for k, v in names.items()},
        duration=None if ended is None or not t0 else round(ended - t0, 3), entries=entries,
        restarts=tuple(restarts_of(lines)), attempts=tuple(attempts_of(lines, None if ended is None else ended - t0)),
        hangs=tuple(hangs_of(lines)), steps=tuple(steps), pattern=pattern,
        timed=bool(times.strip()), gate=gate, pairs=pairs,
        quarantined={str(k): str(v) for k, v in (job.get("quarantined") or {}).items()}
        if isinstance(job.get("quarantined"), dict) else {},
        events=tuple(events_of(lines)), final=str(final.get("reason", "")), recorded="timeline" in job,
        notes=tuple(notes))


def events_of(lines: Sequence[Line]) -> list[Line]:
    """The launch's own lines ([launch] ..., error: ...), an error's indented continuation lines
    (`  HOST: why`) with it; the timeline's table is left out (the Gantt shows it)."""
    out: list[Line] = []
    in_error = False
    for ln in lines:
        if ln.text.startswith(("[launch]", "error:")) and not ln.text.startswith(timeline.PREFIX):
            out.append(ln)
            in_error = ln.text.startswith("error:")
        elif in_error and ln.text[:1] in (" ", "\t") and ln.text.strip():
            out.append(ln)
        else:
            in_error = False
    return out


# ---------------------------------------------------------------- Run -> HTML (pure)


def e(value: object) -> str:
    """Any value of the job, as text in HTML (and in an attribute), without control characters."""
    return _html.escape(clean(value, lines=True), quote=True)


COLOURS = {"first-round": "#9aa5b1", "pull": "#4e79a7", "container": "#59a14f", "sshd": "#8cd17d",
           "network-gate": "#f28e2b", "ready": "#b6992d", "first-step": "#76b7b2",
           "detection": "#e15759", "checkpoint": "#ff9d9a", "teardown": "#b07aa1", "spare-in": "#edc948",
           "resumed": "#499894"}
OTHER = "#bab0ac"

CSS = """
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;margin:24px;color:#222;
background:#fff;max-width:1300px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#555;margin:0 0 4px} .meta b{color:#222}
.ok{color:#1a7f37} .bad{color:#c62828}
table{border-collapse:collapse;margin:6px 0} td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;
vertical-align:top} th{background:#f5f5f5} td.num{text-align:right;font-variant-numeric:tabular-nums}
.legend span{display:inline-block;margin-right:14px;font-size:12px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px;border-radius:2px}
svg text{font:12px system-ui,'DejaVu Sans',sans-serif;fill:#333}
svg .axis{stroke:#999} svg .grid{stroke:#eee} svg .restart{stroke:#c62828;stroke-dasharray:4 3}
.multiples{display:flex;flex-wrap:wrap;gap:10px}
.multiples figure{margin:0;border:1px solid #eee;padding:4px}
.multiples figcaption{font-size:12px;color:#444} .straggler{border-color:#c62828!important}
.straggler figcaption{color:#c62828;font-weight:bold}
pre{background:#f7f7f7;padding:8px;overflow-x:auto;font-size:12px;margin:4px 0}
details{margin:6px 0} summary{cursor:pointer}
.note{color:#666;font-size:13px}
"""


def _secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _nice_step(span: float) -> float:
    """A round tick step for an axis of `span`, about 8 ticks."""
    raw = max(span, 1e-9) / 8
    for m in (1, 2, 5, 10):
        for p in range(-3, 7):
            step = m * 10 ** p
            if step >= raw:
                return step
    return raw


def _ticks(top: float) -> list[float]:
    step = _nice_step(top)
    return [i * step for i in range(int(top / step) + 1)]


def _label(host: str, names: Mapping[str, str]) -> str:
    n = names.get(host, "")
    return f"{n} ({host})" if n and n != host else host or "(job)"


def span_of(run: Run) -> float:
    """The time axis' end: the run's duration, or its last entry, line or step."""
    ends = [e.start + e.seconds for e in run.entries] + [s.at for s in run.steps]
    ends += [ln.at for ln in run.events if ln.at is not None]
    return max([run.duration or 0.0, *ends, 1.0])


def _short(why: str, most: int = 40) -> str:
    """A restart's reason's first words (its kind: `hang`, `lost node-2`), for a label."""
    head = why.split(":")[0].split(";")[0].strip()
    return head if len(head) <= most else head[:most - 3] + "..."


def no_phases(recorded: bool, state: str) -> str:
    """Why a job's record has no phase: an older launch's record, a launch still in its first
    phase, or one that ended before it."""
    if not recorded:
        return "no timeline recorded for this job (a launch before dtrain recorded one)"
    if state in ("starting", "running", "detached"):
        return "no phase has ended yet"
    return "the launch ended before its first phase"


def gantt(run: Run, width: int = 1200) -> str:
    """The launch's and the restarts' phases per node on one time axis (seconds after the
    launch began), restarts marked with why."""
    hosts = [h for h in run.nodes if any(x.node == h for x in run.entries)]
    hosts += sorted({x.node for x in run.entries} - set(hosts))
    hosts += [h for h in run.nodes if h not in hosts]
    note = ("" if run.entries else f'<p class="note">{e(no_phases(run.recorded, run.state))}</p>')
    if not hosts:
        return note
    left, lane, top = 230, 26, 22
    plot = width - left - 20
    span = span_of(run)
    rows = len(hosts) + (1 if run.attempts else 0)
    height = top + lane * rows + 30

    def x(t: float) -> float:
        return left + plot * max(t, 0.0) / span

    out = [f'<svg class="gantt" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="phases per node">']
    for t in _ticks(span):
        out.append(f'<line class="grid" x1="{x(t):.1f}" y1="{top}" x2="{x(t):.1f}" y2="{height - 26}"/>'
                   f'<text x="{x(t):.1f}" y="{height - 10}" text-anchor="middle">{t:g}s</text>')
    for i, h in enumerate(hosts):
        y = top + i * lane
        out.append(f'<g class="lane" data-node="{e(h)}"><text x="{left - 8}" y="{y + 17}" text-anchor="end">'
                   f'{e(_label(h, run.names))}</text>')
        for en in sorted((x_ for x_ in run.entries if x_.node == h), key=lambda en: (en.start, en.restart)):
            w = max(plot * en.seconds / span, 1.5)
            what = en.phase if not en.restart else f"restart {en.restart}: {en.phase}"
            out.append(f'<rect class="phase" data-phase="{e(en.phase)}" x="{x(en.start):.1f}" y="{y + 4}" '
                       f'width="{w:.1f}" height="{lane - 8}" rx="2" fill="{COLOURS.get(en.phase, OTHER)}">'
                       f'<title>{e(_label(h, run.names))}: {e(what)} at {en.start:.2f} s, took {en.seconds:.2f} s'
                       f'</title></rect>')
        out.append("</g>")
    if run.attempts:
        y = top + len(hosts) * lane
        out.append(f'<g class="attempts"><text x="{left - 8}" y="{y + 17}" text-anchor="end">attempts</text>')
        for a in run.attempts:
            w = max(plot * (a.end - a.start) / span, 1.5)
            fill = "#4e79a7" if a.how.startswith("job succeeded") else "#e15759" if a.how.startswith("restart") \
                else "#9aa5b1" if a.how == "the log ends" else "#c62828"
            label = f"attempt {a.number}" if w > 70 else f"{a.number}"
            out.append(f'<rect class="attempt" data-attempt="{a.number}" x="{x(a.start):.1f}" y="{y + 4}" '
                       f'width="{w:.1f}" height="{lane - 8}" rx="2" fill="{fill}" fill-opacity="0.35" stroke="{fill}">'
                       f'<title>attempt {a.number}: {a.start:.2f} s to {a.end:.2f} s, {e(a.how)}</title></rect>'
                       f'<text x="{x(a.start) + 4:.1f}" y="{y + 17}">{e(label)}</text>')
        out.append("</g>")
    for r in run.restarts:
        if r.at is None:
            continue
        out.append(f'<g class="restart-mark"><line class="restart" x1="{x(r.at):.1f}" y1="{top - 6}" '
                   f'x2="{x(r.at):.1f}" y2="{height - 26}"/><text x="{x(r.at) + 3:.1f}" y="{top - 8}" '
                   f'fill="#c62828">restart {r.attempt}: {e(_short(r.why))}</text><title>restart {r.attempt} at {r.at:.2f} s: '
                   f'{e(r.why)}</title></g>')
    out.append(f'<line class="axis" x1="{left}" y1="{height - 26}" x2="{left + plot}" y2="{height - 26}"/></svg>')
    phases = list(dict.fromkeys(x_.phase for x_ in sorted(run.entries, key=lambda en: (en.restart, en.start))))
    legend = "".join(f'<span><i style="background:{COLOURS.get(p, OTHER)}"></i>{e(p)}</span>' for p in phases)
    return f'{note}<div class="legend">{legend}</div>' + "".join(out)


def stragglers(steps: Iterable[Step], factor: float = STRAGGLER_FACTOR) -> dict[int, float]:
    """Ranks whose median step time is `factor` above the median of the other ranks' medians:
    rank -> its median, seconds."""
    by: dict[int, list[float]] = {}
    for s in steps:
        if s.seconds is not None:
            by.setdefault(s.rank, []).append(s.seconds)
    med = {r: statistics.median(v) for r, v in by.items()}
    if len(med) < 2:
        return {}
    return {r: m for r, m in med.items()
            if m > factor * statistics.median(v for o, v in med.items() if o != r) > 0}


def step_charts(run: Run, width: int = 400, height: int = 140) -> str:
    """Each rank's step times over the run: one small chart per rank, the same axes for all,
    restarts marked; a rank well above the others stands out."""
    timed = [s for s in run.steps if s.seconds is not None]
    if not timed:
        why = ("the log has no times (a launch before dtrain kept output.times, or a detached job: "
               "its output is on its first node)" if not run.timed else
               f"no rank printed two progress lines matching /{run.pattern}/" if run.pattern else
               "no rank printed two lines")
        return f'<p class="note">no step times: {e(why)}</p>'
    span = span_of(run)
    ymax = max(s.seconds for s in timed) * 1.1 or 1.0
    slow = stragglers(timed)
    left, bottom, pad = 40, 18, 6
    pw, ph = width - left - pad, height - bottom - pad
    figs = []
    for rank in sorted({s.rank for s in timed}):
        mine = [s for s in timed if s.rank == rank]
        nodes = ", ".join(dict.fromkeys(s.node for s in mine))

        def xy(s: Step) -> str:
            return f"{left + pw * s.at / span:.1f},{pad + ph * (1 - s.seconds / ymax):.1f}"  # type: ignore[operator]

        lines = []
        for attempt in sorted({s.attempt for s in mine}):
            pts = " ".join(xy(s) for s in mine if s.attempt == attempt)
            colour = "#c62828" if rank in slow else "#4e79a7"
            lines.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
            if len(mine) <= 100:  # the steps themselves, where they are few enough to tell apart
                lines += [f'<circle cx="{xy(s).split(",")[0]}" cy="{xy(s).split(",")[1]}" r="2" fill="{colour}"/>'
                          for s in mine if s.attempt == attempt]
        marks = "".join(f'<line class="restart" x1="{left + pw * r.at / span:.1f}" y1="{pad}" '
                        f'x2="{left + pw * r.at / span:.1f}" y2="{pad + ph}"/>' for r in run.restarts if r.at is not None)
        med = statistics.median(s.seconds for s in mine)  # type: ignore[type-var]
        cap = f"r{rank} on {nodes}: median {med:.3f} s/step, {len(mine)} step(s)"
        if rank in slow:
            cap += " - slower than the other ranks"
        figs.append(
            f'<figure class="rank{" straggler" if rank in slow else ""}" data-rank="{rank}"><figcaption>{e(cap)}'
            f'</figcaption><svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}">'
            f'<line class="axis" x1="{left}" y1="{pad + ph}" x2="{left + pw}" y2="{pad + ph}"/>'
            f'<line class="axis" x1="{left}" y1="{pad}" x2="{left}" y2="{pad + ph}"/>'
            f'<text x="{left - 4}" y="{pad + 10}" text-anchor="end">{ymax:.2g}s</text>'
            f'<text x="{left - 4}" y="{pad + ph}" text-anchor="end">0</text>'
            f'<text x="{left + pw}" y="{height - 4}" text-anchor="end">{span:.0f}s</text>'
            f'{marks}{"".join(lines)}</svg></figure>')
    what = f"lines matching /{run.pattern}/" if run.pattern else "every line of a rank (no --progress-pattern)"
    return (f'<p class="note">seconds between a rank\'s progress lines ({e(what)}), over the run\'s time '
            f'(0 to {span:.0f} s); dashed: a restart.</p><div class="multiples">{"".join(figs)}</div>')


def _table(header: Sequence[str], rows: Iterable[Sequence[object]], num: Sequence[int] = ()) -> str:
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f'<td{" class=num" if i in num else ""}>{e(c)}</td>' for i, c in enumerate(r))
                   + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def gate_section(run: Run) -> str:
    if not run.gate:
        return '<p class="note">no network gate in this launch (--check-network)</p>'
    top = max([g.gbps for g in run.gate] + [1e-9])
    rows = []
    for g in run.gate:
        colour = {"PASS": "#59a14f", "WARN": "#edc948", "FAIL": "#e15759"}.get(g.status, OTHER)
        bar = (f'<svg width="220" height="14"><rect x="0" y="2" width="{200 * g.gbps / top:.1f}" height="10" '
               f'fill="{colour}"/></svg>')
        rows.append(f'<tr class="gate-node" data-node="{e(g.node)}"><td>{e(_label(g.node, run.names))}</td>'
                    f'<td class="num">{g.gbps:.2f}</td><td>{bar}</td><td>{e(g.status)}</td><td>{e(g.why)}</td></tr>')
    nodes = ("<table><tr><th>node</th><th>Gbit/s</th><th></th><th>status</th><th>why</th></tr>"
             + "".join(rows) + "</table>")
    pairs = _table(("from", "to", "Gbit/s", "error"),
                   ((_label(p.src, run.names), _label(p.dst, run.names), "failed" if p.gbps is None else f"{p.gbps:.2f}",
                     p.error) for p in run.pairs), num=(2,)) if run.pairs else ""
    return nodes + (f"<details><summary>every link measured ({len(run.pairs)})</summary>{pairs}</details>"
                    if pairs else "")


def nccl_section(run: Run) -> str:
    """The network NCCL chose at the first collective (--nccl-check's line among the events)."""
    said = [ln.text for ln in run.events if ln.text.startswith("[launch] NCCL network")]
    return f'<p class="note nccl">{e(said[0].removeprefix("[launch] "))}</p>' if said else ""


def html(run: Run) -> str:
    """The report of a run: one HTML document, nothing to fetch."""
    ok = run.state == "succeeded" or run.exit_code == 0
    end = f'<b class="{"ok" if ok else "bad"}">{e(run.state)}</b>' + (
        "" if run.exit_code is None else f", exit {e(run.exit_code)}") + (f": {e(run.final)}" if run.final else "")
    meta = [f"{e(run.launcher)} on {len(run.nodes)} node(s): " + e(", ".join(_label(h, run.names) for h in run.nodes)),
            f"image <b>{e(run.image)}</b>", f"ended: {end}",
            f"took {_secs(run.duration)} s, {len(run.restarts)} restart(s), {len(run.hangs)} hang(s)"]
    parts = [f"<h1>dtrain job {e(run.name)}</h1>", *(f'<p class="meta">{m}</p>' for m in meta)]
    parts += [f'<p class="note refused">{e(n)}</p>' for n in run.notes]
    parts += ["<h2>Phases per node</h2>", gantt(run)]
    if run.attempts and (run.restarts or len(run.attempts) > 1):
        parts += ["<h2>Attempts and restarts</h2>",
                  _table(("attempt", "from (s)", "to (s)", "how it ended"),
                         ((a.number, _secs(a.start), _secs(a.end), a.how) for a in run.attempts), num=(1, 2))]
    elif run.restarts:  # a log without times
        parts += ["<h2>Restarts</h2>", _table(("restart", "why"), ((r.attempt, r.why) for r in run.restarts))]
    if run.quarantined:
        parts += ["<h2>Quarantined nodes</h2>",
                  _table(("node", "why"), ((_label(h, run.names), why) for h, why in run.quarantined.items()))]
    parts += ["<h2>Step times per rank</h2>", step_charts(run)]
    parts += ["<h2>Network gate</h2>", gate_section(run), nccl_section(run)]
    if run.hangs:
        parts.append("<h2>Hangs</h2>")
        for hg in run.hangs:
            parts.append(f"<details><summary>at {_secs(hg.at)} s: {e(hg.line)}</summary><pre>"
                         f"{e(chr(10).join(hg.dump) or '(no stack dump followed)')}</pre></details>")
    parts += ["<h2>Events</h2>", _table(("at (s)", "event"), ((_secs(ln.at), ln.text) for ln in run.events), num=(0,))
              if run.events else '<p class="note">no events in the log</p>']
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>dtrain report: {e(run.name)}</title><style>{CSS}</style></head><body>"
            + "\n".join(parts) + "</body></html>\n")


# ---------------------------------------------------------------- the store (I/O)


def load(name: str | None) -> Run:
    """The job `name` (None: the latest) from the store; a detached job's restarts read from its
    first node first, as `dtrain status --job` does. LaunchError naming it where there is none."""
    from dtrain.launch.jobs import store
    from dtrain.launch.errors import LaunchError

    job = store.load_job(name)
    if job.get("detached"):
        import io

        with contextlib.suppress(LaunchError):
            store.node_logs(job, False, out=io.StringIO())
        job = store.load_job(job["name"])
    d = store.job_dir(job["name"])

    def text(p: Path) -> str:
        try:
            return p.read_text(errors="replace")
        except OSError:
            return ""

    return read(job, text(d / "output.log"), text(d / "output.times"))


def default_output(name: str) -> Path:
    return Path(f"{name}-report.html")


# The report's first line: how `dtrain report` knows a file it may replace (dtrain/outfile.py).
# A comment before the DOCTYPE is allowed (HTML: comments and whitespace may precede it).
MARKER = "<!-- GENERATED by `dtrain report`: a later `dtrain report` replaces this file -->\n"
OUTPUT = outfile.marked(MARKER)


def write(run: Run, output: Path, force: bool = False, flag: str = "--output") -> Path:
    """The report written to `output` as dtrain/outfile.py writes (no link followed, no file
    dtrain did not write replaced without force, atomically): a new file 0600 (the job's store is
    private), a replaced one keeps its mode. BadValue naming `flag` where it cannot be written."""
    return outfile.write(output, MARKER + html(run), flag=flag, kind=OUTPUT, force=force, mode=0o600)
