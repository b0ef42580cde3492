"""`--workdir DIR`: the job's code on every node, in parallel, before the containers start.

Each node keeps the job's copy in its job directory's workdir/ (~/.dtrain/nodes/HOST/jobs/<job>/workdir,
the path the node printed when it made the directory: dtrain/contract.py; mounted at /workdir, the
job's working directory) and, for the next launch, a copy of the last one sent from this directory
in ~/.dtrain/nodes/HOST/workdir-cache/<key>: rsync hard-links what did not change from there
(--link-dest), so a relaunch after editing one file sends about that file. Each node its own,
also where nodes share the home. The job's copy goes at teardown; the cache stays (`dtrain stop
--job` does not touch it; remove ~/.dtrain/nodes/*/workdir-cache).

What is sent (`select`, the same rules for `dtrain sagemaker run`'s upload): every file under DIR
but what its .gitignore and .dtrainignore files exclude (git's rules, per directory, deeper files
winning; `.git/` never; launch/jobs/ignore.py: matching time bounded, ignore files bounded in
size), and but the files that may hold secrets, even where git tracks them:
- by name (SECRETS, case-insensitive: `.env*`, `*.env`, keys, credentials, kubeconfig, ...);
- by content (launch/jobs/secretscan.py: private keys, cloud credentials, tokens; the first
  64 KiB of each file, binaries skipped);
- a hard link to one of those under another name (same inode).
Only the top directory's .dtrainignore sends one back, by a `!` line naming it without
wildcards (`!.env.example`, `!tests/fixtures/id_test`); a deeper .dtrainignore or a .gitignore
cannot, nor can `!*`. What was left out is reported by name (`left_out_line`), never its content.
`select` is the only function here that reads the disk; `sync` runs rsync.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import socket
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from dtrain.launch.errors import LaunchError
from dtrain.launch.jobs import ignore, node_programs, secretscan
from dtrain.launch.remote.fanout import NodeResult, raise_on_failure, run_all
from dtrain.launch.remote.hosts import Node
from dtrain.launch.remote.transport import SshTransport

IGNORE_FILES = (".gitignore", ".dtrainignore")  # in this order: .dtrainignore's lines win
DTRAINIGNORE = ".dtrainignore"
# Names of files (and directories, ending in /) that hold secrets: never uploaded, whatever git
# tracks, unless the top .dtrainignore names them (`!.env`). Gitignore syntax, from DIR, matched
# against the lower-cased path (.ENV, ID_RSA too).
SECRETS = (
    ".env*", "*.env", "*.env.*",  # .env, .env.local, .envrc (direnv), prod.env, prod.env.bak
    "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", "*.ppk", "*.kdbx",  # keys, certificates
    "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*",  # ssh keys (their .pub too: simplest)
    ".ssh/", ".aws/", ".gnupg/", ".kube/", ".azure/", "**/.config/gcloud/", "**/.docker/config.json",
    "*credentials*", ".netrc", "_netrc", ".git-credentials", ".pypirc", ".npmrc", ".pgpass", ".dockercfg",
    "*.tfstate", "*.tfstate.*", "*.tfvars", "*.tfvars.json",  # Terraform state and variables
    "*service-account*.json", "*service_account*.json", "*-key.json", "*_key.json",  # GCP keys
    "kubeconfig", "kubeconfig.*", "*.kubeconfig",
    "secrets.*", "secret.*", ".secrets", ".secret", "*.secret", "*.secrets",
    "token", "token.*", "*.token", ".vault-token", "*_token", "*-token",
    ".htpasswd", "htpasswd", "*.htpasswd",
)
QUIET = ("__pycache__/",)  # left out too, not worth a word
_SECRETS = ignore.compile_lines(SECRETS, "SECRETS")
_QUIET = ignore.compile_lines(QUIET, "QUIET")
DEFAULT_LIMIT = 1 << 30  # bytes; over it, data belongs on a --mount
# On each node, relative to its job's workdir/ (~/.dtrain/nodes/HOST/jobs/<job>/workdir): the
# node's cache of this directory, ~/.dtrain/nodes/HOST/workdir-cache/<key> (host/prepare.sh
# keep_workdir puts it there).
NODE_CACHE = "../../../workdir-cache"


@dataclass(frozen=True)
class Workdir:
    root: Path
    files: tuple[str, ...]  # relative POSIX paths of regular files and symlinks, sorted
    size: int  # bytes
    key: str  # this directory's cache name on the nodes
    left_out: tuple[str, ...] = ()  # what may hold secrets, kept back (directories end in /), sorted


def parse_size(text: str) -> int:
    """`--workdir-limit` as bytes: a whole number with an optional k/m/g suffix (powers of 1024)."""
    from dtrain import values

    try:
        return values.size("--workdir-limit", text, "500m or 2g")
    except values.BadValue as e:
        raise LaunchError(str(e)) from None


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def cache_key(root: Path) -> str:
    """Stable per (this machine, directory): two projects never share a node cache."""
    return hashlib.sha256(f"{socket.gethostname()}:{root.resolve()}".encode()).hexdigest()[:16]


Specs = list[tuple[str, ignore.Rules]]  # (directory, its ignore file's rules), .gitignore before .dtrainignore


def _verdict(specs: Specs, rel: str) -> bool | None:
    """git's rule: the deepest directory's ignore files decide, the last matching line wins.
    True: ignored, False: re-included (`!`), None: no line matched."""
    verdict = None
    for base, rules in specs:
        if base and not rel.startswith(base + "/"):
            continue
        r = rules.check(rel[len(base) + 1:] if base else rel)
        if r is not None:
            verdict = r
    return verdict


def secret_name(rel: str) -> bool:
    """rel's name says it may hold a secret (SECRETS, any case)."""
    return _SECRETS.match(rel.lower())


def sent_back(rules: ignore.Rules) -> ignore.Rules:
    """What the top .dtrainignore sends back although it may hold secrets: its `!` lines without
    wildcards (`!.env.example`, `!.aws/`), as plain patterns. Not `!*`, not a deeper file's."""
    return ignore.Rules(tuple(ignore.Pattern(p.regex, False, p.text, True)
                              for p in rules.patterns if p.negate and p.literal))


def decide(specs: Specs, rel: str, back: ignore.Rules = ignore.Rules()) -> str | None:
    """Why rel (a file, or a directory ending in /) stays here: "ignored" (an ignore file, or QUIET),
    "secret" (SECRETS, not sent back by `back`: sent_back), or None: it goes."""
    verdict = _verdict(specs, rel)
    if verdict:
        return "ignored"
    if secret_name(rel) and not back.match(rel):
        return "secret"
    if verdict is None and _QUIET.match(rel):
        return "ignored"
    return None


def _read_specs(directory: Path, base: str, budget: ignore.Budget) -> tuple[Specs, ignore.Rules]:
    """directory's ignore files' rules, and its .dtrainignore's alone (empty without one)."""
    out: Specs = []
    own = ignore.Rules()
    for name in IGNORE_FILES:
        f = directory / name
        if f.is_file():
            try:
                rules = ignore.read_rules(f, budget)
            except OSError as e:
                raise LaunchError(f"--workdir: cannot read {f}: {e.strerror or e}") from None
            out.append((base, rules))
            if name == DTRAINIGNORE:
                own = rules
    return out, own


def _inodes(root: Path, dirs: Sequence[str]) -> set[tuple[int, int]]:
    """(device, inode) of every file under the given directories of root (no link followed)."""
    found = set()
    for d in dirs:
        for dirpath, _dirnames, filenames in os.walk(root / d):
            for name in filenames:
                try:
                    st = os.lstat(os.path.join(dirpath, name))
                except OSError:
                    continue
                found.add((st.st_dev, st.st_ino))
    return found


def select(root: Path, skip: Sequence[str] = (),
           check: Callable[[str, int, int], None] | None = None, rules: bool = True) -> Workdir:
    """The files of root that leave this machine (launch --workdir, sagemaker run): regular files
    and symlinks, less ignored ones and those that may hold secrets (by name, by content, hard
    links to them; recorded in left_out), never .git/. skip: directories (relative POSIX paths)
    not walked at all. check(rel, files, bytes) after each file: raise there to stop at a limit.
    rules=False (data: sagemaker --input DIR): no ignore file is read, only secrets are left out."""
    root = root.expanduser()
    specs: Specs = []
    back = ignore.Rules()
    budget = ignore.Budget()
    files: list[str] = []
    left_out: list[str] = []
    held_dirs: list[str] = []  # directories left out as secrets (their inodes: only if needed)
    held: set[tuple[int, int]] = set()  # inodes of files left out as secrets
    linked: dict[tuple[int, int], list[str]] = {}  # inodes of files sent that have other names
    size = 0
    skipped = {s.strip("/") for s in skip}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        base = here.relative_to(root).as_posix()
        base = "" if base == "." else base
        if rules:
            found, own = _read_specs(here, base, budget)
            specs.extend(found)
            if not base:
                back = sent_back(own)
        keep = []
        for d in sorted(dirnames):
            rel = f"{base}/{d}" if base else d
            link = (here / d).is_symlink()
            why = decide(specs, rel if link else rel + "/", back)
            if why == "secret":
                left_out.append(rel if link else rel + "/")
                if not link:
                    held_dirs.append(rel)
            elif d == ".git" or rel in skipped or why:
                continue
            elif link:
                files.append(rel)  # a link to a directory travels as a link
            else:
                keep.append(d)
        dirnames[:] = keep
        for name in sorted(filenames):
            rel = f"{base}/{name}" if base else name
            path = here / name
            try:
                st = path.lstat()
            except OSError:
                continue
            if not (stat.S_ISLNK(st.st_mode) or stat.S_ISREG(st.st_mode)):
                continue  # FIFOs, sockets, devices: not code
            why = decide(specs, rel, back)
            if why == "secret":
                left_out.append(rel)
                held.add((st.st_dev, st.st_ino))
            if why:
                continue
            if stat.S_ISREG(st.st_mode):
                if not os.access(path, os.R_OK):
                    raise LaunchError(f"--workdir {root}: cannot read {rel}; make it readable, or leave it out "
                                      f"with a line in {DTRAINIGNORE}")
                if not back.match(rel) and secretscan.kind(path):
                    left_out.append(rel)
                    held.add((st.st_dev, st.st_ino))
                    continue
                if st.st_nlink > 1:
                    linked.setdefault((st.st_dev, st.st_ino), []).append(rel)
            files.append(rel)
            size += st.st_size
            if check is not None:
                check(rel, len(files), size)
    if linked:  # hard links to a file held back, under another name: held back too
        held |= _inodes(root, held_dirs)
        for ino, rels in linked.items():
            if ino in held:
                gone = set(rels)
                files = [f for f in files if f not in gone]
                left_out.extend(rels)
                size -= sum((root / r).lstat().st_size for r in rels)
    return Workdir(root, tuple(sorted(files)), size, cache_key(root), tuple(sorted(left_out)))


def scan(root: Path, limit: int = DEFAULT_LIMIT) -> Workdir:
    """The files --workdir sends; LaunchError if DIR is missing or over the limit."""
    root = root.expanduser()
    if not root.is_dir():
        raise LaunchError(f"--workdir {root}: not a directory")

    def check(rel: str, _count: int, size: int) -> None:
        if size > limit:
            raise LaunchError(
                f"--workdir {root}: over the {human(limit)} limit (--workdir-limit) at {rel}; "
                "keep datasets and outputs out of it (.dtrainignore) and give them to the job "
                "with --mount instead")

    return select(root, check=check)


def names(rels: Sequence[str], most: int = 8) -> str:
    """`a, b, c and 4 more`: names as one line (a name that is not printable, as repr)."""
    shown = ", ".join(r if r.isprintable() else repr(r) for r in rels[:most])
    return shown + (f" and {len(rels) - most} more" if len(rels) > most else "")


def left_out_line(left_out: Sequence[str]) -> str | None:
    """One line naming what was kept back as it may hold secrets (names only), or None."""
    if not left_out:
        return None
    return (f"left out {len(left_out)} that may hold secrets: {names(left_out)} (to send one, add "
            f"!NAME to {DTRAINIGNORE})")


def rsync_argv(ssh: Sequence[str], target: str, wd: Workdir, node_dir: str) -> list[str]:
    """rsync of wd's files to target:NODE_DIR/workdir, NODE_DIR the job's directory on that node
    (absolute, as the node printed it: Job.prepare), hard-linking unchanged files from the
    node's cache of this directory. ssh: the ssh argv that reaches the node, without the host
    (rsync's -e takes it as one string, quoted as rsync splits it)."""
    if any("\\" in a for a in ssh):
        raise LaunchError("ssh options for --workdir cannot hold a backslash (rsync's -e)")
    if not node_dir.startswith("/"):
        raise LaunchError(f"--workdir: {target} gave no absolute job directory ({node_dir!r})")
    return ["rsync", "-a", "--stats", "--files-from=-", "--from0", f"--link-dest={NODE_CACHE}/{wd.key}/",
            "-e", shlex.join(ssh), f"{wd.root}/", f"{target}:{node_dir}/workdir/"]


_STATS = {"files": re.compile(r"Number of regular files transferred: ([\d,]+)"),
          "bytes": re.compile(r"Total bytes sent: ([\d,]+)")}


def parse_stats(out: str) -> tuple[int, int]:
    """rsync --stats -> (files sent, bytes sent on the wire)."""
    got = []
    for rx in _STATS.values():
        m = rx.search(out)
        got.append(int(m.group(1).replace(",", "")) if m else 0)
    return got[0], got[1]


def refresh_cache_argv(job: str, key: str) -> list[str]:
    """On the node, after the sync: the job's copy becomes the node's cache of this directory
    for the next launch (hard links: no data copied; host/prepare.sh keep_workdir)."""
    from dtrain.launch.jobs.store import check_name

    return node_programs.host_argv("keep_workdir", check_name(job), key)


def sync(wd: Workdir, nodes: Sequence[Node], job: str, ssh: SshTransport,
         say: Callable[[str], None] = print, *, dirs: Mapping[str, str]) -> list[NodeResult]:
    """Send wd to every node at once (the job's directory there exists: Job.prepare; dirs: host
    -> that directory, as the node printed it); print files and bytes sent per node."""
    listing = "\0".join(wd.files) + "\0"
    note = left_out_line(wd.left_out)
    if note:
        say(f"[launch] --workdir {wd.root}: {note}")

    def target(n: Node) -> str:
        return f"{n.user}@{n.host}" if n.user else n.host

    argvs = {n.host: rsync_argv(ssh.prefix(n), target(n), wd, dirs.get(n.host, "")) for n in nodes}
    results = run_all(nodes, lambda n: argvs[n.host], stdin=lambda n: listing, timeout=3600)
    raise_on_failure(results, f"sending --workdir {wd.root}")
    ssh.run(nodes, lambda n: refresh_cache_argv(job, wd.key), timeout=120,
            what="keeping the workdir for the next launch")
    sent = [(r.host, *parse_stats(r.stdout)) for r in results]
    total = sum(b for _, _, b in sent)
    say(f"[launch] workdir {wd.root}: {len(wd.files)} files, {human(wd.size)}; sent "
        f"{human(total)} to {len(nodes)} node(s) ("
        + ", ".join(f"{h}: {f} changed, {human(b)}" for h, f, b in sent) + ")")
    return results
