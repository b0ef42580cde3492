"""Text from a node or a job, made safe to print on a terminal (issue 47).

A node's text (a supervisor's reason, a hostname it names, a job's line) can hold terminal
control: an OSC sequence retitles the window (`ESC ] 0 ; pwned BEL`), a CSI sequence clears the
screen or moves the cursor over what dtrain printed (`ESC [ 2 J`), C1 controls (`0x9b` is an
8-bit CSI), a carriage return overwrites a line, bidirectional overrides reorder it. `clean`
removes all of them; every print of node-sent text goes through it (docs/launch.md "What a node
sends back"). colour=True keeps SGR colour sequences only (`ESC [ 31 m`): a job's own lines keep
their colours, nothing else of them reaches the terminal.
"""

from __future__ import annotations

import re

# One alternation, longest forms first: 7-bit and 8-bit CSI, OSC (to BEL or ST, or the end),
# DCS/SOS/PM/APC strings, any other ESC + one byte, a lone ESC; C0 but \t and \n, DEL, C1,
# the bidirectional overrides and isolates.
_CONTROL = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|(?:\x1b[PX^_]|[\x90\x98\x9e\x9f])[^\x1b\x9c]*(?:\x1b\\|\x9c)?"
    r"|\x1b[ -~]?"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_SGR = re.compile(r"\x1b\[[0-9;:]*m")


def _keep_colour(m: re.Match) -> str:
    return m.group(0) if _SGR.fullmatch(m.group(0)) else ""


def clean(text: object, *, colour: bool = False, lines: bool = False) -> str:
    """text (str() of any value) without terminal control; colour: SGR colour sequences kept;
    lines: newlines kept (dtrain's own line breaks), else each is a space."""
    s = text if isinstance(text, str) else str(text)
    if not lines and "\n" in s:
        s = s.replace("\n", " ")
    if _CONTROL.search(s) is None:  # the common case: one scan, no copy
        return s
    return _CONTROL.sub(_keep_colour if colour else "", s)


def shown(text: str) -> str:
    """text with every character that is not printable (escape sequences, carriage returns,
    bidirectional overrides) written as a visible escape (\\x1b, \\u202e); a tab stays. For
    output the user asked to see as it is (`dtrain exec`): nothing in it can move the cursor,
    retitle the window or hide text, and nothing is silently dropped either."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == "\t" else
                   (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}" if ord(c) < 0x10000
                    else f"\\U{ord(c):08x}") for c in text)
