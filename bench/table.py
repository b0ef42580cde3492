"""The benchmarks' output: a Markdown table, ready for docs/benchmarks.md."""

from __future__ import annotations


def markdown(rows: list[tuple[str, ...]]) -> str:
    """rows[0] is the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(x.ljust(w) for x, w in zip(r, widths)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)
