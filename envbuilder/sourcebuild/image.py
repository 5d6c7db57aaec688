"""The built xformers wheel an image of a source-build combination installs.

A source build's lock holds torch and xformers' run-time requirements, not xformers:
the image installs the wheel that ``envbuilder build-wheel`` built, the one its build
record names, from the build cache, with that record's sha256 (``--require-hashes``,
like every locked wheel, in the ``rest`` layer). The image build never compiles one
itself: a CUDA build is not byte-reproducible, so a silent rebuild would put an
unmeasured wheel into the image. Without a record, or without its wheel in the
cache, the build stops and says how to get one.

The record is looked for beside the locks (where ``build-wheel`` writes it), then in
``results/build-records/`` (the records of measured wheels), as ``envbuilder lock``
does; it must be a build of the combination's locked sdist for its architectures.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from envbuilder.docker.cache import WheelCache
from envbuilder.docker.plan import LockedWheel
from envbuilder.docpath import document_path
from envbuilder.errors import InputError
from envbuilder.files import sha256_file
from envbuilder.model import ResolvedCombination

__all__ = ["built_wheel_for_image", "image_wheel"]


def built_wheel_for_image(
    resolved: ResolvedCombination,
    lock_path: Path,
    *,
    build_cache: Path,
    records: Sequence[Path] | None = None,
) -> LockedWheel | None:
    """The built xformers wheel *resolved*'s image installs (None: not a source build).

    *records* are the directories searched for its build record (default: the lock's
    directory, then ``results/build-records``); the wheel is taken from *build_cache*
    under the record's key and its sha256 checked here, before any layer is built."""
    from envbuilder.sourcebuild.records import (
        BUILD_RECORDS_DIR,
        build_command,
        find_build_record,
        read_build_record,
    )

    if resolved.source_build is None or resolved.status != "resolved":
        return None
    where = tuple(records) if records is not None else (lock_path.parent, BUILD_RECORDS_DIR)
    path = find_build_record(where, resolved.id)
    build = build_command(resolved.id)
    if path is None:
        raise InputError(
            f"{resolved.id} builds xformers from source, and no build record of it is in "
            f"{' or '.join(map(str, where))}: build the wheel first (`{build}`), and the image "
            "installs it; an image build never compiles xformers itself"
        )
    record = read_build_record(path, resolved)
    key, filename = str(record["key"]), str(record["wheel"]["filename"])
    sha256 = str(record["wheel"]["sha256"])
    wheel = document_path(build_cache, ("key", key), ("wheel", filename), source=str(path))
    if not wheel.is_file():
        raise InputError(
            f"{path} names the wheel {filename} (key {key[:12]}), and the build cache "
            f"{build_cache} does not hold it: build it there (`{build}`), or fetch the "
            f"published one (`envbuilder install {resolved.id} --lock URL` puts it there)"
        )
    digest = sha256_file(wheel)
    if digest != sha256:
        raise InputError(
            f"{wheel} has sha256 {digest}, not the {sha256} its build record {path} names; "
            f"remove it and build again (`{build} --force`)"
        )
    try:
        name, version, _, _ = parse_wheel_filename(filename)
    except InvalidWheelFilename as e:
        raise InputError(f"{path}: {filename!r} is not a wheel's file name ({e})") from e
    return LockedWheel(
        name=str(name),
        version=str(version),
        filename=filename,
        url=wheel.resolve().as_uri(),
        sha256=sha256,
        size=wheel.stat().st_size,
    )


def image_wheel(
    resolved: ResolvedCombination, lock_path: Path, cache: WheelCache
) -> LockedWheel | None:
    """`built_wheel_for_image` with the build cache beside the image build's wheel cache
    (``<cache's parent>/source-builds``, where ``build-wheel`` and ``install`` put it)."""
    return built_wheel_for_image(
        resolved, lock_path, build_cache=cache.root.parent / "source-builds"
    )
