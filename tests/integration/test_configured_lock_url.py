"""``$ENVBUILDER_LOCK_URL``: a published lockfile, downloaded at most once a day and read
from the cache in between, its age said; an unreachable URL falls back to the cached copy."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from envbuilder.cli import main
from tests.integration.test_published_lock import VERIFIED, site

__all__ = ["site"]  # the fixture used here


@pytest.fixture
def configured(
    site: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    url = site[0] + "compat.lock.json"
    monkeypatch.setenv("ENVBUILDER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ENVBUILDER_LOCK_URL", url)
    monkeypatch.delenv("ENVBUILDER_LOCK", raising=False)
    monkeypatch.chdir(tmp_path)  # no compat.lock.json here
    yield url


def _query(capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    assert main(["query", "--python", "3.11", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["matches"][0]["id"] == VERIFIED
    said = [line for line in out.err.splitlines() if line.startswith("lockfile: ")]
    return out.out, "\n".join(said) + "\n"  # without the test server's request log


def test_the_configured_url_is_fetched_then_read_from_the_cache(
    configured: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, err = _query(capsys)
    assert err == f"lockfile: {configured} (downloaded now)\n"
    _, err = _query(capsys)
    assert err.startswith(f"lockfile: {configured} (downloaded 0 min ago; fetched again")
    # a day later it is fetched anew
    (cached,) = (tmp_path / "cache" / "published").glob("*/compat.lock.json")
    day_ago = time.time() - 25 * 3600
    os.utime(cached, (day_ago, day_ago))
    _, err = _query(capsys)
    assert err == f"lockfile: {configured} (downloaded now)\n"


def test_an_unreachable_url_falls_back_to_the_cached_copy_saying_so(
    configured: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _query(capsys)
    (cached,) = (tmp_path / "cache" / "published").glob("*/compat.lock.json")
    two_days = time.time() - 2 * 86400 - 60
    os.utime(cached, (two_days, two_days))
    # the same cache entry, its server gone: a closed port on loopback
    gone = configured.rsplit(":", 1)[0] + ":9/compat.lock.json"
    target = cached.parent.parent / hashlib.sha256(gone.encode()).hexdigest()[:24]
    cached.parent.rename(target)
    monkeypatch.setenv("ENVBUILDER_LOCK_URL", gone)
    _, err = _query(capsys)
    assert err.startswith(f"lockfile: {gone}, cached 2 days ago: ! it could not be fetched again")


@pytest.mark.parametrize("how", ["--lock", "$ENVBUILDER_LOCK_URL", "cached", "bad scheme"])
def test_a_password_in_the_lockfile_url_is_never_printed(
    configured: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    how: str,
) -> None:
    secret = configured.replace("http://", "http://reader:s3cret-pw@", 1)
    shown = configured.replace("http://", "http://reader:***@", 1)
    monkeypatch.setenv("ENVBUILDER_LOCK_URL", secret)
    argv = ["query", "--python", "3.11"]
    if how == "--lock":
        argv += ["--lock", secret]
    elif how == "cached":
        assert main(argv) == 0  # now it is read from the cache
    elif how == "bad scheme":
        argv += ["--lock", secret.replace("http://", "ftp://", 1)]
    capsys.readouterr()
    status = main(argv)
    out = capsys.readouterr()
    assert "s3cret-pw" not in out.out + out.err
    assert status == (2 if how == "bad scheme" else 0)
    if how != "bad scheme":
        assert f"lockfile: {shown} (downloaded " in out.err
