"""--workdir: what is sent (git's ignore rules, .dtrainignore, the size limit) and the rsync argv."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import workdir as w


def _tree(root, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_scan_honours_gitignore_dtrainignore_per_directory(tmp_path):
    _tree(tmp_path, {
        "train.py": "print(1)\n", "pkg/model.py": "x = 1\n", "pkg/__pycache__/model.pyc": "b",
        ".gitignore": "__pycache__/\n*.log\n/outputs/\n", "run.log": "log", "outputs/ckpt.pt": "big",
        "pkg/.gitignore": "*.tmp\n!keep.log\n", "pkg/a.tmp": "t", "pkg/keep.log": "kept",
        ".dtrainignore": "data/\n", "data/train.bin": "xxxx", ".git/HEAD": "ref",
        "sub/data/x.txt": "nested data dir is ignored too (no leading slash)",
    })
    wd = w.scan(tmp_path)
    assert wd.files == (".dtrainignore", ".gitignore", "pkg/.gitignore", "pkg/keep.log", "pkg/model.py",
                        "train.py")
    assert wd.size == sum((tmp_path / f).stat().st_size for f in wd.files)
    assert wd.key == w.cache_key(tmp_path) and len(wd.key) == 16


def test_scan_refuses_a_workdir_over_the_limit_and_says_to_mount_data(tmp_path):
    _tree(tmp_path, {"train.py": "x" * 10, "data.bin": "y" * 100})
    with pytest.raises(LaunchError) as e:
        w.scan(tmp_path, limit=50)
    msg = str(e.value)
    assert "--workdir" in msg and "--workdir-limit" in msg and "--mount" in msg and "data.bin" in msg
    assert w.scan(tmp_path, limit=110).size == 110


def test_scan_refuses_a_missing_directory(tmp_path):
    with pytest.raises(LaunchError, match="not a directory"):
        w.scan(tmp_path / "nope")


def test_rsync_argv_quotes_the_ssh_command_for_rsync_and_links_from_the_cache(tmp_path):
    wd = w.Workdir(tmp_path, ("a.py",), 1, "0123456789abcdef")
    node_dir = "/root/.dtrain/nodes/node-2/jobs/j1"  # as the node printed it (host/prepare.sh)
    argv = w.rsync_argv(["ssh", "-F", "/tmp/my config", "-o", "BatchMode=yes"], "root@10.0.0.2", wd, node_dir)
    assert argv[-1] == "root@10.0.0.2:/root/.dtrain/nodes/node-2/jobs/j1/workdir/"
    assert argv[-2] == f"{tmp_path}/"
    assert "--link-dest=../../../workdir-cache/0123456789abcdef/" in argv
    assert shlex.split(argv[argv.index("-e") + 1]) == ["ssh", "-F", "/tmp/my config", "-o", "BatchMode=yes"]
    with pytest.raises(LaunchError, match="backslash"):
        w.rsync_argv(["ssh", "-o", "X=a\\b"], "h", wd, node_dir)
    with pytest.raises(LaunchError, match="h gave no absolute job directory"):
        w.rsync_argv(["ssh"], "h", wd, "")


def test_parse_stats_reads_rsyncs_own_output(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    _tree(src, {"a.py": "a" * 1000, "b/c.py": "c" * 3000})
    wd = w.scan(src)
    out = subprocess.run(["rsync", "-a", "--stats", "--files-from=-", "--from0", f"{src}/", f"{dst}/"],
                         input="\0".join(wd.files) + "\0", capture_output=True, text=True, check=True).stdout
    files, sent = w.parse_stats(out)
    assert files == 2 and 4000 <= sent < 6000
    (src / "a.py").write_text("z" * 1000)  # same size: rsync's quick check goes by mtime
    import os
    os.utime(src / "a.py", (1, 1))
    out = subprocess.run(["rsync", "-a", "--stats", "--files-from=-", "--from0", f"{src}/", f"{dst}/"],
                         input="\0".join(wd.files) + "\0", capture_output=True, text=True, check=True).stdout
    assert w.parse_stats(out)[0] == 1


def test_human():
    assert w.human(512) == "512 B" and w.human(1536) == "1.5 KiB" and w.human(3 << 30) == "3.0 GiB"
