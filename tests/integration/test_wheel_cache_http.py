"""The wheel cache downloads over HTTP from a loopback index and checks while streaming."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from envbuilder.docker.cache import WheelCache
from envbuilder.docker.plan import LockedWheel
from envbuilder.errors import IndexError_
from envbuilder.index.http import HttpClient
from tests.support.index_server import IndexServer
from tests.support.wheels import BuiltWheel, build_wheel


@pytest.fixture
def served(tmp_path: Path) -> tuple[IndexServer, BuiltWheel]:
    wheel = build_wheel(tmp_path / "wheels", "demo", "1.0", padding=3 * 2**20)
    server = IndexServer()
    server.add_index("simple", {"demo": [wheel]})
    return server, wheel


def locked(server: IndexServer, wheel: BuiltWheel, sha256: str | None = None) -> LockedWheel:
    return LockedWheel(
        name=wheel.name,
        version=wheel.version,
        filename=wheel.filename,
        url=server.file_url("simple", wheel.filename),
        sha256=sha256 or wheel.sha256,
        size=wheel.size,
    )


def test_a_download_lands_under_its_hash_once(
    tmp_path: Path, served: tuple[IndexServer, BuiltWheel]
) -> None:
    server, wheel = served
    cache = WheelCache(tmp_path / "cache")
    with server:
        first = cache.fetch(locked(server, wheel))
        requests_made = server.stats.requests
        second = cache.fetch(locked(server, wheel))
        assert server.stats.requests == requests_made  # served from the cache
    assert first == second == tmp_path / "cache" / "sha256" / wheel.sha256[:2] / wheel.sha256
    assert first.read_bytes() == wheel.path.read_bytes()


def _cache(root: Path, *, offline: bool = False) -> WheelCache:
    return WheelCache(root, client=HttpClient(backoff_factor=0, retries=2, offline=offline))


@pytest.mark.parametrize(
    ("failures", "status", "problem"),
    [
        (1, 404, "HTTP 404 (not found)"),
        (3, 503, "HTTP 503 Service Unavailable (after retries: 3 attempt(s)"),
    ],
)
def test_an_http_failure_leaves_nothing_behind(
    tmp_path: Path,
    served: tuple[IndexServer, BuiltWheel],
    failures: int,
    status: int,
    problem: str,
) -> None:
    server, wheel = served
    cache = _cache(tmp_path / "cache")
    with server:
        server.fail_next(failures, status=status)
        with pytest.raises(IndexError_, match=re.escape(problem)) as raised:
            cache.fetch(locked(server, wheel))
    assert wheel.filename in str(raised.value)
    assert [p for p in (tmp_path / "cache").rglob("*") if p.is_file()] == []


def test_a_passing_failure_is_retried(
    tmp_path: Path, served: tuple[IndexServer, BuiltWheel]
) -> None:
    server, wheel = served
    with server:
        server.fail_next(1, status=503)
        path = _cache(tmp_path / "cache").fetch(locked(server, wheel))
    assert path.read_bytes() == wheel.path.read_bytes()


def test_offline_a_missing_wheel_is_refused_without_a_request(
    tmp_path: Path, served: tuple[IndexServer, BuiltWheel]
) -> None:
    server, wheel = served
    with server:
        with pytest.raises(IndexError_, match="offline"):
            _cache(tmp_path / "cache", offline=True).fetch(locked(server, wheel))
        assert server.stats.requests == 0


def test_a_cached_wheel_gets_the_usual_permissions(
    tmp_path: Path, served: tuple[IndexServer, BuiltWheel]
) -> None:
    server, wheel = served
    mask = os.umask(0o022)
    try:
        with server:
            path = _cache(tmp_path / "cache").fetch(locked(server, wheel))
    finally:
        os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_a_download_with_the_wrong_hash_is_deleted(
    tmp_path: Path, served: tuple[IndexServer, BuiltWheel]
) -> None:
    server, wheel = served
    cache = WheelCache(tmp_path / "cache")
    with server, pytest.raises(IndexError_, match="does not match the lock's"):
        cache.fetch(locked(server, wheel, sha256="f" * 64))
    assert [p for p in (tmp_path / "cache").rglob("*") if p.is_file()] == []
