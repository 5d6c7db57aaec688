"""What the relay fetches before uv asks: the guesses, as pure functions.

A ``uv pip compile`` walks a closure one level at a time: a page, then the
metadata of the release it picks, then the pages that metadata requires, each a
round trip. The relay sees each answer first, so it can start the next level
while uv is still reading this one:

- a wheel's metadata names the projects it requires (`required`); their pages
  are fetched at once;
- a page names the releases; the one uv is likely to pick for each Python of the
  run (the newest whose ``requires-python`` admits it and that the requirement's
  specifier allows; its wheel for that Python) is what `likely_wheels` returns,
  and its metadata is fetched at once.

A wrong guess costs one fetch that nothing reads; it never changes what uv is
told, since uv still asks for everything it uses and gets the index's answer.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import (
    InvalidWheelFilename,
    NormalizedName,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from envbuilder.index.remotewheel import parse_metadata

__all__ = ["Wanted", "likely_wheels", "pythons_of", "required"]

#: (project, specifier): a project some fetched metadata requires, and the releases it allows
Wanted = tuple[NormalizedName, SpecifierSet]


def required(metadata: bytes) -> list[Wanted]:
    """The projects a wheel's core metadata requires outside its extras, each with the
    releases its requirement allows; nothing for metadata that does not parse."""
    try:
        message = parse_metadata(metadata)
    except (ValueError, TypeError):
        return []
    found: list[Wanted] = []
    for line in message.get_all("Requires-Dist") or []:
        try:
            requirement = Requirement(str(line))
        except InvalidRequirement:
            continue
        if requirement.marker is not None and "extra" in str(requirement.marker):
            continue  # only with an extra the resolution may never ask for
        found.append((canonicalize_name(requirement.name), requirement.specifier))
    return found


@functools.lru_cache(maxsize=1024)
def _python_specifier(requires_python: str) -> SpecifierSet | None:
    # a page repeats one requires-python over hundreds of wheels: parsed once each
    try:
        return SpecifierSet(requires_python)
    except InvalidSpecifier:
        return None


def _admits(requires_python: object, python: Version) -> bool:
    if not isinstance(requires_python, str) or not requires_python.strip():
        return True
    specifier = _python_specifier(requires_python)
    return specifier is None or specifier.contains(python, prereleases=True)


def _interpreters(filename: str) -> set[str]:
    try:
        return {tag.interpreter for tag in parse_wheel_filename(filename)[3]}
    except (InvalidWheelFilename, InvalidVersion):
        return set()


def _allowed(version_text: str, specifier: SpecifierSet) -> Version | None:
    """The version a wheel's filename names, if final and ``specifier`` allows it."""
    try:
        version = Version(version_text)
    except InvalidVersion:
        return None
    if version.is_prerelease or not specifier.contains(version, prereleases=False):
        return None
    return version


def likely_wheels(
    files: Iterable[dict[str, Any]],
    *,
    specifier: SpecifierSet,
    pythons: Sequence[str],
) -> list[dict[str, Any]]:
    """The entries of a PEP 691 page whose metadata uv most likely reads: for each of
    ``pythons`` (``"3.10"``), the newest final, unyanked release that ``specifier``
    allows and whose wheel admits that Python, and of its wheels the one built for that
    Python (``cp310``) if any, else the first. At most one entry per Python."""
    releases: dict[Version, list[dict[str, Any]]] = {}
    # a release's wheels share its version text: parsed and checked once, not per wheel
    # (a page lists up to thousands of wheels, and the relay asks this of every page)
    versions: dict[str, Version | None] = {}
    for entry in files:
        name = entry.get("filename")
        if not isinstance(name, str) or not name.endswith(".whl") or entry.get("yanked"):
            continue
        parts = name.split("-")
        if len(parts) not in (5, 6):  # name-version[-build]-python-abi-platform.whl
            continue
        text = parts[1]
        if text not in versions:
            versions[text] = _allowed(text, specifier)
        version = versions[text]
        if version is not None:
            releases.setdefault(version, []).append(entry)
    chosen: list[dict[str, Any]] = []
    newest_first = sorted(releases, reverse=True)
    for python in pythons:
        minor = Version(python)
        cp = f"cp{minor.major}{minor.minor}"
        for version in newest_first:
            wheels = [w for w in releases[version] if _admits(w.get("requires-python"), minor)]
            if not wheels:
                continue
            own = [w for w in wheels if cp in _interpreters(w["filename"])]
            pick = (own or wheels)[0]
            if all(pick is not c for c in chosen):
                chosen.append(pick)
            break
    return chosen


def pythons_of(versions: Collection[str]) -> list[str]:
    """``versions`` (``"3.10"``, ``"3.12.1"``) as sorted, distinct ``major.minor``."""
    minors = {".".join(v.split(".")[:2]) for v in versions}
    return sorted(minors, key=lambda v: tuple(int(p) for p in v.split(".") if p.isdigit()))
