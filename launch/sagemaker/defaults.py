"""SageMaker's run defaults, each declared once, in a module of their own: `dtrain sagemaker
run`'s flags and help (launch/cli/sagemaker.py, read at every `dtrain` start), ManifestSpec and
the engine's TrainingJob and run_options() (engine.py) read them without loading the engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dtrain.launch.jobs.jobfile import launch_default

DEFAULT_PROJECT = "dtrain"  # --project: a task is (project, task); the default output's prefix

# SageMaker's defaults, each declared once: `dtrain sagemaker run`'s flags and `dtrain launch
# --target sagemaker` (launch/targets/sagemaker.py) both build their RunOptions with run_options()
RUN_DEFAULTS: dict[str, Any] = {
    "instances": 1, "instance_type": "ml.m5.2xlarge", "name": None, "launcher": None, "slots": None,
    "inputs": {}, "env": {}, "spot": True, "output_s3": None, "workdir": Path("."), "download": Path("output"),
    "wait": True, "volume_gb": launch_default("volume_size"), "max_runtime_s": 86400, "max_wait_s": None,
    "retries": 0, "task": None, "state_s3": None, "from_jobs": {}, "metrics": (), "project": DEFAULT_PROJECT,
    "force": False, "input_tasks": {}, "dependencies": {}, "tags": {}, "create_role": False, "task_state": False,
}
DEFAULT_MAX_RUN = "24h"  # --max-run's default, as written (RUN_DEFAULTS' max_runtime_s)
