"""Build records: what ``envbuilder build-wheel`` writes beside the locks for the wheel it
built (``build-record.<id>.json``, schema ``envbuilder.source-build/1``), found and checked
against a combination's locked source build (its sdist and architectures).

``envbuilder lock`` copies a record into the lockfile entry (`envbuilder.lockfile.sourcebuilds`),
and an image of a source build installs the wheel it names (`envbuilder.sourcebuild.image`).
Standard library and envbuilder's records only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from envbuilder.errors import InputError
from envbuilder.model import ResolvedCombination
from envbuilder.sourcebuild.cache import RECORD_SCHEMA, record_name

__all__ = [
    "BUILD_RECORDS_DIR",
    "build_command",
    "find_build_record",
    "read_build_record",
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
