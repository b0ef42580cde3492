"""Run one command per node in parallel (usually ssh), with bounded concurrency.

Per-attempt timeout kills the child's whole process group; only ssh connection failures
(exit 255 plus a connection message) are retried, with exponential backoff. Ctrl-C kills
every running child and re-raises.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

from dtrain.launch.errors import LaunchError
from dtrain.launch.remote.hosts import Node

# ssh's own failures exit 255; these messages mean "could not reach sshd yet", worth a retry.
# "Permission denied", "Host key verification failed", unknown hosts are not retried.
_CONNECTION_ERROR_RE = re.compile(
    r"Connection refused|Connection timed out|Operation timed out|timed out|No route to host"
    r"|Network is unreachable|Connection reset|Connection closed by|kex_exchange_identification"
    r"|banner exchange"  # the proxy or peer went away before ssh's banner (Broken pipe)
    r"|Temporary failure in name resolution",
    re.IGNORECASE,
)
# Of those, these mean the host itself did not answer (down, its link lost): one retry only,
# so an unreachable host costs two connect timeouts, not `retries` + 1 of them.
_UNREACHABLE_RE = re.compile(r"timed out|No route to host|Network is unreachable", re.IGNORECASE)
SSH_FAILURE = 255
_KILL_GRACE_S = 1.0  # between SIGTERM and SIGKILL
_DRAIN_S = 5.0  # wait for pipes after exit (a daemonised grandchild may hold them open)


@dataclass(frozen=True)
class NodeResult:
    host: str
    returncode: int | None  # None: timed out, or never started
    stdout: str
    stderr: str
    attempts: int
    seconds: float  # wall time over all attempts and backoff
    error: str | None = None  # None: success

    @property
    def ok(self) -> bool:
        return self.error is None


def is_connection_error(returncode: int | None, stderr: str) -> bool:
    return returncode == SSH_FAILURE and bool(_CONNECTION_ERROR_RE.search(stderr))


def is_unreachable(returncode: int | None, stderr: str) -> bool:
    """ssh could not reach the host at all (no answer within the connect timeout, no route)."""
    return is_connection_error(returncode, stderr) and bool(_UNREACHABLE_RE.search(stderr))


def _last_line(*texts: str) -> str:
    for text in texts:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if lines:
            return lines[-1]
    return "no output"


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the child's process group, then SIGKILL whatever is left of it."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(_KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class _Children:
    """Live child processes, so Ctrl-C can kill them all; refuses new ones once cancelled."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set[subprocess.Popen] = set()
        self.cancelled = threading.Event()

    def start(self, argv: list[str], piped: bool = False) -> subprocess.Popen | None:
        with self._lock:
            if self.cancelled.is_set():
                return None
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if piped else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
                start_new_session=True,  # own process group: killpg reaches grandchildren, Ctrl-C doesn't
            )
            self._live.add(proc)
        return proc

    def finished(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._live.discard(proc)

    def kill_all(self) -> None:
        with self._lock:
            self.cancelled.set()
            live = list(self._live)
        for proc in live:
            if proc.poll() is None:
                _kill_group(proc)


def _pump(stream, sink: list[str], node: Node, emit: Callable[[Node, str], None] | None) -> None:
    failure = None
    for line in stream:
        sink.append(line)
        if emit is not None and failure is None:
            try:
                emit(node, line.rstrip("\n"))
            except Exception as e:  # keep draining, or the child blocks on a full pipe
                failure = e
    stream.close()
    if failure is not None:
        raise failure  # reported by threading.excepthook


class _Stdin:
    """One node's standard input: the text given at the start and what Fanout.send adds later
    (held open until then). Each attempt gets all of it so far (a retry, the same dialogue)."""

    def __init__(self, text: str, hold: bool) -> None:
        self._lock = threading.Lock()
        self._text = text
        self._closed = not hold
        self._proc: subprocess.Popen | None = None

    def _write(self, text: str) -> None:
        assert self._proc is not None and self._proc.stdin
        try:  # small payloads (a key, a token): never in argv, where `ps` shows them
            if text:
                self._proc.stdin.write(text)
                self._proc.stdin.flush()
            if self._closed:
                self._proc.stdin.close()
        except (BrokenPipeError, ValueError, OSError):
            pass  # the command ended (or closed its input): its result says what happened

    def attach(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._proc = proc
            self._write(self._text)

    def send(self, text: str, close: bool) -> None:
        with self._lock:
            self._text += text
            self._closed = self._closed or close
            if self._proc is not None:
                self._write(text)


def _attempt(
    children: _Children, node: Node, argv: list[str], timeout: float | None, emit,
    stdin: _Stdin | None = None,
) -> tuple[int | None, str, str, str | None]:
    """One run: (returncode, stdout, stderr, error-or-None for timeouts/start failures)."""
    try:
        proc = children.start(argv, stdin is not None)
    except OSError as e:
        return None, "", "", f"could not start {argv[0]}: {e.strerror or e}"
    if proc is None:
        return None, "", "", "cancelled"
    out: list[str] = []
    err: list[str] = []
    pumps = [
        threading.Thread(target=_pump, args=(proc.stdout, out, node, emit), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr, err, node, emit), daemon=True),
    ]
    for t in pumps:
        t.start()
    if stdin is not None:
        stdin.attach(proc)
    error = None
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.wait()
        error = f"timed out after {timeout:g}s"
    finally:
        children.finished(proc)
    for t in pumps:
        t.join(_DRAIN_S)
    return (None if error else proc.returncode), "".join(out), "".join(err), error


def _run_node(
    node: Node,
    argv: list[str],
    children: _Children,
    *,
    timeout: float | None,
    retries: int,
    backoff: float,
    emit,
    stdin: _Stdin | None = None,
    once_heard: bool = False,
) -> NodeResult:
    start = time.monotonic()
    attempts = 0
    while True:
        attempts += 1
        rc, out, err, error = _attempt(children, node, argv, timeout, emit, stdin)
        retry = is_connection_error(rc, err) and attempts <= (min(retries, 1) if is_unreachable(rc, err) else retries)
        retry = retry and not (once_heard and out)  # it ran: a dialogue is not run again
        # Event.wait doubles as an interruptible sleep: Ctrl-C ends the backoff at once.
        if not retry or children.cancelled.wait(backoff * 2 ** (attempts - 1)):
            break
    if error is not None:
        if err.strip() or out.strip():
            error += f": {_last_line(err, out)}"
    elif rc != 0:
        if is_connection_error(rc, err):
            error = f"ssh could not connect ({attempts} attempts): {_last_line(err)}"
        else:
            error = f"exit {rc}: {_last_line(err, out)}"
    return NodeResult(node.host, rc, out, err, attempts, time.monotonic() - start, error)


class Fanout:
    """make_argv(node) running for every node in the background, at most `concurrency` at once.
    results() waits for all (node order); cancel() kills what still runs.

    timeout: seconds per attempt (None: no limit). retries: extra attempts after an ssh
    connection failure, sleeping backoff, 2*backoff, ... between them; at most one where the
    host did not answer at all (is_unreachable: each attempt cost a whole connect timeout). on_line(node, line)
    gets each stdout/stderr line as it arrives (one call at a time; the caller prefixes).
    stdin(node): text written to that node's standard input (secrets go here, not in argv).
    hold_stdin: keep each node's standard input open after that text, for a dialogue: send()
    writes more (the launch's first round, then its start step, in one session per node); a
    command that printed something is not retried then (it ran; a retry would run it again).
    """

    def __init__(
        self,
        nodes: Sequence[Node],
        make_argv: Callable[[Node], list[str]],
        *,
        concurrency: int = 32,
        timeout: float | None = 60,
        retries: int = 2,
        backoff: float = 0.5,
        on_line: Callable[[Node, str], None] | None = None,
        stdin: Callable[[Node], str | None] | None = None,
        hold_stdin: bool = False,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be > 0, got {concurrency}")
        nodes = list(nodes)
        argvs = [make_argv(n) for n in nodes]  # fail fast, before anything runs
        emit = None
        if on_line is not None:
            lock = threading.Lock()

            def emit(node: Node, line: str) -> None:
                with lock:
                    on_line(node, line)

        self.nodes = nodes
        self._stdin = {n.host: _Stdin((stdin(n) or "") if stdin else "", hold_stdin)
                       for n in nodes if stdin is not None or hold_stdin}
        self._children = _Children()
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(nodes))),
                                        thread_name_prefix="fanout")
        self._futures = [
            self._pool.submit(
                _run_node, n, a, self._children, timeout=timeout, retries=retries, backoff=backoff,
                emit=emit, stdin=self._stdin.get(n.host) if stdin is not None or hold_stdin else None,
                once_heard=hold_stdin,
            )
            for n, a in zip(nodes, argvs)
        ]

    def done(self) -> bool:
        return all(f.done() for f in self._futures)

    def ended(self) -> list[str]:
        """Hosts whose command has ended (every line it printed already passed on_line)."""
        return [n.host for n, f in zip(self.nodes, self._futures) if f.done()]

    def send(self, host: str, text: str, close: bool = True) -> None:
        """More of host's standard input (hold_stdin); close: then its end."""
        self._stdin[host].send(text, close)

    def results(self) -> list[NodeResult]:
        try:
            # Poll rather than block: the main thread then notices Ctrl-C promptly on every OS.
            pending = set(self._futures)
            while pending:
                pending = wait(pending, timeout=0.2).not_done
            results = [f.result() for f in self._futures]
        except BaseException:  # KeyboardInterrupt above all: no child may outlive us
            self.cancel()
            raise
        self._pool.shutdown()
        return results

    def cancel(self) -> None:
        self._children.kill_all()
        self._pool.shutdown(wait=True, cancel_futures=True)


def run_all(nodes: Sequence[Node], make_argv: Callable[[Node], list[str]], **options) -> list[NodeResult]:
    """Run make_argv(node) on every node and wait for all: Fanout(...).results(), with
    Fanout's options (concurrency, timeout, retries, backoff, on_line, stdin)."""
    return Fanout(nodes, make_argv, **options).results()


def host_lines(failures: Sequence[tuple[str, str]]) -> str:
    """`  HOST: ERROR` lines for (host, error) pairs, one per distinct error in the order first
    seen: hosts that failed the same way share its line (`  h1, h2: exit 1: x`), so 32 nodes that
    cannot pull a misspelt image make one line, not 32."""
    hosts: dict[str, list[str]] = {}
    for host, error in failures:
        hosts.setdefault(error, []).append(host)
    return "\n".join(f"  {', '.join(h)}: {error}" for error, h in hosts.items())


def raise_on_failure(results: Sequence[NodeResult], what: str) -> None:
    """One LaunchError naming every failed host and why (host_lines); nothing if all succeeded."""
    failed = [r for r in results if not r.ok]
    if failed:
        lines = host_lines([(r.host, r.error or "failed") for r in failed])
        raise LaunchError(f"{what} failed on {len(failed)} of {len(results)} hosts:\n{lines}")
