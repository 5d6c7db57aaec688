"""Writing files safely: every file envbuilder writes goes through `atomic_writer`.

Readers see the old file or the new one, never a part; a failure leaves
nothing behind; the file gets the usual permissions (0666 less the umask,
0644 under the common one), not the 0600 of ``mkstemp``.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_writer", "sha256_file", "sweep_stale_temporaries", "write_atomic"]


def sha256_file(path: Path) -> str:
    """The sha256 of a file's bytes, read in blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextmanager
def atomic_writer(path: Path) -> Iterator[BinaryIO]:
    """A binary file that becomes ``path`` when the block ends without an exception.

    It is written as a temporary file in the same directory and renamed into
    place; an exception in the block (a failed hash check, say) deletes it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_temporaries(path)
    # Not mkstemp: its 0600 would stick to the file; os.open applies the umask as usual.
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


#: A temporary file whose writer left no live process id is removed once it is this old: a
#: writer on another machine (a shared cache) cannot be asked, and none takes an hour.
STALE_AFTER_S = 3600.0


def _writer_is_gone(pid_part: str) -> bool:
    """Whether the process that named a temporary file by its pid no longer exists here."""
    if not pid_part.isdigit():
        return False
    try:
        os.kill(int(pid_part), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return False


def sweep_stale_temporaries(path: Path, *, now: float | None = None) -> list[Path]:
    """Remove the temporary files that earlier writers of ``path`` left behind when killed
    (SIGKILL, a power cut): those whose process is gone and which are a minute old, and any
    older than `STALE_AFTER_S`. Returns what was removed; a file that cannot be looked at
    is left alone."""
    now = time.time() if now is None else now
    prefix = f".{path.name}."
    removed: list[Path] = []
    try:
        candidates = [p for p in path.parent.iterdir() if p.name.startswith(prefix)]
    except OSError:
        return removed
    for tmp in candidates:
        middle = tmp.name[len(prefix) :]
        if not middle.endswith(".tmp"):
            continue
        pid_part = middle[: -len(".tmp")].partition("-")[0]
        try:
            age = now - tmp.lstat().st_mtime
        except OSError:
            continue
        if (age > 60 and _writer_is_gone(pid_part)) or age > STALE_AFTER_S:
            try:
                tmp.unlink()
            except OSError:
                continue
            removed.append(tmp)
    return removed


def write_atomic(path: Path, data: bytes | str) -> str:
    """Write ``data`` to ``path`` through `atomic_writer`. An unchanged file is left as
    it is (its mtime too). Returns the sha256 of the bytes."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    digest = hashlib.sha256(raw).hexdigest()
    try:
        if path.read_bytes() == raw:
            return digest
    except OSError:
        pass
    with atomic_writer(path) as f:
        f.write(raw)
    return digest
