"""`dtrain test`'s two parts (dtrain/suite.py): the unit tests beside the cluster tests, each
test in exactly one part, the exit status, and Ctrl-C stopping both."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dtrain import suite

ROOT = Path(__file__).resolve().parent.parent
FAST_BESIDE = "test_a_proxy_that_exits_is_a_connection_error_in_either_of_sshs_wordings"  # test_fanout: serial
FAST_UNIT = "test_the_report_summary_in_dtrain_help_is_a_whole_sentence"  # test_report: a unit test


def _collected(marks: str) -> set[str]:
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider", "-m", marks],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return {ln for ln in r.stdout.splitlines() if "::" in ln}


def test_each_test_runs_in_exactly_one_part_and_gpu_builds_in_none():
    beside, cluster, second = _collected(suite.BESIDE), _collected(suite.CLUSTER), _collected(suite.SECOND)
    everything = _collected(suite.EVERYTHING)
    assert beside and cluster and second and not beside & cluster and not beside & second and not cluster & second
    assert beside | cluster | second == everything
    assert {t for t in second if "test_demo.py" in t}  # a second_cluster module: on the second cluster
    assert not any("test_gpu_wheels" in t and "gpu_build" in t for t in everything)
    serial = {t for t in cluster if "test_fanout.py" in t}
    assert serial and not {t for t in beside if "test_fanout.py" in t}  # a serial module: the foreground only


def test_the_parts_and_the_exit_status():
    unit, second, cluster = suite.parts(None, unit=False, serial=False, python="py")
    assert unit.beside and unit.argv[:3] == ("nice", "-n", str(suite.NICE)) and "-k" not in unit.argv
    assert not cluster.beside and cluster.argv[:3] == ("py", "-m", "pytest") and not cluster.env
    assert second.beside and second.argv[:6] == ("nice", "-n", str(suite.SECOND_NICE), "py", "-m", "pytest")
    assert suite.SECOND in second.argv and 0 < suite.SECOND_NICE < suite.NICE
    assert dict(second.env) == {"DTRAIN_SIM_SLOT": suite.SECOND_SLOT} != "0"
    assert all("--durations=25" in p.argv for p in (unit, second, cluster))
    (only,) = suite.parts("x", unit=True, serial=False, python="py")
    assert only.argv[-2:] == ("-k", "x") and suite.UNIT in only.argv
    (everything,) = suite.parts(None, unit=False, serial=True, python="py")
    assert suite.EVERYTHING in everything.argv
    assert suite.exit_status([0, 0]) == 0 and suite.exit_status([1, 0]) == 1 and suite.exit_status([0, 2]) == 2
    assert suite.exit_status([5, 0]) == 0 and suite.exit_status([5, 5]) == 5  # -k left one part empty


def test_both_parts_run_and_report(capfd):
    code = suite.run(f"{FAST_BESIDE} or {FAST_UNIT}", unit=False, serial=False, cwd=ROOT, say=print)
    out = capfd.readouterr().out
    assert code == 0, out
    assert "[test] the unit tests run beside" in out and "[test] the unit tests (" in out
    assert out.count("1 passed") == 2 and out.count("slowest") >= 2, out  # one test in each part, durations of each


def test_ctrl_c_stops_both_parts_and_leaves_no_pytest_behind(tmp_path):
    code = (f"import sys; from pathlib import Path; from dtrain import suite; "
            f"sys.exit(suite.run('test_every_flag_of_every_task_refuses_bad_values or "
            f"test_a_nodes_heartbeat_answers_each_line_and_ends_when_the_supervisor_goes_silent', "
            f"False, False, cwd=Path({str(ROOT)!r})))")
    proc = subprocess.Popen([sys.executable, "-u", "-c", code], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    first = proc.stdout.readline()  # "[test] the unit tests run beside ... (SCRATCH/unit.log)"
    assert first.startswith("[test] the unit tests run beside") and first.rstrip().endswith("unit.log)"), first
    scratch = first.rstrip()[:-1].rsplit("(", 1)[1].rsplit("/", 1)[0]
    time.sleep(5)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole foreground group
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the runner did not end within 60 s of Ctrl-C")
    assert proc.returncode != 0
    left = subprocess.run(["pgrep", "-f", f"--basetemp={scratch}/"], capture_output=True, text=True).stdout.split()
    assert not left, f"the unit part still runs: {left}\n{out}"
    assert not Path(scratch).exists()  # its log and tmp_path trees removed


# what ties a test module to the first simulated cluster: its addresses, names, paths
FIRST_CLUSTER = re.compile(r"10\.213\.0\.|\bdt[vn]\d|\bdt[vn]\{|[\"']dt[vn][\"']|\bdtbr0\b|/var/lib/dtrain-cluster|STATE_DIR|:5000\b")


def second_cluster_modules() -> list[Path]:
    return sorted(p for p in (ROOT / "tests").glob("test_*.py")
                  if re.search(r"^pytestmark = .*\bpytest\.mark\.second_cluster\b", p.read_text(), re.M))


def _helpers(mod: Path) -> dict[str, str]:
    """The source of each helper mod imports from another test module (`from test_x import a, b`):
    they run on its cluster too. {"test_x.a": source}."""
    import ast

    out: dict[str, str] = {}
    for node in ast.walk(ast.parse(mod.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("test_"):
            src = (ROOT / "tests" / f"{node.module}.py").read_text()
            defs = {d.name: d for d in ast.parse(src).body if isinstance(d, (ast.FunctionDef, ast.Assign))
                    and hasattr(d, "name")}
            for alias in node.names:
                if alias.name in defs:
                    out[f"{node.module}.{alias.name}"] = ast.get_source_segment(src, defs[alias.name]) or ""
    return out


def test_a_module_on_the_second_cluster_names_nothing_of_the_first():
    """Nor does a helper it imports from another test module (test_wholerun's _link took the first
    cluster's NICs down from the second)."""
    mods = second_cluster_modules()
    assert len(mods) >= 5, mods
    assert "test_wholerun._link" in _helpers(ROOT / "tests" / "test_link.py")
    text = {p.name: p.read_text() for p in mods} | {k: v for m in mods for k, v in _helpers(m).items()}
    tied = {name: m.group(0) for name, t in text.items() if (m := FIRST_CLUSTER.search(t))}
    assert tied == {}, f"{tied}: these modules name the first simulated cluster; take them off second_cluster " \
                       "or ask the cluster (cluster.nodes, cl.STATE_DIR read at run time is fine only in the first)"
    assert FIRST_CLUSTER.search('subprocess.run(["ip", "link", "set", f"dtv{node.index}", "down"])')  # the check bites
    assert FIRST_CLUSTER.search('assert info.registry == "10.213.0.1:5000"')
