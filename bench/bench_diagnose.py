"""How long `diagnose()` takes on large logs. Not a test: prints a table.

    python bench/bench_diagnose.py [LINES ...]

Each log is a realistic training log (dtrain and Open MPI prefixes, NCCL INFO lines, progress
lines) with a few failure lines spread through it; the best of 3 runs is reported.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dtrain.launch.troubleshoot.diagnose import diagnose  # noqa: E402

FAILURES = [
    "BLAS : Program is Terminated. Because you tried to allocate too many memory regions.",
    "node-2:398:398 [0] NCCL INFO Bootstrap : Using docker0:172.17.0.1<0>",
    "mpirun noticed that process rank 9 with PID 4567 on node node-2 exited on signal 9 (Killed).",
]


def make_log(n: int) -> str:
    lines = []
    for i in range(n):
        r = i % 16
        pre = f"[node-{r // 8 + 1} r{r}] [1,{r}]<stdout>:"
        k = i % 50
        if k == 0:
            lines.append(f"{pre}node-{r // 8 + 1}:41{r}:50{r} [{r % 8}] NCCL INFO Channel "
                         f"{i % 32:02d}/0 : {r}[{r % 8}] -> {(r + 1) % 16}[{(r + 1) % 8}] via "
                         "NET/Libfabric/0/GDRDMA")
        elif k == 1:
            lines.append(f"{pre}[2024-05-01 10:{i % 60:02d}:00.000000: I horovod/common/"
                         "operations.cc:912] Horovod timeline step")
        else:
            lines.append(f"{pre}Epoch {i // 5000 + 1}/90 step {i}: loss={1 / (1 + i % 997):.4f} "
                         f"acc=0.{i % 89:02d} lr=0.0125 Iter #{i}: 1431.{i % 9} img/sec per GPU")
    for j, msg in enumerate(FAILURES):
        lines[(j + 1) * n // (len(FAILURES) + 1)] = f"[node-2 r9] [1,9]<stderr>:{msg}"
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    sizes = [int(a) for a in argv] or [1_000, 10_000, 100_000, 1_000_000]
    print(f"{'lines':>10} {'MB':>8} {'seconds':>9} {'findings':>9}")
    for n in sizes:
        text = make_log(n)
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            findings = diagnose(text)
            best = min(best, time.perf_counter() - t)
        print(f"{n:>10} {len(text) / 1e6:>8.1f} {best:>9.3f} {len(findings):>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
