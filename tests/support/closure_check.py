"""A marker-aware check that a lock is the closed dependency set of its target.

Given a PEP 751 lock and the METADATA of each file it locks, every package's
Requires-Dist is evaluated with the *target's* marker environment (not the
host's): what applies must be locked, in a version its specifier allows, and
nothing may be locked that no applying requirement reaches from the roots.
Each locked file's tags must fit the target. The problems come back as text
so that a failing test names every one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from email.parser import BytesHeaderParser

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from envbuilder.pylock import LockedPackage
from envbuilder.target import Target

__all__ = ["closure_problems"]


def _requires(metadata: bytes) -> list[Requirement]:
    message = BytesHeaderParser().parsebytes(metadata)
    return [Requirement(line) for line in message.get_all("Requires-Dist") or []]


def _applies(req: Requirement, target: Target) -> bool:
    """Whether ``req`` holds on ``target`` (no extra asked)."""
    return req.marker is None or Marker(str(req.marker)).evaluate(dict(target.marker_environment))


def closure_problems(
    packages: Iterable[LockedPackage],
    target: Target,
    metadata: Mapping[str, bytes],
    *,
    roots: Iterable[str],
) -> list[str]:
    """What keeps ``packages`` from being ``roots``' closure on ``target``; ``metadata``
    maps each locked file's name to its METADATA."""
    locked = {canonicalize_name(p.name): p for p in packages}
    problems: list[str] = []
    for name, package in sorted(locked.items()):
        archive = package.archive
        if archive is None or archive.kind != "wheel":
            problems.append(f"{name}: no wheel locked")
            continue
        tags = parse_wheel_filename(archive.filename)[3]
        if not any(t in target.tag_priority for t in tags):
            problems.append(f"{name}: {archive.filename} does not fit {target.describe()}")
    reached: set[str] = set()
    todo = [(canonicalize_name(r), "the roots") for r in roots]
    while todo:
        name, why = todo.pop()
        if name in reached:
            continue
        required = locked.get(name)
        if required is None or required.archive is None:
            problems.append(f"{name} (required by {why}) is not locked")
            continue
        reached.add(name)
        for req in _requires(metadata[required.archive.filename]):
            if not _applies(req, target):
                continue
            dep = canonicalize_name(req.name)
            other = locked.get(dep)
            version = other.version if other is not None else None
            if version is not None and not req.specifier.contains(
                Version(version), prereleases=True
            ):
                problems.append(f"{dep} {version} does not satisfy {name}'s {req}")
            todo.append((dep, name))
    for name in sorted(set(locked) - reached):
        problems.append(f"{name} is locked, but nothing that applies to {target.platform} needs it")
    return problems
