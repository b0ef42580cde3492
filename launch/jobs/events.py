"""What a node sends back, read with a schema (issue 47): the supervisor's events
(`dtrain-supervisor {json}` lines, launch/node/supervise.py, run.sh, host/phase.sh) and its
state.json.

The job runs as root beside the supervisor's files, and its own lines share the supervisor's
output: anything in them may be forged. Every event kind has its fields here (KINDS: the one
list; a new kind is one line); a field has its type (strict: no "5" for 5, no null for a list,
no true for 1), a bound (times finite, within MAX_SECONDS or MAX_EPOCH; counts within
MAX_COUNT; text within MAX_TEXT characters; lists within MAX_ITEMS) and a line within
MAX_LINE characters of JSON without NaN/Infinity. An event that fails is skipped by its reader
with one warning line (`problem`); a state.json that fails is one error naming the node's
file. Fields a kind does not declare are dropped: only checked values go on.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Mapping

from dtrain import contract
from dtrain.terminal import clean

MAX_LINE = 1 << 20  # characters of an event line (a hang's event names every culprit rank)
MAX_TEXT = 16384  # characters of a reason, a stack's frame
MAX_NAME = 255  # characters of a hostname, a phase
MAX_ITEMS = 65536  # items of a list or a mapping (ranks of the largest job)
MAX_COUNT = 10**6  # attempts, ranks, samples, lines
MAX_SECONDS = 10 * 365 * 86400  # a duration: ten years
MAX_EPOCH = 4102444800  # a time (epoch seconds): up to 2100-01-01
MAX_EXIT = 255  # an exit code: 0..255, or -N for a signal

# The schema is plain functions (the standard library only: the supervisor imports this module
# on the node, through supervision.Render). A check takes a value and returns it, or raises
# ValueError saying what it should be.
Check = Callable[[Any], Any]


def whole(lo: int, hi: int) -> Check:
    def check(v: Any) -> int:
        if type(v) is not int or not lo <= v <= hi:
            raise ValueError(f"should be a whole number {lo}..{hi}")
        return v
    return check


def number(lo: float, hi: float) -> Check:
    def check(v: Any) -> float:
        if type(v) not in (int, float) or not lo <= v <= hi or (type(v) is float and not math.isfinite(v)):
            raise ValueError(f"should be a number {lo:g}..{hi:g}")
        return float(v)
    return check


def text(most: int) -> Check:
    def check(v: Any) -> str:
        if type(v) is not str or len(v) > most:
            raise ValueError(f"should be text, at most {most} characters")
        return v
    return check


def flag(v: Any) -> bool:
    if type(v) is not bool:
        raise ValueError("should be true or false")
    return v


def list_of(item: Check, most: int = MAX_ITEMS) -> Check:
    def check(v: Any) -> list:
        if type(v) is not list or len(v) > most:
            raise ValueError(f"should be a list, at most {most} items")
        out = []
        for i, x in enumerate(v):
            try:
                out.append(item(x))
            except ValueError as e:
                raise ValueError(f"[{i}] {e}") from None
        return out
    return check


def mapping(key: Check, value: Check, most: int = MAX_ITEMS) -> Check:
    def check(v: Any) -> dict:
        if type(v) is not dict or len(v) > most:
            raise ValueError(f"should be an object, at most {most} keys")
        out = {}
        for k, x in v.items():
            try:
                out[key(k)] = value(x)
            except ValueError as e:
                raise ValueError(f"[{str(k)[:40]!r}] {e}") from None
        return out
    return check


def maybe(check: Check) -> Check:
    return lambda v: None if v is None else check(v)


REQUIRED = object()  # a field's default: the event must have it


def fields_of(fields: Mapping[str, tuple[Check, Any]]) -> Check:
    """An object of these fields ({name: (check, default or REQUIRED)}): those it gave, checked;
    the others left out (a newer supervisor's extra field is dropped, never passed on)."""
    def check(v: Any) -> dict:
        if type(v) is not dict:
            raise ValueError("should be an object")
        out = {}
        for name, (one, default) in fields.items():
            if name not in v:
                if default is REQUIRED:
                    raise ValueError(f"{name}: missing")
                continue
            try:
                out[name] = one(v[name])
            except ValueError as e:
                raise ValueError(f"{name}: {e}") from None
        return out
    return check


TEXT = text(MAX_TEXT)
NAME = text(MAX_NAME)
COUNT = whole(0, MAX_COUNT)
SECONDS = number(0, MAX_SECONDS)
EPOCH = number(0, MAX_EPOCH)
EXIT = whole(-MAX_EXIT, MAX_EXIT)
NAMES = list_of(NAME)
RANKS = list_of(COUNT)
O = None  # an optional field's default: absent

CULPRIT = fields_of({"rank": (COUNT, REQUIRED), "node": (NAME, O), "kind": (NAME, O), "where": (TEXT, O),
                   "state": (NAME, O)})

# The one list of event kinds: kind -> its fields {name: (check, REQUIRED or O)}. A new kind is
# one line here (and its line in supervision.describe).
KINDS: dict[str, dict[str, tuple[Check, Any]]] = {
    "running": {"attempt": (COUNT, O), "nodes": (NAMES, O), "ranks": (NAMES, O), "spares": (NAMES, O)},
    "lost": {"nodes": (mapping(NAME, TEXT), O)},
    "restart": {"attempt": (COUNT, O), "reason": (TEXT, O), "dropped": (NAMES, O), "replaced": (mapping(NAME, NAME), O),
                "ended_in": (SECONDS, O)},
    "spare-in": {"node": (NAME, REQUIRED), "replaces": (NAME, REQUIRED)},
    "spare-joined": {"node": (NAME, REQUIRED), "address": (NAME, O), "slots": (COUNT, O), "gpus": (COUNT, O)},
    "quarantined": {"node": (NAME, REQUIRED), "reason": (TEXT, O), "spare": (flag, O)},
    "checkpoint-now": {"nodes": (NAMES, O)},
    contract.PHASE_EVENT: {"phase": (NAME, REQUIRED), "node": (TEXT, O),  # a spare-in's: spares, comma-separated
                           "restart": (maybe(COUNT), O), "seconds": (SECONDS, O), "at": (EPOCH, O),
                           "end": (EPOCH, O)},
    "hang": {"silent_for": (SECONDS, O), "ranks": (RANKS, O), "nodes": (NAMES, O), "ago": (mapping(NAME, SECONDS), O),
             "steps": (mapping(NAME, COUNT), O), "culprits": (list_of(CULPRIT), O), "waiting": (RANKS, O),
             "unread": (RANKS, O), "flight_recorder": (TEXT, O)},  # torchrun: launch/jobs/flightrec.py
    "straggler": {"attempt": (COUNT, O), "rank": (COUNT, REQUIRED), "node": (NAME, REQUIRED),
                  "waiting": (COUNT, REQUIRED), "others": (number(0, MAX_COUNT), REQUIRED), "samples": (COUNT, REQUIRED),
                  "interval": (number(1e-6, MAX_SECONDS), REQUIRED)},
    "nccl-net": {"check": (NAME, O), "fails": (NAMES, O),  # --nccl-check (nccl_net.event_fields)
                 "nodes": (mapping(NAME, fields_of({"ok": (flag, O), "chose": (TEXT, O), "expected": (TEXT, O),
                                                   "ranks": (COUNT, O), "cause": (TEXT, O), "why": (TEXT, O),
                                                   "fix": (TEXT, O)})), O)},
    "succeeded": {"exit_code": (EXIT, O)},
    "failed": {"exit_code": (EXIT, O), "reason": (TEXT, O), "at_fault": (NAMES, O)},
}
_CHECKS = {kind: fields_of(fields) for kind, fields in KINDS.items()}


class BadEvent(ValueError):
    """An event line that is not one the schema knows; str: why, one line."""


class _Refused(ValueError):
    pass


def _refuse(token: str) -> float:
    raise _Refused(f"{token} is not a number JSON allows")


def loads(raw: str | bytes) -> object:
    """JSON as a node sends it: strict (no NaN, Infinity), nesting within the parser's depth;
    ValueError (one line) where it is not."""
    try:
        return json.loads(raw, parse_constant=_refuse)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg} at character {e.pos})") from None
    except UnicodeDecodeError:
        raise ValueError("not UTF-8") from None
    except _Refused:
        raise
    except ValueError as e:  # a number of more than 4300 digits
        raise ValueError(f"not JSON dtrain reads ({str(e).split(':')[0]})") from None


def check(data: object) -> dict:
    """An event's parsed JSON -> its checked fields (`event` and those of its kind it gave);
    BadEvent saying why where it is not an event of a known kind."""
    if not isinstance(data, dict):
        raise BadEvent(f"not a JSON object but {type(data).__name__}")
    kind = data.get("event")
    one = _CHECKS.get(kind) if isinstance(kind, str) else None
    if one is None:
        shown = kind if isinstance(kind, str) and len(kind) <= 40 and kind.isprintable() else "?"
        raise BadEvent(f"unknown event kind {shown!r}" if isinstance(kind, str) else "no event kind")
    try:
        return {"event": kind, **one(data)}
    except ValueError as e:
        raise BadEvent(f"{kind}: {e}") from None


def parse(payload: str) -> dict:
    """The JSON after contract.SUPERVISOR_EVENT -> checked event (check); BadEvent where not."""
    if len(payload) > MAX_LINE:
        raise BadEvent(f"longer than {MAX_LINE} characters")
    try:
        data = loads(payload)
    except ValueError as e:
        raise BadEvent(str(e)) from None
    return check(data)


def problem(why: str) -> str:
    """The one warning line for a skipped event."""
    return f"[launch] warning: skipped a malformed supervisor event: {clean(why)[:200]}"


# ---------------------------------------------------------------- state.json


# The supervisor's state.json (launch/node/supervise.py `state`): the last event's kind and
# fields (those dtrain reads), its restarts, the quarantined nodes and the stragglers named.
NODE_STATE = fields_of({"state": (NAME, O), "exit_code": (maybe(EXIT), O), "reason": (TEXT, O),
                      "restarts": (COUNT, O), "quarantined": (mapping(NAME, TEXT), O),
                      "stragglers": (mapping(NAME, TEXT), O), "updated": (EPOCH, O)})


def node_state(raw: str, where: str) -> dict:
    """A state.json's text -> its checked fields (those it gave); ValueError, one line naming
    `where` (the node and the file), where it is not the supervisor's state."""
    if len(raw) > MAX_LINE:
        raise ValueError(f"{where}: longer than {MAX_LINE} characters")
    try:
        data = loads(raw)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: not a JSON object but {type(data).__name__}")
    try:
        return NODE_STATE(data)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
