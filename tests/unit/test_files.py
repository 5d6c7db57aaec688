"""Atomic files: whole or absent, with the usual permissions."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from envbuilder.files import atomic_writer, write_atomic


def test_write_atomic_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out" / "pylock.x.toml"
    first = write_atomic(target, "one\n")
    second = write_atomic(target, "two\n")
    assert target.read_text(encoding="utf-8") == "two\n"
    assert first != second and len(second) == 64
    assert [p.name for p in target.parent.iterdir()] == ["pylock.x.toml"]


def test_write_atomic_gives_the_file_the_usual_permissions_not_mkstemp_s(tmp_path: Path) -> None:
    mask = os.umask(0o027)
    try:
        write_atomic(tmp_path / "resolution.json", "{}\n")
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "resolution.json").stat().st_mode) == 0o640


def test_a_failure_inside_the_writer_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "wheel.whl"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_writer(target) as f:
        f.write(b"partial")
        raise RuntimeError("hash mismatch")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["wheel.whl"]
