"""launch/jobs/ignore.py: git's ignore rules with matching time bounded (issue 47): a committed
.gitignore/.dtrainignore line of many stars, or a file of 200,000 lines, is one line or well under
2 s, never a hang; otherwise it matches as pathspec (GitIgnoreSpec) does, but where git differs."""

from __future__ import annotations

import random
import time

import pathspec
import pytest

from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import ignore
from dtrain.launch.jobs import workdir as w


def _git_edge(pat: str) -> bool:
    """Patterns where pathspec and git part ways (git is followed): `/` alone, a trailing `/**`
    (git: only what is inside), a component of 3+ stars (git: `**`), `//`."""
    p = pat.lstrip("!")
    return p == "/" or "//" in p or p.rstrip("/").endswith("/**") or "***" in p or p.endswith("**")


def test_matches_as_pathspec_on_random_patterns_and_paths():
    rnd = random.Random(47)
    tokens = ["a", "b", "*", "**", "/", "?", "ab", "[ab]", "\\*", "x.py"]
    compared = 0
    for _ in range(3000):
        pat = ("!" if rnd.random() < 0.2 else "") + "".join(rnd.choice(tokens) for _ in range(rnd.randint(1, 5)))
        if _git_edge(pat):
            continue
        theirs = pathspec.GitIgnoreSpec.from_lines([pat])
        mine = ignore.compile_lines([pat])
        for _ in range(8):
            path = "/".join(rnd.choice(["a", "b", "ab", "ba", "aa", "*", "x.py"]) for _ in range(rnd.randint(1, 4)))
            path += rnd.choice(["", "/"])  # a directory ends in /
            assert mine.check(path) == theirs.check_file(path).include, (pat, path)
            compared += 1
    assert compared > 10000


@pytest.mark.parametrize("pattern, path, want", [
    ("*.log", "a/b/run.log", True), ("/out/", "out/", True), ("/out/", "a/out/", None), ("out/", "a/out/x", True),
    ("a/**/b", "a/b", True), ("a/**/b", "a/x/y/b", True), ("**/node_modules/", "p/node_modules/", True),
    ("a/**", "a/x", True), ("a/**", "a/", None), ("!keep.log", "keep.log", False), ("\\#x", "#x", True),
    ("# comment", "# comment", None), ("a\\ ", "a ", True), ("a  ", "a", True), ("[!a]b", "/b", None),
    ("***/b", "x/y/b", True), ("a***b", "axyb", True), ("a***b", "ax/b", None),
])
def test_git_rules(pattern, path, want):
    assert ignore.compile_lines([pattern]).check(path) is want


@pytest.mark.parametrize("line", ["*" * 14, "*" * 14 + "x", "x" + "*" * 14 + "/", "*a" * 12 + "*b",
                                  "**/a/**/a/**/a/**/b", "a/**/*a*a*a*b/**/c", "?" * 200 + "*" * 200])
def test_a_pathological_line_matches_in_bounded_time(line):
    """pathspec's regex takes over 20 s for 14 stars against one 20-character name, and
    minutes for `**/a/**/a/**/b` against a deep path; each is milliseconds here."""
    rules = ignore.compile_lines([line])
    names = ["a" * 255, "a/" * 2000, ("a" * 200 + "/") * 20, "a" * 20, "x" * 254 + "/"]
    start = time.monotonic()
    for name in names * 20:
        rules.check(name)
    assert time.monotonic() - start < 2


@pytest.mark.parametrize("line, why", [
    ("x\n", f":{ignore.MAX_LINES + 1}: more than {ignore.MAX_LINES} patterns; "),  # 400 KB
    ("file{i}.log\n", ": an ignore file over 1 MiB; "),  # 2.3 MB
])
def test_a_200000_line_ignore_file_is_one_line_naming_it_fast(tmp_path, line, why):
    """pathspec compiles 200,000 lines in about 29 s; the bounds refuse them at once."""
    (tmp_path / "main.py").write_text("x\n")
    (tmp_path / ".gitignore").write_text("".join(line.format(i=i) for i in range(200_000)))
    start = time.monotonic()
    with pytest.raises(LaunchError) as e:
        w.scan(tmp_path)
    assert time.monotonic() - start < 2
    assert str(e.value) == (f"{tmp_path / '.gitignore'}{why}use fewer, broader lines (a directory/ instead of "
                            "its files)")


def test_an_ignore_file_too_big_or_a_line_too_long_is_one_line(tmp_path):
    (tmp_path / ".dtrainignore").write_text("x" * (ignore.MAX_LINE_CHARS + 1) + "\n")
    with pytest.raises(LaunchError, match=r"^.*/\.dtrainignore:1: a line over 1024 characters; shorten or remove it$"):
        w.scan(tmp_path)
    (tmp_path / ".dtrainignore").write_text("#" * (ignore.MAX_BYTES + 1))
    with pytest.raises(LaunchError, match=r"\.dtrainignore: an ignore file over 1 MiB"):
        w.scan(tmp_path)


def test_the_ignore_files_of_a_tree_share_one_budget(tmp_path):
    for i in range(ignore.MAX_TREE_PATTERNS // ignore.MAX_LINES + 1):
        (tmp_path / f"d{i}").mkdir()
        (tmp_path / f"d{i}" / ".gitignore").write_text("".join(f"f{j}\n" for j in range(ignore.MAX_LINES)))
    start = time.monotonic()
    with pytest.raises(LaunchError, match=f"hold over {ignore.MAX_TREE_PATTERNS} patterns in all"):
        w.scan(tmp_path)
    assert time.monotonic() - start < 10


def test_a_14_star_line_in_a_workdir_of_many_names_is_fast(tmp_path):
    (tmp_path / ".gitignore").write_text("*" * 14 + "x\n" + "!" + "*" * 14 + "\n")
    for i in range(300):
        (tmp_path / ("a" * 200 + str(i))).write_text("x")
    start = time.monotonic()
    assert len(w.scan(tmp_path).files) == 301
    assert time.monotonic() - start < 2
