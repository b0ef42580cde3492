"""The one table printer: rows (rows[0] the header) as aligned text, or as Markdown for
docs/benchmarks.md. Used by build, push, doctor, status and the benches."""

from __future__ import annotations

from collections.abc import Sequence


def _widths(rows: Sequence[Sequence[str]]) -> list[int]:
    return [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]


def text(rows: Sequence[Sequence[str]], *, rule: bool = False) -> str:
    """Columns two spaces apart, no trailing spaces; rule: a dashed line under the header."""
    widths = _widths(rows)
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    if rule:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown(rows: Sequence[Sequence[str]]) -> str:
    widths = _widths(rows)
    lines = ["| " + " | ".join(x.ljust(w) for x, w in zip(r, widths)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)
