"""--workdir: what is sent (git's ignore rules, .dtrainignore, the size limit) and the rsync argv."""

from __future__ import annotations

import os
import shlex
import subprocess
import time

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
    # !.aws/ re-includes the directory and what is in it; .gitignore's !id_rsa does not count,
    # nor does a deeper .dtrainignore's !.env.local (only the top one sends a secret back)
    assert wd.files == (".aws/config", ".aws/credentials", ".docker/Dockerfile", ".dtrainignore", ".envrc",
                        ".gitignore", "environment.py", "id_utils.py", "main.py", "sub/.dtrainignore")
    assert "id_rsa" in wd.left_out and ".aws/" not in wd.left_out and ".env" in wd.left_out
    assert "sub/.env.local" in wd.left_out
    (tmp_path / ".dtrainignore").write_text("!.envrc\n!.aws/\n*.ckpt\n!sub/.env.local\n")
    assert "sub/.env.local" in w.scan(tmp_path).files  # the top file, naming it: sent
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



# ---------------------------------------------------------------- secrets by name, content, inode (issue 47)

PEM = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n-----END OPENSSH PRIVATE KEY-----\n"
MARK = "s3cr3t-marker-47"
SA_JSON = ('{"type": "service_account", "project_id": "p", "private_key_id": "' + MARK + '", '
           '"client_email": "x@p.iam.gserviceaccount.com"}')
KUBECONFIG = ("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: https://k}\nusers:\n"
              f"- name: u\n  user: {{token: {MARK}}}\n")
# The issue's list: each would have been sent before (by name or, id_test, by content).
ISSUE_47 = {
    "prod.env": f"DB={MARK}\n", "service-account.json": "{}", "gcp-key.json": "{}", "kubeconfig": "x",
    "terraform.tfvars": f'db_password = "{MARK}"\n', "secrets.yaml": f"k: {MARK}\n", "secrets.json": "{}",
    ".secrets": MARK, "token.txt": MARK, ".vault-token": MARK, ".htpasswd": f"u:{MARK}\n", ".ENV": MARK,
    "ID_RSA": MARK, "keys/id_test": PEM, "cfg/Prod.Env": MARK,
}
BY_CONTENT = {  # names that say nothing; what they hold does
    "notes/aws.txt": "key id AKIAQWERTYUIOPASDFGH\n",
    "conf/aws.cfg": "aws_secret_access_key = " + "A" * 20 + "/" + "b" * 19 + "\n",
    "conf/sa.json": SA_JSON, "conf/cluster.yaml": KUBECONFIG,
    "docs/howto.md": "use ghp_" + "a1B2" * 9 + " to push\n",
    "scripts/run.sh": "export HF_TOKEN=hf_" + "x" * 34 + "\n",
    "scripts/slack.py": 'URL = "xoxb-1234567890-abcdefghij"\n',
    "settings.ini": f"API_TOKEN={MARK}\n", "deploy/vars": f"DB_PASSWORD='{MARK}'\n",
}
NOT_SECRETS = {  # what an ML project holds that must still go
    "train.py": 'EOS_TOKEN = "<|endoftext|>"\nMAX_TOKENS = 1024\npassword = input()\n',
    "tokenizer.json": '{"model": {"type": "BPE"}}', "tokenizer_config.json": "{}", "environment.py": "x = 1\n",
    "run.sh": 'MAX_TOKENS=1024\nexport HF_TOKEN="$HF_TOKEN"\nPASSWORD=<set-me>\n',
    "README.md": "AWS's example key: AKIAIOSFODNN7EXAMPLE\n", "k8s/job.yaml": "apiVersion: v1\nkind: Pod\n",
    "data/weights.bin": "\0" + PEM,  # binary: not scanned
    "id_utils.py": "x = 1\n", "docs/tokens.md": "how tokens work\n", "secretary.py": "x\n",
}


def test_files_that_hold_secrets_by_name_any_case_or_by_content_are_left_out(tmp_path):
    _tree(tmp_path, {**ISSUE_47, **BY_CONTENT, **NOT_SECRETS})
    os.link(tmp_path / ".ENV", tmp_path / "notes.txt")  # the same file under a name that says nothing
    wd = w.scan(tmp_path)
    assert wd.files == tuple(sorted(NOT_SECRETS))
    assert set(wd.left_out) == {*ISSUE_47, *BY_CONTENT, "notes.txt"}
    line = w.left_out_line(wd.left_out)
    assert MARK not in line and "\n" not in line and line.startswith(f"left out {len(wd.left_out)} that may hold")


def test_a_hard_link_into_a_held_back_directory_is_held_back(tmp_path):
    _tree(tmp_path, {".aws/config": "[default]\nregion = x\n", "main.py": "x\n"})
    os.link(tmp_path / ".aws/config", tmp_path / "settings.cfg")
    wd = w.scan(tmp_path)
    assert wd.files == ("main.py",) and wd.left_out == (".aws/", "settings.cfg")
    assert wd.size == 2


@pytest.mark.parametrize("nested", ["!*\n", "!*.env\n!id_test\n", "!**\n", "!.env\n"])
def test_a_nested_dtrainignore_cannot_send_a_secret_back(tmp_path, nested):
    _tree(tmp_path, {"vendor/lib/.dtrainignore": nested, "vendor/lib/.env": MARK, "vendor/lib/prod.env": MARK,
                     "vendor/lib/id_test": PEM, "vendor/lib/code.py": "x\n"})
    wd = w.scan(tmp_path)
    assert wd.files == ("vendor/lib/.dtrainignore", "vendor/lib/code.py")
    assert wd.left_out == ("vendor/lib/.env", "vendor/lib/id_test", "vendor/lib/prod.env")


def test_the_top_dtrainignore_sends_back_only_what_it_names(tmp_path):
    _tree(tmp_path, {".dtrainignore": "!*\n!*.env\n!tests/fixtures/id_test\n", ".env": MARK, "prod.env": MARK,
                     "tests/fixtures/id_test": PEM, "tests/fixtures/other_key": PEM})
    wd = w.scan(tmp_path)
    assert wd.files == (".dtrainignore", "tests/fixtures/id_test")
    assert wd.left_out == (".env", "prod.env", "tests/fixtures/other_key")


def test_content_scanning_a_dataset_of_thousands_of_files_stays_fast(tmp_path):
    """3,000 text files of 16 KiB and 100 binary shards: each text file's head is read once."""
    for i in range(3000):
        p = tmp_path / f"shard{i // 500}" / f"{i}.jsonl"
        p.parent.mkdir(exist_ok=True)
        p.write_text(('{"text": "the quick brown fox ' + str(i) + '"}\n') * 400)
    for i in range(100):
        (tmp_path / f"w{i}.npy").write_bytes(b"\x93NUMPY" + bytes(1 << 18))
    (tmp_path / "shard3" / "leak.jsonl").write_text('{"text": "' + "ghp_" + "Z" * 36 + '"}\n')
    start = time.monotonic()
    wd = w.select(tmp_path)
    took = time.monotonic() - start
    assert len(wd.files) == 3100 and wd.left_out == ("shard3/leak.jsonl",)
    assert took < 20, f"{took:.1f} s"  # 3.5-3.9 s on a 2-core machine at load 9 (about 1 ms a file)
