"""Writing outputs safely: every file envbuilder generates goes through `write_atomic`."""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

__all__ = ["sha256_file", "write_atomic"]


def sha256_file(path: Path) -> str:
    """The sha256 of a file's bytes, read in blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_atomic(path: Path, data: bytes | str) -> str:
    """Write through a temporary file in the same directory and rename it into place:
    readers see the old file or the new one, never a part, and a failure leaves
    nothing behind. An unchanged file is left as it is (its mtime too). Returns the
    sha256 of the bytes."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    digest = hashlib.sha256(raw).hexdigest()
    try:
        if path.read_bytes() == raw:
            return digest
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    # Not mkstemp: its 0600 would stick to the file; os.open applies the umask as usual.
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return digest
