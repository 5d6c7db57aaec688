"""The host's wheel cache: content-addressed by sha256, shared by every combination.

``<root>/sha256/ab/abcdef…`` holds the bytes whose sha256 is ``abcdef…``.
A file only gets its name after its hash was checked while it streamed in;
partial downloads are deleted. A cached file is hard-linked into build contexts,
so its bytes can change after they were checked: before a file is handed out its
sha256 is checked again, unless a stamp (``<root>/verified/ab/abcdef…``) says
that the file with this size, modification time and inode already hashed right.
A file that no longer matches its name is deleted and fetched again.
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

from envbuilder.docker.plan import GROUPS, LayerPlan, LockedWheel, install_requirements
from envbuilder.errors import IndexError_, InputError
from envbuilder.files import atomic_writer
from envbuilder.index.http import HttpClient

__all__ = ["WheelCache", "link_wheels"]

logger = logging.getLogger(__name__)

_CHUNK = 1 << 20


def _identity(st: os.stat_result) -> str:
    return f"{st.st_size} {st.st_mtime_ns} {st.st_ino}"


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


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

    def _stamp_for(self, sha256: str) -> Path:
        return self.root / "verified" / sha256[:2] / sha256

    def has(self, wheel: LockedWheel) -> bool:
        """Whether the cache holds ``wheel``'s bytes: the size, then the sha256 (skipped
        when the stamp matches the file's size, mtime and inode)."""
        path = self.path_for(wheel.sha256)
        try:
            st = path.stat()
        except FileNotFoundError:
            return False
        if not path.is_file() or (wheel.size is not None and st.st_size != wheel.size):
            return False
        identity = _identity(st)
        stamp = self._stamp_for(wheel.sha256)
        try:
            if stamp.read_text(encoding="utf-8") == identity:
                return True
        except (OSError, UnicodeDecodeError):
            pass
        found = _sha256_of(path)
        if found != wheel.sha256:
            logger.warning(
                "cached %s has sha256 %s, not %s: fetching it again",
                wheel.filename,
                found,
                wheel.sha256,
            )
            path.unlink(missing_ok=True)
            stamp.unlink(missing_ok=True)
            return False
        self._stamp(wheel.sha256, path)
        return True

    def _stamp(self, sha256: str, path: Path) -> None:
        stamp = self._stamp_for(sha256)
        with atomic_writer(stamp) as out:
            out.write(_identity(path.stat()).encode("utf-8"))

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
        self._stamp(wheel.sha256, path)
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


def link_wheels(
    plan: LayerPlan, cache: WheelCache, root: Path, *, groups: Iterable[str] = GROUPS
) -> None:
    """``root/<group>/``: hard links of the group's cached wheels and its requirements.txt."""
    for group in groups:
        _link_group(cache, root / group, plan.groups[group])  # type: ignore[index]


def _link_group(cache: WheelCache, directory: Path, wheels: Iterable[LockedWheel]) -> None:
    directory.mkdir(parents=True)
    wheels = tuple(wheels)
    for wheel in wheels:
        cache.link_into(wheel, directory)
    (directory / "requirements.txt").write_text(install_requirements(wheels), encoding="utf-8")
