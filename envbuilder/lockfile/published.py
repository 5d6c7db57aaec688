"""``--lock URL`` (and ``lock --previous URL``): a published lockfile, downloaded and then
read like any other.

The lockfile (and, for ``export`` and ``install``, the pylocks it names, at
their paths relative to it, as the site publishes them) is downloaded through
the one HTTP client into the cache, under a directory named by the URL's
sha256. Nothing is trusted for being downloaded: `load_lockfile` recomputes
``content_sha256`` as for a local file, and `export.locate_pylock` checks each
pylock's sha256 against the lockfile. Only https is accepted, and plain http
to this machine (loopback), which the tests serve from.
"""

from __future__ import annotations

import hashlib
import ipaddress
from pathlib import Path, PurePosixPath
from urllib.parse import urljoin, urlsplit

from envbuilder.errors import IndexError_, InputError
from envbuilder.files import write_atomic
from envbuilder.lockfile.model import DEFAULT_LOCKFILE, CompatLock
from envbuilder.lockfile.read import default_lockfile, load_lockfile
from envbuilder.settings import Settings

__all__ = ["is_url", "lockfile_argument"]


def is_url(value: str) -> bool:
    return "://" in value


def _loopback(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_url(url: str, option: str = "--lock") -> None:
    parts = urlsplit(url)
    if parts.scheme == "https" or (parts.scheme == "http" and _loopback(parts.hostname)):
        return
    raise InputError(
        f"{option} {url!r}: a published lockfile is read over https only (plain http only "
        f"from this machine); give its https URL, or download it and pass {option} FILE"
    )


def _download(url: str, to: Path, settings: Settings, option: str = "--lock") -> None:
    from envbuilder.credentials import redact_text

    try:
        with settings.http_client() as client:
            body = client.get(url).content
    except IndexError_ as e:
        raise IndexError_(f"{option}: cannot download {redact_text(url)}: {e}") from e
    write_atomic(to, body)


def _fetch_locks(url: str, here: Path, lock: CompatLock, wanted: str | None, s: Settings) -> None:
    for entry in lock.combinations:
        if entry.lock is None or (wanted is not None and entry.id != wanted):
            continue
        relative = PurePosixPath(entry.lock.path)
        if relative.is_absolute() or ".." in relative.parts:
            raise InputError(
                f"--lock {url!r}: {entry.id!r} names its lock {entry.lock.path!r}, outside "
                "the lockfile's directory; refusing to download it"
            )
        _download(urljoin(url, entry.lock.path), here / relative, s)


def lockfile_argument(
    value: str | None,
    settings: Settings,
    *,
    with_locks: bool = False,
    combination: str | None = None,
    option: str = "--lock",
) -> Path:
    """The local lockfile ``--lock`` (or *option*) names: a path as given, or a URL
    downloaded first (and checked: read and its content hash verified).

    ``with_locks`` downloads the pylocks too (all of them, or ``combination``'s only).
    """
    if value is None:
        return default_lockfile(settings)
    if not is_url(value):
        return Path(value)
    _check_url(value, option)
    here = settings.cache_dir / "published" / hashlib.sha256(value.encode()).hexdigest()[:24]
    path = here / DEFAULT_LOCKFILE
    _download(value, path, settings, option)
    try:
        lock = load_lockfile(path)
    except InputError as e:
        raise InputError(f"{option} {value}: {e}") from e
    if with_locks:
        _fetch_locks(value, here, lock, combination, settings)
    return path
