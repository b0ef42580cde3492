"""What the targets off the nodes share: the launch's env, the flag a field is."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dtrain import values


def flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def given(cfg: Mapping[str, Any], key: str) -> bool:
    return cfg.get(key) not in (None, [], (), False)


def env(cfg: Mapping[str, Any]) -> dict[str, str]:
    """--env-file's pairs, then --env's (later ones win)."""
    from dtrain.launch.jobs import container

    if cfg["env_file"]:
        values.local_path("--env-file", cfg["env_file"], "file", "an env file")
    return {**(container.parse_env_file(cfg["env_file"]) if cfg["env_file"] else {}),
            **values.env_pairs("--env", cfg["env"])}
