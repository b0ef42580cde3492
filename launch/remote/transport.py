"""How the launcher reaches its nodes: one ssh transport object, used by the job, doctor and stop.

It owns the ssh options of a set of nodes: the user's (-o ...), the fast key exchange where the
ssh config leaves it alone (hosts.kex_opts, asked once), and one master connection per node
reused by every step of a job (ControlMaster). `argv` builds one node's ssh command; `run`
and `start` run a command on many nodes at once (launch.remote.fanout).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Callable, Sequence

from dtrain.launch.remote.fanout import Fanout, NodeResult, raise_on_failure
from dtrain.launch.remote.hosts import Node, kex_opts, ssh_argv

MUX_PERSIST_S = 60  # seconds an idle ssh master to a node outlives its launch (Ansible keeps 60 too)


def mux_dir() -> tuple[Path, bool]:
    """(directory for ssh master sockets, private?): the user's shared /tmp/dtrain-ssh-UID when
    it is a 0700 directory of theirs; else a fresh private one, closed with the job. /tmp, not
    ~/.dtrain: a socket path must stay under ~100 characters."""
    d = Path(tempfile.gettempdir()) / f"dtrain-ssh-{os.getuid()}"
    try:
        d.mkdir(mode=0o700, exist_ok=True)
        st = d.lstat()
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700:
            return d, False
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="dtrain-ssh-")), True


def close_masters(nodes: Sequence[Node], ssh_opts: Sequence[str] = (), where: Path | None = None) -> None:
    """Close the ssh master connections to nodes (default: the shared ones of mux_dir())."""
    where = where or mux_dir()[0]
    procs = [subprocess.Popen(["ssh", *ssh_opts, "-o", f"ControlPath={where}/%C", "-O", "exit",
                               f"{n.user}@{n.host}" if n.user else n.host, *(["-p", str(n.port)] if n.port else [])],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for n in nodes]
    for p in procs:
        p.wait()


class SshTransport:
    """ssh to a set of nodes with one set of options.

    Args:
        nodes: the nodes (the first one answers the key-exchange question).
        ssh_opts: extra ssh arguments from the user (e.g. `-F cfg`, `-o ProxyJump=...`).
        multiplex: keep one master connection per node (a job); False for one-off commands.
    """

    def __init__(self, nodes: Sequence[Node], ssh_opts: Sequence[str] = (), *, multiplex: bool = True):
        self.nodes = list(nodes)
        self.ssh_opts = tuple(ssh_opts)
        self.multiplex = multiplex
        self._kex: list[str] | None = None
        self._lock = threading.Lock()
        self._mux: Path | None = None
        self._mux_private = False

    def _options(self) -> list[str]:
        with self._lock:  # asked once, for the first node (ssh -G)
            if self._kex is None:
                self._kex = kex_opts(self.nodes[0], self.ssh_opts) if self.nodes else []
            if self.multiplex and self._mux is None:
                self._mux, self._mux_private = mux_dir()
        mux = ["-o", "ControlMaster=auto", "-o", f"ControlPath={self._mux}/%C",
               "-o", f"ControlPersist={MUX_PERSIST_S}"] if self.multiplex else []
        return [*self.ssh_opts, *self._kex, *mux]

    def argv(self, node: Node, command: Sequence[str]) -> list[str]:
        """The ssh argv that runs command (quoted for the node's shell) on node."""
        return ssh_argv(node, list(command), extra_opts=self._options())

    def prefix(self, node: Node) -> list[str]:
        """The ssh argv up to the host, without host or command (rsync's -e)."""
        argv = self.argv(node, ["true"])
        return argv[:argv.index("--") - 1]

    def start(self, nodes: Sequence[Node], command: Callable[[Node], Sequence[str]], **options) -> Fanout:
        """command(node) on every node in the background (Fanout's options: timeout, retries,
        on_line, stdin); the caller waits with .results()."""
        return Fanout(nodes, lambda n: self.argv(n, command(n)), **options)

    def run(self, nodes: Sequence[Node], command: Callable[[Node], Sequence[str]], *,
            what: str | None = None, **options) -> list[NodeResult]:
        """command(node) on every node; wait for all. what: raise a LaunchError naming every
        failed node ("<what> failed on ...") instead of returning failures."""
        results = self.start(nodes, command, **options).results()
        if what:
            raise_on_failure(results, what)
        return results

    def close(self) -> None:
        """Masters in the shared directory stay (they exit when idle); a private one goes now."""
        if self._mux is None or not self._mux_private:
            return
        close_masters(self.nodes, self.ssh_opts, self._mux)
        shutil.rmtree(self._mux, ignore_errors=True)
        self._mux = None
