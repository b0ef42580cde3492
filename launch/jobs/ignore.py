"""git's ignore-file rules (.gitignore, .dtrainignore) with matching time bounded by construction.

A pattern becomes one Python regex whose every wildcard but the last of a path component is
matched atomically at its leftmost fit (CPython's fnmatch does the same for `*`): a `*` inside a
component and a `**` across components are each tried once, so a name is matched in time about
its length times the pattern's, never the backtracking of `[^/]*[^/]*...` (a line of 14 stars,
pathspec's regex: over 20 s for one 20-character name). Runs of `*` are collapsed first (git's
rule: `**` is special only as a whole path component, other runs are one `*`).

What an ignore file may hold is bounded too: MAX_BYTES, MAX_LINES, MAX_LINE_CHARS per file;
`Budget` caps the patterns of all the files of one tree. Over a bound: LaunchError, one line
naming the file (and line) and what to do.
"""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass
from typing import Iterable

from dtrain.launch.errors import LaunchError

MAX_BYTES = 1 << 20  # an ignore file over 1 MiB is refused
MAX_LINES = 2000  # patterns of one file (GitHub's largest templates have a few hundred)
MAX_LINE_CHARS = 1024
MAX_TREE_PATTERNS = 5000  # patterns of all the ignore files of one tree (about 0.5 ms each to compile)


@dataclass(frozen=True)
class Pattern:
    regex: re.Pattern[str]
    negate: bool
    text: str  # the line as written (without the `!`)
    literal: bool  # no wildcard: `!NAME` names one path


@dataclass(frozen=True)
class Rules:
    patterns: tuple[Pattern, ...] = ()

    def check(self, rel: str) -> bool | None:
        """rel (a file, or a directory ending in /): True ignored, False re-included (`!`),
        None no line matched. The last matching line wins."""
        for p in reversed(self.patterns):
            if p.regex.match(rel):
                return not p.negate
        return None

    def match(self, rel: str) -> bool:
        return bool(self.check(rel))


class Budget:
    """Patterns left for one tree's ignore files (MAX_TREE_PATTERNS)."""

    def __init__(self, most: int = MAX_TREE_PATTERNS) -> None:
        self.left = most

    def take(self, n: int, source: str) -> None:
        self.left -= n
        if self.left < 0:
            raise LaunchError(f"{source}: the ignore files of this directory hold over {MAX_TREE_PATTERNS} patterns "
                              "in all; use fewer, broader lines (a directory/ instead of its files)")


_counter = itertools.count()


def _class(glob: str, i: int) -> tuple[str, int] | None:
    """The bracket expression at glob[i] ('[') as a regex that never matches '/', and the index
    after it; None when it is not closed (then '[' is a plain character, as in git)."""
    j = i + 1
    negate = j < len(glob) and glob[j] in "!^"
    if negate:
        j += 1
    body = ""
    first = True
    while j < len(glob):
        c = glob[j]
        if c == "]" and not first:
            inner = body or r"\s\S"
            return (f"[^/{inner}]" if negate else f"(?!/)[{inner}]"), j + 1
        if c == "\\" and j + 1 < len(glob):
            body += re.escape(glob[j + 1])
            j += 2
        elif c == "-" and body and j + 1 < len(glob) and glob[j + 1] != "]":
            body += "-"
            j += 1
        else:
            body += "\\" + c if c in "\\^[]" else c
            j += 1
        first = False
    return None


def _pieces(seg: str) -> list[str]:
    """One path component's glob -> regex pieces split at its `*` runs (escapes, `?`, classes)."""
    pieces = [""]
    i = 0
    while i < len(seg):
        c = seg[i]
        if c == "*":
            while i < len(seg) and seg[i] == "*":
                i += 1
            pieces.append("")
            continue
        if c == "\\" and i + 1 < len(seg):
            pieces[-1] += re.escape(seg[i + 1])
            i += 2
        elif c == "?":
            pieces[-1] += "[^/]"
            i += 1
        elif c == "[" and (cls := _class(seg, i)) is not None:
            pieces[-1] += cls[0]
            i = cls[1]
        else:
            pieces[-1] += re.escape(c)
            i += 1
    return pieces


def _atomic(body: str) -> str:
    """body matched once, at its leftmost fit, and never retried (lookahead + backreference)."""
    g = f"g{next(_counter)}"
    return f"(?=(?P<{g}>{body}))(?P={g})"


def _segment(seg: str) -> str:
    """A component's regex: every `*` but the last atomic (leftmost fit), the last one greedy
    within the component (it must reach the component's end, which follows)."""
    pieces = _pieces(seg)
    if len(pieces) == 1:
        return pieces[0]
    out = "(?=[^/])" + pieces[0] + "".join(_atomic(f"[^/]*?{p}") for p in pieces[1:-1])
    return out + f"[^/]*{pieces[-1]}"


def _split(text: str) -> list[str]:
    """Components of a pattern at its unescaped slashes."""
    parts, cur, i = [], "", 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            cur += text[i:i + 2]
            i += 2
        elif text[i] == "/":
            parts.append(cur)
            cur = ""
            i += 1
        else:
            cur += text[i]
            i += 1
    return [*parts, cur]


def translate(text: str) -> str:
    """A pattern (no `!`, trailing spaces gone) as the regex rel is matched against (re.match)."""
    dir_only = text.endswith("/")
    text = text.rstrip("/")
    if not text:
        return r"(?!)"  # `/` alone: nothing (as git)
    segs = [s for s in _split(text) if s != ""] if text else []
    anchored = "/" in text.lstrip("/") or text.startswith("/")
    segs = [("**" if re.fullmatch(r"\*\*+", s) else s) for s in segs]
    if not anchored:
        segs = ["**", *segs]
    segs = [s for k, s in enumerate(segs) if not (s == "**" and k and segs[k - 1] == "**")]
    if not segs:
        return r"(?!)"
    chunks: list[list[str]] = [[]]
    for s in segs:
        if s == "**":
            chunks.append([])
        else:
            chunks[-1].append(s)
    out = "^"
    for k, chunk in enumerate(chunks):
        body = "/".join(_segment(s) for s in chunk)
        last = k == len(chunks) - 1
        if k == 0:
            out += body
            continue
        sep = "/" if chunks[0] or k > 1 else ""  # after a chunk: its slash
        if not chunk:
            if last:  # a trailing /**: everything inside (not the directory itself)
                out += sep + ".+" + ("/" if dir_only else "")
            continue
        out += sep + _atomic(f"(?:.*?/)??{body}(?=/|\\Z)")
    if chunks[-1]:
        out += "/" if dir_only else r"(?:/|\Z)"
    return out


def parse_line(line: str) -> tuple[str, bool] | None:
    """An ignore file's line -> (pattern, negated), or None (blank, comment). git's rules:
    trailing spaces go unless escaped; `\\#` and `\\!` start a pattern with # or !."""
    line = line.rstrip("\r\n")
    while line.endswith(" ") and not line.endswith("\\ "):
        line = line[:-1]
    if not line or line.startswith("#"):
        return None
    negate = line.startswith("!")
    if negate:
        line = line[1:]
    if line.startswith(("\\#", "\\!")):
        line = line[1:]
    return (line, negate) if line else None


@functools.lru_cache(maxsize=4096)
def _compiled(text: str) -> re.Pattern[str]:
    return re.compile(translate(text), re.DOTALL)


def compile_lines(lines: Iterable[str], source: str = "(rules)", budget: Budget | None = None) -> Rules:
    """An ignore file's lines -> Rules; LaunchError naming source:LINE for a line over MAX_LINE_CHARS,
    or for more than MAX_LINES patterns (or the tree's budget spent), before any is compiled."""
    parsed = []
    for n, line in enumerate(lines, 1):
        if len(line) > MAX_LINE_CHARS:
            raise LaunchError(f"{source}:{n}: a line over {MAX_LINE_CHARS} characters; shorten or remove it")
        one = parse_line(line)
        if one is None:
            continue
        if len(parsed) >= MAX_LINES:
            raise LaunchError(f"{source}:{n}: more than {MAX_LINES} patterns; use fewer, broader lines "
                              "(a directory/ instead of its files)")
        parsed.append(one)
    if budget is not None:
        budget.take(len(parsed), source)
    return Rules(tuple(Pattern(_compiled(text), negate, text, not any(c in text for c in "*?[\\"))
                       for text, negate in parsed))


def read_rules(path, budget: Budget | None = None) -> Rules:
    """An ignore file from disk (at most MAX_BYTES; a FIFO or device is not opened by the caller)."""
    with open(path, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise LaunchError(f"{path}: an ignore file over {MAX_BYTES >> 20} MiB; use fewer, broader lines "
                          "(a directory/ instead of its files)")
    return compile_lines(data.decode(errors="replace").splitlines(), str(path), budget)
