"""``build-wheel --assets DIR``: the wheel and its build record under their published names,
and where ``install`` looks for them: beside the lockfile URL that was read."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from envbuilder.consumer.published_wheel import lockfile_url
from envbuilder.settings import Settings
from envbuilder.sourcebuild.cache import BuiltWheelCache
from envbuilder.sourcebuild.published import record_asset, wheel_asset, write_assets

ID = "py3.12-cu130-torch2.11.0-xformers0.0.35"
WHEEL = "xformers-0.0.35-py39-none-linux_x86_64.whl"

#: a build key as the cache takes one: a sha256 in lowercase hex
KEY = "e608dfda6e02" + "0" * 52


def test_the_assets_are_the_cached_wheel_and_its_record_under_unique_names(tmp_path: Path) -> None:
    made = tmp_path / WHEEL
    made.write_bytes(b"built")
    sha = hashlib.sha256(b"built").hexdigest()
    record = {"key": KEY, "combination": ID, "wheel": {"filename": WHEEL, "sha256": sha}}
    built = BuiltWheelCache(tmp_path / "cache").put(KEY, made, record)
    wheel, kept = write_assets(built, ID, tmp_path / "assets")
    assert (wheel.name, kept.name) == (f"{ID}.{WHEEL}", f"build-record.{ID}.json")
    assert (wheel.name, kept.name) == (wheel_asset(ID, WHEEL), record_asset(ID))
    assert wheel.read_bytes() == b"built"
    assert json.loads(kept.read_text()) == record
    # two source builds of one xformers release: one wheel name, two asset names
    other = "py3.12-cu129-torch2.11.0-xformers0.0.35"
    assert wheel_asset(other, WHEEL) != wheel_asset(ID, WHEEL)


@pytest.mark.parametrize(
    ("lock", "environment", "url"),
    [
        ("https://example.invalid/r/compat.lock.json", {}, "https://example.invalid/r/compat.lock.json"),
        ("compat.lock.json", {"ENVBUILDER_LOCK_URL": "https://e.invalid/c.json"}, None),  # a file
        (None, {"ENVBUILDER_LOCK_URL": "https://e.invalid/c.json"}, "https://e.invalid/c.json"),
        # a configured local lockfile wins over the URL, as it does when the lockfile is read
        (None, {"ENVBUILDER_LOCK_URL": "https://e.invalid/c.json", "ENVBUILDER_LOCK": "c.json"}, None),
        (None, {}, None),  # the carried snapshot or ./compat.lock.json: nothing published beside
    ],
)  # fmt: skip
def test_the_published_wheel_is_looked_for_beside_the_lockfile_url_that_was_read(
    lock: str | None, environment: dict[str, str], url: str | None
) -> None:
    assert lockfile_url(lock, Settings.from_environment(environment)) == url
