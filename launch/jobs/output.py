"""A job's output: each line prefixed with the node and global rank that wrote it."""

from __future__ import annotations

import codecs
import re
from typing import Callable, Iterator, Protocol, Sequence

from dtrain.launch.jobs import runplan

# A rank's line as the user reads it, as prefix_line and MpiOutput write it: `[node-2 r3] text`
# (hostname, global rank, text). Render (first steps) and progress (hangs) read it back. A rank
# has at most 9 digits, here and in every pattern that reads one back (stacks, report, diagnose):
# a job's line with more is text, never an int() of 5000 digits (issue 47).
RANK_LINE = re.compile(r"^\[([^\]\s]+) r(\d{1,9})\] ?(.*)$")


_NEWLINE = re.compile(r"\r\n|\r|\n")  # what Python's text mode takes for a line's end


def read_lines(read: Callable[[int], bytes], size: int = 65536) -> Iterator[list[str]]:
    """The lines of a byte stream, as each read (read(size): b"" at its end) brings them: a
    list per read, so that a reader writes them out at once (one write and one flush for many
    lines, where a line each cost the launcher most of its time on chatty output). Lines end as
    in text mode (\\r\\n, \\r, \\n; a \\r last is held, it may be half of \\r\\n); UTF-8, bad bytes
    replaced; the last unfinished line comes at the end."""
    decode = codecs.getincrementaldecoder("utf-8")("replace").decode
    rest = ""
    while True:
        data = read(size)
        text = rest + decode(data, final=not data)
        if not data:
            lines = _NEWLINE.split(text)
            if lines[-1] == "":
                lines.pop()
            if lines:
                yield lines
            return
        cut = len(text) - 1 if text.endswith("\r") else len(text)
        lines = _NEWLINE.split(text[:cut])
        rest = lines.pop() + text[cut:]
        if lines:
            yield lines


class _Facts(Protocol):
    hostname: str

    @property
    def node(self): ...


def rank_nodes(facts: Sequence[_Facts]) -> list[str]:
    """Global rank -> hostname, as `--map-by slot` fills the -H list in order."""
    out = []
    for f in facts:
        out += [f.hostname] * f.node.slots
    return out


def prefix_line(line: str, *, default_node: str, torch_base: int) -> str:
    """torchrun's '[default1]:text' -> '[node-2 r5] text' (the node's first global rank + local
    rank); other lines get the node. mpirun's output goes through MpiOutput."""
    if m := re.match(r"^\[default(\d{1,9})\]:(.*)$", line):
        return f"[{default_node} r{torch_base + int(m.group(1))}] {m.group(2)}"
    return f"[{default_node}] {line}"


class MpiOutput:
    """Turns tagged mpirun lines into `[node r<rank>] text` lines: tagged by
    launch/node/rank_output.py (each rank's lines), or by Open MPI's --tag-output (each chunk).

    A rank's unfinished line goes tagged without its newline (a pause in it; a line longer than
    a packet), so segments of different ranks share one physical line:
    `[1,2]<stdout>:loss 0.3[1,1]<stdout>:loss 0.4` then `[1,2]<stdout>: step 2`. Each tagged
    segment before the last one of a line is an unfinished line of its rank's stream (stdout,
    stderr): kept until that stream's newline arrives. Two tags on one segment (horovodrun adds --tag-output's to
    rank_output.py's) are one: the first is an empty unfinished line."""

    _TAG = re.compile(runplan.MPI_OUTPUT_TAG)

    def __init__(self, ranks: list[str], default_node: str):
        self.ranks, self.default_node = ranks, default_node
        self.pending: dict[tuple[int, str], str] = {}  # (rank, stream): its unfinished line

    def _fmt(self, rank: int, text: str) -> str:
        node = self.ranks[rank] if rank < len(self.ranks) else "?"
        return f"[{node} r{rank}] {text}"

    def feed(self, line: str) -> list[str]:
        parts = self._TAG.split(line)  # [before, rank, stream, text, rank, stream, text, ...]
        out = [f"[{self.default_node}] {parts[0]}"] if parts[0] or len(parts) == 1 else []
        segments = list(zip(parts[1::3], parts[2::3], parts[3::3]))
        for i, (rank_s, stream, text) in enumerate(segments):
            key = (int(rank_s), stream)
            text = self.pending.pop(key, "") + text
            if i < len(segments) - 1:
                self.pending[key] = text  # no newline yet for this rank's stream
            elif text or i == 0:
                out.append(self._fmt(key[0], text))
        return out

    def flush(self) -> list[str]:
        out = [self._fmt(r, t) for (r, _), t in sorted(self.pending.items())]
        self.pending.clear()
        return out
