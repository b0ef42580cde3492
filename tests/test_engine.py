"""Real (unmocked) check of host setup: packages, dockerd, base image."""

import subprocess

import pytest

from dtrain import engine

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def base_image() -> str:
    engine.ensure_all()
    return engine.BASE_IMAGE


def test_docker_cli_has_buildkit() -> None:
    out = subprocess.run([engine.docker_cli(), "version", "-f", "{{.Client.Version}}"],
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith("20.10"), out


def test_packages_present(base_image: str) -> None:
    assert engine.missing_packages() == []


def test_engine_running(base_image: str) -> None:
    assert engine.docker_ok()
    engine.ensure_dockerd()  # idempotent: second call is a no-op


def test_base_image_runs(base_image: str) -> None:
    assert engine.image_exists(base_image)
    assert engine.base_tarball().exists()  # cached for later runs
    out = subprocess.run([engine.docker_cli(), "run", "--rm", base_image,
                          "cat", "/etc/debian_version"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip().startswith("12."), out
