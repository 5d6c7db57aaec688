"""``--lock URL`` (and ``lock --previous URL``): a published lockfile, downloaded and then
read like any other.

The lockfile (and, for ``export`` and ``install``, the pylocks it names, at
their paths relative to it, as the site publishes them) is downloaded through
the one HTTP client into the cache, under a directory named by the URL's
sha256; the client's HTTP cache keeps the response, so asking again revalidates it
(ETag, Last-Modified) instead of downloading the same bytes. Nothing is trusted for being downloaded: `load_lockfile` recomputes
``content_sha256`` as for a local file, and `export.locate_pylock` checks each
pylock's sha256 against the lockfile. Only https is accepted, and plain http
to this machine (loopback), which the tests serve from. A URL is shown without
its password (``user:***@``), wherever it is printed.
"""

from __future__ import annotations

import hashlib
import ipaddress
from pathlib import Path, PurePosixPath
from urllib.parse import urljoin, urlsplit

from envbuilder.credentials import redact_text
from envbuilder.errors import IndexError_, InputError
from envbuilder.files import write_atomic
from envbuilder.lockfile.model import DEFAULT_LOCKFILE, CompatLock
from envbuilder.lockfile.read import default_lockfile, load_lockfile
from envbuilder.settings import Settings

__all__ = ["days_old", "is_url", "lockfile_argument", "lockfile_choice"]

#: how long a downloaded ``$ENVBUILDER_LOCK_URL`` lockfile is used before it is fetched again
FRESH_SECONDS = 24 * 3600


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
        f"{option} {redact_text(url)!r}: a published lockfile is read over https only (plain http only "
        f"from this machine); give its https URL, or download it and pass {option} FILE"
    )


def _download(url: str, to: Path, settings: Settings, option: str = "--lock") -> None:
    """*url* into *to*; through the HTTP cache, so that asking again revalidates (ETag,
    Last-Modified) instead of downloading the same bytes."""
    try:
        with settings.http_client(cache_dir=settings.cache_dir) as client:
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
                f"--lock {redact_text(url)!r}: {entry.id!r} names its lock {entry.lock.path!r}, outside "
                "the lockfile's directory; refusing to download it"
            )
        _download(urljoin(url, entry.lock.path), here / relative, s)


def _age(seconds: float) -> str:
    if seconds < 3600:
        return f"{max(int(seconds // 60), 0)} min ago"
    if seconds < 2 * 86400:
        return f"{int(seconds // 3600)} h ago"
    return f"{int(seconds // 86400)} days ago"


def days_old(days: int) -> str:
    """``today``, ``1 day old``, ``N days old``."""
    return "today" if days <= 0 else "1 day old" if days == 1 else f"{days} days old"


def _configured(
    url: str, settings: Settings, with_locks: bool, combination: str | None
) -> tuple[Path, str]:
    """``$ENVBUILDER_LOCK_URL``: the cached copy while it is fresh, else downloaded anew; an
    unreachable URL falls back to a cached copy, saying how old it is."""
    import time

    _check_url(url, "$ENVBUILDER_LOCK_URL")
    shown = redact_text(url)
    path = _cache(url, settings) / DEFAULT_LOCKFILE
    age = time.time() - path.stat().st_mtime if path.is_file() else None
    if age is not None and age < FRESH_SECONDS:
        return path, f"lockfile: {shown} (downloaded {_age(age)}; fetched again after a day)"
    try:
        got = lockfile_argument(
            url,
            settings,
            with_locks=with_locks,
            combination=combination,
            option="$ENVBUILDER_LOCK_URL",
        )
    except IndexError_ as e:
        if age is None:
            raise
        return path, f"lockfile: {shown}, cached {_age(age)}: ! it could not be fetched again ({e})"
    return got, f"lockfile: {shown} (downloaded now)"


def _cache(url: str, settings: Settings) -> Path:
    return settings.cache_dir / "published" / hashlib.sha256(url.encode()).hexdigest()[:24]


def lockfile_choice(
    value: str | None,
    settings: Settings,
    *,
    with_locks: bool = False,
    combination: str | None = None,
) -> tuple[Path, str | None]:
    """The lockfile to read (see the module's order) and, unless it is a local file named
    by the user, one line saying which it is and how old."""
    if value is not None or settings.lockfile is not None:
        path = lockfile_argument(value, settings, with_locks=with_locks, combination=combination)
        shown = redact_text(value) if value and is_url(value) else None
        return path, (f"lockfile: {shown} (downloaded now)" if shown else None)
    if settings.lock_url:
        return _configured(settings.lock_url, settings, with_locks, combination)
    local = default_lockfile(settings)
    if local.exists():
        return local, None
    from envbuilder.consumer.snapshot import embedded, newest_evidence, require_locks

    snapshot = embedded()
    if snapshot is None:
        return local, None  # reading it says it is missing and what to do
    if with_locks:
        require_locks(snapshot, combination)
    from datetime import UTC, date, datetime

    day = newest_evidence(load_lockfile(snapshot))
    old = f", {days_old((datetime.now(UTC).date() - date.fromisoformat(day)).days)}" if day else ""
    return snapshot, (
        f"lockfile: the snapshot this envbuilder carries (newest evidence {day or 'none'}{old});"
        " --lock URL or $ENVBUILDER_LOCK_URL for the published one"
    )


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
    here = _cache(value, settings)
    path = here / DEFAULT_LOCKFILE
    _download(value, path, settings, option)
    try:
        lock = load_lockfile(path)
    except InputError as e:
        raise InputError(f"{option} {redact_text(value)}: {e}") from e
    if with_locks:
        _fetch_locks(value, here, lock, combination, settings)
    return path
