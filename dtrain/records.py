"""dtrain's own JSON records under DTRAIN_HOME (cluster.json of `dtrain nodes up`): written
atomically (a temporary file, fsync, rename: a reader sees the old record or the new one, never
part of one), read through a schema (pydantic, strict), so that any damage (not JSON, not an
object, a wrong type, a missing key, nesting or numbers past reason, a device or a huge file in
its place) is one line naming the file, what is wrong, and what to do: values.BadValue (the
CLI exits 2), never a traceback."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, TypeVar

from dtrain import outfile
from dtrain.values import BadValue, file_kind

RECORD_MAX = 16 << 20  # bytes: a record past this is not one of dtrain's
T = TypeVar("T")


def write(path, text: str, mode: int = 0o600) -> Path:
    """The record's text at `path`, replaced atomically (its directory made)."""
    return outfile.record(path, text, mode)


def _bytes(path: Path, fix: str) -> bytes:
    """The record's bytes: a regular file of at most RECORD_MAX bytes (a FIFO in its place is
    not waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise BadValue(f"{path}: cannot read it: {e.strerror or e}; {fix}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadValue(f"{path}: {file_kind(st.st_mode)}, not a record file; {fix}")
        if st.st_size > RECORD_MAX:
            raise BadValue(f"{path}: {st.st_size} bytes, more than a record has (at most {RECORD_MAX}); {fix}")
        chunks, got = [], 0
        while got <= RECORD_MAX:
            b = os.read(fd, min(1 << 20, RECORD_MAX + 1 - got))
            if not b:
                break
            chunks.append(b)
            got += len(b)
    except OSError as e:
        raise BadValue(f"{path}: cannot read it: {e.strerror or e}; {fix}") from None
    finally:
        os.close(fd)
    if got > RECORD_MAX:
        raise BadValue(f"{path}: more than {RECORD_MAX} bytes; {fix}")
    return b"".join(chunks)


def _where(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "the top level"


def problem_line(e: Any) -> str:
    """A pydantic ValidationError's first problem in words: `key.0.sub: what is wrong` (no value
    quoted beyond a short one; a damaged file may hold anything)."""
    errs = e.errors(include_url=False, include_context=False, include_input=False)
    if not errs:
        return "not the record's shape"
    first = errs[0]
    msg = " ".join(str(first.get("msg", "")).split())[:160]
    more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
    if first.get("type") == "json_invalid":
        return f"not valid JSON ({msg})"
    return f"{_where(tuple(first.get('loc', ())))}: {msg}{more}"


def read(path, schema: type[T], fix: str) -> T:
    """The record at `path` as `schema` (a dataclass or pydantic model; JSON, strictly typed:
    no "8" for 8, no 1 for true). FileNotFoundError where there is none; BadValue, one line
    naming the file, what is wrong and `fix` (what to do), where it is damaged."""
    from pydantic import TypeAdapter, ValidationError

    p = Path(path)
    data = _bytes(p, fix)
    if not data.strip():
        raise BadValue(f"{p}: empty, not a record; {fix}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadValue(f"{p}: not text (not UTF-8), not a record; {fix}") from None
    try:
        return TypeAdapter(schema).validate_json(text, strict=True)
    except ValidationError as e:
        raise BadValue(f"{p}: {problem_line(e)}; {fix}") from None
    except (ValueError, RecursionError) as e:  # anything the JSON parser itself refuses
        raise BadValue(f"{p}: not valid JSON ({' '.join(str(e).split())[:120]}); {fix}") from None
