"""What a job file may do, beyond its own checks (jobfile.py): the user's allow-list of
environment names, `--env NAME` (the value from the environment, never in argv), and the hosts
a job file names (docs/launch.md, "What a job file may do").

A job file comes with the code and is run by others: it is data, not authority. What it names
that would send something of the user's (an environment value, a registry login, files) to a
host must be something the user chose: a flag on the command line, a name in the allow-list
file (outside any project), a host the user has connected to before (in known_hosts) or one
confirmed at the terminal. Every check here runs before the first ssh: a refused job file has
sent nothing anywhere.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from dtrain import values
from dtrain.launch.errors import LaunchError
from dtrain.launch.remote import known_hosts
from dtrain.launch.remote.hosts import Node


SHOWN_HOSTS = 5  # an error names this many hosts, then counts the rest


def env_allow_file() -> Path:
    """The user's allow-list of environment names a job file may take (`env: {NAME: }`): one
    name a line, `#` comments; $XDG_CONFIG_HOME/dtrain/env-allow (~/.config/dtrain/env-allow).
    Outside any project: a cloned repository cannot add to it."""
    base = os.environ.get("XDG_CONFIG_HOME") or ""
    return (Path(base) if os.path.isabs(base) else Path.home() / ".config") / "dtrain" / "env-allow"


def env_allowed(path: Path | None = None) -> frozenset[str]:
    """The names the allow-list file holds (none where there is no file); a line that is not a
    variable name is one error naming the file and line."""
    path = path or env_allow_file()
    if not path.exists():
        return frozenset()
    try:
        text = values.small_text_file(path, "env allow-list", "variable names, one a line")
    except values.BadValue as e:
        raise LaunchError(str(e)) from None
    names = set()
    for lineno, raw in enumerate(text.splitlines(), start=1):
        name = raw.split("#", 1)[0].strip()
        if not name:
            continue
        if not values.env_name(name):
            raise LaunchError(f"{path}:{lineno}: {values.shown(name)} is not a variable name (letters, digits, _; "
                              "not starting with a digit): one name a line")
        names.add(name)
    return frozenset(names)


def cli_env(items: Iterable[str] | None, environ: Mapping[str, str] | None = None) -> tuple[list[str], set[str]]:
    """The command line's --env items as NAME=VALUE, and the names given bare. `--env NAME` (no
    `=`) takes NAME's value from environ (the launcher's environment): the way to pass a secret,
    its value never in argv (/proc/PID/cmdline). A bare name that is not set: one line."""
    environ = os.environ if environ is None else environ
    pairs, bare = [], set()
    for item in items or []:
        if "=" in item or not values.env_name(item):
            pairs.append(item)  # NAME=VALUE (values.env_pairs checks it)
            continue
        if item not in environ:
            raise LaunchError(f"--env {item}: ${item} is not set where dtrain runs: export it first, or give "
                              f"--env {item}=VALUE")
        pairs.append(f"{item}={environ_value(item, environ, f'--env {item}')}")
        bare.add(item)
    return pairs, bare


def environ_value(name: str, environ: Mapping[str, str], at: str) -> str:
    """$name's value, for a rank's env: one line of printable text (what --env takes), else one
    line naming `at` and the variable, never the value (it is a secret, the reason it is here)."""
    value = environ[name]
    if len(value) > values.MAX_TEXT or not value.isprintable():
        raise LaunchError(f"{at}: ${name} is not one line of printable text of at most {values.MAX_TEXT} "
                          "characters (its value is not shown); give it in an --env-file, one line")
    return value


def _shown(hosts: Sequence[str]) -> str:
    more = len(hosts) - SHOWN_HOSTS
    return ", ".join(hosts[:SHOWN_HOSTS]) + (f" and {more} more" if more > 0 else "")


def _ask_tty(question: str) -> bool:
    """y/N at the terminal (stderr, stdin); anything but y/yes, or end of input, is no."""
    print(question, end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    return answer.strip().lower() in ("y", "yes")


def interactive() -> bool:
    return sys.stdin.isatty() and sys.stderr.isatty()


def check_hosts(nodes: Sequence[Node], by_file: Mapping[str, str], ssh_opts: Sequence[str], *, keys: Sequence[str],
                ask: Callable[[str], bool] | None = None) -> None:
    """Where the job file chose the nodes or the ssh route to them (keys: jobfile.route_keys(), in by_file: {key:
    "FILE:LINE"}), each host must be in the user's known_hosts (known_hosts.unknown_route, as ssh would
    look it up with ssh_opts), and so must every jump host on the way to them, or be confirmed: ask (default: y/N at a terminal); without one,
    LaunchError naming the hosts and what to do. Before the first ssh: nothing is sent to a host
    this refuses, the registry login included. Hosts the command line chose are not asked about."""
    keys = [k for k in keys if k in by_file]
    if not keys or not nodes:
        return
    new = known_hosts.unknown_route(nodes, ssh_opts)
    if not new:
        return
    at, key = by_file[keys[0]], keys[0]
    what = f"{at}: {key}: the job file sends the job (its env, workdir, registry login) to host(s) you have never " \
           f"connected to (not in your known_hosts): {_shown(new)}"
    if ask is None and interactive():
        ask = _ask_tty
    if ask is not None and ask(f"{what}. Connect to them? [y/N] "):
        return
    flags = "the ssh options with --ssh-opt" if key == "ssh_opt" else "them with --hosts/--hostfile"
    raise LaunchError(f"{what}; nothing was sent: if they are yours, give {flags} on the command line, or "
                      f"connect once (ssh HOST) or add their keys (ssh-keyscan HOST >> ~/.ssh/known_hosts)")
