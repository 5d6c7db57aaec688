"""The cache of built wheels under concurrent writers, and what a build key may name."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from envbuilder.docpath import UnsafeName
from envbuilder.sourcebuild.cache import RECORD_SCHEMA, BuiltWheelCache

KEY = "ab" * 32
WHEEL = "demo-1.0-py3-none-any.whl"


def _record(payload: bytes) -> dict[str, object]:
    import hashlib

    digest = hashlib.sha256(payload).hexdigest()
    return {
        "schema": RECORD_SCHEMA,
        "key": KEY,
        "wheel": {"filename": WHEEL, "sha256": digest, "size": len(payload)},
    }


def _puts(root: str, worker: int, times: int) -> list[str]:
    """*times* puts of KEY, each with this worker's bytes; the errors they raised."""
    cache = BuiltWheelCache(Path(root))
    source = Path(root).parent / f"source-{worker}" / WHEEL
    source.parent.mkdir(parents=True, exist_ok=True)
    payload = f"built by worker {worker}".encode()
    source.write_bytes(payload)
    errors = []
    for _ in range(times):
        try:
            cache.put(KEY, source, _record(payload))
        except OSError as e:
            errors.append(repr(e))
    return errors


def test_puts_of_one_key_from_several_processes_never_fail_each_other(tmp_path: Path) -> None:
    root = tmp_path / "built"
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        results = pool.starmap(_puts, [(str(root), worker, 25) for worker in range(4)])
    assert [e for errors in results for e in errors] == []
    built = BuiltWheelCache(root).get(KEY)
    assert built is not None and built.path.read_bytes().startswith(b"built by worker ")
    assert sorted(p.name for p in root.iterdir()) == [KEY]  # nothing left aside


@pytest.mark.parametrize("key", ["../victim", "./././././../../victim", KEY.upper()])
def test_a_key_that_is_no_sha256_is_refused_before_the_cache_is_touched(
    tmp_path: Path, key: str
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    source = tmp_path / WHEEL
    source.write_bytes(b"x")
    cache = BuiltWheelCache(tmp_path / "a" / "cache")
    with pytest.raises(UnsafeName, match="where a sha256 in lowercase hex belongs"):
        cache.put(key, source, _record(b"x"))
    with pytest.raises(UnsafeName):
        cache.get(key)
    assert (victim / "keep.txt").read_text() == "mine"
    assert not (tmp_path / "a").exists()
