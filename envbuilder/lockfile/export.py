"""Turning a lockfile entry into installable files (``export``, ``install``).

The lockfile points at each combination's ``pylock.<id>.toml`` (path relative
to the lockfile, and its sha256, checked before use). ``pylock`` output is
that file, byte for byte: uv installs it with ``uv pip install -r
pylock.toml`` (uv recognises a PEP 751 lock only by its file name:
``pylock.toml`` or ``pylock.<name>.toml`` with no dot in ``<name>``, so a
combination id such as ``py3.11-…`` cannot be the name as it stands). ``requirements`` output pins
every wheel the target (the combination's Python and platform, not the host)
selects, as a direct URL with its sha256, for ``pip install --require-hashes
--no-deps -r``. ``constraints`` output pins the same closure's versions
(``name==version``) for ``pip install -c`` / ``uv pip install -c`` beside one's own
requirements: the resolver keeps the verified stack and adds the rest.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from envbuilder.errors import InputError
from envbuilder.files import sha256_file
from envbuilder.lockfile.model import Entry
from envbuilder.target import Target

__all__ = ["FORMATS", "exported", "exported_constraints", "exported_requirements", "locate_pylock"]

#: what `envbuilder export --format` writes
FORMATS = ("pylock", "requirements", "constraints")


def locate_pylock(lockfile: Path, entry: Entry) -> Path:
    """The entry's pylock next to *lockfile*, after checking its sha256."""
    if entry.lock is None:
        raise InputError(
            f"{entry.id!r} has no lock ({entry.verdict.verdict}: {entry.verdict.reason})"
        )
    rel = PurePosixPath(entry.lock.path)
    if rel.is_absolute() or ".." in rel.parts or "\\" in entry.lock.path or not rel.parts:
        raise InputError(
            f"{lockfile}: the lock of {entry.id!r} is named {entry.lock.path!r}, outside the "
            "lockfile's directory; a lockfile names its locks relative to itself: regenerate "
            "it with `nox -s lock` or download it again"
        )
    path = lockfile.parent / rel
    try:
        digest = sha256_file(path)
    except FileNotFoundError as e:
        raise InputError(
            f"{path}: the lock of {entry.id!r} is missing; it must lie at {entry.lock.path!r} "
            f"next to {lockfile.name} (the published site carries it)"
        ) from e
    if digest != entry.lock.sha256:
        raise InputError(
            f"{path}: sha256 {digest} is not the {entry.lock.sha256} recorded in {lockfile}; "
            "the lock was changed after the lockfile was made: run `nox -s lock`"
        )
    return path


def _target(entry: Entry) -> Target:
    try:
        target = Target(python=entry.python, platform=entry.platform)
        _ = target.tags
    except ValueError as e:
        raise InputError(f"{entry.id!r}: cannot export for its target ({e})") from e
    return target


def _checked_closure(entry: Entry, pylock: Path) -> None:
    """Select the target's part of the lock, refusing sdists and plain-HTTP files in it."""
    from envbuilder.pylock import read_lock, select

    select(read_lock(pylock.read_bytes(), source=pylock), _target(entry), source=pylock)


def exported_requirements(entry: Entry, pylock: Path) -> str:
    """A ``--require-hashes`` requirements file for the entry's target."""
    from envbuilder.pylock import read_lock, requirements_text, select

    chosen = select(read_lock(pylock.read_bytes(), source=pylock), _target(entry), source=pylock)
    pins: list[tuple[str, str]] = []
    for package in sorted(chosen, key=lambda p: p.name):
        wheel = package.archive
        if wheel is None or wheel.kind != "wheel":
            raise InputError(
                f"{pylock}: {package.name} is locked as an sdist, not a wheel; "
                "only wheels can be exported"
            )
        url = wheel.location(pylock)
        if url is None:
            raise InputError(f"{pylock}: {package.name}'s wheel has neither url nor path")
        if not wheel.sha256:
            raise InputError(f"{pylock}: {package.name}'s wheel has no sha256")
        pins.append((f"{package.name} @ {url}", wheel.sha256))
    return requirements_text(
        pins,
        header=(
            f"{entry.id}: exported by `envbuilder export` from {pylock.name} "
            f"(sha256 {entry.lock.sha256 if entry.lock else '?'})",
            f"target: Python {entry.python}, {entry.platform}; verdict: {entry.verdict.verdict} "
            f"(per use: {', '.join(f'{u.use} {u.verdict.verdict}' for u in entry.uses)})",
            "install: pip install --require-hashes --no-deps -r <this file>",
        ),
    )


def exported_constraints(entry: Entry, pylock: Path) -> str:
    """A constraints file of the closure the entry's target installs, versions only."""
    from envbuilder.pylock import constraints_text, read_lock, select

    chosen = select(read_lock(pylock.read_bytes(), source=pylock), _target(entry), source=pylock)
    return constraints_text(
        chosen,
        header=(
            f"{entry.id}: exported by `envbuilder export --format constraints` from "
            f"{pylock.name} (sha256 {entry.lock.sha256 if entry.lock else '?'})",
            f"target: Python {entry.python}, {entry.platform}; verdict: {entry.verdict.verdict}",
            "use: uv pip install -c <this file> -r your-requirements.txt "
            "(or pip install -c ... -r ...)",
            "versions only: pip refuses --hash in constraints beside unhashed requirements; "
            "the pylock and requirements exports carry the hashes",
        ),
    )


def exported(lockfile: Path, combination: str, fmt: str) -> bytes:
    """The bytes `envbuilder export` writes (also used by `install`)."""
    import difflib

    from envbuilder.lockfile.read import load_lockfile

    lock = load_lockfile(lockfile)
    entries = lock.by_id()
    entry = entries.get(combination)
    if entry is None:
        near = difflib.get_close_matches(combination, list(entries), n=1)
        hint = f"; did you mean {near[0]!r}?" if near else "; see `envbuilder query`"
        raise InputError(f"no combination {combination!r} in {lockfile}{hint}")
    pylock = locate_pylock(lockfile, entry)
    if fmt == "pylock":
        # The pylock goes out as locked, but only after the checks every export makes: what
        # the target installs from it is wheels only, from https://, file:// or loopback.
        _checked_closure(entry, pylock)
        return pylock.read_bytes()
    if fmt == "constraints":
        return exported_constraints(entry, pylock).encode("utf-8")
    return exported_requirements(entry, pylock).encode("utf-8")
