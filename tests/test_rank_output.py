"""launch/node/rank_output.py: a rank's command under it, as mpirun runs it (its stderr a pipe
the reader takes 4 KB at a time): every line arrives tagged with the rank, whole, in packets
that each fit one read and Open MPI's tag buffer; the command sees a terminal on stdout; exit
codes and signals come through. The cluster test (test_launch) runs it under real mpirun."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dtrain import contract
from dtrain.launch.jobs.output import MpiOutput

# timing bounds (a heartbeat, a supervisor's reaction): run with the cluster tests, not beside them (dtrain/suite.py)
pytestmark = pytest.mark.serial

NODE = Path(__file__).resolve().parent.parent / "launch" / "node"
PROGRAM = contract.node_script("rank_output.py")

spec = importlib.util.spec_from_file_location("rank_output", NODE / "rank_output.py")
ro = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ro)


def start(command: list[str], rank: int | None = 2, **kw) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ro.RANK_VARS}
    if rank is not None:
        env["OMPI_COMM_WORLD_RANK"] = str(rank)
    return subprocess.Popen([sys.executable, "-I", "-S", "-c", PROGRAM, *command], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def reads(fd: int) -> list[bytes]:
    """The pipe read as Open MPI's daemon reads it: 4 KB at a time, to its end."""
    out = []
    while chunk := os.read(fd, 4096):
        out.append(chunk)
    return out


def lines_of(chunks: list[bytes]) -> list[str]:
    m = MpiOutput(["node-1", "node-1", "node-2"], "node-1")
    out = []
    for line in b"".join(chunks).decode().removesuffix("\n").split("\n"):
        out += m.feed(line)
    return out + m.flush()


def test_packets_fit_one_read_and_the_tag_buffer():
    tag = b"[1,12]<stdout>:"
    pieces = ro.tagged(tag, b"".join(b"%d\n" % i for i in range(5000)) + b"x" * 10000 + b"\n" + b"end")
    assert pieces[0] == tag + b"0\n" and pieces[-1] == tag + b"end"
    long = [p for p in pieces if b"x" in p]
    assert len(long) == 3 and all(p.startswith(tag) for p in long) and long[-1].endswith(b"x\n")
    assert b"".join(p[len(tag):] for p in long) == b"x" * 10000 + b"\n"
    packs = ro.packets(pieces)
    assert b"".join(packs) == b"".join(pieces)
    assert all(len(p) <= 4096 for p in packs)
    # once Open MPI's --tag-output (horovodrun) puts its own tag on each line: within 8 KB
    assert all(len(p) + 32 * (p.count(b"\n") + 1) <= 8192 for p in packs)
    assert all(p.startswith(tag) for p in packs) and len(packs) > 5000 * 17 // 4096


def test_a_stream_keeps_an_unfinished_line_until_its_end_or_a_flush():
    s = ro.Stream(0, b"[1,0]<stdout>:")
    assert s.take(b"a\nb") == [b"[1,0]<stdout>:a\n"] and s.rest == b"b"
    assert s.take(b"c\n") == [b"[1,0]<stdout>:bc\n"] and s.rest == b""
    assert s.take(b"tqdm 10%\r") == [] and s.flush() == [b"[1,0]<stdout>:tqdm 10%\r"]
    room = 4096 - 14 - 64  # a packet less the tag and room for --tag-output's
    assert s.take(b"y" * 5000) == [b"[1,0]<stdout>:" + b"y" * room, b"[1,0]<stdout>:" + b"y" * (5000 - room)]


def test_a_progress_bar_shows_one_line_an_update_and_no_empty_one():
    """tqdm writes `\\r` before each update: the first ends no line (it showed as an empty
    line of the rank); the next ones end the update before them."""
    s = ro.Stream(0, b"[1,0]<stdout>:")
    sent = s.take(b"\r 0%") + s.flush() + s.take(b"\r 50%") + s.flush() + s.take(b"\r100%\n")
    assert sent == [b"[1,0]<stdout>: 0%", b"[1,0]<stdout>:\r", b"[1,0]<stdout>: 50%", b"[1,0]<stdout>:\r",
                    b"[1,0]<stdout>:100%\n"]
    m = MpiOutput(["node-1"], "node-1")  # read as supervise.py reads mpirun's output: \\r ends a line
    shown = [out for ln in b"".join(sent).decode().splitlines() for out in m.feed(ln)]
    assert shown + m.flush() == ["[node-1 r0]  0%", "[node-1 r0]  50%", "[node-1 r0] 100%"]
    assert s.take(b"\r\n\r\r\n") == [b"[1,0]<stdout>:\r\n", b"[1,0]<stdout>:\r\n"]  # a CRLF empty line stays


def test_a_long_line_is_cut_between_utf8_characters():
    """A tag inside a character would leave both halves unreadable (U+FFFD twice on the screen):
    long lines are cut, and a read ending inside a character is held, at characters' edges."""
    tag = b"[1,0]<stdout>:"
    for ch in ("\u00e9", "\u65e5", "\U0001f600"):  # 2, 3 and 4 bytes
        line = (ch * 3000 + "\n").encode()
        pieces = ro.tagged(tag, line)
        assert len(pieces) > 1 and b"".join(p[len(tag):] for p in pieces) == line
        assert all(p[len(tag):].decode() for p in pieces)  # each piece whole characters
        s = ro.Stream(0, tag)
        part = (ch * 3000).encode()[:-1]  # the last character read in part
        sent = s.take(part)
        assert s.rest == part[len(part) - len(ch.encode()) + 1:]
        assert all(p[len(tag):].decode() for p in sent + s.take(ch.encode()[-1:] + b"\n"))
    assert ro.tagged(tag, b"\xff" * 5000)[0] == tag + b"\xff" * (4096 - 14 - 64)  # no UTF-8: cut as it is


def test_a_long_non_ascii_line_arrives_readable():
    text = "\u65e5\u672c" * 3000
    proc = start(py(f"print({text!r})"))
    chunks = reads(proc.stderr.fileno())
    assert proc.wait(30) == 0
    assert lines_of(chunks) == [f"[node-2 r2] {text}"]

def test_many_short_lines_arrive_whole_and_in_order_under_a_slow_reader():
    """100,000 short lines on stdout and 1,000 on stderr, read late, 4 KB at a time (the pipe
    full meanwhile): each read begins with the rank's tag (a packet), none is lost."""
    code = ("import sys\n"
            "for i in range(100000): sys.stdout.write(f'{i}\\n')\n"
            "for i in range(1000): sys.stderr.write(f'e{i}\\n')\n")
    proc = start(py(code))
    time.sleep(1)  # the pipe fills: the packets wait in it
    chunks = reads(proc.stderr.fileno())
    assert proc.wait(30) == 0 and proc.stdout.read() == b""
    assert all(c.startswith(b"[1,2]<std") for c in chunks), [c[:20] for c in chunks if not c.startswith(b"[1,2]")][:3]
    lines = lines_of(chunks)
    assert [ln for ln in lines if not ln.startswith("[node-2 r2] e")] == [f"[node-2 r2] {i}" for i in range(100000)]
    assert [ln for ln in lines if ln.startswith("[node-2 r2] e")] == [f"[node-2 r2] e{i}" for i in range(1000)]


def test_the_command_sees_a_terminal_an_unfinished_line_goes_on_a_pause():
    code = ("import os, sys, time\n"
            "print('tty', os.isatty(1), os.isatty(2), flush=True)\n"
            "sys.stdout.write('loss 0.3'); sys.stdout.flush(); time.sleep(0.3)\n"
            "sys.stdout.write(' step 2\\n'); sys.stdout.write('no newline')\n")
    proc = start(py(code))
    chunks = reads(proc.stderr.fileno())
    assert proc.wait(30) == 0
    raw = b"".join(chunks)
    assert raw == (b"[1,2]<stdout>:tty True False\n[1,2]<stdout>:loss 0.3"
                   b"[1,2]<stdout>: step 2\n[1,2]<stdout>:no newline"), raw
    assert lines_of(chunks) == ["[node-2 r2] tty True False", "[node-2 r2] loss 0.3 step 2", "[node-2 r2] no newline"]


def test_exit_codes_and_signals_come_through():
    assert start(["sh", "-c", "exit 3"]).wait(30) == 3
    assert start(["sh", "-c", "kill -KILL $$"]).wait(30) == -signal.SIGKILL
    p = start(["no-such-command-dtrain"])
    assert p.wait(30) == 127
    assert p.stderr.read() == (b"[1,2]<stderr>:rank_output.py: cannot run 'no-such-command-dtrain': "
                               b"No such file or directory\n")


def test_a_signal_to_the_process_group_reaches_the_command_once():
    """Open MPI signals a rank's process group: the command handles SIGTERM (once) and exits 7,
    and so does its tagger, which outlives the signal."""
    code = ("import signal, sys, time\n"
            "got = []\n"
            "signal.signal(signal.SIGTERM, lambda *_: got.append(1))\n"
            "print('ready', flush=True)\n"
            "time.sleep(1.5)\n"
            "print('got', len(got), flush=True); sys.exit(7)\n")
    proc = start(py(code), start_new_session=True)
    assert proc.stderr.readline() == b"[1,2]<stdout>:ready\n"
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(30) == 7
    assert proc.stderr.read() == b"[1,2]<stdout>:got 1\n"


def test_without_a_rank_the_command_runs_as_it_is():
    proc = start(["sh", "-c", "echo $$; echo err >&2"], rank=None)
    out, err = proc.communicate(timeout=30)
    assert out == f"{proc.pid}\n".encode() and err == b"err\n"


def test_stdin_reaches_the_command():
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", PROGRAM, "cat"], stdin=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "OMPI_COMM_WORLD_RANK": "0"})
    _, err = proc.communicate(b"one\ntwo\n", timeout=30)
    assert err == b"[1,0]<stdout>:one\n[1,0]<stdout>:two\n"


def test_horovodrun_tags_on_top_of_these_are_read_as_one():
    """horovodrun adds --tag-output: Open MPI's tag, then rank_output.py's, on each line."""
    m = MpiOutput(["node-1", "node-2"], "node-1")
    assert m.feed("[1,1]<stderr>:[1,1]<stdout>:step 3 loss 0.2") == ["[node-2 r1] step 3 loss 0.2"]
    assert m.feed("[1,0]<stderr>:[1,0]<stdout>:loss 0.3[1,1]<stderr>:[1,1]<stdout>:x") == ["[node-2 r1] x"]
    assert m.feed("[1,0]<stderr>:[1,0]<stdout>: step 2") == ["[node-1 r0] loss 0.3 step 2"]


def test_a_progress_bar_is_a_line_per_update_and_streams_stay_apart():
    """tqdm's way: `\\r` then the bar, on stderr, a newline at the end; stdout between: each
    update is one line, no empty one, and stdout's line is not glued to stderr's open one."""
    code = ("import sys, time\n"
            "for i in (0, 50, 100):\n"
            "    sys.stderr.write(f'\\r{i:3d}%|bar|'); sys.stderr.flush(); time.sleep(0.05)\n"
            "print('done', flush=True)\n"
            "sys.stderr.write('\\n')\n")
    proc = start(py(code))
    raw = proc.stderr.read().decode()
    assert proc.wait(30) == 0
    # as the supervisor reads mpirun's output: text mode, \r a line end too
    m = MpiOutput(["node-1", "node-1", "node-2"], "node-1")
    lines = [s for line in raw.replace("\r\n", "\n").replace("\r", "\n").split("\n")[:-1] for s in m.feed(line)]
    lines += m.flush()
    assert sorted(lines) == sorted(["[node-2 r2]   0%|bar|", "[node-2 r2]  50%|bar|", "[node-2 r2] 100%|bar|",
                                    "[node-2 r2] done"]), (raw, lines)
    s = ro.Stream(0, b"[1,0]<stderr>:")
    assert s.take(b"\r 10%") == [] and s.flush() == [b"[1,0]<stderr>: 10%"]  # no empty line before it
    assert s.take(b"\r 20%") == [b"[1,0]<stderr>:\r"] and s.flush() == [b"[1,0]<stderr>: 20%"]
    assert s.take(b"\r") == [] and s.take(b"\n") == [b"[1,0]<stderr>:\r\n"]  # \r\n cut in two reads


def test_stack_dumps_know_the_tagger_by_its_first_line():
    """launch/node/stacks.sh leaves out the process whose command line holds an argument that
    starts `# dtrain-rank-output` (python3 -c PROGRAM): the program's first line."""
    assert PROGRAM.startswith("# dtrain-rank-output")
    assert "grep -qza '^# dtrain-rank-output' \"$p/cmdline\"" in contract.node_script("stacks.sh")


def test_a_child_left_writing_is_not_waited_for_and_the_open_line_still_goes():
    """The command exits, leaving a child that holds its output and writes on without a
    newline: the tagger exits as the command did about DRAIN s later, and sends the open line."""
    code = ("import os, sys, time\n"
            "print('main done', flush=True)\n"
            "if os.fork() == 0:\n"
            "    while True: sys.stdout.write('x'); sys.stdout.flush(); time.sleep(0.001)\n"
            "sys.exit(4)\n")
    t0 = time.monotonic()
    proc = start(py(code), start_new_session=True)
    try:
        assert proc.wait(30) == 4
        took = time.monotonic() - t0
        raw = proc.stderr.read()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    assert raw.startswith(b"[1,2]<stdout>:main done\n[1,2]<stdout>:x") and raw.endswith(b"x"), raw[-80:]
    assert ro.DRAIN <= took < ro.DRAIN + 3, took
