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


# ---------------------------------------------------------------- files that hold secrets (issue 38)

SECRET_TREE = {
    ".env": "TOKEN=s3cr3t-marker", ".envrc": "export TOKEN=s3cr3t-marker", "sub/.env.local": "s3cr3t-marker",
    "id_rsa": "s3cr3t-marker", "id_ed25519.pub": "ssh-ed25519 AAAA", ".ssh/config": "Host x",
    ".aws/credentials": "[default]\naws_secret_access_key = s3cr3t-marker", ".aws/config": "[default]",
    "certs/server.pem": "s3cr3t-marker", "tls.key": "s3cr3t-marker", "gcp_credentials.json": "{}",
    ".netrc": "machine x password s3cr3t-marker", ".pypirc": "[pypi]", ".docker/config.json": "{}",
    ".git-credentials": "https://u:s3cr3t-marker@x", "infra/terraform.tfstate": "{}",
    "main.py": "print(1)\n", "id_utils.py": "x = 1\n", "environment.py": "x = 1\n", ".docker/Dockerfile": "FROM x",
    "pkg/__pycache__/m.cpython-311.pyc": "b",
}
SECRET_LEFT_OUT = (".aws/", ".docker/config.json", ".env", ".envrc", ".git-credentials", ".netrc", ".pypirc", ".ssh/",
                   "certs/server.pem", "gcp_credentials.json", "id_ed25519.pub", "id_rsa", "infra/terraform.tfstate",
                   "sub/.env.local", "tls.key")


def test_files_that_hold_secrets_are_left_out_by_default_even_when_git_tracks_them(tmp_path):
    _tree(tmp_path, SECRET_TREE)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "-f", ".env", "id_rsa"], check=True)  # tracked: still a secret
    wd = w.scan(tmp_path)
    assert wd.files == (".docker/Dockerfile", "environment.py", "id_utils.py", "main.py")
    assert wd.left_out == SECRET_LEFT_OUT
    assert wd.size == sum((tmp_path / f).stat().st_size for f in wd.files)
    line = w.left_out_line(wd.left_out)
    assert line.startswith("left out 15 that may hold secrets: .aws/, .docker/config.json, .env, ")
    assert line.endswith(" and 7 more (to send one, add !NAME to .dtrainignore)")
    assert "\n" not in line and "s3cr3t" not in line
    assert w.left_out_line(()) is None


def test_dtrainignore_re_includes_a_secret_holder_a_gitignore_does_not(tmp_path):
    _tree(tmp_path, {**SECRET_TREE, ".gitignore": "!id_rsa\n", "sub/.dtrainignore": "!.env.local\n",
                     ".dtrainignore": "!.envrc\n!.aws/\n*.ckpt\n", "model.ckpt": "big", "keep/x.ckpt": "big"})
    wd = w.scan(tmp_path)
    # !.aws/ re-includes the directory and what is in it; .gitignore's !id_rsa does not count
    assert wd.files == (".aws/config", ".aws/credentials", ".docker/Dockerfile", ".dtrainignore", ".envrc",
                        ".gitignore", "environment.py", "id_utils.py", "main.py", "sub/.dtrainignore",
                        "sub/.env.local")
    assert "id_rsa" in wd.left_out and ".aws/" not in wd.left_out and ".env" in wd.left_out
    assert ".gitignore" in wd.files and "model.ckpt" not in wd.left_out  # ignored: not a secret, not named


def test_a_secret_holders_name_that_is_not_printable_stays_one_line(tmp_path):
    _tree(tmp_path, {"a\nb.pem": "x", "main.py": "x"})
    line = w.left_out_line(w.scan(tmp_path).left_out)
    assert "\n" not in line and "'a\\nb.pem'" in line


def test_fifos_and_devices_in_the_workdir_are_not_read(tmp_path):
    import os

    _tree(tmp_path, {"main.py": "x"})
    os.mkfifo(tmp_path / "pipe")
    os.mkfifo(tmp_path / ".dtrainignore")  # an ignore file that is a FIFO would hang a read
    assert w.scan(tmp_path).files == ("main.py",)

