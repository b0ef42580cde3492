"""The lazy start's prefetch (issue 52): launch/node/first_reads.py records, at build time, what the
family's first step reads from the image (the kernel's view: pages this process faulted in, files
it opened); launch/node/prefetch.py reads those ranges ahead of the job on a node that pulled the
image lazily. Here both run for real on this machine's Python; the cluster test of the whole
way (a lazy pull, then the prefetch's result in the job's container) is in test_lazy_cluster.py."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODE = ROOT / "launch" / "node"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, NODE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


fr = _module("first_reads")
pf = _module("prefetch")


def test_ranges_merge_near_pages_and_stop_at_the_files_end():
    page = 4096
    assert fr.ranges({0, page, 2 * page}, page, 10 * page) == [[0, 3 * page]]
    # 16 pages apart or less: one read; more: two
    assert fr.ranges({0, 17 * page}, page, 40 * page, gap=16) == [[0, 18 * page]]
    assert fr.ranges({0, 18 * page}, page, 40 * page, gap=16) == [[0, page], [18 * page, page]]
    # the last page is cut at the file's size; a page past it (a mapping beyond EOF) is dropped
    assert fr.ranges({0, 2 * page}, page, page + 100, gap=0) == [[0, page]]
    assert fr.ranges({page}, page, page + 100, gap=0) == [[page, 100]]


def test_first_reads_records_the_libraries_pages_and_the_modules_files(tmp_path):
    """Importing sqlite3 maps its extension module (ranges of it) and opens its .py/.pyc
    (whole); nothing of /proc, /dev, /tmp; the line on stderr says files and MiB."""
    out = tmp_path / "reads.json"
    r = subprocess.run([sys.executable, str(NODE / "first_reads.py"), str(out), "sqlite3"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("first reads of sqlite3: ") and "MiB ->" in r.stderr
    listing = json.loads(out.read_text())
    assert listing["version"] == 1 and listing["modules"] == ["sqlite3"]
    files = dict(listing["files"])
    ext = [p for p in files if "_sqlite3" in p and p.endswith(".so")]
    assert ext and files[ext[0]] and all(o % 4096 == 0 and n > 0 for o, n in files[ext[0]]), files
    assert files[ext[0]][0][0] == 0  # the ELF header
    assert any("sqlite3" in p and files[p] == [] for p in files if p.endswith((".py", ".pyc")))
    assert not [p for p in files if p.startswith(("/proc/", "/dev/", "/tmp/", "/sys/", "/run/"))]
    assert all(os.path.isfile(p) for p in files)


def test_first_reads_that_cannot_record_writes_no_list_and_does_not_fail_the_build(tmp_path):
    """Anything but a failed import (here: a step that raises) is one line and exit 0, no list: a
    lazy node then prefetches nothing."""
    (tmp_path / "boom.py").write_text("raise RuntimeError('no pagemap here')\n")
    r = subprocess.run([sys.executable, str(NODE / "first_reads.py"), str(tmp_path / "x.json"), "boom"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert r.returncode == 0 and not (tmp_path / "x.json").exists(), r.stderr
    assert r.stderr.strip() == ("first_reads.py: nothing recorded (RuntimeError: no pagemap here); "
                                "lazy nodes will not prefetch")


def test_first_reads_names_the_module_that_does_not_import(tmp_path):
    r = subprocess.run([sys.executable, str(NODE / "first_reads.py"), str(tmp_path / "x.json"), "no_such_module_x"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "cannot import no_such_module_x" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "x.json").exists()


def test_prefetch_reads_what_the_list_names_and_skips_what_is_not_a_file(tmp_path):
    """Every range read once, in chunks of at most a span, largest file first; a whole file
    where no range is given; a range past the end cut at it; a relative path, a directory, a
    FIFO (reading it would block), a missing file, a link to /proc, /proc itself, the job's
    directory, a length of Infinity and junk entries skipped."""
    big = tmp_path / "big.so"
    big.write_bytes(os.urandom(9 << 20))
    small = tmp_path / "mod.pyc"
    small.write_bytes(b"x" * 1000)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "kernel").symlink_to("/proc/self/status")  # a link out of the image's files: where it leads counts
    listing = json.loads(json.dumps({"version": 1, "files": [
        [str(small), []],
        [str(big), [[0, 4096], [1 << 20, 8 << 20], [(9 << 20) - 10, 4096]]],  # the last one cut at the end
        ["relative/path.so", []], [str(tmp_path), []], [str(tmp_path / "fifo"), []], [str(tmp_path / "gone"), []],
        "junk", [str(small)], [str(small), "no"], [str(tmp_path / "kernel"), []], ["/proc/self/environ", []],
        [str(small), [[0, float("inf")]]], ["/dtrain-job/output.log", []],
    ]}))
    reads, skipped = pf.work(listing)
    assert skipped == 11
    assert reads[0][0] == str(big) and reads[-1] == (str(small), 0, 1000)
    assert max(n for _, _, n in reads) <= pf.CHUNK
    assert sorted((o, n) for p, o, n in reads if p == str(big)) == \
        [(0, 4096), (1 << 20, 4 << 20), (5 << 20, 4 << 20), ((9 << 20) - 10, 10)]
    done = pf.prefetch(listing, threads=4)
    assert done["files"] == 2 and done["skipped"] == 11
    assert done["bytes"] == 4096 + (8 << 20) + 10 + 1000


def test_prefetch_writes_its_result_whole_and_does_nothing_without_a_list(tmp_path):
    f = tmp_path / "lib.so"
    f.write_bytes(b"y" * 5000)
    (tmp_path / "list.json").write_text(json.dumps({"version": 1, "files": [[str(f), [[0, 4096]]]]}))
    out = tmp_path / "done.json"
    r = subprocess.run([sys.executable, str(NODE / "prefetch.py"), str(tmp_path / "list.json"), str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == ""
    done = json.loads(out.read_text())
    assert (done["files"], done["bytes"], done["skipped"]) == (1, 4096, 0) and done["seconds"] >= 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done.json", "lib.so", "list.json"]  # no .part left
    # an image built before the list existed: nothing read, nothing written
    gone = tmp_path / "none.json"
    r = subprocess.run([sys.executable, str(NODE / "prefetch.py"), str(tmp_path / "missing.json"), str(gone)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not gone.exists()
    (tmp_path / "bad.json").write_text("{not json")
    r = subprocess.run([sys.executable, str(NODE / "prefetch.py"), str(tmp_path / "bad.json"), str(gone)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not gone.exists()


def test_the_images_record_the_familys_first_step_and_a_lazy_pull_asks_for_the_prefetch():
    """Every rendered Dockerfile records the first reads into contract.FIRST_READS with its
    family's modules; up_args carries prefetch_argv (its NAHEAD words) only for a node that
    pulled lazily, and is otherwise the same."""
    from dtrain import contract
    from dtrain.images import render
    from dtrain.images.spec import load_all
    from dtrain.launch.jobs import commands
    from dtrain.launch.jobs.spec import JobSpec

    for img in load_all():
        mods = render.first_step_modules(img)
        assert mods[0] == ("tensorflow" if img.framework == "tensorflow" else "torch"), img.family
        assert f"python /tmp/first_reads.py {contract.FIRST_READS} {' '.join(mods)}\n" in render.render(img)
    ray = next(i for i in load_all() if i.family == "ray-train")
    assert render.first_step_modules(ray) == ["torch", "torch.distributed", "ray", "ray.train.torch"]
    spec = JobSpec(image="reg/x:1", command=("true",), name="t")
    lazy = commands.up_args(spec, ["", ""], "pub", "/j", prefetch=True)
    plain = commands.up_args(spec, ["", ""], "pub", "/j")
    ahead = commands.prefetch_argv()
    assert ahead == ["python3", f"{contract.NODE_DIR}/prefetch.py", contract.FIRST_READS, contract.PREFETCH_DONE]
    name = plain.index(contract.container_name("t"))
    nwatch = int(plain[name + 1])
    at = name + 2 + nwatch  # NAHEAD
    assert plain[at] == "0" and lazy[at] == str(len(ahead)) and lazy[at + 1:at + 1 + len(ahead)] == ahead
    assert lazy[:at] + lazy[at + 1 + len(ahead):] == plain[:at] + plain[at + 1:]
