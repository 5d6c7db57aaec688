"""PEP 751 locks, the one home for reading and writing them.

A lock is read (TOML, then validated by ``packaging.pylock``) into typed
records: `LockedPackage` with its `LockedArchive` files. A universal lock
gives a target its part through `select` (PEP 751 selection by the
target's marker environment and tags); `assemble` writes a lock back and
validates it; `requirements_text` writes the hash-pinned requirements
format that ``pip install --require-hashes --no-deps`` reads.
"""

from __future__ import annotations

import threading
import tomllib
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from ipaddress import ip_address
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import tomli_w
from packaging.pylock import (
    PackageSdist,
    PackageWheel,
    Pylock,
    PylockSelectError,
    PylockValidationError,
)

from envbuilder.errors import InputError
from envbuilder.target import Target

__all__ = [
    "LockedArchive",
    "LockedPackage",
    "PylockError",
    "assemble",
    "assembled",
    "constraints_text",
    "packages",
    "read_lock",
    "requirements_text",
    "select",
    "tool_table",
]


class PylockError(InputError):
    """A lock that cannot be read, selected from or written; the message names it."""


@dataclass(frozen=True, kw_only=True)
class LockedArchive:
    """One file of a locked package: a wheel or an sdist, with where it lies and its hash."""

    kind: Literal["wheel", "sdist"]
    name: str | None = None  # the lock's ``name`` key; see `filename`
    url: str | None = None
    path: str | None = None
    sha256: str | None = None
    size: int | None = None

    @property
    def filename(self) -> str:
        """The file's name: the lock's ``name``, else the last part of its URL or path."""
        if self.name:
            return self.name
        if self.url:
            return unquote(urlsplit(self.url).path.rsplit("/", 1)[-1])
        return Path(self.path or "").name

    def location(self, source: Path) -> str | None:
        """Its URL; a ``path`` becomes a file URI, relative to the lock at ``source``."""
        if self.url:
            return self.url
        if self.path:
            path = Path(self.path)
            return (path if path.is_absolute() else source.parent / path).resolve().as_uri()
        return None


@dataclass(frozen=True, kw_only=True)
class LockedPackage:
    """A package of a lock with its files (after `select`: the one file for the target)."""

    name: str
    version: str | None
    marker: str | None = None
    wheels: tuple[LockedArchive, ...] = ()
    sdist: LockedArchive | None = None

    @property
    def archive(self) -> LockedArchive | None:
        """The file a target installs: its (first) wheel, else its sdist."""
        return self.wheels[0] if self.wheels else self.sdist


#: Locks this process assembled, by their text: a resolve reads back each lock it wrote
#: (a suite group starts from its member's), and parsing and validating them again took
#: `read_lock` from 0.14 to 0.27 s of CPU in the default matrix's cold run (43 reads).
#: Kept for the latest few only.
_ASSEMBLED: OrderedDict[str, Pylock] = OrderedDict()
_ASSEMBLED_KEPT = 128
_assembled_lock = threading.Lock()


def _remember(text: str, lock: Pylock) -> None:
    with _assembled_lock:
        _ASSEMBLED[text] = lock
        _ASSEMBLED.move_to_end(text)
        while len(_ASSEMBLED) > _ASSEMBLED_KEPT:
            _ASSEMBLED.popitem(last=False)


def read_lock(data: bytes | str, *, source: Path | str) -> Pylock:
    """A lock's text, validated as PEP 751; errors name ``source``."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        with _assembled_lock:
            known = _ASSEMBLED.get(text)
        if known is not None:  # this very text was validated as it was assembled
            return known
        return Pylock.from_dict(tomllib.loads(text))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise PylockError(f"{source}: not a TOML file ({e})") from e
    except RecursionError as e:  # tomllib recurses once per nesting level
        raise PylockError(f"{source}: not a TOML file (nested too deeply)") from e
    except PylockValidationError as e:
        raise PylockError(f"{source}: not a valid PEP 751 lock ({e})") from e


def tool_table(lock: Pylock, tool: str = "envbuilder") -> Mapping[str, Any] | None:
    """The lock's ``[tool.<tool>]`` table, if it has one."""
    table = (lock.tool or {}).get(tool)
    return table if isinstance(table, Mapping) else None


def _archive(file: PackageWheel | PackageSdist) -> LockedArchive:
    return LockedArchive(
        kind="wheel" if isinstance(file, PackageWheel) else "sdist",
        name=file.name,
        url=file.url,
        path=file.path,
        sha256=file.hashes.get("sha256"),
        size=file.size,
    )


def _is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False


def _refuse_uninstallable(name: str, archive: LockedArchive, source: Path | str) -> None:
    """Refuse what an install must never fetch: a source distribution (building one runs
    its code) and a file from anywhere but ``https://``, ``file://`` or a loopback host."""
    if archive.kind == "sdist":
        raise PylockError(
            f"{source}: {name} is locked as a source distribution ({archive.filename}); "
            "envbuilder installs wheels only, since building an sdist runs its code - "
            "resolve again so that the lock holds a wheel"
        )
    if archive.url is None:
        return
    parts = urlsplit(archive.url)
    scheme = parts.scheme.lower()
    if scheme in ("https", "file") or (scheme == "http" and _is_loopback(parts.hostname)):
        return
    from envbuilder.credentials import redact

    raise PylockError(
        f"{source}: {name}'s file {redact(archive.url)!r} is not on https:// "
        "(nor file:// or a loopback host); envbuilder fetches nothing over plain HTTP - "
        "lock from an https:// index"
    )


def packages(lock: Pylock, *, source: Path | str = "the lock") -> tuple[LockedPackage, ...]:
    """Every package of the lock, in its order, with all of its wheels.

    A package with an sdist, or a file on a URL that is not ``https://``,
    ``file://`` or a loopback host, is refused (`PylockError` naming ``source``).
    """
    out: list[LockedPackage] = []
    for package in lock.packages:
        locked = LockedPackage(
            name=str(package.name),
            version=str(package.version) if package.version else None,
            marker=str(package.marker) if package.marker else None,
            wheels=tuple(_archive(w) for w in package.wheels or ()),
            sdist=_archive(package.sdist) if package.sdist else None,
        )
        for archive in (*locked.wheels, *((locked.sdist,) if locked.sdist else ())):
            _refuse_uninstallable(locked.name, archive, source)
        out.append(locked)
    return tuple(out)


def select(lock: Pylock, target: Target, *, source: Path | str) -> tuple[LockedPackage, ...]:
    """The target's part of a lock: each package whose marker holds for the target, with
    the one file that fits its tags (PEP 751 selection, by ``packaging.pylock``).

    A chosen sdist, or a file that is not on ``https://``, ``file://`` or a
    loopback host, is refused as in `packages`."""
    try:
        chosen = list(lock.select(environment=target.marker_environment, tags=target.tags))  # type: ignore[arg-type]
    except PylockSelectError as e:
        raise PylockError(f"{source}: nothing to install for {target.describe()} ({e})") from e
    out: list[LockedPackage] = []
    for package, file in chosen:
        if not isinstance(file, PackageWheel | PackageSdist):
            raise PylockError(
                f"{source}: {package.name} is locked as a {type(file).__name__}; "
                "envbuilder locks only wheels and sdists"
            )
        archive = _archive(file)
        _refuse_uninstallable(str(package.name), archive, source)
        out.append(
            LockedPackage(
                name=str(package.name),
                version=str(package.version) if package.version else None,
                wheels=(archive,) if archive.kind == "wheel" else (),
                sdist=archive if archive.kind == "sdist" else None,
            )
        )
    return tuple(out)


def _archive_table(archive: LockedArchive) -> dict[str, Any]:
    table: dict[str, Any] = {}
    if archive.name:
        table["name"] = archive.name
    if archive.url:
        table["url"] = archive.url
    if archive.path:
        table["path"] = archive.path
    if archive.size is not None:
        table["size"] = archive.size
    table["hashes"] = {"sha256": archive.sha256} if archive.sha256 else {}
    return table


def assemble(
    locked: Sequence[LockedPackage],
    *,
    requires_python: str,
    tool: Mapping[str, Any],
    header: Sequence[str] = (),
) -> str:
    """The PEP 751 text of these packages (one file each), validated, after ``# header`` lines."""
    return assembled(locked, requires_python=requires_python, tool=tool, header=header)[0]


def assembled(
    locked: Sequence[LockedPackage],
    *,
    requires_python: str,
    tool: Mapping[str, Any],
    header: Sequence[str] = (),
) -> tuple[str, Pylock]:
    """`assemble`'s text and the lock it validated: what `read_lock` of the text gives,
    without parsing it again."""
    tables: list[dict[str, Any]] = []
    for package in locked:
        entry: dict[str, Any] = {"name": package.name}
        if package.version is not None:
            entry["version"] = package.version
        archive = package.archive
        if archive is not None:
            table = _archive_table(archive)
            entry["wheels" if archive.kind == "wheel" else "sdist"] = (
                [table] if archive.kind == "wheel" else table
            )
        tables.append(entry)
    doc: dict[str, Any] = {
        "lock-version": "1.0",
        "created-by": "envbuilder",
        "requires-python": requires_python,
        "packages": tables,
        "tool": dict(tool),
    }
    try:
        lock = Pylock.from_dict(doc)
    except PylockValidationError as e:
        raise PylockError(f"the assembled lock is not valid PEP 751: {e}") from e
    text = "".join(f"# {line}\n" for line in header) + tomli_w.dumps(doc)
    _remember(text, lock)
    return text, lock


def requirements_text(
    pins: Iterable[tuple[str, str]],
    *,
    header: Sequence[str] = (),
    options: Sequence[str] = (),
    wrap: bool = True,
) -> str:
    """A requirements file for ``pip install --require-hashes --no-deps -r``.

    ``pins`` are (requirement, sha256) pairs: ``name==version`` or ``name @ url``.
    ``header`` lines become comments; ``options`` (``--find-links …``) follow them.
    """
    separator = " \\\n    " if wrap else " "
    lines = [f"# {line}" for line in header] + list(options)
    lines += [f"{requirement}{separator}--hash=sha256:{sha}" for requirement, sha in pins]
    return "".join(f"{line}\n" for line in lines)


def constraints_text(packages: Iterable[LockedPackage], *, header: Sequence[str] = ()) -> str:
    """A constraints file (``pip install -c``, ``uv pip install -c``): ``name==version`` lines.

    No ``--hash``: uv checks hashes given in constraints, but pip (26.3) then turns on
    ``--require-hashes`` for the whole install and refuses the user's own unpinned
    requirements, which is what constraints are for. Hashes stay in the pylock and
    requirements exports.
    """
    lines = [f"# {line}" for line in header]
    for package in sorted(packages, key=lambda p: p.name):
        if not package.version:
            raise PylockError(f"{package.name} is locked without a version; it cannot be pinned")
        lines.append(f"{package.name}=={package.version}")
    return "".join(f"{line}\n" for line in lines)
