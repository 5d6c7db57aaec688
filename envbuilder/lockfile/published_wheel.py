"""The built wheel ``install`` takes for a source build, published beside the lockfile.

A CUDA build of xformers is not byte-reproducible: a rebuild is another wheel, so
users install the very wheel that was built and measured. The GPU matrix workflow
builds it on the GPU runner (``envbuilder build-wheel ID --assets DIR``) and
publishes it with its build record as release assets beside ``compat.lock.json``,
under names unique within a release (`wheel_asset`, `record_asset`): two source
builds of one xformers release have the same wheel file name.

``install`` takes the wheel that the lockfile's build record pins from, in order:

1. ``--wheel PATH``;
2. the build cache (``<cache>/<key>/<wheel>``): bytes with the recorded sha256 are
   the published wheel, whoever put them there;
3. the published wheel beside the lockfile's URL (``--lock URL`` or
   ``$ENVBUILDER_LOCK_URL``), downloaded, its sha256 checked while it streams in,
   then put into the build cache with its build record (so that the next install,
   and ``envbuilder build`` for an image, find it there);
4. otherwise an error saying how to get one (`envbuilder.lockfile.sourcebuilds`).

A wheel whose sha256 is not the record's is never installed nor cached.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin

from envbuilder.errors import HttpNotFound, IndexError_, InputError
from envbuilder.files import atomic_writer, sha256_file
from envbuilder.sourcebuild.cache import RECORD_SCHEMA, BuiltWheelCache
from envbuilder.sourcebuild.published import record_asset, wheel_asset

if TYPE_CHECKING:
    from envbuilder.lockfile.model import Entry
    from envbuilder.settings import Settings

__all__ = ["FromPublished", "lockfile_url", "wheel_for_install"]


def lockfile_url(value: str | None, settings: Settings) -> str | None:
    """The URL the lockfile was read from (``--lock URL``, else ``$ENVBUILDER_LOCK_URL`` when
    no local lockfile is configured); None for a local file or the carried snapshot."""
    if value is not None:
        return value if "://" in value else None
    if settings.lockfile is None and settings.lock_url:
        return settings.lock_url
    return None


@dataclass(frozen=True, kw_only=True)
class FromPublished:
    """A published wheel now in the build cache."""

    path: Path
    url: str


def _download_verified(url: str, to: Path, sha256: str, settings: Settings) -> None:
    """``url``'s bytes into ``to``, only if their sha256 is ``sha256`` (else nothing is left)."""
    from envbuilder.credentials import redact_text

    digest = hashlib.sha256()
    with settings.http_client() as client, atomic_writer(to) as out:
        for chunk in client.stream(url):
            digest.update(chunk)
            out.write(chunk)
        if digest.hexdigest() != sha256:
            raise _WrongHash(
                f"{redact_text(url)} has sha256 {digest.hexdigest()}, not the {sha256} that the "
                "lockfile's build record pins; it was not installed nor cached. The release's "
                "assets are not this lockfile's: pass --wheel PATH of the recorded wheel, or "
                "read the lockfile from the release that published it (--lock URL)"
            )


class _WrongHash(InputError):
    pass


def _published_record(url: str, entry: Entry, settings: Settings) -> dict[str, Any]:
    """The published build record, if it is the lockfile's (else a record made from the
    lockfile's entry: the cache needs one, and the wheel's hash is what vouches for it)."""
    build = entry.source_build
    assert build is not None
    made: dict[str, Any] = {
        "schema": RECORD_SCHEMA,
        "combination": entry.id,
        "key": build.key,
        "key_inputs": {"format": build.key_format},
        "mode": build.mode,
        "toolchain": build.toolchain,
        "wheel": {
            "filename": build.wheel_filename,
            "sha256": build.wheel_sha256,
            "size": build.wheel_size,
            "libraries": None if build.wheel_libraries is None else dict(build.wheel_libraries),
        },
        "cpp_lib": None if build.cpp_lib is None else dict(build.cpp_lib),
        "source": url,
    }
    try:
        with settings.http_client() as client:
            data = json.loads(client.get(url).content)
    except (IndexError_, ValueError):
        return made
    wheel = data.get("wheel") if isinstance(data, dict) else None
    if (
        not isinstance(wheel, dict)
        or data.get("key") != build.key
        or wheel.get("sha256") != build.wheel_sha256
        or wheel.get("filename") != build.wheel_filename
    ):
        return made
    return {**data, "source": url}


def fetch_published(
    entry: Entry, *, lock_url: str, build_cache: Path, settings: Settings
) -> FromPublished | None:
    """*entry*'s recorded wheel downloaded from beside *lock_url* into *build_cache*, its sha256
    checked; None when nothing is published there (404). Any other failure is an error."""
    from envbuilder.credentials import redact_text

    build = entry.source_build
    assert build is not None and build.key is not None and build.wheel_filename is not None
    assert build.wheel_sha256 is not None
    url = urljoin(lock_url, wheel_asset(entry.id, build.wheel_filename))
    cache = BuiltWheelCache(build_cache)
    staging = build_cache / ".downloads" / build.wheel_filename
    staging.parent.mkdir(parents=True, exist_ok=True)
    try:
        _download_verified(url, staging, build.wheel_sha256, settings)
    except HttpNotFound:
        return None
    except IndexError_ as e:
        raise IndexError_(
            f"cannot download the published wheel of {entry.id} ({redact_text(url)}): {e}"
        ) from e
    try:
        record = _published_record(urljoin(lock_url, record_asset(entry.id)), entry, settings)
        built = cache.put(build.key, staging, record)
    finally:
        staging.unlink(missing_ok=True)
    return FromPublished(path=built.path, url=url)


def wheel_for_install(
    entry: Entry,
    *,
    wheel: Path | None,
    build_cache: Path,
    lock_url: str | None,
    settings: Settings,
) -> tuple[Path | None, str | None]:
    """The wheel *entry*'s build record pins (None: not a source build) and a line saying
    where it came from (None: from ``--wheel`` or the cache). See the module for the order."""
    from envbuilder.lockfile.sourcebuilds import recorded_wheel

    build = entry.source_build
    if (
        wheel is not None
        or build is None
        or not build.built
        or build.key is None
        or build.wheel_filename is None
        or lock_url is None
    ):
        return recorded_wheel(entry, wheel=wheel, build_cache=build_cache), None
    cached = build_cache / build.key / build.wheel_filename
    if cached.is_file() and sha256_file(cached) == build.wheel_sha256:
        return cached, None
    found = fetch_published(entry, lock_url=lock_url, build_cache=build_cache, settings=settings)
    if found is None:
        url = urljoin(lock_url, wheel_asset(entry.id, build.wheel_filename))
        try:
            path = recorded_wheel(entry, wheel=None, build_cache=build_cache)
        except InputError as e:  # it says how to get one
            raise InputError(f"nothing is published at {url} (HTTP 404), and {e}") from e
        return path, None
    return found.path, (
        f"xformers: the published build {build.wheel_filename} (sha256 "
        f"{(build.wheel_sha256 or '')[:12]}, checked) from {found.url}, now in {found.path.parent}"
    )
