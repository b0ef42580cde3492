"""Files a user names are read one way (dtrain/values.py read_user_file): opened without blocking,
checked on the opened descriptor (a regular file, not a kernel file, not too large), then read
from that descriptor with a size cap. Each test that could block runs under an alarm, so a
regression fails instead of hanging the suite.

tests/test_cli_errors.py's file-kind fuzz runs every file flag of every task on the same kinds
(/proc/kmsg and a sparse 10 GiB file among them)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest

from dtrain import values
from dtrain.images import project
from dtrain.images.build import BuildError
from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import jobfile
from dtrain.launch.remote import hosts
from dtrain.launch.troubleshoot import diagnose


class _Hung(BaseException):
    pass


@contextlib.contextmanager
def _within(seconds: int = 10):
    def ring(*_):
        raise _Hung(f"still reading after {seconds} s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _refused(path, says: str, limit: int = values.SMALL_FILE_MAX) -> str:
    with _within(), pytest.raises(values.BadValue) as e:
        values.read_user_file(path, "hostfile", "`HOST slots=N` lines", limit)
    msg = str(e.value)
    assert says in msg and str(path) in msg and "\n" not in msg, msg
    return msg


def test_proc_kmsg_is_a_kernel_file_and_is_refused_without_reading():
    """stat says /proc/kmsg is a regular file of 0 bytes; as root, reading it waits for the next
    kernel message. It is refused by its file system, and a plain check of it too."""
    assert os.path.exists("/proc/kmsg"), "this test needs the kernel's /proc/kmsg (Linux, procfs mounted)"
    _refused("/proc/kmsg", "a kernel file (proc)")
    with _within(), pytest.raises(values.BadValue, match=r"--hostfile '/proc/kmsg': a kernel file \(proc\)"):
        values.local_path("--hostfile", "/proc/kmsg", "file", "a hostfile")
    assert values.pseudo_fs(os.stat("/proc/self/status").st_dev) == "proc"
    assert values.pseudo_fs(os.stat("/sys/kernel").st_dev) == "sysfs"
    assert values.pseudo_fs(os.stat(__file__).st_dev) is None


def test_a_fifo_a_device_and_a_directory_are_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    _refused(tmp_path / "fifo", "a named pipe (FIFO), not a regular file")
    _refused(Path("/dev/zero"), "a character device, not a regular file")
    _refused(tmp_path, "a directory, not a regular file")


def test_a_huge_sparse_file_is_refused_by_its_size_before_a_byte_is_read(tmp_path):
    huge = tmp_path / "huge"
    with open(huge, "wb") as f:
        f.truncate(10 << 30)
    _refused(huge, f"{10 << 30} bytes, more than a hostfile has (at most {values.SMALL_FILE_MAX})")
    small = tmp_path / "small"
    small.write_text("x" * 101)
    _refused(small, "101 bytes", limit=100)
    assert values.read_user_file(small, "hostfile", "lines", 101) == b"x" * 101


def test_what_is_read_is_what_was_checked_when_a_link_is_swapped(tmp_path, monkeypatch):
    """A symlink swapped from a small file to /dev/zero after the check: the reader checks the
    descriptor it opened and reads from it, so the swap changes nothing (no window between the
    check and the read). Swapped before the open, the new target is what is checked: refused."""
    good = tmp_path / "hosts"
    good.write_text("10.0.0.1 slots=1\n")
    link = tmp_path / "link"
    link.symlink_to(good)
    real_pseudo_fs = values.pseudo_fs

    def swap_then_check(dev):  # runs after open + fstat, before the read
        link.unlink()
        link.symlink_to("/dev/zero")
        return real_pseudo_fs(dev)

    monkeypatch.setattr(values, "pseudo_fs", swap_then_check)
    with _within():
        assert values.read_user_file(link, "hostfile", "lines") == b"10.0.0.1 slots=1\n"
    monkeypatch.setattr(values, "pseudo_fs", real_pseudo_fs)
    assert os.readlink(link) == "/dev/zero"
    _refused(link, "a character device")
    # swapped between the stat (a regular file) and the open: the descriptor's fstat decides
    link.unlink()
    link.symlink_to(good)
    real_open = os.open

    def swap_then_open(path, flags, *a):
        if str(path) == str(link):
            link.unlink()
            link.symlink_to("/dev/zero")
        return real_open(path, flags, *a)

    monkeypatch.setattr(os, "open", swap_then_open)
    _refused(link, "a character device, not a regular file")


def test_a_project_file_that_is_a_link_is_refused(tmp_path):
    """A cloned project's requirements.txt pointing at /proc/kmsg (or at a key outside it) is not
    followed: O_NOFOLLOW; one line naming the file."""
    (tmp_path / "requirements.txt").symlink_to("/proc/kmsg")
    with _within(), pytest.raises(BuildError, match=r"requirements.txt: a symbolic link; expected a requirements.txt"):
        project.requirements_text(tmp_path / "requirements.txt")
    (tmp_path / "requirements.txt").unlink()
    os.mkfifo(tmp_path / "requirements.txt")
    with _within(), pytest.raises(BuildError, match="a named pipe"):
        project.requirements_text(tmp_path / "requirements.txt")
    (tmp_path / "requirements.txt").unlink()
    with open(tmp_path / "requirements.txt", "wb") as f:
        f.truncate(project.REQUIREMENTS_MAX + 1)
    with _within(), pytest.raises(BuildError, match=f"at most {project.REQUIREMENTS_MAX}"):
        project.requirements_text(tmp_path / "requirements.txt")
    (tmp_path / "requirements.txt").unlink()
    assert project.requirements_text(tmp_path / "requirements.txt") == ""
    (tmp_path / "requirements.txt").write_text("numpy==1.26.4\n")
    assert project.requirements_text(tmp_path / "requirements.txt") == "numpy==1.26.4\n"


def test_a_hostfile_identity_that_is_a_kernel_file_is_refused(tmp_path):
    """identity=PATH in a hostfile goes through the same check as --ssh-key."""
    from dtrain.launch.targets import ssh

    f = tmp_path / "hosts"
    f.write_text("10.0.0.1 slots=1 identity=/proc/kmsg\n")
    with _within(), pytest.raises(LaunchError, match=rf"^{f}: identity '/proc/kmsg': a kernel file \(proc\)"):
        ssh.hostfile_nodes(str(f))


def test_job_file_hostfile_and_env_file_readers_refuse_kernel_files(tmp_path):
    with _within(), pytest.raises(LaunchError, match=r"/proc/self/status: a kernel file \(proc\)"):
        hosts.parse_hostfile("/proc/self/status")
    with _within(), pytest.raises(LaunchError, match=r"kernel file"):
        jobfile.load(Path("/proc/self/status"))


def test_diagnose_reads_a_fifo_and_a_kernel_file_without_waiting(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with _within():
        assert diagnose.read_tail(tmp_path / "fifo") == b""
    big = tmp_path / "big.log"
    with open(big, "wb") as f:
        f.truncate(3 << 30)
        f.write(b"")
    with open(big, "r+b") as f:
        f.seek((3 << 30) - 4)
        f.write(b"end\n")
    with _within():
        tail = diagnose.read_tail(big, 1 << 20)
    assert len(tail) == 1 << 20 and tail.endswith(b"end\n")


def test_a_project_tree_with_a_link_to_a_kernel_file_and_a_fifo_hashes_without_reading_them(tmp_path):
    """`dtrain build --project DIR` hashes the project's files for its tag: a link is hashed by
    where it points (not read: /proc/kmsg would wait for ever), a FIFO is skipped."""
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "kmsg").symlink_to("/proc/kmsg")
    os.mkfifo(tmp_path / "pipe")
    with _within():
        first = project.tree_hash(tmp_path, "base:1")
    (tmp_path / "kmsg").unlink()
    (tmp_path / "kmsg").symlink_to("/proc/version")
    assert project.tree_hash(tmp_path, "base:1") != first  # the link's target is part of the hash
    (tmp_path / "train.py").write_text("print(2)\n")
    assert len({first, project.tree_hash(tmp_path, "base:1"), project.tree_hash(tmp_path, "base:2")}) == 3


def test_buildkit_gets_a_private_copy_of_the_ca_bundle_and_pip_conf_that_were_checked(tmp_path):
    """`dtrain build --ca-bundle F --pip-conf F`: BuildKit reads `--secret src=` itself, later;
    it is given a 0600 copy (in a 0700 directory removed after) of the bytes that were checked,
    so a path swapped for a FIFO or /proc/kmsg meanwhile changes nothing."""
    from dtrain.images.build import BuildOptions, secret_copies

    ca, conf = tmp_path / "ca.pem", tmp_path / "pip.conf"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    conf.write_text("[global]\nindex-url = https://pypi.example/simple\n")
    with secret_copies(BuildOptions(ca_bundle=ca, pip_conf=conf, no_cache=True)) as opts:
        ca.unlink()
        ca.symlink_to("/proc/kmsg")
        assert opts.no_cache and opts.ca_bundle != ca and opts.pip_conf != conf
        assert opts.ca_bundle.read_text().startswith("-----BEGIN CERTIFICATE-----")
        assert opts.pip_conf.read_text().startswith("[global]")
        assert oct(opts.ca_bundle.stat().st_mode & 0o777) == "0o600"
        assert oct(opts.ca_bundle.parent.stat().st_mode & 0o777) == "0o700"
        where = opts.ca_bundle.parent
    assert not where.exists()
    with _within(), pytest.raises(BuildError, match=r"^--ca-bundle .*ca.pem: a kernel file \(proc\)"):
        with secret_copies(BuildOptions(ca_bundle=ca)):
            pass
    with secret_copies(BuildOptions()) as opts:
        assert opts == BuildOptions()
