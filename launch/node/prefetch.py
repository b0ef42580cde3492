#!/usr/bin/env python3
"""Read what the first step will read, ahead of it, on a node that loads the image lazily
(issue 52; docs/launch.md "Lazy loading"). Started in the job's container right after it starts
(host/start.sh, where this launch pulled the image lazily on the node), beside the job's own start.

    prefetch.py LIST OUT [THREADS]

LIST: first_reads.py's JSON, written into the image at build time (contract.FIRST_READS). Every
range it names is read with pread(2) by THREADS threads at once (default 16), in chunks of at most
CHUNK bytes, largest files first: the snapshotter fetches the spans under them from the registry
in parallel, where the first step would have asked for them one after another. Nothing is written
but one JSON line of what it did, to OUT (contract.PREFETCH_DONE; written whole, by a rename):
    {"files": N, "bytes": B, "seconds": S, "skipped": K}
A path that is not an absolute regular file (where its links lead), one under /proc, /sys, /dev,
/run or the job's directory, or a range past its end, is skipped (the list comes from the
image: it is read, never trusted to name anything but the image's files to read). No list: exit 0,
nothing done.
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

CHUNK = 4 << 20  # soci's default span: one fetch each
# never read, whatever the list says: not the image's files (the job's directory and keys are
# mounted in the container; /proc, /sys and /dev are the kernel's)
NOT_IMAGE = ("/proc/", "/sys/", "/dev/", "/run/", "/dtrain-job/")
READ = 1 << 20
THREADS = 16


def work(listing: object) -> tuple[list[tuple[str, int, int]], int]:
    """The list's (path, offset, length) reads, each at most CHUNK, largest files first; and how
    many entries were skipped (not a regular file, bad ranges)."""
    items: list[tuple[int, list[tuple[str, int, int]]]] = []
    skipped = 0
    files = listing.get("files", []) if isinstance(listing, dict) else []
    for entry in files if isinstance(files, list) else []:
        try:
            path, spans = entry
            if not (isinstance(path, str) and path.startswith("/") and isinstance(spans, list)):
                raise ValueError(path)
            path = os.path.realpath(path)  # where a link leads is what is checked and read
            if path.startswith(NOT_IMAGE) or not os.path.isfile(path):
                raise ValueError(path)
            size = os.stat(path).st_size
            spans = [(0, size)] if not spans else [(int(o), int(n)) for o, n in spans]
        except (TypeError, ValueError, OSError, OverflowError):
            skipped += 1
            continue
        reads = [(path, o + k, min(CHUNK, end - k))
                 for o, n in spans if 0 <= o < size and n > 0
                 for end in (min(n, size - o),) for k in range(0, end, CHUNK)]
        items.append((sum(n for _, _, n in reads), reads))
    items.sort(key=lambda t: -t[0])
    return [r for _, reads in items for r in reads], skipped


def read_range(path: str, offset: int, length: int) -> int:
    done = 0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # a file put in its place: not followed, never waited on
    except OSError:
        return 0
    try:
        while done < length:
            got = os.pread(fd, min(READ, length - done), offset + done)
            if not got:
                break
            done += len(got)
    except OSError:
        pass
    finally:
        os.close(fd)
    return done


def prefetch(listing: object, threads: int = THREADS) -> dict:
    began = time.monotonic()
    reads, skipped = work(listing)
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        total = sum(pool.map(lambda r: read_range(*r), reads))
    return {"files": len({p for p, _, _ in reads}), "bytes": total, "seconds": round(time.monotonic() - began, 3),
            "skipped": skipped}


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print(f"usage: {argv[0]} LIST OUT [THREADS]", file=sys.stderr)
        return 2
    try:
        with open(argv[1]) as f:
            listing = json.load(f)
    except (OSError, ValueError):
        return 0  # an image built without the list (or an unreadable one): nothing to prefetch
    done = prefetch(listing, int(argv[3]) if len(argv) == 4 else THREADS)
    out = argv[2]
    with open(out + ".part", "w") as f:
        json.dump(done, f)
    os.replace(out + ".part", out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
