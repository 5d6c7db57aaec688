"""Source builds in the lockfile: the build record of the wheel that was built and measured.

``envbuilder build-wheel ID`` writes ``build-record.<id>.json`` (schema
``envbuilder.source-build/1``) beside the locks. A CUDA build of xformers is not
byte-reproducible, so a rebuild gives another wheel: the record pins the one that was
built, and the runs that measured it. ``envbuilder lock`` looks for the record of each
source-build combination in its ``--build-records`` directories, first found wins
(default: the resolution's directory, where ``build-wheel`` writes it, then
``results/build-records/``, where records of measured wheels are committed), checks that
it is a build of the combination's locked sdist for its architectures, and copies what
consumers need into the entry's ``source_build``.

Standard library and envbuilder's records only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from envbuilder.docpath import document_path
from envbuilder.errors import InputError
from envbuilder.files import sha256_file
from envbuilder.lockfile.model import Entry, SourceBuildEntry
from envbuilder.model import ResolvedCombination
from envbuilder.sourcebuild.cache import record_name
from envbuilder.sourcebuild.key import KEY_FORMAT
from envbuilder.sourcebuild.records import (
    BUILD_RECORDS_DIR,
    build_command,
    find_build_record,
    read_build_record,
)

__all__ = [
    "BUILD_RECORDS_DIR",
    "build_command",
    "describe",
    "find_build_record",
    "record_name",
    "recorded_wheel",
    "source_build_entry",
    "wheel_install_command",
]


def source_build_entry(
    combo: ResolvedCombination, directories: Sequence[Path], *, relative_to: Path
) -> SourceBuildEntry | None:
    """The lockfile's ``source_build`` of *combo* (None: its xformers is a wheel from an index).

    The build record is looked for in *directories* (first found wins); its path is written
    relative to *relative_to* (the lockfile's directory)."""
    import os

    build = combo.source_build
    if build is None or combo.status != "resolved":
        return None
    path = find_build_record(directories, combo.id)
    entry = SourceBuildEntry(sdist_sha256=build.sdist.sha256, arch_list=tuple(build.arch_list))
    if path is None:
        return entry
    data = read_build_record(path, combo)
    cpp_lib = data.get("cpp_lib")
    return SourceBuildEntry(
        sdist_sha256=entry.sdist_sha256,
        arch_list=entry.arch_list,
        record=Path(os.path.relpath(path.resolve(), relative_to.resolve())).as_posix(),
        key=str(data["key"]),
        key_format=int(data["key_inputs"]["format"]),
        mode=str(data["mode"]),
        toolchain=str(data["toolchain"]),
        wheel_filename=str(data["wheel"]["filename"]),
        wheel_sha256=str(data["wheel"]["sha256"]),
        wheel_size=data["wheel"].get("size"),
        wheel_libraries=data["wheel"].get("libraries"),
        cpp_lib=dict(cpp_lib) if isinstance(cpp_lib, Mapping) else None,
    )


def describe(build: SourceBuildEntry, combination: str) -> str:
    """One line for ``query`` and the site: the build that was measured, or how to make one."""
    if not build.built:
        return f"xformers built from source: not built yet: {build_command(combination)}"
    assert build.key is not None and build.wheel_sha256 is not None
    text = (
        f"xformers built from source (key {build.key[:12]}, wheel sha256 {build.wheel_sha256[:12]})"
    )
    if build.key_format is not None and build.key_format < KEY_FORMAT:
        # a consumer's words: the wheel is still pinned by its sha256; only a new build's
        # key would be computed differently
        text += "; recorded by an earlier envbuilder (its sha256 still pins the wheel)"
    return text


def _how_to_get(entry: Entry, build: SourceBuildEntry) -> str:
    return (
        f"pass --wheel PATH of the recorded wheel {build.wheel_filename} (sha256 "
        f"{build.wheel_sha256}; the GPU matrix run publishes it beside the lockfile), or build "
        f"one with `{build_command(entry.id)}`: a CUDA build is not byte-reproducible, so a new "
        "build is another wheel, to be locked (`envbuilder lock`) and measured before it is "
        "verified. Nothing was installed"
    )


def recorded_wheel(entry: Entry, *, wheel: Path | None, build_cache: Path) -> Path | None:
    """The built xformers wheel *entry* installs after its lock (None: not a source build).

    ``--wheel`` or the build cache's entry under the record's key, its sha256 checked
    against the lockfile's build record; anything else is an `InputError` that says how
    to fetch or build it. Reads only: called before anything is installed or created."""
    build = entry.source_build
    if build is None:
        if wheel is not None:
            raise InputError(
                f"--wheel {wheel}: {entry.id} installs xformers from its lock, not from a "
                "source build; leave --wheel out"
            )
        return None
    if not build.built:
        raise InputError(
            f"{entry.id} builds xformers from source, and the lockfile records no build of it "
            f"(not built yet): build it with `{build_command(entry.id)}`, then "
            "`envbuilder lock` records it; nothing was installed"
        )
    assert build.key is not None and build.wheel_filename is not None
    path = wheel or document_path(
        build_cache,
        ("key", build.key),
        ("wheel", build.wheel_filename),
        source=f"the lockfile's build record of {entry.id!r}",
    )
    where = f"--wheel {wheel}" if wheel is not None else f"the build cache ({path})"
    if not path.is_file():
        raise InputError(
            f"{entry.id} installs xformers built from source (key {build.key[:12]}), and "
            f"{where} holds no such wheel: {_how_to_get(entry, build)}"
        )
    digest = sha256_file(path)
    if digest != build.wheel_sha256:
        raise InputError(
            f"{where} has sha256 {digest}, not the {build.wheel_sha256} that the lockfile's "
            f"build record of {entry.id} pins: {_how_to_get(entry, build)}"
        )
    return path


def wheel_install_command(
    wheel: Path, python_exe: Path, installer: str, uv: str | None
) -> list[str]:
    """The command that installs the built *wheel* alone (its dependencies are the lock's)."""
    if installer == "uv":
        assert uv is not None
        return [
            uv,
            "pip",
            "install",
            "--python",
            str(python_exe),
            "--no-deps",
            "--no-index",
            str(wheel),
        ]
    return [str(python_exe), "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)]


def staged_wheel(entry: Entry, wheel: Path, directory: Path) -> Path:
    """*wheel* copied into *directory* and checked again: what is installed is what was
    checked, even if the original changes meanwhile."""
    import shutil

    build = entry.source_build
    assert build is not None and build.wheel_sha256 is not None
    copy = directory / wheel.name
    shutil.copyfile(wheel, copy)
    digest = sha256_file(copy)
    if digest != build.wheel_sha256:
        raise InputError(
            f"{wheel} changed while it was installed (sha256 {digest}, not "
            f"{build.wheel_sha256}); run this again"
        )
    return copy
