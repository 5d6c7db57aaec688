"""Installed files against their ``RECORD``: hashed in parallel, remembered between runs.

A large CUDA environment holds ~17k files and several GB; hashing all of it on
every ``envbuilder doctor`` costs about a minute on a cold disk. So:

1. Files are hashed by a thread pool (``hashlib`` releases the GIL while it
   digests, and opening and reading are system calls), largest first so that
   one big ``.so`` does not finish last on its own.
2. Every file that matched its ``RECORD`` is remembered in a *stamp* inside
   the checked environment (`stamp_path`) by (size, mtime in ns, inode, the
   ``RECORD`` hash it matched). A later run hashes only files whose stat or
   expected hash changed; ``rehash=True`` ignores the stamp.

The stamp is a cache, not evidence against tampering: whoever can rewrite the
environment's files can rewrite the stamp and keep mtimes. ``--rehash`` is the
check that trusts nothing. A stamp that cannot be read is ignored with a note;
one that cannot be written costs only the next run's time, also with a note.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from envbuilder.files import write_atomic

__all__ = [
    "STAMP_NAME",
    "ExpectedFile",
    "RecordCheck",
    "check_files",
    "expected_files",
    "stamp_path",
]

STAMP_NAME = ".envbuilder-doctor-stamp.json"
STAMP_SCHEMA = "envbuilder.doctor-stamp/1"


@dataclass(frozen=True, kw_only=True)
class ExpectedFile:
    """One installed file and the sha256 its distribution's ``RECORD`` gives (urlsafe b64)."""

    dist: str
    record_name: str
    path: Path
    sha256_b64: str


@dataclass(frozen=True, kw_only=True)
class RecordCheck:
    """What comparing files with their ``RECORD`` found, and what it cost."""

    checked: int  # files compared with their RECORD (hashed now or vouched for by the stamp)
    hashed: int
    reused: int
    problems: tuple[str, ...]
    note: str  # why the stamp was not read or written; "" when it was
    seconds: float


def stamp_path(prefix: str | os.PathLike[str]) -> Path:
    """Where the stamp of the environment at *prefix* (its ``sys.prefix``) lives."""
    return Path(prefix) / STAMP_NAME


def expected_files(dists: Iterable[metadata.Distribution]) -> list[ExpectedFile]:
    """The files of *dists* that their ``RECORD`` lists with a sha256."""
    out: list[ExpectedFile] = []
    for dist in dists:
        name = dist.metadata["Name"] or "?"
        for file in dist.files or ():
            if file.hash is None or file.hash.mode != "sha256":
                continue
            out.append(
                ExpectedFile(
                    dist=name,
                    record_name=str(file),
                    path=Path(str(file.locate())),
                    sha256_b64=file.hash.value,
                )
            )
    return out


_Stat = tuple[int, int, int]  # size, mtime_ns, inode


def _stat_key(path: Path) -> _Stat | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino)


class NotARegularFile(OSError):
    """A path ``RECORD`` names is a device, a FIFO, a socket or a directory: not hashed."""


def _digest_b64(path: Path) -> str:
    """The urlsafe-b64 sha256 of a regular file's bytes. Anything else is `NotARegularFile`,
    found before a byte is read: ``/dev/zero`` never ends and a FIFO blocks its reader, so
    the file is opened without blocking and checked on its descriptor. Reading stops at the
    size the descriptor had when opened, so a file that grows while hashed cannot stall it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(f"{path} is not a regular file")
        digest = hashlib.sha256()
        left = st.st_size
        while left > 0:
            block = os.read(fd, min(left, 1 << 20))
            if not block:
                break
            digest.update(block)
            left -= len(block)
    finally:
        os.close(fd)
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()


def _read_stamp(path: Path | None) -> tuple[dict[str, tuple[_Stat, str]], str]:
    if path is None:
        return {}, ""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}, ""
    except OSError as e:
        return {}, f"stamp {path} not read ({e.strerror or e})"
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("schema") != STAMP_SCHEMA:
            raise ValueError(f"not an {STAMP_SCHEMA} file")
        known: dict[str, tuple[_Stat, str]] = {}
        for name, (size, mtime, ino, digest) in data["files"].items():
            if not all(isinstance(x, int) for x in (size, mtime, ino)) or not isinstance(
                digest, str
            ):
                raise ValueError(f"bad entry for {name!r}")
            known[name] = ((size, mtime, ino), digest)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        return {}, f"stamp {path} ignored ({e}); every file hashed"
    return known, ""


def _write_stamp(path: Path, verified: Mapping[str, tuple[_Stat, str]]) -> str:
    data = {
        "schema": STAMP_SCHEMA,
        "files": {name: [*st, digest] for name, (st, digest) in sorted(verified.items())},
    }
    try:
        write_atomic(path, json.dumps(data, separators=(",", ":")) + "\n")
    except OSError as e:
        return f"stamp {path} not written ({e.strerror or e}); the next run hashes everything again"
    return ""


def check_files(
    files: Sequence[ExpectedFile],
    *,
    stamp: Path | None,
    rehash: bool = False,
    workers: int | None = None,
) -> RecordCheck:
    """Compare *files* with their ``RECORD`` hashes, reusing and refreshing *stamp*."""
    started = time.perf_counter()
    known, note = ({}, "") if rehash else _read_stamp(stamp)
    stats = {f.path: _stat_key(f.path) for f in files}
    problems: list[str] = []
    verified: dict[str, tuple[_Stat, str]] = {}
    todo: list[ExpectedFile] = []
    reused = 0
    for f in files:
        st = stats[f.path]
        if st is None:
            problems.append(f"{f.dist}: {f.record_name} missing")
            continue
        if known.get(str(f.path)) == (st, f.sha256_b64):
            verified[str(f.path)] = (st, f.sha256_b64)
            reused += 1
        else:
            todo.append(f)
    todo.sort(key=lambda f: -(stats[f.path] or (0, 0, 0))[0])

    def digest(f: ExpectedFile) -> tuple[ExpectedFile, str | None, str]:
        """The file's digest, or None and the problem that kept it from being hashed."""
        try:
            return f, _digest_b64(f.path), ""
        except FileNotFoundError:
            return f, None, "missing"
        except NotARegularFile:
            return f, None, "not a regular file"
        except OSError as e:
            return f, None, f"unreadable ({e.strerror or e})"

    with ThreadPoolExecutor(max_workers=workers or min(8, (os.cpu_count() or 1) + 2)) as pool:
        for f, got, problem in pool.map(digest, todo):
            if got is None:
                problems.append(f"{f.dist}: {f.record_name} {problem}")
            elif got != f.sha256_b64:
                problems.append(f"{f.dist}: {f.record_name} modified")
            else:
                st = stats[f.path]
                # A file rewritten while it was hashed keeps no stamp entry: re-stat to be sure.
                if st is not None and _stat_key(f.path) == st:
                    verified[str(f.path)] = (st, f.sha256_b64)
    if stamp is not None and (todo or rehash or note):
        note = _write_stamp(stamp, verified) or note
    return RecordCheck(
        checked=len(verified) + sum(p.endswith("modified") for p in problems),
        hashed=len(todo),
        reused=reused,
        problems=tuple(sorted(problems)),
        note=note,
        seconds=time.perf_counter() - started,
    )
