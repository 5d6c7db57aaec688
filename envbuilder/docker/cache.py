"""The host's wheel cache: content-addressed by sha256, shared by every combination.

``<root>/sha256/ab/abcdef…`` holds the bytes whose sha256 is ``abcdef…``.
A file only gets its name after its hash was checked while it streamed in,
so whatever is in the cache is trusted; partial downloads are deleted.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from envbuilder.docker.plan import LockedWheel
from envbuilder.errors import IndexError_, InputError
from envbuilder.files import atomic_writer

if TYPE_CHECKING:
    import requests

__all__ = ["WheelCache", "default_cache_dir"]

logger = logging.getLogger(__name__)

_CHUNK = 1 << 20


def default_cache_dir() -> Path:
    """``ENVBUILDER_WHEEL_CACHE``, else the user cache directory's ``wheels``."""
    configured = os.environ.get("ENVBUILDER_WHEEL_CACHE")
    if configured:
        return Path(configured)
    import platformdirs

    return Path(platformdirs.user_cache_dir("envbuilder")) / "wheels"


class WheelCache:
    """Fetch lock files once, verify them on the way in, hand out paths by hash."""

    def __init__(
        self,
        root: Path,
        *,
        session_factory: Callable[[], requests.Session] | None = None,
    ) -> None:
        self.root = root
        self._session_factory = session_factory
        self._session: requests.Session | None = None

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
        import requests

        session = self._get_session()
        logger.info("downloading %s", wheel.url)
        try:
            with session.get(wheel.url, stream=True, timeout=(30, 300)) as response:
                if response.status_code != 200:
                    raise IndexError_(
                        f"{wheel.filename}: GET {wheel.url!r} answered HTTP {response.status_code}"
                    )
                yield from response.iter_content(_CHUNK)
        except requests.RequestException as e:
            raise IndexError_(f"{wheel.filename}: GET {wheel.url!r} failed ({e})") from e

    def _get_session(self) -> requests.Session:
        if self._session is None:
            if self._session_factory is not None:
                self._session = self._session_factory()
            else:
                import requests

                from envbuilder.pipconfig import ca_bundle

                self._session = requests.Session()
                bundle = ca_bundle()
                if bundle:
                    self._session.verify = bundle
        return self._session

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
