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
   and ``envbuilder build`` for an image, find it there); a dry run downloads
   nothing and says what the real run would download;
4. otherwise an error saying how to get one (`envbuilder.lockfile.sourcebuilds`).

A wheel whose sha256 is not the record's is never installed nor cached. The build key
and the wheel's file name come from the lockfile, which may come from anywhere: they
are checked (`envbuilder.docpath`) before any path is made of them, and a lockfile
naming another is refused before anything is read, downloaded or deleted. The download
is bounded: no more bytes than the record's size (else `MAX_WHEEL`), read within
`BASE_SECONDS` plus that size at `SLOWEST_RATE`. The published build record is kept only where
it is the lockfile's own (its key inputs hash to the key, every other field agrees).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin

from envbuilder.credentials import redact_text
from envbuilder.docpath import checked_name, document_path
from envbuilder.errors import HttpNotFound, IndexError_, InputError
from envbuilder.files import atomic_writer, sha256_file
from envbuilder.jsondoc import NotJSON, parse
from envbuilder.sourcebuild.cache import RECORD_SCHEMA, BuiltWheelCache
from envbuilder.sourcebuild.published import record_asset, wheel_asset

if TYPE_CHECKING:
    from envbuilder.lockfile.model import CompatLock, Entry
    from envbuilder.settings import Settings

__all__ = [
    "BASE_SECONDS",
    "MAX_WHEEL",
    "SLOWEST_RATE",
    "FromPublished",
    "ReleaseWheels",
    "gather_release_wheels",
    "lockfile_url",
    "wheel_for_install",
]

#: The most bytes a published wheel may have when its record gives no size.
MAX_WHEEL = 2 * 2**30
#: The time a published wheel's body is given: `BASE_SECONDS`, plus its size at
#: `SLOWEST_RATE` bytes per second (a 100 MB wheel: about 7 minutes).
BASE_SECONDS = 60.0
SLOWEST_RATE = 256 * 1024
#: The most bytes a published build record may have (one is about 2 KiB).
MAX_RECORD = 1 << 20


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


def _download_verified(
    url: str, to: Path, sha256: str, size: int | None, settings: Settings
) -> None:
    """``url``'s bytes into ``to``, only if their sha256 is ``sha256`` (else nothing is left):
    at most *size* bytes (else `MAX_WHEEL`), within `BASE_SECONDS` plus the time that many
    take at `SLOWEST_RATE`."""
    digest = hashlib.sha256()
    limit = MAX_WHEEL if size is None else size
    seconds = BASE_SECONDS + limit / SLOWEST_RATE
    with settings.http_client() as client, atomic_writer(to) as out:
        for chunk in client.stream(url, max_bytes=limit, seconds=seconds):
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
        "source": redact_text(url),
    }
    try:
        with settings.http_client() as client:
            data = parse(client.get(url, max_bytes=MAX_RECORD).content)
    except (IndexError_, NotJSON, ValueError):
        return made
    if not _is_the_lockfiles(data, made):
        return made
    kept = {k: data[k] for k in ("jobs", "seconds") if _count(data.get(k))}
    return {**made, "key_inputs": data["key_inputs"], **kept}


#: a build key's inputs (`envbuilder.sourcebuild.key.BuildKey.inputs`) and their JSON types
_KEY_INPUTS: dict[str, type] = {
    "format": int,
    "sdist_sha256": str,
    "torch": str,
    "toolchain": list,
    "arch_list": list,
    "flags": list,
    "builder": str,
    "recipe": str,
}
_RECORD_KEYS = frozenset(
    {"schema", "combination", "key", "key_inputs", "mode", "toolchain", "jobs", "seconds"}
    | {"wheel", "cpp_lib", "source"}
)


def _count(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_the_lockfiles(data: object, made: dict[str, Any]) -> bool:
    """Whether *data* is the build record *made* stands for: its key inputs are those the
    key is the hash of, and every field the lockfile also records agrees with it."""
    if not isinstance(data, dict) or not set(data) <= _RECORD_KEYS:
        return False
    inputs = data.get("key_inputs")
    if not isinstance(inputs, dict) or set(inputs) != set(_KEY_INPUTS):
        return False
    for name, kind in _KEY_INPUTS.items():
        value = inputs[name]
        if not isinstance(value, kind) or isinstance(value, bool):
            return False
        if isinstance(value, list) and not all(isinstance(item, str) for item in value):
            return False
    if inputs["format"] != made["key_inputs"]["format"]:
        return False
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    if hashlib.sha256(text.encode()).hexdigest() != made["key"]:
        return False
    same = ("schema", "combination", "key", "mode", "toolchain", "cpp_lib")
    wheel = data.get("wheel")
    return (
        all(data.get(k) == made[k] for k in same)
        and isinstance(wheel, dict)
        and set(wheel) <= set(made["wheel"])
        and all(wheel.get(k) == v for k, v in made["wheel"].items())
    )


def fetch_published(
    entry: Entry, *, lock_url: str, build_cache: Path, settings: Settings
) -> FromPublished | None:
    """*entry*'s recorded wheel downloaded from beside *lock_url* into *build_cache*, its sha256
    checked; None when nothing is published there (404). Any other failure is an error."""
    build = entry.source_build
    assert build is not None and build.key is not None and build.wheel_filename is not None
    assert build.wheel_sha256 is not None
    source = f"the lockfile's build record of {entry.id!r}"
    cache = BuiltWheelCache(build_cache)
    cache.entry(build.key, source=source)
    downloads = build_cache / ".downloads"
    staging = document_path(downloads, ("wheel", build.wheel_filename), source=source)
    url = urljoin(lock_url, wheel_asset(entry.id, build.wheel_filename))
    downloads.mkdir(parents=True, exist_ok=True)
    size = build.wheel_size
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        size = None
    try:
        _download_verified(url, staging, build.wheel_sha256, size, settings)
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
    return FromPublished(path=built.path, url=redact_text(url))


def wheel_for_install(
    entry: Entry,
    *,
    wheel: Path | None,
    build_cache: Path,
    lock_url: str | None,
    settings: Settings,
    download: bool = True,
) -> tuple[Path | None, str | None]:
    """The wheel *entry*'s build record pins (None: not a source build, or not downloaded
    for a dry run) and a line saying where it came from, or would come from (None: from
    ``--wheel`` or the cache). See the module for the order; nothing is downloaded unless
    *download*."""
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
    source = f"the lockfile's build record of {entry.id!r}"
    cached = document_path(
        build_cache, ("key", build.key), ("wheel", build.wheel_filename), source=source
    )
    if cached.is_file() and sha256_file(cached) == build.wheel_sha256:
        return cached, None
    url = redact_text(urljoin(lock_url, wheel_asset(entry.id, build.wheel_filename)))
    if download:
        found = fetch_published(
            entry, lock_url=lock_url, build_cache=build_cache, settings=settings
        )
    else:  # asked whether it is there (HEAD), not downloaded
        with settings.http_client() as client:
            there = client.exists(urljoin(lock_url, wheel_asset(entry.id, build.wheel_filename)))
        if there is not False:
            return None, (
                f"xformers: the published build {build.wheel_filename} (sha256 "
                f"{(build.wheel_sha256 or '')[:12]}) from {url} would be downloaded, checked "
                "and installed (dry run: not downloaded)"
            )
        found = None
    if found is None:
        try:
            path = recorded_wheel(entry, wheel=None, build_cache=build_cache)
        except InputError as e:  # it says how to get one
            raise InputError(f"nothing is published at {url} (HTTP 404), and {e}") from e
        return path, None
    return found.path, (
        f"xformers: the published build {build.wheel_filename} (sha256 "
        f"{(build.wheel_sha256 or '')[:12]}, checked) from {found.url}, now in {found.path.parent}"
    )


@dataclass(frozen=True, kw_only=True)
class ReleaseWheels:
    """The built wheels a release attaches: every one the lockfile's build records name."""

    present: tuple[str, ...]  # asset names this run built, with the recorded sha256
    carried: tuple[str, ...]  # copied from an earlier release's assets, sha256 checked
    missing: tuple[str, ...]  # named by a build record, found nowhere with its sha256


def gather_release_wheels(
    lock: CompatLock, assets: Path, earlier: Path | None = None
) -> ReleaseWheels:
    """Put into *assets* every built wheel (and build record) the lockfile's build records
    name, under its release asset name: those this run built are there already; the others
    are copied from *earlier* (an earlier release's assets). A wheel counts only with the
    sha256 its record pins; one with other bytes is never copied, nor kept."""
    import shutil

    present: list[str] = []
    carried: list[str] = []
    missing: list[str] = []
    assets.mkdir(parents=True, exist_ok=True)
    for entry in lock.combinations:
        build = entry.source_build
        if build is None or not build.built or build.wheel_filename is None:
            continue
        checked_name("wheel", build.wheel_filename, source=f"{entry.id}'s build record")
        name = wheel_asset(entry.id, build.wheel_filename)  # one component: [A-Za-z0-9._-]
        here = assets / name
        if here.is_file() and sha256_file(here) == build.wheel_sha256:
            present.append(name)
            continue
        there = earlier / name if earlier is not None else None
        if there is None or not there.is_file() or sha256_file(there) != build.wheel_sha256:
            missing.append(name)
            continue
        with atomic_writer(here) as out, there.open("rb") as source:
            shutil.copyfileobj(source, out)
        record = earlier / record_asset(entry.id) if earlier is not None else None
        if record is not None and record.is_file() and not (assets / record.name).exists():
            shutil.copyfile(record, assets / record.name)
        carried.append(name)
    return ReleaseWheels(present=tuple(present), carried=tuple(carried), missing=tuple(missing))
