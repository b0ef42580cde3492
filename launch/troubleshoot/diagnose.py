"""Match a job log against the troubleshooting checklist (`dtrain diagnose LOG`).

    findings = diagnose(text)          # pure: str -> list[Finding]
    print(format_report(findings))
    findings = diagnose_file(path)     # DiagnoseError if the file cannot be read

One finding per checklist entry whose signatures match, holding every matching line with its
line number and, where the line says, its rank, local rank and node. Findings come in the order
of their first line, except catch-all entries ("a rank exited non-zero"), which come after all
specific causes.

Lines are attributed from these prefixes (nested prefixes are read left to right):

    [node-2 r3] ...                    dtrain's launcher: node and global rank
    [1,3]<stderr>: ...                 Open MPI --tag-output: global rank
    [3]<stderr>: ...                   horovodrun (Gloo): global rank
    [default1]: ...                    torchrun --tee/--redirects: local rank
    [rank3]: ...                       PyTorch's traceback prefix: global rank
    node-2:1234:1290 [1] NCCL ...      NCCL: node
    [node-2:01234] ...                 Open MPI process prefix: node

and from named groups in a signature (`mpirun noticed that process rank 3 ... on node node-2`).

A hang's headline (`dtrain launch --hang-timeout`) followed by its stack dump gets a note: the
ranks the stacks show not waiting in a collective (launch/analysis/stacks.py, as the supervisor
names them), whatever the headline said (an older dtrain named the ranks behind by progress).

Speed: each signature has a literal "needle" (the longest literal run it requires); the text
is scanned for each distinct needle with str.find, in C, and only lines holding a needle are
matched against that needle's regexes in Python. This beats one regex joining all signatures
(which CPython tries alternative by alternative at every position) by more than 10x: a
100k-line log takes about 0.3 s (bench/bench_diagnose.py).
"""

from __future__ import annotations

import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from dtrain.terminal import clean
from dtrain.launch.troubleshoot.checklist import ENTRIES, Entry
from dtrain.launch.jobs import nccl_net
from dtrain.launch.analysis import stacks
from dtrain.launch.jobs.runplan import MPI_OUTPUT_TAG

MAX_SHOWN = 3
_LINE_WIDTH = 200  # log lines longer than this are clipped in the report
_WRAP = 100  # prose is wrapped at this width


class DiagnoseError(Exception):
    """A log that cannot be read: one readable message, no traceback."""


@dataclass(frozen=True)
class Line:
    number: int  # 1-based, as editors count
    text: str
    rank: int | None = None
    local_rank: int | None = None
    node: str | None = None

    def where(self) -> str:
        parts = []
        if self.node is not None:
            parts.append(self.node)
        if self.rank is not None:
            parts.append(f"rank {self.rank}")
        if self.local_rank is not None:
            parts.append(f"local rank {self.local_rank}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Finding:
    entry: Entry
    lines: tuple[Line, ...]  # every matching line, in log order, each once
    notes: tuple[str, ...] = ()  # what the log tells beyond the lines: a hang's culprits, from its stacks

    @property
    def first_line(self) -> int:
        return self.lines[0].number

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(sorted({ln.rank for ln in self.lines if ln.rank is not None}))

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({ln.node for ln in self.lines if ln.node is not None}))


# --------------------------------------------------------------------------------------------
# compiled once

try:  # Python >= 3.11
    from re import _parser as _sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre_parse  # type: ignore[no-redef]

MIN_NEEDLE = 5


def needle(pattern: re.Pattern[str]) -> str:
    """The longest literal every match of `pattern` contains (top-level literal run).

    The scan looks for these with str.find, which is far faster in CPython than one regex
    joining every signature. A signature without a literal of MIN_NEEDLE characters is refused
    (split an alternation into separate signatures instead).
    """
    best = cur = ""
    for op, av in _sre_parse.parse(pattern.pattern, pattern.flags):
        if op is _sre_parse.LITERAL and not pattern.flags & re.IGNORECASE:
            cur += chr(av)
        else:
            best, cur = max(best, cur, key=len), ""
    best = max(best, cur, key=len)
    if len(best) < MIN_NEEDLE:
        raise ValueError(f"signature {pattern.pattern!r} has no literal of {MIN_NEEDLE}+ "
                         "characters outside groups; rewrite it")
    return best


_SIGNATURES: list[tuple[Entry, re.Pattern[str]]] = [
    (e, sig) for e in ENTRIES for sig in e.signatures
]
# needle -> indexes into _SIGNATURES of the signatures that contain it
_NEEDLES: dict[str, list[int]] = {}
for _i, (_, _sig) in enumerate(_SIGNATURES):
    _NEEDLES.setdefault(needle(_sig), []).append(_i)

# (prefix, final): a final prefix starts the message itself, so reading stops after it.
_PREFIXES: tuple[tuple[re.Pattern[str], bool], ...] = (
    (re.compile(r"\[(?P<node>[A-Za-z0-9][\w.-]*) r(?P<rank>\d{1,9})\] ?"), False),        # dtrain
    (re.compile(r"\[\d+,(?P<rank>\d{1,9})\]<(?:stdout|stderr|stddiag)>: ?"), False),       # --tag-output
    (re.compile(r"\[(?P<rank>\d{1,9})\]<(?:stdout|stderr)>: ?"), False),                   # horovodrun
    (re.compile(r"\[rank(?P<rank>\d{1,9})\]: ?"), False),                                  # PyTorch
    (re.compile(r"\[(?!rank\d)[A-Za-z_]+(?P<local_rank>\d{1,9})\]: ?"), False),             # torchrun
    (re.compile(r"\[(?P<node>[A-Za-z0-9][\w.-]*):\d+\] "), True),                     # [host:pid]
    (re.compile(r"(?:\[[^\]]*\] )?(?P<node>[A-Za-z0-9][\w.-]*):\d+:\d+ \[\d+\] (?=.*NCCL)"),
     True),                                                                        # NCCL
)


def _scope(text: str) -> tuple[int | None, int | None, str | None]:
    """(rank, local_rank, node) from the line's prefixes, read left to right."""
    rank = local_rank = node = None
    pos = 0
    while True:
        for p, final in _PREFIXES:
            m = p.match(text, pos)
            if m is None:
                continue
            g = m.groupdict()
            if g.get("rank") is not None and rank is None:
                rank = int(g["rank"])
            if g.get("local_rank") is not None and local_rank is None:
                local_rank = int(g["local_rank"])
            if g.get("node") is not None and node is None:
                node = g["node"]
            if final or m.end() == pos:
                return rank, local_rank, node
            pos = m.end()
            break
        else:
            return rank, local_rank, node


def _candidates(text: str) -> dict[int, set[int]]:
    """line start offset -> signatures whose needle occurs on that line."""
    cand: dict[int, set[int]] = {}
    find, rfind = text.find, text.rfind
    for lit, sigs in _NEEDLES.items():
        i = find(lit)
        while i != -1:
            start = rfind("\n", 0, i) + 1
            cand.setdefault(start, set()).update(sigs)
            end = find("\n", i)
            if end == -1:
                break
            i = find(lit, end + 1)  # the rest of this line is already a candidate
    return cand


# `mpirun --tag-output` tags every chunk a rank writes; unbuffered output splits a line into
# chunks, so tags land mid-line: `KeyError[1,1]<stderr>:: [1,1]<stderr>:'X'`. Only the first
# tag of a line is kept. Seen in real failures on the simulated cluster.
_MID_TAG = re.compile(r"(?<=[^\n])" + MPI_OUTPUT_TAG)


def diagnose(text: str) -> list[Finding]:
    """Every checklist entry the log shows, ordered as described in the module docstring."""
    text = _MID_TAG.sub("", text)
    cand = _candidates(text)
    found: dict[str, list[Line]] = {}
    number, pos = 1, 0
    for start in sorted(cand):
        number += text.count("\n", pos, start)
        pos = start
        end = text.find("\n", start)
        raw = text[start:end if end != -1 else len(text)].rstrip("\r")
        base: tuple[int | None, int | None, str | None] | None = None
        for si in sorted(cand[start]):
            entry, sig = _SIGNATURES[si]
            sm = sig.search(raw)
            if sm is None:
                continue
            lines = found.setdefault(entry.id, [])
            if lines and lines[-1].number == number:
                continue  # a second signature of the same entry on the same line
            if base is None:
                base = _scope(raw)
            rank, local_rank, node = base
            g = sm.groupdict()
            if g.get("rank") is not None:
                rank = int(g["rank"])
            if g.get("local_rank") is not None:
                local_rank = int(g["local_rank"])
            if g.get("node") is not None:
                node = g["node"]
            lines.append(Line(number, raw, rank, local_rank, node))
    by_id = {e.id: e for e in ENTRIES}
    findings = [Finding(by_id[i], tuple(lines), hang_notes(text, lines) if i == "hang" else
                        net_notes(text) if i in NET_ENTRIES else ())
                for i, lines in found.items()]
    findings.sort(key=lambda f: (f.entry.catch_all, f.first_line))
    return findings


# The entries about NCCL's network: their finding says what NCCL chose (launch/jobs/nccl_net.py)
NET_ENTRIES = ("efa-unused", "efa-not-selected", "efa-fewer")


def net_notes(text: str) -> tuple[str, ...]:
    """What NCCL's INIT/NET lines in the log say it chose (the last word where ranks differ),
    and, where aws-ofi-nccl named the instance type (`Running on p4d.24xlarge platform`), the
    likely cause against that type's EFA interfaces; each note starts with `nccl: `."""
    net = nccl_net.parse(text.splitlines())
    if not (net.network or net.missing or net.ofi_error):
        return ()
    said = net.said()
    plugin = f"; plugin {net.plugin}" if net.plugin and net.plugin not in said else ""
    out = [f"nccl: NCCL's network: {said}{plugin}"]
    if net.platform:
        from dtrain.launch.infra.instance_types import efa_count

        efa = efa_count(net.platform)
        v = nccl_net.verdict(net, nccl_net.Expect(net.platform, efa, devices=-1))  # a log: devices unknown
        if not v.ok:
            out.append(f"nccl: on {net.platform} ({v.expected}): likely {v.why}; fix: {v.fix}")
    return tuple(out)


def hang_notes(text: str, lines: list[Line]) -> tuple[str, ...]:
    """For each hang headline (dtrain launch --hang-timeout) and the stack dump after it (the
    lines up to the next `[launch]` one), the culprits the stacks name (launch/analysis/stacks.py): the ranks not
    waiting in a collective; where every rank waits, that the progress counts tell."""
    all_lines = text.splitlines()
    out = []
    for ln in lines:
        if "(--hang-timeout)" not in ln.text:  # the attempt's end, a watchdog's line: no dump follows
            continue
        dump = []
        for raw in all_lines[ln.number:]:
            if raw.startswith("[launch]"):
                break
            dump.append(raw)
        procs = stacks.parse(dump)
        if not procs:
            continue
        nodes = {p.rank: p.node for p in procs if p.rank is not None}
        v = stacks.verdict(stacks.places(procs))
        fields = stacks.event_fields(v, [nodes.get(r, "?") for r in range(max(nodes, default=-1) + 1)])
        said = stacks.culprit_text(fields) or (
            f"{stacks.fallback_text(fields)}: the ranks the hang line names" if v.read else "no rank's stack read")
        out.append(f"line {ln.number}: {said}")
    return tuple(out)


TAIL_BYTES = 8 << 20  # a failure's signature is near the end: only the last 8 MiB is read


def read_tail(p: Path, limit: int = TAIL_BYTES) -> bytes:
    """At most the last `limit` bytes of a file; of a pipe or device (no end to seek to), the
    first `limit` bytes: never reads forever (/dev/zero), never waits (opened O_NONBLOCK: a FIFO
    or /proc/kmsg reads as empty). Memory: `limit` bytes, whatever the file's size."""
    import os

    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        try:
            end = f.seek(0, 2)
            if end > limit:
                f.seek(end - limit)
            else:
                f.seek(0)
        except OSError:
            pass
        try:
            return f.read(limit) or b""
        except BlockingIOError:
            return b""


def log_path(text: str) -> Path | None:
    """`dtrain diagnose LOG|JOB|latest`: the log file a user names, checked to be a regular file
    (a FIFO would block, a device never end), or None where the text is a job's name (no such
    file, a job name's syntax). DiagnoseError, one line, for anything else."""
    import os

    from dtrain import values

    name = text != "latest" and values.NAME.fullmatch(text) and len(text) <= values.NAME_MAX
    try:
        present = os.path.lexists(text)
    except (OSError, ValueError):
        present = False
    if text == "latest" or (name and not present):
        return None
    try:
        return values.local_path("diagnose", text, "file", "a job's output (or a job name from dtrain status)")
    except values.BadValue as e:
        raise DiagnoseError(str(e)) from None


def looks_like_file(text: str) -> bool:
    """A name that `dtrain diagnose` took for a job's but that reads as a file's: a `/` or a log's
    suffix (.log, .txt, .out, .err)."""
    return "/" in text or text.lower().endswith((".log", ".txt", ".out", ".err"))


def diagnose_file(path: str | Path) -> list[Finding]:
    import os

    from dtrain import values

    p = Path(path)
    try:
        mode = os.stat(p).st_mode
        if values.file_kind(mode) != "a regular file":
            raise DiagnoseError(f"{p}: is {values.file_kind(mode)}, not a log file")
        data = read_tail(p)
    except FileNotFoundError:
        raise DiagnoseError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise DiagnoseError(f"{p}: is a directory, not a log file") from None
    except PermissionError:
        raise DiagnoseError(f"{p}: permission denied") from None
    except OSError as e:
        raise DiagnoseError(f"{p}: cannot read: {e.strerror or e}") from None
    if not data:
        raise DiagnoseError(f"{p}: is empty: no output to diagnose")
    # Logs mix encodings and binary noise; never fail on a byte.
    return diagnose(data.decode("utf-8", errors="replace"))


# --------------------------------------------------------------------------------------------
# report

NO_MATCH = """\
No known failure signature matched. Next steps:
  1. Run `dtrain doctor` on the job's nodes: most failures are visible before a job starts.
  2. Rerun with more output: `-x NCCL_DEBUG=INFO`; for Open MPI also
     `--mca btl_base_verbose 30 --mca oob_base_verbose 10` (and `--debug-daemons` if mpirun
     never starts the ranks).
  3. Read `docker logs` of the node containers: sshd writes there why it refused a connection.
  4. If the job ran but seemed slow, read the `throughput` entry.
  See docs/troubleshooting.md for every known failure."""


def _clip(s: str) -> str:
    return s if len(s) <= _LINE_WIDTH else s[: _LINE_WIDTH - 3] + "..."


def _ranges(nums: tuple[int, ...]) -> str:
    out: list[str] = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ",".join(out)


def format_report(findings: list[Finding]) -> str:
    if not findings:
        return NO_MATCH + "\n"
    n = len(findings)
    out = [f"{n} known failure{'s' if n != 1 else ''} matched "
           "(specific causes first, in log order):", ""]
    for i, f in enumerate(findings, 1):
        e = f.entry
        out.append(f"{i}. [{e.id}] {e.title}")
        for ln in f.lines[:MAX_SHOWN]:
            where = ln.where()
            out.append(f"   line {ln.number}{f' ({where})' if where else ''}: "
                       f"{_clip(ln.text.strip())}")
        extra = len(f.lines) - MAX_SHOWN
        scope = []
        if f.ranks:
            scope.append(f"ranks {_ranges(f.ranks)}")
        if f.nodes:
            scope.append(f"nodes {', '.join(f.nodes)}")
        if extra > 0:
            out.append(f"   ... and {extra} more matching line{'s' if extra != 1 else ''}"
                       f"{' (' + '; '.join(scope) + ')' if scope else ''}")
        elif len(scope) and len(f.lines) > 1:
            out.append(f"   ({'; '.join(scope)})")
        for note in f.notes:
            out.append(_clip(f"   {note}" if note.startswith("nccl: ") else f"   stacks: {note}"))
        out.append(_wrap("cause", e.cause))
        out.append(_wrap("fix", e.fix))
        if e.doctor_checks:
            out.append(f"   check: dtrain doctor ({', '.join(e.doctor_checks)})")
        out.append(f"   more:  docs/troubleshooting.md#{e.id}  {e.source[0]}")
        out.append("")
    return clean("\n".join(out), lines=True)  # the log's lines quoted: a job's words, no terminal control


def _wrap(label: str, md: str) -> str:
    head = f"   {label + ':':<7}"
    return textwrap.fill(_plain(md), width=_WRAP, initial_indent=head,
                         subsequent_indent=" " * len(head), break_on_hyphens=False,
                         break_long_words=False)


_MD_LINK = re.compile(r"\[([^\]]+)\]\(#[^)]+\)")


def _plain(md: str) -> str:
    """Markdown to terminal text: drop links' targets and emphasis."""
    return _MD_LINK.sub(r"\1", md).replace("**", "")


def main(argv: list[str] | None = None) -> int:
    """`python -m dtrain.launch.troubleshoot.diagnose LOG`: exit 0 when nothing matched, 1 on findings, 2 on error."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m dtrain.launch.troubleshoot.diagnose LOG", file=sys.stderr)
        return 2
    try:
        findings = diagnose_file(args[0])
    except DiagnoseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(format_report(findings))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
