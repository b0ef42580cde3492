# dtrain-rank-output: one mpirun/horovodrun rank's output, every line tagged with its rank.
"""Runs one rank's command and tags each line of its output with the rank, as Open MPI's
`--tag-output` would, without the loss that option has (Open MPI 4.1 tags a 4 KB read of a
rank's output into an 8 KB buffer and drops what does not fit: many short lines lose some).

    python3 -I -S -c "$(cat rank_output.py)" COMMAND ARGS...

launch/jobs/launchers/ (mpirun.py, horovodrun.py: attempt_argv) puts this before the job's command on the mpirun command
line, which then runs without --tag-output. The rank comes from OMPI_COMM_WORLD_RANK (or
HOROVOD_RANK, PMIX_RANK); where none is set, COMMAND is exec'd as it is.

- COMMAND's stdout is a pseudo-terminal, as Open MPI gives a rank (programs line-buffer it),
  its stderr a pipe; stdin, the environment and the process group are this process's.
- Each line becomes `[1,RANK]<stdout>:LINE` (or <stderr>), the format launch/jobs/output.py
  (MpiOutput) and dtrain diagnose read. A `\\r` ends a line too (a progress bar's updates: one
  line each). A line not ended within 5 ms of its last byte goes as it is, without its end (a
  prompt, a progress bar's text before its next `\\r`); its rest follows tagged again.
- All of it goes to this process's stderr, a pipe from Open MPI's daemon, as packets (the
  pipe's packet mode, O_DIRECT): each write of whole tagged lines, at most 4 KB, is one read
  of the daemon, so a rank's lines never break apart, nor mix with another rank's, on the way
  to mpirun. Each packet also leaves room for `--tag-output`'s own tags (horovodrun adds that
  option) within Open MPI's 8 KB.
- When COMMAND has exited, its outputs are read for DRAIN s more at most: a child it left
  running and holding them (which Open MPI would wait for) is not waited for, its output after
  that is not read, and this exits as COMMAND did.
- Signals: Open MPI signals a rank's process group, which COMMAND is in, so this process
  ignores SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 and relays until COMMAND's
  output ends; it then exits as COMMAND did (its code, or the same signal).
"""

from __future__ import annotations

import _signal as signal  # signal's own functions and numbers, without its enum (3 ms a rank)
import errno
import fcntl
import os
import select
import sys
import termios
import time

PACKET = 4096  # the most Open MPI's daemon reads at once (ORTE_IOF_BASE_MSG_MAX)
TAGGED_MAX = 8192  # Open MPI's buffer for one read once --tag-output tagged it
ORTE_TAG = 32  # room per line for such a tag: `[JOB,RANK]<stdout>:` and its end
PARTIAL_WAIT = 0.005  # s a line may stay unfinished before it goes as it is
DRAIN = 0.5  # s the output may go on once COMMAND has exited (a child of it left holding it)
RANK_VARS = ("OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "PMIX_RANK")
# what this process outlives: sent to the process group, COMMAND gets them too
OUTLIVED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def rank_of(env) -> int | None:
    for name in RANK_VARS:
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def fits(size: int, lines: int) -> bool:
    """A packet of `size` bytes holding `lines` newlines: one read of the daemon, and within
    Open MPI's buffer once --tag-output tags each of its lines."""
    return size <= PACKET and size + ORTE_TAG * (lines + 1) <= TAGGED_MAX - ORTE_TAG


def tagged(tag: bytes, data: bytes) -> list[bytes]:
    """`data` (whole lines, or a line's part without its newline) as tagged pieces: each line
    one piece, a line too long for a packet cut (between UTF-8 characters) into pieces that
    each carry the tag."""
    room = PACKET - len(tag) - 2 * ORTE_TAG
    out = []
    for line in data.splitlines(keepends=True):
        while len(line) > room:
            cut = char_cut(line, room)
            out.append(tag + line[:cut])
            line = line[cut:]
        out.append(tag + line)
    return out


def char_cut(data: bytes, n: int) -> int:
    """n, or less where data[:n] would end inside a UTF-8 character: a tag between its bytes
    would make both halves unreadable (n where data is no UTF-8 there)."""
    for p in range(n - 1, max(n - 4, 0) - 1, -1):
        b = data[p]
        if b < 0x80 or b >= 0xF8:  # ASCII, or no UTF-8 byte
            return n
        if b >= 0xC0:  # a character's first byte
            size = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return p if 0 < p and p + size > n else n
    return n


def packets(pieces: list[bytes]) -> list[bytes]:
    """Tagged pieces packed in order into packets that each fit (fits)."""
    out: list[bytes] = []
    cur: list[bytes] = []
    size = lines = 0
    for p in pieces:
        n = p.count(b"\n")
        if cur and not fits(size + len(p), lines + n):
            out.append(b"".join(cur))
            cur, size, lines = [], 0, 0
        cur.append(p)
        size, lines = size + len(p), lines + n
    if cur:
        out.append(b"".join(cur))
    return out


class Stream:
    """One of COMMAND's outputs: what is read of it and not yet sent (an unfinished line), and
    whether the last piece sent left a line open (sent without its end)."""

    def __init__(self, fd: int, tag: bytes):
        self.fd, self.tag, self.rest, self.open = fd, tag, b"", False

    def take(self, data: bytes) -> list[bytes]:
        """The pieces of `data`'s finished lines, ended by \n or \r (a progress bar's update);
        an unfinished one is kept (rest), unless it fills a packet already (then all but a UTF-8
        character read in part goes). A \r last is kept too: it may be the first half of \r\n."""
        data = self.rest + data
        end = data[:-1] if data.endswith(b"\r") else data
        cut = max(end.rfind(b"\n"), end.rfind(b"\r")) + 1
        if len(data) - cut >= PACKET:
            cut = char_cut(data, len(data))  # a character read in part waits for its rest
        self.rest = data[cut:]
        return self._pieces(data[:cut])

    def flush(self) -> list[bytes]:
        rest, self.rest = self.rest, b""
        return self._pieces(rest)

    def _pieces(self, data: bytes) -> list[bytes]:
        """tagged(data), less a lone \r where no line is open: a progress bar writes \r before
        its text, which would make an empty line; where a line is open, the \r ends it."""
        out = []
        for piece in tagged(self.tag, data):
            body = piece[len(self.tag):]
            if body == b"\r" and not self.open:
                continue
            out.append(piece)
            self.open = not body.endswith((b"\n", b"\r"))
        return out


def packet_mode(fd: int) -> None:
    """The pipe's packet mode where `fd` is a pipe (else nothing changes)."""
    try:
        if os.fstat(fd).st_mode & 0o170000 == 0o010000:  # S_IFIFO
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)
    except OSError:
        pass


def terminal() -> tuple[int, int]:
    """A pseudo-terminal as Open MPI sets one up for a rank: no echo, no \\n -> \\r\\n."""
    master, slave = os.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~(termios.OPOST | termios.ONLCR | termios.OCRNL)
    attrs[3] &= ~(termios.ECHO | termios.ECHOE | termios.ECHOK | termios.ECHONL)
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    return master, slave


def start(argv: list[str]) -> tuple[int, int, int]:
    """COMMAND forked: (pid, its stdout's terminal, its stderr's pipe), the read ends."""
    master, slave = terminal()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            for s in (signal.SIGPIPE, signal.SIGXFSZ, *OUTLIVED):  # as Python found them: default
                signal.signal(s, signal.SIG_DFL)
            os.dup2(slave, 1)
            os.dup2(err_w, 2)
            for fd in (master, slave, err_r, err_w):
                if fd > 2:
                    os.close(fd)
            os.execvp(argv[0], argv)
        except OSError as e:
            os.write(2, f"rank_output.py: cannot run '{argv[0]}': {e.strerror}\n".encode(errors="replace"))
        finally:
            os._exit(127)
    os.close(slave)
    os.close(err_w)
    return pid, master, err_r


def write_all(fd: int, data: bytes) -> bool:
    """data to fd (waiting while a non-blocking pipe is full); False where the reader is gone."""
    try:
        while data:
            try:
                data = data[os.write(fd, data):]
            except BlockingIOError:
                select.select([], [fd], [])
    except OSError as e:
        if e.errno in (errno.EPIPE, errno.EBADF, errno.EIO):
            return False
        raise
    return True


def read(fd: int) -> bytes:
    """What fd has; b"" at its end (EIO: a terminal's last writer closed it)."""
    try:
        return os.read(fd, 65536)
    except OSError as e:
        if e.errno == errno.EIO:
            return b""
        raise


def relay(pid: int, streams: list[Stream], out: int) -> int:
    """COMMAND's output to `out`, tagged, until both its outputs end (or, COMMAND gone, DRAIN s
    after); COMMAND's wait status. Where `out` is gone, COMMAND's outputs are closed (it sees
    them end, as it would with Open MPI's daemon gone)."""
    poll = select.poll()
    live = {s.fd: s for s in streams}
    for fd in live:
        poll.register(fd, select.POLLIN)
    status, drain_end = None, 0.0
    while live:
        if status is None:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status, drain_end = st, time.monotonic() + DRAIN
        elif time.monotonic() > drain_end:  # COMMAND gone; what a child of it still writes is not waited for
            pieces = [piece for s in live.values() for piece in s.flush()]
            if pieces:
                all(write_all(out, p) for p in packets(pieces))
            break
        unfinished = any(s.rest for s in live.values())
        ready = poll.poll(PARTIAL_WAIT * 1000 if unfinished else 50 if status is not None else 200)
        pieces: list[bytes] = []
        for fd, _ in ready:
            data = read(fd)
            if data:
                pieces += live[fd].take(data)
            else:
                pieces += live.pop(fd).flush()
                poll.unregister(fd)
        if not ready:  # quiet for PARTIAL_WAIT: unfinished lines go as they are
            for s in live.values():
                pieces += s.flush()
        if pieces and not all(write_all(out, p) for p in packets(pieces)):
            break
    for s in streams:
        os.close(s.fd)
    if status is None:
        _, status = os.waitpid(pid, 0)
    return status


def end_as(status: int) -> None:
    """Exit as COMMAND did: its code, or the signal that ended it (without a core dump here).
    Nothing is left to flush: os._exit, not the interpreter's 4 ms of teardown."""
    if os.WIFSIGNALED(status):
        import resource

        sig = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if sig != signal.SIGKILL:
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def main(argv: list[str]) -> None:
    if not argv:
        sys.stderr.write("usage: rank_output.py COMMAND ARGS...\n")
        sys.exit(2)
    rank = rank_of(os.environ)
    if rank is None:
        os.execvp(argv[0], argv)
    for s in OUTLIVED:
        signal.signal(s, lambda *_: None)  # the process group has it: COMMAND gets its own
    pid, out_r, err_r = start(argv)
    packet_mode(2)
    status = relay(pid, [Stream(out_r, b"[1,%d]<stdout>:" % rank), Stream(err_r, b"[1,%d]<stderr>:" % rank)], 2)
    end_as(status)


if __name__ == "__main__":
    main(sys.argv[1:])
