"""Settings: every ENVBUILDER_* variable is read once, into one frozen record."""

from __future__ import annotations

from pathlib import Path

import pytest

from envbuilder.lockfile.read import default_lockfile
from envbuilder.settings import Settings


@pytest.mark.parametrize(
    ("environ", "field", "value"),
    [
        ({}, "debug", False),
        ({"ENVBUILDER_DEBUG": "0"}, "debug", False),
        ({"ENVBUILDER_DEBUG": "1"}, "debug", True),
        ({"ENVBUILDER_CACHE_DIR": "/c"}, "cache_dir", Path("/c")),
        ({"ENVBUILDER_WHEEL_CACHE": "/w"}, "wheel_cache", Path("/w")),
        ({}, "lockfile", None),
        ({"ENVBUILDER_LOCK": "x/compat.lock.json"}, "lockfile", Path("x/compat.lock.json")),
        ({}, "revision", None),
        ({"GITHUB_SHA": "abc"}, "revision", "abc"),
        ({"GITHUB_SHA": "abc", "ENVBUILDER_SOURCE_REVISION": "def"}, "revision", "def"),
    ],
)
def test_the_environment_configures(environ: dict[str, str], field: str, value: object) -> None:
    assert getattr(Settings.from_environment(environ), field) == value


def test_the_debug_flag_wins_over_the_environment() -> None:
    assert Settings.from_environment({"ENVBUILDER_DEBUG": "0"}, debug=True).debug


def test_the_caches_default_to_the_user_cache_directory() -> None:
    settings = Settings.from_environment({})
    assert settings.wheel_cache == settings.cache_dir / "wheels"


@pytest.mark.parametrize(
    ("environ", "wheel_cache"),
    [
        ({"ENVBUILDER_CACHE_DIR": "/c"}, Path("/c/wheels")),  # the wheels move with the cache
        ({"ENVBUILDER_CACHE_DIR": "/c", "ENVBUILDER_WHEEL_CACHE": "/w"}, Path("/w")),
    ],
)
def test_the_wheel_cache_lies_in_the_cache_directory_unless_named(
    environ: dict[str, str], wheel_cache: Path
) -> None:
    assert Settings.from_environment(environ).wheel_cache == wheel_cache


@pytest.mark.parametrize(
    ("environ", "lockfile"),
    [({}, Path("compat.lock.json")), ({"ENVBUILDER_LOCK": "/l.json"}, Path("/l.json"))],
)
def test_the_default_lockfile(environ: dict[str, str], lockfile: Path) -> None:
    assert default_lockfile(Settings.from_environment(environ)) == lockfile


def test_the_index_comes_from_pip_s_configuration(tmp_path: Path) -> None:
    config = tmp_path / "pip.conf"
    config.write_text("[global]\nindex-url = http://127.0.0.1:1/simple\n", encoding="utf-8")
    settings = Settings.from_environment({"PIP_CONFIG_FILE": str(config)})
    assert settings.index_url == "http://127.0.0.1:1/simple"
