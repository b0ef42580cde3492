"""A hang's stack dump, read: which ranks wait inside a collective, and which do not (the culprit).

launch/node/stacks.sh writes, per process of the attempt, a header and py-spy's dump, each line
as a user reads it (`[node rRANK] ...`):

    [node-2 r1] stack of pid 29, state T: python train.py        (state from /proc/PID/stat)
    [node-2 r1]   Thread 29 (idle): "MainThread"                  (py-spy: idle, active, active+gil)
    [node-2 r1]       load_batch (hang_train.py:24)               (frames, innermost first)

`parse` reads those lines back into processes; `place` says where one process is: stopped
(state T: SIGSTOP; a tracer's stop `t` is left to the stack, py-spy itself causes one), in disk
wait (D), inside a collective (a frame of torch.distributed's collectives, DDP's buffer and
gradient sync, Horovod's ops, DeepSpeed's comm; with `py-spy --native`, NCCL, gloo, c10d, MPI
frames), outside any collective (any other frame), or unread (no stack). `places` gives each
rank its place (its processes together: DataLoader workers share the rank's label), and
`verdict` names the culprits: the ranks not waiting in a collective, since ranks blocked in a
collective are the victims of one that never came. When every rank waits, nothing in the stacks
tells them apart: the caller falls back to progress counts (launch/jobs/progress.py `behind`)
and says so. With NCCL a collective returns before it completes: its waiters then show the line
that waits for the GPU (`loss.item()`), outside any collective; a stopped rank is still named.

Pure (lines in, values out); standard library only: the supervisor imports it on the node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from dtrain import contract

# `[node rN] text` or `[node] text` (a launcher process such as torchrun's agent: no rank)
_LABEL = re.compile(r"^\[(?P<node>[^\]\s]+)(?: r(?P<rank>\d{1,9}))?\](?P<rest>.*)$")
_HEADER = re.compile(r"^ ?stack of pid (?P<pid>\d{1,9}), state (?P<state>\S?): ?(?P<cmd>.*)$")
_THREAD = re.compile(r'^Thread (?P<tid>\S+) \((?P<status>[^)]*)\)(?:: "(?P<name>.*)")?$')
_FRAME = re.compile(r"^(?P<func>.+) \((?P<file>[^()]*)\)$")
_NATIVE = re.compile(r"^ +\(read natively\)$")
_MAIN_IDLE = re.compile(r"^ +\(main thread idle by its state: Python 3\.\d{1,3}\)$")
_OTHERS = re.compile(r"^ +\(other threads: (?P<running>\d{1,6}) running of \d{1,6}\)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

# A frame inside a collective: (file, function), both regexes; the file as py-spy shortens it
# (the part under site-packages: torch/distributed/distributed_c10d.py), or in full.
COLLECTIVE_FRAMES: tuple[tuple[re.Pattern, re.Pattern], ...] = tuple(
    (re.compile(f), re.compile(fn)) for f, fn in (
        # all_reduce, barrier, broadcast, all_gather, reduce_scatter, send/recv, the rendezvous
        # of init_process_group and new_group: every blocking call of torch.distributed
        (r"(^|/)torch/distributed/distributed_c10d\.py$", r"."),
        (r"(^|/)torch/distributed/_functional_collectives\.py$", r"."),
        # DDP's own collectives: buffers broadcast before forward, the unused-parameter and
        # bucket-rebuild allreduces, the join hooks
        (r"(^|/)torch/nn/parallel/distributed\.py$",
         r"^(_sync_buffers|_sync_module_buffers|_sync_params\w*|_distributed_broadcast_coalesced"
         r"|_default_broadcast_coalesced|_check_global_requires_backward_grad_sync"
         r"|_match_all_reduce_for_bwd_pass|_match_unused_params_allreduce|_find_common_rank"
         r"|_check_and_sync_module_buffers|_sync_final_model|_rebuild_buckets)$"),
        # Horovod: allreduce/allgather/broadcast/alltoall/reducescatter/join and synchronize(handle)
        (r"(^|/)horovod/\w+/mpi_ops\.py$", r"."),
        (r"(^|/)horovod/\w+/functions\.py$", r"^(broadcast|allgather|alltoall|allreduce)\w*$"),
        (r"(^|/)horovod/\w+/optimizer\.py$", r"^synchronize$"),
        (r"(^|/)deepspeed/comm/", r"."),
        (r"(^|/)tensorflow/python/ops/collective_ops\.py$", r"."),
    ))
# launch/node/stacks.sh's pre-filter for --straggler-check's native reads (a grep -E over py-spy's
# Python-only lines, given as its argument): a rank with a frame of these files (COLLECTIVE_FRAMES's
# that match any function) waits visibly in Python, and is not read natively (seconds each).
SEEN_IN_PYTHON = (r"\((.*/)?(torch/distributed/distributed_c10d|torch/distributed/_functional_collectives"
                  r"|horovod/[a-z_]+/mpi_ops|deepspeed/comm/[a-z_]+|tensorflow/python/ops/collective_ops)\.py:[0-9]+\)$")
# py-spy --native frames of the communication libraries themselves
NATIVE_COLLECTIVE = re.compile(r"\bnccl[A-Z]\w*|\bgloo::|\bc10d::|\bhorovod::common::|\bP?MPI_[A-Z]\w*|\bompi_coll_")
# py-spy --native: a thread blocked in a collective's own native code. The innermost frame that is
# not the C library's or the C++ runtime's (a condition variable, a futex, an unnamed address) is
# one of these waits: DDP's gradient allreduce at the end of backward (c10d::Reducer::
# finalize_backward: gloo and NCCL), a c10d Work's wait or synchronize (an explicit collective,
# a compiled step's), gloo's transport waits, Horovod's background loop, MPI's blocking calls.
# Launching a collective (c10d::ProcessGroupGloo::allreduce signalling its worker) is no wait.
NATIVE_WAIT = re.compile(r"c10d::Reducer::finalize_backward|c10d::\S*Work\S*::(wait|synchronize)\w*"
                         r"|c10d::\S*::(barrier|waitForFutureOrTimeout|monitoredBarrier)\b"
                         r"|gloo::\S*::(wait|recv|send)\w*|horovod::common::|\bP?MPI_(Wait|Recv|Barrier|Allreduce"
                         r"|Bcast|Allgather|Alltoall|Reduce)\w*|\bompi_(coll|request)_")
# A CUDA wait on the host (the rank's own kernels or a collective's): a collective's only where a
# c10d frame is further out on the same stack (a bare `loss.item()` waits for the rank's own work too).
CUDA_WAIT = re.compile(r"\bcu(da)?(Stream|Event|Device|Ctx)Synchronize\b")
_SYSTEM_LIB = re.compile(r"^(libc\.so|libpthread|libstdc\+\+|libgcc_s|ld-linux|libc-)")
# DDP's gradient allreduce waits at the end of backward, in the autograd engine: a rank whose
# innermost frame is the engine's entry waits there (gloo; with NCCL backward does not wait).
BACKWARD_FRAMES = ((re.compile(r"(^|/)torch/autograd/graph\.py$"), re.compile(r"^_engine_run_backward$")),
                   (re.compile(r"(^|/)torch/autograd/__init__\.py$"), re.compile(r"^backward$")))

STOPPED, DISK, COLLECTIVE, OUTSIDE, UNREAD = "stopped", "disk", "collective", "outside", "unread"
# How each culprit is said, in this order
SAID = {STOPPED: "stopped", DISK: "in disk wait", OUTSIDE: "outside any collective", UNREAD: "no stack read"}


@dataclass(frozen=True)
class Frame:
    func: str
    file: str  # as py-spy prints it: with `:line` where it has one

    def __str__(self) -> str:
        return f"{self.func} ({self.file})"


@dataclass(frozen=True)
class Thread:
    name: str
    status: str  # py-spy's: idle, active, active+gil
    frames: tuple[Frame, ...]  # innermost first


@dataclass(frozen=True)
class Proc:
    """One process of the dump (stacks.sh's header and py-spy's threads)."""

    node: str
    rank: int | None
    pid: int
    state: str  # /proc/PID/stat's: R, S, D, T, t, Z ("" where unread)
    cmd: str
    threads: tuple[Thread, ...] = ()
    # stacks.sh's sampling note: how many of its other threads ran (state R); None where unsaid
    others_running: int | None = None
    native: bool = False  # stacks.sh read it with py-spy --native (its note `(read natively)`)
    # stacks.sh's note where py-spy cannot tell idle without pausing (Python 3.10 and older): the
    # main thread asleep in the kernel (the process's state S)
    main_idle: bool = False


@dataclass(frozen=True)
class Place:
    """Where a rank is: kind (STOPPED, DISK, COLLECTIVE, OUTSIDE, UNREAD), the frame that says
    so (the collective's, or the innermost of the main thread) and the process state."""

    kind: str
    where: str = ""
    state: str = ""


@dataclass(frozen=True)
class Verdict:
    """The ranks named (not waiting in a collective), those waiting in one, those unread."""

    named: tuple[tuple[int, Place], ...] = ()
    waiting: tuple[int, ...] = ()
    unread: tuple[int, ...] = ()

    @property
    def read(self) -> bool:
        """Whether any rank's place was read (else the dump tells nothing)."""
        return bool(self.waiting) or any(p.kind != UNREAD for _, p in self.named)


def _file_of(frame: Frame) -> str:
    """The frame's file without its `:line`."""
    head, sep, tail = frame.file.rpartition(":")
    return head if sep and tail.isdigit() else frame.file


def _matches(frame: Frame, table) -> bool:
    path = _file_of(frame)
    return any(f.search(path) and fn.search(frame.func) for f, fn in table)


def collective_frame(thread: Thread) -> Frame | None:
    """The frame by which `thread` waits inside a collective, or None: a collective call
    anywhere on its stack (those calls run no user code), or backward as its innermost frame."""
    for fr in thread.frames:
        if _matches(fr, COLLECTIVE_FRAMES) or NATIVE_COLLECTIVE.search(fr.func):
            return fr
    if (fr := native_wait(thread)) is not None:  # a CUDA wait under a c10d frame
        return fr
    if thread.frames and _matches(thread.frames[0], BACKWARD_FRAMES):
        return thread.frames[0]
    return None


def native_wait(thread: Thread) -> Frame | None:
    """The native frame by which `thread` blocks in a collective (NATIVE_WAIT, CUDA_WAIT), or
    None: py-spy --native's innermost frame past the C library and C++ runtime's own."""
    frames = thread.frames
    for i, fr in enumerate(frames):
        if fr.func.startswith("0x") or _SYSTEM_LIB.match(fr.file):
            continue
        if NATIVE_WAIT.search(fr.func):
            return fr
        if CUDA_WAIT.search(fr.func) and any("c10d::" in f.func for f in frames[i + 1:]):
            return fr
        return None
    return None


def parse(lines: Iterable[str]) -> list[Proc]:
    """The processes of a dump: stacks.sh's lines (with or without contract.STACK_LINE before
    them), in order; other lines (a rank's own output, py-spy's errors, a locals listing) are
    skipped. A process's lines run from its header to the next header of the same label."""
    procs: list[dict] = []
    open_: dict[tuple[str, str | None], dict] = {}  # label -> its process being read
    for raw in lines:
        line = _ANSI.sub("", raw.rstrip("\r\n"))
        if line.startswith(contract.STACK_LINE):
            line = line[len(contract.STACK_LINE):]
        m = _LABEL.match(line)
        if not m:
            continue
        key = (m.group("node"), m.group("rank"))
        rest = m.group("rest")
        h = _HEADER.match(rest)
        if h:
            p = {"node": key[0], "rank": None if key[1] is None else int(key[1]), "pid": int(h.group("pid")),
                 "state": h.group("state"), "cmd": h.group("cmd"), "threads": [], "indent": None, "others": None,
                 "native": False, "main_idle": False}
            procs.append(p)
            open_[key] = p
            continue
        p = open_.get(key)
        if p is None:
            continue
        o = _OTHERS.match(rest)
        if o and not p["threads"]:
            p["others"] = int(o.group("running"))
            continue
        if _NATIVE.match(rest) and not p["threads"]:
            p["native"] = True
            continue
        if _MAIN_IDLE.match(rest) and not p["threads"]:
            p["main_idle"] = True
            continue
        body = rest.lstrip(" ")
        indent = len(rest) - len(body)
        t = _THREAD.match(body)
        if t:
            p["threads"].append({"name": t.group("name") or "", "status": t.group("status"), "frames": []})
            p["indent"] = indent
            continue
        f = _FRAME.match(body)
        if f and p["threads"] and p["indent"] is not None and p["indent"] < indent <= p["indent"] + 4:
            p["threads"][-1]["frames"].append(Frame(f.group("func"), f.group("file")))
    return [Proc(p["node"], p["rank"], p["pid"], p["state"], p["cmd"],
                 tuple(Thread(t["name"], t["status"], tuple(t["frames"])) for t in p["threads"]), p["others"],
                 p["native"], p["main_idle"])
            for p in procs]


def main_thread(proc: Proc) -> Thread | None:
    """The process's main thread: the one py-spy names MainThread, else the first listed."""
    return next((t for t in proc.threads if t.name == "MainThread"), proc.threads[0] if proc.threads else None)


def place(proc: Proc) -> Place:
    """Where one process is (module docstring)."""
    state = proc.state
    main = main_thread(proc)
    # the innermost Python frame (with py-spy --native, C frames come first: a libc sleep says little)
    inner = str(next((f for f in main.frames if _file_of(f).endswith(".py")), main.frames[0])) \
        if main is not None and main.frames else ""
    if state == "T":
        return Place(STOPPED, inner, state)
    if state == "D":
        return Place(DISK, inner, state)
    for t in ([main] if main is not None else []) + [t for t in proc.threads if t is not main]:
        fr = collective_frame(t)
        if fr is not None:
            return Place(COLLECTIVE, str(fr), state)
    if inner:
        return Place(OUTSIDE, inner, state)
    return Place(UNREAD, "", state)


# A rank's processes together (the rank and its DataLoader workers, which share its label): the
# first kind in this order wins. A worker briefly in D while the rank waits in a collective is
# no culprit; a stopped process stops its rank.
_RANK_ORDER = (STOPPED, COLLECTIVE, DISK, OUTSIDE, UNREAD)


def places(procs: Iterable[Proc]) -> dict[int, Place]:
    """Each rank's place, from the processes labelled with a rank."""
    out: dict[int, Place] = {}
    for p in procs:
        if p.rank is None:
            continue
        here = place(p)
        if p.rank not in out or _RANK_ORDER.index(here.kind) < _RANK_ORDER.index(out[p.rank].kind):
            out[p.rank] = here
    return out


def verdict(found: Mapping[int, Place], world: int | None = None) -> Verdict:
    """The culprits: the ranks not waiting in a collective (stopped, in disk wait, elsewhere);
    the ranks of `world` (0..world-1; None: those found) without a place are unread, and named
    only where every rank read waits in a collective (a rank whose process is gone, or whose
    dump failed, is then the one the others wait for)."""
    ranks = range(world) if world is not None else sorted(found)
    at = {r: found.get(r, Place(UNREAD)) for r in ranks}
    waiting = tuple(r for r in ranks if at[r].kind == COLLECTIVE)
    unread = tuple(r for r in ranks if at[r].kind == UNREAD)
    named = tuple((r, at[r]) for r in ranks if at[r].kind not in (COLLECTIVE, UNREAD))
    if not named and waiting:
        named = tuple((r, at[r]) for r in unread)
    return Verdict(named, waiting, unread)


def of_dump(lines: Iterable[str], world: int | None = None) -> Verdict:
    return verdict(places(parse(lines)), world)


# ---------------------------------------------------------------- said


def event_fields(v: Verdict, ranks: Sequence[str]) -> dict:
    """The `hang` event's fields for the verdict (supervision.hang_line shows them): culprits
    [{rank, node, kind, where, state}], the ranks waiting in a collective, the unread ones."""
    def node(r: int) -> str:
        return ranks[r] if 0 <= r < len(ranks) else "?"

    return {"culprits": [{"rank": r, "node": node(r), "kind": p.kind, "where": p.where, "state": p.state}
                         for r, p in v.named],
            "waiting": list(v.waiting), "unread": list(v.unread)}


def _detail(c: Mapping) -> str:
    kind, where, state = c.get("kind"), c.get("where") or "", c.get("state") or ""
    if kind == STOPPED:
        return f"state {state or 'T'}"
    if kind == DISK:
        return f"state {state or 'D'}" + (f", in {where}" if where else "")
    if kind == OUTSIDE:
        return f"in {where}" + (f", state {state}" if state else "")
    return ""


def _ranks(rs: Sequence[int], most: int = 8) -> str:
    shown = ", ".join(f"r{r}" for r in rs[:most])
    return shown + (f" and {len(rs) - most} more" if len(rs) > most else "")


def culprit_text(ev: Mapping, *, brief: bool = False) -> str | None:
    """The culprits of a `hang` event's fields as words (`stopped: r1 on node-2 (state T); r0,
    r2 wait in a collective`); brief: `stopped: r1 (node-2, state T)`, for the attempt's end.
    None where the stacks named nobody (every rank waits, or nothing was read): the caller
    falls back to progress counts and says so (fallback_text)."""
    culprits = list(ev.get("culprits") or [])
    if not culprits:
        return None
    parts = []
    for kind, said in SAID.items():
        these = [c for c in culprits if c.get("kind") == kind]
        if not these:
            continue
        if brief:
            who = ", ".join(f"r{c['rank']} ({', '.join(x for x in (str(c.get('node')), _detail(c)) if x)})"
                            for c in these)
        else:
            who = ", ".join(f"r{c['rank']} on {c.get('node')}" + (f" ({_detail(c)})" if _detail(c) else "")
                            for c in these)
        parts.append(f"{said}: {who}")
    waiting = list(ev.get("waiting") or [])
    if waiting and not brief:
        parts.append(f"{_ranks(waiting)} {'waits' if len(waiting) == 1 else 'wait'} in a collective")
    return "; ".join(parts)


def fallback_text(ev: Mapping) -> str:
    """Why the stacks named nobody, before the progress counts' `behind`."""
    if ev.get("waiting"):
        return "every rank waits in a collective (stacks); by progress, behind"
    return "no rank's stack read; by progress, behind"
