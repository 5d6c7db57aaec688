"""The host's wheel cache: content-addressed by sha256, shared by every combination.

``<root>/sha256/ab/abcdef…`` holds the bytes whose sha256 is ``abcdef…``.
A file only gets its name after its hash was checked while it streamed in,
so whatever is in the cache is trusted; partial downloads are deleted.
Downloads go through the one `HttpClient` (retries, CA bundle, offline).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlsplit

from envbuilder.docker.plan import LockedWheel
from envbuilder.errors import IndexError_, InputError
from envbuilder.files import atomic_writer
from envbuilder.index.http import HttpClient

__all__ = ["WheelCache"]

logger = logging.getLogger(__name__)

_CHUNK = 1 << 20


class WheelCache:
    """Fetch lock files once, verify them on the way in, hand out paths by hash."""

    def __init__(
        self,
        root: Path,
        *,
        client: HttpClient | None = None,
    ) -> None:
        """``client`` downloads (give one with the run's CA bundle; `Settings.http_client`)."""
        self.root = root
        self._client = client

    def path_for(self, sha256: str) -> Path:
        return self.root / "sha256" / sha256[:2] / sha256

    def has(self, wheel: LockedWheel) -> bool:
        path = self.path_for(wheel.sha256)
        return path.is_file() and (wheel.size is None or path.stat().st_size == wheel.size)

    def fetch(self, wheel: LockedWheel) -> Path:
        """The cached file for ``wheel``, downloading or copying it first when absent."""
        path = self.path_for(wheel.sha256)
        if self.has(wheel):
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        scheme = urlsplit(wheel.url).scheme
        if scheme == "file":
            chunks = self._read_file(wheel)
        elif scheme in ("http", "https"):
            chunks = self._download(wheel)
        else:
            raise InputError(
                f"{wheel.filename}: unsupported URL {wheel.url!r}; locks must use http(s):// or file://"
            )
        with self._verified_write(wheel, path) as write:
            for chunk in chunks:
                write(chunk)
        logger.info("cached %s as %s", wheel.filename, path)
        return path

    def fetch_all(self, wheels: Iterable[LockedWheel]) -> dict[str, Path]:
        """sha256 -> cached path, for every wheel."""
        return {w.sha256: self.fetch(w) for w in wheels}

    def _read_file(self, wheel: LockedWheel) -> Iterator[bytes]:
        source = Path(unquote(urlsplit(wheel.url).path))
        try:
            with source.open("rb") as f:
                while chunk := f.read(_CHUNK):
                    yield chunk
        except OSError as e:
            raise InputError(f"{wheel.filename}: cannot read {str(source)!r} ({e.strerror})") from e

    def _download(self, wheel: LockedWheel) -> Iterator[bytes]:
        logger.info("downloading %s", wheel.url)
        try:
            yield from self._get_client().stream(wheel.url, chunk_size=_CHUNK)
        except IndexError_ as e:
            raise IndexError_(f"{wheel.filename}: {e}") from e

    def _get_client(self) -> HttpClient:
        if self._client is None:
            self._client = HttpClient()
        return self._client

    @contextmanager
    def _verified_write(self, wheel: LockedWheel, path: Path) -> Iterator[Callable[[bytes], None]]:
        digest = hashlib.sha256()
        size = 0
        with atomic_writer(path) as out:

            def write(chunk: bytes) -> None:
                nonlocal size
                digest.update(chunk)
                size += len(chunk)
                if wheel.size is not None and size > wheel.size:
                    raise IndexError_(
                        f"{wheel.filename}: more than the lock's {wheel.size} bytes from {wheel.url!r}"
                    )
                out.write(chunk)

            yield write
            if digest.hexdigest() != wheel.sha256:
                raise IndexError_(
                    f"{wheel.filename}: sha256 {digest.hexdigest()!r} from {wheel.url!r} "
                    f"does not match the lock's {wheel.sha256!r}"
                )
            if wheel.size is not None and size != wheel.size:
                raise IndexError_(
                    f"{wheel.filename}: {size} bytes from {wheel.url!r}, the lock says {wheel.size}"
                )

    def link_into(self, wheel: LockedWheel, directory: Path) -> Path:
        """Hard-link (or copy across filesystems) the cached file into ``directory`` under its wheel name."""
        source = self.fetch(wheel)
        target = directory / wheel.filename
        try:
            os.link(source, target)
        except OSError:
            shutil.copyfile(source, target)
        return target
