"""An in-place build works in a directory of its own: fresh, private, never a path that
another user (or another build of the same key) could have made first."""

from __future__ import annotations

import stat
import tempfile
from pathlib import Path

import pytest

from envbuilder.sourcebuild import builder


def test_each_in_place_build_gets_a_fresh_private_directory_a_planted_link_cannot_redirect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    theirs = tmp_path / "someone-elses"
    theirs.mkdir()
    # what the fixed path $TMPDIR/envbuilder-build/<key16> could be made into beforehand
    (tmp_path / "envbuilder-build").symlink_to(theirs, target_is_directory=True)
    first, second = builder._in_place_work(), builder._in_place_work()
    try:
        assert first != second
        for work in (first, second):
            assert work.parent == tmp_path and not work.is_symlink()
            assert stat.S_IMODE(work.stat().st_mode) == 0o700
            assert list(work.iterdir()) == []
            assert work.resolve().parent == tmp_path.resolve()
        assert list(theirs.iterdir()) == []
    finally:
        first.rmdir()
        second.rmdir()
