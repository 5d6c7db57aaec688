"""The content-addressed store: what callers derive from an index's files, kept.

Range responses (206) are never cached by CacheControl, and whole files
(wheels, sdists) are too big to keep; what a caller derives from them (a
wheel's ``METADATA`` or one member, what an sdist declares) is stored here
under a key of its choosing, by the file's sha256 where known - files on an
index are immutable. Each entry keeps the sha256 of its bytes beside them, so
a damaged entry is read as a miss; entries are written atomically.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from envbuilder.files import atomic_writer

__all__ = ["BlobStore"]

logger = logging.getLogger(__name__)


class BlobStore:
    """Entries under ``<cache_dir>/blobs``; with no ``cache_dir``, nothing is stored."""

    def __init__(self, cache_dir: Path | None) -> None:
        self.cache_dir = cache_dir
        self._warned = False

    def _path(self, key: str) -> Path | None:
        if self.cache_dir is None:
            return None
        digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
        return self.cache_dir / "blobs" / digest[:2] / digest

    def get(self, key: str) -> bytes | None:
        """What `put` stored under ``key``, or None (also when the stored bytes no
        longer match the sha256 kept beside them: a damaged entry is read again)."""
        path = self._path(key)
        if path is None:
            return None
        try:
            stored = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        digest, sep, data = stored.partition(b"\n")
        if not sep or hashlib.sha256(data).hexdigest().encode() != digest:
            logger.debug("ignoring damaged cache entry %s", path)
            return None
        return data

    def put(self, key: str, data: bytes) -> None:
        """Store immutable ``data`` under ``key`` with its sha256 (atomically; a no-op
        without a cache_dir; a cache that cannot be written is warned about once)."""
        path = self._path(key)
        if path is None:
            return
        try:
            with atomic_writer(path) as f:
                f.write(hashlib.sha256(data).hexdigest().encode() + b"\n" + data)
        except OSError as e:
            if not self._warned:
                self._warned = True
                logger.warning(
                    "cannot write the cache in %s (%s); going on without storing",
                    path.parent.parent,
                    e.strerror or e,
                )
