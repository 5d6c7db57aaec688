"""A release attaches every built wheel the lockfile's build records name.

A run that does not rebuild a source-build row still publishes that row's measured wheel:
`lock --release-wheels DIR --earlier-wheels DIR` copies it from the previous release's
assets, its sha256 checked against the lockfile's build record, and fails when a wheel
the lockfile names is found nowhere with those bytes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from envbuilder.sourcebuild.published import record_asset, wheel_asset
from tests.unit.test_source_build_lockfile import (
    BUILT,
    fake_wheel,
    lock,
    locked_with_wheel,
    workdir,
)

__all__ = ["workdir"]  # the fixture, shared with the source-build tests

WHEEL = b"the wheel that was built and measured"


@pytest.fixture
def earlier(workdir: Path) -> Path:
    """The previous release's assets: the measured wheel and its build record."""
    wheel = fake_wheel(workdir / "built", WHEEL)
    locked_with_wheel(workdir, wheel)
    assets = workdir / "earlier-release"
    assets.mkdir()
    (assets / wheel_asset(BUILT, wheel.name)).write_bytes(WHEEL)
    (assets / record_asset(BUILT)).write_text("{}\n")
    return assets


def asset() -> str:
    return wheel_asset(BUILT, "xformers-0.0.35-py39-none-linux_x86_64.whl")


def test_a_wheel_this_run_did_not_rebuild_is_carried_from_the_earlier_release(
    workdir: Path, earlier: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    release = workdir / "release"
    assert lock("--release-wheels", str(release), "--earlier-wheels", str(earlier)) == 0
    assert (release / asset()).read_bytes() == WHEEL
    assert (release / record_asset(BUILT)).is_file()
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"✓ release wheels in {release}: 0 built now, 1 carried from the earlier release "
        "(sha256 checked), 0 missing"
    )


def test_a_wheel_built_in_this_run_is_kept(
    workdir: Path, earlier: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    release = workdir / "release"
    release.mkdir()
    (release / asset()).write_bytes(WHEEL)
    (earlier / asset()).unlink()
    assert lock("--release-wheels", str(release), "--earlier-wheels", str(earlier)) == 0
    assert "1 built now, 0 carried" in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize(
    "earlier_bytes", [None, b"another build of the same xformers"], ids=["absent", "other-bytes"]
)
def test_a_named_wheel_found_nowhere_with_its_sha256_fails_the_release(
    workdir: Path,
    earlier: Path,
    capsys: pytest.CaptureFixture[str],
    earlier_bytes: bytes | None,
) -> None:
    if earlier_bytes is None:
        (earlier / asset()).unlink()
    else:
        (earlier / asset()).write_bytes(earlier_bytes)
    release = workdir / "release"
    assert lock("--release-wheels", str(release), "--earlier-wheels", str(earlier)) == 1
    err = capsys.readouterr().err
    assert f"✕ {asset()}: a build record in the lockfile names it" in err
    assert err.splitlines()[-1].endswith(
        "0 built now, 0 carried from the earlier release (sha256 checked), 1 missing"
    )
    assert not (release / asset()).exists()
