"""Files shaped like a GPU image's CUDA libraries, and a first step that reads them as a loader
would (bench/bench_lazy_launch.py --gpu-sizes; this file is copied into the image it builds).

    python cuda_shaped.py load DIR [BYTES]   # import torch, touch every DIR/lib*.so (or those in
                                              # the first BYTES of them), print `step0 UNIXTIME`

A library: FILE_BYTES, every 64 KiB block half random bytes, half zeros (gzip halves it; that it
roughly does so to libcublas, libcudnn and libnccl is an assumption). Loading one: its 64 KiB head (the ELF header and
program headers) and READ_FRACTION of it at one offset taken from its name (the pages a process
touches of a large library: its needed code, not every kernel for every GPU architecture).
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import time

FILE_BYTES = 256 << 20
BLOCK = 64 << 10
HEAD = 64 << 10
READ_FRACTION = 0.03


class Stream(io.RawIOBase):
    """size bytes of library-shaped content, read once front to back (tarfile's addfile)."""

    def __init__(self, size: int) -> None:
        self.left = size
        self.buf = b""

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.left
        n = min(n, self.left)
        while len(self.buf) < n:
            self.buf += os.urandom(BLOCK // 2) + bytes(BLOCK // 2)
        out, self.buf = self.buf[:n], self.buf[n:]
        self.left -= n
        return out


def touched(name: str, size: int) -> list[tuple[int, int]]:
    """(offset, length) a loader reads of library `name` of `size` bytes."""
    length = int(size * READ_FRACTION)
    spread = max(1, size - length - HEAD)
    off = HEAD + int(hashlib.sha256(name.encode()).hexdigest(), 16) % spread
    return [(0, min(HEAD, size)), (off, length)]


def libraries(d: str, limit: int | None = None) -> list[str]:
    """The libraries a first step loads, in name order: all, or those whose sizes add up to at
    most `limit` bytes (the rest of the image: libraries this step never loads)."""
    out, total = [], 0
    for name in sorted(n for n in os.listdir(d) if n.endswith(".so")):
        size = os.path.getsize(os.path.join(d, name))
        if limit is not None and total + size > limit:
            break
        out.append(name)
        total += size
    return out


def load(d: str, limit: int | None = None) -> None:
    import torch  # noqa: F401  # the framework, as the first step imports it

    for name in libraries(d, limit):
        path = os.path.join(d, name)
        with open(path, "rb") as f:
            for off, length in touched(name, os.path.getsize(path)):
                f.seek(off)
                left = length
                while left > 0:
                    left -= len(f.read(min(left, 1 << 20)) or b"x" * left)
    print("step0", time.time(), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["load"] and len(sys.argv) in (3, 4):
        load(sys.argv[2], int(sys.argv[3]) if len(sys.argv) == 4 else None)
    else:
        raise SystemExit("usage: cuda_shaped.py load DIR [BYTES]")
