"""Native frames (py-spy dump --native) of a rank blocked in a collective's C++ code: DDP's
gradient allreduce inside `backward` is seen only there (launch/analysis/stacks.py native_wait,
launch/analysis/straggler.py ranks_waiting). The dumps are real: tests/data/native_stacks/README.md
says how each was made (torch 2.13.0+cpu, gloo, py-spy 0.4.0)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from dtrain.launch.analysis import stacks, straggler

DATA = Path(__file__).resolve().parent / "data" / "native_stacks"


def _as_stacks_sh(name: str, label: str = "[node-1 r0]", state: str = "S") -> list[str]:
    """A raw py-spy dump as launch/node/stacks.sh writes it (its header, py-spy's lines labelled)."""
    body = [ln for ln in (DATA / name).read_text().splitlines()
            if ln.strip() and not ln.startswith(("Process ", "Python v"))]
    note = [f"{label}   (read natively)"] if name.endswith("_native.txt") else []  # as stacks.sh says it
    return [f"{label} stack of pid 1, state {state}: python ddp_train.py", *note] + [f"{label}   {ln}" for ln in body]


def _main(name: str) -> stacks.Thread:
    (proc,) = stacks.parse(_as_stacks_sh(name))
    return proc.threads[0]


def test_ddp_s_allreduce_wait_in_backward_is_a_native_wait():
    fr = stacks.native_wait(_main("ddp_waiting_native.txt"))
    assert fr is not None and fr.func == "c10d::Reducer::finalize_backward", fr


def test_launching_an_allreduce_or_computing_is_no_wait():
    assert stacks.native_wait(_main("ddp_launching_allreduce_native.txt")) is None  # ProcessGroupGloo::allreduce
    assert stacks.native_wait(_main("ddp_forward_native.txt")) is None  # mkl's sgemm
    assert stacks.native_wait(_main("ddp_waiting_python.txt")) is None  # no native frame at all


def test_python_only_the_waiting_rank_reads_as_not_waiting_natively_it_waits():
    """The blind spot the native frames close: the same wait, Python-only, is `_engine_run_backward`."""
    py = _as_stacks_sh("ddp_waiting_python.txt")
    assert straggler.ranks_waiting(py) == {0: False}
    both = _as_stacks_sh("ddp_waiting_native.txt") + _as_stacks_sh("ddp_forward_native.txt", "[node-2 r1]")
    assert straggler.ranks_waiting(both) == {0: True, 1: False}
    stopped = _as_stacks_sh("ddp_waiting_native.txt", state="T")  # a stopped rank waits for nobody
    assert straggler.ranks_waiting(stopped) == {0: False}


def test_a_round_of_stacks_sh_sampling_a_slowed_pair():
    """stacks.sh's own lines (sample mode) over two DDP ranks, rank 1 throttled: rank 0 waits."""
    lines = (DATA / "stacks_sh_sample_round.txt").read_text().splitlines()
    assert straggler.ranks_waiting(lines) == {0: True, 1: False}
    assert straggler.ranks_of_dump(lines) == {0: "node-1", 1: "node-1"}


def test_cuda_and_other_native_waits():
    def thread(*funcs: str) -> stacks.Thread:
        return stacks.Thread("MainThread", "idle", tuple(stacks.Frame(f, "lib.so") for f in funcs))

    libc = stacks.Frame("pthread_cond_wait", "libc.so.6")
    t = stacks.Thread("MainThread", "idle", (stacks.Frame("0x7f00", "libc.so.6"), libc,
                                             stacks.Frame("c10d::ProcessGroupGloo::AsyncWork::wait", "libtorch_cpu.so")))
    assert stacks.native_wait(t).func == "c10d::ProcessGroupGloo::AsyncWork::wait"
    assert stacks.native_wait(thread("c10d::ProcessGroupNCCL::WorkNCCL::synchronizeInternal"))
    assert stacks.native_wait(thread("gloo::transport::tcp::UnboundBuffer::waitRecv"))
    assert stacks.native_wait(thread("horovod::common::(anonymous namespace)::BackgroundThreadLoop"))
    # a CUDA wait is a collective's only under a c10d frame; a bare one (loss.item()) is the rank's own work
    assert stacks.native_wait(thread("cudaStreamSynchronize", "c10d::ProcessGroupNCCL::WorkNCCL::wait"))
    assert stacks.native_wait(thread("cudaStreamSynchronize", "at::native::_local_scalar_dense_cpu")) is None
    # the hang verdict counts it as a collective too
    assert stacks.collective_frame(thread("cudaStreamSynchronize", "c10d::Reducer::finalize_backward"))


def test_a_culprit_is_said_by_its_innermost_python_frame_not_a_c_one():
    lines = ["[node-2 r1] stack of pid 9, state S: python skip_collective.py",
             '[node-2 r1]   Thread 9 (idle): "MainThread"',
             "[node-2 r1]       clock_nanosleep (libc.so.6)",
             "[node-2 r1]       evaluate (skip_collective.py:23)",
             "[node-2 r1]       main (skip_collective.py:37)"]
    assert stacks.place(stacks.parse(lines)[0]) == stacks.Place(stacks.OUTSIDE, "evaluate (skip_collective.py:23)", "S")


# ---------------------------------------------------------------- stacks.sh's native reads, real processes


def _stacks_sh(tmp_path, *mode: str, path_first: str = "", sleeper: str = "sleep.py",
               then: Callable[[list[str]], list[str]] | None = None) -> tuple[list[str], str]:
    """stacks.sh over two real processes of an attempt: rank 0 asleep (idle: blocked in the
    kernel; its script `sleeper` under tmp_path, sleep.py's nap by default), rank 1 spinning (active), and a sleeping
    process without a rank. Its lines and stderr; with `then`, those of a second round over the
    same processes, its arguments after NODE then(the first round's lines)."""
    import os
    import subprocess
    import sys
    import time

    from dtrain import contract

    (tmp_path / "sleep.py").write_text("import time\ndef nap():\n    time.sleep(600)\nnap()\n")
    (tmp_path / "spin.py").write_text("def busy():\n    x = 0\n    while True:\n        x += 1\nbusy()\n")
    env = {**os.environ, "DTRAIN_TEST_ATTEMPT": "9"}
    procs = [subprocess.Popen([sys.executable, str(tmp_path / f)], env={**env, "RANK": str(r)})
             for r, f in enumerate((sleeper, "spin.py"))]
    procs.append(subprocess.Popen([sys.executable, str(tmp_path / "sleep.py")], env=env))  # an agent: no rank
    try:
        time.sleep(1)
        path = ":".join(p for p in (path_first, str(Path(sys.executable).parent), os.environ["PATH"]) if p)
        r = subprocess.run(["bash", "-s", "--", "DTRAIN_TEST_ATTEMPT", "9", "here", *mode],
                           input=contract.node_script("stacks.sh"), capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PATH": path})
        if then is not None:
            r = subprocess.run(["bash", "-s", "--", "DTRAIN_TEST_ATTEMPT", "9", "here", *then(r.stdout.splitlines())],
                               input=contract.node_script("stacks.sh"), capture_output=True, text=True, timeout=120,
                               env={**os.environ, "PATH": path})
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return r.stdout.splitlines(), r.stderr


def test_sampling_reads_natively_only_the_idle_rank(tmp_path):
    """--straggler-check's round: the sleeping rank (idle) is read with --native (a C frame under
    its Python ones); the spinning rank (active) Python-only (never paused); a sleeping process
    without a rank (a launcher's agent) Python-only too (a native read costs seconds)."""
    lines, err = _stacks_sh(tmp_path, "sample")
    procs = {p.rank: p for p in stacks.parse(lines)}
    assert set(procs) == {0, 1, None}, lines
    assert all(f.file.split(":")[0].endswith(".py") for f in procs[None].threads[0].frames), lines
    sleeper, spinner = (procs[r].threads[0].frames for r in (0, 1))
    assert any(f.func == "nap" for f in sleeper) and not sleeper[0].file.endswith(".py"), lines  # native first
    assert all(f.file.split(":")[0].endswith(".py") for f in spinner), lines  # Python frames only
    assert stacks.place(procs[0]).where.startswith("nap ("), lines  # said by its Python frame


def test_a_native_read_that_fails_is_said_and_the_python_read_stands(tmp_path):
    """A py-spy whose --native fails (as one without unwinding support, or a process it cannot
    pause): stacks.sh says so under the idle process's header and keeps its Python-only read;
    the spinning rank was never read natively (nothing said)."""
    import sys

    real = Path(sys.executable).parent / "py-spy"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "py-spy").write_text('#!/bin/bash\nfor a in "$@"; do [ "$a" != --native ] || '
                                 '{ echo "Error: Failed to suspend process" >&2; exit 1; }; done\n'
                                 f'exec {real} "$@"\n')
    (fake / "py-spy").chmod(0o755)
    lines, _ = _stacks_sh(tmp_path, "sample", path_first=str(fake))
    notes = [ln for ln in lines if "(native frames not read: " in ln]
    assert notes == ["[here r0]   (native frames not read: Error: Failed to suspend process)"], lines
    procs = {p.rank: p for p in stacks.parse(lines)}
    assert stacks.place(procs[0]).where.startswith("nap ("), lines
    assert all(f.file.split(":")[0].endswith(".py") for f in procs[0].threads[0].frames), lines


def test_a_hang_s_dump_reads_python_frames_only(tmp_path):
    """A hang's dump (no `sample`) must come within seconds: no process is read natively, not
    even an idle one (a native read costs seconds each: docs/benchmarks.md)."""
    lines, _ = _stacks_sh(tmp_path)
    procs = {p.rank: p for p in stacks.parse(lines)}
    assert set(procs) == {0, 1, None}, lines
    for p in procs.values():
        assert all(f.file.split(":")[0].endswith(".py") for t in p.threads for f in t.frames), lines
    v = stacks.of_dump(lines, 2)
    assert sorted(r for r, _ in v.named) == [0, 1] and dict(v.named)[1].where.startswith("busy ("), lines


def test_a_native_verdict_stands_for_its_process_at_its_place():
    """A native read pauses a rank for seconds: its verdict is kept by (node, pid, the main
    thread's innermost Python frame), and a later Python-only read of the same process idle at
    the same place reads as that verdict; another process, or the same one elsewhere, does not."""
    native = _as_stacks_sh("ddp_waiting_native.txt")
    place = ("node-1", 1, "_engine_run_backward (torch/autograd/graph.py:979)")
    assert straggler.native_verdicts(native) == {place: True}
    assert straggler.native_verdicts(_as_stacks_sh("ddp_forward_native.txt")) == {}  # computing: not idle
    assert straggler.native_verdicts(_as_stacks_sh("ddp_waiting_python.txt")) == {}  # not read natively
    py = _as_stacks_sh("ddp_waiting_python.txt")
    assert straggler.ranks_waiting(py, {place: (True,)}) == {0: True}
    assert straggler.ranks_waiting(py, {place: (False,)}) == {0: False}
    assert straggler.ranks_waiting(py, {place: (False, True, True)}) == {0: True}  # the majority
    assert straggler.ranks_waiting(py, {place: (True, False)}) == {0: False}  # a tie: the latest
    assert straggler.ranks_waiting(py, {(*place[:2], "main (ddp_train.py:49)"): (True,)}) == {0: False}
    assert straggler.ranks_waiting(py, {("node-2", 1, place[2]): (True,)}) == {0: False}
    stopped = _as_stacks_sh("ddp_waiting_python.txt", state="T")
    assert straggler.ranks_waiting(stopped, {place: (True,)}) == {0: False}
    # stacks.sh reads a place Python-only once NATIVE_AGREE reads agree: one read decides nothing
    other = ("node-2", 7, "f (a.py:1)")
    assert straggler.known_places({place: (True,), other: (False, False)}, "node-1") == ""
    assert straggler.known_places({place: (False, True, True), other: (False, False)}, "node-1") == \
        "1 _engine_run_backward (torch/autograd/graph.py:979)"
    assert straggler.learn(straggler.learn({}, native), native) == {place: (True, True)}


def test_a_process_is_read_natively_once_per_place(tmp_path):
    """stacks.sh's KNOWN (the supervisor's, from straggler.known_places): the idle rank read
    natively in the first round is read Python-only in the next, at the same place; its
    verdict comes from the first (ranks_waiting's `known`)."""
    known: dict = {}

    def second(first: list[str]) -> list[str]:
        known.update(straggler.learn(straggler.learn({}, first), first))  # as two agreeing rounds
        return ["sample", stacks.SEEN_IN_PYTHON, straggler.known_places(known, "here")]

    lines, _ = _stacks_sh(tmp_path, "sample", stacks.SEEN_IN_PYTHON, then=second)
    [(node, pid, frame)] = known  # the sleeping rank's nap, not a collective
    assert node == "here" and frame.startswith("nap (") and known[(node, pid, frame)] == (False, False), known
    procs = {p.rank: p for p in stacks.parse(lines)}
    assert set(procs) == {0, 1, None} and procs[0].pid == pid, lines
    assert all(f.file.split(":")[0].endswith(".py") for f in procs[0].threads[0].frames), lines  # Python only
    assert straggler.native_place(procs[0]) == (node, pid, frame), lines
    assert not procs[0].native and straggler.ranks_waiting(lines, {(node, pid, frame): (True,)}) == {0: True, 1: False}


def test_a_rank_whose_other_threads_run_waits_for_itself_not_a_peer():
    """Under a CPU quota the slowed rank's gloo threads are throttled too, and its main thread
    waits in `backward` for them as its peers wait for it (docs/benchmarks.md): stacks.sh says
    how many of a rank's other threads run, and a native wait counts only where none does."""
    native = _as_stacks_sh("ddp_waiting_native.txt")
    busy = [native[0], "[node-1 r0]   (other threads: 2 running of 9)", *native[1:]]
    idle = [native[0], "[node-1 r0]   (other threads: 0 running of 9)", *native[1:]]
    assert [p.others_running for p in stacks.parse(busy + idle)] == [2, 0]
    assert stacks.parse(native)[0].others_running is None  # a hang's dump: not said
    assert straggler.ranks_waiting(busy) == {0: False} and straggler.ranks_waiting(idle) == {0: True}
    py = _as_stacks_sh("ddp_waiting_python.txt")
    place = ("node-1", 1, "_engine_run_backward (torch/autograd/graph.py:979)")
    assert straggler.ranks_waiting([py[0], "[node-1 r0]   (other threads: 1 running of 9)", *py[1:]],
                                   {place: (True,)}) == {0: False}
    # a frame line that only looks like the note is a frame, not the note
    assert stacks.parse([*native, "[node-1 r0]   (other threads: 1 running of 9)"])[0].others_running is None


def test_sampling_says_how_many_of_a_rank_s_other_threads_run(tmp_path):
    """stacks.sh's sampling note, on real processes: rank 0 asleep with a spinning thread
    beside it (1 of 1 running), rank 1 spinning alone (0 of 0), the agent (no rank) unsaid."""
    (tmp_path / "sleep_busy.py").write_text(
        "import threading, time\ndef spin():\n    while True:\n        pass\n"
        "threading.Thread(target=spin, daemon=True).start()\ndef nap():\n    time.sleep(600)\nnap()\n")
    lines, _ = _stacks_sh(tmp_path, "sample", stacks.SEEN_IN_PYTHON, sleeper="sleep_busy.py")
    procs = {p.rank: p for p in stacks.parse(lines)}
    assert (procs[0].others_running, procs[1].others_running, procs[None].others_running) == (1, 0, None), lines
    assert "[here r0]   (other threads: 1 running of 1)" in lines, lines


def test_a_failed_native_read_is_told_once_per_process():
    """The supervisor shows stacks.sh's note (a sampled round is otherwise not in the log) once
    per process label: the wait it could not see is said where it is lost."""
    note = "[node-2 r1]   (native frames not read: Error: Failed to suspend process)"
    round_ = ["[node-2 r1] stack of pid 9, state S: python ddp_train.py", note,
              '[node-2 r1]   Thread 9 (idle): "MainThread"', "[node-2 r1]       main (ddp_train.py:49)"]
    told: set[str] = set()
    assert straggler.native_unread(round_, told) == [note]
    assert straggler.native_unread(round_, told) == []
    other = note.replace("node-2 r1", "node-3 r2")
    assert straggler.native_unread([note, other], told) == [other]


def test_a_native_read_that_prints_and_then_hangs_is_read(tmp_path):
    """Under load py-spy --native can print the whole stack and then not exit within stacks.sh's
    bound (NATIVE_S, seen on the simulated cluster): the printed stack stands, so a rank waiting
    in DDP's allreduce reads as waiting."""
    import sys

    real = Path(sys.executable).parent / "py-spy"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "py-spy").write_text(
        '#!/bin/bash\nfor a in "$@"; do [ "$a" != --native ] || { printf \'%s\\n\' '
        '"Thread 1 (idle): \\"MainThread\\"" "    pthread_cond_wait (libc.so.6)" '
        '"    c10d::Reducer::finalize_backward (libtorch_cpu.so)" "    main (ddp_train.py:49)"; exec sleep 60; }; done\n'
        f'exec {real} "$@"\n')
    (fake / "py-spy").chmod(0o755)
    lines, _ = _stacks_sh(tmp_path, "sample", path_first=str(fake))
    assert not [ln for ln in lines if "(native frames not read: " in ln], lines
    assert straggler.ranks_waiting(lines) == {0: True, 1: False}, lines


def test_a_rank_whose_python_frames_show_the_wait_is_not_read_natively(tmp_path):
    """stacks.sh's pre-filter (SEEN: stacks.SEEN_IN_PYTHON, from the supervisor): an idle rank
    whose Python stack has a frame of torch.distributed's collectives waits visibly, and is not
    paused for a native read (an explicit all_reduce each step: tests/test_straggler.py)."""
    pkg = tmp_path / "site-packages" / "torch" / "distributed"
    pkg.mkdir(parents=True)
    for d in (pkg, pkg.parent):
        (d / "__init__.py").write_text("")
    (pkg / "distributed_c10d.py").write_text("import time\ndef all_reduce():\n    time.sleep(600)\n")
    (tmp_path / "c10d_wait.py").write_text(f"import sys\nsys.path.insert(0, {str(tmp_path / 'site-packages')!r})\n"
                                           "from torch.distributed.distributed_c10d import all_reduce\nall_reduce()\n")
    lines, _ = _stacks_sh(tmp_path, "sample", stacks.SEEN_IN_PYTHON, sleeper="c10d_wait.py")
    procs = {p.rank: p for p in stacks.parse(lines)}
    assert set(procs) == {0, 1, None}, lines
    assert all(f.file.split(":")[0].endswith(".py") for f in procs[0].threads[0].frames), lines  # Python only
    assert straggler.ranks_waiting(lines) == {0: True, 1: False}, lines


def test_the_pre_filter_covers_every_collective_file_of_any_function():
    """SEEN_IN_PYTHON matches py-spy's line of a frame in each file COLLECTIVE_FRAMES takes
    whatever the function (both forms py-spy writes: under site-packages, in full), and not
    DDP's backward (where only native frames show the wait)."""
    import re

    examples = ["torch/distributed/distributed_c10d.py", "torch/distributed/_functional_collectives.py",
                "horovod/torch/mpi_ops.py", "deepspeed/comm/comm.py", "tensorflow/python/ops/collective_ops.py"]
    anyfn = [f for f, fn in stacks.COLLECTIVE_FRAMES if fn.pattern == "."]
    assert all(any(f.search(e) for e in examples) for f in anyfn), [f.pattern for f in anyfn]
    seen = re.compile(stacks.SEEN_IN_PYTHON)
    for e in examples:
        assert seen.search(f"    all_reduce ({e}:3252)") and seen.search(f"    f (/opt/venv/lib/site-packages/{e}:9)"), e
    assert not seen.search("    _engine_run_backward (torch/autograd/graph.py:979)")
    assert not seen.search("    all_reduce (torch/distributed/distributed_c10d.py:3252) extra")


def test_python_frames_as_py_spy_prints_them():
    """A `python -m` rank's outermost frames are <frozen runpy>'s: Python frames, not native ones
    (a place is read natively only where stacks.sh says so: `(read natively)`)."""
    py = [stacks.Frame("_run_module_as_main", "<frozen runpy>:198"), stacks.Frame("f", "a.py:3"),
          stacks.Frame("<module>", "<string>:1"), stacks.Frame("g", "torch/x.py")]
    nat = [stacks.Frame("pthread_cond_wait", "libc.so.6"), stacks.Frame("0x7f00", "libc.so.6"),
           stacks.Frame("c10d::Reducer::finalize_backward", "libtorch_cpu.so"), stacks.Frame("h", "reducer.cpp:77")]
    assert all(straggler._python_frame(f) for f in py) and not any(straggler._python_frame(f) for f in nat)
    lines = ["[n r0] stack of pid 4, state S: python -m train", '[n r0]   Thread 4 (idle): "MainThread"',
             "[n r0]       _engine_run_backward (torch/autograd/graph.py:979)",
             "[n r0]       _run_module_as_main (<frozen runpy>:198)"]
    [p] = stacks.parse(lines)
    assert not p.native and straggler.native_verdicts(lines) == {}
    assert straggler.native_place(p) == ("n", 4, "_engine_run_backward (torch/autograd/graph.py:979)")


def test_a_rank_value_that_is_no_number_is_no_label(tmp_path):
    """stacks.sh prefixes py-spy's lines with the label through awk's value, and RANK (the
    process's own environment) must be a number: `1/e touch X` would have been a sed command."""
    import os
    import subprocess
    import sys
    import time

    from dtrain import contract

    (tmp_path / "sleep.py").write_text("import time\ntime.sleep(600)\n")
    marker = tmp_path / "pwned"
    env = {**os.environ, "DTRAIN_TEST_ATTEMPT": "8", "RANK": f"1/;s/x/y/e touch {marker} #"}
    proc = subprocess.Popen([sys.executable, str(tmp_path / "sleep.py")], env=env)
    try:
        time.sleep(1)
        path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
        r = subprocess.run(["bash", "-s", "--", "DTRAIN_TEST_ATTEMPT", "8", "here"], input=contract.node_script("stacks.sh"),
                           capture_output=True, text=True, timeout=60, env={**os.environ, "PATH": path})
    finally:
        proc.kill()
        proc.wait()
    assert not marker.exists(), r.stdout
    assert r.stdout.startswith(f"[here] stack of pid {proc.pid}, state S"), r.stdout
    assert all(ln.startswith("[here]") for ln in r.stdout.splitlines()), r.stdout


def _sample_tree(argv: list[str], env: dict, attempt: str, path_first: str = "") -> tuple[list[str], int]:
    """One `stacks.sh sample` round (DTRAIN_TEST_ATTEMPT=attempt; path_first: before PATH, a
    stand-in py-spy) over the processes argv starts (a session of their own, killed after):
    stacks.sh's lines and argv's pid."""
    import os
    import subprocess
    import sys
    import time

    from dtrain import contract

    top = subprocess.Popen(argv, env={**env, "DTRAIN_TEST_ATTEMPT": attempt}, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(1.5)
        path = ":".join(x for x in (path_first, str(Path(sys.executable).parent), os.environ["PATH"]) if x)
        r = subprocess.run(["bash", "-s", "--", "DTRAIN_TEST_ATTEMPT", attempt, "here", "sample"],
                           input=contract.node_script("stacks.sh"), capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PATH": path})
    finally:
        os.killpg(top.pid, 9)
        top.wait()
    return r.stdout.splitlines(), top.pid


def _idle_ranks(tmp_path, ranks: list[str], fake_native: str, attempt: str = "7") -> tuple[list[str], Path]:
    """stacks.sh `sample` over sleeping processes, one per entry of `ranks` (its RANK; "": none),
    started in that order (all idle: each rank is read natively), with a py-spy whose --native
    runs `fake_native` (bash) first, logging `start T` / `end T` lines to the returned file, then
    the real py-spy."""
    import os
    import sys

    real = Path(sys.executable).parent / "py-spy"
    log = tmp_path / "native.log"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "py-spy").write_text(
        '#!/bin/bash\nfor a in "$@"; do if [ "$a" = --native ]; then\n'
        f'  echo "start $(date +%s.%N)" >> {log}; {fake_native}; echo "end $(date +%s.%N)" >> {log}; fi; done\n'
        f'exec {real} "$@"\n')
    (tmp_path / "bin" / "py-spy").chmod(0o755)
    (tmp_path / "sleep.py").write_text("import time\ndef nap():\n    time.sleep(600)\nnap()\n")
    start = ('py=$1 nap=$2; shift 2; for r in "$@"; do if [ -n "$r" ]; then RANK=$r "$py" "$nap" & '
             'else "$py" "$nap" & fi; sleep 0.05; done; wait')  # pids in this order
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    lines, _ = _sample_tree(["bash", "-c", start, "bash", sys.executable, str(tmp_path / "sleep.py"), *ranks], env,
                            attempt, path_first=str(tmp_path / "bin"))
    return lines, log


def _most_at_once(log: Path) -> int:
    edges = sorted((float(t), 1 if kind == "start" else -1) for kind, t in (ln.split() for ln in log.read_text().splitlines()))
    most = now = 0
    for _, d in edges:
        now += d
        most = max(most, now)
    return most


def test_native_reads_take_turns_and_one_without_a_turn_waits_for_a_later_round(tmp_path):
    """Six idle ranks on a node: at most NATIVE_AT_ONCE (4) native reads at a time (each costs
    about a CPU-second); reads of 3 s leave two ranks without a turn within NATIVE_WAIT (2 s):
    their Python-only read stands, with no `not read` note (a later round reads them)."""
    lines, log = _idle_ranks(tmp_path, [str(r) for r in range(6)], "sleep 3")
    assert _most_at_once(log) <= 4, log.read_text()
    procs = stacks.parse(lines)
    assert sorted(p.rank for p in procs) == list(range(6)), lines
    assert sum(p.native for p in procs) == 4, lines
    assert not [ln for ln in lines if "(native frames not read" in ln], lines


def test_native_reads_that_fit_their_turns_are_all_read(tmp_path):
    """Six idle ranks, reads of 0.5 s: every one is read natively, never more than 4 at a time."""
    lines, log = _idle_ranks(tmp_path, [str(r) for r in range(6)], "sleep 0.5", attempt="6")
    assert _most_at_once(log) <= 4, log.read_text()
    assert sum(p.native for p in stacks.parse(lines)) == 6, lines


def test_a_rank_s_own_workers_are_not_read_natively(tmp_path):
    """A DataLoader's workers are the rank's children with its RANK: idle on their queue, they
    were each read natively (seconds apiece, a pause each). Now only the rank is; its workers
    are read Python-only and stay in the dump under the rank's label."""
    import os
    import sys

    (tmp_path / "rank.py").write_text(
        "import subprocess, sys, time\n"
        "w = [subprocess.Popen([sys.executable, '-c', 'import time\\ndef worker_loop():\\n    time.sleep(600)\\nworker_loop()'])"
        " for _ in range(2)]\n"
        "def nap():\n    time.sleep(600)\nnap()\n")
    lines, pid = _sample_tree([sys.executable, str(tmp_path / "rank.py")], {**os.environ, "RANK": "0"}, "5")
    procs = stacks.parse(lines)
    assert len(procs) == 3 and {p.rank for p in procs} == {0}, lines
    natively = [p for p in procs if p.native]
    assert [p.pid for p in natively] == [pid], lines
    workers = [p for p in procs if p.pid != pid]
    assert all(any(f.func == "worker_loop" for f in p.threads[0].frames) for p in workers), lines


def test_a_full_tmp_is_said_not_silent(tmp_path):
    """stacks.sh cannot make its temporary directory: one line says so (the supervisor shows
    it; before, the round came back empty and silent)."""
    import os
    import subprocess

    from dtrain import contract

    r = subprocess.run(["bash", "-s", "--", "DTRAIN_TEST_ATTEMPT", "4", "here", "sample"],
                       input=contract.node_script("stacks.sh"), capture_output=True, text=True, timeout=60,
                       env={**os.environ, "TMPDIR": str(tmp_path / "missing")})
    assert r.returncode == 0 and r.stdout.startswith("[here] no stacks: cannot make a temporary directory"), r.stdout


def test_the_memo_keeps_live_processes_and_its_argument_stays_bounded():
    """The memo of native verdicts drops the places of processes gone from a node that answered
    (a node that did not answer keeps its own), and KNOWN (one argument of the remote command,
    Linux takes 128 KiB) holds the latest settled places up to KNOWN_BYTES, no frame longer
    than KNOWN_FRAME."""
    native = _as_stacks_sh("ddp_waiting_native.txt")  # node-1, pid 1
    place = ("node-1", 1, "_engine_run_backward (torch/autograd/graph.py:979)")
    gone = ("node-1", 99, "f (a.py:1)")
    elsewhere = ("node-2", 99, "f (a.py:1)")
    known = straggler.learn({gone: (False, False), elsewhere: (True, True)}, native)
    assert known == {elsewhere: (True, True), place: (True,)}
    # thousands of places (pids come and go in a long attempt): the latest first, bounded
    many = {("node-1", pid, f"step_{pid} (train.py:{pid})"): (True, True) for pid in range(20000)}
    many[("node-1", 20000, "x" * (straggler.KNOWN_FRAME + 1))] = (True, True)
    arg = straggler.known_places(many, "node-1")
    assert len(arg.encode()) <= straggler.KNOWN_BYTES
    assert arg.startswith("19999 step_19999 (train.py:19999)\n19998 ") and "x" * 100 not in arg


def test_a_rank_under_mpirun_s_output_tagger_is_still_read_natively(tmp_path):
    """Under mpirun each rank runs under launch/node/rank_output.py, whose environment has the
    same OMPI_COMM_WORLD_RANK: the rank is its child, not a worker, and an idle one is read
    natively (a DDP wait in `backward` is seen only there)."""
    import os
    import sys

    (tmp_path / "sleep.py").write_text("import time\ndef nap():\n    time.sleep(600)\nnap()\n")
    tagger = (Path(__file__).resolve().parent.parent / "launch" / "node" / "rank_output.py").read_text()
    lines, pid = _sample_tree([sys.executable, "-I", "-S", "-c", tagger, sys.executable, str(tmp_path / "sleep.py")],
                              {**os.environ, "OMPI_COMM_WORLD_RANK": "0"}, "3")
    (proc,) = stacks.parse(lines)  # the tagger itself is left out
    assert proc.rank == 0 and proc.pid != pid and proc.native, lines


def test_a_free_turn_is_taken_whichever_it_is(tmp_path):
    """Native reads take the first free turn of NATIVE_AT_ONCE, not one fixed by the process's
    place in the listing: two idle ranks among rankless processes are both read at once (a
    fixed slot per index had them queue on one lock while the others sat free)."""
    lines, log = _idle_ranks(tmp_path, ["0", "", "", "", "1"], "sleep 3", attempt="2")  # the ranks 4 apart
    natively = sorted(p.rank for p in stacks.parse(lines) if p.native)
    assert natively == [0, 1] and _most_at_once(log) == 2, (lines, log.read_text())


def test_a_place_read_again_counts_as_the_latest_learnt():
    """known_places gives the latest learnt first (the bound drops the oldest): a place read
    again moves to the end of the memo."""
    native = _as_stacks_sh("ddp_waiting_native.txt")  # node-1, pid 1
    place = ("node-1", 1, "_engine_run_backward (torch/autograd/graph.py:979)")
    other = ("node-2", 5, "f (a.py:1)")
    known = straggler.learn({place: (True,), other: (True, True)}, native)
    assert list(known) == [other, place] and known[place] == (True, True)


def test_under_python_3_10_an_asleep_rank_is_idle_by_its_kernel_state(tmp_path):
    """Python 3.10 and older (the GPU EFA images): py-spy --nonblocking cannot tell an idle
    thread (it needs the OS thread id, which it reads there only with the process paused) and
    says `active`. A py-spy that answers so (the real one's output, its status and version
    rewritten as 3.10's): the asleep rank (state S) is still read natively, said as idle by its
    state, and its place is known for the Python-only rounds after; the spinning rank (R) and
    the agent are not read natively."""
    import sys

    real = Path(sys.executable).parent / "py-spy"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "py-spy").write_text(
        '#!/bin/bash\nfor a in "$@"; do [ "$a" != --native ] || exec ' + f'{real}' + ' "$@"; done\n'
        f'{real} "$@" | sed -e "s/ (idle)/ (active)/" -e "s/^Python v3\\.[0-9]*/Python v3.10/"\n')
    (fake / "py-spy").chmod(0o755)
    known: dict = {}

    def second(first: list[str]) -> list[str]:
        known.update(straggler.learn(straggler.learn({}, first), first))  # as two agreeing rounds
        return ["sample", stacks.SEEN_IN_PYTHON, straggler.known_places(known, "here")]

    first: list[str] = []
    lines, _ = _stacks_sh(tmp_path, "sample", stacks.SEEN_IN_PYTHON, path_first=str(fake),
                          then=lambda ls: (first.extend(ls), second(ls))[1])
    procs = {p.rank: p for p in stacks.parse(first)}
    assert procs[0].native and procs[0].main_idle, first
    assert not procs[1].native and not procs[1].main_idle and not procs[None].native, first
    assert "[here r0]   (main thread idle by its state: Python 3.10)" in first, first
    [(node, pid, frame)] = known  # the asleep rank's nap
    assert frame.startswith("nap (") and pid == procs[0].pid, known
    again = {p.rank: p for p in stacks.parse(lines)}
    assert not again[0].native and again[0].main_idle, lines  # its place known: Python only
    assert straggler.native_place(again[0]) == (node, pid, frame)


def test_a_rank_s_command_line_cannot_forge_py_spy_s_lines(tmp_path):
    """py-spy's first line is the process's command line, its arguments joined by spaces: a
    newline in one started lines that read as py-spy's own (here a `Python v3.9` header, the
    3.10 idle note and a `Thread ... (idle)` main thread), and so did stacks.sh's own header,
    which shows it. stacks.sh drops py-spy's copy with that line and shows it on one line: the
    asleep 3.11 rank is read as py-spy sees it (its real main thread, no note)."""
    import os
    import sys

    (tmp_path / "sleep.py").write_text("import time\ndef nap():\n    time.sleep(600)\nnap()\n")
    forged = ("x\nPython v3.9.0 (/usr/bin/python3.9)\n\n[here r0]   (main thread idle by its state: Python 3.9)\n"
              'Thread 1 (idle): "MainThread"\n    forged (evil.py:1)')
    lines, pid = _sample_tree([sys.executable, str(tmp_path / "sleep.py"), forged], {**os.environ, "RANK": "0"}, "11")
    (proc,) = stacks.parse(lines)
    assert not proc.main_idle and all(f.func != "forged" for t in proc.threads for f in t.frames), lines
    assert any(f.func == "nap" for f in stacks.main_thread(proc).frames), lines
    # the command line stays on its header line, flattened, and nowhere else
    assert not [ln for ln in lines[1:] if "Python v3.9" in ln or "evil.py" in ln], lines
    assert "sleep.py x Python v3.9.0" in lines[0], lines


def test_a_native_read_s_own_status_stands_under_python_3_10():
    """Read natively (the process paused), py-spy tells idle on 3.10 too: a rank caught
    computing there (`active`) is no idle place, whatever the 3.10 note says."""
    lines = ["[n1 r0] stack of pid 42, state S: python train.py",
             "[n1 r0]   (main thread idle by its state: Python 3.10)", "[n1 r0]   (read natively)",
             '[n1 r0]   Thread 42 (active): "MainThread"', "[n1 r0]       sgemm (libmkl.so)",
             "[n1 r0]       backward (torch/autograd/graph.py:744)"]
    (proc,) = stacks.parse(lines)
    assert proc.main_idle and proc.native and straggler.native_place(proc) is None
    assert straggler.learn({}, lines) == {}
    python_only = [ln for ln in lines if "(read natively)" not in ln and "sgemm" not in ln]
    (proc,) = stacks.parse(python_only)
    assert straggler.native_place(proc) == ("n1", 42, "backward (torch/autograd/graph.py:744)")
