"""Atomic writes leave nothing behind, even after a writer was killed mid-write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from envbuilder.files import STALE_AFTER_S, sweep_stale_temporaries, write_atomic

#: Above Linux's largest pid (2**22): no process has it.
DEAD_PID = 2**22 + 12345


def left_behind(target: Path, middle: str, age_s: float) -> Path:
    """A temporary file of *target* as a killed writer leaves it, *age_s* old."""
    tmp = target.with_name(f".{target.name}.{middle}.tmp")
    tmp.write_bytes(b"half a file")
    past = tmp.stat().st_mtime - age_s
    os.utime(tmp, (past, past))
    return tmp


@pytest.mark.parametrize(
    ("middle", "age_s", "swept"),
    [
        (f"{DEAD_PID}-0123abcd", 120, True),  # its writer is gone
        (f"{DEAD_PID}-0123abcd", 5, False),  # too fresh to judge
        (f"{os.getpid()}-0123abcd", 120, False),  # its writer still runs (this process)
        (f"{os.getpid()}-0123abcd", STALE_AFTER_S + 60, True),  # nothing takes an hour
        ("0123456789abcdef0123456789abcdef", 120, False),  # the old name: no pid to ask
        ("0123456789abcdef0123456789abcdef", STALE_AFTER_S + 60, True),
    ],
    ids=[
        "writer-gone",
        "too-fresh",
        "writer-runs",
        "writer-runs-an-hour",
        "old-name",
        "old-name-old",
    ],
)
def test_a_killed_writers_temporary_is_swept_by_the_next_write(
    tmp_path: Path, middle: str, age_s: float, swept: bool
) -> None:
    target = tmp_path / "compat.lock.json"
    tmp = left_behind(target, middle, age_s)
    write_atomic(target, b"{}")
    assert tmp.exists() is not swept
    assert target.read_bytes() == b"{}"


def test_other_files_are_never_swept(tmp_path: Path) -> None:
    target = tmp_path / "a.json"
    keep = [
        left_behind(tmp_path / "b.json", f"{DEAD_PID}-00", 7200),  # another file's
        tmp_path / ".a.json.notes",  # not a temporary
        tmp_path / "a.json.tmp",
    ]
    for p in keep[1:]:
        p.write_text("x")
        os.utime(p, (0, 0))
    assert sweep_stale_temporaries(target) == []
    assert all(p.exists() for p in keep)


def test_a_write_leaves_only_its_file(tmp_path: Path) -> None:
    write_atomic(tmp_path / "x.txt", "text")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.txt"]
