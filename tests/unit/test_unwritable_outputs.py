"""``lock`` and ``publish`` into a read-only or full location: a clear error (exit 1), the old
outputs intact, nothing partial left behind.

The faults are injected where the operating system reports them (``os.open``, ``os.mkdir``,
``os.replace`` … answering EROFS; ``os.fsync`` answering ENOSPC, as a full disk does when the
data is flushed), so every layer above runs as it would on a real read-only or full disk; a
variant with a real read-only directory runs where the tests do not run as root.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from envbuilder.cli import main

DATA = Path(__file__).parents[1] / "data"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(DATA / "locks", tmp_path / "locks")
    shutil.copytree(DATA / "results", tmp_path / "results")
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def lock(out: str) -> int:
    return main(
        ["lock", "--resolution", "locks/resolution.json", "--results", "results", "-o", out]
    )


def publish(lockfile: str, out: str) -> int:
    return main(["publish", "--lock", lockfile, "-o", out])


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file below *root* (hidden ones too) with its bytes."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _fault(code: int, path: Any) -> OSError:
    return OSError(code, os.strerror(code), os.fsdecode(path))


def read_only(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    """Make every change below *root* fail as a read-only file system does."""
    root = root.resolve()

    def below(path: Any) -> bool:
        return Path(os.fsdecode(path)).resolve().is_relative_to(root)

    real_open = os.open

    def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and below(path):
            raise _fault(errno.EROFS, path)
        return real_open(path, flags, *args, **kwargs)

    def one_path(real: Callable[..., Any]) -> Callable[..., Any]:
        def refuse(path: Any, *args: Any, **kwargs: Any) -> Any:
            if below(path):
                raise _fault(errno.EROFS, path)
            return real(path, *args, **kwargs)

        return refuse

    def two_paths(real: Callable[..., Any]) -> Callable[..., Any]:
        def refuse(src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
            if below(src) or below(dst):
                raise _fault(errno.EROFS, dst)
            return real(src, dst, *args, **kwargs)

        return refuse

    monkeypatch.setattr(os, "open", open_)
    for name in ("mkdir", "unlink", "rmdir"):
        monkeypatch.setattr(os, name, one_path(getattr(os, name)))
    for name in ("replace", "rename"):
        monkeypatch.setattr(os, name, two_paths(getattr(os, name)))


def full_disk(monkeypatch: pytest.MonkeyPatch, *, after: int = 0) -> None:
    """Let *after* files be flushed, then report every later flush as a full disk."""
    real_fsync = os.fsync
    flushed = 0

    def fsync(fd: int) -> None:
        nonlocal flushed
        if flushed >= after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        flushed += 1
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)


FAULTS: list[tuple[str, str]] = [
    ("read-only", os.strerror(errno.EROFS)),
    ("full", os.strerror(errno.ENOSPC)),
]


def inject(fault: str, monkeypatch: pytest.MonkeyPatch, root: Path, *, after: int = 0) -> None:
    if fault == "read-only":
        read_only(monkeypatch, root)
    else:
        full_disk(monkeypatch, after=after)


@pytest.mark.parametrize("existing", [True, False], ids=["over-an-old-lockfile", "new"])
@pytest.mark.parametrize(("fault", "message"), FAULTS)
def test_lock_into_an_unwritable_location_is_a_clear_error(
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fault: str,
    message: str,
    existing: bool,
) -> None:
    out = workdir / "out"
    if existing:
        (out / "compat.lock.json").write_text("the old lockfile\n")
    before = snapshot(out)
    capsys.readouterr()
    inject(fault, monkeypatch, out)
    assert lock("out/compat.lock.json") == 1
    err = capsys.readouterr().err
    assert "envbuilder lock: error: cannot write out/compat.lock.json" in err
    assert message in err and "nothing was changed" in err
    assert snapshot(out) == before  # the old file intact, no temporary file left


@pytest.mark.parametrize("after", [0, 2], ids=["first-file", "after-two-files-of-the-set"])
@pytest.mark.parametrize("existing", [True, False], ids=["over-an-old-site", "new"])
@pytest.mark.parametrize(("fault", "message"), FAULTS)
def test_publish_into_an_unwritable_location_leaves_no_partial_site(
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fault: str,
    message: str,
    existing: bool,
    after: int,
) -> None:
    assert lock("compat.lock.json") == 0
    if existing:
        assert publish("compat.lock.json", "out/site") == 0
        assert (workdir / "out" / "site" / "index.html").is_file()
    before = snapshot(workdir / "out")
    capsys.readouterr()
    inject(fault, monkeypatch, workdir / "out", after=after)
    assert publish("compat.lock.json", "out/site") == 1
    err = capsys.readouterr().err
    assert "envbuilder publish: error: cannot write the site into out/site" in err
    assert message in err and "nothing was changed" in err
    assert snapshot(workdir / "out") == before  # the old site whole, no staging left
    assert sorted(p.name for p in (workdir / "out").iterdir()) == (["site"] if existing else [])


def test_publish_puts_the_old_site_back_when_the_swap_fails(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The new site is complete but cannot take the old one's place: the old one stays."""
    assert lock("compat.lock.json") == 0
    assert publish("compat.lock.json", "out/site") == 0
    before = snapshot(workdir / "out")
    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        source = Path(os.fsdecode(src)).name
        if source.startswith(".site.") and not source.endswith(".old"):
            raise _fault(errno.EXDEV, dst)  # the staging directory's rename fails
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    capsys.readouterr()
    assert publish("compat.lock.json", "out/site") == 1
    assert os.strerror(errno.EXDEV) in capsys.readouterr().err
    assert snapshot(workdir / "out") == before


@pytest.mark.skipif(
    os.geteuid() == 0, reason="root writes through a read-only mode; the EROFS rows cover it"
)
@pytest.mark.parametrize("command", ["lock", "publish"])
def test_a_real_read_only_directory(
    workdir: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    assert lock("compat.lock.json") == 0
    out = workdir / "out"
    out.chmod(0o555)
    try:
        rc = (
            lock("out/compat.lock.json")
            if command == "lock"
            else publish("compat.lock.json", "out/site")
        )
        assert rc == 1
        assert os.strerror(errno.EACCES) in capsys.readouterr().err
        assert list(out.iterdir()) == []
    finally:
        out.chmod(0o755)
