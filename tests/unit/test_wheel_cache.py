"""The host wheel cache: content-addressed, verified on the way in, never half-written."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from envbuilder.docker import cache as cache_module
from envbuilder.docker.cache import WheelCache
from envbuilder.docker.plan import LockedWheel
from envbuilder.errors import IndexError_, InputError

CONTENT = b"not really a wheel, but bytes with a known hash" * 1000
SHA = hashlib.sha256(CONTENT).hexdigest()


def locked(url: str, *, sha256: str = SHA, size: int | None = len(CONTENT)) -> LockedWheel:
    return LockedWheel(
        name="demo",
        version="1.0",
        filename="demo-1.0-py3-none-any.whl",
        url=url,
        sha256=sha256,
        size=size,
    )


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "src" / "demo-1.0-py3-none-any.whl"
    path.parent.mkdir()
    path.write_bytes(CONTENT)
    return path


def test_a_file_url_is_copied_under_its_hash(tmp_path: Path, source: Path) -> None:
    cache = WheelCache(tmp_path / "cache")
    path = cache.fetch(locked(source.as_uri()))
    assert path == tmp_path / "cache" / "sha256" / SHA[:2] / SHA
    assert path.read_bytes() == CONTENT
    source.unlink()  # a second fetch is served from the cache
    assert cache.fetch(locked(source.as_uri())) == path


def test_the_context_gets_the_wheel_under_its_own_name(tmp_path: Path, source: Path) -> None:
    cache = WheelCache(tmp_path / "cache")
    context = tmp_path / "context"
    context.mkdir()
    linked = cache.link_into(locked(source.as_uri()), context)
    assert linked == context / "demo-1.0-py3-none-any.whl"
    assert linked.read_bytes() == CONTENT


@pytest.mark.parametrize(
    ("sha256", "size", "problem"),
    [
        ("0" * 64, len(CONTENT), "does not match the lock's '" + "0" * 64 + "'"),
        (SHA, len(CONTENT) - 1, f"more than the lock's {len(CONTENT) - 1} bytes"),
        (SHA, len(CONTENT) + 1, f"{len(CONTENT)} bytes from"),
    ],
)
def test_bytes_that_do_not_match_the_lock_never_enter_the_cache(
    tmp_path: Path, source: Path, sha256: str, size: int, problem: str
) -> None:
    cache = WheelCache(tmp_path / "cache")
    with pytest.raises(IndexError_) as raised:
        cache.fetch(locked(source.as_uri(), sha256=sha256, size=size))
    assert problem in str(raised.value)
    assert "demo-1.0-py3-none-any.whl" in str(raised.value)
    leftovers = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert leftovers == []


@pytest.mark.parametrize(
    ("url", "error", "problem"),
    [
        ("file:///nonexistent/demo-1.0-py3-none-any.whl", InputError, "cannot read '/nonexistent/demo-1.0-py3-none-any.whl'"),
        ("ftp://host/demo-1.0-py3-none-any.whl", InputError, "unsupported URL 'ftp://host/demo-1.0-py3-none-any.whl'"),
    ],
)  # fmt: skip
def test_an_unreadable_source_is_reported(
    tmp_path: Path, url: str, error: type[Exception], problem: str
) -> None:
    with pytest.raises(error, match=problem):
        WheelCache(tmp_path / "cache").fetch(locked(url))


def test_same_size_altered_bytes_are_fetched_again_before_linking(
    tmp_path: Path, source: Path
) -> None:
    cache = WheelCache(tmp_path / "cache")
    wheel = locked(source.as_uri())
    cached = cache.fetch(wheel)
    tampered = bytes([CONTENT[0] ^ 1]) + CONTENT[1:]  # one bit, same size
    cached.write_bytes(tampered)
    context = tmp_path / "context"
    context.mkdir()
    assert cache.link_into(wheel, context).read_bytes() == CONTENT
    assert cached.read_bytes() == CONTENT


def test_altered_bytes_with_no_source_left_are_refused(tmp_path: Path, source: Path) -> None:
    cache = WheelCache(tmp_path / "cache")
    wheel = locked(source.as_uri())
    cache.fetch(wheel).write_bytes(b"x" * len(CONTENT))
    source.unlink()
    with pytest.raises(InputError, match="cannot read"):
        cache.fetch(wheel)
    assert not cache.path_for(SHA).exists()  # the altered file is gone, not handed out


def test_an_unchanged_file_is_hashed_once(
    tmp_path: Path, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = WheelCache(tmp_path / "cache")
    wheel = locked(source.as_uri())
    cache.fetch(wheel)
    fresh = WheelCache(tmp_path / "cache")  # the stamp is on disk, not in this object
    hashed: list[Path] = []
    real = cache_module._sha256_of

    def counted(path: Path) -> str:
        hashed.append(path)
        return real(path)

    monkeypatch.setattr(cache_module, "_sha256_of", counted)
    for _ in range(3):
        fresh.fetch(wheel)
    assert hashed == []
