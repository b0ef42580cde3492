"""SIGTERM and SIGHUP handled as Ctrl-C is, so that every `finally` runs: `dtrain stop` sends
SIGTERM, a closed terminal SIGHUP. Used by the launcher (launch/jobs/job.py) and by push's own
Docker config (images/push.py), which must not outlive the run that made it."""

from __future__ import annotations

import signal
import threading
from typing import Callable


class Signalled(KeyboardInterrupt):
    """SIGTERM (`dtrain stop`, kill) or SIGHUP (a closed terminal), raised where Ctrl-C would be."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def interrupt_code(e: KeyboardInterrupt) -> tuple[int, str]:
    """(exit code, what happened): 128 + the signal, as a shell reports it (Ctrl-C: 130)."""
    if isinstance(e, Signalled):
        return 128 + e.signum, f"{signal.Signals(e.signum).name} received"
    return 130, "interrupted"


def sigterm_as_interrupt() -> Callable[[], None]:
    """SIGTERM and SIGHUP raise Signalled (a KeyboardInterrupt) until the returned function
    restores the handlers before. Off the main thread nothing changes. (kill -9 and a lost
    network: the supervisor sees its stdin end, or go silent, and stops the job; each node's
    watchdog removes what is left there.)"""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame):
        raise Signalled(signum)

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    return lambda: [signal.signal(sig, h) for sig, h in old.items()] and None
