"""One parser per kind of user value (count, number, size, env, image reference, name, CIDR).

Pure functions: a flag's name and its text in, the parsed value out, or BadValue whose
message is one line `FLAG 'TEXT': expected ...`. tasks.py checks every flag with these before
anything touches a node; images/ and launch/ parse the same kinds of value with them too.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Iterable

MAX_TEXT = 4096  # longer values are refused (and shown cut short in the message)

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*", re.ASCII)  # job and cluster names
USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*", re.ASCII)
NAME_MAX = 63  # a job name becomes a container name, a directory, a CloudFormation stack name part
_SIZE = re.compile(r"([0-9]{1,15})([kmgt]?)(?:ib|b)?", re.ASCII)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class BadValue(ValueError):
    """A flag's value that is not of its kind; str() is the one-line message."""


def shown(text) -> str:
    """The value as the message quotes it: repr, cut short when long."""
    s = str(text)
    return repr(s if len(s) <= 60 else s[:40] + "...") + (f" ({len(s)} characters)" if len(s) > 60 else "")


def shown_path(text) -> str:
    """A path as a message quotes it: whole up to 200 characters, else its end (the file's name)."""
    s = str(text)
    return repr(s) if len(s) <= 200 else repr("..." + s[-60:]) + f" ({len(s)} characters)"


def _plain(flag: str, text, what: str, *, secret: bool = False) -> str:
    """The text of a value, refused when it is not a short single line of printable characters
    (a secret's message names the flag only)."""
    s = None if text is None or isinstance(text, bool) else str(text)
    if s is None or len(s) > MAX_TEXT or not s.isprintable():
        raise BadValue(f"{flag}: expected {what}" if secret else f"{flag} {shown(text)}: expected {what}")
    return s


def text(flag: str, value, *, secret: bool = False) -> str:
    """Any flag's text: one line of printable characters, at most MAX_TEXT of them."""
    return _plain(flag, value, f"one line of printable text, at most {MAX_TEXT} characters", secret=secret)


def count(flag: str, text, lo: int = 0, hi: int | None = None) -> int:
    """A whole number in lo..hi (decimal digits only: no sign, no 1.5, no 0x)."""
    accepted = f"a whole number from {lo} to {hi}" if hi is not None else f"a whole number >= {lo}"
    s = _plain(flag, text, accepted).strip()
    n = int(s) if s.isascii() and s.isdigit() and len(s) <= 18 else None
    if n is None or n < lo or (hi is not None and n > hi):
        raise BadValue(f"{flag} {shown(text)}: expected {accepted}")
    return n


def number(flag: str, text, lo: float = 0.0, *, or_equal: bool = False, hi: float | None = None) -> float:
    """A finite decimal number > lo (>= lo with or_equal), and <= hi when given."""
    accepted = f"a number {'>=' if or_equal else '>'} {lo:g}" + (f" and <= {hi:g}" if hi is not None else "")
    s = _plain(flag, text, accepted).strip()
    x = float(s) if re.fullmatch(r"[0-9]{1,15}(?:\.[0-9]{0,9})?|\.[0-9]{1,9}", s) else math.nan
    if not math.isfinite(x) or x < lo or (x == lo and not or_equal) or (hi is not None and x > hi):
        raise BadValue(f"{flag} {shown(text)}: expected {accepted}")
    return x


def size(flag: str, text, example: str = "500m or 2g") -> int:
    """Bytes from a whole number with an optional k/m/g/t suffix (powers of 1024; `b`/`ib` allowed)."""
    accepted = f"a size such as {example}"
    s = _plain(flag, text, accepted).strip().lower()
    m = _SIZE.fullmatch(s)
    if not m or int(m.group(1)) == 0:
        raise BadValue(f"{flag} {shown(text)}: expected {accepted}")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2)]


def docker_size(flag: str, text, example: str = "16g") -> str:
    """A size as `docker run --shm-size` takes it (NUMBER[b|k|m|g]), checked by size()."""
    size(flag, text, example)
    s = str(text).strip().lower()
    m = _SIZE.fullmatch(s)
    return m.group(1) + (m.group(2) or "b") if m.group(2) != "t" else str(int(m.group(1)) << 10) + "g"


_RATE = re.compile(r"([0-9]{1,12}(?:\.[0-9]{1,9})?)([kmg]?bit)", re.ASCII)
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}


def bit_rate(flag: str, text) -> int:
    """A link rate in tc's decimal bit units (`1gbit`, `500mbit`, `100kbit`) -> bits per second."""
    accepted = "a rate such as 1gbit, 500mbit or 100kbit"
    s = _plain(flag, text, accepted).strip().lower()
    m = _RATE.fullmatch(s)
    bits = int(float(m.group(1)) * _RATE_UNITS[m.group(2)]) if m else 0
    if bits <= 0:
        raise BadValue(f"{flag} {shown(text)}: expected {accepted}")
    return bits


def link_rates(flag: str, items: Iterable[str] | None, nodes: int) -> tuple[int | None, dict[int, int]]:
    """`--link-rate` given once or more, each a comma list of RATE (every node) or INDEX=RATE
    (node INDEX of 1..nodes): (every node's rate or None, {index: rate}); the last one wins."""
    default: int | None = None
    per_node: dict[int, int] = {}
    for item in items or []:
        for part in _plain(flag, item, "RATE or INDEX=RATE, e.g. 1gbit,3=100mbit").split(","):
            index, sep, rate = part.strip().rpartition("=")
            if not sep:
                default = bit_rate(flag, rate)
                continue
            if not (index.isascii() and index.isdigit() and 1 <= int(index) <= nodes):
                raise BadValue(f"{flag} {shown(part)}: expected INDEX=RATE with INDEX a node from 1 to {nodes}, "
                               "e.g. 3=100mbit")
            try:
                per_node[int(index)] = bit_rate(flag, rate)
            except BadValue:
                raise BadValue(f"{flag} {shown(part)}: expected INDEX=RATE with a rate such as 100mbit") from None
    return default, per_node


def env_name(name: str) -> bool:
    """A POSIX shell variable name: what every launcher forwards (torchrun/ray drop others)."""
    return bool(ENV_NAME.fullmatch(name))


def env_pair(flag: str, text) -> tuple[str, str]:
    """`NAME=VALUE` with NAME a variable name (letters, digits, _; not starting with a digit)."""
    s = _plain(flag, text, "NAME=VALUE")
    k, sep, v = s.partition("=")
    if not sep or not env_name(k):
        raise BadValue(f"{flag} {shown(text)}: expected NAME=VALUE, NAME of letters, digits and _ "
                       "not starting with a digit")
    return k, v


def env_pairs(flag: str, items: Iterable[str] | None) -> dict[str, str]:
    return dict(env_pair(flag, kv) for kv in items or [])


def name(flag: str, text, max_len: int = NAME_MAX) -> str:
    """A job or cluster name: letters, digits, _ . -, starting alphanumeric, at most max_len."""
    accepted = f"a name of letters, digits, _ . - (starting alphanumeric, at most {max_len})"
    s = _plain(flag, text, accepted)
    if not NAME.fullmatch(s) or len(s) > max_len:
        raise BadValue(f"{flag} {shown(text)}: expected {accepted}")
    return s


def user(flag: str, text) -> str:
    """A login name on the nodes (ssh -l): letters, digits, _ . -, not starting with . or -."""
    accepted = "a user name of letters, digits, _ . - (not starting with . or -, at most 32)"
    s = _plain(flag, text, accepted)
    if not USER.fullmatch(s) or len(s) > 32:
        raise BadValue(f"{flag} {shown(text)}: expected {accepted}")
    return s


_INSTANCE_TYPE = re.compile(r"[a-z][a-z0-9-]*\.[a-z0-9-]+", re.ASCII)  # p4d.24xlarge, u-6tb1.metal


def instance_type(flag: str, text, *, sagemaker: bool = False) -> str:
    """An EC2 instance type (p4d.24xlarge), or with sagemaker a SageMaker one (ml.p4d.24xlarge)."""
    example = "ml.p4d.24xlarge" if sagemaker else "p4d.24xlarge"
    s = _plain(flag, text, f"an instance type such as {example}")
    bare = s[3:] if sagemaker and s.startswith("ml.") else (None if sagemaker else s)
    if bare is None or not _INSTANCE_TYPE.fullmatch(bare) or len(s) > 64:
        hint = f" (SageMaker's types start with ml.: ml.{s})" if sagemaker and _INSTANCE_TYPE.fullmatch(s) else ""
        raise BadValue(f"{flag} {shown(text)}: expected an instance type such as {example}{hint}")
    return s


def ec2_instance_type(flag: str, text) -> str:
    """An EC2 instance type that botocore's EC2 model names (its InstanceType enum): the nodes
    of a Kubeflow or ECS job; a SageMaker name (ml.) is refused, saying to drop ml."""
    s = _plain(flag, text, "an instance type such as p4d.24xlarge")
    if s.startswith("ml.") and _INSTANCE_TYPE.fullmatch(s[3:]):
        raise BadValue(f"{flag} {shown(text)}: a SageMaker type; the nodes' EC2 type has no ml. (drop it: {s[3:]})")
    instance_type(flag, s)
    known = _ec2_instance_types()
    if s not in known:
        import difflib

        close = difflib.get_close_matches(s, known, n=3, cutoff=0.6)
        raise BadValue(f"{flag} {shown(text)}: not an EC2 instance type; "
                       + (f"did you mean {', '.join(close)}?" if close else "e.g. p4d.24xlarge, p5.48xlarge, g5.12xlarge"))
    return s


def _ec2_instance_types() -> list[str]:
    import botocore.session

    return list(botocore.session.get_session().get_service_model("ec2").shape_for("InstanceType").enum)


def image(flag: str, text) -> str:
    """A Docker image reference (dtrain/reference.py: the engine's own grammar)."""
    from dtrain.reference import BadReference, check

    s = _plain(flag, text, "an image reference REGISTRY[:PORT]/NAME[:TAG]")
    try:
        check(s, flag)
    except BadReference as e:  # a BadValue: a job file's image is named by its file and line
        raise BadValue(str(e)) from None
    return s


def choice(flag: str, text, choices: tuple[str, ...]) -> str:
    if text not in choices:
        raise BadValue(f"{flag} {shown(text)}: use {', '.join(choices[:-1])} or {choices[-1]}")
    return text


def regex(flag: str, text) -> str:
    """A Python regular expression (re.search applies it to each line)."""
    s = _plain(flag, text, "a regular expression (Python's re), e.g. '^step [0-9]+'")
    try:
        re.compile(s)
    except (re.error, OverflowError, RecursionError, ValueError) as e:  # a{99999999999}: OverflowError
        raise BadValue(f"{flag} {shown(text)}: not a regular expression: {e}; e.g. '^step [0-9]+'") from None
    if not s:
        raise BadValue(f"{flag} '': expected a regular expression (without the flag, any line of a rank is progress)")
    from dtrain.patterns import backtracking

    why = backtracking(s)
    if why:
        raise BadValue(f"{flag} {shown(text)}: {why}; write a simpler one, e.g. '^step [0-9]+'")
    return s


def cidr(flag: str, text) -> str:
    """An IPv4 network `A.B.C.D/N`; a bare address is that address alone (/32)."""
    accepted = "an IPv4 network such as 10.1.2.3/32 (a bare address means /32)"
    s = _plain(flag, text, accepted).strip()
    try:
        net = ipaddress.IPv4Network(s, strict=False) if s else None
    except ValueError:
        net = None
    if net is None:
        raise BadValue(f"{flag} {shown(text)}: expected {accepted}")
    return str(net)


def region(flag: str, text) -> str:
    """An AWS region name (us-east-1, eu-central-2, us-gov-west-1, cn-north-1), checked before
    boto3 sees it (an empty or odd one was botocore's ValueError)."""
    accepted = "an AWS region such as us-east-1 or eu-central-2"
    s = _plain(flag, text, accepted)
    if not re.fullmatch(r"[a-z]{2,4}(?:-[a-z]{2,12}){1,3}-[0-9]{1,2}", s, re.ASCII):
        raise BadValue(f"{flag} {shown(text)}: expected {accepted}")
    return s


# ---------------------------------------------------------------- files a user names

NAME_BYTES_MAX = 255  # a file name's longest (every Linux file system); longer: ENAMETOOLONG
PATH_BYTES_MAX = 4095
# Directories that are never a project: sending one (launch --workdir) reads devices, kernel
# files or a whole system.
SYSTEM_DIRS = ("/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run",
               "/sbin", "/sys", "/usr", "/var")
_UNDER_SYSTEM = ("/dev/", "/proc/", "/sys/", "/run/")


def file_kind(mode: int) -> str:
    """What a stat mode is, in words: 'a regular file', 'a directory', 'a named pipe (FIFO)', ..."""
    import stat

    for test, words in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                        (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return "not a regular file"


_WANTED = {"file": "a regular file", "dir": "a directory", "socket": "a socket",
           "new-file": "a regular file or a new one", "new-dir": "a directory or a new one",
           "project": "a project directory"}


def local_path(flag: str, text, want: str = "file", what: str = "") -> "Path":
    """A path on this machine that a user names (a flag, a job file's key, a positional), checked
    before it is opened: `want` is file (an existing regular file), dir (an existing directory),
    socket, new-file (a regular file or none yet, in an existing directory), new-dir (a directory
    or none yet) or project (a directory that is not a system one: /, /dev, /proc, /usr, ...).
    A FIFO, a device, a directory where a file is wanted (or the reverse), a name too long:
    BadValue, one line naming the flag and what it is. `what` says what the file should hold."""
    import os
    from pathlib import Path

    wanted = f"{what}: {_WANTED[want]}" if what else _WANTED[want]
    s = _plain(flag, text, f"a path to {wanted}")
    if not s.strip():
        raise BadValue(f"{flag} '': expected a path to {wanted}")
    p = Path(s).expanduser()
    b = os.fsencode(str(p))
    if len(b) > PATH_BYTES_MAX or any(len(os.fsencode(part)) > NAME_BYTES_MAX for part in p.parts):
        raise BadValue(f"{flag} {shown_path(text)}: a name longer than {NAME_BYTES_MAX} bytes; expected {wanted}")
    try:
        st = os.stat(p)
    except (FileNotFoundError, NotADirectoryError):
        st = None
    except OSError as e:
        raise BadValue(f"{flag} {shown_path(text)}: cannot read it: {e.strerror or e}; expected {wanted}") from None
    if st is None:
        if want not in ("new-file", "new-dir"):
            raise BadValue(f"{flag} {shown_path(text)}: no such {'directory' if want in ('dir', 'project') else 'file'}"
                           f"; expected {wanted}")
        parent = p.parent if want == "new-file" else next((a for a in p.parents if a.exists()), Path("."))
        if not parent.is_dir():
            raise BadValue(f"{flag} {shown_path(text)}: directory {str(parent)!r} does not exist; expected {wanted}")
        return p
    kind = file_kind(st.st_mode)
    need = {"file": "a regular file", "new-file": "a regular file", "dir": "a directory",
            "new-dir": "a directory", "project": "a directory", "socket": "a socket"}[want]
    if kind != need:
        raise BadValue(f"{flag} {shown_path(text)}: {kind}, not {need}; expected {wanted}")
    fs = pseudo_fs(st.st_dev) if want in ("file", "new-file") else None
    if fs:  # /proc/kmsg, /sys/...: "regular" files whose read blocks or never ends
        raise BadValue(f"{flag} {shown_path(text)}: a kernel file ({fs}), not a regular file; expected {wanted}")
    if want == "project":
        real = os.path.realpath(p)
        if real in SYSTEM_DIRS or real.startswith(_UNDER_SYSTEM):
            raise BadValue(f"{flag} {shown_path(text)}: {real} is a system directory, not a project; "
                           "expected your project's directory")
    return p


def text_file(flag: str, path, what: str, expected: str, limit: int = 0) -> str:
    """The text of a small file a flag names: local_path's checks, then small_text_file's,
    errors naming the flag."""
    p = local_path(flag, path, "file", what)
    try:
        return small_text_file(p, what.removeprefix("a ").removeprefix("an "), expected, limit or SMALL_FILE_MAX)
    except BadValue as e:
        raise BadValue(f"{flag} {e}") from None


def json_text(flag: str, text: str, where) -> object:
    """JSON from a file's text; too deep, a number too long or not JSON: one line naming it."""
    import json

    try:
        return json.loads(text)
    except RecursionError:
        raise BadValue(f"{flag} {where}: JSON nested too deep") from None
    except ValueError as e:  # JSONDecodeError, and int()'s digit limit
        raise BadValue(f"{flag} {where}: not valid JSON ({' '.join(str(e).split())[:120]})") from None


JSON_MAX = 16 << 20  # a JSON file a flag names (a lifecycle policy, an image catalog that grows with each push)


def json_file(flag: str, path, what: str, *, top: type = dict) -> object:
    """A small JSON file a flag names (an ECR lifecycle policy, a catalog): local_path's checks,
    then JSON whose top level is `top` (an object); one line naming the flag otherwise."""
    data = json_text(flag, text_file(flag, path, what, "JSON", JSON_MAX), path)
    if not isinstance(data, top):
        raise BadValue(f"{flag} {path}: JSON {type(data).__name__}, not {what} (a JSON object)")
    return data


def pem_file(flag: str, path, what: str = "a CA bundle") -> str:
    """PEM certificates (a CA bundle): text with a -----BEGIN CERTIFICATE----- block."""
    data = text_file(flag, path, what, "PEM certificates", 16 << 20)
    if not re.search(r"-----BEGIN [A-Z509 ]*CERTIFICATE-----", data):  # CERTIFICATE, TRUSTED CERTIFICATE
        raise BadValue(f"{flag} {path}: no -----BEGIN CERTIFICATE----- block; expected {what} of PEM certificates")
    return data


_INI_SECTION = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*", re.ASCII)


def ini_file(flag: str, path, what: str = "a pip.conf") -> str:
    """An INI file (pip.conf): configparser reads it, its sections are names ([global],
    [install]); one line naming the flag and the problem otherwise."""
    import configparser

    data = text_file(flag, path, what, "INI sections such as [global]")
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read_string(data, source=str(path))
    except configparser.Error as e:
        raise BadValue(f"{flag} {path}: not {what} ({shown(' '.join(str(e).split()))})") from None
    bad = next((n for n in parser.sections() if not _INI_SECTION.fullmatch(n)), None)
    if bad is not None:
        raise BadValue(f"{flag} {path}: section {shown(bad)} is not a name; expected {what} with sections "
                       "such as [global]")
    return data


SSH_KEY_MAX = 64 << 10


def ssh_key(flag: str, text) -> str:
    """A private key file for ssh -i: a regular file holding a PEM-armoured private key (OpenSSH's
    own format or PEM). Empty, binary, a public key, a FIFO: one line saying what it is."""
    p = local_path(flag, text, "file", "the nodes' ssh private key")
    try:
        data = small_text_file(p, "private key", "an ssh private key (-----BEGIN ... PRIVATE KEY-----)",
                               SSH_KEY_MAX)
    except BadValue as e:
        raise BadValue(f"{flag} {e}") from None
    if not data.strip():
        raise BadValue(f"{flag} {shown_path(text)}: an empty file, not an ssh private key")
    if "-----BEGIN " not in data or "PRIVATE KEY-----" not in data:
        hint = " (a public key: give the file without .pub)" if data.startswith(("ssh-", "ecdsa-", "sk-")) else ""
        raise BadValue(f"{flag} {shown_path(text)}: not an ssh private key "
                       f"(no -----BEGIN ... PRIVATE KEY----- line){hint}")
    return str(p)


_SSH_CONFIG_LINE = re.compile(r"\s*(?:#.*|[A-Za-z][A-Za-z0-9]*(?:\s*=\s*|\s+).*|[A-Za-z][A-Za-z0-9]*\s*)?", re.ASCII)


def ssh_config(flag: str, text) -> str:
    """An ssh config file (ssh -F): a small text file of `Keyword value` lines (ssh reads the
    values; a line that is no keyword, binary, a FIFO are refused here, naming the line)."""
    p = local_path(flag, text, "file", "an ssh config file")
    try:
        data = small_text_file(p, "ssh config", "`Keyword value` lines (ssh_config(5))")
    except BadValue as e:
        raise BadValue(f"{flag} {e}") from None
    for n, line in enumerate(data.splitlines(), 1):
        if not _SSH_CONFIG_LINE.fullmatch(line):
            raise BadValue(f"{flag} {p}:{n}: not a `Keyword value` line of an ssh config: {shown(line)}")
    return str(p)


SMALL_FILE_MAX = 1 << 20  # a hostfile or env file larger than 1 MiB is a mistake (/dev/zero, a log)


def small_text_file(path, what: str, expected: str, limit: int = SMALL_FILE_MAX, *, follow: bool = True) -> str:
    """The text of a small file the user names (what: "hostfile", "env file"): read_user_file's
    bytes, UTF-8. Errors are one line naming the file."""
    data = read_user_file(path, what, expected, limit, follow=follow)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadValue(f"{path}: not a text {what} (not UTF-8); expected {expected}") from None


# Kernel and pseudo file systems: their "regular" files are no user's data, and reading some
# blocks for ever (/proc/kmsg) or never ends.
PSEUDO_FS = ("proc", "sysfs", "devtmpfs", "debugfs", "tracefs", "securityfs", "cgroup", "cgroup2", "configfs",
             "pstore", "bpf", "efivarfs", "fusectl", "mqueue", "binfmt_misc", "devpts", "rpc_pipefs", "nsfs",
             "autofs")


def pseudo_fs(dev: int) -> str | None:
    """The kernel file system (proc, sysfs, ...) that device number `dev` (a stat's st_dev) is,
    or None for a file system that holds files (ext4, xfs, tmpfs, overlay, nfs...)."""
    import os

    for root, fs in (("/proc", "proc"), ("/sys", "sysfs")):
        try:
            if os.stat(root).st_dev == dev:
                return fs
        except OSError:
            pass
    want = f"{os.major(dev)}:{os.minor(dev)}"
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            info = f.read(4 << 20).decode(errors="replace")
    except OSError:
        return None
    for line in info.splitlines():
        fields = line.split()  # ID PARENT MAJ:MIN ROOT POINT OPTIONS... - FSTYPE SOURCE SUPER
        if len(fields) > 2 and fields[2] == want and "-" in fields:
            fstype = fields[fields.index("-") + 1] if fields.index("-") + 1 < len(fields) else ""
            if fstype.split(".")[0] in PSEUDO_FS:
                return fstype
    return None


def read_user_file(path, what: str, expected: str, limit: int = SMALL_FILE_MAX, *, follow: bool = True) -> bytes:
    """The bytes of a file the user names, read the one safe way: opened first (O_NONBLOCK, so
    neither a FIFO's open nor a read of /proc/kmsg blocks; O_NOCTTY; O_NOFOLLOW unless `follow`:
    a file inside a project must not be a link to elsewhere), then checked on that descriptor
    (fstat: a regular file, not on a kernel file system, at most `limit` bytes), then read from
    it, at most limit + 1 bytes: what is read is what was checked (no stat-then-open race).
    A device, a pipe, a kernel file, a huge or sparse file: BadValue, one line naming the file."""
    import errno
    import os
    import stat

    article = "an" if what[:1] in "aeiou" else "a"
    a_what = f"{article} {what}"
    try:
        st = os.stat(path) if follow else os.lstat(path)  # not opened at all when plainly not a file
        if stat.S_ISLNK(st.st_mode):
            raise BadValue(f"{path}: a symbolic link; expected {a_what} itself (of {expected}), not a link")
        if not stat.S_ISREG(st.st_mode):
            raise BadValue(f"{path}: {file_kind(st.st_mode)}, not a regular file; expected {a_what} of {expected}")
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
        try:
            fd = os.open(path, flags)
        except OSError as e:
            if e.errno == errno.ELOOP and not follow:
                raise BadValue(f"{path}: a symbolic link; expected {a_what} itself (of {expected}), "
                               "not a link") from None
            raise
        try:
            st = os.fstat(fd)  # what was opened: the checks below hold for what is read
            if not stat.S_ISREG(st.st_mode):
                raise BadValue(f"{path}: {file_kind(st.st_mode)}, not a regular file; expected {a_what} "
                               f"of {expected}")
            fs = pseudo_fs(st.st_dev)
            if fs:
                raise BadValue(f"{path}: a kernel file ({fs}), not a regular file; expected {a_what} of {expected}")
            if st.st_size > limit:
                raise BadValue(f"{path}: {st.st_size} bytes, more than {a_what} has (at most {limit}); "
                               f"expected {expected}")
            chunks, size = [], 0
            while size <= limit:
                try:
                    chunk = os.read(fd, min(1 << 20, limit + 1 - size))
                except BlockingIOError:
                    raise BadValue(f"{path}: reading it would wait (not a plain file); expected {a_what} "
                                   f"of {expected}") from None
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
    except OSError as e:
        raise BadValue(f"{path}: cannot read {what}: {e.strerror or e}") from None
    data = b"".join(chunks)
    if len(data) > limit:
        raise BadValue(f"{path}: more than {limit} bytes; expected {expected}")
    return data
