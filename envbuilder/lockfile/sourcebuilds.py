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

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from envbuilder.errors import InputError
from envbuilder.lockfile.model import Entry, SourceBuildEntry
from envbuilder.model import ResolvedCombination
from envbuilder.sourcebuild.cache import RECORD_SCHEMA, record_name
from envbuilder.sourcebuild.key import KEY_FORMAT

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

#: where records of measured wheels are committed (``locks/`` is not)
BUILD_RECORDS_DIR = Path("results") / "build-records"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_MODES = ("in-place", "docker")
_TOOLCHAINS = ("host", "wheels")


def build_command(combination: str) -> str:
    return f"envbuilder build-wheel {combination}"


def find_build_record(directories: Sequence[Path], combination: str) -> Path | None:
    """The first of *directories* that holds *combination*'s build record, or None."""
    for directory in directories:
        path = directory / record_name(combination)
        if path.is_file():
            return path
    return None


def _field(data: Mapping[str, Any], *keys: str) -> Any:
    value: Any = data
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _problems(data: Any, combo: ResolvedCombination) -> list[str]:
    """What makes *data* no build record of *combo*'s locked source build."""
    build = combo.source_build
    assert build is not None
    if not isinstance(data, Mapping):
        return ["it is not a JSON object"]
    if data.get("schema") != RECORD_SCHEMA:
        return [f"schema {data.get('schema')!r}, not {RECORD_SCHEMA!r}"]
    problems: list[str] = []
    if data.get("combination") != combo.id:
        problems.append(f"it is the build of {data.get('combination')!r}")
    key = data.get("key")
    if not isinstance(key, str) or not _SHA256.match(key):
        problems.append(f"key {key!r} is not a sha256")
    filename, sha256, size = (_field(data, "wheel", k) for k in ("filename", "sha256", "size"))
    if not isinstance(filename, str) or not filename.endswith(".whl") or "/" in filename:
        problems.append(f"wheel.filename {filename!r} is not a wheel's name")
    if not isinstance(sha256, str) or not _SHA256.match(sha256):
        problems.append(f"wheel.sha256 {sha256!r} is not a sha256")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
        problems.append(f"wheel.size {size!r} is not a size")
    libraries = _field(data, "wheel", "libraries")
    if libraries is not None and not (
        isinstance(libraries, Mapping)
        and all(isinstance(v, str) and _SHA256.match(v) for v in libraries.values())
    ):
        problems.append(f"wheel.libraries {libraries!r} does not map paths to sha256s")
    if data.get("mode") not in _MODES:
        problems.append(f"mode {data.get('mode')!r} is not one of {', '.join(_MODES)}")
    if data.get("toolchain") not in _TOOLCHAINS:
        problems.append(
            f"toolchain {data.get('toolchain')!r} is not one of {', '.join(_TOOLCHAINS)}"
        )
    cpp_lib = data.get("cpp_lib")
    if cpp_lib is not None and not isinstance(cpp_lib, Mapping):
        problems.append("cpp_lib is not an object")
    key_format = _field(data, "key_inputs", "format")
    if not isinstance(key_format, int) or isinstance(key_format, bool) or key_format < 1:
        problems.append(f"key_inputs.format {key_format!r} is not a key format")
    sdist = _field(data, "key_inputs", "sdist_sha256")
    if sdist != build.sdist.sha256:
        problems.append(
            f"it was built from the sdist with sha256 {sdist!r}, not the locked "
            f"{build.sdist.filename} ({build.sdist.sha256})"
        )
    archs = _field(data, "key_inputs", "arch_list")
    if not isinstance(archs, list) or sorted(map(str, archs)) != sorted(build.arch_list):
        problems.append(
            f"it was built for the architectures {archs!r}, not the locked "
            f"{sorted(build.arch_list)!r}"
        )
    return problems


def read_build_record(path: Path, combo: ResolvedCombination) -> Mapping[str, Any]:
    """The build record at *path*, checked against *combo*'s locked source build."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise InputError(
            f"{path}: cannot read the build record of {combo.id} ({e}); remove it, or build "
            f"again: {build_command(combo.id)}"
        ) from e
    problems = _problems(data, combo)
    if problems:
        raise InputError(
            f"{path}: not a build record of {combo.id}'s locked source build: "
            f"{'; '.join(problems)}. Remove it, or build again: {build_command(combo.id)}"
        )
    assert isinstance(data, Mapping)
    return data


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
        text += f"; key format {build.key_format}, made by an older recipe"
    return text


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
    path = wheel if wheel is not None else build_cache / build.key / build.wheel_filename
    where = f"--wheel {wheel}" if wheel is not None else f"the build cache ({path})"
    if not path.is_file():
        raise InputError(
            f"{entry.id} installs xformers built from source (key {build.key[:12]}), and "
            f"{where} holds no such wheel: {_how_to_get(entry, build)}"
        )
    digest = _sha256(path)
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
    digest = _sha256(copy)
    if digest != build.wheel_sha256:
        raise InputError(
            f"{wheel} changed while it was installed (sha256 {digest}, not "
            f"{build.wheel_sha256}); run this again"
        )
    return copy
