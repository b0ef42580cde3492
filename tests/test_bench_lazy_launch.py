"""bench/bench_lazy_launch.py's pure helpers and launch/node/examples/cuda_shaped.py, the GPU-shaped image's
libraries and its first step (what the cold-start figures of issue 42 rest on)."""

from __future__ import annotations

import gzip
import runpy
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
B = runpy.run_path(str(BENCH / "bench_lazy_launch.py"), run_name="bench")
CUDA_SHAPED = BENCH.parent / "launch" / "node" / "examples" / "cuda_shaped.py"
C = runpy.run_path(str(CUDA_SHAPED), run_name="bench")


def test_step_times_reads_one_per_rank_and_nothing_else():
    out = "[node-1 r0] step0 1795432513.25\n[node-2 r1] step0 1795432514.5\npulled lazily (SOCI)\nstep0 x\n"
    assert B["step_times"](out) == [1795432513.25, 1795432514.5]


def test_floor_is_bytes_at_the_link_rate_and_none_unlimited():
    assert B["floor_s"](125_000_000, 1_000_000_000) == 1.0
    assert B["floor_s"](125_000_000, None) is None


def test_layer_plan_whole_files_at_most_a_layer_each():
    plan = B["layer_plan"](int(10e9), C["FILE_BYTES"], int(2e9))
    assert sum(plan) == round(10e9 / C["FILE_BYTES"]) and max(plan) * C["FILE_BYTES"] <= 2e9
    assert B["layer_plan"](1, C["FILE_BYTES"], int(2e9)) == [1]


def test_library_content_halves_under_gzip():
    s = C["Stream"](1 << 20)
    data = b"".join(iter(lambda: s.read(16384), b""))
    assert len(data) == 1 << 20 and s.read(10) == b""
    assert 0.45 < len(gzip.compress(data, 6)) / len(data) < 0.55


def test_a_loader_touches_the_head_and_a_small_part():
    size = C["FILE_BYTES"]
    spans = C["touched"]("lib3_1.so", size)
    assert spans[0] == (0, 64 << 10)
    off, length = spans[1]
    assert length == int(size * 0.03) and off >= 64 << 10 and off + length <= size
    assert spans == C["touched"]("lib3_1.so", size) != C["touched"]("lib3_2.so", size)


def test_load_reads_the_libraries_and_prints_the_step(tmp_path):
    (tmp_path / "torch.py").write_text("")  # the framework import is the image's; here a stand-in
    lib = tmp_path / "libs"
    lib.mkdir()
    (lib / "lib0_0.so").write_bytes(bytes(4 << 20))
    (lib / "notes.txt").write_text("not a library")
    r = subprocess.run([sys.executable, str(CUDA_SHAPED), "load", str(lib)], capture_output=True,
                       text=True, env={"PYTHONPATH": str(tmp_path)}, timeout=30)
    assert r.returncode == 0, r.stderr
    assert B["step_times"](r.stdout) and r.stdout.startswith("step0 ")


def test_a_first_step_that_loads_part_of_the_libraries(tmp_path):
    for i in range(3):
        (tmp_path / f"lib0_{i}.so").write_bytes(bytes(1000))
    assert C["libraries"](str(tmp_path)) == ["lib0_0.so", "lib0_1.so", "lib0_2.so"]
    assert C["libraries"](str(tmp_path), 2500) == ["lib0_0.so", "lib0_1.so"]
    assert C["libraries"](str(tmp_path), 999) == []


def test_the_real_gpu_images_first_step_asks_for_cuda_and_prints_its_time():
    """--gpu-image's first step: a program (compiles), asks torch.cuda.is_available() before any
    CUDA use, and prints the `step0 TIME` the bench reads."""
    argv = B["REAL_GPU_STEP"]
    assert argv[:2] == ["python", "-c"]
    compile(argv[2], "REAL_GPU_STEP", "exec")
    assert argv[2].index("torch.cuda.is_available()") < argv[2].index("backward()")
    assert "print('step0', time.time())" in argv[2]


def test_prefetch_result_reads_what_each_node_said_and_the_lazy_step_waits_only_where_there_is_a_list():
    out = ('[node-1 r0] step0 1.5\n[node-1 r0] prefetch {"files": 1860, "bytes": 157286400, "seconds": 2.5, "skipped": 0}\n'
           '[node-2 r1] prefetch {"files": 3, "bytes": "x"}\n[node-2 r1] prefetch {broken\n')
    assert B["prefetch_result"](out) == "1860 files, 150 MiB in 2.5 s"
    assert B["prefetch_result"]("step0 1.0\n") == ""
    step = B["PREFETCH_STEP"][2]
    from dtrain import contract

    assert contract.FIRST_READS in step and contract.PREFETCH_DONE in step and step.startswith(B["CPU_STEP"][2])
