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

``with_suite`` (``--with-suite``) adds the combination's suite group, the
conformance suite's own dependencies (``pylock.<name>-suite.toml`` beside the
lock), to any format: users get it only when they ask, for example to run the
suite themselves. The group must have been locked against the very lock the
lockfile records (its ``lock-sha256``); a pylock with it is a new document
holding both.

The lockfile snapshot the wheel carries (`envbuilder.consumer.snapshot`) holds no
pylocks: they name their index's host. There each entry's ``packages`` (name, version,
wheel filenames and sha256) are enough: ``requirements`` output then pins
``name==version`` with every sha256 of a wheel that fits the target, and uv or pip
fetch them from the indexes the user's configuration names (`carried_requirements`);
a file whose bytes differ is refused by ``--require-hashes``. There is no URL to put in
a pylock, so ``pylock`` output is refused there, naming ``requirements``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from envbuilder.errors import InputError
from envbuilder.files import sha256_file
from envbuilder.lockfile.model import Entry, PackagePin
from envbuilder.pylock import LockedPackage
from envbuilder.target import Target

__all__ = [
    "FORMATS",
    "carried",
    "carried_constraints",
    "carried_pins",
    "carried_requirements",
    "exported",
    "exported_carried",
    "exported_constraints",
    "exported_entry",
    "exported_requirements",
    "locate_pylock",
    "locate_suite",
]

#: what `envbuilder export --format` writes
FORMATS = ("pylock", "requirements", "constraints")


def carried(lockfile: Path, entry: Entry) -> bool:
    """Whether *entry* is installed from the lockfile's own record of its closure: the
    lockfile is the snapshot this envbuilder carries and its pylock is not beside it."""
    from envbuilder.consumer.snapshot import is_carried

    if entry.lock is None or not is_carried(lockfile):
        return False
    return not (lockfile.parent / PurePosixPath(entry.lock.path)).is_file()


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
            "lockfile's directory; a lockfile names its locks relative to itself: download it "
            "again (maintainers: make it again with `nox -s lock`)"
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
            "the lock was changed after the lockfile was made: download the lockfile and its "
            "locks again (maintainers: `nox -s lock`)"
        )
    return path


def locate_suite(lockfile: Path, entry: Entry) -> Path:
    """The entry's suite group beside its lock, after checking it was locked against it."""
    from envbuilder.model import suite_lock_filename
    from envbuilder.pylock import read_lock, tool_table

    assert entry.lock is not None
    path = (lockfile.parent / entry.lock.path).parent / suite_lock_filename(entry.id)
    try:
        data = path.read_bytes()
    except FileNotFoundError as e:
        raise InputError(
            f"{path}: {entry.id!r} has no suite group beside its lock (`envbuilder resolve`"
            " writes one when matrix.toml has a [suite] table); leave out --with-suite"
        ) from e
    table = tool_table(read_lock(data, source=path)) or {}
    if table.get("lock-sha256") != entry.lock.sha256:
        raise InputError(
            f"{path}: this suite group was locked against lock sha256"
            f" {table.get('lock-sha256')!r}, not the {entry.lock.sha256} recorded in"
            f" {lockfile}; resolve again (`nox -s resolve`) and re-make the lockfile"
        )
    return path


def _target(entry: Entry) -> Target:
    try:
        target = Target(python=entry.python, platform=entry.platform)
        _ = target.tags
    except ValueError as e:
        raise InputError(f"{entry.id!r}: cannot export for its target ({e})") from e
    return target


def _chosen(entry: Entry, pylocks: Sequence[Path]) -> list[tuple[Path, LockedPackage]]:
    """The target's packages of each lock, by name, with the lock each comes from."""
    from envbuilder.pylock import read_lock, select

    target = _target(entry)
    chosen = [
        (pylock, package)
        for pylock in pylocks
        for package in select(read_lock(pylock.read_bytes(), source=pylock), target, source=pylock)
    ]
    return sorted(chosen, key=lambda c: c[1].name)


def _with(suite: Path | None) -> str:
    return f" with its suite group {suite.name}" if suite else ""


def exported_requirements(entry: Entry, pylock: Path, suite: Path | None = None) -> str:
    """A ``--require-hashes`` requirements file for the entry's target (and its suite group)."""
    from envbuilder.pylock import requirements_text

    pins: list[tuple[str, str]] = []
    for source, package in _chosen(entry, [pylock, *([suite] if suite else [])]):
        wheel = package.archive
        if wheel is None or wheel.kind != "wheel":
            raise InputError(
                f"{source}: {package.name} is locked as an sdist, not a wheel; "
                "only wheels can be exported"
            )
        url = wheel.location(source)
        if url is None:
            raise InputError(f"{source}: {package.name}'s wheel has neither url nor path")
        if not wheel.sha256:
            raise InputError(f"{source}: {package.name}'s wheel has no sha256")
        pins.append((f"{package.name} @ {url}", wheel.sha256))
    return requirements_text(
        pins,
        header=(
            f"{entry.id}: exported by `envbuilder export` from {pylock.name} "
            f"(sha256 {entry.lock.sha256 if entry.lock else '?'}){_with(suite)}",
            f"target: Python {entry.python}, {entry.platform}; verdict: {entry.verdict.verdict} "
            f"(per use: {', '.join(f'{u.use} {u.verdict.verdict}' for u in entry.uses)})",
            "install: pip install --require-hashes --no-deps -r <this file>",
        ),
    )


def exported_constraints(entry: Entry, pylock: Path, suite: Path | None = None) -> str:
    """A constraints file of the closure the entry's target installs, versions only."""
    from envbuilder.pylock import constraints_text

    chosen = [p for _, p in _chosen(entry, [pylock, *([suite] if suite else [])])]
    return constraints_text(
        chosen,
        header=(
            f"{entry.id}: exported by `envbuilder export --format constraints` from "
            f"{pylock.name} (sha256 {entry.lock.sha256 if entry.lock else '?'}){_with(suite)}",
            f"target: Python {entry.python}, {entry.platform}; verdict: {entry.verdict.verdict}",
            "use: uv pip install -c <this file> -r your-requirements.txt "
            "(or pip install -c ... -r ...)",
            "versions only: pip refuses --hash in constraints beside unhashed requirements; "
            "the pylock and requirements exports carry the hashes",
        ),
    )


def exported_pylock(entry: Entry, pylock: Path, suite: Path) -> str:
    """One PEP 751 lock of the entry's target's packages from the lock and its suite group."""
    from envbuilder.pylock import assemble

    chosen = [p for _, p in _chosen(entry, [pylock, suite])]
    return assemble(
        chosen,
        requires_python=f"=={entry.python}.*",
        tool={
            "envbuilder": {
                "exported-from": [pylock.name, suite.name],
                "lock-sha256": entry.lock.sha256 if entry.lock else None,
            }
        },
        header=(f"{entry.id}: exported by `envbuilder export --with-suite`; do not edit.",),
    )


def _fits(pin: PackagePin, target: Target) -> bool:
    from packaging.markers import InvalidMarker, Marker

    if not pin.marker:
        return True
    try:
        return Marker(pin.marker).evaluate(dict(target.marker_environment))
    except InvalidMarker as e:
        raise InputError(f"{pin.name}: its marker {pin.marker!r} cannot be read ({e})") from e


def _wheel_hashes(pin: PackagePin, target: Target, where: str) -> list[str]:
    """The sha256 of each of *pin*'s wheels whose tags the target accepts."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    accepted = set(target.tags)
    hashes = []
    for filename, sha256 in pin.wheels:
        try:
            tags = parse_wheel_filename(filename)[3]
        except InvalidWheelFilename as e:
            raise InputError(f"{where}: {pin.name}'s wheel {filename!r} is misnamed ({e})") from e
        if tags & accepted:
            if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
                raise InputError(f"{where}: {pin.name}'s wheel {filename!r} has no sha256")
            hashes.append(sha256)
    if not hashes:
        raise InputError(
            f"{where}: no wheel of {pin.name} {pin.version} fits {target.describe()}; "
            "only wheels are installed"
        )
    return hashes


def carried_pins(entry: Entry) -> list[tuple[str, list[str]]]:
    """(``name==version``, its wheels' sha256) for each package the entry's target installs,
    from the lockfile's own record of the closure (no URL, no host)."""
    if not entry.packages:
        raise InputError(
            f"{entry.id!r}: the lockfile records no packages for it (made by an older "
            "envbuilder); pass --lock URL of the published lockfile"
        )
    target = _target(entry)
    pins = []
    for pin in entry.packages:
        if not _fits(pin, target):
            continue
        if not pin.version:
            raise InputError(f"{entry.id!r}: {pin.name} is recorded without a version")
        pins.append((f"{pin.name}=={pin.version}", _wheel_hashes(pin, target, entry.id)))
    return sorted(pins)


def carried_requirements(entry: Entry) -> str:
    """A ``--require-hashes`` requirements file of the entry's closure by name, version and
    sha256 only: the installer fetches from the user's configured indexes."""
    lines = [
        f"# {entry.id}: exported by `envbuilder export` from the lockfile this envbuilder "
        "carries (names, versions and sha256; the files come from your configured indexes)",
        f"# target: Python {entry.python}, {entry.platform}; verdict: {entry.verdict.verdict}",
        "# install: pip install --require-hashes --no-deps --only-binary :all: -r <this file>",
    ]
    for requirement, hashes in carried_pins(entry):
        lines.append(requirement + "".join(f" \\\n    --hash=sha256:{h}" for h in hashes))
    return "".join(f"{line}\n" for line in lines)


def carried_constraints(entry: Entry) -> str:
    """`exported_constraints` from the lockfile's record of the closure."""
    lines = [
        f"# {entry.id}: exported by `envbuilder export --format constraints` from the "
        "lockfile this envbuilder carries",
        "# use: uv pip install -c <this file> -r your-requirements.txt "
        "(or pip install -c ... -r ...)",
    ]
    lines += [requirement for requirement, _ in carried_pins(entry)]
    return "".join(f"{line}\n" for line in lines)


def exported_carried(entry: Entry, fmt: str, *, with_suite: bool = False) -> bytes:
    """What `exported_entry` writes from a lockfile whose pylocks are not beside it (the
    snapshot the wheel carries): requirements or constraints by name, version and sha256."""
    if with_suite:
        raise InputError(
            "the lockfile this envbuilder carries holds no suite group; leave out --with-suite, "
            "or pass --lock URL of the published lockfile"
        )
    if fmt == "pylock":
        raise InputError(
            "the lockfile this envbuilder carries names no file URLs (no index host), so it "
            "cannot make a pylock: pass --format requirements (hash-pinned, fetched from your "
            "configured indexes), or --lock URL of the published lockfile"
        )
    if fmt == "constraints":
        return carried_constraints(entry).encode("utf-8")
    return carried_requirements(entry).encode("utf-8")


def exported(lockfile: Path, combination: str, fmt: str, *, with_suite: bool = False) -> bytes:
    """The bytes `envbuilder export` writes (also used by `install`); ``with_suite`` adds
    the combination's suite group."""
    import difflib

    from envbuilder.lockfile.read import load_lockfile

    lock = load_lockfile(lockfile)
    entries = lock.by_id()
    entry = entries.get(combination)
    if entry is None:
        near = difflib.get_close_matches(combination, list(entries), n=1)
        hint = f"; did you mean {near[0]!r}?" if near else "; see `envbuilder query`"
        raise InputError(f"no combination {combination!r} in {lockfile}{hint}")
    return exported_entry(lockfile, entry, fmt, with_suite=with_suite)


def exported_entry(lockfile: Path, entry: Entry, fmt: str, *, with_suite: bool = False) -> bytes:
    """`exported` for an entry of the lockfile at *lockfile*, already read; from the snapshot
    the wheel carries, without its pylocks, `exported_carried`."""
    if carried(lockfile, entry):
        return exported_carried(entry, fmt, with_suite=with_suite)
    pylock = locate_pylock(lockfile, entry)
    suite = locate_suite(lockfile, entry) if with_suite else None
    if fmt == "pylock":
        # The pylock goes out as locked, but only after the checks every export makes: what
        # the target installs from it is wheels only, from https://, file:// or loopback.
        _chosen(entry, [pylock, *([suite] if suite else [])])
        return (
            pylock.read_bytes() if suite is None else exported_pylock(entry, pylock, suite).encode()
        )
    if fmt == "constraints":
        return exported_constraints(entry, pylock, suite).encode("utf-8")
    return exported_requirements(entry, pylock, suite).encode("utf-8")
