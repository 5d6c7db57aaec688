"""The lockfile snapshot the wheel carries, so that ``pip install gpu-envbuilder`` then
``envbuilder query`` answers, and ``install`` installs, without building anything.

``envbuilder/data/`` holds a published lockfile and, with ``--with-locks``, the
pylocks it names (at their paths relative to it, as the site publishes them). It is
generated, never edited: ``nox -s snapshot -- LOCKFILE|URL`` runs ``envbuilder
snapshot`` (``envbuilder/commands/snapshot.py``), which checks the lockfile (its content hash) and each
pylock (its sha256) and replaces the directory as a whole. The release builds the
wheel after it. The lockfile's own content hash makes any edit by hand fail on read.

The snapshot is committed, and the repository names no package index: pylocks name
their index's host in every file URL, so the committed snapshot is the lockfile only.
That is enough to install: each entry records its closure by name, version, wheel
filename and sha256 (and a source build's record), so ``install`` and ``export`` hand
uv or pip hash-pinned requirements fetched from the indexes the user's configuration
names (`envbuilder.consumer.export.exported_carried`). Every file written is searched
for URL hosts first, in its bytes and in every string of its parsed document (JSON or
TOML, where ``\\/`` or ``\\u002f`` escapes hide a URL from a byte search); a host other
than the reserved test names (``*.invalid``, ``*.example``, ``*.test``, loopback), the
links torch prints inside measured messages (`ALLOWED_HOSTS`) and those passed with
``--allow-host`` stops the snapshot before anything is replaced.

The snapshot's date is that of the newest run it holds (the lockfile carries no
clock of its own: the same inputs give the same bytes).
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import tempfile
from datetime import datetime
from importlib import resources
from pathlib import Path, PurePosixPath

from envbuilder.lockfile.model import DEFAULT_LOCKFILE, CompatLock

__all__ = [
    "ALLOWED_HOSTS",
    "data_directory",
    "document_hosts",
    "embedded",
    "foreign_hosts",
    "is_carried",
    "newest_evidence",
    "require_locks",
    "write_snapshot",
]

#: the package directory of the snapshot
DATA = "data"
README = (
    "# The lockfile snapshot the wheel carries\n\n"
    "Written by `nox -s snapshot -- LOCKFILE|URL` (`envbuilder snapshot`)"
    " from a published lockfile and its locks; never edit these files by hand (the lockfile's"
    " content hash and the locks' sha256 are checked on every read).\n"
)
#: hosts a snapshot may name besides reserved and loopback ones: the pages torch's own
#: graph-break messages link to, which the lockfile keeps verbatim as measured evidence
ALLOWED_HOSTS = frozenset({"meta-pytorch.github.io"})
_RESERVED = (".invalid", ".example", ".test", ".localhost")
_URL_HOST = re.compile(
    rb"[A-Za-z][A-Za-z0-9+.-]*://(?:[^/?#@\s\"'<>]*@)?(\[[^\]]*\]|[^/?#:\s\"'<>\\|]+)"
)


def embedded() -> Path | None:
    """The snapshot's lockfile inside the installed package, when the wheel carries one."""
    path = Path(str(resources.files("envbuilder").joinpath(DATA, DEFAULT_LOCKFILE)))
    return path if path.is_file() else None


def _allowed(host: str, extra: frozenset[str]) -> bool:
    host = host.strip("[]").lower().rstrip(".")
    if host in ALLOWED_HOSTS or host in extra or host == "localhost":
        return True
    if host.endswith(_RESERVED) or host in {s.lstrip(".") for s in _RESERVED}:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def foreign_hosts(data: bytes, allow: frozenset[str] = frozenset()) -> list[str]:
    """The URL hosts in *data* that a committed snapshot may not name, sorted."""
    found = {m.group(1).decode("ascii", "replace") for m in _URL_HOST.finditer(data)}
    return sorted(h for h in found if not _allowed(h, allow))


def _strings(value: object) -> list[str]:
    """Every string (keys too) of a parsed JSON or TOML document."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [*_strings(k), *_strings(v)]]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return []


def document_hosts(name: str, data: bytes, allow: frozenset[str] = frozenset()) -> list[str]:
    """`foreign_hosts` of *data* and of every string of it parsed (``.json``, ``.toml``): an
    escaped slash (JSON ``\\/``, ``\\u002f``; TOML ``\\u002f``) hides a URL from the bytes only."""
    import json
    import tomllib

    from envbuilder.errors import InputError

    found = set(foreign_hosts(data, allow))
    try:
        if name.endswith(".json"):
            parsed: object = json.loads(data)
        elif name.endswith(".toml"):
            parsed = tomllib.loads(data.decode("utf-8"))
        else:
            parsed = None
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"{name}: cannot be read to search it for hosts ({e})") from e
    for text in _strings(parsed):
        found.update(foreign_hosts(text.encode("utf-8", "surrogatepass"), allow))
    return sorted(found)


def is_carried(lockfile: Path) -> bool:
    """Whether *lockfile* is the snapshot this envbuilder carries."""
    snapshot = embedded()
    return snapshot is not None and lockfile.resolve() == snapshot.resolve()


def require_locks(snapshot: Path, combination: str | None) -> None:
    """Stop, saying where the locks come from, when *snapshot* has neither the pylock nor the
    record of the closure (an older lockfile) of what is wanted."""
    from envbuilder.errors import InputError
    from envbuilder.lockfile.read import load_lockfile

    lock = load_lockfile(snapshot)
    wanted = [
        e
        for e in lock.combinations
        if e.lock is not None and (combination is None or e.id == combination)
    ]
    if all(
        e.packages or (snapshot.parent / e.lock.path).is_file()
        for e in wanted
        if e.lock is not None
    ):
        return
    raise InputError(
        "the snapshot this envbuilder carries records neither the locks nor the packages of "
        "what you asked for; the locks come from the published site: pass --lock URL (the "
        "site's compat.lock.json) or set ENVBUILDER_LOCK_URL=URL once, and they are "
        "downloaded and checked against it"
    )


def newest_evidence(lock: CompatLock) -> str | None:
    """The day (YYYY-MM-DD) the newest run in *lock* finished; None without runs."""
    days = []
    for entry in lock.combinations:
        for run in entry.runs:
            try:
                days.append(datetime.fromisoformat(run.finished).date().isoformat())
            except ValueError:
                continue
    return max(days, default=None)


def write_snapshot(
    lockfile: Path,
    out: Path,
    *,
    with_locks: bool = False,
    allow_hosts: frozenset[str] = frozenset(),
) -> list[Path]:
    """Copy *lockfile* (and, *with_locks*, every pylock it names) into *out*, replacing
    what was there; all are checked first (hashes, then URL hosts against
    `ALLOWED_HOSTS` and *allow_hosts*), nothing is changed on a failure. Returns the
    files written."""
    from envbuilder.consumer.export import locate_pylock
    from envbuilder.errors import InputError
    from envbuilder.lockfile.read import load_lockfile

    lock = load_lockfile(lockfile)
    files: dict[str, Path] = {DEFAULT_LOCKFILE: lockfile}
    for entry in lock.combinations:
        if with_locks and entry.lock is not None:
            files[str(PurePosixPath(entry.lock.path))] = locate_pylock(lockfile, entry)
    allow = frozenset(h.lower() for h in allow_hosts)
    for name, source in files.items():
        hosts = document_hosts(name, source.read_bytes(), allow)
        if hosts:
            raise InputError(
                f"{source}: names the host(s) {', '.join(hosts)}; a snapshot is committed "
                f"and the repository names no package index, so {name} cannot go into it"
                + (
                    " (leave out --with-locks: the locks come from the published site)"
                    if name != DEFAULT_LOCKFILE
                    else " (pass --allow-host HOST only for a host that is no index)"
                )
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".snapshot-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp's 0700 would go into the wheel and the repository
    try:
        for name, source in files.items():
            target = staging / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
        (staging / "README.md").write_text(README, encoding="utf-8")
        if out.exists() and not (out / DEFAULT_LOCKFILE).is_file() and any(out.iterdir()):
            raise InputError(f"{out} holds other files than a snapshot; refusing to replace it")
        old = out.with_name(out.name + ".old")
        if out.exists():
            out.rename(old)
        staging.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return sorted(p for p in out.rglob("*") if p.is_file())


def data_directory() -> Path:
    """The snapshot's directory inside this envbuilder's package (what the wheel carries)."""
    return Path(__file__).parents[1] / DATA
