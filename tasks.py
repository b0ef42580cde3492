"""dtrain tasks: `dtrain --list`. Each task is declared beside its body in launch/cli/ (one module
per area: its flags, help and the calls it makes); Invoke collects the tasks named here."""

from __future__ import annotations

import sys

from dtrain.launch.cli_support import (  # noqa: F401  the tasks' shared plumbing (tests read LOCAL_PATHS here)
    task, SECRET_PARAMS, LOCAL_PATHS, NOT_LOCAL_PATHS, user_errors, _one_line, _int_flag,
    _float_flag, _choice_flag, _launcher_names, _image_flag, _family_flag, _env_flags, _flag_name)
from dtrain.launch.cli.images import render, build, push  # noqa: F401
from dtrain.launch.cli.jobs import launch, pull, status, report, logs, stop, nodes_ssh, exec_  # noqa: F401
from dtrain.launch.cli.nodes import nodes, instance_types, volume, cluster, demo  # noqa: F401
from dtrain.launch.cli.checks import doctor, bench_network, diagnose  # noqa: F401
from dtrain.launch.cli.sagemaker import sagemaker  # noqa: F401
from dtrain.launch.cli.manifest import manifest  # noqa: F401
from dtrain.launch.cli.jobs import LAUNCH_HELP, LAUNCH_TASK_ONLY_HELP, NODE_HELP, _nodes, _ssh_opts  # noqa: F401  (tests)


@task(help={"k": "only tests matching this pytest -k expression",
            "unit": "only the tests that need neither Docker nor the simulated cluster",
            "serial": "every test in one process, one after another (slower: the unit tests no longer run beside "
                      "the cluster tests)"})
def test(c, k=None, unit=False, serial=False):
    """Run the tests; installs and starts what they need (root, Linux).

    Debian packages, the Docker engine, the debootstrapped base image. The unit tests run beside
    the cluster tests, at a lower priority (dtrain/suite.py); the slowest of each are listed."""
    from dtrain import ROOT, suite

    if not unit:
        from dtrain import engine

        with user_errors():
            engine.ensure_all()
    sys.exit(suite.run(k, unit, serial, cwd=ROOT))  # dtrain's own tests, from any directory
