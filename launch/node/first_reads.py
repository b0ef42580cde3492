#!/usr/bin/env python3
"""What a first step reads from the image: recorded once, at build time, for the lazy start's
prefetch (issue 52; launch/node/prefetch.py reads the list on a lazy node).

    first_reads.py OUT MODULE...

Imports each MODULE (the family's framework, as a training script's first lines do) and, where
torch is among them, takes one small step (a Linear layer, SGD, backward), then writes OUT (JSON):

    {"version": 1, "modules": [...], "files": [[PATH, [[OFFSET, LENGTH], ...]], ...]}

From the kernel's view of this process, not from a list kept by hand:
- every file it mapped (/proc/self/maps: the shared libraries, libtorch's hundreds of MiB among
  them) with the pages it touched (/proc/self/pagemap's present bit, per page of each mapping:
  this process's page faults, whatever the page cache held), merged into ranges, plus each such
  file's first page (the loader reads the ELF header with read(2));
- every file it opened to read (Python's audit hook `open`: the .py/.pyc files of every import,
  data files), whole ([] for its ranges).
Only regular files under / that are not /proc, /sys, /dev, /tmp or /run: what the image holds.
Exit 0 with one line on stderr (files, MiB); exit 1 naming the module that failed to import (the
smoke step imports them too); any other failure (a /proc the builder hides) writes no list, says
so in one line and exits 0: a lazy node then prefetches nothing.
"""

from __future__ import annotations

import importlib
import json
import os
import struct
import sys

VERSION = 1
NOT_IMAGE = ("/proc/", "/sys/", "/dev/", "/tmp/", "/run/")
MERGE_GAP = 16  # pages: two touched ranges closer than this are read as one (fewer, larger reads)


def touched_pages(maps: str, pagemap, page: int) -> dict[str, set[int]]:
    """{path: offsets in the file of the pages this process has mapped in}, from /proc/self/maps'
    text and an open /proc/self/pagemap (8 bytes per virtual page; bit 63: present)."""
    out: dict[str, set[int]] = {}
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/") or parts[5].startswith(NOT_IMAGE):
            continue  # not a file of the image (/dev/zero, /dev/shm, a memfd): its pages are not read
        path = parts[5]
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        offset = int(parts[2], 16)
        n = (hi - lo) // page
        pagemap.seek(lo // page * 8)
        data = pagemap.read(n * 8)
        pages = out.setdefault(path, {0})  # the ELF header, read before the mapping
        for i in range(len(data) // 8):
            (entry,) = struct.unpack_from("<Q", data, i * 8)
            if entry >> 63:
                pages.add(offset + i * page)
    return out


def ranges(offsets: set[int], page: int, size: int, gap: int = MERGE_GAP) -> list[list[int]]:
    """Page offsets -> sorted [offset, length] ranges within size, neighbours closer than gap
    pages merged."""
    out: list[list[int]] = []
    for off in sorted(o for o in offsets if o < size):
        end = min(off + page, size)
        if out and off - (out[-1][0] + out[-1][1]) <= gap * page:
            out[-1][1] = end - out[-1][0]
        else:
            out.append([off, end - off])
    return out


def in_image(path: str) -> bool:
    return path.startswith("/") and not path.startswith(NOT_IMAGE) and os.path.isfile(path)


def first_step(modules: list[str]) -> None:
    for name in modules:
        importlib.import_module(name)
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(2, 8)).sum().backward()
        opt.step()


def record(modules: list[str]) -> dict:
    opened: set[str] = set()

    def hook(event: str, args: tuple) -> None:
        if event == "open" and isinstance(args[0], str) and (args[1] is None or "r" in args[1]):
            opened.add(args[0])

    sys.addaudithook(hook)
    first_step(modules)
    page = os.sysconf("SC_PAGE_SIZE")
    with open("/proc/self/maps") as f, open("/proc/self/pagemap", "rb") as pm:
        mapped = touched_pages(f.read(), pm, page)
    files: dict[str, list[list[int]]] = {}
    for path, offsets in mapped.items():
        if in_image(path):
            files[path] = ranges(offsets, page, os.path.getsize(path))
    for path in opened:
        path = os.path.realpath(path)
        if path not in files and in_image(path):
            files[path] = []
    return {"version": VERSION, "modules": modules, "files": sorted([p, r] for p, r in files.items())}


def size_of(listing: dict) -> int:
    """Bytes the list names (a whole file: its size here)."""
    return sum(sum(n for _, n in r) if r else os.path.getsize(p) for p, r in listing["files"])


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(f"usage: {argv[0]} OUT MODULE...", file=sys.stderr)
        return 2
    out, modules = argv[1], argv[2:]
    try:
        listing = record(modules)
    except ImportError as e:
        print(f"first_reads.py: cannot import {e.name or modules}: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - the list is an optimisation: no list, not a failed build
        print(f"first_reads.py: nothing recorded ({type(e).__name__}: {e}); lazy nodes will not prefetch", file=sys.stderr)
        return 0
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(listing, f, separators=(",", ":"))
    print(f"first reads of {' '.join(modules)}: {len(listing['files'])} files, "
          f"{size_of(listing) / 2**20:.1f} MiB -> {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
