"""What every task of tasks.py shares (moved out of tasks.py, issue 48: tasks.py is adapters): the
@task decorator (no auto short flags; every value one line of text, every local path checked by
its kind before the body runs: LOCAL_PATHS), user_errors (a known error: one line, exit 2, no
traceback) and the small flag parsers the tasks call."""

from __future__ import annotations

import sys
from contextlib import contextmanager

from invoke import task as _task


def task(*args, **kwargs):
    """Invoke's @task without auto short flags (they collide: --ssh-user became `--`), its body
    behind _checked. Flags take str defaults (or None): an int default would make Invoke convert
    the value itself, with a traceback for `--count two`."""
    kwargs.setdefault("auto_shortflags", False)
    if len(args) == 1 and callable(args[0]) and not kwargs.get("help"):
        return _task(auto_shortflags=False)(_checked(args[0]))
    make = _task(*args, **kwargs)
    return lambda body: make(_checked(body))


SECRET_PARAMS = {"password"}  # values never shown in a message

# Every path on this machine a flag names, by parameter (or (task, parameter) where tasks differ):
# checked by _checked before the body runs (dtrain/values.py local_path and its kin), so a FIFO,
# a device, a directory for a file is one line, never a hang. tests/test_cli_errors.py checks that
# every flag whose help names a file or directory is here or in NOT_LOCAL_PATHS.
LOCAL_PATHS = {
    "hostfile": ("file", "a hostfile"), "env_file": ("file", "an env file"), "f": ("file", "a job file"),
    "file": ("file", "a job file"), "ssh_key": ("ssh-key", ""), "ssh_config": ("ssh-config", ""),
    "ca_bundle": ("pem", "a CA bundle"), "pip_conf": ("ini", "a pip.conf"), "wheelhouse": ("dir", "wheels"),
    "project": ("project", ""), "lifecycle_policy": ("json", "an ECR lifecycle policy"),
    "catalog": ("new-file", "a catalog"), "soci_bin": ("dir", "soci, ctr, containerd"),
    "containerd_socket": ("socket", "containerd's"), "lazy_root": ("dir", "unpacked Debian packages"),
    ("manifest", "output"): ("new-file", "the manifest"), ("launch", "output"): ("new-file", "the job description"),
    ("launch", "workdir"): ("project", ""),
    ("report", "output"): ("new-file", "the report"),
    ("sagemaker", "workdir"): ("project", ""), ("sagemaker", "download"): ("new-dir", "the job's output"),
    ("sagemaker", "input"): ("channel", "an input channel's data"),  # NAME=DIR (or NAME=s3://...)
    ("sagemaker", "dependencies"): ("dirs", "a dependency"),  # DIR, repeatable
}
# Flags named like paths that are not on this machine: nodes', containers', S3's.
NOT_LOCAL_PATHS = {"mount", "checkpoint_dir", "path", "fill_from", ("sagemaker", "output"), "state_dir",
                   ("sagemaker", "project"),  # a name (build's --project is a directory)
                   "output_s3", "ami", ("build", "from_"), ("sagemaker", "task"),
                   "log",  # diagnose LOG: a file or a job name, checked by diagnose.log_path
                   ("cluster", "shared")}  # HOST_DIR:PATH, checked by cluster.parse_shared


def _local_path_flag(task_name: str, param: str, value) -> None:
    """A path flag's value checked by its kind (LOCAL_PATHS); other flags pass."""
    from dtrain import values

    if (task_name, param) in NOT_LOCAL_PATHS:
        return
    want, what = LOCAL_PATHS.get((task_name, param)) or LOCAL_PATHS.get(param) or (None, "")
    flag = _flag_name(param) if len(param) > 1 else "-" + param
    if want is None or value is None:
        return
    if want == "channel":  # NAME=DIR, each given: the directory is local unless s3://
        for item in value:
            where = item.partition("=")[2]
            if where and not where.startswith("s3://"):
                values.local_path(f"{flag} {values.shown(item)}:", where, "dir", what)
    elif want == "dirs":  # each given
        for item in value:
            values.local_path(flag, item, "dir", what)
    elif want == "ssh-key":
        values.ssh_key(flag, value)
    elif want == "ssh-config":
        values.ssh_config(flag, value)
    elif want == "json":
        values.json_file(flag, value, what)
    elif want == "pem":
        values.pem_file(flag, value, what)
    elif want == "ini":
        values.ini_file(flag, value, what)
    elif want == "new-file" and param == "catalog":  # read, then written
        if values.local_path(flag, value, want, what).exists():
            values.json_file(flag, value, what)
    else:
        values.local_path(flag, value, want, what)


def _flag_name(param: str) -> str:
    return "--" + param.rstrip("_").replace("_", "-")


def _checked(body):
    """Every str value a task gets (flags, repeated flags, positionals) is one line of printable
    text of at most values.MAX_TEXT characters, before the body runs; else a one-line error."""
    import functools
    import inspect

    names = list(inspect.signature(body).parameters)[1:]

    @functools.wraps(body)
    def run(c, *args, **kwargs):
        from dtrain import values

        with user_errors():
            for param, value in [*zip(names, args), *kwargs.items()]:
                for v in value if isinstance(value, (list, tuple)) else [value]:
                    if isinstance(v, str):
                        values.text(_flag_name(param) if param in kwargs else param, v,
                                    secret=param in SECRET_PARAMS)
            for param, value in kwargs.items():
                if param == "region" and value is not None:
                    values.region("--region", value)
                _local_path_flag(body.__name__.replace("_", "-"), param, value)
        try:
            return body(c, *args, **kwargs)
        except KeyboardInterrupt:  # what was under way said what it cleaned; no traceback
            print(f"interrupted: {body.__name__.replace('_', '-')} stopped (Ctrl-C)", file=sys.stderr)
            sys.exit(130)

    return run


@contextmanager
def user_errors():
    """Known errors print one readable message and exit non-zero, without a traceback."""
    from dtrain.images.build import BuildError
    from dtrain.images.push import PushError
    from dtrain.images.spec import SpecError
    from dtrain.launch.troubleshoot.diagnose import DiagnoseError
    from dtrain.reference import BadReference
    from dtrain.launch.errors import LaunchError
    from dtrain.launch.infra.cluster import ClusterError
    from dtrain.engine import EngineError
    from dtrain import contract

    from dtrain.values import BadValue

    try:
        yield
    except (SpecError, BuildError, PushError, LaunchError, ClusterError, DiagnoseError, BadReference,
            EngineError, BadValue) as e:
        from dtrain.terminal import clean

        print(f"error: {clean(str(e), lines=True)}", file=sys.stderr)  # it may quote a node's words
        sys.exit(contract.USER_ERROR_EXIT)
    except UnicodeDecodeError as e:
        print(f"error: a file given is not UTF-8 text ({_one_line(e)})", file=sys.stderr)
        sys.exit(contract.USER_ERROR_EXIT)
    except Exception as e:  # botocore's (boto3's own dependency): no credentials, no region, unknown profile
        if not type(e).__module__.startswith("botocore."):
            raise
        setup = "" if type(e).__name__ == "ClientError" else " (see `aws configure`, --profile, --region)"
        print(f"error: AWS: {_one_line(e)}{setup}", file=sys.stderr)  # a refusal is not a setup problem
        sys.exit(contract.USER_ERROR_EXIT)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


# ---------------------------------------------------------------- flag parsing (pure)


def _int_flag(name: str, value, lo: int, hi: int | None = None) -> int:
    """`--name VALUE` as a whole number in lo..hi, or a one-line error naming the flag."""
    from dtrain import values

    return values.count(name, value, lo, hi)


def _float_flag(name: str, value, lo: float = 0.0, *, or_equal: bool = False, hi: float | None = None) -> float:
    """`--name VALUE` as a finite number > lo (>= lo with or_equal, <= hi), or a one-line error."""
    from dtrain import values

    return values.number(name, value, lo, or_equal=or_equal, hi=hi)


def _choice_flag(name: str, value: str, choices: tuple[str, ...]) -> str:
    from dtrain import values

    return values.choice(name, value, choices)


def _launcher_names(**having: bool) -> tuple[str, ...]:
    from dtrain.launch.jobs import launchers

    return launchers.names(**having)


def _image_flag(value: str | None, name: str = "--image") -> str | None:
    """An image reference checked against Docker's grammar before anything runs."""
    from dtrain import values

    return values.image(name, value) if value is not None else None


def _family_flag(value: str | None, name: str = "--image", *, tag_ok: bool = False) -> str | None:
    """An image family (images/*.yaml); with tag_ok NAME:TAG (any local image name, e.g. a
    project image's) or a family. A one-line error naming the flag."""
    from dtrain import values
    from dtrain.images.spec import FAMILIES
    from dtrain.reference import check_name_tag

    if value is None:
        return None
    family, colon, tag = value.partition(":") if tag_ok else (value, "", "")
    if colon:
        check_name_tag(value, name, "pytorch-ddp:2.13.0-cpu-py311-debian12")
    elif family not in FAMILIES:
        raise values.BadValue(f"{name}: unknown image family {values.shown(value)}; known: {', '.join(FAMILIES)}")
    return value


def _env_flags(env, env_file=None) -> dict[str, str]:
    """--env-file's pairs, then --env NAME=VALUE's (later ones win)."""
    from dtrain import values
    from dtrain.launch.jobs import container

    if env_file:
        values.local_path("--env-file", env_file, "file", "an env file")
    return {**(container.parse_env_file(env_file) if env_file else {}), **values.env_pairs("--env", env)}
