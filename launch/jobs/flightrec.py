"""PyTorch's flight recorder: which rank the others wait for in a collective, by sequence numbers.

torchrun's ranks get `env(job_dir)` (launch/jobs/session.py supervisor_plan): TORCH_FR_BUFFER_SIZE
makes every process group keep its last collectives, each with its `collective_seq_id`; TORCH_NCCL_DUMP_ON_TIMEOUT writes a rank's records to
TORCH_FR_DUMP_TEMP_FILE + RANK (`<job dir>/flightrec_rank_R`: every node's container has its own
job directory) when NCCL's watchdog sees a collective time out, or when a line is written to its
debug pipe (TORCH_NCCL_DEBUG_INFO_PIPE_FILE: `<job dir>/flightrec_rank_R.pipe`; the hang check
does, launch/node/fr_dumps.sh). A rank's dump (`load`: a pickle of
plain values, or the JSON form) says, per process group, the last collective it entered
(`pg_status.last_enqueued_collective`). `behind` names the ranks whose last one is older than
the others': they did not enter the collective the others wait in.

What torch 2.13 (the CPU images' pin) does with gloo, found on 127.0.0.1 with two processes
(tests/data/flight_recorder/README.md): gloo's collectives are recorded (`gloo:all_reduce`,
sequence numbers as NCCL's), but no dump is written on a gloo timeout, and a dump can only be
asked for from inside the rank (`torch._C._distributed_c10d._dump_fr_trace`), so with gloo the
supervisor finds no dump and says why (`NO_DUMP_GLOO`).

Pure and standard library only (the supervisor imports it on the node).
"""

from __future__ import annotations

import io
import json
import pickle
from dataclasses import dataclass
from typing import Mapping

PREFIX = "flightrec_rank_"  # in the job directory; torch appends the rank
BUFFER = 2000  # collectives kept per process
USER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE",
             "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
NO_DUMP_GLOO = ("no flight-recorder dump from any rank (torch writes one for NCCL only, on a timeout or when asked, "
                "with gloo its records stay inside the ranks)")
MAX_DUMP = 64 << 20  # bytes read of one dump at most
# A dump comes from a node: what it names is bounded before it reaches a line (the hang event's
# text is cut at launch/jobs/events.py MAX_TEXT, and a cut one is dropped)
MAX_SEQ = 1 << 63  # a sequence number is an int64 in torch; outside [NONE, MAX_SEQ) it is no record
NONE = -1  # torch's last_enqueued_collective before the rank entered any collective of the group
MAX_NAME = 64  # characters of a process group's id (a longer one is not judged), an op's name, a node's
MAX_ENTRIES = 10 * BUFFER  # records of a dump read (its newest)
MAX_GROUPS_READ = 4096  # process groups of a dump's pg_status read
MAX_GROUPS = 4  # process groups the line names (then `and N more`)
MAX_RANKS = 8  # ranks named per group (then `and N more`)
MAX_LINE = 2000  # characters of the whole flight-recorder part at most


def late(seconds: float) -> str:
    """The hang line's flight-recorder part where the dumps did not come in time: the hang line
    never waits for them longer than `seconds` past the stacks (launch/node/supervise.py)."""
    return f"flight recorder: no dumps gathered within {seconds:g} s of the stacks"


def env(job_dir: str) -> tuple[tuple[str, str], ...]:
    """The ranks' env: record, and dump on a timeout (or asked through the pipe) into
    <job_dir>/flightrec_rank_R."""
    path = f"{job_dir}/{PREFIX}"
    # not its older name TORCH_NCCL_TRACE_BUFFER_SIZE: torch 2.13 warns on every rank where it is set
    return (("TORCH_FR_BUFFER_SIZE", str(BUFFER)),
            ("TORCH_NCCL_DUMP_ON_TIMEOUT", "1"), ("TORCH_FR_DUMP_TEMP_FILE", path),
            ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", path), ("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", path))


# torch's first release that reads TORCH_FR_BUFFER_SIZE (the vendor-neutral recorder, 2025;
# torchtitan set that name for 2.9). Earlier ones read TORCH_NCCL_TRACE_BUFFER_SIZE only: torch
# 2.4.1, the GPU EFA images' pin (images/pytorch-ddp.yaml), records nothing under the new name.
NEW_NAME_SINCE = (2, 9)


def torch_release(version: str | None) -> tuple[int, int] | None:
    """`2.4.1+cu124` -> (2, 4); None where it is no version."""
    parts = (version or "").split("+")[0].split(".")
    ok = len(parts) >= 2 and all(x.isascii() and x.isdigit() for x in parts[:2])
    return (int(parts[0]), int(parts[1])) if ok else None


def for_torch(env: tuple[tuple[str, str], ...], version: str | None) -> tuple[tuple[str, str], ...]:
    """The ranks' env with dtrain's recorder buffer under the name their torch reads (`version`:
    the torch in the job's image, found by the supervisor in its container): before
    NEW_NAME_SINCE its older name; from it, or where the version is unknown, TORCH_FR_BUFFER_SIZE
    (torch 2.13 warns on every rank where the older one is set). Other pairs as they are."""
    release = torch_release(version)
    if release is None or release >= NEW_NAME_SINCE:
        return env
    return tuple(("TORCH_NCCL_TRACE_BUFFER_SIZE" if k == "TORCH_FR_BUFFER_SIZE" else k, v) for k, v in env)


def read_lines(lines) -> dict[int, dict]:
    """fr_dumps.sh's lines (`fr RANK BASE64`; others skipped) -> {rank: dump} (those that load)."""
    import base64
    import binascii

    out: dict[int, dict] = {}
    for line in lines:
        parts = line.split()
        # the rank is the dump file's name on the node: ASCII digits, a plausible rank
        if len(parts) == 3 and parts[0] == "fr" and parts[1].isascii() and parts[1].isdigit() and len(parts[1]) <= 9:
            try:
                dump = load(base64.b64decode(parts[2], validate=True))
            except (binascii.Error, ValueError):
                continue
            if dump is not None:
                out[int(parts[1])] = dump
    return out


class _Plain(pickle.Unpickler):
    """Only plain values (dict, list, tuple, str, numbers, None): a dump comes from a node and
    is untrusted, and unpickling a class could run code."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"{module}.{name} is not a plain value")


def load(data: bytes) -> dict | None:
    """A dump's records (torch's pickle, or its JSON form), or None where it is neither."""
    if not data or len(data) > MAX_DUMP:
        return None
    try:
        out = json.loads(data) if data.lstrip()[:1] == b"{" else _Plain(io.BytesIO(data)).load()
    except Exception:  # noqa: BLE001 - a cut or foreign file is no dump
        return None
    return out if isinstance(out, dict) else None


def _seq(value: object) -> int | None:
    """A sequence number as a dump gives it (an int, or a whole float or string of one; NONE:
    the rank entered no collective of the group), or None: inf, nan, a bool, a number outside an
    int64, anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        if not value.is_integer():  # inf, nan, 3.5
            return None
        value = int(value)
    elif isinstance(value, str):
        digits = value[1:] if value.startswith("-") else value
        value = int(value) if digits.isascii() and digits.isdigit() and len(digits) <= 19 else None
    return value if isinstance(value, int) and NONE <= value < MAX_SEQ else None


def _pg(value: object) -> str | None:
    """A process group's id as a key (torch's: a short name or number), or None where it is
    neither: such a group is not judged (cutting or merging ids could pair unrelated groups)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value) if value.bit_length() <= 64 else None  # str() of a huge int raises
    if isinstance(value, str) and len(value) <= MAX_NAME and value.isprintable():
        return value
    return None


def _name(value: object) -> str:
    """An op's name as a line shows it: printable, at most MAX_NAME characters."""
    text = value if isinstance(value, str) else "?"
    text = "".join(c if c.isprintable() else "?" for c in text[:MAX_NAME + 1])
    return text if len(text) <= MAX_NAME else text[:MAX_NAME - 3] + "..."


def _entries(dump: Mapping) -> list[Mapping]:
    """The dump's records that are records (a mapping each), its last MAX_ENTRIES at most (the
    ring's newest); none where `entries` is not a list."""
    entries = dump.get("entries")
    return [e for e in entries[-MAX_ENTRIES:] if isinstance(e, Mapping)] if isinstance(entries, (list, tuple)) else []


def last_entered(dump: Mapping) -> dict[str, int]:
    """{process group id: the sequence number of the last collective this rank entered (NONE:
    none)}, from pg_status (its last_enqueued_collective; MAX_GROUPS_READ groups at most), else
    from the entries (the largest collective_seq_id per pg_id). A dump is untrusted: what is not
    a record is skipped."""
    out: dict[str, int] = {}
    status = dump.get("pg_status")
    if isinstance(status, Mapping):
        for n, (key, st) in enumerate(status.items()):
            if n >= MAX_GROUPS_READ:
                break
            if (pg := _pg(key)) is not None and isinstance(st, Mapping) \
                    and (seq := _seq(st.get("last_enqueued_collective"))) is not None:
                out[pg] = seq
    if not out:
        for e in _entries(dump):
            if not e.get("is_p2p") and (pg := _pg(e.get("pg_id"))) is not None \
                    and (seq := _seq(e.get("collective_seq_id"))) is not None:
                out[pg] = max(out.get(pg, seq), seq)
    return out


def ops(dump: Mapping) -> dict[tuple[str, int], str]:
    """{(process group id, sequence number): the op's name} over the dump's entries, in one pass."""
    out: dict[tuple[str, int], str] = {}
    for e in _entries(dump):
        if (pg := _pg(e.get("pg_id"))) is not None and (seq := _seq(e.get("collective_seq_id"))) is not None:
            out.setdefault((pg, seq), _name(e.get("profiling_name") or "?"))
    return out


@dataclass(frozen=True)
class Behind:
    """In process group `pg`, `ranks` entered up to `entered` only; the others (`waiting`)
    entered collective number `seq`, `op` (torch's name: `gloo:all_reduce`, `nccl:all_reduce`)."""

    pg: str
    ranks: tuple[int, ...]
    entered: tuple[int, ...]  # each named rank's last sequence number
    seq: int
    op: str
    waiting: tuple[int, ...]


def behind(dumps: Mapping[int, Mapping]) -> list[Behind]:
    """Per process group, the ranks whose last collective is older than the newest any rank
    entered: the ones the others wait for. A group all of whose ranks agree names nobody; a
    rank without a record of the group is not judged (its dump lacks it)."""
    seen: dict[str, dict[int, int]] = {}
    for rank, d in dumps.items():
        for pg, seq in last_entered(d).items():
            seen.setdefault(pg, {})[rank] = seq
    out = []
    indexed: dict[int, dict[tuple[str, int], str]] = {}  # a dump's ops, read once and only where needed
    for pg in sorted(seen, key=lambda p: (len(p), p)):
        by_rank = seen[pg]
        top = max(by_rank.values())
        late = sorted(r for r, s in by_rank.items() if s < top)
        if not late:
            continue
        ahead = sorted(r for r, s in by_rank.items() if s == top)
        if ahead[0] not in indexed:
            indexed[ahead[0]] = ops(dumps[ahead[0]])
        out.append(Behind(pg, tuple(late), tuple(by_rank[r] for r in late), top,
                          indexed[ahead[0]].get((pg, top), "?"), tuple(ahead)))
    return out


def text(found: list[Behind], ranks_dumped: int, world: int, ranks: list[str] | None = None) -> str:
    """The hang line's flight-recorder part: `flight recorder: r1 (node-2) did not enter
    gloo:all_reduce #4 of process group 0 (entered up to #3) that r0 waits in`; or why it names
    nobody."""
    def who(r: int) -> str:  # a node's name cut to MAX_NAME: the first group's verdict fits MAX_LINE
        return f"r{r} ({ranks[r][:MAX_NAME]})" if ranks and 0 <= r < len(ranks) else f"r{r}"

    def entered(s: int) -> str:
        return "entered none" if s == NONE else f"entered up to #{s}"

    def more(n: int) -> str:
        return f" and {n} more" if n > 0 else ""

    if not ranks_dumped:
        return f"flight recorder: {NO_DUMP_GLOO}"
    if not found:
        return f"flight recorder: {ranks_dumped}/{world} ranks' dumps agree on the last collective"
    parts = []
    for b in found[:MAX_GROUPS]:
        named = list(zip(b.ranks, b.entered))[:MAX_RANKS]
        late = ", ".join(f"{who(r)} ({entered(s)})" for r, s in named) + more(len(b.ranks) - len(named))
        waiting = ", ".join(f"r{r}" for r in b.waiting[:MAX_RANKS]) + more(len(b.waiting) - MAX_RANKS)
        parts.append(f"{late} did not enter {b.op} #{b.seq} of process group {b.pg} that {waiting} "
                     f"{'waits' if len(b.waiting) == 1 else 'wait'} in")
    groups = f"; and {len(found) - MAX_GROUPS} more process groups" if len(found) > MAX_GROUPS else ""
    dumped = f" ({ranks_dumped}/{world} ranks dumped)" if ranks_dumped < world else ""
    out = "flight recorder: " + "; ".join(parts) + groups + dumped
    return out if len(out) <= MAX_LINE else out[:MAX_LINE - 4] + " ..."
