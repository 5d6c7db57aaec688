"""Writing files safely: every file envbuilder writes goes through `atomic_writer`.

Readers see the old file or the new one, never a part; a failure leaves
nothing behind; the file gets the usual permissions (0666 less the umask,
0644 under the common one), not the 0600 of ``mkstemp``.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_writer", "sha256_file", "write_atomic"]


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
    # Not mkstemp: its 0600 would stick to the file; os.open applies the umask as usual.
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
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
