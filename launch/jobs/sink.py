"""The job's output as the launcher keeps it: each line to the screen and the job's output.log,
with when each write came in output.times (`EPOCH COUNT` a write: the report's step times,
launch/analysis/report.py). Lines from any thread; a batch of them (one read of the job's
output) goes out with one write and one flush each.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from pathlib import Path
from typing import IO, Iterator

from dtrain.launch.jobs import store


class Sink:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[str] | None = None  # lines of an output batch (batched)
        self.log: IO[str] | None = None
        self.times: IO[str] | None = None  # output.times: when each write to output.log came

    def open(self, job_dir: Path) -> None:
        """output.log and output.times in the job's directory (0600), appended to."""
        self.log = store.open_private(job_dir / "output.log")
        self.times = store.open_private(job_dir / "output.times")

    def close(self) -> None:
        for f in (self.log, self.times):
            if f:
                f.close()

    def emit(self, line: str) -> None:
        """A line of the job's output, to the screen and the job's log; within batched, kept
        (in order) until the batch ends."""
        with self._lock:
            if self._pending is not None:
                self._pending.append(line)
            else:
                self._write(line + "\n")

    def _write(self, text: str) -> None:  # the lock held
        sys.stdout.write(text)
        sys.stdout.flush()
        self._log_write(text)

    def _log_write(self, text: str) -> None:  # the lock held
        if self.log:
            self.log.write(text)
            self.log.flush()
        if self.times:
            self.times.write(f"{time.time():.3f} {text.count(chr(10))}\n")
            self.times.flush()

    @contextlib.contextmanager
    def batched(self) -> Iterator[None]:
        """The lines emitted meanwhile go out together: one write and one flush each for the
        screen and the log (a flush per line cost the launcher 2/3 of its time on chatty jobs)."""
        with self._lock:
            self._pending = []
        try:
            yield
        finally:
            with self._lock:
                lines, self._pending = self._pending, None
                if lines:
                    self._write("".join(line + "\n" for line in lines))

    def log_only(self, line: str) -> None:
        """A line for the job's output.log and not the screen (one the caller shows itself)."""
        with self._lock:
            self._log_write(line + "\n")
