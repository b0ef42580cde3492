"""The base image's apt sources come from this machine's own apt files (the project names no
mirror): both file formats, disabled stanzas and other types skipped, a clear error without one."""

from __future__ import annotations

import pytest

from dtrain import engine

DEB822 = """Types: deb
# http://snapshot.example/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main contrib
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://src.example/debian
Suites: bookworm
Components: main

Types: deb
URIs: http://off.example/debian
Suites: bookworm
Components: main
Enabled: no

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""

ONE_LINE = """# a comment
deb [signed-by=/usr/share/keyrings/k.gpg arch=amd64] http://other.example/debian bookworm main # trailing
deb https://vendor.example/apt cloud-sdk-bookworm main
deb-src http://other.example/debian bookworm main
"""


def test_both_formats_are_read_and_only_enabled_deb_sources_count():
    found = engine.apt_sources({"/etc/apt/sources.list.d/debian.sources": DEB822, "/etc/apt/sources.list": ONE_LINE})
    assert ("http://mirror.example/debian", "bookworm", "main contrib") in found
    assert ("http://mirror.example/debian", "bookworm-updates", "main contrib") in found
    assert ("http://other.example/debian", "bookworm", "main") in found
    assert not any("off.example" in u or "src.example" in u for u, _, _ in found), found


def test_the_base_image_gets_the_suite_its_updates_and_security_from_the_machine():
    text = engine.base_sources(engine.apt_sources({"a.sources": DEB822}))
    assert text == ("deb http://mirror.example/debian bookworm main\n"
                    "deb http://mirror.example/debian bookworm-updates main\n"
                    "deb http://mirror.example/debian-security bookworm-security main\n")


def test_without_a_source_for_the_suite_the_error_names_apts_files():
    with pytest.raises(engine.EngineError, match=r"no apt source for Debian bookworm main in /etc/apt/sources.list"):
        engine.base_sources(engine.apt_sources({"x.list": "deb https://vendor.example/apt cloud-sdk-bookworm main\n"}))


def test_this_machine_has_one():
    assert engine.debian_mirror().startswith(("http://", "https://"))
