"""doctor's file check: installed files against RECORD, hashed once, remembered by stat."""

from __future__ import annotations

import base64
import hashlib
import os
from importlib import metadata
from pathlib import Path

import pytest

from envbuilder.consumer.record_check import (
    ExpectedFile,
    RecordCheck,
    check_files,
    expected_files,
    stamp_path,
)

FILES = {"pkg/__init__.py": b"x = 1\n", "pkg/data.bin": bytes(range(256)) * 64, "pkg/b.py": b""}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A site-packages with one installed distribution and its RECORD."""
    root = tmp_path / "site"
    info = root / "pkg-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n")
    lines = []
    for name, data in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
        lines.append(f"{name},sha256={_b64(data)},{len(data)}")
    lines += ["pkg-1.0.dist-info/METADATA,,", "pkg-1.0.dist-info/RECORD,,"]
    (info / "RECORD").write_text("\n".join(lines) + "\n")
    return root


def files(site: Path) -> list[ExpectedFile]:
    return expected_files([metadata.PathDistribution(site / "pkg-1.0.dist-info")])


def check(site: Path, **kwargs: bool) -> RecordCheck:
    return check_files(files(site), stamp=stamp_path(site), **kwargs)


def test_expected_files_are_the_hashed_record_entries(site: Path) -> None:
    found = {f.record_name: f.sha256_b64 for f in files(site)}
    assert found == {name: _b64(data) for name, data in FILES.items()}


def test_second_run_hashes_nothing_and_agrees(site: Path) -> None:
    first = check(site)
    assert (first.checked, first.hashed, first.reused, first.problems) == (3, 3, 0, ())
    assert stamp_path(site).is_file() and first.note == ""
    second = check(site)
    assert (second.checked, second.hashed, second.reused, second.problems) == (3, 0, 3, ())


def _rewrite(path: Path, data: bytes, *, keep_stat: bool) -> None:
    st = path.stat()
    path.write_bytes(data)
    if keep_stat:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize(
    ("change", "rehash", "problems", "hashed"),
    [
        # a file edited after the stamp was written: its mtime moved, so it is hashed again
        ("edit", False, ("pkg: pkg/__init__.py modified",), 1),
        # same size and mtime restored by hand: the stamp vouches for it (documented limit) …
        ("edit-keep-stat", False, (), 0),
        # … and --rehash trusts nothing
        ("edit-keep-stat", True, ("pkg: pkg/__init__.py modified",), 3),
        ("delete", False, ("pkg: pkg/__init__.py missing",), 0),
        ("none", True, (), 3),
    ],
)
def test_changes_after_a_verified_run(
    site: Path, change: str, rehash: bool, problems: tuple[str, ...], hashed: int
) -> None:
    check(site)
    target = site / "pkg/__init__.py"
    if change == "edit":
        _rewrite(target, b"x = 2\n", keep_stat=False)
        os.utime(target, ns=(0, target.stat().st_mtime_ns + 1_000_000))
    elif change == "edit-keep-stat":
        _rewrite(target, b"x = 2\n", keep_stat=True)
    elif change == "delete":
        target.unlink()
    result = check(site, rehash=rehash)
    assert (result.problems, result.hashed) == (problems, hashed)


def test_a_reinstalled_file_with_another_record_hash_is_hashed_again(site: Path) -> None:
    check(site)
    changed = [
        ExpectedFile(dist=f.dist, record_name=f.record_name, path=f.path, sha256_b64=_b64(b"other"))
        if f.record_name == "pkg/b.py"
        else f
        for f in files(site)
    ]
    result = check_files(changed, stamp=stamp_path(site))
    assert (result.hashed, result.problems) == (1, ("pkg: pkg/b.py modified",))


@pytest.mark.parametrize(
    "stamp_bytes",
    [b"[" * 100_000, b"{}", b'{"schema": "envbuilder.doctor-stamp/1", "files": {"a": 1}}', b"\xff"],
)
def test_a_damaged_stamp_is_ignored_with_a_note(site: Path, stamp_bytes: bytes) -> None:
    stamp_path(site).write_bytes(stamp_bytes)
    result = check(site)
    assert (result.hashed, result.problems) == (3, ())
    assert "ignored" in result.note
    assert check(site).hashed == 0  # and it was replaced by a good one


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_an_unwritable_environment_is_checked_and_says_why_nothing_was_remembered(
    site: Path,
) -> None:
    site.chmod(0o555)
    try:
        result = check(site)
    finally:
        site.chmod(0o755)
    assert result.problems == () and result.hashed == 3
    assert "not written" in result.note


def test_an_unwritable_stamp_location_is_reported(site: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = check_files(files(site), stamp=blocker / "stamp.json")
    assert result.problems == () and result.hashed == 3
    assert "not written" in result.note


@pytest.mark.parametrize("kind", ["/dev/zero", "fifo", "directory"])
def test_a_record_line_naming_no_regular_file_is_reported_not_read(
    site: Path, tmp_path: Path, kind: str
) -> None:
    """A RECORD line may name any path (``../../../dev/zero``): only regular files are hashed,
    so a device that never ends or a FIFO nobody writes cannot stall doctor."""
    if kind == "/dev/zero":
        target = Path("/dev/zero")
    elif kind == "fifo":
        target = tmp_path / "fifo"
        os.mkfifo(target)
    else:
        target = tmp_path / "dir"
        target.mkdir()
    record = site / "pkg-1.0.dist-info" / "RECORD"
    relative = os.path.relpath(target, site)
    record.write_text(record.read_text() + f"{relative},sha256={_b64(b'')},0\n")
    result = check(site)
    assert result.problems == (f"pkg: {relative} not a regular file",)
    assert result.checked == 3
