"""SageMaker's run options are one value of the launch model (issue 48): `dtrain sagemaker run`
and `dtrain launch --target sagemaker` both make them with engine.run_options(), whose defaults
(RUN_DEFAULTS, launch/sagemaker/defaults.py) are declared once; RunOptions has none of its own."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from dtrain.launch.sagemaker import engine as sm

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = [p for d in ("launch", "dtrain", "images") for p in (ROOT / d).rglob("*.py")]


def test_run_options_has_no_default_of_its_own_and_every_field_one_in_run_defaults():
    fields = {f.name: f for f in dataclasses.fields(sm.RunOptions)}
    with_default = [n for n, f in fields.items()
                    if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING]
    assert with_default == [], f"{with_default}: a default of RunOptions' own; declare it in RUN_DEFAULTS"
    assert set(fields) - {"image", "role_arn", "command"} == set(sm.RUN_DEFAULTS)


def test_run_options_is_made_in_one_place():
    made = [f"{p.relative_to(ROOT)}:{i}" for p in PRODUCT for i, line in enumerate(p.read_text().splitlines(), 1)
            if re.search(r"\bRunOptions\(", line)]
    assert made == [f"launch/sagemaker/engine.py:{_line_of('return RunOptions(')}"], made


def _line_of(text: str) -> int:
    lines = (ROOT / "launch" / "sagemaker" / "engine.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


@pytest.mark.parametrize("literal", [r'"ml\.m5\.2xlarge"', r"(max_runtime|MaxRuntime|max_run)\w*\W.*\b86400\b", r'"24h"'])
def test_sagemakers_defaults_are_written_once(literal):
    assert re.search(literal, '"max_runtime_s": 86400,') or "86400" not in literal  # the check bites
    """The default instance type, run-time limit and its spelling: in RUN_DEFAULTS (and
    DEFAULT_MAX_RUN, defaults.py) only; the flags' help, TrainingJob and ManifestSpec read them from there."""
    where = [f"{p.relative_to(ROOT)}:{i}" for p in PRODUCT for i, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(literal, line)]
    assert len(where) == 1 and where[0].startswith("launch/sagemaker/defaults.py:"), where


def test_what_was_not_given_is_the_default_and_none_download_is_no_download():
    opts = sm.run_options(image="r/i:1", role_arn="", command=["python", "t.py"], instances=None, spot=None,
                          volume_gb=None, max_runtime_s=None, retries=None)
    assert (opts.instances, opts.spot, opts.volume_gb, opts.max_runtime_s, opts.retries, opts.download) == (
        1, True, sm.RUN_DEFAULTS["volume_gb"], 86400, 0, Path("output"))
    assert sm.run_options(image="r/i:1", role_arn="", command=(), download=None).download is None
    a = sm.run_options(image="r/i:1", role_arn="", command=())
    b = sm.run_options(image="r/i:1", role_arn="", command=())
    assert a.inputs is not b.inputs  # no mapping shared between two runs
    with pytest.raises(TypeError, match="unknown field"):
        sm.run_options(image="r/i:1", role_arn="", command=(), spott=False)
