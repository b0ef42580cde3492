"""The troubleshooting checklist (launch/checklist.py), its document and `invoke diagnose`.

tests/logs/ holds sample logs:
  <entry-id>.log, <entry-id>-<variant>.log   a failure: must yield a finding with that id
  ok-<anything>.log                           a successful job: must yield no finding at all
Logs captured from real failures are added under the same names.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dtrain.launch.troubleshoot import checklist, diagnose as dg
from dtrain.launch.troubleshoot.checklist import BY_ID, DOC, DOCTOR_CHECKS, ENTRIES, render_markdown
from dtrain.launch.troubleshoot.diagnose import Finding, diagnose, diagnose_file, format_report

LOGS = Path(__file__).parent / "logs"
ALL_LOGS = sorted(LOGS.glob("*.log"))
OK_LOGS = [p for p in ALL_LOGS if p.name.startswith("ok-")]
FAIL_LOGS = [p for p in ALL_LOGS if not p.name.startswith("ok-")]
WITH_SIGS = [e for e in ENTRIES if e.signatures]


def log_entry_id(path: Path) -> str | None:
    """The entry a failure log is named after: the longest id the file stem starts with."""
    stem = path.name[: -len(".log")]
    ids = [i for i in BY_ID if stem == i or stem.startswith(i + "-") or stem.startswith(i + ".")]
    return max(ids, key=len) if ids else None


def ids(findings: list[Finding]) -> list[str]:
    return [f.entry.id for f in findings]


# --------------------------------------------------------------------------------------------
# the entries


def test_enough_entries_with_unique_slug_ids():
    assert len(ENTRIES) >= 18
    assert len(BY_ID) == len(ENTRIES), "duplicate ids"
    for e in ENTRIES:
        assert re.fullmatch(r"[a-z0-9]+(?:-[a-z0-9]+)*", e.id), e.id
    assert len({e.title for e in ENTRIES}) == len(ENTRIES), "duplicate titles"


def test_required_topics_are_covered():
    required = {"btl-iface", "oob-iface", "ssh-port-22", "remote-path", "env-not-forwarded",
                "blas-regions", "hvd-stall", "hvd-version", "nccl-iface", "shm", "ssh-host-key",
                "ssh-auth", "ssh-key-perms", "mpirun-root", "docker-gpu", "cuda-driver",
                "efa-unused", "memlock", "hostnames-dup", "rdzv-unreachable", "ompi5-plm-args",
                "rank-exit", "throughput"}
    assert required <= set(BY_ID)


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.id for e in ENTRIES])
def test_entry_is_complete(entry):
    for name in ("title", "symptom", "cause", "fix", "confirm"):
        assert getattr(entry, name).strip(), f"{entry.id}: empty {name}"
    assert entry.source and all(s.startswith("https://") for s in entry.source), entry.id
    assert set(entry.doctor_checks) <= set(DOCTOR_CHECKS), entry.id
    assert set(entry.related) <= set(BY_ID) and entry.id not in entry.related
    assert all(isinstance(s, re.Pattern) for s in entry.signatures)
    # An entry that can be matched shows its messages; one that cannot says so.
    assert bool(entry.signatures) == bool(entry.messages), entry.id


def test_only_the_throughput_entry_has_nothing_to_match():
    # efa-fewer: NCCL's "(found 1 nics)" is right on a single-EFA type; only the instance type
    # tells (doctor's efa check, doctor --bandwidth, the launch's --nccl-check line), never NCCL's own.
    assert [e.id for e in ENTRIES if not e.signatures] == ["throughput"]


def test_every_doctor_check_is_used():
    used = {c for e in ENTRIES for c in e.doctor_checks}
    assert used == set(DOCTOR_CHECKS)


def test_catch_alls():
    assert {e.id for e in ENTRIES if e.catch_all} == {"rank-exit", "orte-daemons"}


# --------------------------------------------------------------------------------------------
# signatures against their own sample messages


@pytest.mark.parametrize("entry", WITH_SIGS, ids=[e.id for e in WITH_SIGS])
def test_each_message_matches_its_entry(entry):
    for msg in entry.messages:
        assert any(s.search(msg) for s in entry.signatures), f"{entry.id}: {msg!r}"
        assert entry.id in ids(diagnose(msg))


@pytest.mark.parametrize("entry", WITH_SIGS, ids=[e.id for e in WITH_SIGS])
def test_each_signature_matches_a_message(entry):
    for sig in entry.signatures:
        assert any(sig.search(m) for m in entry.messages), f"{entry.id}: dead {sig.pattern!r}"


@pytest.mark.parametrize("entry", WITH_SIGS, ids=[e.id for e in WITH_SIGS])
def test_messages_match_no_other_specific_entry(entry):
    """A message may also match a catch-all (signal 9 is both host-oom and rank-exit)."""
    for msg in entry.messages:
        others = [f.entry.id for f in diagnose(msg)
                  if f.entry.id != entry.id and not f.entry.catch_all]
        assert not others, f"{entry.id}: {msg!r} also matches {others}"


def test_every_signature_has_a_needle():
    for e in WITH_SIGS:
        for s in e.signatures:
            n = dg.needle(s)
            assert len(n) >= dg.MIN_NEEDLE
    with pytest.raises(ValueError):
        dg.needle(re.compile(r"(?:foo|bar) x"))


def test_signatures_stay_within_a_line():
    """A message split over two lines is matched on its own line, never across the newline."""
    text = "Host key verification\nfailed.\nBus\nerror\n"
    assert diagnose(text) == []


# --------------------------------------------------------------------------------------------
# sample logs


@pytest.mark.parametrize("path", OK_LOGS, ids=[p.name for p in OK_LOGS])
def test_successful_logs_have_no_findings(path):
    assert diagnose_file(path) == []
    assert format_report([]).startswith("No known failure signature matched.")


def test_there_are_successful_logs_for_mpirun_and_torchrun():
    names = {p.name for p in OK_LOGS}
    assert {"ok-horovod-mpirun.log", "ok-torchrun.log"} <= names


@pytest.mark.parametrize("path", FAIL_LOGS, ids=[p.name for p in FAIL_LOGS])
def test_failure_log_yields_its_entry(path):
    entry_id = log_entry_id(path)
    assert entry_id, f"{path.name}: name it <entry-id>.log or <entry-id>-<variant>.log"
    findings = diagnose_file(path)
    assert entry_id in ids(findings), f"{path.name}: got {ids(findings)}"
    # the specific cause is reported before any catch-all
    if not BY_ID[entry_id].catch_all:
        assert not findings[0].entry.catch_all


def test_every_matchable_entry_has_a_sample_log():
    covered = {log_entry_id(p) for p in FAIL_LOGS}
    missing = [e.id for e in WITH_SIGS if e.id not in covered]
    assert not missing, f"add tests/logs/<id>.log for {missing}"


def test_log_names_resolve_to_the_longest_id():
    assert log_entry_id(Path("ssh-port-22.log")) == "ssh-port-22"
    assert log_entry_id(Path("hvd-version-undefined-symbol.log")) == "hvd-version"
    assert log_entry_id(Path("shm.captured.log")) == "shm"
    assert log_entry_id(Path("sshd-port-busy-2.log")) == "sshd-port-busy"
    assert log_entry_id(Path("nothing.log")) is None


# --------------------------------------------------------------------------------------------
# ordering, dedupe, attribution


def test_multiple_findings_in_order_of_first_occurrence_catch_alls_last():
    text = "\n".join([
        "mpirun noticed that process rank 1 with PID 9 on node node-2 exited on signal 11 "
        "(Segmentation fault).",                                           # rank-exit (catch-all)
        "[node-2 r1] [1,1]<stderr>:BLAS : Program is Terminated. Because you tried to "
        "allocate too many memory regions.",                               # blas-regions
        "ORTE has lost communication with a remote daemon.",               # orte-daemons
        "node-1:1:1 [0] NCCL INFO Bootstrap : Using lo:127.0.0.1<0>",      # nccl-iface
        "[node-2 r1] [1,1]<stderr>:BLAS : Program is Terminated. Because you tried to "
        "allocate too many memory regions.",
    ])
    findings = diagnose(text)
    assert ids(findings) == ["blas-regions", "nccl-iface", "rank-exit", "orte-daemons"]
    assert [f.first_line for f in findings] == [2, 4, 1, 3]
    assert [ln.number for ln in findings[0].lines] == [2, 5]


def test_one_line_matching_two_signatures_of_one_entry_is_listed_once():
    line = "root@node-2: Permission denied (publickey). Authentication refused: bad ownership " \
           "or modes for directory /root/.ssh"
    (f,) = diagnose(line + "\n" + line)
    assert f.entry.id == "ssh-auth"
    assert [ln.number for ln in f.lines] == [1, 2]


def test_line_numbers_and_crlf():
    text = "a\r\nb\r\nHost key verification failed.\r\nc"
    (f,) = diagnose(text)
    assert f.lines[0].number == 3
    assert f.lines[0].text == "Host key verification failed."


def test_match_on_the_last_line_without_newline():
    (f,) = diagnose("x\ny\nmpirun has detected an attempt to run as root.")
    assert f.entry.id == "mpirun-root" and f.lines[0].number == 3


BLAS = "BLAS : Program is Terminated. Because you tried to allocate too many memory regions."


@pytest.mark.parametrize("line, rank, local_rank, node", [
    (f"[node-2 r3] {BLAS}", 3, None, "node-2"),                          # dtrain launcher
    (f"[1,5]<stderr>:{BLAS}", 5, None, None),                            # mpirun --tag-output
    (f"[1,5]<stderr>: {BLAS}", 5, None, None),                           # Open MPI 5 spacing
    (f"[node-2 r3] [1,3]<stderr>:{BLAS}", 3, None, "node-2"),            # both
    (f"[ip-10-0-1-12.ec2.internal r12] {BLAS}", 12, None, "ip-10-0-1-12.ec2.internal"),
    (f"[7]<stderr>:{BLAS}", 7, None, None),                              # horovodrun (Gloo)
    (f"[default2]:{BLAS}", None, 2, None),                               # torchrun --tee
    (f"[rank9]: {BLAS}", 9, None, None),                                 # PyTorch traceback
    (f"[node-1 r4] [default0]:{BLAS}", 4, 0, "node-1"),
    (BLAS, None, None, None),
])
def test_rank_and_node_from_prefixes(line, rank, local_rank, node):
    (f,) = diagnose(line)
    ln = f.lines[0]
    assert (ln.rank, ln.local_rank, ln.node) == (rank, local_rank, node)


@pytest.mark.parametrize("line, entry_id, rank, local_rank, node", [
    ("node-2:398:477 [0] misc/shmutils.cc:113 NCCL WARN Error while creating shared memory "
     "segment /dev/shm/nccl-x (size 9637888)", "shm", None, None, "node-2"),
    ("[1,8]<stdout>:node-2:398:398 [0] NCCL INFO Bootstrap : Using docker0:172.17.0.1<0>",
     "nccl-iface", 8, None, "node-2"),
    ("[node-2:00731] [[41872,0],1] tcp_peer_send_blocking: send() to socket 9 failed: Broken "
     "pipe (32)", "oob-iface", None, None, "node-2"),
    ("mpirun noticed that process rank 11 with PID 4567 on node node-3 exited on signal 9 "
     "(Killed).", "host-oom", 11, None, "node-3"),
    ("  Process name: [[41872,1],9]", "rank-exit", 9, None, None),
    ("E0501 10:12:41.300000 140 torch/distributed/elastic/multiprocessing/api.py:869] failed "
     "(exitcode: 1) local_rank: 3 (pid: 213) of binary: /opt/venv/bin/python",
     "rank-exit", None, 3, None),
])
def test_rank_and_node_from_messages(line, entry_id, rank, local_rank, node):
    f = next(f for f in diagnose(line) if f.entry.id == entry_id)
    ln = f.lines[0]
    assert (ln.rank, ln.local_rank, ln.node) == (rank, local_rank, node)


def test_finding_summaries():
    (f,) = diagnose(f"[node-2 r3] {BLAS}\n[node-1 r1] {BLAS}\n[node-2 r2] {BLAS}\n{BLAS}")
    assert f.ranks == (1, 2, 3)
    assert f.nodes == ("node-1", "node-2")


def test_disk_full_leaves_dev_shm_to_the_shm_entry():
    shm = ("node-1:1:1 [0] NCCL WARN Error while creating shared memory segment "
           "/dev/shm/nccl-cj (size 10617216), error: No space left on device (28)")
    assert ids(diagnose(shm)) == ["shm"]
    assert ids(diagnose("OSError: [Errno 28] No space left on device")) == ["disk-full"]


def test_ssh_port_22_and_other_ports_are_different_entries():
    assert ids(diagnose("ssh: connect to host node-2 port 22: Connection refused")) == \
        ["ssh-port-22"]
    assert ids(diagnose("ssh: connect to host node-2 port 2022: Connection refused")) == \
        ["ssh-unreachable"]
    # no route is connectivity, on any port: neither the port nor a key (issue 47)
    for port in (22, 2022):
        for why in ("Network is unreachable", "No route to host"):
            assert ids(diagnose(f"ssh: connect to host 10.0.1.5 port {port}: {why}")) == ["ssh-no-route"]
    # a timeout on 2022 (between nodes) stays ssh-unreachable; doctor's own ssh to 22 timing out is
    # connectivity (test_doctor.test_failure_causes_follow_the_details)
    assert ids(diagnose("ssh: connect to host 10.0.1.5 port 2022: Connection timed out")) == ["ssh-unreachable"]


def test_diagnose_is_pure_and_repeatable():
    text = (LOGS / "rank-exit.log").read_text()
    assert diagnose(text) == diagnose(text)


# --------------------------------------------------------------------------------------------
# report


def test_report_shows_title_lines_cause_fix_and_link():
    text = "\n".join(f"[node-{1 + i // 8} r{i}] [1,{i}]<stderr>:{BLAS}" for i in range(5))
    report = format_report(diagnose(text))
    e = BY_ID["blas-regions"]
    assert report.startswith("1 known failure matched")
    assert f"1. [blas-regions] {e.title}" in report
    shown = [ln for ln in report.splitlines() if ln.lstrip().startswith("line ")]
    assert len(shown) == 3
    assert "line 1 (node-1, rank 0): [node-1 r0]" in shown[0]
    assert "... and 2 more matching lines (ranks 0-4; nodes node-1)" in report
    assert "cause: Each rank's OpenBLAS" in report
    assert "fix:   dtrain images set" in report
    assert "docs/troubleshooting.md#blas-regions" in report
    assert e.source[0] in report


def test_report_has_doctor_checks_and_plain_text():
    report = format_report(diagnose_file(LOGS / "ssh-port-22.log"))
    assert report.index("[ssh-port-22]") < report.index("[orte-daemons]")
    assert "check: dtrain doctor (port-2022, peer-2022)" in report
    assert "](#" not in report and "**" not in report


def test_report_clips_long_lines():
    report = format_report(diagnose("x" * 5000 + " Host key verification failed."))
    assert max(len(ln) for ln in report.splitlines()) < 300


def test_report_when_nothing_matched():
    report = format_report([])
    assert report.startswith("No known failure signature matched.")
    assert "dtrain doctor" in report and "NCCL_DEBUG=INFO" in report


# --------------------------------------------------------------------------------------------
# files and the command line


def test_diagnose_file_errors(tmp_path):
    with pytest.raises(dg.DiagnoseError, match="no such file"):
        diagnose_file(tmp_path / "missing.log")
    with pytest.raises(dg.DiagnoseError, match="is a directory"):
        diagnose_file(tmp_path)


def test_an_empty_log_is_said_to_be_empty(tmp_path):
    (tmp_path / "empty.log").write_text("")
    with pytest.raises(dg.DiagnoseError, match=r"empty.log: is empty: no output to diagnose"):
        diagnose_file(tmp_path / "empty.log")


def test_a_mistyped_log_file_name_is_said_to_be_no_such_file(tmp_path):
    """`dtrain diagnose nosuch.log` (the real command): no file, no job by that name, said so;
    a name without a file's look is a job's."""
    import os
    import subprocess
    import sys

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "dtrain", "diagnose", *argv], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120, env={**os.environ, "DTRAIN_HOME": str(tmp_path / "home")})

    r = run("nosuch.log")
    assert (r.returncode, r.stderr) == (2, "error: nosuch.log: no such file (nor a job of that name)\n")
    r = run("nosuchjob")
    assert (r.returncode, r.stderr) == (2, f"error: no job named nosuchjob (jobs are in {tmp_path}/home/jobs)\n")
    (tmp_path / "empty.txt").write_text("")
    r = run("empty.txt")
    assert (r.returncode, r.stderr) == (2, "error: empty.txt: is empty: no output to diagnose\n")
    assert [dg.looks_like_file(t) for t in ("a.log", "run.TXT", "logs/x", "job-1", "latest")] == [
        True, True, True, False, False]


def test_diagnose_refuses_what_is_not_a_log_file_before_opening_it(tmp_path):
    """A FIFO would block forever, a device never end, a 300-character name was OSError 36:
    each one line naming it; a job's name (no such file) is left to the job store."""
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, needle in ((fifo, "a named pipe (FIFO)"), ("/dev/zero", "a character device"),
                         (tmp_path, "a directory"), ("x" * 300, "a name longer than 255 bytes"),
                         (str(tmp_path / "nope" / "x.log"), "no such file")):
        with pytest.raises(dg.DiagnoseError, match=re.escape(needle)):
            dg.log_path(str(path))
    with pytest.raises(dg.DiagnoseError, match="is a named pipe"):
        diagnose_file(fifo)
    assert dg.log_path("latest") is None and dg.log_path("job-1") is None
    (tmp_path / "job.log").write_text("x\n")
    assert dg.log_path(str(tmp_path / "job.log")) == tmp_path / "job.log"


def test_diagnose_file_tolerates_bad_bytes(tmp_path):
    p = tmp_path / "job.log"
    p.write_bytes(b"\xff\xfe garbage\nHost key verification failed.\n\x00\x01")
    assert ids(diagnose_file(p)) == ["ssh-host-key"]


def test_main_exit_codes(tmp_path, capsys):
    assert dg.main([str(LOGS / "ok-torchrun.log")]) == 0
    assert "No known failure signature matched." in capsys.readouterr().out
    assert dg.main([str(LOGS / "shm.log")]) == 1
    assert "[shm]" in capsys.readouterr().out
    assert dg.main([str(tmp_path / "nope.log")]) == 2
    assert "error: " in capsys.readouterr().err
    assert dg.main([]) == 2


# --------------------------------------------------------------------------------------------
# docs/troubleshooting.md


def test_doc_is_the_render_of_the_checklist():
    """No drift: the committed doc is exactly `python -m dtrain.launch.troubleshoot.checklist --write`."""
    assert DOC.exists(), "run `python -m dtrain.launch.troubleshoot.checklist --write`"
    assert DOC.read_text() == render_markdown(), \
        "docs/troubleshooting.md drifted: run `python -m dtrain.launch.troubleshoot.checklist --write`"
    assert checklist.main(["--check"]) == 0


def test_doc_and_checklist_agree_on_ids_titles_and_sources():
    """Read the doc as a reader would, independently of render_markdown()."""
    doc = DOC.read_text()
    heads = re.findall(r"^### `([a-z0-9-]+)`: (.+)$", doc, re.MULTILINE)
    assert heads == [(e.id, e.title) for e in ENTRIES]
    sections = re.split(r"^### ", doc, flags=re.MULTILINE)[1:]
    for e, sec in zip(ENTRIES, sections):
        assert re.search(r"^\*\*Source\.\*\* <https://", sec, re.MULTILINE), e.id
        for label in ("Symptom", "Cause", "Fix", "Confirm"):
            assert f"**{label}.**" in sec, (e.id, label)
        for msg in e.messages:
            assert msg in sec, (e.id, msg)
    for cid in DOCTOR_CHECKS:
        assert f"| `{cid}` |" in doc
    assert "dtrain doctor" in doc and "dtrain diagnose" in doc


def test_mpirun_tags_in_the_middle_of_a_line():
    """Unbuffered stderr reaches mpirun in chunks, each tagged (seen on the simulated cluster)."""
    from dtrain.launch.troubleshoot.diagnose import diagnose

    log = ("[1,1]<stderr>:Traceback (most recent call last):\n"
           "[1,1]<stderr>:KeyError[1,1]<stderr>:: [1,1]<stderr>:'DTRAIN_DATA_DIR'[1,1]<stderr>:\n")
    [f] = [f for f in diagnose(log) if f.entry.id == "env-not-forwarded"]
    assert f.ranks == (1,) and f.lines[0].number == 2


# --------------------------------------------------------------------------------------------
# what new users hit first: CUDA on a CPU wheel or without GPUs, NCCL without GPUs (issue 41)


@pytest.mark.parametrize("line, entry_id, way_out", [
    # the unedited pytorch/examples ddp-tutorial multinode.py on the CPU image (issue 41)
    ("[node-1 r0] AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'", "cuda-cpu-wheel",
     "launch the GPU variant of the image"),
    ("[rank0]: AssertionError: Torch not compiled with CUDA enabled", "cuda-cpu-wheel", 'backend="gloo"'),
    ("RuntimeError: Distributed package doesn't have NCCL built in", "cuda-cpu-wheel", "device-agnostic"),
    ("RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
     "installed a driver from http://www.nvidia.com/Download/index.aspx", "gpu-image-cpu-node",
     "On CPU nodes launch the CPU variant of the image"),
    ("WARNING: The NVIDIA Driver was not detected.  GPU functionality will not be available.", "gpu-image-cpu-node",
     "nvidia runtime"),
    ("RuntimeError: cuda runtime error (100) : no CUDA-capable device is detected at /pytorch/aten/src/THC/THCGeneral.cpp:50",
     "no-gpu", "One rank per GPU"),
    ("[rank6]: RuntimeError: CUDA error: invalid device ordinal", "no-gpu", "slots="),
    ("ValueError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!", "nccl-no-gpu",
     'init_process_group(backend="gloo")'),
    ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1331, "
     "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.1", "nccl-no-gpu", "NCCL_DEBUG=INFO"),
])
def test_what_new_users_hit_first_is_named_with_the_way_out(line, entry_id, way_out):
    """Lines as upstream reports show them (pytorch/examples' multinode.py, torch.cuda.set_device,
    init_process_group("nccl")): the entry by name, before the catch-all, with what to change."""
    findings = diagnose(line + "\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n")
    assert ids(findings) == [entry_id, "rank-exit"]
    assert way_out in " ".join(format_report(findings).split())


def test_the_multinode_example_on_the_cpu_image_is_more_than_a_rank_exit():
    report = format_report(diagnose_file(LOGS / "cuda-cpu-wheel.log"))
    assert report.startswith("2 known failures matched") and "1. [cuda-cpu-wheel]" in report
    assert "(ranks 0-1; nodes node-1, node-2)" in report and "2. [rank-exit]" in report
